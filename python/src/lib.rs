//! `fusebox._fusebox`: the native module of the `fusebox` Python package. It exposes the
//! library the CLI is built on, not the CLI's printing: every function calls the same
//! `fusebox` functions the matching command calls ([`fusebox::load_model`],
//! [`fusebox::partition`], [`fusebox::runner`], [`fusebox_core::backend::pipeline::BackendPipeline::explain`]),
//! so a model reads, partitions, runs and fails the same from Python as from `fusebox`.
//!
//! Contract:
//!
//! - `load(path)` → `Module` (`.onnx` or a folder holding one is imported, anything else
//!   parsed as text with its `.safetensors` side file); `Module.text()`, `.functions`,
//!   `.params`, `.save(path)` (text and side file, atomically), `.bind({"batch": 1})` (a new
//!   module with those symbolic dims fixed, as `--bind NAME=VALUE`).
//! - `partition(module, config=None, patterns=None, bind_constants=None,
//!   annotate_codegen=None, merge=None, fuse_ops=None, fuse_opt_level=None, max_depth=None)`
//!   → `(Module, Report)`: without a config, `fusebox partition` with `--patterns` and the
//!   flags (defaults as the CLI's: constants bound, no `Codegen` wrappers, no merge, no
//!   FuseOps); with one, `fusebox partition --config` (patterns added as `--patterns` adds
//!   them), a flag given here overriding the config's `[partition]` value.
//! - `Report`: the JSON report as Python objects (`functions`, `rejections`, `main`,
//!   `claims`, `notes`), `json()` the text `--emit json` prints, `explain(binding)` what
//!   `fusebox explain` prints, for the pipeline that partitioned (without a config: one with no
//!   backends, the partition's patterns and flags, no simplification, so every function falls
//!   back to the CPU reference as it does when run).
//! - `run(module, inputs=None, config=None, patterns=None, check=False, seed=None,
//!   memory_limit=None)` → `dict[str, numpy.ndarray]` keyed by the CLI's output file stems:
//!   `fusebox run` (`--config`, or `--patterns`, else the CPU backend's transformer
//!   patterns), every parameter of `main` given in `inputs` unless `seed` fills the rest with
//!   the CLI's random values, `check=True` comparing with the unpartitioned module as
//!   `--check` does (a difference is a `CheckError`).
//! - `Session(module, config=None, patterns=None, memory_limit=None)`: `run`'s partition made
//!   once and one executor kept (`fusebox run --repeat`); `Session.run(inputs=None, seed=None)`
//!   is one inference, its outputs as `run` gives them, bit for bit; `Session.module` the
//!   partitioned module.
//! - `backends(config=None)` → what `fusebox backends` lists, as dicts (default config:
//!   `configs/cpu.toml`, built in when absent).
//! - Errors are `fusebox.Error` subclasses with the CLI's message (the `errors` module); the GIL is
//!   released while loading, printing, saving, partitioning, explaining and running, and no
//!   panic crosses into Python.
//!
//! ```text
//! >>> m = fusebox.load("examples/small_cnn.relax")
//! >>> part, report = fusebox.partition(m, config="configs/cpu.toml")
//! >>> [f["backend"] for f in report.functions]
//! ['cpu', 'cpu', 'cpu', 'cpu', 'cpu', 'cpu']
//! ```

// PyO3's macros expand to FFI calls into CPython: this crate is an FFI module.
#![allow(
    unsafe_code,
    reason = "PyO3's #[pyclass]/#[pymodule] expansions call the CPython C API"
)]

mod convert;
mod errors;

