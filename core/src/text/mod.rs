//! The text format: a parser and printer for the subset of TVMScript that TVM 0.27 prints for
//! Relax modules, plus a safetensors side file for tensor constants.
//!
//! ```text
//! # from tvm.script import ir as I
//! # from tvm.script import relax as R
//!
//! @I.ir_module
//! class Module:
//!     @R.function
//!     def main(x: R.Tensor((1, 4), dtype="float32")) -> R.Tensor((1, 4), dtype="float32"):
//!         with R.dataflow():
//!             gv: R.Tensor((1, 4), dtype="float32") = R.add(x, metadata["relax.expr.Constant"][0])
//!             R.output(gv)
//!         return gv
//!
//! # Metadata omitted. Use show_meta=True in script() method to show this information.
//! ```
//!
//! Contract:
//! - [`parse_module`] reads such text (and the variants listed in `parser.rs`), resolving
//!   `metadata[...]` references through a [`ConstTable`]; every error is a positioned
//!   [`crate::Error::Source`]; no input makes it panic or overflow the stack.
//! - [`print_module`] writes TVM's style; `print(parse(print(m))) == print(m)`.
//! - [`write_module`] / [`read_module`] store the text in `foo.relax` and the non-scalar
//!   constants in `foo.safetensors` (tensors `relax.expr.Constant.<i>`), writing each file to a
//!   temporary file in the same directory and renaming it into place.

mod constants;
pub(crate) mod lexer;
mod parser;
mod printer;

pub use constants::{ConstTable, NS_CONSTANT, NS_GENERIC, side_file_path};
pub use parser::MAX_DEPTH;
pub(crate) use printer::type_text;
pub use printer::{Printed, format_float, print_module};

use crate::error::{Error, Result};
use crate::ir::Module;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Parses a module from `src`; `file` names the source in errors (and locates the side file in
/// the message of a missing constant); `consts` resolves `metadata[ns][i]`.
pub fn parse_module(src: &str, file: &str, consts: &ConstTable) -> Result<Module> {
    parser::Parser::new(src, file, consts)?.parse_module()
}

/// Parses a module with no constants; errors name the file `<input>`.
pub fn parse_module_str(src: &str) -> Result<Module> {
    parse_module(src, "<input>", &ConstTable::new())
}

/// Reads `path` and, if it exists, its side file of constants, and parses the module.
pub fn read_module(path: &Path) -> Result<Module> {
    let src = std::fs::read_to_string(path).map_err(|e| Error::Io {
        path: path.into(),
        source: e,
    })?;
    let side = side_file_path(path);
    let consts = if side != path && side.exists() {
        ConstTable::load(&side)?
    } else {
        ConstTable::new()
    };
    parse_module(&src, &path.to_string_lossy(), &consts)
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn temp_path_for(path: &Path) -> PathBuf {
    let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = path
        .file_name()
        .map_or_else(|| "module".into(), |s| s.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.tmp.{}.{n}", std::process::id()))
}

/// Writes `bytes` to a temporary file next to `path`, syncs it, and returns the temp path.
fn write_temp(path: &Path, bytes: &[u8]) -> Result<PathBuf> {
    let tmp = temp_path_for(path);
    let io = |e| Error::Io {
        path: tmp.clone(),
        source: e,
    };
    let res = (|| -> std::io::Result<()> {
        // `create_new`: never reuse or follow (a symlink planted at) an existing path.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if let Err(e) = res {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    Ok(tmp)
}

/// Prints `m` to `path` and its non-scalar constants to the side file (only when there are
/// any). Each file is written to a temporary file in the same directory and renamed into place,
/// the side file first, so a reader never sees a half-written file.
pub fn write_module(path: &Path, m: &Module) -> Result<()> {
    let printed = print_module(m);
    let side = side_file_path(path);
    if !printed.constants.is_empty() && side == path {
        return Err(Error::Invalid(format!(
            "{}: the text file cannot have the side file's extension `.safetensors`",
            path.display()
        )));
    }
    let side_tmp = if printed.constants.is_empty() {
        None
    } else {
        let bytes =
            constants::constants_to_safetensors(&printed.constants, printed.first_index, &side)?;
        Some(write_temp(&side, &bytes)?)
    };
    let text_tmp = match write_temp(path, printed.text.as_bytes()) {
        Ok(t) => t,
        Err(e) => {
            if let Some(t) = &side_tmp {
                let _ = std::fs::remove_file(t);
            }
            return Err(e);
        }
    };
    if let Some(t) = &side_tmp
        && let Err(e) = std::fs::rename(t, &side)
    {
        let _ = std::fs::remove_file(t);
        let _ = std::fs::remove_file(&text_tmp);
        return Err(Error::Io {
            path: side,
            source: e,
        });
    }
    if let Err(e) = std::fs::rename(&text_tmp, path) {
        let _ = std::fs::remove_file(&text_tmp);
        return Err(Error::Io {
            path: path.into(),
            source: e,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
