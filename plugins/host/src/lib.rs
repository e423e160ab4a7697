//! The plugin host: loads a shared library with the fusebox plugin ABI (`fusebox_plugin.h`) and
//! wraps it as a [`Backend`].
//!
//! Contract:
//!
//! - [`load`] opens the library by the given path, looks up `fusebox_plugin_entry_v1`, reads
//!   the table's header and refuses the plugin unless `abi_major` is
//!   [`fusebox_plugin_abi::ABI_MAJOR`] and `struct_size` is at least the size this host knows,
//!   before it reads any other field. The path must name a regular file (symlinks resolved):
//!   a FIFO or device would block or misbehave in the OS loader. Name, version and pattern
//!   table (TOML) must be valid UTF-8 and parse; pattern errors name the library. Every
//!   callback must be non-NULL ([`Error::NullCallback`] lists the NULL ones): the host keeps
//!   only checked, non-null function pointers and never calls through NULL.
//! - The library is never unloaded (see [`load`] for why).
//! - Every callback's failure, and every panic the SDK caught, becomes an [`Error`] naming the
//!   library and the callback; the panic message is kept. Duplicate names are rejected by the
//!   pipeline (`fusebox_core::backend::pipeline`).
//! - A function crosses as text (the function and its callees, printed by
//!   `fusebox_core::text`); a function with bound tensor constants is declined on the plugin's
//!   behalf, because ABI v1 carries no constant data. Tensors cross as pointer, dtype, shape,
//!   strides and device; outputs must be one `float32` tensor.
//!
//! ```no_run
//! let factory = fusebox_plugin_host::load("target/debug/libfusebox_plugin_conv2d.so".as_ref())?;
//! let backend = factory.make(&Default::default())?;
//! println!("{} from {}", backend.name(), backend.origin());
//! # Ok::<(), fusebox_core::Error>(())
//! ```

#![allow(
    unsafe_code,
    reason = "the host side of the plugin C ABI; every block has a SAFETY note"
)]

use fusebox_core::backend::pipeline::PluginFactory;
use fusebox_core::backend::{Artifact, Backend, Candidate, Claim};
use fusebox_core::runtime::{StorageRef, Tensor, Value};
use fusebox_core::transform::FusionPattern;
use fusebox_plugin_abi::{
    ABI_MAJOR, CALLBACKS, ClaimFn, CompileFn, CreateFn, ENTRY_POINT, FB_OK, FB_PANIC, FbDType,
    FbDevice, FbTensor, FreeFn, FreeStringFn, FreeTensorFn, PluginVTable, RunFn, VTableHeader,
};
use std::ffi::{CStr, CString, c_char, c_void};
use std::path::Path;
use std::sync::Arc;

/// Every error of the plugin host; each names the library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file does not exist.
    #[error("plugin {library}: no such file")]
    Missing {
        /// The path.
        library: String,
    },
    /// The path names something other than a regular file (a FIFO, a device, a folder).
    #[error(
        "plugin {library}: not a regular file ({kind}); a plugin must be a shared library file"
    )]
    NotAFile {
        /// The path.
        library: String,
        /// What it is instead.
        kind: &'static str,
    },
    /// The OS loader refused the file.
    #[error("plugin {library}: not a loadable shared library: {message}")]
    NotALibrary {
        /// The path.
        library: String,
        /// The loader's message.
        message: String,
    },
    /// No `fusebox_plugin_entry_v1` symbol.
    #[error("plugin {library}: no entry point `{ENTRY_POINT}` (is it a fusebox plugin?)")]
    NoEntryPoint {
        /// The path.
        library: String,
    },
    /// Incompatible ABI version or table size.
    #[error(
        "plugin {library}: ABI mismatch: the plugin has ABI {major}.{minor} with a {size}-byte table; this host needs ABI {ABI_MAJOR}.x with at least {need} bytes"
    )]
    Abi {
        /// The path.
        library: String,
        /// The plugin's major version.
        major: u32,
        /// The plugin's minor version.
        minor: u32,
        /// The plugin's table size.
        size: u64,
        /// What this host needs.
        need: usize,
    },
    /// Required callbacks of the table are NULL.
    #[error(
        "plugin {library}: the plugin table's callback(s) {fields} are NULL; every callback of ABI v1 is required (see fusebox_plugin.h)"
    )]
    NullCallback {
        /// The path.
        library: String,
        /// The NULL fields, as `` `name` `` separated by commas.
        fields: String,
    },
    /// The table is malformed (null entry, bad UTF-8, bad pattern table).
    #[error("plugin {library}: {message}")]
    Malformed {
        /// The path.
        library: String,
        /// What is wrong.
        message: String,
    },
    /// A callback returned an error.
    #[error("plugin {library}: `{callback}` failed: {message}")]
    Callback {
        /// The path.
        library: String,
        /// `create`, `claim`, `compile` or `run`.
        callback: &'static str,
        /// The plugin's message.
        message: String,
    },
    /// A callback panicked (caught by the plugin SDK at the boundary).
    #[error("plugin {library}: `{callback}` panicked: {message}")]
    Panicked {
        /// The path.
        library: String,
        /// `create`, `claim`, `compile` or `run`.
        callback: &'static str,
        /// The panic message.
        message: String,
    },
}

