//! The README's main-job command runs the bundled small CNN end to end with the default
//! config, prints the partition report and passes its numerics check; the thread settings
//! are validated.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

use std::process::Command;

/// Runs the fusebox binary from the repository root: (success, stdout, stderr).
fn fusebox(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("cannot run fusebox: {e}"));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "fusebox panicked: {err}");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        err,
    )
}

/// Whether the `cpu` backend names a layout on this machine (`NCHW16c` on AVX-512 or AVX2):
/// then the default `conv2d_layout = "auto"` converts the small CNN whole (its stem reads the
/// image as it is), and its report and profile show the blocked layout.
fn blocked() -> bool {
    fusebox::link_backends();
    let cpu = fusebox::core::backend::make_backend("cpu", &Default::default()).unwrap();
    cpu.conv2d_layout(fusebox::core::config::Target::Cpu)
        .is_some()
}

fn out_dir(name: &str) -> String {
    std::env::temp_dir()
        .join(format!("fusebox-main-job-{}-{name}", std::process::id()))
        .display()
        .to_string()
}

#[test]
fn the_main_job_partitions_runs_and_checks_the_small_cnn() {
    let dir = out_dir("cnn");
    let (ok, out, err) = fusebox(
        &[
            "run",
            "examples/small_cnn.relax",
            "--config",
            "configs/cpu.toml",
            "--check",
            "--output-dir",
            &dir,
        ],
        &[],
    );
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    let (first, main) = if blocked() {
        (
            "partition: 6 function(s), 7 op(s) left in main (run by the CPU reference executor)",
            "reference relax.layout_transform, relax.layout_transform, relax.layout_transform, \
             relax.nn.max_pool2d, relax.layout_transform, relax.nn.adaptive_avg_pool2d, \
             relax.nn.softmax",
        )
    } else {
        (
            "partition: 5 function(s), 4 op(s) left in main (run by the CPU reference executor)",
            "reference relax.nn.max_pool2d, relax.nn.adaptive_avg_pool2d, relax.reshape, \
             relax.nn.softmax",
        )
    };
    assert_eq!(lines.first().copied(), Some(first), "{out}");
    let row = |name: &str| {
        lines
            .iter()
            .find(|l| l.split_whitespace().next() == Some(name))
            .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
    };
    assert_eq!(
        row("fused_conv2d_add_add_relu").as_deref(),
        Some("cpu relax.nn.conv2d, relax.add, relax.add, relax.nn.relu")
    );
    assert_eq!(
        row("fused_matmul_add").as_deref(),
        Some("cpu relax.matmul, relax.add")
    );
    assert_eq!(row("main").as_deref(), Some(main), "{out}");
    assert!(
        out.contains("check: 2 output(s) match the unpartitioned module"),
        "{out}"
    );
    assert!(std::path::Path::new(&dir).join("logits.npy").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn profile_works_with_a_config() {
    let dir = out_dir("profile");
    let (ok, _, err) = fusebox(
        &[
            "run",
            "examples/small_cnn.relax",
            "--config",
            "configs/cpu.toml",
            "--profile",
            "--output-dir",
            &dir,
        ],
        &[],
    );
    assert!(ok, "{err}");
    let calls = |name: &str| {
        err.lines()
            .filter_map(|l| l.strip_prefix("profile "))
            .find_map(|l| l.strip_prefix(&format!("{name} calls ")))
            .and_then(|l| l.split_whitespace().next())
            .map(|n| n.to_string())
    };
    // The cpu-claimed functions run inline, so the executor's fused chains apply in them.
    assert_eq!(calls("fused_matmul_add").as_deref(), Some("1"), "{err}");
    assert_eq!(
        calls("relax.nn.conv2d+relax.add+relax.nn.relu").as_deref(),
        Some("3"),
        "{err}"
    );
    // The chain runs on three convolutions of different shapes: one line each, by data and
    // weight shape, whose calls add up to the chain's.
    let by_shape: Vec<(&str, &str)> = err
        .lines()
        .filter_map(|l| l.strip_prefix("profile relax.nn.conv2d+relax.add+relax.nn.relu on "))
        .filter_map(|l| l.split_once(" calls "))
        .collect();
    let shapes: Vec<&str> = by_shape.iter().map(|(s, _)| *s).collect();
    let mut sorted = shapes.clone();
    sorted.sort_unstable();
    // In `NCHW16c` the stem still reads the image in `NCHW`.
    let want = if blocked() {
        [
            "(1, 1, 16, 16, 16) (32, 16, 3, 3)",
            "(1, 1, 32, 32, 16) (16, 16, 3, 3)",
            "(1, 3, 32, 32) (16, 3, 3, 3)",
        ]
    } else {
        [
            "(1, 16, 16, 16) (32, 16, 3, 3)",
            "(1, 16, 32, 32) (16, 16, 3, 3)",
            "(1, 3, 32, 32) (16, 3, 3, 3)",
        ]
    };
    assert_eq!(sorted, want, "{err}");
    assert!(
        by_shape.iter().all(|(_, rest)| rest.starts_with("1 ")),
        "{err}"
    );
    // An op called on one set of shapes gets no split.
    assert!(
        !err.lines()
            .any(|l| l.starts_with("profile relax.nn.max_pool2d on ")),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn profile_shapes_bounds_the_lines_per_shape() {
    // The chain runs on three shapes: `--profile-shapes 2` shows the two largest and sums the
    // third in one line; `--profile-shapes 0` shows all three and no sum.
    let prefix = "profile relax.nn.conv2d+relax.add+relax.nn.relu on ";
    for (limit, lines, rest) in [("2", 2, true), ("0", 3, false), ("3", 3, false)] {
        let dir = out_dir(&format!("profile-shapes-{limit}"));
        let (ok, _, err) = fusebox(
            &[
                "run",
                "examples/small_cnn.relax",
                "--profile",
                "--profile-shapes",
                limit,
                "--output-dir",
                &dir,
            ],
            &[],
        );
        assert!(ok, "{err}");
        let on: Vec<&str> = err.lines().filter_map(|l| l.strip_prefix(prefix)).collect();
        let summed: Vec<&&str> = on
            .iter()
            .filter(|l| l.contains(" other shape sets calls "))
            .collect();
        assert_eq!(
            on.len() - summed.len(),
            lines,
            "--profile-shapes {limit}: {err}"
        );
        if rest {
            assert_eq!(summed.len(), 1, "{err}");
            assert!(
                summed[0].starts_with("1 other shape sets calls 1 "),
                "{err}"
            );
        } else {
            assert!(summed.is_empty(), "{err}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn the_profile_is_the_median_runs() {
    let dir = out_dir("profile-median");
    let (ok, _, err) = fusebox(
        &[
            "run",
            "examples/small_cnn.relax",
            "--profile",
            "--timings",
            "--repeat",
            "5",
            "--output-dir",
            &dir,
        ],
        &[],
    );
    assert!(ok, "{err}");
    let run = err
        .lines()
        .find_map(|l| l.strip_prefix("time run "))
        .and_then(|l| l.strip_suffix(" ms"));
    let profiled = err
        .lines()
        .find_map(|l| l.strip_prefix("profile: the calls of the median timed run ("))
        .and_then(|l| l.split_once(" ms)"))
        .map(|(ms, _)| ms);
    assert!(run.is_some(), "{err}");
    assert_eq!(profiled, run, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bound_dynamic_axes_fix_the_shapes_of_a_run() {
    let dir = out_dir("bind");
    let (ok, out, err) = fusebox(
        &[
            "run",
            "tests/models/bert-ts/model.onnx",
            "--bind",
            "batch=2",
            "--bind",
            "sequence=5",
            "--check",
            "--output-dir",
            &dir,
        ],
        &[],
    );
    assert!(ok, "{err}");
    assert!(out.contains("last_hidden_state: shape [2, 5, 32]"), "{out}");
    let (ok, _, err) = fusebox(
        &[
            "run",
            "tests/models/bert-ts/model.onnx",
            "--bind",
            "batch",
            "--output-dir",
            &dir,
        ],
        &[],
    );
    assert!(!ok);
    assert!(err.contains("NAME=VALUE"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn thread_settings_are_validated_and_do_not_change_results() {
    let dir = out_dir("threads");
    let run = |threads: &str| {
        fusebox(
            &[
                "run",
                "examples/small_cnn.relax",
                "--output-dir",
                &dir,
                "--seed",
                "3",
            ],
            &[("FUSEBOX_THREADS", threads)],
        )
    };
    let (ok, _, err) = run("many");
    assert!(!ok);
    assert!(
        err.contains("FUSEBOX_THREADS: expected a thread count from 1 to 256, found `many`"),
        "{err}"
    );
    let (ok, one, err) = run("1");
    assert!(ok, "{err}");
    let (ok, three, err) = run("3");
    assert!(ok, "{err}");
    // The summary lines print min/max/mean to 6 decimals: equal outputs, equal lines.
    assert_eq!(one, three);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn show_and_check_import_an_onnx_model() {
    let Some(data) = std::env::var_os("ONNX_DATA_DIR") else {
        // `FUSEBOX_REQUIRE_ONNX_DATA=1` (scripts/test.sh) promises the data: a skip is a failure.
        if std::env::var("FUSEBOX_REQUIRE_ONNX_DATA").is_ok_and(|v| v == "1") {
            panic!("FUSEBOX_REQUIRE_ONNX_DATA=1 but ONNX_DATA_DIR is not set");
        }
        println!("skipped: ONNX_DATA_DIR is not set (scripts/test.sh sets it)");
        return;
    };
    let model = std::path::Path::new(&data)
        .join("pytorch-operator/test_operator_add_broadcast/model.onnx")
        .display()
        .to_string();
    let (ok, out, err) = fusebox(&["show", &model], &[]);
    assert!(ok, "{err}");
    // The imported module, printed as text that parses back to the same module.
    assert!(
        out.contains("def main(v0: R.Tensor((2, 3), dtype=\"float64\"), v1: R.Tensor((3,), dtype=\"float64\"))")
            && out.contains("= R.add(v0, v1)"),
        "{out}"
    );
    let m = fusebox_core::text::parse_module_str(&out).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(fusebox_core::text::print_module(&m).text, out);
    let (ok, out, err) = fusebox(&["check", &model], &[]);
    assert!(ok, "{err}");
    assert!(
        out.ends_with(": ok (1 function(s), 1 binding(s))\n"),
        "{out}"
    );
    // A malformed `.onnx` file is an error that names it, not a panic.
    let bad = std::env::temp_dir().join(format!("fusebox-bad-{}.onnx", std::process::id()));
    std::fs::write(&bad, b"\x0a\xff\xff\xff not protobuf").unwrap();
    let bad = bad.display().to_string();
    let (ok, _, err) = fusebox(&["show", &bad], &[]);
    assert!(!ok && err.contains(&bad), "{err}");
    let _ = std::fs::remove_file(&bad);
}
