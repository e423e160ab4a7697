//! One-pass row kernels for the transformer composites: residual add + LayerNorm, RMSNorm,
//! GELU (erf and tanh forms); and the `layer_norm` op over the last axis (ConvNeXt's
//! channels-last norm, with no residual to fuse), which `nn::norm` hands to [`layer_norm`].
//!
//! Contract: each works on `float32` tensors, row by row over the last axis, rows split over
//! threads (each row computed by one sequential loop: the same result for every thread count).
//! [`residual_layer_norm`] gives the same bits as `add` followed by the reference
//! `layer_norm` (the sum rounded to `f32`, then mean and variance summed in `f64` by
//! [`moments`], as `nn::norm` does for a norm over the last axes); [`layer_norm`] the bits of
//! `nn::norm`'s general loops. `Ok(None)`: shapes the kernel does not handle (the caller runs
//! the ops one by one).
//!
//! ```text
//! s: R.Tensor((n, 32), dtype="float32") = R.add(a, b)
//! y: R.Tensor((n, 32), dtype="float32") = R.nn.layer_norm(s, g, be, axes=[-1], epsilon=1e-12, center=True, scale=True)
//! ; → residual_layer_norm(a, b, g, be, 1e-12): s and y in one pass over each row
//! ```

use crate::simd::striped_sum;
use fusebox_core::runtime::Tensor;

type KResult<T> = Result<T, String>;

/// Rows of `width` elements, at least `1 << 14` elements a task.
fn row_tasks(n: usize, width: usize) -> (usize, usize) {
    let rows_per = ((1 << 14) / width.max(1)).max(1);
    let threads = crate::par::threads_for(n, 1 << 15);
    (rows_per * width.max(1), threads)
}

/// `s = a + b` and `layer_norm(s, gamma, beta)` over the last axis (`gamma` absent: no scale,
/// `beta` absent: no shift, as `layer_norm`'s `scale` and `center`); `None` when `a` and `b`
/// differ in shape (a broadcast residual) or the params are not the last dim's size.
pub(crate) fn residual_layer_norm(
    a: &Tensor,
    b: &Tensor,
    gamma: Option<&Tensor>,
    beta: Option<&Tensor>,
    eps: f64,
) -> KResult<Option<(Tensor, Tensor)>> {
    let (Some(ad), Some(bd)) = (a.as_f32(), b.as_f32()) else {
        return Ok(None);
    };
    let Some(&w) = a.shape().last() else {
        return Ok(None);
    };
    let (Some(g), Some(be)) = (norm_param(gamma, w), norm_param(beta, w)) else {
        return Ok(None);
    };
    if a.shape() != b.shape() || w == 0 {
        return Ok(None);
    }
    let n = ad.len();
    let (chunk, threads) = row_tasks(n, w);
    let mut sum = crate::par::scratch_f32(n);
    let mut out = crate::par::scratch_f32(n);
    let tasks: Vec<(usize, &mut [f32], &mut [f32])> = sum
        .chunks_mut(chunk)
        .zip(out.chunks_mut(chunk))
        .enumerate()
        .map(|(i, (s, o))| (i * chunk, s, o))
        .collect();
    let r: Result<(), ()> = crate::par::run_tasks(tasks, threads, |(off, s, o)| {
        for ((srow, orow), r0) in s.chunks_mut(w).zip(o.chunks_mut(w)).zip((off..).step_by(w)) {
            let rows = RlnRow {
                a: &ad[r0..r0 + w],
                b: &bd[r0..r0 + w],
                g,
                be,
                eps,
                sum: srow,
                out: orow,
            };
            crate::simd::dispatch(rows);
        }
        Ok(())
    });
    debug_assert!(r.is_ok());
    let shape = a.shape().to_vec();
    Ok(Some((
        sum.into_tensor(shape.clone())?,
        out.into_tensor(shape)?,
    )))
}

