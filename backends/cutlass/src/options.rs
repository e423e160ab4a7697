//! The backend's options (`[backend.options]` of `name = "cutlass"`), validated.
//!
//! ```toml
//! [[backend]]
//! name = "cutlass"
//! [backend.options]
//! profile = true   # time every candidate tile once per problem on the device; cache the winner
//! bf16 = true      # also claim bfloat16 matmul/conv2d (TVM's CUTLASS table has no bfloat16)
//! arch = "sm_80"   # what `fusebox compile` builds CUBIN for without a device (default sm_90)
//! sm_count = 108   # SMs the heuristic assumes without a device (default 132)
//! ```
//!
//! An unknown key is an error naming it and the valid ones; a value of the wrong type is an
//! [`Error::Option`].

use crate::error::{Error, Result};
use fusebox_core::backend::registry::check_options;
use fusebox_cuda::Arch;

/// The valid option names.
pub const OPTION_NAMES: &[&str] = &["profile", "bf16", "arch", "sm_count"];

/// The options of the `cutlass` backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Options {
    /// Profile the candidate instances on the device (once per problem; cached on disk).
    pub profile: bool,
    /// Accept bfloat16 pairs in the pattern checks.
    pub bf16: bool,
    /// The arch `build` targets.
    pub arch: Arch,
    /// The SM count the heuristic assumes when there is no device.
    pub sm_count: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            profile: false,
            bf16: false,
            arch: Arch::Sm90,
            sm_count: 132,
        }
    }
}

fn bool_opt(t: &toml::Table, key: &str) -> Result<bool> {
    match t.get(key) {
        None => Ok(false),
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
    /// Validates `[backend.options]`.
    pub fn from_table(t: &toml::Table) -> Result<Options> {
        check_options("cutlass", t, OPTION_NAMES)?;
        let d = Options::default();
        let arch = match t.get("arch") {
            None => d.arch,
            Some(toml::Value::String(a)) => {
                a.parse().map_err(|e: fusebox_cuda::Error| Error::Option {
                    option: "arch".into(),
                    message: e.to_string(),
                })?
            }
            Some(other) => {
                return Err(Error::Option {
                    option: "arch".into(),
                    message: format!(
                        "expected \"sm_80\", \"sm_90\" or \"sm_90a\", found `{other}`"
                    ),
                });
            }
        };
        let sm_count = match t.get("sm_count") {
            None => d.sm_count,
            Some(toml::Value::Integer(i)) if (1..=1024).contains(i) => {
                u32::try_from(*i).unwrap_or(d.sm_count)
            }
            Some(other) => {
                return Err(Error::Option {
                    option: "sm_count".into(),
                    message: format!("expected an integer from 1 to 1024, found `{other}`"),
                });
            }
        };
        Ok(Options {
            profile: bool_opt(t, "profile")?,
            bf16: bool_opt(t, "bf16")?,
            arch,
            sm_count,
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
    fn values_and_errors() {
        assert_eq!(parse("").ok(), Some(Options::default()));
        assert_eq!(
            parse("profile = true\nbf16 = true").ok(),
            Some(Options {
                profile: true,
                bf16: true,
                ..Options::default()
            })
        );
        assert!(
            parse("profile = 1").is_err_and(|e| e.to_string().contains("expected true or false"))
        );
        assert!(parse("tiles = 1").is_err());
        assert_eq!(
            parse("arch = \"sm_80\"").map(|o| o.arch).ok(),
            Some(Arch::Sm80)
        );
        assert!(parse("arch = \"sm_70\"").is_err());
        assert!(parse("sm_count = 0").is_err());
    }
}
