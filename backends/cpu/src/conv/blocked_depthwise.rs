//! The depthwise convolution (one input and one output channel per group: MobileNet's 3×3
//! layers) of an `NCHW16c` image into an `NCHW16c` output, the weight in `OIHW` (`(C, 1, KH,
//! KW)`), with the epilogue of [`super::epilogue::RegSteps`] in registers: what ConvertLayout
//! leaves between `NCHW16c` convolutions, run in that layout instead of moved to `NCHW` and
//! back around a plane kernel (and the `add`/`clip` after it then run one by one on 5-D
//! tensors: MobileNetV2 forced into `NCHW16c` took 27–56 ms a run against 10 in `NCHW`).
//! The same for `NCHW8c` (blocks of 8 channels, where a vector is at most 8 lanes: AVX2);
//! below, 16 stands for the block.
//!
//! Contract:
//!
//! - `x` is `[n][C/16][H][W][16]`, `y` `[n][C/16][OH][OW][16]`; the weight is read as
//!   `[C][KH·KW]` and laid out per block of 16 channels as `[tap][16]` once per call (`C·KH·KW`
//!   values: 8,640 for MobileNetV2's largest).
//! - Each output vector is 16 channels of one pixel: per output element the chain of its taps
//!   in `(ky, kx)` order, one `f32` fused multiply-add each from `+0.0`, a tap over the
//!   padding adding `0 · w`; then the epilogue's steps ([`RegSteps::apply_block`]: bias or
//!   `batch_norm`, residual in the output's layout, `relu`/`clip`). The same arithmetic per
//!   element as the `NCHW` depthwise kernels and their row epilogue (the same bits: tested),
//!   whatever the vector width (16 channels are one AVX-512 vector, two AVX2 ones) and the
//!   thread count.
//! - The epilogue's values (bias or `batch_norm`) are loaded, and its last step chosen, once
//!   per tile ([`RegSteps::apply_pixels`]): with only 9 multiply-adds per output vector, the
//!   steps chosen per vector took most of the time on AVX2 (one thread, 192 channels on
//!   28×28: 157 → 121 µs; session bu).
//! - Output rows are the tasks (about four per thread). A 3×3, undilated kernel of column
//!   stride 1 or 2 (MobileNet's) runs each row in tiles of up to [`PX`] pixels that load each
//!   input pixel of a kernel row once and feed it to every tap that reads it
//!   ([`RowJob::tile3`]: 3 weights and 10 pixels for 24 FMAs at stride 1, 3 and 17 at stride
//!   2, where a load per tap took 27; on AVX2 at stride 1 each pixel goes into its sums as it
//!   is loaded, the 10 pixels, 8 sums and 3 weights being more than its 16 registers: 121 →
//!   102 µs), a pixel left or right of the image, or a kernel row above
//!   or below it, read as `+0.0`; tiles wholly inside the image check no load. Other kernels
//!   (EfficientNet's 5×5) read a copy of the block's plane with the padding zeroed in, made
//!   once per plane a task reaches (`H·W·16` values copied against `KH·KW` multiply-adds per
//!   output vector), so every pixel of a row runs in tiles of [`PX`] and one of the rest,
//!   with no check per tap. Where that copy would hold more than four times the plane's
//!   values and 64 Ki more (padding or strides far wider than the image: a user's geometry
//!   must not exhaust memory), the rows run with a check per tap instead. Before, the border
//!   pixels ran one by one with their taps checked, each a chain of 25 FMAs waiting on the
//!   FMA's latency: EfficientNet-B0's 5×5 layers, two threads, 672×14×14 0.277 → 0.154 ms
//!   and 1152×7×7 0.188 → 0.097 ms for three calls with their SiLU (bench/RESULTS.md,
//!   session cc).
//!   MobileNetV2 with `conv2d_layout = ["NCHW16c", "OIHW"]`, its depthwise layers against the
//!   `NCHW` kernels' (one thread, `bench/ab_layers.py`, 8 rounds): 960×7×7 1.03 → 0.62,
//!   576×14×14 1.00 → 0.77, 96×112×112 stride 2 0.81 → 0.60, 384×14×14 1.57 → 1.13
//!   (bench/RESULTS.md, session ba).
//!
//! ```text
//! y = R.nn.conv2d(x, w, strides=[1, 1], padding=[1, 1, 1, 1], groups=960,
//!                 data_layout="NCHW16c", kernel_layout="OIHW", out_layout="NCHW16c")
//! ; x: (1, 60, 7, 7, 16), w: (960, 1, 3, 3) -> y: (1, 60, 7, 7, 16)
//! ; 420 rows of 7 pixels: columns 1..6 one tile of 5, columns 0 and 6 checked
//! ```

use super::blocked::{BLOCK, Geom, NARROW};
use super::epilogue::{RegSteps, Step};
use crate::util::KResult;

/// Pixels per register tile (independent FMA chains, enough to hide the FMA's latency).
const PX: usize = 8;

/// Whether [`conv`] runs a depthwise convolution of `c` channels in blocks of `b` (16 or 8:
/// whole vectors of this CPU) with these epilogue steps.
pub(crate) fn takes(c: usize, b: usize, steps: &[Step]) -> bool {
    let lanes = crate::simd::f32_lanes();
    (b == BLOCK || b == NARROW)
        && lanes > 0
        && b.is_multiple_of(lanes)
        && c > 0
        && c.is_multiple_of(b)
        && RegSteps::new(steps).is_some()
}

