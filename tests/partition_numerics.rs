//! Numerical property test: partitioning never changes what a module computes.
//!
//! For random DAGs (`random_module`) and random pattern tables (the patterns of
//! `partition_prop.rs`), `fuse_ops_by_pattern` — plain, with `annotate_codegen`, and followed by
//! `merge_composite_functions` — gives a module whose result, run by the CPU reference
//! executor on the same random inputs, equals the unpartitioned module's result (bitwise, or
//! within 1e-6 relative). The seed 003 conv2d modules are checked the same way, and so are the
//! partitioned outputs TVM printed for them (`tests/seed/*_annotated.relax` and friends).

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

mod common;

use fusebox_core::ir::generate::{Rng, random_fusion_module, random_module};
use fusebox_core::ir::{Constant, DType, Dim, Module, Type};
use fusebox_core::pattern::parse_pattern;
use fusebox_core::text::{self, ConstTable};
use fusebox_core::transform::{
    FusionPattern, PartitionOptions, fuse_ops, fuse_ops_by_pattern, merge_composite_functions,
};
use fusebox_cpu::{Storage, Tensor, Value, run};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

/// Random data in [-scale, scale] for a tensor type, symbolic dims taken from `syms`.
fn random_tensor(ty: &Type, syms: &BTreeMap<String, i64>, rng: &mut Rng, scale: f32) -> Tensor {
    let tt = ty
        .as_tensor()
        .unwrap_or_else(|| panic!("parameter of type {ty:?} is not a tensor"));
    let dims = tt.dims.as_ref().unwrap_or_else(|| panic!("unknown shape"));
    let shape: Vec<usize> = dims
        .iter()
        .map(|d| {
            let v = d
                .eval(&|s| syms.get(s.name()).copied())
                .unwrap_or_else(|| panic!("cannot evaluate dim {d}"));
            usize::try_from(v).unwrap()
        })
        .collect();
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n)
        .map(|_| ((rng.next_u64() % 2001) as f32 / 1000.0 - 1.0) * scale)
        .collect();
    let dtype = tt.dtype.unwrap_or(DType::F32);
    Tensor::new(shape, Storage::from_f32(dtype, data)).unwrap()
}

/// Whether two results agree: same structure, shapes and dtypes; elements bitwise equal, both
/// NaN, or within 1e-6 relative. Returns the number of elements that were not bitwise equal.
fn compare(a: &Value, b: &Value, path: &str) -> Result<usize, String> {
    match (a, b) {
        (Value::Tensor(x), Value::Tensor(y)) => {
            if x.shape() != y.shape() || x.dtype() != y.dtype() {
                return Err(format!(
                    "{path}: {:?} {} vs {:?} {}",
                    x.shape(),
                    x.dtype(),
                    y.shape(),
                    y.dtype()
                ));
            }
            let (p, q) = (x.to_f64_vec(), y.to_f64_vec());
            let mut inexact = 0;
            for (i, (u, v)) in p.iter().zip(&q).enumerate() {
                if u.to_bits() == v.to_bits() || (u.is_nan() && v.is_nan()) {
                    continue;
                }
                inexact += 1;
                if !fusebox::compare::close(*u, *v, 1e-6 * u.abs().max(1.0)) {
                    return Err(format!("{path}[{i}]: {u} vs {v}"));
                }
            }
            Ok(inexact)
        }
        (Value::Tuple(xs), Value::Tuple(ys)) if xs.len() == ys.len() => {
            let mut n = 0;
            for (i, (x, y)) in xs.iter().zip(ys).enumerate() {
                n += compare(x, y, &format!("{path}.{i}"))?;
            }
            Ok(n)
        }
        _ => Err(format!("{path}: {} vs {}", a.kind(), b.kind())),
    }
}

