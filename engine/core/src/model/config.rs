//! Model architectures: the built-in DeepSeek presets and loading of HuggingFace `config.json`.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;

/// The attention design of a model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Attention {
    /// Multi-head latent attention (V3/R1/V3.1; V3.2 adds the DSA indexer).
    Mla {
        heads: u64,
        q_lora_rank: u64,
        kv_lora_rank: u64,
        qk_nope_dim: u64,
        qk_rope_dim: u64,
        v_head_dim: u64,
        indexer: Option<Indexer>,
    },
    /// DeepSeek-V4 hybrid attention: one shared KV head of `head_dim`, a sliding window, and
    /// per-layer KV compression (0: window only; 4: compressed sparse attention with the indexer;
    /// 128: heavily compressed attention over all compressed entries).
    Hybrid {
        heads: u64,
        head_dim: u64,
        q_lora_rank: u64,
        o_lora_rank: u64,
        o_groups: u64,
        window: u64,
        /// One ratio per layer (extra trailing entries are ignored).
        compress_ratios: Vec<u64>,
        indexer: Indexer,
        /// Copies of the hidden state the residual stream holds (mHC: 4). Each decoder layer
        /// mixes them into one before attention and before the MoE (`hc_pre`) and back after
        /// each (`hc_post`); 1 is a plain residual.
        hc_mult: u64,
        /// Sinkhorn-Knopp iterations that make `hc_pre`'s residual mixing matrix doubly
        /// stochastic.
        hc_sinkhorn_iters: u64,
        /// Dimensions of each head (and each compressed KV entry) that carry RoPE.
        rope_dim: u64,
    },
}

/// A sparse-attention indexer: scores every (compressed) key with `heads` x `head_dim` and keeps
/// the `topk` best per query.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Indexer {
    pub heads: u64,
    pub head_dim: u64,
    pub topk: u64,
}

/// A KV compressor of a V4 compressed layer: it turns every `ratio` tokens into one entry of
/// `dim` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compressor {
    pub ratio: u64,
    /// Width of an entry: the attention head, or the indexer's key.
    pub dim: u64,
    /// Each entry also pools the window before its own (the compressed-sparse layers): the
    /// states it keeps are twice as wide.
    pub overlap: bool,
    /// It compresses the indexer's keys (which are also rotated by a Hadamard transform).
    pub indexer: bool,
}

impl Compressor {
    /// Windows an entry pools (2 with overlap).
    pub fn coff(&self) -> u64 {
        1 + u64::from(self.overlap)
    }
}

/// Which DeepSeek generation a config belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    V3,
    V32,
    V4,
}

/// Everything about a model's shape that sizes its weights, KV cache and per-step work.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub name: String,
    pub family: Family,
    pub hidden: u64,
    /// Decoder layers, without the MTP module.
    pub layers: u64,
    /// MTP modules shipped (each one decoder layer plus a projection).
    pub mtp_layers: u64,
    /// The first `dense_layers` layers use a dense FFN instead of MoE.
    pub dense_layers: u64,
    pub dense_ffn: u64,
    pub routed_experts: u64,
    pub top_k: u64,
    pub shared_experts: u64,
    pub expert_ffn: u64,
    /// Router expert groups (V3: 8, top-4 groups per token); 1 when routing has no groups.
    pub router_groups: u64,
    pub vocab: u64,
    pub max_context: u64,
    pub attention: Attention,
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V3 => "DeepSeek-V3",
            Family::V32 => "DeepSeek-V3.2",
            Family::V4 => "DeepSeek-V4",
        })
    }
}

/// The built-in model names, in the order `--help` lists them.
pub const BUILTIN_MODELS: &[&str] = &[
    "deepseek-v3",
    "deepseek-r1",
    "deepseek-v3.1",
    "deepseek-v3.2",
    "deepseek-v4-flash",
    "deepseek-v4-pro",
];

fn v3(name: &str) -> ModelConfig {
    ModelConfig {
        name: name.to_string(),
        family: Family::V3,
        hidden: 7168,
        layers: 61,
        mtp_layers: 1,
        dense_layers: 3,
        dense_ffn: 18432,
        routed_experts: 256,
        top_k: 8,
        shared_experts: 1,
        expert_ffn: 2048,
        router_groups: 8,
        vocab: 129280,
        max_context: 163840,
        attention: Attention::Mla {
            heads: 128,
            q_lora_rank: 1536,
            kv_lora_rank: 512,
            qk_nope_dim: 128,
            qk_rope_dim: 64,
            v_head_dim: 128,
            indexer: None,
        },
    }
}

