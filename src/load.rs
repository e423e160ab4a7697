//! Reading what a user hands fusebox: a model (`.onnx` imported, anything else parsed as
//! text), a config (with the default config built in), a pattern table; and the text of an
//! error as the command line prints it.
//!
//! Contract: the CLI and the Python package both read through these functions, so a file reads
//! the same, and fails with the same message, from either.
//!
//! - [`load_model`]: a path that [`fusebox_core::frontend::onnx::is_onnx_path`] accepts (a
//!   `.onnx` file, or a folder holding one) is imported, anything else is read as text with
//!   its constants from the `.safetensors` side file ([`fusebox_core::text::read_module`]).
//! - [`load_config`]: the file, except that [`DEFAULT_CONFIG`] (`configs/cpu.toml`) falls back
//!   to the copy built into the binary when the file is not there (run outside the repo).
//! - [`error_message`]: the error's text, prefixed with the model's path when the text does
//!   not already name it, with overlong quoted values cut
//!   ([`fusebox_core::error::cap_long_values`]): what `fusebox` prints after `error: `.
//!
//! ```text
//! load_model("m.onnx")   -> import_onnx_file      load_model("m.relax") -> read_module
//! load_config("configs/cpu.toml") (absent)        -> default_config()
//! error_message(e, Some("m.relax"))               -> "m.relax: no function `main`"
//! ```

use fusebox_core::config::Config;
use fusebox_core::ir::Module;
use fusebox_core::transform::FusionPattern;
use std::path::Path;

/// The default config's path (what `--config` defaults to).
pub const DEFAULT_CONFIG: &str = "configs/cpu.toml";

/// The default config's text, built in for when the file is not there.
pub const DEFAULT_CONFIG_TEXT: &str = include_str!("../configs/cpu.toml");

/// Reads a model: `.onnx` (or a folder holding one) is imported, anything else parsed as text.
pub fn load_model(file: &Path) -> crate::Result<Module> {
    if fusebox_core::frontend::onnx::is_onnx_path(file) {
        Ok(fusebox_core::frontend::onnx::import_onnx_file(file)?)
    } else {
        Ok(fusebox_core::text::read_module(file)?)
    }
}

/// `--bind NAME=VALUE`: a symbolic dim's name and its value (an integer of 0 or more).
pub fn parse_bind(s: &str) -> Result<(String, i64), String> {
    let Some((name, value)) = s.split_once('=') else {
        return Err(format!("expected NAME=VALUE (e.g. `batch=1`), found `{s}`"));
    };
    let name = name.trim();
    if name.is_empty() {
        return Err(format!(
            "expected a symbolic dim's name before `=`, found `{s}`"
        ));
    }
    match value.trim().parse::<i64>() {
        Ok(v) if v >= 0 => Ok((name.to_string(), v)),
        _ => Err(format!(
            "`{name}`: expected a dim value (an integer of 0 or more), found `{}`",
            value.trim()
        )),
    }
}

/// The model with the symbolic dims of `binds` given their values
/// ([`fusebox_core::transform::bind_symbolic_vars()`]); the model itself when `binds` is empty.
pub fn bind_dims(m: Module, binds: &[(String, i64)]) -> crate::Result<Module> {
    if binds.is_empty() {
        return Ok(m);
    }
    Ok(fusebox_core::transform::bind_symbolic_vars(&m, binds)?)
}

/// The built-in default config (`configs/cpu.toml` as it was built).
pub fn default_config() -> crate::Result<Config> {
    Ok(Config::parse(DEFAULT_CONFIG_TEXT, DEFAULT_CONFIG)?)
}

/// Reads a config; [`DEFAULT_CONFIG`] falls back to [`default_config`] when the file is not
/// there.
pub fn load_config(path: &Path) -> crate::Result<Config> {
    if path == Path::new(DEFAULT_CONFIG) && !path.exists() {
        return default_config();
    }
    Ok(Config::load(path)?)
}

/// Reads a TOML pattern table (`[[pattern]]` entries), in file order.
pub fn read_pattern_table(patterns: &Path) -> crate::Result<Vec<FusionPattern>> {
    let table_src = std::fs::read_to_string(patterns).map_err(|e| fusebox_core::Error::Io {
        path: patterns.to_path_buf(),
        source: e,
    })?;
    Ok(fusebox_core::pattern_table::parse_pattern_table(
        &table_src,
        &patterns.display().to_string(),
    )?)
}

/// The text `fusebox` prints after `error: ` for `e` (see the module doc): every error names
/// the model it is about (parse and import errors already do), and a 5 MB value the user gave
/// is not echoed back whole.
pub fn error_message(e: &dyn std::fmt::Display, model: Option<&Path>) -> String {
    let mut msg = e.to_string();
    if let Some(m) = model.map(|m| m.display().to_string())
        && !msg.contains(&m)
    {
        msg = format!("{m}: {msg}");
    }
    fusebox_core::error::cap_long_values(&msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_text_names_the_model_once() {
        let e = fusebox_core::Error::Invalid("no function `main`".into());
        assert_eq!(
            error_message(&e, Some(Path::new("m.relax"))),
            "m.relax: no function `main`"
        );
        let e = fusebox_core::Error::Invalid("m.relax: bad".into());
        assert_eq!(
            error_message(&e, Some(Path::new("m.relax"))),
            "m.relax: bad"
        );
        assert_eq!(error_message(&e, None), "m.relax: bad");
    }

    #[test]
    fn the_built_in_default_config_parses() {
        let c = default_config().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.file, DEFAULT_CONFIG);
        assert_eq!(c.backends.len(), 1);
        assert_eq!(c.backends[0].name, "cpu");
    }

    #[test]
    fn binds_parse_and_bad_ones_say_what_was_expected() {
        assert_eq!(parse_bind("batch=1"), Ok(("batch".to_string(), 1)));
        assert_eq!(parse_bind(" seq = 128 "), Ok(("seq".to_string(), 128)));
        assert_eq!(parse_bind("n=0"), Ok(("n".to_string(), 0)));
        for (bad, says) in [
            ("batch", "NAME=VALUE"),
            ("=3", "name"),
            ("batch=-1", "0 or more"),
            ("batch=x", "0 or more"),
            ("batch=99999999999999999999", "0 or more"),
        ] {
            let e = parse_bind(bad).err().unwrap_or_default();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
