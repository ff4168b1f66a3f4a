//! An instance: its DP ranks' schedulers stepping in lockstep, shared by the simulator's
//! virtual-time driver and the wall-clock runtime.
//!
//! - [`kv`]: paged KV blocks with prefix caching.
//! - [`rank`]: the scheduler of one DP rank (vLLM v1 semantics).
//!
//! New requests go to the DP rank with the fewest unfinished requests (lowest index on ties).
//! A step plans the ranks that have work, in rank order; the others are idle (the device runs
//! them a dummy batch to keep the all-to-all in lockstep) and cost the scheduler nothing: an
//! idle rank's step counter catches up when it gets work again. The outcome is applied rank by
//! rank.

pub mod kv;
pub mod rank;

use crate::batch::AttnCap;
use crate::device::{FinishReason, PlanTotals, ReqId, StepOutcome, StepPlan};
use crate::layout::Role;
use crate::mtp::KnownAcceptance;
use crate::time::SimTime;
use rank::{Admission, RankScheduler};
use serde::Serialize;
use std::sync::Arc;

/// Everything an instance's schedulers need, validated by the caller (scenario or CLI).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct InstanceConfig {
    pub role: Role,
    pub dp_ranks: u32,
    pub max_num_batched_tokens: u32,
    pub max_num_seqs: u32,
    pub block_size: u32,
    /// KV blocks per DP rank.
    pub num_kv_blocks: u64,
    pub enable_chunked_prefill: bool,
    pub enable_prefix_caching: bool,
    /// Cap on one request's prompt tokens per step (0: none).
    pub long_prefill_token_threshold: u32,
    pub max_model_len: u64,
    /// MTP draft tokens per decode step.
    pub num_spec_tokens: u32,
    pub attn_cap: AttnCap,
    /// On KV exhaustion in a decode instance, hand the request back instead of recomputing.
    pub send_back: bool,
    /// Step N+1 is scheduled before step N's outputs are known (vLLM's async scheduling): a
    /// request that finishes in step N still computes a (discarded) decode step in N+1. The
    /// driver delays requests that arrive during a step by one step.
    pub async_scheduling: bool,
    /// SGLang's prefill delayer (`SGLANG_SCHEDULER_DECREASE_PREFILL_IDLE=1`, at most
    /// `SGLANG_PREFILL_DELAYER_MAX_DELAY_PASSES` passes; 0: off): while some DP ranks but not
    /// all have a prompt to admit, no rank admits one, for up to this many steps less one, so
    /// that prompts start on every rank at once rather than leave ranks idle in a prefill.
    pub prefill_delay_passes: u32,
    /// vllm-ascend's balance scheduling (`enable_balance_scheduling`, formerly
    /// `VLLM_ASCEND_BALANCE_SCHEDULING=1`; mixed instances only): while any DP rank ended the
    /// last step with `max_num_seqs` requests running, no rank admits a waiting request, so
    /// that ranks fill and drain together.
    pub balance_scheduling: bool,
    /// SGLang's scheduling without `--enable-mixed-chunk` (its default): a step is a prefill
    /// batch, the prompts being computed and then waiting requests, whenever there is one to
    /// run (the decoding requests wait), else a decode batch of the running requests. A step
    /// never holds both, where vLLM's mix them. A prefill batch's prompt that lacks KV
    /// preempts nobody (SGLang retracts only to decode). Every request is stepped one by one
    /// (steady aggregation assumes a decoder takes every step).
    pub separate_prefill_batches: bool,
    /// How a new request picks its DP rank ([`DpDispatch`]).
    pub dp_dispatch: DpDispatch,
    /// What a waiting request's admission asks of the KV beyond its prompt's blocks
    /// ([`AdmissionRule`]).
    pub admission: AdmissionRule,
}

/// What a rank's KV must hold for a waiting request to start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub enum AdmissionRule {
    /// The blocks of the tokens it computes now (vLLM: a request that later finds no KV
    /// preempts the newest one).
    #[default]
    Vllm,
    /// SGLang's, which keeps room for the tokens running requests are still to produce
    /// ([`SglangAdmission`]).
    Sglang(SglangAdmission),
}

