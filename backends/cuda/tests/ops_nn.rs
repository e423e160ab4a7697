//! The `nn` family ops of issue 17 (`relax.nn.conv2d_transpose`, `relax.image.resize2d`):
//! lowered to the kernel IR, evaluated on the CPU against the CPU reference (every element, per
//! dtype tolerance), and compiled to CUBIN with NVRTC where it is available.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

mod check;

use check::{lower_check_compile as run, module, tensor_ty};
use fusebox_core::text::parse_module_str;

fn conv_t(attrs: &str) -> String {
    format!(
        "gv = R.nn.conv2d_transpose(x, w, {attrs}, data_layout=\"NCHW\", kernel_layout=\"IOHW\", out_layout=\"NCHW\", out_dtype=None)"
    )
}

#[test]
fn conv2d_transpose_lowers_and_matches_the_reference() {
    for (dt, x, w, attrs) in [
        (
            "float32",
            "2, 4, 3, 5",
            "4, 3, 3, 3",
            "strides=[1, 1], padding=[0, 0, 0, 0], output_padding=[0, 0], dilation=[1, 1], groups=1",
        ),
        (
            "float32",
            "1, 4, 3, 4",
            "4, 2, 3, 2",
            "strides=[2, 3], padding=[1, 0, 0, 1], output_padding=[1, 2], dilation=[1, 1], groups=2",
        ),
        (
            "float32",
            "1, 2, 4, 4",
            "2, 1, 2, 3",
            "strides=[3, 2], padding=[1, 1, 1, 1], output_padding=[0, 1], dilation=[2, 2], groups=1",
        ),
        (
            "float16",
            "1, 2, 3, 3",
            "2, 2, 3, 3",
            "strides=[2, 2], padding=[0, 0, 0, 0], output_padding=[1, 1], dilation=[1, 1], groups=1",
        ),
        (
            "float64",
            "1, 3, 2, 3",
            "3, 1, 2, 2",
            "strides=[1, 2], padding=[0, 1, 0, 0], output_padding=[0, 0], dilation=[1, 1], groups=3",
        ),
    ] {
        let p = format!("x: {}, w: {}", tensor_ty(x, dt), tensor_ty(w, dt));
        let k = run(
            &format!("conv2d_transpose {dt} {attrs}"),
            &p,
            &[&conv_t(attrs)],
        );
        assert_eq!(k, 1);
    }
    // Fused with a bias add and a relu: one kernel.
    let p = format!(
        "x: {}, w: {}, b: {}",
        tensor_ty("1, 2, 3, 3", "float32"),
        tensor_ty("2, 3, 2, 2", "float32"),
        tensor_ty("1, 3, 1, 1", "float32")
    );
    let body = [
        "y = R.nn.conv2d_transpose(x, w, strides=[2, 2])",
        "z = R.add(y, b)",
        "gv = R.nn.relu(z)",
    ];
    assert_eq!(run("conv2d_transpose_bias_relu", &p, &body), 1);
}

fn resize(size: &str, attrs: &str) -> String {
    format!("gv = R.image.resize2d(x, R.shape([{size}]), {attrs})")
}

#[test]
fn resize2d_lowers_and_matches_the_reference() {
    let x = "1, 2, 4, 5";
    for (size, attrs) in [
        (
            "8, 10",
            "method=\"nearest_neighbor\", coordinate_transformation_mode=\"asymmetric\", rounding_method=\"floor\"",
        ),
        (
            "3, 7",
            "method=\"nearest_neighbor\", coordinate_transformation_mode=\"half_pixel\", rounding_method=\"round_prefer_ceil\"",
        ),
        (
            "7, 3",
            "method=\"nearest_neighbor\", coordinate_transformation_mode=\"tf_half_pixel_for_nn\", rounding_method=\"round_prefer_floor\"",
        ),
        (
            "8, 9",
            "method=\"linear\", coordinate_transformation_mode=\"half_pixel\"",
        ),
        (
            "3, 3",
            "method=\"linear\", coordinate_transformation_mode=\"align_corners\"",
        ),
        (
            "6, 2",
            "method=\"linear\", coordinate_transformation_mode=\"pytorch_half_pixel\"",
        ),
        (
            "9, 8",
            "method=\"cubic\", coordinate_transformation_mode=\"half_pixel\", cubic_alpha=-0.75",
        ),
        (
            "3, 4",
            "method=\"cubic\", coordinate_transformation_mode=\"asymmetric\", cubic_alpha=-0.5, cubic_exclude=1",
        ),
        (
            "5, 5",
            "roi=[0.2, 0.1, 1.3, 0.9], method=\"linear\", coordinate_transformation_mode=\"tf_crop_and_resize\", extrapolation_value=-3.0",
        ),
        (
            "4, 6",
            "roi=[-0.5, 0.0, 0.8, 1.0], method=\"nearest_neighbor\", coordinate_transformation_mode=\"tf_crop_and_resize\", extrapolation_value=7.0",
        ),
    ] {
        for dt in ["float32", "float16"] {
            let p = format!("x: {}", tensor_ty(x, dt));
            let k = run(
                &format!("resize2d {dt} {size} {attrs}"),
                &p,
                &[&resize(size, attrs)],
            );
            assert_eq!(k, 1);
        }
    }
    // Nearest on integers is an exact gather.
    for dt in ["int32", "int64", "uint8"] {
        let p = format!("x: {}", tensor_ty(x, dt));
        let body = [resize(
            "7, 11",
            "method=\"nearest_neighbor\", coordinate_transformation_mode=\"asymmetric\", rounding_method=\"floor\"",
        )];
        run(&format!("resize2d nearest {dt}"), &p, &[&body[0]]);
    }
    // Linear on integers stays on the CPU.
    let src = module(
        "resize_int_linear",
        &format!("x: {}", tensor_ty(x, "int32")),
        &[&resize("8, 8", "method=\"linear\"")],
    );
    let m = parse_module_str(&src).unwrap();
    let err = fusebox_cuda::lower::lower("resize_int_linear", m.get("resize_int_linear").unwrap())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("integer"), "{err}");
}

