//! The error type of fusebox-cublas.

use std::path::PathBuf;

/// Every error of the cuBLAS backend.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No usable CUDA device or no cuBLASLt library: the probe failed, so nothing was called.
    /// The pipeline then tries the next backend that claims the function.
    #[error("no CUDA device: {reason}")]
    NoDevice {
        /// What the probe found.
        reason: String,
    },
    /// cuBLASLt could not be loaded (the device is there, the library is not).
    #[error("cuBLASLt unavailable: {reason}")]
    NoLibrary {
        /// Where it looked and what failed.
        reason: String,
    },
    /// The function is not something this backend runs (the claim's decline reason).
    #[error("cannot run `{function}` with cuBLASLt: {reason}")]
    Unsupported {
        /// The function's name.
        function: String,
        /// Why, in words a user can act on.
        reason: String,
    },
    /// The concrete shapes of a call cannot be mapped onto one cuBLASLt matmul plan.
    #[error("cuBLASLt plan: {0}")]
    Plan(String),
    /// A backend option has a bad value (unknown options are fusebox-core's error).
    #[error("option `{option}` of backend `cublas`: {message}")]
    Option {
        /// The option.
        option: String,
        /// What is wrong with its value.
        message: String,
    },
    /// The arguments of a call do not fit the compiled function.
    #[error("cuBLASLt call: {0}")]
    Args(String),
    /// A cuBLASLt or cuBLAS call returned an error status.
    #[error("{call} failed: {status}")]
    Cublas {
        /// The library call (`cublasLtMatmul`).
        call: &'static str,
        /// The status it returned.
        status: String,
    },
    /// cuBLASLt's heuristic returned no algorithm for a plan (and no fallback applies).
    #[error("cuBLASLt has no algorithm for {0}")]
    NoAlgorithm(String),
    /// From the shared CUDA runtime (driver calls, transfers, events).
    #[error(transparent)]
    Cuda(#[from] fusebox_cuda::Error),
    /// The autotune cache file could not be read or written.
    #[error("{path}: {message}")]
    Cache {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// From fusebox-core.
    #[error(transparent)]
    Core(#[from] fusebox_core::Error),
}

/// The result type of fusebox-cublas.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether this is the typed "no CUDA device" error (also when it comes from fusebox-cuda).
    pub fn is_no_device(&self) -> bool {
        matches!(
            self,
            Error::NoDevice { .. } | Error::Cuda(fusebox_cuda::Error::NoDevice { .. })
        )
    }
}

impl From<Error> for fusebox_core::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Core(c) => c,
            other => fusebox_core::Error::Backend {
                backend: "cublas".into(),
                message: other.to_string(),
            },
        }
    }
}
