//! Shape helpers shared by the kernels: strides, axis normalisation, numpy broadcasting and a
//! strided gather (an odometer over the output whose innermost dim is a tight loop).
//!
//! ```text
//! broadcast_shapes([3, 1], [1, 4])  = [3, 4]
//! gather(src, offset 0, strides [1, 3], out [3, 2])  = the transpose of a (2, 3) matrix
//! ```

use fusebox_core::ir::DType;
use fusebox_core::runtime::{Storage, StorageRef, Tensor};

/// The kernels' internal result: a message that the dispatcher prefixes with the op name.
pub(crate) type KResult<T> = std::result::Result<T, String>;

/// Row-major strides (in elements) of `shape`.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Steps the row-major index `idx` over `dims` (the last fastest) to the next element;
/// `false` (with `idx` back at all zeros) when it wraps around.
pub(crate) fn next_index(idx: &mut [usize], dims: &[usize]) -> bool {
    for (i, &d) in idx.iter_mut().zip(dims).rev() {
        *i += 1;
        if *i < d {
            return true;
        }
        *i = 0;
    }
    false
}

/// Normalises a possibly negative `axis` for rank `rank`.
pub(crate) fn norm_axis(axis: i64, rank: usize) -> KResult<usize> {
    let r = i64::try_from(rank).map_err(|_| "rank too large".to_string())?;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) {
        Ok(a as usize)
    } else {
        Err(format!("axis {axis} is out of range for rank {rank}"))
    }
}

/// Normalises distinct axes.
pub(crate) fn norm_axes(axes: &[i64], rank: usize) -> KResult<Vec<usize>> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = norm_axis(a, rank)?;
        if out.contains(&n) {
            return Err(format!("axis {a} is repeated in {axes:?}"));
        }
        out.push(n);
    }
    Ok(out)
}

/// The element count of a shape, as an error on overflow.
pub(crate) fn numel(shape: &[usize]) -> KResult<usize> {
    fusebox_core::runtime::shape_numel(shape)
        .ok_or_else(|| format!("the element count of {shape:?} overflows"))
}

/// Numpy broadcasting of two shapes.
pub(crate) fn broadcast_shapes(a: &[usize], b: &[usize]) -> KResult<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let x = (i + a.len()).checked_sub(n).map_or(1, |j| a[j]);
        let y = (i + b.len()).checked_sub(n).map_or(1, |j| b[j]);
        out.push(match (x, y) {
            _ if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return Err(format!("cannot broadcast shapes {a:?} and {b:?}")),
        });
    }
    Ok(out)
}

/// Strides of a tensor of shape `src` read as shape `out` under broadcasting (right-aligned;
/// 0 where a dim is broadcast or missing). `src` must broadcast to `out`.
pub(crate) fn broadcast_strides(src: &[usize], out: &[usize]) -> Vec<isize> {
    let s = strides(src);
    let off = out.len() - src.len().min(out.len());
    (0..out.len())
        .map(|i| match i.checked_sub(off) {
            Some(j) if src[j] != 1 || out[i] == 1 => s[j] as isize,
            _ => 0,
        })
        .collect()
}

/// `out[i] = src[offset + Σ i_k * strides[k]]` for every index `i` of `out_shape`, row-major.
/// The offsets must be in bounds for every index (callers derive them from valid shapes).
pub(crate) fn gather<T: Copy>(
    src: &[T],
    offset: isize,
    strides: &[isize],
    out_shape: &[usize],
) -> Vec<T> {
    let total: usize = out_shape.iter().product();
    let mut out = Vec::with_capacity(total);
    if total == 0 {
        return out;
    }
    let r = out_shape.len();
    if r == 0 {
        out.push(src[offset as usize]);
        return out;
    }
    let inner = out_shape[r - 1];
    let istride = strides[r - 1];
    let mut idx = vec![0usize; r - 1];
    let mut base = offset;
    loop {
        if istride == 1 {
            let b = base as usize;
            out.extend_from_slice(&src[b..b + inner]);
        } else {
            let mut p = base;
            for _ in 0..inner {
                out.push(src[p as usize]);
                p += istride;
            }
        }
        // Advance the odometer over the outer dims.
        let mut k = r - 1;
        loop {
            if k == 0 {
                return out;
            }
            k -= 1;
            idx[k] += 1;
            base += strides[k];
            if idx[k] < out_shape[k] {
                break;
            }
            base -= strides[k] * out_shape[k] as isize;
            idx[k] = 0;
        }
    }
}

