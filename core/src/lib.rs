//! fusebox-core: the IR, the op set, the TVMScript-compatible text format, and the passes that
//! partition a tensor program into fused functions.

pub mod backend;
pub mod config;
pub mod error;
pub mod frontend;
pub mod ir;
pub mod op;
pub mod pattern;
pub mod pattern_table;
pub mod report;
pub mod runtime;
pub mod text;
pub mod transform;

pub use error::{Error, Pos, Result, SourceError};