/// SGLang's admission (`PrefillAdder` in its `schedule_policy.py`, the decode side's
/// `DecodePreallocQueue`), with its defaults where [`SglangAdmission::new`] takes none. Every
/// remaining-output estimate is clipped at `SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION` (4,096).
///
/// - A prompt on a mixed or prefill instance starts when the free KV, less each running
///   request's remaining output times the rank's `new_token_ratio`, holds its uncomputed
///   prompt and its whole output. The ratio starts at `init_ratio`, falls by `decay` every
///   step that decodes without retracting, down to `min_ratio`, is set after a retraction to
///   (tokens the remaining requests produced + 20 per request) / (their outputs + 1), at most
///   1, and returns to `init_ratio` when the rank has nothing to run.
/// - With `ignore_eos_path` (the client sets ignore_eos and the radix cache is disabled,
///   SGLang's `add_one_req_ignore_eos`), a prompt starts only if every request, taken in the
///   order of their remaining outputs, could produce all of them while those before it finish
///   and free their KV: the whole output is reserved.
/// - A request whose KV comes from a prefill instance is preallocated when the free KV holds
///   its prompt plus `reserved_decode_tokens` for it and for every request already running or
///   receiving its KV (`SGLANG_NUM_RESERVED_DECODE_TOKENS`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SglangAdmission {
    pub init_ratio: f64,
    pub min_ratio: f64,
    pub decay: f64,
    pub ignore_eos_path: bool,
    pub reserved_decode_tokens: u32,
}

impl SglangAdmission {
    /// SGLang's ratio from `--schedule-conservativeness` c: init = min(0.7 c, 1), min = 0.14
    /// init, reached in 600 decode steps (`SGLANG_INIT_NEW_TOKEN_RATIO`,
    /// `SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR`, `SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS`).
    pub fn new(conservativeness: f64, ignore_eos_path: bool, reserved_decode_tokens: u32) -> Self {
        let init_ratio = (0.7 * conservativeness).min(1.0);
        let min_ratio = (init_ratio * 0.14).min(1.0);
        SglangAdmission {
            init_ratio,
            min_ratio,
            decay: (init_ratio - min_ratio) / 600.0,
            ignore_eos_path,
            reserved_decode_tokens,
        }
    }
}

/// How an instance spreads new requests over its DP ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DpDispatch {
    /// The rank with the fewest unfinished requests, the lowest index on ties (vLLM's DP
    /// coordinator balances by its ranks' queues).
    #[default]
    LeastLoaded,
    /// Each rank in turn, whatever it holds (SGLang's `--load-balance-method round_robin`, its
    /// default, and the `decode_round_robin` / `--prefill-round-robin-balance` pairing of its
    /// PD deployments).
    RoundRobin,
}

/// A request entering an instance.
#[derive(Clone, Copy, Debug)]
pub struct NewRequest<'a> {
    pub id: ReqId,
    pub prompt_tokens: u32,
    /// Tokens to produce here (a prefill instance: 1).
    pub max_output_tokens: u32,
    /// Block hashes of the prompt at `hash_block_tokens` granularity (shared ids = shared prefix).
    pub hash_ids: &'a [u64],
    pub hash_block_tokens: u32,
    /// The prompt's KV comes from a prefill instance (PD decode side).
    pub remote_kv: bool,
    /// The prompt's token ids, when the workload has them (a device that executes requests
    /// needs them).
    pub token_ids: Option<&'a [u32]>,
    /// The prompt as the client sent it (`prompt_tokens` less the tokens a sent-back request
    /// had produced).
    pub prompt_len: u32,
    /// How a device that returns tokens samples it.
    pub sampling: Option<&'a std::sync::Arc<crate::device::SamplingParams>>,
}

