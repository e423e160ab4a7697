//! Tensor Memory Accelerator (TMA) descriptors for Hopper kernels: a tiled [`TensorMap`]
//! (the driver's `CUtensorMap`, 128 bytes) built on the host with `cuTensorMapEncodeTiled`,
//! passed to a kernel by value as a `const __grid_constant__` parameter
//! ([`crate::KernelArg::TensorMap`]).
//!
//! Contract: [`TiledSpec::check`] validates a description against the driver's documented
//! limits (rank 1 to 5, a 16-byte aligned base address, strides that are multiples of 16 bytes
//! and below 2^40, box extents 1 to 256, an inner box of at most the swizzle span) without a
//! device, so callers and tests see the same errors the driver would give, as
//! [`Error::Device`]. [`TensorMap::encode`] needs a [`Gpu`] (proof that the driver library is
//! loaded; without one the caller already has the typed [`Error::NoDevice`]) and never panics.
//!
//! ```text
//! f16 A (M = 1000, K = 4096), box 64 x 128, 128-B swizzle:
//!   TiledSpec { dtype: F16, dims: [4096, 1000, 1], strides: [8192, 8192000],
//!               boxdim: [64, 128, 1], swizzle: B128 }
//! ```

#![allow(
    unsafe_code,
    reason = "FFI module: cuTensorMapEncodeTiled through cudarc's sys layer; the unsafe block has a SAFETY note"
)]

use crate::device::Gpu;
use crate::error::{Error, Result};
use cudarc::driver::sys as cu;

/// The element type of a tensor map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TmaDtype {
    /// `float16`.
    F16,
    /// `bfloat16`.
    Bf16,
    /// `float32`.
    F32,
}

impl TmaDtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            TmaDtype::F16 | TmaDtype::Bf16 => 2,
            TmaDtype::F32 => 4,
        }
    }
    fn raw(self) -> cu::CUtensorMapDataType {
        match self {
            TmaDtype::F16 => cu::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            TmaDtype::Bf16 => cu::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            TmaDtype::F32 => cu::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        }
    }
}

/// The shared-memory swizzle a TMA copy applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TmaSwizzle {
    /// No swizzle.
    None,
    /// 128-byte swizzle: within each 1024-byte span, the 16-byte chunk `c` of 128-byte row `r`
    /// is stored at chunk `c ^ (r % 8)`.
    B128,
}

impl TmaSwizzle {
    /// The most bytes the innermost box extent may span (`None`: unlimited here).
    fn span(self) -> Option<u64> {
        match self {
            TmaSwizzle::None => None,
            TmaSwizzle::B128 => Some(128),
        }
    }
    fn raw(self) -> cu::CUtensorMapSwizzle {
        match self {
            TmaSwizzle::None => cu::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
            TmaSwizzle::B128 => cu::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
        }
    }
}

/// A tiled tensor map's description: extents and box innermost first (as the driver takes
/// them); out-of-bounds elements of a box are filled with zeros.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TiledSpec {
    /// The element type.
    pub dtype: TmaDtype,
    /// The global extents, innermost (contiguous) first.
    pub dims: Vec<u64>,
    /// The byte stride of every dimension but the innermost (`dims.len() - 1` entries).
    pub strides: Vec<u64>,
    /// The box (the tile one copy moves), innermost first.
    pub boxdim: Vec<u32>,
    /// The shared-memory swizzle.
    pub swizzle: TmaSwizzle,
}

impl TiledSpec {
    /// The bytes one box fills in shared memory (the `complete_tx` count of one copy).
    pub fn box_bytes(&self) -> u64 {
        self.boxdim.iter().map(|&b| u64::from(b)).product::<u64>() * self.dtype.bytes()
    }

    /// Checks the description for a tensor at device address `ptr` (see the module doc).
    pub fn check(&self, ptr: u64) -> Result<()> {
        let bad = |m: String| Err(Error::Device(format!("TMA descriptor: {m}")));
        let rank = self.dims.len();
        if !(1..=5).contains(&rank) {
            return bad(format!("rank {rank} (1 to 5 supported)"));
        }
        if self.strides.len() + 1 != rank || self.boxdim.len() != rank {
            return bad(format!(
                "{} dims, {} strides and {} box extents (want {rank}, {}, {rank})",
                rank,
                self.strides.len(),
                self.boxdim.len(),
                rank - 1
            ));
        }
        if !ptr.is_multiple_of(16) {
            return bad(format!("base address {ptr:#x} is not 16-byte aligned"));
        }
        if let Some(&d) = self.dims.iter().find(|&&d| d == 0 || d > (1 << 32)) {
            return bad(format!("extent {d} (1 to 2^32 supported)"));
        }
        if let Some(&s) = self
            .strides
            .iter()
            .find(|&&s| !s.is_multiple_of(16) || s >= (1 << 40))
        {
            return bad(format!(
                "stride {s} bytes (a multiple of 16 below 2^40 is required)"
            ));
        }
        if let Some(&b) = self.boxdim.iter().find(|&&b| b == 0 || b > 256) {
            return bad(format!("box extent {b} (1 to 256 supported)"));
        }
        let inner = u64::from(self.boxdim[0]) * self.dtype.bytes();
        if !inner.is_multiple_of(16) {
            return bad(format!(
                "inner box of {inner} bytes is not a multiple of 16"
            ));
        }
        if let Some(span) = self.swizzle.span()
            && inner > span
        {
            return bad(format!(
                "inner box of {inner} bytes exceeds the {span}-byte swizzle span"
            ));
        }
        Ok(())
    }
}

