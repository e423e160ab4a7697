//! CPU-only tests of the cuBLAS backend: claims and their decline reasons, the typed
//! "no CUDA device" compile error, the pipeline's report (compile failure → next backend),
//! `explain`, and option validation. They run everywhere; the parts that assume no GPU say so
//! and are skipped (with a printed reason) where a device is present.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failure is a panic"
)]

use fusebox_core::backend::pipeline::BackendPipeline;
use fusebox_core::backend::{Backend, Candidate, Claim, make_backend};
use fusebox_core::config::Config;
use fusebox_core::ir::Module;
use fusebox_core::runtime::{Tensor, Value};
use fusebox_cublas::{CublasBackend, Error, Options};

const CONFIG: &str = r#"
target = "cuda"
[partition]
bind_constants = false
annotate_codegen = true
fuse_ops = false
[[backend]]
name = "cublas"
[[backend]]
name = "cpu"
"#;

fn link() {
    fusebox_cpu::link();
    fusebox_cublas::link();
}

fn pipeline() -> BackendPipeline {
    link();
    let config = Config::parse(CONFIG, "cublas-test.toml").unwrap();
    BackendPipeline::new(config, None).unwrap()
}

fn module(src: &str) -> Module {
    fusebox_core::text::parse_module_str(src).unwrap_or_else(|e| panic!("{e}"))
}

/// Every function the partition made, with the cublas backend's verdict on it.
fn claims(m: &Module) -> Vec<(String, Claim)> {
    let p = pipeline();
    let out = fusebox_core::transform::fuse_ops_by_pattern(
        m,
        &p.patterns(),
        fusebox_core::transform::PartitionOptions {
            bind_constants: false,
            annotate_codegen: true,
        },
    )
    .unwrap();
    let b = CublasBackend::default();
    out.module
        .functions
        .iter()
        .filter(|(n, _)| n.as_str() != "main")
        .map(|(n, f)| {
            let c = Candidate {
                name: n,
                func: f,
                module: &out.module,
            };
            (n.clone(), b.claim(&c))
        })
        .collect()
}

const MIXED: &str = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((16, 32), dtype="float16"), w: R.Tensor((32, 64), dtype="float16"), b: R.Tensor((64,), dtype="float16"), xi: R.Tensor((16, 32), dtype="int8"), wi: R.Tensor((32, 64), dtype="int8"), xb: R.Tensor((4, 16, 32), dtype="float16"), w3: R.Tensor((4, 32, 4), dtype="float16"), s: R.Tensor((1,), dtype="float16"), w2: R.Tensor((64, 64), dtype="float16")):
        with R.dataflow():
            lv = R.matmul(x, w)
            lv1 = R.add(lv, b)
            y1 = R.nn.gelu(lv1)
            y2 = R.matmul(xi, wi)
            y3 = R.matmul(xb, R.permute_dims(w3))
            lv2 = R.matmul(y1, w2)
            y4 = R.add(lv2, s)
            R.output(y2, y3, y4)
        return (y2, y3, y4)
"#;

#[test]
fn claims_accept_runnable_functions_and_decline_with_reasons() {
    let got = claims(&module(MIXED));
    let find = |name: &str| {
        got.iter()
            .find(|(n, _)| n == name)
            .map(|(_, c)| c.clone())
            .unwrap_or_else(|| panic!("no `{name}` in {got:?}"))
    };
    assert_eq!(
        find("fused_relax_matmul_relax_add_relax_nn_gelu_cublas"),
        Claim::Accept
    );
    // int8 x int8 -> int8: TVM partitions it, cuBLASLt's int8 GEMM cannot write int8 with
    // the reference's wrapping.
    let Claim::Decline { reason } = find("fused_relax_matmul_cublas") else {
        panic!("the int8 -> int8 matmul was accepted: {got:?}")
    };
    assert!(
        reason.contains("an int8 matmul writing int8") && reason.contains("out_dtype=\"int32\""),
        "{reason}"
    );
    // permute_dims(axes=None) of a rank-3 weight reverses all axes: not a transpose.
    let Claim::Decline { reason } = find("fused_relax_permute_dims_relax_matmul_cublas") else {
        panic!("the rank-3 permute was accepted: {got:?}")
    };
    assert_eq!(
        reason,
        "permute_dims(axes=None) of a rank-3 tensor is not a transpose of the last two axes"
    );
    // A one-element bias passes TVM's vector check but is not N values.
    let Claim::Decline { reason } = find("fused_relax_matmul_relax_add_cublas") else {
        panic!("the scalar bias was accepted: {got:?}")
    };
    assert!(
        reason.contains("the bias has 1 value(s) in its last dim but the output has 64 columns"),
        "{reason}"
    );
}

