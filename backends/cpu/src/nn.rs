//! Neural-network kernels other than conv2d and matmul: `batch_norm`, `layer_norm`,
//! `rms_norm`, `lrn`, and 2-D pooling (`max_pool2d`, `avg_pool2d`, `adaptive_avg_pool2d`) in
//! any permutation of `NCHW`.
//!
//! Everything computes in `f64` and rounds once to the input dtype, with two `float32`
//! exceptions that skip the widened copy: `max_pool2d` (the same values) and inference
//! `batch_norm`, one fused multiply-add per element with per-channel coefficients computed
//! in `f64` ([`bn_coeffs_f32`]; within an ulp or so of the `f64` formula, and what the fused
//! convolution's epilogue computes too).
//! `max_pool2d`/`avg_pool2d` and inference `batch_norm` spread whole planes / channels over
//! [`crate::par::threads`] threads. Pooling windows skip
//! padded positions (max) or count them only when `count_include_pad` (avg), as TVM's topi
//! does; with `ceil_mode` the extra tail positions are never counted.
//!
//! ```text
//! (y, m, v) = R.nn.batch_norm(x, gamma, beta, mean, var, axis=1, epsilon=1e-5, training=False)
//! p: R.Tensor((1, 3, 2, 2), dtype="float32") = R.nn.max_pool2d(x, pool_size=[2, 2], strides=[2, 2])
//! ```

use crate::reduce::{Reduction, around, walk2};
use crate::util::{KResult, floats, from_canonical, from_f64, norm_axes, norm_axis, to_canonical};
use fusebox_core::op::{AdaptivePool2dAttrs, BatchNormAttrs, Pool2dAttrs};
use fusebox_core::runtime::Tensor;

/// Checks that a 1-D parameter has `n` elements.
fn param(t: &Tensor, n: usize, what: &str) -> KResult<Vec<f64>> {
    let v = floats(t, what)?;
    if v.len() != n {
        return Err(format!(
            "expected {what} to have {n} elements, found shape {:?}",
            t.shape()
        ));
    }
    Ok(v)
}

/// The per-channel affine map of inference `batch_norm`: `(mean, inv, scale, shift)` with
/// `inv = 1 / sqrt(var + eps)`, `scale = gamma` (1 without `scale`) and `shift = beta` (0
/// without `center`); each element becomes `(x - mean) * inv * scale + shift` (in `f64` for
/// other dtypes than `float32`, see [`bn_coeffs_f32`]).
#[allow(clippy::type_complexity, reason = "four parallel per-channel vectors")]
pub(crate) fn bn_affine(
    gamma: &Tensor,
    beta: &Tensor,
    mean: &Tensor,
    var: &Tensor,
    c: usize,
    a: &BatchNormAttrs,
) -> KResult<(Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>)> {
    let g = param(gamma, c, "gamma")?;
    let b = param(beta, c, "beta")?;
    let m = param(mean, c, "moving_mean")?;
    let v = param(var, c, "moving_var")?;
    Ok(affine(&g, &b, m, &v, a))
}

#[allow(clippy::type_complexity, reason = "four parallel per-channel vectors")]
fn affine(
    g: &[f64],
    b: &[f64],
    use_mean: Vec<f64>,
    use_var: &[f64],
    a: &BatchNormAttrs,
) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let eps = a.epsilon.0;
    let inv = use_var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
    let scale = g.iter().map(|&g| if a.scale { g } else { 1.0 }).collect();
    let shift = b.iter().map(|&b| if a.center { b } else { 0.0 }).collect();
    (use_mean, inv, scale, shift)
}

/// The statistics inference `batch_norm` returns: the moving mean and variance, each rounded
/// through `f64` to its own dtype.
pub(crate) fn bn_passthrough(mean: &Tensor, var: &Tensor) -> KResult<(Tensor, Tensor)> {
    Ok((
        from_f64(
            mean.shape().to_vec(),
            mean.dtype(),
            floats(mean, "moving_mean")?,
        )?,
        from_f64(
            var.shape().to_vec(),
            var.dtype(),
            floats(var, "moving_var")?,
        )?,
    ))
}

/// The `float32` form of inference `batch_norm`'s affine map, per channel: `(mul, add)` with
/// `mul = inv * scale` and `add = shift - mean * mul`, each computed in `f64` and rounded
/// once; an element becomes `x.mul_add(mul, add)` (one rounding). The fused convolution's
/// epilogue and the unfused `float32` kernel both use it, so their results are identical.
pub(crate) fn bn_coeffs_f32(
    gamma: &Tensor,
    beta: &Tensor,
    mean: &Tensor,
    var: &Tensor,
    c: usize,
    a: &BatchNormAttrs,
) -> KResult<(Vec<f32>, Vec<f32>)> {
    let (m, inv, sc, sh) = bn_affine(gamma, beta, mean, var, c, a)?;
    let mul: Vec<f64> = inv.iter().zip(&sc).map(|(i, s)| i * s).collect();
    let add = sh
        .iter()
        .zip(&m)
        .zip(&mul)
        .map(|((sh, m), k)| (sh - m * k) as f32)
        .collect();
    Ok((mul.into_iter().map(|k| k as f32).collect(), add))
}

/// `x.mul_add(mul, add)` for each element: one channel of inference `batch_norm` on `float32`
/// data (see [`bn_coeffs_f32`]), through [`crate::simd::dispatch`] (an FMA instruction where
/// the CPU has one; the same result either way).
fn affine_f32(src: &[f32], dst: &mut [f32], mul: f32, add: f32) {
    struct Op<'a>(&'a [f32], &'a mut [f32], f32, f32);
    impl pulp::WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            let (mul, add) = (self.2, self.3);
            for (d, &x) in self.1.iter_mut().zip(self.0) {
                *d = x.mul_add(mul, add);
            }
        }
    }
    crate::simd::dispatch(Op(src, dst, mul, add));
}

