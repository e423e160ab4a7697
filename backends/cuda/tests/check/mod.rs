//! Test helpers of the lowering tests: random inputs, and checking a lowering against the CPU
//! reference.

#![allow(
    dead_code,
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers: a failure is a panic; each test binary uses a subset"
)]

use fusebox_core::ir::{DType, Function, Module, Type};
use fusebox_core::runtime::{Storage, Tensor, Value};
use fusebox_cuda::eval::evaluate;
use fusebox_cuda::lower::lower;

/// A small deterministic generator (xorshift).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn unit(&mut self) -> f32 {
        (self.next() % 20001) as f32 / 10000.0 - 1.0
    }
}

/// Random data for a tensor type: floats in [-1, 1], integers in [0, 3).
pub fn random_tensor(ty: &Type, rng: &mut Rng) -> Tensor {
    let tt = ty.as_tensor().expect("tensor parameter");
    let shape: Vec<usize> = tt
        .static_shape()
        .expect("static shape")
        .iter()
        .map(|&d| d as usize)
        .collect();
    let n: usize = shape.iter().product();
    let dtype = tt.dtype.unwrap_or(DType::F32);
    let data: Vec<f32> = if dtype.is_float() {
        (0..n).map(|_| rng.unit()).collect()
    } else {
        (0..n).map(|_| (rng.next() % 3) as f32).collect()
    };
    Tensor::new(shape, Storage::from_f32(dtype, data)).expect("tensor")
}

/// Tolerance for comparing a kernel's value with the reference's, per dtype.
pub fn tolerance(d: DType) -> f64 {
    match d {
        DType::F16 => 1e-2,
        DType::BF16 => 3e-2,
        DType::F32 => 2e-5,
        DType::F64 => 1e-10,
        _ => 0.0,
    }
}

/// Lowers `name` of `m`, evaluates its kernels on `args` (sampling at most `limit` elements per
/// kernel) and compares with the CPU reference's result. Returns the number of kernels and of
/// elements compared.
pub fn check_function(
    m: &Module,
    name: &str,
    args: &[Value],
    limit: Option<usize>,
) -> Result<(usize, usize), String> {
    let f: &Function = m.get(name).ok_or("no such function")?;
    let want = fusebox_cpu::run(m, name, args.to_vec()).map_err(|e| format!("cpu: {e}"))?;
    let low = lower(name, f).map_err(|e| e.to_string())?;
    if let Ok(dir) = std::env::var("FUSEBOX_DUMP_CU") {
        for k in &low.kernels {
            let _ = std::fs::write(format!("{dir}/{}.cu", k.name), fusebox_cuda::emit::emit(k));
        }
    }
    let mut inputs: Vec<Tensor> = Vec::new();
    for a in args {
        match a {
            Value::Tensor(t) => inputs.push(t.clone()),
            Value::Tuple(fields) => {
                for f in fields {
                    match f {
                        Value::Tensor(t) => inputs.push(t.clone()),
                        v => return Err(format!("a {} in a tuple argument", v.kind())),
                    }
                }
            }
            v => return Err(format!("a {} argument", v.kind())),
        }
    }
    for (_, c) in &low.constants {
        inputs.push(Tensor::from_constant(c).map_err(|e| e.to_string())?);
    }
    let wants: Vec<Tensor> = match want {
        Value::Tensor(t) => vec![t],
        Value::Tuple(vs) => vs
            .into_iter()
            .map(|v| match v {
                Value::Tensor(t) => Ok(t),
                v => Err(format!("a {} output", v.kind())),
            })
            .collect::<Result<_, _>>()?,
        v => return Err(format!("a {} result", v.kind())),
    };
    if wants.len() != low.outputs.len() {
        return Err(format!(
            "{} outputs lowered, {} computed",
            low.outputs.len(),
            wants.len()
        ));
    }
    let mut got: Vec<Vec<(usize, f64)>> = vec![Vec::new(); low.outputs.len()];
    for k in &low.kernels {
        let r = evaluate(k, &inputs, limit).map_err(|e| e.to_string())?;
        for (o, vals) in r.into_iter().enumerate() {
            got[o].extend(vals);
        }
    }
    let mut compared = 0;
    for (o, (w, g)) in wants.iter().zip(&got).enumerate() {
        if g.is_empty() && w.numel() > 0 {
            return Err(format!("output {o} is written by no kernel"));
        }
        if limit.is_none() && g.len() != w.numel() {
            return Err(format!(
                "output {o}: {} of {} elements written",
                g.len(),
                w.numel()
            ));
        }
        let wv = w.to_f64_vec();
        let tol = tolerance(w.dtype());
        // Relative to the output's range: sums of many products differ in their last bits
        // with the summation order.
        let range = wv
            .iter()
            .filter(|v| v.is_finite())
            .fold(1.0f64, |m, v| m.max(v.abs()));
        for &(i, v) in g {
            let r = wv[i];
            let ok = (r.is_nan() && v.is_nan()) || r == v || (r - v).abs() <= tol * range;
            if !ok {
                return Err(format!(
                    "output {o} element {i}: kernel {v}, reference {r} ({})",
                    w.dtype()
                ));
            }
            compared += 1;
        }
    }
    Ok((low.kernels.len(), compared))
}

