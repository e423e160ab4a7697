//! The GEMM of a dense layer whose weight is a constant: `C = A @ B` with `B` (`k × n`, the
//! weight) packed once per executor into column panels ([`PackedB`]), and `A` (`m × k`, the
//! activations) read in place.
//!
//! Contract:
//!
//! - Every element of `C` is one chain of `f32` fused multiply-adds over `k` in order, from
//!   `+0.0`: `c = fma(a[i][p], b[p][j], c)` for `p = 0..k`. No blocking of `k`, and each
//!   element is computed whole by one micro-kernel call, so the result does not depend on the
//!   tiling, the thread count, the instruction set (16-, 8-, 4-lane vectors or scalar
//!   `mul_add`: the same FMA) or where the element lies (edge rows and columns go through the
//!   same chain on zero padding): bit-identical for every thread count and every CPU.
//! - [`PackedB`] holds `B` in panels of `nr` columns, each `k`-major (`panel[p·nr + j]` is
//!   `B[p][panel·nr + j]`), the last panel padded with zero columns: the micro-kernel reads a
//!   panel as one sequential stream. `nr` is [`NR`] = 48 where the AVX-512 kernel runs and
//!   [`NR_N`] = 16 (one slice) on the narrower paths. The executor packs a kept constant
//!   weight once (`Executor::packed_weight`) and keeps the copy as long as itself, as
//!   onnxruntime's `MatMul` prepacks its constant weight at session creation.
//! - With AVX-512 the micro-kernel holds 8 × 3 vectors of `C` in registers (24 of 32), loads
//!   a panel row (3 vectors) and broadcasts 8 elements of `A` per step of `k`, over all of `k`.
//!   While a panel's row blocks run, the next panel is prefetched toward L2 (`prefetcht1`, a
//!   share of its lines per row block, spread over the block's steps; a hint, so the bits do
//!   not change): a weight streamed from memory otherwise left each panel's first block
//!   waiting. In one process against onnxruntime (`bench/interleaved.py`, medians of
//!   per-pair ratios), twelve GPT-2-sized dense layers went from 1.132 to 0.965 of
//!   onnxruntime's time on one thread and 1.024 to 0.878 on two, GPT-2 from 1.087 to 0.955
//!   on one thread and from 0.96–1.05 to 0.86–0.90 on two, BERT-base from 1.077 to 0.932 on
//!   one thread (bench/RESULTS.md, session ar).
//! - With narrower vectors (AVX2's 8 lanes; 4 and scalar too) a panel row no longer fits the
//!   registers: `A` is first copied into blocks of [`MR_N`] = 6 rows interleaved by step
//!   (one sequential stream per block), `k` is cut into chunks of [`KC`] steps, and the
//!   micro-kernel holds 6 × 2 vectors (12 of AVX2's 16 registers) of one 16-column slice of a
//!   panel, whose chunk (16 KB) stays in L1 while every row block of the tile passes it. The
//!   running sums wait between chunks in a per-thread buffer, one contiguous `6 × 16` block
//!   per (slice, row block), and are reloaded unchanged: the same chains (keeping them in `C`
//!   itself cost a row lookup per row per kernel call: 128 × 768 × 768 went from 34 to 38.6
//!   GMAC/s, median of 4, one thread). The last chunk's sums go straight from the registers
//!   into the tile's rows of `C`, looked up once per tile (about 1.7% faster than copying the
//!   finished tile from the buffer: median of 16 alternated comparisons on GPT-2's shapes).
//!   While a slice's chunk meets the row blocks, the next slice's chunk is prefetched into L1,
//!   a share of its lines per row block (`prefetcht0` through `pulp`'s safe SSE token; a
//!   hint, so the bits do not change): GPT-2's four GEMM shapes with 12 weights in turn ran
//!   6–11% faster on one thread and 2–8% on two, 8 of 8 alternated comparisons each. A
//!   tile's last row block with fewer than 6 live rows runs the kernel on 2 or 4 rows (a
//!   128-row layer's 22nd block holds 2).
//! - The work is cut by the shape alone into tiles of up to [`ROWS`] rows (whole blocks of 6)
//!   by whole panels (on the AVX-512 path, a band whose rows of `A` pass [`A_BAND_BYTES`] in
//!   sub-bands run panel by panel), spread over [`crate::par`]'s threads; `epilogue` runs on
//!   each row of a tile right after the tile is computed (while it is in cache).
//! - Why not `faer` here: `faer` packs `B` on every call. With the weight packed once, this
//!   kernel computes GPT-2-sized dense layers (`128 × 768 × 3072` and back, weights read from
//!   memory) in 0.92× `faer`'s time with AVX-512 and 0.99–1.04× with AVX2 (`cargo run
//!   --release -p fusebox-cpu --example bench_dense`; bench/RESULTS.md).
//! - [`gemm_src`] is the same chains on the narrower vectors' path with `A` read through a
//!   [`ColsSrc`] (`k`-major data, such as a Winograd block's transformed data, copied
//!   straight into the blocks of 6 rows, no transposed copy first).
//! - [`gemm_cols`] ([`cols`]) is the same chains for a convolution, with the output channels
//!   on the vector lanes and the pixels read where they lie.
//! - [`gemm`] needs at least [`MIN_ROWS`] rows; fewer go to [`crate::matmul`]'s GEMV/`faer`
//!   path (the caller decides by the shape alone, so a fused and an unfused dense layer take
//!   the same path and give the same bits).
//!
//! ```text
//! lv: R.Tensor((1, 128, 3072), dtype="float32") = R.matmul(x, W, out_dtype="void")
//! ; W: a constant (768, 3072) → packed once into 64 panels of 48 columns (768 × 48 each);
//! ; C (128 × 3072) = x (128 × 768, in place) @ W (packed), 8 rows × 48 columns per kernel call
//! ; (AVX2: x copied into 22 blocks of 6 rows; 6 rows × 16 columns × 256 steps per kernel call)
//! ```

use crate::matmul::Epilogue;
use crate::util::KResult;
use faer::MatMut;
use faer::reborrow::ReborrowMut;

mod cols;
pub(crate) use cols::{ColsPre, ColsSrc, cols_rows, gemm_cols};

/// Columns of `B` per panel with AVX-512: 3 vectors of 16 lanes, a row of the micro-kernel.
pub(crate) const NR: usize = 48;

/// Columns of `B` per panel on the narrower paths ([`tile_chunked`]): one 16-column slice (2
/// vectors of AVX2's 8 lanes), so that the slice the micro-kernel reads is one contiguous
/// stream the hardware prefetcher follows (with 48-column panels it read every third cache
/// line: 128 × 768 × 3072 with 12 weights from memory, one thread, went from 34.6 to 37.3
/// GMAC/s, median of 4 alternated runs).
const NR_N: usize = 16;

/// The panel width [`PackedB::new`] packs for: [`NR`] where [`gemm`] runs the AVX-512
/// kernel, else [`NR_N`].
fn panel_width() -> usize {
    if chunked(crate::simd::f32_lanes()) {
        NR_N
    } else {
        NR
    }
}

/// The elements of a `k × n` matrix packed in panels of `nr` columns (the last one padded).
fn packed_len(k: usize, n: usize, nr: usize) -> usize {
    n.div_ceil(nr) * nr * k
}

/// The fewest rows of `A` [`gemm`] takes (fewer leave most of the micro-kernel's rows empty).
pub(crate) const MIN_ROWS: usize = 8;

