//! EliminateCommonSubexpr: a binding that repeats an earlier op call (the same op, the same
//! attributes, the same arguments) reads the earlier result instead, as TVM's
//! `relax.transform.EliminateCommonSubexpr` does. Exporters repeat per-layer computations of
//! shared values (each BERT layer rebuilds the same attention mask); after this pass they are
//! computed once.
//!
//! Contract:
//!
//! - **Requires** a module that verifies.
//! - **Rewrites**, in every function without `Primitive`, `Composite` or `Codegen`, each binding
//!   `y = op(args)` of an op of the op set (not an opaque op: its effects are unknown) whose op,
//!   attributes (compared by their printed form), arguments and type equal those of an earlier
//!   binding `x = op(args)`: every use of `y` reads `x`. Arguments are equal when they are the
//!   same var (after earlier replacements) or equal constants (by value up to 4,096 bytes of
//!   data, larger ones only when they share their data). All op calls are pure, so `y` and `x`
//!   hold the same value, bit for bit.
//! - `x` must be visible wherever `y` is used: a dataflow var replaces only vars of its own
//!   dataflow block. A var the function returns keeps its binding (outputs keep their names).
//!   Dead bindings are removed afterwards. Anything else is left as it is.
//!
//! ```text
//! ; before
//! m0 = R.where(mask, R.const(0.0, "float32"), R.const(-inf, "float32"))
//! a0 = R.add(s0, m0)
//! m1 = R.where(mask, R.const(0.0, "float32"), R.const(-inf, "float32"))
//! a1 = R.add(s1, m1)
//! ; after
//! m0 = R.where(mask, R.const(0.0, "float32"), R.const(-inf, "float32"))
//! a0 = R.add(s0, m0)
//! a1 = R.add(s1, m0)
//! ```

use super::substitute::Substitution;
use crate::error::Result;
use crate::ir::{Callee, DType, ExprId, ExprKind, Function, Module, VarId};
use crate::op::Op;
use std::collections::HashMap;

/// Constants up to this many bytes of data compare by value; larger ones by their data's
/// address (hashing every weight of a model would cost more than it could save).
const BY_VALUE_BYTES: usize = 4096;

/// Runs EliminateCommonSubexpr (see the module doc); inside the branches of `if`s too (see
/// [`super::regions`]).
pub fn eliminate_common_subexpr(m: &Module) -> Result<Module> {
    super::substitute::rewrite_entries(m, eliminate_in)
}

/// An argument as the key of a call compares it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Arg {
    /// A var (after replacements).
    Var(VarId),
    /// A small constant, by value.
    Value(DType, Vec<i64>, Vec<u8>),
    /// A large constant, by the address of its data (and its type).
    Shared(DType, Vec<i64>, usize),
}

/// What makes two calls the same: the op with its attributes (printed), the arguments, the
/// result type (printed).
type Key = (String, Vec<Arg>, String);

fn arg_key(f: &Function, subst: &Substitution, e: ExprId) -> Option<Arg> {
    let e = subst.resolve(f, e);
    match &f.expr(e).kind {
        ExprKind::Var(v) => Some(Arg::Var(*v)),
        ExprKind::Const(c) if c.data.len() <= BY_VALUE_BYTES => {
            Some(Arg::Value(c.dtype, c.shape.clone(), c.data.to_vec()))
        }
        ExprKind::Const(c) => Some(Arg::Shared(
            c.dtype,
            c.shape.clone(),
            c.data.as_ptr() as usize,
        )),
        // Shapes, tuples and other argument forms: not compared (the call is kept).
        _ => None,
    }
}

