//! Type inference of the value-dependent ops (`relax.nonzero`, `relax.unique`,
//! `relax.vision.all_class_non_max_suppression`), as TVM 0.27's struct-info inference gives
//! them: the extents that depend on the values are left out of the type (rank only).
//!
//! Contract: as the rest of [`super`]; errors name the op and what was expected.
//!
//! ```text
//! R.nonzero(x: (3, 4) float32)                          -> R.Tensor(ndim=2, dtype="int64")
//! R.unique(x: (3, 4) float32, return_counts=True)       -> (R.Tensor(ndim=1, "float32"),
//!                                                           R.Tensor(ndim=1, "int64"))
//! R.unique(x: (3, 4) float32, axis=1)                   -> R.Tensor(ndim=2, "float32")
//! all_class_non_max_suppression(b: (1, 6, 4), s: (1, 2, 6), ...) -> ((12, 3) int64, (1,) int64)
//! ```

use super::{Cx, differ, known, product, unknown};
use crate::ir::{DType, Dim, Type};
use crate::op::UniqueAttrs;

/// `relax.nonzero`: `int64` of rank 2.
pub(super) fn nonzero(cx: &Cx<'_>) -> Result<Type, String> {
    cx.tensor(0, "the input")?;
    Ok(unknown(Some(2), Some(DType::I64)))
}

/// `relax.unique`: the input's dtype, rank 1 (rank of the input with `axis`), then the extra
/// outputs asked for, each rank-1 `int64`.
pub(super) fn unique(cx: &Cx<'_>, a: &UniqueAttrs) -> Result<Type, String> {
    let x = cx.tensor(0, "the input")?;
    let rank = match (a.axis, x.rank()) {
        (None, _) => Some(1),
        (Some(axis), Some(r)) => {
            cx.axis(axis, r)?;
            Some(r)
        }
        (Some(_), None) => None,
    };
    let values = unknown(rank, x.dtype);
    if !a.returns_tuple() {
        return Ok(values);
    }
    let mut fields = vec![values];
    let flags = [a.return_index, a.return_inverse, a.return_counts];
    fields.extend(
        flags
            .iter()
            .filter(|&&f| f)
            .map(|_| unknown(Some(1), Some(DType::I64))),
    );
    Ok(Type::Tuple(fields))
}

/// `relax.vision.all_class_non_max_suppression`: `((B·C·N, 3) int64, (1,) int64)` for boxes
/// `(B, N, 4)` and scores `(B, C, N)`.
pub(super) fn all_class_nms(cx: &Cx<'_>) -> Result<Type, String> {
    let boxes = cx.tensor(0, "the boxes")?;
    let scores = cx.tensor(1, "the scores")?;
    cx.rank(boxes, 3, "the boxes (batch, boxes, 4)")?;
    cx.rank(scores, 3, "the scores (batch, classes, boxes)")?;
    cx.float(boxes, "the boxes")?;
    cx.float(scores, "the scores")?;
    for (i, what) in [
        (2, "max_output_boxes_per_class"),
        (3, "iou_threshold"),
        (4, "score_threshold"),
    ] {
        let t = cx.tensor(i, what)?;
        if let Some(d) = &t.dims
            && let Some(n) = product(d).as_static()
            && n != 1
        {
            return Err(cx.err(format!("expected {what} to hold one value, found {n}")));
        }
    }
    let count = known(vec![Dim::Static(1)], Some(DType::I64));
    let (Some(b), Some(s)) = (&boxes.dims, &scores.dims) else {
        return Ok(Type::Tuple(vec![unknown(Some(2), Some(DType::I64)), count]));
    };
    if differ(&b[2], &Dim::Static(4)) {
        return Err(cx.err(format!(
            "expected the boxes' last axis to hold 4 coordinates, found {}",
            b[2]
        )));
    }
    if differ(&b[0], &s[0]) || differ(&b[1], &s[2]) {
        return Err(cx.err(format!(
            "the boxes ({}, {}, 4) and the scores ({}, {}, {}) disagree on the batch or the \
             number of boxes",
            b[0], b[1], s[0], s[1], s[2]
        )));
    }
    let rows = product(&[s[0].clone(), s[1].clone(), s[2].clone()]);
    Ok(Type::Tuple(vec![
        known(vec![rows, Dim::Static(3)], Some(DType::I64)),
        count,
    ]))
}
