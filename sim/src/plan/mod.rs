//! `dstwin plan`: search disaggregated and aggregated deployments of a model on N cards for
//! the best goodput per card under SLOs, as an engine runs them, and print each winner's launch
//! commands for that engine ([`launch`]). IO-free: candidates are scenario texts the caller
//! prices ([`search`]) and simulates ([`screen`], [`run_level`]), in parallel.
//!
//! The layouts, per the vllm-ascend deployment guides and the aggregated deployments its
//! nightly tests run ([`shapes`]), each with and without redundant experts:
//! - disaggregated: prefill instances of one node each (DP x TP within the node, two-micro-batch
//!   overlap), one decode instance over the remaining nodes (EP over all its dies); the split
//!   between them and prefill and decode TP vary;
//! - aggregated: mixed instances (prefill and decode in the same steps, chunked prefill) of
//!   one or more nodes each, every node used (DP x TP attention, EP over each instance's dies);
//!   the instance size, attention TP and token budget per step vary. One node is planned
//!   aggregated only.
//!
//! **Search.** At every MTP depth ([`MTP_DEPTHS`]) each layout's batch cap per DP rank is
//! searched over [`BATCH_CAPS`] by its steady-step estimate ([`estimate`]: the twin's own steps
//! at a full batch, no queueing), keeping the cap with the most requests per second per card
//! within the SLOs and the KV. Only the front is simulated ([`front`]): the layouts estimated
//! within [`FRONT_MARGIN`] of the best estimate, and at least [`FRONT_MIN`].
//!
//! **Simulation.** Each layout of the front is first run closed-loop with every decode slot
//! (DP ranks x batch cap) busy, which measures its capacity in requests per second and its
//! request lifetime; then open-loop (Poisson) at 60% and 90% of that capacity. Every run leaves
//! out a warm-up and measures a steady window whose lengths are counted in the layout's own
//! request lifetimes ([`steady`]). All run with the first seed; those within reach of the best
//! run with the others, and layouts whose goodput ranges over the seeds overlap are tied, never
//! ranked one below the other ([`rank`]).
//!
//! - [`estimate`]: the steady-step estimate.
//! - [`steady`]: the steady-state rule: warm-up and window lengths, what a run measures.
//! - [`rank`]: spreads over seeds, screening, the tie rule and the reasons a layout loses.

pub mod charts;
pub mod estimate;
mod launch;
pub mod rank;
pub mod steady;

use dstwin_core::layout::Role;
pub use estimate::Estimate;
pub use launch::Engine;

pub use rank::{rank, to_seed, Level, Loss, Outcome, PlanReport, Spread, Standing, Summary};
pub use steady::{Generations, Measurement, Window};

use crate::run::{run, RequestRow, RunOptions, SimReport};
use crate::scenario::load_str;
use crate::sweep::one_line;
use dstwin_hwmodels::Catalog;
use serde::Serialize;
use std::path::Path;
use steady::{capacity, measure, RunSpan};

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
    /// The engine the layouts run on ([`Engine::of`] the hardware).
    pub engine: Engine,
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
    /// The tightest TPOT bound (every request's or a percentile's), ms; infinite without one.
    pub fn tpot_bound_ms(&self) -> f64 {
        self.bound_ms(SloMetric::Tpot, self.tpot_ms)
    }

    /// The tightest TTFT bound, ms; infinite without one.
    pub fn ttft_bound_ms(&self) -> f64 {
        self.bound_ms(SloMetric::Ttft, self.ttft_ms)
    }

    fn bound_ms(&self, metric: SloMetric, every: Option<f64>) -> f64 {
        self.percentile_slos
            .iter()
            .filter(|s| s.metric == metric)
            .map(|s| s.max_ms)
            .chain(every)
            .fold(f64::INFINITY, f64::min)
    }

    /// Every instance's longest request: the prompt, the output and a margin.
    pub fn max_model_len(&self) -> u64 {
        u64::from(self.input_tokens) + u64::from(self.output_tokens) + 64
    }

    /// The seeds, first to last: `seed`, `seed + 1`, ...
    pub fn seed_list(&self) -> Vec<u64> {
        (0..u64::from(self.seeds))
            .map(|k| self.seed.wrapping_add(k))
            .collect()
    }
}

/// How a layout splits the work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayoutKind {
    /// Prefill instances hand their KV to a decode instance.
    Disaggregated,
    /// Mixed instances: each prefills and decodes its own requests in the same steps.
    Aggregated,
}

