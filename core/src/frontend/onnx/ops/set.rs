//! ONNX's value-dependent ops: `NonZero`, `Compress`, `Unique` and `NonMaxSuppression`, whose
//! output extents depend on the input values. Each such extent is a fresh symbolic dim on the
//! binding's annotation (TVM's importer writes `R.match_cast`); the executor binds it when the
//! value arrives, so everything downstream keeps a symbolic shape.
//!
//! Contract:
//!
//! - `NonZero(X)` is `relax.nonzero`, typed `(max(rank, 1), nonzero)`.
//! - `Compress(X, condition)` takes the indices of `condition`'s true elements
//!   (`relax.nonzero`, reshaped to `(compress,)`) along `axis`, or from the flattened input
//!   without one. A true element past the axis extent is a run-time error of the `take`.
//! - `Unique(X)` is `relax.unique` asked for the outputs the node uses; `Y` is `(unique,)`
//!   (the input's shape with `unique` at `axis`), `indices` and `counts` `(unique,)`,
//!   `inverse_indices` `(numel,)` (`(extent of axis,)`).
//! - `NonMaxSuppression` is `relax.vision.all_class_non_max_suppression` (center-point boxes
//!   turned into corners first, as TVM's importer does), then its first `count` rows: the
//!   row indices below `count` are the `nonzero` of `arange(rows) < count`, taken from the
//!   padded result, typed `(nms, 3)`. Missing inputs take ONNX's defaults: no boxes
//!   (`max_output_boxes_per_class` 0), IoU threshold 0, no score threshold (`-inf`).
//!
//! ```text
//! Y = Compress(X: f32[3, 2], C: bool[3]; axis=0)
//!   → lv: R.Tensor((1, compress), dtype="int64") = R.nonzero(C)
//!     lv1: R.Tensor((compress,), dtype="int64") = R.reshape(lv, R.shape([compress]))
//!     Y: R.Tensor((compress, 2), dtype="float32") = R.take(X, lv1, axis=0, mode="fast")
//! ```

use super::super::{Attrs, Importer, NodeProto, Out, input, invalid, req};
use crate::error::Result;
use crate::ir::{Callee, Constant, DType, Dim, ExprId, ExprKind, TensorType, Type};
use crate::op::{ElemOp, Op, SplitAttrs, SplitSpec, TakeMode, UniqueAttrs};

/// A call of `op`, to bind.
fn call(op: Op, args: Vec<ExprId>) -> ExprKind {
    ExprKind::Call {
        callee: Callee::Op(op),
        args,
    }
}

fn int64(dims: Vec<Dim>) -> Type {
    Type::Tensor(TensorType::new(dims, DType::I64))
}

/// The rank of a tensor expression, if known.
fn rank_of(im: &Importer<'_>, e: ExprId) -> Option<usize> {
    im.ty(e).as_tensor().and_then(TensorType::rank)
}

/// `relax.nonzero(x)` bound to a var typed `(rank, <fresh prefix>)`; the fresh dim too.
fn nonzero(im: &mut Importer<'_>, x: ExprId, prefix: &str) -> Result<(ExprId, Dim)> {
    let rows = rank_of(im, x).ok_or_else(|| invalid("the input's rank must be known"))?;
    let n = im.b.fresh_sym(prefix);
    let e = im.emit_refined(
        Op::Nonzero,
        vec![x],
        int64(vec![Dim::Static(rows.max(1) as i64), n.clone()]),
    )?;
    Ok((e, n))
}

/// The indices of the true (non-zero) elements of a rank-1 `cond`, as a `(n,)` tensor.
fn true_indices(im: &mut Importer<'_>, cond: ExprId, prefix: &str) -> Result<(ExprId, Dim)> {
    let (nz, n) = nonzero(im, cond, prefix)?;
    let shape = im.b.shape(vec![n.clone()]);
    Ok((im.emit(Op::Reshape, vec![nz, shape])?, n))
}

