//! The CUDA runtime the GPU backends share: the device probe, buffers, transfers, modules,
//! launches and event timing, over cudarc's driver API.
//!
//! Contract:
//!
//! - [`Gpu::get`] probes once per process and never panics (cudarc panics when `libcuda` is
//!   absent): it tries to preload `libcuda.so.1` from the usual driver directories, asks cudarc
//!   whether the driver library loads (`is_culib_present`), requires a driver for CUDA 13.0 or
//!   newer (the bindings are built for 13.0; an older driver lacks symbols they would look up),
//!   then `cuInit`, the device count, and a context on device `$FUSEBOX_CUDA_DEVICE` (default
//!   0). Any failure is [`Error::NoDevice`] with the reason, returned again on every call.
//! - One [`Gpu`] per process: a primary context, one stream that every operation here is
//!   ordered on (so cudarc's cross-stream event tracking is turned off), the device's name,
//!   compute capability, [`Arch`], memory, SM count and shared-memory limit.
//! - A [`GpuTensor`] is a dtype, a row-major shape and a device buffer (shared on clone, like
//!   a host [`Tensor`]). [`GpuTensor::upload`] / [`GpuTensor::download`] move every dtype
//!   bit-exactly (`bool` as one byte 0/1; any nonzero byte reads back as `true`). It implements
//!   fusebox-core's [`DeviceTensor`], so it travels through the executor as
//!   [`Value::Device`]; [`GpuTensor::from_value`] takes an artifact argument (uploading a host
//!   tensor once while its storage lives, so a model's constants stay on the device; reusing a
//!   buffer already on this GPU) and [`GpuTensor::into_value`] returns one.
//! - [`GpuTensor::device_ptr`] and [`Gpu::stream`] / [`Gpu::context`] give the raw pointer and
//!   stream that libraries such as cuBLASLt take; work they enqueue on that stream is ordered
//!   with everything here.
//! - [`Gpu::load_module`] loads CUBIN; [`GpuModule::kernel`] looks a kernel up and reads its
//!   parameter layout from the driver (`cuFuncGetParamInfo`); [`Kernel::launch`] checks the
//!   [`KernelArg`] list against that layout (count and size of every parameter) and the
//!   launch shape against the device's limits before launching, sets the kernel's
//!   dynamic-shared-memory limit when a launch asks for more than 48 KiB, and returns a typed
//!   error instead of handing the driver a bad argument list.
//! - Launches and copies are asynchronous on the stream; [`GpuTensor::download`] and
//!   [`Gpu::synchronize`] wait. [`GpuEvent`]s are created with timing enabled
//!   (`CU_EVENT_DEFAULT`, not cudarc's default `DISABLE_TIMING`); [`Gpu::time`] brackets work
//!   with two of them.
//!
//! ```no_run
//! use fusebox_cuda::device::{Gpu, GpuTensor, KernelArg, LaunchConfig};
//! use fusebox_core::runtime::Tensor;
//! let gpu = Gpu::get()?;
//! let x = GpuTensor::upload(&gpu, &Tensor::from_f32(vec![4], vec![1.0, 2.0, 3.0, 4.0])?)?;
//! # let cubin: Vec<u8> = Vec::new();
//! let module = gpu.load_module(&cubin)?;
//! let k = module.kernel("scale")?;
//! k.launch(&LaunchConfig::linear(4, 128)?, &[KernelArg::Buffer(&x), KernelArg::F32(2.0), KernelArg::I32(4)])?;
//! assert_eq!(x.download()?.to_f32_vec(), vec![2.0, 4.0, 6.0, 8.0]);
//! # Ok::<(), fusebox_cuda::Error>(())
//! ```

#![allow(
    unsafe_code,
    reason = "FFI module: the CUDA driver through cudarc's sys/result layers; every unsafe block has a SAFETY note"
)]

use crate::error::{Error, Result};
use crate::nvrtc::Arch;
use cudarc::driver::sys as cu;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, CudaView, CudaViewMut,
    DevicePtr, DeviceRepr, DriverError,
};
use fusebox_core::ir::DType;
use fusebox_core::runtime::{DeviceTensor, Storage, StorageRef, Tensor, Value, shape_numel};
use half::slice::HalfFloatSliceExt;
use half::vec::HalfBitsVecExt;
use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

/// Shared memory a kernel may use without opting in.
const DEFAULT_SHARED_LIMIT: u32 = 48 * 1024;

fn driver(what: &str) -> impl FnOnce(DriverError) -> Error + '_ {
    move |e| Error::Driver(format!("{what}: {e:?}"))
}

/// The process's CUDA device (see the module doc).
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    ordinal: usize,
    name: String,
    compute_capability: (u32, u32),
    arch: Option<Arch>,
    total_memory: usize,
    sm_count: u32,
    max_shared_per_block: u32,
    max_threads_per_block: u32,
    driver_version: (u32, u32),
    /// Device copies of the host tensors given as artifact arguments (see
    /// [`GpuTensor::from_value`]). Each copy holds an `Arc` of this `Gpu`; a copy goes at the
    /// first lookup after its host storage has, and the `Gpu` is the process's one, kept for
    /// its whole life ([`Gpu::get`]), so the cycle keeps nothing alive longer.
    host_copies: std::sync::Mutex<HostCopies<GpuTensor>>,
}

impl fmt::Debug for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("compute_capability", &self.compute_capability)
            .field("arch", &self.arch)
            .field("total_memory", &self.total_memory)
            .field("sm_count", &self.sm_count)
            .finish_non_exhaustive()
    }
}

