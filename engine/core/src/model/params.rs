//! Parameter counts by group, total and active per token.

use super::config::{Attention, ModelConfig};
use serde::Serialize;

/// Parameters of one attention layer, by projection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct AttnParams {
    /// Projections computed once per token whatever the TP size (q_a, kv_a, indexer k / weights).
    pub replicated: u64,
    /// Projections split over attention TP by head (q_b, kv_b, o and their V4 counterparts).
    pub sharded: u64,
}

impl AttnParams {
    pub fn total(&self) -> u64 {
        self.replicated + self.sharded
    }
}

/// Parameter counts of a model, by group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ParamCounts {
    pub embedding: u64,
    pub lm_head: u64,
    /// One attention layer.
    pub attn_layer: AttnParams,
    /// All attention layers (decoder only).
    pub attention: u64,
    pub dense_ffn: u64,
    pub routed_experts: u64,
    pub shared_experts: u64,
    pub routers: u64,
    /// Norms, and V4's mHC mixing weights.
    pub norms: u64,
    /// The MTP modules (attention + MoE layer + projection + norms); embedding and head shared.
    pub mtp: u64,
}

impl ParamCounts {
    /// Total parameters without the MTP module (how DeepSeek states model sizes: 671B for V3).
    pub fn total(&self) -> u64 {
        self.embedding
            + self.lm_head
            + self.attention
            + self.dense_ffn
            + self.routed_experts
            + self.shared_experts
            + self.routers
            + self.norms
    }
}

/// Parameters of one attention layer of `m`.
pub fn attn_layer_params(m: &ModelConfig) -> AttnParams {
    let h = m.hidden;
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
            let q_a = h * q_lora_rank + q_lora_rank; // + q_a_layernorm
            let kv_a = h * (kv_lora_rank + qk_rope_dim) + kv_lora_rank; // + kv_a_layernorm
                                                                        // Without a query LoRA (q_lora_rank 0), one q_proj from the hidden state.
            let q_in = if *q_lora_rank == 0 { h } else { *q_lora_rank };
            let q_b = q_in * heads * (qk_nope_dim + qk_rope_dim);
            let kv_b = kv_lora_rank * heads * (qk_nope_dim + v_head_dim);
            let o = heads * v_head_dim * h;
            // DSA indexer: wq_b from the q latent, wk from the hidden state (+ norm), head weights.
            let idx = indexer.as_ref().map_or(0, |ix| {
                q_lora_rank * ix.heads * ix.head_dim
                    + h * ix.head_dim
                    + 2 * ix.head_dim
                    + h * ix.heads
            });
            AttnParams {
                replicated: q_a + kv_a + idx,
                sharded: q_b + kv_b + o,
            }
        }
        Attention::Hybrid {
            heads,
            head_dim,
            q_lora_rank,
            o_lora_rank,
            o_groups,
            ..
        } => {
            let q_a = h * q_lora_rank + q_lora_rank;
            let kv = h * head_dim + head_dim; // one shared KV head + its norm
            let q_b = q_lora_rank * heads * head_dim;
            // Grouped low-rank output: each group maps its heads to o_lora, then all groups to hidden.
            let o_a = heads * head_dim * o_lora_rank;
            let o_b = o_groups * o_lora_rank * h;
            // The indexer sits only in compressed-sparse layers: see v4_indexer_params.
            AttnParams {
                replicated: q_a + kv,
                sharded: q_b + o_a + o_b,
            }
        }
    }
}

/// Parameters a V4 decoder layer of compression `ratio` adds to [`attn_layer_params`]: its KV
/// compressors (KV and score projections, positional bias, entry norm) and, in the
/// compressed-sparse layers, the indexer (query projection from the q latent and per-head
/// weights; its keys come from its compressor).
fn v4_layer_params(m: &ModelConfig, ratio: u64) -> u64 {
    let Attention::Hybrid {
        q_lora_rank,
        indexer,
        ..
    } = &m.attention
    else {
        return 0;
    };
    let compressors: u64 = m
        .compressors(ratio)
        .iter()
        .map(|c| {
            let width = c.coff() * c.dim;
            2 * width * m.hidden + c.ratio * width + c.dim
        })
        .sum();
    let idx = if ratio > 0 && Some(ratio) == m.sparse_ratio() {
        q_lora_rank * indexer.heads * indexer.head_dim + m.hidden * indexer.heads
    } else {
        0
    };
    compressors + idx
}

/// Parameters of V4's per-layer extras ([`v4_layer_params`]) over the decoder layers.
fn v4_extras(m: &ModelConfig) -> u64 {
    match &m.attention {
        Attention::Hybrid {
            compress_ratios, ..
        } => compress_ratios[..m.layers as usize]
            .iter()
            .map(|&r| v4_layer_params(m, r))
            .sum(),
        Attention::Mla { .. } => 0,
    }
}

/// mHC weights of one decoder layer (the attention and FFN mixes: projection to the `(2 + c) c`
/// coefficients, their bias and three scales) and of the head's final merge; 0 without
/// hyper-connections.
fn mhc_params(m: &ModelConfig) -> (u64, u64) {
    match &m.attention {
        Attention::Hybrid { hc_mult: c, .. } if *c > 1 => {
            let mix = (2 + c) * c;
            let stream = c * m.hidden;
            (2 * (mix * stream + mix + 3), c * stream + c + 1)
        }
        _ => (0, 0),
    }
}

/// Counts every parameter group of `m`.
pub fn count(m: &ModelConfig) -> ParamCounts {
    let h = m.hidden;
    let attn_layer = attn_layer_params(m);
    let moe = m.moe_layers();
    let attention = attn_layer.total() * m.layers + v4_extras(m);
    let dense_ffn = m.dense_layers * 3 * h * m.dense_ffn;
    let routed = moe * m.routed_experts * m.expert_params();
    let shared = moe * m.shared_experts * m.expert_params();
    let router_layer = m.routed_experts * h + m.routed_experts; // gate + correction bias
    let (mhc_layer, mhc_head) = mhc_params(m);
    // Attention and FFN norms, and the mHC mixes around them.
    let norms_layer = 2 * h + mhc_layer;
    // V4's MTP layer attends its window only: no compressor, no indexer.
    let mtp_layer = attn_layer.total()
        + (m.routed_experts + m.shared_experts) * m.expert_params()
        + router_layer
        + 2 * h * h
        + 4 * h
        + mhc_layer
        + mhc_head;
    ParamCounts {
        embedding: m.vocab * h,
        lm_head: m.vocab * h,
        attn_layer,
        attention,
        dense_ffn,
        routed_experts: routed,
        shared_experts: shared,
        routers: moe * router_layer,
        norms: m.layers * norms_layer + h + mhc_head,
        mtp: m.mtp_layers * mtp_layer,
    }
}

/// Parameters one token activates: attention, dense FFN, top-k routed plus shared experts, routers,
/// norms and the LM head. The input embedding is a table lookup, not a matmul, and is left out
/// (the convention behind "37B activated" for V3).
pub fn active(m: &ModelConfig) -> u64 {
    let c = count(m);
    let moe = m.moe_layers();
    c.attention
        + c.dense_ffn
        + moe * (m.top_k + m.shared_experts) * m.expert_params()
        + c.routers
        + c.norms
        + c.lm_head
}
