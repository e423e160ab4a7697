//! Importer tests of the 3-D convolutions (`conv3d.rs`: 2-D convolutions over the depth
//! slices), blocked quantization and the optionals: what they become and what they refuse.
//! Numerics: the node suite's `ConvTranspose` / `Col2Im` 3-D and blocked `QuantizeLinear` /
//! `DequantizeLinear` cases, and `tests/onnx/extra/{conv3d,convtranspose3d,col2im_3d}_*`
//! against onnxruntime or numpy (`tests/onnx_node.rs`).

use super::*;

fn conv(op: &str, x: &[&str], w: &[&str], attrs: Vec<AttributeProto>) -> Vec<u8> {
    model(
        22,
        vec![node(op, "c", &["x", "w"], &["y"], attrs)],
        vec![vi("x", 1, x), vi("w", 1, w)],
        vec![],
        &["y"],
    )
}

fn dims(m: &Module) -> Vec<Dim> {
    let Type::Tensor(tt) = ret_type(m) else {
        panic!("{}", text(m))
    };
    tt.dims.map(|d| d.to_vec()).unwrap_or_default()
}

fn stat(v: &[i64]) -> Vec<Dim> {
    v.iter().map(|&d| Dim::Static(d)).collect()
}

#[test]
fn conv3d_is_one_conv2d_over_the_gathered_depth_slices() {
    // Depth 7 padded by 1 + 2, kernel 3 dilated by 2, stride 2: (10 − 5) / 2 + 1 = 3 depths.
    let m = import(&conv(
        "Conv",
        &["n", "4", "7", "8", "6"],
        &["6", "2", "3", "2", "3"],
        vec![
            ai("group", 2),
            ais("strides", &[2, 1, 2]),
            ais("dilations", &[2, 1, 1]),
            ais("pads", &[1, 0, 1, 2, 1, 0]),
        ],
    ));
    let t = text(&m);
    assert_eq!(t.matches("R.nn.conv2d(").count(), 1, "{t}");
    assert!(t.contains("R.take(") && t.contains("groups=2"), "{t}");
    assert!(
        t.contains("pad_width=[0, 0, 0, 0, 1, 2, 0, 0, 0, 0]"),
        "{t}"
    );
    let d = dims(&m);
    assert_eq!(d[1..], stat(&[6, 3, 8, 3])[..], "{t}");
    assert!(d[0].as_static().is_none(), "the batch stays symbolic: {t}");
}

#[test]
fn conv_transpose3d_adds_each_depth_tap_shifted_into_place() {
    // Depth: (3 − 1)·2 + 1 + (3 − 1)·1 + 1 (output padding) − 1 − 0 = 7.
    let m = import(&conv(
        "ConvTranspose",
        &["1", "4", "3", "4", "5"],
        &["4", "3", "3", "2", "3"],
        vec![
            ai("group", 2),
            ais("strides", &[2, 1, 2]),
            ais("pads", &[1, 0, 1, 0, 1, 0]),
            ais("output_padding", &[1, 0, 1]),
            ais("dilations", &[1, 2, 1]),
        ],
    ));
    let t = text(&m);
    assert_eq!(t.matches("R.nn.conv2d_transpose(").count(), 1, "{t}");
    assert_eq!(
        t.matches("R.strided_slice(").count(),
        3,
        "one per depth tap: {t}"
    );
    assert_eq!(dims(&m), stat(&[1, 6, 7, 5, 11]), "{t}");
}

#[test]
fn col2im_of_three_axes_is_a_transposed_conv3d() {
    let m = model(
        18,
        vec![node("Col2Im", "c2i", &["x", "img", "blk"], &["y"], vec![])],
        vec![vi("x", 1, &["1", "16", "24"])],
        vec![i64_init("img", &[3, 4, 5]), i64_init("blk", &[2, 2, 2])],
        &["y"],
    );
    let m = import(&m);
    assert_eq!(dims(&m), stat(&[1, 2, 3, 4, 5]), "{}", text(&m));
}

