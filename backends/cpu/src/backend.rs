//! The `cpu` backend: claims every function and runs it with the reference interpreter.
//!
//! Contract: registered as `cpu` with `inventory::submit!`; takes one option, `threads` (an
//! integer from 1 to [`crate::par::MAX_THREADS`]: the thread count of the CPU kernels in this
//! process, as `FUSEBOX_THREADS` but winning over it; any other option or value is an error
//! naming it); its patterns are the transformer table [`TRANSFORMER_PATTERNS`]
//! (`patterns/transformer.toml`: attention, residual LayerNorm, RMSNorm, GELU), offered to
//! configs whose target is the CPU only; for `conv2d_layout = "auto"` it names `NCHW16c` /
//! `OIHW` on a CPU target where its blocked kernels run (AVX-512 or AVX2), and on AVX2
//! `NCHW8c` / `OIHW` after it, for the convolutions whose channels split by 8 only
//! ([`Backend::conv2d_layouts`]); [`CpuBackend::claim`]
//! accepts everything; `compile` keeps the function with its callees as a standalone module
//! and runs it with a [`crate::Executor`] of its own (constants decoded once, on the first
//! run). Its artifacts say
//! [`Artifact::is_reference`], so the facade's `execute_with` runs those functions inline in
//! the main executor instead (the same evaluation, with fused chains across the calls); the
//! executor runs the transformer composites with fused kernels (`composite.rs`).
//!
//! ```
//! // Linked through the facade's `fusebox_cpu::link()`:
//! fusebox_cpu::link();
//! let b = fusebox_core::backend::make_backend("cpu", &Default::default()).unwrap();
//! assert_eq!(b.name(), "cpu");
//! ```

use fusebox_core::backend::registry::check_options;
use fusebox_core::backend::{Artifact, Backend, BackendRegistration, Candidate, Claim};
use fusebox_core::config::Target;
use fusebox_core::ir::Module;
use fusebox_core::runtime::Value;
use fusebox_core::transform::FusionPattern;

/// The CPU reference backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

fn make(options: &toml::Table) -> fusebox_core::Result<Box<dyn Backend>> {
    check_options("cpu", options, &["threads"])?;
    if let Some(v) = options.get("threads") {
        let n = v
            .as_integer()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| (1..=crate::par::MAX_THREADS).contains(n))
            .ok_or_else(|| fusebox_core::Error::Backend {
                backend: "cpu".into(),
                message: format!(
                    "option `threads`: expected an integer from 1 to {}, found {v}",
                    crate::par::MAX_THREADS
                ),
            })?;
        crate::par::set_threads(Some(n));
    }
    Ok(Box::new(CpuBackend))
}

inventory::submit! {
    BackendRegistration { name: "cpu", make }
}

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }
    fn patterns(&self) -> Vec<FusionPattern> {
        transformer_patterns().to_vec()
    }
    fn patterns_for(&self, target: Target) -> Vec<FusionPattern> {
        // On a GPU target the CPU is the fallback: its patterns would pull work off the device.
        match target {
            Target::Cpu => self.patterns(),
            _ => Vec::new(),
        }
    }
    fn conv2d_layout(&self, target: Target) -> Option<[String; 2]> {
        self.conv2d_layouts(target).into_iter().next()
    }
    fn conv2d_layouts(&self, target: Target) -> Vec<[String; 2]> {
        // `NCHW16c` where its kernels run (a block of 16 channels is one AVX-512 vector or
        // two AVX2 ones), then on AVX2 `NCHW8c` (one vector) for channel counts that split
        // by 8 only; on a GPU target the CPU is the fallback and chooses nothing.
        if target != Target::Cpu {
            return Vec::new();
        }
        crate::conv::blocked_blocks(crate::simd::f32_lanes())
            .into_iter()
            .map(|b| [crate::conv::blocked_layout(b), "OIHW".to_string()])
            .collect()
    }
    fn claim(&self, _c: &Candidate<'_>) -> Claim {
        Claim::Accept
    }
    fn compile(&self, c: &Candidate<'_>) -> fusebox_core::Result<Box<dyn Artifact>> {
        Ok(Box::new(CpuArtifact {
            module: std::sync::Arc::new(c.standalone_module()),
            name: c.name.to_string(),
            exec: crate::Executor::new(),
        }))
    }
}

/// The transformer pattern table the backend ships, as TOML in the `[[pattern]]` syntax users
/// write (so it can be copied into a config).
pub const TRANSFORMER_PATTERNS: &str = include_str!("../patterns/transformer.toml");

/// [`TRANSFORMER_PATTERNS`], parsed once; empty if it failed to parse (a test asserts it parses).
pub fn transformer_patterns() -> &'static [FusionPattern] {
    static TABLE: std::sync::OnceLock<Vec<FusionPattern>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        fusebox_core::pattern_table::parse_pattern_table(
            TRANSFORMER_PATTERNS,
            "backends/cpu/patterns/transformer.toml",
        )
        .unwrap_or_default()
    })
}

/// A function run by the interpreter (its module shared, so the executor pins it: see
/// [`crate::Executor::run_shared`]).
struct CpuArtifact {
    module: std::sync::Arc<Module>,
    name: String,
    exec: crate::Executor,
}

impl Artifact for CpuArtifact {
    fn run(&self, args: &[Value]) -> fusebox_core::Result<Value> {
        self.exec
            .run_shared(&self.module, &self.name, args.to_vec(), None)
            .map_err(|e| fusebox_core::Error::Backend {
                backend: "cpu".into(),
                message: e.to_string(),
            })
    }
    fn is_reference(&self) -> bool {
        true
    }
}
