//! The per-step op graph: the one description of the work of a forward step.
//!
//! Given a model, a quantization, a validated plan and a DP rank's [`BatchShape`], it lists every
//! op one die executes (with how many layers repeat it and which dies run it): MLA projections and
//! attention in prefill and absorbed-decode forms, the DSA / V4 indexer, dense FFN, gating,
//! dispatch, grouped expert GEMMs, shared expert, combine, TP collectives, norms, LM head, and the
//! MTP module; for V4 also its hyper-connections and KV compressors (`hybrid`). The simulator
//! prices it, calibration maps profiler kernels onto its op names, and a real engine executes the
//! same ops.

mod hybrid;
pub use hybrid::{hc_head, hc_post, hc_pre, kernel_compressor, kernel_ops};

use crate::batch::BatchShape;
use crate::features::{MoeCommUsed, Resolved};
use crate::layout::{Plan, Role};
use crate::model::{self, Attention, Indexer, ModelConfig, Quant};
use dstwin_hwmodels::{A2aMode, Comm, CommKind, DType, OpClass, Work};
use serde::Serialize;
use std::collections::BTreeMap;

/// Bytes of per-group scales added to each quantized dispatched token (one fp32 per 128 values).
const DISPATCH_SCALE_GROUP: f64 = 128.0;
const SCALE_BYTES: f64 = 4.0;

/// Where in the model an op sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    Embedding,
    /// Attention of any decoder layer.
    Attention,
    DenseFfn,
    Moe,
    /// The MTP module (its attention, MoE and head), all passes.
    Mtp,
    LmHead,
}

impl LayerKind {
    pub fn name(self) -> &'static str {
        match self {
            LayerKind::Embedding => "embedding",
            LayerKind::Attention => "attention",
            LayerKind::DenseFfn => "dense_ffn",
            LayerKind::Moe => "moe",
            LayerKind::Mtp => "mtp",
            LayerKind::LmHead => "lm_head",
        }
    }
}

/// Which dies run an op. Expert dies and shared-expert dies work in parallel; the step waits for
/// the slower set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DieSet {
    All,
    RoutedExperts,
    SharedExperts,
}

/// Compute or communication.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    Compute(Work),
    Comm(Comm),
}

/// One op as one die runs it, `repeat` times per step.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Op {
    pub name: &'static str,
    pub layer: LayerKind,
    pub repeat: u64,
    pub dies: DieSet,
    pub kind: OpKind,
    /// The part of the step it belongs to.
    #[serde(skip)]
    pub part: Part,
}

/// The two parts of a step's ops, each fixed by less than the whole step: the twin prices
/// them apart and caches each under what fixes it ([`step_part_ops_into`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Part {
    /// Everything outside the MoE blocks (attention, dense FFN, norms, heads, the MTP
    /// module's own layers): fixed by the rank's batch alone, and run on every die.
    #[default]
    Batch,
    /// The MoE blocks (router, dispatch, routed and shared experts, combine, of the decoder
    /// and the MTP module): fixed by the step's [`MoeLoad`] and what [`moe_reads`] reads of
    /// the batch. The only ops on expert dies.
    Moe,
}

impl Op {
    /// The op's class as reports name it: its compute class (`gemm`, `grouped_gemm`,
    /// `attention`, `indexer`, `elementwise`) or its collective (`dispatch`, `combine`, ...).
    pub fn class_name(&self) -> &'static str {
        match self.kind {
            OpKind::Compute(w) => w.class.name(),
            OpKind::Comm(c) => c.kind.name(),
        }
    }
}

/// Routed-expert load across the EP group.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct MoeLoad {
    /// Tokens entering the MoE layers across all DP ranks of the EP group this step.
    pub group_tokens: u64,
    /// Tokens on the hottest routed die over the mean (1.0 = perfect balance).
    pub imbalance: f64,
    /// How the step's MoE tokens reach their experts (decided for the whole EP group:
    /// [`Resolved::moe_comm`]).
    pub comm: MoeCommUsed,
}

/// What, besides the batch, fixes a step's ops.
#[derive(Clone, Copy, Debug)]
pub struct StepSpec<'a> {
    pub model: &'a ModelConfig,
    pub quant: Quant,
    pub kv_dtype: DType,
    pub plan: &'a Plan,
    /// MTP draft tokens per step (0 = no MTP).
    pub mtp_tokens: u32,
    /// The instance's engine mechanisms (MLAPO, FLASHCOMM1 change the ops).
    pub features: &'a Resolved,
}

