// In-place y = max(y + bias, 0) over a row-major [rows, cols] float16 matrix, 8 halves
// (16 bytes) per thread; cols must be a multiple of 8. No CUDA headers needed: the half
// conversions are PTX. The unfused baseline of examples/bench_epilogue.rs.
__device__ __forceinline__ float h2f(unsigned short h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ unsigned short f2h(float f) {
    unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
__device__ __forceinline__ unsigned int pair(unsigned int y, unsigned int b) {
    float lo = fmaxf(h2f((unsigned short)(y & 0xffffu)) + h2f((unsigned short)(b & 0xffffu)), 0.0f);
    float hi = fmaxf(h2f((unsigned short)(y >> 16)) + h2f((unsigned short)(b >> 16)), 0.0f);
    return (unsigned int)f2h(lo) | ((unsigned int)f2h(hi) << 16);
}
extern "C" __global__ void bias_relu_f16x8(uint4* __restrict__ y, const uint4* __restrict__ bias,
                                           unsigned long long n_vec, unsigned int cols_vec) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_vec) return;
    uint4 v = y[i];
    uint4 b = bias[i % cols_vec];
    v.x = pair(v.x, b.x); v.y = pair(v.y, b.y); v.z = pair(v.z, b.z); v.w = pair(v.w, b.w);
    y[i] = v;
}
