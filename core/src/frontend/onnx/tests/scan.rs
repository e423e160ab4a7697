//! Importer tests of `Scan` (unrolled at import time): what it becomes, and the errors for
//! what cannot be unrolled. Numerics are checked against onnxruntime by `tests/onnx_node.rs`
//! (the node suite's `Scan` cases and `tests/onnx/extra`'s directions, axes, opset 8 and
//! nesting).

use super::*;

pub(super) fn import_err(bytes: &[u8]) -> String {
    match import_onnx(bytes, "t.onnx") {
        Ok(m) => panic!("expected an error, got\n{}", text(&m)),
        Err(e) => e.to_string(),
    }
}

/// `body(s_in, x_t) = (s_out = Add(s_in, x_t), y_t = Identity(s_out))`, elements of shape
/// `elem`.
fn sum_body(elem: &[&str]) -> GraphProto {
    GraphProto {
        node: vec![
            node("Add", "add", &["s_in", "x_t"], &["s_out"], vec![]),
            node("Identity", "id", &["s_out"], &["y_t"], vec![]),
        ],
        name: "body".into(),
        initializer: vec![],
        input: vec![vi("s_in", 1, elem), vi("x_t", 1, elem)],
        output: vec![vi("s_out", 1, elem), vi("y_t", 1, elem)],
        value_info: vec![],
    }
}

pub(super) fn graph_attr(name: &str, g: GraphProto) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: 5,
        g: Some(Box::new(g)),
        ..Default::default()
    }
}

fn scan_node(body: GraphProto, extra: Vec<AttributeProto>) -> NodeProto {
    let mut attrs = vec![ai("num_scan_inputs", 1), graph_attr("body", body)];
    attrs.extend(extra);
    node("Scan", "scan", &["s0", "x"], &["s", "y"], attrs)
}

#[test]
fn a_scan_unrolls_into_one_take_and_body_per_step_and_stacks_its_outputs() {
    let b = model(
        17,
        vec![scan_node(sum_body(&["4"]), vec![])],
        vec![vi("s0", 1, &["4"]), vi("x", 1, &["3", "4"])],
        vec![],
        &["s", "y"],
    );
    let m = import(&b);
    let t = text(&m);
    assert_eq!(t.matches("R.take(x, ").count(), 3, "{t}");
    assert_eq!(t.matches("R.add(").count(), 3, "{t}");
    assert!(t.contains("R.stack("), "{t}");
    // The final state has the state's shape; the scan output stacks 3 steps on axis 0.
    let Type::Tuple(fields) = ret_type(&m) else {
        panic!("{t}")
    };
    let dims = |ty: &Type| match ty {
        Type::Tensor(tt) => tt.dims.as_ref().map(|d| d.to_vec()),
        _ => None,
    };
    assert_eq!(dims(&fields[0]), Some(vec![Dim::Static(4)]));
    assert_eq!(dims(&fields[1]), Some(vec![Dim::Static(3), Dim::Static(4)]));
    // Output axis 1 of a one-step scan: the step's value with an axis inserted.
    let b = model(
        17,
        vec![scan_node(
            sum_body(&["4"]),
            vec![ais("scan_output_axes", &[1])],
        )],
        vec![vi("s0", 1, &["4"]), vi("x", 1, &["1", "4"])],
        vec![],
        &["s", "y"],
    );
    let m = import(&b);
    let Type::Tuple(fields) = ret_type(&m) else {
        panic!()
    };
    assert_eq!(dims(&fields[1]), Some(vec![Dim::Static(4), Dim::Static(1)]));
}

