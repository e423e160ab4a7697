//! Benchmarks of the generic CUDA codegen (issue 7), each a ratio against a baseline measured in
//! the same run:
//!
//! - NVRTC compile time per elementwise kernel (no cache; runs without a GPU too);
//! - on a GPU, against the device-to-device copy bandwidth (`cuMemcpyDtoD`, 1 GiB): a fused
//!   elementwise chain, softmax and layer_norm (rows of 1k–8k; for 4k and 8k also with 256,
//!   512 and 1,024 threads per row, the schedule's choice first), and residual-add +
//!   layer_norm fused against the add and the layer_norm as two kernels.
//!
//! `cargo run --release -p fusebox-cuda --example bench_kernels [-- --reps N]`
//! Times are medians of `reps` (default 20) event-timed runs after a warm-up.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    reason = "a benchmark binary: a failure is a panic with the reason"
)]

use fusebox_core::backend::{Artifact, Backend, Candidate};
use fusebox_core::runtime::{Storage, Tensor, Value};
use fusebox_cuda::nvrtc::{Arch, CompileOptions};
use fusebox_cuda::{CudaBackend, Gpu, GpuTensor};
use std::sync::Arc;
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn module(params: &str, body: &[&str]) -> fusebox_core::ir::Module {
    let mut s = format!(
        "@I.ir_module\nclass Module:\n    @R.function(private=True)\n    def f({params}):\n        R.func_attr({{\"Primitive\": True}})\n        with R.dataflow():\n"
    );
    for b in body {
        s.push_str(&format!("            {b}\n"));
    }
    let last = body
        .last()
        .and_then(|b| b.split('=').next())
        .unwrap()
        .trim();
    s.push_str(&format!(
        "            R.output({last})\n        return {last}\n"
    ));
    fusebox_core::text::parse_module_str(&s).unwrap()
}

