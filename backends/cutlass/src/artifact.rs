//! The device artifact: plans each call from its argument shapes, picks an instance (the
//! heuristic, or with `profile = true` the fastest candidate, timed once per problem and cached
//! on disk), compiles it with NVRTC for the device's arch (through fusebox-cuda's compile
//! cache), loads it once, and launches it on the runtime's stream with device values in and a
//! device value out ([`Placement::Device`]).
//!
//! Contract: [`CutlassArtifact::new`] needs a device: without one it is the typed no-device
//! error ([`crate::Error::is_no_device`]). A call's kernel arguments are, in order, A, B, D,
//! the epilogue operands, then `M, N, K, sA, sB, sD` (GEMM) or the conv2d geometry (see
//! [`crate::generator`]); a wgmma instance (chosen when the `arch` option is sm_90a and the
//! device has compute capability 9.0) takes two TMA descriptors built here with
//! `cuTensorMapEncodeTiled` ([`crate::wgmma::tma_specs`]) instead of A and B, then `D`, the
//! epilogue operands and `M, N, K, zA, zB, sD`. The profile cache is `cutlass-profile.json` in fusebox-cuda's cache
//! directory: `{ "<device>|<problem key>": "<kernel name>" }`.
//!
//!
//! [`AttentionArtifact`] runs a `cutlass.attention*` function: it compiles the spec's fused
//! attention kernel when made and launches it per call with the plan of the call's shapes
//! ([`crate::attention`]); arguments of other dtypes or shapes are typed errors.
//!
//! ```text
//! call fused_relax_matmul_relax_add_cutlass(x: (512, 256) f16, w: (256, 1024) f16, b: (1024,))
//!   -> cutlass_f16_gemm_nn_64x64x32_32x32x32_s4_a8_bias  grid (16, 8, 1) block 128, smem 38912
//! ```

use crate::attention::FlashAttention;
use crate::error::{Error, Result};
use crate::generator::{Instance, Math, emit};
use crate::options::Options;
use crate::plan::{Plan, Shape, plan};
use crate::spec::{AttentionSpec, KernelSpec};
use fusebox_core::backend::Artifact;
use fusebox_core::runtime::{Placement, Value};
use fusebox_cuda::{
    Arch, Cache, CompileOptions, Gpu, GpuModule, GpuTensor, KernelArg, LaunchConfig, TensorMap,
    compile_cached,
};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// A compiled cutlass function on the device.
pub struct CutlassArtifact {
    name: String,
    spec: KernelSpec,
    options: Options,
    gpu: Arc<Gpu>,
    arch: Arch,
    modules: Mutex<HashMap<String, Arc<GpuModule>>>,
    chosen: Mutex<HashMap<Plan, Instance>>,
}