#[test]
fn what_cannot_be_unrolled_is_an_error_naming_the_node() {
    let input = |x: &[&str]| vec![vi("s0", 1, &["4"]), vi("x", 1, x)];
    // The summing Scan over `x` of shape `x`, with `extra` attributes.
    let summing = |x: &[&str], extra: Vec<AttributeProto>| {
        model(
            17,
            vec![scan_node(sum_body(&["4"]), extra)],
            input(x),
            vec![],
            &["s", "y"],
        )
    };
    // A Scan over `x` (3, 4) with exactly the attributes `attrs`.
    let bare = |attrs: Vec<AttributeProto>| {
        model(
            17,
            vec![node("Scan", "scan", &["s0", "x"], &["s", "y"], attrs)],
            input(&["3", "4"]),
            vec![],
            &["s", "y"],
        )
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            summing(&["n", "4"], vec![]),
            "needs a static sequence length",
        ),
        (summing(&["0", "4"], vec![]), "empty sequence"),
        (summing(&["5000", "4"], vec![]), "at most 4096 steps"),
        (
            summing(&["3", "4"], vec![ais("scan_input_directions", &[2])]),
            "direction 2",
        ),
        (
            summing(&["3", "4"], vec![ais("scan_input_axes", &[0, 1])]),
            "`scan_input_axes` has 2 values, expected 1",
        ),
        (
            bare(vec![
                ai("num_scan_inputs", 3),
                graph_attr("body", sum_body(&["4"])),
            ]),
            "fewer than num_scan_inputs = 3",
        ),
        (bare(vec![ai("num_scan_inputs", 1)]), "no `body` graph"),
    ];
    for (b, want) in cases {
        let e = import_err(&b);
        assert!(
            e.contains("t.onnx: node `scan` (Scan)") && e.contains(want),
            "want {want:?}: {e}"
        );
    }
    // Opset 8: inputs `ins` (sequence_lens first), state `s0` and scan input `x` shapes.
    let scan8 = |ins: &[&str], s0: &[&str], x: &[&str], inits: Vec<TensorProto>| {
        model(
            8,
            vec![node(
                "Scan",
                "scan",
                ins,
                &["s", "y"],
                vec![
                    ai("num_scan_inputs", 1),
                    graph_attr("body", sum_body(&["4"])),
                ],
            )],
            vec![vi("s0", 1, s0), vi("x", 1, x)],
            inits,
            &["s", "y"],
        )
    };
    // A `sequence_lens` shorter than the sequence.
    let lens = TensorProto {
        name: "lens".into(),
        dims: vec![1],
        data_type: 6,
        raw_data: 2i32.to_le_bytes().to_vec(),
        ..Default::default()
    };
    let b = scan8(
        &["lens", "s0", "x"],
        &["1", "4"],
        &["1", "3", "4"],
        vec![lens],
    );
    let e = import_err(&b);
    assert!(e.contains("shorter sequences are not supported"), "{e}");
    // A state whose batch differs from the scan inputs'.
    let b = scan8(&["", "s0", "x"], &["2", "4"], &["1", "3", "4"], vec![]);
    let e = import_err(&b);
    assert!(
        e.contains("`s0` must have the batch extent 1 on axis 0, found 2"),
        "{e}"
    );
}

#[test]
fn nested_scans_share_one_unrolling_budget() {
    // An outer Scan of 64 steps whose body holds an inner Scan of 4096 steps over a constant:
    // 64 × 4096 × 2 body nodes is past the budget (2^16), an error instead of memory exhaustion.
    let inner_x = TensorProto {
        name: "ix".into(),
        dims: vec![4096, 4],
        data_type: 1,
        raw_data: vec![0; 4096 * 4 * 4],
        ..Default::default()
    };
    let inner = node(
        "Scan",
        "inner",
        &["s_in", "ix"],
        &["s_mid", "ys"],
        vec![
            ai("num_scan_inputs", 1),
            graph_attr("body", sum_body(&["4"])),
        ],
    );
    let outer_body = GraphProto {
        node: vec![
            node("Identity", "id0", &["x_t"], &["x_copy"], vec![]),
            inner,
            node("Add", "out_add", &["s_mid", "x_copy"], &["s_out"], vec![]),
        ],
        name: "outer".into(),
        initializer: vec![inner_x],
        input: vec![vi("s_in", 1, &["4"]), vi("x_t", 1, &["4"])],
        output: vec![vi("s_out", 1, &["4"])],
        value_info: vec![],
    };
    let b = model(
        17,
        vec![node(
            "Scan",
            "scan",
            &["s0", "x"],
            &["s"],
            vec![ai("num_scan_inputs", 1), graph_attr("body", outer_body)],
        )],
        vec![vi("s0", 1, &["4"]), vi("x", 1, &["64", "4"])],
        vec![],
        &["s"],
    );
    let e = import_err(&b);
    assert!(
        e.contains("node `scan` (Scan)") && e.contains("more than 65536 nodes"),
        "{e}"
    );
}

#[test]
fn a_body_that_shadows_an_outer_name_does_not_leak_it() {
    // The body binds `x` (the outer graph's input) to its own sum; the `Relu` after the Scan
    // reads the outer `x`.
    let body = GraphProto {
        node: vec![
            node("Add", "add", &["s_in", "x_t"], &["x"], vec![]),
            node("Identity", "id", &["x"], &["s_out"], vec![]),
            node("Identity", "id2", &["x"], &["y_t"], vec![]),
        ],
        name: "body".into(),
        initializer: vec![],
        input: vec![vi("s_in", 1, &["4"]), vi("x_t", 1, &["4"])],
        output: vec![vi("s_out", 1, &["4"]), vi("y_t", 1, &["4"])],
        value_info: vec![],
    };
    let b = model(
        17,
        vec![
            scan_node(body, vec![]),
            node("Relu", "relu", &["x"], &["r"], vec![]),
        ],
        vec![vi("s0", 1, &["4"]), vi("x", 1, &["3", "4"])],
        vec![],
        &["s", "r"],
    );
    let m = import(&b);
    let t = text(&m);
    assert!(t.contains("R.nn.relu(x)"), "{t}");
    let Type::Tuple(fields) = ret_type(&m) else {
        panic!("{t}")
    };
    assert_eq!(fields[1], Type::tensor(&[3, 4], DType::F32), "{t}");
}
