//! The ops whose result shape depends on the input *values*: `relax.nonzero`, `relax.unique`
//! (TVM's `relax/op/tensor/set.cc`) and `relax.vision.all_class_non_max_suppression` (TVM's
//! `relax/op/vision/nms.cc`): their attributes, read from keyword literals ([`from_call`]) and
//! written back ([`kwargs`]).
//!
//! Contract:
//!
//! - Names, attribute names, defaults and types are TVM 0.27's. `relax.nonzero(x)` is a
//!   `R.Tensor(ndim=2, dtype="int64")` (one row per axis of `x`, one column per non-zero
//!   element, in row-major order); `relax.unique` a tensor of the input's dtype (rank 1, or the
//!   input's rank with `axis`), or a tuple of it and the rank-1 `int64` outputs asked for
//!   (`return_index`, `return_inverse`, `return_counts`, in that order). TVM passes `unique`'s
//!   flags and axis as prim values and prints them positionally (`R.unique(x, True, False,
//!   False, False)`); here they are attributes, read positionally or by keyword and printed by
//!   keyword (TVM's Python signature takes both).
//! - `relax.vision.all_class_non_max_suppression(boxes, scores, max_output_boxes_per_class,
//!   iou_threshold, score_threshold, output_format="onnx")`: `boxes` `(B, N, 4)`, `scores`
//!   `(B, C, N)`, the other three rank-0 or one-element tensors; the result is the tuple
//!   `((B·C·N, 3) int64, (1,) int64)`: the selected `[batch, class, box]` triples (batch-major,
//!   then class, then descending score) in the first `count` rows, zeros after them, and
//!   `count`. Only `output_format="onnx"` is supported.
//! - A value-dependent extent is not in the inferred type; the ONNX importer names it with a
//!   fresh symbolic dim on the binding's annotation (as TVM's `R.match_cast` does), which the
//!   executor binds when the value arrives.
//!
//! ```text
//! lv: R.Tensor((2, nnz), dtype="int64") = R.nonzero(x)            # x: R.Tensor((3, 4), "float32")
//! lv1: R.Tensor((u,), dtype="float32") = R.unique(x, sorted=True, return_index=False,
//!     return_inverse=False, return_counts=False, axis=None)
//! lv2: R.Tuple(R.Tensor((12, 3), dtype="int64"), R.Tensor((1,), dtype="int64")) =
//!     R.vision.all_class_non_max_suppression(b, s, m, iou, st, output_format="onnx")
//! ```

use super::attrs::{Kwargs, opt_int_lit, str_lit};
use super::{AttrLit, Op};

/// Attributes of `relax.unique`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UniqueAttrs {
    /// Whether the unique values come in ascending order (else in order of first occurrence).
    pub sorted: bool,
    /// Whether the result holds the index of each unique value's first occurrence.
    pub return_index: bool,
    /// Whether the result holds, per input element (or slice), the index of its unique value.
    pub return_inverse: bool,
    /// Whether the result holds how often each unique value occurs.
    pub return_counts: bool,
    /// The axis whose slices are compared (`None`: the flattened input's elements).
    pub axis: Option<i64>,
}

impl UniqueAttrs {
    /// Whether the op returns a tuple (any of the extra outputs asked for).
    pub fn returns_tuple(&self) -> bool {
        self.return_index || self.return_inverse || self.return_counts
    }
}

/// Attribute names of `relax.unique` in Python-API (positional) order.
pub(super) const UNIQUE_ATTRS: &[&str] = &[
    "sorted",
    "return_index",
    "return_inverse",
    "return_counts",
    "axis",
];

/// Reads the attributes of an op of this module; `None` when `name` is not one.
pub(super) fn from_call(name: &str, kw: &Kwargs<'_>) -> Result<Option<Op>, String> {
    Ok(Some(match name {
        "relax.nonzero" => Op::Nonzero,
        "relax.unique" => Op::Unique(Box::new(UniqueAttrs {
            sorted: kw.bool("sorted", true)?,
            return_index: kw.bool("return_index", false)?,
            return_inverse: kw.bool("return_inverse", false)?,
            return_counts: kw.bool("return_counts", false)?,
            axis: kw.opt_int("axis", None)?,
        })),
        "relax.vision.all_class_non_max_suppression" => {
            let format = kw.string("output_format", Some("onnx"))?;
            if format != "onnx" {
                return Err(kw.invalid(
                    "output_format",
                    &format!("only \"onnx\" is supported, found \"{format}\""),
                ));
            }
            Op::AllClassNms
        }
        _ => return Ok(None),
    }))
}

/// The keyword literals of an op of this module, in TVM's order; `None` for any other op.
pub(super) fn kwargs(op: &Op) -> Option<Vec<(&'static str, AttrLit)>> {
    Some(match op {
        Op::Nonzero => vec![],
        Op::Unique(a) => vec![
            ("sorted", AttrLit::Bool(a.sorted)),
            ("return_index", AttrLit::Bool(a.return_index)),
            ("return_inverse", AttrLit::Bool(a.return_inverse)),
            ("return_counts", AttrLit::Bool(a.return_counts)),
            ("axis", opt_int_lit(a.axis)),
        ],
        Op::AllClassNms => vec![("output_format", str_lit("onnx"))],
        _ => return None,
    })
}
