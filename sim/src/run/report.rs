//! What a run reports: the deterministic report (`--json`), per-request rows and timeline spans,
//! built from the plain statistics the driver counted ([`RunStats`]).

use crate::metrics::LatencyReport;
use crate::scenario::Scenario;
use dstwin_core::device::{ClassTimes, ReqId, CLASS_NAMES};
use dstwin_core::eplb::Policy as EplbPolicy;
use dstwin_core::instance::InstanceStats as CoreStats;
use dstwin_core::layout::Role;
use dstwin_core::time::{SimDuration, SimTime};
use dstwin_twin::expert_load::LoadAssumption;
use serde::Serialize;
use std::collections::BTreeMap;

/// One finished request.
#[derive(Clone, Debug, Serialize)]
pub struct RequestRow {
    pub id: ReqId,
    pub arrival_s: f64,
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub ttft_ms: f64,
    pub tpot_ms: f64,
    pub e2e_ms: f64,
    pub queue_ms: f64,
    pub preemptions: u32,
    pub prefill_instance: String,
    pub decode_instance: String,
    pub met_slo: bool,
}

/// One timeline span (chrome trace "X" event).
#[derive(Clone, Debug, Serialize)]
pub struct Span {
    pub name: String,
    /// Instance index, or the number of instances for KV links.
    pub lane: u32,
    pub lane_name: String,
    pub start: SimTime,
    pub dur: SimDuration,
    pub tokens: u64,
}

/// Per-instance results.
#[derive(Clone, Debug, Serialize)]
pub struct InstanceReport {
    pub name: String,
    pub index: u32,
    pub role: Role,
    pub dies: u32,
    pub steps: u64,
    /// Fraction of the run the instance spent stepping.
    pub utilization: f64,
    pub mean_step_ms: f64,
    pub mean_tokens_per_step: f64,
    /// Redundant routed-expert slots of the instance's placement.
    pub redundant_experts: u32,
    /// The EPLB policy that placed its experts at the start (the scenario's, else the engines'
    /// default for this instance), and the placement file it started from instead, if any.
    pub eplb_policy: EplbPolicy,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement_file: Option<String>,
    /// Hottest routed-expert die over the mean under the mean load, averaged over layers: the
    /// placement made at the start (1.0: perfect balance).
    pub placed_imbalance: f64,
    /// Hottest routed-expert die over the mean, averaged over layers and steps, with each
    /// step's per-batch fluctuation (1.0: perfect).
    pub moe_imbalance: f64,
    /// MoE layers whose experts EPLB moved, and the step time the moves added.
    pub eplb_layer_moves: u64,
    pub eplb_move_ms: f64,
    pub kv_usage_mean: f64,
    pub kv_usage_max: f64,
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    pub preemptions: u64,
    /// Share of step time by op class or collective.
    pub time_share: BTreeMap<&'static str, f64>,
}

/// What a run assumed about the routed-expert load: the load (kind, parameters, source), the
/// EPLB policy that placed it at the start, and whether it re-placed experts during the run.
#[derive(Clone, Debug, Serialize)]
pub struct ExpertLoadReport {
    #[serde(flatten)]
    pub load: LoadAssumption,
    /// The `[eplb] policy` the scenario gives (null: each instance has its engine's default,
    /// `instances[].eplb_policy`).
    pub eplb_policy: Option<EplbPolicy>,
    pub eplb_dynamic: bool,
}

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

