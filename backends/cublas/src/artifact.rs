//! The GPU side: a process-wide cuBLASLt runtime on fusebox-cuda's [`Gpu`], and the compiled
//! artifact that runs one claimed function.
//!
//! Contract:
//!
//! - [`Runtime::get`] needs a device ([`Gpu::get`]: [`Error::NoDevice`] otherwise, checked
//!   first, so a machine without a GPU never touches cuBLASLt) and the library
//!   ([`Error::NoLibrary`]); it then makes one cuBLASLt handle and one 32 MiB workspace for the
//!   process. All work goes on the [`Gpu`]'s one stream, so calls that share the workspace
//!   are ordered.
//! - Descriptors, layouts and the heuristic's candidates are made once per (plan, alignments)
//!   and cached. The algorithm used is the heuristic's first, or with `autotune = true` the
//!   fastest candidate measured once with events (1 warm-up + 5 timed calls each, on the call's
//!   own buffers) and stored in the [`TuneCache`]; a stored choice is revalidated with
//!   `cublasLtMatmulAlgoCheck` before use. When the heuristic offers nothing for a plain GEMM
//!   (no epilogue), `cublasGemmStridedBatchedEx` runs it instead; otherwise the call fails
//!   with [`Error::NoAlgorithm`].
//! - [`CublasArtifact::run`] takes host or device values (host tensors are uploaded, constants
//!   once), checks arity, dtypes and shapes, plans the call, and returns the result on the
//!   device ([`Value::Device`]); its placement is [`Placement::Device`]. Scales of the
//!   `multiply` variant are read to the host (two scalars) and become alpha.
//!
//! ```text
//! run(x: host f16 [16, 32], w: device f16 [64, 32], b: host f16 [64])
//!   -> upload x, b; plan m=64 n=16 k=32 TN, GELU_BIAS; cublasLtMatmul on the stream
//!   -> Value::Device(f16 [16, 64])
//! ```

use crate::error::{Error, Result};
use crate::lt::{Algo, Alpha, BlasHandle, LtHandle, Prepared, library};
use crate::options::Options;
use crate::plan::{Alignments, Epilogue, LtPlan, PlanRequest, WORKSPACE_BYTES, build_plan};
use crate::spec::{MatmulSpec, Operand};
use crate::tune::{TuneCache, TuneEntry};
use fusebox_core::backend::Artifact;
use fusebox_core::ir::DType;
use fusebox_core::runtime::{Placement, Value};
use fusebox_cuda::{Gpu, GpuTensor};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The algorithm chosen for one prepared plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Choice {
    /// A cuBLASLt algorithm.
    Lt(Algo),
    /// No cuBLASLt algorithm: plain cuBLAS GEMM.
    Blas,
}

struct Entry {
    prepared: Prepared,
    choice: Choice,
}

type Key = (LtPlan, Alignments);

/// The process's cuBLASLt runtime (see the module doc).
pub struct Runtime {
    gpu: Arc<Gpu>,
    handle: LtHandle,
    workspace: GpuTensor,
    blas: OnceLock<std::result::Result<BlasHandle, String>>,
    cache: Mutex<HashMap<Key, Arc<Mutex<Entry>>>>,
    /// Serialises library calls (handle use, descriptor updates) across threads.
    lock: Mutex<()>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("gpu", &self.gpu.describe())
            .finish_non_exhaustive()
    }
}

fn poisoned<T>(_: T) -> Error {
    Error::Args("a cuBLASLt lock was poisoned by a panic in another thread".into())
}

impl Runtime {
    /// The process's runtime: the device, then the library, then a handle and the workspace.
    pub fn get() -> Result<Arc<Runtime>> {
        static RT: Mutex<Option<Arc<Runtime>>> = Mutex::new(None);
        let gpu = Gpu::get()?;
        library()?;
        let mut slot = RT.lock().map_err(poisoned)?;
        if let Some(rt) = slot.as_ref() {
            return Ok(Arc::clone(rt));
        }
        bind(&gpu)?;
        let handle = LtHandle::new()?;
        let workspace = GpuTensor::empty(&gpu, DType::U8, vec![WORKSPACE_BYTES])?;
        let rt = Arc::new(Runtime {
            gpu,
            handle,
            workspace,
            blas: OnceLock::new(),
            cache: Mutex::new(HashMap::new()),
            lock: Mutex::new(()),
        });
        *slot = Some(Arc::clone(&rt));
        Ok(rt)
    }

    /// The GPU.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// cuBLASLt's version (`cublasLtGetVersion`).
    pub fn version(&self) -> usize {
        library().map(|l| l.version).unwrap_or(0)
    }

