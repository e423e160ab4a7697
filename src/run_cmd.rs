//! `fusebox run`: load a model (`.onnx` or `.relax`), partition it, run it on the CPU reference
//! executor, and write each output as `.npy`. The partition, the arguments, the run and the
//! check are the library's ([`fusebox::runner`], which the Python package calls too); this
//! module reads the `.npy` inputs, times, prints and writes.
//!
//! Contract:
//!
//! - Pipeline: import (ONNX) or parse (text) → inference simplification
//!   (`fusebox_core::transform::simplify_pipeline` with the CPU reference's constant
//!   evaluator) → FuseOpsByPattern with the `--patterns` table, else the CPU backend's own
//!   (`fusebox_cpu::backend::transformer_patterns`, as `configs/cpu.toml` gets it) → FuseOps
//!   (opt level 2) → a `fusebox_cpu::Executor` on `main`
//!   (constants decoded in the warm-up run and reused; kernels on `FUSEBOX_THREADS` threads,
//!   an invalid value being an error); or, with
//!   `--config`, the config's backend pipeline (patterns of every backend, claims, compile),
//!   each claimed function run by its backend's artifact and the rest by the CPU reference;
//!   then the partition report goes to stdout first: `partition: N function(s), M op(s) left
//!   in main ...`, one line per function (name, backend, ops) and one for the ops left in
//!   `main` (backend `reference`).
//! - Inputs: `--input NAME=PATH.npy` (NAME is the parameter's name, or the ONNX input name before
//!   sanitizing); parameters not given get uniform random values in [-1, 1] from `--seed`
//!   (integers: 0 or 1; symbolic dims not fixed by a given input are 1). `.npy` dtypes: f16,
//!   f32, f64, i8, u8, i32, i64, bool (little-endian, C order).
//! - Memory: `--memory-limit SIZE`, else the config's `[runtime] memory_limit`, else 75% of
//!   the available memory bounds every tensor of the run (inputs read or generated, constants,
//!   op results); a tensor beyond it is a typed error naming the input or op, dtype and shape
//!   (see `fusebox_core::runtime::memory`), raised before anything is allocated.
//! - Outputs: `<output name>.npy` in `--output-dir` (default `out/`), all or nothing: every
//!   output is written into a fresh staging directory inside it and moved into place only when
//!   every write (and `--check`, if asked) succeeded ([`fusebox::staging`]); then one summary
//!   line per output on stdout.
//! - `--check` runs the unpartitioned module on the same inputs and compares every output
//!   (f32: 1e-4, f16/bf16: 1e-2, f64: 1e-8, relative to the output's range, i.e. its largest
//!   magnitude or 1; integers and bool exactly); the first differing output is named in the
//!   error and the exit code is 1.
//! - `--timings`: `time import|partition|compile|run <ms> ms` on stderr (run = median of
//!   `--repeat N` runs after one warm-up, device outputs downloaded inside it; compile is 0:
//!   the backends compile during partition).
//! - `--profile`: per-function and per-op totals (calls, ms, share of the run) of the median
//!   timed run (the one `time run` reports) on stderr, functions first with their backend,
//!   pattern and ops; an op, fused kernel or conv chain called on several operand shapes split
//!   by shape, `--profile-shapes N` lines at most (default 8, 0: all).
//!
//! ```text
//! $ fusebox run model.onnx --check --timings
//! prob_1: shape [1, 1000] float32 min 0.001 max 0.001 mean 0.001 -> out/prob_1.npy
//! check: 1 output(s) match the unpartitioned module
//! time import 12.1 ms
//! ```

