//! The `fusebox` facade: re-exports fusebox-core, links every built-in backend crate so that
//! their `inventory` registrations are kept by the linker, loads plugins, and runs a
//! partitioned module with each function's compiled artifact.
//!
//! Contract: [`link_backends`] references every backend crate (today: `fusebox-cpu`,
//! `fusebox-cublas`, `fusebox-cuda`, `fusebox-cutlass`);
//! [`pipeline`] builds the config's [`BackendPipeline`] with the plugin loader of
//! `fusebox-plugin-host` and the CPU reference's [`const_evaluator`] for constant folding;
//! [`execute`] runs a function of a [`Plan`]'s module, calling the
//! compiled artifact for every unit of work and the CPU reference for the ops left in `main`;
//! [`write_build`] writes what [`BackendPipeline::build`] built ahead of time (`fusebox
//! compile`): every function's files and `manifest.json`, staged in a fresh directory
//! ([`staging`]) and moved into place only when all are written, the manifest last, so a
//! failure never leaves a half-written manifest (nor a stale one: the old manifest is removed
//! first). What the command line does with a user's files is here too, so the Python package
//! does the same: [`load`] (models, configs, pattern tables, the error text), [`partition`]
//! (`fusebox partition` and `fusebox backends`) and [`runner`] (`fusebox run`).
//!
//! ```no_run
//! let config = fusebox::core::config::Config::load("configs/cpu.toml".as_ref())?;
//! let pipeline = fusebox::pipeline(config)?;
//! let module = fusebox::core::text::read_module("examples/conv2d_relu.relax".as_ref())?;
//! let plan = pipeline.run(&module)?;
//! println!("{}", plan.report().to_json());
//! # Ok::<(), fusebox::Error>(())
//! ```

pub mod compare;
pub mod load;
pub mod partition;
pub mod runner;
pub mod staging;

pub use load::{
    DEFAULT_CONFIG, bind_dims, default_config, error_message, load_config, load_model, parse_bind,
    read_pattern_table,
};

pub use fusebox_core as core;
pub use fusebox_cpu as cpu;
pub use fusebox_cublas as cublas;
pub use fusebox_cuda as cuda;
pub use fusebox_cutlass as cutlass;

use fusebox_core::backend::pipeline::{BackendPipeline, BuildPlan, Manifest, Plan};
use fusebox_core::config::Config;
use fusebox_core::runtime::Value;