/// What happened to a request during a step (steps where nothing notable happens to a request
/// are summed in [`StepSummary`] instead).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstEvent {
    /// Its first token was sampled; on a prefill instance, its prompt is done.
    First { req: ReqId },
    /// It sampled again after sitting out steps; its previous sample was at `since_step`.
    Gap { req: ReqId, since_step: u64 },
    /// It produced all its tokens, or the device stopped it, and left (decode and mixed
    /// instances).
    Finished { req: ReqId, reason: FinishReason },
    /// KV ran out: the request lost its blocks and waits to recompute.
    Preempted { req: ReqId },
    /// KV ran out on a decode instance with send-back: the request left after `emitted` tokens;
    /// re-prefill it.
    SentBack { req: ReqId, emitted: u32 },
}

impl InstEvent {
    /// The request it happened to.
    pub fn req(&self) -> ReqId {
        match *self {
            InstEvent::First { req }
            | InstEvent::Gap { req, .. }
            | InstEvent::Finished { req, .. }
            | InstEvent::Preempted { req }
            | InstEvent::SentBack { req, .. } => req,
        }
    }
}

/// A step's totals over every request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepSummary {
    /// Tokens sampled.
    pub tokens: u64,
    /// Requests that sampled in this step and in the one before: their inter-token latency is
    /// the time since the previous step ended.
    pub continuing: u64,
}

/// Counters over all ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct InstanceStats {
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    pub preemptions: u64,
    pub running: u64,
    pub waiting: u64,
    /// Remote-KV requests whose KV is on its way from a prefill instance.
    pub pulling: u64,
    /// Request-steps advanced in aggregate (steady) and one by one; steps where the token budget
    /// could bind with steady requests in a rank. Diagnostics of the scheduler's speed.
    pub steady_steps: u64,
    pub exact_steps: u64,
    pub budget_fallbacks: u64,
}

/// Ranks ahead of the one being scheduled whose first ending window is prefetched
/// ([`RankScheduler::prefetch`]); the second stage ([`RankScheduler::prefetch_blocks`]) runs
/// half as far ahead. Measured on the CloudMatrix hour: 6 slightly better than 4, 8 no better
/// than 4, 1 or 2 worse.
const PREFETCH_AHEAD: usize = 6;

/// Each DP rank's load (unfinished requests) in a min tree: the least-loaded rank, lowest
/// index on ties, is its root. A leaf holds `load << 32 | rank`, so the order of leaves is
/// that order.
#[derive(Clone, Debug)]
struct Loads {
    /// Leaves at `leaves..leaves + ranks`, padded with `u64::MAX`; node i covers 2i and 2i+1.
    tree: Vec<u64>,
    leaves: usize,
}

impl Loads {
    fn new(ranks: usize) -> Self {
        let leaves = ranks.next_power_of_two();
        let mut tree = vec![u64::MAX; 2 * leaves];
        for r in 0..ranks {
            tree[leaves + r] = r as u64;
        }
        for i in (1..leaves).rev() {
            tree[i] = tree[2 * i].min(tree[2 * i + 1]);
        }
        Loads { tree, leaves }
    }

    /// Rank `r` holds `load` unfinished requests.
    fn set(&mut self, r: u32, load: usize) {
        let mut i = self.leaves + r as usize;
        let v = (load as u64) << 32 | r as u64;
        if self.tree[i] == v {
            return;
        }
        self.tree[i] = v;
        // A node whose minimum stays what it was leaves every node above it as it was.
        while i > 1 {
            i /= 2;
            let m = self.tree[2 * i].min(self.tree[2 * i + 1]);
            if self.tree[i] == m {
                break;
            }
            self.tree[i] = m;
        }
    }

    /// The least-loaded rank (lowest index on ties).
    fn least(&self) -> u32 {
        self.tree[1] as u32
    }
}

/// Requests that left an instance in `events` are no longer in `owner`.
fn forget_ended(owner: &mut crate::idmap::IdMap<(u32, u32)>, events: &[InstEvent]) {
    for e in events {
        if let InstEvent::SentBack { req, .. } | InstEvent::Finished { req, .. } = *e {
            owner.remove(req);
        }
    }
}

