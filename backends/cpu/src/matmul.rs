//! `matmul` with numpy semantics: 1-D operands get a leading/trailing 1 that is removed
//! afterwards, and the batch dims broadcast.
//!
//! The GEMM micro-kernel is `matrixmultiply`'s (through `ndarray::linalg::general_mat_mul`,
//! which calls `matrixmultiply::{sgemm, dgemm}` for `f32`/`f64`). Why: it is a small,
//! well-kept, pure-Rust crate with cache-blocked, register-tiled kernels that it picks at run
//! time (AVX2 + FMA where the CPU has them), which safe, auto-vectorised code compiled for the
//! baseline `x86-64` target cannot use; so the reference backend stays portable and free of
//! C/BLAS dependencies. `ndarray` is the safe front end: `matrixmultiply`'s own API takes raw
//! pointers, which this crate (`#![forbid(unsafe_code)]`) cannot call.
//!
//! [`gemm_f32_tiled`] cuts `C` into a few row or column tiles per thread (along the axis
//! whose cut re-packs the smaller operand); the tiles run on [`crate::par`]'s threads, each
//! followed by an epilogue on its rows while they are in cache. A tile is a plain `sgemm` on
//! sub-views: every element of `C` is computed by the same sequence of multiply-adds whatever
//! the tiling (matrixmultiply's blocking of the reduction is fixed), so the result does not
//! depend on the thread count.
//!
//! `float16`/`bfloat16` compute through `f32` (and round once); `float64` natively; integer
//! dtypes through `i64` (wrapping). With `out_dtype` the inputs are converted first.
//!
//! ```text
//! y: R.Tensor((2, 3, 5), dtype="float32") = R.matmul(a, b, out_dtype=None)  # (2, 3, 4) @ (4, 5)
//! ```

use crate::util::{KResult, broadcast_shapes, broadcast_strides, tensor};
use fusebox_core::ir::DType;
use fusebox_core::runtime::{Storage, Tensor};
use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2, Axis, Slice};

/// Multiply-adds per thread below which a GEMM stays on one thread (spawning costs tens of
/// microseconds).
const MACS_PER_THREAD: usize = 1 << 20;

/// Tiles per thread of a threaded GEMM: a few, so a thread the OS delays costs little.
const TILES_PER_THREAD: usize = 2;

/// An epilogue: `f(row, first column, row slice of a tile)`, run on each row of each tile of
/// `C` right after the tile is computed.
pub(crate) type Epilogue<'e> = &'e (dyn Fn(usize, usize, &mut [f32]) + Sync);

/// The tiling of an `m × n × k` product for `threads` threads: (row tile, column tile). One
/// thread: one tile (matrixmultiply blocks it itself). Else the output is cut along one axis
/// into `TILES_PER_THREAD` tiles per thread: along the rows when `A` is the larger operand
/// (each tile then re-packs only `B`), else along the columns (each re-packs only `A`).
fn tiles(m: usize, n: usize, threads: usize) -> (usize, usize) {
    if threads <= 1 {
        return (m.max(1), n.max(1));
    }
    let parts = threads * TILES_PER_THREAD;
    let cut = |len: usize| len.div_ceil(parts).next_multiple_of(8).clamp(1, len.max(1));
    if m >= n {
        (cut(m), n.max(1))
    } else {
        (m.max(1), cut(n))
    }
}

/// `c = a @ b` (`a`: `m × k`, `b`: `k × n`, `c`: `m × n`, any strides), tiled and spread over
/// up to `threads` threads (fewer for small products), with `epilogue` run on every row of
/// every tile. Bit-identical for every thread count (see the module doc).
pub(crate) fn gemm_f32_tiled(
    a: ArrayView2<'_, f32>,
    b: ArrayView2<'_, f32>,
    c: ArrayViewMut2<'_, f32>,
    threads: usize,
    epilogue: Option<Epilogue<'_>>,
) -> KResult<()> {
    let ((m, k), (k2, n)) = (a.dim(), b.dim());
    if k != k2 || c.dim() != (m, n) {
        return Err(format!(
            "gemm: operand shapes {:?} @ {:?} -> {:?} do not agree",
            a.dim(),
            b.dim(),
            c.dim()
        ));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let threads = threads.min((m * n * k.max(1)) / MACS_PER_THREAD).max(1);
    let (mb, nb) = tiles(m, n, threads);
    // Cut C into disjoint tiles (row blocks, then column blocks), in row-major tile order.
    let mut tasks: Vec<(usize, usize, ArrayViewMut2<'_, f32>)> = Vec::new();
    let mut rest = c;
    let mut r0 = 0;
    while r0 < m {
        let rows = mb.min(m - r0);
        let (band, tail) = rest.split_at(Axis(0), rows);
        rest = tail;
        let mut band = band;
        let mut c0 = 0;
        while c0 < n {
            let cols = nb.min(n - c0);
            let (tile, right) = band.split_at(Axis(1), cols);
            band = right;
            tasks.push((r0, c0, tile));
            c0 += cols;
        }
        r0 += rows;
    }
    crate::par::run_tasks(tasks, threads, |(r0, c0, mut tile)| {
        let (rows, cols) = tile.dim();
        let at = a.slice_axis(Axis(0), Slice::from(r0..r0 + rows));
        let bt = b.slice_axis(Axis(1), Slice::from(c0..c0 + cols));
        general_mat_mul(1.0, &at, &bt, 0.0, &mut tile);
        if let Some(ep) = epilogue {
            for (i, mut row) in tile.rows_mut().into_iter().enumerate() {
                match row.as_slice_mut() {
                    Some(r) => ep(r0 + i, c0, r),
                    None => {
                        let mut tmp = row.to_vec();
                        ep(r0 + i, c0, &mut tmp);
                        row.iter_mut().zip(tmp).for_each(|(d, v)| *d = v);
                    }
                }
            }
        }
        Ok::<(), String>(())
    })
}

/// `c[m×n] = a[m×k] @ b[k×n]` for row-major slices (`f32`, via matrixmultiply), on up to
/// `threads` threads.
pub(crate) fn gemm_f32(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    threads: usize,
) -> KResult<()> {
    let av = ArrayView2::from_shape((m, k), a).map_err(|e| e.to_string())?;
    let bv = ArrayView2::from_shape((k, n), b).map_err(|e| e.to_string())?;
    let cv = ArrayViewMut2::from_shape((m, n), c).map_err(|e| e.to_string())?;
    gemm_f32_tiled(av, bv, cv, threads, None)
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

/// `matmul(a, b)`.
pub(crate) fn matmul(a: &Tensor, b: &Tensor, out_dtype: Option<DType>) -> KResult<Tensor> {
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
            for d in (0..batch.len()).rev() {
                idx[d] += 1;
                if idx[d] < batch[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        out
    };
    let (oa, ob) = (offsets(&sa), offsets(&sb));
    let (ma, mb, mc) = (m * k, k * n, m * n);
    let mut shape = batch.clone();
    if !a1 {
        shape.push(m);
    }
    if !b1 {
        shape.push(n);
    }
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
            let mut c = vec![0.0f32; nb * mc];
            let threads = crate::par::threads();
            for i in 0..nb {
                let (pa, pb) = (oa[i] * ma, ob[i] * mb);
                gemm_f32(
                    m,
                    k,
                    n,
                    &x[pa..pa + ma],
                    &y[pb..pb + mb],
                    &mut c[i * mc..(i + 1) * mc],
                    threads,
                )?;
            }
            Storage::F32(c)
        }
    };
    tensor(shape, data.cast(dtype))
}
