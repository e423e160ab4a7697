//! The on-disk autotune cache: which cuBLASLt algorithm won for a plan on a device.
//!
//! Contract:
//!
//! - The key is a text that names everything the choice depends on: a format tag, the
//!   cuBLASLt version, the device name and compute capability, the plan (its `Debug` form:
//!   types, layouts, epilogue, launches) and the operands' alignments. An entry is
//!   `<dir>/cublaslt/<sha256 of the key>.json` holding the key itself, the algorithm's 64
//!   opaque bytes (cuBLASLt allows storing them for reuse with the same library version), its
//!   workspace and the measured time. `<dir>` is fusebox-cuda's cache directory
//!   ([`fusebox_cuda::cache::Cache::default_dir`]: `$FUSEBOX_CACHE_DIR`, else
//!   `$XDG_CACHE_HOME/fusebox/cuda`, else `$HOME/.cache/fusebox/cuda`).
//! - A missing, unreadable or corrupt entry, or one whose stored key differs, is a miss; so is
//!   an algorithm cuBLASLt no longer accepts (checked by the caller with
//!   `cublasLtMatmulAlgoCheck`). Writes go to a temporary file renamed into place. The cache
//!   never makes a call fail: a failed write is ignored.
//!
//! ```
//! use fusebox_cublas::tune::{TuneCache, TuneEntry};
//! let dir = std::env::temp_dir().join(format!("fusebox-tune-doc-{}", std::process::id()));
//! let cache = TuneCache::new(&dir);
//! let e = TuneEntry { key: "k".into(), algo: [1, 2, 3, 4, 5, 6, 7, 8], workspace: 64, ms: 0.5 };
//! cache.put(&e);
//! assert_eq!(cache.get("k"), Some(e));
//! assert_eq!(cache.get("other"), None);
//! # let _ = std::fs::remove_dir_all(&dir);
//! ```

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// One cached choice.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuneEntry {
    /// The full key (compared on read, so a hash collision is a miss).
    pub key: String,
    /// `cublasLtMatmulAlgo_t`'s opaque words.
    pub algo: [u64; 8],
    /// The workspace bytes it needs.
    pub workspace: usize,
    /// The measured time per call, in milliseconds.
    pub ms: f32,
}

/// An autotune cache directory (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TuneCache {
    dir: PathBuf,
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

impl TuneCache {
    /// A cache in `<cache_dir>/cublaslt`.
    pub fn new(cache_dir: &Path) -> TuneCache {
        TuneCache {
            dir: cache_dir.join("cublaslt"),
        }
    }

    /// The cache under fusebox-cuda's default directory, if there is one.
    pub fn from_env() -> Option<TuneCache> {
        fusebox_cuda::cache::Cache::default_dir().map(|d| TuneCache::new(&d))
    }

    /// The directory entries go to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &str) -> PathBuf {
        let mut h = Sha256::new();
        h.update(key.as_bytes());
        self.dir.join(format!("{}.json", hex(&h.finalize())))
    }

    /// The entry for `key`, if a valid one is stored.
    pub fn get(&self, key: &str) -> Option<TuneEntry> {
        let text = std::fs::read_to_string(self.path(key)).ok()?;
        let e: TuneEntry = serde_json::from_str(&text).ok()?;
        (e.key == key).then_some(e)
    }

    /// Stores an entry (errors are ignored: the cache is an optimisation).
    pub fn put(&self, e: &TuneEntry) {
        let _ = self.try_put(e);
    }

    fn try_put(&self, e: &TuneEntry) -> std::io::Result<()> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        std::fs::create_dir_all(&self.dir)?;
        let path = self.path(&e.key);
        let tmp = self.dir.join(format!(
            ".tmp-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let text = serde_json::to_string(e).map_err(std::io::Error::other)?;
        // `create_new`: a planted file or symlink at the temporary name is never written through.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misses_on_corruption_and_foreign_keys() {
        let dir = std::env::temp_dir().join(format!("fusebox-tune-test-{}", std::process::id()));
        let c = TuneCache::new(&dir);
        assert_eq!(c.get("a"), None);
        let e = TuneEntry {
            key: "a".into(),
            algo: [9; 8],
            workspace: 0,
            ms: 1.0,
        };
        c.put(&e);
        assert_eq!(c.get("a").map(|x| x.algo), Some([9; 8]));
        let _ = std::fs::write(c.path("a"), "{ not json");
        assert_eq!(c.get("a"), None);
        // An entry stored under another key's file name (a collision) is a miss.
        let _ = std::fs::write(c.path("b"), serde_json::to_string(&e).unwrap_or_default());
        assert_eq!(c.get("b"), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