/// `f(a[i'], b[i''])` over the broadcast shape `out_shape` of `a_shape` and `b_shape`.
pub(crate) fn zip_broadcast<A: Copy, B: Copy, O>(
    a: &[A],
    a_shape: &[usize],
    b: &[B],
    b_shape: &[usize],
    out_shape: &[usize],
    mut f: impl FnMut(A, B) -> O,
) -> Vec<O> {
    if a_shape == b_shape {
        return a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect();
    }
    let total: usize = out_shape.iter().product();
    let mut out = Vec::with_capacity(total);
    if total == 0 {
        return out;
    }
    if b.len() == 1 {
        let y = b[0];
        if a.len() == total {
            return a.iter().map(|&x| f(x, y)).collect();
        }
    }
    if a.len() == 1 && b.len() == total {
        let x = a[0];
        return b.iter().map(|&y| f(x, y)).collect();
    }
    let sa = broadcast_strides(a_shape, out_shape);
    let sb = broadcast_strides(b_shape, out_shape);
    let r = out_shape.len();
    let inner = out_shape[r - 1];
    let (ia, ib) = (sa[r - 1], sb[r - 1]);
    let mut idx = vec![0usize; r - 1];
    let (mut pa, mut pb) = (0isize, 0isize);
    loop {
        let (mut qa, mut qb) = (pa, pb);
        for _ in 0..inner {
            out.push(f(a[qa as usize], b[qb as usize]));
            qa += ia;
            qb += ib;
        }
        let mut k = r - 1;
        loop {
            if k == 0 {
                return out;
            }
            k -= 1;
            idx[k] += 1;
            pa += sa[k];
            pb += sb[k];
            if idx[k] < out_shape[k] {
                break;
            }
            pa -= sa[k] * out_shape[k] as isize;
            pb -= sb[k] * out_shape[k] as isize;
            idx[k] = 0;
        }
    }
}

/// Applies a dtype-generic expression to borrowed elements ([`StorageRef`]), giving a storage
/// of the same dtype.
macro_rules! map_same {
    ($s:expr, $v:ident => $body:expr) => {
        match $s {
            fusebox_core::runtime::StorageRef::F16($v) => {
                fusebox_core::runtime::Storage::F16($body)
            }
            fusebox_core::runtime::StorageRef::BF16($v) => {
                fusebox_core::runtime::Storage::BF16($body)
            }
            fusebox_core::runtime::StorageRef::F32($v) => {
                fusebox_core::runtime::Storage::F32($body)
            }
            fusebox_core::runtime::StorageRef::F64($v) => {
                fusebox_core::runtime::Storage::F64($body)
            }
            fusebox_core::runtime::StorageRef::I8($v) => fusebox_core::runtime::Storage::I8($body),
            fusebox_core::runtime::StorageRef::U8($v) => fusebox_core::runtime::Storage::U8($body),
            fusebox_core::runtime::StorageRef::I32($v) => {
                fusebox_core::runtime::Storage::I32($body)
            }
            fusebox_core::runtime::StorageRef::I64($v) => {
                fusebox_core::runtime::Storage::I64($body)
            }
            fusebox_core::runtime::StorageRef::Bool($v) => {
                fusebox_core::runtime::Storage::Bool($body)
            }
        }
    };
}
pub(crate) use map_same;