/// `batch_norm` → `(out, moving_mean, moving_var)`. Inference mode normalises with the moving
/// statistics and returns them unchanged; training mode normalises with the batch statistics
/// (biased variance) and returns the updated moving statistics
/// `(1 - momentum) * moving + momentum * batch`. Inference on `float32` data runs per channel
/// on [`crate::par::threads`] threads (the same arithmetic).
pub(crate) fn batch_norm(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    mean: &Tensor,
    var: &Tensor,
    a: &BatchNormAttrs,
) -> KResult<(Tensor, Tensor, Tensor)> {
    let axis = norm_axis(a.axis, x.rank())?;
    let (outer, c, inner) = around(x.shape(), axis);
    if !a.training
        && let Some(xs) = x.as_f32()
    {
        let (mul, add) = bn_coeffs_f32(gamma, beta, mean, var, c, a)?;
        let t = crate::par::threads_for(xs.len(), 1 << 16);
        let mut out = vec![0.0f32; xs.len()];
        let rows = (1usize << 14).div_ceil(inner.max(1)) * inner.max(1);
        crate::par::for_each_chunk_mut(&mut out, rows, t, |off, chunk| {
            for (k, dst) in chunk.chunks_mut(inner.max(1)).enumerate() {
                let row = off / inner.max(1) + k;
                let ch = row % c.max(1);
                let src = &xs[row * inner..row * inner + dst.len()];
                affine_f32(src, dst, mul[ch], add[ch]);
            }
        });
        let (nm, nv) = bn_passthrough(mean, var)?;
        return Ok((
            crate::util::tensor(x.shape().to_vec(), fusebox_core::runtime::Storage::F32(out))?,
            nm,
            nv,
        ));
    }
    let xs = floats(x, "data")?;
    let g = param(gamma, c, "gamma")?;
    let b = param(beta, c, "beta")?;
    let mm = param(mean, c, "moving_mean")?;
    let mv = param(var, c, "moving_var")?;
    let (use_mean, use_var, new_mean, new_var) = if a.training {
        let count = (outer * inner) as f64;
        let mut bm = vec![0.0; c];
        let mut bv = vec![0.0; c];
        for o in 0..outer {
            for (ch, m) in bm.iter_mut().enumerate() {
                let base = (o * c + ch) * inner;
                *m += xs[base..base + inner].iter().sum::<f64>();
            }
        }
        bm.iter_mut().for_each(|m| *m /= count);
        for o in 0..outer {
            for ch in 0..c {
                let base = (o * c + ch) * inner;
                bv[ch] += xs[base..base + inner]
                    .iter()
                    .map(|v| (v - bm[ch]) * (v - bm[ch]))
                    .sum::<f64>();
            }
        }
        bv.iter_mut().for_each(|v| *v /= count);
        let m = a.momentum.0;
        let nm: Vec<f64> = mm
            .iter()
            .zip(&bm)
            .map(|(o, b)| (1.0 - m) * o + m * b)
            .collect();
        let nv: Vec<f64> = mv
            .iter()
            .zip(&bv)
            .map(|(o, b)| (1.0 - m) * o + m * b)
            .collect();
        (bm, bv, nm, nv)
    } else {
        (mm.clone(), mv.clone(), mm, mv)
    };
    let (use_mean, inv, scale, shift) = affine(&g, &b, use_mean, &use_var, a);
    let mut out = vec![0.0; xs.len()];
    for o in 0..outer {
        for ch in 0..c {
            let base = (o * c + ch) * inner;
            for i in base..base + inner {
                out[i] = (xs[i] - use_mean[ch]) * inv[ch] * scale[ch] + shift[ch];
            }
        }
    }
    let dt = x.dtype();
    Ok((
        from_f64(x.shape().to_vec(), dt, out)?,
        from_f64(mean.shape().to_vec(), mean.dtype(), new_mean)?,
        from_f64(var.shape().to_vec(), var.dtype(), new_var)?,
    ))
}

/// Checks that a norm parameter has the shape of the normalised axes (in `axes` order).
fn norm_param(t: &Tensor, want: &[usize], what: &str) -> KResult<Vec<f64>> {
    if t.shape() != want {
        return Err(format!(
            "expected {what} to have shape {want:?} (the normalised axes), found {:?}",
            t.shape()
        ));
    }
    floats(t, what)
}

/// `layer_norm` (when `params` holds gamma and beta) or `rms_norm` (weight only) over `axes`.
pub(crate) fn norm(
    x: &Tensor,
    axes: &[i64],
    eps: f64,
    gamma: Option<&Tensor>,
    beta: Option<&Tensor>,
    rms: bool,
) -> KResult<Tensor> {
    let axes = norm_axes(axes, x.rank())?;
    let want: Vec<usize> = axes.iter().map(|&a| x.shape()[a]).collect();
    let g = gamma.map(|t| norm_param(t, &want, "gamma")).transpose()?;
    let b = beta.map(|t| norm_param(t, &want, "beta")).transpose()?;
    if !rms && axes.len() == 1 && axes[0] + 1 == x.rank() {
        // A LayerNorm of rows (ConvNeXt's channels-last norm): the row kernel, on the
        // kernel threads, with the bits of the loops below.
        if let Some(t) = crate::norm::layer_norm(x, gamma, beta, eps)? {
            return Ok(t);
        }
    }
    let xs = floats(x, "data")?;
    let red = Reduction::new(x.shape(), &axes);
    let n_out: usize = red.kept.iter().product();
    let count = red.count as f64;
    let mut mean = vec![0.0; n_out];
    let mut var = vec![0.0; n_out];
    let (ks, rs) = (&red.kept_strides, &red.red_strides);
    let rank = x.rank();
    let trailing = !axes.is_empty()
        && axes
            .iter()
            .enumerate()
            .all(|(i, &a)| a == rank - axes.len() + i);
    if rms {
        walk2(x.shape(), ks, rs, |i, o, _| var[o] += xs[i] * xs[i]);
    } else if trailing && red.count > 0 {
        // Rows of the last axes: the statistics of each row by `norm::moments`, which the
        // fused residual LayerNorm shares (the same bits).
        for ((row, m), v) in xs.chunks_exact(red.count).zip(&mut mean).zip(&mut var) {
            (*m, *v) = crate::norm::moments(row);
        }
    } else {
        walk2(x.shape(), ks, rs, |i, o, _| mean[o] += xs[i]);
        mean.iter_mut().for_each(|m| *m /= count);
        walk2(x.shape(), ks, rs, |i, o, _| {
            let d = xs[i] - mean[o];
            var[o] += d * d;
        });
    }
    let inv: Vec<f64> = var.iter().map(|v| 1.0 / (v / count + eps).sqrt()).collect();
    let mut out = vec![0.0; xs.len()];
    walk2(x.shape(), ks, rs, |i, o, r| {
        let mut y = (xs[i] - mean[o]) * inv[o];
        if let Some(g) = &g {
            y *= g[r];
        }
        if let Some(b) = &b {
            y += b[r];
        }
        out[i] = y;
    });
    from_f64(x.shape().to_vec(), x.dtype(), out)
}

/// `lrn`: `x / (bias + alpha / size * Σ_window x²)^beta`, the window
/// `[c - size/2, c - size/2 + size)` along `axis` (clipped to the tensor).
pub(crate) fn lrn(
    x: &Tensor,
    size: i64,
    axis: i64,
    alpha: f64,
    beta: f64,
    bias: f64,
) -> KResult<Tensor> {
    let axis = norm_axis(axis, x.rank())?;
    let size = usize::try_from(size).map_err(|_| format!("invalid size {size}"))?;
    let xs = floats(x, "the input")?;
    let (outer, c, inner) = around(x.shape(), axis);
    let radius = size / 2;
    let mut out = vec![0.0; xs.len()];
    for o in 0..outer {
        for ch in 0..c {
            let lo = ch.saturating_sub(radius);
            let hi = (ch + size - radius).min(c);
            for i in 0..inner {
                let at = |k: usize| (o * c + k) * inner + i;
                let s: f64 = (lo..hi).map(|k| xs[at(k)] * xs[at(k)]).sum();
                out[at(ch)] = xs[at(ch)] / (bias + alpha / size as f64 * s).powf(beta);
            }
        }
    }
    from_f64(x.shape().to_vec(), x.dtype(), out)
}

/// Where each letter of `NCHW` sits in `layout`.
pub(crate) fn layout4(layout: &str, letters: &str) -> KResult<[usize; 4]> {
    let l = layout.as_bytes();
    let mut out = [0usize; 4];
    if l.len() != 4 {
        return Err(format!("invalid layout \"{layout}\""));
    }
    for (slot, c) in out.iter_mut().zip(letters.as_bytes()) {
        *slot = l
            .iter()
            .position(|x| x == c)
            .ok_or_else(|| format!("invalid layout \"{layout}\""))?;
    }
    Ok(out)
}

