//! GPU tests of the cuBLAS backend: every pattern and dtype against the CPU reference, batches
//! (strided, flattened, broadcast, mixed), device-value inputs, TF32, the plain-cuBLAS
//! fallback and the autotune cache. Each test prints why it is skipped when there is no CUDA
//! device or no cuBLASLt (`Runtime::get` fails), so they pass on CPU-only machines.
//!
//! Tolerances (`err <= atol + rtol * max|reference|`, per output): float32 with
//! `CUBLAS_COMPUTE_32F` rtol 1e-4; TF32 rtol 5e-3; float16 results rtol 4e-3 (an f16 ulp is
//! 2^-11 relative, plus accumulation order); bfloat16 results rtol 1.6e-2 (2^-8); float16 in
//! / float32 out rtol 1e-3; int8 -> int32 exact. GELU: cuBLASLt's GELU epilogue is the tanh
//! approximation while `relax.nn.gelu` is erf-GELU; the two differ by at most 4.8e-4 (at
//! x = ±2.70), so GELU cases add atol 6e-4 against the erf reference, and are also checked
//! tightly against the same module with `relax.nn.gelu_tanh`.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failure is a panic"
)]

use fusebox_core::backend::pipeline::{BackendPipeline, Plan};
use fusebox_core::config::Config;
use fusebox_core::ir::DType;
use fusebox_core::runtime::{Storage, Tensor, Value};
use fusebox_cublas::Runtime;
use std::sync::Arc;

fn runtime() -> Option<Arc<Runtime>> {
    match Runtime::get() {
        Ok(rt) => Some(rt),
        Err(e) if fusebox_cuda::testing::required("FUSEBOX_REQUIRE_GPU") => {
            panic!("FUSEBOX_REQUIRE_GPU=1 but {e}")
        }
        Err(e) => {
            println!("skipped: {e}");
            None
        }
    }
}

fn pipeline(options: &str) -> BackendPipeline {
    fusebox_cpu::link();
    fusebox_cublas::link();
    let src = format!(
        "target = \"cuda\"\n[partition]\nbind_constants = false\nannotate_codegen = true\n\
         fuse_ops = false\n[[backend]]\nname = \"cublas\"\n[backend.options]\n{options}\n\
         [[backend]]\nname = \"cpu\"\n"
    );
    BackendPipeline::new(Config::parse(&src, "gpu-test.toml").unwrap(), None).unwrap()
}

/// Deterministic inputs: floats uniform in [-1, 1), ints in [-8, 8).
fn input(dtype: DType, shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 33) as f64) / ((1u64 << 31) as f64)
    };
    let v: Vec<f64> = (0..n).map(|_| next() * 2.0 - 1.0).collect();
    let storage = if dtype.is_float() {
        Storage::from_f64(dtype, v)
    } else {
        Storage::from_i64(dtype, v.iter().map(|x| (x * 8.0).floor() as i64).collect())
    };
    Tensor::new(shape.to_vec(), storage).unwrap()
}

fn execute(plan: &Plan, args: Vec<Value>) -> Value {
    let hook = |name: &str, vals: &[Value]| plan.call(name, vals);
    fusebox_cpu::run_with(&plan.module, "main", args, Some(&hook))
        .unwrap()
        .to_host()
        .unwrap()
}

fn tensors(v: &Value) -> Vec<Tensor> {
    match v {
        Value::Tensor(t) => vec![t.clone()],
        Value::Tuple(items) => items.iter().flat_map(tensors).collect(),
        other => panic!("unexpected output {other:?}"),
    }
}

/// Max error over max |reference|, checked against `atol + rtol * range`.
fn assert_close(case: &str, got: &[Tensor], want: &[Tensor], rtol: f64, atol: f64) {
    assert_eq!(got.len(), want.len(), "{case}: output count");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.shape(), w.shape(), "{case}: shape");
        assert_eq!(g.dtype(), w.dtype(), "{case}: dtype");
        let (gv, wv) = (g.to_f64_vec(), w.to_f64_vec());
        let range = wv.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let err = gv
            .iter()
            .zip(&wv)
            .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        let tol = atol + rtol * range;
        println!("{case}: max err {err:.3e}, range {range:.3e}, tol {tol:.3e}");
        assert!(err <= tol, "{case}: max err {err} > {tol} (range {range})");
    }
}

struct Case {
    name: &'static str,
    src: String,
    inputs: Vec<(DType, Vec<usize>)>,
    rtol: f64,
    atol: f64,
    /// How many functions the cublas backend must have compiled.
    cublas_functions: usize,
}

