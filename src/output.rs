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

/// Writes the file `path` with `fill`, whole or not at all: into a temporary file beside it
/// (created anew, with the permissions of the file it replaces), flushed to disk, then renamed
/// over it. A full disk or a failed `fill` leaves `path` as it was and no temporary file
/// behind. A `path` that is a symbolic link or exists as something other than a regular file
/// (a pipe, `/dev/stdout`) is written through directly, as before: renaming over it would
/// replace the link, not what it points to.
pub fn write_atomic(
    path: &Path,
    fill: impl FnOnce(&mut std::fs::File) -> io::Result<()>,
) -> io::Result<()> {
    let old = std::fs::symlink_metadata(path).ok();
    if old.as_ref().is_some_and(|m| !m.is_file()) {
        let mut f = std::fs::File::create(path)?;
        return fill(&mut f).and_then(|()| f.flush());
    }
    let tmp = temp_beside(path, "tmp")?;
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| {
            if let Some(m) = &old {
                f.set_permissions(m.permissions())?;
            }
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

/// A hidden file beside `path` for this process: `.NAME.PID.SUFFIX`.
fn temp_beside(path: &Path, suffix: &str) -> io::Result<std::path::PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"))?;
    Ok(path.with_file_name(format!(
        ".{}.{}.{suffix}",
        name.to_string_lossy(),
        std::process::id()
    )))
}

/// Fails now, before a long run, when the output file `path` cannot be written: opens it for
/// writing (without truncating it) and removes it again if it did not exist, and creates and
/// removes a file beside it (the directory must take the temporary file [`write_atomic`]
/// renames over it).
pub fn check_file(path: &Path, what: &str) -> Result<(), Failure> {
    let cannot = || format!("{what} {}: cannot write there", path.display());
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .with_context(cannot)
        .map_err(Failure::Runtime)?;
    if !existed {
        // Best effort: an empty file left behind would be the only trace of the check.
        let _ = std::fs::remove_file(path);
    }
    let is_regular = std::fs::symlink_metadata(path).map_or(true, |m| m.is_file());
    if is_regular {
        let probe = temp_beside(path, "check")
            .with_context(cannot)
            .map_err(Failure::Runtime)?;
        std::fs::File::create(&probe)
            .with_context(|| {
                format!(
                    "{what} {}: its directory does not take new files",
                    path.display()
                )
            })
            .map_err(Failure::Runtime)?;
        let _ = std::fs::remove_file(&probe);
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
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            // The replaced file's permissions are kept.
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            assert!(write_file(&path, b"third").is_ok());
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
            // A link is written through: what it points to changes, the link stays.
            let link = dir.join("link.json");
            std::os::unix::fs::symlink(&path, &link).unwrap();
            assert!(write_file(&link, b"through").is_ok());
            assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
            assert_eq!(std::fs::read(&path).unwrap(), b"through");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
