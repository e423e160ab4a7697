//! The executor's fast path for op chains: finds, in a function's bindings, a `conv2d` whose
//! result is read only by the next binding, which is an inference `batch_norm` of it (then
//! optionally a call of a function that is just `relu` of the first field of its one tuple
//! parameter, as FuseOps makes of ONNX's Conv → BatchNormalization → Relu), or an `add` of it
//! and another value (a per-channel bias or a residual of the output's shape; up to two adds,
//! then optionally a `relu` of the sum, or a `clip` with number bounds (ReLU6), read only
//! there), or a `relu` or `clip` of it; after a `batch_norm`, also a call of a function that is `relu(add(..))` of the
//! `batch_norm`'s first field and a residual of the same shape (a ResNet block's tail as
//! FuseOps outlines it); and runs such a chain as one [`crate::conv::conv2d_fused`] call with the other ops as
//! its epilogue. Likewise an `add` read only by a `relu` runs as one pass.
//!
//! Contract:
//!
//! - [`plan`] looks at the IR only (ops, attributes, which vars read what, the body of a
//!   called function); [`steps`] looks at the run-time values and returns `None` whenever the
//!   chain cannot be fused (a dtype other than `float32`, an output neither `NCHW` nor the
//!   `NHWC` of `NHWC` data, a bias that is
//!   not one value per output channel, a `batch_norm` over another axis, `add` operands of
//!   different shapes); the executor then runs the bindings one by one, so the general path
//!   stays the reference and the fast path only ever replaces it. The executor fuses a
//!   function call only when its call hook does not take that function (no hook, or
//!   [`crate::Executor::run_partitioned`] saying the interpreter runs it): an artifact might
//!   run it otherwise.
//! - A fused chain gives the last binding the value the bindings would have given it, bit for
//!   bit (each [`Step`] repeats its op's arithmetic), and leaves the intermediate vars
//!   unbound (nothing else reads them).
//!
//! ```text
//! lv  = R.nn.conv2d(x, w, ...)           # read only by lv1
//! lv1 = R.add(lv, b)                     # b: (1, O, 1, 1); lv1 read only by gv
//! gv  = R.nn.relu(lv1)                   # -> conv2d_fused(x, w, [Bias(b), Relu])
//! ```

use crate::conv::Step;
use crate::nn;
use crate::util::broadcast_shapes;
use fusebox_core::ir::{Callee, ExprId, ExprKind, Function, Module, PrimValue, VarId};
use fusebox_core::op::{BatchNormAttrs, Conv2dAttrs, Op};
use fusebox_core::runtime::{Tensor, Value};

/// An op of a chain after its first binding.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Link {
    /// `f(prev)` where module function `f` is `relu(param[0])`: follows a `batch_norm`.
    CallRelu,
    /// `f(prev, other)` or `f(other, prev)` where module function `f` is `relu(add(a, b))`,
    /// one operand of the add being field 0 of `prev`'s parameter and the other the other
    /// parameter (`other_field0`: its field 0) — a residual block's `add` + `relu` as FuseOps
    /// outlines it after a `batch_norm`: follows a `batch_norm`.
    CallAddRelu {
        other: ExprId,
        other_field0: bool,
        prev_first: bool,
    },
    /// `batch_norm(prev, gamma, beta, mean, var)` in inference mode; the others are args 1..=4.
    BatchNorm {
        attrs: BatchNormAttrs,
        params: [ExprId; 4],
    },
    /// `add(prev, other)` (`prev_first`) or `add(other, prev)`.
    Add { other: ExprId, prev_first: bool },
    /// `relu(prev)`.
    Relu,
    /// `clip(prev, lo, hi)` with number bounds (ReLU6), as the `float32` kernel reads them.
    Clip { lo: f32, hi: f32 },
}

/// The first binding of a chain.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Head {
    /// `conv2d(data, weight)`.
    Conv {
        data: ExprId,
        weight: ExprId,
        attrs: Conv2dAttrs,
    },
    /// `add(lhs, rhs)` (its only link is a `relu`).
    Add { lhs: ExprId, rhs: ExprId },
}

