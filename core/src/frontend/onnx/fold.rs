//! Import-time folding: `Constant`, `ConstantOfShape`, `Identity` (and the optionals' `Optional`,
//! `OptionalGetElement`, `OptionalHasElement` of a tensor or of nothing), the integer shape
//! arithmetic that feeds `Reshape` / `Expand` / `Pad` (`Shape → Gather → Unsqueeze → Concat`,
//! `Max` / `Min` and `Split` too), and `Cast` / `CastLike` of a small float constant to a float
//! dtype.
//!
//! Contract: [`try_fold`] returns `Some(outputs)` when every input of the node is known at
//! import time (or the node is `Shape` of a tensor of known rank, or an `Identity`), `None` to
//! let the node become IR. Integer values are [`Ints`]: small integer tensors whose elements are
//! [`Dim`]s, so a shape with symbolic dims (`[n, 4]`) folds too; values that are all static
//! become ordinary constants. Folding never allocates more than a bounded number of elements.
//!
//! ```text
//! s = Shape(x)            # x: float32[n, 3, 4]  → Ints [n, 3, 4]
//! a = Gather(s, 0)        #                      → Ints n (rank 0)
//! b = Unsqueeze(a, [0])   #                      → Ints [n]
//! t = Concat(b, [-1])     #                      → Ints [n, -1]
//! y = Reshape(x, t)       # becomes R.reshape(x, R.shape([n, 12]))
//! ```

mod elem;

use super::{
    Attrs, Importer, MAX_CONST_ELEMS, Out, Val, input, normalize_axis, req, tensor_to_constant,
};
use crate::error::{Error, Result};
use crate::ir::{Constant, DType, Dim};

/// Folded integer tensors larger than this are left to the IR.
const MAX_FOLD_ELEMS: usize = 1 << 16;

/// A small integer tensor whose elements may be symbolic dims.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Ints {
    /// The element type (an integer type or bool).
    pub(crate) dtype: DType,
    /// The shape.
    pub(crate) shape: Vec<usize>,
    /// The elements, row-major.
    pub(crate) vals: Vec<Dim>,
}

impl Ints {
    /// Every element's value, when none is symbolic.
    fn statics(&self) -> Option<Vec<i64>> {
        self.vals.iter().map(Dim::as_static).collect()
    }

    /// The integer elements of a small integer (or bool) constant.
    pub(crate) fn from_constant(c: &Constant) -> Option<Ints> {
        if !(c.dtype.is_int() || c.dtype == DType::Bool) || c.numel() > MAX_FOLD_ELEMS {
            return None;
        }
        let vals = (0..c.numel())
            .map(|i| c.get_i64(i).map(Dim::Static))
            .collect::<Option<Vec<_>>>()?;
        let shape = c
            .shape
            .iter()
            .map(|&d| usize::try_from(d).ok())
            .collect::<Option<Vec<_>>>()?;
        Some(Ints {
            dtype: c.dtype,
            shape,
            vals,
        })
    }

    /// The constant, when every element is static.
    pub(crate) fn to_constant(&self) -> Option<Constant> {
        let mut bytes = Vec::with_capacity(self.vals.len() * self.dtype.size_bytes());
        for d in &self.vals {
            let v = d.as_static()?;
            match self.dtype {
                DType::I64 => bytes.extend(v.to_le_bytes()),
                DType::I32 => bytes.extend((v as i32).to_le_bytes()),
                DType::I8 | DType::U8 => bytes.push(v as u8),
                DType::Bool => bytes.push(u8::from(v != 0)),
                _ => return None,
            }
        }
        let shape = self.shape.iter().map(|&d| d as i64).collect();
        Constant::from_bytes(self.dtype, shape, bytes).ok()
    }

    fn into_val(self) -> Val {
        match self.to_constant() {
            Some(c) => Val::Const(c),
            None => Val::Ints(self),
        }
    }
}

/// The input `name` as folded integers, if it is known at import time.
fn ints(im: &Importer<'_>, name: &str) -> Option<Ints> {
    match im.val(name).ok()? {
        Val::Ints(i) => Some(i),
        Val::Const(c) => Ints::from_constant(&c),
        Val::Expr(_) => None,
    }
}

