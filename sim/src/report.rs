//! Human-readable rendering of reports.

use dstwin_core::eplb::Policy as EplbPolicy;
use dstwin_twin::explain::Explain;
use std::fmt::Write;

fn gb(b: f64) -> String {
    format!("{:.2} GB", b / 1e9)
}

/// Renders `explain` as text tables.
pub fn render_explain(e: &Explain) -> String {
    let mut s = String::new();
    let p = &e.plan;
    let _ = writeln!(
        s,
        "{} {} (KV {}) on {} ({})",
        e.model, e.quant, e.kv_dtype, e.system, e.chip
    );
    let _ = writeln!(
        s,
        "model: {:.2}B parameters, {:.2}B active per token (MTP module not counted)",
        e.params_total as f64 / 1e9,
        e.params_active as f64 / 1e9
    );
    let experts = if p.moe_tp > 1 {
        format!(
            "MoE TP{} (every die holds a 1/{} slice of all {} experts)",
            p.moe_tp, p.moe_tp, p.slots_per_die
        )
    } else {
        format!(
            "EP{} ({} routed-expert dies x {} slots, {} redundant, {} shared-expert dies)",
            p.ep, p.routed_dies, p.slots_per_die, p.redundant_experts, p.shared_expert_dies
        )
    };
    let _ = writeln!(
        s,
        "{} instance: {} dies, DP{} x TP{}, {experts}, dense TP{}",
        p.role.name(),
        p.dies,
        p.dp,
        p.tp,
        p.dense_tp
    );
    let b = &e.batch;
    let _ = writeln!(
        s,
        "batch per DP rank: {} decode seqs at KV {} ({} tokens with MTP {}), {} prompt tokens in prompts of {}; MoE imbalance {:.2}",
        b.decode_seqs,
        b.kv_len,
        e.shape.decode_tokens,
        e.mtp.tokens,
        b.prefill_tokens,
        b.prompt_len,
        e.moe_imbalance
    );
    let _ = writeln!(s);
    let _ = writeln!(s, "step time          {:>9.3} ms", e.step_ms);
    if let Some(l) = e.eager_launch_ms {
        let _ = writeln!(
            s,
            "  eager launches   {:>9.3} ms  (no captured graph: kernels launched one by one; the step takes at least this)",
            l
        );
    }
    let _ = writeln!(
        s,
        "  serial           {:>9.3} ms  (compute {:.3} + communication {:.3})",
        e.serial_step_ms, e.compute_ms, e.comm_ms
    );
    if let Some(g) = e.draft_launch_gap_ms {
        let _ = writeln!(
            s,
            "  eager MTP drafter{:>9.3} ms  of launches beyond its kernels, in the serial step (mtp_enforce_eager)",
            g
        );
    }
    if e.shared_expert_overlap_ms > 0.0 {
        let _ = writeln!(
            s,
            "  shared expert    {:>9.3} ms  hidden under dispatch/combine (second stream)",
            e.shared_expert_overlap_ms
        );
    }
    let _ = writeln!(
        s,
        "  two micro-batches{:>9.3} ms  ({:+.1}% throughput vs serial; {}: {})",
        e.two_microbatch_step_ms,
        e.two_microbatch_gain * 100.0,
        e.features.two_microbatch.name(),
        if e.two_microbatch_used {
            "used"
        } else {
            "not used"
        }
    );
    let padding = match e.padded_tokens {
        Some(p) => format!("decode graph padded to {p} tokens per rank"),
        None => "eager".to_string(),
    };
    let _ = writeln!(
        s,
        "  engine           MoE comm {}, {}{}{}",
        if p.moe_tp > 1 {
            "all-reduce (tensor parallel)"
        } else {
            e.moe_comm.name()
        },
        padding,
        if e.features.mlapo { ", MLAPO" } else { "" },
        if e.features.flashcomm1 {
            ", FLASHCOMM1"
        } else {
            ""
        }
    );
    let _ = writeln!(s, "  roofline limit   {:>9.3} ms  (all compute at 100% of peak, no overhead, no communication)", e.roofline_ms);
    for c in &e.caveats {
        let _ = writeln!(s, "caveat: {c}");
    }
    if let Some(m) = &e.moe {
        let _ = writeln!(
            s,
            "MoE imbalance      {:>9.2} x  (hottest routed die over the mean: placed {:.2}, layers {:.2} .. {:.2}, + {:.2} per-batch fluctuation of {:.0} requests, {:.0} tokens): +{:.3} ms over perfect balance",
            e.moe_imbalance,
            m.placed_imbalance,
            m.imbalance_min,
            m.imbalance_max,
            m.fluctuation,
            m.requests_per_step,
            m.tokens_per_step,
            m.imbalance_cost_ms
        );
        let placed = match (m.policy, m.redundant_experts) {
            (EplbPolicy::Identity, 0) => "placed contiguously (identity: no EPLB)".to_string(),
            (EplbPolicy::Identity, r) => {
                format!("placed contiguously (identity), {r} redundant experts")
            }
            (p, r) => format!("placed by {p} EPLB with {r} redundant experts"),
        };
        let _ = writeln!(s, "  expert load      {}; {placed}", m.load.summary());
    } else if e.moe_imbalance == 1.0 {
        let _ = writeln!(
            s,
            "MoE imbalance      {:>9.2} x  (perfect expert balance assumed; --skew prices the fitted expert load)",
            e.moe_imbalance
        );
    } else {
        let _ = writeln!(
            s,
            "MoE imbalance      {:>9.2} x  (given: hottest routed die over the mean)",
            e.moe_imbalance
        );
    }
    let t = &e.throughput;
    if let Some(tpot) = t.tpot_ms {
        let _ = writeln!(
            s,
            "TPOT               {:>9.2} ms  ({:.2} tokens per sequence per step)",
            tpot, t.tokens_per_seq_step
        );
        let _ = writeln!(
            s,
            "output tokens/s    {:>9.0} per die, {:.0} per package (card)",
            t.output_tok_s_per_die, t.output_tok_s_per_package
        );
    }
    if t.input_tok_s_per_die > 0.0 {
        let _ = writeln!(
            s,
            "input tokens/s     {:>9.0} per die, {:.0} per package (card)",
            t.input_tok_s_per_die, t.input_tok_s_per_package
        );
    }
    let _ = writeln!(s);
    let share = |v: f64| 100.0 * v / e.serial_step_ms;
    let _ = writeln!(s, "{:<16} {:>10} {:>7}", "by op class", "ms", "share");
    for (k, v) in &e.by_class_ms {
        let _ = writeln!(s, "{:<16} {:>10.3} {:>6.1}%", k, v, share(*v));
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "{:<16} {:>10} {:>7}", "by layer type", "ms", "share");
    for (k, v) in &e.by_layer_ms {
        let _ = writeln!(s, "{:<16} {:>10.3} {:>6.1}%", k, v, share(*v));
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "{:<16} {:>10} {:>7}", "bound by", "ms", "share");
    for (k, v) in &e.by_bound_ms {
        let _ = writeln!(s, "{:<16} {:>10.3} {:>6.1}%", k, v, share(*v));
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<18} {:<10} {:<15} {:>6} {:>10} {:>10} {:<13}",
        "op", "layer", "dies", "x", "us each", "ms total", "bound"
    );
    for o in &e.step.ops {
        let dies = match o.dies {
            dstwin_core::opgraph::DieSet::All => "all",
            dstwin_core::opgraph::DieSet::RoutedExperts => "routed experts",
            dstwin_core::opgraph::DieSet::SharedExperts => "shared experts",
        };
        let _ = writeln!(
            s,
            "{:<18} {:<10} {:<15} {:>6} {:>10.2} {:>10.3} {:<13}",
            o.name,
            o.layer.name(),
            dies,
            o.repeat,
            o.time_s * 1e6,
            o.total_s * 1e3,
            o.bound.name()
        );
    }
    let m = &e.memory;
    let _ = writeln!(s);
    let _ = writeln!(s, "memory per die ({} HBM)", gb(m.hbm));
    for (k, v) in [
        ("runtime reserve", m.reserved),
        ("attention weights", m.attention_weights),
        ("dense FFN weights", m.dense_ffn_weights),
        ("embedding + LM head", m.embedding_weights),
        ("routed experts", m.routed_expert_weights),
        ("shared expert", m.shared_expert_weights),
        ("routers, norms, other", m.other_weights),
        ("workspace", m.workspace),
        ("KV cache", m.kv_cache),
    ] {
        let _ = writeln!(s, "  {:<22} {:>10}", k, gb(v));
    }
    let _ = writeln!(
        s,
        "  KV capacity            {} tokens ({:.1} KB per token)",
        m.kv_capacity_tokens,
        m.kv_bytes_per_token / 1e3
    );
    s
}

