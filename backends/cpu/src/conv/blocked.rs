//! The direct convolution (one group, any kernel size, stride, padding and dilation) of an
//! `NCHW16c` image into an `NCHW16c` output, the weight in `OIHW`: each output vector is 16
//! consecutive output channels of one pixel, so the channel counts (multiples of 16) fill the
//! vectors and the pixel count of a small plane (196, 49) costs only a narrower last tile, not
//! wasted lanes. This is the layout onnxruntime's CPU provider runs CNNs in (`NCHWc`). On
//! AVX2 the same kernel also runs `NCHW8c` (blocks of 8 channels, one vector: [`NARROW`]),
//! onnxruntime's block there, for channel counts that split by 8 only (MobileNetV2's 24);
//! below, 16 stands for the block `b` of the layout ([`Geom::block`]).
//!
//! Contract:
//!
//! - `x` is `[n][C/16][H][W][16]`, `y` `[n][O/16][OH][OW][16]`. A first layer's image of
//!   fewer channels stays `NCHW` (`[n][C][H][W]`, [`Geom::nchw_input`]): then a block of the
//!   image is one channel, as below with 1 for 16 (onnxruntime's `NCHWc` transformer gives
//!   such a layer an `NCHW` input too). The weight is packed once
//!   ([`pack`]) as groups of up to 4 output blocks, as even as they divide ([`groups`]): for
//!   each block of 16 input channels, each tap and each of the block's channels, the group's
//!   16–64 weights in a row; the values start on a 64-byte boundary, so that no weight vector
//!   straddles two cache lines.
//! - Every element of `y` is one chain of `f32` fused multiply-adds over the blocks of 16
//!   input channels in order, per block the taps in row-major order, per tap the block's 16
//!   channels in order, from `+0.0`; padding taps add `w · 0.0` (for an `NCHW` image: the
//!   channels in order, per channel the taps, the definition's order). Then the epilogue's
//!   steps ([`RegSteps::apply_block`]: bias or `batch_norm`, residual add in the output's
//!   layout, `relu`/`clip`), the same operations per element as the `NCHW` paths. The
//!   result does not depend on the tiling or the thread count.
//! - The image is read through its *phases*: for stride `s`, the `s × s` sub-images of the
//!   zero-padded image that taps land on ([`Geom::phase_of`]), each `[HV][WV][16]`
//!   (`[HV][WV]` for an `NCHW` image) per block of channels, where `WV` is the output's width
//!   plus the widest tap offset. Then output pixel `(r, q)` reads tap `t` at
//!   `r · WV + q + off(t)` of its phase: a tile of consecutive pixels of a *virtual* plane
//!   `OH × WV` reads consecutive vectors for every tap, whatever the stride. Tiles run along
//!   each output row (the virtual columns past `OW` are never computed), along the whole
//!   plane when `WV = OW`. A 1×1, stride-1, unpadded convolution reads `x` itself.
//! - AVX-512: a tile holds 6 pixels × 64 channels in 24 registers (four
//!   separate accumulator arrays: one `[[_; 6]; 4]` array was spilled to the stack, 2.1–2.7×
//!   slower), per step (channel, tap) 4 weight vectors and 6 broadcast pixels.
//! - AVX2 (a block of 16 is two 8-lane vectors, [`block_fits`]; one of 8 is one): groups of
//!   up to 2 blocks of 16 or 4 of 8, a tile 3 pixels × 32 channels in 12 of the 16 registers
//!   (6 × 16 for a group of 16 channels), the form
//!   of onnxruntime's AVX2 `NCHWc` kernel. Per step the 3 pixels are broadcast once, then the
//!   4 weight vectors come one at a time ([`step`]): with all four loaded first, 17 values
//!   were live and a sum went to the stack at every FMA (ResNet-50 1.6× slower). On a Zen 3
//!   EPYC, two threads, alternated: ResNet-50 in this layout took 0.82–0.91 of the `NCHW`
//!   path's time (median 0.85; `faer`'s GEMM for the 1×1 layers, `NCHW` Winograd for the
//!   3×3), MobileNetV2 median 0.90 (bench/RESULTS.md, session bu).
//! - Either way, the 16 (or 8) steps
//!   of a block and a tap are unrolled with constant offsets (onnxruntime's `NCHWc` kernel
//!   has the same form): no address arithmetic or bounds check between them. Steps run in
//!   chunks of whole blocks, about 128 steps, whose weights (32–36 KB) stay in L1 while the
//!   tile sweeps the plane; a chunk's partial sums go to the output and come back for the
//!   next. The epilogue runs on the last chunk's sums in registers before their one final
//!   store, per vector of the tile on all its pixels at once ([`RegSteps::apply_pixels`]: its
//!   values loaded and its last step chosen once), which matters where few input channels
//!   leave few multiply-adds per output (MobileNetV2's 16 → 96 on 112 × 112).
//! - While a chunk's tiles run, they prefetch the next chunk's weights toward L2 (after the
//!   task's last chunk, the first chunk of the next task in the thread's run), each tile its
//!   share of the lines spread over its steps (`prefetcht1`, a hint: the sums do not change):
//!   a large layer's weights stream from memory, and without it each chunk's first tile
//!   waited for them. ResNet-50 on two threads: the 512 3×3 layers 0.78–0.85 of their time,
//!   the 7 × 7 1×1 layers 0.80–0.90, the whole model 0.91–0.93 (bench/RESULTS.md, session
//!   bh). A burst of the same lines before each tile had gained nothing (session bg).
//! - Tasks are (image, group of output blocks, run of output rows): a plane is cut into runs
//!   when there are fewer groups than twice the threads, when the tasks would not split
//!   over the threads within a tenth of even, and into a run per thread at least when the
//!   image is larger than the weight: then the tasks go to the threads by run, not by
//!   group, so that each thread reads part of the image ([`rows_first`]).
//! - Why: onnxruntime's lead on CNNs is this layout. Unrolling a block's 16 steps and
//!   aligning the weights took 0.78–0.92 of the previous kernel's time on ResNet-50's shapes
//!   (3×3 most); with [`super::blocked_winograd`] on its 56×56, 28×28 and 14×14 3×3 layers the
//!   whole model converted takes 0.80–0.85 of the `NCHW` path's time and 1.04–1.06 of
//!   onnxruntime's, one process, one and two threads (bench/RESULTS.md, session av).
//!
//! ```text
//! y = R.nn.conv2d(x, w, strides=[2, 2], padding=[1, 1, 1, 1],
//!                 data_layout="NCHW16c", kernel_layout="OIHW", out_layout="NCHW16c")
//! ; x: (1, 8, 56, 56, 16) (128 channels), w: (128, 128, 3, 3) -> y: (1, 8, 28, 28, 16)
//! ; phases: 4 of 29 × 29 (WV = 28 + 1); tap (1, 2) reads phase (1, 0) at offset 1
//! ; 2 groups of 4 blocks; per group and row of 28 pixels 4 tiles of 6 and one of 4
//! y = R.nn.conv2d(x, w, strides=[2, 2], padding=[3, 3, 3, 3],
//!                 data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW16c")
//! ; x: (1, 3, 224, 224), w: (64, 3, 7, 7) -> y: (1, 4, 112, 112, 16): 3 blocks of one
//! ; channel, phases 4 of 115 × 115; per tile 147 steps (channel, tap)
//! ```

