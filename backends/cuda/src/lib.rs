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
//! - [`nvrtc`]: run-time compilation to CUBIN for `sm_80` / `sm_90` / `sm_90a` ([`Arch`]),
//!   NVRTC located without panics (a typed [`Error::NvrtcUnavailable`]), the ptxas report
//!   (registers, spills, shared memory) parsed, batches compiled in parallel; [`cache`]: the
//!   on-disk compile cache keyed by source, arch, NVRTC version and options.
//! - [`device`]: the CUDA runtime the GPU backends share: device probe without panics (a typed
//!   [`Error::NoDevice`]), [`GpuTensor`] buffers and bit-exact transfers (a fusebox-core
//!   `DeviceTensor`, so device values flow through the executor), CUBIN modules, checked
//!   launches, timing events.
//! - [`tma`]: Hopper TMA descriptors (`cuTensorMapEncodeTiled`), checked on the host and
//!   passed by value as [`KernelArg::TensorMap`].

pub mod backend;
pub mod cache;
pub mod device;
pub mod emit;
pub mod error;
pub mod eval;
pub mod kir;
pub mod lower;
pub mod nvrtc;
pub mod schedule;
pub mod testing;
pub mod tma;

pub use backend::CudaBackend;
pub use cache::{Cache, compile_cached};
pub use device::{
    DeviceElem, Gpu, GpuEvent, GpuModule, GpuTensor, Kernel, KernelArg, LaunchConfig,
};
pub use error::{Error, Result};
pub use nvrtc::{Arch, CompileJob, CompileOptions, Compiled, PtxasInfo, compile, compile_many};
pub use tma::{TensorMap, TiledSpec, TmaDtype, TmaSwizzle};

/// Call this from the binary so the linker keeps this crate's `inventory` registrations.
pub fn link() {}
