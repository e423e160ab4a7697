//! The column kernel: [`super`]'s GEMM chains for a convolution, with the output channels on
//! the vector lanes. Where [`super::gemm`] reads `A` by rows and writes `C` row by row, this
//! kernel reads pixels through a [`ColsSrc`] and writes `NCHW` rows (channel by channel).
//!
//! Contract:
//!
//! - [`gemm_cols`] is [`super::gemm`]'s chains for a convolution on a small plane, `y = bᵀ · x`
//!   (`b` the transposed weight) with the output (`channels × pixels`, `NCHW`) written
//!   transposed from the micro-kernel's registers: `x` is read where it lies ([`ColsSrc`]: the
//!   im2col matrix, a 1×1 layer's data, or a stride-1 layer's zero-padded image through each
//!   tap's offset), 7 or 8 pixels of one output row per block, the panel's 48 channels on the
//!   lanes (see [`crate::conv`]). A panel is read whole once per block: the first block finds
//!   it in L2 because the blocks of the panel before it prefetched it there (`prefetcht1`, a
//!   share of its lines per block, spread over the block's steps; after a task's last panel,
//!   the panel after it, which the task after it starts with). Weights read from L3 or memory
//!   had left each panel's first block waiting: two threads, medians of alternated rounds,
//!   MobileNetV2 4.56 → 4.46–4.54 ms (three runs of 8–10 rounds), light ResNet-50 38.35 →
//!   37.65 ms (6 rounds, faster in all 6).
//!
//! ```text
//! y: R.Tensor((1, 512, 7, 7), dtype="float32") = R.nn.conv2d(x, w, strides=[2, 2],
//!     padding=[1, 1, 1, 1])   # x: (1, 512, 14, 14), w: a constant (512, 512, 3, 3)
//! ; w transposed and packed once: 4608 steps × (10 panels of 48 channels + one of 32)
//! ; x dealt into its four stride phases, read in place: step (c, ky, kx) at one offset
//! ; y (512 × 49) = 7 blocks of 7 pixels × 11 panels, each block's 7 × 48 sums in registers
//! ; over all 4608 steps, then written back transposed into the 512 rows of 49 pixels
//! ```

use super::{Ahead, NR, PackedB, Prefetch, TILE_MACS, line_share};
use crate::matmul::Epilogue;
use crate::util::KResult;

/// Where [`gemm_cols`] reads its right operand `x` (`k × m`: step `p` of `k`, pixel `i`):
/// `data[steps[p] + (i / row) · pitch + i % row]`. The im2col matrix of a convolution, or the
/// data of a 1×1 one, is `steps[p] = p · m` with `row = pitch = m`; a stride-1 convolution
/// reads its zero-padded input in place with `steps[p]` the tap's offset in it, `row` the
/// output's width and `pitch` the padded width (no im2col matrix: on a 7×7 plane, building one
/// cost a quarter of a 3×3 layer's time, in copies of 5–7 values).
#[derive(Clone, Copy)]
pub(crate) struct ColsSrc<'a> {
    pub(crate) data: &'a [f32],
    pub(crate) steps: &'a [usize],
    pub(crate) row: usize,
    pub(crate) pitch: usize,
}

impl ColsSrc<'_> {
    /// Where pixel `i`'s values start, past a step's offset.
    pub(super) fn base(&self, i: usize) -> usize {
        (i / self.row) * self.pitch + i % self.row
    }

    /// Whether every value of pixels `0..m` at every step lies inside `data` (runs of `row`
    /// no wider than their `pitch`, so `base` grows with the pixel and the last is the
    /// farthest).
    pub(super) fn reads_inside(&self, m: usize) -> bool {
        self.row > 0
            && self.pitch >= self.row
            && (m == 0
                || self
                    .steps
                    .iter()
                    .max()
                    .is_none_or(|&s| s.saturating_add(self.base(m - 1)) < self.data.len()))
    }
}

