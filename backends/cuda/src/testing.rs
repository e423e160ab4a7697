//! Test support for the GPU backends' test suites: run, skip with a printed reason, or fail.
//!
//! Contract: [`nvrtc_or_skip`] and [`gpu_or_skip`] return what a test needs when it is there;
//! when it is not, they print `skipping <test>: <why>` and return `false` / `None` — unless the
//! environment promises it (`FUSEBOX_REQUIRE_NVRTC=1`, set by `scripts/test.sh`;
//! `FUSEBOX_REQUIRE_GPU=1`, for a session on a GPU machine), in which case they panic with the
//! reason, so the test fails. Meant for `#[test]` code only.
//!
//! ```no_run
//! if let Some(gpu) = fusebox_cuda::testing::gpu_or_skip("my test") {
//!     println!("{}", gpu.describe());
//! }
//! ```

#![allow(
    clippy::panic,
    reason = "test support: a promised NVRTC or GPU that is missing must fail the test"
)]

use crate::Gpu;
use std::sync::Arc;

/// Whether the environment promises what `var` names (`FUSEBOX_REQUIRE_GPU=1`, …).
pub fn required(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "1")
}

/// Whether NVRTC is usable; panics when it is not and `FUSEBOX_REQUIRE_NVRTC=1`.
pub fn nvrtc_or_skip(test: &str) -> bool {
    match crate::nvrtc::nvrtc() {
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
pub fn gpu_or_skip(test: &str) -> Option<Arc<Gpu>> {
    match Gpu::get() {
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

/// A fresh (removed) temporary directory path for one test, unique per process.
pub fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("fusebox-cuda-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}
