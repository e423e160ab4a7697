//! Property test: for random CNN modules (NCHW convolutions of random strides, padding, groups
//! and kernel sizes, bias and residual adds, per-channel scales of rank 1 to 4, relu, clip,
//! scalar operands, the three pools, a reshape that needs the original layout) and a random
//! desired layout (any permutation of NCHW for the data, of OIHW for the kernel), ConvertLayout
//! gives a module that verifies, every `conv2d` of which has the desired layouts, and that
//! computes the same values on the CPU as the module it was given (the same ops on the same
//! values: only where elements lie differs, so the results agree to rounding of the
//! convolutions' different summation paths).

#![allow(clippy::panic, reason = "test code: a failure is a panic")]

use fusebox_core::ir::verify::verify;
use fusebox_core::text::{parse_module_str, print_module};
use fusebox_core::transform::convert_layout;
use fusebox_cpu::{Tensor, Value};
use proptest::prelude::*;

/// One step of the random chain after a convolution.
#[derive(Clone, Debug)]
enum Step {
    Bias,
    Scale(usize),
    Relu,
    Clip,
    Scalar,
    Residual,
    Conv { k: usize, s: usize, groups: bool },
    MaxPool,
    AvgPool,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        Just(Step::Bias),
        (1usize..=4).prop_map(Step::Scale),
        Just(Step::Relu),
        Just(Step::Clip),
        Just(Step::Scalar),
        Just(Step::Residual),
        (
            prop_oneof![Just(1usize), Just(3)],
            1usize..=2,
            any::<bool>()
        )
            .prop_map(|(k, s, groups)| Step::Conv { k, s, groups }),
        Just(Step::MaxPool),
        Just(Step::AvgPool),
    ]
}

fn perm(letters: &'static str) -> impl Strategy<Value = String> {
    Just(letters.chars().collect::<Vec<_>>())
        .prop_shuffle()
        .prop_map(|v| v.into_iter().collect())
}

/// The module text for a chain starting with a 3×3 conv of 4 → 8 channels on 9×9, its params
/// (name, shape), and its output shape.
fn module_of(steps: &[Step]) -> (String, Vec<(String, Vec<usize>)>) {
    let c = 8usize;
    let mut hw = 9usize;
    let mut params: Vec<(String, Vec<usize>)> = vec![
        ("x".into(), vec![1, 4, 9, 9]),
        ("w0".into(), vec![c, 4, 3, 3]),
    ];
    let t = |hw: usize| format!("R.Tensor((1, {c}, {hw}, {hw}), dtype=\"float32\")");
    let mut body = vec![format!(
        "v0: {} = R.nn.conv2d(x, w0, strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout=\"NCHW\", kernel_layout=\"OIHW\", out_layout=\"NCHW\", out_dtype=\"void\")",
        t(hw)
    )];
    // The last value and the last value of the current size (for a residual).
    let mut last = "v0".to_string();
    for (i, s) in steps.iter().enumerate() {
        let v = format!("v{}", i + 1);
        let p = format!("p{}", i + 1);
        let line = match s {
            Step::Bias => {
                params.push((p.clone(), vec![1, c, 1, 1]));
                format!("{v}: {} = R.add({last}, {p})", t(hw))
            }
            Step::Scale(r) => {
                let shape: Vec<usize> = [1, c, 1, 1][4 - r..].to_vec();
                params.push((p.clone(), shape));
                format!("{v}: {} = R.multiply({p}, {last})", t(hw))
            }
            Step::Relu => format!("{v}: {} = R.nn.relu({last})", t(hw)),
            Step::Clip => format!(
                "{v}: {} = R.clip({last}, R.prim_value(-1), R.prim_value(1))",
                t(hw)
            ),
            Step::Scalar => format!("{v}: {} = R.add({last}, R.const(0.5, \"float32\"))", t(hw)),
            Step::Residual => format!("{v}: {} = R.add({last}, {last})", t(hw)),
            Step::Conv { k, s, groups } => {
                let pad = k / 2;
                let out = (hw + 2 * pad - k) / s + 1;
                let g = if *groups { c } else { 1 };
                params.push((p.clone(), vec![c, c / g, *k, *k]));
                let line = format!(
                    "{v}: {} = R.nn.conv2d({last}, {p}, strides=[{s}, {s}], padding=[{pad}, {pad}, {pad}, {pad}], dilation=[1, 1], groups={g}, data_layout=\"NCHW\", kernel_layout=\"OIHW\", out_layout=\"NCHW\", out_dtype=\"void\")",
                    t(out)
                );
                hw = out;
                line
            }
            Step::MaxPool | Step::AvgPool => {
                let out = hw / 2;
                if out == 0 {
                    format!("{v}: {} = R.nn.relu({last})", t(hw))
                } else {
                    let op = if matches!(s, Step::MaxPool) {
                        "max_pool2d"
                    } else {
                        "avg_pool2d"
                    };
                    let line = format!(
                        "{v}: {} = R.nn.{op}({last}, pool_size=[2, 2], strides=[2, 2], dilation=[1, 1], padding=[0, 0, 0, 0], ceil_mode=False, count_include_pad=False, layout=\"NCHW\", out_layout=\"NCHW\")",
                        t(out)
                    );
                    hw = out;
                    line
                }
            }
        };
        body.push(line);
        last = v;
    }
    let n = c * hw * hw;
    body.push(format!(
        "g: R.Tensor((1, 8, 1, 1), dtype=\"float32\") = R.nn.adaptive_avg_pool2d({last}, output_size=[1, 1], layout=\"NCHW\", out_layout=\"NCHW\")"
    ));
    body.push(format!(
        "f: R.Tensor((1, {n}), dtype=\"float32\") = R.reshape({last}, R.shape([1, {n}]))"
    ));
    body.push(
        "gv: R.Tuple(R.Tensor((1, 8, 1, 1), dtype=\"float32\"), R.Tensor((1, NN), dtype=\"float32\")) = (g, f)"
            .replace("NN", &n.to_string()),
    );
    let sig: Vec<String> = params
        .iter()
        .map(|(name, s)| {
            let dims: Vec<String> = s.iter().map(|d| d.to_string()).collect();
            let dims = if dims.len() == 1 {
                format!("{},", dims[0])
            } else {
                dims.join(", ")
            };
            format!("{name}: R.Tensor(({dims}), dtype=\"float32\")")
        })
        .collect();
    let text = format!(
        "@I.ir_module\nclass Module:\n    @R.function\n    def main({}) -> R.Tuple(R.Tensor((1, 8, 1, 1), dtype=\"float32\"), R.Tensor((1, {n}), dtype=\"float32\")):\n        with R.dataflow():\n{}\n            R.output(gv)\n        return gv\n",
        sig.join(", "),
        body.iter()
            .map(|l| format!("            {l}"))
            .collect::<Vec<_>>()
            .join("\n"),
    );
    (text, params)
}

