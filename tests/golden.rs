//! Golden text-IR tests. Each file under `tests/golden/` holds, in this order:
//!
//! ```text
//! # test: print | error | verify
//! <input module>
//! # ==== expected ====
//! #| <expected output, one line per `#|` line>
//! ```
//!
//! - `print`: the expected output is the printed module; the test also checks that the module
//!   verifies and that printing is a fixed point (print → parse → print).
//! - `error`: the input must fail to parse; the expected output is the rendered error.
//! - `verify`: the input parses; the expected output is the verifier's report.
//! - `partition`: header lines `# pattern: NAME = PATTERN` (or `# pattern+leakcheck: …` to add
//!   the stock `no_leaking_intermediates` check) list the patterns in priority order, and
//!   `# options: bind_constants=false annotate_codegen=true` sets options; `# backend: NAME`
//!   appends the pattern table of the built-in backend NAME (in its priority order, checks
//!   included) at that point of the list; the expected output is
//!   the partitioned module (which must verify) followed by the rejections. The option
//!   `fuse_ops` (with optional `opt_level=N max_depth=N`) runs FuseOps afterwards (after `merge`
//!   when given); with no `# pattern:` line FuseOps runs alone.
//!
//! - `simplify`: a header line `# passes: NAME NAME …` lists simplification passes
//!   (`fold_constant` with the CPU reference's evaluator, `remove_identity`,
//!   `remove_export_noise`, `fold_batch_norm`, or `all` for the whole
//!   `simplify_for_inference`), run in that order; the expected output is the result (which
//!   must verify) followed by its metadata constants (dtype, shape, values).
//!
//! On a mismatch the test prints a unified diff. `BLESS=1 cargo test --test golden` rewrites the
//! expectations from the actual output.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failure is a panic"
)]

use fusebox_core::ir::verify::verify;
use fusebox_core::text;
use std::path::{Path, PathBuf};

const MARKER: &str = "# ==== expected ====";

fn golden_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for p in paths {
        if p.is_dir() {
            golden_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "relax") {
            out.push(p);
        }
    }
}

fn actual_output(mode: &str, name: &str, input: &str) -> Result<String, String> {
    let consts = text::ConstTable::new();
    match mode {
        "print" => {
            let m = text::parse_module(input, name, &consts)
                .map_err(|e| format!("parse failed: {e}"))?;
            verify(&m).map_err(|e| format!("verify failed: {e}"))?;
            let printed = text::print_module(&m).text;
            let again = text::parse_module(&printed, name, &consts)
                .map_err(|e| format!("reparse of the printed module failed: {e}"))?;
            let printed2 = text::print_module(&again).text;
            if printed != printed2 {
                return Err(format!(
                    "printing is not a fixed point:\n{}",
                    diff(&printed, &printed2)
                ));
            }
            Ok(printed)
        }
        "error" => match text::parse_module(input, name, &consts) {
            Ok(_) => Err("expected a parse error, but the input parsed".into()),
            Err(e) => Ok(format!("{e}\n")),
        },
        "verify" => {
            let m = text::parse_module(input, name, &consts)
                .map_err(|e| format!("parse failed: {e}"))?;
            match verify(&m) {
                Ok(()) => Err("expected verifier errors, but the module verified".into()),
                Err(e) => Ok(format!("{e}\n")),
            }
        }
        "partition" => partition_output(name, input),
        "simplify" => simplify_output(name, input),
        other => Err(format!(
            "unknown test mode `{other}` (expected print, error, verify, partition or simplify)"
        )),
    }
}

fn partition_output(name: &str, input: &str) -> Result<String, String> {
    use fusebox_core::pattern::check::NoLeakingIntermediates;
    use fusebox_core::transform::{FusionPattern, PartitionOptions, fuse_ops_by_pattern};
    let mut patterns = Vec::new();
    let mut opts = PartitionOptions::default();
    let mut merge = false;
    let mut fuse: Option<(u32, usize)> = None;
    for line in input.lines() {
        if let Some(name) = line.strip_prefix("# backend:") {
            fusebox::link_backends();
            let b = fusebox_core::backend::make_backend(name.trim(), &Default::default())
                .map_err(|e| format!("bad backend line `{line}`: {e}"))?;
            let mut table = b.patterns();
            fusebox_core::transform::sort_by_priority(&mut table);
            patterns.extend(table);
        } else if let Some(rest) = line.strip_prefix("# pattern") {
            let (check, rest) = match rest.strip_prefix("+leakcheck:") {
                Some(r) => (true, r),
                None => (false, rest.strip_prefix(':').unwrap_or(rest)),
            };
            let (pname, text) = rest
                .split_once('=')
                .ok_or(format!("bad pattern line `{line}`"))?;
            let pat = fusebox_core::pattern::parse_pattern(text.trim())
                .map_err(|e| format!("bad pattern `{}`: {e}", text.trim()))?;
            let mut fp = FusionPattern::new(pname.trim(), pat);
            if check {
                fp = fp.with_check(std::sync::Arc::new(NoLeakingIntermediates));
            }
            patterns.push(fp);
        } else if let Some(rest) = line.strip_prefix("# options:") {
            for kv in rest.split_whitespace() {
                match kv {
                    "bind_constants=true" => opts.bind_constants = true,
                    "bind_constants=false" => opts.bind_constants = false,
                    "annotate_codegen=true" => opts.annotate_codegen = true,
                    "annotate_codegen=false" => opts.annotate_codegen = false,
                    "merge" => merge = true,
                    "fuse_ops" => {
                        fuse.get_or_insert((2, 256));
                    }
                    other if other.starts_with("opt_level=") || other.starts_with("max_depth=") => {
                        let (k, v) = other.split_once('=').unwrap_or_default();
                        let f = fuse.get_or_insert((2, 256));
                        let n: usize = v.parse().map_err(|_| format!("bad option `{other}`"))?;
                        if k == "opt_level" {
                            f.0 = n as u32;
                        } else {
                            f.1 = n;
                        }
                    }
                    other => return Err(format!("unknown option `{other}`")),
                }
            }
        }
    }
    let consts = text::ConstTable::new();
    let m = text::parse_module(input, name, &consts).map_err(|e| format!("parse failed: {e}"))?;
    let mut out =
        fuse_ops_by_pattern(&m, &patterns, opts).map_err(|e| format!("partition failed: {e}"))?;
    if merge {
        out.module = fusebox_core::transform::merge_composite_functions(&out.module)
            .map_err(|e| format!("merge failed: {e}"))?;
    }
    if let Some((opt_level, max_depth)) = fuse {
        out.module = fusebox_core::transform::fuse_ops(&out.module, opt_level, max_depth)
            .map_err(|e| format!("fuse_ops failed: {e}"))?;
    }
    verify(&out.module).map_err(|e| format!("the partitioned module does not verify: {e}"))?;
    let mut s = text::print_module(&out.module).text;
    if !out.rejections.is_empty() {
        s.push_str("\nrejections:\n");
        for r in &out.rejections {
            s.push_str(&format!("  {} at {}: {}\n", r.pattern, r.at, r.reason));
        }
    }
    Ok(s)
}