use convert::Source;
use errors::{Failure, Stage, guarded};
use fusebox::partition::PatternPartition;
use fusebox_core::backend::pipeline::BackendPipeline;
use fusebox_core::config::{Config, Conv2dLayout, PartitionConfig};
use fusebox_cpu::Tensor;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// mimalloc, as the CLI: the IR allocates many small vectors. Built with its
/// `local_dynamic_tls` feature (python/Cargo.toml): this library is loaded with `dlopen`, and
/// mimalloc's default initial-exec thread-locals mark it `STATIC_TLS`, which glibc refuses
/// ("cannot allocate memory in static TLS block") once the library's thread-locals outgrow
/// the surplus it reserves for such libraries (1752 bytes did; the build before, one
/// 32-byte buffer smaller, did not).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A module of functions: what `load` reads and `partition` makes. Immutable.
#[pyclass(frozen, name = "Module", module = "fusebox")]
pub struct Module {
    inner: Arc<fusebox_core::ir::Module>,
    /// The file it was read from (or the module it was partitioned from was); errors about it
    /// name this file, as the CLI's do.
    source: Option<PathBuf>,
}

#[pymethods]
impl Module {
    /// The module in the text format (TVMScript), constants as `metadata[...]` references.
    fn text(&self, py: Python<'_>) -> PyResult<String> {
        let m = self.inner.clone();
        guarded(py, move || Ok(fusebox_core::text::print_module(&m).text))
    }

    /// The names of the module's functions, in module order.
    #[getter]
    fn functions(&self) -> Vec<String> {
        self.inner.functions.keys().cloned().collect()
    }

    /// The names of `main`'s parameters (the keys `run` takes), in order.
    #[getter]
    fn params(&self) -> Vec<String> {
        self.inner
            .get("main")
            .map(|f| f.params.iter().map(|&p| f.var(p).name.clone()).collect())
            .unwrap_or_default()
    }

    /// The module with its symbolic dims given values (`{"batch": 1, "sequence": 128}`, in
    /// the mapping's order), as the CLI's `--bind NAME=VALUE` (TVM's BindSymbolicVars): the GPU
    /// backends compile static shapes. A name the module does not use, or a value that is not
    /// an integer of 0 or more, raises `ModelImportError` naming it.
    fn bind(&self, py: Python<'_>, dims: &Bound<'_, PyDict>) -> PyResult<Module> {
        let mut binds = Vec::new();
        for (k, v) in dims.iter() {
            let name: String = k.extract().map_err(|_| {
                Failure::msg(
                    Stage::Import,
                    format!("bind: expected dim names as strings, found {k}"),
                )
                .into_pyerr(py)
            })?;
            let value = v.extract::<i64>().ok().filter(|&v| v >= 0).ok_or_else(|| {
                Failure::msg(
                    Stage::Import,
                    format!(
                        "bind: `{name}`: expected a dim value (an integer of 0 or more), \
                         found {v}"
                    ),
                )
                .into_pyerr(py)
            })?;
            binds.push((name, value));
        }
        let (m, source) = (self.inner.clone(), self.source.clone());
        let bound = guarded(py, move || {
            fusebox::bind_dims((*m).clone(), &binds)
                .map_err(|e| Failure::new(Stage::Import, e, source.as_ref()))
        })?;
        Ok(Module {
            inner: Arc::new(bound),
            source: self.source.clone(),
        })
    }

    /// The file the module was read from, if any.
    #[getter]
    fn source(&self) -> Option<String> {
        self.source.as_ref().map(|p| p.display().to_string())
    }

    /// Writes the module to `path` in the text format and its constants to the `.safetensors`
    /// file beside it (both atomically), so `load(path)` reads it back.
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let m = self.inner.clone();
        guarded(py, move || {
            fusebox_core::text::write_module(&path, &m)
                .map_err(|e| Failure::new(Stage::Save, e, None))
        })
    }

    fn __repr__(&self) -> String {
        let from = self
            .source
            .as_ref()
            .map(|p| format!(" from {:?}", p.display().to_string()))
            .unwrap_or_default();
        format!(
            "<fusebox.Module{from}: {} function(s)>",
            self.inner.functions.len()
        )
    }
}

/// What a partition did: the JSON report (`--emit json`) as Python objects, and `explain`.
#[pyclass(frozen, name = "Report", module = "fusebox")]
pub struct Report {
    json: String,
    /// The module before the partition (what `explain` partitions again).
    original: Arc<fusebox_core::ir::Module>,
    model: Option<PathBuf>,
    pipeline: Arc<BackendPipeline>,
}

