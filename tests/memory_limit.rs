//! The memory bound of issue 18 item 7: each reproducer in `tests/memory/` makes `fusebox run`
//! exit 1 with a typed error naming the op (or input), dtype and shape, under
//! `prlimit --as=8G` (it used to allocate until the OOM killer ended it, abort on a failed
//! allocation, or panic on capacity overflow); `--memory-limit`, `.npy` headers and the
//! reproducers' IR-level checks are tested here too.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failure is a panic"
)]

use fusebox_core::frontend::onnx::proto::*;
use prost::Message;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/memory")
        .join(name)
}

/// The ONNX reproducer: `Expand` of a `(1, 1)` input to `(10^6, 10^6)` (4 TB of float32).
fn expand_model() -> Vec<u8> {
    let dims = |d: &[i64]| TensorShapeProto {
        dim: d
            .iter()
            .map(|&v| Dimension {
                dim_value: Some(v),
                dim_param: None,
            })
            .collect(),
    };
    ModelProto {
        ir_version: 8,
        producer_name: "fusebox tests/memory_limit.rs".into(),
        graph: Some(GraphProto {
            node: vec![NodeProto {
                input: vec!["x".into(), "shape".into()],
                output: vec!["y".into()],
                name: "expand".into(),
                op_type: "Expand".into(),
                attribute: vec![],
                domain: String::new(),
            }],
            name: "g".into(),
            initializer: vec![TensorProto {
                name: "shape".into(),
                dims: vec![2],
                data_type: 7,
                raw_data: [1_000_000i64, 1_000_000]
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect(),
                ..Default::default()
            }],
            input: vec![ValueInfoProto {
                name: "x".into(),
                r#type: Some(TypeProto {
                    tensor_type: Some(TypeProtoTensor {
                        elem_type: 1,
                        shape: Some(dims(&[1, 1])),
                    }),
                }),
            }],
            output: vec![ValueInfoProto {
                name: "y".into(),
                r#type: None,
            }],
            value_info: vec![],
        }),
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 13,
        }],
    }
    .encode_to_vec()
}

#[test]
fn the_expand_fixture_is_the_model_built_here() {
    let path = fixture("expand_1e6.onnx");
    if std::env::var_os("FUSEBOX_WRITE_FIXTURES").is_some() {
        std::fs::write(&path, expand_model()).unwrap();
    }
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(
        on_disk,
        expand_model(),
        "{} is stale: rerun with FUSEBOX_WRITE_FIXTURES=1",
        path.display()
    );
}

