//! The groups FuseOps makes on real models, lowered to the kernel IR and evaluated on the CPU
//! against the CPU reference: the nine light ONNX models of the `onnx` package (from
//! `ONNX_DATA_DIR`, set by `scripts/test.sh`; skipped with a printed reason without it) and a
//! transformer block (matmul, bias, gelu, residual add, layer_norm, softmax).
//!
//! Each fused function gets seeded random arguments; its kernels are evaluated on at most
//! 4,096 elements each (whole rows for row kernels; first and last always) and compared with
//! the CPU reference's result for the same function, per dtype, relative to the output's range.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

mod check;

use check::{check_function, random_args};
use fusebox_core::frontend::onnx::import_onnx;
use fusebox_core::ir::Module;
use fusebox_core::transform::fuse_ops;
use std::path::PathBuf;

/// Checks every fused function of `fused`; returns (functions, kernels, elements compared).
fn check_module(label: &str, fused: &Module) -> (usize, usize, usize) {
    let (mut funcs, mut kernels, mut elems) = (0, 0, 0);
    let mut failures = Vec::new();
    for (name, _) in &fused.functions {
        if name.as_str() == "main" {
            continue;
        }
        let args = random_args(fused, name, 11);
        match check_function(fused, name, &args, Some(4096)) {
            Ok((k, e)) => {
                funcs += 1;
                kernels += k;
                elems += e;
            }
            Err(e) => failures.push(format!("{label}/{name}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    (funcs, kernels, elems)
}

#[test]
fn transformer_block_groups_match_the_reference() {
    let src = include_str!("data/transformer_block.relax");
    let m = fusebox_core::text::parse_module_str(src).unwrap();
    let fused = fuse_ops(&m, 2, 256).unwrap();
    let (f, k, e) = check_module("transformer_block", &fused);
    println!("transformer block: {f} fused functions, {k} kernels, {e} elements match");
    assert!(
        f >= 6,
        "expected the block to fuse into several groups, found {f}"
    );
}

#[test]
fn light_model_groups_match_the_reference() {
    let Some(root) = std::env::var_os("ONNX_DATA_DIR").map(PathBuf::from) else {
        println!("skipped: ONNX_DATA_DIR is not set (scripts/test.sh sets it)");
        return;
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("light"))
        .expect("light folder")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    files.sort();
    let (mut tf, mut tk) = (0, 0);
    for p in &files {
        let stem = p
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let bytes = std::fs::read(p).expect("read");
        let m = import_onnx(&bytes, &stem).unwrap_or_else(|e| panic!("{stem}: {e}"));
        let fused = fuse_ops(&m, 2, 256).unwrap_or_else(|e| panic!("{stem}: {e}"));
        let t = std::time::Instant::now();
        let (f, k, e) = check_module(&stem, &fused);
        println!(
            "cuda kernels {stem}: {f} fused functions, {k} kernels, {e} elements match the CPU reference ({:.1} s)",
            t.elapsed().as_secs_f64()
        );
        tf += f;
        tk += k;
    }
    println!(
        "cuda kernels: {} models, {tf} fused functions, {tk} kernels checked",
        files.len()
    );
    assert_eq!(files.len(), 9, "expected the nine light models");
}
