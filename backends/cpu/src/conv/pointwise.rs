//! The 1×1 convolution of an `NCHW` image with its pixels on the vector lanes: `y = w · x`
//! with `w` the weight (`m × k`: output by input channels), `x` the image (`k × n`: channels
//! by pixels, read where it lies) and `y` the output (`m × n`), each block of sums finished in
//! registers (bias, `batch_norm`, residual add, `relu`, `clip`: [`RegSteps`]) and stored once.
//! [`short`] takes few input channels on a large plane, [`long`] more on planes of 14×14 and
//! larger.
//!
//! Contract:
//!
//! - Every element of `y` is one chain of `f32` fused multiply-adds over `k` in order, from
//!   `+0.0`: `y = fma(w[i][p], x[p][j], y)` for `p = 0..k`, then the epilogue's steps as
//!   [`RegSteps::apply_vecs`] (whole panels) or the row epilogue itself
//!   ([`apply_steps_inline`], a partial last one) give them. A chain cut into chunks is stored
//!   in `f32` between them and continued from the stored value, so the result is the same
//!   chain; it does not depend on the tiling or the thread count.
//! - AVX-512 only (16-lane vectors; [`takes`] says no elsewhere and the convolution keeps
//!   `faer`'s GEMM). The micro-kernel holds 4 output channels × up to 96 pixels (6 vectors)
//!   in up to 24 of the 32 registers: per step, a load per vector of a row of `x` and 4
//!   broadcast weights — `faer`'s own `m96_n4` shape (an 8 × 48 block, 8 broadcasts per 24
//!   multiply-adds, ran slower).
//! - [`short`] (at most [`MAX_K`] input channels, planes of [`MIN_PIXELS`] or more): the
//!   sums of a block stay in registers over all of `k`, the weights from a copy interleaved by
//!   step (made once per call). Tasks are runs of whole 96-pixel panels by bands of channels;
//!   for each panel every block of 4 channels runs in turn, so the panel (`k × 96` values)
//!   comes from memory once and then from L1. The last panel of a row, when narrower, runs as
//!   the fewest vectors that cover it, on a zero-padded copy.
//! - [`long`] (more input channels, planes of [`MIN_PIXELS_LONG`] or more, where
//!   [`long_cpu`] holds): the row's vectors in panels of 4 to 6 as even as they divide
//!   ([`panels`]: a 14×14 plane's 13 vectors as 4, 4 and 5), the reduction in chunks of
//!   [`CHUNK_LINES`] lines of a panel, each chunk passed by every block of the task's channels
//!   while it is in L1; a block's sums wait between chunks in the output (whole panels) or in
//!   a per-task buffer (a partial panel) and the last chunk finishes them. Rows that do not
//!   start on a line, and a partial panel, are read from a copy of each chunk in whole lines;
//!   the weights' rows are read in place. Tasks are bands of channels (one per thread) on a
//!   plane of fewer than four panels per thread, runs of panels by bands otherwise.
//! - The sums of a whole panel stay in registers from the last multiply-add through the
//!   epilogue to one store per vector: the rows of a block are finished with constant
//!   indices and nothing on that path calls out (a `memcpy` or a loop over the rows had the
//!   compiler spill all 24 to the stack and load them back).
//! - An output of [`AHEAD_ELEMS`] or more (more than the cores' L2 caches hold) has each
//!   block's output lines prefetched for writing while the block before it is computed
//!   (`prefetchw`, a hint): MobileNetV2's 16 → 96 layer on 112×112 waited for its lines
//!   otherwise.
//! - Why not `faer` here: its GEMM writes the sums, and the epilogue then reads and writes the
//!   whole output again; with 16–32 input channels the output is as large as the work, and
//!   that pass was a fifth of the layer (MobileNetV2's 16 → 96 on 112×112 with bias and
//!   ReLU6, one thread: 0.597 ms, 0.492 without the epilogue). One layer, one thread, minima
//!   of alternated runs: that layer 0.588 → 0.503 ms, 32 → 16 on 112×112 0.161 → 0.137, 24 →
//!   144 on 56×56 0.277 → 0.242, 32 → 192 on 28×28 0.121 → 0.106 (bench/RESULTS.md,
//!   session ak). With more input channels `faer` packs the image per call and tile; on the
//!   Intel Xeon of session bd, MobileNetV2's layers of 64 to 576 input channels on 14×14 to
//!   56×56 planes took 0.84–0.97 of `faer`'s time in the model on one thread (0.91–1.07 on
//!   two), its 576 → 96 on 14×14 alone 0.130 against 0.143 ms.
//!
//! ```text
//! lv = R.nn.conv2d(x, w)   # x: (1, 16, 112, 112), w: (96, 16, 1, 1)
//! gv = R.clip(R.add(lv, b), 0, 6)
//! ; short: w (96 × 16) · x (16 × 12544, in place): 130 panels of 96 pixels and one of 64
//! ; (4 vectors), 24 blocks of 4 channels each; each block's sums + b, clipped, stored once
//! lv = R.nn.conv2d(x, w)   # x: (1, 576, 14, 14), w: (96, 576, 1, 1)
//! ; long: panels of 64, 64 and 68 pixels (4, 4 and 5 vectors, the last partial); per
//! ; per panel 5 chunks of up to 128 steps (6 of 102 for the 5-vector one), each copied
//! ; into whole lines once, then passed by the 24 blocks of 4 channels
//! ```

use super::epilogue::{RegSteps, Step, apply_steps_inline};
use crate::util::KResult;

/// Output channels per micro-kernel block.
const MR: usize = 4;

/// The most vectors of 16 pixels per panel: with [`MR`] channels, 24 sums in registers.
const NV: usize = 6;

/// Pixels per full panel.
const NR: usize = NV * 16;

/// A chunk of [`long`]'s reduction covers this many cache lines of one panel of the image
/// (32 KiB): `512 / V` steps of `k` for a panel of `V` vectors, which stay in L1 while every
/// block of channels of the task passes them. One thread, MobileNetV2's 576 → 96 on 14×14
/// alone, in a development build (tasks then by panels): chunks of 96–128 steps 0.129–0.133
/// ms, of 64 steps 0.134, the whole reduction at once 0.138 (bench/RESULTS.md, session bd).
const CHUNK_LINES: usize = 512;

/// About this many output elements per task (a task's output stays in L2 until written back).
const TASK_ELEMS: usize = 1 << 15;

