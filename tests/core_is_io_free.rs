//! The deployment core (dstwin-core) is IO-free: no async runtime, no sockets, no HTTP, no
//! clocks, no files, no threads. Both drivers (the simulator's virtual time and the runtime's
//! wall clock) feed it time as an argument. This test fails the build when the core gains such
//! a dependency, directly or through another crate, or uses the standard library's IO.

use serde_json::Value;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::Command;

/// Crates that do IO or run tasks: none may be in the core's dependency tree.
const FORBIDDEN_CRATES: &[&str] = &[
    "tokio",
    "axum",
    "hyper",
    "hyper-util",
    "mio",
    "socket2",
    "reqwest",
    "tower",
    "futures-util",
    "async-std",
    "rayon",
];

/// Standard-library paths the core's sources must not name.
const FORBIDDEN_PATHS: &[&str] = &[
    "std::net",
    "std::fs",
    "std::io",
    "std::thread",
    "std::process",
    "std::time::Instant",
    "std::time::SystemTime",
    "Instant::now",
    "SystemTime::now",
    "rand::random",
    "thread_rng",
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_core_depends_on_no_io_crate() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline"])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let names: HashMap<&str, &str> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let nodes: HashMap<&str, &Value> = meta["resolve"]["nodes"]
        .as_array()
        .expect("resolve nodes")
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), n))
        .collect();
    let core = names
        .iter()
        .find(|(_, n)| **n == "dstwin-core")
        .map(|(id, _)| *id)
        .expect("dstwin-core in the workspace");
    // Normal (not dev or build) dependencies, transitively.
    let mut seen = BTreeSet::new();
    let mut stack = vec![core];
    while let Some(id) = stack.pop() {
        for d in nodes[id]["deps"].as_array().into_iter().flatten() {
            let normal = d["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| k["kind"].is_null());
            let pkg = d["pkg"].as_str().unwrap();
            if normal && seen.insert(names[pkg]) {
                stack.push(pkg);
            }
        }
    }
    let bad: Vec<_> = FORBIDDEN_CRATES
        .iter()
        .filter(|c| seen.contains(**c))
        .collect();
    assert!(
        bad.is_empty(),
        "dstwin-core must stay IO-free but depends on {bad:?} (its tree: {seen:?})"
    );
    // The tree the core is allowed today, so a new dependency is a conscious decision.
    assert!(seen.contains("dstwin-hwmodels") && seen.contains("serde"));
}

#[test]
fn the_core_sources_use_no_io() {
    let mut files = Vec::new();
    let mut dirs = vec![root().join("engine/core/src")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("a source directory") {
            let p = e.expect("an entry").path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    assert!(files.len() > 10, "the core's sources were found");
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("a source file");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for p in FORBIDDEN_PATHS {
                if code.contains(p) {
                    found.push(format!("{}:{}: {p}", f.display(), n + 1));
                }
            }
        }
    }
    assert!(found.is_empty(), "IO in the core: {found:#?}");
}
