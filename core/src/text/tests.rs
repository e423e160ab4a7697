//! Tests of the text format: round trips of TVM's own output, normalisation, symbolic dims,
//! positioned errors, the side file and the print/parse fixed point.

use super::*;
use crate::ir::{Constant, DType, Dim, ExprKind, Type};

const HEADER: &str = "# from tvm.script import ir as I\n# from tvm.script import relax as R\n\n@I.ir_module\nclass Module:\n";
const HEADER_T: &str = "# from tvm.script import ir as I\n# from tvm.script import tir as T\n# from tvm.script import relax as R\n\n@I.ir_module\nclass Module:\n";
const META: &str =
    "\n# Metadata omitted. Use show_meta=True in script() method to show this information.\n";

const EX1: &str = r#"# from tvm.script import ir as I
# from tvm.script import relax as R

@I.ir_module
class Module:
    @R.function(private=True)
    def fused_relax_nn_conv2d_relax_nn_relu(data1: R.Tensor((1, 64, 56, 56), dtype="float32"), weight11: R.Tensor((64, 64, 3, 3), dtype="float32")) -> R.Tensor((1, 64, 56, 56), dtype="float32"):
        R.func_attr({"Composite": "dnnl.conv2d_relu", "Primitive": True})
        with R.dataflow():
            lv1: R.Tensor((1, 64, 56, 56), dtype="float32") = R.nn.conv2d(data1, weight11, strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype=None)
            gv1: R.Tensor((1, 64, 56, 56), dtype="float32") = R.nn.relu(lv1)
            R.output(gv1)
        return gv1

    @R.function
    def main(data: R.Tensor((1, 64, 56, 56), dtype="float32"), weight1: R.Tensor((64, 64, 3, 3), dtype="float32")) -> R.Tensor((1, 64, 56, 56), dtype="float32"):
        cls = Module
        with R.dataflow():
            gv: R.Tensor((1, 64, 56, 56), dtype="float32") = cls.fused_relax_nn_conv2d_relax_nn_relu(data, weight1)
            R.output(gv)
        return gv
"#;

const EX2_BODY: &str = r#"    @R.function
    def fused_relax_nn_conv2d_relax_nn_relu_dnnl(data: R.Tensor((1, 64, 56, 56), dtype="float32")) -> R.Tensor((1, 64, 56, 56), dtype="float32"):
        R.func_attr({"Codegen": "dnnl"})
        # from tvm.script import relax as R

        @R.function
        def local_func(data_1: R.Tensor((1, 64, 56, 56), dtype="float32")) -> R.Tensor((1, 64, 56, 56), dtype="float32"):
            R.func_attr({"Composite": "dnnl.conv2d_relu"})
            with R.dataflow():
                lv: R.Tensor((1, 64, 56, 56), dtype="float32") = R.nn.conv2d(data_1, metadata["relax.expr.Constant"][0], strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype=None)
                gv: R.Tensor((1, 64, 56, 56), dtype="float32") = R.nn.relu(lv)
                R.output(gv)
            return gv

        output: R.Tensor((1, 64, 56, 56), dtype="float32") = local_func(data)
        return output
"#;

fn weight() -> Constant {
    let n = 64 * 64 * 3 * 3;
    let data: Vec<u8> = (0..n)
        .flat_map(|i| ((i % 7) as f32 * 0.25).to_le_bytes())
        .collect();
    Constant::from_bytes(DType::F32, vec![64, 64, 3, 3], data)
        .unwrap_or_else(|e| unreachable!("{e}"))
}

fn parse_ok(src: &str) -> Module {
    match parse_module_str(src) {
        Ok(m) => m,
        Err(e) => unreachable!("parse failed:\n{e}"),
    }
}

fn parse_err(src: &str) -> (String, String) {
    match parse_module_str(src) {
        Ok(_) => unreachable!("expected a parse error for:\n{src}"),
        Err(e) => {
            let s = e
                .as_source()
                .map(|s| (s.pos.to_string(), s.message.clone()));
            s.unwrap_or_else(|| unreachable!("not a source error: {e}"))
        }
    }
}

/// Wraps a function body (8-space indented lines) in a module with one function `main`.
fn module_with(sig: &str, body: &str) -> String {
    format!("{HEADER}    @R.function\n    def main({sig}:\n{body}")
}

#[test]
fn example_conv2d_relu_round_trips_byte_identically() {
    let m = parse_ok(EX1);
    let f = m
        .get("fused_relax_nn_conv2d_relax_nn_relu")
        .unwrap_or_else(|| unreachable!());
    assert!(f.is_private());
    assert_eq!(f.attrs.composite.as_deref(), Some("dnnl.conv2d_relu"));
    assert!(f.attrs.is_primitive());
    assert_eq!(f.blocks.len(), 1);
    assert!(f.blocks[0].dataflow);
    let lv1 = f.blocks[0].bindings[0].var;
    assert!(f.var(lv1).dataflow);
    let gv1 = f.blocks[0].bindings[1].var;
    assert!(!f.var(gv1).dataflow);
    let main = m.get("main").unwrap_or_else(|| unreachable!());
    assert_eq!(main.attrs.global_symbol.as_deref(), Some("main"));
    let printed = print_module(&m);
    assert_eq!(printed.text, EX1);
    assert!(printed.constants.is_empty());
}

#[test]
fn example_annotate_codegen_round_trips_byte_identically() {
    let src = format!("{HEADER}{EX2_BODY}{META}");
    let mut consts = ConstTable::new();
    consts.insert(NS_CONSTANT, 0, weight());
    let m = parse_module(&src, "ex2.relax", &consts).unwrap_or_else(|e| unreachable!("{e}"));
    let f = m
        .get("fused_relax_nn_conv2d_relax_nn_relu_dnnl")
        .unwrap_or_else(|| unreachable!());
    assert_eq!(f.attrs.codegen.as_deref(), Some("dnnl"));
    assert_eq!(f.blocks.len(), 1);
    assert!(!f.blocks[0].dataflow);
    let local = f.blocks[0].bindings[0];
    match &f.expr(local.value).kind {
        ExprKind::Function(g) => {
            assert!(g.attrs.global_symbol.is_none());
            assert_eq!(g.attrs.composite.as_deref(), Some("dnnl.conv2d_relu"));
        }
        other => unreachable!("expected a nested function, found {other:?}"),
    }
    let printed = print_module(&m);
    assert_eq!(printed.text, src);
    assert_eq!(printed.constants, vec![weight()]);
}