/// The tensor of `shape` gathered from `s` ([`gather`]): `f32` into a kept buffer
/// ([`crate::par::scratch_f32`]: in a model, a dropped tensor's buffer instead of fresh pages;
/// GPT-2's 60 head permutes went from 5.1–5.4 to 3.0–3.1 ms per run), other dtypes into a new
/// one, both by [`gather_blocked`] where it applies (rank 2 or more, no negative stride or
/// offset), else by [`gather`].
pub(crate) fn gather_tensor(
    s: StorageRef<'_>,
    offset: isize,
    st: &[isize],
    shape: Vec<usize>,
) -> KResult<Tensor> {
    let blocked = shape.len() >= 2 && offset >= 0 && st.iter().all(|&s| s >= 0);
    let total: usize = shape.iter().product();
    let threads = crate::par::threads_for(total, GATHER_GRAIN);
    let data = match s {
        StorageRef::F32(v) if blocked => {
            let mut out = crate::par::scratch_f32(total);
            gather_blocked(v, offset, st, &shape, &mut out, threads);
            return out.into_tensor(shape);
        }
        other if blocked => map_same!(other, v => {
            let mut out = vec![Default::default(); total];
            gather_blocked(v, offset, st, &shape, &mut out, threads);
            out
        }),
        other => map_same!(other, v => gather(v, offset, st, &shape)),
    };
    tensor(shape, data)
}

/// Output elements per thread below which [`gather_blocked`] stays on one thread.
const GATHER_GRAIN: usize = 1 << 14;

/// [`gather`] into `out` (the same elements; rank 2 or more, strides and offset not
/// negative), its rows spread over up to `threads` threads. Where the source's last axis is the
/// output's second to last (a head split's `[0, 2, 3, 1]`, a matrix transpose) the rows are
/// filled in 16 × 16 tiles, so reads and writes both stay within a few cache lines; where the
/// last axis is unchanged each row is one copy.
fn gather_blocked<T: Copy + Send + Sync>(
    src: &[T],
    offset: isize,
    st: &[isize],
    out_shape: &[usize],
    out: &mut [T],
    threads: usize,
) {
    const TILE: usize = 16;
    let r = out_shape.len();
    let (rows, cols) = (out_shape[r - 2], out_shape[r - 1]);
    if out.is_empty() || rows == 0 || cols == 0 {
        return;
    }
    let (rs, cs) = (st[r - 2] as usize, st[r - 1] as usize);
    let lead = &out_shape[..r - 2];
    let tiled = rs == 1 && cs != 1 && cols > 1;
    // The source offset of block `b` (an index of the leading axes, row-major).
    let block_base = |mut b: usize| {
        let mut at = offset as usize;
        for (&d, &s) in lead.iter().zip(st).rev() {
            at += (b % d) * s as usize;
            b /= d;
        }
        at
    };
    // Tasks: runs of whole output rows (of tiles of rows when tiled), a few per thread. A
    // task may start inside a block, so one block (a split's `(1, 128, 768)` part of GPT-2's
    // `(1, 128, 2304)` projection, 0.2 ms) is spread over the threads too.
    let unit = if tiled { TILE } else { 1 };
    // Rows per band: a tile, or the rest of the block.
    let band_rows = if tiled { TILE } else { rows };
    let units = (out.len() / cols).div_ceil(unit);
    let per_task = units.div_ceil(threads * 4).max(1) * unit * cols;
    crate::par::for_each_chunk_mut(out, per_task, threads, |off, dst| {
        // Block `b`, its row `i0` and the block's source offset, advanced band by band (one
        // division per task, not per row).
        let q = off / cols;
        let (mut b, mut i0) = (q / rows, q % rows);
        let mut base = block_base(b);
        let mut rest = dst;
        while !rest.is_empty() {
            // Rows `i0..i1` of block `b`: up to a tile, within the block and the task.
            let i1 = rows.min(i0 + band_rows).min(i0 + rest.len() / cols);
            if i1 == i0 {
                // (Never: every task is whole rows.)
                break;
            }
            let (band, tail) = rest.split_at_mut((i1 - i0) * cols);
            rest = tail;
            if tiled {
                for j0 in (0..cols).step_by(TILE) {
                    let j1 = (j0 + TILE).min(cols);
                    for (i, row) in (i0..i1).zip(band.chunks_exact_mut(cols)) {
                        for (j, d) in (j0..j1).zip(&mut row[j0..j1]) {
                            *d = src[base + i + j * cs];
                        }
                    }
                }
            } else if cs == 1 {
                for (i, row) in (i0..i1).zip(band.chunks_exact_mut(cols)) {
                    let at = base + i * rs;
                    row.copy_from_slice(&src[at..at + cols]);
                }
            } else {
                for (i, row) in (i0..i1).zip(band.chunks_exact_mut(cols)) {
                    for (j, d) in row.iter_mut().enumerate() {
                        *d = src[base + i * rs + j * cs];
                    }
                }
            }
            i0 = i1;
            if i0 == rows {
                (b, i0) = (b + 1, 0);
                base = block_base(b);
            }
        }
    });
}

