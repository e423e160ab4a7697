//! Depthwise convolution of one `NCHW` plane computed over the output plane as one flat
//! array: output rows under 16 pixels (MobileNet's 7×7 and 14×14 layers, stride 1 or 2), and
//! kernels up to 5×5 of stride 1 or 2 on output planes of up to 64×64 (its 28×28 and 56×56
//! layers, EfficientNet's 5×5 on 28×28; a 3×3 of stride 1 with one pixel of padding up to
//! 128×128: MobileNetV2's 112×112 layer).
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
//! - Kernels without an unrolled form (5×5, 7×7) lay the phase planes out with a row pitch
//!   of whole 16-lane vectors instead ([`Taps::pitched`], where it pays): each row leaves
//!   room for the widest column shift in zeros, so no tap needs a mask (EfficientNet's 5×5
//!   on 28×28: 20 of 25 taps were masked, each a mask load and an `and` more than its load
//!   and FMA). The plane is computed over the pitched flat index and each vector's columns
//!   under `ow` stored. One layer, one thread, alternated against the flat layout (Zen 4):
//!   240×28×28 0.81, 120×28×28 0.81, 672×14×14 0.86, stride 2 on 144×56×56 0.91 and
//!   72×56×56 0.90 of its time.
//! - Each output element is the chain of its taps in `(ky, kx)` order, one FMA each from
//!   `+0.0`, a tap over the padding adding `0 · w`: the same bits as the row kernel of
//!   [`crate::conv`] (tested, NaN and infinities included), on every instruction set and for
//!   every thread count.
//! - Small planes gain most: a 7×7 output is 4 vectors of 16 lanes, where the row kernel runs
//!   8 rows of 8-lane vectors and copies the plane row by row. The thread's buffer has two
//!   slots: the next plane is copied in while this one is computed, so no load waits on a
//!   store just made (960 planes of 7×7 on one thread: 0.060 → 0.047 ms).
//! - A 3×3 kernel runs unrolled ([`plane_3x3`]): per block of vectors, each kernel row's three
//!   taps read one run of the buffer (stride 1) or two phase planes (stride 2), the left and
//!   right column masks are periodic tables loaded once per block, and a stride-2 plane is
//!   dealt into its column phases eight pairs at a time by AVX2 shuffles ([`deal_pairs`];
//!   the loop it replaced compiled to one move per value: MobileNetV2's 144×56×56 stride-2
//!   layer ran 23% fewer instructions, 60.5 M → 46.5 M for 20 runs under callgrind). On
//!   MobileNetV2's layers, one thread: 144×56×56 0.236 → 0.168 ms, 96×112×112 stride 2 0.29
//!   → 0.21 ms.
//! - Stride 1 with one pixel of padding, rows of 14 pixels or more (MobileNetV2's 14×14,
//!   28×28, 56×56 and 112×112 planes, up to 128×128): [`plane_3x3_strips`] walks strips of one or
//!   two vectors down the rows, each input row loaded once (three shifted runs) and multiplied
//!   into the three output rows it feeds, so 3 loads per 9 multiply-adds per vector instead of
//!   9 (the same chains in the same order). One thread, one node each, median of 300 runs
//!   (`bench/conv_layers.py --preset depthwise --threads 1`, both builds in one run):
//!   32×112×112 0.263 → 0.167 ms, 144×56×56 0.250 → 0.181 ms, 192×28×28 0.094 → 0.069 ms
//!   (onnxruntime 0.167, 0.201, 0.078). On 14×14 planes (one 16-lane vector per row, 14 lanes
//!   used, where the flat kernel filled 196 of 256): 384×14×14 0.064 → 0.044 ms, 576×14×14
//!   0.107 → 0.067 ms (one node, one thread, median of 2000 runs, three alternated runs each).
//!   Rows of 7 do not pay (960×7×7 0.061 → 0.070 ms: 7 of 16 lanes; strips of AVX2's
//!   8-lane vectors were slower too).
//!
//! ```text
//! y = R.nn.conv2d(x, w, strides=[1, 1], padding=[1, 1, 1, 1], groups=960)  # x: (1, 960, 7, 7)
//! ; each 7×7 plane: 49 outputs = 4 vectors × 9 taps (one load + one FMA each)
//! y = R.nn.conv2d(x, w, strides=[2, 2], padding=[1, 1, 1, 1], groups=576)  # x: (1, 576, 14, 14)
//! ; each plane dealt into 4 phase planes of 7×7; 49 outputs = 4 vectors × 9 taps
//! y = R.nn.conv2d(x, w, strides=[1, 1], padding=[1, 1, 1, 1], groups=144)  # x: (1, 144, 56, 56)
//! ; each 56×56 plane copied whole; 3136 outputs = 49 blocks of 4 vectors × 9 taps
//! ```

use std::cell::RefCell;

/// The widest vector this kernel runs (AVX-512's 16 `f32` lanes): the margin past the plane.
const MAX_LANES: usize = 16;

/// Output vectors computed together (independent FMA chains) by [`plane_3x3`], and by the
/// general kernel on a plane of more than [`MAX_ACC`] vectors' blocks.
const V: usize = 4;

/// The most vectors the general kernel keeps in registers at once with 16-lane vectors (32
/// registers); half as many with narrower ones (16 registers).
const MAX_ACC: usize = 16;

/// The most output pixels of a plane with rows of 16 or more that this kernel takes.
const WIDE_PIXELS: usize = 64 * 64;

/// The same for a plane [`plane_3x3_strips`] runs.
const STRIP_PIXELS: usize = 128 * 128;

