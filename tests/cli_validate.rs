//! `dstwin validate`: the built-in anchors, the error bound, and a team's own measurements.

mod common;
use common::{data, dstwin};

/// The report's structure and the regression guards: every end-to-end anchor is predicted out of
/// sample (simulated when it has a shipped scenario), errors are what the rows say, the
/// microbenchmark points stay within their documented bounds, and the out-of-sample and in-sample
/// errors stay where docs/validation.md reports them.
#[test]
fn builtin_anchors_stay_within_their_documented_bounds() {
    // The end-to-end suite's intervals are another test's (below): no draws here.
    let o = dstwin(&["validate", "--json", "--quiet", "--draws", "0"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = |section: &str| v[section]["rows"].as_array().unwrap().clone();
    let (oos, fit, micro) = (rows("out_of_sample"), rows("fit"), rows("micro"));
    assert!(
        micro.len() >= 39 + 21,
        "every all-to-all and V4 kernel point"
    );
    for id in ["a3-hc-pre", "a3-hc-post", "a3-compressor"] {
        assert!(micro.iter().any(|r| r["id"] == id), "{id} missing");
    }
    assert!(fit
        .iter()
        .any(|r| r["id"] == "cm384-prefill-default-vs-perfect-eplb"));
    assert!(v["measured"]["rows"].as_array().unwrap().is_empty());
    // Every end-to-end anchor with a shipped scenario is simulated out of sample; the others
    // are predicted from their steady step.
    for id in [
        "cm384-decode-b96",
        "cm384-prefill",
        "cm384-prefill (perfect EPLB)",
        "huawei-cm384-decode",
        "huawei-a2-decode",
    ] {
        assert!(
            oos.iter().any(|r| r["id"] == id && r["how"] == "simulated"),
            "{id} missing"
        );
    }
    for prefix in ["cann-r1-", "cann-v32-", "cann-v4flash-", "sglang-lowlat-"] {
        assert!(
            oos.iter().any(|r| r["id"].as_str().unwrap().starts_with(prefix)
                && r["how"] == "steady step"),
            "no out-of-sample row for {prefix}"
        );
    }
    // Fitted parameters are named, and none of them is the old global in-situ factor.
    let params = v["fit"]["parameters"].as_array().unwrap();
    assert!(params.len() >= 4 && !params.iter().any(|p| p == "in_situ_efficiency"));
    for r in oos.iter().chain(&fit).chain(&micro) {
        let (p, q, e) = (
            r["published"].as_f64().unwrap(),
            r["predicted"].as_f64().unwrap(),
            r["error"].as_f64().unwrap(),
        );
        assert!(p.is_finite() && q.is_finite() && e.is_finite(), "{r}");
        // Gains are compared as step-time ratios (1 + gain), everything else as ratios.
        let expected = if r["metric"] == "two_microbatch_gain" {
            (1.0 + q) / (1.0 + p) - 1.0
        } else {
            q / p - 1.0
        };
        assert!((expected - e).abs() < 1e-9, "{r}");
    }
    // Points the parameters were fitted to stay within their bounds; a point shown but not
    // fitted (DeepSeek-V3's own MTP acceptance, the A2 kernels) is a comparison, not a guard.
    let fitted_micro: Vec<_> = micro
        .iter()
        .filter(|r| !r["metric"].as_str().unwrap().contains("not fitted"))
        .collect();
    for r in &fitted_micro {
        let (e, b) = (r["error"].as_f64().unwrap(), r["bound"].as_f64().unwrap());
        assert!(
            e.abs() <= b,
            "{} {}: {:+.1}% is past its documented bound {:.0}%",
            r["id"],
            r["metric"],
            e * 100.0,
            b * 100.0
        );
    }
    // DeepSeek-V4-Flash, predicted with its mHC and compressor kernels priced from their
    // microbenchmarks (not fitted to these rows), stays within the goal.
    for r in oos
        .iter()
        .filter(|r| r["id"].as_str().unwrap().starts_with("cann-v4flash-"))
    {
        let e = r["error"].as_f64().unwrap();
        assert!(e.abs() <= 0.15, "{}: {:+.1}%", r["id"], e * 100.0);
    }
    let mae = |section: &str| {
        v[section]["summary"]["mean_absolute_error"]
            .as_f64()
            .unwrap()
    };
    // Regression guards at the levels docs/validation.md reports (with a little room): a change
    // that makes the predictions worse fails here.
    assert!(
        mae("out_of_sample") > 0.0 && mae("out_of_sample") < 0.10,
        "{}",
        mae("out_of_sample")
    );
    assert!(mae("fit") < 0.07, "{}", mae("fit"));
    // The microbenchmarks' summary counts the points shown but not fitted (the A2 kernels the
    // borrowed all-to-all numbers miss by up to 99%); the fitted ones are held tighter.
    assert!(mae("micro") < 0.10, "{}", mae("micro"));
    let fitted_mae = fitted_micro
        .iter()
        .map(|r| r["error"].as_f64().unwrap().abs())
        .sum::<f64>()
        / fitted_micro.len() as f64;
    assert!(fitted_mae < 0.05, "{fitted_mae}");
    assert_eq!(v["runs"].as_array().unwrap().len(), 5);
    assert!(!v["sensitivity"].as_array().unwrap().is_empty());
}

/// The TPOT-limited anchors run the largest batch under their limit with the shipped
/// parameters: their shipped batch keeps under it, one sequence more per die goes over it
/// (re-derive max_num_seqs when the cost model changes).
#[test]
fn tpot_limited_anchors_run_the_largest_batch_under_the_limit() {
    let cases = [
        ("huawei-cm384-decode.toml", SEQS_CM384, 50.0),
        ("huawei-a2-decode.toml", SEQS_A2, 100.0),
    ];
    for (file, seqs, _) in cases {
        let path = format!(
            "{}/sim/scenarios/anchors/{file}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains(&format!("max_num_seqs = {seqs}\n")),
            "{file} no longer ships max_num_seqs = {seqs}"
        );
    }
    let handles: Vec<_> = cases
        .iter()
        .flat_map(|&(file, seqs, limit)| {
            [(file, seqs, limit, true), (file, seqs + 1, limit, false)]
        })
        .map(|(file, seqs, limit, under)| {
            std::thread::spawn(move || {
                let path = format!(
                    "{}/sim/scenarios/anchors/{file}",
                    env!("CARGO_MANIFEST_DIR")
                );
                let o = dstwin(&[
                    "simulate",
                    &path,
                    "--set",
                    &format!("decode.max_num_seqs={seqs}"),
                    "--set",
                    &format!("decode.max_num_batched_tokens={}", 2 * seqs),
                    "--json",
                    "--quiet",
                ]);
                assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
                let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
                let t = r["latency"]["tpot_ms"]["p50"].as_f64().unwrap();
                assert_eq!(
                    t < limit,
                    under,
                    "{file}: {seqs} seqs per die give a median TPOT of {t:.2} ms against its \
                     {limit} ms limit: re-derive its max_num_seqs"
                );
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// The shipped batches of the TPOT-limited anchors (their scenario files say the same).
const SEQS_CM384: u32 = 39;
const SEQS_A2: u32 = 44;

#[test]
fn error_bound_and_text_report() {
    // Against measurements 25% off the twin, a 30% bound passes and a 10% one fails (exit 1).
    let sim = dstwin(&["simulate", &data("tiny-pd.toml"), "--json", "--quiet"]);
    assert!(sim.status.success());
    let r: serde_json::Value = serde_json::from_slice(&sim.stdout).unwrap();
    let measured = serde_json::json!({
        "output_throughput": r["output_tok_s"].as_f64().unwrap() * 1.25,
    });
    let (_dir, path) = temp_file("bound.json", &measured.to_string());
    let args = |bound: &'static str| {
        vec![
            "validate".to_string(),
            "--measured".into(),
            path.clone(),
            "--scenario".into(),
            data("tiny-pd.toml"),
            "--max-error".into(),
            bound.into(),
        ]
    };
    let run = |a: Vec<String>| dstwin(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let o = run(args("30"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("Your measurements"), "{text}");
    assert!(
        text.contains("output_throughput") && text.contains("-20.0%"),
        "{text}"
    );
    let o = run(args("10"));
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("off by more than 10%"));
    assert_eq!(run(args("-3")).status.code(), Some(2));
}

#[test]
fn own_measurement_format() {
    let sim = dstwin(&["simulate", &data("tiny-pd.toml"), "--json", "--quiet"]);
    let r: serde_json::Value = serde_json::from_slice(&sim.stdout).unwrap();
    let own = serde_json::json!({
        "format": "dstwin-measured/1",
        "source": "our cluster, 2026-11-20",
        "metrics": {
            "output_tok_s": r["output_tok_s"].as_f64().unwrap() * 2.0,
            "tpot_ms.p90": r["latency"]["tpot_ms"]["p90"].as_f64().unwrap() * 2.0,
        },
    });
    let (_dir, path) = temp_file("own.json", &own.to_string());
    let args = [
        "validate",
        "--measured",
        &path,
        "--scenario",
        &data("tiny-pd.toml"),
        "--json",
    ];
    let o = dstwin(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = v["measured"]["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for row in rows {
        assert_eq!(row["kind"], "measured");
        assert!((row["error"].as_f64().unwrap() + 0.5).abs() < 1e-6, "{row}");
    }
    // Unknown metrics, bad values and unknown formats are input errors naming the field.
    for (bad, says) in [
        (
            r#"{"format": "dstwin-measured/1", "metrics": {"tpot_ms.p95": 3}}"#,
            "metrics.tpot_ms.p95: unknown metric",
        ),
        (
            r#"{"format": "dstwin-measured/1", "metrics": {"output_tok_s": -1}}"#,
            "metrics.output_tok_s = -1",
        ),
        // So small a figure that the error would be infinite: refused, not printed as inf.
        (
            r#"{"format": "dstwin-measured/1", "metrics": {"output_tok_s": 1e-308}}"#,
            "metrics.output_tok_s = 1e-308: cannot be compared",
        ),
        (
            r#"{"output_throughput": 1e-308}"#,
            "output_throughput = 1e-308",
        ),
        (
            r#"{"format": "other/2", "metrics": {}}"#,
            "format = \"other/2\"",
        ),
    ] {
        std::fs::write(&path, bad).unwrap();
        let o = dstwin(&args);
        assert_eq!(o.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(says), "{bad}: {err}");
    }
    // What the file alone gets wrong is found before the scenario is read or simulated: here
    // the scenario does not exist, and the error is the file's.
    for (bad, says) in [
        (
            r#"{"format": "dstwin-measured/1", "metrics": {"tpot_ms.p95": 3}}"#,
            "metrics.tpot_ms.p95: unknown metric",
        ),
        (r#"{"backend": "vllm"}"#, "no known metric"),
        // A twin server run at --time-scale 0.1 (bench-serve records it): its times are not
        // the deployment's.
        (
            r#"{"output_throughput": 900.0, "time_scale": 0.1}"#,
            "time_scale = 0.1",
        ),
    ] {
        std::fs::write(&path, bad).unwrap();
        let o = dstwin(&[
            "validate",
            "--measured",
            &path,
            "--scenario",
            "no-such.toml",
        ]);
        assert_eq!(o.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(says) && !err.contains("no-such"),
            "{bad}: {err}"
        );
    }
    // A real-time server's result (time_scale 1, or none: vLLM's) is compared.
    std::fs::write(&path, r#"{"output_throughput": 900.0, "time_scale": 1.0}"#).unwrap();
    assert!(dstwin(&[
        "validate",
        "--measured",
        &path,
        "--scenario",
        &data("tiny-pd.toml")
    ])
    .status
    .success());
}

/// `validate --measured PATH --scenario tiny-pd.toml EXTRA...`.
fn measured_args(path: &std::path::Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "validate".into(),
        "--measured".into(),
        path.to_str().unwrap().into(),
        "--scenario".into(),
        data("tiny-pd.toml"),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

/// [`measured_args`] with `--json`: the measured rows.
fn measured_rows(path: &std::path::Path, extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = measured_args(path, extra);
    args.push("--json".into());
    let o = dstwin(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["measured"]["rows"].as_array().unwrap().clone()
}

/// `text` in file `name` of a fresh directory (removed when the directory is dropped).
fn temp_file(name: &str, text: &str) -> (common::TmpDir, String) {
    let dir = common::tmp_dir("validate", name);
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    let path = path.to_str().unwrap().to_string();
    (dir, path)
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
    let dir = common::tmp_dir("validate", "bench");
    let path = dir.join("bench.json");
    std::fs::write(&path, measured.to_string()).unwrap();
    let rows = measured_rows(&path, &[]);
    assert_eq!(rows.len(), 5, "the five metrics the measurement has");
    for row in rows {
        assert!(
            (row["error"].as_f64().unwrap() - (1.0 / 1.25 - 1.0)).abs() < 1e-6,
            "{row}"
        );
    }
    // A measurement with nothing to compare, or not JSON: exit 2 naming the file.
    std::fs::write(&path, "{\"backend\": \"vllm\"}").unwrap();
    let args = measured_args(&path, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = dstwin(&args);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no known metric"));
    std::fs::write(&path, "not json").unwrap();
    assert_eq!(dstwin(&args).status.code(), Some(2));
}

#[test]
fn a_measurement_is_compared_with_the_median_of_draws_of_the_step_spread() {
    // tiny-pd priced by the A3 file with `[host] step_sigma`: the twin's figures vary with the
    // draw of its steps, and the prediction is the median of nine draws, their range beside it.
    let dir = common::tmp_dir("validate", "draws");
    let hw = common::a3_with_host(&dir, "step_us = 0.0\nstep_sigma = 0.3");
    let sim = dstwin(&[
        "simulate",
        &data("tiny-pd.toml"),
        "--json",
        "--quiet",
        "--set",
        &hw,
    ]);
    assert!(
        sim.status.success(),
        "{}",
        String::from_utf8_lossy(&sim.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&sim.stdout).unwrap();
    let measured = serde_json::json!({
        "output_throughput": r["output_tok_s"].as_f64().unwrap(),
        "p90_ttft_ms": r["latency"]["ttft_ms"]["p90"].as_f64().unwrap(),
        "mean_tpot_ms": r["latency"]["tpot_ms"]["mean"].as_f64().unwrap(),
    });
    let path = dir.join("bench.json");
    std::fs::write(&path, measured.to_string()).unwrap();
    let rows = measured_rows(&path, &["--set", &hw]);
    assert_eq!(rows.len(), 3);
    // The draws run in parallel; the report is the same every time.
    assert_eq!(measured_rows(&path, &["--set", &hw]), rows);
    let mut spread = false;
    for row in &rows {
        let d = &row["draws"];
        assert_eq!(d["n"], 9, "{row}");
        let (lo, hi, p) = (
            d["min"].as_f64().unwrap(),
            d["max"].as_f64().unwrap(),
            row["predicted"].as_f64().unwrap(),
        );
        assert!(lo <= p && p <= hi, "{row}");
        spread |= hi > lo;
        assert_eq!(row["how"], "median");
    }
    // The draws differ (a spread of 0.3 moves the p90 TTFT).
    assert!(spread, "{rows:?}");
    let args = measured_args(&path, &["--set", &hw]);
    let o = dstwin(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("median of 9 draws of the step spread"),
        "{text}"
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("9 simulated runs"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Without a spread: one run, as before.
    let flat = common::a3_with_host(&dir, "step_us = 0.0");
    for row in &measured_rows(&path, &["--set", &flat]) {
        assert!(row.get("draws").is_none(), "{row}");
        assert_eq!(row["how"], "simulated");
    }
}

/// `validate --e2e`: every published serving run of sim/scenarios/e2e/ simulated whole, its
/// figures compared; the JSON has the suite's summary, and `--max-error` holds its rows.
#[test]
fn the_end_to_end_suite_is_simulated_and_held_to_max_error() {
    let o = dstwin(&["validate", "--e2e", "--json", "--quiet", "--draws", "4"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = v["e2e"]["rows"].as_array().unwrap();
    assert!(rows.len() >= 55, "{} figures", rows.len());
    let runs: std::collections::BTreeSet<&str> =
        rows.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert!(runs.len() >= 25, "{} runs", runs.len());
    for r in rows {
        assert_eq!(r["kind"], "e2e");
        assert_eq!(r["how"], "simulated");
        let (p, q, e) = (
            r["published"].as_f64().unwrap(),
            r["predicted"].as_f64().unwrap(),
            r["error"].as_f64().unwrap(),
        );
        assert!(p > 0.0 && q.is_finite(), "{r}");
        assert!((e - (q / p - 1.0)).abs() < 1e-9, "{r}");
    }
    let mean: f64 = rows
        .iter()
        .map(|r| r["error"].as_f64().unwrap().abs())
        .sum::<f64>()
        / rows.len() as f64;
    let summary = &v["e2e"]["summary"];
    assert!((summary["mean_absolute_error"].as_f64().unwrap() - mean).abs() < 1e-9);
    assert_eq!(summary["figures"].as_u64().unwrap() as usize, rows.len());
    // Every figure has its 80% interval, and the summary the share of figures inside.
    let inside = rows
        .iter()
        .filter(|r| {
            let (lo, hi) = (
                r["interval"]["p10"].as_f64().unwrap(),
                r["interval"]["p90"].as_f64().unwrap(),
            );
            assert!(lo <= hi, "{r}");
            (lo..=hi).contains(&r["published"].as_f64().unwrap())
        })
        .count();
    let coverage = summary["interval_coverage"].as_f64().unwrap();
    assert!((coverage - inside as f64 / rows.len() as f64).abs() < 1e-9);
    // Only the suite: no anchors, fits or microbenchmarks.
    assert!(v["micro"]["rows"].as_array().unwrap().is_empty());
    // The largest error is far above 1%: a 1% bound fails (exit 1) and names the count.
    let o = dstwin(&[
        "validate",
        "--e2e",
        "--quiet",
        "--max-error",
        "1",
        "--draws",
        "0",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.starts_with("End to end:"), "{text}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("off by more than 1%"));
}
