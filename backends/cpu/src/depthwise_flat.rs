//! Depthwise convolution of one `NCHW` plane whose output rows are under 16 pixels
//! (MobileNet's 7×7 and 14×14 layers, stride 1 or 2), computed over the output plane as one
//! flat array.
//!
//! Contract:
//!
//! - With stride `s` in both directions, tap `(ky, kx)` of output pixel `(oy, ox)` reads input
//!   row `s·oy + ky·dh − pt = s·(oy + qy) + py` and likewise column `s·(ox + qx) + px`. The
//!   input plane is dealt once into phase planes `(py, px)` with the output's row pitch `ow`
//!   (stride 1: one phase, the plane itself), so in the phase plane the tap reads flat index
//!   `i + qy·ow + qx` for output pixel `i = oy·ow + ox`: one offset for every pixel. The
//!   plane is computed as consecutive full vectors of `i`, each tap one unaligned load and
//!   one FMA per vector: no row loop. Rows above and below read the zero margins of the
//!   thread's buffer ([`FlatPlane`]); a column shift that leaves the row is masked to `+0.0`
//!   per tap (an `and` with a column mask made once per geometry). [`Plan::new`] declines a
//!   geometry where a tap past the output's last row or column would read the image rather
//!   than its padding (the phase planes hold only `oh × ow`).
//! - Each output element is the chain of its taps in `(ky, kx)` order, one FMA each from
//!   `+0.0`, a tap over the padding adding `0 · w`: the same bits as the row kernel of
//!   [`crate::conv`] (tested, NaN and infinities included), on every instruction set and for
//!   every thread count.
//! - Small planes gain most: a 7×7 output is 4 vectors of 16 lanes, where the row kernel runs
//!   8 rows of 8-lane vectors and copies the plane row by row. The thread's buffer has two
//!   slots: the next plane is copied in while this one is computed, so no load waits on a
//!   store just made (960 planes of 7×7 on one thread: 0.060 → 0.047 ms).
//!
//! ```text
//! y = R.nn.conv2d(x, w, strides=[1, 1], padding=[1, 1, 1, 1], groups=960)  # x: (1, 960, 7, 7)
//! ; each 7×7 plane: 49 outputs = 4 vectors × 9 taps (one load + one FMA each)
//! y = R.nn.conv2d(x, w, strides=[2, 2], padding=[1, 1, 1, 1], groups=576)  # x: (1, 576, 14, 14)
//! ; each plane dealt into 4 phase planes of 7×7; 49 outputs = 4 vectors × 9 taps
//! ```

use std::cell::RefCell;

/// The widest vector this kernel runs (AVX-512's 16 `f32` lanes): the margin past the plane.
const MAX_LANES: usize = 16;

/// Output vectors computed together (independent FMA chains).
const V: usize = 4;

/// A plane geometry the flat kernel takes, with its taps and column masks.
#[derive(Debug, PartialEq)]
pub(crate) struct Plan {
    /// The input plane's extent `(h, w)` and the stride.
    h: usize,
    w: usize,
    s: usize,
    /// The output plane's extent `(oh, ow)` (`ow` is the phase planes' row pitch).
    oh: usize,
    ow: usize,
    /// Zero slots before each phase plane in its region of the buffer.
    lead: usize,
    /// Slots per phase region (the buffer holds one per phase).
    region: usize,
    /// The phases `(py, px)` the taps read, each a region of the buffer, in first-use order.
    phases: Vec<(usize, usize)>,
    /// Per tap in `(ky, kx)` order: the buffer offset of output pixel 0's input, and the
    /// column-mask row (`None`: the tap reads inside the image for every pixel's column).
    taps: Vec<(usize, Option<usize>)>,
    /// Column masks, one row of `hw` rounded up to whole blocks of [`V`] × [`MAX_LANES`]
    /// per distinct masked column shift: `!0` where the tap's column is inside the image.
    masks: Vec<u32>,
}

/// Convolution geometry the caller passes: `[h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow]`.
pub(crate) type Shape = [usize; 12];

impl Plan {
    /// The plan for a plane geometry, or `None` unless both strides are equal, output rows
    /// are under 16 pixels, and every tap that reads past the output's last row or column
    /// there reads the image's padding (true of "same"-padded stride-1 and stride-2 layers).
    pub(crate) fn new(shape: Shape) -> Option<Plan> {
        let [h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow] = shape;
        // Rows of 16 or more pixels fill the row kernel's vectors; it is faster there
        // (measured on MobileNetV2's 28², 56² and 112² planes).
        if sh != sw || sh == 0 || oh == 0 || ow == 0 || ow >= MAX_LANES || kh * kw == 0 {
            return None;
        }
        let s = sh;
        let hw = oh.checked_mul(ow)?;
        let block = V * MAX_LANES;
        let rounded = hw.div_ceil(block) * block;
        // Tap (ky, kx) reads input row s·oy + dy = s·(oy + qy) + py: phase row py, phase
        // index oy + qy (and the same for columns).
        let split = |d: isize| (d.div_euclid(s as isize), d.rem_euclid(s as isize) as usize);
        let mut phases: Vec<(usize, usize)> = Vec::new();
        let mut offs = Vec::with_capacity(kh * kw);
        for t in 0..kh * kw {
            let (ky, kx) = (t / kw, t % kw);
            let (qy, py) = split((ky * dh) as isize - pt as isize);
            let (qx, px) = split((kx * dw) as isize - pl as isize);
            // Phase indices past the output's extent must be the image's padding.
            if (qy > 0 && s * oh + py < h) || (qx > 0 && s * ow + px < w) {
                return None;
            }
            let phase = match phases.iter().position(|&p| p == (py, px)) {
                Some(i) => i,
                None => {
                    phases.push((py, px));
                    phases.len() - 1
                }
            };
            offs.push((phase, qy * ow as isize + qx, qx, px));
        }
        let lo = offs.iter().map(|o| o.1).min()?.min(0).unsigned_abs();
        let hi = offs.iter().map(|o| o.1).max()?.max(0).unsigned_abs();
        let lead = lo;
        let region = lead + rounded + hi + MAX_LANES;
        // The buffer (a region per phase) must be addressable.
        region.checked_mul(phases.len())?;
        let mut masks = Vec::new();
        let mut rows: Vec<((isize, usize), usize)> = Vec::new();
        let mut taps = Vec::with_capacity(offs.len());
        for (phase, off, qx, px) in offs {
            let start = (phase * region + lead) as isize + off;
            let start = usize::try_from(start).ok()?;
            // Column ox reads phase column ox + qx: image column s·(ox + qx) + px.
            let inside = |ox: usize| {
                let j = ox as isize + qx;
                j >= 0 && j < ow as isize && s * j as usize + px < w
            };
            if (0..ow).all(inside) {
                taps.push((start, None));
                continue;
            }
            let row = match rows.iter().find(|r| r.0 == (qx, px)) {
                Some(&(_, r)) => r,
                None => {
                    let r = masks.len() / rounded;
                    masks.extend(
                        (0..rounded).map(|i| if i < hw && inside(i % ow) { !0u32 } else { 0 }),
                    );
                    rows.push(((qx, px), r));
                    r
                }
            };
            taps.push((start, Some(row)));
        }
        Some(Plan {
            h,
            w,
            s,
            oh,
            ow,
            lead,
            region,
            phases,
            taps,
            masks,
        })
    }