/// V4-Flash per-layer `compress_ratios` as shipped (its config.json): [0,0] + [4,128]*20 + [4,0];
/// the trailing 0 is the MTP layer's entry.
fn v4_flash_ratios() -> Vec<u64> {
    let mut r = vec![0, 0];
    for _ in 0..20 {
        r.extend([4, 128]);
    }
    r.extend([4, 0]);
    r
}

/// V4-Pro per-layer `compress_ratios` as shipped (its config.json): [128,128] + [4,128]*29 +
/// [4,0]. Unlike Flash, its first two layers are heavily compressed, not window-only; the
/// trailing 0 is the MTP layer's entry.
fn v4_pro_ratios() -> Vec<u64> {
    let mut r = vec![128, 128];
    for _ in 0..29 {
        r.extend([4, 128]);
    }
    r.extend([4, 0]);
    r
}

/// A built-in model by name (case-insensitive; `deepseek-` prefix optional).
pub fn builtin(name: &str) -> Option<ModelConfig> {
    let key = name.to_ascii_lowercase();
    let key = key.strip_prefix("deepseek-").unwrap_or(&key);
    let m = match key {
        "v3" => v3("deepseek-v3"),
        "r1" => v3("deepseek-r1"),
        "v3.1" => v3("deepseek-v3.1"),
        "v3.2" => {
            let mut m = v3("deepseek-v3.2");
            m.family = Family::V32;
            if let Attention::Mla { indexer, .. } = &mut m.attention {
                *indexer = Some(Indexer {
                    heads: 64,
                    head_dim: 128,
                    topk: 2048,
                });
            }
            m
        }
        "v4-flash" => ModelConfig {
            name: "deepseek-v4-flash".into(),
            family: Family::V4,
            hidden: 4096,
            layers: 43,
            mtp_layers: 1,
            dense_layers: 0,
            dense_ffn: 0,
            routed_experts: 256,
            top_k: 6,
            shared_experts: 1,
            expert_ffn: 2048,
            router_groups: 1,
            vocab: 129280,
            max_context: 1 << 20,
            attention: Attention::Hybrid {
                heads: 64,
                head_dim: 512,
                q_lora_rank: 1024,
                o_lora_rank: 1024,
                o_groups: 8,
                window: 128,
                compress_ratios: v4_flash_ratios(),
                indexer: Indexer {
                    heads: 64,
                    head_dim: 128,
                    topk: 512,
                },
                hc_mult: 4,
                hc_sinkhorn_iters: 20,
                rope_dim: 64,
            },
        },
        "v4-pro" => ModelConfig {
            name: "deepseek-v4-pro".into(),
            family: Family::V4,
            hidden: 7168,
            layers: 61,
            mtp_layers: 1,
            dense_layers: 0,
            dense_ffn: 0,
            routed_experts: 384,
            top_k: 6,
            shared_experts: 1,
            expert_ffn: 3072,
            router_groups: 1,
            vocab: 129280,
            max_context: 1 << 20,
            attention: Attention::Hybrid {
                heads: 128,
                head_dim: 512,
                q_lora_rank: 1536,
                o_lora_rank: 1024,
                o_groups: 16,
                window: 128,
                compress_ratios: v4_pro_ratios(),
                indexer: Indexer {
                    heads: 64,
                    head_dim: 128,
                    topk: 1024,
                },
                hc_mult: 4,
                hc_sinkhorn_iters: 20,
                rope_dim: 64,
            },
        },
        _ => return None,
    };
    Some(m)
}

