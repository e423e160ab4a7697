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
//!   pixels: the data is the left operand of [`crate::gemm_packed::gemm_tiles`] as it lies
//!   (pixels × `C`), the weight its packed right operand (`C × O`, [`super::cols_weights`],
//!   which the executor keeps for a constant weight); every element is one FMA chain over `C`
//!   in order.
//! - A depthwise kernel (one input channel per group, `O = C`) of any size, stride, padding
//!   and dilation: channels on the vector lanes, each output the chain of its taps in `(ky,
//!   kx)` order, one FMA each from `+0.0`, a tap over the padding adding `0 · w` — the chain
//!   of the `NCHW` depthwise kernels, so the bits are theirs. Output rows are spread over the
//!   threads.
//! - Any other kernel of one group (a CNN's first layer): an im2col matrix of pixels ×
//!   `(c, ky, kx)` (the row order of the `NCHW` kernels' packed weight, so the same packed
//!   form serves), then [`crate::gemm_packed::gemm_tiles`].
//! - The epilogue ([`Step`]s) runs on each finished GEMM tile or row of pixels, the channel of
//!   element `i` of a pixel's slice being its position (bias, `batch_norm`, `relu`, `clip` per
//!   channel; a residual or program by its offset in the `NHWC` output): each element gets the
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
use faer::reborrow::ReborrowMut;
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
    let mut out = crate::par::scratch_f32(pixels * o);
    // Per tile of the GEMM (rows: pixels; columns: channels `c0..`), in one SIMD dispatch.
    let ep = |r0: usize, c0: usize, tile: faer::MatMut<'_, f32>| -> KResult<()> {
        struct Tile<'a, 't>(&'a [Step], usize, usize, usize, faer::MatMut<'t, f32>);
        impl pulp::WithSimd for Tile<'_, '_> {
            type Output = KResult<()>;
            #[inline(always)]
            fn with_simd<S: pulp::Simd>(self, _: S) -> KResult<()> {
                let Tile(steps, o, r0, c0, mut tile) = self;
                for i in 0..tile.nrows() {
                    let row = tile
                        .rb_mut()
                        .row_mut(i)
                        .try_as_row_major_mut()
                        .ok_or("conv2d: an output tile is not row-major")?
                        .as_slice_mut();
                    apply_inline(steps, c0, (r0 + i) * o + c0, row);
                }
                Ok(())
            }
        }
        crate::simd::dispatch(Tile(steps, o, r0, c0, tile))
    };
    let ep: crate::gemm_packed::TileEpilogue<'_> = &ep;
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
                crate::gemm_packed::gemm_tiles(pixels, xs, packed, &mut out, threads, epilogue)?;
            } else {
                let k = g.kdim();
                fusebox_core::runtime::memory::check_alloc(
                    "the im2col matrix of relax.nn.conv2d",
                    DType::F32,
                    &[pixels, k],
                )
                .map_err(|e| e.to_string())?;
                // The matrix in this thread's kept buffer (every element written below).
                crate::par::with_scratch(&COLUMNS, |cols| {
                    cols.resize(pixels * k, 0.0);
                    let t = crate::par::threads_for(pixels * k, 1 << 16).min(threads);
                    let rows_per = (1usize << 14).div_ceil(k.max(1)).max(1);
                    crate::par::for_each_chunk_mut(cols, rows_per * k, t, |off, chunk| {
                        im2col(xs, &g, off / k.max(1), chunk);
                    });
                    crate::gemm_packed::gemm_tiles(
                        pixels, cols, packed, &mut out, threads, epilogue,
                    )
                })?;
            }
        }
    }
    out.into_tensor(vec![g.n, g.oh, g.ow, o])
}