use super::epilogue::{RegSteps, Step};
use crate::util::KResult;

/// Channels per block of the wide layout (the `16` of `NCHW16c`, one AVX-512 vector, two
/// AVX2 ones); [`NARROW`] is the other size [`conv`] runs.
pub(crate) const BLOCK: usize = 16;
/// Channels per block of the narrow layout (`NCHW8c`, one AVX2 vector): onnxruntime's block
/// on AVX2, where channel counts such as MobileNetV2's 24 split into blocks of 8, not 16.
pub(crate) const NARROW: usize = 8;

/// The data and output layout of [`conv`] in blocks of `b` channels (`NCHW16c`, `NCHW8c`).
pub(crate) fn layout(b: usize) -> String {
    format!("NCHW{b}c")
}

/// The block of a layout [`conv`] runs (`NCHW16c`: 16, `NCHW8c`: 8); `None` for another.
pub(crate) fn block_of(layout: &str) -> Option<usize> {
    crate::pool_blocked::block_of(layout).filter(|b| [BLOCK, NARROW].contains(b))
}
/// Pixels per register tile: 6, or 3 where a pixel's vectors are four on a 16-register set
/// ([`pixels`]).
const PXT: usize = 6;
/// The most output blocks per group (a tile's channels: 4 × 16 on AVX-512).
const OBG: usize = 4;
/// The most vectors per pixel of a tile, and in a row of a group's packed weights.
const VECS: usize = 4;

/// Whether [`conv`] runs blocks of `b` channels on vectors of `lanes` `f32`s: a block of 16
/// is one AVX-512 vector or two AVX2 ones, a block of 8 one AVX2 vector.
pub(crate) fn block_fits(b: usize, lanes: usize) -> bool {
    (b == BLOCK && (lanes == BLOCK || lanes == BLOCK / 2)) || (b == NARROW && lanes == NARROW)
}

/// The blocks [`conv`] runs on vectors of `lanes`, the preferred first: 16 on AVX-512; 16,
/// then 8 on AVX2.
pub(crate) fn blocks_for(lanes: usize) -> Vec<usize> {
    [BLOCK, NARROW]
        .into_iter()
        .filter(|&b| block_fits(b, lanes))
        .collect()
}

/// Output blocks of `b` channels per group on vectors of `lanes` ([`block_fits`]): a tile's
/// pixel is at most [`VECS`] vectors, 4 blocks on AVX-512, on AVX2 2 blocks of 16 or 4 of 8
/// (onnxruntime's AVX2 `NCHWc` kernel also holds 4 vectors of filters per pixel).
fn group_blocks(lanes: usize, b: usize) -> usize {
    (VECS * lanes / b.max(1)).clamp(1, OBG)
}

/// Pixels per full tile of `vecs` vectors on vectors of `lanes`: the accumulators take 24 of
/// AVX-512's 32 registers (6 × 4), at most 12 of AVX2's 16 (6 × 2 or 3 × 4), leaving room
/// for the weights and the broadcast pixel.
const fn pixels(lanes: usize, vecs: usize) -> usize {
    if lanes >= BLOCK || vecs <= 2 { PXT } else { 3 }
}

/// The groups of `blocks` output blocks, as `(first block, blocks)`: as few as groups of at
/// most `per` ([`group_blocks`]) allow, their sizes as even as they divide (`per` 4, 6
/// blocks: 3 and 3, not 4 and 2; 10: 4, 3, 3), so that a call's tasks cost about the same.
/// (MobileNetV2's 576 → 96 on 14 × 14 on two threads: the thread of the 4-block group's
/// runs ended last, the other idle for a quarter of the call.) The packed weight and the
/// tasks follow the same groups.
fn groups(blocks: usize, per: usize) -> impl ExactSizeIterator<Item = (usize, usize)> {
    let count = blocks.div_ceil(per.max(1));
    let (base, extra) = match count {
        0 => (0, 0),
        n => (blocks / n, blocks % n),
    };
    (0..count).map(move |gi| (gi * base + gi.min(extra), base + usize::from(gi < extra)))
}

/// Steps (input channel, tap) per chunk, rounded down to whole blocks of channels, at least
/// one: a group's weights for one chunk, 4 × 16 × 1024 floats, 256 KB, stay in a 1 MB L2
/// while the tiles of a task pass over them, and the partial sums go through memory once per
/// chunk. (On a Zen 4 EPYC, one thread, against 128 steps, 32 KB: the 1×1 layers of 256 or
/// more input channels 0.90–0.94 of the time, 3×3 ones of 128 or more 0.91–0.93, the rest
/// even; bench/RESULTS.md, session aw.)
const CCH: usize = 1024;
/// The fewest virtual pixels a task takes when a plane is cut into runs: four tiles, so that
/// a 7 × 7 plane splits into runs of 4 and 3 rows when its groups alone are too few for the
/// threads (MobileNetV2's 960 → 160 and 576 → 160, three groups on two threads: 0.88–0.90 and
/// 0.91–0.93 of the time with eight tiles a run, which kept 7 × 7 whole; session be).
const MIN_RUN: usize = 4 * PXT;

/// The shape of a convolution [`conv`] runs, and how it reads its image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geom {
    /// Images, input and output channels.
    pub(crate) n: usize,
    pub(crate) c: usize,
    pub(crate) o: usize,
    /// The input plane.
    pub(crate) h: usize,
    pub(crate) w: usize,
    /// Kernel, strides, dilations, padding (top, left).
    kh: usize,
    kw: usize,
    sh: usize,
    sw: usize,
    dh: usize,
    dw: usize,
    pt: usize,
    pl: usize,
    /// The output plane.
    pub(crate) oh: usize,
    pub(crate) ow: usize,
    /// Input channels per block of the image: `b` (`NCHW16c`, `NCHW8c`), or 1 for an `NCHW`
    /// image ([`Geom::nchw_input`]).
    ib: usize,
    /// Channels per block of the output (and of a blocked image): [`BLOCK`] or [`NARROW`].
    b: usize,
}

