//! Importer tests on small ONNX models built in Rust and encoded with prost.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failure is a panic"
)]

use super::proto::*;
use super::*;
use crate::text::print_module;

fn vi(name: &str, elem: i32, dims: &[&str]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: elem,
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|d| match d.parse::<i64>() {
                            Ok(v) => Dimension {
                                dim_value: Some(v),
                                dim_param: None,
                            },
                            Err(_) => Dimension {
                                dim_value: None,
                                dim_param: Some(d.to_string()),
                            },
                        })
                        .collect(),
                }),
            }),
        }),
    }
}

fn out(name: &str) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: None,
    }
}

fn node(
    op: &str,
    name: &str,
    ins: &[&str],
    outs: &[&str],
    attrs: Vec<AttributeProto>,
) -> NodeProto {
    NodeProto {
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        name: name.into(),
        op_type: op.into(),
        attribute: attrs,
        domain: String::new(),
    }
}

fn ai(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        i,
        r#type: 2,
        ..Default::default()
    }
}

fn af(name: &str, f: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        f,
        r#type: 1,
        ..Default::default()
    }
}

fn ais(name: &str, ints: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        ints: ints.to_vec(),
        r#type: 7,
        ..Default::default()
    }
}

fn f32_init(name: &str, dims: &[i64], v: &[f32]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: 1,
        float_data: v.to_vec(),
        ..Default::default()
    }
}

fn i64_init(name: &str, v: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: vec![v.len() as i64],
        data_type: 7,
        raw_data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ..Default::default()
    }
}

fn model(
    opset: i64,
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    inits: Vec<TensorProto>,
    outputs: &[&str],
) -> Vec<u8> {
    ModelProto {
        ir_version: 8,
        producer_name: "test".into(),
        graph: Some(GraphProto {
            node: nodes,
            name: "g".into(),
            initializer: inits,
            input: inputs,
            output: outputs.iter().map(|o| out(o)).collect(),
            value_info: vec![],
        }),
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: opset,
        }],
    }
    .encode_to_vec()
}

fn import(bytes: &[u8]) -> Module {
    import_onnx(bytes, "t.onnx").unwrap_or_else(|e| panic!("{e}"))
}

/// Each model of `cases` fails to import with an error naming the node `at` (`node `x` (Op)`)
/// and holding its expected text.
fn assert_errors(cases: Vec<(Vec<u8>, &str)>, at: &str) {
    for (b, want) in cases {
        let e = import_onnx(&b, "t.onnx")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains(at) && e.contains(want), "want {want:?}: {e}");
    }
}

fn text(m: &Module) -> String {
    print_module(m).text
}

fn ret_type(m: &Module) -> Type {
    m.get("main").unwrap().ret_ty.clone()
}

#[test]
fn matmul_relu_with_symbolic_batch() {
    let b = model(
        13,
        vec![
            node("MatMul", "mm", &["x", "w"], &["h"], vec![]),
            node("Relu", "r", &["h"], &["y.out"], vec![]),
        ],
        vec![vi("x", 1, &["batch size", "4"])],
        vec![f32_init("w", &[4, 8], &[0.5; 32])],
        &["y.out"],
    );
    let m = import(&b);
    let t = text(&m);
    assert!(t.contains("batch_size = T.int64()"), "{t}");
    assert!(t.contains("y_out: R.Tensor((batch_size, 8)"), "{t}");
    assert_eq!(output_names(m.get("main").unwrap()), vec!["y_out"]);
}

#[test]
fn gemm_transposes_and_scales() {
    let b = model(
        11,
        vec![node(
            "Gemm",
            "g",
            &["a", "b", "c"],
            &["y"],
            vec![ai("transB", 1), af("alpha", 0.5), af("beta", 2.0)],
        )],
        vec![vi("a", 1, &["2", "3"])],
        vec![
            f32_init("b", &[4, 3], &[1.0; 12]),
            f32_init("c", &[4], &[1.0; 4]),
        ],
        &["y"],
    );
    let t = text(&import(&b));
    for op in ["R.permute_dims", "R.matmul", "R.multiply", "R.add"] {
        assert!(t.contains(op), "{op} missing in {t}");
    }
}

#[test]
fn reshape_from_folded_shape_chain_keeps_symbolic_dims() {
    // y = Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1]))
    let b = model(
        13,
        vec![
            node("Shape", "s", &["x"], &["s"], vec![]),
            node(
                "Constant",
                "c0",
                &[],
                &["zero"],
                vec![AttributeProto {
                    name: "value".into(),
                    t: Some(TensorProto {
                        dims: vec![],
                        data_type: 7,
                        int64_data: vec![0],
                        ..Default::default()
                    }),
                    r#type: 4,
                    ..Default::default()
                }],
            ),
            node("Gather", "g", &["s", "zero"], &["n"], vec![]),
            node("Unsqueeze", "u", &["n", "ax"], &["n1"], vec![]),
            node(
                "Concat",
                "c",
                &["n1", "minus1"],
                &["shape"],
                vec![ai("axis", 0)],
            ),
            node("Reshape", "r", &["x", "shape"], &["y"], vec![]),
        ],
        vec![vi("x", 1, &["n", "3", "4"])],
        vec![i64_init("ax", &[0]), i64_init("minus1", &[-1])],
        &["y"],
    );
    let m = import(&b);
    assert_eq!(
        ret_type(&m),
        Type::tensor_dims(vec![Dim::sym("n"), Dim::Static(12)], DType::F32)
    );
    // Only the reshape is left: the shape arithmetic was folded away.
    assert_eq!(m.get("main").unwrap().bindings().count(), 1, "{}", text(&m));
}

