//! Passes over modules, one per file. Each file opens with its contract and an example.

pub mod annotate_codegen;
pub mod bind_params;
pub mod bind_symbolic_vars;
pub mod compose_permutes;
pub mod convert_layout;
pub mod dead_code_elimination;
pub mod einsum_to_matmul;
pub mod eliminate_common_subexpr;
pub mod fold_batch_norm;
pub mod fold_constant;
pub mod fuse_ops;
pub mod fuse_ops_by_pattern;
pub mod merge_composite_functions;
mod outline;
pub mod pass;
pub mod regions;
pub mod remove_export_noise;
pub mod remove_identity;
pub mod simplify;
mod substitute;
pub mod unflatten_matmul;

pub use annotate_codegen::annotate_codegen;
pub use bind_params::bind_params;
pub use bind_symbolic_vars::bind_symbolic_vars;
pub use compose_permutes::compose_permutes;
pub use convert_layout::{
    LayoutCost, conv_planes, convert_layout, convert_layout_within, layout_cost, layout_cost_of,
};
pub use dead_code_elimination::dead_code_elimination;
pub use einsum_to_matmul::einsum_to_matmul;
pub use eliminate_common_subexpr::eliminate_common_subexpr;
pub use fold_batch_norm::fold_batch_norm;
pub use fold_constant::{Evaluator, fold_constant};
pub use fuse_ops::fuse_ops;
pub use fuse_ops_by_pattern::{
    FusionPattern, PartitionOptions, Partitioned, Rejection, fuse_ops_by_pattern, sort_by_priority,
};
pub use merge_composite_functions::merge_composite_functions;
pub use pass::{Pass, Pipeline};
pub use remove_export_noise::remove_export_noise;
pub use remove_identity::remove_identity;
pub use simplify::{simplify_for_inference, simplify_pipeline};
pub use unflatten_matmul::unflatten_matmul;