/// `w` (`[C][taps]`) as [`conv`] reads it: per block of `b` channels, `[tap][b]`. The
/// executor packs a kept weight once ([`crate::conv::BlockedWeights`]); a weight computed at
/// run time is packed by each call.
pub(crate) fn pack(w: &[f32], c: usize, taps: usize, b: usize) -> Option<Vec<f32>> {
    if w.len() != c.checked_mul(taps)? || b == 0 || !c.is_multiple_of(b) {
        return None;
    }
    let mut out = vec![0.0f32; w.len()];
    for (ch, row) in w.chunks_exact(taps.max(1)).enumerate() {
        let (cb, l) = (ch / b, ch % b);
        for (t, &v) in row.iter().enumerate() {
            out[(cb * taps + t) * b + l] = v;
        }
    }
    Some(out)
}

/// The depthwise convolution of geometry `g` (`g.o == g.c`) of `x` into `y` with `steps` on
/// every output element (see the module doc), on up to `threads` threads; `packed` is the
/// weight `w` as [`pack`] gives it, when the caller has it.
#[allow(
    clippy::too_many_arguments,
    reason = "the weight in both forms, the operands, the threads and the epilogue"
)]
pub(crate) fn conv(
    w: &[f32],
    packed: Option<&[f32]>,
    x: &[f32],
    g: &Geom,
    y: &mut [f32],
    threads: usize,
    steps: &[Step],
) -> KResult<()> {
    let (c, [kh, kw], b) = (g.c, g.kernel(), g.block());
    let taps = kh * kw;
    if g.o != c || !c.is_multiple_of(b) {
        return Err(format!(
            "blocked depthwise convolution: expected as many output as input channels, a \
             multiple of {b}, found {c} -> {}",
            g.o
        ));
    }
    let lanes = crate::simd::f32_lanes();
    if lanes == 0 || !b.is_multiple_of(lanes) {
        return Err(format!(
            "blocked depthwise convolution: blocks of {b} channels on vectors of {lanes} lanes"
        ));
    }
    let own;
    let wp = match packed.filter(|p| Some(p.len()) == c.checked_mul(taps)) {
        Some(p) => p,
        None => {
            own = pack(w, c, taps, b).ok_or_else(|| {
                format!(
                    "blocked depthwise convolution: expected {c} × {taps} weights, found {}",
                    w.len()
                )
            })?;
            &own[..]
        }
    };
    let (plane_in, row) = (g.h * g.w * b, g.ow * b);
    if x.len() != g.n * c * g.h * g.w || y.len() != g.n * c * g.oh * g.ow {
        return Err(format!(
            "blocked depthwise convolution: expected {} inputs and {} outputs for {} images of \
             {c} channels, found {} and {}",
            g.n * c * g.h * g.w,
            g.n * c * g.oh * g.ow,
            g.n,
            x.len(),
            y.len()
        ));
    }
    let reg = RegSteps::new(steps).ok_or("blocked depthwise convolution: unsupported epilogue")?;
    if y.is_empty() {
        return Ok(());
    }
    let rows = g.n * (c / b) * g.oh;
    let t = crate::par::threads_for(rows * row * taps, 1 << 15).min(threads);
    let per = rows.div_ceil(4 * t).max(1);
    let plan = Plan {
        g,
        x,
        wp,
        reg,
        plane_in,
        row,
        fast: (g.kernel() == [3, 3] && g.dilation() == [1, 1] && g.stride()[1] <= 2)
            .then_some(g.stride()[1]),
    };
    crate::par::for_each_chunk_mut(y, per * row, t, |off, dst| {
        crate::simd::dispatch(Rows {
            plan: &plan,
            first: off / row,
            dst,
        });
    });
    Ok(())
}

/// What every row task reads.
struct Plan<'a> {
    g: &'a Geom,
    x: &'a [f32],
    wp: &'a [f32],
    reg: RegSteps<'a>,
    plane_in: usize,
    row: usize,
    /// The column stride when [`RowJob::run3`] runs the rows (3×3, undilated, column stride
    /// 1 or 2).
    fast: Option<usize>,
}

/// Output rows `first..` (of all images and blocks, in order), `dst` their outputs.
struct Rows<'a, 'p> {
    plan: &'p Plan<'a>,
    first: usize,
    dst: &'p mut [f32],
}

impl pulp::WithSimd for Rows<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) {
        // One function per block size, its strides constants.
        if self.plan.g.block() == NARROW {
            self.run::<S, NARROW>(simd);
        } else {
            self.run::<S, BLOCK>(simd);
        }
    }
}