fn one(v: Val) -> Option<Vec<Out>> {
    Some(vec![Out::Val(v)])
}

fn err(m: impl Into<String>) -> Error {
    Error::Invalid(m.into())
}

/// Folds `node` when its inputs are known (see the module docs).
pub(crate) fn try_fold(im: &mut Importer<'_>, node: &super::NodeProto) -> Result<Option<Vec<Out>>> {
    let a = Attrs(node);
    if matches!(node.op_type.as_str(), "Cast" | "CastLike")
        && let Some(c) = float_cast(im, node, &a)?
    {
        return Ok(one(Val::Const(c)));
    }
    if let Some(c) = float_elementwise(im, node)? {
        return Ok(one(Val::Const(c)));
    }
    match node.op_type.as_str() {
        "Constant" => Ok(one(Val::Const(constant_attr(&a)?))),
        "Identity" => Ok(one(im.val(req(node, 0)?)?)),
        // fusebox's values are tensors: an optional holding one is that tensor, and an optional
        // that is absent can only be an input left out (no input, or an empty name).
        "Optional" | "OptionalGetElement" => match input(node, 0) {
            Some(name) => Ok(one(im.val(name)?)),
            None => Err(err(format!(
                "{} of an empty optional: only optionals holding a tensor are supported",
                node.op_type
            ))),
        },
        "OptionalHasElement" => Ok(one(Val::Const(Constant::scalar(
            f64::from(u8::from(input(node, 0).is_some())),
            DType::Bool,
        )))),
        "ConstantOfShape" => {
            let dims = im.const_dims(req(node, 0)?)?;
            let value = match a.tensor("value") {
                Some(t) => tensor_to_constant(t).map_err(err)?,
                None => Constant::scalar(0.0, DType::F32),
            };
            if value.numel() != 1 {
                return Err(err("`value` must hold exactly one element"));
            }
            if dims.iter().any(|d| d.as_static().is_none()) {
                // A symbolic shape: the value broadcast to it at run time.
                let scalar =
                    Constant::from_bytes(value.dtype, vec![], value.data.to_vec()).map_err(err)?;
                let c = im.b.constant(scalar);
                let shape = im.b.shape(dims);
                let v = im.emit(crate::op::Op::BroadcastTo, vec![c, shape])?;
                return Ok(one(Val::Expr(v)));
            }
            let shape = im.const_i64s(req(node, 0)?)?;
            if let Some(d) = shape.iter().find(|d| **d < 0) {
                return Err(err(format!("negative dim {d} in the shape {shape:?}")));
            }
            let n = crate::ir::numel(&shape)
                .filter(|n| *n <= MAX_CONST_ELEMS)
                .ok_or_else(|| err(format!("the shape {shape:?} is too large")))?;
            let data = value.data.repeat(n);
            Ok(one(Val::Const(
                Constant::from_bytes(value.dtype, shape, data).map_err(err)?,
            )))
        }
        "Shape" => {
            let x = req(node, 0)?;
            let dims: Vec<Dim> = match im.val(x)? {
                Val::Const(c) => c.shape.iter().map(|&d| Dim::Static(d)).collect(),
                Val::Ints(i) => i.shape.iter().map(|&d| Dim::Static(d as i64)).collect(),
                Val::Expr(e) => match im.dims(e) {
                    Ok((d, _)) => d,
                    Err(_) => return Ok(None),
                },
            };
            let r = dims.len() as i64;
            let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
            let start = clampi(a.int("start", 0));
            let end = clampi(a.int("end", r));
            let vals: Vec<Dim> = dims.get(start..end.max(start)).unwrap_or(&[]).to_vec();
            Ok(one(Ints {
                dtype: DType::I64,
                shape: vec![vals.len()],
                vals,
            }
            .into_val()))
        }
        "Gather" | "Unsqueeze" | "Squeeze" | "Concat" | "Slice" | "Cast" | "Reshape" | "Add"
        | "Sub" | "Mul" | "Div" | "Transpose" => {
            let mut args = Vec::new();
            for name in node.input.iter() {
                if name.is_empty() {
                    continue;
                }
                match ints(im, name) {
                    Some(i) => args.push(i),
                    None => return Ok(None),
                }
            }
            Ok(fold_ints(im, node, &a, args)?.map(|i| vec![Out::Val(i)]))
        }
        "Equal" | "Less" | "LessOrEqual" | "Greater" | "GreaterOrEqual" | "Not" | "And" | "Or"
        | "Xor" | "Mod" | "Where" | "Max" | "Min" => {
            let mut args = Vec::new();
            for name in node.input.iter().filter(|n| !n.is_empty()) {
                match ints(im, name) {
                    Some(i) => args.push(i),
                    None => return Ok(None),
                }
            }
            Ok(elem::fold(&node.op_type, &a, &args)?.map(|v| vec![Out::Val(v)]))
        }
        // `Split` of a folded 1-D integer tensor (AffineGrid's expansion splits `size` into
        // N, C, H, W): the pieces of `split` (an input, or the attribute before opset 13), or
        // as many equal pieces as outputs (the last smaller), as ONNX defines it.
        "Split" => {
            let Some(x) = ints(im, req(node, 0)?) else {
                return Ok(None);
            };
            if x.shape.len() != 1 || !matches!(a.int("axis", 0), 0 | -1) {
                return Ok(None);
            }
            let n = x.vals.len();
            let outs = node.output.len();
            let given = match input(node, 1) {
                Some(name) => Some(im.const_i64s(name)?),
                None => a.ints("split"),
            };
            let sizes: Vec<usize> = match given {
                Some(v) => v
                    .iter()
                    .map(|&v| usize::try_from(v).map_err(|_| err(format!("negative split {v}"))))
                    .collect::<Result<_>>()?,
                None if outs > 0 => {
                    let each = n.div_ceil(outs);
                    (0..outs)
                        .map(|k| each.min(n.saturating_sub(k * each)))
                        .collect()
                }
                None => return Ok(None),
            };
            if sizes.iter().sum::<usize>() != n || sizes.len() != outs {
                return Err(err(format!(
                    "Split of {n} elements into {sizes:?} for {outs} outputs does not add up"
                )));
            }
            let mut at = 0;
            let mut pieces = Vec::with_capacity(outs);
            for len in sizes {
                pieces.push(Out::Val(
                    Ints {
                        dtype: x.dtype,
                        shape: vec![len],
                        vals: x.vals[at..at + len].to_vec(),
                    }
                    .into_val(),
                ));
                at += len;
            }
            Ok(Some(pieces))
        }
        // `OneHot` of folded integers: torch's `repeat` exports its counts as
        // `OneHot([dim], depth, [1, count])` (the MoE experts' `Tile(x, [1, top_k, 1])`).
        "OneHot" => one_hot(im, node, &a),
        // `Neg` of a folded integer (LayerNormalization's expansion feeds ConstantOfShape
        // with `-axis`).
        "Neg" => match ints(im, req(node, 0)?) {
            Some(x) => Ok(fold_ints(im, node, &a, vec![x])?.map(|i| vec![Out::Val(i)])),
            None => Ok(None),
        },
        _ => Ok(None),
    }
}