/// `NonZero(X)`.
pub(crate) fn nonzero_node(im: &mut Importer<'_>, node: &NodeProto) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let rows = rank_of(im, x).ok_or_else(|| invalid("NonZero's input rank must be known"))?;
    let n = im.b.fresh_sym("nonzero");
    Ok(vec![Out::Refined(
        call(Op::Nonzero, vec![x]),
        int64(vec![Dim::Static(rows.max(1) as i64), n]),
    )])
}

/// `Compress(X, condition; axis)`.
pub(crate) fn compress(im: &mut Importer<'_>, node: &NodeProto, a: &Attrs<'_>) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let cond = im.expr(req(node, 1)?)?;
    match im.ty(cond).as_tensor() {
        Some(t) if t.rank() == Some(1) => {}
        _ => return Err(invalid("Compress's condition must be a rank-1 tensor")),
    }
    let (idx, _) = true_indices(im, cond, "compress")?;
    let (x, axis) = match a.get("axis") {
        Some(_) => (x, a.int("axis", 0)),
        None => (im.emit(Op::Flatten, vec![x])?, 0),
    };
    let rank = rank_of(im, x).ok_or_else(|| invalid("Compress's input rank must be known"))?;
    let r = rank as i64;
    if !(-r..r).contains(&axis) {
        return Err(invalid(format!(
            "Compress's axis {axis} is out of range for an input of rank {rank}"
        )));
    }
    Ok(vec![Out::Kind(call(
        Op::Take {
            axis: Some(axis),
            mode: TakeMode::Fast,
        },
        vec![x, idx],
    ))])
}

/// `Unique(X; axis, sorted)`.
pub(crate) fn unique(im: &mut Importer<'_>, node: &NodeProto, a: &Attrs<'_>) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let wanted = |k: usize| node.output.get(k).is_some_and(|s| !s.is_empty());
    let attrs = UniqueAttrs {
        sorted: a.int("sorted", 1) != 0,
        return_index: wanted(1),
        return_inverse: wanted(2),
        return_counts: wanted(3),
        axis: a.get("axis").map(|_| a.int("axis", 0)),
    };
    let xt = im
        .ty(x)
        .as_tensor()
        .cloned()
        .ok_or_else(|| invalid("Unique's input must be a tensor"))?;
    let dtype = xt.dtype;
    let u = im.b.fresh_sym("unique");
    // The values' type, and the extent of the inverse indices.
    let (values, n) = match (attrs.axis, &xt.dims) {
        (None, Some(d)) => (
            vec![u.clone()],
            d.iter().fold(Dim::Static(1), |acc, x| acc.mul(x)),
        ),
        (Some(axis), Some(d)) => {
            let r = d.len() as i64;
            if !(-r..r).contains(&axis) {
                return Err(invalid(format!(
                    "Unique's axis {axis} is out of range for an input of rank {r}"
                )));
            }
            let ax = axis.rem_euclid(r) as usize;
            let mut v = d.to_vec();
            let n = std::mem::replace(&mut v[ax], u.clone());
            (v, n)
        }
        (_, None) => return Err(invalid("Unique's input shape must be known")),
    };
    let values = Type::Tensor(TensorType {
        ndim: Some(values.len()),
        dims: Some(values.into()),
        dtype,
    });
    if !attrs.returns_tuple() {
        return Ok(vec![Out::Refined(
            call(Op::Unique(Box::new(attrs)), vec![x]),
            values,
        )]);
    }
    let mut fields = vec![values];
    // Output k of the node -> its field in the tuple.
    let mut field_of = vec![Some(0), None, None, None];
    for (k, (asked, extent)) in [
        (attrs.return_index, &u),
        (attrs.return_inverse, &n),
        (attrs.return_counts, &u),
    ]
    .into_iter()
    .enumerate()
    {
        if asked {
            field_of[k + 1] = Some(fields.len());
            fields.push(int64(vec![extent.clone()]));
        }
    }
    let t = im.emit_refined(Op::Unique(Box::new(attrs)), vec![x], Type::Tuple(fields))?;
    Ok(field_of
        .into_iter()
        .map(|f| Out::Kind(ExprKind::TupleGetItem(t, f.unwrap_or(0) as u32)))
        .collect())
}

