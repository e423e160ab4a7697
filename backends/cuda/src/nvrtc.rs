//! Run-time compilation of CUDA C++ to CUBIN with NVRTC (through cudarc), on machines with or
//! without a GPU.
//!
//! Contract:
//!
//! - [`Arch`] names the targets fusebox builds for: `sm_80`, `sm_90`, `sm_90a` (parse with
//!   `FromStr`, print with `Display`; [`Arch::for_compute_capability`] picks the one for a
//!   device). Kernels are always built as CUBIN for a real architecture, never PTX: a CUBIN
//!   loads without a JIT and under the driver's minor-version compatibility, and `sm_90a`
//!   code (wgmma, setmaxnreg) is checked by ptxas at build time instead of failing at load.
//! - Locating NVRTC never panics (cudarc panics when a library is absent). [`nvrtc`] first
//!   preloads `libnvrtc.so.13` and its `libnvrtc-builtins.so.13.*` by absolute path from the
//!   first of: `$FUSEBOX_NVRTC_LIB` (the library file itself; an error when it does not exist),
//!   `$CUDA_HOME/lib64`, `$CUDA_PATH/lib64`, a Python venv's `site-packages/nvidia/cu13/lib`
//!   (`$VIRTUAL_ENV`, then `.venv` in the current directory or an ancestor, then `.venv` at or
//!   above `$CARGO_MANIFEST_DIR` and this crate's build-time workspace), `/usr/local/cuda/lib64`;
//!   the handles are kept for the life of the process. Then it asks cudarc whether the library
//!   loads (`is_culib_present`) and returns [`Error::NvrtcUnavailable`] naming every place it
//!   looked when it does not. The result is computed once per process.
//! - The CUDA headers (`cuda_fp16.h`, `cuda_bf16.h`) come from the first directory that holds
//!   `cuda_fp16.h` among `$FUSEBOX_CUDA_INCLUDE`, `$CUDA_HOME/include`, `$CUDA_PATH/include`, a
//!   venv's `site-packages/nvidia/cu13/include`, `/usr/local/cuda/include`; it is passed as
//!   `-I` to every compile. Without one, kernels that include those headers fail to compile
//!   and the log says how to point fusebox at them.
//! - [`compile`] turns one source into a [`Compiled`]: the CUBIN, NVRTC's log, and with
//!   [`CompileOptions::ptxas_verbose`] the per-function ptxas report ([`PtxasInfo`]: registers,
//!   spill stores/loads, stack frame, shared and constant memory) parsed from the log by
//!   [`parse_ptxas_info`]. A source that does not compile is [`Error::Compile`] with NVRTC's
//!   log. NUL bytes in the source, name or options are compile errors, not panics.
//! - [`compile_many`] compiles a batch on `min(jobs, available_parallelism)` threads (NVRTC
//!   compiles distinct programs concurrently) and returns the results in input order, each
//!   through the on-disk [`crate::cache::Cache`] when one is given.
//! - The option list for a compile is deterministic ([`CompileOptions::to_args`]); the cache
//!   keys on it together with the source, the arch and the NVRTC version.
//!
//! ```no_run
//! use fusebox_cuda::nvrtc::{Arch, CompileOptions, compile};
//! let src = r#"extern "C" __global__ void scale(float* x, float a, int n) {
//!     int i = blockIdx.x * blockDim.x + threadIdx.x;
//!     if (i < n) x[i] *= a;
//! }"#;
//! let opts = CompileOptions { ptxas_verbose: true, ..CompileOptions::default() };
//! let k = compile(src, "scale.cu", Arch::Sm90, &opts)?;
//! assert!(!k.cubin.is_empty() && !k.has_spills());
//! # Ok::<(), fusebox_cuda::Error>(())
//! ```

#![allow(
    unsafe_code,
    reason = "FFI module: NVRTC through cudarc's sys/result layers and dlopen of the libraries; every unsafe block has a SAFETY note"
)]

use crate::cache::Cache;
use crate::error::{Error, Result};
use cudarc::nvrtc::{result as nvrtc_result, sys as nvrtc_sys};
use std::ffi::{CStr, CString, OsString};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::OnceLock;

/// A GPU architecture fusebox builds CUBIN for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Arch {
    /// Ampere (A100) and every 8.x device: `sm_80` CUBIN runs on 8.0 to 8.9.
    Sm80,
    /// Hopper (H100, H200) without the architecture-specific instructions.
    Sm90,
    /// Hopper with `wgmma`, `setmaxnreg` and TMA multicast: runs only on compute capability 9.0.
    Sm90a,
}