fn main_args(m: &Module, syms: &BTreeMap<String, i64>, rng: &mut Rng) -> Vec<Value> {
    let main = m.get("main").unwrap_or_else(|| panic!("no main"));
    main.params
        .iter()
        .map(|&p| {
            let v = main.var(p);
            // Keep weights small so long matmul chains stay finite.
            let scale = if v.name.starts_with('w') { 0.25 } else { 1.0 };
            Value::Tensor(random_tensor(&v.ty, syms, rng, scale))
        })
        .collect()
}

proptest! {
    #![proptest_config(common::prop_config(64))]

    #[test]
    fn partitioning_preserves_numerics(
        seed in any::<u64>(),
        ops in 1usize..200,
        n in 1i64..6,
        table in proptest::collection::vec((0usize..common::PATTERNS.len(), any::<bool>()), 1..6),
        bind_constants in any::<bool>(),
        mode in 0u8..3,
    ) {
        let m = random_module(seed, ops);
        let syms = BTreeMap::from([("n".to_string(), n)]);
        let mut rng = Rng::new(seed ^ 0x5eed);
        let args = main_args(&m, &syms, &mut rng);
        let want = run(&m, "main", args.clone()).unwrap_or_else(|e| panic!("before: {e}"));
        let out = common::partition(&m, &table, bind_constants, mode);
        let got = run(&out, "main", args).unwrap_or_else(|e| {
            panic!("after: {e}\n{}", text::print_module(&out).text)
        });
        if let Err(e) = compare(&want, &got, "result") {
            panic!("results differ: {e}\n{}", text::print_module(&out).text);
        }
    }
}

proptest! {
    #![proptest_config(common::prop_config(48))]

    /// FuseOps (alone, at every opt level and small max depths) never changes the result.
    #[test]
    fn fuse_ops_preserves_numerics(
        seed in any::<u64>(),
        ops in 1usize..150,
        n in 1i64..5,
        opt_level in 0u32..3,
        max_depth in 1usize..9,
    ) {
        let m = random_fusion_module(seed, ops);
        let syms = BTreeMap::from([("n".to_string(), n)]);
        let mut rng = Rng::new(seed ^ 0xf05e);
        let args = main_args(&m, &syms, &mut rng);
        let want = run(&m, "main", args.clone()).unwrap_or_else(|e| panic!("before: {e}"));
        let out = fuse_ops(&m, opt_level, max_depth).unwrap_or_else(|e| panic!("fuse_ops: {e}"));
        let got = run(&out, "main", args).unwrap_or_else(|e| {
            panic!("after: {e}\n{}", text::print_module(&out).text)
        });
        if let Err(e) = compare(&want, &got, "result") {
            panic!("results differ: {e}\n{}", text::print_module(&out).text);
        }
    }
}

// ---- seed 003 ----------------------------------------------------------------------------

/// The bound weight of Conv2dReLU (seed In [5]), as `tests/seed.rs` makes it.
fn seed_weight() -> Constant {
    let mut rng = Rng::new(3);
    let data: Vec<u8> = (0..64 * 64 * 3 * 3)
        .flat_map(|_| ((rng.next_u64() % 2000) as f32 / 1000.0 - 1.0).to_le_bytes())
        .collect();
    Constant::from_bytes(DType::F32, vec![64, 64, 3, 3], data).unwrap()
}

