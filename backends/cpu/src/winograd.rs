//! Winograd F(2×2, 3×3) convolution: the fast path of [`crate::conv`] for 3×3 kernels with
//! stride 1, dilation 1 and one group (the 3×3 layers of ResNet-style networks).
//!
//! Contract:
//!
//! - Each 2×2 output tile is computed from the 4×4 input tile around it (zero beyond the
//!   data, as the padding is) as `Y = Aᵀ [Σ_c (G g_c Gᵀ) ⊙ (Bᵀ d_c B)] A` (Lavin & Gray, "Fast
//!   Algorithms for Convolutional Neural Networks", 2016). The 16 elementwise products summed
//!   over the channels are 16 GEMMs, `(O × C) @ (C × tiles)`, on `faer`; so a 3×3 layer takes
//!   16 multiply-adds per 4 outputs and channel instead of 36 (2.25× fewer). With fewer than
//!   64 tiles (a 14×14 output has 49) each GEMM is computed transposed, `(tiles × C) @ (C ×
//!   O)`, so that the output channels rather than the tiles lie on faer's vector lanes (49
//!   tiles fill 49 of 64), and its result transposed back: ResNet-50's 256×14×14 layers take
//!   0.8–0.9 of their former time in the model (their weights streamed from memory), the model
//!   0.96–0.98 (bench/RESULTS.md, session k).
//! - The weight transform `G g Gᵀ` is computed in `f64` and rounded once ([`Weights`]); the
//!   executor computes it once per constant weight. The data and output transforms are
//!   additions and subtractions in `f32`. Against the direct sum the result differs by a few
//!   units in the last place of the largest terms (the transforms' sums), well within the
//!   tolerances `--check` and the onnxruntime comparison use.
//! - Two ways to spread the work, chosen by the shape ([`local_rows`]): one block of tile rows
//!   at a time with each phase (data transform, the 16 GEMMs, output transform) spread over the
//!   threads; or, where the transformed weights are small (ResNet's 64×56×56 and 128×28×28
//!   layers), the blocks themselves as tasks, each whole on one thread, so that no block's
//!   transformed data passes between cores (which cost 1.4–1.9× in this VM's slow stretches,
//!   perhaps when its two vCPUs sit on different L3 caches).
//! - Deterministic: the tiles are cut into blocks of whole tile rows by the shape alone, and
//!   every output element is computed by the same operations in the same order whatever the
//!   number of threads or the blocks (each GEMM is one sequential `faer` call), so results are
//!   bit-identical for every thread count, fused or not.
//!
//! ```text
//! y: R.Tensor((1, 64, 56, 56), dtype="float32") = R.nn.conv2d(x, w, strides=[1, 1],
//!     padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NCHW",
//!     kernel_layout="OIHW", out_layout="NCHW", out_dtype=None)   # w: (64, 64, 3, 3)
//! ```

use crate::util::KResult;
use faer::reborrow::ReborrowMut;
use faer::{Accum, MatMut, MatRef, Par};
use std::cell::RefCell;

/// The 16 positions of a transformed 4×4 tile.
const XI: usize = 16;

/// The elements of the transformed data and of the GEMMs' results per block: 1 Mi (4 MiB). On
/// ResNet-50, fewer and longer GEMMs paid more than blocks that stay in a core's L2 (2 MiB
/// here), which cut a 56×56 layer into seven 112-tile GEMMs per position.
const BLOCK_ELEMS: usize = 1 << 20;

/// The transformed weights of an `O × C × 3 × 3` kernel, `Uᵀ` per tile position:
/// `u[ξ][c][o] = (G g_{o,c} Gᵀ)[ξ]`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Weights {
    o: usize,
    c: usize,
    u: Vec<f32>,
}

