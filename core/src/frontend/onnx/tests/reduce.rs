//! Importer tests of the reduction family (issue 17): what each ONNX op becomes, its types,
//! and the errors for what it cannot import. Numerics are checked by the ONNX node
//! conformance suite (`tests/onnx_node.rs`).

use super::*;

fn astr(name: &str, s: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        s: s.as_bytes().to_vec(),
        r#type: 3,
        ..Default::default()
    }
}

fn import_err(bytes: &[u8]) -> String {
    match import_onnx(bytes, "t.onnx") {
        Ok(m) => panic!("expected an error, got\n{}", text(&m)),
        Err(e) => e.to_string(),
    }
}

fn ty(s: &str) -> Type {
    crate::text::parse_module_str(&format!(
        "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: {s}) -> {s}:\n        return x\n"
    ))
    .unwrap()
    .get("main")
    .unwrap()
    .ret_ty
    .clone()
}

#[test]
fn composite_reductions() {
    let b = model(
        13,
        vec![node(
            "ReduceLogSumExp",
            "r",
            &["x"],
            &["y"],
            vec![ais("axes", &[1]), ai("keepdims", 0)],
        )],
        vec![vi("x", 1, &["2", "3"])],
        vec![],
        &["y"],
    );
    let m = import(&b);
    let t = text(&m);
    for op in [
        "R.max(x, axis=[1], keepdims=True)",
        "R.exp",
        "R.sum",
        "R.log",
        "R.max(x, axis=[1], keepdims=False)",
    ] {
        assert!(t.contains(op), "{op} missing in {t}");
    }
    assert_eq!(ret_type(&m), ty("R.Tensor((2,), dtype=\"float32\")"));
    // Opset 18: axes as an input; L2 = sqrt(sum(x * x)).
    let b = model(
        18,
        vec![node("ReduceL2", "r", &["x", "ax"], &["y"], vec![])],
        vec![vi("x", 1, &["2", "3", "4"])],
        vec![i64_init("ax", &[-1])],
        &["y"],
    );
    let m = import(&b);
    let t = text(&m);
    assert!(
        t.contains("R.multiply(x, x)") && t.contains("R.sqrt"),
        "{t}"
    );
    assert_eq!(ret_type(&m), ty("R.Tensor((2, 3, 1), dtype=\"float32\")"));
    // No axes and noop_with_empty_axes: the input passes through.
    let b = model(
        18,
        vec![node(
            "ReduceProd",
            "r",
            &["x"],
            &["y"],
            vec![ai("noop_with_empty_axes", 1)],
        )],
        vec![vi("x", 1, &["2", "3"])],
        vec![],
        &["y"],
    );
    assert!(!text(&import(&b)).contains("R.prod"));
    let b = model(
        13,
        vec![node("ReduceMin", "r", &["x"], &["y"], vec![])],
        vec![vi("x", 9, &["2", "3"])],
        vec![],
        &["y"],
    );
    let m = import(&b);
    assert!(text(&m).contains("R.min(x, axis=None, keepdims=True)"));
    assert_eq!(ret_type(&m), ty("R.Tensor((1, 1), dtype=\"bool\")"));
}

