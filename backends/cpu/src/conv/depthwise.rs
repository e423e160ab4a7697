//! Depthwise convolution (one input and one output channel per group: MobileNet's 3×3
//! layers), the part of [`super`] that runs per plane: planes are the tasks, each output
//! element the chain of its taps in `(ky, kx)` order, one FMA each from `+0.0` (a tap over the
//! padding adds `0 · w`), then the epilogue over the plane while it is in cache.
//!
//! Contract:
//!
//! - Stride-2 3×3 layers with rows of 14 pixels or more, and stride-1 "same" 3×3 layers with
//!   rows of 16 or more, read straight from the plane with AVX-512 or AVX2
//!   ([`crate::depthwise_s2`], [`crate::depthwise_s1`]); other layers of stride 1 or 2
//!   on planes up to 64×64 (128×128 for stride 1) and planes under 16 pixels wide go over
//!   the plane as one flat array ([`crate::depthwise_flat`]); the rest through
//!   [`depthwise_planes`]' row kernel on a zero-padded, phase-dealt copy of the plane.
//! - Every path gives the same bits (tested against the row kernel, NaN and infinities
//!   included), for every thread count.
//!
//! ```text
//! y = R.nn.conv2d(x, w, strides=[2, 2], padding=[1, 1, 1, 1], groups=96)  # x: (1, 96, 112, 112)
//! ; 96 planes, each 56×56 outputs × 9 taps, then bias and clip over the plane
//! ```

use super::{Geom, Step, apply_steps_inline};
use crate::{depthwise_flat, depthwise_s1, depthwise_s2};
use std::cell::RefCell;

/// A depthwise convolution (one input and one output channel per group, as MobileNet's 3×3
/// layers): per output plane, the input plane is copied once into a zero-padded buffer whose
/// columns are dealt into `stride` phases (column `c` to phase `c % sw`, position `c / sw`),
/// so that for every output row and tap the window's columns are one contiguous run (the
/// padding is written once per thread and geometry; later planes only overwrite the interior).
/// Blocks of output rows × vectors stay in registers over the taps — 8 independent FMA chains,
/// so the FMA latency is hidden — the taps added in `(ky, kx)` order, one FMA per output
/// element; then the epilogue over the whole plane. Planes are the tasks, so the result does
/// not depend on the thread count. A tap over the padding adds `0 · w`, as the im2col
/// lowering of the reference does (so a NaN or infinite weight gives NaN there too).
/// Stride-2 3×3 layers with rows of 14 outputs or more run [`depthwise_s2`] on AVX-512 or
/// AVX2 (straight from the plane), stride-1 "same" ones with rows of 16 or more
/// [`depthwise_s1`]; output planes under 16 pixels wide and other 3×3 kernels of stride 1 or
/// 2 on planes of up to 64×64 (equal strides, "same" padding; 128×128 for stride 1) run
/// [`depthwise_flat`]: the same chains either way.
pub(super) fn depthwise(
    xs: &[f32],
    ws: &[f32],
    g: &Geom,
    steps: &[Step],
    out: &mut [f32],
    threads: usize,
) {
    let npix = g.npix();
    let t = crate::par::threads_for(g.n * g.o * npix * g.kh * g.kw, 1 << 16).min(threads);
    let planes_per_task = (g.n * g.o).div_ceil(t * 8).max(1);
    // A test may force narrower vectors: then the flat kernel runs.
    let direct = match depthwise_s2::Plan::new(g.plane_shape()) {
        Some(p) => Some(Direct::S2(p)),
        None => depthwise_s1::Plan::new(g.plane_shape()).map(Direct::S1),
    };
    if let Some(plan) = direct.filter(|_| forced_lanes().is_none()) {
        crate::par::for_each_chunk_mut(out, planes_per_task * npix, t, |off, chunk| {
            depthwise_direct_planes(xs, ws, g, steps, &plan, off / npix, chunk);
        });
        return;
    }
    let flat = flat_plan(g);
    crate::par::for_each_chunk_mut(out, planes_per_task * npix, t, |off, chunk| match &flat {
        Some(plan) => crate::par::with_scratch(&depthwise_flat::BUFFER, |buf| {
            depthwise_flat_planes(xs, ws, g, steps, plan, off / npix, chunk, buf);
        }),
        None => crate::par::with_scratch(&PADDED, |pad| {
            depthwise_planes(xs, ws, g, steps, off / npix, chunk, pad);
        }),
    });
}

