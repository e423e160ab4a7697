//! Stride-2 convolutions with few input channels (a CNN's first layer: MobileNetV2's 3→32
//! 3×3, ResNet-50's 3→64 7×7) computed directly with AVX-512, without an im2col matrix.
//!
//! Contract:
//!
//! - [`Shape::takes`] holds for one group, stride 2 both ways, dilation 1, at most
//!   [`MAX_TAPS`] taps per output (`C · KH · KW`), output rows of 16 pixels or more, on a CPU
//!   with AVX-512. Anything else goes to the GEMM paths of [`crate::conv`].
//! - Per band of [`ROWS_PER_TASK`] output rows (a task), each input row the band reads is
//!   copied once into a zero-padded row and dealt into its even and odd columns (two-source
//!   permutes), so tap `(c, ky, kx)` of output pixels `ox0 .. ox0 + 16` is one load at
//!   `ox0 + kx / 2` of the `kx % 2` half. The output
//!   channels go in groups, the weight repacked per call as `[group][tap][channel]` (zeros
//!   past the last channel): on a CPU with full-rate 16-lane FMAs, blocks of up to 3 vectors
//!   of 16 pixels × 8 channels (24 accumulators: per tap 3 loads and 8 broadcasts for 24
//!   FMAs); where they run at half rate (Zen 4), one vector × 16 channels (1 load and 16
//!   broadcasts for 16 FMAs, the FMAs the limit there).
//! - Each output element is the chain of its taps in `(c, ky, kx)` order, one FMA each from
//!   `+0.0`, a tap over the padding adding `0 · w`: the definition, bit for bit (tested, NaN
//!   and infinities included). The tasks are bands of output rows fixed by the shape, and each
//!   element's chain does not depend on its task: the same bits for every thread count.
//! - The epilogue runs once per task and channel, on the band's rows of that channel's plane
//!   (one contiguous run) once the band is complete: a call per row (3,584 on MobileNetV2's
//!   stem) had cost it 0.388–0.404 ms against 0.353–0.361 (one thread, per-layer minima of
//!   three profiled processes each).
//!
//! ```text
//! y = R.nn.conv2d(x, w, strides=[2, 2], padding=[1, 1, 1, 1])  # x: (1, 3, 224, 224), w: (32, 3, 3, 3)
//! ; per band of 8 output rows: 3 × 17 input rows dealt into even/odd columns; per 48 pixels × 8 channels:
//! ; 27 taps × (3 loads, 8 broadcasts, 24 FMAs), no im2col matrix (27 × 12,544 values) built or read
//! ```

use crate::util::KResult;

/// The most taps per output this kernel takes (ResNet-50's stem has 147).
pub(crate) const MAX_TAPS: usize = 160;

/// Lanes of an AVX-512 `f32` vector, and output channels per group.
const LANES: usize = 16;

/// Output rows per task.
const ROWS_PER_TASK: usize = 8;

/// Output channels per group ([`group_channels`]) where 16-lane FMAs run at full rate: a
/// [`Block`] holds up to 3 vectors of 16 pixels × 8 channels in registers (24 of 32), so a
/// tap costs 3 loads and 8 broadcasts for 24 multiply-adds, where one vector × 16 channels
/// cost 1 load and 16 broadcasts for 16. On a 5th-generation Xeon, per-layer medians of
/// alternated rounds (`bench/ab_layers.py`, bench/RESULTS.md, session ap): ResNet-50's stem
/// 0.70–0.84 of its time on two threads and 0.80 on one, MobileNetV2's 0.77–0.84 and 0.85 —
/// and even (1.00–1.01) in a stretch where the old shape ran fast: its loads suffer most
/// when the VM's other vCPU shares the core.
const CH_FULL_RATE: usize = 8;

/// Output channels per group where 16-lane FMAs run at half rate (Zen 4, where this kernel
/// was written and measured): one vector of 16 pixels × 16 channels per block, the FMAs the
/// limit rather than the loads.
const CH_HALF_RATE: usize = 16;

