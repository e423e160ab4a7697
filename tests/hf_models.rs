//! Today's models (issue 17): small, seeded, randomly initialised Hugging Face models exported
//! by both torch exporters (`tests/models/<family>-<ts|dynamo>/`, written by
//! `scripts/export_hf_models.py`; layout in `tests/models/README.md`), and a spatial
//! transformer in the same layout (`stn-ts`, `stn-dynamo`: `scripts/export_stn.py`).
//!
//! For every fixture: import `model.onnx`, partition it as `fusebox run --config
//! configs/cpu.toml` does (the config's backend pipeline), run it on every input set, compare
//! each output with onnxruntime's (max |got − want| ≤ 1e-4 · (max(want) − min(want)); NaN equals
//! only NaN, integers exactly) and check that the partitioned run equals the unpartitioned one
//! (as `--check`: 1e-4 of the output's largest magnitude, at least 1). One line per fixture
//! (`hf <name>: pass (max err …)` or `hf <name>: FAIL <stage>: <error>`) and a summary
//! `hf models: P/N pass`.
//!
//! Most models still stop at import (ONNX ops fusebox does not support yet): the test asserts
//! that every fixture of [`EXPECTED_PASS`] passes and that no fixture panics. Grow the list as
//! ops land.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code panics on failure"
)]

use fusebox_core::frontend::onnx::{import_onnx_file, output_names, sanitize};
use fusebox_core::ir::Module;
use fusebox_cpu::{Tensor, Value};
use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

/// The fixtures that pass today; every one must keep passing.
const EXPECTED_PASS: &[&str] = &[
    "bart-dynamo",
    "bart-ts",
    "bert-dynamo",
    "bert-ts",
    "bert-ts16",
    "convnext-dynamo",
    "convnext-ts",
    "deberta-v2-dynamo",
    "deberta-v2-ts",
    "deit-dynamo",
    "deit-ts",
    "dinov2-dynamo",
    "dinov2-ts",
    "distilbert-dynamo",
    "distilbert-ts",
    "efficientnet-dynamo",
    "efficientnet-ts",
    "fnet-dynamo",
    "gpt-neox-dynamo",
    "gpt-neox-ts",
    "gpt2-dynamo",
    "gpt2-ts",
    "llama-dynamo",
    "llama-ts",
    "longt5-dynamo",
    "longt5-ts",
    "mamba2-dynamo",
    "mistral-dynamo",
    "mistral-ts",
    "mixtral-dynamo",
    "mixtral-ts",
    "mobilenet-v2-dynamo",
    "mobilenet-v2-ts",
    "mobilenet-v3-dynamo",
    "mobilenet-v3-ts",
    "mobilevit-dynamo",
    "mobilevit-ts",
    "mpt-dynamo",
    "mpt-ts",
    "qwen2-dynamo",
    "qwen2-ts",
    "resnet-dynamo",
    "resnet-ts",
    "roberta-dynamo",
    "roberta-ts",
    "segformer-dynamo",
    "segformer-ts",
    "stn-dynamo",
    "stn-ts",
    "swin-dynamo",
    "swin-ts",
    "swinv2-dynamo",
    "swinv2-ts",
    "t5-encoder-dynamo",
    "t5-encoder-ts",
    "videomae-dynamo",
    "videomae-ts",
    "vit-dynamo",
    "vit-ts",
    "whisper-encoder-dynamo",
    "whisper-encoder-ts",
    "xlnet-ts",
];

/// Tolerance against onnxruntime, relative to the output's range.
const ORT_TOL: f64 = 1e-4;

/// Why a fixture failed: the stage and the message.
struct Failure {
    stage: &'static str,
    message: String,
}

fn fail(stage: &'static str, message: impl Into<String>) -> Failure {
    Failure {
        stage,
        message: message.into(),
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The fixture folders (those holding a `model.onnx`), sorted by name.
fn fixtures(dir: &Path) -> Vec<PathBuf> {
    let entries = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e} (the model fixtures are missing)", dir.display()));
    let mut v: Vec<PathBuf> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("model.onnx").is_file())
        .collect();
    v.sort();
    v
}

/// The input sets of a fixture: its subfolders holding an `inputs/` folder, sorted by name.
fn input_sets(dir: &Path) -> Result<Vec<PathBuf>, Failure> {
    let entries = std::fs::read_dir(dir).map_err(|e| fail("fixture", e.to_string()))?;
    let mut v: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("inputs").is_dir())
        .collect();
    v.sort();
    if v.is_empty() {
        return Err(fail("fixture", "no input set (`<set>/inputs/`)"));
    }
    Ok(v)
}

/// The `.npy` files of `dir`, keyed by their sanitized stem (as the importer names parameters
/// and outputs).
fn npy_files(dir: &Path) -> Result<BTreeMap<String, PathBuf>, Failure> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| fail("fixture", format!("{}: {e}", dir.display())))?;
    Ok(entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "npy"))
        .filter_map(|p| {
            let stem = p.file_stem()?.to_str()?.to_string();
            Some((sanitize(&stem), p))
        })
        .collect())
}

