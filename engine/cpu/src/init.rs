//! `init-weights`: a DeepSeek-V3-shaped checkpoint with random weights, written in HF layout
//! (config.json, model.safetensors, tokenizer.json), deterministically from a seed: the same
//! seed and config give byte-identical files.
//!
//! Scale: every projection is drawn with std `1 / sqrt(fan_in)`, so activations keep unit scale
//! through the layers and attention scores are not flat (at std 0.02 and hidden 256, attention
//! would be near-uniform and parity tests would barely exercise positions); norm weights are
//! `1 + U(-0.1, 0.1)` so a misnamed norm shows; the router bias is N(0, 0.05), large enough to
//! change selections.

use crate::config::EngineConfig;
use crate::error::LoadError;
use crate::tokenizer;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// Merges of the generated tokenizer (vocabulary: 2 specials + 256 bytes + these).
pub const TOKENIZER_MERGES: usize = 62;

/// The built-in shapes `init-weights --preset` knows.
pub const PRESETS: &[&str] = &["tiny"];

/// The config.json of a preset.
pub fn preset_config(name: &str) -> Option<Value> {
    let (_, vocab) = tokenizer::tokenizer_json(TOKENIZER_MERGES);
    match name {
        "tiny" => Some(json!({
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "vocab_size": vocab,
            "hidden_size": 256,
            "intermediate_size": 512,
            "moe_intermediate_size": 64,
            "num_hidden_layers": 4,
            "num_nextn_predict_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "n_shared_experts": 1,
            "n_routed_experts": 16,
            "routed_scaling_factor": 2.5,
            "kv_lora_rank": 64,
            "q_lora_rank": 64,
            "qk_rope_head_dim": 16,
            "v_head_dim": 32,
            "qk_nope_head_dim": 32,
            "topk_method": "noaux_tc",
            "n_group": 4,
            "topk_group": 2,
            "num_experts_per_tok": 4,
            "moe_layer_freq": 1,
            "first_k_dense_replace": 1,
            "norm_topk_prob": true,
            "scoring_func": "sigmoid",
            "hidden_act": "silu",
            "max_position_embeddings": 1024,
            "initializer_range": 0.02,
            "rms_norm_eps": 1e-6,
            "use_cache": true,
            "bos_token_id": tokenizer::BOS_ID,
            "eos_token_id": tokenizer::EOS_ID,
            "tie_word_embeddings": false,
            "rope_theta": 10000.0,
            "rope_scaling": {
                "type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 256,
                "beta_fast": 32,
                "beta_slow": 1,
                "mscale": 1.0,
                "mscale_all_dim": 0.8
            },
            "attention_bias": false,
            "attention_dropout": 0.0,
            "torch_dtype": "bfloat16"
        })),
        _ => None,
    }
}

/// How a tensor is drawn.
#[derive(Clone, Copy)]
enum Init {
    /// N(0, std).
    Normal(f32),
    /// 1 + U(-0.1, 0.1).
    Norm,
}

/// Every tensor of the HF checkpoint of `cfg`, in a fixed order, with its shape and draw.
fn tensor_specs(c: &EngineConfig) -> Vec<(String, Vec<usize>, Init)> {
    let mut v: Vec<(String, Vec<usize>, Init)> = Vec::new();
    let lin = |v: &mut Vec<_>, name: String, out: usize, inp: usize| {
        v.push((
            format!("{name}.weight"),
            vec![out, inp],
            Init::Normal(1.0 / (inp as f32).sqrt()),
        ))
    };
    let norm = |v: &mut Vec<_>, name: String, n: usize| {
        v.push((format!("{name}.weight"), vec![n], Init::Norm))
    };
    let h = c.hidden;
    let mlp = |v: &mut Vec<_>, p: String, ffn: usize| {
        lin(v, format!("{p}.gate_proj"), ffn, h);
        lin(v, format!("{p}.up_proj"), ffn, h);
        lin(v, format!("{p}.down_proj"), h, ffn);
    };
    v.push((
        "model.embed_tokens.weight".into(),
        vec![c.vocab, h],
        Init::Normal(1.0),
    ));
    for i in 0..c.layers + c.mtp_layers {
        let p = format!("model.layers.{i}");
        if i >= c.layers {
            v.push((
                format!("{p}.embed_tokens.weight"),
                vec![c.vocab, h],
                Init::Normal(1.0),
            ));
            norm(&mut v, format!("{p}.enorm"), h);
            norm(&mut v, format!("{p}.hnorm"), h);
            lin(&mut v, format!("{p}.eh_proj"), h, 2 * h);
            norm(&mut v, format!("{p}.shared_head.norm"), h);
            lin(&mut v, format!("{p}.shared_head.head"), c.vocab, h);
        }
        norm(&mut v, format!("{p}.input_layernorm"), h);
        norm(&mut v, format!("{p}.post_attention_layernorm"), h);
        let a = format!("{p}.self_attn");
        let qk = c.heads * c.qk_head_dim();
        match c.q_lora_rank {
            Some(r) => {
                lin(&mut v, format!("{a}.q_a_proj"), r, h);
                norm(&mut v, format!("{a}.q_a_layernorm"), r);
                lin(&mut v, format!("{a}.q_b_proj"), qk, r);
            }
            None => lin(&mut v, format!("{a}.q_proj"), qk, h),
        }
        lin(&mut v, format!("{a}.kv_a_proj_with_mqa"), c.kv_width(), h);
        norm(&mut v, format!("{a}.kv_a_layernorm"), c.kv_lora_rank);
        lin(
            &mut v,
            format!("{a}.kv_b_proj"),
            c.heads * (c.qk_nope_dim + c.v_head_dim),
            c.kv_lora_rank,
        );
        lin(&mut v, format!("{a}.o_proj"), h, c.heads * c.v_head_dim);
        if i < c.dense_layers {
            mlp(&mut v, format!("{p}.mlp"), c.dense_ffn);
        } else {
            lin(&mut v, format!("{p}.mlp.gate"), c.routed_experts, h);
            v.push((
                format!("{p}.mlp.gate.e_score_correction_bias"),
                vec![c.routed_experts],
                Init::Normal(0.05),
            ));
            for j in 0..c.routed_experts {
                mlp(&mut v, format!("{p}.mlp.experts.{j}"), c.expert_ffn);
            }
            if c.shared_experts > 0 {
                mlp(
                    &mut v,
                    format!("{p}.mlp.shared_experts"),
                    c.expert_ffn * c.shared_experts,
                );
            }
        }
    }
    v.push(("model.norm.weight".into(), vec![h], Init::Norm));
    if !c.tie_word_embeddings {
        lin(&mut v, "lm_head".into(), c.vocab, h);
    }
    v
}

