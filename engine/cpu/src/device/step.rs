//! One step of a CPU instance: each rank's inputs, the forward across ranks, sampling and
//! verification per rank, and MTP drafting across ranks.

use super::{add_heat, failed, CpuDevice, ReqState};
use crate::attention::AttnPath;
use crate::cache::PagedKvCache;
use crate::ep::{ExpertRanks, LayerDispatch};
use crate::forward::RankBatch;
use crate::model::{Model, SeqInput};
use crate::ops::argmax_rows;
use crate::profile::Profiler;
use crate::sampler::{sample, stream_key, Context};
use candle_core::Tensor;
use dstwin_core::device::{
    DeviceError, FinishReason, RankPlan, ReqId, Sampled, ScheduledReq, StepOutcome, StepPlan,
};
use dstwin_core::opgraph::LayerKind;
use std::collections::HashMap;
use std::sync::MutexGuard;

/// One scheduled request's part of a batch.
struct Job {
    req: ReqId,
    inputs: Vec<u32>,
    computed: usize,
    /// Logit rows it asks for (0, or 1 + drafts).
    rows: usize,
    drafts: usize,
}

/// A rank with work this step.
struct RankWork<'p> {
    /// Index in the plan's `ranks` (and the outcome's per-rank lists).
    entry: usize,
    rank: usize,
    plan: &'p RankPlan,
    jobs: Vec<Job>,
}

/// After sampling, per job: positions from `computed` whose successor token is known (the
/// MTP module's inputs), and whether the request wants drafts.
struct Verdicts {
    valid: Vec<usize>,
    wants: Vec<bool>,
}

impl CpuDevice {
    /// Records first-seen requests and builds each scheduled request's inputs.
    fn jobs(&mut self, rp: &RankPlan) -> Result<Vec<Job>, DeviceError> {
        let seed = self.cfg.seed;
        let defaults = self.defaults.clone();
        let rank = &mut self.ranks[rp.rank as usize];
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
        Ok(jobs)
    }

