//! Benchmark (not a test): what cuBLASLt's fused epilogue buys, measured side by side in one
//! process on one GPU.
//!
//! For each shape (default `4096x4096x4096` and `4096x4096x1024`, float16 in and out, fp32
//! accumulation), with random data, it times
//!
//! 1. `lt gemm`: cuBLASLt, `CUBLASLT_EPILOGUE_DEFAULT` (fusebox's plan and runtime);
//! 2. `lt gemm+RELU_BIAS`: the same GEMM with the bias + relu epilogue (what `cublas.matmul_bias_relu`
//!    runs);
//! 3. `lt gemm+GELU_BIAS`;
//! 4. `cublas gemm + kernel`: `cublasGemmEx` followed by a separate bias + relu kernel (NVRTC,
//!    in place, 16-byte vectors) — the unfused baseline;
//! 5. `lt gemm + kernel`: the plain cuBLASLt GEMM followed by the same kernel;
//!
//! each as the median of `--reps` event-timed runs (after a warm-up), interleaved round by
//! round, and prints TFLOP/s (2·M·N·K) and the ratios of gpu-targets.md §6 (#8: fused / plain
//! ≤ 1.03; #9: unfused / fused ≥ 1.08 at 4096³, ≥ 1.25 at K = 1024), plus the largest difference
//! between the fused and unfused results.
//!
//! ```text
//! cargo run --release -p fusebox-cublas --example bench_epilogue
//! cargo run --release -p fusebox-cublas --example bench_epilogue -- --shapes 8192x8192x8192 --reps 50 --autotune
//! ```

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a command-line benchmark"
)]

use fusebox_core::ir::DType;
use fusebox_core::runtime::{Storage, Tensor};
use fusebox_cublas::lt::{Alpha, BlasHandle};
use fusebox_cublas::plan::{Epilogue, LtPlan, PlanRequest, build_plan};
use fusebox_cublas::spec::Activation;
use fusebox_cublas::{Options, Runtime};
use fusebox_cuda::nvrtc::{Arch, CompileOptions, compile};
use fusebox_cuda::{GpuTensor, KernelArg, LaunchConfig};
use std::process::ExitCode;

/// In-place `y = max(y + bias, 0)` over a row-major [rows, cols] float16 matrix, 8 halves
/// (16 bytes) per thread; no CUDA headers needed (conversions by PTX). Compiled in the tests
/// (`tests/gpu.rs`) wherever NVRTC is available, GPU or not.
const BIAS_RELU: &str = include_str!("../kernels/bias_relu_f16x8.cu");

