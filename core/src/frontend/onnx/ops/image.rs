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
//! `Col2Im` (opset 18) with 2 spatial axes, a constant `image_shape` and `block_shape`, and a
//! static input, becomes one `relax.nn.conv2d_transpose` (with 3, the 3-D transposed
//! convolution of `conv3d.rs`): the `C·kh·kw` input channels are
//! `C` groups of `kh·kw`, each spread back onto its image by a constant one-hot weight (block
//! element `(i, j)` of channel `c` lands at kernel tap `(i, j)` of output channel `c`), with
//! the `strides`, `dilations` and `pads` of the blocks; overlapping blocks add up, as Col2Im
//! defines. The sums are the same terms in another order, plus zero products (so an infinite
//! or NaN element also makes the neighbours its block overlaps NaN).
//!
//! `RoiAlign` (opsets 10, 16, 22) is `relax.vision.roi_align` over `(R, 5)` rows of
//! `[batch_index, x1, y1, x2, y2]` (the batch indices cast to the boxes' float dtype and put in
//! front). `output_half_pixel` (opset 10's only rule) passes `spatial_scale` on; `half_pixel`
//! (opset 16's default) scales the corners and subtracts half a pixel in the boxes' dtype, as
//! ONNX's reference does, and asks for `aligned` (no one-pixel minimum) with a scale of 1.
//! ONNX's `max` mode is `mode="onnx_max"` (the largest weighted corner term, not TVM's largest
//! interpolated value). The data must be 4-D and the boxes `(R, 4)` with `(R,)` indices.
//!
//! ```text
//! Y = GridSample(X: f32[1, 3, 8, 8], G: f32[1, 4, 5, 2]; mode="linear")
//!   → lv = R.permute_dims(G, axes=[0, 3, 1, 2])          # (1, 2, 4, 5)
//!     Y = R.image.grid_sample(X, lv, method="bilinear", layout="NCHW", padding_mode="zeros",
//!         align_corners=False)
//! G = AffineGrid(theta: f32[2, 2, 3], size=[2, 3, 4, 5]; align_corners=0)
//!   → lv = R.image.affine_grid(theta, R.shape([4, 5]), align_corners=False)   # (2, 2, 4, 5)
//!     G = R.permute_dims(lv, axes=[0, 2, 3, 1])                                # (2, 4, 5, 2)
//! Y = Col2Im(X: f32[1, 8, 9], image_shape=[5, 5], block_shape=[2, 2]; strides=[2, 2])
//!   → lv = R.reshape(X, R.shape([1, 8, 3, 3]))
//!     Y = R.nn.conv2d_transpose(lv, W, strides=[2, 2], output_padding=[1, 1], groups=2)
//!     # W: (8, 1, 2, 2) one-hot; Y: (1, 2, 5, 5)
//! Y = RoiAlign(X: f32[1, 4, 10, 10], rois: f32[3, 4], idx: i64[3]; output_height=5,
//!     output_width=5, sampling_ratio=2, spatial_scale=0.5)          # half_pixel (opset 16)
//!   → lv = R.expand_dims(R.astype(idx, "float32"), axis=[1])
//!     lv1 = R.subtract(R.multiply(rois, R.const(0.5)), R.const(0.5))
//!     lv2 = R.concat((lv, lv1), axis=1)                                # (3, 5)
//!     Y = R.vision.roi_align(X, lv2, pooled_size=[5, 5], spatial_scale=1.0, sample_ratio=2,
//!         aligned=True, layout="NCHW", mode="avg")                     # (3, 4, 5, 5)
//! ```

use super::super::{Attrs, Importer, NodeProto, Out, Val, dims_str, invalid, req};
use super::call;
use super::nn::TransposeGeometry;
use crate::error::Result;
use crate::ir::{Constant, Dim};
use crate::op::{Conv2dTransposeAttrs, F64, GridSampleAttrs, Op, RoiAlignAttrs};

/// The most elements of `Col2Im`'s one-hot weight (`C · (kh · kw)²`).
const MAX_COL2IM_WEIGHT: usize = 1 << 26;

