//! Elementwise kernels: broadcasting binary arithmetic, unary math and activations, `clip`,
//! `astype`, `bitcast` and inference-mode `dropout`.
//!
//! `float32` and `float64` compute natively (same-shape `float32` binary ops and `relu` on
//! large tensors in chunks on [`crate::par::threads`] threads: the same arithmetic per
//! element); `float16`/`bfloat16` compute through `f32` and
//! round once per op; integer dtypes compute through `i64` and wrap to their width (integer
//! `divide` truncates toward zero, and a division by zero is an error); `bool` supports
//! `add`/`maximum` (or) and `multiply`/`minimum` (and).
//!
//! ```text
//! z: R.Tensor((3, 4), dtype="float32") = R.add(x, y)   # x: (3, 1), y: (4,)
//! g: R.Tensor((3, 4), dtype="float32") = R.nn.gelu(z)  # 0.5 z (1 + erf(z / sqrt 2))
//! ```

use crate::norm::erf32;
use crate::util::{KResult, broadcast_shapes, tensor, zip_broadcast};
use fusebox_core::ir::DType;
use fusebox_core::runtime::{Prim, Storage, StorageRef, Tensor};
use half::{bf16, f16};

/// A broadcasting binary op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Max,
    Min,
}

pub(crate) fn f32_op(op: BinOp) -> fn(f32, f32) -> f32 {
    match op {
        BinOp::Add => |a, b| a + b,
        BinOp::Sub => |a, b| a - b,
        BinOp::Mul => |a, b| a * b,
        BinOp::Div => |a, b| a / b,
        BinOp::Pow => f32::powf,
        BinOp::Max => f32::max,
        BinOp::Min => f32::min,
    }
}

fn f64_op(op: BinOp) -> fn(f64, f64) -> f64 {
    match op {
        BinOp::Add => |a, b| a + b,
        BinOp::Sub => |a, b| a - b,
        BinOp::Mul => |a, b| a * b,
        BinOp::Div => |a, b| a / b,
        BinOp::Pow => f64::powf,
        BinOp::Max => f64::max,
        BinOp::Min => f64::min,
    }
}

/// Integer arithmetic in `i64`; `None` on a division by zero.
fn int_op(op: BinOp, a: i64, b: i64) -> Option<i64> {
    Some(match op {
        BinOp::Add => a.wrapping_add(b),
        BinOp::Sub => a.wrapping_sub(b),
        BinOp::Mul => a.wrapping_mul(b),
        BinOp::Div => {
            if b == 0 {
                return None;
            }
            a.wrapping_div(b)
        }
        BinOp::Pow => match u32::try_from(b) {
            Ok(e) => a.wrapping_pow(e),
            // A negative exponent: 1/a^|b| truncates to 0 unless |a| is 1.
            Err(_) if b < 0 => match a {
                1 => 1,
                -1 => {
                    if b % 2 == 0 {
                        1
                    } else {
                        -1
                    }
                }
                0 => return None,
                _ => 0,
            },
            Err(_) => match a {
                0 | 1 => a,
                -1 => {
                    if b % 2 == 0 {
                        1
                    } else {
                        -1
                    }
                }
                _ => a.wrapping_pow(u32::MAX),
            },
        },
        BinOp::Max => a.max(b),
        BinOp::Min => a.min(b),
    })
}

/// `op(a, b)` with numpy broadcasting; both operands must have the same dtype.
pub(crate) fn binary(op: BinOp, a: &Tensor, b: &Tensor) -> KResult<Tensor> {
    if a.dtype() != b.dtype() {
        return Err(format!(
            "expected operands of the same dtype, found {} and {}",
            a.dtype(),
            b.dtype()
        ));
    }
    let shape = broadcast_shapes(a.shape(), b.shape())?;
    let (sa, sb) = (a.shape(), b.shape());
    let mut div_zero = false;
    macro_rules! ints {
        ($x:expr, $y:expr, $t:ty, $var:ident) => {
            Storage::$var(zip_broadcast($x, sa, $y, sb, &shape, |p, q| {
                match int_op(op, i64::from(p), i64::from(q)) {
                    Some(r) => r as $t,
                    None => {
                        div_zero = true;
                        0
                    }
                }
            }))
        };
    }
    let data = match (a.storage(), b.storage()) {
        (StorageRef::F32(x), StorageRef::F32(y)) if sa == sb && x.len() >= PAR_MIN => {
            Storage::F32(par_binary_f32(op, x, y))
        }
        (StorageRef::F32(x), StorageRef::F32(y)) if sa == shape.as_slice() => {
            match runs_of(sb, &shape) {
                Some(inner) => Storage::F32(spread_binary_f32(op, x, y, inner, false)),
                None => Storage::F32(zip_broadcast(x, sa, y, sb, &shape, f32_op(op))),
            }
        }
        (StorageRef::F32(x), StorageRef::F32(y)) if sb == shape.as_slice() => {
            match runs_of(sa, &shape) {
                Some(inner) => Storage::F32(spread_binary_f32(op, y, x, inner, true)),
                None => Storage::F32(zip_broadcast(x, sa, y, sb, &shape, f32_op(op))),
            }
        }
        (StorageRef::F32(x), StorageRef::F32(y)) => {
            Storage::F32(zip_broadcast(x, sa, y, sb, &shape, f32_op(op)))
        }
        (StorageRef::F64(x), StorageRef::F64(y)) => {
            Storage::F64(zip_broadcast(x, sa, y, sb, &shape, f64_op(op)))
        }
        (StorageRef::F16(x), StorageRef::F16(y)) => {
            let f = f32_op(op);
            Storage::F16(zip_broadcast(x, sa, y, sb, &shape, |p, q| {
                f16::from_f32(f(p.to_f32(), q.to_f32()))
            }))
        }
        (StorageRef::BF16(x), StorageRef::BF16(y)) => {
            let f = f32_op(op);
            Storage::BF16(zip_broadcast(x, sa, y, sb, &shape, |p, q| {
                bf16::from_f32(f(p.to_f32(), q.to_f32()))
            }))
        }
        (StorageRef::I8(x), StorageRef::I8(y)) => ints!(x, y, i8, I8),
        (StorageRef::U8(x), StorageRef::U8(y)) => ints!(x, y, u8, U8),
        (StorageRef::I32(x), StorageRef::I32(y)) => ints!(x, y, i32, I32),
        (StorageRef::I64(x), StorageRef::I64(y)) => ints!(x, y, i64, I64),
        (StorageRef::Bool(x), StorageRef::Bool(y)) => {
            let f: fn(bool, bool) -> bool = match op {
                BinOp::Add | BinOp::Max => |p, q| p | q,
                BinOp::Mul | BinOp::Min => |p, q| p & q,
                _ => return Err(format!("{op:?} is not defined for bool")),
            };
            Storage::Bool(zip_broadcast(x, sa, y, sb, &shape, f))
        }
        _ => return Err("operand dtypes differ".to_string()),
    };
    if div_zero {
        return Err("integer division by zero".to_string());
    }
    tensor(shape, data)
}

