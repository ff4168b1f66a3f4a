//! Helpers shared by the CLI test files (each file is its own crate and uses a subset).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs the built `dstwin` binary with `args` and collects its output.
pub fn dstwin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dstwin"))
        .args(args)
        .output()
        .expect("run dstwin")
}

/// A file under tests/data.
pub fn data(name: &str) -> String {
    format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// An empty directory `dstwin-PREFIX-PID-NAME` under the system's temporary directory.
pub fn tmp_dir(prefix: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("dstwin-{prefix}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A command's standard error as text.
pub fn stderr_text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A file's text; a missing file fails the test with its path.
pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}