/// `y = bᵀ · x`, `x` (`k × m`) read through `src` ([`ColsSrc`]) and `b` (`k × n`, packed by
/// [`PackedB::for_cols`]: a convolution's transposed weight), into `y` (`n × m`, row-major:
/// output channel by output channel, as `NCHW`). Element `y[j][i]` is the chain of [`gemm`]'s
/// element `[i][j]` for `a = xᵀ`: one FMA per step of `k` in order from `+0.0`, so the bits
/// do not depend on the tiling, the thread count or the instruction set. The output channels
/// lie on the vector lanes (a 7×7 plane's 49 pixels waste no lane, where `faer`'s kernel ran
/// them on four 16-lane vectors); blocks of [`cols_rows`] pixels of one output row are
/// computed over all of `k` with a panel's 48 channels in registers (only the live vectors of
/// a last, narrower panel), then written back transposed. Tasks are runs of equal work over
/// (panel, block) pairs ([`cols_shares`]); `pre(j0, block)` runs on each finished block of
/// sums before it is written back (`block[r][c]`: pixel `r` of the block, column `j0 + c`;
/// the per-channel steps of a fused convolution, while the block is in registers' reach),
/// and `epilogue(j, i0, part)` on each finished part of a row of `y` (pixels `i0..`).
pub(crate) fn gemm_cols(
    m: usize,
    src: ColsSrc<'_>,
    b: &PackedB,
    y: &mut [f32],
    threads: usize,
    pre: Option<ColsPre<'_>>,
    epilogue: Option<Epilogue<'_>>,
) -> KResult<()> {
    let (k, n) = (b.k, b.n);
    if b.nr != NR {
        return Err(format!(
            "gemm: the column kernel reads panels of {NR} columns, these have {}",
            b.nr
        ));
    }
    if src.steps.len() != k || y.len() != n * m {
        return Err(format!(
            "gemm: ({k}x{n})ᵀ @ {k}x{m} needs {k} steps and {} outputs, found {} and {}",
            n * m,
            src.steps.len(),
            y.len()
        ));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let mr = cols_rows(m);
    // Blocks within one output row (`row` a multiple of the block, or all pixels one row),
    // and every value read inside `data` (`base` grows with the pixel where `pitch ≥ row`).
    let fits = src.reads_inside(m) && (src.row.is_multiple_of(mr) || src.row == m);
    if !fits {
        return Err(format!(
            "gemm: {m} pixels in rows of {} (pitch {}) over {} values do not fit blocks of {mr}",
            src.row,
            src.pitch,
            src.data.len()
        ));
    }
    let tasks = cols_shares(m, mr, k, n, y, threads);
    let threads = threads.min(tasks.len()).max(1);
    crate::par::run_tasks(tasks, threads, |mut shares| {
        crate::par::with_scratch(&TAIL, |tail| {
            crate::simd::dispatch(Cols {
                src,
                m,
                b,
                shares: &mut shares,
                tail,
                pre,
            })
        })?;
        if let Some(ep) = epilogue {
            for sh in &mut shares {
                for (c, row) in sh.rows.iter_mut().enumerate() {
                    ep(sh.panel * NR + c, sh.b0 * mr, row);
                }
            }
        }
        Ok(())
    })
}

/// About this many multiply-adds per task of [`gemm_cols`] (or one panel's, when more): a
/// quarter of [`TILE_MACS`], so that ResNet-50's 2048-channel 7×7 layers make tasks of about
/// one panel rather than four, which two threads split unevenly (those layers 2.03–2.15 →
/// 1.87–1.97 ms for three calls, 2 threads, two alternated runs each).
const COLS_TILE_MACS: usize = TILE_MACS / 4;

/// The lanes [`cols_shares`] weighs work by: a panel's columns run as vectors of 16 (AVX-512,
/// where [`gemm_cols`] runs in practice), so a last panel of 16 columns costs a third of a
/// full one.
const COLS_COST_LANES: usize = 16;

/// One task's part of one panel for [`gemm_cols`]: pixel blocks `b0..b1` of panel `panel`, and
/// the part of `y` they give, one slice per channel of the panel (pixels `b0 · MR` onwards).
struct Share<'a> {
    panel: usize,
    b0: usize,
    b1: usize,
    rows: Vec<&'a mut [f32]>,
}

