//! The CLI on a module with `if`/`else`: `run` takes the branch its `T.bool` condition selects
//! (given with `--input` or random) and `--check` agrees with the unpartitioned module;
//! `partition --emit json` reports the `if` in main; `explain` finds a binding inside a branch.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

use std::path::PathBuf;
use std::process::Command;

const SRC: &str = r#"@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((4, 8), dtype="float32"), w: R.Tensor((8, 8), dtype="float32"), flag: R.Prim("bool")) -> R.Tensor((4, 8), dtype="float32"):
        if flag:
            with R.dataflow():
                m = R.matmul(x, w)
                r = R.nn.relu(m)
                R.output(r)
            y = r
        else:
            with R.dataflow():
                n = R.negative(x)
                R.output(n)
            y = n
        return y
"#;

fn fusebox() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fusebox"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

fn setup(name: &str) -> (PathBuf, PathBuf) {
    let d = std::env::temp_dir().join(format!("fusebox-cf-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let m = d.join("branch.relax");
    std::fs::write(&m, SRC).unwrap();
    (d, m)
}

/// A 0-d .npy of one bool.
fn npy_bool(path: &std::path::Path, v: bool) {
    let header = "{'descr': '|b1', 'fortran_order': False, 'shape': (), }";
    let mut h = header.to_string();
    // Magic (6) + version (2) + len (2) + header + '\n' padded to a multiple of 64.
    while !(10 + h.len() + 1).is_multiple_of(64) {
        h.push(' ');
    }
    h.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(h.len() as u16).to_le_bytes());
    bytes.extend_from_slice(h.as_bytes());
    bytes.push(u8::from(v));
    std::fs::write(path, bytes).unwrap();
}

fn read_f32_npy(path: &std::path::Path) -> Vec<f32> {
    let b = std::fs::read(path).unwrap();
    let hl = u16::from_le_bytes([b[8], b[9]]) as usize;
    b[10 + hl..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn run_takes_the_branch_the_condition_selects() {
    let (d, m) = setup("run");
    let mut outs = Vec::new();
    for v in [true, false] {
        let flag = d.join(format!("flag_{v}.npy"));
        npy_bool(&flag, v);
        let out_dir = d.join(format!("out_{v}"));
        let out = fusebox()
            .arg("run")
            .arg(&m)
            .arg("--check")
            .arg("--input")
            .arg(format!("flag={}", flag.display()))
            .arg("--output-dir")
            .arg(&out_dir)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{err}");
        assert!(
            stdout.contains("match the unpartitioned module"),
            "{stdout}"
        );
        outs.push(read_f32_npy(&out_dir.join("y.npy")));
    }
    // The then branch is a relu (nothing negative); the else branch negates the random x
    // (uniform in [-1, 1], so some values are negative).
    assert!(outs[0].iter().all(|&v| v >= 0.0), "{:?}", outs[0]);
    assert!(outs[1].iter().any(|&v| v < 0.0), "{:?}", outs[1]);
}

#[test]
fn partition_reports_and_explain_finds_branch_bindings() {
    let (d, m) = setup("explain");
    let pats = d.join("pats.toml");
    std::fs::write(
        &pats,
        "[[pattern]]\nname = \"cpu.mm_relu\"\npattern = \"relax.nn.relu(relax.matmul(_, _))\"\n",
    )
    .unwrap();
    let out = fusebox()
        .args(["partition", "--emit", "json", "--patterns"])
        .arg(&pats)
        .arg(&m)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("\"composite:cpu.mm_relu\""), "{stdout}");
    assert!(stdout.contains("\"if\""), "{stdout}");
    let out = fusebox()
        .args(["explain", "--binding", "r"])
        .arg(&m)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("binding `r` of main: relax.nn.relu"),
        "{stdout}"
    );
    let out = fusebox()
        .args(["explain", "--binding", "nope"])
        .arg(&m)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("expected one of: m, r, n, y"), "{err}");
}
