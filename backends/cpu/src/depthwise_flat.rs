//! Depthwise convolution of one `NCHW` plane whose output has the input's extent (stride 1,
//! "same" padding: MobileNet's 3×3 layers), computed over the plane as one flat array.
//!
//! Contract:
//!
//! - With stride 1 and `OH = H`, `OW = W`, output pixel `i = y·W + x` reads input pixel
//!   `i + off(ky, kx)` for tap `(ky, kx)`, where `off = (ky·dh − pt)·W + (kx·dw − pl)` is the
//!   same for every pixel. So the plane is computed as consecutive full vectors of the flat
//!   index, each tap one unaligned load and one FMA per vector: no row loop, no padded copy of
//!   the plane's rows. Rows above and below the image read the zero margins of the thread's
//!   buffer ([`FlatPlane`]: the plane copied once, whole, between zero margins); a column
//!   shift that crosses a row's end is masked to `+0.0` per tap (an `and` with a column mask
//!   made once per geometry).
//! - Each output element is the chain of its taps in `(ky, kx)` order, one FMA each from
//!   `+0.0`, a tap over the padding adding `0 · w`: the same bits as the row kernel of
//!   [`crate::conv`] (tested), on every instruction set and for every thread count.
//! - Small planes gain most: a 7×7 plane is 4 vectors of 16 lanes (the row kernel runs 8
//!   rows of 8-lane vectors), and the plane costs one `memcpy` instead of one per row.
//!
//! ```text
//! y = R.nn.conv2d(x, w, strides=[1, 1], padding=[1, 1, 1, 1], groups=960)  # x: (1, 960, 7, 7)
//! ; each 7×7 plane: 49 outputs = 4 vectors × 9 taps (one load + one FMA each)
//! ```

use std::cell::RefCell;

/// The widest vector this kernel runs (AVX-512's 16 `f32` lanes): the margin past the plane.
const MAX_LANES: usize = 16;

/// Output vectors computed together (independent FMA chains).
const V: usize = 4;

/// A plane geometry the flat kernel takes, with its taps and column masks.
#[derive(Debug, PartialEq)]
pub(crate) struct Plan {
    /// The plane's pixels (`H · W`).
    hw: usize,
    /// Zero slots before the plane in the buffer.
    lead: usize,
    /// Slots in the buffer.
    len: usize,
    /// Per tap in `(ky, kx)` order: the buffer offset of output pixel 0's input, and the
    /// column-mask row (`None`: the tap reads within the row for every pixel).
    taps: Vec<(usize, Option<usize>)>,
    /// Column masks, one row of `hw` rounded up to whole vectors of [`V`] × [`MAX_LANES`]
    /// per masked tap: `!0` where the tap's column is inside the image, `0` elsewhere.
    masks: Vec<u32>,
}

/// Convolution geometry the caller passes: `[h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow]`.
pub(crate) type Shape = [usize; 12];

impl Plan {
    /// The plan for a plane geometry, or `None` unless stride 1, the output's extent the
    /// input's, and rows narrower than 16 pixels.
    pub(crate) fn new(s: Shape) -> Option<Plan> {
        let [h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow] = s;
        // Rows of 16 or more pixels fill the row kernel's vectors; it is faster there
        // (measured on MobileNetV2's 28², 56² and 112² planes).
        if sh != 1 || sw != 1 || oh != h || ow != w || h == 0 || w == 0 || w >= MAX_LANES {
            return None;
        }
        if kh * kw == 0 {
            return None;
        }
        let hw = h.checked_mul(w)?;
        let block = V * MAX_LANES;
        let rounded = hw.div_ceil(block) * block;
        let offs: Vec<(isize, usize)> = (0..kh * kw)
            .map(|t| {
                let (ky, kx) = (t / kw, t % kw);
                let dy = (ky * dh) as isize - pt as isize;
                let dx = (kx * dw) as isize - pl as isize;
                (dy * w as isize + dx, kx)
            })
            .collect();
        let lo = offs.iter().map(|o| o.0).min()?.min(0).unsigned_abs();
        let hi = offs.iter().map(|o| o.0).max()?.max(0).unsigned_abs();
        let lead = lo;
        let len = lead + rounded + hi + MAX_LANES;
        let mut masks = Vec::new();
        let mut taps = Vec::with_capacity(offs.len());
        let mut rows: Vec<(usize, usize)> = Vec::new();
        for (off, kx) in offs {
            let shift = (kx * dw) as isize - pl as isize;
            let start = (lead as isize + off) as usize;
            if shift == 0 {
                taps.push((start, None));
                continue;
            }
            let row = match rows.iter().find(|r| r.0 == kx) {
                Some(&(_, r)) => r,
                None => {
                    let r = masks.len() / rounded;
                    masks.extend((0..rounded).map(|i| {
                        let x = (i % w) as isize + shift;
                        if i < hw && x >= 0 && x < w as isize {
                            !0u32
                        } else {
                            0
                        }
                    }));
                    rows.push((kx, r));
                    r
                }
            };
            taps.push((start, Some(row)));
        }
        Some(Plan {
            hw,
            lead,
            len,
            taps,
            masks,
        })
    }

