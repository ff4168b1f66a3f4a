//! `dstwin plan`: search PD deployments of a model on N cards for the best goodput per card
//! under SLOs, and print each winner's vllm-ascend launch arguments. IO-free: candidates are
//! scenario texts the caller simulates (in parallel) with [`screen`] and [`run_level`].
//!
//! The search space, per the vllm-ascend deployment guides: prefill instances of one node each
//! (DP x TP within the node, two-micro-batch overlap), one decode instance over the remaining
//! nodes (EP over all its dies); the split between them, prefill and decode TP, the decode
//! batch cap, redundant experts and MTP depth vary.
//!
//! Each candidate is first run closed-loop with every decode slot (DP ranks x batch cap) busy,
//! which measures its capacity in requests per second and its request lifetime; then open-loop
//! (Poisson) at 60% and 90% of that capacity. Every run leaves out a warm-up and measures a
//! steady window whose lengths are counted in the layout's own request lifetimes
//! ([`steady`]). All candidates run with the first seed; those within reach of the best run
//! with the others, and layouts whose goodput ranges over the seeds overlap are tied, never
//! ranked one below the other ([`rank`]).
//!
//! - [`steady`]: the steady-state rule: warm-up and window lengths, what a run measures.
//! - [`rank`]: spreads over seeds, screening, the tie rule and the reasons a layout loses.

pub mod rank;
pub mod steady;

pub use rank::{rank, to_seed, Level, Loss, Outcome, PlanReport, Spread, Standing, Summary};
pub use steady::{Generations, Measurement, Window};

use crate::run::{run, RequestRow, RunOptions, SimReport};
use crate::scenario::load_str;
use crate::sweep::one_line;
use dstwin_hwmodels::Catalog;
use serde::Serialize;
use std::path::Path;
use steady::{capacity, measure, RunSpan};

/// The dynamic EPLB cycle of planned layouts with redundant experts (vllm-ascend's defaults).
const EPLB_HEAT: u32 = 600;
const EPLB_ALGO: u32 = 50;

/// What to plan for.
#[derive(Clone, Debug)]
pub struct PlanInput {
    pub model: String,
    pub quant: String,
    pub hardware: String,
    pub cards: u32,
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// Every request's TTFT and TPOT at most this (a request over either does not count in
    /// goodput).
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    /// Percentile SLOs over each run's measured window (`--slo ttft_p90=2s`): a run whose
    /// percentile is over one has no goodput at that load.
    pub percentile_slos: Vec<PercentileSlo>,
    /// MTP acceptance per draft position.
    pub acceptance: Vec<f64>,
    /// The first seed; the others follow it.
    pub seed: u64,
    /// Seeds each layout within reach of the best runs with (at least 2: a spread needs two).
    pub seeds: u32,
}

/// The latency a percentile SLO bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SloMetric {
    Ttft,
    Tpot,
}

impl SloMetric {
    /// `TTFT` or `TPOT`, as reports name them.
    pub fn name(self) -> &'static str {
        match self {
            SloMetric::Ttft => "TTFT",
            SloMetric::Tpot => "TPOT",
        }
    }
}

/// A bound on one percentile of a latency over a run's measured window: `ttft_p90 <= 2000 ms`
/// holds when 90% of the window's requests had their first token within 2 s (TPOT over the
/// requests with more than one output token).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PercentileSlo {
    pub metric: SloMetric,
    /// The percentile, above 0 and below 100 (90 for p90, 99.9 for p99.9).
    pub percentile: f64,
    pub max_ms: f64,
}

impl PercentileSlo {
    /// `ttft_p90`, `tpot_p99.9`: the metric and percentile such a key names, or why not.
    pub fn parse_key(key: &str) -> Result<(SloMetric, f64), String> {
        let (metric, p) = key
            .split_once("_p")
            .ok_or_else(|| format!("'{key}' is not METRIC_pNN (e.g. ttft_p90)"))?;
        let metric = match metric {
            "ttft" => SloMetric::Ttft,
            "tpot" => SloMetric::Tpot,
            other => return Err(format!("unknown metric '{other}' (ttft or tpot)")),
        };
        match p.parse::<f64>() {
            Ok(x) if x > 0.0 && x < 100.0 => Ok((metric, x)),
            _ => Err(format!(
                "percentile '{p}' must be a number above 0 and below 100 (p50, p90, p99.9)"
            )),
        }
    }