impl std::fmt::Debug for CutlassArtifact {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CutlassArtifact")
            .field("name", &self.name)
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl CutlassArtifact {
    /// Prepares `spec` on the device; with `static_shapes`, compiles the chosen kernel now.
    pub fn new(
        name: &str,
        spec: KernelSpec,
        static_shapes: Option<Vec<Vec<usize>>>,
        options: Options,
    ) -> Result<CutlassArtifact> {
        let gpu = Gpu::get()?;
        let device_arch = gpu.arch().ok_or_else(|| {
            Error::Cuda(fusebox_cuda::Error::NoDevice {
                reason: format!(
                    "{} (compute capability {:?}) is not an sm_80+ device the generated kernels target",
                    gpu.name(),
                    gpu.compute_capability()
                ),
            })
        })?;
        // sm_90a (wgmma + TMA) when asked for and the device runs it (compute capability 9.0).
        let arch = if options.arch == Arch::Sm90a && gpu.supports(Arch::Sm90a) {
            Arch::Sm90a
        } else {
            device_arch
        };
        let a = CutlassArtifact {
            name: name.to_string(),
            spec,
            options,
            gpu,
            arch,
            modules: Mutex::new(HashMap::new()),
            chosen: Mutex::new(HashMap::new()),
        };
        if let Some(shapes) = static_shapes {
            let p = plan(&a.spec, &shapes)?;
            if !a.options.profile {
                let inst = a.choose(&p)?;
                a.module(&inst)?;
            }
        }
        Ok(a)
    }

    /// The kernel spec.
    pub fn spec(&self) -> &KernelSpec {
        &self.spec
    }

    fn module(&self, inst: &Instance) -> Result<Arc<GpuModule>> {
        let name = inst.kernel_name();
        if let Some(m) = lock(&self.modules).get(&name) {
            return Ok(m.clone());
        }
        let cache = Cache::from_env();
        // wgmma instances are only chosen when `self.arch` is sm_90a.
        let c = compile_cached(
            cache.as_ref(),
            &emit(inst),
            &format!("{name}.cu"),
            self.arch,
            &CompileOptions::default(),
        )?;
        let m = Arc::new(self.gpu.load_module(&c.cubin)?);
        lock(&self.modules).insert(name, m.clone());
        Ok(m)
    }

    fn choose(&self, p: &Plan) -> Result<Instance> {
        if let Some(i) = lock(&self.chosen).get(p) {
            return Ok(i.clone());
        }
        let inst = p
            .choose(&self.spec, self.gpu.sm_count() as usize, self.arch)
            .ok_or_else(|| Error::Args("no instance for this problem".into()))?;
        lock(&self.chosen).insert(p.clone(), inst.clone());
        Ok(inst)
    }

    fn launch(&self, inst: &Instance, p: &Plan, ins: &[GpuTensor], out: &GpuTensor) -> Result<()> {
        let (m, n, b) = p.mnb();
        let l = inst
            .launch(m, n, b)
            .ok_or_else(|| Error::Args(format!("problem {m}x{n}x{b} exceeds the grid limits")))?;
        let module = self.module(inst)?;
        let kernel = module.kernel(&inst.kernel_name())?;
        let i32_ = |v: usize| -> Result<i32> {
            i32::try_from(v).map_err(|_| Error::Args(format!("{v} exceeds 32-bit indexing")))
        };
        let i64_ = |v: usize| -> Result<i64> {
            i64::try_from(v).map_err(|_| Error::Args(format!("{v} exceeds 64-bit indexing")))
        };
        let (a, bt) = match &self.spec.problem {
            crate::spec::Problem::Gemm { lhs, rhs, .. } => (*lhs, *rhs),
            crate::spec::Problem::Conv2d { data, weight, .. } => (*data, *weight),
        };
        let arg = |i: usize| -> Result<&GpuTensor> {
            ins.get(i)
                .ok_or_else(|| Error::Args(format!("argument {i} is missing")))
        };
        if inst.tile.math == Math::Wgmma {
            let Shape::Gemm(g) = p.shape else {
                return Err(Error::Args(format!(
                    "{} is a GEMM kernel; the call is a conv2d",
                    inst.kernel_name()
                )));
            };
            let (spec_a, spec_b) = crate::wgmma::tma_specs(inst, &g);
            let tm_a = TensorMap::encode(&self.gpu, arg(a)?.device_ptr(), &spec_a)?;
            let tm_b = TensorMap::encode(&self.gpu, arg(bt)?.device_ptr(), &spec_b)?;
            let mut args: Vec<KernelArg<'_>> = vec![
                KernelArg::TensorMap(&tm_a),
                KernelArg::TensorMap(&tm_b),
                KernelArg::Buffer(out),
            ];
            for &e in &self.spec.extras {
                args.push(KernelArg::Buffer(arg(e)?));
            }
            args.push(KernelArg::I32(i32_(g.m)?));
            args.push(KernelArg::I32(i32_(g.n)?));
            args.push(KernelArg::I32(i32_(g.k)?));
            args.push(KernelArg::I32(i32::from(g.a_batched)));
            args.push(KernelArg::I32(i32::from(g.b_batched)));
            args.push(KernelArg::I64(i64_(g.m * g.n)?));
            let cfg = LaunchConfig {
                grid: l.grid,
                block: l.block,
                shared_mem_bytes: l.smem,
            };
            kernel.launch(&cfg, &args)?;
            return Ok(());
        }
        let mut args: Vec<KernelArg<'_>> = vec![
            KernelArg::Buffer(arg(a)?),
            KernelArg::Buffer(arg(bt)?),
            KernelArg::Buffer(out),
        ];
        for &e in &self.spec.extras {
            args.push(KernelArg::Buffer(arg(e)?));
        }
        match p.shape {
            Shape::Gemm(g) => {
                args.push(KernelArg::I32(i32_(g.m)?));
                args.push(KernelArg::I32(i32_(g.n)?));
                args.push(KernelArg::I32(i32_(g.k)?));
                let sa = if g.a_batched { g.m * g.k } else { 0 };
                let sb = if g.b_batched { g.k * g.n } else { 0 };
                args.push(KernelArg::I64(i64_(sa)?));
                args.push(KernelArg::I64(i64_(sb)?));
                args.push(KernelArg::I64(i64_(g.m * g.n)?));
            }
            Shape::Conv(c) => {
                let v = [
                    c.nhwc[0],
                    c.nhwc[1],
                    c.nhwc[2],
                    c.nhwc[3],
                    c.ors[0],
                    c.pq[0],
                    c.pq[1],
                    c.ors[1],
                    c.ors[2],
                    c.stride[0],
                    c.stride[1],
                    c.pad[0],
                    c.pad[1],
                    c.dilation[0],
                    c.dilation[1],
                ];
                for x in v {
                    args.push(KernelArg::I32(i32_(x)?));
                }
            }
        }
        let cfg = LaunchConfig {
            grid: l.grid,
            block: l.block,
            shared_mem_bytes: l.smem,
        };
        kernel.launch(&cfg, &args)?;
        Ok(())
    }

    /// Whether the GEMM operands A and B start on 16-byte boundaries (TMA's requirement).
    fn tma_aligned(&self, ins: &[GpuTensor]) -> bool {
        let crate::spec::Problem::Gemm { lhs, rhs, .. } = self.spec.problem else {
            return false;
        };
        [lhs, rhs].iter().all(|&i| {
            ins.get(i)
                .is_some_and(|t| t.device_ptr().is_multiple_of(16))
        })
    }

    /// Times every candidate of `p` (one warm-up, then the mean of 5 launches) and returns the
    /// fastest; the winner is kept in the profile cache on disk.
    fn profile(&self, p: &Plan, ins: &[GpuTensor], out: &GpuTensor) -> Result<Instance> {
        if let Some(i) = lock(&self.chosen).get(p) {
            return Ok(i.clone());
        }
        let key = format!("{}|{}", self.gpu.name(), p.key(&self.spec));
        let aligned = self.tma_aligned(ins);
        let cands: Vec<Instance> = p
            .candidates(&self.spec, self.arch)
            .into_iter()
            .filter(|c| c.tile.math != Math::Wgmma || aligned)
            .collect();
        let disk = read_profile_cache();
        let hit = disk
            .get(&key)
            .and_then(|name| cands.iter().find(|c| c.kernel_name() == *name));
        let best = match hit {
            Some(i) => i.clone(),
            None => {
                let mut best: Option<(f32, &Instance)> = None;
                for c in &cands {
                    self.launch(c, p, ins, out)?;
                    let ((), ms) = self.gpu.time(|| {
                        for _ in 0..5 {
                            self.launch(c, p, ins, out)
                                .map_err(|e| fusebox_cuda::Error::Device(e.to_string()))?;
                        }
                        Ok(())
                    })?;
                    if best.is_none_or(|(t, _)| ms < t) {
                        best = Some((ms, c));
                    }
                }
                let Some((_, b)) = best else {
                    return Err(Error::Args("no instance for this problem".into()));
                };
                // A read-only cache directory must not fail the run.
                let _ = update_profile_cache(&key, &b.kernel_name());
                b.clone()
            }
        };
        lock(&self.chosen).insert(p.clone(), best.clone());
        Ok(best)
    }

    /// Runs the function on device (or host) values; the result stays on the device.
    pub fn run_device(&self, vals: &[Value]) -> Result<Value> {
        let ins: Vec<GpuTensor> = vals
            .iter()
            .map(|v| GpuTensor::from_value(&self.gpu, v))
            .collect::<std::result::Result<_, _>>()?;
        let want = self.spec.elem;
        for t in &ins {
            if crate::spec::elem_of(t.dtype()) != Some(want) {
                return Err(Error::Args(format!(
                    "argument of dtype {}; `{}` takes {}",
                    t.dtype(),
                    self.name,
                    want.tag()
                )));
            }
        }
        let shapes: Vec<Vec<usize>> = ins.iter().map(|t| t.shape().to_vec()).collect();
        let p = plan(&self.spec, &shapes)?;
        let dtype = ins
            .first()
            .map(GpuTensor::dtype)
            .ok_or_else(|| Error::Args("no arguments".into()))?;
        let out = GpuTensor::empty(&self.gpu, dtype, p.out_shape.clone())?;
        if out.numel() == 0 {
            return Ok(out.into_value());
        }
        let mut inst = if self.options.profile {
            self.profile(&p, &ins, &out)?
        } else {
            self.choose(&p)?
        };
        // TMA needs 16-byte aligned operand addresses (buffers are; a view might not be):
        // otherwise the mma.sync instance the plain sm_90 heuristic picks.
        if inst.tile.math == Math::Wgmma && !self.tma_aligned(&ins) {
            inst = p
                .choose(&self.spec, self.gpu.sm_count() as usize, Arch::Sm90)
                .ok_or_else(|| Error::Args("no instance for this problem".into()))?;
        }
        self.launch(&inst, &p, &ins, &out)?;
        Ok(out.into_value())
    }
}

