//! The backend pipeline built from a [`Config`]: partition, claim, compile.
//!
//! Contract:
//!
//! 1. Backends are made in `[[backend]]` order (built-ins from the registry, plugins through a
//!    [`PluginLoader`]); a loaded plugin not listed in `[[backend]]` is appended after the listed
//!    ones in `[[plugin]]` order. An unknown backend is an error at its `name` in the config,
//!    listing the valid names; a plugin whose name is already taken is an error.
//! 2. The pattern table: for each backend in order, its own patterns plus the user patterns that
//!    join it (`backend = "..."`, else the backend named by the codegen prefix), sorted stably by
//!    priority (highest first); then the user patterns of no enabled backend. So: backend order,
//!    then priority, then list order.
//! 3. Inference simplification ([`crate::transform::simplify_pipeline`]: FoldConstant with
//!    the pipeline's [`Evaluator`] when it has one, RemoveIdentity, RemoveExportNoise,
//!    FoldBatchNorm) unless `simplify = false` → ConvertLayout (then FoldConstant again, for
//!    the moved weights) to the `conv2d_layout` pair when one is given; with `"auto"` (the
//!    default) to the layouts of the first backend that names some for the target
//!    ([`Backend::conv2d_layout`]), of every convolution or only of those on input planes up
//!    to each smaller plane of the model, the one that pays by the largest margin kept
//!    ([`crate::transform::LayoutCost::pays`], [`crate::transform::LayoutCost::margin`]),
//!    the choice (or why not) in [`Partitioned::notes`] → FuseOpsByPattern (`bind_constants`,
//!    `annotate_codegen`) → MergeCompositeFunctions if `merge_composites` → FuseOps if
//!    `fuse_ops`.
//! 4. Every module function `main` calls is a unit of work. Each backend in order is asked to
//!    claim it; the first that accepts compiles it; if compile fails, the next backend that
//!    claims it is tried. Declines and failures are recorded with their reasons.
//! 5. A unit no backend compiled runs on the built-in `cpu` backend (`fallback: true`), unless
//!    `strict = true`: then it is an error naming every unclaimed function and op (ops left
//!    bare in `main` count as unclaimed when no `cpu` backend is enabled). With `strict = true`
//!    a unit that ends on `cpu` because the backends before it claimed it but failed to
//!    compile (or build) it is an error as well, naming each failure: strict means the CPU
//!    never silently stands in for a backend that broke.
//! 6. Ahead of time ([`BackendPipeline::build`]): the same partition and claims, with
//!    [`Backend::build`] in place of compile (no device needed); the [`BuildPlan`] gives the
//!    [`Manifest`] that `fusebox compile` writes beside the built files.
//!
//! ```text
//! [[backend]] name = "example"   ; claims Codegen = "example" functions
//! [[backend]] name = "cpu"       ; claims everything else
//! main: gv = cls.fused_relax_nn_conv2d_relax_nn_relu_example(x, w)  -> example
//!       gv1 = cls.fused_add(gv, b)                                  -> cpu (example declined)
//! ```

use super::{Artifact, Backend, BuildOutput, Candidate, Claim, KernelInfo, make_backend, registry};
use crate::config::{Config, Conv2dLayout};
use crate::error::{Error, Result};
use crate::ir::{Callee, ExprKind, Function, Module};
use crate::report::{ClaimReport, Report};
use crate::transform::{
    Evaluator, FusionPattern, PartitionOptions, Pipeline, Rejection, fuse_ops_by_pattern,
    merge_composite_functions,
    pass::{DeadCodeElimination, FuseOps},
    simplify_for_inference,
};
use std::collections::BTreeMap;
use std::path::Path;

/// A loaded plugin library: its backend's name, and a constructor taking the backend options.
pub trait PluginFactory {
    /// The backend name the plugin declares.
    fn name(&self) -> &str;
    /// The library it came from (for messages).
    fn library(&self) -> String;
    /// Builds the backend with its `[backend.options]`.
    fn make(&self, options: &toml::Table) -> Result<Box<dyn Backend>>;
}

