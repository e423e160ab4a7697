//! `conv2d` with `NHWC` data and output (what ConvertLayout makes of a model for
//! `conv2d_layout = ["NHWC", ...]`), computed in that layout: no transposition of the data or
//! the output, each pixel's channels contiguous.
//!
//! Contract:
//!
//! - [`takes`]: `float32` data, weight and result, `data_layout = out_layout = "NHWC"`, any
//!   kernel layout, and a kernel of one of the shapes below; other `NHWC` convolutions run
//!   through the canonical `NCHW` path (transposed there and back).
//! - A 1×1 kernel, stride 1, no padding, one group, at least [`crate::gemm_packed::MIN_ROWS`]
//!   pixels: the data is the left operand of [`crate::gemm_packed::gemm`] as it lies (pixels ×
//!   `C`), the weight its packed right operand (`C × O`, [`super::cols_weights`], which the
//!   executor keeps for a constant weight); every element is one FMA chain over `C` in order.
//! - A depthwise kernel (one input channel per group, `O = C`) of any size, stride, padding
//!   and dilation: channels on the vector lanes, each output the chain of its taps in `(ky,
//!   kx)` order, one FMA each from `+0.0`, a tap over the padding adding `0 · w` — the chain
//!   of the `NCHW` depthwise kernels, so the bits are theirs. Output rows are spread over the
//!   threads.
//! - Any other kernel of one group (a CNN's first layer): an im2col matrix of pixels ×
//!   `(c, ky, kx)` (the row order of the `NCHW` kernels' packed weight, so the same packed
//!   form serves), then [`crate::gemm_packed::gemm`].
//! - The epilogue ([`Step`]s) runs on each finished row of pixels, the channel of element `i`
//!   of a pixel's slice being its position (bias, `batch_norm`, `relu`, `clip` per channel; a
//!   residual or program by its offset in the `NHWC` output): each element gets the
//!   operations its ops give it, in order. Bit-identical for every thread count.
//!
//! ```text
//! gv = R.nn.conv2d(x, w, strides=[1, 1], padding=[1, 1, 1, 1], groups=144,
//!         data_layout="NHWC", kernel_layout="OHWI", out_layout="NHWC")  # x: (1, 56, 56, 144)
//! ; each output pixel: 9 taps × 9 vectors of 16 channels
//! ```

use super::{Geom, Step, geometry};
use crate::nn::layout4;
use crate::util::{KResult, to_canonical};
use fusebox_core::ir::DType;
use fusebox_core::op::Conv2dAttrs;
use fusebox_core::runtime::Tensor;

/// The `NCHW` positions of `NHWC` (`to_canonical` of an `NHWC` tensor).
const NHWC: [usize; 4] = [0, 3, 1, 2];

/// What the `NHWC` kernels do with a convolution.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    Pointwise,
    Depthwise,
    Im2col,
}

/// The geometry (canonical sizes) of an `NHWC` convolution one of the kernels here runs, and
/// the path.
fn plan(x: &Tensor, w: &Tensor, a: &Conv2dAttrs) -> Option<(Geom, Path)> {
    if a.data_layout != "NHWC"
        || a.out_layout != "NHWC"
        || x.rank() != 4
        || w.rank() != 4
        || x.dtype() != DType::F32
        || w.dtype() != DType::F32
        || a.out_dtype.is_some_and(|d| d != DType::F32)
    {
        return None;
    }
    let wp = layout4(&a.kernel_layout, "OIHW").ok()?;
    let xs: Vec<usize> = NHWC.iter().map(|&p| x.shape()[p]).collect();
    let ws: Vec<usize> = wp.iter().map(|&p| w.shape()[p]).collect();
    let g = geometry(&xs, &ws, a).ok()?;
    let path = if g.g == 1 && g.direct() && g.n * g.npix() >= crate::gemm_packed::MIN_ROWS {
        Path::Pointwise
    } else if g.g == g.c && g.o == g.c && g.ci == 1 {
        Path::Depthwise
    } else if g.g == 1 && g.n * g.npix() >= crate::gemm_packed::MIN_ROWS {
        Path::Im2col
    } else {
        return None;
    };
    Some((g, path))
}

/// Whether [`conv2d`] runs this convolution (see the module doc).
pub(crate) fn takes(x: &Tensor, w: &Tensor, a: &Conv2dAttrs) -> bool {
    plan(x, w, a).is_some()
}

