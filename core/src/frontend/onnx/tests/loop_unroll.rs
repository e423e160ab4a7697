//! Importer tests of `Loop` (unrolled at import time when its trip count and condition are
//! known then), and of the float-constant folding that makes such trip counts known. Numerics
//! are checked against onnxruntime by `tests/onnx_node.rs` (`test_loop11`, the expanded
//! `Range` cases, and `tests/onnx/extra`'s loop that stops through its condition).

use super::scan::{graph_attr, import_err};
use super::*;

fn bool_init(name: &str, v: bool) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: vec![],
        data_type: 9,
        raw_data: vec![u8::from(v)],
        ..Default::default()
    }
}

/// `body(i, c, acc) = (cond_out, acc + x[i], acc + x[i])`: `cond_out` is `c` or, with
/// `stop_at`, `i + 1 < stop_at`.
fn body(stop_at: Option<i64>) -> GraphProto {
    let mut nodes = vec![
        node("Gather", "g", &["x", "i"], &["row"], vec![ai("axis", 0)]),
        node("Add", "add", &["acc", "row"], &["acc_out"], vec![]),
        node("Identity", "id", &["acc_out"], &["scan"], vec![]),
    ];
    let mut inits = vec![];
    match stop_at {
        Some(n) => {
            nodes.push(node("Add", "inc", &["i", "one"], &["next"], vec![]));
            nodes.push(node("Less", "lt", &["next", "stop"], &["c_out"], vec![]));
            inits.push(i64_init("one", &[1]));
            inits.push(i64_init("stop", &[n]));
        }
        None => nodes.push(node("Identity", "c", &["c"], &["c_out"], vec![])),
    }
    GraphProto {
        node: nodes,
        name: "body".into(),
        initializer: inits,
        input: vec![vi("i", 7, &[]), vi("c", 9, &[]), vi("acc", 1, &["3"])],
        output: vec![
            vi("c_out", 9, &[]),
            vi("acc_out", 1, &["3"]),
            vi("scan", 1, &["3"]),
        ],
        value_info: vec![],
    }
}

fn loop_model(
    ins: &[&str],
    b: GraphProto,
    inits: Vec<TensorProto>,
    extra: &[ValueInfoProto],
) -> Vec<u8> {
    let mut inputs = vec![vi("x", 1, &["5", "3"]), vi("acc0", 1, &["3"])];
    inputs.extend(extra.iter().cloned());
    model(
        13,
        vec![node(
            "Loop",
            "loop",
            ins,
            &["acc", "rows"],
            vec![graph_attr("body", b)],
        )],
        inputs,
        inits,
        &["acc", "rows"],
    )
}

#[test]
fn a_loop_with_a_known_trip_count_unrolls_and_stacks_its_scan_outputs() {
    let b = loop_model(
        &["m", "", "acc0"],
        body(None),
        vec![TensorProto {
            name: "m".into(),
            dims: vec![],
            data_type: 7,
            raw_data: 3i64.to_le_bytes().to_vec(),
            ..Default::default()
        }],
        &[],
    );
    let m = import(&b);
    let t = text(&m);
    assert_eq!(t.matches("R.add(").count(), 3, "{t}");
    assert_eq!(
        ret_type(&m),
        Type::Tuple(vec![
            Type::tensor(&[3], DType::F32),
            Type::tensor(&[3, 3], DType::F32)
        ])
    );
    // No trip count: the body's own condition (i + 1 < 2) stops it after two iterations.
    let m = import(&loop_model(&["", "", "acc0"], body(Some(2)), vec![], &[]));
    assert_eq!(text(&m).matches("R.add(").count(), 2);
    // A trip count of 0 with a scan output asked for, a run-time condition, and no bound at
    // all are errors naming the node.
    let zero = loop_model(
        &["z", "", "acc0"],
        body(None),
        vec![i64_init("z", &[0])],
        &[],
    );
    let e = import_err(&zero);
    assert!(
        e.contains("`loop` (Loop)") && e.contains("runs zero times"),
        "{e}"
    );
    let runtime = loop_model(&["", "c", "acc0"], body(None), vec![], &[vi("c", 9, &[])]);
    let e = import_err(&runtime);
    assert!(e.contains("condition `c` is computed at run time"), "{e}");
    // A body that never stops (and reads no row of x, which would run out first).
    let mut forever = body(None);
    forever.node[0] = node("Identity", "g", &["acc"], &["row"], vec![]);
    let endless = loop_model(&["", "t", "acc0"], forever, vec![bool_init("t", true)], &[]);
    let e = import_err(&endless);
    assert!(e.contains("more than 4096 iterations"), "{e}");
}

#[test]
fn float_scalar_arithmetic_folds_at_import() {
    // ONNX's expanded Range: n = Cast<int64>(Relu(Ceil((limit − start) / delta))), all known.
    let f = |name: &str, v: f32| f32_init(name, &[], &[v]);
    let b = model(
        13,
        vec![
            node("Sub", "s", &["limit", "start"], &["d"], vec![]),
            node("Div", "q", &["d", "delta"], &["r"], vec![]),
            node("Ceil", "c", &["r"], &["n"], vec![]),
            node("Relu", "p", &["n"], &["np"], vec![]),
            node("Cast", "k", &["np"], &["count"], vec![ai("to", 7)]),
            node("Range", "rg", &["zero", "count", "one"], &["y"], vec![]),
        ],
        vec![],
        vec![
            f("start", 1.0),
            f("limit", 5.5),
            f("delta", 2.0),
            i64_init("zero", &[0]),
            i64_init("one", &[1]),
        ],
        &["y"],
    );
    // Range needs its bounds at import: (5.5 − 1) / 2 = 2.25 → 3.
    let m = import(&b);
    assert_eq!(ret_type(&m), Type::tensor(&[3], DType::I64));
    assert!(!text(&m).contains("R.ceil"), "{}", text(&m));
}
