//! The `Device` trait: "run one forward step of one instance", implemented by the twin's
//! `SimDevice` (virtual time, priced by the cost model) and by real engines; and the
//! [`Fabric`] trait that moves KV blocks between instances.
//!
//! The scheduler, placement and routing code never knows which device it drives: it builds a
//! [`StepPlan`] and applies the [`StepOutcome`].
//!
//! A plan always carries each rank's aggregate [`BatchShape`] (what the twin prices). A device
//! that executes requests ([`Device::wants_requests`]) also gets, per rank, what vLLM's scheduler
//! output carries: each scheduled request with its token ids on first sight, the chunk of tokens
//! to compute, its block table, whether it samples and the drafts to verify, and the requests
//! whose state it may drop. It answers with sampled token ids and finish reasons. Nothing
//! twin-only is asked of a real device: acceptance models and op-class times are optional.

use crate::batch::BatchShape;
use crate::mtp::KnownAcceptance;
use crate::time::{SimDuration, SimTime};
use serde::Serialize;
use std::sync::Arc;
use thiserror::Error;

pub use crate::req::ReqId;

/// What the scheduler plans against.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Capacity {
    /// DP ranks of the instance; each has its own scheduler and KV cache.
    pub dp_ranks: u32,
    /// KV blocks per DP rank.
    pub kv_blocks_per_rank: u64,
    /// Tokens per KV block.
    pub block_size: u32,
    /// KV bytes one context token takes on a rank (all layers).
    pub kv_bytes_per_token: f64,
    /// How a die's memory is used (weights, workspace, KV), when the device can tell.
    pub memory: Option<crate::memory::MemoryMap>,
}

/// One sampling sequence of a step: it verifies `drafts` MTP draft tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DecodeSeq {
    pub req: ReqId,
    pub drafts: u32,
    /// Sampling steps the request had taken on this instance before this one (indexes the
    /// twin's acceptance draws).
    pub step: u32,
}

/// How a device that returns tokens picks them for one request (vLLM's `SamplingParams`, the
/// part that shapes numerics). The defaults are the OpenAI API's: temperature 1, no top-p /
/// top-k / min-p cut, no seed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SamplingParams {
    /// 0: greedy.
    pub temperature: f64,
    /// Keep the smallest set of tokens whose probability reaches this (1: all).
    pub top_p: f64,
    /// Keep the `top_k` most likely tokens (0: all).
    pub top_k: u32,
    /// Drop tokens less likely than `min_p` times the most likely one (0: none).
    pub min_p: f64,
    /// Draws depend only on the seed and the token's position (reproducible); `None`: the
    /// device's own stream.
    pub seed: Option<u64>,
    /// Do not stop at the end-of-sequence token.
    pub ignore_eos: bool,
    /// The end-of-sequence token cannot end the request before it has this many output tokens.
    pub min_tokens: u32,
    /// Subtracted from the logit of every token the output already holds (OpenAI's).
    pub presence_penalty: f64,
    /// Subtracted per occurrence in the output so far (OpenAI's).
    pub frequency_penalty: f64,
    /// Divides positive logits (multiplies negative ones) of every token in the prompt or the
    /// output (vLLM's; 1: none).
    pub repetition_penalty: f64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            ignore_eos: false,
            min_tokens: 0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding (temperature 0).
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        }
    }
}

/// One request scheduled in a step, as a device that executes requests needs it (vLLM's
/// `NewRequestData` / `CachedRequestData` in one).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScheduledReq {
    pub req: ReqId,
    /// The request's tokens (prompt, plus what it produced before a send-back or preemption),
    /// given the first time a rank schedules it after it arrived or was preempted; `None`
    /// afterwards and when the workload has no token ids (synthetic lengths).
    #[serde(skip)]
    pub token_ids: Option<Arc<[u32]>>,
    /// How to sample it, given with `token_ids` (first sight); `None` then: the request came
    /// without (the device's defaults apply).
    #[serde(skip)]
    pub sampling: Option<Arc<SamplingParams>>,
    /// Tokens of the prompt as the client sent it: the token ids past it are output (sampling
    /// penalties and `min_tokens` count those).
    pub prompt_len: u32,
    /// Tokens whose KV is already in the request's blocks (prefix hits, earlier chunks, pulled
    /// KV).
    pub computed: u32,
    /// Tokens to compute this step from position `computed` (a prompt chunk, or 1 + drafts).
    pub new_tokens: u32,
    /// The request's block table (block ids of this rank's KV pool, in token order).
    pub blocks: Vec<u32>,
    /// The step ends with a sample for this request (the prompt is complete).
    pub samples: bool,
    /// Draft tokens to verify (MTP): the last `drafts` of the `new_tokens`.
    pub drafts: u32,
}

