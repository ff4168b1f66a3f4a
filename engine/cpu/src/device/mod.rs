//! The CPU engine as a dstwin [`Device`]: it executes the scheduler's step plans with the real
//! model, and a [`CpuFabric`] copies KV blocks between its instances.
//!
//! Each DP rank of an instance owns a paged KV pool whose blocks are the scheduler's: a request's
//! block table in the plan addresses real latent KV, so prefix hits reuse cached KV, a preempted
//! request recomputes into fresh blocks and a PD hand-off copies the named blocks. A rank keeps,
//! per request it has seen, the token ids (given on first sight, then extended with what it
//! samples), the sampling parameters and the MTP drafts it proposed; the plan's `freed` list
//! drops them.
//!
//! A step, per rank: the inputs of every scheduled request (the known tokens from `computed`,
//! then the drafts to verify), one batched forward, then per sampling request the verification
//! of its drafts and the next token ([`crate::sampler`]), EOS, and with MTP the next drafts: the
//! MTP module runs over the positions whose next token is now known (filling its own KV layer)
//! and proposes the token after the last one kept. Draft slots the scheduler plans for but the
//! rank has no proposal for (the first decode step after a PD hand-off) carry the last token
//! again; verification rejects what the model would not have produced, so output never depends
//! on it.
//!
//! Ranks of an instance run one after the other; the step's duration is measured.

use crate::attention::AttnPath;
use crate::cache::PagedKvCache;
use crate::model::{Model, SeqInput};
use crate::sampler::{sample, stream_key, Context};
use candle_core::{DType, Tensor};
use dstwin_core::device::{
    Capacity, Device, DeviceError, ExpertHeat, Fabric, FinishReason, InstantFabric, KvTransfer,
    RankPlan, ReqId, Sampled, SamplingParams, StepOutcome, StepPlan,
};
use dstwin_core::time::{SimDuration, SimTime};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A rank's KV pool, shared with the fabric that copies blocks in and out of it.
pub type SharedCache = Arc<Mutex<PagedKvCache>>;

/// How a CPU instance runs.
#[derive(Clone, Debug)]
pub struct CpuDeviceConfig {
    pub dp_ranks: u32,
    pub kv_blocks_per_rank: u64,
    pub block_size: u32,
    /// MTP draft tokens per step (the scheduler's `num_spec_tokens`; 0: no MTP).
    pub spec_tokens: u32,
    pub path: AttnPath,
    /// Seeds the draws of requests that bring no seed.
    pub seed: u64,
}

/// What a rank knows of a request between steps.
struct ReqState {
    /// Prompt, then every token kept.
    tokens: Vec<u32>,
    prompt_len: usize,
    sampling: Arc<SamplingParams>,
    key: u64,
    /// Drafts proposed for the positions after the last token.
    drafts: Vec<u32>,
}

struct Rank {
    cache: SharedCache,
    reqs: HashMap<ReqId, ReqState>,
}

/// Proposes the drafts of a request from its tokens so far (see [`CpuDevice::with_drafter`]).
pub type Drafter = Box<dyn Fn(ReqId, &[u32], usize) -> Vec<u32> + Send>;

/// The CPU engine executing one instance's steps.
pub struct CpuDevice {
    model: Arc<Model>,
    cfg: CpuDeviceConfig,
    ranks: Vec<Rank>,
    defaults: Arc<SamplingParams>,
    drafter: Option<Drafter>,
}

fn failed(e: impl std::fmt::Display) -> DeviceError {
    DeviceError::Failed(e.to_string())
}

/// One scheduled request's part of a batch.
struct Job {
    req: ReqId,
    inputs: Vec<u32>,
    computed: usize,
    /// Logit rows it asks for (0, or 1 + drafts).
    rows: usize,
    drafts: usize,
}

