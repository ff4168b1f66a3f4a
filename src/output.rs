//! Standard output of every command. `println!` panics when the reader goes away (`dstwin
//! validate | head -3`) or the disk is full (`> /dev/full`); these write through one function
//! that turns a closed pipe into a quiet success and any other write failure into an error.

use crate::Failure;
use anyhow::Context;
use std::io::{self, Write};
use std::path::Path;

/// Writes `text` to standard output and flushes it, so that a failure surfaces here.
pub fn write(text: &str) -> Result<(), Failure> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(failure)
}

/// A failed write to standard output: the reader closed the pipe (nothing more to say, exit 0)
/// or the output cannot be written (exit 1 with the reason).
pub fn failure(e: io::Error) -> Failure {
    if e.kind() == io::ErrorKind::BrokenPipe {
        Failure::OutputClosed
    } else {
        Failure::Runtime(anyhow::Error::new(e).context("writing to standard output"))
    }
}

/// `print!` to standard output, returning `Result<(), Failure>`.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::write(&format!($($arg)*))
    };
}

/// `println!` to standard output, returning `Result<(), Failure>`.
macro_rules! outln {
    () => {
        $crate::output::write("\n")
    };
    ($($arg:tt)*) => {
        $crate::output::write(&format!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprintln!` that never panics: with standard error closed or full the message is lost,
/// and the command goes on (`eprintln!` panics there).
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub(crate) use {errln, out, outln};

/// Fails now, before a long run, when the output file `path` cannot be written: opens it for
/// writing (without truncating it) and removes it again if it did not exist.
pub fn check_file(path: &Path, what: &str) -> Result<(), Failure> {
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .with_context(|| format!("{what} {}: cannot write there", path.display()))
        .map_err(Failure::Runtime)?;
    if !existed {
        // Best effort: an empty file left behind would be the only trace of the check.
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Fails now, before a long run, when files cannot be written into the directory `dir`:
/// creates it and a probe file inside it.
pub fn check_dir(dir: &Path, what: &str) -> Result<(), Failure> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("{what} {}: cannot create the directory", dir.display()))
        .map_err(Failure::Runtime)?;
    check_file(&dir.join(".dstwin-write-check"), what)
}