/// `OneHot(indices, depth, [off, on])` over folded integers (`None` when any is not, or an
/// index is symbolic): `on` where the index (negative counts from `depth`) equals the
/// position along `axis`, `off` elsewhere, as ONNX defines it.
fn one_hot(im: &Importer<'_>, node: &super::NodeProto, a: &Attrs<'_>) -> Result<Option<Vec<Out>>> {
    let (Some(idx), Some(depth), Some(values)) = (
        ints(im, req(node, 0)?),
        ints(im, req(node, 1)?),
        ints(im, req(node, 2)?),
    ) else {
        return Ok(None);
    };
    let ([d], [off, on]) = (depth.vals.as_slice(), values.vals.as_slice()) else {
        return Ok(None);
    };
    let Some(d) = d.as_static().and_then(|d| usize::try_from(d).ok()) else {
        return Ok(None);
    };
    let n = idx.vals.len();
    if d == 0 || n.checked_mul(d).is_none_or(|t| t > MAX_FOLD_ELEMS) {
        return Ok(None);
    }
    let Some(ks) = idx.statics() else {
        return Ok(None);
    };
    let axis = normalize_axis(a.int("axis", -1), idx.shape.len() + 1)?;
    let inner: usize = idx.shape[axis..].iter().product();
    let mut shape = idx.shape.clone();
    shape.insert(axis, d);
    let mut vals = Vec::with_capacity(n * d);
    for o in 0..n / inner.max(1) {
        for j in 0..d as i64 {
            for i in 0..inner {
                let k = ks[o * inner + i];
                let k = if k < 0 { k + d as i64 } else { k };
                vals.push(if k == j { on.clone() } else { off.clone() });
            }
        }
    }
    Ok(one(Ints {
        dtype: values.dtype,
        shape,
        vals,
    }
    .into_val()))
}

