//! Steady decoding in aggregate. When the device's MTP acceptance is a known function of
//! (request, sampling step) ([`KnownAcceptance`], the twin's model), a
//! request that is simply decoding is not touched every step. After a step, such a request is
//! scanned ahead to its next event: the step that needs a new KV block, the step it finishes in,
//! the step `max_model_len` would clip it, or the end of the lookahead window. Until then it is
//! *steady*: it computes 1 + k tokens per step, needs no allocation, and samples every step. Its
//! contribution to the rank's batch shape comes from per-rank sums (steady requests and their
//! contexts, per attention regime); the tokens it keeps each step are written into a ring
//! indexed by step, and the sums advance by one ring cell per step. Its window end is a list of
//! the requests whose windows end at that step, one list per ring cell (a window is shorter than
//! the ring). At its event step the request rejoins the running list and that step is scheduled
//! exactly, except where the window ended only for a new KV block or the ring's end and the step
//! cannot run short of budget or blocks: the block is then allocated at once and a new window
//! starts ([`RankScheduler::end_windows`]). The result is the same schedule, the same shapes and
//! the same events as stepping every request (a property test compares the two), with per-step
//! work independent of the number of steady requests.
//!
//! Order is kept: every running request has an admission order; the running list holds the
//! non-steady ones in that order, and preemption takes the newest of both sets. When the token
//! budget could bind (steady demand plus the others' demand, async phantoms included, exceeds
//! it), every steady request is brought back and the step is scheduled request by request; the
//! rank then stays exact for [`COOLDOWN`] steps so that a budget-bound rank does not rescan its
//! requests every step.

use super::{RankScheduler, State};
use crate::device::RankPlan;
use crate::instance::InstanceConfig;
use crate::mtp::{KnownAcceptance, RunLimits};
use crate::req::ReqId;
use std::sync::Arc;

/// Ring cells: steps a steady window can span (at most `RING - 2`).
pub(super) const RING: usize = 128;
/// Cells per regime: the ring, then as many that a window's scan runs on into past the ring's
/// end (in one run, not two), added back to the ring's start once the scan is done.
/// They are zero between scans.
pub(super) const CELLS: usize = 2 * RING;
const _: () = assert!(
    CELLS >= (RING - 1) + (RING - 2),
    "a window (at most RING - 2 steps) from the ring's last cell fits in one run"
);
const _: () = assert!(RING.is_power_of_two(), "ring cells are indexed by a mask");
/// Steps a rank stays exact after a step whose budget could bind.
pub const COOLDOWN: u64 = 64;

/// Regimes of a steady window under capped (sparse) attention: `LIN`, every key of every query
/// within the cap (or no cap), so pairs grow with the context; `SAT`, every query at the cap. A
/// window never spans the few steps in between (they run exactly).
pub(super) const LIN: usize = 0;
pub(super) const SAT: usize = 1;

/// The steady requests of the current step, per regime: how many and the sum of their contexts;
/// the tokens the last step added to those contexts and the windows starting at the next step,
/// both applied when the next step is planned.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct SteadySums {
    pub(super) seqs: [i64; 2],
    pub(super) context: [i64; 2],
    pub(super) pending: [u64; 2],
    entering: [i64; 2],
    entering_context: [i64; 2],
}

/// The end of the lists of window ends ([`SteadyTracker::due`]).
pub(super) const NIL: u32 = u32::MAX;

/// The steady machinery of one rank: the known acceptance, the steady requests, their sums,
/// the ring of the tokens they keep per step and the lists of their window ends.
#[derive(Clone, Debug)]
pub(super) struct SteadyTracker {
    /// Known MTP acceptance: enables steady decoding in aggregate.
    pub(super) acceptance: Option<Arc<dyn KnownAcceptance>>,
    /// The steady requests' slots.
    pub(super) slots: Vec<u32>,
    pub(super) sums: SteadySums,
    /// Per step (ring cell) and regime: tokens the steady requests compute and keep. The only
    /// per-request-step write; cells of 4 bytes per regime keep a rank's ring in cache.
    pub(super) ring: Vec<u32>,
    /// Regimes in use: 1 (dense attention) or 2 (capped).
    pub(super) regimes: usize,
    /// Per ring cell, the first of the steady requests whose windows end at that cell's step
    /// (`NIL`: none), the others linked through `Seq::due_next`.
    pub(super) due: Vec<u32>,
    /// The last plan step whose ring cell was applied (+1; 0: none).
    pub(super) advanced: u64,
    /// No request turns steady before this plan step.
    pub(super) exact_until: u64,
    /// Steady requests in the last plan.
    pub(super) planned: u64,
    /// The last plan scheduled no request one by one and its outcome is not applied yet:
    /// applying it only moves the steady ring a cell and the step counter on, which the rank
    /// does itself when next called ([`RankScheduler::trivial_step`]).
    pub(super) unapplied: bool,
}

