//! Reductions (`sum`, `mean`, `max`, `min`, `prod`) over any set of axes, and `softmax` /
//! `log_softmax` along one axis.
//!
//! Float reductions accumulate in `f64` and round once to the input dtype; integer `sum` and
//! `prod` wrap in `i64`, integer `mean` truncates toward zero. A reduction over an empty
//! extent gives its identity (ONNX's definition): 0 for `sum`, 1 for `prod`, -inf / +inf for
//! `max` / `min` of floats and the dtype's smallest / largest value for integers and `bool`;
//! an integer `mean` over an empty extent is an error. `float32` softmax along the last axis
//! runs in `f32` (vectorised, within a few ulp of the `f64` definition); see [`softmax_rows32`].
//!
//! ```text
//! s: R.Tensor((3, 1), dtype="float32") = R.sum(x, axis=[1], keepdims=True)   # x: (3, 17)
//! p: R.Tensor((3, 17), dtype="float32") = R.nn.softmax(x, axis=-1)            # rows sum to 1
//! ```

use crate::util::{KResult, floats, from_f64, norm_axes, norm_axis, strides, tensor};
use fusebox_core::runtime::{Storage, StorageRef, Tensor};

/// Calls `f(i, o1, o2)` for every input index `i` in row-major order, where `o1`/`o2` are
/// `Σ idx_k * s1[k]` / `Σ idx_k * s2[k]`.
pub(crate) fn walk2(
    shape: &[usize],
    s1: &[usize],
    s2: &[usize],
    mut f: impl FnMut(usize, usize, usize),
) {
    let total: usize = shape.iter().product();
    if total == 0 {
        return;
    }
    let r = shape.len();
    if r == 0 {
        f(0, 0, 0);
        return;
    }
    let inner = shape[r - 1];
    let (i1, i2) = (s1[r - 1], s2[r - 1]);
    let mut idx = vec![0usize; r - 1];
    let (mut b1, mut b2) = (0usize, 0usize);
    let mut i = 0usize;
    loop {
        let (mut p1, mut p2) = (b1, b2);
        for _ in 0..inner {
            f(i, p1, p2);
            i += 1;
            p1 += i1;
            p2 += i2;
        }
        let mut k = r - 1;
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            idx[k] += 1;
            b1 += s1[k];
            b2 += s2[k];
            if idx[k] < shape[k] {
                break;
            }
            b1 -= s1[k] * shape[k];
            b2 -= s2[k] * shape[k];
            idx[k] = 0;
        }
    }
}

/// How the axes of a reduction split a shape.
pub(crate) struct Reduction {
    /// Extents of the kept axes, in order.
    pub kept: Vec<usize>,
    /// Per input axis: the stride of the kept index (0 on reduced axes).
    pub kept_strides: Vec<usize>,
    /// Per input axis: the stride of the reduced index in the order `axes` lists them
    /// (0 on kept axes).
    pub red_strides: Vec<usize>,
    /// Elements reduced into each output.
    pub count: usize,
}

impl Reduction {
    /// Splits `shape` by the (normalised, distinct) `axes`.
    pub(crate) fn new(shape: &[usize], axes: &[usize]) -> Reduction {
        let kept: Vec<usize> = (0..shape.len())
            .filter(|i| !axes.contains(i))
            .map(|i| shape[i])
            .collect();
        let ks = strides(&kept);
        let mut kept_strides = vec![0usize; shape.len()];
        let mut j = 0;
        for (i, slot) in kept_strides.iter_mut().enumerate() {
            if !axes.contains(&i) {
                *slot = ks[j];
                j += 1;
            }
        }
        let red: Vec<usize> = axes.iter().map(|&a| shape[a]).collect();
        let rs = strides(&red);
        let mut red_strides = vec![0usize; shape.len()];
        for (&a, &s) in axes.iter().zip(&rs) {
            red_strides[a] = s;
        }
        Reduction {
            kept,
            kept_strides,
            red_strides,
            count: red.iter().product(),
        }
    }
}

/// Which reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
}

/// The smallest and largest value of an integer (or `bool`) dtype, as `i64`.
fn int_bounds(d: fusebox_core::ir::DType) -> (i64, i64) {
    use fusebox_core::ir::DType;
    match d {
        DType::I8 => (i64::from(i8::MIN), i64::from(i8::MAX)),
        DType::U8 => (0, i64::from(u8::MAX)),
        DType::I32 => (i64::from(i32::MIN), i64::from(i32::MAX)),
        DType::Bool => (0, 1),
        _ => (i64::MIN, i64::MAX),
    }
}