/// Elements from which a same-shape `float32` op runs in chunks on the kernel threads.
const PAR_MIN: usize = 1 << 15;

/// Elements per chunk (and per thread at least) of the chunked `float32` paths.
const CHUNK: usize = 1 << 14;

/// `op(x[i], y[i])` for same-shape `float32` operands, in chunks on the kernel threads (each
/// op's loop compiled on its own, so it vectorises).
fn par_binary_f32(op: BinOp, x: &[f32], y: &[f32]) -> Vec<f32> {
    fn run(x: &[f32], y: &[f32], f: impl Fn(f32, f32) -> f32 + Sync) -> Vec<f32> {
        let t = crate::par::threads_for(x.len(), CHUNK * 2);
        let mut out = vec![0.0f32; x.len()];
        crate::par::for_each_chunk_mut(&mut out, CHUNK, t, |off, c| {
            let (xs, ys) = (&x[off..off + c.len()], &y[off..off + c.len()]);
            for ((d, &p), &q) in c.iter_mut().zip(xs).zip(ys) {
                *d = f(p, q);
            }
        });
        out
    }
    match op {
        BinOp::Add => run(x, y, |a, b| a + b),
        BinOp::Sub => run(x, y, |a, b| a - b),
        BinOp::Mul => run(x, y, |a, b| a * b),
        BinOp::Div => run(x, y, |a, b| a / b),
        BinOp::Pow => run(x, y, f32::powf),
        BinOp::Max => run(x, y, f32::max),
        BinOp::Min => run(x, y, f32::min),
    }
}

/// How an operand of shape `s` broadcast to `shape` reads as whole runs: each of its elements
/// repeated `inner` times in a row, the whole cycled, so that element `i` of the result reads
/// element `(i / inner) % len` of it. That holds when `s`, without its leading 1s, is `shape`'s
/// axes `f..e` followed by 1s only: `inner = 1` for a bias over the last axis or a scalar (the
/// data repeated whole), more for a per-channel scale `(1, C, 1, 1)` over `NCHW` (each value
/// over a plane) or `(C, 1)` over `(N, C, L)`. `Some(inner)` then (the product of `shape`'s
/// axes from `e`); `None` otherwise.
fn runs_of(s: &[usize], shape: &[usize]) -> Option<usize> {
    let s = &s[s.iter().take_while(|&&d| d == 1).count()..];
    let f = shape.len().checked_sub(s.len())?;
    let trail = s.iter().rev().take_while(|&&d| d == 1).count();
    let e = f + s.len() - trail;
    (shape[f..e] == s[..s.len() - trail]).then(|| shape[e..].iter().product())
}

