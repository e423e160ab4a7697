//! The error type of fusebox-cutlass.

use std::path::PathBuf;

/// Every error of the CUTLASS backend.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The function is not something this backend runs (the claim's decline reason).
    #[error("cannot run `{function}` with cutlass: {reason}")]
    Unsupported {
        /// The function's name.
        function: String,
        /// Why, in words a user can act on.
        reason: String,
    },
    /// The concrete arguments of a call do not fit the compiled function.
    #[error("cutlass call: {0}")]
    Args(String),
    /// A backend option has a bad value (unknown options are fusebox-core's error).
    #[error("option `{option}` of backend `cutlass`: {message}")]
    Option {
        /// The option.
        option: String,
        /// What is wrong with its value.
        message: String,
    },
    /// A generated kernel spilled registers (the default instances must not).
    #[error("kernel `{kernel}` spills registers on {arch}")]
    Spills {
        /// The kernel.
        kernel: String,
        /// The arch.
        arch: String,
    },
    /// The profile cache file could not be read or written.
    #[error("{path}: {message}")]
    Cache {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// From the shared CUDA runtime (NVRTC, no device, driver calls).
    #[error(transparent)]
    Cuda(#[from] fusebox_cuda::Error),
    /// From fusebox-core.
    #[error(transparent)]
    Core(#[from] fusebox_core::Error),
}

/// The result type of fusebox-cutlass.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether this is the typed "no CUDA device" error.
    pub fn is_no_device(&self) -> bool {
        matches!(self, Error::Cuda(fusebox_cuda::Error::NoDevice { .. }))
    }
}

impl From<Error> for fusebox_core::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Core(c) => c,
            other => fusebox_core::Error::Backend {
                backend: "cutlass".into(),
                message: other.to_string(),
            },
        }
    }
}
