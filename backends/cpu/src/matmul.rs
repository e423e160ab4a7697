//! `matmul` with numpy semantics: 1-D operands get a leading/trailing 1 that is removed
//! afterwards, and the batch dims broadcast.
//!
//! The GEMM itself is `matrixmultiply`'s (through `ndarray::linalg::general_mat_mul`, which
//! calls `matrixmultiply::{sgemm, dgemm}` for `f32`/`f64`). Why: it is a small, well-kept,
//! pure-Rust crate with cache-blocked, vectorised kernels, so the reference backend stays
//! portable and free of C/BLAS dependencies while being fast enough for the seed models.
//! `ndarray` is the safe front end: `matrixmultiply`'s own API takes raw pointers, which
//! this crate (`#![forbid(unsafe_code)]`) cannot call.
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
use ndarray::{ArrayView2, ArrayViewMut2};

/// `c[m×n] = a[m×k] @ b[k×n]` for row-major slices (`f32`, via matrixmultiply).
pub(crate) fn gemm_f32(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
) -> KResult<()> {
    let av = ArrayView2::from_shape((m, k), a).map_err(|e| e.to_string())?;
    let bv = ArrayView2::from_shape((k, n), b).map_err(|e| e.to_string())?;
    let mut cv = ArrayViewMut2::from_shape((m, n), c).map_err(|e| e.to_string())?;
    general_mat_mul(1.0, &av, &bv, 0.0, &mut cv);
    Ok(())
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
            for i in 0..nb {
                let (pa, pb) = (oa[i] * ma, ob[i] * mb);
                gemm_f32(
                    m,
                    k,
                    n,
                    &x[pa..pa + ma],
                    &y[pb..pb + mb],
                    &mut c[i * mc..(i + 1) * mc],
                )?;
            }
            Storage::F32(c)
        }
    };
    tensor(shape, data.cast(dtype))
}