    fn blas(&self) -> Result<&BlasHandle> {
        self.blas
            .get_or_init(|| BlasHandle::new(self.gpu.stream()).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|reason| Error::NoLibrary {
                reason: reason.clone(),
            })
    }

    /// Whether cuBLASLt (or, for a plain GEMM, cuBLAS) has an algorithm for `plan` with
    /// 256-byte-aligned operands: asked at compile time for static shapes, so a plan no
    /// kernel runs fails the compile (and the pipeline tries the next backend) instead of the
    /// run. The bias pointer shown to the heuristic is the workspace's (real, 256-aligned).
    pub fn probe(&self, plan: &LtPlan) -> Result<()> {
        if plan.launches.is_empty() {
            return Ok(());
        }
        bind(&self.gpu)?;
        let _guard = self.lock.lock().map_err(poisoned)?;
        let align = Alignments {
            a: 256,
            b: 256,
            d: 256,
            bias: 256,
        };
        let bias = plan
            .epilogue
            .has_bias()
            .then(|| self.workspace.device_ptr());
        let p = Prepared::new(&self.handle, plan, &align, bias, 1)?;
        if !p.algos.is_empty() {
            return Ok(());
        }
        if plan.epilogue == Epilogue::Default && !plan.scaled && self.blas().is_ok() {
            return Ok(());
        }
        Err(Error::NoAlgorithm(plan.describe()))
    }

    /// Forgets every prepared plan and chosen algorithm (the next call of each plan prepares
    /// again, reading the autotune cache from disk): for tests and benchmarks.
    pub fn clear_cache(&self) -> Result<()> {
        self.cache.lock().map_err(poisoned)?.clear();
        Ok(())
    }

    /// The algorithm chosen for `plan` under `align`, once a call has prepared it: `Some(None)`
    /// when the plain cuBLAS fallback runs it.
    pub fn chosen(&self, plan: &LtPlan, align: &Alignments) -> Result<Option<Option<Algo>>> {
        let cache = self.cache.lock().map_err(poisoned)?;
        let Some(e) = cache.get(&(plan.clone(), *align)) else {
            return Ok(None);
        };
        let e = e.lock().map_err(poisoned)?;
        Ok(Some(match e.choice {
            Choice::Lt(a) => Some(a),
            Choice::Blas => None,
        }))
    }

    /// The autotune cache key of a plan under some alignments on this device.
    pub fn tune_key(&self, plan: &LtPlan, align: &Alignments) -> String {
        let (ma, mi) = self.gpu.compute_capability();
        format!(
            "fusebox-cublaslt-tune 1|cublasLt {}|{}|sm {ma}.{mi}|{plan:?}|{align:?}",
            self.version(),
            self.gpu.name()
        )
    }

    /// Runs one planned matmul: `d = epilogue(alpha · rhs · lhs)` in cuBLASLt's terms (see
    /// [`crate::plan`]), choosing (and with `options.autotune`, timing) the algorithm on the
    /// first call of each plan and alignment.
    #[allow(clippy::too_many_arguments, reason = "one argument per operand")]
    pub fn matmul(
        &self,
        plan: &LtPlan,
        options: &Options,
        alpha: Alpha,
        rhs: &GpuTensor,
        lhs: &GpuTensor,
        out: &GpuTensor,
        bias: Option<&GpuTensor>,
    ) -> Result<()> {
        if plan.launches.is_empty() {
            return Ok(());
        }
        bind(&self.gpu)?;
        let align = Alignments::of(
            plan,
            rhs.device_ptr(),
            lhs.device_ptr(),
            out.device_ptr(),
            bias.map(GpuTensor::device_ptr),
        );
        let key = (plan.clone(), align);
        let _guard = self.lock.lock().map_err(poisoned)?;
        let entry = {
            let mut cache = self.cache.lock().map_err(poisoned)?;
            match cache.get(&key) {
                Some(e) => Arc::clone(e),
                None => {
                    let e = Arc::new(Mutex::new(
                        self.prepare(plan, &align, options, alpha, rhs, lhs, out, bias)?,
                    ));
                    cache.insert(key, Arc::clone(&e));
                    e
                }
            }
        };
        let mut entry = entry.lock().map_err(poisoned)?;
        let Entry { prepared, choice } = &mut *entry;
        match *choice {
            Choice::Lt(algo) => prepared.matmul(
                &self.handle,
                plan,
                &algo,
                alpha,
                rhs,
                lhs,
                out,
                bias,
                &self.workspace,
                self.gpu.stream(),
            ),
            Choice::Blas => self.blas()?.gemm(plan, alpha, rhs, lhs, out),
        }
    }