/// Why a `config.json` could not be read as a DeepSeek model.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    // Not `#[from]`: that also makes the JSON error the source, and error chains would print
    // its message twice.
    #[error("config.json is not valid JSON: {0}")]
    Json(serde_json::Error),
    #[error("config.json: missing or non-integer field '{0}'")]
    Missing(&'static str),
    #[error("config.json: model_type '{0}' is not a DeepSeek V3/V3.2/V4 architecture (expected deepseek_v3, deepseek_v32 or deepseek_v4)")]
    Architecture(String),
    #[error("config.json: {field} = {value}: {reason}")]
    Invalid {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("config.json: {field} = {value}: must be in [{min}, {max}] (at most 16 times the largest DeepSeek checkpoint's value; sizes are multiplied together)")]
    OutOfRange {
        field: &'static str,
        value: u64,
        min: u64,
        max: u64,
    },
}

/// The range of every size a config.json gives: zero where the model cannot work without the
/// part, and a ceiling at 16 times the largest value of any DeepSeek checkpoint (V3: hidden
/// 7,168, 61 layers, 256 experts, vocabulary 129,280; V4: context 1M) so that products of sizes
/// (parameters, FLOPs, bytes) stay far inside u64 and nothing is allocated per layer or expert
/// beyond reason.
fn ranges(m: &ModelConfig) -> Vec<(&'static str, u64, u64, u64)> {
    let mut r = vec![
        ("hidden_size", m.hidden, 1, 1 << 17),
        ("num_hidden_layers", m.layers, 1, 1024),
        ("num_nextn_predict_layers", m.mtp_layers, 0, 16),
        ("intermediate_size", m.dense_ffn, 0, 1 << 19),
        ("n_routed_experts", m.routed_experts, 1, 4096),
        ("n_shared_experts", m.shared_experts, 0, 64),
        ("moe_intermediate_size", m.expert_ffn, 1, 1 << 16),
        ("n_group", m.router_groups, 1, m.routed_experts.max(1)),
        ("vocab_size", m.vocab, 1, 1 << 22),
        ("max_position_embeddings", m.max_context, 1, 1 << 24),
    ];
    let indexer = |r: &mut Vec<_>, ix: &Indexer| {
        r.push(("index_n_heads", ix.heads, 1, 1024));
        r.push(("index_head_dim", ix.head_dim, 1, 1 << 13));
        r.push(("index_topk", ix.topk, 1, 1 << 24));
    };
    match &m.attention {
        Attention::Mla {
            heads,
            q_lora_rank,
            kv_lora_rank,
            qk_nope_dim,
            qk_rope_dim,
            v_head_dim,
            indexer: ix,
        } => {
            r.extend([
                ("num_attention_heads", *heads, 1, 2048),
                // 0: no query LoRA (V3's family only: V3.2's indexer reads the query latent).
                (
                    "q_lora_rank",
                    *q_lora_rank,
                    u64::from(ix.is_some()),
                    1 << 15,
                ),
                ("kv_lora_rank", *kv_lora_rank, 1, 1 << 13),
                ("qk_nope_head_dim", *qk_nope_dim, 1, 1 << 13),
                ("qk_rope_head_dim", *qk_rope_dim, 1, 1 << 13),
                ("v_head_dim", *v_head_dim, 1, 1 << 13),
            ]);
            if let Some(ix) = ix {
                indexer(&mut r, ix);
            }
        }
        Attention::Hybrid {
            heads,
            head_dim,
            q_lora_rank,
            o_lora_rank,
            o_groups,
            window,
            compress_ratios,
            indexer: ix,
            hc_mult,
            hc_sinkhorn_iters,
            rope_dim,
        } => {
            r.extend([
                ("num_attention_heads", *heads, 1, 2048),
                ("head_dim", *head_dim, 1, 1 << 13),
                ("q_lora_rank", *q_lora_rank, 1, 1 << 15),
                ("o_lora_rank", *o_lora_rank, 1, 1 << 15),
                ("o_groups", *o_groups, 1, (*heads).max(1)),
                ("sliding_window", *window, 1, 1 << 24),
                ("hc_mult", *hc_mult, 1, 64),
                ("hc_sinkhorn_iters", *hc_sinkhorn_iters, 0, 1024),
                ("qk_rope_head_dim", *rope_dim, 0, *head_dim),
            ]);
            for &c in compress_ratios {
                r.push(("compress_ratios", c, 0, 1 << 16));
            }
            indexer(&mut r, ix);
        }
    }
    r
}

fn uint(v: &Value, key: &'static str) -> Result<u64, ConfigError> {
    v.get(key)
        .and_then(Value::as_u64)
        .ok_or(ConfigError::Missing(key))
}