/// Outputs of at least this many elements (2 MiB, more than the two cores' L2 caches of the
/// machine measured) have the lines of each block's outputs prefetched for writing one block
/// ahead ([`Task::ahead`]). Such an output cannot stay in cache from one inference to the next,
/// and without the prefetch each block's 24 stores waited for their lines: MobileNetV2's 16 →
/// 96 on 112×112 (4.8 MB written) in the model, per-shape minima of 8 alternated processes,
/// 0.560 → 0.466 ms on one thread and 0.257 → 0.241 on two (0.306 → 0.259 in a stretch where
/// the VM's second vCPU was contended). Smaller outputs gained nothing (24 → 144 on 56×56, 1.8
/// MB: 0.259 → 0.262) or lost (32 → 16 on 112×112, 0.8 MB, its lines still in cache: 0.078 →
/// 0.082–0.092); bench/RESULTS.md, session al.
const AHEAD_ELEMS: usize = 1 << 19;

/// The most input channels [`takes`] accepts on planes of [`MIN_PIXELS`] or more on every
/// AVX-512 CPU. One-layer models (conv + bias + clip), against `faer` and the row epilogue,
/// minima of alternated runs on Zen 4 (bench/RESULTS.md, session ak): with 16–32 input
/// channels faster on every plane of 28×28 and more, one and two threads; with 64–96 on 56×56
/// faster on one thread but even or slower on two (64 → 256: 0.585 against 0.573 ms), with
/// 128 and more on 28×28 slower (a panel of `k × 96` values read again from L2 by every
/// block of channels). More input channels go to [`long`] where [`long_cpu`] says so.
pub(crate) const MAX_K: usize = 32;

/// The fewest pixels [`takes`] accepts with at most [`MAX_K`] input channels: on 14×14 planes
/// (then three panels, the last of one vector) 96 → 576 took 0.157 ms against `faer`'s 0.128
/// on two threads (Zen 4).
pub(crate) const MIN_PIXELS: usize = 28 * 28;

/// The fewest pixels [`takes`] accepts with more than [`MAX_K`] input channels (where
/// [`long_cpu`] holds): a 14×14 plane, 13 vectors in panels of 4, 4 and 5. Smaller planes (7×7)
/// keep the column kernel, whose lanes a 49-pixel row does not leave a quarter empty.
pub(crate) const MIN_PIXELS_LONG: usize = 14 * 14;

/// Whether this kernel computes a 1×1 convolution of `m` output and `k` input channels on `n`
/// pixels, with `steps` as its epilogue, on this CPU.
pub(crate) fn takes(m: usize, k: usize, n: usize, steps: &[Step]) -> bool {
    let short = k <= MAX_K && n >= MIN_PIXELS;
    let long = k > MAX_K && n >= MIN_PIXELS_LONG && long_cpu();
    (short || long) && fits(m, k) && RegSteps::new(steps).is_some()
}

/// [`conv1x1`]'s own bounds: the output channels, a reduction, the CPU.
fn fits(m: usize, k: usize) -> bool {
    m >= MR && k >= 1 && crate::simd::avx512()
}

/// Whether [`takes`] accepts more than [`MAX_K`] input channels on this CPU: where a 16-lane
/// FMA issues at full rate (two a cycle), as on the Intel Xeon measured, and not on Zen 4
/// ([`crate::simd::half_rate_fma512`]), where `faer` was faster for such layers before the
/// reduction was cut into chunks ([`CHUNK_LINES`]) and which has not been measured since.
fn long_cpu() -> bool {
    !crate::simd::half_rate_fma512()
}

/// The panels of a row of `n` pixels, `(first pixel, vectors)`: the row's vectors of 16 (the
/// last one partial where 16 does not divide `n`) in runs of at most [`NV`], as even as whole
/// vectors allow. A 14×14 plane (13 vectors) is 4, 4 and 5 vectors, where whole panels of 6
/// left a last one of one vector, whose 4 sums per step run at a fraction of the kernel's rate.
fn panels(n: usize) -> Vec<(usize, usize)> {
    let v = n.div_ceil(16);
    let p = v.div_ceil(NV);
    (0..p)
        .map(|i| (v * i / p * 16, v * (i + 1) / p - v * i / p))
        .collect()
}

/// `y = w · x` then `steps` on up to `threads` threads (see the module doc): `w` `m × k`, `x`
/// `k × n`, `y` `m × n`, all row-major; element `(i, j)` of `y` is element `base + i·n + j`
/// of the output the steps' residual and values refer to.
#[allow(
    clippy::too_many_arguments,
    reason = "a GEMM's operands, sizes and epilogue"
)]
pub(crate) fn conv1x1(
    m: usize,
    k: usize,
    n: usize,
    w: &[f32],
    x: &[f32],
    y: &mut [f32],
    threads: usize,
    steps: &[Step],
    base: usize,
) -> KResult<()> {
    if w.len() != m * k || x.len() != k * n || y.len() != m * n {
        return Err(format!(
            "pointwise: {m}x{k} @ {k}x{n} needs {}, {} and {} elements, found {}, {} and {}",
            m * k,
            k * n,
            m * n,
            w.len(),
            x.len(),
            y.len()
        ));
    }
    let reg = match RegSteps::new(steps) {
        Some(reg) if fits(m, k) => reg,
        _ => {
            return Err(format!(
                "pointwise: the kernel takes AVX-512, at least {MR} output channels, at least \
                 one input channel and an epilogue of bias or batch_norm, residual, relu or \
                 clip; found {m}, {k} and {n}, {} steps",
                steps.len()
            ));
        }
    };
    if n == 0 {
        return Ok(());
    }
    let a = Args {
        m,
        k,
        n,
        w,
        x,
        steps,
        base,
        reg,
    };
    if k <= MAX_K {
        short(a, y, threads)
    } else {
        long(a, y, threads)
    }
}

/// [`conv1x1`]'s operands but the output: the sizes, weight, image, epilogue and the output's
/// place in the tensor the epilogue's values refer to.
#[derive(Clone, Copy)]
struct Args<'a> {
    m: usize,
    k: usize,
    n: usize,
    w: &'a [f32],
    x: &'a [f32],
    steps: &'a [Step],
    base: usize,
    reg: RegSteps<'a>,
}