/// The largest checkpoint `init-weights` writes (it holds every tensor in memory).
pub const MAX_PARAMS: usize = 1 << 30;

/// Writes the [`checkpoint`] of `config` and `seed` into the directory `out` (created if
/// missing), one file after another.
pub fn init_weights(config: &Value, seed: u64, out: &Path) -> Result<EngineConfig, LoadError> {
    let (cfg, files) = checkpoint(config, seed)?;
    let io = |p: &Path, e: &dyn std::fmt::Display| LoadError::Io {
        path: p.display().to_string(),
        message: e.to_string(),
    };
    std::fs::create_dir_all(out).map_err(|e| io(out, &e))?;
    for (name, bytes) in files {
        let path = out.join(name);
        std::fs::write(&path, bytes).map_err(|e| io(&path, &e))?;
    }
    Ok(cfg)
}

/// The files of a checkpoint for `config` with random weights, by name: model.safetensors
/// (bf16, as DeepSeek ships its weights), config.json and tokenizer.json, with the config they
/// load as. Tensor `i` is drawn from ChaCha8 seeded with `seed` on stream `i`, so a tensor's
/// values do not depend on the ones before it.
#[allow(clippy::type_complexity)]
pub fn checkpoint(
    config: &Value,
    seed: u64,
) -> Result<(EngineConfig, Vec<(&'static str, Vec<u8>)>), LoadError> {
    let text = serde_json::to_string_pretty(config).expect("a JSON value");
    let cfg = EngineConfig::from_hf_json("init-weights", &text)?;
    let specs = tensor_specs(&cfg);
    let params: usize = specs.iter().map(|s| s.1.iter().product::<usize>()).sum();
    if params > MAX_PARAMS {
        return Err(LoadError::Unsupported {
            field: "config.json",
            value: format!("{params} parameters"),
            reason: "init-weights writes at most 2^30 parameters (a test-sized model)",
        });
    }
    let mut data: BTreeMap<String, (Vec<usize>, Vec<u8>)> = BTreeMap::new();
    for (i, (name, shape, init)) in specs.into_iter().enumerate() {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(i as u64);
        let n: usize = shape.iter().product();
        let mut bytes = Vec::with_capacity(2 * n);
        let d = match init {
            Init::Normal(std) => Normal::new(0.0f32, std).expect("positive std"),
            Init::Norm => Normal::new(0.0, 1.0).expect("positive std"),
        };
        for _ in 0..n {
            let v = match init {
                Init::Normal(_) => d.sample(&mut rng),
                Init::Norm => 1.0 + rng.random_range(-0.1f32..0.1),
            };
            bytes.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes());
        }
        data.insert(name, (shape, bytes));
    }
    let views: Vec<(String, TensorView)> = data
        .iter()
        .map(|(k, (shape, bytes))| {
            let v = TensorView::new(Dtype::BF16, shape.clone(), bytes)
                .expect("shape matches the bytes");
            (k.clone(), v)
        })
        .collect();
    let (tok, vocab) = tokenizer::tokenizer_json(TOKENIZER_MERGES);
    if vocab > cfg.vocab {
        return Err(LoadError::Unsupported {
            field: "vocab_size",
            value: cfg.vocab.to_string(),
            reason: "smaller than the generated tokenizer's vocabulary",
        });
    }
    let weights = safetensors::serialize(views, None).map_err(|e| LoadError::Io {
        path: "model.safetensors".into(),
        message: e.to_string(),
    })?;
    let files = vec![
        ("model.safetensors", weights),
        ("config.json", (text + "\n").into_bytes()),
        ("tokenizer.json", tok.into_bytes()),
    ];
    Ok((cfg, files))
}
