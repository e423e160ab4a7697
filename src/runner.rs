//! Running a model as `fusebox run` does, for the CLI and the Python package alike: the
//! arguments of `main`, the partition, the run on the CPU reference executor (and the
//! backends' artifacts), and `--check` against the unpartitioned module.
//!
//! Contract:
//!
//! - [`prepare_runtime`]: validates `FUSEBOX_THREADS` and sets the memory limit: the one
//!   given, else the config's `[runtime] memory_limit`, else the default of
//!   [`fusebox_core::runtime::memory`].
//! - [`prepare`]: with a config's pipeline ([`RunMode::Config`]), the pipeline partitions,
//!   claims and compiles (its `strict` applies to compile failures); without one
//!   ([`RunMode::Patterns`]), inference simplification (with the CPU reference's constant
//!   evaluator) → ConvertLayout where the CPU backend's layout pays (as a config's
//!   `conv2d_layout = "auto"`) → FuseOpsByPattern with the given table, else the CPU backend's
//!   transformer patterns → FuseOps (level 2, depth 256).
//! - [`Prepared::execute`] runs `main` on one [`fusebox_cpu::Executor`] (constants decoded
//!   once across runs), each claimed function by its artifact and the rest by the CPU
//!   reference; the result is on the host.
//! - [`input_key`] and [`main_args`]: the arguments of `main`. An input is named by its
//!   parameter's name, or by the ONNX input's name before sanitizing; a name `main` has no
//!   parameter of is an error listing the parameters. With a seed, parameters not given get
//!   uniform random values in [-1, 1] (integers 0 or 1, symbolic dims not fixed by a given
//!   input 1, prim values: a bool 0 or 1, an int 1); without one, every parameter must be given
//!   and the missing ones are named in one error.
//! - [`compare_outputs`]: `--check`'s comparison (per-dtype tolerance of
//!   [`crate::compare::first_mismatch`]), naming the first output that differs.
//! - [`output_stems`]: the outputs' names as files: each output's name
//!   ([`fusebox_core::frontend::onnx::output_names`]) sanitized, a repeated one suffixed `_1`,
//!   `_2`, ..., `output_<i>` where the module gives none.
//!
//! ```text
//! prepare(small_cnn, Config(cpu.toml))  -> 6 functions, each claimed by `cpu`
//! main_args(small_cnn, {data}, None)    -> error: input(s) w0, b0, ... of `main` not given
//! ```

use fusebox_core::Error;
use fusebox_core::backend::pipeline::{BackendPipeline, Plan};
use fusebox_core::config::Config;
use fusebox_core::frontend::onnx::sanitize;
use fusebox_core::ir::generate::Rng;
use fusebox_core::ir::{DType, Module, Sym};
use fusebox_core::report::ClaimReport;
use fusebox_core::transform::FusionPattern;
use fusebox_cpu::{CallProfile, Executor, Storage, Tensor, Value};
use std::collections::BTreeMap;

/// A CPU reference error as a core error (what `fusebox run` reports).
pub fn runtime_error(e: fusebox_cpu::Error) -> Error {
    Error::Runtime(e.to_string())
}

/// Validates `FUSEBOX_THREADS` and sets the memory limit of the runs to come (see the module
/// doc).
pub fn prepare_runtime(memory_limit: Option<u64>, config: Option<&Config>) -> Result<(), Error> {
    fusebox_cpu::par::env_threads().map_err(Error::Invalid)?;
    let from_config = config.and_then(|c| c.runtime.memory_limit);
    fusebox_core::runtime::set_memory_limit(memory_limit.or(from_config));
    Ok(())
}

/// How [`prepare`] partitions.
pub enum RunMode<'a> {
    /// A config's backend pipeline.
    Config(&'a BackendPipeline),
    /// A pattern table (`None`: the CPU backend's transformer patterns), then FuseOps.
    Patterns(Option<Vec<FusionPattern>>),
}

/// A partitioned module ready to run.
pub enum Prepared {
    /// Partitioned, claimed and compiled by a config's pipeline.
    Plan(Plan),
    /// Partitioned with a pattern table and FuseOps; the CPU reference runs all of it (shared:
    /// the executor pins it, see [`fusebox_cpu::Executor::run_shared`]).
    Module(std::sync::Arc<Module>),
}

