//! ONNX op → op-set conversions, one arm per op type, with ONNX semantics per opset.
//!
//! Contract: [`convert`] emits the intermediate calls of a node with fresh names and returns one
//! [`Out`] per supported output; the importer binds each to a var named after the ONNX output.
//! Attribute-vs-input differences between opsets are handled here (`axes` of Unsqueeze/Squeeze/
//! Reduce*, `split` of Split, `min`/`max` of Clip, `starts`… of Slice).
//!
//! ```text
//! Gemm(A, B, C; transB=1, alpha=0.5)  →  lv = R.permute_dims(B)
//!                                        lv1 = R.matmul(A, lv)
//!                                        lv2 = R.multiply(lv1, R.const(0.5))
//!                                        y = R.add(lv2, C)
//! ```

mod attention;
mod conv3d;
mod deform;
mod dynamic;
mod elem;
mod generate;
mod image;
mod loss;
mod nn;
mod pool;
mod quant;
mod reduce;
mod rnn;
mod set;
mod signal;
mod tfidf;
mod unpool;

use super::{Attrs, Importer, Out, Val, input, invalid, normalize_axis, req};
use crate::error::Result;
use crate::ir::{Callee, Constant, DType, Dim, ExprId, ExprKind, PrimValue};
use crate::op::{
    AdaptivePool2dAttrs, BatchNormAttrs, Conv2dAttrs, F64, LrnAttrs, Op, ReduceAttrs, SplitAttrs,
    SplitSpec, StridedSliceAttrs, TakeMode,
};

mod index;

/// The dtype a `Cast` or `BitCast` converts to (its `to` attribute).
fn to_dtype(a: &Attrs<'_>) -> Result<DType> {
    let code = a.int("to", 0);
    super::dtype_of(code as i32).ok_or_else(|| invalid(format!("unsupported target type {code}")))
}

fn call(op: Op, args: Vec<ExprId>) -> Vec<Out> {
    vec![Out::Kind(ExprKind::Call {
        callee: Callee::Op(op),
        args,
    })]
}

fn prod(d: &[Dim]) -> Dim {
    d.iter().fold(Dim::Static(1), |acc, x| acc.mul(x))
}