#[test]
fn three_d_convolutions_refuse_what_they_cannot_build() {
    assert_errors(
        vec![
            (
                conv(
                    "Conv",
                    &["1", "2", "d", "5", "5"],
                    &["2", "2", "3", "3", "3"],
                    vec![],
                ),
                "static depth extent",
            ),
            (
                conv(
                    "Conv",
                    &["1", "2", "2", "5", "5"],
                    &["2", "2", "3", "3", "3"],
                    vec![],
                ),
                "exceeds the padded input depth 2",
            ),
            (
                conv(
                    "Conv",
                    &["1", "2", "4", "5", "5"],
                    &["2", "2", "3", "3", "3"],
                    vec![ais("strides", &[1, 1])],
                ),
                "`strides` must have 3 values",
            ),
            (
                conv(
                    "ConvTranspose",
                    &["1", "1", "2", "2", "2"],
                    &["1", "1", "300", "1", "1"],
                    vec![],
                ),
                "at most 256",
            ),
            (
                conv(
                    "ConvTranspose",
                    &["1", "1", "2", "2", "2"],
                    &["1", "1", "2", "1", "1"],
                    vec![ais("pads", &[2, 0, 0, 2, 0, 0])],
                ),
                "output depth -1",
            ),
            (
                conv(
                    "Conv",
                    &["1", "2", "4", "5", "5", "5"],
                    &["2", "2", "3", "3", "3", "3"],
                    vec![],
                ),
                "only 1-D, 2-D and 3-D convolutions",
            ),
        ],
        "node `c`",
    );
}

fn quant(op: &str, x: (i32, &[&str]), s: &[&str], block: i64) -> Vec<u8> {
    model(
        21,
        vec![node(
            op,
            "q",
            &["x", "s", "z"],
            &["y"],
            vec![ai("axis", 1), ai("block_size", block)],
        )],
        vec![vi("x", x.0, x.1), vi("s", 1, s), vi("z", 2, s)],
        vec![],
        &["y"],
    )
}

#[test]
fn blocked_quantization_repeats_each_scale_over_its_block() {
    // 5 columns in blocks of 2: three blocks, the last one short.
    for (op, elem) in [("DequantizeLinear", 2), ("QuantizeLinear", 1)] {
        let m = import(&quant(op, (elem, &["3", "5"]), &["3", "3"], 2));
        let t = text(&m);
        // The scale and the zero point, each spread by one take along axis 1.
        assert_eq!(t.matches("R.take(").count(), 2, "{t}");
        assert_eq!(dims(&m), stat(&[3, 5]), "{t}");
    }
    assert_errors(
        vec![
            (
                quant("DequantizeLinear", (2, &["3", "5"]), &["3", "2"], 2),
                "except 3 blocks along the axis, found [3, 2]",
            ),
            (
                quant("DequantizeLinear", (2, &["3", "5"]), &["1", "3"], 2),
                "except 3 blocks",
            ),
            (
                quant("DequantizeLinear", (2, &["3", "5"]), &["3", "3"], -1),
                "block_size must be ≥ 0",
            ),
        ],
        "node `q`",
    );
}

#[test]
fn optionals_of_a_tensor_are_the_tensor_and_absent_ones_have_no_element() {
    let has = |ins: &[&str]| {
        let inputs = if ins.iter().any(|s| !s.is_empty()) {
            vec![vi("x", 1, &["2"])]
        } else {
            vec![]
        };
        import(&model(
            18,
            vec![node("OptionalHasElement", "h", ins, &["y"], vec![])],
            inputs,
            vec![],
            &["y"],
        ))
    };
    for (ins, want) in [
        (&["x"][..], "True"),
        (&[][..], "False"),
        (&[""][..], "False"),
    ] {
        let t = text(&has(ins));
        assert!(t.contains(want) && t.contains("\"bool\""), "{ins:?}: {t}");
    }
    let get = import(&model(
        18,
        vec![node("OptionalGetElement", "g", &["x"], &["y"], vec![])],
        vec![vi("x", 1, &["2"])],
        vec![],
        &["y"],
    ));
    assert_eq!(dims(&get), stat(&[2]));
    assert_errors(
        vec![(
            model(
                18,
                vec![node("OptionalGetElement", "g", &[], &["y"], vec![])],
                vec![],
                vec![],
                &["y"],
            ),
            "empty optional",
        )],
        "node `g`",
    );
}