#[test]
fn constant_of_shape_folds() {
    let b = model(
        9,
        vec![
            node(
                "ConstantOfShape",
                "k",
                &["shp"],
                &["w"],
                vec![AttributeProto {
                    name: "value".into(),
                    t: Some(f32_init("", &[1], &[0.25])),
                    r#type: 4,
                    ..Default::default()
                }],
            ),
            node("Add", "a", &["x", "w"], &["y"], vec![]),
        ],
        vec![vi("x", 1, &["2", "3"])],
        vec![i64_init("shp", &[2, 3])],
        &["y"],
    );
    let m = import(&b);
    let f = m.get("main").unwrap();
    assert_eq!(f.params.len(), 1);
    assert_eq!(f.bindings().count(), 1);
}

#[test]
fn conv_pool_batchnorm_family() {
    let b = model(
        13,
        vec![
            node(
                "Conv",
                "conv",
                &["x", "w", "bias"],
                &["c"],
                vec![ais("pads", &[1, 1, 1, 1]), ais("strides", &[1, 1])],
            ),
            node(
                "BatchNormalization",
                "bn",
                &["c", "s", "bb", "m", "v"],
                &["b"],
                vec![],
            ),
            node(
                "MaxPool",
                "mp",
                &["b"],
                &["p"],
                vec![ais("kernel_shape", &[2, 2]), ais("strides", &[2, 2])],
            ),
            node(
                "AveragePool",
                "ap",
                &["p"],
                &["q"],
                vec![
                    ais("kernel_shape", &[3, 3]),
                    ai("count_include_pad", 1),
                    ais("pads", &[1, 1, 1, 1]),
                ],
            ),
            node("GlobalAveragePool", "gap", &["q"], &["g"], vec![]),
            node("Flatten", "fl", &["g"], &["y"], vec![]),
        ],
        vec![vi("x", 1, &["1", "3", "8", "8"])],
        vec![
            f32_init("w", &[4, 3, 3, 3], &[0.1; 108]),
            f32_init("bias", &[4], &[0.0; 4]),
            f32_init("s", &[4], &[1.0; 4]),
            f32_init("bb", &[4], &[0.0; 4]),
            f32_init("m", &[4], &[0.0; 4]),
            f32_init("v", &[4], &[1.0; 4]),
        ],
        &["y"],
    );
    let m = import(&b);
    assert_eq!(ret_type(&m), Type::tensor(&[1, 4], DType::F32));
    let t = text(&m);
    for op in [
        "conv2d",
        "batch_norm",
        "max_pool2d",
        "avg_pool2d",
        "adaptive_avg_pool2d",
    ] {
        assert!(t.contains(op), "{op} missing in {t}");
    }
}

#[test]
fn conv_same_upper_pads() {
    let b = model(
        11,
        vec![node(
            "Conv",
            "conv",
            &["x", "w"],
            &["y"],
            vec![
                AttributeProto {
                    name: "auto_pad".into(),
                    s: b"SAME_UPPER".to_vec(),
                    r#type: 3,
                    ..Default::default()
                },
                ais("strides", &[2, 2]),
            ],
        )],
        vec![vi("x", 1, &["1", "1", "5", "5"])],
        vec![f32_init("w", &[1, 1, 3, 3], &[1.0; 9])],
        &["y"],
    );
    assert_eq!(
        ret_type(&import(&b)),
        Type::tensor(&[1, 1, 3, 3], DType::F32)
    );
}

#[test]
fn softmax_before_13_flattens_and_split_slice_squeeze() {
    let b = model(
        11,
        vec![
            node("Softmax", "sm", &["x"], &["s"], vec![ai("axis", 1)]),
            node(
                "Split",
                "sp",
                &["s"],
                &["a", "b"],
                vec![ai("axis", 1), ais("split", &[1, 2])],
            ),
            node("Slice", "sl", &["b", "st", "en", "axs"], &["c"], vec![]),
            node("Squeeze", "sq", &["a"], &["d"], vec![ais("axes", &[1])]),
            node("Unsqueeze", "us", &["d"], &["e"], vec![ais("axes", &[-1])]),
            node(
                "ReduceMean",
                "rm",
                &["c"],
                &["f"],
                vec![ais("axes", &[2]), ai("keepdims", 0)],
            ),
        ],
        vec![vi("x", 1, &["2", "3", "4"])],
        vec![
            i64_init("st", &[1]),
            i64_init("en", &[i64::MAX]),
            i64_init("axs", &[2]),
        ],
        &["e", "f"],
    );
    let m = import(&b);
    assert_eq!(
        ret_type(&m),
        Type::Tuple(vec![
            Type::tensor(&[2, 4, 1], DType::F32),
            Type::tensor(&[2, 2], DType::F32),
        ])
    );
    assert_eq!(output_names(m.get("main").unwrap()), vec!["e", "f"]);
}

#[test]
fn elementwise_family_and_layer_norm() {
    let b = model(
        17,
        vec![
            node("LeakyRelu", "lr", &["x"], &["a"], vec![af("alpha", 0.1)]),
            node("Clip", "cl", &["a", "lo", ""], &["b"], vec![]),
            node("Pow", "pw", &["b", "two"], &["c"], vec![]),
            node("Sqrt", "sq", &["c"], &["d"], vec![]),
            node("Erf", "er", &["d"], &["e"], vec![]),
            node("Sum", "su", &["e", "x", "d"], &["f"], vec![]),
            node(
                "LayerNormalization",
                "ln",
                &["f", "g"],
                &["y"],
                vec![ai("axis", -1)],
            ),
            node("Transpose", "t", &["y"], &["z"], vec![ais("perm", &[1, 0])]),
        ],
        vec![vi("x", 1, &["2", "3"])],
        vec![
            f32_init("lo", &[], &[-0.5]),
            f32_init("two", &[], &[2.0]),
            f32_init("g", &[3], &[1.0; 3]),
        ],
        &["z"],
    );
    let m = import(&b);
    assert_eq!(ret_type(&m), Type::tensor(&[3, 2], DType::F32));
    assert!(text(&m).contains("R.nn.layer_norm"));
}

