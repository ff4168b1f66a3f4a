//! The DeepSeek-V3 model: embedding, decoder layers (MLA + dense FFN or DeepSeekMoE), final
//! norm and LM head, and the MTP modules; loading from a HF checkpoint and the batched forward
//! over paged sequences.

use crate::attention::{AttnPath, Mla, QProj, SeqSpan};
use crate::cache::PagedKvCache;
use crate::config::EngineConfig;
use crate::error::{LoadError, ModelError};
use crate::linear::Linear;
use crate::moe::{ExpertTable, Ffn, Mlp, Moe, RouteSpec, Router};
use crate::ops::{argmax_rows, rms_norm};
use crate::rope::Rope;
use crate::weights::{Checkpoint, Dim};
use candle_core::{DType, Device, Tensor, D};
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

/// A checked batch: each sequence's span of rows, every row's position and token id.
struct Prepared<'a> {
    spans: Vec<SeqSpan<'a>>,
    positions: Vec<usize>,
    ids: Vec<u32>,
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
                experts.insert(j, Arc::new(m));
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
        ck: Checkpoint,
        dtype: DType,
        device: &Device,
    ) -> Result<Model, LoadError> {
        let c = cfg.clone();
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
        let mut mtp = Vec::with_capacity(c.mtp_layers);
        for k in 0..c.mtp_layers {
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
        l.ck.finish()?;
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
                    experts: m.experts.map(Mlp::to_w8a8)?,
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

    /// Checks a batch against the model and the cache; returns the spans and positions.
    fn prepare<'a>(
        &self,
        cache: &PagedKvCache,
        seqs: &[SeqInput<'a>],
    ) -> Result<Prepared<'a>, ModelError> {
        let mut spans = Vec::with_capacity(seqs.len());
        let mut positions = Vec::new();
        let mut ids = Vec::new();
        for (i, s) in seqs.iter().enumerate() {
            if s.tokens.is_empty() {
                return Err(ModelError::Input {
                    seq: i,
                    message: "no tokens to compute".into(),
                });
            }
            if s.logits > s.tokens.len() {
                return Err(ModelError::Input {
                    seq: i,
                    message: format!(
                        "{} logit rows asked of {} new tokens",
                        s.logits,
                        s.tokens.len()
                    ),
                });
            }
            if let Some(&t) = s.tokens.iter().find(|&&t| t as usize >= self.cfg.vocab) {
                return Err(ModelError::Token {
                    token: t,
                    vocab: self.cfg.vocab,
                });
            }
            cache.check_table(i, s.blocks, s.computed + s.tokens.len())?;
            spans.push(SeqSpan {
                blocks: s.blocks,
                computed: s.computed,
                start: ids.len(),
                len: s.tokens.len(),
            });
            positions.extend(s.computed..s.computed + s.tokens.len());
            ids.extend_from_slice(s.tokens);
        }
        Ok(Prepared {
            spans,
            positions,
            ids,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn run_layer(
        &self,
        layer: &Layer,
        index: usize,
        cache_layer: usize,
        x: &Tensor,
        rope: &(Tensor, Tensor),
        cache: &mut PagedKvCache,
        spans: &[SeqSpan],
        path: AttnPath,
    ) -> Result<(Tensor, Option<Vec<u32>>), ModelError> {
        let eps = self.cfg.rms_norm_eps;
        let h = rms_norm(x, &layer.input_norm, eps)?;
        let a = layer.attn.forward(
            &self.cfg,
            &h,
            &rope.0,
            &rope.1,
            cache,
            cache_layer,
            spans,
            path,
        )?;
        let x = (x + a)?;
        let (y, counts) = layer.ffn.forward(index, &x, &layer.post_norm, eps)?;
        Ok(((x + y)?, counts))
    }

    /// The rows of each sequence's last `logits` positions.
    fn logit_rows(&self, seqs: &[SeqInput], spans: &[SeqSpan]) -> Vec<u32> {
        seqs.iter()
            .zip(spans)
            .flat_map(|(s, sp)| (sp.start + sp.len - s.logits..sp.start + sp.len).map(|r| r as u32))
            .collect()
    }

    fn head(
        &self,
        x: &Tensor,
        rows: &[u32],
        norm: &Tensor,
        head: &Tensor,
    ) -> candle_core::Result<Tensor> {
        let idx = Tensor::from_slice(rows, rows.len(), x.device())?;
        let h = rms_norm(&x.index_select(&idx, 0)?, norm, self.cfg.rms_norm_eps)?;
        h.matmul(&head.t()?)?.to_dtype(DType::F32)
    }

    /// Runs a batch of sequences (prompt chunks and decodes mixed): writes their latents into
    /// `cache` at their positions and returns the logits asked for.
    pub fn forward(
        &self,
        cache: &mut PagedKvCache,
        seqs: &[SeqInput],
        path: AttnPath,
    ) -> Result<Forward, ModelError> {
        let Prepared {
            spans,
            positions,
            ids,
        } = self.prepare(cache, seqs)?;
        let idx = Tensor::from_slice(&ids, ids.len(), &self.device)?;
        let mut x = self.embed.index_select(&idx, 0)?;
        let rope = self.rope.tables(&positions, self.dtype, &self.device)?;
        let mut expert_counts = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            let (y, counts) = self.run_layer(layer, i, i, &x, &rope, cache, &spans, path)?;
            x = y;
            expert_counts.extend(counts);
        }
        let rows = self.logit_rows(seqs, &spans);
        let logits = self.head(&x, &rows, &self.norm, &self.lm_head)?;
        Ok(Forward {
            logits,
            hidden: x,
            expert_counts,
        })
    }

    /// Runs MTP module `k` over a batch: each sequence's `tokens` are the tokens *after* the
    /// positions it covers (position `p` takes token `p + 1`), `hidden` the main model's
    /// [`Forward::hidden`] rows for the same positions. The module's latents go to cache layer
    /// `num_hidden_layers + k`; the logits predict the token after next.
    pub fn mtp_forward(
        &self,
        k: usize,
        cache: &mut PagedKvCache,
        seqs: &[SeqInput],
        hidden: &Tensor,
        path: AttnPath,
    ) -> Result<Forward, ModelError> {
        let m = self.mtp.get(k).ok_or(ModelError::NoMtp)?;
        let Prepared {
            spans,
            positions,
            ids,
        } = self.prepare(cache, seqs)?;
        if hidden.dims2()?.0 != ids.len() {
            return Err(ModelError::Input {
                seq: 0,
                message: format!("{} hidden rows for {} tokens", hidden.dims2()?.0, ids.len()),
            });
        }
        let eps = self.cfg.rms_norm_eps;
        let idx = Tensor::from_slice(&ids, ids.len(), &self.device)?;
        let e = rms_norm(&m.embed.index_select(&idx, 0)?, &m.enorm, eps)?;
        let hn = rms_norm(&hidden.to_dtype(self.dtype)?, &m.hnorm, eps)?;
        let x = m.eh_proj.forward(&Tensor::cat(&[&e, &hn], D::Minus1)?)?;
        let rope = self.rope.tables(&positions, self.dtype, &self.device)?;
        let index = self.cfg.layers + k;
        let (x, counts) = self.run_layer(&m.layer, index, index, &x, &rope, cache, &spans, path)?;
        let rows = self.logit_rows(seqs, &spans);
        let logits = self.head(&x, &rows, &m.head_norm, &m.head)?;
        Ok(Forward {
            logits,
            hidden: x,
            expert_counts: counts.into_iter().collect(),
        })
    }

    /// The model's own greedy continuation of `prompt`, one forward per token on a private
    /// cache: up to `max_tokens` tokens, ending after an end-of-sequence token unless
    /// `ignore_eos`. The reference the scheduler-driven engine is checked against.
    pub fn greedy(
        &self,
        prompt: &[u32],
        max_tokens: usize,
        ignore_eos: bool,
    ) -> Result<Vec<u32>, ModelError> {
        const BS: usize = 16;
        let n = (prompt.len() + max_tokens).div_ceil(BS).max(1);
        let mut cache = PagedKvCache::new(&self.cfg, n, BS, self.dtype, &self.device)?;
        let blocks: Vec<u32> = (0..n as u32).collect();
        let (mut out, mut input, mut computed) = (Vec::new(), prompt.to_vec(), 0);
        while out.len() < max_tokens {
            let f = self.forward(
                &mut cache,
                &[SeqInput {
                    blocks: &blocks,
                    computed,
                    tokens: &input,
                    logits: 1,
                }],
                AttnPath::Auto,
            )?;
            let t = argmax_rows(&f.logits)?[0];
            computed += input.len();
            out.push(t);
            if !ignore_eos && self.cfg.eos_token_ids.contains(&t) {
                break;
            }
            input = vec![t];
        }
        Ok(out)
    }

    /// Greedy draft tokens of MTP module 0, one per logit row asked for.
    pub fn draft(
        &self,
        cache: &mut PagedKvCache,
        seqs: &[SeqInput],
        hidden: &Tensor,
        path: AttnPath,
    ) -> Result<Vec<u32>, ModelError> {
        Ok(argmax_rows(
            &self.mtp_forward(0, cache, seqs, hidden, path)?.logits,
        )?)
    }
}
