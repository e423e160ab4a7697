//! `[partition] conv2d_layout` (ConvertLayout before partitioning): with the CUTLASS backend's
//! config, the NCHW convolutions of a model become NHWC/OHWI ones the `cutlass` patterns claim
//! (TVM's CUTLASS conv2d needs that layout); on the CPU, the converted module computes what the
//! model computes (`fusebox run --check` against the unconverted, unpartitioned module).

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

use fusebox::core::config::Config;
use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `configs/examples/cutlass.toml` with `conv2d_layout` added (or not) to its `[partition]`.
fn cutlass_config(layout: bool) -> Config {
    let path = root().join("configs/examples/cutlass.toml");
    let src = std::fs::read_to_string(&path).unwrap();
    let src = if layout {
        src.replace(
            "[partition]\n",
            "[partition]\nconv2d_layout = [\"NHWC\", \"OHWI\"]\n",
        )
    } else {
        src
    };
    Config::parse(&src, &path.display().to_string()).unwrap()
}

/// The convolutions of `m` that sit in `Codegen = "cutlass"` functions (through their
/// composites), by data layout.
fn cutlass_convs(m: &fusebox::core::ir::Module) -> Vec<String> {
    let text = fusebox::core::text::print_module(m).text;
    let mut out = Vec::new();
    let mut in_cutlass = false;
    for line in text.lines() {
        if line.trim_start().starts_with("def ") {
            in_cutlass = false;
        }
        if line.contains("\"Composite\": \"cutlass.conv2d")
            || line.contains("\"Codegen\": \"cutlass\"")
        {
            in_cutlass = true;
        }
        if in_cutlass && line.contains("R.nn.conv2d(") {
            let layout = line
                .split("data_layout=\"")
                .nth(1)
                .and_then(|s| s.split('"').next())
                .unwrap_or("?");
            out.push(layout.to_string());
        }
    }
    out
}

#[test]
fn cutlass_claims_the_convolutions_once_they_are_nhwc() {
    fusebox::link_backends();
    let src = std::fs::read_to_string(root().join("examples/small_cnn.relax")).unwrap();
    let module = fusebox::core::text::parse_module_str(&src).unwrap();
    // As the model is (NCHW): the CUTLASS conv2d patterns take none of its four convolutions.
    let plain = fusebox::pipeline(cutlass_config(false)).unwrap();
    let (m, _) = plain.partition(&module).unwrap();
    assert!(cutlass_convs(&m).is_empty(), "{:?}", cutlass_convs(&m));
    // Converted: every convolution is NHWC and in a CUTLASS composite.
    let converted = fusebox::pipeline(cutlass_config(true)).unwrap();
    let (m, _) = converted.partition(&module).unwrap();
    let convs = cutlass_convs(&m);
    assert_eq!(
        convs,
        vec!["NHWC"; 4],
        "{}",
        fusebox::core::text::print_module(&m).text
    );
}