/// The most rows of `A` per tile: a tile's rows of `A` (`ROWS × k`) stay in a core's L2
/// while the tile's panels stream past them.
const ROWS: usize = 256;

/// The most bytes of `A`'s rows per tile: a band of [`ROWS`] rows whose rows of `A` are
/// larger is cut into sub-bands of whole [`SUB_ROWS`] rows, so that a tile's rows of `A` and
/// its panel stay in a core's L2 together (a 3072-step panel is 590 KB). BERT-base's 128 × 3072
/// @ 3072 × 768 layers (1.5 MB of `A`, three sub-bands) took 0.89–0.91 of their time on two
/// threads (bench/RESULTS.md, session bh); 300 KB, which also cut the 768-step layers, lost.
/// Only the AVX-512 path ([`tile`], which keeps a panel's rows over all of `k`) cuts bands:
/// [`tile_chunked`] already bounds its working set by the chunks of `k` (a band's rows of `A`
/// over one chunk, 135 KB for 132 rows), and its sub-bands only shared each slice of `B` it
/// loads into L1 among fewer row blocks (the same BERT layers on a 2-core AMD EPYC with
/// AVX2: 0.90–0.91 of their time with one band, one thread and two; bench/RESULTS.md,
/// session br).
const A_BAND_BYTES: usize = 512 << 10;

/// A sub-band's rows are a multiple of this: whole blocks of both micro-kernels' rows (8 with
/// AVX-512, [`MR_N`] = 6 on the narrower paths), so that no sub-band adds a part block.
const SUB_ROWS: usize = 24;

/// About this many multiply-adds per tile: enough to make a task worth its scheduling (about
/// 0.15 ms on one AVX2 core), and few enough that a 768-column layer of 128 rows makes 16
/// tiles, so a thread the OS deschedules holds up little of the layer (2²⁴ made 4; on a
/// 2-core VM, BERT's 2-thread runs went from 232–330 to 225–246 ms, GPT-2's from 335–458 to
/// 317–357 ms, six alternated runs each).
const TILE_MACS: usize = 1 << 22;

/// One cache line of packed `B`: the storage unit of [`PackedB`], so that every panel (a
/// whole number of lines) and every 16-column slice of a panel row starts on a line.
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
pub(crate) struct Line(pub(crate) [f32; 16]);

/// The `f32`s in a cache line (a [`Line`]).
const LINE: usize = 16;

/// A rank-2 `B` (`k × n`) in panels of [`NR`] columns (see the module doc).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PackedB {
    k: usize,
    n: usize,
    /// Columns per panel: [`NR`] or [`NR_N`] (a whole number of [`Line`]s).
    nr: usize,
    data: Vec<Line>,
}

impl PackedB {
    /// Packs row-major `b` (`k × n`) in the panels this CPU's kernel reads.
    pub(crate) fn new(b: &[f32], k: usize, n: usize) -> KResult<PackedB> {
        PackedB::with_width(b, k, n, panel_width())
    }

    /// Packs row-major `b` (`k × n`) in panels of `nr` columns (a multiple of 16).
    fn with_width(b: &[f32], k: usize, n: usize, nr: usize) -> KResult<PackedB> {
        if nr == 0 || !nr.is_multiple_of(16) {
            return Err(format!("pack: panels of {nr} columns are not whole lines"));
        }
        if b.len() != k * n {
            return Err(format!(
                "pack: a {k}x{n} matrix has {} elements, found {}",
                k * n,
                b.len()
            ));
        }
        let panels = n.div_ceil(nr);
        let mut lines = vec![Line([0.0; 16]); panels * k * nr / 16];
        let data: &mut [f32] = bytemuck::cast_slice_mut(&mut lines);
        if k > 0 {
            for (pnl, dst) in data.chunks_exact_mut(k * nr).enumerate() {
                let c0 = pnl * nr;
                let cols = nr.min(n - c0);
                for (row, d) in b.chunks_exact(n).zip(dst.chunks_exact_mut(nr)) {
                    d[..cols].copy_from_slice(&row[c0..c0 + cols]);
                }
            }
        }
        Ok(PackedB {
            k,
            n,
            nr,
            data: lines,
        })
    }

    /// Packs row-major `b` (`k × n`) in panels of [`NR`] columns whatever the CPU, as
    /// [`gemm_cols`] reads them.
    pub(crate) fn for_cols(b: &[f32], k: usize, n: usize) -> KResult<PackedB> {
        PackedB::with_width(b, k, n, NR)
    }

    /// The elements of the copy [`PackedB::for_cols`] makes.
    pub(crate) fn cols_len_for(k: usize, n: usize) -> usize {
        packed_len(k, n, NR)
    }

    /// The elements of the packed copy (for the memory check before packing).
    pub(crate) fn len_for(k: usize, n: usize) -> usize {
        packed_len(k, n, panel_width())
    }

    /// `(k, n)`.
    pub(crate) fn dims(&self) -> (usize, usize) {
        (self.k, self.n)
    }

    /// Panel `i` (`k × nr`, `k`-major).
    fn panel(&self, i: usize) -> &[f32] {
        let data: &[f32] = bytemuck::cast_slice(&self.data);
        &data[i * self.k * self.nr..(i + 1) * self.k * self.nr]
    }
}

/// `c = a @ b` (`a`: `m × k` row-major, `c`: `m × n` row-major) on up to `threads` threads,
/// with `epilogue` run on every row of every tile right after the tile is computed. Needs
/// `m ≥ MIN_ROWS` (see the module doc).
pub(crate) fn gemm(
    m: usize,
    a: &[f32],
    b: &PackedB,
    c: &mut [f32],
    threads: usize,
    epilogue: Option<Epilogue<'_>>,
) -> KResult<()> {
    let rows = epilogue.map(|ep| {
        move |r0: usize, c0: usize, mut tile: MatMut<'_, f32>| -> KResult<()> {
            for i in 0..tile.nrows() {
                ep(r0 + i, c0, row_slice(tile.rb_mut(), i)?);
            }
            Ok(())
        }
    });
    let rows = rows.as_ref().map(|f| f as TileEpilogue<'_>);
    gemm_tiles(m, a, b, c, threads, rows)
}

/// An epilogue that takes a whole tile of [`gemm_tiles`]: `f(first row, first column, tile)`.
pub(crate) type TileEpilogue<'e> =
    &'e (dyn Fn(usize, usize, MatMut<'_, f32>) -> KResult<()> + Sync);

/// [`gemm`] with `epilogue` run once per tile on the whole tile (a caller with many short rows
/// then pays one call per tile rather than one per row).
pub(crate) fn gemm_tiles(
    m: usize,
    a: &[f32],
    b: &PackedB,
    c: &mut [f32],
    threads: usize,
    epilogue: Option<TileEpilogue<'_>>,
) -> KResult<()> {
    let (k, n) = (b.k, b.n);
    if a.len() != m * k || c.len() != m * n {
        return Err(format!(
            "gemm: {m}x{k} @ {k}x{n} needs {} and {} elements, found {} and {}",
            m * k,
            m * n,
            a.len(),
            c.len()
        ));
    }
    let c = MatMut::from_row_major_slice_mut(c, m, n);
    gemm_lhs(m, Lhs::Rows(a), b, c, threads, epilogue)
}

/// Whether [`gemm_src`] runs on this CPU: the narrower vectors' path, which copies `A` into
/// blocks of rows before the kernel reads it (the AVX-512 kernel reads `A`'s rows in place).
pub(crate) fn takes_src() -> bool {
    chunked(crate::simd::f32_lanes())
}

