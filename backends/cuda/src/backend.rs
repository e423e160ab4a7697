//! The `cuda` backend: one fused CUDA kernel (or a few) per FuseOps group, compiled with NVRTC.
//!
//! Contract:
//!
//! - Registered as `cuda` with `inventory::submit!`. Options (`[backend.options]`): `arch`
//!   (`"sm_80"`, `"sm_90"`, `"sm_90a"`, …: the CUBIN target; default the device's, or `sm_90`
//!   ahead of time without a device), `sm_count` (for the launch configuration written by
//!   `fusebox compile` without a device; default 132, an H100 SXM), `cache` (default `true`: the
//!   on-disk compile cache of [`crate::cache`]). Any other option is an error naming it.
//! - [`Backend::claim`] accepts a function that FuseOps made (`Primitive`), or one whose
//!   `Codegen` / `Composite` is `cuda` / `cuda.*`, when [`crate::lower::lower`] can lower it;
//!   otherwise it declines with the reason (the op and why).
//! - [`Backend::compile`] needs a device: without one it fails with the typed "no CUDA device"
//!   error, and the pipeline moves on to the next backend (the report says so). It emits, compiles
//!   (in parallel, through the cache) and loads every kernel; the artifact uploads host arguments
//!   (device arguments are used in place), launches the kernels on the runtime's stream and
//!   returns device values.
//! - [`Backend::build`] needs no device: it writes each kernel's `.cu` and `.cubin` and its
//!   launch configuration, for `fusebox compile`.
//!
//! ```text
//! [[backend]]
//! name = "cuda"
//! [backend.options]
//! arch = "sm_90"
//! main: lv = cls.fused_add_relu(x, b)   -> claimed by `cuda`: fused_add_relu_k0.cu / .cubin
//! ```

use crate::device::{Gpu, GpuModule, GpuTensor, Kernel, KernelArg, LaunchConfig};
use crate::emit::{emit, launch};
use crate::lower::{Lowered, lower};
use crate::nvrtc::{Arch, CompileJob, CompileOptions, compile_many};
use fusebox_core::backend::registry::check_options;
use fusebox_core::backend::{
    Artifact, Backend, BackendRegistration, BuildOutput, Candidate, Claim, KernelInfo,
};
use fusebox_core::ir::Function;
use fusebox_core::runtime::{Placement, Tensor, Value};
use fusebox_core::transform::FusionPattern;
use std::sync::Arc;

/// The generic CUDA codegen backend.
#[derive(Clone, Debug)]
pub struct CudaBackend {
    arch: Option<Arch>,
    sm_count: u32,
    cache: bool,
}

impl Default for CudaBackend {
    fn default() -> Self {
        CudaBackend {
            arch: None,
            sm_count: 132,
            cache: true,
        }
    }
}

fn core_err(e: crate::Error) -> fusebox_core::Error {
    fusebox_core::Error::Backend {
        backend: "cuda".into(),
        message: e.to_string(),
    }
}

fn bad_option(message: String) -> fusebox_core::Error {
    fusebox_core::Error::Backend {
        backend: "cuda".into(),
        message,
    }
}

fn make(options: &toml::Table) -> fusebox_core::Result<Box<dyn Backend>> {
    check_options("cuda", options, &["arch", "sm_count", "cache"])?;
    let mut b = CudaBackend::default();
    if let Some(v) = options.get("arch") {
        let s = v
            .as_str()
            .ok_or_else(|| bad_option(format!("option `arch`: expected a string, found {v}")))?;
        b.arch = Some(
            s.parse::<Arch>()
                .map_err(|e| bad_option(format!("option `arch`: {e}")))?,
        );
    }
    if let Some(v) = options.get("sm_count") {
        b.sm_count = v
            .as_integer()
            .and_then(|i| u32::try_from(i).ok())
            .filter(|&i| i > 0)
            .ok_or_else(|| {
                bad_option(format!(
                    "option `sm_count`: expected a positive integer, found {v}"
                ))
            })?;
    }
    if let Some(v) = options.get("cache") {
        b.cache = v.as_bool().ok_or_else(|| {
            bad_option(format!("option `cache`: expected true or false, found {v}"))
        })?;
    }
    Ok(Box::new(b))
}

inventory::submit! {
    BackendRegistration { name: "cuda", make }
}

/// Whether the function is one this backend is meant for (before trying to lower it).
fn meant_for_cuda(f: &Function) -> bool {
    let named = |s: &Option<String>| {
        s.as_deref()
            .is_some_and(|n| n == "cuda" || n.starts_with("cuda."))
    };
    f.attrs.is_primitive() || named(&f.attrs.codegen) || named(&f.attrs.composite)
}

/// The kernels of a lowered function, compiled for `arch`.
struct Built {
    low: Lowered,
    sources: Vec<String>,
    cubins: Vec<Vec<u8>>,
}