/// The report of a run: deterministic (no wall-clock figures), serialized by `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct SimReport {
    pub scenario: String,
    pub scenario_hash: String,
    pub seed: u64,
    /// The draw of the steps' spread (`RunOptions::draw`; absent for the seed's own, 0).
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub draw: u64,
    pub model: String,
    pub quant: String,
    pub hardware: String,
    pub dies: u32,
    pub cards: f64,
    pub simulated_s: f64,
    /// Statistics leave out the first seconds (the scenario's `warmup_s`); rates are over
    /// `simulated_s - warmup_s`.
    pub warmup_s: f64,
    pub requests_arrived: u64,
    pub requests_finished: u64,
    /// Requests longer than max_model_len, refused like vLLM does (HTTP 400).
    pub requests_rejected: u64,
    pub requests_unfinished: u64,
    /// Prompt tokens whose prefill completed.
    pub input_tokens: u64,
    /// Tokens sampled by decode (or mixed) instances.
    pub output_tokens: u64,
    pub request_throughput: f64,
    pub input_tok_s: f64,
    pub output_tok_s: f64,
    /// Per card (package) of every instance, prefill and decode alike.
    pub input_tok_s_per_card: f64,
    pub output_tok_s_per_card: f64,
    /// Requests per second that met every SLO of the scenario.
    pub goodput: f64,
    pub slo_attainment: f64,
    pub latency: LatencyReport,
    pub preemptions: u64,
    pub sent_back: u64,
    pub prefix_hit_rate: f64,
    pub kv_transfers: u64,
    pub kv_transfer_gb: f64,
    /// What the run assumed about the routed-expert load and its placement.
    pub expert_load: ExpertLoadReport,
    pub instances: Vec<InstanceReport>,
    pub price_cache_hit_rate: f64,
    pub events: u64,
}

/// A run's outputs.
pub struct RunResult {
    pub report: SimReport,
    pub requests: Vec<RequestRow>,
    pub timeline: Vec<Span>,
    /// Every step's plan and duration (with `RunOptions::record_steps`).
    pub steps: Vec<dstwin_core::deploy::StepRecord>,
    /// Share of request-steps advanced in aggregate (a speed diagnostic, not in the report:
    /// the report is the same either way).
    pub steady_share: f64,
}

/// What one instance counted over a run: the plain numbers its report row is built from.
#[derive(Clone, Debug)]
pub struct InstanceStats {
    pub name: String,
    pub role: Role,
    pub dies: u32,
    pub redundant_experts: u32,
    pub eplb_policy: EplbPolicy,
    pub placement_file: Option<String>,
    pub steps: u64,
    /// Time its device was busy, nanoseconds.
    pub busy_ns: u64,
    pub tokens: u64,
    /// Device time by op class.
    pub class: ClassTimes,
    /// KV usage integrated over the measured time (seconds), and its peak.
    pub kv_weighted: f64,
    pub kv_max: f64,
    /// Sum over steps of the MoE imbalance each step ran with.
    pub imbalance_sum: f64,
    pub eplb_layer_moves: u64,
    pub eplb_move_s: f64,
    pub placed_imbalance: f64,
    /// The scheduler's counters.
    pub core: CoreStats,
    /// The price cache's hits and misses.
    pub price_hits: u64,
    pub price_misses: u64,
}

/// What a whole run counted: everything the report is built from, with the per-request rows,
/// timeline spans and step records it carries along.
#[derive(Clone, Debug)]
pub struct RunStats {
    /// Where the run ended, and the warm-up its rates leave out.
    pub now: SimTime,
    pub warmup: SimTime,
    pub draw: u64,
    pub arrived: u64,
    pub finished: u64,
    pub rejected: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Requests that arrived after the warm-up and finished, and those of them meeting every
    /// SLO.
    pub measured_finished: u64,
    pub good: u64,
    pub sent_back: u64,
    pub kv_transfers: u64,
    pub kv_bytes: f64,
    pub events: u64,
    pub latency: LatencyReport,
    pub instances: Vec<InstanceStats>,
    pub requests: Vec<RequestRow>,
    pub timeline: Vec<Span>,
    pub steps: Vec<dstwin_core::deploy::StepRecord>,
}