/// `fusebox run examples/small_cnn.relax` with `configs/cpu.toml` plus `conv2d_layout =
/// [data, kernel]` and `extra` arguments: the process's output.
fn run_small_cnn(layout: [&str; 2], extra: &[&str]) -> std::process::Output {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("convert_layout_cpu");
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("nhwc.toml");
    let cpu = std::fs::read_to_string(root().join("configs/cpu.toml")).unwrap();
    let line = format!(
        "[partition]\nconv2d_layout = [\"{}\", \"{}\"]\n",
        layout[0], layout[1]
    );
    std::fs::write(&config, cpu.replace("[partition]\n", &line)).unwrap();
    Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .arg("run")
        .arg(root().join("examples/small_cnn.relax"))
        .arg("--config")
        .arg(&config)
        .arg("--output-dir")
        .arg(dir.join("out"))
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn the_converted_cnn_computes_what_the_model_computes_on_the_cpu() {
    // NHWC, and the blocked layout: the convolutions of 16 and 32 channels run NCHW16c (the
    // stem's 3 input channels do not split, so it stays NCHW); the same outputs either way.
    for layout in [["NHWC", "OHWI"], ["NCHW16c", "OIHW"]] {
        let out = run_small_cnn(layout, &["--check"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{layout:?}: {stdout}\n{stderr}");
        assert!(
            stdout.contains("check: 2 output(s) match the unpartitioned module")
                || stderr.contains("check: 2 output(s) match the unpartitioned module"),
            "{layout:?}: {stdout}\n{stderr}"
        );
    }
    // A layout that is not a permutation is a config error naming the key and its line.
    let out = run_small_cnn(["NHWC", "OHWX"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let written = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("convert_layout_cpu/nhwc.toml"),
    )
    .unwrap();
    let line = 1 + written
        .lines()
        .position(|l| l.starts_with("conv2d_layout ="))
        .unwrap();
    assert!(
        stderr.contains(&format!("nhwc.toml:{line}:1")) && stderr.contains("permutation of OIHW"),
        "{stderr}"
    );
}

/// A network of two stages (MobileNetV2's shape in small): on 32 × 32, two blocks of a 1×1
/// expansion 24 → 48, a depthwise 3×3 and a 1×1 projection 48 → 24; then a stride-2 3×3
/// convolution 24 → 64 and ten 1×1 convolutions of 64 channels (+ bias + ReLU) on 16 × 16,
/// pooled to 1 × 1. 24 channels do not split by 16: converting every convolution would move
/// each depthwise layer's input and output, converting those of 16 × 16 planes only moves the
/// stride-2 convolution's output.
fn two_stages() -> String {
    stages(false, 2)
}

/// [`two_stages`] with `blocks` blocks on 32 × 32, entered from a 24-channel input `x`, or
/// with `image` from a 3-channel `img` through a stem 3 → 24 (`x0`, 3×3, padded).
fn stages(image: bool, blocks: usize) -> String {
    let t = |s: &str| format!("R.Tensor(({s}), \"float32\")");
    let mut body = String::new();
    let (mut prev, params) = if image {
        body.push_str("            x0 = R.nn.conv2d(img, wi, padding=[1, 1, 1, 1])\n");
        let p = format!("img: {}, wi: {}", t("1, 3, 32, 32"), t("24, 3, 3, 3"));
        ("x0".to_string(), p)
    } else {
        ("x".to_string(), format!("x: {}", t("1, 24, 32, 32")))
    };
    for i in 0..blocks {
        body.push_str(&format!(
            "            e{i} = R.nn.conv2d({prev}, we)\n            \
             d{i} = R.nn.conv2d(e{i}, wd, padding=[1, 1, 1, 1], groups=48)\n            \
             p{i} = R.nn.conv2d(d{i}, wp)\n"
        ));
        prev = format!("p{i}");
    }
    body.push_str(&format!(
        "            s = R.nn.conv2d({prev}, ws, strides=[2, 2], padding=[1, 1, 1, 1])\n"
    ));
    prev = "s".to_string();
    for i in 0..10 {
        body.push_str(&format!(
            "            h{i} = R.nn.relu(R.add(R.nn.conv2d({prev}, w), b))\n"
        ));
        prev = format!("h{i}");
    }
    format!(
        "@I.ir_module\nclass Module:\n    @R.function\n    def main({params}, we: {we}, wd: {wd}, \
         wp: {wp}, ws: {ws}, w: {w}, b: {b}):\n        with R.dataflow():\n{body}            \
         gv = R.nn.adaptive_avg_pool2d({prev}, output_size=[1, 1])\n            R.output(gv)\n        \
         return gv\n",
        we = t("48, 24, 1, 1"),
        wd = t("48, 1, 3, 3"),
        wp = t("24, 48, 1, 1"),
        ws = t("64, 24, 3, 3"),
        w = t("64, 64, 1, 1"),
        b = t("1, 64, 1, 1"),
    )
}

/// `conv2d_layout = "auto"` on [`two_stages`]: converting every convolution does not pay (the
/// depthwise layers' moves), converting those of the 16 × 16 stage does, and that is what the
/// default flow keeps and says; the converted module computes what the model computes.
#[test]
fn auto_converts_the_later_stage_alone_when_the_early_one_would_leave_layout_changes() {
    fusebox::link_backends();
    let cpu = fusebox::core::backend::make_backend("cpu", &Default::default()).unwrap();
    let prefers = cpu.conv2d_layout(fusebox::core::config::Target::Cpu);
    let src = two_stages();
    let module = fusebox::core::text::parse_module_str(&src).unwrap();
    // The planes ConvertLayout may be limited to, largest first.
    assert_eq!(
        fusebox::core::transform::conv_planes(&module),
        vec![1024, 256]
    );
    let cost = |limit| {
        let c = fusebox::core::transform::convert_layout_within(&module, "NCHW16c", "OIHW", limit)
            .unwrap();
        fusebox::core::transform::layout_cost(&c, "NCHW16c")
    };
    let before = fusebox::core::transform::layout_cost(&module, "NCHW16c");
    let (all, later) = (cost(None), cost(Some(256)));
    // Every convolution: the two depthwise layers and the ten of 64 channels (those that
    // read or write 24 channels stay); the two depthwise layers' inputs and outputs move.
    assert_eq!((all.converted, all.depthwise_elems), (10, 2 * 48 * 1024));
    assert!(!all.pays(&before), "{all:?}");
    // Those of 16 × 16: the ten 1×1 layers; the stride-2 layer's output, the bias and the
    // pooled result move.
    assert_eq!(
        (
            later.converted,
            later.conv_elems,
            later.depthwise_elems,
            later.moves
        ),
        (10, 10 * 64 * 256, 0, 3),
        "{later:?}"
    );
    assert!(later.pays(&before), "{later:?}");
    let pipeline = fusebox::pipeline(fusebox::default_config().unwrap()).unwrap();
    let p = pipeline.partition_noted(&module).unwrap();
    let text = fusebox::core::text::print_module(&p.module).text;
    match &prefers {
        Some(_) => {
            assert_eq!(
                p.notes,
                vec![
                    "conv2d_layout \"auto\": 10 of 17 conv2d in NCHW16c/OIHW (backend cpu's \
                     layout on this machine; those of input planes up to 256 pixels), 3 layout \
                     change(s) left at run time"
                        .to_string()
                ],
                "{text}"
            );
            // The 64-channel layers in the layout, the depthwise ones of 32 × 32 not.
            assert!(
                text.contains("groups=1, data_layout=\"NCHW16c\"")
                    && text.contains("groups=48, data_layout=\"NCHW\"")
                    && !text.contains("groups=48, data_layout=\"NCHW16c\""),
                "{text}"
            );
        }
        None => assert!(p.notes.is_empty() && !text.contains("NCHW16c"), "{text}"),
    }
    run_checked("convert_layout_stages", "two_stages.relax", &src);
}

/// `fusebox run --check --profile` of `src` written as `name` into a test directory `dir`
/// (the default config): asserts that it succeeds and that its one output matches the
/// unpartitioned module's; returns its stdout and stderr.
fn run_checked(dir: &str, name: &str, src: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(name);
    std::fs::write(&file, src).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .current_dir(root())
        .arg("run")
        .arg(&file)
        .arg("--output-dir")
        .arg(dir.join("out"))
        .arg("--check")
        .arg("--profile")
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{all}");
    assert!(
        all.contains("check: 1 output(s) match the unpartitioned module"),
        "{all}"
    );
    all
}

/// A stack of `depth` 3×3 convolutions of 32 channels on 16 × 16 (+ bias + ReLU), after an
/// input of 32 channels: every convolution splits by 16.
fn conv_stack(depth: usize) -> String {
    let mut body = String::new();
    let mut prev = "x".to_string();
    for i in 0..depth {
        body.push_str(&format!(
            "            h{i} = R.nn.relu(R.add(R.nn.conv2d({prev}, w, padding=[1, 1, 1, 1]), b))\n"
        ));
        prev = format!("h{i}");
    }
    format!(
        "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: R.Tensor((1, 32, 16, 16), \
         \"float32\"), w: R.Tensor((32, 32, 3, 3), \"float32\"), b: R.Tensor((1, 32, 1, 1), \
         \"float32\")):\n        with R.dataflow():\n{body}            gv = {prev}\n            \
         R.output(gv)\n        return gv\n"
    )
}

/// `conv2d_layout = "auto"`, the default: where the `cpu` backend names a layout (`NCHW16c`
/// on AVX-512), a deep stack of convolutions that split by 16 is converted (its report's note
/// says so: one layout change in, one out) and computes what the model computes; the small
/// CNN converts whole (its 3-channel stem reads the image as it is and writes the layout; the
/// layout changes left are its four bias parameters' and the pooled end's), while the same CNN on a 24-channel image, whose
/// stem cannot, would leave layout changes that move more than an eighth of what its
/// convolutions write, and keeps its layouts and says why. On a CPU where the backend names
/// none, nothing changes and there is no note. `fusebox run` without a config chooses alike.
#[test]
fn auto_converts_where_the_layout_changes_are_small_beside_the_convolutions() {
    fusebox::link_backends();
    let cpu = fusebox::core::backend::make_backend("cpu", &Default::default()).unwrap();
    let prefers = cpu.conv2d_layout(fusebox::core::config::Target::Cpu);
    let pipeline = fusebox::pipeline(fusebox::default_config().unwrap()).unwrap();
    let deep = fusebox::core::text::parse_module_str(&conv_stack(24)).unwrap();
    let p = pipeline.partition_noted(&deep).unwrap();
    let text = fusebox::core::text::print_module(&p.module).text;
    let small_src = std::fs::read_to_string(root().join("examples/small_cnn.relax")).unwrap();
    let small = fusebox::core::text::parse_module_str(&small_src).unwrap();
    let ps = pipeline.partition_noted(&small).unwrap();
    let small_text = fusebox::core::text::print_module(&ps.module).text;
    let wide_src = small_src
        .replace("(1, 3, 32, 32)", "(1, 24, 32, 32)")
        .replace("(16, 3, 3, 3)", "(16, 24, 3, 3)");
    let wide = fusebox::core::text::parse_module_str(&wide_src).unwrap();
    let pw = pipeline.partition_noted(&wide).unwrap();
    let wide_text = fusebox::core::text::print_module(&pw.module).text;
    match &prefers {
        Some([data, kernel]) => {
            assert_eq!([data.as_str(), kernel.as_str()], ["NCHW16c", "OIHW"]);
            // The note of a whole conversion: `what` conv2d converted, `changes` left.
            let note = |what: &str, changes: usize| {
                vec![format!(
                    "conv2d_layout \"auto\": {what} conv2d in NCHW16c/OIHW (backend cpu's \
                     layout on this machine), {changes} layout change(s) left at run time"
                )]
            };
            assert_eq!(p.notes, note("24 of 24", 3), "{text}");
            assert!(
                text.contains("data_layout=\"NCHW16c\"") && !text.contains("data_layout=\"NCHW\""),
                "{text}"
            );
            assert_eq!(ps.notes, note("4 of 4", 5), "{small_text}");
            // The stem alone reads `NCHW`: the image, as it is.
            assert_eq!(
                small_text.matches("data_layout=\"NCHW\"").count(),
                1,
                "{small_text}"
            );
            assert!(
                small_text.contains(
                    "R.nn.conv2d(data, w0, strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, \
                     1], groups=1, data_layout=\"NCHW\", kernel_layout=\"OIHW\", \
                     out_layout=\"NCHW16c\""
                ),
                "{small_text}"
            );
            assert!(!wide_text.contains("NCHW16c"), "{wide_text}");
            assert_eq!(pw.notes.len(), 1, "{:?}", pw.notes);
            assert!(
                pw.notes[0].starts_with("conv2d_layout \"auto\": layouts kept; NCHW16c/OIHW")
                    && pw.notes[0].contains("would convert 3 of 4 conv2d"),
                "{:?}",
                pw.notes
            );
        }
        None => {
            assert!(p.notes.is_empty() && ps.notes.is_empty() && pw.notes.is_empty());
            assert!(!text.contains("NCHW16c") && !small_text.contains("NCHW16c"));
            assert!(!wide_text.contains("NCHW16c"));
        }
    }
    // Converted or not, the default flow computes what the model computes.
    let all = run_checked("convert_layout_auto", "conv_stack.relax", &conv_stack(24));
    // `fusebox run` without a config chooses as the default config does: the profile shows
    // the layout changes exactly when the stack was converted.
    assert_eq!(
        all.lines()
            .any(|l| l.starts_with("profile") && l.contains("layout_transform")),
        prefers.is_some(),
        "{all}"
    );
}

/// A backend that names `NCHW16c`, then `NCHW8c` (the `cpu` backend's pair on AVX2), on any
/// host: what `conv2d_layout = "auto"` makes of two layouts, apart from the machine.
struct TwoLayouts;

impl fusebox::core::backend::Backend for TwoLayouts {
    fn name(&self) -> &str {
        "two"
    }
    fn patterns(&self) -> Vec<fusebox::core::transform::FusionPattern> {
        Vec::new()
    }
    fn conv2d_layouts(&self, _: fusebox::core::config::Target) -> Vec<[String; 2]> {
        ["NCHW16c", "NCHW8c"]
            .map(|d| [d.to_string(), "OIHW".to_string()])
            .to_vec()
    }
    fn claim(&self, _: &fusebox::core::backend::Candidate<'_>) -> fusebox::core::backend::Claim {
        fusebox::core::backend::Claim::Decline {
            reason: "a layout chooser only".into(),
        }
    }
    fn compile(
        &self,
        _: &fusebox::core::backend::Candidate<'_>,
    ) -> fusebox::core::Result<Box<dyn fusebox::core::backend::Artifact>> {
        Err(fusebox::core::Error::Backend {
            backend: "two".into(),
            message: "a layout chooser only".into(),
        })
    }
}

/// MobileNetV2's shape in small, entered from a 3-channel image: a stem 3 → 24 (which reads
/// the image as it is in a split layout), three blocks of a 1×1 expansion 24 → 48, a
/// depthwise 3×3 and a 1×1 projection 48 → 24 on 32 × 32, a stride-2 convolution 24 → 64,
/// then ten 1×1 convolutions of 64 channels (+ bias + ReLU) on 16 × 16, pooled to 1 × 1.
fn image_stages() -> String {
    stages(true, 3)
}

/// `conv2d_layout = "auto"` with a backend that names `NCHW16c`, then `NCHW8c`: the first
/// layout takes the 16 × 16 stage alone (as [`two_stages`]: its 24-channel layers do not
/// split by 16), and the convolutions it leaves go into `NCHW8c`, which pays here (the stem
/// reads the image as it is): every convolution in a split layout, the note saying which, and
/// the converted module computes what the model computes. On [`two_stages`], whose 24-channel
/// input would have to move, the second layout does not pay and the first's choice stands.
#[test]
fn auto_puts_the_convolutions_the_first_layout_leaves_into_the_second_where_that_pays() {
    use fusebox::core::runtime::{Tensor, Value};
    fusebox::link_backends();
    let two = TwoLayouts;
    let auto = |m: &fusebox::core::ir::Module| {
        fusebox::core::backend::pipeline::auto_conv2d_layout(
            m,
            &[&two],
            fusebox::core::config::Target::Cpu,
            None,
        )
        .unwrap()
    };
    let module = fusebox::core::text::parse_module_str(&image_stages()).unwrap();
    let (converted, note) = auto(&module);
    let converted = converted.expect("a conversion pays");
    let text = fusebox::core::text::print_module(&converted).text;
    assert_eq!(
        note.as_deref(),
        Some(
            "conv2d_layout \"auto\": 10 of 21 conv2d in NCHW16c/OIHW (backend two's layout on \
             this machine; those of input planes up to 256 pixels), 8 in NCHW8c/OIHW (the \
             convolutions left), 4 layout change(s) left at run time"
        ),
        "{text}"
    );
    // The stem reads the image in `NCHW` and writes `NCHW8c`; the depthwise layers run in
    // `NCHW8c`; no convolution is left in `NCHW` out.
    assert!(
        text.contains("data_layout=\"NCHW\", kernel_layout=\"OIHW\", out_layout=\"NCHW8c\"")
            && text.contains("groups=48, data_layout=\"NCHW8c\"")
            && text.contains("groups=1, data_layout=\"NCHW16c\"")
            && !text.contains("out_layout=\"NCHW\""),
        "{text}"
    );
    // The same values as the model's, element for element (moves only; the kernels sum in
    // the same order), on the CPU executor.
    let main = module.get("main").unwrap();
    let args: Vec<Value> = main
        .params
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            let ty = main.var(p).ty.as_tensor().unwrap();
            let dims: Vec<usize> = ty
                .dims
                .as_ref()
                .unwrap()
                .iter()
                .map(|d| d.as_static().unwrap() as usize)
                .collect();
            let n: usize = dims.iter().product();
            let data = (0..n)
                .map(|j| (((j * 7 + i * 13) % 23) as f32 - 11.0) / 16.0)
                .collect();
            Value::Tensor(Tensor::from_f32(dims, data).unwrap())
        })
        .collect();
    let want = fusebox_cpu::run(&module, "main", args.clone()).unwrap();
    let got = fusebox_cpu::run(&converted, "main", args).unwrap();
    let (Value::Tensor(want), Value::Tensor(got)) = (want, got) else {
        panic!("expected tensors")
    };
    assert_eq!(got.shape(), want.shape());
    let close = got
        .as_f32()
        .unwrap()
        .iter()
        .zip(want.as_f32().unwrap())
        .all(|(a, b)| (a - b).abs() <= 1e-5 * b.abs().max(1.0));
    assert!(close, "{got:?} vs {want:?}");
    // [`two_stages`]: the second layout would move the 24-channel input and does not pay.
    let stages = fusebox::core::text::parse_module_str(&two_stages()).unwrap();
    let (kept, note) = auto(&stages);
    let kept_text = fusebox::core::text::print_module(&kept.expect("the later stage")).text;
    assert!(
        note.is_some_and(|n| n.contains("those of input planes up to 256 pixels), 3 layout"))
            && !kept_text.contains("NCHW8c"),
        "{kept_text}"
    );
}