/// One instance's schedulers.
#[derive(Clone, Debug)]
pub struct Instance {
    cfg: InstanceConfig,
    ranks: Vec<RankScheduler>,
    /// Each rank's unfinished requests, kept beside the ranks so that placing a request does
    /// not read every rank.
    loads: Loads,
    /// Where each request lives: (rank, slot).
    owner: crate::idmap::IdMap<(u32, u32)>,
    plan: StepPlan,
    /// Ranks with work (or device state to free), in rank order: the ranks a step plans.
    active: Vec<u32>,
    /// Steps applied so far.
    steps: u64,
    /// KV blocks in use over all ranks, kept as ranks change.
    used_blocks: u64,
    /// Requests admitted for the first time by the last `schedule`, with the prompt tokens
    /// their prefix-cache hits cover.
    started: Vec<(ReqId, u32)>,
    pulls: Vec<ReqId>,
    /// Preemptions decided while scheduling, reported with the step's outcome.
    pending: Vec<InstEvent>,
    /// Per rank of the plan, the totals of a trivial step ([`RankScheduler::trivial_step`]),
    /// whose outcome `apply` leaves to the rank.
    trivial: Vec<Option<(u64, u64)>>,
    /// The plan's token totals.
    totals: PlanTotals,
    /// Steps the prefill delayer has held prompts back in a row
    /// ([`InstanceConfig::prefill_delay_passes`]).
    delayed: u32,
    /// Tokens each request sampled in the last step (when reporting emissions).
    emissions: Vec<(ReqId, u32)>,
    /// Their token ids, in the same order, when the device returns tokens.
    emitted_ids: Vec<u32>,
    /// The rank the next request goes to under [`DpDispatch::RoundRobin`].
    next_rank: u32,
}

impl Instance {
    pub fn new(cfg: InstanceConfig) -> Self {
        assert!(cfg.dp_ranks > 0, "an instance needs at least one DP rank");
        Instance {
            ranks: (0..cfg.dp_ranks).map(|_| RankScheduler::new(cfg)).collect(),
            loads: Loads::new(cfg.dp_ranks as usize),
            plan: StepPlan {
                dp_ranks: cfg.dp_ranks,
                ranks: Vec::new(),
                expert_move: None,
            },
            active: Vec::new(),
            steps: 0,
            used_blocks: 0,
            cfg,
            owner: crate::idmap::IdMap::default(),
            started: Vec::new(),
            pulls: Vec::new(),
            pending: Vec::new(),
            trivial: Vec::new(),
            totals: PlanTotals::default(),
            delayed: 0,
            emissions: Vec::new(),
            emitted_ids: Vec::new(),
            next_rank: 0,
        }
    }

    /// Lets the ranks advance steadily decoding requests in aggregate with the device's MTP
    /// acceptance ([`crate::device::Device::acceptance`]); call before adding requests.
    pub fn set_acceptance(&mut self, a: Option<Arc<dyn KnownAcceptance>>) {
        for r in &mut self.ranks {
            r.set_acceptance(a.clone());
        }
    }

    /// Reports every request's tokens per step ([`Instance::emissions`]), as serving needs to
    /// stream them; requests are then stepped one by one.
    pub fn set_report_emissions(&mut self, on: bool) {
        for r in &mut self.ranks {
            r.report_emissions = on;
        }
    }

    /// Plans carry every scheduled request ([`crate::device::ScheduledReq`]) for a device that
    /// executes requests; implies reporting emissions. Call before adding requests.
    pub fn set_detail(&mut self, on: bool) {
        for r in &mut self.ranks {
            r.detail = on;
            r.report_emissions |= on;
        }
    }

    /// (request, tokens) for every request that sampled in the last applied step.
    pub fn emissions(&self) -> &[(ReqId, u32)] {
        &self.emissions
    }

    /// The token ids of [`Instance::emissions`], concatenated in the same order (empty when the
    /// device returns no tokens).
    pub fn emitted_ids(&self) -> &[u32] {
        &self.emitted_ids
    }

    /// Drops a request wherever it is (its client went away) and frees its KV. Call between
    /// `apply` and the next `schedule`. Returns false if the instance does not hold it.
    pub fn abort(&mut self, req: ReqId) -> bool {
        let Some((r, slot)) = self.owner.remove(req) else {
            return false;
        };
        let steps = self.steps;
        let found = self.on_rank(r, |rank| {
            rank.settle(steps);
            rank.abort(slot, req)
        });
        self.loads.set(r, self.ranks[r as usize].load());
        found
    }