use fusebox::runner::{self, Prepared, RunMode};
use fusebox_core::Error;
use fusebox_core::frontend::onnx::{import_onnx_file, is_onnx_path, output_names};
use fusebox_core::ir::Module;
use fusebox_core::report::ClaimReport;
use fusebox_cpu::{CallProfile, StorageRef, Tensor, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The options of `fusebox run`.
pub struct RunArgs {
    pub file: PathBuf,
    /// `--bind NAME=VALUE`: symbolic dims given fixed values before partitioning.
    pub binds: Vec<(String, i64)>,
    /// The backend pipeline of `--config`, when given.
    pub config: Option<fusebox_core::backend::pipeline::BackendPipeline>,
    pub patterns: Option<PathBuf>,
    pub inputs: Vec<String>,
    pub seed: u64,
    pub output_dir: PathBuf,
    pub check: bool,
    pub profile: bool,
    /// `--profile-shapes`: the most per-shape lines under one op (0: all).
    pub profile_shapes: usize,
    pub timings: bool,
    pub repeat: usize,
    /// `--memory-limit` in bytes.
    pub memory_limit: Option<u64>,
}

fn io_err(path: &Path, e: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source: e,
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Runs the partitioned module `prepared`: one warm-up (which also decodes the constants), then
/// `--repeat` timed runs, the outputs downloaded inside each (a device result is not done
/// until it is on the host); then [`finish`].
fn run_prepared(
    a: &RunArgs,
    module: &Module,
    names: &[String],
    prepared: &Prepared,
    [import_ms, partition_ms]: [f64; 2],
) -> Result<(), Error> {
    let args = main_args(module, &a.inputs, a.seed)?;
    // One executor for all runs: constants are decoded once.
    let ex = fusebox_cpu::Executor::new();
    let (mut out, _) = prepared
        .execute(&ex, args.clone(), false)
        .map_err(runner::into_core)?;
    // Each run's time with its profile: the profile shown is the median run's, so one slow
    // run (the machine busy elsewhere) does not skew it.
    let mut runs = Vec::new();
    for _ in 0..a.repeat.max(1) {
        let t = Instant::now();
        let profile;
        (out, profile) = prepared
            .execute(&ex, args.clone(), a.profile)
            .map_err(runner::into_core)?;
        runs.push((ms(t), profile));
    }
    runs.sort_by(|x, y| x.0.total_cmp(&y.0));
    let (run_ms, profile) = runs.swap_remove(runs.len() / 2);
    finish(
        a,
        names,
        out,
        || runner::run_unpartitioned(&ex, module, args),
        [import_ms, partition_ms, run_ms],
        (&profile, prepared.module(), prepared.claims()),
    )
}

/// The end of both paths: the outputs staged, `--check` against the unpartitioned module's
/// outputs (`unpartitioned`, run only when asked), the outputs moved into place, then the
/// `--timings` lines (`[import, partition, run]` ms) and the `--profile` lines.
fn finish(
    a: &RunArgs,
    names: &[String],
    out: Value,
    unpartitioned: impl FnOnce() -> Result<Value, Error>,
    [import_ms, partition_ms, run_ms]: [f64; 3],
    (profile, module, claims): (&[CallProfile], &Module, &[ClaimReport]),
) -> Result<(), Error> {
    let outs = runner::flatten(out);
    let staged = stage_outputs(&a.output_dir, names, &outs)?;
    if a.check {
        let want = runner::flatten(unpartitioned()?);
        runner::compare_outputs(&want, &outs, names)?;
    }
    commit_outputs(staged, a.check)?;
    if a.timings {
        errln!("time import {import_ms:.3} ms");
        errln!("time partition {partition_ms:.3} ms");
        errln!("time compile 0.000 ms");
        errln!("time run {run_ms:.3} ms");
    }
    let shapes = match a.profile_shapes {
        0 => usize::MAX,
        n => n,
    };
    print_profile(profile, module, claims, run_ms, shapes);
    Ok(())
}

/// The `--profile` lines on stderr (nothing when not profiling: the list is empty): the calls
/// of the median timed run, with shares of its time `run_ms`; first the module functions and the executor's fused chains,
/// then the ops (counted inside functions too), each group by time, largest first. A line is
/// `profile <name> calls <n> <ms> ms <share>% of run` and then what it is: a function's
/// backend, pattern (`Composite`) and ops in binding order, `chain` for a fused conv chain
/// the executor ran as one kernel, `op` for an op. Function times include what they call.
/// Under an op, chain or fused kernel called on more than one set of operand shapes, lines
/// `profile <name> on <shapes> calls <n> <ms> ms <share>% of run` split it by shapes
/// (`shape_lines` at most, largest first, the rest summed in one line).
fn print_profile(
    profile: &[CallProfile],
    module: &Module,
    claims: &[ClaimReport],
    run_ms: f64,
    shape_lines: usize,
) {
    if profile.is_empty() {
        return;
    }
    let report = fusebox_core::report::build(module, &[]);
    let describe = |name: &str| -> Option<String> {
        let f = report.functions.iter().find(|f| f.name == name)?;
        let backend = claims
            .iter()
            .find(|c| c.function == name)
            .and_then(|c| c.backend.clone())
            .unwrap_or_else(|| "cpu".to_string());
        let pattern = f
            .composite
            .clone()
            .or_else(|| f.inner_composites.first().cloned())
            .map(|c| format!(" pattern {c};"))
            .unwrap_or_default();
        let ops: Vec<&str> = f
            .ops
            .iter()
            .map(|o| o.strip_prefix("relax.").unwrap_or(o))
            .collect();
        Some(format!("[{backend};{pattern} {}]", ops.join(" ")))
    };
    let mut rows: Vec<(u8, &CallProfile, String)> = profile
        .iter()
        .map(|p| match describe(&p.name) {
            Some(d) => (0, p, d),
            None if p.name.contains('+') => (0, p, "[chain]".to_string()),
            None => (1, p, "[op]".to_string()),
        })
        .collect();
    rows.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then(b.1.seconds.total_cmp(&a.1.seconds))
            .then(a.1.name.cmp(&b.1.name))
    });
    errln!(
        "profile: the calls of the median timed run ({run_ms:.3} ms), as shares of it; \
         functions include the ops they call"
    );
    let share_of = |ms: f64| {
        if run_ms > 0.0 {
            100.0 * ms / run_ms
        } else {
            0.0
        }
    };
    for (_, p, what) in rows {
        let ms = p.seconds * 1e3;
        let share = share_of(ms);
        errln!(
            "profile {} calls {} {ms:.3} ms {share:.1}% of run {what}",
            p.name,
            p.calls
        );
        // An op on more than one set of operand shapes: its calls by shapes, so a user can
        // tell, say, a language model's head from its other products.
        if p.by_shape.len() > 1 {
            for s in p.by_shape.iter().take(shape_lines) {
                let ms = s.seconds * 1e3;
                errln!(
                    "profile {} on {} calls {} {ms:.3} ms {:.1}% of run",
                    p.name,
                    s.shapes,
                    s.calls,
                    share_of(ms)
                );
            }
            if let Some(rest) = p.by_shape.get(shape_lines..).filter(|r| !r.is_empty()) {
                let ms: f64 = rest.iter().map(|s| s.seconds * 1e3).sum();
                let calls: usize = rest.iter().map(|s| s.calls).sum();
                errln!(
                    "profile {} on {} other shape sets calls {calls} {ms:.3} ms {:.1}% of run",
                    p.name,
                    rest.len(),
                    share_of(ms)
                );
            }
        }
    }
}

