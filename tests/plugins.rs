//! Plugins end to end: the example conv2d plugin is built with cargo, loaded from its build
//! path, claims its composites, and runs them with results equal to the CPU reference; and
//! every kind of bad input exits non-zero with a message that names the problem, never a panic.

#![allow(clippy::panic, reason = "test helpers fail the test by panicking")]

use fusebox::core::config::Config;
use fusebox::core::runtime::{Tensor, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// Builds the three plugin crates once and returns the debug output folder.
fn plugins() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = Command::new(cargo)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args([
                "build",
                "-p",
                "fusebox-plugin-conv2d",
                "-p",
                "fusebox-plugin-test-bad-abi",
                "-p",
                "fusebox-plugin-test-misbehave",
            ])
            .status();
        assert!(
            matches!(st, Ok(s) if s.success()),
            "building the plugins failed"
        );
        target_dir().join("debug")
    })
}

fn lib(name: &str) -> String {
    let file = format!(
        "{}{name}{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    plugins().join(file).display().to_string()
}

fn temp(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fusebox-plugins-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let p = dir.join(name);
    let _ = std::fs::write(&p, text);
    p
}

/// Runs the fusebox binary; returns (success, stderr).
fn fusebox(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output();
    let Ok(out) = out else {
        panic!("cannot run fusebox")
    };
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    // A plugin's own panic message may be printed by its copy of std (then caught at the
    // boundary); the host itself must never panic.
    assert!(!err.contains("thread 'main'"), "fusebox panicked: {err}");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        err,
    )
}

/// `fusebox backends --config <text>` must fail with `needle` in its message.
fn fails_with(config_name: &str, config: &str, needle: &str) {
    let p = temp(config_name, config);
    let (ok, _, err) = fusebox(&["backends", "--config", &p.display().to_string()]);
    assert!(!ok, "expected failure for {config_name}");
    assert!(
        err.contains(needle),
        "{config_name}: `{needle}` not in: {err}"
    );
}

const MODEL: &str = r#"
@I.ir_module
class Module:
    @R.function
    def main(data: R.Tensor((1, 3, 10, 10), dtype="float32"), w1: R.Tensor((8, 3, 3, 3), dtype="float32"), b1: R.Tensor((1, 8, 1, 1), dtype="float32"), w2: R.Tensor((4, 8, 3, 3), dtype="float32")):
        with R.dataflow():
            lv = R.nn.conv2d(data, w1, padding=(1, 1))
            lv1 = R.add(lv, b1)
            lv2 = R.nn.relu(lv1)
            lv3 = R.nn.conv2d(lv2, w2, strides=(2, 2))
            lv4 = R.nn.relu(lv3)
            gv = R.exp(lv4)
            R.output(gv)
        return gv
"#;

fn random(shape: Vec<usize>, seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    let data = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) as f32 / (1u64 << 31) as f32) - 0.5
        })
        .collect();
    match Tensor::from_f32(shape, data) {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn example_plugin_claims_its_composites_and_matches_the_cpu_reference() {
    let cfg = format!(
        "[partition]\nbind_constants = false\n[[plugin]]\npath = \"{}\"\n[[backend]]\nname = \"example\"\n[[backend]]\nname = \"cpu\"\n",
        lib("fusebox_plugin_conv2d")
    );
    let cfg = Config::parse(&cfg, "inline.toml").unwrap_or_else(|e| panic!("{e}"));
    let pipeline = fusebox::pipeline(cfg).unwrap_or_else(|e| panic!("{e}"));
    let m = fusebox::core::text::parse_module_str(MODEL).unwrap_or_else(|e| panic!("{e}"));
    let plan = pipeline.run(&m).unwrap_or_else(|e| panic!("{e}"));
    let by: Vec<(String, Option<String>)> = plan
        .claims
        .iter()
        .map(|c| (c.function.clone(), c.backend.clone()))
        .collect();
    // Both conv composites go to the plugin; FuseOps leaves the lone `exp` in main, where the
    // executor runs it on the CPU reference.
    assert_eq!(by.len(), 2, "{by:?}");
    assert!(
        by.iter().all(|(_, b)| b.as_deref() == Some("example")),
        "{by:?}"
    );
    let args = vec![
        Value::Tensor(random(vec![1, 3, 10, 10], 1)),
        Value::Tensor(random(vec![8, 3, 3, 3], 2)),
        Value::Tensor(random(vec![1, 8, 1, 1], 3)),
        Value::Tensor(random(vec![4, 8, 3, 3], 4)),
    ];
    let want = fusebox_cpu::run(&m, "main", args.clone()).unwrap_or_else(|e| panic!("{e}"));
    let got = fusebox::execute(&plan, "main", args).unwrap_or_else(|e| panic!("{e}"));
    let (Value::Tensor(w), Value::Tensor(g)) = (&want, &got) else {
        panic!("not tensors")
    };
    assert_eq!(w.shape(), g.shape());
    let (w, g) = (w.to_f32_vec(), g.to_f32_vec());
    for (a, b) in w.iter().zip(&g) {
        assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()), "{a} vs {b}");
    }
}