#[test]
fn unsupported_ops_are_listed_in_one_error() {
    let b = model(
        13,
        vec![
            node("Relu", "ok", &["x"], &["a"], vec![]),
            node("Foo", "first_bad", &["a"], &["b"], vec![]),
            node("ImageDecoder", "second_bad", &["b"], &["y"], vec![]),
        ],
        vec![vi("x", 1, &["2"])],
        vec![],
        &["y"],
    );
    let e = import_onnx(&b, "t.onnx").unwrap_err().to_string();
    assert!(e.contains("2 unsupported ONNX node(s)"), "{e}");
    assert!(e.contains("`first_bad` (Foo)"), "{e}");
    assert!(e.contains("`second_bad` (ImageDecoder)"), "{e}");
}

#[test]
fn errors_not_panics() {
    // Garbage bytes.
    assert!(import_onnx(&[0xff, 0xff, 0xff, 0x01], "x.onnx").is_err());
    // An undefined input.
    let b = model(
        13,
        vec![node("Relu", "r", &["nope"], &["y"], vec![])],
        vec![vi("x", 1, &["2"])],
        vec![],
        &["y"],
    );
    let e = import_onnx(&b, "t.onnx").unwrap_err().to_string();
    assert!(e.contains("`nope` is not defined"), "{e}");
    // A shape error.
    let b = model(
        13,
        vec![node("MatMul", "mm", &["x", "x"], &["y"], vec![])],
        vec![vi("x", 1, &["2", "3"])],
        vec![],
        &["y"],
    );
    let e = import_onnx(&b, "t.onnx").unwrap_err().to_string();
    assert!(e.contains("node `mm` (MatMul)"), "{e}");
    // A data/shape mismatch in an initializer.
    let b = model(
        13,
        vec![node("Add", "a", &["x", "w"], &["y"], vec![])],
        vec![vi("x", 1, &["2"])],
        vec![f32_init("w", &[3], &[1.0])],
        &["y"],
    );
    assert!(import_onnx(&b, "t.onnx").is_err());
}

#[test]
fn sanitize_makes_identifiers() {
    assert_eq!(sanitize("input.1"), "input_1");
    assert_eq!(sanitize("0"), "v0");
    assert_eq!(sanitize("gpu_0/data_0"), "gpu_0_data_0");
    assert_eq!(sanitize(""), "v");
}

#[test]
fn value_dependent_extents_are_fresh_symbols_on_the_annotation() {
    // NonZero's column count is only known at run time: a fresh dim on the binding's
    // annotation, which the ops downstream keep.
    let b = model(
        13,
        vec![
            node("NonZero", "nz", &["x"], &["i"], vec![]),
            node("Transpose", "t", &["i"], &["y"], vec![]),
        ],
        vec![vi("x", 1, &["4", "3"])],
        vec![],
        &["y"],
    );
    let m = import(&b);
    let t = text(&m);
    assert!(
        t.contains("i_value: R.Tensor(dtype=\"int64\", ndim=2) = R.nonzero(x)"),
        "{t}"
    );
    assert!(
        t.contains("i: R.Tensor((2, nonzero), dtype=\"int64\") = R.match_cast(i_value, R.Tensor((2, nonzero), dtype=\"int64\"))"),
        "{t}"
    );
    // Callers see the rank only: `nonzero` is not defined by the parameters.
    assert!(t.contains("-> R.Tensor(dtype=\"int64\", ndim=2):"), "{t}");
    assert!(
        t.contains("R.Tensor((nonzero, 2), dtype=\"int64\") = R.permute_dims(i"),
        "{t}"
    );
    // Two value-dependent ops get two symbols; Unique asked only for its counts.
    let b = model(
        13,
        vec![
            node("NonZero", "nz", &["x"], &["i"], vec![]),
            node("Unique", "u", &["x"], &["v", "", "", "c"], vec![]),
        ],
        vec![vi("x", 1, &["4"])],
        vec![],
        &["i", "c"],
    );
    let t = text(&import(&b));
    assert!(t.contains("R.Tensor((1, nonzero), dtype=\"int64\")"), "{t}");
    assert!(
        t.contains("return_index=False, return_inverse=False, return_counts=True"),
        "{t}"
    );
    assert!(
        t.contains(
            "R.Tuple(R.Tensor((unique,), dtype=\"float32\"), R.Tensor((unique,), dtype=\"int64\"))"
        ),
        "{t}"
    );
    // A Compress condition that is not rank 1, and a Unique axis out of range, are errors.
    let b = model(
        13,
        vec![node("Compress", "c", &["x", "m"], &["y"], vec![])],
        vec![vi("x", 1, &["2", "2"]), vi("m", 9, &["2", "2"])],
        vec![],
        &["y"],
    );
    assert_errors(
        vec![(b, "condition must be a rank-1 tensor")],
        "`c` (Compress)",
    );
    let b = model(
        13,
        vec![node("Unique", "u", &["x"], &["y"], vec![ai("axis", 2)])],
        vec![vi("x", 1, &["2", "2"])],
        vec![],
        &["y"],
    );
    assert_errors(vec![(b, "axis 2 is out of range")], "`u` (Unique)");
}

#[test]
fn eye_like_of_a_symbolic_shape_is_a_band_of_ones() {
    let b = model(
        13,
        vec![node("EyeLike", "eye", &["x"], &["y"], vec![ai("k", -1)])],
        vec![vi("x", 1, &["n", "3"])],
        vec![],
        &["y"],
    );
    let t = text(&import(&b));
    assert!(
        t.contains("R.broadcast_to(") && t.contains("R.shape([n, 3])"),
        "{t}"
    );
    assert!(t.contains("R.tril(") && t.contains("k=-1"), "{t}");
    assert!(t.contains("R.triu(lv1, k=-1)"), "{t}");
}

