//! The 1×1 convolution (stride 1, no padding, one group) of an `NCHW16c` image into an
//! `NCHW16c` output, the weight in `OIHW`: each output vector is 16 consecutive output
//! channels of one pixel, so the channel counts (multiples of 16) fill the vectors and the
//! pixel count of a small plane (196, 49) costs only a narrower last tile, not wasted lanes.
//!
//! Contract:
//!
//! - `x` is `[n][C/16][P][16]`, `y` `[n][O/16][P][16]` (`P` pixels per plane), the weight is
//!   packed once ([`pack`]) as groups of up to 4 output blocks: for each input channel, the
//!   group's 16–64 weights in a row.
//! - Every element of `y` is one chain of `f32` fused multiply-adds over the input channels in
//!   order from `+0.0`, then the epilogue's steps ([`RegSteps::apply_block`]: bias or
//!   `batch_norm`, residual add in the output's layout, `relu`/`clip`), the same operations
//!   per element as the `NCHW` paths. The result does not depend on the tiling or the thread
//!   count.
//! - AVX-512 only ([`takes`]): a tile holds 6 pixels × 64 channels in 24 registers (four
//!   separate accumulator arrays: one `[[_; 6]; 4]` array was spilled to the stack, 2.1–2.7×
//!   slower), per input channel 4 weight vectors and 6 broadcast pixels. Input channels run in
//!   chunks of 128 whose weights (32 KB) stay in L1 while the tile sweeps the plane; a chunk's
//!   partial sums go to the output and come back for the next. The epilogue runs on the last
//!   chunk's sums in registers before their one final store.
//! - Tasks are (image, group of output blocks, run of pixels): a plane is cut into runs of
//!   whole tiles when there are fewer groups than twice the threads.
//! - Why: on twelve of ResNet-50's 14×14 1×1 layers (1024 ↔ 256) a prototype of this kernel
//!   took 0.83–0.87 of the time of the `NCHW` path (`faer` and the row epilogue) on one
//!   thread and 0.81–0.89 on two (bench/RESULTS.md, session as).
//!
//! ```text
//! y = R.nn.conv2d(x, w, data_layout="NCHW16c", kernel_layout="OIHW", out_layout="NCHW16c")
//! ; x: (1, 64, 14, 14, 16) (1024 channels), w: (256, 1024, 1, 1) -> y: (1, 16, 14, 14, 16)
//! ; 4 groups of 4 blocks; per group 33 tiles of 6 pixels (the last of 4), 8 chunks of 128
//! ```

use super::epilogue::{RegSteps, Step};
use crate::util::KResult;

/// Channels per block (the `16` of `NCHW16c`, one AVX-512 vector).
pub(crate) const BLOCK: usize = 16;
/// The data and output layout of [`conv1x1`].
pub(crate) const LAYOUT: &str = "NCHW16c";
/// Pixels per register tile.
const PXT: usize = 6;
/// Output blocks per group (a tile's channels: 4 × 16).
const OBG: usize = 4;
/// Input channels per chunk (a group's weights for one chunk: 4 × 16 × 128 floats, 32 KB).
const CCH: usize = 128;
/// The fewest pixels a task takes when a plane is cut into runs.
const MIN_RUN: usize = 8 * PXT;

/// A weight packed for [`conv1x1`]: groups of up to [`OBG`] output blocks, each `[c][blocks
/// of the group][16]`.
#[derive(Debug)]
pub(crate) struct Packed {
    o: usize,
    c: usize,
    data: Vec<f32>,
}

/// Packs a 1×1 weight `w` (`o × c`, row-major: `OIHW` with unit kernel) for [`conv1x1`];
/// `None` when `o` or `c` is not a multiple of [`BLOCK`] or `w` has another length.
pub(crate) fn pack(w: &[f32], o: usize, c: usize) -> Option<Packed> {
    if !o.is_multiple_of(BLOCK)
        || !c.is_multiple_of(BLOCK)
        || w.len() != o.checked_mul(c)?
        || o == 0
        || c == 0
    {
        return None;
    }
    let blocks = o / BLOCK;
    let mut data = vec![0.0f32; o * c];
    let mut at = 0;
    for g0 in (0..blocks).step_by(OBG) {
        let nb = (blocks - g0).min(OBG);
        for ci in 0..c {
            for b in 0..nb {
                for l in 0..BLOCK {
                    data[at] = w[((g0 + b) * BLOCK + l) * c + ci];
                    at += 1;
                }
            }
        }
    }
    Some(Packed { o, c, data })
}

