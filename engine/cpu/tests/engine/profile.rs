//! The op trace: every op the engine runs is an event named as the op graph names it, with its
//! class, layer, step and shape, inside the event of its whole step.

use crate::common::*;
use crate::serving::{prompts, serve_on, shared, Experts, Layout, BASE};
use dstwin_core::deploy::EplbSpec;
use dstwin_core::device::SamplingParams;
use dstwin_core::eplb::cycle::{CycleConfig, Rebalancer};
use dstwin_core::eplb::{place, EpLayout, Policy};
use dstwin_core::opgraph::vocabulary;
use dstwin_cpu::TraceSink;
use serde_json::Value;
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};

/// Serves the test prompts on `l` with every device tracing into one file; returns the trace,
/// the steps executed and the steps that moved experts.
fn traced(l: Layout, experts: &Experts, tag: &str) -> (Value, u64, u64) {
    let dir = temp_dir(tag);
    let path = dir.join("trace.json");
    let sink = TraceSink::create(&path).unwrap();
    let pid = Cell::new(0);
    let mut steps = 0;
    let served = serve_on(
        l,
        &prompts(),
        &[0, 0, 0],
        10,
        &SamplingParams::greedy(),
        experts,
        |d| {
            pid.set(pid.get() + 1);
            d.with_profile(sink.clone(), pid.get() - 1, "engine")
        },
        |_, _, _| steps += 1,
    );
    sink.flush();
    assert!(sink.error().is_none());
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (
        serde_json::from_str(&text).unwrap(),
        steps,
        served.move_steps,
    )
}

/// Checks the trace's structure; returns op name -> events.
fn check(trace: &Value, ranks: u64, mtp: u32, steps: u64) -> BTreeMap<String, Vec<Value>> {
    let model = shared();
    let vocab = vocabulary(&model.cfg.model, ranks as u32, mtp);
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    let xs: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    // One step event per step executed, on the track after the ranks'.
    let step_events: Vec<&Value> = xs.iter().copied().filter(|e| e["name"] == "step").collect();
    assert_eq!(step_events.len() as u64, steps);
    let mut step_at: BTreeMap<(u64, u64), (f64, f64)> = BTreeMap::new();
    for s in &step_events {
        assert_eq!(s["tid"].as_u64(), Some(ranks));
        let key = (
            s["pid"].as_u64().unwrap(),
            s["args"]["step"].as_u64().unwrap(),
        );
        let ts = s["ts"].as_f64().unwrap();
        step_at.insert(key, (ts, ts + s["dur"].as_f64().unwrap()));
    }
    let mut ops: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut busy: BTreeMap<(u64, u64, u64), f64> = BTreeMap::new();
    for e in xs
        .iter()
        .filter(|e| e["name"] != "step" && e["name"] != "eplb_move")
    {
        let name = e["name"].as_str().unwrap();
        let a = &e["args"];
        let class = vocab
            .get(name)
            .unwrap_or_else(|| panic!("'{name}' is not an op of the op graph"));
        assert_eq!(a["class"], *class, "{name}");
        assert_eq!(e["cat"], *class, "{name}");
        let tid = e["tid"].as_u64().unwrap();
        assert!(tid < ranks, "{name} on track {tid}");
        let pid = e["pid"].as_u64().unwrap();
        let step = a["step"].as_u64().unwrap();
        let (t0, t1) = step_at[&(pid, step)];
        let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
        assert!(dur >= 0.0);
        assert!(
            ts >= t0 - 0.002 && ts + dur <= t1 + 0.002,
            "{name} [{ts}, {}] outside its step [{t0}, {t1}]",
            ts + dur
        );
        *busy.entry((pid, step, tid)).or_default() += dur;
        let part = a["part"].as_str().unwrap();
        if ["attention", "dense_ffn", "moe", "mtp"].contains(&part) {
            let layer = a["layer"].as_u64().expect("a layer op names its layer");
            assert!(
                (layer as usize) < model.cfg.cache_layers(),
                "{name}: layer {layer}"
            );
        }
        ops.entry(name.to_string()).or_default().push((*e).clone());
    }
    // Ops of one rank run one after another within their step.
    for ((pid, step, tid), b) in busy {
        let (t0, t1) = step_at[&(pid, step)];
        assert!(
            b <= t1 - t0 + 0.01,
            "rank {tid} busy {b} us in a step of {} us",
            t1 - t0
        );
    }
    ops
}

