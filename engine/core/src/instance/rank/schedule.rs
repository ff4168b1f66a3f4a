//! The exact step of a rank: running requests first, then waiting ones within the token
//! budget and `max_num_seqs` (or, with separate prefill batches, the prompts being computed and
//! waiting requests first, the decoders only in a step with no prompt to run); preemption when
//! KV runs out; the per-request plan entries of a device that executes requests; applying a
//! step's outcome.

use super::steady::COOLDOWN;
use super::{blocks_for, Admission, Entry, RankScheduler, Seq, State};
use crate::device::{DecodeSeq, FinishReason, RankPlan, ReqId, Sampled, ScheduledReq};
use crate::instance::kv::BlockPool;
use crate::instance::{InstEvent, InstanceConfig, StepSummary};
use crate::layout::Role;

impl RankScheduler {
    /// Makes a request's KV hold `tokens` tokens.
    pub(super) fn ensure_slots(pool: &mut BlockPool, s: &mut Seq, tokens: u64, bs: u32) -> bool {
        let need = Self::blocks_short(s, tokens, bs);
        need == 0 || pool.allocate(need, &mut s.blocks)
    }

    /// Blocks request `s` lacks to hold `tokens` tokens.
    pub(super) fn blocks_short(s: &Seq, tokens: u64, bs: u32) -> u64 {
        blocks_for(tokens, bs).saturating_sub(s.blocks.len() as u64)
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
            // Its blocks are freed above: this keeps its (empty) table.
            let s = self.remove_freeing(slot);
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
        let first_sight = !s.shown;
        let token_ids = (first_sight && !s.tokens.is_empty()).then(|| s.tokens.as_slice().into());
        let sampling = if first_sight {
            s.sampling.clone()
        } else {
            None
        };
        s.shown = true;
        plan.reqs.push(ScheduledReq {
            req: s.id,
            token_ids,
            sampling,
            prompt_len: s.prompt_len,
            computed: s.computed,
            new_tokens: new,
            blocks: s.blocks.clone(),
            samples,
            drafts,
        });
    }

