//! The plugin-side SDK: implement [`Plugin`] (and [`PluginArtifact`] for what `compile`
//! returns), then `export_plugin!(MyPlugin)` exports the entry point.
//!
//! Contract: every callback the SDK exports wraps the plugin's code in `catch_unwind` and turns
//! a panic into [`FB_PANIC`] with the panic message, an `Err(String)` into [`FB_ERROR`]; nothing
//! unwinds into the host. Strings and tensors the plugin hands out are allocated here and freed
//! by the `free_*` callbacks here. Input tensors must be on the CPU; [`TensorView`] gives them
//! as contiguous `f32` when they are (`as_f32`), and outputs are `f32` ([`OwnedTensor`]).
//!
//! ```ignore
//! fusebox_plugin_abi::export_plugin!(MyPlugin);
//! ```

#![allow(
    unsafe_code,
    reason = "the plugin side of the C ABI: raw pointers from the host"
)]

use crate::{
    ABI_MAJOR, ABI_MINOR, FB_ERROR, FB_OK, FB_PANIC, FbDType, FbDevice, FbTensor, PluginVTable,
};
use std::ffi::{CStr, CString, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// A claim verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Take the function.
    Accept,
    /// Leave it, with a reason.
    Decline(String),
}

/// An input tensor, borrowed from the host for the duration of `run`.
#[derive(Debug)]
pub struct TensorView<'a> {
    /// The dtype, if it is one this ABI knows.
    pub dtype: Option<FbDType>,
    /// The extents.
    pub shape: Vec<usize>,
    data: Option<&'a [f32]>,
}

impl TensorView<'_> {
    /// The elements, row-major, when the tensor is contiguous `f32` on the CPU.
    pub fn as_f32(&self) -> Option<&[f32]> {
        self.data
    }
}

/// An output tensor (`f32`, row-major).
#[derive(Clone, Debug, PartialEq)]
pub struct OwnedTensor {
    /// The extents.
    pub shape: Vec<usize>,
    /// The elements.
    pub data: Vec<f32>,
}

/// What `compile` returns.
pub trait PluginArtifact: Send + Sync + 'static {
    /// Runs on the inputs.
    fn run(&self, args: &[TensorView<'_>]) -> Result<OwnedTensor, String>;
}

/// A plugin backend.
pub trait Plugin: Sized + Send + Sync + 'static {
    /// The backend name.
    const NAME: &'static CStr;
    /// The plugin version.
    const VERSION: &'static CStr;
    /// `[[pattern]]` tables as TOML.
    const PATTERNS: &'static CStr;
    /// What `compile` returns.
    type Artifact: PluginArtifact;
    /// Makes an instance from the `[backend.options]` table printed as TOML.
    fn create(options_toml: &str) -> Result<Self, String>;
    /// Claims `func` of `module_text`, or declines it.
    fn claim(&self, module_text: &str, func: &str) -> Result<Verdict, String>;
    /// Compiles `func` of `module_text`.
    fn compile(&self, module_text: &str, func: &str) -> Result<Self::Artifact, String>;
}

/// A vtable in a `static` (raw pointers are not `Sync`; the table is immutable).
pub struct StaticVTable(PluginVTable);

// SAFETY: the table is never mutated and its pointers point at `'static` C strings and
// functions, so sharing it between threads is sound.
unsafe impl Sync for StaticVTable {}

impl StaticVTable {
    /// The table for plugin `P`.
    pub const fn new<P: Plugin>() -> Self {
        Self::with_major::<P>(ABI_MAJOR)
    }

    /// The table for `P` claiming ABI major version `major` (for tests of the version check).
    pub const fn with_major<P: Plugin>(major: u32) -> Self {
        StaticVTable(PluginVTable {
            abi_major: major,
            abi_minor: ABI_MINOR,
            struct_size: std::mem::size_of::<PluginVTable>() as u64,
            name: P::NAME.as_ptr(),
            version: P::VERSION.as_ptr(),
            patterns_toml: P::PATTERNS.as_ptr(),
            create: Some(create::<P>),
            claim: Some(claim::<P>),
            compile: Some(compile::<P>),
            run: Some(run::<P>),
            free_tensor: Some(free_tensor),
            free_artifact: Some(free_artifact::<P>),
            free_instance: Some(free_instance::<P>),
            free_string: Some(free_string),
        })
    }

    /// A table as given (for tests of the host's checks: a table with NULL callbacks, say).
    pub const fn from_table(table: PluginVTable) -> Self {
        StaticVTable(table)
    }

    /// The table.
    pub const fn table(&self) -> PluginVTable {
        self.0
    }

    /// The pointer the entry point returns.
    pub const fn as_ptr(&'static self) -> *const PluginVTable {
        &self.0
    }
}