/// Whether [`conv1x1`] runs a convolution of `c` input and `o` output channels with these
/// epilogue steps on this CPU.
pub(crate) fn takes(o: usize, c: usize, steps: &[Step]) -> bool {
    o.is_multiple_of(BLOCK)
        && c.is_multiple_of(BLOCK)
        && o > 0
        && c > 0
        && crate::simd::avx512()
        && crate::simd::f32_lanes() == BLOCK
        && RegSteps::new(steps).is_some()
}

/// One task's share of the output: for each output block of its group, the run of pixels
/// `p0..p1` of image `n` (`[p][16]`).
struct Task<'a> {
    n: usize,
    g0: usize,
    p0: usize,
    p1: usize,
    out: Vec<&'a mut [f32]>,
}

/// `y = conv2d(x, w)` then `steps` (see the module doc): `x` `[n][c/16][p][16]`, `y`
/// `[n][o/16][p][16]`, on up to `threads` threads.
pub(crate) fn conv1x1(
    w: &Packed,
    x: &[f32],
    n: usize,
    p: usize,
    y: &mut [f32],
    threads: usize,
    steps: &[Step],
) -> KResult<()> {
    let (o, c) = (w.o, w.c);
    if x.len() != n * c * p || y.len() != n * o * p {
        return Err(format!(
            "blocked 1x1 convolution: expected {} inputs and {} outputs for {n} images of \
             {c} -> {o} channels on {p} pixels, found {} and {}",
            n * c * p,
            n * o * p,
            x.len(),
            y.len()
        ));
    }
    let reg = RegSteps::new(steps).ok_or("blocked 1x1 convolution: unsupported epilogue")?;
    if p == 0 || n == 0 {
        return Ok(());
    }
    let blocks = o / BLOCK;
    let groups = blocks.div_ceil(OBG);
    // Runs of pixels per plane: enough tasks for the threads, whole tiles each.
    let want = (2 * threads).div_ceil(n * groups).max(1);
    let runs = want.min(p.div_ceil(MIN_RUN)).max(1);
    let run = p.div_ceil(runs).next_multiple_of(PXT).min(p);
    let mut tasks: Vec<Task<'_>> = Vec::new();
    for (ni, img) in y.chunks_mut(o * p).enumerate() {
        // Each block's plane cut into its runs, then gathered by (group, run).
        let mut pieces: Vec<Vec<&mut [f32]>> = img
            .chunks_mut(p * BLOCK)
            .map(|plane| plane.chunks_mut(run * BLOCK).collect())
            .collect();
        for g in 0..groups {
            let g0 = g * OBG;
            let nb = (blocks - g0).min(OBG);
            let nruns = pieces.get(g0).map_or(0, Vec::len);
            let mut by_run: Vec<Vec<&mut [f32]>> = (0..nruns).map(|_| Vec::new()).collect();
            for plane in pieces.iter_mut().skip(g0).take(nb) {
                for (r, piece) in std::mem::take(plane).into_iter().enumerate() {
                    if let Some(v) = by_run.get_mut(r) {
                        v.push(piece);
                    }
                }
            }
            for (r, out) in by_run.into_iter().enumerate() {
                tasks.push(Task {
                    n: ni,
                    g0,
                    p0: r * run,
                    p1: ((r + 1) * run).min(p),
                    out,
                });
            }
        }
    }
    crate::par::run_tasks(tasks, threads, |t| {
        crate::simd::dispatch(Kernel {
            w,
            x,
            p,
            reg,
            task: t,
        });
        Ok::<(), String>(())
    })
}

struct Kernel<'a, 'b> {
    w: &'a Packed,
    x: &'a [f32],
    p: usize,
    reg: RegSteps<'a>,
    task: Task<'b>,
}

impl pulp::WithSimd for Kernel<'_, '_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) {
        if S::F32_LANES != BLOCK {
            return;
        }
        match self.task.out.len() {
            4 => run_task::<S, 4>(simd, self),
            3 => run_task::<S, 3>(simd, self),
            2 => run_task::<S, 2>(simd, self),
            _ => run_task::<S, 1>(simd, self),
        }
    }
}

/// The constant parts of one task's tiles.
struct Tile<'a> {
    /// The image's input (`[c/16][p][16]`).
    x: &'a [f32],
    /// The group's packed weights (`[c][nb][16]`).
    wg: &'a [f32],
    c: usize,
    p: usize,
    /// The first output block of the group and the first element of the image's output.
    g0: usize,
    img: usize,
    /// The task's first pixel.
    p0: usize,
    reg: RegSteps<'a>,
}

