//! Python values in and out: numpy arrays and fusebox tensors, configs and pattern tables given
//! as paths or as Python dicts and lists.
//!
//! Contract:
//!
//! - [`to_tensor`]: a numpy array (anything else goes through `numpy.asarray` first) of
//!   float16, float32, float64, int8, uint8, int32, int64 or bool, in native byte order, any
//!   strides, becomes a row-major tensor: its elements are copied once into fusebox's storage
//!   (which owns its memory). Another dtype is a `RunError` naming the input and the dtypes
//!   taken.
//! - [`to_array`]: a tensor becomes a numpy array without a copy where fusebox holds the only
//!   reference to the data (the array owns fusebox's buffer); a shared buffer is copied once.
//!   bfloat16, which numpy lacks, is widened to float32 (as the CLI's `.npy` files are).
//! - [`Source`]: a config or pattern table is a path (`str` or `os.PathLike`), or a dict (a
//!   config) or a list of dicts (a pattern table: `name`, `pattern`, optional `priority` and
//!   `check`, as a `[[pattern]]` table). A dict or list is written as TOML and parsed as a file
//!   named `<config dict>` / `<patterns list>`, so it is checked exactly as the file would be
//!   (unknown keys, bad patterns, positions in the TOML text the error shows).
//!
//! ```text
//! {"target": "cpu", "backend": [{"name": "cpu"}]}   ->   target = "cpu"
//!                                                       [[backend]]
//!                                                       name = "cpu"
//! ```

use crate::errors::{Failure, Stage};
use fusebox_core::config::Config;
use fusebox_core::transform::FusionPattern;
use fusebox_cpu::{Storage, Tensor};
use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{Element, PyArray, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use std::path::PathBuf;

/// The numpy dtypes [`to_tensor`] takes.
const DTYPES: &str = "float16, float32, float64, int8, uint8, int32, int64, bool";

/// A shape and its elements in row-major order.
type Elements<T> = (Vec<usize>, Vec<T>);

/// `arr` as its shape and elements if it is an array of `T` (`None`: another dtype); `room`
/// is asked whether the copy fits the memory limit before anything is copied.
fn typed<T: Element + Clone>(
    arr: &Bound<'_, PyAny>,
    what: &str,
    room: &dyn Fn(&[usize]) -> Result<(), String>,
) -> Option<Result<Elements<T>, String>> {
    let a = arr.cast::<PyArrayDyn<T>>().ok()?;
    let ro = match a.try_readonly() {
        Ok(r) => r,
        Err(e) => return Some(Err(format!("{what}: {e}"))),
    };
    let shape = ro.shape().to_vec();
    if let Err(e) = room(&shape) {
        return Some(Err(e));
    }
    // `as_slice` takes Fortran order as it lies in memory: only a C-contiguous array is copied
    // as it lies; any other is read in row-major order.
    let v = match ro.as_slice() {
        Ok(s) if ro.is_c_contiguous() => s.to_vec(),
        _ => ro.as_array().iter().cloned().collect(),
    };
    Some(Ok((shape, v)))
}

/// Input `name` as a tensor (see the module doc).
pub fn to_tensor(py: Python<'_>, obj: &Bound<'_, PyAny>, name: &str) -> Result<Tensor, Failure> {
    let bad = |m: String| Failure::msg(Stage::Run, format!("input `{name}`: {m}"));
    let arr = if obj.cast::<numpy::PyUntypedArray>().is_ok() {
        obj.clone()
    } else {
        py.import("numpy")
            .and_then(|np| np.call_method1("asarray", (obj,)))
            .map_err(|e| bad(format!("not an array: {e}")))?
    };
    // The copy goes through the memory limit, as an input the CLI reads does.
    let what = format!("input `{name}`");
    macro_rules! try_dtypes {
        ($($t:ty => $variant:ident),*) => {
            $(if let Some(r) = typed::<$t>(&arr, &what, &|shape| {
                fusebox_core::runtime::check_alloc(&what, fusebox_core::ir::DType::$variant, shape)
                    .map_err(|e| e.to_string())
            }) {
                let (shape, v) = r.map_err(|m| Failure::msg(Stage::Run, m))?;
                return Tensor::new(shape, Storage::$variant(v))
                    .map_err(|e| bad(e.to_string()));
            })*
        };
    }
    try_dtypes!(
        f32 => F32, f64 => F64, half::f16 => F16, i8 => I8, u8 => U8,
        i32 => I32, i64 => I64, bool => Bool
    );
    let dtype = arr
        .getattr("dtype")
        .and_then(|d| d.str())
        .map(|s| s.to_string())
        .unwrap_or_else(|_| "?".to_string());
    Err(bad(format!(
        "dtype {dtype} is not supported (fusebox takes {DTYPES}, in native byte order)"
    )))
}

/// A numpy array owning `v`, shaped `shape`.
fn array<'py, T: Element>(
    py: Python<'py>,
    shape: &[usize],
    v: Vec<T>,
) -> Result<Bound<'py, PyAny>, Failure> {
    let a = ArrayD::from_shape_vec(IxDyn(shape), v)
        .map_err(|e| Failure::msg(Stage::Run, format!("an output of shape {shape:?}: {e}")))?;
    Ok(PyArray::from_owned_array(py, a).into_any())
}