/// Parses and partitions the case (everywhere, so the cases themselves are checked on
/// CPU-only machines: the cublas backend must claim the expected functions), then on a GPU
/// runs it and compares with the CPU reference.
fn run_case(c: &Case, options: &str, gpu: bool) {
    let m = fusebox_core::text::parse_module_str(&c.src).unwrap_or_else(|e| panic!("{e}"));
    let plan = pipeline(options).run(&m).unwrap();
    for cl in &plan.claims {
        println!(
            "{}: {} -> {:?} declines {:?} failures {:?}",
            c.name, cl.function, cl.backend, cl.declines, cl.compile_failures
        );
    }
    let claimed = plan
        .claims
        .iter()
        .filter(|cl| !cl.declines.iter().any(|(b, _)| b == "cublas"))
        .filter(|cl| cl.function.ends_with("_cublas"))
        .count();
    assert_eq!(
        claimed, c.cublas_functions,
        "{}: functions cublas claims",
        c.name
    );
    if !gpu {
        for cl in plan
            .claims
            .iter()
            .filter(|cl| cl.function.ends_with("_cublas"))
        {
            assert!(
                cl.compile_failures.iter().any(|(b, e)| b == "cublas"
                    && (e.contains("no CUDA device") || e.contains("cuBLASLt unavailable"))),
                "{}: {:?}",
                c.name,
                cl.compile_failures
            );
        }
    } else {
        let on_cublas = plan
            .claims
            .iter()
            .filter(|cl| cl.backend.as_deref() == Some("cublas"))
            .count();
        assert_eq!(
            on_cublas, c.cublas_functions,
            "{}: functions run by cublas",
            c.name
        );
    }
    // Without a device this runs the fallback (the CPU), which checks the case's inputs and
    // the harness; with one it is the real comparison.
    let args: Vec<Value> = c
        .inputs
        .iter()
        .enumerate()
        .map(|(i, (d, s))| Value::Tensor(input(*d, s, i as u64 + 1)))
        .collect();
    let got = tensors(&execute(&plan, args.clone()));
    let want = tensors(&fusebox_cpu::run(&m, "main", args.clone()).unwrap());
    assert_close(c.name, &got, &want, c.rtol, c.atol);
    if gpu && c.src.contains("R.nn.gelu(") {
        let tanh_src = c.src.replace("R.nn.gelu(", "R.nn.gelu_tanh(");
        let mt = fusebox_core::text::parse_module_str(&tanh_src).unwrap();
        let want = tensors(&fusebox_cpu::run(&mt, "main", args).unwrap());
        assert_close(
            &format!("{} (against tanh-GELU)", c.name),
            &got,
            &want,
            c.rtol,
            0.0,
        );
    }
}

/// Runs every case; on a machine without a device, checks the claims and says it skipped.
fn run_cases(cases: &[Case], options: &str) {
    let gpu = runtime().is_some();
    for c in cases {
        run_case(c, options, gpu);
    }
    if !gpu {
        println!(
            "numerics skipped (no device); {} case(s) partitioned and claimed",
            cases.len()
        );
    }
}

fn dt(d: DType) -> &'static str {
    d.name()
}

/// `act(matmul(x, w') + b)` for one dtype, every entry of the table.
fn pattern_cases(d: DType, rtol: f64) -> Vec<Case> {
    let (m, k, n) = (64, 96, 80);
    let t = dt(d);
    let mut out = Vec::new();
    for transposed in [false, true] {
        for (bias, act) in [
            (false, None),
            (true, None),
            (true, Some("relu")),
            (true, Some("gelu")),
        ] {
            let wshape = if transposed { (n, k) } else { (k, n) };
            let mut lines: Vec<String> = Vec::new();
            let rhs = if transposed {
                lines.push("wt = R.permute_dims(w)".into());
                "wt"
            } else {
                "w"
            };
            lines.push(format!("mm = R.matmul(x, {rhs})"));
            let mut last = "mm".to_string();
            if bias {
                lines.push(format!("bb = R.add({last}, b)"));
                last = "bb".into();
            }
            if let Some(a) = act {
                lines.push(format!("y = R.nn.{a}({last})"));
                last = "y".into();
            }
            // The last binding is the output `out`.
            if let Some(l) = lines.last_mut()
                && let Some(rest) = l.strip_prefix(&format!("{last} = "))
            {
                *l = format!("out = {rest}");
            }
            let body: String = lines.iter().map(|l| format!("            {l}\n")).collect();
            let params = if bias {
                format!(
                    "x: R.Tensor(({m}, {k}), dtype=\"{t}\"), w: R.Tensor(({}, {}), dtype=\"{t}\"), b: R.Tensor(({n},), dtype=\"{t}\")",
                    wshape.0, wshape.1
                )
            } else {
                format!(
                    "x: R.Tensor(({m}, {k}), dtype=\"{t}\"), w: R.Tensor(({}, {}), dtype=\"{t}\")",
                    wshape.0, wshape.1
                )
            };
            let src = format!(
                "@I.ir_module\nclass Module:\n    @R.function\n    def main({params}):\n        with R.dataflow():\n{body}            R.output(out)\n        return out\n"
            );
            let name: &'static str = Box::leak(
                format!(
                    "{t} matmul{}{}{}",
                    if transposed { "_transposed" } else { "" },
                    if bias { "_bias" } else { "" },
                    act.map_or(String::new(), |a| format!("_{a}"))
                )
                .into_boxed_str(),
            );
            out.push(Case {
                name,
                src,
                inputs: if bias {
                    vec![(d, vec![m, k]), (d, vec![wshape.0, wshape.1]), (d, vec![n])]
                } else {
                    vec![(d, vec![m, k]), (d, vec![wshape.0, wshape.1])]
                },
                rtol,
                atol: if act == Some("gelu") { 6e-4 } else { 0.0 },
                cublas_functions: 1,
            });
        }
    }
    out
}

