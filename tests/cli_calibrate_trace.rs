//! `dstwin calibrate --trace`: the time of a profiler trace by class and by op with what could
//! not be mapped, the fits, the cost and system files, and refusals that name what is wrong.

mod common;
use common::dstwin;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> String {
    format!("{}/traces/tests/data/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn tmp(name: &str) -> common::TmpDir {
    common::tmp_dir("trace", name)
}

/// A torch_npu output directory made of the documented samples.
fn npu_dir(dir: &Path) -> PathBuf {
    let out = dir.join("node0_ascend_pt/ASCEND_PROFILER_OUTPUT");
    std::fs::create_dir_all(&out).unwrap();
    for (from, to) in [
        ("kernel_details_block_dim.csv", "kernel_details.csv"),
        ("trace_view.json", "trace_view.json"),
        ("communication.json", "communication.json"),
    ] {
        std::fs::copy(fixture(from), out.join(to)).unwrap();
    }
    dir.join("node0_ascend_pt")
}

#[test]
fn a_gpu_trace_is_broken_down_with_its_unmapped_share() {
    let trace = fixture("kineto_h800_train_slice.json");
    let o = dstwin(&["calibrate", "--trace", &trace]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    for want in [
        "cuda backend",
        "93 kernels",
        "mapped onto the op graph",
        "unmapped",
        "by class",
        "by op",
        "dispatch",
        "outside the op graph",
        "backward pass (training)",
        "not fitted: no kernel with known work",
        "host overhead per step",
    ] {
        assert!(s.contains(want), "{want}:\n{s}");
    }
    let o = dstwin(&["calibrate", "--trace", &trace, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let m = &v["calibration"]["mapping"];
    let total: f64 = ["mapped_share", "outside_share", "unmapped_share"]
        .iter()
        .map(|k| m[k].as_f64().unwrap())
        .sum();
    assert!((total - 1.0).abs() < 1e-9, "{m}");
    assert_eq!(m["kernels"], 93);
    assert_eq!(v["calibration"]["hardware"], "nvidia-h800-8");
}

#[test]
fn an_npu_profile_writes_a_cost_file_and_a_system_file_using_it() {
    let dir = tmp("npu");
    let prof = npu_dir(&dir);
    let cost = dir.join("my-a3.toml");
    let system = dir.join("my-a3-system.toml");
    let o = dstwin(&[
        "calibrate",
        "--trace",
        prof.to_str().unwrap(),
        "--out",
        cost.to_str().unwrap(),
        "--system-out",
        system.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(
        s.contains("ascend backend") && s.contains("atlas-800-a3"),
        "{s}"
    );
    // Two MatMulV2 with shapes: the gemm class is fitted; two all-reduces with bytes.
    assert!(s.contains("all_reduce"), "{s}");
    assert!(
        s.contains("cost file written to") && s.contains("system file written to"),
        "{s}"
    );
    let text = std::fs::read_to_string(&cost).unwrap();
    assert!(
        text.starts_with("# Cost model calibrated from profiler traces"),
        "{text}"
    );
    assert!(text.contains("node0_ascend_pt"), "{text}");
    let t: toml::Table = toml::from_str(&text).unwrap();
    assert_eq!(t["name"].as_str(), Some("my-a3"));
    let gemm = t["efficiency"]["gemm"].as_table().unwrap();
    for field in ["compute", "memory", "rows_pad", "fixed_us"] {
        assert!(gemm[field].as_float().is_some(), "{field}: {gemm:?}");
    }
    assert!(
        gemm["source"]
            .as_str()
            .unwrap()
            .contains("dstwin calibrate --trace"),
        "{gemm:?}"
    );
    // Unfitted classes keep the shipped values, in the per-class form.
    let att = t["efficiency"]["attention"].as_table().unwrap();
    assert!(att["rows_pad"].as_float().is_some() && att["fixed_us"].as_float().is_some());
    // Two steps of kernels: the host table.
    assert!(t["host"]["step_us"].as_float().unwrap() > 0.0, "{text}");
    let sys: toml::Table = toml::from_str(&std::fs::read_to_string(&system).unwrap()).unwrap();
    assert_eq!(sys["cost_model"].as_str(), Some("my-a3.toml"));
    assert_eq!(sys["name"].as_str(), Some("my-a3-system"));
    // What the traces determined leaves the list the anchor fit may change; what they cannot
    // see (two-micro-batch overlap) stays.
    let fit: Vec<&str> = t["fit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(!fit.contains(&"op_overhead_us"), "{fit:?}");
    assert!(!fit.contains(&"host.step_us"), "{fit:?}");
    assert!(fit.contains(&"overlap_efficiency_low_latency"), "{fit:?}");
    // The system file prices a deployment.
    let o = dstwin(&[
        "explain",
        "--hardware",
        system.to_str().unwrap(),
        "--quant",
        "w4a8",
        "--dies",
        "16",
        "--redundant-experts",
        "0",
        "--shared-expert-dies",
        "0",
        "--seqs",
        "8",
        "--kv",
        "2048",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(j.to_string().contains("my-a3-system"), "{j}");
}

/// `calibrate --trace` of a CPU engine trace on a stand-in system, the cost file to `cost`.
fn fit_cpu_fixture(trace: &str, cost: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "calibrate",
        "--trace",
        trace,
        "--hardware",
        "nvidia-h800-8",
        "--dtype",
        "fp32",
        "--out",
        cost.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    dstwin(&args)
}

#[test]
fn the_cpu_engine_profile_fits_its_gemms_and_host_time() {
    let dir = tmp("cpu");
    let cost = dir.join("cpu.toml");
    let trace = fixture("cpu_engine_profile.json");
    let o = fit_cpu_fixture(&trace, &cost, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    for want in [
        "cpu backend",
        "EPLB expert weight move",
        "unmapped 0.0%",
        "step_us = 1384.9",
        "per_seq_us = 0.00",
        "per_token_us = 0.000",
        "fitted against measured, by op",
        // The slice keeps the kernels of two steps: too few to tell a spread from.
        "step time around its price: fewer than 20 warm steps",
    ] {
        assert!(s.contains(want), "{want}:\n{s}");
    }
    let t: toml::Table = toml::from_str(&std::fs::read_to_string(&cost).unwrap()).unwrap();
    let gemm = t["efficiency"]["gemm"].as_table().unwrap();
    assert!(
        gemm["source"].as_str().unwrap().contains("146 kernels"),
        "{gemm:?}"
    );
    // The slice keeps the ops of steps 0 and 10 only: the gaps are fitted alone (627.1 us, more
    // sequences or tokens no slower: step 1's 145-token prompt tells tokens apart from
    // sequences) and step 10's time inside it no op covers (757.7 us) is added.
    assert_eq!(t["host"]["per_seq_us"].as_float(), Some(0.0));
    assert_eq!(t["host"]["per_token_us"].as_float(), Some(0.0));
}

#[test]
fn bad_traces_and_options_are_refused_with_what_is_wrong() {
    let dir = tmp("bad");
    let refused = |args: &[&str]| {
        let o = dstwin(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(!e.contains("panicked"), "{e}");
        e
    };
    let trace = fixture("kineto_h800_train_slice.json");
    let e = refused(&["calibrate", "--trace", &trace, "--backend", "tpu"]);
    assert!(
        e.contains("--backend tpu") && e.contains("ascend, cuda, cpu"),
        "{e}"
    );
    let e = refused(&["calibrate", "--trace", "no/such/trace.json"]);
    assert!(e.contains("no/such/trace.json"), "{e}");
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{\"traceEvents\": [\n{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"k\", \"ts\": 1, \"dur\": \"soon\"}\n]}").unwrap();
    let e = refused(&["calibrate", "--trace", bad.to_str().unwrap()]);
    assert!(e.contains("bad.json:2") && e.contains("dur"), "{e}");
    let e = refused(&["calibrate", "--trace", &trace, "--dtype", "fp64"]);
    assert!(e.contains("--dtype fp64") && e.contains("fp32"), "{e}");
    let e = refused(&["calibrate", "--trace", &trace, "--idle-factor", "0.5"]);
    assert!(e.contains("--idle-factor"), "{e}");
    let e = refused(&["calibrate", "--trace", &trace, "--system-out", "s.toml"]);
    assert!(e.contains("--out"), "{e}");
    let cpu = fixture("cpu_engine_profile.json");
    let out = dir.join("c.toml");
    let e = refused(&["calibrate", "--trace", &cpu, "--out", out.to_str().unwrap()]);
    assert!(e.contains("--hardware"), "{e}");
    let rules = dir.join("rules.toml");
    std::fs::write(
        &rules,
        "backend = \"cuda\"\nsource = \"x\"\n[[rule]]\nmatch = \"k*\"\nop = \"expert\"\n",
    )
    .unwrap();
    let e = refused(&[
        "calibrate",
        "--trace",
        &trace,
        "--rules",
        rules.to_str().unwrap(),
    ]);
    assert!(
        e.contains("rules.toml") && e.contains("rule 1") && e.contains("expert"),
        "{e}"
    );
    let e = refused(&["calibrate", "--trace", &trace, "--targets", "t.toml"]);
    assert!(e.contains("--targets"), "{e}");
}

#[test]
fn check_prices_a_trace_with_a_fitted_cost_file_as_it_is() {
    let dir = tmp("check");
    let cost = dir.join("fitted.toml");
    let system = dir.join("fitted-system.toml");
    let trace = fixture("cpu_engine_profile.json");
    let o = fit_cpu_fixture(&trace, &cost, &["--system-out", system.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let check = |extra: &[&str]| {
        let mut args = vec![
            "calibrate",
            "--trace",
            &trace,
            "--hardware",
            system.to_str().unwrap(),
            "--dtype",
            "fp32",
            "--check",
        ];
        args.extend_from_slice(extra);
        let o = dstwin(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    let s = check(&[]);
    for want in [
        "priced by fitted-system's cost file as it is",
        "by op",
        "q_a_proj",
        "host time per step, priced by [host] step_us =",
        "kernels and host time together",
    ] {
        assert!(s.contains(want), "{want}:\n{s}");
    }
    // Nothing is fitted or written.
    assert!(
        !s.contains("efficiency per op class") && !s.contains("written"),
        "{s}"
    );
    let j: serde_json::Value = serde_json::from_str(&check(&["--json"])).unwrap();
    let ops = j["check"]["ops"].as_array().unwrap();
    let kernels: u64 = ops.iter().map(|r| r["kernels"].as_u64().unwrap()).sum();
    assert_eq!(kernels, 146);
    assert!(ops.iter().all(|r| r["priced_ms"].as_f64().unwrap() > 0.0));
    let refused = |args: &[&str]| {
        let o = dstwin(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        stderr(&o)
    };
    let e = refused(&["calibrate", "--trace", &trace, "--check"]);
    assert!(e.contains("--hardware"), "{e}");
    // --check fits nothing: nothing to write, no front end to fit.
    let out = dir.join("x.toml");
    for (flag, value) in [("--out", out.to_str().unwrap()), ("--bench", "r.json")] {
        let e = refused(&[
            "calibrate",
            "--trace",
            &trace,
            "--hardware",
            "nvidia-h800-8",
            "--check",
            flag,
            value,
        ]);
        assert!(e.contains(flag), "{e}");
    }
}

#[test]
fn a_step_claiming_more_sequences_than_a_step_holds_is_refused_naming_its_line() {
    let dir = tmp("absurd-step");
    let text = std::fs::read_to_string(fixture("cpu_engine_profile.json")).unwrap();
    let marker = r#"{"args":{"dp_ranks":4,"ranks":4,"seqs":4,"step":1,"tokens":145},"cat":"step""#;
    assert!(text.contains(marker));
    let bad = text.replacen(
        marker,
        r#"{"args":{"dp_ranks":4,"ranks":4,"seqs":9223372036854775807,"step":1,"tokens":145},"cat":"step""#,
        1,
    );
    let trace = dir.join("absurd.json");
    std::fs::write(&trace, bad).unwrap();
    let cost = dir.join("absurd.toml");
    let o = fit_cpu_fixture(trace.to_str().unwrap(), &cost, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("line 75")
            && e.contains("step 1 claims seqs = 9223372036854775807")
            && e.contains("at most 65536"),
        "{e}"
    );
    assert!(!cost.exists(), "nothing is written");
}