/// One DP rank's part of a step.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RankPlan {
    /// The DP rank (0..`StepPlan::dp_ranks`).
    pub rank: u32,
    pub shape: BatchShape,
    /// Sequences that sample this step and may accept drafts, in the scheduler's order.
    pub decode: Vec<DecodeSeq>,
    /// Every scheduled request, in the scheduler's order (only for devices that
    /// [`Device::wants_requests`]; empty otherwise). Entries that sample are `decode`'s, in the
    /// same order.
    pub reqs: Vec<ScheduledReq>,
    /// Requests whose state the device may drop before this step: finished, aborted, sent back,
    /// handed over or preempted (their blocks are free; a preempted one comes back with its
    /// token ids).
    pub freed: Vec<ReqId>,
}

/// Tokens of the dummy batch an idle DP rank runs so that the EP group's all-to-all stays in
/// lockstep (they are routed like any others).
pub const DUMMY_TOKENS: u64 = 1;

/// One MoE layer's experts move to a new placement before this step (EPLB): the device
/// installs `layer` (a real engine copies the expert weights that change dies; the twin prices
/// the copy).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExpertMove {
    pub layer: usize,
    /// The layer's new placement.
    pub placement: crate::eplb::LayerPlacement,
    /// Most experts any one die receives (the copy's critical path).
    pub max_slots_per_die: u32,
}

/// A step of every DP rank of one instance (they run in lockstep).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StepPlan {
    /// DP ranks of the instance.
    pub dp_ranks: u32,
    /// The ranks with work, in rank order. The others are idle: in an EP group each runs a
    /// dummy batch so that the all-to-all stays in lockstep.
    pub ranks: Vec<RankPlan>,
    /// The EPLB cycle's layer move to install with this step.
    pub expert_move: Option<ExpertMove>,
}

impl StepPlan {
    /// Tokens the whole instance computes.
    pub fn tokens(&self) -> u64 {
        self.totals().tokens
    }

    /// Ranks without work this step.
    pub fn idle_ranks(&self) -> u32 {
        self.dp_ranks - self.ranks.len() as u32
    }

    /// Ranks that run the dummy batch: the idle ones, and listed ones with nothing to compute.
    pub fn dummy_ranks(&self) -> u64 {
        self.totals().dummy_ranks
    }

    /// Tokens the step routes through the MoE layers: every rank's, the dummy batches
    /// included.
    pub fn routed_tokens(&self) -> u64 {
        self.totals().routed_tokens
    }

    /// [`StepPlan::routed_tokens`] and [`StepPlan::dummy_ranks`].
    pub fn routing(&self) -> (u64, u64) {
        let t = self.totals();
        (t.routed_tokens, t.dummy_ranks)
    }

    /// The plan's token totals in one pass over its ranks.
    pub fn totals(&self) -> PlanTotals {
        let mut t = PlanTotals::default();
        for r in &self.ranks {
            t.add(&r.shape);
        }
        t.finish(self.idle_ranks())
    }
}

/// A step plan's token totals ([`StepPlan::totals`]); built a rank at a time with
/// [`PlanTotals::add`] by a caller that passes over the ranks for other sums too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanTotals {
    /// Tokens the whole instance computes.
    pub tokens: u64,
    /// Every rank's tokens and the dummy batches: what the MoE layers route.
    pub routed_tokens: u64,
    /// Ranks that run the dummy batch: the idle ones, and listed ones with nothing to compute.
    pub dummy_ranks: u64,
}

impl PlanTotals {
    /// Adds a listed rank's shape.
    pub fn add(&mut self, s: &BatchShape) {
        let t = s.tokens();
        self.tokens += t;
        self.dummy_ranks += u64::from(t == 0);
    }