/// The partition report of `--config` on stdout: each function with the backend that runs it
/// and its ops, then the ops left in `main` (run by the CPU reference executor).
fn print_partition(plan: &fusebox_core::backend::pipeline::Plan) {
    let report = plan.report();
    let main_ops: Vec<&str> = report
        .main
        .iter()
        .filter_map(|e| e.strip_prefix("op:"))
        .collect();
    outln!(
        "partition: {} function(s), {} op(s) left in main (run by the CPU reference executor)",
        report.functions.len(),
        main_ops.len()
    );
    let rows: Vec<(&str, &str, String)> = report
        .functions
        .iter()
        .map(|f| {
            let backend = f.backend.as_deref().unwrap_or("reference");
            // Say when an earlier backend claimed it but could not compile it, or when it is
            // the CPU fallback.
            let why = plan
                .claims
                .iter()
                .find(|c| c.function == f.name)
                .map(|c| match (c.compile_failures.first(), c.fallback) {
                    (Some((b, _)), _) => format!("  (fallback: `{b}` could not compile it)"),
                    (None, true) => "  (fallback: no backend claimed it)".to_string(),
                    (None, false) => String::new(),
                })
                .unwrap_or_default();
            (
                f.name.as_str(),
                backend,
                format!("{}{why}", f.ops.join(", ")),
            )
        })
        .chain((!main_ops.is_empty()).then(|| ("main", "reference", main_ops.join(", "))))
        .collect();
    let w0 = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let w1 = rows.iter().map(|r| r.1.len()).max().unwrap_or(0);
    for (name, backend, ops) in rows {
        outln!("  {name:w0$}  {backend:w1$}  {ops}");
    }
}

/// Runs the command.
pub fn run(a: RunArgs) -> Result<(), Error> {
    runner::prepare_runtime(a.memory_limit, a.config.as_ref().map(|p| &p.config))?;
    let t = Instant::now();
    let is_onnx = is_onnx_path(&a.file);
    let module = if is_onnx {
        import_onnx_file(&a.file)?
    } else {
        fusebox_core::text::read_module(&a.file)?
    };
    let module = fusebox::bind_dims(module, &a.binds).map_err(runner::into_core)?;
    let import_ms = ms(t);
    let main = module
        .get("main")
        .ok_or_else(|| Error::Invalid(format!("{}: no function `main`", a.file.display())))?;
    let names = output_names(main);

    let prepared = match &a.config {
        Some(pipeline) => {
            if let Some(warning) = fusebox::check_target(&pipeline.config)? {
                errln!("{warning}");
            }
            let t = Instant::now();
            let prepared = runner::prepare(&module, RunMode::Config(pipeline))?;
            let partition_ms = ms(t);
            if let Prepared::Plan(plan) = &prepared {
                print_partition(plan);
            }
            (prepared, partition_ms)
        }
        None => {
            let t = Instant::now();
            let table = match &a.patterns {
                Some(p) => {
                    let src = std::fs::read_to_string(p).map_err(|e| io_err(p, e))?;
                    Some(fusebox_core::pattern_table::parse_pattern_table(
                        &src,
                        &p.display().to_string(),
                    )?)
                }
                None => None,
            };
            (runner::prepare(&module, RunMode::Patterns(table))?, ms(t))
        }
    };
    run_prepared(&a, &module, &names, &prepared.0, [import_ms, prepared.1])
}

