//! The DeepSeek-V3 model: embedding, decoder layers (MLA + dense FFN or DeepSeekMoE), final
//! norm and LM head, and the MTP modules; loading from a HF checkpoint. The forward pass is in
//! [`crate::forward`].

use crate::attention::{Mla, QProj};
use crate::config::EngineConfig;
use crate::error::LoadError;
use crate::linear::Linear;
use crate::moe::{Expert, ExpertTable, Ffn, Mlp, Moe, RouteSpec, Router};
use crate::rope::Rope;
use crate::weights::{Checkpoint, Dim};
use candle_core::{DType, Device, Tensor};
use std::path::Path;
use std::sync::Arc;

/// One sequence of a batch: what dstwin's scheduler hands a device per request
/// ([`dstwin_core::device::ScheduledReq`]: block table, `computed`, the new tokens).
#[derive(Clone, Copy, Debug)]
pub struct SeqInput<'a> {
    /// Block ids of the KV pool, in token order; must cover `computed + tokens.len()`.
    pub blocks: &'a [u32],
    /// Tokens whose latents are already in the blocks (positions `0..computed`).
    pub computed: usize,
    /// Token ids to run at positions `computed..computed + tokens.len()`.
    pub tokens: &'a [u32],
    /// Logit rows wanted: the last `logits` positions (1 to sample; 1 + drafts to verify MTP
    /// drafts; 0 for a prompt chunk that does not sample).
    pub logits: usize,
}

/// What a forward pass returns.
#[derive(Debug)]
pub struct Forward {
    /// `[sum of logits rows, vocab]`, f32, in sequence order.
    pub logits: Tensor,
    /// The last layer's output before the final norm, `[total new tokens, hidden]` in sequence
    /// order (what the MTP module takes).
    pub hidden: Tensor,
    /// Tokens routed to each expert, per MoE layer (index `i` is decoder layer
    /// `first_k_dense_replace + i`; for an MTP pass, its one layer): the EPLB heat.
    pub expert_counts: Vec<Vec<u32>>,
}

/// A decoder layer.
#[derive(Clone, Debug)]
pub struct Layer {
    pub input_norm: Tensor,
    pub post_norm: Tensor,
    pub attn: Mla,
    pub ffn: Ffn,
}

/// One MTP module (DeepSeek's `num_nextn_predict_layers`): predicts the token after next from
/// the main model's hidden state and the next token's embedding.
#[derive(Clone, Debug)]
pub struct MtpModule {
    pub embed: Tensor,
    pub enorm: Tensor,
    pub hnorm: Tensor,
    pub eh_proj: Linear,
    pub layer: Layer,
    pub head_norm: Tensor,
    pub head: Tensor,
}

#[derive(Clone, Debug)]
pub struct Model {
    pub cfg: EngineConfig,
    pub dtype: DType,
    pub device: Device,
    pub embed: Tensor,
    pub layers: Vec<Layer>,
    pub norm: Tensor,
    pub lm_head: Tensor,
    pub mtp: Vec<MtpModule>,
    pub rope: Rope,
}

/// Loads weights by HF name, knowing the config's sizes.
struct Loader<'a> {
    ck: Checkpoint,
    cfg: &'a EngineConfig,
    dtype: DType,
    dev: &'a Device,
}

