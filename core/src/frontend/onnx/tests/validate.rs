//! Importer tests of the model checks onnxruntime makes (issue 18): each malformed model is an
//! error naming the file, the node and what was expected, never a silent import.

use super::*;

fn import_err(bytes: &[u8]) -> String {
    match import_onnx(bytes, "t.onnx") {
        Ok(m) => panic!("expected an error, got\n{}", text(&m)),
        Err(e) => e.to_string(),
    }
}

fn has(e: &str, parts: &[&str]) {
    for p in parts {
        assert!(e.contains(p), "`{p}` not in: {e}");
    }
}

fn split_model(sizes: &[i64], opset: i64) -> Vec<u8> {
    let (ins, attrs, inits): (Vec<&str>, _, _) = if opset >= 13 {
        (vec!["x", "s"], vec![], vec![i64_init("s", sizes)])
    } else {
        (vec!["x"], vec![ais("split", sizes)], vec![])
    };
    model(
        opset,
        vec![node("Split", "sp", &ins, &["a", "b"], attrs)],
        vec![vi("x", 1, &["3"])],
        inits,
        &["a", "b"],
    )
}

#[test]
fn split_sizes_must_add_up_and_be_non_negative() {
    for opset in [11, 13] {
        let e = import_err(&split_model(&[5, -2], opset));
        has(&e, &["t.onnx", "node `sp` (Split)", "negative size -2"]);
        let e = import_err(&split_model(&[1, 1], opset));
        has(
            &e,
            &[
                "node `sp` (Split)",
                "do not add up to the extent 3 of axis 0",
            ],
        );
        let e = import_err(&split_model(&[3], opset));
        has(
            &e,
            &[
                "node `sp` (Split)",
                "has 1 sizes [3] but the node has 2 outputs",
            ],
        );
        import(&split_model(&[1, 2], opset));
    }
}

#[test]
fn undefined_inputs_are_refused_even_when_unused() {
    // Dropout (opset 12+) never reads an undefined `ratio` when it is given as a name: the
    // check does not depend on the converter.
    let b = model(
        13,
        vec![node("Dropout", "d", &["x", "ratio"], &["y"], vec![])],
        vec![vi("x", 1, &["2"])],
        vec![],
        &["y"],
    );
    let e = import_err(&b);
    has(
        &e,
        &[
            "t.onnx: node `d` (Dropout): input `ratio` is not defined",
            "graph input, an initializer or an output of an earlier node",
        ],
    );
    // Defined later is not defined: nodes must be in topological order.
    let b = model(
        13,
        vec![
            node("Relu", "r1", &["h"], &["y"], vec![]),
            node("Relu", "r2", &["x"], &["h"], vec![]),
        ],
        vec![vi("x", 1, &["2"])],
        vec![],
        &["y"],
    );
    has(
        &import_err(&b),
        &["node `r1` (Relu): input `h` is not defined"],
    );
    // An empty name is an omitted optional input.
    let b = model(
        13,
        vec![node("Clip", "c", &["x", "", "hi"], &["y"], vec![])],
        vec![vi("x", 1, &["2"])],
        vec![f32_init("hi", &[], &[1.0])],
        &["y"],
    );
    import(&b);
}

#[test]
fn a_value_is_written_once() {
    let b = model(
        13,
        vec![
            node("Relu", "r", &["x"], &["y"], vec![]),
            node("Neg", "n", &["x"], &["y"], vec![]),
        ],
        vec![vi("x", 1, &["2"])],
        vec![],
        &["y"],
    );
    has(
        &import_err(&b),
        &["t.onnx: node `n` (Neg): output `y` is already written by node `r` (Relu)"],
    );
    // Shadowing a graph input or an initializer.
    let b = model(
        13,
        vec![node("Relu", "r", &["x"], &["x"], vec![])],
        vec![vi("x", 1, &["2"])],
        vec![],
        &["x"],
    );
    has(
        &import_err(&b),
        &["node `r` (Relu): output `x` shadows a graph input"],
    );
    let b = model(
        13,
        vec![node("Relu", "r", &["x"], &["w"], vec![])],
        vec![vi("x", 1, &["2"])],
        vec![f32_init("w", &[2], &[1.0, 2.0])],
        &["w"],
    );
    has(
        &import_err(&b),
        &["node `r` (Relu): output `w` shadows an initializer"],
    );
    // One node listing an output twice.
    let b = model(
        13,
        vec![node("Split", "sp", &["x"], &["a", "a"], vec![])],
        vec![vi("x", 1, &["2"])],
        vec![],
        &["a"],
    );
    has(
        &import_err(&b),
        &["node `sp` (Split): output `a` is listed twice"],
    );
}

