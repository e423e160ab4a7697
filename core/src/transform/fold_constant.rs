//! FoldConstant: an op call whose arguments are all known at compile time is evaluated once
//! and replaced by its value, as TVM's `relax.transform.FoldConstant`.
//!
//! Contract:
//!
//! - **Requires** a module that verifies, and an [`Evaluator`]: fusebox-core has no kernels,
//!   so the caller passes one (the `fusebox` facade passes the CPU reference backend's
//!   `eval_op`, so a folded value is bit for bit what the CPU reference computes at run time).
//! - **Rewrites**, in every function without `Primitive`, `Composite` or `Codegen`, in binding
//!   order, each `v = op(args)` whose arguments are all constants (inline, bound vars already
//!   folded, static shapes, int/float prim values, tuples of those), whose type is a tensor of
//!   static shape, and whose result is not too large (below): the call is evaluated, and
//!   every use of `v` reads the constant instead (a returned `v` keeps its binding, now
//!   `v = <constant>`, so outputs keep their names). Folding a binding can make the next
//!   constant, so chains fold in one run. Dead bindings are removed afterwards.
//! - **Size rule**: a result of at most [`SMALL_ELEMS`] elements always folds; a larger one
//!   folds only when it has no more elements than its tensor arguments together. So
//!   `permute_dims` / `reshape` / `astype` / arithmetic on weights fold, while
//!   `broadcast_to(R.const(0), R.shape([4096, 4096]))` (and `full`/`ones`/`zeros`-like fills,
//!   `tile`, `arange` of a large extent) stay in the program: folding them would put a
//!   large constant in the module for what the kernel makes on the fly from a scalar, as TVM
//!   keeps `full`/`broadcast_to` out of FoldConstant for the same reason.
//! - Not folded: calls of functions (only op calls fold), ops returning tuples (`split`,
//!   `topk`, `batch_norm`), and any call the evaluator refuses (an error there leaves the
//!   call as it is: it fails at run time with its own message, as it would have).
//!
//! ```text
//! ; before
//! lv8 = R.permute_dims(metadata["relax.expr.Constant"][16], axes=None)   ; [10, 32] weight
//! lv9 = R.matmul(x, lv8, out_dtype=None)
//! ; after
//! lv9 = R.matmul(x, metadata["relax.expr.Constant"][16], out_dtype=None)  ; [32, 10], transposed
//! ```

use super::substitute::Substitution;
use crate::error::Result;
use crate::ir::{Callee, Constant, Dim, ExprId, ExprKind, Function, Module, PrimValue};
use crate::op::Op;
use crate::runtime::{Prim, Tensor, Value};
use std::sync::Arc;

/// Evaluates one op on constant arguments (the CPU reference backend's `eval_op`).
pub type Evaluator = Arc<dyn Fn(&Op, &[Value]) -> Result<Value> + Send + Sync>;

/// A folded result of at most this many elements folds whatever its arguments' size.
pub const SMALL_ELEMS: usize = 1024;

/// Runs FoldConstant with `eval` (see the module doc); inside the branches of `if`s too (see
/// [`super::regions`]).
pub fn fold_constant(m: &Module, eval: &Evaluator) -> Result<Module> {
    super::substitute::rewrite_entries(m, |f| fold_in(f, eval))
}

/// The run-time value of a compile-time-known argument, and its element count (0 for
/// non-tensors).
fn known(f: &Function, e: ExprId) -> Option<(Value, usize)> {
    match &f.expr(e).kind {
        ExprKind::Const(c) => Some((Value::Tensor(Tensor::from_constant(c).ok()?), c.numel())),
        ExprKind::ShapeLit(dims) => {
            let s: Option<Vec<i64>> = dims.iter().map(Dim::as_static).collect();
            Some((Value::Shape(s?), 0))
        }
        ExprKind::Prim(PrimValue::Int(i)) => Some((Value::Prim(Prim::Int(*i)), 0)),
        ExprKind::Prim(PrimValue::Float(x, _)) => Some((Value::Prim(Prim::Float(*x)), 0)),
        _ => None,
    }
}