    /// The output's pixels (`oh · ow`).
    fn hw(&self) -> usize {
        self.oh * self.ow
    }

    /// The rounded length of one mask row.
    fn rounded(&self) -> usize {
        self.hw().div_ceil(V * MAX_LANES) * V * MAX_LANES
    }

    /// The layout of the buffer: its length and where each plane lies in it.
    fn layout(&self) -> [usize; 7] {
        let len = self.region * self.phases.len();
        [len, self.lead, self.region, self.ow, self.h, self.w, self.s]
    }

    /// Copies input plane `x` into the phase regions of `buf` (phase `(py, px)` holds image
    /// pixel `(s·i + py, s·j + px)` at `i · ow + j`; what lies outside the image stays zero).
    #[inline(always)]
    fn fill(&self, x: &[f32], buf: &mut [f32]) {
        let (h, w, s, ow) = (self.h, self.w, self.s, self.ow);
        if x.len() != h * w || buf.len() != self.layout()[0] {
            return;
        }
        for (k, &(py, px)) in self.phases.iter().enumerate() {
            let base = k * self.region + self.lead;
            let dst = &mut buf[base..base + self.hw()];
            if s == 1 && px == 0 && py == 0 && ow == w && self.oh == h {
                dst.copy_from_slice(x);
                continue;
            }
            for (i, row) in dst.chunks_exact_mut(ow).enumerate() {
                let r = s * i + py;
                if r >= h {
                    break;
                }
                let src = &x[r * w..(r + 1) * w];
                for (d, &v) in row.iter_mut().zip(src.iter().skip(px).step_by(s)) {
                    *d = v;
                }
            }
        }
    }
}

/// A thread's plane buffers: zero margins around the copied phase planes, cleared when the
/// plan's layout changes (planes of one layout write the same slots, so the rest stays zero).
/// Two slots, so that the next plane is copied in while this one is computed: the kernel
/// then never loads what was stored just before (a store-to-load stall on every vector of a
/// 7×7 plane).
#[derive(Default)]
pub(crate) struct FlatPlane {
    slots: [Vec<f32>; 2],
    /// The [`Plan::layout`] the slots were cleared for.
    layout: [usize; 7],
}

impl FlatPlane {
    /// Lays the slots out for `plan`: once per run of planes, before [`FlatPlane::load`].
    pub(crate) fn prepare(&mut self, plan: &Plan) {
        let layout = plan.layout();
        if self.layout != layout {
            for b in &mut self.slots {
                b.clear();
                b.resize(layout[0], 0.0);
            }
            self.layout = layout;
        }
    }

    /// Copies input plane `x` into slot `slot % 2`.
    #[inline(always)]
    pub(crate) fn load(&mut self, plan: &Plan, slot: usize, x: &[f32]) {
        plan.fill(x, &mut self.slots[slot % 2]);
    }

    /// Slot `slot % 2`, as [`plane`] reads it.
    pub(crate) fn slot(&self, slot: usize) -> &[f32] {
        &self.slots[slot % 2]
    }
}

thread_local! {
    /// The calling thread's [`FlatPlane`] (used through [`crate::par::with_scratch`]).
    pub(crate) static BUFFER: RefCell<FlatPlane> = RefCell::new(FlatPlane::default());
}

/// One output plane `dst` (`hw` elements) from the input plane loaded into `buf` (a
/// [`FlatPlane::slot`]) and the plane's taps `w` (`kh · kw`, `(ky, kx)` order), with vectors
/// of `S` (see the module doc).
#[inline(always)]
pub(crate) fn plane<S: pulp::Simd>(simd: S, plan: &Plan, buf: &[f32], w: &[f32], dst: &mut [f32]) {
    let hw = plan.hw();
    if dst.len() != hw || w.len() != plan.taps.len() {
        return;
    }
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
            match dst.get_mut(x0..x0 + lanes) {
                // A whole vector: a copy of constant length (one store, no `memcpy` call).
                Some(out) => out.copy_from_slice(vals),
                None => {
                    for (o, &v) in dst[x0..].iter_mut().zip(vals) {
                        *o = v;
                    }
                }
            }
        }
    }
}
