//! The memory map of one die: weights under the placement, workspace, runtime reserve, and the KV
//! capacity that remains.

use crate::features::Platform;
use crate::layout::Plan;
use crate::model::{
    self, dcp_bytes_per_token, index_key_dtype, kv_bytes, Attention, ModelConfig, Quant,
};
use dstwin_hwmodels::{DType, System};
use serde::Serialize;
use thiserror::Error;

/// Activation buffers of `hidden` bf16 values kept per in-flight token (residual, normed input,
/// attention output, FFN intermediate views). An estimate of the framework's workspace, not a
/// measurement; the KV capacity is sensitive to it only for very large token budgets.
pub const ACTIVATION_BUFFERS_PER_TOKEN: f64 = 8.0;

/// Bytes per element of the fp32 logits buffer.
const LOGIT_BYTES: f64 = 4.0;

/// How much of a die's HBM the engine may use for weights, workspace and KV.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryBudget {
    /// The system file's `reserved_hbm_gb_per_die` is kept back (on the shipped systems 10% of
    /// HBM: vLLM's default `--gpu-memory-utilization` 0.9).
    #[default]
    SystemReserve,
    /// vLLM's `--gpu-memory-utilization`: weights, workspace and KV fill this share of HBM.
    GpuMemoryUtilization(f64),
    /// SGLang's `--mem-fraction-static`: weights and the KV pool fill this share of HBM; the
    /// workspace (activations, graphs) lives in the rest.
    MemFractionStatic(f64),
}

impl MemoryBudget {
    /// The bytes kept back from `hbm` beside weights, workspace and KV.
    pub fn reserved(self, hbm: f64, system_reserve: f64, workspace: f64) -> f64 {
        match self {
            MemoryBudget::SystemReserve => system_reserve,
            MemoryBudget::GpuMemoryUtilization(u) => (1.0 - u) * hbm,
            MemoryBudget::MemFractionStatic(f) => ((1.0 - f) * hbm - workspace).max(0.0),
        }
    }
}

/// Everything that sizes one die's memory besides the model and layout.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct MemoryInputs {
    pub quant: Quant,
    pub kv_dtype: DType,
    /// MTP draft tokens per step; the MTP module is loaded when this is above 0.
    pub mtp_tokens: u32,
    /// The most tokens one die's activations hold in a step: the DP rank's token budget, or
    /// its slice of it under context parallelism ([`cp_tokens_per_die`]).
    pub max_tokens_per_step: u64,
    /// The most tokens one die dispatches to the routed experts in a step: its 1/TP share of
    /// the DP rank's token budget (under attention TP each die of the group dispatches its
    /// share; under context parallelism its slice).
    pub dispatch_tokens_per_step: u64,
    pub budget: MemoryBudget,
    /// The shared expert runs whole on every die ([`crate::features::Features::shared_expert_dp`]).
    pub shared_expert_dp: bool,
    /// Dies each DP rank's KV cache is interleaved over (decode context parallelism; 1: off).
    pub dcp: u32,
}

/// Bytes per die by use.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct MemoryMap {
    pub hbm: f64,
    pub reserved: f64,
    pub attention_weights: f64,
    pub dense_ffn_weights: f64,
    pub embedding_weights: f64,
    pub routed_expert_weights: f64,
    pub shared_expert_weights: f64,
    pub other_weights: f64,
    pub weights: f64,
    pub workspace: f64,
    /// What is left for the KV cache.
    pub kv_cache: f64,
    /// KV bytes per context token on this die (all layers, MTP included when loaded).
    pub kv_bytes_per_token: f64,
    /// Context tokens the KV cache holds (sequence-fixed bytes such as V4's window not subtracted).
    pub kv_capacity_tokens: u64,
}

#[derive(Clone, Debug, Error, PartialEq)]
pub enum MemoryError {
    #[error("does not fit in HBM: each die needs {weights_gb:.1} GB of weights + {workspace_gb:.1} GB workspace + {reserved_gb:.1} GB runtime reserve = {need_gb:.1} GB, but has {hbm_gb:.1} GB (largest die: {die}); use more dies, a larger expert-parallel group or a smaller quantization")]
    DoesNotFit {
        weights_gb: f64,
        workspace_gb: f64,
        reserved_gb: f64,
        need_gb: f64,
        hbm_gb: f64,
        die: &'static str,
    },
}

/// The tokens of a DP rank's step of `tokens` that one of its dies dispatches to the routed
/// experts: its 1/TP share under expert parallelism (attention TP and context parallelism
/// alike, [`crate::opgraph`]'s `ffn_tokens`); all of them under MoE tensor parallelism,
/// whose every die runs the rank's tokens through its slice of the experts.
pub fn dispatch_tokens_per_die(tokens: u64, plan: &Plan) -> u64 {
    if plan.moe_tp > 1 {
        tokens
    } else {
        tokens.div_ceil(plan.tp.max(1) as u64)
    }
}

