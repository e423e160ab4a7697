//! The 1×1 convolution of an `NCHW` image on a large plane with few input channels: `y = w · x`
//! with `w` the weight (`m × k`: output by input channels), `x` the image (`k × n`: channels
//! by pixels, read where it lies) and `y` the output (`m × n`), each block of sums finished in
//! registers (bias, `batch_norm`, residual add, `relu`, `clip`: [`RegSteps`]) and stored once.
//!
//! Contract:
//!
//! - Every element of `y` is one chain of `f32` fused multiply-adds over `k` in order, from
//!   `+0.0`: `y = fma(w[i][p], x[p][j], y)` for `p = 0..k`, computed whole by one micro-kernel
//!   call, then the epilogue's steps as [`RegSteps::apply_vecs`] (whole panels) or the row
//!   epilogue itself ([`apply_steps_inline`], a narrow last one) give them. The
//!   result does not depend on the tiling or the thread count.
//! - AVX-512 only (16-lane vectors; [`takes`] says no elsewhere and the convolution keeps
//!   `faer`'s GEMM). The micro-kernel holds 4 output channels × 96 pixels (6 vectors) in 24 of
//!   the 32 registers over all of `k`: per step, 6 loads of a row of `x` and 4 broadcast
//!   weights from a copy of `w` interleaved by step (made once per call) — `faer`'s own
//!   `m96_n4` shape (an 8 × 48 block, 8 broadcasts per 24 multiply-adds, ran slower). Tasks
//!   are runs of whole 96-pixel panels by bands of channels; for each panel every block of 4
//!   channels runs in turn, so the panel (`k × 96` values) comes from memory once and then
//!   from L1. The last panel of a row, when narrower, runs as the fewest vectors that cover
//!   it, on a zero-padded copy.
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
//!   session ak).
//!
//! ```text
//! lv = R.nn.conv2d(x, w)   # x: (1, 16, 112, 112), w: (96, 16, 1, 1)
//! gv = R.clip(R.add(lv, b), 0, 6)
//! ; w (96 × 16) · x (16 × 12544, in place): 130 panels of 96 pixels and one of 64 (4
//! ; vectors), 24 blocks of 4 channels each; each block's sums + b, clipped, stored once
//! ```

use super::epilogue::{RegSteps, Step, apply_steps_inline};
use crate::util::KResult;

/// Output channels per micro-kernel block.
const MR: usize = 4;

/// Pixels per panel: 6 vectors of 16 lanes.
const NV: usize = 6;
const NR: usize = NV * 16;

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

/// The most input channels [`takes`] accepts. One-layer models (conv + bias + clip), against
/// `faer` and the row epilogue, minima of alternated runs (bench/RESULTS.md, session ak): with
/// 16–32 input channels faster on every plane of 28×28 and more, one and two threads; with
/// 64–96 on 56×56 faster on one thread but even or slower on two (64 → 256: 0.585 against
/// 0.573 ms), with 128 and more on 28×28 slower (`faer` blocks `k` so that its panel stays in
/// L1; here a panel of `k × 96` values is read again by every block of channels).
pub(crate) const MAX_K: usize = 32;

/// The fewest pixels [`takes`] accepts: on 14×14 planes (three panels, the channels split
/// between the threads too) 96 → 576 took 0.157 ms against `faer`'s 0.128 on two threads.
pub(crate) const MIN_PIXELS: usize = 28 * 28;

/// Whether this kernel computes a 1×1 convolution of `m` output and `k` input channels on `n`
/// pixels, with `steps` as its epilogue, on this CPU.
pub(crate) fn takes(m: usize, k: usize, n: usize, steps: &[Step]) -> bool {
    fits(m, k, n) && RegSteps::new(steps).is_some()
}

