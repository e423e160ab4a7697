//! ONNX's `MaxUnpool` (opsets 9, 11, 22): each value of `X` is written at its `I` index (a flat
//! index into the whole output, as `MaxPool`'s `Indices` output gives it), every other output
//! element is zero. One `scatter_elements` on the flattened zero output. And that `Indices`
//! output of a 1-D or 2-D `MaxPool` ([`max_pool_indices`]): the windows gathered, `argmax`.
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
use crate::ir::{Constant, Dim, ExprId};
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

/// The most window entries (`output pixels × kernel taps`) of one [`max_pool_indices`] table.
const MAX_WINDOW_TABLE: i64 = 1 << 24;

/// `MaxPool`'s `Indices` output for the 2-D pool `p` of `x` (`(N, C, H, W)`, static) whose
/// output planes are `oh × ow`: per output element, the flat index into `x` of the first
/// largest value of its window (row-major in the window, as ONNX's reference), `int64`
/// `(N, C, OH, OW)`. `storage_order` 1 counts the plane column-major (`w·H + h`).
///
/// Lowered with existing ops: the plane flattened with one `-inf` appended (the target of
/// window positions in the padding), every window gathered by one `take` of a constant
/// `(OH·OW, taps)` table, `argmax` over the taps, and the winner's plane offset looked up in
/// the same table, plus each plane's base `(n·C + c)·H·W`.
pub(super) fn max_pool_indices(
    im: &mut Importer<'_>,
    x: ExprId,
    p: &crate::op::Pool2dAttrs,
    (oh, ow): (i64, i64),
    storage_order: i64,
) -> Result<ExprId> {
    let (xd, dt) = im.dims(x)?;
    let xs: Vec<i64> = xd
        .iter()
        .map(Dim::as_static)
        .collect::<Option<_>>()
        .ok_or_else(|| invalid("MaxPool's Indices output needs a static input shape"))?;
    let [n, c, h, w] = xs[..] else {
        return Err(invalid("internal: MaxPool's Indices from a non-4-D input"));
    };
    if !dt.is_float() {
        return Err(invalid(format!(
            "MaxPool's Indices output of {dt} data: only floating-point inputs are supported"
        )));
    }
    let (kh, kw) = (p.pool_size[0], p.pool_size[1]);
    let taps = kh * kw;
    let pix = oh * ow;
    pix.checked_mul(taps)
        .filter(|&t| t <= MAX_WINDOW_TABLE)
        .ok_or_else(|| {
            invalid(format!(
                "MaxPool's Indices: {pix} output pixels × {taps} taps exceed {MAX_WINDOW_TABLE}"
            ))
        })?;
    let plane = h * w;
    // Window table: plane offset of tap (a, b) of output pixel (i, j), or `plane` (the
    // appended -inf) outside the image; and the offset as the Indices count it.
    let mut gather = Vec::with_capacity((pix * taps) as usize);
    let mut index = Vec::with_capacity((pix * taps) as usize);
    for i in 0..oh {
        for j in 0..ow {
            for a in 0..kh {
                for b in 0..kw {
                    let y = i * p.strides[0] - p.padding[0] + a * p.dilation[0];
                    let x = j * p.strides[1] - p.padding[1] + b * p.dilation[1];
                    let inside = (0..h).contains(&y) && (0..w).contains(&x);
                    gather.push(if inside { y * w + x } else { plane });
                    index.push(match (inside, storage_order) {
                        (false, _) => 0,
                        (true, 0) => y * w + x,
                        (true, _) => x * h + y,
                    });
                }
            }
        }
    }
    let planes = n * c;
    let flat_shape = im.b.shape(vec![Dim::Static(planes), Dim::Static(plane)]);
    let flat = im.emit(Op::Reshape, vec![x, flat_shape])?;
    let padded = im.emit(
        Op::Pad(Box::new(PadAttrs {
            pad_width: vec![0, 0, 0, 1],
            pad_value: F64(f64::NEG_INFINITY),
            pad_mode: PadMode::Constant,
        })),
        vec![flat],
    )?;
    let table = im.i64_const(vec![pix, taps], &gather)?;
    let windows = im.take(padded, 1, table)?;
    let winner = im.emit(
        Op::Argmax {
            axis: Some(2),
            keepdims: false,
        },
        vec![windows],
    )?;
    // Entry `pixel · taps + winner` of the flattened index table.
    let starts: Vec<i64> = (0..pix).map(|q| q * taps).collect();
    let starts = im.i64_const(vec![pix], &starts)?;
    let at = im.emit(Op::Add, vec![winner, starts])?;
    let index = im.i64_const(vec![pix * taps], &index)?;
    let offset = im.take(index, 0, at)?;
    // Each plane's base (n·C + c)·H·W, made when the model runs (N·C is the model's to say:
    // a constant of that many values could be any size).
    let bases = im.emit(
        Op::Arange(Box::new(crate::op::ArangeAttrs {
            start: F64(0.0),
            end: F64((planes as f64) * (plane as f64)),
            step: F64(plane as f64),
            dtype: crate::ir::DType::I64,
        })),
        vec![],
    )?;
    let col = im.b.shape(vec![Dim::Static(planes), Dim::Static(1)]);
    let bases = im.emit(Op::Reshape, vec![bases, col])?;
    let flat_idx = im.emit(Op::Add, vec![offset, bases])?;
    let shape =
        im.b.shape([n, c, oh, ow].into_iter().map(Dim::Static).collect());
    im.emit(Op::Reshape, vec![flat_idx, shape])
}