impl CudaBackend {
    fn build_for(&self, c: &Candidate<'_>, arch: Arch) -> crate::Result<Built> {
        let low = lower(c.name, c.func)?;
        let sources: Vec<String> = low.kernels.iter().map(emit).collect();
        let jobs: Vec<CompileJob> = low
            .kernels
            .iter()
            .zip(&sources)
            .map(|(k, s)| CompileJob {
                name: format!("{}.cu", k.name),
                source: s.clone(),
                arch,
                options: CompileOptions::default(),
            })
            .collect();
        let cache = if self.cache {
            crate::cache::Cache::from_env()
        } else {
            None
        };
        let mut cubins = Vec::new();
        for r in compile_many(&jobs, cache.as_ref()) {
            cubins.push(r?.cubin);
        }
        Ok(Built {
            low,
            sources,
            cubins,
        })
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &str {
        "cuda"
    }

    fn patterns(&self) -> Vec<FusionPattern> {
        Vec::new()
    }

    fn claim(&self, c: &Candidate<'_>) -> Claim {
        if !meant_for_cuda(c.func) {
            return Claim::Decline {
                reason: "not a FuseOps group (Primitive) nor a `cuda` composite".into(),
            };
        }
        match lower(c.name, c.func) {
            Ok(_) => Claim::Accept,
            Err(e) => Claim::Decline {
                reason: e.to_string(),
            },
        }
    }

    fn compile(&self, c: &Candidate<'_>) -> fusebox_core::Result<Box<dyn Artifact>> {
        let gpu = Gpu::get().map_err(core_err)?;
        let arch = match self.arch {
            Some(a) => a,
            None => gpu.arch().ok_or_else(|| {
                bad_option(format!(
                    "no known CUBIN target for {} (compute capability {:?}); set option `arch`",
                    gpu.name(),
                    gpu.compute_capability()
                ))
            })?,
        };
        let built = self.build_for(c, arch).map_err(core_err)?;
        let mut kernels = Vec::new();
        for (k, cubin) in built.low.kernels.iter().zip(&built.cubins) {
            let module = gpu.load_module(cubin).map_err(core_err)?;
            let kernel = module.kernel(&k.name).map_err(core_err)?;
            let l = launch(k, gpu.sm_count());
            kernels.push((
                module,
                kernel,
                LaunchConfig {
                    grid: l.grid,
                    block: l.block,
                    shared_mem_bytes: l.shared_mem_bytes,
                },
            ));
        }
        let mut constants = Vec::new();
        for (_, cst) in &built.low.constants {
            let t = Tensor::from_constant(cst)?;
            constants.push(GpuTensor::upload(&gpu, &t).map_err(core_err)?);
        }
        Ok(Box::new(CudaArtifact {
            gpu,
            low: built.low,
            kernels,
            constants,
        }))
    }

    fn build(&self, c: &Candidate<'_>) -> fusebox_core::Result<Option<BuildOutput>> {
        let arch = self.arch.unwrap_or(Arch::Sm90);
        let built = self.build_for(c, arch).map_err(core_err)?;
        let mut out = BuildOutput {
            arch: Some(arch.to_string()),
            ..BuildOutput::default()
        };
        for ((k, src), cubin) in built
            .low
            .kernels
            .iter()
            .zip(built.sources)
            .zip(built.cubins)
        {
            let l = launch(k, self.sm_count);
            out.files.push((format!("{}.cu", k.name), src.into_bytes()));
            out.files.push((format!("{}.cubin", k.name), cubin));
            out.kernels.push(KernelInfo {
                name: k.name.clone(),
                grid: l.grid,
                block: l.block,
                shared_mem_bytes: l.shared_mem_bytes,
            });
        }
        Ok(Some(out))
    }
}

/// A compiled function: its kernels on the device.
struct CudaArtifact {
    gpu: Arc<Gpu>,
    low: Lowered,
    /// Each kernel with its module (kept loaded) and launch shape; looked up once, at
    /// compile time, so a run only launches.
    kernels: Vec<(GpuModule, Kernel, LaunchConfig)>,
    constants: Vec<GpuTensor>,
}

impl CudaArtifact {
    fn run_device(&self, args: &[Value]) -> crate::Result<Value> {
        let mut inputs: Vec<GpuTensor> = Vec::new();
        for a in args {
            match a {
                Value::Tuple(fields) => {
                    for f in fields {
                        inputs.push(GpuTensor::from_value(&self.gpu, f)?);
                    }
                }
                v => inputs.push(GpuTensor::from_value(&self.gpu, v)?),
            }
        }
        inputs.extend(self.constants.iter().cloned());
        if inputs.len() != self.low.inputs.len() {
            return Err(crate::Error::Device(format!(
                "expected {} input tensors, found {}",
                self.low.inputs.len(),
                inputs.len()
            )));
        }
        for (t, b) in inputs.iter().zip(&self.low.inputs) {
            let shape: Vec<u64> = t.shape().iter().map(|&d| d as u64).collect();
            if t.dtype() != b.dtype || shape != b.shape {
                return Err(crate::Error::Device(format!(
                    "input `{}`: expected {} {:?}, found {} {:?}",
                    b.name,
                    b.dtype,
                    b.shape,
                    t.dtype(),
                    t.shape()
                )));
            }
        }
        let mut outputs = Vec::new();
        for b in &self.low.outputs {
            let shape: Vec<usize> = b.shape.iter().map(|&d| d as usize).collect();
            outputs.push(GpuTensor::empty(&self.gpu, b.dtype, shape)?);
        }
        for (_module, kernel, cfg) in &self.kernels {
            let kargs: Vec<KernelArg<'_>> = inputs
                .iter()
                .chain(outputs.iter())
                .map(KernelArg::Buffer)
                .collect();
            kernel.launch(cfg, &kargs)?;
        }
        let mut vals: Vec<Value> = outputs.into_iter().map(GpuTensor::into_value).collect();
        Ok(if self.low.tuple {
            Value::Tuple(vals)
        } else {
            vals.pop()
                .ok_or_else(|| crate::Error::Device("the function has no output".into()))?
        })
    }
}

impl Artifact for CudaArtifact {
    fn run(&self, args: &[Value]) -> fusebox_core::Result<Value> {
        self.run_device(args).map_err(core_err)
    }

    /// Device values come in as they are (no download between two GPU functions).
    fn placement(&self) -> Placement {
        Placement::Device
    }
}