/// A plane geometry the flat kernel takes, with its taps and column masks.
#[derive(Debug, PartialEq)]
pub(crate) struct Plan {
    /// The input plane's extent `(h, w)` and the stride.
    h: usize,
    w: usize,
    s: usize,
    /// The output plane's extent `(oh, ow)`.
    oh: usize,
    ow: usize,
    /// The phase planes' row pitch: `ow` (the flat layout, column shifts masked), or a
    /// multiple of [`MAX_LANES`] with room for the widest column shift in zeros at each row's
    /// end ([`Taps::pitched`]: no masks).
    pitch: usize,
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
    /// per distinct masked column shift: `!0` where the tap's column is inside the image
    /// (empty where [`Plan::fast`] runs instead).
    masks: Vec<u32>,
    /// The unrolled form of a 3×3 kernel ([`plane_3x3`]), when it has one.
    fast: Option<Fast>,
}

/// The taps of a 3×3 kernel for [`plane_3x3`]: each tap's buffer offset, and the column
/// masks of kernel columns 0 and 2 (left edge, right edge; all ones where the column reads
/// inside the image) as periodic tables: entry `j` of a table is for output column `j % ow`,
/// over `ow + V·MAX_LANES` entries, so a block starting anywhere in a row reads one run.
#[derive(Debug, PartialEq)]
struct Fast {
    starts: [usize; 9],
    /// Each kernel row's taps at consecutive offsets (stride 1).
    row: bool,
    tables: Vec<u32>,
}

impl Fast {
    /// From the plan's taps (each with its mask: an index into `shifts`, the masked column
    /// shifts `(qx, px)`), with `inside((qx, px), ox)` the column test; `None` unless there
    /// are 9 taps, the taps of each kernel column share one mask (or none), and kernel column
    /// 1 has none.
    fn new(
        taps: &[(usize, Option<usize>)],
        shifts: &[(isize, usize)],
        ow: usize,
        inside: impl Fn((isize, usize), usize) -> bool,
    ) -> Option<Fast> {
        if taps.len() != 9 {
            return None;
        }
        // The one mask of each kernel column's taps (kernel column 1: none).
        let column = |kx: usize| -> Option<Option<usize>> {
            let m = taps[kx].1;
            (0..3).all(|ky| taps[3 * ky + kx].1 == m).then_some(m)
        };
        let (Some(l), Some(None), Some(r)) = (column(0), column(1), column(2)) else {
            return None;
        };
        let n = ow + V * MAX_LANES;
        let mut tables = Vec::with_capacity(2 * n);
        for m in [l, r] {
            match m.and_then(|m| shifts.get(m)) {
                Some(&shift) => {
                    tables.extend((0..n).map(|j| if inside(shift, j % ow) { !0u32 } else { 0 }));
                }
                None => tables.extend(std::iter::repeat_n(!0u32, n)),
            }
        }
        let starts: [usize; 9] = std::array::from_fn(|t| taps[t].0);
        Some(Fast {
            starts,
            row: (0..9).all(|t| starts[t] == starts[t - t % 3] + t % 3),
            tables,
        })
    }
}

/// A plane geometry's taps before a layout is chosen ([`Plan::new`]).
struct Taps {
    h: usize,
    w: usize,
    s: usize,
    oh: usize,
    ow: usize,
    /// The phases `(py, px)` the taps read, in first-use order.
    phases: Vec<(usize, usize)>,
    /// Per tap in `(ky, kx)` order: its phase (an index into `phases`), its row and column
    /// shifts `qy`, `qx` in the phase plane, and its column phase `px`.
    shifted: Vec<(usize, isize, isize, usize)>,
}

impl Taps {
    /// Whether output column `ox` reads inside the image under column shift `(qx, px)`:
    /// phase column `ox + qx`, image column `s·(ox + qx) + px`.
    fn inside(&self, (qx, px): (isize, usize), ox: usize) -> bool {
        let j = ox as isize + qx;
        j >= 0 && j < self.ow as isize && self.s * j as usize + px < self.w
    }

    /// The row pitch of the masks-free layout for these taps, where it pays: a multiple of
    /// [`MAX_LANES`] of at least `ow` plus the widest column shift either way, so that a
    /// shift past a row's end reads that row's zero columns and one before its start the
    /// previous row's, never the image. Each output vector then costs
    /// one load and one FMA per tap, where the flat layout's masked taps cost a mask load and
    /// an `and` as well: taken when its vectors (`oh` rows of `pitch / 16`) at one unit per
    /// tap come to at most four fifths of the flat layout's at one unit per unmasked and two
    /// per masked tap. EfficientNet-B0's 5×5 on 28×28 (pitch 32): 56 × 25 = 1400 against
    /// 49 × 45 = 2205; a 5×5 on 7×7 (pitch 16): 7 × 25 = 175 against 4 × 45 = 180, flat.
    fn pitched(&self) -> Option<usize> {
        let (oh, ow, taps) = (self.oh, self.ow, &self.shifted);
        let reach = taps.iter().map(|t| t.2.unsigned_abs()).max()?;
        let pitch = ow.checked_add(reach)?.next_multiple_of(MAX_LANES);
        let masked = taps
            .iter()
            .filter(|t| !(0..ow).all(|ox| self.inside((t.2, t.3), ox)))
            .count();
        let flat = oh.checked_mul(ow)?.div_ceil(MAX_LANES) * (taps.len() + masked);
        let rows = oh.checked_mul(pitch / MAX_LANES)?.checked_mul(taps.len())?;
        (masked > 0 && 5 * rows <= 4 * flat).then_some(pitch)
    }

