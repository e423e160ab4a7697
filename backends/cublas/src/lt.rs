//! The FFI module: cuBLASLt (and cuBLAS, for the plain-GEMM fallback and benchmarks) through
//! cudarc's `cublaslt::{result, sys}` and `cublas::{result, sys}` layers. Everything `unsafe`
//! in this crate is here, each block with a `// SAFETY:` note; what leaves this module is safe:
//! owned descriptor objects that destroy themselves, and calls that check every buffer against
//! the plan before handing pointers to the library.
//!
//! Contract:
//!
//! - [`library`] locates cuBLASLt once per process without panicking (cudarc panics when a
//!   library is absent): it preloads `libcublasLt.so.13` (then `libcublas.so.13`) by absolute
//!   path from the first of `$FUSEBOX_CUBLASLT_LIB` (the file), `$CUDA_HOME/lib64`,
//!   `$CUDA_PATH/lib64`, a venv's `site-packages/nvidia/cu13/lib` (`$VIRTUAL_ENV`, `.venv` at
//!   or above the current directory), `/usr/local/cuda/lib64`; then asks cudarc whether it
//!   loads (`is_culib_present`), and reads `cublasLtGetVersion`. Failure is
//!   [`Error::NoLibrary`] naming the places it looked.
//! - [`LtHandle`]: a `cublasLtHandle_t`. [`Prepared`]: the matmul descriptor (compute and
//!   scale types, TRANSA/TRANSB, epilogue), the A, B and C/D layouts (batch count and strided
//!   batch offset), and up to `candidates` algorithms from `cublasLtMatmulAlgoGetHeuristic`
//!   under a preference holding the workspace size and the operands' real alignments.
//! - [`Prepared::matmul`] checks dtypes, byte extents of every launch, the bias length and the
//!   workspace, sets `BIAS_POINTER`, and enqueues one `cublasLtMatmul` per launch on the given
//!   stream. [`BlasHandle::gemm`] does the same plan with `cublasGemmStridedBatchedEx` (no
//!   epilogue), used when cuBLASLt has no algorithm for a plain GEMM and by the benchmark.

#![allow(
    unsafe_code,
    reason = "FFI module: cuBLASLt and cuBLAS through cudarc's sys/result layers; every unsafe block has a SAFETY note"
)]

use crate::error::{Error, Result};
use crate::plan::{Alignments, Compute, Epilogue, Layout, LtPlan, ScaleType};
use cudarc::cublas::{result as blas_result, sys as blas_sys};
use cudarc::cublaslt::{result as lt_result, sys as lt};
use cudarc::driver::CudaStream;
use fusebox_core::ir::DType;
use fusebox_cuda::GpuTensor;
use std::ffi::{OsString, c_void};
use std::mem::{MaybeUninit, size_of};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn lt_err(call: &'static str) -> impl FnOnce(lt_result::CublasError) -> Error {
    move |e| Error::Cublas {
        call,
        status: format!("{:?}", e.0),
    }
}

fn blas_err(call: &'static str) -> impl FnOnce(blas_result::CublasError) -> Error {
    move |e| Error::Cublas {
        call,
        status: format!("{:?}", e.0),
    }
}

// ---------------------------------------------------------------------------------------------
// Locating the libraries.

/// What was found: cuBLASLt's version (`cublasLtGetVersion`, e.g. 130100) and whether cuBLAS
/// (non-Lt) is there too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Library {
    /// `cublasLtGetVersion()`.
    pub version: usize,
    /// The file preloaded by absolute path (`None`: found on the loader's path).
    pub path: Option<PathBuf>,
    /// Whether `libcublas.so.13` loads as well (for the fallback and benchmarks).
    pub blas: bool,
}

fn env_var(name: &str) -> Option<OsString> {
    std::env::var_os(name).filter(|v| !v.is_empty())
}