/// One pooled axis: input extent, window, stride, dilation, padding before/after, ceil mode.
pub(crate) struct Axis {
    len: usize,
    pub(crate) k: usize,
    s: usize,
    d: usize,
    pad0: usize,
    pad1: usize,
}

impl Axis {
    /// Per window position `k` along this axis: the outputs `[lo, hi)` (of `out` outputs)
    /// whose input position is in range, and that position's offset `x0 = k·d − pad0` (output
    /// `o` reads input `o·s + x0`).
    fn runs(&self, out: usize) -> Vec<(usize, usize, isize)> {
        (0..self.k)
            .map(|k| {
                let x0 = (k * self.d) as isize - self.pad0 as isize;
                let (lo, hi) = crate::util::in_range_outputs(x0, self.s, self.len, out);
                (lo, hi, x0)
            })
            .collect()
    }

    fn out_len(&self, ceil: bool) -> KResult<usize> {
        let eff = (self.k - 1) * self.d + 1;
        let padded = self.len + self.pad0 + self.pad1;
        // In ceil mode a window wider than the padded input still gives one output when the
        // stride covers the difference (PyTorch's and onnxruntime's rule: HF EfficientNet
        // pools a 1×1 map with a 320 window); the window is clipped to the input.
        let num = padded + if ceil { self.s - 1 } else { 0 };
        if num < eff {
            return Err(format!(
                "the window ({eff}) is larger than the padded input ({padded})"
            ));
        }
        Ok((num - eff) / self.s + 1)
    }

    /// The window positions of output `o` inside the input, and how many positions count
    /// for an average with padding included.
    pub(crate) fn window(&self, o: usize) -> (Vec<usize>, usize) {
        let start = (o * self.s) as isize - self.pad0 as isize;
        let limit = (self.len + self.pad1) as isize;
        let mut real = Vec::with_capacity(self.k);
        let mut with_pad = 0;
        for j in 0..self.k {
            let p = start + (j * self.d) as isize;
            if p < limit {
                with_pad += 1;
            }
            if p >= 0 && p < self.len as isize {
                real.push(p as usize);
            }
        }
        (real, with_pad)
    }
}

fn usize_of(v: i64, what: &str) -> KResult<usize> {
    usize::try_from(v).map_err(|_| format!("invalid {what} {v}"))
}

thread_local! {
    /// The framed column phases of the plane [`max_plane`] pools on the calling thread.
    static PHASES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The `-∞` frame on each side of a phase row of [`max_plane_framed`]: the widest vector
/// (AVX-512's 16 lanes).
const POOL_FRAME: usize = 16;

/// One plane of an `f32` max pool (see [`pool2d`]), through [`crate::simd::dispatch`]:
/// [`max_plane_framed`], or where its reads would leave the frame (a padding wider than it),
/// [`max_plane_inline`]. Both give each output the same chain over its window.
#[allow(clippy::type_complexity, reason = "the precomputed windows")]
fn max_plane(
    src: &[f32],
    dst: &mut [f32],
    wins_h: &[(Vec<usize>, usize)],
    cols: &[(usize, usize, isize)],
    w: usize,
    ow: usize,
    s: usize,
) {
    struct Op<'a>(
        &'a [f32],
        &'a mut [f32],
        &'a [(Vec<usize>, usize)],
        &'a [(usize, usize, isize)],
        [usize; 3],
        &'a mut Vec<f32>,
    );
    impl pulp::WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, simd: S) {
            let Op(src, dst, wins_h, cols, [w, ow, s], phases) = self;
            if !max_plane_framed(simd, src, dst, wins_h, cols, [w, ow, s], phases) {
                max_plane_inline(src, dst, wins_h, cols, [w, ow, s]);
            }
        }
    }
    crate::par::with_scratch(&PHASES, |phases| {
        crate::simd::dispatch(Op(src, dst, wins_h, cols, [w, ow, s], phases));
    });
}

/// A max pool's plane with the running maxima in registers: each input row is dealt into its
/// `s` column phases (phase `q` holds columns `q, q + s, …`), each phase row framed by
/// [`POOL_FRAME`] values of `-∞` on both sides and `-∞` past its last column, so that window
/// column `kx` reads one contiguous run of a phase row for consecutive output columns — and
/// an output column whose position `(ky, kx)` lies in the padding reads `-∞` there, which no
/// pick takes. Per output row, up to four vectors of output columns are kept in registers
/// while the window's positions are picked into them in (row, column) order, then stored
/// once: each output is the chain [`max_plane_inline`] gives (the first maximum and the last
/// NaN win). Without a NaN in the plane (checked first; a plane with one takes the row
/// loop) a pick is a compare and a select. The row loop kept the running maxima in memory,
/// and its masked stores stalled the next loads: ResNet-50's 64×112×112 pool (3×3, stride
/// 2) as one node, 0.389–0.391 → 0.262–0.273 ms on one thread and 0.214–0.228 →
/// 0.151–0.152 on two (the run's fixed cost included); in the model, two threads,
/// 0.28–0.51 → 0.18–0.22. Returns `false`, having written no output, where a run would
/// leave the frame or the plane holds a NaN.
#[inline(always)]
#[allow(clippy::type_complexity, reason = "the precomputed windows")]
fn max_plane_framed<S: pulp::Simd>(
    simd: S,
    src: &[f32],
    dst: &mut [f32],
    wins_h: &[(Vec<usize>, usize)],
    cols: &[(usize, usize, isize)],
    [w, ow, s]: [usize; 3],
    phases: &mut Vec<f32>,
) -> bool {
    /// Vectors of output columns in flight.
    const GROUP: usize = 4;
    let lanes = S::F32_LANES;
    if lanes > POOL_FRAME {
        return false;
    }
    // Without a NaN in the plane, a pick is `v > acc ? v : acc` (a compare and a select);
    // a plane with one takes the row loop (its picks also let the last NaN win).
    if src.iter().fold(false, |any, v| any | v.is_nan()) {
        return false;
    }
    let frame = f32::NEG_INFINITY;
    let Some((pitch, taps)) = deal_framed(src, cols, [w, ow, s], GROUP * lanes, frame, phases)
    else {
        return false;
    };
    let neg_inf = simd.splat_f32s(f32::NEG_INFINITY);
    for ((rows, _), out) in wins_h.iter().zip(dst.chunks_exact_mut(ow)) {
        let mut g0 = 0;
        while g0 < ow {
            let mut acc = [neg_inf; GROUP];
            for &y in rows {
                for &(q, at) in &taps {
                    let run = &phases[(y * s + q) * pitch + at + g0..][..GROUP * lanes];
                    // A constant trip count: unrolled, `acc` stays in registers.
                    for (acc, v) in acc.iter_mut().zip(run.chunks_exact(lanes)) {
                        let v: S::f32s = bytemuck::pod_read_unaligned(bytemuck::cast_slice(v));
                        // The greater value; on a tie the first (as the row loop and the
                        // f64 path: a +0.0 after a -0.0 leaves the -0.0).
                        *acc = simd.select_f32s(simd.greater_than_f32s(v, *acc), v, *acc);
                    }
                }
            }
            let vals: &[f32] = bytemuck::cast_slice(&acc);
            let n = (GROUP * lanes).min(ow - g0);
            out[g0..g0 + n].copy_from_slice(&vals[..n]);
            g0 += GROUP * lanes;
        }
    }
    true
}

