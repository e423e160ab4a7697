//! Indexing, shape and layout kernels of issue 17: `gather_elements`, `gather_nd`,
//! `scatter_elements`, `scatter_nd`, `one_hot`, `arange`, `tile`, `tril`/`triu`,
//! `cumsum`/`cumprod`, `nn.pad` and `reverse_sequence`, on every stored dtype.
//!
//! Contract: indices may be any integer dtype and negative (counting from the end, as ONNX);
//! an index out of range, a shape that does not fit, or an output larger than
//! [`MAX_ELEMS`] is an `Err` naming the problem, never a panic. Data moves bit for bit
//! (through `f64` for floats and `i64` for integers and bool, both exact); scatter reductions
//! and scans compute in `f64` (floats) or wrapping `i64` (integers) and round once per element.
//!
//! ```text
//! R.gather_elements(x: [[1, 2], [3, 4]], idx: [[0, 0], [1, 0]], axis=1) = [[1, 1], [4, 3]]
//! R.tril(x: (3, 3) ones, k=0)                                          = lower triangle of ones
//! R.nn.pad(x: [1, 2, 3], pad_width=[2, 1], pad_mode="reflect")         = [3, 2, 1, 2, 3, 2]
//! ```

use crate::util::{KResult, map_same, norm_axis, numel, strides, tensor};
use fusebox_core::ir::DType;
use fusebox_core::op::{ArangeAttrs, PadAttrs, PadMode, ScanAttrs, ScatterReduction};
use fusebox_core::runtime::{Prim, Storage, StorageRef, Tensor};

/// The most elements a kernel of this family allocates for one output (2^31).
pub(crate) const MAX_ELEMS: usize = 1 << 31;

/// Element values widened without loss: floats to `f64`, integers and bool to `i64`.
enum Num {
    F(Vec<f64>),
    I(Vec<i64>),
}

impl Num {
    fn of(t: &Tensor) -> Num {
        if t.dtype().is_float() {
            Num::F(t.to_f64_vec())
        } else {
            Num::I(t.to_i64_vec())
        }
    }

    fn into_tensor(self, shape: Vec<usize>, dtype: DType) -> KResult<Tensor> {
        let data = match self {
            Num::F(v) => Storage::from_f64(dtype, v),
            Num::I(v) => Storage::from_i64(dtype, v),
        };
        tensor(shape, data)
    }
}

/// The element count of an output shape, checked against [`MAX_ELEMS`].
fn out_numel(shape: &[usize]) -> KResult<usize> {
    let n = numel(shape)?;
    if n > MAX_ELEMS {
        return Err(format!(
            "the output {shape:?} would have {n} elements (at most {MAX_ELEMS})"
        ));
    }
    Ok(n)
}

/// Calls `f` with every multi-index of `shape`, row-major.
fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize]) -> KResult<()>) -> KResult<()> {
    if shape.contains(&0) {
        return Ok(());
    }
    let mut idx = vec![0usize; shape.len()];
    loop {
        f(&idx)?;
        let mut k = shape.len();
        loop {
            if k == 0 {
                return Ok(());
            }
            k -= 1;
            idx[k] += 1;
            if idx[k] < shape[k] {
                break;
            }
            idx[k] = 0;
        }
    }
}

/// `fill` as one element of `dtype` (integers truncate toward zero).
fn fill_storage(dtype: DType, fill: f64) -> Storage {
    if dtype.is_float() {
        Storage::from_f64(dtype, vec![fill])
    } else {
        Storage::from_i64(dtype, vec![fill as i64])
    }
}

/// `x` read at the source positions `src` (row-major over `shape`); `None` gives `fill`
/// (converted to the dtype once). Elements are copied in their own type.
fn gather_fill(x: &Tensor, shape: Vec<usize>, src: &[Option<usize>], fill: f64) -> KResult<Tensor> {
    let fill_s = fill_storage(x.dtype(), fill);
    macro_rules! pick {
        ($($var:ident),*) => {
            match (x.storage(), &fill_s) {
                $((StorageRef::$var(v), Storage::$var(f)) => {
                    let f = f.first().copied().unwrap_or_default();
                    Storage::$var(
                        src.iter()
                            .map(|s| s.and_then(|i| v.get(i).copied()).unwrap_or(f))
                            .collect(),
                    )
                })*
                _ => return Err("internal: fill dtype differs".to_string()),
            }
        };
    }
    let data = pick!(F16, BF16, F32, F64, I8, U8, I32, I64, Bool);
    tensor(shape, data)
}

