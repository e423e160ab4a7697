//! The CPU executor's elementwise programs on real models (issue 19, item 3): partitioned as
//! `fusebox run --config configs/cpu.toml` does, EfficientNet's conv2d + SiLU groups and
//! MobileNetV3's conv2d + hardswish groups (and its classifier's hardswish) each run as one
//! kernel (the profile records one `relax.nn.conv2d+…` kernel call per call of such a
//! function, and no op of their tails), and the outputs equal, bit for bit, the same
//! partitioned module run with every `Primitive` attribute cleared (each group interpreted
//! op by op).

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code panics on failure"
)]

use fusebox_core::frontend::onnx::import_onnx_file;
use fusebox_cpu::{CallProfile, Executor, Value};
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Partitions fixture `name` with `configs/cpu.toml` and runs it on its `default` inputs,
/// profiled; returns the plan's module, the result, the profile, and the result of the
/// module with every `Primitive` attribute cleared.
fn run(name: &str) -> (fusebox_core::ir::Module, Value, Vec<CallProfile>, Value) {
    let dir = root().join("tests/models").join(name);
    let module = import_onnx_file(&dir.join("model.onnx")).unwrap_or_else(|e| panic!("{e}"));
    let config = fusebox_core::config::Config::load(&root().join("configs/cpu.toml"))
        .unwrap_or_else(|e| panic!("{e}"));
    let pipeline = fusebox::pipeline(config).unwrap_or_else(|e| panic!("{e}"));
    let plan = pipeline.run(&module).unwrap_or_else(|e| panic!("{e}"));
    let main = module.get("main").unwrap();
    let args: Vec<Value> = main
        .params
        .iter()
        .map(|&p| {
            let file = dir
                .join("default/inputs")
                .join(format!("{}.npy", main.var(p).name));
            Value::Tensor(
                fusebox::read_npy(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display())),
            )
        })
        .collect();
    let (out, profile) = fusebox::execute_profiled(&Executor::new(), &plan, "main", args.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let mut plain = plan.module.clone();
    for f in plain.functions.values_mut() {
        f.attrs.primitive = None;
    }
    let reference = fusebox_cpu::run(&plain, "main", args).unwrap_or_else(|e| panic!("{e}"));
    (plan.module.clone(), out, profile, reference)
}

/// The calls the profile counts for `name` (0 when absent).
fn calls(profile: &[CallProfile], name: &str) -> usize {
    profile
        .iter()
        .find(|p| p.name == name)
        .map_or(0, |p| p.calls)
}

/// The calls of the module's `Primitive` functions whose ops are `ops`, in binding order.
fn group_calls(module: &fusebox_core::ir::Module, profile: &[CallProfile], ops: &[&str]) -> usize {
    module
        .functions
        .iter()
        .filter(|(_, f)| f.attrs.is_primitive())
        .filter(|(_, f)| {
            let names: Vec<String> = f
                .bindings()
                .filter_map(|b| match &f.expr(b.value).kind {
                    fusebox_core::ir::ExprKind::Call {
                        callee: fusebox_core::ir::Callee::Op(op),
                        ..
                    } => Some(op.name().to_string()),
                    _ => None,
                })
                .collect();
            names == ops
        })
        .map(|(name, _)| calls(profile, name))
        .sum()
}

/// The same bits, a NaN counting as any NaN.
fn assert_same(got: &Value, want: &Value) {
    let (Value::Tensor(a), Value::Tensor(b)) = (got, want) else {
        panic!("expected tensors")
    };
    let (a, b) = (a.to_f32_vec(), b.to_f32_vec());
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(
            x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
            "element {i}: {x} vs {y}"
        );
    }
}

#[test]
fn efficientnet_conv_silu_groups_run_as_one_kernel() {
    let (module, out, profile, reference) = run("efficientnet-ts");
    let ops = [
        "relax.nn.conv2d",
        "relax.add",
        "relax.sigmoid",
        "relax.multiply",
    ];
    let groups = group_calls(&module, &profile, &ops);
    assert!(groups >= 20, "{groups} conv2d + SiLU group calls");
    assert_eq!(calls(&profile, &ops.join("+")), groups, "{profile:#?}");
    // Every sigmoid ran inside a program: none as an op of its own.
    assert_eq!(calls(&profile, "relax.sigmoid"), 0, "{profile:#?}");
    assert_same(&out, &reference);
}

#[test]
fn mobilenet_v3_conv_hardswish_groups_run_as_one_kernel() {
    let (module, out, profile, reference) = run("mobilenet-v3-ts");
    let ops = [
        "relax.nn.conv2d",
        "relax.add",
        "relax.multiply",
        "relax.add",
        "relax.clip",
        "relax.multiply",
    ];
    let groups = group_calls(&module, &profile, &ops);
    assert!(groups >= 20, "{groups} conv2d + hardswish group calls");
    assert_eq!(calls(&profile, &ops.join("+")), groups, "{profile:#?}");
    // The classifier's hardswish after the `cpu.dense_bias` composite: a group of
    // elementwise ops alone, one program.
    let tail = [
        "relax.multiply",
        "relax.add",
        "relax.clip",
        "relax.multiply",
    ];
    let dense = group_calls(&module, &profile, &tail);
    assert_eq!(dense, 1);
    assert_eq!(calls(&profile, &tail.join("+")), dense, "{profile:#?}");
    // Every clip ran inside a program.
    assert_eq!(calls(&profile, "relax.clip"), 0, "{profile:#?}");
    assert_same(&out, &reference);
}