#[test]
fn explain_says_where_a_binding_went() {
    let model = temp("model.relax", MODEL);
    let cfg = temp(
        "explain.toml",
        &format!(
            "[partition]\nbind_constants = false\n[[plugin]]\npath = \"{}\"\n[[backend]]\nname = \"example\"\n",
            lib("fusebox_plugin_conv2d")
        ),
    );
    let (ok, out, err) = fusebox(&[
        "explain",
        &model.display().to_string(),
        "--config",
        &cfg.display().to_string(),
        "--binding",
        "lv3",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("example.conv2d_bias_relu [example]: does not match here"),
        "{out}"
    );
    assert!(
        out.contains("example.conv2d_relu [example]: matched as part of the match rooted at `lv4`"),
        "{out}"
    );
    assert!(out.contains("run by backend `example`"), "{out}");
    let (ok, out, err) = fusebox(&[
        "explain",
        &model.display().to_string(),
        "--config",
        &cfg.display().to_string(),
        "--binding",
        "gv",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("stays in main"), "{out}");
}

#[test]
fn backends_lists_the_plugin_with_its_patterns() {
    let p = temp(
        "list.toml",
        &format!(
            "[[plugin]]\npath = \"{}\"\n[[backend]]\nname = \"example\"\n[[backend]]\nname = \"cpu\"\n",
            lib("fusebox_plugin_conv2d")
        ),
    );
    let (ok, out, err) = fusebox(&["backends", "--config", &p.display().to_string()]);
    assert!(ok, "{err}");
    let i = out.find("example.conv2d_bias_relu priority 30");
    let j = out.find("example.conv2d_relu priority 20");
    let k = out.find("example.conv2d priority 10");
    assert!(i < j && j < k && i.is_some(), "{out}");
    assert!(out.contains("backend cpu (built-in)"), "{out}");
}

#[test]
fn lint_flags_shadowed_and_duplicate_patterns_in_the_combined_table() {
    let p = temp(
        "lint.toml",
        "[[backend]]\nname = \"cpu\"\n[[pattern]]\nname = \"cpu.relu\"\npattern = \"relax.nn.relu(_)\"\n[[pattern]]\nname = \"cpu.relu_conv\"\npattern = \"relax.nn.relu(relax.nn.conv2d(_, _))\"\n[[pattern]]\nname = \"cpu.relu\"\npattern = \"relax.nn.relu(_)\"\n",
    );
    let (ok, out, err) = fusebox(&["backends", "--config", &p.display().to_string()]);
    assert!(ok, "{err}");
    assert!(
        out.contains("lint shadowed: `cpu.relu_conv` can never fire"),
        "{out}"
    );
    assert!(
        out.contains("lint duplicate: pattern name `cpu.relu` appears more than once"),
        "{out}"
    );
}

#[test]
fn bad_libraries_are_refused_with_the_library_named() {
    fails_with(
        "missing.toml",
        "[[plugin]]\npath = \"/nonexistent/libnope.so\"\n",
        "plugin /nonexistent/libnope.so: no such file",
    );
    let not_lib = temp("notalib.so", "this is not an ELF file\n");
    fails_with(
        "notlib.toml",
        &format!("[[plugin]]\npath = \"{}\"\n", not_lib.display()),
        "not a loadable shared library",
    );
    if let Some(libm) = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib64/libm.so.6",
        "/lib64/libm.so.6",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists())
    {
        fails_with(
            "noentry.toml",
            &format!("[[plugin]]\npath = \"{libm}\"\n"),
            "no entry point `fusebox_plugin_entry_v1`",
        );
    }
    fails_with(
        "abi.toml",
        &format!(
            "[[plugin]]\npath = \"{}\"\n",
            lib("fusebox_plugin_test_bad_abi")
        ),
        "ABI mismatch: the plugin has ABI 999.0",
    );
    let ex = lib("fusebox_plugin_conv2d");
    fails_with(
        "dup.toml",
        &format!("[[plugin]]\npath = \"{ex}\"\n[[plugin]]\npath = \"{ex}\"\n"),
        "declares backend `example`, which plugin",
    );
}

fn misbehave(mode: &str) -> (bool, String, String) {
    let p = temp(
        &format!("mis-{mode}.toml"),
        &format!(
            "[partition]\nstrict = true\nbind_constants = false\n[[plugin]]\npath = \"{}\"\n[[backend]]\nname = \"misbehave\"\n[backend.options]\nmode = \"{mode}\"\n",
            lib("fusebox_plugin_test_misbehave")
        ),
    );
    fusebox(&[
        "partition",
        "examples/conv2d_relu.relax",
        "--config",
        &p.display().to_string(),
        "--emit",
        "json",
    ])
}

#[test]
fn misbehaving_plugins_become_errors_naming_the_library() {
    for (mode, needle) in [
        (
            "claim_panic",
            "`claim` panicked: panicked: claim panicked on purpose",
        ),
        ("claim_error", "`claim` failed: claim failed on purpose"),
        (
            "compile_panic",
            "`compile` panicked: panicked: compile panicked on purpose",
        ),
        (
            "compile_error",
            "`compile` failed: compile failed on purpose",
        ),
        ("create_error", "`create` failed: create failed on purpose"),
    ] {
        let (ok, _, err) = misbehave(mode);
        assert!(!ok, "{mode} succeeded");
        assert!(err.contains(needle), "{mode}: `{needle}` not in {err}");
        assert!(
            err.contains("libfusebox_plugin_test_misbehave"),
            "{mode}: {err}"
        );
    }
}

const RELU: &str = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((2, 3), dtype="float32")):
        with R.dataflow():
            gv = R.nn.relu(x)
            R.output(gv)
        return gv
