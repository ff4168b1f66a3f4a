//! `dstwin validate`: the built-in anchors, the error bound, and a team's own measurements.

mod common;
use common::{data, dstwin};

#[test]
fn builtin_anchors_with_errors_and_a_bound() {
    let o = dstwin(&["validate", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert!(rows.len() >= 9);
    assert!(rows
        .iter()
        .any(|r| r["id"] == "huawei-a2-decode-4-nodes" && r["fitted"] == false));
    for r in rows {
        let (p, q, e) = (
            r["published"].as_f64().unwrap(),
            r["predicted"].as_f64().unwrap(),
            r["error"].as_f64().unwrap(),
        );
        assert!(p.is_finite() && q.is_finite() && e.is_finite(), "{r}");
    }
    assert!(rows
        .iter()
        .any(|r| r["id"] == "cm384-prefill-default-vs-perfect-eplb"));
    let mae = v["mean_absolute_error"].as_f64().unwrap();
    assert!(mae > 0.0 && mae < 0.2, "{mae}");
    // A bound every figure meets passes; one some miss fails with exit 1 and says how many.
    assert!(dstwin(&["validate", "--max-error", "50"]).status.success());
    let o = dstwin(&["validate", "--max-error", "1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("off by more than 1%"));
    assert_eq!(
        dstwin(&["validate", "--max-error", "-3"]).status.code(),
        Some(2)
    );
}

#[test]
fn measurements_compare_with_a_simulation_of_the_same_run() {
    // Pretend the cluster measured 25% more throughput and 25% longer latencies than the twin
    // predicts for the same scenario.
    let sim = dstwin(&["simulate", &data("tiny-pd.toml"), "--json", "--quiet"]);
    assert!(sim.status.success());
    let r: serde_json::Value = serde_json::from_slice(&sim.stdout).unwrap();
    let measured = serde_json::json!({
        "request_throughput": r["request_throughput"].as_f64().unwrap() * 1.25,
        "output_throughput": r["output_tok_s"].as_f64().unwrap() * 1.25,
        "median_ttft_ms": r["latency"]["ttft_ms"]["p50"].as_f64().unwrap() * 1.25,
        "p99_tpot_ms": r["latency"]["tpot_ms"]["p99"].as_f64().unwrap() * 1.25,
        "mean_itl_ms": r["latency"]["itl_ms"]["mean"].as_f64().unwrap() * 1.25,
        "backend": "vllm",
    });
    let dir = std::env::temp_dir().join(format!("dstwin-validate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bench.json");
    std::fs::write(&path, measured.to_string()).unwrap();
    let o = dstwin(&[
        "validate",
        "--measured",
        path.to_str().unwrap(),
        "--scenario",
        &data("tiny-pd.toml"),
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 5, "the five metrics the measurement has");
    for row in rows {
        assert!(
            (row["error"].as_f64().unwrap() - (1.0 / 1.25 - 1.0)).abs() < 1e-6,
            "{row}"
        );
    }
    // A measurement with nothing to compare, or not JSON: exit 2 naming the file.
    std::fs::write(&path, "{\"backend\": \"vllm\"}").unwrap();
    let args = [
        "validate",
        "--measured",
        path.to_str().unwrap(),
        "--scenario",
        &data("tiny-pd.toml"),
    ];
    let o = dstwin(&args);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no known metric"));
    std::fs::write(&path, "not json").unwrap();
    assert_eq!(dstwin(&args).status.code(), Some(2));
}