/// `Cast` / `CastLike` of a small float constant to a float dtype (`CastLike`: the second
/// input's, known from its type), as a constant: a `Pad` value computed as `CastLike(-inf, x)`
/// (ONNX's expanded `Attention`) must be known at import, and so must a `Loop`'s trip count
/// computed from float constants (ONNX's expanded `Range`). Integers truncate toward zero;
/// a value outside the target's range (or NaN) is left to the IR. `None` for anything else
/// (integer sources fold through [`Ints`]).
fn float_cast(
    im: &Importer<'_>,
    node: &super::NodeProto,
    a: &Attrs<'_>,
) -> Result<Option<Constant>> {
    let Ok(Val::Const(c)) = im.val(req(node, 0)?) else {
        return Ok(None);
    };
    if !c.dtype.is_float() || c.numel() > MAX_FOLD_ELEMS {
        return Ok(None);
    }
    let to = if node.op_type == "Cast" {
        super::dtype_of(a.int("to", 0) as i32)
    } else {
        match im.val(req(node, 1)?)? {
            Val::Const(t) => Some(t.dtype),
            Val::Ints(i) => Some(i.dtype),
            Val::Expr(e) => im.dims(e).ok().map(|(_, dt)| dt),
        }
    };
    let Some(to) = to else {
        return Ok(None);
    };
    let mut bytes = Vec::with_capacity(c.numel() * to.size_bytes());
    for i in 0..c.numel() {
        let Some(v) = c.get_f64(i) else {
            return Ok(None);
        };
        if to.is_float() {
            bytes.extend(Constant::scalar(v, to).data.iter());
        } else if to == DType::Bool {
            bytes.push(u8::from(v != 0.0));
        } else {
            // Float to integer truncates toward zero; a value the target cannot hold (or NaN)
            // is left to the IR, whose kernel says what it does.
            let t = v.trunc();
            let fits = match to {
                DType::I8 => (-128.0..=127.0).contains(&t),
                DType::U8 => (0.0..=255.0).contains(&t),
                DType::I32 => (-2147483648.0..=2147483647.0).contains(&t),
                DType::I64 => (-9.0e18..=9.0e18).contains(&t),
                _ => false,
            };
            if !fits {
                return Ok(None);
            }
            bytes.extend(Constant::scalar_i64(t as i64, to).data.iter());
        }
    }
    Ok(Some(
        Constant::from_bytes(to, c.shape.clone(), bytes).map_err(err)?,
    ))
}

/// The most elements [`float_elementwise`] folds (the scalars of an expanded function's
/// arithmetic, not tensors of data).
const MAX_FLOAT_FOLD_ELEMS: usize = 64;