/// Converts one node (see the module docs).
pub(crate) fn convert(im: &mut Importer<'_>, node: &super::NodeProto) -> Result<Vec<Out>> {
    if let Some(outs) = elem::convert(im, node)? {
        return Ok(outs);
    }
    let a = Attrs(node);
    let op = node.op_type.as_str();
    let unary = |op: Op| -> Option<Op> { Some(op) };
    let simple = match op {
        "Relu" => unary(Op::Relu),
        "Sqrt" => unary(Op::Sqrt),
        "Erf" => unary(Op::Erf),
        "Tanh" => unary(Op::Tanh),
        "Sigmoid" => unary(Op::Sigmoid),
        "Exp" => unary(Op::Exp),
        "Log" => unary(Op::Log),
        "Neg" => unary(Op::Negative),
        "Abs" => unary(Op::Abs),
        _ => None,
    };
    if let Some(o) = simple {
        let x = im.expr(req(node, 0)?)?;
        return Ok(call(o, vec![x]));
    }
    match op {
        "HannWindow" | "HammingWindow" | "BlackmanWindow" => generate::window(im, node),
        "EyeLike" => generate::eye_like(im, node),
        "RNN" | "GRU" | "LSTM" => rnn::recurrent(im, node),
        "NegativeLogLikelihoodLoss" => loss::negative_log_likelihood(im, node),
        "SoftmaxCrossEntropyLoss" => loss::softmax_cross_entropy(im, node),
        "QuantizeLinear" => quant::quantize_linear(im, node),
        "DequantizeLinear" => quant::dequantize_linear(im, node),
        "DynamicQuantizeLinear" => quant::dynamic_quantize_linear(im, node),
        "MatMulInteger" => quant::matmul_integer(im, node),
        "QLinearMatMul" => quant::qlinear_matmul(im, node),
        "ConvInteger" => quant::conv_integer(im, node, &a),
        "QLinearConv" => quant::qlinear_conv(im, node, &a),
        "Swish" | "SwiGLU" => {
            // Swish: x * sigmoid(alpha * x) (opset 24); SwiGLU(a, b): Swish(a) * b, the two of
            // one shape and dtype (opset 28).
            let x = im.expr(req(node, 0)?)?;
            let (xd, dt) = im.dims(x)?;
            let alpha = a.float("alpha", 1.0);
            let ax = if alpha == 1.0 {
                x
            } else {
                let al = im.scalar(alpha, dt);
                im.emit(Op::Multiply, vec![x, al])?
            };
            let s = im.emit(Op::Sigmoid, vec![ax])?;
            if op == "Swish" {
                return Ok(call(Op::Multiply, vec![x, s]));
            }
            let b = im.expr(req(node, 1)?)?;
            let (bd, bt) = im.dims(b)?;
            if bd != xd || bt != dt {
                return Err(invalid(format!(
                    "SwiGLU's A and B must have one shape and dtype (no broadcasting), found \
                     {dt} {} and {bt} {}",
                    super::dims_str(&xd),
                    super::dims_str(&bd)
                )));
            }
            let g = im.emit(Op::Multiply, vec![x, s])?;
            Ok(call(Op::Multiply, vec![g, b]))
        }
        "Add" | "Sub" | "Mul" | "Div" | "Pow" => {
            let x = im.expr(req(node, 0)?)?;
            let mut y = im.expr(req(node, 1)?)?;
            let o = match op {
                "Add" => Op::Add,
                "Sub" => Op::Subtract,
                "Mul" => Op::Multiply,
                "Div" => Op::Divide,
                _ => Op::Power,
            };
            if op == "Pow" {
                let (_, dx) = im.dims(x)?;
                let (_, dy) = im.dims(y)?;
                if dx != dy {
                    y = im.emit(Op::Astype { dtype: dx }, vec![y])?;
                }
            }
            Ok(call(o, vec![x, y]))
        }
        "Sum" | "Max" | "Min" => {
            let o = match op {
                "Sum" => Op::Add,
                "Max" => Op::Maximum,
                _ => Op::Minimum,
            };
            let names: Vec<&str> = node
                .input
                .iter()
                .map(String::as_str)
                .filter(|s| !s.is_empty())
                .collect();
            let Some((first, rest)) = names.split_first() else {
                return Err(invalid("needs at least one input"));
            };
            let mut acc = im.expr(first)?;
            if rest.is_empty() {
                return Ok(vec![Out::Val(Val::Expr(acc))]);
            }
            for (i, n) in rest.iter().enumerate() {
                let y = im.expr(n)?;
                if i + 1 == rest.len() {
                    return Ok(call(o, vec![acc, y]));
                }
                acc = im.emit(o.clone(), vec![acc, y])?;
            }
            Ok(vec![Out::Val(Val::Expr(acc))])
        }
        "Reciprocal" => {
            let x = im.expr(req(node, 0)?)?;
            let (_, dt) = im.dims(x)?;
            let one = im.scalar(1.0, dt);
            Ok(call(Op::Divide, vec![one, x]))
        }
        "LeakyRelu" => {
            let x = im.expr(req(node, 0)?)?;
            let (_, dt) = im.dims(x)?;
            let alpha = a.float("alpha", 0.01);
            let al = im.scalar(alpha, dt);
            let ax = im.emit(Op::Multiply, vec![x, al])?;
            // max(x, αx) is leaky relu for α ≤ 1; min(x, αx) for α > 1.
            let o = if alpha <= 1.0 {
                Op::Maximum
            } else {
                Op::Minimum
            };
            Ok(call(o, vec![x, ax]))
        }
        "PRelu" => {
            // relu(x) - slope * relu(-x)
            let x = im.expr(req(node, 0)?)?;
            let mut slope = im.expr(req(node, 1)?)?;
            let (xd, _) = im.dims(x)?;
            let (sd, _) = im.dims(slope)?;
            // A per-channel slope `[C]` (old exporters) applies along axis 1.
            if let [c] = sd.as_slice()
                && xd.len() > 2
                && xd.get(1) == Some(c)
                && xd.last() != Some(c)
            {
                let mut shape = vec![c.clone()];
                shape.resize(xd.len() - 1, Dim::Static(1));
                let s = im.b.shape(shape);
                slope = im.emit(Op::Reshape, vec![slope, s])?;
            }
            let pos = im.emit(Op::Relu, vec![x])?;
            let nx = im.emit(Op::Negative, vec![x])?;
            let rn = im.emit(Op::Relu, vec![nx])?;
            let sn = im.emit(Op::Multiply, vec![slope, rn])?;
            Ok(call(Op::Subtract, vec![pos, sn]))
        }
        "Elu" | "Selu" => {
            // relu(x) + α (exp(min(x, 0)) - 1), times γ for Selu.
            let x = im.expr(req(node, 0)?)?;
            let (_, dt) = im.dims(x)?;
            let (alpha, gamma) = if op == "Elu" {
                (a.float("alpha", 1.0), None)
            } else {
                (
                    a.float("alpha", 1.673_263_192_176_818_8),
                    Some(a.float("gamma", 1.050_701_022_148_132_3)),
                )
            };
            let zero = im.scalar(0.0, dt);
            let one = im.scalar(1.0, dt);
            let al = im.scalar(alpha, dt);
            let pos = im.emit(Op::Relu, vec![x])?;
            let mn = im.emit(Op::Minimum, vec![x, zero])?;
            let ex = im.emit(Op::Exp, vec![mn])?;
            let em1 = im.emit(Op::Subtract, vec![ex, one])?;
            let neg = im.emit(Op::Multiply, vec![em1, al])?;
            match gamma {
                None => Ok(call(Op::Add, vec![pos, neg])),
                Some(g) => {
                    let s = im.emit(Op::Add, vec![pos, neg])?;
                    let ge = im.scalar(g, dt);
                    Ok(call(Op::Multiply, vec![s, ge]))
                }
            }
        }
        "Softplus" => {
            let x = im.expr(req(node, 0)?)?;
            let (_, dt) = im.dims(x)?;
            let one = im.scalar(1.0, dt);
            let ex = im.emit(Op::Exp, vec![x])?;
            let s = im.emit(Op::Add, vec![ex, one])?;
            Ok(call(Op::Log, vec![s]))
        }
        "Gelu" => {
            let x = im.expr(req(node, 0)?)?;
            match a.string("approximate", "none").as_str() {
                "tanh" => Ok(call(Op::GeluTanh, vec![x])),
                _ => Ok(call(Op::Gelu, vec![x])),
            }
        }
        "MatMul" => {
            let x = im.expr(req(node, 0)?)?;
            let y = im.expr(req(node, 1)?)?;
            Ok(call(Op::Matmul { out_dtype: None }, vec![x, y]))
        }
        "Gemm" => {
            let mut x = im.expr(req(node, 0)?)?;
            let mut w = im.expr(req(node, 1)?)?;
            let (_, dt) = im.dims(x)?;
            if a.int("transA", 0) != 0 {
                x = im.emit(Op::PermuteDims { axes: None }, vec![x])?;
            }
            if a.int("transB", 0) != 0 {
                w = im.emit(Op::PermuteDims { axes: None }, vec![w])?;
            }
            let alpha = a.float("alpha", 1.0);
            let beta = a.float("beta", 1.0);
            let c = input(node, 2);
            let mm = Op::Matmul { out_dtype: None };
            if c.is_none() && alpha == 1.0 {
                return Ok(call(mm, vec![x, w]));
            }
            let mut y = im.emit(mm, vec![x, w])?;
            if alpha != 1.0 {
                let al = im.scalar(alpha, dt);
                if c.is_none() {
                    return Ok(call(Op::Multiply, vec![y, al]));
                }
                y = im.emit(Op::Multiply, vec![y, al])?;
            }
            let Some(c) = c else {
                return Ok(vec![Out::Val(Val::Expr(y))]);
            };
            let mut ce = im.expr(c)?;
            if beta != 1.0 {
                let be = im.scalar(beta, dt);
                ce = im.emit(Op::Multiply, vec![ce, be])?;
            }
            Ok(call(Op::Add, vec![y, ce]))
        }
        "Softmax" | "LogSoftmax" => {
            let x = im.expr(req(node, 0)?)?;
            let mk = |axis: i64| {
                if op == "Softmax" {
                    Op::Softmax { axis }
                } else {
                    Op::LogSoftmax { axis }
                }
            };
            if im.opset >= 13 {
                // One axis: the rank is all it needs (the dims may be unknown).
                return Ok(call(mk(a.int("axis", -1)), vec![x]));
            }
            let (dims, _) = im.dims(x)?;
            let r = dims.len();
            let axis = normalize_axis(a.int("axis", 1), r.max(1))?;
            if axis + 1 >= r {
                return Ok(call(mk(-1), vec![x]));
            }
            // Opsets before 13 flatten to 2-D at `axis`.
            let flat = vec![prod(&dims[..axis]), prod(&dims[axis..])];
            let s = im.b.shape(flat);
            let x2 = im.emit(Op::Reshape, vec![x, s])?;
            let y2 = im.emit(mk(-1), vec![x2])?;
            let back = im.b.shape(dims);
            Ok(call(Op::Reshape, vec![y2, back]))
        }
        "BatchNormalization" => {
            // training_mode=1 (opset 14+): normalise with the batch's statistics and also
            // return the running ones, `running * momentum + batch * (1 - momentum)` in ONNX's
            // convention, which is TVM's with momentum `1 - momentum`.
            let training = match a.int("training_mode", 0) {
                0 => false,
                1 => true,
                v => return Err(invalid(format!("training_mode must be 0 or 1, found {v}"))),
            };
            let momentum = a.float("momentum", 0.9);
            let mut args = Vec::new();
            for i in 0..5 {
                args.push(im.expr(req(node, i)?)?);
            }
            let bn = im.emit(
                Op::BatchNorm(Box::new(BatchNormAttrs {
                    axis: 1,
                    epsilon: F64(a.float("epsilon", 1e-5)),
                    center: true,
                    scale: true,
                    momentum: F64(if training { 1.0 - momentum } else { momentum }),
                    training,
                })),
                args,
            )?;
            let outs: u32 = if training {
                node.output.len().clamp(1, 3) as u32
            } else {
                1
            };
            Ok((0..outs)
                .map(|i| Out::Kind(ExprKind::TupleGetItem(bn, i)))
                .collect())
        }
        "Cast" => {
            let x = im.expr(req(node, 0)?)?;
            Ok(call(
                Op::Astype {
                    dtype: to_dtype(&a)?,
                },
                vec![x],
            ))
        }
        "Det" => Ok(call(Op::Det, vec![im.expr(req(node, 0)?)?])),
        "TfIdfVectorizer" => tfidf::tfidf_vectorizer(im, node, &a),
        "BitCast" => {
            let x = im.expr(req(node, 0)?)?;
            Ok(call(
                Op::Bitcast {
                    dtype: to_dtype(&a)?,
                },
                vec![x],
            ))
        }
        "Clip" => {
            let x = im.expr(req(node, 0)?)?;
            let (_, dt) = im.dims(x)?;
            let big = if dt == DType::F64 {
                f64::MAX
            } else {
                f64::from(f32::MAX)
            };
            let (lo, hi) = if im.opset >= 11 {
                let bound = |im: &Importer<'_>, i: usize, d: f64| -> Result<f64> {
                    match input(node, i) {
                        Some(n) => im
                            .const_f64s(n)?
                            .first()
                            .copied()
                            .ok_or_else(|| invalid("empty Clip bound")),
                        None => Ok(d),
                    }
                };
                (bound(im, 1, -big)?, bound(im, 2, big)?)
            } else {
                (a.float("min", -big), a.float("max", big))
            };
            let lo = im.b.prim(PrimValue::Float(lo, dt));
            let hi = im.b.prim(PrimValue::Float(hi, dt));
            Ok(call(Op::Clip, vec![x, lo, hi]))
        }
        "LRN" => {
            let x = im.expr(req(node, 0)?)?;
            let size = a.int("size", 0);
            if size < 1 {
                return Err(invalid("LRN needs `size` ≥ 1"));
            }
            Ok(call(
                Op::Lrn(Box::new(LrnAttrs {
                    size,
                    axis: 1,
                    alpha: F64(a.float("alpha", 1e-4)),
                    beta: F64(a.float("beta", 0.75)),
                    bias: F64(a.float("bias", 1.0)),
                })),
                vec![x],
            ))
        }
        "Transpose" => {
            let x = im.expr(req(node, 0)?)?;
            Ok(call(
                Op::PermuteDims {
                    axes: a.ints("perm"),
                },
                vec![x],
            ))
        }
        "Reshape" | "Expand" => {
            let x = im.expr(req(node, 0)?)?;
            let (dims, _) = im.dims(x)?;
            let target = im.const_dims(req(node, 1)?)?;
            if op == "Expand" {
                let shape = broadcast_shapes(&dims, &target)?;
                let s = im.b.shape(shape);
                return Ok(call(Op::BroadcastTo, vec![x, s]));
            }
            let allowzero = a.int("allowzero", 0) != 0;
            let mut out = Vec::new();
            for (i, d) in target.iter().enumerate() {
                out.push(match d.as_static() {
                    Some(0) if !allowzero => dims
                        .get(i)
                        .cloned()
                        .ok_or_else(|| invalid("a 0 in the new shape is past the input's rank"))?,
                    _ => d.clone(),
                });
            }
            // Resolve a -1 when everything is static.
            if let Some(h) = out.iter().position(|d| *d == Dim::Static(-1)) {
                let rest: Vec<Dim> = out
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != h)
                    .map(|(_, d)| d.clone())
                    .collect();
                if let (Some(total), Some(known)) =
                    (prod(&dims).as_static(), prod(&rest).as_static())
                    && known > 0
                    && total % known == 0
                {
                    out[h] = Dim::Static(total / known);
                }
            }
            let s = im.b.shape(out);
            Ok(call(Op::Reshape, vec![x, s]))
        }
        "Flatten" => {
            let x = im.expr(req(node, 0)?)?;
            let (dims, _) = im.dims(x)?;
            let r = dims.len();
            let ax = a.int("axis", 1);
            let axis = if ax == r as i64 {
                r
            } else {
                normalize_axis(ax, r)?
            };
            let s = im.b.shape(vec![prod(&dims[..axis]), prod(&dims[axis..])]);
            Ok(call(Op::Reshape, vec![x, s]))
        }
        "Concat" => {
            let mut fields = Vec::new();
            for n in node.input.iter().filter(|s| !s.is_empty()) {
                fields.push(im.expr(n)?);
            }
            let t = im.b.tuple(fields)?;
            Ok(call(
                Op::Concat {
                    axis: Some(a.int("axis", 0)),
                },
                vec![t],
            ))
        }
        "Split" => {
            let x = im.expr(req(node, 0)?)?;
            let (dims, _) = im.dims(x)?;
            let axis = normalize_axis(a.int("axis", 0), dims.len())?;
            let n_out = node.output.len();
            let sizes = match input(node, 1) {
                Some(s) if im.opset >= 13 => Some(im.const_i64s(s)?),
                _ => a.ints("split"),
            };
            let spec = match sizes {
                Some(sz) if !sz.is_empty() => {
                    if sz.len() != n_out {
                        return Err(invalid(format!(
                            "`split` has {} sizes {sz:?} but the node has {n_out} outputs",
                            sz.len()
                        )));
                    }
                    if let Some(s) = sz.iter().find(|s| **s < 0) {
                        return Err(invalid(format!(
                            "`split` sizes {sz:?} hold the negative size {s}; expected sizes ≥ 0"
                        )));
                    }
                    let total = sz.iter().try_fold(0i64, |a, s| a.checked_add(*s));
                    match (total, dims[axis].as_static()) {
                        (Some(t), Some(len)) if t == len => {}
                        (_, Some(len)) => {
                            return Err(invalid(format!(
                                "`split` sizes {sz:?} do not add up to the extent {len} of axis \
                                 {axis}"
                            )));
                        }
                        // A symbolic extent: the sizes are its value (checked when it is bound).
                        (_, None) => {}
                    }
                    let mut idx = Vec::new();
                    let mut acc = 0i64;
                    for s in &sz[..sz.len() - 1] {
                        acc = acc.saturating_add(*s);
                        idx.push(acc);
                    }
                    SplitSpec::Indices(idx)
                }
                _ => {
                    let n = a.int("num_outputs", n_out as i64);
                    if n != n_out as i64 {
                        return Err(invalid(format!(
                            "num_outputs is {n} but the node has {n_out} outputs"
                        )));
                    }
                    if let Some(len) = dims[axis].as_static()
                        && n > 0
                        && len % n != 0
                    {
                        // Opset 18: the last chunk is smaller (ceil-sized chunks).
                        let chunk = (len + n - 1) / n;
                        SplitSpec::Indices((1..n).map(|i| (i * chunk).min(len)).collect())
                    } else {
                        SplitSpec::Sections(n.max(1))
                    }
                }
            };
            let t = im.emit(
                Op::Split(Box::new(SplitAttrs {
                    indices_or_sections: spec,
                    axis: axis as i64,
                })),
                vec![x],
            )?;
            Ok((0..n_out)
                .map(|i| Out::Kind(ExprKind::TupleGetItem(t, i as u32)))
                .collect())
        }
        "Slice" => {
            if let Some(out) = dynamic::slice(im, node)? {
                return Ok(out);
            }
            let x = im.expr(req(node, 0)?)?;
            let (dims, _) = im.dims(x)?;
            let (starts, ends, axes, steps) = if im.opset >= 10 {
                let st = im.const_i64s(req(node, 1)?)?;
                let en = im.const_i64s(req(node, 2)?)?;
                let ax = match input(node, 3) {
                    Some(n) => Some(im.const_i64s(n)?),
                    None => None,
                };
                let sp = match input(node, 4) {
                    Some(n) => Some(im.const_i64s(n)?),
                    None => None,
                };
                (st, en, ax, sp)
            } else {
                (
                    a.ints("starts").unwrap_or_default(),
                    a.ints("ends").unwrap_or_default(),
                    a.ints("axes"),
                    None,
                )
            };
            let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
            let axes: Vec<i64> = axes
                .iter()
                .map(|&ax| normalize_axis(ax, dims.len()).map(|v| v as i64))
                .collect::<Result<_>>()?;
            if ends.len() != axes.len() || starts.len() != axes.len() {
                return Err(invalid("starts, ends and axes differ in length"));
            }
            Ok(call(
                Op::StridedSlice(Box::new(StridedSliceAttrs {
                    axes,
                    begin: starts,
                    end: ends,
                    strides: steps,
                    assume_inbound: false,
                })),
                vec![x],
            ))
        }
        "Gather" => {
            let x = im.expr(req(node, 0)?)?;
            let (dims, _) = im.dims(x)?;
            let axis = normalize_axis(a.int("axis", 0), dims.len())?;
            let iname = req(node, 1)?;
            // Constant negative indices count from the end: normalise them here.
            let idx = match (im.val(iname)?, dims[axis].as_static()) {
                (Val::Const(c), Some(n)) if c.dtype.is_int() => {
                    let vals: Vec<i64> = (0..c.numel())
                        .filter_map(|i| c.get_i64(i))
                        .map(|v| if v < 0 { v + n } else { v })
                        .collect();
                    // Known indices outside the axis: onnxruntime refuses them, and `take`
                    // (fast mode) must never read out of bounds.
                    if let Some(k) = vals.iter().position(|v| !(0..n).contains(v)) {
                        let i = c.get_i64(k).unwrap_or(vals[k]);
                        return Err(invalid(format!(
                            "index {i} (element {k} of `{iname}`) is out of range for axis \
                             {axis} of extent {n}; expected -{n} to {}",
                            n - 1
                        )));
                    }
                    let bytes = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
                    let c = Constant::from_bytes(DType::I64, c.shape.clone(), bytes)
                        .map_err(invalid)?;
                    im.b.constant(c)
                }
                _ => im.expr(iname)?,
            };
            Ok(call(
                Op::Take {
                    axis: Some(axis as i64),
                    mode: TakeMode::Fast,
                },
                vec![x, idx],
            ))
        }
        "Unsqueeze" | "Squeeze" => {
            let x = im.expr(req(node, 0)?)?;
            let (dims, _) = im.dims(x)?;
            let axes = match input(node, 1) {
                Some(n) => Some(im.const_i64s(n)?),
                None => a.ints("axes"),
            };
            if op == "Unsqueeze" {
                let axes = axes.ok_or_else(|| invalid("Unsqueeze needs `axes`"))?;
                let r = dims.len() + axes.len();
                let axis = axes
                    .iter()
                    .map(|&v| normalize_axis(v, r).map(|v| v as i64))
                    .collect::<Result<_>>()?;
                Ok(call(Op::ExpandDims { axis }, vec![x]))
            } else {
                let axis = match axes {
                    Some(ax) => Some(
                        ax.iter()
                            .map(|&v| normalize_axis(v, dims.len()).map(|v| v as i64))
                            .collect::<Result<_>>()?,
                    ),
                    None => None,
                };
                Ok(call(Op::Squeeze { axis }, vec![x]))
            }
        }
        "ReduceMean" | "ReduceSum" | "ReduceMax" => {
            let x = im.expr(req(node, 0)?)?;
            let axes_from_input = (op == "ReduceSum" && im.opset >= 13) || im.opset >= 18;
            let axes = if axes_from_input {
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
            let attrs = Box::new(ReduceAttrs {
                axis: axes,
                keepdims: a.int("keepdims", 1) != 0,
            });
            let o = match op {
                "ReduceMean" => Op::Mean(attrs),
                "ReduceSum" => Op::Sum(attrs),
                _ => Op::Max(attrs),
            };
            Ok(call(o, vec![x]))
        }
        "Conv" => conv(im, node, &a),
        "GlobalAveragePool" => {
            let x = im.expr(req(node, 0)?)?;
            let (dims, _) = im.dims(x)?;
            if dims.len() != 4 {
                // 1-D and 3-D (and rank ≥ 3 generally): the mean over the spatial axes.
                if dims.len() < 3 {
                    return Err(invalid(format!(
                        "GlobalAveragePool needs [N, C, spatial…], found rank {}",
                        dims.len()
                    )));
                }
                return Ok(call(
                    Op::Mean(Box::new(ReduceAttrs {
                        axis: Some((2..dims.len() as i64).collect()),
                        keepdims: true,
                    })),
                    vec![x],
                ));
            }
            Ok(call(
                Op::AdaptiveAvgPool2d(Box::new(AdaptivePool2dAttrs {
                    output_size: Some([1, 1]),
                    layout: "NCHW".into(),
                    out_layout: "NCHW".into(),
                })),
                vec![x],
            ))
        }
        "Shape" => Err(invalid("Shape of a tensor of unknown rank")),
        "ConstantOfShape" | "Constant" | "Identity" => {
            Err(invalid("internal: should have been folded"))
        }
        "GatherElements" | "GatherND" | "ScatterND" | "ScatterElements" | "Scatter" | "OneHot"
        | "Range" | "Tile" | "Trilu" | "CumSum" | "CumProd" | "Pad" | "Size" | "DepthToSpace"
        | "SpaceToDepth" | "CenterCropPad" | "TensorScatter" => index::convert(im, node)?
            .ok_or_else(|| invalid(format!("internal: no converter for `{op}`"))),
        "ReduceMin" | "ReduceProd" | "ReduceL1" | "ReduceL2" | "ReduceLogSum"
        | "ReduceLogSumExp" | "ReduceSumSquare" => reduce::reduce(im, node, &a),
        "ArgMax" | "ArgMin" => reduce::arg(im, node, &a),
        "TopK" => reduce::topk(im, node, &a),
        "Einsum" => reduce::einsum(im, node, &a),
        "LpNormalization" => reduce::lp_normalization(im, node, &a),
        "Hardmax" => reduce::hardmax(im, node, &a),
        "Attention" => attention::attention(im, node, &a),
        "RotaryEmbedding" => attention::rotary_embedding(im, node, &a),
        "LayerNormalization" => nn::layer_norm(im, node, &a),
        "RMSNormalization" => nn::rms_norm(im, node, &a),
        "InstanceNormalization" => nn::instance_norm(im, node, &a),
        "GroupNormalization" => nn::group_norm(im, node, &a),
        "MeanVarianceNormalization" => nn::mvn(im, node, &a),
        "Dropout" => nn::dropout(im, node, &a),
        "MaxPool" | "AveragePool" => pool::pool(im, node, &a),
        "MaxUnpool" => unpool::max_unpool(im, node, &a),
        "DeformConv" => deform::deform_conv(im, node, &a),
        "DFT" => signal::dft_node(im, node, &a),
        "STFT" => signal::stft(im, node, &a),
        "MelWeightMatrix" => signal::mel_weight_matrix(im, node, &a),
        "NonZero" => set::nonzero_node(im, node),
        "Compress" => set::compress(im, node, &a),
        "Unique" => set::unique(im, node, &a),
        "NonMaxSuppression" => set::non_max_suppression(im, node, &a),
        "LpPool" => pool::lp_pool(im, node, &a),
        "GlobalMaxPool" => pool::global_max_pool(im, node),
        "GlobalLpPool" => pool::global_lp_pool(im, node, &a),
        "ConvTranspose" => nn::conv_transpose(im, node, &a),
        "Resize" => nn::resize(im, node, &a),
        "Upsample" if im.opset < 10 => nn::resize(im, node, &a),
        "Upsample" => Err(invalid(
            "Upsample was removed in opset 10 (use Resize); this model's opset is 10 or later",
        )),
        "ReverseSequence" => {
            let x = im.expr(req(node, 0)?)?;
            let lens = im.expr(req(node, 1)?)?;
            Ok(call(
                Op::ReverseSequence {
                    seq_axis: a.int("time_axis", 0),
                    batch_axis: a.int("batch_axis", 1),
                },
                vec![x, lens],
            ))
        }
        "GridSample" => image::grid_sample(im, node, &a),
        "RoiAlign" => image::roi_align(im, node, &a),
        "Col2Im" => image::col2im(im, node, &a),
        "AffineGrid" => image::affine_grid(im, node, &a),
        "LinearAttention" => attention::linear_attention(im, node, &a),
        "CausalConvWithState" => nn::causal_conv_with_state(im, node, &a),
        other => Err(invalid(format!("unsupported op `{other}`"))),
    }
}

