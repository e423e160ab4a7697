//! The `fusebox` command line: argument parsing and printing only; the work is in fusebox-core.

#[macro_use]
mod out;
mod run_cmd;

use clap::{Parser, Subcommand};
use fusebox_core::ir::verify::verify;
use fusebox_core::text;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// mimalloc: the IR allocates many small vectors; glibc's malloc spends much of a large
/// partition in consolidation and page faults, mimalloc does not.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Partition tensor programs into fused functions and hand each to the backend that compiles it
/// best.
#[derive(Parser)]
#[command(name = "fusebox", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Parse a module (TVMScript-style Relax text) and print it back in canonical form; an
    /// `.onnx` model is imported and printed (its constants as `metadata[...]` references).
    Show {
        /// The module file (`.relax`; constants are read from the `.safetensors` file beside
        /// it) or an ONNX model (`.onnx`).
        file: PathBuf,
        /// Write the module to this file instead of stdout, and its constants to the
        /// `.safetensors` file beside it (both atomically), so it can be read back.
        #[arg(short = 'o', long = "output")]
        output: Option<PathBuf>,
    },
    /// Parse (or import) and verify a module; print a one-line summary, or every violated
    /// invariant.
    Check {
        /// The module file (`.relax` or `.onnx`).
        file: PathBuf,
    },
    /// Partition a module with a pattern table and print the result or its report.
    Partition {
        /// The module file (`.relax` or `.onnx`).
        file: PathBuf,
        /// Give a symbolic dim a fixed value, `NAME=VALUE` (repeatable; e.g. `--bind batch=1
        /// --bind sequence=128`): the model is specialised to that shape before partitioning
        /// (TVM's BindSymbolicVars), which the GPU backends need (they compile static shapes).
        #[arg(long = "bind", value_name = "NAME=VALUE", value_parser = fusebox::parse_bind)]
        binds: Vec<(String, i64)>,
        /// A TOML file of `[[pattern]]` tables (name, pattern, optional priority and check);
        /// without it no pattern is applied (use `--fuse-ops` to run FuseOps alone).
        #[arg(long)]
        patterns: Option<PathBuf>,
        /// Keep constants inside composites (else they become parameters).
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        bind_constants: bool,
        /// Wrap each composite in a public function with `Codegen`.
        #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
        annotate_codegen: bool,
        /// Merge neighbouring composites of one codegen into regions (MergeCompositeFunctions).
        #[arg(long)]
        merge: bool,
        /// Run FuseOps (automatic fusion) after the pattern partition (and after `--merge`).
        #[arg(long)]
        fuse_ops: bool,
        /// FuseOps level: 0 nothing, 1 elementwise/broadcast chains, 2 everything (the
        /// config's `fuse_opt_level` takes the same three values).
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=2))]
        fuse_opt_level: u32,
        /// FuseOps: the most bindings in one fused group.
        #[arg(long, default_value_t = 256)]
        max_depth: usize,
        /// What to print.
        #[arg(long, value_enum, default_value_t = Emit::Text)]
        emit: Emit,
        /// Print `time <phase> <ms> ms` lines to stderr (`emit`: building and writing what
        /// `--emit` asks for).
        #[arg(long)]
        timings: bool,
        /// Write what `--emit` asks for to this file instead of stdout (text: the module, and
        /// its constants to the `.safetensors` file beside it); written atomically.
        #[arg(short = 'o', long = "output")]
        output: Option<PathBuf>,
        /// A config (backends, their patterns, plugins, partition options): partition, then
        /// claim and compile each function; `--patterns` adds user patterns to it and the
        /// partition flags above are ignored in favour of its `[partition]` table.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// List every backend of a config (built-in and plugins), its patterns in priority order,
    /// and the lint findings on the combined table.
    Backends {
        /// The config.
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
    },
    /// Why was a binding of main not offloaded? Patterns tried at it and why they were
    /// rejected, the function it ended in, and which backends declined that and why.
    Explain {
        /// The module file.
        file: PathBuf,
        /// The config.
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        /// The name of the binding of main (its var).
        #[arg(long)]
        binding: String,
    },
    /// Run a model (`.onnx` or `.relax`) on the CPU reference executor after partitioning it
    /// (optional pattern table, then FuseOps), writing each output as `.npy`.
    Run {
        /// The model: `.onnx` (imported) or `.relax` (text).
        file: PathBuf,
        /// Give a symbolic dim a fixed value, `NAME=VALUE` (repeatable; e.g. `--bind batch=1
        /// --bind sequence=128`): the model is specialised to that shape before partitioning
        /// (TVM's BindSymbolicVars), which the GPU backends need (they compile static shapes).
        #[arg(long = "bind", value_name = "NAME=VALUE", value_parser = fusebox::parse_bind)]
        binds: Vec<(String, i64)>,
        /// A config (backends, patterns, partition options, plugins): the whole backend flow,
        /// with each claimed function run by its backend's artifact. Without it: the
        /// `--patterns` table (else the CPU backend's transformer patterns), then FuseOps, on
        /// the CPU reference.
        #[arg(long, conflicts_with = "patterns")]
        config: Option<PathBuf>,
        /// A TOML pattern table applied before FuseOps (as `partition --patterns`), instead of
        /// the CPU backend's transformer patterns.
        #[arg(long)]
        patterns: Option<PathBuf>,
        /// `NAME=PATH.npy` for a parameter of `main`; the others get random values.
        #[arg(long = "input")]
        inputs: Vec<String>,
        /// Seed of the random inputs (floats uniform in [-1, 1]).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Where the outputs go, as `<output name>.npy`.
        #[arg(long, default_value = "out")]
        output_dir: PathBuf,
        /// Also run the unpartitioned module and compare (exit 1 on a difference).
        #[arg(long)]
        check: bool,
        /// Print per-function times (calls and total ms) to stderr.
        #[arg(long)]
        profile: bool,
        /// With `--profile`: the most per-shape lines under one op, fused kernel or conv chain
        /// (0: every shape); the other shapes are summed in one line.
        #[arg(long, default_value_t = 8)]
        profile_shapes: usize,
        /// Print `time import|partition|compile|run <ms> ms` lines to stderr.
        #[arg(long)]
        timings: bool,
        /// Timed runs after one warm-up; the median is reported.
        #[arg(long, default_value_t = 1)]
        repeat: usize,
        /// The largest tensor the run may allocate: bytes or a size such as `8GiB` (default:
        /// `[runtime] memory_limit` of `--config`, else 75% of the available memory).
        #[arg(long, value_parser = fusebox_core::runtime::memory::parse_size)]
        memory_limit: Option<u64>,
    },
    /// Partition a model with a config, claim every function and build it ahead of time, with no
    /// device needed: each function's files (`<function>.cu`, `<function>.cubin`, …) and one
    /// `manifest.json` (function, backend, kernels with their launch configuration, arch,
    /// files) in `--out-dir`. Functions the CPU reference runs are listed with backend `cpu`
    /// and no files.
    Compile {
        /// The model: `.onnx` (imported) or `.relax` (text).
        file: PathBuf,
        /// Give a symbolic dim a fixed value, `NAME=VALUE` (repeatable; e.g. `--bind batch=1
        /// --bind sequence=128`): the model is specialised to that shape before partitioning
        /// (TVM's BindSymbolicVars), which the GPU backends need (they compile static shapes).
        #[arg(long = "bind", value_name = "NAME=VALUE", value_parser = fusebox::parse_bind)]
        binds: Vec<(String, i64)>,
        /// The config (backends, patterns, partition options, plugins).
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        /// Where the files and `manifest.json` go (created if needed).
        #[arg(long, default_value = "build")]
        out_dir: PathBuf,
    },
    /// Benchmarks (not tests): each reports a ratio against a baseline measured in the same run.
    #[command(subcommand)]
    Bench(BenchCmd),
}