/// `y`'s rows (`m` of `n`) cut into tasks: `bands` bands of whole blocks of [`MR`] channels
/// by the runs of columns between `cols`' boundaries, band by band; each task its first
/// channel, its run and its slice of each of its channels' rows. The slices live in `flat`,
/// task after task: one allocation a call, not one a task (16 → 96 channels on 112 × 112 is 38
/// tasks of 96 rows; their `Vec`s took 12 µs a call, on the calling thread before any task
/// ran).
fn cut_tasks<'t, 'y>(
    flat: &'t mut Vec<&'y mut [f32]>,
    y: &'y mut [f32],
    n: usize,
    m: usize,
    blocks: usize,
    bands: usize,
    cols: &[usize],
) -> Vec<(usize, usize, &'t mut [&'y mut [f32]])> {
    let runs = cols.len().saturating_sub(1);
    let chans: Vec<usize> = (0..=bands)
        .map(|t| (blocks * t / bands * MR).min(m))
        .collect();
    flat.clear();
    flat.resize_with(m * runs, Default::default);
    // Band `[c0, c1)` holds `flat[c0 · runs..c1 · runs]`, run by run; row `i`'s slice of run
    // `r` sits at `c0 · runs + r · (c1 − c0) + (i − c0)`.
    let mut band = 0;
    for (i, row) in y.chunks_exact_mut(n).enumerate().take(m) {
        while chans.get(band + 1).is_some_and(|&c1| i >= c1) {
            band += 1;
        }
        let (c0, c1) = (chans[band], chans.get(band + 1).copied().unwrap_or(m));
        let mut rest = row;
        for (r, run) in cols.windows(2).enumerate() {
            let (part, tail) = rest.split_at_mut(run[1] - run[0]);
            flat[c0 * runs + r * (c1 - c0) + (i - c0)] = part;
            rest = tail;
        }
    }
    let mut tasks = Vec::with_capacity(runs * bands);
    let mut rest = &mut flat[..];
    for band in chans.windows(2) {
        for run in 0..runs {
            let (rows, tail) = rest.split_at_mut(band[1] - band[0]);
            tasks.push((band[0], run, rows));
            rest = tail;
        }
    }
    tasks
}

/// [`conv1x1`] for at most [`MAX_K`] input channels (see the module doc).
fn short(a: Args<'_>, y: &mut [f32], threads: usize) -> KResult<()> {
    let Args { m, k, n, .. } = a;
    let Args {
        w,
        x,
        steps,
        base,
        reg,
        ..
    } = a;
    // The weights in blocks of MR rows, each step-major (`k × MR`), the last block's missing
    // rows zero.
    let blocks = m.div_ceil(MR);
    // Written in order, each step's `MR` values from the block's rows (in L1); a missing
    // row's `get` finds nothing past the weight's end.
    let mut wpack = vec![0.0f32; blocks * k * MR];
    for (b, dst) in wpack.chunks_exact_mut(k * MR).enumerate() {
        let rows = &w[b * MR * k..];
        for (p, step) in dst.chunks_exact_mut(MR).enumerate() {
            for (r, d) in step.iter_mut().enumerate() {
                if let Some(&v) = rows.get(r * k + p) {
                    *d = v;
                }
            }
        }
    }
    // Tasks: runs of whole panels by bands of whole blocks of channels, as many as the
    // output's size asks for, a multiple of the thread count (when the plane has fewer panels
    // than that, its channels are split into bands too), the panels and blocks dealt evenly.
    let panels = n.div_ceil(NR);
    let want = (m * n)
        .div_ceil(TASK_ELEMS)
        .next_multiple_of(threads.max(1))
        .max(1);
    let runs = want.min(panels).max(1);
    let bands = want.div_ceil(runs).clamp(1, blocks);
    let cols: Vec<usize> = (0..=runs)
        .map(|t| (panels * t / runs * NR).min(n))
        .collect();
    let mut flat = Vec::new();
    let tasks = cut_tasks(&mut flat, y, n, m, blocks, bands, &cols);
    let threads = threads.min(tasks.len()).max(1);
    let wpack = &wpack[..];
    let ahead = m * n >= AHEAD_ELEMS;
    crate::par::run_tasks(tasks, threads, |(ch0, run, rows)| {
        let blocks = ch0 / MR..(ch0 + rows.len()).div_ceil(MR);
        crate::simd::dispatch(ShortTask {
            wpack: &wpack[blocks.start * k * MR..blocks.end * k * MR],
            k,
            x,
            n,
            ch0,
            c0: cols[run],
            rows,
            reg,
            steps,
            base,
            ahead,
        })
    })
}

/// [`conv1x1`] for more than [`MAX_K`] input channels (see the module doc).
fn long(a: Args<'_>, y: &mut [f32], threads: usize) -> KResult<()> {
    let (m, k, n, w, x) = (a.m, a.k, a.n, a.w, a.x);
    let (steps, base, reg) = (a.steps, a.base, a.reg);
    let blocks = m.div_ceil(MR);
    // Tasks: on a plane of fewer than four panels per thread (14×14: three, of unequal
    // width), one band of channels per thread over the whole row; else, as in `short`, runs
    // of whole panels by bands, as many as the output's size asks for, a multiple of the
    // thread count. (One thread, 576 → 96 alone: 0.129–0.130 ms as one task, 0.143–0.146
    // cut into two bands, each band copying every chunk. Two threads, the plane cut into
    // runs of 4 + 3 against 3 + 3 vectors instead: 96 → 576 took 1.27 of `faer`'s time in
    // the model and 64 → 384 1.33, a band per thread 0.98 and 1.00.)
    let threads = threads.max(1);
    let plan = panels(n);
    let (runs, bands) = if plan.len() >= 4 * threads {
        let want = (m * n)
            .div_ceil(TASK_ELEMS)
            .next_multiple_of(threads)
            .max(1);
        let runs = want.min(plan.len());
        (runs, want.div_ceil(runs).clamp(1, blocks))
    } else {
        (1, threads.min(blocks))
    };
    let cuts: Vec<usize> = (0..=runs).map(|t| plan.len() * t / runs).collect();
    let cols: Vec<usize> = cuts
        .iter()
        .map(|&c| plan.get(c).map_or(n, |p| p.0))
        .collect();
    let mut flat = Vec::new();
    let tasks = cut_tasks(&mut flat, y, n, m, blocks, bands, &cols);
    let threads = threads.min(tasks.len()).max(1);
    let ahead = m * n >= AHEAD_ELEMS;
    let plan = &plan[..];
    crate::par::run_tasks(tasks, threads, |(ch0, run, rows)| {
        crate::par::with_scratch(&SUMS, |sums| {
            crate::par::with_scratch(&CHUNK, |chunk| {
                crate::simd::dispatch(Task {
                    w,
                    m,
                    k,
                    x,
                    n,
                    ch0,
                    c0: cols[run],
                    panels: &plan[cuts[run]..cuts[run + 1]],
                    rows,
                    reg,
                    steps,
                    base,
                    ahead,
                    sums,
                    chunk,
                })
            })
        })
    })
}