/// One deployment to try. The `decode_*` fields describe the instances that generate: the
/// decode instance of a disaggregated layout, or every mixed instance of an aggregated one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Candidate {
    pub kind: LayoutKind,
    /// Prefill instances (one node each); 0 when aggregated.
    pub prefill_nodes: u32,
    /// Nodes of the generating instances: the decode instance's, or all of the mixed ones'.
    pub decode_nodes: u32,
    /// Prefill attention TP; 0 when aggregated.
    pub prefill_tp: u32,
    /// Attention TP of the generating instances.
    pub decode_tp: u32,
    /// Nodes per generating instance: `decode_nodes` for the one decode instance; aggregated,
    /// `decode_nodes / instance_nodes` mixed instances of this size.
    pub instance_nodes: u32,
    /// Requests per DP rank of the generating instances.
    pub max_num_seqs: u32,
    /// Tokens per step of the generating instances: a decode instance's batch with its drafts
    /// (`max_num_seqs x (1 + mtp)`), a mixed instance's chunked-prefill budget.
    pub max_num_batched_tokens: u32,
    pub redundant_experts: u32,
    pub mtp: u32,
}

/// Requests and tokens per DP rank and step of a prefill instance (vllm-ascend's PD guides).
const PREFILL_SEQS: u32 = 8;
const PREFILL_BUDGET: u32 = 16384;

/// One kind of instance in a candidate: its role, how many, nodes each, attention TP, and
/// requests and tokens per DP rank and step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct InstanceKind {
    role: Role,
    count: u32,
    nodes: u32,
    tp: u32,
    seqs: u32,
    budget: u32,
}

/// Attention TP of aggregated (mixed) instances: from full attention DP (TP1: SGLang's and
/// vLLM's DP-attention deployments of DeepSeek) to vllm-ascend's one-node A3 DP4 x TP4 and
/// DP2 x TP8.
const MIXED_TP: [u32; 4] = [1, 2, 4, 8];
/// Chunked-prefill budgets of mixed instances: short steps that keep TPOT low, or long ones
/// that prefill a prompt in fewer steps.
const MIXED_BUDGETS: [u32; 2] = [4096, 16384];

/// Batch caps per DP rank the search tries (the engines' DeepSeek guides run 8 to 256).
pub const BATCH_CAPS: [u32; 12] = [4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256];
/// MTP depths the search tries: off, and one to three drafts.
pub const MTP_DEPTHS: [u32; 4] = [0, 1, 2, 3];
/// Redundant experts the search tries: none, or one more per die on a 32-die EP group.
const REDUNDANT: [u32; 2] = [0, 32];

/// The layouts on `nodes` nodes of `dies_per_node` dies, each with and without redundant
/// experts, their batch cap and MTP depth left to [`search`] (0 here): every disaggregated
/// split (with two or more nodes), then every aggregated layout.
pub fn shapes(nodes: u32, dies_per_node: u32) -> Vec<Candidate> {
    let mut v = Vec::new();
    let knobs = |out: &mut Vec<Candidate>, c: Candidate| {
        for redundant_experts in REDUNDANT {
            out.push(Candidate {
                redundant_experts,
                ..c
            });
        }
    };
    let blank = Candidate {
        kind: LayoutKind::Disaggregated,
        prefill_nodes: 0,
        decode_nodes: nodes,
        prefill_tp: 0,
        decode_tp: 0,
        instance_nodes: nodes,
        max_num_seqs: 0,
        max_num_batched_tokens: 0,
        redundant_experts: 0,
        mtp: 0,
    };
    for prefill_nodes in 1..nodes {
        for prefill_tp in [8, 16] {
            if !dies_per_node.is_multiple_of(prefill_tp) {
                continue;
            }
            for decode_tp in [1, 2, 4] {
                let decode_nodes = nodes - prefill_nodes;
                knobs(
                    &mut v,
                    Candidate {
                        prefill_nodes,
                        decode_nodes,
                        prefill_tp,
                        decode_tp,
                        instance_nodes: decode_nodes,
                        ..blank
                    },
                );
            }
        }
    }
    for instance_nodes in (1..=nodes).filter(|k| nodes.is_multiple_of(*k)) {
        for tp in MIXED_TP
            .into_iter()
            .filter(|t| dies_per_node.is_multiple_of(*t))
        {
            for budget in MIXED_BUDGETS {
                knobs(
                    &mut v,
                    Candidate {
                        kind: LayoutKind::Aggregated,
                        decode_tp: tp,
                        instance_nodes,
                        max_num_batched_tokens: budget,
                        ..blank
                    },
                );
            }
        }
    }
    v
}

