//! Views: the layout ops and element gathers of an elementwise group, read in place.
//!
//! FuseOps puts injective ops in the groups of the elementwise ops they feed: DeBERTa's
//! relative-position terms are a `broadcast_to` of the positions, a `gather_elements` from
//! the `[B·H, S, 2k]` content-to-position scores, a `permute_dims` of the second gather, then
//! divides and adds. None of these moves a value: each output element is an element of an
//! input. So an elementwise program ([`crate::elem_program`]) reads such an op, applied to
//! its parameters or constants, as a *view* of them, not as a tensor it makes: a strided
//! walk over the input for the layout ops, and for a gather an offset read from the indices.
//!
//! Contract:
//!
//! - Covered: `permute_dims`, `broadcast_to`, `reshape`, `expand_dims`, `squeeze`,
//!   `layout_transform` (an `SE` block's `(1, C, 1, 1)` scale moved into `NCHW16c`) and
//!   `gather_elements`, applied (in any chain) to parameters and constants, the shape
//!   arguments a parameter or a literal of known dims (one `-1` allowed in a reshape);
//!   `gather_elements` once per chain, its indices a chain of layout ops over an `int64` or
//!   `int32` input. A view of a computed value (an earlier instruction's result, the head's
//!   output) is not covered: [`crate::elem_program::compile`] declines the function.
//! - [`resolve`] maps a chain to strides over the input at run time, or returns `None` (the
//!   executor then runs the bindings one by one, which report what is wrong): a `reshape`
//!   that strides cannot express (a transposed tensor merged across its transposed dims),
//!   shapes that do not match, or an index out of range (any, not only one that is read).
//! - A view gives each element the value the ops give it one by one, so a program reading
//!   views computes the same bits as the bindings in turn.
//!
//! Before, a group of `elem_program` with the views as ops of their own:
//!
//! ```text
//! lv  = R.broadcast_to(pos, shape)                   # [12, 128, 128] int64
//! lv1 = R.gather_elements(c2p, lv, axis=-1)          # from [12, 128, 512]
//! lv2 = R.gather_elements(p2c, lv, axis=-1)
//! lv3 = R.permute_dims(lv2, axes=[0, 2, 1])
//! lv4 = R.divide(lv1, s)
//! gv  = R.add(lv4, lv3)
//! ```
//!
//! after: two instructions over three inputs, `in0` and `in2` views (strides per output
//! dim, and the indices' offsets), no `[12, 128, 128]` tensor made but the result:
//!
//! ```text
//! in0 = c2p[h, i, pos[0, i, j]]      # (12·128·128 reads)
//! in2 = p2c[h, j, pos[0, j, i]]      # the permutation: i and j swap
//! r0  = divide(in0, in1)
//! out = add(r0, in2)
//! ```

use fusebox_core::ir::{Dim, ExprId, ExprKind, Function};
use fusebox_core::op::{IndexMap, Op};
use fusebox_core::runtime::{StorageRef, Tensor};

/// A shape argument of a layout op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ShapeArg {
    /// A literal of known dims (`-1`: inferred by `reshape`).
    Lit(Vec<i64>),
    /// A shape-valued input (the program's leaf at this index).
    Leaf(usize),
}

/// One op of a view chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// `permute_dims(x, axes)` (`None`: reversed).
    Permute(Option<Vec<i64>>),
    /// `broadcast_to(x, shape)`.
    BroadcastTo(ShapeArg),
    /// `reshape(x, shape)`.
    Reshape(ShapeArg),
    /// `expand_dims(x, axis)`.
    ExpandDims(Vec<i64>),
    /// `squeeze(x, axis)` (`None`: every extent-1 axis).
    Squeeze(Option<Vec<i64>>),
    /// `layout_transform(x, index_map)`: a reshape that splits axes, a permutation, and a
    /// reshape that fuses them ([`fusebox_core::op::IndexMap::as_permute`]).
    Layout(Box<IndexMap>),
    /// `gather_elements(x, indices, axis)`, the indices a view without a gather.
    Gather { index: Box<Feed>, axis: i64 },
}