/// `op(x[i], y[(i / inner) % y.len()])` (`op(y[..], x[i])` when `swap`: the broadcast operand
/// is the left one) for `float32` data, in chunks on the kernel threads; the same arithmetic
/// as the broadcasting path, element by element. `inner = 1`: `y` repeated whole ([`runs_of`]:
/// a bias over the last axis, a scalar), each stretch of it one loop; more: each of its values
/// over a run of `inner` elements ([`runs_of`]: a per-channel scale), each run one loop over a
/// broadcast value. (DenseNet-121's batch norms after each concatenation, `(1, 256, 56, 56)` by
/// `(1, 256, 1, 1)`, took 3.3 ms a multiply through the strided path on one thread.)
fn spread_binary_f32(op: BinOp, x: &[f32], y: &[f32], inner: usize, swap: bool) -> Vec<f32> {
    fn run(x: &[f32], y: &[f32], inner: usize, f: impl Fn(f32, f32) -> f32 + Sync) -> Vec<f32> {
        let t = crate::par::threads_for(x.len(), CHUNK * 2);
        let mut out = vec![0.0f32; x.len()];
        if y.is_empty() || inner == 0 {
            return out;
        }
        crate::par::for_each_chunk_mut(&mut out, CHUNK, t, |off, c| {
            let xs = &x[off..off + c.len()];
            if let [q] = y {
                // A scalar: one loop over the chunk (element by element it would not vectorise).
                for (d, &p) in c.iter_mut().zip(xs) {
                    *d = f(p, *q);
                }
                return;
            }
            let mut i = 0;
            while i < c.len() {
                let at = off + i;
                let n = if inner == 1 {
                    // A stretch of `y` from where the chunk is in it.
                    let j = at % y.len();
                    let n = (y.len() - j).min(c.len() - i);
                    for ((d, &p), &q) in c[i..i + n].iter_mut().zip(&xs[i..i + n]).zip(&y[j..j + n])
                    {
                        *d = f(p, q);
                    }
                    n
                } else {
                    let q = y[(at / inner) % y.len()];
                    let n = (inner - at % inner).min(c.len() - i);
                    for (d, &p) in c[i..i + n].iter_mut().zip(&xs[i..i + n]) {
                        *d = f(p, q);
                    }
                    n
                };
                i += n;
            }
        });
        out
    }
    macro_rules! go {
        ($f:expr) => {{
            let f = $f;
            if swap {
                run(x, y, inner, |p, q| f(q, p))
            } else {
                run(x, y, inner, f)
            }
        }};
    }
    match op {
        BinOp::Add => go!(|a: f32, b: f32| a + b),
        BinOp::Sub => go!(|a: f32, b: f32| a - b),
        BinOp::Mul => go!(|a: f32, b: f32| a * b),
        BinOp::Div => go!(|a: f32, b: f32| a / b),
        BinOp::Pow => go!(f32::powf),
        BinOp::Max => go!(f32::max),
        BinOp::Min => go!(f32::min),
    }
}

/// `relu(add(a, b))` for same-shape `float32` tensors in one pass (the sum rounds to `f32`
/// first, as the two ops do); `None` for other operands.
pub(crate) fn add_relu_f32(a: &Tensor, b: &Tensor) -> Option<Tensor> {
    let (x, y) = (a.as_f32()?, b.as_f32()?);
    if a.shape() != b.shape() {
        return None;
    }
    let t = crate::par::threads_for(x.len(), CHUNK * 2);
    let mut out = vec![0.0f32; x.len()];
    crate::par::for_each_chunk_mut(&mut out, CHUNK, t, |off, c| {
        let (xs, ys) = (&x[off..off + c.len()], &y[off..off + c.len()]);
        for ((d, &p), &q) in c.iter_mut().zip(xs).zip(ys) {
            let v = p + q;
            *d = if v > 0.0 || v.is_nan() { v } else { 0.0 };
        }
    });
    Tensor::new(a.shape().to_vec(), Storage::F32(out)).ok()
}

/// `relu` of `float32` data, in chunks on the kernel threads.
fn par_relu_f32(x: &[f32]) -> Vec<f32> {
    let t = crate::par::threads_for(x.len(), CHUNK * 2);
    let mut out = vec![0.0f32; x.len()];
    crate::par::for_each_chunk_mut(&mut out, CHUNK, t, |off, c| {
        let xs = &x[off..off + c.len()];
        for (d, &v) in c.iter_mut().zip(xs) {
            *d = if v > 0.0 || v.is_nan() { v } else { 0.0 };
        }
    });
    out
}

/// A unary float function, given in `f32` and `f64` forms, and optionally as an in-place
/// `f32` row kernel giving the same bits as `f32` element by element but vectorised (the
/// branch-free approximations: `erf`, `gelu`).
pub(crate) struct FloatFn {
    f32: fn(f32) -> f32,
    f64: fn(f64) -> f64,
    row32: Option<fn(&mut [f32])>,
}

/// `row[j] = f(row[j])`, compiled through [`crate::simd::dispatch`] (`f` inlined: a
/// branch-free `f` vectorises).
#[inline(always)]
fn map_row32<F: Fn(f32) -> f32>(row: &mut [f32], f: F) {
    struct Op<'a, F>(&'a mut [f32], F);
    impl<F: Fn(f32) -> f32> pulp::WithSimd for Op<'_, F> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            let Op(row, f) = self;
            row.iter_mut().for_each(|x| *x = f(*x));
        }
    }
    crate::simd::dispatch(Op(row, f));
}

/// `erf32` over a row, vectorised.
fn erf32_row(row: &mut [f32]) {
    map_row32(row, erf32);
}

/// `sigmoid32` over a row, vectorised.
fn sigmoid32_row(row: &mut [f32]) {
    map_row32(row, sigmoid32);
}

/// SiLU, [`silu32`], over a row, vectorised.
fn silu32_row(row: &mut [f32]) {
    map_row32(row, silu32);
}

