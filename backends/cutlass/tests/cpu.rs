//! CPU-side tests of the cutlass backend: claims and decline reasons on partitioned modules,
//! the typed no-device compile error and the pipeline's fallback, `build` (the `.cu`, the
//! `.cubin` and the launch; needs NVRTC), and option validation through the registry.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failure is a panic"
)]

use fusebox_cuda::testing as common;

use fusebox_core::backend::pipeline::BackendPipeline;
use fusebox_core::backend::{Backend, Candidate, Claim, make_backend};
use fusebox_core::config::Config;
use fusebox_core::ir::Module;
use fusebox_cutlass::CutlassBackend;

const CONFIG: &str = r#"
target = "cuda"
[partition]
bind_constants = false
annotate_codegen = true
fuse_ops = false
[[backend]]
name = "cutlass"
[[backend]]
name = "cpu"
"#;

fn pipeline() -> BackendPipeline {
    fusebox_cpu::link();
    fusebox_cutlass::link();
    BackendPipeline::new(Config::parse(CONFIG, "cutlass-test.toml").unwrap(), None).unwrap()
}

fn module(src: &str) -> Module {
    fusebox_core::text::parse_module_str(src).unwrap_or_else(|e| panic!("{e}"))
}

fn partition(m: &Module) -> Module {
    fusebox_core::transform::fuse_ops_by_pattern(
        m,
        &pipeline().patterns(),
        fusebox_core::transform::PartitionOptions {
            bind_constants: false,
            annotate_codegen: true,
        },
    )
    .unwrap()
    .module
}

fn claims(m: &Module) -> Vec<(String, Claim)> {
    let out = partition(m);
    let b = CutlassBackend::default();
    out.functions
        .iter()
        .filter(|(n, _)| n.as_str() != "main")
        .map(|(n, f)| {
            let c = Candidate {
                name: n,
                func: f,
                module: &out,
            };
            (n.clone(), b.claim(&c))
        })
        .collect()
}

const MIXED: &str = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((16, 32), dtype="float16"), w: R.Tensor((32, 64), dtype="float16"), b: R.Tensor((64,), dtype="float16"), xi: R.Tensor((16, 32), dtype="int8"), wi: R.Tensor((32, 64), dtype="int8"), xb: R.Tensor((4, 16, 32), dtype="float16"), w3: R.Tensor((4, 4, 32), dtype="float16"), r: R.Tensor((16, 64), dtype="float16"), cx: R.Tensor((2, 9, 9, 8), dtype="float32"), cw: R.Tensor((16, 3, 3, 8), dtype="float32"), cb: R.Tensor((16,), dtype="float32")):
        with R.dataflow():
            lv = R.matmul(x, w)
            lv1 = R.add(lv, b)
            lv2 = R.add(lv1, r)
            y1 = R.nn.relu(lv2)
            y2 = R.matmul(xi, wi, out_dtype="int32")
            y3 = R.matmul(xb, R.permute_dims(w3, axes=[0, 2, 1]))
            c1 = R.nn.conv2d(cx, cw, strides=[2, 2], padding=[1, 1, 1, 1], data_layout="NHWC", kernel_layout="OHWI")
            c2 = R.add(c1, cb)
            y4 = R.nn.silu(c2)
            R.output(y1, y2, y3, y4)
        return (y1, y2, y3, y4)
"#;

#[test]
fn claims_accept_runnable_functions_and_decline_with_reasons() {
    let got = claims(&module(MIXED));
    let find = |needle: &str| {
        got.iter()
            .find(|(n, _)| n.contains(needle))
            .unwrap_or_else(|| panic!("no function with {needle}: {got:?}"))
            .1
            .clone()
    };
    assert_eq!(
        find("matmul_relax_add_relax_add_relax_nn_relu"),
        Claim::Accept
    );
    assert_eq!(find("permute_dims"), Claim::Accept);
    assert_eq!(find("conv2d"), Claim::Accept);
    // The int8 matmul TVM's table accepts: declined with the reason.
    let int8 = got
        .iter()
        .find(|(_, c)| matches!(c, Claim::Decline { .. }))
        .map(|(_, c)| c.clone());
    match int8 {
        Some(Claim::Decline { reason }) => {
            assert!(reason.contains("float16, bfloat16 and float32"), "{reason}")
        }
        other => panic!("expected the int8 matmul to be declined: {other:?} in {got:?}"),
    }
}

#[test]
fn compile_without_a_device_is_the_typed_no_device_error_and_the_pipeline_moves_on() {
    if fusebox_cuda::Gpu::is_available() {
        println!("skipped: a CUDA device is present, so compile does not fail here");
        return;
    }
    let m = module(MIXED);
    let out = partition(&m);
    let (name, f) = out
        .functions
        .iter()
        .find(|(n, _)| n.contains("conv2d"))
        .unwrap();
    let e = CutlassBackend::default()
        .compile_function(name, f)
        .unwrap_err();
    assert!(e.is_no_device(), "{e:?}");
    assert!(e.to_string().starts_with("no CUDA device"), "{e}");
    let plan = pipeline().run(&m).unwrap();
    let c = plan.claims.iter().find(|c| c.function == *name).unwrap();
    assert_eq!(c.backend.as_deref(), Some("cpu"));
    assert_eq!(c.compile_failures.len(), 1);
    assert_eq!(c.compile_failures[0].0, "cutlass");
    assert!(c.compile_failures[0].1.contains("no CUDA device"));
}

