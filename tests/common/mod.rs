//! Helpers shared by the CLI test files (each file is its own crate and uses a subset).
#![allow(dead_code)]

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