/// `Col2Im(input, image_shape, block_shape)` (see the module doc).
pub(super) fn col2im(im: &mut Importer<'_>, node: &NodeProto, a: &Attrs<'_>) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let image = im.const_i64s(req(node, 1)?)?;
    let block = im.const_i64s(req(node, 2)?)?;
    let (xd, dt) = im.dims(x)?;
    let r = image.len();
    if !(2..=3).contains(&r) || block.len() != r {
        return Err(invalid(format!(
            "Col2Im with image_shape {image:?} and block_shape {block:?}: 2 or 3 spatial axes \
             (as many values in each) are supported"
        )));
    }
    let get = |name: &str, default: i64, n: usize| -> Result<Vec<i64>> {
        let v = a.ints(name).unwrap_or_else(|| vec![default; n]);
        if v.len() == n {
            Ok(v)
        } else {
            Err(invalid(format!(
                "Col2Im's `{name}` has {} values, expected {n}",
                v.len()
            )))
        }
    };
    let strides = get("strides", 1, r)?;
    let dil = get("dilations", 1, r)?;
    let pads = get("pads", 0, 2 * r)?;
    if strides.iter().chain(&dil).any(|&v| v < 1) || pads.iter().any(|&p| p < 0) {
        return Err(invalid(format!(
            "Col2Im needs strides and dilations ≥ 1 and pads ≥ 0, found {strides:?}, {dil:?}, \
             {pads:?}"
        )));
    }
    if image.iter().chain(&block).any(|&v| v < 1) {
        return Err(invalid(format!(
            "Col2Im needs image_shape and block_shape ≥ 1, found {image:?} and {block:?}"
        )));
    }
    let [n, cb, l] = xd.as_slice() else {
        return Err(invalid(format!(
            "Col2Im's input must be 3-D (N, C · block size, L), found rank {}",
            xd.len()
        )));
    };
    let (Some(cb), Some(l)) = (cb.as_static(), l.as_static()) else {
        return Err(invalid("Col2Im needs a static channel and block count"));
    };
    let k = block.iter().try_fold(1i64, |p, &b| p.checked_mul(b));
    let k = k.filter(|&k| k <= cb.max(1)).ok_or_else(|| {
        invalid(format!(
            "Col2Im's block {block:?} exceeds its {cb} channels"
        ))
    })?;
    if cb % k != 0 {
        return Err(invalid(format!(
            "Col2Im's input has {cb} channels, not a multiple of the block size {k}"
        )));
    }
    let c = cb / k;
    // Blocks per axis, and the rows or columns past the last block (transposed conv's
    // output padding).
    let mut nb = vec![0i64; r];
    let mut extra = vec![0i64; r];
    for d in 0..r {
        let padded = image[d].saturating_add(pads[d]).saturating_add(pads[d + r]);
        let span = padded.saturating_sub(dil[d].saturating_mul(block[d] - 1).saturating_add(1));
        if span < 0 {
            return Err(invalid(format!(
                "Col2Im: a block of {} (dilation {}) does not fit the padded image extent \
                 {padded}",
                block[d], dil[d]
            )));
        }
        nb[d] = span / strides[d] + 1;
        extra[d] = span % strides[d];
    }
    if nb.iter().try_fold(1i64, |p, &b| p.checked_mul(b)) != Some(l) {
        return Err(invalid(format!(
            "Col2Im's input has {l} blocks; image_shape {image:?}, block_shape {block:?}, \
             strides, dilations and pads give {nb:?}"
        )));
    }
    let wlen = usize::try_from(cb.saturating_mul(k))
        .ok()
        .filter(|&v| v <= MAX_COL2IM_WEIGHT)
        .ok_or_else(|| {
            invalid(format!(
                "Col2Im's one-hot weight would have {cb} × {k} elements (at most {MAX_COL2IM_WEIGHT})"
            ))
        })?;
    if !dt.is_float() {
        return Err(invalid(format!(
            "Col2Im of {dt} data: only floating-point inputs are supported"
        )));
    }
    // Weight (C·k, 1, block…): row c·k + t is one at tap t (zero bytes are +0.0 in every
    // float dtype).
    let one = Constant::scalar(1.0, dt).data;
    let es = one.len();
    let mut bytes = vec![0u8; wlen * es];
    let ku = k as usize;
    for row in 0..cb as usize {
        let at = (row * ku + row % ku) * es;
        bytes[at..at + es].copy_from_slice(&one);
    }
    let wshape: Vec<i64> = [cb, 1].into_iter().chain(block.iter().copied()).collect();
    let weight = Constant::from_bytes(dt, wshape, bytes)
        .map_err(|e| invalid(format!("Col2Im's weight: {e}")))?;
    let weight = im.b.constant(weight);
    let bshape: Vec<Dim> = [n.clone(), Dim::Static(cb)]
        .into_iter()
        .chain(nb.iter().map(|&b| Dim::Static(b)))
        .collect();
    let shape = im.b.shape(bshape);
    let blocks = im.emit(Op::Reshape, vec![x, shape])?;
    if r == 3 {
        let g = TransposeGeometry {
            strides,
            dilations: dil,
            kernel: block,
            pads,
            output_padding: extra,
            group: c,
        };
        let y = super::conv3d::conv_transpose3d(im, blocks, weight, &g)?;
        return Ok(vec![Out::Val(Val::Expr(y))]);
    }
    Ok(call(
        Op::Conv2dTranspose(Box::new(Conv2dTransposeAttrs {
            strides: [strides[0], strides[1]],
            padding: [pads[0], pads[1], pads[2], pads[3]],
            output_padding: [extra[0], extra[1]],
            dilation: [dil[0], dil[1]],
            groups: c,
            data_layout: "NCHW".into(),
            kernel_layout: "IOHW".into(),
            out_layout: "NCHW".into(),
            out_dtype: None,
        })),
        vec![blocks, weight],
    ))
}

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