/// The channels per group on this CPU ([`crate::simd::half_rate_fma512`]; a test may force
/// either: the same bits).
fn group_channels() -> usize {
    #[cfg(test)]
    if let Some(gc) = FORCE_GROUP.with(std::cell::Cell::get) {
        return gc;
    }
    if crate::simd::half_rate_fma512() {
        CH_HALF_RATE
    } else {
        CH_FULL_RATE
    }
}

thread_local! {
    /// A thread's buffer of dealt input rows ([`rows_v4`]), kept between tasks.
    static DEALT: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[cfg(test)]
thread_local! {
    /// [`group_channels`]' test override, read by [`conv`] on the calling thread (which packs
    /// the weight and hands the width to every task).
    static FORCE_GROUP: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// The geometry of one image: input `c × h × w`, `o` output channels, a `kh × kw` kernel,
/// padding `pt, pl` at the top and left, output `oh × ow` (stride 2, dilation 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Shape {
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub o: usize,
    pub kh: usize,
    pub kw: usize,
    pub pt: usize,
    pub pl: usize,
    pub oh: usize,
    pub ow: usize,
}

impl Shape {
    /// Whether this kernel takes the shape on this CPU (see the module doc).
    pub(crate) fn takes(&self) -> bool {
        let taps = self.c * self.kh * self.kw;
        (1..=MAX_TAPS).contains(&taps)
            && self.ow >= LANES
            && self.oh > 0
            && self.o > 0
            && self.h > 0
            && self.w > 0
            && crate::simd::avx512()
    }

    fn taps(&self) -> usize {
        self.c * self.kh * self.kw
    }

    /// The length of a dealt half-row: the output row plus the kernel's reach plus a vector,
    /// rounded up to whole vectors.
    fn half(&self) -> usize {
        (self.ow + self.kw / 2 + LANES).next_multiple_of(LANES)
    }
}

/// An epilogue: `f(channel, oy, rows)`, run once per completed band of output rows `oy..`
/// of a channel (`rows`: whole rows, contiguous in the channel's plane).
pub(crate) type Epilogue<'e> = &'e (dyn Fn(usize, usize, &mut [f32]) + Sync);

/// `y = conv(x, wt)` for one image: `x` is `c × h × w`, `wt` is `o × c × kh × kw`, `y` is
/// `o × oh × ow`, on up to `threads` threads, with `epilogue` on every output row.
pub(crate) fn conv(
    s: &Shape,
    x: &[f32],
    wt: &[f32],
    y: &mut [f32],
    threads: usize,
    epilogue: Option<Epilogue<'_>>,
) -> KResult<()> {
    let (taps, npix) = (s.taps(), s.oh * s.ow);
    if x.len() != s.c * s.h * s.w || wt.len() != s.o * taps || y.len() != s.o * npix {
        return Err(format!(
            "conv_stem: {s:?} needs {}, {} and {} values, found {}, {} and {}",
            s.c * s.h * s.w,
            s.o * taps,
            s.o * npix,
            x.len(),
            wt.len(),
            y.len()
        ));
    }
    if !s.takes() {
        return Err(format!("conv_stem: {s:?} is not a shape this kernel takes"));
    }
    // The weight as [group][tap][gc channels], zeros past the last channel.
    let gc = group_channels();
    let groups = s.o.div_ceil(gc);
    let mut packed = vec![0.0f32; groups * taps * gc];
    for (ch, w) in wt.chunks_exact(taps).enumerate() {
        let (g, q) = (ch / gc, ch % gc);
        for (t, &v) in w.iter().enumerate() {
            packed[(g * taps + t) * gc + q] = v;
        }
    }
    // Each task: a band of output rows in every channel's plane.
    let tasks: Vec<(usize, Vec<&mut [f32]>)> =
        crate::par::plane_runs(y, npix, ROWS_PER_TASK * s.ow)
            .into_iter()
            .enumerate()
            .map(|(b, band)| (b * ROWS_PER_TASK, band))
            .collect();
    let work = s.o * npix * taps;
    let t = crate::par::threads_for(work, 1 << 20).min(threads);
    let packed = &packed;
    crate::par::run_tasks(tasks, t, |(oy0, mut band)| {
        crate::simd::dispatch(Band {
            s,
            x,
            packed,
            gc,
            oy0,
            band: &mut band,
            epilogue,
        });
        Ok(())
    })
}

/// One task of [`conv`]: output rows `oy0..` of every channel (`band[ch]`, whole rows), then
/// their epilogue; run inside [`crate::simd::dispatch`] so the intrinsics inline.
struct Band<'a, 'b> {
    s: &'a Shape,
    x: &'a [f32],
    /// The weight as `[group][tap][gc]` (`gc`: [`group_channels`]).
    packed: &'a [f32],
    gc: usize,
    oy0: usize,
    band: &'a mut [&'b mut [f32]],
    epilogue: Option<Epilogue<'a>>,
}