/// Constant `nn.pad` with non-negative widths: the output filled with the value, then each
/// innermost run of `x` copied to its place (no per-element index: ConvTranspose's depth taps
/// pad whole 5-D tensors, 65 times for a kernel depth of 65).
fn pad_constant(
    x: &Tensor,
    shape: Vec<usize>,
    total: usize,
    widths: &[i64],
    fill: f64,
) -> KResult<Tensor> {
    fn place<T: Copy>(
        xs: &[T],
        fill: T,
        xshape: &[usize],
        ost: &[usize],
        widths: &[i64],
        total: usize,
    ) -> Vec<T> {
        let mut out = vec![fill; total];
        let r = xshape.len();
        let Some(&run) = xshape.last() else {
            // A scalar: nothing to pad.
            out.copy_from_slice(xs);
            return out;
        };
        if run == 0 {
            return out;
        }
        // Widths are non-negative and the output extent is their sum with the input's, so
        // every destination lies inside `out`.
        let w = |d: usize| widths[2 * d] as usize;
        for (k, chunk) in xs.chunks_exact(run).enumerate() {
            let (mut rem, mut off) = (k, w(r - 1));
            for d in (0..r - 1).rev() {
                let n = xshape[d];
                off += (rem % n + w(d)) * ost[d];
                rem /= n;
            }
            out[off..off + run].copy_from_slice(chunk);
        }
        out
    }
    let ost = strides(&shape);
    let fill_s = fill_storage(x.dtype(), fill);
    macro_rules! pick {
        ($($var:ident),*) => {
            match (x.storage(), &fill_s) {
                $((StorageRef::$var(v), Storage::$var(f)) => {
                    let f = f.first().copied().unwrap_or_default();
                    Storage::$var(place(v, f, x.shape(), &ost, widths, total))
                })*
                _ => return Err("internal: fill dtype differs".to_string()),
            }
        };
    }
    let data = pick!(F16, BF16, F32, F64, I8, U8, I32, I64, Bool);
    tensor(shape, data)
}

/// The integer values of an index tensor.
fn index_values(t: &Tensor, what: &str) -> KResult<Vec<i64>> {
    if !t.dtype().is_int() {
        return Err(format!(
            "expected {what} to have an integer dtype, found {}",
            t.dtype()
        ));
    }
    Ok(t.to_i64_vec())
}

/// `i` (negative counts from the end) as an index into an axis of extent `n`.
fn norm_index(i: i64, n: usize, what: &str) -> KResult<usize> {
    let ni = i64::try_from(n).map_err(|_| "extent too large".to_string())?;
    let j = if i < 0 { i.saturating_add(ni) } else { i };
    if (0..ni).contains(&j) {
        Ok(j as usize)
    } else {
        Err(format!(
            "{what} {i} is out of range for an axis of extent {n} (expected {} to {})",
            -ni,
            ni - 1
        ))
    }
}

/// For `gather_elements` / `scatter_elements` (indices of the data's rank): the flat offset in
/// `x` of every position `p` of `idx` with `p[axis]` replaced by `idx[p]`, in row-major order
/// of `p`; an index out of range, or indices larger than the data off the axis, are errors.
fn element_offsets(x: &Tensor, idx: &Tensor, axis: i64) -> KResult<Vec<usize>> {
    let ax = norm_axis(axis, x.rank())?;
    for (d, (&i, &n)) in idx.shape().iter().zip(x.shape()).enumerate() {
        if d != ax && i > n {
            return Err(format!(
                "indices {:?} are larger than the data {:?} on axis {d}",
                idx.shape(),
                x.shape()
            ));
        }
    }
    let iv = index_values(idx, "indices")?;
    let xs = strides(x.shape());
    let n = x.shape()[ax];
    let mut out = Vec::with_capacity(iv.len());
    let mut k = 0usize;
    for_each_index(idx.shape(), |p| {
        let j = norm_index(iv[k], n, "index")?;
        k += 1;
        out.push(
            p.iter()
                .zip(&xs)
                .enumerate()
                .map(|(d, (&c, &s))| if d == ax { j * s } else { c * s })
                .sum(),
        );
        Ok(())
    })?;
    Ok(out)
}

