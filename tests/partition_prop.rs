//! Property test: for random DAGs of up to 300 ops and random pattern tables, FuseOpsByPattern
//! (optionally with annotate_codegen or MergeCompositeFunctions) gives a module that verifies,
//! keeps every original op exactly once (counting each call of a shared function), and whose
//! call graph has no cycle (no function calls itself, directly or not).

#![allow(clippy::panic, reason = "test code: a failure is a panic")]

use fusebox_core::ir::generate::random_module;
use fusebox_core::ir::verify::verify;
use fusebox_core::ir::{Callee, ExprKind, Function, Module};
use fusebox_core::pattern::check::NoLeakingIntermediates;
use fusebox_core::pattern::parse_pattern;
use fusebox_core::text;
use fusebox_core::transform::{
    FusionPattern, PartitionOptions, fuse_ops_by_pattern, merge_composite_functions,
};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

const PATTERNS: &[&str] = &[
    "relax.nn.relu(_)",
    "relax.add(_, _)",
    "relax.matmul(_, _)",
    "relax.nn.relu(relax.add(_, _))",
    "relax.add(relax.matmul(_, _), _)",
    "relax.nn.relu(relax.add(relax.matmul(_, _), _))",
    "relax.nn.relu(relax.matmul(_, _)) | relax.add(relax.matmul(_, _), _)",
    "relax.add(relax.nn.relu(_), _)",
    "relax.add(w @ _, w @ _)",
    "relax.add(_, const)",
    "relax.nn.relu(relax.nn.relu(_))",
    "relax.add(_[?], _)",
    "relax.add(relax.add(_, _), relax.add(_, _))",
    "relax.matmul(relax.nn.relu(_), _) | relax.nn.relu(relax.matmul(relax.add(_, _), _))",
];

/// Op multiset of `f` with calls of module functions expanded (local functions included).
fn count_ops(m: &Module, f: &Function, out: &mut BTreeMap<String, usize>, depth: usize) {
    assert!(depth < 64, "call graph too deep: a function calls itself");
    for b in f.bindings() {
        match &f.expr(b.value).kind {
            ExprKind::Call {
                callee: Callee::Op(op),
                ..
            } => {
                *out.entry(op.name().to_string()).or_default() += 1;
            }
            ExprKind::Call {
                callee: Callee::Global(g),
                ..
            } => {
                let callee = m.get(g).unwrap_or_else(|| panic!("missing function {g}"));
                count_ops(m, callee, out, depth + 1);
            }
            ExprKind::Function(inner) => {
                // Counted where it is called.
                let _ = inner;
            }
            ExprKind::Call {
                callee: Callee::Local(v),
                ..
            } => {
                let local = f
                    .bindings()
                    .find(|x| x.var == *v)
                    .map(|x| &f.expr(x.value).kind);
                if let Some(ExprKind::Function(inner)) = local {
                    count_ops(m, inner, out, depth + 1);
                }
            }
            _ => {}
        }
    }
}

fn no_self_calls(m: &Module) {
    for (name, f) in &m.functions {
        let mut stack = vec![(f, 0usize)];
        while let Some((g, depth)) = stack.pop() {
            assert!(depth < 64, "{name} reaches itself through calls");
            for (_, d) in g.exprs.iter() {
                match &d.kind {
                    ExprKind::Call {
                        callee: Callee::Global(c),
                        ..
                    } => {
                        assert_ne!(c.as_ref(), name.as_str(), "{name} calls itself");
                        if let Some(cf) = m.get(c) {
                            stack.push((cf, depth + 1));
                        }
                    }
                    ExprKind::Function(inner) => stack.push((inner, depth + 1)),
                    _ => {}
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn partition_keeps_every_op_once_and_verifies(
        seed in any::<u64>(),
        ops in 1usize..300,
        table in proptest::collection::vec((0usize..PATTERNS.len(), any::<bool>()), 1..6),
        bind_constants in any::<bool>(),
        mode in 0u8..3,
    ) {
        let m = random_module(seed, ops);
        let patterns: Vec<FusionPattern> = table
            .iter()
            .enumerate()
            .map(|(i, &(p, check))| {
                let pat = parse_pattern(PATTERNS[p]).unwrap_or_else(|e| panic!("{e}"));
                let codegen = ["a", "b"][i % 2];
                let fp = FusionPattern::new(&format!("{codegen}.p{i}"), pat);
                if check { fp.with_check(Arc::new(NoLeakingIntermediates)) } else { fp }
            })
            .collect();
        let opts = PartitionOptions { bind_constants, annotate_codegen: mode == 1 };
        let mut out = fuse_ops_by_pattern(&m, &patterns, opts)
            .unwrap_or_else(|e| panic!("partition failed: {e}"))
            .module;
        if mode == 2 {
            out = merge_composite_functions(&out).unwrap_or_else(|e| panic!("merge failed: {e}"));
        }
        if let Err(e) = verify(&out) {
            panic!("output does not verify: {e}\n{}", text::print_module(&out).text);
        }
        no_self_calls(&out);
        let (mut before, mut after) = (BTreeMap::new(), BTreeMap::new());
        let main_in = m.get("main").unwrap_or_else(|| panic!("no main"));
        let main_out = out.get("main").unwrap_or_else(|| panic!("no main after"));
        count_ops(&m, main_in, &mut before, 0);
        count_ops(&out, main_out, &mut after, 0);
        prop_assert_eq!(before, after);
        // The printed result parses back.
        let printed = text::print_module(&out).text;
        prop_assert!(text::parse_module_str(&printed).is_ok(), "{}", printed);
    }
}