/// `Add`, `Sub`, `Mul`, `Div` (numpy broadcasting), `Neg`, `Abs`, `Ceil`, `Floor`, `Relu` and
/// `Sqrt` of float constants of one dtype with at most [`MAX_FLOAT_FOLD_ELEMS`] elements, as a
/// constant: computed in `f64` and rounded once to the dtype, which for these correctly rounded
/// operations gives the dtype's own result (`f64` carries more than twice the bits of `f32`,
/// `f16` and `bf16`). `Pow` too (DINOv2's `Cast(Pow(16.0, 0.5))`, the side of its position
/// grid, feeds a `Reshape`): exact where the power is representable, otherwise within an ulp. `None` for anything else: larger tensors stay IR for FoldConstant.
fn float_elementwise(im: &Importer<'_>, node: &super::NodeProto) -> Result<Option<Constant>> {
    let op = node.op_type.as_str();
    let arity = match op {
        "Add" | "Sub" | "Mul" | "Div" | "Pow" => 2,
        "Neg" | "Abs" | "Ceil" | "Floor" | "Relu" | "Sqrt" => 1,
        _ => return Ok(None),
    };
    if node.input.len() != arity || node.input.iter().any(String::is_empty) {
        return Ok(None);
    }
    let mut cs = Vec::with_capacity(arity);
    for name in &node.input {
        match im.val(name) {
            Ok(Val::Const(c)) if c.dtype.is_float() && c.numel() <= MAX_FLOAT_FOLD_ELEMS => {
                cs.push(c);
            }
            _ => return Ok(None),
        }
    }
    let dt = cs[0].dtype;
    if cs.iter().any(|c| c.dtype != dt) {
        return Ok(None);
    }
    let shapes: Vec<Vec<usize>> = cs
        .iter()
        .map(|c| c.shape.iter().map(|&d| d.max(0) as usize).collect())
        .collect();
    let refs: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
    let Some(out) = elem::broadcast(&refs) else {
        return Ok(None);
    };
    let numel: usize = out.iter().product();
    // The element of constant `k` under broadcasting at the output's linear index `lin`.
    let read = |k: usize, lin: usize| cs[k].get_f64(elem::source_index(&shapes[k], &out, lin));
    let mut bytes = Vec::with_capacity(numel * dt.size_bytes());
    for lin in 0..numel {
        let Some(x) = read(0, lin) else {
            return Ok(None);
        };
        let y = if arity == 2 {
            let Some(b) = read(1, lin) else {
                return Ok(None);
            };
            match op {
                "Add" => x + b,
                "Sub" => x - b,
                "Mul" => x * b,
                "Pow" => x.powf(b),
                _ => x / b,
            }
        } else {
            match op {
                "Neg" => -x,
                "Abs" => x.abs(),
                "Ceil" => x.ceil(),
                "Floor" => x.floor(),
                "Relu" => {
                    if x < 0.0 {
                        0.0
                    } else {
                        x
                    }
                }
                _ => x.sqrt(),
            }
        };
        bytes.extend(Constant::scalar(y, dt).data.iter());
    }
    let shape = out.iter().map(|&d| d as i64).collect();
    Ok(Some(Constant::from_bytes(dt, shape, bytes).map_err(err)?))
}

fn constant_attr(a: &Attrs<'_>) -> Result<Constant> {
    if let Some(t) = a.tensor("value") {
        return tensor_to_constant(t).map_err(err);
    }
    if a.has("value_float") {
        return Ok(Constant::scalar(a.float("value_float", 0.0), DType::F32));
    }
    if a.has("value_int") {
        return Ok(Constant::scalar_i64(a.int("value_int", 0), DType::I64));
    }
    if let Some(v) = a.ints("value_ints") {
        let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        return Constant::from_bytes(DType::I64, vec![v.len() as i64], bytes).map_err(err);
    }
    if let Some(v) = a.floats("value_floats") {
        let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        return Constant::from_bytes(DType::F32, vec![v.len() as i64], bytes).map_err(err);
    }
    Err(err(
        "Constant needs `value`, `value_float(s)` or `value_int(s)` (sparse and string \
         constants are not supported)",
    ))
}

/// Folds an integer op; `None` when the case is outside the small evaluator.
/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut st = vec![1usize; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        st[k] = st[k + 1] * shape[k + 1];
    }
    st
}

/// The value of shape `shape` whose element at each position (row-major order) is the element
/// of `x` at flat index `src(position)`: the gather behind folded `Slice` and `Transpose`.
fn pick(x: &Ints, shape: Vec<usize>, src: impl Fn(&[usize]) -> usize) -> Val {
    let total: usize = shape.iter().product();
    let mut vals = Vec::with_capacity(total);
    let mut pos = vec![0usize; shape.len()];
    for _ in 0..total {
        vals.push(x.vals[src(&pos)].clone());
        for k in (0..shape.len()).rev() {
            pos[k] += 1;
            if pos[k] < shape[k] {
                break;
            }
            pos[k] = 0;
        }
    }
    Ints {
        dtype: x.dtype,
        shape,
        vals,
    }
    .into_val()
}

