//! Fuzz target: an ONNX model that imports runs as `fusebox run --seed 0` runs it (inference
//! simplification, the CPU backend's patterns, FuseOps, then the CPU executor on seeded random
//! inputs) without a panic: every failure is an error. One thread and a 64 MiB memory limit, so
//! that a unit stays inside the fuzzer's timeout (under 256 MiB a mutated `AffineGrid` size asked
//! for three 188 MB `GridSample` outputs and took 12 s, a legal computation).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        fusebox::core::runtime::set_memory_limit(Some(64 << 20));
        fusebox::cpu::par::set_threads(Some(1));
    });
    let Ok(m) = fusebox::core::frontend::onnx::import_onnx(data, "fuzz.onnx") else {
        return;
    };
    let Ok(prepared) = fusebox::runner::prepare(&m, fusebox::runner::RunMode::Patterns(None))
    else {
        return;
    };
    let Ok(args) = fusebox::runner::main_args(&m, Default::default(), Some(0), "input") else {
        return;
    };
    let ex = fusebox::cpu::Executor::new();
    let _ = prepared.execute(&ex, args, false);
});