/// The result type of the plugin host.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for fusebox_core::Error {
    fn from(e: Error) -> Self {
        let library = match &e {
            Error::Missing { library }
            | Error::NotAFile { library, .. }
            | Error::NotALibrary { library, .. }
            | Error::NullCallback { library, .. }
            | Error::NoEntryPoint { library }
            | Error::Abi { library, .. }
            | Error::Malformed { library, .. }
            | Error::Callback { library, .. }
            | Error::Panicked { library, .. } => library.clone(),
        };
        let full = e.to_string();
        let prefix = format!("plugin {library}: ");
        fusebox_core::Error::Plugin {
            library,
            message: full.strip_prefix(&prefix).unwrap_or(&full).to_string(),
        }
    }
}

/// The callbacks of a plugin's table, each checked to be non-NULL.
struct Callbacks {
    create: CreateFn,
    claim: ClaimFn,
    compile: CompileFn,
    run: RunFn,
    free_tensor: FreeTensorFn,
    free_artifact: FreeFn,
    free_instance: FreeFn,
    free_string: FreeStringFn,
}

impl Callbacks {
    /// The callbacks of `vt`, or an error naming every NULL one.
    fn of(library: &str, vt: &PluginVTable) -> Result<Callbacks> {
        if let (
            Some(create),
            Some(claim),
            Some(compile),
            Some(run),
            Some(free_tensor),
            Some(free_artifact),
            Some(free_instance),
            Some(free_string),
        ) = (
            vt.create,
            vt.claim,
            vt.compile,
            vt.run,
            vt.free_tensor,
            vt.free_artifact,
            vt.free_instance,
            vt.free_string,
        ) {
            return Ok(Callbacks {
                create,
                claim,
                compile,
                run,
                free_tensor,
                free_artifact,
                free_instance,
                free_string,
            });
        }
        let null = [
            vt.create.is_none(),
            vt.claim.is_none(),
            vt.compile.is_none(),
            vt.run.is_none(),
            vt.free_tensor.is_none(),
            vt.free_artifact.is_none(),
            vt.free_instance.is_none(),
            vt.free_string.is_none(),
        ];
        let fields: Vec<String> = CALLBACKS
            .iter()
            .zip(null)
            .filter(|(_, n)| *n)
            .map(|(f, _)| format!("`{f}`"))
            .collect();
        Err(Error::NullCallback {
            library: library.to_string(),
            fields: fields.join(", "),
        })
    }
}

/// A loaded plugin: its checked callbacks and where it came from. (Function pointers only: the
/// table's strings are copied at load time.)
struct Loaded {
    library: String,
    cb: Callbacks,
    name: String,
    version: String,
    patterns: Vec<FusionPattern>,
}

fn c_str(library: &str, p: *const c_char, what: &str) -> Result<String> {
    if p.is_null() {
        return Err(Error::Malformed {
            library: library.to_string(),
            message: format!("{what} is null"),
        });
    }
    // SAFETY: the ABI requires `p` to be a NUL-terminated string valid while the library is
    // loaded (forever here).
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(str::to_string)
        .map_err(|_| Error::Malformed {
            library: library.to_string(),
            message: format!("{what} is not UTF-8"),
        })
}

/// Loads the plugin at `path` (see the module doc).
///
/// The library is leaked on purpose: unloading a Rust `cdylib` with thread-local destructors
/// can crash (rust-lang/rust#59629, nagisa/rust_libloading#41), and artifacts and tables point
/// into it for the rest of the process.
pub fn load(path: &Path) -> fusebox_core::Result<Box<dyn PluginFactory>> {
    Ok(Box::new(load_plugin(path)?))
}

