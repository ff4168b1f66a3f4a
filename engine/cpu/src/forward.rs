//! The batched forward over paged sequences, across the DP ranks of an instance.
//!
//! All ranks of an EP group step in lockstep: no rank can finish a MoE layer without the
//! others, whose tokens may need its experts. So a step runs layer by layer over every rank:
//! attention per rank on its own batch and KV pool, then the MoE layer across all ranks at once
//! (dispatch, experts, combine: [`crate::ep`]), in one process the ranks one after the other.
//! Dense layers and shared experts run per rank. A single process is one rank holding every
//! expert ([`Model::forward`]).

use crate::attention::{AttnPath, SeqSpan};
use crate::cache::PagedKvCache;
use crate::ep::{ExpertRanks, LayerDispatch, MoeInput};
use crate::error::ModelError;
use crate::model::{Forward, Layer, Model, SeqInput};
use crate::moe::Ffn;
use crate::ops::{argmax_rows, rms_norm};
use crate::profile::Profiler;
use candle_core::{DType, Tensor, D};
use dstwin_core::opgraph::LayerKind;

/// One DP rank's batch in a forward across the ranks of an instance.
pub struct RankBatch<'a> {
    pub rank: usize,
    pub cache: &'a mut PagedKvCache,
    pub seqs: &'a [SeqInput<'a>],
}

/// A forward across ranks: each batch's result in batch order, and what each MoE layer moved.
#[derive(Debug)]
pub struct StepForward {
    pub ranks: Vec<Forward>,
    pub dispatch: Vec<LayerDispatch>,
}

/// A checked batch: each sequence's span of rows, every row's position and token id.
struct Prepared<'a> {
    spans: Vec<SeqSpan<'a>>,
    positions: Vec<usize>,
    ids: Vec<u32>,
}

/// A rank's activations between layers.
struct RankState<'a> {
    spans: Vec<SeqSpan<'a>>,
    rope: (Tensor, Tensor),
    x: Tensor,
    /// Rows routed to each expert, per MoE layer run.
    counts: Vec<Vec<u32>>,
}

/// The rows of each sequence's last `logits` positions.
fn logit_rows(seqs: &[SeqInput], spans: &[SeqSpan]) -> Vec<u32> {
    seqs.iter()
        .zip(spans)
        .flat_map(|(s, sp)| (sp.start + sp.len - s.logits..sp.start + sp.len).map(|r| r as u32))
        .collect()
}