thread_local! {
    /// A task's sums of a partial panel between chunks ([`Task::sums`]).
    static SUMS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// A task's chunk of a panel in whole lines ([`Task::chunk`]).
    static CHUNK: std::cell::RefCell<Vec<crate::gemm_packed::Line>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// One task of [`short`]: rows `ch0..` of `y` (`rows`, one slice each, a multiple of [`MR`] from the
/// first), columns `c0..`; `wpack` holds the blocks of those rows.
struct ShortTask<'a, 'r, 'y> {
    wpack: &'a [f32],
    k: usize,
    x: &'a [f32],
    n: usize,
    ch0: usize,
    c0: usize,
    rows: &'r mut [&'y mut [f32]],
    reg: RegSteps<'a>,
    steps: &'a [Step],
    base: usize,
    /// Whether each whole block first prefetches the next block's output lines for writing
    /// (see [`AHEAD_ELEMS`]).
    ahead: bool,
}

impl pulp::WithSimd for ShortTask<'_, '_, '_> {
    type Output = KResult<()>;
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) -> KResult<()> {
        let ShortTask {
            wpack,
            k,
            x,
            n,
            ch0,
            c0,
            rows,
            reg,
            steps,
            base,
            ahead,
        } = self;
        if S::F32_LANES != 16 {
            return Err(format!(
                "pointwise: the kernel needs 16-lane vectors, this CPU runs {}",
                S::F32_LANES
            ));
        }
        let cols = rows.first().map_or(0, |r| r.len());
        let whole = cols / NR;
        // Whole panels, read in place; nothing on this path calls out, so the sums stay in
        // registers from the last multiply-add to their store.
        let blocks = wpack.len() / (k * MR).max(1);
        let prefetch = crate::gemm_packed::Prefetch::new();
        for j in 0..whole {
            let (j0, col) = (j * NR, c0 + j * NR);
            let panel = &x[col..];
            for (b, wb) in wpack.chunks_exact(k * MR).enumerate() {
                if ahead {
                    // The next block's lines: the next channels of this panel, else the
                    // first ones of the next panel (a hint: nothing changes but the timing).
                    let (nb, nj) = if b + 1 < blocks {
                        (b + 1, j)
                    } else {
                        (0, j + 1)
                    };
                    if nj < whole {
                        for row in rows.iter().skip(nb * MR).take(MR) {
                            if let Some(dst) = row.get(nj * NR..(nj + 1) * NR) {
                                for line in dst.chunks(16) {
                                    prefetch.line_for_write(line);
                                }
                            }
                        }
                    }
                }
                let acc = block::<S, NV>(
                    simd,
                    [[simd.splat_f32s(0.0); NV]; MR],
                    steps_of(wb),
                    panel,
                    n,
                );
                let mut row = Row {
                    simd,
                    steps: reg,
                    rows,
                    first: b * MR,
                    ch: ch0 + b * MR,
                    j0,
                    at: base + (ch0 + b * MR) * n + col,
                    n,
                };
                let ok = row.finish::<0, NV>(&acc)
                    & row.finish::<1, NV>(&acc)
                    & row.finish::<2, NV>(&acc)
                    & row.finish::<3, NV>(&acc);
                if !ok {
                    return Err(missing(ch0 + b * MR));
                }
            }
        }
        // A narrow last panel, as few vectors as cover it.
        let width = cols - whole * NR;
        let narrow = Narrow {
            simd,
            wpack,
            k,
            x,
            n,
            ch0,
            j0: whole * NR,
            col: c0 + whole * NR,
            width,
            steps,
            base,
        };
        match width.div_ceil(16) {
            0 => Ok(()),
            1 => narrow.run::<1>(rows),
            2 => narrow.run::<2>(rows),
            3 => narrow.run::<3>(rows),
            4 => narrow.run::<4>(rows),
            5 => narrow.run::<5>(rows),
            _ => narrow.run::<6>(rows),
        }
    }
}

/// A task's last panel of `width` (< [`NR`]) pixels: columns `j0..` of its rows, `col..` of
/// the image.
struct Narrow<'a, S: pulp::Simd> {
    simd: S,
    wpack: &'a [f32],
    k: usize,
    x: &'a [f32],
    n: usize,
    ch0: usize,
    j0: usize,
    col: usize,
    width: usize,
    steps: &'a [Step],
    base: usize,
}

impl<S: pulp::Simd> Narrow<'_, S> {
    /// The panel as `V` vectors (`16·V ≥ width`): a zero-padded copy, the sums through an
    /// array, the row epilogue ([`apply_steps_inline`]) on the slices.
    #[inline(always)]
    fn run<const V: usize>(&self, rows: &mut [&mut [f32]]) -> KResult<()> {
        let (k, n, width, col, j0) = (self.k, self.n, self.width, self.col, self.j0);
        let w = 16 * V;
        if width > w {
            return Err(format!("pointwise: {width} pixels in a panel of {w}"));
        }
        let mut panel = vec![0.0f32; k * w];
        for (d, row) in panel.chunks_exact_mut(w).zip(self.x.chunks_exact(n)) {
            d[..width].copy_from_slice(&row[col..col + width]);
        }
        for (b, wb) in self.wpack.chunks_exact(k * MR).enumerate() {
            let acc = block::<S, V>(
                self.simd,
                [[self.simd.splat_f32s(0.0); V]; MR],
                steps_of(wb),
                &panel,
                w,
            );
            for (r, v) in acc.iter().enumerate() {
                let ch = self.ch0 + b * MR + r;
                let Some(row) = rows.get_mut(b * MR + r) else {
                    break;
                };
                let dst = &mut row[j0..j0 + width];
                let vals: &[f32] = bytemuck::cast_slice(&v[..]);
                dst.copy_from_slice(&vals[..width]);
                apply_steps_inline(self.steps, ch, self.base + ch * n + col, dst);
            }
        }
        Ok(())
    }
}