impl Arch {
    /// Every arch, in order.
    pub const ALL: [Arch; 3] = [Arch::Sm80, Arch::Sm90, Arch::Sm90a];

    /// The name NVRTC takes (`sm_90a`).
    pub fn as_str(self) -> &'static str {
        match self {
            Arch::Sm80 => "sm_80",
            Arch::Sm90 => "sm_90",
            Arch::Sm90a => "sm_90a",
        }
    }

    /// The compute capability it targets (`(9, 0)`).
    pub fn compute_capability(self) -> (u32, u32) {
        match self {
            Arch::Sm80 => (8, 0),
            Arch::Sm90 | Arch::Sm90a => (9, 0),
        }
    }

    /// The portable arch for a device of compute capability `major.minor`: `sm_80` for 8.x,
    /// `sm_90` for 9.0; `None` for devices fusebox builds nothing for (before 8.0, or a major
    /// version after 9, whose CUBIN would need a newer target).
    pub fn for_compute_capability(major: u32, minor: u32) -> Option<Arch> {
        match (major, minor) {
            (8, _) => Some(Arch::Sm80),
            (9, 0) => Some(Arch::Sm90),
            _ => None,
        }
    }

    /// Whether CUBIN for this arch loads on a device of compute capability `major.minor`
    /// (same major version and at least the target's minor; `sm_90a` only on exactly 9.0).
    pub fn runs_on(self, major: u32, minor: u32) -> bool {
        let (m, n) = self.compute_capability();
        match self {
            Arch::Sm90a => (major, minor) == (9, 0),
            _ => major == m && minor >= n,
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Arch {
    type Err = Error;

    /// Parses `sm_80`, `sm_90`, `sm_90a`; anything else (including `compute_90`, which would
    /// give PTX, not CUBIN) is [`Error::UnknownArch`].
    fn from_str(s: &str) -> Result<Arch> {
        Arch::ALL
            .into_iter()
            .find(|a| a.as_str() == s.trim())
            .ok_or_else(|| Error::UnknownArch(s.to_string()))
    }
}

/// What NVRTC is, once located.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nvrtc {
    version: (u32, u32),
    library: Option<PathBuf>,
    include_dir: Option<PathBuf>,
}

impl Nvrtc {
    /// NVRTC's version (`(13, 0)`).
    pub fn version(&self) -> (u32, u32) {
        self.version
    }

    /// The library preloaded by absolute path (`None`: found by the loader's own search).
    pub fn library(&self) -> Option<&Path> {
        self.library.as_deref()
    }

    /// The directory holding `cuda_fp16.h` / `cuda_bf16.h`, passed as `-I` to every compile.
    pub fn include_dir(&self) -> Option<&Path> {
        self.include_dir.as_deref()
    }
}

/// Locates and loads NVRTC once per process (see the module doc), or says why it cannot.
pub fn nvrtc() -> Result<&'static Nvrtc> {
    static NVRTC: OnceLock<std::result::Result<Nvrtc, String>> = OnceLock::new();
    NVRTC
        .get_or_init(locate)
        .as_ref()
        .map_err(|reason| Error::NvrtcUnavailable {
            reason: reason.clone(),
        })
}

/// Whether NVRTC can be used in this process.
pub fn is_available() -> bool {
    nvrtc().is_ok()
}

/// NVRTC's version, `(major, minor)`.
pub fn version() -> Result<(u32, u32)> {
    nvrtc().map(Nvrtc::version)
}

/// The process environment, as the locator reads it.
fn env_var(name: &str) -> Option<OsString> {
    std::env::var_os(name).filter(|v| !v.is_empty())
}