/// Partitions `module` for running (see the module doc).
pub fn prepare(module: &Module, mode: RunMode<'_>) -> Result<Prepared, Error> {
    use fusebox_core::transform::{PartitionOptions, fuse_ops_by_pattern, sort_by_priority};
    match mode {
        RunMode::Config(pipeline) => Ok(Prepared::Plan(pipeline.run(module)?)),
        RunMode::Patterns(table) => {
            // Inference simplification (constants folded, batch_norm folded into its conv,
            // identities and exporter noise removed), then the partition.
            let eval = crate::const_evaluator();
            let mut part =
                fusebox_core::transform::simplify_for_inference(module, Some(eval.clone()))?;
            // The layouts the CPU backend chooses where they pay (`conv2d_layout = "auto"`, as
            // a config's pipeline does).
            let cpu = fusebox_cpu::backend::CpuBackend;
            if let (Some(converted), _) = fusebox_core::backend::pipeline::auto_conv2d_layout(
                &part,
                &[&cpu],
                fusebox_core::config::Target::Cpu,
                Some(&eval),
            )? {
                part = converted;
            }
            // The pattern table: the one given, else the CPU backend's own (transformer
            // attention, norms, GELU), whose composites the executor runs with its fused
            // kernels.
            let mut table =
                table.unwrap_or_else(|| fusebox_cpu::backend::transformer_patterns().to_vec());
            sort_by_priority(&mut table);
            part = fuse_ops_by_pattern(&part, &table, PartitionOptions::default())?.module;
            part = fusebox_core::transform::fuse_ops(&part, 2, 256)?;
            Ok(Prepared::Module(std::sync::Arc::new(part)))
        }
    }
}

impl Prepared {
    /// The partitioned module.
    pub fn module(&self) -> &Module {
        match self {
            Prepared::Plan(p) => &p.module,
            Prepared::Module(m) => m,
        }
    }

    /// The backends' claims (empty without a config).
    pub fn claims(&self) -> &[ClaimReport] {
        match self {
            Prepared::Plan(p) => &p.claims,
            Prepared::Module(_) => &[],
        }
    }

    /// Runs `main` on `args` with `ex`; with `profile`, also the time of each function and
    /// fused op chain. The result is on the host (a device result is downloaded). The error
    /// keeps its structure (an artifact's error inside the executor's); [`into_core`] makes it
    /// what `fusebox run` reports.
    pub fn execute(
        &self,
        ex: &Executor,
        args: Vec<Value>,
        profile: bool,
    ) -> Result<(Value, Vec<CallProfile>), crate::Error> {
        match self {
            Prepared::Plan(plan) => {
                let (v, p) = if profile {
                    crate::execute_profiled(ex, plan, "main", args)?
                } else {
                    (crate::execute_with(ex, plan, "main", args)?, Vec::new())
                };
                Ok((v.to_host()?, p))
            }
            Prepared::Module(part) => Ok(if profile {
                ex.run_shared_profiled(part, "main", args, None)?
            } else {
                (ex.run_shared(part, "main", args, None)?, Vec::new())
            }),
        }
    }
}

/// A facade error as `fusebox run` reports it: the CPU reference's errors (an artifact's
/// error inside them included) as [`Error::Runtime`].
pub fn into_core(e: crate::Error) -> Error {
    match e {
        crate::Error::Core(e) => e,
        crate::Error::Cpu(e) => runtime_error(e),
    }
}

/// Whether `e` is a plugin's error ([`Error::Plugin`]), directly or inside the executor's.
pub fn from_plugin(e: &crate::Error) -> bool {
    fn cpu(e: &fusebox_cpu::Error) -> bool {
        match e {
            fusebox_cpu::Error::At { source, .. } => cpu(source),
            fusebox_cpu::Error::Core(Error::Plugin { .. }) => true,
            _ => false,
        }
    }
    match e {
        crate::Error::Core(Error::Plugin { .. }) => true,
        crate::Error::Cpu(e) => cpu(e),
        crate::Error::Core(_) => false,
    }
}

/// Runs the unpartitioned `module` on the CPU reference: what `--check` compares with.
pub fn run_unpartitioned(ex: &Executor, module: &Module, args: Vec<Value>) -> Result<Value, Error> {
    ex.run(module, "main", args, None).map_err(runtime_error)
}

/// `main` of `module`, or the error `fusebox run` gives without one.
fn main_of(m: &Module) -> Result<&fusebox_core::ir::Function, Error> {
    m.get("main")
        .ok_or_else(|| Error::Invalid("no function `main`".into()))
}

