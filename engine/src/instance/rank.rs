//! The scheduler of one DP rank, vLLM v1 semantics (REFERENCE.md): one token budget per step;
//! running requests first, then waiting ones up to `max_num_seqs`; chunked prefill; paged KV with
//! prefix caching; preemption of the newest running request when KV runs out; MTP lookahead slots
//! and rollback of rejected drafts. IO-free: time comes in as an argument.
//!
//! Requests live in a slab; queues hold slab indices. Per step, work is proportional to the
//! requests scheduled, and what happens to every one of them is reported in aggregate (tokens
//! emitted, requests that emitted in consecutive steps) plus one event per request only when
//! something happens to it (first token, a gap, finish, preemption).

use super::kv::{chain, BlockPool};
use super::{InstEvent, InstanceConfig, NewRequest, StepSummary};
use crate::batch::BatchShape;
use crate::device::{DecodeSeq, RankPlan, ReqId};
use crate::layout::Role;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;

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
}

/// One DP rank's scheduler.
#[derive(Clone, Debug)]
pub struct RankScheduler {
    cfg: InstanceConfig,
    pool: BlockPool,
    slab: Vec<Option<Seq>>,
    free_slots: Vec<u32>,
    index: FxHashMap<ReqId, u32>,
    waiting: VecDeque<u32>,
    running: Vec<u32>,
    pulling: usize,
    entries: Vec<Entry>,
    finished: Vec<u32>,
    /// Steps applied so far.
    step: u64,
    pub stats: RankStats,
}

fn blocks_for(tokens: u64, bs: u32) -> u64 {
    tokens.div_ceil(bs as u64)
}

impl RankScheduler {
    pub fn new(cfg: InstanceConfig) -> Self {
        RankScheduler {
            pool: BlockPool::new(cfg.num_kv_blocks),
            cfg,
            slab: Vec::new(),
            free_slots: Vec::new(),
            index: FxHashMap::default(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            pulling: 0,
            entries: Vec::new(),
            finished: Vec::new(),
            step: 0,
            stats: RankStats::default(),
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
        self.waiting.len() + self.running.len() + self.pulling
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn kv_usage(&self) -> f64 {
        self.pool.used() as f64 / self.pool.total() as f64
    }

    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
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

    pub fn add(&mut self, r: NewRequest<'_>) {
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
        self.index.insert(r.id, slot);
        self.waiting.push_back(slot);
    }

    fn remove(&mut self, slot: u32) -> Seq {
        let s = self.slab[slot as usize].take().expect("live slot");
        self.index.remove(&s.id);
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
        self.entries.clear();
        let cfg = self.cfg;
        let bs = cfg.block_size;
        let k = cfg.num_spec_tokens;
        let cap = cfg.attn_cap;
        let mut budget = cfg.max_num_batched_tokens as u64;
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let slot = self.running[i];
            let s = self.seq(slot);
            // Tokens whose ids are known: the prompt and what was sampled. A request decodes when
            // only the last sampled token is not in KV yet; otherwise it (re)computes known tokens.
            let known = s.prompt + s.output;
            let decoding = s.output > 0 && s.computed + 1 >= known;
            let target = known as u64 + if decoding { k as u64 } else { 0 };
            let mut new = target.saturating_sub(s.computed as u64);
            if !decoding && cfg.long_prefill_token_threshold > 0 {
                new = new.min(cfg.long_prefill_token_threshold as u64);
            }
            new = new
                .min(budget)
                .min(cfg.max_model_len.saturating_sub(s.computed as u64));
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
                let victim = self.running.pop().expect("the current request is running");
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
                plan.decode.push(DecodeSeq { req: s.id, drafts });
            }
            self.entries.push(Entry {
                slot,
                new: new as u32,
                drafts,
                samples,
            });
            budget -= new;
            i += 1;
        }
        // Waiting requests: only if nothing was preempted, within budget and max_num_seqs.
        while !preempted
            && budget > 0
            && self.running.len() + self.pulling < cfg.max_num_seqs as usize
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
            let samples = cached as u64 + new >= known as u64;
            plan.shape.add_prefill(new, cached as u64, cap);
            if samples {
                plan.decode.push(DecodeSeq {
                    req: s.id,
                    drafts: 0,
                });
            }
            self.entries.push(Entry {
                slot,
                new: new as u32,
                drafts: 0,
                samples,
            });
            self.waiting.pop_front();
            self.running.push(slot);
            budget -= new;
        }
        #[cfg(debug_assertions)]
        self.check();
    }

    /// Applies a step's outcome: `accepted[j]` drafts for the j-th sampling entry. Adds the
    /// tokens emitted to `sum` and reports first tokens, gaps and finishes in `events`.
    pub fn update(&mut self, accepted: &[u32], sum: &mut StepSummary, events: &mut Vec<InstEvent>) {
        self.step += 1;
        let step = self.step;
        let bs = self.cfg.block_size;
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
            let acc = accepted.get(j).copied().unwrap_or(0).min(e.drafts);
            j += 1;
            // Rejected drafts roll back.
            s.computed -= e.drafts - acc;
            let emitted = (1 + acc).min(s.max_output - s.output);
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
            s.output += emitted;
            sum.tokens += emitted as u64;
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
                    events.push(InstEvent::Finished { req: s.id });
                }
            }
        }
        finished.clear();
        self.finished = finished;
        #[cfg(debug_assertions)]
        self.check();
    }

    /// The rank's step counter (steps applied so far).
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// The KV of a pulling request has arrived: it decodes from the next step.
    pub fn kv_arrived(&mut self, id: ReqId) {
        if let Some(&slot) = self.index.get(&id) {
            let s = Self::seq_mut(&mut self.slab, slot);
            if s.state == State::Pulling {
                s.state = State::Running;
                // The prompt's KV is here; the last prompt token is computed again for its
                // logits, and that step samples the first output token.
                s.computed = s.prompt.saturating_sub(1);
                self.pulling -= 1;
                self.running.push(slot);
            }
        }
    }

    /// A prefill request's KV has been sent: free its blocks.
    pub fn release(&mut self, id: ReqId) {
        if let Some(&slot) = self.index.get(&id) {
            if self.seq(slot).state == State::Held {
                let s = self.remove(slot);
                self.pool.release(&s.blocks);
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
            assert_eq!(
                self.seq(slot).state,
                State::Running,
                "slot {slot} in running"
            );
        }
        let live: Vec<&Seq> = self.slab.iter().flatten().collect();
        assert_eq!(
            live.len(),
            self.index.len(),
            "index covers the live requests"
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