/// [`gemm_cols`]'s tasks: every (panel, pixel block) in panel order, cut into a multiple of
/// `threads` runs of equal work (a block weighs its panel's live vectors of
/// [`COLS_COST_LANES`]), each run about [`COLS_TILE_MACS`] multiply-adds or one panel's,
/// whichever is more. A run may start or end inside a panel: its blocks are split between two
/// tasks, whose rows of `y` are then cut at the block boundary. Where the panels do not
/// divide among the threads (MobileNetV2's 960 → 320 on 7×7: 7 panels, 4 against 3 on two
/// threads), the last ones are shared by pixels; a last panel of one or two vectors weighs
/// that much (960 → 160: 3 panels and a third). Every element is still computed whole by one
/// kernel call, so the bits do not depend on the cut.
fn cols_shares(
    m: usize,
    mr: usize,
    k: usize,
    n: usize,
    y: &mut [f32],
    threads: usize,
) -> Vec<Vec<Share<'_>>> {
    let panels = n.div_ceil(NR);
    let blocks = m.div_ceil(mr);
    let live = |p: usize| (n - p * NR).min(NR).div_ceil(COLS_COST_LANES);
    let total: usize = (0..panels).map(|p| live(p) * blocks).sum();
    let unit_macs = mr * k.max(1) * COLS_COST_LANES;
    let panel_macs = blocks * unit_macs * NR.div_ceil(COLS_COST_LANES);
    let threads = threads.max(1);
    let tasks = (total * unit_macs)
        .div_ceil(COLS_TILE_MACS.max(panel_macs))
        .next_multiple_of(threads)
        .clamp(1, (panels * blocks).max(1));
    let mut out: Vec<Vec<Share<'_>>> = (0..tasks).map(|_| Vec::new()).collect();
    let mut rest = y;
    let mut done = 0usize;
    for p in 0..panels {
        let cols = (n - p * NR).min(NR);
        let (panel_y, tail) = std::mem::take(&mut rest).split_at_mut(cols * m);
        rest = tail;
        // The task of each block: the equal run its middle falls in.
        let w = live(p);
        let mut cuts: Vec<(usize, usize, usize)> = Vec::new();
        for blk in 0..blocks {
            let t = ((2 * done + w) * tasks / (2 * total).max(1)).min(tasks - 1);
            done += w;
            match cuts.last_mut() {
                Some((last, _, b1)) if *last == t => *b1 = blk + 1,
                _ => cuts.push((t, blk, blk + 1)),
            }
        }
        let mut rows: Vec<Vec<&mut [f32]>> =
            cuts.iter().map(|_| Vec::with_capacity(cols)).collect();
        for row in panel_y.chunks_exact_mut(m) {
            let mut row = row;
            for (&(_, b0, b1), dst) in cuts.iter().zip(&mut rows) {
                let len = (b1 * mr).min(m) - b0 * mr;
                let (seg, after) = std::mem::take(&mut row).split_at_mut(len);
                row = after;
                dst.push(seg);
            }
        }
        for ((t, b0, b1), rows) in cuts.into_iter().zip(rows) {
            out[t].push(Share {
                panel: p,
                b0,
                b1,
                rows,
            });
        }
    }
    out.retain(|t| !t.is_empty());
    out
}

/// The pixels per block of [`gemm_cols`] for `m` pixels: 7 where that divides them
/// (MobileNet's and ResNet's 7×7, 14×14 and 28×28 planes), else 8.
pub(crate) fn cols_rows(m: usize) -> usize {
    if m.is_multiple_of(7) { 7 } else { 8 }
}

thread_local! {
    /// [`gemm_cols`]'s copy of the last, partial pixel block (`k × MR`, zero-padded).
    static TAIL: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One task of [`gemm_cols`]: its [`Share`]s of `b`'s panels, into their rows of `y`.
struct Cols<'a, 'y> {
    src: ColsSrc<'a>,
    m: usize,
    b: &'a PackedB,
    shares: &'a mut [Share<'y>],
    tail: &'a mut Vec<f32>,
    pre: Option<ColsPre<'a>>,
}

/// What [`gemm_cols`] runs on each block of sums before writing it back: `pre(j0, cols,
/// block)`, `block[r][c]` the sum of pixel `r` and column `j0 + c` for `c < cols`.
pub(crate) type ColsPre<'p> = &'p (dyn Fn(usize, usize, &mut [[f32; NR]]) + Sync);

impl pulp::WithSimd for Cols<'_, '_> {
    type Output = KResult<()>;
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) -> KResult<()> {
        match cols_rows(self.m) {
            7 => cols_task::<S, 7>(simd, self),
            _ => cols_task::<S, 8>(simd, self),
        }
    }
}

