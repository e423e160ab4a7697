//! ONNX → op-set conversions of the elementwise comparison / logic / bitwise / `where` / math
//! family (issue 17), and the activations TVM's ONNX frontend decomposes into them.
//!
//! Contract: [`convert`] returns `Ok(None)` for an op type outside the family, so the caller
//! tries its other converters; otherwise the intermediate calls are emitted and the node's
//! single output returned. ONNX semantics per opset: `Mod`'s `fmod` picks `floor_mod` (0, the
//! default: the divisor's sign) or `mod` (1: the dividend's sign); `IsInf`'s
//! `detect_positive`/`detect_negative` become a `logical_and` with a sign test; `BitShift`'s
//! `direction` picks the shift; the activations follow their ONNX function bodies (scalar
//! constants in the input's dtype; `float16`/`bfloat16` inputs compute in `float32` and round
//! once at the end).
//!
//! ```text
//! HardSigmoid(x; alpha=0.2, beta=0.5)  →  lv = R.multiply(x, R.const(0.2, "float32"))
//!                                         lv1 = R.add(lv, R.const(0.5, "float32"))
//!                                         y = R.clip(lv1, R.prim_value(0), R.prim_value(1))
//! IsInf(x; detect_negative=0)          →  lv = R.isinf(x)
//!                                         lv1 = R.greater(x, R.const(0, "float32"))
//!                                         y = R.logical_and(lv, lv1)
//! ```

use super::{Attrs, Importer, Out, call, invalid, req};
use crate::error::Result;
use crate::ir::{DType, ExprId, PrimValue, Type};
use crate::op::{ElemOp, Op};

fn el(e: ElemOp) -> Op {
    Op::Elem(e)
}

/// The dtype of a tensor expression (its shape may be unknown).
fn dtype(im: &Importer<'_>, x: ExprId) -> Result<DType> {
    match im.ty(x) {
        Type::Tensor(t) => t
            .dtype
            .ok_or_else(|| invalid("expected a tensor of known dtype")),
        t => Err(invalid(format!("expected a tensor, found {t:?}"))),
    }
}

/// `x` as `float32` when its dtype is a half type (the activations compute in `float32` and
/// round once at the end, as onnxruntime's kernels do); the dtype to cast back to, if any.
fn widen(im: &mut Importer<'_>, x: ExprId, dt: DType) -> Result<(ExprId, DType, Option<DType>)> {
    if matches!(dt, DType::F16 | DType::BF16) {
        let w = im.emit(Op::Astype { dtype: DType::F32 }, vec![x])?;
        Ok((w, DType::F32, Some(dt)))
    } else {
        Ok((x, dt, None))
    }
}

/// The last call of a decomposition, cast back to `back` when the body was widened.
fn finish(
    im: &mut Importer<'_>,
    op: Op,
    args: Vec<ExprId>,
    back: Option<DType>,
) -> Result<Vec<Out>> {
    match back {
        None => Ok(call(op, args)),
        Some(d) => {
            let y = im.emit(op, args)?;
            Ok(call(Op::Astype { dtype: d }, vec![y]))
        }
    }
}

