//! Type inference for every op, following TVM Relax's struct-info inference.
//!
//! Shapes may hold symbolic dims; [`Dim`] arithmetic folds constants so static shapes stay
//! static. Unknown shapes (rank only, or nothing) and unknown dtypes give a less specific
//! result instead of an error. Errors start with the op name and say what was expected and
//! what was found.

mod elem;
mod reduce;

use super::{Op, SplitSpec};
use crate::ir::infer::brief;
use crate::ir::{DType, Dim, TensorType, Type};
use std::sync::Arc;

mod attention;
mod conv;
mod index;
mod nn;
mod pool;
mod set;

/// The arguments of one call, for error messages.
struct Cx<'a> {
    op: &'a str,
    args: &'a [&'a Type],
}

impl<'a> Cx<'a> {
    fn err(&self, msg: impl std::fmt::Display) -> String {
        format!("{}: {msg}", self.op)
    }

    fn arg(&self, i: usize) -> Result<&'a Type, String> {
        self.args
            .get(i)
            .copied()
            .ok_or_else(|| self.err(format!("missing argument {i}")))
    }

    /// Argument `i`, which must be a tensor; `what` names it in errors.
    fn tensor(&self, i: usize, what: &str) -> Result<&'a TensorType, String> {
        let t = self.arg(i)?;
        t.as_tensor().ok_or_else(|| {
            self.err(format!(
                "expected {what} to be a tensor, found {}",
                brief(t)
            ))
        })
    }

    /// The known shape of argument `i` (a shape value), `Ok(None)` when the values are not
    /// known; the rank comes back too when known.
    fn shape(&self, i: usize) -> Result<(Option<&'a [Dim]>, Option<usize>), String> {
        match self.arg(i)? {
            Type::Shape { dims: Some(d), .. } => Ok((Some(d.as_slice()), Some(d.len()))),
            Type::Shape { dims: None, ndim } => Ok((None, *ndim)),
            t => Err(self.err(format!(
                "expected a shape (R.shape([...])), found {}",
                brief(t)
            ))),
        }
    }

    fn float(&self, t: &TensorType, what: &str) -> Result<(), String> {
        match t.dtype {
            Some(d) if !d.is_float() => {
                Err(self.err(format!("expected {what} to have a float dtype, found {d}")))
            }
            _ => Ok(()),
        }
    }

    /// Normalises `axis` for a tensor of rank `rank`.
    fn axis(&self, axis: i64, rank: usize) -> Result<usize, String> {
        let r = i64::try_from(rank).unwrap_or(i64::MAX);
        let a = if axis < 0 {
            axis.saturating_add(r)
        } else {
            axis
        };
        if (0..r).contains(&a) {
            usize::try_from(a).map_err(|_| self.err("axis out of range"))
        } else {
            Err(self.err(format!(
                "axis {axis} is out of range for a tensor of rank {rank} (expected {} to {})",
                -r,
                r - 1
            )))
        }
    }

    /// Normalises distinct axes.
    fn axes(&self, axes: &[i64], rank: usize) -> Result<Vec<usize>, String> {
        let mut out: Vec<usize> = Vec::with_capacity(axes.len());
        for &a in axes {
            let n = self.axis(a, rank)?;
            if out.contains(&n) {
                return Err(self.err(format!("axis {a} is repeated in {axes:?}")));
            }
            out.push(n);
        }
        Ok(out)
    }

    /// Checks that argument `i` has rank `rank` if its rank is known.
    fn rank(&self, t: &TensorType, rank: usize, what: &str) -> Result<(), String> {
        match t.rank() {
            Some(r) if r != rank => Err(self.err(format!(
                "expected {what} to be a {rank}-D tensor, found {}",
                brief(&Type::Tensor(t.clone()))
            ))),
            _ => Ok(()),
        }
    }
}

fn known(dims: impl Into<Arc<[Dim]>>, dtype: Option<DType>) -> Type {
    let dims: Arc<[Dim]> = dims.into();
    Type::Tensor(TensorType {
        ndim: Some(dims.len()),
        dims: Some(dims),
        dtype,
    })
}

fn unknown(ndim: Option<usize>, dtype: Option<DType>) -> Type {
    Type::Tensor(TensorType {
        dims: None,
        ndim,
        dtype,
    })
}

fn same(t: &TensorType) -> Type {
    Type::Tensor(t.clone())
}

fn dt(d: Option<DType>) -> &'static str {
    d.map_or("void", DType::name)
}

/// The common dtype of two operands, which must match when both are known.
fn common_dtype(cx: &Cx<'_>, a: Option<DType>, b: Option<DType>) -> Result<Option<DType>, String> {
    match (a, b) {
        (Some(x), Some(y)) if x != y => Err(cx.err(format!(
            "expected operands of the same dtype, found {} and {}",
            dt(a),
            dt(b)
        ))),
        _ => Ok(a.or(b)),
    }
}