thread_local! {
    /// The im2col matrix of the calling thread, kept between calls.
    static COLUMNS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
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
/// each output row. Output pixels whose taps all fall inside the image read them at fixed
/// offsets (four pixels at a time); the others, along the borders, check each tap and read
/// zeros for one over the padding (the same `0 · w` in the chain).
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
    let row_len = g.ow * c;
    if row_len == 0 || c == 0 {
        return Ok(());
    }
    let zeros = vec![0.0f32; c];
    let offs: Vec<usize> = (0..taps)
        .map(|t| ((t / g.kw) * g.dh * g.w + (t % g.kw) * g.dw) * c)
        .collect();
    // The output columns whose taps are all inside the image's columns.
    let span_w = (g.kw - 1) * g.dw;
    let lo = g.pl.div_ceil(g.sw).min(g.ow);
    let hi = if g.w + g.pl > span_w {
        ((g.w + g.pl - span_w - 1) / g.sw + 1).min(g.ow)
    } else {
        0
    };
    let t = crate::par::threads_for(out.len() * taps, 1 << 16).min(threads);
    crate::par::for_each_chunk_mut(out, row_len, t, |off, dst| {
        let r = off / row_len;
        let (img, oy) = (r / g.oh, r % g.oh);
        // The row's taps all inside the image's rows: its interior columns read in place.
        let top = (oy * g.sh).checked_sub(g.pt);
        let inner = top.filter(|&y| y + (g.kh - 1) * g.dh < g.h);
        let (lo, hi, base) = match inner {
            Some(y) if lo < hi => (lo, hi, (img * g.h + y) * g.w * c),
            _ => (0, 0, 0),
        };
        crate::simd::dispatch(Row {
            xs,
            zeros: &zeros,
            wt: &wt,
            offs: &offs,
            g,
            img,
            oy,
            inner: (lo, hi, base),
            dst,
            steps,
            at: off,
        });
    });
    Ok(())
}

/// Output pixels [`Row`] computes together.
const PX: usize = 4;

/// One output row of [`depthwise`]: interior pixel `ox` (`lo ≤ ox < hi`) reads tap `t` at
/// `xs[base + (ox · sw − pl) · c + offs[t]..][..c]`; the others check each tap.
struct Row<'a> {
    xs: &'a [f32],
    zeros: &'a [f32],
    wt: &'a [f32],
    offs: &'a [usize],
    g: &'a Geom,
    img: usize,
    oy: usize,
    inner: (usize, usize, usize),
    dst: &'a mut [f32],
    steps: &'a [Step],
    at: usize,
}