/// [`load`] with this crate's error type.
pub fn load_plugin(path: &Path) -> Result<PluginHandle> {
    let library = path.display().to_string();
    if !path.exists() {
        return Err(Error::Missing { library });
    }
    // `dlopen` of a FIFO blocks until a writer opens it (forever), and of a device reads it:
    // only regular files (after following symlinks) go to the loader.
    let meta = std::fs::metadata(path).map_err(|e| Error::NotALibrary {
        library: library.clone(),
        message: e.to_string(),
    })?;
    if !meta.is_file() {
        return Err(Error::NotAFile {
            library,
            kind: file_kind(&meta.file_type()),
        });
    }
    // A path without a separator makes dlopen search the system; anchor relative paths.
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        Path::new(".").join(path)
    };
    // SAFETY: loading runs the library's initialisers. We load only the path the user's
    // config names, as documented; a fusebox plugin has no initialisers of its own.
    let lib = unsafe { libloading::Library::new(&abs) }.map_err(|e| Error::NotALibrary {
        library: library.clone(),
        message: e.to_string(),
    })?;
    let lib: &'static libloading::Library = Box::leak(Box::new(lib));
    type Entry = extern "C" fn() -> *const PluginVTable;
    // SAFETY: the symbol, if present, is the ABI's entry point with signature `Entry`.
    let entry =
        unsafe { lib.get::<Entry>(ENTRY_POINT.as_bytes()) }.map_err(|_| Error::NoEntryPoint {
            library: library.clone(),
        })?;
    let ptr = entry();
    if ptr.is_null() {
        return Err(Error::Malformed {
            library,
            message: "the entry point returned null".into(),
        });
    }
    // SAFETY: every ABI version starts the table with `VTableHeader`; we read only the header
    // until its version and size are checked.
    let header = unsafe { std::ptr::read(ptr.cast::<VTableHeader>()) };
    let need = std::mem::size_of::<PluginVTable>();
    if header.abi_major != ABI_MAJOR || header.struct_size < need as u64 {
        return Err(Error::Abi {
            library,
            major: header.abi_major,
            minor: header.abi_minor,
            size: header.struct_size,
            need,
        });
    }
    // SAFETY: the version and size checks above guarantee a table at least as large as the
    // `PluginVTable` this host knows, laid out as in fusebox_plugin.h v1.
    // Every callback field is an `Option` of a function pointer, so a NULL one reads as `None`.
    let vt = unsafe { std::ptr::read(ptr) };
    let cb = Callbacks::of(&library, &vt)?;
    let name = c_str(&library, vt.name, "name")?;
    let version = c_str(&library, vt.version, "version")?;
    let patterns_src = c_str(&library, vt.patterns_toml, "patterns_toml")?;
    if name.is_empty() {
        return Err(Error::Malformed {
            library,
            message: "the backend name is empty".into(),
        });
    }
    let patterns = fusebox_core::pattern_table::parse_pattern_table(
        &patterns_src,
        &format!("{library} (pattern table)"),
    )
    .map_err(|e| Error::Malformed {
        library: library.clone(),
        message: e.to_string(),
    })?;
    Ok(PluginHandle(Arc::new(Loaded {
        library,
        cb,
        name,
        version,
        patterns,
    })))
}

/// What a file type is, in words, for [`Error::NotAFile`].
fn file_kind(t: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_char_device() {
            return "a character device";
        }
    }
    if t.is_dir() { "a folder" } else { "not a file" }
}

/// A loaded plugin library: makes backend instances.
#[derive(Clone)]
pub struct PluginHandle(Arc<Loaded>);

impl PluginHandle {
    /// The plugin's version string.
    pub fn version(&self) -> &str {
        &self.0.version
    }
}

/// Takes a string the plugin returned and frees it with the plugin's `free_string`.
fn take_string(l: &Loaded, s: *mut c_char) -> String {
    if s.is_null() {
        return String::new();
    }
    // SAFETY: the plugin returned a NUL-terminated string it owns until `free_string`.
    let out = unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned();
    (l.cb.free_string)(s);
    out
}

/// Turns a callback status into a result, consuming `err`.
fn status(l: &Loaded, callback: &'static str, rc: i32, err: *mut c_char) -> Result<()> {
    let message = take_string(l, err);
    match rc {
        FB_OK => Ok(()),
        FB_PANIC => Err(Error::Panicked {
            library: l.library.clone(),
            callback,
            message,
        }),
        _ => Err(Error::Callback {
            library: l.library.clone(),
            callback,
            message: if message.is_empty() {
                format!("status {rc}")
            } else {
                message
            },
        }),
    }
}