/// `gather_elements`: `out[p] = x[p with p[axis] = idx[p]]`.
pub(crate) fn gather_elements(x: &Tensor, idx: &Tensor, axis: i64) -> KResult<Tensor> {
    let r = x.rank();
    if idx.rank() != r {
        return Err(format!(
            "expected indices of the data's rank {r}, found shape {:?}",
            idx.shape()
        ));
    }
    let ax = norm_axis(axis, r)?;
    let (xs, is) = (x.shape(), idx.shape());
    if (0..r).all(|d| d == ax || xs[d] == is[d]) {
        // The indices span the data on every other axis (DeBERTa's relative positions, a
        // `[B·H, S, S]` gather from `[B·H, S, 2k]` per layer): one pass over them, the data
        // read at `[outer, idx, inner]`, no per-position coordinates.
        let outer: usize = xs[..ax].iter().product();
        let inner: usize = xs[ax + 1..].iter().product();
        let (n, m) = (xs[ax], is[ax]);
        let ni = i64::try_from(n).map_err(|_| "extent too large".to_string())?;
        let owned;
        let iv: &[i64] = match idx.storage() {
            StorageRef::I64(v) => v,
            _ => {
                owned = index_values(idx, "indices")?;
                &owned
            }
        };
        // The first index out of range (either way) is the general path's error.
        if let Some(&raw) = iv.iter().find(|&&j| !(-ni..ni).contains(&j)) {
            norm_index(raw, n, "index")?;
        }
        // The data at `[o, j, i]` (every index now in range).
        let at = |o: usize, k: usize, i: usize| {
            let j = if iv[k] < 0 { iv[k] + ni } else { iv[k] };
            (o * n + j as usize) * inner + i
        };
        let data = map_same!(x.storage(), v => {
            let mut out = Vec::with_capacity(iv.len());
            let mut k = 0usize;
            for o in 0..outer {
                for _ in 0..m {
                    for i in 0..inner {
                        out.push(v.get(at(o, k, i)).copied().unwrap_or_default());
                        k += 1;
                    }
                }
            }
            out
        });
        return tensor(is.to_vec(), data);
    }
    let src: Vec<Option<usize>> = element_offsets(x, idx, axis)?
        .into_iter()
        .map(Some)
        .collect();
    gather_fill(x, idx.shape().to_vec(), &src, 0.0)
}

/// Checks the shapes of `gather_nd` / `scatter_nd` and returns (batch, number of index
/// tuples per batch, tuple length `m`).
fn nd_shapes(x: &[usize], id: &[usize], b: usize) -> KResult<(usize, usize, usize)> {
    let q = id.len();
    if q < 1 || b >= q || b > x.len() {
        return Err(format!(
            "batch_dims {b} must be less than the ranks of data {x:?} and indices {id:?}"
        ));
    }
    if x[..b] != id[..b] {
        return Err(format!(
            "the {b} batch dims of data {x:?} and indices {id:?} differ"
        ));
    }
    let m = id[q - 1];
    if m < 1 || b + m > x.len() {
        return Err(format!(
            "the last dim of indices {id:?} must be between 1 and {} (the data's rank minus batch_dims)",
            x.len() - b
        ));
    }
    let batch: usize = x[..b].iter().product();
    let per: usize = id[b..q - 1].iter().product();
    Ok((batch, per, m))
}

/// `gather_nd` with `batch_dims` leading batch dims.
pub(crate) fn gather_nd(x: &Tensor, idx: &Tensor, batch_dims: i64) -> KResult<Tensor> {
    let b = usize::try_from(batch_dims).map_err(|_| "batch_dims must not be negative")?;
    let (xs, is) = (x.shape(), idx.shape());
    let (batch, per, m) = nd_shapes(xs, is, b)?;
    let iv = index_values(idx, "indices")?;
    let st = strides(xs);
    let inner: usize = xs[b + m..].iter().product();
    let bstride: usize = xs[b..].iter().product();
    let mut shape: Vec<usize> = is[..is.len() - 1].to_vec();
    shape.extend_from_slice(&xs[b + m..]);
    out_numel(&shape)?;
    let mut src = Vec::with_capacity(batch * per * inner);
    for bi in 0..batch {
        for t in 0..per {
            let base = (bi * per + t) * m;
            let mut off = bi * bstride;
            for k in 0..m {
                let j = norm_index(iv[base + k], xs[b + k], "index")?;
                off += j * st[b + k];
            }
            src.extend((off..off + inner).map(Some));
        }
    }
    gather_fill(x, shape, &src, 0.0)
}

fn combine_f(r: ScatterReduction, old: f64, new: f64) -> f64 {
    match r {
        ScatterReduction::Update => new,
        ScatterReduction::Add => old + new,
        ScatterReduction::Mul => old * new,
        ScatterReduction::Max => old.max(new),
        ScatterReduction::Min => old.min(new),
        ScatterReduction::Mean => (old + new) / 2.0,
    }
}

