//! Seed 003's modules and the partitioned outputs TVM prints for them (reproduced by hand in
//! `tests/seed/`) parse, verify and round-trip: print → parse gives a structurally equal module
//! and printing is a fixed point.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failure is a panic"
)]

use fusebox_core::ir::structural::module_eq;
use fusebox_core::ir::verify::verify;
use fusebox_core::ir::{Callee, Constant, DType, ExprKind, Module};
use fusebox_core::text::{self, ConstTable};
use std::path::Path;

fn seed_constants() -> ConstTable {
    // The bound weight of Conv2dReLU (seed In [5]): a seeded random (64, 64, 3, 3) float32 tensor.
    let mut rng = fusebox_core::ir::generate::Rng::new(3);
    let data: Vec<u8> = (0..64 * 64 * 3 * 3)
        .flat_map(|_| ((rng.next_u64() % 2000) as f32 / 1000.0 - 1.0).to_le_bytes())
        .collect();
    let mut t = ConstTable::new();
    if let Ok(c) = Constant::from_bytes(DType::F32, vec![64, 64, 3, 3], data) {
        t.insert("relax.expr.Constant", 0, c);
    }
    t
}

fn load(name: &str) -> Module {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/seed")
        .join(name);
    let src = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(!src.is_empty(), "cannot read {}", path.display());
    let m = match text::parse_module(&src, name, &seed_constants()) {
        Ok(m) => m,
        Err(e) => panic!("{name} does not parse:\n{e}"),
    };
    if let Err(e) = verify(&m) {
        panic!("{name} does not verify:\n{e}");
    }
    // Round trip: print → parse is structurally equal, and printing is a fixed point.
    let printed = text::print_module(&m);
    let mut consts = ConstTable::new();
    for (i, c) in printed.constants.iter().enumerate() {
        consts.insert("relax.expr.Constant", i, c.clone());
    }
    let again = match text::parse_module(&printed.text, name, &consts) {
        Ok(m) => m,
        Err(e) => panic!(
            "{name}: the printed module does not parse:\n{e}\n{}",
            printed.text
        ),
    };
    assert!(
        module_eq(&m, &again),
        "{name}: print → parse is not structurally equal"
    );
    assert_eq!(
        printed.text,
        text::print_module(&again).text,
        "{name}: printing is not a fixed point"
    );
    m
}

fn names(m: &Module) -> Vec<&str> {
    m.sorted_names()
}

#[test]
fn seed_input_modules() {
    for name in [
        "conv2d_relu.relax",
        "conv2d_relu_x2.relax",
        "conv2d_conv2d_relu.relax",
    ] {
        let m = load(name);
        let main = m.get("main").unwrap_or_else(|| panic!("{name}: no main"));
        // Nested calls are normalised: one binding per op call.
        let ops: Vec<&str> = main
            .bindings()
            .filter_map(|b| match &main.expr(b.value).kind {
                ExprKind::Call {
                    callee: Callee::Op(op),
                    ..
                } => Some(op.name()),
                _ => None,
            })
            .collect();
        assert_eq!(ops.len(), main.bindings().count(), "{name}");
        assert!(
            ops.iter()
                .all(|o| *o == "relax.nn.conv2d" || *o == "relax.nn.relu")
        );
    }
    let m = load("conv2d_relu_x2.relax");
    let main = m.get("main").unwrap_or_else(|| panic!("no main"));
    // padding=(0, 0) on the second conv shrinks 56 to 54.
    assert_eq!(
        fusebox_core::ir::infer::brief(&main.ret_ty),
        "Tensor((1, 64, 54, 54), float32)"
    );
}

#[test]
fn seed_bound_partitioned_output() {
    let m = load("conv2d_relu_bound_partitioned.relax");
    assert_eq!(names(&m), ["fused_relax_nn_conv2d_relax_nn_relu", "main"]);
    let f = m
        .get("fused_relax_nn_conv2d_relax_nn_relu")
        .unwrap_or_else(|| panic!("missing"));
    assert_eq!(f.attrs.composite.as_deref(), Some("dnnl.conv2d_relu"));
    assert!(f.attrs.is_primitive() && f.is_private());
    // Seed In [7]: the conv2d's weight is a constant inside the composite.
    let first = f
        .bindings()
        .next()
        .unwrap_or_else(|| panic!("empty composite"));
    let ExprKind::Call { args, .. } = &f.expr(first.value).kind else {
        panic!("not a call")
    };
    assert!(matches!(f.expr(args[1]).kind, ExprKind::Const(_)));
}