/// `u op v` for `Add`, `Sub` (also `Neg` as `0 - v`), `Mul` and `Div` (truncating, as ONNX
/// integer division) of two known values of type `dtype`; an error naming the operands when
/// the result does not fit in `dtype` (instead of a wrapped value, or an unfolded expression
/// that later reads as a symbolic dim).
fn static_arith(op: &str, u: i64, v: i64, dtype: DType) -> Result<i64> {
    let r = match op {
        "Add" => u.checked_add(v),
        "Sub" => u.checked_sub(v),
        "Mul" => u.checked_mul(v),
        _ if v == 0 => return Err(err("integer division by zero")),
        _ => u.checked_div(v),
    };
    let (lo, hi) = match dtype {
        DType::I32 => (i64::from(i32::MIN), i64::from(i32::MAX)),
        DType::I8 => (i64::from(i8::MIN), i64::from(i8::MAX)),
        DType::U8 => (0, i64::from(u8::MAX)),
        _ => (i64::MIN, i64::MAX),
    };
    match r {
        Some(r) if (lo..=hi).contains(&r) => Ok(r),
        _ => {
            let sym = match op {
                "Add" => "+",
                "Sub" => "-",
                "Mul" => "*",
                _ => "/",
            };
            Err(err(format!(
                "{dtype} overflow: {u} {sym} {v} does not fit in {dtype} (constant folding of \
                 {op} at import time)"
            )))
        }
    }
}

