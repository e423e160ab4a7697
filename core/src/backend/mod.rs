//! Backends: what claims a fused function and compiles it into something that runs.
//!
//! Contract:
//!
//! - A [`Backend`] has a name, a pattern table ([`FusionPattern`]s with priorities and optional
//!   checks), a [`Backend::claim`] that accepts a function or declines it with a reason, and a
//!   [`Backend::compile`] that turns a claimed function into an [`Artifact`]. An artifact runs on
//!   the executor's [`Value`]s.
//! - Both `claim` and `compile` see a [`Candidate`]: the function's name, the function, and the
//!   module it lives in (so a backend can print the function with its callees, see
//!   [`Candidate::standalone_module`]). This is the brief's `claim(&Function)` /
//!   `compile(&Function, &Module)` with the name added, which running a function needs.
//! - Built-in backends register themselves with `inventory::submit!` of a
//!   [`BackendRegistration`] (see [`registry`]); plugins come through `fusebox-plugin-host`.
//! - [`pipeline`] builds the partition → claim → compile flow from a [`crate::config::Config`].
//! - Ahead of time: [`Backend::build`] turns a claimed function into files (source, CUBIN, …)
//!   and a description of its kernels ([`BuildOutput`]) without needing the device it will run
//!   on, which is what `fusebox compile` writes out. The default builds nothing (`Ok(None)`):
//!   the function is listed with its backend and no files.
//! - An artifact says where it wants its arguments ([`Artifact::placement`]): host artifacts
//!   (the default) get host tensors, device artifacts get values as they are.
//!
//! ```
//! use fusebox_core::backend::{Artifact, Backend, Candidate, Claim};
//! use fusebox_core::runtime::Value;
//! use fusebox_core::transform::FusionPattern;
//!
//! struct Nothing;
//! impl Backend for Nothing {
//!     fn name(&self) -> &str { "nothing" }
//!     fn patterns(&self) -> Vec<FusionPattern> { Vec::new() }
//!     fn claim(&self, c: &Candidate<'_>) -> Claim {
//!         Claim::Decline { reason: format!("`{}` is not mine", c.name) }
//!     }
//!     fn compile(&self, c: &Candidate<'_>) -> fusebox_core::Result<Box<dyn Artifact>> {
//!         Err(fusebox_core::Error::Backend { backend: "nothing".into(), message: c.name.into() })
//!     }
//! }
//! ```

mod explain;
pub mod pipeline;
pub mod registry;

pub use registry::{BackendRegistration, make_backend, registered_names};

use crate::error::Result;
use crate::ir::{Callee, ExprKind, Function, Module};
use crate::runtime::{Placement, Value};
use crate::transform::FusionPattern;

/// A backend's answer to "will you take this function?".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The backend takes it.
    Accept,
    /// The backend does not take it, and says why.
    Decline {
        /// Why, in words a user can act on.
        reason: String,
    },
}

/// A function offered to a backend.
#[derive(Clone, Copy, Debug)]
pub struct Candidate<'a> {
    /// The function's name in the module.
    pub name: &'a str,
    /// The function.
    pub func: &'a Function,
    /// The module it belongs to.
    pub module: &'a Module,
}

impl Candidate<'_> {
    /// The candidate's `Composite` attribute, or the inner composites' for a `Codegen` wrapper
    /// or region, in binding order.
    pub fn composites(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(c) = &self.func.attrs.composite {
            out.push(c.clone());
        }
        for b in self.func.bindings() {
            if let ExprKind::Function(inner) = &self.func.expr(b.value).kind
                && let Some(c) = &inner.attrs.composite
            {
                out.push(c.clone());
            }
        }
        out
    }

    /// A module holding just this function (renamed nothing) and every module function it calls,
    /// transitively, in the original module order: what crosses a plugin boundary as text.
    pub fn standalone_module(&self) -> Module {
        let mut keep = std::collections::BTreeSet::new();
        let mut todo = vec![self.name.to_string()];
        while let Some(n) = todo.pop() {
            if !keep.insert(n.clone()) {
                continue;
            }
            if let Some(f) = self.module.get(&n) {
                collect_globals(f, &mut todo);
            }
        }
        let mut m = Module::new();
        for (n, f) in &self.module.functions {
            if keep.contains(n) {
                m.insert(n.clone(), f.clone());
            }
        }
        m
    }

    /// The op names inside the function (local functions included), in binding order.
    pub fn ops(&self) -> Vec<String> {
        let mut out = Vec::new();
        collect_ops(self.func, &mut out);
        out
    }
}

fn collect_globals(f: &Function, out: &mut Vec<String>) {
    for (_, d) in f.exprs.iter() {
        match &d.kind {
            ExprKind::Call {
                callee: Callee::Global(g),
                ..
            } => out.push(g.to_string()),
            ExprKind::Function(inner) => collect_globals(inner, out),
            _ => {}
        }
    }
}

