//! fusebox-cutlass: the `cutlass` backend. A Rust generator emits self-contained CUDA C++ with
//! CUTLASS's structure (threadblock tile, warp tile, m16n8k16 instruction, multistage
//! `cp.async` pipeline, fused epilogue) for GEMM and implicit-GEMM conv2d, and for Hopper
//! (sm_90a) GEMMs CUTLASS 3.x's warp-specialized structure (a TMA producer warpgroup, an
//! mbarrier ring of 128-byte-swizzled stages, two `wgmma.mma_async` consumer warpgroups, the
//! same fused epilogue); NVRTC compiles it to CUBIN through fusebox-cuda, which loads and
//! launches it.
//!
//! Contract:
//!
//! - [`generator`]: [`generator::Instance`] → CUDA C++ ([`generator::emit`]);
//!   [`generator::instances_for`] is every instance the generator emits for an arch (the
//!   compile test builds each for sm_80, sm_90 and sm_90a; the wgmma instances,
//!   [`generator::wgmma_instances`], for sm_90a only, which is the only target `wgmma` builds for).
//! - [`wgmma`]: the sm_90a path: the kernel, the TMA descriptors it takes, and its layout
//!   formulas (accumulator fragments, 128-byte swizzle, descriptor strides) as Rust values the
//!   emitter prints and the tests check.
//! - [`select`]: the instance table, alignment from divisibility, the heuristic (wgmma tiles
//!   when the `arch` option is sm_90a and the problem is an f16/bf16 GEMM with 16-byte row
//!   strides, else mma.sync / SIMT, with the reason), and a CPU model of the tile loop's
//!   predication (property-tested).
//! - [`patterns`]: TVM's CUTLASS table for attention, matmul and conv2d (`cutlass.attention_bias`
//!   and `cutlass.attention` first, then the residual blocks; names and order as TVM's
//!   `get_patterns_with_prefix("cutlass")`), with `_check_matmul` / `_check_conv2d` /
//!   `_check_residual` rules and reasons.
//! - [`spec`]: a claimed function → [`spec::KernelSpec`] (GEMM or conv2d, operands, epilogue)
//!   or, for `cutlass.attention*`, [`spec::AttentionSpec`] (Q, K, V, bias, scale, causal mask).
//! - [`attention`]: the generated FlashAttention-2-style kernel that runs `relax.nn.attention`.
//! - [`backend`]: the `cutlass` backend (claim, build: `.cu` + `.cubin` + launch, compile: a
//!   device artifact; without a device the typed no-device error, so the pipeline moves on).
//! - [`artifact`]: launches on fusebox-cuda's stream with device values in and out, and the
//!   `profile = true` option (times candidates once, caches the winner on disk).
//!   [`artifact::AttentionArtifact`] launches the fused attention kernel for a claimed
//!   `cutlass.attention*` function.
//!
//! ```text
//! lv = R.nn.conv2d(x, w, data_layout="NHWC", kernel_layout="OHWI")  # x: (1,56,56,64) f16
//! lv1 = R.add(lv, b)                                                 # b: (1,1,1,64)
//! y = R.nn.relu(lv1)           # -> cutlass.conv2d_bias_relu
//! # runs as: cutlass_f16_conv2d_fprop_64x64x32_32x32x32_s4_a8_bias_relu
//! #          grid (1, 49, 1), block 128, 40960 B shared memory (M = 3136, N = 64, K = 576)
//!
//! # [backend.options] arch = "sm_90a", on a compute capability 9.0 device (H100 / H200):
//! lv = R.matmul(x, w)          # x: (4096, 4096) f16, w: (4096, 4096) f16
//! lv1 = R.add(lv, b)           # b: (4096,)
//! y = R.nn.gelu(lv1)           # -> cutlass.matmul_bias_gelu
//! # runs as: cutlass_f16_gemm_nn_128x256x64_wgmma_s4_a8_bias_gelu
//! #          grid (16, 32, 1), block 384 (1 TMA producer + 2 wgmma consumer warpgroups),
//! #          197696 B shared memory, two CUtensorMap parameters (A: box 64x128, B: 4 boxes 64x64)
//! ```

pub mod artifact;
pub mod attention;
pub mod backend;
pub mod error;
pub mod generator;
pub mod options;
pub mod patterns;
pub mod plan;
pub mod select;
pub mod spec;
pub mod wgmma;

pub use artifact::CutlassArtifact;
pub use backend::CutlassBackend;
pub use error::{Error, Result};
pub use options::Options;

/// Call this from the binary so the linker keeps this crate and its `inventory` registration
/// of the `cutlass` backend.
pub fn link() {}
