//! Every op of the op set, lowered to the kernel IR and evaluated on the CPU, against the CPU
//! reference (all elements compared, per-dtype tolerance).

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

mod check;

use check::{check_function, lower_check_compile as run, random_args, tensor_ty};
use fusebox_core::text::parse_module_str;

#[test]
fn elementwise_and_broadcast_ops() {
    let p = format!(
        "x: {}, y: {}",
        tensor_ty("4, 8", "float32"),
        tensor_ty("8,", "float32")
    );
    for op in [
        "add", "subtract", "multiply", "divide", "maximum", "minimum",
    ] {
        run(op, &p, &[&format!("gv = R.{op}(x, y)")]);
    }
    run("power", &p, &["a = R.abs(x)", "gv = R.power(a, y)"]);
    let p1 = format!("x: {}", tensor_ty("3, 5, 7", "float32"));
    for op in [
        "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "negative", "abs",
    ] {
        run(op, &p1, &[&format!("gv = R.{op}(x)")]);
    }
    for op in ["relu", "gelu", "gelu_tanh", "silu"] {
        run(op, &p1, &[&format!("gv = R.nn.{op}(x)")]);
    }
    run(
        "clip",
        &p1,
        &["gv = R.clip(x, R.prim_value(-0.5), R.prim_value(0.25))"],
    );
    run("astype f16", &p1, &["gv = R.astype(x, dtype=\"float16\")"]);
    run(
        "astype i32",
        &p1,
        &[
            "a = R.multiply(x, R.const(10.0, \"float32\"))",
            "gv = R.astype(a, dtype=\"int32\")",
        ],
    );
    run(
        "broadcast_to",
        &format!("x: {}", tensor_ty("1, 5", "float32")),
        &["gv = R.broadcast_to(x, R.shape([3, 5]))"],
    );
}

#[test]
fn half_precision_chains() {
    for dt in ["float16", "bfloat16"] {
        let p = format!("x: R.Tensor((4, 16), dtype=\"{dt}\"), b: R.Tensor((16,), dtype=\"{dt}\")");
        run(
            dt,
            &p,
            &[
                "a = R.add(x, b)",
                "c = R.nn.gelu(a)",
                "gv = R.multiply(c, x)",
            ],
        );
    }
}

#[test]
fn matmul_and_conv() {
    run(
        "matmul 2d",
        &format!(
            "a: {}, b: {}",
            tensor_ty("5, 7", "float32"),
            tensor_ty("7, 3", "float32")
        ),
        &["gv = R.matmul(a, b)"],
    );
    run(
        "matmul batched broadcast",
        &format!(
            "a: {}, b: {}",
            tensor_ty("2, 1, 5, 7", "float32"),
            tensor_ty("3, 7, 4", "float32")
        ),
        &["gv = R.matmul(a, b)"],
    );
    run(
        "matmul vec",
        &format!(
            "a: {}, b: {}",
            tensor_ty("7,", "float32"),
            tensor_ty("7, 3", "float32")
        ),
        &["gv = R.matmul(a, b)"],
    );
    run(
        "conv2d",
        &format!(
            "x: {}, w: {}",
            tensor_ty("1, 4, 9, 9", "float32"),
            tensor_ty("6, 4, 3, 3", "float32")
        ),
        &["gv = R.nn.conv2d(x, w, strides=[2, 2], padding=[1, 1, 1, 1])"],
    );
    run(
        "conv2d grouped dilated",
        &format!(
            "x: {}, w: {}",
            tensor_ty("2, 4, 8, 8", "float32"),
            tensor_ty("4, 2, 3, 3", "float32")
        ),
        &["gv = R.nn.conv2d(x, w, padding=[2, 1, 2, 1], dilation=[2, 1], groups=2)"],
    );
    run(
        "conv2d nhwc",
        &format!(
            "x: {}, w: {}",
            tensor_ty("1, 6, 6, 3", "float32"),
            tensor_ty("5, 3, 3, 3", "float32")
        ),
        &[
            "gv = R.nn.conv2d(x, w, padding=[1, 1, 1, 1], data_layout=\"NHWC\", kernel_layout=\"OHWI\", out_layout=\"NHWC\")",
        ],
    );
}