use crate::run::{RequestRow, SimReport, Span};

fn pct_row(s: &mut String, name: &str, p: &crate::metrics::Percentiles) {
    let _ = writeln!(
        s,
        "  {:<14} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
        name, p.mean, p.p50, p.p90, p.p99, p.max
    );
}

/// Renders a simulation report as text tables.
pub fn render_sim(r: &SimReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "scenario {} (hash {}, seed {}): {} {} on {}, {} dies = {:.0} cards",
        r.scenario, r.scenario_hash, r.seed, r.model, r.quant, r.hardware, r.dies, r.cards
    );
    let _ = writeln!(
        s,
        "simulated {:.1} s: {} requests arrived, {} finished, {} rejected (longer than max_model_len), {} unfinished",
        r.simulated_s, r.requests_arrived, r.requests_finished, r.requests_rejected, r.requests_unfinished
    );
    if r.warmup_s > 0.0 {
        let _ = writeln!(
            s,
            "warm-up     the first {:.1} s are left out: latencies of requests that arrived in it, tokens and steps in it",
            r.warmup_s
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "throughput  {:.2} req/s, input {:.0} tok/s, output {:.0} tok/s",
        r.request_throughput, r.input_tok_s, r.output_tok_s
    );
    let _ = writeln!(
        s,
        "per card    input {:.1} tok/s, output {:.1} tok/s (all {:.0} cards, prefill and decode)",
        r.input_tok_s_per_card, r.output_tok_s_per_card, r.cards
    );
    let _ = writeln!(
        s,
        "goodput     {:.2} req/s meeting every SLO ({:.1}% of finished requests)",
        r.goodput,
        r.slo_attainment * 100.0
    );
    let _ = writeln!(
        s,
        "prefix hits {:.1}%, preemptions {}, sent back to prefill {}, KV transfers {} ({:.1} GB)",
        r.prefix_hit_rate * 100.0,
        r.preemptions,
        r.sent_back,
        r.kv_transfers,
        r.kv_transfer_gb
    );
    let el = &r.expert_load;
    // How each instance's experts were placed; one phrase when they all were alike.
    let placed = |i: &crate::run::InstanceReport| match (&i.placement_file, i.eplb_policy) {
        (Some(f), _) => format!("from its placement file {f}"),
        (None, EplbPolicy::Identity) if i.redundant_experts == 0 && !el.eplb_dynamic => {
            "contiguously (identity: no EPLB)".to_string()
        }
        (None, EplbPolicy::Identity) => "contiguously (identity)".to_string(),
        (None, p) => format!("by {p} EPLB on the mean load at the start"),
    };
    let mut how: Vec<(String, String)> = Vec::new();
    for i in &r.instances {
        let kind = i.name.split('[').next().unwrap_or(&i.name).to_string();
        if !how.iter().any(|(k, _)| *k == kind) {
            how.push((kind, placed(i)));
        }
    }
    let placement = if how.windows(2).all(|w| w[0].1 == w[1].1) {
        how.first().map(|(_, p)| p.clone()).unwrap_or_default()
    } else {
        let each: Vec<String> = how.iter().map(|(k, p)| format!("{k} {p}")).collect();
        format!("per instance: {}", each.join("; "))
    };
    let _ = writeln!(
        s,
        "expert load {}; experts placed {placement}{}",
        el.load.summary(),
        if el.eplb_dynamic {
            ", every instance re-placed by the dynamic cycle"
        } else {
            ""
        }
    );
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "  {:<14} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "latency (ms)", "mean", "p50", "p90", "p99", "max"
    );
    let l = &r.latency;
    pct_row(&mut s, "TTFT", &l.ttft_ms);
    pct_row(&mut s, "TPOT", &l.tpot_ms);
    pct_row(&mut s, "ITL", &l.itl_ms);
    pct_row(&mut s, "E2E", &l.e2e_ms);
    pct_row(&mut s, "queueing", &l.queue_ms);
    pct_row(&mut s, "KV transfer", &l.kv_transfer_ms);
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "  {:<14} {:<8} {:>5} {:>9} {:>6} {:>9} {:>9} {:>8} {:>8} {:>8} {:>6} {:>7} {:>6}  top op classes",
        "instance",
        "role",
        "dies",
        "steps",
        "util",
        "step ms",
        "tok/step",
        "KV mean",
        "KV max",
        "preempt",
        "redun",
        "placed",
        "MoE x"
    );
    for i in &r.instances {
        let mut top: Vec<_> = i.time_share.iter().collect();
        top.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
        let top: Vec<String> = top
            .iter()
            .take(3)
            .map(|(k, v)| format!("{k} {:.0}%", *v * 100.0))
            .collect();
        let _ = writeln!(
            s,
            "  {:<14} {:<8} {:>5} {:>9} {:>5.0}% {:>9.2} {:>9.1} {:>7.1}% {:>7.1}% {:>8} {:>6} {:>7.2} {:>6.2}  {}",
            i.name,
            i.role.name(),
            i.dies,
            i.steps,
            i.utilization * 100.0,
            i.mean_step_ms,
            i.mean_tokens_per_step,
            i.kv_usage_mean * 100.0,
            i.kv_usage_max * 100.0,
            i.preemptions,
            i.redundant_experts,
            i.placed_imbalance,
            i.moe_imbalance,
            top.join(", ")
        );
    }
    s
}