/// A chain: its first binding, then the following bindings (one per link).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Chain {
    pub head: Head,
    /// The ops of the next `links.len()` bindings.
    pub links: Vec<Link>,
}

/// Counts how often each var is read in `e` (inside the branches of an `if` too).
fn count_uses(f: &Function, e: ExprId, counts: &mut [u32]) {
    fusebox_core::ir::for_each_use(f, e, &mut |v| {
        if let Some(c) = counts.get_mut(v.as_u32() as usize) {
            *c += 1;
        }
    });
}

/// The var an expression names, if it is a plain var.
fn var_of(f: &Function, e: ExprId) -> Option<VarId> {
    match f.exprs.get(e).map(|d| &d.kind) {
        Some(ExprKind::Var(v)) => Some(*v),
        _ => None,
    }
}

/// The op call of binding value `e`: (op, args).
pub(crate) fn op_call(f: &Function, e: ExprId) -> Option<(&Op, &[ExprId])> {
    match f.exprs.get(e).map(|d| &d.kind) {
        Some(ExprKind::Call {
            callee: Callee::Op(op),
            args,
        }) => Some((op, args)),
        _ => None,
    }
}

/// A number prim argument as the `clip` kernel reads it (`f64`, then `f32`).
pub(crate) fn prim_f32(f: &Function, e: ExprId) -> Option<f32> {
    match f.exprs.get(e).map(|d| &d.kind) {
        Some(ExprKind::Prim(PrimValue::Int(i))) => Some(*i as f64 as f32),
        Some(ExprKind::Prim(PrimValue::Float(v, _))) => Some(*v as f32),
        _ => None,
    }
}

/// Whether module function `name` is exactly `relu(p[0])` of its one tuple parameter `p`.
fn is_relu_of_first(module: &Module, name: &str) -> bool {
    let Some(g) = module.get(name) else {
        return false;
    };
    let bindings: Vec<_> = g.bindings().collect();
    let ([p], [b0, b1]) = (g.params.as_slice(), bindings.as_slice()) else {
        return false;
    };
    let first = matches!(
        g.exprs.get(b0.value).map(|d| &d.kind),
        Some(ExprKind::TupleGetItem(t, 0)) if var_of(g, *t) == Some(*p)
    );
    let relu =
        matches!(op_call(g, b1.value), Some((Op::Relu, [x])) if var_of(g, *x) == Some(b0.var));
    first && relu && g.ret.and_then(|r| var_of(g, r)) == Some(b1.var)
}

/// Whether module function `name` is `relu(add(a, b))` of its two parameters (see
/// [`Link::CallAddRelu`]), where parameter `prev` is a tuple whose field 0 is one operand:
/// `Some((prev_first, other_field0))` (whether that field is the add's first operand, and
/// whether the other operand is the other parameter's field 0 rather than the parameter).
fn add_relu_of(module: &Module, name: &str, prev: usize) -> Option<(bool, bool)> {
    let g = module.get(name)?;
    let bindings: Vec<_> = g.bindings().collect();
    let [p0, p1] = g.params.as_slice() else {
        return None;
    };
    let params = [*p0, *p1];
    let other = 1 - prev.min(1);
    // Field-0 bindings first, then the add, then the relu the function returns.
    let (fields, [add, relu]) = bindings.split_at(bindings.len().checked_sub(2)?) else {
        return None;
    };
    let mut field_of: Vec<(VarId, usize)> = Vec::new();
    for b in fields {
        let Some(ExprKind::TupleGetItem(t, 0)) = g.exprs.get(b.value).map(|d| &d.kind) else {
            return None;
        };
        let k = params.iter().position(|&p| var_of(g, *t) == Some(p))?;
        field_of.push((b.var, k));
    }
    // An add operand: (parameter index, through its field 0).
    let source = |e: &ExprId| -> Option<(usize, bool)> {
        let v = var_of(g, *e)?;
        if let Some(k) = params.iter().position(|&p| p == v) {
            return Some((k, false));
        }
        field_of
            .iter()
            .find(|(fv, _)| *fv == v)
            .map(|&(_, k)| (k, true))
    };
    let Some((Op::Add, [a, b])) = op_call(g, add.value) else {
        return None;
    };
    let (sa, sb) = (source(a)?, source(b)?);
    let prev_first = match (sa, sb) {
        (x, (k, f)) if x == (prev, true) && k == other => (true, f),
        ((k, f), y) if y == (prev, true) && k == other => (false, f),
        _ => return None,
    };
    let relu_ok =
        matches!(op_call(g, relu.value), Some((Op::Relu, [x])) if var_of(g, *x) == Some(add.var));
    (relu_ok && fields.len() <= 2 && g.ret.and_then(|r| var_of(g, r)) == Some(relu.var))
        .then_some(prev_first)
}

