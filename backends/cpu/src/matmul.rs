//! `matmul` with numpy semantics: 1-D operands get a leading/trailing 1 that is removed
//! afterwards, and the batch dims broadcast.
//!
//! The `f32` GEMM is `faer`'s (`faer::linalg::matmul::matmul`, one thread per call). Why:
//! it is a well-kept, pure-Rust linear-algebra crate whose matmul picks its micro-kernels at
//! run time, AVX-512 where the CPU has it, else AVX2 + FMA (`private-gemm-x86`), which safe,
//! auto-vectorised code compiled for the baseline `x86-64` target cannot use; its API is safe
//! over slices (`MatRef::from_row_major_slice`), so this crate stays free of `unsafe` and of
//! C/BLAS dependencies. On the development VM (AVX-512), ResNet-50 takes 91 ms of CPU time
//! per inference on one thread with it, 140 ms with `matrixmultiply` (AVX2), which this crate
//! used before (bench/RESULTS.md). `f64` stays on `matrixmultiply` through
//! `ndarray::linalg::general_mat_mul`.
//!
//! [`gemm_f32_tiled`] cuts `C` into tiles of about 128 Ki elements (512 KiB, so a tile stays in
//! a core's L2 while its epilogue runs), their count a multiple of 4; the tiles run on
//! [`crate::par`]'s threads, each followed by an epilogue on its rows. The tiling depends on
//! the shape only, never on the thread count, and each tile is one sequential `faer` call: so
//! every element of `C` is computed by the same multiply-adds in the same order whatever the
//! number of threads, and the result is bit-identical for every thread count. In a product of
//! one column strip whose last vector of columns would be at most half filled (a 14×14 plane's
//! 196 pixels: twelve vectors and 4), `faer` computes the whole vectors and [`tail_dots`] the
//! last columns; the split, too, depends on the shape alone.
//!
//! A rank-2 right operand (a dense layer's weight `[K, N]`) with a batched left operand runs as
//! one GEMM over all the left operand's rows (its batch entries are consecutive row blocks), so
//! `[B, S, K] @ [K, N]` gives the same bits as the flattened `[B·S, K] @ [K, N]` (what
//! UnflattenMatmul relies on) and makes fewer, larger calls.
//!
//! `float16`/`bfloat16` compute through `f32` (and round once); `float64` natively; integer
//! dtypes through `i64` (wrapping). With `out_dtype` the inputs are converted first.
//!
//! ```text
//! y: R.Tensor((2, 3, 5), dtype="float32") = R.matmul(a, b, out_dtype=None)  # (2, 3, 4) @ (4, 5)
//! ```

use crate::gemm_packed::PackedB;
use crate::util::{KResult, broadcast_shapes, broadcast_strides, tensor};
use faer::reborrow::ReborrowMut;
use faer::{Accum, MatMut, MatRef, Par};
use fusebox_core::ir::DType;
use fusebox_core::runtime::{Storage, Tensor};
use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};

/// Multiply-adds per thread below which a GEMM stays on one thread (spawning costs tens of
/// microseconds).
const MACS_PER_THREAD: usize = 1 << 20;

/// Multiply-adds below which a GEMM is one tile (a call costs a few microseconds).
const MACS_PER_TILE: usize = 1 << 21;

/// The output elements of a tile: 128 Ki `f32` (512 KiB), so a tile and the panels it is
/// computed from stay in a core's L2 while its epilogue runs.
const TILE_ELEMS: usize = 1 << 17;

/// An epilogue: `f(row, first column, row slice of a tile)`, run on each row of each tile of
/// `C` right after the tile is computed.
pub(crate) type Epilogue<'e> = &'e (dyn Fn(usize, usize, &mut [f32]) + Sync);

/// The tiling of an `m × n × k` product: (row tile, column tile). It depends on the shape
/// only, never on the thread count, so every element of `C` is computed by the same calls
/// whatever the number of threads. A small product is one tile. Else about one tile per
/// [`TILE_ELEMS`] output elements, their count rounded up to a multiple of 4 (so 2 or 4
/// threads share them evenly), of about equal size: at most 256 rows (the weights' panel
/// each tile packs), cut along the columns (in multiples of 16) when there are at least 256
/// of them, else along the rows (in multiples of 8).
fn tiles(m: usize, n: usize, k: usize) -> (usize, usize) {
    let (m, n) = (m.max(1), n.max(1));
    if m.saturating_mul(n).saturating_mul(k.max(1)) < MACS_PER_TILE {
        return (m, n);
    }
    let want = (m * n).div_ceil(TILE_ELEMS).next_multiple_of(4);
    let rows = m.div_ceil(256);
    if n >= 256 {
        let cols = want.div_ceil(rows).max(1);
        (
            m.div_ceil(rows),
            n.div_ceil(cols).next_multiple_of(16).min(n),
        )
    } else {
        let rows = rows.max(want).min(m.div_ceil(8));
        (m.div_ceil(rows).next_multiple_of(8).min(m), n)
    }
}

