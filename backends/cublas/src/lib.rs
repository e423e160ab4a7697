//! fusebox-cublas: the `cublas` backend. It partitions with TVM's cuBLAS pattern table and runs
//! each claimed matmul (+ bias) (+ relu / gelu) composite as one cuBLASLt matmul whose epilogue
//! does the bias and the activation, through `cudarc`'s cuBLASLt bindings (loaded at run time,
//! so this crate builds and its CPU tests run without CUDA).
//!
//! Contract:
//!
//! - [`patterns`]: the table (`cublas.matmul_transposed_multiply` … `cublas.matmul`, TVM's order
//!   and names) and the check that applies TVM's `_check_matmul` rules, with reasons.
//! - [`spec`]: a claimed function → [`spec::MatmulSpec`] (operands, transposition, epilogue,
//!   dtypes), or the reason it cannot run here (the claim's decline).
//! - [`plan`]: a spec + concrete shapes → [`plan::LtPlan`], the pure-Rust description of the
//!   cuBLASLt call (m, n, k, the row-major operand swap, leading dims, batches, types,
//!   epilogue, workspace); unit- and property-tested on the CPU.
//! - [`options`]: `autotune`, `allow_tf32`, `candidates`, validated.
//! - [`backend`]: the [`Backend`](fusebox_core::backend::Backend) impl, registered as
//!   `cublas`. `compile` without a CUDA device (or without libcublasLt) fails with
//!   [`Error::NoDevice`]; the pipeline then tries the next backend and the report says why.
//! - The GPU side: [`lt`] (the FFI module, the only place with `unsafe`: library probe,
//!   descriptors, layouts, preferences with the operands' real alignments, a heuristic query
//!   that keeps several candidates, checked launches, a cuBLAS GEMM fallback); [`artifact`]
//!   (the process runtime on fusebox-cuda's `Gpu` and stream, per-plan caches, event-timed
//!   autotune with `autotune = true`, host or device values in, device values out); [`tune`]
//!   (the on-disk autotune cache in fusebox-cuda's cache directory).
//!
//! ```text
//! @R.function
//! def fused_relax_matmul_relax_add_relax_nn_relu_cublas(x: R.Tensor((16, 32), "float16"),
//!         w: R.Tensor((32, 64), "float16"), b: R.Tensor((64,), "float16")):
//!     R.func_attr({"Codegen": "cublas"})
//!     ...  # local_func with Composite "cublas.matmul_bias_relu": matmul -> add -> relu
//! # runs as: cublasLtMatmul(A = w [op N, 64x32, lda 64], B = x [op N, 32x16, ldb 32],
//! #                          D [64x16, ldd 64], epilogue RELU_BIAS, bias = b, COMPUTE_32F)
//! ```

pub mod artifact;
pub mod backend;
pub mod error;
pub mod lt;
pub mod options;
pub mod patterns;
pub mod plan;
pub mod spec;
pub mod tune;

pub use artifact::{CublasArtifact, Runtime};
pub use backend::CublasBackend;
pub use error::{Error, Result};
pub use options::Options;

/// Call this from the binary so the linker keeps this crate and its `inventory` registration
/// of the `cublas` backend.
pub fn link() {}
