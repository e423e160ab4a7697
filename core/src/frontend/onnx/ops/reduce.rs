//! ONNX conversions of the reduction family (issue 17): `ReduceMin`, `ReduceProd`, `ReduceL1`,
//! `ReduceL2`, `ReduceLogSum`, `ReduceLogSumExp`, `ReduceSumSquare`, `ArgMax`, `ArgMin`,
//! `TopK`, `Einsum`, `LpNormalization` and `Hardmax`.
//!
//! Contract: `axes` is an attribute before opset 18 and a constant input from 18 on;
//! `noop_with_empty_axes` with no axes passes the input through; the composite reductions are
//! built as TVM's ONNX frontend builds them (`ReduceL2 = sqrt(sum(x * x))`, `ReduceLogSumExp`
//! with the maximum subtracted first). `select_last_index` reverses the axis and maps the index
//! back (`n - 1 - argmax(reverse(x))`). `TopK`'s `k` must be a constant; its indices are int64.
//! `LpNormalization` (p = 1 or 2) divides by the norm along `axis`, floored at the dtype's
//! smallest subnormal so an all-zero slice gives 0 as ONNX defines (a nonzero slice whose
//! norm underflows to 0 in its dtype is divided by that floor instead). `Hardmax` is
//! `take(eye(n), argmax(x))` moved back into place (`n × n` at most 2^24 elements).
//!
//! ```text
//! ReduceLogSumExp(x; axes=[1], keepdims=0)  →  m = R.max(x, axis=[1], keepdims=True)
//!                                              e = R.exp(R.subtract(x, m))
//!                                              s = R.log(R.sum(e, axis=[1], keepdims=False))
//!                                              y = R.add(s, R.max(x, axis=[1], keepdims=False))
//! ArgMax(x; axis=1, select_last_index=1)    →  r = R.strided_slice(x, axes=[1], begin=[-1],
//!                                                  end=[-n - 1], strides=[-1])
//!                                              y = R.subtract(R.const(n - 1), R.argmax(r, 1))
//! ```

use super::super::{Attrs, Importer, Out, Val, input, invalid, normalize_axis, req};
use super::call;
use crate::error::Result;
use crate::ir::{Constant, DType, ExprId, ExprKind};
use crate::op::{Op, ReduceAttrs, StridedSliceAttrs, TopkAttrs};

/// Which composite reduction.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Min,
    Prod,
    L1,
    L2,
    LogSum,
    LogSumExp,
    SumSquare,
}

fn red(axis: Option<Vec<i64>>, keepdims: bool) -> Box<ReduceAttrs> {
    Box::new(ReduceAttrs { axis, keepdims })
}

/// `ReduceMin`, `ReduceProd`, `ReduceL1`, `ReduceL2`, `ReduceLogSum`, `ReduceLogSumExp` and
/// `ReduceSumSquare`.
pub(crate) fn reduce(
    im: &mut Importer<'_>,
    node: &super::super::NodeProto,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let kind = match node.op_type.as_str() {
        "ReduceMin" => Kind::Min,
        "ReduceProd" => Kind::Prod,
        "ReduceL1" => Kind::L1,
        "ReduceL2" => Kind::L2,
        "ReduceLogSum" => Kind::LogSum,
        "ReduceLogSumExp" => Kind::LogSumExp,
        "ReduceSumSquare" => Kind::SumSquare,
        other => return Err(invalid(format!("internal: `{other}` is not a reduction"))),
    };
    let x = im.expr(req(node, 0)?)?;
    let axes = if im.opset >= 18 {
        match input(node, 1) {
            Some(n) => Some(im.const_i64s(n)?),
            None => None,
        }
    } else {
        a.ints("axes")
    };
    let axes = axes.filter(|v| !v.is_empty());
    if axes.is_none() && a.int("noop_with_empty_axes", 0) != 0 {
        return Ok(vec![Out::Val(Val::Expr(x))]);
    }
    let keepdims = a.int("keepdims", 1) != 0;
    let sum = |axes: &Option<Vec<i64>>| Op::Sum(red(axes.clone(), keepdims));
    match kind {
        Kind::Min => Ok(call(Op::Min(red(axes, keepdims)), vec![x])),
        Kind::Prod => Ok(call(Op::Prod(red(axes, keepdims)), vec![x])),
        Kind::L1 => {
            let ab = im.emit(Op::Abs, vec![x])?;
            Ok(call(sum(&axes), vec![ab]))
        }
        Kind::SumSquare | Kind::L2 => {
            let sq = im.emit(Op::Multiply, vec![x, x])?;
            if kind == Kind::SumSquare {
                return Ok(call(sum(&axes), vec![sq]));
            }
            let s = im.emit(sum(&axes), vec![sq])?;
            Ok(call(Op::Sqrt, vec![s]))
        }
        Kind::LogSum => {
            let s = im.emit(sum(&axes), vec![x])?;
            Ok(call(Op::Log, vec![s]))
        }
        Kind::LogSumExp => {
            let (_, dt) = im.dims(x)?;
            if !dt.is_float() {
                return Err(invalid(format!(
                    "ReduceLogSumExp needs a float input, found {dt}"
                )));
            }
            let mk = im.emit(Op::Max(red(axes.clone(), true)), vec![x])?;
            let d = im.emit(Op::Subtract, vec![x, mk])?;
            let e = im.emit(Op::Exp, vec![d])?;
            let s = im.emit(sum(&axes), vec![e])?;
            let l = im.emit(Op::Log, vec![s])?;
            let m = if keepdims {
                mk
            } else {
                im.emit(Op::Max(red(axes, false)), vec![x])?
            };
            Ok(call(Op::Add, vec![l, m]))
        }
    }
}