impl CpuDevice {
    /// An instance of `model` with a fresh KV pool per DP rank.
    pub fn new(model: Arc<Model>, cfg: CpuDeviceConfig) -> Result<CpuDevice, DeviceError> {
        if cfg.spec_tokens > 0 && model.mtp.is_empty() {
            return Err(DeviceError::Failed(format!(
                "{} MTP draft tokens per step, but the model has no MTP module (num_nextn_predict_layers = 0)",
                cfg.spec_tokens
            )));
        }
        let ranks = (0..cfg.dp_ranks)
            .map(|_| {
                let cache = PagedKvCache::new(
                    &model.cfg,
                    cfg.kv_blocks_per_rank as usize,
                    cfg.block_size as usize,
                    model.dtype,
                    &model.device,
                )
                .map_err(failed)?;
                Ok(Rank {
                    cache: Arc::new(Mutex::new(cache)),
                    reqs: HashMap::new(),
                })
            })
            .collect::<Result<_, DeviceError>>()?;
        Ok(CpuDevice {
            model,
            cfg,
            ranks,
            defaults: Arc::new(SamplingParams::default()),
            drafter: None,
        })
    }

    /// Replaces the MTP module's proposals with `f(request, tokens so far, k)` (the module
    /// still runs and fills its KV layer). For studies of acceptance with a drafter of known
    /// quality, and for tests of verification: an oracle's drafts must all stand, a liar's
    /// must all fall, and the output must not change either way.
    pub fn with_drafter(mut self, f: Drafter) -> Self {
        self.drafter = Some(f);
        self
    }

    /// The KV pool of each DP rank (for a [`CpuFabric`]).
    pub fn caches(&self) -> Vec<SharedCache> {
        self.ranks.iter().map(|r| r.cache.clone()).collect()
    }

    /// Requests a rank holds state for (tests: freed requests leave no state behind).
    pub fn live_requests(&self) -> usize {
        self.ranks.iter().map(|r| r.reqs.len()).sum()
    }

