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
            let q_b = q_lora_rank * heads * (qk_nope_dim + qk_rope_dim);
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

/// Indexer parameters of one V4 compressed-sparse layer.
fn v4_indexer_params(m: &ModelConfig) -> u64 {
    match &m.attention {
        Attention::Hybrid {
            q_lora_rank,
            indexer,
            ..
        } => {
            q_lora_rank * indexer.heads * indexer.head_dim
                + m.hidden * indexer.head_dim
                + m.hidden * indexer.heads
        }
        Attention::Mla { .. } => 0,
    }
}

/// V4 layers whose compression ratio is the smallest non-zero one carry an indexer.
pub fn v4_indexed_layers(m: &ModelConfig) -> u64 {
    match &m.attention {
        Attention::Hybrid {
            compress_ratios, ..
        } => {
            let layers = &compress_ratios[..m.layers as usize];
            let csa = layers.iter().copied().filter(|&r| r > 0).min();
            csa.map_or(0, |c| layers.iter().filter(|&&r| r == c).count() as u64)
        }
        Attention::Mla { .. } => 0,
    }
}

/// Counts every parameter group of `m`.
pub fn count(m: &ModelConfig) -> ParamCounts {
    let h = m.hidden;
    let attn_layer = attn_layer_params(m);
    let moe = m.moe_layers();
    let attention = attn_layer.total() * m.layers + v4_indexer_params(m) * v4_indexed_layers(m);
    let dense_ffn = m.dense_layers * 3 * h * m.dense_ffn;
    let routed = moe * m.routed_experts * m.expert_params();
    let shared = moe * m.shared_experts * m.expert_params();
    let router_layer = m.routed_experts * h + m.routed_experts; // gate + correction bias
    let hc = match &m.attention {
        Attention::Hybrid { hc_mult, .. } => *hc_mult,
        Attention::Mla { .. } => 1,
    };
    let norms_layer = 2 * h * hc;
    let mtp_layer = attn_layer.total()
        + (m.routed_experts + m.shared_experts) * m.expert_params()
        + router_layer
        + 2 * h * h
        + 4 * h;
    ParamCounts {
        embedding: m.vocab * h,
        lm_head: m.vocab * h,
        attn_layer,
        attention,
        dense_ffn,
        routed_experts: routed,
        shared_experts: shared,
        routers: moe * router_layer,
        norms: m.layers * norms_layer + h,
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
