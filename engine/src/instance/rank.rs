//! The scheduler of one DP rank, vLLM v1 semantics (REFERENCE.md): one token budget per step;
//! running requests first, then waiting ones up to `max_num_seqs`; chunked prefill; paged KV with
//! prefix caching; preemption of the newest running request when KV runs out; MTP lookahead slots
//! and rollback of rejected drafts. IO-free: time comes in as an argument.

use super::kv::{chain, BlockPool};
use super::{InstEvent, InstanceConfig, NewRequest};
use crate::batch::BatchShape;
use crate::device::{DecodeSeq, RankPlan, ReqId};
use crate::layout::Role;
use std::collections::{HashMap, VecDeque};

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
    /// Content keys of the prompt's full blocks (empty: never shared).
    keys: Vec<u64>,
    /// Prompt blocks already registered in the prefix cache.
    hashed: u32,
    state: State,
    remote: bool,
    admitted_once: bool,
}

/// Per-step bookkeeping of one scheduled request.
#[derive(Clone, Copy, Debug)]
struct Entry {
    id: ReqId,
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
    seqs: HashMap<ReqId, Seq>,
    waiting: VecDeque<ReqId>,
    running: Vec<ReqId>,
    pulling: usize,
    entries: Vec<Entry>,
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
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            pulling: 0,
            entries: Vec::new(),
            stats: RankStats::default(),
        }
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

    fn content_keys(&self, r: &NewRequest<'_>) -> Vec<u64> {
        let bs = self.cfg.block_size;
        let full = r.prompt_tokens / bs;
        if !self.cfg.enable_prefix_caching || r.hash_ids.is_empty() || r.hash_block_tokens == 0 {
            return Vec::new();
        }
        let hbt = r.hash_block_tokens;
        (0..full)
            .map_while(|j| {
                let tok = j * bs;
                let id = *r.hash_ids.get((tok / hbt) as usize)?;
                Some(chain(id, ((tok % hbt) / bs) as u64))
            })
            .collect()
    }

    pub fn add(&mut self, r: NewRequest<'_>) {
        let keys = if r.remote_kv {
            Vec::new()
        } else {
            self.content_keys(&r)
        };
        self.seqs.insert(
            r.id,
            Seq {
                id: r.id,
                prompt: r.prompt_tokens,
                max_output: r.max_output_tokens,
                computed: 0,
                output: 0,
                blocks: Vec::new(),
                keys,
                hashed: 0,
                state: State::Waiting,
                remote: r.remote_kv,
                admitted_once: false,
            },
        );
        self.waiting.push_back(r.id);
    }

    /// Tokens a request's KV must hold to compute `new` more tokens plus lookahead slots.
    fn ensure_slots(pool: &mut BlockPool, s: &mut Seq, tokens: u64, bs: u32) -> bool {
        let need = blocks_for(tokens, bs).saturating_sub(s.blocks.len() as u64);
        need == 0 || pool.allocate(need, &mut s.blocks)
    }

    /// Frees a request's blocks and resets it for recompute.
    fn preempt(&mut self, id: ReqId, events: &mut Vec<InstEvent>) {
        let s = self.seqs.get_mut(&id).expect("running request exists");
        self.pool.release(&s.blocks);
        s.blocks.clear();
        s.computed = 0;
        s.hashed = 0;
        self.stats.preemptions += 1;
        if self.cfg.send_back && self.cfg.role != Role::Prefill {
            self.seqs.remove(&id);
            events.push(InstEvent::SentBack { req: id });
        } else {
            // A recomputed request computes its prompt and the tokens it already produced.
            s.remote = false;
            s.state = State::Waiting;
            self.waiting.push_front(id);
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
        let mut budget = cfg.max_num_batched_tokens as u64;
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let s = &self.seqs[&id];
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
                let s = self.seqs.get_mut(&id).expect("running request exists");
                if Self::ensure_slots(&mut self.pool, s, s.computed as u64 + new + k as u64, bs) {
                    fits = true;
                    break;
                }
                let victim = *self.running.last().expect("the current request is running");
                self.running.pop();
                self.preempt(victim, events);
                preempted = true;
                if victim == id {
                    break;
                }
            }
            if !fits {
                // The current request was the newest and is gone; nothing after it remains.
                break;
            }
            let s = &self.seqs[&id];
            let samples = s.computed as u64 + new >= known as u64;
            let drafts = if decoding { (new - 1) as u32 } else { 0 };
            self.push_entry(plan, s.computed, decoding, new as u32, drafts, samples, id);
            budget -= new;
            i += 1;
        }
        // Waiting requests: only if nothing was preempted, within budget and max_num_seqs.
        while !preempted
            && budget > 0
            && self.running.len() + self.pulling < cfg.max_num_seqs as usize
        {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let s = self.seqs.get_mut(&id).expect("waiting request exists");
            if s.remote {
                // Reserve the whole prompt plus the first decode step, then pull the KV.
                let need = s.prompt as u64 + 1 + k as u64;
                if !Self::ensure_slots(&mut self.pool, s, need, bs) {
                    break;
                }
                s.state = State::Pulling;
                self.waiting.pop_front();
                self.pulling += 1;
                pulls.push(id);
                continue;
            }
            // Prefix hits on first admission: full cached blocks, at most prompt - 1 tokens so the
            // last token is computed to get logits.
            if !s.admitted_once {
                self.stats.prefix_queries += s.prompt as u64;
            }
            let max_hit_blocks = (s.prompt.saturating_sub(1) / bs) as usize;
            let mut hit = 0usize;
            let mut parent = 0u64;
            let mut hashes = Vec::new();
            for key in s.keys.iter().take(max_hit_blocks) {
                let h = chain(parent, *key);
                if self.pool.lookup(h).is_none() {
                    break;
                }
                hashes.push(h);
                parent = h;
                hit += 1;
            }
            let cached = (hit as u32) * bs;
            let mut new = (s.prompt + s.output - cached) as u64;
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
            let hits_in_free = hashes
                .iter()
                .filter(|h| self.pool.lookup(**h).is_some_and(|b| self.pool.is_free(b)))
                .count() as u64;
            if need_new_blocks + hits_in_free > self.pool.free() {
                // Waiting requests never preempt.
                break;
            }
            for h in &hashes {
                let b = self.pool.lookup(*h).expect("looked up above");
                self.pool.touch(b);
                s.blocks.push(b);
            }
            let ok = Self::ensure_slots(&mut self.pool, s, cached as u64 + new + k as u64, bs);
            assert!(
                ok,
                "request {id}: free blocks were counted before admission"
            );
            s.hashed = hit as u32;
            s.computed = cached;
            if !s.admitted_once {
                self.stats.prefix_hits += cached as u64;
                s.admitted_once = true;
                started.push(id);
            }
            s.state = State::Running;
            let (computed, prompt) = (s.computed, s.prompt + s.output);
            self.waiting.pop_front();
            self.running.push(id);
            let samples = computed as u64 + new >= prompt as u64;
            self.push_entry(plan, computed, false, new as u32, 0, samples, id);
            budget -= new;
        }
        #[cfg(debug_assertions)]
        self.check();
    }

    #[allow(clippy::too_many_arguments)]
    fn push_entry(
        &mut self,
        plan: &mut RankPlan,
        computed: u32,
        decoding: bool,
        new: u32,
        drafts: u32,
        samples: bool,
        id: ReqId,
    ) {
        let cap = self.cfg.attn_cap;
        if decoding {
            plan.shape.add_decode(new as u64, computed as u64, cap);
        } else {
            plan.shape.add_prefill(new as u64, computed as u64, cap);
        }
        if samples {
            plan.decode.push(DecodeSeq { req: id, drafts });
        }
        self.entries.push(Entry {
            id,
            new,
            drafts,
            samples,
        });
    }

    /// Applies a step's outcome: `accepted[j]` drafts for the j-th sampling entry.
    pub fn update(&mut self, accepted: &[u32], events: &mut Vec<InstEvent>) {
        let bs = self.cfg.block_size;
        let mut j = 0;
        let mut finished = Vec::new();
        for e in std::mem::take(&mut self.entries) {
            let Some(s) = self.seqs.get_mut(&e.id) else {
                continue;
            };
            if s.state != State::Running {
                continue;
            }
            s.computed += e.new;
            // Register newly completed prompt blocks in the prefix cache.
            let full = (s.computed.min(s.prompt) / bs) as usize;
            while (s.hashed as usize) < full.min(s.keys.len()) {
                let idx = s.hashed as usize;
                let h = s.keys[..=idx].iter().fold(0, |p, k| chain(p, *k));
                self.pool.set_hash(s.blocks[idx], h);
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
            s.output += emitted;
            events.push(InstEvent::Tokens {
                req: e.id,
                n: emitted,
            });
            if s.output >= s.max_output {
                finished.push(e.id);
            }
        }
        for id in finished {
            self.running.retain(|&r| r != id);
            if self.cfg.role == Role::Prefill {
                self.seqs
                    .get_mut(&id)
                    .expect("finished request exists")
                    .state = State::Held;
            } else {
                let s = self.seqs.remove(&id).expect("finished request exists");
                self.pool.release(&s.blocks);
            }
        }
        #[cfg(debug_assertions)]
        self.check();
    }

    /// The KV of a pulling request has arrived: it decodes from the next step.
    pub fn kv_arrived(&mut self, id: ReqId) {
        if let Some(s) = self.seqs.get_mut(&id) {
            if s.state == State::Pulling {
                s.state = State::Running;
                // The prompt's KV is here; the last prompt token is computed again for its logits,
                // and that step samples the first output token.
                s.computed = s.prompt.saturating_sub(1);
                self.pulling -= 1;
                self.running.push(id);
            }
        }
    }

    /// A prefill request's KV has been sent: free its blocks.
    pub fn release(&mut self, id: ReqId) {
        if let Some(s) = self.seqs.get(&id) {
            if s.state == State::Held {
                let s = self.seqs.remove(&id).expect("checked above");
                self.pool.release(&s.blocks);
            }
        }
    }

    /// Invariants: no request both waiting and running; states agree with the queues; blocks
    /// conserved; tokens conserved.
    pub fn check(&self) {
        self.pool.check();
        for id in &self.waiting {
            assert_eq!(
                self.seqs[id].state,
                State::Waiting,
                "request {id} in waiting"
            );
            assert!(
                !self.running.contains(id),
                "request {id} both waiting and running"
            );
        }
        for id in &self.running {
            assert_eq!(
                self.seqs[id].state,
                State::Running,
                "request {id} in running"
            );
        }
        let pulling = self
            .seqs
            .values()
            .filter(|s| s.state == State::Pulling)
            .count();
        assert_eq!(pulling, self.pulling, "pulling count");
        let mut held = 0;
        for s in self.seqs.values() {
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