/// Exports `$ty` (implementing [`Plugin`]) as the plugin of this `cdylib`.
#[macro_export]
macro_rules! export_plugin {
    ($ty:ty) => {
        /// The plugin's entry point (fusebox plugin ABI v1).
        #[allow(unsafe_code, reason = "the one exported C symbol of the plugin")]
        #[unsafe(no_mangle)]
        pub extern "C" fn fusebox_plugin_entry_v1() -> *const $crate::PluginVTable {
            static VTABLE: $crate::sdk::StaticVTable = $crate::sdk::StaticVTable::new::<$ty>();
            VTABLE.as_ptr()
        }
    };
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        format!("panicked: {s}")
    } else if let Some(s) = p.downcast_ref::<String>() {
        format!("panicked: {s}")
    } else {
        "panicked".to_string()
    }
}

fn to_c(s: String) -> *mut c_char {
    CString::new(s.replace('\0', " "))
        .map(CString::into_raw)
        .unwrap_or(std::ptr::null_mut())
}

/// Writes `msg` to `*err` when `err` is not null.
fn set_err(err: *mut *mut c_char, msg: String) {
    if !err.is_null() {
        // SAFETY: the host passes a valid, writable `char **` (or null, checked above).
        unsafe { *err = to_c(msg) };
    }
}

/// Runs `f`, mapping `Err` to FB_ERROR and a panic to FB_PANIC with the message in `*err`.
fn guard(err: *mut *mut c_char, f: impl FnOnce() -> Result<(), String>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => FB_OK,
        Ok(Err(e)) => {
            set_err(err, e);
            FB_ERROR
        }
        Err(p) => {
            set_err(err, panic_message(&*p));
            FB_PANIC
        }
    }
}

fn str_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str, String> {
    if p.is_null() {
        return Err(format!("{what} is null"));
    }
    // SAFETY: the host passes a NUL-terminated string that lives for the call.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map_err(|_| format!("{what} is not UTF-8"))
}

extern "C" fn create<P: Plugin>(
    options: *const c_char,
    instance: *mut *mut c_void,
    err: *mut *mut c_char,
) -> i32 {
    guard(err, || {
        let opts = str_arg(options, "options")?;
        let p = P::create(opts)?;
        if instance.is_null() {
            return Err("instance out-pointer is null".into());
        }
        // SAFETY: `instance` is a valid, writable `void **` (checked non-null above).
        unsafe { *instance = Box::into_raw(Box::new(p)).cast() };
        Ok(())
    })
}

/// The instance behind `p`.
fn instance<'a, P: Plugin>(p: *mut c_void) -> Result<&'a P, String> {
    if p.is_null() {
        return Err("instance is null".into());
    }
    // SAFETY: `p` came from `create::<P>` (Box<P>::into_raw) and is not freed until
    // `free_instance`, which the host calls last.
    Ok(unsafe { &*p.cast::<P>() })
}

extern "C" fn claim<P: Plugin>(
    inst: *mut c_void,
    module_text: *const c_char,
    func: *const c_char,
    accept: *mut i32,
    reason: *mut *mut c_char,
    err: *mut *mut c_char,
) -> i32 {
    guard(err, || {
        let p = instance::<P>(inst)?;
        let v = p.claim(str_arg(module_text, "module text")?, str_arg(func, "func")?)?;
        if accept.is_null() {
            return Err("accept out-pointer is null".into());
        }
        let (a, r) = match v {
            Verdict::Accept => (1, None),
            Verdict::Decline(r) => (0, Some(r)),
        };
        // SAFETY: `accept` is a valid, writable `int32_t *` (checked non-null above).
        unsafe { *accept = a };
        if let Some(r) = r {
            set_err(reason, r);
        }
        Ok(())
    })
}

extern "C" fn compile<P: Plugin>(
    inst: *mut c_void,
    module_text: *const c_char,
    func: *const c_char,
    artifact: *mut *mut c_void,
    err: *mut *mut c_char,
) -> i32 {
    guard(err, || {
        let p = instance::<P>(inst)?;
        let a = p.compile(str_arg(module_text, "module text")?, str_arg(func, "func")?)?;
        if artifact.is_null() {
            return Err("artifact out-pointer is null".into());
        }
        // SAFETY: `artifact` is a valid, writable `void **` (checked non-null above).
        unsafe { *artifact = Box::into_raw(Box::new(a)).cast() };
        Ok(())
    })
}