/// A kernel that reads the `NCHW` plane where it lies: [`depthwise_s2`] for stride 2,
/// [`depthwise_s1`] for stride 1 (MobileNetV2's 32×112×112 and 144×56×56 layers, whose
/// planes [`depthwise_flat`] copied into its buffer first: session bg).
#[derive(Clone, Copy)]
enum Direct {
    S1(depthwise_s1::Plan),
    S2(depthwise_s2::Plan),
}

/// The output planes `first..` of [`depthwise`] in `chunk` by a [`Direct`] kernel, each
/// followed by its epilogue while it is in cache.
fn depthwise_direct_planes(
    xs: &[f32],
    ws: &[f32],
    g: &Geom,
    steps: &[Step],
    plan: &Direct,
    first: usize,
    chunk: &mut [f32],
) {
    struct Op<'a>(
        &'a [f32],
        &'a [f32],
        &'a Geom,
        &'a [Step],
        &'a Direct,
        usize,
        &'a mut [f32],
    );
    impl pulp::WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            let Op(xs, ws, g, steps, plan, first, chunk) = self;
            let (npix, image, taps) = (g.npix(), g.h * g.w, g.kh * g.kw);
            for (i, dst) in chunk.chunks_mut(npix.max(1)).enumerate() {
                let plane = first + i;
                let ch = plane % g.o;
                let x = &xs[plane * image..(plane + 1) * image];
                let w = &ws[ch * taps..(ch + 1) * taps];
                let done = match plan {
                    Direct::S1(p) => depthwise_s1::plane(p, x, w, dst),
                    Direct::S2(p) => depthwise_s2::plane(p, x, w, dst),
                };
                if done {
                    apply_steps_inline(steps, ch, plane * npix, dst);
                } else {
                    // Not taken after all (the plan is made for these sizes and this CPU):
                    // the row kernel, epilogue included.
                    crate::par::with_scratch(&PADDED, |pad| {
                        depthwise_planes(xs, ws, g, steps, plane, dst, pad);
                    });
                }
            }
        }
    }
    crate::simd::dispatch(Op(xs, ws, g, steps, plan, first, chunk));
}

/// The [`depthwise_flat`] plan of a depthwise geometry, where it takes it ([`plan_of`]).
pub(super) fn flat_plan(g: &Geom) -> Option<std::sync::Arc<depthwise_flat::Plan>> {
    plan_of(g.plane_shape())
}

/// The geometries whose [`depthwise_flat::Plan`] (or its absence) a thread keeps (then it
/// starts over): MobileNetV2 has 17.
const KEPT_PLANS: usize = 64;

thread_local! {
    /// The [`depthwise_flat::Plan`]s the calling thread made, by geometry.
    static PLANS: RefCell<Vec<(depthwise_flat::Shape, Option<std::sync::Arc<depthwise_flat::Plan>>)>> =
        const { RefCell::new(Vec::new()) };
}

/// [`depthwise_flat::Plan::new`] of `shape`, made once per thread and geometry: a plan's column
/// masks and tap tables took 6.5 K instructions to build, a third of a small depthwise
/// layer's call (callgrind), and depend on the geometry alone.
fn plan_of(shape: depthwise_flat::Shape) -> Option<std::sync::Arc<depthwise_flat::Plan>> {
    PLANS.with(|p| {
        let mut p = p.borrow_mut();
        if let Some((_, plan)) = p.iter().find(|(s, _)| *s == shape) {
            return plan.clone();
        }
        let plan = depthwise_flat::Plan::new(shape).map(std::sync::Arc::new);
        if p.len() >= KEPT_PLANS {
            p.clear();
        }
        p.push((shape, plan.clone()));
        plan
    })
}