/// `NonMaxSuppression(boxes, scores[, max_output_boxes_per_class, iou_threshold,
/// score_threshold]; center_point_box)`.
pub(crate) fn non_max_suppression(
    im: &mut Importer<'_>,
    node: &NodeProto,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let mut boxes = im.expr(req(node, 0)?)?;
    let scores = im.expr(req(node, 1)?)?;
    match a.int("center_point_box", 0) {
        0 => {}
        1 => boxes = corners(im, boxes)?,
        v => {
            return Err(invalid(format!(
                "NonMaxSuppression's center_point_box must be 0 or 1, found {v}"
            )));
        }
    }
    let given = |im: &mut Importer<'_>, k: usize, default: Constant| -> Result<ExprId> {
        match input(node, k) {
            Some(name) => im.expr(name),
            None => Ok(im.b.constant(default)),
        }
    };
    let max_out = given(im, 2, Constant::scalar_i64(0, DType::I64))?;
    let iou = given(im, 3, Constant::scalar(0.0, DType::F32))?;
    let score = given(im, 4, Constant::scalar(f64::NEG_INFINITY, DType::F32))?;
    let nms = im.emit(Op::AllClassNms, vec![boxes, scores, max_out, iou, score])?;
    let padded = im.b.value(ExprKind::TupleGetItem(nms, 0))?;
    let padded = im.b.bind("", padded, false)?;
    let padded = im.b.var(padded);
    let count = im.b.value(ExprKind::TupleGetItem(nms, 1))?;
    let count = im.b.bind("", count, false)?;
    let count = im.b.var(count);
    let rows = match im.ty(padded).as_tensor().and_then(|t| t.dims.clone()) {
        Some(d) => d[0].clone(),
        None => {
            return Err(invalid(
                "NonMaxSuppression's boxes and scores need known shapes",
            ));
        }
    };
    let iota = super::dynamic::iota(im, rows, DType::I64)?;
    let keep = im.emit(Op::Elem(ElemOp::Less), vec![iota, count])?;
    let (idx, _) = true_indices(im, keep, "nms")?;
    Ok(vec![Out::Kind(call(
        Op::Take {
            axis: Some(0),
            mode: TakeMode::Fast,
        },
        vec![padded, idx],
    ))])
}

/// Center-point boxes `[x_center, y_center, width, height]` as corners `[y1, x1, y2, x2]`.
fn corners(im: &mut Importer<'_>, boxes: ExprId) -> Result<ExprId> {
    let dtype = im.dims(boxes)?.1;
    let parts = im.emit(
        Op::Split(Box::new(SplitAttrs {
            indices_or_sections: SplitSpec::Sections(4),
            axis: 2,
        })),
        vec![boxes],
    )?;
    let field = |im: &mut Importer<'_>, i: usize| -> Result<ExprId> {
        let v = im.b.value(ExprKind::TupleGetItem(parts, i as u32))?;
        let v = im.b.bind("", v, false)?;
        Ok(im.b.var(v))
    };
    let (xc, yc, w, h) = (field(im, 0)?, field(im, 1)?, field(im, 2)?, field(im, 3)?);
    let two = im.scalar(2.0, dtype);
    let hw = im.emit(Op::Divide, vec![w, two])?;
    let hh = im.emit(Op::Divide, vec![h, two])?;
    let x1 = im.emit(Op::Subtract, vec![xc, hw])?;
    let x2 = im.emit(Op::Add, vec![xc, hw])?;
    let y1 = im.emit(Op::Subtract, vec![yc, hh])?;
    let y2 = im.emit(Op::Add, vec![yc, hh])?;
    let all = im.b.tuple(vec![y1, x1, y2, x2])?;
    im.emit(Op::Concat { axis: Some(2) }, vec![all])
}