    /// The plan with phase rows `pitch` apart: `ow` (the flat layout, its column shifts
    /// masked, and the unrolled 3×3 form where it has one) or [`Taps::pitched`]'s (no masks).
    fn lay_out(&self, pitch: usize) -> Option<Plan> {
        let (oh, ow) = (self.oh, self.ow);
        let hw = oh.checked_mul(ow)?;
        let span = oh.checked_mul(pitch)?;
        let block = V * MAX_LANES;
        let rounded = span.div_ceil(block) * block;
        let offs: Vec<_> = self
            .shifted
            .iter()
            .map(|&(phase, qy, qx, px)| (phase, qy * pitch as isize + qx, qx, px))
            .collect();
        let lo = offs.iter().map(|o| o.1).min()?.min(0).unsigned_abs();
        let hi = offs.iter().map(|o| o.1).max()?.max(0).unsigned_abs();
        let lead = lo;
        // Past the plane and its lower margin: room for a whole vector, and for the last
        // strip of [`plane_3x3_strips`] (two vectors from under a row's end).
        let region = lead + rounded + hi + 3 * MAX_LANES;
        // The buffer (a region per phase) must be addressable.
        region.checked_mul(self.phases.len())?;
        // The masked column shifts, in first-use order; each tap's index into them.
        let mut shifts: Vec<(isize, usize)> = Vec::new();
        let mut taps = Vec::with_capacity(offs.len());
        for (phase, off, qx, px) in offs {
            let start = (phase * region + lead) as isize + off;
            let start = usize::try_from(start).ok()?;
            if pitch != ow || (0..ow).all(|ox| self.inside((qx, px), ox)) {
                taps.push((start, None));
                continue;
            }
            let row = match shifts.iter().position(|&r| r == (qx, px)) {
                Some(r) => r,
                None => {
                    shifts.push((qx, px));
                    shifts.len() - 1
                }
            };
            taps.push((start, Some(row)));
        }
        let fast = match pitch == ow {
            true => Fast::new(&taps, &shifts, ow, |q, ox| self.inside(q, ox)),
            false => None,
        };
        // The general kernel's masks (one row per shift), only where it runs.
        let masks = match fast {
            Some(_) => Vec::new(),
            None => shifts
                .iter()
                .flat_map(|&shift| {
                    (0..rounded).map(move |i| {
                        if i < hw && self.inside(shift, i % ow) {
                            !0u32
                        } else {
                            0
                        }
                    })
                })
                .collect(),
        };
        Some(Plan {
            h: self.h,
            w: self.w,
            s: self.s,
            oh,
            ow,
            pitch,
            lead,
            region,
            phases: self.phases.clone(),
            taps,
            masks,
            fast,
        })
    }
}

/// Convolution geometry the caller passes: `[h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow]`.
pub(crate) type Shape = [usize; 12];

impl Plan {
    /// The plan for a plane geometry, or `None` unless both strides are equal, output rows
    /// are under 16 pixels, and every tap that reads past the output's last row or column
    /// there reads the image's padding (true of "same"-padded stride-1 and stride-2 layers).
    pub(crate) fn new(shape: Shape) -> Option<Plan> {
        let [h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow] = shape;
        if sh != sw || sh == 0 || oh == 0 || ow == 0 || kh * kw == 0 {
            return None;
        }
        // Rows of 16 pixels or more fill the row kernel's vectors: only a 3×3 kernel of
        // stride 1 or 2 on output planes of up to 64×64 pixels is faster here ([`plane_3x3`]:
        // measured on MobileNetV2's 28×28 and 56×56 planes; on 112×112 the row kernel was,
        // this buffer no longer staying in L1), and with stride 1, one pixel of padding and
        // rows of [`STRIP_MIN_WIDTH`] or more on planes up to 128×128 ([`plane_3x3_strips`],
        // which walks each strip's rows in turn: MobileNetV2's 112×112 layer, one thread,
        // 0.263 → 0.167 ms). Other kernels up to 5×5 likewise on planes up to 64×64
        // (EfficientNet-B0's 5×5 on 240×28×28, one thread: 0.186 → 0.172 ms; stride 2 on
        // 144×56×56: 0.170 → 0.153 ms); not ConvNeXt's 7×7 on 96×56×56, which took 1.2× the
        // row kernel's time here.
        let three = (kh, kw) == (3, 3);
        let strips = three && sh == 1 && (dh, dw, pt, pl) == (1, 1, 1, 1) && ow >= STRIP_MIN_WIDTH;
        let wide = if strips { STRIP_PIXELS } else { WIDE_PIXELS };
        if ow >= MAX_LANES && !(sh <= 2 && kh.max(kw) <= 5 && oh * ow <= wide) {
            return None;
        }
        let s = sh;
        // Tap (ky, kx) reads input row s·oy + dy = s·(oy + qy) + py: phase row py, phase
        // index oy + qy (and the same for columns).
        let split = |d: isize| (d.div_euclid(s as isize), d.rem_euclid(s as isize) as usize);
        let mut phases: Vec<(usize, usize)> = Vec::new();
        let mut shifted = Vec::with_capacity(kh * kw);
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
            shifted.push((phase, qy, qx, px));
        }
        let taps = Taps {
            h,
            w,
            s,
            oh,
            ow,
            phases,
            shifted,
        };
        // The flat layout, unless its general kernel would run and the pitched one pays.
        let flat = taps.lay_out(ow)?;
        if flat.fast.is_some() {
            return Some(flat);
        }
        match taps.pitched() {
            Some(pitch) => taps.lay_out(pitch),
            None => Some(flat),
        }
    }

    /// The output's pixels (`oh · ow`).
    fn hw(&self) -> usize {
        self.oh * self.ow
    }

    /// The phase planes' extent in the buffer (`oh · pitch`): the flat index the kernel
    /// computes over.
    fn span(&self) -> usize {
        self.oh * self.pitch
    }

    /// The rounded length of one mask row ([`Plan::span`] in whole blocks).
    fn rounded(&self) -> usize {
        self.span().div_ceil(V * MAX_LANES) * V * MAX_LANES
    }

    /// The layout of the buffer: its length and where each plane lies in it.
    fn layout(&self) -> [usize; 8] {
        let len = self.region * self.phases.len();
        let (lead, region, ow, pitch) = (self.lead, self.region, self.ow, self.pitch);
        [len, lead, region, ow, pitch, self.h, self.w, self.s]
    }

    /// Copies input plane `x` into the phase regions of `buf` (phase `(py, px)` holds image
    /// pixel `(s·i + py, s·j + px)` at `i · pitch + j` for `j < ow`; what lies outside the
    /// image, and columns `ow..pitch`, stay zero).
    #[inline(always)]
    fn fill(&self, x: &[f32], buf: &mut [f32]) {
        let (h, w, s, ow, pitch) = (self.h, self.w, self.s, self.ow, self.pitch);
        if x.len() != h * w || buf.len() != self.layout()[0] {
            return;
        }
        if s == 2 && self.fill_pairs(x, buf) {
            return;
        }
        for (k, &(py, px)) in self.phases.iter().enumerate() {
            let base = k * self.region + self.lead;
            let dst = &mut buf[base..base + self.span()];
            if s == 1 && px == 0 && py == 0 && (ow, pitch) == (w, w) && self.oh == h {
                dst.copy_from_slice(x);
                continue;
            }
            for (i, row) in dst.chunks_exact_mut(pitch).enumerate() {
                let r = s * i + py;
                if r >= h {
                    break;
                }
                let src = &x[r * w..(r + 1) * w];
                if s == 1 {
                    // One copy per row (the loop below moves one value at a time).
                    let n = ow.min(w.saturating_sub(px));
                    row[..n].copy_from_slice(&src[px..px + n]);
                    continue;
                }
                for (d, &v) in row[..ow].iter_mut().zip(src.iter().skip(px).step_by(s)) {
                    *d = v;
                }
            }
        }
    }
}