#[test]
fn recurrent_layers_need_a_static_unpadded_sequence() {
    let w = f32_init("w", &[1, 4, 3], &[0.1; 12]);
    let r = f32_init("r", &[1, 4, 4], &[0.1; 16]);
    let lens = TensorProto {
        name: "lens".into(),
        dims: vec![2],
        data_type: 6,
        int32_data: vec![3, 2],
        ..Default::default()
    };
    let rnn = |ins: &[&str]| node("RNN", "rnn", ins, &["y", "yh"], vec![ai("hidden_size", 4)]);
    let b = model(
        14,
        vec![rnn(&["x", "w", "r", "", "lens"])],
        vec![vi("x", 1, &["3", "2", "3"])],
        vec![w.clone(), r.clone(), lens],
        &["y"],
    );
    let e = import_onnx(&b, "t.onnx").unwrap_err().to_string();
    assert!(
        e.contains("node `rnn` (RNN): `sequence_lens` [3, 2] differ"),
        "{e}"
    );
    let b = model(
        14,
        vec![rnn(&["x", "w", "r"])],
        vec![vi("x", 1, &["s", "2", "3"])],
        vec![w, r],
        &["y"],
    );
    let e = import_onnx(&b, "t.onnx").unwrap_err().to_string();
    assert!(e.contains("the sequence length must be static"), "{e}");
}
mod col2im;
mod conv3d;
mod exporter_shapes;
mod external_data;
mod index_family;
mod loop_unroll;
mod reduce;
mod scan;
mod unpool;
mod validate;

fn astr(name: &str, s: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        s: s.as_bytes().to_vec(),
        r#type: 3,
        ..Default::default()
    }
}

fn scalar_init(name: &str, data_type: i32, bytes: Vec<u8>) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: vec![],
        data_type,
        raw_data: bytes,
        ..Default::default()
    }
}

#[test]
fn range_over_a_symbolic_length() {
    // Position ids of a dynamic sequence: Range(0, Shape(x)[1], 1), and a strided variant.
    let b = model(
        14,
        vec![
            node("Shape", "s", &["x"], &["shp"], vec![]),
            node(
                "Gather",
                "g",
                &["shp", "one"],
                &["len"],
                vec![ai("axis", 0)],
            ),
            node("Range", "r", &["zero", "len", "onei"], &["pos"], vec![]),
            node("Range", "r2", &["three", "len", "two"], &["odd"], vec![]),
        ],
        vec![vi("x", 1, &["b", "seq"])],
        vec![
            scalar_init("one", 7, 1i64.to_le_bytes().to_vec()),
            scalar_init("zero", 7, 0i64.to_le_bytes().to_vec()),
            scalar_init("onei", 7, 1i64.to_le_bytes().to_vec()),
            scalar_init("three", 7, 3i64.to_le_bytes().to_vec()),
            scalar_init("two", 7, 2i64.to_le_bytes().to_vec()),
        ],
        &["pos", "odd"],
    );
    let t = text(&import(&b));
    assert!(
        t.contains("R.broadcast_to(R.const(1, \"int64\"), R.shape([seq]))"),
        "{t}"
    );
    assert!(
        t.contains("pos: R.Tensor((seq,), dtype=\"int64\") = R.cumsum(lv, axis=0, dtype=None, exclusive=True)"),
        "{t}"
    );
    assert!(
        t.contains("lv3: R.Tensor(((seq - 2) // 2,), dtype=\"int64\") = R.multiply(lv2, R.const(2, \"int64\"))")
            && t.contains("odd: R.Tensor(((seq - 2) // 2,), dtype=\"int64\") = R.add(lv3, R.const(3, \"int64\"))"),
        "{t}"
    );
}

#[test]
fn neg_of_a_folded_integer_feeds_constant_of_shape() {
    // LayerNormalization's expansion: ConstantOfShape(Neg(axis)) gives the reduced shape's ones.
    let b = model(
        17,
        vec![
            node("Neg", "n", &["ax"], &["k"], vec![]),
            node("ConstantOfShape", "c", &["k"], &["zeros"], vec![]),
        ],
        vec![],
        vec![i64_init("ax", &[-3, 0])],
        &["zeros"],
    );
    assert_eq!(ret_type(&import(&b)), Type::tensor(&[3, 0], DType::F32));
    let b = model(
        17,
        vec![
            node("Neg", "n", &["ax"], &["k"], vec![]),
            node("ConstantOfShape", "c", &["k"], &["zeros"], vec![]),
        ],
        vec![],
        vec![i64_init("ax", &[3])],
        &["zeros"],
    );
    let e = import_onnx(&b, "t.onnx").unwrap_err().to_string();
    assert!(e.contains("negative dim -3"), "{e}");
}

#[test]
fn center_crop_pad_is_one_pad() {
    // Axis 0 grows 3 → 6 (1 before, 2 after), axis 1 shrinks 5 → 2 (crop 1 before, 2 after).
    let b = model(
        18,
        vec![node("CenterCropPad", "c", &["x", "s"], &["y"], vec![])],
        vec![vi("x", 1, &["3", "5"])],
        vec![i64_init("s", &[6, 2])],
        &["y"],
    );
    let t = text(&import(&b));
    assert!(
        t.contains("y: R.Tensor((6, 2), dtype=\"float32\") = R.nn.pad(x, pad_width=[1, 2, -1, -2], pad_value=0.0, pad_mode=\"constant\")"),
        "{t}"
    );
}

