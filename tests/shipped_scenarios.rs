//! Every shipped scenario (sim/scenarios/*.toml and sim/scenarios/anchors/*.toml) runs from the
//! repository alone and describes a deployment an operator would run: it meets its own SLOs for
//! most requests, or its description says why not (a saturation point, as some anchors measure).

mod common;
use common::dstwin;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Shorter runs for the test suite (its profile checks invariants, so runs are several times
/// slower than a release build), where the full run is long. Each keeps what the check judges.
const SHORTER: &[(&str, &[&str])] = &[
    // One simulated hour in the scenario. 90 s is past the prefill ramp and lets the requests of
    // the first ~50 s finish (~40 s of decode each); the scenario as it was before, prefill-bound
    // from the start, already missed its SLOs for most of them.
    ("cm384-pd.toml", &["duration_s=90"]),
    // A saturation point, exempt from the SLO check: a minute shows it loads and serves.
    (
        "anchors/cm384-decode-b96.toml",
        &["warmup_s=0", "duration_s=60"],
    ),
];

/// Runs at once: the CI machines have two cores.
const WORKERS: usize = 2;

/// The word a scenario's description uses when it is meant to miss its SLOs.
const EXEMPT: &str = "saturation";

/// At least this share of measured requests within the SLOs.
const MIN_SLO_ATTAINMENT: f64 = 0.5;

/// A copy of sim/scenarios (data/ and anchors/ included) in a fresh directory: a scenario that
/// reads anything outside the directory, as from a checkout's neighbours, fails to load here.
fn copy_of_scenarios(name: &str) -> common::TmpDir {
    let to = common::tmp_dir("test", name);
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("sim/scenarios"),
        &to,
    );
    to
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// The scenario files under `dir`, relative to it, in name order.
fn scenario_files(dir: &Path) -> Vec<String> {
    let mut files = Vec::new();
    for sub in ["", "anchors"] {
        for e in std::fs::read_dir(dir.join(sub)).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            if name.ends_with(".toml") {
                files.push(if sub.is_empty() {
                    name
                } else {
                    format!("{sub}/{name}")
                });
            }
        }
    }
    files.sort();
    files
}

/// Runs `f` (a path relative to `dir`) with its shortening; the report, or the error output.
fn simulate(dir: &Path, f: &str) -> Result<serde_json::Value, String> {
    let mut args = vec![
        "simulate".to_string(),
        dir.join(f).display().to_string(),
        "--json".into(),
        "--quiet".into(),
    ];
    for (_, sets) in SHORTER.iter().filter(|(name, _)| *name == f) {
        for s in *sets {
            args.extend(["--set".to_string(), s.to_string()]);
        }
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = dstwin(&args);
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&o.stdout).unwrap())
}

#[test]
fn every_shipped_scenario_runs_from_the_repository_and_meets_its_slos_or_says_why_not() {
    let dir = copy_of_scenarios("scenarios");
    let files = scenario_files(&dir);
    assert!(files.len() >= 8, "found only {files:?}");
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..WORKERS {
            scope.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(f) = files.get(k) else { break };
                let r = simulate(&dir, f);
                results.lock().unwrap().push((f.clone(), r));
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by(|a, b| a.0.cmp(&b.0));
    let mut failures = Vec::new();
    for (f, r) in results {
        let v = match r {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!("{f}: {e}"));
                continue;
            }
        };
        let attainment = v["slo_attainment"].as_f64().unwrap();
        let finished = v["requests_finished"].as_u64().unwrap();
        let text = std::fs::read_to_string(dir.join(&f)).unwrap();
        let description = text
            .lines()
            .find_map(|l| l.strip_prefix("description = "))
            .unwrap_or_default();
        let exempt = description.contains(EXEMPT);
        if finished == 0 || (attainment < MIN_SLO_ATTAINMENT && !exempt) {
            failures.push(format!(
                "{f}: {finished} requests finished, {:.1}% of them within the SLOs, and the \
                 description does not say why (a {EXEMPT} point): {description}",
                attainment * 100.0
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The comparison scenarios (sim/scenarios/compare/: other tools' picks written as their launch
/// commands start them, docs/what-if.md) load from a copy of the repository and run; their
/// figures are the docs', not the suite's (a few simulated seconds each here).
#[test]
fn every_comparison_scenario_loads_and_runs() {
    // Its own copy: the tests of this file run at once.
    let dir = copy_of_scenarios("compare");
    let compare = dir.join("compare");
    let mut n = 0;
    for e in std::fs::read_dir(&compare).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_none_or(|x| x != "toml") {
            continue;
        }
        let o = dstwin(&[
            "simulate",
            path.to_str().unwrap(),
            "--quiet",
            "--set",
            "warmup_s=0",
            "--set",
            "duration_s=5",
        ]);
        assert!(
            o.status.success(),
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        n += 1;
    }
    assert!(n >= 2, "comparison scenarios in {}", compare.display());
}