/// `fusebox run <fixture>` under `prlimit --as=8G` (when prlimit is installed): exit code and
/// stderr.
fn run_limited(name: &str, extra: &[&str]) -> (Option<i32>, String) {
    let out_dir =
        std::env::temp_dir().join(format!("fusebox-memory-{}-{name}", std::process::id()));
    let exe = env!("CARGO_BIN_EXE_fusebox");
    let have_prlimit = Command::new("prlimit").arg("--version").output().is_ok();
    let mut cmd = if have_prlimit {
        let mut c = Command::new("prlimit");
        c.arg("--as=8589934592").arg(exe);
        c
    } else {
        eprintln!("prlimit is not installed: running without an address-space limit");
        Command::new(exe)
    };
    cmd.arg("run")
        .arg(fixture(name))
        .arg("--output-dir")
        .arg(&out_dir)
        .args(extra);
    let out = cmd.output().unwrap();
    let _ = std::fs::remove_dir_all(&out_dir);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_fails(name: &str, extra: &[&str], needles: &[&str]) {
    let (code, err) = run_limited(name, extra);
    assert_eq!(code, Some(1), "{name}: expected exit 1, stderr:\n{err}");
    for n in needles {
        assert!(err.contains(n), "{name}: expected `{n}` in stderr:\n{err}");
    }
}

#[test]
fn a_parameter_of_2_pow_40_elements_is_refused_before_it_is_generated() {
    assert_fails(
        "param_2p40.relax",
        &[],
        &[
            "memory limit exceeded: input `x` needs 4 TiB",
            "float32 [1099511627776]",
        ],
    );
}

#[test]
fn an_input_of_2_pow_20_squared_is_refused() {
    assert_fails(
        "input_2p20_sq.relax",
        &[],
        &[
            "memory limit exceeded: input `x` needs 4 TiB",
            "float32 [1048576, 1048576]",
        ],
    );
}

#[test]
fn an_onnx_expand_to_a_million_squared_is_refused_before_its_kernel_runs() {
    assert_fails(
        "expand_1e6.onnx",
        &[],
        &[
            "memory limit exceeded: relax.broadcast_to needs",
            "4000000000000 bytes",
            "float32 [1000000, 1000000]",
        ],
    );
}

#[test]
fn a_conv2d_with_pads_of_2_pow_40_is_a_type_error() {
    assert_fails(
        "conv_pads_2p40.relax",
        &[],
        &[
            "relax.nn.conv2d",
            "the result dim `2199023255554` is out of range",
        ],
    );
}

#[test]
fn a_conv2d_with_a_dilation_of_2_pow_62_is_a_type_error_not_a_wrapped_shape() {
    assert_fails(
        "conv_dilation_2p62.relax",
        &[],
        &[
            "relax.nn.conv2d",
            "the result would have a negative extent (-9223372036854775804)",
        ],
    );
}

#[test]
fn adaptive_avg_pool2d_to_2_pow_40_rows_is_refused_before_its_kernel_runs() {
    assert_fails(
        "adaptive_pool_2p40.relax",
        &[],
        &[
            "memory limit exceeded: relax.nn.adaptive_avg_pool2d needs 4 TiB",
            "float32 [1, 1, 1099511627776, 1]",
        ],
    );
}

#[test]
fn the_memory_limit_flag_bounds_every_tensor_of_the_run() {
    // conv_pads' little sibling: a (1, 1, 4, 4) input is 64 bytes.
    assert_fails(
        "adaptive_pool_2p40.relax",
        &["--memory-limit", "32B"],
        &["memory limit exceeded: input `x` needs 64 B", "limit 32 B"],
    );
    let (code, err) = run_limited("adaptive_pool_2p40.relax", &["--memory-limit", "nonsense"]);
    assert_eq!(code, Some(2), "a bad size is a usage error:\n{err}");
    assert!(err.contains("invalid size `nonsense`"), "{err}");
}

#[test]
fn an_npy_header_claiming_more_than_the_file_holds_is_refused_unread() {
    // A valid header for a (2^20, 2^20) float32 array, and 16 bytes of data.
    let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1048576, 1048576), }";
    let mut h = header.to_string();
    while !(10 + h.len() + 1).is_multiple_of(64) {
        h.push(' ');
    }
    h.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(h.len() as u16).to_le_bytes());
    bytes.extend_from_slice(h.as_bytes());
    bytes.extend_from_slice(&[0u8; 16]);
    let path = std::env::temp_dir().join(format!("fusebox-memory-{}.npy", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let err = fusebox::read_npy(&path).unwrap_err().to_string();
    let _ = std::fs::remove_file(&path);
    assert!(
        err.contains("the header's shape [1048576, 1048576] (float32) needs 4398046511104 bytes"),
        "{err}"
    );
}

#[test]
fn the_config_sets_the_limit_and_the_flag_overrides_it() {
    let cfg = std::env::temp_dir().join(format!("fusebox-memory-{}.toml", std::process::id()));
    std::fs::write(
        &cfg,
        "[runtime]\nmemory_limit = \"32B\"\n[[backend]]\nname = \"cpu\"\n",
    )
    .unwrap();
    let cfg_s = cfg.to_string_lossy().into_owned();
    assert_fails(
        "adaptive_pool_2p40.relax",
        &["--config", &cfg_s],
        &["memory limit exceeded: input `x` needs 64 B", "limit 32 B"],
    );
    // The flag wins: 1 KiB admits the input, not the 4 TiB result.
    assert_fails(
        "adaptive_pool_2p40.relax",
        &["--config", &cfg_s, "--memory-limit", "1KiB"],
        &["relax.nn.adaptive_avg_pool2d needs 4 TiB", "limit 1 KiB"],
    );
    let _ = std::fs::remove_file(&cfg);
}