impl Candidate {
    /// This layout with `max_num_seqs` requests per generating DP rank and `mtp` drafts: a
    /// decode instance's token budget follows the batch and its drafts, a mixed instance keeps
    /// its chunked-prefill budget.
    pub fn with(self, max_num_seqs: u32, mtp: u32) -> Candidate {
        let max_num_batched_tokens = match self.kind {
            LayoutKind::Disaggregated => max_num_seqs * (1 + mtp),
            LayoutKind::Aggregated => self.max_num_batched_tokens,
        };
        Candidate {
            max_num_seqs,
            max_num_batched_tokens,
            mtp,
            ..self
        }
    }

    /// A one-line description.
    pub fn label(&self) -> String {
        match self.kind {
            LayoutKind::Disaggregated => format!(
                "{}P{}D nodes, prefill TP{}, decode TP{} x{} seqs, {} redundant, MTP {}",
                self.prefill_nodes,
                self.decode_nodes,
                self.prefill_tp,
                self.decode_tp,
                self.max_num_seqs,
                self.redundant_experts,
                self.mtp
            ),
            LayoutKind::Aggregated => format!(
                "aggregated {} x {}-node, TP{} x{} seqs, {} tokens/step, {} redundant, MTP {}",
                self.instances(),
                self.instance_nodes,
                self.decode_tp,
                self.max_num_seqs,
                self.max_num_batched_tokens,
                self.redundant_experts,
                self.mtp
            ),
        }
    }

    /// Generating instances: one decode instance, or the mixed instances.
    pub fn instances(&self) -> u32 {
        self.decode_nodes / self.instance_nodes
    }

    /// Each instance kind of the layout, as its scenario and its launch commands both state it.
    fn kinds(&self) -> Vec<InstanceKind> {
        match self.kind {
            LayoutKind::Disaggregated => vec![
                InstanceKind {
                    role: Role::Prefill,
                    count: self.prefill_nodes,
                    nodes: 1,
                    tp: self.prefill_tp,
                    seqs: PREFILL_SEQS,
                    budget: PREFILL_BUDGET,
                },
                InstanceKind {
                    role: Role::Decode,
                    count: 1,
                    nodes: self.decode_nodes,
                    tp: self.decode_tp,
                    seqs: self.max_num_seqs,
                    budget: self.max_num_batched_tokens,
                },
            ],
            LayoutKind::Aggregated => vec![InstanceKind {
                role: Role::Mixed,
                count: self.instances(),
                nodes: self.instance_nodes,
                tp: self.decode_tp,
                seqs: self.max_num_seqs,
                budget: self.max_num_batched_tokens,
            }],
        }
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
        let max_len = p.max_model_len();
        // Redundant experts are re-placed as the engine's dynamic EPLB does (the launch
        // arguments ask for the same cycle).
        let eplb = if self.redundant_experts > 0 {
            let (heat, algo) = p.engine.eplb_cycle();
            format!("[eplb]\ndynamic = true\nheat_interval = {heat}\nalgorithm_interval = {algo}\n")
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
        let red = self.redundant_experts;
        let instances: String = self
            .kinds()
            .iter()
            .map(|k| {
                let (lines, sched) = p.engine.scenario_lines(k.role);
                format!(
                    r#"[[instance]]
name = "{name}"
role = "{name}"
count = {count}
dies = {dies}
tp = {tp}
redundant_experts = {red}
{lines}[instance.scheduler]
max_num_batched_tokens = {budget}
max_num_seqs = {seqs}
max_model_len = {max_len}
enable_prefix_caching = false
{sched}
"#,
                    name = k.role.name(),
                    count = k.count,
                    dies = k.nodes * dies_per_node,
                    tp = k.tp,
                    budget = k.budget,
                    seqs = k.seqs,
                )
            })
            .collect();
        format!(
            r#"name = "plan"
seed = {seed}
model = "{model}"
quant = "{quant}"
hardware = "{hw}"
{window}{mtp}{eplb}
{instances}[workload]
{load}
input = {{ dist = "fixed", value = {inp} }}
output = {{ dist = "fixed", value = {out} }}

{slo}"#,
            model = p.model,
            quant = p.quant,
            hw = p.hardware,
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
        Err(e) => return Outcome::failed(*c, e),
    };
    let Some(cap) = cap.filter(|k| k.req_s > 0.0 && k.lifetime_s > 0.0) else {
        return Outcome::failed(
            *c,
            format!("{RUN_FAILED}too few requests finished at full load to measure a capacity"),
        );
    };
    let mut o = Outcome::failed(*c, String::new());
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
            Err(e) => return Outcome::failed(*c, e),
        }
        o.levels.push(level);
    }
    o.settle();
    o
}

