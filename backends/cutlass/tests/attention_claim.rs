//! The `cutlass.attention*` claim without a device: `relax.nn.attention` /
//! `relax.nn.attention_bias` partition into TVM's `cutlass.attention_bias` /
//! `cutlass.attention` composites, the backend claims exactly what the fused kernel runs
//! (float16/bfloat16, head_dim 32–128 in steps of 16, head_dim_v = head_dim, no window) and
//! declines the rest with the reason, and `build` compiles the claimed functions' kernels with
//! NVRTC (`FUSEBOX_REQUIRE_NVRTC=1` makes a missing NVRTC a failure).

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failure is a panic"
)]

use fusebox_core::backend::{Backend, Candidate, Claim, make_backend};
use fusebox_core::ir::Module;
use fusebox_cuda::testing as common;
use fusebox_cutlass::CutlassBackend;

fn partition(m: &Module) -> Module {
    fusebox_cutlass::link();
    fusebox_core::transform::fuse_ops_by_pattern(
        m,
        &CutlassBackend::default().patterns(),
        fusebox_core::transform::PartitionOptions {
            bind_constants: false,
            annotate_codegen: true,
        },
    )
    .unwrap()
    .module
}

fn ty(s: &str, d: &str) -> String {
    format!("R.Tensor({s}, dtype=\"{d}\")")
}

/// One attention binding `y` in `main`.
fn one(q: &str, k: &str, v: &str, bias: Option<&str>, dtype: &str, attrs: &str) -> String {
    let mut params = format!(
        "q: {}, k: {}, v: {}",
        ty(q, dtype),
        ty(k, dtype),
        ty(v, dtype)
    );
    let call = match bias {
        Some(b) => {
            params.push_str(&format!(", b: {}", ty(b, dtype)));
            format!("R.nn.attention_bias(q, k, v, b{attrs})")
        }
        None => format!("R.nn.attention(q, k, v{attrs})"),
    };
    format!(
        "@I.ir_module\nclass Module:\n    @R.function\n    def main({params}):\n        with R.dataflow():\n            y = {call}\n            R.output(y)\n        return y\n"
    )
}

