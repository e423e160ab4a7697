//! Importer tests of `Col2Im` (one grouped `conv2d_transpose` with a one-hot weight): what it
//! becomes and what it refuses. Numerics: the node suite's `Col2Im` cases and
//! `tests/onnx/extra/col2im_*` against onnxruntime (`tests/onnx_node.rs`).

use super::*;

fn col2im(x: &[&str], image: &[i64], block: &[i64], attrs: Vec<AttributeProto>) -> Vec<u8> {
    model(
        18,
        vec![node("Col2Im", "c2i", &["x", "img", "blk"], &["y"], attrs)],
        vec![vi("x", 1, x)],
        vec![i64_init("img", image), i64_init("blk", block)],
        &["y"],
    )
}

#[test]
fn col2im_is_a_grouped_transposed_conv_with_the_remainder_as_output_padding() {
    // 5 × 5 image, 2 × 2 blocks, stride 2: 2 blocks per axis and one row / column past them.
    let m = import(&col2im(
        &["1", "8", "4"],
        &[5, 5],
        &[2, 2],
        vec![ais("strides", &[2, 2])],
    ));
    let t = text(&m);
    assert!(
        t.contains("R.nn.conv2d_transpose(") && t.contains("output_padding=[1, 1]"),
        "{t}"
    );
    assert!(t.contains("groups=2"), "{t}");
    let Type::Tensor(tt) = ret_type(&m) else {
        panic!("{t}")
    };
    assert_eq!(
        tt.dims.map(|d| d.to_vec()),
        Some(vec![
            Dim::Static(1),
            Dim::Static(2),
            Dim::Static(5),
            Dim::Static(5)
        ])
    );
}

#[test]
fn col2im_refuses_what_does_not_add_up() {
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            col2im(
                &["1", "8", "5"],
                &[5, 5],
                &[2, 2],
                vec![ais("strides", &[2, 2])],
            ),
            "has 5 blocks",
        ),
        (
            col2im(
                &["1", "7", "4"],
                &[5, 5],
                &[2, 2],
                vec![ais("strides", &[2, 2])],
            ),
            "not a multiple of the block size 4",
        ),
        (
            col2im(&["1", "8", "4"], &[5, 5, 5, 5], &[2, 2, 2, 2], vec![]),
            "2 or 3 spatial axes",
        ),
        (
            col2im(&["1", "8", "4"], &[1, 1], &[2, 2], vec![]),
            "does not fit",
        ),
        (
            col2im(
                &["1", "8", "4"],
                &[5, 5],
                &[2, 2],
                vec![ais("strides", &[0, 2])],
            ),
            "strides and dilations ≥ 1",
        ),
        (
            col2im(
                &["1", "8", "4"],
                &[5, 5],
                &[2, 2],
                vec![ais("pads", &[1, 1])],
            ),
            "`pads` has 2 values, expected 4",
        ),
    ];
    assert_errors(cases, "node `c2i` (Col2Im)");
}
