//! Helpers shared by the NVRTC and GPU tests: decide whether to run, skip with a printed
//! reason, or fail when the environment promises NVRTC (`FUSEBOX_REQUIRE_NVRTC=1`, set by
//! scripts/test.sh) or a GPU (`FUSEBOX_REQUIRE_GPU=1`, for sessions on a GPU machine).

#![allow(dead_code, reason = "each test binary uses a different subset")]
#![allow(clippy::panic, reason = "test code: a failure is a panic")]

use std::sync::Arc;

fn required(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "1")
}

/// Whether NVRTC is usable; panics when it is not and `FUSEBOX_REQUIRE_NVRTC=1`.
pub fn nvrtc_or_skip(test: &str) -> bool {
    match fusebox_cuda::nvrtc::nvrtc() {
        Ok(_) => true,
        Err(e) if required("FUSEBOX_REQUIRE_NVRTC") => {
            panic!("{test}: FUSEBOX_REQUIRE_NVRTC=1 but {e}")
        }
        Err(e) => {
            eprintln!("skipping {test}: {e}");
            false
        }
    }
}

/// The GPU; `None` (with a printed reason) when there is none; panics when there is none and
/// `FUSEBOX_REQUIRE_GPU=1`.
pub fn gpu_or_skip(test: &str) -> Option<Arc<fusebox_cuda::Gpu>> {
    match fusebox_cuda::Gpu::get() {
        Ok(g) => Some(g),
        Err(e) if required("FUSEBOX_REQUIRE_GPU") => {
            panic!("{test}: FUSEBOX_REQUIRE_GPU=1 but {e}")
        }
        Err(e) => {
            eprintln!("skipping {test}: {e}");
            None
        }
    }
}

/// A fresh temporary directory for one test.
pub fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("fusebox-cuda-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// `out[i] = a * x[i] + y[i]` in f32.
pub const SAXPY: &str = r#"
extern "C" __global__ void saxpy(float* out, const float* x, const float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + y[i];
}
"#;

/// f16 and bf16 through the CUDA headers: `out = x * 2 + 1` with f32 math.
pub const HALF: &str = r#"
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void scale_f16(__half* out, const __half* x, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2half(__half2float(x[i]) * 2.0f + 1.0f);
}
extern "C" __global__ void scale_bf16(__nv_bfloat16* out, const __nv_bfloat16* x, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2bfloat16(__bfloat162float(x[i]) * 2.0f + 1.0f);
}
"#;
