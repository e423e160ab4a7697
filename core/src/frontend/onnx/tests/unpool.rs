//! Importer tests of `MaxUnpool` (a scatter into zeros, padded to `output_shape`): what it
//! becomes and what it refuses. Numerics: the node suite's `MaxUnpool` cases
//! (`tests/onnx_node.rs`).

use super::*;

fn unpool(x: &[&str], out_shape: Option<&[i64]>, attrs: Vec<AttributeProto>) -> Vec<u8> {
    let mut ins = vec!["x", "i"];
    let mut inits = vec![];
    if let Some(s) = out_shape {
        ins.push("shape");
        inits.push(i64_init("shape", s));
    }
    model(
        11,
        vec![node("MaxUnpool", "up", &ins, &["y"], attrs)],
        vec![vi("x", 1, x), vi("i", 7, x)],
        inits,
        &["y"],
    )
}

#[test]
fn max_unpool_scatters_into_the_inferred_shape_then_pads_to_output_shape() {
    let k = || vec![ais("kernel_shape", &[2, 2]), ais("strides", &[2, 2])];
    let t = text(&import(&unpool(&["1", "1", "2", "2"], None, k())));
    assert!(
        t.contains("R.scatter_elements(") && t.contains("R.shape([1, 1, 4, 4])"),
        "{t}"
    );
    assert!(!t.contains("R.nn.pad("), "{t}");
    let m = import(&unpool(&["1", "1", "2", "2"], Some(&[1, 1, 5, 5]), k()));
    let t = text(&m);
    assert!(
        t.contains("R.nn.pad(") && t.contains("pad_width=[0, 0, 0, 0, 0, 1, 0, 1]"),
        "{t}"
    );
    assert_eq!(ret_type(&m), Type::tensor(&[1, 1, 5, 5], DType::F32));
}

#[test]
fn max_unpool_refuses_what_does_not_fit() {
    let k = || vec![ais("kernel_shape", &[2, 2]), ais("strides", &[2, 2])];
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            unpool(&["1", "1", "2", "2"], Some(&[1, 1, 3, 3]), k()),
            "must have rank 4 and hold the shape [1, 1, 4, 4]",
        ),
        (
            unpool(&["1", "1", "2", "2"], None, vec![]),
            "needs `kernel_shape` of 2 values",
        ),
        (
            unpool(
                &["1", "1", "2", "2"],
                None,
                vec![ais("kernel_shape", &[2, 2]), ais("pads", &[4, 4, 4, 4])],
            ),
            "empty output",
        ),
        (
            unpool(&["1", "1", "n", "2"], None, k()),
            "static input shape",
        ),
    ];
    assert_errors(cases, "node `up` (MaxUnpool)");
}