/// Converts `node` if its op type belongs to the family (see the module docs).
pub(crate) fn convert(
    im: &mut Importer<'_>,
    node: &crate::frontend::onnx::proto::NodeProto,
) -> Result<Option<Vec<Out>>> {
    let a = Attrs(node);
    let op = node.op_type.as_str();
    let unary = match op {
        "Not" => Some(ElemOp::LogicalNot),
        "BitwiseNot" => Some(ElemOp::BitwiseNot),
        "IsNaN" => Some(ElemOp::IsNan),
        "Floor" => Some(ElemOp::Floor),
        "Ceil" => Some(ElemOp::Ceil),
        "Round" => Some(ElemOp::Round),
        "Sign" => Some(ElemOp::Sign),
        "Sin" => Some(ElemOp::Sin),
        "Cos" => Some(ElemOp::Cos),
        "Tan" => Some(ElemOp::Tan),
        "Asin" => Some(ElemOp::Asin),
        "Acos" => Some(ElemOp::Acos),
        "Atan" => Some(ElemOp::Atan),
        "Sinh" => Some(ElemOp::Sinh),
        "Cosh" => Some(ElemOp::Cosh),
        "Asinh" => Some(ElemOp::Asinh),
        "Acosh" => Some(ElemOp::Acosh),
        "Atanh" => Some(ElemOp::Atanh),
        _ => None,
    };
    if let Some(e) = unary {
        let x = im.expr(req(node, 0)?)?;
        return Ok(Some(call(el(e), vec![x])));
    }
    let binary = match op {
        "Equal" => Some(ElemOp::Equal),
        "Less" => Some(ElemOp::Less),
        "LessOrEqual" => Some(ElemOp::LessEqual),
        "Greater" => Some(ElemOp::Greater),
        "GreaterOrEqual" => Some(ElemOp::GreaterEqual),
        "And" => Some(ElemOp::LogicalAnd),
        "Or" => Some(ElemOp::LogicalOr),
        "Xor" => Some(ElemOp::LogicalXor),
        "BitwiseAnd" => Some(ElemOp::BitwiseAnd),
        "BitwiseOr" => Some(ElemOp::BitwiseOr),
        "BitwiseXor" => Some(ElemOp::BitwiseXor),
        "BitShift" => match a.string("direction", "").as_str() {
            "LEFT" => Some(ElemOp::LeftShift),
            "RIGHT" => Some(ElemOp::RightShift),
            d => {
                return Err(invalid(format!(
                    "BitShift: expected direction \"LEFT\" or \"RIGHT\", found \"{d}\""
                )));
            }
        },
        "Mod" => match a.int("fmod", 0) {
            0 => Some(ElemOp::FloorMod),
            1 => Some(ElemOp::Mod),
            f => return Err(invalid(format!("Mod: expected fmod 0 or 1, found {f}"))),
        },
        _ => None,
    };
    if let Some(e) = binary {
        let x = im.expr(req(node, 0)?)?;
        let y = im.expr(req(node, 1)?)?;
        return Ok(Some(call(el(e), vec![x, y])));
    }
    Ok(Some(match op {
        "Where" => {
            let c = im.expr(req(node, 0)?)?;
            let x = im.expr(req(node, 1)?)?;
            let y = im.expr(req(node, 2)?)?;
            call(el(ElemOp::Where), vec![c, x, y])
        }
        "IsInf" => {
            let x = im.expr(req(node, 0)?)?;
            let pos = a.int("detect_positive", 1) != 0;
            let neg = a.int("detect_negative", 1) != 0;
            if pos && neg {
                return Ok(Some(call(el(ElemOp::IsInf), vec![x])));
            }
            let dt = dtype(im, x)?;
            let inf = im.emit(el(ElemOp::IsInf), vec![x])?;
            let side = if pos {
                let zero = im.scalar(0.0, dt);
                im.emit(el(ElemOp::Greater), vec![x, zero])?
            } else if neg {
                let zero = im.scalar(0.0, dt);
                im.emit(el(ElemOp::Less), vec![x, zero])?
            } else {
                // Neither sign: nothing is reported (an infinity is never NaN).
                im.emit(el(ElemOp::IsNan), vec![x])?
            };
            call(el(ElemOp::LogicalAnd), vec![inf, side])
        }
        "HardSigmoid" | "HardSwish" => {
            let x = im.expr(req(node, 0)?)?;
            let dt = dtype(im, x)?;
            let (x, dt, back) = widen(im, x, dt)?;
            let (alpha, beta) = if op == "HardSigmoid" {
                (a.float("alpha", 0.2), a.float("beta", 0.5))
            } else {
                (1.0 / 6.0, 0.5)
            };
            let al = im.scalar(alpha, dt);
            let be = im.scalar(beta, dt);
            let ax = im.emit(Op::Multiply, vec![x, al])?;
            let s = im.emit(Op::Add, vec![ax, be])?;
            let lo = im.b.prim(PrimValue::Float(0.0, dt));
            let hi = im.b.prim(PrimValue::Float(1.0, dt));
            if op == "HardSigmoid" {
                finish(im, Op::Clip, vec![s, lo, hi], back)?
            } else {
                let hs = im.emit(Op::Clip, vec![s, lo, hi])?;
                finish(im, Op::Multiply, vec![x, hs], back)?
            }
        }
        "Mish" => {
            // x * tanh(softplus(x)), softplus(x) = log(1 + exp(x)).
            let x = im.expr(req(node, 0)?)?;
            let dt = dtype(im, x)?;
            let (x, dt, back) = widen(im, x, dt)?;
            let one = im.scalar(1.0, dt);
            let ex = im.emit(Op::Exp, vec![x])?;
            let s = im.emit(Op::Add, vec![ex, one])?;
            let sp = im.emit(Op::Log, vec![s])?;
            let th = im.emit(Op::Tanh, vec![sp])?;
            finish(im, Op::Multiply, vec![x, th], back)?
        }
        "Softsign" => {
            let x = im.expr(req(node, 0)?)?;
            let dt = dtype(im, x)?;
            let (x, dt, back) = widen(im, x, dt)?;
            let one = im.scalar(1.0, dt);
            let ab = im.emit(Op::Abs, vec![x])?;
            let d = im.emit(Op::Add, vec![ab, one])?;
            finish(im, Op::Divide, vec![x, d], back)?
        }
        "Celu" => {
            // max(0, x) + min(0, alpha * (exp(x / alpha) - 1))
            let x = im.expr(req(node, 0)?)?;
            let dt = dtype(im, x)?;
            let (x, dt, back) = widen(im, x, dt)?;
            let alpha = a.float("alpha", 1.0);
            if alpha == 0.0 {
                return Err(invalid("Celu: alpha must not be 0"));
            }
            let al = im.scalar(alpha, dt);
            let one = im.scalar(1.0, dt);
            let zero = im.scalar(0.0, dt);
            let xa = im.emit(Op::Divide, vec![x, al])?;
            let ex = im.emit(Op::Exp, vec![xa])?;
            let em1 = im.emit(Op::Subtract, vec![ex, one])?;
            let neg = im.emit(Op::Multiply, vec![al, em1])?;
            let neg = im.emit(Op::Minimum, vec![zero, neg])?;
            let pos = im.emit(Op::Maximum, vec![zero, x])?;
            finish(im, Op::Add, vec![pos, neg], back)?
        }
        "ThresholdedRelu" => {
            let x = im.expr(req(node, 0)?)?;
            let dt = dtype(im, x)?;
            let al = im.scalar(a.float("alpha", 1.0), dt);
            let zero = im.scalar(0.0, dt);
            let m = im.emit(el(ElemOp::Greater), vec![x, al])?;
            call(el(ElemOp::Where), vec![m, x, zero])
        }
        "Shrink" => {
            // x < -lambd: x + bias; x > lambd: x - bias; else 0.
            let x = im.expr(req(node, 0)?)?;
            let dt = dtype(im, x)?;
            let lambd = a.float("lambd", 0.5);
            let bias = a.float("bias", 0.0);
            let nl = im.scalar(-lambd, dt);
            let pl = im.scalar(lambd, dt);
            let b = im.scalar(bias, dt);
            let zero = im.scalar(0.0, dt);
            let lo = im.emit(el(ElemOp::Less), vec![x, nl])?;
            let hi = im.emit(el(ElemOp::Greater), vec![x, pl])?;
            let xp = im.emit(Op::Add, vec![x, b])?;
            let xm = im.emit(Op::Subtract, vec![x, b])?;
            let inner = im.emit(el(ElemOp::Where), vec![hi, xm, zero])?;
            call(el(ElemOp::Where), vec![lo, xp, inner])
        }
        "Mean" => {
            let names: Vec<&str> = node
                .input
                .iter()
                .map(String::as_str)
                .filter(|s| !s.is_empty())
                .collect();
            let Some((first, rest)) = names.split_first() else {
                return Err(invalid("Mean needs at least one input"));
            };
            let mut acc = im.expr(first)?;
            for n in rest {
                let y = im.expr(n)?;
                acc = im.emit(Op::Add, vec![acc, y])?;
            }
            let dt = dtype(im, acc)?;
            let k = im.scalar(names.len() as f64, dt);
            call(Op::Divide, vec![acc, k])
        }
        "CastLike" => {
            let x = im.expr(req(node, 0)?)?;
            let like = im.expr(req(node, 1)?)?;
            let dt = dtype(im, like)?;
            call(Op::Astype { dtype: dt }, vec![x])
        }
        _ => return Ok(None),
    }))
}
