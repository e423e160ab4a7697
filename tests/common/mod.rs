//! Helpers shared by the integration tests: the random pattern tables of the property tests,
//! partitioning with them, counting ops through calls, and reading the tensors of the TVM
//! fixtures (`tests/tvm/*/*.json`).

#![allow(
    dead_code,
    clippy::panic,
    reason = "each test file uses a subset; test code panics on failure"
)]

use fusebox_core::ir::{Callee, ExprKind, Function, Module};
use fusebox_core::pattern::check::NoLeakingIntermediates;
use fusebox_core::pattern::parse_pattern;
use fusebox_core::transform::{
    FusionPattern, PartitionOptions, fuse_ops_by_pattern, merge_composite_functions,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The most time one property-test case may take: far above any case's real time (the
/// slowest take well under a second in a debug build), far below the time a case that loops
/// takes to exhaust CI's memory.
pub const CASE_TIMEOUT_MS: u32 = 30_000;

/// The config of the integration tests' properties: `cases` cases, run in a child process
/// (proptest's `fork`) that is stopped after [`CASE_TIMEOUT_MS`] per case. A case that hangs
/// or eats memory then fails the test with its shrunk input printed and saved in the test's
/// `.proptest-regressions` file, instead of the whole test binary being killed with no trace
/// (which is how CI met MergeCompositeFunctions' cycle: `partition_numerics` was killed with
/// SIGKILL and nothing said which module did it).
pub fn prop_config(cases: u32) -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        cases,
        fork: true,
        timeout: CASE_TIMEOUT_MS,
        ..proptest::test_runner::Config::default()
    }
}

/// Patterns over the ops of `ir::generate::random_module`.
pub const PATTERNS: &[&str] = &[
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

/// A table from `(index into PATTERNS, with leak check)` pairs; codegens alternate `a`, `b`.
pub fn table(entries: &[(usize, bool)]) -> Vec<FusionPattern> {
    entries
        .iter()
        .enumerate()
        .map(|(i, &(p, check))| {
            let pat = parse_pattern(PATTERNS[p]).unwrap_or_else(|e| panic!("{e}"));
            let codegen = ["a", "b"][i % 2];
            let fp = FusionPattern::new(&format!("{codegen}.p{i}"), pat);
            if check {
                fp.with_check(Arc::new(NoLeakingIntermediates))
            } else {
                fp
            }
        })
        .collect()
}

/// Partitions with `table`: mode 0 plain, 1 with annotate_codegen, 2 then merged.
pub fn partition(m: &Module, entries: &[(usize, bool)], bind_constants: bool, mode: u8) -> Module {
    let opts = PartitionOptions {
        bind_constants,
        annotate_codegen: mode == 1,
    };
    let mut out = fuse_ops_by_pattern(m, &table(entries), opts)
        .unwrap_or_else(|e| panic!("partition failed: {e}"))
        .module;
    if mode == 2 {
        out = merge_composite_functions(&out).unwrap_or_else(|e| panic!("merge failed: {e}"));
    }
    out
}

/// Op multiset of `f` with calls of module functions expanded (local functions included).
pub fn count_ops(m: &Module, f: &Function, out: &mut BTreeMap<String, usize>, depth: usize) {
    assert!(depth < 64, "call graph too deep: a function calls itself");
    // Inside the branches of an `if` too.
    let mut all = Vec::new();
    fusebox_core::ir::for_each_binding_deep(f, &f.blocks, &mut |b| all.push(*b));
    for b in &all {
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

/// No function reaches itself through calls (depth-first with an on-stack set).
pub fn no_call_cycles(m: &Module) {
    fn visit<'m>(m: &'m Module, name: &'m str, stack: &mut Vec<&'m str>, done: &mut Vec<&'m str>) {
        if done.contains(&name) {
            return;
        }
        assert!(
            !stack.contains(&name),
            "call cycle through {name}: {stack:?}"
        );
        stack.push(name);
        if let Some(f) = m.get(name) {
            for (_, d) in f.exprs.iter() {
                if let ExprKind::Call {
                    callee: Callee::Global(g),
                    ..
                } = &d.kind
                    && let Some((k, _)) = m.functions.get_key_value(g.as_ref())
                {
                    visit(m, k, stack, done);
                }
            }
        }
        stack.pop();
        done.push(name);
    }
    let mut done = Vec::new();
    for name in m.functions.keys() {
        visit(m, name, &mut Vec::new(), &mut done);
    }
}

/// A tensor of a TVM fixture (`{"shape": [...], "data": [...]}`): its shape and values as
/// `f32`.
pub fn fixture_tensor(v: &serde_json::Value) -> (Vec<usize>, Vec<f32>) {
    let dims = v["shape"].as_array();
    let shape = dims
        .map(|d| {
            d.iter()
                .filter_map(|x| x.as_u64())
                .map(|x| x as usize)
                .collect()
        })
        .unwrap_or_default();
    let data = v["data"]
        .as_array()
        .map(|d| {
            d.iter()
                .filter_map(serde_json::Value::as_f64)
                .map(|x| x as f32)
                .collect()
        })
        .unwrap_or_default();
    (shape, data)
}