/// An output as a numpy array (see the module doc).
pub fn to_array(py: Python<'_>, t: Tensor) -> Result<Bound<'_, PyAny>, Failure> {
    let shape = t.shape().to_vec();
    let storage = t.into_storage();
    match storage {
        Storage::F32(v) => array(py, &shape, v),
        Storage::F64(v) => array(py, &shape, v),
        Storage::F16(v) => array(py, &shape, v),
        Storage::BF16(v) => array(py, &shape, v.iter().map(|x| x.to_f32()).collect()),
        Storage::I8(v) => array(py, &shape, v),
        Storage::U8(v) => array(py, &shape, v),
        Storage::I32(v) => array(py, &shape, v),
        Storage::I64(v) => array(py, &shape, v),
        Storage::Bool(v) => array(py, &shape, v),
    }
}

/// A Python value as a TOML value; `at` names it in errors (`config['partition']`).
fn to_toml(v: &Bound<'_, PyAny>, at: &str, stage: Stage) -> Result<toml::Value, Failure> {
    let type_name = || {
        v.get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_else(|_| "?".into())
    };
    if let Ok(b) = v.cast::<PyBool>() {
        return Ok(toml::Value::Boolean(b.is_true()));
    }
    if v.cast::<PyInt>().is_ok() {
        return v.extract::<i64>().map(toml::Value::Integer).map_err(|_| {
            Failure::msg(
                stage,
                format!("{at}: the integer {v} does not fit in 64 bits"),
            )
        });
    }
    if let Ok(f) = v.cast::<PyFloat>() {
        return Ok(toml::Value::Float(f.value()));
    }
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(toml::Value::String(s.to_string()));
    }
    if let Ok(d) = v.cast::<PyDict>() {
        let mut t = toml::Table::new();
        for (k, val) in d.iter() {
            let key = k.cast::<PyString>().map(|s| s.to_string()).map_err(|_| {
                Failure::msg(stage, format!("{at}: a key must be a string, found {k:?}"))
            })?;
            let shown = k
                .repr()
                .map(|r| r.to_string())
                .unwrap_or_else(|_| key.clone());
            let item = to_toml(&val, &format!("{at}[{shown}]"), stage)?;
            t.insert(key, item);
        }
        return Ok(toml::Value::Table(t));
    }
    if v.cast::<PyList>().is_ok() || v.cast::<PyTuple>().is_ok() {
        let mut items = Vec::new();
        for (i, item) in v
            .try_iter()
            .map_err(|e| Failure::msg(stage, e.to_string()))?
            .enumerate()
        {
            let item = item.map_err(|e| Failure::msg(stage, e.to_string()))?;
            items.push(to_toml(&item, &format!("{at}[{i}]"), stage)?);
        }
        return Ok(toml::Value::Array(items));
    }
    if v.hasattr("__fspath__").unwrap_or(false) {
        let p: PathBuf = v
            .extract()
            .map_err(|e| Failure::msg(stage, format!("{at}: {e}")))?;
        return Ok(toml::Value::String(p.display().to_string()));
    }
    Err(Failure::msg(
        stage,
        format!(
            "{at}: a {} has no TOML equivalent (expected a bool, int, float, str, path, list or dict)",
            type_name()
        ),
    ))
}