fn cstring(l: &Loaded, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::Malformed {
        library: l.library.clone(),
        message: "a string for the plugin contains NUL".into(),
    })
}

impl PluginFactory for PluginHandle {
    fn name(&self) -> &str {
        &self.0.name
    }
    fn library(&self) -> String {
        self.0.library.clone()
    }
    fn make(&self, options: &toml::Table) -> fusebox_core::Result<Box<dyn Backend>> {
        let l = &self.0;
        let text = toml::to_string(options).map_err(|e| Error::Malformed {
            library: l.library.clone(),
            message: format!("options: {e}"),
        })?;
        let text = cstring(l, &text)?;
        let mut inst: *mut c_void = std::ptr::null_mut();
        let mut err: *mut c_char = std::ptr::null_mut();
        let rc = (l.cb.create)(text.as_ptr(), &mut inst, &mut err);
        status(l, "create", rc, err)?;
        Ok(Box::new(PluginBackend {
            loaded: self.0.clone(),
            instance: Instance(inst),
        }))
    }
}

/// An instance pointer, freed with the plugin's `free_instance`.
struct Instance(*mut c_void);
// SAFETY: the ABI requires instances to be usable from any thread (the SDK requires
// `Plugin: Send + Sync`).
unsafe impl Send for Instance {}
// SAFETY: as above.
unsafe impl Sync for Instance {}

/// A backend implemented by a plugin.
struct PluginBackend {
    loaded: Arc<Loaded>,
    instance: Instance,
}

impl Drop for PluginBackend {
    fn drop(&mut self) {
        (self.loaded.cb.free_instance)(self.instance.0);
    }
}

impl Backend for PluginBackend {
    fn name(&self) -> &str {
        &self.loaded.name
    }
    fn origin(&self) -> String {
        format!(
            "plugin {} (version {})",
            self.loaded.library, self.loaded.version
        )
    }
    fn patterns(&self) -> Vec<FusionPattern> {
        self.loaded.patterns.clone()
    }
    fn claim(&self, c: &Candidate<'_>) -> Claim {
        match self.try_claim(c) {
            Ok(claim) => claim,
            Err(e) => Claim::Decline {
                reason: e.to_string(),
            },
        }
    }
    fn compile(&self, c: &Candidate<'_>) -> fusebox_core::Result<Box<dyn Artifact>> {
        let l = &self.loaded;
        let (text, func) = self.texts(c)?;
        let mut art: *mut c_void = std::ptr::null_mut();
        let mut err: *mut c_char = std::ptr::null_mut();
        let rc = (l.cb.compile)(
            self.instance.0,
            text.as_ptr(),
            func.as_ptr(),
            &mut art,
            &mut err,
        );
        status(l, "compile", rc, err)?;
        Ok(Box::new(PluginArtifact {
            loaded: l.clone(),
            artifact: Instance(art),
        }))
    }
}

impl PluginBackend {
    fn texts(&self, c: &Candidate<'_>) -> Result<(CString, CString)> {
        let printed = fusebox_core::text::print_module(&c.standalone_module());
        if !printed.constants.is_empty() {
            return Err(Error::Callback {
                library: self.loaded.library.clone(),
                callback: "claim",
                message: "the function has bound tensor constants, which plugin ABI v1 cannot carry (set bind_constants = false)".into(),
            });
        }
        Ok((
            cstring(&self.loaded, &printed.text)?,
            cstring(&self.loaded, c.name)?,
        ))
    }

    fn try_claim(&self, c: &Candidate<'_>) -> Result<Claim> {
        let l = &self.loaded;
        let (text, func) = self.texts(c)?;
        let mut accept = 0i32;
        let mut reason: *mut c_char = std::ptr::null_mut();
        let mut err: *mut c_char = std::ptr::null_mut();
        let rc = (l.cb.claim)(
            self.instance.0,
            text.as_ptr(),
            func.as_ptr(),
            &mut accept,
            &mut reason,
            &mut err,
        );
        let reason = take_string(l, reason);
        status(l, "claim", rc, err)?;
        Ok(if accept != 0 {
            Claim::Accept
        } else {
            Claim::Decline {
                reason: if reason.is_empty() {
                    "declined (no reason given)".into()
                } else {
                    reason
                },
            }
        })
    }
}

