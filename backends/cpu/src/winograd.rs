//! Winograd F(2×2, 3×3) and F(4×4, 3×3) convolution: the fast path of [`crate::conv`] for 3×3
//! kernels with stride 1, dilation 1 and one group (the 3×3 layers of ResNet-style networks).
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
//!   0.96–0.98 (bench/RESULTS.md, session k). With 16-lane vectors such a GEMM runs on the
//!   column kernel instead ([`crate::gemm_packed::gemm_cols`]: output channels on the lanes,
//!   `V`'s rows read in place, `Uᵀ` packed once per position by [`Weights::for_image`], where
//!   `faer` packed it on every call, and no strided transposition back): ResNet-50's five
//!   256×14×14 layers 4.48–4.86 → 3.93–4.09 ms (two threads). With narrower vectors (AVX2)
//!   it runs on the packed GEMM instead ([`crate::gemm_packed::gemm_src`]: `V`'s columns
//!   copied into blocks of 6 tiles, `Uᵀ` packed once per position, the result transposed
//!   back), not on `faer`, which packed `Uᵀ` on every call: the same five layers 6.08 →
//!   4.85 ms on a 2-core AMD EPYC, ResNet-50's 512×7×7 ones 4.94 → 3.23 (two calls).
//! - F(4×4, 3×3) ([`Tile::F4`]) computes each 4×4 output tile from a 6×6 input tile (tiles
//!   overlap by two): 36 GEMMs, 36 multiply-adds per 16 outputs and channel (2.25 per output
//!   against F(2×2)'s 4), for larger transforms and weights 36/16 the size. [`Tile::choose`]
//!   takes it where the transformed weights are small and the tiles many (ResNet-50's
//!   64×56×56 and 128×28×28 layers: 2.49 → 2.01 and 2.56 → 1.89 ms for three calls each, two
//!   threads; its 256×14×14 layers, 16 tiles and 9 MiB of weights, went from 4.6 to 5.1 ms
//!   and stay with F(2×2)). Both transforms run over every tile of a block at once (runs of
//!   the block's tiles, not of one tile row), the data's rows dealt into their column phases
//!   and transformed along the row once.
//! - The weight transform `G g Gᵀ` is computed in `f64` and rounded once ([`Weights`]); the
//!   executor computes it once per constant weight, in the variant its convolution runs. The
//!   data and output transforms are additions, subtractions and multiplications by small
//!   powers of two and by 5 in `f32`. Against the direct sum the result differs by a few units
//!   in the last place of the largest terms (the transforms' sums) with F(2×2); F(4×4) scales
//!   a tile's data by up to 100 and the products back by up to 361, and stays within 128 ε of
//!   the largest sum of the terms' magnitudes (36 ε the most measured). Both are well within
//!   the tolerances `--check` and the onnxruntime comparison use (ResNet-50's logits: 0.059
//!   of a range of 137,772 from onnxruntime's, 0.045 with F(2×2) alone).
//! - Two ways to spread the work, chosen by the shape ([`local_rows`]): one block of tile rows
//!   at a time with each phase (data transform, the 16 GEMMs, output transform) spread over the
//!   threads; or, where the transformed weights are small (ResNet's 64×56×56 and 128×28×28
//!   layers), the blocks themselves as tasks, each whole on one thread, so that no block's
//!   transformed data passes between cores (which cost 1.4–1.9× in this VM's slow stretches,
//!   perhaps when its two vCPUs sit on different L3 caches).
//! - Deterministic: the tiles are cut into blocks of whole tile rows by the shape alone, and
//!   every output element is computed by the same operations in the same order whatever the
//!   number of threads or the blocks (each GEMM is one sequential call), so results are
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

/// The output tile of a Winograd variant: F(2×2, 3×3) (4×4 input tiles, 16 positions) or
/// F(4×4, 3×3) (6×6 input tiles, 36 positions: 2.25 multiply-adds per output and channel
/// instead of 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tile {
    F2,
    F4,
}

impl Tile {
    /// Outputs per tile side.
    fn m(self) -> usize {
        match self {
            Tile::F2 => 2,
            Tile::F4 => 4,
        }
    }
    /// The tiles of an `oh × ow` output.
    pub(crate) fn tiles(self, oh: usize, ow: usize) -> usize {
        oh.div_ceil(self.m()) * ow.div_ceil(self.m())
    }
    /// Positions of a transformed tile (`(m + 2)²`): the GEMMs per block.
    fn xi(self) -> usize {
        (self.m() + 2) * (self.m() + 2)
    }

    /// The variant for a 3×3, stride-1 convolution of these sizes, or `None` where Winograd
    /// does not pay: enough channels for the GEMMs to dominate the transforms, and enough
    /// F(2×2) tiles for the GEMMs to be efficient (32, or 16 — a 7×7 output — with at least
    /// [`WIDE_CHANNELS`] channels in and out, where the direct kernel is bound by its
    /// multiply-adds: ResNet-50's 512×7×7 layers, 2.38–2.44 → 1.82 ms for two calls on two
    /// threads, the model 1.2–1.7% faster on one and two). F(4×4, 3×3) where its
    /// transformed weights are small ([`F4_WEIGHTS`]: they are read for every block) and an
    /// image makes at least [`F4_TILES`] of its tiles (ResNet-50's 64×56×56 and 128×28×28
    /// layers); elsewhere F(2×2, 3×3), whose smaller weights and finer tiles lose less to the
    /// weights read from memory and to tiles past the output's edge.
    pub(crate) fn choose(c: usize, o: usize, oh: usize, ow: usize) -> Option<Tile> {
        let tiles = Tile::F2.tiles(oh, ow);
        let wide = c >= WIDE_CHANNELS && o >= WIDE_CHANNELS;
        if c < 16 || o < 16 || tiles < 16 || (tiles < 32 && !wide) {
            return None;
        }
        let f4 = Tile::F4.xi() * c * o <= F4_WEIGHTS && oh.div_ceil(4) * ow.div_ceil(4) >= F4_TILES;
        Some(if f4 { Tile::F4 } else { Tile::F2 })
    }
}

/// The channels in and out from which [`Tile::choose`] takes outputs of 16 to 31 F(2×2)
/// tiles.
const WIDE_CHANNELS: usize = 256;

/// The transformed weights (`36 · c · o` floats) up to which [`Tile::choose`] takes
/// F(4×4, 3×3).
const F4_WEIGHTS: usize = 36 * 128 * 128;

/// The fewest F(4×4) tiles per image for which [`Tile::choose`] takes it (a 28×28 output).
const F4_TILES: usize = 49;