impl Rows<'_, '_> {
    /// The rows in blocks of `B` channels.
    #[inline(always)]
    fn run<S: pulp::Simd, const B: usize>(self, simd: S) {
        let Rows {
            plan: p,
            first,
            dst,
        } = self;
        let g = p.g;
        let lanes = S::F32_LANES;
        if lanes == 0 || !B.is_multiple_of(lanes) {
            return;
        }
        let ([kh, kw], blocks) = (g.kernel(), g.c / B);
        let taps = kh * kw;
        // Other kernels than `run3`'s read a copy of the block's plane with its padding
        // zeroed in (made once per plane a task reaches), so that every pixel of a row runs
        // in tiles without a check per tap.
        let mut padded = if p.fast.is_none() {
            Padded::new(g, B)
        } else {
            None
        };
        for (i, out) in dst.chunks_exact_mut(p.row).enumerate() {
            let r = first + i;
            let (plane, oy) = (r / g.oh, r % g.oh);
            let b = plane % blocks;
            let Some(xp) = p.x.get(plane * p.plane_in..(plane + 1) * p.plane_in) else {
                return;
            };
            let Some(wb) = p.wp.get(b * taps * B..(b + 1) * taps * B) else {
                return;
            };
            let at = r * p.row;
            // Each run of `lanes` channels of the block on its own: its weights, its tiles.
            for sub in (0..B).step_by(lanes) {
                let row = RowJob::<B> {
                    g,
                    xp,
                    wb,
                    sub,
                    oy,
                    ch0: b * B + sub,
                    at,
                    reg: &p.reg,
                };
                if let Some(sw) = p.fast {
                    match sw {
                        1 => row.run3::<S, 1>(simd, out),
                        _ => row.run3::<S, 2>(simd, out),
                    }
                    continue;
                }
                let Some(pd) = padded.as_mut() else {
                    row.run_checked::<S>(simd, out);
                    continue;
                };
                let pp = pd.plane(plane, xp);
                match g.stride()[1] {
                    1 => row.run_padded::<S, 1>(simd, pp, out),
                    2 => row.run_padded::<S, 2>(simd, pp, out),
                    _ => row.run_padded::<S, 0>(simd, pp, out),
                }
            }
        }
    }
}

/// A block's image plane with its padding: `[H + 1][PW][B]`, the image's row `iy` at row
/// `iy` from column `pl` on, zeros around it, and row `H` all zeros (what a kernel row above
/// or below the image reads). `PW` covers every column a tap of the row's last output reads.
struct Padded {
    buf: Vec<f32>,
    /// The plane copied in, if any.
    plane: Option<usize>,
    /// Padded row length in `f32`s (`PW · B`), and the image row's offset in it (`pl · B`).
    row: usize,
    left: usize,
    /// The image's rows and their length in `f32`s (`W · B`).
    h: usize,
    w: usize,
}

impl Padded {
    /// The buffer for planes of geometry `g` in blocks of `b`; `None` when it would hold more
    /// than four times the plane's values and 64 Ki more (padding or strides far wider than
    /// the image: a user's geometry, whose copy could exhaust memory): the rows then run
    /// with a check per tap ([`RowJob::run_checked`]).
    fn new(g: &Geom, b: usize) -> Option<Padded> {
        let ([_, kw], [_, sw], [_, dw], [_, pl]) = (g.kernel(), g.stride(), g.dilation(), g.pad());
        let reach = (g.ow.max(1) - 1)
            .checked_mul(sw)?
            .checked_add((kw - 1).checked_mul(dw)?)?
            .checked_add(1)?;
        let pw = reach.max(pl.checked_add(g.w)?);
        let len = (g.h + 1).checked_mul(pw)?.checked_mul(b)?;
        let plane = g.h.saturating_mul(g.w).saturating_mul(b);
        if len > plane.saturating_mul(4).saturating_add(1 << 16) {
            return None;
        }
        Some(Padded {
            buf: vec![0.0; len],
            plane: None,
            row: pw * b,
            left: pl * b,
            h: g.h,
            w: g.w * b,
        })
    }

    /// The padded copy of `xp` (plane number `plane`), copied unless it is the last one.
    fn plane(&mut self, plane: usize, xp: &[f32]) -> &Padded {
        if self.plane != Some(plane) {
            for (iy, src) in xp.chunks_exact(self.w.max(1)).take(self.h).enumerate() {
                let at = iy * self.row + self.left;
                if let Some(d) = self.buf.get_mut(at..at + src.len()) {
                    d.copy_from_slice(src);
                }
            }
            self.plane = Some(plane);
        }
        self
    }

    /// Padded row `iy` of the plane (`PW · B` values); the zero row for `iy` above or below
    /// the image (an index past it, or one that wrapped below 0).
    #[inline(always)]
    fn row_at(&self, iy: usize) -> &[f32] {
        let r = iy.min(self.h);
        self.buf
            .get(r * self.row..(r + 1) * self.row)
            .unwrap_or(&[])
    }
}

/// One output row of one run of lanes, in blocks of `B` channels.
struct RowJob<'a, const B: usize> {
    g: &'a Geom,
    /// The image's plane of this block (`[H][W][B]`).
    xp: &'a [f32],
    /// The block's weights (`[tap][B]`).
    wb: &'a [f32],
    /// The run's first lane within the block.
    sub: usize,
    oy: usize,
    /// The run's first channel.
    ch0: usize,
    /// The row's first element in the output.
    at: usize,
    reg: &'a RegSteps<'a>,
}

