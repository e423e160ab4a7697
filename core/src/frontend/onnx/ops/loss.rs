//! ONNX's losses `NegativeLogLikelihoodLoss` and `SoftmaxCrossEntropyLoss`, composed from the op
//! set at import time.
//!
//! Contract: `input`/`scores` are `[N, C]` or `[N, C, d1, …]` with a static class count `C`;
//! `target`/`labels` are integer tensors `[N]` or `[N, d1, …]`. The picked log-probability
//! `input[n, target[n, d], d]` is a masked sum over the class axis against a constant
//! `0..C` (`equal(expand_dims(target, 1), iota)`), so a target outside `0..C` picks nothing
//! (ONNX leaves that undefined unless it is `ignore_index`). The weight of each element is
//! `weight[target]` (1 without weights) and 0 where `target == ignore_index`. `reduction` is
//! `none` (the per-element loss), `sum`, or `mean` (default: the sum divided by the sum of the
//! weights, as ONNX defines it). `SoftmaxCrossEntropyLoss` applies `log_softmax` over axis 1
//! first and returns it as its optional second output.
//!
//! ```text
//! loss = NegativeLogLikelihoodLoss(x: f32[3, 5], t: i64[3]; reduction="sum")
//!   → m = R.astype(R.equal(R.expand_dims(t, [1]), iota[1, 5]), "float32")
//!     loss = R.negative(R.sum(R.sum(R.multiply(x, m), axis=[1])))
//! ```

use super::super::{Attrs, Importer, NodeProto, Out, Val, input, invalid, req};
use crate::error::Result;
use crate::ir::{Constant, Dim, ExprId};
use crate::op::{ElemOp, Op, ReduceAttrs};

fn sum(im: &mut Importer<'_>, x: ExprId, axis: Option<Vec<i64>>) -> Result<ExprId> {
    im.emit(
        Op::Sum(Box::new(ReduceAttrs {
            axis,
            keepdims: false,
        })),
        vec![x],
    )
}

/// The NLL of `logp` (log-probabilities) against `target`; the loss, per `reduction`.
fn nll(
    im: &mut Importer<'_>,
    node: &NodeProto,
    logp: ExprId,
    target: ExprId,
    weight: Option<ExprId>,
) -> Result<ExprId> {
    let a = Attrs(node);
    let (xd, dt) = im.dims(logp)?;
    let (td, tdt) = im.dims(target)?;
    if !tdt.is_int() {
        return Err(invalid(format!(
            "the target must be an integer tensor, found {tdt}"
        )));
    }
    if xd.len() < 2 || td.len() + 1 != xd.len() {
        return Err(invalid(format!(
            "input must be [N, C, d…] and target [N, d…]; found ranks {} and {}",
            xd.len(),
            td.len()
        )));
    }
    let classes = xd[1]
        .as_static()
        .ok_or_else(|| invalid("the class count C must be static"))?;
    if !(1..=1 << 24).contains(&classes) {
        return Err(invalid(format!("class count {classes} is out of range")));
    }
    let reduction = a.string("reduction", "mean");
    if !matches!(reduction.as_str(), "none" | "sum" | "mean") {
        return Err(invalid(format!(
            "reduction must be none, sum or mean, found `{reduction}`"
        )));
    }
    let rank = xd.len();
    // iota: [1, C, 1, …] in the target's dtype.
    let mut shape = vec![1i64; rank];
    shape[1] = classes;
    let mut bytes = Vec::new();
    for c in 0..classes {
        bytes.extend(Constant::scalar_i64(c, tdt).data.iter());
    }
    let iota = Constant::from_bytes(tdt, shape.clone(), bytes).map_err(invalid)?;
    let iota = im.b.constant(iota);
    let t1 = im.emit(Op::ExpandDims { axis: vec![1] }, vec![target])?;
    let hit = im.emit(Op::Elem(ElemOp::Equal), vec![t1, iota])?;
    let hit = im.emit(Op::Astype { dtype: dt }, vec![hit])?;
    let picked = im.emit(Op::Multiply, vec![logp, hit])?;
    let picked = sum(im, picked, Some(vec![1]))?; // [N, d…]
    // Per-element weight: weight[target] (or 1), 0 where ignored.
    let mut w = match weight {
        Some(wt) => {
            let to = shape_expr(im, &shape)?;
            let wr = im.emit(Op::Reshape, vec![wt, to])?;
            let wm = im.emit(Op::Multiply, vec![hit, wr])?;
            Some(sum(im, wm, Some(vec![1]))?)
        }
        None => None,
    };
    if a.has("ignore_index") {
        let ig =
            im.b.constant(Constant::scalar_i64(a.int("ignore_index", 0), tdt));
        let keep = im.emit(Op::Elem(ElemOp::NotEqual), vec![target, ig])?;
        let keep = im.emit(Op::Astype { dtype: dt }, vec![keep])?;
        w = Some(match w {
            Some(w) => im.emit(Op::Multiply, vec![w, keep])?,
            None => keep,
        });
    }
    let weighted = match w {
        Some(w) => im.emit(Op::Multiply, vec![picked, w])?,
        None => picked,
    };
    let loss = im.emit(Op::Negative, vec![weighted])?;
    match reduction.as_str() {
        "none" => Ok(loss),
        "sum" => sum(im, loss, None),
        _ => match w {
            None => im.emit(
                Op::Mean(Box::new(ReduceAttrs {
                    axis: None,
                    keepdims: false,
                })),
                vec![loss],
            ),
            Some(w) => {
                let num = sum(im, loss, None)?;
                let den = sum(im, w, None)?;
                im.emit(Op::Divide, vec![num, den])
            }
        },
    }
}

fn shape_expr(im: &mut Importer<'_>, shape: &[i64]) -> Result<ExprId> {
    Ok(im.b.shape(shape.iter().map(|&d| Dim::Static(d)).collect()))
}

/// `NegativeLogLikelihoodLoss(input, target[, weight])`.
pub(crate) fn negative_log_likelihood(im: &mut Importer<'_>, node: &NodeProto) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let t = im.expr(req(node, 1)?)?;
    let w = input(node, 2).map(|n| im.expr(n)).transpose()?;
    let (_, dt) = im.dims(x)?;
    if !dt.is_float() {
        return Err(invalid(format!("input must be a float tensor, found {dt}")));
    }
    let loss = nll(im, node, x, t, w)?;
    Ok(vec![Out::Val(Val::Expr(loss))])
}

/// `SoftmaxCrossEntropyLoss(scores, labels[, weights])` → `output[, log_prob]`.
pub(crate) fn softmax_cross_entropy(im: &mut Importer<'_>, node: &NodeProto) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let t = im.expr(req(node, 1)?)?;
    let w = input(node, 2).map(|n| im.expr(n)).transpose()?;
    let (_, dt) = im.dims(x)?;
    if !dt.is_float() {
        return Err(invalid(format!(
            "scores must be a float tensor, found {dt}"
        )));
    }
    let logp = im.emit(Op::LogSoftmax { axis: 1 }, vec![x])?;
    let loss = nll(im, node, logp, t, w)?;
    Ok(vec![Out::Val(Val::Expr(loss)), Out::Val(Val::Expr(logp))])
}