/// The `site-packages/nvidia/cu13/<leaf>` directories of the venvs the locator looks in, in
/// order: `$VIRTUAL_ENV`, `.venv` at or above the current directory, at or above
/// `$CARGO_MANIFEST_DIR`, and at or above this crate's build-time directory.
fn venv_dirs(env: &dyn Fn(&str) -> Option<OsString>, leaf: &str) -> Vec<PathBuf> {
    let mut venvs: Vec<PathBuf> = Vec::new();
    if let Some(v) = env("VIRTUAL_ENV") {
        venvs.push(PathBuf::from(v));
    }
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        roots.push(cwd);
    }
    if let Some(m) = env("CARGO_MANIFEST_DIR") {
        roots.push(PathBuf::from(m));
    }
    roots.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    for root in &roots {
        if let Some(v) = root
            .ancestors()
            .map(|a| a.join(".venv"))
            .find(|v| v.is_dir())
        {
            venvs.push(v);
        }
    }
    let mut out: Vec<PathBuf> = Vec::new();
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
            let d = p
                .join("site-packages")
                .join("nvidia")
                .join("cu13")
                .join(leaf);
            if !out.contains(&d) {
                out.push(d);
            }
        }
    }
    out
}

/// Candidate directories for `libnvrtc.so.13`, in search order (after `$FUSEBOX_NVRTC_LIB`).
fn library_dirs(env: &dyn Fn(&str) -> Option<OsString>) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(h) = env(var) {
            dirs.push(PathBuf::from(h).join("lib64"));
        }
    }
    dirs.extend(venv_dirs(env, "lib"));
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    dirs
}

/// Candidate directories for `cuda_fp16.h`, in search order.
fn include_dirs(env: &dyn Fn(&str) -> Option<OsString>) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = env("FUSEBOX_CUDA_INCLUDE") {
        dirs.push(PathBuf::from(d));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(h) = env(var) {
            dirs.push(PathBuf::from(h).join("include"));
        }
    }
    dirs.extend(venv_dirs(env, "include"));
    dirs.push(PathBuf::from("/usr/local/cuda/include"));
    dirs
}

/// The first directory holding `cuda_fp16.h`.
fn find_include_dir(env: &dyn Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    include_dirs(env)
        .into_iter()
        .find(|d| d.join("cuda_fp16.h").is_file())
}

/// `dlopen`s `path` and keeps it loaded for the life of the process.
fn preload(path: &Path) -> std::result::Result<(), String> {
    // SAFETY: loading a shared library runs its initialisers. The libraries loaded here are
    // NVIDIA's NVRTC and its builtins, from a path the user configured or from the
    // nvidia-cuda-nvrtc wheel; their initialisers only set up NVRTC's own state.
    let lib = unsafe { libloading::Library::new(path) }
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // Never unloaded: cudarc resolves symbols from it by soname for the rest of the process.
    std::mem::forget(lib);
    Ok(())
}

/// The `libnvrtc-builtins.so.13*` beside a `libnvrtc.so.13` (not the `.alt` variant).
fn builtins_beside(lib: &Path) -> Option<PathBuf> {
    let dir = lib.parent()?;
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc-builtins.so.13") && !n.contains(".alt"))
        })
        .collect();
    found.sort();
    found.into_iter().next()
}

fn locate() -> std::result::Result<Nvrtc, String> {
    locate_with(&env_var)
}

fn locate_with(env: &dyn Fn(&str) -> Option<OsString>) -> std::result::Result<Nvrtc, String> {
    let mut looked: Vec<String> = Vec::new();
    let explicit = env("FUSEBOX_NVRTC_LIB").map(PathBuf::from);
    let library = match &explicit {
        Some(p) if p.is_file() => Some(p.clone()),
        Some(p) => {
            return Err(format!(
                "FUSEBOX_NVRTC_LIB is {}, which is not a file",
                p.display()
            ));
        }
        None => {
            let dirs = library_dirs(env);
            looked.extend(dirs.iter().map(|d| d.display().to_string()));
            dirs.into_iter()
                .map(|d| d.join("libnvrtc.so.13"))
                .find(|p| p.is_file())
        }
    };
    if let Some(lib) = &library {
        // The builtins first: libnvrtc dlopens them by soname at compile time, and a loaded
        // library with that soname satisfies the lookup.
        if let Some(b) = builtins_beside(lib) {
            preload(&b)?;
        }
        preload(lib)?;
    }
    // SAFETY: `is_culib_present` only tries to dlopen cudarc's candidate names and drops the
    // handles; it resolves no symbols, so it cannot panic on a missing or old library.
    if !unsafe { nvrtc_sys::is_culib_present() } {
        return Err(format!(
            "libnvrtc.so.13 was not found (looked in {}, then the loader's path); install the \
             nvidia-cuda-nvrtc wheel into .venv (scripts/test.sh does) or set FUSEBOX_NVRTC_LIB \
             to the library file",
            if looked.is_empty() {
                "nothing".to_string()
            } else {
                looked.join(", ")
            }
        ));
    }
    let (mut major, mut minor) = (0i32, 0i32);
    // SAFETY: the library is present (checked above), so cudarc's lazy symbol lookup finds
    // `nvrtcVersion` (in every NVRTC); it writes two ints through valid pointers.
    let rc = unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) };
    rc.result()
        .map_err(|e| format!("nvrtcVersion failed: {e:?}"))?;
    Ok(Nvrtc {
        version: (
            u32::try_from(major).unwrap_or(0),
            u32::try_from(minor).unwrap_or(0),
        ),
        library,
        include_dir: find_include_dir(env),
    })
}