impl Report {
    /// The report's `key` as Python objects (`[]` where the JSON leaves it out).
    fn field<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyAny>> {
        let data = py
            .import("json")?
            .call_method1("loads", (self.json.as_str(),))?;
        match data.get_item(key) {
            Ok(v) => Ok(v),
            Err(_) => Ok(PyList::empty(py).into_any()),
        }
    }
}

#[pymethods]
impl Report {
    /// Every function other than `main`, in first-call order: `name`, `codegen`,
    /// `composite`, `inner_composites`, `ops`, `params`, `outputs`, `bound_constants`,
    /// `calls`, `backend`, `fusion_kind`, `anchor`.
    #[getter]
    fn functions<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.field(py, "functions")
    }

    /// Every rejected pattern match: `pattern`, `at` (`function/var`), `reason`.
    #[getter]
    fn rejections<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.field(py, "rejections")
    }

    /// `main`'s bindings (`composite:<name>`, `call:<name>`, `op:<op>`, ...).
    #[getter]
    fn main<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.field(py, "main")
    }

    /// What each backend said about each function (with a config): `function`, `ops`,
    /// `backend`, `fallback`, `declines`, `compile_failures`.
    #[getter]
    fn claims<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.field(py, "claims")
    }

    /// What the report could not establish.
    #[getter]
    fn notes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.field(py, "notes")
    }

    /// The report as JSON, as `fusebox partition --emit json` prints it.
    fn json(&self) -> String {
        format!("{}\n", self.json)
    }

    /// Why binding `binding` of `main` ended where it did: the text `fusebox explain` prints.
    fn explain(&self, py: Python<'_>, binding: String) -> PyResult<String> {
        let (pipeline, m, model) = (
            self.pipeline.clone(),
            self.original.clone(),
            self.model.clone(),
        );
        guarded(py, move || {
            pipeline
                .explain(&m, &binding)
                .map_err(|e| Failure::new(Stage::Partition, e, model.as_ref()))
        })
    }

    fn __repr__(&self) -> String {
        format!("<fusebox.Report: {} bytes of JSON>", self.json.len())
    }
}

/// Reads a model: an `.onnx` file (or a folder holding one) is imported, anything else is
/// parsed as text (constants from the `.safetensors` file beside it).
#[pyfunction]
fn load(py: Python<'_>, path: PathBuf) -> PyResult<Module> {
    let stage = if fusebox_core::frontend::onnx::is_onnx_path(&path) {
        Stage::Import
    } else {
        Stage::Parse
    };
    let p = path.clone();
    let m = guarded(py, move || {
        fusebox::load_model(&p).map_err(|e| Failure::new(stage, e, Some(&p)))
    })?;
    Ok(Module {
        inner: Arc::new(m),
        source: Some(path),
    })
}

/// The partition flags as given (`None`: not given).
#[derive(Clone, Copy, Debug, Default)]
struct Flags {
    bind_constants: Option<bool>,
    annotate_codegen: Option<bool>,
    merge: Option<bool>,
    fuse_ops: Option<bool>,
    fuse_opt_level: Option<u32>,
    max_depth: Option<usize>,
}

impl Flags {
    /// `cfg` with the flags given written over it.
    fn apply(&self, cfg: &mut PartitionConfig) {
        let d = cfg.clone();
        *cfg = PartitionConfig {
            bind_constants: self.bind_constants.unwrap_or(d.bind_constants),
            annotate_codegen: self.annotate_codegen.unwrap_or(d.annotate_codegen),
            merge_composites: self.merge.unwrap_or(d.merge_composites),
            fuse_ops: self.fuse_ops.unwrap_or(d.fuse_ops),
            fuse_opt_level: self.fuse_opt_level.unwrap_or(d.fuse_opt_level),
            max_depth: self.max_depth.unwrap_or(d.max_depth),
            ..d
        };
    }
}

/// A pipeline from a config, with user patterns added; its errors are config errors (a
/// plugin's are plugin errors).
fn build_pipeline(
    mut cfg: Config,
    table: Option<Vec<fusebox_core::transform::FusionPattern>>,
    model: Option<&PathBuf>,
) -> Result<BackendPipeline, Failure> {
    if let Some(t) = table {
        fusebox::partition::add_user_patterns(&mut cfg, t);
    }
    fusebox::pipeline(cfg).map_err(|e| Failure::new(Stage::Config, e, model))
}