/// Numpy broadcasting of two shapes (ONNX `Expand`).
fn broadcast_shapes(a: &[Dim], b: &[Dim]) -> Result<Vec<Dim>> {
    let n = a.len().max(b.len());
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let x = (i + a.len()).checked_sub(n).map(|j| &a[j]);
        let y = (i + b.len()).checked_sub(n).map(|j| &b[j]);
        out.push(match (x, y) {
            (Some(x), None) => x.clone(),
            (None, Some(y)) => y.clone(),
            (Some(x), Some(y)) if x.provably_eq(y) => x.clone(),
            (Some(x), Some(y)) if *x == Dim::Static(1) => y.clone(),
            (Some(x), Some(y)) if *y == Dim::Static(1) => x.clone(),
            (Some(x), Some(y)) => {
                return Err(invalid(format!("cannot broadcast dims {x} and {y}")));
            }
            (None, None) => Dim::Static(1),
        });
    }
    Ok(out)
}

/// Spatial attributes shared by Conv and the pools: (kernel, strides, dilations, pads t,l,b,r).
fn spatial(
    a: &Attrs<'_>,
    x_dims: &[Dim],
    kernel: [i64; 2],
    one_d: bool,
) -> Result<([i64; 2], [i64; 2], [i64; 4])> {
    let w = window(a, x_dims, if one_d { &kernel[..1] } else { &kernel })?;
    let (s, d, p) = (&w.strides, &w.dilations, &w.pads);
    Ok(if one_d {
        ([s[0], 1], [d[0], 1], [p[0], 0, p[1], 0])
    } else {
        ([s[0], s[1]], [d[0], d[1]], [p[0], p[1], p[2], p[3]])
    })
}

