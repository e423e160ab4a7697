//! Lowering: a fused function (a FuseOps group or an elementwise / reduction / norm composite)
//! → kernels of the [`crate::kir`].
//!
//! Contract:
//!
//! - [`lower`] takes a function whose parameters and result are tensors (or a tuple of tensors)
//!   with static shapes, and whose bindings are op calls, tuples, tuple-get-items, constants,
//!   shapes and prim values. Every op of the op set lowers: elementwise and broadcast math,
//!   every data-movement op (reshape, permute, concat, split, strided slice, take, squeeze,
//!   expand dims, flatten, broadcast_to), matmul, conv2d, pooling, reductions, softmax,
//!   layer / RMS / batch norm (inference), LRN and dropout (inference: identity), the
//!   comparison / logic / bitwise / `where` / math family (`lower/elem.rs`; integer
//!   add / subtract / multiply wrap to their dtype there) and the reduction family of issue 17
//!   (`lower/reduce.rs`; `topk`, a sort, is refused). Anything else (symbolic dims, integer
//!   division, power and float math, nested tuples, calls) is an [`Error::Unsupported`]
//!   naming the binding and the reason.
//! - Each op becomes a *template*: a node over its own output coordinates. A consumer uses a
//!   producer by substituting its index expressions into the template, so producers are
//!   inlined and every value is read from memory once per use (the DAG is hash-consed, so a
//!   value used twice is computed once).
//! - Kernels: a group with a row reduction (softmax, log_softmax, layer_norm, rms_norm, and
//!   sum/mean/max over trailing axes) becomes one *row kernel* whose statistics are computed
//!   once per row; every output it can write (same shape as the row space, or one value per
//!   row) is written there. Other outputs are written by *map kernels*, one per output shape.
//!   Reductions that are not row statistics (matmul, conv2d, pooling, reductions over leading
//!   axes) are evaluated per output element.
//! - The function's tensor parameters are the kernel inputs, in order (a tuple parameter gives
//!   one input per field), followed by one input per non-scalar constant
//!   ([`Lowered::constants`]).
//!
//! ```text
//! @R.function(private=True)
//! def fused_add_relu(x: R.Tensor((4, 8), "float16"), b: R.Tensor((8,), "float16")):
//!     R.func_attr({"Primitive": True})
//!     with R.dataflow():
//!         y = R.add(x, b)
//!         z = R.nn.relu(y)
//!         R.output(z)
//!     return z
//! → one map kernel over [4, 8]: out0[c0,c1] = max(load x[c0,c1] + load b[c1], 0)
//! ```

use crate::error::{Error, Result};
use crate::kir::{Bin, Buffer, Graph, Kernel, Node, NodeId, RedOp, Scalar, Un};
use fusebox_core::ir::{Callee, Constant, DType, ExprId, ExprKind, Function, PrimValue, Type};
use fusebox_core::op::{MapExpr, Op, SplitSpec, TakeMode};
use std::collections::HashMap;

// The op families, one child module each (`impl Lowerer` blocks): matmul, conv2d and pooling
// (`window`), and the families of issue 17 (`elem`, `index`, `reduce`, `nn`); then the
// templates of the outputs grouped into kernels (`kernels`).
mod elem;
mod index;
mod kernels;
mod nn;
mod reduce;
mod window;

/// A lowered function.
#[derive(Clone, Debug)]
pub struct Lowered {
    /// The kernels, in launch order (independent of each other).
    pub kernels: Vec<Kernel>,
    /// The function's inputs: tensor parameters, then constants.
    pub inputs: Vec<Buffer>,
    /// Constant inputs: (index into `inputs`, data).
    pub constants: Vec<(usize, Constant)>,
    /// The function's outputs (a tuple result is flattened).
    pub outputs: Vec<Buffer>,
    /// Whether the function returns a tuple.
    pub tuple: bool,
}

/// A value during lowering.
#[derive(Clone, Debug)]
enum Val {
    /// A tensor: a template over its own coordinates.
    T(Tv),
    Tuple(Vec<Val>),
    Shape,
    Prim(f64),
}

#[derive(Clone, Debug)]
struct Tv {
    node: NodeId,
    shape: Vec<u64>,
    dtype: DType,
}

struct Lowerer<'a> {
    name: &'a str,
    f: &'a Function,
    g: Graph,
    inputs: Vec<Buffer>,
    constants: Vec<(usize, Constant)>,
    env: HashMap<ExprId, Val>,
    at: String,
    /// Reduction variables of row reductions (sum/mean/max, softmax, norms, global pooling):
    /// only these become row statistics; contractions (matmul, conv, windows) stay per element.
    row_rvars: std::collections::HashSet<u32>,
}

/// Lowers `f` (named `name`) to kernels; see the module doc.
pub fn lower(name: &str, f: &Function) -> Result<Lowered> {
    let mut l = Lowerer {
        name,
        f,
        g: Graph::default(),
        inputs: Vec::new(),
        constants: Vec::new(),
        env: HashMap::new(),
        at: String::from("parameters"),
        row_rvars: std::collections::HashSet::new(),
    };
    for &p in &f.params {
        let v = f.var(p);
        let val = match &v.ty {
            Type::Tuple(fields) => {
                let mut out = Vec::new();
                for (i, t) in fields.iter().enumerate() {
                    out.push(Val::T(l.input(t, &format!("{}.{i}", v.name))?));
                }
                Val::Tuple(out)
            }
            t => Val::T(l.input(t, &v.name)?),
        };
        l.env.insert(f.var_expr(p), val);
    }
    for b in f.bindings() {
        l.at = format!("binding `{}`", f.var(b.var).name);
        let v = l.value(b.value)?;
        l.env.insert(f.var_expr(b.var), v);
    }
    l.at = "the result".into();
    let ret = f
        .ret
        .ok_or_else(|| l.unsupported("the function has no result".into()))?;
    let (outs, tuple) = match l.value(ret)? {
        Val::T(t) => (vec![t], false),
        Val::Tuple(fields) => {
            let mut o = Vec::new();
            for v in fields {
                match v {
                    Val::T(t) => o.push(t),
                    _ => return Err(l.unsupported("a tuple result must hold tensors".into())),
                }
            }
            (o, true)
        }
        _ => return Err(l.unsupported("the result must be a tensor or a tuple".into())),
    };
    let outputs: Vec<Buffer> = outs
        .iter()
        .enumerate()
        .map(|(i, t)| Buffer {
            name: format!("out{i}"),
            dtype: t.dtype,
            shape: t.shape.clone(),
        })
        .collect();
    let kernels = l.kernels(&outs, &outputs)?;
    Ok(Lowered {
        kernels,
        inputs: l.inputs,
        constants: l.constants,
        outputs,
        tuple,
    })
}

