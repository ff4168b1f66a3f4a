//! The aggregate shape of one DP rank's forward step.
//!
//! A step is priced from a handful of sums, never from the list of sequences in it, so the cost of
//! pricing does not grow with the number of sequences in flight and identical shapes can be
//! memoized. The scheduler builds a `BatchShape` with [`BatchShape::add_prefill`] and
//! [`BatchShape::add_decode`]; the op graph turns it into ops.

use serde::{Deserialize, Serialize};

/// The most sequences one DP rank may decode in a step. vLLM's `max_num_seqs` is 256 by default
/// and a few hundred in the published deployments; pairs and tokens are products of this with
/// context lengths and draft counts, so it is bounded far above any real batch to keep them in u64.
pub const MAX_SEQS_PER_STEP: u64 = 1 << 16;
/// The most tokens one DP rank may compute in a step (vLLM's `max_num_batched_tokens`: 8,192 to
/// 65,536 in the published deployments), bounded for the same reason.
pub const MAX_TOKENS_PER_STEP: u64 = 1 << 24;

/// Per-step sums over the sequences one DP rank computes.
///
/// "Pairs" count query-key pairs an attention layer visits. Sparse attention (DeepSeek-V3.2's DSA,
/// V4's compressed sparse attention) caps how many keys one query attends to; `*_capped` fields
/// hold the same sums with each query's key count capped at the model's [`AttnCap`].
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct BatchShape {
    /// Sequences computing prompt tokens this step (whole prompts or chunks).
    pub prefill_seqs: u32,
    /// Prompt tokens computed this step.
    pub prefill_tokens: u64,
    /// Σ over new prompt tokens of the keys each attends (causal: cached prefix + its position).
    pub prefill_pairs: u64,
    /// The same with each query's keys capped.
    pub prefill_pairs_capped: u64,
    /// Σ over prompt sequences of the tokens already in KV before this step's chunk (prefix-cache
    /// hits and earlier chunks): the prefill form of MLA up-projects their cached latent again.
    pub prefill_cached: u64,
    /// Sequences decoding this step.
    pub decode_seqs: u32,
    /// Tokens decoded this step: per sequence 1 + its draft tokens (MTP).
    pub decode_tokens: u64,
    /// Σ over decode tokens of the keys each attends (its context length).
    pub decode_pairs: u64,
    /// The same with each query's keys capped.
    pub decode_pairs_capped: u64,
}

/// The most keys one query attends to in the sparse part of the attention; `None` for dense
/// attention. It is a property of the model (e.g. V3.2: top-2048 tokens).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AttnCap(pub Option<u64>);

impl AttnCap {
    /// Σ_{i=1..=n} min(base + i, cap).
    fn capped_causal_sum(self, base: u64, n: u64) -> u64 {
        let full = causal_sum(base, n);
        match self.0 {
            None => full,
            Some(c) if base >= c => c * n,
            Some(c) => {
                // Queries base+1 ..= c grow; the rest are capped at c.
                let growing = (c - base).min(n);
                causal_sum(base, growing) + c * (n - growing)
            }
        }
    }
}

/// Σ_{i=1..=n} (base + i).
fn causal_sum(base: u64, n: u64) -> u64 {
    base * n + n * (n + 1) / 2
}

impl BatchShape {
    /// Adds a prefill (or prefill chunk) of `new_tokens` after `cached_tokens` already in KV
    /// (prefix-cache hits or earlier chunks).
    pub fn add_prefill(&mut self, new_tokens: u64, cached_tokens: u64, cap: AttnCap) {
        if new_tokens == 0 {
            return;
        }
        self.prefill_seqs += 1;
        self.prefill_tokens += new_tokens;
        self.prefill_pairs += causal_sum(cached_tokens, new_tokens);
        self.prefill_pairs_capped += cap.capped_causal_sum(cached_tokens, new_tokens);
        self.prefill_cached += cached_tokens;
    }

    /// Adds a decoding sequence whose KV holds `context_tokens` before this step and which
    /// computes `tokens` query tokens (1 + MTP drafts).
    pub fn add_decode(&mut self, tokens: u64, context_tokens: u64, cap: AttnCap) {
        if tokens == 0 {
            return;
        }
        self.decode_seqs += 1;
        self.decode_tokens += tokens;
        self.decode_pairs += causal_sum(context_tokens, tokens);
        self.decode_pairs_capped += cap.capped_causal_sum(context_tokens, tokens);
    }

