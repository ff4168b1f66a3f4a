//! The end-to-end validation suite's index and scenarios: every file of sim/scenarios/e2e/ is
//! shipped and indexed, every run names its source and the assumptions its reading makes, and a
//! run's figures are what its simulation reports.

use dstwin_calibration::anchors::RunMetric;
use dstwin_calibration::e2e::{parse_e2e, shipped_runs, E2E_SCENARIOS};
use dstwin_sim::run::{run, RunOptions};
use std::collections::BTreeSet;
use std::path::PathBuf;

fn folder() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../sim/scenarios/e2e")
}

#[test]
fn every_scenario_of_the_folder_is_shipped_and_indexed() {
    let on_disk: BTreeSet<String> = std::fs::read_dir(folder())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|f| f.ends_with(".toml") && f != "runs.toml")
        .collect();
    let shipped: BTreeSet<String> = E2E_SCENARIOS.iter().map(|(f, _)| f.to_string()).collect();
    assert_eq!(on_disk, shipped, "calibration/src/e2e.rs lists the folder");
    let runs = shipped_runs().unwrap();
    let used: BTreeSet<String> = runs.iter().map(|r| r.scenario.clone()).collect();
    assert_eq!(used, shipped, "every scenario is some run's");
    // The size the suite is held to (docs/validation.md).
    let out_of_sample: Vec<_> = runs.iter().filter(|r| r.in_sample.is_none()).collect();
    assert!(out_of_sample.len() >= 25, "{} runs", out_of_sample.len());
    let figures: usize = runs.iter().map(|r| r.figures.len()).sum();
    assert!(figures >= 60, "{figures} figures");
}

#[test]
fn every_run_says_where_it_comes_from_and_what_it_assumes() {
    for r in shipped_runs().unwrap() {
        let text = E2E_SCENARIOS
            .iter()
            .find(|(f, _)| *f == r.scenario)
            .unwrap()
            .1;
        assert!(!r.source.trim().is_empty(), "{}", r.name);
        assert_eq!(
            format!("{}.toml", r.name),
            r.scenario,
            "name is the file's stem"
        );
        for needle in ["Assumptions", "Knobs the twin lacks"] {
            assert!(
                text.contains(needle),
                "{}: no {needle:?} section",
                r.scenario
            );
        }
        let s = r.scenario().unwrap_or_else(|e| panic!("{}: {e}", r.name));
        assert_eq!(s.name, r.name, "{}: scenario name", r.scenario);
    }
}

#[test]
fn a_bad_index_names_the_run_and_what_is_wrong() {
    let file = &E2E_SCENARIOS[0].0;
    let run = |figures: &str| {
        format!(
            "[[run]]\nname = \"x\"\nscenario = \"{file}\"\nsource = \"s\"\nfigures = [{figures}]\n"
        )
    };
    let ok = run(r#"{ metric = "tpot_mean_ms", published = 20, definition = "mean TPOT" }"#);
    assert_eq!(parse_e2e("t.toml", &ok).unwrap().len(), 1);
    let cases = [
        (run(""), "figures is empty"),
        (
            run(r#"{ metric = "tpot_mean_ms", published = -1, definition = "d" }"#),
            "published = -1",
        ),
        (
            run(r#"{ metric = "tpot_mean_ms", published = 20, definition = " " }"#),
            "definition is empty",
        ),
        (
            run(r#"{ metric = "tpot_ms", published = 20, definition = "d" }"#),
            "tpot_ms",
        ),
        (ok.replace(file, "nope.toml"), "nope.toml"),
        (format!("{ok}\n{ok}"), "name used twice"),
    ];
    for (text, needle) in cases {
        let e = parse_e2e("t.toml", &text).unwrap_err().to_string();
        assert!(e.contains(needle), "{needle:?} not in {e}");
    }
}

#[test]
fn a_runs_figures_are_its_simulations_and_the_same_every_time() {
    let runs = shipped_runs().unwrap();
    let r = runs
        .iter()
        .find(|r| r.name == "sglang-a3-r1-w4a8-8c-mixed-3k5-1k5")
        .expect("a small mixed run");
    let a = r.evaluate().unwrap();
    assert_eq!(a, r.evaluate().unwrap(), "deterministic");
    let report = run(&r.scenario().unwrap(), RunOptions::default())
        .unwrap()
        .report;
    for f in &a {
        assert_eq!(f.predicted.to_bits(), f.metric.read(&report).to_bits());
        assert!((f.error - (f.predicted / f.published - 1.0)).abs() < 1e-12);
    }
    assert_eq!(
        RunMetric::OutputTokS.read(&report).to_bits(),
        report.output_tok_s.to_bits()
    );
}