/// Random arguments for `name`'s parameters.
pub fn random_args(m: &Module, name: &str, seed: u64) -> Vec<Value> {
    let f = m.get(name).expect("function");
    let mut rng = Rng(seed | 1);
    f.params
        .iter()
        .map(|&p| random_value(&f.var(p).ty, &mut rng))
        .collect()
}

fn random_value(ty: &Type, rng: &mut Rng) -> Value {
    match ty {
        Type::Tuple(fields) => Value::Tuple(fields.iter().map(|t| random_value(t, rng)).collect()),
        t => Value::Tensor(random_tensor(t, rng)),
    }
}

/// `def name(params)` with one dataflow block of `body`, whose last binding is the output.
pub fn module(name: &str, params: &str, body: &[&str]) -> String {
    let mut s = format!(
        "@I.ir_module\nclass Module:\n    @R.function\n    def {name}({params}):\n        with R.dataflow():\n"
    );
    for b in body {
        s.push_str(&format!("            {b}\n"));
    }
    let last = body
        .last()
        .and_then(|b| b.split('=').next())
        .map(str::trim)
        .unwrap_or("gv");
    s.push_str(&format!(
        "            R.output({last})\n        return {last}\n"
    ));
    s
}

/// `R.Tensor((shape), dtype="dtype")`.
pub fn tensor_ty(shape: &str, dtype: &str) -> String {
    format!("R.Tensor(({shape}), dtype=\"{dtype}\")")
}

/// Lowers `body` (a function named after `name`), checks it against the CPU reference on three
/// random inputs (every element compared), and, where NVRTC is available, compiles each kernel
/// for sm_80, sm_90 and sm_90a and asserts it does not spill. Returns the kernel count.
pub fn lower_check_compile(name: &str, params: &str, body: &[&str]) -> usize {
    use fusebox_core::text::parse_module_str;
    use fusebox_cuda::nvrtc::{Arch, CompileOptions};
    let fname = fusebox_cuda::lower::sanitize(name);
    let src = module(&fname, params, body);
    let m = parse_module_str(&src).unwrap_or_else(|e| panic!("{name}: {e}\n{src}"));
    let mut kernels = 0;
    for seed in [1u64, 7, 42] {
        let args = random_args(&m, &fname, seed);
        let (k, n) = check_function(&m, &fname, &args, None)
            .unwrap_or_else(|e| panic!("{name} (seed {seed}): {e}\n{src}"));
        assert!(n > 0, "{name}: nothing compared");
        kernels = k;
    }
    if fusebox_cuda::testing::nvrtc_or_skip(name) {
        let low = lower(&fname, m.get(&fname).unwrap()).unwrap();
        for k in &low.kernels {
            let src = fusebox_cuda::emit::emit(k);
            for arch in [Arch::Sm80, Arch::Sm90, Arch::Sm90a] {
                let opts = CompileOptions {
                    ptxas_verbose: true,
                    ..CompileOptions::default()
                };
                let c = fusebox_cuda::compile_cached(None, &src, &k.name, arch, &opts)
                    .unwrap_or_else(|e| panic!("{name}: {e}\n{src}"));
                assert!(!c.has_spills(), "{name} spills on {arch}: {}", c.log);
            }
        }
    }
    kernels
}