#[test]
fn seed_annotated_outputs() {
    let cases: [(&str, &[&str]); 4] = [
        (
            "conv2d_relu_annotated.relax",
            &["fused_relax_nn_conv2d_relax_nn_relu_dnnl", "main"],
        ),
        (
            "conv2d_relu_x2_annotated.relax",
            &[
                "fused_relax_nn_conv2d_relax_nn_relu1_dnnl",
                "fused_relax_nn_conv2d_relax_nn_relu_dnnl",
                "main",
            ],
        ),
        (
            "conv2d_relu_x2_conv2d_first.relax",
            &[
                "fused_relax_nn_conv2d1_dnnl",
                "fused_relax_nn_conv2d_dnnl",
                "main",
            ],
        ),
        (
            "conv2d_conv2d_relu_annotated.relax",
            &[
                "fused_relax_nn_conv2d_dnnl",
                "fused_relax_nn_conv2d_relax_nn_relu_dnnl",
                "main",
            ],
        ),
    ];
    for (file, expected) in cases {
        let m = load(file);
        assert_eq!(names(&m), expected, "{file}");
        for (name, f) in &m.functions {
            if name == "main" {
                continue;
            }
            // annotate_codegen: a public function with Codegen whose body calls a local
            // function carrying Composite.
            assert_eq!(f.attrs.codegen.as_deref(), Some("dnnl"), "{file}: {name}");
            assert!(!f.is_private(), "{file}: {name}");
            let local = f.bindings().find_map(|b| match &f.expr(b.value).kind {
                ExprKind::Function(inner) => Some(inner),
                _ => None,
            });
            let local = local.unwrap_or_else(|| panic!("{file}: {name} has no local function"));
            assert!(
                local
                    .attrs
                    .composite
                    .as_deref()
                    .is_some_and(|c| c.starts_with("dnnl."))
            );
        }
    }
}

/// Runs FuseOpsByPattern on a seed module and compares the printed result with the hand
/// reproduction of what TVM prints (the seed file without its leading `# Seed …` comment).
fn assert_partition_reproduces(
    input: &str,
    patterns: &[(&str, &str)],
    opts: fusebox_core::transform::PartitionOptions,
    consts: &ConstTable,
    expected_file: &str,
) {
    use fusebox_core::transform::{FusionPattern, fuse_ops_by_pattern};
    let mut m = load(input);
    // BindParams: seed In [5] binds weight1 of main to its constant.
    if let Some(c) = consts.get("relax.expr.Constant", 0) {
        m = fusebox_core::transform::bind_params(&m, "main", &[("weight1".to_string(), c.clone())])
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let table: Vec<FusionPattern> = patterns
        .iter()
        .map(|(n, p)| {
            let pat = fusebox_core::pattern::parse_pattern(p).unwrap_or_else(|e| panic!("{e}"));
            FusionPattern::new(n, pat)
        })
        .collect();
    let out = fuse_ops_by_pattern(&m, &table, opts).unwrap_or_else(|e| panic!("{e}"));
    if let Err(e) = verify(&out.module) {
        panic!("{expected_file}: partitioned module does not verify: {e}");
    }
    let printed = text::print_module(&out.module).text;
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/seed")
        .join(expected_file);
    let expected: String = std::fs::read_to_string(&path)
        .unwrap_or_default()
        .lines()
        .skip_while(|l| !l.starts_with("# from tvm.script"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        printed,
        expected,
        "{expected_file}: partition output differs from TVM's:\n{}",
        similar::TextDiff::from_lines(&expected, &printed)
            .unified_diff()
            .header("tvm", "fusebox")
    );
}

#[test]
fn partition_reproduces_seed_003() {
    use fusebox_core::transform::PartitionOptions;
    let conv2d_relu = ("dnnl.conv2d_relu", "relax.nn.relu(relax.nn.conv2d(_, _))");
    let conv2d = ("dnnl.conv2d", "relax.nn.conv2d(_, _)");
    let annotate = PartitionOptions {
        bind_constants: true,
        annotate_codegen: true,
    };
    let none = ConstTable::new();
    // In [5]-[6]: BindParams, then bind_constants keeps the weight inside the composite.
    assert_partition_reproduces(
        "conv2d_relu.relax",
        &[conv2d_relu],
        PartitionOptions {
            bind_constants: true,
            annotate_codegen: false,
        },
        &seed_constants(),
        "conv2d_relu_bound_partitioned.relax",
    );
    // In [8]-[9]
    assert_partition_reproduces(
        "conv2d_relu.relax",
        &[conv2d_relu],
        annotate,
        &none,
        "conv2d_relu_annotated.relax",
    );
    // In [15]-[16]
    assert_partition_reproduces(
        "conv2d_relu_x2.relax",
        &[conv2d_relu],
        annotate,
        &none,
        "conv2d_relu_x2_annotated.relax",
    );
    // In [17]-[18]: the earlier pattern wins everywhere.
    assert_partition_reproduces(
        "conv2d_relu_x2.relax",
        &[conv2d, conv2d_relu],
        annotate,
        &none,
        "conv2d_relu_x2_conv2d_first.relax",
    );
    // In [21]-[22] as run in the notebook (on Conv2dReLUx2): same as In [16].
    assert_partition_reproduces(
        "conv2d_relu_x2.relax",
        &[conv2d_relu, conv2d],
        annotate,
        &none,
        "conv2d_relu_x2_annotated.relax",
    );
    // In [21] as intended, on Conv2dConv2dReLU.
    assert_partition_reproduces(
        "conv2d_conv2d_relu.relax",
        &[conv2d_relu, conv2d],
        annotate,
        &none,
        "conv2d_conv2d_relu_annotated.relax",
    );
}