/// Numpy broadcasting of two shapes. `Ok(None)` when a pair of symbolic dims cannot be shown
/// equal (TVM then keeps only the rank).
fn broadcast(cx: &Cx<'_>, x: &[Dim], y: &[Dim]) -> Result<Option<Vec<Dim>>, String> {
    let n = x.len().max(y.len());
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let a = (i + x.len()).checked_sub(n).and_then(|j| x.get(j));
        let b = (i + y.len()).checked_sub(n).and_then(|j| y.get(j));
        out.push(match (a, b) {
            (Some(a), None) => a.clone(),
            (None, Some(b)) => b.clone(),
            (Some(a), Some(b)) if a.provably_eq(b) => a.clone(),
            (Some(Dim::Static(1)), Some(b)) => b.clone(),
            (Some(a), Some(Dim::Static(1))) => a.clone(),
            (Some(Dim::Static(a)), Some(Dim::Static(b))) => {
                return Err(cx.err(format!(
                    "cannot broadcast dims {a} and {b} (shapes {} and {})",
                    shape_str(x),
                    shape_str(y)
                )));
            }
            _ => return Ok(None),
        });
    }
    Ok(Some(out))
}

fn shape_str(d: &[Dim]) -> String {
    let parts: Vec<String> = d.iter().map(Dim::to_string).collect();
    format!("({})", parts.join(", "))
}

/// Product of dims as (static coefficient, symbolic factors); `None` on overflow.
fn factor(dims: &[Dim]) -> Option<(i64, Vec<Dim>)> {
    /// Splits `d` into its static factor and its symbolic factors (products are flattened,
    /// so `(batch * 16) * 4` gives 64 and `[batch]`).
    fn split(d: &Dim, c: &mut i64, syms: &mut Vec<Dim>) -> Option<()> {
        match d {
            Dim::Static(v) => *c = c.checked_mul(*v)?,
            Dim::Expr(e) if e.0 == crate::ir::DimOp::Mul => {
                split(&e.1, c, syms)?;
                split(&e.2, c, syms)?;
            }
            other => syms.push(other.clone()),
        }
        Some(())
    }
    let mut c: i64 = 1;
    let mut syms = Vec::new();
    for d in dims {
        split(d, &mut c, &mut syms)?;
    }
    Some((c, syms))
}

fn product(dims: &[Dim]) -> Dim {
    dims.iter().fold(Dim::Static(1), |acc, d| acc.mul(d))
}

/// `big` minus the multiset `small`, or `None` when `small` is not contained in `big`.
fn remove_all(big: &[Dim], small: &[Dim]) -> Option<Vec<Dim>> {
    let mut rest = big.to_vec();
    for d in small {
        let i = rest.iter().position(|x| x == d)?;
        rest.remove(i);
    }
    Some(rest)
}

/// Whether two dims are known to differ.
fn differ(a: &Dim, b: &Dim) -> bool {
    matches!((a, b), (Dim::Static(x), Dim::Static(y)) if x != y)
}

/// The most pieces a split may produce (keeps absurd attribute values from allocating).
const MAX_PIECES: usize = 1 << 16;

