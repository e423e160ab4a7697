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
use fusebox_cuda::testing as common;

use check::{check_function, random_args};
use fusebox_core::text::parse_module_str;
use fusebox_cuda::nvrtc::{Arch, CompileOptions};

/// `main(params) { body }` with a dataflow block whose last binding is the output.
fn module(name: &str, params: &str, body: &[&str]) -> String {
    let mut s = format!(
        "@I.ir_module\nclass Module:\n    @R.function\n    def {name}({params}):\n        with R.dataflow():\n"
    );
    for b in body {
        s.push_str(&format!("            {b}\n"));
    }
    let last = body
        .last()
        .and_then(|b| b.split('=').next())
        .map(str::trim)
        .unwrap_or("gv");
    s.push_str(&format!(
        "            R.output({last})\n        return {last}\n"
    ));
    s
}

fn t(shape: &str, dt: &str) -> String {
    format!("R.Tensor(({shape}), dtype=\"{dt}\")")
}

/// Checks the lowering of `body` against the CPU reference on three random inputs and
/// compiles its kernels; returns the kernel count.
fn run(name: &str, params: &str, body: &[&str]) -> usize {
    let fname = fusebox_cuda::lower::sanitize(name);
    let src = module(&fname, params, body);
    let m = parse_module_str(&src).unwrap_or_else(|e| panic!("{name}: {e}\n{src}"));
    let mut kernels = 0;
    for seed in [1u64, 7, 42] {
        let args = random_args(&m, &fname, seed);
        let (k, _) = check_function(&m, &fname, &args, None)
            .unwrap_or_else(|e| panic!("{name} (seed {seed}): {e}\n{src}"));
        kernels = k;
    }
    if common::nvrtc_or_skip(name) {
        let low = fusebox_cuda::lower::lower(&fname, m.get(&fname).unwrap()).unwrap();
        for k in &low.kernels {
            let src = fusebox_cuda::emit::emit(k);
            for arch in [Arch::Sm80, Arch::Sm90] {
                let opts = CompileOptions::default();
                fusebox_cuda::compile_cached(None, &src, &k.name, arch, &opts)
                    .unwrap_or_else(|e| panic!("{name}: {e}\n{src}"));
            }
        }
    }
    kernels
}

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
        let p = format!("x: {}, w: {}", t(x, dt), t(w, dt));
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
        t("1, 2, 3, 3", "float32"),
        t("2, 3, 2, 2", "float32"),
        t("1, 3, 1, 1", "float32")
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
            let p = format!("x: {}", t(x, dt));
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
        let p = format!("x: {}", t(x, dt));
        let body = [resize(
            "7, 11",
            "method=\"nearest_neighbor\", coordinate_transformation_mode=\"asymmetric\", rounding_method=\"floor\"",
        )];
        run(&format!("resize2d nearest {dt}"), &p, &[&body[0]]);
    }
    // Linear on integers stays on the CPU.
    let src = module(
        "resize_int_linear",
        &format!("x: {}", t(x, "int32")),
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
            t("2, 6, 3, 4", dt),
            t("6,", dt),
            t("6,", dt)
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
        t("2, 5, 4", "float32"),
        t("4,", "float32"),
        t("4,", "float32")
    );
    run(
        "group_norm channel last",
        &p,
        &["gv = R.nn.group_norm(x, g, b, num_groups=2, channel_axis=-1, axes=[1], scale=False)"],
    );
}