/// `layer_norm(x, gamma, beta)` over the last axis, rows split over threads, with the bits of
/// `nn::norm`'s reference loop; `None` when `x` is not `float32`, has no elements, or a param
/// is not a `float32` vector of the last dim's size.
pub(crate) fn layer_norm(
    x: &Tensor,
    gamma: Option<&Tensor>,
    beta: Option<&Tensor>,
    eps: f64,
) -> KResult<Option<Tensor>> {
    let Some(xd) = x.as_f32() else {
        return Ok(None);
    };
    let Some(&w) = x.shape().last() else {
        return Ok(None);
    };
    let (Some(g), Some(be)) = (norm_param(gamma, w), norm_param(beta, w)) else {
        return Ok(None);
    };
    if w == 0 || xd.is_empty() {
        return Ok(None);
    }
    map_rows(xd, w, x.shape(), |x, out| {
        crate::simd::dispatch(LnRow { x, g, be, eps, out });
    })
    .map(Some)
}

/// A tensor of `shape` whose rows of `w` elements are `row(x_row, out_row)` of `xd`'s, the
/// rows split over the threads as [`row_tasks`] cuts them.
fn map_rows(
    xd: &[f32],
    w: usize,
    shape: &[usize],
    row: impl Fn(&[f32], &mut [f32]) + Sync,
) -> KResult<Tensor> {
    let n = xd.len();
    let (chunk, threads) = row_tasks(n, w);
    let mut out = crate::par::scratch_f32(n);
    crate::par::for_each_chunk_mut(&mut out, chunk, threads, |off, o| {
        for (orow, r0) in o.chunks_mut(w).zip((off..).step_by(w)) {
            row(&xd[r0..r0 + w], orow);
        }
    });
    out.into_tensor(shape.to_vec())
}

/// An optional LayerNorm param's data: `Some(None)` when absent, `None` when it is not a
/// `float32` vector of `w` elements.
fn norm_param(p: Option<&Tensor>, w: usize) -> Option<Option<&[f32]>> {
    match p {
        None => Some(None),
        Some(t) if t.shape() == [w] => t.as_f32().map(Some),
        Some(_) => None,
    }
}

/// One row of [`residual_layer_norm`]: `sum = a + b`, then the norm of `sum` into `out`.
struct RlnRow<'a> {
    a: &'a [f32],
    b: &'a [f32],
    g: Option<&'a [f32]>,
    be: Option<&'a [f32]>,
    eps: f64,
    sum: &'a mut [f32],
    out: &'a mut [f32],
}

impl pulp::WithSimd for RlnRow<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let RlnRow {
            a,
            b,
            g,
            be,
            eps,
            sum,
            out,
        } = self;
        for ((x, &p), &q) in sum.iter_mut().zip(a).zip(b) {
            *x = p + q;
        }
        norm_row(sum, g, be, eps, out);
    }
}

/// One row of [`layer_norm`]: the norm of `x` into `out`.
struct LnRow<'a> {
    x: &'a [f32],
    g: Option<&'a [f32]>,
    be: Option<&'a [f32]>,
    eps: f64,
    out: &'a mut [f32],
}

impl pulp::WithSimd for LnRow<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        norm_row(self.x, self.g, self.be, self.eps, self.out);
    }
}

/// LayerNorm of one row `x` into `out`, as `nn::norm` computes it: the moments in `f64`
/// ([`moments_inline`]), then `(x - mean) * inv`, then `* gamma`, then `+ beta`, rounded once.
#[inline(always)]
fn norm_row(x: &[f32], g: Option<&[f32]>, be: Option<&[f32]>, eps: f64, out: &mut [f32]) {
    let (mean, m2) = moments_inline(x);
    let inv = 1.0 / (m2 / x.len() as f64 + eps).sqrt();
    let centred = x.iter().map(|&x| (f64::from(x) - mean) * inv);
    match (g, be) {
        (Some(g), Some(be)) => {
            for (((y, c), &gg), &bb) in out.iter_mut().zip(centred).zip(g).zip(be) {
                *y = (c * f64::from(gg) + f64::from(bb)) as f32;
            }
        }
        (Some(g), None) => {
            for ((y, c), &gg) in out.iter_mut().zip(centred).zip(g) {
                *y = (c * f64::from(gg)) as f32;
            }
        }
        (None, Some(be)) => {
            for ((y, c), &bb) in out.iter_mut().zip(centred).zip(be) {
                *y = (c + f64::from(bb)) as f32;
            }
        }
        (None, None) => {
            for (y, c) in out.iter_mut().zip(centred) {
                *y = c as f32;
            }
        }
    }
}