/// Whether `op` computes in floats only (integer data would need integer semantics).
fn float_only(op: &Op) -> bool {
    !matches!(
        op,
        Op::Negative
            | Op::Abs
            | Op::Relu
            | Op::Clip
            | Op::Astype { .. }
            | Op::Maximum
            | Op::Minimum
            | Op::Max(_)
            | Op::MaxPool2d(_)
            | Op::Reshape
            | Op::PermuteDims { .. }
            | Op::LayoutTransform(_)
            | Op::Concat { .. }
            | Op::Split(_)
            | Op::Flatten
            | Op::Squeeze { .. }
            | Op::ExpandDims { .. }
            | Op::StridedSlice(_)
            | Op::Take { .. }
            | Op::BroadcastTo
            | Op::Dropout { .. }
            | Op::Elem(_)
            | Op::GatherElements { .. }
            | Op::GatherNd { .. }
            | Op::ScatterElements { .. }
            | Op::ScatterNd { .. }
            | Op::OneHot { .. }
            | Op::Arange(_)
            | Op::Tile { .. }
            | Op::Tril { .. }
            | Op::Triu { .. }
            | Op::Pad(_)
            | Op::Resize2d(_)
            | Op::Add
            | Op::Subtract
            | Op::Multiply
    )
}

/// Positions of `letters` (e.g. `NCHW`) in `layout`.
fn layout4(layout: &str, letters: &str) -> Option<[usize; 4]> {
    let l = layout.as_bytes();
    if l.len() != 4 {
        return None;
    }
    let mut out = [0usize; 4];
    for (slot, c) in out.iter_mut().zip(letters.as_bytes()) {
        *slot = l.iter().position(|x| x == c)?;
    }
    Some(out)
}

fn norm_axis(a: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if a < 0 { a + r } else { a };
    (0..r).contains(&a).then_some(a as usize)
}

