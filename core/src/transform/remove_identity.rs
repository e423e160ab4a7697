//! RemoveIdentity: op calls that return their input unchanged are dropped, and their uses read
//! the input.
//!
//! Contract:
//!
//! - **Requires** a module that verifies.
//! - **Rewrites**, in every function without `Primitive`, `Composite` or `Codegen`, each
//!   binding `y = op(x, ...)` below whose type equals `x`'s type (dtype and every dim, symbolic
//!   dims by name, so a broadcast never hides behind it): every use of `y` reads `x`. Each rule
//!   is exact, bit for bit, for every value including NaN, ±inf and -0.0:
//!   - `reshape`, `broadcast_to`, `squeeze`, `flatten` to the shape `x` already has (the
//!     elements keep their row-major order);
//!   - `permute_dims` with the identity permutation (`axes=None` reverses, so only rank ≤ 1);
//!   - `concat` of a tuple of one tensor (a key/value cache concatenated with no past, as
//!     Hugging Face's decoders export it);
//!   - `astype` to `x`'s own dtype;
//!   - `d = R.nn.dropout(x)` in inference: `d[0]` is `x` (fusebox has no training mode;
//!     the CPU kernel returns its input);
//!   - arithmetic with a constant `k` whose every element is the identity and whose dtype is
//!     `x`'s: `x * k`, `k * x`, `x / k` with `k = 1` (`x * 1` is `x` for NaN, ±inf, -0.0);
//!     `x - k` with `k = 0` (`-0.0 - 0.0` is `-0.0`); `x + k`, `k + x` with `k = -0.0`
//!     for floats (`x + -0.0` is `x` for every `x`) and `k = 0` for integers. `x + 0.0` on a
//!     float is **kept**: it turns `-0.0` into `+0.0`.
//! - A var the function returns keeps its binding (outputs keep their names), and a var used
//!   after its dataflow block is not replaced by a dataflow var. Dead bindings are removed
//!   afterwards. Anything else is left as it is.
//!
//! ```text
//! ; before
//! a = R.astype(x, dtype="float32")             ; x is float32
//! b = R.multiply(a, R.const(1.0, "float32"))
//! c = R.nn.relu(b)
//! ; after
//! c = R.nn.relu(x)
//! ```

use super::substitute::Substitution;
use crate::error::Result;
use crate::ir::{Callee, Constant, ExprId, ExprKind, Function, Module, VarId};
use crate::op::Op;
use crate::pattern::matcher::FunctionView;

/// Runs RemoveIdentity (see the module doc).
/// Inside the branches of `if`s too (see [`super::regions`]).
pub fn remove_identity(m: &Module) -> Result<Module> {
    super::substitute::rewrite_entries(m, remove_in)
}

/// Whether every element of `c` equals `v` (bitwise: `-0.0` differs from `0.0`).
pub(crate) fn all_equal_to(c: &Constant, v: f64) -> bool {
    let n = c.numel();
    n > 0
        && (0..n).all(|i| {
            c.get_f64(i)
                .is_some_and(|x| x == v && x.is_sign_negative() == v.is_sign_negative())
        })
}

/// The constant `e` is, if it is one.
pub(crate) fn constant(f: &Function, e: ExprId) -> Option<&Constant> {
    match &f.expr(e).kind {
        ExprKind::Const(c) => Some(c),
        _ => None,
    }
}

fn dtype_of(f: &Function, e: ExprId) -> Option<crate::ir::DType> {
    f.expr(e).ty.as_tensor().and_then(|t| t.dtype)
}

/// What `y` (of the binding `var = op(args)`) is the same as, by the rules of the module doc.
fn identity_of(f: &Function, var: VarId, op: &Op, args: &[ExprId]) -> Option<ExprId> {
    let y_ty = &f.var(var).ty;
    let same = |x: ExprId| (&f.expr(x).ty == y_ty).then_some(x);
    let x = *args.first()?;
    let x_dtype = dtype_of(f, x);
    let is_k = |e: ExprId, v: f64| {
        constant(f, e).is_some_and(|c| Some(c.dtype) == x_dtype && all_equal_to(c, v))
    };
    match op {
        Op::Reshape | Op::BroadcastTo | Op::Squeeze { .. } | Op::Flatten => same(x),
        Op::Astype { dtype } if Some(*dtype) == x_dtype => same(x),
        Op::Concat { .. } => match &f.expr(x).kind {
            ExprKind::Tuple(fields) if fields.len() == 1 => same(fields[0]),
            _ => None,
        },
        Op::PermuteDims { axes } => {
            let rank = f.expr(x).ty.as_tensor()?.rank()?;
            let identity = match axes {
                None => rank <= 1,
                Some(a) => a.iter().enumerate().all(|(i, &v)| v == i as i64),
            };
            if identity { same(x) } else { None }
        }
        Op::Multiply => {
            let y = *args.get(1)?;
            if is_k(y, 1.0) {
                same(x)
            } else if constant(f, x)
                .is_some_and(|c| all_equal_to(c, 1.0) && Some(c.dtype) == dtype_of(f, y))
            {
                same(y)
            } else {
                None
            }
        }
        Op::Divide if is_k(*args.get(1)?, 1.0) => same(x),
        Op::Subtract if is_k(*args.get(1)?, 0.0) => same(x),
        Op::Add => {
            let y = *args.get(1)?;
            let y_dtype = dtype_of(f, y);
            let zero_for = |d: Option<crate::ir::DType>| match d {
                Some(d) if d.is_float() => Some(-0.0),
                Some(d) if d.is_int() => Some(0.0),
                _ => None,
            };
            if let Some(z) = zero_for(x_dtype)
                && is_k(y, z)
            {
                same(x)
            } else if let Some(z) = zero_for(y_dtype)
                && constant(f, x).is_some_and(|c| Some(c.dtype) == y_dtype && all_equal_to(c, z))
            {
                same(y)
            } else {
                None
            }
        }
        _ => None,
    }
}

/// Removes what it can in `f`; says whether anything changed.
fn remove_in(f: &mut Function) -> bool {
    let mut subst = Substitution::new(f);
    let view = FunctionView::new(f);
    for b in f.bindings() {
        let target = match &f.expr(b.value).kind {
            ExprKind::Call {
                callee: Callee::Op(op),
                args,
            } => {
                let args: Vec<ExprId> = args.iter().map(|&a| subst.resolve(f, a)).collect();
                identity_of(f, b.var, op, &args)
            }
            // `d[0]` of an inference dropout is its input.
            ExprKind::TupleGetItem(t, 0) => {
                let t = subst.resolve(f, *t);
                f.as_var(t)
                    .and_then(|d| view.bound(d))
                    .map(|(_, v)| v)
                    .and_then(|v| match &f.expr(v).kind {
                        ExprKind::Call {
                            callee: Callee::Op(Op::Dropout { .. }),
                            args,
                        } => args.first().copied(),
                        _ => None,
                    })
                    .and_then(|x| {
                        let x = subst.resolve(f, x);
                        (f.expr(x).ty == f.var(b.var).ty).then_some(x)
                    })
            }
            _ => None,
        };
        if let Some(x) = target {
            subst.replace(f, b.var, x);
        }
    }
    drop(view);
    let changed = !subst.is_empty();
    subst.apply(f);
    changed
}