/// The mean of `row` and the sum of squared deviations from it, both by
/// [`crate::simd::striped_sum`] in `f64`.
#[inline(always)]
fn moments_inline<T: Copy + Into<f64>>(row: &[T]) -> (f64, f64) {
    let mean = striped_sum(row, |x| x.into()) / row.len().max(1) as f64;
    let m2 = striped_sum(row, |x| {
        let d = x.into() - mean;
        d * d
    });
    (mean, m2)
}

/// [`moments_inline`] compiled for the widest instruction set of this CPU: the statistics
/// of a LayerNorm row, shared by the `layer_norm` kernel and the fused residual LayerNorm so
/// both give the same bits.
pub(crate) fn moments<T: Copy + Into<f64>>(row: &[T]) -> (f64, f64) {
    struct Op<'a, T>(&'a [T]);
    impl<T: Copy + Into<f64>> pulp::WithSimd for Op<'_, T> {
        type Output = (f64, f64);
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) -> (f64, f64) {
            moments_inline(self.0)
        }
    }
    crate::simd::dispatch(Op(row))
}

/// `w * (x * (1 / sqrt(mean(x², -1) + eps)))` over the last axis (`w` optional, of the last
/// dim's size); the mean square summed in `f64`, the rest in `f32` as the graph's ops.
pub(crate) fn rms_norm(x: &Tensor, weight: Option<&Tensor>, eps: f32) -> KResult<Option<Tensor>> {
    let Some(xd) = x.as_f32() else {
        return Ok(None);
    };
    let Some(&w) = x.shape().last() else {
        return Ok(None);
    };
    let wd = match weight {
        Some(t) if t.shape() == [w] => t.as_f32(),
        Some(_) => return Ok(None),
        None => None,
    };
    if w == 0 || (weight.is_some() && wd.is_none()) {
        return Ok(None);
    }
    map_rows(xd, w, x.shape(), |xr, orow| {
        let ss: f64 = xr.iter().map(|&v| f64::from(v * v)).sum();
        let ms = (ss / w as f64) as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        match wd {
            Some(g) => {
                for ((y, &v), &gg) in orow.iter_mut().zip(xr).zip(g) {
                    *y = gg * (v * inv);
                }
            }
            None => {
                for (y, &v) in orow.iter_mut().zip(xr) {
                    *y = v * inv;
                }
            }
        }
    })
    .map(Some)
}

/// A per-column parameter of `w` values (shape `[w]`, or `[1, ..., 1, w]` of rank at most
/// `rank`, `float32`): `Some(None)` when absent, `Some(Some(data))` when it fits, `None` when
/// it does not (a LayerNorm's gamma and beta, a dense layer's bias).
pub(crate) fn per_column(t: Option<&Tensor>, w: usize, rank: usize) -> Option<Option<&[f32]>> {
    let Some(t) = t else { return Some(None) };
    let sh = t.shape();
    let ok =
        sh.last() == Some(&w) && sh[..sh.len() - 1].iter().all(|&d| d == 1) && sh.len() <= rank;
    if ok { t.as_f32().map(Some) } else { None }
}