/// Driver directories `libcuda.so.1` is preloaded from when present (the loader's own path is
/// tried by cudarc afterwards).
const DRIVER_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/local/nvidia/lib64",
    "/usr/lib/wsl/lib",
];

fn preload_driver() {
    for d in DRIVER_DIRS {
        let p = std::path::Path::new(d).join("libcuda.so.1");
        if p.is_file() {
            // SAFETY: loading NVIDIA's driver library runs its initialisers, which only set up
            // the driver's own state; the handle is kept for the life of the process.
            if let Ok(lib) = unsafe { libloading::Library::new(&p) } {
                std::mem::forget(lib);
                return;
            }
        }
    }
}

/// Makes the device's default memory pool keep freed memory instead of returning it to the
/// driver at every synchronisation (its release threshold is 0 by default). Buffers come from
/// `cuMemAllocAsync`; without this, each function call's output allocation maps fresh
/// physical pages on the host while the stream waits, which cost 0.2-0.3 ms per 256 MiB
/// output on an H200 (the first GPU check measured kernels at a third of copy bandwidth).
fn keep_pool_memory(ctx: &Arc<CudaContext>) -> std::result::Result<(), String> {
    let mut pool: cu::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out-pointer and `cu_device` is the context's device handle;
    // the driver is initialised (`cuInit` ran before the context was made).
    let rc = unsafe { cu::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) };
    if rc != cu::CUresult::CUDA_SUCCESS {
        return Err(format!("cuDeviceGetDefaultMemPool failed: {rc:?}"));
    }
    let mut threshold: u64 = u64::MAX;
    // SAFETY: `pool` is the device's default pool just returned; the attribute takes a
    // pointer to a `cuuint64_t`, which `threshold` is, and the driver only reads it.
    let rc = unsafe {
        cu::cuMemPoolSetAttribute(
            pool,
            cu::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&raw mut threshold).cast(),
        )
    };
    if rc != cu::CUresult::CUDA_SUCCESS {
        return Err(format!(
            "cuMemPoolSetAttribute(RELEASE_THRESHOLD) failed: {rc:?}"
        ));
    }
    Ok(())
}

fn attribute(ctx: &CudaContext, a: cu::CUdevice_attribute) -> Result<u32> {
    let v = ctx.attribute(a).map_err(driver("cuDeviceGetAttribute"))?;
    Ok(u32::try_from(v).unwrap_or(0))
}

fn probe() -> std::result::Result<Arc<Gpu>, String> {
    preload_driver();
    // SAFETY: `is_culib_present` only tries to dlopen cudarc's candidate names and drops the
    // handles; it resolves no symbols, so a missing library cannot make it panic.
    if !unsafe { cu::is_culib_present() } {
        return Err(
            "the CUDA driver library (libcuda.so.1) was not found: no NVIDIA driver is installed \
             here, or it is not on the loader path"
                .to_string(),
        );
    }
    let mut version = 0i32;
    // SAFETY: the library is present, `cuDriverGetVersion` exists in every driver and may be
    // called before `cuInit`; it writes one int through a valid pointer.
    let rc = unsafe { cu::cuDriverGetVersion(&mut version) };
    rc.result()
        .map_err(|e| format!("cuDriverGetVersion failed: {e:?}"))?;
    let driver_version = (
        u32::try_from(version / 1000).unwrap_or(0),
        u32::try_from((version % 1000) / 10).unwrap_or(0),
    );
    if version < 13000 {
        return Err(format!(
            "the NVIDIA driver supports CUDA {}.{}; fusebox needs a driver for CUDA 13.0 or newer \
             (580 or later)",
            driver_version.0, driver_version.1
        ));
    }
    cudarc::driver::result::init().map_err(|e| format!("cuInit failed: {e:?}"))?;
    let count = cudarc::driver::result::device::get_count()
        .map_err(|e| format!("cuDeviceGetCount failed: {e:?}"))?;
    if count <= 0 {
        return Err("the driver sees no CUDA device".to_string());
    }
    let ordinal = match std::env::var("FUSEBOX_CUDA_DEVICE") {
        Ok(s) if !s.is_empty() => s
            .trim()
            .parse::<usize>()
            .map_err(|_| format!("FUSEBOX_CUDA_DEVICE is `{s}`, not a device number"))?,
        _ => 0,
    };
    if ordinal >= count as usize {
        return Err(format!(
            "FUSEBOX_CUDA_DEVICE is {ordinal}, but the driver sees {count} device(s)"
        ));
    }
    let ctx = CudaContext::new(ordinal).map_err(|e| format!("cannot create a context: {e:?}"))?;
    // SAFETY: every buffer, copy and launch of this runtime is ordered on the one stream made
    // below, so the per-buffer events cudarc records to synchronise several streams are not
    // needed. Work that another library enqueues must use `Gpu::stream` too (documented).
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx
        .new_stream()
        .map_err(|e| format!("cannot create a stream: {e:?}"))?;
    if ctx.has_async_alloc() {
        // A speed setting only: where the driver refuses it, allocations still work.
        let _ = keep_pool_memory(&ctx);
    }
    let info = || -> Result<Gpu> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver("compute capability"))?;
        let cc = (
            u32::try_from(major).unwrap_or(0),
            u32::try_from(minor).unwrap_or(0),
        );
        use cu::CUdevice_attribute as A;
        Ok(Gpu {
            name: ctx.name().map_err(driver("cuDeviceGetName"))?,
            total_memory: ctx.total_mem().map_err(driver("cuDeviceTotalMem"))?,
            sm_count: attribute(&ctx, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            max_shared_per_block: attribute(
                &ctx,
                A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )?,
            max_threads_per_block: attribute(&ctx, A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            host_copies: std::sync::Mutex::new(HostCopies::default()),
            compute_capability: cc,
            arch: Arch::for_compute_capability(cc.0, cc.1),
            ordinal,
            driver_version,
            ctx: Arc::clone(&ctx),
            stream: Arc::clone(&stream),
        })
    };
    info().map(Arc::new).map_err(|e| e.to_string())
}