impl<const B: usize> RowJob<'_, B> {
    /// Whether every tap row of this output row falls inside the image.
    fn rows_inside(&self) -> bool {
        let ([kh, _], [sh, _], [dh, _], [pt, _]) = (
            self.g.kernel(),
            self.g.stride(),
            self.g.dilation(),
            self.g.pad(),
        );
        let top = self.oy * sh;
        top >= pt && top + (kh - 1) * dh - pt < self.g.h
    }

    /// Row `iy` of the block's image plane (`[W][B]`), empty when `iy` is above or below
    /// the image (its taps then read `+0.0`).
    #[inline(always)]
    fn image_row(&self, iy: usize) -> &[f32] {
        let w = self.g.w * B;
        self.xp
            .get(iy.wrapping_mul(w)..)
            .and_then(|r| r.get(..w))
            .filter(|_| iy < self.g.h)
            .unwrap_or(&[])
    }

    /// The tile's sums for output pixels `q0..q0 + N` through the epilogue into `out`.
    #[inline(always)]
    fn store<S: pulp::Simd, const N: usize>(
        &self,
        simd: S,
        q0: usize,
        mut acc: [S::f32s; N],
        out: &mut [f32],
    ) {
        let lanes = S::F32_LANES;
        let first = q0 * B + self.sub;
        self.reg
            .apply_pixels(simd, self.ch0, self.at + first, B, &mut acc);
        for (j, v) in acc.iter().enumerate() {
            let i = first + j * B;
            if let Some(d) = out.get_mut(i..i + lanes) {
                d.copy_from_slice(bytemuck::cast_slice(std::slice::from_ref(v)));
            }
        }
    }

    /// The whole output row of a 3×3, undilated convolution of column stride `SW` (1 or 2)
    /// into `out`: tiles of up to [`PX`] pixels ([`RowJob::tile3`]), the last one narrower.
    #[inline(always)]
    fn run3<S: pulp::Simd, const SW: usize>(&self, simd: S, out: &mut [f32]) {
        let g = self.g;
        let (ow, pl, inside) = (g.ow, g.pad()[1], self.rows_inside());
        // A tile of `n` pixels from `q` whose taps all fall inside the image (its kernel rows
        // and its `(n − 1)·SW + 3` columns) runs without a check per load.
        let interior =
            |q: usize, n: usize| inside && q * SW >= pl && q * SW - pl + (n - 1) * SW + 3 <= g.w;
        let mut q = 0;
        while q + PX <= ow {
            if interior(q, PX) {
                self.tile3::<S, PX, SW, false>(simd, q, out);
            } else {
                self.tile3::<S, PX, SW, true>(simd, q, out);
            }
            q += PX;
        }
        // The rest of the row (under `PX` pixels), checked.
        match ow - q {
            0 => {}
            1 => self.tile3::<S, 1, SW, true>(simd, q, out),
            2 => self.tile3::<S, 2, SW, true>(simd, q, out),
            3 => self.tile3::<S, 3, SW, true>(simd, q, out),
            4 => self.tile3::<S, 4, SW, true>(simd, q, out),
            5 => self.tile3::<S, 5, SW, true>(simd, q, out),
            6 => self.tile3::<S, 6, SW, true>(simd, q, out),
            _ => self.tile3::<S, 7, SW, true>(simd, q, out),
        }
    }

    /// Output pixels `q0..q0 + N` of a 3×3, undilated convolution of column stride `SW`:
    /// per kernel row, the `(N − 1)·SW + 3` input pixels the tile's taps read are loaded once
    /// (a pixel left or right of the image, or a row above or below it, is `+0.0`) and each
    /// feeds the taps that read it, in `(ky, kx)` order per output, one FMA each from `+0.0`:
    /// the chains of [`RowJob::tile`], with 3 + (N − 1)·SW + 3 loads per kernel row instead
    /// of 3·(N + 1).
    #[inline(always)]
    fn tile3<S: pulp::Simd, const N: usize, const SW: usize, const CHECK: bool>(
        &self,
        simd: S,
        q0: usize,
        out: &mut [f32],
    ) {
        let g = self.g;
        let ([sh, _], [pt, pl]) = (g.stride(), g.pad());
        let zero = simd.splat_f32s(0.0);
        let mut acc = [zero; N];
        // The tile's first input column (may be left of the image: then `wrapping`).
        let c0 = (q0 * SW).wrapping_sub(pl);
        for ky in 0..3 {
            let xr = self.image_row((self.oy * sh + ky).wrapping_sub(pt));
            let wv = [0, 1, 2].map(|kx| load::<S>(self.wb, (ky * 3 + kx) * B + self.sub, zero));
            // Without `CHECK`, the window of the tile's pixels, its bounds checked once.
            let cols = (N - 1) * SW + 3;
            let start = c0.wrapping_mul(B).wrapping_add(self.sub);
            let win = if CHECK {
                &[][..]
            } else {
                xr.get(start..)
                    .and_then(|r| r.get(..(cols - 1) * B + S::F32_LANES))
                    .unwrap_or(&[])
            };
            // Input pixel `c0 + i`, `+0.0` outside the row (`load` of an empty row, or a
            // column past either edge).
            let px = |i: usize| -> S::f32s {
                if !CHECK {
                    return load::<S>(win, i * B, zero);
                }
                let c = c0.wrapping_add(i);
                if c < g.w {
                    load::<S>(xr, c * B + self.sub, zero)
                } else {
                    zero
                }
            };
            if S::F32_LANES < BLOCK && SW == 1 {
                // AVX2 (16 registers: the held pixels and the sums would not fit): each
                // pixel as it is loaded into the sums of the outputs whose taps read it.
                // Output `j` gets tap `kx` from pixel `j + kx`, so its taps still come in
                // `kx` order. (One thread, 192 channels on 28×28: 121 → 102 µs; at stride 2
                // the form below was faster, 52 against 72.)
                for i in 0..cols {
                    let v = px(i);
                    for (kx, &w) in wv.iter().enumerate() {
                        let Some(d) = i.checked_sub(kx) else { continue };
                        if let Some(a) = acc.get_mut(d) {
                            *a = simd.mul_add_f32s(v, w, *a);
                        }
                    }
                }
            } else if SW == 1 {
                // The tile's N + 2 pixels, held: tap `kx` of output `j` reads pixel `j + kx`.
                let mut pix = [zero; PX + 2];
                for (i, v) in pix.iter_mut().enumerate().take(N + 2) {
                    *v = px(i);
                }
                for (kx, &w) in wv.iter().enumerate() {
                    for (j, a) in acc.iter_mut().enumerate() {
                        *a = simd.mul_add_f32s(pix[j + kx], w, *a);
                    }
                }
            } else {
                // Stride 2: tap 0 of output `j` reads pixel `2j`, tap 1 `2j + 1`, tap 2
                // `2j + 2` (tap 0 of the next output).
                // The odd pixels are read once each, straight into their FMA (held in
                // registers, they spilled).
                let even: [S::f32s; N] = std::array::from_fn(|j| px(2 * j));
                let last = px(2 * N);
                for (a, &v) in acc.iter_mut().zip(&even) {
                    *a = simd.mul_add_f32s(v, wv[0], *a);
                }
                for (j, a) in acc.iter_mut().enumerate() {
                    *a = simd.mul_add_f32s(px(2 * j + 1), wv[1], *a);
                }
                for (j, a) in acc.iter_mut().enumerate() {
                    let v = if j + 1 < N { even[j + 1] } else { last };
                    *a = simd.mul_add_f32s(v, wv[2], *a);
                }
            }
        }
        self.store(simd, q0, acc, out);
    }

    /// The whole output row into `out` with a bounds check per tap (a tap outside the image
    /// reads `+0.0`): tiles of [`PX`] pixels, then one of the rest; for geometries whose
    /// padded plane [`Padded::new`] declines.
    #[inline(always)]
    fn run_checked<S: pulp::Simd>(&self, simd: S, out: &mut [f32]) {
        let ow = self.g.ow;
        let mut q = 0;
        while q + PX <= ow {
            self.tile_checked::<S, PX>(simd, q, out);
            q += PX;
        }
        for q in q..ow {
            self.tile_checked::<S, 1>(simd, q, out);
        }
    }

    /// Output pixels `q0..q0 + N` of the row into `out`: the taps in `(ky, kx)` order, one
    /// FMA each from `+0.0`, a tap outside the image reading `+0.0`; then the epilogue.
    #[inline(always)]
    fn tile_checked<S: pulp::Simd, const N: usize>(&self, simd: S, q0: usize, out: &mut [f32]) {
        let g = self.g;
        let ([kh, kw], [sh, sw], [dh, dw], [pt, pl]) =
            (g.kernel(), g.stride(), g.dilation(), g.pad());
        let zero = simd.splat_f32s(0.0);
        let mut acc = [zero; N];
        for ky in 0..kh {
            let xr = self.image_row((self.oy * sh + ky * dh).wrapping_sub(pt));
            for kx in 0..kw {
                let wv = load::<S>(self.wb, (ky * kw + kx) * B + self.sub, zero);
                for (j, a) in acc.iter_mut().enumerate() {
                    let ix = ((q0 + j) * sw + kx * dw).wrapping_sub(pl);
                    let v = if ix < g.w {
                        load::<S>(xr, ix * B + self.sub, zero)
                    } else {
                        zero
                    };
                    *a = simd.mul_add_f32s(v, wv, *a);
                }
            }
        }
        self.store(simd, q0, acc, out);
    }

    /// The whole output row into `out` from the padded plane `pp` ([`Padded`]): tiles of
    /// [`PX`] pixels, then one of the rest (every tile's chains independent: a row of 7
    /// pixels is one tile of 7, not 4, 2 and 1, whose chains of 25 taps would each wait on
    /// the FMA's latency). `SW` is the column stride when it is 1 or 2 (then every load's
    /// offset in a tile is a constant), 0 for another.
    #[inline(always)]
    fn run_padded<S: pulp::Simd, const SW: usize>(&self, simd: S, pp: &Padded, out: &mut [f32]) {
        let ow = self.g.ow;
        let mut q = 0;
        while q + PX <= ow {
            self.tile_padded::<S, PX, SW>(simd, pp, q, out);
            q += PX;
        }
        match ow - q {
            0 => {}
            1 => self.tile_padded::<S, 1, SW>(simd, pp, q, out),
            2 => self.tile_padded::<S, 2, SW>(simd, pp, q, out),
            3 => self.tile_padded::<S, 3, SW>(simd, pp, q, out),
            4 => self.tile_padded::<S, 4, SW>(simd, pp, q, out),
            5 => self.tile_padded::<S, 5, SW>(simd, pp, q, out),
            6 => self.tile_padded::<S, 6, SW>(simd, pp, q, out),
            _ => self.tile_padded::<S, 7, SW>(simd, pp, q, out),
        }
    }

    /// Output pixels `q0..q0 + N` of the row into `out` (the row's outputs): the taps in
    /// `(ky, kx)` order, one FMA each from `+0.0`, then the epilogue. A tap over the padding
    /// reads the padded plane's `+0.0` (or its zero row, for a kernel row above or below the
    /// image): `0 · w`, as the definition has it.
    #[inline(always)]
    fn tile_padded<S: pulp::Simd, const N: usize, const SW: usize>(
        &self,
        simd: S,
        pp: &Padded,
        q0: usize,
        out: &mut [f32],
    ) {
        let g = self.g;
        let lanes = S::F32_LANES;
        let ([kh, kw], [sh, sw], [dh, dw], [pt, _]) =
            (g.kernel(), g.stride(), g.dilation(), g.pad());
        let sw = if SW > 0 { SW } else { sw };
        let zero = simd.splat_f32s(0.0);
        let mut acc = [zero; N];
        let step = sw * B;
        let len = (N - 1) * step + lanes;
        for ky in 0..kh {
            let xr = pp.row_at((self.oy * sh + ky * dh).wrapping_sub(pt));
            for kx in 0..kw {
                let wv = load::<S>(self.wb, (ky * kw + kx) * B + self.sub, zero);
                let base = (q0 * sw + kx * dw) * B + self.sub;
                // Inside the padded row by its width ([`Padded::new`]): checked once here.
                let win = xr.get(base..base + len).unwrap_or(&[]);
                for (j, a) in acc.iter_mut().enumerate() {
                    let v = load::<S>(win, j * step, zero);
                    *a = simd.mul_add_f32s(v, wv, *a);
                }
            }
        }
        self.store(simd, q0, acc, out);
    }
}

