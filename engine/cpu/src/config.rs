//! The engine's view of a HF `config.json` of DeepSeek-V3/R1/V3.1: the sizes the cost model
//! already reads (parsed once by `dstwin_core::model::config`) plus the numerics only an engine
//! needs (norm epsilon, RoPE and YaRN, router details, special tokens).

use crate::error::LoadError;
use dstwin_core::model::config::{Attention, Family, ModelConfig};
use serde_json::Value;

/// YaRN RoPE scaling as HF's `rope_scaling` (type `yarn`) gives it.
#[derive(Clone, Debug, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    pub original_max_position_embeddings: usize,
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub mscale: f64,
    pub mscale_all_dim: f64,
}

/// YaRN's attention-magnitude correction `0.1 * mscale * ln(scale) + 1` (1 when not scaling):
/// the rotary tables and the softmax scale both take it.
pub fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

/// Everything the CPU engine needs to build and run a DeepSeek-V3 model.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// The cost model's view of the same config.json (sizes, experts, layers).
    pub model: ModelConfig,
    pub vocab: usize,
    pub hidden: usize,
    /// Decoder layers without the MTP modules.
    pub layers: usize,
    pub mtp_layers: usize,
    pub dense_layers: usize,
    pub dense_ffn: usize,
    pub heads: usize,
    /// `None`: queries come from one `q_proj` (no query LoRA).
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_dim: usize,
    pub qk_rope_dim: usize,
    pub v_head_dim: usize,
    pub routed_experts: usize,
    pub shared_experts: usize,
    pub expert_ffn: usize,
    pub top_k: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<Yarn>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// Rows x columns of weight each FP8 block scale covers (`quantization_config`, as
    /// DeepSeek's FP8 checkpoints give it; 128 x 128 when absent).
    pub fp8_block: (usize, usize),
}

fn float_or(v: &Value, key: &'static str, default: f64) -> Result<f64, LoadError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(x) => x.as_f64().ok_or(LoadError::Unsupported {
            field: key,
            value: x.to_string(),
            reason: "must be a number",
        }),
    }
}

fn str_or<'a>(v: &'a Value, key: &str, default: &'a str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or(default)
}

fn token_ids(v: &Value, key: &'static str) -> Result<Vec<u32>, LoadError> {
    let bad = |x: &Value| LoadError::Unsupported {
        field: key,
        value: x.to_string(),
        reason: "must be a token id or a list of token ids",
    };
    match v.get(key) {
        None | Some(Value::Null) => Ok(vec![]),
        Some(Value::Array(xs)) => xs
            .iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|i| u32::try_from(i).ok())
                    .ok_or_else(|| bad(x))
            })
            .collect(),
        Some(x) => Ok(vec![x
            .as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| bad(x))?]),
    }
}

