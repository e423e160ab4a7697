//! The elementwise comparison / logic / bitwise / `where` / math family (issue 17), lowered to
//! the kernel IR and evaluated on the CPU against the CPU reference (every element, per-dtype
//! tolerance), then compiled to CUBIN with NVRTC where available.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

mod check;

use check::{check_function, lower_check_compile as run, random_args, tensor_ty};
use fusebox_core::text::parse_module_str;
use fusebox_cuda::nvrtc::{Arch, CompileOptions};
use fusebox_cuda::testing as common;

#[test]
fn comparisons_on_floats_and_ints() {
    let pf = format!(
        "x: {}, y: {}",
        tensor_ty("4, 8", "float32"),
        tensor_ty("8,", "float32")
    );
    let pi = format!(
        "x: {}, y: {}",
        tensor_ty("4, 8", "int32"),
        tensor_ty("8,", "int32")
    );
    let pu = format!(
        "x: {}, y: {}",
        tensor_ty("3, 1", "uint8"),
        tensor_ty("5,", "uint8")
    );
    let ph = format!(
        "x: {}, y: {}",
        tensor_ty("2, 6", "float16"),
        tensor_ty("6,", "float16")
    );
    for op in [
        "equal",
        "not_equal",
        "less",
        "less_equal",
        "greater",
        "greater_equal",
    ] {
        for p in [&pf, &pi, &pu, &ph] {
            assert_eq!(run(op, p, &[&format!("gv = R.{op}(x, y)")]), 1, "{op}");
        }
    }
}

#[test]
fn logical_ops_on_bool_masks() {
    let p = format!(
        "a: {}, b: {}",
        tensor_ty("4, 8", "bool"),
        tensor_ty("1, 8", "bool")
    );
    for op in ["logical_and", "logical_or", "logical_xor"] {
        run(op, &p, &[&format!("gv = R.{op}(a, b)")]);
    }
    run("logical_not", &p, &["gv = R.logical_not(a)"]);
    // A comparison feeding a logical op: one fused kernel.
    let pf = format!(
        "x: {}, y: {}",
        tensor_ty("4, 8", "float32"),
        tensor_ty("8,", "float32")
    );
    run(
        "range mask",
        &pf,
        &[
            "m = R.less(x, y)",
            "n = R.greater(x, R.const(-0.5, \"float32\"))",
            "gv = R.logical_and(m, n)",
        ],
    );
}

#[test]
fn where_and_masked_fill() {
    let p = format!(
        "c: {}, x: {}, y: {}",
        tensor_ty("4, 1", "bool"),
        tensor_ty("4, 8", "float32"),
        tensor_ty("8,", "float32")
    );
    run("where", &p, &["gv = R.where(c, x, y)"]);
    // The causal-mask pattern exporters emit: where(i < j, -1e9, scores).
    let pm = format!(
        "x: {}, y: {}",
        tensor_ty("8, 8", "float32"),
        tensor_ty("8,", "float32")
    );
    run(
        "causal mask",
        &pm,
        &[
            "m = R.less(x, y)",
            "gv = R.where(m, R.const(-1000000000.0, \"float32\"), x)",
        ],
    );
    // Where(IsNaN(x), 0, x) over log's NaNs.
    let pn = format!("x: {}", tensor_ty("4, 8", "float32"));
    run(
        "nan to zero",
        &pn,
        &[
            "l = R.log(x)",
            "m = R.isnan(l)",
            "gv = R.where(m, R.const(0.0, \"float32\"), l)",
        ],
    );
    let pi = format!(
        "c: {}, x: {}, y: {}",
        tensor_ty("6,", "bool"),
        tensor_ty("6,", "int64"),
        tensor_ty("1,", "int64")
    );
    run("where int64", &pi, &["gv = R.where(c, x, y)"]);
}

#[test]
fn isnan_isinf_isfinite() {
    let p = format!("x: {}", tensor_ty("4, 8", "float32"));
    for op in ["isnan", "isinf", "isfinite"] {
        run(
            op,
            &p,
            &[
                "a = R.log(x)",
                "b = R.divide(a, R.const(0.0, \"float32\"))",
                &format!("gv = R.{op}(b)"),
            ],
        );
    }
    let pi = format!("x: {}", tensor_ty("5,", "int32"));
    run("isfinite int", &pi, &["gv = R.isfinite(x)"]);
}

