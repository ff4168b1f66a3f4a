//! `dstwin simulate` end to end: reports for people and scripts, determinism, and bad input.

mod common;
use common::{a3_with_host, data, dstwin};

use std::path::PathBuf;
use std::process::{Command, Output};

fn out(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn err(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

fn tmp(name: &str) -> common::TmpDir {
    common::tmp_dir("test", name)
}

#[test]
fn pd_scenario_reports_every_metric() {
    let o = dstwin(&["simulate", &data("tiny-pd.toml"), "--json", "--quiet"]);
    assert!(o.status.success(), "{}", err(&o));
    let v: serde_json::Value = serde_json::from_str(&out(&o)).unwrap();
    assert_eq!(v["requests_finished"], 40);
    assert_eq!(v["requests_unfinished"], 0);
    for k in [
        "ttft_ms",
        "tpot_ms",
        "itl_ms",
        "e2e_ms",
        "queue_ms",
        "kv_transfer_ms",
    ] {
        let p = &v["latency"][k];
        assert!(
            p["p50"].as_f64().unwrap() > 0.0
                && p["p99"].as_f64().unwrap() >= p["p50"].as_f64().unwrap(),
            "{k}: {p}"
        );
    }
    assert_eq!(v["kv_transfers"], 40);
    assert!(v["goodput"].as_f64().unwrap() <= v["request_throughput"].as_f64().unwrap());
    let inst = v["instances"].as_array().unwrap();
    assert_eq!(inst.len(), 2);
    for i in inst {
        let share: f64 = i["time_share"]
            .as_object()
            .unwrap()
            .values()
            .map(|x| x.as_f64().unwrap())
            .sum();
        assert!((share - 1.0).abs() < 1e-6, "{i}");
        assert!(i["utilization"].as_f64().unwrap() > 0.0);
    }
    // MTP at 70%: TPOT below the decode step time (ITL).
    assert!(
        v["latency"]["tpot_ms"]["p50"].as_f64().unwrap()
            < v["latency"]["itl_ms"]["p50"].as_f64().unwrap()
    );
}

#[test]
fn same_scenario_and_seed_give_byte_identical_json() {
    for f in ["tiny-pd.toml", "tiny-mixed.toml", "tiny-trace.toml"] {
        let a = dstwin(&["simulate", &data(f), "--json", "--quiet"]);
        let b = dstwin(&["simulate", &data(f), "--json", "--quiet"]);
        assert!(a.status.success(), "{f}: {}", err(&a));
        assert_eq!(a.stdout, b.stdout, "{f}");
    }
    let c = dstwin(&[
        "simulate",
        &data("tiny-pd.toml"),
        "--json",
        "--quiet",
        "--set",
        "seed=8",
    ]);
    let a = dstwin(&["simulate", &data("tiny-pd.toml"), "--json", "--quiet"]);
    assert_ne!(a.stdout, c.stdout, "another seed draws another workload");
}

#[test]
fn advancing_steady_decoders_in_aggregate_changes_nothing() {
    // The default run advances steady decoders in aggregate; --step-by-step touches every
    // request every step. Reports and per-request rows must be identical, also under KV
    // exhaustion with recompute and with send-back.
    let dir = tmp("aggregate");
    let rows = dir.join("rows.csv");
    let rows_exact = dir.join("rows-exact.csv");
    for (f, set) in [
        ("tiny-pd.toml", "seed=1"),
        ("tiny-mixed.toml", "seed=1"),
        ("tight-kv.toml", "decode.preemption=recompute"),
        ("tight-kv.toml", "decode.preemption=send_back"),
    ] {
        let path = data(f);
        let run = |extra: &[&str], rows: &PathBuf| {
            let mut args = vec!["simulate", &path, "--json", "--quiet", "--set", set];
            args.extend_from_slice(extra);
            let csv = rows.to_str().unwrap().to_string();
            let o = Command::new(env!("CARGO_BIN_EXE_dstwin"))
                .args(&args)
                .args(["--requests-csv", &csv])
                .output()
                .expect("run dstwin");
            assert!(o.status.success(), "{f}: {}", err(&o));
            (o.stdout, std::fs::read(rows).unwrap())
        };
        let fast = run(&[], &rows);
        let exact = run(&["--step-by-step"], &rows_exact);
        assert_eq!(
            String::from_utf8_lossy(&fast.0),
            String::from_utf8_lossy(&exact.0),
            "{f} {set}: report"
        );
        assert_eq!(fast.1, exact.1, "{f} {set}: per-request rows");
    }
}

#[test]
fn async_scheduling_hides_host_time_and_delays_what_arrives_during_a_step() {
    let run = |asy: bool, host_us: u32| {
        let mut args = vec![
            "simulate".to_string(),
            data("tiny-pd.toml"),
            "--json".into(),
            "--quiet".into(),
        ];
        for inst in ["prefill", "decode"] {
            for (k, v) in [
                ("async_scheduling", asy.to_string()),
                ("host_overhead_us", host_us.to_string()),
            ] {
                args.push("--set".into());
                args.push(format!("{inst}.{k}={v}"));
            }
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = dstwin(&args);
        assert!(o.status.success(), "{}", err(&o));
        serde_json::from_str::<serde_json::Value>(&out(&o)).unwrap()
    };
    let tpot = |v: &serde_json::Value| v["latency"]["tpot_ms"]["mean"].as_f64().unwrap();
    let ttft = |v: &serde_json::Value| v["latency"]["ttft_ms"]["mean"].as_f64().unwrap();
    let sync0 = run(false, 0);
    let sync_host = run(false, 5_000);
    let async0 = run(true, 0);
    let async_host = run(true, 5_000);
    for v in [&sync0, &sync_host, &async0, &async_host] {
        assert_eq!(v["requests_finished"], sync0["requests_finished"]);
    }
    // Synchronous scheduling pays the host time every step, and says so.
    assert!(
        tpot(&sync_host) > tpot(&sync0) + 2.0,
        "{} vs {}",
        tpot(&sync_host),
        tpot(&sync0)
    );
    assert!(
        sync_host["instances"][1]["time_share"]["host"]
            .as_f64()
            .unwrap()
            > 0.05
    );
    // Async scheduling hides host time shorter than the device step...
    assert!(
        tpot(&async_host) < tpot(&sync_host),
        "{} vs {}",
        tpot(&async_host),
        tpot(&async0)
    );
    // ...but what arrives during a step waits one more step (the discarded slot of a finished
    // request is checked in the engine's scheduler tests).
    assert!(
        ttft(&async0) > ttft(&sync0),
        "{} vs {}",
        ttft(&async0),
        ttft(&sync0)
    );
    // Same seed, same bytes, async or not.
    assert_eq!(run(true, 5_000), async_host);
}

#[test]
fn text_report_snapshot() {
    let o = dstwin(&["simulate", &data("tiny-pd.toml"), "--quiet"]);
    assert!(o.status.success(), "{}", err(&o));
    insta::assert_snapshot!("simulate_tiny_pd", out(&o));
}

#[test]
fn closed_loop_and_trace_workloads_run() {
    let o = dstwin(&["simulate", &data("tiny-mixed.toml"), "--json", "--quiet"]);
    let v: serde_json::Value = serde_json::from_str(&out(&o)).unwrap();
    assert_eq!(v["requests_finished"], 30);
    let o = dstwin(&["simulate", &data("tiny-trace.toml"), "--json", "--quiet"]);
    assert!(o.status.success(), "{}", err(&o));
    let v: serde_json::Value = serde_json::from_str(&out(&o)).unwrap();
    assert_eq!(v["requests_arrived"], 40);
    // Conversation turns share prefixes.
    assert!(v["prefix_hit_rate"].as_f64().unwrap() > 0.0);
}

#[test]
fn csv_per_request_rows_and_timeline() {
    let dir = tmp("outputs");
    let reqs = dir.join("reqs.csv");
    let tl = dir.join("timeline.json");
    let o = dstwin(&[
        "simulate",
        &data("tiny-pd.toml"),
        "--csv",
        "--quiet",
        "--requests-csv",
        reqs.to_str().unwrap(),
        "--timeline",
        tl.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", err(&o));
    let csv = out(&o);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 2);
    assert!(
        lines[0].starts_with("scenario,scenario_hash,seed,") && lines[0].contains("ttft_p99_ms")
    );
    assert_eq!(lines[0].split(',').count(), lines[1].split(',').count());
    let rows = std::fs::read_to_string(&reqs).unwrap();
    assert_eq!(rows.lines().count(), 41, "header + one row per request");
    assert!(rows.starts_with("id,arrival_s,input_tokens,output_tokens,ttft_ms"));
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&tl).unwrap()).unwrap();
    let ev = t["traceEvents"].as_array().unwrap();
    assert!(ev
        .iter()
        .any(|e| e["ph"] == "X" && e["name"].as_str().unwrap().starts_with("step")));
    assert!(ev.iter().any(|e| e["ph"] == "M"
        && e["args"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("kv transfers"))));
    dstwin_sim::report::check_trace(&t).expect("a well-formed trace");
}

#[test]
fn overrides_change_the_scenario_and_its_hash() {
    let a = dstwin(&["simulate", &data("tiny-pd.toml"), "--json", "--quiet"]);
    let b = dstwin(&[
        "simulate",
        &data("tiny-pd.toml"),
        "--json",
        "--quiet",
        "--set",
        "prefill.max_num_batched_tokens=512",
    ]);
    let va: serde_json::Value = serde_json::from_str(&out(&a)).unwrap();
    let vb: serde_json::Value = serde_json::from_str(&out(&b)).unwrap();
    assert_ne!(va["scenario_hash"], vb["scenario_hash"]);
    assert!(
        vb["latency"]["ttft_ms"]["mean"].as_f64().unwrap()
            > va["latency"]["ttft_ms"]["mean"].as_f64().unwrap()
    );
}

#[test]
fn the_front_end_adds_to_ttft_and_end_to_end_and_not_to_tpot() {
    let run = |set: &[&str]| -> serde_json::Value {
        let scenario = data("tiny-pd.toml");
        let mut args = vec!["simulate", &scenario, "--json", "--quiet"];
        for s in set {
            args.extend(["--set", s]);
        }
        serde_json::from_str(&out(&dstwin(&args))).unwrap()
    };
    let (a, b) = (run(&[]), run(&["frontend_us=2500"]));
    let m = |v: &serde_json::Value, k: &str, s: &str| v["latency"][k][s].as_f64().unwrap();
    // Percentiles come from histograms of three significant digits.
    for s in ["mean", "p50", "p99"] {
        for k in ["ttft_ms", "e2e_ms"] {
            let (x, y) = (m(&a, k, s), m(&b, k, s));
            assert!(
                (y - x - 2.5).abs() <= 2e-3 * y + 1e-6,
                "{k} {s}: {x} -> {y}"
            );
        }
        assert_eq!(m(&b, "tpot_ms", s), m(&a, "tpot_ms", s), "{s}");
    }
    assert_eq!(a["output_tokens"], b["output_tokens"]);
    let o = dstwin(&["simulate", &data("tiny-pd.toml"), "--set", "frontend_us=-1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("frontend_us"), "{}", err(&o));
}

#[test]
fn bad_input_exits_2_names_the_field_and_writes_nothing() {
    let dir = tmp("bad");
    let reqs = dir.join("reqs.csv");
    let scen = dir.join("s.toml");
    let base = std::fs::read_to_string(data("tiny-pd.toml")).unwrap();
    let cases: Vec<(String, &str)> = vec![
        (base.replace("seed = 7", "seed = 7\nsede = 8"), "sede"),
        (
            base.replace("rate = 20.0", "rate = -1.0"),
            "workload.arrival.rate",
        ),
        (
            base.replace("rate = 20.0", "rate = 0.0"),
            "workload.arrival.rate",
        ),
        (base.replace("dies = 32", "dies = 30"), "decode"),
        (
            base.replace(
                "max_model_len = 8192\n\n[[instance]]",
                "max_model_len = 900000\n\n[[instance]]",
            ),
            "max_model_len",
        ),
        (
            base.replace("acceptance = [0.7]", "acceptance = [1.7]"),
            "mtp.acceptance[0]",
        ),
        (
            base.replace("role = \"decode\"", "role = \"prefill\""),
            "instance",
        ),
        (
            base.replace(
                "max_model_len = 8192\n\n[[instance]]",
                "max_model_len = 8192\nhost_overhead_us = -5.0\n\n[[instance]]",
            ),
            "instance.prefill.scheduler.host_overhead_us",
        ),
        // SGLang's prefill delayer negotiates between the DP ranks of a mixed instance only.
        (
            base.replace(
                "max_model_len = 8192\n\n[[instance]]",
                "max_model_len = 8192\nprefill_delay_passes = 30\n\n[[instance]]",
            ),
            "instance.prefill.scheduler.prefill_delay_passes = 30",
        ),
        // vllm-ascend's balance scheduling runs on PD-mixed instances only.
        (
            base.replace(
                "max_model_len = 8192\n\n[[instance]]",
                "max_model_len = 8192\nenable_balance_scheduling = true\n\n[[instance]]",
            ),
            "instance.prefill.scheduler.enable_balance_scheduling = true",
        ),
        // Separate prefill batches need both prompts and decodes on the instance.
        (
            base.replace(
                "max_model_len = 8192\n\n[[instance]]",
                "max_model_len = 8192\nseparate_prefill_batches = true\n\n[[instance]]",
            ),
            "instance.prefill.scheduler.separate_prefill_batches = true: needs a mixed instance",
        ),
        // SGLang's admission knobs need SGLang's admission, and a positive conservativeness.
        (
            base.replace(
                "max_model_len = 8192\n\n[[instance]]",
                "max_model_len = 8192\nignore_eos = true\n\n[[instance]]",
            ),
            "instance.prefill.scheduler.ignore_eos = true: is read by SGLang's admission only",
        ),
        (
            base.replace(
                "max_model_len = 8192\n\n[[instance]]",
                "max_model_len = 8192\nadmission = \"sglang\"\nschedule_conservativeness = 0.0\n\n[[instance]]",
            ),
            "instance.prefill.scheduler.schedule_conservativeness = 0: must be a positive number",
        ),
        (
            base.replace(
                "max_model_len = 8192\n\n[[instance]]",
                "max_model_len = 8192\nadmission = \"sgl\"\n\n[[instance]]",
            ),
            "admission",
        ),
        // The LM-head TP group is consecutive DP ranks.
        (
            base.replace("role = \"decode\"", "role = \"decode\"\nlmhead_tp = 3"),
            "layout.lmhead_tp = 3",
        ),
    ];
    for (text, needle) in cases {
        std::fs::write(&scen, text).unwrap();
        let o = dstwin(&[
            "simulate",
            scen.to_str().unwrap(),
            "--quiet",
            "--requests-csv",
            reqs.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(2), "{needle}: {}", err(&o));
        assert!(err(&o).contains(needle), "{needle}: {}", err(&o));
        assert!(out(&o).is_empty(), "no partial report");
        assert!(!reqs.exists(), "no partial output file");
    }
    let o = dstwin(&["simulate", &data("tiny-pd.toml"), "--set", "nosuch"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("PATH=VALUE"), "{}", err(&o));
}

#[test]
fn malformed_and_empty_traces_exit_2_with_the_line() {
    let dir = tmp("trace");
    let scen = dir.join("s.toml");
    let text = std::fs::read_to_string(data("tiny-trace.toml"))
        .unwrap()
        .replace(
            "../../traces/tests/data/mooncake_conversation_head40.jsonl",
            "t.jsonl",
        );
    std::fs::write(&scen, text).unwrap();
    std::fs::write(dir.join("t.jsonl"), "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 5}\n{\"timestamp\": 1, \"input_length\": oops}\n").unwrap();
    let o = dstwin(&["simulate", scen.to_str().unwrap(), "--quiet"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains(":2"), "{}", err(&o));
    std::fs::write(dir.join("t.jsonl"), "").unwrap();
    let o = dstwin(&["simulate", scen.to_str().unwrap(), "--quiet"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("no requests"), "{}", err(&o));
}

#[test]
fn the_default_scenario_runs_without_arguments() {
    let o = dstwin(&["simulate", "--quiet", "--set", "workload.num_requests=60"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(out(&o).contains("scenario a3-2p1d"));
}

#[test]
fn expert_skew_is_the_default_and_perfect_balance_is_explicit() {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "simulate".to_string(),
            data("tiny-pd.toml"),
            "--json".into(),
            "--quiet".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let o = Command::new(env!("CARGO_BIN_EXE_dstwin"))
            .args(&args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", err(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let skewed = run(&[]);
    let perfect = run(&["--set", "expert_load.kind=perfect"]);
    let imb = |v: &serde_json::Value| v["instances"][1]["moe_imbalance"].as_f64().unwrap();
    assert!(imb(&skewed) > 1.1, "{}", imb(&skewed));
    assert_eq!(imb(&perfect), 1.0);
    // The report says what the run assumed: the fitted load, its parameters and source, the
    // placement policy, each instance's redundant experts and the placement's imbalance.
    let el = &skewed["expert_load"];
    assert_eq!(el["kind"], "fitted");
    assert_eq!(
        el["parameters"]["sigma"],
        dstwin_twin::expert_load::fitted().sigma
    );
    assert!(
        el["source"].as_str().unwrap().contains("TensorRT-LLM"),
        "{el}"
    );
    // No [eplb] policy given, no redundant experts: each instance has the engines' contiguous
    // placement.
    assert_eq!(el["eplb_policy"], serde_json::Value::Null);
    assert_eq!(el["eplb_dynamic"], false);
    let policies = |v: &serde_json::Value| -> Vec<String> {
        v["instances"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["eplb_policy"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(policies(&skewed), ["identity", "identity"]);
    // An instance that runs EPLB (redundant experts, or the dynamic cycle) is placed by load;
    // the others keep the contiguous placement.
    let red = run(&["--set", "decode.redundant_experts=32"]);
    assert_eq!(policies(&red), ["identity", "greedy"]);
    assert_eq!(
        policies(&run(&["--set", "eplb.dynamic=true"])),
        ["greedy", "greedy"]
    );
    let given = run(&[
        "--set",
        "eplb.policy=global",
        "--set",
        "decode.redundant_experts=32",
    ]);
    assert_eq!(given["expert_load"]["eplb_policy"], "global");
    assert_eq!(policies(&given), ["global", "global"]);
    let decode = &skewed["instances"][1];
    assert_eq!(decode["redundant_experts"], 0);
    let placed = decode["placed_imbalance"].as_f64().unwrap();
    assert!(placed > 1.0 && placed <= imb(&skewed), "{decode}");
    assert_eq!(perfect["expert_load"]["kind"], "perfect");
    assert_eq!(perfect["instances"][1]["placed_imbalance"], 1.0);
    let zipf = run(&["--set", "expert_load.kind=zipf"]);
    assert_eq!(zipf["expert_load"]["kind"], "zipf");
    assert_eq!(zipf["expert_load"]["parameters"]["exponent"], 0.5);
    let tpot = |v: &serde_json::Value| v["latency"]["tpot_ms"]["mean"].as_f64().unwrap();
    assert!(tpot(&perfect) < tpot(&skewed));
    // Greedy EPLB on the mean load beats the default identity placement.
    let greedy = run(&["--set", "eplb.policy=greedy"]);
    assert!(
        imb(&greedy) < imb(&skewed),
        "{} vs {}",
        imb(&greedy),
        imb(&skewed)
    );
}

#[test]
fn a_recorded_heat_map_replays() {
    // 58 MoE layers + the MTP layer, 256 experts; one expert of every layer is hot.
    let counts: Vec<Vec<u64>> = (0..59)
        .map(|l| {
            (0..256)
                .map(|e| if e == l % 256 { 5000 } else { 100 })
                .collect()
        })
        .collect();
    let heat = serde_json::json!({ "format": "dstwin-expert-load/1", "experts": 256, "windows": [{ "start_step": 0, "steps": 100, "counts": counts }] });
    let dir = tmp("replay");
    let path = dir.join("heat.json");
    std::fs::write(&path, heat.to_string()).unwrap();
    let o = dstwin(&[
        "simulate",
        &data("tiny-pd.toml"),
        "--json",
        "--quiet",
        "--set",
        "expert_load.kind=replay",
        "--set",
        &format!("expert_load.path=\"{}\"", path.display()),
    ]);
    assert!(o.status.success(), "{}", err(&o));
    let v: serde_json::Value = serde_json::from_str(&out(&o)).unwrap();
    assert!(v["instances"][1]["moe_imbalance"].as_f64().unwrap() > 1.0);
    // A heat map of the wrong shape is refused with both shapes.
    std::fs::write(
        &path,
        heat.to_string()
            .replace("\"experts\":256", "\"experts\":255"),
    )
    .unwrap();
    let o = dstwin(&[
        "simulate",
        &data("tiny-pd.toml"),
        "--quiet",
        "--set",
        "expert_load.kind=replay",
        "--set",
        &format!("expert_load.path=\"{}\"", path.display()),
    ]);
    assert_eq!(o.status.code(), Some(2));
}

/// The JSON report of tests/data/tight-kv.toml (decode short of KV) with one override.
fn tight_kv(set: &str) -> serde_json::Value {
    let o = dstwin(&[
        "simulate",
        &data("tight-kv.toml"),
        "--json",
        "--quiet",
        "--set",
        set,
    ]);
    assert!(o.status.success(), "{set}: {}", err(&o));
    serde_json::from_str(&out(&o)).unwrap()
}

#[test]
fn decode_kv_exhaustion_preempts_or_sends_back_and_loses_no_tokens() {
    // A user system file with tight HBM (tests/data/tight-hbm.toml) leaves ~19K KV tokens per
    // decode rank for 300 requests arriving at once.
    let recompute = tight_kv("decode.preemption=recompute");
    let send_back = tight_kv("decode.preemption=send_back");
    for v in [&recompute, &send_back] {
        assert_eq!(v["requests_finished"], 300);
        assert!(v["preemptions"].as_u64().unwrap() > 0);
    }
    assert_eq!(recompute["sent_back"], 0);
    assert!(send_back["sent_back"].as_u64().unwrap() > 0);
    // Sent-back requests are prefilled again and their KV moves again.
    assert!(send_back["kv_transfers"].as_u64().unwrap() > 300);
    // Every requested output token is produced exactly once either way.
    assert_eq!(recompute["output_tokens"], send_back["output_tokens"]);
}

/// SGLang's decode side preallocates a request only while 512 tokens per held request stay
/// free: on the same KV-starved decode the twin then never retracts, and every request still
/// finishes with the same tokens.
#[test]
fn sglang_admission_keeps_decode_room_and_loses_no_tokens() {
    let vllm = tight_kv("decode.admission=vllm");
    let sglang = tight_kv("decode.admission=sglang");
    assert!(vllm["preemptions"].as_u64().unwrap() > 0);
    assert_eq!(sglang["preemptions"], 0);
    assert_eq!(sglang["requests_finished"], 300);
    assert_eq!(vllm["output_tokens"], sglang["output_tokens"]);
}

#[test]
fn dynamic_eplb_follows_a_shifting_load_and_pays_for_its_moves() {
    // Window 1 is uniform, so the first greedy placement deals experts round-robin and die 0 holds
    // experts 0, 32, ..., 224; window 2 makes exactly those hot.
    let win = |start: u64, hot: bool| {
        let counts: Vec<Vec<u64>> = (0..59)
            .map(|_| {
                (0..256)
                    .map(|e| if hot && e % 32 == 0 { 5000 } else { 100 })
                    .collect()
            })
            .collect();
        serde_json::json!({ "start_step": start, "steps": 100, "counts": counts })
    };
    let heat = serde_json::json!({ "format": "dstwin-expert-load/1", "experts": 256, "windows": [win(0, false), win(100, true)] });
    let dir = tmp("dynamic");
    let path = dir.join("heat.json");
    std::fs::write(&path, heat.to_string()).unwrap();
    let run = |dynamic: bool| {
        let p = format!("expert_load.path=\"{}\"", path.display());
        let d = format!("eplb.dynamic={dynamic}");
        let args = [
            "simulate",
            &data("tiny-pd.toml"),
            "--json",
            "--quiet",
            "--set",
            "expert_load.kind=replay",
            "--set",
            &p,
            "--set",
            "workload.num_requests=300",
            "--set",
            &d,
            "--set",
            "eplb.heat_interval=20",
            "--set",
            "eplb.algorithm_interval=2",
            "--set",
            "eplb.policy=greedy",
        ];
        let o = dstwin(&args);
        assert!(o.status.success(), "{}", err(&o));
        serde_json::from_str::<serde_json::Value>(&out(&o)).unwrap()
    };
    let (fixed, dynamic) = (run(false), run(true));
    let decode = |v: &serde_json::Value| v["instances"][1].clone();
    assert_eq!(decode(&fixed)["eplb_layer_moves"], 0);
    assert!(decode(&dynamic)["eplb_layer_moves"].as_u64().unwrap() > 0);
    assert!(
        decode(&dynamic)["eplb_move_ms"].as_f64().unwrap() > 0.0,
        "moves cost time"
    );
    assert!(
        decode(&dynamic)["moe_imbalance"].as_f64().unwrap()
            < decode(&fixed)["moe_imbalance"].as_f64().unwrap()
    );
}

#[test]
fn an_instance_can_start_from_a_placement_file() {
    let dir = tmp("placement");
    // Experts 0, 32, ..., 224 are hot.
    let counts: Vec<Vec<u64>> = (0..59)
        .map(|_| {
            (0..256)
                .map(|e| if e % 32 == 0 { 5000 } else { 100 })
                .collect()
        })
        .collect();
    let heat = serde_json::json!({ "format": "dstwin-expert-load/1", "experts": 256, "windows": [{ "start_step": 0, "steps": 100, "counts": counts }] });
    std::fs::write(dir.join("heat.json"), heat.to_string()).unwrap();
    // A bad placement: every hot expert on die 0 (8 slots per die on 32 dies).
    let hot: Vec<u32> = (0..8).map(|i| i * 32).collect();
    let rest: Vec<u32> = (0..256).filter(|e| e % 32 != 0).collect();
    let phy2log: Vec<u32> = hot.iter().chain(rest.iter()).copied().collect();
    let layer = serde_json::json!({ "phy2log": phy2log, "replicas": vec![1; 256] });
    let bad = |layers: usize| {
        serde_json::json!({ "policy": "identity", "slots_per_die": 8, "layers": vec![layer.clone(); layers] }).to_string()
    };
    std::fs::write(dir.join("bad.json"), bad(59)).unwrap();
    let run = |placement: Option<&str>| {
        let heat = format!("expert_load.path=\"{}\"", dir.join("heat.json").display());
        let mut args = vec![
            "simulate".to_string(),
            data("tiny-pd.toml"),
            "--json".into(),
            "--quiet".into(),
            "--set".into(),
            "expert_load.kind=replay".into(),
            "--set".into(),
            heat,
        ];
        if let Some(p) = placement {
            args.extend([
                "--set".to_string(),
                format!("decode.placement=\"{}\"", dir.join(p).display()),
            ]);
        }
        Command::new(env!("CARGO_BIN_EXE_dstwin"))
            .args(&args)
            .output()
            .unwrap()
    };
    let computed: serde_json::Value = serde_json::from_slice(&run(None).stdout).unwrap();
    let o = run(Some("bad.json"));
    assert!(o.status.success(), "{}", err(&o));
    let from_file: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let imb = |v: &serde_json::Value| v["instances"][1]["moe_imbalance"].as_f64().unwrap();
    assert!(
        imb(&from_file) > 2.0 * imb(&computed),
        "{} vs {}",
        imb(&from_file),
        imb(&computed)
    );
    // A placement for another shape is refused with both numbers.
    std::fs::write(dir.join("bad.json"), bad(58)).unwrap();
    let o = run(Some("bad.json"));
    assert_eq!(o.status.code(), Some(2));
    assert!(
        err(&o).contains("placement has 58 layers, the instance has 59 MoE layers"),
        "{}",
        err(&o)
    );
}

#[test]
fn a_warm_up_is_left_out_of_latencies_tokens_and_rates() {
    let run = |warmup: &str| {
        let o = dstwin(&[
            "simulate",
            &data("tiny-pd.toml"),
            "--json",
            "--quiet",
            "--set",
            "workload.num_requests=400",
            "--set",
            "duration_s=12",
            "--set",
            &format!("warmup_s={warmup}"),
        ]);
        assert!(o.status.success(), "{}", err(&o));
        serde_json::from_str::<serde_json::Value>(&out(&o)).unwrap()
    };
    let (all, late) = (run("0"), run("4"));
    assert_eq!(late["warmup_s"], 4.0);
    // The same run: what happens does not depend on what is measured.
    assert_eq!(all["requests_arrived"], late["requests_arrived"]);
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap();
    let count = |v: &serde_json::Value| v["latency"]["ttft_ms"]["count"].as_u64().unwrap();
    assert!(
        count(&late) < count(&all),
        "{} vs {}",
        count(&late),
        count(&all)
    );
    assert!(f(&late, "output_tokens") < f(&all, "output_tokens"));
    // Rates are over the measured time only.
    let measured = f(&late, "simulated_s") - 4.0;
    assert!((f(&late, "output_tok_s") * measured - f(&late, "output_tokens")).abs() < 1e-6);
    let text = out(&dstwin(&[
        "simulate",
        &data("tiny-pd.toml"),
        "--quiet",
        "--set",
        "duration_s=12",
        "--set",
        "warmup_s=4",
    ]));
    assert!(text.contains("the first 4.0 s are left out"), "{text}");
    // A warm-up must be >= 0 and shorter than the run.
    for (bad, says) in [
        ("-1", "must be a number of seconds >= 0"),
        ("12", "shorter than duration_s"),
    ] {
        let o = dstwin(&[
            "simulate",
            &data("tiny-pd.toml"),
            "--set",
            "duration_s=12",
            "--set",
            &format!("warmup_s={bad}"),
        ]);
        assert_eq!(o.status.code(), Some(2));
        assert!(
            err(&o).contains("warmup_s") && err(&o).contains(says),
            "{}",
            err(&o)
        );
    }
    // Every request done before the warm-up ends: nothing was measured, which is an error,
    // not a report of zero rates.
    let o = dstwin(&[
        "simulate",
        &data("tiny-pd.toml"),
        "--set",
        "duration_s=100000",
        "--set",
        "warmup_s=90000",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains("nothing was measured"), "{}", err(&o));
}

/// `simulate SCENARIO --json` with `--set` for each of `sets`: the report.
fn json_report(scenario: &str, sets: &[&str]) -> serde_json::Value {
    let mut args = vec!["simulate", scenario, "--json", "--quiet"];
    for s in sets {
        args.extend(["--set", s]);
    }
    let o = dstwin(&args);
    assert!(o.status.success(), "{}", err(&o));
    serde_json::from_str(&out(&o)).unwrap()
}

#[test]
fn a_cost_files_host_time_reaches_the_twin_unless_the_scenario_gives_its_own() {
    // The A3 system with its cost file plus the `[host]` table `calibrate --trace` writes.
    let dir = common::tmp_dir("sim", "host");
    let hw = a3_with_host(&dir, "step_us = 5000.0");
    let scenario = data("tiny-mixed.toml");
    let tpot = |sets: &[&str]| {
        json_report(&scenario, sets)["latency"]["tpot_ms"]["mean"]
            .as_f64()
            .unwrap()
    };
    let shipped = tpot(&[]);
    let with_host = tpot(&[&hw]);
    let overridden = tpot(&[&hw, "serve.host_overhead_us=0"]);
    // 5 ms of host time per step, synchronous scheduling: every decode step is 5 ms longer.
    assert!(
        (with_host - shipped - 5.0).abs() < 0.5,
        "{shipped} ms without [host], {with_host} ms with"
    );
    assert_eq!(overridden, shipped);
}

#[test]
fn host_time_per_token_is_paid_on_every_token_a_step_computes() {
    // One request alone: its prompt's step computes 700 tokens, each decode step one.
    let scenario = data("tiny-mixed.toml");
    let run = |per_token_us: &str| {
        let mut args = vec!["simulate", scenario.as_str(), "--json", "--quiet"];
        let host = format!("serve.host_overhead_per_token_us={per_token_us}");
        for s in [
            "workload.concurrency=1",
            "workload.num_requests=1",
            "expert_load.kind=perfect",
            host.as_str(),
        ] {
            args.extend(["--set", s]);
        }
        let o = dstwin(&args);
        assert!(o.status.success(), "{}", err(&o));
        let v: serde_json::Value = serde_json::from_str(&out(&o)).unwrap();
        let mean = |k: &str| v["latency"][k]["mean"].as_f64().unwrap();
        (mean("ttft_ms"), mean("tpot_ms"))
    };
    let (ttft0, tpot0) = run("0");
    let (ttft, tpot) = run("100");
    // The same from a cost file's `[host] per_token_us` (what `calibrate --trace` fits).
    let dir = common::tmp_dir("sim", "host-token");
    let hw = a3_with_host(&dir, "step_us = 0.0\nper_token_us = 100.0");
    let o = dstwin(&[
        "simulate",
        &scenario,
        "--json",
        "--quiet",
        "--set",
        "workload.concurrency=1",
        "--set",
        "workload.num_requests=1",
        "--set",
        "expert_load.kind=perfect",
        "--set",
        &hw,
    ]);
    assert!(o.status.success(), "{}", err(&o));
    let v: serde_json::Value = serde_json::from_str(&out(&o)).unwrap();
    assert_eq!(v["latency"]["ttft_ms"]["mean"].as_f64(), Some(ttft));
    assert_eq!(v["latency"]["tpot_ms"]["mean"].as_f64(), Some(tpot));
    // 700 tokens x 100 us on the first token; 100 us on each later one. (The report's
    // latencies come from histograms of three significant digits.)
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-3 * b.max(a);
    assert!(close(ttft, ttft0 + 70.0), "{ttft0} -> {ttft}");
    assert!(close(tpot, tpot0 + 0.1), "{tpot0} -> {tpot}");
    let o = dstwin(&[
        "simulate",
        &scenario,
        "--set",
        "serve.host_overhead_per_token_us=-1",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        err(&o).contains("host_overhead_per_token_us"),
        "{}",
        err(&o)
    );
}

/// Simulates `scenario` in `sub` on the A3 system with `[host]` `host` (perfect expert balance,
/// `sets` applied): each request's (TTFT, TPOT) in ms, from `--requests-csv`.
fn ttft_tpot_per_request(
    sub: &std::path::Path,
    scenario: &str,
    host: &str,
    sets: &[&str],
) -> Vec<(f64, f64)> {
    std::fs::create_dir_all(sub).unwrap();
    let hw = a3_with_host(sub, host);
    let csv = sub.join("requests.csv");
    let mut args = vec![
        "simulate",
        scenario,
        "--quiet",
        "--set",
        &hw,
        "--set",
        "expert_load.kind=perfect",
        "--requests-csv",
        csv.to_str().unwrap(),
    ];
    for s in sets {
        args.extend(["--set", s]);
    }
    let o = dstwin(&args);
    assert!(o.status.success(), "{}", err(&o));
    let text = common::read(&csv);
    let mut lines = text.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |n: &str| head.iter().position(|h| *h == n).unwrap();
    let (ttft, tpot) = (col("ttft_ms"), col("tpot_ms"));
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[ttft].parse().unwrap(), f[tpot].parse().unwrap())
        })
        .collect()
}

#[test]
fn a_step_after_idling_runs_its_kernels_at_the_cold_factor() {
    // tiny-mixed's deployment, three requests 20 s apart on average: each prompt's step starts
    // after the device idled (the first one has nothing before it), every decode step right
    // after the previous one.
    let dir = common::tmp_dir("sim", "cold");
    let base = common::read(&PathBuf::from(data("tiny-mixed.toml")));
    let open = base.split("[workload]").next().unwrap().to_owned()
        + "[workload]\nkind = \"synthetic\"\nnum_requests = 3\ninput = { dist = \"fixed\", value = 700 }\noutput = { dist = \"fixed\", value = 20 }\narrival = { process = \"poisson\", rate = 0.05 }\n";
    let scenario = dir.join("open.toml");
    std::fs::write(&scenario, open).unwrap();
    let run = |scenario: &str, host: &str, name: &str| {
        ttft_tpot_per_request(&dir.join(name), scenario, host, &[])
    };
    let open = scenario.to_str().unwrap();
    let warm = run(open, "step_us = 0.0", "warm");
    let cold2 = run(
        open,
        "step_us = 0.0\ncold_after_us = 1000.0\ncold_factor = 2.0",
        "cold2",
    );
    let cold3 = run(
        open,
        "step_us = 0.0\ncold_after_us = 1000.0\ncold_factor = 3.0",
        "cold3",
    );
    assert_eq!(warm.len(), 3);
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1.0);
    // The first prompt has nothing to idle after; the decode steps follow one another.
    assert!(close(cold2[0].0, warm[0].0), "{cold2:?} {warm:?}");
    for i in 0..3 {
        assert!(close(cold2[i].1, warm[i].1) && close(cold3[i].1, warm[i].1));
    }
    // The later prompts' steps run at the factor: twice the factor less one, twice the extra.
    for i in 1..3 {
        let (d2, d3) = (cold2[i].0 - warm[i].0, cold3[i].0 - warm[i].0);
        assert!(d2 > 1.0, "request {i}: {warm:?} -> {cold2:?}");
        assert!(close(d3, 2.0 * d2), "request {i}: +{d2} at 2, +{d3} at 3");
    }
    // Idling shorter than cold_after_us is no idling.
    let long = run(
        open,
        "step_us = 0.0\ncold_after_us = 1e12\ncold_factor = 3.0",
        "long",
    );
    assert_eq!(long, warm);
    // A busy closed loop never idles: the same report as without the cold terms.
    let tiny = data("tiny-mixed.toml");
    assert_eq!(
        run(
            &tiny,
            "step_us = 0.0\ncold_after_us = 1000.0\ncold_factor = 3.0",
            "busy"
        ),
        run(&tiny, "step_us = 0.0", "busy-warm")
    );
    // Both or neither, the idle time above zero, the factor from 0.001 to 1,000.
    let sub = dir.join("bad");
    std::fs::create_dir_all(&sub).unwrap();
    for (host, field) in [
        ("step_us = 0.0\ncold_factor = 2.0", "host.cold_factor"),
        (
            "step_us = 0.0\ncold_after_us = 0.0\ncold_factor = 2.0",
            "host.cold_after_us",
        ),
        (
            "step_us = 0.0\ncold_after_us = 10.0\ncold_factor = -1.0",
            "host.cold_factor",
        ),
        // A factor that would price a cold step past any clock.
        (
            "step_us = 0.0\ncold_after_us = 10.0\ncold_factor = 1e300",
            "host.cold_factor",
        ),
    ] {
        let hw = a3_with_host(&sub, host);
        let o = dstwin(&["simulate", open, "--quiet", "--set", &hw]);
        assert_eq!(o.status.code(), Some(2), "{host}: {}", err(&o));
        assert!(err(&o).contains(field), "{host}: {}", err(&o));
    }
}

#[test]
fn steps_land_around_their_price_by_the_cost_files_step_sigma() {
    // tiny-mixed's closed loop (30 requests, 8 at a time, prompts of 700 tokens, 20 out): with
    // `[host] step_sigma` every step's kernel time is drawn around its price, seeded.
    let dir = common::tmp_dir("sim", "spread");
    let tiny = data("tiny-mixed.toml");
    let run = |host: &str, name: &str, seed: &str| {
        ttft_tpot_per_request(&dir.join(name), &tiny, host, &[seed])
    };
    let at_price = run("step_us = 0.0", "price", "seed=1");
    let spread = run("step_us = 0.0\nstep_sigma = 0.3", "spread", "seed=1");
    assert_eq!(at_price.len(), 30);
    assert_eq!(spread.len(), 30);
    // The same seed draws the same steps; another seed others.
    assert_eq!(
        run("step_us = 0.0\nstep_sigma = 0.3", "again", "seed=1"),
        spread
    );
    assert_ne!(
        run("step_us = 0.0\nstep_sigma = 0.3", "other", "seed=2"),
        spread
    );
    // `--draw` times the same workload's steps again: the same requests, other latencies.
    let sub = dir.join("draw");
    std::fs::create_dir_all(&sub).unwrap();
    let hw = a3_with_host(&sub, "step_us = 0.0\nstep_sigma = 0.3");
    let drawn = |draw: &str| {
        let o = dstwin(&[
            "simulate",
            &tiny,
            "--quiet",
            "--json",
            "--set",
            &hw,
            "--set",
            "expert_load.kind=perfect",
            "--set",
            "seed=1",
            "--draw",
            draw,
        ]);
        assert!(o.status.success(), "{}", err(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let (d0, d3) = (drawn("0"), drawn("3"));
    for same in ["requests_finished", "input_tokens", "output_tokens"] {
        assert_eq!(d0[same], d3[same], "{same}");
    }
    assert_ne!(d0["latency"], d3["latency"]);
    // The report says which draw it is (absent for the seed's own), and a draw is reproducible.
    assert!(d0.get("draw").is_none());
    assert_eq!(d3["draw"], 3);
    assert_eq!(drawn("3"), d3);
    let mean =
        |v: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| v.iter().map(f).sum::<f64>() / v.len() as f64;
    let sd = |v: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| {
        let m = mean(v, f);
        (v.iter().map(|x| (f(x) - m).powi(2)).sum::<f64>() / v.len() as f64).sqrt()
    };
    let tpot = |x: &(f64, f64)| x.1;
    // Factors of mean one: the mean TPOT stays the price's (each request's is over 19 steps,
    // 30 requests: a spread of 0.3 moves the mean by a few percent at most)...
    let (m0, m1) = (mean(&at_price, tpot), mean(&spread, tpot));
    assert!((m1 / m0 - 1.0).abs() < 0.1, "{m0} -> {m1}");
    // ... while the requests' TPOTs spread apart.
    assert!(
        sd(&spread, tpot) > 2.0 * sd(&at_price, tpot) + 1e-6 * m0,
        "{at_price:?} -> {spread:?}"
    );
    // A spread of 0 is no spread.
    assert_eq!(
        run("step_us = 0.0\nstep_sigma = 0.0", "zero", "seed=1"),
        at_price
    );
    // From 0 to 1, a number.
    let sub = dir.join("bad");
    std::fs::create_dir_all(&sub).unwrap();
    for host in [
        "step_us = 0.0\nstep_sigma = -0.1",
        "step_us = 0.0\nstep_sigma = 1.5",
    ] {
        let hw = a3_with_host(&sub, host);
        let o = dstwin(&["simulate", &tiny, "--quiet", "--set", &hw]);
        assert_eq!(o.status.code(), Some(2), "{host}: {}", err(&o));
        assert!(err(&o).contains("host.step_sigma"), "{host}: {}", err(&o));
    }
}

/// `--uncertainty`: every headline metric with an 80% interval over draws of what the scenario
/// leaves unknown, the same every time; the report itself is the run without draws.
#[test]
fn uncertainty_gives_every_headline_metric_an_interval() {
    let tiny = data("tiny-pd.toml");
    let plain = dstwin(&["simulate", &tiny, "--json", "--quiet"]);
    let with = dstwin(&["simulate", &tiny, "--json", "--quiet", "--uncertainty=6"]);
    assert!(with.status.success(), "{}", err(&with));
    let (p, mut w): (serde_json::Value, serde_json::Value) = (
        serde_json::from_str(&out(&plain)).unwrap(),
        serde_json::from_str(&out(&with)).unwrap(),
    );
    let u = w["uncertainty"].take();
    assert_eq!(u["draws"], 6);
    for m in [
        "ttft_mean_ms",
        "tpot_p50_ms",
        "output_tok_s",
        "output_tok_s_per_card",
    ] {
        let (lo, hi) = (u[m]["p10"].as_f64().unwrap(), u[m]["p90"].as_f64().unwrap());
        assert!(lo.is_finite() && lo <= hi, "{m}: {lo} .. {hi}");
    }
    // Without the draws' object the report is the plain run's, byte for byte in its fields.
    w.as_object_mut().unwrap().remove("uncertainty");
    assert_eq!(w, p);
    let again = dstwin(&["simulate", &tiny, "--json", "--quiet", "--uncertainty=6"]);
    assert_eq!(out(&again), out(&with), "deterministic");
    let text = dstwin(&["simulate", &tiny, "--quiet", "--uncertainty=3"]);
    assert!(
        out(&text).contains("80% intervals over 3 draws"),
        "{}",
        out(&text)
    );
    for bad in [&["--uncertainty=1"][..], &["--uncertainty=4", "--csv"][..]] {
        let mut args = vec!["simulate", tiny.as_str(), "--quiet"];
        args.extend_from_slice(bad);
        assert_eq!(dstwin(&args).status.code(), Some(2), "{bad:?}");
    }
}

/// vllm-ascend's balance scheduling from a scenario reaches the scheduler (the rule itself is
/// tested in engine/core/tests/scheduler.rs) and is refused beside SGLang's prefill delayer.
#[test]
fn balance_scheduling_changes_a_mixed_run_and_is_not_paired_with_the_prefill_delayer() {
    let tiny = data("tiny-mixed.toml");
    // Every seat taken (32 ranks x 8) and outputs of different lengths, so that some ranks
    // are full while others have a seat free.
    let full = [
        "workload.concurrency=300",
        "workload.num_requests=900",
        "workload.output={ dist = \"uniform\", min = 5, max = 60 }",
    ];
    let plain = json_report(&tiny, &full);
    let on = "serve.scheduler.enable_balance_scheduling=true";
    let balanced = json_report(&tiny, &[full[0], full[1], full[2], on]);
    assert_ne!(plain["latency"], balanced["latency"]);
    assert_eq!(plain["requests_finished"], balanced["requests_finished"]);
    let o = dstwin(&[
        "simulate",
        &tiny,
        "--quiet",
        "--set",
        "serve.scheduler.enable_balance_scheduling=true",
        "--set",
        "serve.scheduler.prefill_delay_passes=30",
        "--set",
        "serve.scheduler.async_scheduling=true",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        err(&o).contains("enable_balance_scheduling = true: not with prefill_delay_passes"),
        "{}",
        err(&o)
    );
}

/// SGLang's separate prefill and decode batches from a scenario reach the scheduler (the rule
/// itself is tested in engine/core/tests/scheduler.rs): the same requests finish, at other
/// latencies, with SGLang's other scheduling switches too; vllm-ascend's balance scheduling is
/// refused beside it.
#[test]
fn separate_prefill_batches_change_a_mixed_run() {
    let tiny = data("tiny-mixed.toml");
    // Every seat taken (32 ranks x 8): prompts arrive on ranks that are decoding.
    let full = ["workload.concurrency=300", "workload.num_requests=900"];
    let plain = json_report(&tiny, &full);
    let on = "serve.scheduler.separate_prefill_batches=true";
    let separate = json_report(&tiny, &[full[0], full[1], on]);
    assert_eq!(plain["requests_finished"], separate["requests_finished"]);
    assert_ne!(plain["latency"], separate["latency"]);
    // With SGLang's overlap scheduler and prefill delayer, as the published SGLang runs set
    // them: every request still finishes.
    let sglang = json_report(
        &tiny,
        &[
            full[0],
            full[1],
            on,
            "serve.scheduler.async_scheduling=true",
            "serve.scheduler.prefill_delay_passes=30",
        ],
    );
    assert_eq!(plain["requests_finished"], sglang["requests_finished"]);
    // vllm-ascend's balance scheduling is not SGLang's.
    let o = dstwin(&[
        "simulate",
        &tiny,
        "--quiet",
        "--set",
        on,
        "--set",
        "serve.scheduler.enable_balance_scheduling=true",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        err(&o).contains("enable_balance_scheduling = true: not with separate_prefill_batches"),
        "{}",
        err(&o)
    );
}

/// SGLang's prefill delayer from a scenario: on tiny-mixed's 32 DP ranks a prompt that arrives
/// while the others decode waits for up to 29 steps, so TTFT grows (by 9%: most prompts of
/// its closed loop arrive together, when nothing runs); the knob is refused where SGLang
/// refuses it.
#[test]
fn the_prefill_delayer_holds_prompts_and_is_refused_where_sglang_refuses_it() {
    let tiny = data("tiny-mixed.toml");
    let ttft = |sets: &[&str]| {
        json_report(&tiny, sets)["latency"]["ttft_ms"]["mean"]
            .as_f64()
            .unwrap()
    };
    let on = "serve.scheduler.async_scheduling=true";
    let plain = ttft(&[on]);
    let held = ttft(&[on, "serve.scheduler.prefill_delay_passes=30"]);
    assert!(held > 1.05 * plain, "TTFT {plain} ms -> {held} ms");
    for sets in [
        // One DP rank: nothing to negotiate with.
        &["serve.scheduler.prefill_delay_passes=30", on, "serve.tp=32"][..],
        // Without the overlap scheduler.
        &["serve.scheduler.prefill_delay_passes=30"][..],
    ] {
        let mut args = vec!["simulate", tiny.as_str(), "--quiet"];
        for s in sets {
            args.extend(["--set", s]);
        }
        let o = dstwin(&args);
        assert_eq!(o.status.code(), Some(2), "{sets:?}");
        assert!(
            err(&o).contains("scheduler.prefill_delay_passes = 30"),
            "{sets:?}: {}",
            err(&o)
        );
    }
}

/// `--plots DIR` writes the run's charts (SVG and PNG), leaves the report as it is without it,
/// and names the instances and the SLO in them.
#[test]
fn plots_of_one_run() {
    let dir = tmp("plots");
    let plots = dir.join("charts");
    let plain = dstwin(&["simulate", &data("tiny-pd.toml"), "--json", "--quiet"]);
    let o = dstwin(&[
        "simulate",
        &data("tiny-pd.toml"),
        "--json",
        "--quiet",
        "--plots",
        plots.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o), out(&plain), "the report does not change");
    for f in ["ttft_cdf", "tpot_cdf", "step_time", "memory"] {
        let svg = std::fs::read_to_string(plots.join(format!("{f}.svg"))).unwrap();
        assert!(svg.starts_with("<svg"), "{f}");
        let png = std::fs::read(plots.join(format!("{f}.png"))).unwrap();
        assert_eq!(&png[1..4], b"PNG", "{f}");
    }
    let ttft = std::fs::read_to_string(plots.join("ttft_cdf.svg")).unwrap();
    assert!(ttft.contains("40 finished requests"), "{ttft}");
    let steps = std::fs::read_to_string(plots.join("step_time.svg")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out(&o)).unwrap();
    for i in v["instances"].as_array().unwrap() {
        assert!(steps.contains(i["name"].as_str().unwrap()), "{i}");
    }
    let memory = std::fs::read_to_string(plots.join("memory.svg")).unwrap();
    assert!(
        memory.contains("KV cache") && memory.contains("routed experts"),
        "{memory}"
    );
}