    /// Adds `seqs` decoding sequences given by their sums (see the fields).
    pub fn add_decode_sums(&mut self, seqs: u64, tokens: u64, pairs: u64, pairs_capped: u64) {
        self.decode_seqs += seqs as u32;
        self.decode_tokens += tokens;
        self.decode_pairs += pairs;
        self.decode_pairs_capped += pairs_capped;
    }

    /// A uniform batch: `seqs` sequences each decoding `tokens_per_seq` tokens at `context` KV.
    pub fn uniform_decode(seqs: u32, tokens_per_seq: u64, context: u64, cap: AttnCap) -> Self {
        let mut s = BatchShape::default();
        for _ in 0..seqs.min(1) {
            s.add_decode(tokens_per_seq, context, cap);
        }
        s.scale(seqs as u64)
    }

    /// A uniform batch: `seqs` whole prompts of `prompt` tokens each, nothing cached.
    pub fn uniform_prefill(seqs: u32, prompt: u64, cap: AttnCap) -> Self {
        Self::uniform_chunks(seqs, prompt, 0, cap)
    }

    /// `seqs` prompt chunks of `new_tokens` each, after `cached_tokens` of the same prompt
    /// already in KV (prefix-cache hits or earlier chunks).
    pub fn uniform_chunks(seqs: u32, new_tokens: u64, cached_tokens: u64, cap: AttnCap) -> Self {
        let mut s = BatchShape::default();
        for _ in 0..seqs.min(1) {
            s.add_prefill(new_tokens, cached_tokens, cap);
        }
        s.scale(seqs as u64)
    }

    /// `n` copies of a one-sequence shape.
    fn scale(self, n: u64) -> Self {
        if self.prefill_seqs + self.decode_seqs == 0 || n == 0 {
            return BatchShape::default();
        }
        BatchShape {
            prefill_seqs: self.prefill_seqs * n as u32,
            prefill_tokens: self.prefill_tokens * n,
            prefill_pairs: self.prefill_pairs * n,
            prefill_pairs_capped: self.prefill_pairs_capped * n,
            prefill_cached: self.prefill_cached * n,
            decode_seqs: self.decode_seqs * n as u32,
            decode_tokens: self.decode_tokens * n,
            decode_pairs: self.decode_pairs * n,
            decode_pairs_capped: self.decode_pairs_capped * n,
        }
    }

    /// All tokens computed this step.
    pub fn tokens(&self) -> u64 {
        self.prefill_tokens + self.decode_tokens
    }

    /// All sequences in this step.
    pub fn seqs(&self) -> u32 {
        self.prefill_seqs + self.decode_seqs
    }

    pub fn is_empty(&self) -> bool {
        self.tokens() == 0
    }

    /// The shape as the engine's attention sees it: vLLM classifies every request whose step
    /// computes at most `query_len` tokens (1 + MTP drafts) as a decode, whether or not it is
    /// a prompt (the one-token recompute of a request whose KV came from a prefill instance).
    /// When every prompt chunk of the step is that short (their tokens are at most
    /// `query_len` per chunk), they join the decodes.
    pub fn short_chunks_as_decode(&self, query_len: u64) -> BatchShape {
        if !self.short_chunks(query_len) {
            return *self;
        }
        BatchShape {
            prefill_seqs: 0,
            prefill_tokens: 0,
            prefill_pairs: 0,
            prefill_pairs_capped: 0,
            prefill_cached: 0,
            decode_seqs: self.decode_seqs + self.prefill_seqs,
            decode_tokens: self.decode_tokens + self.prefill_tokens,
            decode_pairs: self.decode_pairs + self.prefill_pairs,
            decode_pairs_capped: self.decode_pairs_capped + self.prefill_pairs_capped,
        }
    }

    /// Whether the step has prompt chunks of at most `query_len` tokens each (as the shape's
    /// sums tell: the chunks' tokens are at most their number times `query_len`): what
    /// [`BatchShape::short_chunks_as_decode`] turns into decodes, their tokens unchanged.
    #[inline]
    pub fn short_chunks(&self, query_len: u64) -> bool {
        self.prefill_seqs != 0 && self.prefill_tokens <= self.prefill_seqs as u64 * query_len
    }