/// A layout's batch cap chosen by the steady-step estimate, at one MTP depth.
#[derive(Clone, Debug)]
pub struct Searched {
    pub candidate: Candidate,
    /// Its estimate, or why its scenario does not validate (layout, memory).
    pub estimate: Result<Estimate, String>,
}

/// The steady-step estimate of `c` ([`estimate`]).
pub fn estimate_of(p: &PlanInput, c: &Candidate, dies_per_node: u32) -> Result<Estimate, String> {
    let g = Generations::new(c.decode_slots(dies_per_node));
    let text = c.scenario(p, dies_per_node, Load::Closed(g), p.seed);
    let s = load_str("plan candidate", &text, Path::new("."), &[]).map_err(|e| one_line(&e))?;
    estimate::Pricer::new(&s)?.at(p, c.max_num_seqs)
}

/// The batch cap of `shape` at `mtp` drafts with the highest estimated goodput per card, the
/// largest of equal ones (a prefill-bound layout's decode slots beyond what its prefill feeds
/// cost nothing and keep the decode from starving its prefill): [`BATCH_CAPS`] ascending until
/// the first cap that misses the KV or a bound. With none feasible, the smallest cap and its
/// estimate (no goodput: the estimate says why).
pub fn search(p: &PlanInput, shape: &Candidate, mtp: u32, dies_per_node: u32) -> Searched {
    let mut best: Option<Searched> = None;
    for b in BATCH_CAPS {
        let c = shape.with(b, mtp);
        let e = match estimate_of(p, &c, dies_per_node) {
            Ok(e) => e,
            Err(e) => {
                return best.unwrap_or(Searched {
                    candidate: c,
                    estimate: Err(e),
                })
            }
        };
        // Past the first cap, the best so far has goodput (a cap without stops the search).
        let top = best.as_ref().map_or(0.0, |s| {
            s.estimate.as_ref().map_or(0.0, |e| e.goodput_per_card)
        });
        if best.is_none() || e.goodput_per_card >= top {
            best = Some(Searched {
                candidate: c,
                estimate: Ok(e),
            });
        }
        // Larger caps hold even less of the KV and their steps only grow: a cap that misses
        // a bound, after a feasible one or before any, leaves none beyond it.
        if e.goodput_per_card == 0.0 {
            break;
        }
    }
    best.expect("at least one cap is tried")
}

/// Share below the best estimate within which a searched layout is simulated: the estimate
/// bounds capacity at a full batch and knows nothing of queueing, so it orders layouts only
/// roughly (docs/what-if.md measures how roughly).
pub const FRONT_MARGIN: f64 = 0.3;
/// Layouts simulated at least (the best estimates), whatever the margin.
pub const FRONT_MIN: usize = 8;

/// Which searched layouts to simulate (indices into `searched`): every valid one whose
/// estimated goodput per card is within [`FRONT_MARGIN`] of the best estimate, and at least
/// the [`FRONT_MIN`] best (by estimated goodput, then by how far the estimate is over `p`'s
/// bounds, so that a search where no estimate meets the SLOs still simulates the closest).
pub fn front(p: &PlanInput, searched: &[Searched]) -> Vec<usize> {
    let (tpot, ttft) = (p.tpot_bound_ms(), p.ttft_bound_ms());
    let over = |e: &Estimate| (e.tpot_ms / tpot).max(e.prefill_ms / ttft);
    let mut valid: Vec<(usize, &Estimate)> = searched
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.estimate.as_ref().ok().map(|e| (i, e)))
        .collect();
    valid.sort_by(|a, b| {
        b.1.goodput_per_card
            .total_cmp(&a.1.goodput_per_card)
            .then(over(a.1).total_cmp(&over(b.1)))
            .then(a.0.cmp(&b.0))
    });
    let top = valid.first().map_or(0.0, |v| v.1.goodput_per_card);
    let mut pick: Vec<usize> = valid
        .iter()
        .enumerate()
        .filter(|(k, v)| {
            *k < FRONT_MIN || (top > 0.0 && v.1.goodput_per_card >= (1.0 - FRONT_MARGIN) * top)
        })
        .map(|(_, v)| v.0)
        .collect();
    pick.sort_unstable();
    pick
}