    /// Tokens a running request would compute this step before the budget, and whether it is
    /// decoding (only its last sampled token is not in KV yet).
    pub(super) fn demand(cfg: &InstanceConfig, s: &Seq) -> (u64, bool) {
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

    /// Removes the newest running request (steady or not) from the running set for preemption.
    /// A steady one gives its share of the budget back.
    fn pop_newest(&mut self, p: u64, budget: &mut u64) -> Option<u32> {
        let last = self.running.last().map(|&x| self.seq(x).order);
        let newest_steady = self
            .steady
            .slots
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

    /// Plans this rank's step into `plan`; requests admitted for the first time go to `started`
    /// (with the prompt tokens their prefix-cache hits cover),
    /// remote-KV requests whose blocks are now allocated go to `pulls`; `admission` says
    /// whether waiting requests may start. Returns whether the step holds only steady requests (no
    /// request was admitted, preempted or sent back: the rank's load is what it was).
    pub fn schedule(
        &mut self,
        plan: &mut RankPlan,
        admission: Admission,
        started: &mut Vec<(ReqId, u32)>,
        pulls: &mut Vec<ReqId>,
        events: &mut Vec<InstEvent>,
    ) -> bool {
        // A trivial plan left unapplied was not run (a plan without tokens): this plans the
        // same step again.
        self.steady.unapplied = false;
        Self::clear_plan(plan);
        plan.freed.append(&mut self.freed);
        self.entries.clear();
        let p = self.step;
        self.advance(p);
        self.end_windows(p);
        self.ratio_when_idle();
        // Only steady requests (the common case in a long decode): the step is their sums.
        if self.only_steady() {
            self.ratio_step = super::sglang::RatioStep::Decoded;
            self.add_steady(plan);
            #[cfg(debug_assertions)]
            self.check();
            return true;
        }
        self.schedule_exact(plan, p, admission, started, pulls, events);
        false
    }

    /// [`RankScheduler::schedule`] request by request: running requests, then waiting ones;
    /// with [`InstanceConfig::separate_prefill_batches`], a prefill batch (the prompts being
    /// computed, then waiting requests) where there is one to run, else a decode batch.
    fn schedule_exact(
        &mut self,
        plan: &mut RankPlan,
        p: u64,
        admission: Admission,
        started: &mut Vec<(ReqId, u32)>,
        pulls: &mut Vec<ReqId>,
        events: &mut Vec<InstEvent>,
    ) {
        let cfg = self.cfg;
        let k = cfg.num_spec_tokens;
        let mut budget = cfg.max_num_batched_tokens as u64;
        // Steady requests take 1 + k tokens each. If the budget could bind, the running order
        // decides who gets it: schedule request by request. Async scheduling's phantoms (last
        // step's finished requests) take their tokens before any running request.
        let steady_demand = self.steady.slots.len() as u64 * (1 + k as u64);
        if steady_demand > 0 {
            let phantom_demand = self.phantoms.len() as u64 * (1 + k as u64);
            let others: u64 = self
                .running
                .iter()
                .map(|&x| Self::demand(&cfg, self.seq(x)).0)
                .sum();
            if steady_demand + phantom_demand + others > budget {
                self.stats.budget_fallbacks += 1;
                self.steady.exact_until = p + COOLDOWN;
                while let Some(&slot) = self.steady.slots.last() {
                    self.unsteady(slot, p);
                    self.insert_running(slot);
                }
            }
        }
        budget -= self.steady.slots.len() as u64 * (1 + k as u64);
        // vLLM admits nothing in a step that preempted: nor does the same step planned again.
        let mut preempted = admission == Admission::Replanned && self.preempted_in_plan;
        self.preempted_in_plan = false;
        if cfg.separate_prefill_batches {
            // SGLang without --enable-mixed-chunk: prefill first, when there is any to run.
            let stalled =
                self.run_running(plan, p, &mut budget, Some(false), &mut preempted, events);
            let open = admission != Admission::Held && !preempted && !stalled;
            self.admit_waiting(plan, open, &mut budget, 0, started, pulls);
            if self.entries.is_empty() {
                self.add_phantoms(plan, &mut budget);
                self.run_running(plan, p, &mut budget, Some(true), &mut preempted, events);
            } else {
                // Last step's finished requests take no decode step in a prefill batch (they
                // held their seats during its admission, as they do in a mixed step).
                self.phantoms.clear();
            }
        } else {
            let drained = self.add_phantoms(plan, &mut budget);
            self.run_running(plan, p, &mut budget, None, &mut preempted, events);
            let open = admission != Admission::Held && !preempted;
            self.admit_waiting(plan, open, &mut budget, drained, started, pulls);
        }
        self.add_steady(plan);
        self.ratio_step = self.ratio_step_of(preempted, &plan.shape);
        #[cfg(debug_assertions)]
        self.check();
    }

    /// Async scheduling: last step's finished requests, not yet known to be finished when this
    /// step was scheduled, take their slot once more, before any running request. Returns how
    /// many (they still hold their seats this step).
    fn add_phantoms(&mut self, plan: &mut RankPlan, budget: &mut u64) -> usize {
        let t = 1 + self.cfg.num_spec_tokens as u64;
        let phantoms = self.phantoms.len();
        for c in self.phantoms.drain(..) {
            let t = t.min(*budget);
            plan.shape.add_decode(t, c as u64, self.cfg.attn_cap);
            *budget -= t;
        }
        phantoms
    }

    /// The running requests in their order within `budget` (only the decoding ones, or only
    /// those computing their prompt, where `only_decoding` says), each allocating its KV and
    /// preempting the newest running requests until it fits; a prefill batch's prompt
    /// (`only_decoding` false) preempts nobody, as SGLang retracts requests only to decode:
    /// the batch ends there, and the return value (true) says so, closing admission.
    fn run_running(
        &mut self,
        plan: &mut RankPlan,
        p: u64,
        budget: &mut u64,
        only_decoding: Option<bool>,
        preempted: &mut bool,
        events: &mut Vec<InstEvent>,
    ) -> bool {
        let cfg = self.cfg;
        let bs = cfg.block_size;
        let k = cfg.num_spec_tokens;
        let cap = cfg.attn_cap;
        let may_preempt = only_decoding != Some(false);
        let mut i = 0;
        while i < self.running.len() && *budget > 0 {
            let slot = self.running[i];
            let s = self.seq(slot);
            let known = s.prompt + s.output;
            let (new, decoding) = Self::demand(&cfg, s);
            if only_decoding.is_some_and(|d| d != decoding) {
                i += 1;
                continue;
            }
            let new = new.min(*budget);
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
                if !may_preempt {
                    break;
                }
                let victim = self
                    .pop_newest(p, budget)
                    .expect("the current request is running");
                self.preempt(victim, events);
                *preempted = true;
                self.preempted_in_plan = true;
                if victim == slot {
                    break;
                }
            }
            if !fits {
                // The current request was the newest and is gone (nothing after it remains), or
                // a prefill batch's prompt does not fit: the batch ends there.
                return !may_preempt;
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
            *budget -= new;
            i += 1;
        }
        false
    }

    /// Waiting requests in order while `open` (admitting, nothing preempted), within `budget`
    /// and `max_num_seqs` (`drained` phantoms of this step still hold their seats). Waiting
    /// requests never preempt.
    fn admit_waiting(
        &mut self,
        plan: &mut RankPlan,
        open: bool,
        budget: &mut u64,
        drained: usize,
        started: &mut Vec<(ReqId, u32)>,
        pulls: &mut Vec<ReqId>,
    ) {
        let cfg = self.cfg;
        let bs = cfg.block_size;
        let k = cfg.num_spec_tokens;
        let cap = cfg.attn_cap;
        // Requests this call started (the last ones in `running`).
        let mut fresh = 0;
        while open && *budget > 0 && self.seats_taken() + drained < cfg.max_num_seqs as usize {
            let Some(&slot) = self.waiting.front() else {
                break;
            };
            if self.seq(slot).remote && !self.sglang_admits(slot, 0, 0, fresh) {
                break;
            }
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
            if !cfg.enable_chunked_prefill && new > *budget {
                break;
            }
            if cfg.long_prefill_token_threshold > 0 {
                new = new.min(cfg.long_prefill_token_threshold as u64);
            }
            new = new.min(*budget);
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
            if !self.sglang_admits(slot, (known - cached) as u64, hits_in_free, fresh) {
                break;
            }
            let s = Self::seq_mut(&mut self.slab, slot);
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
                started.push((s.id, cached));
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
            fresh += 1;
            *budget -= new;
        }
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
        // Steady requests sampled in this step and in the one before.
        sum.tokens += self.close_step();
        sum.continuing += self.steady.planned;
        let step = self.step;
        let bs = self.cfg.block_size;
        if self.entries.is_empty() {
            // Only steady requests computed: nothing finished, stopped or turned steady.
            #[cfg(debug_assertions)]
            self.check();
            return;
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
                    let s = self.remove_freeing(slot);
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
        if self.steady.acceptance.is_some() && step >= self.steady.exact_until {
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
}