impl Gpu {
    /// The process's GPU, probed on the first call (see the module doc); [`Error::NoDevice`]
    /// with the reason when there is none.
    pub fn get() -> Result<Arc<Gpu>> {
        static GPU: OnceLock<std::result::Result<Arc<Gpu>, String>> = OnceLock::new();
        GPU.get_or_init(probe)
            .as_ref()
            .map(Arc::clone)
            .map_err(|reason| Error::NoDevice {
                reason: reason.clone(),
            })
    }

    /// Whether a GPU is usable in this process.
    pub fn is_available() -> bool {
        Gpu::get().is_ok()
    }

    /// The device's name (`NVIDIA H100 80GB HBM3`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// `cuda:0 (NVIDIA H100 80GB HBM3)`.
    pub fn describe(&self) -> String {
        format!("cuda:{} ({})", self.ordinal, self.name)
    }

    /// The compute capability (`(9, 0)`).
    pub fn compute_capability(&self) -> (u32, u32) {
        self.compute_capability
    }

    /// The portable arch to build for ([`Arch::for_compute_capability`]); `None` when fusebox
    /// builds no CUBIN that runs on this device (libraries such as cuBLAS still work).
    pub fn arch(&self) -> Option<Arch> {
        self.arch
    }

    /// Whether CUBIN for `arch` loads here (`sm_90a` on a 9.0 device, …).
    pub fn supports(&self, arch: Arch) -> bool {
        arch.runs_on(self.compute_capability.0, self.compute_capability.1)
    }

    /// The device's memory, in bytes.
    pub fn total_memory(&self) -> usize {
        self.total_memory
    }

    /// The free memory now, in bytes.
    pub fn free_memory(&self) -> Result<usize> {
        self.ctx
            .mem_get_info()
            .map(|(free, _)| free)
            .map_err(driver("cuMemGetInfo"))
    }

    /// The number of SMs.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// The most dynamic + static shared memory one block may use after opting in, in bytes.
    pub fn max_shared_mem_per_block(&self) -> u32 {
        self.max_shared_per_block
    }

    /// The most threads per block.
    pub fn max_threads_per_block(&self) -> u32 {
        self.max_threads_per_block
    }

    /// The CUDA version the driver supports (`(13, 0)`).
    pub fn driver_version(&self) -> (u32, u32) {
        self.driver_version
    }

    /// The context (for libraries that take one, such as cuBLASLt through cudarc).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every operation here is ordered on; enqueue library work on it too.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Waits for everything enqueued on the stream.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"))
    }

    /// Loads a CUBIN image (from [`crate::nvrtc::compile`]).
    pub fn load_module(self: &Arc<Self>, cubin: &[u8]) -> Result<GpuModule> {
        if cubin.is_empty() {
            return Err(Error::Driver(
                "cannot load an empty CUBIN image".to_string(),
            ));
        }
        let module = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(cubin.to_vec()))
            .map_err(driver("cuModuleLoadData"))?;
        Ok(GpuModule {
            gpu: Arc::clone(self),
            module,
        })
    }

    /// A new event with timing enabled.
    pub fn event(self: &Arc<Self>) -> Result<GpuEvent> {
        let event = self
            .ctx
            .new_event(Some(cu::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver("cuEventCreate"))?;
        Ok(GpuEvent {
            gpu: Arc::clone(self),
            event,
        })
    }

    /// Runs `f` (which enqueues work on [`Gpu::stream`]) between two events and returns its
    /// result and the GPU time between them, in milliseconds (waits for the work).
    pub fn time<T>(self: &Arc<Self>, f: impl FnOnce() -> Result<T>) -> Result<(T, f32)> {
        let start = self.event()?;
        let end = self.event()?;
        start.record()?;
        let out = f()?;
        end.record()?;
        let ms = start.elapsed_ms(&end)?;
        Ok((out, ms))
    }

    /// Allocates `bytes` (at least one, so every tensor has a distinct pointer).
    fn alloc_bytes(&self, bytes: usize) -> Result<CudaSlice<u8>> {
        // SAFETY: the memory is uninitialised; it is only ever read as plain bytes or as
        // integer/float elements (every bit pattern valid) or bools through a `!= 0` map.
        unsafe { self.stream.alloc::<u8>(bytes.max(1)) }.map_err(driver("cuMemAlloc"))
    }
}

/// A timing event on the [`Gpu`]'s stream.
pub struct GpuEvent {
    gpu: Arc<Gpu>,
    event: CudaEvent,
}

impl fmt::Debug for GpuEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuEvent").finish_non_exhaustive()
    }
}

impl GpuEvent {
    /// Records the stream's work so far into the event.
    pub fn record(&self) -> Result<()> {
        self.event
            .record(&self.gpu.stream)
            .map_err(driver("cuEventRecord"))
    }