/// Deals plane `src` (rows of `w`) into the framed column phases of [`max_plane_framed`]
/// and [`avg_plane_framed`] for stride `s`: phase row `(y, q)` at `(y·s + q)·pitch` holds
/// [`POOL_FRAME`] × `frame`, columns `q, q + s, …` of row `y`, then `frame` to the end of
/// the row. Returns the pitch and, per window column `(lo, hi, x0)` that reaches the image
/// (in order), its phase `q` and the position `at` of output column 0 in its phase row:
/// output column `ox` reads `at + ox`, input column `lo·s + x0 + s·(ox − lo)` or `frame`
/// where that lies in the padding. `None` where a run of `ow` outputs rounded up to whole
/// `group`s would leave the row. Inlined into each pool's SIMD context.
#[inline(always)]
#[allow(clippy::inline_always, reason = "inside each pool's SIMD context")]
fn deal_framed(
    src: &[f32],
    cols: &[(usize, usize, isize)],
    [w, ow, s]: [usize; 3],
    group: usize,
    frame: f32,
    phases: &mut Vec<f32>,
) -> Option<(usize, Vec<(usize, usize)>)> {
    const F: usize = POOL_FRAME;
    if w == 0 || s == 0 || ow == 0 || group == 0 {
        return None;
    }
    let h = src.len() / w;
    // Output column ox of window column (lo, hi, x0) reads input column start + s·(ox − lo)
    // (start = lo·s + x0), at F + start / s + ox − lo of phase row start % s; its whole
    // run, ox from 0 to ow rounded up to whole groups, must lie in the row (the outputs past
    // `ow` are computed and not stored: every group is a full one).
    let span = ow.next_multiple_of(group);
    let pitch = (w.div_ceil(s) + 2 * F).max(span + 2 * F);
    // The phases take `s` frames per input row: a stride far past the window (each row
    // dealt into hundreds of phases) would take many times the plane; such a pool keeps
    // its row loop.
    if h.saturating_mul(s).saturating_mul(pitch) > 2 * src.len() + (1 << 16) {
        return None;
    }
    let mut taps: Vec<(usize, usize)> = Vec::with_capacity(cols.len());
    for &(lo, hi, x0) in cols {
        if lo >= hi {
            continue;
        }
        let start = usize::try_from(lo as isize * s as isize + x0).ok()?;
        let at = (F + start / s).checked_sub(lo)?;
        if at + span > pitch {
            return None;
        }
        taps.push((start % s, at));
    }
    phases.resize(h * s * pitch, frame);
    for (line, rows) in src.chunks_exact(w).zip(phases.chunks_exact_mut(s * pitch)) {
        let fill = |row: &mut [f32], n: usize| {
            row[..F].fill(frame);
            row[F + n..].fill(frame);
        };
        if s == 2 {
            // Dealt eight pairs at a time by AVX2 shuffles (the pairs loop compiled to one
            // move per value: half of the max pool's time).
            let (even, odd) = rows.split_at_mut(pitch);
            let n = w / 2;
            crate::depthwise_flat::deal_pairs(line, &mut even[F..F + n], &mut odd[F..F + n]);
            let ne = if let [t] = line[2 * n..] {
                even[F + n] = t;
                n + 1
            } else {
                n
            };
            fill(even, ne);
            fill(odd, n);
        } else {
            for (q, row) in rows.chunks_exact_mut(pitch).enumerate() {
                let mut n = 0;
                for (d, &v) in row[F..].iter_mut().zip(line.iter().skip(q).step_by(s)) {
                    *d = v;
                    n += 1;
                }
                fill(row, n);
            }
        }
    }
    Some((pitch, taps))
}

/// Output columns [`avg_plane_framed`] sums at a time: four AVX-512 vectors of `f64`.
const AVG_GROUP: usize = 32;

/// One plane of an `f32` average pool (see [`pool2d`]) over the column phases of
/// [`deal_framed`], framed with `+0.0`, on AVX-512: per output row, [`AVG_GROUP`] output
/// columns' sums are kept in `f64` vectors while the window's positions are added in (row,
/// column) order, each `f32` widened exactly, a position in the padding adding `+0.0` (a sum
/// that starts at `+0.0` is never `-0.0`, so that leaves it as it is); then each sum is
/// divided by its window's count and rounded once: the chains of [`Windows::pool`], the same
/// bits. `counts[ox]`: output column `ox`'s positions in range and with the padding.
/// `false` (nothing written) without AVX-512 or where [`deal_framed`] declines; the caller
/// then runs [`Windows::pool`], which computes one output at a time: 64×112×112, 3×3,
/// stride 2, as one node, one thread 1.39–1.40 → 0.38 ms (onnxruntime, two threads, 0.086).
#[allow(
    clippy::too_many_arguments,
    reason = "a plane, its windows and the buffer"
)]
fn avg_plane_framed(
    src: &[f32],
    dst: &mut [f32],
    wins_h: &[(Vec<usize>, usize)],
    cols: &[(usize, usize, isize)],
    counts: &[(usize, usize)],
    [w, ow, s]: [usize; 3],
    include_pad: bool,
    phases: &mut Vec<f32>,
) -> bool {
    struct Op<'a> {
        src: &'a [f32],
        dst: &'a mut [f32],
        wins_h: &'a [(Vec<usize>, usize)],
        cols: &'a [(usize, usize, isize)],
        counts: &'a [(usize, usize)],
        dims: [usize; 3],
        include_pad: bool,
        phases: &'a mut Vec<f32>,
    }
    impl pulp::WithSimd for Op<'_> {
        type Output = bool;
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) -> bool {
            #[cfg(target_arch = "x86_64")]
            if let Some(v4) = pulp::x86::V4::try_new() {
                let Op {
                    src,
                    dst,
                    wins_h,
                    cols,
                    counts,
                    dims,
                    include_pad,
                    phases,
                } = self;
                let Some((pitch, taps)) = deal_framed(src, cols, dims, AVG_GROUP, 0.0, phases)
                else {
                    return false;
                };
                let rows = FramedRows {
                    phases,
                    pitch,
                    taps: &taps,
                    s: dims[2],
                };
                avg_rows_v4(v4, &rows, wins_h, counts, dst, dims[1], include_pad);
                return true;
            }
            false
        }
    }
    crate::simd::dispatch(Op {
        src,
        dst,
        wins_h,
        cols,
        counts,
        dims: [w, ow, s],
        include_pad,
        phases,
    })
}

/// A plane dealt by [`deal_framed`]: its phase rows, their pitch, the window columns' `(q,
/// at)` and the stride.
struct FramedRows<'a> {
    phases: &'a [f32],
    pitch: usize,
    taps: &'a [(usize, usize)],
    s: usize,
}