#[test]
fn missing_metadata_is_kept_without_its_value() {
    // Issue 20: a constant no side file holds is kept without its value (TVM's `mod.script()`
    // omits metadata); only running needs it.
    let src = format!("{HEADER}{EX2_BODY}");
    let m = parse_module(&src, "dir/ex2.relax", &ConstTable::new())
        .unwrap_or_else(|e| unreachable!("{e}"));
    let missing: Vec<String> = m
        .valueless_constants()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        missing,
        vec!["metadata[\"relax.expr.Constant\"][0]".to_string()]
    );
    let printed = print_module(&m);
    assert!(printed.constants.is_empty());
    assert_eq!(printed.first_index, 1);
    assert!(
        printed
            .text
            .contains("metadata[\"relax.expr.Constant\"][0]"),
        "{}",
        printed.text
    );
}

/// The types the parser gives the inline constants without values of `body` (a `main` taking
/// `x: R.Tensor((1, 8, 16, 16))`), in order.
fn valueless_types(body: &str) -> Vec<String> {
    let src = format!(
        "{HEADER}    @R.function\n    def main(x: R.Tensor((1, 8, 16, 16), dtype=\"float32\")):\n        with R.dataflow():\n{body}        return y\n"
    );
    let m =
        parse_module(&src, "v.relax", &ConstTable::new()).unwrap_or_else(|e| unreachable!("{e}"));
    crate::ir::verify::verify(&m).unwrap_or_else(|e| unreachable!("{e}"));
    let f = m.get("main").unwrap_or_else(|| unreachable!());
    f.exprs
        .iter()
        .filter(|(_, d)| matches!(d.kind, ExprKind::ConstRef(_)))
        .map(|(_, d)| crate::ir::infer::brief(&d.ty))
        .collect()
}

#[test]
fn valueless_constants_are_typed_from_their_use() {
    // Issue 20: `mod.script()` prints constants without values; their types come from the use.
    let conv = |stride: i64, pad: i64, out: i64| {
        format!(
            "            y: R.Tensor((1, 4, {out}, {out}), dtype=\"float32\") = R.nn.conv2d(x, metadata[\"relax.expr.Constant\"][0], strides=[{stride}, {stride}], padding=[{pad}, {pad}, {pad}, {pad}])\n            R.output(y)\n"
        )
    };
    // Stride 1: one kernel size gives the output (16 + 2 - (k - 1) = 16 → k = 3).
    assert_eq!(
        valueless_types(&conv(1, 1, 16)),
        ["Tensor((4, 8, 3, 3), float32)"]
    );
    // Stride 2, pad 1: k = 3 gives (18 - 3) / 2 + 1 = 8 and so does k = 4: only the rank is told.
    assert_eq!(valueless_types(&conv(2, 1, 8)), ["Tensor(ndim=4, float32)"]);
    // A broadcast operand: the dtype only.
    let add = "            y: R.Tensor((1, 8, 16, 16), dtype=\"float32\") = R.add(x, metadata[\"relax.expr.Constant\"][0])\n            R.output(y)\n";
    assert_eq!(valueless_types(add), ["Tensor(?, float32)"]);
    // An op whose use tells nothing keeps the unknown type.
    let cond = "            y: R.Tensor((1, 8, 16, 16), dtype=\"float32\") = R.where(metadata[\"relax.expr.Constant\"][0], x, x)\n            R.output(y)\n";
    assert_eq!(valueless_types(cond), ["Tensor(?, void)"]);
}

#[test]
fn an_annotation_may_refine_a_less_specific_type() {
    // TVM's parser accepts an annotation more specific than the inferred type (its
    // StructInfoBaseCheck fails only at level 1) and refuses a contradicting one.
    let src = |ann: &str| {
        format!(
            "{HEADER}    @R.function\n    def main(m: R.Tensor((4, 8), dtype=\"float32\"), x: R.Tensor(dtype=\"float32\")):\n        with R.dataflow():\n            a: {ann} = R.add(m, x)\n            R.output(a)\n        return a\n"
        )
    };
    let ok = parse_module(
        &src("R.Tensor((4, 8), dtype=\"float32\")"),
        "r.relax",
        &ConstTable::new(),
    )
    .unwrap_or_else(|e| unreachable!("{e}"));
    crate::ir::verify::verify(&ok).unwrap_or_else(|e| unreachable!("{e}"));
    let bad = parse_module(
        &src("R.Tensor((4, 8), dtype=\"float16\")"),
        "r.relax",
        &ConstTable::new(),
    );
    let err = bad.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("annotation says"), "{err}");
}

#[test]
fn a_return_annotation_must_accept_the_returned_value() {
    // Found by the parse_text fuzzer: a return type more specific than the returned value's
    // parsed, and then failed to verify. A refinement needs an annotated binding first.
    let src = "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: R.Tensor()) -> R.Tensor((8, 8), dtype=\"float32\"):\n          return x\n";
    let (pos, msg) = parse_err(src);
    assert_eq!(pos, "4:32", "{msg}");
    assert!(msg.contains("return annotation says"), "{msg}");
    // The other way, a less specific declared type, is fine.
    let ok = "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: R.Tensor((8, 8), dtype=\"float32\")) -> R.Tensor(ndim=2):\n        return x\n";
    let m = parse_ok(ok);
    assert!(crate::ir::verify::verify(&m).is_ok());
}

#[test]
fn a_branch_ending_in_a_tuple_of_dataflow_vars_keeps_its_binding() {
    // Found by the parse_text fuzzer: `out = R.matmul(x, w),` in a branch's dataflow block binds
    // the call to a dataflow `lv`; the tuple `(lv,)` became the branch's body, outside the
    // block, and the module parsed but failed to verify. It stays bound as `out_then`.
    let src = "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: R.Tensor((4, 4), \"float32\"), w: R.Tensor((4, 4), \"float32\"), c: R.Prim(\"bool\")):\n        if c:\n            with R.dataflow():\n                out = R.matmul(x, w),\n                R.output(out)\n        else:\n            out = (x,)\n        return out\n";
    let m = parse_ok(src);
    if let Err(e) = crate::ir::verify::verify(&m) {
        unreachable!("{e}");
    }
    let text = print_module(&m).text;
    assert!(
        text.contains("out_then: R.Tuple(R.Tensor((4, 4), dtype=\"float32\")) = (lv,)"),
        "{text}"
    );
    // A tuple of vars bound outside dataflow is still the branch's body itself.
    assert!(
        text.contains("out: R.Tuple(R.Tensor((4, 4), dtype=\"float32\")) = (x,)"),
        "{text}"
    );
    assert_eq!(print_module(&parse_ok(&text)).text, text);
}