pub(super) fn infer(op: &Op, args: &[&Type]) -> Result<Type, String> {
    let cx = Cx {
        op: op.name(),
        args,
    };
    if let Some(sig) = Op::signature(op.name())
        && (args.len() < sig.min_args || args.len() > sig.max_args)
    {
        let want = if sig.min_args == sig.max_args {
            sig.min_args.to_string()
        } else {
            format!("{} to {}", sig.min_args, sig.max_args)
        };
        return Err(cx.err(format!("expected {want} arguments, found {}", args.len())));
    }
    match op {
        Op::Opaque(o) => Ok(o.ty.clone()),
        Op::Add
        | Op::Subtract
        | Op::Multiply
        | Op::Divide
        | Op::Power
        | Op::Maximum
        | Op::Minimum => {
            let (a, b) = (cx.tensor(0, "lhs")?, cx.tensor(1, "rhs")?);
            let dtype = common_dtype(&cx, a.dtype, b.dtype)?;
            match (&a.dims, &b.dims) {
                (Some(x), Some(y)) => Ok(match broadcast(&cx, x, y)? {
                    // Share an operand's dims when the result has the same (no new allocation).
                    Some(d) if d[..] == x[..] => known(x.clone(), dtype),
                    Some(d) if d[..] == y[..] => known(y.clone(), dtype),
                    Some(d) => known(d, dtype),
                    None => unknown(Some(x.len().max(y.len())), dtype),
                }),
                _ => Ok(unknown(
                    a.rank().zip(b.rank()).map(|(x, y)| x.max(y)),
                    dtype,
                )),
            }
        }
        Op::Exp | Op::Log | Op::Sqrt | Op::Rsqrt | Op::Tanh | Op::Sigmoid | Op::Erf => {
            let x = cx.tensor(0, "the input")?;
            cx.float(x, "the input")?;
            Ok(same(x))
        }
        Op::Gelu | Op::GeluTanh | Op::Silu => {
            let x = cx.tensor(0, "the input")?;
            cx.float(x, "the input")?;
            Ok(same(x))
        }
        Op::Negative | Op::Abs | Op::Relu => Ok(same(cx.tensor(0, "the input")?)),
        Op::Dropout { .. } => {
            let x = cx.tensor(0, "the input")?;
            cx.float(x, "the input")?;
            Ok(Type::Tuple(vec![same(x), same(x)]))
        }
        Op::Clip => {
            let x = cx.tensor(0, "the input")?;
            for (i, what) in [(1, "min"), (2, "max")] {
                match cx.arg(i)? {
                    Type::Prim(_) => {}
                    t => {
                        return Err(cx.err(format!(
                            "expected {what} to be a prim value (R.prim_value(...)), found {}",
                            brief(t)
                        )));
                    }
                }
            }
            Ok(same(x))
        }
        Op::Astype { dtype } => {
            let x = cx.tensor(0, "the input")?;
            Ok(Type::Tensor(TensorType {
                dtype: Some(*dtype),
                ..x.clone()
            }))
        }
        Op::Bitcast { dtype } => {
            let x = cx.tensor(0, "the input")?;
            if let Some(from) = x.dtype
                && from.size_bytes() != dtype.size_bytes()
            {
                return Err(cx.err(format!(
                    "cannot reinterpret {from} ({} bytes) as {dtype} ({} bytes): the widths must \
                     be equal",
                    from.size_bytes(),
                    dtype.size_bytes()
                )));
            }
            Ok(Type::Tensor(TensorType {
                dtype: Some(*dtype),
                ..x.clone()
            }))
        }
        Op::Det => {
            let x = cx.tensor(0, "the input")?;
            cx.float(x, "the input")?;
            if let Some(r) = x.rank()
                && r < 2
            {
                return Err(cx.err(format!(
                    "expected square matrices (*, M, M), found {}",
                    brief(&Type::Tensor(x.clone()))
                )));
            }
            let Some(d) = &x.dims else {
                return Ok(unknown(x.rank().map(|r| r - 2), x.dtype));
            };
            let (m, n) = (&d[d.len() - 2], &d[d.len() - 1]);
            if differ(m, n) {
                return Err(cx.err(format!(
                    "expected square matrices (*, M, M), found {m} × {n} ones"
                )));
            }
            Ok(known(d[..d.len() - 2].to_vec(), x.dtype))
        }
        Op::Matmul { out_dtype } => infer_matmul(&cx, *out_dtype),
        Op::Conv2d(a) => conv::conv2d(&cx, a),
        Op::MaxPool2d(a) | Op::AvgPool2d(a) => conv::pool2d(&cx, a),
        Op::AdaptiveAvgPool2d(a) => conv::adaptive_pool2d(&cx, a),
        Op::LayoutTransform(m) => {
            let x = cx.tensor(0, "the input")?;
            match &x.dims {
                Some(d) => Ok(known(m.out_dims(d).map_err(|e| cx.err(e))?, x.dtype)),
                None => Ok(unknown(Some(m.outputs.len()), x.dtype)),
            }
        }
        Op::BatchNorm(a) => {
            let x = cx.tensor(0, "data")?;
            let names = ["gamma", "beta", "moving_mean", "moving_var"];
            let mut params = Vec::with_capacity(4);
            for (i, what) in names.iter().enumerate() {
                let p = cx.tensor(i + 1, what)?;
                cx.rank(p, 1, what)?;
                common_dtype(&cx, x.dtype, p.dtype)?;
                params.push(p);
            }
            cx.float(x, "data")?;
            if let Some(r) = x.rank() {
                let axis = cx.axis(a.axis, r)?;
                if let Some(ch) = x.dims.as_ref().and_then(|d| d.get(axis)) {
                    for (p, what) in params.iter().zip(names) {
                        if let Some(pd) = p.dims.as_ref().and_then(|d| d.first())
                            && differ(pd, ch)
                        {
                            return Err(cx.err(format!(
                                "expected {what} to have {ch} elements (data's axis {axis}), found {pd}"
                            )));
                        }
                    }
                }
            }
            let mean = params.get(2).map_or(Type::Object, |t| same(t));
            let var = params.get(3).map_or(Type::Object, |t| same(t));
            Ok(Type::Tuple(vec![same(x), mean, var]))
        }
        Op::LayerNorm(a) => {
            let x = cx.tensor(0, "data")?;
            cx.float(x, "data")?;
            let params = [
                (cx.tensor(1, "gamma")?, "gamma"),
                (cx.tensor(2, "beta")?, "beta"),
            ];
            norm(&cx, x, &a.axes, &params)
        }
        Op::RmsNorm(a) => {
            let x = cx.tensor(0, "data")?;
            cx.float(x, "data")?;
            norm(&cx, x, &a.axes, &[(cx.tensor(1, "weight")?, "weight")])
        }
        Op::Softmax { axis } | Op::LogSoftmax { axis } => {
            let x = cx.tensor(0, "the input")?;
            cx.float(x, "the input")?;
            if let Some(r) = x.rank() {
                cx.axis(*axis, r)?;
            }
            Ok(same(x))
        }
        Op::Lrn(a) => {
            let x = cx.tensor(0, "the input")?;
            cx.float(x, "the input")?;
            if let Some(r) = x.rank() {
                cx.axis(a.axis, r)?;
            }
            Ok(same(x))
        }
        Op::Sum(a) | Op::Mean(a) | Op::Max(a) => reduce::reduce(&cx, a),
        Op::Reshape => infer_reshape(&cx),
        Op::PermuteDims { axes } => {
            let x = cx.tensor(0, "the input")?;
            let Some(r) = x.rank() else {
                return Ok(unknown(None, x.dtype));
            };
            let perm: Vec<usize> = match axes {
                Some(ax) => {
                    if ax.len() != r {
                        return Err(cx.err(format!(
                            "expected {r} axes for a tensor of rank {r}, found {ax:?}"
                        )));
                    }
                    cx.axes(ax, r)?
                }
                None => (0..r).rev().collect(),
            };
            let Some(xd) = &x.dims else {
                return Ok(unknown(Some(r), x.dtype));
            };
            let out: Option<Vec<Dim>> = perm.iter().map(|&p| xd.get(p).cloned()).collect();
            out.map(|d| known(d, x.dtype))
                .ok_or_else(|| cx.err("axis out of range"))
        }
        Op::Concat { axis } => infer_concat(&cx, *axis),
        Op::Split(a) => {
            let x = cx.tensor(0, "the input")?;
            let count = match &a.indices_or_sections {
                SplitSpec::Sections(n) => usize::try_from(*n).unwrap_or(0),
                SplitSpec::Indices(v) => v.len() + 1,
            };
            if count > MAX_PIECES {
                return Err(cx.err(format!(
                    "expected at most {MAX_PIECES} sections, found {count}"
                )));
            }
            let Some(r) = x.rank() else {
                return Ok(Type::Tuple(vec![unknown(None, x.dtype); count]));
            };
            let axis = cx.axis(a.axis, r)?;
            let Some(xd) = &x.dims else {
                return Ok(Type::Tuple(vec![unknown(Some(r), x.dtype); count]));
            };
            let len = xd.get(axis).cloned().unwrap_or(Dim::Static(0));
            let pieces = split_pieces(&cx, &len, &a.indices_or_sections)?;
            Ok(Type::Tuple(
                pieces
                    .into_iter()
                    .map(|p| {
                        let mut d = xd.to_vec();
                        if let Some(slot) = d.get_mut(axis) {
                            *slot = p;
                        }
                        known(d, x.dtype)
                    })
                    .collect(),
            ))
        }
        Op::Flatten => {
            let x = cx.tensor(0, "the input")?;
            match &x.dims {
                Some(d) if d.is_empty() => Ok(known(vec![Dim::Static(1)], x.dtype)),
                Some(d) => Ok(known(vec![product(d)], x.dtype)),
                None => Ok(unknown(Some(1), x.dtype)),
            }
        }
        Op::Squeeze { axis } => {
            let x = cx.tensor(0, "the input")?;
            let Some(r) = x.rank() else {
                return Ok(unknown(None, x.dtype));
            };
            match (axis, &x.dims) {
                (Some(ax), Some(xd)) => {
                    let axes = cx.axes(ax, r)?;
                    let mut out = Vec::with_capacity(r);
                    for (i, d) in xd.iter().enumerate() {
                        if !axes.contains(&i) {
                            out.push(d.clone());
                        } else if differ(d, &Dim::Static(1)) {
                            return Err(cx.err(format!(
                                "cannot squeeze axis {i} of extent {d} (shape {}): only extent-1 axes can be removed",
                                shape_str(xd)
                            )));
                        }
                    }
                    Ok(known(out, x.dtype))
                }
                (Some(ax), None) => {
                    let axes = cx.axes(ax, r)?;
                    Ok(unknown(Some(r - axes.len().min(r)), x.dtype))
                }
                (None, Some(xd)) => {
                    if xd.iter().any(|d| d.as_static().is_none()) {
                        // A symbolic dim may or may not be 1: TVM keeps neither rank nor shape.
                        return Ok(unknown(None, x.dtype));
                    }
                    let out: Vec<Dim> = xd
                        .iter()
                        .filter(|d| **d != Dim::Static(1))
                        .cloned()
                        .collect();
                    Ok(known(out, x.dtype))
                }
                (None, None) => Ok(unknown(None, x.dtype)),
            }
        }
        Op::ExpandDims { axis } => {
            let x = cx.tensor(0, "the input")?;
            let Some(r) = x.rank() else {
                return Ok(unknown(None, x.dtype));
            };
            let nr = r + axis.len();
            let axes = cx.axes(axis, nr)?;
            let Some(xd) = &x.dims else {
                return Ok(unknown(Some(nr), x.dtype));
            };
            let mut rest = xd.iter();
            let out: Vec<Dim> = (0..nr)
                .map(|i| {
                    if axes.contains(&i) {
                        Dim::Static(1)
                    } else {
                        rest.next().cloned().unwrap_or(Dim::Static(1))
                    }
                })
                .collect();
            Ok(known(out, x.dtype))
        }
        Op::StridedSlice(a) => {
            let x = cx.tensor(0, "the input")?;
            let Some(r) = x.rank() else {
                return Ok(unknown(None, x.dtype));
            };
            let axes = cx.axes(&a.axes, r)?;
            if a.begin.len() != axes.len() || a.end.len() != axes.len() {
                return Err(cx.err("expected begin and end to have one value per axis"));
            }
            let strides: Vec<i64> = match &a.strides {
                Some(s) if s.len() == axes.len() => s.clone(),
                Some(_) => return Err(cx.err("expected strides to have one value per axis")),
                None => vec![1; axes.len()],
            };
            let Some(xd) = &x.dims else {
                return Ok(unknown(Some(r), x.dtype));
            };
            let mut out = xd.to_vec();
            for (((&ax, &b), &e), &s) in axes.iter().zip(&a.begin).zip(&a.end).zip(&strides) {
                let Some(slot) = out.get_mut(ax) else {
                    continue;
                };
                *slot = slice_len(&cx, slot, b, e, s)?;
            }
            Ok(known(out, x.dtype))
        }
        Op::Take { axis, .. } => {
            let (x, idx) = (cx.tensor(0, "data")?, cx.tensor(1, "indices")?);
            if let Some(d) = idx.dtype
                && !d.is_int()
            {
                return Err(cx.err(format!(
                    "expected indices to have an integer dtype, found {d}"
                )));
            }
            match axis {
                None => Ok(match &idx.dims {
                    Some(id) => known(id.clone(), x.dtype),
                    None => unknown(idx.rank(), x.dtype),
                }),
                Some(ax) => {
                    let Some(r) = x.rank() else {
                        return Ok(unknown(None, x.dtype));
                    };
                    let a = cx.axis(*ax, r)?;
                    match (&x.dims, &idx.dims) {
                        (Some(xd), Some(id)) => {
                            let mut out: Vec<Dim> = xd.iter().take(a).cloned().collect();
                            out.extend(id.iter().cloned());
                            out.extend(xd.iter().skip(a + 1).cloned());
                            Ok(known(out, x.dtype))
                        }
                        _ => Ok(unknown(idx.rank().map(|ir| r - 1 + ir), x.dtype)),
                    }
                }
            }
        }
        Op::ShapeToTensor => {
            let (_, rank) = cx.shape(0)?;
            Ok(match rank {
                Some(r) => known(vec![Dim::Static(r as i64)], Some(DType::I64)),
                None => unknown(Some(1), Some(DType::I64)),
            })
        }
        Op::BroadcastTo => {
            let x = cx.tensor(0, "the input")?;
            let (target, trank) = cx.shape(1)?;
            let Some(target) = target else {
                return Ok(unknown(trank, x.dtype));
            };
            if let Some(r) = x.rank()
                && r > target.len()
            {
                return Err(cx.err(format!(
                    "cannot broadcast a tensor of rank {r} to the shape {} of rank {}",
                    shape_str(target),
                    target.len()
                )));
            }
            if let Some(xd) = &x.dims {
                let off = target.len() - xd.len();
                for (i, d) in xd.iter().enumerate() {
                    let Some(t) = target.get(off + i) else {
                        continue;
                    };
                    if differ(d, t) && *d != Dim::Static(1) {
                        return Err(cx.err(format!(
                            "cannot broadcast {} to {}: dim {i} is {d}, expected 1 or {t}",
                            shape_str(xd),
                            shape_str(target)
                        )));
                    }
                }
            }
            Ok(known(target.to_vec(), x.dtype))
        }
        Op::Elem(e) => elem::infer(&cx, *e),
        Op::GatherElements { .. }
        | Op::GatherNd { .. }
        | Op::ScatterElements { .. }
        | Op::ScatterNd { .. }
        | Op::OneHot { .. }
        | Op::Arange(_)
        | Op::Tile { .. }
        | Op::Tril { .. }
        | Op::Triu { .. }
        | Op::ReverseSequence { .. }
        | Op::Cumsum(_)
        | Op::Cumprod(_)
        | Op::Pad(_) => index::infer(&cx, op),
        Op::Min(a) | Op::Prod(a) => reduce::reduce(&cx, a),
        Op::Argmax { axis, keepdims } | Op::Argmin { axis, keepdims } => {
            reduce::arg_reduce(&cx, *axis, *keepdims)
        }
        Op::Topk(a) => reduce::topk(&cx, a),
        Op::Nonzero => set::nonzero(&cx),
        Op::Unique(a) => set::unique(&cx, a),
        Op::AllClassNms => set::all_class_nms(&cx),
        Op::Einsum { subscripts } => reduce::einsum(&cx, subscripts),
        Op::Conv2dTranspose(a) => nn::conv2d_transpose(&cx, a),
        Op::Resize2d(a) => nn::resize2d(&cx, a),
        Op::GridSample(a) => nn::grid_sample(&cx, a),
        Op::RoiAlign(a) => nn::roi_align(&cx, a),
        Op::AffineGrid { .. } => nn::affine_grid(&cx),
        Op::GroupNorm(a) | Op::InstanceNorm(a) => nn::group_norm(&cx, a),
        Op::Stack { axis } => pool::stack(&cx, *axis),
        Op::MaxPool1d(a) | Op::AvgPool1d(a) | Op::MaxPool3d(a) | Op::AvgPool3d(a) => {
            pool::pool(&cx, a)
        }
        Op::AdaptiveAvgPool1d(a) => pool::adaptive(&cx, a, 1),
        Op::AdaptiveAvgPool3d(a) => pool::adaptive(&cx, a, 3),
        Op::Attention(a) | Op::AttentionBias(a) => attention::attention(&cx, a),
    }
}