/// [`avg_plane_framed`]'s sums on AVX-512 (inlined into its SIMD context).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(
    clippy::inline_always,
    reason = "the intrinsics compile to single instructions"
)]
fn avg_rows_v4(
    v4: pulp::x86::V4,
    framed: &FramedRows<'_>,
    wins_h: &[(Vec<usize>, usize)],
    counts: &[(usize, usize)],
    dst: &mut [f32],
    ow: usize,
    include_pad: bool,
) {
    use std::arch::x86_64::{__m256, __m512d};
    let f = v4.avx512f;
    let FramedRows {
        phases,
        pitch,
        taps,
        s,
    } = *framed;
    let zero: __m512d = pulp::cast([0.0f64; 8]);
    for ((rows, ph), out) in wins_h.iter().zip(dst.chunks_exact_mut(ow)) {
        let mut g0 = 0;
        while g0 < ow {
            let mut acc = [zero; AVG_GROUP / 8];
            for &y in rows {
                for &(q, at) in taps {
                    let run = &phases[(y * s + q) * pitch + at + g0..][..AVG_GROUP];
                    for (a, v) in acc.iter_mut().zip(run.chunks_exact(8)) {
                        let v: __m256 = pulp::cast(bytemuck::pod_read_unaligned::<[f32; 8]>(
                            bytemuck::cast_slice(v),
                        ));
                        *a = f._mm512_add_pd(*a, f._mm512_cvtps_pd(v));
                    }
                }
            }
            let sums: [f64; AVG_GROUP] = pulp::cast(acc);
            let n = AVG_GROUP.min(ow - g0);
            for ((o, a), &(inside, pw)) in out[g0..g0 + n]
                .iter_mut()
                .zip(&sums)
                .zip(&counts[g0..g0 + n])
            {
                let cnt = if include_pad {
                    ph * pw
                } else {
                    rows.len() * inside
                };
                *o = if cnt == 0 {
                    0.0
                } else {
                    (a / cnt as f64) as f32
                };
            }
            g0 += AVG_GROUP;
        }
    }
}

/// [`max_plane`]'s loops where [`max_plane_framed`] does not apply (`[w, ow, s]`: the input
/// width, the output width, the stride): per output row, each window position's run of
/// outputs in (row, column) order.
#[inline(always)]
#[allow(clippy::type_complexity, reason = "the precomputed windows")]
fn max_plane_inline(
    src: &[f32],
    dst: &mut [f32],
    wins_h: &[(Vec<usize>, usize)],
    cols: &[(usize, usize, isize)],
    [w, ow, s]: [usize; 3],
) {
    // A select, not a branch: it pipelines and vectorises (NaN wins, as in the f64 path).
    #[inline(always)]
    fn pick(a: &mut f32, v: f32) {
        *a = if v > *a || v.is_nan() { v } else { *a };
    }
    for ((rows, _), acc) in wins_h.iter().zip(dst.chunks_mut(ow.max(1))) {
        acc.fill(f32::NEG_INFINITY);
        for &y in rows {
            let line = &src[y * w..(y + 1) * w];
            for &(lo, hi, x0) in cols {
                if hi <= lo {
                    continue;
                }
                let start = (lo as isize * s as isize + x0) as usize;
                let acc = &mut acc[lo..hi];
                if s == 2 {
                    // Even elements of pairs (the compiler vectorises the de-interleave), then
                    // the odd tail.
                    let pairs = line[start..].chunks_exact(2);
                    let full = pairs.len().min(acc.len());
                    for (a, p) in acc[..full].iter_mut().zip(pairs) {
                        pick(a, p[0]);
                    }
                    let rest = line[start + 2 * full..].iter().step_by(2);
                    for (a, &v) in acc[full..].iter_mut().zip(rest) {
                        pick(a, v);
                    }
                } else {
                    for (a, &v) in acc.iter_mut().zip(line[start..].iter().step_by(s)) {
                        pick(a, v);
                    }
                }
            }
        }
    }
}

/// The row and column windows of a 2-D pool of `a` over an `h × w` plane, and the output's
/// height and width.
pub(crate) fn pool_axes(
    a: &Pool2dAttrs,
    h: usize,
    w: usize,
) -> KResult<(Axis, Axis, usize, usize)> {
    let ax = |i: usize, len: usize| -> KResult<Axis> {
        Ok(Axis {
            len,
            k: usize_of(a.pool_size[i], "pool_size")?,
            s: usize_of(a.strides[i], "stride")?,
            d: usize_of(a.dilation[i], "dilation")?,
            pad0: usize_of(a.padding[i], "padding")?,
            pad1: usize_of(a.padding[i + 2], "padding")?,
        })
    };
    let (ah, aw) = (ax(0, h)?, ax(1, w)?);
    if ah.k == 0 || aw.k == 0 || ah.s == 0 || aw.s == 0 || ah.d == 0 || aw.d == 0 {
        return Err("pool_size, strides and dilation must be at least 1".to_string());
    }
    let (oh, ow) = (ah.out_len(a.ceil_mode)?, aw.out_len(a.ceil_mode)?);
    Ok((ah, aw, oh, ow))
}

/// `max_pool2d` (`max`) or `avg_pool2d`.
pub(crate) fn pool2d(x: &Tensor, a: &Pool2dAttrs, max: bool) -> KResult<Tensor> {
    if x.rank() != 4 {
        return Err(format!("expected a 4-D input, found shape {:?}", x.shape()));
    }
    let lp = layout4(&a.layout, "NCHW")?;
    let op = layout4(&a.out_layout, "NCHW")?;
    let xc = to_canonical(x, lp);
    let (n, c, h, w) = (xc.shape()[0], xc.shape()[1], xc.shape()[2], xc.shape()[3]);
    let (ah, aw, oh, ow) = pool_axes(a, h, w)?;
    let wins_h: Vec<_> = (0..oh).map(|o| ah.window(o)).collect();
    let wins_w: Vec<_> = (0..ow).map(|o| aw.window(o)).collect();
    let plane_out = oh * ow;
    let t = crate::par::threads_for(n * c * plane_out * ah.k * aw.k, 1 << 18);
    let cols = aw.runs(ow);
    if max && let Some(xs) = xc.as_f32() {
        // Max is exact in f32: the same result as through f64, without the conversions. Per
        // output row, the window positions are visited in the same (row, column) order, each
        // as a run over the output columns whose input column is in range.
        // Every output is written (each plane kernel covers its rows whole): a kept buffer
        // serves without being zeroed first.
        let mut out = crate::par::scratch_f32(n * c * plane_out);
        crate::par::for_each_chunk_mut(&mut out, plane_out.max(1), t, |off, dst| {
            let base = off / plane_out.max(1) * h * w;
            let src = &xs[base..base + h * w];
            max_plane(src, dst, &wins_h, &cols, w, ow, aw.s);
        });
        let t = out.into_tensor(vec![n, c, oh, ow])?;
        return Ok(from_canonical(&t, op));
    }
    // One window over each whole plane (a global average pool exported as `AveragePool`, as
    // ResNet-50's 7×7 one): the plane means as `adaptive_avg_pool2d` sums them (interleaved
    // partial sums, 8 additions in flight instead of one chain: 2048 planes of 7×7 in
    // ResNet-50, one thread, 0.092–0.096 → 0.043–0.047 ms).
    let whole = |wins: &[(Vec<usize>, usize)], len: usize| {
        matches!(wins, [(pos, with_pad)]
            if pos.iter().copied().eq(0..len) && (!a.count_include_pad || *with_pad == len))
    };
    if !max && whole(&wins_h, h) && whole(&wins_w, w) {
        let out = match xc.as_f32() {
            Some(xs) => adaptive_means(xs, f64::from, (h, w, 1, 1), n * c),
            None => adaptive_means(&xc.to_f64_vec(), |v| v, (h, w, 1, 1), n * c),
        };
        let t = from_f64(vec![n, c, 1, 1], x.dtype(), out)?;
        return Ok(from_canonical(&t, op));
    }
    let win = Windows {
        plane_in: h * w,
        plane_out,
        w,
        rows: &wins_h,
        cols: &wins_w,
        max,
        include_pad: a.count_include_pad,
        threads: t,
    };
    // An f32 average pool: per plane `avg_plane_framed` where it runs, else `Windows::pool`
    // (the same chains).
    if !max && let Some(xs) = xc.as_f32() {
        let counts: Vec<(usize, usize)> = wins_w.iter().map(|(c, pw)| (c.len(), *pw)).collect();
        let one_plane = Windows { threads: 1, ..win };
        // Every output is written (each plane kernel covers its rows whole): a kept buffer
        // serves without being zeroed first.
        let mut out = crate::par::scratch_f32(n * c * plane_out);
        crate::par::for_each_chunk_mut(&mut out, plane_out.max(1), t, |off, dst| {
            let base = off / plane_out.max(1) * h * w;
            let src = &xs[base..base + h * w];
            let (dims, pad) = ([w, ow, aw.s], a.count_include_pad);
            let framed = crate::par::with_scratch(&PHASES, |phases| {
                avg_plane_framed(src, dst, &wins_h, &cols, &counts, dims, pad, phases)
            });
            if !framed {
                one_plane.pool(src, dst, |v| v as f32);
            }
        });
        let t = out.into_tensor(vec![n, c, oh, ow])?;
        return Ok(from_canonical(&t, op));
    }
    // Averages (and the max of other dtypes) accumulate in f64; an f32 input is read and
    // written as it is (each element widened exactly, each result rounded once).
    let t = match xc.as_f32() {
        Some(xs) => {
            let mut out = vec![0.0f32; n * c * plane_out];
            win.pool(xs, &mut out, |v| v as f32);
            crate::util::tensor(vec![n, c, oh, ow], fusebox_core::runtime::Storage::F32(out))?
        }
        None => {
            let mut out = vec![0.0f64; n * c * plane_out];
            win.pool(&xc.to_f64_vec(), &mut out, |v| v);
            from_f64(vec![n, c, oh, ow], x.dtype(), out)?
        }
    };
    Ok(from_canonical(&t, op))
}