fn values(shape: &[usize], seed: usize) -> Tensor {
    let n: usize = shape.iter().product();
    let v = (0..n)
        .map(|i| (((i * 7919 + seed * 131) % 1000) as f32) / 500.0 - 1.0)
        .collect();
    Tensor::from_f32(shape.to_vec(), v).unwrap_or_else(|e| panic!("{e}"))
}

fn flat(v: Value) -> Vec<f32> {
    match v {
        Value::Tensor(t) => t.to_f32_vec(),
        Value::Tuple(items) => items.into_iter().flat_map(flat).collect(),
        other => panic!("unexpected {other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn convert_layout_keeps_the_values(
        steps in prop::collection::vec(step(), 0..8),
        data in perm("NCHW"),
        kernel in perm("OIHW"),
    ) {
        let (src, params) = module_of(&steps);
        let m = parse_module_str(&src).unwrap_or_else(|e| panic!("{e}\n{src}"));
        let out = convert_layout(&m, &data, &kernel).unwrap_or_else(|e| panic!("{e}"));
        let printed = print_module(&out).text;
        if let Err(e) = verify(&out) {
            panic!("does not verify: {e}\n{printed}");
        }
        let convs = printed.matches("R.nn.conv2d(").count();
        let converted = printed
            .matches(&format!("data_layout=\"{data}\", kernel_layout=\"{kernel}\", out_layout=\"{data}\""))
            .count();
        prop_assert_eq!(convs, converted, "every conv2d in {} / {}:\n{}", data, kernel, printed);
        let args: Vec<Value> = params
            .iter()
            .enumerate()
            .map(|(i, (_, s))| Value::Tensor(values(s, i)))
            .collect();
        let want = flat(fusebox_cpu::run(&m, "main", args.clone()).unwrap_or_else(|e| panic!("{e}")));
        let got = flat(fusebox_cpu::run(&out, "main", args).unwrap_or_else(|e| panic!("{e}\n{printed}")));
        prop_assert_eq!(want.len(), got.len());
        let scale = want.iter().fold(1.0f32, |a, v| a.max(v.abs()));
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            prop_assert!(
                (w - g).abs() <= 1e-4 * scale,
                "element {i}: {w} vs {g} ({data} / {kernel})\n{printed}"
            );
        }
    }
}
