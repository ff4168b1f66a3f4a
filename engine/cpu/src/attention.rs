//! Multi-head latent attention (MLA) over the paged latent cache.
//!
//! Two ways to attend, same numbers:
//! - **prefill** (`AttnPath::Prefill`): the cached latents of the whole context are
//!   up-projected by `kv_b_proj` to per-head keys and values, then ordinary attention;
//! - **absorbed** (`AttnPath::Absorbed`): `kv_b_proj`'s key half is folded into the query and
//!   its value half into the output, so scores and the weighted sum run against the compressed
//!   latents themselves (the decode path of DeepSeek's and vLLM's MLA).

use crate::cache::PagedKvCache;
use crate::config::EngineConfig;
use crate::linear::Linear;
use crate::ops::{rms_norm, softmax_last};
use crate::profile::Profiler;
use crate::rope;
use candle_core::{DType, Result, Tensor, D};

/// Which attention computation a forward pass uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnPath {
    /// Up-project the latent context to per-head K/V.
    Prefill,
    /// Attend against the latent cache with `kv_b_proj` absorbed.
    Absorbed,
    /// Absorbed for sequences computing at most 8 tokens (decodes, MTP verification), prefill
    /// for longer chunks.
    Auto,
}

/// Query projection: LoRA (`q_a_proj`, `q_a_layernorm`, `q_b_proj`) or one `q_proj`.
#[derive(Clone, Debug)]
pub enum QProj {
    Lora { a: Linear, norm: Tensor, b: Linear },
    Full(Linear),
}

#[derive(Clone, Debug)]
pub struct Mla {
    pub q: QProj,
    pub kv_a: Linear,
    pub kv_a_norm: Tensor,
    pub kv_b: Linear,
    pub o: Linear,
    /// `kv_b_proj`'s key half per head, `[heads, qk_nope, kv_lora]` (f32).
    w_uk: Tensor,
    /// `kv_b_proj`'s value half per head transposed, `[heads, kv_lora, v_head]` (f32).
    w_uv_t: Tensor,
}

/// One sequence's slice of the batch, as attention sees it.
pub struct SeqSpan<'a> {
    pub blocks: &'a [u32],
    pub computed: usize,
    /// Rows of this sequence's new tokens in the batch.
    pub start: usize,
    pub len: usize,
}

impl Mla {
    pub fn new(
        q: QProj,
        kv_a: Linear,
        kv_a_norm: Tensor,
        kv_b: Linear,
        o: Linear,
        cfg: &EngineConfig,
    ) -> Result<Mla> {
        let (w_uk, w_uv_t) = split_kv_b(&kv_b, cfg)?;
        Ok(Mla {
            q,
            kv_a,
            kv_a_norm,
            kv_b,
            o,
            w_uk,
            w_uv_t,
        })
    }

    /// Rebuilds the absorbed weights after `kv_b` changed (quantization).
    pub fn refresh_absorbed(&mut self, cfg: &EngineConfig) -> Result<()> {
        (self.w_uk, self.w_uv_t) = split_kv_b(&self.kv_b, cfg)?;
        Ok(())
    }