/// [`Cols`] with blocks of `MR` pixels: share by share, block by block; the last block, when
/// partial (only where the pixels are one row), from a zero-padded copy of its pixels made
/// once per task that has it.
#[inline(always)]
fn cols_task<S: pulp::Simd, const MR: usize>(simd: S, t: Cols<'_, '_>) -> KResult<()> {
    let Cols {
        src,
        m,
        b,
        shares,
        tail,
        pre,
    } = t;
    let k = b.k;
    let full = m / MR;
    let rest = m - full * MR;
    let has_tail = rest > 0 && shares.iter().any(|sh| sh.b1 > full);
    let tail_steps: Vec<usize> = if has_tail {
        (0..k).map(|p| p * MR).collect()
    } else {
        Vec::new()
    };
    if has_tail {
        tail.clear();
        tail.resize(k * MR, 0.0);
        for (d, &s) in tail.chunks_exact_mut(MR).zip(src.steps) {
            for (r, v) in d[..rest].iter_mut().enumerate() {
                *v = src.data[s + src.base(full * MR + r)];
            }
        }
    }
    let lanes = S::F32_LANES;
    let prefetch = Prefetch::new();
    // The panel each share's blocks prefetch: the task's next share's, when another; after
    // the task's last share, the panel after it (which the next task in order starts with).
    let panels = b.n.div_ceil(NR);
    let next: Vec<&[f32]> = (0..shares.len())
        .map(|i| match shares.get(i + 1) {
            Some(n) if n.panel != shares[i].panel => b.panel(n.panel),
            None if shares[i].panel + 1 < panels => b.panel(shares[i].panel + 1),
            _ => &[],
        })
        .collect();
    for (sh, next) in shares.iter_mut().zip(next) {
        let panel = b.panel(sh.panel);
        let cols = sh.rows.len();
        let blocks = sh.b1 - sh.b0;
        for blk in sh.b0..sh.b1 {
            let (data, steps, at, valid) = if blk < full {
                (src.data, src.steps, src.base(blk * MR), MR)
            } else {
                (&tail[..], &tail_steps[..], 0, rest)
            };
            let px = Pixels { data, steps, at };
            // This block's share of the next panel's lines, fetched into L2 over its steps.
            let share = line_share(next, blk - sh.b0, blocks);
            // Only the vectors that hold live columns (a last panel of 16 or 32 channels).
            let mut block = [[0.0f32; NR]; MR];
            let mut j0 = 0;
            while j0 < cols {
                let left = (cols - j0).div_ceil(lanes);
                let lines = if j0 == 0 { share } else { &[] };
                let a = Ahead { prefetch, lines };
                j0 += match left {
                    1 => kernel_cols::<S, MR, 1>(simd, px, panel, j0, &mut block, a),
                    2 => kernel_cols::<S, MR, 2>(simd, px, panel, j0, &mut block, a),
                    _ => kernel_cols::<S, MR, 3>(simd, px, panel, j0, &mut block, a),
                };
            }
            if let Some(pre) = pre {
                pre(sh.panel * NR, cols, &mut block[..valid]);
            }
            let i0 = (blk - sh.b0) * MR;
            for (c, row) in sh.rows.iter_mut().enumerate() {
                for (r, v) in row[i0..i0 + valid].iter_mut().enumerate() {
                    *v = block[r][c];
                }
            }
        }
    }
    Ok(())
}

/// A block's pixels for [`kernel_cols`]: pixel `r` of step `p` at `data[steps[p] + at + r]`.
#[derive(Clone, Copy)]
struct Pixels<'a> {
    data: &'a [f32],
    steps: &'a [usize],
    at: usize,
}

