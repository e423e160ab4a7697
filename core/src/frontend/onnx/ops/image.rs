//! ONNX's sampling ops `GridSample` (opsets 16, 20, 22) and `AffineGrid` (20) →
//! `relax.image.grid_sample` and `relax.image.affine_grid`, whose grids are channel-first (as
//! TVM's): the importer permutes ONNX's channel-last grids on the way in and out.
//!
//! Contract: `GridSample` takes a 4-D (`NCHW`) or 5-D (`NCDHW`) input and a grid of the same
//! rank, `(N, *out, r)`; its modes are opset 16's (`bilinear`, `nearest`, `bicubic`) or opset
//! 20's names for them (`linear`, `nearest`, `cubic`); `cubic` needs a 4-D input, as ONNX
//! defines it. `AffineGrid`'s `size` (`(N, C, H, W)` or `(N, C, D, H, W)`) must be a
//! constant; its `N` must match theta's.
//!
//! ```text
//! Y = GridSample(X: f32[1, 3, 8, 8], G: f32[1, 4, 5, 2]; mode="linear")
//!   → lv = R.permute_dims(G, axes=[0, 3, 1, 2])          # (1, 2, 4, 5)
//!     Y = R.image.grid_sample(X, lv, method="bilinear", layout="NCHW", padding_mode="zeros",
//!         align_corners=False)
//! G = AffineGrid(theta: f32[2, 2, 3], size=[2, 3, 4, 5]; align_corners=0)
//!   → lv = R.image.affine_grid(theta, R.shape([4, 5]), align_corners=False)   # (2, 2, 4, 5)
//!     G = R.permute_dims(lv, axes=[0, 2, 3, 1])                                # (2, 4, 5, 2)
//! ```

use super::super::{Attrs, Importer, NodeProto, Out, invalid, req};
use super::call;
use crate::error::Result;
use crate::ir::Dim;
use crate::op::{GridSampleAttrs, Op};

/// `GridSample(X, grid)`.
pub(super) fn grid_sample(
    im: &mut Importer<'_>,
    node: &NodeProto,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let grid = im.expr(req(node, 1)?)?;
    let (xd, _) = im.dims(x)?;
    let (gd, _) = im.dims(grid)?;
    let r = match xd.len() {
        4 => 2,
        5 => 3,
        n => {
            return Err(invalid(format!(
                "GridSample of a rank-{n} input: only 4-D (NCHW) and 5-D (NCDHW) inputs are supported"
            )));
        }
    };
    if gd.len() != xd.len() {
        return Err(invalid(format!(
            "GridSample needs a grid of rank {} for a rank-{} input, found rank {}",
            xd.len(),
            xd.len(),
            gd.len()
        )));
    }
    let default = if im.opset < 20 { "bilinear" } else { "linear" };
    let method = match a.string("mode", default).as_str() {
        "linear" | "bilinear" => "bilinear",
        "nearest" => "nearest",
        "cubic" | "bicubic" if r == 2 => "bicubic",
        "cubic" | "bicubic" => {
            return Err(invalid(
                "GridSample's cubic mode needs a 4-D input (ONNX defines it for 2-D samples only)",
            ));
        }
        other => {
            return Err(invalid(format!(
                "GridSample's mode `{other}` is not one of linear, nearest, cubic"
            )));
        }
    };
    let padding_mode = a.string("padding_mode", "zeros");
    if !["zeros", "border", "reflection"].contains(&padding_mode.as_str()) {
        return Err(invalid(format!(
            "GridSample's padding_mode `{padding_mode}` is not one of zeros, border, reflection"
        )));
    }
    let align_corners = match a.int("align_corners", 0) {
        0 => false,
        1 => true,
        v => {
            return Err(invalid(format!(
                "GridSample's align_corners must be 0 or 1, found {v}"
            )));
        }
    };
    // (N, *out, r) → (N, r, *out).
    let mut axes = vec![0, r as i64 + 1];
    axes.extend(1..=r as i64);
    let g = im.emit(Op::PermuteDims { axes: Some(axes) }, vec![grid])?;
    Ok(call(
        Op::GridSample(Box::new(GridSampleAttrs {
            method: method.into(),
            layout: if r == 2 { "NCHW" } else { "NCDHW" }.into(),
            padding_mode,
            align_corners,
        })),
        vec![x, g],
    ))
}

/// `AffineGrid(theta, size)`.
pub(super) fn affine_grid(
    im: &mut Importer<'_>,
    node: &NodeProto,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let theta = im.expr(req(node, 0)?)?;
    let size = im.const_i64s(req(node, 1)?)?;
    let r = match size.len() {
        4 => 2,
        5 => 3,
        n => {
            return Err(invalid(format!(
                "AffineGrid's size must have 4 (N, C, H, W) or 5 (N, C, D, H, W) values, found {n}"
            )));
        }
    };
    if let Some(d) = size[2..].iter().find(|&&d| d < 1) {
        return Err(invalid(format!(
            "AffineGrid's spatial sizes must be ≥ 1, found {d} in {size:?}"
        )));
    }
    let (td, _) = im.dims(theta)?;
    if let Some(n) = td.first().and_then(Dim::as_static)
        && n != size[0]
    {
        return Err(invalid(format!(
            "AffineGrid's size names a batch of {} but theta has {n}",
            size[0]
        )));
    }
    let align_corners = match a.int("align_corners", 0) {
        0 => false,
        1 => true,
        v => {
            return Err(invalid(format!(
                "AffineGrid's align_corners must be 0 or 1, found {v}"
            )));
        }
    };
    let shape =
        im.b.shape(size[2..].iter().map(|&d| Dim::Static(d)).collect());
    let g = im.emit(Op::AffineGrid { align_corners }, vec![theta, shape])?;
    // (N, r, *size) → (N, *size, r).
    let mut axes = vec![0];
    axes.extend(2..=r as i64 + 1);
    axes.push(1);
    Ok(call(Op::PermuteDims { axes: Some(axes) }, vec![g]))
}