#[test]
fn pooling() {
    let p = format!("x: {}", tensor_ty("1, 3, 9, 9", "float32"));
    run(
        "max_pool2d",
        &p,
        &["gv = R.nn.max_pool2d(x, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1])"],
    );
    run(
        "max_pool2d ceil",
        &p,
        &["gv = R.nn.max_pool2d(x, pool_size=[2, 2], strides=[2, 2], ceil_mode=True)"],
    );
    run(
        "avg_pool2d",
        &p,
        &["gv = R.nn.avg_pool2d(x, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1])"],
    );
    run(
        "avg_pool2d include pad",
        &p,
        &[
            "gv = R.nn.avg_pool2d(x, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1], count_include_pad=True, ceil_mode=True)",
        ],
    );
    run(
        "adaptive_avg_pool2d",
        &p,
        &["gv = R.nn.adaptive_avg_pool2d(x, output_size=[4, 2])"],
    );
    run(
        "adaptive_avg_pool2d global",
        &p,
        &["gv = R.nn.adaptive_avg_pool2d(x, output_size=[1, 1])"],
    );
}

#[test]
fn reductions_and_norms() {
    let p = format!("x: {}", tensor_ty("3, 4, 10", "float32"));
    for op in ["sum", "mean", "max"] {
        run(op, &p, &[&format!("gv = R.{op}(x, axis=[-1])")]);
        run(
            op,
            &p,
            &[&format!("gv = R.{op}(x, axis=[1], keepdims=True)")],
        );
        run(op, &p, &[&format!("gv = R.{op}(x)")]);
    }
    run("softmax", &p, &["gv = R.nn.softmax(x, axis=-1)"]);
    run("softmax axis 1", &p, &["gv = R.nn.softmax(x, axis=1)"]);
    run("log_softmax", &p, &["gv = R.nn.log_softmax(x, axis=-1)"]);
    run(
        "layer_norm",
        &format!(
            "x: {}, g: {}, b: {}",
            tensor_ty("3, 4, 10", "float32"),
            tensor_ty("10,", "float32"),
            tensor_ty("10,", "float32")
        ),
        &["gv = R.nn.layer_norm(x, g, b, axes=[-1])"],
    );
    run(
        "layer_norm 2 axes",
        &format!(
            "x: {}, g: {}, b: {}",
            tensor_ty("3, 4, 10", "float32"),
            tensor_ty("4, 10", "float32"),
            tensor_ty("4, 10", "float32")
        ),
        &["gv = R.nn.layer_norm(x, g, b, axes=[1, 2])"],
    );
    run(
        "rms_norm",
        &format!(
            "x: {}, w: {}",
            tensor_ty("3, 4, 10", "float32"),
            tensor_ty("10,", "float32")
        ),
        &["gv = R.nn.rms_norm(x, w, axes=[-1])"],
    );
    run(
        "batch_norm",
        &format!(
            "x: {}, g: {}, b: {}, m: {}, v: {}",
            tensor_ty("2, 4, 3, 3", "float32"),
            tensor_ty("4,", "float32"),
            tensor_ty("4,", "float32"),
            tensor_ty("4,", "float32"),
            tensor_ty("4,", "float32")
        ),
        &[
            "va = R.abs(v)",
            "bn = R.nn.batch_norm(x, g, b, m, va, axis=1, training=False)",
            "gv = bn[0]",
        ],
    );
    run(
        "lrn",
        &format!("x: {}", tensor_ty("1, 7, 3, 3", "float32")),
        &["gv = R.nn.lrn(x, size=3, alpha=0.0001, beta=0.75, bias=1.0)"],
    );
    run(
        "dropout",
        &format!("x: {}", tensor_ty("4, 4", "float32")),
        &["d = R.nn.dropout(x, rate=0.5)", "gv = d[0]"],
    );
}