/// A convolution's or pool's window along `n` spatial axes (`n` = the kernel's length):
/// strides, dilations and pads (`[begin…, end…]`, ONNX's order), with `auto_pad` resolved
/// against the static extents of `x_dims` (`[N, C, spatial…]`).
pub(super) struct Window {
    pub(super) strides: Vec<i64>,
    pub(super) dilations: Vec<i64>,
    pub(super) pads: Vec<i64>,
}

/// Reads `strides`, `dilations`, `pads` and `auto_pad` for a window of extents `kernel`.
pub(super) fn window(a: &Attrs<'_>, x_dims: &[Dim], kernel: &[i64]) -> Result<Window> {
    let n = kernel.len();
    let per_axis = |name: &str| -> Result<Vec<i64>> {
        match a.ints(name) {
            None => Ok(vec![1; n]),
            Some(v) if v.len() == n => Ok(v),
            Some(v) => Err(invalid(format!(
                "`{name}` must have {n} values, found {v:?}"
            ))),
        }
    };
    let strides = per_axis("strides")?;
    let dilations = per_axis("dilations")?;
    let auto_pad = a.string("auto_pad", "NOTSET");
    let pads = match auto_pad.as_str() {
        "NOTSET" | "" => match a.ints("pads") {
            None => vec![0; 2 * n],
            Some(v) if v.len() == 2 * n => v,
            Some(v) => {
                return Err(invalid(format!(
                    "`pads` must have {} values, found {v:?}",
                    2 * n
                )));
            }
        },
        "VALID" => vec![0; 2 * n],
        "SAME_UPPER" | "SAME_LOWER" => {
            let mut p = vec![0; 2 * n];
            for i in 0..n {
                let len = x_dims
                    .get(2 + i)
                    .and_then(Dim::as_static)
                    .ok_or_else(|| invalid(format!("auto_pad {auto_pad} needs static dims")))?;
                let s = strides[i].max(1);
                let out = (len + s - 1) / s;
                let total = (out - 1)
                    .saturating_mul(s)
                    .saturating_add((kernel[i] - 1).saturating_mul(dilations[i]))
                    .saturating_add(1)
                    .saturating_sub(len)
                    .max(0);
                let (lo, hi) = if auto_pad == "SAME_UPPER" {
                    (total / 2, total - total / 2)
                } else {
                    (total - total / 2, total / 2)
                };
                p[i] = lo;
                p[i + n] = hi;
            }
            p
        }
        other => return Err(invalid(format!("unknown auto_pad `{other}`"))),
    };
    Ok(Window {
        strides,
        dilations,
        pads,
    })
}

