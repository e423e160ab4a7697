//! The on-disk compile cache: CUBIN (with its NVRTC log and ptxas report) by a hash of what
//! made it.
//!
//! Contract:
//!
//! - The key ([`Cache::key`]) is the SHA-256 of, each length-prefixed: a format tag, the
//!   source, the program name, the arch, the NVRTC version and the full NVRTC option list
//!   ([`crate::nvrtc::CompileOptions::to_args`], which includes the header directory). Any
//!   change to one of them is a different entry; nothing else (time, paths of the cache) is
//!   in it.
//! - The directory is `$FUSEBOX_CACHE_DIR`, else `$XDG_CACHE_HOME/fusebox/cuda`, else
//!   `$HOME/.cache/fusebox/cuda` ([`Cache::default_dir`]); it is created on the first write.
//! - An entry is one file `<key>.fbc`: a magic line, a JSON header (name, arch, log, ptxas
//!   report, CUBIN length), the CUBIN, and a SHA-256 of everything before it. Writes go to a
//!   temporary file in the same directory and are renamed into place, so a reader sees a whole
//!   entry or none, and concurrent writers of one key each leave a whole entry.
//! - A missing, truncated, corrupt or unreadable entry, or one whose header disagrees with the
//!   request, is a miss ([`Cache::get`] returns `None`) and is overwritten by the next
//!   [`Cache::put`]. [`compile_cached`] never fails because of the cache: a failed write is
//!   ignored and the compiled result is returned.
//!
//! ```no_run
//! use fusebox_cuda::cache::{Cache, compile_cached};
//! use fusebox_cuda::nvrtc::{Arch, CompileOptions};
//! let cache = Cache::from_env();
//! let src = r#"extern "C" __global__ void k(float* x) { x[threadIdx.x] = 0.f; }"#;
//! let a = compile_cached(cache.as_ref(), src, "k.cu", Arch::Sm90, &CompileOptions::default())?;
//! let b = compile_cached(cache.as_ref(), src, "k.cu", Arch::Sm90, &CompileOptions::default())?;
//! assert!(b.from_cache && a.cubin == b.cubin);
//! # Ok::<(), fusebox_cuda::Error>(())
//! ```

use crate::error::{Error, Result};
use crate::nvrtc::{Arch, CompileOptions, Compiled, PtxasInfo, compile_args, nvrtc};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The first line of every entry; bump the version when the layout changes.
const MAGIC: &[u8] = b"fusebox-cuda-cache 1\n";

/// A cache key: 64 lowercase hex digits.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CacheKey(String);

