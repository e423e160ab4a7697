//! Benchmarks of the generated kernels (needs a GPU; prints why and exits 0 without one):
//!
//! 1. float16 GEMM 4096³: cutlass (mma.sync, and on a compute capability 9.0 device the sm_90a
//!    wgmma + TMA path, `arch = "sm_90a"`) vs cuBLAS (fusebox-cublas), TFLOP/s and % of cuBLAS;
//! 2. conv2d + bias + relu on ResNet-50's 3×3 shapes (NHWC, batch 8), TFLOP/s;
//! 3. GEMM + bias + gelu with K ≤ 512: cutlass's fused epilogue vs cuBLAS GEMM(+bias) and a
//!    separate generated gelu kernel (fusebox-cuda), time per call.
//!
//! Each side is a full fusebox pipeline; inputs are uploaded once and the GPU time of
//! `iters` calls of `main` is measured between events on the runtime's stream.
//!
//! ```text
//! cargo run --release -p fusebox-cutlass --example bench_cutlass
//! ```

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a benchmark binary"
)]

use fusebox_core::backend::pipeline::{BackendPipeline, Plan};
use fusebox_core::config::Config;
use fusebox_core::ir::DType;
use fusebox_core::runtime::{Placement, Storage, Tensor, Value, host_args};
use fusebox_cuda::{Gpu, GpuTensor};
use std::sync::Arc;

fn pipeline(backends: &[&str], options: &str, fuse_ops: bool) -> BackendPipeline {
    fusebox_cpu::link();
    fusebox_cuda::link();
    fusebox_cublas::link();
    fusebox_cutlass::link();
    let mut src = format!(
        "target = \"cuda\"\n[partition]\nbind_constants = false\nannotate_codegen = true\nfuse_ops = {fuse_ops}\n"
    );
    for b in backends {
        src.push_str(&format!("[[backend]]\nname = \"{b}\"\n"));
        if *b == "cutlass" && !options.is_empty() {
            src.push_str(&format!("[backend.options]\n{options}\n"));
        }
    }
    BackendPipeline::new(Config::parse(&src, "bench.toml").unwrap(), None).unwrap()
}

fn input(gpu: &Arc<Gpu>, shape: &[usize], seed: u64) -> Value {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|i| (((i as u64 * 2654435761 + seed) % 1000) as f64 / 1000.0 - 0.5) * 0.2)
        .collect();
    let t = Tensor::new(shape.to_vec(), Storage::from_f64(DType::F16, v)).unwrap();
    GpuTensor::upload(gpu, &t).unwrap().into_value()
}

fn call(plan: &Plan, args: Vec<Value>) -> Value {
    let hook = |name: &str, vals: &[Value]| {
        plan.artifacts.get(name).map(|a| match a.placement() {
            Placement::Device => a.run(vals),
            Placement::Host => a.run(&host_args(vals)?),
        })
    };
    fusebox_cpu::run_with(&plan.module, "main", args, Some(&hook)).unwrap()
}

/// Milliseconds per call of `main` (after 3 warm-up calls).
fn time(gpu: &Arc<Gpu>, plan: &Plan, args: &[Value], iters: usize) -> f64 {
    for _ in 0..3 {
        call(plan, args.to_vec());
    }
    gpu.synchronize().unwrap();
    let ((), ms) = gpu
        .time(|| {
            for _ in 0..iters {
                call(plan, args.to_vec());
            }
            Ok(())
        })
        .unwrap();
    f64::from(ms) / iters as f64
}

fn backends_of(plan: &Plan) -> String {
    let mut v: Vec<String> = plan
        .claims
        .iter()
        .map(|c| c.backend.as_deref().unwrap_or("?").to_string())
        .collect();
    v.dedup();
    v.join("+")
}