impl Command {
    /// The model file the command reads, if any.
    fn model_file(&self) -> Option<&std::path::Path> {
        match self {
            Command::Show { file, .. }
            | Command::Check { file }
            | Command::Partition { file, .. }
            | Command::Explain { file, .. }
            | Command::Run { file, .. }
            | Command::Compile { file, .. } => Some(file),
            Command::Backends { .. } | Command::Bench(_) => None,
        }
    }
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Parse + verify + print of a generated module with N bindings.
    Text {
        /// Number of bindings in the generated module.
        #[arg(long, default_value_t = 100_000)]
        bindings: usize,
        /// Timed repetitions; the median is reported.
        #[arg(long, default_value_t = 5)]
        repeat: usize,
    },
    /// FuseOpsByPattern on chains of `matmul → add → relu` layers (3 ops per layer).
    Partition {
        /// Op counts to run, comma separated.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "1000,10000,100000,1000000"
        )]
        ops: Vec<usize>,
        /// `one` (matmul_bias_relu only) or `table20` (a 20-entry cuBLAS/CUTLASS-like table).
        #[arg(long, default_value = "table20")]
        table: String,
        /// Timed repetitions; the median is reported.
        #[arg(long, default_value_t = 3)]
        repeat: usize,
    },
    /// FuseOps (opt level 2) on chains of `matmul → add → relu` layers (3 ops per layer).
    FuseOps {
        /// Op counts to run, comma separated.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "1000,10000,100000,1000000"
        )]
        ops: Vec<usize>,
        /// Timed repetitions; the median is reported.
        #[arg(long, default_value_t = 3)]
        repeat: usize,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Emit {
    /// The partitioned module in the text format.
    Text,
    /// The partition report as JSON.
    Json,
    /// A DOT graph of main with one cluster per fused function.
    Dot,
    /// The partition report as one self-contained HTML page: main's graph coloured by
    /// backend (pan and zoom), a legend, the functions' table and a details panel.
    Html,
}

