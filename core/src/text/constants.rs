//! Tensor constants of the text format and their safetensors side file.
//!
//! The text refers to non-scalar constants by index, as TVM prints them:
//!
//! ```text
//! lv: R.Tensor((1, 64, 56, 56), dtype="float32") = R.nn.conv2d(x, metadata["relax.expr.Constant"][0])
//! ```
//!
//! Contract: a [`ConstTable`] maps `(namespace, index)` to a [`Constant`]; the namespaces are
//! `relax.expr.Constant` and `ir.GenericConst`. In the side file (`foo.relax` →
//! `foo.safetensors`) the constant `metadata[ns][i]` is the tensor named `ns.i`, with dtype
//! F16/BF16/F32/F64/I8/U8/I32/I64/BOOL, row-major little-endian data.

use crate::error::{Error, Result};
use crate::ir::{Constant, DType};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The namespace TVM uses for Relax tensor constants.
pub const NS_CONSTANT: &str = "relax.expr.Constant";
/// The namespace TVM uses for generic IR constants.
pub const NS_GENERIC: &str = "ir.GenericConst";

/// Constants by `(namespace, index)`, as `metadata[namespace][index]` refers to them.
#[derive(Clone, Debug, Default)]
pub struct ConstTable {
    by_ns: HashMap<String, HashMap<usize, Constant>>,
}

impl ConstTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `metadata[ns][index]`.
    pub fn insert(&mut self, ns: &str, index: usize, c: Constant) {
        self.by_ns
            .entry(ns.to_string())
            .or_default()
            .insert(index, c);
    }

    /// The constant `metadata[ns][index]`, if present.
    pub fn get(&self, ns: &str, index: usize) -> Option<&Constant> {
        self.by_ns.get(ns)?.get(&index)
    }

    /// Number of constants in the table.
    pub fn len(&self) -> usize {
        self.by_ns.values().map(HashMap::len).sum()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads a safetensors side file whose tensors are named `<namespace>.<index>`.
    pub fn load(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::Io {
            path: path.into(),
            source: e,
        })?;
        Self::from_bytes(&bytes, path)
    }

    /// Parses safetensors bytes (`path` is only used in error messages).
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self> {
        let err = |message: String| Error::Constants {
            path: path.into(),
            message,
        };
        let st = SafeTensors::deserialize(bytes).map_err(|e| err(format!("{e}")))?;
        let mut table = ConstTable::new();
        for (name, view) in st.iter() {
            let (ns, idx) = name
                .rsplit_once('.')
                .and_then(|(ns, i)| Some((ns, i.parse::<usize>().ok()?)))
                .ok_or_else(|| {
                    err(format!(
                        "tensor `{name}`: expected a name like `{NS_CONSTANT}.0` or `{NS_GENERIC}.0`"
                    ))
                })?;
            let dtype = from_st_dtype(view.dtype()).ok_or_else(|| {
                err(format!(
                    "tensor `{name}`: unsupported dtype {:?}",
                    view.dtype()
                ))
            })?;
            let shape = view
                .shape()
                .iter()
                .map(|&d| i64::try_from(d))
                .collect::<std::result::Result<Vec<i64>, _>>()
                .map_err(|_| err(format!("tensor `{name}`: dimension too large")))?;
            let c = Constant::from_bytes(dtype, shape, view.data().to_vec())
                .map_err(|m| err(format!("tensor `{name}`: {m}")))?;
            table.insert(ns, idx, c);
        }
        Ok(table)
    }
}

fn from_st_dtype(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::I8 => DType::I8,
        Dtype::U8 => DType::U8,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

fn to_st_dtype(d: DType) -> Dtype {
    match d {
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::I8 => Dtype::I8,
        DType::U8 => Dtype::U8,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::Bool => Dtype::BOOL,
    }
}

/// Serializes `constants[i]` as the tensor `relax.expr.Constant.<first_index + i>`.
pub fn constants_to_safetensors(
    constants: &[Constant],
    first_index: usize,
    path: &Path,
) -> Result<Vec<u8>> {
    let err = |message: String| Error::Constants {
        path: path.into(),
        message,
    };
    let mut views = Vec::with_capacity(constants.len());
    for (i, c) in constants.iter().enumerate() {
        let shape = c
            .shape
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<std::result::Result<Vec<usize>, _>>()
            .map_err(|_| err(format!("constant {i} has a negative dimension")))?;
        let view = TensorView::new(to_st_dtype(c.dtype), shape, &c.data)
            .map_err(|e| err(format!("constant {i}: {e}")))?;
        views.push((format!("{NS_CONSTANT}.{}", first_index + i), view));
    }
    safetensors::serialize(views, None).map_err(|e| err(format!("{e}")))
}

/// The side file that holds the constants of the text file `text_path`
/// (`foo.relax` → `foo.safetensors`).
pub fn side_file_path(text_path: &Path) -> PathBuf {
    text_path.with_extension("safetensors")
}