/// CSV of the report's headline metrics: one header line, one row.
pub fn sim_csv(r: &SimReport) -> String {
    let l = &r.latency;
    let cols: Vec<(&str, String)> = vec![
        ("scenario", r.scenario.clone()),
        ("scenario_hash", r.scenario_hash.clone()),
        ("seed", r.seed.to_string()),
        ("simulated_s", format!("{:.6}", r.simulated_s)),
        ("requests_finished", r.requests_finished.to_string()),
        ("requests_rejected", r.requests_rejected.to_string()),
        ("requests_unfinished", r.requests_unfinished.to_string()),
        ("request_throughput", format!("{:.6}", r.request_throughput)),
        ("input_tok_s", format!("{:.3}", r.input_tok_s)),
        ("output_tok_s", format!("{:.3}", r.output_tok_s)),
        (
            "input_tok_s_per_card",
            format!("{:.3}", r.input_tok_s_per_card),
        ),
        (
            "output_tok_s_per_card",
            format!("{:.3}", r.output_tok_s_per_card),
        ),
        ("goodput", format!("{:.6}", r.goodput)),
        ("slo_attainment", format!("{:.6}", r.slo_attainment)),
        ("ttft_p50_ms", format!("{:.3}", l.ttft_ms.p50)),
        ("ttft_p90_ms", format!("{:.3}", l.ttft_ms.p90)),
        ("ttft_p99_ms", format!("{:.3}", l.ttft_ms.p99)),
        ("tpot_p50_ms", format!("{:.3}", l.tpot_ms.p50)),
        ("tpot_p90_ms", format!("{:.3}", l.tpot_ms.p90)),
        ("tpot_p99_ms", format!("{:.3}", l.tpot_ms.p99)),
        ("itl_p50_ms", format!("{:.3}", l.itl_ms.p50)),
        ("itl_p99_ms", format!("{:.3}", l.itl_ms.p99)),
        ("e2e_p50_ms", format!("{:.3}", l.e2e_ms.p50)),
        ("e2e_p99_ms", format!("{:.3}", l.e2e_ms.p99)),
        ("queue_p50_ms", format!("{:.3}", l.queue_ms.p50)),
        ("preemptions", r.preemptions.to_string()),
        ("prefix_hit_rate", format!("{:.6}", r.prefix_hit_rate)),
    ];
    let head: Vec<&str> = cols.iter().map(|c| c.0).collect();
    let row: Vec<String> = cols.iter().map(|c| csv_field(&c.1)).collect();
    format!("{}\n{}\n", head.join(","), row.join(","))
}