/// A `.npy` file as a tensor (the CLI's reader).
fn read_npy(path: &Path) -> Result<Tensor, String> {
    fusebox::read_npy(path).map_err(|e| e.to_string())
}

fn flatten(v: Value, out: &mut Vec<Tensor>) {
    match v {
        Value::Tensor(t) => out.push(t),
        Value::Tuple(items) => items.into_iter().for_each(|i| flatten(i, out)),
        _ => {}
    }
}

/// For an importer error listing unsupported nodes, the distinct op types in the order they
/// first occur (`` `node` (Op), `node2` (Op2) `` → `Op, Op2`); any other error as it is.
fn summarize_import_error(msg: &str) -> String {
    let Some((head, list)) = msg.split_once("unsupported ONNX node(s): ") else {
        return msg.to_string();
    };
    let mut ops: Vec<&str> = Vec::new();
    for item in list.split("` (").skip(1) {
        if let Some(op) = item.split(')').next()
            && !ops.contains(&op)
        {
            ops.push(op);
        }
    }
    let count = head.rsplit(": ").next().unwrap_or(head).trim();
    format!("{count} unsupported ONNX node(s), ops: {}", ops.join(", "))
}

/// `Ok(max |got − want|)` when `got` matches onnxruntime's `want` within [`ORT_TOL`] of its
/// range (NaN equals only NaN, ±inf only itself, integers and bool exactly).
fn compare_ort(got: &Tensor, want: &Tensor) -> Result<f64, String> {
    if got.shape() != want.shape() || got.dtype() != want.dtype() {
        return Err(format!(
            "{:?} {} vs onnxruntime's {:?} {}",
            got.shape(),
            got.dtype(),
            want.shape(),
            want.dtype()
        ));
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let finite = || w.iter().copied().filter(|x| x.is_finite());
    let range = finite().fold(f64::NEG_INFINITY, f64::max) - finite().fold(f64::INFINITY, f64::min);
    let tol = if got.dtype().is_float() && range.is_finite() {
        ORT_TOL * range
    } else {
        0.0
    };
    let mut worst = 0.0f64;
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        if a.is_finite() && b.is_finite() {
            worst = worst.max((a - b).abs());
        }
        if !fusebox::compare::close(a, b, tol) {
            return Err(format!(
                "element {i}: {a} vs onnxruntime's {b} (tolerance {tol:.3e})"
            ));
        }
    }
    Ok(worst)
}

/// The arguments of `main` from an input set: each parameter's `.npy` (by sanitized name).
fn arguments(module: &Module, set: &Path) -> Result<Vec<Value>, Failure> {
    let main = module
        .get("main")
        .ok_or_else(|| fail("import", "no function `main`"))?;
    let files = npy_files(&set.join("inputs"))?;
    main.params
        .iter()
        .map(|&p| {
            let name = &main.var(p).name;
            let path = files
                .get(name)
                .ok_or_else(|| fail("inputs", format!("no `{name}.npy` for parameter `{name}`")))?;
            read_npy(path)
                .map(Value::Tensor)
                .map_err(|e| fail("inputs", e))
        })
        .collect()
}

/// Imports, partitions and runs one fixture on every input set; the largest error against
/// onnxruntime.
fn run_fixture(
    dir: &Path,
    pipeline: &fusebox_core::backend::pipeline::BackendPipeline,
) -> Result<f64, Failure> {
    let model = dir.join("model.onnx");
    let module = import_onnx_file(&model)
        .map_err(|e| fail("import", summarize_import_error(&e.to_string())))?;
    let plan = pipeline
        .run(&module)
        .map_err(|e| fail("partition", e.to_string()))?;
    let names = output_names(
        module
            .get("main")
            .ok_or_else(|| fail("import", "no function `main`"))?,
    );
    let mut worst = 0.0f64;
    for set in input_sets(dir)? {
        let set_name = set.file_name().unwrap_or_default().to_string_lossy();
        let args = arguments(&module, &set)?;
        let ran = fusebox::execute(&plan, "main", args.clone())
            .map_err(|e| e.to_string())
            .and_then(|v| v.to_host().map_err(|e| e.to_string()))
            .map_err(|e| fail("run", format!("{set_name}: {e}")))?;
        let mut got = Vec::new();
        flatten(ran, &mut got);
        let reference = fusebox_cpu::run(&module, "main", args)
            .map_err(|e| fail("run-unpartitioned", format!("{set_name}: {e}")))?;
        let mut unpartitioned = Vec::new();
        flatten(reference, &mut unpartitioned);
        let wants = npy_files(&set.join("outputs"))?;
        if got.len() != names.len() || got.len() != wants.len() {
            return Err(fail(
                "outputs",
                format!(
                    "{set_name}: {} outputs ({} named), onnxruntime wrote {}",
                    got.len(),
                    names.len(),
                    wants.len()
                ),
            ));
        }
        for ((g, u), name) in got.iter().zip(&unpartitioned).zip(&names) {
            let path = wants.get(name).ok_or_else(|| {
                fail(
                    "outputs",
                    format!("{set_name}: no onnxruntime output `{name}`"),
                )
            })?;
            let want = read_npy(path).map_err(|e| fail("outputs", e))?;
            let err = compare_ort(g, &want)
                .map_err(|e| fail("compare", format!("{set_name}: output `{name}`: {e}")))?;
            worst = worst.max(err);
            if let Some(why) = fusebox::compare::first_mismatch(g, u) {
                return Err(fail(
                    "check",
                    format!(
                        "{set_name}: output `{name}` differs from the unpartitioned module: {why}"
                    ),
                ));
            }
        }
    }
    Ok(worst)
}