/// The candidate directories, in search order.
fn library_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(h) = env_var(var) {
            dirs.push(PathBuf::from(h).join("lib64"));
        }
    }
    let mut venvs: Vec<PathBuf> = Vec::new();
    if let Some(v) = env_var("VIRTUAL_ENV") {
        venvs.push(PathBuf::from(v));
    }
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        roots.push(cwd);
    }
    roots.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    for root in &roots {
        if let Some(v) = root
            .ancestors()
            .map(|a| a.join(".venv"))
            .find(|v| v.is_dir())
            && !venvs.contains(&v)
        {
            venvs.push(v);
        }
    }
    for v in venvs {
        let Ok(entries) = std::fs::read_dir(v.join("lib")) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("python"))
            .map(|e| e.path())
            .collect();
        pythons.sort();
        for p in pythons {
            dirs.push(p.join("site-packages/nvidia/cu13/lib"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    dirs
}

/// `dlopen`s `path` and keeps it loaded for the life of the process.
fn preload(path: &Path) -> std::result::Result<(), String> {
    // SAFETY: loading a shared library runs its initialisers. The libraries loaded here are
    // NVIDIA's cuBLASLt / cuBLAS, from a path the user configured, a CUDA installation or the
    // nvidia-cublas wheel; their initialisers only set up the library's own state.
    let lib = unsafe { libloading::Library::new(path) }
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // Never unloaded: cudarc resolves symbols from it by soname for the rest of the process.
    std::mem::forget(lib);
    Ok(())
}

fn locate() -> std::result::Result<Library, String> {
    let mut looked: Vec<String> = Vec::new();
    let path = match env_var("FUSEBOX_CUBLASLT_LIB").map(PathBuf::from) {
        Some(p) if p.is_file() => Some(p),
        Some(p) => {
            return Err(format!(
                "FUSEBOX_CUBLASLT_LIB is {}, which is not a file",
                p.display()
            ));
        }
        None => {
            let dirs = library_dirs();
            looked.extend(dirs.iter().map(|d| d.display().to_string()));
            dirs.into_iter()
                .map(|d| d.join("libcublasLt.so.13"))
                .find(|p| p.is_file())
        }
    };
    if let Some(p) = &path {
        preload(p)?;
        if let Some(dir) = p.parent() {
            let blas = dir.join("libcublas.so.13");
            if blas.is_file() {
                // A failure here only loses the fallback; cuBLASLt is what matters.
                let _ = preload(&blas);
            }
        }
    }
    // SAFETY: `is_culib_present` only tries to dlopen cudarc's candidate names and drops the
    // handles; it resolves no symbols, so a missing library cannot make it panic.
    if !unsafe { lt::is_culib_present() } {
        return Err(format!(
            "libcublasLt.so.13 was not found (looked in {}, then the loader's path); install \
             the CUDA 13 toolkit or the nvidia-cublas wheel into .venv, or set \
             FUSEBOX_CUBLASLT_LIB to the library file",
            if looked.is_empty() {
                "nothing".to_string()
            } else {
                looked.join(", ")
            }
        ));
    }
    // SAFETY: the library is present (checked above), so cudarc's lazy lookup finds
    // `cublasLtGetVersion`, which every cuBLASLt exports; it takes no arguments.
    let version = unsafe { lt::cublasLtGetVersion() };
    // SAFETY: as for cuBLASLt above: a dlopen probe that resolves nothing.
    let blas = unsafe { blas_sys::is_culib_present() };
    Ok(Library {
        version,
        path,
        blas,
    })
}

/// cuBLASLt, located once per process (see the module doc).
pub fn library() -> Result<&'static Library> {
    static LIB: OnceLock<std::result::Result<Library, String>> = OnceLock::new();
    LIB.get_or_init(locate)
        .as_ref()
        .map_err(|reason| Error::NoLibrary {
            reason: reason.clone(),
        })
}

// ---------------------------------------------------------------------------------------------
// Type mappings.

fn data_type(d: DType) -> Result<lt::cudaDataType> {
    use lt::cudaDataType_t as T;
    Ok(match d {
        DType::F16 => T::CUDA_R_16F,
        DType::BF16 => T::CUDA_R_16BF,
        DType::F32 => T::CUDA_R_32F,
        DType::F64 => T::CUDA_R_64F,
        DType::I8 => T::CUDA_R_8I,
        DType::U8 => T::CUDA_R_8U,
        DType::I32 => T::CUDA_R_32I,
        DType::I64 | DType::Bool => {
            return Err(Error::Plan(format!("cuBLASLt has no {d} matrices")));
        }
    })
}

fn blas_data_type(d: DType) -> Result<blas_sys::cudaDataType> {
    use blas_sys::cudaDataType_t as T;
    Ok(match d {
        DType::F16 => T::CUDA_R_16F,
        DType::BF16 => T::CUDA_R_16BF,
        DType::F32 => T::CUDA_R_32F,
        DType::I8 => T::CUDA_R_8I,
        DType::I32 => T::CUDA_R_32I,
        other => {
            return Err(Error::Plan(format!("cuBLAS GEMM has no {other} matrices")));
        }
    })
}

fn compute_type(c: Compute) -> lt::cublasComputeType_t {
    use lt::cublasComputeType_t as C;
    match c {
        Compute::F32 => C::CUBLAS_COMPUTE_32F,
        Compute::F32FastTf32 => C::CUBLAS_COMPUTE_32F_FAST_TF32,
        Compute::I32 => C::CUBLAS_COMPUTE_32I,
    }
}

fn blas_compute_type(c: Compute) -> blas_sys::cublasComputeType_t {
    use blas_sys::cublasComputeType_t as C;
    match c {
        Compute::F32 => C::CUBLAS_COMPUTE_32F,
        Compute::F32FastTf32 => C::CUBLAS_COMPUTE_32F_FAST_TF32,
        Compute::I32 => C::CUBLAS_COMPUTE_32I,
    }
}

fn scale_type(s: ScaleType) -> lt::cudaDataType {
    match s {
        ScaleType::F32 => lt::cudaDataType_t::CUDA_R_32F,
        ScaleType::I32 => lt::cudaDataType_t::CUDA_R_32I,
    }
}

fn epilogue(e: Epilogue) -> lt::cublasLtEpilogue_t {
    use lt::cublasLtEpilogue_t as E;
    match e {
        Epilogue::Default => E::CUBLASLT_EPILOGUE_DEFAULT,
        Epilogue::Relu => E::CUBLASLT_EPILOGUE_RELU,
        Epilogue::Gelu => E::CUBLASLT_EPILOGUE_GELU,
        Epilogue::Bias => E::CUBLASLT_EPILOGUE_BIAS,
        Epilogue::ReluBias => E::CUBLASLT_EPILOGUE_RELU_BIAS,
        Epilogue::GeluBias => E::CUBLASLT_EPILOGUE_GELU_BIAS,
    }
}

/// Alpha (beta is always zero), in the plan's scale type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Alpha {
    /// `CUDA_R_32F` scale.
    F32(f32),
    /// `CUDA_R_32I` scale.
    I32(i32),
}