/// How a program input is read: a leaf (parameter or constant) through a chain of view ops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Feed {
    /// The leaf's index among the program's leaves.
    pub base: usize,
    /// The ops, first applied first.
    pub steps: Vec<Step>,
}

impl Feed {
    /// A leaf read as it is.
    pub(crate) fn leaf(base: usize) -> Feed {
        Feed {
            base,
            steps: Vec::new(),
        }
    }

    /// Whether the leaf is read as it is.
    pub(crate) fn is_plain(&self) -> bool {
        self.steps.is_empty()
    }
}

/// What a view op's operand is, seen from the group being compiled.
pub(crate) enum Operand {
    /// A view already made (a leaf is one with no steps).
    Feed(Feed),
    /// Anything else (a computed value): not covered.
    Other,
}

/// The view `op(args)` makes, its operands resolved by `operand` (a shape argument that is
/// not a literal: a leaf, read as it is); `None` when `op` is not a view op or an operand is
/// not a view.
pub(crate) fn step_of(
    f: &Function,
    op: &Op,
    args: &[ExprId],
    operand: &mut dyn FnMut(ExprId) -> Operand,
) -> Option<Feed> {
    let shape = |e: ExprId, operand: &mut dyn FnMut(ExprId) -> Operand| -> Option<ShapeArg> {
        match &f.exprs.get(e)?.kind {
            ExprKind::ShapeLit(dims) => dims
                .iter()
                .map(|d| match d {
                    Dim::Static(v) => Some(*v),
                    _ => None,
                })
                .collect::<Option<Vec<i64>>>()
                .map(ShapeArg::Lit),
            _ => match operand(e) {
                Operand::Feed(feed) if feed.is_plain() => Some(ShapeArg::Leaf(feed.base)),
                _ => None,
            },
        }
    };
    // The data first (so the leaves keep the order of the arguments), then the rest.
    let data = match (op, args) {
        (
            Op::PermuteDims { .. }
            | Op::ExpandDims { .. }
            | Op::Squeeze { .. }
            | Op::LayoutTransform(_),
            [x],
        )
        | (Op::BroadcastTo | Op::Reshape | Op::GatherElements { .. }, [x, _]) => *x,
        _ => return None,
    };
    let Operand::Feed(mut feed) = operand(data) else {
        return None;
    };
    let step = match (op, args) {
        (Op::PermuteDims { axes }, _) => Step::Permute(axes.clone()),
        (Op::BroadcastTo, [_, s]) => Step::BroadcastTo(shape(*s, operand)?),
        (Op::Reshape, [_, s]) => Step::Reshape(shape(*s, operand)?),
        (Op::ExpandDims { axis }, _) => Step::ExpandDims(axis.clone()),
        (Op::Squeeze { axis }, _) => Step::Squeeze(axis.clone()),
        (Op::LayoutTransform(map), _) => Step::Layout(map.clone()),
        (Op::GatherElements { axis }, [_, i]) => {
            let Operand::Feed(index) = operand(*i) else {
                return None;
            };
            // One gather per chain: the data's and the indices' chains have none.
            let gathers = |f: &Feed| f.steps.iter().any(|s| matches!(s, Step::Gather { .. }));
            if gathers(&index) || gathers(&feed) {
                return None;
            }
            Step::Gather {
                index: Box::new(index),
                axis: *axis,
            }
        }
        _ => return None,
    };
    feed.steps.push(step);
    Some(feed)
}

/// A gather's indices, resolved: the offset (index · the gathered axis' stride) each index
/// element reads, with the indices' own strides per view dim. Offsets are `u32` (half the
/// memory traffic of `usize`): data of more elements is declined.
#[derive(Clone, Debug)]
pub(crate) struct Offsets {
    pub offsets: Vec<u32>,
    pub strides: Vec<usize>,
}

