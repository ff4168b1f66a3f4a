//! Standard output of every command. `println!` panics when the reader goes away (`dstwin
//! validate | head -3`) or the disk is full (`> /dev/full`); these write through one function
//! that turns a closed pipe into a quiet success and any other write failure into an error.

use crate::Failure;
use std::io::{self, Write};

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

pub(crate) use {out, outln};
