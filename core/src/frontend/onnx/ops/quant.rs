//! ONNX's linear quantization ops, composed from the op set at import time:
//! `QuantizeLinear`, `DequantizeLinear`, `DynamicQuantizeLinear`, `MatMulInteger`,
//! `QLinearMatMul`, `ConvInteger` and `QLinearConv` (the convolutions as `Conv` of the
//! zero-point-centred operands in `float64`; a weight's zero point and scale may be per output
//! channel).
//!
//! Contract: quantized tensors are `uint8` or `int8` (the only 8-bit types fusebox stores;
//! `MatMulInteger`'s result is `int32`). Scales and zero points are scalars (per tensor) or 1-D
//! along `axis` (per axis), or (`block_size > 0`, blocked quantization) of the input's shape
//! with one entry per block along `axis`, each repeated over its block. Rounding is
//! half to even and results saturate to the type's range, as ONNX defines. Integer products
//! are computed in `float64`, which is exact for 8-bit operands up to 2^37 terms per dot
//! product, then converted.
//!
//! ```text
//! y = QuantizeLinear(x: f32[4], s: f32[], z: u8[])
//!   → y = R.astype(R.clip(R.add(R.round(R.divide(x, s)), R.astype(z, "float32")), 0, 255), "uint8")
//! ```

use super::super::{
    Attrs, Importer, NodeProto, Out, Val, dims_str, dtype_of, input, invalid, normalize_axis, req,
};
use crate::error::Result;
use crate::ir::{Constant, DType, Dim, ExprId};
use crate::op::{ElemOp, Op, ReduceAttrs, TakeMode};

fn range_of(dt: DType) -> Result<(f64, f64)> {
    match dt {
        DType::U8 => Ok((0.0, 255.0)),
        DType::I8 => Ok((-128.0, 127.0)),
        other => Err(invalid(format!(
            "quantized type {other} is not supported (uint8 and int8 are)"
        ))),
    }
}

fn cast(im: &mut Importer<'_>, x: ExprId, dtype: DType) -> Result<ExprId> {
    if im.dims(x)?.1 == dtype {
        return Ok(x);
    }
    im.emit(Op::Astype { dtype }, vec![x])
}

/// `x` (a scale or zero point) reshaped to broadcast along `axis` of a rank-`rank` tensor when
/// it is 1-D with more than one element.
fn along(im: &mut Importer<'_>, x: ExprId, axis: Option<usize>, rank: usize) -> Result<ExprId> {
    let (d, _) = im.dims(x)?;
    match d.as_slice() {
        [] => Ok(x),
        [one] if *one == Dim::Static(1) => {
            let s = im.b.shape(vec![]);
            im.emit(Op::Reshape, vec![x, s])
        }
        [n] if rank > 0 => {
            let axis = axis.ok_or_else(|| {
                invalid(format!("`axis` is out of range for a rank-{rank} input"))
            })?;
            let mut shape = vec![Dim::Static(1); rank];
            shape[axis] = n.clone();
            let s = im.b.shape(shape);
            im.emit(Op::Reshape, vec![x, s])
        }
        _ => Err(invalid(format!(
            "scales and zero points must be scalars or 1-D (or, with block_size, of the \
             input's rank), found shape {d:?}"
        ))),
    }
}

/// round(x / scale) + zp, saturated and cast to `to` (x, scale in float `ft`).
fn quantize(
    im: &mut Importer<'_>,
    x: ExprId,
    scale: ExprId,
    zp: Option<ExprId>,
    to: DType,
    ft: DType,
) -> Result<ExprId> {
    let (lo, hi) = range_of(to)?;
    let q = im.emit(Op::Divide, vec![x, scale])?;
    let q = im.emit(Op::Elem(ElemOp::Round), vec![q])?;
    let q = match zp {
        Some(z) => {
            let zf = cast(im, z, ft)?;
            im.emit(Op::Add, vec![q, zf])?
        }
        None => q,
    };
    let lo = im.scalar(lo, ft);
    let hi = im.scalar(hi, ft);
    let q = im.emit(Op::Maximum, vec![q, lo])?;
    let q = im.emit(Op::Minimum, vec![q, hi])?;
    cast(im, q, to)
}

/// `block_size` (opset 21+): `None` for per-tensor or per-axis quantization.
fn block_size(a: &Attrs<'_>) -> Result<Option<i64>> {
    match a.int("block_size", 0) {
        0 => Ok(None),
        b if b > 0 => Ok(Some(b)),
        b => Err(invalid(format!("block_size must be ≥ 0, found {b}"))),
    }
}