fn main() {
    let gpu = match Gpu::get() {
        Ok(g) => g,
        Err(e) => {
            println!("skipped: {e}");
            return;
        }
    };
    println!("device: {}", gpu.describe());

    // 1. f16 GEMM 4096^3.
    let n = 4096;
    let src = format!(
        "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: R.Tensor(({n}, {n}), dtype=\"float16\"), w: R.Tensor(({n}, {n}), dtype=\"float16\")):\n        with R.dataflow():\n            y = R.matmul(x, w)\n            R.output(y)\n        return y\n"
    );
    let m = fusebox_core::text::parse_module_str(&src).unwrap();
    let args = vec![input(&gpu, &[n, n], 1), input(&gpu, &[n, n], 2)];
    let flops = 2.0 * (n as f64).powi(3);
    let mut runs = vec![
        ("cublas", vec!["cublas", "cpu"], ""),
        ("cutlass (heuristic)", vec!["cutlass", "cpu"], ""),
        (
            "cutlass (profile)",
            vec!["cutlass", "cpu"],
            "profile = true",
        ),
    ];
    if gpu.compute_capability() == (9, 0) {
        runs.push((
            "cutlass wgmma sm_90a",
            vec!["cutlass", "cpu"],
            "arch = \"sm_90a\"",
        ));
    } else {
        println!(
            "wgmma skipped: compute capability {:?} (sm_90a CUBIN runs only on 9.0)",
            gpu.compute_capability()
        );
    }
    let mut cublas_ms = None;
    for (label, b, opts) in runs {
        let plan = pipeline(&b, opts, false).run(&m).unwrap();
        let ms = time(&gpu, &plan, &args, 20);
        let rel = cublas_ms.map_or(String::new(), |c: f64| {
            format!(", {:.0}% of cuBLAS", 100.0 * c / ms)
        });
        if label == "cublas" {
            cublas_ms = Some(ms);
        }
        println!(
            "gemm f16 {n}^3 {label:22} [{}]: {ms:.3} ms, {:.1} TFLOP/s{rel}",
            backends_of(&plan),
            flops / ms / 1e9
        );
    }

    // 2. conv2d + bias + relu, ResNet-50 3x3 shapes.
    for (hw, c) in [(56, 64), (28, 128), (14, 256), (7, 512)] {
        let nb = 8;
        let src = format!(
            "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: R.Tensor(({nb}, {hw}, {hw}, {c}), dtype=\"float16\"), w: R.Tensor(({c}, 3, 3, {c}), dtype=\"float16\"), b: R.Tensor((1, 1, 1, {c}), dtype=\"float16\")):\n        with R.dataflow():\n            lv = R.nn.conv2d(x, w, padding=[1, 1, 1, 1], data_layout=\"NHWC\", kernel_layout=\"OHWI\")\n            lv1 = R.add(lv, b)\n            y = R.nn.relu(lv1)\n            R.output(y)\n        return y\n"
        );
        let m = fusebox_core::text::parse_module_str(&src).unwrap();
        let args = vec![
            input(&gpu, &[nb, hw, hw, c], 3),
            input(&gpu, &[c, 3, 3, c], 4),
            input(&gpu, &[1, 1, 1, c], 5),
        ];
        let flops = 2.0 * (nb * hw * hw * c * 9 * c) as f64;
        for (label, opts) in [("heuristic", ""), ("profile", "profile = true")] {
            let plan = pipeline(&["cutlass", "cuda", "cpu"], opts, true)
                .run(&m)
                .unwrap();
            let ms = time(&gpu, &plan, &args, 20);
            println!(
                "conv2d+bias+relu {nb}x{hw}x{hw}x{c} 3x3 {label:9} [{}]: {ms:.3} ms, {:.1} TFLOP/s",
                backends_of(&plan),
                flops / ms / 1e9
            );
        }
    }

    // 3. GEMM + bias + gelu, K <= 512: fused vs cuBLAS + a separate kernel.
    for (mm, nn, k) in [(4096, 4096, 256), (8192, 3072, 512), (2048, 8192, 128)] {
        let body = |act: &str| {
            format!(
                "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: R.Tensor(({mm}, {k}), dtype=\"float16\"), w: R.Tensor(({k}, {nn}), dtype=\"float16\"), b: R.Tensor(({nn},), dtype=\"float16\")):\n        with R.dataflow():\n            lv = R.matmul(x, w)\n            lv1 = R.add(lv, b)\n            y = R.nn.{act}(lv1)\n            R.output(y)\n        return y\n"
            )
        };
        let args = vec![
            input(&gpu, &[mm, k], 6),
            input(&gpu, &[k, nn], 7),
            input(&gpu, &[nn], 8),
        ];
        let fused = fusebox_core::text::parse_module_str(&body("gelu")).unwrap();
        let plan = pipeline(&["cutlass", "cuda", "cpu"], "", true)
            .run(&fused)
            .unwrap();
        let a = time(&gpu, &plan, &args, 20);
        // cuBLAS has no erf-GELU epilogue entry for gelu_tanh in the table: it takes
        // matmul + bias, and the lone gelu_tanh is a generated fusebox-cuda kernel.
        let split = fusebox_core::text::parse_module_str(&body("gelu_tanh")).unwrap();
        let plan2 = pipeline(&["cublas", "cuda", "cpu"], "", true)
            .run(&split)
            .unwrap();
        let b = time(&gpu, &plan2, &args, 20);
        println!(
            "gemm+bias+gelu {mm}x{nn}x{k}: cutlass fused [{}] {a:.3} ms; cublas + separate gelu [{}] {b:.3} ms; speed-up {:.2}x",
            backends_of(&plan),
            backends_of(&plan2),
            b / a
        );
        if gpu.compute_capability() == (9, 0) {
            let plan3 = pipeline(&["cutlass", "cuda", "cpu"], "arch = \"sm_90a\"", true)
                .run(&fused)
                .unwrap();
            let c = time(&gpu, &plan3, &args, 20);
            println!(
                "gemm+bias+gelu {mm}x{nn}x{k}: cutlass fused, arch sm_90a [{}] {c:.3} ms; speed-up over cublas + separate gelu {:.2}x",
                backends_of(&plan3),
                b / c
            );
        }
    }
}