#[test]
fn bitwise_ops_and_shifts_wrap_like_the_cpu() {
    for dt in ["int32", "uint8", "int64", "int8"] {
        let p = format!("x: {}, y: {}", tensor_ty("4, 8", dt), tensor_ty("8,", dt));
        for op in [
            "bitwise_and",
            "bitwise_or",
            "bitwise_xor",
            "left_shift",
            "right_shift",
        ] {
            run(&format!("{op} {dt}"), &p, &[&format!("gv = R.{op}(x, y)")]);
        }
        run(&format!("bitwise_not {dt}"), &p, &["gv = R.bitwise_not(x)"]);
    }
    // Wide shifts: bits past the width fall off, negatives shift arithmetically.
    let p = format!("x: {}", tensor_ty("8,", "int8"));
    run(
        "shift int8 by 7",
        &p,
        &[
            "a = R.negative(x)",
            "b = R.left_shift(a, R.const(7, \"int8\"))",
            "gv = R.right_shift(b, R.const(2, \"int8\"))",
        ],
    );
    // A negative amount shifts everything out (ONNX BitShift): 0, or the sign.
    for op in ["left_shift", "right_shift"] {
        run(
            &format!("{op} by -3"),
            &p,
            &[
                "a = R.negative(x)",
                &format!("gv = R.{op}(a, R.const(-3, \"int8\"))"),
            ],
        );
    }
    let pb = format!(
        "x: {}, y: {}",
        tensor_ty("8,", "bool"),
        tensor_ty("8,", "bool")
    );
    run("bitwise_xor bool", &pb, &["gv = R.bitwise_xor(x, y)"]);
    run("bitwise_not bool", &pb, &["gv = R.bitwise_not(x)"]);
}

#[test]
fn floor_mod_and_mod() {
    let pf = format!(
        "x: {}, y: {}",
        tensor_ty("4, 8", "float32"),
        tensor_ty("8,", "float32")
    );
    let pi = format!("x: {}", tensor_ty("4, 8", "int32"));
    for op in ["floor_mod", "mod"] {
        run(op, &pf, &[&format!("gv = R.{op}(x, y)")]);
        for k in ["3", "-3"] {
            run(
                &format!("{op} int {k}"),
                &pi,
                &[&format!("gv = R.{op}(x, R.const({k}, \"int32\"))")],
            );
            run(
                &format!("{op} negated int {k}"),
                &pi,
                &[
                    "a = R.negative(x)",
                    &format!("gv = R.{op}(a, R.const({k}, \"int32\"))"),
                ],
            );
        }
    }
}

#[test]
fn rounding_sign_and_trig() {
    let p = format!("x: {}", tensor_ty("3, 5, 7", "float32"));
    for op in ["floor", "ceil", "round", "sign"] {
        // Scaled by 3.5 so rounding sees halves and whole numbers.
        run(
            op,
            &p,
            &[
                "a = R.multiply(x, R.const(3.5, \"float32\"))",
                &format!("gv = R.{op}(a)"),
            ],
        );
    }
    for op in [
        "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "atanh",
    ] {
        run(op, &p, &[&format!("gv = R.{op}(x)")]);
    }
    run(
        "acosh",
        &p,
        &[
            "a = R.abs(x)",
            "b = R.add(a, R.const(1.0, \"float32\"))",
            "gv = R.acosh(b)",
        ],
    );
    let pd = format!("x: {}", tensor_ty("9,", "float64"));
    run("sin f64", &pd, &["gv = R.sin(x)"]);
    let ph = format!("x: {}", tensor_ty("9,", "float16"));
    run("round f16", &ph, &["gv = R.round(x)"]);
    let pi = format!("x: {}", tensor_ty("9,", "int32"));
    run("sign int", &pi, &["a = R.negative(x)", "gv = R.sign(a)"]);
    run("floor int", &pi, &["gv = R.floor(x)"]);
}

