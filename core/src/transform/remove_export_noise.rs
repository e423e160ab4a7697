//! RemoveExportNoise: the guards and casts that ONNX exporters leave around values, removed
//! where the result is provably the same value.
//!
//! Contract:
//!
//! - **Requires** a module that verifies.
//! - **Rewrites**, in every function without `Primitive`, `Composite` or `Codegen`, each
//!   binding `y = ...` below; when `y` becomes one of its operands, that operand must have
//!   `y`'s exact type (dtype and dims, so no broadcast is lost):
//!   - `R.where(c, a, a)` (one expression in both branches) → `a`: both branches give `a`
//!     element for element, whatever `c` holds;
//!   - `R.where(k, a, b)` with a constant mask `k` that is all true → `a`, all false → `b`
//!     (masked_fill with a constant mask, `where(equal(mask, mask))` once folded);
//!   - `R.where(R.isnan(x), k, x)` (the dynamo exporter's NaN guard) when `x` has an integer or
//!     bool dtype → `x`: such values are never NaN;
//!   - `R.astype(R.astype(x, t1), t2)` where the first cast is exact for every value of `x`'s
//!     dtype (bool to anything; int8/uint8 to int32, int64, float16, bfloat16, float32,
//!     float64; int32 to int64, float64; float16/bfloat16 to float32, float64; float32 to
//!     float64) → `R.astype(x, t2)`, or `x` when `t2` is `x`'s dtype: the inner cast keeps the
//!     numeric value (NaN, ±inf and -0.0 included), so the outer cast sees the same number.
//! - **Not** removed: `R.where(R.isnan(x), 0, x)` on a float `x`. After a softmax it is exactly
//!   the guard a fully masked row needs (`exp(-inf - -inf)` is NaN), and no rule here can
//!   prove a float value NaN-free; removing it would change those rows from 0 to NaN.
//! - A var the function returns keeps its binding; dead bindings are removed afterwards.
//!
//! ```text
//! ; before
//! m = R.astype(mask, dtype="int32")            ; mask: bool
//! n = R.astype(m, dtype="bool")
//! y = R.where(n, x, x)
//! ; after: n is `mask` again, and both branches are x
//! ; (y's uses read x)
//! ```

use super::remove_identity::{all_equal_to, constant};
use super::substitute::Substitution;
use crate::error::Result;
use crate::ir::{Callee, DType, ExprId, ExprKind, Function, Module};
use crate::op::{ElemOp, Op};
use crate::pattern::matcher::FunctionView;

/// Runs RemoveExportNoise (see the module doc).
/// Inside the branches of `if`s too (see [`super::regions`]).
pub fn remove_export_noise(m: &Module) -> Result<Module> {
    super::substitute::rewrite_entries(m, remove_in)
}

/// Whether casting any value of `from` to `to` keeps it exactly.
pub(crate) fn exact_cast(from: DType, to: DType) -> bool {
    use DType::*;
    from == to
        || match from {
            Bool => true,
            I8 | U8 => matches!(to, I32 | I64 | F16 | BF16 | F32 | F64),
            I32 => matches!(to, I64 | F64),
            F16 | BF16 => matches!(to, F32 | F64),
            F32 => to == F64,
            I64 | F64 => false,
        }
}

fn dtype_of(f: &Function, e: ExprId) -> Option<DType> {
    f.expr(e).ty.as_tensor().and_then(|t| t.dtype)
}

/// What one binding becomes.
enum Rewrite {
    /// Its uses read this expression.
    Use(ExprId),
    /// Its value becomes `R.astype(x, dtype)`.
    Cast(ExprId, DType),
}

fn rewrite_of(
    f: &Function,
    view: &FunctionView<'_>,
    subst: &Substitution,
    y: crate::ir::VarId,
    op: &Op,
    args: &[ExprId],
) -> Option<Rewrite> {
    let y_ty = &f.var(y).ty;
    let same = |x: ExprId| (&f.expr(x).ty == y_ty).then_some(Rewrite::Use(x));
    let call_of = |e: ExprId| -> Option<(&Op, Vec<ExprId>)> {
        let (_, v) = view.bound(f.as_var(e)?)?;
        match &f.expr(v).kind {
            ExprKind::Call {
                callee: Callee::Op(op),
                args,
            } => Some((op, args.iter().map(|&a| subst.resolve(f, a)).collect())),
            _ => None,
        }
    };
    match op {
        Op::Elem(ElemOp::Where) => {
            let (c, a, b) = (*args.first()?, *args.get(1)?, *args.get(2)?);
            if a == b || (f.as_var(a).is_some() && f.as_var(a) == f.as_var(b)) {
                return same(a);
            }
            if let Some(k) = constant(f, c).filter(|k| k.dtype == DType::Bool) {
                if all_equal_to(k, 1.0) {
                    return same(a);
                }
                if all_equal_to(k, 0.0) {
                    return same(b);
                }
            }
            let (inner, iargs) = call_of(c)?;
            let x = *iargs.first()?;
            let int_like = dtype_of(f, x).is_some_and(|d| d.is_int() || d == DType::Bool);
            if matches!(inner, Op::Elem(ElemOp::IsNan))
                && int_like
                && (x == b || (f.as_var(x).is_some() && f.as_var(x) == f.as_var(b)))
            {
                return same(b);
            }
            None
        }
        Op::Astype { dtype: t2 } => {
            let (inner, iargs) = call_of(*args.first()?)?;
            let Op::Astype { dtype: t1 } = inner else {
                return None;
            };
            let x = *iargs.first()?;
            // `x` is in scope here: not a dataflow var of another block.
            if let Some(xv) = f.as_var(x)
                && f.var(xv).dataflow
                && view.block_of(xv) != view.block_of(y)
            {
                return None;
            }
            let from = dtype_of(f, x)?;
            if !exact_cast(from, *t1) {
                return None;
            }
            if from == *t2 {
                same(x)
            } else {
                Some(Rewrite::Cast(x, *t2))
            }
        }
        _ => None,
    }
}

/// Rewrites what it can in `f`; says whether anything changed.
fn remove_in(f: &mut Function) -> bool {
    let mut subst = Substitution::new(f);
    let mut casts = Vec::new();
    {
        let view = FunctionView::new(f);
        for b in f.bindings() {
            let ExprKind::Call {
                callee: Callee::Op(op),
                args,
            } = &f.expr(b.value).kind
            else {
                continue;
            };
            let args: Vec<ExprId> = args.iter().map(|&a| subst.resolve(f, a)).collect();
            match rewrite_of(f, &view, &subst, b.var, op, &args) {
                Some(Rewrite::Use(x)) => {
                    subst.replace(f, b.var, x);
                }
                Some(Rewrite::Cast(x, t)) => casts.push((b.var, x, t)),
                None => {}
            }
        }
    }
    let changed = !subst.is_empty() || !casts.is_empty();
    for (var, x, t) in casts {
        let ty = f.var(var).ty.clone();
        let call = f.add_expr(
            ExprKind::Call {
                callee: Callee::Op(Op::Astype { dtype: t }),
                args: vec![x],
            },
            ty,
        );
        for b in f.blocks.iter_mut().flat_map(|b| b.bindings.iter_mut()) {
            if b.var == var {
                b.value = call;
            }
        }
    }
    subst.apply(f);
    changed
}