/// A view resolved against run-time values: its shape, the input's stride per dim (0 where
/// broadcast, and on a gathered axis), and for a gather the index offsets.
#[derive(Clone, Debug)]
pub(crate) struct Resolved {
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    pub gather: Option<Offsets>,
}

fn contiguous(shape: &[usize]) -> Vec<usize> {
    let mut st = vec![0; shape.len()];
    let mut acc = 1usize;
    for j in (0..shape.len()).rev() {
        st[j] = acc;
        acc = acc.saturating_mul(shape[j]);
    }
    st
}

fn norm_axis(a: i64, rank: usize) -> Option<usize> {
    let r = i64::try_from(rank).ok()?;
    let a = if a < 0 { a + r } else { a };
    (0..r).contains(&a).then_some(a as usize)
}

/// The dims of a shape argument (`-1` kept).
fn shape_dims(s: &ShapeArg, leaves: &[Tensor]) -> Option<Vec<i64>> {
    match s {
        ShapeArg::Lit(v) => Some(v.clone()),
        ShapeArg::Leaf(i) => match leaves.get(*i)?.storage() {
            StorageRef::I64(v) => Some(v.to_vec()),
            _ => None,
        },
    }
}

/// The strides of `shape` read as `new` (same element count) without moving an element, or
/// `None` when strides cannot express it (PyTorch's `computeStride`: each run of `shape`'s
/// dims that are contiguous with each other may be split and merged freely).
pub(crate) fn reshape_strides(
    shape: &[usize],
    strides: &[usize],
    new: &[usize],
) -> Option<Vec<usize>> {
    let n: usize = shape.iter().product();
    if new.iter().product::<usize>() != n {
        return None;
    }
    if n == 0 || shape.is_empty() {
        return Some(contiguous(new));
    }
    let mut out = vec![0usize; new.len()];
    let mut view_d = new.len();
    let mut base = *strides.last()?;
    let (mut tensor_n, mut view_n) = (1usize, 1usize);
    for d in (0..shape.len()).rev() {
        tensor_n *= shape[d];
        let chunk_ends =
            d == 0 || (shape[d - 1] != 1 && strides[d - 1] != tensor_n.checked_mul(base)?);
        if chunk_ends {
            while view_d > 0 && (view_n < tensor_n || new[view_d - 1] == 1) {
                out[view_d - 1] = view_n.checked_mul(base)?;
                view_n *= new[view_d - 1];
                view_d -= 1;
            }
            if view_n != tensor_n {
                return None;
            }
            if d > 0 {
                base = strides[d - 1];
                tensor_n = 1;
                view_n = 1;
            }
        }
    }
    (view_d == 0).then_some(out)
}

/// The dims `reshape` makes of `n` elements from `dims` (one `-1` inferred).
fn reshape_target(dims: &[i64], n: usize) -> Option<Vec<usize>> {
    let mut unknown = None;
    let mut known = 1usize;
    let mut out = Vec::with_capacity(dims.len());
    for (j, &d) in dims.iter().enumerate() {
        if d == -1 && unknown.is_none() {
            unknown = Some(j);
            out.push(0);
        } else {
            let d = usize::try_from(d).ok()?;
            known = known.checked_mul(d)?;
            out.push(d);
        }
    }
    if let Some(j) = unknown {
        if known == 0 || !n.is_multiple_of(known) {
            return None;
        }
        out[j] = n / known;
    }
    (out.iter().product::<usize>() == n).then_some(out)
}

