//! Every instance the generator emits compiles with NVRTC for sm_80, sm_90 and sm_90a (the
//! wgmma + TMA instances for sm_90a only: plain sm_90 has no `wgmma`), and ptxas reports no
//! register spills for any of them (the counts are printed per arch).

use fusebox_cuda::testing as common;

use fusebox_cuda::{Arch, CompileJob, CompileOptions, compile_many};
use fusebox_cutlass::generator::{Act, Bcast, BinOp, EpOp, Instance, Math, emit, instances_for};
use fusebox_cutlass::wgmma::{CONSUMER_REGS, PRODUCER_REGS};

/// Every epilogue op, in one chain.
fn every_op() -> Vec<EpOp> {
    vec![
        EpOp::Binary(BinOp::Add, Bcast::Vector),
        EpOp::Act(Act::Gelu),
        EpOp::Act(Act::Sigmoid),
        EpOp::Act(Act::Silu),
        EpOp::Act(Act::GeluTanh),
        EpOp::Binary(BinOp::Mul, Bcast::Full),
        EpOp::Binary(BinOp::Add, Bcast::Full),
        EpOp::Clip(0.0, 6.0),
        EpOp::Act(Act::Relu),
    ]
}

/// The instances of `arch` (filtered by `FUSEBOX_CUTLASS_FILTER=substring`, for iterating on
/// the generator), plus one with every epilogue op on each math path: the first and last
/// mma.sync/SIMT instances, and on sm_90a the first and last wgmma instances.
fn instances(arch: Arch) -> Vec<Instance> {
    let mut insts = instances_for(arch);
    if let Ok(f) = std::env::var("FUSEBOX_CUTLASS_FILTER") {
        insts.retain(|i| i.kernel_name().contains(&f));
    }
    let (wg, classic): (Vec<&Instance>, Vec<&Instance>) =
        insts.iter().partition(|i| i.tile.math == Math::Wgmma);
    let bases: Vec<Instance> = [classic.first(), classic.last(), wg.first(), wg.last()]
        .into_iter()
        .flatten()
        .map(|i| (*i).clone())
        .collect();
    for mut i in bases {
        i.epilogue = every_op();
        if !insts.contains(&i) {
            insts.push(i);
        }
    }
    insts
}

#[test]
fn every_instance_compiles_without_spills() {
    if !common::nvrtc_or_skip("every_instance_compiles_without_spills") {
        return;
    }
    let opts = CompileOptions {
        ptxas_verbose: true,
        ..Default::default()
    };
    let mut wgmma_total = 0;
    for arch in [Arch::Sm80, Arch::Sm90, Arch::Sm90a] {
        let insts = instances(arch);
        let wgmma = insts.iter().filter(|i| i.tile.math == Math::Wgmma).count();
        wgmma_total += wgmma;
        if arch != Arch::Sm90a {
            assert_eq!(wgmma, 0, "wgmma instances are sm_90a only");
        }
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
        let (mut max_regs, mut max_regs_wgmma) = (0, 0);
        for (i, r) in insts.iter().zip(results) {
            let c = r.unwrap_or_else(|e| panic!("{} on {arch}: {e}", i.kernel_name()));
            let info = c
                .ptxas_info(&i.kernel_name())
                .unwrap_or_else(|| panic!("no ptxas report for {}", i.kernel_name()));
            if i.tile.math == Math::Wgmma {
                max_regs_wgmma = max_regs_wgmma.max(info.registers);
                // ptxas says when it ignores `setmaxnreg` ("unable to determine register count
                // at entry") or serializes the wgmma pipeline (C7508-C7510 "Potential
                // Performance Loss"); neither may happen here.
                let warnings: Vec<&str> = c
                    .log
                    .lines()
                    .filter(|l| l.contains("ptxas warning"))
                    .collect();
                assert!(
                    warnings.is_empty(),
                    "{}: ptxas warnings {warnings:?}",
                    i.kernel_name()
                );
                // setmaxnreg moves registers within the block's pool (its launch allocation):
                // the consumers' increase must be covered by the producer's decrease, or
                // `setmaxnreg.inc` waits forever.
                let pool = i.tile.threads() * info.registers;
                let need = 128 * PRODUCER_REGS + (i.tile.threads() - 128) * CONSUMER_REGS;
                assert!(
                    pool >= need,
                    "{}: {} registers x {} threads < {need} for setmaxnreg",
                    i.kernel_name(),
                    info.registers,
                    i.tile.threads()
                );
            } else {
                max_regs = max_regs.max(info.registers);
            }
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
            "{arch}: {} instances compiled ({wgmma} wgmma), {} with spills, max {max_regs} registers (mma.sync/SIMT), max {max_regs_wgmma} registers (wgmma)",
            insts.len(),
            spills.len(),
        );
        assert!(spills.is_empty(), "spills on {arch}: {spills:?}");
    }
    // The filter may leave none; without it the sm_90a set has every wgmma instance.
    if std::env::var("FUSEBOX_CUTLASS_FILTER").is_err() {
        assert!(wgmma_total > 0, "no wgmma instance was compiled");
    }
}

/// Plain sm_90 rejects the wgmma kernels at ptxas (so sm_90a is really needed, and the
/// compile test above really compiles the Hopper instructions).
#[test]
fn wgmma_needs_sm_90a() {
    if !common::nvrtc_or_skip("wgmma_needs_sm_90a") {
        return;
    }
    let inst = fusebox_cutlass::generator::wgmma_instances()
        .into_iter()
        .last()
        .unwrap_or_else(|| panic!("no wgmma instance"));
    let src = emit(&inst);
    let name = format!("{}.cu", inst.kernel_name());
    let opts = CompileOptions::default();
    let e = fusebox_cuda::compile(&src, &name, Arch::Sm90, &opts)
        .err()
        .unwrap_or_else(|| panic!("{name} compiled for plain sm_90"));
    assert!(e.to_string().contains("sm_90"), "{e}");
    let ok = fusebox_cuda::compile(&src, &name, Arch::Sm90a, &opts);
    assert!(ok.is_ok(), "{:?}", ok.err().map(|e| e.to_string()));
}