/// [`takes`] without the epilogue: the sizes and the CPU.
fn fits(m: usize, k: usize, n: usize) -> bool {
    m >= MR && (1..=MAX_K).contains(&k) && n >= MIN_PIXELS && crate::simd::avx512()
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
        Some(reg) if fits(m, k, n) => reg,
        _ => {
            return Err(format!(
                "pointwise: the kernel takes AVX-512, at least {MR} output channels, 1 to \
                 {MAX_K} input channels, {MIN_PIXELS} pixels and an epilogue of bias or \
                 batch_norm, residual, relu or clip; found {m}, {k} and {n}, {} steps",
                steps.len()
            ));
        }
    };
    // The weights in blocks of MR rows, each step-major (`k × MR`), the last block's missing
    // rows zero.
    let blocks = m.div_ceil(MR);
    let mut wpack = vec![0.0f32; blocks * k * MR];
    for (b, dst) in wpack.chunks_exact_mut(k * MR).enumerate() {
        for r in 0..MR.min(m - b * MR) {
            let row = &w[(b * MR + r) * k..(b * MR + r + 1) * k];
            for (p, &v) in row.iter().enumerate() {
                dst[p * MR + r] = v;
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
    let chans: Vec<usize> = (0..=bands)
        .map(|t| (blocks * t / bands * MR).min(m))
        .collect();
    let mut tasks: Vec<(usize, usize, Vec<&mut [f32]>)> = Vec::with_capacity(runs * bands);
    for band in chans.windows(2) {
        for run in cols.windows(2) {
            tasks.push((band[0], run[0], Vec::with_capacity(band[1] - band[0])));
        }
    }
    for (i, row) in y.chunks_exact_mut(n).enumerate() {
        let band = chans.windows(2).position(|b| i < b[1]).unwrap_or(0);
        let mut rest = row;
        for ((_, _, rows), run) in tasks[band * runs..(band + 1) * runs]
            .iter_mut()
            .zip(cols.windows(2))
        {
            let (part, tail) = rest.split_at_mut(run[1] - run[0]);
            rows.push(part);
            rest = tail;
        }
    }
    let threads = threads.min(tasks.len()).max(1);
    let wpack = &wpack[..];
    let ahead = m * n >= AHEAD_ELEMS;
    crate::par::run_tasks(tasks, threads, |(ch0, c0, mut rows)| {
        let blocks = ch0 / MR..(ch0 + rows.len()).div_ceil(MR);
        crate::simd::dispatch(Task {
            wpack: &wpack[blocks.start * k * MR..blocks.end * k * MR],
            k,
            x,
            n,
            ch0,
            c0,
            rows: &mut rows,
            reg,
            steps,
            base,
            ahead,
        })
    })
}

/// One task: rows `ch0..` of `y` (`rows`, one slice each, a multiple of [`MR`] from the
/// first), columns `c0..`; `wpack` holds the blocks of those rows.
struct Task<'a, 'r, 'y> {
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

impl pulp::WithSimd for Task<'_, '_, '_> {
    type Output = KResult<()>;
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) -> KResult<()> {
        let Task {
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
                let acc = block::<S, NV>(simd, wb, panel, n, k);
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
                let ok = row.finish::<0>(&acc)
                    & row.finish::<1>(&acc)
                    & row.finish::<2>(&acc)
                    & row.finish::<3>(&acc);
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
            let acc = block::<S, V>(self.simd, wb, &panel, w, k);
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

/// The error of a step without values for a channel (`conv2d_fused` checks them first).
fn missing(ch: usize) -> String {
    format!("pointwise: the epilogue has no values for channel {ch}")
}

const _: () = assert!(
    MR == 4,
    "Task::with_simd finishes rows 0 to 3 of each block"
);

/// Where a block's rows go: the task's rows `first..first + MR` (channels `ch..`), columns
/// `j0..j0 + NR`, element `at` of the output for the block's first row.
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
    /// Row `R` of the block (nothing past the last channel): the steps on its sums in
    /// registers, then one store per vector. `false` when a step has no values for it.
    #[inline(always)]
    fn finish<const R: usize>(&mut self, acc: &[[S::f32s; NV]; MR]) -> bool {
        let ch = self.ch + R;
        let Some(dst) = self
            .rows
            .get_mut(self.first + R)
            .and_then(|row| row.get_mut(self.j0..self.j0 + NR))
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

/// [`MR`] channels × `16·V` pixels: `Σ_p wb[p][r] · panel[p · stride + j]`, one FMA per step in
/// order from `+0.0`, held in registers over all of `k`.
#[inline(always)]
fn block<S: pulp::Simd, const V: usize>(
    simd: S,
    wb: &[f32],
    panel: &[f32],
    stride: usize,
    k: usize,
) -> [[S::f32s; V]; MR] {
    let zero = simd.splat_f32s(0.0);
    let mut acc = [[zero; V]; MR];
    for p in 0..k {
        let (Some(wv), Some(xp)) = (
            wb.get(p * MR..(p + 1) * MR),
            panel.get(p * stride..p * stride + 16 * V),
        ) else {
            break;
        };
        let xv: [S::f32s; V] = std::array::from_fn(|v| {
            bytemuck::pod_read_unaligned(bytemuck::cast_slice(&xp[v * 16..(v + 1) * 16]))
        });
        for (acc, &wv) in acc.iter_mut().zip(wv) {
            let wv = simd.splat_f32s(wv);
            for (a, &xv) in acc.iter_mut().zip(&xv) {
                *a = simd.mul_add_f32s(wv, xv, *a);
            }
        }
    }
    acc
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
        assert!(!takes(96, MAX_K + 1, 12_544, &[]));
        assert!(!takes(96, 16, MIN_PIXELS - 1, &[]));
        assert!(!takes(96, 16, 12_544, &[Step::Relu, Step::Relu]));
    }
}