    fn run_rank(
        &mut self,
        i: usize,
        rp: &RankPlan,
        accepted: &mut Vec<u32>,
        sampled: &mut Vec<Sampled>,
        heat: &mut Vec<Vec<f64>>,
    ) -> Result<(), DeviceError> {
        let model = self.model.clone();
        let eos = &model.cfg.eos_token_ids;
        let seed = self.cfg.seed;
        let defaults = self.defaults.clone();
        let rank = &mut self.ranks[i];
        for f in &rp.freed {
            rank.reqs.remove(f);
        }
        let mut jobs = Vec::with_capacity(rp.reqs.len());
        for r in &rp.reqs {
            if let Some(ids) = &r.token_ids {
                let sampling = r.sampling.clone().unwrap_or_else(|| defaults.clone());
                let key = stream_key(&sampling, seed, r.req);
                rank.reqs.insert(
                    r.req,
                    ReqState {
                        tokens: ids.to_vec(),
                        prompt_len: r.prompt_len as usize,
                        sampling,
                        key,
                        drafts: Vec::new(),
                    },
                );
            }
            let st = rank.reqs.get(&r.req).ok_or_else(|| {
                DeviceError::Failed(format!(
                    "request {} is scheduled but the device never got its token ids",
                    r.req
                ))
            })?;
            let (c, n) = (r.computed as usize, r.new_tokens as usize);
            let known = st.tokens.len();
            if c >= known && n > 0 && c + n > known + r.drafts as usize {
                return Err(DeviceError::Failed(format!(
                    "request {}: {n} tokens from position {c}, but only {known} are known and {} are drafts",
                    r.req, r.drafts
                )));
            }
            let mut inputs = st.tokens[c.min(known)..(c + n).min(known)].to_vec();
            let last = *st.tokens.last().unwrap_or(&0);
            let mut d = st.drafts.iter().copied();
            while inputs.len() < n {
                inputs.push(d.next().unwrap_or(last));
            }
            jobs.push(Job {
                req: r.req,
                inputs,
                computed: c,
                rows: if r.samples { 1 + r.drafts as usize } else { 0 },
                drafts: r.drafts as usize,
            });
        }
        if jobs.is_empty() {
            return Ok(());
        }
        let mut cache = rank.cache.lock().map_err(failed)?;
        let seqs: Vec<SeqInput> = jobs
            .iter()
            .zip(&rp.reqs)
            .map(|(j, r)| SeqInput {
                blocks: &r.blocks,
                computed: j.computed,
                tokens: &j.inputs,
                logits: j.rows,
            })
            .collect();
        let fwd = model
            .forward(&mut cache, &seqs, self.cfg.path)
            .map_err(failed)?;
        for (layer, counts) in fwd.expert_counts.iter().enumerate() {
            add_heat(heat, layer, counts);
        }
        let logits: Vec<Vec<f32>> = fwd.logits.to_vec2().map_err(failed)?;
        // Verify drafts and sample, request by request in plan order.
        let mut row = 0;
        // Per job: tokens now known past `computed` whose successors are known (MTP inputs).
        let mut valid = Vec::with_capacity(jobs.len());
        let mut wants_draft = Vec::with_capacity(jobs.len());
        for j in &jobs {
            let st = rank.reqs.get_mut(&j.req).expect("inserted above");
            if j.rows == 0 {
                // A prompt chunk: every position's successor is a known prompt token.
                let v = (j.computed + j.inputs.len()).min(st.tokens.len().saturating_sub(1));
                valid.push(v.saturating_sub(j.computed));
                wants_draft.push(false);
                continue;
            }
            // The first token produced sits at index `base`.
            let base = j.computed + j.inputs.len() - j.drafts;
            st.tokens.truncate(base);
            let mut kept = Vec::with_capacity(j.drafts + 1);
            let mut acc = 0;
            let mut finish = None;
            for k in 0..=j.drafts {
                let draft = (k < j.drafts).then(|| j.inputs[j.inputs.len() - j.drafts + k]);
                let (t, ok) = sample(
                    &logits[row + k],
                    &st.sampling,
                    &Context {
                        tokens: &st.tokens,
                        prompt_len: st.prompt_len,
                        eos,
                    },
                    st.key,
                    base + k,
                    draft,
                );
                kept.push(t);
                st.tokens.push(t);
                let output = st.tokens.len().saturating_sub(st.prompt_len);
                if !st.sampling.ignore_eos
                    && eos.contains(&t)
                    && output as u64 >= st.sampling.min_tokens as u64
                {
                    finish = Some(FinishReason::Stop);
                    break;
                }
                if !ok {
                    break;
                }
                acc += 1;
            }
            row += j.rows;
            // Accepted drafts: the kept tokens but the last (a finish may cut after a draft).
            let accepted_drafts = (kept.len() - 1).min(acc);
            accepted.push(accepted_drafts as u32);
            // Positions from `computed` whose successors are now known: the inputs up to the
            // last kept token's predecessor.
            valid.push(base + kept.len() - 1 - j.computed);
            wants_draft.push(finish.is_none() && self.cfg.spec_tokens > 0);
            st.drafts.clear();
            sampled.push(Sampled {
                token_ids: kept,
                finish,
            });
        }
        if self.cfg.spec_tokens > 0 {
            let k = self.cfg.spec_tokens as usize;
            propose_drafts(
                &model,
                &mut cache,
                self.cfg.path,
                self.cfg.spec_tokens as usize,
                &jobs,
                &rp.reqs,
                &valid,
                &wants_draft,
                &fwd.hidden,
                &mut rank.reqs,
                heat,
            )?;
            if let Some(f) = &self.drafter {
                for (j, &w) in jobs.iter().zip(&wants_draft) {
                    if w {
                        let st = rank.reqs.get_mut(&j.req).expect("live");
                        st.drafts = f(j.req, &st.tokens, k);
                        st.drafts.truncate(k);
                    }
                }
            }
        }
        Ok(())
    }
}

/// Adds one MoE layer's router counts to the step's heat.
fn add_heat(heat: &mut Vec<Vec<f64>>, layer: usize, counts: &[u32]) {
    if heat.len() <= layer {
        heat.resize(layer + 1, vec![0.0; counts.len()]);
    }
    for (h, &c) in heat[layer].iter_mut().zip(counts) {
        *h += c as f64;
    }
}