"#;

/// `fusebox run` of a lone relu through the misbehaving plugin in `mode`.
fn misbehave_run(mode: &str) -> (bool, String, String) {
    let model = temp("relu.relax", RELU);
    let p = temp(
        &format!("mis-run-{mode}.toml"),
        &format!(
            "[partition]\nstrict = true\nbind_constants = false\n[[plugin]]\npath = \"{}\"\n[[backend]]\nname = \"misbehave\"\n[backend.options]\nmode = \"{mode}\"\n",
            lib("fusebox_plugin_test_misbehave")
        ),
    );
    let out = temp(&format!("out-{mode}"), "");
    let _ = std::fs::remove_file(&out);
    fusebox(&[
        "run",
        &model.display().to_string(),
        "--config",
        &p.display().to_string(),
        "--output-dir",
        &out.display().to_string(),
    ])
}

#[test]
fn plugin_run_failures_and_panics_are_typed_errors() {
    // The healthy mode runs (so the failures below are the run's, not the setup's).
    let (ok, _, err) = misbehave_run("ok");
    assert!(ok, "{err}");
    for (mode, needle) in [
        ("run_error", "`run` failed: run failed on purpose"),
        // The panic is caught at the boundary: the host gets FB_PANIC with the message and the
        // process exits with an error (no abort, no signal, no host panic: see `fusebox`).
        (
            "run_panic",
            "`run` panicked: panicked: run panicked on purpose",
        ),
    ] {
        let (ok, _, err) = misbehave_run(mode);
        assert!(!ok, "{mode} succeeded");
        assert!(err.contains(needle), "{mode}: `{needle}` not in {err}");
        assert!(
            err.contains("plugin ") && err.contains("libfusebox_plugin_test_misbehave"),
            "{mode}: the plugin is not named in {err}"
        );
    }
}

