//! The groups FuseOps makes on real models (lone ops lifted into their own functions, as for
//! `target = "cuda"`), lowered to the kernel IR and evaluated on the CPU
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
use fusebox_cuda::testing as common;

use check::{check_function, random_args};
use fusebox_core::frontend::onnx::import_onnx;
use fusebox_core::ir::Module;
use fusebox_core::transform::fuse_ops::fuse_ops_lifting;
use fusebox_cuda::nvrtc::{Arch, CompileJob, CompileOptions, compile_many};
use std::path::PathBuf;

/// Compiles every kernel of every fused function of `fused` to CUBIN for sm_90 with NVRTC;
/// returns how many (0 when NVRTC is absent and not required: the test prints why).
fn compile_module(label: &str, fused: &Module) -> usize {
    if !common::nvrtc_or_skip(label) {
        return 0;
    }
    let mut jobs = Vec::new();
    for (name, f) in &fused.functions {
        if name.as_str() == "main" {
            continue;
        }
        let low = fusebox_cuda::lower::lower(name, f).unwrap_or_else(|e| panic!("{label}: {e}"));
        for k in &low.kernels {
            jobs.push(CompileJob {
                name: format!("{}.cu", k.name),
                source: fusebox_cuda::emit::emit(k),
                arch: Arch::Sm90,
                options: CompileOptions::default(),
            });
        }
    }
    let cache = fusebox_cuda::Cache::from_env();
    let mut failures = Vec::new();
    for (j, r) in jobs.iter().zip(compile_many(&jobs, cache.as_ref())) {
        if let Err(e) = r {
            failures.push(format!("{label}/{}: {e}", j.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    jobs.len()
}

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
    let fused = fuse_ops_lifting(&m, 2, 256, true).unwrap();
    let (f, k, e) = check_module("transformer_block", &fused);
    let compiled = compile_module("transformer_block", &fused);
    println!(
        "transformer block: {f} fused functions, {k} kernels, {e} elements match; {compiled} kernels compile with NVRTC (sm_90)"
    );
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
    let (mut tf, mut tk, mut tc) = (0, 0, 0);
    for p in &files {
        let stem = p
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let bytes = std::fs::read(p).expect("read");
        let m = import_onnx(&bytes, &stem).unwrap_or_else(|e| panic!("{stem}: {e}"));
        let fused = fuse_ops_lifting(&m, 2, 256, true).unwrap_or_else(|e| panic!("{stem}: {e}"));
        let t = std::time::Instant::now();
        let (f, k, e) = check_module(&stem, &fused);
        let c = compile_module(&stem, &fused);
        println!(
            "cuda kernels {stem}: {f} fused functions, {k} kernels, {e} elements match the CPU reference, {c} compile with NVRTC ({:.1} s)",
            t.elapsed().as_secs_f64()
        );
        tf += f;
        tk += k;
        tc += c;
    }
    println!(
        "cuda kernels: {} models, {tf} fused functions, {tk} kernels checked against the CPU reference, {tc} compiled to sm_90 CUBIN",
        files.len()
    );
    assert_eq!(files.len(), 9, "expected the nine light models");
}