/// Loads a plugin library (implemented by `fusebox-plugin-host`).
pub type PluginLoader<'a> = &'a dyn Fn(&Path) -> Result<Box<dyn PluginFactory>>;

/// One entry of the combined pattern table.
#[derive(Clone, Debug)]
pub struct TableEntry {
    /// The pattern.
    pub pattern: FusionPattern,
    /// The backend whose group it is in (`None`: a user pattern of no enabled backend).
    pub backend: Option<String>,
    /// Whether it came from the config's `[[pattern]]` tables.
    pub user: bool,
}

/// The backends and the pattern table of a config.
pub struct BackendPipeline {
    /// The config.
    pub config: Config,
    /// The enabled backends, in order.
    pub backends: Vec<Box<dyn Backend>>,
    /// The combined pattern table in application order.
    pub table: Vec<TableEntry>,
    /// Evaluates ops on constants for FoldConstant (the `fusebox` facade sets the CPU
    /// reference's); `None` skips constant folding.
    pub evaluator: Option<Evaluator>,
}

/// The result of [`BackendPipeline::partition_noted`].
pub struct Partitioned {
    /// The partitioned module.
    pub module: Module,
    /// Every rejected pattern match.
    pub rejections: Vec<Rejection>,
    /// What the pipeline chose on its own and why, one line each.
    pub notes: Vec<String>,
}

/// What happened to one unit of work.
pub struct Plan {
    /// The partitioned module.
    pub module: Module,
    /// Every rejected pattern match.
    pub rejections: Vec<Rejection>,
    /// One entry per unit, in first-call order.
    pub claims: Vec<ClaimReport>,
    /// Compiled artifacts by function name.
    pub artifacts: BTreeMap<String, Box<dyn Artifact>>,
    /// What the pipeline chose on its own ([`Partitioned::notes`]); in the report's notes.
    pub notes: Vec<String>,
}

impl Plan {
    /// Runs the compiled artifact of `function` on `args` (`None` when it has none), honouring
    /// its placement: a host artifact gets device arguments downloaded first, a device
    /// artifact gets them as they are. This is the executor's call hook.
    pub fn call(
        &self,
        function: &str,
        args: &[crate::runtime::Value],
    ) -> Option<Result<crate::runtime::Value>> {
        use super::Placement;
        self.artifacts.get(function).map(|a| match a.placement() {
            Placement::Device => a.run(args),
            Placement::Host => a.run(&crate::runtime::host_args(args)?),
        })
    }

    /// Whether [`Plan::call`] runs calls of `function` with an artifact that is not the CPU
    /// reference interpreter's own evaluation ([`Artifact::is_reference`]); the executor
    /// interprets the others itself.
    pub fn takes(&self, function: &str) -> bool {
        self.artifacts
            .get(function)
            .is_some_and(|a| !a.is_reference())
    }

    /// The JSON report with `backend` filled in and the claims attached.
    pub fn report(&self) -> Report {
        let mut r = crate::report::build(&self.module, &self.rejections);
        for f in &mut r.functions {
            if let Some(c) = self.claims.iter().find(|c| c.function == f.name) {
                f.backend = c.backend.clone();
            }
        }
        r.claims = self.claims.clone();
        r.notes.extend(self.notes.iter().cloned());
        r
    }
}

/// One unit of work built ahead of time.
#[derive(Clone, Debug)]
pub struct BuiltFunction {
    /// Who claimed it (and who declined or failed first).
    pub claim: ClaimReport,
    /// What its backend built (`None`: nothing to build ahead of time, e.g. the CPU reference).
    pub output: Option<BuildOutput>,
}

