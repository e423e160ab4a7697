//! `fusebox compile`: partition + claim + build ahead of time, files and `manifest.json`.
//!
//! A fake backend (`fakegpu`, registered in this test binary) builds the first conv2d+relu
//! group of the example into a `.cu` and a `.cubin` with one kernel; the CPU reference takes
//! the rest. Its options make it fail the build, or name a file badly.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failure is a panic"
)]

use fusebox::core::backend::pipeline::Manifest;
use fusebox::core::backend::{
    Artifact, Backend, BackendRegistration, BuildOutput, Candidate, Claim, KernelInfo,
};
use fusebox::core::config::Config;
use fusebox::core::transform::FusionPattern;
use std::path::{Path, PathBuf};

struct FakeGpu {
    fail: bool,
    bad_name: bool,
}

impl Backend for FakeGpu {
    fn name(&self) -> &str {
        "fakegpu"
    }
    fn patterns(&self) -> Vec<FusionPattern> {
        Vec::new()
    }
    fn claim(&self, c: &Candidate<'_>) -> Claim {
        if c.name == "fused_conv2d_relu" {
            Claim::Accept
        } else {
            Claim::Decline {
                reason: format!("fakegpu takes only the first group, not `{}`", c.name),
            }
        }
    }
    fn compile(&self, _: &Candidate<'_>) -> fusebox::core::Result<Box<dyn Artifact>> {
        Err(fusebox::core::Error::Backend {
            backend: "fakegpu".into(),
            message: "running needs a GPU".into(),
        })
    }
    fn build(&self, c: &Candidate<'_>) -> fusebox::core::Result<Option<BuildOutput>> {
        if self.fail {
            return Err(fusebox::core::Error::Backend {
                backend: "fakegpu".into(),
                message: "ptxas ran out of registers".into(),
            });
        }
        let cu = if self.bad_name {
            "../escape.cu".to_string()
        } else {
            format!("{}.cu", c.name)
        };
        Ok(Some(BuildOutput {
            files: vec![
                (cu, format!("// {}\n", c.ops().join(", ")).into_bytes()),
                (
                    format!("{}.cubin", c.name),
                    vec![0x7f, b'E', b'L', b'F', 0, 1],
                ),
            ],
            kernels: vec![KernelInfo {
                name: format!("{}_k0", c.name),
                grid: [784, 1, 1],
                block: [256, 1, 1],
                shared_mem_bytes: 49_152,
            }],
            arch: Some("sm_90".into()),
        }))
    }
}

fn make(options: &toml::Table) -> fusebox::core::Result<Box<dyn Backend>> {
    let flag = |k: &str| options.get(k).and_then(toml::Value::as_bool) == Some(true);
    Ok(Box::new(FakeGpu {
        fail: flag("fail"),
        bad_name: flag("bad_name"),
    }))
}

inventory::submit! { BackendRegistration { name: "fakegpu", make } }

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn out_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fusebox-compile-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn config(options: &str) -> Config {
    let text = format!(
        "target = \"cuda\"\n[partition]\nfuse_ops = true\n[[backend]]\nname = \"fakegpu\"\n\
         [backend.options]\n{options}\n[[backend]]\nname = \"cpu\"\n"
    );
    Config::parse(&text, "test.toml").unwrap_or_else(|e| panic!("{e}"))
}