    /// Waits for the event.
    pub fn synchronize(&self) -> Result<()> {
        self.event
            .synchronize()
            .map_err(driver("cuEventSynchronize"))
    }

    /// Milliseconds from this event to `end` (waits for both).
    pub fn elapsed_ms(&self, end: &GpuEvent) -> Result<f32> {
        self.event
            .elapsed_ms(&end.event)
            .map_err(driver("cuEventElapsedTime"))
    }
}

/// What was made from host tensors (their device copies), keyed by the host storage and
/// held only while that storage lives: a host tensor passed again (the same storage and shape,
/// as the executor passes a model's constants to every call) gets the same copy back instead
/// of a new upload. BERT-base's 94 MB word-embedding table, an argument of the FuseOps
/// function that gathers from it, was uploaded on every run and took 78% of it on an H200.
///
/// The key is a weak handle ([`Tensor::storage_weak`]): it keeps the storage's address from
/// being reused, and a write to the storage moves it to a new allocation, so a hit is always
/// the very data that was copied. Entries whose storage is gone are dropped on every lookup,
/// which bounds the cache by the host tensors alive at once.
pub(crate) struct HostCopies<T> {
    entries: Vec<(std::sync::Weak<Storage>, Vec<usize>, T)>,
}

impl<T> Default for HostCopies<T> {
    fn default() -> Self {
        HostCopies {
            entries: Vec::new(),
        }
    }
}

impl<T: Clone> HostCopies<T> {
    /// The copy made from `t`'s storage at `t`'s shape, made by `make` the first time.
    pub(crate) fn get_or_insert(
        &mut self,
        t: &Tensor,
        make: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        self.entries.retain(|(w, _, _)| w.strong_count() > 0);
        if let Some((_, _, v)) = self
            .entries
            .iter()
            .find(|(w, shape, _)| t.shares_storage(w) && shape.as_slice() == t.shape())
        {
            return Ok(v.clone());
        }
        let v = make()?;
        self.entries
            .push((t.storage_weak(), t.shape().to_vec(), v.clone()));
        Ok(v)
    }

    /// The number of copies held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// A tensor in device memory (see the module doc). Clones share the buffer.
#[derive(Clone)]
pub struct GpuTensor {
    gpu: Arc<Gpu>,
    dtype: DType,
    shape: Vec<usize>,
    numel: usize,
    ptr: u64,
    buf: Arc<CudaSlice<u8>>,
}

impl fmt::Debug for GpuTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GpuTensor({}, {:?}, {}, 0x{:x})",
            self.dtype,
            self.shape,
            self.gpu.describe(),
            self.ptr
        )
    }
}

/// The element count and byte size of a shape of `dtype`.
fn sizes(dtype: DType, shape: &[usize]) -> Result<(usize, usize)> {
    let numel = shape_numel(shape)
        .ok_or_else(|| Error::Device(format!("the element count of {shape:?} overflows")))?;
    let bytes = numel
        .checked_mul(dtype.size_bytes())
        .ok_or_else(|| Error::Device(format!("the byte size of {shape:?} {dtype} overflows")))?;
    Ok((numel, bytes))
}

impl GpuTensor {
    fn wrap(
        gpu: &Arc<Gpu>,
        dtype: DType,
        shape: Vec<usize>,
        numel: usize,
        buf: CudaSlice<u8>,
    ) -> Self {
        let ptr = {
            // Event tracking is off, so the returned guard records nothing.
            let (ptr, _sync) = buf.device_ptr(&gpu.stream);
            ptr
        };
        GpuTensor {
            gpu: Arc::clone(gpu),
            dtype,
            shape,
            numel,
            ptr,
            buf: Arc::new(buf),
        }
    }

    /// A tensor of `dtype` and `shape` whose contents are unspecified (for outputs a kernel
    /// writes in full).
    pub fn empty(gpu: &Arc<Gpu>, dtype: DType, shape: Vec<usize>) -> Result<GpuTensor> {
        let (numel, bytes) = sizes(dtype, &shape)?;
        let buf = gpu.alloc_bytes(bytes)?;
        Ok(GpuTensor::wrap(gpu, dtype, shape, numel, buf))
    }

    /// A tensor of zeros (`false` for bool).
    pub fn zeros(gpu: &Arc<Gpu>, dtype: DType, shape: Vec<usize>) -> Result<GpuTensor> {
        let (numel, bytes) = sizes(dtype, &shape)?;
        let mut buf = gpu.alloc_bytes(bytes)?;
        gpu.stream
            .memset_zeros(&mut buf)
            .map_err(driver("cuMemsetD8"))?;
        Ok(GpuTensor::wrap(gpu, dtype, shape, numel, buf))
    }