/// The output planes `first..` of [`depthwise`] in `chunk` by [`depthwise_flat`] (its plan
/// kept per thread and geometry: [`plan_of`]), then the epilogue per plane while it is in cache.
#[allow(
    clippy::too_many_arguments,
    reason = "the plane range and its buffers, as depthwise_planes"
)]
pub(super) fn depthwise_flat_planes(
    xs: &[f32],
    ws: &[f32],
    g: &Geom,
    steps: &[Step],
    plan: &depthwise_flat::Plan,
    first: usize,
    chunk: &mut [f32],
    buf: &mut depthwise_flat::FlatPlane,
) {
    struct Op<'a> {
        xs: &'a [f32],
        ws: &'a [f32],
        g: &'a Geom,
        steps: &'a [Step],
        plan: &'a depthwise_flat::Plan,
        first: usize,
        chunk: &'a mut [f32],
        buf: &'a mut depthwise_flat::FlatPlane,
    }
    impl pulp::WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, simd: S) {
            let g = self.g;
            let (npix, taps) = (g.npix(), g.kh * g.kw);
            if npix == 0 {
                return;
            }
            let (plan, buf) = (self.plan, &mut *self.buf);
            buf.prepare(plan);
            let input = |plane: usize| &self.xs[plane * g.h * g.w..(plane + 1) * g.h * g.w];
            let planes = self.chunk.len() / npix;
            if planes > 0 {
                buf.load(plan, 0, input(self.first));
            }
            for (i, dst) in self.chunk.chunks_mut(npix).enumerate() {
                let plane = self.first + i;
                let ch = plane % g.o;
                // The next plane goes in while this one is computed (see FlatPlane).
                if i + 1 < planes {
                    buf.load(plan, i + 1, input(plane + 1));
                }
                let (x, w) = (buf.slot(i), &self.ws[ch * taps..(ch + 1) * taps]);
                // A test may force 8 lanes (AVX2) or 1: the same bits either way.
                match forced_lanes() {
                    #[cfg(target_arch = "x86_64")]
                    Some(8) if pulp::x86::V3::try_new().is_some() => {
                        if let Some(v3) = pulp::x86::V3::try_new() {
                            depthwise_flat::plane(v3, plan, x, w, dst);
                        }
                    }
                    Some(1) => depthwise_flat::plane(pulp::Scalar::new(), plan, x, w, dst),
                    _ => depthwise_flat::plane(simd, plan, x, w, dst),
                }
                apply_steps_inline(self.steps, ch, plane * npix, dst);
            }
        }
    }
    crate::simd::dispatch(Op {
        xs,
        ws,
        g,
        steps,
        plan,
        first,
        chunk,
        buf,
    });
}

/// A thread's padded, phase-dealt input plane of [`depthwise`], with the geometry it was laid
/// out for: planes of the same geometry write the same interior slots, so the padding stays
/// zero and the buffer is cleared only when the geometry changes.
#[derive(Default)]
pub(super) struct Padded {
    buf: Vec<f32>,
    /// `(hp, wp, s, pw, h, w, pt, pl)` of the current layout.
    key: [usize; 8],
}

thread_local! {
    static PADDED: std::cell::RefCell<Padded> = std::cell::RefCell::new(Padded::default());
}