/// Output extent of a sliding window: `(i + p0 + p1 - ((k - 1) * d + 1) [+ s - 1]) // s + 1`.
/// Static extents are computed exactly (in `i128`); a result beyond `i64`, or constants that
/// overflow it for a symbolic extent, are an error naming the attributes (never a wrapped or
/// saturated extent).
fn window_out(
    i: &Dim,
    k: &Dim,
    s: i64,
    pad: (i64, i64),
    d: i64,
    ceil: bool,
) -> Result<Dim, String> {
    let overflow = || {
        format!(
            "the output extent of a window overflows (input {i}, kernel {k}, stride {s}, \
             padding {} + {}, dilation {d})",
            pad.0, pad.1
        )
    };
    if s == 0 {
        return Err("a stride of 0 is not allowed".to_string());
    }
    if let (Some(iv), Some(kv)) = (i.as_static(), k.as_static()) {
        let w = |v: i64| i128::from(v);
        let mut num = w(iv) + w(pad.0) + w(pad.1) - ((w(kv) - 1) * w(d) + 1);
        if ceil {
            num += w(s) - 1;
        }
        let out = num.div_euclid(w(s)) + 1;
        return i64::try_from(out).map(Dim::Static).map_err(|_| overflow());
    }
    let pad = pad.0.checked_add(pad.1).ok_or_else(overflow)?;
    let eff = k
        .sub(&Dim::Static(1))
        .mul(&Dim::Static(d))
        .add(&Dim::Static(1));
    let mut num = i.add(&Dim::Static(pad)).sub(&eff);
    if ceil {
        num = num.add(&Dim::Static(s.checked_sub(1).ok_or_else(overflow)?));
    }
    Ok(num.floor_div(&Dim::Static(s)).add(&Dim::Static(1)))
}