/// The pipeline `Report.explain` uses for a partition without a config (see the crate doc).
fn pattern_pipeline(opts: &PatternPartition) -> Result<BackendPipeline, Failure> {
    let mut cfg = Config::parse("", "<partition options>")
        .map_err(|e| Failure::new(Stage::Config, e, None))?;
    cfg.partition = PartitionConfig {
        simplify: false,
        bind_constants: opts.bind_constants,
        annotate_codegen: opts.annotate_codegen,
        merge_composites: opts.merge,
        fuse_ops: opts.fuse_ops,
        fuse_opt_level: opts.fuse_opt_level,
        max_depth: opts.max_depth,
        strict: false,
        conv2d_layout: Conv2dLayout::Keep,
    };
    build_pipeline(cfg, Some(opts.patterns.clone()), None)
}

/// Partitions a module: with a config, as `fusebox partition --config` (claims and compiles
/// too; a flag given here overrides the config's `[partition]` value and `patterns` joins its
/// table); without one, as `fusebox partition` with `--patterns` and the flags. Returns the
/// partitioned module and the report.
#[pyfunction]
#[pyo3(signature = (module, config=None, patterns=None, bind_constants=None,
    annotate_codegen=None, merge=None, fuse_ops=None, fuse_opt_level=None, max_depth=None))]
#[allow(
    clippy::too_many_arguments,
    reason = "the keyword arguments of the Python function"
)]
fn partition(
    py: Python<'_>,
    module: &Bound<'_, Module>,
    config: Option<&Bound<'_, PyAny>>,
    patterns: Option<&Bound<'_, PyAny>>,
    bind_constants: Option<bool>,
    annotate_codegen: Option<bool>,
    merge: Option<bool>,
    fuse_ops: Option<bool>,
    fuse_opt_level: Option<u32>,
    max_depth: Option<usize>,
) -> PyResult<(Module, Report)> {
    let module = module.get();
    let (m, model) = (module.inner.clone(), module.source.clone());
    let fail = |f: Failure| f.into_pyerr(py);
    let cfg_src = config.map(Source::config).transpose().map_err(fail)?;
    let pat_src = patterns.map(Source::patterns).transpose().map_err(fail)?;
    let flags = Flags {
        bind_constants,
        annotate_codegen,
        merge,
        fuse_ops,
        fuse_opt_level,
        max_depth,
    };
    let original = m.clone();
    let (part, json, pipeline) = guarded(py, move || {
        let at = |stage: Stage| {
            let model = model.clone();
            move |e: fusebox::Error| Failure::new(stage, e, model.as_ref())
        };
        if let Some(level) = flags.fuse_opt_level
            && level > 2
        {
            return Err(Failure::new(
                Stage::Config,
                fusebox_core::Error::Invalid(format!(
                    "fuse_opt_level must be 0, 1 or 2, found {level}"
                )),
                model.as_ref(),
            ));
        }
        let table = match &pat_src {
            Some(s) => Some(s.load_patterns().map_err(|f| with_model(f, &model))?),
            None => None,
        };
        match cfg_src {
            Some(src) => {
                let mut cfg = src.load_config().map_err(|f| with_model(f, &model))?;
                flags.apply(&mut cfg.partition);
                let pipeline = build_pipeline(cfg, table, model.as_ref())?;
                let plan = fusebox::partition::partition_with_config(&pipeline, &m)
                    .map_err(at(Stage::Partition))?;
                let json = plan.report().to_json();
                Ok((plan.module, json, pipeline))
            }
            None => {
                let opts = PatternPartition {
                    patterns: table.unwrap_or_default(),
                    bind_constants: flags.bind_constants.unwrap_or(true),
                    annotate_codegen: flags.annotate_codegen.unwrap_or(false),
                    merge: flags.merge.unwrap_or(false),
                    fuse_ops: flags.fuse_ops.unwrap_or(false),
                    fuse_opt_level: flags.fuse_opt_level.unwrap_or(2),
                    max_depth: flags.max_depth.unwrap_or(256),
                };
                let out = fusebox::partition::partition_with_patterns(&m, &opts)
                    .map_err(at(Stage::Partition))?;
                let json = out.report().to_json();
                Ok((out.module, json, pattern_pipeline(&opts)?))
            }
        }
    })?;
    Ok((
        Module {
            inner: Arc::new(part),
            source: module.source.clone(),
        },
        Report {
            json,
            original,
            model: module.source.clone(),
            pipeline: Arc::new(pipeline),
        },
    ))
}

