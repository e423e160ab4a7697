//! ONNX conformance: the backend test data shipped in the `onnx` PyPI package, run through
//! `import_onnx` and the CPU reference executor.
//!
//! - `pytorch-converted/` and `pytorch-operator/`: every case whose ops the importer supports is
//!   attempted (model.onnx, `test_data_set_0/input_*.pb` → `output_*.pb`, compared with rtol
//!   1e-3, atol 1e-4); the pass count and each failure with its reason are printed, and at
//!   least 90% of the attempted cases must pass.
//! - `light/light_*.onnx` (small-weight model zoo): import, FuseOps (opt level 2), run on a
//!   random input, and compare with the unpartitioned module (as `fusebox run --check`).
//!
//! The data folder comes from `ONNX_DATA_DIR` (`scripts/test.sh` sets it to
//! `onnx/backend/test/data` inside its `.venv`); without it the tests print why they are skipped
//! and pass, unless `FUSEBOX_REQUIRE_ONNX_DATA=1` (also set by `scripts/test.sh`) makes that a
//! failure. A light model that does not import fails the test.
//!
//! ```text
//! ONNX_DATA_DIR=.venv/lib/python3.11/site-packages/onnx/backend/test/data cargo test --test onnx_conformance -- --nocapture
//! ```

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

mod onnx_case;

use fusebox_core::frontend::onnx::import_onnx;
use fusebox_core::ir::generate::Rng;
use fusebox_core::ir::{DType, Module};
use fusebox_core::transform::fuse_ops;
use fusebox_cpu::{Storage, Tensor, Value, run};
use onnx_case::{Bind, Case, compare, flatten, run_case};
use std::path::PathBuf;

fn data_dir() -> Option<PathBuf> {
    onnx_case::data_dir_or_skip(
        "ONNX_DATA_DIR",
        "scripts/test.sh sets it to the onnx package's backend test data",
    )
}

#[test]
fn a_missing_data_dir_skips_or_fails_as_the_environment_says() {
    for test in ["pytorch_backend_cases", "light_model_zoo_fuses_and_runs"] {
        let (ok, text) = onnx_case::rerun_without("ONNX_DATA_DIR", test, false);
        assert!(
            ok && text.contains("skipped: ONNX_DATA_DIR is not set"),
            "{text}"
        );
        let (ok, text) = onnx_case::rerun_without("ONNX_DATA_DIR", test, true);
        assert!(
            !ok && text.contains("FUSEBOX_REQUIRE_ONNX_DATA=1 but ONNX_DATA_DIR is not set"),
            "{text}"
        );
    }
}

#[test]
fn pytorch_backend_cases() {
    let Some(root) = data_dir() else {
        return;
    };
    let (mut attempted, mut passed, mut skipped) = (0, 0, 0);
    let mut failures = Vec::new();
    for sub in ["pytorch-converted", "pytorch-operator"] {
        let Ok(rd) = std::fs::read_dir(root.join(sub)) else {
            panic!("{}: not a folder", root.join(sub).display());
        };
        let mut dirs: Vec<PathBuf> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        dirs.sort();
        for d in dirs {
            let name = format!(
                "{sub}/{}",
                d.file_name().unwrap_or_default().to_string_lossy()
            );
            match run_case(&d, 1e-3, 1e-4, Bind::Nothing) {
                Case::Skipped(why) => {
                    skipped += 1;
                    println!("skip {name}: {why}");
                }
                Case::Pass => {
                    attempted += 1;
                    passed += 1;
                }
                Case::Fail(why) => {
                    attempted += 1;
                    failures.push(format!("{name}: {why}"));
                }
            }
        }
    }
    println!(
        "onnx conformance: {passed}/{attempted} attempted cases pass ({skipped} skipped: unsupported ops)"
    );
    for f in &failures {
        println!("FAIL {f}");
    }
    assert!(attempted > 0, "no case was attempted");
    assert!(
        passed * 10 >= attempted * 9,
        "only {passed}/{attempted} attempted cases pass (need 90%)"
    );
}

fn random_args(m: &Module, seed: u64) -> Vec<Value> {
    let f = m.get("main").expect("main");
    let mut rng = Rng::new(seed);
    f.params
        .iter()
        .map(|&p| {
            let tt = f.var(p).ty.as_tensor().expect("tensor param");
            let shape: Vec<usize> = tt
                .static_shape()
                .expect("static shape")
                .iter()
                .map(|&d| d as usize)
                .collect();
            let n: usize = shape.iter().product();
            let data: Vec<f32> = (0..n)
                .map(|_| (rng.next_u64() % 2001) as f32 / 1000.0 - 1.0)
                .collect();
            let dtype = tt.dtype.unwrap_or(DType::F32);
            Value::Tensor(Tensor::new(shape, Storage::from_f32(dtype, data)).expect("tensor"))
        })
        .collect()
}

#[test]
fn light_model_zoo_fuses_and_runs() {
    let Some(root) = data_dir() else {
        return;
    };
    // The full zoo takes minutes in a debug build: by default the smaller models run, set
    // FUSEBOX_LIGHT_ALL=1 for all of them.
    let all = std::env::var_os("FUSEBOX_LIGHT_ALL").is_some();
    let quick = ["light_squeezenet", "light_shufflenet", "light_bvlc_alexnet"];
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("light"))
        .expect("light folder")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    files.sort();
    let mut ran = 0;
    for p in files {
        let stem = p
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let bytes = std::fs::read(&p).expect("read");
        // Every light model imports (they did when this test was written): a regression fails.
        let m = import_onnx(&bytes, &stem)
            .unwrap_or_else(|e| panic!("light {stem}: does not import: {e}"));
        let fused = fuse_ops(&m, 2, 256).unwrap_or_else(|e| panic!("{stem}: fuse_ops: {e}"));
        let groups = fused.functions.len() - 1;
        if !all && !quick.contains(&stem.as_str()) {
            println!("light {stem}: imports and fuses ({groups} fused functions); run skipped");
            continue;
        }
        let args = random_args(&m, 7);
        let t = std::time::Instant::now();
        let want = run(&m, "main", args.clone()).unwrap_or_else(|e| panic!("{stem}: {e}"));
        let got = run(&fused, "main", args).unwrap_or_else(|e| panic!("{stem}: fused: {e}"));
        let (mut w, mut g) = (Vec::new(), Vec::new());
        flatten(want, &mut w);
        flatten(got, &mut g);
        assert_eq!(w.len(), g.len());
        for (a, b) in g.iter().zip(&w) {
            if let Some(why) = compare(a, b, 1e-4, 1e-6) {
                panic!("{stem}: fused differs from unfused: {why}");
            }
        }
        ran += 1;
        println!(
            "light {stem}: imports, fuses ({groups} fused functions), runs and matches ({:.1} s)",
            t.elapsed().as_secs_f64()
        );
    }
    assert!(ran > 0, "no light model ran");
}