/// `MR` pixels ([`Pixels`]) × `V` vectors of the panel's columns from `j0`:
/// `Σ_p x · panel[p][j]`, one FMA per step in `p` order from `+0.0`, held in registers over
/// all of `k` (as [`kernel`], with the pixels read along `x`'s rows), into `out`, with the
/// lines of `ahead` prefetched on the way; returns the columns done.
#[inline(always)]
fn kernel_cols<S: pulp::Simd, const MR: usize, const V: usize>(
    simd: S,
    px: Pixels<'_>,
    panel: &[f32],
    j0: usize,
    out: &mut [[f32; NR]; MR],
    ahead: Ahead<'_>,
) -> usize {
    let Pixels { data, steps, at } = px;
    let lanes = S::F32_LANES;
    let width = V * lanes;
    let zero = simd.splat_f32s(0.0);
    let mut acc = [[zero; V]; MR];
    let mut spread = ahead.over(steps.len());
    for (bp, &s) in panel.chunks_exact(NR).zip(steps) {
        spread.step();
        let (Some(bp), Some(xs)) = (bp.get(j0..j0 + width), data.get(s + at..s + at + MR)) else {
            continue;
        };
        let bv: [S::f32s; V] = std::array::from_fn(|v| {
            bytemuck::pod_read_unaligned(bytemuck::cast_slice(&bp[v * lanes..(v + 1) * lanes]))
        });
        for (acc, &xv) in acc.iter_mut().zip(xs) {
            let xv = simd.splat_f32s(xv);
            for (a, &bv) in acc.iter_mut().zip(&bv) {
                *a = simd.mul_add_f32s(xv, bv, *a);
            }
        }
    }
    for (acc, o) in acc.iter().zip(out.iter_mut()) {
        for (v, a) in acc.iter().enumerate() {
            let vals: &[f32] = bytemuck::cast_slice(std::slice::from_ref(a));
            o[j0 + v * lanes..j0 + (v + 1) * lanes].copy_from_slice(vals);
        }
    }
    width
}

#[cfg(test)]
mod tests {
    use super::super::NR_N;
    use super::super::tests::{bits, chain};
    use super::*;
    use crate::util::test_values as values;

    /// The steps of `x` (`k × m`) as [`gemm_cols`] reads an im2col matrix.
    fn row_steps(k: usize, m: usize) -> Vec<usize> {
        (0..k).map(|p| p * m).collect()
    }

    /// `x` (`k × m`, with its [`row_steps`]) as [`gemm_cols`] reads an im2col matrix.
    fn rows_src<'a>(x: &'a [f32], steps: &'a [usize], m: usize) -> ColsSrc<'a> {
        ColsSrc {
            data: x,
            steps,
            row: m,
            pitch: m,
        }
    }

    /// `y` (`n × m`) transposed: what `gemm` computes as `m × n`.
    fn transposed(y: &[f32], n: usize, m: usize) -> Vec<f32> {
        (0..m * n).map(|t| y[(t % n) * m + t / n]).collect()
    }

    #[test]
    fn gemm_cols_is_the_chain_for_edge_shapes_and_thread_counts() {
        // Pixels in blocks of 7 (49, 14) and 8 with a partial last block (9, 50, 1); channels
        // under a panel, not a multiple of one, several tasks (k · pixels · 48 > TILE_MACS).
        for (m, k, n) in [
            (49usize, 1usize, 1usize),
            (49, 37, 100),
            (14, 300, 48),
            (9, 5, 97),
            (50, 64, 130),
            (1, 17, 49),
            (64, 2000, 200),
        ] {
            let x = values(k * m, (m * 13 + k) as u64);
            let b = values(k * n, (n * 7 + k) as u64);
            // The definition: y[j][i] = chain over p of x[p][i] · b[p][j].
            let xt: Vec<f32> = (0..m * k).map(|t| x[(t % k) * m + t / k]).collect();
            let want = chain(m, k, n, &xt, &b);
            let packed = PackedB::for_cols(&b, k, n).unwrap_or_else(|e| panic!("{e}"));
            let steps = row_steps(k, m);
            let src = rows_src(&x, &steps, m);
            for threads in [1, 2, 3] {
                let mut y = vec![f32::NAN; n * m];
                crate::par::with_threads(threads, || {
                    gemm_cols(m, src, &packed, &mut y, threads, None, None)
                })
                .unwrap_or_else(|e| panic!("{e}"));
                let got = transposed(&y, n, m);
                assert_eq!(bits(&got), bits(&want), "{m}x{k}x{n} on {threads} threads");
            }
        }
    }

