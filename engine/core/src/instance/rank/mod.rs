//! The scheduler of one DP rank, vLLM v1 semantics (docs/ARCHITECTURE.md, "Semantics"): one token budget per step;
//! running requests first, then waiting ones up to `max_num_seqs`; chunked prefill; paged KV with
//! prefix caching; preemption of the newest running request when KV runs out; MTP lookahead slots
//! and rollback of rejected drafts. IO-free: time comes in as an argument.
//!
//! Requests live in a slab; queues hold slab indices. What happens to requests is reported in
//! aggregate (tokens emitted, requests that emitted in consecutive steps) plus one event per
//! request only when something happens to it (first token, a gap, finish, preemption).
//!
//! - `steady`: steady decoding in aggregate (requests that are simply decoding, advanced by
//!   per-rank sums and a ring instead of one by one) and the fast paths around the exact step
//!   (a step that is only the steady sums, a plan that need not be applied request by request).
//! - `schedule`: the exact step, as vLLM's `schedule()` reads: running requests, admission of
//!   waiting ones, preemption, and applying a step's outcome. Admission changes here.
//! - `check`: the invariants checked after every step in debug builds.

mod check;
mod schedule;
mod sglang;
mod steady;

pub use steady::COOLDOWN;

use super::kv::{chain, BlockPool};
use super::{InstanceConfig, NewRequest};
use crate::batch::BatchShape;
use crate::device::{RankPlan, ReqId};
use crate::mtp::KnownAcceptance;
use std::collections::VecDeque;
use std::sync::Arc;

/// Whether a rank's plan may start waiting requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// As vLLM: unless the step preempted.
    Open,
    /// Held back by the prefill delayer ([`crate::instance::InstanceConfig::prefill_delay_passes`])
    /// or balance scheduling ([`crate::instance::InstanceConfig::balance_scheduling`]).
    Held,
    /// The same step planned again at once after a held plan came to nothing: open, unless
    /// the held plan preempted on this rank.
    Replanned,
}
use steady::{SteadyTracker, CELLS, NIL, RING};

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
    /// The next steady request whose window ends at the same step (`NIL`: none).
    due_next: u32,
    /// `LIN` or `SAT` while steady.
    regime: u8,
    /// Token ids (prompt, then every kept output token) when the workload has them.
    tokens: Vec<u32>,
    /// The device has been given the token ids since the request was (re)admitted.
    shown: bool,
    sampling: Option<std::sync::Arc<crate::device::SamplingParams>>,
    /// The client's prompt length.
    prompt_len: u32,
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
    /// The last plan preempted: a plan of the same step made again at once
    /// ([`Admission::Replanned`]) admits nothing either.
    preempted_in_plan: bool,
    entries: Vec<Entry>,
    finished: Vec<u32>,
    /// Steps applied so far.
    step: u64,
    pub stats: RankStats,
    /// The steady machinery: requests advanced in aggregate between their events.
    steady: SteadyTracker,
    next_order: u64,
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
    /// Block tables of requests that left, emptied, for the requests that come (a table is
    /// not allocated and freed per request).
    spare: Vec<Vec<u32>>,
    /// SGLang's `new_token_ratio` ([`crate::instance::SglangAdmission`]; unused otherwise).
    new_token_ratio: f64,
    /// What the plan being applied does to it.
    ratio_step: sglang::RatioStep,
}