/// The rank-3 (1-D) case runs as 2-D with a trailing extent-1 axis, squeezed afterwards.
fn lift(im: &mut Importer<'_>, e: ExprId) -> Result<ExprId> {
    im.emit(Op::ExpandDims { axis: vec![3] }, vec![e])
}

fn finish(im: &mut Importer<'_>, op: Op, args: Vec<ExprId>, one_d: bool) -> Result<Vec<Out>> {
    if !one_d {
        return Ok(call(op, args));
    }
    let y = im.emit(op, args)?;
    Ok(call(
        Op::Squeeze {
            axis: Some(vec![3]),
        },
        vec![y],
    ))
}

/// A convolution's `kernel_shape`, when given, must be the weight's spatial extents (`wd` is
/// the weight's shape, `[out, in, k...]`): onnxruntime refuses anything else.
pub(super) fn check_kernel_shape(a: &Attrs<'_>, wd: &[Dim]) -> Result<()> {
    let Some(k) = a.ints("kernel_shape") else {
        return Ok(());
    };
    let spatial = wd.get(2..).unwrap_or(&[]);
    let agrees = k.len() == spatial.len()
        && k.iter()
            .zip(spatial)
            .all(|(&k, d)| d.as_static().is_none_or(|d| d == k));
    if agrees {
        return Ok(());
    }
    let w: Vec<String> = spatial.iter().map(ToString::to_string).collect();
    Err(invalid(format!(
        "`kernel_shape` {k:?} contradicts the weight: expected its spatial extents [{}]",
        w.join(", ")
    )))
}