    /// Makes the descriptors of a plan and chooses its algorithm.
    #[allow(clippy::too_many_arguments, reason = "one argument per operand")]
    fn prepare(
        &self,
        plan: &LtPlan,
        align: &Alignments,
        options: &Options,
        alpha: Alpha,
        rhs: &GpuTensor,
        lhs: &GpuTensor,
        out: &GpuTensor,
        bias: Option<&GpuTensor>,
    ) -> Result<Entry> {
        let mut prepared = Prepared::new(
            &self.handle,
            plan,
            align,
            bias.map(GpuTensor::device_ptr),
            options.candidates,
        )?;
        if prepared.algos.is_empty() {
            if plan.epilogue == Epilogue::Default && !plan.scaled {
                // Probe the fallback now so a missing libcublas is reported at once.
                self.blas()?;
                return Ok(Entry {
                    prepared,
                    choice: Choice::Blas,
                });
            }
            return Err(Error::NoAlgorithm(plan.describe()));
        }
        let first = prepared.algos[0];
        if !options.autotune || prepared.algos.len() == 1 {
            return Ok(Entry {
                prepared,
                choice: Choice::Lt(first),
            });
        }
        let key = self.tune_key(plan, align);
        let cache = TuneCache::from_env();
        if let Some(hit) = cache.as_ref().and_then(|c| c.get(&key)) {
            let algo = Algo {
                data: hit.algo,
                workspace: hit.workspace,
            };
            if prepared
                .check(&self.handle, &algo)
                .is_some_and(|ws| ws <= self.workspace.byte_len())
            {
                return Ok(Entry {
                    prepared,
                    choice: Choice::Lt(algo),
                });
            }
        }
        let mut best: Option<(Algo, f32)> = None;
        let algos = prepared.algos.clone();
        for algo in algos {
            let run = |p: &mut Prepared| {
                p.matmul(
                    &self.handle,
                    plan,
                    &algo,
                    alpha,
                    rhs,
                    lhs,
                    out,
                    bias,
                    &self.workspace,
                    self.gpu.stream(),
                )
            };
            // A candidate that fails to launch is skipped, not fatal.
            if run(&mut prepared).is_err() {
                continue;
            }
            const REPS: u32 = 5;
            let mut timed = || -> Result<f32> {
                let (start, end) = (self.gpu.event()?, self.gpu.event()?);
                start.record()?;
                for _ in 0..REPS {
                    run(&mut prepared)?;
                }
                end.record()?;
                Ok(start.elapsed_ms(&end)?)
            };
            let Ok(ms) = timed() else { continue };
            let per_call = ms / REPS as f32;
            if best.is_none_or(|(_, b)| per_call < b) {
                best = Some((algo, per_call));
            }
        }
        let (algo, ms) = best.unwrap_or((first, f32::NAN));
        if let Some(c) = cache
            && ms.is_finite()
        {
            c.put(&TuneEntry {
                key,
                algo: algo.data,
                workspace: algo.workspace,
                ms,
            });
        }
        Ok(Entry {
            prepared,
            choice: Choice::Lt(algo),
        })
    }
}

/// Makes the GPU's context current on this thread (cuBLAS uses the calling thread's context).
fn bind(gpu: &Gpu) -> Result<()> {
    gpu.context().bind_to_thread().map_err(|e| {
        Error::Cuda(fusebox_cuda::Error::Driver(format!(
            "cuCtxSetCurrent: {e:?}"
        )))
    })
}

/// A compiled cuBLAS function (see the module doc).
pub struct CublasArtifact {
    name: String,
    spec: MatmulSpec,
    static_plan: Option<LtPlan>,
    options: Options,
    runtime: Arc<Runtime>,
    /// Constants of the composite, uploaded on first use (keyed by operand slot).
    consts: Mutex<HashMap<&'static str, GpuTensor>>,
}

impl std::fmt::Debug for CublasArtifact {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CublasArtifact")
            .field("name", &self.name)
            .field("spec", &self.spec.to_string())
            .finish_non_exhaustive()
    }
}

impl CublasArtifact {
    /// The artifact of an analysed function: needs the device and cuBLASLt
    /// ([`Runtime::get`]), so it fails with [`Error::NoDevice`] on a machine without a GPU.
    pub fn new(
        name: &str,
        spec: MatmulSpec,
        static_plan: Option<LtPlan>,
        options: Options,
    ) -> Result<Self> {
        let runtime = Runtime::get()?;
        if let Some(plan) = &static_plan {
            runtime.probe(plan)?;
        }
        Ok(CublasArtifact {
            name: name.to_string(),
            spec,
            static_plan,
            options,
            runtime,
            consts: Mutex::new(HashMap::new()),
        })
    }