/// One task of [`long`]: rows `ch0..` of `y` (`rows`, one slice each for columns `c0..` of the image, a
/// multiple of [`MR`] from the first), its `panels` of the row.
struct Task<'a, 'r, 'y> {
    w: &'a [f32],
    m: usize,
    k: usize,
    x: &'a [f32],
    n: usize,
    ch0: usize,
    c0: usize,
    panels: &'a [(usize, usize)],
    rows: &'r mut [&'y mut [f32]],
    reg: RegSteps<'a>,
    steps: &'a [Step],
    base: usize,
    /// Whether each whole block of the last chunk first prefetches the next block's output
    /// lines for writing (see [`AHEAD_ELEMS`]).
    ahead: bool,
    /// A partial panel's sums between chunks ([`load_held`]).
    sums: &'a mut Vec<f32>,
    /// A chunk of a panel copied into whole lines.
    chunk: &'a mut Vec<crate::gemm_packed::Line>,
}

impl pulp::WithSimd for Task<'_, '_, '_> {
    type Output = KResult<()>;
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(mut self, simd: S) -> KResult<()> {
        if S::F32_LANES != 16 {
            return Err(format!(
                "pointwise: the kernel needs 16-lane vectors, this CPU runs {}",
                S::F32_LANES
            ));
        }
        for &(start, vecs) in self.panels {
            match vecs {
                1 => self.panel::<S, 1>(simd, start)?,
                2 => self.panel::<S, 2>(simd, start)?,
                3 => self.panel::<S, 3>(simd, start)?,
                4 => self.panel::<S, 4>(simd, start)?,
                5 => self.panel::<S, 5>(simd, start)?,
                _ => self.panel::<S, NV>(simd, start)?,
            }
        }
        Ok(())
    }
}

impl Task<'_, '_, '_> {
    /// The panel of `V` vectors from pixel `start`, chunk by chunk ([`CHUNK_LINES`]), each chunk
    /// passed by every block of the task's channels: the first chunk's sums start from
    /// `+0.0`, the others from the sums the chunk before stored, which the last chunk
    /// finishes. A whole panel's sums wait in the output and are finished in registers
    /// ([`Row::finish`]); a partial one's (the row's last) wait in `self.sums`, whole
    /// vectors, and its valid columns get the row epilogue. The image is read in place
    /// (a partial panel's lanes past the row read the next row's values: lane-wise sums
    /// never stored), but for a partial panel's last step, which would read past the image:
    /// that step runs on a zero-padded copy of its row.
    #[inline(always)]
    fn panel<S: pulp::Simd, const V: usize>(&mut self, simd: S, start: usize) -> KResult<()> {
        let (k, n, m) = (self.k, self.n, self.m);
        let full = 16 * V;
        let width = full.min(n - start);
        let whole = width == full;
        let j0 = start - self.c0;
        let blocks = self.rows.len().div_ceil(MR);
        let prefetch = crate::gemm_packed::Prefetch::new();
        // Rows of the image that do not start on a line (a 14×14 plane's 196 pixels), or a
        // partial panel: each chunk is copied into whole lines, zero past the row, once per
        // task, so that every block reads whole aligned vectors (and no lane past the image).
        let kc = (CHUNK_LINES / V).max(1);
        let copy = !whole || !n.is_multiple_of(16);
        if !whole && k > kc {
            self.sums.clear();
            self.sums.resize(blocks * MR * full, 0.0);
        }
        let mut c0 = 0;
        while c0 < k {
            let c1 = (c0 + kc).min(k);
            let last = c1 == k;
            let (xs, stride): (&[f32], usize) = if copy {
                self.chunk.clear();
                self.chunk
                    .resize((c1 - c0) * V, crate::gemm_packed::Line([0.0; 16]));
                let vecs = width / 16;
                for (d, p) in self.chunk.chunks_exact_mut(V).zip(c0..c1) {
                    let row = &self.x[p * n + start..p * n + start + width];
                    // Whole vectors as vectors (no call per row), then the rest of a partial
                    // one lane by lane.
                    for (line, src) in d.iter_mut().zip(row.chunks_exact(16)) {
                        let v: S::f32s = bytemuck::pod_read_unaligned(bytemuck::cast_slice(src));
                        *line = bytemuck::cast(v);
                    }
                    if let Some(line) = d.get_mut(vecs) {
                        for (l, &v) in line.0.iter_mut().zip(&row[vecs * 16..]) {
                            *l = v;
                        }
                    }
                }
                (bytemuck::cast_slice(&self.chunk[..]), full)
            } else {
                (&self.x[start + c0 * n..], n)
            };
            for b in 0..blocks {
                let ch = self.ch0 + b * MR;
                if last && whole && self.ahead {
                    // The next block's lines: the next channels of this panel, else the first
                    // ones of the next panel (a hint: nothing changes but the timing).
                    let (nb, nj) = if b + 1 < blocks {
                        (b + 1, j0)
                    } else {
                        (0, j0 + width)
                    };
                    for row in self.rows.iter().skip(nb * MR).take(MR) {
                        if let Some(dst) = row.get(nj..(nj + NR).min(row.len())) {
                            for line in dst.chunks(16) {
                                prefetch.line_for_write(line);
                            }
                        }
                    }
                }
                let at = Block {
                    b,
                    ch,
                    j0,
                    start,
                    width,
                    last,
                };
                let sink = Sink {
                    rows: &mut *self.rows,
                    sums: &mut *self.sums,
                    reg: self.reg,
                    steps: self.steps,
                    base: self.base,
                    n,
                };
                // The block's rows of the weights over the chunk, read in place (a last
                // block's missing rows repeat the last channel's; their sums are never stored).
                let c = [0, 1, 2, 3].map(|r| (ch + r).min(m - 1) * k);
                let [w0, w1, w2, w3] = c.map(|c| &self.w[c + c0..c + c1]);
                let w = w0
                    .iter()
                    .zip(w1)
                    .zip(w2)
                    .zip(w3)
                    .map(|(((&a, &b), &c), &d)| [a, b, c, d]);
                block_chunk::<S, V>(simd, sink, w, xs, stride, &at, c0 == 0)?;
            }
            c0 = c1;
        }
        Ok(())
    }

    /// A block's sums after a chunk ([`Block`]): kept for the next chunk (in the output for a
    /// whole panel, in `self.sums` for a partial one), or on the last chunk finished and
    /// stored.
    #[inline(always)]
    fn end_block<S: pulp::Simd, const V: usize>(
        sink: Sink<'_, '_, '_>,
        simd: S,
        acc: &[[S::f32s; V]; MR],
        at: &Block,
    ) -> KResult<()> {
        let Block {
            b,
            ch,
            j0,
            start,
            width,
            last,
        } = *at;
        let n = sink.n;
        let whole = width == 16 * V;
        if !last {
            if whole {
                store_sums::<S, V>(acc, sink.rows, b * MR, j0);
            } else if let Some(held) = sink.sums.get_mut(at.held::<V>()) {
                store_held::<S, V>(acc, held);
            }
        } else if whole {
            let mut row = Row {
                simd,
                steps: sink.reg,
                rows: sink.rows,
                first: b * MR,
                ch,
                j0,
                at: sink.base + ch * n + start,
                n,
            };
            let ok = row.finish::<0, V>(acc)
                & row.finish::<1, V>(acc)
                & row.finish::<2, V>(acc)
                & row.finish::<3, V>(acc);
            if !ok {
                return Err(missing(ch));
            }
        } else {
            for (r, v) in acc.iter().enumerate() {
                if let Some(row) = sink.rows.get_mut(b * MR + r) {
                    let dst = &mut row[j0..j0 + width];
                    let vals: &[f32] = bytemuck::cast_slice(&v[..]);
                    dst.copy_from_slice(&vals[..width]);
                    let at = sink.base + (ch + r) * n + start;
                    apply_steps_inline(sink.steps, ch + r, at, dst);
                }
            }
        }
        Ok(())
    }
}