impl Alpha {
    /// One, in the plan's scale type.
    pub fn one(plan: &LtPlan) -> Alpha {
        match plan.scale_type {
            ScaleType::F32 => Alpha::F32(1.0),
            ScaleType::I32 => Alpha::I32(1),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Handles and descriptors.

/// A cuBLASLt handle, destroyed on drop.
#[derive(Debug)]
pub struct LtHandle(lt::cublasLtHandle_t);

// SAFETY: a cuBLASLt handle holds no thread-local state and may be used from any thread (the
// cuBLAS documentation allows sharing one handle across threads); every use here is serialised
// by the caller's lock anyway.
unsafe impl Send for LtHandle {}
// SAFETY: as above.
unsafe impl Sync for LtHandle {}

impl LtHandle {
    /// Creates a handle (the library must have been located with [`library`]).
    pub fn new() -> Result<LtHandle> {
        library()?;
        lt_result::create_handle()
            .map(LtHandle)
            .map_err(lt_err("cublasLtCreate"))
    }
}

impl Drop for LtHandle {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `cublasLtCreate` and is destroyed once, here.
        let _ = unsafe { lt_result::destroy_handle(self.0) };
    }
}

struct Desc(lt::cublasLtMatmulDesc_t);

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by `cublasLtMatmulDescCreate`, destroyed once, here.
        let _ = unsafe { lt_result::destroy_matmul_desc(self.0) };
    }
}

struct LayoutObj(lt::cublasLtMatrixLayout_t);

impl Drop for LayoutObj {
    fn drop(&mut self) {
        // SAFETY: created by `cublasLtMatrixLayoutCreate`, destroyed once, here.
        let _ = unsafe { lt_result::destroy_matrix_layout(self.0) };
    }
}