/// An artifact of a plugin.
struct PluginArtifact {
    loaded: Arc<Loaded>,
    artifact: Instance,
}

impl Drop for PluginArtifact {
    fn drop(&mut self) {
        (self.loaded.cb.free_artifact)(self.artifact.0);
    }
}

fn fb_dtype(s: StorageRef<'_>) -> FbDType {
    match s {
        StorageRef::F16(_) => FbDType::F16,
        StorageRef::BF16(_) => FbDType::BF16,
        StorageRef::F32(_) => FbDType::F32,
        StorageRef::F64(_) => FbDType::F64,
        StorageRef::I8(_) => FbDType::I8,
        StorageRef::U8(_) => FbDType::U8,
        StorageRef::I32(_) => FbDType::I32,
        StorageRef::I64(_) => FbDType::I64,
        StorageRef::Bool(_) => FbDType::Bool,
    }
}

fn data_ptr(s: StorageRef<'_>) -> *mut c_void {
    fusebox_core::with_storage_ref!(s, v => v.as_ptr().cast::<c_void>().cast_mut())
}

impl Artifact for PluginArtifact {
    fn run(&self, args: &[Value]) -> fusebox_core::Result<Value> {
        let l = &self.loaded;
        let mut dims: Vec<(Vec<i64>, Vec<i64>)> = Vec::with_capacity(args.len());
        let mut tensors: Vec<&Tensor> = Vec::with_capacity(args.len());
        for (i, a) in args.iter().enumerate() {
            let t = a.as_tensor(&format!("argument {i}"))?;
            let shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
            let mut strides = vec![1i64; shape.len()];
            for k in (0..shape.len().saturating_sub(1)).rev() {
                strides[k] = strides[k + 1] * shape[k + 1];
            }
            dims.push((shape, strides));
            tensors.push(t);
        }
        let fb: Vec<FbTensor> = tensors
            .iter()
            .zip(&dims)
            .map(|(t, (shape, strides))| FbTensor {
                data: data_ptr(t.storage()),
                dtype: fb_dtype(t.storage()) as i32,
                ndim: shape.len() as i32,
                shape: shape.as_ptr(),
                strides: strides.as_ptr(),
                device: FbDevice::Cpu as i32,
                device_id: 0,
            })
            .collect();
        let mut out = FbTensor::empty();
        let mut err: *mut c_char = std::ptr::null_mut();
        // The plugin only reads the inputs (the ABI passes them as const), and `tensors` and
        // `dims` outlive the call.
        let rc = (l.cb.run)(self.artifact.0, fb.as_ptr(), fb.len(), &mut out, &mut err);
        status(l, "run", rc, err)?;
        let result = read_output(l, &out);
        (l.cb.free_tensor)(&mut out);
        Ok(Value::Tensor(result?))
    }
}

fn read_output(l: &Loaded, out: &FbTensor) -> Result<Tensor> {
    let bad = |message: &str| Error::Callback {
        library: l.library.clone(),
        callback: "run",
        message: message.to_string(),
    };
    if FbDType::from_raw(out.dtype) != Some(FbDType::F32) || out.device != FbDevice::Cpu as i32 {
        return Err(bad("the output must be a float32 tensor on the CPU"));
    }
    let ndim = usize::try_from(out.ndim).map_err(|_| bad("negative ndim"))?;
    let shape: Vec<usize> = if ndim == 0 {
        Vec::new()
    } else {
        if out.shape.is_null() {
            return Err(bad("null output shape"));
        }
        // SAFETY: the plugin filled `out` with `ndim` extents valid until `free_tensor`.
        let s = unsafe { std::slice::from_raw_parts(out.shape, ndim) };
        s.iter()
            .map(|&d| usize::try_from(d).map_err(|_| bad("negative extent")))
            .collect::<Result<_>>()?
    };
    let n: usize = shape.iter().product();
    let data = if n == 0 {
        Vec::new()
    } else {
        if out.data.is_null() {
            return Err(bad("null output data"));
        }
        // SAFETY: the plugin filled `out` with `n` contiguous f32 (row-major, as the SDK
        // writes) valid until `free_tensor`, which is called after this copy.
        unsafe { std::slice::from_raw_parts(out.data.cast::<f32>(), n) }.to_vec()
    };
    Tensor::from_f32(shape, data).map_err(|e| bad(&e.to_string()))
}
