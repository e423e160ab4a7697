//! The `cuda` backend and `target = "cuda"` on this machine: claims and their reasons, the
//! typed "no CUDA device" error (strict) or the CPU fallback that says so, and `fusebox compile`
//! writing CUDA sources and CUBINs without a GPU. On a machine with a GPU the no-device checks
//! are skipped (with a printed reason) and the run must succeed instead.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

use fusebox::core::backend::{Candidate, Claim, make_backend};
use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn has_gpu() -> bool {
    fusebox::cuda::Gpu::is_available()
}

const BLOCK: &str = "backends/cuda/tests/data/transformer_block.relax";

#[test]
fn the_cuda_backend_claims_fuse_ops_groups_and_says_why_not_otherwise() {
    fusebox::link_backends();
    let b = make_backend("cuda", &toml::Table::new()).unwrap();
    let src = "@I.ir_module\nclass Module:\n    @R.function(private=True)\n    def fused_add_relu(x: R.Tensor((4, 8), dtype=\"float32\"), y: R.Tensor((8,), dtype=\"float32\")) -> R.Tensor((4, 8), dtype=\"float32\"):\n        R.func_attr({\"Primitive\": True})\n        with R.dataflow():\n            a = R.add(x, y)\n            gv = R.nn.relu(a)\n            R.output(gv)\n        return gv\n\n    @R.function(private=True)\n    def fused_sym(x: R.Tensor((\"n\", 8), dtype=\"float32\")) -> R.Tensor((\"n\", 8), dtype=\"float32\"):\n        R.func_attr({\"Primitive\": True})\n        with R.dataflow():\n            gv = R.nn.relu(x)\n            R.output(gv)\n        return gv\n\n    @R.function\n    def plain(x: R.Tensor((8,), dtype=\"float32\")) -> R.Tensor((8,), dtype=\"float32\"):\n        with R.dataflow():\n            gv = R.nn.relu(x)\n            R.output(gv)\n        return gv\n";
    let m = fusebox::core::text::parse_module_str(src).unwrap();
    let cand = |n: &'static str| Candidate {
        name: n,
        func: m.get(n).unwrap(),
        module: &m,
    };
    assert_eq!(b.claim(&cand("fused_add_relu")), Claim::Accept);
    match b.claim(&cand("fused_sym")) {
        Claim::Decline { reason } => assert!(reason.contains("symbolic"), "{reason}"),
        Claim::Accept => panic!("a symbolic shape was claimed"),
    }
    match b.claim(&cand("plain")) {
        Claim::Decline { reason } => assert!(reason.contains("not a FuseOps group"), "{reason}"),
        Claim::Accept => panic!("a plain function was claimed"),
    }
    if !has_gpu() {
        let err = b.compile(&cand("fused_add_relu")).err().expect("no device");
        assert!(err.to_string().contains("no CUDA device"), "{err}");
    }
}

#[test]
fn unknown_options_and_bad_arches_are_errors() {
    fusebox::link_backends();
    let mut t = toml::Table::new();
    t.insert("arch".into(), toml::Value::String("sm_12".into()));
    let e = make_backend("cuda", &t).err().expect("bad arch");
    assert!(e.to_string().contains("arch"), "{e}");
    let mut t = toml::Table::new();
    t.insert("threads".into(), toml::Value::Integer(4));
    let e = make_backend("cuda", &t).err().expect("unknown option");
    assert!(e.to_string().contains("threads"), "{e}");
}

#[test]
fn run_with_the_cuda_config_without_a_gpu_is_the_typed_error_or_a_said_fallback() {
    if has_gpu() {
        println!("skipped: this machine has a GPU (the no-device behaviour cannot be observed)");
        return;
    }
    let out = root().join("target").join("cuda-target-test");
    let run = |config: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_fusebox"))
            .current_dir(root())
            .args(["run", BLOCK, "--config"])
            .arg(config)
            .arg("--output-dir")
            .arg(&out)
            .output()
            .unwrap()
    };
    let strict = run(&root().join("configs/cuda.toml"));
    let stderr = String::from_utf8_lossy(&strict.stderr);
    assert_eq!(strict.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("no CUDA device"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let lax_path = out.with_extension("toml");
    std::fs::create_dir_all(lax_path.parent().unwrap()).unwrap();
    let text = std::fs::read_to_string(root().join("configs/cuda.toml")).unwrap();
    std::fs::write(&lax_path, text.replace("strict = true", "strict = false")).unwrap();
    let lax = run(&lax_path);
    let stderr = String::from_utf8_lossy(&lax.stderr);
    assert!(lax.status.success(), "{stderr}");
    assert!(
        stderr.contains("falling back to the CPU reference"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&lax.stdout);
    let row = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("fused_reshape_permute_dims "))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        row.contains(" cpu ") && row.contains("fallback: `cuda` could not compile it"),
        "{row}"
    );
}