impl Plan {
    /// [`Plan::fill`] for stride 2 when the phases are the four `(py, px)`: each image row
    /// dealt into its two column phases at once ([`deal_pairs`]). `false` (nothing written)
    /// for other phase sets.
    #[inline(always)]
    fn fill_pairs(&self, x: &[f32], buf: &mut [f32]) -> bool {
        let (h, w, ow, oh, region, lead) =
            (self.h, self.w, self.ow, self.oh, self.region, self.lead);
        let pitch = self.pitch;
        let at = |p: (usize, usize)| self.phases.iter().position(|&q| q == p);
        if self.phases.len() != 4 || (0..4).any(|k| at((k / 2, k % 2)).is_none()) {
            return false;
        }
        for py in 0..2 {
            let (Some(k0), Some(k1)) = (at((py, 0)), at((py, 1))) else {
                return false;
            };
            // Phase (py, 0) and (py, 1) regions, split apart (k0 ≠ k1).
            let (lo, hi) = buf.split_at_mut(k0.max(k1) * region);
            let (even, odd) = {
                let a = &mut lo[k0.min(k1) * region..][..region];
                let b = &mut hi[..region];
                if k0 < k1 { (a, b) } else { (b, a) }
            };
            for i in 0..oh {
                let r = 2 * i + py;
                if r >= h {
                    break;
                }
                let src = &x[r * w..(r + 1) * w];
                let e = &mut even[lead + i * pitch..lead + i * pitch + ow];
                let o = &mut odd[lead + i * pitch..lead + i * pitch + ow];
                let n = (w / 2).min(ow);
                let last = (w % 2 == 1).then(|| src[w - 1]);
                deal_pairs(&src[..2 * n], &mut e[..n], &mut o[..n]);
                if let (Some(v), Some(slot)) = (last, e.get_mut(n)) {
                    *slot = v;
                }
            }
        }
        true
    }
}