fn simplify_output(name: &str, input: &str) -> Result<String, String> {
    use fusebox_core::transform;
    let consts = text::ConstTable::new();
    let mut m =
        text::parse_module(input, name, &consts).map_err(|e| format!("parse failed: {e}"))?;
    let passes = input
        .lines()
        .find_map(|l| l.strip_prefix("# passes:"))
        .ok_or("a simplify test needs a `# passes:` line")?;
    let eval = fusebox::const_evaluator();
    for p in passes.split_whitespace() {
        m = match p {
            "fold_constant" => transform::fold_constant(&m, &eval),
            "remove_identity" => transform::remove_identity(&m),
            "remove_export_noise" => transform::remove_export_noise(&m),
            "fold_batch_norm" => transform::fold_batch_norm(&m),
            "all" => transform::simplify_for_inference(&m, Some(eval.clone())),
            other => return Err(format!("unknown pass `{other}`")),
        }
        .map_err(|e| format!("{p} failed: {e}"))?;
        verify(&m).map_err(|e| format!("the module does not verify after {p}: {e}"))?;
    }
    let printed = text::print_module(&m);
    let mut s = printed.text;
    if !printed.constants.is_empty() {
        s.push_str("\nconstants:\n");
        for (i, c) in printed.constants.iter().enumerate() {
            let vals: Vec<String> = (0..c.numel().min(16))
                .map(|j| format!("{}", c.get_f64(j).unwrap_or(f64::NAN)))
                .collect();
            let more = if c.numel() > 16 { ", …" } else { "" };
            s.push_str(&format!(
                "  [{i}] {} {:?}: [{}{more}]\n",
                c.dtype,
                c.shape,
                vals.join(", ")
            ));
        }
    }
    Ok(s)
}

fn diff(expected: &str, actual: &str) -> String {
    similar::TextDiff::from_lines(expected, actual)
        .unified_diff()
        .header("expected", "actual")
        .to_string()
}

#[test]
fn golden() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut files = Vec::new();
    golden_files(&root, &mut files);
    assert!(
        files.len() >= 20,
        "expected the golden suite, found {} files",
        files.len()
    );
    let bless = std::env::var_os("BLESS").is_some_and(|v| v == "1");
    let mut failures = Vec::new();
    for path in &files {
        let content = std::fs::read_to_string(path).unwrap_or_default();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (input, expected_part) = match content.find(MARKER) {
            Some(i) => (&content[..i], &content[i + MARKER.len()..]),
            None => (content.as_str(), ""),
        };
        let mode = input
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# test:"))
            .map(str::trim)
            .unwrap_or("");
        let expected: String = expected_part
            .lines()
            .filter_map(|l| l.strip_prefix("#|"))
            .map(|l| format!("{}\n", l.strip_prefix(' ').unwrap_or(l)))
            .collect();
        match actual_output(mode, &name, input) {
            Err(msg) => failures.push(format!("{}: {msg}", path.display())),
            Ok(actual) if actual == expected => {}
            Ok(actual) if bless => {
                let mut out = input.trim_end().to_string();
                out.push('\n');
                out.push_str(MARKER);
                out.push('\n');
                for line in actual.lines() {
                    if line.is_empty() {
                        out.push_str("#|\n");
                    } else {
                        out.push_str(&format!("#| {line}\n"));
                    }
                }
                if let Err(e) = std::fs::write(path, out) {
                    failures.push(format!("{}: cannot bless: {e}", path.display()));
                }
            }
            Ok(actual) => failures.push(format!(
                "{}: output differs (BLESS=1 to accept)\n{}",
                path.display(),
                diff(&expected, &actual)
            )),
        }
    }
    println!("golden: {} files, {} failed", files.len(), failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