/// What [`Task::end_block`] writes to: the task's rows, its held sums, the epilogue.
struct Sink<'s, 'r, 'y> {
    rows: &'s mut [&'y mut [f32]],
    sums: &'s mut Vec<f32>,
    reg: RegSteps<'r>,
    steps: &'r [Step],
    base: usize,
    n: usize,
}

/// Where a block of [`Task::panel`] lies: block `b` of the task (channels `ch..`), the panel's
/// columns `j0..j0 + width` of the task's rows (`start..` of the image), and whether the chunk
/// was the last.
struct Block {
    b: usize,
    ch: usize,
    j0: usize,
    start: usize,
    width: usize,
    last: bool,
}

impl Block {
    /// The block's sums' place in `Task::sums` for a partial panel of `V` vectors.
    fn held<const V: usize>(&self) -> std::ops::Range<usize> {
        let len = MR * 16 * V;
        self.b * len..(self.b + 1) * len
    }
}

/// The sums a chunk stored for rows `first..first + MR` of `rows`, the `V` vectors from
/// column `j0` (zero for rows past the task's last), read in place.
#[inline(always)]
fn load_sums<S: pulp::Simd, const V: usize>(
    rows: &[&mut [f32]],
    first: usize,
    j0: usize,
) -> [[S::f32s; V]; MR] {
    std::array::from_fn(|r| {
        let src = rows.get(first + r).and_then(|row| row.get(j0..j0 + 16 * V));
        std::array::from_fn(|v| match src {
            Some(src) => {
                bytemuck::pod_read_unaligned(bytemuck::cast_slice(&src[v * 16..(v + 1) * 16]))
            }
            None => bytemuck::Zeroable::zeroed(),
        })
    })
}

/// Stores `acc`'s sums into rows `first..first + MR` of `rows`, the `V` vectors from column
/// `j0` (nothing for rows past the task's last).
#[inline(always)]
fn store_sums<S: pulp::Simd, const V: usize>(
    acc: &[[S::f32s; V]; MR],
    rows: &mut [&mut [f32]],
    first: usize,
    j0: usize,
) {
    for (r, v) in acc.iter().enumerate() {
        if let Some(dst) = rows
            .get_mut(first + r)
            .and_then(|row| row.get_mut(j0..j0 + 16 * V))
        {
            for (d, v) in dst.chunks_exact_mut(16).zip(v) {
                d.copy_from_slice(bytemuck::cast_slice(std::slice::from_ref(v)));
            }
        }
    }
}

/// A partial panel's block of sums held between chunks (`MR × 16·V` values, whole vectors).
#[inline(always)]
fn load_held<S: pulp::Simd, const V: usize>(held: &[f32]) -> [[S::f32s; V]; MR] {
    std::array::from_fn(|r| {
        std::array::from_fn(|v| {
            let at = (r * V + v) * 16;
            bytemuck::pod_read_unaligned(bytemuck::cast_slice(&held[at..at + 16]))
        })
    })
}

/// Stores a partial panel's block of sums between chunks ([`load_held`]'s layout).
#[inline(always)]
fn store_held<S: pulp::Simd, const V: usize>(acc: &[[S::f32s; V]; MR], held: &mut [f32]) {
    for (d, v) in held.chunks_exact_mut(16).zip(acc.iter().flatten()) {
        d.copy_from_slice(bytemuck::cast_slice(std::slice::from_ref(v)));
    }
}

/// The error of a step without values for a channel (`conv2d_fused` checks them first).
fn missing(ch: usize) -> String {
    format!("pointwise: the epilogue has no values for channel {ch}")
}

const _: () = assert!(
    MR == 4,
    "Task::panel finishes rows 0 to 3 of each block and block reads four rows of weights"
);

/// Where a block's rows go: the task's rows `first..first + MR` (channels `ch..`), columns
/// `j0..`, element `at` of the output for the block's first row.
struct Row<'s, 'r, 'y, S: pulp::Simd> {
    simd: S,
    steps: RegSteps<'s>,
    rows: &'r mut [&'y mut [f32]],
    first: usize,
    ch: usize,
    j0: usize,
    at: usize,
    n: usize,
}

impl<S: pulp::Simd> Row<'_, '_, '_, S> {
    /// Row `R` of the block (nothing past the last channel), `V` whole vectors: the steps on
    /// its sums in registers, then one store per vector. `false` when a step has no values
    /// for it.
    #[inline(always)]
    fn finish<const R: usize, const V: usize>(&mut self, acc: &[[S::f32s; V]; MR]) -> bool {
        let ch = self.ch + R;
        let Some(dst) = self
            .rows
            .get_mut(self.first + R)
            .and_then(|row| row.get_mut(self.j0..self.j0 + 16 * V))
        else {
            return true;
        };
        let mut v = acc[R];
        let ok = self
            .steps
            .apply_vecs(self.simd, ch, self.at + R * self.n, &mut v);
        for (d, v) in dst.chunks_exact_mut(16).zip(&v) {
            d.copy_from_slice(bytemuck::cast_slice(std::slice::from_ref(v)));
        }
        ok
    }
}

