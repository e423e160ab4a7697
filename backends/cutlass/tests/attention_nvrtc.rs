//! Every fused attention kernel variant (float16 and bfloat16; head_dim 32 to 128; causal or
//! not; with or without bias — grouped-query heads and the causal kind are launch arguments of
//! the same kernels) compiles with NVRTC for sm_80 and sm_90, uses tensor-core MMA, `ldmatrix`
//! and `cp.async`, and ptxas reports no register spills. Without NVRTC the test is skipped with
//! the reason; `FUSEBOX_REQUIRE_NVRTC=1` (scripts/test.sh) turns that into a failure.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    reason = "test code: a failure is a panic"
)]

use fusebox_cuda::testing as common;
use fusebox_cuda::{Arch, CompileJob, CompileOptions, compile_many};
use fusebox_cutlass::attention::variants;

#[test]
fn every_attention_variant_compiles_without_spills() {
    if !common::nvrtc_or_skip("every_attention_variant_compiles_without_spills") {
        return;
    }
    let opts = CompileOptions {
        ptxas_verbose: true,
        ..Default::default()
    };
    let kernels = variants();
    for arch in [Arch::Sm80, Arch::Sm90] {
        let jobs: Vec<CompileJob> = kernels
            .iter()
            .map(|k| CompileJob {
                name: format!("{}.cu", k.name()),
                source: k.source(),
                arch,
                options: opts.clone(),
            })
            .collect();
        // Compiled afresh (no cache) so the ptxas report is there and NVRTC really ran.
        let results = compile_many(&jobs, None);
        let mut spills = Vec::new();
        let mut max_regs = 0;
        for (k, r) in kernels.iter().zip(results) {
            let c = r.unwrap_or_else(|e| panic!("{} on {arch}: {e}", k.name()));
            assert!(!c.cubin.is_empty(), "{}: empty CUBIN", k.name());
            let info = c
                .ptxas_info(&k.name())
                .unwrap_or_else(|| panic!("no ptxas report for {} on {arch}", k.name()));
            assert!(info.entry, "{} is not an entry function", k.name());
            max_regs = max_regs.max(info.registers);
            if c.has_spills() {
                spills.push(format!(
                    "{} ({} registers, {} B spill stores)",
                    k.name(),
                    info.registers,
                    info.spill_stores
                ));
            }
        }
        println!(
            "{arch}: {} attention kernels compiled, {} with spills, max {max_regs} registers",
            kernels.len(),
            spills.len()
        );
        assert!(spills.is_empty(), "spills on {arch}: {spills:?}");
    }
}

/// The instructions the structure relies on are really in the source the kernels are built
/// from (tensor-core MMA for both products, `ldmatrix` with `.trans` for V, `cp.async` with
/// zero fill), and the element type picks the MMA's type.
#[test]
fn sources_use_tensor_cores_ldmatrix_and_cp_async() {
    for k in variants() {
        let s = k.source();
        let t = match k.elem {
            fusebox_cutlass::attention::AttnElem::F16 => "f16",
            fusebox_cutlass::attention::AttnElem::Bf16 => "bf16",
        };
        let mma = format!("mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32");
        assert!(s.contains(&mma), "{}: no {mma}", k.name());
        for needle in [
            "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
            "cp.async.cg.shared.global",
            "cp.async.wait_group",
            "__shfl_xor_sync",
        ] {
            assert!(s.contains(needle), "{}: no {needle}", k.name());
        }
    }
}