/// A searched layout simulated ([`screen`]), its estimate kept beside the runs.
pub fn simulated(p: &PlanInput, s: &Searched, dies_per_node: u32) -> Outcome {
    let mut o = screen(p, &s.candidate, dies_per_node);
    o.estimate = s.estimate.as_ref().ok().copied();
    o
}

/// The outcome of a searched layout that is not simulated: invalid, or estimated only.
pub fn unsimulated(s: &Searched) -> Outcome {
    match &s.estimate {
        Err(e) => Outcome::failed(s.candidate, e.clone()),
        Ok(e) => {
            let mut o = Outcome::failed(s.candidate, String::new());
            o.standing = Standing::Estimated;
            o.estimate = Some(*e);
            o
        }
    }
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
        engine: Engine::VllmAscend,
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
            kind: LayoutKind::Disaggregated,
            prefill_nodes: 2,
            decode_nodes: 2,
            prefill_tp,
            decode_tp,
            instance_nodes: 2,
            max_num_seqs,
            max_num_batched_tokens: max_num_seqs * (1 + mtp),
            redundant_experts: 32,
            mtp,
        }
    }

    /// Four one-node mixed instances, DP4 x TP4.
    fn four_mixed() -> Candidate {
        Candidate {
            kind: LayoutKind::Aggregated,
            prefill_nodes: 0,
            decode_nodes: 4,
            prefill_tp: 0,
            decode_tp: 4,
            instance_nodes: 1,
            max_num_seqs: 32,
            max_num_batched_tokens: 4096,
            redundant_experts: 0,
            mtp: 1,
        }
    }

    #[test]
    fn the_space_covers_every_split_and_knob() {
        let (n, d) = nodes("atlas-800-a3", 32).unwrap();
        assert_eq!((n, d), (4, 16));
        let c = shapes(n, d);
        // PD: 3 splits x prefill TP 8, 16 x decode TP 1, 2, 4; aggregated: instances of 1, 2
        // or 4 nodes x TP 1, 2, 4, 8 x 2 budgets; each with 0 or 32 redundant experts.
        assert_eq!(c.len(), (3 * 2 * 3 + 3 * 4 * 2) * 2);
        let agg: Vec<&Candidate> = c
            .iter()
            .filter(|c| c.kind == LayoutKind::Aggregated)
            .collect();
        assert_eq!(agg.len(), 3 * 4 * 2 * 2);
        // Full attention DP (TP1), as SGLang and vLLM deploy DeepSeek with DP attention.
        assert!(agg
            .iter()
            .any(|c| c.decode_tp == 1 && c.instance_nodes == 1));
        assert!(agg
            .iter()
            .all(|c| c.decode_nodes == 4 && c.prefill_nodes == 0));
        assert!(agg.contains(&&Candidate {
            max_num_seqs: 0,
            mtp: 0,
            ..four_mixed()
        }));
        assert!(nodes("atlas-800-a3", 12).is_err());
        // One node: aggregated layouts only.
        let (n, d) = nodes("atlas-800-a3", 8).unwrap();
        let one = shapes(n, d);
        assert_eq!(one.len(), 4 * 2 * 2);
        assert!(one.iter().all(|c| c.kind == LayoutKind::Aggregated));
        // The decode budget follows the batch and its drafts; a mixed one keeps its own.
        let pd = two_by_two(8, 2, 0, 0);
        assert_eq!(pd.with(48, 2).max_num_batched_tokens, 144);
        assert_eq!(four_mixed().with(96, 3).max_num_batched_tokens, 4096);
    }

    /// The steady-step estimate of a layout is within a tenth (either way) of the capacity its
    /// closed-loop simulation measures: two PD layouts on A3, a mixed instance over two H200
    /// nodes (vLLM chunked prefill) and the same as SGLang runs it (separate prefill batches).
    #[test]
    fn the_estimate_tracks_the_simulated_capacity() {
        let a3 = PlanInput {
            seeds: 2,
            ..input()
        };
        let h200 = |engine: &str| PlanInput {
            hardware: "nvidia-h200-8".into(),
            quant: "fp8".into(),
            cards: 16,
            input_tokens: 1000,
            output_tokens: 2000,
            tpot_ms: Some(20.0),
            ttft_ms: None,
            engine: Engine::parse(engine, "nvidia-h200-8").unwrap(),
            ..a3.clone()
        };
        let mixed = Candidate {
            decode_nodes: 2,
            instance_nodes: 2,
            decode_tp: 8,
            redundant_experts: 32,
            ..four_mixed()
        }
        .with(48, 3);
        for (p, c, dies) in [
            (&a3, two_by_two(8, 2, 48, 2), 16),
            (&a3, two_by_two(8, 1, 16, 1), 16),
            (&h200("vllm"), mixed, 8),
            (&h200("sglang"), mixed.with(96, 3), 8),
        ] {
            let e = estimate_of(p, &c, dies).expect("valid");
            let o = screen(p, &c, dies);
            assert!(o.invalid.is_empty(), "{}", o.invalid);
            let ratio = e.capacity_req_s / o.capacity_req_s;
            assert!(
                (0.9..1.1).contains(&ratio),
                "{}: {e:?} against {}",
                c.label(),
                o.capacity_req_s
            );
            // The TPOT at a full batch bounds what the lighter open-loop loads measure.
            let r = o.result.as_ref().expect("ran");
            assert!(
                r.tpot_p50_ms.mean <= e.tpot_ms * 1.05,
                "{e:?} against {r:?}"
            );
        }
    }

    /// The search keeps the cap within the bounds the estimate checks, and the next cap up
    /// would break one of them (or gives no more).
    #[test]
    fn the_search_takes_the_best_cap_within_the_bounds() {
        let p = input();
        let shape = two_by_two(8, 2, 0, 0);
        for t in [2, 3] {
            let s = search(&p, &shape, t, 16);
            let e = s.estimate.expect("valid");
            let b = s.candidate.max_num_seqs;
            assert_eq!(s.candidate.mtp, t);
            assert!(e.goodput_per_card > 0.0 && e.tpot_ms <= 50.0 && u64::from(b) <= e.kv_seqs);
            let k = BATCH_CAPS.iter().position(|&x| x == b).unwrap();
            if let Some(&up) = BATCH_CAPS.get(k + 1) {
                let next = estimate_of(&p, &shape.with(up, t), 16).expect("valid");
                assert!(
                    next.goodput_per_card <= e.goodput_per_card,
                    "{next:?} vs {e:?}"
                );
            }
        }
        // A bound no cap meets: the smallest cap, with no goodput.
        let tight = PlanInput {
            tpot_ms: Some(1.0),
            ..input()
        };
        let s = search(&tight, &shape, 1, 16);
        assert_eq!(s.candidate.max_num_seqs, BATCH_CAPS[0]);
        assert_eq!(s.estimate.unwrap().goodput_per_card, 0.0);
        // An invalid layout says why, at the smallest cap.
        let bad = Candidate {
            redundant_experts: 0,
            decode_nodes: 3,
            instance_nodes: 3,
            prefill_nodes: 1,
            decode_tp: 1,
            ..shape
        };
        let s = search(&p, &bad, 0, 16);
        assert!(s.estimate.unwrap_err().contains("do not divide evenly"));
    }

    #[test]
    fn the_front_is_the_best_estimates_and_at_least_a_few() {
        let est = |g: f64, tpot: f64| Estimate {
            capacity_req_s: g * 32.0,
            tpot_ms: tpot,
            prefill_ms: 100.0,
            kv_seqs: 100,
            goodput_per_card: g,
        };
        let shape = two_by_two(8, 2, 16, 0);
        let mk = |e: Result<Estimate, String>| Searched {
            candidate: shape,
            estimate: e,
        };
        let mut v = vec![
            mk(Ok(est(0.30, 40.0))),
            mk(Ok(est(0.22, 40.0))), // 27% below: in
            mk(Err("layout".into())),
            mk(Ok(est(0.20, 40.0))), // 33% below: in only as one of the few best
        ];
        let p = input();
        assert_eq!(front(&p, &v), vec![0, 1, 3]);
        v.extend((0..10).map(|_| mk(Ok(est(0.01, 40.0)))));
        let f = front(&p, &v);
        assert_eq!(f.len(), FRONT_MIN);
        assert!(f.starts_with(&[0, 1, 3]) && !f.contains(&2));
        // Nothing meets the bounds: the closest are simulated, by the bound each misses most
        // (TPOT 50 ms and TTFT 2 s here).
        let mut none: Vec<Searched> = (0..12)
            .map(|k| mk(Ok(est(0.0, 60.0 + f64::from(k)))))
            .collect();
        assert_eq!(front(&p, &none), (0..FRONT_MIN).collect::<Vec<_>>());
        if let Ok(e) = &mut none[0].estimate {
            e.prefill_ms = 3000.0; // 1.5x its TTFT bound: further than any TPOT here
        }
        assert!(!front(&p, &none).contains(&0));
        assert_eq!(unsimulated(&none[9]).standing, Standing::Estimated);
        assert_eq!(unsimulated(&v[2]).standing, Standing::Invalid);
    }

    #[test]
    fn aggregated_scenarios_validate_and_launch_one_mixed_command() {
        let p = input();
        let c = four_mixed();
        assert_eq!(
            c.label(),
            "aggregated 4 x 1-node, TP4 x32 seqs, 4096 tokens/step, 0 redundant, MTP 1"
        );
        let text = c.scenario(&p, 16, Load::Closed(Generations::new(64)), 1);
        let s = load_str("t", &text, Path::new("."), &[]).expect("valid");
        assert_eq!(s.instances.len(), 1);
        assert_eq!(s.instances[0].count, 4);
        assert_eq!(c.decode_slots(16), 4 * 4 * 32);
        let args = c.launch_args(&p, 16, &p.model);
        assert_eq!(args.len(), 1);
        assert_eq!(args[0].0, "mixed (4 instances of 1 node)");
        let cmd = &args[0].1;
        assert!(cmd.contains("--data-parallel-size 4 \\\n"));
        assert!(cmd.contains("--tensor-parallel-size 4"));
        assert!(cmd.contains("--max-num-batched-tokens 4096"));
        assert!(!cmd.contains("kv-transfer-config"));
        assert!(!cmd.contains("recompute_scheduler_enable"));
        assert!(!cmd.contains("--data-parallel-size-local"));
        // Over two nodes: DP8, four ranks on each node.
        let two = Candidate {
            instance_nodes: 2,
            ..c
        };
        let cmd = &two.launch_args(&p, 16, &p.model)[0].1;
        assert!(cmd.contains("--data-parallel-size 8 \\\n  --data-parallel-size-local 4"));
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
        // Prefill micro-batches (the scenario's two_microbatch) as vllm-ascend turns them on.
        assert!(args[0].1.contains("\"num_ubatches\": 2"));
        assert!(!args[1].1.contains("num_ubatches"));
        // Dynamic EPLB needs its environment variable as well as its config.
        assert!(args[1].1.starts_with("DYNAMIC_EPLB=true vllm serve"));
        let none = Candidate {
            redundant_experts: 0,
            ..c
        };
        assert!(none.launch_args(&p, 16, &p.model)[1]
            .1
            .starts_with("vllm serve"));
    }

    #[test]
    fn sglang_layouts_run_and_launch_as_sglang_does() {
        let p = PlanInput {
            engine: Engine::parse("sglang", "atlas-800-a3").unwrap(),
            ..input()
        };
        assert_eq!(p.engine, Engine::SglangNpu);
        assert!(Engine::parse("trt", "atlas-800-a3")
            .unwrap_err()
            .contains("--engine trt"));
        let c = two_by_two(8, 2, 32, 2);
        let text = c.scenario(&p, 16, Load::Closed(Generations::new(64)), 1);
        assert_eq!(text.matches("dp_dispatch = \"round_robin\"").count(), 2);
        assert!(text.contains("heat_interval = 1000\nalgorithm_interval = 1"));
        assert!(text.contains("moe_comm = \"alltoall\""));
        assert!(text.contains("moe_comm = \"mc2\""));
        let s = load_str("t", &text, Path::new("."), &[]).expect("valid");
        assert_eq!(s.instances.len(), 2);
        let args = c.launch_args(&p, 16, "deepseek-r1");
        assert_eq!(args.len(), 3, "prefill, decode and the router");
        let (prefill, decode, router) = (&args[0].1, &args[1].1, &args[2].1);
        // Per instance, not per DP rank: 2 prefill ranks x 16384 tokens, 16 decode ranks x 32.
        assert!(prefill.contains("--tp-size 16 \\\n  --dp-size 2"));
        assert!(prefill.contains("--chunked-prefill-size 32768"));
        assert!(prefill.contains("--deepep-mode normal"));
        assert!(prefill.contains("--disaggregation-mode prefill"));
        assert!(decode.contains("--tp-size 32 \\\n  --dp-size 16"));
        assert!(decode.contains("--nnodes 2"));
        assert!(decode.contains("--max-running-requests 512"));
        assert!(!decode.contains("--chunked-prefill-size"));
        assert!(decode.contains("--deepep-mode low_latency"));
        assert!(decode.contains("--speculative-num-steps 2"));
        assert!(decode.contains("--speculative-num-draft-tokens 3"));
        for cmd in [prefill, decode] {
            assert!(cmd.contains("--device npu"));
            assert!(cmd.contains("--quantization modelslim"));
            assert!(cmd.contains("--disaggregation-transfer-backend ascend"));
            assert!(cmd.contains("--ep-num-redundant-experts 32"));
            assert!(!cmd.contains("--enable-two-batch-overlap"));
        }
        assert!(router.contains("--prefill http://${PREFILL_1:?prefill node 1}:30000"));
        assert!(router.contains("--prefill http://${PREFILL_2:?prefill node 2}:30000"));
        // On GPUs the prefill instance overlaps two batches, in the scenario and the command.
        let gpu = PlanInput {
            hardware: "nvidia-h200-8".into(),
            quant: "fp8".into(),
            engine: Engine::parse("sglang", "nvidia-h200-8").unwrap(),
            ..input()
        };
        let c = Candidate {
            prefill_nodes: 1,
            decode_nodes: 1,
            instance_nodes: 1,
            ..two_by_two(8, 1, 16, 0)
        };
        let text = c.scenario(&gpu, 8, Load::Closed(Generations::new(64)), 1);
        assert!(text.contains("two_microbatch = \"force\""));
        let args = c.launch_args(&gpu, 8, "deepseek-r1");
        assert!(args[0].1.contains("--enable-two-batch-overlap"));
        assert!(args[0]
            .1
            .contains("--disaggregation-transfer-backend mooncake"));
        assert!(!args[0].1.contains("--device"));
        assert!(!args[1].1.contains("--speculative"));
        assert_eq!(args[1].0, "decode (1 node)");
    }

    #[test]
    fn gpu_layouts_launch_vllm_with_its_own_flags() {
        let p = PlanInput {
            hardware: "nvidia-h200-8".into(),
            quant: "fp8".into(),
            engine: Engine::of("nvidia-h200-8").unwrap(),
            ..input()
        };
        assert_eq!(p.engine, Engine::Vllm);
        assert_eq!(Engine::of("atlas-800-a3").unwrap(), Engine::VllmAscend);
        assert!(Engine::of("no-such-system").is_err());
        let c = two_by_two(8, 1, 16, 1);
        let text = c.scenario(&p, 8, Load::Closed(Generations::new(64)), 1);
        assert!(text.contains("heat_interval = 1000\nalgorithm_interval = 2000"));
        assert!(text.contains("preemption = \"recompute\""));
        let s = load_str("t", &text, Path::new("."), &[]).expect("valid");
        assert_eq!(s.instances.len(), 2);
        let args = c.launch_args(&p, 8, "deepseek-r1");
        let (prefill, decode) = (&args[0].1, &args[1].1);
        for cmd in [prefill, decode] {
            assert!(cmd.starts_with("vllm serve"), "{cmd}");
            assert!(!cmd.contains("ascend"), "{cmd}");
            assert!(!cmd.contains("--additional-config"), "{cmd}");
            assert!(cmd.contains("--enable-eplb"));
            assert!(cmd.contains(
                "--eplb-config '{\"window_size\": 1000, \"step_interval\": 3000, \"num_redundant_experts\": 32}'"
            ));
            assert!(cmd.contains("\"kv_connector\": \"NixlConnector\", \"kv_role\": \"kv_both\""));
        }
        assert!(prefill.contains("--all2all-backend deepep_high_throughput"));
        assert!(prefill.contains("--enable-dbo"));
        assert!(decode.contains("--all2all-backend deepep_low_latency"));
        assert!(decode.contains("--data-parallel-size 16 \\\n  --data-parallel-size-local 8"));
        let mixed = Candidate {
            decode_nodes: 2,
            instance_nodes: 2,
            decode_tp: 8,
            ..four_mixed()
        };
        let cmd = &mixed.launch_args(&p, 8, "deepseek-r1")[0].1;
        assert!(cmd.contains("--all2all-backend deepep_low_latency"));
        assert!(!cmd.contains("kv-transfer-config"));
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