#[inline(always)]
fn run_task<S: pulp::Simd, const NB: usize>(simd: S, k: Kernel<'_, '_>) {
    let Kernel { w, x, p, reg, task } = k;
    let c = w.c;
    let Task {
        n,
        g0,
        p0,
        p1,
        mut out,
    } = task;
    let blocks = w.o / BLOCK;
    let wg_at = g0 * BLOCK * c;
    let (Some(wg), Some(xi)) = (
        w.data.get(wg_at..wg_at + NB * BLOCK * c),
        x.get(n * c * p..(n + 1) * c * p),
    ) else {
        return;
    };
    let t = Tile {
        x: xi,
        wg,
        c,
        p,
        g0,
        img: n * blocks * BLOCK * p,
        p0,
        reg,
    };
    let Ok::<&mut [&mut [f32]; NB], _>(out) = out.as_mut_slice().try_into() else {
        return;
    };
    for c0 in (0..c).step_by(CCH) {
        let c1 = (c0 + CCH).min(c);
        let mut q = p0;
        while q + PXT <= p1 {
            tile::<S, PXT, NB>(simd, &t, out, (c0, c1), q);
            q += PXT;
        }
        match p1 - q {
            0 => {}
            1 => tile::<S, 1, NB>(simd, &t, out, (c0, c1), q),
            2 => tile::<S, 2, NB>(simd, &t, out, (c0, c1), q),
            3 => tile::<S, 3, NB>(simd, &t, out, (c0, c1), q),
            4 => tile::<S, 4, NB>(simd, &t, out, (c0, c1), q),
            _ => tile::<S, 5, NB>(simd, &t, out, (c0, c1), q),
        }
    }
}

/// One vector from a slice of exactly [`BLOCK`] values.
#[inline(always)]
fn ld16<S: pulp::Simd>(s: &[f32]) -> S::f32s {
    bytemuck::pod_read_unaligned(bytemuck::cast_slice(s))
}

#[inline(always)]
fn ld<S: pulp::Simd>(s: &[f32]) -> Option<S::f32s> {
    s.get(..BLOCK)
        .map(|v| bytemuck::pod_read_unaligned(bytemuck::cast_slice(v)))
}