/// The partitioned module's only non-main function, and the cutlass claim of it.
fn claim_of(src: &str) -> (String, Module, Claim) {
    let m = fusebox_core::text::parse_module_str(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let out = partition(&m);
    let funcs: Vec<&String> = out.functions.keys().filter(|n| *n != "main").collect();
    assert_eq!(funcs.len(), 1, "{src}");
    let name = funcs[0].clone();
    let c = Candidate {
        name: &name,
        func: &out.functions[&name],
        module: &out,
    };
    let claim = CutlassBackend::default().claim(&c);
    (name, out.clone(), claim)
}

#[test]
fn attention_partitions_into_tvms_composites() {
    let src = one(
        "(2, 37, 8, 64)",
        "(2, 53, 2, 64)",
        "(2, 53, 2, 64)",
        Some("(1, 8, 37, 53)"),
        "float16",
        ", causal_mask=\"BottomRight\"",
    );
    let (name, out, claim) = claim_of(&src);
    assert_eq!(name, "fused_relax_nn_attention_bias_cutlass");
    assert_eq!(claim, Claim::Accept);
    let text = fusebox_core::text::print_module(&out).text;
    assert!(
        text.contains("R.func_attr({\"Composite\": \"cutlass.attention_bias\"})"),
        "{text}"
    );
    assert!(
        text.contains("R.func_attr({\"Codegen\": \"cutlass\"})"),
        "{text}"
    );
    let (name, out, claim) = claim_of(&one(
        "(1, 5, 4, 128)",
        "(1, 9, 4, 128)",
        "(1, 9, 4, 128)",
        None,
        "bfloat16",
        ", scale=0.1",
    ));
    assert_eq!(name, "fused_relax_nn_attention_cutlass");
    assert_eq!(claim, Claim::Accept);
    let text = fusebox_core::text::print_module(&out).text;
    assert!(
        text.contains("R.func_attr({\"Composite\": \"cutlass.attention\"})"),
        "{text}"
    );
}

#[test]
fn the_spec_maps_operands_to_the_functions_arguments() {
    use fusebox_cutlass::attention::{CausalMask, Layout};
    let (name, out, _) = claim_of(&one(
        "(2, 37, 8, 64)",
        "(2, 53, 2, 64)",
        "(2, 53, 2, 64)",
        Some("(1, 8, 37, 53)"),
        "float16",
        ", scale=0.25, causal_mask=\"BottomRight\"",
    ));
    let spec = fusebox_cutlass::spec::analyse_attention(&name, &out.functions[&name]).unwrap();
    assert_eq!(spec.qkv, [0, 1, 2]);
    assert_eq!(spec.bias, Some(3));
    assert_eq!(spec.num_params, 4);
    assert_eq!(spec.head_dim, 64);
    assert_eq!(spec.options.scale, Some(0.25));
    assert_eq!(spec.options.causal, Some(CausalMask::BottomRight));
    assert_eq!(spec.options.layout, Layout::Bsnh);
    assert_eq!(spec.kernel().name(), "fusebox_attn_f16_d64_causal_bias");
    // Self-attention on one tensor: one parameter feeds query, key and value.
    let src = "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: R.Tensor((1, 9, 2, 32), dtype=\"float16\")):\n        with R.dataflow():\n            y = R.nn.attention(x, x, x)\n            R.output(y)\n        return y\n";
    let (name, out, claim) = claim_of(src);
    assert_eq!(claim, Claim::Accept);
    let spec = fusebox_cutlass::spec::analyse_attention(&name, &out.functions[&name]).unwrap();
    assert_eq!((spec.qkv, spec.bias, spec.num_params), ([0, 0, 0], None, 1));
}

#[test]
fn the_claim_is_exact_and_declines_with_reasons() {
    let d = |q: &str, k: &str, v: &str, dtype: &str, attrs: &str, want: &str| {
        let (name, _, claim) = claim_of(&one(q, k, v, None, dtype, attrs));
        match claim {
            Claim::Decline { reason } => {
                assert!(reason.contains(want), "{name}: {reason}");
            }
            Claim::Accept => panic!("{name} ({q} {k} {v} {dtype}{attrs}) should be declined"),
        }
    };
    let s = "(1, 16, 2, 64)";
    d(s, s, s, "float32", "", "float16 or bfloat16");
    d(
        "(1, 16, 2, 40)",
        "(1, 16, 2, 40)",
        "(1, 16, 2, 40)",
        "float16",
        "",
        "head_dim 40",
    );
    d(
        "(1, 16, 2, 256)",
        "(1, 16, 2, 256)",
        "(1, 16, 2, 256)",
        "float16",
        "",
        "head_dim 256",
    );
    d(
        s,
        s,
        "(1, 16, 2, 32)",
        "float16",
        "",
        "head dim for the value",
    );
    d(
        s,
        s,
        s,
        "float16",
        ", causal_mask=\"BottomRight\", window_size=8",
        "sliding-window",
    );
    // Symbolic sequence lengths and batch are claimed (planned per call); a symbolic head dim
    // is not.
    let sym = "@I.ir_module\nclass Module:\n    @R.function\n    def main(q: R.Tensor((b, n, 4, 64), dtype=\"float16\"), k: R.Tensor((b, m, 4, 64), dtype=\"float16\"), v: R.Tensor((b, m, 4, 64), dtype=\"float16\")):\n        b = T.int64()\n        n = T.int64()\n        m = T.int64()\n        with R.dataflow():\n            y = R.nn.attention(q, k, v, causal_mask=\"TopLeft\")\n            R.output(y)\n        return y\n";
    assert_eq!(claim_of(sym).2, Claim::Accept);
    let symh = sym
        .replace(", 64)", ", h)")
        .replace("m = T.int64()", "m = T.int64()\n        h = T.int64()");
    match claim_of(&symh).2 {
        Claim::Decline { reason } => {
            assert!(reason.contains("head dim h is not static"), "{reason}")
        }
        Claim::Accept => panic!("a symbolic head dim should be declined"),
    }
}

#[test]
fn build_compiles_the_claimed_attention_kernels_with_nvrtc() {
    if !common::nvrtc_or_skip("build_compiles_the_claimed_attention_kernels_with_nvrtc") {
        return;
    }
    let cases = [
        (
            one(
                "(2, 37, 8, 64)",
                "(2, 53, 2, 64)",
                "(2, 53, 2, 64)",
                Some("(1, 8, 37, 53)"),
                "float16",
                ", causal_mask=\"BottomRight\"",
            ),
            "fusebox_attn_f16_d64_causal_bias",
            [1, 8, 2],
        ),
        (
            one(
                "(3, 130, 4, 128)",
                "(3, 7, 4, 128)",
                "(3, 7, 4, 128)",
                None,
                "bfloat16",
                "",
            ),
            "fusebox_attn_bf16_d128",
            [3, 4, 3],
        ),
    ];
    for arch in ["sm_80", "sm_90a"] {
        let b = make_backend(
            "cutlass",
            &toml::from_str(&format!("arch = \"{arch}\"")).unwrap(),
        )
        .unwrap();
        for (src, kernel, grid) in &cases {
            let m = fusebox_core::text::parse_module_str(src).unwrap();
            let out = partition(&m);
            let (name, f) = out
                .functions
                .iter()
                .find(|(n, _)| n.as_str() != "main")
                .unwrap();
            let c = Candidate {
                name,
                func: f,
                module: &out,
            };
            assert_eq!(b.claim(&c), Claim::Accept);
            let built = b.build(&c).unwrap().unwrap();
            let names: Vec<&str> = built.files.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(
                names,
                [
                    format!("{kernel}.cu").as_str(),
                    format!("{kernel}.cubin").as_str(),
                    format!("{name}.cutlass.txt").as_str()
                ],
                "{arch}"
            );
            assert!(
                built.files[1].1.len() > 1000,
                "{arch} {kernel}: empty cubin"
            );
            // sm_90a builds the plain sm_90 kernel (no sm_90a instruction in it).
            let want_arch = if arch == "sm_90a" { "sm_90" } else { arch };
            assert_eq!(built.arch.as_deref(), Some(want_arch));
            assert_eq!(built.kernels.len(), 1);
            let k = &built.kernels[0];
            assert_eq!(k.name, *kernel);
            assert_eq!(k.grid, *grid, "{arch} {kernel}");
            assert_eq!(k.block, [128, 1, 1]);
            let text = String::from_utf8(built.files[2].1.clone()).unwrap();
            assert!(text.contains(&format!("kernel: {kernel}")), "{text}");
        }
    }
}