#[test]
fn group_and_instance_norm_lower_and_match_the_reference() {
    for dt in ["float32", "float16", "float64"] {
        let p = format!(
            "x: {}, g: {}, b: {}",
            tensor_ty("2, 6, 3, 4", dt),
            tensor_ty("6,", dt),
            tensor_ty("6,", dt)
        );
        let k = run(
            &format!("group_norm {dt}"),
            &p,
            &["gv = R.nn.group_norm(x, g, b, num_groups=3, channel_axis=1, axes=[2, 3])"],
        );
        assert_eq!(k, 1);
        run(
            &format!("instance_norm {dt}"),
            &p,
            &["gv = R.nn.instance_norm(x, g, b, channel_axis=1, axes=[2, 3], center=False)"],
        );
    }
    // Channel last, groups over the last axis, normalised over the middle one.
    let p = format!(
        "x: {}, g: {}, b: {}",
        tensor_ty("2, 5, 4", "float32"),
        tensor_ty("4,", "float32"),
        tensor_ty("4,", "float32")
    );
    run(
        "group_norm channel last",
        &p,
        &["gv = R.nn.group_norm(x, g, b, num_groups=2, channel_axis=-1, axes=[1], scale=False)"],
    );
}

/// Row kernels whose rows are one axis, a whole number of 16-byte vectors long, with each
/// thread caching whole vectors (f16 softmax over 4,096 and 8,192 columns: a block per row;
/// f16 LayerNorm over 768 and f16 softmax over 1,000: a warp per row, the last with lanes past
/// the row; f32 softmax over 1,024) read and write their rows 16 bytes at a time; a row of
/// 1,001 columns, or a softmax over a middle axis, keeps scalar accesses. A softmax computes
/// each exponential once (kept in registers from the sum pass). Each is checked against the
/// CPU reference and compiled with NVRTC (no spills).
#[test]
fn row_kernels_move_16_bytes_at_a_time_where_the_row_allows() {
    let cases: [(&str, &str, &str, &[&str], bool); 7] = [
        (
            "sm f16 4096",
            "4, 4096",
            "float16",
            &["gv = R.nn.softmax(x, axis=-1)"],
            true,
        ),
        (
            "sm f16 8192",
            "2, 8192",
            "float16",
            &["gv = R.nn.softmax(x, axis=-1)"],
            true,
        ),
        (
            "sm f16 1000",
            "6, 1000",
            "float16",
            &["gv = R.nn.softmax(x, axis=-1)"],
            true,
        ),
        (
            "sm f32 1024",
            "5, 1024",
            "float32",
            &["gv = R.nn.softmax(x, axis=-1)"],
            true,
        ),
        (
            "ln f16 768",
            "9, 768",
            "float16",
            &["gv = R.nn.layer_norm(x, g, b, axes=[-1])"],
            true,
        ),
        (
            "sm f16 1001",
            "3, 1001",
            "float16",
            &["gv = R.nn.softmax(x, axis=-1)"],
            false,
        ),
        (
            "sm f16 axis 1",
            "2, 1024, 8",
            "float16",
            &["gv = R.nn.softmax(x, axis=1)"],
            false,
        ),
    ];
    for (name, shape, dt, body, vector) in cases {
        let cols = shape.rsplit(", ").next().unwrap_or("1");
        let mut params = format!("x: {}", tensor_ty(shape, dt));
        if body[0].contains("layer_norm") {
            params.push_str(&format!(
                ", g: {}, b: {}",
                tensor_ty(&format!("{cols},"), dt),
                tensor_ty(&format!("{cols},"), dt)
            ));
        }
        run(name, &params, body);
        let fname = fusebox_cuda::lower::sanitize(name);
        let m = parse_module_str(&module(&fname, &params, body)).unwrap();
        let low = fusebox_cuda::lower::lower(&fname, m.get(&fname).unwrap()).unwrap();
        let src: String = low.kernels.iter().map(fusebox_cuda::emit::emit).collect();
        let loads = src.contains("*reinterpret_cast<uint4*>(cache");
        let stores = src.contains("*reinterpret_cast<uint4*>(out0 + row");
        assert_eq!((loads, stores), (vector, vector), "{name}:\n{src}");
        // The exponentials the sum pass computed are kept for the output pass (up to 32 per
        // lane of a warp per row, 16 per thread of a block per row: 8,192 columns over 256
        // threads compute them again).
        if vector && name.starts_with("sm") {
            let want = if name.contains("8192") { 2 } else { 1 };
            assert_eq!(src.matches("expf(").count(), want, "{name}:\n{src}");
        }
        // f16 outputs: `__expf` and one reciprocal of the sum per row; f32 outputs: the
        // accurate `expf` and an IEEE division.
        if name.starts_with("sm") {
            let fast = dt == "float16";
            assert_eq!(src.contains("__expf("), fast, "{name}:\n{src}");
            assert_eq!(src.contains("* __frcp_rn(s1))"), fast, "{name}:\n{src}");
            assert_eq!(src.contains(" / s1)"), !fast, "{name}:\n{src}");
        }
    }
}