struct Pref(lt::cublasLtMatmulPreference_t);

impl Drop for Pref {
    fn drop(&mut self) {
        // SAFETY: created by `cublasLtMatmulPreferenceCreate`, destroyed once, here.
        let _ = unsafe { lt_result::destroy_matmul_pref(self.0) };
    }
}

fn set_desc<T>(d: &Desc, attr: lt::cublasLtMatmulDescAttributes_t, v: &T) -> Result<()> {
    // SAFETY: `d.0` is a live descriptor; `v` points to `size_of::<T>()` readable bytes, and
    // every call site passes the type cuBLASLt documents for `attr` (int32 for TRANSA/B,
    // uint32 for EPILOGUE, a device pointer for BIAS_POINTER).
    unsafe {
        lt_result::set_matmul_desc_attribute(
            d.0,
            attr,
            (v as *const T).cast::<c_void>(),
            size_of::<T>(),
        )
    }
    .map_err(lt_err("cublasLtMatmulDescSetAttribute"))
}

fn set_layout<T>(l: &LayoutObj, attr: lt::cublasLtMatrixLayoutAttribute_t, v: &T) -> Result<()> {
    // SAFETY: `l.0` is a live layout; `v` has the documented type of `attr` (int32 batch
    // count, int64 strided batch offset).
    unsafe {
        lt_result::set_matrix_layout_attribute(
            l.0,
            attr,
            (v as *const T).cast::<c_void>(),
            size_of::<T>(),
        )
    }
    .map_err(lt_err("cublasLtMatrixLayoutSetAttribute"))
}

fn set_pref<T>(p: &Pref, attr: lt::cublasLtMatmulPreferenceAttributes_t, v: &T) -> Result<()> {
    // SAFETY: `p.0` is a live preference; `v` has the documented type of `attr` (uint64
    // workspace bytes, uint32 alignments).
    unsafe {
        lt_result::set_matmul_pref_attribute(
            p.0,
            attr,
            (v as *const T).cast::<c_void>(),
            size_of::<T>(),
        )
    }
    .map_err(lt_err("cublasLtMatmulPreferenceSetAttribute"))
}

fn make_layout(l: &Layout) -> Result<LayoutObj> {
    let obj = LayoutObj(
        lt_result::create_matrix_layout(data_type(l.dtype)?, l.rows, l.cols, l.ld)
            .map_err(lt_err("cublasLtMatrixLayoutCreate"))?,
    );
    if l.batch > 1 {
        use lt::cublasLtMatrixLayoutAttribute_t as A;
        set_layout(&obj, A::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &l.batch)?;
        set_layout(
            &obj,
            A::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
            &l.batch_stride,
        )?;
    }
    Ok(obj)
}

/// One algorithm the heuristic offered: cuBLASLt's opaque algo and the workspace it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Algo {
    /// `cublasLtMatmulAlgo_t` (64 opaque bytes; may be stored and reused with the same
    /// cuBLASLt version).
    pub data: [u64; 8],
    /// The workspace it needs, in bytes.
    pub workspace: usize,
}

/// The cuBLASLt objects of one plan under one set of alignments, and its candidate algorithms.
pub struct Prepared {
    desc: Desc,
    a: LayoutObj,
    b: LayoutObj,
    d: LayoutObj,
    /// The candidates, best first by the heuristic's estimate.
    pub algos: Vec<Algo>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("algos", &self.algos.len())
            .finish_non_exhaustive()
    }
}

// SAFETY: the descriptor and layouts are plain host-side structures owned by this value; they
// are only touched through `&mut self` (bias pointer) or read by cuBLASLt during a call that
// holds `&self`, so moving them across threads is sound.
unsafe impl Send for Prepared {}

