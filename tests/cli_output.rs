//! Standard output that goes away or cannot be written: a reader that closed the pipe early
//! (`dstwin validate | head -3`) is a quiet success, a full disk is an error with the reason.
//! Neither may panic.

use std::process::{Command, Stdio};

/// Runs dstwin with `args`, its standard output a pipe whose read end is already closed.
fn with_closed_pipe(args: &[&str]) -> std::process::Output {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    Command::new(env!("CARGO_BIN_EXE_dstwin"))
        .args(args)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("run dstwin")
}

#[test]
fn a_closed_pipe_ends_every_command_quietly() {
    for args in [
        &["catalog"][..],
        &["simulate", "-q", "--json"],
        &["simulate", "-q"],
        &["explain"],
    ] {
        let out = with_closed_pipe(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?} wrote to stderr: {stderr}");
    }
}

#[cfg(target_os = "linux")]
#[test]
fn a_full_disk_is_an_error_not_a_panic() {
    for args in [&["catalog"][..], &["simulate", "-q", "--json"]] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("open /dev/full");
        let out = Command::new(env!("CARGO_BIN_EXE_dstwin"))
            .args(args)
            .stdout(full)
            .output()
            .expect("run dstwin");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("writing to standard output") && !stderr.contains("panicked"),
            "{args:?}: {stderr}"
        );
    }
}

/// A path no one can write: /proc does not let anyone create files.
const UNWRITABLE: &str = "/proc/dstwin-nope/x";

#[cfg(target_os = "linux")]
#[test]
fn unwritable_outputs_fail_before_the_run() {
    let sweep_scenario = format!("{}/tests/data/tiny-mixed.toml", env!("CARGO_MANIFEST_DIR"));
    for args in [
        vec!["simulate", "-q", "--requests-csv", UNWRITABLE],
        vec!["simulate", "-q", "--timeline", UNWRITABLE],
        vec!["plan", "-q", "--out", UNWRITABLE],
        vec![
            "sweep",
            &sweep_scenario,
            "--vary",
            "seed=1,2",
            "--out",
            UNWRITABLE,
            "-q",
        ],
    ] {
        let started = std::time::Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_dstwin"))
            .args(&args)
            .output()
            .expect("run dstwin");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        // The check before the run names the option; a failure after it would say "writing".
        let option = args
            .iter()
            .find(|a| a.starts_with("--") && **a != "--vary")
            .unwrap();
        assert!(
            stderr.contains(&format!("{option} {UNWRITABLE}")) && stderr.contains("cannot"),
            "{args:?}: {stderr}"
        );
        // Before the run: nothing was simulated (plan takes tens of seconds, simulate seconds).
        assert!(out.stdout.is_empty(), "{args:?} ran");
        assert!(
            started.elapsed().as_secs() < 5,
            "{args:?} took {:?}",
            started.elapsed()
        );
    }
}

/// Standard error that goes away: messages are lost, the command is not (`eprintln!` panics
/// there, exit 101). An error still exits 2, a run still succeeds.
#[test]
fn a_closed_stderr_loses_messages_not_the_run() {
    for (args, code) in [
        (&["simulate", "--json"][..], 0),
        (&["simulate", "/nonexistent/scenario.toml"], 2),
    ] {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let out = Command::new(env!("CARGO_BIN_EXE_dstwin"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(writer)
            .output()
            .expect("run dstwin");
        assert_eq!(out.status.code(), Some(code), "{args:?}");
    }
}