/// Builds the op list of one step.
struct Builder<'a> {
    s: StepSpec<'a>,
    ops: Vec<Op>,
    /// The part the ops pushed now belong to, and the part kept (`None`: both).
    part: Part,
    keep: Option<Part>,
}

/// Compute work of `rows` rows (0: an op without a row dimension, e.g. elementwise).
fn compute(class: OpClass, flops: f64, bytes: f64, dtype: DType, rows: f64) -> Work {
    Work {
        class,
        flops,
        bytes,
        dtype,
        rows,
        slice: 0.0,
    }
}

/// [`compute`] as an op's kind.
fn work(class: OpClass, flops: f64, bytes: f64, dtype: DType, rows: f64) -> OpKind {
    OpKind::Compute(compute(class, flops, bytes, dtype, rows))
}

/// Bytes of one token's hidden state after the activations' quantization (INT8 under W8A8,
/// with its per-group scales), as FLASHCOMM1's all-gather moves it.
fn quantized_hidden_bytes(q: Quant, h: f64) -> f64 {
    match q.linear_compute() {
        DType::Int8 | DType::Int4 | DType::Fp8 => {
            h + (h / DISPATCH_SCALE_GROUP).ceil() * SCALE_BYTES
        }
        _ => h * DType::Bf16.bytes(),
    }
}