struct Args {
    shapes: Vec<(usize, usize, usize)>,
    reps: usize,
    autotune: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        shapes: vec![(4096, 4096, 4096), (4096, 4096, 1024)],
        reps: 30,
        autotune: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--shapes" => {
                let v = it.next().ok_or("--shapes needs MxNxK[,MxNxK...]")?;
                a.shapes = v
                    .split(',')
                    .map(|s| {
                        let d: Vec<usize> = s
                            .split('x')
                            .map(|x| x.trim().parse::<usize>())
                            .collect::<Result<_, _>>()
                            .map_err(|e| format!("bad shape `{s}`: {e}"))?;
                        match d.as_slice() {
                            [m, n, k] if *n % 8 == 0 => Ok((*m, *n, *k)),
                            _ => Err(format!("bad shape `{s}` (MxNxK, N a multiple of 8)")),
                        }
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--reps" => {
                a.reps = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&r| r >= 3)
                    .ok_or("--reps needs a number >= 3")?;
            }
            "--autotune" => a.autotune = true,
            "-h" | "--help" => {
                return Err(
                    "usage: bench_epilogue [--shapes MxNxK,...] [--reps N] [--autotune]".into(),
                );
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(a)
}

fn random_f16(shape: Vec<usize>, seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    Tensor::new(shape, Storage::from_f32(DType::F16, v)).expect("shape and data agree")
}

fn median(mut v: Vec<f32>) -> f32 {
    v.sort_by(f32::total_cmp);
    v[v.len() / 2]
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    let rt = Runtime::get().map_err(|e| e.to_string())?;
    let gpu = rt.gpu().clone();
    println!(
        "device: {}, cc {:?}, cuBLASLt {}; float16 in/out, fp32 accumulate; median of {} event-timed runs",
        gpu.describe(),
        gpu.compute_capability(),
        rt.version(),
        args.reps
    );
    let options = Options {
        autotune: args.autotune,
        ..Options::default()
    };
    let arch = gpu.arch().unwrap_or(Arch::Sm90);
    let compiled = compile(BIAS_RELU, "bias_relu.cu", arch, &CompileOptions::default())
        .map_err(|e| e.to_string())?;
    let module = gpu
        .load_module(&compiled.cubin)
        .map_err(|e| e.to_string())?;
    let kernel = module
        .kernel("bias_relu_f16x8")
        .map_err(|e| e.to_string())?;
    let blas = BlasHandle::new(gpu.stream()).map_err(|e| e.to_string())?;
    let err = |e: fusebox_cublas::Error| e.to_string();
    let cerr = |e: fusebox_cuda::Error| e.to_string();
    for &(m, n, k) in &args.shapes {
        let x = GpuTensor::upload(&gpu, &random_f16(vec![m, k], 1)).map_err(cerr)?;
        let w = GpuTensor::upload(&gpu, &random_f16(vec![k, n], 2)).map_err(cerr)?;
        let b = GpuTensor::upload(&gpu, &random_f16(vec![n], 3)).map_err(cerr)?;
        let out = GpuTensor::empty(&gpu, DType::F16, vec![m, n]).map_err(cerr)?;
        let out2 = GpuTensor::empty(&gpu, DType::F16, vec![m, n]).map_err(cerr)?;
        let plan = |bias: bool, act: Option<Activation>| -> Result<LtPlan, String> {
            build_plan(&PlanRequest {
                lhs: vec![m, k],
                rhs: vec![k, n],
                rhs_transposed: false,
                bias: bias.then(|| vec![n]),
                in_dtype: DType::F16,
                out_dtype: DType::F16,
                activation: act,
                scaled: false,
                allow_tf32: false,
            })
            .map_err(|e| e.to_string())
        };
        let plain = plan(false, None)?;
        let relu_bias = plan(true, Some(Activation::Relu))?;
        let gelu_bias = plan(true, Some(Activation::Gelu))?;
        assert_eq!(relu_bias.epilogue, Epilogue::ReluBias);
        let n_vec = (m * n / 8) as u64;
        let cols_vec = u32::try_from(n / 8).map_err(|e| e.to_string())?;
        let launch = LaunchConfig::linear(m * n / 8, 256).map_err(cerr)?;
        let bias_relu = |y: &GpuTensor| -> Result<(), String> {
            kernel
                .launch(
                    &launch,
                    &[
                        KernelArg::Buffer(y),
                        KernelArg::Buffer(&b),
                        KernelArg::U64(n_vec),
                        KernelArg::U32(cols_vec),
                    ],
                )
                .map_err(cerr)
        };
        type Step<'a> = Box<dyn Fn() -> Result<(), String> + 'a>;
        let variants: Vec<(&str, Step<'_>)> = vec![
            (
                "lt gemm",
                Box::new(|| {
                    rt.matmul(&plain, &options, Alpha::F32(1.0), &w, &x, &out, None)
                        .map_err(err)
                }),
            ),
            (
                "lt gemm+RELU_BIAS",
                Box::new(|| {
                    rt.matmul(
                        &relu_bias,
                        &options,
                        Alpha::F32(1.0),
                        &w,
                        &x,
                        &out,
                        Some(&b),
                    )
                    .map_err(err)
                }),
            ),
            (
                "lt gemm+GELU_BIAS",
                Box::new(|| {
                    rt.matmul(
                        &gelu_bias,
                        &options,
                        Alpha::F32(1.0),
                        &w,
                        &x,
                        &out,
                        Some(&b),
                    )
                    .map_err(err)
                }),
            ),
            (
                "cublas gemm + kernel",
                Box::new(|| {
                    blas.gemm(&plain, Alpha::F32(1.0), &w, &x, &out2)
                        .map_err(err)?;
                    bias_relu(&out2)
                }),
            ),
            (
                "lt gemm + kernel",
                Box::new(|| {
                    rt.matmul(&plain, &options, Alpha::F32(1.0), &w, &x, &out2, None)
                        .map_err(err)?;
                    bias_relu(&out2)
                }),
            ),
        ];
        // Warm-up (also prepares and, with --autotune, tunes every plan).
        for (_, f) in &variants {
            f()?;
            f()?;
        }
        gpu.synchronize().map_err(cerr)?;
        let mut times: Vec<Vec<f32>> = vec![Vec::new(); variants.len()];
        for _ in 0..args.reps {
            for (i, (_, f)) in variants.iter().enumerate() {
                let (s, e) = (gpu.event().map_err(cerr)?, gpu.event().map_err(cerr)?);
                s.record().map_err(cerr)?;
                f()?;
                e.record().map_err(cerr)?;
                times[i].push(s.elapsed_ms(&e).map_err(cerr)?);
            }
        }
        let med: Vec<f32> = times.into_iter().map(median).collect();
        let flops = 2.0 * m as f64 * n as f64 * k as f64;
        println!("\nM={m} N={n} K={k}");
        for ((name, _), t) in variants.iter().zip(&med) {
            println!(
                "  {name:<24} {:>9.4} ms  {:>7.1} TFLOP/s",
                t,
                flops / (f64::from(*t) * 1e-3) / 1e12
            );
        }
        // Correctness: fused RELU_BIAS against cuBLAS + kernel.
        rt.matmul(
            &relu_bias,
            &options,
            Alpha::F32(1.0),
            &w,
            &x,
            &out,
            Some(&b),
        )
        .map_err(err)?;
        blas.gemm(&plain, Alpha::F32(1.0), &w, &x, &out2)
            .map_err(err)?;
        bias_relu(&out2)?;
        let (f, u) = (
            out.download().map_err(cerr)?.to_f32_vec(),
            out2.download().map_err(cerr)?.to_f32_vec(),
        );
        let diff = f
            .iter()
            .zip(&u)
            .fold(0.0f32, |a, (p, q)| a.max((p - q).abs()));
        let range = u.iter().fold(0.0f32, |a, q| a.max(q.abs()));
        let (plain_t, fused_t, gelu_t, unfused_t, lt_unfused_t) =
            (med[0], med[1], med[2], med[3], med[4]);
        println!(
            "  fused RELU_BIAS / plain lt gemm      {:.3}x  (target <= 1.03, floor <= 1.05)",
            fused_t / plain_t
        );
        println!(
            "  fused GELU_BIAS / plain lt gemm      {:.3}x  (target <= 1.03)",
            gelu_t / plain_t
        );
        println!(
            "  cublas gemm + kernel / fused         {:.3}x  (target >= 1.08 at 4096^3, >= 1.25 at K=1024)",
            unfused_t / fused_t
        );
        println!(
            "  lt gemm + kernel / fused             {:.3}x",
            lt_unfused_t / fused_t
        );
        println!("  max |fused - unfused| = {diff:.3e} (output range {range:.3e})");
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_epilogue: {e}");
            ExitCode::from(2)
        }
    }
}