fn uint_or(v: &Value, key: &'static str, default: u64) -> Result<u64, ConfigError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(x) => x.as_u64().ok_or(ConfigError::Missing(key)),
    }
}

impl ModelConfig {
    /// Reads a HuggingFace `config.json` of a DeepSeek-V3/R1/V3.1 (`deepseek_v3`), V3.2
    /// (`deepseek_v32`) or V4 (`deepseek_v4`) checkpoint.
    pub fn from_hf_json(name: &str, text: &str) -> Result<ModelConfig, ConfigError> {
        let v: Value = serde_json::from_str(text).map_err(ConfigError::Json)?;
        let model_type = v
            .get("model_type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let family = match model_type.as_str() {
            "deepseek_v3" => Family::V3,
            "deepseek_v32" => Family::V32,
            "deepseek_v4" => Family::V4,
            _ => return Err(ConfigError::Architecture(model_type)),
        };
        let heads = uint(&v, "num_attention_heads")?;
        let hc_mult = uint_or(&v, "hc_mult", 1)?;
        let attention = match family {
            Family::V3 | Family::V32 => Attention::Mla {
                heads,
                // V3's family also has query projections without a LoRA (DeepSeek-V2-Lite's
                // `q_proj`): `q_lora_rank` null, held as 0.
                q_lora_rank: match v.get("q_lora_rank") {
                    Some(Value::Null) if family == Family::V3 => 0,
                    Some(Value::Null) => {
                        return Err(ConfigError::Invalid {
                            field: "q_lora_rank",
                            value: "null".into(),
                            reason: "no query LoRA is V3's family only: V3.2's indexer reads the \
                                     query latent",
                        })
                    }
                    Some(x) if x.as_u64() == Some(0) => {
                        return Err(ConfigError::Invalid {
                            field: "q_lora_rank",
                            value: "0".into(),
                            reason: "must be at least 1, or null for one q_proj without a LoRA",
                        })
                    }
                    _ => uint(&v, "q_lora_rank")?,
                },
                kv_lora_rank: uint(&v, "kv_lora_rank")?,
                qk_nope_dim: uint(&v, "qk_nope_head_dim")?,
                qk_rope_dim: uint(&v, "qk_rope_head_dim")?,
                v_head_dim: uint(&v, "v_head_dim")?,
                indexer: if family == Family::V32 {
                    Some(Indexer {
                        heads: uint(&v, "index_n_heads")?,
                        head_dim: uint(&v, "index_head_dim")?,
                        topk: uint(&v, "index_topk")?,
                    })
                } else {
                    None
                },
            },
            Family::V4 => Attention::Hybrid {
                heads,
                head_dim: uint(&v, "head_dim")?,
                q_lora_rank: uint(&v, "q_lora_rank")?,
                o_lora_rank: uint(&v, "o_lora_rank")?,
                o_groups: uint(&v, "o_groups")?,
                window: uint(&v, "sliding_window")?,
                compress_ratios: v
                    .get("compress_ratios")
                    .and_then(Value::as_array)
                    .ok_or(ConfigError::Missing("compress_ratios"))?
                    .iter()
                    .map(|x| x.as_u64().ok_or(ConfigError::Missing("compress_ratios")))
                    .collect::<Result<_, _>>()?,
                indexer: Indexer {
                    heads: uint(&v, "index_n_heads")?,
                    head_dim: uint(&v, "index_head_dim")?,
                    topk: uint(&v, "index_topk")?,
                },
                hc_mult,
                // Only a widened residual stream has a mixing matrix to normalize.
                hc_sinkhorn_iters: if hc_mult > 1 {
                    uint(&v, "hc_sinkhorn_iters")?
                } else {
                    uint_or(&v, "hc_sinkhorn_iters", 0)?
                },
                rope_dim: uint(&v, "qk_rope_head_dim")?,
            },
        };
        let m = ModelConfig {
            name: name.to_string(),
            family,
            hidden: uint(&v, "hidden_size")?,
            layers: uint(&v, "num_hidden_layers")?,
            mtp_layers: uint_or(&v, "num_nextn_predict_layers", 0)?,
            dense_layers: uint_or(&v, "first_k_dense_replace", 0)?,
            dense_ffn: uint_or(&v, "intermediate_size", 0)?,
            routed_experts: uint(&v, "n_routed_experts")?,
            top_k: uint(&v, "num_experts_per_tok")?,
            shared_experts: uint_or(&v, "n_shared_experts", 0)?,
            expert_ffn: uint(&v, "moe_intermediate_size")?,
            router_groups: uint_or(&v, "n_group", 1)?,
            vocab: uint(&v, "vocab_size")?,
            max_context: uint(&v, "max_position_embeddings")?,
            attention,
        };
        m.validate()?;
        Ok(m)
    }