    /// Copies a host tensor to the device (bit-exact).
    pub fn upload(gpu: &Arc<Gpu>, t: &Tensor) -> Result<GpuTensor> {
        let (numel, bytes) = sizes(t.dtype(), t.shape())?;
        let mut buf = gpu.alloc_bytes(bytes)?;
        if numel > 0 {
            fn put<T: DeviceRepr>(gpu: &Gpu, buf: &mut CudaSlice<u8>, v: &[T]) -> Result<()> {
                // SAFETY: the buffer holds `len * size_of::<T>()` bytes (allocated from the
                // same shape and dtype); any bytes are a valid `T` on the device side.
                let mut view = unsafe { buf.transmute_mut::<T>(v.len()) }.ok_or_else(|| {
                    Error::Device("the upload buffer is smaller than the tensor".to_string())
                })?;
                gpu.stream
                    .memcpy_htod(v, &mut view)
                    .map_err(driver("cuMemcpyHtoD"))
            }
            match t.storage() {
                StorageRef::F16(v) => put::<u16>(gpu, &mut buf, v.reinterpret_cast())?,
                StorageRef::BF16(v) => put::<u16>(gpu, &mut buf, v.reinterpret_cast())?,
                StorageRef::F32(v) => put(gpu, &mut buf, v)?,
                StorageRef::F64(v) => put(gpu, &mut buf, v)?,
                StorageRef::I8(v) => put(gpu, &mut buf, v)?,
                StorageRef::U8(v) => put(gpu, &mut buf, v)?,
                StorageRef::I32(v) => put(gpu, &mut buf, v)?,
                StorageRef::I64(v) => put(gpu, &mut buf, v)?,
                StorageRef::Bool(v) => put(gpu, &mut buf, v)?,
            }
        }
        Ok(GpuTensor::wrap(
            gpu,
            t.dtype(),
            t.shape().to_vec(),
            numel,
            buf,
        ))
    }

    /// Copies the tensor to the host (bit-exact; waits for the work that writes it).
    pub fn download(&self) -> Result<Tensor> {
        let n = self.numel;
        fn get<T: DeviceRepr + Clone + Default>(g: &GpuTensor) -> Result<Vec<T>> {
            let mut out = vec![T::default(); g.numel];
            if g.numel == 0 {
                return Ok(out);
            }
            // SAFETY: the buffer holds `numel * size_of::<T>()` bytes, and every byte pattern
            // is a valid `T` for the integer and float types this is called with.
            let view = unsafe { g.buf.transmute::<T>(g.numel) }.ok_or_else(|| {
                Error::Device("the device buffer is smaller than the tensor".to_string())
            })?;
            g.gpu
                .stream
                .memcpy_dtoh(&view, &mut out)
                .map_err(driver("cuMemcpyDtoH"))?;
            g.gpu.synchronize()?;
            Ok(out)
        }
        let storage = match self.dtype {
            DType::F16 => Storage::F16(get::<u16>(self)?.reinterpret_into()),
            DType::BF16 => Storage::BF16(get::<u16>(self)?.reinterpret_into()),
            DType::F32 => Storage::F32(get(self)?),
            DType::F64 => Storage::F64(get(self)?),
            DType::I8 => Storage::I8(get(self)?),
            DType::U8 => Storage::U8(get(self)?),
            DType::I32 => Storage::I32(get(self)?),
            DType::I64 => Storage::I64(get(self)?),
            DType::Bool => Storage::Bool(get::<u8>(self)?.into_iter().map(|b| b != 0).collect()),
        };
        debug_assert_eq!(storage.len(), n);
        Ok(Tensor::new(self.shape.clone(), storage)?)
    }

    /// An artifact argument on this GPU: a host tensor is uploaded once for as long as its
    /// storage lives (see `HostCopies`: a model's constants, which the executor decodes once
    /// and passes to every call, stay on the device), a [`GpuTensor`] of this GPU is shared
    /// (no copy), another device's tensor goes through the host.
    pub fn from_value(gpu: &Arc<Gpu>, v: &Value) -> Result<GpuTensor> {
        match v {
            Value::Tensor(t) => {
                let mut copies = gpu
                    .host_copies
                    .lock()
                    .map_err(|_| Error::Device("the host-copy cache is poisoned".to_string()))?;
                copies.get_or_insert(t, || GpuTensor::upload(gpu, t))
            }
            Value::Device(d) => match d.as_any().downcast_ref::<GpuTensor>() {
                Some(g) if Arc::ptr_eq(&g.gpu, gpu) => Ok(g.clone()),
                _ => GpuTensor::upload(gpu, &d.to_host()?),
            },
            other => Err(Error::Device(format!(
                "expected a tensor argument, found {}",
                other.kind()
            ))),
        }
    }

    /// The tensor as an executor value ([`Value::Device`]).
    pub fn into_value(self) -> Value {
        Value::Device(Arc::new(self))
    }

    /// The same buffer under another shape with the same element count.
    pub fn reshaped(&self, shape: Vec<usize>) -> Result<GpuTensor> {
        let (numel, _) = sizes(self.dtype, &shape)?;
        if numel != self.numel {
            return Err(Error::Device(format!(
                "cannot view {:?} ({} elements) as {shape:?} ({numel} elements)",
                self.shape, self.numel
            )));
        }
        Ok(GpuTensor {
            shape,
            ..self.clone()
        })
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// The size of the data in bytes.
    pub fn byte_len(&self) -> usize {
        self.numel * self.dtype.size_bytes()
    }

    /// The device address of the first element (`CUdeviceptr`), for kernel arguments and
    /// libraries. Valid while this tensor (or a clone) is alive; use it on [`Gpu::stream`].
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The underlying cudarc buffer (raw bytes; at least one byte long).
    pub fn buffer(&self) -> &CudaSlice<u8> {
        &self.buf
    }

    /// The data as a typed cudarc view of [`GpuTensor::numel`] elements, for libraries with
    /// typed APIs. `T`'s size must be the dtype's (`u16` for f16/bf16); an error otherwise.
    pub fn view<T: DeviceElem>(&self) -> Result<CudaView<'_, T>> {
        self.check_elem::<T>()?;
        // SAFETY: the buffer holds at least `numel * size_of::<T>()` bytes (checked by
        // `transmute`), and `DeviceElem` types accept every bit pattern.
        unsafe { self.buf.transmute::<T>(self.numel) }
            .ok_or_else(|| Error::Device("the device buffer is smaller than the tensor".into()))
    }