/// `ArgMax` / `ArgMin` (int64 indices; `select_last_index` picks the last of equal values).
pub(crate) fn arg(
    im: &mut Importer<'_>,
    node: &super::super::NodeProto,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let (dims, _) = im.dims(x)?;
    let axis = normalize_axis(a.int("axis", 0), dims.len())?;
    let keepdims = a.int("keepdims", 1) != 0;
    let mk = |axis: i64| {
        if node.op_type == "ArgMax" {
            Op::Argmax {
                axis: Some(axis),
                keepdims,
            }
        } else {
            Op::Argmin {
                axis: Some(axis),
                keepdims,
            }
        }
    };
    if a.int("select_last_index", 0) == 0 {
        return Ok(call(mk(axis as i64), vec![x]));
    }
    let n = dims
        .get(axis)
        .and_then(|d| d.as_static())
        .ok_or_else(|| invalid("select_last_index needs a static extent on the reduced axis"))?;
    let rev = im.emit(
        Op::StridedSlice(Box::new(StridedSliceAttrs {
            axes: vec![axis as i64],
            begin: vec![-1],
            end: vec![n.saturating_neg().saturating_sub(1)],
            strides: Some(vec![-1]),
            assume_inbound: false,
        })),
        vec![x],
    )?;
    let i = im.emit(mk(axis as i64), vec![rev])?;
    let last = im.b.constant(Constant::scalar((n - 1) as f64, DType::I64));
    Ok(call(Op::Subtract, vec![last, i]))
}

/// `TopK`: values and int64 indices along `axis`, sorted.
pub(crate) fn topk(
    im: &mut Importer<'_>,
    node: &super::super::NodeProto,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let (dims, _) = im.dims(x)?;
    let k = if im.opset >= 10 {
        match im.const_i64s(req(node, 1)?)?.as_slice() {
            [k] => *k,
            v => return Err(invalid(format!("`K` must hold one value, found {v:?}"))),
        }
    } else {
        a.int("k", 1)
    };
    if k < 0 {
        return Err(invalid(format!("`K` must not be negative, found {k}")));
    }
    let axis = normalize_axis(a.int("axis", -1), dims.len())?;
    let t = im.emit(
        Op::Topk(Box::new(TopkAttrs {
            k,
            axis: axis as i64,
            ret_type: "both".into(),
            largest: a.int("largest", 1) != 0,
            dtype: Some(DType::I64),
        })),
        vec![x],
    )?;
    Ok(vec![
        Out::Kind(ExprKind::TupleGetItem(t, 0)),
        Out::Kind(ExprKind::TupleGetItem(t, 1)),
    ])
}

/// `Einsum`: one `relax.einsum` over the inputs.
pub(crate) fn einsum(
    im: &mut Importer<'_>,
    node: &super::super::NodeProto,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    if !a.has("equation") {
        return Err(invalid("Einsum needs the `equation` attribute"));
    }
    let eq: String = a
        .string("equation", "")
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let mut fields: Vec<ExprId> = Vec::new();
    for n in node.input.iter().filter(|s| !s.is_empty()) {
        fields.push(im.expr(n)?);
    }
    let t = im.b.tuple(fields)?;
    Ok(call(
        Op::Einsum {
            subscripts: eq.into_boxed_str(),
        },
        vec![t],
    ))
}

/// The smallest positive (subnormal) value of a float dtype.
fn smallest_subnormal(dt: DType) -> Option<f64> {
    Some(match dt {
        DType::F64 => f64::from_bits(1),
        DType::F32 => f64::from(f32::from_bits(1)),
        DType::F16 => 2f64.powi(-24),
        DType::BF16 => 2f64.powi(-133),
        _ => return None,
    })
}