/// The default config (`--config`'s default).
const DEFAULT_CONFIG: &str = fusebox::DEFAULT_CONFIG;

use fusebox::load_config;
use fusebox::load_model as read_model;
use fusebox::read_pattern_table as read_table;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let model = cli.command.model_file().map(std::path::Path::to_path_buf);
    let result = run(cli.command);
    // Every output file is complete by now; only then is a failed stdout reported.
    let stdout = out::finish();
    match (result, stdout) {
        (Err(e), _) => {
            // Every error names the model it is about (parse and import errors already do),
            // and a 5 MB value the user gave is not echoed back whole.
            errln!("error: {}", fusebox::error_message(&e, model.as_deref()));
            ExitCode::FAILURE
        }
        // The reader closed the pipe (`| head`): it has what it wanted.
        (Ok(()), Some(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        (Ok(()), Some(e)) => {
            errln!("error: writing to standard output: {e}");
            ExitCode::FAILURE
        }
        (Ok(()), None) => ExitCode::SUCCESS,
    }
}

fn run(cmd: Command) -> Result<(), fusebox::Error> {
    match cmd {
        Command::Show { file, output } => {
            let m = read_model(&file)?;
            match output {
                Some(o) => text::write_module(&o, &m)?,
                None => out!("{}", text::print_module(&m).text),
            }
            Ok(())
        }
        Command::Check { file } => {
            let m = read_model(&file)?;
            verify(&m).map_err(fusebox_core::Error::Verify)?;
            let bindings: usize = m.functions.values().map(|f| f.bindings().count()).sum();
            outln!(
                "{}: ok ({} function(s), {} binding(s))",
                file.display(),
                m.functions.len(),
                bindings
            );
            Ok(())
        }
        Command::Partition {
            file,
            binds,
            patterns,
            bind_constants,
            annotate_codegen,
            merge,
            fuse_ops,
            fuse_opt_level,
            max_depth,
            emit,
            timings,
            output,
            config,
        } => {
            let t = Instant::now();
            let m = fusebox::bind_dims(read_model(&file)?, &binds)?;
            let parse_ms = t.elapsed().as_secs_f64() * 1e3;
            if let Some(config) = config {
                let mut cfg = load_config(&config)?;
                if let Some(p) = &patterns {
                    fusebox::partition::add_user_patterns(&mut cfg, read_table(p)?);
                }
                let pipeline = fusebox::pipeline(cfg)?;
                let t = Instant::now();
                let plan = fusebox::partition::partition_with_config(&pipeline, &m)?;
                let ms = t.elapsed().as_secs_f64() * 1e3;
                let t = Instant::now();
                match emit {
                    Emit::Text => {
                        emit_module(&plan.module, output.as_deref())?;
                        for c in &plan.claims {
                            errln!(
                                "{} -> {}{}",
                                c.function,
                                c.backend.as_deref().unwrap_or("(none)"),
                                if c.fallback { " (fallback)" } else { "" }
                            );
                            for (b, r) in &c.declines {
                                errln!("  declined by {b}: {r}");
                            }
                            for (b, r) in &c.compile_failures {
                                errln!("  compile failed in {b}: {r}");
                            }
                        }
                        for r in &plan.rejections {
                            errln!("rejected {} at {}: {}", r.pattern, r.at, r.reason);
                        }
                    }
                    Emit::Json => {
                        emit_text(&format!("{}\n", plan.report().to_json()), output.as_deref())?
                    }
                    Emit::Dot => emit_text(
                        &fusebox_core::report::to_dot(&plan.module),
                        output.as_deref(),
                    )?,
                    Emit::Html => emit_text(
                        &fusebox_core::report::html::to_html(
                            &plan.module,
                            &plan.report(),
                            &file.display().to_string(),
                        )?,
                        output.as_deref(),
                    )?,
                }
                let emit_ms = t.elapsed().as_secs_f64() * 1e3;
                if timings {
                    errln!("time parse {parse_ms:.3} ms");
                    errln!("time partition+claim+compile {ms:.3} ms");
                    errln!("time emit {emit_ms:.3} ms");
                }
                return Ok(());
            }
            let out = fusebox::partition::partition_with_patterns(
                &m,
                &fusebox::partition::PatternPartition {
                    patterns: match &patterns {
                        Some(patterns) => read_table(patterns)?,
                        None => Vec::new(),
                    },
                    bind_constants,
                    annotate_codegen,
                    merge,
                    fuse_ops,
                    fuse_opt_level,
                    max_depth,
                },
            )?;
            let t = Instant::now();
            match emit {
                Emit::Text => emit_module(&out.module, output.as_deref())?,
                Emit::Json => {
                    emit_text(&format!("{}\n", out.report().to_json()), output.as_deref())?
                }
                Emit::Dot => emit_text(
                    &fusebox_core::report::to_dot(&out.module),
                    output.as_deref(),
                )?,
                Emit::Html => emit_text(
                    &fusebox_core::report::html::to_html(
                        &out.module,
                        &out.report(),
                        &file.display().to_string(),
                    )?,
                    output.as_deref(),
                )?,
            }
            let emit_ms = t.elapsed().as_secs_f64() * 1e3;
            if timings {
                errln!("time parse {parse_ms:.3} ms");
                errln!("time partition {:.3} ms", out.partition_ms);
                for pt in &out.pass_times {
                    errln!("time {} {:.3} ms", pt.name, pt.ms);
                }
                errln!("time emit {emit_ms:.3} ms");
            }
            Ok(())
        }
        Command::Run {
            file,
            binds,
            config,
            patterns,
            inputs,
            seed,
            output_dir,
            check,
            profile,
            profile_shapes,
            timings,
            repeat,
            memory_limit,
        } => Ok(run_cmd::run(run_cmd::RunArgs {
            file,
            binds,
            config: match config {
                Some(c) => Some(fusebox::pipeline(load_config(&c)?)?),
                None => None,
            },
            patterns,
            inputs,
            seed,
            output_dir,
            check,
            profile,
            profile_shapes,
            timings,
            repeat,
            memory_limit,
        })?),
        Command::Backends { config } => {
            let pipeline = fusebox::pipeline(load_config(&config)?)?;
            outln!("config: {}", config.display());
            let listing = fusebox::partition::backend_listing(&pipeline);
            for b in &listing.backends {
                outln!("backend {} ({})", b.name, b.origin);
                if b.patterns.is_empty() {
                    outln!("  (no patterns)");
                }
                for p in &b.patterns {
                    outln!(
                        "  {} priority {}{}{}: {}",
                        p.name,
                        p.priority,
                        p.check
                            .as_ref()
                            .map(|c| format!(" check {c}"))
                            .unwrap_or_default(),
                        if p.user { " (from the config)" } else { "" },
                        p.pattern
                    );
                }
            }
            if !listing.unassigned.is_empty() {
                outln!("user patterns of no enabled backend:");
                for p in &listing.unassigned {
                    outln!("  {} priority {}: {}", p.name, p.priority, p.pattern);
                }
            }
            if listing.lint.is_empty() {
                outln!("lint: no findings");
            }
            for f in listing.lint {
                outln!("lint {}: {}", f.kind, f.message);
            }
            Ok(())
        }
        Command::Explain {
            file,
            config,
            binding,
        } => {
            let m = read_model(&file)?;
            let pipeline = fusebox::pipeline(load_config(&config)?)?;
            out!("{}", pipeline.explain(&m, &binding)?);
            Ok(())
        }
        Command::Compile {
            file,
            binds,
            config,
            out_dir,
        } => compile_cmd(&file, &binds, &config, &out_dir),
        Command::Bench(BenchCmd::Text { bindings, repeat }) => bench_text(bindings, repeat.max(1)),
        Command::Bench(BenchCmd::Partition { ops, table, repeat }) => {
            bench_partition(&ops, &table, repeat.max(1))
        }
        Command::Bench(BenchCmd::FuseOps { ops, repeat }) => bench_fuse_ops(&ops, repeat.max(1)),
    }
}

/// The module to `output` (and its constants to the side file beside it, atomically), or to
/// stdout.
fn emit_module(
    m: &fusebox_core::ir::Module,
    output: Option<&std::path::Path>,
) -> Result<(), fusebox::Error> {
    match output {
        Some(o) => Ok(text::write_module(o, m)?),
        None => {
            out!("{}", text::print_module(m).text);
            Ok(())
        }
    }
}

/// `s` to `output` (staged and renamed into place), or to stdout.
fn emit_text(s: &str, output: Option<&std::path::Path>) -> Result<(), fusebox::Error> {
    match output {
        Some(o) => {
            let dir = match o.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => std::path::Path::new("."),
            };
            let name = o.file_name().map(|n| n.to_string_lossy().into_owned());
            let name = name.ok_or_else(|| {
                fusebox_core::Error::Invalid(format!("-o {}: not a file name", o.display()))
            })?;
            let mut staging = fusebox::staging::Staging::new(dir)?;
            staging.write(&name, s.as_bytes())?;
            staging.commit()?;
            Ok(())
        }
        None => {
            out!("{s}");
            Ok(())
        }
    }
}