#[test]
fn extremum_dims_round_trip() {
    // TVMScript's `T.max` / `T.min` in a shape (MPT's ALiBi slice), printed back as read.
    let src = format!(
        "{HEADER_T}    @R.function
    def main(x: R.Tensor((\"n\", \"T.min(n, 256)\"), dtype=\"float32\")) -> R.Tensor((\"n\", \"T.min(n, 256)\"), dtype=\"float32\"):
        n = T.int64()
        with R.dataflow():
            s: R.Shape([T.max(256 - n, 0), T.min(n, T.max(n * 2, 8)) + 1]) = R.shape([T.max(256 - n, 0), T.min(n, T.max(n * 2, 8)) + 1])
            gv: R.Tensor((n, T.min(n, 256)), dtype=\"float32\") = R.nn.relu(x)
            R.output(s, gv)
        return gv
"
    );
    let m = parse_ok(&src);
    assert_eq!(print_module(&m).text, src);
    // What is not a call of two dims is an error at its position.
    for (bad, want) in [
        ("T.max(n)", "between `T.max`'s two dimensions"),
        ("T.min(n, 2, 3)", "after `T.min`'s two dimensions"),
        ("T.max n", "after `T.max`"),
    ] {
        let text = src.replacen("T.max(256 - n, 0)", bad, 1);
        let (_, err) = parse_err(&text);
        assert!(err.contains(want), "{bad}: {err}");
    }
}

#[test]
fn symbolic_dims() {
    let src = format!(
        "{HEADER_T}    @R.function
    def main(x: R.Tensor((\"batch_size\", 16), dtype=\"float32\"), w: R.Tensor((\"h - kh + 1\", \"(n + 1) // 2\"), dtype=\"float32\")) -> R.Tensor((\"batch_size\", 16), dtype=\"float32\"):
        batch_size = T.int64()
        h = T.int64()
        kh = T.int64()
        n = T.int64()
        with R.dataflow():
            gv: R.Tensor((batch_size, 16), dtype=\"float32\") = R.nn.relu(x)
            s: R.Shape([batch_size, n * 2]) = R.shape([batch_size, n * 2])
            R.output(gv, s)
        return gv
"
    );
    let m = parse_ok(&src);
    let f = m.get("main").unwrap_or_else(|| unreachable!());
    let names: Vec<&str> = f.sym_vars.iter().map(|s| s.name()).collect();
    assert_eq!(names, ["batch_size", "h", "kh", "n"]);
    let wt = f
        .var(f.params[1])
        .ty
        .as_tensor()
        .cloned()
        .unwrap_or_else(|| unreachable!());
    let dims = wt.dims.unwrap_or_default();
    let h = Dim::sym("h");
    assert_eq!(dims[0], h.sub(&Dim::sym("kh")).add(&Dim::Static(1)));
    assert_eq!(dims[1].to_string(), "(n + 1) // 2");
    assert_eq!(print_module(&m).text, src);

    // Without `T.int64()` lines: symbols come from the signature, in first-use order, and the
    // printer declares them.
    let src2 = module_with(
        "x: R.Tensor((\"n\", \"m\"), dtype=\"float32\")) -> R.Tensor((\"n\", \"m\"), dtype=\"float32\")",
        "        y = R.nn.relu(x)\n        return y\n",
    );
    let m2 = parse_ok(&src2);
    let f2 = m2.get("main").unwrap_or_else(|| unreachable!());
    let names: Vec<&str> = f2.sym_vars.iter().map(|s| s.name()).collect();
    assert_eq!(names, ["n", "m"]);
    let text = print_module(&m2).text;
    assert!(text.contains("        n = T.int64()\n        m = T.int64()\n        y: R.Tensor((n, m), dtype=\"float32\") = R.nn.relu(x)\n"), "{text}");

    // Module-level symbols, TypeVar, and plain identifiers in the signature.
    let src3 = "n = TypeVar(\"n\")\n@I.ir_module\nclass Module:\n    m = T.int64()\n    @R.function\n    def main(x: R.Tensor((n, m), \"float32\")) -> R.Tensor((n, m), \"float32\"):\n        return x\n";
    let m3 = parse_ok(src3);
    let f3 = m3.get("main").unwrap_or_else(|| unreachable!());
    assert_eq!(f3.sym_vars.len(), 2);
}

#[test]
fn unannotated_bindings_get_inferred_types() {
    let src = module_with(
        "x: R.Tensor((2, 3), dtype=\"float32\"), y: R.Tensor((3, 4), dtype=\"float32\"))",
        "        with R.dataflow():\n            z = R.matmul(x, y)\n            r = R.nn.relu(z)\n            R.output(r)\n        return r\n",
    );
    let m = parse_ok(&src);
    let f = m.get("main").unwrap_or_else(|| unreachable!());
    let r = f.blocks[0].bindings[1].var;
    assert_eq!(f.var(r).ty, Type::tensor(&[2, 4], DType::F32));
    assert_eq!(f.ret_ty, Type::tensor(&[2, 4], DType::F32));
    let text = print_module(&m).text;
    assert!(text.contains("def main(x: R.Tensor((2, 3), dtype=\"float32\"), y: R.Tensor((3, 4), dtype=\"float32\")) -> R.Tensor((2, 4), dtype=\"float32\"):"), "{text}");
    assert!(
        text.contains("z: R.Tensor((2, 4), dtype=\"float32\") = R.matmul(x, y, out_dtype=None)"),
        "{text}"
    );
}

#[test]
fn nested_calls_are_normalised_to_anf() {
    let src = module_with(
        "x: R.Tensor((2, 3), dtype=\"float32\"), lv: R.Tensor((2, 3), dtype=\"float32\"))",
        "        with R.dataflow():\n            gv = R.add(R.nn.relu(R.nn.relu(x)), R.nn.relu(lv))\n            R.output(gv)\n        z = R.nn.relu(R.nn.relu(gv))\n        return R.nn.relu(z)\n",
    );
    let m = parse_ok(&src);
    let f = m.get("main").unwrap_or_else(|| unreachable!());
    assert_eq!(f.blocks.len(), 2);
    assert_eq!(f.blocks[0].bindings.len(), 4);
    assert!(f.var(f.blocks[0].bindings[0].var).dataflow);
    assert_eq!(f.blocks[1].bindings.len(), 3);
    let text = print_module(&m).text;
    let want = "        with R.dataflow():
            lv1: R.Tensor((2, 3), dtype=\"float32\") = R.nn.relu(x)
            lv2: R.Tensor((2, 3), dtype=\"float32\") = R.nn.relu(lv1)
            lv3: R.Tensor((2, 3), dtype=\"float32\") = R.nn.relu(lv)
            gv: R.Tensor((2, 3), dtype=\"float32\") = R.add(lv2, lv3)
            R.output(gv)
        lv4: R.Tensor((2, 3), dtype=\"float32\") = R.nn.relu(gv)
        z: R.Tensor((2, 3), dtype=\"float32\") = R.nn.relu(lv4)
        lv5: R.Tensor((2, 3), dtype=\"float32\") = R.nn.relu(z)
        return lv5
";
    assert!(text.contains(want), "{text}");
}

#[test]
fn fresh_names_skip_names_used_later() {
    let src = module_with(
        "x: R.Tensor((2, 3), dtype=\"float32\"))",
        "        a = R.nn.relu(R.nn.relu(x))\n        lv = R.nn.relu(a)\n        return lv\n",
    );
    let m = parse_ok(&src);
    let text = print_module(&m).text;
    assert!(
        text.contains("lv1: R.Tensor((2, 3), dtype=\"float32\") = R.nn.relu(x)"),
        "{text}"
    );
}

#[test]
fn tuples_and_tuple_get_item() {
    let src = module_with(
        "x: R.Tensor((2, 3), dtype=\"float32\"), y: R.Tensor((2, 3), dtype=\"float32\"))",
        "        with R.dataflow():\n            t = (x, R.nn.relu(y))\n            a = t[0]\n            gv = R.add(t[1], a)\n            R.output(gv, t)\n        return (gv, t)\n",
    );
    let m = parse_ok(&src);
    let f = m.get("main").unwrap_or_else(|| unreachable!());
    let tt = Type::tensor(&[2, 3], DType::F32);
    assert_eq!(
        f.ret_ty,
        Type::Tuple(vec![tt.clone(), Type::Tuple(vec![tt.clone(), tt])])
    );
    let text = print_module(&m).text;
    let want = "            lv: R.Tensor((2, 3), dtype=\"float32\") = R.nn.relu(y)
            t: R.Tuple(R.Tensor((2, 3), dtype=\"float32\"), R.Tensor((2, 3), dtype=\"float32\")) = (x, lv)
            a: R.Tensor((2, 3), dtype=\"float32\") = t[0]
            lv1: R.Tensor((2, 3), dtype=\"float32\") = t[1]
            gv: R.Tensor((2, 3), dtype=\"float32\") = R.add(lv1, a)
            R.output(t, gv)
        return (gv, t)
";
    assert!(text.contains(want), "{text}");
    assert_eq!(print_module(&parse_ok(&text)).text, text);
}

#[test]
fn literals_constants_and_prim_values() {
    let src = module_with(
        "x: R.Tensor((2, 3), dtype=\"float32\"))",
        "        c = R.const(1.5, \"float32\")\n        i = R.const(3, \"int64\")\n        b = R.const(True, \"bool\")\n        p = R.prim_value(0)\n        q = R.prim_value(T.float32(0.5))\n        s = R.str(\"a\\\"b\")\n        sh = R.shape([1, 2])\n        y = R.add(x, c)\n        return (y, i, b, p, q, s, sh)\n",
    );
    let m = parse_ok(&src);
    let text = print_module(&m).text;
    for want in [
        "c: R.Tensor((), dtype=\"float32\") = R.const(1.5, \"float32\")",
        "i: R.Tensor((), dtype=\"int64\") = R.const(3, \"int64\")",
        "b: R.Tensor((), dtype=\"bool\") = R.const(True, \"bool\")",
        "p: T.int64 = R.prim_value(0)",
        "q: T.float32 = R.prim_value(T.float32(0.5))",
        "s: R.Object = R.str(\"a\\\"b\")",
        "sh: R.Shape([1, 2]) = R.shape([1, 2])",
        "# from tvm.script import tir as T\n",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    assert_eq!(print_module(&parse_ok(&text)).text, text);
}

#[test]
fn accepted_type_spellings() {
    let src = module_with(
        "a: R.Tensor((2, 3), \"float32\"), b: R.Tensor(dtype=\"float32\", ndim=2), c: R.Tensor(ndim=2), d: R.Tensor, e: R.Tuple(R.Tensor((2,), dtype=\"int64\"), R.Object), f: R.Shape([1, 2]), g: R.Shape(ndim=2), h: R.Prim(\"int64\"), i: R.Object, j: R.Shape, k: R.Tuple, l: T.bool, m: R.Tuple(T.int64, T.float32))",
        "        return a\n",
    );
    let m = parse_ok(&src);
    let text = print_module(&m).text;
    assert!(text.contains("def main(a: R.Tensor((2, 3), dtype=\"float32\"), b: R.Tensor(dtype=\"float32\", ndim=2), c: R.Tensor(ndim=2), d: R.Tensor, e: R.Tuple(R.Tensor((2,), dtype=\"int64\"), R.Object), f: R.Shape([1, 2]), g: R.Shape(ndim=2), h: T.int64, i: R.Object, j: R.Shape, k: R.Tuple, l: T.bool, m: R.Tuple(T.int64, T.float32)) -> R.Tensor((2, 3), dtype=\"float32\"):"), "{text}");
    assert_eq!(print_module(&parse_ok(&text)).text, text);
}

#[test]
fn func_attrs_and_visibility() {
    let src = format!(
        "{HEADER}    @R.function\n    def main(x: R.Tensor((2,), dtype=\"float32\")) -> R.Tensor((2,), dtype=\"float32\"):\n        R.func_attr({{\"num_input\": 1, \"global_symbol\": \"entry\", \"Primitive\": 1, \"alpha\": 0.5, \"b\": False}})\n        return x\n"
    );
    let m = parse_ok(&src);
    let f = m.get("main").unwrap_or_else(|| unreachable!());
    assert_eq!(f.attrs.global_symbol.as_deref(), Some("entry"));
    let text = print_module(&m).text;
    assert!(text.contains("        R.func_attr({\"Primitive\": 1, \"alpha\": 0.5, \"b\": False, \"global_symbol\": \"entry\", \"num_input\": 1})\n"), "{text}");
    assert_eq!(print_module(&parse_ok(&text)).text, text);
}

#[test]
fn positional_attrs_and_float_attrs() {
    let src = module_with(
        "x: R.Tensor((1, 3, 8, 8), dtype=\"float32\"), w: R.Tensor((4, 3, 3, 3), dtype=\"float32\"))",
        "        y = R.nn.conv2d(x, w, [2, 2], 1)\n        return y\n",
    );
    let m = parse_ok(&src);
    let text = print_module(&m).text;
    assert!(text.contains("y: R.Tensor((1, 4, 4, 4), dtype=\"float32\") = R.nn.conv2d(x, w, strides=[2, 2], padding=[1, 1, 1, 1],"), "{text}");
}

#[test]
fn malformed_inputs_report_positions() {
    let t = "x: R.Tensor((1, 4), dtype=\"float32\"))";
    let cases: Vec<(String, &str, &str)> = vec![
        // 1. missing parameter annotation
        (
            module_with("x) -> R.Tensor", "        return x\n"),
            "7:15",
            "expected `:` after parameter name, found `)`",
        ),
        // 2. unknown op
        (
            module_with(t, "        y = R.foo(x)\n        return y\n"),
            "8:13",
            "unknown op `relax.foo`",
        ),
        // 3. undefined variable
        (
            module_with(t, "        y = R.nn.relu(z)\n        return y\n"),
            "8:23",
            "undefined variable `z`",
        ),
        // 4. bad type annotation
        (
            module_with(t, "        y: int = R.nn.relu(x)\n        return y\n"),
            "8:12",
            "expected R.Tensor(...) type annotation",
        ),
        // 5. annotation does not accept the inferred type
        (
            module_with(
                t,
                "        y: R.Tensor((1, 5), dtype=\"float32\") = R.nn.relu(x)\n        return y\n",
            ),
            "8:12",
            "type mismatch: annotation says Tensor((1, 5), float32) but the value has type Tensor((1, 4), float32)",
        ),
        // 6. duplicate definition
        (
            module_with(
                t,
                "        y = R.nn.relu(x)\n        y = R.nn.relu(x)\n        return y\n",
            ),
            "9:9",
            "duplicate definition of `y`",
        ),
        // 7. unexpected indentation
        (
            module_with(
                t,
                "        y = R.nn.relu(x)\n            z = R.nn.relu(y)\n        return y\n",
            ),
            "9:13",
            "unexpected indentation",
        ),
        // 8. unterminated string
        (
            module_with("x: R.Tensor((1, 4), dtype=\"float32)", "        return x\n"),
            "7:40",
            "unterminated string literal",
        ),
        // 9. wrong argument count
        (
            module_with(t, "        y = R.nn.relu()\n        return y\n"),
            "8:13",
            "`relax.nn.relu` expects 1 arguments, found 0",
        ),
        // 10. attribute error from the op set
        (
            module_with(
                t,
                "        y = R.nn.conv2d(x, x, strides=\"a\")\n        return y\n",
            ),
            "8:13",
            "attribute `strides`: expected a list of integers",
        ),
        // 11. too many positional arguments
        (
            module_with(t, "        y = R.nn.relu(x, x)\n        return y\n"),
            "8:26",
            "takes at most 1 positional arguments",
        ),
        // 12. missing return
        (
            module_with(t, "        y = R.nn.relu(x)\n"),
            "9:1",
            "expected `return` at the end of function `main`",
        ),
        // 13. undefined symbolic variable in the body
        (
            module_with(
                t,
                "        y: R.Tensor((n, 4), dtype=\"float32\") = R.nn.relu(x)\n        return y\n",
            ),
            "8:22",
            "undefined symbolic variable `n`",
        ),
        // 14. dataflow var used after its block
        (
            module_with(
                t,
                "        with R.dataflow():\n            y = R.nn.relu(x)\n            R.output()\n        return y\n",
            ),
            "11:16",
            "`y` is a dataflow variable of an earlier dataflow block",
        ),
        // 15. op type error
        (
            module_with(
                t,
                "        y = R.add(x, R.const(1, \"int64\"))\n        return y\n",
            ),
            "8:13",
            "type error in `relax.add`: expected operands of the same dtype, found float32 and int64",
        ),
        // 16. unknown function
        (
            module_with(t, "        y = cls.nope(x)\n        return y\n"),
            "8:17",
            "no function named `nope`",
        ),
        // 17. R.output not last
        (
            module_with(
                t,
                "        with R.dataflow():\n            y = R.nn.relu(x)\n            R.output(y)\n            z = R.nn.relu(y)\n        return y\n",
            ),
            "11:13",
            "expected the end of the dataflow block after `R.output(...)`",
        ),
        // 18. missing class
        (
            "x = 1\n".to_string(),
            "1:1",
            "expected `x = T.int64()` or an `@I.ir_module` class",
        ),
        // 19. inconsistent dedent
        (
            module_with(t, "        y = R.nn.relu(x)\n      return y\n"),
            "9:7",
            "inconsistent indentation",
        ),
        // 20. return type mismatch
        (
            module_with(
                "x: R.Tensor((1, 4), dtype=\"float32\")) -> R.Tensor((1, 5), dtype=\"float32\")",
                "        return x\n",
            ),
            "7:55",
            "type mismatch: return annotation says Tensor((1, 5), float32)",
        ),
    ];
    for (i, (src, pos, msg)) in cases.iter().enumerate() {
        let (p, m) = parse_err(src);
        assert_eq!(
            (p.as_str(), m.contains(msg)),
            (*pos, true),
            "case {}: got {p}: {m}",
            i + 1
        );
    }
}

#[test]
fn errors_count_columns_in_chars() {
    let src = module_with(
        "x: R.Tensor((1, 4), dtype=\"float32\"))",
        "        y = R.nn.relu(x) # é\n        z = R.add(\"é\", ü)\n        return y\n",
    );
    let (p, m) = parse_err(&src);
    assert_eq!(p, "9:19");
    assert!(m.contains("expected an expression, found string"), "{m}");
}

#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    let deep_tuple = format!("{}x{}", "(".repeat(5000), ")".repeat(5000));
    let src = module_with(
        "x: R.Tensor((1, 4), dtype=\"float32\"))",
        &format!("        y = {deep_tuple}\n        return y\n"),
    );
    let (_, m) = parse_err(&src);
    assert!(m.contains("nesting is too deep"), "{m}");
    let deep_type = format!("{}R.Object{}", "R.Tuple(".repeat(5000), ")".repeat(5000));
    let src = module_with(&format!("x: {deep_type})"), "        return x\n");
    let (_, m) = parse_err(&src);
    assert!(m.contains("nesting is too deep"), "{m}");
    let long_dim = format!("\"{}\"", vec!["n"; 5000].join(" + "));
    let src = module_with(
        &format!("x: R.Tensor(({long_dim},), dtype=\"float32\"))"),
        "        return x\n",
    );
    let (_, m) = parse_err(&src);
    assert!(m.contains("too long"), "{m}");
}

#[test]
fn odd_inputs_do_not_panic() {
    for src in [
        "",
        "@",
        "@I.ir_module\nclass",
        "@I.ir_module\nclass M:\n",
        "@I.ir_module\nclass M:\n    pass\n",
        "@I.ir_module\nclass M:\n    @R.function\n    def f(",
        "\u{feff}@I.ir_module",
        "@I.ir_module\nclass M:\n    @R.function\n    def f() -> R.Tensor:\n        return R.const(9223372036854775808, \"int64\")\n",
        "@I.ir_module\nclass M:\n    @R.function\n    def f(x: R.Tensor((\"n - 9223372036854775807 - 2\",))):\n        return x\n",
        "@I.ir_module\nclass M:\n    @R.function\n    def f(x: R.Tensor((\"\\\\\",))):\n        return x\n",
        "@I.ir_module\nclass M:\n    @R.function\n    def f():\n        return x[99999999999]\n",
        "\t\t\r\n)))]]]\n",
        "'\\x",
    ] {
        let _ = parse_module_str(src);
    }
}

#[test]
fn global_calls_before_definition_and_inferred_returns() {
    let src = format!(
        "{HEADER}    @R.function\n    def main(x: R.Tensor((2,), dtype=\"float32\")):\n        y = Module.relu_fn(x)\n        return y\n\n    @R.function(private=True)\n    def relu_fn(a: R.Tensor((2,), dtype=\"float32\")):\n        b = R.nn.relu(a)\n        return b\n"
    );
    let m = parse_ok(&src);
    assert_eq!(m.functions.keys().collect::<Vec<_>>(), ["main", "relu_fn"]);
    let text = print_module(&m).text;
    assert!(
        text.contains(
            "        cls = Module\n        y: R.Tensor((2,), dtype=\"float32\") = cls.relu_fn(x)\n"
        ),
        "{text}"
    );
    let rec = format!(
        "{HEADER}    @R.function\n    def f(x: R.Tensor((2,), dtype=\"float32\")):\n        y = cls.f(x)\n        return y\n"
    );
    let (p, msg) = parse_err(&rec);
    assert_eq!(p, "8:17");
    assert!(msg.contains("cannot infer the return type of `f`"), "{msg}");
}

#[test]
fn printer_renames_duplicate_and_reserved_names() {
    let mut f = crate::ir::Function::new();
    let ty = Type::tensor(&[2], DType::F32);
    let x = f.add_var("x", ty.clone(), false);
    f.params.push(x);
    let a = f.add_var("cls", ty.clone(), false);
    let relu = |f: &mut crate::ir::Function, arg| {
        let op =
            crate::op::Op::from_call("relax.nn.relu", &[]).unwrap_or_else(|e| unreachable!("{e}"));
        f.add_expr(
            ExprKind::Call {
                callee: crate::ir::Callee::Op(op),
                args: vec![arg],
            },
            Type::tensor(&[2], DType::F32),
        )
    };
    let xe = f.var_expr(x);
    let e1 = relu(&mut f, xe);
    let b = f.add_var("x", ty.clone(), false);
    let ae = f.var_expr(a);
    let e2 = relu(&mut f, ae);
    f.blocks.push(crate::ir::Block {
        dataflow: false,
        bindings: vec![
            crate::ir::Binding { var: a, value: e1 },
            crate::ir::Binding { var: b, value: e2 },
        ],
    });
    f.ret = Some(f.var_expr(b));
    f.ret_ty = ty;
    f.attrs.global_symbol = Some("main".into());
    let mut m = Module::new();
    m.insert("main", f);
    let text = print_module(&m).text;
    assert!(text.contains("cls_1: R.Tensor((2,), dtype=\"float32\") = R.nn.relu(x)\n        x_1: R.Tensor((2,), dtype=\"float32\") = R.nn.relu(cls_1)\n        return x_1\n"), "{text}");
    assert_eq!(print_module(&parse_ok(&text)).text, text);
}

#[test]
fn print_parse_print_is_a_fixed_point() {
    let sym = format!(
        "{HEADER_T}    @R.function
    def main(x: R.Tensor((\"n\", 4), dtype=\"float32\"), w: R.Tensor((4, 4), dtype=\"float32\")) -> R.Tuple(R.Tensor((\"n\", 4), dtype=\"float32\"), R.Tensor((), dtype=\"float32\")):
        n = T.int64()
        with R.dataflow():
            a = R.matmul(x, w)
            b = R.add(a, metadata[\"relax.expr.Constant\"][1])
            c = R.add(b, metadata[\"relax.expr.Constant\"][2])
            d = R.add(c, metadata[\"ir.GenericConst\"][0])
            k = R.const(0.10000000000000001, \"float32\")
            t = (d, k)
            R.output(t, k)
        e = t[0]
        return (e, k)
{EX2_BODY}"
    );
    let mut consts = ConstTable::new();
    let bias = Constant::from_bytes(
        DType::F32,
        vec![4],
        [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
    )
    .unwrap_or_else(|e| unreachable!("{e}"));
    consts.insert(NS_CONSTANT, 0, weight());
    consts.insert(NS_CONSTANT, 1, bias.clone());
    consts.insert(NS_CONSTANT, 2, bias.clone());
    consts.insert(NS_GENERIC, 0, weight_like_bias());
    let m = parse_module(&sym, "fp.relax", &consts).unwrap_or_else(|e| unreachable!("{e}"));
    let printed = print_module(&m);
    // Identical constants share an index.
    assert_eq!(printed.constants.len(), 3);
    let mut consts2 = ConstTable::new();
    for (i, c) in printed.constants.iter().enumerate() {
        consts2.insert(NS_CONSTANT, i, c.clone());
    }
    let m2 = parse_module(&printed.text, "fp.relax", &consts2)
        .unwrap_or_else(|e| unreachable!("{e}\n{}", printed.text));
    let printed2 = print_module(&m2);
    assert_eq!(printed2, printed);
    assert_eq!(m2, m);
}

fn weight_like_bias() -> Constant {
    Constant::from_bytes(
        DType::F32,
        vec![4],
        [5.0f32, 6.0, 7.0, 8.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
    )
    .unwrap_or_else(|e| unreachable!("{e}"))
}

#[test]
fn side_file_round_trip() {
    let dir = std::env::temp_dir().join(format!(
        "fusebox-text-test-{}-{}",
        std::process::id(),
        line!()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| unreachable!("{e}"));
    let src = format!("{HEADER}{EX2_BODY}{META}");
    let mut consts = ConstTable::new();
    consts.insert(NS_CONSTANT, 0, weight());
    let m = parse_module(&src, "ex2.relax", &consts).unwrap_or_else(|e| unreachable!("{e}"));
    let path = dir.join("model.relax");
    write_module(&path, &m).unwrap_or_else(|e| unreachable!("{e}"));
    assert_eq!(side_file_path(&path), dir.join("model.safetensors"));
    assert!(dir.join("model.safetensors").exists());
    let names: Vec<String> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(names.len(), 2, "temporary files left behind: {names:?}");
    let back = read_module(&path).unwrap_or_else(|e| unreachable!("{e}"));
    assert_eq!(back, m);
    assert_eq!(std::fs::read_to_string(&path).unwrap_or_default(), src);

    // Without constants no side file is written.
    let m1 = parse_ok(EX1);
    let p1 = dir.join("plain.relax");
    write_module(&p1, &m1).unwrap_or_else(|e| unreachable!("{e}"));
    assert!(!dir.join("plain.safetensors").exists());
    assert_eq!(read_module(&p1).unwrap_or_else(|e| unreachable!("{e}")), m1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Builds a module with `n` bindings; run with `--release --ignored` to time parse + print.
fn big_module(n: usize) -> String {
    let mut s = String::from(HEADER);
    s.push_str("    @R.function\n    def main(x: R.Tensor((1, 64, 56, 56), dtype=\"float32\")) -> R.Tensor((1, 64, 56, 56), dtype=\"float32\"):\n        with R.dataflow():\n");
    s.push_str("            lv0: R.Tensor((1, 64, 56, 56), dtype=\"float32\") = R.nn.relu(x)\n");
    for i in 1..n {
        s.push_str(&format!(
            "            lv{i}: R.Tensor((1, 64, 56, 56), dtype=\"float32\") = R.add(lv{}, x)\n",
            i - 1
        ));
    }
    s.push_str(&format!("            gv: R.Tensor((1, 64, 56, 56), dtype=\"float32\") = R.nn.relu(lv{})\n            R.output(gv)\n        return gv\n", n - 1));
    s
}

#[test]
fn big_module_round_trips() {
    let src = big_module(2000);
    let m = parse_ok(&src);
    assert_eq!(print_module(&m).text, src);
}

#[test]
fn index_ops_round_trip() {
    let src = module_with(
        "x: R.Tensor((\"n\", 3, 4), dtype=\"float32\"), i: R.Tensor((\"n\", 3, 2), dtype=\"int64\"), j: R.Tensor((5, 2), dtype=\"int32\"), u: R.Tensor((5, 4), dtype=\"float32\"))",
        "        a = R.gather_elements(x, i, axis=2)
        b = R.gather_nd(x, j, 0)
        c = R.scatter_elements(x, i, a, axis=-1, reduction=\"add\")
        d = R.scatter_nd(x, j, u, reduction=\"max\")
        e = R.one_hot(j, R.prim_value(1), R.prim_value(0), depth=6, axis=1)
        f = R.arange(0, 10, 3)
        g = R.tile(x, [2, 1])
        h = R.tril(x, 1)
        k = R.triu(x, k=-1)
        l = R.cumsum(x, axis=1, dtype=\"float64\", exclusive=0)
        m = R.cumprod(x)
        p = R.nn.pad(x, [0, 0, 1, 2, 0, 1], \"reflect\")
        return (a, b, c, d, e, f, g, h, k, l, m, p)
",
    );
    let m = parse_ok(&src);
    let text = print_module(&m).text;
    for want in [
        "a: R.Tensor((n, 3, 2), dtype=\"float32\") = R.gather_elements(x, i, axis=2)",
        "b: R.Tensor((5, 4), dtype=\"float32\") = R.gather_nd(x, j, batch_dims=0)",
        "c: R.Tensor((n, 3, 4), dtype=\"float32\") = R.scatter_elements(x, i, a, axis=-1, reduction=\"add\")",
        "d: R.Tensor((n, 3, 4), dtype=\"float32\") = R.scatter_nd(x, j, u, reduction=\"max\")",
        "e: R.Tensor((5, 6, 2), dtype=\"int64\") = R.one_hot(j, R.prim_value(1), R.prim_value(0), depth=6, axis=1)",
        "f: R.Tensor((4,), dtype=\"int64\") = R.arange(start=0, end=10, step=3, dtype=\"int64\")",
        "g: R.Tensor((n, 6, 4), dtype=\"float32\") = R.tile(x, repeats=[2, 1])",
        "h: R.Tensor((n, 3, 4), dtype=\"float32\") = R.tril(x, k=1)",
        "k: R.Tensor((n, 3, 4), dtype=\"float32\") = R.triu(x, k=-1)",
        "l: R.Tensor((n, 3, 4), dtype=\"float64\") = R.cumsum(x, axis=1, dtype=\"float64\", exclusive=False)",
        "m: R.Tensor((n * 3 * 4,), dtype=\"float32\") = R.cumprod(x, axis=None, dtype=None, exclusive=False)",
        "p: R.Tensor((n, 6, 5), dtype=\"float32\") = R.nn.pad(x, pad_width=[0, 0, 1, 2, 0, 1], pad_value=0.0, pad_mode=\"reflect\")",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    let m2 = parse_ok(&text);
    assert_eq!(print_module(&m2).text, text);
    assert_eq!(m2, m);
}

/// TVM prints a tuple bound to a var without parentheses (issue 20): it parses as the tuple.
#[test]
fn a_bare_tuple_binding_parses_as_a_tuple() {
    let t = r#"R.Tensor((16, 16), dtype="float32")"#;
    let src = module_with(
        &format!("a: {t}, b: {t}) -> R.Tuple({t}, {t})"),
        &format!(
            "        with R.dataflow():\n            lv4: {t} = R.add(a, b)\n            lv9: {t} = R.multiply(a, b)\n            gv: R.Tuple({t}, {t}) = lv4, lv9\n            R.output(gv)\n        return gv\n"
        ),
    );
    let m = parse_ok(&src);
    let f = m.get("main").unwrap_or_else(|| unreachable!());
    let gv = f.bindings().last().unwrap_or_else(|| unreachable!());
    match &f.expr(gv.value).kind {
        ExprKind::Tuple(fields) => assert_eq!(fields.len(), 2),
        k => unreachable!("not a tuple: {k:?}"),
    }
    // The printed form (parenthesised) parses back to the same module.
    let printed = print_module(&m).text;
    assert!(printed.contains("= (lv4, lv9)"), "{printed}");
    assert_eq!(print_module(&parse_ok(&printed)).text, printed);
    // Fields that are calls become bindings, as in a parenthesised tuple, so printing is a
    // fixed point (found by the parse_text fuzz target).
    let nested = src.replace("= lv4, lv9", "= lv4, R.nn.relu(lv9)");
    let m = parse_ok(&nested);
    let printed = print_module(&m).text;
    assert_eq!(print_module(&parse_ok(&printed)).text, printed);
    assert!(printed.contains("R.nn.relu(lv9)\n"), "{printed}");
    // A trailing comma is a one-field tuple, as in Python.
    let one = src.replace("= lv4, lv9", "= lv4,").replace(
        &format!("R.Tuple({t}, {t}) = lv4,"),
        &format!("R.Tuple({t}) = lv4,"),
    );
    let one = one.replace(
        &format!(") -> R.Tuple({t}, {t})"),
        &format!(") -> R.Tuple({t})"),
    );
    let m = parse_ok(&one);
    let f = m.get("main").unwrap_or_else(|| unreachable!());
    let gv = f.bindings().last().unwrap_or_else(|| unreachable!());
    assert!(matches!(&f.expr(gv.value).kind, ExprKind::Tuple(x) if x.len() == 1));
}

#[test]
fn layout_transform_and_split_layouts_round_trip() {
    // TVM 0.27's own printing of these calls (its parser read the lambda forms below), with
    // the lambda's index names as fusebox prints them.
    let body = r#"    @R.function
    def main(x: R.Tensor((1, 64, 14, 14), dtype="float32"), w: R.Tensor((128, 64, 1, 1), dtype="float32")) -> R.Tensor((1, 128, 12, 12), dtype="float32"):
        with R.dataflow():
            y: R.Tensor((1, 4, 14, 14, 16), dtype="float32") = R.layout_transform(x, index_map=T.index_map(lambda i0, i1, i2, i3: (i0, i1 // 16, i2, i3, i1 % 16)), pad_value=None)
            z: R.Tensor((1, 8, 14, 14, 16), dtype="float32") = R.nn.conv2d(y, w, strides=[1, 1], padding=[0, 0, 0, 0], dilation=[1, 1], groups=1, data_layout="NCHW16c", kernel_layout="OIHW", out_layout="NCHW16c", out_dtype=None)
            p: R.Tensor((1, 8, 12, 12, 16), dtype="float32") = R.nn.max_pool2d(z, pool_size=[3, 3], strides=[1, 1], dilation=[1, 1], padding=[0, 0, 0, 0], ceil_mode=False, count_include_pad=False, layout="NCHW16c", out_layout="NCHW16c")
            q: R.Tensor((1, 128, 12, 12), dtype="float32") = R.layout_transform(p, index_map=T.index_map(lambda i0, i1, i2, i3, i4: (i0, i1 * 16 + i4, i2, i3)), pad_value=None)
            R.output(q)
        return q
"#;
    let src = format!("{HEADER_T}{body}");
    let m = parse_ok(&src);
    assert_eq!(print_module(&m).text, src);
    // The forms TVM's parser takes: named indices, a bare lambda, no annotations.
    let loose = src
        .replace(
            "T.index_map(lambda i0, i1, i2, i3: (i0, i1 // 16, i2, i3, i1 % 16))",
            "lambda n, c, h, w: (n, c // 16, h, w, c % 16)",
        )
        .replace(
            "lambda i0, i1, i2, i3, i4: (i0, i1 * 16 + i4, i2, i3)",
            "lambda n, c, h, w, c1: (n, c * 16 + c1, h, w)",
        )
        .replace(", pad_value=None", "");
    assert_ne!(loose, src);
    assert_eq!(print_module(&parse_ok(&loose)).text, src);
    // A map that does not move whole elements is an error at the lambda.
    let bad = src.replace(
        "(i0, i1 // 16, i2, i3, i1 % 16)",
        "(i0, i1 // 16, i2, i3, i1 % 8)",
    );
    let (at, msg) = parse_err(&bad);
    assert!(msg.contains("invalid index map"), "{msg}");
    assert!(at.starts_with("10:"), "{at}");
}

#[test]
fn match_cast_names_a_value_dependent_extent() {
    // As TVM 0.27 prints a nonzero whose extent R.match_cast names: the module is a fixed
    // point of print ∘ parse, `k` is the binding's, and the return type keeps the rank.
    let body = |cast: &str| {
        format!(
            "{HEADER_T}    @R.function
    def main(c: R.Tensor((16,), dtype=\"bool\")) -> R.Tensor(dtype=\"int64\", ndim=1):
        k = T.int64()
        with R.dataflow():
            nz: R.Tensor(dtype=\"int64\", ndim=2) = R.nonzero(c)
{cast}
            idx: R.Tensor((k,), dtype=\"int64\") = R.reshape(idx2, R.shape([k]))
            R.output(idx)
        return idx
"
        )
    };
    let src = body(
        "            idx2: R.Tensor((1, k), dtype=\"int64\") = R.match_cast(nz, R.Tensor((1, k), dtype=\"int64\"))",
    );
    let m = parse_module(&src, "m.relax", &ConstTable::new()).unwrap_or_else(|e| panic!("{e}"));
    crate::ir::verify::verify(&m).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(print_module(&m).text, src);
    // Without the annotation the cast's type is the binding's.
    let bare = body("            idx2 = R.match_cast(nz, R.Tensor((1, k), dtype=\"int64\"))");
    let m2 = parse_module(&bare, "m.relax", &ConstTable::new()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(print_module(&m2).text, src);
    // A refined call binding (what the ONNX importer makes) prints as the call under a name
    // of its own, then the cast.
    let empty = Module::default();
    let mut b = crate::ir::builder::FunctionBuilder::new(&empty);
    let c = b.param("c", Type::tensor(&[16], DType::Bool));
    let k = b.fresh_sym("k");
    b.begin_dataflow();
    let cv = b.var(c);
    let nz = b
        .emit(
            "idx2",
            crate::ir::Callee::Op(crate::op::Op::Nonzero),
            vec![cv],
        )
        .unwrap();
    let refined = Type::Tensor(crate::ir::TensorType::new(
        vec![crate::ir::Dim::Static(1), k.clone()],
        DType::I64,
    ));
    b.refine(nz, refined).unwrap();
    let shape = b.shape(vec![k]);
    let nzv = b.var(nz);
    let idx = b
        .emit_output(
            "idx",
            crate::ir::Callee::Op(crate::op::Op::Reshape),
            vec![nzv, shape],
        )
        .unwrap();
    b.end_dataflow().unwrap();
    let ret = b.var(idx);
    let f = b.finish(ret).unwrap();
    assert_eq!(
        f.ret_ty,
        Type::Tensor(crate::ir::TensorType {
            dims: None,
            ndim: Some(1),
            dtype: Some(DType::I64)
        })
    );
    let mut m3 = Module::default();
    m3.insert("main", f);
    let text = print_module(&m3).text;
    assert!(
        text.contains("idx2_value: R.Tensor(dtype=\"int64\", ndim=2) = R.nonzero(c)\n            idx2: R.Tensor((1, k), dtype=\"int64\") = R.match_cast(idx2_value, R.Tensor((1, k), dtype=\"int64\"))"),
        "{text}"
    );
    // Refining to a type the value's does not accept is an error.
    let mut b = crate::ir::builder::FunctionBuilder::new(&empty);
    let c = b.param("c", Type::tensor(&[16], DType::Bool));
    let cv = b.var(c);
    let nz = b
        .emit(
            "nz",
            crate::ir::Callee::Op(crate::op::Op::Nonzero),
            vec![cv],
        )
        .unwrap();
    assert!(b.refine(nz, Type::tensor(&[1, 3], DType::F32)).is_err());
    // Errors: a cast that is not a refinement, an annotation that disagrees, a nested cast.
    for (cast, want) in [
        (
            "            idx2: R.Tensor((1, k), dtype=\"int64\") = R.match_cast(nz, R.Tensor((1, k), dtype=\"int32\"))",
            "does not refine",
        ),
        (
            "            idx2: R.Tensor((2, k), dtype=\"int64\") = R.match_cast(nz, R.Tensor((1, k), dtype=\"int64\"))",
            "annotation says",
        ),
        (
            "            idx2: R.Tensor((1, k), dtype=\"int64\") = R.add(R.match_cast(nz, R.Tensor((1, k), dtype=\"int64\")), nz)",
            "whole value of a binding",
        ),
        (
            "            idx2 = R.match_cast(nz, R.Tensor((1, k), dtype=\"int64\")), nz",
            "whole value of a binding",
        ),
    ] {
        let e = parse_module(&body(cast), "m.relax", &ConstTable::new())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains(want), "{cast}: {e}");
    }
}
