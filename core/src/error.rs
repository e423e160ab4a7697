//! The error type of fusebox-core.

use std::fmt;
use std::path::PathBuf;

/// A position in a source text: 1-based line and column (in characters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pos {
    /// 1-based line.
    pub line: u32,
    /// 1-based column, counted in characters.
    pub col: u32,
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

/// A diagnostic tied to a source file: `file:line:col: message`, the offending line and a caret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceError {
    /// The file name as given by the user (or `<input>`).
    pub file: String,
    /// Where the problem is.
    pub pos: Pos,
    /// What went wrong, phrased as "expected X, found Y" where that applies.
    pub message: String,
    /// The source line at `pos`, without its line break.
    pub line_text: String,
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}:{}: {}", self.file, self.pos, self.message)?;
        let num = self.pos.line.to_string();
        let pad = " ".repeat(num.len());
        writeln!(f, "{pad} |")?;
        writeln!(f, "{num} | {}", self.line_text)?;
        // The caret sits under the column; tabs are kept so the caret lines up in a terminal.
        let mut caret = String::new();
        for (i, ch) in self.line_text.chars().enumerate() {
            if i + 1 >= self.pos.col as usize {
                break;
            }
            caret.push(if ch == '\t' { '\t' } else { ' ' });
        }
        write!(f, "{pad} | {caret}^")
    }
}

/// Every error fusebox-core reports.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A text-format parse or type error, with its position.
    #[error("{0}")]
    Source(Box<SourceError>),
    /// The verifier found one or more violated invariants.
    #[error("{0}")]
    Verify(crate::ir::verify::VerifyErrors),
    /// A type (shape/dtype) inference failure outside a source text (builder use).
    #[error("type error in {op}: {message}")]
    Type {
        /// The op whose inference failed.
        op: String,
        /// Why.
        message: String,
    },
    /// Misuse of the builder API or an ill-formed construction request.
    #[error("{0}")]
    Invalid(String),
    /// A constant side file could not be read or written.
    #[error("{path}: {message}")]
    Constants {
        /// The side file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// An I/O failure on a named file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A run-time value is ill-formed (a tensor whose data does not match its shape, a value
    /// of the wrong kind).
    #[error("runtime: {0}")]
    Runtime(String),
    /// A tensor would exceed the memory limit, or the allocator refused it (see
    /// [`crate::runtime::memory`]). (Boxed to keep `Error` small.)
    #[error("{0}")]
    Memory(Box<crate::runtime::memory::MemoryError>),
    /// A backend failed (claim, compile or run), named.
    #[error("backend `{backend}`: {message}")]
    Backend {
        /// The backend's name.
        backend: String,
        /// What went wrong.
        message: String,
    },
    /// A name that is not one of the known ones (a backend, a config key), with the valid ones.
    /// (Boxed to keep `Error` small: parsers recurse with it on the stack.)
    #[error("unknown {} `{}`; expected one of: {}", .0.what, .0.name, .0.valid)]
    Unknown(Box<UnknownName>),
    /// A plugin library could not be loaded or misbehaved, naming the library.
    #[error("plugin {library}: {message}")]
    Plugin {
        /// The library's path.
        library: String,
        /// What went wrong.
        message: String,
    },
    /// `strict = true` and some work was claimed by no backend.
    #[error("strict mode: no backend claimed {0}")]
    Unclaimed(String),
}

/// The payload of [`Error::Unknown`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownName {
    /// What kind of name (`backend`, `option of backend cpu`).
    pub what: String,
    /// The name given.
    pub name: String,
    /// The valid names, comma separated (or `(none)`).
    pub valid: String,
}

/// The result type of fusebox-core.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An unknown name, with the valid ones.
    pub fn unknown(what: impl Into<String>, name: impl Into<String>, valid: String) -> Self {
        Error::Unknown(Box::new(UnknownName {
            what: what.into(),
            name: name.into(),
            valid,
        }))
    }

    /// A positioned source error.
    pub fn source(file: &str, src: &str, pos: Pos, message: impl Into<String>) -> Self {
        let line_text = src
            .lines()
            .nth(pos.line.saturating_sub(1) as usize)
            .unwrap_or("")
            .to_string();
        Error::Source(Box::new(SourceError {
            file: file.to_string(),
            pos,
            message: message.into(),
            line_text,
        }))
    }

    /// The positioned error, if this is one.
    pub fn as_source(&self) -> Option<&SourceError> {
        match self {
            Error::Source(s) => Some(s),
            _ => None,
        }
    }
}