    /// The instance holds request `req` (waiting, pulling, running or holding KV to send).
    pub fn holds(&self, req: ReqId) -> bool {
        self.owner.contains_key(req)
    }

    /// The DP rank holding `req` and its block table there.
    pub fn blocks_of(&self, req: ReqId) -> Option<(u32, &[u32])> {
        let &(r, slot) = self.owner.get(req)?;
        self.ranks[r as usize].blocks_of(slot, req).map(|b| (r, b))
    }

    pub fn config(&self) -> &InstanceConfig {
        &self.cfg
    }

    pub fn max_model_len(&self) -> u64 {
        self.cfg.max_model_len
    }

    /// Adds a request to a DP rank as [`InstanceConfig::dp_dispatch`] picks it; returns the
    /// rank.
    pub fn add_request(&mut self, r: NewRequest<'_>, _now: SimTime) -> u32 {
        let rank = match self.cfg.dp_dispatch {
            DpDispatch::LeastLoaded => self.loads.least(),
            DpDispatch::RoundRobin => {
                let rank = self.next_rank;
                self.next_rank = (rank + 1) % self.cfg.dp_ranks;
                rank
            }
        };
        let slot = self.ranks[rank as usize].add(r);
        self.loads.set(rank, self.ranks[rank as usize].load());
        self.owner.insert(r.id, (rank, slot));
        self.activate(rank);
        rank
    }

    /// Runs `f` on rank `r`, keeping the block count and the active set up to date.
    fn on_rank<T>(&mut self, r: u32, f: impl FnOnce(&mut RankScheduler) -> T) -> T {
        let rank = &mut self.ranks[r as usize];
        let before = rank.used_blocks();
        let out = f(rank);
        let after = rank.used_blocks();
        self.used_blocks = self.used_blocks + after - before;
        if self.ranks[r as usize].has_work() || self.ranks[r as usize].has_freed() {
            self.activate(r);
        }
        out
    }

    fn activate(&mut self, r: u32) {
        if let Err(at) = self.active.binary_search(&r) {
            self.active.insert(at, r);
        }
    }

    pub fn has_work(&self) -> bool {
        self.active
            .iter()
            .any(|&r| self.ranks[r as usize].has_work())
    }

    /// Plans one lockstep step of every rank; read it with [`Instance::plan`].
    pub fn schedule(&mut self, _now: SimTime) {
        let held = self.balance_holds() || self.delay_prefill();
        self.plan_ranks(if held {
            Admission::Held
        } else {
            Admission::Open
        });
        if held && self.totals.tokens == 0 {
            // What was to run preempted itself: a step of nothing is never run, so nothing
            // would plan again. The step admits instead, as the delayer's next pass would.
            self.delayed = 0;
            for p in &mut self.plan.ranks {
                self.ranks[p.rank as usize].give_back_freed(&mut p.freed);
            }
            self.plan_ranks(Admission::Replanned);
        }
    }

