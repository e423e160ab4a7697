//! Passes and pipelines: a [`Pass`] maps a module to a module; a [`Pipeline`] runs passes in
//! order.
//!
//! Contract: [`Pipeline::run`] runs each pass on the previous pass's output, records each
//! pass's wall time, and — in debug and test builds — verifies the module after every pass,
//! failing with the pass's name when a pass breaks an invariant. The first failing pass stops
//! the pipeline. The seed's recommendation is spelled [`Pipeline::recommended`]:
//!
//! ```text
//! Pipeline: dead_code_elimination → fuse_ops(opt_level=2, max_depth=256)
//! ; before                        ; after
//! a = R.exp(x)   ; unused         gv = cls.fused_relu_exp(x)
//! b = R.nn.relu(x)
//! gv = R.exp(b)
//! ```

use super::fuse_ops::{DEFAULT_MAX_DEPTH, DEFAULT_OPT_LEVEL};
use crate::error::{Error, Result};
use crate::ir::Module;
use crate::ir::verify::verify;
use std::time::Instant;

/// A module-to-module transformation.
pub trait Pass {
    /// The pass's name (`fuse_ops`), used in timings and errors.
    fn name(&self) -> &str;
    /// Runs the pass.
    fn run(&self, m: &Module) -> Result<Module>;
}

/// The time one pass took.
#[derive(Clone, Debug, PartialEq)]
pub struct PassTiming {
    /// The pass's name.
    pub name: String,
    /// Wall time in milliseconds.
    pub ms: f64,
}

/// Passes run in order.
#[derive(Default)]
pub struct Pipeline {
    passes: Vec<Box<dyn Pass>>,
}

impl Pipeline {
    /// An empty pipeline.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a pass.
    pub fn then(mut self, p: impl Pass + 'static) -> Self {
        self.passes.push(Box::new(p));
        self
    }

    /// `DeadCodeElimination → FuseOps(opt_level=2)`, the seed's recommended order.
    pub fn recommended() -> Self {
        Pipeline::new()
            .then(DeadCodeElimination)
            .then(FuseOps::default())
    }

    /// The names of the passes, in order.
    pub fn names(&self) -> Vec<&str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// Runs every pass (see the module doc).
    pub fn run(&self, m: &Module) -> Result<(Module, Vec<PassTiming>)> {
        let mut cur = m.clone();
        let mut timings = Vec::with_capacity(self.passes.len());
        for p in &self.passes {
            let t = Instant::now();
            let next = p.run(&cur)?;
            timings.push(PassTiming {
                name: p.name().to_string(),
                ms: t.elapsed().as_secs_f64() * 1e3,
            });
            if cfg!(debug_assertions) {
                verify(&next).map_err(|e| {
                    Error::Invalid(format!(
                        "the module does not verify after pass `{}`: {e}",
                        p.name()
                    ))
                })?;
            }
            cur = next;
        }
        Ok((cur, timings))
    }
}

/// [`dead_code_elimination`](super::dead_code_elimination()) as a pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct DeadCodeElimination;

impl Pass for DeadCodeElimination {
    fn name(&self) -> &str {
        "dead_code_elimination"
    }
    fn run(&self, m: &Module) -> Result<Module> {
        super::dead_code_elimination(m)
    }
}

/// [`fold_batch_norm`](super::fold_batch_norm()) as a pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct FoldBatchNorm;

impl Pass for FoldBatchNorm {
    fn name(&self) -> &str {
        "fold_batch_norm"
    }
    fn run(&self, m: &Module) -> Result<Module> {
        super::fold_batch_norm(m)
    }
}

/// [`fold_constant`](super::fold_constant()) as a pass, with its evaluator.
#[derive(Clone)]
pub struct FoldConstant {
    /// Evaluates one op on constants (the CPU reference's `eval_op`).
    pub eval: super::Evaluator,
}

impl Pass for FoldConstant {
    fn name(&self) -> &str {
        "fold_constant"
    }
    fn run(&self, m: &Module) -> Result<Module> {
        super::fold_constant(m, &self.eval)
    }
}