/// Runs the MTP module over the positions whose next token is known (filling its KV layer) and
/// proposes `k` drafts after the last kept token of each request that wants them.
#[allow(clippy::too_many_arguments)]
fn propose_drafts(
    model: &Model,
    cache: &mut PagedKvCache,
    path: AttnPath,
    k: usize,
    jobs: &[Job],
    reqs: &[dstwin_core::device::ScheduledReq],
    valid: &[usize],
    wants: &[bool],
    hidden: &Tensor,
    states: &mut HashMap<ReqId, ReqState>,
    heat: &mut Vec<Vec<f64>>,
) -> Result<(), DeviceError> {
    // Rows of the main forward's hidden state for the valid positions, and their successors.
    let mut rows = Vec::new();
    let mut next: Vec<Vec<u32>> = Vec::with_capacity(jobs.len());
    let mut start = 0u32;
    for (j, &v) in jobs.iter().zip(valid) {
        rows.extend(start..start + v as u32);
        start += j.inputs.len() as u32;
        let st = &states[&j.req];
        next.push(st.tokens[j.computed + 1..j.computed + 1 + v].to_vec());
    }
    if rows.is_empty() {
        return Ok(());
    }
    let idx = Tensor::from_slice(&rows, rows.len(), hidden.device()).map_err(failed)?;
    let h = hidden.index_select(&idx, 0).map_err(failed)?;
    let seqs: Vec<SeqInput> = jobs
        .iter()
        .zip(reqs)
        .zip(&next)
        .zip(wants)
        .filter(|(((_, _), n), _)| !n.is_empty())
        .map(|(((j, r), n), &w)| SeqInput {
            blocks: &r.blocks,
            computed: j.computed,
            tokens: n,
            logits: usize::from(w),
        })
        .collect();
    let f = model
        .mtp_forward(0, cache, &seqs, &h, path)
        .map_err(failed)?;
    // The MTP modules' MoE layers follow the decoder's.
    let mtp_heat = model.cfg.layers - model.cfg.dense_layers;
    for counts in &f.expert_counts {
        add_heat(heat, mtp_heat, counts);
    }
    let firsts = crate::ops::argmax_rows(&f.logits).map_err(failed)?;
    // The MTP output hidden row of each drafting request's last position (chained drafts).
    let mut last_rows = Vec::new();
    let mut at = 0u32;
    for ((j, n), &w) in jobs.iter().zip(&next).zip(wants) {
        if n.is_empty() {
            continue;
        }
        at += n.len() as u32;
        if w {
            last_rows.push((j.req, at - 1, j.computed + n.len()));
        }
    }
    for ((req, _, _), &d) in last_rows.iter().zip(&firsts) {
        states.get_mut(req).expect("live").drafts.push(d);
    }
    // Further drafts: the MTP module again (the last module for drafts past the modules), from
    // its own hidden state and the draft before, one position on.
    let mut prev = f.hidden;
    let mut prev_rows: Vec<u32> = last_rows.iter().map(|x| x.1).collect();
    for step in 1..k {
        if last_rows.is_empty() {
            break;
        }
        let idx = Tensor::from_slice(&prev_rows, prev_rows.len(), prev.device()).map_err(failed)?;
        let h = prev.index_select(&idx, 0).map_err(failed)?;
        let toks: Vec<[u32; 1]> = last_rows
            .iter()
            .map(|(req, _, _)| [*states[req].drafts.last().expect("drafted")])
            .collect();
        let seqs: Vec<SeqInput> = last_rows
            .iter()
            .zip(&toks)
            .map(|((req, _, pos), t)| {
                let r = reqs.iter().find(|r| r.req == *req).expect("scheduled");
                SeqInput {
                    blocks: &r.blocks,
                    computed: pos + step - 1,
                    tokens: t,
                    logits: 1,
                }
            })
            .collect();
        let module = step.min(model.mtp.len() - 1);
        let f = model
            .mtp_forward(module, cache, &seqs, &h, path)
            .map_err(failed)?;
        for counts in &f.expert_counts {
            add_heat(heat, mtp_heat + module, counts);
        }
        let ds = crate::ops::argmax_rows(&f.logits).map_err(failed)?;
        for ((req, _, _), d) in last_rows.iter().zip(ds) {
            states.get_mut(req).expect("live").drafts.push(d);
        }
        prev = f.hidden;
        prev_rows = (0..last_rows.len() as u32).collect();
    }
    Ok(())
}