/// A scale or zero point `v` made to broadcast against `x` (dims `xd`): per tensor or per
/// axis ([`along`]); blocked, each of its entries along `axis` repeated `block` times and the
/// last block cut to `x`'s extent (one `take` with a constant index), as ONNX's reference
/// does. A blocked `v` has `x`'s rank and extents except along `axis`, where it has one entry
/// per block.
fn spread(
    im: &mut Importer<'_>,
    v: ExprId,
    axis: Option<usize>,
    xd: &[Dim],
    block: Option<i64>,
) -> Result<ExprId> {
    let (vd, _) = im.dims(v)?;
    if vd.len() > 1 && vd.iter().all(|d| *d == Dim::Static(1)) {
        // One value, whatever its rank: a scalar, as the reference reads it.
        let s = im.b.shape(vec![]);
        return im.emit(Op::Reshape, vec![v, s]);
    }
    let Some(block) = block else {
        return along(im, v, axis, xd.len());
    };
    if vd.len() <= 1 && vd.first().is_none_or(|d| *d == Dim::Static(1)) {
        return along(im, v, axis, xd.len());
    }
    let axis = axis.ok_or_else(|| {
        invalid(format!(
            "`axis` is out of range for a rank-{} input",
            xd.len()
        ))
    })?;
    let others_agree = vd.len() == xd.len()
        && vd
            .iter()
            .zip(xd)
            .enumerate()
            .all(|(i, (v, x))| i == axis || v == x);
    let (Some(d), Some(nb)) = (xd[axis].as_static(), vd.get(axis).and_then(Dim::as_static)) else {
        return Err(invalid(
            "blocked quantization needs static extents along `axis`",
        ));
    };
    // Every block holds at least one element: (nb − 1)·block < d ≤ nb·block.
    let fits = nb >= 1
        && (nb - 1).checked_mul(block).is_some_and(|lo| lo < d)
        && nb.checked_mul(block).is_some_and(|hi| d <= hi);
    if !others_agree || !fits {
        return Err(invalid(format!(
            "blocked quantization (block_size {block}, axis {axis}): scales and zero points \
             must have the input's shape {} except {} blocks along the axis, found {}",
            dims_str(xd),
            d.div_euclid(block) + i64::from(d % block != 0),
            dims_str(&vd)
        )));
    }
    let index: Vec<u8> = (0..d).flat_map(|i| (i / block).to_le_bytes()).collect();
    let index = Constant::from_bytes(DType::I64, vec![d], index).map_err(invalid)?;
    let index = im.b.constant(index);
    im.emit(
        Op::Take {
            axis: Some(axis as i64),
            mode: TakeMode::Fast,
        },
        vec![v, index],
    )
}

/// `QuantizeLinear(x, y_scale[, y_zero_point])`.
pub(crate) fn quantize_linear(im: &mut Importer<'_>, node: &NodeProto) -> Result<Vec<Out>> {
    let a = Attrs(node);
    let block = block_size(&a)?;
    let x = im.expr(req(node, 0)?)?;
    let (xd, xt) = im.dims(x)?;
    let axis = normalize_axis(a.int("axis", 1), xd.len()).ok();
    let s = im.expr(req(node, 1)?)?;
    let (_, st) = im.dims(s)?;
    let zp = input(node, 2).map(|n| im.expr(n)).transpose()?;
    let to = match (zp, a.has("output_dtype")) {
        (Some(z), _) => im.dims(z)?.1,
        (None, true) => {
            let code = a.int("output_dtype", 2);
            dtype_of(i32::try_from(code).unwrap_or(-1))
                .ok_or_else(|| invalid(format!("output_dtype {code} is not supported")))?
        }
        (None, false) => DType::U8,
    };
    // Compute in the wider of x's and the scale's float types.
    let ft = if xt == DType::F64 || st == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let xf = cast(im, x, ft)?;
    let sf = cast(im, s, ft)?;
    let sf = spread(im, sf, axis, &xd, block)?;
    let zp = zp.map(|z| spread(im, z, axis, &xd, block)).transpose()?;
    let y = quantize(im, xf, sf, zp, to, ft)?;
    Ok(vec![Out::Val(Val::Expr(y))])
}

/// `DequantizeLinear(x, x_scale[, x_zero_point])`: `(x - zp) · scale` in the scale's type.
pub(crate) fn dequantize_linear(im: &mut Importer<'_>, node: &NodeProto) -> Result<Vec<Out>> {
    let a = Attrs(node);
    let block = block_size(&a)?;
    let x = im.expr(req(node, 0)?)?;
    let (xd, _) = im.dims(x)?;
    let axis = normalize_axis(a.int("axis", 1), xd.len()).ok();
    let s = im.expr(req(node, 1)?)?;
    let (_, st) = im.dims(s)?;
    if !st.is_float() {
        return Err(invalid(format!(
            "x_scale must be a float tensor, found {st}"
        )));
    }
    // Exact in f32 for 8-bit and in f64 for 32-bit integers.
    let wide = if st == DType::F64 || im.dims(x)?.1 == DType::I32 {
        DType::F64
    } else {
        DType::F32
    };
    let mut v = cast(im, x, wide)?;
    if let Some(z) = input(node, 2) {
        let z = im.expr(z)?;
        let z = cast(im, z, wide)?;
        let z = spread(im, z, axis, &xd, block)?;
        v = im.emit(Op::Subtract, vec![v, z])?;
    }
    let sw = cast(im, s, wide)?;
    let sw = spread(im, sw, axis, &xd, block)?;
    let y = im.emit(Op::Multiply, vec![v, sw])?;
    let y = cast(im, y, st)?;
    Ok(vec![Out::Val(Val::Expr(y))])
}