/// [`remove_identity`](super::remove_identity()) as a pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct RemoveIdentity;

impl Pass for RemoveIdentity {
    fn name(&self) -> &str {
        "remove_identity"
    }
    fn run(&self, m: &Module) -> Result<Module> {
        super::remove_identity(m)
    }
}

/// [`remove_export_noise`](super::remove_export_noise()) as a pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct RemoveExportNoise;

impl Pass for RemoveExportNoise {
    fn name(&self) -> &str {
        "remove_export_noise"
    }
    fn run(&self, m: &Module) -> Result<Module> {
        super::remove_export_noise(m)
    }
}

/// [`eliminate_common_subexpr`](super::eliminate_common_subexpr()) as a pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct EliminateCommonSubexpr;

impl Pass for EliminateCommonSubexpr {
    fn name(&self) -> &str {
        "eliminate_common_subexpr"
    }
    fn run(&self, m: &Module) -> Result<Module> {
        super::eliminate_common_subexpr(m)
    }
}

/// [`einsum_to_matmul`](super::einsum_to_matmul()) as a pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct EinsumToMatmul;

impl Pass for EinsumToMatmul {
    fn name(&self) -> &str {
        "einsum_to_matmul"
    }
    fn run(&self, m: &Module) -> Result<Module> {
        super::einsum_to_matmul(m)
    }
}

/// [`unflatten_matmul`](super::unflatten_matmul()) as a pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct UnflattenMatmul;

impl Pass for UnflattenMatmul {
    fn name(&self) -> &str {
        "unflatten_matmul"
    }
    fn run(&self, m: &Module) -> Result<Module> {
        super::unflatten_matmul(m)
    }
}

/// [`compose_permutes`](super::compose_permutes()) as a pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct ComposePermutes;

impl Pass for ComposePermutes {
    fn name(&self) -> &str {
        "compose_permutes"
    }
    fn run(&self, m: &Module) -> Result<Module> {
        super::compose_permutes(m)
    }
}

/// [`fuse_ops`](super::fuse_ops()) as a pass.
#[derive(Clone, Copy, Debug)]
pub struct FuseOps {
    /// 0: nothing, 1: elementwise/broadcast chains, 2: everything.
    pub opt_level: u32,
    /// The most bindings in one group.
    pub max_depth: usize,
    /// Also outline lone op calls into one-binding primitive functions (for device targets).
    pub lift_single_ops: bool,
}

impl Default for FuseOps {
    fn default() -> Self {
        FuseOps {
            opt_level: DEFAULT_OPT_LEVEL,
            max_depth: DEFAULT_MAX_DEPTH,
            lift_single_ops: false,
        }
    }
}

impl Pass for FuseOps {
    fn name(&self) -> &str {
        "fuse_ops"
    }
    fn run(&self, m: &Module) -> Result<Module> {
        super::fuse_ops::fuse_ops_lifting(m, self.opt_level, self.max_depth, self.lift_single_ops)
    }
}

/// [`merge_composite_functions`](super::merge_composite_functions()) as a pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct MergeCompositeFunctions;

impl Pass for MergeCompositeFunctions {
    fn name(&self) -> &str {
        "merge_composite_functions"
    }
    fn run(&self, m: &Module) -> Result<Module> {
        super::merge_composite_functions(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::{parse_module_str, print_module};

    #[test]
    fn recommended_pipeline_removes_dead_code_then_fuses() {
        let src = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((4,), dtype="float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.nn.relu(x)
            gv = R.exp(b)
            R.output(gv)
        return gv
"#;
        let m = match parse_module_str(src) {
            Ok(m) => m,
            Err(e) => panic!("{e}"),
        };
        let p = Pipeline::recommended();
        assert_eq!(p.names(), vec!["dead_code_elimination", "fuse_ops"]);
        let (out, timings) = match p.run(&m) {
            Ok(o) => o,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(timings.len(), 2);
        let s = print_module(&out).text;
        assert!(s.contains("def fused_relu_exp("), "{s}");
        assert_eq!(s.matches("R.exp(").count(), 1, "{s}");
    }
}