/// [`gemm`] with `A` (`m × k`) read through `src` ([`ColsSrc`]: element `[i][p]` at
/// `data[steps[p] + (i / row) · pitch + i % row]`, so an operand stored `k`-major, such as a
/// convolution's data or a Winograd block's transformed data, needs no transposed copy):
/// [`pack_src`] copies it into the blocks [`tile_chunked`] reads, then the same chains. Only
/// where [`takes_src`]; needs `m ≥ MIN_ROWS`. `c` (`m × n`) may have any strides: a tile of
/// `C` that is not row-major (a convolution's `NCHW` output seen as pixels × channels) is
/// computed in a per-thread buffer and copied into place (8 columns at a time), then
/// `epilogue` runs on it as in [`gemm_tiles`].
pub(crate) fn gemm_src(
    m: usize,
    src: ColsSrc<'_>,
    b: &PackedB,
    c: MatMut<'_, f32>,
    threads: usize,
    epilogue: Option<TileEpilogue<'_>>,
) -> KResult<()> {
    let (k, n) = (b.k, b.n);
    if !takes_src() {
        return Err("gemm: the AVX-512 kernel reads the rows of A in place".to_string());
    }
    if src.steps.len() != k || (c.nrows(), c.ncols()) != (m, n) {
        return Err(format!(
            "gemm: {m}x{k} @ {k}x{n} needs {k} steps and a {m}x{n} result, found {} and {}x{}",
            src.steps.len(),
            c.nrows(),
            c.ncols()
        ));
    }
    if !src.reads_inside(m) {
        return Err(format!(
            "gemm: {m} rows in runs of {} (pitch {}) over {} values do not fit",
            src.row,
            src.pitch,
            src.data.len()
        ));
    }
    gemm_lhs(m, Lhs::Src(src), b, c, threads, epilogue)
}