fn combine_i(r: ScatterReduction, old: i64, new: i64) -> i64 {
    match r {
        ScatterReduction::Update => new,
        ScatterReduction::Add => old.wrapping_add(new),
        ScatterReduction::Mul => old.wrapping_mul(new),
        ScatterReduction::Max => old.max(new),
        ScatterReduction::Min => old.min(new),
        ScatterReduction::Mean => old.wrapping_add(new) / 2,
    }
}

/// Applies `(target offset, update position)` pairs in order.
fn scatter_apply(
    x: &Tensor,
    upd: &Tensor,
    pairs: &[(usize, usize)],
    r: ScatterReduction,
) -> KResult<Tensor> {
    if upd.dtype() != x.dtype() {
        return Err(format!(
            "expected updates of the data's dtype {}, found {}",
            x.dtype(),
            upd.dtype()
        ));
    }
    let out = match (Num::of(x), Num::of(upd)) {
        (Num::F(mut v), Num::F(u)) => {
            for &(t, p) in pairs {
                v[t] = combine_f(r, v[t], u[p]);
            }
            Num::F(v)
        }
        (Num::I(mut v), Num::I(u)) => {
            for &(t, p) in pairs {
                v[t] = combine_i(r, v[t], u[p]);
            }
            Num::I(v)
        }
        _ => return Err("internal: mixed dtypes".to_string()),
    };
    out.into_tensor(x.shape().to_vec(), x.dtype())
}

/// `scatter_elements`: `out[p with p[axis] = idx[p]] (op)= upd[p]`, in row-major order of `p`.
pub(crate) fn scatter_elements(
    x: &Tensor,
    idx: &Tensor,
    upd: &Tensor,
    axis: i64,
    r: ScatterReduction,
) -> KResult<Tensor> {
    let rank = x.rank();
    if idx.rank() != rank || upd.shape() != idx.shape() {
        return Err(format!(
            "expected indices and updates of one shape and the data's rank {rank}, found {:?} and {:?}",
            idx.shape(),
            upd.shape()
        ));
    }
    let pairs: Vec<(usize, usize)> = element_offsets(x, idx, axis)?
        .into_iter()
        .enumerate()
        .map(|(k, off)| (off, k))
        .collect();
    scatter_apply(x, upd, &pairs, r)
}

/// `scatter_nd`: each index tuple of `idx` names a slice of `x` that the matching slice of
/// `upd` updates, in order.
pub(crate) fn scatter_nd(
    x: &Tensor,
    idx: &Tensor,
    upd: &Tensor,
    r: ScatterReduction,
) -> KResult<Tensor> {
    let (xs, is) = (x.shape(), idx.shape());
    let Some((&m, lead)) = is.split_last() else {
        return Err("expected indices of rank at least 1, found a scalar".to_string());
    };
    if m > xs.len() {
        return Err(format!(
            "the last dim of indices {is:?} is larger than the data's rank {}",
            xs.len()
        ));
    }
    let mut want: Vec<usize> = lead.to_vec();
    want.extend_from_slice(&xs[m..]);
    if upd.shape() != want.as_slice() {
        return Err(format!(
            "expected updates of shape {want:?} for data {xs:?} and indices {is:?}, found {:?}",
            upd.shape()
        ));
    }
    let iv = index_values(idx, "indices")?;
    let st = strides(xs);
    let inner: usize = xs[m..].iter().product();
    let tuples: usize = lead.iter().product();
    let mut pairs = Vec::with_capacity(tuples * inner);
    for t in 0..tuples {
        let mut off = 0usize;
        for k in 0..m {
            let j = norm_index(iv[t * m + k], xs[k], "index")?;
            off += j * st[k];
        }
        pairs.extend((0..inner).map(|e| (off + e, t * inner + e)));
    }
    scatter_apply(x, upd, &pairs, r)
}

/// A fill value of `one_hot`: a prim value (int64 for an integer, float32 for a float) or a
/// rank-0 tensor (its dtype).
fn fill_value(v: &fusebox_core::runtime::Value, what: &str) -> KResult<(f64, i64, DType)> {
    use fusebox_core::runtime::Value;
    match v {
        Value::Prim(Prim::Int(i)) => Ok((*i as f64, *i, DType::I64)),
        Value::Prim(Prim::Float(f)) => Ok((*f, *f as i64, DType::F32)),
        Value::Tensor(t) if t.numel() == 1 && t.rank() == 0 => {
            let f = t.to_f64_vec().first().copied().unwrap_or(0.0);
            let i = t.to_i64_vec().first().copied().unwrap_or(0);
            Ok((f, i, t.dtype()))
        }
        v => Err(format!(
            "expected {what} to be a prim value or a rank-0 tensor, found {}",
            v.kind()
        )),
    }
}