/// Functions to build before `fusebox compile` shows a progress bar (on a terminal only).
const PROGRESS_MIN_UNITS: usize = 8;

fn compile_cmd(
    file: &std::path::Path,
    binds: &[(String, i64)],
    config: &std::path::Path,
    out_dir: &std::path::Path,
) -> Result<(), fusebox::Error> {
    use std::io::IsTerminal;
    let module = fusebox::bind_dims(read_model(file)?, binds)?;
    let pipeline = fusebox::pipeline(load_config(config)?)?;
    let tty = std::io::stderr().is_terminal();
    let mut bar: Option<indicatif::ProgressBar> = None;
    let mut progress = |done: usize, total: usize, name: &str| {
        if !tty || total < PROGRESS_MIN_UNITS {
            return;
        }
        let b = bar.get_or_insert_with(|| {
            let b = indicatif::ProgressBar::new(total as u64);
            if let Ok(style) =
                indicatif::ProgressStyle::with_template("building {pos}/{len} {bar:30} {msg}")
            {
                b.set_style(style);
            }
            b
        });
        b.set_position(done as u64);
        b.set_message(name.to_string());
        if done == total {
            b.finish_and_clear();
        }
    };
    let plan = pipeline.build(&module, &mut progress)?;
    let manifest = fusebox::write_build(&plan, out_dir)?;
    for f in &manifest.functions {
        let arch = f
            .arch
            .as_deref()
            .map(|a| format!(" {a}"))
            .unwrap_or_default();
        let files = if f.files.is_empty() {
            String::new()
        } else {
            format!(": {}", f.files.join(", "))
        };
        outln!(
            "{}: {}{arch}, {} kernel(s){}{files}",
            f.function,
            f.backend,
            f.kernels.len(),
            if f.fallback { " (fallback)" } else { "" },
        );
        for b in &f.build_failures {
            outln!("  `{}` could not build it: {}", b.backend, b.error);
        }
    }
    outln!(
        "wrote {} ({} function(s), {} kernel(s))",
        out_dir.join("manifest.json").display(),
        manifest.functions.len(),
        plan.kernel_count()
    );
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The 20-entry table of the partition benchmark: TVM's 10 cuBLAS matmul entries (as shapes:
/// transposed, bias, relu/gelu) and 10 CUTLASS-like residual/conv entries, most specific first.
fn table20() -> Vec<&'static str> {
    vec![
        "relax.nn.relu(relax.add(relax.add(relax.matmul(_, relax.permute_dims(_)), _), _))",
        "relax.nn.gelu(relax.add(relax.matmul(_, relax.permute_dims(_)), _))",
        "relax.nn.relu(relax.add(relax.matmul(_, relax.permute_dims(_)), _))",
        "relax.add(relax.matmul(_, relax.permute_dims(_)), _)",
        "relax.matmul(_, relax.permute_dims(_))",
        "relax.nn.relu(relax.add(relax.add(relax.matmul(_, _), _), _))",
        "relax.add(relax.add(relax.matmul(_, _), _), _)",
        "relax.nn.gelu(relax.add(relax.matmul(_, _), _))",
        "relax.nn.relu(relax.add(relax.matmul(_, _), _))",
        "relax.add(relax.matmul(_, _), _)",
        "relax.matmul(_, _)",
        "relax.nn.relu(relax.add(relax.add(relax.nn.conv2d(_, _), _), _))",
        "relax.nn.silu(relax.add(relax.nn.conv2d(_, _), _))",
        "relax.nn.relu(relax.add(relax.nn.conv2d(_, _), _))",
        "relax.add(relax.nn.conv2d(_, _), _)",
        "relax.nn.conv2d(_, _)",
        "relax.nn.layer_norm(_, _, _)",
        "relax.nn.rms_norm(_, _)",
        "relax.nn.softmax(_)",
        "relax.multiply(relax.nn.gelu(_), _)",
    ]
}

