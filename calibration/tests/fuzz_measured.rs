//! A team's measurement files (`vllm bench serve` JSON, `dstwin-measured/1`) against a simulation:
//! whatever the JSON, comparing returns figures with finite errors or an error, never panics.
//! Longer runs: docs/robustness.md.

#[path = "../../tests/common/mutate.rs"]
mod mutate;

use dstwin_calibration::measured::compare;
use dstwin_sim::run::{run, RunOptions, SimReport};
use dstwin_sim::scenario::load_path;
use mutate::{apply, config, edits};
use proptest::prelude::*;
use std::path::Path;
use std::sync::OnceLock;

/// One small simulation, shared by every case.
fn report() -> &'static SimReport {
    static REPORT: OnceLock<SimReport> = OnceLock::new();
    REPORT.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sim/scenarios/a3-2p1d.toml");
        let s = load_path(&path, &["workload.num_requests=40".into()]).unwrap();
        run(&s, RunOptions::default()).unwrap().report
    })
}

/// What `vllm bench serve --save-result` writes, abridged.
const VLLM_BENCH: &str = r#"{
  "backend": "vllm", "completed": 40, "request_throughput": 3.5,
  "output_throughput": 812.25, "total_token_throughput": 4012.5,
  "mean_ttft_ms": 412.5, "median_ttft_ms": 380.0, "p99_ttft_ms": 1210.75,
  "mean_tpot_ms": 48.25, "median_tpot_ms": 47.5, "p99_tpot_ms": 60.0,
  "mean_itl_ms": 48.0, "median_itl_ms": 46.5, "p99_itl_ms": 95.25,
  "mean_e2el_ms": 12000.5, "median_e2el_ms": 11800.0, "p99_e2el_ms": 20500.0
}"#;

const OWN: &str = r#"{
  "format": "dstwin-measured/1", "source": "our cluster, 2026-01",
  "metrics": { "output_tok_s": 812.25, "tpot_ms.p50": 47.5, "ttft_ms.p99": 1210.75 }
}"#;

fn json() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        prop::sample::select(vec!["format", "dstwin-measured/1", "metrics", "x"])
            .prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop::collection::btree_map(
            prop::sample::select(vec![
                "format",
                "metrics",
                "median_ttft_ms",
                "output_throughput",
                "tpot_ms.p50",
                "x",
            ])
            .prop_map(String::from),
            inner,
            0..6,
        )
        .prop_map(|m| serde_json::Value::Object(m.into_iter().collect()))
    })
}

fn check(text: &str) -> Result<(), TestCaseError> {
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(text) {
        check_value(&v)?;
    }
    Ok(())
}

fn check_value(v: &serde_json::Value) -> Result<(), TestCaseError> {
    if let Ok(rows) = compare(v, report()) {
        prop_assert!(!rows.is_empty());
        for r in rows {
            prop_assert!(r.measured.is_finite() && r.measured > 0.0, "{r:?}");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(5000))]

    #[test]
    fn mutated_vllm_bench_results_compare_or_fail_cleanly(e in edits(4)) {
        check(&apply(VLLM_BENCH, &e))?;
    }

    #[test]
    fn mutated_own_measurements_compare_or_fail_cleanly(e in edits(4)) {
        check(&apply(OWN, &e))?;
    }

    #[test]
    fn arbitrary_json_compares_or_fails_cleanly(v in json()) {
        check_value(&v)?;
    }
}

proptest! {
    #![proptest_config(config(1000))]

    /// `calibrate --targets`: a mutated target file parses and prices, or fails with an error.
    #[test]
    fn mutated_target_files_price_or_fail_cleanly(e in edits(3)) {
        use dstwin_calibration::globals::{param, residuals, Values};
        use dstwin_calibration::target::{parse_targets, TARGETS};
        if let Ok(targets) = parse_targets("t.toml", &apply(TARGETS, &e)) {
            if let Some(Ok(base)) = targets.first().map(|t| t.base_cost()) {
                let list: Vec<_> = base.params.fit.iter().filter_map(|n| param(n)).collect();
                let _ = residuals(&targets, &base.params.name, &Values::of(&list, &base.params));
            }
        }
    }
}