/// Every error of the facade.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// From fusebox-core (parsing, configs, passes, backends).
    #[error(transparent)]
    Core(#[from] fusebox_core::Error),
    /// From the CPU reference executor.
    #[error(transparent)]
    Cpu(#[from] fusebox_cpu::Error),
}

/// The result type of the facade.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// References every built-in backend crate so the linker keeps their registrations.
pub fn link_backends() {
    fusebox_cpu::link();
    fusebox_cublas::link();
    fusebox_cuda::link();
    fusebox_cutlass::link();
}

/// The names of the built-in backends this build must register (checked by a test).
pub const BUILT_IN_BACKENDS: &[&str] = &["cpu", "cublas", "cuda", "cutlass"];

/// For `target = "cuda"`: probes the device (never panics). Without one, `strict = true` makes
/// it the typed "no CUDA device" error; with `strict = false` the answer is the line to print
/// (the CUDA backends then fail to compile and the CPU reference runs everything).
pub fn check_target(config: &Config) -> Result<Option<String>, fusebox_core::Error> {
    if config.target != fusebox_core::config::Target::Cuda {
        return Ok(None);
    }
    match fusebox_cuda::Gpu::get() {
        Ok(_) => Ok(None),
        Err(e) if config.partition.strict => Err(fusebox_core::Error::Backend {
            backend: "cuda".into(),
            message: format!("{e} ({}: target = \"cuda\", strict = true)", config.file),
        }),
        Err(e) => Ok(Some(format!(
            "warning: {e}; {}: target = \"cuda\" with strict = false: falling back to the CPU reference",
            config.file
        ))),
    }
}

/// Builds the backend pipeline of `config`, loading its plugins, with the CPU reference's
/// [`const_evaluator`] for constant folding.
pub fn pipeline(config: Config) -> Result<BackendPipeline> {
    link_backends();
    let loader = |p: &std::path::Path| fusebox_plugin_host::load(p);
    Ok(BackendPipeline::new(config, Some(&loader))?.with_evaluator(const_evaluator()))
}

/// FoldConstant's evaluator: the CPU reference backend's `eval_op`, so a folded constant is
/// bit for bit what the CPU reference computes at run time.
pub fn const_evaluator() -> fusebox_core::transform::Evaluator {
    std::sync::Arc::new(|op, args| {
        fusebox_cpu::eval_op(op, args).map_err(|e| fusebox_core::Error::Runtime(e.to_string()))
    })
}

/// Runs `func` of the plan's module on `args`: calls of compiled functions go to their
/// artifacts, everything else to the CPU reference. Data moves only where the placement
/// changes: a host artifact ([`fusebox_core::runtime::Placement::Host`]) and the CPU ops get device values
/// downloaded, a device artifact gets values as they are. The result may hold device
/// values; [`Value::to_host`] downloads them (as `fusebox run` does for its outputs).
pub fn execute(plan: &Plan, func: &str, args: Vec<Value>) -> Result<Value> {
    execute_with(&fusebox_cpu::Executor::new(), plan, func, args)
}

/// [`execute`] on a kept CPU [`fusebox_cpu::Executor`], so constants are decoded once across
/// repeated runs. Functions whose artifact is the reference interpreter's own evaluation (the
/// `cpu` backend's, [`fusebox_core::backend::Artifact::is_reference`]) run inline, so the
/// executor's fused chains span their calls as they do without a config; the result is the
/// same bit for bit.
pub fn execute_with(
    ex: &fusebox_cpu::Executor,
    plan: &Plan,
    func: &str,
    args: Vec<Value>,
) -> Result<Value> {
    Ok(execute_inner(ex, plan, func, args, false)?.0)
}

/// [`execute_with`], also returning the time spent in each function and fused op chain
/// (as [`fusebox_cpu::run_profiled`]; artifacts count as one call of their function).
pub fn execute_profiled(
    ex: &fusebox_cpu::Executor,
    plan: &Plan,
    func: &str,
    args: Vec<Value>,
) -> Result<(Value, Vec<fusebox_cpu::CallProfile>)> {
    execute_inner(ex, plan, func, args, true)
}

fn execute_inner(
    ex: &fusebox_cpu::Executor,
    plan: &Plan,
    func: &str,
    args: Vec<Value>,
    profile: bool,
) -> Result<(Value, Vec<fusebox_cpu::CallProfile>)> {
    let m = &plan.module;
    if plan.artifacts.keys().all(|f| !plan.takes(f)) {
        return Ok(if profile {
            ex.run_profiled(m, func, args, None)?
        } else {
            (ex.run(m, func, args, None)?, Vec::new())
        });
    }
    let takes = |name: &str| plan.takes(name);
    let hook = |name: &str, vals: &[Value]| {
        if plan.takes(name) {
            plan.call(name, vals)
        } else {
            None
        }
    };
    Ok(if profile {
        ex.run_partitioned_profiled(m, func, args, &hook, &takes)?
    } else {
        (
            ex.run_partitioned(m, func, args, &hook, &takes)?,
            Vec::new(),
        )
    })
}

/// Whether a backend-given file name is a plain name that stays inside the output directory.
fn plain_file_name(n: &str) -> bool {
    !n.is_empty()
        && n != "."
        && n != ".."
        && n != "manifest.json"
        && !n.starts_with('.')
        && !n.contains(['/', '\\', '\0'])
}

/// Writes a [`BuildPlan`] to `dir` (created if needed): every function's files, then
/// `manifest.json` (see the crate doc). A backend's file name that is not a plain name, or that
/// two functions share, is an error before anything is written.
pub fn write_build(plan: &BuildPlan, dir: &std::path::Path) -> Result<Manifest> {
    let manifest = plan.manifest();
    let mut seen = std::collections::BTreeMap::new();
    for f in &plan.functions {
        let backend = f.claim.backend.clone().unwrap_or_else(|| "cpu".into());
        for (name, _) in f.output.iter().flat_map(|o| &o.files) {
            let bad = |message: String| {
                Error::Core(fusebox_core::Error::Backend {
                    backend: backend.clone(),
                    message,
                })
            };
            if !plain_file_name(name) {
                return Err(bad(format!(
                    "`{}` built a file named {name:?}; a file name must be a plain name \
                     (no directories, not hidden, not manifest.json)",
                    f.claim.function
                )));
            }
            if let Some(prev) = seen.insert(name.clone(), f.claim.function.clone()) {
                return Err(bad(format!(
                    "`{}` and `{prev}` both built a file named {name:?}",
                    f.claim.function
                )));
            }
        }
    }
    // Everything is staged first: a failed write leaves the directory as it was.
    let mut staging = staging::Staging::new(dir)?;
    for f in &plan.functions {
        for (name, bytes) in f.output.iter().flat_map(|o| &o.files) {
            staging.write(name, bytes)?;
        }
    }
    staging.write("manifest.json", manifest.to_json().as_bytes())?;
    // The old manifest goes first and the new one comes last (it was staged last), so a
    // manifest in the directory always describes the files beside it.
    let manifest_path = dir.join("manifest.json");
    match std::fs::remove_file(&manifest_path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(Error::Core(fusebox_core::Error::Io {
                path: manifest_path,
                source: e,
            }));
        }
        _ => {}
    }
    staging.commit()?;
    Ok(manifest)
}