#[test]
fn folded_shape_arithmetic_broadcasts_like_numpy() {
    // [1, 2, 1] + [1, 1, 2]: the same element count, different shapes (Swin's window mask);
    // the fold must broadcast to [1, 2, 2], not pair elements.
    let t = |name: &str, dims: &[i64], v: &[i64]| TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: 7,
        raw_data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ..Default::default()
    };
    let b = model(
        17,
        vec![
            node("Add", "add", &["a", "b"], &["c"], vec![]),
            node("Cast", "cast", &["c"], &["y"], vec![ai("to", 1)]),
        ],
        vec![],
        vec![t("a", &[1, 2, 1], &[1, 2]), t("b", &[1, 1, 2], &[10, 20])],
        &["y"],
    );
    let m = import(&b);
    let f = m.get("main").unwrap();
    let c = f
        .exprs
        .iter()
        .find_map(|(_, d)| match &d.kind {
            ExprKind::Const(c) if c.dtype == DType::F32 => Some(c.clone()),
            _ => None,
        })
        .expect("the folded constant");
    assert_eq!(c.shape, vec![1, 2, 2]);
    let v: Vec<f64> = (0..4).map(|i| c.get_f64(i).unwrap()).collect();
    assert_eq!(v, vec![11.0, 21.0, 12.0, 22.0]);
}

/// An `If` node on `cond` whose branches compute `y = Relu(x)` (then) or `y = Neg(x)` (else),
/// each from the outer `x`.
fn if_node(cond: &str) -> NodeProto {
    let branch = |op: &str, out: &str| AttributeProto {
        name: if op == "Relu" {
            "then_branch"
        } else {
            "else_branch"
        }
        .into(),
        r#type: 5,
        g: Some(Box::new(GraphProto {
            node: vec![node(op, op, &["x"], &[out], vec![])],
            name: op.into(),
            initializer: vec![],
            input: vec![],
            output: vec![vi(out, 1, &["2", "3"])],
            value_info: vec![],
        })),
        ..Default::default()
    };
    node(
        "If",
        "if",
        &[cond],
        &["y"],
        vec![branch("Relu", "y_then"), branch("Neg", "y_else")],
    )
}

#[test]
fn an_if_with_an_import_time_condition_inlines_its_branch() {
    let flag = |v: u8| TensorProto {
        name: "c".into(),
        dims: vec![],
        data_type: 9,
        raw_data: vec![v],
        ..Default::default()
    };
    for (v, want) in [(1, "R.nn.relu(x)"), (0, "R.negative(x)")] {
        let b = model(
            17,
            vec![if_node("c")],
            vec![vi("x", 1, &["2", "3"])],
            vec![flag(v)],
            &["y"],
        );
        let t = print_module(&import(&b)).text;
        assert!(t.contains(want), "{v}: {t}");
        assert!(!t.contains("if "), "{t}");
    }
    // A condition computed from shapes folds too: Size(x) == 6.
    let six = TensorProto {
        name: "six".into(),
        dims: vec![],
        data_type: 7,
        raw_data: 6i64.to_le_bytes().to_vec(),
        ..Default::default()
    };
    let b = model(
        17,
        vec![
            node("Size", "size", &["x"], &["n"], vec![]),
            node("Equal", "eq", &["n", "six"], &["c"], vec![]),
            if_node("c"),
        ],
        vec![vi("x", 1, &["2", "3"])],
        vec![six],
        &["y"],
    );
    assert!(print_module(&import(&b)).text.contains("R.nn.relu(x)"));
    // A run-time condition is an error naming the node and why.
    let b = model(
        17,
        vec![if_node("c")],
        vec![vi("x", 1, &["2", "3"]), vi("c", 9, &[])],
        vec![],
        &["y"],
    );
    let e = import_onnx(&b, "m.onnx")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("node `if` (If)") && e.contains("known at import time"),
        "{e}"
    );
}

#[test]
fn split_of_a_folded_shape_gives_constants() {
    // Split(Shape(x)) into its four extents, then Concat two of them as a Reshape target.
    let b = model(
        18,
        vec![
            node("Shape", "s", &["x"], &["xs"], vec![]),
            node(
                "Split",
                "sp",
                &["xs"],
                &["n", "c", "h", "w"],
                vec![ai("num_outputs", 4)],
            ),
            node(
                "Concat",
                "cat",
                &["n", "w", "c", "h"],
                &["t"],
                vec![ai("axis", 0)],
            ),
            node("Reshape", "r", &["x", "t"], &["y"], vec![]),
        ],
        vec![vi("x", 1, &["2", "3", "4", "5"])],
        vec![],
        &["y"],
    );
    let m = import(&b);
    assert_eq!(
        m.get("main").unwrap().ret_ty,
        Type::tensor(&[2, 5, 3, 4], DType::F32)
    );
}

#[test]
fn batch_norm_in_training_mode_returns_the_running_statistics() {
    let b = model(
        15,
        vec![node(
            "BatchNormalization",
            "bn",
            &["x", "s", "b", "m", "v"],
            &["y", "rm", "rv"],
            vec![ai("training_mode", 1), af("momentum", 0.75)],
        )],
        vec![
            vi("x", 1, &["2", "3", "4"]),
            vi("s", 1, &["3"]),
            vi("b", 1, &["3"]),
            vi("m", 1, &["3"]),
            vi("v", 1, &["3"]),
        ],
        vec![],
        &["y", "rm", "rv"],
    );
    let m = import(&b);
    let t = print_module(&m).text;
    // ONNX's momentum weighs the running statistics, TVM's the batch's: 1 - 0.75.
    assert!(t.contains("momentum=0.25"), "{t}");
    assert!(t.contains("training=True"), "{t}");
    let f = m.get("main").unwrap();
    assert_eq!(
        f.ret_ty,
        Type::Tuple(vec![
            Type::tensor(&[2, 3, 4], DType::F32),
            Type::tensor(&[3], DType::F32),
            Type::tensor(&[3], DType::F32),
        ])
    );
}

