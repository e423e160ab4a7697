//! fusebox errors as Python exceptions, and the boundary every call crosses: the GIL released,
//! panics caught.
//!
//! Contract:
//!
//! - Every error becomes an instance of a subclass of `fusebox.Error` (defined in
//!   `fusebox/_errors.py`) whose message is the text the CLI prints after `error: `
//!   ([`fusebox::error_message`], the model's path in front where the CLI puts it). The class
//!   is [`Stage`]'s, except that a plugin library that could not be loaded or is malformed
//!   (`fusebox_core::Error::Plugin`), and a plugin's artifact that fails or panics while
//!   running, are `PluginError`s. (A plugin that fails to claim or compile leaves the work to
//!   the next backend, as in the CLI; with `strict = true` that is strict mode's
//!   `PartitionError`, its message naming the library. A plugin's `create` failing is a
//!   `ConfigError` at its `[[backend]]` entry.)
//! - A positioned error (a parse error in a module, a config or a pattern table) carries
//!   `file`, `line` and `col` attributes as well; other errors have them `None`.
//! - [`guarded`] runs the work with the GIL released (other Python threads run meanwhile) and
//!   with panics caught: a panic is a `fusebox.Error` saying it is a bug, never a
//!   `PanicException` (a `BaseException` that `except Exception` would not catch).
//!
//! ```text
//! load("bad.relax")  ->  fusebox.ParseError("bad.relax:3:14: expected `)`, found `,` ...")
//!                        .file == "bad.relax", .line == 3, .col == 14
//! ```

use pyo3::prelude::*;
use std::path::PathBuf;

/// Where an error happened; names the Python exception class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Reading a module in the text format: `ParseError`.
    Parse,
    /// Importing an ONNX model: `ModelImportError`.
    Import,
    /// Reading a config or a pattern table, building its backends: `ConfigError`.
    Config,
    /// Partitioning, claiming, compiling, explaining: `PartitionError`.
    Partition,
    /// The inputs and the run: `RunError`.
    Run,
    /// `check=True` found an output that differs: `CheckError` (a `RunError`).
    Check,
    /// Writing a module: `fusebox.Error` itself.
    Save,
    /// A panic caught at the boundary (a bug): `fusebox.Error` itself.
    Internal,
}

impl Stage {
    fn class(self) -> &'static str {
        match self {
            Stage::Parse => "ParseError",
            Stage::Import => "ModelImportError",
            Stage::Config => "ConfigError",
            Stage::Partition => "PartitionError",
            Stage::Run => "RunError",
            Stage::Check => "CheckError",
            Stage::Save | Stage::Internal => "Error",
        }
    }
}

/// An error on its way to Python.
#[derive(Debug)]
pub struct Failure {
    /// Where it happened.
    pub stage: Stage,
    /// The message, as the CLI prints it.
    pub message: String,
    /// The class, when it is not the stage's (`PluginError`).
    class: Option<&'static str>,
    /// Where in a source text, for a positioned error.
    pos: Option<(String, u32, u32)>,
}

impl Failure {
    /// A fusebox error at `stage`, about the module read from `model` (if it came from a file).
    pub fn new(stage: Stage, e: impl Into<fusebox::Error>, model: Option<&PathBuf>) -> Failure {
        let e: fusebox::Error = e.into();
        let (class, pos) = match &e {
            fusebox::Error::Core(fusebox_core::Error::Plugin { .. }) => (Some("PluginError"), None),
            fusebox::Error::Core(fusebox_core::Error::Source(s)) => {
                (None, Some((s.file.clone(), s.pos.line, s.pos.col)))
            }
            _ => (None, None),
        };
        Failure {
            stage,
            message: fusebox::error_message(&e, model.map(PathBuf::as_path)),
            class,
            pos,
        }
    }

    /// A run's error (see [`fusebox::runner::into_core`]): the CLI's message, and
    /// `PluginError` when a plugin's artifact failed.
    pub fn run(e: fusebox::Error, model: Option<&PathBuf>) -> Failure {
        let plugin = fusebox::runner::from_plugin(&e);
        let mut f = Failure::new(Stage::Run, fusebox::runner::into_core(e), model);
        if plugin {
            f.class = Some("PluginError");
        }
        f
    }

    /// An error that is not one of fusebox's (a Python value fusebox cannot take), with its
    /// message as given.
    pub fn msg(stage: Stage, message: impl Into<String>) -> Failure {
        Failure {
            stage,
            message: message.into(),
            class: None,
            pos: None,
        }
    }

    /// The Python exception.
    pub fn into_pyerr(self, py: Python<'_>) -> PyErr {
        let class = self.class.unwrap_or(self.stage.class());
        match make_exception(py, class, &self.message, self.pos) {
            Ok(e) => e,
            Err(e) => e,
        }
    }
}

/// An instance of `fusebox._errors.<class>` as a `PyErr`; the `Err` is whatever went wrong
/// making it (the module missing from an incomplete install), itself a Python exception.
fn make_exception(
    py: Python<'_>,
    class: &str,
    message: &str,
    pos: Option<(String, u32, u32)>,
) -> Result<PyErr, PyErr> {
    let errors = py.import("fusebox._errors")?;
    let cls = errors.getattr(class)?;
    let exc = match pos {
        Some((file, line, col)) => cls.call1((message, file, line, col))?,
        None => cls.call1((message,))?,
    };
    Ok(PyErr::from_value(exc))
}

/// The text of a panic's payload.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a panic without a message)".to_string()
    }
}

/// Runs `work` with the GIL released and panics caught (see the module doc).
pub fn guarded<T: Send>(
    py: Python<'_>,
    work: impl FnOnce() -> Result<T, Failure> + Send,
) -> PyResult<T> {
    let r = py.detach(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)));
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(f)) => Err(f.into_pyerr(py)),
        Err(payload) => Err(Failure::msg(
            Stage::Internal,
            format!(
                "internal error (a bug in fusebox, please report it): {}",
                panic_text(payload.as_ref())
            ),
        )
        .into_pyerr(py)),
    }
}