impl SteadyTracker {
    /// No acceptance known yet (every request stepped), `regimes` attention regimes.
    pub(super) fn new(regimes: usize) -> Self {
        SteadyTracker {
            acceptance: None,
            slots: Vec::new(),
            sums: SteadySums::default(),
            ring: Vec::new(),
            regimes,
            due: Vec::new(),
            advanced: 0,
            exact_until: 0,
            planned: 0,
            unapplied: false,
        }
    }
}

/// A steady window's scan: from plan step `q0` with `o0` tokens out, the window ends before the
/// step that would start past `o_limit` tokens out, finish the request (reach `max_o`) or reach
/// step `end`.
struct Window {
    q0: u64,
    end: u64,
    o0: u32,
    o_limit: u32,
    max_o: u32,
}

impl Window {
    /// Draws each step's tokens (1 + the drafts accepted out of `k`, from sampling step `step`
    /// of `req` on) and adds them to the ring until the window ends; returns the step it ends at
    /// and the tokens out then. One run of consecutive cells from the window's first step's
    /// ([`KnownAcceptance::scan`]); the cells past the ring's end are then added back to its
    /// start (most windows cross it, and two runs cost a call more).
    #[inline(always)]
    fn scan(
        &self,
        ring: &mut [u32; CELLS],
        acc: &dyn KnownAcceptance,
        req: ReqId,
        step: u32,
        k: u32,
    ) -> (u64, u32) {
        let at = self.q0 as usize & (RING - 1);
        let len = (self.end - self.q0) as usize;
        debug_assert!(len <= RING - 2, "a window spans at most RING - 2 steps");
        let limits = RunLimits {
            o: self.o0,
            o_limit: self.o_limit,
            max_o: self.max_o,
        };
        let (steps, o) = acc.scan(req, step, k, &mut ring[at..at + len], limits);
        let over = (at + steps).saturating_sub(RING);
        let (head, tail) = ring.split_at_mut(RING);
        for (cell, past) in head.iter_mut().zip(&mut tail[..over]) {
            *cell += std::mem::take(past);
        }
        (self.q0 + steps as u64, o)
    }
}

impl RankScheduler {
    /// Ring index of `step`'s cell for `regime` (each regime's cells are contiguous).
    pub(super) fn at(step: u64, regime: usize) -> usize {
        regime * CELLS + (step as usize & (RING - 1))
    }

    /// Inserts a running request into the running list at its place in the running order.
    pub(super) fn insert_running(&mut self, slot: u32) {
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
        self.steady.slots.swap_remove(idx);
        if let Some(&moved) = self.steady.slots.get(idx) {
            Self::seq_mut(&mut self.slab, moved).steady_idx = idx as u32;
        }
    }

    /// Advances the steady sums to plan step `p` (once per step). The windows ending at `p`
    /// are still in them: [`RankScheduler::end_windows`] settles those when `p` is scheduled.
    pub(super) fn advance(&mut self, p: u64) {
        if self.steady.ring.is_empty() || self.steady.advanced > p {
            return;
        }
        self.steady.advanced = p + 1;
        let sm = &mut self.steady.sums;
        for r in [LIN, SAT] {
            sm.context[r] += std::mem::take(&mut sm.pending[r]) as i64
                + std::mem::take(&mut sm.entering_context[r]);
            sm.seqs[r] += std::mem::take(&mut sm.entering[r]);
        }
    }