/// The windows of a 2-D pool (see [`pool2d`]) over whole `NCHW` planes.
struct Windows<'a> {
    plane_in: usize,
    plane_out: usize,
    /// The input row length.
    w: usize,
    /// Per output row / column: the input positions in range, and the count with padding.
    rows: &'a [(Vec<usize>, usize)],
    cols: &'a [(Vec<usize>, usize)],
    max: bool,
    include_pad: bool,
    threads: usize,
}

impl Windows<'_> {
    /// Pools `xs` into `out` (planes spread over the threads), each result computed in f64
    /// and stored through `store`.
    fn pool<T, O>(&self, xs: &[T], out: &mut [O], store: impl Fn(f64) -> O + Sync)
    where
        T: Copy + Into<f64> + Sync,
        O: Send,
    {
        let po = self.plane_out.max(1);
        crate::par::for_each_chunk_mut(out, po, self.threads, |off, dst| {
            let base = off / po * self.plane_in;
            let src = &xs[base..base + self.plane_in];
            let mut it = dst.iter_mut();
            for (rows, ph) in self.rows {
                for (cols, pw) in self.cols {
                    let mut acc = if self.max { f64::NEG_INFINITY } else { 0.0 };
                    for &y in rows {
                        let line = &src[y * self.w..(y + 1) * self.w];
                        for &xx in cols {
                            let v: f64 = line[xx].into();
                            if self.max {
                                if v > acc || v.is_nan() {
                                    acc = v;
                                }
                            } else {
                                acc += v;
                            }
                        }
                    }
                    if !self.max {
                        let cnt = if self.include_pad {
                            ph * pw
                        } else {
                            rows.len() * cols.len()
                        };
                        acc = if cnt == 0 { 0.0 } else { acc / cnt as f64 };
                    }
                    if let Some(d) = it.next() {
                        *d = store(acc);
                    }
                }
            }
        });
    }
}

/// `adaptive_avg_pool2d`: output cell `i` averages input rows
/// `[floor(i * H / OH), ceil((i + 1) * H / OH))` (and likewise for columns).
pub(crate) fn adaptive_avg_pool2d(x: &Tensor, a: &AdaptivePool2dAttrs) -> KResult<Tensor> {
    if x.rank() != 4 {
        return Err(format!("expected a 4-D input, found shape {:?}", x.shape()));
    }
    let lp = layout4(&a.layout, "NCHW")?;
    let op = layout4(&a.out_layout, "NCHW")?;
    let xc = to_canonical(x, lp);
    let (n, c, h, w) = (xc.shape()[0], xc.shape()[1], xc.shape()[2], xc.shape()[3]);
    let (oh, ow) = match a.output_size {
        Some([p, q]) => (usize_of(p, "output size")?, usize_of(q, "output size")?),
        None => (h, w),
    };
    let dims = (h, w, oh, ow);
    let out = match xc.as_f32() {
        Some(xs) => adaptive_means(xs, f64::from, dims, n * c),
        None => adaptive_means(&xc.to_f64_vec(), |v| v, dims, n * c),
    };
    let t = from_f64(vec![n, c, oh, ow], x.dtype(), out)?;
    Ok(from_canonical(&t, op))
}