/// Applies a float function elementwise (float dtypes only).
pub(crate) fn unary_float(t: &Tensor, f: &FloatFn) -> KResult<Tensor> {
    let data = match t.storage() {
        StorageRef::F32(v) if v.len() >= PAR_MIN => {
            let mut out = vec![0.0f32; v.len()];
            let n = crate::par::threads_for(v.len(), PAR_MIN / 2);
            crate::par::for_each_chunk_mut(&mut out, v.len().div_ceil(n), n, |off, c| {
                if let Some(row) = f.row32 {
                    c.copy_from_slice(&v[off..off + c.len()]);
                    row(c);
                } else {
                    for (o, &x) in c.iter_mut().zip(&v[off..]) {
                        *o = (f.f32)(x);
                    }
                }
            });
            Storage::F32(out)
        }
        StorageRef::F32(v) => Storage::F32(v.iter().map(|&x| (f.f32)(x)).collect()),
        StorageRef::F64(v) => Storage::F64(v.iter().map(|&x| (f.f64)(x)).collect()),
        StorageRef::F16(v) => Storage::F16(
            v.iter()
                .map(|x| f16::from_f32((f.f32)(x.to_f32())))
                .collect(),
        ),
        StorageRef::BF16(v) => Storage::BF16(
            v.iter()
                .map(|x| bf16::from_f32((f.f32)(x.to_f32())))
                .collect(),
        ),
        s => {
            return Err(format!(
                "expected the input to have a float dtype, found {}",
                s.dtype()
            ));
        }
    };
    tensor(t.shape().to_vec(), data)
}

/// `1 / (1 + e^-x)` in `f32`, `e^-x` through [`crate::attention::exp32`] (within 2.5 ulp of
/// `expf`, tested), so the loops over it vectorise instead of calling libm's `expf` per
/// element (LLaMA's SiLU-gated MLPs spent about 4% of a run there). Below -88.3, where
/// `exp32` clamps, the result is 0 (`expf` overflows to `inf` from -88.73: the same 0 there,
/// denormals of at most 5e-39 between). NaN stays NaN; `+inf` gives 1, `-inf` 0.
#[inline(always)]
pub(crate) fn sigmoid32(x: f32) -> f32 {
    // `exp32`'s underflow to 0 (of `-x < -87.3`) would change nothing here: `1 + e` is 1
    // either way, the clamped value being below half an ulp of 1.
    let s = 1.0 / (1.0 + crate::attention::exp32_clamped(-x));
    if x < -88.3 { 0.0 } else { s }
}

/// SiLU in `f32`: `x · sigmoid32(x)` (the `silu` kernel, the elementwise programs' `silu`
/// instruction and a convolution epilogue's [`crate::conv::Step::Silu`]).
#[inline(always)]
pub(crate) fn silu32(x: f32) -> f32 {
    x * sigmoid32(x)
}

/// The constants of [`silu32_vec`], in its order of use: the clamp's bounds, `log2 e`, the
/// rounding constant, the two parts of `ln 2`, the polynomial's six coefficients, 1, the
/// sigmoid's cut and 0.
pub(crate) static SILU_K: [f32; 15] = [
    -87.3,
    88.3,
    std::f32::consts::LOG2_E,
    12_582_912.0,
    0.693_359_4,
    -2.121_944_4e-4,
    1.987_569_1e-4,
    1.398_2e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
    1.0,
    -88.3,
    0.0,
];

/// [`silu32`] on each lane of a vector, written with the vector operations themselves, for a
/// kernel that applies it to sums held in registers: the same operations in the same order as
/// the scalar code (the clamp as two compares and selects, the multiply-adds fused on every
/// target by `mul_add_e`, `2^n` from `t`'s bits), so each lane gets [`silu32`]'s bits
/// (tested on every class of value; NaN stays NaN). About 25 vector operations. `k` is
/// [`SILU_K`]: a kernel passes it through `std::hint::black_box` so that the compiler loads
/// the constants where they are used, rather than keeping fifteen of them in registers across
/// the kernel's loops (with AVX2's 16 registers, that spilled a 5×5 depthwise tile's sums).
#[inline(always)]
pub(crate) fn silu32_vec<S: pulp::Simd>(simd: S, k: &[f32; 15], x: S::f32s) -> S::f32s {
    let c = |i: usize| simd.splat_f32s(k[i]);
    // `exp32_clamped(-x)`: `-x` clamped to `[-87.3, 88.3]`, NaN kept (no compare holds).
    let nx = simd.neg_f32s(x);
    let (lo, hi) = (c(0), c(1));
    let xc = simd.select_f32s(simd.less_than_f32s(nx, lo), lo, nx);
    let xc = simd.select_f32s(simd.greater_than_f32s(xc, hi), hi, xc);
    let magic = c(3);
    let t = simd.mul_add_e_f32s(xc, c(2), magic);
    let n = simd.sub_f32s(t, magic);
    let r = simd.mul_add_e_f32s(simd.neg_f32s(n), c(4), xc);
    let r = simd.mul_add_e_f32s(simd.neg_f32s(n), c(5), r);
    let mut y = c(6);
    for i in 7..12 {
        y = simd.mul_add_e_f32s(y, r, c(i));
    }
    let one = c(12);
    let y = simd.add_f32s(simd.mul_add_e_f32s(simd.mul_f32s(y, r), r, r), one);
    let bits = simd.transmute_u32s_f32s(t);
    let bits = simd.add_u32s(
        simd.sub_u32s(bits, simd.transmute_u32s_f32s(magic)),
        simd.splat_u32s(127),
    );
    let scale = simd.transmute_f32s_u32s(simd.wrapping_dyn_shl_u32s(bits, simd.splat_u32s(23)));
    let e = simd.mul_f32s(y, scale);
    // `sigmoid32`: `1 / (1 + e)`, 0 below -88.3.
    let s = simd.div_f32s(one, simd.add_f32s(one, e));
    let s = simd.select_f32s(simd.less_than_f32s(x, c(13)), c(14), s);
    simd.mul_f32s(x, s)
}

