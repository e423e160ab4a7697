//! fusebox-cpu: the CPU reference backend. It has a kernel for every op of fusebox's op set
//! and an interpreter that runs a module's function on concrete tensors, so a partitioned
//! module can be checked against the module it came from, number for number.
//!
//! Contract:
//!
//! - [`eval_op`] runs one op on run-time [`Value`]s ([`fusebox_core::runtime`]). Every
//!   [`Op`](fusebox_core::op::Op) variant has a kernel. Float kernels take `float32` and
//!   `float64`, and `float16`/`bfloat16` through `f32`; integer and `bool` tensors work where
//!   the op is defined on them (arithmetic, `relu`/`abs`/`negative`, `clip`, reductions,
//!   pooling, matmul, every data-movement op, `astype`). Broadcasting follows numpy.
//! - [`run`] interprets a function (see [`exec`]): symbolic dims are bound from the actual
//!   argument shapes, composite / primitive / codegen functions and local functions are
//!   interpreted like any other, and values are dropped after their last use. An
//!   [`Executor`] does the same and keeps decoded constants between runs; `conv2d` chains
//!   (+ `batch_norm` / `add` / `relu`), `add` + `relu`, and FuseOps groups of elementwise ops
//!   (alone or after a `conv2d` / `matmul`) run as fused kernels with bit-identical results.
//! - Kernels are deterministic: a fixed summation order, and the big ones (conv2d, matmul,
//!   batch_norm, pooling, elementwise ops on large tensors) split only independent outputs
//!   over [`par::threads`] threads, so results are bit-identical for every thread count
//!   (`FUSEBOX_THREADS`, the `cpu` backend's `threads` option). Errors are values of
//!   [`Error`], never panics.
//!
//! ```text
//! @R.function
//! def main(x: R.Tensor((2, 3), dtype="float32"), w: R.Tensor((3, 4), dtype="float32")):
//!     with R.dataflow():
//!         lv: R.Tensor((2, 4), dtype="float32") = R.matmul(x, w, out_dtype=None)
//!         gv: R.Tensor((2, 4), dtype="float32") = R.nn.relu(lv)
//!         R.output(gv)
//!     return gv
//! ```
//!
//! ```
//! use fusebox_core::runtime::{Tensor, Value};
//! let src = "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: R.Tensor((2,), dtype=\"float32\")) -> R.Tensor((2,), dtype=\"float32\"):\n        y: R.Tensor((2,), dtype=\"float32\") = R.nn.relu(x)\n        return y\n";
//! let m = fusebox_core::text::parse_module_str(src).unwrap();
//! let x = Tensor::from_f32(vec![2], vec![-1.0, 2.0]).unwrap();
//! let out = fusebox_cpu::run(&m, "main", vec![Value::Tensor(x)]).unwrap();
//! let Value::Tensor(y) = out else { unreachable!() };
//! assert_eq!(y.as_f32(), Some(&[0.0f32, 2.0][..]));
//! ```

#![forbid(unsafe_code)]

mod attention;
pub mod backend;
mod composite;
mod conv;
mod conv_stem;
mod conv_transpose;
mod dense;
mod depthwise_flat;
mod depthwise_s1;
mod depthwise_s2;
mod einsum;
mod elem;
mod elem_program;
mod elem_view;
mod elementwise;
pub mod exec;
mod fuse;
mod gemm_packed;
mod group_norm;
mod image;
mod index;
mod kernels;
mod layout;
mod linalg;
mod matmul;
mod moe;
mod nn;
mod nn_attention;
mod norm;
pub mod par;
mod pool_blocked;
mod pool_nd;
mod reduce;
mod roi_align;
mod rope;
mod search;
mod set;
mod simd;
mod util;
mod winograd;
#[cfg(test)]
mod xformer_tests;

pub use backend::CpuBackend;
pub use exec::{CallHook, CallProfile, Executor, ShapeProfile, Takes, run, run_profiled, run_with};
pub use fusebox_core::runtime::{Prim, Storage, StorageRef, Tensor, Value};
pub use kernels::eval_op;

/// The fused kernel the executor runs a composite function with (`cpu.attention(fused)`,
/// …), or `None` when its body is interpreted op by op (see `composite.rs`).
pub fn fused_kernel(f: &fusebox_core::ir::Function) -> Option<&'static str> {
    composite::recognise(f).map(|p| p.kernel_name())
}

/// Call this from the binary so the linker keeps this crate and its `inventory` registration
/// of the `cpu` backend (see `fusebox_core::backend::registry`).
pub fn link() {}

/// Every error of the CPU backend.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A kernel rejected its arguments (shapes, dtypes, attribute values, index ranges).
    #[error("{op}: {message}")]
    Kernel {
        /// The op's name (`relax.nn.conv2d`).
        op: &'static str,
        /// What was wrong.
        message: String,
    },
    /// A call of an op outside the op set (an opaque op the text kept verbatim).
    #[error(
        "no kernel for `{op}`: it is outside fusebox's op set, so it can be parsed, printed and partitioned but not run"
    )]
    NoKernel {
        /// The op's name as written (`relax.foo`).
        op: String,
    },
    /// The interpreter could not run the function (arity, types, unbound vars or dims).
    #[error("{0}")]
    Exec(String),
    /// An error inside a binding, with where it happened (`function/var`).
    #[error("{at}: {source}")]
    At {
        /// `function/var` of the binding.
        at: String,
        /// The underlying error.
        source: Box<Error>,
    },
    /// An error from fusebox-core (constant conversion, ill-formed tensors).
    #[error(transparent)]
    Core(#[from] fusebox_core::Error),
}

/// The result type of fusebox-cpu.
pub type Result<T, E = Error> = std::result::Result<T, E>;
