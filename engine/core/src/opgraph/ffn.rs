//! The feed-forward blocks' ops: the dense FFN of the first layers and the MoE layer (router,
//! dispatch, routed experts on their dies, shared expert, combine; or, under MoE tensor
//! parallelism, expert slices and one all-reduce).

use super::{
    compute, cp_ranks, work, Builder, DieSet, LayerKind, MoeLoad, OpKind, Part,
    DISPATCH_SCALE_GROUP, SCALE_BYTES,
};
use crate::batch::BatchShape;
use crate::features::MoeCommUsed;
use dstwin_hwmodels::{A2aMode, Comm, CommKind, DType, OpClass, Work};

impl Builder<'_> {
    pub(super) fn dense_ffn(&mut self, repeat: u64, b: &BatchShape) {
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
    pub(super) fn moe(&mut self, layer: LayerKind, repeat: u64, b: &BatchShape, load: &MoeLoad) {
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
    pub(super) fn moe_ops(
        &mut self,
        layer: LayerKind,
        repeat: u64,
        t: f64,
        own: f64,
        load: &MoeLoad,
    ) {
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
        // Shared expert: on its own dies, or locally for the die's tokens: split over the dense
        // TP group, or whole for the die's own slice when it runs data-parallel (which comes
        // with FLASHCOMM1's token slices).
        let sedp = self.s.features.shared_expert_dp;
        let (stok, sdies) = if shared_dies {
            (
                load.group_tokens as f64 / p.shared_expert_dies as f64,
                DieSet::SharedExperts,
            )
        } else if sedp {
            (own, DieSet::All)
        } else {
            (t, DieSet::All)
        };
        let split = if shared_dies || sedp { 1 } else { p.dense_tp };
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
    pub(super) fn shared_expert(
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
    pub(super) fn tp_moe_ops(&mut self, layer: LayerKind, repeat: u64, t: f64) {
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
    pub(super) fn expert_work(&self, class: OpClass, tok: f64, resident: f64, split: u32) -> Work {
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
}
