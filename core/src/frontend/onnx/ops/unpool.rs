//! ONNX's `MaxUnpool` (opsets 9, 11, 22): each value of `X` is written at its `I` index (a flat
//! index into the whole output, as `MaxPool`'s `Indices` output gives it), every other output
//! element is zero. One `scatter_elements` on the flattened zero output.
//!
//! Contract: the indices address the shape `(in − 1) · stride + kernel − pad_begin − pad_end`
//! per spatial axis; a constant `output_shape` at least that large adds zeros at the end of
//! each axis (the ONNX reference's placement; onnxruntime differs). Shapes must be static and
//! non-empty, at most [`MAX_ELEMS`] elements. An index outside the output is a run-time error of the
//! scatter, never an out-of-bounds write.
//!
//! ```text
//! Y = MaxUnpool(X: f32[1, 1, 2, 2], I: i64[1, 1, 2, 2]; kernel_shape=[2, 2], strides=[2, 2])
//!   → lv = R.broadcast_to(R.const(0.0), R.shape([16]))
//!     lv1 = R.scatter_elements(lv, R.reshape(I, [4]), R.reshape(X, [4]), axis=0)
//!     Y = R.reshape(lv1, R.shape([1, 1, 4, 4]))
//! ```

use super::super::{Attrs, Importer, NodeProto, Out, input, invalid, req};
use super::call;
use crate::error::Result;
use crate::ir::{Constant, Dim};
use crate::op::{F64, Op, PadAttrs, PadMode, ScatterReduction};

/// The most output elements of one `MaxUnpool`.
const MAX_ELEMS: i64 = 1 << 28;

/// `MaxUnpool(X, I[, output_shape])`.
pub(super) fn max_unpool(
    im: &mut Importer<'_>,
    node: &NodeProto,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let i = im.expr(req(node, 1)?)?;
    let (xd, dt) = im.dims(x)?;
    let (id, _) = im.dims(i)?;
    if xd != id {
        return Err(invalid(format!(
            "MaxUnpool's indices must have the input's shape {xd:?}, found {id:?}"
        )));
    }
    let xs: Vec<i64> = xd
        .iter()
        .map(|d| d.as_static())
        .collect::<Option<_>>()
        .ok_or_else(|| invalid("MaxUnpool needs a static input shape"))?;
    if xs.len() < 3 {
        return Err(invalid(format!(
            "MaxUnpool needs an input of rank 3 or more (N, C, spatial…), found rank {}",
            xs.len()
        )));
    }
    let n = xs.len() - 2;
    let kernel = a
        .ints("kernel_shape")
        .filter(|k| k.len() == n && k.iter().all(|&v| v >= 1))
        .ok_or_else(|| invalid(format!("MaxUnpool needs `kernel_shape` of {n} values ≥ 1")))?;
    let strides = a.ints("strides").unwrap_or_else(|| vec![1; n]);
    let pads = a.ints("pads").unwrap_or_else(|| vec![0; 2 * n]);
    if strides.len() != n || strides.iter().any(|&s| s < 1) {
        return Err(invalid(format!(
            "MaxUnpool's `strides` must be {n} values ≥ 1, found {strides:?}"
        )));
    }
    if pads.len() != 2 * n || pads.iter().any(|&p| p < 0) {
        return Err(invalid(format!(
            "MaxUnpool's `pads` must be {} values ≥ 0, found {pads:?}",
            2 * n
        )));
    }
    // The indices address the inferred shape; an `output_shape` larger than it adds zeros
    // at the end of each axis (the ONNX reference's placement).
    let mut inferred = xs[..2].to_vec();
    for d in 0..n {
        inferred.push((xs[d + 2] - 1) * strides[d] + kernel[d] - pads[d] - pads[d + n]);
    }
    let out: Vec<i64> = match input(node, 2) {
        Some(s) => im.const_i64s(s)?,
        None => inferred.clone(),
    };
    if inferred.iter().any(|&d| d < 1) {
        return Err(invalid(format!(
            "MaxUnpool's kernel, strides and pads give an empty output {inferred:?}"
        )));
    }
    if out.len() != xs.len() || out.iter().zip(&inferred).any(|(o, i)| o < i) {
        return Err(invalid(format!(
            "MaxUnpool's output_shape {out:?} must have rank {} and hold the shape {inferred:?} \
             its kernel, strides and pads give",
            xs.len()
        )));
    }
    out.iter()
        .try_fold(1i64, |acc, &d| acc.checked_mul(d))
        .filter(|&t| t <= MAX_ELEMS)
        .ok_or_else(|| {
            invalid(format!(
                "MaxUnpool's output {out:?} has more than {MAX_ELEMS} elements"
            ))
        })?;
    // Within `out` on every axis, so within its element count.
    let total: i64 = inferred.iter().product();
    let numel: i64 = xs.iter().product();
    let zero = im.b.constant(Constant::scalar(0.0, dt));
    let flat_shape = im.b.shape(vec![Dim::Static(total)]);
    let zeros = im.emit(Op::BroadcastTo, vec![zero, flat_shape])?;
    let in_shape = im.b.shape(vec![Dim::Static(numel)]);
    let xf = im.emit(Op::Reshape, vec![x, in_shape])?;
    let in_shape = im.b.shape(vec![Dim::Static(numel)]);
    let idx = im.emit(Op::Reshape, vec![i, in_shape])?;
    let y = im.emit(
        Op::ScatterElements {
            axis: 0,
            reduction: ScatterReduction::Update,
        },
        vec![zeros, idx, xf],
    )?;
    let shape =
        im.b.shape(inferred.iter().copied().map(Dim::Static).collect());
    if out == inferred {
        return Ok(call(Op::Reshape, vec![y, shape]));
    }
    let y = im.emit(Op::Reshape, vec![y, shape])?;
    let pad_width = out
        .iter()
        .zip(&inferred)
        .flat_map(|(o, i)| [0, o - i])
        .collect();
    Ok(call(
        Op::Pad(Box::new(PadAttrs {
            pad_width,
            pad_value: F64(0.0),
            pad_mode: PadMode::Constant,
        })),
        vec![y],
    ))
}
