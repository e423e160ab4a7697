//! The error type of fusebox-cuda.

use std::path::PathBuf;

/// Every error of the CUDA backend.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No usable CUDA device: the driver library is missing, no device is present, or the
    /// driver refused to initialise. Returned instead of cudarc's panic.
    #[error("no CUDA device: {reason}")]
    NoDevice {
        /// What the probe found.
        reason: String,
    },
    /// NVRTC itself could not be loaded or used.
    #[error("NVRTC unavailable: {reason}")]
    NvrtcUnavailable {
        /// What went wrong (library not found, version query failed).
        reason: String,
    },
    /// A generated kernel did not compile.
    #[error("NVRTC could not compile `{kernel}` for {arch}:\n{log}")]
    Compile {
        /// The kernel (or source) name.
        kernel: String,
        /// The target architecture (`sm_90a`).
        arch: String,
        /// NVRTC's log.
        log: String,
    },
    /// An arch name fusebox does not build for.
    #[error("unknown CUDA arch `{0}` (valid: sm_80, sm_90, sm_90a)")]
    UnknownArch(String),
    /// A CUDA driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(String),
    /// A device request that does not fit: a launch whose arguments do not match the kernel's
    /// parameters or whose shape exceeds the device, a value that is not a tensor, a shape
    /// whose size overflows.
    #[error("CUDA device: {0}")]
    Device(String),
    /// The function cannot be lowered to a kernel; the reason names the op or construct.
    #[error("cannot lower `{function}` to a CUDA kernel: {reason}")]
    Unsupported {
        /// The function's name.
        function: String,
        /// Why.
        reason: String,
    },
    /// The kernel-IR evaluator was given arguments that do not fit the kernel.
    #[error("kernel evaluation: {0}")]
    Eval(String),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// From fusebox-core.
    #[error(transparent)]
    Core(#[from] fusebox_core::Error),
}

/// The result type of fusebox-cuda.
pub type Result<T, E = Error> = std::result::Result<T, E>;
