//! Small kernels shared by the NVRTC and GPU tests (the skip-or-fail logic is
//! `fusebox_cuda::testing`).

#![allow(dead_code, reason = "each test binary uses a different subset")]

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