/// `RoiAlign(X, rois, batch_indices)` (see the module doc).
pub(super) fn roi_align(
    im: &mut Importer<'_>,
    node: &NodeProto,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let rois = im.expr(req(node, 1)?)?;
    let idx = im.expr(req(node, 2)?)?;
    let (xd, xt) = im.dims(x)?;
    let (rd, rt) = im.dims(rois)?;
    let (id, it) = im.dims(idx)?;
    if xd.len() != 4 {
        return Err(invalid(format!(
            "RoiAlign needs a 4-D input (N, C, H, W), found rank {}",
            xd.len()
        )));
    }
    if rd.len() != 2 || rd[1].as_static().is_some_and(|c| c != 4) {
        return Err(invalid(format!(
            "RoiAlign needs rois of shape (num_rois, 4), found {}",
            dims_str(&rd)
        )));
    }
    if id.len() != 1 || !it.is_int() {
        return Err(invalid(format!(
            "RoiAlign needs integer batch_indices of shape (num_rois,), found {it}{}",
            dims_str(&id)
        )));
    }
    if !xt.is_float() || rt != xt {
        return Err(invalid(format!(
            "RoiAlign needs float data and rois of the same dtype, found {xt} and {rt}"
        )));
    }
    let size = |name: &str| -> Result<i64> {
        let v = a.int(name, 1);
        if v < 1 {
            return Err(invalid(format!("RoiAlign's {name} must be ≥ 1, found {v}")));
        }
        Ok(v)
    };
    let pooled_size = [size("output_height")?, size("output_width")?];
    let scale = a.float("spatial_scale", 1.0);
    if !scale.is_finite() {
        return Err(invalid(format!(
            "RoiAlign's spatial_scale must be finite, found {scale}"
        )));
    }
    let mode = match a.string("mode", "avg").as_str() {
        "avg" => "avg",
        "max" => "onnx_max",
        other => {
            return Err(invalid(format!(
                "RoiAlign's mode `{other}` is not one of avg, max"
            )));
        }
    };
    let default = if im.opset < 16 {
        "output_half_pixel"
    } else {
        "half_pixel"
    };
    let half_pixel = match a.string("coordinate_transformation_mode", default).as_str() {
        "half_pixel" => true,
        "output_half_pixel" => false,
        other => {
            return Err(invalid(format!(
                "RoiAlign's coordinate_transformation_mode `{other}` is not one of half_pixel, \
                 output_half_pixel"
            )));
        }
    };
    let mut boxes = rois;
    if half_pixel {
        let s = im.scalar(scale, rt);
        boxes = im.emit(Op::Multiply, vec![boxes, s])?;
        let h = im.scalar(0.5, rt);
        boxes = im.emit(Op::Subtract, vec![boxes, h])?;
    }
    let b = im.emit(Op::Astype { dtype: rt }, vec![idx])?;
    let b = im.emit(Op::ExpandDims { axis: vec![1] }, vec![b])?;
    let t = im.b.tuple(vec![b, boxes])?;
    let rows = im.emit(Op::Concat { axis: Some(1) }, vec![t])?;
    Ok(call(
        Op::RoiAlign(Box::new(RoiAlignAttrs {
            pooled_size,
            spatial_scale: F64(if half_pixel { 1.0 } else { scale }),
            sample_ratio: a.int("sampling_ratio", 0),
            aligned: half_pixel,
            layout: "NCHW".into(),
            mode: mode.into(),
        })),
        vec![x, rows],
    ))
}
