//! The indexing family's imports: Pad across opsets, CumSum, Trilu, GatherND, OneHot, Range,
//! DepthToSpace, and TensorScatter as one `scatter_elements`.

use super::*;

#[test]
fn index_family_imports() {
    // Pad before opset 11 (attributes) and from 18 (axes input, negative), edge → replicate.
    let b = model(
        10,
        vec![node(
            "Pad",
            "p",
            &["x"],
            &["y"],
            vec![ais("pads", &[0, 1, 0, 2]), astr("mode", "reflect")],
        )],
        vec![vi("x", 1, &["n", "4"])],
        vec![],
        &["y"],
    );
    let t = text(&import(&b));
    assert!(
        t.contains("y: R.Tensor((n, 7), dtype=\"float32\") = R.nn.pad(x, pad_width=[0, 0, 1, 2], pad_value=0.0, pad_mode=\"reflect\")"),
        "{t}"
    );
    let b = model(
        18,
        vec![node(
            "Pad",
            "p",
            &["x", "pads", "", "axes"],
            &["y"],
            vec![astr("mode", "edge")],
        )],
        vec![vi("x", 1, &["2", "4"])],
        vec![i64_init("pads", &[1, 3]), i64_init("axes", &[-1])],
        &["y"],
    );
    let t = text(&import(&b));
    assert!(
        t.contains("R.nn.pad(x, pad_width=[0, 0, 1, 3], pad_value=0.0, pad_mode=\"replicate\")"),
        "{t}"
    );
    // CumSum with reverse: flipped in and out.
    let b = model(
        14,
        vec![node(
            "CumSum",
            "c",
            &["x", "ax"],
            &["y"],
            vec![ai("reverse", 1), ai("exclusive", 1)],
        )],
        vec![vi("x", 1, &["3", "5"])],
        vec![scalar_init("ax", 7, 1i64.to_le_bytes().to_vec())],
        &["y"],
    );
    let t = text(&import(&b));
    assert!(
        t.contains(
            "R.strided_slice(x, axes=[1], begin=[-1], end=[-6], strides=[-1], assume_inbound=False)"
        ),
        "{t}"
    );
    assert!(
        t.contains("R.cumsum(lv, axis=1, dtype=None, exclusive=True)"),
        "{t}"
    );
    // Trilu with k, GatherND, OneHot with constant values.
    let b = model(
        14,
        vec![
            node("Trilu", "t", &["x", "k"], &["a"], vec![ai("upper", 0)]),
            node(
                "GatherND",
                "g",
                &["a", "i"],
                &["b"],
                vec![ai("batch_dims", 0)],
            ),
            node(
                "OneHot",
                "o",
                &["i", "depth", "vals"],
                &["c"],
                vec![ai("axis", 0)],
            ),
        ],
        vec![vi("x", 1, &["3", "5"]), vi("i", 7, &["4", "2"])],
        vec![
            scalar_init("k", 7, (-1i64).to_le_bytes().to_vec()),
            scalar_init("depth", 7, 6i64.to_le_bytes().to_vec()),
            f32_init("vals", &[2], &[0.5, 2.0]),
        ],
        &["b", "c"],
    );
    let t = text(&import(&b));
    assert!(
        t.contains("a: R.Tensor((3, 5), dtype=\"float32\") = R.tril(x, k=-1)"),
        "{t}"
    );
    assert!(
        t.contains("b: R.Tensor((4,), dtype=\"float32\") = R.gather_nd(a, i, batch_dims=0)"),
        "{t}"
    );
    assert!(t.contains("c: R.Tensor((6, 4, 2), dtype=\"float32\") = R.one_hot(i, R.const(2.0, \"float32\"), R.const(0.5, \"float32\"), depth=6, axis=0)"), "{t}");
    // Range: a float range becomes arange, a small integer one a constant.
    let f = |v: f32| v.to_le_bytes().to_vec();
    let b = model(
        14,
        vec![node("Range", "r", &["s", "l", "d"], &["y"], vec![])],
        vec![],
        vec![
            scalar_init("s", 1, f(1.0)),
            scalar_init("l", 1, f(2.0)),
            scalar_init("d", 1, f(0.25)),
        ],
        &["y"],
    );
    let t = text(&import(&b));
    assert!(t.contains("y: R.Tensor((4,), dtype=\"float32\") = R.arange(start=1.0, end=2.0, step=0.25, dtype=\"float32\")"), "{t}");
    let i = |v: i64| v.to_le_bytes().to_vec();
    let b = model(
        14,
        vec![node("Range", "r", &["s", "l", "d"], &["y"], vec![])],
        vec![],
        vec![
            scalar_init("s", 7, i(5)),
            scalar_init("l", 7, i(-1)),
            scalar_init("d", 7, i(-2)),
        ],
        &["y"],
    );
    let m = import(&b);
    assert_eq!(ret_type(&m), Type::tensor(&[3], DType::I64));
    // Range over run-time values is a clear error.
    let b = model(
        14,
        vec![node("Range", "dyn_range", &["x", "x", "x"], &["y"], vec![])],
        vec![vi("x", 7, &[])],
        vec![],
        &["y"],
    );
    let e = import_onnx(&b, "t.onnx").unwrap_err().to_string();
    assert!(
        e.contains("`dyn_range` (Range)") && e.contains("run time"),
        "{e}"
    );
    // DepthToSpace (DCR): reshape, permute, reshape.
    let b = model(
        13,
        vec![node(
            "DepthToSpace",
            "d",
            &["x"],
            &["y"],
            vec![ai("blocksize", 2)],
        )],
        vec![vi("x", 1, &["1", "8", "3", "3"])],
        vec![],
        &["y"],
    );
    let m = import(&b);
    assert_eq!(ret_type(&m), Type::tensor(&[1, 2, 6, 6], DType::F32));
    let t = text(&m);
    assert!(
        t.contains("R.permute_dims(lv, axes=[0, 3, 4, 1, 5, 2])"),
        "{t}"
    );
    let b = model(
        13,
        vec![node(
            "DepthToSpace",
            "d",
            &["x"],
            &["y"],
            vec![ai("blocksize", 3)],
        )],
        vec![vi("x", 1, &["1", "8", "3", "3"])],
        vec![],
        &["y"],
    );
    let e = import_onnx(&b, "t.onnx").unwrap_err().to_string();
    assert!(e.contains("not a multiple of blocksize"), "{e}");
}