impl EngineConfig {
    /// Parses and validates a HF `config.json` of a `DeepseekV3ForCausalLM` checkpoint.
    pub fn from_hf_json(name: &str, text: &str) -> Result<EngineConfig, LoadError> {
        let v: Value =
            serde_json::from_str(text).map_err(dstwin_core::model::config::ConfigError::Json)?;
        let archs: Vec<String> = v
            .get("architectures")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        let model_type = str_or(&v, "model_type", "").to_string();
        if model_type != "deepseek_v3" || !archs.iter().any(|a| a == "DeepseekV3ForCausalLM") {
            return Err(LoadError::Architecture {
                found: archs,
                model_type,
            });
        }
        // The core's model holds a missing query LoRA (`q_lora_rank` null, a `q_proj`) as 0.
        let model = ModelConfig::from_hf_json(name, text)?;
        debug_assert_eq!(model.family, Family::V3);
        let Attention::Mla {
            heads,
            q_lora_rank,
            kv_lora_rank,
            qk_nope_dim,
            qk_rope_dim,
            v_head_dim,
            ..
        } = model.attention
        else {
            unreachable!("deepseek_v3 parses to MLA")
        };
        let unsupported = |field, value: String, reason| LoadError::Unsupported {
            field,
            value,
            reason,
        };
        for (field, want, default) in [
            ("scoring_func", "sigmoid", "sigmoid"),
            ("topk_method", "noaux_tc", "noaux_tc"),
            ("hidden_act", "silu", "silu"),
        ] {
            let got = str_or(&v, field, default);
            if got != want {
                return Err(unsupported(
                    field,
                    got.to_string(),
                    "the engine implements DeepSeek-V3's sigmoid noaux_tc routing with SiLU experts",
                ));
            }
        }
        if let Some(kvh) = v.get("num_key_value_heads").and_then(Value::as_u64) {
            if kvh != heads {
                return Err(unsupported(
                    "num_key_value_heads",
                    kvh.to_string(),
                    "MLA needs num_key_value_heads = num_attention_heads",
                ));
            }
        }
        if v.get("attention_bias").and_then(Value::as_bool) == Some(true) {
            return Err(unsupported(
                "attention_bias",
                "true".into(),
                "attention projections with biases are not supported",
            ));
        }
        if qk_rope_dim % 2 != 0 {
            return Err(unsupported(
                "qk_rope_head_dim",
                qk_rope_dim.to_string(),
                "RoPE rotates pairs: must be even",
            ));
        }
        let n_group = model.router_groups as usize;
        let routed = model.routed_experts as usize;
        if !routed.is_multiple_of(n_group) {
            return Err(unsupported(
                "n_group",
                n_group.to_string(),
                "must divide n_routed_experts",
            ));
        }
        let topk_group = match v.get("topk_group") {
            None | Some(Value::Null) => n_group,
            Some(x) => x.as_u64().ok_or(LoadError::Unsupported {
                field: "topk_group",
                value: x.to_string(),
                reason: "must be an integer",
            })? as usize,
        };
        if topk_group == 0 || topk_group > n_group {
            return Err(unsupported(
                "topk_group",
                topk_group.to_string(),
                "must be between 1 and n_group",
            ));
        }
        if (model.top_k as usize) > topk_group * (routed / n_group) {
            return Err(unsupported(
                "num_experts_per_tok",
                model.top_k.to_string(),
                "exceeds the experts of topk_group groups",
            ));
        }
        // RoPE: transformers 4 writes `rope_scaling` and `rope_theta`; transformers 5 writes
        // both in `rope_parameters` (`rope_type` "default" for none) and drops the old keys.
        // Either is read; a file with both must agree.
        let params = v.get("rope_parameters").filter(|p| !p.is_null());
        if let Some(p) = params.filter(|p| !p.is_object()) {
            return Err(unsupported(
                "rope_parameters",
                p.to_string(),
                "must be an object, as transformers writes it",
            ));
        }
        // One spelling's YaRN: None for no scaling (absent, null, or type "default"; a
        // `rope_parameters` without a type is default RoPE).
        let max_context = model.max_context as f64;
        let yarn_of = |rs: Option<&Value>, params: bool| -> Result<Option<Yarn>, LoadError> {
            let Some(rs) = rs.filter(|rs| !rs.is_null()) else {
                return Ok(None);
            };
            let kind = rs
                .get("type")
                .or_else(|| rs.get("rope_type"))
                .and_then(Value::as_str)
                .unwrap_or(if params { "default" } else { "" });
            if kind == "default" {
                return Ok(None);
            }
            let field = |old, new| if params { new } else { old };
            if kind != "yarn" {
                return Err(unsupported(
                    field("rope_scaling.type", "rope_parameters.rope_type"),
                    kind.to_string(),
                    "only yarn scaling is supported",
                ));
            }
            let orig = rs
                .get("original_max_position_embeddings")
                .and_then(Value::as_u64)
                .ok_or(LoadError::Unsupported {
                    field: field(
                        "rope_scaling.original_max_position_embeddings",
                        "rope_parameters.original_max_position_embeddings",
                    ),
                    value: "missing".into(),
                    reason: "yarn needs the pretraining context",
                })?;
            Ok(Some(Yarn {
                factor: float_or(rs, "factor", max_context / orig as f64)?,
                original_max_position_embeddings: orig as usize,
                beta_fast: float_or(rs, "beta_fast", 32.0)?,
                beta_slow: float_or(rs, "beta_slow", 1.0)?,
                mscale: float_or(rs, "mscale", 0.0)?,
                mscale_all_dim: float_or(rs, "mscale_all_dim", 0.0)?,
            }))
        };
        let old = v.get("rope_scaling").filter(|r| !r.is_null());
        let rope_scaling = match (old, params) {
            (Some(a), Some(b)) => {
                let (a, b) = (yarn_of(Some(a), false)?, yarn_of(Some(b), true)?);
                if a != b {
                    return Err(unsupported(
                        "rope_parameters",
                        format!("{b:?}"),
                        "disagrees with rope_scaling: a file with both must say the same",
                    ));
                }
                a
            }
            (a, None) => yarn_of(a, false)?,
            (None, b) => yarn_of(b, true)?,
        };
        let eps = float_or(&v, "rms_norm_eps", 1e-6)?;
        if !(eps > 0.0 && eps < 1.0) {
            return Err(unsupported(
                "rms_norm_eps",
                eps.to_string(),
                "must be in (0, 1)",
            ));
        }
        let top = v
            .get("rope_theta")
            .filter(|t| !t.is_null())
            .map(|_| float_or(&v, "rope_theta", 0.0))
            .transpose()?;
        let inner = params
            .filter(|p| p.get("rope_theta").is_some_and(|t| !t.is_null()))
            .map(|p| float_or(p, "rope_theta", 0.0))
            .transpose()?;
        let theta = match (top, inner) {
            (Some(a), Some(b)) if a != b => {
                return Err(unsupported(
                    "rope_parameters.rope_theta",
                    b.to_string(),
                    "disagrees with rope_theta: a file with both must say the same",
                ))
            }
            (Some(t), _) | (None, Some(t)) => t,
            (None, None) => 10000.0,
        };
        if !(theta > 1.0 && theta.is_finite()) {
            return Err(unsupported("rope_theta", theta.to_string(), "must be > 1"));
        }
        // DeepSeek's FP8 checkpoints: e4m3 weights with 128 x 128 block scales, dequantized at
        // load to the compute dtype.
        let fp8_block = match v.get("quantization_config").filter(|q| !q.is_null()) {
            None => (128, 128),
            Some(q) => {
                let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("");
                if method != "fp8" {
                    return Err(unsupported(
                        "quantization_config.quant_method",
                        method.to_string(),
                        "only fp8 (e4m3 weights with block scales) is read; W8A8/W4A8 checkpoints are not",
                    ));
                }
                if let Some(f) = q
                    .get("fmt")
                    .and_then(Value::as_str)
                    .filter(|f| *f != "e4m3")
                {
                    return Err(unsupported(
                        "quantization_config.fmt",
                        f.to_string(),
                        "only e4m3 is read",
                    ));
                }
                match q.get("weight_block_size") {
                    None | Some(Value::Null) => (128, 128),
                    Some(b) => match b
                        .as_array()
                        .map(|a| a.iter().map(Value::as_u64).collect::<Vec<_>>())
                    {
                        Some(a) if a.len() == 2 && a.iter().all(|x| x.is_some_and(|x| x > 0)) => {
                            (a[0].unwrap() as usize, a[1].unwrap() as usize)
                        }
                        _ => {
                            return Err(unsupported(
                                "quantization_config.weight_block_size",
                                b.to_string(),
                                "must be two positive integers, rows and columns",
                            ))
                        }
                    },
                }
            }
        };
        let bos = token_ids(&v, "bos_token_id")?;
        let eos = token_ids(&v, "eos_token_id")?;
        for &t in bos.iter().chain(&eos) {
            if t as u64 >= model.vocab {
                return Err(unsupported(
                    "eos_token_id",
                    t.to_string(),
                    "special token ids must be below vocab_size",
                ));
            }
        }
        Ok(EngineConfig {
            vocab: model.vocab as usize,
            hidden: model.hidden as usize,
            layers: model.layers as usize,
            mtp_layers: model.mtp_layers as usize,
            dense_layers: model.dense_layers as usize,
            dense_ffn: model.dense_ffn as usize,
            heads: heads as usize,
            q_lora_rank: (q_lora_rank > 0).then_some(q_lora_rank as usize),
            kv_lora_rank: kv_lora_rank as usize,
            qk_nope_dim: qk_nope_dim as usize,
            qk_rope_dim: qk_rope_dim as usize,
            v_head_dim: v_head_dim as usize,
            routed_experts: routed,
            shared_experts: model.shared_experts as usize,
            expert_ffn: model.expert_ffn as usize,
            top_k: model.top_k as usize,
            n_group,
            topk_group,
            norm_topk_prob: v
                .get("norm_topk_prob")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            routed_scaling_factor: float_or(&v, "routed_scaling_factor", 1.0)?,
            rms_norm_eps: eps,
            rope_theta: theta,
            rope_scaling,
            max_position_embeddings: model.max_context as usize,
            tie_word_embeddings: v
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            bos_token_id: bos.first().copied(),
            eos_token_ids: eos,
            model,
            fp8_block,
        })
    }

    /// Query/key width of one head (no-position part plus rotary part).
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_dim + self.qk_rope_dim
    }

    /// Width of one token's entry in the latent KV cache: normalized `c_kv` then rotated `k_pe`.
    pub fn kv_width(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_dim
    }

    /// Softmax scale of attention: `qk_head_dim^-0.5`, times `mscale^2` under YaRN with
    /// `mscale_all_dim` (as DeepSeek's and HF's implementations do).
    pub fn softmax_scale(&self) -> f64 {
        let base = (self.qk_head_dim() as f64).powf(-0.5);
        match &self.rope_scaling {
            Some(y) if y.mscale_all_dim != 0.0 => {
                let m = yarn_mscale(y.factor, y.mscale_all_dim);
                base * m * m
            }
            _ => base,
        }
    }

    /// Cache layers: the decoder layers, then one per MTP module.
    pub fn cache_layers(&self) -> usize {
        self.layers + self.mtp_layers
    }
}