/// Options of one compile. The arch and `--std=c++17` are always given; the located CUDA
/// include directory is added as the last `-I`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    /// Ask ptxas for its per-function report (`--ptxas-options=-v`), parsed into
    /// [`Compiled::ptxas`].
    pub ptxas_verbose: bool,
    /// `--use_fast_math` (approximate division, sqrt and transcendentals; flush denormals).
    pub fast_math: bool,
    /// `--maxrregcount=N`.
    pub max_registers: Option<u32>,
    /// `--generate-line-info` (source lines in profilers).
    pub line_info: bool,
    /// More `-I` directories, searched before the CUDA headers.
    pub include_paths: Vec<PathBuf>,
    /// Any other NVRTC options, passed as they are (`-DNAME=1`, `--restrict`).
    pub extra: Vec<String>,
}

impl CompileOptions {
    /// The NVRTC option list for `arch`, with `cuda_include` as the last `-I` (deterministic:
    /// the same options give the same list).
    pub fn to_args(&self, arch: Arch, cuda_include: Option<&Path>) -> Vec<String> {
        let mut a = vec![
            format!("--gpu-architecture={}", arch.as_str()),
            "--std=c++17".to_string(),
        ];
        if self.ptxas_verbose {
            a.push("--ptxas-options=-v".to_string());
        }
        if self.fast_math {
            a.push("--use_fast_math".to_string());
        }
        if let Some(n) = self.max_registers {
            a.push(format!("--maxrregcount={n}"));
        }
        if self.line_info {
            a.push("--generate-line-info".to_string());
        }
        for p in &self.include_paths {
            a.push(format!("-I{}", p.display()));
        }
        a.extend(self.extra.iter().cloned());
        if let Some(d) = cuda_include {
            a.push(format!("-I{}", d.display()));
        }
        a
    }
}

/// ptxas's report on one function (`--ptxas-options=-v`). Sizes are in bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PtxasInfo {
    /// The function's symbol (mangled unless `extern "C"`).
    pub function: String,
    /// Whether it is a kernel (`Compiling entry function`), not a called device function.
    pub entry: bool,
    /// The target ptxas compiled it for (`sm_90a`), when the report says.
    pub arch: String,
    /// Registers per thread.
    pub registers: u32,
    /// Named barriers used.
    pub barriers: u32,
    /// Stack frame per thread.
    pub stack_frame: u32,
    /// Bytes stored to local memory because registers ran out.
    pub spill_stores: u32,
    /// Bytes loaded back from local memory.
    pub spill_loads: u32,
    /// Static shared memory per block (`smem`).
    pub shared_mem: u32,
    /// Constant memory (`cmem[...]`, all banks summed).
    pub constant_mem: u32,
}

impl PtxasInfo {
    /// Whether ptxas spilled registers to local memory.
    pub fn spills(&self) -> bool {
        self.spill_stores > 0 || self.spill_loads > 0
    }
}

/// The number before `unit` in `text` (`"8 registers"` → 8 for unit `registers`).
fn number_before(text: &str, unit: &str) -> Option<u32> {
    let at = text.find(unit)?;
    text[..at].split_whitespace().last()?.parse().ok()
}

/// The text between the first pair of single quotes after `after`.
fn quoted_after<'a>(line: &'a str, after: &str) -> Option<&'a str> {
    let rest = &line[line.find(after)? + after.len()..];
    let start = rest.find('\'')? + 1;
    let len = rest[start..].find('\'')?;
    Some(&rest[start..start + len])
}

