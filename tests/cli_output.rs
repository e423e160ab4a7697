//! The CLI's output under hostile conditions (issue 18): a closed or full stdout, an output
//! directory that is a file, a symlink planted where a temporary file used to go. Each case
//! panicked, wrote through the link, or left a mix of files before.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

use std::path::PathBuf;
use std::process::{Command, Stdio};

fn fusebox() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fusebox"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

fn fresh(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fusebox-cli-output-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_closed_stdout_is_a_quiet_exit() {
    // `fusebox show X | head -0`: the reader is gone before the first write.
    let mut child = fusebox()
        .args(["show", "examples/small_cnn.relax"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.is_empty(), "{err}");
}

#[cfg(target_os = "linux")]
#[test]
fn a_full_stdout_is_an_error_after_every_output_file_is_complete() {
    let dir = fresh("full");
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = fusebox()
        .args(["run", "examples/small_cnn.relax", "--check", "--output-dir"])
        .arg(&dir)
        .stdout(full)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("error: writing to standard output: No space left on device"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files, ["logits.npy", "prob.npy"], "{files:?}");
    for f in files {
        let t = fusebox::read_npy(&dir.join(&f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert_eq!(t.shape(), [1, 10], "{f}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_output_dir_that_is_a_file_is_named() {
    let dir = fresh("file");
    let file = dir.join("plain-file");
    std::fs::write(&file, b"keep me").unwrap();
    let out = fusebox()
        .args(["run", "examples/small_cnn.relax", "--output-dir"])
        .arg(&file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "output directory {}: exists and is not a directory",
            file.display()
        )),
        "{err}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(unix)]
#[test]
fn planted_symlinks_are_not_written_through() {
    let dir = fresh("symlink");
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, b"precious").unwrap();
    let out_dir = dir.join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    // The old fixed temporary name, and the output itself.
    std::os::unix::fs::symlink(&victim, out_dir.join("logits.npy.tmp")).unwrap();
    std::os::unix::fs::symlink(&victim, out_dir.join("logits.npy")).unwrap();
    let out = fusebox()
        .args(["run", "examples/small_cnn.relax", "--output-dir"])
        .arg(&out_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    let meta = std::fs::symlink_metadata(out_dir.join("logits.npy")).unwrap();
    assert!(meta.is_file(), "logits.npy was written through the link");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_empty_output_prints_no_infinite_min_max() {
    let dir = fresh("empty");
    let src = dir.join("empty.relax");
    std::fs::write(
        &src,
        "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: R.Tensor((0, 4), dtype=\"float32\")) -> R.Tensor((0, 4), dtype=\"float32\"):\n        with R.dataflow():\n            gv = R.nn.relu(x)\n            R.output(gv)\n        return gv\n",
    )
    .unwrap();
    let out = fusebox()
        .arg("run")
        .arg(&src)
        .arg("--output-dir")
        .arg(dir.join("out"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("gv: shape [0, 4] float32 (empty) -> "),
        "{stdout}"
    );
    assert!(!stdout.contains("inf"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_huge_value_in_an_error_is_not_echoed_whole() {
    let dir = fresh("huge");
    let src = dir.join("huge.relax");
    let dtype = "f".repeat(5_000_000);
    std::fs::write(
        &src,
        format!("@I.ir_module\nclass Module:\n    @R.function\n    def main(x: R.Tensor((4,), dtype=\"{dtype}\")):\n        return x\n"),
    )
    .unwrap();
    let out = fusebox().arg("show").arg(&src).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(err.len() < 1000, "{} bytes of error", err.len());
    assert!(err.contains("unknown dtype \"ffff"), "{err}");
    assert!(err.contains("(5000000 characters)"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fuse_opt_level_takes_the_values_the_config_takes() {
    let out = fusebox()
        .args([
            "partition",
            "examples/small_cnn.relax",
            "--fuse-ops",
            "--fuse-opt-level",
            "99",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("99 is not in 0..=2"), "{err}");
    let ok = fusebox()
        .args([
            "partition",
            "examples/small_cnn.relax",
            "--fuse-ops",
            "--fuse-opt-level",
            "1",
        ])
        .output()
        .unwrap();
    assert!(ok.status.success());
}

/// `show -o FILE` writes the module and its constants (side file) so that it reads back: the
/// saved module prints to the same text and runs to the same outputs as the ONNX model.
#[test]
fn show_o_saves_a_module_that_reads_back_and_runs_the_same() {
    let dir = fresh("show-o");
    let model = "tests/models/bert-dynamo/model.onnx";
    let saved = dir.join("bert.relax");
    let again = dir.join("again.relax");
    for (input, output) in [
        (std::path::Path::new(model), &saved),
        (saved.as_path(), &again),
    ] {
        let out = fusebox()
            .arg("show")
            .arg(input)
            .arg("-o")
            .arg(output)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stdout.is_empty());
    }
    assert_eq!(
        std::fs::read(&saved).unwrap(),
        std::fs::read(&again).unwrap()
    );
    let side = std::fs::read(dir.join("bert.safetensors")).unwrap();
    assert!(side.len() > 10_000, "the weights are in the side file");
    assert_eq!(side, std::fs::read(dir.join("again.safetensors")).unwrap());
    let run = |m: &std::path::Path, out: &str| {
        let o = fusebox()
            .arg("run")
            .arg(m)
            .arg("--output-dir")
            .arg(dir.join(out))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let mut files: Vec<_> = std::fs::read_dir(dir.join(out))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        files
            .iter()
            .map(|f| std::fs::read(f).unwrap())
            .collect::<Vec<_>>()
    };
    let a = run(std::path::Path::new(model), "onnx");
    let b = run(&saved, "saved");
    assert!(!a.is_empty());
    assert_eq!(a, b);
    // --emit json -o: the report to a file, nothing on stdout.
    let report = dir.join("report.json");
    let out = fusebox()
        .args([
            "partition",
            "examples/small_cnn.relax",
            "--fuse-ops",
            "--emit",
            "json",
            "-o",
        ])
        .arg(&report)
        .output()
        .unwrap();
    assert!(out.status.success() && out.stdout.is_empty());
    let text = std::fs::read_to_string(&report).unwrap();
    assert!(
        text.starts_with('{') && text.contains("fused_conv2d_add_relu"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