/// A GPT-2-style masked softmax: the causal mask (`less`) and the masked fill (`where`) fuse
/// into the matmul's epilogue, the NaN guard (`isnan` + `where`) into one elementwise group
/// (TVM's FuseOps grouping); every group lowers, matches the CPU reference and compiles.
#[test]
fn masked_softmax_fuses_and_lowers() {
    let src = "@I.ir_module
class Module:
    @R.function
    def main(q: R.Tensor((4, 8), dtype=\"float32\"), k: R.Tensor((8, 4), dtype=\"float32\"), i: R.Tensor((4, 1), dtype=\"int64\"), j: R.Tensor((4,), dtype=\"int64\")):
        with R.dataflow():
            s = R.matmul(q, k)
            m = R.less(i, j)
            f = R.where(m, R.const(-1000000000.0, \"float32\"), s)
            p = R.nn.softmax(f, axis=-1)
            n = R.isnan(p)
            gv = R.where(n, R.const(0.0, \"float32\"), p)
            R.output(gv)
        return gv
";
    let m = parse_module_str(src).unwrap();
    let fused = fusebox_core::transform::fuse_ops::fuse_ops_lifting(&m, 2, 256, true).unwrap();
    let mut groups: Vec<Vec<&str>> = Vec::new();
    for (name, f) in &fused.functions {
        if name.as_str() == "main" {
            continue;
        }
        groups.push(
            f.bindings()
                .filter_map(|b| match &f.expr(b.value).kind {
                    fusebox_core::ir::ExprKind::Call {
                        callee: fusebox_core::ir::Callee::Op(o),
                        ..
                    } => Some(o.name()),
                    _ => None,
                })
                .collect(),
        );
        let args = random_args(&fused, name, 5);
        let (kernels, _) =
            check_function(&fused, name, &args, None).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(kernels, 1, "{name}");
        if common::nvrtc_or_skip(name) {
            for k in &fusebox_cuda::lower::lower(name, f).unwrap().kernels {
                let src = fusebox_cuda::emit::emit(k);
                fusebox_cuda::compile_cached(
                    None,
                    &src,
                    &k.name,
                    Arch::Sm90,
                    &CompileOptions::default(),
                )
                .unwrap_or_else(|e| panic!("{name}: {e}\n{src}"));
            }
        }
    }
    groups.sort();
    let want: Vec<Vec<&str>> = vec![
        vec!["relax.isnan", "relax.where"],
        vec!["relax.matmul", "relax.less", "relax.where"],
        vec!["relax.nn.softmax"],
    ];
    assert_eq!(groups, want);
}

/// Integer and bool data through the existing wrapping arithmetic (`add`, `subtract`,
/// `multiply`, `maximum`, `minimum`): computed in the integer scalar, stored with the dtype's
/// wrap-around, as the CPU reference does (`int8`: 2 * 100 = -56).
#[test]
fn integer_arithmetic_wraps_like_the_cpu() {
    for dt in ["int8", "uint8", "int32", "int64"] {
        let p = format!("x: {}, y: {}", tensor_ty("4, 8", dt), tensor_ty("8,", dt));
        for op in ["add", "subtract", "multiply", "maximum", "minimum"] {
            run(&format!("{op} {dt}"), &p, &[&format!("gv = R.{op}(x, y)")]);
        }
        run(
            &format!("wrap {dt}"),
            &p,
            &[
                &format!("a = R.multiply(x, R.const(100, \"{dt}\"))"),
                "b = R.subtract(a, y)",
                &format!("gv = R.multiply(b, R.const(3, \"{dt}\"))"),
            ],
        );
        // Wrapped intermediates feed an order-sensitive op and a comparison.
        run(
            &format!("wrap then max {dt}"),
            &p,
            &[
                &format!("a = R.multiply(x, R.const(100, \"{dt}\"))"),
                "b = R.maximum(a, y)",
                "c = R.less(b, y)",
                "gv = R.where(c, x, b)",
            ],
        );
    }
    let pb = format!(
        "x: {}, y: {}",
        tensor_ty("4, 8", "bool"),
        tensor_ty("8,", "bool")
    );
    for op in ["add", "multiply", "maximum", "minimum"] {
        run(&format!("{op} bool"), &pb, &[&format!("gv = R.{op}(x, y)")]);
    }
}