/// One layout op on (shape, stride sets): every stride set moves with the dims.
fn layout(
    step: &Step,
    shape: &mut Vec<usize>,
    sets: &mut [&mut Vec<usize>],
    leaves: &[Tensor],
) -> Option<()> {
    let r = shape.len();
    match step {
        Step::Permute(axes) => {
            let p: Vec<usize> = match axes {
                None => (0..r).rev().collect(),
                Some(a) => a.iter().map(|&a| norm_axis(a, r)).collect::<Option<_>>()?,
            };
            let mut seen = vec![false; r];
            if p.len() != r || p.iter().any(|&a| std::mem::replace(&mut seen[a], true)) {
                return None;
            }
            *shape = p.iter().map(|&a| shape[a]).collect();
            for s in sets.iter_mut() {
                **s = p.iter().map(|&a| s[a]).collect();
            }
        }
        Step::BroadcastTo(arg) => {
            let to: Vec<usize> = shape_dims(arg, leaves)?
                .into_iter()
                .map(|d| usize::try_from(d).ok())
                .collect::<Option<_>>()?;
            let off = to.len().checked_sub(r)?;
            for s in sets.iter_mut() {
                let mut ns = vec![0usize; to.len()];
                for j in 0..r {
                    if shape[j] == to[off + j] {
                        ns[off + j] = s[j];
                    } else if shape[j] != 1 {
                        return None;
                    }
                }
                **s = ns;
            }
            *shape = to;
        }
        Step::Reshape(arg) => {
            let n: usize = shape.iter().product();
            let to = reshape_target(&shape_dims(arg, leaves)?, n)?;
            for s in sets.iter_mut() {
                **s = reshape_strides(shape, s, &to)?;
            }
            *shape = to;
        }
        Step::ExpandDims(axes) => {
            let nr = r + axes.len();
            let mut new_at = vec![false; nr];
            for &a in axes {
                let a = norm_axis(a, nr)?;
                if std::mem::replace(&mut new_at[a], true) {
                    return None;
                }
            }
            let mut ns = Vec::with_capacity(nr);
            let mut nsets: Vec<Vec<usize>> = vec![Vec::with_capacity(nr); sets.len()];
            let mut k = 0;
            for is_new in new_at {
                if is_new {
                    ns.push(1);
                    nsets.iter_mut().for_each(|v| v.push(0));
                } else {
                    ns.push(shape[k]);
                    for (v, s) in nsets.iter_mut().zip(sets.iter()) {
                        v.push(s[k]);
                    }
                    k += 1;
                }
            }
            *shape = ns;
            for (s, v) in sets.iter_mut().zip(nsets) {
                **s = v;
            }
        }
        Step::Squeeze(axes) => {
            let drop: Vec<bool> = match axes {
                None => shape.iter().map(|&e| e == 1).collect(),
                Some(a) => {
                    let mut d = vec![false; r];
                    for &a in a {
                        let a = norm_axis(a, r)?;
                        if shape[a] != 1 {
                            return None;
                        }
                        d[a] = true;
                    }
                    d
                }
            };
            let keep = |v: &[usize]| -> Vec<usize> {
                v.iter()
                    .zip(&drop)
                    .filter(|(_, d)| !**d)
                    .map(|(x, _)| *x)
                    .collect()
            };
            for s in sets.iter_mut() {
                **s = keep(s);
            }
            *shape = keep(shape);
        }
        Step::Layout(map) => {
            // Split, permuted, fused: the last fuse is a reshape strides express only where
            // the fused parts lie contiguous (an `NCHW16c` value of 1 × 1 planes back to
            // `NCHW`); the split and the permutation always are.
            let p = map.as_permute(shape).ok()?;
            for s in sets.iter_mut() {
                let split = reshape_strides(shape, s, &p.split)?;
                let permuted: Vec<usize> = p.perm.iter().map(|&a| split[a]).collect();
                let dims: Vec<usize> = p.perm.iter().map(|&a| p.split[a]).collect();
                **s = reshape_strides(&dims, &permuted, &p.out)?;
            }
            *shape = p.out;
        }
        Step::Gather { .. } => return None,
    }
    Some(())
}