/// Places dims given in `NCHW` order into a layout whose letter positions are `pos`.
fn permute_out(pos: &[usize; 4], nchw: [Dim; 4]) -> Vec<Dim> {
    let mut out = vec![Dim::Static(0); 4];
    for (&p, d) in pos.iter().zip(nchw) {
        if let Some(slot) = out.get_mut(p) {
            *slot = d;
        }
    }
    out
}

fn infer_matmul(cx: &Cx<'_>, out_dtype: Option<DType>) -> Result<Type, String> {
    let (a, b) = (cx.tensor(0, "lhs")?, cx.tensor(1, "rhs")?);
    let dtype = match out_dtype {
        Some(d) => Some(d),
        None => common_dtype(cx, a.dtype, b.dtype)?,
    };
    for (t, what) in [(a, "lhs"), (b, "rhs")] {
        if t.rank() == Some(0) {
            return Err(cx.err(format!(
                "expected {what} to have rank at least 1, found a scalar"
            )));
        }
    }
    let (Some(x), Some(y)) = (&a.dims, &b.dims) else {
        let r = match (a.rank(), b.rank()) {
            (Some(1), Some(1)) => Some(0),
            (Some(1), Some(r)) | (Some(r), Some(1)) => Some(r - 1),
            (Some(p), Some(q)) => Some(p.max(q)),
            _ => None,
        };
        return Ok(unknown(r, dtype));
    };
    // Numpy: a 1-D lhs gets a leading 1, a 1-D rhs a trailing 1, both removed afterwards.
    let (x1, y1) = (x.len() == 1, y.len() == 1);
    let xs: Vec<Dim> = if x1 {
        [&[Dim::Static(1)], &x[..]].concat()
    } else {
        x.to_vec()
    };
    let ys: Vec<Dim> = if y1 {
        [&y[..], &[Dim::Static(1)]].concat()
    } else {
        y.to_vec()
    };
    let (Some((k1, xr)), Some((n, yr))) = (xs.split_last(), ys.split_last()) else {
        return Err(cx.err("expected operands of rank at least 1"));
    };
    let (Some((m, xb)), Some((k2, yb))) = (xr.split_last(), yr.split_last()) else {
        return Err(cx.err("expected operands of rank at least 1"));
    };
    if differ(k1, k2) {
        return Err(cx.err(format!(
            "reduction dims differ: lhs {} has {k1} columns, rhs {} has {k2} rows",
            shape_str(x),
            shape_str(y)
        )));
    }
    let Some(mut out) = broadcast(cx, xb, yb)? else {
        let r = xb.len().max(yb.len()) + usize::from(!x1) + usize::from(!y1);
        return Ok(unknown(Some(r), dtype));
    };
    if !x1 {
        out.push(m.clone());
    }
    if !y1 {
        out.push(n.clone());
    }
    Ok(known(out, dtype))
}

