//! Type inference of the indexing, shape and layout ops of issue 17 (gathers, scatters,
//! `one_hot`, `arange`, `tile`, `tril`/`triu`, `cumsum`/`cumprod`, `nn.pad`) and
//! `reverse_sequence`.
//!
//! Contract: as the rest of [`super`]: symbolic dims flow through, unknown shapes give a less
//! specific type, and errors (never panics) name the op and say what was expected.
//!
//! ```text
//! R.gather_nd(x: (2, 3, 4), idx: (5, 2) int64)          -> (5, 4)
//! R.tile(x: (n, 3), repeats=[2, 2])                      -> (n * 2, 6)
//! R.nn.pad(x: (1, 3, 10, 10), pad_width=[0,0,0,0,2,2,1,1]) -> (1, 3, 14, 12)
//! R.arange(start=0, end=10, step=3, dtype="int64")      -> (4,)
//! ```

use super::{Cx, differ, known, product, shape_str, unknown};
use crate::ir::{DType, Dim, TensorType, Type};
use crate::op::{ArangeAttrs, Op, PadAttrs, ScanAttrs, ScatterReduction};

fn int_indices(cx: &Cx<'_>, t: &TensorType, what: &str) -> Result<(), String> {
    match t.dtype {
        Some(d) if !d.is_int() => Err(cx.err(format!(
            "expected {what} to have an integer dtype, found {d}"
        ))),
        _ => Ok(()),
    }
}

fn same_dtype(cx: &Cx<'_>, a: &TensorType, b: &TensorType, what: &str) -> Result<(), String> {
    match (a.dtype, b.dtype) {
        (Some(x), Some(y)) if x != y => Err(cx.err(format!(
            "expected {what} to have the data's dtype {x}, found {y}"
        ))),
        _ => Ok(()),
    }
}

fn same_rank(cx: &Cx<'_>, a: &TensorType, b: &TensorType, what: &str) -> Result<(), String> {
    match (a.rank(), b.rank()) {
        (Some(x), Some(y)) if x != y => Err(cx.err(format!(
            "expected {what} to have the data's rank {x}, found rank {y}"
        ))),
        _ => Ok(()),
    }
}

/// Infers the type of an op of this family.
pub(super) fn infer(cx: &Cx<'_>, op: &Op) -> Result<Type, String> {
    match op {
        Op::GatherElements { axis } => gather_elements(cx, *axis),
        Op::GatherNd { batch_dims } => gather_nd(cx, *batch_dims),
        Op::ScatterElements { axis, .. } => scatter_elements(cx, *axis),
        Op::ScatterNd {
            reduction: ScatterReduction::Mean,
        } => Err(cx.err("reduction \"mean\" is only defined for scatter_elements")),
        Op::ScatterNd { .. } => scatter_nd(cx),
        Op::OneHot { depth, axis } => one_hot(cx, *depth, *axis),
        Op::Arange(a) => arange(cx, a),
        Op::Tile { repeats } => tile(cx, repeats),
        Op::Tril { .. } | Op::Triu { .. } => {
            cx.tensor(0, "the input").and_then(|x| match x.rank() {
                Some(r) if r < 2 => Err(cx.err(format!(
                    "expected a tensor of rank at least 2, found rank {r}"
                ))),
                _ => Ok(Type::Tensor(x.clone())),
            })
        }
        Op::ReverseSequence {
            seq_axis,
            batch_axis,
        } => reverse_sequence(cx, *seq_axis, *batch_axis),
        Op::Cumsum(a) | Op::Cumprod(a) => scan(cx, a),
        Op::Pad(a) => pad(cx, a),
        _ => Err(cx.err("internal: not an index op")),
    }
}

fn gather_elements(cx: &Cx<'_>, axis: i64) -> Result<Type, String> {
    let (x, idx) = (cx.tensor(0, "data")?, cx.tensor(1, "indices")?);
    int_indices(cx, idx, "indices")?;
    same_rank(cx, x, idx, "indices")?;
    if let Some(r) = x.rank().or(idx.rank()) {
        cx.axis(axis, r)?;
    }
    Ok(match &idx.dims {
        Some(d) => known(d.clone(), x.dtype),
        None => unknown(idx.rank().or(x.rank()), x.dtype),
    })
}

