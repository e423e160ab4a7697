//! Attributes of the sampling ops of `relax.image`: `relax.image.grid_sample` and
//! `relax.image.affine_grid`, read from and written back to keyword literals.
//!
//! Contract: names, defaults and printing order are TVM 0.27's (`GridSampleAttrs`,
//! `AffineGridAttrs`); string attributes with a closed set of values are checked when read, so
//! a kernel never meets an unknown mode. As in TVM, the grid is channel-first: `grid_sample`
//! reads a `(N, 2, H_out, W_out)` grid (`(N, 3, D_out, H_out, W_out)` for `layout="NCDHW"`)
//! whose channel 0 is the normalised `x` (width) coordinate, 1 `y` and 2 `z`, and
//! `affine_grid` makes one of that layout (ONNX's grids are channel-last; its importer
//! permutes them). The sampling rules are ONNX's `GridSample` (its reference and onnxruntime
//! agree), which TVM 0.27's legalization matches (`tests/image_ops.rs`) except for `bicubic`
//! with `border`: ONNX clamps a coordinate outside the borders to the edge pixel before taking
//! the four taps, TVM (as PyTorch) clamps only the taps.
//!
//! ```text
//! g = R.image.affine_grid(theta, R.shape([4, 5]), align_corners=False)   # (N, 2, 4, 5)
//! y = R.image.grid_sample(x, g, method="bilinear", layout="NCHW", padding_mode="zeros",
//!     align_corners=False)                                                # (N, C, 4, 5)
//! ```

use super::AttrLit;
use super::attrs::{Kwargs, str_lit};
use super::nn::one_of;

/// Attributes of `relax.image.grid_sample`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GridSampleAttrs {
    /// `"nearest"`, `"bilinear"` (trilinear for `NCDHW`) or `"bicubic"` (2-D only).
    pub method: String,
    /// `"NCHW"` (a 2-D sample) or `"NCDHW"` (a volumetric one).
    pub layout: String,
    /// What a tap outside the input reads: `"zeros"`, `"border"` (the nearest edge) or
    /// `"reflection"` (the input mirrored at its borders).
    pub padding_mode: String,
    /// Whether -1 and 1 are the centres of the corner pixels (else their outer edges).
    pub align_corners: bool,
}

/// Attribute names of `relax.image.grid_sample` in Python-API order.
pub(super) const GRID_SAMPLE_ATTRS: &[&str] =
    &["method", "layout", "padding_mode", "align_corners"];

/// Attribute names of `relax.image.affine_grid`.
pub(super) const AFFINE_GRID_ATTRS: &[&str] = &["align_corners"];

const METHODS: &[&str] = &["nearest", "bilinear", "bicubic"];
const LAYOUTS: &[&str] = &["NCHW", "NCDHW"];
const PADDING: &[&str] = &["zeros", "border", "reflection"];

/// Reads `relax.image.grid_sample`'s attributes.
pub(super) fn grid_sample_attrs(kw: &Kwargs<'_>) -> Result<Box<GridSampleAttrs>, String> {
    let method = one_of(kw, "method", "bilinear", METHODS)?;
    let layout = one_of(kw, "layout", "NCHW", LAYOUTS)?;
    if layout == "NCDHW" && method == "bicubic" {
        return Err(kw.invalid(
            "method",
            "bicubic sampling is 2-D only; expected \"nearest\" or \"bilinear\" for NCDHW",
        ));
    }
    Ok(Box::new(GridSampleAttrs {
        method,
        layout,
        padding_mode: one_of(kw, "padding_mode", "zeros", PADDING)?,
        align_corners: kw.bool("align_corners", false)?,
    }))
}

/// `relax.image.grid_sample`'s attributes in TVM's printing order.
pub(super) fn grid_sample_kwargs(a: &GridSampleAttrs) -> Vec<(&'static str, AttrLit)> {
    vec![
        ("method", str_lit(&a.method)),
        ("layout", str_lit(&a.layout)),
        ("padding_mode", str_lit(&a.padding_mode)),
        ("align_corners", AttrLit::Bool(a.align_corners)),
    ]
}

impl GridSampleAttrs {
    /// The number of spatial axes the layout samples (2 or 3).
    pub fn spatial(&self) -> usize {
        self.layout.len() - 2
    }
}

/// Normalised coordinates of the `n` sample positions along one axis of an affine grid: the
/// pixel centres `(2i + 1) / n - 1`, or with `align_corners` the corners `2i / (n - 1) - 1`
/// (-1 for a single position, as PyTorch's `linspace(-1, 1, 1)` and ONNX's reference give).
pub fn affine_grid_base(n: usize, align_corners: bool) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let i = i as f64;
            if align_corners {
                if n > 1 {
                    2.0 * i / (n as f64 - 1.0) - 1.0
                } else {
                    -1.0
                }
            } else {
                (2.0 * i + 1.0) / n as f64 - 1.0
            }
        })
        .collect()
}