#[test]
fn duplicate_initializers_are_refused() {
    let b = model(
        13,
        vec![node("Add", "a", &["x", "w"], &["y"], vec![])],
        vec![vi("x", 1, &["2"])],
        vec![
            f32_init("w", &[2], &[1.0, 2.0]),
            f32_init("w", &[2], &[3.0, 4.0]),
        ],
        &["y"],
    );
    has(
        &import_err(&b),
        &["t.onnx: initializer `w` is defined twice"],
    );
}

#[test]
fn opsets_outside_the_supported_range_are_refused() {
    let relu = |opset| {
        model(
            opset,
            vec![node("Relu", "r", &["x"], &["y"], vec![])],
            vec![vi("x", 1, &["2"])],
            vec![],
            &["y"],
        )
    };
    for bad in [0, -1, 99] {
        has(
            &import_err(&relu(bad)),
            &[
                "t.onnx: opset_import",
                &format!("has opset {bad}; fusebox imports opsets 1 to 28"),
            ],
        );
    }
    for good in [1, 13, MAX_OPSET] {
        import(&relu(good));
    }
}

#[test]
fn attribute_values_must_match_their_declared_type() {
    let gelu = |attr: AttributeProto| {
        model(
            13,
            vec![node("Flatten", "f", &["x"], &["y"], vec![attr])],
            vec![vi("x", 1, &["2", "3"])],
            vec![],
            &["y"],
        )
    };
    // INT with `f` set instead of `i`.
    let a = AttributeProto {
        name: "axis".into(),
        f: 1.0,
        r#type: 2,
        ..Default::default()
    };
    has(
        &import_err(&gelu(a)),
        &[
            "t.onnx: node `f` (Flatten): attribute `axis` is declared INT (2) (field `i`) but sets `f`",
        ],
    );
    // INT with `ints` set.
    let a = AttributeProto {
        name: "axis".into(),
        ints: vec![1],
        r#type: 2,
        ..Default::default()
    };
    has(
        &import_err(&gelu(a)),
        &["attribute `axis` is declared INT (2) (field `i`) but sets `ints`"],
    );
    // INTS holding a float.
    let a = AttributeProto {
        name: "axis".into(),
        f: 2.0,
        ints: vec![1],
        r#type: 7,
        ..Default::default()
    };
    has(
        &import_err(&gelu(a)),
        &["declared INTS (7) (field `ints`) but sets `f`"],
    );
    // Right: INT with `i`, and no type at all (very old exporters).
    import(&gelu(ai("axis", 1)));
    import(&gelu(AttributeProto {
        name: "axis".into(),
        i: 1,
        ..Default::default()
    }));
}

#[test]
fn attribute_names_must_be_declared_by_the_schema_and_unique() {
    let flatten = |attrs: Vec<AttributeProto>| {
        model(
            13,
            vec![node("Flatten", "f", &["x"], &["y"], attrs)],
            vec![vi("x", 1, &["2", "3"])],
            vec![],
            &["y"],
        )
    };
    // A misspelt name: refused with the names the schema declares.
    has(
        &import_err(&flatten(vec![ai("axes", 1)])),
        &["t.onnx: node `f` (Flatten): unknown attribute `axes`; Flatten's attributes are axis"],
    );
    // An operator without attributes.
    let sin = |attrs: Vec<AttributeProto>| {
        model(
            13,
            vec![node("Sin", "r", &["x"], &["y"], attrs)],
            vec![vi("x", 1, &["2"])],
            vec![],
            &["y"],
        )
    };
    has(
        &import_err(&sin(vec![ai("alpha", 1)])),
        &["node `r` (Sin): unknown attribute `alpha`; Sin takes no attributes"],
    );
    // A name given twice.
    has(
        &import_err(&flatten(vec![ai("axis", 1), ai("axis", 0)])),
        &["node `f` (Flatten): attribute `axis` is given twice"],
    );
    // Known: the declared name, and one only an older version of the schema declares (Relu-1's
    // `consumed_inputs`, which the converters ignore), used in a newer opset.
    import(&flatten(vec![ai("axis", 1)]));
    import(&model(
        13,
        vec![node(
            "Relu",
            "r",
            &["x"],
            &["y"],
            vec![ais("consumed_inputs", &[0])],
        )],
        vec![vi("x", 1, &["2"])],
        vec![],
        &["y"],
    ));
    // Another domain's operator is not checked here (its converter reports it).
    let mut custom = node("Relu", "c", &["x"], &["y"], vec![ai("alpha", 1)]);
    custom.domain = "com.example".into();
    let e = import_err(&model(
        13,
        vec![custom],
        vec![vi("x", 1, &["2"])],
        vec![],
        &["y"],
    ));
    assert!(!e.contains("unknown attribute"), "{e}");
}

