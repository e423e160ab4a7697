//! Provenance (issue 18): `explain` follows a binding through FuseOps and FuseOpsByPattern by
//! its origin, not by a name those passes reuse, says which pattern won and why the others
//! lost; runtime errors name the model file and the user's binding or ONNX node.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

use std::process::Command;

fn fusebox(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "{err}");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        err,
    )
}

fn ended_in(config: &str, binding: &str) -> String {
    let (code, out, err) = fusebox(&[
        "explain",
        "examples/small_cnn.relax",
        "--config",
        config,
        "--binding",
        binding,
    ]);
    assert_eq!(code, Some(0), "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("ended in"))
        .unwrap_or_else(|| panic!("{out}"));
    line.to_string()
}

/// Before: `logits` "stays in main", `lv1` named `fused_conv2d_add_relu1` (FuseOps reuses the
/// names `lv`, `lv1`, … for the calls it puts in main).
#[test]
fn explain_names_the_function_that_holds_each_binding() {
    // Every binding of the small CNN's main (as parsed: nested calls become lv, lv1, …) and
    // the function `partition --config configs/cpu.toml` puts it in.
    let expected = [
        ("lv", "`fused_conv2d_add_relu` "),
        ("lv1", "`fused_conv2d_add_relu` "),
        ("stem", "`fused_conv2d_add_relu` "),
        ("lv2", "`fused_conv2d_add_relu1` "),
        ("h", "`fused_conv2d_add_relu1` "),
        ("h2", "`fused_conv2d_add_add_relu` "),
        ("res", "`fused_conv2d_add_add_relu` "),
        ("c3", "`fused_conv2d_add_relu2` "),
        ("logits", "`fused_matmul_add` "),
        ("pool", "no fused function: it stays in main"),
        ("prob", "no fused function: it stays in main"),
    ];
    for (binding, want) in expected {
        let line = ended_in("configs/cpu.toml", binding);
        assert!(line.contains(want), "{binding}: {line}");
    }
    // The same from the partitioned module itself: each of those functions exists and main
    // calls it.
    let (_, text, _) = fusebox(&[
        "partition",
        "examples/small_cnn.relax",
        "--config",
        "configs/cpu.toml",
    ]);
    for f in [
        "fused_conv2d_add_relu(",
        "fused_conv2d_add_relu1(",
        "fused_conv2d_add_add_relu(",
        "fused_conv2d_add_relu2(",
        "fused_matmul_add(",
    ] {
        assert!(
            text.contains(&format!("= cls.{f}")),
            "{f} not called: {text}"
        );
    }
}

/// Before: both `cublas.matmul_bias` and `cutlass.matmul_bias` were "matched here", with no
/// word on which won.
#[test]
fn explain_says_which_pattern_won_and_why_the_others_lost() {
    let (code, out, err) = fusebox(&[
        "explain",
        "examples/small_cnn.relax",
        "--config",
        "configs/cuda.toml",
        "--binding",
        "logits",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("  cublas.matmul_bias [cublas]: matched here; won: "),
        "{out}"
    );
    assert!(
        out.contains(
            "  cutlass.matmul_bias [cutlass]: matched here; lost to `cublas.matmul_bias`, which comes earlier in application order"
        ),
        "{out}"
    );
    assert!(
        out.contains("ended in `fused_relax_matmul_relax_add_cublas` (relax.matmul, relax.add)"),
        "{out}"
    );
    // The patterns that do not match are counted, not listed, in a table this long.
    assert!(out.contains("other pattern(s) do not match here"), "{out}");
}

/// Before: `error: runtime: main/lv: …`, neither the file nor the node.
#[test]
fn a_runtime_error_names_the_file_and_the_onnx_node() {
    let dir = std::env::temp_dir().join(format!("fusebox-provenance-{}", std::process::id()));
    let (code, _, err) = fusebox(&[
        "run",
        "tests/hardening/gather_oob.onnx",
        "--input",
        "idx=tests/hardening/gather_oob_idx.npy",
        "--output-dir",
        &dir.display().to_string(),
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.starts_with("error: tests/hardening/gather_oob.onnx: runtime: "),
        "{err}"
    );
    assert!(
        err.contains("(from onnx node `pick_row` (Gather))"),
        "{err}"
    );
    assert!(
        err.contains("relax.take: index 7 is out of range for extent 4"),
        "{err}"
    );
    assert!(!dir.join("y.npy").exists());
}

/// An ONNX binding's explanation names its node.
#[test]
fn explain_of_an_onnx_binding_names_its_node() {
    let (code, out, err) = fusebox(&[
        "explain",
        "tests/hardening/gather_oob.onnx",
        "--binding",
        "r",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("from onnx node `rectify` (Relu)"), "{out}");
    assert!(out.contains("ended in `fused_relu_take`"), "{out}");
}

/// A partition error names the model file too.
#[test]
fn a_partition_error_names_the_model_file() {
    let (code, _, err) = fusebox(&[
        "partition",
        "examples/small_cnn.relax",
        "--config",
        "configs/examples/strict.toml",
    ]);
    // strict, with only the example plugin: the ops it does not take are unclaimed.
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.starts_with("error: examples/small_cnn.relax: strict mode: no backend claimed "),
        "{err}"
    );
}
