//! The scheduler of one DP rank, vLLM v1 semantics (docs/ARCHITECTURE.md, "Semantics"): one token budget per step;
//! running requests first, then waiting ones up to `max_num_seqs`; chunked prefill; paged KV with
//! prefix caching; preemption of the newest running request when KV runs out; MTP lookahead slots
//! and rollback of rejected drafts. IO-free: time comes in as an argument.
//!
//! Requests live in a slab; queues hold slab indices. What happens to requests is reported in
//! aggregate (tokens emitted, requests that emitted in consecutive steps) plus one event per
//! request only when something happens to it (first token, a gap, finish, preemption).
//!
//! **Steady decoding in aggregate.** When the device's MTP acceptance is a known function of
//! (request, output position) ([`Acceptance`], the twin's model), a request that is simply
//! decoding is not touched every step. After a step, such a request is scanned ahead to its next
//! event: the step that needs a new KV block, the step it finishes in, the step `max_model_len`
//! would clip it, or the end of the lookahead window. Until then it is *steady*: it computes
//! 1 + k tokens per step, needs no allocation, and samples every step. Its contribution to the
//! rank's batch shape comes from per-rank sums (steady requests and their contexts, per
//! attention regime); the tokens it keeps each step are written into a ring indexed by step, and
//! the sums advance by one ring cell per step. Its window end sits in a small heap with the
//! context it will have then. At its event step the request rejoins the running list and that
//! step is scheduled exactly. The result is the same schedule, the same shapes and the same events as stepping
//! every request (a property test compares the two), with per-step work independent of the
//! number of steady requests.
//!
//! Order is kept: every running request has an admission order; the running list holds the
//! non-steady ones in that order, and preemption takes the newest of both sets. When the token
//! budget could bind (steady demand plus the others' demand, async phantoms included, exceeds
//! it), every steady request is brought back and the step is scheduled request by request; the
//! rank then stays exact for [`COOLDOWN`] steps so that a budget-bound rank does not rescan its
//! requests every step.

use super::kv::{chain, BlockPool};
use super::{InstEvent, InstanceConfig, NewRequest, StepSummary};
use crate::batch::BatchShape;
use crate::device::{DecodeSeq, FinishReason, RankPlan, ReqId, Sampled, ScheduledReq};
use crate::layout::Role;
use crate::mtp::Acceptance;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Waiting,
    /// Blocks allocated, KV on its way from a prefill instance.
    Pulling,
    Running,
    /// Finished on a prefill instance; blocks held until the KV has been sent.
    Held,
}

#[derive(Clone, Debug)]
struct Seq {
    id: ReqId,
    prompt: u32,
    max_output: u32,
    computed: u32,
    output: u32,
    blocks: Vec<u32>,
    /// Chained hashes of the prompt's full blocks (empty: never shared).
    hashes: Vec<u64>,
    /// Prompt blocks already registered in the prefix cache.
    hashed: u32,
    state: State,
    remote: bool,
    admitted_once: bool,
    /// The rank step in which it last sampled.
    last_step: u64,
    /// Sampling steps taken (indexes acceptance draws).
    samples: u32,
    /// Position in the running order (larger: admitted later).
    order: u64,
    /// Steady window: plan steps `from..until` (until 0: not steady). While steady, `computed`,
    /// `output`, `samples` and `last_step` already hold their values at `until`; `base_*` hold
    /// them at `from`.
    from: u64,
    until: u64,
    base_computed: u32,
    base_output: u32,
    /// Index in the rank's steady list.
    steady_idx: u32,
    /// `LIN` or `SAT` while steady.
    regime: u8,
    /// Token ids (prompt, then every kept output token) when the workload has them.
    tokens: Vec<u32>,
    /// The device has been given the token ids since the request was (re)admitted.
    shown: bool,
}

/// Ring cells: steps a steady window can span (at most `RING - 2`).
const RING: usize = 128;
/// Steps a rank stays exact after a step whose budget could bind.
pub const COOLDOWN: u64 = 64;

/// Regimes of a steady window under capped (sparse) attention: `LIN`, every key of every query
/// within the cap (or no cap), so pairs grow with the context; `SAT`, every query at the cap. A
/// window never spans the few steps in between (they run exactly).
const LIN: usize = 0;
const SAT: usize = 1;

/// The steady requests of the current step, per regime: how many and the sum of their contexts;
/// the tokens the last step added to those contexts and the windows starting at the next step,
/// both applied when the next step is planned.
#[derive(Clone, Copy, Debug, Default)]
struct SteadySums {
    seqs: [i64; 2],
    context: [i64; 2],
    pending: [u64; 2],
    entering: [i64; 2],
    entering_context: [i64; 2],
}

/// A steady window's end (16 bytes): the plan step it ends at, and the slot and start step that
/// identify the window (a slot is reused only by a request admitted after its window started, so
/// a window that ended early is recognised and skipped). Its regime and context are the
/// request's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct WindowEnd {
    step: u64,
    slot: u32,
    from: u32,
}

/// Per-step bookkeeping of one scheduled request.
#[derive(Clone, Copy, Debug)]
struct Entry {
    slot: u32,
    new: u32,
    drafts: u32,
    samples: bool,
}