    /// Settles the windows ending at plan step `p` (when `p` is scheduled, after `advance`).
    /// A window that ended at the ring's end or because the next step needs a KV block goes
    /// on from `p` in a new window, the block allocated here, as the step would. That is done
    /// only when the step can neither run short of blocks (the free blocks cover the ending
    /// windows' blocks and the running requests' whole demand) nor of token budget: then
    /// every request of the step gets what it asks for, and the order the step allocates in
    /// changes only which block numbers each request holds, which nothing reads while steps are
    /// aggregated (detailed plans, which carry block tables, step every request). Otherwise, and for the other ends (the request would finish, or
    /// reach `max_model_len` or the attention cap), the request returns to the running list
    /// and the step schedules it exactly.
    pub(super) fn end_windows(&mut self, p: u64) {
        let Some(head) = self.steady.due.get_mut(p as usize & (RING - 1)) else {
            return;
        };
        let head = std::mem::replace(head, NIL);
        if head == NIL {
            return;
        }
        let room = self.step_fits(head);
        let mut slot = head;
        while slot != NIL {
            let s = self.seq(slot);
            debug_assert_eq!(s.until, p, "slot {slot} in the list of step {p}");
            let next = s.due_next;
            if !(room && self.go_on(slot, p)) {
                self.leave_window(slot);
                self.insert_running(slot);
            }
            slot = next;
        }
    }

    /// Whether the coming step gives every request all it asks for: the token budget covers
    /// every demand (steady requests, async phantoms, the running requests' whole demand) and
    /// the free blocks every allocation (the next block of each window in the list from
    /// `head`, ending at this step, and the running requests' blocks).
    fn step_fits(&self, head: u32) -> bool {
        let cfg = &self.cfg;
        let (bs, k) = (cfg.block_size, cfg.num_spec_tokens as u64);
        let need =
            |s: &super::Seq, new: u64| Self::blocks_short(s, s.computed as u64 + new + k, bs);
        let mut tokens = (self.steady.slots.len() + self.phantoms.len()) as u64 * (1 + k);
        let mut blocks = 0;
        let mut slot = head;
        while slot != NIL {
            let s = self.seq(slot);
            blocks += need(s, Self::demand(cfg, s).0);
            slot = s.due_next;
        }
        for &x in &self.running {
            let s = self.seq(x);
            let demand = Self::demand(cfg, s).0;
            tokens += demand;
            blocks += need(s, demand);
        }
        tokens <= cfg.max_num_batched_tokens as u64 && blocks <= self.pool.free()
    }

    /// Continues steady request `slot`, whose window ends at `p`, in a new window from `p`
    /// (its state is its state at `p`; it stays in the sums and the steady list), allocating
    /// the block step `p` needs. False if it cannot go on steadily from `p`.
    fn go_on(&mut self, slot: u32, p: u64) -> bool {
        if p < self.steady.exact_until {
            return false;
        }
        let (bs, k) = (self.cfg.block_size, self.cfg.num_spec_tokens as u64);
        let s = Self::seq_mut(&mut self.slab, slot);
        if Self::regime(&self.cfg, s.computed).0 != s.regime as usize {
            return false;
        }
        // What the step would allocate for it (its demand is all it asks for).
        let new = Self::demand(&self.cfg, s).0;
        let ok = Self::ensure_slots(&mut self.pool, s, s.computed as u64 + new + k, bs);
        assert!(ok, "request {}: the step's blocks were counted", s.id);
        self.window_from(slot, p).is_some()
    }

    /// Takes steady request `slot` out of its window where it ends (its state is already its
    /// state there): off its list, out of the sums and the steady list.
    pub(super) fn end_window(&mut self, slot: u32) {
        let until = self.seq(slot).until;
        self.unlist(slot, until);
        self.leave_window(slot);
    }

    /// [`RankScheduler::end_window`] for a request already off its list.
    fn leave_window(&mut self, slot: u32) {
        let s = self.seq(slot);
        let (r, context) = (s.regime as usize, s.computed);
        self.steady.sums.seqs[r] -= 1;
        self.steady.sums.context[r] -= context as i64;
        self.leave_steady(slot);
    }

    /// Takes `slot`, whose window ends at `until`, off that step's list.
    fn unlist(&mut self, slot: u32, until: u64) {
        let cell = until as usize & (RING - 1);
        let next = self.seq(slot).due_next;
        if self.steady.due[cell] == slot {
            self.steady.due[cell] = next;
            return;
        }
        let mut at = self.steady.due[cell];
        loop {
            let s = Self::seq_mut(&mut self.slab, at);
            if s.due_next == slot {
                s.due_next = next;
                return;
            }
            debug_assert_ne!(
                s.due_next, NIL,
                "slot {slot} is in the list of step {until}"
            );
            at = s.due_next;
        }
    }