/// [`MR`] channels × `16·V` pixels: `acc` plus `Σ_p w[r][p] · x[p · stride + j]` over the
/// chunk's steps (`w[r]`'s length), one FMA per step in order, held in registers.
#[inline(always)]
fn block<S: pulp::Simd, const V: usize>(
    simd: S,
    mut acc: [[S::f32s; V]; MR],
    w: impl Iterator<Item = [f32; MR]>,
    x: &[f32],
    stride: usize,
) -> [[S::f32s; V]; MR] {
    for (p, wv) in w.enumerate() {
        let Some(xp) = x.get(p * stride..p * stride + 16 * V) else {
            break;
        };
        let xv: [S::f32s; V] = std::array::from_fn(|v| {
            bytemuck::pod_read_unaligned(bytemuck::cast_slice(&xp[v * 16..(v + 1) * 16]))
        });
        for (acc, wv) in acc.iter_mut().zip(wv) {
            let wv = simd.splat_f32s(wv);
            for (s, &xv) in acc.iter_mut().zip(&xv) {
                *s = simd.mul_add_f32s(wv, xv, *s);
            }
        }
    }
    acc
}

/// A block of [`short`]'s packed weights as [`block`]'s steps.
#[inline(always)]
fn steps_of(wb: &[f32]) -> impl Iterator<Item = [f32; MR]> + '_ {
    wb.chunks_exact(MR).map(|q| [q[0], q[1], q[2], q[3]])
}

