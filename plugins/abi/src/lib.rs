//! fusebox's plugin ABI: the `#[repr(C)]` mirror of `include/fusebox_plugin.h`, and an SDK
//! ([`sdk`], [`export_plugin!`]) that exports a Rust type implementing [`sdk::Plugin`] as a
//! plugin.
//!
//! Contract: a plugin is a shared library exporting one symbol,
//! `fusebox_plugin_entry_v1() -> *const PluginVTable`. The host checks [`PluginVTable::abi_major`]
//! against [`ABI_MAJOR`] and [`PluginVTable::struct_size`] against the size it knows before it
//! touches any other field; it then refuses a table whose name, version, pattern table or any
//! callback is NULL (see [`CALLBACKS`]: none is optional in ABI v1). Callbacks return [`FB_OK`], [`FB_ERROR`] or [`FB_PANIC`] and never
//! unwind; all memory is released by the side that allocated it, through the `free_*` callbacks.
//!
//! ```ignore
//! use fusebox_plugin_abi::sdk::{Plugin, PluginArtifact, TensorView, OwnedTensor, Verdict};
//! struct Mine;
//! impl Plugin for Mine {
//!     const NAME: &'static std::ffi::CStr = c"mine";
//!     const VERSION: &'static std::ffi::CStr = c"0.1.0";
//!     const PATTERNS: &'static std::ffi::CStr = c"[[pattern]]\nname = \"mine.relu\"\npattern = \"relax.nn.relu(_)\"\n";
//!     type Artifact = MyKernel;
//!     fn create(options_toml: &str) -> Result<Self, String> { Ok(Mine) }
//!     fn claim(&self, module_text: &str, func: &str) -> Result<Verdict, String> { Ok(Verdict::Accept) }
//!     fn compile(&self, module_text: &str, func: &str) -> Result<MyKernel, String> { Ok(MyKernel) }
//! }
//! fusebox_plugin_abi::export_plugin!(Mine);
//! ```

use std::ffi::{c_char, c_void};

pub mod sdk;

/// The ABI major version: the host refuses plugins of any other major version.
pub const ABI_MAJOR: u32 = 1;
/// The ABI minor version: minor versions only append fields to [`PluginVTable`].
pub const ABI_MINOR: u32 = 0;
/// The exported entry point's name.
pub const ENTRY_POINT: &str = "fusebox_plugin_entry_v1";

/// A callback succeeded.
pub const FB_OK: i32 = 0;
/// A callback failed; `*err` may hold a message.
pub const FB_ERROR: i32 = 1;
/// A callback panicked (caught by the SDK); `*err` may hold the panic message.
pub const FB_PANIC: i32 = 2;

/// Element types (`FbDType`).
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FbDType {
    /// float16
    F16 = 0,
    /// bfloat16
    BF16 = 1,
    /// float32
    F32 = 2,
    /// float64
    F64 = 3,
    /// int8
    I8 = 4,
    /// uint8
    U8 = 5,
    /// int32
    I32 = 6,
    /// int64
    I64 = 7,
    /// bool (one byte)
    Bool = 8,
}

impl FbDType {
    /// The dtype of a raw `dtype` field, if valid.
    pub fn from_raw(v: i32) -> Option<FbDType> {
        use FbDType::*;
        [F16, BF16, F32, F64, I8, U8, I32, I64, Bool]
            .into_iter()
            .find(|d| *d as i32 == v)
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            FbDType::I8 | FbDType::U8 | FbDType::Bool => 1,
            FbDType::F16 | FbDType::BF16 => 2,
            FbDType::F32 | FbDType::I32 => 4,
            FbDType::F64 | FbDType::I64 => 8,
        }
    }
}

/// Devices (`FbDevice`).
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FbDevice {
    /// Host memory.
    Cpu = 0,
    /// CUDA device memory.
    Cuda = 1,
}