fn csv_field(v: &str) -> String {
    if v.contains([',', '"', '\n']) {
        format!("\"{}\"", v.replace('"', "\"\""))
    } else {
        v.to_string()
    }
}

/// Writes one CSV row per finished request.
pub fn write_requests_csv<W: std::io::Write>(rows: &[RequestRow], w: W) -> Result<(), csv::Error> {
    let mut wr = csv::Writer::from_writer(w);
    for r in rows {
        wr.serialize(r)?;
    }
    wr.flush()?;
    Ok(())
}

/// A chrome-trace (Perfetto) JSON document of steps and KV transfers.
pub fn chrome_trace(spans: &[Span]) -> serde_json::Value {
    chrome_trace_events(spans)
}

/// Checks a Trace Event Format document as Perfetto and chrome://tracing read it: every event
/// has a name and a known phase; complete events (`X`) have a process, a track, a start and a
/// non-negative duration; and on each track complete events either nest or do not overlap
/// (a viewer draws overlapping ones on top of each other). Times are in microseconds; overlaps
/// under a nanosecond are rounding.
pub fn check_trace(v: &serde_json::Value) -> Result<(), String> {
    let events = v["traceEvents"].as_array().ok_or("no traceEvents array")?;
    /// Start, end and name of a complete event.
    type Extent = (f64, f64, String);
    let mut tracks: std::collections::BTreeMap<(i64, i64), Vec<Extent>> =
        std::collections::BTreeMap::new();
    for (i, e) in events.iter().enumerate() {
        let name = e["name"].as_str().ok_or(format!("event {i}: no name"))?;
        match e["ph"].as_str() {
            Some("X") => {
                let pid = e["pid"]
                    .as_i64()
                    .ok_or(format!("event {i} ({name}): no pid"))?;
                let tid = e["tid"]
                    .as_i64()
                    .ok_or(format!("event {i} ({name}): no tid"))?;
                let ts = e["ts"]
                    .as_f64()
                    .ok_or(format!("event {i} ({name}): no ts"))?;
                let dur = e["dur"]
                    .as_f64()
                    .ok_or(format!("event {i} ({name}): no dur"))?;
                if !(ts.is_finite() && dur.is_finite() && dur >= 0.0) {
                    return Err(format!("event {i} ({name}): ts {ts}, dur {dur}"));
                }
                tracks
                    .entry((pid, tid))
                    .or_default()
                    .push((ts, ts + dur, name.to_string()));
            }
            Some("M") => {
                if e["args"]["name"].as_str().is_none() {
                    return Err(format!("metadata event {i} ({name}): no args.name"));
                }
            }
            Some("B" | "E" | "i" | "I" | "C") => {}
            other => return Err(format!("event {i} ({name}): unknown phase {other:?}")),
        }
    }
    const ROUNDING_US: f64 = 1e-3;
    for ((pid, tid), mut spans) in tracks {
        // Longer first at equal starts, so that a parent precedes the events it contains.
        spans.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut open: Vec<Extent> = Vec::new();
        for sp in spans {
            while open.last().is_some_and(|o| o.1 <= sp.0 + ROUNDING_US) {
                open.pop();
            }
            if let Some(o) = open.last() {
                if sp.1 > o.1 + ROUNDING_US {
                    return Err(format!(
                        "track {pid}/{tid}: '{}' [{:.3}, {:.3}] overlaps '{}' [{:.3}, {:.3}] without nesting",
                        sp.2, sp.0, sp.1, o.2, o.0, o.1
                    ));
                }
            }
            open.push(sp);
        }
    }
    Ok(())
}