impl Lowerer<'_> {
    fn unsupported(&self, reason: String) -> Error {
        Error::Unsupported {
            function: self.name.to_string(),
            reason: format!("{}: {reason}", self.at),
        }
    }

    /// A new input buffer for a parameter (or a tuple parameter's field) of type `ty`.
    fn input(&mut self, ty: &Type, name: &str) -> Result<Tv> {
        let (shape, dtype) = self.static_tensor(ty, name)?;
        let idx = self.inputs.len();
        self.inputs.push(Buffer {
            name: name.to_string(),
            dtype,
            shape: shape.clone(),
        });
        self.g.input_scalars.push(Scalar::of(dtype));
        let coords = self.coords(shape.len());
        let node = self.g.add(Node::Load {
            buf: idx as u32,
            index: coords,
        });
        Ok(Tv { node, shape, dtype })
    }

    /// A fresh reduction variable of a row reduction.
    fn row_rvar(&mut self) -> u32 {
        let r = self.g.fresh_rvar();
        self.row_rvars.insert(r);
        r
    }

    fn coords(&mut self, rank: usize) -> Vec<NodeId> {
        (0..rank as u32)
            .map(|i| self.g.add(Node::Coord(i)))
            .collect()
    }

    fn static_tensor(&self, ty: &Type, what: &str) -> Result<(Vec<u64>, DType)> {
        let t = ty
            .as_tensor()
            .ok_or_else(|| self.unsupported(format!("`{what}` is not a tensor")))?;
        let dtype = t
            .dtype
            .ok_or_else(|| self.unsupported(format!("`{what}` has no dtype")))?;
        let shape = t
            .static_shape()
            .ok_or_else(|| self.unsupported(format!("`{what}` has a symbolic or unknown shape")))?;
        let shape = shape
            .iter()
            .map(|&d| u64::try_from(d))
            .collect::<std::result::Result<Vec<u64>, _>>()
            .map_err(|_| self.unsupported(format!("`{what}` has a negative extent")))?;
        Ok((shape, dtype))
    }

    /// The template of `t` read at `index` (one node per dim of `t`).
    fn at(&mut self, t: &Tv, index: &[NodeId]) -> NodeId {
        let identity = index
            .iter()
            .enumerate()
            .all(|(i, &n)| matches!(self.g.node(n), Node::Coord(c) if *c as usize == i));
        if identity {
            t.node
        } else {
            self.g.substitute(t.node, index)
        }
    }

    /// `t` broadcast to `out` (numpy rules, aligned right) at the coordinates `c`.
    fn broadcast_at(&mut self, t: &Tv, out: &[u64], c: &[NodeId]) -> NodeId {
        let off = out.len() - t.shape.len().min(out.len());
        let zero = self.g.int(0);
        let idx: Vec<NodeId> = t
            .shape
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                let oi = off + i;
                if d == 1 && out.get(oi).copied() != Some(1) {
                    zero
                } else {
                    c.get(oi).copied().unwrap_or(zero)
                }
            })
            .collect();
        self.at(t, &idx)
    }

    fn tensor_arg<'v>(&self, vals: &'v [Val], i: usize) -> Result<&'v Tv> {
        match vals.get(i) {
            Some(Val::T(t)) => Ok(t),
            _ => Err(self.unsupported(format!("argument {i} must be a tensor"))),
        }
    }

    fn value(&mut self, e: ExprId) -> Result<Val> {
        if let Some(v) = self.env.get(&e) {
            return Ok(v.clone());
        }
        let data = self.f.expr(e);
        match &data.kind {
            ExprKind::Var(v) => {
                let ve = self.f.var_expr(*v);
                if ve == e {
                    return Err(self.unsupported("an unbound variable".into()));
                }
                self.value(ve)
            }
            ExprKind::Const(c) => self.constant(c),
            ExprKind::ConstRef(c) => Err(self.unsupported(format!("constant {c} has no value"))),
            ExprKind::Tuple(fields) => {
                let mut out = Vec::new();
                for &x in fields {
                    out.push(self.value(x)?);
                }
                Ok(Val::Tuple(out))
            }
            ExprKind::TupleGetItem(t, i) => match self.value(*t)? {
                Val::Tuple(mut fields) if (*i as usize) < fields.len() => {
                    Ok(fields.swap_remove(*i as usize))
                }
                _ => Err(self.unsupported(format!("tuple index {i} out of range"))),
            },
            ExprKind::ShapeLit(dims) => {
                if dims.iter().any(|d| d.as_static().is_none()) {
                    return Err(self.unsupported("a symbolic shape".into()));
                }
                Ok(Val::Shape)
            }
            ExprKind::Prim(PrimValue::Int(i)) => Ok(Val::Prim(*i as f64)),
            ExprKind::Prim(PrimValue::Float(f, _)) => Ok(Val::Prim(*f)),
            ExprKind::Prim(PrimValue::Str(_)) => Err(self.unsupported("a string value".into())),
            ExprKind::Prim(PrimValue::Bool(b)) => Ok(Val::Prim(f64::from(u8::from(*b)))),
            ExprKind::Function(_) => Err(self.unsupported("a local function".into())),
            ExprKind::If(_) => Err(self.unsupported("control flow (`if`)".into())),
            ExprKind::Call {
                callee: Callee::Op(op),
                args,
            } => {
                let mut vals = Vec::new();
                for &a in args {
                    vals.push(self.value(a)?);
                }
                let ty = data.ty.clone();
                self.op(op, &vals, &ty)
            }
            ExprKind::Call {
                callee: Callee::Local(v),
                args,
            } => {
                let mut vals = Vec::new();
                for &a in args {
                    vals.push(self.value(a)?);
                }
                self.call_local(*v, vals)
            }
            ExprKind::Call { .. } => Err(self.unsupported("a call of a module function".into())),
        }
    }

    /// Inlines a call of the local function bound to `v` (a `Codegen` wrapper calling its
    /// composite).
    fn call_local(&mut self, v: fusebox_core::ir::VarId, args: Vec<Val>) -> Result<Val> {
        let f: &Function = self.f;
        let inner = f
            .bindings()
            .find(|b| b.var == v)
            .and_then(|b| match &f.expr(b.value).kind {
                ExprKind::Function(inner) => Some(&**inner),
                _ => None,
            })
            .ok_or_else(|| self.unsupported("a call of a local that is not a function".into()))?;
        if inner.params.len() != args.len() {
            return Err(self.unsupported(format!(
                "the local function takes {} arguments, {} given",
                inner.params.len(),
                args.len()
            )));
        }
        let saved_env = std::mem::take(&mut self.env);
        let saved_at = self.at.clone();
        let outer = std::mem::replace(&mut self.f, inner);
        for (&p, a) in inner.params.iter().zip(args) {
            self.env.insert(inner.var_expr(p), a);
        }
        let mut result = Ok(Val::Shape);
        for b in inner.bindings() {
            self.at = format!("{saved_at} → binding `{}`", inner.var(b.var).name);
            match self.value(b.value) {
                Ok(val) => {
                    self.env.insert(inner.var_expr(b.var), val);
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if result.is_ok() {
            result = match inner.ret {
                Some(r) => self.value(r),
                None => Err(self.unsupported("the local function has no result".into())),
            };
        }
        self.f = outer;
        self.env = saved_env;
        self.at = saved_at;
        result
    }

    fn constant(&mut self, c: &Constant) -> Result<Val> {
        let dtype = c.dtype;
        let shape: Vec<u64> = c.shape.iter().map(|&d| d.max(0) as u64).collect();
        if c.numel() == 1 {
            let s = Scalar::of(dtype);
            let node = match s {
                Scalar::I64 => self.g.int(c.get_i64(0).unwrap_or(0)),
                _ => self.g.float(c.get_f64(0).unwrap_or(0.0), s),
            };
            return Ok(Val::T(Tv { node, shape, dtype }));
        }
        let idx = self.inputs.len();
        self.inputs.push(Buffer {
            name: format!("const{}", self.constants.len()),
            dtype,
            shape: shape.clone(),
        });
        self.g.input_scalars.push(Scalar::of(dtype));
        self.constants.push((idx, c.clone()));
        let coords = self.coords(shape.len());
        let node = self.g.add(Node::Load {
            buf: idx as u32,
            index: coords,
        });
        Ok(Val::T(Tv { node, shape, dtype }))
    }

    fn out_type(&self, ty: &Type) -> Result<(Vec<u64>, DType)> {
        self.static_tensor(ty, "the result")
    }

    fn fconst(&mut self, v: f64, s: Scalar) -> NodeId {
        self.g.float(v, s)
    }

    #[allow(
        clippy::too_many_lines,
        reason = "one arm per op of the op set; splitting it would scatter the table"
    )]
    fn op(&mut self, op: &Op, args: &[Val], ty: &Type) -> Result<Val> {
        if float_only(op) {
            for (i, a) in args.iter().enumerate() {
                if let Val::T(t) = a
                    && !t.dtype.is_float()
                    && !(matches!(op, Op::Take { .. }) && i == 1)
                {
                    return Err(self.unsupported(format!(
                        "{} on {} data: integer arithmetic stays on the CPU",
                        op.name(),
                        t.dtype
                    )));
                }
            }
        }
        // Multi-output ops first.
        match op {
            Op::Split(a) => return self.split(args, a.axis, &a.indices_or_sections, ty),
            Op::BatchNorm(a) => {
                if a.training {
                    return Err(self.unsupported("batch_norm in training mode".into()));
                }
                let Type::Tuple(fields) = ty else {
                    return Err(self.unsupported("batch_norm must return a tuple".into()));
                };
                let (shape, dtype) = self.static_tensor(
                    fields
                        .first()
                        .ok_or_else(|| self.unsupported("empty batch_norm result".into()))?,
                    "batch_norm's result",
                )?;
                let x = self.tensor_arg(args, 0)?.clone();
                let axis = norm_axis(a.axis, shape.len())
                    .ok_or_else(|| self.unsupported("batch_norm axis out of range".into()))?;
                let c = self.coords(shape.len());
                let ch = [c[axis]];
                let s = Scalar::of(dtype);
                let xv = self.at(&x, &c);
                let g = self.tensor_arg(args, 1)?.clone();
                let b = self.tensor_arg(args, 2)?.clone();
                let m = self.tensor_arg(args, 3)?.clone();
                let v = self.tensor_arg(args, 4)?.clone();
                let (gv, bv, mv, vv) = (
                    self.at(&g, &ch),
                    self.at(&b, &ch),
                    self.at(&m, &ch),
                    self.at(&v, &ch),
                );
                let eps = self.fconst(a.epsilon.0, s);
                let d = self.g.bin(Bin::Sub, xv, mv);
                let ve = self.g.bin(Bin::Add, vv, eps);
                let r = self.g.un(Un::Rsqrt, ve);
                let mut y = self.g.bin(Bin::Mul, d, r);
                if a.scale {
                    y = self.g.bin(Bin::Mul, y, gv);
                }
                if a.center {
                    y = self.g.bin(Bin::Add, y, bv);
                }
                return Ok(Val::Tuple(vec![
                    Val::T(Tv {
                        node: y,
                        shape,
                        dtype,
                    }),
                    Val::T(m),
                    Val::T(v),
                ]));
            }
            Op::Dropout { .. } => {
                let x = self.tensor_arg(args, 0)?.clone();
                let one = self.fconst(1.0, Scalar::of(x.dtype));
                return Ok(Val::Tuple(vec![
                    Val::T(x.clone()),
                    Val::T(Tv {
                        node: one,
                        shape: x.shape.clone(),
                        dtype: x.dtype,
                    }),
                ]));
            }
            Op::Topk(_) => {
                return Err(self.unsupported("topk is a sort: it runs on the CPU".into()));
            }
            Op::Attention(_) | Op::AttentionBias(_) => {
                return Err(self.unsupported(
                    "attention has no generic CUDA lowering: the cutlass backend's fused \
                     attention kernel or the CPU runs it"
                        .into(),
                ));
            }
            Op::ShapeToTensor => {
                return Err(self.unsupported(
                    "shape_to_tensor reads a run-time shape: it runs on the CPU".into(),
                ));
            }
            Op::Opaque(o) => {
                return Err(self.unsupported(format!(
                    "`{}` is outside the op set: there is no kernel for it",
                    o.name
                )));
            }
            _ => {}
        }
        let (shape, dtype) = self.out_type(ty)?;
        let c = self.coords(shape.len());
        let s = Scalar::of(dtype);
        let node = match op {
            Op::Add
            | Op::Subtract
            | Op::Multiply
            | Op::Divide
            | Op::Power
            | Op::Maximum
            | Op::Minimum => {
                let a = self.tensor_arg(args, 0)?.clone();
                let b = self.tensor_arg(args, 1)?.clone();
                let x = self.broadcast_at(&a, &shape, &c);
                let y = self.broadcast_at(&b, &shape, &c);
                let k = match op {
                    Op::Add => Bin::Add,
                    Op::Subtract => Bin::Sub,
                    Op::Multiply => Bin::Mul,
                    Op::Divide => Bin::Div,
                    Op::Power => Bin::Pow,
                    Op::Maximum => Bin::Max,
                    _ => Bin::Min,
                };
                self.g.bin(k, x, y)
            }
            Op::BroadcastTo => {
                let a = self.tensor_arg(args, 0)?.clone();
                self.broadcast_at(&a, &shape, &c)
            }
            Op::Exp
            | Op::Log
            | Op::Sqrt
            | Op::Rsqrt
            | Op::Tanh
            | Op::Sigmoid
            | Op::Erf
            | Op::Negative
            | Op::Abs => {
                let a = self.tensor_arg(args, 0)?.clone();
                let x = self.at(&a, &c);
                let k = match op {
                    Op::Exp => Un::Exp,
                    Op::Log => Un::Log,
                    Op::Sqrt => Un::Sqrt,
                    Op::Rsqrt => Un::Rsqrt,
                    Op::Tanh => Un::Tanh,
                    Op::Sigmoid => Un::Sigmoid,
                    Op::Erf => Un::Erf,
                    Op::Negative => Un::Neg,
                    _ => Un::Abs,
                };
                self.g.un(k, x)
            }
            Op::Relu => {
                let a = self.tensor_arg(args, 0)?.clone();
                let x = self.at(&a, &c);
                let z = self.fconst(0.0, s);
                self.g.bin(Bin::Max, x, z)
            }
            Op::Silu => {
                let a = self.tensor_arg(args, 0)?.clone();
                let x = self.at(&a, &c);
                let sg = self.g.un(Un::Sigmoid, x);
                self.g.bin(Bin::Mul, x, sg)
            }
            Op::Gelu => {
                // 0.5 x (1 + erf(x / sqrt 2))
                let a = self.tensor_arg(args, 0)?.clone();
                let x = self.at(&a, &c);
                let k = self.fconst(std::f64::consts::FRAC_1_SQRT_2, s);
                let xs = self.g.bin(Bin::Mul, x, k);
                let e = self.g.un(Un::Erf, xs);
                let one = self.fconst(1.0, s);
                let half = self.fconst(0.5, s);
                let t = self.g.bin(Bin::Add, one, e);
                let hx = self.g.bin(Bin::Mul, half, x);
                self.g.bin(Bin::Mul, hx, t)
            }
            Op::GeluTanh => {
                // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
                let a = self.tensor_arg(args, 0)?.clone();
                let x = self.at(&a, &c);
                let x2 = self.g.bin(Bin::Mul, x, x);
                let x3 = self.g.bin(Bin::Mul, x2, x);
                let k = self.fconst(0.044715, s);
                let kx3 = self.g.bin(Bin::Mul, k, x3);
                let inner = self.g.bin(Bin::Add, x, kx3);
                let r = self.fconst((2.0 / std::f64::consts::PI).sqrt(), s);
                let ri = self.g.bin(Bin::Mul, r, inner);
                let th = self.g.un(Un::Tanh, ri);
                let one = self.fconst(1.0, s);
                let half = self.fconst(0.5, s);
                let t = self.g.bin(Bin::Add, one, th);
                let hx = self.g.bin(Bin::Mul, half, x);
                self.g.bin(Bin::Mul, hx, t)
            }
            Op::Clip => {
                let a = self.tensor_arg(args, 0)?.clone();
                let x = self.at(&a, &c);
                let (lo, hi) = (self.prim_arg(args, 1)?, self.prim_arg(args, 2)?);
                let (lo, hi) = if s == Scalar::I64 {
                    (lo.ceil(), hi.floor())
                } else {
                    (lo, hi)
                };
                let l = self.fconst(lo, s);
                let h = self.fconst(hi, s);
                let m = self.g.bin(Bin::Max, x, l);
                self.g.bin(Bin::Min, m, h)
            }
            Op::Astype { dtype: to } => {
                let a = self.tensor_arg(args, 0)?.clone();
                let x = self.at(&a, &c);
                self.g.add(Node::Convert(*to, x))
            }
            Op::Matmul { out_dtype } => {
                let a = self.tensor_arg(args, 0)?.clone();
                let b = self.tensor_arg(args, 1)?.clone();
                let v = self.matmul(&a, &b, &shape, &c)?;
                match out_dtype {
                    Some(d) if *d != a.dtype => self.g.add(Node::Convert(*d, v)),
                    _ => v,
                }
            }
            Op::Conv2d(a) => {
                let x = self.tensor_arg(args, 0)?.clone();
                let w = self.tensor_arg(args, 1)?.clone();
                let v = self.conv2d(&x, &w, a, &shape, &c)?;
                match a.out_dtype {
                    Some(d) if d != x.dtype => self.g.add(Node::Convert(d, v)),
                    _ => v,
                }
            }
            Op::MaxPool2d(a) | Op::AvgPool2d(a) => {
                let x = self.tensor_arg(args, 0)?.clone();
                self.pool2d(&x, a, matches!(op, Op::MaxPool2d(_)), &shape, &c)?
            }
            Op::AdaptiveAvgPool2d(a) => {
                let x = self.tensor_arg(args, 0)?.clone();
                if a.layout != a.out_layout {
                    return Err(self.unsupported("a layout change in adaptive pooling".into()));
                }
                let l = layout4(&a.layout, "NCHW")
                    .ok_or_else(|| self.unsupported(format!("layout {}", a.layout)))?;
                self.adaptive_pool(&x, l, &shape, &c)
            }
            Op::Sum(a) | Op::Mean(a) | Op::Max(a) => {
                let x = self.tensor_arg(args, 0)?.clone();
                let rank = x.shape.len();
                let axes: Vec<usize> = match &a.axis {
                    None => (0..rank).collect(),
                    Some(v) => {
                        let mut o = Vec::new();
                        for &ax in v {
                            o.push(
                                norm_axis(ax, rank)
                                    .ok_or_else(|| self.unsupported("axis out of range".into()))?,
                            );
                        }
                        o.sort_unstable();
                        o.dedup();
                        o
                    }
                };
                let mut vars = Vec::new();
                let mut idx = Vec::new();
                let mut oi = 0;
                for (i, &d) in x.shape.iter().enumerate() {
                    if axes.contains(&i) {
                        let r = self.row_rvar();
                        vars.push((r, d));
                        idx.push(self.g.add(Node::RVar(r)));
                        if a.keepdims {
                            oi += 1;
                        }
                    } else {
                        idx.push(c[oi]);
                        oi += 1;
                    }
                }
                let body = self.at(&x, &idx);
                let (rop, mean) = match op {
                    Op::Sum(_) => (RedOp::Sum, false),
                    Op::Mean(_) => (RedOp::Sum, true),
                    _ => (RedOp::Max, false),
                };
                let n: u64 = vars.iter().map(|v| v.1).product();
                let r = self.g.add(Node::Reduce {
                    op: rop,
                    vars,
                    body,
                });
                if mean {
                    let k = self.fconst(1.0 / n.max(1) as f64, s);
                    self.g.bin(Bin::Mul, r, k)
                } else {
                    r
                }
            }
            Op::Softmax { axis } | Op::LogSoftmax { axis } => {
                let x = self.tensor_arg(args, 0)?.clone();
                let ax = norm_axis(*axis, shape.len())
                    .ok_or_else(|| self.unsupported("axis out of range".into()))?;
                let (rv, ri) = self.row_index(&c, &[ax], &shape);
                let xr = self.at(&x, &ri);
                let mx = self.g.add(Node::Reduce {
                    op: RedOp::Max,
                    vars: rv.clone(),
                    body: xr,
                });
                let d = self.g.bin(Bin::Sub, xr, mx);
                let e = self.g.un(Un::Exp, d);
                let sum = self.g.add(Node::Reduce {
                    op: RedOp::Sum,
                    vars: rv,
                    body: e,
                });
                let xc = self.at(&x, &c);
                let dc = self.g.bin(Bin::Sub, xc, mx);
                if matches!(op, Op::Softmax { .. }) {
                    let ec = self.g.un(Un::Exp, dc);
                    self.g.bin(Bin::Div, ec, sum)
                } else {
                    let ls = self.g.un(Un::Log, sum);
                    self.g.bin(Bin::Sub, dc, ls)
                }
            }
            Op::LayerNorm(a) => {
                let x = self.tensor_arg(args, 0)?.clone();
                let gm = self.tensor_arg(args, 1)?.clone();
                let bt = self.tensor_arg(args, 2)?.clone();
                let axes = self.axes(&a.axes, shape.len())?;
                let (rv, ri) = self.row_index(&c, &axes, &shape);
                let n: u64 = rv.iter().map(|v| v.1).product();
                let inv = self.fconst(1.0 / n.max(1) as f64, s);
                let xr = self.at(&x, &ri);
                let sum = self.g.add(Node::Reduce {
                    op: RedOp::Sum,
                    vars: rv.clone(),
                    body: xr,
                });
                let mean = self.g.bin(Bin::Mul, sum, inv);
                let dr = self.g.bin(Bin::Sub, xr, mean);
                let sq = self.g.bin(Bin::Mul, dr, dr);
                let ss = self.g.add(Node::Reduce {
                    op: RedOp::Sum,
                    vars: rv,
                    body: sq,
                });
                let var = self.g.bin(Bin::Mul, ss, inv);
                let eps = self.fconst(a.epsilon.0, s);
                let ve = self.g.bin(Bin::Add, var, eps);
                let r = self.g.un(Un::Rsqrt, ve);
                let xc = self.at(&x, &c);
                let dc = self.g.bin(Bin::Sub, xc, mean);
                let mut y = self.g.bin(Bin::Mul, dc, r);
                let pidx: Vec<NodeId> = axes.iter().map(|&i| c[i]).collect();
                if a.scale {
                    let gv = self.at(&gm, &pidx);
                    y = self.g.bin(Bin::Mul, y, gv);
                }
                if a.center {
                    let bv = self.at(&bt, &pidx);
                    y = self.g.bin(Bin::Add, y, bv);
                }
                y
            }
            Op::RmsNorm(a) => {
                let x = self.tensor_arg(args, 0)?.clone();
                let w = self.tensor_arg(args, 1)?.clone();
                let axes = self.axes(&a.axes, shape.len())?;
                let (rv, ri) = self.row_index(&c, &axes, &shape);
                let n: u64 = rv.iter().map(|v| v.1).product();
                let inv = self.fconst(1.0 / n.max(1) as f64, s);
                let xr = self.at(&x, &ri);
                let sq = self.g.bin(Bin::Mul, xr, xr);
                let ss = self.g.add(Node::Reduce {
                    op: RedOp::Sum,
                    vars: rv,
                    body: sq,
                });
                let ms = self.g.bin(Bin::Mul, ss, inv);
                let eps = self.fconst(a.epsilon.0, s);
                let me = self.g.bin(Bin::Add, ms, eps);
                let r = self.g.un(Un::Rsqrt, me);
                let xc = self.at(&x, &c);
                let y = self.g.bin(Bin::Mul, xc, r);
                let pidx: Vec<NodeId> = axes.iter().map(|&i| c[i]).collect();
                let wv = self.at(&w, &pidx);
                self.g.bin(Bin::Mul, y, wv)
            }
            Op::Lrn(a) => {
                let x = self.tensor_arg(args, 0)?.clone();
                let axis = norm_axis(a.axis, shape.len())
                    .ok_or_else(|| self.unsupported("axis out of range".into()))?;
                let size = u64::try_from(a.size)
                    .ok()
                    .filter(|&v| v > 0)
                    .ok_or_else(|| self.unsupported("LRN size must be positive".into()))?;
                let radius = (size / 2) as i64;
                let cext = shape[axis] as i64;
                let r = self.g.fresh_rvar();
                let rn = self.g.add(Node::RVar(r));
                let rad = self.g.int(radius);
                let base = self.g.bin(Bin::Sub, c[axis], rad);
                let k = self.g.bin(Bin::Add, base, rn);
                let (kc, inb) = self.clamp_in(k, cext);
                let mut idx = c.clone();
                idx[axis] = kc;
                let xv = self.at(&x, &idx);
                let sq = self.g.bin(Bin::Mul, xv, xv);
                let z = self.fconst(0.0, s);
                let body = self.g.select(inb, sq, z);
                let sum = self.g.add(Node::Reduce {
                    op: RedOp::Sum,
                    vars: vec![(r, size)],
                    body,
                });
                let bias = self.fconst(a.bias.0, s);
                let al = self.fconst(a.alpha.0 / size as f64, s);
                let beta = self.fconst(a.beta.0, s);
                let t = self.g.bin(Bin::Mul, al, sum);
                let d = self.g.bin(Bin::Add, bias, t);
                let p = self.g.bin(Bin::Pow, d, beta);
                let xc = self.at(&x, &c);
                self.g.bin(Bin::Div, xc, p)
            }
            Op::Reshape | Op::Flatten | Op::Squeeze { .. } | Op::ExpandDims { .. } => {
                let x = self.tensor_arg(args, 0)?.clone();
                self.reshape(&x, &shape, &c)
            }
            Op::PermuteDims { axes } => {
                let x = self.tensor_arg(args, 0)?.clone();
                let rank = x.shape.len();
                let perm: Vec<usize> = match axes {
                    None => (0..rank).rev().collect(),
                    Some(v) => {
                        let mut o = Vec::new();
                        for &a in v {
                            o.push(
                                norm_axis(a, rank)
                                    .ok_or_else(|| self.unsupported("axis out of range".into()))?,
                            );
                        }
                        o
                    }
                };
                let zero = self.g.int(0);
                let mut idx = vec![zero; rank];
                for (i, &p) in perm.iter().enumerate() {
                    if let (Some(slot), Some(&ci)) = (idx.get_mut(p), c.get(i)) {
                        *slot = ci;
                    }
                }
                self.at(&x, &idx)
            }
            Op::LayoutTransform(m) => {
                // The input index of each output coordinate: a whole index is read back, a
                // split one is `outer * k + inner`, a fused pair is `(coord / k, coord % k)`.
                let x = self.tensor_arg(args, 0)?.clone();
                let zero = self.g.int(0);
                let mut idx = vec![zero; m.inputs];
                let coord = |p: usize| c.get(p).copied().unwrap_or(zero);
                for (p, e) in m.outputs.iter().enumerate() {
                    match *e {
                        MapExpr::Var(i) => {
                            if let Some(s) = idx.get_mut(i) {
                                *s = coord(p);
                            }
                        }
                        MapExpr::Div(i, k) => {
                            let kk = self.g.int(k);
                            let outer = self.g.bin(Bin::Mul, coord(p), kk);
                            let cur = idx.get(i).copied().unwrap_or(zero);
                            if let Some(s) = idx.get_mut(i) {
                                *s = self.g.bin(Bin::Add, cur, outer);
                            }
                        }
                        MapExpr::Mod(i, _) => {
                            let cur = idx.get(i).copied().unwrap_or(zero);
                            if let Some(s) = idx.get_mut(i) {
                                *s = self.g.bin(Bin::Add, cur, coord(p));
                            }
                        }
                        MapExpr::Fuse(i, k, j) => {
                            let kk = self.g.int(k);
                            let (q, r) = (
                                self.g.bin(Bin::Div, coord(p), kk),
                                self.g.bin(Bin::Rem, coord(p), kk),
                            );
                            if let Some(s) = idx.get_mut(i) {
                                *s = q;
                            }
                            if let Some(s) = idx.get_mut(j) {
                                *s = r;
                            }
                        }
                    }
                }
                self.at(&x, &idx)
            }
            Op::Concat { axis } => {
                let parts: Vec<Tv> = match args.first() {
                    Some(Val::Tuple(f)) => f
                        .iter()
                        .map(|v| match v {
                            Val::T(t) => Ok(t.clone()),
                            _ => Err(self.unsupported("concat of a non-tensor".into())),
                        })
                        .collect::<Result<_>>()?,
                    _ => return Err(self.unsupported("concat takes a tuple".into())),
                };
                let ax = match axis {
                    Some(a) => norm_axis(*a, shape.len())
                        .ok_or_else(|| self.unsupported("axis out of range".into()))?,
                    None => 0,
                };
                if axis.is_none() && shape.len() != 1 {
                    return Err(self.unsupported("concat with axis=None".into()));
                }
                // Last part first: select(c < end_k, part_k, rest).
                let mut offsets = Vec::new();
                let mut off = 0i64;
                for p in &parts {
                    let ext = if axis.is_none() {
                        p.shape.iter().product::<u64>() as i64
                    } else {
                        p.shape.get(ax).copied().unwrap_or(0) as i64
                    };
                    offsets.push((off, ext));
                    off += ext;
                }
                let mut acc: Option<NodeId> = None;
                for (p, &(o, ext)) in parts.iter().zip(&offsets).rev() {
                    if ext == 0 {
                        continue;
                    }
                    let oc = self.g.int(o);
                    let local = self.g.bin(Bin::Sub, c[ax], oc);
                    let (lc, _) = self.clamp_in(local, ext);
                    let v = if axis.is_none() {
                        let pshape = p.shape.clone();
                        self.reshape_from_linear(p, &pshape, lc)
                    } else {
                        let mut idx = c.clone();
                        idx[ax] = lc;
                        self.at(p, &idx)
                    };
                    acc = Some(match acc {
                        None => v,
                        Some(rest) => {
                            let end = self.g.int(o + ext);
                            let cond = self.g.bin(Bin::Lt, c[ax], end);
                            self.g.select(cond, v, rest)
                        }
                    });
                }
                acc.unwrap_or_else(|| self.g.float(0.0, s))
            }
            Op::StridedSlice(a) => {
                let x = self.tensor_arg(args, 0)?.clone();
                let rank = x.shape.len();
                let steps: Vec<i64> = a.strides.clone().unwrap_or_else(|| vec![1; a.axes.len()]);
                if a.begin.len() != a.axes.len()
                    || a.end.len() != a.axes.len()
                    || steps.len() != a.axes.len()
                {
                    return Err(self.unsupported("strided_slice attribute lengths differ".into()));
                }
                let mut idx = c.clone();
                for (i, &ax) in a.axes.iter().enumerate() {
                    let ax = norm_axis(ax, rank)
                        .ok_or_else(|| self.unsupported("axis out of range".into()))?;
                    let n = x.shape[ax] as i64;
                    let (b, st) = (a.begin[i], steps[i]);
                    if st == 0 {
                        return Err(self.unsupported("a stride of 0".into()));
                    }
                    let norm = |v: i64, lo: i64, hi: i64| {
                        let v = if v < 0 { v.saturating_add(n) } else { v };
                        v.clamp(lo, hi)
                    };
                    let start = if st > 0 {
                        norm(b, 0, n)
                    } else {
                        norm(b, -1, n - 1)
                    };
                    let sn = self.g.int(start);
                    let stn = self.g.int(st);
                    let m = self.g.bin(Bin::Mul, c[ax], stn);
                    let v = self.g.bin(Bin::Add, sn, m);
                    idx[ax] = self.clamp_in(v, n).0;
                }
                self.at(&x, &idx)
            }
            Op::Take { axis, mode } => {
                let x0 = self.tensor_arg(args, 0)?.clone();
                let ind = self.tensor_arg(args, 1)?.clone();
                let (x, ax) = match axis {
                    None => {
                        let n: u64 = x0.shape.iter().product();
                        let flat_shape = vec![n];
                        let cc = self.coords(1);
                        let node = self.reshape_from_linear(&x0, &x0.shape.clone(), cc[0]);
                        (
                            Tv {
                                node,
                                shape: flat_shape,
                                dtype: x0.dtype,
                            },
                            0,
                        )
                    }
                    Some(a) => (
                        x0.clone(),
                        norm_axis(*a, x0.shape.len())
                            .ok_or_else(|| self.unsupported("axis out of range".into()))?,
                    ),
                };
                let ir = ind.shape.len();
                let n = x.shape[ax] as i64;
                let iv = self.at(&ind, &c[ax..ax + ir]);
                let iv = match Scalar::of(ind.dtype) {
                    Scalar::I64 => iv,
                    _ => self.g.add(Node::Convert(DType::I64, iv)),
                };
                let k = match mode {
                    TakeMode::Wrap => {
                        let nn = self.g.int(n.max(1));
                        let r = self.g.bin(Bin::Rem, iv, nn);
                        let r2 = self.g.bin(Bin::Add, r, nn);
                        self.g.bin(Bin::Rem, r2, nn)
                    }
                    TakeMode::Fast | TakeMode::Clip => {
                        // Fast mode: negative indices count from the end (as ONNX Gather);
                        // anything else is clamped so the kernel never reads out of bounds.
                        let v = if matches!(mode, TakeMode::Fast) {
                            let z = self.g.int(0);
                            let neg = self.g.bin(Bin::Lt, iv, z);
                            let nn = self.g.int(n);
                            let plus = self.g.bin(Bin::Add, iv, nn);
                            self.g.select(neg, plus, iv)
                        } else {
                            iv
                        };
                        self.clamp_in(v, n).0
                    }
                };
                let mut idx: Vec<NodeId> = c[..ax].to_vec();
                idx.push(k);
                idx.extend_from_slice(&c[ax + ir..]);
                self.at(&x, &idx)
            }
            Op::Conv2dTranspose(a) => {
                let x = self.tensor_arg(args, 0)?.clone();
                let w = self.tensor_arg(args, 1)?.clone();
                let v = self.conv2d_transpose(&x, &w, a, &shape, &c)?;
                match a.out_dtype {
                    Some(d) if d != x.dtype => self.g.add(Node::Convert(d, v)),
                    _ => v,
                }
            }
            Op::Resize2d(a) => {
                let x = self.tensor_arg(args, 0)?.clone();
                self.resize2d(&x, a, &shape, dtype, &c)?
            }
            Op::GroupNorm(a) | Op::InstanceNorm(a) => {
                self.group_norm(args, a, &shape, dtype, &c)?
            }
            Op::Split(_) | Op::BatchNorm(_) | Op::Dropout { .. } => {
                return Err(self.unsupported("internal: multi-output op".into()));
            }
            Op::Elem(e) => self.elem(*e, args, &shape, dtype, &c)?,
            Op::GatherElements { .. }
            | Op::GatherNd { .. }
            | Op::ScatterElements { .. }
            | Op::ScatterNd { .. }
            | Op::OneHot { .. }
            | Op::Arange(_)
            | Op::Tile { .. }
            | Op::Tril { .. }
            | Op::Triu { .. }
            | Op::Cumsum(_)
            | Op::Cumprod(_)
            | Op::Pad(_) => self.index_op(op, args, &shape, dtype, &c)?,
            Op::Min(_)
            | Op::Prod(_)
            | Op::Argmax { .. }
            | Op::Argmin { .. }
            | Op::Topk(_)
            | Op::Einsum { .. } => self.reduce17(op, args, &shape, &c)?,
            Op::ShapeToTensor => {
                return Err(self.unsupported("shape_to_tensor runs on the CPU".into()));
            }
            Op::Nonzero | Op::Unique(_) | Op::AllClassNms => {
                return Err(self.unsupported(format!(
                    "{}: its result's extent depends on the values: it runs on the CPU",
                    op.name()
                )));
            }
            Op::Opaque(o) => {
                return Err(self.unsupported(format!("no kernel for `{}`", o.name)));
            }
            Op::Attention(_) | Op::AttentionBias(_) => {
                return Err(self.unsupported("attention runs in the cutlass backend".into()));
            }
            Op::Stack { .. }
            | Op::GridSample(_)
            | Op::RoiAlign(_)
            | Op::Bitcast { .. }
            | Op::Det
            | Op::AffineGrid { .. }
            | Op::ReverseSequence { .. }
            | Op::MaxPool1d(_)
            | Op::AvgPool1d(_)
            | Op::MaxPool3d(_)
            | Op::AvgPool3d(_)
            | Op::AdaptiveAvgPool1d(_)
            | Op::AdaptiveAvgPool3d(_) => {
                return Err(self.unsupported(format!(
                    "{} has no CUDA lowering yet: it runs on the CPU",
                    op.name()
                )));
            }
        };
        let node = self.wrap_int(op, node, dtype);
        Ok(Val::T(Tv { node, shape, dtype }))
    }

    /// A prim argument, or a rank-0 constant tensor.
    fn prim_arg(&self, args: &[Val], i: usize) -> Result<f64> {
        match args.get(i) {
            Some(Val::Prim(p)) => Ok(*p),
            Some(Val::T(t)) if t.shape.is_empty() => self
                .g
                .float_value(t.node)
                .ok_or_else(|| self.unsupported(format!("argument {i} must be a constant"))),
            _ => Err(self.unsupported(format!("argument {i} must be a prim value"))),
        }
    }

    fn axes(&self, axes: &[i64], rank: usize) -> Result<Vec<usize>> {
        let mut o = Vec::new();
        for &a in axes {
            o.push(norm_axis(a, rank).ok_or_else(|| self.unsupported("axis out of range".into()))?);
        }
        Ok(o)
    }

    /// Reduction variables for `axes` of `shape`, and the index `c` with those axes replaced.
    fn row_index(
        &mut self,
        c: &[NodeId],
        axes: &[usize],
        shape: &[u64],
    ) -> (Vec<(u32, u64)>, Vec<NodeId>) {
        let mut vars = Vec::new();
        let mut idx = c.to_vec();
        for &a in axes {
            let r = self.row_rvar();
            vars.push((r, shape[a]));
            idx[a] = self.g.add(Node::RVar(r));
        }
        (vars, idx)
    }

    /// `v` clamped to `[0, n)` and the condition `0 <= v < n`.
    fn clamp_in(&mut self, v: NodeId, n: i64) -> (NodeId, NodeId) {
        let zero = self.g.int(0);
        let hi = self.g.int((n - 1).max(0));
        let nn = self.g.int(n);
        let lo_ok = self.g.bin(Bin::Lt, v, zero);
        let hi_ok = self.g.bin(Bin::Lt, v, nn);
        // in = !(v < 0) && (v < n)  ==  select(v < 0, 0, v < n)
        let inb = self.g.select(lo_ok, zero, hi_ok);
        let a = self.g.bin(Bin::Max, v, zero);
        let cl = self.g.bin(Bin::Min, a, hi);
        (cl, inb)
    }

    fn split(&mut self, args: &[Val], axis: i64, spec: &SplitSpec, ty: &Type) -> Result<Val> {
        let x = self.tensor_arg(args, 0)?.clone();
        let Type::Tuple(fields) = ty else {
            return Err(self.unsupported("split must return a tuple".into()));
        };
        let ax = norm_axis(axis, x.shape.len())
            .ok_or_else(|| self.unsupported("axis out of range".into()))?;
        let _ = spec;
        let mut out = Vec::new();
        let mut off = 0i64;
        for f in fields {
            let (shape, dtype) = self.static_tensor(f, "a split part")?;
            let c = self.coords(shape.len());
            let o = self.g.int(off);
            let mut idx = c.clone();
            idx[ax] = self.g.bin(Bin::Add, c[ax], o);
            let node = self.at(&x, &idx);
            off += shape[ax] as i64;
            out.push(Val::T(Tv { node, shape, dtype }));
        }
        Ok(Val::Tuple(out))
    }

    /// `x` (of shape `xs`) at the row-major linear position `lin`.
    fn reshape_from_linear(&mut self, x: &Tv, xs: &[u64], lin: NodeId) -> NodeId {
        let mut idx = vec![lin; xs.len()];
        let mut stride = 1i64;
        for i in (0..xs.len()).rev() {
            let st = self.g.int(stride);
            let d = self.g.int(xs[i] as i64);
            let q = self.g.bin(Bin::Div, lin, st);
            idx[i] = if i == 0 {
                q
            } else {
                self.g.bin(Bin::Rem, q, d)
            };
            stride *= xs[i] as i64;
        }
        self.at(x, &idx)
    }

    fn reshape(&mut self, x: &Tv, shape: &[u64], c: &[NodeId]) -> NodeId {
        // Fast path: the same extents once the 1s are dropped.
        let ne_in: Vec<usize> = (0..x.shape.len()).filter(|&i| x.shape[i] != 1).collect();
        let ne_out: Vec<usize> = (0..shape.len()).filter(|&i| shape[i] != 1).collect();
        if ne_in.len() == ne_out.len()
            && ne_in
                .iter()
                .zip(&ne_out)
                .all(|(&a, &b)| x.shape[a] == shape[b])
        {
            let zero = self.g.int(0);
            let mut idx = vec![zero; x.shape.len()];
            for (&a, &b) in ne_in.iter().zip(&ne_out) {
                idx[a] = c[b];
            }
            return self.at(x, &idx);
        }
        let mut lin = self.g.int(0);
        let mut stride = 1i64;
        for i in (0..shape.len()).rev() {
            let st = self.g.int(stride);
            let t = self.g.bin(Bin::Mul, c[i], st);
            lin = self.g.bin(Bin::Add, lin, t);
            stride *= shape[i] as i64;
        }
        let xs = x.shape.clone();
        self.reshape_from_linear(x, &xs, lin)
    }
}

/// A C identifier from a function name.
pub fn sanitize(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, 'k');
    }
    s
}