    /// `x [T, hidden]` (already normed) for the sequences in `spans`; writes each token's
    /// latent to `cache` layer `layer` and returns `[T, hidden]`. Its ops are timed as the op
    /// graph names them: `q_a_proj` (the query LoRA down-projection), `q_b_proj` (its
    /// up-projection; the one `q_proj` without a query LoRA), `kv_a_proj` (the latent), per
    /// sequence either `kv_b_proj` (the cached latents gathered and up-projected) and
    /// `attn_prefill`, or `q_absorb`, `attn_decode` (over the gathered latents) and `v_absorb`;
    /// then `o_proj`. The query and latent norms, the rotary embedding and the cache write are
    /// not ops of the op graph and are left out of every op's time: a trace shows them as time
    /// inside the step no op covers, which `calibrate --trace` fits as host time (per step,
    /// sequence and token), so that a projection's time is the product the op graph describes.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        cfg: &EngineConfig,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        cache: &mut PagedKvCache,
        layer: usize,
        spans: &[SeqSpan],
        path: AttnPath,
        prof: &mut Profiler,
    ) -> Result<Tensor> {
        let (t, hidden) = x.dims2()?;
        let (h, nope, rd, kvl) = (
            cfg.heads,
            cfg.qk_nope_dim,
            cfg.qk_rope_dim,
            cfg.kv_lora_rank,
        );
        let eps = cfg.rms_norm_eps;
        let qk = h * (nope + rd);
        let q = match &self.q {
            QProj::Lora { a, norm, b } => {
                let s = prof.begin();
                let qa = a.forward(x)?;
                prof.end(
                    s,
                    "q_a_proj",
                    || crate::args! {"tokens": t, "k": hidden, "n": a.out_dim()},
                );
                let qa = rms_norm(&qa, norm, eps)?;
                let s = prof.begin();
                let q = b.forward(&qa)?;
                prof.end(
                    s,
                    "q_b_proj",
                    || crate::args! {"tokens": t, "k": a.out_dim(), "n": qk},
                );
                self.q_rope(&q, cfg, cos, sin)?
            }
            QProj::Full(p) => {
                let s = prof.begin();
                let q = p.forward(x)?;
                prof.end(
                    s,
                    "q_b_proj",
                    || crate::args! {"tokens": t, "k": hidden, "n": qk},
                );
                self.q_rope(&q, cfg, cos, sin)?
            }
        };
        let (q_nope, q_pe) = q;
        let s = prof.begin();
        let kv = self.kv_a.forward(x)?;
        prof.end(
            s,
            "kv_a_proj",
            || crate::args! {"tokens": t, "k": hidden, "n": kvl + rd},
        );
        let c_kv = rms_norm(
            &kv.narrow(D::Minus1, 0, kvl)?.contiguous()?,
            &self.kv_a_norm,
            eps,
        )?;
        let k_pe = rope::apply(
            &kv.narrow(D::Minus1, kvl, rd)?.reshape((t, 1, rd))?,
            cos,
            sin,
        )?
        .reshape((t, rd))?;
        let latent = Tensor::cat(&[&c_kv, &k_pe], D::Minus1)?;
        for sp in spans {
            cache.write(
                layer,
                sp.blocks,
                sp.computed,
                &latent.narrow(0, sp.start, sp.len)?,
            )?;
        }
        let scale = cfg.softmax_scale();
        let mut outs = Vec::with_capacity(spans.len());
        for sp in spans {
            let absorbed = match path {
                AttnPath::Absorbed => true,
                AttnPath::Prefill => false,
                AttnPath::Auto => sp.len <= 8,
            };
            let q = SeqQuery {
                span: sp,
                q_nope: &q_nope,
                q_pe: &q_pe,
            };
            let o = if absorbed {
                self.attend_absorbed(cfg, cache, layer, &q, scale, prof)?
            } else {
                self.attend_prefill(cfg, cache, layer, &q, scale, prof)?
            };
            outs.push(o.to_dtype(x.dtype())?);
        }
        let s = prof.begin();
        let o = Tensor::cat(&outs, 0)?;
        let y = self.o.forward(&o)?;
        prof.end(
            s,
            "o_proj",
            || crate::args! {"tokens": t, "k": h * cfg.v_head_dim, "n": hidden, "seqs": spans.len()},
        );
        Ok(y)
    }

    /// Queries `[T, heads * (nope + rope)]` -> the no-position part and the rotated part,
    /// `[T, heads, *]` each.
    fn q_rope(
        &self,
        q: &Tensor,
        cfg: &EngineConfig,
        cos: &Tensor,
        sin: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let (h, nope, rd) = (cfg.heads, cfg.qk_nope_dim, cfg.qk_rope_dim);
        let q = q.reshape((q.dims2()?.0, h, nope + rd))?;
        let q_nope = q.narrow(D::Minus1, 0, nope)?;
        let q_pe = rope::apply(&q.narrow(D::Minus1, nope, rd)?.contiguous()?, cos, sin)?;
        Ok((q_nope, q_pe))
    }

    /// The prefill path for one sequence: `kv_b_proj` (its cached latents gathered and
    /// up-projected to per-head keys and values), then `attn_prefill`; -> `[n, h * v]`.
    fn attend_prefill(
        &self,
        cfg: &EngineConfig,
        cache: &PagedKvCache,
        layer: usize,
        q: &SeqQuery,
        scale: f64,
        prof: &mut Profiler,
    ) -> Result<Tensor> {
        let (h, nope, v, kvl) = (cfg.heads, cfg.qk_nope_dim, cfg.v_head_dim, cfg.kv_lora_rank);
        let s = prof.begin();
        let (c, kpe) = q.context(cfg, cache, layer)?;
        let ctx = c.dims2()?.0;
        // Keys and values from the latents in the layer's dtype, as HF's `kv_b_proj` does.
        let kv = self
            .kv_b
            .forward(&c.to_dtype(self.kv_a_norm.dtype())?)?
            .to_dtype(DType::F32)?
            .reshape((ctx, h, nope + v))?
            .transpose(0, 1)?;
        prof.end(
            s,
            "kv_b_proj",
            || crate::args! {"tokens": ctx, "k": kvl, "n": h * (nope + v)},
        );
        let s = prof.begin();
        let (qn, qp) = q.per_head()?;
        let n = qn.dims3()?.1;
        let rope = kpe.dims2()?.1;
        let k_nope = kv.narrow(D::Minus1, 0, nope)?.contiguous()?;
        let val = kv.narrow(D::Minus1, nope, v)?.contiguous()?;
        // In bf16, round where HF's eager attention holds bf16 tensors: the scores, the scaled
        // scores and the probabilities.
        let r = |t: Tensor| round_to(t, self.kv_a_norm.dtype());
        // Causal attention by tiles of queries, each against the keys its last query sees: the
        // work is the causal pairs (what the op graph counts, as a flash kernel skips masked
        // blocks) plus half a tile per query, not every query against the whole context.
        let mut tiles = Vec::with_capacity(n.div_ceil(PREFILL_TILE));
        for first in (0..n).step_by(PREFILL_TILE) {
            let len = PREFILL_TILE.min(n - first);
            let keys = q.span.computed + first + len;
            let k_t = k_nope.narrow(1, 0, keys)?.transpose(1, 2)?.contiguous()?;
            let kpe_t = kpe.narrow(0, 0, keys)?.t()?.contiguous()?;
            let scores = (qn.narrow(1, first, len)?.contiguous()?.matmul(&k_t)?
                + qp.narrow(1, first, len)?
                    .contiguous()?
                    .reshape((h * len, rope))?
                    .matmul(&kpe_t)?
                    .reshape((h, len, keys))?)?;
            let p = r(softmax_last(&causal(
                r((r(scores)? * scale)?)?,
                q.span.computed + first,
            )?)?)?;
            tiles.push(p.matmul(&val.narrow(1, 0, keys)?.contiguous()?)?);
        }
        let o = Tensor::cat(&tiles, 1)?;
        let o = o.transpose(0, 1)?.reshape((n, h * v))?; // [h, n, v] -> [n, h * v]
        prof.end(
            s,
            "attn_prefill",
            || crate::args! {"tokens": n, "context": ctx, "heads": h},
        );
        Ok(o)
    }

    /// The absorbed path for one sequence, against its latents: `q_absorb`, `attn_decode`
    /// (the cached latents gathered, scores, softmax, weighted sum), `v_absorb`; -> `[n, h * v]`.
    fn attend_absorbed(
        &self,
        cfg: &EngineConfig,
        cache: &PagedKvCache,
        layer: usize,
        q: &SeqQuery,
        scale: f64,
        prof: &mut Profiler,
    ) -> Result<Tensor> {
        let (h, nope, v, kvl) = (cfg.heads, cfg.qk_nope_dim, cfg.v_head_dim, cfg.kv_lora_rank);
        let s = prof.begin();
        let (qn, qp) = q.per_head()?;
        let n = qn.dims3()?.1;
        let q_lat = qn.matmul(&self.w_uk)?; // [h, n, kvl]
        prof.end(
            s,
            "q_absorb",
            || crate::args! {"tokens": n, "heads": h, "k": nope, "n": kvl},
        );
        let s = prof.begin();
        let (c, kpe) = q.context(cfg, cache, layer)?;
        let ctx = c.dims2()?.0;
        let scores = (q_lat.reshape((h * n, kvl))?.matmul(&c.t()?.contiguous()?)?
            + qp.reshape((h * n, kpe.dims2()?.1))?
                .matmul(&kpe.t()?.contiguous()?)?)?
        .reshape((h, n, ctx))?;
        let p = softmax_last(&causal((scores * scale)?, q.span.computed)?)?;
        let o_lat = p.reshape((h * n, ctx))?.matmul(&c)?.reshape((h, n, kvl))?;
        prof.end(
            s,
            "attn_decode",
            || crate::args! {"tokens": n, "context": ctx, "heads": h},
        );
        let s = prof.begin();
        let o = o_lat
            .matmul(&self.w_uv_t)?
            .transpose(0, 1)?
            .reshape((n, h * v))?;
        prof.end(
            s,
            "v_absorb",
            || crate::args! {"tokens": n, "heads": h, "k": kvl, "n": v},
        );
        Ok(o)
    }
}