/// Whether [`super::cols_weights`] should pack this convolution's weight for [`conv2d`].
pub(super) fn packs(x: &Tensor, w: &Tensor, a: &Conv2dAttrs) -> Option<Geom> {
    plan(x, w, a).and_then(|(g, p)| (p != Path::Depthwise).then_some(g))
}

/// `conv2d(x, w)` then `steps`, in `NHWC` (see the module doc); `cols` the packed weight when
/// the executor has it. The caller checked [`takes`] and the steps' shapes.
pub(crate) fn conv2d(
    x: &Tensor,
    w: &Tensor,
    a: &Conv2dAttrs,
    steps: &[Step],
    cols: Option<&crate::gemm_packed::PackedB>,
) -> KResult<Tensor> {
    let (g, path) = plan(x, w, a).ok_or("conv2d: not an NHWC convolution of the NHWC kernels")?;
    let xs = x.as_f32().ok_or("conv2d: NHWC data must be float32")?;
    let (o, pixels) = (g.o, g.n * g.npix());
    let threads = crate::par::threads();
    let mut out = crate::par::scratch_f32(pixels * o, threads);
    let ep = |row: usize, col: usize, r: &mut [f32]| apply(steps, col, row * o + col, r);
    let ep: crate::matmul::Epilogue<'_> = &ep;
    let epilogue = (!steps.is_empty()).then_some(ep);
    match path {
        Path::Depthwise => depthwise(xs, w, a, &g, steps, &mut out, threads)?,
        Path::Pointwise | Path::Im2col => {
            let computed;
            let packed = match cols.filter(|p| p.dims() == (g.kdim(), o)) {
                Some(p) => p,
                None => {
                    let wc = to_canonical(w, layout4(&a.kernel_layout, "OIHW")?);
                    let ws = wc.as_f32().ok_or("conv2d: the weight must be float32")?;
                    computed = super::cols_pack(ws, &g)?;
                    &computed
                }
            };
            if path == Path::Pointwise {
                crate::gemm_packed::gemm(pixels, xs, packed, &mut out, threads, epilogue)?;
            } else {
                let k = g.kdim();
                fusebox_core::runtime::memory::check_alloc(
                    "the im2col matrix of relax.nn.conv2d",
                    DType::F32,
                    &[pixels, k],
                )
                .map_err(|e| e.to_string())?;
                let mut cols = vec![0.0f32; pixels * k];
                let t = crate::par::threads_for(pixels * k, 1 << 16).min(threads);
                let rows_per = (1usize << 14).div_ceil(k.max(1)).max(1);
                crate::par::for_each_chunk_mut(&mut cols, rows_per * k, t, |off, chunk| {
                    im2col(xs, &g, off / k.max(1), chunk);
                });
                crate::gemm_packed::gemm(pixels, &cols, packed, &mut out, threads, epilogue)?;
            }
        }
    }
    out.into_tensor(vec![g.n, g.oh, g.ow, o])
}

/// Rows `first..` of the im2col matrix of `NHWC` data `x` (one row per output pixel, over all
/// images; column `(c · KH + ky) · KW + kx`, zero in the padding) into `block` (whole rows).
fn im2col(x: &[f32], g: &Geom, first: usize, block: &mut [f32]) {
    let k = g.kdim();
    let (taps, npix) = (g.kh * g.kw, g.npix());
    for (r, row) in block.chunks_exact_mut(k.max(1)).enumerate() {
        let p = first + r;
        let (img, q) = (p / npix, p % npix);
        let (oy, ox) = (q / g.ow, q % g.ow);
        for ky in 0..g.kh {
            let iy = (oy * g.sh + ky * g.dh)
                .checked_sub(g.pt)
                .filter(|&v| v < g.h);
            for kx in 0..g.kw {
                let ix = (ox * g.sw + kx * g.dw)
                    .checked_sub(g.pl)
                    .filter(|&v| v < g.w);
                let tap = ky * g.kw + kx;
                match (iy, ix) {
                    (Some(iy), Some(ix)) => {
                        let src = &x[((img * g.h + iy) * g.w + ix) * g.c..][..g.c];
                        for (c, &v) in src.iter().enumerate() {
                            row[c * taps + tap] = v;
                        }
                    }
                    _ => {
                        for c in 0..g.c {
                            row[c * taps + tap] = 0.0;
                        }
                    }
                }
            }
        }
    }
}