#[test]
fn tensor_scatter_is_one_scatter_elements() {
    let b = model(
        24,
        vec![node(
            "TensorScatter",
            "kv",
            &["past", "upd", "w"],
            &["y"],
            vec![astr("mode", "circular")],
        )],
        vec![
            vi("past", 1, &["b", "2", "8", "4"]),
            vi("upd", 1, &["b", "2", "3", "4"]),
            vi("w", 7, &["b"]),
        ],
        vec![],
        &["y"],
    );
    let t = text(&import(&b));
    for want in [
        "R.arange(start=0, end=3, step=1, dtype=\"int64\")",
        "lv2: R.Tensor((b, 3), dtype=\"int64\") = R.add(lv1, lv)",
        "lv4: R.Tensor((b, 3), dtype=\"int64\") = R.take(lv3, lv2, axis=0, mode=\"wrap\")",
        "R.broadcast_to(lv5, R.shape([b, 2, 3, 4]))",
        "y: R.Tensor((b, 2, 8, 4), dtype=\"float32\") = R.scatter_elements(past, lv6, upd, axis=2, reduction=\"update\")",
    ] {
        assert!(t.contains(want), "missing {want:?} in\n{t}");
    }
    let b = model(
        24,
        vec![node(
            "TensorScatter",
            "kv",
            &["past", "upd"],
            &["y"],
            vec![ai("axis", 0)],
        )],
        vec![vi("past", 1, &["2", "8"]), vi("upd", 1, &["2", "3"])],
        vec![],
        &["y"],
    );
    let e = import_onnx(&b, "t.onnx").unwrap_err().to_string();
    assert!(e.contains("batch axis"), "{e}");
}