/// One sequence's queries within the batch's.
struct SeqQuery<'a> {
    span: &'a SeqSpan<'a>,
    /// `[T, h, nope]` and `[T, h, rope]` for the whole batch.
    q_nope: &'a Tensor,
    q_pe: &'a Tensor,
}

impl SeqQuery<'_> {
    /// This sequence's query parts as `[h, n, *]` f32.
    fn per_head(&self) -> Result<(Tensor, Tensor)> {
        let f = |q: &Tensor| -> Result<Tensor> {
            q.narrow(0, self.span.start, self.span.len)?
                .to_dtype(DType::F32)?
                .transpose(0, 1)?
                .contiguous()
        };
        Ok((f(self.q_nope)?, f(self.q_pe)?))
    }

    /// Its context's cached latents `[ctx, kv_lora]` and rotary keys `[ctx, rope]`, f32.
    fn context(
        &self,
        cfg: &EngineConfig,
        cache: &PagedKvCache,
        layer: usize,
    ) -> Result<(Tensor, Tensor)> {
        let ctx = cache
            .gather(layer, self.span.blocks, self.span.computed + self.span.len)?
            .to_dtype(DType::F32)?;
        Ok((
            ctx.narrow(D::Minus1, 0, cfg.kv_lora_rank)?.contiguous()?,
            ctx.narrow(D::Minus1, cfg.kv_lora_rank, cfg.qk_rope_dim)?
                .contiguous()?,
        ))
    }
}

