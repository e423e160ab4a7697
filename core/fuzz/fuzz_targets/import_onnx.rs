//! Fuzz target: `import_onnx` never panics on arbitrary bytes; a model that imports verifies.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = fusebox_core::frontend::onnx::import_onnx(data, "fuzz.onnx") {
        if let Err(e) = fusebox_core::ir::verify::verify(&m) {
            panic!("an imported module does not verify: {e}");
        }
    }
});