    #[test]
    fn cols_shares_cover_every_block_once_in_runs_of_equal_work() {
        // MobileNetV2's 7×7 layers (960 → 320: 7 panels; 960 → 160: a last panel of one
        // vector; 160 → 960: small panels) and ResNet-50's 512 → 2048, on 1 to 3 threads.
        for (m, k, n) in [
            (49usize, 960usize, 320usize),
            (49, 960, 160),
            (49, 160, 960),
            (49, 512, 2048),
            (9, 5, 97),
        ] {
            let mr = cols_rows(m);
            for threads in [1usize, 2, 3] {
                let mut y = vec![0.0f32; n * m];
                let base = y.as_ptr() as usize;
                let tasks = cols_shares(m, mr, k, n, &mut y, threads);
                let mut hit = vec![0u8; n * m];
                let mut work = Vec::new();
                for t in &tasks {
                    let mut w = 0;
                    for sh in t {
                        let cols = (n - sh.panel * NR).min(NR);
                        assert_eq!(sh.rows.len(), cols);
                        w += (sh.b1 - sh.b0) * cols.div_ceil(COLS_COST_LANES);
                        for (c, row) in sh.rows.iter().enumerate() {
                            let at = (row.as_ptr() as usize - base) / 4;
                            assert_eq!(at, (sh.panel * NR + c) * m + sh.b0 * mr);
                            assert_eq!(row.len(), (sh.b1 * mr).min(m) - sh.b0 * mr);
                            hit[at..at + row.len()].iter_mut().for_each(|h| *h += 1);
                        }
                    }
                    work.push(w);
                }
                assert!(
                    hit.iter().all(|&h| h == 1),
                    "{m}x{k}x{n}, {threads} threads"
                );
                // Equal runs, to within two blocks of a full panel (each run ends within half
                // a block of its share).
                let (lo, hi) = (work.iter().min().unwrap(), work.iter().max().unwrap());
                assert!(
                    hi - lo <= 2 * NR / COLS_COST_LANES,
                    "{m}x{k}x{n}, {threads}: {work:?}"
                );
                if threads > 1 {
                    assert!(
                        tasks.len().is_multiple_of(threads),
                        "{m}x{k}x{n}: {}",
                        tasks.len()
                    );
                }
            }
        }
    }