/// Queries per tile of the prefill path's attention.
const PREFILL_TILE: usize = 64;

/// `[h, n, ctx]` scores with query `i` (at position `computed + i`) masked beyond itself.
fn causal(scores: Tensor, computed: usize) -> Result<Tensor> {
    let (_, n, ctx) = scores.dims3()?;
    if computed + 1 >= ctx {
        return Ok(scores); // a single new token sees everything
    }
    let mask: Vec<f32> = (0..n)
        .flat_map(|i| {
            (0..ctx).map(move |j| {
                if j > computed + i {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
        })
        .collect();
    let mask = Tensor::from_vec(mask, (1, n, ctx), scores.device())?;
    scores.broadcast_add(&mask)
}

/// `t` (f32) rounded to `dtype`'s precision, still f32.
fn round_to(t: Tensor, dtype: DType) -> Result<Tensor> {
    if dtype == DType::F32 {
        Ok(t)
    } else {
        t.to_dtype(dtype)?.to_dtype(DType::F32)
    }
}

fn split_kv_b(kv_b: &Linear, cfg: &EngineConfig) -> Result<(Tensor, Tensor)> {
    let (h, nope, v, kvl) = (cfg.heads, cfg.qk_nope_dim, cfg.v_head_dim, cfg.kv_lora_rank);
    let w = kv_b.weight_f32()?.reshape((h, nope + v, kvl))?;
    let w_uk = w.narrow(1, 0, nope)?.contiguous()?;
    let w_uv_t = w.narrow(1, nope, v)?.transpose(1, 2)?.contiguous()?;
    Ok((w_uk, w_uv_t))
}