    /// Cross-field checks.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field, value: u64, reason| ConfigError::Invalid {
            field,
            value: value.to_string(),
            reason,
        };
        for (field, value, min, max) in ranges(self) {
            if !(min..=max).contains(&value) {
                return Err(ConfigError::OutOfRange {
                    field,
                    value,
                    min,
                    max,
                });
            }
        }
        if self.dense_layers > self.layers {
            return Err(bad(
                "first_k_dense_replace",
                self.dense_layers,
                "exceeds num_hidden_layers",
            ));
        }
        if self.dense_layers > 0 && self.dense_ffn == 0 {
            return Err(bad("intermediate_size", 0, "dense layers need an FFN size"));
        }
        if self.top_k == 0 || self.top_k > self.routed_experts {
            return Err(bad(
                "num_experts_per_tok",
                self.top_k,
                "must be between 1 and n_routed_experts",
            ));
        }
        if let Attention::Hybrid {
            compress_ratios, ..
        } = &self.attention
        {
            if (compress_ratios.len() as u64) < self.layers {
                return Err(bad(
                    "compress_ratios",
                    compress_ratios.len() as u64,
                    "needs one entry per layer",
                ));
            }
        }
        Ok(())
    }

    /// MoE layers among the decoder layers.
    pub fn moe_layers(&self) -> u64 {
        self.layers - self.dense_layers
    }

    /// Parameters of one routed (or shared) expert: gate, up and down projections.
    pub fn expert_params(&self) -> u64 {
        3 * self.hidden * self.expert_ffn
    }

    /// The most keys one query attends to in the model's sparse attention, if it has any.
    /// For V4 the compressed sparse layers attend top-k compressed entries of `ratio` tokens each,
    /// so the cap in tokens is top-k x the CSA ratio (4).
    pub fn attn_cap(&self) -> crate::batch::AttnCap {
        match &self.attention {
            Attention::Mla {
                indexer: Some(ix), ..
            } => crate::batch::AttnCap(Some(ix.topk)),
            Attention::Mla { indexer: None, .. } => crate::batch::AttnCap(None),
            Attention::Hybrid { indexer, .. } => {
                crate::batch::AttnCap(Some(indexer.topk * self.sparse_ratio().unwrap_or(1)))
            }
        }
    }

    /// V4: the KV compressors a layer of compression `ratio` runs: none in a window-only layer
    /// (0); in the compressed-sparse layers (the smallest ratio) one for the attention's entries
    /// and one for the indexer's keys, both overlapping their windows; one otherwise.
    pub fn compressors(&self, ratio: u64) -> Vec<Compressor> {
        let Attention::Hybrid {
            head_dim, indexer, ..
        } = &self.attention
        else {
            return Vec::new();
        };
        let attention = |overlap| Compressor {
            ratio,
            dim: *head_dim,
            overlap,
            indexer: false,
        };
        match ratio {
            0 => Vec::new(),
            r if Some(r) == self.sparse_ratio() => vec![
                Compressor {
                    ratio,
                    dim: indexer.head_dim,
                    overlap: true,
                    indexer: true,
                },
                attention(true),
            ],
            _ => vec![attention(false)],
        }
    }

    /// V4: the compression ratio of the compressed-sparse layers, the ones with the indexer
    /// (the smallest non-zero ratio of the decoder layers); None without such a layer or V4.
    pub fn sparse_ratio(&self) -> Option<u64> {
        match &self.attention {
            Attention::Hybrid {
                compress_ratios, ..
            } => compress_ratios[..self.layers as usize]
                .iter()
                .copied()
                .filter(|&r| r > 0)
                .min(),
            Attention::Mla { .. } => None,
        }
    }
}
