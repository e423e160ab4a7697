//! Benchmark of the fused attention kernel (needs a GPU; prints why and exits 0 without one):
//! float16 `attention(q, k, v)` in BSNH, batch 4, 16 heads, head_dim 64 and 128, sequence
//! lengths 1024 to 4096, against the unfused path in the same run: the same problem as a full
//! fusebox pipeline of `R.matmul(q, kᵀ)` (cuBLAS, batched over batch × heads), `R.nn.softmax`
//! (fusebox-cuda's generated kernel) and `R.matmul(p, v)` (cuBLAS), with q pre-scaled so both
//! sides compute the same thing; the unfused side writes and reads the full score matrix.
//! Reported: ms per call (GPU time between events over `iters` calls), TFLOP/s of the two
//! products (4·b·h·s²·d), the speed-up; and the causal fused kernel's time.
//!
//! ```text
//! cargo run --release -p fusebox-cutlass --example bench_attention
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
use fusebox_cutlass::attention::{AttentionOptions, CausalMask, FlashAttention};
use std::sync::Arc;

fn pipeline() -> BackendPipeline {
    fusebox_cpu::link();
    fusebox_cuda::link();
    fusebox_cublas::link();
    let src = "target = \"cuda\"\n[partition]\nbind_constants = false\nannotate_codegen = true\nfuse_ops = true\n\
               [[backend]]\nname = \"cublas\"\n[[backend]]\nname = \"cuda\"\n[[backend]]\nname = \"cpu\"\n";
    BackendPipeline::new(Config::parse(src, "bench.toml").unwrap(), None).unwrap()
}

fn tensor(gpu: &Arc<Gpu>, shape: &[usize], seed: u64) -> GpuTensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|i| ((i as u64 * 2654435761 + seed) % 1000) as f64 / 1000.0 - 0.5)
        .collect();
    let t = Tensor::new(shape.to_vec(), Storage::from_f64(DType::F16, v)).unwrap();
    GpuTensor::upload(gpu, &t).unwrap()
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

/// Milliseconds per call of `f` (after 2 warm-up calls).
fn time(gpu: &Arc<Gpu>, iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..2 {
        f();
    }
    gpu.synchronize().unwrap();
    let ((), ms) = gpu
        .time(|| {
            for _ in 0..iters {
                f();
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
    let fa = FlashAttention::on(gpu.clone()).unwrap();
    let (b, h) = (4, 16);
    for d in [64, 128] {
        for s in [1024, 2048, 4096] {
            let q = tensor(&gpu, &[b, s, h, d], 1);
            let k = tensor(&gpu, &[b, s, h, d], 2);
            let v = tensor(&gpu, &[b, s, h, d], 3);
            let iters = if s >= 4096 { 5 } else { 10 };
            let flops = 4.0 * (b * h * s * s * d) as f64;
            let opts = AttentionOptions::default();
            let p = fa.plan(&q, &k, &v, None, &opts).unwrap();
            let out = GpuTensor::empty(&gpu, DType::F16, p.out_shape.clone()).unwrap();
            let fused = time(&gpu, iters, || {
                fa.run_into(&p, &q, &k, &v, None, &out).unwrap();
            });
            let copts = AttentionOptions {
                scale: None,
                causal: Some(CausalMask::TopLeft),
                ..Default::default()
            };
            let pc = fa.plan(&q, &k, &v, None, &copts).unwrap();
            let causal = time(&gpu, iters, || {
                fa.run_into(&pc, &q, &k, &v, None, &out).unwrap();
            });

            // The unfused path on (b*h, s, d) operands (same sizes, its own layout).
            let bh = b * h;
            let src = format!(
                "@I.ir_module\nclass Module:\n    @R.function\n    def main(q: R.Tensor(({bh}, {s}, {d}), dtype=\"float16\"), kt: R.Tensor(({bh}, {d}, {s}), dtype=\"float16\"), v: R.Tensor(({bh}, {s}, {d}), dtype=\"float16\")):\n        with R.dataflow():\n            sc = R.matmul(q, kt)\n            p = R.nn.softmax(sc, axis=-1)\n            y = R.matmul(p, v)\n            R.output(y)\n        return y\n"
            );
            let m = fusebox_core::text::parse_module_str(&src).unwrap();
            let plan = pipeline().run(&m).unwrap();
            let args: Vec<Value> = vec![
                tensor(&gpu, &[bh, s, d], 1).into_value(),
                tensor(&gpu, &[bh, d, s], 2).into_value(),
                tensor(&gpu, &[bh, s, d], 3).into_value(),
            ];
            let unfused = time(&gpu, iters, || {
                call(&plan, args.clone());
            });
            println!(
                "attention f16 b{b} h{h} s{s} d{d}: fused {fused:.3} ms ({:.1} TFLOP/s); unfused [{}] {unfused:.3} ms ({:.1} TFLOP/s); speed-up {:.2}x; fused causal {causal:.3} ms ({:.1} TFLOP/s of the unmasked half)",
                flops / fused / 1e9,
                backends_of(&plan),
                flops / unfused / 1e9,
                unfused / fused,
                flops / 2.0 / causal / 1e9,
            );
        }
    }
}