/// The output planes `first..` of [`depthwise`] in `chunk`, in a function compiled for the
/// CPU's widest instruction set (`mul_add` is one FMA there; the same bits everywhere).
pub(super) fn depthwise_planes(
    xs: &[f32],
    ws: &[f32],
    g: &Geom,
    steps: &[Step],
    first: usize,
    chunk: &mut [f32],
    pad: &mut Padded,
) {
    struct Op<'a>(
        &'a [f32],
        &'a [f32],
        &'a Geom,
        &'a [Step],
        usize,
        &'a mut [f32],
        &'a mut Padded,
    );
    impl pulp::WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, simd: S) {
            let Op(xs, ws, g, steps, first, chunk, pad) = self;
            let npix = g.npix();
            if npix == 0 {
                return;
            }
            let taps = g.kh * g.kw;
            for (i, dst) in chunk.chunks_mut(npix).enumerate() {
                let plane = first + i;
                let ch = plane % g.o;
                let x = &xs[plane * g.h * g.w..(plane + 1) * g.h * g.w];
                let w = &ws[ch * taps..(ch + 1) * taps];
                // 16-lane vectors (AVX-512) where a row fills more than half of one; else
                // 8-lane ones (AVX2, also on an AVX-512 CPU: a 7-wide row would waste over
                // half of each 16-lane vector); one lane where neither is there. Every path
                // adds the same taps in the same order with one FMA each: the same bits.
                let want = forced_lanes().unwrap_or(S::F32_LANES);
                let lanes = match (want, S::F32_LANES) {
                    (16, 16) if g.ow > 8 => 16,
                    (w, l) if w >= 8 && l >= 8 => 8,
                    _ => 1,
                };
                let pw = deal_plane(x, g, pad, lanes.max(8));
                let p = &pad.buf;
                let v = block_shape(g.ow, lanes.max(8)).0;
                match (lanes, v) {
                    (16, 1) => depthwise_rows::<S, 1, 8, 24>(simd, p, pw, w, g, dst),
                    (16, 2) => depthwise_rows::<S, 2, 4, 40>(simd, p, pw, w, g, dst),
                    (16, _) => depthwise_rows::<S, 4, 2, 72>(simd, p, pw, w, g, dst),
                    (8, _) if depthwise_avx2(v, p, pw, w, g, dst) => {}
                    _ => {
                        let one = pulp::Scalar::new();
                        depthwise_rows::<pulp::Scalar, 4, 2, 12>(one, p, pw, w, g, dst);
                    }
                }
                // The epilogue over the whole plane while it is in cache (an NCHW plane is
                // contiguous, so `at` runs on with it).
                apply_steps_inline(steps, ch, plane * npix, dst);
            }
        }
    }
    crate::simd::dispatch(Op(xs, ws, g, steps, first, chunk, pad));
}