impl Model {
    /// Checks a batch against the model and the cache; returns the spans and positions.
    fn prepare<'a>(
        &self,
        cache: &PagedKvCache,
        seqs: &[SeqInput<'a>],
    ) -> Result<Prepared<'a>, ModelError> {
        let mut spans = Vec::with_capacity(seqs.len());
        let mut positions = Vec::new();
        let mut ids = Vec::new();
        for (i, s) in seqs.iter().enumerate() {
            if s.tokens.is_empty() {
                return Err(ModelError::Input {
                    seq: i,
                    message: "no tokens to compute".into(),
                });
            }
            if s.logits > s.tokens.len() {
                return Err(ModelError::Input {
                    seq: i,
                    message: format!(
                        "{} logit rows asked of {} new tokens",
                        s.logits,
                        s.tokens.len()
                    ),
                });
            }
            if let Some(&t) = s.tokens.iter().find(|&&t| t as usize >= self.cfg.vocab) {
                return Err(ModelError::Token {
                    token: t,
                    vocab: self.cfg.vocab,
                });
            }
            cache.check_table(i, s.blocks, s.computed + s.tokens.len())?;
            spans.push(SeqSpan {
                blocks: s.blocks,
                computed: s.computed,
                start: ids.len(),
                len: s.tokens.len(),
            });
            positions.extend(s.computed..s.computed + s.tokens.len());
            ids.extend_from_slice(s.tokens);
        }
        Ok(Prepared {
            spans,
            positions,
            ids,
        })
    }

    /// Decoder layer `index` (its cache layer too) across every rank's batch; `mtp` for an MTP
    /// module's layer. Returns what its MoE layer moved, if it has one.
    #[allow(clippy::too_many_arguments)]
    fn layer_across(
        &self,
        layer: &Layer,
        index: usize,
        mtp: bool,
        batches: &mut [RankBatch],
        states: &mut [RankState],
        experts: &ExpertRanks,
        path: AttnPath,
        prof: &mut Profiler,
    ) -> Result<Option<LayerDispatch>, ModelError> {
        let eps = self.cfg.rms_norm_eps;
        let part = |p| if mtp { LayerKind::Mtp } else { p };
        // Attention: each rank on its own batch and KV pool.
        let mut hs = Vec::with_capacity(states.len());
        for (b, st) in batches.iter_mut().zip(states.iter_mut()) {
            prof.at(b.rank, Some(index), part(LayerKind::Attention));
            let t = st.x.dims2()?.0;
            let s = prof.begin();
            let h = rms_norm(&st.x, &layer.input_norm, eps)?;
            prof.end(s, "attn_norm", || crate::args! {"tokens": t});
            let a = layer.attn.forward(
                &self.cfg, &h, &st.rope.0, &st.rope.1, b.cache, index, &st.spans, path, prof,
            )?;
            let s = prof.begin();
            st.x = (&st.x + a)?;
            let h = rms_norm(&st.x, &layer.post_norm, eps)?;
            prof.end(s, "ffn_norm", || crate::args! {"tokens": t});
            hs.push(h);
        }
        let moe = match &layer.ffn {
            Ffn::Dense(m) => {
                for ((b, st), h) in batches.iter().zip(states.iter_mut()).zip(&hs) {
                    prof.at(b.rank, Some(index), part(LayerKind::DenseFfn));
                    st.x = (&st.x + m.forward_profiled(h, prof)?)?;
                }
                return Ok(None);
            }
            Ffn::Moe(m) => m,
        };
        // MoE: route per rank, the routed experts across all ranks, shared experts per rank.
        let mut routes = Vec::with_capacity(hs.len());
        for (b, h) in batches.iter().zip(&hs) {
            prof.at(b.rank, Some(index), part(LayerKind::Moe));
            routes.push(moe.router.route_profiled(h, prof)?);
        }
        let inputs: Vec<MoeInput> = batches
            .iter()
            .zip(&hs)
            .zip(&routes)
            .map(|((b, x), r)| MoeInput {
                rank: b.rank,
                x,
                routes: r,
            })
            .collect();
        let (routed, stats) = experts.forward(index - self.cfg.dense_layers, &inputs, prof)?;
        for (((b, st), h), (y, counts)) in batches
            .iter()
            .zip(states.iter_mut())
            .zip(&hs)
            .zip(routed.into_iter().zip(&stats.routed))
        {
            prof.at(b.rank, Some(index), part(LayerKind::Moe));
            let mut y = y;
            if let Some(shared) = &moe.shared {
                let s = prof.begin();
                y = (y + shared.forward(h)?)?;
                prof.end(s, "shared_expert", || {
                    crate::args! {"tokens": h.dims()[0], "k": self.cfg.hidden,
                    "n": shared.gate.out_dim()}
                });
            }
            st.x = (&st.x + y)?;
            st.counts.push(counts.clone());
        }
        Ok(Some(stats))
    }

    /// Final norm and LM head over the rows asked for.
    fn head(
        &self,
        x: &Tensor,
        rows: &[u32],
        norm: &Tensor,
        head: &Tensor,
        prof: &mut Profiler,
    ) -> candle_core::Result<Tensor> {
        let s = prof.begin();
        let idx = Tensor::from_slice(rows, rows.len(), x.device())?;
        let h = rms_norm(&x.index_select(&idx, 0)?, norm, self.cfg.rms_norm_eps)?;
        prof.end(s, "final_norm", || crate::args! {"tokens": rows.len()});
        let s = prof.begin();
        let logits = h.matmul(&head.t()?)?.to_dtype(DType::F32)?;
        prof.end(
            s,
            "lm_head",
            || crate::args! {"tokens": rows.len(), "k": self.cfg.hidden, "n": self.cfg.vocab},
        );
        Ok(logits)
    }

    /// A rank's checked batch and its rotary tables.
    fn prepare_rank<'a>(
        &self,
        b: &RankBatch<'a>,
    ) -> Result<(Prepared<'a>, (Tensor, Tensor)), ModelError> {
        let p = self.prepare(b.cache, b.seqs)?;
        let rope = self.rope.tables(&p.positions, self.dtype, &self.device)?;
        Ok((p, rope))
    }

    /// Each rank's results: the logits its sequences asked for through `head` (final norm, LM
    /// head), its hidden state and router counts. `mtp`: the MTP module's layer index.
    fn heads(
        &self,
        batches: &[RankBatch],
        states: Vec<RankState>,
        head: (&Tensor, &Tensor),
        mtp: Option<usize>,
        prof: &mut Profiler,
    ) -> Result<Vec<Forward>, ModelError> {
        let part = if mtp.is_some() {
            LayerKind::Mtp
        } else {
            LayerKind::LmHead
        };
        let mut ranks = Vec::with_capacity(states.len());
        for (b, st) in batches.iter().zip(states) {
            prof.at(b.rank, mtp, part);
            let rows = logit_rows(b.seqs, &st.spans);
            let logits = self.head(&st.x, &rows, head.0, head.1, prof)?;
            ranks.push(Forward {
                logits,
                hidden: st.x,
                expert_counts: st.counts,
            });
        }
        Ok(ranks)
    }

    /// Runs one batch per rank (prompt chunks and decodes mixed) through the whole model:
    /// writes their latents into each rank's cache at their positions and returns the logits
    /// asked for. Every MoE layer runs across the ranks of `experts` (ranks without a batch
    /// compute experts for the others).
    pub fn forward_ranks(
        &self,
        batches: &mut [RankBatch],
        experts: &ExpertRanks,
        path: AttnPath,
        prof: &mut Profiler,
    ) -> Result<StepForward, ModelError> {
        let mut states = Vec::with_capacity(batches.len());
        for b in batches.iter() {
            prof.at(b.rank, None, LayerKind::Embedding);
            let s = prof.begin();
            let (Prepared { spans, ids, .. }, rope) = self.prepare_rank(b)?;
            let idx = Tensor::from_slice(&ids, ids.len(), &self.device)?;
            let x = self.embed.index_select(&idx, 0)?;
            prof.end(
                s,
                "embed",
                || crate::args! {"tokens": ids.len(), "seqs": b.seqs.len()},
            );
            states.push(RankState {
                spans,
                rope,
                x,
                counts: Vec::new(),
            });
        }
        let mut dispatch = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            dispatch.extend(self.layer_across(
                layer,
                i,
                false,
                batches,
                &mut states,
                experts,
                path,
                prof,
            )?);
        }
        let ranks = self.heads(batches, states, (&self.norm, &self.lm_head), None, prof)?;
        Ok(StepForward { ranks, dispatch })
    }

    /// MTP module `k` over one batch per rank: each sequence's `tokens` are the tokens *after*
    /// the positions it covers (position `p` takes token `p + 1`), `hidden[i]` the main model's
    /// [`Forward::hidden`] rows of batch `i` for the same positions. The module's latents go to
    /// cache layer `num_hidden_layers + k`; the logits predict the token after next.
    pub fn mtp_forward_ranks(
        &self,
        k: usize,
        batches: &mut [RankBatch],
        hidden: &[Tensor],
        experts: &ExpertRanks,
        path: AttnPath,
        prof: &mut Profiler,
    ) -> Result<StepForward, ModelError> {
        let m = self.mtp.get(k).ok_or(ModelError::NoMtp)?;
        let eps = self.cfg.rms_norm_eps;
        let index = self.cfg.layers + k;
        let mut states = Vec::with_capacity(batches.len());
        for (b, h) in batches.iter().zip(hidden) {
            prof.at(b.rank, Some(index), LayerKind::Mtp);
            let s = prof.begin();
            let (Prepared { spans, ids, .. }, rope) = self.prepare_rank(b)?;
            if h.dims2()?.0 != ids.len() {
                return Err(ModelError::Input {
                    seq: 0,
                    message: format!("{} hidden rows for {} tokens", h.dims2()?.0, ids.len()),
                });
            }
            let idx = Tensor::from_slice(&ids, ids.len(), &self.device)?;
            let e = rms_norm(&m.embed.index_select(&idx, 0)?, &m.enorm, eps)?;
            let hn = rms_norm(&h.to_dtype(self.dtype)?, &m.hnorm, eps)?;
            let x = m.eh_proj.forward(&Tensor::cat(&[&e, &hn], D::Minus1)?)?;
            prof.end(
                s,
                "mtp_eh_proj",
                || crate::args! {"tokens": ids.len(), "k": 2 * self.cfg.hidden, "n": self.cfg.hidden},
            );
            states.push(RankState {
                spans,
                rope,
                x,
                counts: Vec::new(),
            });
        }
        let dispatch = self.layer_across(
            &m.layer,
            index,
            true,
            batches,
            &mut states,
            experts,
            path,
            prof,
        )?;
        let ranks = self.heads(batches, states, (&m.head_norm, &m.head), Some(index), prof)?;
        Ok(StepForward {
            ranks,
            dispatch: dispatch.into_iter().collect(),
        })
    }

    /// Runs a batch of sequences (prompt chunks and decodes mixed) in one process holding every
    /// expert: writes their latents into `cache` at their positions and returns the logits
    /// asked for.
    pub fn forward(
        &self,
        cache: &mut PagedKvCache,
        seqs: &[SeqInput],
        path: AttnPath,
    ) -> Result<Forward, ModelError> {
        self.one_rank(cache, seqs, |b, ex| {
            self.forward_ranks(b, ex, path, &mut Profiler::off())
        })
    }

    /// [`Model::mtp_forward_ranks`] of one batch in one process holding every expert.
    pub fn mtp_forward(
        &self,
        k: usize,
        cache: &mut PagedKvCache,
        seqs: &[SeqInput],
        hidden: &Tensor,
        path: AttnPath,
    ) -> Result<Forward, ModelError> {
        self.one_rank(cache, seqs, |b, ex| {
            let h = std::slice::from_ref(hidden);
            self.mtp_forward_ranks(k, b, h, ex, path, &mut Profiler::off())
        })
    }

    /// `run` on one rank holding every expert, with `seqs` as its batch.
    fn one_rank(
        &self,
        cache: &mut PagedKvCache,
        seqs: &[SeqInput],
        run: impl FnOnce(&mut [RankBatch], &ExpertRanks) -> Result<StepForward, ModelError>,
    ) -> Result<Forward, ModelError> {
        let experts = ExpertRanks::local(self)?;
        let mut b = [RankBatch {
            rank: 0,
            cache,
            seqs,
        }];
        Ok(run(&mut b, &experts)?.ranks.pop().expect("one rank"))
    }

    /// The model's own greedy continuation of `prompt`, one forward per token on a private
    /// cache: up to `max_tokens` tokens, ending after an end-of-sequence token unless
    /// `ignore_eos`. The reference the scheduler-driven engine is checked against.
    pub fn greedy(
        &self,
        prompt: &[u32],
        max_tokens: usize,
        ignore_eos: bool,
    ) -> Result<Vec<u32>, ModelError> {
        const BS: usize = 16;
        let n = (prompt.len() + max_tokens).div_ceil(BS).max(1);
        let mut cache = PagedKvCache::new(&self.cfg, n, BS, self.dtype, &self.device)?;
        let blocks: Vec<u32> = (0..n as u32).collect();
        let (mut out, mut input, mut computed) = (Vec::new(), prompt.to_vec(), 0);
        while out.len() < max_tokens {
            let f = self.forward(
                &mut cache,
                &[SeqInput {
                    blocks: &blocks,
                    computed,
                    tokens: &input,
                    logits: 1,
                }],
                AttnPath::Auto,
            )?;
            let t = argmax_rows(&f.logits)?[0];
            computed += input.len();
            out.push(t);
            if !ignore_eos && self.cfg.eos_token_ids.contains(&t) {
                break;
            }
            input = vec![t];
        }
        Ok(out)
    }

    /// Greedy draft tokens of MTP module 0, one per logit row asked for.
    pub fn draft(
        &self,
        cache: &mut PagedKvCache,
        seqs: &[SeqInput],
        hidden: &Tensor,
        path: AttnPath,
    ) -> Result<Vec<u32>, ModelError> {
        Ok(argmax_rows(
            &self.mtp_forward(0, cache, seqs, hidden, path)?.logits,
        )?)
    }
}