impl Builder<'_> {
    /// Whether the batch part's ops are left out: the builders of many ops return at once
    /// (`push` would drop them one by one).
    fn skips_batch(&self) -> bool {
        self.keep == Some(Part::Moe)
    }

    fn push(
        &mut self,
        name: &'static str,
        layer: LayerKind,
        repeat: u64,
        dies: DieSet,
        kind: OpKind,
    ) {
        debug_assert!(
            self.part == Part::Moe || dies == DieSet::All,
            "{name}: only MoE ops run on expert dies"
        );
        if repeat == 0 || self.keep.is_some_and(|k| k != self.part) {
            return;
        }
        let empty = match &kind {
            OpKind::Compute(w) => w.flops <= 0.0 && w.bytes <= 0.0,
            OpKind::Comm(c) => c.bytes <= 0.0 || c.group <= 1,
        };
        if !empty {
            self.ops.push(Op {
                name,
                layer,
                repeat,
                dies,
                kind,
                part: self.part,
            });
        }
    }

    /// With `attention_per_sequence`, the ops pushed from `first` on run once per sequence of
    /// `seqs`, each on its share of the work (an equal share: the cost is linear in the work but
    /// for the fixed cost per kernel and the row padding, which now count per sequence).
    fn per_sequence(&mut self, first: usize, seqs: u32) {
        if !self.s.features.attention_per_sequence || seqs <= 1 {
            return;
        }
        let n = f64::from(seqs);
        for op in &mut self.ops[first..] {
            op.repeat *= u64::from(seqs);
            if let OpKind::Compute(w) = &mut op.kind {
                w.flops /= n;
                w.bytes /= n;
                w.rows /= n;
            }
        }
    }

    /// Compute work on every die.
    fn push_work(&mut self, name: &'static str, layer: LayerKind, repeat: u64, w: Work) {
        self.push(name, layer, repeat, DieSet::All, OpKind::Compute(w));
    }

    /// `hc_pre` over `tokens` tokens, for a model with hyper-connections.
    fn hc_pre(&mut self, layer: LayerKind, repeat: u64, tokens: f64) {
        if let Some(w) = hc_pre(self.s.model, tokens) {
            self.push_work("hc_pre", layer, repeat, w);
        }
    }

    /// `hc_post` over `tokens` tokens, for a model with hyper-connections.
    fn hc_post(&mut self, layer: LayerKind, repeat: u64, tokens: f64) {
        if let Some(w) = hc_post(self.s.model, tokens) {
            self.push_work("hc_post", layer, repeat, w);
        }
    }

    /// A GEMM of `tokens` x `k` by `k` x `n`, weights stored as `wdt`, math in `cdt`.
    // The arguments are the GEMM's shape and formats; a struct would only rename them.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &mut self,
        name: &'static str,
        layer: LayerKind,
        repeat: u64,
        tokens: f64,
        k: f64,
        n: f64,
        wdt: DType,
        cdt: DType,
    ) {
        let act = DType::Bf16.bytes();
        let flops = 2.0 * tokens * k * n;
        let bytes = k * n * wdt.bytes() + tokens * (k + n) * act;
        self.push(
            name,
            layer,
            repeat,
            DieSet::All,
            work(OpClass::Gemm, flops, bytes, cdt, tokens),
        );
    }

    fn elementwise(&mut self, name: &'static str, layer: LayerKind, repeat: u64, elems: f64) {
        // Read and write once, a few flops per element.
        let bytes = 2.0 * elems * DType::Bf16.bytes();
        self.push(
            name,
            layer,
            repeat,
            DieSet::All,
            work(OpClass::Elementwise, 4.0 * elems, bytes, DType::Bf16, 0.0),
        );
    }

    fn all_reduce(
        &mut self,
        name: &'static str,
        layer: LayerKind,
        repeat: u64,
        bytes: f64,
        group: u32,
    ) {
        self.collective(name, layer, repeat, CommKind::AllReduce, bytes, group);
    }

    /// The tokens the dense FFN, the router and a local shared expert of one die compute for
    /// a step of `b`, and the tokens it dispatches to the routed experts. Attention TP
    /// leaves every token on every die of the group (each dispatches 1/TP of them); context
    /// parallelism leaves each die its slice, which with dense_tp > 1 is gathered over the
    /// dense-TP group after every attention (as FLASHCOMM1 gathers), so the dense FFN, router
    /// and local shared expert compute the group's tokens; each die still dispatches its own.
    fn ffn_tokens(&self, b: &BatchShape) -> (f64, f64) {
        let p = self.s.plan;
        let tokens = b.tokens() as f64;
        match cp_ranks(&self.s, b) {
            1 => (tokens, tokens / p.tp as f64),
            cp => {
                let own = tokens / cp as f64;
                (own * p.dense_tp as f64, own)
            }
        }
    }

    /// Attention of `repeat` layers for the batch `b`, for one die of a TP group; under
    /// context parallelism, for one die's slice of the step (the heads unsplit).
    fn attention(&mut self, layer: LayerKind, repeat: u64, b: &BatchShape, ratio: Option<u64>) {
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
                    let parts = [
                        (h, ql, lin),
                        (h, kvl + rope, lin),
                        (ql, hh * (nope + rope), lin),
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
                    self.gemm("q_a_proj", layer, repeat, t, h, ql, lin, cdt);
                    self.gemm("kv_a_proj", layer, repeat, t, h, kvl + rope, lin, cdt);
                    self.gemm(
                        "q_b_proj",
                        layer,
                        repeat,
                        t,
                        ql,
                        hh * (nope + rope),
                        lin,
                        cdt,
                    );
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
                    let flops = 2.0 * pd as f64 * hh * (kvl + rope + kvl);
                    let bytes =
                        kv_reads(pd) * (kvl + rope) * kvb + td * hh * (kvl + rope + kvl) * act;
                    self.push(
                        "attn_decode",
                        layer,
                        repeat,
                        DieSet::All,
                        work(OpClass::Attention, flops, bytes, DType::Bf16, td * hh),
                    );
                    self.gemm("v_absorb", layer, repeat, td, hh * kvl, v, lin, DType::Bf16);
                    self.per_sequence(first, b.decode_seqs);
                }
                if let Some(ix) = indexer {
                    let pairs = (b.prefill_pairs + b.decode_pairs) as f64;
                    let reads = kv_reads(b.decode_pairs) + new_keys;
                    self.indexer(layer, repeat, t, ql, ix, pairs, reads, true);
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

    fn collective(
        &mut self,
        name: &'static str,
        layer: LayerKind,
        repeat: u64,
        kind: CommKind,
        bytes: f64,
        group: u32,
    ) {
        self.push(
            name,
            layer,
            repeat,
            DieSet::All,
            OpKind::Comm(Comm {
                kind,
                bytes,
                group,
                mode: A2aMode::Normal,
                copies: 0.0,
            }),
        );
    }

    /// The format the indexer keys are cached and scored in ([`model::index_key_dtype`]).
    fn index_key(&self) -> DType {
        let ascend = self.s.features.platform.is_ascend();
        model::index_key_dtype(self.s.model, self.s.kv_dtype, ascend)
    }

    /// A sparse-attention indexer: its projections (with a key projection when `key_proj`; V4's
    /// keys come from a compressor instead), scores in the keys' format
    /// ([`model::index_key_dtype`]) over `pairs` query-key pairs that read `key_reads` cached
    /// keys, and the top-k selection.
    #[allow(clippy::too_many_arguments)]
    fn indexer(
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
    fn indexer_proj(
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

    fn dense_ffn(&mut self, repeat: u64, b: &BatchShape) {
        if self.skips_batch() {
            return;
        }
        let m = self.s.model;
        let q = self.s.quant;
        let dtp = self.s.plan.dense_tp;
        let (t, _) = self.ffn_tokens(b);
        let h = m.hidden as f64;
        let f = m.dense_ffn as f64 / dtp as f64;
        self.gemm(
            "ffn_gate_up",
            LayerKind::DenseFfn,
            repeat,
            t,
            h,
            2.0 * f,
            q.linear_weight(),
            q.linear_compute(),
        );
        self.elementwise("ffn_act", LayerKind::DenseFfn, repeat, t * 2.0 * f);
        self.gemm(
            "ffn_down",
            LayerKind::DenseFfn,
            repeat,
            t,
            f,
            h,
            q.linear_weight(),
            q.linear_compute(),
        );
        if dtp > 1 && cp_ranks(&self.s, b) > 1 {
            // Back to each die's slice of the tokens.
            self.collective(
                "ffn_reduce_scatter",
                LayerKind::DenseFfn,
                repeat,
                CommKind::ReduceScatter,
                t * h * DType::Bf16.bytes(),
                dtp,
            );
        } else if dtp > 1 {
            self.all_reduce(
                "ffn_all_reduce",
                LayerKind::DenseFfn,
                repeat,
                t * h * DType::Bf16.bytes(),
                dtp,
            );
        }
    }

    /// One MoE layer, `repeat` times, for one die: the step's [`Part::Moe`]. It reads of `b`
    /// its tokens alone ([`moe_reads`]).
    fn moe(&mut self, layer: LayerKind, repeat: u64, b: &BatchShape, load: &MoeLoad) {
        if self.keep == Some(Part::Batch) {
            return;
        }
        self.part = Part::Moe;
        let (t, own) = self.ffn_tokens(b);
        self.moe_ops(layer, repeat, t, own, load);
        self.part = Part::Batch;
    }

    /// The MoE ops of one die that routes `t` tokens (and runs a local shared expert on them)
    /// and dispatches `own` of them.
    fn moe_ops(&mut self, layer: LayerKind, repeat: u64, t: f64, own: f64, load: &MoeLoad) {
        let m = self.s.model;
        let q = self.s.quant;
        let p = self.s.plan;
        let h = m.hidden as f64;
        let act = DType::Bf16.bytes();
        // The router runs in bf16 on every token the die holds (under attention TP, every
        // token of the rank, replicated over its TP dies).
        self.gemm(
            "router",
            layer,
            repeat,
            t,
            h,
            m.routed_experts as f64,
            DType::Bf16,
            DType::Bf16,
        );
        self.elementwise("router_topk", layer, repeat, t * m.routed_experts as f64);
        if p.moe_tp > 1 {
            self.tp_moe_ops(layer, repeat, t);
            return;
        }
        let shared_dies = p.shared_expert_dies > 0;
        let fanout = (m.top_k + u64::from(shared_dies)) as f64;
        let dq = q.dispatch();
        let per_token = if dq == DType::Bf16 {
            h * act
        } else {
            h * dq.bytes() + (h / DISPATCH_SCALE_GROUP).ceil() * SCALE_BYTES
        };
        let mode = match load.comm {
            MoeCommUsed::Mc2 => A2aMode::LowLatency,
            MoeCommUsed::AllToAll | MoeCommUsed::AllGather => A2aMode::Normal,
        };
        let comm = |kind, bytes| {
            OpKind::Comm(Comm {
                kind,
                bytes,
                group: p.ep,
                mode,
                copies: if matches!(kind, CommKind::Dispatch | CommKind::Combine) {
                    fanout
                } else {
                    0.0
                },
            })
        };
        // The all-to-all ends when the hottest die has received its tokens: the routed part of
        // the traffic scales with the imbalance.
        let skew = (m.top_k as f64 * load.imbalance + f64::from(u8::from(shared_dies))) / fanout;
        // All-gather mode: every die gathers the hidden states of the whole EP group and
        // reduce-scatters the combined outputs back (vllm-ascend's ALLGATHER).
        let gathered = load.group_tokens as f64 / p.tp as f64 * h * act;
        let allgather = load.comm == MoeCommUsed::AllGather;
        let (name, into_experts) = if allgather {
            ("moe_all_gather", comm(CommKind::AllGather, gathered))
        } else {
            (
                "dispatch",
                comm(CommKind::Dispatch, own * fanout * per_token * skew),
            )
        };
        self.push(name, layer, repeat, DieSet::All, into_experts);
        // Routed experts: tokens per routed die under perfect balance, times the imbalance.
        let slots = (m.routed_experts + p.redundant_experts as u64) as f64;
        let mean = load.group_tokens as f64 * m.top_k as f64 / slots * p.slots_per_die as f64;
        let tok = mean * load.imbalance;
        let w = self.expert_work(OpClass::GroupedGemm, tok, p.slots_per_die as f64, 1);
        let experts = OpKind::Compute(w);
        self.push("experts", layer, repeat, DieSet::RoutedExperts, experts);
        // Shared expert: on its own dies, or locally for the die's tokens.
        let (stok, sdies) = if shared_dies {
            (
                load.group_tokens as f64 / p.shared_expert_dies as f64,
                DieSet::SharedExperts,
            )
        } else {
            (t, DieSet::All)
        };
        let split = if shared_dies { 1 } else { p.dense_tp };
        self.shared_expert(layer, repeat, stok, sdies, split);
        let (name, out_of_experts) = if allgather {
            (
                "moe_reduce_scatter",
                comm(CommKind::ReduceScatter, gathered),
            )
        } else {
            (
                "combine",
                comm(CommKind::Combine, own * fanout * h * act * skew),
            )
        };
        self.push(name, layer, repeat, DieSet::All, out_of_experts);
    }

    /// The shared experts of `tokens` tokens on `dies`, each split `split` ways.
    fn shared_expert(
        &mut self,
        layer: LayerKind,
        repeat: u64,
        tokens: f64,
        dies: DieSet,
        split: u32,
    ) {
        let m = self.s.model;
        let q = self.s.quant;
        let (h, ffn) = (m.hidden as f64, m.expert_ffn as f64);
        let act = DType::Bf16.bytes();
        let expert_bytes = m.expert_params() as f64 * q.expert_weight().bytes();
        let (sh, split) = (m.shared_experts as f64, split as f64);
        let flops = 2.0 * tokens * 3.0 * h * ffn * sh / split;
        let bytes = sh * expert_bytes / split + tokens * (2.0 * h + 3.0 * ffn / split) * act;
        let w = work(
            OpClass::GroupedGemm,
            flops,
            bytes,
            q.expert_compute(),
            tokens,
        );
        self.push("shared_expert", layer, repeat, dies, w);
    }

    /// The MoE ops after the router of one die of a tensor-parallel MoE (`moe_tp` dies, one
    /// attention DP rank: every die holds the rank's `t` tokens): every expert over its slice
    /// of the intermediate, the shared expert over the dense-TP split, and one all-reduce of
    /// the summed outputs, as vLLM's `FusedMoE` reduces them. No tokens move before the
    /// experts and no die is hotter than another.
    fn tp_moe_ops(&mut self, layer: LayerKind, repeat: u64, t: f64) {
        let m = self.s.model;
        let p = self.s.plan;
        let tok = t * m.top_k as f64;
        let w = self.expert_work(
            OpClass::TpGroupedGemm,
            tok,
            m.routed_experts as f64,
            p.moe_tp,
        );
        self.push("experts", layer, repeat, DieSet::All, OpKind::Compute(w));
        self.shared_expert(layer, repeat, t, DieSet::All, p.dense_tp);
        let hidden = t * m.hidden as f64 * DType::Bf16.bytes();
        self.all_reduce("moe_all_reduce", layer, repeat, hidden, p.moe_tp);
    }

    /// The routed-expert work of one die: `tok` token-expert pairs over `resident` experts,
    /// each split `split` ways by tensor parallelism (1: whole experts). The weights of each
    /// resident expert that received a token are read once: with `tok` tokens spread over S
    /// experts, S * (1 - (1 - 1/S)^tok) of them are hit on average.
    fn expert_work(&self, class: OpClass, tok: f64, resident: f64, split: u32) -> Work {
        let m = self.s.model;
        let q = self.s.quant;
        let h = m.hidden as f64;
        let slice = m.expert_ffn as f64 / split as f64;
        let expert_bytes = m.expert_params() as f64 * q.expert_weight().bytes();
        let hit = resident * (1.0 - (1.0 - 1.0 / resident).powf(tok));
        let flops = 2.0 * tok * 3.0 * h * slice;
        let weights = hit * expert_bytes / split as f64;
        let bytes = weights + tok * (2.0 * h + 3.0 * slice) * DType::Bf16.bytes();
        let mut w = compute(class, flops, bytes, q.expert_compute(), tok / hit.max(1.0));
        if split > 1 {
            w.slice = slice;
        }
        w
    }

    fn lm_head(&mut self, layer: LayerKind, repeat: u64, logit_tokens: f64) {
        if self.skips_batch() {
            return;
        }
        let m = self.s.model;
        let dtp = self.s.plan.dense_tp;
        let (h, v) = (m.hidden as f64, m.vocab as f64 / dtp as f64);
        self.elementwise("final_norm", layer, repeat, logit_tokens * h);
        let e = self.s.quant.embedding();
        self.gemm("lm_head", layer, repeat, logit_tokens, h, v, e, e);
        if dtp > 1 {
            self.collective(
                "logits_gather",
                layer,
                repeat,
                CommKind::AllGather,
                logit_tokens * m.vocab as f64 * DType::Bf16.bytes(),
                dtp,
            );
        }
        self.elementwise("sample", layer, repeat, logit_tokens * m.vocab as f64);
    }
}

/// Counts of decoder layers by attention variant: (compression ratio, dense layers, MoE layers).
fn layer_groups(m: &ModelConfig) -> Vec<(Option<u64>, u64, u64)> {
    match &m.attention {
        Attention::Mla { .. } => vec![(None, m.dense_layers, m.moe_layers())],
        Attention::Hybrid {
            compress_ratios, ..
        } => {
            let mut groups: Vec<(Option<u64>, u64, u64)> = Vec::new();
            for (i, &r) in compress_ratios[..m.layers as usize].iter().enumerate() {
                let dense = (i as u64) < m.dense_layers;
                let g = match groups.iter_mut().find(|g| g.0 == Some(r)) {
                    Some(g) => g,
                    None => {
                        groups.push((Some(r), 0, 0));
                        groups.last_mut().expect("just pushed")
                    }
                };
                if dense {
                    g.1 += 1;
                } else {
                    g.2 += 1;
                }
            }
            groups.sort_by_key(|g| g.0);
            groups
        }
    }
}

/// The ops one die runs in one step of a DP rank computing `b`, with the EP group's MoE load.
pub fn step_ops(spec: StepSpec<'_>, b: &BatchShape, load: &MoeLoad) -> Vec<Op> {
    build(spec, b, load, None, Vec::with_capacity(64))
}

/// [`step_ops`] into `out` (its contents replaced), reusing its allocation: a caller pricing
/// many steps builds its op lists without allocating each.
pub fn step_ops_into(spec: StepSpec<'_>, b: &BatchShape, load: &MoeLoad, out: &mut Vec<Op>) {
    let mut ops = std::mem::take(out);
    ops.clear();
    *out = build(spec, b, load, None, ops);
}

/// The ops of [`step_ops`] that belong to `part`, in the same order, into `out` (its contents
/// replaced). [`Part::Batch`]'s do not depend on `load`; [`Part::Moe`]'s depend on `b` only
/// through [`moe_reads`].
pub fn step_part_ops_into(
    spec: StepSpec<'_>,
    b: &BatchShape,
    load: &MoeLoad,
    part: Part,
    out: &mut Vec<Op>,
) {
    let mut ops = std::mem::take(out);
    ops.clear();
    *out = build(spec, b, load, Some(part), ops);
}

/// What the MoE part of a step of `b` reads of the batch: its tokens, and the sequences a
/// later MTP draft pass runs (0 without one) shifted left by one bit over whether context
/// parallelism splits the step (which moves the router's and a local shared expert's rows).
/// Batches that agree on these have the same MoE ops under the same load.
pub fn moe_reads(spec: &StepSpec<'_>, b: &BatchShape) -> (u64, u64) {
    let later = spec.mtp_tokens > 1 && spec.model.mtp_layers > 0 && !b.is_empty();
    let seqs = if later { b.seqs() as u64 } else { 0 };
    (b.tokens(), seqs << 1 | u64::from(cp_ranks(spec, b) > 1))
}

/// The dies a step of `b` splits its tokens over under context parallelism
/// (`enable_dsa_cp`: the attention TP group, in steps with prompts); 1 without it.
fn cp_ranks(spec: &StepSpec<'_>, b: &BatchShape) -> u32 {
    if spec.features.dsa_cp && spec.plan.tp > 1 && b.prefill_tokens > 0 {
        spec.plan.tp
    } else {
        1
    }
}

/// What the MoE part's ops on the expert dies (the routed experts, and a shared expert on
/// dies of its own) read of the batch: nothing, unless a later MTP draft pass runs, whose
/// load is the EP group's tokens scaled by the pass's share of the rank's tokens; then what
/// [`moe_reads`] reads. Batches that agree on these have the same expert-die ops under the
/// same load: a step's ranks share them.
pub fn expert_reads(spec: &StepSpec<'_>, b: &BatchShape) -> (u64, u64) {
    match moe_reads(spec, b) {
        (_, s) if s >> 1 == 0 => (0, 0),
        (t, s) => (t, s >> 1),
    }
}

/// The part of the step's load that the MoE part's ops on every die (router, dispatch,
/// combine, and a shared expert without dies of its own) read: the imbalance and the
/// communication mode, and the EP group's tokens only where every die gathers them (the
/// all-gather mode). Loads that agree on this give batches that agree on [`moe_reads`] the
/// same every-die ops.
pub fn every_die_load(load: &MoeLoad) -> MoeLoad {
    MoeLoad {
        group_tokens: if load.comm == MoeCommUsed::AllGather {
            load.group_tokens
        } else {
            0
        },
        ..*load
    }
}

fn build(
    spec: StepSpec<'_>,
    b: &BatchShape,
    load: &MoeLoad,
    keep: Option<Part>,
    ops: Vec<Op>,
) -> Vec<Op> {
    let mut bld = Builder {
        s: spec,
        ops,
        part: Part::Batch,
        keep,
    };
    if b.is_empty() {
        return bld.ops;
    }
    let m = spec.model;
    let h = m.hidden as f64;
    let t = b.tokens() as f64;
    bld.elementwise("embed", LayerKind::Embedding, 1, t * h);
    // mHC ops cover the residual stream a die holds: 1/TP of the tokens under FLASHCOMM1 and
    // context parallelism.
    let fc1 = spec.features.flashcomm1 && spec.plan.tp > 1;
    let stream_tokens = |pass: &BatchShape| {
        let t = pass.tokens() as f64;
        if fc1 || cp_ranks(&spec, pass) > 1 {
            t / spec.plan.tp as f64
        } else {
            t
        }
    };
    for (ratio, dense, moe) in layer_groups(m) {
        bld.attention(LayerKind::Attention, dense + moe, b, ratio);
        bld.dense_ffn(dense, b);
        bld.moe(LayerKind::Moe, moe, b, load);
        bld.hc_post(LayerKind::Moe, dense + moe, stream_tokens(b));
    }
    if let Some(w) = hc_head(m, stream_tokens(b)) {
        bld.push_work("hc_head", LayerKind::LmHead, 1, w);
    }
    // Logits for every decode token (drafts are verified) and the last token of each prefill.
    let logit_tokens = (b.decode_tokens + b.prefill_seqs as u64) as f64;
    bld.lm_head(LayerKind::LmHead, 1, logit_tokens);
    if spec.mtp_tokens > 0 && m.mtp_layers > 0 {
        // MTP: the first pass runs the MTP module over every token of the step (it needs their
        // hidden states); each further draft runs it over one token per sequence.
        let seqs = b.seqs();
        // V4's MTP layer attends its sliding window only (no compressor, no indexer).
        let mtp_ratio = match m.attention {
            Attention::Mla { .. } => None,
            Attention::Hybrid { .. } => Some(0),
        };
        // Later drafts attend about the context of this step's decode tokens.
        let ctx = b
            .decode_pairs
            .checked_div(b.decode_tokens)
            .unwrap_or(b.prefill_pairs / b.tokens());
        let later = BatchShape::uniform_decode(seqs, 1, ctx, m.attn_cap());
        for (n, pb) in [(1u64, *b), (spec.mtp_tokens as u64 - 1, later)] {
            if n == 0 {
                continue;
            }
            let pt = pb.tokens() as f64;
            bld.gemm(
                "mtp_eh_proj",
                LayerKind::Mtp,
                n,
                pt / cp_ranks(&bld.s, &pb) as f64,
                2.0 * h,
                h,
                DType::Bf16,
                DType::Bf16,
            );
            bld.attention(LayerKind::Mtp, n, &pb, mtp_ratio);
            let mtp_load = MoeLoad {
                group_tokens: load.group_tokens * pb.tokens() / b.tokens(),
                imbalance: load.imbalance,
                comm: load.comm,
            };
            bld.moe(LayerKind::Mtp, n, &pb, &mtp_load);
            bld.hc_post(LayerKind::Mtp, n, stream_tokens(&pb));
            if let Some(w) = hc_head(m, stream_tokens(&pb)) {
                bld.push_work("hc_head", LayerKind::Mtp, n, w);
            }
            bld.lm_head(LayerKind::Mtp, n, seqs as f64);
        }
    }
    bld.ops
}

/// An instance of `ep` single-die DP ranks (tp 1), the routed experts spread over all of them.
fn bare_plan(model: &ModelConfig, ep: u32) -> Plan {
    Plan {
        role: Role::Mixed,
        dies: ep,
        dp: ep,
        tp: 1,
        ep,
        moe_tp: 1,
        dense_tp: 1,
        redundant_experts: 0,
        shared_expert_dies: 0,
        routed_dies: ep,
        slots_per_die: (model.routed_experts as u32).div_ceil(ep).max(1),
    }
}

/// The work of one kernel of the op `name` as the bare graph of one die holding every expert
/// (tp 1, in `quant`) prices it for the batch `b` with `group_tokens` tokens entering the
/// MoE layers: what an engine that runs that op on that batch computes, for fitting its
/// measured time. `None` when the graph has no compute op of that name for `b`.
pub fn op_work(
    model: &ModelConfig,
    quant: Quant,
    name: &str,
    b: &BatchShape,
    group_tokens: u64,
) -> Option<Work> {
    let plan = bare_plan(model, 1);
    let features = crate::features::Resolved::plain("");
    let spec = StepSpec {
        model,
        quant,
        kv_dtype: DType::Bf16,
        plan: &plan,
        mtp_tokens: 0,
        features: &features,
    };
    let load = MoeLoad {
        group_tokens,
        imbalance: 1.0,
        comm: crate::features::MoeCommUsed::Mc2,
    };
    step_ops(spec, b, &load)
        .into_iter()
        .find(|o| o.name == name)
        .and_then(|o| match o.kind {
            OpKind::Compute(w) => Some(w),
            OpKind::Comm(_) => None,
        })
}

/// The ops the graph names for `model` on an instance of `ep` single-die DP ranks (tp 1, the
/// routed experts spread over all of them), in a step that both computes prompt tokens and
/// decodes with `mtp_tokens` drafts: op name -> class name ([`Op::class_name`]). The vocabulary
/// a real engine's profiler names its ops in, so that its traces map onto the graph the twin
/// prices. Dispatch and combine appear only when `ep > 1` (one die moves no tokens).
pub fn vocabulary(
    model: &ModelConfig,
    ep: u32,
    mtp_tokens: u32,
) -> BTreeMap<&'static str, &'static str> {
    let ep = ep.max(1);
    let plan = bare_plan(model, ep);
    // The bare graph: no fused or overlapped mechanisms, so every op shows under its own name.
    let features = crate::features::Resolved::plain("");
    let spec = StepSpec {
        model,
        quant: Quant::Bf16,
        kv_dtype: DType::Bf16,
        plan: &plan,
        mtp_tokens,
        features: &features,
    };
    let cap = model.attn_cap();
    let mut b = BatchShape::default();
    b.add_prefill(16, 0, cap);
    for _ in 0..2 {
        b.add_decode(1 + mtp_tokens as u64, 16, cap);
    }
    let load = MoeLoad {
        group_tokens: b.tokens() * ep as u64,
        imbalance: 1.0,
        comm: crate::features::MoeCommUsed::Mc2,
    };
    step_ops(spec, &b, &load)
        .iter()
        .map(|o| (o.name, o.class_name()))
        .collect()
}

/// Total FLOPs of an op list per die (each op times its repeat count); expert ops count once per
/// die set they run on.
pub fn total_flops(ops: &[Op]) -> f64 {
    ops.iter()
        .map(|o| match o.kind {
            OpKind::Compute(w) => w.flops * o.repeat as f64,
            OpKind::Comm(_) => 0.0,
        })
        .sum()
}

/// Parameters of the model per token as FLOPs: 2 x active parameters (for tests and reports).
pub fn dense_flops_per_token(m: &ModelConfig) -> f64 {
    2.0 * model::active(m) as f64
}
