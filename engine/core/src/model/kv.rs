//! KV-cache bytes per token: MLA latent + rope key; V3.2 indexer keys; V4 per-layer compression
//! and sliding window.

use super::config::{Attention, ModelConfig};
use dstwin_hwmodels::DType;
use serde::Serialize;

/// Bytes of one per-token scale factor stored next to 8-bit indexer keys.
const INDEX_KEY_SCALE_BYTES: f64 = 4.0;

/// KV-cache footprint of a model in one format.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KvBytes {
    /// Bytes each context token adds, per layer (compressed layers amortize over their ratio).
    pub per_token_per_layer: Vec<f64>,
    /// Bytes each token adds over all layers.
    pub per_token: f64,
    /// Bytes a sequence holds whatever its length (V4's sliding-window entries), over all layers.
    pub per_seq_fixed: f64,
}

/// The format a sparse-attention model's indexer keys are cached (and scored) in, on Ascend
/// (`ascend`) or on GPUs, with the KV cache in `kv`:
/// - V3.2 on GPUs: FP8 with a scale per key, whatever the latent's format (vLLM's and SGLang's
///   CUDA indexers score with DeepGEMM's FP8 MQA logits).
/// - V3.2 on Ascend: the KV cache's own format. vllm-ascend keeps bf16 keys and runs the bf16
///   lightning indexer unless its `enable_sparse_li_c8` quantizes them to int8
///   (vllm_ascend/attention/sfa_v1.py); SGLang's NPU pool stores them in the KV dtype; CANN's
///   C8 recipe (an int8 cache) runs the int8 indexer.
/// - V4: 8-bit everywhere (vllm-ascend's V4 indexer caches int8 keys before A5, FP8 on GPUs).
pub fn index_key_dtype(m: &ModelConfig, kv: DType, ascend: bool) -> DType {
    let eight_bit = if ascend { DType::Int8 } else { DType::Fp8 };
    match m.attention {
        Attention::Mla { .. } if ascend && kv.bytes() >= 2.0 => DType::Bf16,
        _ => eight_bit,
    }
}

/// Bytes of one indexer key of `head_dim` values in `dtype`, with its scale when 8-bit.
pub fn index_key_bytes(head_dim: u64, dtype: DType) -> f64 {
    let scale = if dtype.bytes() < 2.0 {
        INDEX_KEY_SCALE_BYTES
    } else {
        0.0
    };
    head_dim as f64 * dtype.bytes() + scale
}

/// Bytes one token adds to the cache of one decoder layer of compression `ratio`, its values
/// `value_bytes` each: MLA's latent, rope key and (V3.2) indexer key in every layer; V4's
/// compressed entry and (sparse layers) indexer key, one per `ratio` tokens, and nothing in a
/// sliding-window layer (`ratio` 0), whose entries are per sequence. Indexer keys are in
/// `index` ([`index_key_dtype`]).
pub fn layer_bytes_per_token(m: &ModelConfig, value_bytes: f64, index: DType, ratio: u64) -> f64 {
    match &m.attention {
        Attention::Mla {
            kv_lora_rank,
            qk_rope_dim,
            indexer,
            ..
        } => {
            (kv_lora_rank + qk_rope_dim) as f64 * value_bytes
                + indexer
                    .as_ref()
                    .map_or(0.0, |ix| index_key_bytes(ix.head_dim, index))
        }
        Attention::Hybrid {
            head_dim, indexer, ..
        } => {
            if ratio == 0 {
                return 0.0;
            }
            let idx = if Some(ratio) == m.sparse_ratio() {
                index_key_bytes(indexer.head_dim, index)
            } else {
                0.0
            };
            (*head_dim as f64 * value_bytes + idx) / ratio as f64
        }
    }
}

/// KV bytes of `m` with its cache in `kv_dtype` and its indexer keys (if any) in `index`,
/// counting `extra_layers` MTP layers (which keep a cache like any decoder layer).
pub fn kv_bytes(m: &ModelConfig, kv_dtype: DType, index: DType, extra_layers: u64) -> KvBytes {
    let b = kv_dtype.bytes();
    let layers = (m.layers + extra_layers) as usize;
    let mut per_layer = Vec::with_capacity(layers);
    let mut fixed = 0.0;
    match &m.attention {
        Attention::Mla { .. } => per_layer.resize(layers, layer_bytes_per_token(m, b, index, 0)),
        Attention::Hybrid {
            head_dim,
            window,
            compress_ratios,
            ..
        } => {
            // The decoder layers' ratios; MTP layers attend their sliding window only.
            let decoder = compress_ratios[..m.layers as usize].iter().copied();
            let mtp = std::iter::repeat_n(0, layers - m.layers as usize);
            for r in decoder.chain(mtp) {
                fixed += *window as f64 * *head_dim as f64 * b;
                per_layer.push(layer_bytes_per_token(m, b, index, r));
            }
        }
    }
    KvBytes {
        per_token: per_layer.iter().sum(),
        per_token_per_layer: per_layer,
        per_seq_fixed: fixed,
    }
}

/// Bytes one token of a DP rank adds to one die's cache when decode context parallelism
/// interleaves the rank's KV over `dcp` dies (vLLM's DCP: every `dcp`-th token on each die):
/// MLA's latent and rope key split over the group; V3.2's indexer keys too on GPUs (vLLM's
/// sharded indexer), but written whole on every die on Ascend (vllm-ascend's SFA DCP keeps a
/// replicated indexer cache so each die's top-k is exact). `kv` is [`kv_bytes`]' footprint of
/// `m` with its indexer keys in `index`; `dcp` 1 gives its `per_token`.
pub fn dcp_bytes_per_token(
    m: &ModelConfig,
    kv: &KvBytes,
    index: DType,
    dcp: u32,
    ascend: bool,
) -> f64 {
    if dcp <= 1 {
        return kv.per_token;
    }
    let index_keys = match &m.attention {
        Attention::Mla {
            indexer: Some(ix), ..
        } if ascend => kv.per_token_per_layer.len() as f64 * index_key_bytes(ix.head_dim, index),
        _ => 0.0,
    };
    (kv.per_token - index_keys) / dcp as f64 + index_keys
}