impl Prepared {
    /// Builds the descriptor, layouts and preference for `plan`, and asks the heuristic for up
    /// to `candidates` algorithms (an empty list when it has none). `bias_ptr` is the bias
    /// of the call that prepares (required when the epilogue has a bias).
    pub fn new(
        handle: &LtHandle,
        plan: &LtPlan,
        align: &Alignments,
        bias_ptr: Option<u64>,
        candidates: usize,
    ) -> Result<Prepared> {
        use lt::cublasLtMatmulDescAttributes_t as D;
        use lt::cublasLtMatmulPreferenceAttributes_t as P;
        let desc = Desc(
            lt_result::create_matmul_desc(compute_type(plan.compute), scale_type(plan.scale_type))
                .map_err(lt_err("cublasLtMatmulDescCreate"))?,
        );
        // cublasOperation_t: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 (an int32 attribute).
        let ta: i32 = i32::from(plan.trans_a);
        let tb: i32 = i32::from(plan.trans_b);
        set_desc(&desc, D::CUBLASLT_MATMUL_DESC_TRANSA, &ta)?;
        set_desc(&desc, D::CUBLASLT_MATMUL_DESC_TRANSB, &tb)?;
        let epi = epilogue(plan.epilogue) as u32;
        set_desc(&desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE, &epi)?;
        let a = make_layout(&plan.a)?;
        let b = make_layout(&plan.b)?;
        let d = make_layout(&plan.d)?;
        let pref = Pref(
            lt_result::create_matmul_pref().map_err(lt_err("cublasLtMatmulPreferenceCreate"))?,
        );
        let ws = plan.workspace as u64;
        set_pref(&pref, P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws)?;
        set_pref(
            &pref,
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
            &align.a,
        )?;
        set_pref(
            &pref,
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            &align.b,
        )?;
        set_pref(
            &pref,
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
            &align.d,
        )?;
        set_pref(
            &pref,
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
            &align.d,
        )?;
        if let Some(ptr) = bias_ptr {
            // The heuristic sees the bias pointer of the first call (its alignment matters);
            // `matmul` sets the pointer of each later call before launching.
            set_desc(&desc, D::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ptr)?;
        } else if plan.epilogue.has_bias() {
            return Err(Error::Args("the plan's epilogue needs a bias".into()));
        }
        let want = candidates.clamp(1, 64);
        let mut results: Vec<MaybeUninit<lt::cublasLtMatmulHeuristicResult_t>> =
            (0..want).map(|_| MaybeUninit::uninit()).collect();
        let mut count: i32 = 0;
        // SAFETY: all objects are live; `results` has room for `want` entries and cuBLASLt
        // writes at most `want` of them, reporting how many in `count`.
        let status = unsafe {
            lt::cublasLtMatmulAlgoGetHeuristic(
                handle.0,
                desc.0,
                a.0,
                b.0,
                d.0,
                d.0,
                pref.0,
                i32::try_from(want).unwrap_or(1),
                results.as_mut_ptr().cast(),
                &mut count,
            )
        };
        let mut algos = Vec::new();
        match status {
            lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS => {
                let n = usize::try_from(count).unwrap_or(0).min(want);
                for r in results.iter().take(n) {
                    // SAFETY: cuBLASLt initialised the first `count` entries.
                    let r = unsafe { r.assume_init_ref() };
                    if r.state == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                        && r.workspaceSize <= plan.workspace
                    {
                        algos.push(Algo {
                            data: r.algo.data,
                            workspace: r.workspaceSize,
                        });
                    }
                }
            }
            // No kernel for this configuration: an empty list, which the caller reports.
            lt::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED => {}
            other => {
                return Err(Error::Cublas {
                    call: "cublasLtMatmulAlgoGetHeuristic",
                    status: format!("{other:?}"),
                });
            }
        }
        Ok(Prepared {
            desc,
            a,
            b,
            d,
            algos,
        })
    }

