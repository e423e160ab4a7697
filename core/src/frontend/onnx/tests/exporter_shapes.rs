//! Importer tests of the shape arithmetic Hugging Face exports write around `Resize`,
//! `Expand` and `Reshape` (found by exporting SegFormer, MobileViT, DPT, BART, Swin V2 and
//! DINOv2 with both torch exporters): targets that hold the input's own symbolic dims, dims
//! equal only after arithmetic, and float arithmetic on constants.

use super::*;

#[test]
fn a_power_of_constants_folds_into_a_reshape() {
    // DINOv2's position grid: side = Cast<int64>(Pow(16.0, 0.5)), then Reshape(pos, [1, side,
    // side, -1]); the Reshape needs its target at import.
    let b = model(
        13,
        vec![
            node("Pow", "p", &["n", "half"], &["root"], vec![]),
            node("Cast", "k", &["root"], &["side"], vec![ai("to", 7)]),
            node("Unsqueeze", "u", &["side", "ax0"], &["side1"], vec![]),
            node(
                "Concat",
                "c",
                &["one", "side1", "side1", "minus1"],
                &["shape"],
                vec![ai("axis", 0)],
            ),
            node("Reshape", "r", &["pos", "shape"], &["y"], vec![]),
        ],
        vec![],
        vec![
            f32_init("n", &[], &[16.0]),
            f32_init("half", &[], &[0.5]),
            i64_init("ax0", &[0]),
            i64_init("one", &[1]),
            i64_init("minus1", &[-1]),
            f32_init("pos", &[16, 8], &[0.0; 128]),
        ],
        &["y"],
    );
    let m = import(&b);
    assert_eq!(ret_type(&m), Type::tensor(&[1, 4, 4, 8], DType::F32));
    assert!(!text(&m).contains("R.power"), "{}", text(&m));
}

/// `Resize(x, sizes = Concat(Shape(x)[:2], [8, 6]))` (SegFormer, MobileViT) or with scales
/// `[1, 1, 2, 2]` (DPT) over a symbolic batch.
#[test]
fn resize_keeps_a_symbolic_batch() {
    let sizes = model(
        13,
        vec![
            node("Shape", "s", &["x"], &["shape"], vec![ai("end", 2)]),
            node(
                "Concat",
                "c",
                &["shape", "hw"],
                &["sizes"],
                vec![ai("axis", 0)],
            ),
            node("Resize", "r", &["x", "", "", "sizes"], &["y"], vec![]),
        ],
        vec![vi("x", 1, &["batch", "3", "4", "3"])],
        vec![i64_init("hw", &[8, 6])],
        &["y"],
    );
    let m = import(&sizes);
    assert!(
        text(&m).contains("R.image.resize2d(x, R.shape([8, 6])"),
        "{}",
        text(&m)
    );
    let scales = model(
        13,
        vec![node("Resize", "r", &["x", "", "s"], &["y"], vec![])],
        vec![vi("x", 1, &["batch", "3", "4", "3"])],
        vec![f32_init("s", &[4], &[1.0, 1.0, 2.0, 2.0])],
        &["y"],
    );
    let m = import(&scales);
    assert!(
        text(&m).contains("R.image.resize2d(x, R.shape([8, 6])"),
        "{}",
        text(&m)
    );
    // Resizing the batch, or a symbolic output height, stays an error naming the node.
    let batch = model(
        13,
        vec![node("Resize", "r", &["x", "", "s"], &["y"], vec![])],
        vec![vi("x", 1, &["batch", "3", "4", "3"])],
        vec![f32_init("s", &[4], &[2.0, 1.0, 2.0, 2.0])],
        &["y"],
    );
    let symbolic_h = model(
        13,
        vec![
            node("Shape", "s", &["x"], &["shape"], vec![]),
            node("Resize", "r", &["z", "", "", "shape"], &["y"], vec![]),
        ],
        vec![
            vi("x", 1, &["batch", "3", "h", "3"]),
            vi("z", 1, &["batch", "3", "4", "3"]),
        ],
        vec![],
        &["y"],
    );
    assert_errors(
        vec![
            (batch, "batch or channel axis"),
            (
                symbolic_h,
                "output height must be static, found symbolic dim `h`",
            ),
        ],
        "node `r` (Resize)",
    );
}

/// BART's position-bias `Expand`: its target is `Where(Equal(s, -1), 1, s)` of
/// `s = Shape(range(n)[:, None] + range(n)[1:])` = `(n, n - 1)`, and `n - 1` is no `-1`.
#[test]
fn expand_to_a_shape_holding_n_minus_1() {
    let b = model(
        13,
        vec![
            node(
                "Shape",
                "s",
                &["x"],
                &["n"],
                vec![ai("start", 1), ai("end", 2)],
            ),
            node("Squeeze", "q", &["n"], &["n0"], vec![]),
            node("Range", "r", &["zero", "n0", "one"], &["ar"], vec![]),
            node("Reshape", "col", &["ar", "col_shape"], &["ar_col"], vec![]),
            node(
                "Slice",
                "sl",
                &["ar", "one1", "big", "zero1"],
                &["tail"],
                vec![],
            ),
            node("Add", "a", &["ar_col", "tail"], &["sum"], vec![]),
            node("Shape", "ss", &["sum"], &["target"], vec![]),
            node("Equal", "eq", &["target", "minus1"], &["is_m1"], vec![]),
            node(
                "Where",
                "w",
                &["is_m1", "ones", "target"],
                &["shape"],
                vec![],
            ),
            node("Expand", "e", &["bias", "shape"], &["y"], vec![]),
        ],
        vec![vi("x", 7, &["batch", "n"])],
        vec![
            i64_init("zero", &[0]),
            i64_init("one", &[1]),
            i64_init("one1", &[1]),
            i64_init("zero1", &[0]),
            i64_init("big", &[i64::MAX]),
            i64_init("col_shape", &[-1, 1]),
            i64_init("minus1", &[-1]),
            i64_init("ones", &[1, 1]),
            f32_init("bias", &[1], &[0.5]),
        ],
        &["y"],
    );
    let m = import(&b);
    let t = text(&m);
    assert!(
        t.contains("y: R.Tensor((n, n - 1), dtype=\"float32\")"),
        "{t}"
    );
}

/// A shape value doubled 80 times (`s = s + s`) would be a dim of 2^80 operators: an error
/// naming the node, not a hang.
#[test]
fn doubling_a_shape_over_and_over_is_an_error_not_a_hang() {
    let mut nodes = vec![node("Shape", "s", &["x"], &["s0"], vec![])];
    for i in 0..80 {
        let (a, b) = (format!("s{i}"), format!("s{}", i + 1));
        nodes.push(node("Add", &format!("add{i}"), &[&a, &a], &[&b], vec![]));
    }
    nodes.push(node("Reshape", "r", &["x", "s80"], &["y"], vec![]));
    let b = model(15, nodes, vec![vi("x", 1, &["n"])], vec![], &["y"]);
    let e = import_onnx(&b, "t.onnx")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("(Add)") && e.contains("past 256 operators"),
        "{e}"
    );
}