/// `one_hot`: a new axis of extent `depth` at `axis`, `on` where it equals the index
/// (negative indices count from the end; others out of range give a row of `off`, as ONNX).
pub(crate) fn one_hot(
    idx: &Tensor,
    on: &fusebox_core::runtime::Value,
    off: &fusebox_core::runtime::Value,
    depth: i64,
    axis: i64,
) -> KResult<Tensor> {
    let (onf, oni, dtype) = fill_value(on, "on_value")?;
    let (offf, offi, dtype2) = fill_value(off, "off_value")?;
    if dtype != dtype2 {
        return Err(format!(
            "expected on_value and off_value of one dtype, found {dtype} and {dtype2}"
        ));
    }
    let iv = index_values(idx, "indices")?;
    let d = usize::try_from(depth).map_err(|_| format!("depth must not be negative: {depth}"))?;
    let r = idx.rank();
    let ax = norm_axis(axis, r + 1)?;
    let mut shape = idx.shape().to_vec();
    shape.insert(ax, d);
    let total = out_numel(&shape)?;
    let outer: usize = idx.shape()[..ax].iter().product();
    let inner: usize = idx.shape()[ax..].iter().product();
    let mut hot = vec![false; total];
    for o in 0..outer {
        for i in 0..inner {
            let v = iv[o * inner + i];
            let j = if v < 0 { v.saturating_add(depth) } else { v };
            if (0..depth).contains(&j) {
                hot[(o * d + j as usize) * inner + i] = true;
            }
        }
    }
    let data = if dtype.is_float() {
        Storage::from_f64(
            dtype,
            hot.iter().map(|&h| if h { onf } else { offf }).collect(),
        )
    } else {
        Storage::from_i64(
            dtype,
            hot.iter().map(|&h| if h { oni } else { offi }).collect(),
        )
    };
    tensor(shape, data)
}

/// `arange`: `start + i * step` for `i` in `0..numel`.
pub(crate) fn arange(a: &ArangeAttrs) -> KResult<Tensor> {
    let n = usize::try_from(a.numel()?).map_err(|_| "negative length".to_string())?;
    out_numel(&[n])?;
    let data = if a.dtype.is_float() {
        Storage::from_f64(
            a.dtype,
            (0..n).map(|i| a.start.0 + i as f64 * a.step.0).collect(),
        )
    } else {
        let (s, st) = (a.start.0 as i64, a.step.0 as i64);
        Storage::from_i64(
            a.dtype,
            (0..n as i64)
                .map(|i| s.wrapping_add(i.wrapping_mul(st)))
                .collect(),
        )
    };
    tensor(vec![n], data)
}

/// `tile`: `out[p] = x[p mod shape]`, with `x` and `repeats` aligned right.
pub(crate) fn tile(x: &Tensor, repeats: &[i64]) -> KResult<Tensor> {
    let n = x.rank().max(repeats.len());
    let mut xs = vec![1usize; n - x.rank()];
    xs.extend_from_slice(x.shape());
    let mut reps = vec![1usize; n - repeats.len()];
    for &r in repeats {
        reps.push(usize::try_from(r).map_err(|_| format!("repeats must not be negative: {r}"))?);
    }
    let mut shape = Vec::with_capacity(n);
    for (&d, &r) in xs.iter().zip(&reps) {
        shape.push(
            d.checked_mul(r)
                .ok_or_else(|| format!("tiling {:?} by {repeats:?} overflows", x.shape()))?,
        );
    }
    let total = out_numel(&shape)?;
    let st = strides(&xs);
    let mut src = Vec::with_capacity(total);
    for_each_index(&shape, |p| {
        src.push(Some(
            p.iter()
                .zip(&xs)
                .zip(&st)
                .map(|((&c, &d), &s)| (c % d) * s)
                .sum(),
        ));
        Ok(())
    })?;
    gather_fill(x, shape, &src, 0.0)
}

/// `tril` (`upper == false`: keep `col - row <= k`) or `triu` (keep `col - row >= k`) over the
/// last two axes; the rest becomes 0.
pub(crate) fn trilu(x: &Tensor, k: i64, upper: bool) -> KResult<Tensor> {
    let r = x.rank();
    if r < 2 {
        return Err(format!(
            "expected a tensor of rank at least 2, found {:?}",
            x.shape()
        ));
    }
    let (rows, cols) = (x.shape()[r - 2], x.shape()[r - 1]);
    let mut src = Vec::with_capacity(x.numel());
    for i in 0..x.numel() {
        let c = (i % cols) as i64;
        let row = ((i / cols) % rows.max(1)) as i64;
        let d = c - row;
        let keep = if upper { d >= k } else { d <= k };
        src.push(keep.then_some(i));
    }
    gather_fill(x, x.shape().to_vec(), &src, 0.0)
}