#[test]
fn max_min_of_shapes_and_float_casts_fold_into_pad() {
    // CenterCropPad's expansion: pads = max(shape(x), target) - shape(x), split in halves; the
    // pad value CastLike(-inf, x) (Attention's expansion). Both must be known at import.
    let ti = |name: &str, v: &[i64]| TensorProto {
        name: name.into(),
        dims: vec![v.len() as i64],
        data_type: 7,
        raw_data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ..Default::default()
    };
    let tf = TensorProto {
        name: "neginf".into(),
        dims: vec![],
        data_type: 11,
        raw_data: f64::NEG_INFINITY.to_le_bytes().to_vec(),
        ..Default::default()
    };
    let b = model(
        18,
        vec![
            node("Shape", "s", &["x"], &["xs"], vec![]),
            node("Max", "mx", &["xs", "target"], &["big"], vec![]),
            node("Min", "mn", &["big", "cap"], &["capped"], vec![]),
            node("Sub", "d", &["capped", "xs"], &["amount"], vec![]),
            node("Div", "h", &["amount", "two"], &["left"], vec![]),
            node("Sub", "r", &["amount", "left"], &["right"], vec![]),
            node(
                "Concat",
                "c",
                &["left", "right"],
                &["pads"],
                vec![ai("axis", 0)],
            ),
            node("CastLike", "v", &["neginf", "x"], &["val"], vec![]),
            node("Pad", "p", &["x", "pads", "val"], &["y"], vec![]),
        ],
        vec![vi("x", 1, &["2", "3"])],
        vec![
            ti("target", &[5, 2]),
            ti("cap", &[4, 9]),
            ti("two", &[2]),
            tf,
        ],
        &["y"],
    );
    let m = import(&b);
    let t = print_module(&m).text;
    // max([2, 3], [5, 2]) = [5, 3], min with [4, 9] = [4, 3]: amounts [2, 0], left [1, 0],
    // right [1, 0]; TVM's pad_width is (before, after) per axis.
    assert!(t.contains("pad_width=[1, 1, 0, 0]"), "{t}");
    assert!(
        t.contains("pad_value=-inf") || t.contains("pad_value=-Infinity"),
        "{t}"
    );
    assert_eq!(
        m.get("main").unwrap().ret_ty,
        Type::tensor(&[4, 3], DType::F32)
    );
}

#[test]
fn slices_with_symbolic_bounds_stay_symbolic() {
    // pos[:, :seq] (BERT's position ids) and seq used as data (`Mul` by a tensor).
    let buf = TensorProto {
        name: "pos".into(),
        dims: vec![1, 8],
        data_type: 7,
        raw_data: (0..8i64).flat_map(|x| x.to_le_bytes()).collect(),
        ..Default::default()
    };
    let b = model(
        17,
        vec![
            node("Shape", "shape", &["ids"], &["s"], vec![]),
            node("Gather", "g", &["s", "one"], &["seq"], vec![ai("axis", 0)]),
            node("Unsqueeze", "u", &["seq", "zero"], &["end"], vec![]),
            node(
                "Slice",
                "slice",
                &["pos", "zero", "end", "one"],
                &["p"],
                vec![],
            ),
            node("Mul", "mul", &["p", "seq"], &["y"], vec![]),
        ],
        vec![vi("ids", 7, &["batch", "seq"])],
        vec![
            buf,
            i64_init("zero", &[0]),
            TensorProto {
                name: "one".into(),
                dims: vec![],
                data_type: 7,
                raw_data: 1i64.to_le_bytes().to_vec(),
                ..Default::default()
            },
        ],
        &["y"],
    );
    let text = print_module(&import(&b)).text;
    assert!(text.contains("R.take(metadata"), "{text}");
    assert!(text.contains("R.shape_to_tensor(R.shape([seq]))"), "{text}");
    assert!(
        text.contains("y: R.Tensor((1, seq), dtype=\"int64\")"),
        "{text}"
    );
}

#[test]
fn supported_ops_are_listed_once() {
    let mut seen = std::collections::BTreeSet::new();
    for op in SUPPORTED_OPS {
        assert!(seen.insert(*op), "{op} is listed twice in SUPPORTED_OPS");
    }
    assert!(SUPPORTED_OPS.len() > 150, "{}", SUPPORTED_OPS.len());
}

#[test]
fn signal_ops_lower_to_float64_matmuls_and_check_their_inputs() {
    // A real rfft along axis 1: two matmuls with (10, 6) float64 matrices, the result back in
    // float32 with the bins in place of the signal axis.
    let b = model(
        17,
        vec![node(
            "DFT",
            "d",
            &["x"],
            &["y"],
            vec![ai("axis", 1), ai("onesided", 1)],
        )],
        vec![vi("x", 1, &["2", "10", "3", "1"])],
        vec![],
        &["y"],
    );
    let m = import(&b);
    assert_eq!(ret_type(&m), Type::tensor(&[2, 6, 3, 2], DType::F32));
    let t = text(&m);
    assert_eq!(t.matches("R.matmul(").count(), 2, "{t}");
    assert!(
        t.contains("R.Tensor((2, 3, 6), dtype=\"float64\") = R.matmul("),
        "{t}"
    );
    // An irfft of odd length 11 from 7 bins uses 6 of them.
    let b = model(
        17,
        vec![node(
            "DFT",
            "d",
            &["x", "n"],
            &["y"],
            vec![ai("axis", 1), ai("inverse", 1), ai("onesided", 1)],
        )],
        vec![vi("x", 1, &["1", "7", "2"])],
        vec![i64_init("n", &[11])],
        &["y"],
    );
    assert_eq!(ret_type(&import(&b)), Type::tensor(&[1, 11, 1], DType::F32));
    // Errors name the node and what is wrong.
    let dft = |attrs: Vec<AttributeProto>, n: Option<i64>| {
        let ins: &[&str] = if n.is_some() { &["x", "n"] } else { &["x"] };
        model(
            17,
            vec![node("DFT", "d", ins, &["y"], attrs)],
            vec![vi("x", 1, &["1", "10", "1"])],
            n.map(|v| vec![i64_init("n", &[v])]).unwrap_or_default(),
            &["y"],
        )
    };
    assert_errors(
        vec![
            (dft(vec![ai("axis", -1)], None), "must not be the last axis"),
            (dft(vec![ai("axis", 3)], None), "out of range"),
            (dft(vec![], Some(0)), "at least 1"),
            (dft(vec![], Some(1 << 23)), "at most 16777216 values"),
        ],
        "`d` (DFT)",
    );
    let stft = |len: i64, window: usize| {
        model(
            17,
            vec![node(
                "STFT",
                "s",
                &["x", "step", "w", "len"],
                &["y"],
                vec![],
            )],
            vec![vi("x", 1, &["1", "16", "1"])],
            vec![
                i64_init("step", &[2]),
                f32_init("w", &[window as i64], &vec![1.0; window]),
                i64_init("len", &[len]),
            ],
            &["y"],
        )
    };
    assert_eq!(
        ret_type(&import(&stft(8, 8))),
        Type::tensor(&[1, 5, 5, 2], DType::F32)
    );
    assert_errors(
        vec![
            (stft(8, 6), "window has 6 values but frame_length is 8"),
            (stft(20, 20), "frame_length ≤ the signal length 16"),
        ],
        "`s` (STFT)",
    );
    // A filter bank reaching past the spectrogram (upper edge above the Nyquist frequency).
    let mel = model(
        17,
        vec![node(
            "MelWeightMatrix",
            "m",
            &["bins", "n", "rate", "lo", "hi"],
            &["y"],
            vec![],
        )],
        vec![],
        vec![
            i64_init("bins", &[8]),
            i64_init("n", &[16]),
            i64_init("rate", &[8192]),
            f32_init("lo", &[], &[0.0]),
            f32_init("hi", &[], &[16000.0]),
        ],
        &["y"],
    );
    assert_errors(
        vec![(mel, "outside the 9 spectrogram bins")],
        "`m` (MelWeightMatrix)",
    );
}