    /// [`GpuTensor::view`], writable; an error when the buffer is shared with a clone (a
    /// freshly made output is not).
    pub fn view_mut<T: DeviceElem>(&mut self) -> Result<CudaViewMut<'_, T>> {
        self.check_elem::<T>()?;
        let numel = self.numel;
        let buf = Arc::get_mut(&mut self.buf).ok_or_else(|| {
            Error::Device("cannot write through a buffer shared with another tensor".into())
        })?;
        // SAFETY: as in `view`; the buffer is not shared (checked above).
        unsafe { buf.transmute_mut::<T>(numel) }
            .ok_or_else(|| Error::Device("the device buffer is smaller than the tensor".into()))
    }

    fn check_elem<T>(&self) -> Result<()> {
        if std::mem::size_of::<T>() != self.dtype.size_bytes() {
            return Err(Error::Device(format!(
                "a {} tensor cannot be viewed as {} ({} bytes per element)",
                self.dtype,
                std::any::type_name::<T>(),
                std::mem::size_of::<T>()
            )));
        }
        Ok(())
    }

    /// The GPU it lives on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }
}

impl DeviceTensor for GpuTensor {
    fn dtype(&self) -> DType {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn device(&self) -> String {
        self.gpu.describe()
    }

    fn to_host(&self) -> fusebox_core::Result<Tensor> {
        self.download()
            .map_err(|e| fusebox_core::Error::Runtime(e.to_string()))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

mod sealed {
    pub trait Sealed {}
}

/// Element types a [`GpuTensor`] may be viewed as: plain numbers, valid for every bit pattern
/// (so no view can make an invalid `bool` on the host).
pub trait DeviceElem: DeviceRepr + sealed::Sealed {}

macro_rules! device_elem {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl DeviceElem for $t {}
    )*};
}
device_elem!(f32, f64, i8, u8, i16, u16, i32, u32, i64, u64);

/// Grid, block and dynamic shared memory of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaunchConfig {
    /// Blocks (x, y, z).
    pub grid: [u32; 3],
    /// Threads per block (x, y, z).
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// One thread per element of `n`, `block` threads per block, in x.
    pub fn linear(n: usize, block: u32) -> Result<LaunchConfig> {
        let block = block.max(1);
        let blocks = n.div_ceil(block as usize).max(1);
        let grid = u32::try_from(blocks).map_err(|_| {
            Error::Device(format!(
                "{n} elements need more than 2^32 blocks of {block}"
            ))
        })?;
        Ok(LaunchConfig {
            grid: [grid, 1, 1],
            block: [block, 1, 1],
            shared_mem_bytes: 0,
        })
    }
}

impl From<&fusebox_core::backend::KernelInfo> for LaunchConfig {
    fn from(k: &fusebox_core::backend::KernelInfo) -> Self {
        LaunchConfig {
            grid: k.grid,
            block: k.block,
            shared_mem_bytes: k.shared_mem_bytes,
        }
    }
}

/// One kernel argument.
#[derive(Clone, Copy, Debug)]
pub enum KernelArg<'a> {
    /// A tensor's device pointer.
    Buffer(&'a GpuTensor),
    /// A raw device pointer (`CUdeviceptr`), e.g. an offset into a buffer.
    Ptr(u64),
    /// `int`.
    I32(i32),
    /// `long long` / `int64_t`.
    I64(i64),
    /// `unsigned int`.
    U32(u32),
    /// `unsigned long long` / `uint64_t`.
    U64(u64),
    /// `float`.
    F32(f32),
    /// `double`.
    F64(f64),
    /// A TMA descriptor passed by value (`const __grid_constant__ CUtensorMap`, 128 bytes).
    TensorMap(&'a crate::tma::TensorMap),
}

/// One argument's bytes, as the driver reads them (128-byte aligned, like `CUtensorMap`).
#[repr(C, align(128))]
struct Slot([u8; 128]);

impl KernelArg<'_> {
    /// The argument's bytes, zero-padded to 128, and its size.
    fn bytes(&self) -> (Slot, usize) {
        let mut s = Slot([0u8; 128]);
        let b = &mut s.0;
        let n = match *self {
            KernelArg::TensorMap(m) => {
                b.copy_from_slice(&m.bytes());
                128
            }
            KernelArg::Buffer(t) => {
                b[..8].copy_from_slice(&t.ptr.to_ne_bytes());
                8
            }
            KernelArg::Ptr(p) | KernelArg::U64(p) => {
                b[..8].copy_from_slice(&p.to_ne_bytes());
                8
            }
            KernelArg::I64(x) => {
                b[..8].copy_from_slice(&x.to_ne_bytes());
                8
            }
            KernelArg::F64(x) => {
                b[..8].copy_from_slice(&x.to_ne_bytes());
                8
            }
            KernelArg::I32(x) => {
                b[..4].copy_from_slice(&x.to_ne_bytes());
                4
            }
            KernelArg::U32(x) => {
                b[..4].copy_from_slice(&x.to_ne_bytes());
                4
            }
            KernelArg::F32(x) => {
                b[..4].copy_from_slice(&x.to_ne_bytes());
                4
            }
        };
        (s, n)
    }

    fn describe(&self) -> &'static str {
        match self {
            KernelArg::Buffer(_) => "buffer (8 bytes)",
            KernelArg::Ptr(_) => "pointer (8 bytes)",
            KernelArg::I32(_) => "i32 (4 bytes)",
            KernelArg::I64(_) => "i64 (8 bytes)",
            KernelArg::U32(_) => "u32 (4 bytes)",
            KernelArg::U64(_) => "u64 (8 bytes)",
            KernelArg::F32(_) => "f32 (4 bytes)",
            KernelArg::F64(_) => "f64 (8 bytes)",
            KernelArg::TensorMap(_) => "TMA descriptor (128 bytes)",
        }
    }
}