/// Folds what it can in `f`; says whether anything changed.
fn fold_in(f: &mut Function, eval: &Evaluator) -> bool {
    let mut subst = Substitution::new(f);
    let mut changed = false;
    let bindings: Vec<_> = f.bindings().copied().collect();
    for b in bindings {
        let ExprKind::Call {
            callee: Callee::Op(op),
            args,
        } = &f.expr(b.value).kind
        else {
            continue;
        };
        let (op, args) = (op.clone(), args.clone());
        let Some(out_elems) = static_numel(f, b.var) else {
            continue;
        };
        // Cheap test first: constants are decoded only when every argument is known.
        let args: Vec<ExprId> = args.iter().map(|&a| subst.resolve(f, a)).collect();
        let leaf_known = |e: ExprId| match &f.expr(e).kind {
            ExprKind::Const(_) | ExprKind::Prim(PrimValue::Int(_) | PrimValue::Float(..)) => true,
            ExprKind::ShapeLit(dims) => dims.iter().all(|d| d.as_static().is_some()),
            _ => false,
        };
        let cheap = args.iter().all(|&a| match &f.expr(a).kind {
            ExprKind::Tuple(fields) => fields.iter().all(|&x| leaf_known(subst.resolve(f, x))),
            _ => leaf_known(a),
        });
        if !cheap {
            continue;
        }
        let mut vals = Vec::with_capacity(args.len());
        let mut in_elems = 0usize;
        let mut all_known = true;
        for &a in &args {
            let got = match &f.expr(a).kind {
                ExprKind::Tuple(fields) => fields
                    .iter()
                    .map(|&x| known(f, subst.resolve(f, x)))
                    .collect::<Option<Vec<_>>>()
                    .map(|vs| {
                        let n = vs.iter().map(|v| v.1).sum();
                        (Value::Tuple(vs.into_iter().map(|v| v.0).collect()), n)
                    }),
                _ => known(f, a),
            };
            match got {
                Some((v, n)) => {
                    vals.push(v);
                    in_elems = in_elems.saturating_add(n);
                }
                None => {
                    all_known = false;
                    break;
                }
            }
        }
        if !all_known || (out_elems > SMALL_ELEMS && out_elems > in_elems) {
            continue;
        }
        let Ok(Value::Tensor(t)) = eval(&op, &vals) else {
            continue;
        };
        let Ok(c) = t.to_constant() else { continue };
        if !f.var(b.var).ty.accepts(&c.ty()) {
            continue;
        }
        let ce = add_const(f, c);
        if !subst.replace(f, b.var, ce) {
            // A returned var keeps its name: its binding now holds the constant.
            for x in f.blocks.iter_mut().flat_map(|bl| bl.bindings.iter_mut()) {
                if x.var == b.var {
                    x.value = ce;
                }
            }
        }
        changed = true;
    }
    subst.apply(f);
    changed
}

fn add_const(f: &mut Function, c: Constant) -> ExprId {
    let ty = c.ty();
    f.add_expr(ExprKind::Const(c), ty)
}

/// The element count of `var`'s tensor type, when its shape is static.
fn static_numel(f: &Function, var: crate::ir::VarId) -> Option<usize> {
    let t = f.var(var).ty.as_tensor()?;
    let dims = t.dims.as_ref()?;
    dims.iter().try_fold(1usize, |acc, d| {
        acc.checked_mul(usize::try_from(d.as_static()?).ok()?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::{parse_module_str, print_module};
    use std::sync::Mutex;

    fn module() -> Module {
        let src = "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: R.Tensor((2,), dtype=\"float32\")):\n        with R.dataflow():\n            a = R.add(R.const(1.0, \"float32\"), R.const(2.0, \"float32\"))\n            big = R.broadcast_to(R.const(1.0, \"float32\"), R.shape([2048]))\n            y = R.add(x, a)\n            R.output(y, big)\n        return (y, big)\n";
        parse_module_str(src).unwrap_or_else(|e| unreachable!("{e}"))
    }

    #[test]
    fn an_evaluator_error_leaves_the_call_and_large_fills_are_never_evaluated() {
        let m = module();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let failing: Evaluator = Arc::new(move |op, _| {
            if let Ok(mut l) = log.lock() {
                l.push(op.name().to_string());
            }
            Err(crate::Error::Runtime("no kernels here".into()))
        });
        let out = fold_constant(&m, &failing).unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(print_module(&out).text, print_module(&m).text);
        // Only the small add was offered: the 2048-element broadcast of a scalar is over the
        // size rule and is not evaluated at all.
        let names = seen.lock().map(|l| l.clone()).unwrap_or_default();
        assert_eq!(names, vec!["relax.add"]);
    }

    #[test]
    fn a_folded_scalar_replaces_its_uses() {
        let m = module();
        let add: Evaluator = Arc::new(|op, args| match (op, args) {
            (Op::Add, [Value::Tensor(a), Value::Tensor(b)]) => {
                let v = a.to_f64_vec()[0] + b.to_f64_vec()[0];
                Ok(Value::Tensor(Tensor::from_f32(vec![], vec![v as f32])?))
            }
            _ => Err(crate::Error::Runtime("unexpected".into())),
        });
        let out = fold_constant(&m, &add).unwrap_or_else(|e| unreachable!("{e}"));
        let text = print_module(&out).text;
        assert!(
            text.contains("R.add(x, R.const(3.0, \"float32\"))"),
            "{text}"
        );
        assert!(!text.contains(" a:"), "{text}");
        assert!(text.contains("R.broadcast_to("), "{text}");
    }
}