#[test]
fn every_pattern_float16() {
    run_cases(&pattern_cases(DType::F16, 4e-3), "");
}

#[test]
fn every_pattern_bfloat16() {
    run_cases(&pattern_cases(DType::BF16, 1.6e-2), "");
}

#[test]
fn every_pattern_float32_true_fp32() {
    run_cases(&pattern_cases(DType::F32, 1e-4), "");
}

#[test]
fn float32_with_tf32() {
    run_cases(&pattern_cases(DType::F32, 5e-3), "allow_tf32 = true");
}

fn simple(
    name: &'static str,
    params: &str,
    body: &str,
    inputs: Vec<(DType, Vec<usize>)>,
    rtol: f64,
    n: usize,
) -> Case {
    Case {
        name,
        src: format!(
            "@I.ir_module\nclass Module:\n    @R.function\n    def main({params}):\n        with R.dataflow():\n{body}        return out\n"
        ),
        inputs,
        rtol,
        atol: 0.0,
        cublas_functions: n,
    }
}

#[test]
fn mixed_output_dtypes_and_int8() {
    let cases = vec![
        simple(
            "float16 -> float32",
            "x: R.Tensor((64, 128), dtype=\"float16\"), w: R.Tensor((128, 48), dtype=\"float16\"), b: R.Tensor((48,), dtype=\"float32\")",
            "            mm = R.matmul(x, w, out_dtype=\"float32\")\n            out = R.add(mm, b)\n            R.output(out)\n",
            vec![
                (DType::F16, vec![64, 128]),
                (DType::F16, vec![128, 48]),
                (DType::F32, vec![48]),
            ],
            1e-3,
            1,
        ),
        simple(
            "bfloat16 -> float32",
            "x: R.Tensor((64, 128), dtype=\"bfloat16\"), w: R.Tensor((48, 128), dtype=\"bfloat16\")",
            "            wt = R.permute_dims(w)\n            out = R.matmul(x, wt, out_dtype=\"float32\")\n            R.output(out)\n",
            vec![(DType::BF16, vec![64, 128]), (DType::BF16, vec![48, 128])],
            1e-3,
            1,
        ),
        simple(
            "int8 -> int32",
            "x: R.Tensor((64, 128), dtype=\"int8\"), w: R.Tensor((128, 48), dtype=\"int8\")",
            "            out = R.matmul(x, w, out_dtype=\"int32\")\n            R.output(out)\n",
            vec![(DType::I8, vec![64, 128]), (DType::I8, vec![128, 48])],
            0.0,
            1,
        ),
        simple(
            "int8 -> int32 transposed",
            "x: R.Tensor((64, 128), dtype=\"int8\"), w: R.Tensor((48, 128), dtype=\"int8\")",
            "            wt = R.permute_dims(w)\n            out = R.matmul(x, wt, out_dtype=\"int32\")\n            R.output(out)\n",
            vec![(DType::I8, vec![64, 128]), (DType::I8, vec![48, 128])],
            0.0,
            1,
        ),
        simple(
            "scaled (matmul_transposed_multiply)",
            "x: R.Tensor((32, 64), dtype=\"float16\"), w: R.Tensor((40, 64), dtype=\"float16\"), sa: R.Tensor((1,), dtype=\"float16\"), sb: R.Tensor((1,), dtype=\"float16\")",
            "            wt = R.permute_dims(w)\n            mm = R.matmul(x, wt)\n            s = R.multiply(sa, sb)\n            p = R.multiply(mm, s)\n            out = R.astype(p, dtype=\"float32\")\n            R.output(out)\n",
            vec![
                (DType::F16, vec![32, 64]),
                (DType::F16, vec![40, 64]),
                (DType::F16, vec![1]),
                (DType::F16, vec![1]),
            ],
            4e-3,
            1,
        ),
        simple(
            "bias of shape (1, N)",
            "x: R.Tensor((32, 64), dtype=\"float16\"), w: R.Tensor((64, 40), dtype=\"float16\"), b: R.Tensor((1, 40), dtype=\"float16\")",
            "            mm = R.matmul(x, w)\n            bb = R.add(b, mm)\n            out = R.nn.relu(bb)\n            R.output(out)\n",
            vec![
                (DType::F16, vec![32, 64]),
                (DType::F16, vec![64, 40]),
                (DType::F16, vec![1, 40]),
            ],
            4e-3,
            1,
        ),
        simple(
            "odd sizes (no 16-byte leading dims)",
            "x: R.Tensor((33, 67), dtype=\"float16\"), w: R.Tensor((67, 41), dtype=\"float16\"), b: R.Tensor((41,), dtype=\"float16\")",
            "            mm = R.matmul(x, w)\n            out = R.add(mm, b)\n            R.output(out)\n",
            vec![
                (DType::F16, vec![33, 67]),
                (DType::F16, vec![67, 41]),
                (DType::F16, vec![41]),
            ],
            4e-3,
            1,
        ),
    ];
    run_cases(&cases, "");
}

