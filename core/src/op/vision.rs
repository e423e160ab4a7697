//! Attributes of `relax.vision.roi_align` (TVM's `relax/op/vision/roi_align.cc`), read from and
//! written back to keyword literals.
//!
//! Contract:
//!
//! - `relax.vision.roi_align(data, rois, pooled_size, spatial_scale, sample_ratio=-1,
//!   aligned=False, layout="NCHW", mode="avg")`: names, order and defaults are TVM 0.27's;
//!   `pooled_size` and `spatial_scale` have no default. `data` is 4-D (`NCHW` or `NHWC`),
//!   `rois` is `(R, 5)` rows of `[batch_index, x1, y1, x2, y2]` in the input image's
//!   coordinates (the batch index as a float, truncated); the result is `(R, C, PH, PW)`
//!   (`(R, PH, PW, C)` for `NHWC`) of the data's dtype.
//! - The semantics are TVM topi's `roi_align_nchw`: each corner is scaled by `spatial_scale`;
//!   without `aligned` the box's height and width are at least 1 (with it they are used as
//!   they are; TVM's `aligned` shifts nothing: ONNX's `half_pixel` importer subtracts the half
//!   pixel from the scaled corners itself). Each of the `PH × PW` bins samples a grid of
//!   `sample_ratio²` points (`sample_ratio ≤ 0`: `ceil(roi_h / PH) × ceil(roi_w / PW)` per
//!   box), each point bilinearly interpolated with ONNX's border rule (a point beyond one
//!   pixel outside the input reads 0; one inside that margin is clamped to the edge).
//!   `mode="avg"` averages a bin's points; `"max"` takes the largest interpolated point.
//! - One mode TVM lacks: `mode="onnx_max"` is ONNX's `RoiAlign` `max` (its reference and
//!   onnxruntime): the largest *weighted corner term* `w·v` over the four corners of every
//!   point of the bin, not the largest interpolated value. A bin without sample points (a box
//!   of zero extent with adaptive sampling) is 0 in every mode.
//!
//! ```text
//! lv: R.Tensor((3, 16, 7, 7), dtype="float32") = R.vision.roi_align(x, rois,
//!     pooled_size=[7, 7], spatial_scale=0.25, sample_ratio=2, aligned=False,
//!     layout="NCHW", mode="avg")                   # x: (2, 16, 50, 50), rois: (3, 5)
//! ```

use super::attrs::{Kwargs, ints_lit, pair, str_lit};
use super::nn::one_of;
use super::{AttrLit, F64};
use crate::ir::MAX_DIM;

/// Attributes of `relax.vision.roi_align`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RoiAlignAttrs {
    /// The output bins per box, `[PH, PW]`, each at least 1.
    pub pooled_size: [i64; 2],
    /// The factor from the boxes' coordinates to the input's pixels.
    pub spatial_scale: F64,
    /// Sample points per bin along each axis; `≤ 0` adapts them to the box's size.
    pub sample_ratio: i64,
    /// Whether the box's extent is used as it is (else it is at least one pixel).
    pub aligned: bool,
    /// `"NCHW"` or `"NHWC"`, the data's layout and the result's.
    pub layout: String,
    /// `"avg"`, `"max"` or `"onnx_max"` (see the module doc).
    pub mode: String,
}

/// Attribute names of `relax.vision.roi_align` in Python-API order.
pub(super) const ROI_ALIGN_ATTRS: &[&str] = &[
    "pooled_size",
    "spatial_scale",
    "sample_ratio",
    "aligned",
    "layout",
    "mode",
];

const LAYOUTS: &[&str] = &["NCHW", "NHWC"];
const MODES: &[&str] = &["avg", "max", "onnx_max"];

/// Reads `relax.vision.roi_align`'s attributes.
pub(super) fn roi_align_attrs(kw: &Kwargs<'_>) -> Result<Box<RoiAlignAttrs>, String> {
    let pooled = kw.ints("pooled_size", None)?;
    let pooled_size = pair(kw, "pooled_size", &pooled)?;
    if let Some(p) = pooled_size.iter().find(|&&p| !(1..=MAX_DIM).contains(&p)) {
        return Err(kw.invalid(
            "pooled_size",
            &format!("every extent must be in 1..={MAX_DIM}, found {p}"),
        ));
    }
    let spatial_scale = kw.req_float("spatial_scale")?;
    if !spatial_scale.0.is_finite() {
        return Err(kw.invalid(
            "spatial_scale",
            &format!("expected a finite number, found {}", spatial_scale.0),
        ));
    }
    Ok(Box::new(RoiAlignAttrs {
        pooled_size,
        spatial_scale,
        sample_ratio: kw.int("sample_ratio", Some(-1))?,
        aligned: kw.bool("aligned", false)?,
        layout: one_of(kw, "layout", "NCHW", LAYOUTS)?,
        mode: one_of(kw, "mode", "avg", MODES)?,
    }))
}

/// `relax.vision.roi_align`'s attributes in TVM's printing order.
pub(super) fn roi_align_kwargs(a: &RoiAlignAttrs) -> Vec<(&'static str, AttrLit)> {
    vec![
        ("pooled_size", ints_lit(&a.pooled_size)),
        ("spatial_scale", AttrLit::Float(a.spatial_scale.0)),
        ("sample_ratio", AttrLit::Int(a.sample_ratio)),
        ("aligned", AttrLit::Bool(a.aligned)),
        ("layout", str_lit(&a.layout)),
        ("mode", str_lit(&a.mode)),
    ]
}