#[test]
fn compile_writes_cuda_sources_and_cubins_without_a_gpu() {
    if !fusebox::cuda::testing::nvrtc_or_skip("compile_writes_cuda_sources_and_cubins") {
        return;
    }
    let dir = root().join("target").join("cuda-compile-test");
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .current_dir(root())
        .args([
            "compile",
            BLOCK,
            "--config",
            "configs/cuda.toml",
            "--out-dir",
        ])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    let funcs = manifest["functions"].as_array().unwrap();
    // cuBLAS takes the matmul + bias layers (config order), the generic codegen every other
    // FuseOps group.
    let cuda: Vec<_> = funcs.iter().filter(|f| f["backend"] == "cuda").collect();
    let cublas = funcs.iter().filter(|f| f["backend"] == "cublas").count();
    let cutlass = funcs.iter().filter(|f| f["backend"] == "cutlass").count();
    assert_eq!(cuda.len() + cublas + cutlass, funcs.len(), "{manifest}");
    assert!(cublas >= 3 && cuda.len() >= 5, "{manifest}");
    for f in cuda {
        assert_eq!(f["arch"], "sm_90");
        for k in f["kernels"].as_array().unwrap() {
            let name = k["name"].as_str().unwrap();
            let cu = std::fs::read_to_string(dir.join(format!("{name}.cu"))).unwrap();
            assert!(cu.contains("void __launch_bounds__") && cu.contains(name));
            let cubin = std::fs::read(dir.join(format!("{name}.cubin"))).unwrap();
            assert_eq!(&cubin[..4], b"\x7fELF", "{name}.cubin is an ELF CUBIN");
        }
    }
}