/// `reverse_sequence(x, lengths)`: for each index `b` of `batch_axis`, the first
/// `lengths[b]` elements along `seq_axis` in reverse order, the rest as they are. A length
/// below 0 or past the axis extent is an error (ONNX requires `1 ≤ length ≤ extent`; 0 leaves
/// the slice unchanged).
pub(crate) fn reverse_sequence(
    x: &Tensor,
    lengths: &Tensor,
    seq_axis: i64,
    batch_axis: i64,
) -> KResult<Tensor> {
    let r = x.rank();
    let s = norm_axis(seq_axis, r)?;
    let b = norm_axis(batch_axis, r)?;
    if s == b {
        return Err(format!("seq_axis and batch_axis are both axis {s}"));
    }
    let lens = index_values(lengths, "seq_lengths")?;
    let shape = x.shape();
    let (n_seq, n_batch) = (shape[s], shape[b]);
    if lengths.rank() != 1 || lens.len() != n_batch {
        return Err(format!(
            "expected {n_batch} sequence lengths (one per index of axis {b}), found shape {:?}",
            lengths.shape()
        ));
    }
    if let Some(l) = lens.iter().find(|&&l| l < 0 || l as usize > n_seq) {
        return Err(format!(
            "sequence length {l} is outside 0..={n_seq} (the extent of axis {s})"
        ));
    }
    let st = strides(shape);
    let mut src = Vec::with_capacity(x.numel());
    for i in 0..x.numel() {
        let (j, bi) = ((i / st[s]) % n_seq, (i / st[b]) % n_batch);
        let len = lens[bi] as usize;
        src.push(Some(if j < len {
            i - j * st[s] + (len - 1 - j) * st[s]
        } else {
            i
        }));
    }
    gather_fill(x, shape.to_vec(), &src, 0.0)
}

/// `cumsum` / `cumprod` along `axis` (`None`: of the flattened tensor), in `dtype` when given.
pub(crate) fn scan(x: &Tensor, a: &ScanAttrs, product: bool) -> KResult<Tensor> {
    let dtype = a.dtype.unwrap_or(x.dtype());
    let x = x.cast(dtype);
    let (shape, ax) = match a.axis {
        None => (vec![x.numel()], 0),
        Some(ax) => (x.shape().to_vec(), norm_axis(ax, x.rank())?),
    };
    let n = shape[ax];
    let inner: usize = shape[ax + 1..].iter().product();
    let outer: usize = shape[..ax].iter().product();
    let out = match Num::of(&x) {
        Num::F(v) => {
            let mut out = vec![0.0; v.len()];
            for o in 0..outer {
                for i in 0..inner {
                    let mut acc = if product { 1.0 } else { 0.0 };
                    for j in 0..n {
                        let p = (o * n + j) * inner + i;
                        if a.exclusive {
                            out[p] = acc;
                        }
                        acc = if product { acc * v[p] } else { acc + v[p] };
                        if !a.exclusive {
                            out[p] = acc;
                        }
                    }
                }
            }
            Num::F(out)
        }
        Num::I(v) => {
            let mut out = vec![0i64; v.len()];
            for o in 0..outer {
                for i in 0..inner {
                    let mut acc: i64 = i64::from(product);
                    for j in 0..n {
                        let p = (o * n + j) * inner + i;
                        if a.exclusive {
                            out[p] = acc;
                        }
                        acc = if product {
                            acc.wrapping_mul(v[p])
                        } else {
                            acc.wrapping_add(v[p])
                        };
                        if !a.exclusive {
                            out[p] = acc;
                        }
                    }
                }
            }
            Num::I(out)
        }
    };
    out.into_tensor(shape, dtype)
}

/// The source coordinate of output coordinate `o` on an axis of extent `n` padded by
/// `before`, or `None` for the constant fill.
fn pad_source(o: i64, before: i64, n: i64, mode: PadMode) -> KResult<Option<usize>> {
    let i = o.saturating_sub(before);
    if (0..n).contains(&i) {
        return Ok(Some(i as usize));
    }
    let j = match mode {
        PadMode::Constant => return Ok(None),
        _ if n == 0 => return Err("cannot pad an empty axis except with a constant".into()),
        PadMode::Replicate => i.clamp(0, n - 1),
        PadMode::Circular => i.rem_euclid(n),
        PadMode::Reflect => {
            if n == 1 {
                0
            } else {
                let period = 2 * (n - 1);
                let m = i.rem_euclid(period);
                if m < n { m } else { period - m }
            }
        }
    };
    Ok(Some(j as usize))
}

