//! DeepSeek-V4's own per-layer kernels: the manifold-constrained hyper-connections (mHC) around
//! each attention and MoE block, and the KV compressors of the compressed layers.
//!
//! Shapes follow DeepSeek-V4's reference inference code and the CANN recipe's fused kernels
//! (`HcPre`, `HcPost`, `Compressor`); docs/models.md lists each op's FLOPs and bytes. With `d` the
//! hidden size, `c` the residual copies (`hc_mult`) and `m = (2 + c) c` the mixing width:
//!
//! - `hc_pre` (twice per layer): an RMS-normalized projection of the `c` copies (`c d` wide) to
//!   `m` mixing coefficients (fp32), Sinkhorn iterations on the `c x c` residual mix, and the
//!   weighted sum of the copies into the block's input.
//! - `hc_post` (twice per layer): the block's output spread back over the copies, plus the
//!   residual copies mixed by that matrix.
//! - `hc_head` (once per pass): the copies merged into one before the final norm.
//! - A compressor per compressed layer (two in the compressed-sparse layers, which also compress
//!   the indexer's keys): every step projects each token into a KV and a score state (`c4a`,
//!   `c4li`, `c128a`), and when a window of `ratio` tokens completes it pools the window
//!   (softmax over the scores), normalizes and rotates the entry (`*_pool`). A step of `T` tokens
//!   completes `T / ratio` windows on average.

use super::compute as work;
use crate::model::{Attention, Compressor, ModelConfig};
use dstwin_hwmodels::{DType, OpClass, Work};

/// Bytes of an fp32 and of a bf16 value ([`DType::bytes`], usable in constant positions).
const F32: f64 = 4.0;
const BF16: f64 = 2.0;

/// The mHC sizes of a model: hidden size, residual copies, Sinkhorn iterations (None for a
/// model without hyper-connections).
fn mhc(m: &ModelConfig) -> Option<(f64, f64, f64)> {
    match &m.attention {
        Attention::Hybrid {
            hc_mult,
            hc_sinkhorn_iters,
            ..
        } if *hc_mult > 1 => Some((m.hidden as f64, *hc_mult as f64, *hc_sinkhorn_iters as f64)),
        _ => None,
    }
}

/// `hc_pre` over `tokens` tokens: read the `c` copies, project them to the `(2 + c) c` mixing
/// coefficients with fp32 weights, normalize the residual mix by Sinkhorn iterations, write
/// the mixed input and the coefficients.
pub fn hc_pre(m: &ModelConfig, tokens: f64) -> Option<Work> {
    let (d, c, iters) = mhc(m)?;
    let mix = (2.0 + c) * c;
    // Projection; RMS statistics and the weighted sum (4 per element); row and column sums and
    // divisions of the c x c matrix per iteration.
    let flops = tokens * (2.0 * c * d * mix + 4.0 * c * d + 4.0 * iters * c * c);
    let bytes = tokens * (c * d * BF16 + d * BF16 + (c + c * c) * F32) + mix * c * d * F32;
    Some(work(OpClass::Gemm, flops, bytes, DType::Fp32, tokens))
}

/// `hc_post` over `tokens` tokens: each of the `c` outputs is the block's output times its post
/// weight plus the copies mixed by the residual matrix.
pub fn hc_post(m: &ModelConfig, tokens: f64) -> Option<Work> {
    let (d, c, _) = mhc(m)?;
    let flops = tokens * 2.0 * c * d * (c + 1.0);
    let bytes = tokens * (2.0 * c * d * BF16 + d * BF16 + (c + c * c) * F32);
    Some(work(OpClass::Elementwise, flops, bytes, DType::Bf16, 0.0))
}

/// `hc_head` over `tokens` tokens: `hc_pre` without the residual mix (c coefficients, no
/// Sinkhorn), merging the copies before the final norm.
pub fn hc_head(m: &ModelConfig, tokens: f64) -> Option<Work> {
    let (d, c, _) = mhc(m)?;
    let flops = tokens * (2.0 * c * d * c + 4.0 * c * d);
    let bytes = tokens * (c * d * BF16 + d * BF16) + c * c * d * F32;
    Some(work(OpClass::Gemm, flops, bytes, DType::Fp32, tokens))
}

