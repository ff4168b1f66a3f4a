//! The attention block's ops: MLA in its prefill and absorbed-decode forms, the DSA / V4
//! lightning indexer, the attention TP collectives and V4's per-layer-kind attention
//! (window, compressed, compressed-sparse).

use super::{cp_ranks, hybrid, quantized_hidden_bytes, work, Builder, DieSet, LayerKind};
use crate::batch::BatchShape;
use crate::model::{self, Attention, Indexer};
use dstwin_hwmodels::{CommKind, DType, OpClass};

impl Builder<'_> {
    /// Attention of `repeat` layers for the batch `b`, for one die of a TP group; under
    /// context parallelism, for one die's slice of the step (the heads unsplit).
    pub(super) fn attention(
        &mut self,
        layer: LayerKind,
        repeat: u64,
        b: &BatchShape,
        ratio: Option<u64>,
    ) {
        if self.skips_batch() {
            return;
        }
        let cp = cp_ranks(&self.s, b);
        let whole_b = *b;
        let b = &b.context_split(cp as u64);
        let m = self.s.model;
        let q = self.s.quant;
        let (lin, cdt) = (q.linear_weight(), q.linear_compute());
        let tp = if cp > 1 { 1.0 } else { self.s.plan.tp as f64 };
        let kvb = self.s.kv_dtype.bytes();
        let h = m.hidden as f64;
        let t = b.tokens() as f64;
        let tp_tok = b.prefill_tokens as f64;
        let td = b.decode_tokens as f64;
        // The new keys every die reads: the whole step's, gathered under context parallelism.
        let new_keys = whole_b.prefill_tokens as f64;
        // KV reads happen once per sequence per layer, whatever its draft tokens: scale the
        // per-token pair sums by sequences per token (the whole step's ratio: a die's share of
        // the pairs under context parallelism reads its share of the contexts).
        let kv_reads = |pairs: u64| {
            if whole_b.decode_tokens == 0 {
                0.0
            } else {
                pairs as f64 * whole_b.decode_seqs as f64 / whole_b.decode_tokens as f64
            }
        };
        let act = DType::Bf16.bytes();
        let prompts = b.prefill_tokens > 0;
        // FLASHCOMM1: the residual stream is sharded over the TP group, so norms run on 1/TP of
        // the tokens and the all-reduce splits into a reduce-scatter and an all-gather.
        let fc1 = self.s.features.flashcomm1 && self.s.plan.tp > 1;
        let norm_tokens = if fc1 { t / tp } else { t };
        // MLAPO: norm, q/kv projections, RoPE and the cache write of a decode step in one kernel.
        let mlapo = matches!(m.attention, Attention::Mla { .. })
            && self.s.features.mlapo_applies(b.decode_tokens, prompts);
        // mHC: the residual copies mixed into the attention block's input.
        self.hc_pre(layer, repeat, norm_tokens);
        if !mlapo {
            self.elementwise("attn_norm", layer, repeat, norm_tokens * h);
        }
        match &m.attention {
            Attention::Mla {
                heads,
                q_lora_rank,
                kv_lora_rank,
                qk_nope_dim,
                qk_rope_dim,
                v_head_dim,
                indexer,
            } => {
                let hh = *heads as f64 / tp;
                let ascend = self.s.features.platform.is_ascend();
                // Decode context parallelism (never beside DSA-CP's token split).
                let dcp = if cp > 1 {
                    1.0
                } else {
                    self.s.features.dcp.max(1) as f64
                };
                let (ql, kvl, nope, rope, v) = (
                    *q_lora_rank as f64,
                    *kv_lora_rank as f64,
                    *qk_nope_dim as f64,
                    *qk_rope_dim as f64,
                    *v_head_dim as f64,
                );
                if mlapo {
                    // One kernel: its FLOPs are the projections', its HBM traffic their weights,
                    // the hidden states in and the query and latent out (intermediates stay on
                    // chip).
                    // Without a query LoRA (ql 0) the query comes from the hidden state.
                    let q_in = if ql > 0.0 { ql } else { h };
                    let parts = [
                        (h, ql, lin),
                        (h, kvl + rope, lin),
                        (q_in, hh * (nope + rope), lin),
                        (hh * nope, kvl, DType::Bf16),
                    ];
                    let flops: f64 = parts.iter().map(|(k, n, _)| 2.0 * t * k * n).sum();
                    let weights: f64 = parts.iter().map(|(k, n, w)| k * n * w.bytes()).sum();
                    let io = t * (h + hh * (kvl + rope) + kvl + rope) * act;
                    self.push(
                        "mla_prolog",
                        layer,
                        repeat,
                        DieSet::All,
                        work(OpClass::Gemm, flops, weights + io, cdt, t),
                    );
                } else {
                    // Without a query LoRA (ql 0), one q_proj from the hidden state.
                    let q = hh * (nope + rope);
                    if ql > 0.0 {
                        self.gemm("q_a_proj", layer, repeat, t, h, ql, lin, cdt);
                    } else {
                        self.gemm("q_proj", layer, repeat, t, h, q, lin, cdt);
                    }
                    self.gemm("kv_a_proj", layer, repeat, t, h, kvl + rope, lin, cdt);
                    if ql > 0.0 {
                        self.gemm("q_b_proj", layer, repeat, t, ql, q, lin, cdt);
                    }
                }
                let sparse = indexer.is_some();
                let (pp, pd) = if sparse {
                    (b.prefill_pairs_capped, b.decode_pairs_capped)
                } else {
                    (b.prefill_pairs, b.decode_pairs)
                };
                if b.prefill_tokens > 0 {
                    let first = self.ops.len();
                    // Prefill form: up-project the latent to per-head K and V, then attend. The
                    // tokens already cached before this chunk (prefix hits, earlier chunks) are
                    // read back from the latent cache and up-projected again, as MLA's
                    // chunked-context prefill does; sparse attention attends in the latent space
                    // and skips this.
                    let cached = if sparse { 0.0 } else { b.prefill_cached as f64 };
                    let up_rows = tp_tok + cached;
                    self.gemm(
                        "kv_b_proj",
                        layer,
                        repeat,
                        up_rows,
                        kvl,
                        hh * (nope + v),
                        lin,
                        cdt,
                    );
                    let flops = 2.0 * pp as f64 * hh * (nope + rope + v);
                    let bytes = up_rows * hh * (2.0 * (nope + rope) + 2.0 * v) * act
                        + cached * (kvl + rope) * kvb;
                    self.push(
                        "attn_prefill",
                        layer,
                        repeat,
                        DieSet::All,
                        work(
                            OpClass::PrefillAttention,
                            flops,
                            bytes,
                            DType::Bf16,
                            tp_tok * hh,
                        ),
                    );
                    self.per_sequence(first, b.prefill_seqs);
                }
                if b.decode_tokens > 0 {
                    let first = self.ops.len();
                    // Absorbed form: attend in the latent space, W_UK and W_UV folded into the query
                    // and output sides.
                    if !mlapo {
                        self.gemm(
                            "q_absorb",
                            layer,
                            repeat,
                            td,
                            hh * nope,
                            kvl,
                            lin,
                            DType::Bf16,
                        );
                    }
                    // Under DCP each die attends its group's gathered heads over its share
                    // of every context.
                    let (ah, share) = (hh * dcp, pd as f64 / dcp);
                    let flops = 2.0 * share * ah * (kvl + rope + kvl);
                    let bytes = kv_reads(pd) / dcp * (kvl + rope) * kvb
                        + td * ah * (kvl + rope + kvl) * act;
                    self.push(
                        "attn_decode",
                        layer,
                        repeat,
                        DieSet::All,
                        work(OpClass::Attention, flops, bytes, DType::Bf16, td * ah),
                    );
                    self.gemm("v_absorb", layer, repeat, td, hh * kvl, v, lin, DType::Bf16);
                    self.per_sequence(first, b.decode_seqs);
                    if dcp > 1.0 {
                        self.dcp_decode(layer, repeat, td * ah, kvl, rope);
                    }
                }
                if dcp > 1.0 && b.prefill_cached > 0 {
                    // The prompts' cached context (earlier chunks, prefix hits) lies spread
                    // over the DCP group: gathered before the prompts attend it.
                    self.collective(
                        "dcp_context_all_gather",
                        layer,
                        repeat,
                        CommKind::AllGather,
                        b.prefill_cached as f64 * (kvl + rope) * kvb,
                        dcp as u32,
                    );
                }
                if let Some(ix) = indexer {
                    // Indexer keys replicated on every die (Ascend) score the whole context;
                    // sharded ones (GPUs) score the die's share, whose top-k candidates
                    // (score and position, 4 bytes each) the group gathers and merges.
                    let shard = if dcp > 1.0 && !ascend { dcp } else { 1.0 };
                    let pairs = (b.prefill_pairs + b.decode_pairs) as f64 / shard;
                    let reads = (kv_reads(b.decode_pairs) + new_keys) / shard;
                    self.indexer(layer, repeat, t, ql, ix, pairs, reads, true);
                    if shard > 1.0 {
                        self.collective(
                            "dcp_topk_gather",
                            layer,
                            repeat,
                            CommKind::AllGather,
                            t * ix.topk as f64 * 8.0 * shard,
                            dcp as u32,
                        );
                    }
                }
                self.gemm("o_proj", layer, repeat, t, hh * v, h, lin, cdt);
            }
            Attention::Hybrid {
                heads,
                head_dim,
                q_lora_rank,
                o_lora_rank,
                o_groups,
                window,
                indexer,
                ..
            } => {
                let hh = *heads as f64 / tp;
                let (hd, ql, ol, og, w) = (
                    *head_dim as f64,
                    *q_lora_rank as f64,
                    *o_lora_rank as f64,
                    *o_groups as f64,
                    *window as f64,
                );
                self.gemm("q_a_proj", layer, repeat, t, h, ql, lin, cdt);
                self.gemm("kv_proj", layer, repeat, t, h, hd, lin, cdt);
                self.gemm("q_b_proj", layer, repeat, t, ql, hh * hd, lin, cdt);
                let r = ratio.unwrap_or(0);
                let csa = m.sparse_ratio();
                // Keys per query: the sliding window plus compressed entries (top-k of them in
                // the indexed layers, all of them in the heavily compressed ones).
                let window_keys = ((b.prefill_pairs + b.decode_pairs) as f64).min(t * w);
                let (comp_p, comp_d) = match r {
                    0 => (0.0, 0.0),
                    r if Some(r) == csa => (
                        b.prefill_pairs_capped as f64 / r as f64,
                        b.decode_pairs_capped as f64 / r as f64,
                    ),
                    r => (
                        b.prefill_pairs as f64 / r as f64,
                        b.decode_pairs as f64 / r as f64,
                    ),
                };
                // The KV compressors: every token updates the window states; a step of t
                // tokens completes t / r windows on average, each pooled into an entry.
                for c in m.compressors(r) {
                    let (project, pool) = hybrid::names(&c);
                    self.push_work(project, layer, repeat, hybrid::project(&c, h, t));
                    let entries = t / r as f64;
                    let w = hybrid::pool(&c, hybrid::rope_dim(m), entries);
                    self.push_work(pool, layer, repeat, w);
                }
                let keys = window_keys + comp_p + comp_d;
                let flops = 2.0 * keys * hh * 2.0 * hd;
                let read_d = kv_reads(b.decode_pairs_capped.min(b.decode_pairs)) / r.max(1) as f64
                    * f64::from(r > 0)
                    + b.decode_seqs as f64 * w;
                let bytes = (read_d + new_keys) * hd * kvb + t * hh * 2.0 * hd * act;
                let (name, class) = if b.decode_tokens > 0 && b.prefill_tokens == 0 {
                    ("attn_decode", OpClass::Attention)
                } else {
                    ("attn_prefill", OpClass::PrefillAttention)
                };
                self.push(
                    name,
                    layer,
                    repeat,
                    DieSet::All,
                    work(class, flops, bytes, DType::Bf16, t * hh),
                );
                if r > 0 && Some(r) == csa {
                    // Its keys come from its own compressor (`c4li`), not a projection.
                    let pairs = (b.prefill_pairs + b.decode_pairs) as f64 / r as f64;
                    let reads = kv_reads(b.decode_pairs) / r as f64 + new_keys;
                    self.indexer(layer, repeat, t, ql, indexer, pairs, reads, false);
                }
                // Grouped low-rank output: each group maps its heads to o_lora (block-diagonal).
                self.gemm("o_a_proj", layer, repeat, t, hh * hd, ol, lin, cdt);
                self.gemm("o_b_proj", layer, repeat, t, og * ol / tp, h, lin, cdt);
            }
        }
        if cp > 1 {
            // Every die attends the whole context: the step's new latent KV (and indexer keys)
            // are gathered from the group; the outputs stay with their tokens.
            // (A sliding-window layer needs only its neighbours' window: taken as nothing.)
            let per_token = model::layer_bytes_per_token(
                m,
                self.s.kv_dtype.bytes(),
                self.index_key(),
                ratio.unwrap_or(0),
            );
            self.collective(
                "cp_kv_all_gather",
                layer,
                repeat,
                CommKind::AllGather,
                whole_b.tokens() as f64 * per_token,
                cp,
            );
        } else if self.s.plan.tp > 1 {
            if fc1 {
                self.collective(
                    "attn_reduce_scatter",
                    layer,
                    repeat,
                    CommKind::ReduceScatter,
                    t * h * act,
                    self.s.plan.tp,
                );
            } else {
                self.all_reduce(
                    "attn_all_reduce",
                    layer,
                    repeat,
                    t * h * act,
                    self.s.plan.tp,
                );
            }
        }
        // mHC: the attention output spread back over the residual copies, which are mixed
        // again into the FFN's input.
        self.hc_post(layer, repeat, norm_tokens);
        self.hc_pre(layer, repeat, norm_tokens);
        self.elementwise("ffn_norm", layer, repeat, norm_tokens * h);
        let dtp = self.s.plan.dense_tp;
        if cp > 1 && dtp > 1 {
            // The dense layers' TP group gathers its dies' slices (quantized, as FLASHCOMM1's).
            self.collective(
                "ffn_all_gather",
                layer,
                repeat,
                CommKind::AllGather,
                t * dtp as f64 * quantized_hidden_bytes(q, h),
                dtp,
            );
        } else if fc1 && cp == 1 {
            // The all-gather runs after the norm and the activations' quantization, so it moves
            // the quantized hidden state (INT8 under W8A8) instead of BF16.
            self.collective(
                "ffn_all_gather",
                layer,
                repeat,
                CommKind::AllGather,
                t * quantized_hidden_bytes(q, h),
                self.s.plan.tp,
            );
        }
    }

    /// Decode context parallelism's collectives around the decode attention of `rows` query
    /// rows (tokens x the group's heads) over a latent of `kvl` and a rope key of `rope`: the
    /// group's absorbed queries all-gathered over heads, then the partial outputs and their
    /// log-sum-exp returned to their heads' dies (an all-to-all moving what a reduce-scatter
    /// of the whole buffer moves, priced as one): on Ascend one fp32 buffer of the output
    /// with its LSE appended (vllm-ascend's `_process_attn_out_lse`), on GPUs the bf16 output
    /// and an fp32 LSE (vLLM's `cp_lse_ag_out_rs`).
    fn dcp_decode(&mut self, layer: LayerKind, repeat: u64, rows: f64, kvl: f64, rope: f64) {
        let act = DType::Bf16.bytes();
        let group = self.s.features.dcp;
        let out = if self.s.features.platform.is_ascend() {
            (kvl + 1.0) * 4.0
        } else {
            kvl * act + 4.0
        };
        let (q, o) = (rows * (kvl + rope) * act, rows * out);
        self.collective(
            "dcp_q_all_gather",
            layer,
            repeat,
            CommKind::AllGather,
            q,
            group,
        );
        self.collective(
            "dcp_out_all_to_all",
            layer,
            repeat,
            CommKind::ReduceScatter,
            o,
            group,
        );
    }

    /// The format the indexer keys are cached and scored in ([`model::index_key_dtype`]).
    pub(super) fn index_key(&self) -> DType {
        let ascend = self.s.features.platform.is_ascend();
        model::index_key_dtype(self.s.model, self.s.kv_dtype, ascend)
    }

    /// A sparse-attention indexer: its projections (with a key projection when `key_proj`; V4's
    /// keys come from a compressor instead), scores in the keys' format
    /// ([`model::index_key_dtype`]) over `pairs` query-key pairs that read `key_reads` cached
    /// keys, and the top-k selection.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn indexer(
        &mut self,
        layer: LayerKind,
        repeat: u64,
        t: f64,
        q_lora: f64,
        ix: &Indexer,
        pairs: f64,
        key_reads: f64,
        key_proj: bool,
    ) {
        let (ih, id) = (ix.heads as f64, ix.head_dim as f64);
        self.indexer_proj(layer, repeat, t, q_lora, ih, id, key_proj);
        // Scored in the keys' own format.
        let dtype = self.index_key();
        let key = model::index_key_bytes(ix.head_dim, dtype);
        let w = work(
            OpClass::Indexer,
            2.0 * pairs * ih * id,
            key_reads * key,
            dtype,
            t * ih,
        );
        self.push("indexer_score", layer, repeat, DieSet::All, w);
        self.elementwise("indexer_topk", layer, repeat, pairs / id.max(1.0));
    }

    /// The indexer's projections: queries from the q latent, one key (`key_proj`) and the
    /// per-head weights from the hidden state.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn indexer_proj(
        &mut self,
        layer: LayerKind,
        repeat: u64,
        t: f64,
        q_lora: f64,
        heads: f64,
        dim: f64,
        key_proj: bool,
    ) {
        let (lin, cdt) = (self.s.quant.linear_weight(), self.s.quant.linear_compute());
        let h = self.s.model.hidden as f64;
        self.gemm("indexer_q", layer, repeat, t, q_lora, heads * dim, lin, cdt);
        if key_proj {
            self.gemm("indexer_k", layer, repeat, t, h, dim, lin, cdt);
        }
        self.gemm("indexer_w", layer, repeat, t, h, heads, lin, cdt);
    }
}