    /// `TTFT p90`.
    pub fn label(&self) -> String {
        format!("{} p{}", self.metric.name(), self.percentile)
    }
}

impl PlanInput {
    /// The seeds, first to last: `seed`, `seed + 1`, ...
    pub fn seed_list(&self) -> Vec<u64> {
        (0..u64::from(self.seeds))
            .map(|k| self.seed.wrapping_add(k))
            .collect()
    }
}

/// One deployment to try.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Candidate {
    pub prefill_nodes: u32,
    pub decode_nodes: u32,
    pub prefill_tp: u32,
    pub decode_tp: u32,
    pub max_num_seqs: u32,
    pub redundant_experts: u32,
    pub mtp: u32,
}

/// The search space on `nodes` nodes of `dies_per_node` dies.
pub fn candidates(nodes: u32, dies_per_node: u32) -> Vec<Candidate> {
    let mut v = Vec::new();
    for prefill_nodes in 1..nodes {
        for prefill_tp in [8, 16] {
            if !dies_per_node.is_multiple_of(prefill_tp) {
                continue;
            }
            for decode_tp in [1, 2, 4] {
                for max_num_seqs in [16, 32, 48] {
                    for redundant_experts in [0, 32] {
                        for mtp in [0, 1, 2] {
                            v.push(Candidate {
                                prefill_nodes,
                                decode_nodes: nodes - prefill_nodes,
                                prefill_tp,
                                decode_tp,
                                max_num_seqs,
                                redundant_experts,
                                mtp,
                            });
                        }
                    }
                }
            }
        }
    }
    v
}

impl Candidate {
    /// A one-line description.
    pub fn label(&self) -> String {
        format!(
            "{}P{}D nodes, prefill TP{}, decode TP{} x{} seqs, {} redundant, MTP {}",
            self.prefill_nodes,
            self.decode_nodes,
            self.prefill_tp,
            self.decode_tp,
            self.max_num_seqs,
            self.redundant_experts,
            self.mtp
        )
    }

    /// Decode DP ranks x batch cap.
    pub fn decode_slots(&self, dies_per_node: u32) -> u32 {
        self.decode_nodes * dies_per_node / self.decode_tp * self.max_num_seqs
    }

    /// The scenario text of this candidate under `load` with `seed`.
    pub fn scenario(&self, p: &PlanInput, dies_per_node: u32, load: Load, seed: u64) -> String {
        let t = self.mtp;
        // No acceptance given: the scenario's default, the calibrated acceptance.
        let acc = if p.acceptance.is_empty() {
            String::new()
        } else {
            format!("acceptance = {:?}\n", p.acceptance)
        };
        let mtp = if t > 0 {
            format!("[mtp]\ntokens = {t}\n{acc}")
        } else {
            String::new()
        };
        let mut slo = String::from("[slo]\n");
        if let Some(x) = p.ttft_ms {
            slo += &format!("ttft_ms = {x}\n");
        }
        if let Some(x) = p.tpot_ms {
            slo += &format!("tpot_ms = {x}\n");
        }
        let max_len = u64::from(p.input_tokens) + u64::from(p.output_tokens) + 64;
        // Redundant experts are re-placed as vllm-ascend's dynamic EPLB does (the launch
        // arguments ask for the same cycle).
        let eplb = if self.redundant_experts > 0 {
            format!("[eplb]\ndynamic = true\nheat_interval = {EPLB_HEAT}\nalgorithm_interval = {EPLB_ALGO}\n")
        } else {
            String::new()
        };
        let window = match load {
            Load::Open { window, .. } => format!(
                "warmup_s = {}\nduration_s = {}\n",
                window.warmup_s,
                window.end_s()
            ),
            Load::Closed(_) => String::new(),
        };
        format!(
            r#"name = "plan"
seed = {seed}
model = "{model}"
quant = "{quant}"
hardware = "{hw}"
{window}{mtp}{eplb}
[[instance]]
name = "prefill"
role = "prefill"
count = {pn}
dies = {dpn}
tp = {ptp}
redundant_experts = {red}
two_microbatch = true
[instance.scheduler]
max_num_batched_tokens = 16384
max_num_seqs = 8
max_model_len = {max_len}
enable_prefix_caching = false

[[instance]]
name = "decode"
role = "decode"
dies = {dd}
tp = {dtp}
redundant_experts = {red}
[instance.scheduler]
max_num_batched_tokens = {budget}
max_num_seqs = {seqs}
max_model_len = {max_len}
enable_prefix_caching = false
preemption = "send_back"

[workload]
{load}
input = {{ dist = "fixed", value = {inp} }}
output = {{ dist = "fixed", value = {out} }}

{slo}"#,
            model = p.model,
            quant = p.quant,
            hw = p.hardware,
            pn = self.prefill_nodes,
            dpn = dies_per_node,
            ptp = self.prefill_tp,
            red = self.redundant_experts,
            dd = self.decode_nodes * dies_per_node,
            dtp = self.decode_tp,
            budget = self.max_num_seqs * (1 + t),
            seqs = self.max_num_seqs,
            load = match load {
                Load::Closed(g) => format!(
                    "kind = \"closed_loop\"\nconcurrency = {}\nnum_requests = {}",
                    g.concurrency,
                    g.requests()
                ),
                Load::Open { rate, window } => format!(
                    "kind = \"synthetic\"\nnum_requests = {}\narrival = {{ process = \"poisson\", rate = {rate} }}",
                    window.requests
                ),
            },
            inp = p.input_tokens,
            out = p.output_tokens,
        )
    }