fn load(name: &str) -> Module {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/seed")
        .join(name);
    let src = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut consts = ConstTable::new();
    consts.insert("relax.expr.Constant", 0, seed_weight());
    text::parse_module(&src, name, &consts).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Arguments for `main` by parameter name: `weight1` is the seed's bound weight (so modules
/// that bound it agree with those that take it), every other parameter is random.
fn named_args(m: &Module, pool: &mut BTreeMap<String, Value>, rng: &mut Rng) -> Vec<Value> {
    let main = m.get("main").unwrap_or_else(|| panic!("no main"));
    main.params
        .iter()
        .map(|&p| {
            let v = main.var(p);
            pool.entry(v.name.clone())
                .or_insert_with(|| {
                    if v.name == "weight1" {
                        Value::Tensor(Tensor::from_constant(&seed_weight()).unwrap())
                    } else {
                        let scale = if v.name.starts_with("weight") {
                            0.05
                        } else {
                            1.0
                        };
                        Value::Tensor(random_tensor(&v.ty, &BTreeMap::new(), rng, scale))
                    }
                })
                .clone()
        })
        .collect()
}

fn pattern(name: &str, src: &str) -> FusionPattern {
    FusionPattern::new(name, parse_pattern(src).unwrap_or_else(|e| panic!("{e}")))
}

#[test]
fn seed_modules_compute_the_same_after_partitioning() {
    let conv_relu = || pattern("dnnl.conv2d_relu", "relax.nn.relu(relax.nn.conv2d(_, _))");
    let conv = || pattern("dnnl.conv2d", "relax.nn.conv2d(_, _)");
    // Input module, then TVM's partitioned outputs for it (same main parameters, or the
    // first weight bound as a constant).
    let cases: [(&str, &[&str]); 3] = [
        (
            "conv2d_relu.relax",
            &[
                "conv2d_relu_annotated.relax",
                "conv2d_relu_bound_partitioned.relax",
            ],
        ),
        (
            "conv2d_relu_x2.relax",
            &[
                "conv2d_relu_x2_annotated.relax",
                "conv2d_relu_x2_conv2d_first.relax",
            ],
        ),
        (
            "conv2d_conv2d_relu.relax",
            &["conv2d_conv2d_relu_annotated.relax"],
        ),
    ];
    let mut rng = Rng::new(2024);
    for (input, outputs) in cases {
        let m = load(input);
        let mut pool = BTreeMap::new();
        let args = named_args(&m, &mut pool, &mut rng);
        let want = run(&m, "main", args).unwrap_or_else(|e| panic!("{input}: {e}"));
        let mut partitioned: Vec<(String, Module)> = Vec::new();
        for (k, table) in [
            vec![conv_relu()],
            vec![conv_relu(), conv()],
            vec![conv(), conv_relu()],
        ]
        .into_iter()
        .enumerate()
        {
            for (annotate, merge) in [(false, false), (true, false), (false, true)] {
                let opts = PartitionOptions {
                    bind_constants: true,
                    annotate_codegen: annotate,
                };
                let mut out = fuse_ops_by_pattern(&m, &table, opts)
                    .unwrap_or_else(|e| panic!("{input}: {e}"))
                    .module;
                if merge {
                    out = merge_composite_functions(&out).unwrap_or_else(|e| panic!("{e}"));
                }
                partitioned.push((
                    format!("{input} table {k} annotate={annotate} merge={merge}"),
                    out,
                ));
            }
        }
        for o in outputs {
            partitioned.push(((*o).to_string(), load(o)));
        }
        for (what, out) in &partitioned {
            let args = named_args(out, &mut pool, &mut rng);
            let got = run(out, "main", args).unwrap_or_else(|e| panic!("{what}: {e}"));
            if let Err(e) = compare(&want, &got, "result") {
                panic!("{what}: results differ: {e}");
            }
        }
        // The result is not trivially zero: relu of a real convolution.
        let Value::Tensor(t) = &want else {
            panic!("{input}: expected a tensor result")
        };
        assert!(
            t.to_f32_vec().iter().any(|&v| v > 0.0),
            "{input}: all zeros"
        );
    }
}

#[test]
fn dims_evaluate_for_random_module_inputs() {
    // random_module's parameters are (n, 16), (n, 16), (16, 16), (16,).
    let m = random_module(1, 10);
    let main = m.get("main").unwrap();
    let x = main.var(main.params[0]);
    let Type::Tensor(tt) = &x.ty else { panic!() };
    assert_eq!(tt.dims.as_ref().unwrap()[0], Dim::sym("n"));
}