/// A loaded CUBIN module.
pub struct GpuModule {
    gpu: Arc<Gpu>,
    module: Arc<CudaModule>,
}

impl fmt::Debug for GpuModule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuModule").finish_non_exhaustive()
    }
}

impl GpuModule {
    /// The kernel named `name` (its `extern "C"` symbol), with its parameter layout.
    pub fn kernel(&self, name: &str) -> Result<Kernel> {
        if name.contains('\0') {
            return Err(Error::Driver(format!(
                "kernel name {name:?} contains a NUL byte"
            )));
        }
        let func = self
            .module
            .load_function(name)
            .map_err(|e| Error::Driver(format!("no kernel `{name}` in the module: {e:?}")))?;
        let mut params = Vec::new();
        for i in 0usize.. {
            let (mut offset, mut size) = (0usize, 0usize);
            // SAFETY: `func` is a live function of a loaded module (kept alive by `func`);
            // the driver writes two usizes through valid pointers, and answers
            // CUDA_ERROR_INVALID_VALUE for an index past the last parameter.
            let rc =
                unsafe { cu::cuFuncGetParamInfo(func.cu_function(), i, &mut offset, &mut size) };
            match rc {
                cu::CUresult::CUDA_SUCCESS => params.push(size),
                cu::CUresult::CUDA_ERROR_INVALID_VALUE => break,
                e => {
                    return Err(Error::Driver(format!(
                        "cuFuncGetParamInfo({name}, {i}): {e:?}"
                    )));
                }
            }
        }
        Ok(Kernel {
            gpu: Arc::clone(&self.gpu),
            name: name.to_string(),
            func,
            params,
            shared_limit: AtomicU32::new(DEFAULT_SHARED_LIMIT),
        })
    }
}

/// A kernel ready to launch.
pub struct Kernel {
    gpu: Arc<Gpu>,
    name: String,
    func: CudaFunction,
    /// The byte size of each parameter, from the driver.
    params: Vec<usize>,
    /// The dynamic shared memory the kernel is currently allowed.
    shared_limit: AtomicU32,
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel")
            .field("name", &self.name)
            .field("params", &self.params)
            .finish_non_exhaustive()
    }
}

impl Kernel {
    /// The kernel's symbol.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The byte size of each parameter, as the driver reports them.
    pub fn param_sizes(&self) -> &[usize] {
        &self.params
    }

    /// Registers per thread.
    pub fn num_registers(&self) -> Result<u32> {
        let r = self.func.num_regs().map_err(driver("cuFuncGetAttribute"))?;
        Ok(u32::try_from(r).unwrap_or(0))
    }

    /// Local memory per thread, in bytes (nonzero when registers spill).
    pub fn local_bytes(&self) -> Result<u32> {
        let r = self
            .func
            .local_size_bytes()
            .map_err(driver("cuFuncGetAttribute"))?;
        Ok(u32::try_from(r).unwrap_or(0))
    }

