//! The deployment core (dstwin-core) is IO-free: no async runtime, no sockets, no HTTP, no
//! clocks, no files, no threads. Both drivers (the simulator's virtual time and the runtime's
//! wall clock) feed it time as an argument. This test fails the build when the core gains such
//! a dependency, directly or through another crate, or uses the standard library's IO.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

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

/// Package name -> the names of its dependencies, from Cargo.lock (every kind and platform:
/// stricter than the build needs, and readable without the network or cargo).
/// Cargo.lock as a graph of packages keyed `name version`: several versions of one crate can be
/// locked (a newer one may pull in what an older one does not), so names alone would merge them.
fn lock_graph() -> HashMap<String, Vec<String>> {
    let lock = std::fs::read_to_string(root().join("Cargo.lock")).expect("Cargo.lock");
    let mut packages: Vec<(String, String, Vec<String>)> = Vec::new();
    for pkg in lock.split("[[package]]").skip(1) {
        let field = |key: &str| {
            pkg.lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.trim().trim_matches('"').to_string())
        };
        let name = field("name = ").expect("a package name");
        let version = field("version = ").expect("a package version");
        let deps: Vec<String> = pkg
            .split("dependencies = [")
            .nth(1)
            .map(|d| {
                d[..d.find(']').expect("a closed list")]
                    .split(',')
                    .map(|x| x.trim().trim_matches('"').to_string())
                    .filter(|x| !x.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        packages.push((name, version, deps));
    }
    // A dependency is written `name` when one version is locked, else `name version`.
    let mut versions: HashMap<&str, Vec<&str>> = HashMap::new();
    for (n, v, _) in &packages {
        versions.entry(n).or_default().push(v);
    }
    let key = |dep: &str| {
        let mut parts = dep.split_whitespace();
        let name = parts.next().expect("a dependency name");
        match parts.next() {
            Some(v) => format!("{name} {v}"),
            None => format!("{name} {}", versions[name][0]),
        }
    };
    packages
        .iter()
        .map(|(n, v, deps)| (format!("{n} {v}"), deps.iter().map(|d| key(d)).collect()))
        .collect()
}

/// Crates that only build for wasm32. Cargo.lock records no targets, so a crate that enables a
/// wasm feature anywhere in the workspace (candle's `zip` turns on `getrandom/wasm_js`) makes
/// them appear under `getrandom` for everyone; their dependencies (js-sys's `futures-util`) are
/// never built for a native target and are not followed.
const WASM_ONLY: &[&str] = &["js-sys", "wasm-bindgen"];

/// Names of the crates in the tree of the package named `root` (its dev-dependencies included).
fn tree(graph: &HashMap<String, Vec<String>>, root: &str) -> BTreeSet<String> {
    let start = graph
        .keys()
        .find(|k| k.split(' ').next() == Some(root))
        .unwrap_or_else(|| panic!("{root} in Cargo.lock"))
        .clone();
    let mut seen = BTreeSet::new();
    let mut stack = vec![start];
    while let Some(p) = stack.pop() {
        if WASM_ONLY.iter().any(|w| p.split(' ').next() == Some(*w)) {
            continue;
        }
        for d in graph.get(&p).into_iter().flatten() {
            if seen.insert(d.clone()) {
                stack.push(d.clone());
            }
        }
    }
    seen.into_iter()
        .map(|k| k.split(' ').next().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn the_core_depends_on_no_io_crate() {
    let graph = lock_graph();
    let seen = tree(&graph, "dstwin-core");
    let bad: Vec<_> = FORBIDDEN_CRATES
        .iter()
        .filter(|c| seen.contains(**c))
        .collect();
    assert!(
        bad.is_empty(),
        "dstwin-core must stay IO-free but depends on {bad:?} (its tree: {seen:?})"
    );
    // The tree is really read: the core's own dependencies are in it.
    assert!(seen.contains("dstwin-hwmodels") && seen.contains("serde"));
    // And the check bites: the runtime's tree holds what the core's must not.
    let runtime = tree(&graph, "dstwin-runtime");
    assert!(runtime.contains("tokio") && runtime.contains("axum"));
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