#[test]
fn the_schema_table_is_sorted_for_its_binary_searches() {
    let table = super::super::schema_attrs::SCHEMA_ATTRS;
    assert!(table.len() > 150, "{} operators", table.len());
    for w in table.windows(2) {
        assert!(w[0].0 < w[1].0, "{} before {}", w[0].0, w[1].0);
    }
    for (op, names) in table {
        assert!(names.windows(2).all(|w| w[0] < w[1]), "{op}: {names:?}");
    }
    // Spot checks against the ONNX operator docs.
    let get = |op: &str| table.iter().find(|(o, _)| *o == op).map(|(_, n)| *n);
    assert_eq!(
        get("GridSample"),
        Some(&["align_corners", "mode", "padding_mode"][..])
    );
    assert_eq!(get("Sin"), Some(&[][..]));
    assert!(get("Conv").is_some_and(|n| n.contains(&"dilations") && n.contains(&"group")));
}

#[test]
fn a_repeated_name_among_many_attributes_or_outputs_is_found() {
    // 200,000 distinct unknown names, then a repeat of the first: refused for the repeat
    // (uniqueness is checked first, through a set; a scan of the earlier names per attribute
    // would make this 2·10¹⁰ comparisons). Likewise a node's outputs.
    let mut attrs: Vec<AttributeProto> = (0..200_000).map(|i| ai(&format!("a{i}"), 1)).collect();
    attrs.push(ai("a0", 2));
    let m = model(
        13,
        vec![node("Flatten", "f", &["x"], &["y"], attrs)],
        vec![vi("x", 1, &["2", "3"])],
        vec![],
        &["y"],
    );
    has(&import_err(&m), &["attribute `a0` is given twice"]);
    // The same for a node's outputs.
    let mut outs: Vec<String> = (0..200_000).map(|i| format!("o{i}")).collect();
    outs.push("o0".into());
    let outs: Vec<&str> = outs.iter().map(String::as_str).collect();
    let m = model(
        13,
        vec![node("Split", "sp", &["x"], &outs, vec![])],
        vec![vi("x", 1, &["3"])],
        vec![],
        &["o1"],
    );
    has(
        &import_err(&m),
        &["output `o0` is listed twice by this node"],
    );
}

fn conv_model(op: &str, kernel: &[i64]) -> Vec<u8> {
    let w: Vec<f32> = vec![0.5; 18];
    model(
        13,
        vec![node(
            op,
            "c",
            &["x", "w"],
            &["y"],
            vec![ais("kernel_shape", kernel)],
        )],
        vec![vi("x", 1, &["1", "2", "5", "5"])],
        vec![f32_init("w", &[2, 1, 3, 3], &w)],
        &["y"],
    )
}

