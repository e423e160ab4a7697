//! Partitioning as `fusebox partition` does it, for the CLI and the Python package alike: with
//! a pattern table and the partition flags, or with a config's backend pipeline; and the
//! listing of a config's backends and pattern table (`fusebox backends`).
//!
//! Contract:
//!
//! - [`partition_with_patterns`] (no config): the table sorted by priority
//!   ([`fusebox_core::transform::sort_by_priority`]) → FuseOpsByPattern (`bind_constants`,
//!   `annotate_codegen`) → MergeCompositeFunctions if `merge` → FuseOps (`fuse_opt_level`,
//!   `max_depth`) if `fuse_ops` → the verifier. No inference simplification: the module is
//!   partitioned as given, as TVM's FuseOpsByPattern does.
//! - [`partition_with_config`]: the config's backend pipeline
//!   ([`fusebox_core::backend::pipeline::BackendPipeline::run_for_report`]: simplification,
//!   patterns of every backend and the config's, claims, compile) → the verifier.
//!   [`add_user_patterns`] adds a table to a config as `[[pattern]]` entries of no backend.
//! - [`backend_listing`]: every backend of the pipeline in order with its patterns, highest
//!   priority first; the user patterns of no enabled backend; the lint findings on the
//!   combined table.
//!
//! ```text
//! partition_with_patterns(conv2d_relu_x2, [dnnl.conv2d_relu], fuse_ops = false)
//!   main: lv = conv2d(x, w); gv = relu(lv) ...   ->   main: gv = fused_..._dnnl(x, w) ...
//! ```

use fusebox_core::backend::pipeline::{BackendPipeline, Plan};
use fusebox_core::config::{Config, UserPattern};
use fusebox_core::ir::Module;
use fusebox_core::ir::verify::verify;
use fusebox_core::pattern_table::LintFinding;
use fusebox_core::transform::pass::PassTiming;
use fusebox_core::transform::{FusionPattern, Rejection};
use std::time::Instant;

/// The partition flags of `fusebox partition` without a config.
#[derive(Clone, Debug)]
pub struct PatternPartition {
    /// The pattern table, in any order (it is sorted by priority).
    pub patterns: Vec<FusionPattern>,
    /// Keep constants inside composites (else they become parameters).
    pub bind_constants: bool,
    /// Wrap each composite in a public function with `Codegen`.
    pub annotate_codegen: bool,
    /// MergeCompositeFunctions after the pattern partition.
    pub merge: bool,
    /// FuseOps after the pattern partition (and after the merge).
    pub fuse_ops: bool,
    /// FuseOps level: 0, 1 or 2.
    pub fuse_opt_level: u32,
    /// FuseOps: the most bindings in one group.
    pub max_depth: usize,
}

impl Default for PatternPartition {
    /// The CLI's defaults: no patterns, constants bound, no `Codegen` wrappers, no merge, no
    /// FuseOps (level 2 and depth 256 when it is asked for).
    fn default() -> Self {
        PatternPartition {
            patterns: Vec::new(),
            bind_constants: true,
            annotate_codegen: false,
            merge: false,
            fuse_ops: false,
            fuse_opt_level: 2,
            max_depth: 256,
        }
    }
}

/// What [`partition_with_patterns`] made.
pub struct Partitioned {
    /// The partitioned, verified module.
    pub module: Module,
    /// Every rejected pattern match.
    pub rejections: Vec<Rejection>,
    /// Milliseconds spent in FuseOpsByPattern and MergeCompositeFunctions.
    pub partition_ms: f64,
    /// The time of each pass FuseOps ran (empty without `fuse_ops`).
    pub pass_times: Vec<PassTiming>,
}

impl Partitioned {
    /// The JSON report (no claims: nothing was offered to a backend).
    pub fn report(&self) -> fusebox_core::report::Report {
        fusebox_core::report::build(&self.module, &self.rejections)
    }
}