/// One block's chunk: its sums from `+0.0` (`fresh`) or from where the chunk before held
/// them, plus the chunk's steps `w` over `x`, then [`Task::end_block`]. Each start of the
/// sums has its own call of [`block`], so that no merged value holds them: one array from
/// either start was kept on the stack (zeroed there per block: a sixth of a 32 → 16 layer on
/// 112×112).
#[inline(always)]
#[allow(clippy::too_many_arguments, reason = "a block's operands and place")]
fn block_chunk<S: pulp::Simd, const V: usize>(
    simd: S,
    sink: Sink<'_, '_, '_>,
    w: impl Iterator<Item = [f32; MR]>,
    x: &[f32],
    stride: usize,
    at: &Block,
    fresh: bool,
) -> KResult<()> {
    let zero = simd.splat_f32s(0.0);
    if fresh {
        let acc = block::<S, V>(simd, [[zero; V]; MR], w, x, stride);
        return Task::end_block::<S, V>(sink, simd, &acc, at);
    }
    let acc = if at.width == 16 * V {
        load_sums::<S, V>(sink.rows, at.b * MR, at.j0)
    } else {
        sink.sums
            .get(at.held::<V>())
            .map_or([[zero; V]; MR], load_held::<S, V>)
    };
    let acc = block::<S, V>(simd, acc, w, x, stride);
    Task::end_block::<S, V>(sink, simd, &acc, at)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::panic, reason = "test code: a failure is a panic")]

    use super::super::epilogue::apply_steps;
    use super::*;
    use fusebox_core::runtime::Tensor;

    use crate::util::test_values as values;

    /// The contract's definition, written without the kernel: one scalar `mul_add` chain per
    /// element over `k` in order from `+0.0`, then the steps on each row by the row epilogue.
    fn definition(m: usize, k: usize, n: usize, w: &[f32], x: &[f32], steps: &[Step]) -> Vec<u32> {
        let mut y = vec![0.0f32; m * n];
        for i in 0..m {
            let row = &mut y[i * n..(i + 1) * n];
            for (j, out) in row.iter_mut().enumerate() {
                let mut acc = 0.0f32;
                for p in 0..k {
                    acc = w[i * k + p].mul_add(x[p * n + j], acc);
                }
                *out = acc;
            }
            apply_steps(steps, i, i * n, row);
        }
        y.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn every_element_is_the_fma_chain_then_the_steps_for_shapes_and_thread_counts() {
        if !crate::simd::avx512() {
            let mut y = vec![0.0; 8 * MIN_PIXELS];
            let steps: &[Step] = &[];
            let err = conv1x1(
                8,
                1,
                MIN_PIXELS,
                &[0.0; 8],
                &vec![0.0; MIN_PIXELS],
                &mut y,
                1,
                steps,
                0,
            )
            .unwrap_err();
            assert!(err.contains("AVX-512"), "{err}");
            return;
        }
        // Rows not a multiple of 8; panels whole and a narrow last one; MobileNetV2's 16 → 96
        // and 32 → 16 on 56×56; k = 1 and the largest k taken.
        for (m, k, n) in [
            (8usize, 1usize, 784usize),
            (13, 17, 800),
            (16, 32, 3_136),
            (96, 16, 3_136),
            (20, MAX_K, 1_000),
            // More output than panels can share: the channels split into bands too.
            (400, 2, 784),
            // An output of AHEAD_ELEMS or more: each block prefetches the next one's lines.
            (16, 3, AHEAD_ELEMS.div_ceil(16) + 40),
            // Long reductions in chunks (one step past a chunk; several chunks), on
            // MobileNetV2's 14×14 plane (panels of 4, 4 and 5 vectors, the last partial) and
            // rows of partial vectors: 576 → 96, 384 → 64 and 144 → 24 on 56×56 among them.
            (8, CHUNK_LINES / 4 + 1, 196),
            (96, 576, 196),
            (64, 384, 196),
            (13, 2 * CHUNK_LINES / 4 + 7, 200),
            (24, 144, 3_136),
            (6, 97, 50),
        ] {
            let w = values(m * k, (m * 7 + k) as u64);
            let x = values(k * n, (n * 3 + k) as u64);
            let mut special = values(m * n, 99);
            special[..6].copy_from_slice(&[f32::NAN, -0.0, 0.0, f32::INFINITY, -7.0, 7.0]);
            let residual =
                Tensor::from_f32(vec![1, m, 1, n], special).unwrap_or_else(|e| panic!("{e}"));
            let b: Vec<f32> = values(m, 5).iter().map(|v| v * 3.0).collect();
            let chains: Vec<Vec<Step>> = vec![
                vec![],
                vec![
                    Step::Bias {
                        b: b.clone(),
                        bias_first: false,
                    },
                    Step::Clip { lo: 0.0, hi: 6.0 },
                ],
                vec![
                    Step::Bias {
                        b: b.clone(),
                        bias_first: true,
                    },
                    Step::Relu,
                ],
                vec![Step::Affine {
                    mul: b.clone(),
                    add: values(m, 6),
                }],
                vec![
                    Step::Bias {
                        b: b.clone(),
                        bias_first: false,
                    },
                    Step::Residual {
                        r: residual.clone(),
                        prev_first: true,
                    },
                ],
                vec![
                    Step::Affine {
                        mul: b.clone(),
                        add: values(m, 7),
                    },
                    Step::Residual {
                        r: residual.clone(),
                        prev_first: false,
                    },
                    Step::Relu,
                ],
                vec![
                    Step::Residual {
                        r: residual.clone(),
                        prev_first: false,
                    },
                    Step::Clip { lo: -0.5, hi: 0.5 },
                ],
                vec![Step::Relu],
                vec![
                    Step::Bias {
                        b: b.clone(),
                        bias_first: false,
                    },
                    Step::Silu,
                ],
                vec![
                    Step::Affine {
                        mul: b.clone(),
                        add: values(m, 8),
                    },
                    Step::Residual {
                        r: residual.clone(),
                        prev_first: true,
                    },
                    Step::Silu,
                ],
            ];
            for steps in &chains {
                let want = definition(m, k, n, &w, &x, steps);
                assert!(RegSteps::new(steps).is_some(), "{steps:?} not taken");
                for threads in [1, 2, 3] {
                    let mut y = vec![f32::NAN; m * n];
                    crate::par::with_threads(threads, || {
                        conv1x1(m, k, n, &w, &x, &mut y, threads, steps, 0)
                    })
                    .unwrap_or_else(|e| panic!("{e}"));
                    let got: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
                    assert!(got == want, "{m}x{k}x{n}, {steps:?}, {threads} threads");
                }
            }
        }
    }

    #[test]
    fn panels_cover_the_row_in_runs_of_at_most_nv_vectors_as_even_as_whole_vectors_allow() {
        assert_eq!(panels(196), vec![(0, 4), (64, 4), (128, 5)]);
        for n in [
            1usize, 15, 16, 17, 95, 96, 97, 196, 784, 3_136, 12_544, 12_545,
        ] {
            let plan = panels(n);
            let mut at = 0;
            for &(start, vecs) in &plan {
                assert_eq!(start, at, "{n}: {plan:?}");
                assert!((1..=NV).contains(&vecs), "{n}: {plan:?}");
                at += 16 * vecs;
            }
            assert_eq!(at, n.next_multiple_of(16), "{n}: {plan:?}");
            let most = plan.iter().map(|p| p.1).max().unwrap_or(0);
            let least = plan.iter().map(|p| p.1).min().unwrap_or(0);
            assert!(most - least <= 1, "{n}: {plan:?}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Any sizes on either path (chunked or not, whole and partial panels, bands or runs
        /// of panels) and thread counts: each element the definition's chain then the steps,
        /// bit for bit.
        #[test]
        fn any_shape_is_the_definition(
            m in MR..30, k in 1usize..300, n in 1usize..700, threads in 1usize..4,
            epilogue in 0usize..3, seed in 0u64..1000,
        ) {
            let w = values(m * k, seed);
            let x = values(k * n, seed + 1);
            let b: Vec<f32> = values(m, seed + 2).iter().map(|v| v * 3.0).collect();
            let residual = Tensor::from_f32(vec![1, m, 1, n], values(m * n, seed + 3))
                .unwrap_or_else(|e| panic!("{e}"));
            let steps = match epilogue {
                0 => vec![],
                1 => vec![Step::Bias { b, bias_first: false }, Step::Relu],
                _ => vec![
                    Step::Residual { r: residual, prev_first: true },
                    Step::Clip { lo: -0.5, hi: 0.5 },
                ],
            };
            let want = definition(m, k, n, &w, &x, &steps);
            let mut y = vec![f32::NAN; m * n];
            let r = crate::par::with_threads(threads, || {
                conv1x1(m, k, n, &w, &x, &mut y, threads, &steps, 0)
            });
            if !crate::simd::avx512() {
                // Refused, naming what it needs.
                let err = r.err().unwrap_or_default();
                proptest::prop_assert!(err.contains("AVX-512"), "{}", err);
                return Ok(());
            }
            r.unwrap_or_else(|e| panic!("{e}"));
            let got: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
            proptest::prop_assert!(got == want, "{}x{}x{}, {} threads", m, k, n, threads);
        }
    }

    #[test]
    fn other_step_shapes_wrong_sizes_and_small_shapes_are_refused() {
        let b = vec![1.0; 8];
        assert!(RegSteps::new(&[Step::Relu, Step::Relu]).is_none());
        assert!(
            RegSteps::new(&[
                Step::Clip { lo: 0.0, hi: 6.0 },
                Step::Bias {
                    b: b.clone(),
                    bias_first: false
                }
            ])
            .is_none()
        );
        let steps: &[Step] = &[];
        let mut y = vec![0.0; 8 * 3];
        let err = conv1x1(8, 2, 3, &[0.0; 16], &[0.0; 5], &mut y, 1, steps, 0).unwrap_err();
        assert!(err.contains("8x2 @ 2x3"), "{err}");
        let mut y = vec![0.0; 3 * MIN_PIXELS];
        let err = conv1x1(
            3,
            1,
            MIN_PIXELS,
            &[0.0; 3],
            &vec![0.0; MIN_PIXELS],
            &mut y,
            1,
            steps,
            0,
        )
        .unwrap_err();
        assert!(err.contains("at least 4 output channels"), "{err}");
        let mut y = vec![0.0; 8 * MIN_PIXELS];
        let err = conv1x1(8, 0, MIN_PIXELS, &[], &[], &mut y, 1, steps, 0).unwrap_err();
        assert!(err.contains("at least one input channel"), "{err}");
        assert_eq!(takes(96, MAX_K + 1, 12_544, &[]), long_cpu());
        assert!(!takes(96, MAX_K + 1, MIN_PIXELS_LONG - 1, &[]));
        assert!(!takes(96, 16, MIN_PIXELS - 1, &[]));
        assert!(!takes(96, 16, 12_544, &[Step::Relu, Step::Relu]));
    }
}