impl Geom {
    /// The geometry of a convolution of `n` images of `c × h × w` with `o` filters of
    /// `kernel`, given strides, dilation and padding (top, left, bottom, right); `None` when a
    /// value is zero or negative where it may not be, the output is empty or a size overflows.
    pub(crate) fn new(
        [n, c, h, w]: [usize; 4],
        o: usize,
        [kh, kw]: [usize; 2],
        strides: [i64; 2],
        dilation: [i64; 2],
        padding: [i64; 4],
    ) -> Option<Geom> {
        let pos = |v: i64| usize::try_from(v).ok().filter(|&v| v > 0);
        let nonneg = |v: i64| usize::try_from(v).ok();
        let (sh, sw, dh, dw) = (
            pos(strides[0])?,
            pos(strides[1])?,
            pos(dilation[0])?,
            pos(dilation[1])?,
        );
        let [pt, pl, pb, pr] = padding.map(nonneg);
        let (pt, pl, pb, pr) = (pt?, pl?, pb?, pr?);
        let out = |size: usize, k: usize, d: usize, s: usize, lo: usize, hi: usize| {
            let span = (k.checked_sub(1)?).checked_mul(d)?.checked_add(1)?;
            let padded = size.checked_add(lo)?.checked_add(hi)?;
            Some(padded.checked_sub(span)? / s + 1)
        };
        let g = Geom {
            n,
            c,
            o,
            h,
            w,
            kh,
            kw,
            sh,
            sw,
            dh,
            dw,
            pt,
            pl,
            oh: out(h, kh, dh, sh, pt, pb)?,
            ow: out(w, kw, dw, sw, pl, pr)?,
            ib: BLOCK,
            b: BLOCK,
        };
        // Every buffer the kernel indexes must have a size that fits.
        let ok = [n, c, o, h, w, kh, kw].iter().all(|&v| v > 0)
            && g.source_len().is_some()
            && n.checked_mul(o)
                .and_then(|v| v.checked_mul(g.oh))
                .and_then(|v| v.checked_mul(g.ow))
                .is_some();
        ok.then_some(g)
    }

    fn taps(&self) -> usize {
        self.kh * self.kw
    }

    /// The same convolution of an `NCHW` image (`[n][c][h][w]`, any channel count) into an
    /// `NCHW16c` output: a block of the image is one channel.
    pub(crate) fn nchw_input(self) -> Geom {
        Geom { ib: 1, ..self }
    }

    /// The same convolution in blocks of `b` channels ([`BLOCK`] as made, or [`NARROW`]): the
    /// output's blocks, and the image's unless it is `NCHW`.
    pub(crate) fn with_block(self, b: usize) -> Geom {
        let ib = if self.ib == 1 { 1 } else { b };
        Geom { b, ib, ..self }
    }

    /// Input channels per block of the image (`b`, or 1 for an `NCHW` image).
    pub(crate) fn input_block(&self) -> usize {
        self.ib
    }

    /// Channels per block of the output ([`Geom::with_block`]).
    pub(crate) fn block(&self) -> usize {
        self.b
    }

    /// The kernel's size, strides, dilations and padding (top, left).
    pub(crate) fn kernel(&self) -> [usize; 2] {
        [self.kh, self.kw]
    }
    pub(crate) fn stride(&self) -> [usize; 2] {
        [self.sh, self.sw]
    }
    pub(crate) fn dilation(&self) -> [usize; 2] {
        [self.dh, self.dw]
    }
    pub(crate) fn pad(&self) -> [usize; 2] {
        [self.pt, self.pl]
    }

    /// Whether the kernel reads `x` itself (1×1, stride 1, unpadded).
    fn in_place(&self) -> bool {
        self.taps() == 1
            && (self.sh, self.sw, self.pt, self.pl) == (1, 1, 0, 0)
            && (self.oh, self.ow) == (self.h, self.w)
    }

    /// The widest tap offsets within a phase (rows, columns).
    fn reach(&self) -> (usize, usize) {
        (
            (self.kh - 1) * self.dh / self.sh,
            (self.kw - 1) * self.dw / self.sw,
        )
    }

    /// The virtual plane's width and the phases' height. Every read stays inside its phase:
    /// output pixel `(r, q)` (`q < OW`) reads tap offsets up to `(RH, RW)` further, at most
    /// `(OH - 1 + RH) · WV + OW - 1 + RW`, under `(OH + RH) · WV` as `WV = OW + RW`.
    fn virt(&self) -> (usize, usize) {
        if self.in_place() {
            return (self.w, self.h);
        }
        let (rh, rw) = self.reach();
        (self.ow + rw, self.oh + rh)
    }

    /// The phases taps land on, in order of first use (row-major taps): `(row, column)`
    /// offsets in the padded image.
    fn phases(&self) -> Vec<(usize, usize)> {
        let mut v = Vec::new();
        for i in 0..self.kh {
            for j in 0..self.kw {
                let p = self.phase_of(i, j);
                if !v.contains(&p) {
                    v.push(p);
                }
            }
        }
        v
    }

    /// The phase tap `(i, j)` reads.
    fn phase_of(&self, i: usize, j: usize) -> (usize, usize) {
        (i * self.dh % self.sh, j * self.dw % self.sw)
    }

    /// How many phases the taps land on: [`Geom::phases`]' length, counted without listing
    /// them. Tap row `i` lands on phase row `i · dh mod sh`, which repeats with period
    /// `sh / gcd(dh, sh)` and is distinct within one; likewise for the columns, and the phases
    /// are every pair of the two.
    fn phase_count(&self) -> usize {
        let distinct = |k: usize, d: usize, s: usize| {
            let (mut a, mut b) = (d, s);
            while b != 0 {
                (a, b) = (b, a % b);
            }
            k.min(s / a.max(1))
        };
        distinct(self.kh, self.dh, self.sh) * distinct(self.kw, self.dw, self.sw)
    }

    /// The values of one block of channels of one image as the kernel reads them.
    fn block_len(&self) -> Option<usize> {
        let (wv, hv) = self.virt();
        self.phase_count()
            .checked_mul(hv)?
            .checked_mul(wv)?
            .checked_mul(self.ib)
    }

    fn source_len(&self) -> Option<usize> {
        self.block_len()?
            .checked_mul(self.c.div_ceil(self.ib))?
            .checked_mul(self.n)
    }

