//! `dstwin plan` end to end: ranking with spreads over seeds, ties, launch arguments, and the
//! same output for the same seeds.

mod common;
use common::{dstwin, read, stderr_text as err};

use serde_json::Value;

/// DeepSeek-R1 on two Atlas 800 A3 nodes, short requests: 28 layouts at 4 MTP depths searched,
/// a dozen simulated, a few seconds.
const SMALL: [&str; 13] = [
    "plan",
    "--model",
    "deepseek-r1",
    "--hardware",
    "atlas-800-a3",
    "--cards",
    "16",
    "--input",
    "400",
    "--output",
    "24",
    "--slo",
    "tpot=50ms,ttft=5s",
];

fn plan(extra: &[&str]) -> std::process::Output {
    let args: Vec<&str> = SMALL.iter().chain(extra).copied().collect();
    let o = dstwin(&args);
    assert!(o.status.success(), "{args:?}: {}", err(&o));
    o
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn plan_ranks_layouts_and_prints_launch_arguments() {
    let out = common::tmp_dir("plan", "text");
    let o = plan(&["--top", "2", "--out", out.to_str().unwrap(), "-q"]);
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("rank  goodput/card (min-max)"), "{s}");
    assert!(s.contains("run with seeds 1-3"), "{s}");
    assert!(s.contains("2 request lifetimes of warm-up left out"), "{s}");
    assert!(
        s.contains("why the others lose (outside the spread):"),
        "{s}"
    );
    assert!(s.contains("#1 1P1D nodes"), "{s}");
    // The search: every layout priced by steady steps, only the front simulated, the rest
    // reported with their estimate.
    assert!(
        s.contains("searched by steady steps for their batch cap (4-256 per DP rank)"),
        "{s}"
    );
    assert!(s.contains("  estimate  "), "{s}");
    assert!(
        s.contains("layouts more than 30% below are not simulated"),
        "{s}"
    );
    for flag in [
        "--data-parallel-size",
        "--tensor-parallel-size",
        "--enable-expert-parallel",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--additional-config",
        "eplb_config",
        "\"kv_role\": \"kv_producer\"",
        "\"kv_role\": \"kv_consumer\"",
    ] {
        assert!(s.contains(flag), "launch arguments lack {flag}");
    }
    let plan: Value = serde_json::from_str(&read(&out.join("plan.json"))).unwrap();
    let first = &plan["layouts"][0];
    assert_eq!(first["standing"], "best");
    assert!(f(&first["goodput_per_card"]["mean"]) > 0.0);
    assert!(f(&first["tpot_p50_ms"]["mean"]) <= 50.0);
    assert!(
        read(&out.join("plan_tpot.svg")).contains("knee")
            || plan["layouts"].as_array().unwrap().len() < 3
    );
    // Ties, as the text shows them: every tied layout's row is marked =1 with its range.
    let tied = plan["tied_with_best"].as_array().unwrap();
    assert!(!tied.is_empty(), "these prefill-bound layouts tie: {s}");
    assert!(
        s.contains("statistically indistinguishable over 3 seeds"),
        "{s}"
    );
    let rows: Vec<&str> = s.lines().filter(|l| l.starts_with("  =1  ")).collect();
    assert_eq!(rows.len(), tied.len() + 1, "{s}");
    let ranged = |l: &str| {
        l.split_whitespace()
            .nth(2)
            .is_some_and(|r| r.starts_with('('))
    };
    assert!(rows.iter().all(|l| ranged(l)), "{rows:?}");
    // The SLOs the goodput was counted under are recorded, and `report` draws the same
    // charts again from plan.json alone.
    assert_eq!(f(&plan["slo"]["tpot_ms"]), 50.0);
    assert_eq!(f(&plan["slo"]["ttft_ms"]), 5000.0);
    let again = common::tmp_dir("plan", "report");
    std::fs::copy(out.join("plan.json"), again.join("plan.json")).unwrap();
    let o = dstwin(&["report", again.join("plan.json").to_str().unwrap()]);
    assert!(o.status.success(), "{}", err(&o));
    for chart in ["plan_tpot", "plan_load_goodput", "plan_load_tpot"] {
        for ext in ["svg", "png"] {
            let name = format!("{chart}.{ext}");
            let (a, b) = (
                std::fs::read(out.join(&name)),
                std::fs::read(again.join(&name)),
            );
            assert_eq!(
                a.unwrap(),
                b.unwrap(),
                "{name} differs when drawn from plan.json"
            );
        }
    }
    let json = again.join("plan.json");
    let o = dstwin(&["report", "--merge", json.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        err(&o).contains("a plan.json is reported alone"),
        "{}",
        err(&o)
    );
    std::fs::write(&json, "{\"layouts\": []}").unwrap();
    let o = dstwin(&["report", json.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("no \"slo\""), "{}", err(&o));
    // Cards that do not fill whole nodes are refused.
    let o = dstwin(&["plan", "--cards", "12", "-q"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("--cards 12"));
    let o = dstwin(&["plan", "--slo", "tpot=fast", "-q"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn plan_json_gives_spreads_and_ranks_only_outside_them() {
    let o = plan(&["--json", "-q"]);
    // Same seeds, same bytes.
    assert_eq!(
        o.stdout,
        plan(&["--json", "-q"]).stdout,
        "plan is deterministic"
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["seeds"], serde_json::json!([1, 2, 3]));
    assert_eq!(v["steady_state"]["warmup_lifetimes"], 2);
    let layouts = v["layouts"].as_array().unwrap();
    let best = &layouts[0];
    assert_eq!(best["standing"], "best");
    assert_eq!(&v["best"], &best["candidate"]);
    let range = |o: &Value| {
        let g = &o["goodput_per_card"];
        (f(&g["min"]), f(&g["mean"]), f(&g["max"]))
    };
    let (best_min, _, best_max) = range(best);
    let top_estimate = layouts
        .iter()
        .filter_map(|o| o["estimate"]["goodput_per_card"].as_f64())
        .fold(0.0, f64::max);
    let mut seen = std::collections::BTreeMap::new();
    for o in layouts {
        let standing = o["standing"].as_str().unwrap();
        *seen.entry(standing).or_insert(0) += 1;
        if standing == "invalid" {
            assert!(o["rank"].is_null() && !o["invalid"].as_str().unwrap().is_empty());
            continue;
        }
        // Every valid layout carries its steady-step estimate; those left out of the front
        // carry nothing else, and lie more than the margin below the best estimate.
        let e = &o["estimate"];
        assert!(
            f(&e["capacity_req_s"]) > 0.0 && f(&e["tpot_ms"]) > 0.0,
            "{o}"
        );
        if standing == "estimated" {
            assert!(
                o["rank"].is_null() && o["goodput_per_card"].is_null(),
                "{o}"
            );
            assert!(o["levels"].as_array().unwrap().is_empty());
            let g = f(&e["goodput_per_card"]);
            assert!(g < (1.0 - f(&v["front_margin"])) * top_estimate, "{o}");
            continue;
        }
        let (min, mean, max) = range(o);
        assert!(min <= mean && mean <= max, "{o}");
        for p in ["ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms"] {
            assert!(f(&o[p]["min"]) <= f(&o[p]["max"]), "{p}: {o}");
        }
        let seeds = o["seeds"].as_array().unwrap().len();
        let overlaps = max >= best_min && min <= best_max;
        match standing {
            "best" => assert_eq!(seeds, 3),
            "tied" => {
                assert_eq!(seeds, 3);
                assert!(overlaps, "a tie overlaps the best: {o}");
                assert_eq!(o["rank"], 1, "a tie is ranked with the best");
                assert!(o["loses_because"].is_null());
            }
            "lower" => {
                assert_eq!(seeds, 3);
                assert!(max < best_min, "a loss is outside the spread: {o}");
                assert!(o["rank"].as_u64().unwrap() > 1);
            }
            "screened_out" => {
                assert_eq!(seeds, 1);
                assert!(o["rank"].is_null());
                assert!(mean < best_min, "{o}");
                assert!(!o["loses_because"]["reason"].is_null());
            }
            other => panic!("standing {other}"),
        }
    }
    assert!(seen.contains_key("tied"), "{seen:?}");
    assert!(seen.contains_key("screened_out"), "{seen:?}");
    assert!(seen.contains_key("estimated"), "{seen:?}");
    assert_eq!(v["batch_caps"][0], 4);
    assert_eq!(v["mtp_depths"], serde_json::json!([0, 1, 2, 3]));
    // Other seeds, other figures; the seeds are reported.
    let o = plan(&["--json", "-q", "--seed", "7", "--seeds", "2"]);
    let w: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(w["seeds"], serde_json::json!([7, 8]));
    assert_ne!(
        w["layouts"][0]["goodput_per_card"],
        best["goodput_per_card"]
    );
}

/// A model given as a config.json: planned, and launched under the model's own name (its
/// directory's here), not the path; an unknown model is refused naming the built-in ones.
#[test]
fn plan_takes_a_config_json_and_serves_it_under_its_name() {
    let dir = common::tmp_dir("plan", "config").join("DeepSeek-R1-Distill");
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("config.json");
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/engine/core/tests/data/deepseek-v3-config.json"
        ),
        &cfg,
    )
    .unwrap();
    let mut args: Vec<&str> = SMALL.to_vec();
    args[2] = cfg.to_str().unwrap();
    args.extend(["--top", "1", "--seeds", "2", "-q"]);
    let o = dstwin(&args);
    assert!(o.status.success(), "{}", err(&o));
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("--served-model-name DeepSeek-R1-Distill"), "{s}");
    assert!(
        s.lines()
            .filter(|l| l.contains("vllm serve") || l.contains("--served-model-name"))
            .all(|l| !l.contains("config.json")),
        "{s}"
    );
    let o = dstwin(&["plan", "--model", "deepseek-v9", "-q"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("deepseek-r1"), "{}", err(&o));
}

/// `--slo` percentiles: a bound on the TPOT p90 of each run's window ranks only layouts that
/// hold it (their JSON carries the percentile, the text its column), names it in the losses,
/// and a percentile outside (0, 100) or an unknown metric exits 2 naming the part.
#[test]
fn plan_takes_percentile_slos() {
    let mut args: Vec<&str> = SMALL[..SMALL.len() - 1].to_vec();
    args.extend(["ttft=5s,tpot_p90=45ms", "-q"]);
    let o = dstwin(&args);
    assert!(o.status.success(), "{}", err(&o));
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(
        s.contains("SLO every request TTFT <= 5000 ms; over each run's window TPOT p90 <= 45 ms"),
        "{s}"
    );
    assert!(s.contains("TPOT p90 ms"), "{s}");
    assert!(s.contains("over its SLO (45 ms)"), "{s}");
    args.push("--json");
    let v: Value = serde_json::from_str(&String::from_utf8_lossy(&dstwin(&args).stdout)).unwrap();
    let best = &v["layouts"][0];
    assert_eq!(best["standing"], "best");
    let p90 = f(&best["percentiles_ms"][0]["max"]);
    assert!(p90 > 0.0 && p90 <= 45.0, "{best}");
    let lost: Vec<&Value> = v["layouts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| {
            l["loses_because"]["detail"]
                .as_str()
                .is_some_and(|d| d.contains("TPOT p90"))
        })
        .collect();
    assert!(!lost.is_empty());
    // Each is over the bound at the load it is reported at, with no goodput there.
    for l in lost {
        let level = l["levels"]
            .as_array()
            .unwrap()
            .iter()
            .find(|lv| lv["load"] == l["load"])
            .unwrap();
        for r in level["runs"].as_array().unwrap() {
            assert!(f(&r["percentiles_ms"][0]) > 45.0, "{r}");
            assert_eq!(
                (&r["percentiles_met"], f(&r["goodput_per_card"])),
                (&Value::Bool(false), 0.0)
            );
        }
    }
    for (slo, says) in [
        ("ttft_p100=1s", "--slo ttft_p100=1s: percentile '100'"),
        ("e2e_p90=1s", "unknown metric 'e2e'"),
    ] {
        let o = dstwin(&["plan", "--slo", slo, "-q"]);
        assert_eq!(o.status.code(), Some(2));
        assert!(err(&o).contains(says), "{}", err(&o));
    }
}

/// `--engine sglang` plans the same layouts as SGLang runs them and prints SGLang's commands
/// (and its PD router); one node plans aggregated layouts only; an unknown engine exits 2
/// naming the value and the choices.
#[test]
fn plan_runs_and_launches_as_the_engine_does() {
    let mut args: Vec<&str> = SMALL.to_vec();
    args.extend(["--engine", "sglang", "--top", "1", "--seeds", "2", "-q"]);
    let o = dstwin(&args);
    assert!(o.status.success(), "{}", err(&o));
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains(") with SGLang (Ascend NPU), SLO"), "{s}");
    assert!(s.contains("python3 -m sglang.launch_server"), "{s}");
    assert!(s.contains("--device npu"), "{s}");
    assert!(!s.contains("vllm serve"), "{s}");
    args.push("--json");
    let v: Value = serde_json::from_str(&String::from_utf8_lossy(&dstwin(&args).stdout)).unwrap();
    assert_eq!(v["engine"], "sglang_npu");
    let kinds: Vec<&str> = v["layouts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["candidate"]["kind"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"aggregated") && kinds.contains(&"disaggregated"));
    // One A3 node: aggregated layouts only, each launched as one mixed instance.
    let mut one: Vec<&str> = SMALL.to_vec();
    one[6] = "8";
    one.extend(["--top", "1", "--seeds", "2", "-q", "--json"]);
    let o = dstwin(&one);
    assert!(o.status.success(), "{}", err(&o));
    let v: Value = serde_json::from_str(&String::from_utf8_lossy(&o.stdout)).unwrap();
    assert_eq!(v["engine"], "vllm_ascend");
    let layouts = v["layouts"].as_array().unwrap();
    // 4 attention TPs x 2 token budgets x 0 or 32 redundant experts, at 4 MTP depths.
    assert_eq!(layouts.len(), 16 * 4);
    assert!(layouts
        .iter()
        .all(|l| l["candidate"]["kind"] == "aggregated" && l["candidate"]["decode_nodes"] == 1));
    let o = dstwin(&["plan", "--engine", "trt", "-q"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        err(&o).contains("--engine trt: unknown engine"),
        "{}",
        err(&o)
    );
}