/// Pixels `q..q + PX` of the task's blocks over input channels `c0..c1`: the sums so far
/// (from the output, unless `c0` is 0) plus this chunk's products; on the last chunk the
/// epilogue, then one store per vector.
#[inline(always)]
fn tile<S: pulp::Simd, const PX: usize, const NB: usize>(
    simd: S,
    t: &Tile<'_>,
    out: &mut [&mut [f32]; NB],
    (c0, c1): (usize, usize),
    q: usize,
) {
    let zero = simd.splat_f32s(0.0);
    let local = |j: usize| (q - t.p0 + j) * BLOCK;
    let mut acc = [[zero; PX]; 4];
    if c0 > 0 {
        for (accb, o) in acc.iter_mut().zip(out.iter()) {
            for (j, a) in accb.iter_mut().enumerate() {
                *a = o.get(local(j)..).and_then(ld::<S>).unwrap_or(zero);
            }
        }
    }
    let [mut a0, mut a1, mut a2, mut a3] = acc;
    let row = NB * BLOCK;
    let Some(wch) = t.wg.get(c0 * row..c1 * row) else {
        return;
    };
    for (st, wl) in wch.chunks_exact(row).enumerate() {
        let ci = c0 + st;
        let at = ((ci / BLOCK) * t.p + q) * BLOCK + ci % BLOCK;
        let Some(xs) = t.x.get(at..at + (PX - 1) * BLOCK + 1) else {
            break;
        };
        // `wl` is one row of `NB` blocks (`chunks_exact`): these slices are in bounds.
        let w0 = ld16::<S>(&wl[..BLOCK]);
        let w1 = if NB > 1 {
            ld16::<S>(&wl[BLOCK..2 * BLOCK])
        } else {
            zero
        };
        let w2 = if NB > 2 {
            ld16::<S>(&wl[2 * BLOCK..3 * BLOCK])
        } else {
            zero
        };
        let w3 = if NB > 3 {
            ld16::<S>(&wl[3 * BLOCK..4 * BLOCK])
        } else {
            zero
        };
        for j in 0..PX {
            let xv = simd.splat_f32s(xs[j * BLOCK]);
            a0[j] = simd.mul_add_f32s(w0, xv, a0[j]);
            if NB > 1 {
                a1[j] = simd.mul_add_f32s(w1, xv, a1[j]);
            }
            if NB > 2 {
                a2[j] = simd.mul_add_f32s(w2, xv, a2[j]);
            }
            if NB > 3 {
                a3[j] = simd.mul_add_f32s(w3, xv, a3[j]);
            }
        }
    }
    let acc = [a0, a1, a2, a3];
    let last = c1 == t.c;
    for (b, (accb, o)) in acc.iter().zip(out.iter_mut()).enumerate() {
        let ob = t.g0 + b;
        for (j, &v) in accb.iter().enumerate() {
            let mut v = v;
            if last {
                let at = t.img + (ob * t.p + q + j) * BLOCK;
                t.reg.apply_block(simd, ob * BLOCK, at, &mut v);
            }
            if let Some(dst) = o.get_mut(local(j)..local(j) + BLOCK) {
                dst.copy_from_slice(bytemuck::cast_slice(std::slice::from_ref(&v)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusebox_core::runtime::Tensor;

    fn rand(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((((i + seed * 7919) * 104_729) % 2001) as f32 / 1000.0 - 1.0) * 0.25)
            .collect()
    }

    /// What an epilogue makes of output element `i` with sum `v`.
    type Expect = Box<dyn Fn(usize, f32) -> f32>;

    /// `[c][p]` to `[c/16][p][16]`.
    fn block(v: &[f32], c: usize, p: usize) -> Vec<f32> {
        let mut out = vec![0.0; c * p];
        for ch in 0..c {
            for px in 0..p {
                out[((ch / 16) * p + px) * 16 + ch % 16] = v[ch * p + px];
            }
        }
        out
    }

    #[test]
    fn matches_a_direct_sum_with_every_epilogue_and_thread_count() {
        if !(crate::simd::avx512() && crate::simd::f32_lanes() == BLOCK) {
            // Not an AVX-512 machine: `takes` says no and the convolution runs elsewhere.
            assert!(!takes(16, 16, &[]));
            return;
        }
        // Channel counts with 1–4 blocks in the last group, planes with every tile remainder,
        // more than one chunk of input channels.
        for &(c, o, p, n) in &[
            (16, 16, 1, 1),
            (32, 48, 7, 2),
            (144, 80, 13, 1),
            (256, 64, 49, 1),
            (48, 112, 100, 1),
        ] {
            let (x, w) = (rand(n * c * p, c + p), rand(o * c, o));
            let bias = rand(o, 7);
            let resid = rand(n * o * p, 9);
            // The reference, `[n][o][p]`, with the same chain of fused multiply-adds.
            let mut want = vec![0.0f32; n * o * p];
            for ni in 0..n {
                for oc in 0..o {
                    for px in 0..p {
                        let mut s = 0.0f32;
                        for ci in 0..c {
                            s = w[oc * c + ci].mul_add(x[(ni * c + ci) * p + px], s);
                        }
                        want[(ni * o + oc) * p + px] = s;
                    }
                }
            }
            let blocked_want: Vec<f32> = (0..n)
                .flat_map(|ni| block(&want[ni * o * p..(ni + 1) * o * p], o, p))
                .collect();
            let xb: Vec<f32> = (0..n)
                .flat_map(|ni| block(&x[ni * c * p..(ni + 1) * c * p], c, p))
                .collect();
            let packed = pack(&w, o, c).unwrap();
            let r = Tensor::from_f32(vec![blocked_want.len()], resid.clone()).unwrap();
            let cases: Vec<(Vec<Step>, Expect)> = vec![
                (vec![], Box::new(|_, v| v)),
                (
                    vec![
                        Step::Bias {
                            b: bias.clone(),
                            bias_first: false,
                        },
                        Step::Residual {
                            r: r.clone(),
                            prev_first: true,
                        },
                        Step::Relu,
                    ],
                    Box::new({
                        let (bias, resid) = (bias.clone(), resid.clone());
                        move |i, v| {
                            let ch = (i / (16 * p)) % (o / 16) * 16 + i % 16;
                            (v + bias[ch] + resid[i]).max(0.0)
                        }
                    }),
                ),
                (
                    vec![Step::Clip { lo: 0.0, hi: 0.05 }],
                    Box::new(|_, v| v.clamp(0.0, 0.05)),
                ),
            ];
            for (steps, f) in &cases {
                let expect: Vec<f32> = blocked_want
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| f(i, v))
                    .collect();
                for threads in [1, 2, 3] {
                    let mut y = vec![f32::NAN; n * o * p];
                    conv1x1(&packed, &xb, n, p, &mut y, threads, steps).unwrap();
                    assert_eq!(y, expect, "c {c} o {o} p {p} n {n} threads {threads}");
                }
            }
        }
    }

    #[test]
    fn packing_and_sizes_are_checked() {
        assert!(pack(&[0.0; 12], 12, 1).is_none());
        assert!(pack(&[0.0; 32], 16, 2).is_none());
        assert!(pack(&[0.0; 255], 16, 16).is_none());
        let w = pack(&[1.0; 512], 16, 32).unwrap();
        let mut y = vec![0.0; 16];
        let e = conv1x1(&w, &[0.0; 16], 1, 1, &mut y, 1, &[]).unwrap_err();
        assert!(e.contains("expected 32 inputs"), "{e}");
    }
}
