//! Every shipped scenario (sim/scenarios/*.toml and sim/scenarios/anchors/*.toml) runs from the
//! repository alone and describes a deployment an operator would run: it meets its own SLOs for
//! most requests, or its description says why not (a saturation point, as some anchors measure).

mod common;
use common::dstwin;

use std::path::{Path, PathBuf};

/// Shorter runs for the test suite, where the full run is long; each keeps the scenario's
/// warm-up and minutes of steady state, so the SLO check still judges the operating point.
const SHORTER: &[(&str, &[&str])] = &[
    // One simulated hour in the scenario; five minutes reach its steady state (~45 s per request).
    ("cm384-pd.toml", &["duration_s=300"]),
];

/// The word a scenario's description uses when it is meant to miss its SLOs.
const EXEMPT: &str = "saturation";

/// At least this share of measured requests within the SLOs.
const MIN_SLO_ATTAINMENT: f64 = 0.5;

/// A copy of sim/scenarios (data/ and anchors/ included) in a fresh directory: a scenario that
/// reads anything outside the directory, as from a checkout's neighbours, fails to load here.
fn copy_of_scenarios() -> PathBuf {
    let to = std::env::temp_dir().join(format!("dstwin-test-{}-scenarios", std::process::id()));
    let _ = std::fs::remove_dir_all(&to);
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

#[test]
fn every_shipped_scenario_runs_from_the_repository_and_meets_its_slos_or_says_why_not() {
    let dir = copy_of_scenarios();
    let files = scenario_files(&dir);
    assert!(files.len() >= 9, "found only {files:?}");
    let mut failures = Vec::new();
    for f in &files {
        let path = dir.join(f);
        let mut args = vec![
            "simulate".to_string(),
            path.display().to_string(),
            "--json".into(),
            "--quiet".into(),
        ];
        for (_, sets) in SHORTER.iter().filter(|(name, _)| name == f) {
            for s in *sets {
                args.extend(["--set".to_string(), s.to_string()]);
            }
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = dstwin(&args);
        if !o.status.success() {
            failures.push(format!("{f}: {}", String::from_utf8_lossy(&o.stderr)));
            continue;
        }
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let attainment = v["slo_attainment"].as_f64().unwrap();
        let finished = v["requests_finished"].as_u64().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
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
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