fn sigmoid64(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The error function: musl's `erf` (through the `libm` crate), accurate to an ulp.
pub(crate) fn erf64(x: f64) -> f64 {
    libm::erf(x)
}

/// GELU (erf form) in `f32` with [`erf32`]; also the loop of the fused GELU kernel.
#[inline(always)]
pub(crate) fn gelu32(x: f32) -> f32 {
    x * (0.5 * (erf32(x / std::f32::consts::SQRT_2) + 1.0))
}

fn gelu64(x: f64) -> f64 {
    0.5 * x * (1.0 + erf64(x * std::f64::consts::FRAC_1_SQRT_2))
}

/// GELU's tanh form in `f64`, as its definition reads (the `float64` kernel, and what
/// [`gelu_tanh32`] is tested against).
pub(crate) fn gelu_tanh64(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
}

/// GELU's tanh form in `f32` (the `gelu_tanh` kernel, the `cpu.gelu_tanh` composite and the
/// dense layers' epilogue):
/// `0.5 x (1 + tanh(y))` with `y = √(2/π) (x + 0.044715 x³)`, written as the same function
/// `x · sigmoid(2y) = x / (1 + e^{-2y})` (`1 + tanh(y) = 2 · sigmoid(2y)`), `e^{-2y}` through
/// [`crate::attention::exp32`] and `y` as `x · (√(2/π) + √(2/π) · 0.044715 · x²)` in one
/// `mul_add`. One `exp` and one division, no `1 + tanh` cancelling for negative `x`; within
/// 6e-7 of the `f64` definition (tested). On AVX2 its loop takes 0.57 of the time of the
/// `tanh` form through `exp32` with separate multiplies and adds (bench/RESULTS.md, session
/// bw). `±inf` give `±inf` (the `-inf` limit of the exact form is 0; the ops one by one give
/// NaN there), NaN stays NaN.
#[inline(always)]
pub(crate) fn gelu_tanh32(v: f32) -> f32 {
    let c = (2.0f32 / std::f32::consts::PI).sqrt();
    let y = (v * v).mul_add(c * 0.044715, c) * v;
    v / (1.0 + crate::attention::exp32(-2.0 * y))
}

/// The float function of a unary op.
pub(crate) fn float_fn(name: &str) -> Option<FloatFn> {
    Some(match name {
        "exp" => FloatFn {
            f32: f32::exp,
            f64: f64::exp,
            row32: None,
        },
        "log" => FloatFn {
            f32: f32::ln,
            f64: f64::ln,
            row32: None,
        },
        "sqrt" => FloatFn {
            f32: f32::sqrt,
            f64: f64::sqrt,
            row32: None,
        },
        "rsqrt" => FloatFn {
            f32: |x| 1.0 / x.sqrt(),
            f64: |x| 1.0 / x.sqrt(),
            row32: None,
        },
        "tanh" => FloatFn {
            f32: f32::tanh,
            f64: f64::tanh,
            row32: None,
        },
        "sigmoid" => FloatFn {
            f32: sigmoid32,
            f64: sigmoid64,
            row32: Some(sigmoid32_row),
        },
        "erf" => FloatFn {
            f32: erf32,
            f64: erf64,
            row32: Some(erf32_row),
        },
        "gelu" => FloatFn {
            f32: gelu32,
            f64: gelu64,
            row32: Some(|row| crate::dense::bias_act(row, None, crate::dense::Act::Gelu)),
        },
        "gelu_tanh" => FloatFn {
            f32: gelu_tanh32,
            f64: gelu_tanh64,
            row32: Some(|row| crate::dense::bias_act(row, None, crate::dense::Act::GeluTanh)),
        },
        "silu" => FloatFn {
            f32: |x| x * sigmoid32(x),
            f64: |x| x * sigmoid64(x),
            row32: Some(silu32_row),
        },
        _ => return None,
    })
}

/// `negative`, `abs` or `relu`: defined for floats and integers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SignOp {
    Neg,
    Abs,
    Relu,
}

/// Applies a [`SignOp`] elementwise.
pub(crate) fn sign_op(t: &Tensor, op: SignOp) -> KResult<Tensor> {
    macro_rules! float {
        ($v:expr, $to:expr, $from:expr) => {
            $v.iter()
                .map(|&x| {
                    let x = $to(x);
                    $from(match op {
                        SignOp::Neg => -x,
                        SignOp::Abs => x.abs(),
                        // NaN stays NaN; -0.0 and negatives become +0.0.
                        SignOp::Relu => {
                            if x > 0.0 || x.is_nan() {
                                x
                            } else {
                                0.0
                            }
                        }
                    })
                })
                .collect()
        };
    }
    macro_rules! int {
        ($v:expr) => {
            $v.iter()
                .map(|&x| match op {
                    SignOp::Neg => x.wrapping_neg(),
                    SignOp::Abs => x.wrapping_abs(),
                    SignOp::Relu => x.max(0),
                })
                .collect()
        };
    }
    let id32 = |x: f32| x;
    let id64 = |x: f64| x;
    let data = match t.storage() {
        StorageRef::F32(v) if op == SignOp::Relu && v.len() >= PAR_MIN => {
            Storage::F32(par_relu_f32(v))
        }
        StorageRef::F32(v) => Storage::F32(float!(v, id32, id32)),
        StorageRef::F64(v) => Storage::F64(float!(v, id64, id64)),
        StorageRef::F16(v) => Storage::F16(float!(v, f16::to_f32, f16::from_f32)),
        StorageRef::BF16(v) => Storage::BF16(float!(v, bf16::to_f32, bf16::from_f32)),
        StorageRef::I8(v) => Storage::I8(int!(v)),
        StorageRef::I32(v) => Storage::I32(int!(v)),
        StorageRef::I64(v) => Storage::I64(int!(v)),
        StorageRef::U8(v) => match op {
            SignOp::Neg => Storage::U8(v.iter().map(|x| x.wrapping_neg()).collect()),
            SignOp::Abs | SignOp::Relu => Storage::U8(v.to_vec()),
        },
        StorageRef::Bool(v) => match op {
            SignOp::Abs | SignOp::Relu => Storage::Bool(v.to_vec()),
            SignOp::Neg => return Err("negative is not defined for bool".to_string()),
        },
    };
    tensor(t.shape().to_vec(), data)
}

