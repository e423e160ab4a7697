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

pub mod pipeline;
pub mod registry;

pub use registry::{BackendRegistration, make_backend, registered_names};

use crate::error::Result;
use crate::ir::{Callee, ExprKind, Function, Module};
use crate::runtime::Value;
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
    for b in f.bindings() {
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
    /// Whether it takes `c`.
    fn claim(&self, c: &Candidate<'_>) -> Claim;
    /// Compiles a claimed function.
    fn compile(&self, c: &Candidate<'_>) -> Result<Box<dyn Artifact>>;
}