/// For each binding of `f` (in [`Function::bindings`] order), the chain that starts there
/// (`module` holds the functions `f` calls; `calls(g)`: whether a chain may take in a call of
/// module function `g`).
pub(crate) fn plan(
    module: &Module,
    f: &Function,
    calls: &dyn Fn(&str) -> bool,
) -> Vec<Option<Chain>> {
    let bindings: Vec<_> = f.bindings().copied().collect();
    let mut uses = vec![0u32; f.vars.len()];
    for b in &bindings {
        count_uses(f, b.value, &mut uses);
    }
    if let Some(r) = f.ret {
        count_uses(f, r, &mut uses);
    }
    let once = |v: VarId| uses.get(v.as_u32() as usize) == Some(&1);
    let mut out = vec![None; bindings.len()];
    for (i, b) in bindings.iter().enumerate() {
        let head = match op_call(f, b.value) {
            Some((Op::Conv2d(attrs), [data, weight])) => Head::Conv {
                data: *data,
                weight: *weight,
                attrs: (**attrs).clone(),
            },
            Some((Op::Add, [lhs, rhs])) => Head::Add {
                lhs: *lhs,
                rhs: *rhs,
            },
            _ => continue,
        };
        let conv = matches!(head, Head::Conv { .. });
        let mut links = Vec::new();
        let mut prev = b.var;
        for next in &bindings[i + 1..] {
            if !once(prev) {
                break;
            }
            let is_prev = |e: &ExprId| var_of(f, *e) == Some(prev);
            let after_bn = matches!(links.last(), Some(Link::BatchNorm { .. }));
            let link = match f.exprs.get(next.value).map(|d| &d.kind) {
                Some(ExprKind::Call {
                    callee: Callee::Global(g),
                    args,
                }) if calls(g)
                    && after_bn
                    && matches!(args.as_slice(), [x] if is_prev(x))
                    && is_relu_of_first(module, g) =>
                {
                    Link::CallRelu
                }
                Some(ExprKind::Call {
                    callee: Callee::Global(g),
                    args,
                }) if calls(g)
                    && after_bn
                    && args.len() == 2
                    && is_prev(&args[0]) != is_prev(&args[1]) =>
                {
                    let pos = usize::from(is_prev(&args[1]));
                    let Some((prev_first, other_field0)) = add_relu_of(module, g, pos) else {
                        break;
                    };
                    Link::CallAddRelu {
                        other: args[1 - pos],
                        other_field0,
                        prev_first,
                    }
                }
                _ => match op_call(f, next.value) {
                    Some((Op::BatchNorm(a), [x, g, be, m, v]))
                        if conv && links.is_empty() && !a.training && is_prev(x) =>
                    {
                        Link::BatchNorm {
                            attrs: (**a).clone(),
                            params: [*g, *be, *m, *v],
                        }
                    }
                    // Up to two adds after the conv (or its batch_norm): a per-channel bias
                    // and a residual, as FoldBatchNorm and FuseOps leave a ResNet block's tail.
                    Some((Op::Add, [p, q]))
                        if conv
                            && links.len() < 2
                            && links.iter().all(|l| {
                                matches!(l, Link::Add { .. } | Link::BatchNorm { .. })
                            })
                            && is_prev(p) != is_prev(q) =>
                    {
                        Link::Add {
                            other: if is_prev(p) { *q } else { *p },
                            prev_first: is_prev(p),
                        }
                    }
                    Some((Op::Relu, [x]))
                        if is_prev(x) && matches!(links.last(), None | Some(Link::Add { .. })) =>
                    {
                        Link::Relu
                    }
                    Some((Op::Clip, [x, lo, hi]))
                        if conv
                            && is_prev(x)
                            && matches!(links.last(), None | Some(Link::Add { .. })) =>
                    {
                        match (prim_f32(f, *lo), prim_f32(f, *hi)) {
                            (Some(lo), Some(hi)) => Link::Clip { lo, hi },
                            _ => break,
                        }
                    }
                    _ => break,
                },
            };
            let more = matches!(link, Link::Add { .. } | Link::BatchNorm { .. });
            links.push(link);
            prev = next.var;
            if !more {
                break;
            }
        }
        let useful = match head {
            // A `conv2d` alone too: the chain's path runs it with the weight forms the
            // executor keeps (Winograd-transformed, packed), which the op's path makes again
            // on every call (DenseNet-121's 3×3 layers, each read only by a concatenation).
            Head::Conv { .. } => true,
            Head::Add { .. } => links == [Link::Relu],
        };
        if useful {
            out[i] = Some(Chain { head, links });
        }
    }
    out
}