/// A claimed `cutlass.attention*` function on the device: the generated fused attention
/// kernel ([`FlashAttention`]) launched on Q, K, V (and the bias) as the function receives
/// them, BSNH, device values in and out.
pub struct AttentionArtifact {
    name: String,
    spec: AttentionSpec,
    attn: FlashAttention,
}

impl std::fmt::Debug for AttentionArtifact {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttentionArtifact")
            .field("name", &self.name)
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl AttentionArtifact {
    /// Compiles and loads the spec's kernel on the process's GPU (without one, the typed
    /// no-device error).
    pub fn new(name: &str, spec: AttentionSpec) -> Result<AttentionArtifact> {
        let attn = FlashAttention::new()?;
        attn.load(&spec.kernel())?;
        Ok(AttentionArtifact {
            name: name.to_string(),
            spec,
            attn,
        })
    }

    /// The spec.
    pub fn spec(&self) -> &AttentionSpec {
        &self.spec
    }

    /// Runs the function on device (or host) values; the result stays on the device.
    pub fn run_device(&self, vals: &[Value]) -> Result<Value> {
        if vals.len() != self.spec.num_params {
            return Err(Error::Args(format!(
                "`{}` takes {} arguments, found {}",
                self.name,
                self.spec.num_params,
                vals.len()
            )));
        }
        let dev = |i: usize| -> Result<GpuTensor> {
            let v = vals
                .get(i)
                .ok_or_else(|| Error::Args(format!("argument {i} is missing")))?;
            Ok(GpuTensor::from_value(self.attn.gpu(), v)?)
        };
        let [qi, ki, vi] = self.spec.qkv;
        let (q, k, v) = (dev(qi)?, dev(ki)?, dev(vi)?);
        let bias = self.spec.bias.map(dev).transpose()?;
        let out = self
            .attn
            .run(&q, &k, &v, bias.as_ref(), &self.spec.options)?;
        Ok(out.into_value())
    }
}

impl Artifact for AttentionArtifact {
    fn run(&self, args: &[Value]) -> fusebox_core::Result<Value> {
        Ok(self.run_device(args)?)
    }