    /// What it computes.
    pub fn spec(&self) -> &MatmulSpec {
        &self.spec
    }

    /// The plan built at compile time (all shapes static), if any.
    pub fn static_plan(&self) -> Option<&LtPlan> {
        self.static_plan.as_ref()
    }

    /// The runtime it runs on.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    fn operand(&self, slot: &'static str, o: &Operand, args: &[Value]) -> Result<GpuTensor> {
        let gpu = self.runtime.gpu();
        match o {
            Operand::Param(i) => {
                let v = args
                    .get(*i)
                    .ok_or_else(|| Error::Args(format!("`{}` has no argument {i}", self.name)))?;
                Ok(GpuTensor::from_value(gpu, v)?)
            }
            Operand::Const(t) => {
                let mut consts = self.consts.lock().map_err(poisoned)?;
                if let Some(g) = consts.get(slot) {
                    return Ok(g.clone());
                }
                let g = GpuTensor::upload(gpu, t)?;
                consts.insert(slot, g.clone());
                Ok(g)
            }
        }
    }

    /// Runs the function (see the module doc) with this crate's error type.
    pub fn run_device(&self, args: &[Value]) -> Result<GpuTensor> {
        if args.len() != self.spec.num_params {
            return Err(Error::Args(format!(
                "`{}` takes {} argument(s), got {}",
                self.name,
                self.spec.num_params,
                args.len()
            )));
        }
        bind(self.runtime.gpu())?;
        let spec = &self.spec;
        let lhs = self.operand("lhs", &spec.lhs, args)?;
        let rhs = self.operand("rhs", &spec.rhs, args)?;
        let bias = match &spec.bias {
            Some(b) => Some(self.operand("bias", b, args)?),
            None => None,
        };
        for (what, t, want) in [("lhs", &lhs, spec.in_dtype), ("rhs", &rhs, spec.in_dtype)] {
            if t.dtype() != want {
                return Err(Error::Args(format!(
                    "`{}`: the {what} is {}, expected {want}",
                    self.name,
                    t.dtype()
                )));
            }
        }
        if let Some(b) = &bias
            && b.dtype() != spec.out_dtype
        {
            return Err(Error::Args(format!(
                "`{}`: the bias is {}, expected {}",
                self.name,
                b.dtype(),
                spec.out_dtype
            )));
        }
        let req = PlanRequest {
            lhs: lhs.shape().to_vec(),
            rhs: rhs.shape().to_vec(),
            rhs_transposed: spec.rhs_transposed,
            bias: bias.as_ref().map(|b| b.shape().to_vec()),
            in_dtype: spec.in_dtype,
            out_dtype: spec.out_dtype,
            activation: spec.activation,
            scaled: spec.scale.is_some(),
            allow_tf32: self.options.allow_tf32,
        };
        // Planning is a few integer operations: done per call, for whatever shapes come.
        let plan = build_plan(&req)?;
        let alpha = match &spec.scale {
            None => Alpha::one(&plan),
            Some((sa, sb)) => {
                let a = self.scalar("scaleA", sa, args)?;
                let b = self.scalar("scaleB", sb, args)?;
                Alpha::F32(a * b)
            }
        };
        let out = GpuTensor::empty(self.runtime.gpu(), spec.out_dtype, plan.out_shape.clone())?;
        self.runtime
            .matmul(&plan, &self.options, alpha, &rhs, &lhs, &out, bias.as_ref())?;
        Ok(out)
    }

    /// The single value of a `(1,)`-shaped scale, on the host.
    fn scalar(&self, slot: &'static str, o: &Operand, args: &[Value]) -> Result<f32> {
        let host = match o {
            Operand::Const(t) => t.clone(),
            Operand::Param(i) => {
                let v = args
                    .get(*i)
                    .ok_or_else(|| Error::Args(format!("`{}` has no argument {i}", self.name)))?;
                v.clone()
                    .to_host()?
                    .as_tensor(slot)
                    .cloned()
                    .map_err(Error::Core)?
            }
        };
        match host.to_f32_vec().as_slice() {
            [x] => Ok(*x),
            other => Err(Error::Args(format!(
                "`{}`: {slot} has {} values, expected 1",
                self.name,
                other.len()
            ))),
        }
    }
}

impl Artifact for CublasArtifact {
    fn run(&self, args: &[Value]) -> fusebox_core::Result<Value> {
        Ok(self.run_device(args)?.into_value())
    }

    fn placement(&self) -> Placement {
        Placement::Device
    }
}