    /// The `vllm serve` arguments of each instance, as vllm-ascend takes them, serving the
    /// model as `served` (its own name: a config.json's, not its path).
    pub fn launch_args(
        &self,
        p: &PlanInput,
        dies_per_node: u32,
        served: &str,
    ) -> Vec<(String, String)> {
        let pdp = dies_per_node / self.prefill_tp;
        let ddp = self.decode_nodes * dies_per_node / self.decode_tp;
        let quant = if p.quant == "bf16" {
            ""
        } else {
            " \\\n  --quantization ascend"
        };
        let spec = if self.mtp > 0 {
            format!(
                " \\\n  --speculative-config '{{\"num_speculative_tokens\": {}, \"method\": \"mtp\"}}'",
                self.mtp
            )
        } else {
            String::new()
        };
        let extra = format!(
            "{{\"prefill\": {{\"dp_size\": {pdp}, \"tp_size\": {}}}, \"decode\": {{\"dp_size\": {ddp}, \"tp_size\": {}}}}}",
            self.prefill_tp, self.decode_tp
        );
        let max_len = u64::from(p.input_tokens) + u64::from(p.output_tokens) + 64;
        let role = |name: &str,
                    kv_role: &str,
                    dp: u32,
                    tp: u32,
                    seqs: u32,
                    budget: u32,
                    eplb: &str| {
            (
                name.to_string(),
                format!(
                    "vllm serve ${{MODEL_PATH:?the {model} {q} weights}} \\\n  --served-model-name {model} \\\n  --data-parallel-size {dp} \\\n  --tensor-parallel-size {tp} \\\n  --enable-expert-parallel \\\n  --max-num-seqs {seqs} \\\n  --max-num-batched-tokens {budget} \\\n  --max-model-len {max_len} \\\n  --no-enable-prefix-caching{quant}{spec} \\\n  --additional-config '{{\"recompute_scheduler_enable\": true, \"eplb_config\": {eplb}}}' \\\n  --kv-transfer-config '{{\"kv_connector\": \"MooncakeConnectorV1\", \"kv_role\": \"{kv_role}\", \"kv_connector_extra_config\": {extra}}}'",
                    model = served,
                    q = p.quant,
                ),
            )
        };
        let eplb = |heat: u32, algo: u32| {
            if self.redundant_experts == 0 {
                return "{\"dynamic_eplb\": false}".to_string();
            }
            format!(
                "{{\"dynamic_eplb\": {}, \"expert_heat_collection_interval\": {heat}, \"algorithm_execution_interval\": {algo}, \"num_redundant_experts\": {}}}",
                self.redundant_experts > 0,
                self.redundant_experts
            )
        };
        vec![
            role(
                &format!("prefill (x{} instances, one node each)", self.prefill_nodes),
                "kv_producer",
                pdp,
                self.prefill_tp,
                8,
                16384,
                &eplb(EPLB_HEAT, EPLB_ALGO),
            ),
            role(
                &format!("decode ({} nodes)", self.decode_nodes),
                "kv_consumer",
                ddp,
                self.decode_tp,
                self.max_num_seqs,
                self.max_num_seqs * (1 + self.mtp),
                &eplb(EPLB_HEAT, EPLB_ALGO),
            ),
        ]
    }
}

