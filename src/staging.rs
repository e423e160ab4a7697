//! Output directories written all or nothing: `fusebox run --output-dir` and `fusebox compile
//! --out-dir`.
//!
//! Contract: [`Staging::new`] makes a fresh directory with a unique hidden name
//! (`.fusebox-staging-<pid>-<n>`, created with `mkdir`, which fails rather than reuse or follow
//! anything already there) inside the output directory. [`Staging::write`] creates each file
//! in it with `O_CREAT | O_EXCL` (`create_new`), so a planted symlink is never followed, and
//! syncs it. Nothing in the output directory changes until [`Staging::commit`], which renames
//! every file into place (a rename replaces a symlink at the destination instead of writing
//! through it) in the order they were written, then removes the staging directory. Dropped
//! without a commit (a failed write, a failed `--check`), the staging directory is removed and
//! the output directory is as it was. An output path that exists and is not a directory is an
//! error naming it.
//!
//! ```text
//! out/.fusebox-staging-4242-0/logits.npy   written, synced
//! out/.fusebox-staging-4242-0/probs.npy    written, synced        (--check passes)
//! out/logits.npy, out/probs.npy            renamed into place by commit
//! ```

use fusebox_core::Error;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Staging directories made by this process so far (part of the unique name).
static COUNTER: AtomicU64 = AtomicU64::new(0);

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Files staged for an output directory (see the module doc).
#[derive(Debug)]
pub struct Staging {
    dir: PathBuf,
    tmp: PathBuf,
    /// The files written, in order (the order [`Staging::commit`] renames them in).
    files: Vec<String>,
    committed: bool,
}

impl Staging {
    /// Creates `dir` if needed and a fresh staging directory inside it.
    pub fn new(dir: &Path) -> Result<Staging, Error> {
        if dir.exists() && !dir.is_dir() {
            return Err(Error::Invalid(format!(
                "output directory {}: exists and is not a directory",
                dir.display()
            )));
        }
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let pid = std::process::id();
        loop {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let tmp = dir.join(format!(".fusebox-staging-{pid}-{n}"));
            match std::fs::create_dir(&tmp) {
                Ok(()) => {
                    return Ok(Staging {
                        dir: dir.to_path_buf(),
                        tmp,
                        files: Vec::new(),
                        committed: false,
                    });
                }
                // Left by an earlier process of the same pid, or planted: take the next name.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1 << 20 => {}
                Err(e) => return Err(io(&tmp)(e)),
            }
        }
    }

    /// The output directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where `name` will be once committed.
    pub fn final_path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Writes `bytes` as `name` (a plain file name) into the staging directory.
    pub fn write(&mut self, name: &str, bytes: &[u8]) -> Result<(), Error> {
        if name.is_empty() || name.contains(['/', '\\', '\0']) || name == "." || name == ".." {
            return Err(Error::Invalid(format!(
                "output file name {name:?} is not a plain file name"
            )));
        }
        let path = self.tmp.join(name);
        // The staging directory is this writer's own (made fresh by `mkdir`), so a name that
        // `create_new` finds there was written before: the filesystem's lookup is the
        // written-twice check (no scan of the earlier names: a model may have 100,000 outputs).
        let mut f = match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(Error::Invalid(format!(
                    "output file {name:?} is written twice"
                )));
            }
            r => r.map_err(io(&path))?,
        };
        f.write_all(bytes)
            .and_then(|()| f.sync_all())
            .map_err(io(&path))?;
        self.files.push(name.to_string());
        Ok(())
    }

    /// Moves every staged file into the output directory, in the order written, and removes
    /// the staging directory. Returns the final paths.
    pub fn commit(mut self) -> Result<Vec<PathBuf>, Error> {
        let mut out = Vec::with_capacity(self.files.len());
        for name in &self.files {
            let to = self.dir.join(name);
            std::fs::rename(self.tmp.join(name), &to).map_err(io(&to))?;
            out.push(to);
        }
        self.committed = true;
        std::fs::remove_dir(&self.tmp).map_err(io(&self.tmp))?;
        Ok(out)
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic, reason = "test code")]
    use super::*;

    fn fresh(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fusebox-staging-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn nothing_changes_until_commit_and_a_drop_leaves_no_trace() {
        let d = fresh("drop");
        std::fs::write(d.join("a.npy"), b"old").unwrap();
        {
            let mut s = Staging::new(&d).unwrap();
            s.write("a.npy", b"new").unwrap();
            s.write("b.npy", b"new").unwrap();
            assert_eq!(std::fs::read(d.join("a.npy")).unwrap(), b"old");
            assert!(!d.join("b.npy").exists());
        }
        let left: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("a.npy")]);
        let mut s = Staging::new(&d).unwrap();
        s.write("a.npy", b"new").unwrap();
        s.write("b.npy", b"new").unwrap();
        let paths = s.commit().unwrap();
        assert_eq!(paths, vec![d.join("a.npy"), d.join("b.npy")]);
        assert_eq!(std::fs::read(d.join("a.npy")).unwrap(), b"new");
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 2);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[cfg(unix)]
    #[test]
    fn a_planted_symlink_is_replaced_not_followed() {
        let d = fresh("symlink");
        let victim = d.join("victim.txt");
        std::fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, d.join("out.npy")).unwrap();
        std::os::unix::fs::symlink(&victim, d.join("out.npy.tmp")).unwrap();
        let mut s = Staging::new(&d).unwrap();
        s.write("out.npy", b"data").unwrap();
        s.commit().unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(std::fs::read(d.join("out.npy")).unwrap(), b"data");
        assert!(
            !std::fs::symlink_metadata(d.join("out.npy"))
                .unwrap()
                .is_symlink()
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_name_written_twice_is_refused_and_many_names_stay_in_order() {
        let d = fresh("twice");
        let mut s = Staging::new(&d).unwrap();
        let names: Vec<String> = (0..2_000).map(|i| format!("o{}.npy", 1_999 - i)).collect();
        for n in &names {
            s.write(n, b"x").unwrap();
        }
        let e = s.write("o7.npy", b"y").unwrap_err().to_string();
        assert!(e.contains("\"o7.npy\" is written twice"), "{e}");
        let paths = s.commit().unwrap();
        let want: Vec<PathBuf> = names.iter().map(|n| d.join(n)).collect();
        assert_eq!(paths, want);
        assert_eq!(std::fs::read(d.join("o7.npy")).unwrap(), b"x");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_file_as_output_directory_is_a_clear_error() {
        let d = fresh("file");
        let f = d.join("not-a-dir");
        std::fs::write(&f, b"x").unwrap();
        let e = Staging::new(&f).unwrap_err().to_string();
        assert!(e.contains("exists and is not a directory"), "{e}");
        let e = Staging::new(&d)
            .unwrap()
            .write("../escape", b"x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a plain file name"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