/// The parameter of `main` that input `name` is for (its name, or the ONNX input's name
/// before sanitizing); `label` names where inputs come from in the error (`--input`).
pub fn input_key(module: &Module, name: &str, label: &str) -> Result<String, Error> {
    let f = main_of(module)?;
    let key = sanitize(name);
    if !f.params.iter().any(|&p| f.var(p).name == key) {
        let params: Vec<&str> = f.params.iter().map(|&p| f.var(p).name.as_str()).collect();
        return Err(Error::Invalid(format!(
            "{label} `{name}`: `main` has no parameter of that name (parameters: {})",
            params.join(", ")
        )));
    }
    Ok(key)
}

/// The arguments of `main`: `given` (keyed by [`input_key`]), and for the rest random values
/// from `seed`, or, without a seed, an error naming every parameter not given (see the module
/// doc). `label` names where inputs come from in errors (`--input`).
pub fn main_args(
    m: &Module,
    mut given: BTreeMap<String, Tensor>,
    seed: Option<u64>,
    label: &str,
) -> Result<Vec<Value>, Error> {
    let f = main_of(m)?;
    if seed.is_none() {
        let missing: Vec<&str> = f
            .params
            .iter()
            .map(|&p| f.var(p).name.as_str())
            .filter(|n| !given.contains_key(*n))
            .collect();
        if !missing.is_empty() {
            let params: Vec<&str> = f.params.iter().map(|&p| f.var(p).name.as_str()).collect();
            return Err(Error::Invalid(format!(
                "no {label} for {} of `main` (it takes {})",
                missing
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
                params.join(", ")
            )));
        }
    }
    // Bind symbolic dims from the given inputs; the others default to 1.
    let mut syms: BTreeMap<Sym, i64> = BTreeMap::new();
    for &p in &f.params {
        let v = f.var(p);
        if let (Some(t), Some(tt)) = (given.get(&v.name), v.ty.as_tensor())
            && let Some(dims) = &tt.dims
        {
            for (d, &n) in dims.iter().zip(t.shape()) {
                if let fusebox_core::ir::Dim::Sym(s) = d {
                    syms.entry(s.clone()).or_insert(n as i64);
                }
            }
        }
    }
    let mut rng = Rng::new(seed.unwrap_or(0));
    let mut args = Vec::new();
    for &p in &f.params {
        let v = f.var(p);
        if let fusebox_core::ir::Type::Prim(d) = &v.ty {
            // A prim value (`T.bool`, `T.int64`, a condition of an `if`): a 0-d array given,
            // else random (a bool 0 or 1, an int 1, a float in [-1, 1]).
            let x = match given.remove(&v.name) {
                Some(t) if t.numel() == 1 => t.to_f64_vec().first().copied().unwrap_or(0.0),
                Some(t) => {
                    return Err(Error::Invalid(format!(
                        "{label} `{}`: the parameter is a {} scalar, found an array of shape {:?}",
                        v.name,
                        d.name(),
                        t.shape()
                    )));
                }
                None if *d == DType::Bool => (rng.next_u64() % 2) as f64,
                None if d.is_float() => (rng.next_u64() % 2_000_001) as f64 / 1_000_000.0 - 1.0,
                None => 1.0,
            };
            args.push(Value::Prim(if d.is_float() {
                fusebox_core::runtime::Prim::Float(x)
            } else {
                fusebox_core::runtime::Prim::Int(x as i64)
            }));
            continue;
        }
        if let Some(t) = given.remove(&v.name) {
            args.push(Value::Tensor(t));
            continue;
        }
        let tt = v.ty.as_tensor().ok_or_else(|| {
            Error::Invalid(format!("parameter `{}` is not a tensor: give it", v.name))
        })?;
        let dims = tt.dims.as_ref().ok_or_else(|| {
            Error::Invalid(format!(
                "parameter `{}` has an unknown shape: give it with {label}",
                v.name
            ))
        })?;
        let shape = dims
            .iter()
            .map(|d| {
                d.eval(&|s: &Sym| Some(syms.get(s).copied().unwrap_or(1)))
                    .and_then(|x| usize::try_from(x).ok())
                    .ok_or_else(|| {
                        Error::Invalid(format!("parameter `{}`: cannot size dim {d}", v.name))
                    })
            })
            .collect::<Result<Vec<usize>, Error>>()?;
        let dtype = tt.dtype.unwrap_or(DType::F32);
        // The input and its f32 staging buffer both go through the memory limit.
        let what = format!("input `{}`", v.name);
        fusebox_core::runtime::check_alloc(&what, dtype, &shape)?;
        let n = fusebox_core::runtime::shape_numel(&shape).unwrap_or(usize::MAX);
        let mut data: Vec<f32> =
            fusebox_core::runtime::memory::try_vec(&what, DType::F32, &shape, n)?;
        data.extend((0..n).map(|_| {
            if dtype.is_float() {
                (rng.next_u64() % 2_000_001) as f32 / 1_000_000.0 - 1.0
            } else {
                (rng.next_u64() % 2) as f32
            }
        }));
        args.push(Value::Tensor(Tensor::new(
            shape,
            Storage::from_f32(dtype, data),
        )?));
    }
    Ok(args)
}