/// The workload a candidate runs: a closed loop of generations with every decode slot busy,
/// or Poisson arrivals at a rate (requests per second) over a warm-up and a measured window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Load {
    Closed(Generations),
    Open { rate: f64, window: Window },
}

/// The dies of one node of `hardware`, and the nodes `cards` fill.
pub fn nodes(hardware: &str, cards: u32) -> Result<(u32, u32), String> {
    let sys = Catalog::builtin()
        .system(hardware)
        .map_err(|e| e.to_string())?;
    let per_node = sys.packages_per_node;
    if cards == 0 || !cards.is_multiple_of(per_node) {
        return Err(format!(
            "--cards {cards}: {hardware} has {per_node} cards per node; give a multiple"
        ));
    }
    let nodes = cards / per_node;
    if nodes > sys.max_nodes {
        return Err(format!(
            "--cards {cards}: {hardware} deployments span at most {} nodes ({} cards)",
            sys.max_nodes,
            u64::from(sys.max_nodes) * u64::from(per_node)
        ));
    }
    if nodes < 2 {
        return Err(format!(
            "--cards {cards}: PD disaggregation needs at least two nodes ({} cards)",
            2 * per_node
        ));
    }
    Ok((nodes, sys.dies_per_node()))
}

/// How the reason of a layout whose scenario validated but whose run failed begins.
pub const RUN_FAILED: &str = "run failed: ";

/// The load levels every candidate is measured at, as fractions of its capacity.
pub const LOADS: [f64; 2] = [0.6, 0.9];

fn simulate(
    p: &PlanInput,
    c: &Candidate,
    dies_per_node: u32,
    load: Load,
    seed: u64,
) -> Result<(SimReport, Vec<RequestRow>), String> {
    let text = c.scenario(p, dies_per_node, load, seed);
    let s = load_str("plan candidate", &text, Path::new("."), &[]).map_err(|e| one_line(&e))?;
    let opts = RunOptions {
        per_request: true,
        ..RunOptions::default()
    };
    run(&s, opts)
        .map(|r| (r.report, r.requests))
        .map_err(|e| format!("{RUN_FAILED}{}", one_line(&e)))
}

/// Screens a candidate with the first seed: measures its capacity and request lifetime with
/// every decode slot busy, then runs it open-loop at each of [`LOADS`].
pub fn screen(p: &PlanInput, c: &Candidate, dies_per_node: u32) -> Outcome {
    let g = Generations::new(c.decode_slots(dies_per_node));
    let cap = match simulate(p, c, dies_per_node, Load::Closed(g), p.seed) {
        Ok((_, rows)) => capacity(&rows, &g),
        Err(e) => return Outcome::failed(c.clone(), e),
    };
    let Some(cap) = cap.filter(|k| k.req_s > 0.0 && k.lifetime_s > 0.0) else {
        return Outcome::failed(
            c.clone(),
            format!("{RUN_FAILED}too few requests finished at full load to measure a capacity"),
        );
    };
    let mut o = Outcome::failed(c.clone(), String::new());
    o.standing = Standing::ScreenedOut;
    o.capacity_req_s = cap.req_s;
    o.lifetime_s = cap.lifetime_s;
    for f in LOADS {
        let rate = cap.req_s * f;
        let mut level = Level {
            load: f,
            rate_req_s: rate,
            window: Window::open_loop(cap.lifetime_s, rate),
            runs: Vec::new(),
        };
        match run_level(p, c, dies_per_node, &level, p.seed) {
            Ok((m, cards)) => {
                level.runs.push(m);
                o.cards = cards;
            }
            Err(e) => return Outcome::failed(c.clone(), e),
        }
        o.levels.push(level);
    }
    o.settle();
    o
}