/// The left operand of [`gemm_lhs`]: row-major, or read through a [`ColsSrc`].
#[derive(Clone, Copy)]
enum Lhs<'a> {
    Rows(&'a [f32]),
    Src(ColsSrc<'a>),
}

/// [`gemm_tiles`] and [`gemm_src`] past their checks of the operands' sizes.
fn gemm_lhs(
    m: usize,
    lhs: Lhs<'_>,
    b: &PackedB,
    c: MatMut<'_, f32>,
    threads: usize,
    epilogue: Option<TileEpilogue<'_>>,
) -> KResult<()> {
    let (k, n, nr) = (b.k, b.n, b.nr);
    if m < MIN_ROWS {
        return Err(format!(
            "gemm: the packed kernel takes at least {MIN_ROWS} rows, found {m}"
        ));
    }
    if n == 0 {
        return Ok(());
    }
    // Tiles: row blocks of up to ROWS rows, by runs of whole panels of about TILE_MACS.
    let panels = n.div_ceil(nr);
    let row_blocks = m.div_ceil(ROWS);
    // Whole blocks of MR_N rows per tile, so that a tile's rows of the packed A start a block.
    let rows = m.div_ceil(row_blocks).next_multiple_of(MR_N);
    let per_panel = rows * k.max(1) * nr;
    let run = TILE_MACS.div_ceil(per_panel).clamp(1, panels);
    let mut tasks: Vec<(usize, usize, MatMut<'_, f32>)> = Vec::new();
    let mut rest = c;
    let mut r0 = 0;
    while r0 < m {
        let h = rows.min(m - r0);
        let (band, below) = rest.split_at_row_mut(h);
        rest = below;
        // The band in sub-bands whose rows of `A` fit [`A_BAND_BYTES`], each cut by panels;
        // the tasks panel by panel, a panel's sub-bands one after the other (one thread's
        // run, as a rule), so the panel is read from memory once and the sub-bands pass it.
        let subs = if chunked(crate::simd::f32_lanes()) {
            1
        } else {
            (h * k * std::mem::size_of::<f32>())
                .div_ceil(A_BAND_BYTES)
                .clamp(1, h.div_ceil(SUB_ROWS))
        };
        let sub_rows = h.div_ceil(subs).next_multiple_of(SUB_ROWS);
        let mut cut: Vec<std::vec::IntoIter<(usize, usize, MatMut<'_, f32>)>> = Vec::new();
        let mut band = band;
        let mut s0 = 0;
        while s0 < h {
            let sh = sub_rows.min(h - s0);
            let (sub, below) = band.split_at_row_mut(sh);
            band = below;
            let mut sub = sub;
            let mut row = Vec::new();
            let mut p0 = 0;
            while p0 < panels {
                let p1 = (p0 + run).min(panels);
                let cols = (p1 * nr).min(n) - p0 * nr;
                let (tile, right) = sub.split_at_col_mut(cols);
                sub = right;
                row.push((r0 + s0, p0, tile));
                p0 = p1;
            }
            cut.push(row.into_iter());
            s0 += sh;
        }
        for _ in 0..panels.div_ceil(run) {
            tasks.extend(cut.iter_mut().filter_map(Iterator::next));
        }
        r0 += h;
    }
    let threads = threads.min((m * n * k.max(1)).div_ceil(TILE_MACS)).max(1);
    crate::par::with_scratch(&APACK, |apack| {
        let a = match lhs {
            Lhs::Rows(a) if chunked(crate::simd::f32_lanes()) => {
                pack_rows(a, m, k, apack, threads);
                a
            }
            Lhs::Rows(a) => {
                apack.clear();
                a
            }
            Lhs::Src(src) => {
                pack_src(src, m, k, apack, threads);
                &[]
            }
        };
        let apack = &apack[..];
        crate::par::run_tasks(tasks, threads, |(r0, p0, mut tile)| {
            let one = |c: MatMut<'_, f32>| {
                crate::par::with_scratch(&SUMS, |sums| {
                    crate::simd::dispatch(Tile {
                        a,
                        apack,
                        k,
                        b,
                        r0,
                        p0,
                        c,
                        sums,
                    })
                })
            };
            if tile.col_stride() == 1 {
                one(tile.rb_mut())?;
            } else {
                // Not row-major: computed in this thread's buffer, then copied into place.
                crate::par::with_scratch(&TILE, |buf| {
                    let (h, w) = (tile.nrows(), tile.ncols());
                    buf.resize(h * w, 0.0);
                    one(MatMut::from_row_major_slice_mut(&mut buf[..h * w], h, w))?;
                    copy_rows(&buf[..h * w], w, tile.rb_mut());
                    Ok::<(), String>(())
                })?;
            }
            if let Some(ep) = epilogue {
                ep(r0, p0 * nr, tile.rb_mut())?;
            }
            Ok(())
        })
    })
}

/// `t` (row-major, rows of `w`) into `dst` (any strides), 8 columns at a time: where `dst` is
/// column-major (an `NCHW` output), 8 sequential writes per row of `t` read.
pub(crate) fn copy_rows(t: &[f32], w: usize, mut dst: MatMut<'_, f32>) {
    if dst.row_stride() == 1 {
        // Column-major: each column a slice, filled 8 at a time.
        let mut cols: Vec<&mut [f32]> = dst
            .col_iter_mut()
            .filter_map(|c| c.try_as_col_major_mut().map(|c| c.as_slice_mut()))
            .collect();
        for (j0, group) in (0..w).step_by(8).zip(cols.chunks_mut(8)) {
            for (i, row) in t.chunks_exact(w).enumerate() {
                for (col, &v) in group.iter_mut().zip(&row[j0..]) {
                    col[i] = v;
                }
            }
        }
        return;
    }
    for (i, row) in t.chunks_exact(w).enumerate() {
        for (j, &v) in row.iter().enumerate() {
            dst[(i, j)] = v;
        }
    }
}

thread_local! {
    /// [`gemm_src`]'s tile of `C` on the calling thread, where its place is not row-major.
    static TILE: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Whether vectors of `lanes` `f32`s run [`tile_chunked`] (which reads `A` packed by
/// [`pack_rows`]) rather than [`tile`]: everything narrower than AVX-512. The one place the
/// path is chosen, for [`gemm`]'s packing and [`Tile`]'s dispatch alike.
fn chunked(lanes: usize) -> bool {
    lanes < 16
}

thread_local! {
    /// [`gemm`]'s packed rows of `A`, kept between calls on the calling thread (as large as
    /// the largest `A` it packed: the size of an input that already exists).
    static APACK: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `a` (`m × k`) into `out` as [`tile_chunked`] reads it: blocks of [`MR_N`] rows, each
/// step-major (`block[p · MR_N + r]` is `a[block · MR_N + r][p]`), rows past `m` zero; on up
/// to `threads` threads.
fn pack_rows(a: &[f32], m: usize, k: usize, out: &mut Vec<f32>, threads: usize) {
    let zeros = vec![0.0f32; k];
    pack_blocks(m, k, out, threads, |first, blk| {
        // The block's rows (zeros past `m`), read side by side: one sequential write.
        let rows: [&[f32]; MR_N] = std::array::from_fn(|r| {
            a.get((first + r) * k..(first + r + 1) * k)
                .unwrap_or(&zeros)
        });
        for (p, d) in blk.chunks_exact_mut(MR_N).enumerate() {
            for (d, row) in d.iter_mut().zip(&rows) {
                *d = row[p];
            }
        }
    });
}

/// [`pack_rows`] for an `A` read through `src` ([`gemm_src`], which checked that every
/// value read lies inside `src.data`): a block's rows are `MR_N` consecutive `i`, whose
/// values at each step are one copy where they are consecutive in `data` (a block within one
/// run of `src.row`), else gathered one by one.
fn pack_src(src: ColsSrc<'_>, m: usize, k: usize, out: &mut Vec<f32>, threads: usize) {
    pack_blocks(m, k, out, threads, |first, blk| {
        // Each row's offset past a step's (`None` past `m`: zeros).
        let at: [Option<usize>; MR_N] =
            std::array::from_fn(|r| (first + r < m).then(|| src.base(first + r)));
        match (at[0], at[MR_N - 1]) {
            (Some(a0), Some(a5)) if a5 == a0 + MR_N - 1 => {
                for (d, &s) in blk.chunks_exact_mut(MR_N).zip(src.steps) {
                    d.copy_from_slice(&src.data[s + a0..s + a0 + MR_N]);
                }
            }
            _ => {
                for (d, &s) in blk.chunks_exact_mut(MR_N).zip(src.steps) {
                    for (d, a) in d.iter_mut().zip(&at) {
                        *d = a.map_or(0.0, |a| src.data[s + a]);
                    }
                }
            }
        }
    });
}

/// The fewest values of `A` [`pack_blocks`] gives a thread. BERT's and GPT-2's `128 × 768`
/// activations (22 blocks, 101,376 values with the padding) then pack on two threads, about
/// 15 µs each instead of 30 µs on one (the parallel region costs a few µs: its helpers are
/// awake inside [`crate::par::on_pool`]). With `1 << 16` they packed on one thread; with this
/// grain the `128 × 768 @ 768 × 768` product on two threads took 0.94–0.98 of its time
/// (median 0.97, four alternated runs of 15 rounds, 12 weights), `768 × 2304` 0.96–1.02, and
/// `3072 × 768`, which packs on two threads either way, 0.99–1.01. The convolutions' copies
/// ([`pack_src`]) share the grain; ResNet-50 and MobileNetV2 alternated at 1.00–1.01
/// (bench/RESULTS.md, session bx).
const PACK_GRAIN: usize = 1 << 15;

/// `out` sized for the `⌈m / MR_N⌉` blocks of `MR_N × k` values of an `m × k` operand, each
/// filled by `fill(first row, block)`, the blocks spread over up to `threads` threads. Every
/// element is written by `fill`, so a kept buffer's old contents need no zeroing.
fn pack_blocks(
    m: usize,
    k: usize,
    out: &mut Vec<f32>,
    threads: usize,
    fill: impl Fn(usize, &mut [f32]) + Sync,
) {
    let per = MR_N * k;
    let blocks = m.div_ceil(MR_N);
    out.truncate(blocks * per);
    out.resize(blocks * per, 0.0);
    if per == 0 {
        return;
    }
    let threads = threads.min(crate::par::threads_for(blocks * per, PACK_GRAIN));
    crate::par::for_each_chunk_mut(out, per * blocks.div_ceil(threads), threads, |off, dst| {
        for (i, blk) in dst.chunks_exact_mut(per).enumerate() {
            fill((off / per + i) * MR_N, blk);
        }
    });
}

/// Row `i` of a row-major tile as a slice.
fn row_slice<'t>(tile: MatMut<'t, f32>, i: usize) -> KResult<&'t mut [f32]> {
    tile.row_mut(i)
        .try_as_row_major_mut()
        .map(|r| r.as_slice_mut())
        .ok_or_else(|| "gemm: an output tile is not row-major".to_string())
}

/// One tile of [`gemm`]: rows `r0..` of `a`, panels `p0..` of `b`, into `c`. `apack` is
/// `a` packed by [`pack_rows`] where the instruction set's path reads it (empty otherwise).
struct Tile<'a, 'c> {
    a: &'a [f32],
    apack: &'a [f32],
    k: usize,
    b: &'a PackedB,
    r0: usize,
    p0: usize,
    c: MatMut<'c, f32>,
    /// The running sums of [`tile_chunked`] (the calling thread's [`SUMS`]).
    sums: &'a mut Vec<f32>,
}

impl pulp::WithSimd for Tile<'_, '_> {
    type Output = KResult<()>;
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) -> KResult<()> {
        if chunked(S::F32_LANES) {
            tile_chunked(simd, self)
        } else {
            tile::<S, 8>(simd, self)
        }
    }
}

/// [`Tile`] with `MR` rows per micro-kernel block: panel by panel, row block by row block
/// (the panel stays in L1/L2 while the row blocks pass over it), each block prefetching its
/// share of the next panel's lines toward L2.
#[inline(always)]
fn tile<S: pulp::Simd, const MR: usize>(simd: S, t: Tile<'_, '_>) -> KResult<()> {
    let Tile {
        a,
        k,
        b,
        r0,
        p0,
        mut c,
        ..
    } = t;
    let (h, w) = (c.nrows(), c.ncols());
    if a.len() < (r0 + h) * k {
        return Err(format!(
            "gemm: the AVX-512 kernel reads rows {r0}..{} of A in place, it holds {} elements",
            r0 + h,
            a.len()
        ));
    }
    if b.nr != NR {
        return Err(format!(
            "gemm: the AVX-512 kernel reads panels of {NR} columns, these have {}",
            b.nr
        ));
    }
    let zeros = vec![0.0f32; k];
    let panels = b.n.div_ceil(NR);
    let blocks = h.div_ceil(MR);
    let prefetch = Prefetch::new();
    for (j, pnl) in (p0..).take(w.div_ceil(NR)).enumerate() {
        let panel = b.panel(pnl);
        let cols = NR.min(w - j * NR);
        // The panel after this one (the tile's next, or the one the next tile in order starts
        // with), toward L2 while this one's row blocks run, a share of its lines per block:
        // a weight streamed from memory otherwise left each panel's first block waiting.
        let next = if pnl + 1 < panels {
            b.panel(pnl + 1)
        } else {
            &[]
        };
        for (blk, i0) in (0..h).step_by(MR).enumerate() {
            let ahead = Ahead {
                prefetch,
                lines: line_share(next, blk, blocks),
            };
            let valid = MR.min(h - i0);
            let rows: [&[f32]; MR] = std::array::from_fn(|r| {
                if r < valid {
                    let at = (r0 + i0 + r) * k;
                    &a[at..at + k]
                } else {
                    &zeros[..]
                }
            });
            let block = kernel::<S, MR>(simd, &rows, panel, k, ahead);
            for (r, vals) in block.iter().enumerate().take(valid) {
                let row = row_slice(c.rb_mut(), i0 + r)?;
                row[j * NR..j * NR + cols].copy_from_slice(&vals[..cols]);
            }
        }
    }
    Ok(())
}

/// Steps of `k` per chunk in [`tile_chunked`]: a chunk of one 16-column slice of a panel
/// (`KC × 64` bytes) stays in a core's 32 KB L1 while every row block of the tile passes it.
const KC: usize = 256;

/// Rows per micro-kernel block in [`tile_chunked`]: `MR_N × 2` running sums, the two
/// vectors of the slice and the broadcast take 15 of AVX2's 16 registers.
const MR_N: usize = 6;

/// [`Tile`] with narrower vectors (AVX2's 8 lanes and below), where the panel's rows no longer
/// fit the registers whole: `k` in chunks of [`KC`] steps, and per chunk each slice of
/// `2 × lanes` columns of each panel is computed for every row block of the packed `A` while
/// the slice's chunk is in L1. The running sums of each (slice, row block) pair live between
/// chunks in one contiguous `MR_N × 2 × lanes` block of a per-thread buffer ([`SUMS`]) and are
/// reloaded unchanged, so every element is still the one in-order FMA chain from `+0.0`; the
/// last chunk's sums are stored into the tile's rows of `C` ([`store`]).
#[inline(always)]
fn tile_chunked<S: pulp::Simd>(simd: S, t: Tile<'_, '_>) -> KResult<()> {
    let Tile {
        apack,
        k,
        b,
        r0,
        p0,
        mut c,
        sums,
        ..
    } = t;
    let (h, w) = (c.nrows(), c.ncols());
    if r0 % MR_N != 0 {
        return Err(format!(
            "gemm: a tile starts at row {r0}, not a block of {MR_N}"
        ));
    }
    let per = MR_N * k;
    let blocks = h.div_ceil(MR_N);
    let Some(apack) = apack.get(r0 / MR_N * per..(r0 / MR_N + blocks) * per) else {
        return Err(format!(
            "gemm: the packed rows of A hold {} elements, rows {r0}.. of {k} steps need more",
            apack.len()
        ));
    };
    if k == 0 {
        for i in 0..h {
            row_slice(c.rb_mut(), i)?.fill(0.0);
        }
        return Ok(());
    }
    let lanes = S::F32_LANES;
    let sw = 2 * lanes;
    let nr = b.nr;
    if !nr.is_multiple_of(sw) {
        // (Never for 1-, 4- or 8-lane vectors and panels of 16 or 48 columns; `micro` relies
        // on whole slices of a panel.)
        return Err(format!(
            "gemm: slices of {sw} columns do not divide a panel of {nr}"
        ));
    }
    // The tile's rows of `C`, where the last chunk's sums go.
    let mut out: Vec<&mut [f32]> = c
        .rb_mut()
        .row_iter_mut()
        .map(|row| row.try_as_row_major_mut().map(|r| r.as_slice_mut()))
        .collect::<Option<_>>()
        .ok_or_else(|| "gemm: an output tile is not row-major".to_string())?;
    // The running sums of the tile's slice `s` (panel by panel) and row block `blk` between
    // chunks: `sums[(s · blocks + blk) · block ..][..block]`, row-major `MR_N × sw`.
    let block = MR_N * sw;
    let slices = w.div_ceil(sw);
    let last = (k - 1) / KC * KC;
    // Every block is written by the first chunk before any is read (none with one chunk).
    sums.resize(if last > 0 { slices * blocks * block } else { 0 }, 0.0);
    let prefetch = Prefetch::new();
    // Slice `s`'s chunk from step `kc`: its panel's `kl × nr` rows, the slice's first column
    // in them, and `kl`.
    let chunk = |s: usize, kc: usize| {
        let (pnl, off) = (p0 + s * sw / nr, s * sw % nr);
        let kl = KC.min(k - kc);
        (&b.panel(pnl)[kc * nr..(kc + kl) * nr], off, kl)
    };
    for kc in (0..k).step_by(KC) {
        for s in 0..slices {
            let (panel, off, kl) = chunk(s, kc);
            // The slice the kernel reads next: the next of this chunk, else the first of the
            // next chunk. Its rows are prefetched a share per row block, so they are in L1
            // when its first row block starts.
            let next = if s + 1 < slices {
                Some(chunk(s + 1, kc))
            } else {
                (kc + KC < k).then(|| chunk(0, kc + KC))
            };
            for (blk, ap) in apack.chunks_exact(per).enumerate() {
                if let Some((panel, off, kl)) = next {
                    // By index: `chunks_exact(nr).take(q1).skip(q0)` left a call (and a
                    // `vzeroupper`) per row block, 2–3% of the GEMM (alternated, one
                    // thread and two, AVX2).
                    let (q0, q1) = (blk * kl / blocks, (blk + 1) * kl / blocks);
                    for row in q0..q1 {
                        if let Some(line) = panel.get(row * nr + off..) {
                            prefetch.line(line);
                        }
                    }
                }
                let run = Block {
                    ap: &ap[kc * MR_N..(kc + kl) * MR_N],
                    panel: (panel, nr),
                    off,
                    // (Empty with one chunk: the block is then both first and last.)
                    sums: sums
                        .get_mut((s * blocks + blk) * block..(s * blocks + blk + 1) * block)
                        .unwrap_or_default(),
                    first: kc == 0,
                    last: kc == last,
                };
                // A block with fewer live rows (the last of a tile whose rows are not a
                // multiple of MR_N: BERT's and GPT-2's 128 rows end in a block of 2) runs
                // the kernel on those rows only: 4 of 132 row FMAs saved.
                match h - blk * MR_N {
                    1 | 2 => run.rows::<S, 2>(simd, &mut out, blk * MR_N, s * sw),
                    3 | 4 => run.rows::<S, 4>(simd, &mut out, blk * MR_N, s * sw),
                    _ => run.rows::<S, MR_N>(simd, &mut out, blk * MR_N, s * sw),
                }
            }
        }
    }
    Ok(())
}

/// Part `i` of `n` of `panel`'s cache lines (whole [`Line`]s): what one of `n` micro-kernel
/// calls on the panel before it prefetches of it.
pub(crate) fn line_share(panel: &[f32], i: usize, n: usize) -> &[f32] {
    let lines = panel.len() / LINE;
    &panel[i * lines / n.max(1) * LINE..(i + 1) * lines / n.max(1) * LINE]
}

/// Lines of packed `B` (a panel the kernel reads next) that a micro-kernel prefetches toward
/// L2 while it runs ([`gemm`]'s `kernel`, [`gemm_cols`]'s `kernel_cols`).
#[derive(Clone, Copy)]
pub(crate) struct Ahead<'a> {
    prefetch: Prefetch,
    lines: &'a [f32],
}

impl<'a> Ahead<'a> {
    /// The whole lines of `lines`, to be prefetched toward L2 as a kernel runs.
    #[inline(always)]
    pub(crate) fn new(prefetch: Prefetch, lines: &'a [f32]) -> Ahead<'a> {
        Ahead { prefetch, lines }
    }

    /// The lines spread evenly over `k` steps ([`Spread::step`] once per step).
    #[inline(always)]
    pub(crate) fn over(self, k: usize) -> Spread<'a> {
        Spread {
            prefetch: self.prefetch,
            lines: self.lines.len() / LINE,
            k: k.max(1),
            due: 0,
            next: self.lines.chunks_exact(LINE),
        }
    }
}

/// [`Ahead`]'s lines in flight: line `i` is prefetched at the step where `i + 1` lines are
/// due.
pub(crate) struct Spread<'a> {
    prefetch: Prefetch,
    lines: usize,
    k: usize,
    due: usize,
    next: std::slice::ChunksExact<'a, f32>,
}