#[test]
fn max_pool_indices_are_an_argmax_over_gathered_windows() {
    let pool = |dims: &[&str], elem: i32| {
        model(
            12,
            vec![node(
                "MaxPool",
                "mp",
                &["x"],
                &["y", "i"],
                vec![ais("kernel_shape", &vec![2; dims.len() - 2])],
            )],
            vec![vi("x", elem, dims)],
            vec![],
            &["y", "i"],
        )
    };
    let m = import(&pool(&["1", "2", "4", "4"], 1));
    let t = text(&m);
    assert!(t.contains("R.argmax("), "{t}");
    assert_eq!(
        ret_type(&m),
        Type::Tuple(vec![
            Type::tensor(&[1, 2, 3, 3], DType::F32),
            Type::tensor(&[1, 2, 3, 3], DType::I64)
        ])
    );
    assert_errors(
        vec![(pool(&["1", "2", "4", "4"], 2), "only floating-point inputs")],
        "`mp` (MaxPool)",
    );
    // A 3-D pool's Indices output is not supported: named as such.
    let e = import_onnx(&pool(&["1", "1", "4", "4", "4"], 1), "t.onnx")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("output 1 of node `mp` (MaxPool) is not supported"),
        "{e}"
    );
}

#[test]
fn deform_conv_samples_each_tap_then_convolves_once() {
    let dc = |x: &[&str], off: &[&str], attrs: Vec<AttributeProto>| {
        model(
            19,
            vec![node("DeformConv", "dc", &["x", "w", "off"], &["y"], attrs)],
            vec![vi("x", 1, x), vi("off", 1, off)],
            vec![f32_init("w", &[4, 2, 2, 2], &[0.5; 32])],
            &["y"],
        )
    };
    let m = import(&dc(&["1", "2", "4", "4"], &["1", "8", "3", "3"], vec![]));
    assert_eq!(ret_type(&m), Type::tensor(&[1, 4, 3, 3], DType::F32));
    let t = text(&m);
    assert_eq!(t.matches("R.image.grid_sample(").count(), 1, "{t}");
    assert_eq!(t.matches("R.nn.conv2d(").count(), 1, "{t}");
    // Two offset groups: one grid_sample each.
    let m = import(&dc(
        &["1", "2", "4", "4"],
        &["1", "16", "3", "3"],
        vec![ai("offset_group", 2)],
    ));
    assert_eq!(text(&m).matches("R.image.grid_sample(").count(), 2);
    assert_errors(
        vec![
            (
                dc(&["1", "2", "4", "4"], &["1", "6", "3", "3"], vec![]),
                "offset [1, 6, 3, 3] must be (N, 8, 3, 3)",
            ),
            (
                dc(&["1", "2", "1", "4"], &["1", "8", "0", "3"], vec![]),
                "at least 2×2",
            ),
            (
                dc(&["1", "3", "4", "4"], &["1", "8", "3", "3"], vec![]),
                "inconsistent shapes",
            ),
        ],
        "`dc` (DeformConv)",
    );
}

#[test]
fn swiglu_is_swish_of_a_times_b() {
    let sg = |b_dims: &[&str]| {
        model(
            28,
            vec![node(
                "SwiGLU",
                "sg",
                &["a", "b"],
                &["y"],
                vec![af("alpha", 0.5)],
            )],
            vec![vi("a", 1, &["2", "4"]), vi("b", 1, b_dims)],
            vec![],
            &["y"],
        )
    };
    let m = import(&sg(&["2", "4"]));
    let t = text(&m);
    assert_eq!(t.matches("R.sigmoid(").count(), 1, "{t}");
    assert_eq!(t.matches("R.multiply(").count(), 3, "{t}");
    assert_errors(
        vec![(
            sg(&["1", "4"]),
            "one shape and dtype (no broadcasting), found float32 [2, 4] and float32 [1, 4]",
        )],
        "`sg` (SwiGLU)",
    );
}