#[test]
fn every_op_is_traced_by_its_op_graph_name_inside_its_step() {
    // EP2 with MTP, redundant experts and a dynamic rebalance.
    let l = Layout {
        dp: 2,
        spec: 1,
        ..BASE
    };
    let layers = shared().moe_layers().len();
    let lay = EpLayout {
        slots: 18,
        dies: 2,
        dies_per_node: 2,
        groups: 4,
    };
    let start = place(Policy::Identity, &vec![vec![0.0; 16]; layers], &lay).unwrap();
    let experts = Experts {
        placement: Some(start.clone()),
        eplb: Some(EplbSpec {
            rebalancer: Rebalancer::new(
                CycleConfig {
                    heat_interval: 3,
                    algorithm_interval: 0,
                    policy: Policy::Greedy,
                },
                lay,
                layers,
                16,
            ),
            placement: start,
            top_k: 4.0,
            shares: None,
        }),
    };
    let (trace, steps, moves) = traced(l, &experts, "profile-ep");
    let ops = check(&trace, 2, 1, steps);
    let names: BTreeSet<&str> = ops.keys().map(String::as_str).collect();
    for want in [
        "embed",
        "attn_norm",
        "q_a_proj",
        "q_b_proj",
        "kv_a_proj",
        "kv_b_proj",
        "attn_prefill",
        "q_absorb",
        "attn_decode",
        "v_absorb",
        "o_proj",
        "ffn_norm",
        "ffn_gate_up",
        "ffn_act",
        "ffn_down",
        "router",
        "router_topk",
        "dispatch",
        "experts",
        "combine",
        "shared_expert",
        "final_norm",
        "lm_head",
        "sample",
        "mtp_eh_proj",
    ] {
        assert!(names.contains(want), "no '{want}' in {names:?}");
    }
    // Shapes: an experts event lists the rows of each of its rank's 9 slots.
    for e in &ops["experts"] {
        let rows = e["args"]["rows_per_expert"].as_array().unwrap();
        assert_eq!(rows.len(), 9);
        let sum: u64 = rows.iter().map(|r| r.as_u64().unwrap()).sum();
        assert_eq!(e["args"]["tokens"].as_u64(), Some(sum));
    }
    // Every routed row dispatched is combined back: per step and layer, rows sent = rows
    // received.
    let mut sent: BTreeMap<(u64, u64), i64> = BTreeMap::new();
    for (name, sign) in [("dispatch", 1), ("combine", -1)] {
        for e in &ops[name] {
            let key = (
                e["args"]["step"].as_u64().unwrap(),
                e["args"]["layer"].as_u64().unwrap(),
            );
            *sent.entry(key).or_default() += sign * e["args"]["rows"].as_i64().unwrap();
        }
    }
    assert!(sent.values().all(|&v| v == 0), "{sent:?}");
    // Attention events carry their sequence's context.
    for e in ops["attn_decode"].iter().chain(&ops["attn_prefill"]) {
        assert!(e["args"]["context"].as_u64().unwrap() >= e["args"]["tokens"].as_u64().unwrap());
    }
    // The rebalance shows on the step track.
    let moved = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "eplb_move")
        .count() as u64;
    assert!(
        moves > 0 && moved == moves,
        "{moved} move events, {moves} moves"
    );
}

#[test]
fn one_rank_has_no_dispatch_and_pd_instances_are_processes() {
    let l = Layout { pd: true, ..BASE };
    let (trace, steps, _) = traced(l, &Experts::default(), "profile-pd");
    let ops = check(&trace, 1, 0, steps);
    assert!(!ops.contains_key("dispatch") && !ops.contains_key("combine"));
    assert!(ops.contains_key("experts"));
    let pids: BTreeSet<u64> = ops
        .values()
        .flatten()
        .map(|e| e["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(pids, BTreeSet::from([0, 1]), "prefill and decode instance");
    let names: Vec<&Value> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .collect();
    assert_eq!(names.len(), 2);
}