/// `f` with the model's path in front of its message, as the CLI prints every error of a
/// command that reads a model (unless the message names it already).
fn with_model(mut f: Failure, model: &Option<PathBuf>) -> Failure {
    if let Some(m) = model {
        let m = m.display().to_string();
        if !f.message.contains(&m) {
            f.message = format!("{m}: {}", f.message);
        }
    }
    f
}

/// A memory limit: bytes (an int above 0) or a size such as `"8GiB"`.
fn memory_limit(obj: &Bound<'_, PyAny>) -> Result<u64, Failure> {
    let bad = |m: String| Failure::msg(Stage::Config, format!("memory_limit: {m}"));
    if let Ok(s) = obj.extract::<String>() {
        return fusebox_core::runtime::memory::parse_size(&s).map_err(bad);
    }
    match obj.extract::<i128>() {
        Ok(n) if n > 0 => u64::try_from(n).map_err(|_| bad(format!("{n} is too large"))),
        Ok(n) => Err(bad(format!("the limit must be above 0, found {n}"))),
        Err(_) => Err(bad(
            "expected a byte count or a size string such as \"8GiB\"".into(),
        )),
    }
}

/// Runs a module as `fusebox run` does and returns its outputs by name (the CLI's output file
/// stems). `inputs` maps a parameter of `main` (or an ONNX input's name) to an array; without
/// `seed` every parameter must be given, with it the rest get the CLI's random values for that
/// seed. `config` runs the config's backend flow (`patterns` joins its table); without it,
/// `patterns` (else the CPU backend's transformer patterns) then FuseOps on the CPU reference.
/// `check=True` also runs the unpartitioned module and raises `CheckError` on a difference.
#[pyfunction]
#[pyo3(signature = (module, inputs=None, config=None, patterns=None, check=false, seed=None,
    memory_limit=None))]
#[allow(
    clippy::too_many_arguments,
    reason = "the keyword arguments of the Python function"
)]
fn run<'py>(
    py: Python<'py>,
    module: &Bound<'py, Module>,
    inputs: Option<&Bound<'py, PyDict>>,
    config: Option<&Bound<'py, PyAny>>,
    patterns: Option<&Bound<'py, PyAny>>,
    check: bool,
    seed: Option<u64>,
    memory_limit: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let module = module.get();
    let (m, model) = (module.inner.clone(), module.source.clone());
    // First the config and the memory limit (so the inputs are held to it, as the CLI's are)...
    let mode = run_mode(py, &model, config, patterns, memory_limit)?;
    // ...then the inputs (reading numpy arrays needs the GIL)...
    let given = read_inputs(py, &m, &model, inputs)?;
    // ...then the partition and the run.
    let model2 = model.clone();
    let (outs, stems) = guarded(py, move || {
        let prepared = prepare(&m, &model2, mode)?;
        let ex = fusebox_cpu::Executor::new();
        execute(&m, &model2, &prepared, &ex, given, seed, check)
    })?;
    outputs_dict(py, &model, outs, stems)
}

/// What a run partitions with: the config's backend pipeline (its table joined by `patterns`),
/// else the pattern table (`None`: the CPU backend's own).
enum Mode {
    Config(Box<BackendPipeline>),
    Patterns(Option<Vec<fusebox_core::transform::FusionPattern>>),
}