/// [`depthwise_rows`] with 8-lane vectors (AVX2), also from inside a wider instruction set (an
/// AVX-512 CPU has AVX2): `false` where there is no AVX2.
#[inline(always)]
fn depthwise_avx2(v: usize, p: &[f32], pw: usize, w: &[f32], g: &Geom, dst: &mut [f32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if let Some(v3) = pulp::x86::V3::try_new() {
        use pulp::x86::V3;
        match v {
            1 => depthwise_rows::<V3, 1, 8, 16>(v3, p, pw, w, g, dst),
            2 => depthwise_rows::<V3, 2, 4, 24>(v3, p, pw, w, g, dst),
            _ => depthwise_rows::<V3, 4, 2, 40>(v3, p, pw, w, g, dst),
        }
        return true;
    }
    let _ = (v, p, pw, w, g, dst);
    false
}

#[cfg(test)]
thread_local! {
    /// The lane count the depthwise tests ask for (0: the widest), so that each path runs
    /// on a CPU that has a wider one (the kernel reads it on the calling thread).
    pub(super) static FORCE_LANES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The lane count a test forces on [`depthwise_planes`] (`None`: the CPU's widest).
#[inline(always)]
fn forced_lanes() -> Option<usize> {
    #[cfg(test)]
    {
        Some(FORCE_LANES.with(std::cell::Cell::get)).filter(|&l| l > 0)
    }
    #[cfg(not(test))]
    {
        None
    }
}

/// The output block of [`depthwise_rows`] for output rows `ow` wide and vectors of `lanes`
/// lanes: `(vectors, rows)`, 8 accumulators in all (8 independent FMA chains) with little
/// waste past the row's end.
fn block_shape(ow: usize, lanes: usize) -> (usize, usize) {
    match ow.div_ceil(lanes.max(1)) {
        0..=1 => (1, 8),
        2 => (2, 4),
        _ => (4, 2),
    }
}

/// Slots past the end of the padded plane, so that every window row a block reads
/// ([`depthwise_rows`]' `WL` slots) is in range.
const SLACK: usize = 16;

/// Lays input plane `x` out in `pad`, zero-padded, its columns dealt into `stride` phases
/// (padded column `c` to phase `c % sw`, slot `c / sw`), and returns the slots per phase row.
#[inline(always)]
fn deal_plane(x: &[f32], g: &Geom, pad: &mut Padded, lanes: usize) -> usize {
    // The padded plane's extent: what the windows reach. Phase rows have room for the last
    // block of outputs read whole (the slots past the plane stay zero).
    let hp = (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1;
    let wp = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1;
    let s = g.sw.max(1);
    // Room for whole blocks of output rows and columns (the slots past the plane stay zero).
    let (v, r) = block_shape(g.ow, lanes);
    let rows = (g.oh.next_multiple_of(r) - 1) * g.sh + (g.kh - 1) * g.dh + 1;
    let reach = (g.kw - 1) * g.dw / s;
    let pw = wp.div_ceil(s).max(g.ow.next_multiple_of(lanes * v) + reach);
    let len = rows * s * pw + SLACK;
    let key = [hp, wp, s, pw, g.h, g.w, g.pt, g.pl];
    if pad.key != key || pad.buf.len() != len {
        pad.buf.clear();
        pad.buf.resize(len, 0.0);
        pad.key = key;
    }
    // Image columns that land inside the padded extent (none: the plane is all padding).
    let cols = g.w.min(wp.saturating_sub(g.pl));
    if cols == 0 {
        return pw;
    }
    for y in 0..g.h.min(hp.saturating_sub(g.pt)) {
        let py = y + g.pt;
        let src = &x[y * g.w..y * g.w + cols];
        if s == 1 {
            pad.buf[py * pw + g.pl..py * pw + g.pl + cols].copy_from_slice(src);
            continue;
        }
        if s == 2 {
            // Pairs of columns from the first that lands in phase 0: one to each phase, at
            // the same slot (a deinterleave the compiler vectorises); the odd one out alone.
            let c0 = g.pl % 2;
            let slot0 = (c0 + g.pl) / 2;
            let (even, odd) = pad.buf[py * 2 * pw..(py * 2 + 2) * pw].split_at_mut(pw);
            let pairs = src[c0..].chunks_exact(2);
            let last = pairs.remainder().first().copied();
            let n = pairs.len();
            for ((e, o), pair) in even[slot0..slot0 + n]
                .iter_mut()
                .zip(&mut odd[slot0..slot0 + n])
                .zip(pairs)
            {
                *e = pair[0];
                *o = pair[1];
            }
            if let Some(v) = last {
                even[slot0 + n] = v;
            }
            if c0 == 1 {
                // Image column 0 is padded column pl (odd): phase 1, slot pl / 2.
                odd[g.pl / 2] = src[0];
            }
            continue;
        }
        for p in 0..s {
            // Image column `c` is padded column `c + pl`: phase `(c + pl) % s`, slot
            // `(c + pl) / s`; the first with phase `p` is `c0`, then every `s`-th.
            let c0 = (p + s - g.pl % s) % s;
            let row = &mut pad.buf[(py * s + p) * pw..(py * s + p + 1) * pw];
            let slot0 = (c0 + g.pl) / s;
            for (d, &v) in row[slot0..].iter_mut().zip(src.iter().skip(c0).step_by(s)) {
                *d = v;
            }
        }
    }
    pw
}

/// One output plane of [`depthwise`] from the dealt plane `pad` (`pw` slots per phase row), in
/// blocks of `R` output rows × `V` vectors held in registers over all the taps (one store per
/// element; block rows past the plane's edge read zeros and are not stored), the taps in
/// `(ky, kx)` order, one FMA each (`mul_add`: the same bits as the scalar form). Each tap's
/// window row is one `WL`-slot array (`WL` ≥ `V` vectors + 8 lanes: bounds checked once).
#[inline(always)]
fn depthwise_rows<S: pulp::Simd, const V: usize, const R: usize, const WL: usize>(
    simd: S,
    pad: &[f32],
    pw: usize,
    w: &[f32],
    g: &Geom,
    dst: &mut [f32],
) {
    let s = g.sw.max(1);
    let tap = |i: usize| {
        let (ky, kx) = (i / g.kw, i % g.kw);
        let c = kx * g.dw;
        ((ky * g.dh * s + c % s) * pw + c / s, w[i])
    };
    if g.kh * g.kw == 9 {
        // A constant tap count, so the tap loop unrolls.
        let taps: [(usize, f32); 9] = std::array::from_fn(tap);
        depthwise_blocks::<S, V, R, WL>(simd, pad, pw, &taps, g, dst);
    } else {
        let taps: Vec<(usize, f32)> = (0..g.kh * g.kw).map(tap).collect();
        depthwise_blocks::<S, V, R, WL>(simd, pad, pw, &taps, g, dst);
    }
}

/// The blocks of [`depthwise_rows`] with its taps `(slot offset, weight)`.
#[inline(always)]
fn depthwise_blocks<S: pulp::Simd, const V: usize, const R: usize, const WL: usize>(
    simd: S,
    pad: &[f32],
    pw: usize,
    taps: &[(usize, f32)],
    g: &Geom,
    dst: &mut [f32],
) {
    let lanes = S::F32_LANES;
    let row_step = g.sh * g.sw.max(1) * pw;
    let width = V * lanes;
    let zero = simd.splat_f32s(0.0);
    for oy0 in (0..g.oh).step_by(R) {
        for ox in (0..g.ow).step_by(width) {
            let base = oy0 * row_step + ox;
            let mut acc = [[zero; V]; R];
            for &(off, wv) in taps {
                let wv = simd.splat_f32s(wv);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let at = base + r * row_step + off;
                    // In range: `deal_plane` leaves room for whole blocks and `SLACK`.
                    let Some(Ok(src)) = pad.get(at..at + WL).map(<&[f32; WL]>::try_from) else {
                        continue;
                    };
                    for (k, a) in acc.iter_mut().enumerate() {
                        let Some(x) = src.get(k * lanes..(k + 1) * lanes) else {
                            continue;
                        };
                        let x: S::f32s = bytemuck::pod_read_unaligned(bytemuck::cast_slice(x));
                        *a = simd.mul_add_f32s(x, wv, *a);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate().take(g.oh - oy0) {
                let row = &mut dst[(oy0 + r) * g.ow..(oy0 + r + 1) * g.ow];
                for (k, a) in acc.iter().enumerate() {
                    // One store, masked at the row's end (a copy through the stack there
                    // waited for the vector's store to reach the cache).
                    match row.get_mut(ox + k * lanes..) {
                        Some(out) if out.len() >= lanes => out[..lanes]
                            .copy_from_slice(bytemuck::cast_slice(std::slice::from_ref(a))),
                        Some(out) if !out.is_empty() => simd.partial_store_f32s(out, *a),
                        _ => break,
                    }
                }
            }
        }
    }
}
