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

/// The most characters of the offending line a [`SourceError`] shows (a window around the
/// column, with `…` where it was cut).
const LINE_WINDOW: usize = 120;

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}:{}: {}",
            self.file,
            self.pos,
            cap_long_values(&self.message)
        )?;
        let num = self.pos.line.to_string();
        let pad = " ".repeat(num.len());
        writeln!(f, "{pad} |")?;
        // A window of the line around the column: a 5 MB line is not echoed whole.
        let chars: Vec<char> = self.line_text.chars().collect();
        let col = (self.pos.col as usize).saturating_sub(1).min(chars.len());
        let start = col.saturating_sub(LINE_WINDOW / 2);
        let end = (start + LINE_WINDOW).min(chars.len());
        let start = end.saturating_sub(LINE_WINDOW).min(start);
        let lead = if start > 0 { "…" } else { "" };
        let tail = if end < chars.len() { "…" } else { "" };
        let shown: String = chars[start..end].iter().collect();
        writeln!(f, "{num} | {lead}{shown}{tail}")?;
        // The caret sits under the column; tabs are kept so the caret lines up in a terminal.
        let mut caret = String::from(if start > 0 { " " } else { "" });
        for &ch in &chars[start..col] {
            caret.push(if ch == '\t' { '\t' } else { ' ' });
        }
        write!(f, "{pad} | {caret}^")
    }
}

/// The longest value an error message quotes whole; longer ones are cut (see
/// [`cap_long_values`]).
const MAX_QUOTED: usize = 200;

/// `msg` with every overlong value cut to its first characters, `…` and its length: a run
/// between backticks or double quotes, or a run without whitespace, longer than 200 characters.
/// Error messages quote what the user gave; a 5 MB value is not echoed back.
///
/// ```
/// let long = "9".repeat(5_000_000);
/// let msg = format!("dimension `{long}` is too large");
/// let capped = fusebox_core::error::cap_long_values(&msg);
/// assert_eq!(capped, format!("dimension `{}…` (5000000 characters) is too large", "9".repeat(100)));
/// assert_eq!(fusebox_core::error::cap_long_values("short `x`"), "short `x`");
/// ```
pub fn cap_long_values(msg: &str) -> String {
    if msg.len() <= MAX_QUOTED {
        return msg.to_string();
    }
    let chars: Vec<char> = msg.chars().collect();
    let mut out = String::with_capacity(msg.len().min(4096));
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        // A quoted run: up to the matching quote on the same line.
        if matches!(c, '`' | '"')
            && let Some(len) = chars[i + 1..].iter().position(|&x| x == c || x == '\n')
            && chars[i + 1 + len] == c
        {
            let inner = &chars[i + 1..i + 1 + len];
            out.push(c);
            push_capped(&mut out, inner);
            out.push(c);
            if inner.len() > MAX_QUOTED {
                out.push_str(&format!(" ({} characters)", inner.len()));
            }
            i += len + 2;
            continue;
        }
        if c.is_whitespace() {
            out.push(c);
            i += 1;
            continue;
        }
        let len = chars[i..]
            .iter()
            .position(|x| x.is_whitespace() || matches!(x, '`' | '"'))
            .unwrap_or(chars.len() - i)
            .max(1);
        let word = &chars[i..i + len];
        push_capped(&mut out, word);
        if word.len() > MAX_QUOTED {
            out.push_str(&format!(" ({} characters)", word.len()));
        }
        i += len;
    }
    out
}

fn push_capped(out: &mut String, s: &[char]) {
    if s.len() > MAX_QUOTED {
        out.extend(&s[..MAX_QUOTED / 2]);
        out.push('…');
    } else {
        out.extend(s);
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
    /// `strict = true` and some work ends on the CPU reference because the backends that
    /// claimed it could not compile it.
    #[error("strict mode: backends claimed but could not compile {0}")]
    CompileFailed(String),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_line_is_shown_as_a_window_with_the_caret_on_the_column() {
        let long = format!("x = {}bad{}", "a".repeat(1000), "b".repeat(1000));
        let col = 4 + 1000 + 1;
        let e = Error::source("f.relax", &long, Pos { line: 1, col }, "unexpected `bad`");
        let text = e.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "f.relax:1:1005: unexpected `bad`");
        assert!(
            lines[2].starts_with("1 | …") && lines[2].ends_with('…'),
            "{}",
            lines[2]
        );
        assert!(lines[2].chars().count() < LINE_WINDOW + 10);
        // The caret is under the `b` of `bad`.
        let caret = lines[3].chars().position(|c| c == '^').unwrap_or(0);
        assert_eq!(lines[2].chars().nth(caret), Some('b'));
        assert_eq!(
            lines[2].chars().skip(caret).take(3).collect::<String>(),
            "bad"
        );
        // A short line is shown whole, as before.
        let e = Error::source("f.relax", "y = oops", Pos { line: 1, col: 5 }, "m");
        assert_eq!(
            e.to_string(),
            "f.relax:1:5: m\n  |\n1 | y = oops\n  |     ^"
        );
    }

    #[test]
    fn long_values_are_cut_once_and_short_text_is_untouched() {
        let msg = format!(
            "expected `)`, found \"{}\" in {}",
            "q".repeat(10_000),
            "/a/b.relax"
        );
        let capped = cap_long_values(&msg);
        assert!(capped.len() < 300, "{capped}");
        assert!(
            capped.ends_with("\" (10000 characters) in /a/b.relax"),
            "{capped}"
        );
        assert_eq!(cap_long_values(&capped), capped);
        let normal =
            "the file doesn't exist: it's a directory, and a path like /work/main/x.onnx stays";
        assert_eq!(cap_long_values(normal), normal);
    }
}