fn reduce(im: &mut Importer<'_>, op: fn(Box<ReduceAttrs>) -> Op, x: ExprId) -> Result<ExprId> {
    im.emit(
        op(Box::new(ReduceAttrs {
            axis: None,
            keepdims: false,
        })),
        vec![x],
    )
}

/// `DynamicQuantizeLinear(x)` → `y: uint8, y_scale: f32, y_zero_point: uint8`.
pub(crate) fn dynamic_quantize_linear(im: &mut Importer<'_>, node: &NodeProto) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let (_, xt) = im.dims(x)?;
    if xt != DType::F32 {
        return Err(invalid(format!("x must be float32, found {xt}")));
    }
    let zero = im.scalar(0.0, xt);
    // min(0, min(x)) = -max(0, max(-x)); max(0, max(x)).
    let neg = im.emit(Op::Negative, vec![x])?;
    let nmax = reduce(im, Op::Max, neg)?;
    let nmax = im.emit(Op::Maximum, vec![nmax, zero])?;
    let xmin = im.emit(Op::Negative, vec![nmax])?;
    let xmax = reduce(im, Op::Max, x)?;
    let xmax = im.emit(Op::Maximum, vec![xmax, zero])?;
    let span = im.emit(Op::Subtract, vec![xmax, xmin])?;
    let k = im.scalar(255.0, xt);
    let scale = im.emit(Op::Divide, vec![span, k])?;
    // zp = saturate(round(-x_min / scale)) as uint8.
    let zpf = im.emit(Op::Divide, vec![nmax, scale])?;
    let zp = quantize_plain(im, zpf, xt)?;
    let y = quantize(im, x, scale, Some(zp), DType::U8, xt)?;
    Ok(vec![
        Out::Val(Val::Expr(y)),
        Out::Val(Val::Expr(scale)),
        Out::Val(Val::Expr(zp)),
    ])
}

/// saturate(round(v)) as uint8.
fn quantize_plain(im: &mut Importer<'_>, v: ExprId, ft: DType) -> Result<ExprId> {
    let one = im.scalar(1.0, ft);
    quantize(im, v, one, None, DType::U8, ft)
}

/// `A - zp` in f64, with `zp` along `axis` (the rows of A or the columns of B).
fn centered(
    im: &mut Importer<'_>,
    x: ExprId,
    zp: Option<&str>,
    axis_from_end: usize,
) -> Result<ExprId> {
    let (xd, xt) = im.dims(x)?;
    range_of(xt)?;
    let xf = cast(im, x, DType::F64)?;
    let Some(z) = zp else { return Ok(xf) };
    let z = im.expr(z)?;
    let z = cast(im, z, DType::F64)?;
    let axis = xd.len().checked_sub(axis_from_end).ok_or_else(|| {
        invalid(format!(
            "expected a matrix operand, found rank {}",
            xd.len()
        ))
    })?;
    let z = along(im, z, Some(axis), xd.len())?;
    im.emit(Op::Subtract, vec![xf, z])
}

/// `MatMulInteger(A, B[, a_zero_point, b_zero_point])` → int32.
pub(crate) fn matmul_integer(im: &mut Importer<'_>, node: &NodeProto) -> Result<Vec<Out>> {
    let a = im.expr(req(node, 0)?)?;
    let b = im.expr(req(node, 1)?)?;
    let a = centered(im, a, input(node, 2), 2)?;
    let b = centered(im, b, input(node, 3), 1)?;
    let p = im.emit(Op::Matmul { out_dtype: None }, vec![a, b])?;
    let y = cast(im, p, DType::I32)?;
    Ok(vec![Out::Val(Val::Expr(y))])
}