/// [`Mode`] from `run`'s and `Session`'s keyword arguments, after setting up the runtime (the
/// memory limit, the config's threads); a config's target warning goes to Python's `warnings`,
/// as the CLI prints it.
fn run_mode(
    py: Python<'_>,
    model: &Option<PathBuf>,
    config: Option<&Bound<'_, PyAny>>,
    patterns: Option<&Bound<'_, PyAny>>,
    memory_limit: Option<&Bound<'_, PyAny>>,
) -> PyResult<Mode> {
    let fail = |f: Failure| f.into_pyerr(py);
    let cfg_src = config.map(Source::config).transpose().map_err(fail)?;
    let pat_src = patterns.map(Source::patterns).transpose().map_err(fail)?;
    let limit = memory_limit
        .map(self::memory_limit)
        .transpose()
        .map_err(fail)?;
    let model = model.clone();
    let (mode, warning) = guarded(py, move || {
        let table = match &pat_src {
            Some(s) => Some(s.load_patterns().map_err(|f| with_model(f, &model))?),
            None => None,
        };
        let pipeline = match cfg_src {
            Some(src) => {
                let cfg = src.load_config().map_err(|f| with_model(f, &model))?;
                Some(build_pipeline(cfg, table.clone(), model.as_ref())?)
            }
            None => None,
        };
        let at_run = |e: fusebox_core::Error| Failure::new(Stage::Run, e, model.as_ref());
        fusebox::runner::prepare_runtime(limit, pipeline.as_ref().map(|p| &p.config))
            .map_err(at_run)?;
        let warning = match &pipeline {
            Some(p) => fusebox::check_target(&p.config).map_err(at_run)?,
            None => None,
        };
        let mode = match pipeline {
            Some(p) => Mode::Config(Box::new(p)),
            None => Mode::Patterns(table),
        };
        Ok((mode, warning))
    })?;
    if let Some(w) = warning {
        let category = py.get_type::<pyo3::exceptions::PyRuntimeWarning>();
        PyErr::warn(py, &category, &std::ffi::CString::new(w)?, 1)?;
    }
    Ok(mode)
}

/// `inputs` as `main`'s arguments by parameter (an ONNX input's name resolved as the CLI's
/// `--input` resolves it); a parameter given twice is an error.
fn read_inputs(
    py: Python<'_>,
    m: &fusebox_core::ir::Module,
    model: &Option<PathBuf>,
    inputs: Option<&Bound<'_, PyDict>>,
) -> PyResult<BTreeMap<String, Tensor>> {
    let fail = |f: Failure| f.into_pyerr(py);
    let mut given: BTreeMap<String, Tensor> = BTreeMap::new();
    for (k, v) in inputs.into_iter().flat_map(|d| d.iter()) {
        let name: String = k.extract()?;
        let key = fusebox::runner::input_key(m, &name, "input")
            .map_err(|e| fail(Failure::new(Stage::Run, e, model.as_ref())))?;
        let t = convert::to_tensor(py, &v, &name).map_err(|f| fail(with_model(f, model)))?;
        if given.insert(key.clone(), t).is_some() {
            return Err(fail(with_model(
                Failure::msg(
                    Stage::Run,
                    format!("input `{name}`: parameter `{key}` is given twice"),
                ),
                model,
            )));
        }
    }
    Ok(given)
}

/// `m` partitioned for `mode`, as `fusebox run` partitions it (call with the GIL released).
/// The mode is spent: a pattern table moves into the partition instead of being copied.
fn prepare(
    m: &fusebox_core::ir::Module,
    model: &Option<PathBuf>,
    mode: Mode,
) -> Result<fusebox::runner::Prepared, Failure> {
    use fusebox::runner::{RunMode, prepare};
    let at = |e| Failure::new(Stage::Partition, e, model.as_ref());
    match mode {
        Mode::Config(p) => prepare(m, RunMode::Config(&p)).map_err(at),
        Mode::Patterns(table) => prepare(m, RunMode::Patterns(table)).map_err(at),
    }
}