/// Replaces repeated calls in `f`; says whether anything changed.
fn eliminate_in(f: &mut Function) -> bool {
    let mut subst = Substitution::new(f);
    // Key → the var that computed it last where it is visible, and its block.
    let mut seen: HashMap<Key, (VarId, usize)> = HashMap::new();
    for (bi, block) in f.blocks.iter().enumerate() {
        for b in &block.bindings {
            let ExprKind::Call {
                callee: Callee::Op(op),
                args,
            } = &f.expr(b.value).kind
            else {
                continue;
            };
            if matches!(op, Op::Opaque(_)) {
                continue;
            }
            let Some(args) = args
                .iter()
                .map(|&a| arg_key(f, &subst, a))
                .collect::<Option<Vec<Arg>>>()
            else {
                continue;
            };
            let key = (format!("{op:?}"), args, format!("{:?}", f.var(b.var).ty));
            match seen.get(&key) {
                Some(&(x, xb)) if !f.var(x).dataflow || xb == bi => {
                    let by = f.var(x).expr;
                    subst.replace(f, b.var, by);
                }
                // Not visible here: this binding computes it for what follows.
                _ => {
                    seen.insert(key, (b.var, bi));
                }
            }
        }
    }
    let changed = !subst.is_empty();
    subst.apply(f);
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::{parse_module_str, print_module};

    fn run(src: &str) -> String {
        let m = parse_module_str(src).unwrap_or_else(|e| panic!("{e}"));
        let out = eliminate_common_subexpr(&m).unwrap_or_else(|e| panic!("{e}"));
        crate::ir::verify::verify(&out).unwrap_or_else(|e| panic!("{e:?}"));
        print_module(&out).text
    }

    const SRC: &str = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((4, 4), dtype="float32"), y: R.Tensor((4, 4), dtype="float32")) -> R.Tensor((4, 4), dtype="float32"):
        with R.dataflow():
            a: R.Tensor((4, 4), dtype="float32") = R.add(x, R.const(1.0, "float32"))
            b: R.Tensor((4, 4), dtype="float32") = R.add(x, R.const(1.0, "float32"))
            c: R.Tensor((4, 4), dtype="float32") = R.add(x, R.const(2.0, "float32"))
            d: R.Tensor((4, 4), dtype="float32") = R.nn.softmax(a, axis=-1)
            e: R.Tensor((4, 4), dtype="float32") = R.nn.softmax(b, axis=-1)
            g: R.Tensor((4, 4), dtype="float32") = R.nn.softmax(b, axis=0)
            h: R.Tensor((4, 4), dtype="float32") = R.add(y, x)
            s: R.Tensor((4, 4), dtype="float32") = R.add(d, e)
            t: R.Tensor((4, 4), dtype="float32") = R.add(s, c)
            u: R.Tensor((4, 4), dtype="float32") = R.add(t, g)
            gv: R.Tensor((4, 4), dtype="float32") = R.add(u, h)
            R.output(gv)
        return gv
"#;

    #[test]
    fn a_repeated_call_reads_the_first_and_chains_follow() {
        let out = run(SRC);
        // b is a; then e = softmax(b, -1) is d (found through b → a).
        assert!(!out.contains(" b: "), "{out}");
        assert!(!out.contains(" e: "), "{out}");
        assert!(
            out.contains("s: R.Tensor((4, 4), dtype=\"float32\") = R.add(d, d)"),
            "{out}"
        );
        // Different constants, attributes or operand order are different calls.
        assert!(out.contains(" c: "), "{out}");
        assert!(
            out.contains("g: R.Tensor((4, 4), dtype=\"float32\") = R.nn.softmax(a, axis=0)"),
            "{out}"
        );
        assert!(out.contains(" h: "), "{out}");
    }

    #[test]
    fn a_dataflow_var_does_not_replace_a_var_of_another_block() {
        let src = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((4, 4), dtype="float32")) -> R.Tensor((4, 4), dtype="float32"):
        with R.dataflow():
            a: R.Tensor((4, 4), dtype="float32") = R.exp(x)
            gv: R.Tensor((4, 4), dtype="float32") = R.add(a, a)
            R.output(gv)
        b: R.Tensor((4, 4), dtype="float32") = R.exp(x)
        c: R.Tensor((4, 4), dtype="float32") = R.exp(x)
        d: R.Tensor((4, 4), dtype="float32") = R.add(gv, b)
        e: R.Tensor((4, 4), dtype="float32") = R.add(d, c)
        return e
"#;
        let out = run(src);
        // b stays (a is a dataflow var of the first block); c reads b.
        assert!(
            out.contains(" b: R.Tensor((4, 4), dtype=\"float32\") = R.exp(x)"),
            "{out}"
        );
        assert!(!out.contains(" c: "), "{out}");
        assert!(out.contains("R.add(d, b)"), "{out}");
    }
}