/// A `.npy` file as a tensor: C order, the dtypes fusebox stores (`f2`/`f4`/`f8`, `i1`/`u1`/
/// `i4`/`i8`, `b1`); anything else is an error naming the file.
pub fn read_npy(path: &std::path::Path) -> Result<fusebox_cpu::Tensor, fusebox_core::Error> {
    use fusebox_core::Error;
    use fusebox_cpu::{Storage, Tensor};
    let bad = |m: String| Error::Invalid(format!("{}: {m}", path.display()));
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let npy = npyz::NpyFile::new(bytes.as_slice()).map_err(|e| bad(e.to_string()))?;
    if npy.order() != npyz::Order::C {
        return Err(bad("Fortran-order arrays are not supported".into()));
    }
    let descr = npy.dtype().descr();
    let e = |e: std::io::Error| bad(e.to_string());
    // npyz gives the numpy repr of the descriptor, quotes included (`'<f4'`).
    let code = descr
        .trim_matches(['\'', '"'])
        .trim_start_matches(['<', '|', '=']);
    let dtype = match code {
        "f4" => fusebox_core::ir::DType::F32,
        "f8" => fusebox_core::ir::DType::F64,
        "f2" => fusebox_core::ir::DType::F16,
        "i1" => fusebox_core::ir::DType::I8,
        "u1" => fusebox_core::ir::DType::U8,
        "i4" => fusebox_core::ir::DType::I32,
        "i8" => fusebox_core::ir::DType::I64,
        "b1" => fusebox_core::ir::DType::Bool,
        other => return Err(bad(format!("unsupported .npy dtype `{other}`"))),
    };
    // The header's shape is checked against the file's length and the memory limit before
    // anything is allocated (a 20-byte header may claim 2^40 elements).
    let dims = npy.shape().to_vec();
    let need = fusebox_core::runtime::memory::tensor_bytes(dtype, &dims);
    if need.is_none_or(|n| n > bytes.len() as u64) {
        return Err(bad(format!(
            "the header's shape {dims:?} ({dtype}) needs {} bytes of data, the file has {}",
            need.map_or_else(|| "more than 2^64".to_string(), |n| n.to_string()),
            bytes.len()
        )));
    }
    let what = format!("input {}", path.display());
    fusebox_core::runtime::memory::check_alloc_u64(&what, dtype, &dims)?;
    let shape: Vec<usize> = dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| bad(format!("dim {d} is too large"))))
        .collect::<Result<_, _>>()?;
    let storage = match code {
        "f4" => Storage::F32(npy.into_vec().map_err(e)?),
        "f8" => Storage::F64(npy.into_vec().map_err(e)?),
        "f2" => Storage::F16(npy.into_vec().map_err(e)?),
        "i1" => Storage::I8(npy.into_vec().map_err(e)?),
        "u1" => Storage::U8(npy.into_vec().map_err(e)?),
        "i4" => Storage::I32(npy.into_vec().map_err(e)?),
        "i8" => Storage::I64(npy.into_vec().map_err(e)?),
        "b1" => Storage::Bool(npy.into_vec().map_err(e)?),
        other => return Err(bad(format!("unsupported .npy dtype `{other}`"))),
    };
    Tensor::new(shape, storage)
}

#[cfg(test)]
mod tests {
    #[test]
    fn registry_holds_exactly_the_built_in_backends() {
        super::link_backends();
        let names = fusebox_core::backend::registered_names().unwrap_or_default();
        assert_eq!(names, super::BUILT_IN_BACKENDS);
    }
}
