//! The CLI's standard output and error, without panics.
//!
//! Contract: `println!` panics when stdout is closed (`fusebox show m.relax | head -1`) or full
//! (`>/dev/full`), which left `run` with some outputs written. Here every write to stdout goes
//! through [`write`]: the first error is kept and later writes are skipped, so the command
//! runs to its end (every output file complete) and [`finish`] hands the error back to
//! `main`: a broken pipe is a quiet exit (the reader has what it wanted), any other error is
//! reported and the exit code is 1. Writes to stderr ([`err`]) ignore errors: there is nowhere
//! left to report them.
//!
//! ```text
//! $ fusebox show model.relax | head -1     # exit 0, no panic message
//! @I.ir_module
//! $ fusebox show model.relax > /dev/full    # exit 1
//! error: writing to standard output: No space left on device (os error 28)
//! ```

use std::io::Write;
use std::sync::Mutex;

/// The first error writing to stdout, if any.
static FAILED: Mutex<Option<std::io::Error>> = Mutex::new(None);

/// Writes to stdout unless an earlier write failed; keeps the first error.
pub fn write(args: std::fmt::Arguments<'_>) {
    let mut failed = FAILED.lock().unwrap_or_else(|e| e.into_inner());
    if failed.is_none()
        && let Err(e) = std::io::stdout().lock().write_fmt(args)
    {
        *failed = Some(e);
    }
}

/// Writes to stderr, ignoring errors.
pub fn err(args: std::fmt::Arguments<'_>) {
    let _ = std::io::stderr().lock().write_fmt(args);
}

/// Flushes stdout and returns the first error writing to it, if any.
pub fn finish() -> Option<std::io::Error> {
    let mut failed = FAILED.lock().unwrap_or_else(|e| e.into_inner());
    if failed.is_none()
        && let Err(e) = std::io::stdout().lock().flush()
    {
        *failed = Some(e);
    }
    failed.take()
}

/// `print!` through [`write`].
macro_rules! out {
    ($($t:tt)*) => {
        $crate::out::write(format_args!($($t)*))
    };
}

/// `println!` through [`write`].
macro_rules! outln {
    () => {
        $crate::out::write(format_args!("\n"))
    };
    ($($t:tt)*) => {
        $crate::out::write(format_args!("{}\n", format_args!($($t)*)))
    };
}

/// `eprintln!` through [`err`].
macro_rules! errln {
    ($($t:tt)*) => {
        $crate::out::err(format_args!("{}\n", format_args!($($t)*)))
    };
}