/// The depthwise convolution of `NHWC` data into `out` (`N × OH × OW × C`), then `steps` on
/// each output row.
fn depthwise(
    xs: &[f32],
    w: &Tensor,
    a: &Conv2dAttrs,
    g: &Geom,
    steps: &[Step],
    out: &mut [f32],
    threads: usize,
) -> KResult<()> {
    // The weight as taps × channels: tap (ky, kx)'s values for every channel in a row.
    let wc = to_canonical(w, layout4(&a.kernel_layout, "OIHW")?);
    let ws = wc.as_f32().ok_or("conv2d: the weight must be float32")?;
    let (c, taps) = (g.c, g.kh * g.kw);
    let mut wt = vec![0.0f32; taps * c];
    for (ch, row) in ws.chunks_exact(taps).enumerate() {
        for (t, &v) in row.iter().enumerate() {
            wt[t * c + ch] = v;
        }
    }
    let zeros = vec![0.0f32; c];
    let row_len = g.ow * c;
    if row_len == 0 {
        return Ok(());
    }
    let t = crate::par::threads_for(out.len() * taps, 1 << 16).min(threads);
    crate::par::for_each_chunk_mut(out, row_len, t, |off, dst| {
        let r = off / row_len;
        let (img, oy) = (r / g.oh, r % g.oh);
        struct Row<'a> {
            xs: &'a [f32],
            wt: &'a [f32],
            zeros: &'a [f32],
            g: &'a Geom,
            img: usize,
            oy: usize,
            dst: &'a mut [f32],
        }
        impl pulp::WithSimd for Row<'_> {
            type Output = ();
            #[inline(always)]
            fn with_simd<S: pulp::Simd>(self, simd: S) {
                let Row {
                    xs,
                    wt,
                    zeros,
                    g,
                    img,
                    oy,
                    dst,
                } = self;
                let c = g.c;
                let lanes = S::F32_LANES;
                for (ox, px) in dst.chunks_exact_mut(c).enumerate() {
                    // The taps' input pixels (the zero row over the padding), in (ky, kx) order.
                    let mut srcs: [&[f32]; 25] = [zeros; 25];
                    let many = g.kh * g.kw > srcs.len();
                    let mut t = 0;
                    for ky in 0..g.kh {
                        let iy = (oy * g.sh + ky * g.dh)
                            .checked_sub(g.pt)
                            .filter(|&v| v < g.h);
                        for kx in 0..g.kw {
                            let ix = (ox * g.sw + kx * g.dw)
                                .checked_sub(g.pl)
                                .filter(|&v| v < g.w);
                            if let (Some(iy), Some(ix), false) = (iy, ix, many) {
                                srcs[t] = &xs[((img * g.h + iy) * g.w + ix) * c..][..c];
                            }
                            t += 1;
                        }
                    }
                    let taps = g.kh * g.kw;
                    if many {
                        // More than 25 taps: one tap at a time over the pixel (the same chain).
                        px.fill(0.0);
                        let mut t = 0;
                        for ky in 0..g.kh {
                            let iy = (oy * g.sh + ky * g.dh)
                                .checked_sub(g.pt)
                                .filter(|&v| v < g.h);
                            for kx in 0..g.kw {
                                let ix = (ox * g.sw + kx * g.dw)
                                    .checked_sub(g.pl)
                                    .filter(|&v| v < g.w);
                                let src = match (iy, ix) {
                                    (Some(iy), Some(ix)) => {
                                        &xs[((img * g.h + iy) * g.w + ix) * c..][..c]
                                    }
                                    _ => zeros,
                                };
                                let wr = &wt[t * c..][..c];
                                for ((o, &v), &k) in px.iter_mut().zip(src).zip(wr) {
                                    *o = v.mul_add(k, *o);
                                }
                                t += 1;
                            }
                        }
                        continue;
                    }
                    let mut c0 = 0;
                    // Four vectors of channels at a time over all taps, then one, then the rest.
                    while c0 + 4 * lanes <= c {
                        let mut acc = [simd.splat_f32s(0.0); 4];
                        for (tap, src) in srcs.iter().take(taps).enumerate() {
                            let wr = &wt[tap * c + c0..][..4 * lanes];
                            let xr = &src[c0..c0 + 4 * lanes];
                            for (v, a) in acc.iter_mut().enumerate() {
                                let xv: S::f32s = bytemuck::pod_read_unaligned(
                                    bytemuck::cast_slice(&xr[v * lanes..(v + 1) * lanes]),
                                );
                                let wv: S::f32s = bytemuck::pod_read_unaligned(
                                    bytemuck::cast_slice(&wr[v * lanes..(v + 1) * lanes]),
                                );
                                *a = simd.mul_add_f32s(xv, wv, *a);
                            }
                        }
                        for (v, a) in acc.iter().enumerate() {
                            px[c0 + v * lanes..c0 + (v + 1) * lanes]
                                .copy_from_slice(bytemuck::cast_slice(std::slice::from_ref(a)));
                        }
                        c0 += 4 * lanes;
                    }
                    while c0 + lanes <= c {
                        let mut acc = simd.splat_f32s(0.0);
                        for (tap, src) in srcs.iter().take(taps).enumerate() {
                            let wv: S::f32s = bytemuck::pod_read_unaligned(bytemuck::cast_slice(
                                &wt[tap * c + c0..][..lanes],
                            ));
                            let xv: S::f32s = bytemuck::pod_read_unaligned(bytemuck::cast_slice(
                                &src[c0..c0 + lanes],
                            ));
                            acc = simd.mul_add_f32s(xv, wv, acc);
                        }
                        px[c0..c0 + lanes]
                            .copy_from_slice(bytemuck::cast_slice(std::slice::from_ref(&acc)));
                        c0 += lanes;
                    }
                    for ch in c0..c {
                        let mut acc = 0.0f32;
                        for (tap, src) in srcs.iter().take(taps).enumerate() {
                            acc = src[ch].mul_add(wt[tap * c + ch], acc);
                        }
                        px[ch] = acc;
                    }
                }
            }
        }
        crate::simd::dispatch(Row {
            xs,
            wt: &wt,
            zeros: &zeros,
            g,
            img,
            oy,
            dst: &mut *dst,
        });
        if !steps.is_empty() {
            for (p, px) in dst.chunks_exact_mut(c).enumerate() {
                apply(steps, 0, off + p * c, px);
            }
        }
    });
    Ok(())
}