/// Emptied block tables a rank keeps at most ([`RankScheduler::spare`]).
const SPARE_TABLES: usize = 16;

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
            preempted_in_plan: false,
            entries: Vec::new(),
            finished: Vec::new(),
            step: 0,
            stats: RankStats::default(),
            steady: SteadyTracker::new(if cfg.attn_cap.0.is_some() { 2 } else { 1 }),
            next_order: 0,
            phantoms: Vec::new(),
            report_emissions: false,
            stopped: Vec::new(),
            detail: false,
            freed: Vec::new(),
            spare: Vec::new(),
            new_token_ratio: match cfg.admission {
                crate::instance::AdmissionRule::Sglang(a) => a.init_ratio,
                crate::instance::AdmissionRule::Vllm => 0.0,
            },
            ratio_step: sglang::RatioStep::None,
        }
    }

    /// Lets the rank advance steadily decoding requests in aggregate, drawing their MTP acceptance
    /// from `a` (which must be what the device draws). `None` steps every request, as does a
    /// rank with separate prefill batches (its decoders wait out prefill steps).
    pub fn set_acceptance(&mut self, a: Option<Arc<dyn KnownAcceptance>>) {
        assert!(
            self.steady.slots.is_empty(),
            "acceptance changes only between requests"
        );
        let a = a.filter(|_| !self.cfg.separate_prefill_batches);
        if a.is_some() && self.steady.ring.is_empty() {
            self.steady.ring = vec![0; CELLS * self.steady.regimes];
            self.steady.due = vec![NIL; RING];
        }
        self.steady.acceptance = a;
    }

    /// Empties a plan entry for this rank's next step.
    #[inline]
    fn clear_plan(plan: &mut RankPlan) {
        plan.shape = BatchShape::default();
        plan.decode.clear();
        plan.reqs.clear();
        plan.freed.clear();
    }

    fn seq(&self, slot: u32) -> &Seq {
        self.slab[slot as usize].as_ref().expect("live slot")
    }

    fn seq_mut(slab: &mut [Option<Seq>], slot: u32) -> &mut Seq {
        slab[slot as usize].as_mut().expect("live slot")
    }

    /// Requests this rank holds that are not finished (for DP load balancing).
    pub fn load(&self) -> usize {
        self.waiting.len() + self.running.len() + self.steady.slots.len() + self.pulling
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Remote-KV requests whose KV is on its way.
    pub fn num_pulling(&self) -> usize {
        self.pulling
    }

    pub fn num_running(&self) -> usize {
        self.running.len() + self.steady.slots.len()
    }

    pub fn kv_usage(&self) -> f64 {
        self.pool.used() as f64 / self.pool.total() as f64
    }

    pub fn has_work(&self) -> bool {
        !self.running.is_empty()
            || !self.steady.slots.is_empty()
            || !self.waiting.is_empty()
            || !self.phantoms.is_empty()
    }

    /// Sequences holding a seat against `max_num_seqs` (async scheduling's phantoms too).
    fn seats_taken(&self) -> usize {
        self.running.len() + self.steady.slots.len() + self.pulling + self.phantoms.len()
    }

    /// A prompt waits and a seat is free: the next step would admit it unless its KV does not
    /// fit (what SGLang's prefill delayer asks each DP rank before admission).
    pub fn prefillable(&self) -> bool {
        !self.waiting.is_empty() && self.seats_taken() < self.cfg.max_num_seqs as usize
    }

    /// As many requests run as `max_num_seqs` allows (vLLM's `len(running)`: a finished
    /// request's last async step is not counted).
    pub fn at_seat_cap(&self) -> bool {
        self.running.len() + self.steady.slots.len() >= self.cfg.max_num_seqs as usize
    }

    /// A request runs here (the instance has a step to run whether or not prompts wait); a
    /// finished request's last async step counts.
    pub fn runs(&self) -> bool {
        !self.running.is_empty() || !self.steady.slots.is_empty() || !self.phantoms.is_empty()
    }

    /// Takes back the requests to free that a plan not run carried (`freed`, emptied), so that
    /// the plan made again carries them.
    pub fn give_back_freed(&mut self, freed: &mut Vec<ReqId>) {
        freed.append(&mut self.freed);
        std::mem::swap(&mut self.freed, freed);
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
        // The block table it will need at its longest (grown a block at a time otherwise).
        let longest = (r.prompt_tokens as u64 + r.max_output_tokens as u64)
            .min(self.cfg.max_model_len)
            + self.cfg.num_spec_tokens as u64;
        let mut blocks = self.spare.pop().unwrap_or_default();
        blocks.reserve(blocks_for(longest, self.cfg.block_size) as usize);
        let seq = Seq {
            id: r.id,
            prompt: r.prompt_tokens,
            max_output: r.max_output_tokens,
            computed: 0,
            output: 0,
            blocks,
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
            due_next: NIL,
            regime: 0,
            tokens: r.token_ids.map(<[u32]>::to_vec).unwrap_or_default(),
            shown: false,
            sampling: r.sampling.cloned(),
            prompt_len: r.prompt_len,
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

    /// Removes the request in `slot` and frees its blocks; its block table (empty in the
    /// returned request) is kept for a request to come.
    fn remove_freeing(&mut self, slot: u32) -> Seq {
        let mut s = self.remove(slot);
        let mut table = std::mem::take(&mut s.blocks);
        self.pool.release(&table);
        if self.spare.len() < SPARE_TABLES {
            table.clear();
            self.spare.push(table);
        }
        s
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

    /// The rank's step counter (steps applied so far).
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// Asks the processor to start loading the first request whose steady window ends at
    /// plan step `p`: the instance calls this for a rank a few ahead of the one it schedules,
    /// so that the request, untouched since its window began, arrives while other ranks are
    /// scheduled (its first read was a third of `schedule`'s time in a long decode). A hint
    /// only: nothing changes, and a wrong guess costs a load.
    #[inline]
    pub(crate) fn prefetch(&self, p: u64) {
        if let Some(s) = self.first_ending(p) {
            dstwin_prefetch::value(s);
        }
    }

    /// The second stage of [`RankScheduler::prefetch`], a couple of ranks later, once the
    /// request has arrived: the end of its block table, which a window ending for a new block
    /// appends to, and the top of the rank's free blocks.
    #[inline]
    pub(crate) fn prefetch_blocks(&self, p: u64) {
        if let Some(Some(s)) = self.first_ending(p) {
            if let Some(last) = s.blocks.last() {
                dstwin_prefetch::line((last as *const u32).cast());
            }
            self.pool.prefetch_top();
        }
    }

    /// The slab slot of the first request whose steady window ends at plan step `p`, if any
    /// (what the prefetches read ahead; no window list yet, or an empty one, gives none).
    #[inline]
    fn first_ending(&self, p: u64) -> Option<&Option<Seq>> {
        let &head = self.steady.due.get(p as usize & (RING - 1))?;
        self.slab.get(head as usize)
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
    /// blocks. Call between `update` (or, after a trivial step, `settle`) and the next
    /// `schedule`. Returns false if it is not here.
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
                let until = self.seq(slot).until;
                if until != 0 {
                    // Bring the sums to the coming step, then take it out of its window.
                    let p = self.step;
                    self.advance(p);
                    if until == p {
                        self.end_window(slot);
                    } else {
                        self.unsteady(slot, p);
                    }
                } else {
                    self.running.retain(|&x| x != slot);
                }
            }
            State::Held => {}
        }
        let s = self.remove_freeing(slot);
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
                let s = self.remove_freeing(slot);
                if self.detail {
                    self.freed.push(s.id);
                }
            }
        }
    }
}