impl Loader<'_> {
    fn t(&mut self, name: &str, dims: &[Dim], because: &str) -> Result<Tensor, LoadError> {
        Ok(self
            .ck
            .take(name, dims, self.dtype, because)?
            .to_device(self.dev)?)
    }

    fn lin(&mut self, name: &str, out: Dim, inp: Dim, because: &str) -> Result<Linear, LoadError> {
        Ok(Linear::Dense(self.t(
            &format!("{name}.weight"),
            &[out, inp],
            because,
        )?))
    }

    fn mlp(&mut self, p: &str, ffn: Dim, because: &str) -> Result<Mlp, LoadError> {
        let h = (self.cfg.hidden, "hidden_size");
        Ok(Mlp {
            gate: self.lin(&format!("{p}.gate_proj"), ffn, h, because)?,
            up: self.lin(&format!("{p}.up_proj"), ffn, h, because)?,
            down: self.lin(&format!("{p}.down_proj"), h, ffn, because)?,
        })
    }

    fn layer(&mut self, i: usize, why: &str) -> Result<Layer, LoadError> {
        let c = self.cfg;
        let p = format!("model.layers.{i}");
        let h = (c.hidden, "hidden_size");
        let qk = (
            c.heads * c.qk_head_dim(),
            "num_attention_heads * (qk_nope_head_dim + qk_rope_head_dim)",
        );
        let q = match c.q_lora_rank {
            Some(r) => QProj::Lora {
                a: self.lin(
                    &format!("{p}.self_attn.q_a_proj"),
                    (r, "q_lora_rank"),
                    h,
                    "q_lora_rank is set",
                )?,
                norm: self.t(
                    &format!("{p}.self_attn.q_a_layernorm.weight"),
                    &[(r, "q_lora_rank")],
                    "q_lora_rank is set",
                )?,
                b: self.lin(
                    &format!("{p}.self_attn.q_b_proj"),
                    qk,
                    (r, "q_lora_rank"),
                    "q_lora_rank is set",
                )?,
            },
            None => QProj::Full(self.lin(
                &format!("{p}.self_attn.q_proj"),
                qk,
                h,
                "q_lora_rank is null",
            )?),
        };
        let kvl = (c.kv_lora_rank, "kv_lora_rank");
        let attn = Mla::new(
            q,
            self.lin(
                &format!("{p}.self_attn.kv_a_proj_with_mqa"),
                (c.kv_width(), "kv_lora_rank + qk_rope_head_dim"),
                h,
                why,
            )?,
            self.t(&format!("{p}.self_attn.kv_a_layernorm.weight"), &[kvl], why)?,
            self.lin(
                &format!("{p}.self_attn.kv_b_proj"),
                (
                    c.heads * (c.qk_nope_dim + c.v_head_dim),
                    "num_attention_heads * (qk_nope_head_dim + v_head_dim)",
                ),
                kvl,
                why,
            )?,
            self.lin(
                &format!("{p}.self_attn.o_proj"),
                h,
                (c.heads * c.v_head_dim, "num_attention_heads * v_head_dim"),
                why,
            )?,
            c,
        )?;
        let ffn = if i < c.dense_layers {
            Ffn::Dense(self.mlp(
                &format!("{p}.mlp"),
                (c.dense_ffn, "intermediate_size"),
                "first_k_dense_replace",
            )?)
        } else {
            let e = (c.routed_experts, "n_routed_experts");
            let weight = self
                .t(&format!("{p}.mlp.gate.weight"), &[e, h], why)?
                .to_dtype(DType::F32)?;
            let bias = self
                .ck
                .take(
                    &format!("{p}.mlp.gate.e_score_correction_bias"),
                    &[e],
                    DType::F32,
                    "topk_method noaux_tc",
                )?
                .to_vec1::<f32>()?;
            let mut experts = ExpertTable::new(c.routed_experts);
            for j in 0..c.routed_experts {
                let m = self.mlp(
                    &format!("{p}.mlp.experts.{j}"),
                    (c.expert_ffn, "moe_intermediate_size"),
                    "n_routed_experts",
                )?;
                experts.insert(j, Arc::new(Expert::new(m)?));
            }
            let shared = if c.shared_experts > 0 {
                Some(self.mlp(
                    &format!("{p}.mlp.shared_experts"),
                    (
                        c.expert_ffn * c.shared_experts,
                        "moe_intermediate_size * n_shared_experts",
                    ),
                    "n_shared_experts",
                )?)
            } else {
                None
            };
            Ffn::Moe(Moe {
                router: Router {
                    weight,
                    bias,
                    spec: RouteSpec {
                        experts: c.routed_experts,
                        top_k: c.top_k,
                        n_group: c.n_group,
                        topk_group: c.topk_group,
                        norm_topk_prob: c.norm_topk_prob,
                        routed_scaling_factor: c.routed_scaling_factor as f32,
                    },
                },
                experts,
                shared,
            })
        };
        Ok(Layer {
            input_norm: self.t(&format!("{p}.input_layernorm.weight"), &[h], why)?,
            post_norm: self.t(&format!("{p}.post_attention_layernorm.weight"), &[h], why)?,
            attn,
            ffn,
        })
    }
}