    /// Whether `algo` (e.g. from the autotune cache) is valid for these descriptors, and the
    /// workspace it needs (`cublasLtMatmulAlgoCheck`).
    pub fn check(&self, handle: &LtHandle, algo: &Algo) -> Option<usize> {
        let raw = lt::cublasLtMatmulAlgo_t { data: algo.data };
        let mut out = MaybeUninit::<lt::cublasLtMatmulHeuristicResult_t>::uninit();
        // SAFETY: all objects are live; `raw` is a plain 64-byte value cuBLASLt only reads and
        // validates; `out` is written on success.
        let status = unsafe {
            lt::cublasLtMatmulAlgoCheck(
                handle.0,
                self.desc.0,
                self.a.0,
                self.b.0,
                self.d.0,
                self.d.0,
                &raw,
                out.as_mut_ptr(),
            )
        };
        if status != lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return None;
        }
        // SAFETY: written by the successful call above.
        let out = unsafe { out.assume_init() };
        (out.state == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS).then_some(out.workspaceSize)
    }

    /// Enqueues the plan's launches with `algo` on `stream`: `d = epilogue(alpha · a · b)`.
    /// `a` is the rhs, `b` the lhs (the row-major swap), `d` the output; every extent is
    /// checked against the buffers first.
    #[allow(
        clippy::too_many_arguments,
        reason = "one argument per cuBLASLt operand"
    )]
    pub fn matmul(
        &mut self,
        handle: &LtHandle,
        plan: &LtPlan,
        algo: &Algo,
        alpha: Alpha,
        a: &GpuTensor,
        b: &GpuTensor,
        d: &GpuTensor,
        bias: Option<&GpuTensor>,
        workspace: &GpuTensor,
        stream: &CudaStream,
    ) -> Result<()> {
        check_operands(plan, a, b, d, bias)?;
        if algo.workspace > workspace.byte_len() {
            return Err(Error::Args(format!(
                "the algorithm needs {} workspace bytes, {} are there",
                algo.workspace,
                workspace.byte_len()
            )));
        }
        check_alpha(plan, alpha)?;
        if let Some(bias) = bias {
            let ptr: u64 = bias.device_ptr();
            set_desc(
                &self.desc,
                lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                &ptr,
            )?;
        }
        let (ea, eb, ed) = (
            plan.a.dtype.size_bytes() as u64,
            plan.b.dtype.size_bytes() as u64,
            plan.d.dtype.size_bytes() as u64,
        );
        let raw = lt::cublasLtMatmulAlgo_t { data: algo.data };
        let (alpha_f, alpha_i) = match alpha {
            Alpha::F32(x) => (x, 0),
            Alpha::I32(x) => (0.0, x),
        };
        let (beta_f, beta_i) = (0.0f32, 0i32);
        let (alpha_ptr, beta_ptr): (*const c_void, *const c_void) = match alpha {
            Alpha::F32(_) => (
                (&alpha_f as *const f32).cast(),
                (&beta_f as *const f32).cast(),
            ),
            Alpha::I32(_) => (
                (&alpha_i as *const i32).cast(),
                (&beta_i as *const i32).cast(),
            ),
        };
        let cu_stream: lt::cudaStream_t = stream.cu_stream().cast();
        for l in &plan.launches {
            let pa = a.device_ptr() + l.a * ea;
            let pb = b.device_ptr() + l.b * eb;
            let pd = d.device_ptr() + l.d * ed;
            // SAFETY: the handle, descriptor, layouts and algo are live and were made for this
            // plan; `check_operands` verified that every launch's extent (batches, leading
            // dims, offsets) lies inside `a`, `b` and `d` and that the bias holds N elements of
            // D's type; the workspace is at least what the algorithm needs; alpha and beta
            // point to host values of the scale type; all buffers are alive for the call and
            // the work is ordered on `stream`, the stream they were written on. C aliases D
            // with beta = 0, which cuBLASLt allows (C is not read).
            unsafe {
                lt_result::matmul(
                    handle.0,
                    self.desc.0,
                    alpha_ptr,
                    beta_ptr,
                    pa as *const c_void,
                    self.a.0,
                    pb as *const c_void,
                    self.b.0,
                    pd as *const c_void,
                    self.d.0,
                    pd as *mut c_void,
                    self.d.0,
                    &raw,
                    workspace.device_ptr() as *mut c_void,
                    workspace.byte_len(),
                    cu_stream,
                )
            }
            .map_err(lt_err("cublasLtMatmul"))?;
        }
        Ok(())
    }
}

fn check_alpha(plan: &LtPlan, alpha: Alpha) -> Result<()> {
    match (plan.scale_type, alpha) {
        (ScaleType::F32, Alpha::F32(_)) | (ScaleType::I32, Alpha::I32(_)) => Ok(()),
        _ => Err(Error::Args(format!(
            "alpha {alpha:?} does not match the scale type {:?}",
            plan.scale_type
        ))),
    }
}