#[test]
fn claim_declines_other_codegens_and_plain_functions() {
    let m = module(
        r#"
@I.ir_module
class Module:
    @R.function(private=True)
    def fused_relu(x: R.Tensor((4,), dtype="float32")) -> R.Tensor((4,), dtype="float32"):
        R.func_attr({"Primitive": True})
        with R.dataflow():
            gv = R.nn.relu(x)
            R.output(gv)
        return gv

    @R.function(private=True)
    def other(x: R.Tensor((4, 4), dtype="float32"), w: R.Tensor((4, 4), dtype="float32")) -> R.Tensor((4, 4), dtype="float32"):
        R.func_attr({"Composite": "dnnl.matmul", "Primitive": True})
        with R.dataflow():
            gv = R.matmul(x, w)
            R.output(gv)
        return gv

    @R.function
    def main(x: R.Tensor((4,), dtype="float32")) -> R.Tensor((4,), dtype="float32"):
        cls = Module
        with R.dataflow():
            gv = cls.fused_relu(x)
            R.output(gv)
        return gv
"#,
    );
    let b = CublasBackend::default();
    let claim = |n: &str| {
        b.claim(&Candidate {
            name: n,
            func: m.get(n).unwrap(),
            module: &m,
        })
    };
    assert_eq!(
        claim("fused_relu"),
        Claim::Decline {
            reason: "it is neither a `cublas.*` composite nor a `Codegen = \"cublas\"` function"
                .into()
        }
    );
    assert_eq!(
        claim("other"),
        Claim::Decline {
            reason: "composite `dnnl.matmul` is not a cublas pattern".into()
        }
    );
}

const MLP: &str = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((8, 32), dtype="float32"), w: R.Tensor((32, 16), dtype="float32"), b: R.Tensor((16,), dtype="float32")):
        with R.dataflow():
            lv = R.matmul(x, w)
            lv1 = R.add(lv, b)
            y = R.nn.relu(lv1)
            R.output(y)
        return y
"#;

#[test]
fn compile_without_a_device_is_the_typed_no_device_error() {
    link();
    if fusebox_cuda::Gpu::is_available() {
        println!("skipped: a CUDA device is present, so compile does not fail here");
        return;
    }
    let m = module(MLP);
    let p = pipeline();
    let out = fusebox_core::transform::fuse_ops_by_pattern(
        &m,
        &p.patterns(),
        fusebox_core::transform::PartitionOptions {
            bind_constants: false,
            annotate_codegen: true,
        },
    )
    .unwrap();
    let name = "fused_relax_matmul_relax_add_relax_nn_relu_cublas";
    let f = out.module.get(name).unwrap();
    let b = CublasBackend::default();
    // This crate's error: the typed variant.
    let e = b.compile_function(name, f).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Cuda(fusebox_cuda::Error::NoDevice { .. }) | Error::NoDevice { .. }
        ),
        "{e:?}"
    );
    assert!(e.is_no_device());
    assert!(e.to_string().starts_with("no CUDA device: "), "{e}");
    // Through the Backend trait: fusebox-core's backend error naming `cublas`.
    let c = Candidate {
        name,
        func: f,
        module: &out.module,
    };
    match b.compile(&c) {
        Err(fusebox_core::Error::Backend { backend, message }) => {
            assert_eq!(backend, "cublas");
            assert!(message.starts_with("no CUDA device: "), "{message}");
        }
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("compiled without a device"),
    }
    // The analysis still ran first: an unsupported function says so, not "no device".
    let e = b
        .compile_function("main", out.module.get("main").unwrap())
        .unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
}