#[test]
fn build_writes_source_cubin_and_launch() {
    if !common::nvrtc_or_skip("build_writes_source_cubin_and_launch") {
        return;
    }
    let m = module(MIXED);
    let out = partition(&m);
    let b = make_backend("cutlass", &toml::from_str("arch = \"sm_80\"").unwrap()).unwrap();
    for (name, f) in out.functions.iter().filter(|(n, _)| n.as_str() != "main") {
        let c = Candidate {
            name,
            func: f,
            module: &out,
        };
        if !matches!(b.claim(&c), Claim::Accept) {
            continue;
        }
        let built = b.build(&c).unwrap().unwrap();
        assert_eq!(built.arch.as_deref(), Some("sm_80"));
        let names: Vec<&str> = built.files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names.len(), 3, "{names:?}");
        assert!(names[0].ends_with(".cu") && names[1].ends_with(".cubin"));
        assert!(!built.files[1].1.is_empty());
        let text = String::from_utf8(built.files[2].1.clone()).unwrap();
        assert_eq!(built.kernels.len(), 1, "{text}");
        let k = &built.kernels[0];
        assert!(names[0].starts_with(&k.name));
        println!("{text}");
        if name.contains("conv2d") {
            // f32 SIMT, 2x5x5 outputs of 16 channels: the smaller SIMT tile, one block.
            assert_eq!(
                k.name,
                "cutlass_f32_conv2d_fprop_64x64x8_t4x4_s3_a4_bias_silu"
            );
            assert_eq!(k.grid, [1, 1, 1]);
            assert_eq!(k.block, [256, 1, 1]);
            assert!(text.contains("out shape: [2, 5, 5, 16]"), "{text}");
        }
        if name.contains("permute_dims") {
            assert!(
                k.name
                    .starts_with("cutlass_f16_gemm_tn_64x64x32_32x32x32_s4_a8")
            );
            assert_eq!(k.grid, [1, 1, 4]);
        }
    }
}

#[test]
fn build_for_sm90a_takes_the_wgmma_path_where_it_applies() {
    if !common::nvrtc_or_skip("build_for_sm90a_takes_the_wgmma_path_where_it_applies") {
        return;
    }
    let m = module(MIXED);
    let out = partition(&m);
    let mut seen = Vec::new();
    for arch in ["sm_90a", "sm_90"] {
        let opts = toml::from_str(&format!("arch = \"{arch}\"")).unwrap();
        let b = make_backend("cutlass", &opts).unwrap();
        for (name, f) in out.functions.iter().filter(|(n, _)| n.as_str() != "main") {
            let c = Candidate {
                name,
                func: f,
                module: &out,
            };
            if !matches!(b.claim(&c), Claim::Accept) {
                continue;
            }
            let built = b.build(&c).unwrap().unwrap();
            assert_eq!(built.arch.as_deref(), Some(arch));
            assert!(!built.files[1].1.is_empty());
            let text = String::from_utf8(built.files[2].1.clone()).unwrap();
            let k = &built.kernels[0];
            println!("{arch}: {text}");
            if name.contains("conv2d") {
                // float32 conv2d: SIMT on every arch, with the reason.
                assert!(text.contains("path: simt ("), "{text}");
                assert!(!k.name.contains("wgmma"), "{}", k.name);
            } else if arch == "sm_90a" {
                // f16 matmuls with K (and N) multiples of 8: wgmma, 384 threads.
                assert!(k.name.contains("_wgmma_s4_a8"), "{}", k.name);
                assert_eq!(k.block, [384, 1, 1]);
                assert!(text.contains("path: wgmma + TMA (sm_90a)"), "{text}");
                let src = String::from_utf8(built.files[0].1.clone()).unwrap();
                assert!(src.contains("wgmma.mma_async.sync.aligned.m64n"));
                assert!(src.contains("cp.async.bulk.tensor.3d"));
                seen.push(k.name.clone());
            } else {
                assert!(!k.name.contains("wgmma"), "{}", k.name);
                assert!(
                    text.contains("path: mma.sync (wgmma needs sm_90a"),
                    "{text}"
                );
            }
        }
    }
    // The bias + residual + relu matmul (row-major rhs) and the batched transposed one.
    assert!(seen.iter().any(|k| k.contains("gemm_nn")), "{seen:?}");
    assert!(seen.iter().any(|k| k.contains("gemm_tn")), "{seen:?}");
}

#[test]
fn options_are_validated_through_the_registry() {
    fusebox_cutlass::link();
    let bad = make_backend("cutlass", &toml::from_str("profile = 3").unwrap());
    assert!(bad.is_err_and(|e| e.to_string().contains("expected true or false")));
    let unknown = make_backend("cutlass", &toml::from_str("tiles = 3").unwrap());
    assert!(unknown.is_err());
    let bf16 = make_backend("cutlass", &toml::from_str("bf16 = true").unwrap()).unwrap();
    assert_eq!(bf16.patterns().len(), 50);
}