/// A per-channel bias for an output of `shape` whose channels are indexed by `channel_axes`,
/// outer first ([`crate::conv::out_dims`]: `[1]` for `N × O × H × W`, `[3]` for `NHWC`,
/// `[1, 4]` for `NCHW16c`): `b` must broadcast to `shape` without changing it and vary only
/// along those axes (its data is then in the channels' order).
fn channel_bias(b: &Tensor, shape: &[usize], channel_axes: &[usize]) -> Option<Vec<f32>> {
    let data = b.as_f32()?;
    let rank = shape.len();
    if b.rank() > rank || broadcast_shapes(shape, b.shape()).ok()?.as_slice() != shape {
        return None;
    }
    let channels: usize = channel_axes.iter().map(|&a| shape[a]).product();
    let off = rank - b.rank();
    let per_channel = b
        .shape()
        .iter()
        .enumerate()
        .all(|(j, &d)| d == 1 || channel_axes.contains(&(j + off)));
    if !per_channel {
        return None;
    }
    match data.len() {
        1 => Some(vec![data[0]; channels]),
        n if n == channels => Some(data.to_vec()),
        _ => None,
    }
}

/// The epilogue of a chain, given the run-time values of the links' other operands (in link
/// order: four tensors for a `batch_norm`, one for an `add`, none for a `relu`); `None` when
/// the chain cannot be fused (see the module doc).
pub(crate) fn steps(
    chain: &Chain,
    x: &Tensor,
    w: &Tensor,
    operands: &[Value],
) -> Option<Vec<Step>> {
    let Head::Conv { attrs, .. } = &chain.head else {
        return None;
    };
    let blocked = crate::conv::runs_blocked(x, w, attrs);
    if !blocked && !crate::conv::fusable(x, w, attrs) {
        return None;
    }
    let (shape, axes) = crate::conv::out_dims(x, w, attrs).ok()?;
    let mut rest = operands;
    let mut out = Vec::with_capacity(chain.links.len() + 1);
    for link in &chain.links {
        if let Link::CallAddRelu {
            other_field0,
            prev_first,
            ..
        } = link
        {
            let (v, tail) = rest.split_first()?;
            rest = tail;
            let r = match (v, other_field0) {
                (Value::Tensor(t), false) => t.clone(),
                (Value::Tuple(items), true) => match items.first()? {
                    Value::Tensor(t) => t.clone(),
                    _ => return None,
                },
                _ => return None,
            };
            if r.shape() != shape || r.as_f32().is_none() {
                return None;
            }
            out.push(Step::Residual {
                r,
                prev_first: *prev_first,
            });
            out.push(Step::Relu);
            continue;
        }
        out.push(match link {
            Link::BatchNorm { attrs, .. } => {
                let [g, b, m, v] = rest.get(..4)? else {
                    return None;
                };
                rest = &rest[4..];
                let t = |v: &Value| match v {
                    Value::Tensor(t) => Some(t.clone()),
                    _ => None,
                };
                let (g, b, m, v) = (t(g)?, t(b)?, t(m)?, t(v)?);
                // One channel axis, the batch_norm's (not a split one).
                let &[axis] = axes else {
                    return None;
                };
                if crate::util::norm_axis(attrs.axis, 4).ok()? != axis {
                    return None;
                }
                let (mul, add) = nn::bn_coeffs_f32(&g, &b, &m, &v, shape[axis], attrs).ok()?;
                Step::Affine { mul, add }
            }
            Link::Add { prev_first, .. } => {
                let (Value::Tensor(b), tail) = rest.split_first()? else {
                    return None;
                };
                rest = tail;
                match channel_bias(b, &shape, axes) {
                    Some(b) => Step::Bias {
                        b,
                        bias_first: !prev_first,
                    },
                    // A residual: a tensor of the output's own shape.
                    None if b.shape() == shape && b.as_f32().is_some() => Step::Residual {
                        r: b.clone(),
                        prev_first: *prev_first,
                    },
                    None => return None,
                }
            }
            Link::Relu | Link::CallRelu | Link::CallAddRelu { .. } => Step::Relu,
            Link::Clip { lo, hi } => Step::Clip { lo: *lo, hi: *hi },
        });
    }
    (!blocked || crate::conv::blocked_steps(&out)).then_some(out)
}