/// The elements of the transformed data and of the GEMMs' results per block: 1 Mi (4 MiB). On
/// ResNet-50, fewer and longer GEMMs paid more than blocks that stay in a core's L2 (2 MiB
/// here), which cut a 56×56 layer into seven 112-tile GEMMs per position.
const BLOCK_ELEMS: usize = 1 << 20;

/// The transformed weights of an `O × C × 3 × 3` kernel, `Uᵀ` per tile position:
/// `u[ξ][c][o] = (G g_{o,c} Gᵀ)[ξ]`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Weights {
    tile: Tile,
    o: usize,
    c: usize,
    u: Vec<f32>,
    /// Per tile position, `Uᵀ` packed once for the kernel that runs the GEMMs of few tiles
    /// ([`few_kernel`]; made by [`Weights::for_image`] where an image has fewer than
    /// [`FEW_TILES`] tiles), instead of `faer` packing it on every call.
    packed: Option<(Few, Vec<crate::gemm_packed::PackedB>)>,
}

impl Weights {
    /// The transformed weights, `u[ξ][c][o]`.
    pub(crate) fn u(&self) -> &[f32] {
        &self.u
    }

    /// The transform of `w` (`OIHW`, `o × c × 3 × 3`) for `tile`, computed in `f64` and
    /// rounded once.
    pub(crate) fn new(w: &[f32], o: usize, c: usize, tile: Tile) -> KResult<Weights> {
        if w.len() != o * c * 9 {
            return Err(format!(
                "winograd: a {o}x{c}x3x3 kernel needs {} elements, found {}",
                o * c * 9,
                w.len()
            ));
        }
        let xi = tile.xi();
        fusebox_core::runtime::memory::check_alloc(
            "the Winograd weights of relax.nn.conv2d",
            fusebox_core::ir::DType::F32,
            &[xi, o, c],
        )
        .map_err(|e| e.to_string())?;
        let mut u = vec![0.0f32; xi * o * c];
        let a = tile.m() + 2;
        for (oc, g) in w.chunks_exact(9).enumerate() {
            let g: [f64; 9] = std::array::from_fn(|i| f64::from(g[i]));
            let at = |pos: usize| pos * o * c + (oc % c) * o + oc / c;
            match tile {
                Tile::F2 => {
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
                            u[at(a * i + k)] = v as f32;
                        }
                    }
                }
                Tile::F4 => {
                    // G g Gᵀ with G's rows for the points 0, 1, -1, 2, -2 and infinity.
                    let mut gg = [[0.0f64; 3]; 6];
                    for (i, gi) in G4.iter().enumerate() {
                        for j in 0..3 {
                            gg[i][j] = gi[0] * g[j] + gi[1] * g[3 + j] + gi[2] * g[6 + j];
                        }
                    }
                    for (i, r) in gg.iter().enumerate() {
                        for (k, gk) in G4.iter().enumerate() {
                            let v = r[0] * gk[0] + r[1] * gk[1] + r[2] * gk[2];
                            u[at(a * i + k)] = v as f32;
                        }
                    }
                }
            }
        }
        Ok(Weights {
            tile,
            o,
            c,
            u,
            packed: None,
        })
    }

    /// [`Weights::new`] for images of `tiles` tiles each: with the per-position packed copies
    /// of [`Weights::cols`] where the GEMMs are of few tiles and the column kernel runs.
    pub(crate) fn for_image(
        w: &[f32],
        o: usize,
        c: usize,
        tile: Tile,
        tiles: usize,
    ) -> KResult<Weights> {
        use crate::gemm_packed::PackedB;
        let mut wt = Weights::new(w, o, c, tile)?;
        if let Some(few) = few_kernel(tiles) {
            let len = match few {
                Few::Cols => PackedB::cols_len_for(c, o),
                Few::Rows => PackedB::len_for(c, o),
            };
            fusebox_core::runtime::memory::check_alloc(
                "the packed Winograd weights of relax.nn.conv2d",
                fusebox_core::ir::DType::F32,
                &[tile.xi(), len],
            )
            .map_err(|e| e.to_string())?;
            let packed =
                wt.u.chunks_exact(o * c)
                    .map(|u| match few {
                        Few::Cols => PackedB::for_cols(u, c, o),
                        Few::Rows => PackedB::new(u, c, o),
                    })
                    .collect::<KResult<Vec<_>>>()?;
            wt.packed = Some((few, packed));
        }
        Ok(wt)
    }

    /// Whether these are [`Weights::for_image`]'s weights for this convolution (so that a
    /// kept transform and one made by the call give the same bits).
    pub(crate) fn fits(&self, o: usize, c: usize, tile: Tile, tiles: usize) -> bool {
        (self.o, self.c, self.tile) == (o, c, tile)
            && self.packed.as_ref().map(|p| p.0) == few_kernel(tiles)
    }
}

/// The kernel that runs a block's GEMMs of fewer than [`FEW_TILES`] tiles from a `Uᵀ` packed
/// once per position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Few {
    /// [`crate::gemm_packed::gemm_cols`] (16-lane vectors): the output channels on the lanes,
    /// `V`'s rows read in place.
    Cols,
    /// [`crate::gemm_packed::gemm_src`] (narrower vectors): `V`'s columns copied into blocks
    /// of rows, the output channels along the kernel's slices, the result transposed back.
    /// `faer` packed `Uᵀ` on every call (1 MiB per position for a 512-channel layer, 16 per
    /// call): on a 2-core AMD EPYC with AVX2, two threads, ResNet-50's two 512×7×7 layers
    /// (16 tiles) took 4.94 → 3.23 ms, its five 256×14×14 ones (49 tiles) 6.08 → 4.85
    /// (onnxruntime 2.83 and 6.19; bench/RESULTS.md, session bs).
    Rows,
}

/// Which kernel [`Weights::for_image`] packs `Uᵀ` for, for images of `tiles` tiles (`None`:
/// `faer`, which packs it per call).
fn few_kernel(tiles: usize) -> Option<Few> {
    if tiles >= FEW_TILES {
        None
    } else if crate::simd::f32_lanes() >= 16 {
        Some(Few::Cols)
    } else if crate::gemm_packed::takes_src() {
        Some(Few::Rows)
    } else {
        None
    }
}