/// LayerNorm as its decomposed ops compute it, row by row over the last axis, bit for bit:
/// `m = mean(x)` (an `f64` sum in index order, divided, rounded to `f32`, as the `mean` kernel
/// does), `d = x - m`, `v = mean(d.powf(exp))` likewise, `y = d / sqrt(v + eps)`, then
/// `y · gamma` and `y + beta` when given (`[w]` or `[1, ..., w]`). `Ok(None)`: other shapes.
pub(crate) fn layer_norm_decomposed(
    x: &Tensor,
    exp: f32,
    eps: f32,
    gamma: Option<&Tensor>,
    beta: Option<&Tensor>,
) -> KResult<Option<Tensor>> {
    let Some(xd) = x.as_f32() else {
        return Ok(None);
    };
    let rank = x.shape().len();
    let Some(&w) = x.shape().last() else {
        return Ok(None);
    };
    let (Some(g), Some(b)) = (per_column(gamma, w, rank), per_column(beta, w, rank)) else {
        return Ok(None);
    };
    if w == 0 {
        return Ok(None);
    }
    let n = xd.len();
    let (chunk, threads) = row_tasks(n, w);
    let mut out = crate::par::scratch_f32(n);
    crate::par::for_each_chunk_mut(&mut out, chunk, threads, |off, o| {
        for (y, r0) in o.chunks_mut(w).zip((off..).step_by(w)) {
            let xr = &xd[r0..r0 + w];
            let m = (xr.iter().map(|&v| f64::from(v)).sum::<f64>() / w as f64) as f32;
            for (d, &v) in y.iter_mut().zip(xr) {
                *d = v - m;
            }
            let ss: f64 = y.iter().map(|&d| f64::from(d.powf(exp))).sum();
            let s = ((ss / w as f64) as f32 + eps).sqrt();
            for v in y.iter_mut() {
                *v /= s;
            }
            if let Some(g) = g {
                y.iter_mut().zip(g).for_each(|(v, &k)| *v *= k);
            }
            if let Some(b) = b {
                y.iter_mut().zip(b).for_each(|(v, &k)| *v += k);
            }
        }
    });
    out.into_tensor(x.shape().to_vec()).map(Some)
}

/// `erf` in `f32` by the rational approximation Eigen and XLA use (`generic_fast_erf_float`:
/// odd degree-13 over even degree-8 polynomial on [-4, 4], ±1 beyond; within 5e-7 of the
/// exact value; NaN stays NaN through the clamp), branch-free so the GELU loop vectorises,
/// each Horner step one fused `mul_add` (the same bits on every CPU; on AVX2 the GELU loop
/// over it takes 0.72 of the time of separate multiplies and adds: bench/RESULTS.md, session
/// bw). The `float32` kernels of `erf` and `gelu` use it too.
#[inline(always)]
pub(crate) fn erf32(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = x2.mul_add(-2.726_142_3e-10, 2.770_681_4e-8);
    for c in [
        -2.101_024e-6,
        -5.692_506_4e-5,
        -7.349_906_3e-4,
        -2.954_6e-3,
        -1.609_603_3e-2,
    ] {
        p = x2.mul_add(p, c);
    }
    p *= x;
    let mut q = x2.mul_add(-1.456_607_2e-5, -2.133_740_6e-4);
    for c in [-1.682_827e-3, -7.373_329e-3, -1.426_474e-2] {
        q = x2.mul_add(q, c);
    }
    p / q
}

/// GELU in one pass: erf form `0.5 x (1 + erf(x / √2))` or tanh form
/// `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
pub(crate) fn gelu(x: &Tensor, tanh: bool) -> KResult<Tensor> {
    let xd = x.as_f32().unwrap_or(&[]);
    let n = xd.len();
    let threads = crate::par::threads_for(n, 1 << 14);
    let mut out = crate::par::scratch_f32(n);
    let chunk = n.div_ceil(threads).max(1);
    let act = if tanh {
        crate::dense::Act::GeluTanh
    } else {
        crate::dense::Act::Gelu
    };
    crate::par::for_each_chunk_mut(&mut out, chunk, threads, |off, o| {
        o.copy_from_slice(&xd[off..off + o.len()]);
        crate::dense::bias_act(o, None, act);
    });
    out.into_tensor(x.shape().to_vec())
}