/// A tensor of `shape` over `data`, as a kernel error when they disagree.
pub(crate) fn tensor(shape: Vec<usize>, data: Storage) -> KResult<Tensor> {
    Tensor::new(shape, data).map_err(|e| e.to_string())
}

/// The elements of a float tensor widened to `f64`; an error for other dtypes.
pub(crate) fn floats(t: &Tensor, what: &str) -> KResult<Vec<f64>> {
    if !t.dtype().is_float() {
        return Err(format!(
            "expected {what} to have a float dtype, found {}",
            t.dtype()
        ));
    }
    Ok(t.to_f64_vec())
}

/// A tensor of `dtype` from `f64` values (rounded to nearest).
pub(crate) fn from_f64(shape: Vec<usize>, dtype: DType, v: Vec<f64>) -> KResult<Tensor> {
    tensor(shape, Storage::from_f64(dtype, v))
}

/// Converts a tensor to a layout given by the positions of `NCHW`-style letters:
/// `pos[k]` is where canonical dim `k` sits in the tensor. Returns the canonical tensor.
pub(crate) fn to_canonical(t: &Tensor, pos: [usize; 4]) -> Tensor {
    if pos == [0, 1, 2, 3] {
        return t.clone();
    }
    permute(t, &pos)
}

/// Converts a canonical (`NCHW`-ordered) tensor to the layout whose letter positions are `pos`.
pub(crate) fn from_canonical(t: &Tensor, pos: [usize; 4]) -> Tensor {
    if pos == [0, 1, 2, 3] {
        return t.clone();
    }
    // Output dim p holds canonical dim k where pos[k] = p.
    let mut perm = [0usize; 4];
    for (k, &p) in pos.iter().enumerate() {
        perm[p] = k;
    }
    permute(t, &perm)
}

/// `permute_dims`: output dim `i` is input dim `perm[i]` (a valid permutation).
pub(crate) fn permute(t: &Tensor, perm: &[usize]) -> Tensor {
    let s = strides(t.shape());
    let out_shape: Vec<usize> = perm.iter().map(|&p| t.shape()[p]).collect();
    let st: Vec<isize> = perm.iter().map(|&p| s[p] as isize).collect();
    // The element count is unchanged, so this cannot fail.
    gather_tensor(t.storage(), 0, &st, out_shape).unwrap_or_else(|_| t.clone())
}

/// The outputs `[lo, hi)` (of `out`, `lo ≤ hi`) of a strided window position whose input
/// `o·s + x0` lies in `0..len`: a pool's or an im2col lowering's run for one kernel tap.
pub(crate) fn in_range_outputs(x0: isize, s: usize, len: usize, out: usize) -> (usize, usize) {
    let (s, len) = (s as isize, len as isize);
    let lo = if x0 >= 0 {
        0
    } else {
        ((-x0 + s - 1) / s) as usize
    };
    let hi = if len - 1 - x0 < 0 {
        0
    } else {
        (((len - 1 - x0) / s) as usize + 1).min(out)
    };
    (lo.min(hi), hi)
}

