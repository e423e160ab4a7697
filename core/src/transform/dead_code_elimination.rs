//! DeadCodeElimination: drop bindings nobody uses and functions nobody calls.
//!
//! Contract:
//!
//! - **Requires** a module that verifies.
//! - **Guarantees**: in every function without `Primitive`, `Composite` or `Codegen`, a binding
//!   whose var is not used (by a later binding or the returned expression, directly or through
//!   other live bindings) is removed; every binding of fusebox's IR is pure (the op set has no
//!   side effects, and calls of module functions are calls of pure Relax functions), so nothing
//!   else is kept. A block left empty by the removal is dropped. Then every private function
//!   (no `global_symbol`) that no public function reaches through calls is removed. Public
//!   functions, the bodies of primitive/composite/codegen functions, names and binding order
//!   are untouched; a module without dead code comes back equal.
//!
//! ```text
//! ; before
//! with R.dataflow():
//!     a = R.exp(x)          ; unused
//!     b = R.nn.relu(x)
//!     R.output(b)
//! ; after
//! with R.dataflow():
//!     b = R.nn.relu(x)
//!     R.output(b)
//! ```

use super::fuse_ops_by_pattern::{PartitionOptions, is_entry};
use super::outline::{DedupIndex, Naming, rewrite};
use crate::error::Result;
use crate::ir::{Callee, EntityId, ExprKind, FuncAttrs, Function, Module, VarId};
use crate::pattern::matcher::{FunctionView, operand_vars};
use std::collections::BTreeSet;

/// Runs DeadCodeElimination (see the module doc).
/// Inside the branches of `if`s too (see [`super::regions`]).
pub fn dead_code_elimination(m: &Module) -> Result<Module> {
    super::regions::map_regions(m, dead_code_elimination_flat)
}

fn dead_code_elimination_flat(m: &Module) -> Result<Module> {
    let mut out = Module::new();
    for (name, f) in &m.functions {
        if is_entry(f)
            && let Some(nf) = remove_unused(f, m)?
        {
            out.insert(name.clone(), nf);
            continue;
        }
        out.insert(name.clone(), f.clone());
    }
    // Functions reachable from the public ones.
    let mut reached: BTreeSet<String> = BTreeSet::new();
    let mut stack: Vec<String> = out
        .functions
        .iter()
        .filter(|(_, f)| !f.is_private())
        .map(|(n, _)| n.clone())
        .collect();
    while let Some(n) = stack.pop() {
        if !reached.insert(n.clone()) {
            continue;
        }
        if let Some(f) = out.get(&n) {
            let mut callees = Vec::new();
            callees_of(f, &mut callees);
            stack.extend(callees.into_iter().filter(|c| !reached.contains(c)));
        }
    }
    out.functions.retain(|n, _| reached.contains(n));
    Ok(out)
}

/// The module functions `f` calls (nested functions included).
fn callees_of(f: &Function, out: &mut Vec<String>) {
    for (_, d) in f.exprs.iter() {
        match &d.kind {
            ExprKind::Call {
                callee: Callee::Global(g),
                ..
            } => out.push(g.to_string()),
            ExprKind::Function(inner) => callees_of(inner, out),
            _ => {}
        }
    }
}

/// `f` without its unused bindings, or `None` when every binding is used.
fn remove_unused(f: &Function, m: &Module) -> Result<Option<Function>> {
    let mut live = vec![false; f.vars.len()];
    let mut ops = Vec::new();
    if let Some(r) = f.ret {
        operand_vars(f, r, &mut ops);
    }
    for v in ops.drain(..) {
        if let Some(l) = live.get_mut(v.index()) {
            *l = true;
        }
    }
    let mut removed = false;
    let mut keep: Vec<Vec<bool>> = f
        .blocks
        .iter()
        .map(|b| vec![true; b.bindings.len()])
        .collect();
    for (bi, block) in f.blocks.iter().enumerate().rev() {
        for (i, b) in block.bindings.iter().enumerate().rev() {
            if !live.get(b.var.index()).copied().unwrap_or(false) {
                keep[bi][i] = false;
                removed = true;
                continue;
            }
            ops.clear();
            operand_vars(f, b.value, &mut ops);
            for v in &ops {
                if let Some(l) = live.get_mut(v.index()) {
                    *l = true;
                }
            }
        }
    }
    if !removed {
        return Ok(None);
    }
    let mut filtered = f.clone();
    filtered.blocks = f
        .blocks
        .iter()
        .zip(&keep)
        .filter_map(|(b, k)| {
            let mut nb = b.clone();
            nb.bindings = b
                .bindings
                .iter()
                .zip(k)
                .filter(|(_, k)| **k)
                .map(|(b, _)| *b)
                .collect();
            (!nb.bindings.is_empty()).then_some(nb)
        })
        .collect();
    // Rewriting with no groups copies what is still reachable into fresh arenas.
    let view = FunctionView::new(&filtered);
    let mut dedup = DedupIndex::default();
    let (nf, _) = rewrite(
        &filtered,
        &view,
        &[] as &[(Vec<VarId>, FuncAttrs)],
        PartitionOptions::default(),
        Naming::Short,
        m,
        &mut dedup,
    )?;
    Ok(Some(nf))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::{parse_module_str, print_module};

    #[test]
    fn removes_dead_bindings_and_uncalled_private_functions() {
        let src = r#"
@I.ir_module
class Module:
    @R.function(private=True)
    def unused(x: R.Tensor((4,), dtype="float32")) -> R.Tensor((4,), dtype="float32"):
        return x

    @R.function
    def main(x: R.Tensor((4,), dtype="float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.nn.relu(a)
            c = R.nn.relu(x)
            R.output(c)
        return c
"#;
        let m = match parse_module_str(src) {
            Ok(m) => m,
            Err(e) => panic!("{e}"),
        };
        let out = match dead_code_elimination(&m) {
            Ok(o) => o,
            Err(e) => panic!("{e}"),
        };
        let s = print_module(&out).text;
        assert!(!s.contains("R.exp"), "{s}");
        assert!(!s.contains("def unused"), "{s}");
        assert!(
            s.contains("c: R.Tensor((4,), dtype=\"float32\") = R.nn.relu(x)"),
            "{s}"
        );
        assert_eq!(out.get("main").map(Function::num_op_calls), Some(1));
        // A second run changes nothing.
        let again = match dead_code_elimination(&out) {
            Ok(o) => o,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(again, out);
    }
}