    /// Each tap's offset in a block of phases (row-major taps).
    fn offsets(&self) -> Vec<usize> {
        let (wv, hv) = self.virt();
        let phases = self.phases();
        let mut v = Vec::with_capacity(self.taps());
        for i in 0..self.kh {
            for j in 0..self.kw {
                let ph = phases
                    .iter()
                    .position(|&p| p == self.phase_of(i, j))
                    .unwrap_or(0);
                let (r, q) = (i * self.dh / self.sh, j * self.dw / self.sw);
                v.push((ph * hv * wv + r * wv + q) * self.ib);
            }
        }
        v
    }
}

/// A weight packed for [`conv`] in output blocks of `b` channels: groups of up to
/// [`group_blocks`] output blocks (for the running CPU's vectors), each `[c / ib][taps][ib]
/// [blocks of the group][b]` for blocks of `ib` input channels (`b`, or 1 for an `NCHW`
/// image: `[c][taps][..][b]`); `sets` such weights one after the other, image `i` of a call
/// taking set `i % sets` (the Winograd GEMMs: one weight per tile position).
#[derive(Debug)]
pub(crate) struct Packed {
    o: usize,
    c: usize,
    taps: usize,
    sets: usize,
    /// Input channels per block ([`Geom::input_block`]).
    ib: usize,
    /// Output channels per block ([`Geom::block`]).
    b: usize,
    /// Output blocks per group ([`group_blocks`]).
    obg: usize,
    /// The values start at `data[off]`, the first 64-byte boundary of the buffer.
    off: usize,
    data: Vec<f32>,
}

impl Packed {
    /// Where image `n`'s weights of the group from output block `g0` start (after `off`).
    fn group_at(&self, n: usize, g0: usize) -> usize {
        (n % self.sets.max(1)) * self.o * self.c * self.taps + g0 * self.b * self.c * self.taps
    }

    /// The input channels of a chunk ([`CCH`] steps, whole blocks of the image's channels).
    fn chunk_steps(&self) -> usize {
        (CCH / (self.ib * self.taps)).max(1) * self.ib
    }
}

/// Packs an `OIHW` weight `w` of `o × c × taps` for [`conv`] in output blocks of `b`
/// channels ([`Geom::block`]) of an image in blocks of `ib` channels
/// ([`Geom::input_block`]); `None` when `b` is not [`BLOCK`] or [`NARROW`], `o` not a
/// multiple of it, `c` not one of `ib` (`b` or 1), or `w` has another length.
pub(crate) fn pack(
    w: &[f32],
    o: usize,
    c: usize,
    taps: usize,
    [ib, b]: [usize; 2],
) -> Option<Packed> {
    if w.len() != o.checked_mul(c)?.checked_mul(taps)? {
        return None;
    }
    pack_sets(o, c, taps, [ib, b], 1, |_, oc, ci, t| {
        w[(oc * c + ci) * taps + t]
    })
}