fn fold_ints(
    im: &Importer<'_>,
    node: &super::NodeProto,
    a: &Attrs<'_>,
    args: Vec<Ints>,
) -> Result<Option<Val>> {
    let Some(x) = args.first().cloned() else {
        return Ok(None);
    };
    let axes_of = |i: usize| -> Result<Option<Vec<i64>>> {
        match input(node, i) {
            Some(n) => im.const_i64s(n).map(Some),
            None => Ok(a.ints("axes")),
        }
    };
    Ok(match node.op_type.as_str() {
        "Gather" => {
            let (Some(idx), [n]) = (args.get(1), x.shape.as_slice()) else {
                return Ok(None);
            };
            if a.int("axis", 0) != 0 && a.int("axis", 0) != -1 {
                return Ok(None);
            }
            let mut vals = Vec::new();
            for d in &idx.vals {
                let i = d.as_static().ok_or_else(|| err("symbolic gather index"))?;
                let j = if i < 0 { i + *n as i64 } else { i };
                let v = usize::try_from(j)
                    .ok()
                    .and_then(|j| x.vals.get(j))
                    .ok_or_else(|| err(format!("index {i} is out of range for {n} elements")))?;
                vals.push(v.clone());
            }
            Some(
                Ints {
                    dtype: x.dtype,
                    shape: idx.shape.clone(),
                    vals,
                }
                .into_val(),
            )
        }
        "Unsqueeze" => {
            let Some(axes) = axes_of(1)? else {
                return Err(err("Unsqueeze needs `axes`"));
            };
            let r = x.shape.len() + axes.len();
            let mut axes: Vec<usize> = axes
                .iter()
                .map(|&ax| normalize_axis(ax, r))
                .collect::<Result<_>>()?;
            axes.sort_unstable();
            let mut shape = x.shape.clone();
            for ax in axes {
                if ax > shape.len() {
                    return Err(err("Unsqueeze axis out of range"));
                }
                shape.insert(ax, 1);
            }
            Some(Ints { shape, ..x }.into_val())
        }
        "Squeeze" => {
            let r = x.shape.len();
            let axes: Vec<usize> = match axes_of(1)? {
                Some(ax) => ax
                    .iter()
                    .map(|&v| normalize_axis(v, r))
                    .collect::<Result<_>>()?,
                None => (0..r).filter(|&i| x.shape[i] == 1).collect(),
            };
            let shape = x
                .shape
                .iter()
                .enumerate()
                .filter(|(i, _)| !axes.contains(i))
                .map(|(_, d)| *d)
                .collect();
            Some(Ints { shape, ..x }.into_val())
        }
        "Reshape" => {
            let Some(target) = args.get(1) else {
                return Ok(None);
            };
            let Some(t) = target.statics() else {
                return Ok(None);
            };
            let mut shape = Vec::new();
            let mut hole = None;
            for (i, &d) in t.iter().enumerate() {
                match d {
                    0 => shape.push(*x.shape.get(i).ok_or_else(|| err("0 dim out of range"))?),
                    -1 => {
                        hole = Some(i);
                        shape.push(1);
                    }
                    d if d > 0 => shape.push(d as usize),
                    d => return Err(err(format!("invalid dim {d} in Reshape"))),
                }
            }
            let known: usize = shape.iter().product();
            if let Some(h) = hole {
                if known == 0 || x.vals.len() % known != 0 {
                    return Err(err("Reshape: the element count does not divide"));
                }
                shape[h] = x.vals.len() / known;
            }
            if shape.iter().product::<usize>() != x.vals.len() {
                return Err(err("Reshape: the element count changes"));
            }
            Some(Ints { shape, ..x }.into_val())
        }
        "Concat" => {
            if args.iter().any(|i| i.shape.len() != 1) {
                return Ok(None);
            }
            let vals: Vec<Dim> = args.iter().flat_map(|i| i.vals.iter().cloned()).collect();
            Some(
                Ints {
                    dtype: x.dtype,
                    shape: vec![vals.len()],
                    vals,
                }
                .into_val(),
            )
        }
        "Slice" => {
            let r = x.shape.len();
            if r == 0 {
                return Ok(None);
            }
            let (starts, ends, axes, steps) = if im.opset >= 10 {
                // Symbolic bounds are sliced in the IR (see `ops/dynamic.rs`).
                let (Ok(st), Ok(en)) = (im.const_i64s(req(node, 1)?), im.const_i64s(req(node, 2)?))
                else {
                    return Ok(None);
                };
                let ax = match input(node, 3) {
                    Some(n) => im.const_i64s(n)?,
                    None => (0..st.len() as i64).collect(),
                };
                let sp = match input(node, 4) {
                    Some(s) => im.const_i64s(s)?,
                    None => vec![1; st.len()],
                };
                (st, en, ax, sp)
            } else {
                let st = a.ints("starts").unwrap_or_default();
                let ax = a
                    .ints("axes")
                    .unwrap_or_else(|| (0..st.len() as i64).collect());
                let n = st.len();
                (st, a.ints("ends").unwrap_or_default(), ax, vec![1; n])
            };
            if starts.len() != axes.len() || ends.len() != axes.len() || steps.len() != axes.len() {
                return Err(err("Slice: starts, ends, axes and steps differ in length"));
            }
            // The kept indices of every axis (all of them where not sliced).
            let mut keep: Vec<Vec<usize>> = x.shape.iter().map(|&n| (0..n).collect()).collect();
            for (k, &ax) in axes.iter().enumerate() {
                let ax = normalize_axis(ax, r)?;
                let n = x.shape[ax] as i64;
                let (b, e, st) = (starts[k], ends[k], steps[k]);
                if st == 0 {
                    return Err(err("Slice step 0"));
                }
                let norm = |v: i64, lo: i64, hi: i64| {
                    let v = if v < 0 { v.saturating_add(n) } else { v };
                    v.clamp(lo, hi)
                };
                let mut idx = Vec::new();
                if st > 0 {
                    let (mut i, e) = (norm(b, 0, n), norm(e, 0, n));
                    while i < e {
                        idx.push(i as usize);
                        i += st;
                    }
                } else {
                    let (mut i, e) = (norm(b, -1, n - 1), norm(e, -1, n - 1));
                    while i > e {
                        idx.push(i as usize);
                        i += st;
                    }
                }
                keep[ax] = idx;
            }
            let shape: Vec<usize> = keep.iter().map(Vec::len).collect();
            let st = strides(&x.shape);
            Some(pick(&x, shape, |pos| {
                (0..r).map(|k| keep[k][pos[k]] * st[k]).sum()
            }))
        }
        "Cast" => {
            let to = super::dtype_of(a.int("to", 0) as i32)
                .ok_or_else(|| err("Cast: unsupported target type"))?;
            if to.is_int() || to == DType::Bool {
                Some(Ints { dtype: to, ..x }.into_val())
            } else {
                let Some(vs) = x
                    .vals
                    .iter()
                    .map(Dim::as_static)
                    .collect::<Option<Vec<_>>>()
                else {
                    return Ok(None);
                };
                let mut bytes = Vec::new();
                for v in vs {
                    bytes.extend(Constant::scalar(v as f64, to).data.iter());
                }
                let shape = x.shape.iter().map(|&d| d as i64).collect();
                Some(Val::Const(
                    Constant::from_bytes(to, shape, bytes).map_err(err)?,
                ))
            }
        }
        "Transpose" => {
            let r = x.shape.len();
            let perm: Vec<usize> = match a.ints("perm") {
                Some(p) => p
                    .iter()
                    .map(|&v| normalize_axis(v, r))
                    .collect::<Result<_>>()?,
                None => (0..r).rev().collect(),
            };
            let mut sorted = perm.clone();
            sorted.sort_unstable();
            if sorted != (0..r).collect::<Vec<_>>() {
                return Err(err(format!(
                    "`perm` {perm:?} is not a permutation of 0..{r}"
                )));
            }
            let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
            // Row-major strides of the input, read in output order.
            let st = strides(&x.shape);
            Some(pick(&x, shape, |pos| {
                pos.iter().zip(&perm).map(|(&i, &p)| i * st[p]).sum()
            }))
        }
        "Add" | "Sub" | "Mul" | "Div" => {
            let Some(y) = args.get(1) else {
                return Ok(None);
            };
            // numpy broadcasting (`[1, h, 1, 1] * 3 + [1, 1, w, 1]` in Swin's mask).
            let Some(shape) = elem::broadcast(&[x.shape.as_slice(), y.shape.as_slice()]) else {
                return Err(err(format!(
                    "shapes {:?} and {:?} do not broadcast",
                    x.shape, y.shape
                )));
            };
            let n: usize = shape.iter().product();
            if n > MAX_FOLD_ELEMS {
                return Ok(None);
            }
            let mut vals = Vec::with_capacity(n);
            for i in 0..n {
                let (Some(p), Some(q)) = (
                    elem::at(&x, &shape, i).cloned(),
                    elem::at(y, &shape, i).cloned(),
                ) else {
                    return Ok(None);
                };
                let op = node.op_type.as_str();
                if let (Some(u), Some(v)) = (p.as_static(), q.as_static()) {
                    vals.push(Dim::Static(static_arith(op, u, v, x.dtype)?));
                    continue;
                }
                let d = match op {
                    "Add" => p.add(&q),
                    "Sub" => p.sub(&q),
                    "Mul" => p.mul(&q),
                    _ => match q.as_static() {
                        Some(0) => return Err(err("integer division by zero")),
                        _ => p.floor_div(&q),
                    },
                };
                // Shape arithmetic that doubles a value over and over grows its expression
                // exponentially: refuse it while it is small enough to print.
                if d.has_too_many_ops() {
                    return Err(err(format!(
                        "the shape arithmetic grows past {} operators in one dim",
                        crate::ir::MAX_DIM_OPS
                    )));
                }
                vals.push(d);
            }
            Some(
                Ints {
                    dtype: x.dtype,
                    shape,
                    vals,
                }
                .into_val(),
            )
        }
        "Neg" => {
            let mut vals = Vec::with_capacity(x.vals.len());
            for d in &x.vals {
                vals.push(match d.as_static() {
                    Some(v) => Dim::Static(static_arith("Sub", 0, v, x.dtype)?),
                    None => Dim::Static(0).sub(d),
                });
            }
            Some(Ints { vals, ..x }.into_val())
        }
        _ => None,
    })
}