/// Views the host's tensor `t`.
fn view<'a>(t: &'a FbTensor) -> Result<TensorView<'a>, String> {
    let ndim = usize::try_from(t.ndim).map_err(|_| "negative ndim".to_string())?;
    let (shape, strides): (&[i64], &[i64]) = if ndim == 0 {
        (&[], &[])
    } else {
        if t.shape.is_null() || t.strides.is_null() {
            return Err("null shape or strides".into());
        }
        // SAFETY: the host passes `ndim` extents and `ndim` strides that live for the call.
        unsafe {
            (
                std::slice::from_raw_parts(t.shape, ndim),
                std::slice::from_raw_parts(t.strides, ndim),
            )
        }
    };
    let shape: Vec<usize> = shape
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| "negative extent".to_string()))
        .collect::<Result<_, _>>()?;
    let n: usize = shape.iter().product();
    let mut contiguous = true;
    let mut expect = 1i64;
    for (d, s) in shape.iter().zip(strides).rev() {
        if *d > 1 && *s != expect {
            contiguous = false;
        }
        expect *= *d as i64;
    }
    let dtype = FbDType::from_raw(t.dtype);
    let data = if dtype == Some(FbDType::F32)
        && contiguous
        && t.device == FbDevice::Cpu as i32
        && (n == 0 || !t.data.is_null())
    {
        if n == 0 {
            Some(&[][..])
        } else {
            // SAFETY: the host passes `n` contiguous f32 elements at `data` on the CPU
            // (dtype, device and strides checked above) that live and stay unchanged for the call.
            Some(unsafe { std::slice::from_raw_parts(t.data.cast::<f32>(), n) })
        }
    } else {
        None
    };
    Ok(TensorView { dtype, shape, data })
}

extern "C" fn run<P: Plugin>(
    artifact: *mut c_void,
    args: *const FbTensor,
    nargs: usize,
    out: *mut FbTensor,
    err: *mut *mut c_char,
) -> i32 {
    guard(err, || {
        if artifact.is_null() || out.is_null() || (nargs > 0 && args.is_null()) {
            return Err("null artifact, args or out".into());
        }
        // SAFETY: `artifact` came from `compile::<P>` and is alive until `free_artifact`.
        let a = unsafe { &*artifact.cast::<P::Artifact>() };
        let raw: &[FbTensor] = if nargs == 0 {
            &[]
        } else {
            // SAFETY: the host passes `nargs` tensors at `args` that live for the call.
            unsafe { std::slice::from_raw_parts(args, nargs) }
        };
        let views: Vec<TensorView<'_>> = raw.iter().map(view).collect::<Result<_, _>>()?;
        let t = a.run(&views)?;
        if t.shape.iter().product::<usize>() != t.data.len() {
            return Err("output shape and data length differ".into());
        }
        let shape: Box<[i64]> = t.shape.iter().map(|&d| d as i64).collect();
        let mut strides = vec![1i64; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * shape[i + 1];
        }
        let ndim = shape.len() as i32;
        let data: Box<[f32]> = t.data.into_boxed_slice();
        let fb = FbTensor {
            data: Box::into_raw(data).cast(),
            dtype: FbDType::F32 as i32,
            ndim,
            shape: Box::into_raw(shape).cast(),
            strides: Box::into_raw(strides.into_boxed_slice()).cast(),
            device: FbDevice::Cpu as i32,
            device_id: 0,
        };
        // SAFETY: `out` is a valid, writable `FbTensor *` (checked non-null above).
        unsafe { *out = fb };
        Ok(())
    })
}

extern "C" fn free_tensor(t: *mut FbTensor) {
    let _ = catch_unwind(|| {
        if t.is_null() {
            return;
        }
        // SAFETY: `t` was filled by `run` above: data, shape and strides are boxed slices of
        // `numel` f32, `ndim` i64 and `ndim` i64, freed exactly once here.
        unsafe {
            let t = &mut *t;
            let ndim = usize::try_from(t.ndim).unwrap_or(0);
            let shape = std::slice::from_raw_parts(t.shape, ndim);
            let n: usize = shape.iter().map(|&d| d as usize).product();
            if !t.data.is_null() {
                drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                    t.data.cast::<f32>(),
                    n,
                )));
            }
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                t.shape.cast_mut(),
                ndim,
            )));
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                t.strides.cast_mut(),
                ndim,
            )));
            *t = FbTensor::empty();
        }
    });
}

extern "C" fn free_artifact<P: Plugin>(a: *mut c_void) {
    let _ = catch_unwind(|| {
        if !a.is_null() {
            // SAFETY: `a` came from `compile::<P>` (Box::into_raw) and is freed once.
            drop(unsafe { Box::from_raw(a.cast::<P::Artifact>()) });
        }
    });
}

extern "C" fn free_instance<P: Plugin>(p: *mut c_void) {
    let _ = catch_unwind(|| {
        if !p.is_null() {
            // SAFETY: `p` came from `create::<P>` (Box::into_raw) and is freed once.
            drop(unsafe { Box::from_raw(p.cast::<P>()) });
        }
    });
}

extern "C" fn free_string(s: *mut c_char) {
    let _ = catch_unwind(|| {
        if !s.is_null() {
            // SAFETY: `s` came from `CString::into_raw` in `to_c` and is freed once.
            drop(unsafe { CString::from_raw(s) });
        }
    });
}