/// Applies `steps` to `row`: the values of channels `ch0..` of one output pixel, starting at
/// element `at` of the `NHWC` output (see the module doc).
pub(super) fn apply(steps: &[Step], ch0: usize, at: usize, row: &mut [f32]) {
    struct Op<'a>(&'a [Step], usize, usize, &'a mut [f32]);
    impl pulp::WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            let Op(steps, ch0, at, row) = self;
            let ch = ch0..ch0 + row.len();
            for s in steps {
                match s {
                    Step::Affine { mul, add } => {
                        let (Some(k), Some(b)) = (mul.get(ch.clone()), add.get(ch.clone())) else {
                            return;
                        };
                        for ((v, &k), &b) in row.iter_mut().zip(k).zip(b) {
                            *v = v.mul_add(k, b);
                        }
                    }
                    Step::Bias { b, bias_first } => {
                        let Some(b) = b.get(ch.clone()) else {
                            return;
                        };
                        if *bias_first {
                            // `add(b, x)` in its operand order (the NaN payload it gives).
                            #[allow(
                                clippy::assign_op_pattern,
                                reason = "b + x, not x + b: the operand order of the op"
                            )]
                            row.iter_mut().zip(b).for_each(|(v, &b)| *v = b + *v);
                        } else {
                            row.iter_mut().zip(b).for_each(|(v, &b)| *v += b);
                        }
                    }
                    Step::Residual { r, prev_first } => {
                        let Some(src) = r.as_f32().and_then(|d| d.get(at..at + row.len())) else {
                            return;
                        };
                        if *prev_first {
                            row.iter_mut().zip(src).for_each(|(v, &q)| *v += q);
                        } else {
                            #[allow(
                                clippy::assign_op_pattern,
                                reason = "r + x, not x + r: the operand order of the op"
                            )]
                            row.iter_mut().zip(src).for_each(|(v, &q)| *v = q + *v);
                        }
                    }
                    Step::Relu => row.iter_mut().for_each(|v| *v = super::relu(*v)),
                    Step::Clip { lo, hi } => {
                        row.iter_mut().for_each(|v| *v = v.max(*lo).min(*hi));
                    }
                    Step::Program(p) => p.0.apply(at, row),
                }
            }
        }
    }
    crate::simd::dispatch(Op(steps, ch0, at, row));
}