impl Weights {
    /// The transform of `w` (`OIHW`, `o × c × 3 × 3`), computed in `f64` and rounded once.
    pub(crate) fn new(w: &[f32], o: usize, c: usize) -> KResult<Weights> {
        if w.len() != o * c * 9 {
            return Err(format!(
                "winograd: a {o}x{c}x3x3 kernel needs {} elements, found {}",
                o * c * 9,
                w.len()
            ));
        }
        let mut u = vec![0.0f32; XI * o * c];
        for (oc, g) in w.chunks_exact(9).enumerate() {
            let g: [f64; 9] = std::array::from_fn(|i| f64::from(g[i]));
            // G g: 4 × 3, rows g0, (g0 + g1 + g2) / 2, (g0 - g1 + g2) / 2, g2.
            let mut gg = [[0.0f64; 3]; 4];
            for j in 0..3 {
                let (g0, g1, g2) = (g[j], g[3 + j], g[6 + j]);
                gg[0][j] = g0;
                gg[1][j] = (g0 + g1 + g2) * 0.5;
                gg[2][j] = (g0 - g1 + g2) * 0.5;
                gg[3][j] = g2;
            }
            // (G g) Gᵀ: the same on each row.
            for (i, r) in gg.iter().enumerate() {
                let (g0, g1, g2) = (r[0], r[1], r[2]);
                let row = [g0, (g0 + g1 + g2) * 0.5, (g0 - g1 + g2) * 0.5, g2];
                for (k, v) in row.into_iter().enumerate() {
                    u[(4 * i + k) * o * c + (oc % c) * o + oc / c] = v as f32;
                }
            }
        }
        Ok(Weights { o, c, u })
    }

    /// Output and input channels.
    pub(crate) fn dims(&self) -> (usize, usize) {
        (self.o, self.c)
    }
}

/// Whether F(2×2, 3×3) pays for a 3×3, stride-1 convolution of these sizes: enough channels
/// for the GEMMs to dominate the transforms, and enough tiles for the GEMMs to be efficient.
pub(crate) fn pays(c: usize, o: usize, oh: usize, ow: usize) -> bool {
    c >= 16 && o >= 16 && oh.div_ceil(2) * ow.div_ceil(2) >= 32
}

/// One image of a convolution: the data (`c × h × w`), its padding (top, left) and the output
/// size.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Image<'a> {
    pub(crate) x: &'a [f32],
    pub(crate) c: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) pt: usize,
    pub(crate) pl: usize,
    pub(crate) oh: usize,
    pub(crate) ow: usize,
}

/// An epilogue on the output: `f(channel, first row, rows)` for whole rows of one channel.
pub(crate) type Epilogue<'e> = &'e (dyn Fn(usize, usize, &mut [f32]) + Sync);

/// Tiles per GEMM below which [`block`] computes each GEMM transposed: 49 tiles (a 14×14
/// output) fill 49 of faer's 64 lanes, 256 output channels all of them. (At 126 tiles, 126 of
/// 128 lanes are full and the transposed product was slower: 256×28×28 2.40 → 3.16 ms.)
const FEW_TILES: usize = 64;

