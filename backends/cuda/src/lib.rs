//! fusebox-cuda: the generic CUDA codegen, and the CUDA runtime the GPU backends share.
//!
//! Contract (filled in module by module):
//!
//! - [`kir`]: a small kernel IR — loops over an output index space, loads with broadcasting and
//!   layout, elementwise math, reductions — and a schedule.
//! - [`lower`]: a primitive function (a FuseOps group, or an elementwise/reduction/norm
//!   composite) → kernels, or a reason why not.
//! - [`eval`]: a CPU evaluator of the kernel IR, so every lowering is checked against the CPU
//!   reference on machines without a GPU.
//! - [`emit`]: CUDA C++ for a kernel (f32, f16, bf16 with f32 math).
//! - [`nvrtc`]: run-time compilation to CUBIN for a given arch; [`cache`]: the on-disk cache.
//! - [`device`]: device probe without panics (a typed [`Error::NoDevice`]), buffers, transfers,
//!   launches, events.

pub mod cache;
pub mod device;
pub mod emit;
pub mod error;
pub mod eval;
pub mod kir;
pub mod lower;
pub mod nvrtc;
pub mod schedule;

pub use error::{Error, Result};

/// Call this from the binary so the linker keeps this crate's `inventory` registrations.
pub fn link() {}