#[test]
fn data_movement() {
    let p = format!("x: {}", tensor_ty("2, 3, 4", "float32"));
    run("reshape", &p, &["gv = R.reshape(x, R.shape([4, 6]))"]);
    run(
        "reshape 1s",
        &p,
        &["gv = R.reshape(x, R.shape([2, 1, 3, 4]))"],
    );
    run("flatten", &p, &["gv = R.flatten(x)"]);
    run("permute", &p, &["gv = R.permute_dims(x, axes=[2, 0, 1])"]);
    run("permute default", &p, &["gv = R.permute_dims(x)"]);
    let p5 = format!("x: {}", tensor_ty("2, 32, 3, 2", "float32"));
    run(
        "layout_transform NCHW to NCHW16c and back",
        &p5,
        &[
            "y = R.layout_transform(x, index_map=lambda n, c, h, w: (n, c // 16, h, w, c % 16))",
            "gv = R.layout_transform(y, index_map=lambda n, c, h, w, c1: (n, c * 16 + c1, h, w))",
        ],
    );
    run(
        "layout_transform split ahead",
        &p5,
        &["gv = R.layout_transform(x, index_map=lambda a, b, c, d: (b % 8, d, a, c, b // 8))"],
    );
    run("expand_dims", &p, &["gv = R.expand_dims(x, axis=[1])"]);
    run(
        "squeeze",
        &format!("x: {}", tensor_ty("2, 1, 4", "float32")),
        &["gv = R.squeeze(x, axis=[1])"],
    );
    run(
        "concat",
        &format!(
            "x: {}, y: {}",
            tensor_ty("2, 3", "float32"),
            tensor_ty("2, 5", "float32")
        ),
        &["t = (x, y)", "gv = R.concat(t, axis=1)"],
    );
    run(
        "split",
        &format!("x: {}", tensor_ty("4, 6", "float32")),
        &[
            "t = R.split(x, indices_or_sections=[1, 4], axis=1)",
            "gv = t[1]",
        ],
    );
    run(
        "strided_slice",
        &format!("x: {}", tensor_ty("5, 8", "float32")),
        &["gv = R.strided_slice(x, axes=[1], begin=[1], end=[7], strides=[2])"],
    );
    run(
        "strided_slice negative",
        &format!("x: {}", tensor_ty("5, 8", "float32")),
        &["gv = R.strided_slice(x, axes=[0, 1], begin=[-1, 6], end=[0, -9], strides=[-2, -3])"],
    );
    run(
        "take",
        &format!(
            "x: {}, i: R.Tensor((2, 2), dtype=\"int64\")",
            tensor_ty("3, 4", "float32")
        ),
        &["gv = R.take(x, i, axis=1)"],
    );
    run(
        "take flat",
        &format!(
            "x: {}, i: R.Tensor((5,), dtype=\"int32\")",
            tensor_ty("3, 4", "float32")
        ),
        &["gv = R.take(x, i)"],
    );
}

#[test]
fn tuple_outputs_and_row_kernels() {
    // Residual add + layer_norm with the sum also an output: one row kernel writes both.
    let src = "@I.ir_module\nclass Module:\n    @R.function\n    def main(a: R.Tensor((6, 40), dtype=\"float16\"), b: R.Tensor((6, 40), dtype=\"float16\"), g: R.Tensor((40,), dtype=\"float16\"), h: R.Tensor((40,), dtype=\"float16\")):\n        with R.dataflow():\n            s = R.add(a, b)\n            n = R.nn.layer_norm(s, g, h, axes=[-1])\n            r = R.nn.relu(n)\n            m = R.mean(s, axis=[1])\n            R.output(s, r, m)\n        return (s, r, m)\n";
    let m = parse_module_str(src).unwrap();
    let f = m.get("main").unwrap();
    let low = fusebox_cuda::lower::lower("main", f).unwrap();
    assert_eq!(low.kernels.len(), 1, "{:#?}", low.kernels.len());
    let k = &low.kernels[0];
    assert!(k.is_row());
    assert_eq!(
        k.stats.len(),
        3,
        "layer_norm's sum and squared deviations, and the mean's sum"
    );
    let args = random_args(&m, "main", 3);
    check_function(&m, "main", &args, None).unwrap();
}

