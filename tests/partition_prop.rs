//! Property test: for random DAGs of up to 300 ops and random pattern tables, FuseOpsByPattern
//! (optionally with annotate_codegen or MergeCompositeFunctions) gives a module that verifies,
//! keeps every original op exactly once (counting each call of a shared function), and whose
//! call graph has no cycle (no function calls itself, directly or not).

#![allow(clippy::panic, reason = "test code: a failure is a panic")]

mod common;

use fusebox_core::ir::generate::random_module;
use fusebox_core::ir::verify::verify;
use fusebox_core::ir::{Callee, ExprKind, Module};
use fusebox_core::text;
use proptest::prelude::*;
use std::collections::BTreeMap;

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
    #![proptest_config(common::prop_config(96))]

    #[test]
    fn partition_keeps_every_op_once_and_verifies(
        seed in any::<u64>(),
        ops in 1usize..300,
        table in proptest::collection::vec((0usize..common::PATTERNS.len(), any::<bool>()), 1..6),
        bind_constants in any::<bool>(),
        mode in 0u8..3,
    ) {
        let m = random_module(seed, ops);
        let out = common::partition(&m, &table, bind_constants, mode);
        if let Err(e) = verify(&out) {
            panic!("output does not verify: {e}\n{}", text::print_module(&out).text);
        }
        no_self_calls(&out);
        common::no_call_cycles(&out);
        let (mut before, mut after) = (BTreeMap::new(), BTreeMap::new());
        let main_in = m.get("main").unwrap_or_else(|| panic!("no main"));
        let main_out = out.get("main").unwrap_or_else(|| panic!("no main after"));
        common::count_ops(&m, main_in, &mut before, 0);
        common::count_ops(&out, main_out, &mut after, 0);
        prop_assert_eq!(before, after);
        // The printed result parses back.
        let printed = text::print_module(&out).text;
        prop_assert!(text::parse_module_str(&printed).is_ok(), "{}", printed);
    }
}