#[test]
fn pipeline_falls_back_to_the_next_backend_and_reports_why() {
    link();
    // No device, or a device without libcublasLt: the compile fails and `cpu` runs it.
    let runtime = fusebox_cublas::Runtime::get();
    let no_gpu = runtime.is_err();
    let m = module(MLP);
    let p = pipeline();
    let plan = p.run(&m).unwrap();
    let name = "fused_relax_matmul_relax_add_relax_nn_relu_cublas";
    let c = plan
        .claims
        .iter()
        .find(|c| c.function == name)
        .unwrap_or_else(|| panic!("no claim for {name}"));
    assert!(c.declines.is_empty(), "{:?}", c.declines);
    if no_gpu {
        assert_eq!(c.backend.as_deref(), Some("cpu"));
        assert!(
            !c.fallback,
            "cpu is listed in the config, so it is a claim, not a fallback"
        );
        assert_eq!(c.compile_failures.len(), 1);
        assert_eq!(c.compile_failures[0].0, "cublas");
        let why = runtime.err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(
            c.compile_failures[0].1,
            format!("backend `cublas`: {why}"),
            "{:?}",
            c.compile_failures
        );
        let json = plan.report().to_json();
        assert!(json.contains(&why), "{json}");
        // And the function still runs (on the CPU) with the reference's numbers.
        let x = Tensor::from_f32(
            vec![8, 32],
            (0..256).map(|i| (i % 7) as f32 - 3.0).collect(),
        )
        .unwrap();
        let w = Tensor::from_f32(
            vec![32, 16],
            (0..512).map(|i| (i % 5) as f32 - 2.0).collect(),
        )
        .unwrap();
        let bias = Tensor::from_f32(vec![16], (0..16).map(|i| i as f32 - 8.0).collect()).unwrap();
        let args = vec![Value::Tensor(x), Value::Tensor(w), Value::Tensor(bias)];
        let hook = |n: &str, vals: &[Value]| plan.artifacts.get(n).map(|a| a.run(vals));
        let got = fusebox_cpu::run_with(&plan.module, "main", args.clone(), Some(&hook)).unwrap();
        let want = fusebox_cpu::run(&m, "main", args).unwrap();
        assert_eq!(got, want);
    } else {
        println!("skipped the fallback assertions: a CUDA device and cuBLASLt are present");
        assert_eq!(c.backend.as_deref(), Some("cublas"));
    }
}

#[test]
fn explain_shows_the_checks_reason() {
    let m = module(
        r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((16, 32), dtype="float16"), w: R.Tensor((32, 64), dtype="float16"), bias: R.Tensor((16, 64), dtype="float16")):
        with R.dataflow():
            lv = R.matmul(x, w)
            y = R.add(lv, bias)
            R.output(y)
        return y
"#,
    );
    let text = pipeline().explain(&m, "y").unwrap();
    assert!(
        text.contains(
            "cublas.matmul_bias [cublas]: matched here, rejected: check `cublas_matmul` rejected \
             it: the bias must be a vector (one row broadcast over the output): bias shape \
             (16, 64) has 16 rows"
        ),
        "{text}"
    );
    let text = pipeline().explain(&m, "lv").unwrap();
    assert!(
        text.contains("cublas.matmul [cublas]: matched here"),
        "{text}"
    );
    assert!(
        text.contains("ended in `fused_relax_matmul_cublas` (relax.matmul)"),
        "{text}"
    );
}

#[test]
fn options_are_validated_through_the_registry() {
    link();
    let t: toml::Table = toml::from_str("autotune = true\nallow_tf32 = true").unwrap();
    assert!(make_backend("cublas", &t).is_ok());
    let bad: toml::Table = toml::from_str("tf32 = true").unwrap();
    let e = make_backend("cublas", &bad).err().map(|e| e.to_string());
    assert_eq!(
        e.as_deref(),
        Some(
            "unknown option of backend `cublas` `tf32`; expected one of: autotune, allow_tf32, \
             candidates"
        )
    );
    let bad: toml::Table = toml::from_str("candidates = 100").unwrap();
    let e = make_backend("cublas", &bad).err().map(|e| e.to_string());
    assert!(e.is_some_and(|e| e.contains("expected an integer from 1 to 32")));
    assert_eq!(
        Options::from_table(&toml::Table::new()).ok(),
        Some(Options::default())
    );
}

#[test]
fn build_writes_the_plan() {
    let m = module(MLP);
    let p = pipeline();
    let out = fusebox_core::transform::fuse_ops_by_pattern(
        &m,
        &p.patterns(),
        fusebox_core::transform::PartitionOptions {
            bind_constants: false,
            annotate_codegen: true,
        },
    )
    .unwrap();
    let name = "fused_relax_matmul_relax_add_relax_nn_relu_cublas";
    let c = Candidate {
        name,
        func: out.module.get(name).unwrap(),
        module: &out.module,
    };
    let built = CublasBackend::default().build(&c).unwrap().unwrap();
    assert_eq!(built.files.len(), 1);
    let text = String::from_utf8(built.files[0].1.clone()).unwrap();
    assert_eq!(
        text,
        "fused_relax_matmul_relax_add_relax_nn_relu_cublas: cublas.matmul_bias_relu (float32 -> \
         float32, bias, relu)\nplan: m=16 n=8 k=32 NN batch=1 float32xfloat32->float32 F32 \
         CUBLASLT_EPILOGUE_RELU_BIAS\nout shape: [8, 16]\n"
    );
}
