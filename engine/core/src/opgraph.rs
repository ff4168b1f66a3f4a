//! The per-step op graph: the one description of the work of a forward step.
//!
//! Given a model, a quantization, a validated plan and a DP rank's [`BatchShape`], it lists every
//! op one die executes (with how many layers repeat it and which dies run it): MLA projections and
//! attention in prefill and absorbed-decode forms, the DSA / V4 indexer, dense FFN, gating,
//! dispatch, grouped expert GEMMs, shared expert, combine, TP collectives, norms, LM head, and the
//! MTP module; for V4 also its hyper-connections and KV compressors. The simulator prices it,
//! calibration maps profiler kernels onto its op names, and a real engine executes the same ops.
//!
//! One `Builder` walks the layers: this file holds the walk, the op types and the small
//! builders; `attention` the attention block and its indexer, `ffn` the dense FFN and the MoE
//! layer, `hybrid` V4's hyper-connections and compressors.

mod attention;
mod bare;
mod ffn;
mod hybrid;
pub use bare::{op_work, vocabulary};
pub use hybrid::{hc_head, hc_post, hc_pre, kernel_compressor, kernel_ops};

use crate::batch::BatchShape;
use crate::features::{MoeCommUsed, Resolved};
use crate::layout::Plan;
use crate::model::{self, Attention, ModelConfig, Quant};
use dstwin_hwmodels::{A2aMode, Comm, CommKind, DType, OpClass, Work};
use serde::Serialize;

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

    fn lm_head(&mut self, layer: LayerKind, repeat: u64, logit_tokens: f64) {
        if self.skips_batch() {
            return;
        }
        let m = self.s.model;
        let (h, vocab) = (m.hidden as f64, m.vocab as f64);
        self.elementwise("final_norm", layer, repeat, logit_tokens * h);
        let e = self.s.quant.embedding();
        if let Some(n) = self.s.plan.lmhead_tp {
            // vllm-ascend's LM-head TP: every rank of the group pads its tokens to the decode
            // step's largest, all-gathers the group's hidden states, computes their logits over
            // its 1/n of the vocabulary, and an all-to-all hands each rank its own tokens'
            // logits over the whole vocabulary (priced as the all-gather of the same bytes: each
            // rank sends and receives (n - 1)/n of its result).
            let pad = logit_tokens.max(self.s.features.logits_pad_tokens as f64);
            let n_f = n as f64;
            let bf16 = DType::Bf16.bytes();
            self.collective(
                "lmhead_all_gather",
                layer,
                repeat,
                CommKind::AllGather,
                n_f * pad * h * bf16,
                n,
            );
            self.gemm("lm_head", layer, repeat, n_f * pad, h, vocab / n_f, e, e);
            self.collective(
                "logits_all_to_all",
                layer,
                repeat,
                CommKind::AllGather,
                pad * vocab * bf16,
                n,
            );
        } else {
            let dtp = self.s.plan.dense_tp;
            self.gemm(
                "lm_head",
                layer,
                repeat,
                logit_tokens,
                h,
                vocab / dtp as f64,
                e,
                e,
            );
            if dtp > 1 {
                self.collective(
                    "logits_gather",
                    layer,
                    repeat,
                    CommKind::AllGather,
                    logit_tokens * vocab * DType::Bf16.bytes(),
                    dtp,
                );
            }
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