/// `feed` resolved against the program's leaves (see the module doc): `None` when the
/// values do not fit a view.
pub(crate) fn resolve(feed: &Feed, leaves: &[Tensor]) -> Option<Resolved> {
    let t = leaves.get(feed.base)?;
    let mut shape = t.shape().to_vec();
    let mut strides = contiguous(&shape);
    let mut gather: Option<Offsets> = None;
    for step in &feed.steps {
        match step {
            Step::Gather { index, axis } => {
                let idx = resolve(index, leaves)?;
                let it = leaves.get(index.base)?;
                let r = shape.len();
                let ax = norm_axis(*axis, r)?;
                if idx.gather.is_some() || idx.shape.len() != r {
                    return None;
                }
                // The indices' box lies within the data's on every other axis.
                if (0..r).any(|d| d != ax && idx.shape[d] > shape[d]) {
                    return None;
                }
                if t.numel() > u32::MAX as usize {
                    return None;
                }
                let len = i64::try_from(shape[ax]).ok()?;
                let axis_stride = strides[ax];
                // In range, `j · stride` lies within the data, so it fits a `u32`.
                let norm = |j: i64| -> Option<u32> {
                    let j = if j < 0 { j + len } else { j };
                    if !(0..len).contains(&j) {
                        return None;
                    }
                    u32::try_from(j as usize * axis_stride).ok()
                };
                let offsets: Vec<u32> = match it.storage() {
                    StorageRef::I64(v) => v.iter().map(|&j| norm(j)).collect::<Option<_>>()?,
                    StorageRef::I32(v) => v
                        .iter()
                        .map(|&j| norm(i64::from(j)))
                        .collect::<Option<_>>()?,
                    _ => return None,
                };
                strides[ax] = 0;
                shape = idx.shape;
                gather = Some(Offsets {
                    offsets,
                    strides: idx.strides,
                });
            }
            _ => match &mut gather {
                None => layout(step, &mut shape, &mut [&mut strides], leaves)?,
                Some(g) => layout(
                    step,
                    &mut shape,
                    &mut [&mut strides, &mut g.strides],
                    leaves,
                )?,
            },
        }
    }
    Some(Resolved {
        shape,
        strides,
        gather,
    })
}

/// `resolve`'s strides for a view read at the result's shape `out` (the view's shape
/// broadcasts to it, numpy rules): each stride set per output dim, 0 where broadcast;
/// `None` when the view's shape does not broadcast to `out`.
pub(crate) fn strides_at(shape: &[usize], strides: &[usize], out: &[usize]) -> Option<Vec<usize>> {
    let off = out.len().checked_sub(shape.len())?;
    let mut s = vec![0usize; out.len()];
    for j in 0..shape.len() {
        if shape[j] == out[off + j] {
            s[off + j] = if shape[j] == 1 { 0 } else { strides[j] };
        } else if shape[j] != 1 {
            return None;
        }
    }
    Some(s)
}

/// Walks output elements `at..at + len` of merged dims of extents `ext` (outermost first, at
/// most [`crate::elem_program::MAX_DIMS`], each at least 2) in runs along the innermost dim:
/// `f(done, run, idx)` per run, with the run's position from `at`, its length and the index
/// of its first element per merged dim.
#[inline(always)]
pub(crate) fn for_each_run(
    ext: impl DoubleEndedIterator<Item = usize> + ExactSizeIterator + Clone,
    at: usize,
    len: usize,
    mut f: impl FnMut(usize, usize, &[usize]),
) {
    const MAX: usize = crate::elem_program::MAX_DIMS;
    let n = ext.len();
    let mut e = [1usize; MAX];
    for (j, x) in ext.enumerate().take(MAX) {
        e[j] = x;
    }
    let Some(inner) = n.checked_sub(1) else {
        f(0, len, &[]);
        return;
    };
    let mut idx = [0usize; MAX];
    let mut rem = at;
    for j in (0..n).rev() {
        idx[j] = rem % e[j];
        rem /= e[j];
    }
    let mut done = 0;
    while done < len {
        let run = (e[inner] - idx[inner]).min(len - done);
        f(done, run, &idx[..n]);
        done += run;
        idx[inner] += run;
        // Carry into the outer dims.
        let mut j = inner;
        while idx[j] >= e[j] && j > 0 {
            idx[j] = 0;
            j -= 1;
            idx[j] += 1;
        }
    }
}