    /// The totals once every listed rank is added, with `idle` ranks not listed.
    pub fn finish(mut self, idle: u32) -> Self {
        self.dummy_ranks += idle as u64;
        self.routed_tokens = self.tokens + self.dummy_ranks * DUMMY_TOKENS;
        self
    }
}

/// Seconds by op class (or collective) on the step's critical path, for time-share reports.
pub type ClassTimes = [f64; CLASS_SLOTS];

/// Report order of [`ClassTimes`] slots.
pub const CLASS_NAMES: [&str; CLASS_SLOTS] = [
    "gemm",
    "grouped_gemm",
    "attention",
    "indexer",
    "elementwise",
    "dispatch",
    "combine",
    "all_reduce",
    "all_gather",
    "other_comm",
    "host",
];
pub const CLASS_SLOTS: usize = 11;
/// The slot of collectives without a slot of their own.
pub const OTHER_COMM: usize = 9;
/// The slot of host (CPU) time not hidden behind the device step.
pub const HOST: usize = 10;

/// Why a request stopped producing tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// It produced `max_tokens`.
    #[default]
    Length,
    /// The model produced an end-of-sequence token (or the device matched a stop condition).
    Stop,
}

/// What a sampling sequence produced in a step on a device that returns tokens.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Sampled {
    /// The tokens kept: the accepted drafts and the token sampled after them (1 + accepted).
    pub token_ids: Vec<u32>,
    /// Set when the request must stop here (EOS); tokens after it are not kept.
    pub finish: Option<FinishReason>,
}

/// What the routers saw, for the EPLB cycle's heat.
#[derive(Clone, Debug, PartialEq)]
pub enum ExpertHeat {
    /// Tokens routed this step per layer and expert (a real engine's router counts).
    Counts(Vec<Vec<f64>>),
    /// The expected share of each layer's routed tokens per expert, in effect after this step
    /// (the twin's load model): the core weighs it by the tokens it routed. A new handle
    /// means new shares.
    Shares(Arc<Vec<Vec<f64>>>),
}

/// What a step did.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StepOutcome {
    /// Predicted (twin) or measured (real device) duration.
    pub duration: SimDuration,
    /// Per entry of `StepPlan::ranks`, per entry of its `decode`: drafts accepted (0..=drafts).
    pub accepted: Vec<Vec<u32>>,
    /// Per entry of `StepPlan::ranks`, per entry of its `decode`: token ids and finish reasons. Empty for
    /// devices that only count tokens (the twin); then `accepted` alone drives the scheduler.
    pub sampled: Vec<Vec<Sampled>>,
    /// Time by op class on the critical path (zeros when the device cannot tell).
    pub class_times: ClassTimes,
    /// The routers' load (instances with routed experts and a rebalance cycle).
    #[serde(skip)]
    pub expert_heat: Option<ExpertHeat>,
}

/// One end of a KV transfer: an instance, its DP rank and the blocks there.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KvEnd {
    pub instance: u32,
    pub rank: u32,
    pub blocks: Vec<u32>,
}

/// A KV-cache hand-off from a prefill instance to a decode instance: named blocks on both
/// sides. The fabric reports its completion ([`Fabric::poll`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KvTransfer {
    pub req: ReqId,
    /// Tokens whose KV moves (the prompt, plus tokens produced before a send-back).
    pub tokens: u32,
    pub bytes: f64,
    pub from: KvEnd,
    pub to: KvEnd,
}

/// What a transfer costs when it has the link to itself.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TransferOutcome {
    /// Fixed latency.
    pub latency: SimDuration,
    /// Bytes per second the link sustains.
    pub bytes_per_s: f64,
}

/// Moves KV blocks between instances. The twin's fabric prices transfers on links shared by
/// concurrent transfers; a real one copies the blocks. Time is an argument: the simulator
/// passes virtual time, the wall-clock runtime the elapsed time in device seconds.
pub trait Fabric {
    /// Starts a transfer at `now`.
    fn start(&mut self, now: SimTime, x: &KvTransfer) -> Result<(), DeviceError>;
    /// The earliest time something may complete (`None`: nothing in flight).
    fn next_event(&self) -> Option<SimTime>;
    /// Appends the requests whose transfers have completed by `now`, in completion order.
    fn poll(&mut self, now: SimTime, done: &mut Vec<ReqId>);
}