fn gather_nd(cx: &Cx<'_>, batch_dims: i64) -> Result<Type, String> {
    let (x, idx) = (cx.tensor(0, "data")?, cx.tensor(1, "indices")?);
    int_indices(cx, idx, "indices")?;
    let b = usize::try_from(batch_dims).map_err(|_| cx.err("batch_dims must not be negative"))?;
    let (Some(xd), Some(id)) = (&x.dims, &idx.dims) else {
        return Ok(unknown(None, x.dtype));
    };
    let (r, q) = (xd.len(), id.len());
    if q < 1 || b >= q.min(r) {
        return Err(cx.err(format!(
            "expected batch_dims ({b}) to be less than the ranks of data ({r}) and indices ({q})"
        )));
    }
    for i in 0..b {
        if differ(&xd[i], &id[i]) {
            return Err(cx.err(format!(
                "expected the {b} batch dims of data {} and indices {} to match",
                shape_str(xd),
                shape_str(id)
            )));
        }
    }
    let Some(m) = id[q - 1].as_static() else {
        return Ok(unknown(None, x.dtype));
    };
    let m = usize::try_from(m)
        .ok()
        .filter(|&m| m >= 1 && b + m <= r)
        .ok_or_else(|| {
            cx.err(format!(
                "the last dim of indices {} must be between 1 and the data's rank minus batch_dims ({})",
                shape_str(id),
                r - b
            ))
        })?;
    let mut out: Vec<Dim> = id[..q - 1].to_vec();
    out.extend(xd[b + m..].iter().cloned());
    Ok(known(out, x.dtype))
}

fn scatter_elements(cx: &Cx<'_>, axis: i64) -> Result<Type, String> {
    let x = cx.tensor(0, "data")?;
    let idx = cx.tensor(1, "indices")?;
    let upd = cx.tensor(2, "updates")?;
    int_indices(cx, idx, "indices")?;
    same_dtype(cx, x, upd, "updates")?;
    same_rank(cx, x, idx, "indices")?;
    same_rank(cx, x, upd, "updates")?;
    if let (Some(i), Some(u)) = (&idx.dims, &upd.dims)
        && i.iter().zip(u.iter()).any(|(a, b)| differ(a, b))
    {
        return Err(cx.err(format!(
            "expected updates to have the shape of indices {}, found {}",
            shape_str(i),
            shape_str(u)
        )));
    }
    if let Some(r) = x.rank() {
        cx.axis(axis, r)?;
    }
    Ok(Type::Tensor(x.clone()))
}

fn scatter_nd(cx: &Cx<'_>) -> Result<Type, String> {
    let x = cx.tensor(0, "data")?;
    let idx = cx.tensor(1, "indices")?;
    let upd = cx.tensor(2, "updates")?;
    int_indices(cx, idx, "indices")?;
    same_dtype(cx, x, upd, "updates")?;
    if let (Some(xd), Some(id), Some(ud)) = (&x.dims, &idx.dims, &upd.dims) {
        let Some((last, lead)) = id.split_last() else {
            return Err(cx.err("expected indices of rank at least 1, found a scalar"));
        };
        if let Some(m) = last.as_static() {
            let m = usize::try_from(m)
                .ok()
                .filter(|&m| m <= xd.len())
                .ok_or_else(|| {
                    cx.err(format!(
                        "the last dim of indices {} must be at most the data's rank {}",
                        shape_str(id),
                        xd.len()
                    ))
                })?;
            let mut want: Vec<Dim> = lead.to_vec();
            want.extend(xd[m..].iter().cloned());
            if want.len() != ud.len() || want.iter().zip(ud.iter()).any(|(a, b)| differ(a, b)) {
                return Err(cx.err(format!(
                    "expected updates of shape {} (indices' leading dims, then the data's dims after {m}), found {}",
                    shape_str(&want),
                    shape_str(ud)
                )));
            }
        }
    }
    Ok(Type::Tensor(x.clone()))
}

fn one_hot(cx: &Cx<'_>, depth: i64, axis: i64) -> Result<Type, String> {
    let idx = cx.tensor(0, "indices")?;
    int_indices(cx, idx, "indices")?;
    let mut dtypes = Vec::new();
    for (i, what) in [(1, "on_value"), (2, "off_value")] {
        match cx.arg(i)? {
            // A prim value's dtype is not kept at run time: integers run as int64, floats as
            // float32 (a rank-0 tensor carries any dtype).
            Type::Prim(d) if d.is_int() || *d == DType::Bool => dtypes.push(Some(DType::I64)),
            Type::Prim(DType::F32) => dtypes.push(Some(DType::F32)),
            Type::Prim(d) => {
                return Err(cx.err(format!(
                    "{what}: a {d} prim value is not supported (use an int64 or float32 prim \
                     value, or a rank-0 tensor of the wanted dtype)"
                )));
            }
            Type::Tensor(t) if t.rank().is_none_or(|r| r == 0) => dtypes.push(t.dtype),
            t => {
                return Err(cx.err(format!(
                    "expected {what} to be a prim value (R.prim_value(...)) or a rank-0 tensor, found {}",
                    crate::ir::infer::brief(t)
                )));
            }
        }
    }
    if let [Some(a), Some(b)] = dtypes[..]
        && a != b
    {
        return Err(cx.err(format!(
            "expected on_value and off_value of one dtype, found {a} and {b}"
        )));
    }
    let dtype: Option<DType> = dtypes.iter().flatten().next().copied();
    let Some(r) = idx.rank() else {
        return Ok(unknown(None, dtype));
    };
    let ax = cx.axis(axis, r + 1)?;
    let Some(id) = &idx.dims else {
        return Ok(unknown(Some(r + 1), dtype));
    };
    let mut out = id.to_vec();
    out.insert(ax.min(out.len()), Dim::Static(depth));
    Ok(known(out, dtype))
}