/// F(4×4, 3×3)'s `G` (6 × 3): the kernel's values at the interpolation points 0, 1, −1, 2,
/// −2 and infinity, scaled so that the data transform `Bᵀ` has integer entries (Lavin & Gray).
const G4: [[f64; 3]; 6] = [
    [1.0 / 4.0, 0.0, 0.0],
    [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
    [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
    [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
    [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
    [0.0, 0.0, 1.0],
];

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
    let m = wt.tile.m();
    let blocks = match local_rows(wt, img.oh.div_ceil(m), img.ow.div_ceil(m)) {
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
fn local_rows(wt: &Weights, th: usize, tw: usize) -> Option<usize> {
    if wt.u.len() > TASK_WEIGHTS || th == 0 {
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
    let (m, xi) = (wt.tile.m(), wt.tile.xi());
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
    let (th, tw) = (img.oh.div_ceil(m), img.ow.div_ceil(m));
    if o == 0 || th == 0 || tw == 0 {
        return Ok(());
    }
    let plane = img.oh * img.ow;
    let block_elems = match blocks {
        Blocks::Phases(elems) => elems,
        Blocks::Tasks(rows) => {
            let rows = rows.clamp(1, th);
            // Each task's output rows (`2 · rows` of them) of every channel.
            let tasks: Vec<_> = crate::par::plane_runs(out, plane, m * rows * img.ow)
                .into_iter()
                .enumerate()
                .map(|(i, outs)| ((i * rows, ((i + 1) * rows).min(th)), outs))
                .collect();
            let t = threads.min(tasks.len());
            return crate::par::run_tasks(tasks, t, |(span, outs)| {
                crate::par::with_scratch(&BUFFERS, |(v, r)| {
                    let tb = (span.1 - span.0) * tw;
                    v.resize(c * xi * tb, 0.0);
                    r.resize(o * xi * tb, 0.0);
                    let (v, r) = (&mut v[..c * xi * tb], &mut r[..o * xi * tb]);
                    block(img, wt, outs, 1, epilogue, span, v, r)
                })
            });
        }
    };
    // Whole tile rows per block, about `block_elems` transformed elements (data and results).
    let rows = (block_elems / (xi * (c + o) * tw).max(1)).clamp(1, th);
    let tb_max = rows * tw;
    crate::par::with_scratch(&BUFFERS, |(v, r)| {
        v.resize(c * xi * tb_max, 0.0);
        r.resize(o * xi * tb_max, 0.0);
        let mut result = Ok(());
        let mut ty0 = 0;
        while ty0 < th && result.is_ok() {
            let ty1 = (ty0 + rows).min(th);
            result = block(
                img,
                wt,
                rows_of(out, plane, img.ow, m * ty0, (m * ty1).min(img.oh)),
                threads,
                epilogue,
                (ty0, ty1),
                &mut v[..c * xi * (ty1 - ty0) * tw],
                &mut r[..o * xi * (ty1 - ty0) * tw],
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
    let (tile, xi) = (wt.tile, wt.tile.xi());
    let tw = img.ow.div_ceil(tile.m());
    let tb = (ty1 - ty0) * tw;
    // 1. The data transform, channels spread over the threads.
    let per = (xi * tb).max(1);
    let t = crate::par::threads_for(c * per, 1 << 14).min(threads);
    let chans = c.div_ceil(4 * t).max(1);
    crate::par::for_each_chunk_mut(v, chans * per, t, |off, chunk| {
        input_transform(tile, img, (ty0, ty1), off / per, chunk);
    });
    // 2. One GEMM per tile position (16 or 36), spread over the threads.
    let vs: &[f32] = v;
    let vm = MatRef::from_row_major_slice(vs, c, xi * tb);
    let mut rest = MatMut::from_row_major_slice_mut(m, o, xi * tb);
    let mut tasks = Vec::with_capacity(xi);
    for pos in 0..xi {
        let (head, tail) = rest.split_at_col_mut(tb);
        tasks.push((pos, head));
        rest = tail;
    }
    let macs = o * c * tb * xi;
    // The column kernel's steps through `V` (channel `p`'s rows start `p · xi · tb` past
    // a position's first), shared by every position of the block.
    let steps: Vec<usize> = match wt.packed {
        Some(_) if tb < FEW_TILES => (0..c).map(|p| p * xi * tb).collect(),
        _ => Vec::new(),
    };
    let t = crate::par::threads_for(macs / 16, 1 << 16).min(threads);
    crate::par::run_tasks(tasks, t, |(pos, mut dst)| {
        let u =
            wt.u.get(pos * o * c..(pos + 1) * o * c)
                .ok_or_else(|| "winograd: short weights".to_string())?;
        let ut = MatRef::from_row_major_slice(u, c, o);
        let vx = vm.submatrix(0, pos * tb, c, tb);
        if tb >= FEW_TILES {
            let u = ut.transpose();
            faer::linalg::matmul::matmul(dst.rb_mut(), Accum::Replace, u, vx, 1.0f32, Par::Seq);
            return Ok(());
        }
        let packed = wt
            .packed
            .as_ref()
            .and_then(|(few, p)| Some((*few, p.get(pos)?)));
        if let Some((Few::Rows, packed)) = packed.filter(|_| tb >= crate::gemm_packed::MIN_ROWS) {
            // Few tiles, a packed `Uᵀ`, narrower vectors: `vxᵀ @ Uᵀ` on the packed GEMM,
            // `V`'s columns read from this position's first, then transposed into `dst`.
            let src = crate::gemm_packed::ColsSrc {
                data: vs.get(pos * tb..).unwrap_or(&[]),
                steps: &steps,
                row: tb,
                pitch: tb,
            };
            return crate::gemm_packed::gemm_src(tb, src, packed, dst.transpose_mut(), 1, None);
        }
        if let Some((Few::Cols, packed)) = packed {
            // Few tiles, a packed `Uᵀ`: the output channels on the column kernel's lanes,
            // `V`'s rows read in place from this position's first.
            let src = crate::gemm_packed::ColsSrc {
                data: vs.get(pos * tb..).unwrap_or(&[]),
                steps: &steps,
                row: tb,
                pitch: tb,
            };
            return crate::par::with_scratch(&TRANSPOSED, |tmp| {
                tmp.resize(o * tb, 0.0);
                crate::gemm_packed::gemm_cols(tb, src, packed, &mut tmp[..o * tb], 1, None, None)?;
                for (ch, src) in tmp.chunks_exact(tb).enumerate() {
                    let Some(row) = dst.rb_mut().row_mut(ch).try_as_row_major_mut() else {
                        return Err("winograd: a result row is not contiguous".to_string());
                    };
                    row.as_slice_mut().copy_from_slice(src);
                }
                Ok(())
            });
        }
        // Few tiles: the product computed transposed, `vxᵀ @ Uᵀ`, so the output channels
        // (not the tiles) lie on faer's vector lanes, then transposed into `dst`.
        crate::par::with_scratch(&TRANSPOSED, |tmp| {
            tmp.resize(tb * o, 0.0);
            let tm = MatMut::from_row_major_slice_mut(&mut tmp[..tb * o], tb, o);
            faer::linalg::matmul::matmul(tm, Accum::Replace, vx.transpose(), ut, 1.0f32, Par::Seq);
            crate::gemm_packed::copy_rows(&tmp[..tb * o], o, dst.rb_mut().transpose_mut());
            Ok::<(), String>(())
        })?;
        Ok::<(), String>(())
    })?;
    // 3. The output transform and the epilogue, channels spread over the threads.
    let r0 = tile.m() * ty0;
    let tasks: Vec<(usize, &mut [f32])> = outs.into_iter().enumerate().collect();
    let t = crate::par::threads_for(o * tb * xi, 1 << 14).min(threads);
    let m = &*m;
    crate::par::run_tasks(tasks, t, |(ch, rows)| {
        let mrow = m
            .get(ch * xi * tb..(ch + 1) * xi * tb)
            .ok_or_else(|| "winograd: short results".to_string())?;
        output_transform(tile, mrow, tb, tw, img.ow, rows);
        if let Some(ep) = epilogue {
            ep(ch, r0, rows);
        }
        Ok::<(), String>(())
    })
}

/// The data transform `Bᵀ d B` of tile rows `ty0..ty1` for the channels of `chunk`
/// (consecutive rows of `v`, from channel `ch0`).
fn input_transform(
    tile: Tile,
    img: Image<'_>,
    rows: (usize, usize),
    ch0: usize,
    chunk: &mut [f32],
) {
    struct Op<'a>(Tile, Image<'a>, (usize, usize), usize, &'a mut [f32]);
    impl pulp::WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            match self.0 {
                Tile::F2 => input_transform_inline(self.1, self.2, self.3, self.4),
                Tile::F4 => input_transform4_inline(self.1, self.2, self.3, self.4),
            }
        }
    }
    crate::simd::dispatch(Op(tile, img, rows, ch0, chunk));
}

#[inline(always)]
fn input_transform_inline(
    img: Image<'_>,
    (ty0, ty1): (usize, usize),
    ch0: usize,
    chunk: &mut [f32],
) {
    let tw = img.ow.div_ceil(2);
    let rows = ty1 - ty0;
    let tb = rows * tw;
    let span = 2 * tw + 2;
    // The block's input rows (tile rows overlap by two), each zero-padded, de-interleaved
    // into even and odd columns and transformed once (`qr`: 4 × tw), then put in the place of
    // row j (0..4) of each tile row that reads it: `d[k][j][tile]` (rows 2ty + 2 and 2ty + 3
    // also start tile row ty + 1); then, per column k, the four rows of every tile at once.
    let nrows = 2 * rows + 2;
    let mut padded = vec![0.0f32; span];
    let (mut even, mut odd) = (vec![0.0f32; tw + 1], vec![0.0f32; tw + 1]);
    let mut qr = vec![0.0f32; 4 * tw];
    let mut d = vec![0.0f32; 16 * tb];
    for (i, vrow) in chunk.chunks_mut(16 * tb).enumerate() {
        let ch = ch0 + i;
        let Some(plane) = img.x.get(ch * img.h * img.w..(ch + 1) * img.h * img.w) else {
            return;
        };
        for r in 0..nrows {
            if !padded_row(&img, plane, 2 * ty0 + r, &mut padded) {
                qr.fill(0.0);
                place(&qr, &mut d, r, (2, 4), rows, tw);
                continue;
            }
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
            place(&qr, &mut d, r, (2, 4), rows, tw);
        }
        for k in 0..4 {
            let run = |j: usize| &d[(k * 4 + j) * tb..(k * 4 + j + 1) * tb];
            let (d0, d1, d2, d3) = (run(0), run(1), run(2), run(3));
            let at = |i: usize| (4 * i + k) * tb;
            // Bᵀ (·): rows d0 - d2, d1 + d2, d2 - d1, d1 - d3.
            let dst = vrow[at(0)..at(0) + tb].iter_mut();
            dst.zip(d0.iter().zip(d2))
                .for_each(|(o, (a, c))| *o = a - c);
            let dst = vrow[at(1)..at(1) + tb].iter_mut();
            dst.zip(d1.iter().zip(d2))
                .for_each(|(o, (b, c))| *o = b + c);
            let dst = vrow[at(2)..at(2) + tb].iter_mut();
            dst.zip(d2.iter().zip(d1))
                .for_each(|(o, (c, b))| *o = c - b);
            let dst = vrow[at(3)..at(3) + tb].iter_mut();
            dst.zip(d1.iter().zip(d3))
                .for_each(|(o, (b, d))| *o = b - d);
        }
    }
}

/// Row `row` of the zero-padded image (counting the top padding's rows) into `padded`, the
/// left padding first and zeros past the data; `false` when the row lies in the padding (its
/// transform is then zero).
fn padded_row(img: &Image<'_>, plane: &[f32], row: usize, padded: &mut [f32]) -> bool {
    let span = padded.len();
    let y = row as isize - img.pt as isize;
    if y < 0 || y >= img.h as isize || img.pl >= span {
        return false;
    }
    let Some(src) = plane.get(y as usize * img.w..(y as usize + 1) * img.w) else {
        return false;
    };
    padded.fill(0.0);
    let n = img.w.min(span - img.pl);
    padded[img.pl..img.pl + n].copy_from_slice(&src[..n]);
    true
}

/// Puts input row `r`'s transform along the row, `qr` (`a × tw`, by column k), where the
/// tile rows of a variant with `m` outputs and `a = m + 2` inputs per tile side read it: as
/// row `j = r − m·ty` of every tile row `ty` with `0 ≤ j < a` (tiles overlap by two rows), in
/// `d[k][j][tile]` (`a × a × rows·tw`).
fn place(qr: &[f32], d: &mut [f32], r: usize, (m, a): (usize, usize), rows: usize, tw: usize) {
    let tb = rows * tw;
    for j in (r % m..a).step_by(m) {
        let Some(ty) = r.checked_sub(j).map(|v| v / m).filter(|&ty| ty < rows) else {
            continue;
        };
        for (k, qk) in qr.chunks_exact(tw).enumerate() {
            let at = (k * a + j) * tb + ty * tw;
            d[at..at + tw].copy_from_slice(qk);
        }
    }
}

/// The output transform `Aᵀ m A` of one channel's results `mrow` (`16 × tb`) into `rows`
/// (whole output rows of the block's tile rows).
fn output_transform(tile: Tile, mrow: &[f32], tb: usize, tw: usize, ow: usize, rows: &mut [f32]) {
    struct Op<'a>(Tile, &'a [f32], usize, usize, usize, &'a mut [f32]);
    impl pulp::WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            match self.0 {
                Tile::F2 => output_transform_inline(self.1, self.2, self.3, self.4, self.5),
                Tile::F4 => output_transform4_inline(self.1, self.2, self.3, self.4, self.5),
            }
        }
    }
    crate::simd::dispatch(Op(tile, mrow, tb, tw, ow, rows));
}

/// F(2×2, 3×3)'s output transform `Aᵀ m A` of one channel's results `mrow` (`16 × tb`) into
/// `rows` (whole output rows of the block's tile rows, two per tile row), over every tile of
/// the block at once, then dealt into the rows.
#[inline(always)]
fn output_transform_inline(mrow: &[f32], tb: usize, tw: usize, ow: usize, rows: &mut [f32]) {
    OUT_PASSES.with(|buf| {
        let mut buf = buf.borrow_mut();
        buf.resize(4 * tb, 0.0);
        let (y00, rest) = buf.split_at_mut(tb);
        let (y01, rest) = rest.split_at_mut(tb);
        let (y10, y11) = rest.split_at_mut(tb);
        let s = |xi: usize| &mrow[xi * tb..(xi + 1) * tb];
        // Aᵀ m: p0[k] = m[0][k] + m[1][k] + m[2][k], p1[k] = m[1][k] - m[2][k] - m[3][k];
        // then (·) A on each: [p[0] + p[1] + p[2], p[1] - p[2] - p[3]].
        let (m0, m1, m2, m3) = (s(0), s(1), s(2), s(3));
        let (m4, m5, m6, m7) = (s(4), s(5), s(6), s(7));
        let (m8, m9, m10, m11) = (s(8), s(9), s(10), s(11));
        let (m12, m13, m14, m15) = (s(12), s(13), s(14), s(15));
        for t in 0..tb {
            let p00 = m0[t] + m4[t] + m8[t];
            let p01 = m1[t] + m5[t] + m9[t];
            let p02 = m2[t] + m6[t] + m10[t];
            let p03 = m3[t] + m7[t] + m11[t];
            let p10 = m4[t] - m8[t] - m12[t];
            let p11 = m5[t] - m9[t] - m13[t];
            let p12 = m6[t] - m10[t] - m14[t];
            let p13 = m7[t] - m11[t] - m15[t];
            y00[t] = p00 + p01 + p02;
            y01[t] = p01 - p02 - p03;
            y10[t] = p10 + p11 + p12;
            y11[t] = p11 - p12 - p13;
        }
        for (j, out2) in rows.chunks_mut(2 * ow).enumerate() {
            let run = j * tw..(j + 1) * tw;
            let (top, bottom) = out2.split_at_mut(ow.min(out2.len()));
            let halves = [
                (top, (&y00[run.clone()], &y01[run.clone()])),
                (bottom, (&y10[run.clone()], &y11[run])),
            ];
            for (row, (ya, yb)) in halves {
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
    });
}

/// (The two data transforms share [`padded_row`] and [`place`] but not their loops: one
/// driver for both, with the phases and `Bᵀ` chosen per variant, gave the same bits and ran
/// ResNet-50's F(4×4) layers 7–12% slower on one thread.)
///
/// F(4×4, 3×3)'s data transform `Bᵀ d B` of tile rows `ty0..ty1` for the channels of
/// `chunk` (consecutive rows of `v`, from channel `ch0`): each input row is zero-padded,
/// dealt into its four column phases and transformed along the row once (tiles overlap by two
/// columns), into the place of row `j` (0..6) of each tile row that reads it (rows `4ty + 4`
/// and `4ty + 5` also start tile row `ty + 1`); then, per transformed column `k`, the six rows
/// of every tile at once, down the columns (runs of all the block's tiles).
#[inline(always)]
fn input_transform4_inline(
    img: Image<'_>,
    (ty0, ty1): (usize, usize),
    ch0: usize,
    chunk: &mut [f32],
) {
    let tw = img.ow.div_ceil(4);
    let rows = ty1 - ty0;
    let tb = rows * tw;
    // Columns `4t + p` of the zero-padded row for `t` in `0..=tw`: tile `t` reads `4t..4t + 6`.
    let span = 4 * (tw + 1);
    let nrows = 4 * rows + 2;
    IN4.with(|buf| {
        let mut buf = buf.borrow_mut();
        // The padded row, its phases, its transform (`6 × tw`) and `d[k][j][tile]`.
        buf.resize(span + 4 * (tw + 1) + 6 * tw + 36 * tb, 0.0);
        let (padded, rest) = buf.split_at_mut(span);
        let (phases, rest) = rest.split_at_mut(4 * (tw + 1));
        let (h, d) = rest.split_at_mut(6 * tw);
        for (i, vrow) in chunk.chunks_mut(36 * tb).enumerate() {
            let ch = ch0 + i;
            let Some(plane) = img.x.get(ch * img.h * img.w..(ch + 1) * img.h * img.w) else {
                return;
            };
            for r in 0..nrows {
                if !padded_row(&img, plane, 4 * ty0 + r, padded) {
                    h.fill(0.0);
                } else {
                    let (p0, rest) = phases.split_at_mut(tw + 1);
                    let (p1, rest) = rest.split_at_mut(tw + 1);
                    let (p2, p3) = rest.split_at_mut(tw + 1);
                    for (t, c) in padded.chunks_exact(4).enumerate() {
                        p0[t] = c[0];
                        p1[t] = c[1];
                        p2[t] = c[2];
                        p3[t] = c[3];
                    }
                    let (q0, rest) = h.split_at_mut(tw);
                    let (q1, rest) = rest.split_at_mut(tw);
                    let (q2, rest) = rest.split_at_mut(tw);
                    let (q3, rest) = rest.split_at_mut(tw);
                    let (q4, q5) = rest.split_at_mut(tw);
                    let src = [
                        &p0[..tw],
                        &p1[..tw],
                        &p2[..tw],
                        &p3[..tw],
                        &p0[1..],
                        &p1[1..],
                    ];
                    b4(src, [q0, q1, q2, q3, q4, q5]);
                }
                place(h, d, r, (4, 6), rows, tw);
            }
            for k in 0..6 {
                let dk = &d[k * 6 * tb..(k + 1) * 6 * tb];
                let col = |j: usize| &dk[j * tb..(j + 1) * tb];
                // Positions 6i + k for i in 0..6, `tb` values each.
                let mut outs = vrow.chunks_exact_mut(tb).skip(k).step_by(6);
                let (Some(v0), Some(v1), Some(v2), Some(v3), Some(v4), Some(v5)) = (
                    outs.next(),
                    outs.next(),
                    outs.next(),
                    outs.next(),
                    outs.next(),
                    outs.next(),
                ) else {
                    return;
                };
                b4(
                    [col(0), col(1), col(2), col(3), col(4), col(5)],
                    [v0, v1, v2, v3, v4, v5],
                );
            }
        }
    });
}

thread_local! {
    /// [`input_transform4_inline`]'s buffers on the calling thread.
    static IN4: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The rows of F(4×4, 3×3)'s `Bᵀ` on six equal runs of values (one per tile):
/// `q0 = 4d0 − 5d2 + d4`, `q1 = (d3 + d4) − 4(d1 + d2)`, `q2 = (d4 − d3) + 4(d1 − d2)`,
/// `q3 = (d4 − d2) + 2(d3 − d1)`, `q4 = (d4 − d2) − 2(d3 − d1)`, `q5 = 4d1 − 5d3 + d5`.
#[inline(always)]
fn b4(d: [&[f32]; 6], q: [&mut [f32]; 6]) {
    let [q0, q1, q2, q3, q4, q5] = q;
    let n = q0.len();
    let (d0, d1, d2) = (&d[0][..n], &d[1][..n], &d[2][..n]);
    let (d3, d4, d5) = (&d[3][..n], &d[4][..n], &d[5][..n]);
    let (q1, q2, q3) = (&mut q1[..n], &mut q2[..n], &mut q3[..n]);
    let (q4, q5) = (&mut q4[..n], &mut q5[..n]);
    for t in 0..n {
        let (a0, a1, a2, a3, a4, a5) = (d0[t], d1[t], d2[t], d3[t], d4[t], d5[t]);
        q0[t] = 4.0 * a0 - 5.0 * a2 + a4;
        q1[t] = (a3 + a4) - 4.0 * (a1 + a2);
        q2[t] = (a4 - a3) + 4.0 * (a1 - a2);
        q3[t] = (a4 - a2) + 2.0 * (a3 - a1);
        q4[t] = (a4 - a2) - 2.0 * (a3 - a1);
        q5[t] = 4.0 * a1 - 5.0 * a3 + a5;
    }
}

/// The rows of F(4×4, 3×3)'s `Aᵀ` on six equal runs: `y0 = m0 + (m1 + m2) + (m3 + m4)`,
/// `y1 = (m1 − m2) + 2(m3 − m4)`, `y2 = (m1 + m2) + 4(m3 + m4)`,
/// `y3 = (m1 − m2) + 8(m3 − m4) + m5`.
#[inline(always)]
fn a4(m: [&[f32]; 6], y: [&mut [f32]; 4]) {
    let [y0, y1, y2, y3] = y;
    let n = y0.len();
    let (m0, m1, m2) = (&m[0][..n], &m[1][..n], &m[2][..n]);
    let (m3, m4, m5) = (&m[3][..n], &m[4][..n], &m[5][..n]);
    let (y1, y2, y3) = (&mut y1[..n], &mut y2[..n], &mut y3[..n]);
    for t in 0..n {
        let (s12, d12) = (m1[t] + m2[t], m1[t] - m2[t]);
        let (s34, d34) = (m3[t] + m4[t], m3[t] - m4[t]);
        y0[t] = m0[t] + s12 + s34;
        y1[t] = d12 + 2.0 * d34;
        y2[t] = s12 + 4.0 * s34;
        y3[t] = d12 + 8.0 * d34 + m5[t];
    }
}

/// F(4×4, 3×3)'s output transform `Aᵀ m A` of one channel's results `mrow` (`36 × tb`) into
/// `rows` (whole output rows of the block's tile rows, four per tile row, the last maybe
/// fewer; columns past the output's width dropped). Each tile's transform is its own, so
/// both passes run over all `tb` tiles of the block at once (long runs of vectors), and only
/// the last step deals the values into the output rows.
#[inline(always)]
fn output_transform4_inline(mrow: &[f32], tb: usize, tw: usize, ow: usize, rows: &mut [f32]) {
    OUT_PASSES.with(|buf| {
        let mut buf = buf.borrow_mut();
        // `a[r][k]` (Aᵀ down each column k) and `y[r][c]` (then A along each row r), `tb` each.
        buf.resize(40 * tb, 0.0);
        let (a, y) = buf.split_at_mut(24 * tb);
        let s = |pos: usize| &mrow[pos * tb..(pos + 1) * tb];
        for k in 0..6 {
            let mut runs = a.chunks_exact_mut(tb).skip(k).step_by(6);
            let (Some(r0), Some(r1), Some(r2), Some(r3)) =
                (runs.next(), runs.next(), runs.next(), runs.next())
            else {
                return;
            };
            a4(
                [s(k), s(6 + k), s(12 + k), s(18 + k), s(24 + k), s(30 + k)],
                [r0, r1, r2, r3],
            );
        }
        for (ar, yr) in a.chunks_exact(6 * tb).zip(y.chunks_exact_mut(4 * tb)) {
            let (m0, rest) = ar.split_at(tb);
            let (m1, rest) = rest.split_at(tb);
            let (m2, rest) = rest.split_at(tb);
            let (m3, rest) = rest.split_at(tb);
            let (m4, m5) = rest.split_at(tb);
            let (c0, rest) = yr.split_at_mut(tb);
            let (c1, rest) = rest.split_at_mut(tb);
            let (c2, c3) = rest.split_at_mut(tb);
            a4([m0, m1, m2, m3, m4, m5], [c0, c1, c2, c3]);
        }
        for (j, out4) in rows.chunks_mut(4 * ow).enumerate() {
            let t0 = j * tw;
            for (r, row) in out4.chunks_mut(ow).enumerate() {
                let yr = &y[4 * r * tb..4 * (r + 1) * tb];
                let col = |c: usize| &yr[c * tb + t0..c * tb + t0 + tw];
                let (c0, c1, c2, c3) = (col(0), col(1), col(2), col(3));
                let quads = row.chunks_exact_mut(4);
                let full = quads.len();
                for (t, p) in quads.enumerate() {
                    p[0] = c0[t];
                    p[1] = c1[t];
                    p[2] = c2[t];
                    p[3] = c3[t];
                }
                let cols = [c0, c1, c2, c3];
                for (c, v) in row[4 * full..].iter_mut().enumerate() {
                    *v = cols[c][full];
                }
            }
        }
    });
}

thread_local! {
    /// The output transforms' passes on the calling thread ([`output_transform_inline`],
    /// [`output_transform4_inline`]).
    static OUT_PASSES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
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

    /// Runs `conv_blocked` for a case with F(2×2, 3×3), returning the output.
    fn run(img: Image<'_>, w: &[f32], o: usize, threads: usize, blocks: Blocks) -> Vec<f32> {
        run_tile(img, w, o, threads, blocks, Tile::F2)
    }

    /// Runs `conv_blocked` for a case with `tile`, its weights as the executor makes them
    /// ([`Weights::for_image`]: packed for the column kernel where the image has few tiles
    /// and the CPU 16-lane vectors), returning the output.
    fn run_tile(
        img: Image<'_>,
        w: &[f32],
        o: usize,
        threads: usize,
        blocks: Blocks,
        tile: Tile,
    ) -> Vec<f32> {
        let tiles = tile.tiles(img.oh, img.ow);
        let wt = Weights::for_image(w, o, img.c, tile, tiles).unwrap_or_else(|e| panic!("{e}"));
        run_weights(img, &wt, threads, blocks)
    }

    /// Runs `conv_blocked` with `wt`, returning the output.
    fn run_weights(img: Image<'_>, wt: &Weights, threads: usize, blocks: Blocks) -> Vec<f32> {
        let mut out = vec![f32::NAN; wt.o * img.oh * img.ow];
        conv_blocked(img, wt, &mut out, threads, None, blocks).unwrap_or_else(|e| panic!("{e}"));
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
            let (x, k) = random_operands(0x9e37_79b9_u64 + n as u64, c * h * w, o * c * 9);
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
        let five = run(img, &k, o, 2, Blocks::Phases(16 * (c + o) * 11 * 5));
        assert_eq!(bits(&small), bits(&five));
        assert_eq!(bits(&run(img, &k, o, 2, Blocks::Tasks(1))), bits(&small));
    }

    #[test]
    fn blocks_run_as_tasks_where_the_weights_are_small_and_the_tiles_many() {
        // ResNet-50: 64×56×56 in 4 blocks of 7 tile rows, 128×28×28 in 2 of 7; 256×14×14
        // (4 MiB of transformed weights) and a 14×14 plane of few channels (blocks under
        // FEW_TILES tiles) stay phase-parallel.
        let f2 = |c: usize, o: usize| {
            Weights::new(&vec![0.0; o * c * 9], o, c, Tile::F2).unwrap_or_else(|e| panic!("{e}"))
        };
        assert_eq!(local_rows(&f2(64, 64), 28, 28), Some(7));
        assert_eq!(local_rows(&f2(128, 128), 14, 14), Some(7));
        assert_eq!(local_rows(&f2(256, 256), 7, 7), None);
        assert_eq!(local_rows(&f2(64, 64), 7, 7), None);
        assert_eq!(local_rows(&f2(16, 16), 0, 0), None);
        // F(4×4): 64×56×56 in 2 blocks of 7 tile rows (196 tiles); 128×28×28 (49 tiles in
        // one block, 2.25 MiB of weights) phase-parallel.
        let f4 = Weights::new(&vec![0.0; 64 * 64 * 9], 64, 64, Tile::F4)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(local_rows(&f4, 14, 14), Some(7));
        let f4 = Weights::new(&vec![0.0; 128 * 128 * 9], 128, 128, Tile::F4)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(local_rows(&f4, 7, 7), None);
    }

    #[test]
    fn the_epilogue_sees_each_channel_s_rows_once() {
        let (c, o, h, w) = (16, 16, 9, 9);
        let x = vec![1.0f32; c * h * w];
        let k = vec![0.5f32; o * c * 9];
        let img = image(&x, (c, h, w, 1, 1, 1, 1));
        for (tile, blocks) in [
            (Tile::F2, Blocks::Phases(1)),
            (Tile::F2, Blocks::Tasks(2)),
            (Tile::F4, Blocks::Phases(1)),
            (Tile::F4, Blocks::Tasks(1)),
        ] {
            let wt = Weights::new(&k, o, c, tile).unwrap_or_else(|e| panic!("{e}"));
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

    /// The bound on F(4×4)'s error, in units of `f32`'s epsilon times the largest sum of the
    /// terms' magnitudes of any output: its transforms scale a tile's data by up to 100 and
    /// the products back by up to 361, mixing the tile's 36 inputs, so an output's error
    /// follows the tile's magnitudes, not its own terms'. Measured: at most 36 ε over 3,000
    /// cases of the property test, 9 ε on the fixed cases.
    const F4_BOUND: f64 = 128.0;

    /// `n` data and `m` weight values in [-1, 1) from an xorshift generator seeded with `seed`.
    fn random_operands(seed: u64, n: usize, m: usize) -> (Vec<f32>, Vec<f32>) {
        let mut s = seed;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        let x: Vec<f32> = (0..n).map(|_| next()).collect();
        let k: Vec<f32> = (0..m).map(|_| next()).collect();
        (x, k)
    }

    /// Each output's sum of its terms' magnitudes: the correlation of `|x|` and `|k|`.
    fn magnitudes(
        x: &[f32],
        k: &[f32],
        o: usize,
        shape: (usize, usize, usize, usize, usize, usize, usize),
    ) -> Vec<f64> {
        let ax: Vec<f32> = x.iter().map(|v| v.abs()).collect();
        let ak: Vec<f32> = k.iter().map(|v| v.abs()).collect();
        naive(&image(&ax, shape), &ak, o)
    }

    /// The largest error of `got` against the direct sum `want`, as a share of the largest
    /// sum of the absolute values of an output's terms (`scale`: the correlation of `|x|` and
    /// `|w|`).
    fn relative_error(got: &[f32], want: &[f64], scale: &[f64]) -> f64 {
        let top = scale.iter().copied().fold(f64::MIN_POSITIVE, f64::max);
        got.iter()
            .zip(want)
            .map(|(g, w)| (f64::from(*g) - w).abs() / top)
            .fold(0.0, f64::max)
    }

    /// F(4×4, 3×3): within [`F4_BOUND`] (its error is larger than F(2×2)'s, as the
    /// literature reports), on every case, every blocking and thread count; and bit-identical
    /// across them.
    #[test]
    fn f4_stays_within_its_error_bound_and_does_not_depend_on_blocks() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut worst = 0.0f64;
        for (n, (c, o, h, w, pt, pl, pb, pr)) in CASES.into_iter().enumerate() {
            let (x, k) = random_operands(0x2545_f491_u64 + n as u64, c * h * w, o * c * 9);
            let img = image(&x, (c, h, w, pt, pl, pb, pr));
            let want = naive(&img, &k, o);
            let scale = magnitudes(&x, &k, o, (c, h, w, pt, pl, pb, pr));
            let one = run_tile(img, &k, o, 1, Blocks::Phases(1 << 20), Tile::F4);
            worst = worst.max(relative_error(&one, &want, &scale));
            for (threads, blocks) in [
                (2, Blocks::Phases(1)),
                (3, Blocks::Phases(36 * (c + o) * 8 * 2)),
                (2, Blocks::Tasks(1)),
                (2, Blocks::Tasks(2)),
            ] {
                let got = run_tile(img, &k, o, threads, blocks, Tile::F4);
                assert_eq!(
                    bits(&got),
                    bits(&one),
                    "case {n}, {threads} threads, {blocks:?}"
                );
            }
        }
        assert!(
            worst <= F4_BOUND * f64::from(f32::EPSILON),
            "worst relative error {worst:e}"
        );
        assert!(worst > 0.0, "real values should show some rounding");
    }

    /// The GEMMs of few tiles on the column kernel (weights packed per position) and on
    /// `faer` (transposed) give the direct sum within the same bounds, for both variants; the
    /// kept weights made for one image size are not taken for another whose GEMMs run the
    /// other way ([`Weights::fits`]).
    #[test]
    fn few_tile_gemms_agree_on_either_kernel() {
        let (c, o, h, w) = (20, 40, 9, 11);
        let x: Vec<f32> = (0..c * h * w)
            .map(|i| ((i * 7919) % 1013) as f32 / 1013.0 - 0.5)
            .collect();
        let k: Vec<f32> = (0..o * c * 9)
            .map(|i| ((i * 104_729) % 997) as f32 / 997.0 - 0.5)
            .collect();
        let img = image(&x, (c, h, w, 1, 1, 1, 1));
        let want = naive(&img, &k, o);
        let scale = magnitudes(&x, &k, o, (c, h, w, 1, 1, 1, 1));
        for tile in [Tile::F2, Tile::F4] {
            let tiles = tile.tiles(img.oh, img.ow);
            assert!(tiles < FEW_TILES);
            let packed =
                Weights::for_image(&k, o, c, tile, tiles).unwrap_or_else(|e| panic!("{e}"));
            let plain = Weights::new(&k, o, c, tile).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(packed.packed.is_some(), few_kernel(tiles).is_some());
            assert!(packed.fits(o, c, tile, tiles));
            let unpacked = few_kernel(tiles).is_none();
            assert_eq!(plain.fits(o, c, tile, tiles), unpacked);
            assert_eq!(packed.fits(o, c, tile, FEW_TILES), unpacked);
            for wt in [&packed, &plain] {
                let got = run_weights(img, wt, 2, Blocks::Phases(1 << 20));
                let err = relative_error(&got, &want, &scale);
                assert!(
                    err <= F4_BOUND * f64::from(f32::EPSILON),
                    "{tile:?}: error {err:e}"
                );
            }
        }
    }

    /// F(4×4): small integers whose transforms stay exact give the exact correlation (weights
    /// that are multiples of 576 = 24², so that `G g Gᵀ` has integer entries).
    #[test]
    fn f4_is_exact_where_its_transforms_are() {
        for (c, o, h, w, pt, pl, pb, pr) in CASES {
            let x: Vec<f32> = (0..c * h * w)
                .map(|i| ((i * 37) % 5) as f32 - 2.0)
                .collect();
            let k: Vec<f32> = (0..o * c * 9)
                .map(|i| (((i * 11) % 3) as f32 - 1.0) * 576.0)
                .collect();
            let img = image(&x, (c, h, w, pt, pl, pb, pr));
            let want: Vec<f32> = naive(&img, &k, o).into_iter().map(|v| v as f32).collect();
            for (blocks, threads) in [(Blocks::Phases(1 << 20), 1), (Blocks::Tasks(1), 2)] {
                assert_eq!(
                    run_tile(img, &k, o, threads, blocks, Tile::F4),
                    want,
                    "case {c} {o} {h} {w} {pt} {pl} {pb} {pr}, {blocks:?}"
                );
            }
        }
    }

    #[test]
    fn the_variant_follows_the_channels_and_the_tiles() {
        // ResNet-50's 3×3 stride-1 layers: F(4×4) on 64×56×56 and 128×28×28, F(2×2) on
        // 256×14×14 (9 MiB of F(4×4) weights, 16 tiles); too few channels or tiles: none.
        assert_eq!(Tile::choose(64, 64, 56, 56), Some(Tile::F4));
        assert_eq!(Tile::choose(128, 128, 28, 28), Some(Tile::F4));
        assert_eq!(Tile::choose(256, 256, 14, 14), Some(Tile::F2));
        assert_eq!(Tile::choose(256, 256, 28, 28), Some(Tile::F2));
        assert_eq!(Tile::choose(64, 64, 24, 24), Some(Tile::F2));
        assert_eq!(Tile::choose(8, 64, 56, 56), None);
        // 7×7 outputs (16 tiles of 2×2): wide layers only.
        assert_eq!(Tile::choose(512, 512, 7, 7), Some(Tile::F2));
        assert_eq!(Tile::choose(64, 64, 7, 7), None);
        assert_eq!(Tile::choose(512, 128, 7, 7), None);
        assert_eq!(Tile::choose(512, 512, 5, 5), None);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

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

        /// Any sizes, paddings, blocks and thread counts: F(4×4) within its error bound of the
        /// direct sum, and the same bits as one block on one thread.
        #[test]
        fn f4_any_shape_stays_within_its_bound(
            c in 1usize..6, o in 1usize..6, h in 1usize..12, w in 1usize..12,
            pt in 0usize..3, pl in 0usize..3, pb in 0usize..3, pr in 0usize..3,
            size in 1usize..3000, tasks in proptest::bool::ANY, threads in 1usize..4,
            seed in 0usize..1000,
        ) {
            let block = if tasks { Blocks::Tasks(size % 5) } else { Blocks::Phases(size) };
            proptest::prop_assume!(h + pt + pb >= 3 && w + pl + pr >= 3);
            let x: Vec<f32> = (0..c * h * w)
                .map(|i| ((i * 7919 + seed) % 1013) as f32 / 1013.0 - 0.5)
                .collect();
            let k: Vec<f32> = (0..o * c * 9)
                .map(|i| ((i * 104_729 + seed) % 997) as f32 / 997.0 - 0.5)
                .collect();
            let img = image(&x, (c, h, w, pt, pl, pb, pr));
            let want = naive(&img, &k, o);
            let scale = magnitudes(&x, &k, o, (c, h, w, pt, pl, pb, pr));
            let got = run_tile(img, &k, o, threads, block, Tile::F4);
            let err = relative_error(&got, &want, &scale);
            proptest::prop_assert!(err <= F4_BOUND * f64::from(f32::EPSILON), "error {}", err);
            let one = run_tile(img, &k, o, 1, Blocks::Phases(1 << 20), Tile::F4);
            proptest::prop_assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                one.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn mismatched_operands_are_errors() {
        for tile in [Tile::F2, Tile::F4] {
            assert!(Weights::new(&[0.0; 10], 1, 1, tile).is_err());
            let x = vec![0.0f32; 16 * 4 * 4];
            let img = image(&x, (16, 4, 4, 1, 1, 1, 1));
            let wt = Weights::new(&vec![0.0; 16 * 17 * 9], 16, 17, tile)
                .unwrap_or_else(|e| panic!("{e}"));
            let mut out = vec![0.0f32; 16 * 16];
            assert!(conv(img, &wt, &mut out, 1, None).is_err());
        }
    }
}
