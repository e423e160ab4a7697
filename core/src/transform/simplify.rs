//! Inference simplification: the passes that run after import and before partitioning, so
//! patterns and FuseOps see `conv2d → add → relu` rather than what the exporter wrote.
//!
//! Contract: [`simplify_pipeline`] is, in order,
//! [`FoldConstant`](super::fold_constant()) (only with an [`Evaluator`]: core has no kernels) →
//! [`RemoveIdentity`](super::remove_identity()) → [`RemoveExportNoise`](super::remove_export_noise())
//! → [`EliminateCommonSubexpr`](super::eliminate_common_subexpr()) →
//! [`EinsumToMatmul`](super::einsum_to_matmul()) → [`UnflattenMatmul`](super::unflatten_matmul()) →
//! [`ComposePermutes`](super::compose_permutes()) → [`FoldBatchNorm`](super::fold_batch_norm()).
//! Constants fold first, so a mask or a weight
//! computed from constants is a constant when the later rules look for one, and a transposed
//! matmul weight is a plain constant FoldBatchNorm can fold into. Each pass keeps the module
//! verifying and the values the same (bit for bit, except FoldBatchNorm, which changes float
//! rounding, and EinsumToMatmul, whose sums run in the matmul kernel's order; see their
//! contracts). [`simplify_for_inference`] runs the pipeline. It is what
//! `BackendPipeline::partition` and `fusebox run` without a config run first, unless the
//! config says `[partition] simplify = false`.
//!
//! ```text
//! ; before (W a [N, K] constant; g, b, m, v [N] constants)
//! wt = R.permute_dims(W, axes=None)
//! y = R.matmul(x, wt)
//! bn = R.nn.batch_norm(y, g, b, m, v, axis=1, training=False)
//! z = bn[0]
//! d = R.nn.dropout(z, rate=0.1)
//! e = d[0]
//! c = R.astype(e, dtype="float32")                ; e is float32
//! r = R.nn.relu(c)
//! ; after
//! y = R.matmul(x, metadata["relax.expr.Constant"][0])   ; W^T, column n scaled by s[n]
//! z = R.add(y, metadata["relax.expr.Constant"][1])      ; t = b - m * s
//! r = R.nn.relu(z)
//! ```

use super::fold_constant::Evaluator;
use super::pass::{
    ComposePermutes, EinsumToMatmul, EliminateCommonSubexpr, FoldBatchNorm, FoldConstant, Pipeline,
    RemoveExportNoise, RemoveIdentity, UnflattenMatmul,
};
use crate::error::Result;
use crate::ir::Module;

/// The simplification passes in order (see the module doc); FoldConstant only with `eval`.
pub fn simplify_pipeline(eval: Option<Evaluator>) -> Pipeline {
    let mut p = Pipeline::new();
    if let Some(eval) = eval {
        p = p.then(FoldConstant { eval });
    }
    p.then(RemoveIdentity)
        .then(RemoveExportNoise)
        .then(EliminateCommonSubexpr)
        .then(EinsumToMatmul)
        .then(UnflattenMatmul)
        .then(ComposePermutes)
        .then(FoldBatchNorm)
}

/// Runs [`simplify_pipeline`] on `m`.
pub fn simplify_for_inference(m: &Module, eval: Option<Evaluator>) -> Result<Module> {
    Ok(simplify_pipeline(eval).run(m)?.0)
}