impl Device for CpuDevice {
    fn capacity(&self) -> Capacity {
        let c = &self.model.cfg;
        let elem = if self.model.dtype == DType::F32 { 4 } else { 2 };
        Capacity {
            dp_ranks: self.cfg.dp_ranks,
            kv_blocks_per_rank: self.cfg.kv_blocks_per_rank,
            block_size: self.cfg.block_size,
            kv_bytes_per_token: (c.kv_width() * c.cache_layers() * elem) as f64,
            memory: None,
        }
    }

    fn execute(&mut self, plan: &StepPlan, out: &mut StepOutcome) -> Result<(), DeviceError> {
        if plan.dp_ranks != self.cfg.dp_ranks || plan.ranks.iter().any(|r| r.rank >= plan.dp_ranks)
        {
            return Err(DeviceError::Ranks {
                got: plan.dp_ranks as usize,
                expected: self.cfg.dp_ranks,
            });
        }
        let t0 = Instant::now();
        out.accepted.resize_with(plan.ranks.len(), Vec::new);
        out.sampled.resize_with(plan.ranks.len(), Vec::new);
        let mut heat: Vec<Vec<f64>> = Vec::new();
        for (k, rp) in plan.ranks.iter().enumerate() {
            let mut acc = std::mem::take(&mut out.accepted[k]);
            let mut smp = std::mem::take(&mut out.sampled[k]);
            acc.clear();
            smp.clear();
            self.run_rank(rp.rank as usize, rp, &mut acc, &mut smp, &mut heat)?;
            out.accepted[k] = acc;
            out.sampled[k] = smp;
        }
        out.duration = SimDuration::from_secs_f64(t0.elapsed().as_secs_f64());
        out.class_times = Default::default();
        out.expert_heat = (!heat.is_empty()).then_some(ExpertHeat::Counts(heat));
        Ok(())
    }

    fn wants_requests(&self) -> bool {
        true
    }
}

/// Moves KV blocks between CPU instances: a transfer copies the named blocks of every cache
/// layer from the source rank's pool to the destination's, and is complete at once.
#[derive(Default)]
pub struct CpuFabric {
    /// Per instance, per DP rank, its pool.
    caches: Vec<Vec<SharedCache>>,
    done: InstantFabric,
}

impl CpuFabric {
    /// Adds the next instance's pools (in deployment order).
    pub fn add_instance(&mut self, caches: Vec<SharedCache>) {
        self.caches.push(caches);
    }

    fn pool(&self, instance: u32, rank: u32) -> Result<&SharedCache, DeviceError> {
        self.caches
            .get(instance as usize)
            .and_then(|c| c.get(rank as usize))
            .ok_or_else(|| {
                DeviceError::Failed(format!(
                    "KV transfer names instance {instance} rank {rank}, which the fabric does not have"
                ))
            })
    }
}

impl Fabric for CpuFabric {
    fn start(&mut self, now: SimTime, x: &KvTransfer) -> Result<(), DeviceError> {
        let from = self.pool(x.from.instance, x.from.rank)?.clone();
        let to = self.pool(x.to.instance, x.to.rank)?.clone();
        let len = x.tokens as usize;
        let rows: Vec<Tensor> = {
            let src = from.lock().map_err(failed)?;
            (0..src.layers())
                .map(|l| src.gather(l, &x.from.blocks, len))
                .collect::<candle_core::Result<_>>()
                .map_err(failed)?
        };
        let mut dst = to.lock().map_err(failed)?;
        for (l, r) in rows.iter().enumerate() {
            dst.write(l, &x.to.blocks, 0, r).map_err(failed)?;
        }
        self.done.start(now, x)
    }

    fn next_event(&self) -> Option<SimTime> {
        self.done.next_event()
    }

    fn poll(&mut self, now: SimTime, done: &mut Vec<ReqId>) {
        self.done.poll(now, done);
    }
}