    /// The rounded length of one mask row.
    fn rounded(&self) -> usize {
        self.hw.div_ceil(V * MAX_LANES) * V * MAX_LANES
    }
}

/// A thread's plane buffer: zero margins around the copied plane, cleared when the plan's
/// length changes.
#[derive(Default)]
pub(crate) struct FlatPlane {
    buf: Vec<f32>,
    lead: usize,
}

thread_local! {
    static BUFFER: RefCell<FlatPlane> = RefCell::new(FlatPlane::default());
}

/// Runs `f` with the calling thread's buffer.
pub(crate) fn with_buffer<R>(f: impl FnOnce(&mut FlatPlane) -> R) -> R {
    let mut b = BUFFER.with(|p| std::mem::take(&mut *p.borrow_mut()));
    let r = f(&mut b);
    BUFFER.with(|p| *p.borrow_mut() = b);
    r
}

/// One output plane `dst` (`hw` elements) from input plane `x` and the plane's taps `w`
/// (`kh · kw`, `(ky, kx)` order), with vectors of `S` (see the module doc).
#[inline(always)]
pub(crate) fn plane<S: pulp::Simd>(
    simd: S,
    plan: &Plan,
    buffer: &mut FlatPlane,
    x: &[f32],
    w: &[f32],
    dst: &mut [f32],
) {
    let hw = plan.hw;
    if x.len() != hw || dst.len() != hw || w.len() != plan.taps.len() {
        return;
    }
    if buffer.buf.len() != plan.len || buffer.lead != plan.lead {
        buffer.buf.clear();
        buffer.buf.resize(plan.len, 0.0);
        buffer.lead = plan.lead;
    }
    let buf = &mut buffer.buf;
    buf[plan.lead..plan.lead + hw].copy_from_slice(x);
    let buf = &buf[..];
    let lanes = S::F32_LANES;
    let rounded = plan.rounded();
    let zero = simd.splat_f32s(0.0);
    let step = V * lanes;
    for i0 in (0..hw).step_by(step) {
        let mut acc = [zero; V];
        for (&(start, mask), &wt) in plan.taps.iter().zip(w) {
            let wv = simd.splat_f32s(wt);
            let at = start + i0;
            // In range: the buffer holds the plane rounded up to whole blocks plus margins.
            let Some(src) = buf.get(at..at + step) else {
                continue;
            };
            let load = |v: usize| -> S::f32s {
                bytemuck::pod_read_unaligned(bytemuck::cast_slice(&src[v * lanes..(v + 1) * lanes]))
            };
            match mask.and_then(|r| plan.masks.get(r * rounded + i0..r * rounded + i0 + step)) {
                Some(m) => {
                    for (v, a) in acc.iter_mut().enumerate() {
                        let mv: S::u32s = bytemuck::pod_read_unaligned(bytemuck::cast_slice(
                            &m[v * lanes..(v + 1) * lanes],
                        ));
                        let xv: S::f32s =
                            bytemuck::cast(simd.and_u32s(bytemuck::cast(load(v)), mv));
                        *a = simd.mul_add_f32s(xv, wv, *a);
                    }
                }
                None => {
                    for (v, a) in acc.iter_mut().enumerate() {
                        *a = simd.mul_add_f32s(load(v), wv, *a);
                    }
                }
            }
        }
        for (v, a) in acc.iter().enumerate() {
            let x0 = i0 + v * lanes;
            if x0 >= hw {
                break;
            }
            let vals: &[f32] = bytemuck::cast_slice(std::slice::from_ref(a));
            let n = lanes.min(hw - x0);
            dst[x0..x0 + n].copy_from_slice(&vals[..n]);
        }
    }
}