    /// [`Instance::schedule`] with waiting prompts admitted as `admission` says.
    fn plan_ranks(&mut self, admission: Admission) {
        self.started.clear();
        self.pulls.clear();
        // A held plan made again keeps the first plan's preemptions; a plan that does not run
        // hands its own over with `take_unrun_events`.
        let mut events = std::mem::take(&mut self.pending);
        // Ranks that went idle in the last step leave the active set; the others are planned
        // (one pass over the ranks: a large instance's ranks do not stay in the processor's
        // first-level cache from one pass to the next).
        let mut active = std::mem::take(&mut self.active);
        let mut kept = 0;
        let mut totals = PlanTotals::default();
        self.trivial.clear();
        for j in 0..active.len() {
            let r = active[j];
            if let Some(&ahead) = active.get(j + PREFETCH_AHEAD) {
                self.ranks[ahead as usize].prefetch(self.steps);
            }
            if let Some(&ahead) = active.get(j + PREFETCH_AHEAD / 2) {
                self.ranks[ahead as usize].prefetch_blocks(self.steps);
            }
            let rank = &mut self.ranks[r as usize];
            if !(rank.has_work() || rank.has_freed()) {
                continue;
            }
            active[kept] = r;
            if kept == self.plan.ranks.len() {
                self.plan.ranks.push(Default::default());
            }
            let plan = &mut self.plan.ranks[kept];
            kept += 1;
            plan.rank = r;
            if let Some(t) = rank.quiet_step(self.steps, plan) {
                totals.add(&plan.shape);
                self.trivial.push(Some(t));
                continue;
            }
            rank.catch_up(self.steps);
            debug_assert_eq!(rank.steps(), self.steps, "rank {r} steps in lockstep");
            let before = rank.used_blocks();
            let steady = rank.schedule(
                plan,
                admission,
                &mut self.started,
                &mut self.pulls,
                &mut events,
            );
            totals.add(&plan.shape);
            self.trivial.push(rank.trivial_step());
            self.used_blocks = self.used_blocks + rank.used_blocks() - before;
            // Send-back preemption removes requests while scheduling.
            if !steady {
                self.loads.set(r, rank.load());
            }
        }
        active.truncate(kept);
        self.active = active;
        self.plan.ranks.truncate(kept);
        self.totals = totals.finish(self.plan.idle_ranks());
        self.pending = events;
    }

    /// vllm-ascend's balance scheduling ([`InstanceConfig::balance_scheduling`]): whether a
    /// rank at its `max_num_seqs` holds every rank's waiting requests back this step. Each rank
    /// shares its running count at the end of a step, as vllm-ascend's DP ranks all-gather
    /// theirs; requests already running are scheduled either way.
    fn balance_holds(&self) -> bool {
        self.cfg.balance_scheduling
            && self
                .active
                .iter()
                .any(|&r| self.ranks[r as usize].at_seat_cap())
    }

    /// SGLang's prefill delayer ([`InstanceConfig::prefill_delay_passes`]): whether the coming
    /// step holds every rank's waiting prompts back. Its ranks are asked, as SGLang's DP ranks
    /// negotiate once per scheduler pass, whether they would admit a prompt: all or none, no
    /// delay; some, a delay of up to the passes less one, then the step admits. A step with
    /// nothing running is not held: SGLang's idle passes take no device time, so the delay
    /// would end before any step could run.
    fn delay_prefill(&mut self) -> bool {
        let max = self.cfg.prefill_delay_passes;
        if max == 0 {
            return false;
        }
        let ranks = self.active.iter().map(|&r| &self.ranks[r as usize]);
        let ready = ranks.clone().filter(|r| r.prefillable()).count() as u32;
        let mixed = ready > 0 && ready < self.cfg.dp_ranks;
        if mixed && ranks.clone().any(RankScheduler::runs) && self.delayed + 1 < max {
            self.delayed += 1;
            return true;
        }
        self.delayed = 0;
        false
    }

    /// Sets the EPLB layer move that the planned step installs.
    pub fn set_expert_move(&mut self, m: Option<crate::device::ExpertMove>) {
        self.plan.expert_move = m;
    }

    /// The plan of the last `schedule`.
    pub fn plan(&self) -> &StepPlan {
        &self.plan
    }

    /// [`StepPlan::totals`] of the last `schedule`'s plan, summed while planning.
    pub fn plan_totals(&self) -> PlanTotals {
        self.totals
    }

    /// Requests admitted for the first time by the last `schedule`, each with the prompt
    /// tokens its prefix-cache hits cover.
    pub fn started(&self) -> &[(ReqId, u32)] {
        &self.started
    }

    /// Remote-KV requests whose blocks the last `schedule` allocated: start their transfers.
    pub fn kv_pulls(&self) -> &[ReqId] {
        &self.pulls
    }