thread_local! {
    /// A GEMM's transposed result on the calling thread.
    static TRANSPOSED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The transformed data and the GEMMs' results of the calling thread, kept between calls.
    static BUFFERS: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// `out` (`o × oh × ow`) = the convolution of `img` with the kernel of `wt`, then `epilogue`
/// on each channel's rows, on up to `threads` threads.
pub(crate) fn conv(
    img: Image<'_>,
    wt: &Weights,
    out: &mut [f32],
    threads: usize,
    epilogue: Option<Epilogue<'_>>,
) -> KResult<()> {
    let blocks = match local_rows(wt.c, wt.o, img.oh.div_ceil(2), img.ow.div_ceil(2)) {
        Some(rows) => Blocks::Tasks(rows),
        None => Blocks::Phases(BLOCK_ELEMS),
    };
    conv_blocked(img, wt, out, threads, epilogue, blocks)
}

/// How [`conv_blocked`] cuts the tiles into blocks of whole tile rows and spreads the work.
#[derive(Clone, Copy, Debug)]
enum Blocks {
    /// One block at a time, of about this many transformed elements (data and results), each
    /// phase (data transform, GEMMs, output transform) spread over the threads.
    Phases(usize),
    /// Blocks of this many tile rows as the tasks, each wholly on one thread.
    Tasks(usize),
}

/// The transformed weights ([`Weights`], `16 · c · o` floats) up to which [`conv`] may run
/// its blocks as tasks (each block reads all of them): 1 MiB.
const TASK_WEIGHTS: usize = 1 << 18;

/// Tile rows per block where [`conv`] runs its blocks as tasks, each transformed, multiplied
/// and transformed back by one thread in its own buffers (`None`: one block at a time, each
/// phase spread over the threads). In the phase-parallel form, what one thread transformed
/// another multiplies, and what that one multiplied the first transforms back: twice per
/// block the data moves between cores. On this 2-vCPU VM those moves at times cost as if they
/// went through memory (perhaps the two vCPUs then sit on different L3 caches; bench/RESULTS.md,
/// session u: onnxruntime unaffected in the same minutes): ResNet-50's 64×56×56 layers then took 4.97–5.07 ms instead of
/// 2.5–2.7 (three calls, 2 threads), 2.60–2.61 as tasks; 128×28×28 3.92–4.11, 2.98–3.03
/// as tasks. Taken where the transformed weights are at most [`TASK_WEIGHTS`] and the tile
/// rows make 4 (else 2) blocks of at least [`FEW_TILES`] tiles each, so that every GEMM keeps
/// its plain orientation; by the shape alone, so the bits do not depend on the thread count
/// (nor on the form: the tests compare the two).
fn local_rows(c: usize, o: usize, th: usize, tw: usize) -> Option<usize> {
    if XI * c * o > TASK_WEIGHTS || th == 0 {
        return None;
    }
    [4usize, 2].into_iter().find_map(|blocks| {
        let rows = th.div_ceil(blocks);
        let count = th.div_ceil(rows);
        let last = th - rows * (count - 1);
        (count == blocks && last * tw >= FEW_TILES).then_some(rows)
    })
}

/// Output rows `r0..r1` of every `plane`-sized channel of `out` (rows of `ow`).
fn rows_of(out: &mut [f32], plane: usize, ow: usize, r0: usize, r1: usize) -> Vec<&mut [f32]> {
    out.chunks_mut(plane)
        .map(|p| &mut p[r0 * ow..r1 * ow])
        .collect()
}

/// [`conv`] with the tiles cut into `blocks`.
fn conv_blocked(
    img: Image<'_>,
    wt: &Weights,
    out: &mut [f32],
    threads: usize,
    epilogue: Option<Epilogue<'_>>,
    blocks: Blocks,
) -> KResult<()> {
    let (o, c) = (wt.o, wt.c);
    if img.c != c || img.x.len() != c * img.h * img.w || out.len() != o * img.oh * img.ow {
        return Err(format!(
            "winograd: data {}x{}x{} ({} elements), weights {o}x{c}, output {o}x{}x{} ({} \
             elements) do not fit",
            img.c,
            img.h,
            img.w,
            img.x.len(),
            img.oh,
            img.ow,
            out.len()
        ));
    }
    let (th, tw) = (img.oh.div_ceil(2), img.ow.div_ceil(2));
    if o == 0 || th == 0 || tw == 0 {
        return Ok(());
    }
    let plane = img.oh * img.ow;
    let block_elems = match blocks {
        Blocks::Phases(elems) => elems,
        Blocks::Tasks(rows) => {
            let rows = rows.clamp(1, th);
            // Each task's output rows (`2 · rows` of them) of every channel.
            let tasks: Vec<_> = crate::par::plane_runs(out, plane, 2 * rows * img.ow)
                .into_iter()
                .enumerate()
                .map(|(i, outs)| ((i * rows, ((i + 1) * rows).min(th)), outs))
                .collect();
            let t = threads.min(tasks.len());
            return crate::par::run_tasks(tasks, t, |(span, outs)| {
                crate::par::with_scratch(&BUFFERS, |(v, m)| {
                    let tb = (span.1 - span.0) * tw;
                    v.resize(c * XI * tb, 0.0);
                    m.resize(o * XI * tb, 0.0);
                    let (v, m) = (&mut v[..c * XI * tb], &mut m[..o * XI * tb]);
                    block(img, wt, outs, 1, epilogue, span, v, m)
                })
            });
        }
    };
    // Whole tile rows per block, about `block_elems` transformed elements (data and results).
    let rows = (block_elems / (XI * (c + o) * tw).max(1)).clamp(1, th);
    let tb_max = rows * tw;
    crate::par::with_scratch(&BUFFERS, |(v, m)| {
        v.resize(c * XI * tb_max, 0.0);
        m.resize(o * XI * tb_max, 0.0);
        let mut result = Ok(());
        let mut ty0 = 0;
        while ty0 < th && result.is_ok() {
            let ty1 = (ty0 + rows).min(th);
            result = block(
                img,
                wt,
                rows_of(out, plane, img.ow, 2 * ty0, (2 * ty1).min(img.oh)),
                threads,
                epilogue,
                (ty0, ty1),
                &mut v[..c * XI * (ty1 - ty0) * tw],
                &mut m[..o * XI * (ty1 - ty0) * tw],
            );
            ty0 = ty1;
        }
        result
    })
}

/// Tile rows `ty0..ty1`: data transform into `v` (`c × 16·tiles`), 16 GEMMs into `m`
/// (`o × 16·tiles`), output transform into `outs` (the block's output rows of each channel)
/// and the epilogue.
#[allow(
    clippy::too_many_arguments,
    reason = "one block's operands and buffers"
)]
fn block(
    img: Image<'_>,
    wt: &Weights,
    outs: Vec<&mut [f32]>,
    threads: usize,
    epilogue: Option<Epilogue<'_>>,
    (ty0, ty1): (usize, usize),
    v: &mut [f32],
    m: &mut [f32],
) -> KResult<()> {
    let (o, c) = (wt.o, wt.c);
    let tw = img.ow.div_ceil(2);
    let tb = (ty1 - ty0) * tw;
    // 1. The data transform, channels spread over the threads.
    let per = (XI * tb).max(1);
    let t = crate::par::threads_for(c * per, 1 << 14).min(threads);
    let chans = c.div_ceil(4 * t).max(1);
    crate::par::for_each_chunk_mut(v, chans * per, t, |off, chunk| {
        input_transform(img, (ty0, ty1), off / per, chunk);
    });
    // 2. Sixteen GEMMs, one per tile position, spread over the threads.
    let vm = MatRef::from_row_major_slice(v, c, XI * tb);
    let mut rest = MatMut::from_row_major_slice_mut(m, o, XI * tb);
    let mut tasks = Vec::with_capacity(XI);
    for xi in 0..XI {
        let (head, tail) = rest.split_at_col_mut(tb);
        tasks.push((xi, head));
        rest = tail;
    }
    let macs = o * c * tb * XI;
    let t = crate::par::threads_for(macs / 16, 1 << 16).min(threads);
    crate::par::run_tasks(tasks, t, |(xi, mut dst)| {
        let u =
            wt.u.get(xi * o * c..(xi + 1) * o * c)
                .ok_or_else(|| "winograd: short weights".to_string())?;
        let ut = MatRef::from_row_major_slice(u, c, o);
        let vx = vm.submatrix(0, xi * tb, c, tb);
        if tb >= FEW_TILES {
            let u = ut.transpose();
            faer::linalg::matmul::matmul(dst.rb_mut(), Accum::Replace, u, vx, 1.0f32, Par::Seq);
            return Ok(());
        }
        // Few tiles: the product computed transposed, `vxᵀ @ Uᵀ`, so the output channels
        // (not the tiles) lie on faer's vector lanes, then transposed into `dst`.
        crate::par::with_scratch(&TRANSPOSED, |tmp| {
            tmp.resize(tb * o, 0.0);
            let tm = MatMut::from_row_major_slice_mut(&mut tmp[..tb * o], tb, o);
            faer::linalg::matmul::matmul(tm, Accum::Replace, vx.transpose(), ut, 1.0f32, Par::Seq);
            for ch in 0..o {
                let Some(row) = dst.rb_mut().row_mut(ch).try_as_row_major_mut() else {
                    return Err("winograd: a result row is not contiguous".to_string());
                };
                for (d, &v) in row
                    .as_slice_mut()
                    .iter_mut()
                    .zip(tmp[ch..].iter().step_by(o))
                {
                    *d = v;
                }
            }
            Ok(())
        })?;
        Ok::<(), String>(())
    })?;
    // 3. The output transform and the epilogue, channels spread over the threads.
    let r0 = 2 * ty0;
    let tasks: Vec<(usize, &mut [f32])> = outs.into_iter().enumerate().collect();
    let t = crate::par::threads_for(o * tb * XI, 1 << 14).min(threads);
    let m = &*m;
    crate::par::run_tasks(tasks, t, |(ch, rows)| {
        let mrow = m
            .get(ch * XI * tb..(ch + 1) * XI * tb)
            .ok_or_else(|| "winograd: short results".to_string())?;
        output_transform(mrow, tb, tw, img.ow, rows);
        if let Some(ep) = epilogue {
            ep(ch, r0, rows);
        }
        Ok::<(), String>(())
    })
}