/// `nn.pad` (negative widths crop).
pub(crate) fn pad(x: &Tensor, a: &PadAttrs) -> KResult<Tensor> {
    let r = x.rank();
    if a.pad_width.len() != 2 * r {
        return Err(format!(
            "expected pad_width to have {} values for a tensor of rank {r}, found {}",
            2 * r,
            a.pad_width.len()
        ));
    }
    let mut shape = Vec::with_capacity(r);
    for (d, &n) in x.shape().iter().enumerate() {
        let (b, e) = (a.pad_width[2 * d], a.pad_width[2 * d + 1]);
        let o = i64::try_from(n)
            .ok()
            .and_then(|n| n.checked_add(b)?.checked_add(e))
            .and_then(|o| usize::try_from(o).ok())
            .ok_or_else(|| {
                format!(
                    "padding axis {d} of {:?} by ({b}, {e}) gives an invalid extent",
                    x.shape()
                )
            })?;
        shape.push(o);
    }
    let total = out_numel(&shape)?;
    if a.pad_mode == PadMode::Constant && a.pad_width.iter().all(|&w| w >= 0) {
        return pad_constant(x, shape, total, &a.pad_width, a.pad_value.0);
    }
    let st = strides(x.shape());
    let dims: Vec<i64> = x.shape().iter().map(|&n| n as i64).collect();
    let mut src = Vec::with_capacity(total);
    for_each_index(&shape, |p| {
        let mut off = Some(0usize);
        for (d, &c) in p.iter().enumerate() {
            let s = pad_source(c as i64, a.pad_width[2 * d], dims[d], a.pad_mode)?;
            off = match (off, s) {
                (Some(o), Some(s)) => Some(o + s * st[d]),
                _ => None,
            };
        }
        src.push(off);
        Ok(())
    })?;
    gather_fill(x, shape, &src, a.pad_value.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_elements_reads_what_the_definition_names() {
        // out[p] = x[p with p[axis] = idx[p]], written out per position: every axis, indices
        // spanning the data (the one-pass path) and a smaller box (the general one), negative
        // indices from the end, i64 and i32 indices, floats and integers.
        let xs = [3usize, 4, 5];
        let n: usize = xs.iter().product();
        let data: Vec<i64> = (0..n as i64).map(|v| v * 5 - 11).collect();
        let x = Tensor::new(xs.to_vec(), Storage::I64(data.clone())).unwrap();
        let xf = Tensor::new(
            xs.to_vec(),
            Storage::F32(data.iter().map(|&v| v as f32).collect()),
        )
        .unwrap();
        for axis in 0..3usize {
            for is in [
                {
                    let mut s = xs.to_vec();
                    s[axis] = 6;
                    s
                },
                vec![2, 3, 2],
            ] {
                let m: usize = is.iter().product();
                let ext = xs[axis] as i64;
                let iv: Vec<i64> = (0..m as i64).map(|k| (k * 7) % (2 * ext) - ext).collect();
                let mut want = Vec::new();
                let mut k = 0;
                for_each_index(&is, |p| {
                    let j = if iv[k] < 0 { iv[k] + ext } else { iv[k] } as usize;
                    k += 1;
                    let mut q = p.to_vec();
                    q[axis] = j;
                    want.push(data[(q[0] * xs[1] + q[1]) * xs[2] + q[2]]);
                    Ok(())
                })
                .unwrap();
                for idx in [
                    Tensor::new(is.clone(), Storage::I64(iv.clone())).unwrap(),
                    Tensor::new(
                        is.clone(),
                        Storage::I32(iv.iter().map(|&v| v as i32).collect()),
                    )
                    .unwrap(),
                ] {
                    let got = gather_elements(&x, &idx, axis as i64).unwrap();
                    assert_eq!(got.shape(), &is[..]);
                    assert_eq!(got.to_i64_vec(), want, "axis {axis}, indices {is:?}");
                    let gf = gather_elements(&xf, &idx, axis as i64 - 3).unwrap();
                    let wf: Vec<f32> = want.iter().map(|&v| v as f32).collect();
                    assert_eq!(gf.as_f32().unwrap(), &wf[..]);
                }
                // One index out of range either way: an error naming it, on both paths.
                for bad in [ext, -ext - 1] {
                    let mut v = iv.clone();
                    v[m / 2] = bad;
                    let idx = Tensor::new(is.clone(), Storage::I64(v)).unwrap();
                    let e = gather_elements(&x, &idx, axis as i64).unwrap_err();
                    assert!(e.contains(&format!("index {bad} is out of range")), "{e}");
                }
            }
        }
    }

    #[test]
    fn constant_pad_places_every_element_as_the_definition_does() {
        // Ranks 0–5, some extents 0 or 1, widths 0–3 on each side; integers and floats.
        let cases: &[(&[usize], &[i64])] = &[
            (&[], &[]),
            (&[3], &[2, 1]),
            (&[0, 4], &[1, 1, 2, 0]),
            (&[2, 3], &[0, 0, 0, 0]),
            (&[2, 1, 3], &[1, 0, 0, 2, 3, 1]),
            (&[2, 3, 1, 2, 4], &[0, 1, 2, 0, 0, 0, 1, 1, 3, 2]),
        ];
        for &(xs, widths) in cases {
            let n: usize = xs.iter().product();
            let data: Vec<i64> = (0..n as i64).map(|v| v * 7 - 3).collect();
            let x = Tensor::new(xs.to_vec(), Storage::I64(data.clone())).unwrap();
            let xf = Tensor::new(
                xs.to_vec(),
                Storage::F32(data.iter().map(|&v| v as f32).collect()),
            )
            .unwrap();
            let a = PadAttrs {
                pad_width: widths.to_vec(),
                pad_value: fusebox_core::op::F64(-9.0),
                pad_mode: PadMode::Constant,
            };
            let y = pad(&x, &a).unwrap();
            let yf = pad(&xf, &a).unwrap();
            let shape: Vec<usize> = xs
                .iter()
                .enumerate()
                .map(|(d, &e)| e + (widths[2 * d] + widths[2 * d + 1]) as usize)
                .collect();
            assert_eq!(y.shape(), &shape[..]);
            // The definition: out[p] = x[p - before] where that lies inside x, else the value.
            let mut want = Vec::new();
            for_each_index(&shape, |p| {
                let mut off = 0usize;
                let mut inside = true;
                for (d, &c) in p.iter().enumerate() {
                    let i = c as i64 - widths[2 * d];
                    inside &= (0..xs[d] as i64).contains(&i);
                    off = off * xs[d] + i.max(0) as usize;
                }
                want.push(if inside { data[off] } else { -9 });
                Ok(())
            })
            .unwrap();
            if shape.is_empty() {
                want = data.clone();
            }
            assert_eq!(y.to_i64_vec(), want, "{xs:?} {widths:?}");
            let wf: Vec<f64> = want.iter().map(|&v| v as f64).collect();
            assert_eq!(yf.to_f64_vec(), wf, "{xs:?} {widths:?}");
        }
    }

    #[test]
    fn reverse_sequence_reverses_each_prefix_and_checks_lengths() {
        // ONNX's time-major example: x[t][b] = 4t + b over (4, 4), lengths [4, 3, 2, 1] by batch.
        let x = Tensor::new(
            vec![4, 4],
            Storage::F32((0..16).map(|v| v as f32).collect()),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let l =
            Tensor::new(vec![4], Storage::I64(vec![4, 3, 2, 1])).unwrap_or_else(|e| panic!("{e}"));
        let y = reverse_sequence(&x, &l, 0, 1).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            y.to_f64_vec(),
            vec![
                12.0, 9.0, 6.0, 3.0, 8.0, 5.0, 2.0, 7.0, 4.0, 1.0, 10.0, 11.0, 0.0, 13.0, 14.0,
                15.0
            ]
        );
        // Integers move exactly; a length past the extent or of the wrong count is an error.
        let xi = Tensor::new(vec![2, 3], Storage::I64(vec![i64::MAX, 1, 2, 3, 4, 5]))
            .unwrap_or_else(|e| panic!("{e}"));
        let li = Tensor::new(vec![2], Storage::I32(vec![3, 0])).unwrap_or_else(|e| panic!("{e}"));
        let y = reverse_sequence(&xi, &li, 1, 0).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(y.storage(), StorageRef::I64(v) if v == [2, 1, i64::MAX, 3, 4, 5]));
        let bad = Tensor::new(vec![2], Storage::I64(vec![4, 1])).unwrap_or_else(|e| panic!("{e}"));
        assert!(reverse_sequence(&xi, &bad, 1, 0).is_err_and(|e| e.contains("outside 0..=3")));
        let short = Tensor::new(vec![1], Storage::I64(vec![1])).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            reverse_sequence(&xi, &short, 1, 0).is_err_and(|e| e.contains("2 sequence lengths"))
        );
        assert!(reverse_sequence(&xi, &li, 1, 1).is_err_and(|e| e.contains("both axis 1")));
    }
}