/// The ops of a compressor: its every-step projection and its pooling of completed windows,
/// named as the CANN recipe's kernels (`c4li`: the indexer's keys; `c4a`: the attention entries
/// of the compressed-sparse layers; `c128a`: those of the heavily compressed layers).
pub fn names(c: &Compressor) -> (&'static str, &'static str) {
    match (c.indexer, c.overlap) {
        (true, _) => ("c4li", "c4li_pool"),
        (false, true) => ("c4a", "c4a_pool"),
        (false, false) => ("c128a", "c128a_pool"),
    }
}

/// A compressor's every-step op over `tokens` tokens of hidden size `d`: KV and score
/// projections (bf16 weights, `2 coff dim` wide), the positional bias, and the fp32 state rows
/// written.
pub fn project(c: &Compressor, d: f64, tokens: f64) -> Work {
    let (dim, coff, r) = (c.dim as f64, c.coff() as f64, c.ratio as f64);
    let width = 2.0 * coff * dim;
    let flops = tokens * 2.0 * d * width;
    let bytes = width * d * BF16 + r * coff * dim * F32 + tokens * (d * BF16 + width * F32);
    work(OpClass::Gemm, flops, bytes, DType::Bf16, tokens)
}

/// A compressor pooling `entries` completed windows, with RoPE on `rope` dimensions: softmax
/// over each window's `coff x ratio` score rows and the weighted sum of its KV rows (7 per
/// value), RMS norm (4 per value) and RoPE (3 per rotated value) of the entry, and the indexer
/// keys' Hadamard rotation; it reads both fp32 states of the window and writes the entry.
pub fn pool(c: &Compressor, rope: f64, entries: f64) -> Work {
    let (dim, rows) = (c.dim as f64, (c.coff() * c.ratio) as f64);
    let rotate = if c.indexer { 2.0 * dim * dim } else { 0.0 };
    let flops = entries * (7.0 * rows * dim + 4.0 * dim + 3.0 * rope + rotate);
    let hadamard = if c.indexer && entries > 0.0 {
        dim * dim * BF16
    } else {
        0.0
    };
    let bytes = entries * (2.0 * rows * dim * F32 + dim * BF16) + hadamard;
    work(OpClass::Elementwise, flops, bytes, DType::Fp32, entries)
}

/// The RoPE dimensions of a model's compressed entries.
pub fn rope_dim(m: &ModelConfig) -> f64 {
    match &m.attention {
        Attention::Hybrid { rope_dim, .. } => *rope_dim as f64,
        Attention::Mla { qk_rope_dim, .. } => *qk_rope_dim as f64,
    }
}

/// One of the model's V4 kernels as a microbenchmark times it: `tokens` tokens in a call that
/// completes `entries` compression windows. Returns the ops the kernel is made of (a
/// compressor is its projection plus, when a window completes, its pooling), or None when the
/// model has no kernel of that name.
pub fn kernel_ops(
    m: &ModelConfig,
    name: &str,
    tokens: f64,
    entries: f64,
) -> Option<Vec<(&'static str, Work)>> {
    let mhc_op = match name {
        "hc_pre" => Some(("hc_pre", hc_pre(m, tokens)?)),
        "hc_post" => Some(("hc_post", hc_post(m, tokens)?)),
        "hc_head" => Some(("hc_head", hc_head(m, tokens)?)),
        _ => None,
    };
    if let Some(op) = mhc_op {
        return Some(vec![op]);
    }
    let c = kernel_compressor(m, name)?;
    let (project_name, pool_name) = names(&c);
    let mut ops = vec![(project_name, project(&c, m.hidden as f64, tokens))];
    if entries > 0.0 {
        ops.push((pool_name, pool(&c, rope_dim(m), entries)));
    }
    Some(ops)
}

/// The compressor whose every-step op is named `name` among the model's layers, if any.
pub fn kernel_compressor(m: &ModelConfig, name: &str) -> Option<Compressor> {
    let Attention::Hybrid {
        compress_ratios, ..
    } = &m.attention
    else {
        return None;
    };
    let mut ratios: Vec<u64> = compress_ratios[..m.layers as usize].to_vec();
    ratios.sort_unstable();
    ratios.dedup();
    ratios
        .into_iter()
        .flat_map(|r| m.compressors(r))
        .find(|c| names(c).0 == name)
}