/// The tensors of a result, tuples flattened in order.
pub fn flatten(v: Value) -> Vec<Tensor> {
    let mut out = Vec::new();
    fn go(v: Value, out: &mut Vec<Tensor>) {
        match v {
            Value::Tensor(t) => out.push(t),
            Value::Tuple(items) => items.into_iter().for_each(|i| go(i, out)),
            _ => {}
        }
    }
    go(v, &mut out);
    out
}

/// `--check`: the partitioned outputs against the unpartitioned module's, per-dtype tolerance;
/// `names` are the outputs' names for the error.
pub fn compare_outputs(want: &[Tensor], outs: &[Tensor], names: &[String]) -> Result<(), Error> {
    if want.len() != outs.len() {
        return Err(Error::Invalid(format!(
            "check failed: {} outputs, the unpartitioned module gives {}",
            outs.len(),
            want.len()
        )));
    }
    for (i, (g, w)) in outs.iter().zip(want).enumerate() {
        if let Some(why) = crate::compare::first_mismatch(g, w) {
            let name = names.get(i).cloned().unwrap_or_else(|| format!("#{i}"));
            return Err(Error::Invalid(format!(
                "check failed: output `{name}` differs from the unpartitioned module: {why}"
            )));
        }
    }
    Ok(())
}

/// The file stems of `n` outputs named `names` (see the module doc).
pub fn output_stems(names: &[String], n: usize) -> Vec<String> {
    let mut used = BTreeMap::new();
    (0..n)
        .map(|i| {
            let base = names
                .get(i)
                .map(|n| sanitize(n))
                .unwrap_or_else(|| format!("output_{i}"));
            let k = used.entry(base.clone()).or_insert(0usize);
            let file = if *k == 0 {
                base.clone()
            } else {
                format!("{base}_{k}")
            };
            *k += 1;
            file
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module() -> Module {
        let src = "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: R.Tensor((2, 3), \"float32\"), y: R.Tensor((2, 3), \"float32\")):\n        z = R.add(x, y)\n        return z\n";
        fusebox_core::text::parse_module_str(src).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn without_a_seed_every_missing_input_is_named() {
        let m = module();
        let e = main_args(&m, BTreeMap::new(), None, "input")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert_eq!(e, "no input for `x`, `y` of `main` (it takes x, y)");
        let x = Tensor::from_f32(vec![2, 3], vec![1.0; 6]).unwrap_or_else(|e| panic!("{e}"));
        let given = BTreeMap::from([("x".to_string(), x.clone())]);
        let e = main_args(&m, given.clone(), None, "input")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert_eq!(e, "no input for `y` of `main` (it takes x, y)");
        // With a seed, `y` is random and `x` is the given tensor.
        let args = main_args(&m, given, Some(0), "input").unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(&args[0], Value::Tensor(t) if *t == x));
        assert!(matches!(&args[1], Value::Tensor(t) if t.shape() == [2, 3]));
    }

    #[test]
    fn an_unknown_input_lists_the_parameters() {
        let e = input_key(&module(), "w", "--input")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert_eq!(
            e,
            "--input `w`: `main` has no parameter of that name (parameters: x, y)"
        );
        assert_eq!(
            input_key(&module(), "x", "--input").ok().as_deref(),
            Some("x")
        );
    }

    #[test]
    fn output_stems_are_sanitized_and_unique() {
        let names = vec!["a:0".to_string(), "a_0".to_string(), "b".to_string()];
        assert_eq!(output_stems(&names, 4), ["a_0", "a_0_1", "b", "output_3"]);
    }
}