#[test]
fn batches() {
    let f = DType::F16;
    let cases = vec![
        simple(
            "equal batches (strided)",
            "a: R.Tensor((4, 32, 64), dtype=\"float16\"), b: R.Tensor((4, 64, 24), dtype=\"float16\"), c: R.Tensor((24,), dtype=\"float16\")",
            "            mm = R.matmul(a, b)\n            bb = R.add(mm, c)\n            out = R.nn.relu(bb)\n            R.output(out)\n",
            vec![(f, vec![4, 32, 64]), (f, vec![4, 64, 24]), (f, vec![24])],
            4e-3,
            1,
        ),
        simple(
            "batched lhs, 2-D rhs (flattened into M)",
            "a: R.Tensor((2, 3, 16, 64), dtype=\"float16\"), b: R.Tensor((64, 24), dtype=\"float16\")",
            "            out = R.matmul(a, b)\n            R.output(out)\n",
            vec![(f, vec![2, 3, 16, 64]), (f, vec![64, 24])],
            4e-3,
            1,
        ),
        simple(
            "batched transposed rhs",
            "a: R.Tensor((3, 16, 64), dtype=\"float16\"), b: R.Tensor((3, 24, 64), dtype=\"float16\")",
            "            bt = R.permute_dims(b, axes=[0, 2, 1])\n            out = R.matmul(a, bt)\n            R.output(out)\n",
            vec![(f, vec![3, 16, 64]), (f, vec![3, 24, 64])],
            4e-3,
            1,
        ),
        // TVM accepts a 2-D lhs against a symbolically batched rhs: batch stride 0 for the lhs.
        simple(
            "2-D lhs, symbolic batched rhs (stride-0 broadcast)",
            "a: R.Tensor((16, 64), dtype=\"float16\"), b: R.Tensor((\"n\", 64, 24), dtype=\"float16\")",
            "            out = R.matmul(a, b)\n            R.output(out)\n",
            vec![(f, vec![16, 64]), (f, vec![5, 64, 24])],
            4e-3,
            1,
        ),
        // (2, 1) x (1, 2) batches: equal counts, so TVM accepts; one launch per batch entry.
        simple(
            "mixed broadcast batches (one launch each)",
            "a: R.Tensor((2, 1, 16, 64), dtype=\"float16\"), b: R.Tensor((1, 2, 64, 24), dtype=\"float16\")",
            "            out = R.matmul(a, b)\n            R.output(out)\n",
            vec![(f, vec![2, 1, 16, 64]), (f, vec![1, 2, 64, 24])],
            4e-3,
            1,
        ),
        simple(
            "1-D lhs and 1-D rhs",
            "v: R.Tensor((64,), dtype=\"float16\"), w: R.Tensor((64, 24), dtype=\"float16\"), x: R.Tensor((16, 64), dtype=\"float16\"), u: R.Tensor((64,), dtype=\"float16\")",
            "            o1 = R.matmul(v, w)\n            o2 = R.matmul(x, u)\n            out = (o1, o2)\n            R.output(out)\n",
            vec![
                (f, vec![64]),
                (f, vec![64, 24]),
                (f, vec![16, 64]),
                (f, vec![64]),
            ],
            4e-3,
            2,
        ),
    ];
    run_cases(&cases, "");
}