#[cfg(test)]
mod tests {
    #![allow(clippy::panic, reason = "test code: a failure is a panic")]

    use super::*;

    fn attrs(s: i64, p: i64, d: i64, groups: i64, kernel_layout: &str) -> Conv2dAttrs {
        Conv2dAttrs {
            strides: [s, s],
            padding: [p, p, p, p],
            dilation: [d, d],
            groups,
            data_layout: "NHWC".into(),
            kernel_layout: kernel_layout.into(),
            out_layout: "NHWC".into(),
            out_dtype: None,
        }
    }

    /// Small integers whose products and sums are exact in `f32`.
    fn exact(n: usize, seed: usize, m: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 37 + seed) % m) as f32 - (m / 2) as f32)
            .collect()
    }

    /// The definition in `NHWC` / `OIHW` indexing, in `f64`, written without the kernels.
    #[allow(clippy::too_many_arguments, reason = "a convolution's sizes")]
    fn definition(
        x: &[f32],
        [n, h, w, c]: [usize; 4],
        wt: &[f32],
        [o, ci, kh, kw]: [usize; 4],
        (s, p, d, groups): (usize, usize, usize, usize),
    ) -> (Vec<f32>, [usize; 4]) {
        let (oh, ow) = (
            (h + 2 * p - (kh - 1) * d - 1) / s + 1,
            (w + 2 * p - (kw - 1) * d - 1) / s + 1,
        );
        let og = o / groups;
        let mut out = vec![0.0f32; n * oh * ow * o];
        for img in 0..n {
            for oy in 0..oh {
                for ox in 0..ow {
                    for oc in 0..o {
                        let grp = oc / og;
                        let mut acc = 0.0f64;
                        for ch in 0..ci {
                            for ky in 0..kh {
                                for kx in 0..kw {
                                    let iy = (oy * s + ky * d) as isize - p as isize;
                                    let ix = (ox * s + kx * d) as isize - p as isize;
                                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                        continue;
                                    }
                                    let xi = ((img * h + iy as usize) * w + ix as usize) * c
                                        + grp * ci
                                        + ch;
                                    let wi = ((oc * ci + ch) * kh + ky) * kw + kx;
                                    acc += f64::from(x[xi]) * f64::from(wt[wi]);
                                }
                            }
                        }
                        out[((img * oh + oy) * ow + ox) * o + oc] = acc as f32;
                    }
                }
            }
        }
        (out, [n, oh, ow, o])
    }

    /// `OIHW` values permuted into `OHWI`.
    fn to_ohwi(wt: &[f32], [o, i, kh, kw]: [usize; 4]) -> Vec<f32> {
        let mut out = vec![0.0; wt.len()];
        for a in 0..o {
            for b in 0..i {
                for y in 0..kh {
                    for z in 0..kw {
                        out[((a * kh + y) * kw + z) * i + b] = wt[((a * i + b) * kh + y) * kw + z];
                    }
                }
            }
        }
        out
    }

    #[test]
    fn every_nhwc_path_matches_the_definition_for_any_thread_count() {
        // (data NHWC, weight OIHW, stride, padding, dilation, groups, the path)
        type Case = ([usize; 4], [usize; 4], (usize, usize, usize, usize), Path);
        let cases: [Case; 8] = [
            ([2, 5, 6, 24], [40, 24, 1, 1], (1, 0, 1, 1), Path::Pointwise),
            ([1, 9, 9, 7], [50, 7, 1, 1], (1, 0, 1, 1), Path::Pointwise),
            ([2, 7, 7, 80], [80, 1, 3, 3], (1, 1, 1, 80), Path::Depthwise),
            ([1, 9, 8, 20], [20, 1, 3, 3], (2, 1, 1, 20), Path::Depthwise),
            ([1, 8, 8, 16], [16, 1, 5, 5], (1, 4, 2, 16), Path::Depthwise),
            ([1, 11, 11, 3], [8, 3, 3, 3], (2, 1, 1, 1), Path::Im2col),
            ([2, 6, 5, 5], [9, 5, 3, 2], (1, 1, 1, 1), Path::Im2col),
            ([1, 10, 10, 4], [6, 4, 1, 1], (2, 0, 1, 1), Path::Im2col),
        ];
        for (i, (xs, ws, geo, path)) in cases.into_iter().enumerate() {
            let xv = exact(xs.iter().product(), i, 17);
            let wv = exact(ws.iter().product(), i + 3, 7);
            let (want, oshape) = definition(&xv, xs, &wv, ws, geo);
            let (s, p, d, g) = geo;
            for (layout, wdata, wshape) in [
                ("OIHW", wv.clone(), ws.to_vec()),
                ("OHWI", to_ohwi(&wv, ws), vec![ws[0], ws[2], ws[3], ws[1]]),
            ] {
                let a = attrs(s as i64, p as i64, d as i64, g as i64, layout);
                let x = Tensor::from_f32(xs.to_vec(), xv.clone()).unwrap_or_else(|e| panic!("{e}"));
                let w = Tensor::from_f32(wshape, wdata).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(plan(&x, &w, &a).map(|(_, p)| p), Some(path), "case {i}");
                for threads in [1, 2, 3] {
                    let y = crate::par::with_threads(threads, || super::super::conv2d(&x, &w, &a))
                        .unwrap_or_else(|e| panic!("case {i}: {e}"));
                    assert_eq!(y.shape(), oshape, "case {i}");
                    assert_eq!(
                        y.as_f32().unwrap_or(&[]),
                        &want[..],
                        "case {i} {layout} {threads}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_depthwise_kernel_gives_the_nchw_kernels_bits_and_the_epilogue_the_ops_bits() {
        // Values that round (not exact), NaN and infinities among them, on MobileNetV2-like
        // shapes: the NHWC result, transposed, equals the NCHW path's bit for bit.
        for (c, hw, s) in [(32usize, 12usize, 1i64), (144, 9, 2), (40, 7, 1)] {
            let mut xv: Vec<f32> = (0..c * hw * hw)
                .map(|i| ((i * 7919) % 1000) as f32 * 0.01123 - 5.3)
                .collect();
            xv[5] = f32::NAN;
            xv[c * 3 + 1] = f32::INFINITY;
            let wv: Vec<f32> = (0..c * 9)
                .map(|i| ((i * 31) % 97) as f32 * 0.0371 - 1.7)
                .collect();
            // NHWC data, NCHW copy of it.
            let x =
                Tensor::from_f32(vec![1, hw, hw, c], xv.clone()).unwrap_or_else(|e| panic!("{e}"));
            let mut nchw = vec![0.0f32; xv.len()];
            for p in 0..hw * hw {
                for ch in 0..c {
                    nchw[ch * hw * hw + p] = xv[p * c + ch];
                }
            }
            let xc = Tensor::from_f32(vec![1, c, hw, hw], nchw).unwrap_or_else(|e| panic!("{e}"));
            let w = Tensor::from_f32(vec![c, 1, 3, 3], wv).unwrap_or_else(|e| panic!("{e}"));
            let a = attrs(s, 1, 1, c as i64, "OIHW");
            let mut ac = a.clone();
            ac.data_layout = "NCHW".into();
            ac.out_layout = "NCHW".into();
            let bias: Vec<f32> = (0..c).map(|i| i as f32 * 0.25 - 3.0).collect();
            let steps = vec![
                Step::Bias {
                    b: bias.clone(),
                    bias_first: false,
                },
                Step::Clip { lo: 0.0, hi: 6.0 },
            ];
            let y = super::super::conv2d_fused(&x, &w, &a, &steps, Default::default())
                .unwrap_or_else(|e| panic!("{e}"));
            let yc = super::super::conv2d_fused(&xc, &w, &ac, &steps, Default::default())
                .unwrap_or_else(|e| panic!("{e}"));
            let (oh, ow) = (y.shape()[1], y.shape()[2]);
            let (yn, ycn) = (y.as_f32().unwrap_or(&[]), yc.as_f32().unwrap_or(&[]));
            for p in 0..oh * ow {
                for ch in 0..c {
                    assert_eq!(
                        yn[p * c + ch].to_bits(),
                        ycn[ch * oh * ow + p].to_bits(),
                        "c={c} pixel {p} channel {ch}"
                    );
                }
            }
            // The epilogue is the ops one by one: conv, then `add` of the bias, then `clip`.
            let plain = super::super::conv2d(&x, &w, &a).unwrap_or_else(|e| panic!("{e}"));
            for (i, (&v, &got)) in plain.as_f32().unwrap_or(&[]).iter().zip(yn).enumerate() {
                #[allow(
                    clippy::manual_clamp,
                    reason = "the clip kernel's max-then-min (NaN becomes the bound), not clamp"
                )]
                let want = (v + bias[i % c]).max(0.0).min(6.0);
                assert_eq!(got.to_bits(), want.to_bits(), "element {i}");
            }
        }
    }

    #[test]
    fn a_residual_and_a_batch_norm_follow_the_pointwise_product_in_nhwc() {
        let (xs, ws) = ([1usize, 6, 6, 16], [24usize, 16, 1, 1]);
        let xv = exact(xs.iter().product(), 1, 17);
        let wv = exact(ws.iter().product(), 2, 7);
        let x = Tensor::from_f32(xs.to_vec(), xv).unwrap_or_else(|e| panic!("{e}"));
        let w = Tensor::from_f32(ws.to_vec(), wv).unwrap_or_else(|e| panic!("{e}"));
        let a = attrs(1, 0, 1, 1, "OIHW");
        let r: Vec<f32> = (0..36 * 24).map(|i| (i % 13) as f32 - 6.5).collect();
        let rt = Tensor::from_f32(vec![1, 6, 6, 24], r.clone()).unwrap_or_else(|e| panic!("{e}"));
        let (mul, add): (Vec<f32>, Vec<f32>) = (0..24)
            .map(|i| (0.5 + i as f32 * 0.125, i as f32 - 12.0))
            .unzip();
        let steps = vec![
            Step::Affine {
                mul: mul.clone(),
                add: add.clone(),
            },
            Step::Residual {
                r: rt,
                prev_first: false,
            },
            Step::Relu,
        ];
        let plain = super::super::conv2d(&x, &w, &a).unwrap_or_else(|e| panic!("{e}"));
        let fused = super::super::conv2d_fused(&x, &w, &a, &steps, Default::default())
            .unwrap_or_else(|e| panic!("{e}"));
        for (i, (&v, &got)) in plain
            .as_f32()
            .unwrap_or(&[])
            .iter()
            .zip(fused.as_f32().unwrap_or(&[]))
            .enumerate()
        {
            let c = i % 24;
            let want = super::super::relu(r[i] + v.mul_add(mul[c], add[c]));
            assert_eq!(got.to_bits(), want.to_bits(), "element {i}");
        }
        // Tiles of one panel of 48 channels each (k · rows · 48 > the tile's work): each
        // pixel's later channels get their own bias values.
        let (xs, ws) = ([1usize, 16, 16, 400], [200usize, 400, 1, 1]);
        let x2 = Tensor::from_f32(xs.to_vec(), exact(xs.iter().product(), 3, 17))
            .unwrap_or_else(|e| panic!("{e}"));
        let w2 = Tensor::from_f32(ws.to_vec(), exact(ws.iter().product(), 4, 7))
            .unwrap_or_else(|e| panic!("{e}"));
        let b: Vec<f32> = (0..200).map(|i| i as f32).collect();
        let steps2 = vec![Step::Bias {
            b: b.clone(),
            bias_first: true,
        }];
        let plain = super::super::conv2d(&x2, &w2, &a).unwrap_or_else(|e| panic!("{e}"));
        for threads in [1, 2] {
            let fused = crate::par::with_threads(threads, || {
                super::super::conv2d_fused(&x2, &w2, &a, &steps2, Default::default())
            })
            .unwrap_or_else(|e| panic!("{e}"));
            let (p, f) = (plain.as_f32().unwrap_or(&[]), fused.as_f32().unwrap_or(&[]));
            assert_eq!(p.len(), 256 * 200);
            for (i, (&v, &got)) in p.iter().zip(f).enumerate() {
                assert_eq!(got.to_bits(), (b[i % 200] + v).to_bits(), "element {i}");
            }
        }
        // A residual of the NCHW shape does not fit an NHWC output.
        let bad = vec![Step::Residual {
            r: Tensor::from_f32(vec![1, 24, 6, 6], r).unwrap_or_else(|e| panic!("{e}")),
            prev_first: true,
        }];
        let e = super::super::conv2d_fused(&x, &w, &a, &bad, Default::default()).unwrap_err();
        assert!(e.contains("shape"), "{e}");
    }
}