/// `clip(x, lo, hi)`: `min(max(x, lo), hi)` in the input's dtype.
pub(crate) fn clip(t: &Tensor, lo: Prim, hi: Prim) -> KResult<Tensor> {
    let (l, h) = (lo.as_f64(), hi.as_f64());
    macro_rules! int {
        ($v:expr, $t:ty) => {{
            let li = match lo {
                Prim::Int(i) => i,
                Prim::Float(f) => f.ceil() as i64,
            };
            let hi_ = match hi {
                Prim::Int(i) => i,
                Prim::Float(f) => f.floor() as i64,
            };
            $v.iter()
                .map(|&x| (i64::from(x).max(li).min(hi_)) as $t)
                .collect()
        }};
    }
    let data = match t.storage() {
        StorageRef::F32(v) => {
            let (l, h) = (l as f32, h as f32);
            Storage::F32(v.iter().map(|&x| x.max(l).min(h)).collect())
        }
        StorageRef::F64(v) => Storage::F64(v.iter().map(|&x| x.max(l).min(h)).collect()),
        StorageRef::F16(v) => {
            let (l, h) = (l as f32, h as f32);
            Storage::F16(
                v.iter()
                    .map(|x| f16::from_f32(x.to_f32().max(l).min(h)))
                    .collect(),
            )
        }
        StorageRef::BF16(v) => {
            let (l, h) = (l as f32, h as f32);
            Storage::BF16(
                v.iter()
                    .map(|x| bf16::from_f32(x.to_f32().max(l).min(h)))
                    .collect(),
            )
        }
        StorageRef::I8(v) => Storage::I8(int!(v, i8)),
        StorageRef::U8(v) => Storage::U8(int!(v, u8)),
        StorageRef::I32(v) => Storage::I32(int!(v, i32)),
        StorageRef::I64(v) => Storage::I64(int!(v, i64)),
        StorageRef::Bool(_) => return Err("clip is not defined for bool".to_string()),
    };
    tensor(t.shape().to_vec(), data)
}

/// `astype`: a dtype conversion (floats round to nearest even, float to int truncates toward
/// zero and saturates, int to int wraps, to bool is `!= 0`).
pub(crate) fn astype(t: &Tensor, dtype: DType) -> Tensor {
    t.cast(dtype)
}

/// `bitcast`: each element's bits read as `dtype` of the same width (little-endian, so the
/// same on every host). A byte read as `bool` must be 0 or 1 (any other value is an error, not
/// a `bool` with an invalid bit pattern).
pub(crate) fn bitcast(t: &Tensor, dtype: DType) -> KResult<Tensor> {
    let from = t.dtype();
    if from.size_bytes() != dtype.size_bytes() {
        return Err(format!(
            "cannot reinterpret {from} ({} bytes) as {dtype} ({} bytes)",
            from.size_bytes(),
            dtype.size_bytes()
        ));
    }
    let bits: Vec<u64> = match t.storage() {
        StorageRef::F16(v) => v.iter().map(|x| u64::from(x.to_bits())).collect(),
        StorageRef::BF16(v) => v.iter().map(|x| u64::from(x.to_bits())).collect(),
        StorageRef::F32(v) => v.iter().map(|x| u64::from(x.to_bits())).collect(),
        StorageRef::F64(v) => v.iter().map(|x| x.to_bits()).collect(),
        StorageRef::I8(v) => v.iter().map(|&x| u64::from(x as u8)).collect(),
        StorageRef::U8(v) => v.iter().map(|&x| u64::from(x)).collect(),
        StorageRef::I32(v) => v.iter().map(|&x| u64::from(x as u32)).collect(),
        StorageRef::I64(v) => v.iter().map(|&x| x as u64).collect(),
        StorageRef::Bool(v) => v.iter().map(|&x| u64::from(x)).collect(),
    };
    // Truncations below keep exactly the `size_bytes` low bytes the source filled.
    let data = match dtype {
        DType::F16 => Storage::F16(bits.iter().map(|&b| f16::from_bits(b as u16)).collect()),
        DType::BF16 => Storage::BF16(bits.iter().map(|&b| bf16::from_bits(b as u16)).collect()),
        DType::F32 => Storage::F32(bits.iter().map(|&b| f32::from_bits(b as u32)).collect()),
        DType::F64 => Storage::F64(bits.iter().map(|&b| f64::from_bits(b)).collect()),
        DType::I8 => Storage::I8(bits.iter().map(|&b| b as u8 as i8).collect()),
        DType::U8 => Storage::U8(bits.iter().map(|&b| b as u8).collect()),
        DType::I32 => Storage::I32(bits.iter().map(|&b| b as u32 as i32).collect()),
        DType::I64 => Storage::I64(bits.iter().map(|&b| b as i64).collect()),
        DType::Bool => Storage::Bool(
            bits.iter()
                .enumerate()
                .map(|(i, &b)| match b {
                    0 => Ok(false),
                    1 => Ok(true),
                    _ => Err(format!(
                        "element {i}: the byte {b} is not a bool (expected 0 or 1)"
                    )),
                })
                .collect::<KResult<_>>()?,
        ),
    };
    tensor(t.shape().to_vec(), data)
}