#[test]
fn kernel_shape_must_agree_with_the_weight() {
    for op in ["Conv", "ConvTranspose"] {
        for bad in [&[2, 2][..], &[3][..], &[3, 3, 3][..]] {
            let e = import_err(&conv_model(op, bad));
            has(
                &e,
                &[
                    &format!("t.onnx: node `c` ({op})"),
                    &format!("`kernel_shape` {bad:?} contradicts the weight"),
                    "expected its spatial extents [3, 3]",
                ],
            );
        }
    }
    // Conv with the weight's layout [out, in/group, k, k] = [2, 1, 3, 3] needs 2 groups for x's 2
    // channels; ConvTranspose's [in, out/group, k, k] takes it as is.
    let ok = model(
        13,
        vec![node(
            "Conv",
            "c",
            &["x", "w"],
            &["y"],
            vec![ais("kernel_shape", &[3, 3]), ai("group", 2)],
        )],
        vec![vi("x", 1, &["1", "2", "5", "5"])],
        vec![f32_init("w", &[2, 1, 3, 3], &[0.5; 18])],
        &["y"],
    );
    import(&ok);
    import(&conv_model("ConvTranspose", &[3, 3]));
}

#[test]
fn int64_folding_overflow_is_named_as_such() {
    let shape_math = |op: &str, a: i64, b: i64| {
        model(
            13,
            vec![
                node(op, "m", &["p", "q"], &["t"], vec![]),
                node("Reshape", "r", &["x", "t"], &["y"], vec![]),
            ],
            vec![vi("x", 1, &["4"])],
            vec![i64_init("p", &[a]), i64_init("q", &[b])],
            &["y"],
        )
    };
    let e = import_err(&shape_math("Mul", 1 << 62, 4));
    has(
        &e,
        &[
            "t.onnx: node `m` (Mul)",
            "int64 overflow: 4611686018427387904 * 4 does not fit in int64",
        ],
    );
    assert!(!e.contains("symbolic"), "{e}");
    let e = import_err(&shape_math("Add", i64::MAX, 1));
    has(
        &e,
        &[
            "node `m` (Add)",
            "9223372036854775807 + 1 does not fit in int64",
        ],
    );
    let e = import_err(&shape_math("Sub", i64::MIN, 1));
    has(
        &e,
        &["node `m` (Sub)", "-9223372036854775808 - 1 does not fit"],
    );
    let e = import_err(&shape_math("Div", i64::MIN, -1));
    has(
        &e,
        &["node `m` (Div)", "-9223372036854775808 / -1 does not fit"],
    );
    let b = model(
        13,
        vec![
            node("Neg", "n", &["p"], &["t"], vec![]),
            node("Reshape", "r", &["x", "t"], &["y"], vec![]),
        ],
        vec![vi("x", 1, &["4"])],
        vec![i64_init("p", &[i64::MIN])],
        &["y"],
    );
    has(
        &import_err(&b),
        &["node `n` (Neg)", "0 - -9223372036854775808 does not fit"],
    );
    // In range still folds.
    import(&shape_math("Mul", 2, 2));
}

fn one(op: &str, ins: &[&str], attrs: Vec<AttributeProto>, inits: Vec<TensorProto>) -> Vec<u8> {
    model(
        13,
        vec![node(op, "n", ins, &["y"], attrs)],
        vec![vi("x", 1, &["2", "3"])],
        inits,
        &["y"],
    )
}

#[test]
fn constant_gather_indices_must_be_in_range() {
    for bad in [3, -4, 7] {
        let b = one(
            "Gather",
            &["x", "i"],
            vec![ai("axis", 1)],
            vec![i64_init("i", &[0, bad])],
        );
        has(
            &import_err(&b),
            &[
                "t.onnx: node `n` (Gather)",
                &format!("index {bad} (element 1 of `i`) is out of range for axis 1 of extent 3"),
                "expected -3 to 2",
            ],
        );
    }
    import(&one(
        "Gather",
        &["x", "i"],
        vec![ai("axis", 1)],
        vec![i64_init("i", &[-3, 2])],
    ));
}

#[test]
fn tile_needs_one_repeat_per_axis() {
    let b = one("Tile", &["x", "r"], vec![], vec![i64_init("r", &[2])]);
    has(
        &import_err(&b),
        &[
            "node `n` (Tile)",
            "`repeats` [2] has 1 values; expected one per axis of the rank-2",
        ],
    );
    let b = one("Tile", &["x", "r"], vec![], vec![i64_init("r", &[1, -1])]);
    has(&import_err(&b), &["node `n` (Tile)", "negative repeat -1"]);
    import(&one(
        "Tile",
        &["x", "r"],
        vec![],
        vec![i64_init("r", &[1, 2])],
    ));
}