/// `QLinearMatMul(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp)`.
pub(crate) fn qlinear_matmul(im: &mut Importer<'_>, node: &NodeProto) -> Result<Vec<Out>> {
    let a = im.expr(req(node, 0)?)?;
    let b = im.expr(req(node, 3)?)?;
    let a = centered(im, a, input(node, 2), 2)?;
    let b = centered(im, b, input(node, 5), 1)?;
    let acc = im.emit(Op::Matmul { out_dtype: None }, vec![a, b])?;
    let scale = |im: &mut Importer<'_>, i: usize, axis_from_end: usize| -> Result<ExprId> {
        let s = im.expr(req(node, i)?)?;
        let (ad, _) = im.dims(acc)?;
        let s = cast(im, s, DType::F64)?;
        along(im, s, ad.len().checked_sub(axis_from_end), ad.len())
    };
    let sa = scale(im, 1, 2)?;
    let sb = scale(im, 4, 1)?;
    let sy = scale(im, 6, 1)?;
    let yz = im.expr(req(node, 7)?)?;
    let (_, to) = im.dims(yz)?;
    let m = im.emit(Op::Multiply, vec![sa, sb])?;
    let m = im.emit(Op::Divide, vec![m, sy])?;
    let v = im.emit(Op::Multiply, vec![acc, m])?;
    let one = im.scalar(1.0, DType::F64);
    let (ad, _) = im.dims(acc)?;
    let yz = along(im, yz, ad.len().checked_sub(1), ad.len())?;
    let y = quantize(im, v, one, Some(yz), to, DType::F64)?;
    Ok(vec![Out::Val(Val::Expr(y))])
}

/// A converter's single output as an expression (bound to a fresh var when it is a call).
fn out_expr(im: &mut Importer<'_>, outs: Vec<Out>) -> Result<ExprId> {
    match outs.into_iter().next() {
        Some(Out::Val(Val::Expr(e))) => Ok(e),
        Some(Out::Kind(kind)) => {
            let v = im.b.emit_value("", kind, false)?;
            Ok(im.b.var(v))
        }
        _ => Err(invalid("internal: a convolution gave no value")),
    }
}

/// The convolution of the centred operands (`x − x_zp`, `w − w_zp` with `w_zp` per output
/// channel), in `float64`.
fn centered_conv(
    im: &mut Importer<'_>,
    node: &NodeProto,
    a: &Attrs<'_>,
    (xi, xzi, wi, wzi): (usize, usize, usize, usize),
) -> Result<ExprId> {
    let x = im.expr(req(node, xi)?)?;
    let w = im.expr(req(node, wi)?)?;
    let (xd, _) = im.dims(x)?;
    let (wd, _) = im.dims(w)?;
    let xc = centered(im, x, input(node, xzi), xd.len())?;
    // The weight's zero point runs along its first axis (the output channels).
    let wc = centered(im, w, input(node, wzi), wd.len())?;
    let outs = super::conv_of(im, xc, wc, None, a)?;
    out_expr(im, outs)
}

/// `ConvInteger(x, w[, x_zero_point, w_zero_point])` → int32.
pub(crate) fn conv_integer(
    im: &mut Importer<'_>,
    node: &NodeProto,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let acc = centered_conv(im, node, a, (0, 2, 1, 3))?;
    let y = cast(im, acc, DType::I32)?;
    Ok(vec![Out::Val(Val::Expr(y))])
}

/// `QLinearConv(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp[, bias])`: the int32 bias
/// (scale `x_scale · w_scale`, zero point 0) is added to the accumulator, which is rescaled by
/// `x_scale · w_scale / y_scale`, rounded half to even, offset by `y_zp` and saturated.
pub(crate) fn qlinear_conv(
    im: &mut Importer<'_>,
    node: &NodeProto,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let mut acc = centered_conv(im, node, a, (0, 2, 3, 5))?;
    let (ad, _) = im.dims(acc)?;
    let rank = ad.len();
    // Per output channel values run along axis 1 of the result.
    let channel = |im: &mut Importer<'_>, v: ExprId| -> Result<ExprId> {
        let v = cast(im, v, DType::F64)?;
        along(im, v, Some(1), rank)
    };
    if let Some(b) = input(node, 8) {
        let b = im.expr(b)?;
        let b = channel(im, b)?;
        acc = im.emit(Op::Add, vec![acc, b])?;
    }
    let sx = im.expr(req(node, 1)?)?;
    let sx = channel(im, sx)?;
    let sw = im.expr(req(node, 4)?)?;
    let sw = channel(im, sw)?;
    let sy = im.expr(req(node, 6)?)?;
    let sy = channel(im, sy)?;
    let yz = im.expr(req(node, 7)?)?;
    let (_, to) = im.dims(yz)?;
    let yz = along(im, yz, Some(1), rank)?;
    let m = im.emit(Op::Multiply, vec![sx, sw])?;
    let m = im.emit(Op::Divide, vec![m, sy])?;
    let v = im.emit(Op::Multiply, vec![acc, m])?;
    let one = im.scalar(1.0, DType::F64);
    let y = quantize(im, v, one, Some(yz), to, DType::F64)?;
    Ok(vec![Out::Val(Val::Expr(y))])
}