/// Shared by layer_norm and rms_norm: parameters must have the shape of the normalised axes.
fn norm(
    cx: &Cx<'_>,
    x: &TensorType,
    axes: &[i64],
    params: &[(&TensorType, &str)],
) -> Result<Type, String> {
    for (p, _) in params {
        common_dtype(cx, x.dtype, p.dtype)?;
    }
    let Some(r) = x.rank() else {
        return Ok(same(x));
    };
    let ax = cx.axes(axes, r)?;
    for (p, what) in params {
        cx.rank(p, ax.len(), what)?;
        if let (Some(xd), Some(pd)) = (&x.dims, &p.dims) {
            for (&a, pdim) in ax.iter().zip(pd.iter()) {
                if let Some(xdim) = xd.get(a)
                    && differ(xdim, pdim)
                {
                    return Err(cx.err(format!(
                        "expected {what} to have shape {} (data's normalised axes), found {}",
                        shape_str(
                            &ax.iter()
                                .filter_map(|&i| xd.get(i).cloned())
                                .collect::<Vec<_>>()
                        ),
                        shape_str(pd)
                    )));
                }
            }
        }
    }
    Ok(same(x))
}

fn infer_reshape(cx: &Cx<'_>) -> Result<Type, String> {
    let x = cx.tensor(0, "the input")?;
    let (shape, srank) = cx.shape(1)?;
    let Some(shape) = shape else {
        return Ok(unknown(srank, x.dtype));
    };
    let holes = shape.iter().filter(|d| **d == Dim::Static(-1)).count();
    if holes > 1 {
        return Err(cx.err(format!(
            "at most one -1 is allowed in the new shape {}",
            shape_str(shape)
        )));
    }
    if let Some(d) = shape
        .iter()
        .find(|d| matches!(d, Dim::Static(v) if *v < -1))
    {
        return Err(cx.err(format!(
            "invalid dim {d} in the new shape {}",
            shape_str(shape)
        )));
    }
    let Some(xd) = &x.dims else {
        return Ok(if holes == 0 {
            known(shape.to_vec(), x.dtype)
        } else {
            unknown(Some(shape.len()), x.dtype)
        });
    };
    let rest: Vec<Dim> = shape
        .iter()
        .filter(|d| **d != Dim::Static(-1))
        .cloned()
        .collect();
    let too_big = || cx.err("the number of elements overflows");
    let (ic, isyms) = factor(xd).ok_or_else(too_big)?;
    let (nc, nsyms) = factor(&rest).ok_or_else(too_big)?;
    if holes == 0 {
        let mismatch =
            isyms.len() == nsyms.len() && remove_all(&isyms, &nsyms).is_some() && ic != nc;
        if mismatch {
            return Err(cx.err(format!(
                "cannot reshape {} ({} elements) to {} ({} elements)",
                shape_str(xd),
                product(xd),
                shape_str(shape),
                product(shape)
            )));
        }
        return Ok(known(shape.to_vec(), x.dtype));
    }
    let cannot = || {
        cx.err(format!(
            "cannot infer the -1 in {}: {} elements are not a multiple of {}",
            shape_str(shape),
            product(xd),
            product(&rest)
        ))
    };
    if nc == 0 {
        return Err(cannot());
    }
    // The factors both counts hold cancel. What is left divides exactly (`n * 64` by 16), or
    // the hole is the floor quotient, as TVM infers it, and the executor checks the element
    // count when the shape is known: Mamba2's dynamo export views its padded `(n + 7) // 8 * 8`
    // positions as `n`, valid for the multiples of 8 it was traced at. Static counts that do
    // not divide are an error.
    let mut num = isyms;
    let mut den = Vec::with_capacity(nsyms.len());
    for d in nsyms {
        match num.iter().position(|x| *x == d) {
            Some(i) => {
                num.remove(i);
            }
            None => den.push(d),
        }
    }
    let hole = if den.is_empty() && ic % nc == 0 {
        product(&num).mul(&Dim::Static(ic / nc))
    } else if num.is_empty() && den.is_empty() {
        return Err(cannot());
    } else {
        product(&num)
            .mul(&Dim::Static(ic))
            .floor_div(&product(&den).mul(&Dim::Static(nc)))
    };
    let out: Vec<Dim> = shape
        .iter()
        .map(|d| {
            if *d == Dim::Static(-1) {
                hole.clone()
            } else {
                d.clone()
            }
        })
        .collect();
    Ok(known(out, x.dtype))
}