/// The result of [`BackendPipeline::build`].
#[derive(Clone, Debug)]
pub struct BuildPlan {
    /// The partitioned module.
    pub module: Module,
    /// Every rejected pattern match.
    pub rejections: Vec<Rejection>,
    /// One entry per unit, in first-call order.
    pub functions: Vec<BuiltFunction>,
}

/// The `manifest.json` of `fusebox compile`: what was built for every unit of work.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    /// The manifest format version (2: `build_failures` added to each function).
    pub format: u32,
    /// The fusebox version that wrote it.
    pub fusebox_version: String,
    /// One entry per unit, in first-call order.
    pub functions: Vec<ManifestEntry>,
}

/// One function of a [`Manifest`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ManifestEntry {
    /// The function's name in the partitioned module.
    pub function: String,
    /// The backend that runs it (`cpu` for the CPU reference).
    pub backend: String,
    /// Whether it fell back to the CPU reference because no backend took it.
    pub fallback: bool,
    /// The ops inside, in binding order.
    pub ops: Vec<String>,
    /// The target architecture of its files, if any.
    pub arch: Option<String>,
    /// Its kernels and their launch configurations, in launch order.
    pub kernels: Vec<KernelInfo>,
    /// Its files in the output directory, in the order the backend gave them.
    pub files: Vec<String>,
    /// Every backend that claimed it but could not build it, with the error, in backend
    /// order (why a function meant for a GPU backend ended on `cpu`).
    pub build_failures: Vec<BuildFailure>,
}

/// A backend that claimed a function and could not build it (a [`ManifestEntry`] field).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BuildFailure {
    /// The backend.
    pub backend: String,
    /// Its error.
    pub error: String,
}

impl BuildPlan {
    /// The manifest (deterministic: no times, no absolute paths).
    pub fn manifest(&self) -> Manifest {
        Manifest {
            format: 2,
            fusebox_version: env!("CARGO_PKG_VERSION").to_string(),
            functions: self
                .functions
                .iter()
                .map(|f| {
                    let out = f.output.as_ref();
                    ManifestEntry {
                        function: f.claim.function.clone(),
                        backend: f.claim.backend.clone().unwrap_or_else(|| "cpu".into()),
                        fallback: f.claim.fallback,
                        ops: f.claim.ops.clone(),
                        arch: out.and_then(|o| o.arch.clone()),
                        kernels: out.map(|o| o.kernels.clone()).unwrap_or_default(),
                        files: out
                            .map(|o| o.files.iter().map(|(n, _)| n.clone()).collect())
                            .unwrap_or_default(),
                        build_failures: f
                            .claim
                            .compile_failures
                            .iter()
                            .map(|(backend, error)| BuildFailure {
                                backend: backend.clone(),
                                error: error.clone(),
                            })
                            .collect(),
                    }
                })
                .collect(),
        }
    }

    /// The number of kernels built.
    pub fn kernel_count(&self) -> usize {
        self.functions
            .iter()
            .filter_map(|f| f.output.as_ref())
            .map(|o| o.kernels.len())
            .sum()
    }
}

impl Manifest {
    /// Pretty JSON, ending in a newline.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).unwrap_or_default();
        s.push('\n');
        s
    }
}