fn chrome_trace_events(spans: &[Span]) -> serde_json::Value {
    let mut events = Vec::with_capacity(spans.len() + 16);
    let mut lanes = std::collections::BTreeMap::new();
    for sp in spans {
        lanes.entry(sp.lane).or_insert_with(|| sp.lane_name.clone());
        events.push(serde_json::json!({
            "name": sp.name,
            "ph": "X",
            "pid": 1,
            "tid": sp.lane,
            "ts": sp.start.0 as f64 / 1e3,
            "dur": sp.dur.0 as f64 / 1e3,
            "args": { "tokens": sp.tokens },
        }));
    }
    for (lane, name) in lanes {
        events.push(serde_json::json!({ "name": "thread_name", "ph": "M", "pid": 1, "tid": lane, "args": { "name": name } }));
    }
    events.push(serde_json::json!({ "name": "process_name", "ph": "M", "pid": 1, "args": { "name": "dstwin simulation" } }));
    serde_json::json!({ "traceEvents": events, "displayTimeUnit": "ms" })
}

#[cfg(test)]
mod trace_tests {
    use super::*;
    use dstwin_core::time::{SimDuration, SimTime};

    fn span(lane: u32, start: u64, dur: u64) -> Span {
        Span {
            name: format!("s{start}"),
            lane,
            lane_name: format!("lane {lane}"),
            start: SimTime(start),
            dur: SimDuration(dur),
            tokens: 0,
        }
    }

    #[test]
    fn back_to_back_and_nested_spans_pass_overlaps_fail() {
        let ok = chrome_trace(&[span(0, 0, 1000), span(0, 1000, 500), span(1, 0, 5000)]);
        assert_eq!(check_trace(&ok), Ok(()));
        let bad = chrome_trace(&[span(0, 0, 1000), span(0, 500, 1000)]);
        assert!(check_trace(&bad).unwrap_err().contains("overlaps"));
    }
}