/// Runs candidate `c` at `level` (its rate and window) with `seed`: the measurement and the
/// cards the layout occupies.
pub fn run_level(
    p: &PlanInput,
    c: &Candidate,
    dies_per_node: u32,
    level: &Level,
    seed: u64,
) -> Result<(Measurement, f64), String> {
    let load = Load::Open {
        rate: level.rate_req_s,
        window: level.window,
    };
    let (report, rows) = simulate(p, c, dies_per_node, load, seed)?;
    let m = measure(seed, RunSpan::of(&report), &rows, &p.percentile_slos);
    Ok((m, report.cards))
}

/// DeepSeek-R1 w8a8 on 32 A3 cards, 3.5K in / 1.5K out, TTFT 2 s and TPOT 50 ms, seeds 1-3.
#[cfg(test)]
pub(crate) fn test_input() -> PlanInput {
    PlanInput {
        model: "deepseek-r1".into(),
        quant: "w8a8".into(),
        hardware: "atlas-800-a3".into(),
        cards: 32,
        input_tokens: 3500,
        output_tokens: 1500,
        ttft_ms: Some(2000.0),
        tpot_ms: Some(50.0),
        percentile_slos: vec![],
        acceptance: vec![0.7],
        seed: 1,
        seeds: 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dstwin_core::time::SimDuration;

    fn input() -> PlanInput {
        test_input()
    }

    /// Two prefill and two decode nodes with 32 redundant experts.
    fn two_by_two(prefill_tp: u32, decode_tp: u32, max_num_seqs: u32, mtp: u32) -> Candidate {
        Candidate {
            prefill_nodes: 2,
            decode_nodes: 2,
            prefill_tp,
            decode_tp,
            max_num_seqs,
            redundant_experts: 32,
            mtp,
        }
    }

    #[test]
    fn the_space_covers_every_split_and_knob() {
        let (n, d) = nodes("atlas-800-a3", 32).unwrap();
        assert_eq!((n, d), (4, 16));
        let c = candidates(n, d);
        assert_eq!(c.len(), 3 * 2 * 3 * 3 * 2 * 3);
        assert!(nodes("atlas-800-a3", 12).is_err());
        assert!(
            nodes("atlas-800-a3", 8).is_err(),
            "one node cannot be split"
        );
    }

    #[test]
    fn candidate_scenarios_validate_and_launch_args_match() {
        let p = input();
        let c = two_by_two(8, 1, 16, 1);
        let text = c.scenario(&p, 16, Load::Closed(Generations::new(64)), 1);
        let s = load_str("t", &text, Path::new("."), &[]).expect("valid");
        assert_eq!(s.instances.len(), 2);
        let args = c.launch_args(&p, 16, &p.model);
        assert!(args[0].1.contains("--data-parallel-size 2"));
        assert!(args[0].1.contains("--tensor-parallel-size 8"));
        assert!(args[0].1.contains("\"kv_role\": \"kv_producer\""));
        assert!(args[1].1.contains("--data-parallel-size 32"));
        assert!(args[1].1.contains("--max-num-seqs 16"));
        assert!(args[1].1.contains("--max-num-batched-tokens 32"));
        assert!(args[1].1.contains("\"num_speculative_tokens\": 1"));
        assert!(args[1].1.contains("\"num_redundant_experts\": 32"));
        assert!(args[1].1.contains("--enable-expert-parallel"));
        assert!(args[1].1.contains("--quantization ascend"));
    }

    #[test]
    fn open_loop_scenarios_carry_the_warm_up_and_the_window() {
        let p = input();
        let c = two_by_two(16, 2, 48, 2);
        let window = Window::open_loop(30.0, 4.0);
        let text = c.scenario(&p, 16, Load::Open { rate: 4.0, window }, 7);
        let s = load_str("t", &text, Path::new("."), &[]).expect("valid");
        assert_eq!(s.seed, 7);
        assert_eq!(s.warmup, SimDuration::from_secs_f64(60.0));
        assert_eq!(s.duration, Some(SimDuration::from_secs_f64(180.0)));
        assert!(text.contains(&format!("num_requests = {}", window.requests)));
        assert_eq!(p.seed_list(), vec![1, 2, 3]);
    }
}