/// Parses ptxas's verbose report out of an NVRTC log: one [`PtxasInfo`] per function, in the
/// order the report first names them. Lines it does not know are skipped.
///
/// ```
/// let log = "ptxas info    : Compiling entry function 'k' for 'sm_90'\n\
///            ptxas info    : Function properties for k\n\
///            \x20   0 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n\
///            ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem, 368 bytes cmem[0]\n";
/// let info = fusebox_cuda::nvrtc::parse_ptxas_info(log);
/// assert_eq!((info[0].registers, info[0].spill_stores, info[0].shared_mem), (40, 8, 1024));
/// ```
pub fn parse_ptxas_info(log: &str) -> Vec<PtxasInfo> {
    let mut out: Vec<PtxasInfo> = Vec::new();
    fn slot<'a>(out: &'a mut Vec<PtxasInfo>, name: &str) -> &'a mut PtxasInfo {
        let i = match out.iter().position(|p| p.function == name) {
            Some(i) => i,
            None => {
                out.push(PtxasInfo {
                    function: name.to_string(),
                    ..PtxasInfo::default()
                });
                out.len() - 1
            }
        };
        &mut out[i]
    }
    let mut entry: Option<String> = None;
    let mut props: Option<String> = None;
    for line in log.lines() {
        if line.contains("Compiling entry function")
            && let Some(name) = quoted_after(line, "Compiling entry function")
        {
            let arch = quoted_after(line, " for ").unwrap_or_default().to_string();
            let s = slot(&mut out, name);
            s.entry = true;
            s.arch = arch;
            entry = Some(name.to_string());
        } else if let Some(at) = line.find("Function properties for ") {
            let name = line[at + "Function properties for ".len()..].trim();
            slot(&mut out, name);
            props = Some(name.to_string());
        } else if line.contains("bytes stack frame") {
            if let Some(name) = props.take() {
                let s = slot(&mut out, &name);
                s.stack_frame = number_before(line, "bytes stack frame").unwrap_or(0);
                s.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
                s.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
            }
        } else if line.contains("Used ")
            && line.contains("registers")
            && let Some(name) = entry.clone()
        {
            let s = slot(&mut out, &name);
            s.registers = number_before(line, "registers").unwrap_or(0);
            s.barriers = number_before(line, "barriers").unwrap_or(0);
            s.shared_mem = number_before(line, "bytes smem").unwrap_or(0);
            s.constant_mem = line
                .split(',')
                .filter(|part| part.contains("bytes cmem"))
                .filter_map(|part| number_before(part, "bytes cmem"))
                .sum();
        }
    }
    out
}

/// A compiled source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compiled {
    /// The program name given to NVRTC (`fused_add.cu`).
    pub name: String,
    /// The architecture of the CUBIN.
    pub arch: Arch,
    /// The CUBIN image.
    pub cubin: Vec<u8>,
    /// NVRTC's log (warnings; the ptxas report with [`CompileOptions::ptxas_verbose`]).
    pub log: String,
    /// ptxas's report parsed from the log (empty without `ptxas_verbose`).
    pub ptxas: Vec<PtxasInfo>,
    /// Whether it came from the on-disk cache instead of NVRTC.
    pub from_cache: bool,
}

impl Compiled {
    /// Whether any function spilled registers to local memory (needs `ptxas_verbose`).
    pub fn has_spills(&self) -> bool {
        self.ptxas.iter().any(PtxasInfo::spills)
    }

    /// ptxas's report on `function`.
    pub fn ptxas_info(&self, function: &str) -> Option<&PtxasInfo> {
        self.ptxas.iter().find(|p| p.function == function)
    }
}

/// An NVRTC program, destroyed on drop.
struct Program(nvrtc_sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: `self.0` was made by `create_program` and is destroyed exactly once, here.
        let _ = unsafe { nvrtc_result::destroy_program(self.0) };
    }
}

fn c_string(what: &str, s: &str, name: &str, arch: Arch) -> Result<CString> {
    CString::new(s).map_err(|_| Error::Compile {
        kernel: name.to_string(),
        arch: arch.to_string(),
        log: format!("the {what} contains a NUL byte"),
    })
}

fn log_text(raw: Vec<std::ffi::c_char>) -> String {
    let bytes: Vec<u8> = raw.into_iter().map(|c| c as u8).collect();
    match CStr::from_bytes_until_nul(&bytes) {
        Ok(c) => c.to_string_lossy().into_owned(),
        Err(_) => String::from_utf8_lossy(&bytes).into_owned(),
    }
}