fn collect_ops(f: &Function, out: &mut Vec<String>) {
    let mut all = Vec::new();
    crate::ir::for_each_binding_deep(f, &f.blocks, &mut |b| all.push(*b));
    for b in &all {
        match &f.expr(b.value).kind {
            ExprKind::Call {
                callee: Callee::Op(op),
                ..
            } => out.push(op.name().to_string()),
            ExprKind::Function(inner) => collect_ops(inner, out),
            _ => {}
        }
    }
}

/// A compiled function: runs on the executor's values.
pub trait Artifact: Send + Sync {
    /// Runs the function on `args` (one value per parameter) and returns its result.
    fn run(&self, args: &[Value]) -> Result<Value>;
    /// Where it wants its arguments: [`Placement::Host`] (the default) means the executor
    /// downloads device values before calling [`Artifact::run`]; [`Placement::Device`] means
    /// they are passed as they are.
    fn placement(&self) -> Placement {
        Placement::Host
    }
    /// Whether running it is exactly the CPU reference interpreter's evaluation of the
    /// function (the `cpu` backend's artifacts): the executor may then run the function
    /// inline, and fuse its ops with the caller's (the result is the same bit for bit).
    fn is_reference(&self) -> bool {
        false
    }
}

/// One kernel of a built function and its launch configuration.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KernelInfo {
    /// The kernel's symbol (its `extern "C"` name in the built code).
    pub name: String,
    /// Grid size in blocks (x, y, z).
    pub grid: [u32; 3],
    /// Block size in threads (x, y, z).
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

/// What [`Backend::build`] makes of a function ahead of time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BuildOutput {
    /// Files to write: (file name, contents), e.g. `("fused_add.cu", source)`,
    /// `("fused_add.cubin", cubin)`. A file name is a plain name: no directories.
    pub files: Vec<(String, Vec<u8>)>,
    /// The kernels, in launch order.
    pub kernels: Vec<KernelInfo>,
    /// The target architecture the files are for (`sm_90a`), when there is one.
    pub arch: Option<String>,
}

/// A backend (see the module doc).
pub trait Backend: Send + Sync {
    /// The backend's unique name (`cpu`, `example`).
    fn name(&self) -> &str;
    /// Where it comes from, for `fusebox backends` (`built-in`, a library path and version).
    fn origin(&self) -> String {
        "built-in".to_string()
    }
    /// Its pattern table, in its own order (the pipeline sorts by priority, stably).
    fn patterns(&self) -> Vec<FusionPattern>;
    /// The patterns it offers a config of `target` (the pipeline's table): by default all of
    /// [`Backend::patterns`]. The `cpu` backend offers its transformer patterns to CPU configs
    /// only, so a GPU config's LayerNorms and attention stay on the device.
    fn patterns_for(&self, target: crate::config::Target) -> Vec<FusionPattern> {
        let _ = target;
        self.patterns()
    }
    /// The `[data, kernel]` layouts it would have every `conv2d` of a `target` config in, on
    /// this machine, when the config leaves the choice to the backends (`conv2d_layout =
    /// "auto"`, the default); `None` (the default): the model's own. The pipeline asks the
    /// backends in order ([`Backend::conv2d_layouts`], which lists this one first) and keeps
    /// the first answer's conversion where it pays ([`crate::transform::LayoutCost::pays`]).
    fn conv2d_layout(&self, target: crate::config::Target) -> Option<[String; 2]> {
        let _ = target;
        None
    }
    /// Every `[data, kernel]` pair it runs convolutions in on this machine, the preferred
    /// first (by default [`Backend::conv2d_layout`]'s alone): with `conv2d_layout = "auto"`
    /// the pipeline converts into the first where the channels split and may convert the
    /// convolutions left into the next (`cpu` on AVX2: `NCHW16c`, then `NCHW8c` for 24
    /// channels).
    fn conv2d_layouts(&self, target: crate::config::Target) -> Vec<[String; 2]> {
        self.conv2d_layout(target).into_iter().collect()
    }
    /// Whether it takes `c`.
    fn claim(&self, c: &Candidate<'_>) -> Claim;
    /// Compiles a claimed function.
    fn compile(&self, c: &Candidate<'_>) -> Result<Box<dyn Artifact>>;
    /// Builds a claimed function ahead of time, without the device it will run on: files and
    /// kernel descriptions for `fusebox compile`. `Ok(None)` (the default) means there is
    /// nothing to build ahead of time (the CPU reference, plugins).
    fn build(&self, c: &Candidate<'_>) -> Result<Option<BuildOutput>> {
        let _ = c;
        Ok(None)
    }
}