impl CacheKey {
    /// The hex digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The entry header (JSON).
#[derive(serde::Serialize, serde::Deserialize)]
struct Header {
    name: String,
    arch: String,
    log: String,
    ptxas: Vec<PtxasInfo>,
    cubin_len: usize,
}

/// An on-disk cache directory (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cache {
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

fn io_err(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Cache {
    /// A cache in `dir` (created on the first write).
    pub fn new(dir: impl Into<PathBuf>) -> Cache {
        Cache { dir: dir.into() }
    }

    /// The default directory: `$FUSEBOX_CACHE_DIR`, else `$XDG_CACHE_HOME/fusebox/cuda`, else
    /// `$HOME/.cache/fusebox/cuda`; `None` when none of them is set.
    pub fn default_dir() -> Option<PathBuf> {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        if let Some(d) = var("FUSEBOX_CACHE_DIR") {
            return Some(PathBuf::from(d));
        }
        if let Some(x) = var("XDG_CACHE_HOME") {
            return Some(PathBuf::from(x).join("fusebox").join("cuda"));
        }
        var("HOME").map(|h| PathBuf::from(h).join(".cache").join("fusebox").join("cuda"))
    }

    /// The cache in [`Cache::default_dir`], if there is one.
    pub fn from_env() -> Option<Cache> {
        Cache::default_dir().map(Cache::new)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The key of a compile (see the module doc).
    pub fn key(
        source: &str,
        name: &str,
        arch: Arch,
        nvrtc_version: (u32, u32),
        args: &[String],
    ) -> CacheKey {
        let mut h = Sha256::new();
        let mut field = |b: &[u8]| {
            h.update((b.len() as u64).to_le_bytes());
            h.update(b);
        };
        field(MAGIC);
        field(source.as_bytes());
        field(name.as_bytes());
        field(arch.as_str().as_bytes());
        field(format!("{}.{}", nvrtc_version.0, nvrtc_version.1).as_bytes());
        field(&(args.len() as u64).to_le_bytes());
        for a in args {
            field(a.as_bytes());
        }
        CacheKey(hex(&h.finalize()))
    }

    /// The file of an entry.
    pub fn path(&self, key: &CacheKey) -> PathBuf {
        self.dir.join(format!("{}.fbc", key.0))
    }

    /// The entry for `key`, made for `name` and `arch`; `None` on a miss, including an entry
    /// that cannot be read, is corrupt, or describes another compile.
    pub fn get(&self, key: &CacheKey, name: &str, arch: Arch) -> Option<Compiled> {
        let bytes = std::fs::read(self.path(key)).ok()?;
        let (body, sum) = bytes.split_at_checked(bytes.len().checked_sub(32)?)?;
        if Sha256::digest(body).as_slice() != sum {
            return None;
        }
        let rest = body.strip_prefix(MAGIC)?;
        let nl = rest.iter().position(|&b| b == b'\n')?;
        let header: Header = serde_json::from_slice(&rest[..nl]).ok()?;
        let cubin = &rest[nl + 1..];
        if header.cubin_len != cubin.len() || header.name != name || header.arch != arch.as_str() {
            return None;
        }
        Some(Compiled {
            name: header.name,
            arch,
            cubin: cubin.to_vec(),
            log: header.log,
            ptxas: header.ptxas,
            from_cache: true,
        })
    }

    /// Stores `c` under `key`, atomically (temporary file + rename).
    pub fn put(&self, key: &CacheKey, c: &Compiled) -> Result<()> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        std::fs::create_dir_all(&self.dir).map_err(|e| io_err(&self.dir, e))?;
        let header = Header {
            name: c.name.clone(),
            arch: c.arch.as_str().to_string(),
            log: c.log.clone(),
            ptxas: c.ptxas.clone(),
            cubin_len: c.cubin.len(),
        };
        // serde_json escapes newlines inside strings, so the header is one line.
        let json = serde_json::to_vec(&header).map_err(|e| Error::Io {
            path: self.path(key),
            source: std::io::Error::other(e),
        })?;
        let mut body = Vec::with_capacity(MAGIC.len() + json.len() + 1 + c.cubin.len() + 32);
        body.extend_from_slice(MAGIC);
        body.extend_from_slice(&json);
        body.push(b'\n');
        body.extend_from_slice(&c.cubin);
        let sum = Sha256::digest(&body);
        body.extend_from_slice(&sum);
        let tmp = self.dir.join(format!(
            ".{}.{}.{}.tmp",
            key.0,
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        // `create_new`: a planted file or symlink at the temporary name is never written through.
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .and_then(|mut f| f.write_all(&body))
            .and_then(|()| std::fs::rename(&tmp, self.path(key)));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(io_err(&self.path(key), e));
        }
        Ok(())
    }
}

/// [`crate::nvrtc::compile`] through `cache` (when given): a hit returns the stored result
/// (`from_cache: true`), a miss compiles and stores it. Cache failures never fail the compile.
pub fn compile_cached(
    cache: Option<&Cache>,
    src: &str,
    name: &str,
    arch: Arch,
    options: &CompileOptions,
) -> Result<Compiled> {
    let nv = nvrtc()?;
    let args = options.to_args(arch, nv.include_dir());
    let Some(cache) = cache else {
        return compile_args(src, name, arch, &args);
    };
    let key = Cache::key(src, name, arch, nv.version(), &args);
    if let Some(hit) = cache.get(&key, name, arch) {
        return Ok(hit);
    }
    let c = compile_args(src, name, arch, &args)?;
    // A full disk or a read-only cache directory must not stop the run.
    let _ = cache.put(&key, &c);
    Ok(c)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::panic, reason = "test code: a failure is a panic")]

    use super::*;

    fn sample() -> Compiled {
        Compiled {
            name: "k.cu".into(),
            arch: Arch::Sm90,
            cubin: (0..=255u8).cycle().take(1000).collect(),
            log: "line one\nline \"two\"".into(),
            ptxas: vec![PtxasInfo {
                function: "k".into(),
                entry: true,
                registers: 12,
                ..PtxasInfo::default()
            }],
            from_cache: false,
        }
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("fusebox-cache-unit-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn keys_change_with_every_input() {
        let args = vec!["--gpu-architecture=sm_90".to_string()];
        let k = Cache::key("src", "k.cu", Arch::Sm90, (13, 0), &args);
        assert_eq!(k.as_str().len(), 64);
        assert_eq!(k, Cache::key("src", "k.cu", Arch::Sm90, (13, 0), &args));
        let other_args = vec!["--gpu-architecture=sm_90".to_string(), "-v".to_string()];
        for other in [
            Cache::key("src2", "k.cu", Arch::Sm90, (13, 0), &args),
            Cache::key("src", "j.cu", Arch::Sm90, (13, 0), &args),
            Cache::key("src", "k.cu", Arch::Sm90a, (13, 0), &args),
            Cache::key("src", "k.cu", Arch::Sm90, (13, 1), &args),
            Cache::key("src", "k.cu", Arch::Sm90, (13, 0), &other_args),
            // Length prefixes: moving a byte between fields changes the key.
            Cache::key("srck", ".cu", Arch::Sm90, (13, 0), &args),
        ] {
            assert_ne!(k, other);
        }
    }

    #[test]
    fn put_then_get_and_corruption_is_a_miss() {
        let dir = temp_dir("roundtrip");
        let cache = Cache::new(&dir);
        let key = Cache::key("s", "k.cu", Arch::Sm90, (13, 0), &[]);
        assert_eq!(cache.get(&key, "k.cu", Arch::Sm90), None);
        let c = sample();
        cache.put(&key, &c).unwrap_or_else(|e| panic!("{e}"));
        let hit = cache.get(&key, "k.cu", Arch::Sm90);
        assert_eq!(
            hit,
            Some(Compiled {
                from_cache: true,
                ..c.clone()
            })
        );
        // Another name or arch under the same key (a collision, or a hand-made file): a miss.
        assert_eq!(cache.get(&key, "j.cu", Arch::Sm90), None);
        assert_eq!(cache.get(&key, "k.cu", Arch::Sm80), None);
        // No temporary files are left behind.
        let names: Vec<String> = std::fs::read_dir(&dir)
            .map(|r| {
                r.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(names, vec![format!("{}.fbc", key.as_str())]);
        // Flip one byte of the CUBIN: the checksum catches it.
        let p = cache.path(&key);
        let mut bytes = std::fs::read(&p).unwrap_or_default();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x55;
        std::fs::write(&p, &bytes).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cache.get(&key, "k.cu", Arch::Sm90), None);
        // Truncated, empty and garbage files are misses too.
        for junk in [&bytes[..10], &[][..], b"fusebox-cuda-cache 1\n{not json\n"] {
            std::fs::write(&p, junk).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(cache.get(&key, "k.cu", Arch::Sm90), None);
        }
        // A put over a corrupt entry repairs it.
        cache.put(&key, &c).unwrap_or_else(|e| panic!("{e}"));
        assert!(cache.get(&key, "k.cu", Arch::Sm90).is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_unwritable_directory_is_an_error_from_put_only() {
        let dir = temp_dir("unwritable");
        let _ = std::fs::create_dir_all(&dir);
        // A file where the cache directory should be.
        let blocked = dir.join("file");
        std::fs::write(&blocked, b"x").unwrap_or_else(|e| panic!("{e}"));
        let cache = Cache::new(blocked.join("cuda"));
        let key = Cache::key("s", "k.cu", Arch::Sm90, (13, 0), &[]);
        assert!(matches!(cache.put(&key, &sample()), Err(Error::Io { .. })));
        assert_eq!(cache.get(&key, "k.cu", Arch::Sm90), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