/// The most columns [`tail_dots`] computes: half a 16-lane vector.
const MAX_TAIL: usize = 8;

/// How many last columns of a one-strip product [`gemm_f32_tiled`] leaves out of `faer`'s call
/// and computes with [`tail_dots`]: the `n % lanes` columns of a last vector that would be at
/// most half filled (`faer` runs it at the cost of a full one), when there are whole vectors
/// before it. A 14×14 plane's 196 pixels are twelve vectors and 4 columns: `faer` took as long
/// for them as for 208 (ResNet-50's 256 → 1024 layer alone, one thread: 196 pixels 1.015 ms,
/// 192 pixels 0.937, 208 pixels 1.015; bench/RESULTS.md, session am).
fn tail_columns(n: usize) -> Option<usize> {
    let lanes = crate::simd::f32_lanes();
    let t = n % lanes;
    (n > lanes && (1..=MAX_TAIL.min(lanes / 2)).contains(&t)).then_some(t)
}

/// For each row `a_i` of `a` (`rows × k`), `out[i·t + j] = Σ_p a_i[p] · bt[j·k + p]` for the
/// `t` columns of `bt` (`t × k`, a product's last columns transposed): per column, lane-wise
/// FMA chains over the row's whole vectors in order, their lanes summed (`reduce_sum`), then
/// the rest of `k` one FMA at a time in order. Fixed by `k` and the instruction set, so the
/// same on any thread count. One dispatch per call (a tile's rows).
fn tail_dots(t: usize, k: usize, a: &[f32], bt: &[f32], out: &mut [f32]) {
    struct Op<'a, const T: usize>(usize, &'a [f32], &'a [f32], &'a mut [f32]);
    impl<const T: usize> pulp::WithSimd for Op<'_, T> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, simd: S) {
            let Op(k, a, bt, out) = self;
            let cols: [(&[S::f32s], &[f32]); T] =
                std::array::from_fn(|j| S::as_simd_f32s(&bt[j * k..(j + 1) * k]));
            for (row, dst) in a.chunks_exact(k.max(1)).zip(out.chunks_exact_mut(T)) {
                let (av, ar) = S::as_simd_f32s(row);
                let mut acc = [simd.splat_f32s(0.0); T];
                for (c, &x) in av.iter().enumerate() {
                    for (s, (bv, _)) in acc.iter_mut().zip(&cols) {
                        *s = simd.mul_add_f32s(x, bv[c], *s);
                    }
                }
                for ((o, s), (_, br)) in dst.iter_mut().zip(acc).zip(&cols) {
                    let mut sum = simd.reduce_sum_f32s(s);
                    for (&x, &y) in ar.iter().zip(*br) {
                        sum = x.mul_add(y, sum);
                    }
                    *o = sum;
                }
            }
        }
    }
    debug_assert_eq!(bt.len(), t * k);
    match t {
        1 => crate::simd::dispatch(Op::<1>(k, a, bt, out)),
        2 => crate::simd::dispatch(Op::<2>(k, a, bt, out)),
        3 => crate::simd::dispatch(Op::<3>(k, a, bt, out)),
        4 => crate::simd::dispatch(Op::<4>(k, a, bt, out)),
        5 => crate::simd::dispatch(Op::<5>(k, a, bt, out)),
        6 => crate::simd::dispatch(Op::<6>(k, a, bt, out)),
        7 => crate::simd::dispatch(Op::<7>(k, a, bt, out)),
        _ => crate::simd::dispatch(Op::<MAX_TAIL>(k, a, bt, out)),
    }
}