/// The report of scenario `s` from what its run counted.
pub fn report(s: &Scenario, stats: RunStats) -> RunResult {
    // Rates are over the measured time, after the warm-up.
    let secs = (stats.now.as_secs_f64() - stats.warmup.as_secs_f64()).max(1e-9);
    let cards = s.cards();
    let mut prefix_q = 0;
    let mut prefix_h = 0;
    let mut preempt = 0;
    let instances = stats
        .instances
        .iter()
        .enumerate()
        .map(|(k, i)| {
            let st = i.core;
            prefix_q += st.prefix_queries;
            prefix_h += st.prefix_hits;
            preempt += st.preemptions;
            let total: f64 = i.class.iter().sum();
            let time_share = CLASS_NAMES
                .iter()
                .zip(i.class.iter())
                .filter(|(_, v)| **v > 0.0)
                .map(|(n, v)| (*n, v / total.max(f64::MIN_POSITIVE)))
                .collect();
            let busy = i.busy_ns as f64 * 1e-9;
            InstanceReport {
                name: i.name.clone(),
                index: k as u32,
                role: i.role,
                dies: i.dies,
                steps: i.steps,
                utilization: busy / secs,
                mean_step_ms: if i.steps > 0 {
                    busy * 1e3 / i.steps as f64
                } else {
                    0.0
                },
                mean_tokens_per_step: if i.steps > 0 {
                    i.tokens as f64 / i.steps as f64
                } else {
                    0.0
                },
                eplb_layer_moves: i.eplb_layer_moves,
                eplb_move_ms: i.eplb_move_s * 1e3,
                redundant_experts: i.redundant_experts,
                eplb_policy: i.eplb_policy,
                placement_file: i.placement_file.clone(),
                placed_imbalance: i.placed_imbalance,
                moe_imbalance: if i.steps > 0 {
                    i.imbalance_sum / i.steps as f64
                } else {
                    1.0
                },
                kv_usage_mean: i.kv_weighted / secs,
                kv_usage_max: i.kv_max,
                prefix_queries: st.prefix_queries,
                prefix_hits: st.prefix_hits,
                preemptions: st.preemptions,
                time_share,
            }
        })
        .collect();
    let (hits, misses) = stats
        .instances
        .iter()
        .fold((0, 0), |(h, m), i| (h + i.price_hits, m + i.price_misses));
    let report = SimReport {
        scenario: s.name.clone(),
        scenario_hash: s.hash.clone(),
        seed: s.seed,
        draw: stats.draw,
        model: s.model.name.clone(),
        quant: s.quant.to_string(),
        hardware: s.system().name.clone(),
        dies: s.dies(),
        cards,
        simulated_s: stats.now.as_secs_f64(),
        warmup_s: stats.warmup.as_secs_f64(),
        requests_arrived: stats.arrived,
        requests_finished: stats.finished,
        requests_rejected: stats.rejected,
        requests_unfinished: stats.arrived - stats.finished - stats.rejected,
        input_tokens: stats.input_tokens,
        output_tokens: stats.output_tokens,
        request_throughput: stats.measured_finished as f64 / secs,
        input_tok_s: stats.input_tokens as f64 / secs,
        output_tok_s: stats.output_tokens as f64 / secs,
        input_tok_s_per_card: stats.input_tokens as f64 / secs / cards,
        output_tok_s_per_card: stats.output_tokens as f64 / secs / cards,
        goodput: stats.good as f64 / secs,
        slo_attainment: if stats.measured_finished > 0 {
            stats.good as f64 / stats.measured_finished as f64
        } else {
            0.0
        },
        latency: stats.latency,
        preemptions: preempt,
        sent_back: stats.sent_back,
        prefix_hit_rate: if prefix_q > 0 {
            prefix_h as f64 / prefix_q as f64
        } else {
            0.0
        },
        kv_transfers: stats.kv_transfers,
        kv_transfer_gb: stats.kv_bytes / 1e9,
        expert_load: ExpertLoadReport {
            load: s.expert_load.assumption(),
            eplb_policy: s.eplb.policy,
            eplb_dynamic: s.eplb.dynamic,
        },
        instances,
        price_cache_hit_rate: if hits + misses > 0 {
            hits as f64 / (hits + misses) as f64
        } else {
            0.0
        },
        events: stats.events,
    };
    let (steady, exact) = stats.instances.iter().fold((0, 0), |(a, b), i| {
        (a + i.core.steady_steps, b + i.core.exact_steps)
    });
    RunResult {
        report,
        requests: stats.requests,
        timeline: stats.timeline,
        steps: stats.steps,
        steady_share: steady as f64 / (steady + exact).max(1) as f64,
    }
}
