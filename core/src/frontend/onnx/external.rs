//! ONNX external data: tensors whose bytes live in side files next to the model.
//!
//! Contract:
//!
//! - A `TensorProto` with `data_location = EXTERNAL` names its bytes with `external_data`
//!   entries: `location` (a path relative to the model's folder, required), `offset` (default
//!   0) and `length` (default: to the end of the file). This is what the dynamo exporter writes
//!   by default and what every model over protobuf's 2 GB limit must use.
//! - The location must stay inside the model's folder: an absolute path, a `..` component, or
//!   a path that resolves (through symlinks) outside the folder is an error. The target must be
//!   a regular file (a FIFO or a device would block or never end).
//! - The byte range must lie inside the file and hold exactly `numel × dtype size` bytes; this
//!   is checked against the file's length before anything is allocated, so a lying header
//!   cannot make the importer allocate more than the file holds.
//! - Each tensor's range is read straight into the constant's buffer: one copy from the file,
//!   never the whole side file in memory. (A memory map would save that copy too, but needs
//!   `unsafe`, which this crate keeps to FFI modules.) Each side file is opened once.
//!
//! ```text
//! initializer "h.0.attn.c_attn.weight": float32[768, 2304],
//!     external_data {location: "model.onnx.data", offset: 0, length: 7077888}
//!   → Constant float32[768, 2304] with bytes 0..7077888 of <model folder>/model.onnx.data
//! ```

use super::proto::TensorProto;
use super::{dtype_of, tensor_to_constant};
use crate::ir::{Constant, numel};
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

/// `TensorProto.data_location` of a tensor whose bytes are in a side file.
pub(crate) const EXTERNAL: i32 = 1;

/// Resolves external tensors of one model against its folder.
pub struct ExternalData {
    /// The model's folder (`None`: the model came from memory, so nothing can be resolved).
    base: Option<PathBuf>,
    /// Side files opened so far, with their lengths, by location.
    files: HashMap<String, (File, u64)>,
}

impl ExternalData {
    /// Resolves locations against `base` (the model file's folder), or refuses external data
    /// when `None`.
    pub fn new(base: Option<&Path>) -> Self {
        ExternalData {
            base: base.map(Path::to_path_buf),
            files: HashMap::new(),
        }
    }

    /// The constant of `t`, reading its bytes from the side file when it has external data.
    pub fn constant(&mut self, t: &TensorProto) -> Result<Constant, String> {
        if t.data_location != EXTERNAL {
            return tensor_to_constant(t);
        }
        let dtype = dtype_of(t.data_type)
            .ok_or_else(|| format!("unsupported tensor data type {}", t.data_type))?;
        if let Some(d) = t.dims.iter().find(|d| **d < 0) {
            return Err(format!("negative dim {d} in {:?}", t.dims));
        }
        let want = numel(&t.dims)
            .and_then(|n| n.checked_mul(dtype.size_bytes()))
            .ok_or_else(|| format!("tensor shape {:?} is too large", t.dims))?;
        let bytes = self.read(t, want as u64)?;
        Constant::from_bytes(dtype, t.dims.clone(), bytes)
    }

    /// The `want` bytes `t`'s `external_data` entries point at.
    fn read(&mut self, t: &TensorProto, want: u64) -> Result<Vec<u8>, String> {
        let mut location = None;
        let (mut offset, mut length) = (0u64, None);
        for e in &t.external_data {
            let num = || {
                e.value.parse::<u64>().map_err(|_| {
                    format!(
                        "external data `{}` must be a non-negative integer, found `{}`",
                        e.key, e.value
                    )
                })
            };
            match e.key.as_str() {
                "location" => location = Some(e.value.clone()),
                "offset" => offset = num()?,
                "length" => length = Some(num()?),
                _ => {} // `checksum` and unknown keys carry no data.
            }
        }
        let location = location.ok_or("external data without a `location`")?;
        let (file, len) = self.open(&location)?;
        let len = *len;
        let length = length.unwrap_or_else(|| len.saturating_sub(offset));
        let end = offset
            .checked_add(length)
            .ok_or("external data range overflows")?;
        if end > len {
            return Err(format!(
                "external data `{location}`: bytes {offset}..{end} lie outside the file \
                 ({len} bytes)"
            ));
        }
        if length != want {
            return Err(format!(
                "external data `{location}`: {length} bytes at offset {offset}, but the tensor's \
                 shape {:?} needs {want}",
                t.dims
            ));
        }
        let n = usize::try_from(length).map_err(|_| "external tensor too large".to_string())?;
        let mut bytes = vec![0u8; n];
        file.seek(SeekFrom::Start(offset))
            .and_then(|_| file.read_exact(&mut bytes))
            .map_err(|e| format!("external data `{location}`: {e}"))?;
        Ok(bytes)
    }

    /// Opens the side file at `location` (once), after checking that it stays in the folder
    /// and is a regular file.
    fn open(&mut self, location: &str) -> Result<&mut (File, u64), String> {
        if !self.files.contains_key(location) {
            let path = self.resolve(location)?;
            let meta = std::fs::metadata(&path)
                .map_err(|e| format!("external data `{location}` ({}): {e}", path.display()))?;
            if !meta.is_file() {
                return Err(format!(
                    "external data `{location}` ({}) is not a regular file",
                    path.display()
                ));
            }
            let file = File::open(&path)
                .map_err(|e| format!("external data `{location}` ({}): {e}", path.display()))?;
            self.files.insert(location.to_string(), (file, meta.len()));
        }
        self.files
            .get_mut(location)
            .ok_or_else(|| format!("external data `{location}`: not opened"))
    }

    /// `location` inside the model's folder, or why not.
    fn resolve(&self, location: &str) -> Result<PathBuf, String> {
        let Some(base) = &self.base else {
            return Err(format!(
                "the tensor's data is in the side file `{location}`, but the model was not \
                 read from a file (import it by path so the side file can be found)"
            ));
        };
        let rel = Path::new(location);
        if location.is_empty()
            || rel
                .components()
                .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(format!(
                "external data location `{location}` must be a relative path inside the model's \
                 folder (no absolute path, no `..`)"
            ));
        }
        let path = base.join(rel);
        // Symlinks must not lead out of the folder either.
        let canon_base = base
            .canonicalize()
            .map_err(|e| format!("model folder {}: {e}", base.display()))?;
        let canon = path
            .canonicalize()
            .map_err(|e| format!("external data `{location}` ({}): {e}", path.display()))?;
        if !canon.starts_with(&canon_base) {
            return Err(format!(
                "external data location `{location}` resolves to {}, outside the model's folder",
                canon.display()
            ));
        }
        Ok(canon)
    }
}