/// Issue 18: `fusebox compile` with the strict CUDA config on a machine without NVRTC exited 0,
/// listing every function as `cpu, 0 kernel(s)` with no reason and no manifest field for it.
#[test]
fn compile_without_nvrtc_says_why_and_strict_fails() {
    let dir = root().join("target").join("cuda-compile-no-nvrtc");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let compile = |config: &std::path::Path, out: &str| {
        Command::new(env!("CARGO_BIN_EXE_fusebox"))
            .current_dir(root())
            .env("FUSEBOX_NVRTC_LIB", "/nonexistent/libnvrtc.so.13")
            .args(["compile", "examples/small_cnn.relax", "--config"])
            .arg(config)
            .arg("--out-dir")
            .arg(dir.join(out))
            .output()
            .unwrap()
    };
    let strict = compile(&root().join("configs/cuda.toml"), "strict");
    let stderr = String::from_utf8_lossy(&strict.stderr);
    assert_eq!(strict.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("strict mode: backends claimed but could not compile ")
            && stderr.contains("`fused_reshape`, `fused_softmax` (cuda: backend `cuda`: ")
            && stderr.contains("NVRTC unavailable"),
        "{stderr}"
    );
    assert!(!dir.join("strict").join("manifest.json").exists());

    let lax_path = dir.join("lax.toml");
    let text = std::fs::read_to_string(root().join("configs/cuda.toml")).unwrap();
    std::fs::write(&lax_path, text.replace("strict = true", "strict = false")).unwrap();
    let lax = compile(&lax_path, "lax");
    let stdout = String::from_utf8_lossy(&lax.stdout);
    assert!(
        lax.status.success(),
        "{}",
        String::from_utf8_lossy(&lax.stderr)
    );
    let softmax = stdout
        .lines()
        .position(|l| l.starts_with("fused_softmax: cpu, 0 kernel(s)"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        stdout.lines().nth(softmax + 1).is_some_and(|l| l
            .trim_start()
            .starts_with("`cuda` could not build it: backend `cuda`: NVRTC unavailable")),
        "{stdout}"
    );
    let manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("lax").join("manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(manifest["format"], 2);
    let f = manifest["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["function"] == "fused_softmax")
        .unwrap();
    assert_eq!(f["backend"], "cpu");
    assert_eq!(f["build_failures"][0]["backend"], "cuda");
    assert!(
        f["build_failures"][0]["error"]
            .as_str()
            .unwrap()
            .contains("NVRTC unavailable"),
        "{f}"
    );
}

/// `scripts/gpu-check.sh` on a machine without a GPU says so and exits non-zero, running
/// nothing (on a GPU machine it would run every GPU test: skipped here with the reason).
#[test]
fn gpu_check_without_a_gpu_says_so_and_fails() {
    if has_gpu() {
        println!("skipped: this machine has a GPU (run scripts/gpu-check.sh itself)");
        return;
    }
    let has_nvidia_smi = Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .is_ok_and(|o| o.status.success());
    if has_nvidia_smi {
        println!("skipped: nvidia-smi lists a GPU that the CUDA driver API cannot open");
        return;
    }
    let out = Command::new("bash")
        .arg(root().join("scripts/gpu-check.sh"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("gpu-check: no GPU on this machine (nvidia-smi finds none); nothing was run"),
        "{err}"
    );
}

/// `--bind`: BERT exported with dynamic `batch` and `sequence` axes. Without binding them the
/// GPU backends decline its symbolic shapes and the CPU reference keeps most groups; bound to
/// `batch=1, sequence=16`, every function compiles for the GPU (cuBLAS or the generic codegen,
/// each CUDA kernel to a CUBIN). A misspelt name is an error that lists the model's symbols.
#[test]
fn bound_dynamic_axes_let_the_gpu_backends_take_every_function() {
    if !fusebox::cuda::testing::nvrtc_or_skip("bound_dynamic_axes") {
        return;
    }
    let compile = |tag: &str, binds: &[&str]| {
        let dir = root().join("target").join(format!("cuda-bind-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        let mut args = vec!["compile", "tests/models/bert-ts/model.onnx"];
        for b in binds {
            args.extend(["--bind", b]);
        }
        let out = Command::new(env!("CARGO_BIN_EXE_fusebox"))
            .current_dir(root())
            .args(&args)
            .args(["--config", "configs/cuda.toml", "--out-dir"])
            .arg(&dir)
            .output()
            .unwrap();
        (out, dir)
    };
    let backends = |dir: &std::path::Path| -> Vec<String> {
        let manifest: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap())
                .unwrap();
        manifest["functions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["backend"].as_str().unwrap().to_string())
            .collect()
    };
    let (out, dir) = compile("dynamic", &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        backends(&dir).iter().any(|b| b == "cpu"),
        "{:?}",
        backends(&dir)
    );

    let (out, dir) = compile("bound", &["batch=1", "sequence=16"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bound = backends(&dir);
    assert!(
        bound.iter().all(|b| b == "cuda" || b == "cublas"),
        "{bound:?}"
    );
    assert!(
        bound.iter().filter(|b| *b == "cuda").count() >= 5,
        "{bound:?}"
    );
    let cubins = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "cubin"))
        })
        .count();
    assert!(cubins >= 5, "{cubins} CUBINs");

    let (out, _) = compile("misspelt", &["batsh=1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("`batsh`") && err.contains("`batch`") && err.contains("`sequence`"),
        "{err}"
    );
    let (out, _) = compile("negative", &["batch=-1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("0 or more"), "{err}");
}

/// On a GPU (`scripts/gpu-check.sh`): BERT with its dynamic axes bound runs through the whole
/// CUDA config (cuBLAS and generated kernels; the test above checks that nothing is left to
/// the CPU) and gives the CPU reference's output on the same seeded inputs, within 1e-3 of the
/// output's range.
#[test]
fn bound_bert_runs_on_the_gpu_and_matches_the_cpu() {
    if fusebox::cuda::testing::gpu_or_skip("bound_bert_runs_on_the_gpu").is_none() {
        return;
    }
    let run = |tag: &str, config: Option<&str>| {
        let dir = root().join("target").join(format!("cuda-bert-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fusebox"));
        cmd.current_dir(root()).args([
            "run",
            "tests/models/bert-ts/model.onnx",
            "--bind",
            "batch=1",
            "--bind",
            "sequence=16",
            "--seed",
            "7",
            "--output-dir",
        ]);
        cmd.arg(&dir);
        if let Some(c) = config {
            cmd.args(["--config", c]);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{tag}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let t = fusebox::read_npy(&dir.join("last_hidden_state.npy")).unwrap();
        (
            t.to_f64_vec(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let (gpu, report) = run("gpu", Some("configs/cuda.toml"));
    let (cpu, _) = run("cpu", None);
    assert_eq!(gpu.len(), cpu.len());
    let range = cpu.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    let worst = gpu
        .iter()
        .zip(&cpu)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f64, f64::max);
    assert!(
        worst <= 1e-3 * range,
        "max |gpu - cpu| {worst:e} (range {range}); {report}"
    );
}