fn kernel_attr(a: &Attrs<'_>, one_d: bool) -> Option<[i64; 2]> {
    match a.ints("kernel_shape") {
        Some(k) if one_d && k.len() == 1 => Some([k[0], 1]),
        Some(k) if k.len() == 2 => Some([k[0], k[1]]),
        _ => None,
    }
}

fn conv(im: &mut Importer<'_>, node: &super::NodeProto, a: &Attrs<'_>) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let w = im.expr(req(node, 1)?)?;
    conv_of(im, x, w, input(node, 2), a)
}

/// `Conv(x, w[, bias])` with `Conv`'s attributes `a` (1-D or 2-D), on values already in hand
/// (`ConvInteger` and `QLinearConv` pass zero-point-centred operands).
pub(super) fn conv_of(
    im: &mut Importer<'_>,
    mut x: ExprId,
    mut w: ExprId,
    bias: Option<&str>,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let (xd, _) = im.dims(x)?;
    let (wd, _) = im.dims(w)?;
    let one_d = xd.len() == 3 && wd.len() == 3;
    if xd.len() == 5 && wd.len() == 5 {
        check_kernel_shape(a, &wd)?;
        return conv3d::conv3d(im, x, w, bias, a);
    }
    if !(one_d || (xd.len() == 4 && wd.len() == 4)) {
        return Err(invalid(format!(
            "unsupported ONNX node: only 1-D, 2-D and 3-D convolutions are supported, found \
             input rank {} and weight rank {}",
            xd.len(),
            wd.len()
        )));
    }
    check_kernel_shape(a, &wd)?;
    if one_d {
        x = lift(im, x)?;
        w = lift(im, w)?;
    }
    let (xd, _) = im.dims(x)?;
    let (wd, _) = im.dims(w)?;
    let kernel = kernel_attr(a, one_d).unwrap_or([
        wd[2].as_static().unwrap_or(1),
        wd[3].as_static().unwrap_or(1),
    ]);
    let (strides, dilation, padding) = spatial(a, &xd, kernel, one_d)?;
    let op = Op::Conv2d(Box::new(Conv2dAttrs {
        strides,
        padding,
        dilation,
        groups: a.int("group", 1),
        data_layout: "NCHW".into(),
        kernel_layout: "OIHW".into(),
        out_layout: "NCHW".into(),
        out_dtype: None,
    }));
    let Some(bname) = bias else {
        return finish(im, op, vec![x, w], one_d);
    };
    let y = im.emit(op, vec![x, w])?;
    let out_c = wd[0].clone();
    let b = match im.val(bname)? {
        Val::Const(c) if c.shape.len() == 1 => {
            let shape = vec![1, c.shape[0], 1, 1];
            im.b.constant(Constant { shape, ..c })
        }
        _ => {
            let be = im.expr(bname)?;
            let s =
                im.b.shape(vec![Dim::Static(1), out_c, Dim::Static(1), Dim::Static(1)]);
            im.emit(Op::Reshape, vec![be, s])?
        }
    };
    finish(im, Op::Add, vec![y, b], one_d)
}
