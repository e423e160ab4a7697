//! On a GPU: every kernel the `cuda` backend makes for the transformer block and the light
//! ResNet-50 (when `ONNX_DATA_DIR` is set) runs on the device and matches the CPU reference.
//! Without a device it prints why it skipped (`FUSEBOX_REQUIRE_GPU=1` makes that a failure).

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

mod check;
use fusebox_cuda::testing as common;

use check::{random_args, tolerance};
use fusebox_core::backend::{Backend, Candidate};
use fusebox_core::ir::Module;
use fusebox_core::runtime::Value;
use fusebox_core::transform::fuse_ops::fuse_ops_lifting;

fn flatten(v: Value, out: &mut Vec<fusebox_core::runtime::Tensor>) {
    match v {
        Value::Tuple(vs) => vs.into_iter().for_each(|x| flatten(x, out)),
        other => out.push(
            other
                .to_host()
                .expect("download")
                .as_tensor("out")
                .unwrap()
                .clone(),
        ),
    }
}

fn run_module(label: &str, fused: &Module) -> usize {
    let backend = fusebox_cuda::CudaBackend::default();
    let mut n = 0;
    for (name, f) in &fused.functions {
        if name.as_str() == "main" {
            continue;
        }
        let c = Candidate {
            name,
            func: f,
            module: fused,
        };
        let art = backend
            .compile(&c)
            .unwrap_or_else(|e| panic!("{label}/{name}: {e}"));
        let args = random_args(fused, name, 5);
        let want = fusebox_cpu::run(fused, name, args.clone()).unwrap();
        let got = art
            .run(&args)
            .unwrap_or_else(|e| panic!("{label}/{name}: {e}"));
        let (mut w, mut g) = (Vec::new(), Vec::new());
        flatten(want, &mut w);
        flatten(got, &mut g);
        assert_eq!(w.len(), g.len());
        for (a, b) in w.iter().zip(&g) {
            let (av, bv) = (a.to_f64_vec(), b.to_f64_vec());
            let range = av
                .iter()
                .filter(|x| x.is_finite())
                .fold(1.0f64, |m, x| m.max(x.abs()));
            let tol = tolerance(a.dtype()).max(1e-4) * range;
            for (i, (x, y)) in av.iter().zip(&bv).enumerate() {
                assert!(
                    (x.is_nan() && y.is_nan()) || (x - y).abs() <= tol,
                    "{label}/{name}[{i}]: gpu {y}, cpu {x}"
                );
            }
        }
        n += 1;
    }
    n
}

#[test]
fn transformer_block_kernels_match_the_cpu_reference_on_the_gpu() {
    if common::gpu_or_skip("transformer block kernels").is_none() {
        return;
    }
    let m =
        fusebox_core::text::parse_module_str(include_str!("data/transformer_block.relax")).unwrap();
    let fused = fuse_ops_lifting(&m, 2, 256, true).unwrap();
    let n = run_module("transformer_block", &fused);
    println!("transformer block: {n} functions match on the GPU");
}

/// The row kernels that read and write 16 bytes at a time (see `ops_nn.rs`): a block per row
/// (f16 softmax over 4,096 and 8,192 columns), a warp per row (f16 LayerNorm over 768, f32
/// softmax over 1,024, f16 softmax over 1,000 with lanes past the row), and a scalar one
/// (1,001 columns).
#[test]
fn vectorised_row_kernels_match_the_cpu_reference_on_the_gpu() {
    if common::gpu_or_skip("vectorised row kernels").is_none() {
        return;
    }
    let t = |s: &str, d: &str| format!("R.Tensor(({s}), dtype=\"{d}\")");
    let src = format!(
        "@I.ir_module\nclass Module:\n    @R.function\n    def main(a: {}, b: {}, c: {}, d: {}, e: {}, g: {}, h: {}, f: {}):\n        with R.dataflow():\n            ya = R.nn.softmax(a, axis=-1)\n            yb = R.nn.softmax(b, axis=-1)\n            yc = R.nn.softmax(c, axis=-1)\n            yd = R.nn.softmax(d, axis=-1)\n            ye = R.nn.layer_norm(e, g, h, axes=[-1])\n            yf = R.nn.softmax(f, axis=-1)\n            R.output(ya, yb, yc, yd, ye, yf)\n        return (ya, yb, yc, yd, ye, yf)\n",
        t("64, 4096", "float16"),
        t("16, 8192", "float16"),
        t("128, 1000", "float16"),
        t("64, 1024", "float32"),
        t("256, 768", "float16"),
        t("768,", "float16"),
        t("768,", "float16"),
        t("32, 1001", "float16"),
    );
    let m = fusebox_core::text::parse_module_str(&src).unwrap();
    let fused = fuse_ops_lifting(&m, 2, 256, true).unwrap();
    let n = run_module("row_kernels", &fused);
    assert_eq!(n, 6, "one function per row op");
    println!("vectorised row kernels: {n} functions match on the GPU");
}

#[test]
fn resnet50_kernels_match_the_cpu_reference_on_the_gpu() {
    if common::gpu_or_skip("resnet50 kernels").is_none() {
        return;
    }
    let Some(root) = std::env::var_os("ONNX_DATA_DIR").map(std::path::PathBuf::from) else {
        println!("skipped: ONNX_DATA_DIR is not set");
        return;
    };
    let bytes = std::fs::read(root.join("light/light_resnet50.onnx")).unwrap();
    let m = fusebox_core::frontend::onnx::import_onnx(&bytes, "resnet50").unwrap();
    let fused = fuse_ops_lifting(&m, 2, 256, true).unwrap();
    let n = run_module("resnet50", &fused);
    println!("light ResNet-50: {n} functions match on the GPU");
}