/// `sum`/`mean`/`max`/`min`/`prod` over `axis` (`None`: all), keeping reduced axes as 1s when `keepdims`.
pub(crate) fn reduce(
    t: &Tensor,
    op: ReduceOp,
    axis: Option<&[i64]>,
    keepdims: bool,
) -> KResult<Tensor> {
    let r = t.rank();
    let axes = match axis {
        Some(a) => norm_axes(a, r)?,
        None => (0..r).collect(),
    };
    let red = Reduction::new(t.shape(), &axes);
    let out_shape: Vec<usize> = if keepdims {
        (0..r)
            .map(|i| if axes.contains(&i) { 1 } else { t.shape()[i] })
            .collect()
    } else {
        red.kept.clone()
    };
    let n_out: usize = red.kept.iter().product();
    let walk = Walk {
        shape: t.shape(),
        kept_strides: &red.kept_strides,
        zeros: &vec![0usize; r],
    };
    // The elements are read where they are (converted one at a time): the only buffer besides
    // the input is the output's accumulator.
    let data = if t.dtype().is_float() {
        let mut acc = match t.storage() {
            StorageRef::F32(x) => float_acc(x, f64::from, op, n_out, walk),
            StorageRef::F64(x) => float_acc(x, |v| v, op, n_out, walk),
            StorageRef::F16(x) => float_acc(x, |v| v.to_f64(), op, n_out, walk),
            StorageRef::BF16(x) => float_acc(x, |v| v.to_f64(), op, n_out, walk),
            s => return Err(format!("unexpected storage of {}", s.dtype())),
        };
        if op == ReduceOp::Mean {
            let c = red.count as f64;
            acc.iter_mut().for_each(|a| *a /= c);
        }
        Storage::from_f64(t.dtype(), acc)
    } else {
        let (lo, hi) = int_bounds(t.dtype());
        let init = match op {
            ReduceOp::Max => lo,
            ReduceOp::Min => hi,
            ReduceOp::Prod => 1,
            ReduceOp::Sum | ReduceOp::Mean => 0,
        };
        let mut acc = match t.storage() {
            StorageRef::I8(x) => int_acc(x, i64::from, op, init, n_out, walk),
            StorageRef::U8(x) => int_acc(x, i64::from, op, init, n_out, walk),
            StorageRef::I32(x) => int_acc(x, i64::from, op, init, n_out, walk),
            StorageRef::I64(x) => int_acc(x, |v| v, op, init, n_out, walk),
            StorageRef::Bool(x) => int_acc(x, i64::from, op, init, n_out, walk),
            s => return Err(format!("unexpected storage of {}", s.dtype())),
        };
        if op == ReduceOp::Mean {
            let c = i64::try_from(red.count).map_err(|_| "too many elements".to_string())?;
            if c == 0 {
                return Err("integer mean over an empty extent".to_string());
            }
            acc.iter_mut().for_each(|a| *a /= c);
        }
        Storage::from_i64(t.dtype(), acc)
    };
    tensor(out_shape, data)
}

/// The walk of a reduction: every input index with the index of its output.
#[derive(Clone, Copy)]
struct Walk<'a> {
    shape: &'a [usize],
    kept_strides: &'a [usize],
    zeros: &'a [usize],
}

impl Walk<'_> {
    fn run(self, mut f: impl FnMut(usize, usize)) {
        walk2(self.shape, self.kept_strides, self.zeros, |i, o, _| f(i, o));
    }
}

/// A float reduction's `f64` accumulators: `walk` visits (input index, output index) for every
/// input element; `get` widens one element.
fn float_acc<T: Copy>(
    x: &[T],
    get: impl Fn(T) -> f64,
    op: ReduceOp,
    n_out: usize,
    walk: Walk<'_>,
) -> Vec<f64> {
    let init = match op {
        ReduceOp::Max => f64::NEG_INFINITY,
        ReduceOp::Min => f64::INFINITY,
        ReduceOp::Prod => 1.0,
        ReduceOp::Sum | ReduceOp::Mean => 0.0,
    };
    let mut acc = vec![init; n_out];
    match op {
        ReduceOp::Max => walk.run(|i, o| {
            let v = get(x[i]);
            // NaN propagates.
            if v > acc[o] || v.is_nan() {
                acc[o] = v;
            }
        }),
        ReduceOp::Min => walk.run(|i, o| {
            let v = get(x[i]);
            if v < acc[o] || v.is_nan() {
                acc[o] = v;
            }
        }),
        ReduceOp::Prod => walk.run(|i, o| acc[o] *= get(x[i])),
        ReduceOp::Sum | ReduceOp::Mean => walk.run(|i, o| acc[o] += get(x[i])),
    }
    acc
}