/// Packs `sets` weights of `o × c × taps`, `get(set, o, c, tap)` each value, in output
/// blocks of `b` channels for blocks of `ib` input channels; `None` when `b` is not
/// [`BLOCK`] or [`NARROW`], `o` not a multiple of it, `ib` not `b` or 1, `c` not a multiple
/// of `ib`, or a count is zero.
pub(crate) fn pack_sets(
    o: usize,
    c: usize,
    taps: usize,
    [ib, b]: [usize; 2],
    sets: usize,
    get: impl Fn(usize, usize, usize, usize) -> f32,
) -> Option<Packed> {
    if !shape_fits(o, c, [ib, b]) || taps == 0 {
        return None;
    }
    let len = o.checked_mul(c)?.checked_mul(taps)?.checked_mul(sets)?;
    let blocks = o / b;
    let obg = group_blocks(crate::simd::f32_lanes(), b);
    let mut data = vec![0.0f32; len.checked_add(crate::par::LINE_SLACK)?];
    let off = crate::par::to_line(&data);
    let mut at = off;
    for set in 0..sets {
        for (g0, nb) in groups(blocks, obg) {
            for cb in 0..c / ib {
                for t in 0..taps {
                    for ci in cb * ib..(cb + 1) * ib {
                        for ob in 0..nb {
                            for l in 0..b {
                                data[at] = get(set, (g0 + ob) * b + l, ci, t);
                                at += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    Some(Packed {
        o,
        c,
        taps,
        sets,
        ib,
        b,
        obg,
        off,
        data,
    })
}

/// Whether [`conv`] runs a convolution of `c` input and `o` output channels in output
/// blocks of `b` channels, the image in blocks of `ib` channels (`b`, or 1 for `NCHW`), with
/// these epilogue steps on this CPU.
pub(crate) fn takes(o: usize, c: usize, [ib, b]: [usize; 2], steps: &[Step]) -> bool {
    block_fits(b, crate::simd::f32_lanes())
        && shape_fits(o, c, [ib, b])
        && RegSteps::new(steps).is_some()
}

/// Whether `o` output and `c` input channels split into output blocks of `b` ([`BLOCK`] or
/// [`NARROW`]) and input blocks of `ib` (`b`, or 1 for an `NCHW` image), neither count zero.
fn shape_fits(o: usize, c: usize, [ib, b]: [usize; 2]) -> bool {
    (b == BLOCK || b == NARROW)
        && (ib == b || ib == 1)
        && o > 0
        && c > 0
        && o.is_multiple_of(b)
        && c.is_multiple_of(ib)
}

/// The image's phases ([`Geom::virt`]): `[n][c/16][phases][HV][WV][16]`, zeros where a tap
/// reads padding.
fn deal(x: &[f32], g: &Geom, threads: usize) -> KResult<crate::par::Scratch> {
    let len = g
        .source_len()
        .ok_or("blocked convolution: the image is too large")?;
    let bl = g
        .block_len()
        .ok_or("blocked convolution: the image is too large")?;
    let f32t = fusebox_core::ir::DType::F32;
    fusebox_core::runtime::memory::check_alloc("the phases of relax.nn.conv2d", f32t, &[len])
        .map_err(|e| e.to_string())?;
    let (wv, hv) = g.virt();
    let phases = g.phases();
    let ib = g.ib;
    let plane = g.h * g.w * ib;
    // Per phase, the columns `q` whose image column `q · sw + bb - pl` is inside the image.
    let cols = |bb: usize| {
        let hi = (g.w + g.pl).saturating_sub(bb).div_ceil(g.sw).min(wv);
        (g.pl.saturating_sub(bb).div_ceil(g.sw).min(hi), hi)
    };
    let mut out = crate::par::scratch_f32_aligned(len);
    crate::par::for_each_chunk_mut(&mut out, bl, threads, |at, dst| {
        let b = at / bl;
        let src = x.get(b * plane..(b + 1) * plane).unwrap_or(&[]);
        for (&(a, bb), dst) in phases.iter().zip(dst.chunks_exact_mut(hv * wv * ib)) {
            let (lo, hi) = cols(bb);
            let first = (lo * g.sw + bb).saturating_sub(g.pl);
            for (r, line) in dst.chunks_exact_mut(wv * ib).enumerate() {
                // The padded image's row `r · sh + a`, i.e. `x`'s row `r · sh + a - pt`.
                let row = (r * g.sh + a)
                    .checked_sub(g.pt)
                    .filter(|&y| y < g.h && src.len() == plane)
                    .and_then(|y| src.get((y * g.w + first) * ib..(y + 1) * g.w * ib));
                let Some(row) = row else {
                    line.fill(0.0);
                    continue;
                };
                let (left, rest) = line.split_at_mut(lo * ib);
                let (mid, right) = rest.split_at_mut((hi - lo) * ib);
                left.fill(0.0);
                right.fill(0.0);
                if ib == 1 {
                    for (d, &v) in mid.iter_mut().zip(row.iter().step_by(g.sw)) {
                        *d = v;
                    }
                } else {
                    let pixels = row.chunks(ib).step_by(g.sw);
                    for (d, s) in mid.chunks_exact_mut(ib).zip(pixels) {
                        d.copy_from_slice(s);
                    }
                }
            }
        }
    });
    Ok(out)
}

/// Whether [`conv`]'s threads share out runs of output rows, each thread taking every group of
/// output blocks on its runs, rather than groups: when one image, as the kernel reads it
/// (`image` elements), is larger than the weight. A thread takes a contiguous range of the
/// tasks ([`crate::par::run_tasks`]); ordered by run, it reads the rows of the image under
/// its runs, again for each group mostly from its own cache, and all the weights; ordered by
/// group, the whole image and its groups' weights. (ResNet-50's 256 → 128 on 56 × 56, two
/// groups, two threads: 0.70 of the time by rows; 512 → 128 on 28 × 28 0.85; session bf.)
fn rows_first(image: usize, weight: usize, threads: usize) -> bool {
    threads > 1 && image > weight
}

/// One task's share of the output: for each output block of its group (`nb` of them), the
/// rows `r0..r1` of image `n` (`[rows][OW][b]`). Held in an array, not a `Vec`: a call's
/// tasks are built on the calling thread before any runs, and their allocations were the
/// largest part of a blocked call's set-up (session bg).
struct Task<'a> {
    n: usize,
    g0: usize,
    r0: usize,
    r1: usize,
    nb: usize,
    out: [&'a mut [f32]; OBG],
    /// The weights (a range of the packed data) of the first chunk of the task after this one
    /// in its thread's run, which its last chunk prefetches; empty for a run's last task.
    next: std::ops::Range<usize>,
}

/// `y = conv2d(x, w)` then `steps` (see the module doc): `x` `[n][c/b][h][w][b]` (or
/// `NCHW`), `y` `[n][o/b][oh][ow][b]` for `g`'s block `b`, on up to `threads` threads.
pub(crate) fn conv(
    w: &Packed,
    x: &[f32],
    g: &Geom,
    y: &mut [f32],
    threads: usize,
    steps: &[Step],
) -> KResult<()> {
    let (o, c) = (g.o, g.c);
    let (p_in, p) = (g.h * g.w, g.oh * g.ow);
    if w.o != o || w.c != c || w.taps != g.taps() || w.ib != g.ib || w.b != g.b {
        return Err(format!(
            "blocked convolution: a weight packed for {} -> {} channels, {} taps and blocks \
             of {} input and {} output channels, the convolution has {c} -> {o}, {}, {} and {}",
            w.c,
            w.o,
            w.taps,
            w.ib,
            w.b,
            g.taps(),
            g.ib,
            g.b
        ));
    }
    if x.len() != g.n * c * p_in || y.len() != g.n * o * p {
        return Err(format!(
            "blocked convolution: expected {} inputs and {} outputs for {} images of {c} -> {o} \
             channels on {p_in} -> {p} pixels, found {} and {}",
            g.n * c * p_in,
            g.n * o * p,
            g.n,
            x.len(),
            y.len()
        ));
    }
    let reg = RegSteps::new(steps).ok_or("blocked convolution: unsupported epilogue")?;
    let lanes = crate::simd::f32_lanes();
    if !block_fits(g.b, lanes) || w.obg != group_blocks(lanes, g.b) {
        return Err(format!(
            "blocked convolution: blocks of {} channels need vectors of {} f32 lanes and a \
             weight packed for them; this CPU's have {lanes}, the weight has groups of {} blocks",
            g.b,
            if g.b == BLOCK { "8 or 16" } else { "8" },
            w.obg
        ));
    }
    let dealt = if g.in_place() {
        None
    } else {
        Some(deal(x, g, threads)?)
    };
    let src: &[f32] = dealt.as_deref().unwrap_or(x);
    let bl = g
        .block_len()
        .ok_or("blocked convolution: the image is too large")?;
    let (wv, _) = g.virt();
    let offs = g.offsets();
    let b = g.b;
    let blocks = o / b;
    let count = groups(blocks, w.obg).len();
    let threads = threads.max(1);
    // What the threads share out ([`rows_first`]): runs of rows (each thread reads its part
    // of the image and every group's weights) or groups (each reads the whole image).
    let rows_first = rows_first(bl * (c / g.ib), o * c * g.taps(), threads);
    // Runs of rows per plane: enough tasks for the threads (a run per thread when they share
    // rows), and from there the fewest runs whose tasks split over the threads within a tenth
    // of even (5 groups on two threads: 3 and 2 tasks, 20% over; 2 runs each, 5 and 5).
    let per_thread = if rows_first { threads.div_ceil(g.n) } else { 1 };
    let want = (2 * threads).div_ceil(g.n * count).max(per_thread);
    let most = g.oh.div_ceil(MIN_RUN.div_ceil(wv)).max(1);
    let rows_of = |runs: usize| g.oh.div_ceil(runs.max(1));
    let even = |runs: usize| {
        let tasks = g.n * count * g.oh.div_ceil(rows_of(runs));
        10 * tasks.div_ceil(threads) * threads <= 11 * tasks
    };
    let first = want.min(most);
    let runs = (first..=most).find(|&r| even(r)).unwrap_or(first);
    let rows = rows_of(runs);
    let nruns = g.oh.div_ceil(rows.max(1));
    let mut tasks: Vec<Task<'_>> = Vec::with_capacity(g.n * count * nruns);
    for (ni, img) in y.chunks_mut(o * p).enumerate() {
        // Each block's plane cut into its runs (`[block][run]`), then gathered by (group, run).
        // Every plane has `nruns` runs: a short one is padded (an empty output) to keep the
        // indices.
        let mut slots: Vec<Option<&mut [f32]>> = Vec::with_capacity(blocks * nruns);
        slots.extend(
            img.chunks_mut(p * b)
                .flat_map(|plane| {
                    let runs = plane.chunks_mut(rows * g.ow * b);
                    runs.chain(std::iter::repeat_with(|| &mut [][..]))
                        .take(nruns)
                })
                .map(Some),
        );
        for (g0, nb) in groups(blocks, w.obg) {
            for r in 0..nruns {
                let mut out: [&mut [f32]; OBG] = Default::default();
                for (i, o) in out.iter_mut().enumerate().take(nb) {
                    if let Some(piece) = slots.get_mut((g0 + i) * nruns + r).and_then(Option::take)
                    {
                        *o = piece;
                    }
                }
                tasks.push(Task {
                    n: ni,
                    g0,
                    r0: r * rows,
                    r1: ((r + 1) * rows).min(g.oh),
                    nb,
                    out,
                    next: 0..0,
                });
            }
        }
    }
    if rows_first {
        tasks.sort_by_key(|t| (t.n, t.r0, t.g0));
    }
    let keys: Vec<(usize, usize, usize)> = tasks.iter().map(|t| (t.n, t.g0, t.nb)).collect();
    for (t, next) in tasks.iter_mut().zip(successors(w, &keys, threads)) {
        t.next = next;
    }
    let plan = Plan {
        w,
        src,
        img_len: bl * (c / g.ib),
        bl,
        wv,
        ow: g.ow,
        p,
        offs: &offs,
        reg,
    };
    let r = crate::par::run_tasks(tasks, threads, |t| {
        // One function per layout: the blocked one's code as if the other did not exist
        // (with both image layouts behind one `match`, the untouched `NCHW16c` layers of
        // ResNet-50 ran 2–4% slower).
        let plan = &plan;
        match (plan.w.b, plan.w.ib) {
            (BLOCK, BLOCK) => crate::simd::dispatch(Kernel::<BLOCK, BLOCK> { plan, task: t }),
            (BLOCK, _) => crate::simd::dispatch(Kernel::<BLOCK, 1> { plan, task: t }),
            (_, NARROW) => crate::simd::dispatch(Kernel::<NARROW, NARROW> { plan, task: t }),
            _ => crate::simd::dispatch(Kernel::<NARROW, 1> { plan, task: t }),
        }
        Ok::<(), String>(())
    });
    if let Some(d) = dealt {
        crate::par::keep(d);
    }
    r
}

/// For each task of a call (`(image, first output block, blocks)` in task order), the weights
/// its last chunk prefetches: the first chunk of its successor in its thread's run
/// ([`crate::par::run_bounds`]: [`crate::par::run_tasks`] gives each thread a run of
/// consecutive tasks), as a range of `w`'s data; empty for the last task of a run (another
/// thread reads what follows).
fn successors(
    w: &Packed,
    keys: &[(usize, usize, usize)],
    threads: usize,
) -> Vec<std::ops::Range<usize>> {
    let ends = crate::par::run_bounds(keys.len(), threads);
    let chunk = w.chunk_steps().min(w.c) * w.taps * w.b;
    (0..keys.len())
        .map(|i| match keys.get(i + 1) {
            Some(&(n, g0, nb)) if !ends.contains(&(i + 1)) => {
                let start = w.off + w.group_at(n, g0);
                start..start + chunk * nb
            }
            _ => 0..0,
        })
        .collect()
}

/// What every task of one call shares.
struct Plan<'a> {
    w: &'a Packed,
    /// The images as the kernel reads them (`x` or its phases) and one image's length.
    src: &'a [f32],
    img_len: usize,
    /// One block of channels' length in `src`.
    bl: usize,
    /// The virtual plane's width, the output's width and pixel count.
    wv: usize,
    ow: usize,
    p: usize,
    /// Each tap's offset in a block ([`Geom::offsets`]).
    offs: &'a [usize],
    reg: RegSteps<'a>,
}

/// A task of a call, for outputs in blocks of `B` channels and images in blocks of `IB`.
struct Kernel<'a, 'b, const B: usize, const IB: usize> {
    plan: &'a Plan<'a>,
    task: Task<'b>,
}

impl<const B: usize, const IB: usize> pulp::WithSimd for Kernel<'_, '_, B, IB> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) {
        // A tile of `V` vectors per pixel (the group's blocks, one or two vectors each) and
        // `P` pixels ([`pixels`]); [`conv`] has checked the lanes and the packing.
        let l = S::F32_LANES;
        if l == B && l == BLOCK {
            // A block a vector on AVX-512.
            match self.task.nb {
                4 => run_task::<S, 4, PXT, B, IB>(simd, self),
                3 => run_task::<S, 3, PXT, B, IB>(simd, self),
                2 => run_task::<S, 2, PXT, B, IB>(simd, self),
                _ => run_task::<S, 1, PXT, B, IB>(simd, self),
            }
        } else if l == B {
            // A block a vector on AVX2 (`NCHW8c`).
            match self.task.nb {
                4 => run_task::<S, 4, { pixels(NARROW, 4) }, B, IB>(simd, self),
                3 => run_task::<S, 3, { pixels(NARROW, 3) }, B, IB>(simd, self),
                2 => run_task::<S, 2, { pixels(NARROW, 2) }, B, IB>(simd, self),
                _ => run_task::<S, 1, { pixels(NARROW, 1) }, B, IB>(simd, self),
            }
        } else if l * 2 == B {
            match self.task.nb {
                2 => run_task::<S, 4, { pixels(BLOCK / 2, 4) }, B, IB>(simd, self),
                _ => run_task::<S, 2, { pixels(BLOCK / 2, 2) }, B, IB>(simd, self),
            }
        }
    }
}

/// The constant parts of one task's tiles.
struct Tile<'a> {
    /// The image as read (`[c/ib][bl]`).
    x: &'a [f32],
    bl: usize,
    offs: &'a [usize],
    /// The group's packed weights (`[c/ib][taps][ib][nb][b]`).
    wg: &'a [f32],
    c: usize,
    taps: usize,
    wv: usize,
    ow: usize,
    p: usize,
    /// The first output block of the group and the first element of the image's output.
    g0: usize,
    img: usize,
    /// The task's first output row.
    r0: usize,
    reg: RegSteps<'a>,
}

/// One task: its tiles of `P` pixels × `V` vectors (the group's `V · lanes / B` blocks), for
/// images in blocks of `IB` channels.
#[inline(always)]
fn run_task<S: pulp::Simd, const V: usize, const P: usize, const B: usize, const IB: usize>(
    simd: S,
    k: Kernel<'_, '_, B, IB>,
) {
    let Kernel { plan, task } = k;
    let Task {
        n,
        g0,
        r0,
        r1,
        nb: _,
        mut out,
        next: after,
    } = task;
    let w = plan.w;
    let (c, taps) = (w.c, w.taps);
    let blocks = w.o / B;
    let wg_at = w.group_at(n, g0);
    let (Some(wg), Some(xi)) = (
        w.data
            .get(w.off + wg_at..w.off + wg_at + V * S::F32_LANES * c * taps),
        plan.src.get(n * plan.img_len..(n + 1) * plan.img_len),
    ) else {
        return;
    };
    let t = Tile {
        x: xi,
        bl: plan.bl,
        offs: plan.offs,
        wg,
        c,
        taps,
        wv: plan.wv,
        ow: plan.ow,
        p: plan.p,
        g0,
        img: n * blocks * B * plan.p,
        r0,
        reg: plan.reg,
    };
    let out = &mut out;
    // Segments of consecutive output pixels: the task's rows, one run of them when the
    // virtual plane is the output's (no columns to drop).
    let segments: Vec<(usize, usize, usize)> = if t.wv == t.ow {
        vec![(r0 * t.wv, r0 * t.ow, (r1 - r0) * t.ow)]
    } else {
        (r0..r1).map(|r| (r * t.wv, r * t.ow, t.ow)).collect()
    };
    let cch = w.chunk_steps();
    // The weights of the chunk after each (the task's next, or after its last the first of
    // the thread's next task), prefetched toward L2 while the chunk's tiles run, each tile its
    // share of the lines spread over its steps: the weights of a large layer stream from
    // memory, and a chunk's first tile otherwise waits for them.
    let prefetch = crate::gemm_packed::Prefetch::new();
    let wrow = taps * V * S::F32_LANES;
    let ntiles: usize = segments.iter().map(|&(_, _, len)| tiles_in(len, P)).sum();
    for c0 in (0..c).step_by(cch) {
        let c1 = (c0 + cch).min(c);
        let next: &[f32] = if c1 < c {
            wg.get(c1 * wrow..(c1 + cch).min(c) * wrow)
                .unwrap_or_default()
        } else {
            w.data.get(after.clone()).unwrap_or_default()
        };
        let mut i = 0;
        let mut ahead = || {
            i += 1;
            share(prefetch, next, i - 1, ntiles)
        };
        for &(qv, px, len) in &segments {
            let rest = tail(len, P);
            let mut k = 0;
            while k + rest < len {
                let at = (qv + k, px + k);
                tile::<S, P, V, B, IB>(simd, &t, out, (c0, c1), at, ahead());
                k += P;
            }
            // The rest in one tile, or (one pixel after a full tile) in two.
            let first = if rest > P { rest.div_ceil(2) } else { rest };
            for (skip, px_) in [(0, first), (first, rest - first)] {
                let at = (qv + k + skip, px + k + skip);
                let cut = (c0, c1);
                match px_ {
                    1 => tile::<S, 1, V, B, IB>(simd, &t, out, cut, at, ahead()),
                    2 => tile::<S, 2, V, B, IB>(simd, &t, out, cut, at, ahead()),
                    3 => tile::<S, 3, V, B, IB>(simd, &t, out, cut, at, ahead()),
                    4 if P > 4 => tile::<S, 4, V, B, IB>(simd, &t, out, cut, at, ahead()),
                    5 if P > 5 => tile::<S, 5, V, B, IB>(simd, &t, out, cut, at, ahead()),
                    _ => {}
                }
            }
        }
    }
}

/// Tile `i` of `n`'s share of the lines of `next` (none past the `n`th). Out of line: with it
/// inlined into [`run_task`] (the instructions of the tile's loop unchanged), ResNet-50's 1024
/// -> 256 layers ran 1.15–1.24x slower on two threads and no slower on one, a code-layout
/// effect this host's two vCPUs show (bench/RESULTS.md, session bh); out of line they run as
/// before.
#[inline(never)]
fn share(
    prefetch: crate::gemm_packed::Prefetch,
    next: &[f32],
    i: usize,
    n: usize,
) -> crate::gemm_packed::Ahead<'_> {
    let lines = if i < n {
        crate::gemm_packed::line_share(next, i, n)
    } else {
        &[]
    };
    crate::gemm_packed::Ahead::new(prefetch, lines)
}

/// The tiles [`run_task`] cuts a segment of `len` pixels into with full tiles of `pt` (the
/// same count as `len.div_ceil(pt)`, written as the cut is).
fn tiles_in(len: usize, pt: usize) -> usize {
    let rest = tail(len, pt);
    (len - rest) / pt
        + match rest {
            0 => 0,
            r if r < pt => 1,
            _ => 2,
        }
}

/// The pixels of a segment of `len` left after its full tiles of `pt`: `len % pt`, except
/// that a lone pixel after a full tile makes the last `pt + 1`, taken as two tiles (4 and 3;
/// 2 and 2). A one-pixel tile's accumulator chains wait on the FMA latency at every step
/// (about twice the cycles per pixel of a wider tile); from two pixels on a tile is bound by
/// the FMA throughput. (ResNet-50's 7 × 7 rows of its padded 3 × 3 layers: 6 + 1 before,
/// 0.92–0.97 of the time after; session bf.)
fn tail(len: usize, pt: usize) -> usize {
    match len % pt {
        1 if len > pt => pt + 1,
        r => r,
    }
}

/// One vector from a slice of exactly its lanes.
#[inline(always)]
fn vec_of<S: pulp::Simd>(s: &[f32]) -> S::f32s {
    bytemuck::pod_read_unaligned(bytemuck::cast_slice(s))
}

/// One vector from the first values of `s` (its lanes), `None` when `s` is shorter.
#[inline(always)]
pub(crate) fn ld<S: pulp::Simd>(s: &[f32]) -> Option<S::f32s> {
    s.get(..S::F32_LANES).map(vec_of::<S>)
}

/// Stores `v` in the first values of `dst` (its lanes; nothing when it is shorter).
#[inline(always)]
pub(crate) fn st<S: pulp::Simd>(v: S::f32s, dst: Option<&mut [f32]>) {
    if let Some(d) = dst.and_then(|d| d.get_mut(..S::F32_LANES)) {
        d.copy_from_slice(bytemuck::cast_slice(std::slice::from_ref(&v)));
    }
}

/// One step (input channel, tap) of a tile: `xs` holds its `PX` pixels every `IB` values,
/// `wl` the group's `V` weight vectors.
#[inline(always)]
fn step<S: pulp::Simd, const PX: usize, const V: usize, const IB: usize>(
    simd: S,
    xs: &[f32],
    wl: &[f32],
    [a0, a1, a2, a3]: [&mut [S::f32s; PX]; VECS],
) {
    let l = S::F32_LANES;
    let zero = simd.splat_f32s(0.0);
    if l < BLOCK && V > 2 {
        // AVX2, four vectors a pixel: the pixels broadcast once, then one weight vector at a
        // time into the pixels' sums (12 sums, 3 pixels, 1 weight: the 16 registers).
        let xv: [S::f32s; PX] =
            std::array::from_fn(|j| simd.splat_f32s(xs.get(j * IB).copied().unwrap_or(0.0)));
        for (v, a) in [a0, a1, a2, a3].into_iter().enumerate().take(V) {
            let w = wl.get(v * l..(v + 1) * l).map_or(zero, vec_of::<S>);
            for j in 0..PX {
                a[j] = simd.mul_add_f32s(w, xv[j], a[j]);
            }
        }
        return;
    }
    let w0 = wl.get(..l).map_or(zero, vec_of::<S>);
    let w1 = if V > 1 {
        wl.get(l..2 * l).map_or(zero, vec_of::<S>)
    } else {
        zero
    };
    let w2 = if V > 2 {
        wl.get(2 * l..3 * l).map_or(zero, vec_of::<S>)
    } else {
        zero
    };
    let w3 = if V > 3 {
        wl.get(3 * l..4 * l).map_or(zero, vec_of::<S>)
    } else {
        zero
    };
    for j in 0..PX {
        let xv = simd.splat_f32s(xs.get(j * IB).copied().unwrap_or(0.0));
        a0[j] = simd.mul_add_f32s(w0, xv, a0[j]);
        if V > 1 {
            a1[j] = simd.mul_add_f32s(w1, xv, a1[j]);
        }
        if V > 2 {
            a2[j] = simd.mul_add_f32s(w2, xv, a2[j]);
        }
        if V > 3 {
            a3[j] = simd.mul_add_f32s(w3, xv, a3[j]);
        }
    }
}

/// The `IB` steps of one block of input channels and one tap: `xs` the tile's `PX` pixels
/// (`IB` channels each), `wt` the channels' rows of `V` weight vectors. Sixteen or eight
/// unrolled with constant offsets, or the one channel of an `NCHW` image.
#[inline(always)]
fn block_steps<S: pulp::Simd, const PX: usize, const V: usize, const IB: usize>(
    simd: S,
    xs: &[f32],
    wt: &[f32],
    [a0, a1, a2, a3]: [&mut [S::f32s; PX]; VECS],
) {
    let row = V * S::F32_LANES;
    macro_rules! steps {
        ($($l:literal)*) => {$(
            if let (Some(x), Some(w)) = (xs.get($l..), wt.get($l * row..)) {
                step::<S, PX, V, IB>(simd, x, w, [&mut *a0, &mut *a1, &mut *a2, &mut *a3]);
            }
        )*};
    }
    match IB {
        1 => {
            steps!(0);
        }
        NARROW => {
            steps!(0 1 2 3 4 5 6 7);
        }
        _ => {
            steps!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
        }
    }
}

/// Virtual pixels `q..q + PX` of the task's blocks, which are the output pixels `px..px + PX`
/// of the image's plane, over input channels `c0..c1` (all taps): the sums so far (from the
/// output, unless `c0` is 0) plus this chunk's products; on the last chunk the epilogue, then
/// one store per vector. Vector `v` of a pixel is lanes `(v % (B / lanes)) · lanes..` of the
/// group's block `v / (B / lanes)`.
#[inline(always)]
fn tile<S: pulp::Simd, const PX: usize, const V: usize, const B: usize, const IB: usize>(
    simd: S,
    t: &Tile<'_>,
    out: &mut [&mut [f32]; OBG],
    (c0, c1): (usize, usize),
    (q, px): (usize, usize),
    ahead: crate::gemm_packed::Ahead<'_>,
) {
    let l = S::F32_LANES;
    let vb = B / l;
    let zero = simd.splat_f32s(0.0);
    // Vector `v` of pixel `j` in the task's pieces: its piece and the offset there.
    let at = |v: usize, j: usize| (v / vb, (px - t.r0 * t.ow + j) * B + v % vb * l);
    let mut acc = [[zero; PX]; VECS];
    if c0 > 0 {
        for (v, accv) in acc.iter_mut().enumerate().take(V) {
            for (j, a) in accv.iter_mut().enumerate() {
                let (b, i) = at(v, j);
                let piece = out.get(b).and_then(|o| o.get(i..));
                *a = piece.and_then(ld::<S>).unwrap_or(zero);
            }
        }
    }
    let [mut a0, mut a1, mut a2, mut a3] = acc;
    let row = V * l;
    // Per block of `IB` input channels and tap: the tile's pixels, `IB` channels each, and
    // the block's weight rows; the steps unrolled with constant offsets.
    let trow = IB * row;
    let Some(wch) = t.wg.get(c0 * t.taps * row..c1 * t.taps * row) else {
        return;
    };
    let mut spread = ahead.over((c1 - c0) / IB * t.taps);
    for (cb, wb) in (c0 / IB..c1 / IB).zip(wch.chunks_exact(t.taps * trow)) {
        let base = cb * t.bl + q * IB;
        for (wt, &off) in wb.chunks_exact(trow).zip(t.offs) {
            let at = base + off;
            // In bounds by construction ([`Geom::virt`]).
            let Some(xs) = t.x.get(at..at + PX * IB) else {
                return;
            };
            let acc = [&mut a0, &mut a1, &mut a2, &mut a3];
            block_steps::<S, PX, V, IB>(simd, xs, wt, acc);
            spread.step();
        }
    }
    let last = c1 == t.c;
    for (v, mut accv) in [a0, a1, a2, a3].into_iter().enumerate().take(V) {
        let ob = t.g0 + v / vb;
        let lane0 = v % vb * l;
        if last {
            // The vector's channels on the tile's pixels, `B` apart in the output: the
            // epilogue's values loaded and its last step chosen once for them.
            let y_at = t.img + (ob * t.p + px) * B + lane0;
            t.reg.apply_pixels(simd, ob * B + lane0, y_at, B, &mut accv);
        }
        for (j, &val) in accv.iter().enumerate() {
            let (b, i) = at(v, j);
            st::<S>(val, out.get_mut(b).and_then(|o| o.get_mut(i..)));
        }
    }
}

#[cfg(test)]
#[path = "blocked_tests.rs"]
mod tests;