#[test]
fn arg_reductions_and_topk() {
    let b = model(
        13,
        vec![node(
            "ArgMax",
            "a",
            &["x"],
            &["y"],
            vec![
                ai("axis", -1),
                ai("keepdims", 0),
                ai("select_last_index", 1),
            ],
        )],
        vec![vi("x", 1, &["2", "5"])],
        vec![],
        &["y"],
    );
    let m = import(&b);
    let t = text(&m);
    assert!(
        t.contains("R.strided_slice(x, axes=[1], begin=[-1], end=[-6], strides=[-1]"),
        "{t}"
    );
    assert!(t.contains("R.argmax(") && t.contains("R.subtract("), "{t}");
    assert_eq!(ret_type(&m), ty("R.Tensor((2,), dtype=\"int64\")"));
    let b = model(
        11,
        vec![node(
            "TopK",
            "t",
            &["x", "k"],
            &["v", "i"],
            vec![ai("largest", 0)],
        )],
        vec![vi("x", 1, &["3", "6"])],
        vec![i64_init("k", &[2])],
        &["v", "i"],
    );
    let m = import(&b);
    assert!(
        text(&m).contains("ret_type=\"both\", largest=False, dtype=\"int64\")"),
        "{}",
        text(&m)
    );
    assert_eq!(
        ret_type(&m),
        Type::Tuple(vec![
            ty("R.Tensor((3, 2), dtype=\"float32\")"),
            ty("R.Tensor((3, 2), dtype=\"int64\")"),
        ])
    );
    // k beyond the axis is an error at import.
    let b = model(
        11,
        vec![node("TopK", "t", &["x", "k"], &["v", "i"], vec![])],
        vec![vi("x", 1, &["3", "6"])],
        vec![i64_init("k", &[7])],
        &["v", "i"],
    );
    assert!(import_err(&b).contains("larger than"));
}

#[test]
fn einsum_hardmax_lp_normalization() {
    let b = model(
        12,
        vec![node(
            "Einsum",
            "e",
            &["a", "b"],
            &["y"],
            vec![astr("equation", "bij, bjk -> bik")],
        )],
        vec![vi("a", 1, &["2", "3", "4"]), vi("b", 1, &["2", "4", "5"])],
        vec![],
        &["y"],
    );
    let m = import(&b);
    assert!(text(&m).contains("R.einsum((a, b), subscripts=\"bij,bjk->bik\")"));
    assert_eq!(ret_type(&m), ty("R.Tensor((2, 3, 5), dtype=\"float32\")"));
    let b = model(
        12,
        vec![node(
            "Einsum",
            "e",
            &["a", "b"],
            &["y"],
            vec![astr("equation", "ij,jk->iq")],
        )],
        vec![vi("a", 1, &["2", "3"]), vi("b", 1, &["3", "5"])],
        vec![],
        &["y"],
    );
    assert!(import_err(&b).contains("`q`"));
    let b = model(
        13,
        vec![node("Hardmax", "h", &["x"], &["y"], vec![ai("axis", 1)])],
        vec![vi("x", 1, &["2", "3", "4"])],
        vec![],
        &["y"],
    );
    let m = import(&b);
    let t = text(&m);
    assert!(t.contains("R.argmax(x, axis=1, keepdims=False)"), "{t}");
    assert!(t.contains("R.take(") && t.contains("axes=[0, 2, 1]"), "{t}");
    assert_eq!(ret_type(&m), ty("R.Tensor((2, 3, 4), dtype=\"float32\")"));
    let b = model(
        13,
        vec![node(
            "LpNormalization",
            "l",
            &["x"],
            &["y"],
            vec![ai("p", 3)],
        )],
        vec![vi("x", 1, &["2", "3"])],
        vec![],
        &["y"],
    );
    assert!(import_err(&b).contains("p must be 1 or 2"));
}