/// Counters a rank keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RankStats {
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    pub preemptions: u64,
    /// Request-steps advanced in aggregate (steady) and one by one.
    pub steady_steps: u64,
    pub exact_steps: u64,
    /// Steps whose budget could bind with steady requests in the rank.
    pub budget_fallbacks: u64,
}

/// One DP rank's scheduler.
#[derive(Clone, Debug)]
pub struct RankScheduler {
    cfg: InstanceConfig,
    pool: BlockPool,
    slab: Vec<Option<Seq>>,
    free_slots: Vec<u32>,
    waiting: VecDeque<u32>,
    running: Vec<u32>,
    pulling: usize,
    entries: Vec<Entry>,
    finished: Vec<u32>,
    /// Steps applied so far.
    step: u64,
    pub stats: RankStats,
    /// Known MTP acceptance: enables steady decoding in aggregate.
    acceptance: Option<Acceptance>,
    steady: Vec<u32>,
    sums: SteadySums,
    /// Per step (ring cell) and regime: tokens the steady requests compute and keep. The only
    /// per-request-step write; cells of 4 bytes per regime keep a rank's ring in cache.
    tokens: Vec<u32>,
    /// Regimes in use: 1 (dense attention) or 2 (capped).
    regimes: usize,
    /// Window ends, earliest first.
    due: BinaryHeap<Reverse<WindowEnd>>,
    /// The earliest step in `due` (u64::MAX: none), beside the rank's other hot fields.
    next_due: u64,
    /// The last plan step whose ring cell was applied (+1; 0: none).
    advanced: u64,
    /// No request turns steady before this plan step.
    exact_until: u64,
    next_order: u64,
    /// Steady requests in the last plan.
    planned_steady: u64,
    /// Async scheduling: contexts of requests that finished in the last step; the step
    /// scheduled before that was known computes one more (discarded) decode step for each.
    phantoms: Vec<u32>,
    /// Report every request's tokens per step (serving streams them); off in the simulator.
    pub report_emissions: bool,
    /// Requests a device stopped in the step being applied (EOS).
    stopped: Vec<ReqId>,
    /// Fill the plan's per-request entries (a device that executes requests).
    pub detail: bool,
    /// Requests whose device state may be dropped, handed to the device with the next plan.
    freed: Vec<ReqId>,
}

fn blocks_for(tokens: u64, bs: u32) -> u64 {
    tokens.div_ceil(bs as u64)
}

impl RankScheduler {
    pub fn new(cfg: InstanceConfig) -> Self {
        RankScheduler {
            pool: if cfg.enable_prefix_caching {
                BlockPool::new(cfg.num_kv_blocks)
            } else {
                BlockPool::without_caching(cfg.num_kv_blocks)
            },
            cfg,
            slab: Vec::new(),
            free_slots: Vec::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            pulling: 0,
            entries: Vec::new(),
            finished: Vec::new(),
            step: 0,
            stats: RankStats::default(),
            acceptance: None,
            steady: Vec::new(),
            sums: SteadySums::default(),
            tokens: Vec::new(),
            regimes: if cfg.attn_cap.0.is_some() { 2 } else { 1 },
            due: BinaryHeap::new(),
            next_due: u64::MAX,
            advanced: 0,
            exact_until: 0,
            next_order: 0,
            planned_steady: 0,
            phantoms: Vec::new(),
            report_emissions: false,
            stopped: Vec::new(),
            detail: false,
            freed: Vec::new(),
        }
    }

    /// Lets the rank advance steadily decoding requests in aggregate, drawing their MTP acceptance
    /// from `a` (which must be what the device draws). `None` steps every request.
    pub fn set_acceptance(&mut self, a: Option<Acceptance>) {
        assert!(
            self.steady.is_empty(),
            "acceptance changes only between requests"
        );
        self.acceptance = a;
        if a.is_some() && self.tokens.is_empty() {
            self.tokens = vec![0; RING * self.regimes];
        }
    }

    fn seq(&self, slot: u32) -> &Seq {
        self.slab[slot as usize].as_ref().expect("live slot")
    }

    fn seq_mut(slab: &mut [Option<Seq>], slot: u32) -> &mut Seq {
        slab[slot as usize].as_mut().expect("live slot")
    }