/// An integer reduction's `i64` accumulators (wrapping), as [`float_acc`].
fn int_acc<T: Copy>(
    x: &[T],
    get: impl Fn(T) -> i64,
    op: ReduceOp,
    init: i64,
    n_out: usize,
    walk: Walk<'_>,
) -> Vec<i64> {
    let mut acc = vec![init; n_out];
    match op {
        ReduceOp::Max => walk.run(|i, o| acc[o] = acc[o].max(get(x[i]))),
        ReduceOp::Min => walk.run(|i, o| acc[o] = acc[o].min(get(x[i]))),
        ReduceOp::Prod => walk.run(|i, o| acc[o] = acc[o].wrapping_mul(get(x[i]))),
        ReduceOp::Sum | ReduceOp::Mean => walk.run(|i, o| acc[o] = acc[o].wrapping_add(get(x[i]))),
    }
    acc
}

/// `(outer, len, inner)` of a shape around `axis`.
pub(crate) fn around(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    (outer, shape[axis], inner)
}

/// `softmax` (or `log_softmax` when `log`) along `axis`, computed in `f64` with the max
/// subtracted. `float32` input takes [`softmax_f32`]: along the last axis in `f32` (within a
/// few ulp of this), along another axis the same bits as this.
pub(crate) fn softmax(t: &Tensor, axis: i64, log: bool) -> KResult<Tensor> {
    let axis = norm_axis(axis, t.rank())?;
    let (outer, len, inner) = around(t.shape(), axis);
    if let StorageRef::F32(x) = t.storage() {
        return tensor(
            t.shape().to_vec(),
            Storage::F32(softmax_f32(x, outer, len, inner, log)),
        );
    }
    let x = floats(t, "the input")?;
    let mut out = vec![0.0f64; x.len()];
    for o in 0..outer {
        for i in 0..inner {
            let base = o * len * inner + i;
            let at = |j: usize| base + j * inner;
            let m = (0..len).map(|j| x[at(j)]).fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = (0..len).map(|j| (x[at(j)] - m).exp()).sum();
            for j in 0..len {
                out[at(j)] = if log {
                    x[at(j)] - m - sum.ln()
                } else {
                    (x[at(j)] - m).exp() / sum
                };
            }
        }
    }
    from_f64(t.shape().to_vec(), t.dtype(), out)
}

/// [`softmax`] of `float32` data laid out as `(outer, len, inner)`, the outer slices spread over
/// the kernel threads (each slice is computed by one thread, so the result does not depend on
/// the thread count). Rows along the last axis (`inner == 1`, the common case) take
/// [`softmax_rows32`], in `f32`; other axes keep the `f64` arithmetic of [`softmax`] (the max
/// in `f32`, which is exact; each `exp(x - max)` and the sum in `f64`; one rounding to `f32`).
fn softmax_f32(x: &[f32], outer: usize, len: usize, inner: usize, log: bool) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    let slice = len * inner;
    if slice == 0 {
        return out;
    }
    let n = crate::par::threads_for(x.len(), 1 << 14);
    crate::par::for_each_chunk_mut(
        &mut out,
        slice * outer.div_ceil(n * 4).max(1),
        n,
        |off, chunk| {
            if inner == 1 {
                softmax_rows32(&x[off..off + chunk.len()], chunk, len, log);
                return;
            }
            let mut e = vec![0.0f64; len];
            for (s, dst) in chunk.chunks_mut(slice).enumerate() {
                let src = &x[off + s * slice..off + (s + 1) * slice];
                for i in 0..inner {
                    let m = (0..len)
                        .map(|j| src[j * inner + i])
                        .fold(
                            f32::NEG_INFINITY,
                            |a, v| if v > a || v.is_nan() { v } else { a },
                        );
                    let m = f64::from(m);
                    let mut sum = 0.0f64;
                    for (j, ej) in e.iter_mut().enumerate() {
                        *ej = f64::from(src[j * inner + i]) - m;
                        if !log {
                            *ej = ej.exp();
                            sum += *ej;
                        } else {
                            sum += ej.exp();
                        }
                    }
                    for (j, &ej) in e.iter().enumerate() {
                        dst[j * inner + i] = if log {
                            (ej - sum.ln()) as f32
                        } else {
                            (ej / sum) as f32
                        };
                    }
                }
            }
        },
    );
    out
}