/// The value of the chain's last binding, given the fused convolution's output `y`: `y`
/// itself, or for a `batch_norm` the tuple `(y, mean, var)` it returns in inference mode.
pub(crate) fn result(chain: &Chain, y: Tensor, operands: &[Value]) -> Option<Value> {
    match chain.links.last() {
        Some(Link::BatchNorm { .. }) => {
            let n = operands.len().checked_sub(2)?;
            let (Value::Tensor(m), Value::Tensor(v)) = (operands.get(n)?, operands.get(n + 1)?)
            else {
                return None;
            };
            let (m, v) = nn::bn_passthrough(m, v).ok()?;
            Some(Value::Tuple(vec![
                Value::Tensor(y),
                Value::Tensor(m),
                Value::Tensor(v),
            ]))
        }
        _ => Some(Value::Tensor(y)),
    }
}

/// The expressions a chain's links read besides the previous result, in link order.
pub(crate) fn operand_exprs(chain: &Chain) -> Vec<ExprId> {
    let mut out = Vec::new();
    for l in &chain.links {
        match l {
            Link::BatchNorm { params, .. } => out.extend_from_slice(params),
            Link::Add { other, .. } | Link::CallAddRelu { other, .. } => out.push(*other),
            Link::Relu | Link::CallRelu | Link::Clip { .. } => {}
        }
    }
    out
}

/// The chain's name in profiles: its ops joined by `+` (`relax.nn.conv2d+relax.nn.relu`).
pub(crate) fn name(chain: &Chain) -> String {
    let mut s = String::from(match chain.head {
        Head::Conv { .. } => "relax.nn.conv2d",
        Head::Add { .. } => "relax.add",
    });
    for l in &chain.links {
        s.push_str(match l {
            Link::BatchNorm { .. } => "+relax.nn.batch_norm",
            Link::Add { .. } => "+relax.add",
            Link::Relu | Link::CallRelu => "+relax.nn.relu",
            Link::Clip { .. } => "+relax.clip",
            Link::CallAddRelu { .. } => "+relax.add+relax.nn.relu",
        });
    }
    s
}