/// The data transform `Bᵀ d B` of tile rows `ty0..ty1` for the channels of `chunk`
/// (consecutive rows of `v`, from channel `ch0`).
fn input_transform(img: Image<'_>, rows: (usize, usize), ch0: usize, chunk: &mut [f32]) {
    struct Op<'a>(Image<'a>, (usize, usize), usize, &'a mut [f32]);
    impl pulp::WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            input_transform_inline(self.0, self.1, self.2, self.3);
        }
    }
    crate::simd::dispatch(Op(img, rows, ch0, chunk));
}

#[inline(always)]
fn input_transform_inline(
    img: Image<'_>,
    (ty0, ty1): (usize, usize),
    ch0: usize,
    chunk: &mut [f32],
) {
    let tw = img.ow.div_ceil(2);
    let tb = (ty1 - ty0) * tw;
    let span = 2 * tw + 2;
    // The block's input rows (tile rows overlap by two), each zero-padded, de-interleaved
    // into even and odd columns, and transformed once: q[row][k][tx].
    let nrows = 2 * (ty1 - ty0) + 2;
    let mut padded = vec![0.0f32; span];
    let (mut even, mut odd) = (vec![0.0f32; tw + 1], vec![0.0f32; tw + 1]);
    let mut q = vec![0.0f32; nrows * 4 * tw];
    for (i, vrow) in chunk.chunks_mut(XI * tb).enumerate() {
        let ch = ch0 + i;
        let Some(plane) = img.x.get(ch * img.h * img.w..(ch + 1) * img.h * img.w) else {
            return;
        };
        for (r, qr) in q.chunks_exact_mut(4 * tw).enumerate() {
            let y = (2 * ty0 + r) as isize - img.pt as isize;
            if y < 0 || y >= img.h as isize || img.pl >= span {
                qr.fill(0.0);
                continue;
            }
            padded.fill(0.0);
            let src = &plane[y as usize * img.w..(y as usize + 1) * img.w];
            let n = img.w.min(span - img.pl);
            padded[img.pl..img.pl + n].copy_from_slice(&src[..n]);
            for ((e, o), p) in even
                .iter_mut()
                .zip(odd.iter_mut())
                .zip(padded.chunks_exact(2))
            {
                *e = p[0];
                *o = p[1];
            }
            // d Bᵀ per tile, of its columns a, b, c, d (= e[t], o[t], e[t + 1], o[t + 1]):
            // a - c, b + c, c - b, b - d.
            let (q0, rest) = qr.split_at_mut(tw);
            let (q1, rest) = rest.split_at_mut(tw);
            let (q2, q3) = rest.split_at_mut(tw);
            let (e0, e1, o0, o1) = (&even[..tw], &even[1..], &odd[..tw], &odd[1..]);
            q0.iter_mut()
                .zip(e0.iter().zip(e1))
                .for_each(|(d, (a, c))| *d = a - c);
            q1.iter_mut()
                .zip(o0.iter().zip(e1))
                .for_each(|(d, (b, c))| *d = b + c);
            q2.iter_mut()
                .zip(e1.iter().zip(o0))
                .for_each(|(d, (c, b))| *d = c - b);
            q3.iter_mut()
                .zip(o0.iter().zip(o1))
                .for_each(|(d, (b, dd))| *d = b - dd);
        }
        for ty in ty0..ty1 {
            let t0 = (ty - ty0) * tw;
            let r0 = 2 * (ty - ty0);
            for k in 0..4 {
                let row = |r: usize| &q[((r0 + r) * 4 + k) * tw..((r0 + r) * 4 + k + 1) * tw];
                let (d0, d1, d2, d3) = (row(0), row(1), row(2), row(3));
                let at = |i: usize| (4 * i + k) * tb + t0;
                // Bᵀ (·): rows d0 - d2, d1 + d2, d2 - d1, d1 - d3.
                let dst = vrow[at(0)..at(0) + tw].iter_mut();
                dst.zip(d0.iter().zip(d2))
                    .for_each(|(o, (a, c))| *o = a - c);
                let dst = vrow[at(1)..at(1) + tw].iter_mut();
                dst.zip(d1.iter().zip(d2))
                    .for_each(|(o, (b, c))| *o = b + c);
                let dst = vrow[at(2)..at(2) + tw].iter_mut();
                dst.zip(d2.iter().zip(d1))
                    .for_each(|(o, (c, b))| *o = c - b);
                let dst = vrow[at(3)..at(3) + tw].iter_mut();
                dst.zip(d1.iter().zip(d3))
                    .for_each(|(o, (b, d))| *o = b - d);
            }
        }
    }
}