#[test]
fn hf_models_match_onnxruntime() {
    let dir = root().join("tests/models");
    let all = fixtures(&dir);
    assert!(!all.is_empty(), "{}: no model fixtures", dir.display());
    let config = fusebox_core::config::Config::load(&root().join("configs/cpu.toml"))
        .unwrap_or_else(|e| panic!("{e}"));
    let pipeline = fusebox::pipeline(config).unwrap_or_else(|e| panic!("{e}"));

    let mut passed = Vec::new();
    let mut panicked = Vec::new();
    for fixture in &all {
        let name = fixture
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let outcome = catch_unwind(AssertUnwindSafe(|| run_fixture(fixture, &pipeline)));
        match outcome {
            Ok(Ok(err)) => {
                println!("hf {name}: pass (max err {err:.3e})");
                passed.push(name);
            }
            Ok(Err(f)) => println!("hf {name}: FAIL {}: {}", f.stage, f.message),
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                println!("hf {name}: FAIL panic: {msg}");
                panicked.push(name);
            }
        }
    }
    println!("hf models: {}/{} pass", passed.len(), all.len());

    assert!(panicked.is_empty(), "panicked: {panicked:?}");
    let names: Vec<String> = all
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    for want in EXPECTED_PASS {
        assert!(
            names.iter().any(|n| n == want),
            "EXPECTED_PASS names `{want}`, which is no fixture in {}",
            dir.display()
        );
        assert!(
            passed.iter().any(|n| n == want),
            "`{want}` is in EXPECTED_PASS but did not pass (see its line above)"
        );
    }
}

/// The convolutional fixtures, run again with `[partition] conv2d_layout = ["NHWC", "OHWI"]`
/// (ConvertLayout before partitioning; the CPU backend's NHWC kernels): each still matches
/// onnxruntime and the unconverted, unpartitioned module, and its convolutions did change
/// layout.
const CNN_FIXTURES: &[&str] = &[
    "mobilenet-v2-ts",
    "mobilenet-v2-dynamo",
    "mobilenet-v3-ts",
    "resnet-ts",
    "efficientnet-ts",
    "convnext-ts",
];

#[test]
fn cnn_fixtures_match_onnxruntime_in_nhwc() {
    let path = root().join("configs/cpu.toml");
    let src = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
    let src = src.replace(
        "[partition]\n",
        "[partition]\nconv2d_layout = [\"NHWC\", \"OHWI\"]\n",
    );
    let config = fusebox_core::config::Config::parse(&src, "cpu-nhwc.toml")
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(config.partition.conv2d_layout.fixed().is_some());
    let pipeline = fusebox::pipeline(config).unwrap_or_else(|e| panic!("{e}"));
    for name in CNN_FIXTURES {
        let dir = root().join("tests/models").join(name);
        let module = import_onnx_file(&dir.join("model.onnx")).unwrap_or_else(|e| panic!("{e}"));
        let (m, _) = pipeline
            .partition(&module)
            .unwrap_or_else(|e| panic!("{e}"));
        let text = fusebox_core::text::print_module(&m).text;
        assert!(
            text.contains("data_layout=\"NHWC\"") && !text.contains("data_layout=\"NCHW\""),
            "{name}: every convolution NHWC after ConvertLayout"
        );
        match run_fixture(&dir, &pipeline) {
            Ok(err) => println!("hf {name} (NHWC): pass (max err {err:.3e})"),
            Err(f) => panic!("hf {name} (NHWC): FAIL {}: {}", f.stage, f.message),
        }
    }
}

#[test]
fn import_errors_are_summarized_by_op() {
    let msg = "m.onnx: 3 unsupported ONNX node(s): `/a/Where` (Where), `#4` (Equal), \
               `/b/Where_1` (Where)";
    assert_eq!(
        summarize_import_error(msg),
        "3 unsupported ONNX node(s), ops: Where, Equal"
    );
    assert_eq!(summarize_import_error("other"), "other");
}

#[test]
fn ort_comparison_is_relative_to_the_range() {
    let t = |v: Vec<f32>| Tensor::from_f32(vec![v.len()], v).unwrap();
    let want = t(vec![10.0, 20.0, f32::NAN]);
    // Range 10: tolerance 1e-3.
    assert!(compare_ort(&t(vec![10.0009, 20.0, f32::NAN]), &want).is_ok());
    assert!(compare_ort(&t(vec![10.002, 20.0, f32::NAN]), &want).is_err());
    assert!(compare_ort(&t(vec![10.0, 20.0, 0.0]), &want).is_err());
    assert!(compare_ort(&t(vec![10.0, 20.0]), &want).is_err());
}
