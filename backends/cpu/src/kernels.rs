//! The kernel dispatcher: one match arm per [`Op`] variant, so the compiler checks that every
//! op of the op set has a kernel.
//!
//! Arguments arrive as run-time [`Value`]s in the order the text format writes them (tensors,
//! a tuple for `concat`, a shape for `reshape`/`broadcast_to`, prim values for `clip`).
//! Shapes are the actual ones: symbolic dims were resolved when the values were made.
//!
//! ```text
//! lv: R.Tensor((n, 16), dtype="float32") = R.add(x, bias)   -> eval_op(&Op::Add, &[x, bias])
//! ```

use crate::elementwise::{self, BinOp, SignOp};
use crate::index;
use crate::{Error, Result, conv, layout, matmul, nn, reduce};
use crate::{einsum, search};
use fusebox_core::op::Op;
use fusebox_core::runtime::{Prim, Tensor, Value};

/// Argument `i` as a tensor.
fn tensor(args: &[Value], i: usize) -> std::result::Result<&Tensor, String> {
    match args.get(i) {
        Some(Value::Tensor(t)) => Ok(t),
        Some(v) => Err(format!(
            "expected argument {i} to be a tensor, found {}",
            v.kind()
        )),
        None => Err(format!("missing argument {i}")),
    }
}

/// Argument `i` as a shape value.
fn shape(args: &[Value], i: usize) -> std::result::Result<&[i64], String> {
    match args.get(i) {
        Some(Value::Shape(s)) => Ok(s),
        Some(v) => Err(format!(
            "expected argument {i} to be a shape, found {}",
            v.kind()
        )),
        None => Err(format!("missing argument {i}")),
    }
}

/// Argument `i` as a prim value (a scalar tensor is accepted too).
fn prim(args: &[Value], i: usize) -> std::result::Result<Prim, String> {
    match args.get(i) {
        Some(Value::Prim(p)) => Ok(*p),
        Some(Value::Tensor(t)) if t.numel() == 1 && t.rank() == 0 => {
            Ok(Prim::Float(t.to_f64_vec().first().copied().unwrap_or(0.0)))
        }
        Some(v) => Err(format!(
            "expected argument {i} to be a prim value, found {}",
            v.kind()
        )),
        None => Err(format!("missing argument {i}")),
    }
}

/// Argument 0 as a tuple of tensors.
fn tuple_tensors(args: &[Value]) -> std::result::Result<Vec<&Tensor>, String> {
    match args.first() {
        Some(Value::Tuple(fields)) => fields
            .iter()
            .enumerate()
            .map(|(i, f)| match f {
                Value::Tensor(t) => Ok(t),
                v => Err(format!(
                    "expected field {i} of the tuple to be a tensor, found {}",
                    v.kind()
                )),
            })
            .collect(),
        Some(v) => Err(format!("expected a tuple of tensors, found {}", v.kind())),
        None => Err("missing argument 0".to_string()),
    }
}

/// Runs the kernel of `op` on `args`, after checking that its result fits the memory limit
/// (see `fusebox_core::runtime::memory`).
pub fn eval_op(op: &Op, args: &[Value]) -> Result<Value> {
    eval_op_packed(op, args, None)
}

/// [`eval_op`], a `matmul`'s right operand having the packed copy `packed` (made by the
/// executor for a kept constant weight; see [`crate::gemm_packed`]; other ops ignore it).
pub(crate) fn eval_op_packed(
    op: &Op,
    args: &[Value],
    packed: Option<&crate::gemm_packed::PackedB>,
) -> Result<Value> {
    let Some(name) = op.static_name() else {
        return Err(Error::NoKernel {
            op: op.name().to_string(),
        });
    };
    fusebox_core::runtime::memory::check_op_result(op, args)?;
    eval(op, args, packed).map_err(|message| Error::Kernel { op: name, message })
}

fn bin(op: BinOp, args: &[Value]) -> std::result::Result<Value, String> {
    Ok(Value::Tensor(elementwise::binary(
        op,
        tensor(args, 0)?,
        tensor(args, 1)?,
    )?))
}

fn float_fn(name: &str, args: &[Value]) -> std::result::Result<Value, String> {
    let f = elementwise::float_fn(name).ok_or_else(|| format!("no float function {name}"))?;
    Ok(Value::Tensor(elementwise::unary_float(
        tensor(args, 0)?,
        &f,
    )?))
}