/// A strided tensor (`FbTensor`); strides are in elements.
#[repr(C)]
#[derive(Debug)]
pub struct FbTensor {
    /// The first element.
    pub data: *mut c_void,
    /// An [`FbDType`] as `i32`.
    pub dtype: i32,
    /// Number of dims.
    pub ndim: i32,
    /// `ndim` extents.
    pub shape: *const i64,
    /// `ndim` strides, in elements.
    pub strides: *const i64,
    /// An [`FbDevice`] as `i32`.
    pub device: i32,
    /// The device ordinal.
    pub device_id: i32,
}

impl FbTensor {
    /// An empty tensor (all null), for out-parameters.
    pub fn empty() -> FbTensor {
        FbTensor {
            data: std::ptr::null_mut(),
            dtype: FbDType::F32 as i32,
            ndim: 0,
            shape: std::ptr::null(),
            strides: std::ptr::null(),
            device: FbDevice::Cpu as i32,
            device_id: 0,
        }
    }
}

/// `create(options_toml, &instance, &err)`.
pub type CreateFn = extern "C" fn(*const c_char, *mut *mut c_void, *mut *mut c_char) -> i32;
/// `claim(instance, module_text, func_name, &accept, &reason, &err)`.
pub type ClaimFn = extern "C" fn(
    *mut c_void,
    *const c_char,
    *const c_char,
    *mut i32,
    *mut *mut c_char,
    *mut *mut c_char,
) -> i32;
/// `compile(instance, module_text, func_name, &artifact, &err)`.
pub type CompileFn = extern "C" fn(
    *mut c_void,
    *const c_char,
    *const c_char,
    *mut *mut c_void,
    *mut *mut c_char,
) -> i32;
/// `run(artifact, args, nargs, &out, &err)`.
pub type RunFn =
    extern "C" fn(*mut c_void, *const FbTensor, usize, *mut FbTensor, *mut *mut c_char) -> i32;

/// `free_tensor(tensor)`.
pub type FreeTensorFn = extern "C" fn(*mut FbTensor);
/// `free_artifact(artifact)` and `free_instance(instance)`.
pub type FreeFn = extern "C" fn(*mut c_void);
/// `free_string(s)`.
pub type FreeStringFn = extern "C" fn(*mut c_char);

/// The names of the callbacks of [`PluginVTable`], in table order: all are required.
pub const CALLBACKS: [&str; 8] = [
    "create",
    "claim",
    "compile",
    "run",
    "free_tensor",
    "free_artifact",
    "free_instance",
    "free_string",
];

/// The fields every version has, in front: what the host reads first.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct VTableHeader {
    /// [`ABI_MAJOR`] of the plugin.
    pub abi_major: u32,
    /// [`ABI_MINOR`] of the plugin.
    pub abi_minor: u32,
    /// `size_of::<PluginVTable>()` as the plugin was built.
    pub struct_size: u64,
}

/// The plugin's table (`FbPluginVTable`). The callbacks are `Option`s of function pointers
/// (the same layout as a C function pointer, NULL being `None`), so a table with a NULL entry
/// can be read and refused instead of called.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PluginVTable {
    /// [`ABI_MAJOR`] of the plugin.
    pub abi_major: u32,
    /// [`ABI_MINOR`] of the plugin.
    pub abi_minor: u32,
    /// `size_of::<PluginVTable>()` as the plugin was built.
    pub struct_size: u64,
    /// The backend name (NUL-terminated UTF-8).
    pub name: *const c_char,
    /// The plugin version.
    pub version: *const c_char,
    /// `[[pattern]]` tables as TOML text.
    pub patterns_toml: *const c_char,
    /// Makes an instance from the options. Required: like every callback below, `None` (a
    /// NULL pointer in C) makes the host refuse the plugin when it loads it.
    pub create: Option<CreateFn>,
    /// Claims or declines a function.
    pub claim: Option<ClaimFn>,
    /// Compiles a function into an artifact.
    pub compile: Option<CompileFn>,
    /// Runs an artifact.
    pub run: Option<RunFn>,
    /// Releases a tensor filled by `run`.
    pub free_tensor: Option<FreeTensorFn>,
    /// Releases an artifact.
    pub free_artifact: Option<FreeFn>,
    /// Releases an instance.
    pub free_instance: Option<FreeFn>,
    /// Releases a string the plugin returned.
    pub free_string: Option<FreeStringFn>,
}