/// The output transform `Aᵀ m A` of one channel's results `mrow` (`16 × tb`) into `rows`
/// (whole output rows of the block's tile rows).
fn output_transform(mrow: &[f32], tb: usize, tw: usize, ow: usize, rows: &mut [f32]) {
    struct Op<'a>(&'a [f32], usize, usize, usize, &'a mut [f32]);
    impl pulp::WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            output_transform_inline(self.0, self.1, self.2, self.3, self.4);
        }
    }
    crate::simd::dispatch(Op(mrow, tb, tw, ow, rows));
}

#[inline(always)]
fn output_transform_inline(mrow: &[f32], tb: usize, tw: usize, ow: usize, rows: &mut [f32]) {
    let mut y = vec![0.0f32; 4 * tw];
    for (j, out2) in rows.chunks_mut(2 * ow).enumerate() {
        let t0 = j * tw;
        let s = |xi: usize| &mrow[xi * tb + t0..xi * tb + t0 + tw];
        let (y00, rest) = y.split_at_mut(tw);
        let (y01, rest) = rest.split_at_mut(tw);
        let (y10, y11) = rest.split_at_mut(tw);
        // Aᵀ m: p0[k] = m[0][k] + m[1][k] + m[2][k], p1[k] = m[1][k] - m[2][k] - m[3][k];
        // then (·) A on each: [p[0] + p[1] + p[2], p[1] - p[2] - p[3]].
        let (m0, m1, m2, m3) = (s(0), s(1), s(2), s(3));
        let (m4, m5, m6, m7) = (s(4), s(5), s(6), s(7));
        let (m8, m9, m10, m11) = (s(8), s(9), s(10), s(11));
        let (m12, m13, m14, m15) = (s(12), s(13), s(14), s(15));
        for tx in 0..tw {
            let p00 = m0[tx] + m4[tx] + m8[tx];
            let p01 = m1[tx] + m5[tx] + m9[tx];
            let p02 = m2[tx] + m6[tx] + m10[tx];
            let p03 = m3[tx] + m7[tx] + m11[tx];
            let p10 = m4[tx] - m8[tx] - m12[tx];
            let p11 = m5[tx] - m9[tx] - m13[tx];
            let p12 = m6[tx] - m10[tx] - m14[tx];
            let p13 = m7[tx] - m11[tx] - m15[tx];
            y00[tx] = p00 + p01 + p02;
            y01[tx] = p01 - p02 - p03;
            y10[tx] = p10 + p11 + p12;
            y11[tx] = p11 - p12 - p13;
        }
        let (top, bottom) = out2.split_at_mut(ow.min(out2.len()));
        for (row, (ya, yb)) in [(top, (&*y00, &*y01)), (bottom, (&*y10, &*y11))] {
            // Interleaved: ya[t] at column 2t, yb[t] at 2t + 1 (the last maybe cut off).
            let pairs = row.chunks_exact_mut(2);
            let full = pairs.len();
            for (p, (a, b)) in pairs.zip(ya.iter().zip(yb)) {
                p[0] = *a;
                p[1] = *b;
            }
            if let (Some(last), Some(a)) = (row.get_mut(2 * full), ya.get(full)) {
                *last = *a;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::panic, reason = "test code: a failure is a panic")]

    use super::*;

    /// The direct 3×3 correlation (stride 1), in `f64`.
    fn naive(img: &Image<'_>, w: &[f32], o: usize) -> Vec<f64> {
        let (c, h, wd) = (img.c, img.h as isize, img.w as isize);
        let mut out = vec![0.0f64; o * img.oh * img.ow];
        for oc in 0..o {
            for oy in 0..img.oh {
                for ox in 0..img.ow {
                    let mut acc = 0.0f64;
                    for ch in 0..c {
                        for ky in 0..3 {
                            for kx in 0..3 {
                                let y = (oy + ky) as isize - img.pt as isize;
                                let x = (ox + kx) as isize - img.pl as isize;
                                if y < 0 || x < 0 || y >= h || x >= wd {
                                    continue;
                                }
                                let v = img.x[(ch * img.h + y as usize) * img.w + x as usize];
                                acc +=
                                    f64::from(v) * f64::from(w[((oc * c + ch) * 3 + ky) * 3 + kx]);
                            }
                        }
                    }
                    out[(oc * img.oh + oy) * img.ow + ox] = acc;
                }
            }
        }
        out
    }

    /// (c, o, h, w, pt, pl, pb, pr).
    type Case = (usize, usize, usize, usize, usize, usize, usize, usize);

    /// Odd and even sizes; no, symmetric and uneven padding; 225 tiles in one block (each
    /// GEMM in its plain orientation: at least FEW_TILES tiles; the others are under it).
    const CASES: [Case; 6] = [
        (16, 16, 12, 12, 1, 1, 1, 1),
        (16, 16, 30, 30, 1, 1, 1, 1),
        (17, 20, 9, 7, 1, 1, 1, 1),
        (16, 24, 11, 13, 0, 0, 0, 0),
        (18, 16, 8, 10, 2, 1, 0, 2),
        (20, 18, 5, 19, 2, 2, 2, 2),
    ];

    fn image(
        x: &[f32],
        (c, h, w, pt, pl, pb, pr): (usize, usize, usize, usize, usize, usize, usize),
    ) -> Image<'_> {
        Image {
            x,
            c,
            h,
            w,
            pt,
            pl,
            oh: h + pt + pb - 2,
            ow: w + pl + pr - 2,
        }
    }

    /// Runs `conv_blocked` for a case, returning the output.
    fn run(img: Image<'_>, w: &[f32], o: usize, threads: usize, blocks: Blocks) -> Vec<f32> {
        let wt = Weights::new(w, o, img.c).unwrap_or_else(|e| panic!("{e}"));
        let mut out = vec![f32::NAN; o * img.oh * img.ow];
        conv_blocked(img, &wt, &mut out, threads, None, blocks).unwrap_or_else(|e| panic!("{e}"));
        out
    }

    #[test]
    fn small_integers_give_the_exact_correlation() {
        // Multiples of 1/4 below 2^10 in every transform and product: every sum is exact.
        for (c, o, h, w, pt, pl, pb, pr) in CASES {
            let x: Vec<f32> = (0..c * h * w)
                .map(|i| ((i * 37) % 17) as f32 - 8.0)
                .collect();
            let k: Vec<f32> = (0..o * c * 9)
                .map(|i| ((i * 11) % 7) as f32 - 3.0)
                .collect();
            let img = image(&x, (c, h, w, pt, pl, pb, pr));
            let want: Vec<f32> = naive(&img, &k, o).into_iter().map(|v| v as f32).collect();
            let forms = [
                Blocks::Phases(1 << 20),
                Blocks::Phases(1),
                Blocks::Tasks(1),
                Blocks::Tasks(3),
            ];
            for (blocks, threads) in forms.into_iter().zip([1, 1, 2, 2]) {
                assert_eq!(
                    run(img, &k, o, threads, blocks),
                    want,
                    "case {c} {o} {h} {w} {pt} {pl} {pb} {pr}, {blocks:?}"
                );
            }
        }
    }

    #[test]
    fn real_values_stay_within_a_few_ulps_of_the_largest_terms() {
        for (n, (c, o, h, w, pt, pl, pb, pr)) in CASES.into_iter().enumerate() {
            let mut s = 0x9e37_79b9_u64 + n as u64;
            let mut next = || {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            };
            let x: Vec<f32> = (0..c * h * w).map(|_| next()).collect();
            let k: Vec<f32> = (0..o * c * 9).map(|_| next()).collect();
            let img = image(&x, (c, h, w, pt, pl, pb, pr));
            let want = naive(&img, &k, o);
            let got = run(img, &k, o, 1, Blocks::Phases(1 << 20));
            // The sums of absolute terms bound the rounding error of any summation order.
            let scale = (c * 9) as f64;
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let err = (f64::from(*g) - w).abs();
                assert!(
                    err <= scale * 16.0 * f64::from(f32::EPSILON),
                    "case {n}, element {i}: {g} vs {w}"
                );
            }
        }
    }

    #[test]
    fn blocks_and_threads_do_not_change_a_bit() {
        let (c, o, h, w) = (16, 16, 23, 21);
        let x: Vec<f32> = (0..c * h * w)
            .map(|i| ((i * 7919) % 1013) as f32 / 1013.0 - 0.5)
            .collect();
        let k: Vec<f32> = (0..o * c * 9)
            .map(|i| ((i * 104_729) % 997) as f32 / 997.0 - 0.5)
            .collect();
        let img = image(&x, (c, h, w, 1, 1, 1, 1));
        let one = run(img, &k, o, 1, Blocks::Phases(1 << 20));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for threads in [2, 3] {
            for blocks in [Blocks::Phases(1 << 20), Blocks::Tasks(6), Blocks::Tasks(2)] {
                assert_eq!(
                    bits(&run(img, &k, o, threads, blocks)),
                    bits(&one),
                    "{threads} threads, {blocks:?}"
                );
            }
        }
        // Blocks of one and of five tile rows give the same sums (the GEMMs' order per element
        // does not depend on the block), whichever thread computes them.
        let small = run(img, &k, o, 2, Blocks::Phases(1));
        let five = run(img, &k, o, 2, Blocks::Phases(XI * (c + o) * 11 * 5));
        assert_eq!(bits(&small), bits(&five));
        assert_eq!(bits(&run(img, &k, o, 2, Blocks::Tasks(1))), bits(&small));
    }

    #[test]
    fn blocks_run_as_tasks_where_the_weights_are_small_and_the_tiles_many() {
        // ResNet-50: 64×56×56 in 4 blocks of 7 tile rows, 128×28×28 in 2 of 7; 256×14×14
        // (4 MiB of transformed weights) and a 14×14 plane of few channels (blocks under
        // FEW_TILES tiles) stay phase-parallel.
        assert_eq!(local_rows(64, 64, 28, 28), Some(7));
        assert_eq!(local_rows(128, 128, 14, 14), Some(7));
        assert_eq!(local_rows(256, 256, 7, 7), None);
        assert_eq!(local_rows(64, 64, 7, 7), None);
        assert_eq!(local_rows(16, 16, 0, 0), None);
    }

    #[test]
    fn the_epilogue_sees_each_channel_s_rows_once() {
        let (c, o, h, w) = (16, 16, 9, 9);
        let x = vec![1.0f32; c * h * w];
        let k = vec![0.5f32; o * c * 9];
        let img = image(&x, (c, h, w, 1, 1, 1, 1));
        let wt = Weights::new(&k, o, c).unwrap_or_else(|e| panic!("{e}"));
        for blocks in [Blocks::Phases(1), Blocks::Tasks(2)] {
            let mut out = vec![0.0f32; o * 81];
            let seen = std::sync::Mutex::new(vec![0usize; o * 81]);
            let ep = |ch: usize, r0: usize, rows: &mut [f32]| {
                if let Ok(mut s) = seen.lock() {
                    for i in 0..rows.len() {
                        s[ch * 81 + r0 * 9 + i] += 1;
                    }
                }
                rows.iter_mut().for_each(|v| *v = -*v);
            };
            conv_blocked(img, &wt, &mut out, 2, Some(&ep), blocks)
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(
                seen.into_inner()
                    .unwrap_or_default()
                    .iter()
                    .all(|&n| n == 1),
                "{blocks:?}"
            );
            // The centre sees all 9 taps of all 16 channels: -(16 * 9 * 0.5).
            assert_eq!(out[4 * 9 + 4], -72.0, "{blocks:?}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Any sizes, paddings, blocks (phase-parallel or as tasks) and thread counts: small
        /// integers give the exact correlation.
        #[test]
        fn any_shape_gives_the_exact_correlation(
            c in 1usize..6, o in 1usize..6, h in 1usize..10, w in 1usize..10,
            pt in 0usize..3, pl in 0usize..3, pb in 0usize..3, pr in 0usize..3,
            size in 1usize..3000, tasks in proptest::bool::ANY, threads in 1usize..4,
            seed in 0usize..1000,
        ) {
            let block = if tasks { Blocks::Tasks(size % 5) } else { Blocks::Phases(size) };
            proptest::prop_assume!(h + pt + pb >= 3 && w + pl + pr >= 3);
            let x: Vec<f32> = (0..c * h * w).map(|i| ((i * 37 + seed) % 17) as f32 - 8.0).collect();
            let k: Vec<f32> = (0..o * c * 9).map(|i| ((i * 11 + seed) % 7) as f32 - 3.0).collect();
            let img = image(&x, (c, h, w, pt, pl, pb, pr));
            let want: Vec<f32> = naive(&img, &k, o).into_iter().map(|v| v as f32).collect();
            proptest::prop_assert_eq!(run(img, &k, o, threads, block), want);
        }
    }

    #[test]
    fn mismatched_operands_are_errors() {
        assert!(Weights::new(&[0.0; 10], 1, 1).is_err());
        let x = vec![0.0f32; 16 * 4 * 4];
        let img = image(&x, (16, 4, 4, 1, 1, 1, 1));
        let wt = Weights::new(&vec![0.0; 16 * 17 * 9], 16, 17).unwrap_or_else(|e| panic!("{e}"));
        let mut out = vec![0.0f32; 16 * 16];
        assert!(conv(img, &wt, &mut out, 1, None).is_err());
    }
}