/// `LpNormalization` (p = 1 or 2) along `axis`.
pub(crate) fn lp_normalization(
    im: &mut Importer<'_>,
    node: &super::super::NodeProto,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let (dims, dt) = im.dims(x)?;
    let axis = normalize_axis(a.int("axis", -1), dims.len())? as i64;
    let tiny = smallest_subnormal(dt)
        .ok_or_else(|| invalid(format!("LpNormalization needs a float input, found {dt}")))?;
    let keep = red(Some(vec![axis]), true);
    let norm = match a.int("p", 2) {
        1 => {
            let ab = im.emit(Op::Abs, vec![x])?;
            im.emit(Op::Sum(keep), vec![ab])?
        }
        2 => {
            let sq = im.emit(Op::Multiply, vec![x, x])?;
            let s = im.emit(Op::Sum(keep), vec![sq])?;
            im.emit(Op::Sqrt, vec![s])?
        }
        p => {
            return Err(invalid(format!(
                "LpNormalization: p must be 1 or 2, found {p}"
            )));
        }
    };
    let t = im.scalar(tiny, dt);
    let floor = im.emit(Op::Maximum, vec![norm, t])?;
    Ok(call(Op::Divide, vec![x, floor]))
}

/// A constant of `dtype` and `shape` holding `values` (converted as [`Constant::scalar`]).
pub(crate) fn const_of(dtype: DType, shape: Vec<i64>, values: &[f64]) -> Result<Constant> {
    let bytes: Vec<u8> = values
        .iter()
        .flat_map(|&v| Constant::scalar(v, dtype).data.to_vec())
        .collect();
    Constant::from_bytes(dtype, shape, bytes).map_err(invalid)
}

/// The most elements of the identity matrix `Hardmax` builds (`n × n` for an axis of `n`).
const MAX_EYE: i64 = 1 << 24;

/// `Hardmax`: one-hot of the first largest element along `axis`, built as
/// `take(eye(n), argmax(x, axis), axis=0)` moved back into place. Before opset 13 the input
/// is coerced to 2-D at `axis` (default 1).
pub(crate) fn hardmax(
    im: &mut Importer<'_>,
    node: &super::super::NodeProto,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let (dims, dt) = im.dims(x)?;
    let r = dims.len();
    if im.opset >= 13 {
        let axis = normalize_axis(a.int("axis", -1), r)?;
        return Ok(vec![Out::Val(Val::Expr(hardmax_along(
            im, x, &dims, dt, axis,
        )?))]);
    }
    let axis = normalize_axis(a.int("axis", 1), r.max(1))?;
    let flat = vec![super::prod(&dims[..axis]), super::prod(&dims[axis..])];
    let s = im.b.shape(flat.clone());
    let x2 = im.emit(Op::Reshape, vec![x, s])?;
    let h = hardmax_along(im, x2, &flat, dt, 1)?;
    let back = im.b.shape(dims);
    Ok(call(Op::Reshape, vec![h, back]))
}

fn hardmax_along(
    im: &mut Importer<'_>,
    x: ExprId,
    dims: &[crate::ir::Dim],
    dt: DType,
    axis: usize,
) -> Result<ExprId> {
    let r = dims.len();
    let n = dims
        .get(axis)
        .and_then(|d| d.as_static())
        .ok_or_else(|| invalid("Hardmax needs a static extent on its axis"))?;
    if n.checked_mul(n).is_none_or(|e| e > MAX_EYE) {
        return Err(invalid(format!(
            "Hardmax over an axis of {n} elements is too large (at most {} elements of an \
             identity matrix)",
            MAX_EYE
        )));
    }
    let idx = im.emit(
        Op::Argmax {
            axis: Some(axis as i64),
            keepdims: false,
        },
        vec![x],
    )?;
    let nu = usize::try_from(n).map_err(|_| invalid("negative extent"))?;
    let eye: Vec<f64> = (0..nu * nu)
        .map(|i| if i / nu == i % nu { 1.0 } else { 0.0 })
        .collect();
    let eye = const_of(dt, vec![n, n], &eye)?;
    let e = im.b.constant(eye);
    let oh = im.take(e, 0, idx)?;
    if axis + 1 == r {
        return Ok(oh);
    }
    // `oh` is (dims without `axis`..., n): move the last axis to `axis`.
    let mut perm: Vec<i64> = (0..axis as i64).collect();
    perm.push(r as i64 - 1);
    perm.extend(axis as i64..r as i64 - 1);
    im.emit(Op::PermuteDims { axes: Some(perm) }, vec![oh])
}