#[test]
fn plugin_run_panic_is_caught_in_process() {
    let cfg = format!(
        "[partition]\nstrict = true\nbind_constants = false\n[[plugin]]\npath = \"{}\"\n[[backend]]\nname = \"misbehave\"\n[backend.options]\nmode = \"run_panic\"\n",
        lib("fusebox_plugin_test_misbehave")
    );
    let cfg = Config::parse(&cfg, "inline.toml").unwrap_or_else(|e| panic!("{e}"));
    let pipeline = fusebox::pipeline(cfg).unwrap_or_else(|e| panic!("{e}"));
    let m = fusebox::core::text::parse_module_str(RELU).unwrap_or_else(|e| panic!("{e}"));
    let plan = pipeline.run(&m).unwrap_or_else(|e| panic!("{e}"));
    let args = vec![Value::Tensor(random(vec![2, 3], 7))];
    // Twice: the process (this test) survives the first panic and the plugin still answers.
    for _ in 0..2 {
        match fusebox::execute(&plan, "main", args.clone()) {
            Ok(_) => panic!("run_panic ran"),
            Err(e) => {
                let e = e.to_string();
                assert!(
                    e.contains("`run` panicked: panicked: run panicked on purpose"),
                    "{e}"
                );
                assert!(e.contains("libfusebox_plugin_test_misbehave"), "{e}");
            }
        }
    }
}

#[test]
fn null_callbacks_are_refused_at_load_naming_the_fields() {
    let p = temp(
        "null-cb.toml",
        &format!(
            "[[plugin]]\npath = \"{}\"\n[[backend]]\nname = \"misbehave\"\n",
            lib("fusebox_plugin_test_misbehave")
        ),
    );
    let out = Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("FUSEBOX_TEST_MISBEHAVE_TABLE", "null_callbacks")
        .args(["backends", "--config", &p.display().to_string()])
        .output();
    let Ok(out) = out else {
        panic!("cannot run fusebox")
    };
    let err = String::from_utf8_lossy(&out.stderr);
    // A segfault has no exit code.
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("libfusebox_plugin_test_misbehave")
            && err.contains("callback(s) `claim`, `free_string` are NULL"),
        "{err}"
    );
}

/// Runs fusebox with `args`, killing it after `secs`: `None` when it had to be killed.
fn fusebox_within(args: &[&str], secs: u64) -> Option<(bool, String)> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run fusebox: {e}"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        match child.try_wait() {
            Ok(Some(st)) => {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                return Some((st.success(), err));
            }
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

#[cfg(unix)]
#[test]
fn a_fifo_plugin_path_is_refused_without_blocking() {
    let dir = std::env::temp_dir().join(format!("fusebox-fifo-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let fifo = dir.join("libfifo.so");
    let _ = std::fs::remove_file(&fifo);
    let st = Command::new("mkfifo").arg(&fifo).status();
    assert!(matches!(st, Ok(s) if s.success()), "mkfifo failed");
    // Through a symlink too: the check follows it.
    let link = dir.join("liblink.so");
    let _ = std::fs::remove_file(&link);
    let linked = std::os::unix::fs::symlink(&fifo, &link).is_ok();
    for path in [Some(&fifo), linked.then_some(&link)].into_iter().flatten() {
        let cfg = dir.join("fifo.toml");
        let _ = std::fs::write(&cfg, format!("[[plugin]]\npath = \"{}\"\n", path.display()));
        let Some((ok, err)) =
            fusebox_within(&["backends", "--config", &cfg.display().to_string()], 20)
        else {
            panic!("fusebox blocked on the FIFO {}", path.display())
        };
        assert!(!ok);
        assert!(
            err.contains(&format!(
                "plugin {}: not a regular file (a FIFO)",
                path.display()
            )),
            "{err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_configs_are_positioned_errors() {
    fails_with(
        "key.toml",
        "target = \"cpu\"\nbackends = []\n",
        "key.toml:2:1: unknown field `backends`, expected one of",
    );
    fails_with(
        "unknown.toml",
        "[[backend]]\nname = \"tensorrt\"\n",
        "unknown.toml:2:8: unknown backend `tensorrt`; expected one of: cpu, cublas",
    );
    fails_with(
        "pattern.toml",
        "[[pattern]]\nname = \"cpu.x\"\npattern = \"relax.nn.relu(_\"\n",
        "pattern.toml:3:",
    );
    fails_with(
        "option.toml",
        "[[backend]]\nname = \"cpu\"\n[backend.options]\ntile = 4\n",
        "unknown option of backend `cpu` `tile`",
    );
    fails_with(
        "threads.toml",
        "[[backend]]\nname = \"cpu\"\n[backend.options]\nthreads = 0\n",
        "option `threads`: expected an integer from 1 to 256, found 0",
    );
}