impl Spread<'_> {
    /// One step of the kernel: the lines now due.
    #[inline(always)]
    pub(crate) fn step(&mut self) {
        self.due += self.lines;
        while self.due >= self.k {
            self.due -= self.k;
            if let Some(line) = self.next.next() {
                self.prefetch.line_l2(line);
            }
        }
    }
}

/// Software prefetch through `pulp`'s SSE token, into L1 (`T0`) or toward L2 (`T1`): a hint
/// that never faults or changes a result, a no-op where the CPU has no SSE or is not x86-64.
#[derive(Clone, Copy)]
pub(crate) struct Prefetch(#[cfg(target_arch = "x86_64")] Option<pulp::core_arch::x86::Sse>);

impl Prefetch {
    #[inline(always)]
    pub(crate) fn new() -> Prefetch {
        #[cfg(target_arch = "x86_64")]
        return Prefetch(pulp::core_arch::x86::Sse::try_new());
        #[cfg(not(target_arch = "x86_64"))]
        Prefetch()
    }

    /// Prefetches the cache line that holds `data`'s first element with the `T1` hint (meant
    /// for L2 and outward, so that a line wanted a panel later does not evict L1's working
    /// set; where a CPU places it is its own choice).
    #[inline(always)]
    fn line_l2(self, data: &[f32]) {
        self.hinted::<2>(data);
    }

    /// Prefetches every cache line of `data` with the `T1` hint, all at once.
    #[inline]
    pub(crate) fn all_l2(self, data: &[f32]) {
        for line in data.chunks(LINE) {
            self.line_l2(line);
        }
    }

    /// Prefetches the cache line that holds `data`'s first element (the `T0` hint).
    #[inline(always)]
    fn line(self, data: &[f32]) {
        self.hinted::<3>(data);
    }

    /// Prefetches the cache line that holds `data`'s first element for writing (`prefetchw`,
    /// the `ET0` hint): the line arrives owned, so the stores that follow need no request for
    /// ownership of their own.
    #[inline(always)]
    pub(crate) fn line_for_write(self, data: &[f32]) {
        self.hinted::<7>(data);
    }

    /// `prefetch` with hint `H` (x86's encoding: 3 is `T0`, 2 is `T1`, 7 is `ET0`; checked
    /// below).
    #[inline(always)]
    fn hinted<const H: i32>(self, data: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if let Some(sse) = self.0 {
            sse._mm_prefetch::<H>(data.as_ptr().cast());
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = data;
    }
}

// The hints `Prefetch::line`, `Prefetch::line_l2` and `Prefetch::line_for_write` pass are
// `T0`, `T1` and `ET0`.
#[cfg(target_arch = "x86_64")]
const _: () = assert!(
    std::arch::x86_64::_MM_HINT_T0 == 3
        && std::arch::x86_64::_MM_HINT_T1 == 2
        && std::arch::x86_64::_MM_HINT_ET0 == 7,
    "x86's prefetch hint encoding"
);

/// One row block of [`tile_chunked`] over one chunk of one slice: the packed rows `ap`
/// (`kl × MR_N`, step-major), the panel's chunk and `nr`, the slice's first column `off` in
/// it, and the block's running sums (`MR_N × sw`, row-major) in the per-thread buffer.
struct Block<'a> {
    ap: &'a [f32],
    panel: (&'a [f32], usize),
    off: usize,
    sums: &'a mut [f32],
    /// The chunk is the first of `k` (the sums start at `+0.0`, not from `sums`).
    first: bool,
    /// The chunk is the last of `k` (the sums go into `C`, not back into `sums`).
    last: bool,
}

impl Block<'_> {
    /// The block's first `R` rows (`R ≤ MR_N`; the live ones and perhaps a padding row):
    /// their running sums continued over the chunk by [`micro`], then kept in `sums` or
    /// stored into the tile's rows `i0..` and columns `j0..` ([`store`]).
    #[inline(always)]
    fn rows<S: pulp::Simd, const R: usize>(
        self,
        simd: S,
        out: &mut [&mut [f32]],
        i0: usize,
        j0: usize,
    ) {
        let lanes = S::F32_LANES;
        let sw = 2 * lanes;
        let acc: [[S::f32s; 2]; R] = if self.first {
            [[simd.splat_f32s(0.0); 2]; R]
        } else {
            std::array::from_fn(|r| {
                std::array::from_fn(|v| {
                    let at = r * sw + v * lanes;
                    bytemuck::pod_read_unaligned(bytemuck::cast_slice(&self.sums[at..at + lanes]))
                })
            })
        };
        let acc = micro(simd, self.ap, self.panel, self.off, acc);
        let vals: &[f32] = bytemuck::cast_slice(acc.as_flattened());
        if self.last {
            store(vals, out, i0, j0, sw);
        } else {
            self.sums[..vals.len()].copy_from_slice(vals);
        }
    }
}

/// A finished block of up to [`MR_N`] rows × `sw` (`vals`, row-major) into the tile's rows
/// `i0..` (`out`) and columns `j0..`, clipped to the tile.
#[inline(always)]
fn store(vals: &[f32], out: &mut [&mut [f32]], i0: usize, j0: usize, sw: usize) {
    for (r, row) in out.iter_mut().skip(i0).take(vals.len() / sw).enumerate() {
        let src = &vals[r * sw..(r + 1) * sw];
        match row.get_mut(j0..j0 + sw) {
            // A whole slice: a copy of a length the compiler knows (vector moves).
            Some(dst) => dst.copy_from_slice(src),
            None => {
                let dst = &mut row[j0..];
                let n = dst.len();
                dst.copy_from_slice(&src[..n]);
            }
        }
    }
}

thread_local! {
    /// [`tile_chunked`]'s running sums of one tile, kept between calls on each thread (as
    /// large as the largest tile it computed with more than one chunk of `k`: up to [`ROWS`]
    /// rows rounded up to a block, by a run of panels of about [`TILE_MACS`] multiply-adds, so
    /// at most about `TILE_MACS / k` floats for `k > KC`: 64 KB).
    static SUMS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The first `R` of a block's [`MR_N`] rows × `2 × lanes` columns (panel columns `off..`):
/// continues the running sums `acc` over the chunk, one FMA per step in order. `ap`: the row
/// block's packed chunk (`kl × MR_N`, step-major); `panel`: the panel's chunk (`kl × nr`) and
/// `nr`. Two steps per loop iteration (4–15% faster than one on AVX2: less loop overhead per
/// 12 FMAs), then the odd last step.
#[inline(always)]
fn micro<S: pulp::Simd, const R: usize>(
    simd: S,
    ap: &[f32],
    (panel, nr): (&[f32], usize),
    off: usize,
    mut acc: [[S::f32s; 2]; R],
) -> [[S::f32s; 2]; R] {
    let sw = 2 * S::F32_LANES;
    // Never taken (`tile_chunked` checked that slices divide a panel); it lets LLVM drop the
    // bounds checks of the loop below.
    if off + sw > nr {
        return acc;
    }
    let mut ap2 = ap.chunks_exact(2 * MR_N);
    let mut panel2 = panel.chunks_exact(2 * nr);
    for (av, bp) in (&mut ap2).zip(&mut panel2) {
        step(simd, &av[..MR_N], &bp[off..off + sw], &mut acc);
        step(simd, &av[MR_N..], &bp[nr + off..nr + off + sw], &mut acc);
    }
    for (av, bp) in ap2
        .remainder()
        .chunks_exact(MR_N)
        .zip(panel2.remainder().chunks_exact(nr))
    {
        step(simd, av, &bp[off..off + sw], &mut acc);
    }
    acc
}

/// One step of [`micro`]: `acc[r] += av[r] · b` for the first `R` rows, `b` the slice's two
/// vectors (`bp`: `2 × lanes` values).
#[inline(always)]
fn step<S: pulp::Simd, const R: usize>(
    simd: S,
    av: &[f32],
    bp: &[f32],
    acc: &mut [[S::f32s; 2]; R],
) {
    let lanes = S::F32_LANES;
    let b0: S::f32s = bytemuck::pod_read_unaligned(bytemuck::cast_slice(&bp[..lanes]));
    let b1: S::f32s = bytemuck::pod_read_unaligned(bytemuck::cast_slice(&bp[lanes..2 * lanes]));
    for (acc, &x) in acc.iter_mut().zip(av) {
        let x = simd.splat_f32s(x);
        acc[0] = simd.mul_add_f32s(x, b0, acc[0]);
        acc[1] = simd.mul_add_f32s(x, b1, acc[1]);
    }
}

/// `MR` rows × [`NR`] columns of `C`: `Σ_p rows[r][p] · panel[p][j]`, one FMA per step in
/// `p` order from `+0.0`, in sub-blocks of 3 vectors held in registers over all of `k`; the
/// lines of `ahead` are prefetched toward L2 on the way, spread evenly over the steps.
#[inline(always)]
fn kernel<S: pulp::Simd, const MR: usize>(
    simd: S,
    rows: &[&[f32]; MR],
    panel: &[f32],
    k: usize,
    ahead: Ahead<'_>,
) -> [[f32; NR]; MR] {
    let lanes = S::F32_LANES;
    let width = 3 * lanes;
    let mut out = [[0.0f32; NR]; MR];
    let zero = simd.splat_f32s(0.0);
    let mut spread = ahead.over(k);
    for j0 in (0..NR).step_by(width) {
        let mut acc = [[zero; 3]; MR];
        for (p, bp) in panel.chunks_exact(NR).take(k).enumerate() {
            spread.step();
            let Some(bp) = bp.get(j0..j0 + width) else {
                continue;
            };
            let bv: [S::f32s; 3] = std::array::from_fn(|v| {
                bytemuck::pod_read_unaligned(bytemuck::cast_slice(&bp[v * lanes..(v + 1) * lanes]))
            });
            for (acc, row) in acc.iter_mut().zip(rows) {
                let x = simd.splat_f32s(row.get(p).copied().unwrap_or(0.0));
                for (a, &bv) in acc.iter_mut().zip(&bv) {
                    *a = simd.mul_add_f32s(x, bv, *a);
                }
            }
        }
        for (acc, o) in acc.iter().zip(out.iter_mut()) {
            for (v, a) in acc.iter().enumerate() {
                let vals: &[f32] = bytemuck::cast_slice(std::slice::from_ref(a));
                o[j0 + v * lanes..j0 + (v + 1) * lanes].copy_from_slice(vals);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::util::test_values as values;

    /// The definition the contract states: one FMA chain over `k` in order from `+0.0`,
    /// written without the kernel (plain scalar `mul_add`).
    pub(super) fn chain(m: usize, k: usize, n: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
        let mut c = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0f32;
                for p in 0..k {
                    acc = a[i * k + p].mul_add(b[p * n + j], acc);
                }
                c[i * n + j] = acc;
            }
        }
        c
    }

    pub(super) fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn every_element_is_the_in_order_fma_chain_for_edge_shapes_and_thread_counts() {
        // Rows not a multiple of 8 or 4, columns not a multiple of a panel, one column, a
        // panel exactly, several tiles (k · rows · 48 > TILE_MACS), more than 256 rows; rows
        // of `A` past A_BAND_BYTES (three sub-bands, the last of 4 rows; two bands of two).
        // On the chunked path, a last row block of every count of live rows (1–5: the
        // kernel on 2, 4 or 6 rows), with one chunk of `k` and with several (128 rows: 21
        // blocks and one of 2, as BERT's and GPT-2's layers).
        for (m, k, n) in [
            (8usize, 1usize, 1usize),
            (29, 300, 20),
            (128, 700, 40),
            (9, 3, 47),
            (13, 17, 48),
            (31, 64, 97),
            (64, 300, 200),
            (300, 40, 130),
            (40, 2000, 250),
            (100, 3000, 60),
            (300, 1200, 100),
        ] {
            let a = values(m * k, (m * 31 + k) as u64);
            let b = values(k * n, (n * 17 + k) as u64);
            let want = chain(m, k, n, &a, &b);
            let packed = PackedB::new(&b, k, n).unwrap_or_else(|e| panic!("{e}"));
            for threads in [1, 2, 3] {
                let mut c = vec![f32::NAN; m * n];
                crate::par::with_threads(threads, || gemm(m, &a, &packed, &mut c, threads, None))
                    .unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(bits(&c), bits(&want), "{m}x{k}x{n} on {threads} threads");
            }
        }
    }

    /// `gemm_src` reads `A` through a `ColsSrc` (runs of `row` rows `pitch` apart, each step
    /// at its own offset, blocks of 6 rows that cross a run gathered one by one) and gives
    /// the chains of `gemm` on the same `A`, bit for bit, on every thread count; where it
    /// does not run (AVX-512), or the source does not fit its data, it is an error.
    #[test]
    fn a_read_through_a_source_gives_the_same_chains() {
        for (m, k, n, row, pitch) in [
            (8usize, 1usize, 1usize, 8usize, 8usize),
            (16, 512, 40, 16, 16),
            (49, 300, 70, 7, 9),
            (30, 33, 17, 5, 5),
            (200, 700, 20, 14, 16),
        ] {
            let stride = (m / row + 1) * pitch + 3;
            let data = values(k * stride, (m * 13 + k) as u64);
            // Step `p` starts at `p · stride` in reverse order: any offsets, not one pitch.
            let steps: Vec<usize> = (0..k).map(|p| (k - 1 - p) * stride).collect();
            let src = ColsSrc {
                data: &data,
                steps: &steps,
                row,
                pitch,
            };
            let a: Vec<f32> = (0..m * k)
                .map(|e| data[steps[e % k] + src.base(e / k)])
                .collect();
            let b = values(k * n, (n * 7 + k) as u64);
            let want = chain(m, k, n, &a, &b);
            let packed = PackedB::new(&b, k, n).unwrap_or_else(|e| panic!("{e}"));
            for threads in [1, 2, 3] {
                let mut c = vec![f32::NAN; m * n];
                let got = crate::par::with_threads(threads, || {
                    let c = MatMut::from_row_major_slice_mut(&mut c, m, n);
                    gemm_src(m, src, &packed, c, threads, None)
                });
                if !takes_src() {
                    assert!(got.is_err(), "{m}x{k}x{n}: taken without the chunked path");
                    continue;
                }
                got.unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(bits(&c), bits(&want), "{m}x{k}x{n} on {threads} threads");
                // Into a column-major `C` (an `NCHW` output seen as pixels × channels): the
                // tiles go through the buffer and land transposed, the same bits.
                let mut ct = vec![f32::NAN; m * n];
                crate::par::with_threads(threads, || {
                    let c = MatMut::from_row_major_slice_mut(&mut ct, n, m).transpose_mut();
                    gemm_src(m, src, &packed, c, threads, None)
                })
                .unwrap_or_else(|e| panic!("{e}"));
                let back: Vec<f32> = (0..m * n).map(|e| ct[(e % n) * m + e / n]).collect();
                assert_eq!(
                    bits(&back),
                    bits(&want),
                    "{m}x{k}x{n} transposed, {threads}"
                );
            }
            // One value short of the last row's last step: an error, not a read past it.
            let short = ColsSrc {
                data: &data[..steps[0] + src.base(m - 1)],
                ..src
            };
            let mut c = vec![0.0; m * n];
            let mut c = MatMut::from_row_major_slice_mut(&mut c, m, n);
            assert!(gemm_src(m, short, &packed, c.rb_mut(), 1, None).is_err());
            let wrong = ColsSrc {
                steps: &steps[1..],
                ..src
            };
            assert!(gemm_src(m, wrong, &packed, c.rb_mut(), 1, None).is_err());
        }
    }

    /// The whole product as one tile on instruction set `simd`.
    fn one_tile<S: pulp::Simd>(simd: S, m: usize, a: &[f32], b: &PackedB) -> Vec<f32> {
        let mut c = vec![f32::NAN; m * b.n];
        let mut apack = Vec::new();
        pack_rows(a, m, b.k, &mut apack, 1);
        let tile = Tile {
            a,
            apack: &apack,
            k: b.k,
            b,
            r0: 0,
            p0: 0,
            c: MatMut::from_row_major_slice_mut(&mut c, m, b.n),
            sums: &mut Vec::new(),
        };
        pulp::WithSimd::with_simd(tile, simd).unwrap_or_else(|e| panic!("{e}"));
        c
    }

    #[test]
    fn every_instruction_set_gives_the_same_bits() {
        // Scalar and, where the CPU has them, AVX2 (both the chunked path: 6 rows × one slice
        // of 2 vectors, `k` in chunks of 256) and AVX-512 (8 rows × 48 columns over all of
        // `k`): each the chain of the definition, with an odd `k` (the kernel's last single
        // step) and a `k` of three chunks, the last one short.
        for (m, k, n) in [(19, 37, 101), (13, 601, 70)] {
            let a = values(m * k, 8);
            let b = values(k * n, 9);
            let want = bits(&chain(m, k, n, &a, &b));
            // The narrow paths read either panel width; the AVX-512 kernel its own only.
            for nr in [NR_N, NR] {
                let packed = PackedB::with_width(&b, k, n, nr).unwrap();
                let got = one_tile(pulp::Scalar::new(), m, &a, &packed);
                assert_eq!(bits(&got), want, "scalar, panels of {nr}");
                #[cfg(target_arch = "x86_64")]
                {
                    if let Some(v3) = pulp::x86::V3::try_new() {
                        let got = one_tile(v3, m, &a, &packed);
                        assert_eq!(bits(&got), want, "AVX2, panels of {nr}");
                    }
                    if let Some(v4) = pulp::x86::V4::try_new()
                        && nr == NR
                    {
                        assert_eq!(bits(&one_tile(v4, m, &a, &packed)), want, "AVX-512");
                    }
                }
            }
        }
    }

    #[test]
    fn nan_inf_and_signed_zero_follow_the_chain() {
        let (m, k, n) = (10, 5, 50);
        let mut a = values(m * k, 3);
        let mut b = values(k * n, 4);
        a[7] = f32::NAN;
        a[12] = f32::INFINITY;
        b[60] = f32::NEG_INFINITY;
        b[3] = -0.0;
        a[0..k].fill(-0.0);
        let want = chain(m, k, n, &a, &b);
        let mut c = vec![0.0; m * n];
        gemm(m, &a, &PackedB::new(&b, k, n).unwrap(), &mut c, 2, None).unwrap();
        assert_eq!(bits(&c), bits(&want));
    }

    #[test]
    fn the_epilogue_sees_every_row_segment_once_with_its_position() {
        // One band; two sub-bands on the AVX-512 path (A_BAND_BYTES).
        for (m, k, n) in [(70, 9, 130), (100, 1400, 60)] {
            epilogue_positions(m, k, n);
        }
    }

    fn epilogue_positions(m: usize, k: usize, n: usize) {
        let a = values(m * k, 5);
        let b = values(k * n, 6);
        let want = chain(m, k, n, &a, &b);
        let seen = std::sync::Mutex::new(vec![0u8; m * n]);
        let ep = |row: usize, c0: usize, r: &mut [f32]| {
            let mut s = seen.lock().unwrap();
            for (j, v) in r.iter_mut().enumerate() {
                assert_eq!(v.to_bits(), want[row * n + c0 + j].to_bits());
                s[row * n + c0 + j] += 1;
                *v = -*v;
            }
        };
        let mut c = vec![0.0; m * n];
        gemm(
            m,
            &a,
            &PackedB::new(&b, k, n).unwrap(),
            &mut c,
            2,
            Some(&ep),
        )
        .unwrap();
        assert!(seen.into_inner().unwrap().iter().all(|&s| s == 1));
        let neg: Vec<f32> = want.iter().map(|v| -v).collect();
        assert_eq!(bits(&c), bits(&neg));
    }

    #[test]
    fn wrong_sizes_and_too_few_rows_are_errors() {
        let b = PackedB::new(&[1.0; 6], 2, 3).unwrap();
        assert!(PackedB::new(&[1.0; 5], 2, 3).is_err());
        let mut c = vec![0.0; 24];
        assert!(gemm(8, &[1.0; 15], &b, &mut c, 1, None).is_err());
        assert!(gemm(8, &[1.0; 16], &b, &mut c[..23], 1, None).is_err());
        let mut c4 = vec![0.0; 12];
        let e = gemm(4, &[1.0; 8], &b, &mut c4, 1, None).unwrap_err();
        assert!(e.contains("at least 8 rows"), "{e}");
        gemm(8, &[1.0; 16], &b, &mut c, 1, None).unwrap();
        assert!(c.iter().all(|&v| v == 2.0));
    }
}