fn arange(cx: &Cx<'_>, a: &ArangeAttrs) -> Result<Type, String> {
    let n = a.numel().map_err(|e| cx.err(e))?;
    Ok(known(vec![Dim::Static(n)], Some(a.dtype)))
}

fn tile(cx: &Cx<'_>, repeats: &[i64]) -> Result<Type, String> {
    let x = cx.tensor(0, "the input")?;
    if let Some(r) = repeats.iter().find(|&&r| r < 0) {
        return Err(cx.err(format!("repeats must not be negative, found {r}")));
    }
    let Some(xd) = &x.dims else {
        return Ok(unknown(x.rank().map(|r| r.max(repeats.len())), x.dtype));
    };
    let n = xd.len().max(repeats.len());
    let out: Vec<Dim> = (0..n)
        .map(|i| {
            let d = (i + xd.len())
                .checked_sub(n)
                .and_then(|j| xd.get(j).cloned())
                .unwrap_or(Dim::Static(1));
            let rep = (i + repeats.len())
                .checked_sub(n)
                .and_then(|j| repeats.get(j).copied())
                .unwrap_or(1);
            d.mul(&Dim::Static(rep))
        })
        .collect();
    Ok(known(out, x.dtype))
}

fn scan(cx: &Cx<'_>, a: &ScanAttrs) -> Result<Type, String> {
    let x = cx.tensor(0, "the input")?;
    let dtype = a.dtype.or(x.dtype);
    match a.axis {
        None => Ok(match &x.dims {
            Some(d) => known(vec![product(d)], dtype),
            None => unknown(Some(1), dtype),
        }),
        Some(ax) => {
            if let Some(r) = x.rank() {
                cx.axis(ax, r)?;
            }
            Ok(Type::Tensor(TensorType { dtype, ..x.clone() }))
        }
    }
}

fn pad(cx: &Cx<'_>, a: &PadAttrs) -> Result<Type, String> {
    let x = cx.tensor(0, "data")?;
    let Some(r) = x.rank() else {
        return Ok(unknown(None, x.dtype));
    };
    if a.pad_width.len() != 2 * r {
        return Err(cx.err(format!(
            "expected pad_width to have {} values (before and after for each of {r} axes), found {}",
            2 * r,
            a.pad_width.len()
        )));
    }
    let Some(xd) = &x.dims else {
        return Ok(unknown(Some(r), x.dtype));
    };
    let mut out = Vec::with_capacity(r);
    for (i, d) in xd.iter().enumerate() {
        let (b, e) = (a.pad_width[2 * i], a.pad_width[2 * i + 1]);
        let o = d.add(&Dim::Static(b.saturating_add(e)));
        if let Some(v) = o.as_static()
            && v < 0
        {
            return Err(cx.err(format!(
                "pad_width crops axis {i} of {} below zero ({b} before, {e} after)",
                shape_str(xd)
            )));
        }
        out.push(o);
    }
    Ok(known(out, x.dtype))
}

/// `relax.reverse_sequence(data, seq_lengths)`: the data's type; `seq_lengths` is a rank-1
/// integer tensor with one length per index of `batch_axis`, which differs from `seq_axis`.
fn reverse_sequence(cx: &Cx<'_>, seq_axis: i64, batch_axis: i64) -> Result<Type, String> {
    let x = cx.tensor(0, "data")?;
    let l = cx.tensor(1, "seq_lengths")?;
    int_indices(cx, l, "seq_lengths")?;
    cx.rank(l, 1, "seq_lengths")?;
    let Some(r) = x.rank() else {
        return Ok(Type::Tensor(x.clone()));
    };
    if r < 2 {
        return Err(cx.err(format!("expected data of rank at least 2, found rank {r}")));
    }
    let s = cx.axis(seq_axis, r)?;
    let b = cx.axis(batch_axis, r)?;
    if s == b {
        return Err(cx.err(format!(
            "seq_axis ({seq_axis}) and batch_axis ({batch_axis}) name the same axis"
        )));
    }
    if let (Some(xd), Some(ld)) = (&x.dims, &l.dims)
        && let (Some(n), Some(m)) = (xd.get(b), ld.first())
        && differ(n, m)
    {
        return Err(cx.err(format!(
            "expected one sequence length per batch index ({n}), found {m}"
        )));
    }
    Ok(Type::Tensor(x.clone()))
}