/// One run of `prepared` on `ex` with `given` (the rest from `seed`): the flattened outputs
/// and their names as the CLI's file stems; `check` compares with the unpartitioned `m` (call
/// with the GIL released).
fn execute(
    m: &fusebox_core::ir::Module,
    model: &Option<PathBuf>,
    prepared: &fusebox::runner::Prepared,
    ex: &fusebox_cpu::Executor,
    given: BTreeMap<String, Tensor>,
    seed: Option<u64>,
    check: bool,
) -> Result<(Vec<Tensor>, Vec<String>), Failure> {
    use fusebox::runner;
    let at = |stage: Stage| move |e: fusebox_core::Error| Failure::new(stage, e, model.as_ref());
    let args = runner::main_args(m, given, seed, "input").map_err(at(Stage::Run))?;
    let (out, _) = prepared
        .execute(ex, args.clone(), false)
        .map_err(|e| Failure::run(e, model.as_ref()))?;
    let outs = runner::flatten(out);
    let names = m
        .get("main")
        .map(fusebox_core::frontend::onnx::output_names)
        .unwrap_or_default();
    if check {
        let want = runner::flatten(runner::run_unpartitioned(ex, m, args).map_err(at(Stage::Run))?);
        runner::compare_outputs(&want, &outs, &names).map_err(at(Stage::Check))?;
    }
    let stems = runner::output_stems(&names, outs.len());
    Ok((outs, stems))
}

/// The outputs as a `dict` of arrays by stem.
fn outputs_dict<'py>(
    py: Python<'py>,
    model: &Option<PathBuf>,
    outs: Vec<Tensor>,
    stems: Vec<String>,
) -> PyResult<Bound<'py, PyDict>> {
    let result = PyDict::new(py);
    for (t, name) in outs.into_iter().zip(stems) {
        let a = convert::to_array(py, t).map_err(|f| with_model(f, model).into_pyerr(py))?;
        result.set_item(name, a)?;
    }
    Ok(result)
}

/// A module prepared once and run many times, as `fusebox run --repeat` runs it: partitioned
/// (with a config: claimed and compiled) when made, with one executor kept, so the constants
/// it decoded and the weight forms it made (packed, Winograd-transformed) serve every later
/// `run`, and a `run` is one inference. The arguments are `run`'s.
#[pyclass(frozen, name = "Session", module = "fusebox")]
pub struct Session {
    module: Arc<fusebox_core::ir::Module>,
    source: Option<PathBuf>,
    prepared: fusebox::runner::Prepared,
    ex: fusebox_cpu::Executor,
}

#[pymethods]
impl Session {
    #[new]
    #[pyo3(signature = (module, config=None, patterns=None, memory_limit=None))]
    fn new(
        py: Python<'_>,
        module: &Bound<'_, Module>,
        config: Option<&Bound<'_, PyAny>>,
        patterns: Option<&Bound<'_, PyAny>>,
        memory_limit: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Session> {
        let module = module.get();
        let (m, model) = (module.inner.clone(), module.source.clone());
        let mode = run_mode(py, &model, config, patterns, memory_limit)?;
        let (m2, model2) = (m.clone(), model.clone());
        let prepared = guarded(py, move || prepare(&m2, &model2, mode))?;
        Ok(Session {
            module: m,
            source: model,
            prepared,
            ex: fusebox_cpu::Executor::new(),
        })
    }

    /// One inference: the outputs by name, as `fusebox.run` gives them (`inputs` and `seed`
    /// as there).
    #[pyo3(signature = (inputs=None, seed=None))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        inputs: Option<&Bound<'py, PyDict>>,
        seed: Option<u64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let given = read_inputs(py, &self.module, &self.source, inputs)?;
        let (outs, stems) = guarded(py, || {
            execute(
                &self.module,
                &self.source,
                &self.prepared,
                &self.ex,
                given,
                seed,
                false,
            )
        })?;
        outputs_dict(py, &self.source, outs, stems)
    }

    /// The partitioned module the session runs.
    #[getter]
    fn module(&self) -> Module {
        Module {
            inner: Arc::new(self.prepared.module().clone()),
            source: self.source.clone(),
        }
    }