/// Partitions `m` with a pattern table and the flags (see the module doc).
pub fn partition_with_patterns(m: &Module, opts: &PatternPartition) -> crate::Result<Partitioned> {
    use fusebox_core::transform::{PartitionOptions, fuse_ops_by_pattern, sort_by_priority};
    let mut table = opts.patterns.clone();
    sort_by_priority(&mut table);
    let t = Instant::now();
    let popts = PartitionOptions {
        bind_constants: opts.bind_constants,
        annotate_codegen: opts.annotate_codegen,
    };
    let mut out = fuse_ops_by_pattern(m, &table, popts)?;
    if opts.merge {
        out.module = fusebox_core::transform::merge_composite_functions(&out.module)?;
    }
    let partition_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut pass_times = Vec::new();
    if opts.fuse_ops {
        use fusebox_core::transform::{Pipeline, pass::FuseOps};
        let pipeline = Pipeline::new().then(FuseOps {
            opt_level: opts.fuse_opt_level,
            max_depth: opts.max_depth,
            lift_single_ops: false,
        });
        let (module, times) = pipeline.run(&out.module)?;
        out.module = module;
        pass_times = times;
    }
    verify(&out.module).map_err(fusebox_core::Error::Verify)?;
    Ok(Partitioned {
        module: out.module,
        rejections: out.rejections,
        partition_ms,
        pass_times,
    })
}

/// Adds `table` to `cfg` as `[[pattern]]` entries that name no backend (what `partition
/// --config C --patterns P` does with P).
pub fn add_user_patterns(cfg: &mut Config, table: Vec<FusionPattern>) {
    for pattern in table {
        cfg.patterns.push(UserPattern {
            pattern,
            backend: None,
            backend_span: None,
        });
    }
}

/// Partitions, claims and compiles `m` with the pipeline for a report (a function whose
/// backend could not compile it is reported, not an error: see
/// [`BackendPipeline::run_for_report`]), then verifies the partitioned module.
pub fn partition_with_config(pipeline: &BackendPipeline, m: &Module) -> crate::Result<Plan> {
    let plan = pipeline.run_for_report(m)?;
    verify(&plan.module).map_err(fusebox_core::Error::Verify)?;
    Ok(plan)
}

/// One pattern of a [`backend_listing`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedPattern {
    /// The entry's name.
    pub name: String,
    /// Its priority.
    pub priority: i32,
    /// The stock check it runs, if any.
    pub check: Option<String>,
    /// Whether it came from the config's `[[pattern]]` tables.
    pub user: bool,
    /// The pattern in the text syntax.
    pub pattern: String,
}

/// One backend of a [`backend_listing`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedBackend {
    /// The backend's name.
    pub name: String,
    /// Where it comes from (`built-in`, a plugin library and its version).
    pub origin: String,
    /// Its patterns, highest priority first (ties in table order).
    pub patterns: Vec<ListedPattern>,
}

/// What `fusebox backends` shows (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendListing {
    /// Every enabled backend, in order.
    pub backends: Vec<ListedBackend>,
    /// The user patterns of no enabled backend, in table order.
    pub unassigned: Vec<ListedPattern>,
    /// The lint findings on the combined table.
    pub lint: Vec<LintFinding>,
}

/// Lists the pipeline's backends, their patterns and the table's lint findings.
pub fn backend_listing(pipeline: &BackendPipeline) -> BackendListing {
    let listed = |e: &fusebox_core::backend::pipeline::TableEntry| ListedPattern {
        name: e.pattern.name.clone(),
        priority: e.pattern.priority,
        check: e.pattern.check.as_ref().map(|c| c.name().to_string()),
        user: e.user,
        pattern: e.pattern.pattern.to_string(),
    };
    let backends = pipeline
        .backends
        .iter()
        .map(|b| {
            let mut pats: Vec<_> = pipeline
                .table
                .iter()
                .filter(|e| e.backend.as_deref() == Some(b.name()))
                .collect();
            pats.sort_by_key(|e| std::cmp::Reverse(e.pattern.priority));
            ListedBackend {
                name: b.name().to_string(),
                origin: b.origin(),
                patterns: pats.into_iter().map(listed).collect(),
            }
        })
        .collect();
    let unassigned = pipeline
        .table
        .iter()
        .filter(|e| e.backend.is_none())
        .map(listed)
        .collect();
    BackendListing {
        backends,
        unassigned,
        lint: fusebox_core::pattern_table::lint(&pipeline.patterns()),
    }
}