    /// Every rank's part of `plan`: inputs, one forward across the ranks, sampling, drafts.
    pub(super) fn step(
        &mut self,
        plan: &StepPlan,
        out: &mut StepOutcome,
        heat: &mut Vec<Vec<f64>>,
    ) -> Result<(), DeviceError> {
        let mut work = Vec::with_capacity(plan.ranks.len());
        for (entry, rp) in plan.ranks.iter().enumerate() {
            let jobs = self.jobs(rp)?;
            if !jobs.is_empty() {
                work.push(RankWork {
                    entry,
                    rank: rp.rank as usize,
                    plan: rp,
                    jobs,
                });
            }
        }
        if work.is_empty() {
            return Ok(());
        }
        let model = self.model.clone();
        let caches: Vec<_> = work
            .iter()
            .map(|w| self.ranks[w.rank].cache.clone())
            .collect();
        let mut guards = caches
            .iter()
            .map(|c| c.lock().map_err(failed))
            .collect::<Result<Vec<_>, _>>()?;
        let fwd = {
            let seqs: Vec<Vec<SeqInput>> = work
                .iter()
                .map(|w| {
                    w.jobs
                        .iter()
                        .zip(&w.plan.reqs)
                        .map(|(j, r)| SeqInput {
                            blocks: &r.blocks,
                            computed: j.computed,
                            tokens: &j.inputs,
                            logits: j.rows,
                        })
                        .collect()
                })
                .collect();
            let mut batches = batches(&work, &mut guards, &seqs);
            model
                .forward_ranks(
                    &mut batches,
                    &self.experts,
                    self.cfg.path,
                    &mut self.profiler,
                )
                .map_err(failed)?
        };
        self.dispatch.extend(fwd.dispatch);
        for f in &fwd.ranks {
            for (layer, counts) in f.expert_counts.iter().enumerate() {
                add_heat(heat, layer, counts);
            }
        }
        let eos = &model.cfg.eos_token_ids;
        let drafting = self.cfg.spec_tokens > 0;
        let mut verdicts = Vec::with_capacity(work.len());
        for (w, f) in work.iter().zip(&fwd.ranks) {
            self.profiler.at(w.rank, None, LayerKind::LmHead);
            let s = self.profiler.begin();
            let logits: Vec<Vec<f32>> = f.logits.to_vec2().map_err(failed)?;
            let v = sample_jobs(
                &mut self.ranks[w.rank].reqs,
                &w.jobs,
                &logits,
                eos,
                drafting,
                &mut out.accepted[w.entry],
                &mut out.sampled[w.entry],
            );
            self.profiler.end(s, "sample", || {
                crate::args! {"tokens": logits.len(), "seqs": w.jobs.iter().filter(|j| j.rows > 0).count(),
                    "n": model.cfg.vocab}
            });
            verdicts.push(v);
        }
        if drafting {
            let hidden: Vec<Tensor> = fwd.ranks.into_iter().map(|f| f.hidden).collect();
            let mut states: Vec<&mut HashMap<ReqId, ReqState>> = Vec::new();
            {
                // Each rank with work once, in `work` order.
                let mut by_rank: Vec<Option<&mut HashMap<ReqId, ReqState>>> =
                    self.ranks.iter_mut().map(|r| Some(&mut r.reqs)).collect();
                for w in &work {
                    states.push(by_rank[w.rank].take().expect("a rank has one entry"));
                }
            }
            let mut d = Drafting {
                model: &model,
                experts: &self.experts,
                prof: &mut self.profiler,
                path: self.cfg.path,
                heat,
                dispatch: &mut self.dispatch,
            };
            d.propose(
                self.cfg.spec_tokens as usize,
                &work,
                &mut guards,
                &verdicts,
                &hidden,
                &mut states,
            )?;
            if let Some(f) = &self.drafter {
                let k = self.cfg.spec_tokens as usize;
                for ((w, v), st) in work.iter().zip(&verdicts).zip(states.iter_mut()) {
                    for (j, &wants) in w.jobs.iter().zip(&v.wants) {
                        if wants {
                            let st = st.get_mut(&j.req).expect("live");
                            st.drafts = f(j.req, &st.tokens, k);
                            st.drafts.truncate(k);
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// One [`RankBatch`] per rank with work.
fn batches<'a>(
    work: &[RankWork],
    guards: &'a mut [MutexGuard<PagedKvCache>],
    seqs: &'a [Vec<SeqInput<'a>>],
) -> Vec<RankBatch<'a>> {
    work.iter()
        .zip(guards.iter_mut())
        .zip(seqs)
        .map(|((w, g), s)| RankBatch {
            rank: w.rank,
            cache: g,
            seqs: s,
        })
        .collect()
}

/// Verifies drafts and samples, request by request in plan order, appending to the outcome's
/// lists of this rank.
fn sample_jobs(
    states: &mut HashMap<ReqId, ReqState>,
    jobs: &[Job],
    logits: &[Vec<f32>],
    eos: &[u32],
    drafting: bool,
    accepted: &mut Vec<u32>,
    sampled: &mut Vec<Sampled>,
) -> Verdicts {
    let mut row = 0;
    let mut valid = Vec::with_capacity(jobs.len());
    let mut wants = Vec::with_capacity(jobs.len());
    for j in jobs {
        let st = states
            .get_mut(&j.req)
            .expect("inserted when its job was built");
        if j.rows == 0 {
            // A prompt chunk: every position's successor is a known prompt token.
            let v = (j.computed + j.inputs.len()).min(st.tokens.len().saturating_sub(1));
            valid.push(v.saturating_sub(j.computed));
            wants.push(false);
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
        accepted.push((kept.len() - 1).min(acc) as u32);
        // Positions from `computed` whose successors are now known: the inputs up to the last
        // kept token's predecessor.
        valid.push(base + kept.len() - 1 - j.computed);
        wants.push(finish.is_none() && drafting);
        st.drafts.clear();
        sampled.push(Sampled {
            token_ids: kept,
            finish,
        });
    }
    Verdicts { valid, wants }
}

/// What MTP drafting across the ranks uses.
struct Drafting<'a> {
    model: &'a Model,
    experts: &'a ExpertRanks,
    prof: &'a mut Profiler,
    path: AttnPath,
    heat: &'a mut Vec<Vec<f64>>,
    dispatch: &'a mut Vec<LayerDispatch>,
}

/// A drafting request: its row in the last MTP pass's hidden state and its position.
#[derive(Clone, Copy)]
struct Drafter {
    req: ReqId,
    row: u32,
    pos: usize,
}

impl Drafting<'_> {
    /// One MTP pass of `module` across the ranks with a batch: per rank its sequences and the
    /// hidden rows they continue. Returns each such rank's logits and hidden state.
    fn pass(
        &mut self,
        module: usize,
        work: &[RankWork],
        guards: &mut [MutexGuard<PagedKvCache>],
        seqs: &[Vec<SeqInput>],
        hidden: &[Tensor],
    ) -> Result<Vec<Option<(Tensor, Tensor)>>, DeviceError> {
        let mut batches = Vec::new();
        let mut hs = Vec::new();
        for (((w, g), s), h) in work.iter().zip(guards.iter_mut()).zip(seqs).zip(hidden) {
            if !s.is_empty() {
                batches.push(RankBatch {
                    rank: w.rank,
                    cache: g,
                    seqs: s,
                });
                hs.push(h.clone());
            }
        }
        if batches.is_empty() {
            return Ok(vec![None; work.len()]);
        }
        let f = self
            .model
            .mtp_forward_ranks(
                module,
                &mut batches,
                &hs,
                self.experts,
                self.path,
                self.prof,
            )
            .map_err(failed)?;
        self.dispatch.extend(f.dispatch);
        // The MTP modules' MoE layers follow the decoder's.
        let layer = self.model.cfg.layers - self.model.cfg.dense_layers + module;
        let mut done = f.ranks.into_iter();
        Ok(seqs
            .iter()
            .map(|s| {
                if s.is_empty() {
                    return None;
                }
                let r = done.next().expect("one result per batch");
                for counts in &r.expert_counts {
                    add_heat(self.heat, layer, counts);
                }
                Some((r.logits, r.hidden))
            })
            .collect())
    }

    /// Runs the MTP module across the ranks over the positions whose next token is known
    /// (filling its KV layer) and proposes `k` drafts after the last kept token of each request
    /// that wants them.
    fn propose(
        &mut self,
        k: usize,
        work: &[RankWork],
        guards: &mut [MutexGuard<PagedKvCache>],
        verdicts: &[Verdicts],
        hidden: &[Tensor],
        states: &mut [&mut HashMap<ReqId, ReqState>],
    ) -> Result<(), DeviceError> {
        // Per rank: rows of the main forward's hidden state for the valid positions, and their
        // successor tokens.
        let mut next: Vec<Vec<Vec<u32>>> = Vec::with_capacity(work.len());
        let mut firsts_h = Vec::with_capacity(work.len());
        for ((w, v), (h, st)) in work
            .iter()
            .zip(verdicts)
            .zip(hidden.iter().zip(states.iter()))
        {
            let mut rows = Vec::new();
            let mut n = Vec::with_capacity(w.jobs.len());
            let mut start = 0u32;
            for (j, &valid) in w.jobs.iter().zip(&v.valid) {
                rows.extend(start..start + valid as u32);
                start += j.inputs.len() as u32;
                n.push(st[&j.req].tokens[j.computed + 1..j.computed + 1 + valid].to_vec());
            }
            let idx = Tensor::from_slice(&rows, rows.len(), h.device()).map_err(failed)?;
            firsts_h.push(h.index_select(&idx, 0).map_err(failed)?);
            next.push(n);
        }
        let seqs: Vec<Vec<SeqInput>> = work
            .iter()
            .zip(&next)
            .zip(verdicts)
            .map(|((w, n), v)| {
                w.jobs
                    .iter()
                    .zip(&w.plan.reqs)
                    .zip(n)
                    .zip(&v.wants)
                    .filter(|(((_, _), n), _)| !n.is_empty())
                    .map(|(((j, r), n), &wants)| SeqInput {
                        blocks: &r.blocks,
                        computed: j.computed,
                        tokens: n,
                        logits: usize::from(wants),
                    })
                    .collect()
            })
            .collect();
        let first = self.pass(0, work, guards, &seqs, &firsts_h)?;
        // Per rank: the drafting requests, with their row in the pass's hidden state.
        let mut drafting: Vec<Vec<Drafter>> = Vec::with_capacity(work.len());
        let mut prev: Vec<Tensor> = Vec::with_capacity(work.len());
        for ((((w, n), v), res), st) in work
            .iter()
            .zip(&next)
            .zip(verdicts)
            .zip(first)
            .zip(states.iter_mut())
        {
            let mut ds = Vec::new();
            let mut at = 0u32;
            for ((j, n), &wants) in w.jobs.iter().zip(n).zip(&v.wants) {
                if n.is_empty() {
                    continue;
                }
                at += n.len() as u32;
                if wants {
                    ds.push(Drafter {
                        req: j.req,
                        row: at - 1,
                        pos: j.computed + n.len(),
                    });
                }
            }
            match res {
                Some((logits, h)) => {
                    let tokens = argmax_rows(&logits).map_err(failed)?;
                    for (d, t) in ds.iter().zip(tokens) {
                        st.get_mut(&d.req).expect("live").drafts.push(t);
                    }
                    prev.push(h);
                }
                None => prev.push(
                    Tensor::zeros((0, 1), candle_core::DType::F32, &self.model.device)
                        .map_err(failed)?,
                ),
            }
            drafting.push(ds);
        }
        // Further drafts: the MTP module again (the last module for drafts past the modules),
        // from its own hidden state and the draft before, one position on.
        for step in 1..k {
            if drafting.iter().all(Vec::is_empty) {
                break;
            }
            let toks: Vec<Vec<[u32; 1]>> = drafting
                .iter()
                .zip(states.iter())
                .map(|(ds, st)| {
                    ds.iter()
                        .map(|d| [*st[&d.req].drafts.last().expect("drafted")])
                        .collect()
                })
                .collect();
            let seqs: Vec<Vec<SeqInput>> = work
                .iter()
                .zip(&drafting)
                .zip(&toks)
                .map(|((w, ds), ts)| {
                    ds.iter()
                        .zip(ts)
                        .map(|(d, t)| SeqInput {
                            blocks: &scheduled(&w.plan.reqs, d.req).blocks,
                            computed: d.pos + step - 1,
                            tokens: t,
                            logits: 1,
                        })
                        .collect()
                })
                .collect();
            let hs = drafting
                .iter()
                .zip(&prev)
                .map(|(ds, h)| {
                    let rows: Vec<u32> = ds.iter().map(|d| d.row).collect();
                    let idx = Tensor::from_slice(&rows, rows.len(), h.device())?;
                    h.index_select(&idx, 0)
                })
                .collect::<candle_core::Result<Vec<_>>>()
                .map_err(failed)?;
            let module = step.min(self.model.mtp.len() - 1);
            let res = self.pass(module, work, guards, &seqs, &hs)?;
            for (((ds, res), st), p) in drafting
                .iter_mut()
                .zip(res)
                .zip(states.iter_mut())
                .zip(prev.iter_mut())
            {
                let Some((logits, h)) = res else { continue };
                for (d, t) in ds.iter().zip(argmax_rows(&logits).map_err(failed)?) {
                    st.get_mut(&d.req).expect("live").drafts.push(t);
                }
                for (i, d) in ds.iter_mut().enumerate() {
                    d.row = i as u32;
                }
                *p = h;
            }
        }
        Ok(())
    }
}

/// The scheduled entry of `req` in a rank's plan.
fn scheduled(reqs: &[ScheduledReq], req: ReqId) -> &ScheduledReq {
    reqs.iter()
        .find(|r| r.req == req)
        .expect("a drafting request is scheduled")
}