/// Inference-mode `dropout`: `(x, ones)`.
pub(crate) fn dropout(t: &Tensor) -> KResult<(Tensor, Tensor)> {
    if !t.dtype().is_float() {
        return Err(format!(
            "expected the input to have a float dtype, found {}",
            t.dtype()
        ));
    }
    let ones = Tensor::full(t.shape().to_vec(), t.dtype(), 1.0).map_err(|e| e.to_string())?;
    Ok((t.clone(), ones))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`silu32_vec`] gives each lane [`silu32`]'s bits: signed zeros, infinities, NaN,
    /// denormals, both sides of the exponential's clamps (±87.3, ±88.3) and of the sigmoid's
    /// cut to 0 (-88.3), and a million spread bit patterns, on the widest instruction set of
    /// this CPU.
    #[test]
    fn silu_on_vectors_equals_silu_on_scalars() {
        struct Run<'a>(&'a [f32]);
        impl pulp::WithSimd for Run<'_> {
            type Output = Vec<f32>;
            #[inline(always)]
            fn with_simd<S: pulp::Simd>(self, simd: S) -> Vec<f32> {
                let mut out = Vec::with_capacity(self.0.len());
                for c in self.0.chunks_exact(S::F32_LANES) {
                    let v: S::f32s = bytemuck::pod_read_unaligned(bytemuck::cast_slice(c));
                    let y = silu32_vec(simd, &SILU_K, v);
                    out.extend_from_slice(bytemuck::cast_slice(std::slice::from_ref(&y)));
                }
                out
            }
        }
        let mut xs = vec![
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            1e-40,
            -1e-40,
            f32::MAX,
            f32::MIN,
            1.0,
            -1.0,
            0.5,
            -0.5,
        ];
        for edge in [87.3f32, 88.3, 88.72, 89.0, 103.0] {
            for x in [edge, -edge] {
                xs.extend([x.next_down(), x, x.next_up()]);
            }
        }
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for i in 0..1 << 20 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            // Half the patterns anywhere, half within ±128 where the function is not flat.
            xs.push(if i % 2 == 0 {
                f32::from_bits(seed as u32)
            } else {
                (seed >> 40) as f32 / (1u64 << 24) as f32 * 256.0 - 128.0
            });
        }
        xs.resize(xs.len().next_multiple_of(16), 1.0);
        let got = crate::simd::dispatch(Run(&xs));
        assert_eq!(got.len(), xs.len());
        for (&x, &y) in xs.iter().zip(&got) {
            let want = silu32(x);
            assert!(
                y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan()),
                "silu32_vec({x:e} = {:#x}) = {y:e}, silu32 gives {want:e}",
                x.to_bits()
            );
        }
    }

    /// [`spread_binary_f32`] of `full` by `rep` (either operand order, and through [`binary`])
    /// against the broadcasting path, bit for bit, for every op; a NaN in the broadcast operand.
    fn spread_matches(full: &[usize], rep: &[usize], inner: usize) {
        let ops = [
            BinOp::Add,
            BinOp::Sub,
            BinOp::Mul,
            BinOp::Div,
            BinOp::Pow,
            BinOp::Max,
            BinOp::Min,
        ];
        let n: usize = full.iter().product();
        let m: usize = rep.iter().product();
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 37) % 101) as f32 / 17.0 - 2.5)
            .collect();
        let mut y: Vec<f32> = (0..m)
            .map(|i| ((i * 53) % 89) as f32 / 13.0 - 3.0)
            .collect();
        y[m / 2] = f32::NAN;
        let shape = broadcast_shapes(full, rep).unwrap();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let (tx, ty) = (
            Tensor::from_f32(full.to_vec(), x.clone()).unwrap(),
            Tensor::from_f32(rep.to_vec(), y.clone()).unwrap(),
        );
        for op in ops {
            // Both operand orders: the broadcast operand on the right, then on the left.
            for swap in [false, true] {
                let ((a, sa, ta), (b, sb, tb)) = if swap {
                    ((&y, rep, &ty), (&x, full, &tx))
                } else {
                    ((&x, full, &tx), (&y, rep, &ty))
                };
                let want = zip_broadcast(a, sa, b, sb, &shape, f32_op(op));
                let got = spread_binary_f32(op, &x, &y, inner, swap);
                assert_eq!(bits(&got), bits(&want), "{op:?} {sa:?} by {sb:?}");
                let got = binary(op, ta, tb).unwrap();
                let StorageRef::F32(g) = got.storage() else {
                    unreachable!()
                };
                assert_eq!(bits(g), bits(&want), "binary {op:?} {sa:?} by {sb:?}");
            }
        }
    }

    #[test]
    fn repeated_operands_give_the_broadcasting_paths_bits() {
        // (full shape, repeated operand's shape); sizes past CHUNK cross chunk boundaries.
        let cases: [(&[usize], &[usize]); 5] = [
            (&[2, 3], &[3]),
            (&[1, 128, 768], &[768]),
            (&[4, 5, 7], &[1, 5, 7]),
            (&[3, 9000], &[]),
            (&[6], &[1, 1, 6]),
        ];
        for (full, rep) in cases {
            assert_eq!(runs_of(rep, full), Some(1), "{rep:?} over {full:?}");
            spread_matches(full, rep, 1);
        }
    }

    #[test]
    fn operands_read_as_runs_give_the_broadcasting_paths_bits() {
        // (full shape, broadcast operand's shape, its runs); sizes past CHUNK cross chunk
        // boundaries mid-run.
        let cases: [(&[usize], &[usize], usize); 7] = [
            (&[1, 256, 56, 56], &[1, 256, 1, 1], 3136),
            (&[2, 3, 7, 7], &[3, 1, 1], 49),
            (&[2, 5, 3], &[1, 5, 1], 3),
            (&[4, 6, 10], &[4, 6, 1], 10),
            (&[3, 3000, 7], &[3000, 1], 7),
            (&[2, 4, 5, 6], &[4, 5, 1], 6),
            (&[8, 3], &[8, 1], 3),
        ];
        for (full, rep, inner) in cases {
            assert_eq!(runs_of(rep, full), Some(inner), "{rep:?} over {full:?}");
            spread_matches(full, rep, inner);
        }
        // Not runs: a middle axis broadcast, a mismatched axis. A scalar is the data
        // repeated whole; leading 1s count for nothing on either side.
        assert_eq!(runs_of(&[2, 1, 3], &[2, 4, 3]), None);
        assert_eq!(runs_of(&[3, 1], &[2, 4, 1]), None);
        assert_eq!(runs_of(&[1, 1], &[4, 4]), Some(1));
        assert_eq!(runs_of(&[1, 5, 1, 1], &[5, 1, 1]), Some(1));
        assert_eq!(runs_of(&[5, 1, 1], &[1, 5, 1, 1]), Some(1));
    }

    #[test]
    fn erf_matches_reference_values() {
        let cases = [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (2.9, 0.999_958_902_121_900_4),
            (3.0, 0.999_977_909_503_001_4),
            (4.5, 0.999_999_999_803_383),
            (-1.0, -0.842_700_792_949_714_9),
        ];
        for (x, want) in cases {
            let got = erf64(x);
            assert!((got - want).abs() < 1e-13, "erf({x}) = {got}, want {want}");
        }
    }

    #[test]
    fn int_division_truncates_and_rejects_zero() {
        assert_eq!(int_op(BinOp::Div, -7, 2), Some(-3));
        assert_eq!(int_op(BinOp::Div, 7, 0), None);
        assert_eq!(int_op(BinOp::Pow, 3, 4), Some(81));
        assert_eq!(int_op(BinOp::Pow, 3, -1), Some(0));
    }

    #[test]
    fn bitcast_reinterprets_the_bits_and_back() {
        let x = Tensor::new(vec![4], Storage::F32(vec![1.0, -2.5, 0.0, f32::NAN]))
            .unwrap_or_else(|e| panic!("{e}"));
        let i = bitcast(&x, DType::I32).unwrap_or_else(|e| panic!("{e}"));
        // 1.0f32 = 0x3F800000, -2.5f32 = 0xC0200000, NaN as Rust writes it = 0x7FC00000.
        assert_eq!(
            i.storage(),
            StorageRef::I32(&[0x3F80_0000, 0xC020_0000_u32 as i32, 0, 0x7FC0_0000])
        );
        let back = bitcast(&i, DType::F32).unwrap_or_else(|e| panic!("{e}"));
        let (StorageRef::F32(a), StorageRef::F32(b)) = (x.storage(), back.storage()) else {
            unreachable!()
        };
        assert!(a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits()));
        let h = Tensor::new(
            vec![2],
            Storage::F16(vec![f16::from_f32(1.0), f16::from_f32(-0.5)]),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let b16 = bitcast(&h, DType::BF16).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            b16.storage(),
            StorageRef::BF16(&[bf16::from_bits(0x3C00), bf16::from_bits(0xB800)])
        );
        let s = Tensor::new(vec![3], Storage::I8(vec![-1, 0, 1])).unwrap_or_else(|e| panic!("{e}"));
        let u = bitcast(&s, DType::U8).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(u.storage(), StorageRef::U8(&[255, 0, 1]));
        let flags = bitcast(
            &Tensor::new(vec![2], Storage::U8(vec![1, 0])).unwrap_or_else(|e| panic!("{e}")),
            DType::Bool,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(flags.storage(), StorageRef::Bool(&[true, false]));
        let e = bitcast(&u, DType::Bool).err().unwrap_or_default();
        assert!(e.contains("element 0: the byte 255 is not a bool"), "{e}");
        assert!(bitcast(&x, DType::I64).is_err_and(|e| e.contains("4 bytes")));
    }
}