/// A config or a pattern table as the user gave it (see the module doc).
#[derive(Clone, Debug)]
pub enum Source {
    /// A file.
    Path(PathBuf),
    /// TOML text made from a dict or list, and the name it goes by in errors.
    Text(String, &'static str),
}

/// The name a config dict goes by in errors.
const CONFIG_DICT: &str = "<config dict>";
/// The name a pattern list goes by in errors.
const PATTERNS_LIST: &str = "<patterns list>";

/// A path, if `obj` is a `str` or an `os.PathLike`.
fn as_path(obj: &Bound<'_, PyAny>) -> Option<PathBuf> {
    if obj.cast::<PyString>().is_ok() || obj.hasattr("__fspath__").unwrap_or(false) {
        obj.extract().ok()
    } else {
        None
    }
}

/// TOML text for a table.
fn toml_text(t: toml::Table, what: &str) -> Result<String, Failure> {
    toml::to_string(&t).map_err(|e| {
        Failure::msg(
            Stage::Config,
            format!("{what}: cannot be written as TOML: {e}"),
        )
    })
}

impl Source {
    /// A config argument: a path or a dict.
    pub fn config(obj: &Bound<'_, PyAny>) -> Result<Source, Failure> {
        if let Some(p) = as_path(obj) {
            return Ok(Source::Path(p));
        }
        if obj.cast::<PyDict>().is_err() {
            return Err(Failure::msg(
                Stage::Config,
                "config: expected a path (str or os.PathLike) or a dict",
            ));
        }
        let toml::Value::Table(t) = to_toml(obj, "config", Stage::Config)? else {
            return Err(Failure::msg(Stage::Config, "config: expected a dict"));
        };
        Ok(Source::Text(toml_text(t, "config")?, CONFIG_DICT))
    }

    /// A pattern table argument: a path or a list of dicts.
    pub fn patterns(obj: &Bound<'_, PyAny>) -> Result<Source, Failure> {
        if let Some(p) = as_path(obj) {
            return Ok(Source::Path(p));
        }
        if obj.cast::<PyList>().is_err() && obj.cast::<PyTuple>().is_err() {
            return Err(Failure::msg(
                Stage::Config,
                "patterns: expected a path (str or os.PathLike) or a list of dicts",
            ));
        }
        let entries = to_toml(obj, "patterns", Stage::Config)?;
        if let toml::Value::Array(items) = &entries
            && let Some(i) = items.iter().position(|e| !e.is_table())
        {
            return Err(Failure::msg(
                Stage::Config,
                format!(
                    "patterns[{i}]: expected a dict with `name`, `pattern` and optional \
                     `priority` and `check`"
                ),
            ));
        }
        let mut t = toml::Table::new();
        t.insert("pattern".into(), entries);
        Ok(Source::Text(toml_text(t, "patterns")?, PATTERNS_LIST))
    }

    /// Reads the config (a path as the CLI reads `--config`).
    pub fn load_config(&self) -> Result<Config, Failure> {
        match self {
            Source::Path(p) => fusebox::load_config(p),
            Source::Text(text, name) => Config::parse(text, name).map_err(Into::into),
        }
        .map_err(|e| Failure::new(Stage::Config, e, None))
    }

    /// Reads the pattern table (a path as the CLI reads `--patterns`), in table order.
    pub fn load_patterns(&self) -> Result<Vec<FusionPattern>, Failure> {
        match self {
            Source::Path(p) => fusebox::read_pattern_table(p),
            Source::Text(text, name) => {
                fusebox_core::pattern_table::parse_pattern_table(text, name).map_err(Into::into)
            }
        }
        .map_err(|e| Failure::new(Stage::Config, e, None))
    }
}
