//! Property test: for random DAGs (elementwise, broadcast, reduction, injective, tuple and
//! anchor ops over several blocks), FuseOps at opt levels 0..=2 with max_depth 1..=8 — alone, or
//! after FuseOpsByPattern — gives a module that verifies, keeps every original op exactly once
//! (counting through calls), has no call cycle, never outlines a group larger than max_depth,
//! leaves composites untouched, prints to text that parses back, and keeps the provenance of
//! every binding of `main`.

#![allow(clippy::panic, reason = "test code: a failure is a panic")]

mod common;

use fusebox_core::ir::Module;
use fusebox_core::ir::generate::{random_fusion_module, random_module};
use fusebox_core::ir::verify::verify;
use fusebox_core::pattern::parse_pattern;
use fusebox_core::text;
use fusebox_core::transform::{FusionPattern, PartitionOptions, fuse_ops, fuse_ops_by_pattern};
use proptest::prelude::*;
use std::collections::BTreeMap;

fn check(m: &Module, out: &Module, opt_level: u32, max_depth: usize) -> Result<(), TestCaseError> {
    if let Err(e) = verify(out) {
        panic!(
            "output does not verify: {e}\n{}",
            text::print_module(out).text
        );
    }
    common::no_call_cycles(out);
    let (mut before, mut after) = (BTreeMap::new(), BTreeMap::new());
    common::count_ops(
        m,
        m.get("main").unwrap_or_else(|| panic!("no main")),
        &mut before,
        0,
    );
    common::count_ops(
        out,
        out.get("main").unwrap_or_else(|| panic!("no main after")),
        &mut after,
        0,
    );
    prop_assert_eq!(before, after);
    for (name, f) in &out.functions {
        // Functions that were already there (composites) are unchanged.
        if let Some(orig) = m.get(name) {
            if orig.attrs.composite.is_some() {
                prop_assert_eq!(orig, f);
            }
            continue;
        }
        if f.attrs.composite.is_some() {
            continue;
        }
        prop_assert!(opt_level > 0, "opt_level 0 made {}", name);
        prop_assert!(f.attrs.is_primitive());
        let n = f.bindings().count();
        prop_assert!(
            n >= 2 && n <= max_depth,
            "{} has {} bindings (max {})",
            name,
            n,
            max_depth
        );
    }
    let printed = text::print_module(out).text;
    prop_assert!(text::parse_module_str(&printed).is_ok(), "{}", printed);
    origins_kept(m, out)
}

/// `m` with every var of every function given its `<function>/<name>` origin, as the parser
/// gives them.
fn with_origins(mut m: Module) -> Module {
    for (name, f) in m.functions.iter_mut() {
        f.set_origins(name);
    }
    m
}

/// Provenance (issue 18): every binding of the input's `main` is still accounted for in the
/// output's `main`, by a var whose origins include it (its own copy, or the call of the group
/// it was outlined into), so `explain` can follow it.
fn origins_kept(m: &Module, out: &Module) -> Result<(), TestCaseError> {
    let (Some(before), Some(after)) = (m.get("main"), out.get("main")) else {
        return Ok(());
    };
    for b in before.bindings() {
        let v = before.var(b.var);
        let Some(o) = v.origin.first() else {
            continue;
        };
        prop_assert!(
            after
                .bindings()
                .any(|a| after.var(a.var).origin.contains(o)),
            "the origin {} of `{}` is lost",
            o,
            v.name
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(common::prop_config(128))]

    #[test]
    fn fuse_ops_keeps_every_op_once_and_verifies(
        seed in any::<u64>(),
        ops in 1usize..250,
        opt_level in 0u32..=2,
        max_depth in 1usize..=8,
        extended in any::<bool>(),
    ) {
        let m = with_origins(if extended { random_fusion_module(seed, ops) } else { random_module(seed, ops) });
        let out = fuse_ops(&m, opt_level, max_depth)
            .unwrap_or_else(|e| panic!("fuse_ops failed: {e}"));
        check(&m, &out, opt_level, max_depth)?;
        // Running it again changes nothing more (primitive calls are opaque; groups are final).
        let again = fuse_ops(&out, opt_level, max_depth)
            .unwrap_or_else(|e| panic!("second fuse_ops failed: {e}"));
        prop_assert_eq!(again.functions.len(), out.functions.len());
    }

    #[test]
    fn fuse_ops_after_partition_leaves_composites(
        seed in any::<u64>(),
        ops in 1usize..200,
        opt_level in 0u32..=2,
        max_depth in 1usize..=8,
    ) {
        let m = with_origins(random_fusion_module(seed, ops));
        let pat = parse_pattern("relax.nn.relu(relax.add(_, _))").unwrap_or_else(|e| panic!("{e}"));
        let parted = fuse_ops_by_pattern(&m, &[FusionPattern::new("a.add_relu", pat)], PartitionOptions::default())
            .unwrap_or_else(|e| panic!("partition failed: {e}"))
            .module;
        let out = fuse_ops(&parted, opt_level, max_depth)
            .unwrap_or_else(|e| panic!("fuse_ops failed: {e}"));
        check(&parted, &out, opt_level, max_depth)?;
        let (mut before, mut after) = (BTreeMap::new(), BTreeMap::new());
        common::count_ops(&m, m.get("main").unwrap_or_else(|| panic!("no main")), &mut before, 0);
        common::count_ops(&out, out.get("main").unwrap_or_else(|| panic!("no main")), &mut after, 0);
        prop_assert_eq!(before, after);
    }
}

/// The property above is not vacuous: the generated DAGs do fuse, with groups of every kind.
#[test]
fn generated_modules_fuse_with_every_kind() {
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    let mut outlined = 0;
    for seed in 0..40 {
        let m = random_fusion_module(seed, 200);
        let out = fuse_ops(&m, 2, 8).unwrap_or_else(|e| panic!("fuse_ops failed: {e}"));
        for f in out.functions.values() {
            if let Some(fusebox_core::ir::AttrValue::Str(k)) = f.attrs.extra.get("fusion_kind") {
                *kinds.entry(k.clone()).or_default() += 1;
                outlined += 1;
            }
        }
    }
    assert!(outlined > 100, "only {outlined} fused functions");
    for k in ["elemwise", "injective", "reduction", "out_elemwise_fusable"] {
        assert!(kinds.contains_key(k), "no {k} group in {kinds:?}");
    }
}