impl BackendPipeline {
    /// Builds the backends and the table (contract points 1 and 2).
    pub fn new(config: Config, loader: Option<PluginLoader<'_>>) -> Result<Self> {
        let mut plugins: Vec<Box<dyn PluginFactory>> = Vec::new();
        for p in &config.plugins {
            let Some(load) = loader else {
                return Err(
                    config.error_at(p.span.clone(), "this build of fusebox cannot load plugins")
                );
            };
            let f = load(&p.path)?;
            if registry::is_registered(f.name()) {
                return Err(config.error_at(
                    p.span.clone(),
                    format!(
                        "plugin {} declares backend `{}`, which is already a built-in backend",
                        f.library(),
                        f.name()
                    ),
                ));
            }
            if let Some(prev) = plugins.iter().find(|x| x.name() == f.name()) {
                return Err(config.error_at(
                    p.span.clone(),
                    format!(
                        "plugin {} declares backend `{}`, which plugin {} already declared",
                        f.library(),
                        f.name(),
                        prev.library()
                    ),
                ));
            }
            plugins.push(f);
        }
        let mut backends: Vec<Box<dyn Backend>> = Vec::new();
        for e in &config.backends {
            let made = match plugins.iter().find(|p| p.name() == e.name) {
                Some(p) => p.make(&e.options),
                None if registry::is_registered(&e.name) => make_backend(&e.name, &e.options),
                None => {
                    let mut valid = registry::registered_names()?;
                    valid.extend(plugins.iter().map(|p| p.name()));
                    valid.sort_unstable();
                    return Err(config.error_at(
                        e.span.clone(),
                        Error::unknown("backend", e.name.clone(), registry::valid_list(valid))
                            .to_string(),
                    ));
                }
            };
            backends.push(made.map_err(|err| config.error_at(e.span.clone(), err.to_string()))?);
        }
        for p in &plugins {
            if config.backend(p.name()).is_none() {
                backends.push(p.make(&toml::Table::new())?);
            }
        }
        let table = build_table(&config, &backends)?;
        Ok(BackendPipeline {
            config,
            backends,
            table,
            evaluator: None,
        })
    }

    /// The pipeline with `eval` as FoldConstant's evaluator.
    pub fn with_evaluator(mut self, eval: Evaluator) -> Self {
        self.evaluator = Some(eval);
        self
    }

    /// The patterns in application order.
    pub fn patterns(&self) -> Vec<FusionPattern> {
        self.table.iter().map(|e| e.pattern.clone()).collect()
    }

    /// Simplification → FuseOpsByPattern → MergeCompositeFunctions → FuseOps as the config says (contract
    /// point 3): the partitioned module and the rejected matches.
    pub fn partition(&self, module: &Module) -> Result<(Module, Vec<Rejection>)> {
        let p = self.partition_noted(module)?;
        Ok((p.module, p.rejections))
    }

    /// [`BackendPipeline::partition`] with what the pipeline chose on its own, for the report
    /// (`conv2d_layout = "auto"`'s decision).
    pub fn partition_noted(&self, module: &Module) -> Result<Partitioned> {
        let pc = &self.config.partition;
        let opts = PartitionOptions {
            bind_constants: pc.bind_constants,
            annotate_codegen: pc.annotate_codegen,
        };
        // Inference simplification first: constants folded, batch_norm folded into the conv
        // or matmul before it (or made an affine map), identities and exporter noise removed,
        // so patterns and FuseOps see conv → add → relu.
        let simplified;
        let input = if pc.simplify {
            simplified = simplify_for_inference(module, self.evaluator.clone())?;
            &simplified
        } else {
            module
        };
        // ConvertLayout where the config asks for it or the backends choose it, after
        // simplification (batch_norm is folded by then), with the moved constants folded again.
        let mut notes = Vec::new();
        let converted;
        let input = match &pc.conv2d_layout {
            Conv2dLayout::Fixed([data, kernel]) => {
                converted = convert_folded(input, data, kernel, None, self.evaluator.as_ref())?;
                &converted
            }
            Conv2dLayout::Keep => input,
            Conv2dLayout::Auto => {
                let backends: Vec<&dyn Backend> = self.backends.iter().map(|b| &**b).collect();
                let (c, note) = auto_conv2d_layout(
                    input,
                    &backends,
                    self.config.target,
                    self.evaluator.as_ref(),
                )?;
                notes.extend(note);
                match c {
                    Some(c) => {
                        converted = c;
                        &converted
                    }
                    None => input,
                }
            }
        };
        let out = fuse_ops_by_pattern(input, &self.patterns(), opts)?;
        let mut m = out.module;
        if pc.merge_composites {
            m = merge_composite_functions(&m)?;
        }
        if pc.fuse_ops {
            // The seed's recommendation: DeadCodeElimination → FuseOps.
            let p = Pipeline::new().then(DeadCodeElimination).then(FuseOps {
                opt_level: pc.fuse_opt_level,
                max_depth: pc.max_depth,
                lift_single_ops: self.config.target == crate::config::Target::Cuda,
            });
            m = p.run(&m)?.0;
        }
        Ok(Partitioned {
            module: m,
            rejections: out.rejections,
            notes,
        })
    }

