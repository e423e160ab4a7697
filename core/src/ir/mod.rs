//! The IR: modules of functions whose expressions live in per-function arenas indexed by `u32`
//! ids.
//!
//! ```text
//! @R.function
//! def main(x: R.Tensor((n, 64), dtype="float32")) -> R.Tensor((n, 64), dtype="float32"):
//!     n = T.int64()
//!     with R.dataflow():
//!         y: R.Tensor((n, 64), dtype="float32") = R.nn.relu(x)
//!         R.output(y)
//!     return y
//! ```
//!
//! A [`Module`] maps names to [`Function`]s. A function owns two arenas: its vars
//! ([`VarId`] → [`VarData`]) and its expressions ([`ExprId`] → [`ExprData`]); blocks list
//! [`Binding`]s of a var to an expression. Nested functions (`local_func` in what
//! `annotate_codegen` prints) are expressions holding a whole [`Function`] with its own arenas.

pub mod builder;
pub mod copy;
pub(crate) mod dim;
pub(crate) mod dtype;
pub(crate) mod entity;
pub(crate) mod expr;
pub(crate) mod function;
pub mod generate;
pub mod infer;
pub(crate) mod module;
pub mod structural;
pub(crate) mod ty;
pub mod verify;

pub use dim::{Dim, DimOp, MAX_DIM, MAX_DIM_OPS, Sym};
pub use dtype::DType;
pub use entity::{Arena, EntityId};
pub use expr::{
    Callee, ConstRef, Constant, ExprData, ExprId, ExprKind, IfExpr, Origin, PrimValue, Seq,
    VarData, VarId, for_each_binding_deep, for_each_use, numel,
};
pub use function::{AttrValue, Binding, Block, FuncAttrs, Function};
pub use module::Module;
pub use ty::{FuncType, ShapeInterner, TensorType, Type};