impl pulp::WithSimd for Row<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) {
        let Row {
            xs,
            zeros,
            wt,
            offs,
            g,
            img,
            oy,
            inner: (lo, hi, base),
            dst,
            steps,
            at,
        } = self;
        let c = g.c;
        let lanes = S::F32_LANES;
        let taps = offs.len();
        let load = |v: &[f32]| -> S::f32s { bytemuck::pod_read_unaligned(bytemuck::cast_slice(v)) };
        // Where tap `t` of pixel `ox` reads (None: the padding).
        let tap = |ox: usize, t: usize| -> Option<usize> {
            let iy = (oy * g.sh + (t / g.kw) * g.dh)
                .checked_sub(g.pt)
                .filter(|&v| v < g.h)?;
            let ix = (ox * g.sw + (t % g.kw) * g.dw)
                .checked_sub(g.pl)
                .filter(|&v| v < g.w)?;
            Some(((img * g.h + iy) * g.w + ix) * c)
        };
        let px0 = |ox: usize| base + (ox * g.sw - g.pl) * c;
        let mut c0 = 0;
        if taps <= 9 {
            // Two vectors of channels: their taps' weights loaded once per row; one load and
            // one FMA per tap and vector, in tap order.
            while c0 + 2 * lanes <= c {
                let wv: [[S::f32s; 2]; 9] = std::array::from_fn(|t| {
                    if t < taps {
                        let w = &wt[t * c + c0..][..2 * lanes];
                        [load(&w[..lanes]), load(&w[lanes..])]
                    } else {
                        [simd.splat_f32s(0.0); 2]
                    }
                });
                let wv = &wv[..taps];
                let mut ox = lo;
                // Four interior pixels at a time: eight independent chains.
                while ox + PX <= hi {
                    let mut acc = [[simd.splat_f32s(0.0); 2]; PX];
                    for (w, &o) in wv.iter().zip(offs) {
                        for (j, acc) in acc.iter_mut().enumerate() {
                            let p = px0(ox + j) + o + c0;
                            let x = &xs[p..p + 2 * lanes];
                            acc[0] = simd.mul_add_f32s(load(&x[..lanes]), w[0], acc[0]);
                            acc[1] = simd.mul_add_f32s(load(&x[lanes..]), w[1], acc[1]);
                        }
                    }
                    for (j, acc) in acc.iter().enumerate() {
                        let d = (ox + j) * c + c0;
                        dst[d..d + 2 * lanes].copy_from_slice(bytemuck::cast_slice(&acc[..]));
                    }
                    ox += PX;
                }
                // The other pixels one at a time (interior ones in place, border ones checked).
                for ox in (0..lo).chain(ox..g.ow) {
                    let interior = ox >= lo && ox < hi;
                    let mut acc = [simd.splat_f32s(0.0); 2];
                    for (t, w) in wv.iter().enumerate() {
                        let x = if interior {
                            let p = px0(ox) + offs[t] + c0;
                            &xs[p..p + 2 * lanes]
                        } else {
                            match tap(ox, t) {
                                Some(p) => &xs[p + c0..p + c0 + 2 * lanes],
                                None => &zeros[c0..c0 + 2 * lanes],
                            }
                        };
                        acc[0] = simd.mul_add_f32s(load(&x[..lanes]), w[0], acc[0]);
                        acc[1] = simd.mul_add_f32s(load(&x[lanes..]), w[1], acc[1]);
                    }
                    let d = ox * c + c0;
                    dst[d..d + 2 * lanes].copy_from_slice(bytemuck::cast_slice(&acc[..]));
                }
                c0 += 2 * lanes;
            }
        }
        // The rest (a last vector, channels past the vectors, more than 9 taps): vector by
        // vector, then channel by channel, the same chain.
        while c0 + lanes <= c {
            for ox in 0..g.ow {
                let mut acc = simd.splat_f32s(0.0);
                for t in 0..taps {
                    let x = match tap(ox, t) {
                        Some(p) => &xs[p + c0..p + c0 + lanes],
                        None => &zeros[c0..c0 + lanes],
                    };
                    acc = simd.mul_add_f32s(load(x), load(&wt[t * c + c0..][..lanes]), acc);
                }
                let d = ox * c + c0;
                dst[d..d + lanes].copy_from_slice(bytemuck::cast_slice(std::slice::from_ref(&acc)));
            }
            c0 += lanes;
        }
        for ox in 0..g.ow {
            for ch in c0..c {
                let mut acc = 0.0f32;
                for t in 0..taps {
                    let v = tap(ox, t).map_or(0.0, |p| xs[p + ch]);
                    acc = v.mul_add(wt[t * c + ch], acc);
                }
                dst[ox * c + ch] = acc;
            }
        }
        if !steps.is_empty() {
            for (p, px) in dst.chunks_exact_mut(c).enumerate() {
                apply_inline(steps, 0, at + p * c, px);
            }
        }
    }
}

/// Applies `steps` to `row`: the values of channels `ch0..` of one output pixel, starting at
/// element `at` of the `NHWC` output (see the module doc).
/// Inlined into its caller's SIMD dispatch.
#[inline(always)]
fn apply_inline(steps: &[Step], ch0: usize, at: usize, row: &mut [f32]) {
    for s in steps {
        match s {
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
            Step::Program(p) => p.0.apply(at, row),
            _ => {
                if !super::epilogue::channel_step(s, ch0, row) {
                    return;
                }
            }
        }
    }
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