/// Fills `buf` with the gathered view's elements from output element `at` on: `dims` are
/// (extent, [data stride, index stride]) per merged output dim, outermost first.
#[inline(always)]
pub(crate) fn gather_offsets(
    dims: &[(usize, [usize; 2])],
    data: &[f32],
    offsets: &[u32],
    at: usize,
    buf: &mut [f32],
) {
    let (ids, iis) = dims.last().map_or((0, 0), |&(_, [d, i])| (d, i));
    for_each_run(dims.iter().map(|d| d.0), at, buf.len(), |done, run, idx| {
        let (mut od, mut oi) = (0usize, 0usize);
        for (&(_, [ds, is]), &i) in dims.iter().zip(idx) {
            od += i * ds;
            oi += i * is;
        }
        for (k, d) in buf[done..done + run].iter_mut().enumerate() {
            *d = data[od + k * ids + offsets[oi + k * iis] as usize];
        }
    });
}

/// Merges adjacent output dims that every stride set walks as one, dropping extent-1 dims:
/// (extent, strides) per merged dim, outermost first.
pub(crate) fn merge_dims<const K: usize>(
    out: &[usize],
    sets: [&[usize]; K],
) -> Vec<(usize, [usize; K])> {
    let mut dims: Vec<(usize, [usize; K])> = Vec::new();
    for (j, &e) in out.iter().enumerate() {
        if e == 1 {
            continue;
        }
        let st: [usize; K] = std::array::from_fn(|k| sets[k][j]);
        match dims.last_mut() {
            Some((pe, ps)) if (0..K).all(|k| ps[k] == st[k] * e) => {
                *pe *= e;
                *ps = st;
            }
            _ => dims.push((e, st)),
        }
    }
    dims
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code: a failure is a panic")]
    use super::*;

    #[test]
    fn reshape_strides_split_and_merge_only_contiguous_runs() {
        // Contiguous: any reshape.
        assert_eq!(
            reshape_strides(&[2, 3, 4], &[12, 4, 1], &[6, 4]),
            Some(vec![4, 1])
        );
        assert_eq!(
            reshape_strides(&[2, 3, 4], &[12, 4, 1], &[24]),
            Some(vec![1])
        );
        assert_eq!(
            reshape_strides(&[6, 4], &[4, 1], &[2, 3, 2, 2]),
            Some(vec![12, 4, 2, 1])
        );
        // A transpose [3, 2] of [2, 3] (strides [1, 3]): splitting a dim is fine, merging the
        // two is not.
        assert_eq!(
            reshape_strides(&[3, 2], &[1, 3], &[3, 1, 2]),
            Some(vec![1, 6, 3])
        );
        assert_eq!(reshape_strides(&[3, 2], &[1, 3], &[6]), None);
        // Broadcast dims (stride 0) merge with each other.
        assert_eq!(reshape_strides(&[4, 5], &[0, 0], &[20]), Some(vec![0]));
        assert_eq!(reshape_strides(&[4, 5], &[0, 1], &[20]), None);
        assert_eq!(reshape_strides(&[2, 3], &[3, 1], &[7]), None);
    }

    #[test]
    fn reshape_targets_infer_one_unknown_dim() {
        assert_eq!(reshape_target(&[-1, 4], 12), Some(vec![3, 4]));
        assert_eq!(reshape_target(&[5, -1], 12), None);
        assert_eq!(reshape_target(&[-1, -1], 12), None);
        assert_eq!(reshape_target(&[0, -1], 0), None);
        assert_eq!(reshape_target(&[3, 4], 12), Some(vec![3, 4]));
    }
}