    #[test]
    fn gemm_cols_reads_a_padded_plane_in_place() {
        // A 3×3 convolution of 5 channels on a 7×7 plane through its zero-padded 9×9 copy
        // (steps: each tap's offset; rows of 7 in a pitch of 9) against the same product
        // over its im2col matrix: the same chains, so the same bits.
        let (c, h, w, o) = (5usize, 7usize, 7usize, 60usize);
        let (hp, wp, k, m) = (h + 2, w + 2, c * 9, h * w);
        let img = values(c * h * w, 21);
        let mut pad = vec![0.0f32; c * hp * wp];
        for ch in 0..c {
            for y in 0..h {
                for xx in 0..w {
                    pad[ch * hp * wp + (y + 1) * wp + xx + 1] = img[(ch * h + y) * w + xx];
                }
            }
        }
        let mut col = vec![0.0f32; k * m];
        for p in 0..k {
            let (ch, ky, kx) = (p / 9, p / 3 % 3, p % 3);
            for i in 0..m {
                let (oy, ox) = (i / w, i % w);
                col[p * m + i] = pad[ch * hp * wp + (oy + ky) * wp + ox + kx];
            }
        }
        let b = values(k * o, 22);
        let packed = PackedB::for_cols(&b, k, o).unwrap_or_else(|e| panic!("{e}"));
        let steps: Vec<usize> = (0..k)
            .map(|p| (p / 9) * hp * wp + (p / 3 % 3) * wp + p % 3)
            .collect();
        let src = ColsSrc {
            data: &pad,
            steps: &steps,
            row: w,
            pitch: wp,
        };
        let mut y = vec![f32::NAN; o * m];
        gemm_cols(m, src, &packed, &mut y, 2, None, None).unwrap_or_else(|e| panic!("{e}"));
        let steps2 = row_steps(k, m);
        let mut want = vec![f32::NAN; o * m];
        gemm_cols(
            m,
            rows_src(&col, &steps2, m),
            &packed,
            &mut want,
            1,
            None,
            None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(bits(&y), bits(&want));
    }

    #[test]
    fn gemm_cols_gives_the_same_bits_on_every_instruction_set() {
        // One task on each instruction set (blocks of 7 and of 8 with a partial last one).
        for (m, k, n) in [(49usize, 33usize, 70usize), (19, 301, 50)] {
            let x = values(k * m, 31);
            let b = values(k * n, 32);
            let xt: Vec<f32> = (0..m * k).map(|t| x[(t % k) * m + t / k]).collect();
            let want = bits(&chain(m, k, n, &xt, &b));
            let packed = PackedB::for_cols(&b, k, n).unwrap_or_else(|e| panic!("{e}"));
            let steps = row_steps(k, m);
            let src = rows_src(&x, &steps, m);
            let run = |simd: &dyn Fn(Cols<'_, '_>) -> KResult<()>| {
                let mut y = vec![f32::NAN; n * m];
                for mut shares in cols_shares(m, cols_rows(m), k, n, &mut y, 1) {
                    simd(Cols {
                        src,
                        m,
                        b: &packed,
                        shares: &mut shares,
                        tail: &mut Vec::new(),
                        pre: None,
                    })
                    .unwrap_or_else(|e| panic!("{e}"));
                }
                bits(&transposed(&y, n, m))
            };
            let scalar = |c: Cols<'_, '_>| pulp::WithSimd::with_simd(c, pulp::Scalar::new());
            assert_eq!(run(&scalar), want, "scalar, {m}x{k}x{n}");
            #[cfg(target_arch = "x86_64")]
            {
                if let Some(v3) = pulp::x86::V3::try_new() {
                    let avx2 = move |c: Cols<'_, '_>| pulp::WithSimd::with_simd(c, v3);
                    assert_eq!(run(&avx2), want, "AVX2, {m}x{k}x{n}");
                }
                if let Some(v4) = pulp::x86::V4::try_new() {
                    let avx512 = move |c: Cols<'_, '_>| pulp::WithSimd::with_simd(c, v4);
                    assert_eq!(run(&avx512), want, "AVX-512, {m}x{k}x{n}");
                }
            }
        }
    }

    #[test]
    fn gemm_cols_runs_the_epilogue_once_per_row_and_rejects_bad_sources() {
        let (m, k, n) = (49, 10, 100);
        let x = values(k * m, 41);
        let b = values(k * n, 42);
        let packed = PackedB::for_cols(&b, k, n).unwrap_or_else(|e| panic!("{e}"));
        let steps = row_steps(k, m);
        let src = rows_src(&x, &steps, m);
        let mut want = vec![0.0; n * m];
        gemm_cols(m, src, &packed, &mut want, 1, None, None).unwrap_or_else(|e| panic!("{e}"));
        // Parts of rows (a panel shared by pixels between the tasks of two threads), whole
        // blocks of 7 pixels each, every element once.
        let seen = std::sync::Mutex::new(vec![0u8; n * m]);
        let ep = |row: usize, c0: usize, r: &mut [f32]| {
            assert!(
                c0.is_multiple_of(7) && c0 + r.len() <= m && !r.is_empty(),
                "{c0} {}",
                r.len()
            );
            let mut seen = seen.lock().unwrap_or_else(|e| panic!("{e}"));
            seen[row * m + c0..row * m + c0 + r.len()]
                .iter_mut()
                .for_each(|s| *s += 1);
            r.iter_mut().for_each(|v| *v = -*v);
        };
        let mut y = vec![0.0; n * m];
        gemm_cols(m, src, &packed, &mut y, 2, None, Some(&ep)).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            seen.into_inner()
                .unwrap_or_else(|e| panic!("{e}"))
                .iter()
                .all(|&s| s == 1)
        );
        assert_eq!(bits(&y), bits(&want.iter().map(|v| -v).collect::<Vec<_>>()));
        // A step reading past the data, rows wider than their pitch, blocks across rows, the
        // wrong number of steps or outputs, panels of another width: errors, not panics.
        let short = ColsSrc {
            data: &x[..k * m - 1],
            ..src
        };
        let wide = ColsSrc {
            pitch: 5,
            row: 7,
            ..src
        };
        let across = ColsSrc {
            row: 10,
            pitch: 10,
            ..src
        };
        let few = ColsSrc {
            steps: &steps[..k - 1],
            ..src
        };
        for bad in [short, wide, across, few] {
            assert!(gemm_cols(m, bad, &packed, &mut y, 1, None, None).is_err());
        }
        assert!(gemm_cols(m, src, &packed, &mut y[1..], 1, None, None).is_err());
        let narrow = PackedB::with_width(&b, k, n, NR_N).unwrap_or_else(|e| panic!("{e}"));
        let e = gemm_cols(m, src, &narrow, &mut y, 1, None, None).unwrap_err();
        assert!(e.contains("panels of 48"), "{e}");
    }
}