/// The right operand `B` (`k × n`) of [`gemm_f32_tiled`].
#[derive(Clone, Copy)]
pub(crate) enum Rhs<'b> {
    /// The matrix, row-major.
    Matrix(&'b [f32]),
    /// A function writing columns `c0..c0 + cols` of `B` into a `k × cols` row-major block:
    /// `fill(c0, block)`. Each column tile's block is made by the thread that multiplies it,
    /// right before, so it is read from that core's cache (an im2col lowering never goes
    /// whole through memory).
    Columns(&'b (dyn Fn(usize, &mut [f32]) + Sync)),
}

thread_local! {
    /// The column block of `B` the calling thread multiplies ([`Rhs::Columns`]).
    static PANEL: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The tiles of one column strip of `C`, top to bottom, each with its first row.
type Strip<'c> = Vec<(usize, MatMut<'c, f32>)>;

/// The number of column tiles [`tiles`] cuts an `m × n × k` product into.
pub(crate) fn column_tiles(m: usize, n: usize, k: usize) -> usize {
    n.div_ceil(tiles(m, n, k).1.max(1))
}

/// `c = a @ b` for row-major slices (`a`: `m × k`, `b`: `k × n`, `c`: `m × n`), in the tiles
/// of [`tiles`] spread over up to `threads` threads (fewer for small products), with
/// `epilogue` run on every row of every tile (a row vector `a` times a matrix through
/// [`gemv_f32`], the epilogue then run on the whole row, so a fused dense layer of one row
/// gives the bits of its matmul and epilogue ops run one by one). Bit-identical for every thread count (see the
/// module doc). With [`Rhs::Columns`] the tasks are the column tiles, each making its block
/// of `B` and then computing its tiles top to bottom (the same tiles and calls as with
/// [`Rhs::Matrix`], so the same result).
#[allow(clippy::too_many_arguments, reason = "a GEMM's operands and sizes")]
pub(crate) fn gemm_f32_tiled(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    b: Rhs<'_>,
    c: &mut [f32],
    threads: usize,
    epilogue: Option<Epilogue<'_>>,
) -> KResult<()> {
    let b_len = match b {
        Rhs::Matrix(b) => b.len(),
        Rhs::Columns(_) => k * n,
    };
    if a.len() != m * k || b_len != k * n || c.len() != m * n {
        return Err(format!(
            "gemm: {m}x{k} @ {k}x{n} needs {}, {} and {} elements, found {}, {} and {}",
            m * k,
            k * n,
            m * n,
            a.len(),
            b_len,
            c.len()
        ));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if let (1, Rhs::Matrix(b)) = (m, b)
        && k > 0
    {
        gemv_f32(k, n, a, b, c, threads);
        if let Some(ep) = epilogue {
            ep(0, 0, c);
        }
        return Ok(());
    }
    let threads = threads.min((m * n * k.max(1)) / MACS_PER_THREAD).max(1);
    let (mb, nb) = tiles(m, n, k);
    let a_rows = a;
    let a = MatRef::from_row_major_slice(a, m, k);
    // Cut C into column strips, then each strip into its tiles (top to bottom).
    let mut strips: Vec<(usize, Strip<'_>)> = Vec::new();
    let mut rest = MatMut::from_row_major_slice_mut(c, m, n);
    let mut c0 = 0;
    while c0 < n {
        let cols = nb.min(n - c0);
        let (strip, right) = rest.split_at_col_mut(cols);
        rest = right;
        let mut tiles = Vec::new();
        let mut strip = strip;
        let mut r0 = 0;
        while r0 < m {
            let rows = mb.min(m - r0);
            let (tile, below) = strip.split_at_row_mut(rows);
            strip = below;
            tiles.push((r0, tile));
            r0 += rows;
        }
        strips.push((c0, tiles));
        c0 += cols;
    }
    // One strip of all the columns, a matrix `b`, and a last vector of `faer`'s only partly
    // filled: those columns by [`tail_dots`] ([`tail_columns`]), from `b`'s copy transposed.
    let tail = match b {
        Rhs::Matrix(b) if strips.len() == 1 => tail_columns(n).map(|t| {
            let mut bt = vec![0.0f32; t * k];
            for (p, row) in b.chunks_exact(n).enumerate() {
                for (j, &v) in row[n - t..].iter().enumerate() {
                    bt[j * k + p] = v;
                }
            }
            (t, bt)
        }),
        _ => None,
    };
    let prefetch = crate::gemm_packed::Prefetch::new();
    let run = |r0: usize, c0: usize, mut tile: MatMut<'_, f32>, bt: MatRef<'_, f32>| {
        let rows = tile.nrows();
        // The tile's rows of `a` (a convolution's weights, which in a model come from memory:
        // the other layers' data evicts them between inferences) asked for all at once before
        // `faer` packs them, so that their misses overlap. One thread, 1024 × 256 × 196
        // (ResNet-50's 256 → 1024 layers) with the weights cycled through 64 copies: 1,071 →
        // 1,033 µs; with the image and output cold too 1,174 → 1,114 (hot: 973); smaller
        // weights unchanged. Light ResNet-50, alternated rounds: two threads 39.57 → 39.15 ms
        // (faster in 6 of 8), 41.88 → 39.30 (7 of 8), 39.23 → 38.64 (5 of 8); one thread
        // 74.07 → 73.05 (4 of 5); MobileNetV2 and BERT-base even (bench/RESULTS.md, session
        // ah). A hint: the result is unchanged.
        prefetch.all_l2(a_rows.get(r0 * k..(r0 + rows) * k).unwrap_or_default());
        let at = a.submatrix(r0, 0, rows, k);
        // With a tail, the tile is the whole strip: `n` columns, more than the tail.
        let main = tile.ncols() - tail.as_ref().map_or(0, |(t, _)| *t);
        faer::linalg::matmul::matmul(
            tile.rb_mut().subcols_mut(0, main),
            Accum::Replace,
            at,
            bt.subcols(0, main),
            1.0f32,
            Par::Seq,
        );
        if let Some((t, bt_tail)) = &tail {
            let mut sums = vec![0.0f32; rows * t];
            tail_dots(*t, k, &a_rows[r0 * k..(r0 + rows) * k], bt_tail, &mut sums);
            let Some(mut tile) = tile.rb_mut().try_as_row_major_mut() else {
                return Err("gemm: an output tile is not row-major".to_string());
            };
            for (i, row) in sums.chunks_exact(*t).enumerate() {
                tile.rb_mut().row_mut(i).as_slice_mut()[main..].copy_from_slice(row);
            }
        }
        if let Some(ep) = epilogue {
            let Some(mut tile) = tile.try_as_row_major_mut() else {
                return Err("gemm: an output tile is not row-major".to_string());
            };
            for i in 0..rows {
                ep(r0 + i, c0, tile.rb_mut().row_mut(i).as_slice_mut());
            }
        }
        Ok(())
    };
    match b {
        Rhs::Matrix(b) => {
            let b = MatRef::from_row_major_slice(b, k, n);
            let mut tasks: Vec<(usize, usize, MatMut<'_, f32>)> = strips
                .into_iter()
                .flat_map(|(c0, tiles)| tiles.into_iter().map(move |(r0, t)| (r0, c0, t)))
                .collect();
            // Row-major tile order: neighbouring tasks share their rows of `a`.
            tasks.sort_by_key(|&(r0, c0, _)| (r0, c0));
            crate::par::run_tasks(tasks, threads, |(r0, c0, tile)| {
                let cols = tile.ncols();
                run(r0, c0, tile, b.submatrix(0, c0, k, cols))
            })
        }
        Rhs::Columns(fill) => crate::par::run_tasks(strips, threads, |(c0, tiles)| {
            let cols = tiles.first().map_or(0, |(_, t)| t.ncols());
            crate::par::with_scratch(&PANEL, |panel| {
                panel.resize(k * cols, 0.0);
                fill(c0, panel);
                let bt = MatRef::from_row_major_slice(panel, k, cols);
                tiles
                    .into_iter()
                    .try_for_each(|(r0, tile)| run(r0, c0, tile, bt))
            })
        }),
    }
}

/// `c = a @ b` for a rank-2 right operand `b` (`k × n`, a dense layer's weight) with, where
/// the executor keeps one, its packed copy: [`crate::gemm_packed::gemm`] when the copy is
/// given and `a` has at least [`crate::gemm_packed::MIN_ROWS`] rows, else
/// [`gemm_f32_tiled`]. The choice depends on the shape and on whether `b` is a kept constant
/// only, so a fused dense layer and its ops run one by one take the same path.
#[allow(clippy::too_many_arguments, reason = "a GEMM's operands and sizes")]
pub(crate) fn gemm_f32_weight(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    b: &[f32],
    packed: Option<&PackedB>,
    c: &mut [f32],
    threads: usize,
    epilogue: Option<Epilogue<'_>>,
) -> KResult<()> {
    match packed {
        Some(p) if m >= crate::gemm_packed::MIN_ROWS && p.dims() == (k, n) => {
            crate::gemm_packed::gemm(m, a, p, c, threads, epilogue)
        }
        _ => gemm_f32_tiled(m, k, n, a, Rhs::Matrix(b), c, threads, epilogue),
    }
}

/// Rows of `B` per partial sum of a vector-matrix product ([`gemv_f32`]), at most.
const GEMV_ROWS: usize = 256;

/// The rows per chunk of a `k`-row vector-matrix product: at most [`GEMV_ROWS`], in a number
/// of chunks that is a multiple of 4 when there is more than one, so that 2 or 4 threads take
/// equal shares (MobileNetV2's 1280 rows were five chunks of 256, three for one of two
/// threads; now eight of 160). By `k` alone, so the bits do not depend on the thread count.
fn gemv_chunk_rows(k: usize) -> usize {
    let chunks = k.div_ceil(GEMV_ROWS);
    if chunks <= 1 {
        return k.max(1);
    }
    k.div_ceil(chunks.next_multiple_of(4))
}

/// `c = a @ b` for a row vector `a` (`k`) and a row-major `k × n` matrix `b` (a classifier
/// head, or any linear layer at batch 1): `b` is read once, as a stream, which bounds the
/// time, so the work is cut along `k`, in chunks of [`gemv_chunk_rows`] rows spread over up
/// to `threads` threads. Each chunk accumulates its partial row `Σ a[r]·b[r, :]` with one FMA
/// per element in row order; the partial rows are then added in chunk order. The chunks
/// depend on `k` only, so the result is bit-identical for every thread count.
fn gemv_f32(k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32], threads: usize) {
    /// `acc[j] = Σ_r a[r]·rows[r][j]` over the rows in order, through
    /// [`crate::simd::dispatch`] (FMA instructions where the CPU has them). Four rows at a
    /// time: each element's running sum is loaded once, takes the four rows' FMAs in row
    /// order and is stored once (the same chain as row by row, so the same bits), and four
    /// streams of `b` are read at once. Eight 1280 ↔ 1000 dense layers at batch 1 (5 MB of
    /// weights each) on a 5th-generation Xeon, medians of alternated runs: two threads 1.49
    /// → 1.22 ms, one thread 2.78 → 2.27 (onnxruntime 1.28–1.43 and 2.31–2.41 in the same
    /// stretch; bench/RESULTS.md, session ap).
    struct Op<'a>(&'a [f32], &'a [f32], &'a mut [f32]);
    impl pulp::WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            let Op(a, rows, acc) = self;
            acc.fill(0.0);
            let n = acc.len().max(1);
            let (fours, rest) = a.as_chunks::<4>();
            for (x, group) in fours.iter().zip(rows.chunks_exact(4 * n)) {
                let (r0, group) = group.split_at(n);
                let (r1, group) = group.split_at(n);
                let (r2, r3) = group.split_at(n);
                for ((((o, &v0), &v1), &v2), &v3) in acc.iter_mut().zip(r0).zip(r1).zip(r2).zip(r3)
                {
                    let s = v0.mul_add(x[0], *o);
                    let s = v1.mul_add(x[1], s);
                    let s = v2.mul_add(x[2], s);
                    *o = v3.mul_add(x[3], s);
                }
            }
            let rows = rows.get(fours.len() * 4 * n..).unwrap_or_default();
            for (&x, row) in rest.iter().zip(rows.chunks_exact(n)) {
                for (o, &v) in acc.iter_mut().zip(row) {
                    *o = v.mul_add(x, *o);
                }
            }
        }
    }
    let per = gemv_chunk_rows(k);
    let chunks = k.div_ceil(per);
    if chunks <= 1 || n == 0 {
        crate::simd::dispatch(Op(a, b, c));
        return;
    }
    let mut partial = vec![0.0f32; chunks * n];
    let t = crate::par::threads_for(k * n, 1 << 18).min(threads).max(1);
    crate::par::for_each_chunk_mut(&mut partial, n, t, |off, acc| {
        let r0 = off / n * per;
        let r1 = (r0 + per).min(k);
        crate::simd::dispatch(Op(&a[r0..r1], &b[r0 * n..r1 * n], acc));
    });
    let mut rows = partial.chunks_exact(n);
    if let Some(first) = rows.next() {
        c.copy_from_slice(first);
    }
    for row in rows {
        for (o, &v) in c.iter_mut().zip(row) {
            *o += v;
        }
    }
}