/// The vector at `s[i..]`, `zero` where `s` is too short (a tap row outside the image).
/// A function rather than a closure: a closure is compiled apart from the caller's target
/// features when it is not inlined.
#[inline(always)]
fn load<S: pulp::Simd>(s: &[f32], i: usize, zero: S::f32s) -> S::f32s {
    s.get(i..i.wrapping_add(S::F32_LANES)).map_or(zero, |q| {
        bytemuck::pod_read_unaligned(bytemuck::cast_slice(q))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::util::test_values as rand;

    /// The definition: `y[n][c][oy][ox] = Σ_{ky, kx} x[n][c][iy][ix] · w[c][ky][kx]` in
    /// `(ky, kx)` order from `+0.0`, padding as `0`, on `NCHW` data; then to `g`'s block
    /// (`NCHW16c`, `NCHW8c`).
    fn reference(x: &[f32], w: &[f32], g: &Geom) -> Vec<f32> {
        let ([kh, kw], [sh, sw], [dh, dw], [pt, pl]) =
            (g.kernel(), g.stride(), g.dilation(), g.pad());
        let bs = g.block();
        let mut y = vec![0.0f32; g.n * g.c * g.oh * g.ow];
        for n in 0..g.n {
            for c in 0..g.c {
                for oy in 0..g.oh {
                    for ox in 0..g.ow {
                        let mut acc = 0.0f32;
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (oy * sh + ky * dh) as isize - pt as isize;
                                let ix = (ox * sw + kx * dw) as isize - pl as isize;
                                let inside = (0..g.h as isize).contains(&iy)
                                    && (0..g.w as isize).contains(&ix);
                                let v = if inside {
                                    // x in blocks of `bs`.
                                    let (b, l) = (c / bs, c % bs);
                                    x[(((n * (g.c / bs) + b) * g.h + iy as usize) * g.w
                                        + ix as usize)
                                        * bs
                                        + l]
                                } else {
                                    0.0
                                };
                                acc = v.mul_add(w[c * kh * kw + ky * kw + kx], acc);
                            }
                        }
                        let (b, l) = (c / bs, c % bs);
                        y[(((n * (g.c / bs) + b) * g.oh + oy) * g.ow + ox) * bs + l] = acc;
                    }
                }
            }
        }
        y
    }

    /// (n, c, h, w, kernel, stride, dilation, padding)
    type Case = (
        usize,
        usize,
        usize,
        usize,
        [usize; 2],
        [i64; 2],
        [i64; 2],
        [i64; 4],
    );

    /// The blocks the kernel runs on this CPU: 16, and 8 where a vector is at most 8 lanes.
    fn blocks() -> Vec<usize> {
        [BLOCK, NARROW]
            .into_iter()
            .filter(|&b| takes(b, b, &[]))
            .collect()
    }

    #[test]
    fn every_geometry_matches_the_definition_bit_for_bit() {
        let cases: &[Case] = &[
            (1, 32, 7, 7, [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
            (2, 16, 14, 13, [3, 3], [2, 2], [1, 1], [1, 1, 1, 1]),
            (1, 48, 20, 23, [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
            (1, 16, 9, 30, [5, 5], [1, 2], [1, 1], [2, 2, 2, 2]),
            (1, 16, 11, 11, [3, 3], [1, 1], [2, 2], [2, 2, 2, 2]),
            (1, 32, 6, 5, [3, 3], [2, 2], [1, 1], [0, 1, 1, 0]),
            (1, 16, 4, 4, [1, 1], [1, 1], [1, 1], [0, 0, 0, 0]),
            (1, 16, 3, 3, [5, 5], [1, 1], [1, 1], [2, 2, 2, 2]),
            // 3×3 undilated, column stride 1 or 2 (`RowJob::run3`): rows of whole tiles,
            // of none, of a tile and a rest; no padding; strides (2, 1) and (1, 2).
            (1, 32, 28, 28, [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
            (1, 16, 14, 14, [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
            (1, 16, 33, 40, [3, 3], [2, 2], [1, 1], [1, 1, 1, 1]),
            (1, 16, 10, 19, [3, 3], [1, 1], [1, 1], [0, 0, 0, 0]),
            (1, 16, 9, 12, [3, 3], [2, 1], [1, 1], [1, 0, 1, 2]),
            (2, 16, 12, 35, [3, 3], [1, 2], [1, 1], [2, 1, 0, 2]),
            // Other kernels, on the padded plane (`RowJob::run_padded`): EfficientNet's 5×5
            // on 14×14 and 7×7 (rows of a tile and a rest, of a rest alone), stride 2 with
            // padding (1, 2) (onnx's SAME_UPPER), 7×7 on 7×7, a column stride of 3, planes
            // narrower than the kernel.
            (1, 32, 14, 14, [5, 5], [1, 1], [1, 1], [2, 2, 2, 2]),
            (1, 16, 7, 7, [5, 5], [1, 1], [1, 1], [2, 2, 2, 2]),
            (1, 16, 28, 28, [5, 5], [2, 2], [1, 1], [1, 1, 2, 2]),
            (2, 16, 7, 7, [7, 7], [1, 1], [1, 1], [3, 3, 3, 3]),
            (1, 16, 12, 17, [3, 3], [3, 3], [1, 1], [1, 1, 1, 1]),
            (1, 16, 2, 3, [5, 5], [1, 1], [1, 1], [2, 2, 2, 2]),
            (1, 16, 9, 9, [5, 3], [2, 1], [2, 1], [4, 1, 0, 3]),
            // Padding and strides far wider than the image: no padded copy
            // (`RowJob::run_checked`).
            (1, 16, 2, 2, [3, 3], [25, 25], [1, 1], [700, 700, 700, 700]),
            // Channels in blocks of 8 only (MobileNetV2's 24, stride 1 and 2).
            (1, 24, 14, 14, [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
            (1, 40, 15, 9, [3, 3], [2, 2], [1, 1], [1, 1, 1, 1]),
            (1, 8, 6, 7, [5, 5], [1, 1], [1, 1], [2, 2, 2, 2]),
        ];
        let bs = blocks();
        assert!(!bs.is_empty() || crate::simd::f32_lanes() > BLOCK);
        let runs = bs.iter().flat_map(|&b| {
            let fits = cases.iter().enumerate().filter(move |(_, c)| c.1 % b == 0);
            fits.map(move |(i, c)| (b, i, c))
        });
        for (b, case, &(n, c, h, w, k, s, d, p)) in runs {
            let g = Geom::new([n, c, h, w], c, k, s, d, p)
                .expect("geometry")
                .with_block(b);
            let x = rand(n * c * h * w, case as u64 + 1);
            let wt = rand(c * k[0] * k[1], case as u64 + 100);
            let want = reference(&x, &wt, &g);
            // Packed by the call, and packed before (as the executor keeps a weight).
            let packed = pack(&wt, c, k[0] * k[1], b).expect("packs");
            for (threads, pre) in [(1, None), (2, None), (3, None), (2, Some(&packed[..]))] {
                let mut y = vec![f32::NAN; want.len()];
                conv(&wt, pre, &x, &g, &mut y, threads, &[]).expect("runs");
                let same = y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "case {case}, blocks of {b}, {threads} threads, packed before: {}",
                    pre.is_some()
                );
            }
        }
    }

    #[test]
    fn a_padded_copy_is_made_only_where_it_stays_near_the_plane_size() {
        let geom = |h, w, s, p| {
            Geom::new([1, 16, h, w], 16, [5, 5], [s, s], [1, 1], [p, p, p, p]).expect("geometry")
        };
        // EfficientNet's 5×5 on 14×14: 15 rows (one of zeros) of 18 columns.
        let pd = Padded::new(&geom(14, 14, 1, 2), 16).expect("a padded copy");
        assert_eq!(
            (pd.buf.len(), pd.row, pd.left),
            (15 * 18 * 16, 18 * 16, 2 * 16)
        );
        // 700 columns of padding around a 2×2 image, stride 25: the copy would be 66,240
        // values against the image's 64.
        assert!(Padded::new(&geom(2, 2, 25, 700), 16).is_none());
    }

    #[test]
    fn padding_taps_add_zero_times_the_weight_so_nan_and_infinite_weights_show() {
        // A tap over the padding adds `0 · w`: NaN for an infinite or NaN weight, as the
        // definition (and the `NCHW` kernels) give, on the edge pixels only.
        // 3×3 (`RowJob::run3`) and 5×5 (the padded plane).
        let cases = [(7, 7, 1, 3), (14, 14, 1, 3), (30, 30, 1, 3), (28, 28, 2, 3)];
        let cases = cases
            .into_iter()
            .chain([(14, 14, 1, 5), (7, 7, 1, 5), (28, 28, 2, 5)]);
        for (case, (h, w, s, k)) in cases.enumerate() {
            let p = (k / 2) as i64;
            let g = Geom::new([1, 16, h, w], 16, [k, k], [s, s], [1, 1], [p, p, p, p])
                .expect("geometry");
            let taps = k * k;
            let x = rand(16 * h * w, case as u64 + 31);
            let mut wt = rand(16 * taps, case as u64 + 32);
            wt[0] = f32::INFINITY; // channel 0, tap (0, 0)
            wt[taps + taps - 1] = f32::NAN; // channel 1, the last tap
            wt[2 * taps + k + k - 1] = f32::NEG_INFINITY; // channel 2, tap (1, k - 1)
            let want = reference(&x, &wt, &g);
            assert!(want.iter().any(|v| v.is_nan()) && want.iter().any(|v| v.is_finite()));
            let mut y = vec![0.0f32; want.len()];
            conv(&wt, None, &x, &g, &mut y, 2, &[]).expect("runs");
            for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "case {case}, element {i}");
            }
        }
    }

    #[test]
    fn the_epilogue_runs_per_channel_and_a_bad_shape_is_an_error() {
        for bs in blocks() {
            epilogue_in_blocks_of(bs);
        }
    }

    fn epilogue_in_blocks_of(bs: usize) {
        let g = Geom::new([1, 32, 8, 8], 32, [3, 3], [1, 1], [1, 1], [1, 1, 1, 1])
            .expect("g")
            .with_block(bs);
        let x = rand(32 * 64, 7);
        let wt = rand(32 * 9, 8);
        let b = rand(32, 9);
        let plain = reference(&x, &wt, &g);
        let steps = [
            Step::Bias {
                b: b.clone(),
                bias_first: false,
            },
            Step::Clip { lo: 0.0, hi: 0.25 },
        ];
        let mut y = vec![0.0; plain.len()];
        conv(&wt, None, &x, &g, &mut y, 2, &steps).expect("runs");
        for (i, (&got, &v)) in y.iter().zip(&plain).enumerate() {
            let ch = (i / (64 * bs)) * bs + i % bs;
            let want = (v + b[ch]).clamp(0.0, 0.25);
            assert_eq!(got.to_bits(), want.to_bits(), "element {i}");
        }
        // A bias then SiLU, in registers: per element the scalar SiLU's bits.
        let steps_silu = [
            Step::Bias {
                b: b.clone(),
                bias_first: false,
            },
            Step::Silu,
        ];
        let mut y_silu = vec![0.0; plain.len()];
        conv(&wt, None, &x, &g, &mut y_silu, 2, &steps_silu).expect("runs");
        for (i, (&got, &v)) in y_silu.iter().zip(&plain).enumerate() {
            let ch = (i / (64 * bs)) * bs + i % bs;
            let want = crate::elementwise::silu32(v + b[ch]);
            assert_eq!(got.to_bits(), want.to_bits(), "element {i}");
        }
        // `batch_norm` as an affine step, a residual in the output's layout (each pixel of a
        // tile its own), then `relu`: per element the scalar steps.
        let (k, r) = (rand(32, 10), rand(plain.len(), 11));
        let residual =
            fusebox_core::runtime::Tensor::from_f32(vec![1, 32 / bs, 8, 8, bs], r.clone())
                .expect("tensor");
        let steps2 = [
            Step::Affine {
                mul: k.clone(),
                add: b.clone(),
            },
            Step::Residual {
                r: residual,
                prev_first: false,
            },
            Step::Relu,
        ];
        for threads in [1, 2] {
            let mut y2 = vec![0.0; plain.len()];
            conv(&wt, None, &x, &g, &mut y2, threads, &steps2).expect("runs");
            for (i, (&got, &v)) in y2.iter().zip(&plain).enumerate() {
                let ch = (i / (64 * bs)) * bs + i % bs;
                let s = r[i] + v.mul_add(k[ch], b[ch]);
                let want = if s > 0.0 || s.is_nan() { s } else { 0.0 };
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "element {i}, {threads} threads"
                );
            }
        }
        // A weight of the wrong length, channels that do not block, a program epilogue.
        assert!(conv(&wt[1..], None, &x, &g, &mut y, 1, &[]).is_err());
        // A packed weight of another length is not used: the weight itself is packed.
        let mut z = vec![0.0; plain.len()];
        conv(&wt, Some(&b[..]), &x, &g, &mut z, 1, &steps).expect("runs");
        assert_eq!(z, y);
        let g24 = Geom::new([1, 24, 8, 8], 24, [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]).expect("g");
        // 24 channels are not blocks of 16 (they are of 8).
        assert!(
            conv(
                &wt[..24 * 9],
                None,
                &x[..24 * 64],
                &g24,
                &mut y[..24 * 64],
                1,
                &[]
            )
            .is_err()
        );
        assert!(!takes(24, BLOCK, &[]) && !takes(24, 4, &[]));
        assert!(takes(32, bs, &steps));
        assert_eq!(takes(24, NARROW, &[]), blocks().contains(&NARROW));
    }
}