impl pulp::WithSimd for Band<'_, '_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        #[cfg(target_arch = "x86_64")]
        if let Some(v4) = pulp::x86::V4::try_new() {
            match self.gc {
                CH_HALF_RATE => rows_v4::<CH_HALF_RATE>(v4, self),
                _ => rows_v4::<CH_FULL_RATE>(v4, self),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = self;
    }
}

/// [`Band`] on AVX-512 (inlined into the function [`crate::simd::dispatch`] compiled for it).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn rows_v4<const CH: usize>(v4: pulp::x86::V4, t: Band<'_, '_>) {
    let Band {
        s,
        x,
        packed,
        gc: _,
        oy0,
        band,
        epilogue,
    } = t;
    use std::arch::x86_64::{__m512, __m512i};
    let f = v4.avx512f;
    let (taps, half, ow) = (s.taps(), s.half(), s.ow);
    let even: __m512i = pulp::cast(std::array::from_fn::<u32, LANES, _>(|l| 2 * l as u32));
    let odd: __m512i = pulp::cast(std::array::from_fn::<u32, LANES, _>(|l| 2 * l as u32 + 1));
    let vec_at = |v: &[f32], at: usize| -> __m512 {
        pulp::cast(bytemuck::pod_read_unaligned::<[f32; LANES]>(
            bytemuck::cast_slice(&v[at..at + LANES]),
        ))
    };
    // One zero-padded input row (padded column j is image column j − pl), and per (c, ky)
    // its even and odd padded columns.
    let rows = band.first().map_or(0, |b| b.len() / ow);
    // The band's input rows in padded coordinates (padded row `pr` is image row `pr − pt`):
    // output row `oy` reads `2·oy + ky`. Each dealt once into its even and odd padded columns,
    // per channel: `dealt[(c · span + pr − 2·oy0) · 2 · half ..]`.
    let span = 2 * rows.saturating_sub(1) + s.kh;
    // The thread's kept buffer, not a zeroed one per task: every row below is written, those
    // outside the image with zeros (a fresh zeroed buffer per task was 0.2% of MobileNetV2's
    // run in `memset`, session bg).
    let mut kept = DEALT.with(|d| std::mem::take(&mut *d.borrow_mut()));
    let len = s.c * span * 2 * half;
    if kept.len() < len {
        kept.resize(len, 0.0);
    }
    let dealt = &mut kept[..len];
    // One zero-padded input row (padded column j is image column j − pl): only the image's
    // columns are ever written, so the margins stay zero.
    let mut padded = vec![0.0f32; 2 * half + 2 * LANES];
    let n = s.w.min(padded.len().saturating_sub(s.pl));
    for c in 0..s.c {
        for i in 0..span {
            let at = (c * span + i) * 2 * half;
            let Some(r) = (2 * oy0 + i).checked_sub(s.pt).filter(|&r| r < s.h) else {
                dealt[at..at + 2 * half].fill(0.0);
                continue;
            };
            let src = &x[(c * s.h + r) * s.w..(c * s.h + r) * s.w + n];
            if let Some(d) = padded.get_mut(s.pl..s.pl + n) {
                d.copy_from_slice(src);
            }
            let (e, o) = dealt[at..at + 2 * half].split_at_mut(half);
            for j0 in (0..half).step_by(LANES) {
                let (a, b) = (vec_at(&padded, 2 * j0), vec_at(&padded, 2 * j0 + LANES));
                let ev: [f32; LANES] = pulp::cast(f._mm512_permutex2var_ps(a, even, b));
                let od: [f32; LANES] = pulp::cast(f._mm512_permutex2var_ps(a, odd, b));
                e[j0..j0 + LANES].copy_from_slice(&ev);
                o[j0..j0 + LANES].copy_from_slice(&od);
            }
        }
    }
    let vectors = ow.div_ceil(LANES);
    for oy in oy0..oy0 + rows {
        let row = oy - oy0;
        for (g, wg) in packed.chunks_exact(taps * CH).enumerate() {
            let mut v0 = 0;
            while v0 < vectors {
                let b = Block::<CH> {
                    v4,
                    s,
                    dealt,
                    wg,
                    span,
                    half,
                    ky0: 2 * row,
                    ox0: v0 * LANES,
                };
                let pv = block_vectors(CH, vectors - v0);
                let (acc1, acc2, acc3);
                let acc: &[[__m512; CH]] = match pv {
                    3 => {
                        acc3 = b.sums::<3>();
                        &acc3
                    }
                    2 => {
                        acc2 = b.sums::<2>();
                        &acc2
                    }
                    _ => {
                        acc1 = b.sums::<1>();
                        &acc1
                    }
                };
                for (v, acc) in acc.iter().enumerate() {
                    let ox0 = (v0 + v) * LANES;
                    for (q, a) in acc.iter().enumerate() {
                        let Some(plane) = band.get_mut(g * CH + q) else {
                            break;
                        };
                        let out = &mut plane[row * ow..(row + 1) * ow];
                        let vals: [f32; LANES] = pulp::cast(*a);
                        match out.get_mut(ox0..ox0 + LANES) {
                            Some(d) => d.copy_from_slice(&vals),
                            None => {
                                use pulp::Simd as _;
                                v4.partial_store_f32s(&mut out[ox0..], pulp::cast(*a));
                            }
                        }
                    }
                }
                v0 += pv;
            }
        }
    }
    DEALT.with(|d| *d.borrow_mut() = kept);
    // The band's rows of each channel are one run of its plane: one epilogue call each.
    if let Some(ep) = epilogue {
        for (ch, plane) in band.iter_mut().enumerate() {
            ep(ch, oy0, plane);
        }
    }
}

