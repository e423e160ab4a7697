//! Frontends: model formats imported into fusebox's IR.
//!
//! Contract: each frontend turns a serialized model into a [`crate::ir::Module`] whose `main`
//! takes the model's inputs and returns its outputs; errors are values, never panics.
//!
//! ```text
//! model.onnx --import_onnx--> Module { main(x) -> y }
//! ```

pub mod onnx;