/// The extent of a layout in elements: the last element any batch entry touches, plus one.
fn extent(l: &Layout) -> Option<u64> {
    let batches = u64::try_from(l.batch.max(1)).ok()?;
    let stride = u64::try_from(l.batch_stride).ok()?;
    let ld = u64::try_from(l.ld).ok()?;
    if l.rows == 0 || l.cols == 0 {
        return Some(0);
    }
    (batches - 1)
        .checked_mul(stride)?
        .checked_add((l.cols - 1).checked_mul(ld)?)?
        .checked_add(l.rows)
}

/// Every check [`Prepared::matmul`] relies on (dtypes, extents, bias).
fn check_operands(
    plan: &LtPlan,
    a: &GpuTensor,
    b: &GpuTensor,
    d: &GpuTensor,
    bias: Option<&GpuTensor>,
) -> Result<()> {
    let fits =
        |what: &str, t: &GpuTensor, l: &Layout, off: &dyn Fn(&crate::plan::Launch) -> u64| {
            if t.dtype() != l.dtype {
                return Err(Error::Args(format!(
                    "{what} is {}, the plan expects {}",
                    t.dtype(),
                    l.dtype
                )));
            }
            let ext = extent(l).ok_or_else(|| Error::Args(format!("{what}'s extent overflows")))?;
            for launch in &plan.launches {
                let end = off(launch).checked_add(ext);
                if end.is_none_or(|e| e > t.numel() as u64) {
                    return Err(Error::Args(format!(
                        "{what} has {} elements, a launch reads up to {:?}",
                        t.numel(),
                        end
                    )));
                }
            }
            Ok(())
        };
    fits("the rhs (A)", a, &plan.a, &|l| l.a)?;
    fits("the lhs (B)", b, &plan.b, &|l| l.b)?;
    fits("the output (D)", d, &plan.d, &|l| l.d)?;
    match (plan.bias_len, bias) {
        (None, None) => Ok(()),
        (Some(n), Some(t)) => {
            if t.dtype() != plan.d.dtype {
                return Err(Error::Args(format!(
                    "the bias is {}, cuBLASLt's default bias type is D's ({})",
                    t.dtype(),
                    plan.d.dtype
                )));
            }
            if t.numel() as u64 != n {
                return Err(Error::Args(format!(
                    "the bias has {} elements, the plan needs N = {n}",
                    t.numel()
                )));
            }
            Ok(())
        }
        (Some(_), None) => Err(Error::Args("the plan's epilogue needs a bias".into())),
        (None, Some(_)) => Err(Error::Args("a bias for an epilogue without one".into())),
    }
}

// ---------------------------------------------------------------------------------------------
// cuBLAS (non-Lt): plain GEMM through cublasGemmStridedBatchedEx.

/// A cuBLAS handle bound to a stream, destroyed on drop.
#[derive(Debug)]
pub struct BlasHandle(blas_sys::cublasHandle_t);

// SAFETY: as for `LtHandle`: cuBLAS handles may be used from any thread; callers serialise use.
unsafe impl Send for BlasHandle {}
// SAFETY: as above.
unsafe impl Sync for BlasHandle {}

impl BlasHandle {
    /// Creates a handle whose work goes on `stream`.
    pub fn new(stream: &CudaStream) -> Result<BlasHandle> {
        let lib = library()?;
        if !lib.blas {
            return Err(Error::NoLibrary {
                reason: "libcublas.so.13 was not found beside libcublasLt".into(),
            });
        }
        let h = BlasHandle(blas_result::create_handle().map_err(blas_err("cublasCreate"))?);
        // SAFETY: `h.0` is a live handle and the stream belongs to the current context.
        unsafe { blas_result::set_stream(h.0, stream.cu_stream().cast()) }
            .map_err(blas_err("cublasSetStream"))?;
        Ok(h)
    }