/// Partition timings on `matmul → add → relu` chains, against a baseline measured in the same
/// run: building the use/def index of the same function once (the least work any partitioner
/// that looks at every binding must do).
fn bench_partition(ops: &[usize], table: &str, repeat: usize) -> Result<(), fusebox::Error> {
    use fusebox_core::pattern::check::NoLeakingIntermediates;
    use fusebox_core::pattern::parse_pattern;
    use fusebox_core::transform::{FusionPattern, PartitionOptions, fuse_ops_by_pattern};
    let texts = match table {
        "one" => vec!["relax.nn.relu(relax.add(relax.matmul(_, _), _))"],
        "table20" => table20(),
        other => {
            return Err(fusebox_core::Error::Invalid(format!(
                "unknown table `{other}`; expected `one` or `table20`"
            ))
            .into());
        }
    };
    let mut patterns = Vec::new();
    for (i, t) in texts.iter().enumerate() {
        let p = parse_pattern(t)?;
        patterns.push(
            FusionPattern::new(&format!("bench.p{i}"), p)
                .with_check(std::sync::Arc::new(NoLeakingIntermediates)),
        );
    }
    outln!(
        "bench partition: table `{table}` ({} entries), median of {repeat}",
        patterns.len()
    );
    bench_chain(ops, repeat, "partition", &|m| {
        let out = fuse_ops_by_pattern(m, &patterns, PartitionOptions::default())?;
        Ok((out.module.functions.len() - 1, "fused function(s)"))
    })
}