/// Argument 0 as a non-empty tuple of tensors, with their common dtype (concat, stack).
fn tensor_tuple<'a>(cx: &Cx<'a>) -> Result<(Vec<&'a TensorType>, Option<DType>), String> {
    let fields = match cx.arg(0)? {
        Type::Tuple(f) => f,
        t => return Err(cx.err(format!("expected a tuple of tensors, found {}", brief(t)))),
    };
    let mut ts = Vec::with_capacity(fields.len());
    for (i, f) in fields.iter().enumerate() {
        ts.push(f.as_tensor().ok_or_else(|| {
            cx.err(format!(
                "expected field {i} of the tuple to be a tensor, found {}",
                brief(f)
            ))
        })?);
    }
    let Some(first) = ts.first() else {
        return Err(cx.err("expected a non-empty tuple of tensors"));
    };
    let mut dtype = first.dtype;
    for t in &ts {
        dtype = common_dtype(cx, dtype, t.dtype)?;
    }
    Ok((ts, dtype))
}

fn infer_concat(cx: &Cx<'_>, axis: Option<i64>) -> Result<Type, String> {
    let (ts, dtype) = tensor_tuple(cx)?;
    let Some(axis) = axis else {
        // Flatten every input and join them.
        let dims: Option<Vec<Dim>> = ts
            .iter()
            .map(|t| t.dims.as_ref().map(|d| product(d)))
            .collect();
        return Ok(match dims {
            Some(d) => known(
                vec![
                    d.iter()
                        .skip(1)
                        .fold(d.first().cloned().unwrap_or(Dim::Static(0)), |a, b| {
                            a.add(b)
                        }),
                ],
                dtype,
            ),
            None => unknown(Some(1), dtype),
        });
    };
    let rank = ts.iter().find_map(|t| t.rank());
    if let Some(r) = rank
        && let Some(t) = ts.iter().find(|t| t.rank().is_some_and(|q| q != r))
    {
        return Err(cx.err(format!(
            "expected every tensor to have rank {r}, found {}",
            brief(&Type::Tensor((*t).clone()))
        )));
    }
    let Some(r) = rank else {
        return Ok(unknown(None, dtype));
    };
    let ax = cx.axis(axis, r)?;
    let all: Option<Vec<&[Dim]>> = ts.iter().map(|t| t.dims.as_deref()).collect();
    let Some(all) = all else {
        return Ok(unknown(Some(r), dtype));
    };
    let Some(base) = all.first() else {
        return Ok(unknown(Some(r), dtype));
    };
    let mut out: Vec<Dim> = base.to_vec();
    for d in all.iter().skip(1) {
        for (i, (o, v)) in out.iter_mut().zip(d.iter()).enumerate() {
            if i == ax {
                *o = o.add(v);
            } else if differ(o, v) {
                return Err(cx.err(format!(
                    "expected every tensor to match on the dims other than axis {ax}: {} and {}",
                    shape_str(base),
                    shape_str(d)
                )));
            }
        }
    }
    Ok(known(out, dtype))
}