    /// Scans a request that has just sampled in plan step `q0 - 1` ahead to its next event and,
    /// if it stays simply decoding for at least one step, makes it steady until then.
    pub(super) fn try_steady(&mut self, slot: u32, q0: u64) -> bool {
        if self.steady.acceptance.is_none() || q0 < self.steady.exact_until || self.report_emissions
        {
            return false;
        }
        let bs = self.cfg.block_size;
        let s = self.seq(slot);
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
        let base = s.computed;
        let Some(regime) = self.window_from(slot, q0) else {
            return false;
        };
        // It joins the sums when step q0 is planned.
        self.steady.sums.entering[regime] += 1;
        self.steady.sums.entering_context[regime] += base as i64;
        Self::seq_mut(&mut self.slab, slot).steady_idx = self.steady.slots.len() as u32;
        self.steady.slots.push(slot);
        true
    }

    /// Keys per query of a request with `computed` tokens in KV: its regime, and the context
    /// below which every key counts (all of them below the cap, the cap above it).
    fn regime(cfg: &InstanceConfig, computed: u32) -> (usize, u64) {
        match cfg.attn_cap.0 {
            None => (LIN, u64::MAX),
            Some(c) if computed as u64 >= c => (SAT, u64::MAX),
            Some(c) => (LIN, c),
        }
    }

    /// Scans request `slot` from plan step `q0` (its state is its state there) to its next
    /// event and sets its window `q0..q`, listed under `q`; returns its regime. `None`, with
    /// nothing changed, if not even step `q0` is simply decoding.
    fn window_from(&mut self, slot: u32, q0: u64) -> Option<usize> {
        let acc = self.steady.acceptance.as_ref()?;
        let cfg = self.cfg;
        let bs = cfg.block_size;
        let k = cfg.num_spec_tokens;
        let t = 1 + k as u64;
        let s = self.slab[slot as usize].as_mut().expect("live slot");
        let (regime, lin_limit) = Self::regime(&cfg, s.computed);
        // In a window c - o stays fixed (c = prompt + o - 1): one bound on o covers the block
        // capacity, max_model_len and the cap for the next step.
        let capacity = s.blocks.len() as u64 * bs as u64;
        let c_limit = (capacity.saturating_sub(t + k as u64))
            .min(cfg.max_model_len.saturating_sub(t))
            .min(lin_limit.saturating_sub(t));
        let offset = s.computed - s.output;
        let o_limit = c_limit.saturating_sub(offset as u64).min(u32::MAX as u64) as u32;
        if (s.computed as u64) > c_limit {
            return None;
        }
        let ring: &mut [u32; CELLS] = (&mut self.steady.ring[regime * CELLS..][..CELLS])
            .try_into()
            .expect("a ring per regime");
        let w = Window {
            q0,
            end: q0 + (RING - 2) as u64,
            o0: s.output,
            o_limit,
            max_o: s.max_output,
        };
        let (q, o) = w.scan(ring, &**acc, s.id, s.samples, k);
        if q == q0 {
            return None;
        }
        let cell = q as usize & (RING - 1);
        s.due_next = std::mem::replace(&mut self.steady.due[cell], slot);
        s.base_computed = s.computed;
        s.base_output = s.output;
        s.from = q0;
        s.until = q;
        s.regime = regime as u8;
        s.computed = o + offset;
        s.output = o;
        s.samples += (q - q0) as u32;
        // It samples in every step of the window; the last is plan step q - 1.
        s.last_step = q;
        Some(regime)
    }

    /// Takes steady request `slot` out of its window at plan step `p` (`from <= p < until`,
    /// before step `p` runs): its state becomes its state at `p`, and the rest of its window
    /// leaves the sums and the ring.
    pub(super) fn unsteady(&mut self, slot: u32, p: u64) {
        let acc = self
            .steady
            .acceptance
            .as_deref()
            .expect("steady requests need acceptance");
        let k = self.cfg.num_spec_tokens;
        let s = self.slab[slot as usize].as_mut().expect("live slot");
        debug_assert!(
            s.from <= p && p < s.until,
            "plan step {p} inside the window"
        );
        let r = s.regime as usize;
        let j0 = s.samples - (s.until - s.from) as u32;
        let (mut c, mut o) = (s.base_computed, s.base_output);
        let mut at_p = (c, o);
        for (j, q) in (j0..).zip(s.from..s.until) {
            // Inside a window every step emits 1 + accepted.
            let emitted = 1 + acc.accepted(s.id, j, k);
            if q == p {
                at_p = (c, o);
            }
            if q >= p {
                self.steady.ring[Self::at(q, r)] -= emitted;
            }
            c += emitted;
            o += emitted;
        }
        self.steady.sums.seqs[r] -= 1;
        self.steady.sums.context[r] -= at_p.0 as i64;
        debug_assert_eq!(c, s.computed, "the rescan lands where the window ends");
        (s.computed, s.output) = at_p;
        s.samples = j0 + (p - s.from) as u32;
        s.last_step = p;
        let until = s.until;
        self.unlist(slot, until);
        self.leave_steady(slot);
    }