    /// Requests this rank holds that are not finished (for DP load balancing).
    pub fn load(&self) -> usize {
        self.waiting.len() + self.running.len() + self.steady.len() + self.pulling
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_running(&self) -> usize {
        self.running.len() + self.steady.len()
    }

    pub fn kv_usage(&self) -> f64 {
        self.pool.used() as f64 / self.pool.total() as f64
    }

    pub fn has_work(&self) -> bool {
        !self.running.is_empty()
            || !self.steady.is_empty()
            || !self.waiting.is_empty()
            || !self.phantoms.is_empty()
    }

    /// Chained hashes of the prompt's full blocks, from hash ids of `hash_block_tokens` tokens.
    fn block_hashes(&self, r: &NewRequest<'_>) -> Vec<u64> {
        let bs = self.cfg.block_size;
        if !self.cfg.enable_prefix_caching
            || r.remote_kv
            || r.hash_ids.is_empty()
            || r.hash_block_tokens == 0
        {
            return Vec::new();
        }
        let hbt = r.hash_block_tokens;
        let mut parent = 0;
        (0..r.prompt_tokens / bs)
            .map_while(|j| {
                let tok = j * bs;
                let id = *r.hash_ids.get((tok / hbt) as usize)?;
                parent = chain(parent, chain(id, ((tok % hbt) / bs) as u64));
                Some(parent)
            })
            .collect()
    }

    /// Queues a request; returns its slot (the handle for [`RankScheduler::kv_arrived`] and
    /// [`RankScheduler::release`]).
    pub fn add(&mut self, r: NewRequest<'_>) -> u32 {
        let seq = Seq {
            id: r.id,
            prompt: r.prompt_tokens,
            max_output: r.max_output_tokens,
            computed: 0,
            output: 0,
            blocks: Vec::new(),
            hashes: self.block_hashes(&r),
            hashed: 0,
            state: State::Waiting,
            remote: r.remote_kv,
            admitted_once: false,
            last_step: 0,
            samples: 0,
            order: 0,
            from: 0,
            until: 0,
            base_computed: 0,
            base_output: 0,
            steady_idx: 0,
            regime: 0,
            tokens: r.token_ids.map(<[u32]>::to_vec).unwrap_or_default(),
            shown: false,
        };
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.slab[s as usize] = Some(seq);
                s
            }
            None => {
                self.slab.push(Some(seq));
                (self.slab.len() - 1) as u32
            }
        };
        self.waiting.push_back(slot);
        slot
    }

    fn remove(&mut self, slot: u32) -> Seq {
        let s = self.slab[slot as usize].take().expect("live slot");
        self.free_slots.push(slot);
        s
    }

    /// Makes a request's KV hold `tokens` tokens.
    fn ensure_slots(pool: &mut BlockPool, s: &mut Seq, tokens: u64, bs: u32) -> bool {
        let need = blocks_for(tokens, bs).saturating_sub(s.blocks.len() as u64);
        need == 0 || pool.allocate(need, &mut s.blocks)
    }

    /// Frees a request's blocks and resets it for recompute (or hands it back).
    fn preempt(&mut self, slot: u32, events: &mut Vec<InstEvent>) {
        let s = Self::seq_mut(&mut self.slab, slot);
        self.pool.release(&s.blocks);
        s.blocks.clear();
        s.computed = 0;
        s.hashed = 0;
        s.shown = false;
        let id = s.id;
        if self.detail {
            self.freed.push(id);
        }
        self.stats.preemptions += 1;
        if self.cfg.send_back && self.cfg.role != Role::Prefill {
            let s = self.remove(slot);
            events.push(InstEvent::SentBack {
                req: s.id,
                emitted: s.output,
            });
        } else {
            // A recomputed request computes its prompt and the tokens it already produced.
            s.remote = false;
            s.state = State::Waiting;
            let id = s.id;
            self.waiting.push_front(slot);
            events.push(InstEvent::Preempted { req: id });
        }
    }

    /// The plan entry of a scheduled request, for a device that executes requests.
    fn detail_entry(
        slab: &mut [Option<Seq>],
        plan: &mut RankPlan,
        slot: u32,
        new: u32,
        samples: bool,
        drafts: u32,
    ) {
        let s = Self::seq_mut(slab, slot);
        let token_ids = (!s.shown && !s.tokens.is_empty()).then(|| s.tokens.as_slice().into());
        s.shown = true;
        plan.reqs.push(ScheduledReq {
            req: s.id,
            token_ids,
            computed: s.computed,
            new_tokens: new,
            blocks: s.blocks.clone(),
            samples,
            drafts,
        });
    }

    /// Tokens a running request would compute this step before the budget, and whether it is
    /// decoding (only its last sampled token is not in KV yet).
    fn demand(cfg: &InstanceConfig, s: &Seq) -> (u64, bool) {
        // Tokens whose ids are known: the prompt and what was sampled. A request decodes when
        // only the last sampled token is not in KV yet; otherwise it (re)computes known tokens.
        let known = s.prompt + s.output;
        let decoding = s.output > 0 && s.computed + 1 >= known;
        let target = known as u64
            + if decoding {
                cfg.num_spec_tokens as u64
            } else {
                0
            };
        let mut new = target.saturating_sub(s.computed as u64);
        if !decoding && cfg.long_prefill_token_threshold > 0 {
            new = new.min(cfg.long_prefill_token_threshold as u64);
        }
        (
            new.min(cfg.max_model_len.saturating_sub(s.computed as u64)),
            decoding,
        )
    }

    /// Ring index of `step`'s cell for `regime`.
    fn at(&self, step: u64, regime: usize) -> usize {
        (step % RING as u64) as usize * self.regimes + regime
    }

    /// Inserts a running request into the running list at its place in the running order.
    fn insert_running(&mut self, slot: u32) {
        let order = self.seq(slot).order;
        let slab = &self.slab;
        let at = self
            .running
            .partition_point(|&x| slab[x as usize].as_ref().expect("live slot").order < order);
        self.running.insert(at, slot);
    }

    fn leave_steady(&mut self, slot: u32) {
        let s = Self::seq_mut(&mut self.slab, slot);
        let idx = s.steady_idx as usize;
        s.until = 0;
        self.steady.swap_remove(idx);
        if let Some(&moved) = self.steady.get(idx) {
            Self::seq_mut(&mut self.slab, moved).steady_idx = idx as u32;
        }
    }

    /// Advances the steady sums to plan step `p` (once per step) and returns the requests whose
    /// steady window ends at `p` to the running list.
    fn advance(&mut self, p: u64) {
        if self.tokens.is_empty() || self.advanced > p {
            return;
        }
        self.advanced = p + 1;
        let sm = &mut self.sums;
        for r in [LIN, SAT] {
            sm.context[r] += std::mem::take(&mut sm.pending[r]) as i64
                + std::mem::take(&mut sm.entering_context[r]);
            sm.seqs[r] += std::mem::take(&mut sm.entering[r]);
        }
        if self.next_due > p {
            return;
        }
        while let Some(&Reverse(w)) = self.due.peek() {
            if w.step > p {
                break;
            }
            self.due.pop();
            // A window ended early (preemption, a binding budget) left its entry behind.
            let ends = self.slab[w.slot as usize]
                .as_ref()
                .filter(|s| s.until == p && s.from as u32 == w.from)
                .map(|s| (s.regime as usize, s.computed));
            if let Some((r, context)) = ends {
                self.sums.seqs[r] -= 1;
                self.sums.context[r] -= context as i64;
                self.leave_steady(w.slot);
                self.insert_running(w.slot);
            }
        }
        self.next_due = self.due.peek().map_or(u64::MAX, |e| e.0.step);
    }

    /// Scans a request that has just sampled in plan step `q0 - 1` ahead to its next event and,
    /// if it stays simply decoding for at least one step, makes it steady until then.
    fn try_steady(&mut self, slot: u32, q0: u64) -> bool {
        let Some(acc) = self.acceptance else {
            return false;
        };
        if q0 < self.exact_until || self.report_emissions {
            return false;
        }
        let cfg = self.cfg;
        let bs = cfg.block_size;
        let k = cfg.num_spec_tokens;
        let t = 1 + k as u64;
        let s = self.slab[slot as usize].as_mut().expect("live slot");
        let full = ((s.prompt / bs) as usize).min(s.hashes.len());
        if s.state != State::Running
            || s.until != 0
            || s.output == 0
            || s.output >= s.max_output
            || s.computed + 1 != s.prompt + s.output
            || s.last_step != q0
            || (s.hashed as usize) < full
        {
            return false;
        }
        // Keys per query: all of them below the cap, the cap above it.
        let (regime, lin_limit) = match cfg.attn_cap.0 {
            None => (LIN, u64::MAX),
            Some(c) if s.computed as u64 >= c => (SAT, u64::MAX),
            Some(c) => (LIN, c),
        };
        // In a window c - o stays fixed (c = prompt + o - 1): one bound on o covers the block
        // capacity, max_model_len and the cap for the next step.
        let capacity = s.blocks.len() as u64 * bs as u64;
        let c_limit = (capacity.saturating_sub(t + k as u64))
            .min(cfg.max_model_len.saturating_sub(t))
            .min(lin_limit.saturating_sub(t));
        let offset = s.computed - s.output;
        let o_limit = c_limit.saturating_sub(offset as u64).min(u32::MAX as u64) as u32;
        if (s.computed as u64) > c_limit {
            return false;
        }
        let draws = acc.request(s.id);
        let max_o = s.max_output;
        let j0 = s.samples;
        let mut o = s.output;
        let mut q = q0;
        let w = (RING - 2) as u64;
        let regimes = self.regimes;
        let tokens = &mut self.tokens;
        // The next step would allocate a block, be clipped by max_model_len, have queries past
        // the cap, or finish the request: then the window ends.
        while q - q0 < w && o <= o_limit {
            let e = 1 + draws.accepted(j0 + (q - q0) as u32, k);
            if o + e >= max_o {
                break;
            }
            tokens[(q % RING as u64) as usize * regimes + regime] += e;
            o += e;
            q += 1;
        }
        let c = o + offset;
        if q == q0 {
            return false;
        }
        // It joins the sums when step q0 is planned and leaves them at q.
        self.sums.entering[regime] += 1;
        self.sums.entering_context[regime] += s.computed as i64;
        self.due.push(Reverse(WindowEnd {
            step: q,
            slot,
            from: q0 as u32,
        }));
        self.next_due = self.next_due.min(q);
        s.base_computed = s.computed;
        s.base_output = s.output;
        s.from = q0;
        s.until = q;
        s.regime = regime as u8;
        s.computed = c;
        s.output = o;
        s.samples += (q - q0) as u32;
        // It samples in every step of the window; the last is plan step q - 1.
        s.last_step = q;
        s.steady_idx = self.steady.len() as u32;
        self.steady.push(slot);
        true
    }

    /// Takes steady request `slot` out of its window at plan step `p` (`from <= p < until`,
    /// before step `p` runs): its state becomes its state at `p`, and the rest of its window
    /// leaves the sums and the ring.
    fn unsteady(&mut self, slot: u32, p: u64) {
        let acc = self.acceptance.expect("steady requests need acceptance");
        let k = self.cfg.num_spec_tokens;
        let s = self.slab[slot as usize].as_mut().expect("live slot");
        debug_assert!(
            s.from <= p && p < s.until,
            "plan step {p} inside the window"
        );
        let r = s.regime as usize;
        let draws = acc.request(s.id);
        let (mut c, mut o) = (s.base_computed, s.base_output);
        let mut at_p = (c, o);
        let j0 = s.samples - (s.until - s.from) as u32;
        for q in s.from..s.until {
            // Inside a window every step emits 1 + accepted.
            let emitted = 1 + draws.accepted(j0 + (q - s.from) as u32, k);
            if q == p {
                at_p = (c, o);
            }
            if q >= p {
                let i = (q % RING as u64) as usize * self.regimes + r;
                self.tokens[i] -= emitted;
            }
            c += emitted;
            o += emitted;
        }
        // Its entry in `due` is left behind and skipped when it comes up.
        self.sums.seqs[r] -= 1;
        self.sums.context[r] -= at_p.0 as i64;
        debug_assert_eq!(c, s.computed, "the rescan lands where the window ends");
        (s.computed, s.output) = at_p;
        s.samples = j0 + (p - s.from) as u32;
        s.last_step = p;
        self.leave_steady(slot);
    }

    /// Removes the newest running request (steady or not) from the running set for preemption.
    /// A steady one gives its share of the budget back.
    fn pop_newest(&mut self, p: u64, budget: &mut u64) -> Option<u32> {
        let last = self.running.last().map(|&x| self.seq(x).order);
        let newest_steady = self
            .steady
            .iter()
            .copied()
            .max_by_key(|&x| self.seq(x).order);
        match newest_steady {
            Some(st) if last.is_none_or(|o| self.seq(st).order > o) => {
                self.unsteady(st, p);
                *budget += 1 + self.cfg.num_spec_tokens as u64;
                Some(st)
            }
            _ => self.running.pop(),
        }
    }

    /// Plans this rank's step into `plan`; requests admitted for the first time go to `started`,
    /// remote-KV requests whose blocks are now allocated go to `pulls`.
    pub fn schedule(
        &mut self,
        plan: &mut RankPlan,
        started: &mut Vec<ReqId>,
        pulls: &mut Vec<ReqId>,
        events: &mut Vec<InstEvent>,
    ) {
        plan.shape = BatchShape::default();
        plan.decode.clear();
        plan.reqs.clear();
        plan.freed.clear();
        plan.freed.append(&mut self.freed);
        self.entries.clear();
        let p = self.step;
        self.advance(p);
        let cfg = self.cfg;
        let bs = cfg.block_size;
        let k = cfg.num_spec_tokens;
        let cap = cfg.attn_cap;
        let mut budget = cfg.max_num_batched_tokens as u64;
        // Steady requests take 1 + k tokens each. If the budget could bind, the running order
        // decides who gets it: schedule request by request. Async scheduling's phantoms (last
        // step's finished requests) take their tokens before any running request.
        let steady_demand = self.steady.len() as u64 * (1 + k as u64);
        if steady_demand > 0 {
            let phantom_demand = self.phantoms.len() as u64 * (1 + k as u64);
            let others: u64 = self
                .running
                .iter()
                .map(|&x| Self::demand(&cfg, self.seq(x)).0)
                .sum();
            if steady_demand + phantom_demand + others > budget {
                self.stats.budget_fallbacks += 1;
                self.exact_until = p + COOLDOWN;
                while let Some(&slot) = self.steady.last() {
                    self.unsteady(slot, p);
                    self.insert_running(slot);
                }
            }
        }
        budget -= self.steady.len() as u64 * (1 + k as u64);
        // Async scheduling: last step's finished requests, not yet known to be finished when
        // this step was scheduled, take their slot once more.
        let phantoms = self.phantoms.len();
        for c in self.phantoms.drain(..) {
            let t = (1 + k as u64).min(budget);
            plan.shape.add_decode(t, c as u64, cap);
            budget -= t;
        }
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let slot = self.running[i];
            let s = self.seq(slot);
            let known = s.prompt + s.output;
            let (new, decoding) = Self::demand(&cfg, s);
            let new = new.min(budget);
            if new == 0 {
                i += 1;
                continue;
            }
            // Allocate (with k lookahead slots for the next drafts), preempting the newest
            // running requests until it fits.
            let mut fits = false;
            loop {
                let s = Self::seq_mut(&mut self.slab, slot);
                if Self::ensure_slots(&mut self.pool, s, s.computed as u64 + new + k as u64, bs) {
                    fits = true;
                    break;
                }
                let victim = self
                    .pop_newest(p, &mut budget)
                    .expect("the current request is running");
                self.preempt(victim, events);
                preempted = true;
                if victim == slot {
                    break;
                }
            }
            if !fits {
                // The current request was the newest and is gone; nothing after it remains.
                break;
            }
            let s = self.seq(slot);
            let samples = s.computed as u64 + new >= known as u64;
            let drafts = if decoding { (new - 1) as u32 } else { 0 };
            if decoding {
                plan.shape.add_decode(new, s.computed as u64, cap);
            } else {
                plan.shape.add_prefill(new, s.computed as u64, cap);
            }
            if samples {
                plan.decode.push(DecodeSeq {
                    req: s.id,
                    drafts,
                    step: s.samples,
                });
            }
            self.entries.push(Entry {
                slot,
                new: new as u32,
                drafts,
                samples,
            });
            if self.detail {
                Self::detail_entry(&mut self.slab, plan, slot, new as u32, samples, drafts);
            }
            budget -= new;
            i += 1;
        }
        // Waiting requests: only if nothing was preempted, within budget and max_num_seqs.
        while !preempted
            && budget > 0
            && self.running.len() + self.steady.len() + self.pulling + phantoms
                < cfg.max_num_seqs as usize
        {
            let Some(&slot) = self.waiting.front() else {
                break;
            };
            let s = Self::seq_mut(&mut self.slab, slot);
            if s.remote {
                // Reserve the whole prompt plus the first decode step, then pull the KV.
                let need = s.prompt as u64 + 1 + k as u64;
                if !Self::ensure_slots(&mut self.pool, s, need, bs) {
                    break;
                }
                s.state = State::Pulling;
                pulls.push(s.id);
                self.waiting.pop_front();
                self.pulling += 1;
                continue;
            }
            // Prefix hits on first admission: full cached blocks, at most prompt - 1 tokens so the
            // last token is computed to get logits.
            let max_hit_blocks = (s.prompt.saturating_sub(1) / bs) as usize;
            let hit = s
                .hashes
                .iter()
                .take(max_hit_blocks)
                .take_while(|h| self.pool.lookup(**h).is_some())
                .count();
            let cached = (hit as u32) * bs;
            let known = s.prompt + s.output;
            let mut new = (known - cached) as u64;
            if !cfg.enable_chunked_prefill && new > budget {
                break;
            }
            if cfg.long_prefill_token_threshold > 0 {
                new = new.min(cfg.long_prefill_token_threshold as u64);
            }
            new = new.min(budget);
            let need_new_blocks =
                blocks_for(cached as u64 + new + k as u64, bs).saturating_sub(hit as u64);
            // Hit blocks that sit unreferenced in the free queue leave it when touched.
            let hits_in_free = s.hashes[..hit]
                .iter()
                .filter(|h| self.pool.lookup(**h).is_some_and(|b| self.pool.is_free(b)))
                .count() as u64;
            if need_new_blocks + hits_in_free > self.pool.free() {
                // Waiting requests never preempt.
                break;
            }
            for h in &s.hashes[..hit] {
                let b = self.pool.lookup(*h).expect("looked up above");
                self.pool.touch(b);
                s.blocks.push(b);
            }
            let ok = Self::ensure_slots(&mut self.pool, s, cached as u64 + new + k as u64, bs);
            assert!(
                ok,
                "request {}: free blocks were counted before admission",
                s.id
            );
            s.hashed = hit as u32;
            s.computed = cached;
            if !s.admitted_once {
                self.stats.prefix_queries += s.prompt as u64;
                self.stats.prefix_hits += cached as u64;
                s.admitted_once = true;
                started.push(s.id);
            }
            s.state = State::Running;
            s.order = self.next_order;
            self.next_order += 1;
            let samples = cached as u64 + new >= known as u64;
            plan.shape.add_prefill(new, cached as u64, cap);
            if samples {
                plan.decode.push(DecodeSeq {
                    req: s.id,
                    drafts: 0,
                    step: s.samples,
                });
            }
            self.entries.push(Entry {
                slot,
                new: new as u32,
                drafts: 0,
                samples,
            });
            if self.detail {
                Self::detail_entry(&mut self.slab, plan, slot, new as u32, samples, 0);
            }
            self.waiting.pop_front();
            self.running.push(slot);
            budget -= new;
        }
        // The steady requests' share, from their sums: each computes t = 1 + k query tokens
        // after its context c, t*c + t(t+1)/2 pairs (capped: t*cap once c >= cap).
        let n = self.steady.len() as u64;
        let sm = self.sums;
        debug_assert_eq!(sm.seqs[LIN] + sm.seqs[SAT], n as i64, "steady count");
        if n > 0 {
            let t = 1 + k as u64;
            let tri = t * (t + 1) / 2;
            let (lin, sat) = (sm.seqs[LIN] as u64, sm.seqs[SAT] as u64);
            let (clin, csat) = (sm.context[LIN] as u64, sm.context[SAT] as u64);
            let capped_sat = cap.0.map_or(0, |c| sat * t * c);
            plan.shape.add_decode_sums(
                n,
                n * t,
                t * (clin + csat) + n * tri,
                t * clin + lin * tri + capped_sat,
            );
        }
        self.planned_steady = n;
        self.stats.steady_steps += n;
        self.stats.exact_steps += self.entries.len() as u64;
        #[cfg(debug_assertions)]
        self.check();
    }

    /// Applies a step's outcome: `accepted[j]` drafts for the j-th sampling entry. Adds the
    /// tokens emitted to `sum` and reports first tokens, gaps and finishes in `events`.
    ///
    /// A device that returns tokens gives `sampled` (one per sampling entry, like `accepted`):
    /// its token ids are kept and streamed (`emitted_ids`, in emission order), and a finish
    /// reason ends the request early.
    pub fn update(
        &mut self,
        accepted: &[u32],
        sampled: &[Sampled],
        sum: &mut StepSummary,
        events: &mut Vec<InstEvent>,
        emissions: &mut Vec<(ReqId, u32)>,
        emitted_ids: &mut Vec<u32>,
    ) {
        let p = self.step;
        self.step += 1;
        let step = self.step;
        let bs = self.cfg.block_size;
        // Steady requests sampled in this step and in the one before.
        if !self.tokens.is_empty() {
            for r in 0..self.regimes {
                let i = self.at(p, r);
                let tk = std::mem::take(&mut self.tokens[i]) as u64;
                sum.tokens += tk;
                self.sums.pending[r] += tk;
            }
            sum.continuing += self.planned_steady;
        }
        let mut j = 0;
        for e in &self.entries {
            let Some(s) = self.slab[e.slot as usize].as_mut() else {
                continue;
            };
            if s.state != State::Running {
                continue;
            }
            s.computed += e.new;
            // Register newly completed prompt blocks in the prefix cache.
            let full = ((s.computed.min(s.prompt) / bs) as usize).min(s.hashes.len());
            while (s.hashed as usize) < full {
                self.pool
                    .set_hash(s.blocks[s.hashed as usize], s.hashes[s.hashed as usize]);
                s.hashed += 1;
            }
            if !e.samples {
                continue;
            }
            let got = sampled.get(j);
            let acc = match got {
                Some(g) => (g.token_ids.len().max(1) as u32 - 1).min(e.drafts),
                None => accepted.get(j).copied().unwrap_or(0).min(e.drafts),
            };
            j += 1;
            // Rejected drafts roll back.
            s.computed -= e.drafts - acc;
            let mut emitted = (1 + acc).min(s.max_output - s.output);
            let mut stop = false;
            if let Some(g) = got {
                emitted = emitted.min(g.token_ids.len() as u32);
                stop = g.finish == Some(FinishReason::Stop);
                let kept = &g.token_ids[..emitted as usize];
                s.tokens.extend_from_slice(kept);
                emitted_ids.extend_from_slice(kept);
            }
            if s.output == 0 {
                events.push(InstEvent::First { req: s.id });
            } else if s.last_step + 1 == step {
                sum.continuing += 1;
            } else {
                events.push(InstEvent::Gap {
                    req: s.id,
                    since_step: s.last_step,
                });
            }
            s.last_step = step;
            s.samples += 1;
            s.output += emitted;
            if self.report_emissions {
                emissions.push((s.id, emitted));
            }
            sum.tokens += emitted as u64;
            if stop {
                s.max_output = s.output;
                self.stopped.push(s.id);
            }
            if s.output >= s.max_output {
                self.finished.push(e.slot);
            }
        }
        let mut finished = std::mem::take(&mut self.finished);
        if !finished.is_empty() {
            self.running.retain(|r| !finished.contains(r));
            for &slot in &finished {
                if self.cfg.role == Role::Prefill {
                    Self::seq_mut(&mut self.slab, slot).state = State::Held;
                } else {
                    let s = self.remove(slot);
                    self.pool.release(&s.blocks);
                    if self.cfg.async_scheduling {
                        self.phantoms.push(s.computed);
                    }
                    if self.detail {
                        self.freed.push(s.id);
                    }
                    let reason = if self.stopped.contains(&s.id) {
                        FinishReason::Stop
                    } else {
                        FinishReason::Length
                    };
                    events.push(InstEvent::Finished { req: s.id, reason });
                }
            }
        }
        finished.clear();
        self.finished = finished;
        self.stopped.clear();
        // Requests that are now simply decoding go steady until their next event.
        if self.acceptance.is_some() && step >= self.exact_until {
            let mut any = false;
            for i in 0..self.entries.len() {
                let e = self.entries[i];
                if e.samples && self.slab[e.slot as usize].is_some() {
                    any |= self.try_steady(e.slot, step);
                }
            }
            if any {
                let slab = &self.slab;
                self.running
                    .retain(|&x| slab[x as usize].as_ref().is_some_and(|s| s.until == 0));
            }
        }
        #[cfg(debug_assertions)]
        self.check();
    }

    /// The block table of request `id` in `slot`.
    pub fn blocks_of(&self, slot: u32, id: ReqId) -> Option<&[u32]> {
        self.slab
            .get(slot as usize)
            .and_then(Option::as_ref)
            .filter(|s| s.id == id)
            .map(|s| s.blocks.as_slice())
    }

    /// Blocks held by requests (the KV in use).
    pub fn used_blocks(&self) -> u64 {
        self.pool.used()
    }

    /// Requests whose device state may be dropped wait for the next plan.
    pub fn has_freed(&self) -> bool {
        !self.freed.is_empty()
    }

    /// Brings an idle rank's step counter to the instance's: the instance plans and applies
    /// only ranks with work, and an idle rank steps nothing (its part of a lockstep step is
    /// the device's dummy batch). Call before scheduling a rank that sat steps out.
    pub fn catch_up(&mut self, steps: u64) {
        if self.step >= steps {
            return;
        }
        // A rank that was idle when the last step was planned may have been handed requests
        // since (arrivals, pulled KV); they sat that step out, as they would have in it.
        debug_assert!(
            self.steady.is_empty() && self.phantoms.is_empty(),
            "only a rank without steady or finishing requests sits steps out"
        );
        // Fold what the last step left in the sums, then move the ring: with no steady request
        // every cell is empty.
        self.advance(self.step);
        debug_assert!(
            self.tokens.iter().all(|&c| c == 0),
            "an idle rank's ring is empty"
        );
        self.step = steps;
        if !self.tokens.is_empty() {
            self.advanced = steps;
        }
    }

    /// The rank's step counter (steps applied so far).
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// The KV of pulling request `id` in `slot` has arrived: it decodes from the next step.
    pub fn kv_arrived(&mut self, slot: u32, id: ReqId) {
        if let Some(s) = self.slab.get_mut(slot as usize).and_then(Option::as_mut) {
            if s.id == id && s.state == State::Pulling {
                s.state = State::Running;
                // The prompt's KV is here; the last prompt token is computed again for its
                // logits, and that step samples the first output token.
                s.computed = s.prompt.saturating_sub(1);
                s.order = self.next_order;
                self.next_order += 1;
                self.pulling -= 1;
                self.running.push(slot);
            }
        }
    }

    /// Drops request `id` in `slot` whatever its state (a client went away) and frees its
    /// blocks. Call between `update` and the next `schedule`. Returns false if it is not here.
    pub fn abort(&mut self, slot: u32, id: ReqId) -> bool {
        let Some(state) = self
            .slab
            .get(slot as usize)
            .and_then(Option::as_ref)
            .filter(|s| s.id == id)
            .map(|s| s.state)
        else {
            return false;
        };
        match state {
            State::Waiting => self.waiting.retain(|&x| x != slot),
            State::Pulling => self.pulling -= 1,
            State::Running => {
                if self.seq(slot).until != 0 {
                    // Bring the sums to the coming step, then take it out of its window.
                    let p = self.step;
                    self.advance(p);
                    if self.seq(slot).until != 0 {
                        self.unsteady(slot, p);
                    } else {
                        self.running.retain(|&x| x != slot);
                    }
                } else {
                    self.running.retain(|&x| x != slot);
                }
            }
            State::Held => {}
        }
        let s = self.remove(slot);
        self.pool.release(&s.blocks);
        if self.detail {
            self.freed.push(s.id);
        }
        #[cfg(debug_assertions)]
        self.check();
        true
    }

    /// Prefill request `id` in `slot` has sent its KV: free its blocks.
    pub fn release(&mut self, slot: u32, id: ReqId) {
        let held = self
            .slab
            .get(slot as usize)
            .and_then(Option::as_ref)
            .is_some_and(|s| s.id == id && s.state == State::Held);
        {
            if held {
                let s = self.remove(slot);
                self.pool.release(&s.blocks);
                if self.detail {
                    self.freed.push(s.id);
                }
            }
        }
    }

    /// Invariants: no request both waiting and running; states agree with the queues; blocks
    /// conserved; tokens conserved.
    pub fn check(&self) {
        self.pool.check();
        for &slot in &self.waiting {
            assert_eq!(
                self.seq(slot).state,
                State::Waiting,
                "slot {slot} in waiting"
            );
            assert!(
                !self.running.contains(&slot),
                "slot {slot} both waiting and running"
            );
        }
        for &slot in &self.running {
            let s = self.seq(slot);
            assert_eq!(s.state, State::Running, "slot {slot} in running");
            assert_eq!(s.until, 0, "slot {slot} both running and steady");
        }
        for w in self.running.windows(2) {
            assert!(
                self.seq(w[0]).order < self.seq(w[1]).order,
                "running list in running order"
            );
        }
        for (i, &slot) in self.steady.iter().enumerate() {
            let s = self.seq(slot);
            assert_eq!(s.state, State::Running, "steady slot {slot}");
            assert_eq!(s.steady_idx as usize, i, "steady index of slot {slot}");
            assert!(
                s.from <= self.step + 1 && s.until >= self.step,
                "slot {slot}: window {}..{} around step {}",
                s.from,
                s.until,
                self.step
            );
        }
        let live: Vec<&Seq> = self.slab.iter().flatten().collect();
        assert_eq!(
            live.len() + self.free_slots.len(),
            self.slab.len(),
            "free slots and live requests cover the slab"
        );
        assert_eq!(
            live.iter().filter(|s| s.state == State::Pulling).count(),
            self.pulling,
            "pulling count"
        );
        let mut held = 0;
        for s in &live {
            assert!(
                s.computed <= s.prompt + s.output + self.cfg.num_spec_tokens,
                "request {}: tokens conserved",
                s.id
            );
            assert!(
                s.output <= s.max_output,
                "request {}: output within its limit",
                s.id
            );
            held += s.blocks.len() as u64;
        }
        // Every block in use is held by at least one request (shared prefix blocks by several).
        assert!(
            held >= self.pool.used(),
            "{} blocks in use but requests hold {held}",
            self.pool.used()
        );
    }
}