/// FuseOps timings on `matmul → add → relu` chains (each layer becomes one
/// `fused_matmul_add_relu` group), against the same baseline as `bench partition`: building
/// the use/def index of the function once.
fn bench_fuse_ops(ops: &[usize], repeat: usize) -> Result<(), fusebox::Error> {
    use fusebox_core::transform::fuse_ops;
    outln!("bench fuse-ops: opt_level 2, max_depth 256, median of {repeat}");
    bench_chain(ops, repeat, "fuse_ops", &|m| {
        let out = fuse_ops(m, 2, 256)?;
        Ok((
            out.get("main").map_or(0, |f| f.bindings().count()),
            "fused call(s) in main",
        ))
    })
}

/// A pass under benchmark: returns a count to report and its unit.
type ChainPass<'a> =
    dyn Fn(&fusebox_core::ir::Module) -> Result<(usize, &'static str), fusebox::Error> + 'a;

/// Runs `pass` on `matmul → add → relu` chains of each op count, `repeat` times, against the
/// baseline of building the function's use/def index once, and prints one row per count.
/// `pass` returns what to report after the timing (a count and its unit).
fn bench_chain(
    ops: &[usize],
    repeat: usize,
    what: &str,
    pass: &ChainPass<'_>,
) -> Result<(), fusebox::Error> {
    use fusebox_core::pattern::FunctionView;
    outln!(
        "  {:>9} {:>12} {:>12} {:>10} {:>12}",
        "ops",
        "baseline ms",
        format!("{what} ms"),
        "ratio",
        "ns/op"
    );
    for &n in ops {
        let module = fusebox_core::ir::generate::mlp_chain((n / 3).max(1));
        let main = module
            .get("main")
            .ok_or_else(|| fusebox_core::Error::Invalid("no main".into()))?;
        let (mut base, mut times) = (Vec::new(), Vec::new());
        let mut report = (0, "");
        for _ in 0..repeat {
            let t = Instant::now();
            let view = FunctionView::new(main);
            std::hint::black_box(&view);
            base.push(t.elapsed().as_secs_f64());
            drop(view);
            let t = Instant::now();
            report = pass(&module)?;
            times.push(t.elapsed().as_secs_f64());
        }
        let (b, p) = (median(base), median(times));
        outln!(
            "  {:>9} {:>12.2} {:>12.2} {:>9.1}x {:>12.1}   ({} {})",
            n,
            b * 1e3,
            p * 1e3,
            p / b,
            p * 1e9 / n as f64,
            report.0,
            report.1
        );
    }
    Ok(())
}

/// Reports the median parse, verify and print times of a generated chain module, and their
/// ratio against a baseline measured in the same run: splitting the same text into
/// whitespace-separated tokens (a lower bound for any parser that reads every byte).
fn bench_text(bindings: usize, repeat: usize) -> Result<(), fusebox::Error> {
    let module = fusebox_core::ir::generate::chain_module(bindings);
    let src = text::print_module(&module).text;
    let (mut base, mut parse, mut ver, mut print) = (vec![], vec![], vec![], vec![]);
    for _ in 0..repeat {
        let t = Instant::now();
        let tokens = src.split_ascii_whitespace().count();
        std::hint::black_box(tokens);
        base.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let m = text::parse_module_str(&src)?;
        parse.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        verify(&m).map_err(fusebox_core::Error::Verify)?;
        ver.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let out = text::print_module(&m);
        print.push(t.elapsed().as_secs_f64());
        std::hint::black_box(out);
    }
    let (b, p, v, pr) = (median(base), median(parse), median(ver), median(print));
    let total = p + v + pr;
    outln!(
        "bench text: {bindings} bindings, {} bytes, median of {repeat}",
        src.len()
    );
    outln!("  baseline (whitespace tokenize) {:>9.1} ms", b * 1e3);
    outln!(
        "  parse                          {:>9.1} ms  ({:.1}x baseline)",
        p * 1e3,
        p / b
    );
    outln!(
        "  verify                         {:>9.1} ms  ({:.1}x baseline)",
        v * 1e3,
        v / b
    );
    outln!(
        "  print                          {:>9.1} ms  ({:.1}x baseline)",
        pr * 1e3,
        pr / b
    );
    outln!(
        "  parse + verify + print         {:>9.1} ms  ({:.1}x baseline)",
        total * 1e3,
        total / b
    );
    Ok(())
}