    /// Applies a step's outcome; appends what happened to requests to `events` (preemptions
    /// decided while scheduling come first) and returns the step's totals.
    pub fn apply(
        &mut self,
        _now: SimTime,
        outcome: &StepOutcome,
        events: &mut Vec<InstEvent>,
    ) -> StepSummary {
        events.append(&mut self.pending);
        self.emissions.clear();
        self.emitted_ids.clear();
        let mut sum = StepSummary::default();
        for (k, p) in self.plan.ranks.iter().enumerate() {
            // A rank that scheduled no request one by one settles its step itself when next
            // called: only its totals are needed here (one rank struct fewer touched per rank
            // and step in a long decode).
            if let Some(Some((tokens, continuing))) = self.trivial.get(k) {
                sum.tokens += tokens;
                sum.continuing += continuing;
                continue;
            }
            let r = &mut self.ranks[p.rank as usize];
            let before = r.used_blocks();
            r.update(
                outcome.accepted.get(k).map_or(&[][..], Vec::as_slice),
                outcome.sampled.get(k).map_or(&[][..], Vec::as_slice),
                &mut sum,
                events,
                &mut self.emissions,
                &mut self.emitted_ids,
            );
            self.used_blocks = self.used_blocks + r.used_blocks() - before;
            self.loads.set(p.rank, r.load());
        }
        self.steps += 1;
        forget_ended(&mut self.owner, events);
        sum
    }

    /// The events of a plan that will not run (it has no tokens): what its scheduling did to
    /// requests (a preemption, a send-back) happened all the same, and is appended to
    /// `events` now rather than with a step that may never come.
    pub fn take_unrun_events(&mut self, events: &mut Vec<InstEvent>) {
        forget_ended(&mut self.owner, &self.pending);
        events.append(&mut self.pending);
    }

    /// Steps applied so far (every rank steps in lockstep).
    pub fn steps(&self) -> u64 {
        self.steps
    }

    pub fn kv_arrived(&mut self, req: ReqId, _now: SimTime) {
        if let Some(&(r, slot)) = self.owner.get(req) {
            let steps = self.steps;
            self.on_rank(r, |rank| {
                // It computes from the next step on: bring the rank's counter to it first.
                if !rank.has_work() {
                    rank.catch_up(steps);
                }
                rank.kv_arrived(slot, req)
            });
        }
    }

    /// Frees a finished prefill request's KV after its transfer.
    pub fn release_kv(&mut self, req: ReqId) {
        if let Some((r, slot)) = self.owner.remove(req) {
            self.on_rank(r, |rank| rank.release(slot, req));
        }
    }

    /// Mean KV use over ranks, 0..1.
    pub fn kv_usage(&self) -> f64 {
        self.used_blocks as f64 / (self.cfg.num_kv_blocks * self.cfg.dp_ranks as u64) as f64
    }

    pub fn num_waiting(&self) -> usize {
        self.ranks.iter().map(RankScheduler::num_waiting).sum()
    }

    pub fn stats(&self) -> InstanceStats {
        let mut s = InstanceStats::default();
        for r in &self.ranks {
            s.prefix_queries += r.stats.prefix_queries;
            s.prefix_hits += r.stats.prefix_hits;
            s.preemptions += r.stats.preemptions;
            s.steady_steps += r.stats.steady_steps;
            s.exact_steps += r.stats.exact_steps;
            s.budget_fallbacks += r.stats.budget_fallbacks;
            s.running += r.num_running() as u64;
            s.waiting += r.num_waiting() as u64;
            s.pulling += r.num_pulling() as u64;
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::Loads;

    #[test]
    fn the_least_loaded_rank_is_the_lowest_index_of_the_smallest_load() {
        for ranks in [1usize, 2, 3, 7, 8, 320] {
            let mut loads = Loads::new(ranks);
            let mut plain = vec![0usize; ranks];
            // A fixed pseudo-random walk of loads (an LCG), checked against a scan.
            let mut x = 12345u64;
            for _ in 0..2000 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let r = (x >> 33) as usize % ranks;
                let load = (x >> 20) as usize % 5;
                loads.set(r as u32, load);
                plain[r] = load;
                let want = (0..ranks).min_by_key(|&i| (plain[i], i)).unwrap();
                assert_eq!(loads.least() as usize, want, "{ranks} ranks: {plain:?}");
            }
        }
    }
}