fn eval(
    op: &Op,
    args: &[Value],
    packed: Option<&crate::gemm_packed::PackedB>,
) -> std::result::Result<Value, String> {
    if let Some(sig) = Op::signature(op.name())
        && (args.len() < sig.min_args || args.len() > sig.max_args)
    {
        return Err(format!(
            "expected {} arguments, found {}",
            sig.min_args,
            args.len()
        ));
    }
    let t = |v: std::result::Result<Tensor, String>| v.map(Value::Tensor);
    match op {
        Op::Opaque(o) => Err(format!("no kernel for `{}`", o.name)),
        Op::Nonzero => t(crate::set::nonzero(tensor(args, 0)?)),
        Op::Unique(a) => crate::set::unique(tensor(args, 0)?, a),
        Op::AllClassNms => crate::set::all_class_nms([
            tensor(args, 0)?,
            tensor(args, 1)?,
            tensor(args, 2)?,
            tensor(args, 3)?,
            tensor(args, 4)?,
        ]),
        Op::Attention(a) => t(crate::nn_attention::attention(
            tensor(args, 0)?,
            tensor(args, 1)?,
            tensor(args, 2)?,
            None,
            a,
        )),
        Op::AttentionBias(a) => t(crate::nn_attention::attention(
            tensor(args, 0)?,
            tensor(args, 1)?,
            tensor(args, 2)?,
            Some(tensor(args, 3)?),
            a,
        )),
        Op::Stack { axis } => t(crate::pool_nd::stack(&tuple_tensors(args)?, *axis)),
        Op::MaxPool1d(a) | Op::MaxPool3d(a) => t(crate::pool_nd::pool(tensor(args, 0)?, a, true)),
        Op::AvgPool1d(a) | Op::AvgPool3d(a) => t(crate::pool_nd::pool(tensor(args, 0)?, a, false)),
        Op::AdaptiveAvgPool1d(a) => t(crate::pool_nd::adaptive(tensor(args, 0)?, a, 1)),
        Op::AdaptiveAvgPool3d(a) => t(crate::pool_nd::adaptive(tensor(args, 0)?, a, 3)),
        Op::Add => bin(BinOp::Add, args),
        Op::Subtract => bin(BinOp::Sub, args),
        Op::Multiply => bin(BinOp::Mul, args),
        Op::Divide => bin(BinOp::Div, args),
        Op::Power => bin(BinOp::Pow, args),
        Op::Maximum => bin(BinOp::Max, args),
        Op::Minimum => bin(BinOp::Min, args),
        Op::Exp => float_fn("exp", args),
        Op::Log => float_fn("log", args),
        Op::Sqrt => float_fn("sqrt", args),
        Op::Rsqrt => float_fn("rsqrt", args),
        Op::Tanh => float_fn("tanh", args),
        Op::Sigmoid => float_fn("sigmoid", args),
        Op::Erf => float_fn("erf", args),
        Op::Gelu => float_fn("gelu", args),
        Op::GeluTanh => float_fn("gelu_tanh", args),
        Op::Silu => float_fn("silu", args),
        Op::Negative => t(elementwise::sign_op(tensor(args, 0)?, SignOp::Neg)),
        Op::Abs => t(elementwise::sign_op(tensor(args, 0)?, SignOp::Abs)),
        Op::Relu => t(elementwise::sign_op(tensor(args, 0)?, SignOp::Relu)),
        Op::Clip => t(elementwise::clip(
            tensor(args, 0)?,
            prim(args, 1)?,
            prim(args, 2)?,
        )),
        Op::Astype { dtype } => Ok(Value::Tensor(elementwise::astype(tensor(args, 0)?, *dtype))),
        Op::Bitcast { dtype } => t(elementwise::bitcast(tensor(args, 0)?, *dtype)),
        Op::Det => t(crate::linalg::det(tensor(args, 0)?)),
        Op::Dropout { .. } => {
            let (y, mask) = elementwise::dropout(tensor(args, 0)?)?;
            Ok(Value::Tuple(vec![Value::Tensor(y), Value::Tensor(mask)]))
        }
        Op::Matmul { out_dtype } => t(matmul::matmul(
            tensor(args, 0)?,
            tensor(args, 1)?,
            *out_dtype,
            packed,
        )),
        Op::Conv2d(a) => t(conv::conv2d(tensor(args, 0)?, tensor(args, 1)?, a)),
        Op::BatchNorm(a) => {
            let (y, m, v) = nn::batch_norm(
                tensor(args, 0)?,
                tensor(args, 1)?,
                tensor(args, 2)?,
                tensor(args, 3)?,
                tensor(args, 4)?,
                a,
            )?;
            Ok(Value::Tuple(vec![
                Value::Tensor(y),
                Value::Tensor(m),
                Value::Tensor(v),
            ]))
        }
        Op::LayerNorm(a) => {
            let (g, b) = (tensor(args, 1)?, tensor(args, 2)?);
            t(nn::norm(
                tensor(args, 0)?,
                &a.axes,
                a.epsilon.0,
                a.scale.then_some(g),
                a.center.then_some(b),
                false,
            ))
        }
        Op::RmsNorm(a) => t(nn::norm(
            tensor(args, 0)?,
            &a.axes,
            a.epsilon.0,
            Some(tensor(args, 1)?),
            None,
            true,
        )),
        Op::Softmax { axis } => t(reduce::softmax(tensor(args, 0)?, *axis, false)),
        Op::LogSoftmax { axis } => t(reduce::softmax(tensor(args, 0)?, *axis, true)),
        Op::Sum(a) | Op::Mean(a) | Op::Max(a) | Op::Min(a) | Op::Prod(a) => {
            let how = match op {
                Op::Sum(_) => reduce::ReduceOp::Sum,
                Op::Mean(_) => reduce::ReduceOp::Mean,
                Op::Max(_) => reduce::ReduceOp::Max,
                Op::Min(_) => reduce::ReduceOp::Min,
                _ => reduce::ReduceOp::Prod,
            };
            t(reduce::reduce(
                tensor(args, 0)?,
                how,
                a.axis.as_deref(),
                a.keepdims,
            ))
        }
        Op::MaxPool2d(a) | Op::AvgPool2d(a) => {
            let (x, max) = (tensor(args, 0)?, matches!(op, Op::MaxPool2d(_)));
            let canon = |xc: &Tensor| {
                let a = fusebox_core::op::Pool2dAttrs {
                    layout: "NCHW".into(),
                    out_layout: "NCHW".into(),
                    ..(**a).clone()
                };
                nn::pool2d(xc, &a, max)
            };
            t(crate::pool_blocked::pool2d(x, a, max)
                .or_else(|| layout::through_nchw(x, &a.layout, &a.out_layout, canon))
                .unwrap_or_else(|| nn::pool2d(x, a, max)))
        }
        Op::AdaptiveAvgPool2d(a) => {
            let x = tensor(args, 0)?;
            let canon = |xc: &Tensor| {
                let a = fusebox_core::op::AdaptivePool2dAttrs {
                    layout: "NCHW".into(),
                    out_layout: "NCHW".into(),
                    ..(**a).clone()
                };
                nn::adaptive_avg_pool2d(xc, &a)
            };
            t(crate::pool_blocked::adaptive_avg_pool2d(x, a)
                .or_else(|| layout::through_nchw(x, &a.layout, &a.out_layout, canon))
                .unwrap_or_else(|| nn::adaptive_avg_pool2d(x, a)))
        }
        Op::Lrn(a) => t(nn::lrn(
            tensor(args, 0)?,
            a.size,
            a.axis,
            a.alpha.0,
            a.beta.0,
            a.bias.0,
        )),
        Op::Reshape => t(layout::reshape(tensor(args, 0)?, shape(args, 1)?)),
        Op::PermuteDims { axes } => t(layout::permute_dims(tensor(args, 0)?, axes.as_deref())),
        Op::LayoutTransform(m) => t(layout::layout_transform(tensor(args, 0)?, m)),
        Op::Concat { axis } => {
            let parts: Vec<&Tensor> = match args.first() {
                Some(Value::Tuple(fields)) => fields
                    .iter()
                    .enumerate()
                    .map(|(i, f)| match f {
                        Value::Tensor(t) => Ok(t),
                        v => Err(format!(
                            "expected field {i} of the tuple to be a tensor, found {}",
                            v.kind()
                        )),
                    })
                    .collect::<std::result::Result<_, _>>()?,
                Some(v) => return Err(format!("expected a tuple of tensors, found {}", v.kind())),
                None => return Err("missing argument 0".to_string()),
            };
            t(layout::concat(&parts, *axis))
        }
        Op::Split(a) => {
            let parts = layout::split(tensor(args, 0)?, &a.indices_or_sections, a.axis)?;
            Ok(Value::Tuple(parts.into_iter().map(Value::Tensor).collect()))
        }
        Op::Flatten => t(layout::flatten(tensor(args, 0)?)),
        Op::Squeeze { axis } => t(layout::squeeze(tensor(args, 0)?, axis.as_deref())),
        Op::ExpandDims { axis } => t(layout::expand_dims(tensor(args, 0)?, axis)),
        Op::StridedSlice(a) => t(layout::strided_slice(tensor(args, 0)?, a)),
        Op::Take { axis, mode } => t(layout::take(
            tensor(args, 0)?,
            tensor(args, 1)?,
            *axis,
            *mode,
        )),
        Op::BroadcastTo => t(layout::broadcast_to(tensor(args, 0)?, shape(args, 1)?)),
        Op::ShapeToTensor => {
            let s = shape(args, 0)?;
            t(Tensor::new(
                vec![s.len()],
                fusebox_core::runtime::Storage::I64(s.to_vec()),
            )
            .map_err(|e| e.to_string()))
        }
        Op::Elem(e) => {
            let ts = (0..e.arity())
                .map(|i| tensor(args, i))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            t(crate::elem::eval(*e, &ts))
        }
        Op::GatherElements { axis } => t(index::gather_elements(
            tensor(args, 0)?,
            tensor(args, 1)?,
            *axis,
        )),
        Op::GatherNd { batch_dims } => t(index::gather_nd(
            tensor(args, 0)?,
            tensor(args, 1)?,
            *batch_dims,
        )),
        Op::ScatterElements { axis, reduction } => t(index::scatter_elements(
            tensor(args, 0)?,
            tensor(args, 1)?,
            tensor(args, 2)?,
            *axis,
            *reduction,
        )),
        Op::ScatterNd { reduction } => t(index::scatter_nd(
            tensor(args, 0)?,
            tensor(args, 1)?,
            tensor(args, 2)?,
            *reduction,
        )),
        Op::OneHot { depth, axis } => {
            let (on, off) = match (args.get(1), args.get(2)) {
                (Some(on), Some(off)) => (on, off),
                _ => return Err("missing on_value / off_value".to_string()),
            };
            t(index::one_hot(tensor(args, 0)?, on, off, *depth, *axis))
        }
        Op::Arange(a) => t(index::arange(a)),
        Op::Tile { repeats } => t(index::tile(tensor(args, 0)?, repeats)),
        Op::Tril { k } => t(index::trilu(tensor(args, 0)?, *k, false)),
        Op::ReverseSequence {
            seq_axis,
            batch_axis,
        } => t(index::reverse_sequence(
            tensor(args, 0)?,
            tensor(args, 1)?,
            *seq_axis,
            *batch_axis,
        )),
        Op::Triu { k } => t(index::trilu(tensor(args, 0)?, *k, true)),
        Op::Cumsum(a) => t(index::scan(tensor(args, 0)?, a, false)),
        Op::Cumprod(a) => t(index::scan(tensor(args, 0)?, a, true)),
        Op::Pad(a) => t(index::pad(tensor(args, 0)?, a)),
        Op::Argmax { axis, keepdims } => {
            t(search::arg_reduce(tensor(args, 0)?, *axis, *keepdims, true))
        }
        Op::Argmin { axis, keepdims } => t(search::arg_reduce(
            tensor(args, 0)?,
            *axis,
            *keepdims,
            false,
        )),
        Op::Topk(a) => {
            let (v, i) = search::topk(
                tensor(args, 0)?,
                a.k,
                a.axis,
                a.largest,
                a.dtype.unwrap_or(fusebox_core::ir::DType::I32),
            )?;
            Ok(match a.ret_type.as_str() {
                "values" => Value::Tensor(v),
                "indices" => Value::Tensor(i),
                _ => Value::Tuple(vec![Value::Tensor(v), Value::Tensor(i)]),
            })
        }
        Op::Einsum { subscripts } => {
            let parts = tuple_tensors(args)?;
            t(einsum::einsum(&parts, subscripts))
        }
        Op::Conv2dTranspose(a) => t(crate::conv_transpose::conv2d_transpose(
            tensor(args, 0)?,
            tensor(args, 1)?,
            a,
        )),
        Op::Resize2d(a) => t(crate::image::resize2d(tensor(args, 0)?, shape(args, 1)?, a)),
        Op::GridSample(a) => t(crate::image::grid_sample(
            tensor(args, 0)?,
            tensor(args, 1)?,
            a,
        )),
        Op::RoiAlign(a) => t(crate::roi_align::roi_align(
            tensor(args, 0)?,
            tensor(args, 1)?,
            a,
        )),
        Op::AffineGrid { align_corners } => t(crate::image::affine_grid(
            tensor(args, 0)?,
            shape(args, 1)?,
            *align_corners,
        )),
        Op::GroupNorm(a) | Op::InstanceNorm(a) => t(crate::group_norm::group_norm(
            tensor(args, 0)?,
            tensor(args, 1)?,
            tensor(args, 2)?,
            a,
        )),
    }
}