fn compile_times() {
    let mut times = Vec::new();
    for i in 0..10 {
        let m = module(
            "x: R.Tensor((4096, 1024), dtype=\"float16\"), b: R.Tensor((1024,), dtype=\"float16\")",
            &[
                "a = R.add(x, b)",
                &format!("c = R.multiply(a, R.const({}.5, \"float16\"))", i),
                "gv = R.nn.relu(c)",
            ],
        );
        let low = fusebox_cuda::lower::lower("f", m.get("f").unwrap()).unwrap();
        let src = fusebox_cuda::emit::emit(&low.kernels[0]);
        let t = Instant::now();
        fusebox_cuda::compile_cached(None, &src, "f.cu", Arch::Sm90, &CompileOptions::default())
            .unwrap();
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    println!(
        "NVRTC compile, elementwise kernel (f16 add+multiply+relu, sm_90 CUBIN, no cache): median {:.1} ms over {} kernels (target <= 100 ms)",
        median(times.clone()),
        times.len()
    );
}

fn artifact(m: &fusebox_core::ir::Module) -> Box<dyn Artifact> {
    CudaBackend::default()
        .compile(&Candidate {
            name: "f",
            func: m.get("f").unwrap(),
            module: m,
        })
        .unwrap()
}

fn device_input(gpu: &Arc<Gpu>, shape: &[usize], dtype: fusebox_core::ir::DType) -> Value {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let t = Tensor::new(shape.to_vec(), Storage::from_f32(dtype, data)).unwrap();
    GpuTensor::upload(gpu, &t).unwrap().into_value()
}

/// Median ms of `reps` runs of `f` (after one warm-up).
fn time(gpu: &Arc<Gpu>, reps: usize, f: &dyn Fn()) -> f64 {
    f();
    let mut v = Vec::new();
    for _ in 0..reps {
        let ((), ms) = gpu
            .time(|| {
                f();
                Ok(())
            })
            .unwrap();
        v.push(f64::from(ms));
    }
    median(v)
}

fn main() {
    let reps: usize = std::env::args()
        .skip_while(|a| a != "--reps")
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    compile_times();
    let gpu = match Gpu::get() {
        Ok(g) => g,
        Err(e) => {
            println!("GPU benchmarks skipped: {e}");
            return;
        }
    };
    println!("device: {}", gpu.describe());
    use fusebox_core::ir::DType::F16;
    // Baseline: device-to-device copy of 1 GiB.
    let bytes = 1usize << 30;
    let src = GpuTensor::zeros(&gpu, fusebox_core::ir::DType::U8, vec![bytes]).unwrap();
    let mut dst = GpuTensor::zeros(&gpu, fusebox_core::ir::DType::U8, vec![bytes]).unwrap();
    let copy_ms = {
        let s = src.view::<u8>().unwrap();
        let mut v = Vec::new();
        for _ in 0..reps + 1 {
            let mut d = dst.view_mut::<u8>().unwrap();
            let ((), ms) = gpu
                .time(|| {
                    gpu.stream()
                        .memcpy_dtod(&s, &mut d)
                        .map_err(|e| fusebox_cuda::Error::Driver(format!("{e:?}")))
                })
                .unwrap();
            v.push(f64::from(ms));
        }
        median(v[1..].to_vec())
    };
    let bw_copy = 2.0 * bytes as f64 / (copy_ms * 1e-3) / 1e9;
    println!("baseline: cuMemcpyDtoD 1 GiB {copy_ms:.3} ms = {bw_copy:.0} GB/s (read + write)");

    // 1. Fused elementwise chain, 256 MiB per operand (f16).
    let (r, c) = (16384usize, 8192usize);
    let m = module(
        &format!(
            "x: R.Tensor(({r}, {c}), dtype=\"float16\"), b: R.Tensor(({c},), dtype=\"float16\")"
        ),
        &[
            "a = R.add(x, b)",
            "g = R.nn.gelu(a)",
            "gv = R.multiply(g, x)",
        ],
    );
    let art = artifact(&m);
    let x = device_input(&gpu, &[r, c], F16);
    let b = device_input(&gpu, &[c], F16);
    let ms = time(&gpu, reps, &|| {
        art.run(&[x.clone(), b.clone()]).unwrap();
    });
    let bw = 2.0 * (r * c * 2) as f64 / (ms * 1e-3) / 1e9;
    println!(
        "fused add+gelu+multiply [{r}x{c}] f16: {ms:.3} ms, {bw:.0} GB/s = {:.0}% of copy (target >= 90%)",
        100.0 * bw / bw_copy
    );
    drop(x);

    // 2/3. softmax and layer_norm, rows >= 1k.
    for cols in [1024usize, 4096, 8192] {
        let rows = (1usize << 27) / cols; // 256 MiB of f16
        let sm = module(
            &format!("x: R.Tensor(({rows}, {cols}), dtype=\"float16\")"),
            &["gv = R.nn.softmax(x, axis=-1)"],
        );
        let ln = module(
            &format!(
                "x: R.Tensor(({rows}, {cols}), dtype=\"float16\"), g: R.Tensor(({cols},), dtype=\"float16\"), h: R.Tensor(({cols},), dtype=\"float16\")"
            ),
            &["gv = R.nn.layer_norm(x, g, h, axes=[-1])"],
        );
        let x = device_input(&gpu, &[rows, cols], F16);
        let g = device_input(&gpu, &[cols], F16);
        let h = device_input(&gpu, &[cols], F16);
        let moved = 2.0 * (rows * cols * 2) as f64;
        let a = artifact(&sm);
        let ms = time(&gpu, reps, &|| {
            a.run(std::slice::from_ref(&x)).unwrap();
        });
        let bw = moved / (ms * 1e-3) / 1e9;
        println!(
            "softmax [{rows}x{cols}] f16: {ms:.3} ms, {bw:.0} GB/s = {:.0}% of copy (target >= 85%)",
            100.0 * bw / bw_copy
        );
        let a = artifact(&ln);
        let ms = time(&gpu, reps, &|| {
            a.run(&[x.clone(), g.clone(), h.clone()]).unwrap();
        });
        let bw = moved / (ms * 1e-3) / 1e9;
        println!(
            "layer_norm [{rows}x{cols}] f16: {ms:.3} ms, {bw:.0} GB/s = {:.0}% of copy (target >= 85%)",
            100.0 * bw / bw_copy
        );
    }

    // 3b. The block-per-row schedule's threads per row, swept (the default first): which
    //     block size keeps a row in registers at the least cost in occupancy.
    for cols in [4096usize, 8192] {
        let rows = (1usize << 27) / cols;
        let x = device_input(&gpu, &[rows, cols], F16);
        let g = device_input(&gpu, &[cols], F16);
        let h = device_input(&gpu, &[cols], F16);
        let moved = 2.0 * (rows * cols * 2) as f64;
        for (what, body, args) in [
            ("softmax", "gv = R.nn.softmax(x, axis=-1)", vec![x.clone()]),
            (
                "layer_norm",
                "gv = R.nn.layer_norm(x, g, h, axes=[-1])",
                vec![x.clone(), g.clone(), h.clone()],
            ),
        ] {
            let params = if what == "softmax" {
                format!("x: R.Tensor(({rows}, {cols}), dtype=\"float16\")")
            } else {
                format!(
                    "x: R.Tensor(({rows}, {cols}), dtype=\"float16\"), g: R.Tensor(({cols},), dtype=\"float16\"), h: R.Tensor(({cols},), dtype=\"float16\")"
                )
            };
            let m = module(&params, &[body]);
            let low = fusebox_cuda::lower::lower("f", m.get("f").unwrap()).unwrap();
            let mut line = format!("{what} [{rows}x{cols}] f16 by threads per row:");
            for block in [256u32, 512, 1024] {
                let mut k = low.kernels[0].clone();
                let per = (cols as u32).div_ceil(block);
                k.schedule = fusebox_cuda::kir::Schedule::BlockPerRow {
                    block,
                    per_thread: if per <= 32 { per } else { 0 },
                };
                let src = fusebox_cuda::emit::emit(&k);
                let bin = fusebox_cuda::compile_cached(
                    None,
                    &src,
                    "f.cu",
                    gpu.arch().unwrap(),
                    &CompileOptions::default(),
                )
                .unwrap();
                let module = gpu.load_module(&bin.cubin).unwrap();
                let kernel = module.kernel(&k.name).unwrap();
                let l = fusebox_cuda::emit::launch(&k, gpu.sm_count());
                let cfg = fusebox_cuda::LaunchConfig {
                    grid: l.grid,
                    block: l.block,
                    shared_mem_bytes: l.shared_mem_bytes,
                };
                let out = GpuTensor::empty(&gpu, F16, vec![rows, cols]).unwrap();
                let tensors: Vec<GpuTensor> = args
                    .iter()
                    .map(|v| GpuTensor::from_value(&gpu, v).unwrap())
                    .collect();
                let ms = time(&gpu, reps, &|| {
                    let kargs: Vec<fusebox_cuda::KernelArg<'_>> = tensors
                        .iter()
                        .chain(std::iter::once(&out))
                        .map(fusebox_cuda::KernelArg::Buffer)
                        .collect();
                    kernel.launch(&cfg, &kargs).unwrap();
                });
                let bw = moved / (ms * 1e-3) / 1e9;
                line.push_str(&format!(
                    " {block}: {:.0}% ({} regs)",
                    100.0 * bw / bw_copy,
                    kernel.num_registers().unwrap_or(0)
                ));
            }
            println!("{line}");
        }
    }

    // 4. residual add + layer_norm: fused vs two kernels.
    let (rows, cols) = (32768usize, 4096usize);
    let p = format!(
        "a: R.Tensor(({rows}, {cols}), dtype=\"float16\"), b: R.Tensor(({rows}, {cols}), dtype=\"float16\"), g: R.Tensor(({cols},), dtype=\"float16\"), h: R.Tensor(({cols},), dtype=\"float16\")"
    );
    let fused = artifact(&module(
        &p,
        &[
            "s = R.add(a, b)",
            "gv = R.nn.layer_norm(s, g, h, axes=[-1])",
        ],
    ));
    let add = artifact(&module(
        &format!(
            "a: R.Tensor(({rows}, {cols}), dtype=\"float16\"), b: R.Tensor(({rows}, {cols}), dtype=\"float16\")"
        ),
        &["gv = R.add(a, b)"],
    ));
    let ln = artifact(&module(
        &format!(
            "s: R.Tensor(({rows}, {cols}), dtype=\"float16\"), g: R.Tensor(({cols},), dtype=\"float16\"), h: R.Tensor(({cols},), dtype=\"float16\")"
        ),
        &["gv = R.nn.layer_norm(s, g, h, axes=[-1])"],
    ));
    let a = device_input(&gpu, &[rows, cols], F16);
    let b = device_input(&gpu, &[rows, cols], F16);
    let g = device_input(&gpu, &[cols], F16);
    let h = device_input(&gpu, &[cols], F16);
    let fused_ms = time(&gpu, reps, &|| {
        fused
            .run(&[a.clone(), b.clone(), g.clone(), h.clone()])
            .unwrap();
    });
    let two_ms = time(&gpu, reps, &|| {
        let s = add.run(&[a.clone(), b.clone()]).unwrap();
        ln.run(&[s, g.clone(), h.clone()]).unwrap();
    });
    println!(
        "residual add + layer_norm [{rows}x{cols}] f16: fused {fused_ms:.3} ms, add then layer_norm {two_ms:.3} ms: fused is {:.2}x faster (target >= 1.35x)",
        two_ms / fused_ms
    );
}
