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

/// Writes `bytes` to the file `path` whole or not at all ([`write_atomic`]), naming the file in
/// the error.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    write_atomic(path, |f| f.write_all(bytes))
        .with_context(|| format!("writing {}", path.display()))
        .map_err(Failure::Runtime)
}

/// Writes the file `path` with `fill`, whole or not at all: into a temporary file beside it,
/// flushed to disk, then renamed over it. A full disk or a failed `fill` leaves `path` as it
/// was and no temporary file behind. A `path` that exists and is not a regular file (a pipe,
/// `/dev/stdout`) is written directly: there is nothing to rename over it.
pub fn write_atomic(
    path: &Path,
    fill: impl FnOnce(&mut std::fs::File) -> io::Result<()>,
) -> io::Result<()> {
    if path.metadata().is_ok_and(|m| !m.is_file()) {
        let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
        return fill(&mut f).and_then(|()| f.flush());
    }
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"))?;
    let tmp = path.with_file_name(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = std::fs::File::create(&tmp).and_then(|mut f| {
        fill(&mut f)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    });
    if written.is_err() {
        // Best effort: the temporary file is all a failure leaves.
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_file_is_written_whole_or_not_at_all() {
        let dir = std::env::temp_dir().join(format!("dstwin-atomic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("plan.json");
        assert!(write_file(&path, b"first").is_ok());
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        // A write that fails half-way (as on a full disk) leaves the old file and no temporary.
        let e = write_atomic(&path, |f| {
            f.write_all(b"half of the new")?;
            Err(io::Error::other("No space left on device"))
        })
        .unwrap_err();
        assert!(e.to_string().contains("No space"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        assert_eq!(entries(&dir), vec!["plan.json".to_string()]);
        // And a new file that fails is not created at all.
        let new = dir.join("requests.csv");
        assert!(write_atomic(&new, |_| Err(io::Error::other("full"))).is_err());
        assert!(!new.exists());
        assert_eq!(entries(&dir), vec!["plan.json".to_string()]);
        assert!(write_file(&path, b"second").is_ok());
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