    /// Brings an idle rank's step counter to the instance's: the instance plans and applies
    /// only ranks with work, and an idle rank steps nothing (its part of a lockstep step is
    /// the device's dummy batch). Call before scheduling a rank that sat steps out.
    pub fn catch_up(&mut self, steps: u64) {
        self.settle(steps);
        if self.step >= steps {
            return;
        }
        // A rank that was idle when the last step was planned may have been handed requests
        // since (arrivals, pulled KV); they sat that step out, as they would have in it.
        debug_assert!(
            self.steady.slots.is_empty() && self.phantoms.is_empty(),
            "only a rank without steady or finishing requests sits steps out"
        );
        // Fold what the last step left in the sums, then move the ring: with no steady request
        // every cell is empty.
        self.advance(self.step);
        debug_assert!(
            self.steady.ring.iter().all(|&c| c == 0),
            "an idle rank's ring is empty"
        );
        self.step = steps;
        if !self.steady.ring.is_empty() {
            self.steady.advanced = steps;
        }
    }
}

/// The fast paths around the exact step: a rank whose step is only its steady requests' sums
/// is planned from them ([`RankScheduler::quiet_step`], [`RankScheduler::add_steady`]), and a
/// plan that scheduled no request one by one is never applied request by request
/// ([`RankScheduler::trivial_step`], [`RankScheduler::settle`]).
impl RankScheduler {
    /// The step of a rank that only goes on with its steady requests, planned without the
    /// general path (most ranks of a long decode, most steps): its last plan was trivial and
    /// has run (the instance has run `steps`, one more than the rank), it holds only steady
    /// requests whose demand cannot bind the budget, and no window ends at the coming step.
    /// Leaves the rank, `plan` and the counters as [`RankScheduler::catch_up`],
    /// [`RankScheduler::schedule`] and [`RankScheduler::trivial_step`] would and returns the
    /// step's trivial totals; `None`, with nothing changed, for any other rank.
    #[inline]
    pub fn quiet_step(&mut self, steps: u64, plan: &mut RankPlan) -> Option<(u64, u64)> {
        let p = self.step + 1;
        let quiet = self.steady.unapplied
            && steps == p
            && self.freed.is_empty()
            && self.steady.due.get(p as usize & (RING - 1)) == Some(&NIL)
            && self.only_steady();
        if !quiet {
            return None;
        }
        self.close_step();
        self.ratio_step = super::sglang::RatioStep::Decoded;
        self.advance(p);
        Self::clear_plan(plan);
        self.add_steady(plan);
        #[cfg(debug_assertions)]
        self.check();
        self.trivial_step()
    }

    /// Whether the rank holds only steady requests (no running, waiting or phantom one) whose
    /// demand cannot bind the token budget: its step is their sums.
    #[inline]
    pub(super) fn only_steady(&self) -> bool {
        self.running.is_empty()
            && self.waiting.is_empty()
            && self.phantoms.is_empty()
            && self.steady.slots.len() as u64 * (1 + self.cfg.num_spec_tokens as u64)
                <= self.cfg.max_num_batched_tokens as u64
    }