/// The vectors of 16 pixels in the next block of a row with `rest` vectors left, for groups
/// of `ch` channels: blocks of 3, the last 4 or 2 as two of 2, a last one alone; groups of
/// [`CH_HALF_RATE`] channels one vector a block.
fn block_vectors(ch: usize, rest: usize) -> usize {
    match rest {
        _ if ch == CH_HALF_RATE => 1,
        3 | 5.. => 3,
        2 | 4 => 2,
        _ => 1,
    }
}

/// One block of [`rows_v4`]: output row `ky0 / 2` of the band (its taps start at dealt row
/// `ky0` of each channel), pixels `ox0..` and one group of `CH` channels (`wg`:
/// `[tap][CH]`).
#[cfg(target_arch = "x86_64")]
struct Block<'a, const CH: usize> {
    v4: pulp::x86::V4,
    s: &'a Shape,
    dealt: &'a [f32],
    wg: &'a [f32],
    span: usize,
    half: usize,
    ky0: usize,
    ox0: usize,
}

#[cfg(target_arch = "x86_64")]
impl<const CH: usize> Block<'_, CH> {
    /// `PV` vectors of 16 pixels × `CH` channels: per tap `(c, ky, kx)` in order, one load
    /// of each vector's pixels and one FMA with each channel's weight (broadcast), from
    /// `+0.0` — each element's chain of the definition.
    #[inline(always)]
    fn sums<const PV: usize>(&self) -> [[std::arch::x86_64::__m512; CH]; PV] {
        use std::arch::x86_64::__m512;
        let f = self.v4.avx512f;
        let s = self.s;
        let zero: __m512 = pulp::cast([0.0f32; LANES]);
        let mut acc = [[zero; CH]; PV];
        let vec_at = |at: usize| -> __m512 {
            pulp::cast(bytemuck::pod_read_unaligned::<[f32; LANES]>(
                bytemuck::cast_slice(&self.dealt[at..at + LANES]),
            ))
        };
        let mut t = 0;
        for c in 0..s.c {
            for ky in 0..s.kh {
                let at = (c * self.span + self.ky0 + ky) * 2 * self.half + self.ox0;
                for kx in 0..s.kw {
                    let src = at + (kx % 2) * self.half + kx / 2;
                    let v: [__m512; PV] = std::array::from_fn(|p| vec_at(src + p * LANES));
                    let ws = &self.wg[t * CH..(t + 1) * CH];
                    for (q, &w) in ws.iter().enumerate() {
                        let w = f._mm512_set1_ps(w);
                        for (a, &v) in acc.iter_mut().zip(&v) {
                            a[q] = f._mm512_fmadd_ps(v, w, a[q]);
                        }
                    }
                    t += 1;
                }
            }
        }
        acc
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::panic, reason = "test code: a failure is a panic")]

    use super::*;

    /// The definition, written apart from the kernel: each output is the chain of its taps in
    /// `(c, ky, kx)` order, one fused multiply-add each from `+0.0`, `0 · w` where the tap
    /// falls outside the image.
    fn definition(s: &Shape, x: &[f32], wt: &[f32]) -> Vec<f32> {
        let mut y = vec![0.0f32; s.o * s.oh * s.ow];
        for o in 0..s.o {
            for oy in 0..s.oh {
                for ox in 0..s.ow {
                    let mut acc = 0.0f32;
                    for c in 0..s.c {
                        for ky in 0..s.kh {
                            for kx in 0..s.kw {
                                let r = (2 * oy + ky) as isize - s.pt as isize;
                                let q = (2 * ox + kx) as isize - s.pl as isize;
                                let inside =
                                    r >= 0 && q >= 0 && (r as usize) < s.h && (q as usize) < s.w;
                                let v = if inside {
                                    x[(c * s.h + r as usize) * s.w + q as usize]
                                } else {
                                    0.0
                                };
                                let w = wt[((o * s.c + c) * s.kh + ky) * s.kw + kx];
                                acc = v.mul_add(w, acc);
                            }
                        }
                    }
                    y[(o * s.oh + oy) * s.ow + ox] = acc;
                }
            }
        }
        y
    }

    fn shape(c: usize, h: usize, w: usize, o: usize, k: usize, p: usize) -> Shape {
        // Output extents for stride 2 with `p` pixels of padding on every side.
        let (oh, ow) = ((h + 2 * p - k) / 2 + 1, (w + 2 * p - k) / 2 + 1);
        Shape {
            c,
            h,
            w,
            o,
            kh: k,
            kw: k,
            pt: p,
            pl: p,
            oh,
            ow,
        }
    }

    #[test]
    fn matches_the_definition_bit_for_bit_on_every_thread_count() {
        // MobileNetV2's stem (3x3, 3 -> 32) on a smaller image; ResNet-50's (7x7, 3 -> 64,
        // padding 3); odd images, a partial group of channels and a partial last vector; one
        // input channel, a 2x2 kernel without padding; 160 taps.
        for s in [
            shape(3, 64, 64, 32, 3, 1),
            shape(3, 37, 50, 64, 7, 3),
            shape(1, 33, 41, 5, 5, 2),
            shape(4, 9, 35, 17, 2, 0),
            shape(10, 12, 40, 3, 4, 1),
            // Padding wider than the image: most taps read zeros.
            shape(1, 4, 3, 3, 2, 20),
            // Rows of 7 vectors (blocks of 3, 2 and 2), of one (a block of 1), and of 6 with
            // a partial last (3 and 3).
            shape(3, 20, 224, 32, 3, 1),
            shape(2, 11, 32, 9, 3, 1),
            shape(3, 9, 190, 12, 3, 1),
        ] {
            assert!(s.taps() <= MAX_TAPS);
            if !s.takes() {
                assert!(!crate::simd::avx512(), "{s:?}: not taken");
                continue;
            }
            let x: Vec<f32> = (0..s.c * s.h * s.w)
                .map(|i| match i % 211 {
                    5 => f32::NAN,
                    17 => f32::INFINITY,
                    _ => ((i * 7919) % 1013) as f32 / 97.0 - 5.0,
                })
                .collect();
            let mut wt: Vec<f32> = (0..s.o * s.taps())
                .map(|i| ((i * 104_729) % 997) as f32 / 331.0 - 1.5)
                .collect();
            wt[s.taps() + 1] = f32::NEG_INFINITY;
            let want = definition(&s, &x, &wt);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            // Both group widths (the CPU picks one) on 1 to 3 threads.
            for gc in [CH_FULL_RATE, CH_HALF_RATE] {
                for threads in 1..=3 {
                    let mut y = vec![9.0f32; want.len()];
                    FORCE_GROUP.with(|f| f.set(Some(gc)));
                    let r = conv(&s, &x, &wt, &mut y, threads, None);
                    FORCE_GROUP.with(|f| f.set(None));
                    r.unwrap_or_else(|e| panic!("{e}"));
                    assert_eq!(
                        bits(&y),
                        bits(&want),
                        "{s:?}, {gc} channels, {threads} threads"
                    );
                }
            }
            // The epilogue sees every row of every channel once, in whole rows from `oy`,
            // after they are complete.
            let seen = std::sync::Mutex::new(vec![0usize; s.o * s.oh]);
            let ep = |ch: usize, oy: usize, rows: &mut [f32]| {
                assert!(rows.len().is_multiple_of(s.ow), "{s:?}: part of a row");
                let at = (ch * s.oh + oy) * s.ow;
                assert_eq!(
                    bits(rows),
                    bits(&want[at..at + rows.len()]),
                    "{s:?}: rows {ch}/{oy}.."
                );
                for v in rows.iter_mut() {
                    *v = ch as f32;
                }
                if let Ok(mut seen) = seen.lock() {
                    for r in oy..oy + rows.len() / s.ow {
                        seen[ch * s.oh + r] += 1;
                    }
                }
            };
            let mut y = vec![9.0f32; want.len()];
            conv(&s, &x, &wt, &mut y, 2, Some(&ep)).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                seen.into_inner()
                    .unwrap_or_default()
                    .iter()
                    .all(|&n| n == 1)
            );
            assert!(
                y.chunks(s.oh * s.ow)
                    .enumerate()
                    .all(|(ch, p)| p.iter().all(|&v| v == ch as f32))
            );
        }
    }

    #[test]
    fn other_shapes_and_wrong_sizes_are_refused() {
        let narrow = shape(3, 20, 20, 8, 3, 1); // 10-pixel rows
        assert!(!narrow.takes());
        let many = shape(20, 40, 40, 8, 3, 1); // 180 taps
        assert!(!many.takes());
        let s = shape(3, 40, 40, 8, 3, 1);
        if s.takes() {
            let (x, w) = (vec![1.0f32; 3 * 40 * 40], vec![1.0f32; 8 * 27]);
            let mut y = vec![0.0f32; 8 * s.oh * s.ow];
            assert!(conv(&s, &x[1..], &w, &mut y, 1, None).is_err());
            assert!(conv(&s, &x, &w, &mut y[1..], 1, None).is_err());
            assert!(conv(&narrow, &x, &w, &mut y, 1, None).is_err());
        }
    }
}