/// Deals the pairs of `src` into `e` (each pair's first value) and `o` (its second), as many
/// pairs as `e` and `o` hold: eight pairs at a time with AVX2 shuffles where the CPU has them
/// (a shuffle within each 128-bit half, then a swap of the middle 64-bit quarters), the rest
/// with AVX-512 masked moves where it has those, else one pair at a time. Only data movement: the same values either way. Inlined into the
/// caller's SIMD context, so the shuffles compile to single instructions; the scalar loop it
/// replaces compiled to one move per value on AVX2, 45% of a stride-2 layer's time.
#[inline(always)]
pub(crate) fn deal_pairs(src: &[f32], e: &mut [f32], o: &mut [f32]) {
    let n = e.len().min(o.len()).min(src.len() / 2);
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if let Some(v3) = pulp::x86::V3::try_new() {
        use std::arch::x86_64::{__m256, __m256d};
        // `[a0 a2 b0 b2 | a4 a6 b4 b6]` → `[a0 a2 a4 a6 b0 b2 b4 b6]`: 64-bit quarters 0, 2, 1, 3.
        let order = |v: __m256| -> [f32; 8] {
            let q: __m256d = pulp::cast(v);
            pulp::cast(v3.avx2._mm256_permute4x64_pd::<0b11_01_10_00>(q))
        };
        let blocks = src[..2 * n]
            .chunks_exact(16)
            .zip(e.chunks_exact_mut(8))
            .zip(o.chunks_exact_mut(8));
        for ((s, e), o) in blocks {
            let (Ok(a), Ok(b)) = (<[f32; 8]>::try_from(&s[..8]), <[f32; 8]>::try_from(&s[8..]))
            else {
                break;
            };
            let (a, b): (__m256, __m256) = (pulp::cast(a), pulp::cast(b));
            e.copy_from_slice(&order(v3.avx._mm256_shuffle_ps::<0b10_00_10_00>(a, b)));
            o.copy_from_slice(&order(v3.avx._mm256_shuffle_ps::<0b11_01_11_01>(a, b)));
            done += 8;
        }
    }
    // The pairs left (fewer than eight: all of a row of 14, MobileNetV2's stride-2 14×14
    // layer) with AVX-512: one masked load, a lane permutation per phase, two masked stores
    // instead of a move per value (that layer alone, 576 channels, one thread: 0.090 → 0.084
    // ms; bench/RESULTS.md, session ak).
    #[cfg(target_arch = "x86_64")]
    if done < n
        && let Some(v4) = pulp::x86::V4::try_new()
    {
        use pulp::Simd;
        use std::arch::x86_64::{__m512, __m512i};
        let even: __m512i = pulp::cast([0u32, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15]);
        let odd: __m512i = pulp::cast([1u32, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14]);
        while done < n {
            let m = (n - done).min(8);
            let v: __m512 = pulp::cast(v4.partial_load_f32s(&src[2 * done..2 * (done + m)]));
            let (pe, po) = (
                v4.avx512f._mm512_permutexvar_ps(even, v),
                v4.avx512f._mm512_permutexvar_ps(odd, v),
            );
            v4.partial_store_f32s(&mut e[done..done + m], pulp::cast(pe));
            v4.partial_store_f32s(&mut o[done..done + m], pulp::cast(po));
            done += m;
        }
    }
    for ((e, o), pair) in e[done..n]
        .iter_mut()
        .zip(&mut o[done..n])
        .zip(src[2 * done..2 * n].chunks_exact(2))
    {
        *e = pair[0];
        *o = pair[1];
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
    layout: [usize; 8],
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
    if let (Some(fast), Ok(w)) = (&plan.fast, <&[f32; 9]>::try_from(w)) {
        if fast.row && plan.ow >= STRIP_MIN_WIDTH {
            // Strips of two vectors at most: with three rows of accumulators, two column
            // masks per vector and the nine weights in registers, wider strips spill.
            let done = match plan.ow.div_ceil(S::F32_LANES) {
                1 => plane_3x3_strips::<S, 1>(simd, plan, fast, buf, w, dst),
                _ => plane_3x3_strips::<S, 2>(simd, plan, fast, buf, w, dst),
            };
            if done {
                return;
            }
        }
        match fast.row {
            true => plane_3x3::<S, true>(simd, plan, fast, buf, w, dst),
            false => plane_3x3::<S, false>(simd, plan, fast, buf, w, dst),
        }
        return;
    }
    // The plane in as few blocks of at most `MAX_ACC` vectors as it takes (one for every
    // plane under 16 × 16 pixels with AVX-512), the vectors of a block in registers across
    // all the taps: per tap one broadcast of its weight and one bounds check, where blocks
    // of `V` vectors paid them four times as often and rounded a 14×14 plane's 13 vectors
    // up to 16.
    let vecs = plan.span().div_ceil(S::F32_LANES);
    let max = if S::F32_LANES >= MAX_LANES {
        MAX_ACC
    } else {
        MAX_ACC / 2
    };
    let n = vecs.div_ceil(vecs.div_ceil(max));
    macro_rules! blocks {
        ($($k:literal)*) => {
            match n {
                $($k => plane_blocks::<S, $k>(simd, plan, buf, w, dst),)*
                _ => plane_blocks::<S, V>(simd, plan, buf, w, dst),
            }
        };
    }
    blocks!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16);
}

