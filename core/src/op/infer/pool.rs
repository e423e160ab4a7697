//! Type inference of `relax.stack` and the 1-D / 3-D pools (see [`super::super::pool`]).
//!
//! ```text
//! x, y: (n, 4)                 R.stack((x, y), axis=1)                    -> (n, 2, 4)
//! x: (1, 4, 8)                 R.nn.max_pool1d(x, pool_size=[2], strides=[2]) -> (1, 4, 4)
//! v: (1, 4, 8, 8, 8)           R.nn.adaptive_avg_pool3d(v, output_size=[2])   -> (1, 4, 2, 2, 2)
//! ```

use super::super::pool::{AdaptivePoolAttrs, PoolAttrs, canonical_layout, layout_perm};
use super::{Cx, differ, known, shape_str, tensor_tuple, unknown, window_out};
use crate::ir::infer::brief;
use crate::ir::{Dim, Type};

/// `relax.stack((x0, x1, …), axis)`: tensors of one shape, joined along a new axis.
pub(super) fn stack(cx: &Cx<'_>, axis: i64) -> Result<Type, String> {
    let (ts, dtype) = tensor_tuple(cx)?;
    let rank = ts.iter().find_map(|t| t.rank());
    if let Some(r) = rank
        && let Some(t) = ts.iter().find(|t| t.rank().is_some_and(|q| q != r))
    {
        return Err(cx.err(format!(
            "expected every tensor to have rank {r}, found {}",
            brief(&Type::Tensor((*t).clone()))
        )));
    }
    let Some(r) = rank else {
        return Ok(unknown(None, dtype));
    };
    let ax = cx.axis(axis, r + 1)?;
    let all: Option<Vec<&[Dim]>> = ts.iter().map(|t| t.dims.as_deref()).collect();
    let Some(all) = all else {
        return Ok(unknown(Some(r + 1), dtype));
    };
    let base = all[0];
    for d in &all[1..] {
        if base.iter().zip(d.iter()).any(|(a, b)| differ(a, b)) {
            return Err(cx.err(format!(
                "expected every tensor to have the same shape, found {} and {}",
                shape_str(base),
                shape_str(d)
            )));
        }
    }
    let n = i64::try_from(ts.len()).map_err(|_| cx.err("too many tensors"))?;
    let mut out = base.to_vec();
    out.insert(ax, Dim::Static(n));
    Ok(known(out, dtype))
}

/// The data and output layouts' letter positions, checked against the rank.
fn layouts(
    cx: &Cx<'_>,
    k: usize,
    layout: &str,
    out_layout: &str,
) -> Result<(Vec<usize>, Vec<usize>), String> {
    let letters = canonical_layout(k);
    let lp = layout_perm(layout, letters)
        .ok_or_else(|| cx.err(format!("invalid layout \"{layout}\"")))?;
    let op = layout_perm(out_layout, letters)
        .ok_or_else(|| cx.err(format!("invalid out_layout \"{out_layout}\"")))?;
    Ok((lp, op))
}

/// Places dims given in canonical order into a layout whose letter positions are `pos`.
fn place(pos: &[usize], canon: Vec<Dim>) -> Vec<Dim> {
    let mut out = vec![Dim::Static(0); canon.len()];
    for (&p, d) in pos.iter().zip(canon) {
        if let Some(slot) = out.get_mut(p) {
            *slot = d;
        }
    }
    out
}

/// A `k`-D max or average pool.
pub(super) fn pool(cx: &Cx<'_>, a: &PoolAttrs) -> Result<Type, String> {
    let k = a.pool_size.len();
    let x = cx.tensor(0, "data")?;
    cx.rank(x, k + 2, "data")?;
    let (lp, op) = layouts(cx, k, &a.layout, &a.out_layout)?;
    let Some(xd) = &x.dims else {
        return Ok(unknown(Some(k + 2), x.dtype));
    };
    let at = |p: usize| xd.get(p).cloned().unwrap_or(Dim::Static(0));
    let mut canon = vec![at(lp[0]), at(lp[1])];
    for i in 0..k {
        let o = window_out(
            &at(lp[i + 2]),
            &Dim::Static(a.pool_size[i]),
            a.strides[i],
            (a.padding[i], a.padding[i + k]),
            a.dilation[i],
            a.ceil_mode,
        )
        .map_err(|e| cx.err(e))?;
        if let Some(v) = o.as_static()
            && v <= 0
        {
            return Err(cx.err(format!(
                "the pooling window does not fit: output extent {v} for input {}",
                shape_str(xd)
            )));
        }
        canon.push(o);
    }
    Ok(known(place(&op, canon), x.dtype))
}

/// A `k`-D adaptive average pool.
pub(super) fn adaptive(cx: &Cx<'_>, a: &AdaptivePoolAttrs, k: usize) -> Result<Type, String> {
    let x = cx.tensor(0, "data")?;
    cx.rank(x, k + 2, "data")?;
    let (lp, op) = layouts(cx, k, &a.layout, &a.out_layout)?;
    let Some(xd) = &x.dims else {
        return Ok(unknown(Some(k + 2), x.dtype));
    };
    let at = |p: usize| xd.get(p).cloned().unwrap_or(Dim::Static(0));
    let mut canon = vec![at(lp[0]), at(lp[1])];
    for i in 0..k {
        canon.push(match &a.output_size {
            Some(s) => Dim::Static(s[i]),
            None => at(lp[i + 2]),
        });
    }
    Ok(known(place(&op, canon), x.dtype))
}
