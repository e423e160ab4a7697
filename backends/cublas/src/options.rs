//! The backend's options (`[backend.options]` of `name = "cublas"`), validated.
//!
//! ```toml
//! [[backend]]
//! name = "cublas"
//! [backend.options]
//! autotune = true        # time the heuristic's candidates once per shape; cache the winner on disk
//! allow_tf32 = false     # float32 matmuls on TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32)
//! candidates = 8         # how many algorithms the heuristic returns (1..=32)
//! ```
//!
//! An unknown key is an error naming it and the valid ones; a value of the wrong type or out of
//! range is an [`Error::Option`] saying what was expected.

use crate::error::{Error, Result};
use fusebox_core::backend::registry::check_options;

/// The valid option keys.
pub const OPTION_NAMES: &[&str] = &["autotune", "allow_tf32", "candidates"];

/// The options of the cuBLAS backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Options {
    /// Time every heuristic candidate once per plan and keep the fastest (cached on disk).
    pub autotune: bool,
    /// Run float32 matmuls with `CUBLAS_COMPUTE_32F_FAST_TF32` instead of true fp32.
    pub allow_tf32: bool,
    /// How many algorithms to request from `cublasLtMatmulAlgoGetHeuristic`.
    pub candidates: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            autotune: false,
            allow_tf32: false,
            candidates: 8,
        }
    }
}

fn bool_opt(t: &toml::Table, key: &str, default: bool) -> Result<bool> {
    match t.get(key) {
        None => Ok(default),
        Some(toml::Value::Boolean(b)) => Ok(*b),
        Some(other) => Err(Error::Option {
            option: key.into(),
            message: format!(
                "expected true or false, found {} `{other}`",
                other.type_str()
            ),
        }),
    }
}

impl Options {
    /// Parses and validates an options table.
    pub fn from_table(t: &toml::Table) -> Result<Options> {
        check_options("cublas", t, OPTION_NAMES)?;
        let d = Options::default();
        let candidates = match t.get("candidates") {
            None => d.candidates,
            Some(toml::Value::Integer(i)) if (1..=32).contains(i) => {
                usize::try_from(*i).unwrap_or(d.candidates)
            }
            Some(other) => {
                return Err(Error::Option {
                    option: "candidates".into(),
                    message: format!("expected an integer from 1 to 32, found `{other}`"),
                });
            }
        };
        Ok(Options {
            autotune: bool_opt(t, "autotune", d.autotune)?,
            allow_tf32: bool_opt(t, "allow_tf32", d.allow_tf32)?,
            candidates,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(src: &str) -> Result<Options> {
        let t: toml::Table = toml::from_str(src).map_err(|e| Error::Args(e.to_string()))?;
        Options::from_table(&t)
    }

    #[test]
    fn defaults_and_values() {
        assert_eq!(parse("").ok(), Some(Options::default()));
        let o = parse("autotune = true\nallow_tf32 = true\ncandidates = 4").ok();
        assert_eq!(
            o,
            Some(Options {
                autotune: true,
                allow_tf32: true,
                candidates: 4
            })
        );
    }

    #[test]
    fn errors_name_the_option() {
        let e = parse("autotun = true").err().map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some(
                "unknown option of backend `cublas` `autotun`; expected one of: autotune, \
                 allow_tf32, candidates"
            )
        );
        let e = parse("autotune = 1").err().map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some(
                "option `autotune` of backend `cublas`: expected true or false, found integer `1`"
            )
        );
        let e = parse("candidates = 0").err().map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some(
                "option `candidates` of backend `cublas`: expected an integer from 1 to 32, \
                 found `0`"
            )
        );
        assert!(parse("allow_tf32 = \"yes\"").is_err());
    }
}