#[test]
fn tfidf_roi_align_bitcast_and_det_refuse_what_they_cannot_read() {
    let tokens = |dims: &[&str], elem: i32| vec![vi("x", elem, dims)];
    let tfidf = |dims: &[&str], elem: i32, attrs: Vec<AttributeProto>| {
        model(
            9,
            vec![node("TfIdfVectorizer", "tf", &["x"], &["y"], attrs)],
            tokens(dims, elem),
            vec![],
            &["y"],
        )
    };
    let pool = |p: &[i64], counts: &[i64], idx: &[i64]| {
        vec![
            ais("pool_int64s", p),
            ais("ngram_counts", counts),
            ais("ngram_indexes", idx),
            ai("min_gram_length", 1),
            ai("max_gram_length", 2),
            astr("mode", "TF"),
        ]
    };
    let mut weights = pool(&[1, 2, 1, 2], &[0, 2], &[0, 1, 2]);
    weights.push(AttributeProto {
        name: "weights".into(),
        floats: vec![1.0, 2.0],
        r#type: 6,
        ..Default::default()
    });
    let strings = vec![
        AttributeProto {
            name: "pool_strings".into(),
            strings: vec![b"a".to_vec()],
            r#type: 8,
            ..Default::default()
        },
        ais("ngram_counts", &[0]),
        ais("ngram_indexes", &[0]),
    ];
    assert_errors(
        vec![
            (
                tfidf(
                    &["2", "6"],
                    7,
                    pool(&[1, 2, 1, 2, 1, 2], &[0, 2], &[0, 1, 2, 3]),
                ),
                "holds the 2-gram [1, 2] twice",
            ),
            (
                tfidf(&["2", "6"], 7, pool(&[1, 2, 3], &[0, 2], &[0, 1, 2])),
                "not a whole number of 2-grams",
            ),
            (
                tfidf(&["2", "6"], 7, pool(&[1, 2, 1, 2], &[0, 2], &[0, 1])),
                "3 n-grams in its pool but 2 ngram_indexes",
            ),
            (tfidf(&["2", "6"], 7, weights), "2 weights for 3 n-grams"),
            (
                tfidf(&["2", "6"], 7, {
                    let mut a = pool(&[1, 2, 1, 2], &[0, 2], &[0, 1, 2]);
                    a.retain(|x| x.name != "max_gram_length");
                    a.push(ai("max_gram_length", 0));
                    a
                }),
                "min_gram_length ≤ max_gram_length",
            ),
            // 104,857,600 output columns, as a fuzzed model asked (a dense n-grams × columns
            // table of them exhausted memory at import).
            (
                tfidf(
                    &["2", "6"],
                    7,
                    pool(&[1, 2, 1, 2], &[0, 2], &[0, 1, 104_857_599]),
                ),
                "ngram_indexes must lie in 0..16777216, found 104857599",
            ),
            (
                tfidf(&["n"], 7, pool(&[1], &[0], &[0])),
                "static row length",
            ),
            (
                tfidf(&["6"], 1, pool(&[1], &[0], &[0])),
                "int32 or int64 tokens",
            ),
            (tfidf(&["6"], 7, strings), "string tokens are not supported"),
        ],
        "node `tf` (TfIdfVectorizer)",
    );
    let roi = |attrs: Vec<AttributeProto>, rois: &[&str]| {
        model(
            16,
            vec![node("RoiAlign", "ra", &["x", "r", "i"], &["y"], attrs)],
            vec![
                vi("x", 1, &["1", "2", "5", "5"]),
                vi("r", 1, rois),
                vi("i", 7, &["3"]),
            ],
            vec![],
            &["y"],
        )
    };
    assert_errors(
        vec![
            (roi(vec![astr("mode", "min")], &["3", "4"]), "mode `min`"),
            (
                roi(
                    vec![astr("coordinate_transformation_mode", "asymmetric")],
                    &["3", "4"],
                ),
                "`asymmetric`",
            ),
            (
                roi(vec![ai("output_height", 0)], &["3", "4"]),
                "output_height must be ≥ 1",
            ),
            (roi(vec![], &["3", "5"]), "rois of shape (num_rois, 4)"),
            (
                roi(vec![af("spatial_scale", f32::INFINITY)], &["3", "4"]),
                "finite",
            ),
        ],
        "node `ra` (RoiAlign)",
    );
    let cast = |to: i64, elem: i32| {
        model(
            26,
            vec![node("BitCast", "bc", &["x"], &["y"], vec![ai("to", to)])],
            tokens(&["4"], elem),
            vec![],
            &["y"],
        )
    };
    assert_errors(
        vec![(cast(7, 1), "float32 (4 bytes) as int64 (8 bytes)")],
        "node `bc` (BitCast)",
    );
    let det = model(
        22,
        vec![node("Det", "d", &["x"], &["y"], vec![])],
        tokens(&["2", "3"], 1),
        vec![],
        &["y"],
    );
    assert_errors(vec![(det, "2 × 3")], "node `d` (Det)");
    // Good ones: 2-grams of a (2, 6) batch as a (2, 3) float32 table; a million columns for
    // three n-grams are three gathers of a million indices, no table of n-grams × columns.
    let ok = import(&tfidf(
        &["2", "6"],
        6,
        pool(&[1, 2, 2, 3], &[0, 2], &[0, 1, 2]),
    ));
    assert_eq!(ret_type(&ok), Type::tensor(&[2, 3], DType::F32));
    let wide = import(&tfidf(
        &["6"],
        6,
        pool(&[1, 2, 2, 3], &[0, 2], &[0, 1, 999_999]),
    ));
    assert_eq!(ret_type(&wide), Type::tensor(&[1_000_000], DType::F32));
    // Any skip count: distances stop where an n-gram spans the row.
    let mut skips = pool(&[1, 2, 2, 3], &[0, 2], &[0, 1, 2]);
    skips.push(ai("max_skip_count", i64::MAX));
    let far = import(&tfidf(&["6"], 7, skips));
    assert_eq!(ret_type(&far), Type::tensor(&[3], DType::F32));
}