    fn check(&self, cfg: &LaunchConfig, args: &[KernelArg<'_>]) -> Result<()> {
        let bad = |m: String| Error::Device(format!("launch of `{}`: {m}", self.name));
        if args.len() != self.params.len() {
            return Err(bad(format!(
                "the kernel takes {} parameter(s), {} given",
                self.params.len(),
                args.len()
            )));
        }
        for (i, (a, &size)) in args.iter().zip(&self.params).enumerate() {
            if a.bytes().1 != size {
                return Err(bad(format!(
                    "parameter {i} is {size} bytes, given a {}",
                    a.describe()
                )));
            }
            if let KernelArg::Buffer(t) = a
                && !Arc::ptr_eq(&t.gpu, &self.gpu)
            {
                return Err(bad(format!("parameter {i} lives on another GPU")));
            }
        }
        let threads: u64 = cfg.block.iter().map(|&b| u64::from(b)).product();
        if cfg.grid.contains(&0) || threads == 0 {
            return Err(bad(format!(
                "an empty launch (grid {:?}, block {:?})",
                cfg.grid, cfg.block
            )));
        }
        if threads > u64::from(self.gpu.max_threads_per_block) {
            return Err(bad(format!(
                "{threads} threads per block, the device allows {}",
                self.gpu.max_threads_per_block
            )));
        }
        if cfg.shared_mem_bytes > self.gpu.max_shared_per_block {
            return Err(bad(format!(
                "{} bytes of dynamic shared memory, the device allows {}",
                cfg.shared_mem_bytes, self.gpu.max_shared_per_block
            )));
        }
        Ok(())
    }

    /// Launches the kernel on the GPU's stream (asynchronously) after checking the arguments
    /// against its parameters and the shape against the device (see the module doc).
    pub fn launch(&self, cfg: &LaunchConfig, args: &[KernelArg<'_>]) -> Result<()> {
        self.check(cfg, args)?;
        self.gpu
            .ctx
            .bind_to_thread()
            .map_err(driver("cuCtxSetCurrent"))?;
        if cfg.shared_mem_bytes > self.shared_limit.load(Ordering::Relaxed) {
            self.func
                .set_attribute(
                    cu::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    i32::try_from(cfg.shared_mem_bytes).unwrap_or(i32::MAX),
                )
                .map_err(driver("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)"))?;
            self.shared_limit
                .fetch_max(cfg.shared_mem_bytes, Ordering::Relaxed);
        }
        // One 128-byte slot per argument; the driver reads `size` bytes from each slot's start.
        let mut slots: Vec<Slot> = args.iter().map(|a| a.bytes().0).collect();
        let mut ptrs: Vec<*mut std::ffi::c_void> = slots
            .iter_mut()
            .map(|s| s.0.as_mut_ptr().cast::<std::ffi::c_void>())
            .collect();
        let [gx, gy, gz] = cfg.grid;
        let [bx, by, bz] = cfg.block;
        // SAFETY: `ptrs` has one entry per kernel parameter (count checked against the
        // driver's parameter info above), each pointing at a live 128-byte slot holding a value
        // of exactly the parameter's size; buffers are device pointers of live allocations on
        // this GPU (kept alive by the caller's `&GpuTensor` for the duration of this call; the
        // stream orders any later free after the kernel). Device-side out-of-bounds accesses
        // are reported by the driver as errors, not host memory unsafety.
        let rc = unsafe {
            cudarc::driver::result::launch_kernel(
                self.func.cu_function(),
                (gx, gy, gz),
                (bx, by, bz),
                cfg.shared_mem_bytes,
                self.gpu.stream.cu_stream(),
                &mut ptrs,
            )
        };
        rc.map_err(|e| Error::Driver(format!("cuLaunchKernel(`{}`): {e:?}", self.name)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::panic, reason = "test code: a failure is a panic")]

    use super::*;

    #[test]
    fn the_probe_never_panics_and_answers_the_same_twice() {
        let a = Gpu::get().map(|g| g.describe()).map_err(|e| e.to_string());
        let b = Gpu::get().map(|g| g.describe()).map_err(|e| e.to_string());
        assert_eq!(a, b);
        if let Err(e) = Gpu::get() {
            assert!(matches!(e, Error::NoDevice { .. }), "{e}");
        }
    }

    #[test]
    fn host_copies_are_made_once_per_live_storage_and_shape() {
        let mut copies: HostCopies<usize> = HostCopies::default();
        let mut made = 0usize;
        let mut get = |copies: &mut HostCopies<usize>, t: &Tensor| {
            copies
                .get_or_insert(t, || {
                    made += 1;
                    Ok(made)
                })
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let w = Tensor::from_f32(vec![2, 3], vec![0.5; 6]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(get(&mut copies, &w), 1);
        // The same storage again (a clone, as the executor passes a constant): the same copy.
        assert_eq!(get(&mut copies, &w.clone()), 1);
        // Equal values in another storage, or the same storage at another shape: new copies.
        let twin = Tensor::from_f32(vec![2, 3], vec![0.5; 6]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(get(&mut copies, &twin), 2);
        let flat = w.reshaped(vec![6]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(get(&mut copies, &flat), 3);
        // A tensor written after its copy was made is copied anew.
        let mut changed = w.clone();
        if let Storage::F32(v) = changed.storage_mut() {
            v[0] = 1.0;
        }
        assert_eq!(get(&mut copies, &changed), 4);
        assert_eq!(get(&mut copies, &w), 1);
        // Copies of storages that are gone are dropped at the next lookup (the reshape's copy
        // stays while `w`, whose storage it shares, lives).
        drop((twin, flat, changed));
        let other = Tensor::from_f32(vec![1], vec![0.0]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(get(&mut copies, &other), 5);
        assert_eq!(copies.len(), 3);
        drop(w);
        assert_eq!(get(&mut copies, &other), 5);
        assert_eq!(copies.len(), 1);
    }

    #[test]
    fn kernel_args_have_their_c_sizes() {
        let (s, n) = KernelArg::I32(-1).bytes();
        assert_eq!((&s.0[..8], n), (&[255, 255, 255, 255, 0, 0, 0, 0][..], 4));
        assert_eq!(KernelArg::F32(1.0).bytes().0.0[..4], 1.0f32.to_ne_bytes());
        let (s, n) = KernelArg::I64(-2).bytes();
        assert_eq!((&s.0[..8], n), (&(-2i64).to_ne_bytes()[..], 8));
        assert!(s.0[8..].iter().all(|&b| b == 0));
        assert_eq!(std::mem::align_of::<Slot>(), 128);
        assert_eq!(KernelArg::Ptr(0xdead_beef).bytes().1, 8);
        assert_eq!(KernelArg::F64(0.5).bytes().1, 8);
    }

    #[test]
    fn linear_launches_cover_every_element() {
        let c = LaunchConfig::linear(1000, 256).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((c.grid, c.block), ([4, 1, 1], [256, 1, 1]));
        let c = LaunchConfig::linear(0, 256).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.grid, [1, 1, 1]);
        assert!(LaunchConfig::linear(usize::MAX, 1).is_err());
    }
}