    /// Offers every unit of `m` to the backends in order (contract points 4 and 5): `make`
    /// compiles or builds a claimed unit, `fallback` makes the CPU reference's result for a
    /// unit no backend made anything of; `progress(done, total, function)` is called before
    /// each unit. `strict_compile` applies `strict = true` to compile failures as well
    /// (contract point 5); reports (`partition --config`, `explain`) leave it off.
    fn claim_each<T>(
        &self,
        m: &Module,
        strict_compile: bool,
        make: &dyn Fn(&dyn Backend, &Candidate<'_>) -> Result<T>,
        fallback: &dyn Fn(&Candidate<'_>) -> Result<T>,
        progress: &mut dyn FnMut(usize, usize, &str),
    ) -> Result<Vec<(ClaimReport, T)>> {
        let pc = &self.config.partition;
        let mut done = Vec::new();
        let mut unclaimed = Vec::new();
        // (backend, error, functions): one entry per distinct failure, in first-seen order.
        let mut broken: Vec<(String, String, Vec<String>)> = Vec::new();
        let main = m
            .get("main")
            .ok_or_else(|| Error::Invalid("the module has no `main` function".into()))?;
        let units = called_from(main);
        for (i, name) in units.iter().enumerate() {
            progress(i, units.len(), name);
            let Some(func) = m.get(name) else { continue };
            let c = Candidate {
                name,
                func,
                module: m,
            };
            let mut report = ClaimReport {
                function: name.clone(),
                ops: c.ops(),
                backend: None,
                fallback: false,
                declines: Vec::new(),
                compile_failures: Vec::new(),
            };
            let mut made = None;
            for b in &self.backends {
                match b.claim(&c) {
                    Claim::Decline { reason } => {
                        report.declines.push((b.name().to_string(), reason));
                    }
                    Claim::Accept => match make(b.as_ref(), &c) {
                        Ok(a) => {
                            report.backend = Some(b.name().to_string());
                            made = Some(a);
                            break;
                        }
                        Err(e) => report
                            .compile_failures
                            .push((b.name().to_string(), e.to_string())),
                    },
                }
            }
            let made = match made {
                Some(a) => a,
                None if pc.strict => {
                    let why: Vec<String> = report
                        .declines
                        .iter()
                        .map(|(b, r)| format!("declined by `{b}`: {r}"))
                        .chain(
                            report
                                .compile_failures
                                .iter()
                                .map(|(b, e)| format!("compile failed in `{b}`: {e}")),
                        )
                        .collect();
                    unclaimed.push(format!(
                        "`{name}` ({}) [{}]",
                        report.ops.join(", "),
                        why.join("; ")
                    ));
                    continue;
                }
                None => {
                    report.backend = Some("cpu".into());
                    report.fallback = true;
                    fallback(&c)?
                }
            };
            if strict_compile
                && pc.strict
                && report.backend.as_deref() == Some("cpu")
                && !report.compile_failures.is_empty()
            {
                for (b, e) in &report.compile_failures {
                    match broken.iter_mut().find(|(bb, ee, _)| bb == b && ee == e) {
                        Some((_, _, fs)) => fs.push(name.clone()),
                        None => broken.push((b.clone(), e.clone(), vec![name.clone()])),
                    }
                }
            }
            done.push((report, made));
        }
        progress(units.len(), units.len(), "");
        if pc.strict && !self.backends.iter().any(|b| b.name() == "cpu") {
            let mut deep_c = Vec::new();
            crate::ir::for_each_binding_deep(main, &main.blocks, &mut |b| deep_c.push(*b));
            for b in &deep_c {
                if let ExprKind::Call {
                    callee: Callee::Op(op),
                    ..
                } = &main.expr(b.value).kind
                {
                    unclaimed.push(format!("main/{} ({})", main.var(b.var).name, op.name()));
                }
            }
        }
        if !unclaimed.is_empty() {
            return Err(Error::Unclaimed(unclaimed.join("; ")));
        }
        if !broken.is_empty() {
            let why: Vec<String> = broken
                .iter()
                .map(|(b, e, fs)| {
                    let fs: Vec<String> = fs.iter().map(|f| format!("`{f}`")).collect();
                    format!("{} ({b}: {e})", fs.join(", "))
                })
                .collect();
            return Err(Error::CompileFailed(why.join("; ")));
        }
        Ok(done)
    }

    /// Partitions `module` and claims and compiles every unit (contract points 3 to 5).
    pub fn run(&self, module: &Module) -> Result<Plan> {
        self.run_inner(module, true)
    }

    /// [`BackendPipeline::run`] for a report (`partition --config`, `explain`): with
    /// `strict = true`, a unit the CPU runs because its backend could not compile it is
    /// reported (in its claim's `compile_failures`) instead of being an error, so the
    /// partition of a GPU config can be looked at on a machine without a GPU.
    pub fn run_for_report(&self, module: &Module) -> Result<Plan> {
        self.run_inner(module, false)
    }

    fn run_inner(&self, module: &Module, strict_compile: bool) -> Result<Plan> {
        let Partitioned {
            module: m,
            rejections,
            notes,
        } = self.partition_noted(module)?;
        let cpu = std::cell::OnceCell::new();
        let done = self.claim_each(
            &m,
            strict_compile,
            &|b, c| b.compile(c),
            &|c| {
                if cpu.get().is_none() {
                    let _ = cpu.set(make_backend("cpu", &toml::Table::new())?);
                }
                match cpu.get() {
                    Some(b) => b.compile(c),
                    None => Err(Error::Invalid("the cpu backend could not be made".into())),
                }
            },
            &mut |_, _, _| {},
        )?;
        let mut claims = Vec::new();
        let mut artifacts = BTreeMap::new();
        for (report, a) in done {
            artifacts.insert(report.function.clone(), a);
            claims.push(report);
        }
        Ok(Plan {
            module: m,
            rejections,
            claims,
            artifacts,
            notes,
        })
    }

    /// Partitions `module`, claims every unit and builds it ahead of time with
    /// [`Backend::build`] instead of compiling it for a device (what `fusebox compile` writes;
    /// a CUDA backend builds kernels without a GPU). A failed build falls through to the next
    /// backend that claims the unit, as a failed compile does; a unit no backend built runs on
    /// the CPU reference (or is an error with `strict = true`). `progress(done, total,
    /// function)` is called before each unit and once at the end.
    pub fn build(
        &self,
        module: &Module,
        progress: &mut dyn FnMut(usize, usize, &str),
    ) -> Result<BuildPlan> {
        let (m, rejections) = self.partition(module)?;
        let done = self.claim_each(&m, true, &|b, c| b.build(c), &|_| Ok(None), progress)?;
        Ok(BuildPlan {
            module: m,
            rejections,
            functions: done
                .into_iter()
                .map(|(claim, output)| BuiltFunction { claim, output })
                .collect(),
        })
    }
}

/// ConvertLayout of `input` into `data` / `kernel`, then FoldConstant with `evaluator` (when
/// there is one) for the moved constants.
fn convert_folded(
    input: &Module,
    data: &str,
    kernel: &str,
    max_plane: Option<u64>,
    evaluator: Option<&Evaluator>,
) -> Result<Module> {
    let c = crate::transform::convert_layout_within(input, data, kernel, max_plane)?;
    match evaluator {
        Some(eval) => crate::transform::fold_constant(&c, eval),
        None => Ok(c),
    }
}

/// `conv2d_layout = "auto"` on `input` (contract point 3): the layouts the first of
/// `backends` names for `target` ([`Backend::conv2d_layouts`]), ConvertLayout into them (with
/// the moved constants folded by `evaluator`), kept where
/// [`crate::transform::LayoutCost::pays`]. Besides converting every convolution into the first
/// layout it tries converting only those of input planes up to each smaller plane of the model
/// ([`crate::transform::convert_layout_within`]: the later, smaller stages of a network whose
/// early ones would leave layout changes), and keeps the one that pays by the largest
/// [`crate::transform::LayoutCost::margin`] (the first tried on a tie: every convolution).
/// Then the convolutions that choice left go into each further layout in turn (the `cpu`
/// backend on AVX2: `NCHW16c`, then `NCHW8c` for the layers of 24 channels and the stages
/// before them), kept where the margin, counted over all the layouts, grows. A further layout
/// takes only what the first leaves: the first is the one the backend's kernels run fastest
/// (`cpu`'s `NCHW8c` layers of MobileNetV2's later stages took 1.04–1.10 of their `NCHW16c`
/// time on AVX2, bench/RESULTS.md session bv), which the margin does not see. Returns the
/// converted module when one is kept, and a note saying what was chosen, or why the layouts
/// were kept (none when no backend names a layout, or when no convolution would move).
pub fn auto_conv2d_layout(
    input: &Module,
    backends: &[&dyn Backend],
    target: crate::config::Target,
    evaluator: Option<&Evaluator>,
) -> Result<(Option<Module>, Option<String>)> {
    let Some((backend, layouts)) = backends.iter().find_map(|b| {
        let l = b.conv2d_layouts(target);
        (!l.is_empty()).then(|| (b.name().to_string(), l))
    }) else {
        return Ok((None, None));
    };
    let datas: Vec<&str> = layouts.iter().map(|[d, _]| d.as_str()).collect();
    let cost = |m: &Module| crate::transform::layout_cost_of(m, &datas);
    let before = cost(input);
    if before.convs == 0 {
        // Nothing to convert (a transformer): no pass over the module.
        return Ok((None, None));
    }
    // A conversion: the module, its cost, and per layout used the plane limit it had.
    type Tried = (
        Module,
        crate::transform::LayoutCost,
        Vec<(usize, Option<u64>)>,
    );
    let mut best: Option<Tried> = None;
    let offer = |best: &mut Option<Tried>, c: Module, used: Vec<(usize, Option<u64>)>| {
        let after = cost(&c);
        if after.pays(&before)
            && best
                .as_ref()
                .is_none_or(|(_, b, _)| after.margin(&before) > b.margin(&before))
        {
            *best = Some((c, after, used));
        }
        after
    };
    let [data, kernel] = &layouts[0];
    // Every convolution, then those of each smaller plane and below.
    let planes = crate::transform::conv_planes(input);
    let limits = std::iter::once(None).chain(planes.iter().skip(1).map(|&p| Some(p)));
    let mut whole = None;
    for limit in limits {
        let c = convert_folded(input, data, kernel, limit, evaluator)?;
        whole.get_or_insert(offer(&mut best, c, vec![(0, limit)]));
    }
    // The convolutions the first layout's choice left (all of them when none paid), into
    // each further layout in turn, kept where that pays by a larger margin.
    for (i, [d, k]) in layouts.iter().enumerate().skip(1) {
        let (from, mut used) = match &best {
            Some((m, _, used)) => (m.clone(), used.clone()),
            None => (input.clone(), Vec::new()),
        };
        used.push((i, None));
        let c = convert_folded(&from, d, k, None, evaluator)?;
        offer(&mut best, c, used);
    }
    if let Some((c, after, used)) = best {
        let parts: Vec<String> = used
            .iter()
            .enumerate()
            .map(|(n, &(i, limit))| {
                let [d, k] = &layouts[i];
                let count = crate::transform::layout_cost(&c, d).converted;
                let which = match limit {
                    None => String::new(),
                    Some(p) => format!("; those of input planes up to {p} pixels"),
                };
                if n == 0 {
                    format!(
                        "{count} of {} conv2d in {d}/{k} (backend {backend}'s layout on this \
                         machine{which})",
                        after.convs
                    )
                } else {
                    format!("{count} in {d}/{k} (the convolutions left)")
                }
            })
            .collect();
        let note = format!(
            "conv2d_layout \"auto\": {}, {} layout change(s) left at run time",
            parts.join(", "),
            after.moves.saturating_sub(before.moves),
        );
        return Ok((Some(c), Some(note)));
    }
    let note = whole
        .filter(|after| after.converted > before.converted)
        .map(|after| {
            format!(
                "conv2d_layout \"auto\": layouts kept; {data}/{kernel} (backend {backend}'s \
                 layout) would convert {} of {} conv2d but leave {} layout change(s) moving {} \
                 elements at run time (the convolutions write {})",
                after.converted,
                after.convs,
                after.moves.saturating_sub(before.moves),
                after.moved_elems.saturating_sub(before.moved_elems),
                after.conv_elems.saturating_add(after.depthwise_elems),
            )
        });
    Ok((None, note))
}

/// The module functions `main` calls, in first-call order.
fn called_from(main: &Function) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    // Calls inside the branches of an `if` too.
    let mut all = Vec::new();
    crate::ir::for_each_binding_deep(main, &main.blocks, &mut |b| all.push(*b));
    for b in &all {
        if let ExprKind::Call {
            callee: Callee::Global(g),
            ..
        } = &main.expr(b.value).kind
            && !out.iter().any(|o| o == g.as_ref())
        {
            out.push(g.to_string());
        }
    }
    out
}

fn build_table(config: &Config, backends: &[Box<dyn Backend>]) -> Result<Vec<TableEntry>> {
    let names: Vec<&str> = backends.iter().map(|b| b.name()).collect();
    let mut groups: Vec<Vec<TableEntry>> = backends
        .iter()
        .map(|b| {
            b.patterns_for(config.target)
                .into_iter()
                .map(|p| TableEntry {
                    pattern: p,
                    backend: Some(b.name().to_string()),
                    user: false,
                })
                .collect()
        })
        .collect();
    let mut rest = Vec::new();
    for up in &config.patterns {
        let group = match (&up.backend, &up.backend_span) {
            (Some(b), Some(span)) => match names.iter().position(|n| n == b) {
                Some(i) => Some(i),
                None => {
                    return Err(config.error_at(
                        span.clone(),
                        Error::unknown(
                            "backend (not enabled in [[backend]])",
                            b.clone(),
                            registry::valid_list(names.iter().copied()),
                        )
                        .to_string(),
                    ));
                }
            },
            _ => up
                .pattern
                .codegen()
                .and_then(|cg| names.iter().position(|n| *n == cg)),
        };
        let entry = TableEntry {
            pattern: up.pattern.clone(),
            backend: group.map(|i| names[i].to_string()),
            user: true,
        };
        match group.and_then(|i| groups.get_mut(i)) {
            Some(g) => g.push(entry),
            None => rest.push(entry),
        }
    }
    let mut table = Vec::new();
    for mut g in groups.into_iter().chain(std::iter::once(rest)) {
        g.sort_by_key(|e| std::cmp::Reverse(e.pattern.priority));
        table.extend(g);
    }
    Ok(table)
}