#[test]
fn attention_and_rotary_embedding() {
    // 3-D GQA with a past cache, a bool mask and causal masking: all four outputs.
    let b = model(
        23,
        vec![node(
            "Attention",
            "a",
            &["q", "k", "v", "m", "pk", "pv"],
            &["y", "pk_out", "pv_out", "qk"],
            vec![
                ai("q_num_heads", 4),
                ai("kv_num_heads", 2),
                ai("is_causal", 1),
                ai("qk_matmul_output_mode", 3),
                af("softcap", 2.0),
            ],
        )],
        vec![
            vi("q", 1, &["1", "3", "32"]),
            vi("k", 1, &["1", "3", "16"]),
            vi("v", 1, &["1", "3", "16"]),
            vi("m", 9, &["3", "4"]),
            vi("pk", 1, &["1", "2", "2", "8"]),
            vi("pv", 1, &["1", "2", "2", "8"]),
        ],
        vec![],
        &["y", "pk_out", "pv_out", "qk"],
    );
    let m = import(&b);
    let t = text(&m);
    for op in [
        "R.concat",
        "R.broadcast_to",
        "R.tanh",
        "R.log",
        "R.nn.softmax",
    ] {
        assert!(t.contains(op), "{op} missing in {t}");
    }
    assert_eq!(
        ret_type(&m),
        Type::Tuple(vec![
            ty("R.Tensor((1, 3, 32), dtype=\"float32\")"),
            ty("R.Tensor((1, 2, 5, 8), dtype=\"float32\")"),
            ty("R.Tensor((1, 2, 5, 8), dtype=\"float32\")"),
            ty("R.Tensor((1, 4, 3, 5), dtype=\"float32\")"),
        ])
    );
    // Heads that do not group evenly.
    let b = model(
        23,
        vec![node("Attention", "a", &["q", "k", "v"], &["y"], vec![])],
        vec![
            vi("q", 1, &["1", "3", "2", "8"]),
            vi("k", 1, &["1", "2", "2", "8"]),
            vi("v", 1, &["1", "2", "2", "8"]),
        ],
        vec![],
        &["y"],
    );
    assert!(import_err(&b).contains("multiple"));
    let b = model(
        23,
        vec![node(
            "RotaryEmbedding",
            "r",
            &["x", "c", "s", "p"],
            &["y"],
            vec![ai("interleaved", 1), ai("rotary_embedding_dim", 4)],
        )],
        vec![
            vi("x", 1, &["1", "2", "3", "8"]),
            vi("c", 1, &["5", "2"]),
            vi("s", 1, &["5", "2"]),
            vi("p", 7, &["1", "3"]),
        ],
        vec![],
        &["y"],
    );
    let m = import(&b);
    let t = text(&m);
    assert!(t.contains("R.take(") && t.contains("strides=[2]"), "{t}");
    assert_eq!(
        ret_type(&m),
        ty("R.Tensor((1, 2, 3, 8), dtype=\"float32\")")
    );
}

#[test]
fn linear_attention_unrolls_its_steps() {
    let b = model(
        27,
        vec![node(
            "LinearAttention",
            "la",
            &["q", "k", "v", "", "g", "b"],
            &["y", "s"],
            vec![ai("q_num_heads", 4), ai("kv_num_heads", 2)],
        )],
        vec![
            vi("q", 1, &["1", "3", "16"]),
            vi("k", 1, &["1", "3", "8"]),
            vi("v", 1, &["1", "3", "6"]),
            vi("g", 1, &["1", "3", "2"]),
            vi("b", 1, &["1", "3", "1"]),
        ],
        vec![],
        &["y", "s"],
    );
    let m = import(&b);
    let t = text(&m);
    // Three steps; the zero initial state needs no decay, so steps 2 and 3 decay it.
    assert_eq!(t.matches("R.exp(").count(), 2, "{t}");
    assert_eq!(t.matches("R.concat(").count(), 1, "{t}");
    assert_eq!(
        ret_type(&m),
        Type::Tuple(vec![
            ty("R.Tensor((1, 3, 12), dtype=\"float32\")"),
            ty("R.Tensor((1, 2, 4, 3), dtype=\"float32\")"),
        ])
    );
    // The update rule decides which of decay / beta must be given.
    let b = model(
        27,
        vec![node(
            "LinearAttention",
            "la",
            &["q", "k", "v"],
            &["y"],
            vec![ai("q_num_heads", 2), ai("kv_num_heads", 2)],
        )],
        vec![
            vi("q", 1, &["1", "3", "8"]),
            vi("k", 1, &["1", "3", "8"]),
            vi("v", 1, &["1", "3", "8"]),
        ],
        vec![],
        &["y"],
    );
    assert!(import_err(&b).contains("needs decay"));
}