/// The window means of [`adaptive_avg_pool2d`] over `planes` planes of `xs` (`h × w` each), in
/// `f64`: a window's elements as [`crate::simd::striped_sum`]'s interleaved partial sums (the
/// whole window at once where it spans full rows, as a global pooling's does; else row by row,
/// the rows' sums added in order), so 8 independent additions are in flight instead of one
/// chain. Planes are spread over the threads; the order within a window is fixed, so the result
/// is the same for every thread count.
fn adaptive_means<T: Copy + Sync>(
    xs: &[T],
    to: impl Fn(T) -> f64 + Copy + Sync,
    (h, w, oh, ow): (usize, usize, usize, usize),
    planes: usize,
) -> Vec<f64> {
    let cells = oh * ow;
    let mut out = vec![0.0f64; planes * cells];
    if cells == 0 {
        return out;
    }
    let range = |i: usize, len: usize, o: usize| (i * len / o, ((i + 1) * len).div_ceil(o));
    let t = crate::par::threads_for(planes * h * w, 1 << 16);
    let per = planes.div_ceil(4 * t).max(1);
    crate::par::for_each_chunk_mut(&mut out, per * cells, t, |off, chunk| {
        for (k, cell) in chunk.chunks_mut(cells).enumerate() {
            let base = (off / cells + k) * h * w;
            for i in 0..oh {
                let (y0, y1) = range(i, h, oh);
                for j in 0..ow {
                    let (x0, x1) = range(j, w, ow);
                    let s = if (x0, x1) == (0, w) {
                        crate::simd::striped_sum(&xs[base + y0 * w..base + y1 * w], to)
                    } else {
                        (y0..y1)
                            .map(|y| {
                                let row = &xs[base + y * w + x0..base + y * w + x1];
                                crate::simd::striped_sum(row, to)
                            })
                            .fold(0.0, |a, b| a + b)
                    };
                    let cnt = (y1 - y0) * (x1 - x0);
                    cell[i * ow + j] = if cnt == 0 { 0.0 } else { s / cnt as f64 };
                }
            }
        }
    });
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::panic, reason = "test code: a failure is a panic")]

    use super::*;
    use fusebox_core::ir::DType;

    #[test]
    fn adaptive_avg_pool_matches_the_window_means_for_every_thread_count() {
        // Global (the window spans whole rows), overlapping windows, an output larger than the
        // input (windows of one element), an empty input; 600 planes so several tasks run.
        for (n, c, h, w, oh, ow) in [
            (1usize, 600usize, 7usize, 7usize, 1usize, 1usize),
            (2, 3, 9, 11, 2, 5),
            (1, 4, 7, 7, 3, 3),
            (1, 2, 3, 2, 5, 4),
            (1, 2, 0, 3, 2, 2),
        ] {
            let v: Vec<f32> = (0..n * c * h * w)
                .map(|i| ((i * 37) % 23) as f32 * 0.37 - 4.0)
                .collect();
            let x = Tensor::from_f32(vec![n, c, h, w], v.clone()).unwrap_or_else(|e| panic!("{e}"));
            // The definition: each cell averages rows [i·H/OH, ⌈(i+1)·H/OH⌉) and likewise for
            // columns, summed here one element at a time in f64.
            let mut want = Vec::new();
            for p in 0..n * c {
                for i in 0..oh {
                    for j in 0..ow {
                        let (y0, y1) = (i * h / oh, ((i + 1) * h).div_ceil(oh));
                        let (x0, x1) = (j * w / ow, ((j + 1) * w).div_ceil(ow));
                        let mut s = 0.0f64;
                        for y in y0..y1 {
                            for xx in x0..x1 {
                                s += f64::from(v[(p * h + y) * w + xx]);
                            }
                        }
                        let cnt = (y1 - y0) * (x1 - x0);
                        want.push(if cnt == 0 { 0.0 } else { s / cnt as f64 } as f32);
                    }
                }
            }
            let a = AdaptivePool2dAttrs {
                output_size: Some([oh as i64, ow as i64]),
                layout: "NCHW".into(),
                out_layout: "NCHW".into(),
            };
            let one = crate::par::with_threads(1, || adaptive_avg_pool2d(&x, &a))
                .unwrap_or_else(|e| panic!("{e}"));
            let two = crate::par::with_threads(2, || adaptive_avg_pool2d(&x, &a))
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(one.shape(), &[n, c, oh, ow]);
            let (one, two) = (one.to_f32_vec(), two.to_f32_vec());
            assert_eq!(
                one.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                two.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
            for (k, (g, e)) in one.iter().zip(&want).enumerate() {
                assert!(
                    (g - e).abs() <= 1e-6 * e.abs().max(1.0),
                    "{n} {c} {h} {w} -> {oh} {ow}: cell {k}: {g} vs {e}"
                );
            }
            // f64 data goes through the same sums.
            let y64 =
                adaptive_avg_pool2d(&x.cast(DType::F64), &a).unwrap_or_else(|e| panic!("{e}"));
            for (g, e) in y64.to_f64_vec().iter().zip(&one) {
                assert!((*g as f32 - e).abs() <= 1e-6 * e.abs().max(1.0));
            }
        }
    }

    /// Square pool attributes: kernel `k`, stride `s`, dilation `d`, padding `p` on every side.
    fn pool_attrs(
        k: i64,
        s: i64,
        d: i64,
        p: i64,
        ceil_mode: bool,
        include_pad: bool,
    ) -> Pool2dAttrs {
        Pool2dAttrs {
            pool_size: [k, k],
            strides: [s, s],
            dilation: [d, d],
            padding: [p, p, p, p],
            ceil_mode,
            count_include_pad: include_pad,
            layout: "NCHW".into(),
            out_layout: "NCHW".into(),
        }
    }

    #[test]
    fn a_global_average_pool_takes_the_plane_means() {
        // 2048 planes of 7×7 (ResNet-50's last pool); the kernel over the whole plane, also
        // with padding that `count_include_pad` leaves out of the count.
        let (c, h, w) = (2048, 7, 7);
        let v: Vec<f32> = (0..c * h * w)
            .map(|i| ((i * 7919) % 1013) as f32 / 97.0 - 5.0)
            .collect();
        let x = Tensor::from_f32(vec![1, c, h, w], v.clone()).unwrap_or_else(|e| panic!("{e}"));
        let means: Vec<f64> = v
            .chunks(h * w)
            .map(|p| p.iter().map(|&x| f64::from(x)).sum::<f64>() / (h * w) as f64)
            .collect();
        for (k, pad, include_pad, divisor) in [
            (7, 0, false, 49.0),
            (7, 0, true, 49.0),
            (9, 1, false, 49.0),
            // Padding counted: 81 positions, not the plane's mean (the windowed path).
            (9, 1, true, 81.0),
        ] {
            let a = pool_attrs(k, 1, 1, pad, false, include_pad);
            let one = crate::par::with_threads(1, || pool2d(&x, &a, false))
                .unwrap_or_else(|e| panic!("{e}"));
            let two = crate::par::with_threads(2, || pool2d(&x, &a, false))
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(one.shape(), &[1, c, 1, 1]);
            let bits = |t: &Tensor| {
                t.to_f32_vec()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(&one), bits(&two));
            for (ch, (g, m)) in one.to_f32_vec().iter().zip(&means).enumerate() {
                let want = (m * 49.0 / divisor) as f32;
                assert!(
                    (g - want).abs() <= 1e-6 * want.abs().max(1.0),
                    "kernel {k}, pad {pad}, include_pad {include_pad}: channel {ch}: {g} vs {want}"
                );
            }
        }
        // The same plane means as adaptive_avg_pool2d's, bit for bit.
        let a = pool_attrs(7, 1, 1, 0, false, false);
        let ad = AdaptivePool2dAttrs {
            output_size: Some([1, 1]),
            layout: "NCHW".into(),
            out_layout: "NCHW".into(),
        };
        let p = pool2d(&x, &a, false).unwrap_or_else(|e| panic!("{e}"));
        let q = adaptive_avg_pool2d(&x, &ad).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.to_f32_vec(), q.to_f32_vec());
    }

    /// [`max_plane_framed`] on one plane: whether it ran, and what it wrote.
    fn framed(x: &Tensor, a: &Pool2dAttrs) -> (bool, Vec<f32>) {
        struct Op<'a>(&'a [f32], &'a mut [f32], &'a Windows2, [usize; 3]);
        impl pulp::WithSimd for Op<'_> {
            type Output = bool;
            fn with_simd<S: pulp::Simd>(self, simd: S) -> bool {
                let Op(src, dst, wins, dims) = self;
                let mut phases = Vec::new();
                max_plane_framed(simd, src, dst, &wins.0, &wins.1, dims, &mut phases)
            }
        }
        type Windows2 = (Vec<(Vec<usize>, usize)>, Vec<(usize, usize, isize)>);
        let (h, w) = (x.shape()[2], x.shape()[3]);
        let ax = |i: usize, len: usize| Axis {
            len,
            k: a.pool_size[i] as usize,
            s: a.strides[i] as usize,
            d: a.dilation[i] as usize,
            pad0: a.padding[i] as usize,
            pad1: a.padding[i + 2] as usize,
        };
        let (ah, aw) = (ax(0, h), ax(1, w));
        let (oh, ow) = (
            ah.out_len(false).unwrap_or_else(|e| panic!("{e}")),
            aw.out_len(false).unwrap_or_else(|e| panic!("{e}")),
        );
        let wins_h: Vec<_> = (0..oh).map(|o| ah.window(o)).collect();
        let cols = aw.runs(ow);
        let src = x.to_f32_vec();
        let mut dst = vec![0.0f32; oh * ow];
        let wins = (wins_h, cols);
        let ran = crate::simd::dispatch(Op(&src[..h * w], &mut dst, &wins, [w, ow, aw.s]));
        (ran, dst)
    }

    #[test]
    fn framed_max_pool_keeps_the_window_order() {
        // Wide planes (several groups of vectors per output row), maxima that are zeros of
        // both signs (the first in window order wins), infinities; one plane with a NaN.
        let (c, h, w) = (3, 12, 150);
        let mut v: Vec<f32> = (0..c * h * w)
            .map(|i| match (i * 7 + i / 5) % 6 {
                0 => -0.0,
                1 => 0.0,
                2 => -1.0,
                3 => f32::NEG_INFINITY,
                4 => -0.5,
                _ => -2.0,
            })
            .collect();
        v[c * h * w - 7] = f32::INFINITY;
        v[h * w + 31] = f32::NAN;
        let x = Tensor::from_f32(vec![1, c, h, w], v).unwrap_or_else(|e| panic!("{e}"));
        let x64 = x.cast(DType::F64);
        for (k, s, d, p) in [
            (3, 2, 1, 1),
            (3, 1, 1, 1),
            (2, 2, 1, 0),
            (5, 3, 2, 2),
            (20, 1, 1, 17),
        ] {
            let a = pool_attrs(k, s, d, p, false, false);
            let bits = |v: &[f32]| -> Vec<u32> { v.iter().map(|x| x.to_bits()).collect() };
            let want = pool2d(&x64, &a, true).unwrap_or_else(|e| panic!("{e}"));
            for t in [1, 2] {
                let got = crate::par::with_threads(t, || pool2d(&x, &a, true))
                    .unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(got.shape(), want.shape());
                assert_eq!(
                    bits(&got.to_f32_vec()),
                    bits(&want.to_f32_vec()),
                    "k {k} s {s} d {d} p {p}"
                );
            }
            // The framed kernel itself runs on the first plane (no NaN) unless the padding
            // leaves its frame, and gives the same plane.
            let (ran, plane) = framed(&x, &a);
            assert_eq!(ran, (p as usize) < POOL_FRAME, "k {k} s {s} d {d} p {p}");
            if ran {
                let n = plane.len();
                assert_eq!(bits(&plane), bits(&want.to_f32_vec()[..n]));
            }
        }
        // A stride far past the window would deal each row into 1,000 phases: the row loop.
        let far = Tensor::from_f32(vec![1, 1, 3, 2000], (0..6000).map(|i| i as f32).collect())
            .unwrap_or_else(|e| panic!("{e}"));
        let a = pool_attrs(3, 1000, 1, 1, false, false);
        assert!(!framed(&far, &a).0);
        let got = pool2d(&far, &a, true).unwrap_or_else(|e| panic!("{e}"));
        let want = pool2d(&far.cast(DType::F64), &a, true).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got.to_f32_vec(), want.to_f32_vec());
        // The plane with a NaN is not the framed kernel's.
        let second = Tensor::from_f32(vec![1, 1, h, w], x.to_f32_vec()[h * w..2 * h * w].to_vec())
            .unwrap_or_else(|e| panic!("{e}"));
        let a = pool_attrs(3, 2, 1, 1, false, false);
        assert!(!framed(&second, &a).0);
    }

    #[test]
    fn f32_average_pool_matches_the_f64_path() {
        // The framed kernel (AVX-512) and the window loop give the f64 path's sums, rounded
        // once: wide planes, both paddings counted and not, ceil mode, a padding past the
        // frame, strides 1 to 3, values of many magnitudes and an infinity.
        let (c, h, w) = (3, 11, 133);
        let mut v: Vec<f32> = (0..c * h * w)
            .map(|i| ((i * 7919) % 2003) as f32 * 1.37e-3 * if i % 3 == 0 { -1e3 } else { 1.0 })
            .collect();
        v[h * w + 17] = f32::INFINITY;
        let x = Tensor::from_f32(vec![1, c, h, w], v).unwrap_or_else(|e| panic!("{e}"));
        let x64 = x.cast(DType::F64);
        for (k, s, p, include_pad, ceil) in [
            (3, 2, 1, false, false),
            (3, 1, 1, true, false),
            (3, 1, 1, false, false),
            (5, 3, 2, true, true),
            (2, 2, 0, false, true),
            (20, 1, 17, false, false),
        ] {
            let a = pool_attrs(k, s, 1, p, ceil, include_pad);
            let want = pool2d(&x64, &a, false).unwrap_or_else(|e| panic!("{e}"));
            let want: Vec<u32> = want
                .to_f64_vec()
                .iter()
                .map(|&v| (v as f32).to_bits())
                .collect();
            for t in [1, 2] {
                let got = crate::par::with_threads(t, || pool2d(&x, &a, false))
                    .unwrap_or_else(|e| panic!("{e}"));
                let got: Vec<u32> = got.to_f32_vec().iter().map(|v| v.to_bits()).collect();
                assert_eq!(
                    got, want,
                    "k {k} s {s} p {p} include_pad {include_pad} ceil {ceil}"
                );
            }
        }
    }

    #[test]
    fn f32_max_pool_matches_the_f64_path() {
        // NaN and both zeros included: the first maximum and the last NaN in window order win.
        let mut v: Vec<f32> = (0..2 * 3 * 9 * 11)
            .map(|i| ((i * 37) % 23) as f32 - 11.0)
            .collect();
        v[5] = f32::NAN;
        v[40] = -0.0;
        v[41] = 0.0;
        let x = Tensor::from_f32(vec![2, 3, 9, 11], v).unwrap_or_else(|e| panic!("{e}"));
        let x64 = x.cast(DType::F64);
        for (k, s, d, p, ceil) in [
            (3, 2, 1, 1, false),
            (2, 2, 1, 0, true),
            (3, 1, 2, 2, false),
            (4, 3, 1, 1, true),
            (1, 1, 1, 0, false),
        ] {
            let a = Pool2dAttrs {
                pool_size: [k, k],
                strides: [s, s + 1],
                dilation: [d, d],
                padding: [p, p, p, 0],
                ceil_mode: ceil,
                count_include_pad: false,
                layout: "NCHW".into(),
                out_layout: "NCHW".into(),
            };
            let got = pool2d(&x, &a, true).unwrap_or_else(|e| panic!("{e}"));
            let want = pool2d(&x64, &a, true).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(got.shape(), want.shape());
            let bits =
                |t: &Tensor| -> Vec<u32> { t.to_f32_vec().iter().map(|x| x.to_bits()).collect() };
            assert_eq!(
                bits(&got),
                bits(&want),
                "k {k} s {s} d {d} p {p} ceil {ceil}"
            );
        }
    }
}