fn gemm_f64(m: usize, k: usize, n: usize, a: &[f64], b: &[f64], c: &mut [f64]) -> KResult<()> {
    let av = ArrayView2::from_shape((m, k), a).map_err(|e| e.to_string())?;
    let bv = ArrayView2::from_shape((k, n), b).map_err(|e| e.to_string())?;
    let mut cv = ArrayViewMut2::from_shape((m, n), c).map_err(|e| e.to_string())?;
    general_mat_mul(1.0, &av, &bv, 0.0, &mut cv);
    Ok(())
}

fn gemm_i64(m: usize, k: usize, n: usize, a: &[i64], b: &[i64], c: &mut [i64]) {
    for i in 0..m {
        let row = &mut c[i * n..(i + 1) * n];
        for p in 0..k {
            let x = a[i * k + p];
            for (cj, &bj) in row.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                *cj = cj.wrapping_add(x.wrapping_mul(bj));
            }
        }
    }
}

/// `matmul(a, b)`; `packed`: the packed copy of a rank-2 `float32` `b` the executor keeps
/// (see [`gemm_f32_weight`]).
pub(crate) fn matmul(
    a: &Tensor,
    b: &Tensor,
    out_dtype: Option<DType>,
    packed: Option<&PackedB>,
) -> KResult<Tensor> {
    let dtype = match out_dtype {
        Some(d) => d,
        None => {
            if a.dtype() != b.dtype() {
                return Err(format!(
                    "expected operands of the same dtype, found {} and {}",
                    a.dtype(),
                    b.dtype()
                ));
            }
            a.dtype()
        }
    };
    if a.rank() == 0 || b.rank() == 0 {
        return Err("expected operands of rank at least 1".to_string());
    }
    let (a1, b1) = (a.rank() == 1, b.rank() == 1);
    let ash: Vec<usize> = if a1 {
        vec![1, a.shape()[0]]
    } else {
        a.shape().to_vec()
    };
    let bsh: Vec<usize> = if b1 {
        vec![b.shape()[0], 1]
    } else {
        b.shape().to_vec()
    };
    let (m, k) = (ash[ash.len() - 2], ash[ash.len() - 1]);
    let (k2, n) = (bsh[bsh.len() - 2], bsh[bsh.len() - 1]);
    if k != k2 {
        return Err(format!(
            "reduction dims differ: lhs {:?} has {k} columns, rhs {:?} has {k2} rows",
            a.shape(),
            b.shape()
        ));
    }
    let (abatch, bbatch) = (&ash[..ash.len() - 2], &bsh[..bsh.len() - 2]);
    let batch = broadcast_shapes(abatch, bbatch)?;
    let nb: usize = batch.iter().product();
    // Matrix offsets of each batch entry: broadcast strides over the batch dims, in matrices.
    let sa = broadcast_strides(abatch, &batch);
    let sb = broadcast_strides(bbatch, &batch);
    let offsets = |s: &[isize]| -> Vec<usize> {
        let mut out = Vec::with_capacity(nb);
        let mut idx = vec![0usize; batch.len()];
        for _ in 0..nb {
            out.push(idx.iter().zip(s).map(|(&i, &st)| i * st as usize).sum());
            crate::util::next_index(&mut idx, &batch);
        }
        out
    };
    let mut shape = batch.clone();
    if !a1 {
        shape.push(m);
    }
    if !b1 {
        shape.push(n);
    }
    let (mut oa, mut ob) = (offsets(&sa), offsets(&sb));
    // A rank-2 right operand (a dense layer's weight): the left operand's batch entries are
    // consecutive row blocks of one matrix, so the product is one GEMM over all their rows
    // (fewer, larger calls; the same result as flattening the rows first).
    let (nb, m) = if bbatch.is_empty() && nb > 1 {
        (oa, ob) = (vec![0], vec![0]);
        (1, nb * m)
    } else {
        (nb, m)
    };
    let (ma, mb, mc) = (m * k, k * n, m * n);
    let compute = if dtype.is_float() { dtype } else { DType::I64 };
    let data = match compute {
        DType::F64 => {
            let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
            let mut c = vec![0.0f64; nb * mc];
            for i in 0..nb {
                let (pa, pb) = (oa[i] * ma, ob[i] * mb);
                gemm_f64(
                    m,
                    k,
                    n,
                    &x[pa..pa + ma],
                    &y[pb..pb + mb],
                    &mut c[i * mc..(i + 1) * mc],
                )?;
            }
            Storage::F64(c)
        }
        DType::I64 => {
            let (x, y) = (a.to_i64_vec(), b.to_i64_vec());
            let mut c = vec![0i64; nb * mc];
            for i in 0..nb {
                let (pa, pb) = (oa[i] * ma, ob[i] * mb);
                gemm_i64(
                    m,
                    k,
                    n,
                    &x[pa..pa + ma],
                    &y[pb..pb + mb],
                    &mut c[i * mc..(i + 1) * mc],
                );
            }
            Storage::I64(c)
        }
        _ => {
            let xs;
            let x: &[f32] = match a.as_f32() {
                Some(v) => v,
                None => {
                    xs = a.to_f32_vec();
                    &xs
                }
            };
            let ys;
            let y: &[f32] = match b.as_f32() {
                Some(v) => v,
                None => {
                    ys = b.to_f32_vec();
                    &ys
                }
            };
            let threads = crate::par::threads();
            // Every element is written by the GEMM (or GEMV) below, so a kept buffer's old
            // contents never show; with `k == 0` the product is all zeros.
            let mut c = if k == 0 {
                crate::par::Scratch::from_vec(vec![0.0f32; nb * mc])
            } else {
                crate::par::scratch_f32(nb * mc)
            };
            // The packed copy only stands for a rank-2 `float32` right operand.
            let packed = packed.filter(|_| bbatch.is_empty() && nb == 1 && b.as_f32().is_some());
            for i in 0..nb {
                let (pa, pb) = (oa[i] * ma, ob[i] * mb);
                gemm_f32_weight(
                    m,
                    k,
                    n,
                    &x[pa..pa + ma],
                    &y[pb..pb + mb],
                    packed,
                    &mut c[i * mc..(i + 1) * mc],
                    threads,
                    None,
                )?;
            }
            if dtype == DType::F32 {
                // The kept buffer's slack rides along (see `crate::par::Scratch`).
                return c.into_tensor(shape);
            }
            fusebox_core::runtime::StorageRef::F32(&c).cast(dtype)
        }
    };
    // Moved, not copied, when the product already has the result's dtype (`cast` would copy
    // every output: GPT-2's 37 float32 products, 49 MB per inference, 12–15 ms of its 2-thread
    // run on one thread).
    tensor(shape, data.into_cast(dtype))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `a @ b` in f64, row by row.
    fn reference(k: usize, n: usize, a: &[f32], b: &[f32]) -> Vec<f64> {
        let mut c = vec![0.0f64; n];
        for (x, row) in a.iter().zip(b.chunks_exact(n)) {
            for (o, v) in c.iter_mut().zip(row) {
                *o += f64::from(*x) * f64::from(*v);
            }
        }
        debug_assert_eq!(a.len(), k);
        c
    }

    #[test]
    fn a_last_partial_vector_of_columns_matches_f64_on_any_threads() {
        // A 14×14 plane's 196 pixels (ResNet-50's 256 → 1024 layer, scaled down in rows),
        // tails of 1, 2, 3 and half a vector of columns after whole vectors, one just past
        // half (all on `faer`), and `k` with and without a remainder past whole vectors;
        // with an epilogue on each row.
        let lanes = crate::simd::f32_lanes();
        for (m, k, n) in [
            (40usize, 256usize, 196usize),
            (24, 67, 2 * lanes + 1),
            (24, 64, 3 * lanes + 3),
            (9, 300, lanes + lanes / 2),
            (9, 33, 5 * lanes + lanes / 2 + 1),
            (2, 16, lanes + 2),
        ] {
            let t = n % lanes;
            assert_eq!(
                tail_columns(n),
                (1..=lanes / 2).contains(&t).then_some(t),
                "n = {n}"
            );
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0)
                .collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 53 % 89) as f32 - 44.0) / 32.0)
                .collect();
            let ep = |r: usize, c0: usize, row: &mut [f32]| {
                for (j, v) in row.iter_mut().enumerate() {
                    *v += (r * 1000 + c0 + j) as f32;
                }
            };
            let mut first: Option<Vec<f32>> = None;
            for threads in [1usize, 2, 3] {
                let mut c = vec![f32::NAN; m * n];
                gemm_f32_tiled(m, k, n, &a, Rhs::Matrix(&b), &mut c, threads, Some(&ep))
                    .unwrap_or_else(|e| panic!("{e}"));
                for r in 0..m {
                    let want = reference(k, n, &a[r * k..(r + 1) * k], &b);
                    for (j, (&got, &w)) in c[r * n..(r + 1) * n].iter().zip(&want).enumerate() {
                        let w = w + (r * 1000 + j) as f64;
                        let tol = 1e-5 * (k as f64) * (1.0 + w.abs());
                        assert!(
                            (f64::from(got) - w).abs() <= tol,
                            "{m}x{k}x{n} [{r}][{j}]: {got} {w}"
                        );
                    }
                }
                match &first {
                    None => first = Some(c),
                    Some(f) => assert!(
                        f.iter().zip(&c).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{m}x{k}x{n}: {threads} threads"
                    ),
                }
            }
        }
    }

    #[test]
    fn a_vector_matrix_product_is_its_chunks_fma_chains_added_in_order_on_any_threads() {
        // The documented order, written out: per chunk one FMA chain per column from zero,
        // then the chunks' partial rows added in chunk order. 1100 rows make eight chunks of
        // 138 (five of GEMV_ROWS, rounded up to a multiple of 4; 34 groups of four rows and
        // two left each), spread over 1 to 3 threads.
        assert_eq!(gemv_chunk_rows(1100), 138);
        assert_eq!(gemv_chunk_rows(1000), 250);
        assert_eq!(gemv_chunk_rows(1280), 160);
        assert_eq!(gemv_chunk_rows(2048), 256);
        assert_eq!(gemv_chunk_rows(200), 200);
        // One chunk of 7 rows (a group of four and three left) and one of 3 (none).
        for (k, n) in [(1100usize, 700usize), (7, 33), (3, 20)] {
            vector_matrix_product_is_the_documented_order(k, n);
        }
    }

    fn vector_matrix_product_is_the_documented_order(k: usize, n: usize) {
        let a: Vec<f32> = (0..k)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 53) % 97) as f32 / 48.0 - 1.0)
            .collect();
        let per = gemv_chunk_rows(k);
        let mut want = vec![0.0f32; n];
        for (ch, rows) in a.chunks(per).enumerate() {
            for (j, w) in want.iter_mut().enumerate() {
                let mut acc = 0.0f32;
                for (r, &x) in rows.iter().enumerate() {
                    acc = b[(ch * per + r) * n + j].mul_add(x, acc);
                }
                *w = if ch == 0 { acc } else { *w + acc };
            }
        }
        let exact = reference(k, n, &a, &b);
        for (w, e) in want.iter().zip(&exact) {
            assert!((f64::from(*w) - e).abs() <= 1e-3 * e.abs().max(1.0));
        }
        for threads in 1..=3 {
            let mut c = vec![f32::NAN; n];
            crate::par::with_threads(threads, || gemv_f32(k, n, &a, &b, &mut c, threads));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&c), bits(&want), "{threads} threads");
        }
    }

    #[test]
    fn a_float32_product_is_returned_in_the_buffer_it_was_computed_in() {
        // The output buffer `scratch_f32` hands out (here a kept buffer of a dropped tensor,
        // recognised by its address) is the result's: no copy on the way out.
        let (m, k, n) = (128usize, 8usize, 128usize);
        let kept =
            Tensor::from_f32(vec![m * n], vec![f32::NAN; m * n]).unwrap_or_else(|e| panic!("{e}"));
        let at = kept.as_f32().map(<[f32]>::as_ptr);
        crate::par::with_threads(1, || {
            crate::par::recycle(kept);
            let a =
                Tensor::from_f32(vec![m, k], vec![0.5; m * k]).unwrap_or_else(|e| panic!("{e}"));
            let b =
                Tensor::from_f32(vec![k, n], vec![0.25; k * n]).unwrap_or_else(|e| panic!("{e}"));
            let c = matmul(&a, &b, None, None).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(c.shape(), &[m, n]);
            assert_eq!(c.as_f32().map(<[f32]>::as_ptr), at);
            assert!(c.as_f32().is_some_and(|v| v.iter().all(|&x| x == 1.0)));
        });
    }

    #[test]
    fn a_vector_matrix_product_matches_f64_in_one_chunk_and_in_several() {
        // 100: one chunk; 700: two full chunks and a part; odd widths leave vector tails.
        for (k, n) in [(100usize, 37usize), (700, 131), (256, 8), (513, 1)] {
            let a: Vec<f32> = (0..k).map(|i| ((i * 7) % 13) as f32 * 0.25 - 1.5).collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 11) % 17) as f32 * 0.125 - 1.0)
                .collect();
            let want = reference(k, n, &a, &b);
            let mut got = vec![f32::NAN; n];
            gemm_f32_tiled(1, k, n, &a, Rhs::Matrix(&b), &mut got, 3, None)
                .unwrap_or_else(|e| panic!("{e}"));
            for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                let tol = 1e-5 * (1.0 + w.abs());
                assert!(
                    (f64::from(*g) - w).abs() <= tol,
                    "k {k} n {n} column {j}: {g} vs {w}"
                );
            }
        }
    }

    #[test]
    fn a_batched_product_with_a_matrix_weight_is_the_flattened_product_bit_for_bit() {
        // [3, 70, 40] @ [40, 300] against [210, 40] @ [40, 300]: the rows are the same GEMM.
        let (b, s, k, n) = (3usize, 70usize, 40usize, 300usize);
        let a: Vec<f32> = (0..b * s * k)
            .map(|i| ((i * 7) % 23) as f32 * 0.37 - 4.0)
            .collect();
        let w: Vec<f32> = (0..k * n)
            .map(|i| ((i * 11) % 19) as f32 * 0.21 - 2.0)
            .collect();
        let t = |shape: Vec<usize>, v: &[f32]| {
            Tensor::from_f32(shape, v.to_vec()).unwrap_or_else(|e| panic!("{e}"))
        };
        let wt = t(vec![k, n], &w);
        let batched =
            matmul(&t(vec![b, s, k], &a), &wt, None, None).unwrap_or_else(|e| panic!("{e}"));
        let flat =
            matmul(&t(vec![b * s, k], &a), &wt, None, None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(batched.shape(), &[b, s, n]);
        let bits = |x: &Tensor| {
            x.as_f32()
                .unwrap_or(&[])
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        };
        assert!(bits(&batched) == bits(&flat));
    }

    #[test]
    fn a_vector_matrix_product_is_the_same_for_every_thread_count() {
        let (k, n) = (1100usize, 300usize);
        let a: Vec<f32> = (0..k).map(|i| ((i * 7) % 13) as f32 * 0.1 - 0.6).collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 11) % 17) as f32 * 0.1 - 0.8)
            .collect();
        let run = |t: usize| {
            let mut c = vec![0.0f32; n];
            crate::par::with_threads(t, || {
                gemm_f32_tiled(1, k, n, &a, Rhs::Matrix(&b), &mut c, t, None)
            })
            .unwrap_or_else(|e| panic!("{e}"));
            c.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        };
        let one = run(1);
        for t in [2, 3, 5] {
            assert!(run(t) == one, "{t} threads differ from one");
        }
    }
}