    fn placement(&self) -> Placement {
        Placement::Device
    }
}

impl Artifact for CutlassArtifact {
    fn run(&self, args: &[Value]) -> fusebox_core::Result<Value> {
        Ok(self.run_device(args)?)
    }

    fn placement(&self) -> Placement {
        Placement::Device
    }
}

fn profile_cache_path() -> Option<PathBuf> {
    Cache::default_dir().map(|d| d.join("cutlass-profile.json"))
}

fn read_profile_cache() -> BTreeMap<String, String> {
    profile_cache_path()
        .map(|p| read_profile_cache_at(&p))
        .unwrap_or_default()
}

/// The profile cache at `path`; missing or unreadable is empty.
fn read_profile_cache_at(path: &std::path::Path) -> BTreeMap<String, String> {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Records `key → kernel` in the profile cache. Processes profiling at once must not lose
/// each other's entries: the read-modify-write holds an exclusive lock on
/// `cutlass-profile.json.lock` (an advisory `flock`), re-reads the cache under it, and
/// replaces the file through a fresh temporary file (`create_new`: a planted file or symlink
/// is never written through) and a rename.
fn update_profile_cache(key: &str, kernel: &str) -> Result<()> {
    match profile_cache_path() {
        Some(path) => update_profile_cache_at(&path, key, kernel),
        None => Ok(()),
    }
}

/// [`update_profile_cache`] on the cache file `path`.
fn update_profile_cache_at(path: &std::path::Path, key: &str, kernel: &str) -> Result<()> {
    let path = path.to_path_buf();
    let err = |message: String| Error::Cache {
        path: path.clone(),
        message,
    };
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(|e| err(e.to_string()))?;
    }
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path.with_extension("json.lock"))
        .map_err(|e| err(e.to_string()))?;
    lock.lock().map_err(|e| err(format!("locking: {e}")))?;
    let mut m = read_profile_cache_at(&path);
    m.insert(key.to_string(), kernel.to_string());
    let text = serde_json::to_string_pretty(&m).map_err(|e| err(e.to_string()))?;
    // Unique per process and thread; the lock makes writers take turns.
    let tmp = path.with_extension(format!(
        "json.{}.{:?}.tmp",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_file(&tmp);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    // The lock is released when `lock` is dropped.
    written.map_err(|e| err(e.to_string()))
}

#[cfg(test)]
mod profile_cache_tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    #[test]
    fn concurrent_updates_keep_every_entry() {
        let dir =
            std::env::temp_dir().join(format!("fusebox-cutlass-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("cutlass-profile.json");
        std::thread::scope(|s| {
            for t in 0..8 {
                let path = &path;
                s.spawn(move || {
                    for i in 0..10 {
                        super::update_profile_cache_at(path, &format!("k{t}_{i}"), "kernel")
                            .unwrap();
                    }
                });
            }
        });
        let m = super::read_profile_cache_at(&path);
        assert_eq!(m.len(), 80, "{m:?}");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(left.iter().all(|n| !n.ends_with(".tmp")), "{left:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