/// A fabric whose transfers complete the instant they start: for devices in one address space
/// whose instances read each other's blocks directly, and for tests.
#[derive(Clone, Debug, Default)]
pub struct InstantFabric {
    pending: Vec<ReqId>,
    at: SimTime,
}

impl Fabric for InstantFabric {
    fn start(&mut self, now: SimTime, x: &KvTransfer) -> Result<(), DeviceError> {
        self.pending.push(x.req);
        self.at = now;
        Ok(())
    }

    fn next_event(&self) -> Option<SimTime> {
        (!self.pending.is_empty()).then_some(self.at)
    }

    fn poll(&mut self, _now: SimTime, done: &mut Vec<ReqId>) {
        done.append(&mut self.pending);
    }
}

#[derive(Debug, Error, PartialEq)]
pub enum DeviceError {
    /// The plan does not match the device (wrong rank count): a driver bug or a misconfiguration.
    #[error("step plan has {got} DP ranks but the device has {expected}")]
    Ranks { got: usize, expected: u32 },
    /// The device failed; the message says how.
    #[error("device failure: {0}")]
    Failed(String),
}

/// Runs (or prices) steps of one instance.
pub trait Device {
    /// Capacity the scheduler plans against.
    fn capacity(&self) -> Capacity;
    /// Run one step for every DP rank, writing what happened into `out` (its buffers are reused
    /// from step to step). DP ranks of an EP group step in lockstep: the step ends when the
    /// slowest rank and the all-to-all finish.
    fn execute(&mut self, plan: &StepPlan, out: &mut StepOutcome) -> Result<(), DeviceError>;
    /// When the step of the next [`Device::execute`] starts, on the driver's clock: drivers call
    /// it before each execute. A device that prices a step by how long it idled before it (the
    /// twin's cold steps, docs/calibration.md) keeps it; nothing by default.
    fn starts_at(&mut self, _now: SimTime) {}
    /// The device predicts its steps' durations instead of measuring them (the twin): a
    /// wall-clock driver then waits for the predicted end, and orders completions by it.
    fn predicts_time(&self) -> bool {
        false
    }
    /// The device executes requests: plans carry [`ScheduledReq`]s and outcomes must carry
    /// [`Sampled`] tokens. The twin prices shapes and says no (default).
    fn wants_requests(&self) -> bool {
        false
    }
    /// The device's MTP acceptance when it is known ahead as a function of (request, sampling
    /// step), as in the twin. A scheduler given it advances steadily decoding requests in
    /// aggregate instead of touching each every step. Real devices return `None` (default).
    fn acceptance(&self) -> Option<Arc<dyn KnownAcceptance>> {
        None
    }
    /// The driver has had no step for the device for a while (the wall-clock driver: 1 ms): a
    /// moment for work that must stay off the step path (a real engine writing its profile),
    /// done in short slices. True while more is left, and the driver calls again unless a step
    /// has come; when the driver stops it calls until false. Nothing by default.
    fn idle(&mut self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::AttnCap;

    #[test]
    fn plan_totals_count_listed_empty_ranks_and_idle_ones_as_dummies() {
        let rank = |rank, tokens| RankPlan {
            rank,
            shape: if tokens == 0 {
                BatchShape::default()
            } else {
                BatchShape::uniform_decode(tokens, 1, 100, AttnCap(None))
            },
            ..Default::default()
        };
        let plan = StepPlan {
            dp_ranks: 6,
            ranks: vec![rank(0, 5), rank(2, 0), rank(3, 7)],
            expert_move: None,
        };
        let t = plan.totals();
        assert_eq!(t.tokens, 12);
        // Ranks 1, 4 and 5 are idle; rank 2 is listed with nothing to compute.
        assert_eq!(t.dummy_ranks, 4);
        assert_eq!(t.routed_tokens, 12 + 4 * DUMMY_TOKENS);
        assert_eq!(plan.routing(), (t.routed_tokens, t.dummy_ranks));
        assert_eq!(
            (plan.tokens(), plan.dummy_ranks(), plan.routed_tokens()),
            (12, 4, 16)
        );
        // Built a rank at a time, as a caller passing over the ranks does.
        let mut by_hand = PlanTotals::default();
        for r in &plan.ranks {
            by_hand.add(&r.shape);
        }
        assert_eq!(by_hand.finish(plan.idle_ranks()), t);
    }
}