    /// `d = alpha · a · b` for a plan with the default epilogue (each launch one strided-batched
    /// GEMM). `compute` may differ from the plan's (the benchmark's baseline uses the same).
    pub fn gemm(
        &self,
        plan: &LtPlan,
        alpha: Alpha,
        a: &GpuTensor,
        b: &GpuTensor,
        d: &GpuTensor,
    ) -> Result<()> {
        if plan.epilogue != Epilogue::Default {
            return Err(Error::Plan(format!(
                "cuBLAS GEMM has no {} epilogue",
                plan.epilogue.name()
            )));
        }
        check_operands(plan, a, b, d, None)?;
        check_alpha(plan, alpha)?;
        let int = |x: u64| i32::try_from(x).map_err(|_| Error::Plan(format!("{x} > 2^31")));
        let (m, n, k) = (int(plan.m)?, int(plan.n)?, int(plan.k)?);
        let ld = |l: &Layout| i32::try_from(l.ld).map_err(|_| Error::Plan("ld > 2^31".into()));
        let (lda, ldb, ldd) = (ld(&plan.a)?, ld(&plan.b)?, ld(&plan.d)?);
        let op = |t: bool| {
            if t {
                blas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let (ta, tb) = (op(plan.trans_a), op(plan.trans_b));
        let (at, bt, dt) = (
            blas_data_type(plan.a.dtype)?,
            blas_data_type(plan.b.dtype)?,
            blas_data_type(plan.d.dtype)?,
        );
        let ct = blas_compute_type(plan.compute);
        let (ea, eb, ed) = (
            plan.a.dtype.size_bytes() as u64,
            plan.b.dtype.size_bytes() as u64,
            plan.d.dtype.size_bytes() as u64,
        );
        let (alpha_f, alpha_i) = match alpha {
            Alpha::F32(x) => (x, 0),
            Alpha::I32(x) => (0.0, x),
        };
        let (beta_f, beta_i) = (0.0f32, 0i32);
        let (alpha_ptr, beta_ptr): (*const c_void, *const c_void) = match alpha {
            Alpha::F32(_) => (
                (&alpha_f as *const f32).cast(),
                (&beta_f as *const f32).cast(),
            ),
            Alpha::I32(_) => (
                (&alpha_i as *const i32).cast(),
                (&beta_i as *const i32).cast(),
            ),
        };
        for l in &plan.launches {
            let pa = a.device_ptr() + l.a * ea;
            let pb = b.device_ptr() + l.b * eb;
            let pd = d.device_ptr() + l.d * ed;
            // SAFETY: the handle is live and bound to the buffers' stream; `check_operands`
            // verified every launch's extent against `a`, `b` and `d` and their dtypes; alpha
            // and beta point to host values of the compute type's scale type.
            unsafe {
                blas_result::gemm_strided_batched_ex(
                    self.0,
                    ta,
                    tb,
                    m,
                    n,
                    k,
                    alpha_ptr,
                    pa as *const c_void,
                    at,
                    lda,
                    plan.a.batch_stride,
                    pb as *const c_void,
                    bt,
                    ldb,
                    plan.b.batch_stride,
                    beta_ptr,
                    pd as *mut c_void,
                    dt,
                    ldd,
                    plan.d.batch_stride,
                    plan.d.batch.max(1),
                    ct,
                    blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
                )
            }
            .map_err(blas_err("cublasGemmStridedBatchedEx"))?;
        }
        Ok(())
    }
}

impl Drop for BlasHandle {
    fn drop(&mut self) {
        // SAFETY: created by `cublasCreate`, destroyed once, here.
        let _ = unsafe { blas_result::destroy_handle(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extents() {
        let l = Layout {
            dtype: DType::F16,
            rows: 4,
            cols: 3,
            ld: 5,
            batch: 2,
            batch_stride: 20,
        };
        // (2-1)*20 + (3-1)*5 + 4 = 34.
        assert_eq!(extent(&l), Some(34));
        let empty = Layout { rows: 0, ..l };
        assert_eq!(extent(&empty), Some(0));
    }

    #[test]
    fn type_mappings() {
        assert!(data_type(DType::I64).is_err());
        assert_eq!(
            data_type(DType::BF16).ok(),
            Some(lt::cudaDataType_t::CUDA_R_16BF)
        );
        assert_eq!(
            epilogue(Epilogue::GeluBias) as u32,
            36,
            "CUBLASLT_EPILOGUE_GELU_BIAS"
        );
        assert_eq!(epilogue(Epilogue::ReluBias) as u32, 6);
        assert_eq!(epilogue(Epilogue::Bias) as u32, 4);
        assert_eq!(
            compute_type(Compute::F32FastTf32),
            lt::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
        );
    }
}