    /// Adds the steady requests' share to the plan, from their sums: each computes t = 1 + k
    /// query tokens after its context c, t*c + t(t+1)/2 pairs (capped: t*cap once c >= cap).
    pub(super) fn add_steady(&mut self, plan: &mut RankPlan) {
        let n = self.steady.slots.len() as u64;
        let sm = self.steady.sums;
        debug_assert_eq!(sm.seqs[LIN] + sm.seqs[SAT], n as i64, "steady count");
        if n > 0 {
            let t = 1 + self.cfg.num_spec_tokens as u64;
            let tri = t * (t + 1) / 2;
            let (lin, sat) = (sm.seqs[LIN] as u64, sm.seqs[SAT] as u64);
            let (clin, csat) = (sm.context[LIN] as u64, sm.context[SAT] as u64);
            let capped_sat = self.cfg.attn_cap.0.map_or(0, |c| sat * t * c);
            plan.shape.add_decode_sums(
                n,
                n * t,
                t * (clin + csat) + n * tri,
                t * clin + lin * tri + capped_sat,
            );
        }
        self.steady.planned = n;
        self.stats.steady_steps += n;
        self.stats.exact_steps += self.entries.len() as u64;
        self.steady.unapplied = self.entries.is_empty();
    }

    /// After [`RankScheduler::schedule`]: when the plan scheduled no request one by one (only
    /// steady requests, or nothing), what its outcome adds to a step's totals, tokens and
    /// requests that sampled in consecutive steps. The outcome then need not be applied:
    /// instead of [`RankScheduler::update`], the rank is told with [`RankScheduler::settle`]
    /// (or [`RankScheduler::catch_up`]) once the step has run.
    pub fn trivial_step(&self) -> Option<(u64, u64)> {
        self.steady.unapplied.then(|| {
            let tokens = if self.steady.ring.is_empty() {
                0
            } else {
                (0..self.steady.regimes)
                    .map(|r| self.steady.ring[Self::at(self.step, r)] as u64)
                    .sum()
            };
            (tokens, self.steady.planned)
        })
    }

    /// Moves the steady ring and the step counter past the step planned last: its cell's
    /// tokens go into the sums (at the next `advance`); returns them.
    pub(super) fn close_step(&mut self) -> u64 {
        let ratio_step = std::mem::take(&mut self.ratio_step);
        self.step_ratio(ratio_step);
        self.steady.unapplied = false;
        let p = self.step;
        self.step += 1;
        let mut tokens = 0;
        if !self.steady.ring.is_empty() {
            for r in 0..self.steady.regimes {
                let tk = std::mem::take(&mut self.steady.ring[Self::at(p, r)]) as u64;
                tokens += tk;
                self.steady.sums.pending[r] += tk;
            }
        }
        tokens
    }

    /// Applies the outcome of a trivial step ([`RankScheduler::trivial_step`]) that was not
    /// applied, if it has run: the instance has run `steps` steps.
    pub fn settle(&mut self, steps: u64) {
        if self.steady.unapplied && steps > self.step {
            self.close_step();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A known acceptance for the tests: one draft in three accepted at a hashed position.
    #[derive(Debug)]
    struct Hashed;

    impl KnownAcceptance for Hashed {
        fn accepted(&self, req: ReqId, step: u32, drafts: u32) -> u32 {
            let h = (req ^ (step as u64) << 20).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60;
            (h as u32 % 3).min(drafts)
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// A window's one run, its cells past the ring's end added back, fills the ring as
        /// stepping through the window a step at a time, each step's cell by its plan step.
        #[test]
        fn a_window_fills_the_ring_as_its_steps_do(
            q0 in 0u64..1000,
            len in 1u64..(RING as u64 - 1),
            o0 in 1u32..500,
            room in 0u32..300,
            finish in 1u32..300,
            k in 1u32..4,
            req in 0u64..1000,
            step in 0u32..5000,
        ) {
            let w = Window {
                q0,
                end: q0 + len,
                o0,
                o_limit: o0 + room,
                max_o: o0 + finish,
            };
            let start: [u32; RING] = std::array::from_fn(|i| (i % 5) as u32);
            let mut ring = [0; CELLS];
            ring[..RING].copy_from_slice(&start);
            let got = w.scan(&mut ring, &Hashed, req, step, k);
            let (mut q, mut o, mut want) = (q0, o0, start);
            while q < w.end && o <= w.o_limit {
                let e = 1 + Hashed.accepted(req, step + (q - q0) as u32, k);
                if o + e >= w.max_o {
                    break;
                }
                want[q as usize & (RING - 1)] += e;
                o += e;
                q += 1;
            }
            prop_assert_eq!(got, (q, o));
            prop_assert_eq!(&ring[..RING], &want[..]);
            prop_assert!(ring[RING..].iter().all(|&c| c == 0), "cells past the ring emptied");
        }
    }
}