/// Outputs staged in their directory (see [`fusebox::staging`]) with their summary lines.
struct Staged {
    staging: fusebox::staging::Staging,
    /// `(file stem, summary)` per output, in output order.
    lines: Vec<(String, String)>,
}

/// Writes each output as `<sanitized name>.npy` into a fresh staging directory inside `dir`;
/// nothing in `dir` changes until [`commit_outputs`].
fn stage_outputs(dir: &Path, names: &[String], outs: &[Tensor]) -> Result<Staged, Error> {
    let mut staging = fusebox::staging::Staging::new(dir)?;
    let mut lines = Vec::new();
    for (t, file) in outs.iter().zip(runner::output_stems(names, outs.len())) {
        let name = format!("{file}.npy");
        let shape: Vec<u64> = t.shape().iter().map(|&d| d as u64).collect();
        let mut buf = Vec::new();
        write_npy_to(&mut buf, &shape, t.storage())
            .map_err(|e| io_err(&staging.final_path(&name), e))?;
        staging.write(&name, &buf)?;
        lines.push((file, summary(t)));
    }
    Ok(Staged { staging, lines })
}

/// Moves the staged outputs into place, then prints one summary line per output (and the
/// `--check` line when `checked`).
fn commit_outputs(staged: Staged, checked: bool) -> Result<(), Error> {
    let paths = staged.staging.commit()?;
    for ((file, summary), path) in staged.lines.iter().zip(&paths) {
        outln!("{file}: {summary} -> {}", path.display());
    }
    if checked {
        outln!(
            "check: {} output(s) match the unpartitioned module",
            paths.len()
        );
    }
    Ok(())
}

/// The summary line of an output: shape, dtype, and min/max/mean of its elements (NaN when
/// any element is NaN; an empty tensor has no statistics and says so).
fn summary(t: &Tensor) -> String {
    let v = t.to_f64_vec();
    let head = format!("shape {:?} {}", t.shape(), t.dtype());
    if v.is_empty() {
        return format!("{head} (empty)");
    }
    let (mut lo, mut hi, mut sum) = (f64::INFINITY, f64::NEG_INFINITY, 0.0);
    let mut nan = false;
    for &x in &v {
        nan |= x.is_nan();
        lo = lo.min(x);
        hi = hi.max(x);
        sum += x;
    }
    if nan {
        (lo, hi) = (f64::NAN, f64::NAN);
    }
    let mean = sum / v.len() as f64;
    format!("{head} min {lo:.6} max {hi:.6} mean {mean:.6}")
}

/// Arguments for `main`: given `.npy` inputs (`NAME=PATH.npy`), random values from `seed` for
/// the rest ([`runner::main_args`]).
fn main_args(m: &Module, inputs: &[String], seed: u64) -> Result<Vec<Value>, Error> {
    let mut given: BTreeMap<String, Tensor> = BTreeMap::new();
    for spec in inputs {
        let (name, path) = spec
            .split_once('=')
            .ok_or_else(|| Error::Invalid(format!("--input `{spec}`: expected NAME=PATH.npy")))?;
        let key = runner::input_key(m, name, "--input")?;
        given.insert(key, fusebox::read_npy(Path::new(path))?);
    }
    runner::main_args(m, given, Some(seed), "--input")
}

fn write_npy_to(buf: &mut Vec<u8>, shape: &[u64], s: StorageRef<'_>) -> std::io::Result<()> {
    use npyz::WriterBuilder;
    macro_rules! w {
        ($t:ty, $v:expr) => {{
            let mut w = npyz::WriteOptions::<$t>::new()
                .default_dtype()
                .shape(shape)
                .writer(&mut *buf)
                .begin_nd()?;
            w.extend($v)?;
            w.finish()
        }};
    }
    match s {
        StorageRef::F32(v) => w!(f32, v.iter().copied()),
        StorageRef::F64(v) => w!(f64, v.iter().copied()),
        StorageRef::F16(v) => w!(half::f16, v.iter().copied()),
        // numpy has no bfloat16: written widened to float32.
        StorageRef::BF16(v) => w!(f32, v.iter().map(|x| x.to_f32())),
        StorageRef::I8(v) => w!(i8, v.iter().copied()),
        StorageRef::U8(v) => w!(u8, v.iter().copied()),
        StorageRef::I32(v) => w!(i32, v.iter().copied()),
        StorageRef::I64(v) => w!(i64, v.iter().copied()),
        StorageRef::Bool(v) => w!(bool, v.iter().copied()),
    }
}