/// [`plane`]'s general kernel in blocks of `N` vectors of the flat index `oy · pitch + ox`
/// (the last block moved back to end at the plane's last vector, so no read passes the
/// plane's rounded extent; the pixels it computes again get the same bits): per block, per
/// tap in `(ky, kx)` order, each vector one load (masked where the tap's column leaves the
/// image, in the flat layout) and one FMA into its accumulator. In the pitched layout each
/// vector lies in one row ([`MAX_LANES`] divides the pitch, the lanes divide that): its
/// columns under `ow` are stored ([`store_pitched`]).
#[inline(always)]
fn plane_blocks<S: pulp::Simd, const N: usize>(
    simd: S,
    plan: &Plan,
    buf: &[f32],
    w: &[f32],
    dst: &mut [f32],
) {
    let lanes = S::F32_LANES;
    let span = plan.span();
    let rounded = plan.rounded();
    let zero = simd.splat_f32s(0.0);
    let step = N * lanes;
    let last = span.div_ceil(lanes).saturating_sub(N) * lanes;
    let mut next = 0;
    loop {
        let i0 = next.min(last);
        next += step;
        let mut acc = [zero; N];
        for (&(start, mask), &wt) in plan.taps.iter().zip(w) {
            let wv = simd.splat_f32s(wt);
            let at = start + i0;
            // In range: the buffer holds the plane rounded up to whole blocks plus margins.
            let Some(src) = buf.get(at..at + step) else {
                continue;
            };
            let load = |v: usize| -> S::f32s { vector::<S, _, _>(src, v) };
            match mask.and_then(|r| plan.masks.get(r * rounded + i0..r * rounded + i0 + step)) {
                Some(m) => {
                    for (v, a) in acc.iter_mut().enumerate() {
                        let xv = masked(simd, load(v), vector::<S, _, _>(m, v));
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
        if plan.pitch == plan.ow {
            store_n(simd, &acc, i0, dst);
        } else {
            store_pitched(simd, &acc, i0, plan.pitch, plan.ow, dst);
        }
        if i0 >= last {
            break;
        }
    }
}

/// Stores `N` vectors of the pitched flat index `i0..` (row `i / pitch`, column
/// `i % pitch`; a vector never crosses a row) at their output pixels in `dst` (`ow` per
/// row): a vector wholly past `ow` is dropped, one that reaches past it is stored whole
/// where `dst` has room — its last lanes land on the next row's first pixels, which that
/// row's own first vector stores later (vectors go in increasing order, and a block moved
/// back stores every row it covers again from its start) — else cut.
#[inline(always)]
fn store_pitched<S: pulp::Simd, const N: usize>(
    simd: S,
    acc: &[S::f32s; N],
    i0: usize,
    pitch: usize,
    ow: usize,
    dst: &mut [f32],
) {
    let lanes = S::F32_LANES;
    let (mut row, mut col) = (i0 / pitch, i0 % pitch);
    for a in acc {
        if col < ow && !put(simd, a, row * ow + col, dst) {
            break;
        }
        col += lanes;
        if col >= pitch {
            col = 0;
            row += 1;
        }
    }
}

/// [`plane`] for a 3×3 kernel: the taps unrolled, in blocks of [`V`] vectors, each tap one
/// load from its offset; the taps of kernel column 0 masked by the left-edge mask, those of
/// column 2 by the right-edge one (each loaded once per block; all ones where the plan needs
/// none). The same chains as [`plane`]: taps in `(ky, kx)` order, one FMA each from `+0.0`,
/// `0 · w` over the padding.
#[inline(always)]
fn plane_3x3<S: pulp::Simd, const ROW: bool>(
    simd: S,
    plan: &Plan,
    fast: &Fast,
    buf: &[f32],
    w: &[f32; 9],
    dst: &mut [f32],
) {
    let (hw, ow) = (plan.hw(), plan.ow);
    let lanes = S::F32_LANES;
    let step = V * lanes;
    let period = ow + V * MAX_LANES;
    let (left, right) = fast.tables.split_at(period.min(fast.tables.len()));
    let zero = simd.splat_f32s(0.0);
    let wv: [S::f32s; 9] = std::array::from_fn(|t| simd.splat_f32s(w[t]));
    // The block's offset in its row period: i0 % ow, kept without a division.
    let mut col = 0;
    for i0 in (0..hw).step_by(step) {
        let (Some(ml), Some(mr)) = (left.get(col..col + step), right.get(col..col + step)) else {
            return;
        };
        let ml: [S::u32s; V] = std::array::from_fn(|v| vector::<S, _, _>(ml, v));
        let mr: [S::u32s; V] = std::array::from_fn(|v| vector::<S, _, _>(mr, v));
        let mut acc = [zero; V];
        for ky in 0..3 {
            // The row's three taps as slices of one run (stride 1: consecutive offsets) or
            // three (stride 2: two phase planes). In range: the buffer holds the plane
            // rounded up to whole blocks plus margins.
            let at = fast.starts[3 * ky] + i0;
            let (s0, s1, s2) = if ROW {
                let Some(run) = buf.get(at..at + step + 2) else {
                    return;
                };
                (run, &run[1..], &run[2..])
            } else {
                let tap = |kx: usize| {
                    let at = fast.starts[3 * ky + kx] + i0;
                    buf.get(at..at + step)
                };
                let (Some(s0), Some(s1), Some(s2)) = (tap(0), tap(1), tap(2)) else {
                    return;
                };
                (s0, s1, s2)
            };
            let load = |src: &[f32], v: usize| -> S::f32s { vector::<S, _, _>(src, v) };
            for (v, a) in acc.iter_mut().enumerate() {
                let x0 = masked(simd, load(s0, v), ml[v]);
                *a = simd.mul_add_f32s(x0, wv[3 * ky], *a);
                *a = simd.mul_add_f32s(load(s1, v), wv[3 * ky + 1], *a);
                let x2 = masked(simd, load(s2, v), mr[v]);
                *a = simd.mul_add_f32s(x2, wv[3 * ky + 2], *a);
            }
        }
        store(simd, &acc, i0, dst);
        col += step;
        while col >= ow {
            col -= ow;
        }
    }
}

/// The narrowest output rows [`plane_3x3_strips`] takes (narrower ones waste most of a
/// vector per row; [`plane_3x3`] runs them as one flat array): 14×14 planes gained a third,
/// 7×7 ones lost 15% (see the module doc).
const STRIP_MIN_WIDTH: usize = 14;

/// [`plane_3x3`] for stride 1 (each kernel row's taps one run of the buffer), by strips of
/// `VS` vectors from each row's start, each strip's rows top to bottom: input row `j`'s
/// three shifted runs (the outer two masked by the strip's column masks) are loaded once and
/// multiplied into the three output rows that read them, `j − 2` (kernel row 2: that row is
/// then complete and stored), `j − 1` (kernel row 1) and `j` (kernel row 0, from `+0.0`). So
/// three loads per nine multiply-adds per vector, where [`plane_3x3`] loads once per
/// multiply-add, and each output meets its taps in `(ky, kx)` order: the same chains, so
/// the same bits. A strip that runs past its row's end computes the next row's first pixels
/// as the flat formula gives them (the values that row's own strip stores). `false`
/// (nothing written) where the buffer is too short for the reads (then [`plane_3x3`] runs).
#[inline(always)]
fn plane_3x3_strips<S: pulp::Simd, const VS: usize>(
    simd: S,
    plan: &Plan,
    fast: &Fast,
    buf: &[f32],
    w: &[f32; 9],
    dst: &mut [f32],
) -> bool {
    let (oh, ow) = (plan.oh, plan.ow);
    let lanes = S::F32_LANES;
    let step = VS * lanes;
    let period = ow + V * MAX_LANES;
    if step > V * MAX_LANES || fast.tables.len() < 2 * period {
        return false;
    }
    let (left, right) = fast.tables.split_at(period);
    // The last strip starts before `ow` and reads `step + 2` slots of input rows up to
    // `oh + 1` (the row under the plane).
    let last_c0 = (ow - 1) / step * step;
    if fast.starts[0] + (oh + 1) * ow + last_c0 + step + 2 > buf.len() {
        return false;
    }
    let zero = simd.splat_f32s(0.0);
    let wv: [S::f32s; 9] = std::array::from_fn(|t| simd.splat_f32s(w[t]));
    let load = |src: &[f32], v: usize| -> S::f32s { vector::<S, _, _>(src, v) };
    for c0 in (0..ow).step_by(step) {
        let (Some(ml), Some(mr)) = (left.get(c0..c0 + step), right.get(c0..c0 + step)) else {
            return false;
        };
        let ml: [S::u32s; VS] = std::array::from_fn(|v| vector::<S, _, _>(ml, v));
        let mr: [S::u32s; VS] = std::array::from_fn(|v| vector::<S, _, _>(mr, v));
        // Output rows j − 2 and j − 1, partial (rows above the plane are computed and
        // dropped).
        let (mut two, mut one) = ([zero; VS], [zero; VS]);
        for j in 0..oh + 2 {
            let at = fast.starts[0] + c0 + j * ow;
            let Some(run) = buf.get(at..at + step + 2) else {
                return false;
            };
            let mut new = [zero; VS];
            for v in 0..VS {
                let x0 = masked(simd, load(run, v), ml[v]);
                let x1 = load(&run[1..], v);
                let x2 = masked(simd, load(&run[2..], v), mr[v]);
                two[v] = simd.mul_add_f32s(x0, wv[6], two[v]);
                two[v] = simd.mul_add_f32s(x1, wv[7], two[v]);
                two[v] = simd.mul_add_f32s(x2, wv[8], two[v]);
                one[v] = simd.mul_add_f32s(x0, wv[3], one[v]);
                one[v] = simd.mul_add_f32s(x1, wv[4], one[v]);
                one[v] = simd.mul_add_f32s(x2, wv[5], one[v]);
                new[v] = simd.mul_add_f32s(x0, wv[0], new[v]);
                new[v] = simd.mul_add_f32s(x1, wv[1], new[v]);
                new[v] = simd.mul_add_f32s(x2, wv[2], new[v]);
            }
            if let Some(y) = j.checked_sub(2) {
                store_n(simd, &two, y * ow + c0, dst);
            }
            two = one;
            one = new;
        }
    }
    true
}

/// Vector `v` of `src` (its elements `v·lanes..(v + 1)·lanes`, `S`'s lanes), read unaligned:
/// a tap's input run or a column mask.
#[inline(always)]
fn vector<S: pulp::Simd, T: bytemuck::Pod, U: bytemuck::Pod>(src: &[T], v: usize) -> U {
    let lanes = S::F32_LANES;
    bytemuck::pod_read_unaligned(bytemuck::cast_slice(&src[v * lanes..(v + 1) * lanes]))
}

/// `x` with the lanes whose `m` is zero cleared to `+0.0` (a tap over the padding).
#[inline(always)]
fn masked<S: pulp::Simd>(simd: S, x: S::f32s, m: S::u32s) -> S::f32s {
    bytemuck::cast(simd.and_u32s(bytemuck::cast(x), m))
}

/// Stores `N` vectors at output pixels `i0..` of `dst`, each one store (a copy of constant
/// length; `pulp`'s masked store is a call), the last one masked at the plane's end. (The cut
/// vector had gone through the stack into a `memcpy` call, whose load of it waited until the
/// vector's store reached the cache, behind the plane's stores: with two threads, 9–23% of
/// the time of three 384×14×14 blocks of MobileNetV2 sat on that load.)
#[inline(always)]
fn store_n<S: pulp::Simd, const N: usize>(simd: S, acc: &[S::f32s; N], i0: usize, dst: &mut [f32]) {
    let lanes = S::F32_LANES;
    for (v, a) in acc.iter().enumerate() {
        if !put(simd, a, i0 + v * lanes, dst) {
            break;
        }
    }
}

/// Stores vector `a` at `dst[at..]`: whole where `dst` has room for it, else cut at its end;
/// `false` (nothing stored) where `at` is at or past the end.
#[inline(always)]
fn put<S: pulp::Simd>(simd: S, a: &S::f32s, at: usize, dst: &mut [f32]) -> bool {
    let lanes = S::F32_LANES;
    match dst.get_mut(at..) {
        Some(out) if out.len() >= lanes => {
            out[..lanes].copy_from_slice(bytemuck::cast_slice(std::slice::from_ref(a)));
        }
        Some(out) if !out.is_empty() => simd.partial_store_f32s(out, *a),
        _ => return false,
    }
    true
}

/// Stores a block's vectors at output pixels `i0..` of `dst`, the last one cut at the plane's
/// end.
#[inline(always)]
fn store<S: pulp::Simd>(simd: S, acc: &[S::f32s; V], i0: usize, dst: &mut [f32]) {
    store_n(simd, acc, i0, dst);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::panic, reason = "test code: a failure is a panic")]

    use super::*;

    /// Stride-1 "same" 3×3 planes: `plane_3x3_strips` takes each (it does not fall back) and
    /// gives `plane_3x3`'s bits, with the widest vectors, AVX2's and one lane.
    #[test]
    fn strips_give_the_flat_kernels_bits() {
        struct Both<'a>(&'a Plan, &'a [f32], &'a [f32; 9], usize);
        impl pulp::WithSimd for Both<'_> {
            type Output = (Vec<f32>, Vec<f32>, bool);
            #[inline(always)]
            fn with_simd<S: pulp::Simd>(self, simd: S) -> Self::Output {
                let Both(plan, buf, w, vs) = self;
                let Some(fast) = &plan.fast else {
                    panic!("no unrolled form");
                };
                let mut flat = vec![1.0f32; plan.hw()];
                plane_3x3::<S, true>(simd, plan, fast, buf, w, &mut flat);
                let mut strips = vec![2.0f32; plan.hw()];
                let took = match vs {
                    1 => plane_3x3_strips::<S, 1>(simd, plan, fast, buf, w, &mut strips),
                    _ => plane_3x3_strips::<S, 2>(simd, plan, fast, buf, w, &mut strips),
                };
                (flat, strips, took)
            }
        }
        for (h, w) in [
            (56, 56),
            (28, 28),
            (112, 112),
            (128, 128),
            (3, 25),
            (1, 24),
            (30, 40),
            (14, 14),
            (20, 17),
            (2, 14),
        ] {
            let plan = Plan::new([h, w, 3, 3, 1, 1, 1, 1, 1, 1, h, w])
                .unwrap_or_else(|| panic!("{h}x{w}: no plan"));
            let x: Vec<f32> = (0..h * w)
                .map(|i| match i % 101 {
                    7 => f32::NAN,
                    13 => f32::NEG_INFINITY,
                    _ => ((i * 7919) % 1013) as f32 / 97.0 - 5.0,
                })
                .collect();
            let wt: [f32; 9] = std::array::from_fn(|t| t as f32 * 0.37 - 1.1);
            let mut buf = FlatPlane::default();
            buf.prepare(&plan);
            buf.load(&plan, 0, &x);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for vs in [1, 2] {
                let mut runs = vec![(
                    "widest",
                    crate::simd::dispatch(Both(&plan, buf.slot(0), &wt, vs)),
                )];
                #[cfg(target_arch = "x86_64")]
                if let Some(v3) = pulp::x86::V3::try_new() {
                    runs.push((
                        "avx2",
                        pulp::WithSimd::with_simd(Both(&plan, buf.slot(0), &wt, vs), v3),
                    ));
                }
                runs.push((
                    "scalar",
                    pulp::WithSimd::with_simd(
                        Both(&plan, buf.slot(0), &wt, vs),
                        pulp::Scalar::new(),
                    ),
                ));
                for (isa, (flat, strips, took)) in runs {
                    assert!(took, "{h}x{w} {isa} {vs}: strips declined");
                    assert_eq!(bits(&strips), bits(&flat), "{h}x{w} {isa} {vs}");
                }
            }
        }
    }

    /// The pitched layout where its taps cost less than the masked ones (EfficientNet's 5×5
    /// on 28×28 and 14×14, stride 2 on 56×56), the flat one where it does not (a 5×5 on 7×7)
    /// and for the unrolled 3×3 kernels (a dilated one included); the pitch
    /// leaves each row's widest column shift in zeros, in whole vectors of 16.
    #[test]
    fn the_pitched_layout_is_taken_where_it_pays() {
        for (shape, pitch) in [
            ([28, 28, 5, 5, 1, 1, 1, 1, 2, 2, 28, 28], 32),
            ([14, 14, 5, 5, 1, 1, 1, 1, 2, 2, 14, 14], 16),
            ([56, 56, 5, 5, 2, 2, 1, 1, 2, 2, 28, 28], 32),
            ([29, 29, 5, 5, 1, 1, 1, 1, 2, 2, 29, 29], 32),
            ([20, 33, 5, 5, 1, 1, 1, 1, 2, 2, 20, 33], 48),
            ([40, 36, 3, 3, 1, 1, 2, 2, 2, 2, 40, 36], 36),
            ([7, 7, 5, 5, 1, 1, 1, 1, 2, 2, 7, 7], 7),
            ([28, 28, 3, 3, 1, 1, 1, 1, 1, 1, 28, 28], 28),
            ([28, 28, 3, 3, 2, 2, 1, 1, 1, 1, 14, 14], 14),
        ] {
            let plan = Plan::new(shape).unwrap_or_else(|| panic!("{shape:?}: no plan"));
            assert_eq!(plan.pitch, pitch, "{shape:?}");
            let flat_general = pitch == plan.ow && plan.fast.is_none();
            assert_eq!(plan.masks.is_empty(), !flat_general, "{shape:?}");
        }
    }

    #[test]
    fn dealing_pairs_matches_taking_every_other_value() {
        // Lengths around the 8-pair blocks, outputs shorter than the pairs, an odd source
        // length, and values whose bits must come through unchanged (NaN payloads, -0.0).
        for len in (0usize..70).chain([111, 112, 224]) {
            let src: Vec<f32> = (0..len)
                .map(|i| match i % 7 {
                    3 => f32::from_bits(0x7fc0_0000 | i as u32),
                    5 => -0.0,
                    _ => i as f32 * 1.5 - 20.0,
                })
                .collect();
            for n in [len / 2, (len / 2).saturating_sub(3)] {
                let (mut e, mut o) = (vec![9.0f32; n], vec![9.0f32; n]);
                deal_pairs(&src, &mut e, &mut o);
                for i in 0..n {
                    assert_eq!(e[i].to_bits(), src[2 * i].to_bits(), "even {i} of {len}");
                    assert_eq!(o[i].to_bits(), src[2 * i + 1].to_bits(), "odd {i} of {len}");
                }
            }
        }
    }
}