/// Compiles `src` (program name `name`) to CUBIN for `arch` (see the module doc).
pub fn compile(src: &str, name: &str, arch: Arch, options: &CompileOptions) -> Result<Compiled> {
    let nv = nvrtc()?;
    compile_args(src, name, arch, &options.to_args(arch, nv.include_dir()))
}

/// [`compile`] with the full NVRTC option list already made ([`CompileOptions::to_args`]).
pub(crate) fn compile_args(src: &str, name: &str, arch: Arch, args: &[String]) -> Result<Compiled> {
    let nv = nvrtc()?;
    let fail = |log: String| Error::Compile {
        kernel: name.to_string(),
        arch: arch.to_string(),
        log,
    };
    let c_src = c_string("source", src, name, arch)?;
    let c_name = c_string("program name", name, name, arch)?;
    for a in args {
        c_string("option list", a, name, arch)?;
    }
    let prog = Program(
        nvrtc_result::create_program(&c_src, Some(&c_name))
            .map_err(|e| fail(format!("nvrtcCreateProgram failed: {e:?}")))?,
    );
    // SAFETY: `prog` is a live program (destroyed only by `Program::drop`); `c_src` and
    // `c_name`, which it may point into, outlive it; no option has a NUL byte (checked above),
    // so cudarc's `CString::new(..).unwrap()` cannot panic.
    let compiled = unsafe { nvrtc_result::compile_program(prog.0, args) };
    // SAFETY: `prog` is live; the log is read into a buffer of the size NVRTC reports.
    let mut log = unsafe { nvrtc_result::get_program_log(prog.0) }
        .map(log_text)
        .unwrap_or_default();
    if let Err(e) = compiled {
        if log.contains("cannot open source file") && nv.include_dir().is_none() {
            log.push_str(
                "\n(no CUDA include directory was found: install the nvidia-cuda-runtime wheel \
                 into .venv or set FUSEBOX_CUDA_INCLUDE to a directory holding cuda_fp16.h)",
            );
        }
        return Err(if e.0 == nvrtc_sys::nvrtcResult::NVRTC_ERROR_COMPILATION {
            fail(log)
        } else {
            fail(format!("{e:?}\n{log}"))
        });
    }
    let mut size = 0usize;
    // SAFETY: `prog` is live and compiled; NVRTC writes one usize.
    let rc = unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog.0, &mut size) };
    rc.result()
        .map_err(|e| fail(format!("nvrtcGetCUBINSize failed: {e:?}\n{log}")))?;
    if size == 0 {
        return Err(fail(format!(
            "NVRTC produced no CUBIN for {arch} (a virtual architecture gives PTX only)\n{log}"
        )));
    }
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` has exactly the size NVRTC reported for this program's CUBIN.
    let rc = unsafe { nvrtc_sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast()) };
    rc.result()
        .map_err(|e| fail(format!("nvrtcGetCUBIN failed: {e:?}\n{log}")))?;
    let log = log.trim_end().to_string();
    Ok(Compiled {
        name: name.to_string(),
        arch,
        cubin,
        ptxas: parse_ptxas_info(&log),
        log,
        from_cache: false,
    })
}

/// One source of a batch for [`compile_many`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileJob {
    /// The program name (`fused_add.cu`).
    pub name: String,
    /// The CUDA C++ source.
    pub source: String,
    /// The target.
    pub arch: Arch,
    /// Its options.
    pub options: CompileOptions,
}

/// Compiles every job, `min(jobs, available_parallelism)` at a time, through `cache` when
/// given; the results are in input order.
pub fn compile_many(jobs: &[CompileJob], cache: Option<&Cache>) -> Vec<Result<Compiled>> {
    let one = |j: &CompileJob| {
        crate::cache::compile_cached(cache, &j.source, &j.name, j.arch, &j.options)
    };
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len());
    if workers <= 1 {
        return jobs.iter().map(one).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut done: Vec<(usize, Result<Compiled>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(j) = jobs.get(i) else { break };
                        mine.push((i, one(j)));
                    }
                    mine
                })
            })
            .collect();
        handles
            .into_iter()
            // A worker that panicked (a bug, not user input) returns nothing: its jobs are
            // reported as failed below.
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    });
    done.sort_by_key(|(i, _)| *i);
    let mut out: Vec<Result<Compiled>> = Vec::with_capacity(jobs.len());
    let mut it = done.into_iter().peekable();
    for (i, j) in jobs.iter().enumerate() {
        match it.next_if(|(k, _)| *k == i) {
            Some((_, r)) => out.push(r),
            None => out.push(Err(Error::Compile {
                kernel: j.name.clone(),
                arch: j.arch.to_string(),
                log: "the compile thread panicked".to_string(),
            })),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::panic, reason = "test code: a failure is a panic")]

    use super::*;

    #[test]
    fn arch_names_round_trip() {
        for a in Arch::ALL {
            assert_eq!(a.to_string().parse::<Arch>().ok(), Some(a));
        }
        assert!("compute_90".parse::<Arch>().is_err());
        assert!("sm_75".parse::<Arch>().is_err());
        assert_eq!(Arch::for_compute_capability(9, 0), Some(Arch::Sm90));
        assert_eq!(Arch::for_compute_capability(8, 6), Some(Arch::Sm80));
        assert_eq!(Arch::for_compute_capability(7, 5), None);
        assert_eq!(Arch::for_compute_capability(10, 0), None);
        assert!(Arch::Sm80.runs_on(8, 9) && !Arch::Sm80.runs_on(9, 0));
        assert!(Arch::Sm90a.runs_on(9, 0) && !Arch::Sm90a.runs_on(9, 1));
    }

    #[test]
    fn args_are_deterministic_and_complete() {
        let o = CompileOptions {
            ptxas_verbose: true,
            fast_math: true,
            max_registers: Some(128),
            line_info: true,
            include_paths: vec![PathBuf::from("/x")],
            extra: vec!["-DN=4".into()],
        };
        let a = o.to_args(Arch::Sm90a, Some(Path::new("/cuda/include")));
        assert_eq!(
            a,
            vec![
                "--gpu-architecture=sm_90a",
                "--std=c++17",
                "--ptxas-options=-v",
                "--use_fast_math",
                "--maxrregcount=128",
                "--generate-line-info",
                "-I/x",
                "-DN=4",
                "-I/cuda/include",
            ]
        );
        assert_eq!(a, o.to_args(Arch::Sm90a, Some(Path::new("/cuda/include"))));
    }

    #[test]
    fn ptxas_report_is_parsed() {
        let log = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'gemm' for 'sm_90a'
ptxas info    : Function properties for gemm
    16 bytes stack frame, 12 bytes spill stores, 20 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 16384 bytes smem, 400 bytes cmem[0], 8 bytes cmem[2]
ptxas info    : Function properties for helper
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z3addPfS_' for 'sm_90a'
ptxas info    : Function properties for _Z3addPfS_
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, 368 bytes cmem[0]
";
        let p = parse_ptxas_info(log);
        assert_eq!(p.len(), 3);
        let g = &p[0];
        assert_eq!(
            (
                g.function.as_str(),
                g.entry,
                g.arch.as_str(),
                g.registers,
                g.barriers,
                g.stack_frame,
                g.spill_stores,
                g.spill_loads,
                g.shared_mem,
                g.constant_mem
            ),
            ("gemm", true, "sm_90a", 255, 1, 16, 12, 20, 16384, 408)
        );
        assert!(g.spills());
        assert_eq!((p[1].function.as_str(), p[1].entry), ("helper", false));
        assert_eq!(
            (
                p[2].registers,
                p[2].barriers,
                p[2].shared_mem,
                p[2].spills()
            ),
            (8, 0, 0, false)
        );
        assert!(parse_ptxas_info("warning: nothing here\n").is_empty());
    }

    #[test]
    fn an_explicit_library_that_is_missing_is_an_error() {
        let env = |k: &str| {
            (k == "FUSEBOX_NVRTC_LIB").then(|| OsString::from("/nonexistent/libnvrtc.so.13"))
        };
        let e = locate_with(&env).err().unwrap_or_default();
        assert!(e.contains("FUSEBOX_NVRTC_LIB"), "{e}");
    }

    #[test]
    fn cuda_home_comes_before_the_venv() {
        let env = |k: &str| (k == "CUDA_HOME").then(|| OsString::from("/opt/cuda"));
        let dirs = library_dirs(&env);
        assert_eq!(dirs.first(), Some(&PathBuf::from("/opt/cuda/lib64")));
        assert_eq!(dirs.last(), Some(&PathBuf::from("/usr/local/cuda/lib64")));
        let inc =
            include_dirs(&|k: &str| (k == "FUSEBOX_CUDA_INCLUDE").then(|| OsString::from("/inc")));
        assert_eq!(inc.first(), Some(&PathBuf::from("/inc")));
    }
}