/// An encoded tiled tensor map (`CUtensorMap`, 128 bytes), ready to pass by value.
#[derive(Clone, Copy)]
pub struct TensorMap {
    raw: cu::CUtensorMap,
}

impl std::fmt::Debug for TensorMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorMap").finish_non_exhaustive()
    }
}

impl TensorMap {
    /// The descriptor's 128 bytes, as the kernel parameter takes them.
    pub fn bytes(&self) -> [u8; 128] {
        let mut b = [0u8; 128];
        for (chunk, q) in b.chunks_exact_mut(8).zip(self.raw.opaque.iter()) {
            chunk.copy_from_slice(&q.to_ne_bytes());
        }
        b
    }

    /// Encodes `spec` for the tensor at device address `ptr` on `gpu` (checked first with
    /// [`TiledSpec::check`]).
    pub fn encode(gpu: &Gpu, ptr: u64, spec: &TiledSpec) -> Result<TensorMap> {
        spec.check(ptr)?;
        // The driver library is loaded and initialised: `gpu` exists only after a successful
        // probe, so the sys call below cannot hit cudarc's missing-library panic.
        let _ = gpu;
        let rank = u32::try_from(spec.dims.len())
            .map_err(|_| Error::Device("TMA descriptor: rank overflows".into()))?;
        let elem_strides = vec![1u32; spec.dims.len()];
        let mut raw = cu::CUtensorMap { opaque: [0; 16] };
        // SAFETY: `raw` is a live, properly aligned CUtensorMap the driver writes; `dims`,
        // `strides`, `boxdim` and `elem_strides` hold `rank`, `rank - 1`, `rank` and `rank`
        // elements (checked above) and outlive the call; the global address is only recorded
        // in the descriptor, not dereferenced on the host; the enums are valid values.
        let rc = unsafe {
            cu::cuTensorMapEncodeTiled(
                &mut raw,
                spec.dtype.raw(),
                rank,
                ptr as *mut std::ffi::c_void,
                spec.dims.as_ptr(),
                spec.strides.as_ptr(),
                spec.boxdim.as_ptr(),
                elem_strides.as_ptr(),
                cu::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                spec.swizzle.raw(),
                cu::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                cu::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        match rc {
            cu::CUresult::CUDA_SUCCESS => Ok(TensorMap { raw }),
            e => Err(Error::Driver(format!(
                "cuTensorMapEncodeTiled({spec:?}): {e:?}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a_spec() -> TiledSpec {
        TiledSpec {
            dtype: TmaDtype::F16,
            dims: vec![4096, 1000, 1],
            strides: vec![8192, 8192 * 1000],
            boxdim: vec![64, 128, 1],
            swizzle: TmaSwizzle::B128,
        }
    }

    #[test]
    fn checks_follow_the_driver_limits() {
        assert!(a_spec().check(0x1000).is_ok());
        assert_eq!(a_spec().box_bytes(), 64 * 128 * 2);
        let err = |s: TiledSpec, p: u64| s.check(p).map_err(|e| e.to_string()).err();
        assert!(err(a_spec(), 0x1008).is_some_and(|e| e.contains("16-byte aligned")));
        let mut s = a_spec();
        s.strides[0] = 8190;
        assert!(err(s, 0).is_some_and(|e| e.contains("multiple of 16")));
        let mut s = a_spec();
        s.boxdim[0] = 128; // 256 bytes > the 128-byte swizzle span
        assert!(err(s, 0).is_some_and(|e| e.contains("swizzle span")));
        let mut s = a_spec();
        s.boxdim[1] = 512;
        assert!(err(s, 0).is_some_and(|e| e.contains("box extent 512")));
        let mut s = a_spec();
        s.strides.pop();
        assert!(err(s, 0).is_some_and(|e| e.contains("strides")));
    }

    #[test]
    fn encode_needs_a_device_and_never_panics() {
        // Without a device `Gpu::get` is the typed error, so `encode` cannot be reached.
        match Gpu::get() {
            Err(e) => assert!(e.to_string().starts_with("no CUDA device")),
            Ok(gpu) => {
                let t =
                    crate::GpuTensor::zeros(&gpu, fusebox_core::ir::DType::F16, vec![1000, 4096]);
                let t = t.map_err(|e| e.to_string());
                assert!(t.is_ok(), "{t:?}");
                if let Ok(t) = t {
                    let m = TensorMap::encode(&gpu, t.device_ptr(), &a_spec());
                    assert!(m.is_ok(), "{m:?}");
                }
            }
        }
    }
}