fn build(options: &str) -> fusebox::core::backend::pipeline::BuildPlan {
    let module = fusebox::core::text::read_module(&root().join("examples/conv2d_relu_x2.relax"))
        .unwrap_or_else(|e| panic!("{e}"));
    let pipeline = fusebox::pipeline(config(options)).unwrap_or_else(|e| panic!("{e}"));
    let mut calls = Vec::new();
    let plan = pipeline
        .build(&module, &mut |done, total, name| {
            calls.push((done, total, name.to_string()))
        })
        .unwrap_or_else(|e| panic!("{e}"));
    // Progress: once before each unit, once at the end.
    let total = plan.functions.len();
    assert_eq!(calls.len(), total + 1, "{calls:?}");
    assert_eq!(calls.last().map(|c| (c.0, c.1)), Some((total, total)));
    plan
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|r| {
            r.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn the_manifest_lists_every_function_with_its_kernels_and_files() {
    let plan = build("");
    let dir = out_dir("ok");
    let m = fusebox::write_build(&plan, &dir).unwrap_or_else(|e| panic!("{e}"));
    let text = std::fs::read_to_string(dir.join("manifest.json")).expect("manifest");
    let parsed: Manifest = serde_json::from_str(&text).expect("manifest JSON");
    assert_eq!(parsed, m);
    assert_eq!(parsed.format, 2);
    let summary: Vec<(&str, &str, usize, usize)> = parsed
        .functions
        .iter()
        .map(|f| {
            (
                f.function.as_str(),
                f.backend.as_str(),
                f.kernels.len(),
                f.files.len(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            ("fused_conv2d_relu", "fakegpu", 1, 2),
            ("fused_conv2d_relu1", "cpu", 0, 0),
        ]
    );
    let g = &parsed.functions[0];
    assert_eq!(g.arch.as_deref(), Some("sm_90"));
    assert_eq!(g.ops, vec!["relax.nn.conv2d", "relax.nn.relu"]);
    assert_eq!(
        g.kernels[0],
        KernelInfo {
            name: "fused_conv2d_relu_k0".into(),
            grid: [784, 1, 1],
            block: [256, 1, 1],
            shared_mem_bytes: 49_152,
        }
    );
    let c = &parsed.functions[1];
    assert!(c.arch.is_none() && !c.fallback);
    // The files, and nothing else (no temporaries).
    assert_eq!(
        files_in(&dir),
        vec![
            "fused_conv2d_relu.cu",
            "fused_conv2d_relu.cubin",
            "manifest.json",
        ]
    );
    assert_eq!(
        std::fs::read(dir.join("fused_conv2d_relu.cubin")).ok(),
        Some(vec![0x7f, b'E', b'L', b'F', 0, 1])
    );
    // The JSON spells the launch configuration as arrays.
    assert!(text.contains("\"grid\": [\n"), "{text}");
    // Deterministic: a second build writes the same bytes.
    let dir2 = out_dir("ok2");
    fusebox::write_build(&build(""), &dir2).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        std::fs::read_to_string(dir2.join("manifest.json")).ok(),
        Some(text)
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&dir2);
}

#[test]
fn a_failed_build_falls_through_to_the_next_backend() {
    let plan = build("fail = true");
    let first = &plan.functions[0];
    assert_eq!(first.claim.backend.as_deref(), Some("cpu"));
    assert_eq!(first.claim.compile_failures.len(), 1);
    assert!(first.claim.compile_failures[0].1.contains("ptxas ran out"));
    assert!(first.output.is_none());
    let m = plan.manifest();
    assert!(
        m.functions
            .iter()
            .all(|f| f.backend == "cpu" && f.files.is_empty())
    );
    assert_eq!(plan.kernel_count(), 0);
}

#[test]
fn a_bad_file_name_writes_nothing() {
    let plan = build("bad_name = true");
    let dir = out_dir("badname");
    let e = fusebox::write_build(&plan, &dir)
        .err()
        .map(|e| e.to_string());
    assert!(
        e.as_deref().is_some_and(|e| e.contains("plain name")),
        "{e:?}"
    );
    assert!(files_in(&dir).is_empty());
}

#[test]
fn a_failed_write_leaves_no_manifest() {
    let plan = build("");
    let dir = out_dir("blocked");
    std::fs::create_dir_all(dir.join("fused_conv2d_relu.cubin")).expect("blocking dir");
    // A manifest from an earlier run must not survive a failed one.
    std::fs::write(dir.join("manifest.json"), "{\"stale\": true}").expect("stale manifest");
    assert!(fusebox::write_build(&plan, &dir).is_err());
    let left = files_in(&dir);
    assert!(!left.iter().any(|f| f == "manifest.json"), "{left:?}");
    assert!(!left.iter().any(|f| f.ends_with(".tmp")), "{left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_command_writes_a_cpu_manifest() {
    let dir = out_dir("cli");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .arg("compile")
        .arg(root().join("examples/conv2d_relu_x2.relax"))
        .arg("--config")
        .arg(root().join("configs/cpu.toml"))
        .arg("--out-dir")
        .arg(&dir)
        .output()
        .expect("run fusebox");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("(2 function(s), 0 kernel(s))"), "{stdout}");
    // Not a terminal: no progress bar on stderr.
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m: Manifest = serde_json::from_str(
        &std::fs::read_to_string(dir.join("manifest.json")).expect("manifest"),
    )
    .expect("manifest JSON");
    assert_eq!(m.functions.len(), 2);
    for f in &m.functions {
        assert_eq!(f.backend, "cpu");
        assert!(f.files.is_empty() && f.kernels.is_empty() && f.arch.is_none());
    }
    assert_eq!(files_in(&dir), vec!["manifest.json"]);
    let _ = std::fs::remove_dir_all(&dir);
}