/// The extents of the pieces of a split of an axis of extent `len`.
fn split_pieces(cx: &Cx<'_>, len: &Dim, spec: &SplitSpec) -> Result<Vec<Dim>, String> {
    match spec {
        SplitSpec::Sections(n) => {
            let n = *n;
            if n < 1 {
                return Err(cx.err(format!("expected at least 1 section, found {n}")));
            }
            match len.as_static() {
                Some(l) if l < 0 => {
                    Err(cx.err(format!("expected a non-negative extent, found {l}")))
                }
                Some(l) => {
                    // As TVM: sections of ceil(l / n), the last ones smaller (or empty).
                    let part = l.saturating_add(n - 1).div_euclid(n);
                    Ok((0..n)
                        .map(|i| {
                            Dim::Static(l.saturating_sub(part.saturating_mul(i)).clamp(0, part))
                        })
                        .collect())
                }
                None => {
                    let part = len.add(&Dim::Static(n - 1)).floor_div(&Dim::Static(n));
                    Ok(vec![part; usize::try_from(n).unwrap_or(0)])
                }
            }
        }
        SplitSpec::Indices(idx) => {
            let mut out = Vec::with_capacity(idx.len() + 1);
            let mut prev = Dim::Static(0);
            for &i in idx {
                let cur = match len.as_static() {
                    Some(l) => Dim::Static(i.clamp(0, l.max(0))),
                    None => Dim::Static(i),
                };
                let p = cur.sub(&prev);
                out.push(match p.as_static() {
                    Some(v) if v < 0 => Dim::Static(0),
                    _ => p,
                });
                if !matches!((cur.as_static(), prev.as_static()), (Some(c), Some(q)) if c < q) {
                    prev = cur;
                }
            }
            let last = len.sub(&prev);
            out.push(match last.as_static() {
                Some(v) if v < 0 => Dim::Static(0),
                _ => last,
            });
            Ok(out)
        }
    }
}

/// The extent of `[b:e:s]` of an axis of extent `n`, clamped like numpy for static extents.
fn slice_len(cx: &Cx<'_>, n: &Dim, b: i64, e: i64, s: i64) -> Result<Dim, String> {
    if s == 0 {
        return Err(cx.err("a stride of 0 is not allowed"));
    }
    match n.as_static() {
        Some(n) => {
            let norm = |v: i64, lo: i64, hi: i64| {
                let v = if v < 0 { v.saturating_add(n) } else { v };
                v.clamp(lo, hi)
            };
            let len = if s > 0 {
                let (b, e) = (norm(b, 0, n), norm(e, 0, n));
                if e > b {
                    (e - b).saturating_add(s - 1) / s
                } else {
                    0
                }
            } else {
                let (b, e) = (norm(b, -1, n - 1), norm(e, -1, n - 1));
                let step = s.saturating_neg();
                if b > e {
                    (b - e).saturating_add(step - 1) / step
                } else {
                    0
                }
            };
            Ok(Dim::Static(len))
        }
        None => {
            // Without clamping: a large end (like i64::MAX) means "to the end".
            let big = i64::from(i32::MAX);
            let pos = |v: i64| {
                if v < 0 {
                    n.add(&Dim::Static(v))
                } else if v >= big {
                    n.clone()
                } else {
                    Dim::Static(v)
                }
            };
            let (bd, ed) = (pos(b), pos(e));
            Ok(if s > 0 {
                ed.sub(&bd)
                    .add(&Dim::Static(s - 1))
                    .floor_div(&Dim::Static(s))
            } else {
                let step = s.saturating_neg();
                bd.sub(&ed)
                    .add(&Dim::Static(step - 1))
                    .floor_div(&Dim::Static(step))
            })
        }
    }
}