    /// One die's share of the step when context parallelism spreads its tokens evenly over
    /// `ranks` dies (vllm-ascend's DSA-CP, SGLang's NSA prefill CP, both splitting each sequence
    /// round-robin): every sequence keeps a slice on every die, so sequence counts and cached
    /// tokens stay, and each die's queries still attend the whole context, so the query-key
    /// pairs split with the tokens. Rounded up.
    pub fn context_split(&self, ranks: u64) -> BatchShape {
        if ranks <= 1 {
            return *self;
        }
        BatchShape {
            prefill_tokens: self.prefill_tokens.div_ceil(ranks),
            prefill_pairs: self.prefill_pairs.div_ceil(ranks),
            prefill_pairs_capped: self.prefill_pairs_capped.div_ceil(ranks),
            decode_tokens: self.decode_tokens.div_ceil(ranks),
            decode_pairs: self.decode_pairs.div_ceil(ranks),
            decode_pairs_capped: self.decode_pairs_capped.div_ceil(ranks),
            ..*self
        }
    }

    /// A decode step padded to `tokens` tokens (a captured graph's size): the padding is dummy
    /// sequences of `1 + mtp_tokens` tokens that attend to one key each, so every projection
    /// and GEMM computes the padded rows while attention reads almost nothing more. A shape
    /// already that large, or with prompts, is returned as it is.
    pub fn padded_to(&self, tokens: u64, mtp_tokens: u32) -> BatchShape {
        if self.prefill_tokens > 0 || self.decode_tokens >= tokens {
            return *self;
        }
        let extra = tokens - self.decode_tokens;
        let q = 1 + mtp_tokens as u64;
        BatchShape {
            decode_seqs: self.decode_seqs + extra.div_ceil(q) as u32,
            decode_tokens: tokens,
            decode_pairs: self.decode_pairs + extra,
            decode_pairs_capped: self.decode_pairs_capped + extra,
            ..*self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brute(base: u64, n: u64, cap: Option<u64>) -> u64 {
        (1..=n)
            .map(|i| cap.map_or(base + i, |c| (base + i).min(c)))
            .sum()
    }

    #[test]
    fn capped_sums_match_brute_force() {
        for base in [0, 1, 5, 100, 2047, 2048, 5000] {
            for n in [0, 1, 2, 7, 300, 4096] {
                for cap in [None, Some(1), Some(64), Some(2048)] {
                    assert_eq!(
                        AttnCap(cap).capped_causal_sum(base, n),
                        brute(base, n, cap),
                        "base {base} n {n} cap {cap:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn uniform_shapes_scale() {
        let s = BatchShape::uniform_decode(48, 2, 4096, AttnCap(None));
        assert_eq!(s.decode_seqs, 48);
        assert_eq!(s.decode_tokens, 96);
        assert_eq!(s.decode_pairs, 48 * (4097 + 4098));
        let p = BatchShape::uniform_prefill(4, 4096, AttnCap(Some(2048)));
        assert_eq!(p.prefill_tokens, 16384);
        assert_eq!(p.prefill_pairs, 4 * 4096 * 4097 / 2);
        assert!(p.prefill_pairs_capped < p.prefill_pairs);
    }

    #[test]
    fn a_context_split_divides_tokens_and_pairs_not_sequences() {
        let mut b = BatchShape::uniform_chunks(1, 64_000, 4_000, AttnCap(Some(2048)));
        b.add_decode(2, 10_000, AttnCap(Some(2048)));
        let s = b.context_split(32);
        assert_eq!(s.prefill_tokens, 2_000);
        assert_eq!(s.prefill_pairs, b.prefill_pairs.div_ceil(32));
        assert_eq!(s.prefill_pairs_capped, b.prefill_pairs_capped.div_ceil(32));
        assert_eq!(s.decode_tokens, 1, "rounded up");
        assert_eq!((s.prefill_seqs, s.decode_seqs), (1, 1));
        assert_eq!(s.prefill_cached, b.prefill_cached);
        assert_eq!(b.context_split(1), b);
        // Every die's share together covers the step.
        assert!(s.tokens() * 32 >= b.tokens() && (s.tokens() - 1) * 32 < b.tokens());
    }
}