/// Tests: deterministic values in [-1, 1) with some exact zeros (every eleventh from the
/// sixth), from a seed.
#[cfg(test)]
pub(crate) fn test_values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            if i % 11 == 5 {
                0.0
            } else {
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tiled_transpose_is_the_gather() {
        // Head splits and plain transposes, sizes around the tile, a broadcast (stride 0)
        // leading axis excluded (permute's strides are never 0).
        for (shape, perm) in [
            (vec![1usize, 37, 5, 19], vec![0usize, 2, 3, 1]),
            (vec![2, 33, 17], vec![0, 2, 1]),
            (vec![16, 16], vec![1, 0]),
            (vec![3, 1, 40], vec![2, 1, 0]),
            (vec![2, 3, 4, 5], vec![3, 1, 0, 2]),
        ] {
            let n: usize = shape.iter().product();
            let src: Vec<i32> = (0..n as i32).collect();
            let s = strides(&shape);
            let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            let st: Vec<isize> = perm.iter().map(|&p| s[p] as isize).collect();
            let r = out_shape.len();
            let want = gather(&src, 0, &st, &out_shape);
            if st[r - 2] == 1 && st[r - 1] != 1 {
                assert_eq!(
                    {
                        let mut out = vec![0; want.len()];
                        gather_blocked(&src, 0, &st, &out_shape, &mut out, 1);
                        out
                    },
                    want,
                    "{shape:?} {perm:?}"
                );
            }
            let t = Tensor::new(shape.clone(), fusebox_core::runtime::Storage::I32(src))
                .unwrap_or_else(|e| panic!("{e}"));
            let got = permute(&t, &perm);
            assert_eq!(got.shape(), &out_shape[..]);
            assert_eq!(
                got.to_i64_vec(),
                want.iter().map(|&v| i64::from(v)).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn the_threaded_f32_gather_is_the_gather() {
        // Head splits and merges (BERT's and GPT-2's), a transpose, an odd permutation, a
        // slice with an offset, sizes that do not divide the tiles, on 1 to 3 threads.
        let cases: [(Vec<usize>, Vec<usize>, usize); 6] = [
            (vec![2, 128, 12, 64], vec![0, 2, 1, 3], 0),
            (vec![2, 128, 12, 64], vec![0, 2, 3, 1], 0),
            (vec![1600, 129], vec![1, 0], 0),
            (vec![4, 33, 17, 70], vec![3, 1, 0, 2], 0),
            (vec![20, 37, 19, 11], vec![0, 3, 2, 1], 0),
            (vec![1, 288, 2304], vec![0, 1, 2], 768),
        ];
        for (shape, perm, offset) in cases {
            let s = strides(&shape);
            let mut out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            let st: Vec<isize> = perm.iter().map(|&p| s[p] as isize).collect();
            if offset > 0
                && let Some(last) = out_shape.last_mut()
            {
                // The middle third of the last axis (a QKV split's K).
                *last /= 3;
            }
            let n: usize = shape.iter().product();
            let src: Vec<f32> = (0..n).map(|i| i as f32).collect();
            let want = gather(&src, offset as isize, &st, &out_shape);
            // Large enough for the threaded path on two threads or more.
            assert!(
                want.len() >= 2 * GATHER_GRAIN,
                "{shape:?}: too small to be split"
            );
            for t in 1..=3 {
                let got = crate::par::with_threads(t, || {
                    let f32s = Storage::F32(src.clone());
                    gather_tensor(f32s.view(), offset as isize, &st, out_shape.clone())
                });
                let got = got.unwrap_or_else(|e| panic!("{e}")).to_f32_vec();
                assert_eq!(got, want, "{shape:?} {perm:?} on {t} threads");
            }
        }
    }

    #[test]
    fn gather_transposes() {
        let src: Vec<i32> = (0..6).collect();
        assert_eq!(gather(&src, 0, &[1, 3], &[3, 2]), vec![0, 3, 1, 4, 2, 5]);
        // Reverse along the last axis.
        assert_eq!(gather(&src, 2, &[3, -1], &[2, 3]), vec![2, 1, 0, 5, 4, 3]);
    }

    #[test]
    fn broadcast() {
        assert_eq!(broadcast_shapes(&[3, 1], &[1, 4]), Ok(vec![3, 4]));
        assert_eq!(broadcast_shapes(&[17], &[3, 1]), Ok(vec![3, 17]));
        assert!(broadcast_shapes(&[3], &[4]).is_err());
        let a = [1, 2, 3];
        let b = [10, 20];
        let out = zip_broadcast(&a, &[3, 1], &b, &[2], &[3, 2], |x, y| x + y);
        assert_eq!(out, vec![11, 21, 12, 22, 13, 23]);
    }
}