#[test]
fn index_ops() {
    let i64t = |shape: &str| format!("R.Tensor(({shape}), dtype=\"int64\")");
    let i32t = |shape: &str| format!("R.Tensor(({shape}), dtype=\"int32\")");
    // Random index tensors hold 0..=2, so every indexed extent here is at least 3.
    run(
        "gather_elements",
        &format!("x: {}, i: {}", tensor_ty("3, 4", "float32"), i64t("3, 2")),
        &["gv = R.gather_elements(x, i, axis=1)"],
    );
    run(
        "gather_elements axis 0",
        &format!("x: {}, i: {}", tensor_ty("3, 4", "float32"), i32t("2, 4")),
        &["gv = R.gather_elements(x, i, axis=0)"],
    );
    run(
        "gather_nd",
        &format!(
            "x: {}, i: {}",
            tensor_ty("3, 4, 5", "float32"),
            i64t("6, 2")
        ),
        &["gv = R.gather_nd(x, i)"],
    );
    run(
        "gather_nd batch",
        &format!(
            "x: {}, i: {}",
            tensor_ty("2, 3, 4", "float32"),
            i32t("2, 5, 1")
        ),
        &["gv = R.gather_nd(x, i, batch_dims=1)"],
    );
    run(
        "one_hot",
        &format!("i: {}", i64t("4, 3")),
        &[
            "gv = R.one_hot(i, R.prim_value(T.float32(2.5)), R.prim_value(T.float32(-1.0)), depth=5, axis=1)",
        ],
    );
    run(
        "one_hot int",
        &format!("i: {}", i32t("7,")),
        &["gv = R.one_hot(i, R.prim_value(1), R.prim_value(0), depth=3)"],
    );
    run(
        "arange in a chain",
        &format!("x: {}", tensor_ty("4, 6", "float32")),
        &[
            "r = R.arange(start=0.5, end=3.5, step=0.5, dtype=\"float32\")",
            "gv = R.add(x, r)",
        ],
    );
    run(
        "arange int",
        &format!("x: {}", tensor_ty("5,", "float32")),
        &[
            "r = R.arange(start=10, end=0, step=-2)",
            "c = R.astype(r, dtype=\"float32\")",
            "gv = R.multiply(x, c)",
        ],
    );
    run(
        "arange alone",
        "",
        &[
            "r = R.arange(start=2.0, end=-1.0, step=-0.5, dtype=\"float16\")",
            "gv = R.nn.relu(r)",
        ],
    );
    run(
        "tile",
        &format!("x: {}", tensor_ty("2, 3", "float32")),
        &["gv = R.tile(x, repeats=[2, 1, 3])"],
    );
    for (name, k) in [("tril", -1), ("tril", 0), ("triu", 1), ("triu", -2)] {
        run(
            &format!("{name} k={k}"),
            &format!("x: {}", tensor_ty("2, 4, 5", "float32")),
            &[format!("gv = R.{name}(x, k={k})").as_str()],
        );
    }
    run(
        "tril int",
        &format!("x: {}", i64t("4, 4")),
        &["gv = R.tril(x)"],
    );
    for mode in ["constant", "reflect", "replicate", "circular"] {
        run(
            &format!("pad {mode}"),
            &format!("x: {}", tensor_ty("2, 3, 4", "float32")),
            &[format!(
                "gv = R.nn.pad(x, pad_width=[0, 0, 2, 3, -1, 5], pad_value=1.5, pad_mode=\"{mode}\")"
            )
            .as_str()],
        );
    }
    run(
        "pad then relu",
        "x: R.Tensor((3, 3), dtype=\"float16\")",
        &[
            "p = R.nn.pad(x, pad_width=[1, 1, 1, 1], pad_value=-2.0)",
            "gv = R.nn.relu(p)",
        ],
    );
}

#[test]
fn opaque_index_ops_stay_on_the_cpu() {
    for body in [
        "gv = R.cumsum(x, axis=1)",
        "gv = R.cumprod(x, axis=0)",
        "gv = R.scatter_elements(x, i, x, axis=0)",
    ] {
        let src = format!(
            "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: R.Tensor((3, 3), dtype=\"float32\"), i: R.Tensor((3, 3), dtype=\"int64\")):\n        with R.dataflow():\n            {body}\n            R.output(gv)\n        return gv\n"
        );
        let m = parse_module_str(&src).unwrap();
        let e = fusebox_cuda::lower::lower("main", m.get("main").unwrap()).unwrap_err();
        assert!(e.to_string().contains("opaque op"), "{body}: {e}");
    }
}
