//! The twin-fidelity loop on the CPU engine (docs/validation.md, "The CPU engine, end to end"):
//! the engine is profiled on the calibration workload, `calibrate --trace` fits the CPU
//! template system to that trace alone, and a workload not used in the fit is run on the
//! engine with `bench-serve` and compared with the twin's simulation by `validate --measured`.
//!
//! The bound asserted here is loose on purpose: the test machine is shared (two cores, other
//! builds running), so the engine's step times move by tens of percent from run to run, and
//! the twin's errors measured on this machine (docs/validation.md) reach 50% for TTFT. It holds
//! that the loop runs end to end and that its predictions are of the measured size: output
//! throughput within 30% (a low load: the arrivals set it) and mean TTFT and TPOT within a
//! factor of four. The figures against the 10% goal are in the docs, not here.

mod common;
use common::{dstwin, stderr_text, tiny_model, tmp_dir, Server};
use std::path::Path;

fn scenario(name: &str) -> String {
    format!(
        "{}/engine/cpu/scenarios/loop/{name}.toml",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn ok(o: &std::process::Output, what: &str) -> String {
    assert!(o.status.success(), "{what}: {}", stderr_text(o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Serves `scenario` on the CPU engine (with `extra` serve arguments) and runs its workload,
/// shortened by `sets`, with bench-serve; the result goes to `out`.
fn measure(model: &Path, scenario: &str, extra: &[&str], sets: &[String], out: &Path) {
    // One kernel thread, as the documented loop profiles and measures the engine: its kernel
    // times then follow their work on a shared 2-core machine.
    let mut args = vec![
        scenario,
        "--device",
        "cpu",
        "--model",
        model.to_str().unwrap(),
        "--engine-threads",
        "1",
    ];
    args.extend_from_slice(extra);
    let server = Server::start(&args);
    let config = format!("model={}", model.join("config.json").display());
    let url = server.url();
    let mut bench = vec![
        "bench-serve",
        "--url",
        &url,
        "--scenario",
        scenario,
        "--set",
        &config,
        "--save-result",
        out.to_str().unwrap(),
        "-q",
    ];
    for s in sets {
        bench.extend(["--set", s.as_str()]);
    }
    ok(&dstwin(&bench), "bench-serve");
    // SIGTERM, as the documented loop stops it: the engine's trace is complete on exit.
    server.stop();
}

#[test]
fn a_fit_on_one_workload_predicts_another_on_the_real_engine() {
    let dir = tmp_dir("cpu-loop", "loop");
    let model = tiny_model("loop");
    // 1. Profile the engine on the calibration workload (shortened).
    let trace = dir.join("trace.json");
    measure(
        &model,
        &scenario("calibrate"),
        &["--profile", trace.to_str().unwrap()],
        &["workload.num_requests=24".into()],
        &dir.join("calibrate.json"),
    );
    // 2. Fit the CPU template to that trace alone.
    let template = format!(
        "{}/engine/cpu/hardware/cpu-host.toml",
        env!("CARGO_MANIFEST_DIR")
    );
    let (costs, system) = (dir.join("cpu-costs.toml"), dir.join("cpu.toml"));
    let report = ok(
        &dstwin(&[
            "calibrate",
            "--trace",
            trace.to_str().unwrap(),
            "--hardware",
            &template,
            "--dtype",
            "fp32",
            "--model",
            model.to_str().unwrap(),
            // Means of steps are what the twin predicts (docs/validation.md).
            "--objective",
            "total",
            // The front end's time per request, from the profiled run's benchmark.
            "--bench",
            dir.join("calibrate.json").to_str().unwrap(),
            "--out",
            costs.to_str().unwrap(),
            "--system-out",
            system.to_str().unwrap(),
        ]),
        "calibrate --trace",
    );
    assert!(report.contains("unmapped 0.0%"), "{report}");
    let fitted: toml::Table = toml::from_str(&common::read(&costs)).unwrap();
    // Every class the engine runs is fitted, and the host time between steps is there.
    for class in [
        "gemm",
        "grouped_gemm",
        "attention",
        "prefill_attention",
        "elementwise",
    ] {
        let e = fitted["efficiency"][class].as_table().unwrap();
        let source = e["source"].as_str().unwrap();
        assert!(
            source.contains("dstwin calibrate --trace"),
            "{class}: {e:?}"
        );
        // The fixed cost may sit at its bound 0 (a class whose kernels the fit explains by
        // their work alone, as prompt attention's jump at 128 tokens can make it): present
        // and non-negative is what the cost file needs.
        assert!(
            e["fixed_us"].as_float().is_some_and(|f| f >= 0.0),
            "{class}: {e:?}"
        );
    }
    assert!(fitted["host"]["step_us"].as_float().unwrap() > 0.0);
    // The client's TTFT less the server's: the HTTP front end's time, fitted as measured (a
    // loaded machine may make it anything from a fraction of a millisecond to tens; a client
    // never sees a token before the server sends it, so it is above 0).
    let request_us = fitted["host"]["request_us"].as_float().unwrap();
    assert!(request_us > 0.0 && request_us < 1e5, "{request_us}");
    assert!(report.contains("front end per request"), "{report}");
    // How far the engine's steps land from their price: a real engine's steps vary, and the
    // cost file says by how much (a lognormal spread, at most 1 in a cost file).
    assert!(report.contains("step time around its price"), "{report}");
    let sigma = fitted["host"]["step_sigma"].as_float().unwrap();
    assert!(sigma > 0.0 && sigma <= 1.0, "{sigma}");
    // 3. A workload not used in the fit, on the engine, then 4. against the twin.
    let low = scenario("mixed-low");
    let measured = dir.join("mixed-low.json");
    let shorter = ["workload.num_requests=16".to_string()];
    measure(&model, &low, &[], &shorter, &measured);
    let v = ok(
        &dstwin(&[
            "validate",
            "--measured",
            measured.to_str().unwrap(),
            "--scenario",
            &low,
            "--set",
            &format!("model={}", model.join("config.json").display()),
            "--set",
            &format!("hardware={}", system.display()),
            "--set",
            &shorter[0],
            "--json",
            "-q",
        ]),
        "validate --measured",
    );
    let v: serde_json::Value = serde_json::from_str(&v).unwrap();
    let rows = v["measured"]["rows"].as_array().unwrap();
    let row = |m: &str| {
        let r = rows.iter().find(|r| r["metric"] == m).unwrap();
        (
            r["published"].as_f64().unwrap(),
            r["predicted"].as_f64().unwrap(),
        )
    };
    let (m, p) = row("output_throughput");
    assert!(
        (p / m - 1.0).abs() < 0.3,
        "output throughput {m} measured, {p} predicted"
    );
    for metric in ["mean_ttft_ms", "p90_ttft_ms", "mean_tpot_ms"] {
        let (m, p) = row(metric);
        assert!(
            p > m / 4.0 && p < m * 4.0,
            "{metric}: {m} measured, {p} predicted"
        );
    }
}