/// Softmax (or log-softmax) of each `len`-long row of `src` into `dst`, in `f32` as onnxruntime
/// computes it, vectorised through [`crate::simd::dispatch`]: the row maximum `m` (exact), each
/// `e = exp32(x - m)` ([`crate::attention::exp32`], within 2 ulp), their sum as
/// [`crate::simd::striped_sum`]'s fixed-order partial sums, then `e / sum` (or
/// `(x - m) - ln(sum)`). Within a few ulp of the `f64` definition (the rounding of `x - m`
/// adds `|x - m|` · 2⁻²⁴ to the exponent, which only matters where `e` is tiny); the same bits
/// on every CPU and thread count. A NaN anywhere in a row makes the whole row NaN, as do an
/// infinite maximum and a row of `-inf`s, as in the `f64` definition.
fn softmax_rows32(src: &[f32], dst: &mut [f32], len: usize, log: bool) {
    struct Rows<'a> {
        src: &'a [f32],
        dst: &'a mut [f32],
        len: usize,
        log: bool,
    }
    impl pulp::WithSimd for Rows<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            let Rows { src, dst, len, log } = self;
            for (x, y) in src.chunks_exact(len).zip(dst.chunks_exact_mut(len)) {
                // NaN-ignoring: a NaN element still reaches the sum through its `exp`.
                let m = crate::attention::striped_max_f32(x);
                for (d, &v) in y.iter_mut().zip(x) {
                    *d = crate::attention::exp32(v - m);
                }
                let sum: f32 = crate::simd::striped_sum(y, |e| e);
                if log {
                    let ls = f64::from(sum).ln() as f32;
                    for (d, &v) in y.iter_mut().zip(x) {
                        *d = (v - m) - ls;
                    }
                } else {
                    y.iter_mut().for_each(|d| *d /= sum);
                }
            }
        }
    }
    if len == 0 {
        return;
    }
    crate::simd::dispatch(Rows { src, dst, len, log });
}

#[cfg(test)]
mod tests {
    use super::softmax_rows32;

    /// The definition, in `f64`: `exp(x - max) / Σ exp(x - max)`, or `x - max - ln(Σ ...)`.
    fn definition(x: &[f32], log: bool) -> Vec<f64> {
        let m = x
            .iter()
            .map(|&v| f64::from(v))
            .fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = x.iter().map(|&v| (f64::from(v) - m).exp()).sum();
        x.iter()
            .map(|&v| {
                let d = f64::from(v) - m;
                if log { d - sum.ln() } else { d.exp() / sum }
            })
            .collect()
    }

    #[test]
    fn f32_softmax_rows_are_within_a_few_ulp_of_the_f64_definition() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32
        };
        for len in [1usize, 2, 7, 8, 64, 130, 197, 1000] {
            for scale in [0.1f32, 4.0, 40.0] {
                let mut x: Vec<f32> = (0..len * 3).map(|_| (next() * 2.0 - 1.0) * scale).collect();
                // Masked keys, as attention masks write them.
                for v in x.iter_mut().skip(1).step_by(5) {
                    *v = f32::NEG_INFINITY;
                }
                for log in [false, true] {
                    let mut got = vec![0.0f32; x.len()];
                    softmax_rows32(&x, &mut got, len, log);
                    for (r, row) in x.chunks(len).enumerate() {
                        let want = definition(row, log);
                        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                        for (j, (&g, &w)) in got[r * len..][..len].iter().zip(&want).enumerate() {
                            let d = f64::from(row[j]) - f64::from(m);
                            let eps = f64::from(f32::EPSILON);
                            let tol = if log {
                                8.0 * eps * (w.abs() + 1.0)
                            } else {
                                // 2 ulp of exp, the sum's and the division's roundings, and
                                // `x - m`'s rounding carried into the exponent.
                                (8.0 + d.abs()) * eps * w
                            };
                            let ok = f64::from(g) == w
                                || (g.is_nan() && w.is_nan())
                                || (f64::from(g) - w).abs() <= tol;
                            assert!(
                                ok,
                                "len {len} scale {scale} log {log} [{r}][{j}]: {g} vs {w}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_nan_or_an_infinite_maximum_makes_the_row_nan_as_in_the_definition() {
        let rows: [[f32; 4]; 4] = [
            [0.5, f32::NAN, -1.0, 2.0],
            [0.5, f32::INFINITY, -1.0, 2.0],
            [f32::NEG_INFINITY; 4],
            [1.0, 1.0, f32::NEG_INFINITY, 1.0],
        ];
        for log in [false, true] {
            for row in &rows {
                let mut got = [0.0f32; 4];
                softmax_rows32(row, &mut got, 4, log);
                let want = definition(row, log);
                for (&g, &w) in got.iter().zip(&want) {
                    assert!(
                        (g.is_nan() && w.is_nan())
                            || f64::from(g) == w
                            || (f64::from(g) - w).abs() <= 1e-7,
                        "{row:?} log {log}: {got:?} vs {want:?}"
                    );
                }
            }
        }
    }
}