    fn __repr__(&self) -> String {
        match &self.source {
            Some(p) => format!("<fusebox.Session of {}>", p.display()),
            None => "<fusebox.Session>".to_string(),
        }
    }
}

/// The backends of a config (built-in and plugins) in order with their patterns, highest
/// priority first, the user patterns of no enabled backend, and the lint findings on the
/// combined table: what `fusebox backends` lists. Default config: `configs/cpu.toml`.
#[pyfunction]
#[pyo3(signature = (config=None))]
fn backends<'py>(
    py: Python<'py>,
    config: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let src = match config {
        Some(c) => Source::config(c).map_err(|f| f.into_pyerr(py))?,
        None => Source::Path(PathBuf::from(fusebox::DEFAULT_CONFIG)),
    };
    let (file, listing) = guarded(py, move || {
        let cfg = src.load_config()?;
        let file = cfg.file.clone();
        let pipeline = build_pipeline(cfg, None, None)?;
        Ok((file, fusebox::partition::backend_listing(&pipeline)))
    })?;
    let pattern = |p: &fusebox::partition::ListedPattern| -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("name", &p.name)?;
        d.set_item("priority", p.priority)?;
        d.set_item("check", &p.check)?;
        d.set_item("user", p.user)?;
        d.set_item("pattern", &p.pattern)?;
        Ok(d)
    };
    let out = PyDict::new(py);
    out.set_item("config", file)?;
    let list = PyList::empty(py);
    for b in &listing.backends {
        let d = PyDict::new(py);
        d.set_item("name", &b.name)?;
        d.set_item("origin", &b.origin)?;
        let pats = PyList::empty(py);
        for p in &b.patterns {
            pats.append(pattern(p)?)?;
        }
        d.set_item("patterns", pats)?;
        list.append(d)?;
    }
    out.set_item("backends", list)?;
    let unassigned = PyList::empty(py);
    for p in &listing.unassigned {
        unassigned.append(pattern(p)?)?;
    }
    out.set_item("unassigned", unassigned)?;
    let lint = PyList::empty(py);
    for f in &listing.lint {
        let d = PyDict::new(py);
        d.set_item("kind", f.kind)?;
        d.set_item("entry", &f.entry)?;
        d.set_item("other", &f.other)?;
        d.set_item("message", &f.message)?;
        lint.append(d)?;
    }
    out.set_item("lint", lint)?;
    Ok(out)
}

/// Why binding `binding` of `main` ended where it did with `config` (default:
/// `configs/cpu.toml`): the text `fusebox explain` prints.
#[pyfunction]
#[pyo3(signature = (module, binding, config=None))]
fn explain(
    py: Python<'_>,
    module: &Bound<'_, Module>,
    binding: String,
    config: Option<&Bound<'_, PyAny>>,
) -> PyResult<String> {
    let module = module.get();
    let (m, model) = (module.inner.clone(), module.source.clone());
    let src = match config {
        Some(c) => Source::config(c).map_err(|f| f.into_pyerr(py))?,
        None => Source::Path(PathBuf::from(fusebox::DEFAULT_CONFIG)),
    };
    guarded(py, move || {
        let cfg = src.load_config().map_err(|f| with_model(f, &model))?;
        let pipeline = build_pipeline(cfg, None, model.as_ref())?;
        pipeline
            .explain(&m, &binding)
            .map_err(|e| Failure::new(Stage::Partition, e, model.as_ref()))
    })
}

/// Panics inside the boundary, to test that a panic reaches Python as a `fusebox.Error`
/// (not part of the API).
#[pyfunction]
#[allow(clippy::panic, reason = "the panic is what it tests")]
fn _panic_for_test(py: Python<'_>, message: String) -> PyResult<()> {
    guarded(py, move || -> Result<(), Failure> {
        std::panic::panic_any(message)
    })
}

/// The native module.
#[pymodule]
fn _fusebox(m: &Bound<'_, pyo3::types::PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<Module>()?;
    m.add_class::<Report>()?;
    m.add_class::<Session>()?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(partition, m)?)?;
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(backends, m)?)?;
    m.add_function(wrap_pyfunction!(explain, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_test, m)?)?;
    Ok(())
}