#[test]
fn device_values_in_and_out() {
    let Some(rt) = runtime() else { return };
    let src = "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: R.Tensor((32, 64), dtype=\"float16\"), w: R.Tensor((64, 48), dtype=\"float16\"), b: R.Tensor((48,), dtype=\"float16\")):\n        with R.dataflow():\n            mm = R.matmul(x, w)\n            bb = R.add(mm, b)\n            h = R.nn.relu(bb)\n            mm2 = R.matmul(h, R.permute_dims(w))\n            R.output(mm2)\n        return mm2\n";
    let m = fusebox_core::text::parse_module_str(src).unwrap();
    let plan = pipeline("").run(&m).unwrap();
    let host: Vec<Tensor> = vec![
        input(DType::F16, &[32, 64], 1),
        input(DType::F16, &[64, 48], 2),
        input(DType::F16, &[48], 3),
    ];
    let dev: Vec<Value> = host
        .iter()
        .map(|t| {
            fusebox_cuda::GpuTensor::upload(rt.gpu(), t)
                .unwrap()
                .into_value()
        })
        .collect();
    // The first function's result stays on the device and feeds the second.
    let hook = |name: &str, vals: &[Value]| plan.artifacts.get(name).map(|a| a.run(vals));
    let out = fusebox_cpu::run_with(&plan.module, "main", dev, Some(&hook)).unwrap();
    assert!(out.is_on_device(), "the result should be a device value");
    let got = tensors(&out.to_host().unwrap());
    let want = tensors(
        &fusebox_cpu::run(&m, "main", host.into_iter().map(Value::Tensor).collect()).unwrap(),
    );
    assert_close("device values", &got, &want, 8e-3, 0.0);
}

#[test]
fn autotune_times_candidates_and_caches_the_choice_on_disk() {
    let Some(rt) = runtime() else { return };
    let Some(cache) = fusebox_cublas::tune::TuneCache::from_env() else {
        println!("skipped: no cache directory (set FUSEBOX_CACHE_DIR or HOME)");
        return;
    };
    let count = || {
        std::fs::read_dir(cache.dir())
            .map(|r| r.flatten().count())
            .unwrap_or(0)
    };
    let c = simple(
        "autotuned 384x256x320 float16 + bias + relu",
        "x: R.Tensor((384, 320), dtype=\"float16\"), w: R.Tensor((320, 256), dtype=\"float16\"), b: R.Tensor((256,), dtype=\"float16\")",
        "            mm = R.matmul(x, w)\n            bb = R.add(mm, b)\n            out = R.nn.relu(bb)\n            R.output(out)\n",
        vec![
            (DType::F16, vec![384, 320]),
            (DType::F16, vec![320, 256]),
            (DType::F16, vec![256]),
        ],
        4e-3,
        1,
    );
    let before = count();
    rt.clear_cache().unwrap();
    run_case(&c, "autotune = true", true);
    let after = count();
    println!(
        "autotune cache {}: {before} -> {after} entries",
        cache.dir().display()
    );
    assert!(
        after >= 1,
        "autotune wrote no cache entry in {}",
        cache.dir().display()
    );
    // A fresh in-memory cache reads the choice back from disk (and revalidates it).
    rt.clear_cache().unwrap();
    run_case(&c, "autotune = true", true);
    assert_eq!(count(), after, "the second run hit the cache");
}

#[test]
fn benchmark_kernel_compiles_with_nvrtc() {
    use fusebox_cuda::nvrtc::{Arch, CompileOptions, compile};
    if !fusebox_cuda::testing::nvrtc_or_skip("benchmark_kernel_compiles_with_nvrtc") {
        return;
    }
    let src = include_str!("../kernels/bias_relu_f16x8.cu");
    let opts = CompileOptions {
        ptxas_verbose: true,
        ..CompileOptions::default()
    };
    for arch in [Arch::Sm80, Arch::Sm90] {
        let k = compile(src, "bias_relu.cu", arch, &opts).unwrap_or_else(|e| panic!("{e}"));
        assert!(!k.cubin.is_empty());
        assert!(!k.has_spills(), "{}", k.log);
        let info = k.ptxas_info("bias_relu_f16x8").unwrap();
        println!("{arch}: {} registers", info.registers);
        assert!(info.entry);
    }
}