impl Model {
    /// Loads `dir/config.json` and the checkpoint beside it, computing in `dtype` (F32 or BF16).
    pub fn load(dir: &Path, dtype: DType, device: &Device) -> Result<Model, LoadError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| LoadError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let cfg = EngineConfig::from_hf_json(&dir.display().to_string(), &text)?;
        Model::from_checkpoint(cfg, Checkpoint::open(dir)?, dtype, device)
    }

    /// Builds the model `cfg` describes from a checkpoint; every tensor must be used.
    pub fn from_checkpoint(
        cfg: EngineConfig,
        mut ck: Checkpoint,
        dtype: DType,
        device: &Device,
    ) -> Result<Model, LoadError> {
        let c = cfg.clone();
        ck.set_fp8_block(c.fp8_block.0, c.fp8_block.1);
        let mut l = Loader {
            ck,
            cfg: &c,
            dtype,
            dev: device,
        };
        let vh = [(c.vocab, "vocab_size"), (c.hidden, "hidden_size")];
        let h = [(c.hidden, "hidden_size")];
        let embed = l.t("model.embed_tokens.weight", &vh, "the vocabulary")?;
        let layers = (0..c.layers)
            .map(|i| l.layer(i, "num_hidden_layers"))
            .collect::<Result<Vec<_>, _>>()?;
        let norm = l.t("model.norm.weight", &h, "the final norm")?;
        let lm_head = if c.tie_word_embeddings && !l.ck.contains("lm_head.weight") {
            embed.clone()
        } else {
            l.t("lm_head.weight", &vh, "the LM head")?
        };
        // transformers' save_pretrained leaves the MTP module out but keeps
        // num_nextn_predict_layers: a checkpoint holding none of its tensors loads without MTP
        // (an instance that drafts is then refused, saying why).
        let block = |i: usize| format!("model.layers.{i}.");
        let mtp_layers = if (0..c.mtp_layers).any(|k| l.ck.has_prefix(&block(c.layers + k))) {
            c.mtp_layers
        } else {
            0
        };
        let mut mtp = Vec::with_capacity(mtp_layers);
        for k in 0..mtp_layers {
            let i = c.layers + k;
            let p = format!("model.layers.{i}");
            let why = "num_nextn_predict_layers";
            // V3 checkpoints ship copies of the embedding and head in each MTP module.
            let m_embed = if l.ck.contains(&format!("{p}.embed_tokens.weight")) {
                l.t(&format!("{p}.embed_tokens.weight"), &vh, why)?
            } else {
                embed.clone()
            };
            let m_head = if l.ck.contains(&format!("{p}.shared_head.head.weight")) {
                l.t(&format!("{p}.shared_head.head.weight"), &vh, why)?
            } else {
                lm_head.clone()
            };
            mtp.push(MtpModule {
                embed: m_embed,
                enorm: l.t(&format!("{p}.enorm.weight"), &h, why)?,
                hnorm: l.t(&format!("{p}.hnorm.weight"), &h, why)?,
                eh_proj: l.lin(
                    &format!("{p}.eh_proj"),
                    h[0],
                    (2 * c.hidden, "2 * hidden_size"),
                    why,
                )?,
                head_norm: l.t(&format!("{p}.shared_head.norm.weight"), &h, why)?,
                head: m_head,
                layer: l.layer(i, why)?,
            });
        }
        // What HF ignores too: RoPE's cached inverse frequencies, and MTP modules the config
        // does not describe (a module is recognised by its eh_proj).
        let first_unused = c.layers + mtp_layers;
        let unused_mtp: Vec<String> = (first_unused..first_unused + 8)
            .filter(|&i| l.ck.has_prefix(&format!("{}eh_proj.", block(i))))
            .map(block)
            .collect();
        l.ck.finish(|t| {
            t.ends_with(".rotary_emb.inv_freq") || unused_mtp.iter().any(|p| t.starts_with(p))
        })?;
        let mut cfg = cfg;
        cfg.mtp_layers = mtp_layers;
        cfg.model.mtp_layers = mtp_layers as u64;
        Ok(Model {
            rope: Rope::new(&cfg),
            cfg,
            dtype,
            device: device.clone(),
            embed,
            layers,
            norm,
            lm_head,
            mtp,
        })
    }

    /// Replaces the linear layers of attention (q, kv_a, o) and of every FFN and expert by
    /// W8A8. `kv_b_proj` stays in the compute dtype: the absorbed path folds it into the query
    /// and output; the router, embeddings and LM head stay too.
    pub fn quantize_w8a8(&mut self) -> candle_core::Result<()> {
        let cfg = self.cfg.clone();
        let quantize = |layer: &mut Layer| -> candle_core::Result<()> {
            let a = &mut layer.attn;
            a.q = match &a.q {
                QProj::Lora { a: qa, norm, b } => QProj::Lora {
                    a: qa.to_w8a8()?,
                    norm: norm.clone(),
                    b: b.to_w8a8()?,
                },
                QProj::Full(p) => QProj::Full(p.to_w8a8()?),
            };
            a.kv_a = a.kv_a.to_w8a8()?;
            a.o = a.o.to_w8a8()?;
            a.refresh_absorbed(&cfg)?;
            layer.ffn = match &layer.ffn {
                Ffn::Dense(m) => Ffn::Dense(m.to_w8a8()?),
                Ffn::Moe(m) => Ffn::Moe(Moe {
                    router: m.router.clone(),
                    experts: m.experts.map(Expert::to_w8a8)?,
                    shared: m.shared.as_ref().map(Mlp::to_w8a8).transpose()?,
                }),
            };
            Ok(())
        };
        for layer in &mut self.layers {
            quantize(layer)?;
        }
        for m in &mut self.mtp {
            quantize(&mut m.layer)?;
            m.eh_proj = m.eh_proj.to_w8a8()?;
        }
        Ok(())
    }

    /// Every MoE layer in order: the decoder's, then each MTP module's (the order of EPLB
    /// placements and heat).
    pub fn moe_layers(&self) -> Vec<&Moe> {
        self.layers
            .iter()
            .chain(self.mtp.iter().map(|m| &m.layer))
            .filter_map(|l| match &l.ffn {
                Ffn::Moe(m) => Some(m),
                Ffn::Dense(_) => None,
            })
            .collect()
    }
}
