//! Every instance the generator emits compiles with NVRTC for sm_80 and sm_90, and ptxas
//! reports no register spills for any of them (the counts are printed).

use fusebox_cuda::testing as common;

use fusebox_cuda::{Arch, CompileJob, CompileOptions, compile_many};
use fusebox_cutlass::generator::{Act, Bcast, BinOp, EpOp, all_instances, emit};

#[test]
fn every_instance_compiles_without_spills() {
    if !common::nvrtc_or_skip("every_instance_compiles_without_spills") {
        return;
    }
    let opts = CompileOptions {
        ptxas_verbose: true,
        ..Default::default()
    };
    let mut insts = all_instances();
    // FUSEBOX_CUTLASS_FILTER=substring compiles a subset (for iterating on the generator).
    if let Ok(f) = std::env::var("FUSEBOX_CUTLASS_FILTER") {
        insts.retain(|i| i.kernel_name().contains(&f));
    }
    // And one of each epilogue op on each math path.
    let n = insts.len();
    for base in [0usize, n.saturating_sub(1)].into_iter().filter(|&b| b < n) {
        let mut i = insts[base].clone();
        i.epilogue = vec![
            EpOp::Binary(BinOp::Add, Bcast::Vector),
            EpOp::Act(Act::Gelu),
            EpOp::Act(Act::Sigmoid),
            EpOp::Act(Act::Silu),
            EpOp::Act(Act::GeluTanh),
            EpOp::Binary(BinOp::Mul, Bcast::Full),
            EpOp::Binary(BinOp::Add, Bcast::Full),
            EpOp::Clip(0.0, 6.0),
            EpOp::Act(Act::Relu),
        ];
        insts.push(i);
    }
    for arch in [Arch::Sm80, Arch::Sm90] {
        let jobs: Vec<CompileJob> = insts
            .iter()
            .map(|i| CompileJob {
                name: format!("{}.cu", i.kernel_name()),
                source: emit(i),
                arch,
                options: opts.clone(),
            })
            .collect();
        let cache = fusebox_cuda::Cache::from_env();
        let results = compile_many(&jobs, cache.as_ref());
        let mut spills = Vec::new();
        let mut max_regs = 0;
        for (i, r) in insts.iter().zip(results) {
            let c = r.unwrap_or_else(|e| panic!("{} on {arch}: {e}", i.kernel_name()));
            let info = c
                .ptxas_info(&i.kernel_name())
                .unwrap_or_else(|| panic!("no ptxas report for {}", i.kernel_name()));
            max_regs = max_regs.max(info.registers);
            if c.has_spills() {
                spills.push(format!(
                    "{} ({} registers, {} B spill stores, {} B spill loads)",
                    i.kernel_name(),
                    info.registers,
                    info.spill_stores,
                    info.spill_loads
                ));
            }
        }
        println!(
            "{arch}: {} instances compiled, {} with spills, max {} registers",
            insts.len(),
            spills.len(),
            max_regs
        );
        assert!(spills.is_empty(), "spills on {arch}: {spills:?}");
    }
}