/// The tokens of a step of `tokens` that one die of an attention TP group of `tp` holds at
/// most: under context parallelism (`dsa_cp`) its slice, gathered over the dense-TP group of
/// `dense_tp` for the FFN side; all of them otherwise.
pub fn cp_tokens_per_die(tokens: u64, tp: u32, dense_tp: u32, dsa_cp: bool) -> u64 {
    if dsa_cp {
        (tokens.div_ceil(tp.max(1) as u64) * dense_tp as u64).min(tokens)
    } else {
        tokens
    }
}

/// Computes the memory map of the fullest die (a routed-expert die, or a shared-expert die if it
/// holds more).
pub fn memory_map(
    m: &ModelConfig,
    plan: &Plan,
    system: &System,
    inp: &MemoryInputs,
) -> Result<MemoryMap, MemoryError> {
    let c = model::count(m);
    let lin = inp.quant.linear_weight().bytes();
    let exp = inp.quant.expert_weight().bytes();
    let emb = inp.quant.embedding().bytes();
    let mtp = if inp.mtp_tokens > 0 { m.mtp_layers } else { 0 };
    let tp = plan.tp as f64;
    let dtp = plan.dense_tp as f64;
    let attn_layer = c.attn_layer.replicated as f64 + c.attn_layer.sharded as f64 / tp;
    // V4's indexers and KV compressors, in the layers that have them.
    let v4_extras = (c.attention - c.attn_layer.total() * m.layers) as f64;
    let attention_weights = (attn_layer * (m.layers + mtp) as f64 + v4_extras) * lin;
    let dense_ffn_weights = c.dense_ffn as f64 / dtp * lin;
    let lmhead_split = plan.lmhead_tp.map_or(dtp, f64::from);
    let embedding_weights = (c.embedding as f64 / dtp + c.lm_head as f64 / lmhead_split) * emb;
    let moe_layers = (m.moe_layers() + mtp) as f64;
    let expert = m.expert_params() as f64 * exp;
    // Under MoE tensor parallelism every die holds a 1/moe_tp slice of every expert.
    let routed = plan.slots_per_die as f64 * expert * moe_layers / plan.moe_tp as f64;
    let shared_per_die = if plan.shared_expert_dies > 0 {
        0.0
    } else if inp.shared_expert_dp {
        m.shared_experts as f64 * expert * moe_layers
    } else {
        m.shared_experts as f64 * expert * moe_layers / dtp
    };
    let shared_die = m.shared_experts as f64 * expert * moe_layers;
    // Routers, norms and the MTP projection stay in bf16.
    let other_weights =
        (c.routers + c.norms + mtp * 2 * m.hidden * m.hidden) as f64 * DType::Bf16.bytes();
    let common = attention_weights + dense_ffn_weights + embedding_weights + other_weights;
    let (routed_w, shared_w, die) = if plan.shared_expert_dies > 0 && shared_die > routed {
        (0.0, shared_die, "shared-expert die")
    } else {
        (routed, shared_per_die, "routed-expert die")
    };
    let weights = common + routed_w + shared_w;

    let t = inp.max_tokens_per_step as f64;
    let h = m.hidden as f64;
    let fanout = (m.top_k + u64::from(plan.shared_expert_dies > 0)) as f64;
    let hc = match &m.attention {
        Attention::Hybrid { hc_mult, .. } => *hc_mult as f64,
        Attention::Mla { .. } => 1.0,
    };
    let activations = t * h * DType::Bf16.bytes() * ACTIVATION_BUFFERS_PER_TOKEN * hc;
    // Dispatch receive and combine send buffers hold every routed copy of the die's tokens.
    let moe_buffers = 2.0 * inp.dispatch_tokens_per_step as f64 * fanout * h * DType::Bf16.bytes();
    // An LM-head TP group hands every rank its tokens' logits over the whole vocabulary.
    let logits =
        t * m.vocab as f64 / if plan.lmhead_tp.is_some() { 1.0 } else { dtp } * LOGIT_BYTES;
    let workspace = activations + moe_buffers + logits;

    let hbm = system.chip.hbm_bytes();
    let reserved = inp
        .budget
        .reserved(hbm, system.reserved_hbm_gb_per_die * 1e9, workspace);
    let ascend = Platform::of_chip(&system.chip.name).is_ascend();
    let index = index_key_dtype(m, inp.kv_dtype, ascend);
    let kv = kv_bytes(m, inp.kv_dtype, index, mtp);
    let kv_per_token = dcp_bytes_per_token(m, &kv, index, inp.dcp, ascend);
    let kv_cache = hbm - reserved - weights - workspace;
    if kv_cache <= 0.0 {
        return Err(MemoryError::DoesNotFit {
            weights_gb: weights / 1e9,
            workspace_gb: workspace / 1e9,
            reserved_gb: reserved / 1e9,
            need_gb: (weights + workspace + reserved) / 1e9,
            hbm_gb: hbm / 1e9,
            die,
        });
    }
    Ok(MemoryMap {
        hbm,
        reserved,
        attention_weights,
        dense_ffn_weights,
        embedding_weights,
        routed_expert_weights: routed_w,
        shared_expert_weights: shared_w,
        other_weights,
        weights,
        workspace,
        kv_cache,
        kv_bytes_per_token: kv_per_token,
        kv_capacity_tokens: (kv_cache / kv_per_token) as u64,
    })
}
