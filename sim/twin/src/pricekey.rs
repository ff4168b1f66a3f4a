//! The price cache's key: a rank's batch shape, the EP group's tokens, the imbalance bucket and
//! the MoE communication, each quantized to a few significant bits and packed into three words.

use dstwin_core::batch::BatchShape;
use dstwin_core::features::MoeCommUsed;
use dstwin_core::opgraph::MoeLoad;
use std::hash::Hasher;

/// Significant bits kept when quantizing shape sums for the price cache: prices are computed on
/// the quantized shape, so a result never depends on which shape filled the cache first, and the
/// relative rounding is below 1/2^7 < 0.8%.
const KEY_BITS: u32 = 7;

/// Imbalance is priced in steps of 1 / IMBALANCE_BUCKETS (2%).
const IMBALANCE_BUCKETS: f64 = 50.0;

#[cfg(test)]
fn quantize(v: u64) -> u64 {
    let c = code(v);
    ((c & 0xff) as u64) << (c >> 8)
}

/// A quantized value as `shift << 8 | mantissa` (value = mantissa << shift, the mantissa below
/// 2^KEY_BITS): 16 bits for any u64, exact, one code per value. Without branches past the
/// small values: nine codes make a rank's key, every rank and step.
#[inline(always)]
fn code(v: u64) -> u16 {
    let bits = 64 - v.leading_zeros();
    if bits <= KEY_BITS {
        return v as u16;
    }
    let shift = bits - KEY_BITS;
    // Round to nearest at the kept precision: (v + 2^(shift-1)) >> shift, without overflow.
    let m = ((v >> (shift - 1)) + 1) >> 1;
    // Rounding up to 2^KEY_BITS is the next power's code: one code per value.
    let carry = (m >> KEY_BITS) as u32;
    (((shift + carry) as u16) << 8) | (m >> carry) as u16
}

fn decode(c: u16) -> u64 {
    ((c & 0xff) as u64) << (c >> 8)
}

/// The codes of four shape sums packed in a word. A decode step's prompt sums are all zero
/// (code 0), and without an attention cap its pairs are its capped pairs: codes computed once.
#[inline(always)]
fn word(a: u64, b: u64, c: u64, d: u64) -> u64 {
    if a | b | c | d == 0 {
        return 0;
    }
    let cc = code(c) as u64;
    let dc = if d == c { cc } else { code(d) as u64 };
    code(a) as u64 | (code(b) as u64) << 16 | cc << 32 | dc << 48
}

/// The largest value whose code is `c`: codes are monotone in the value, so every value from
/// one with code `c` up to this one has code `c`.
fn last_of(c: u16) -> u64 {
    let (shift, m) = ((c >> 8) as u32, (c & 0xff) as u128);
    if shift == 0 {
        return m as u64;
    }
    // Rounding to nearest at `shift`: m covers up to (m + 1/2) 2^shift, excluded.
    (((2 * m + 1) << (shift - 1)) - 1).min(u64::MAX as u128) as u64
}

/// A DP rank's last decode-only key word, with the range of pairs that gives the same word:
/// a steady rank's context grows a few tokens a step, so its next key is mostly found without
/// coding its sums ([`DecodeWord::key`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct DecodeWord {
    seqs: u32,
    tokens: u64,
    /// Pairs from `lo` to `hi` (with their capped pairs equal) code as `word`'s pairs.
    lo: u64,
    hi: u64,
    word: u64,
}

impl Default for DecodeWord {
    /// No shape matches it (an empty range of pairs).
    fn default() -> Self {
        DecodeWord {
            seqs: 0,
            tokens: 0,
            lo: 1,
            hi: 0,
            word: 0,
        }
    }
}

impl DecodeWord {
    /// [`PriceKey::with_load`] of `s` under `load`, read from this word where `s` is a decode
    /// step with the word's sequences and tokens and pairs in its range; a decode step
    /// elsewhere becomes the word.
    #[inline]
    pub(crate) fn key(&mut self, s: &BatchShape, load: StepLoad) -> PriceKey {
        let prompts = s.prefill_seqs as u64
            | s.prefill_tokens
            | s.prefill_pairs
            | s.prefill_pairs_capped
            | s.prefill_cached;
        let pairs = s.decode_pairs;
        if prompts != 0 || s.decode_pairs_capped != pairs {
            return PriceKey::with_load(s, load);
        }
        let (seqs, tokens) = (s.decode_seqs, s.decode_tokens);
        if !(seqs == self.seqs && tokens == self.tokens && self.lo <= pairs && pairs <= self.hi) {
            *self = DecodeWord {
                seqs,
                tokens,
                lo: pairs,
                hi: last_of(code(pairs)),
                word: word(seqs as u64, tokens, pairs, pairs),
            };
        }
        // A decode step's prompt word and cached prompt tokens are 0.
        PriceKey::from_words(0, self.word, 0, load)
    }
}

/// The slot among `N` (a power of two) of a key of `words`, by a hash of them all: the top
/// bits of a Fibonacci multiply, which spread the structured low bits of quantized codes.
#[inline]
pub(crate) fn slot_of<const N: usize>(words: &[u64]) -> usize {
    const { assert!(N.is_power_of_two() && N > 1) };
    let mut x = 0u64;
    for (i, w) in words.iter().enumerate() {
        x ^= w.rotate_left(21 * i as u32);
    }
    let h = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> (64 - N.trailing_zeros())) as usize
}

/// A price-cache key: the quantized shape sums and group tokens as [`code`]s, and the imbalance
/// bucket, packed into three words (24 bytes: the map's entries stay small enough to sit in
/// cache where whole shapes did not).
#[derive(Clone, Copy, Debug, Eq)]
pub(crate) struct PriceKey([u64; 3]);

/// Word by word: a key is built in registers and stored just before it is looked up, and the
/// derived compare's 16-byte loads of the two words just stored cannot be forwarded from the
/// stores (the lookup waited for them to retire).
impl PartialEq for PriceKey {
    #[inline]
    fn eq(&self, o: &Self) -> bool {
        (self.0[0] == o.0[0]) & (self.0[1] == o.0[1]) & (self.0[2] == o.0[2])
    }
}

impl std::hash::Hash for PriceKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        for w in self.0 {
            state.write_u64(w);
        }
    }
}

impl PriceKey {
    /// A key no shape and load give (no word of a key has all 64 bits set: a code's shift is at
    /// most 63 < 0xff, and word 2's load part leaves bits 34..48 clear): an empty slot.
    pub(crate) const NONE: PriceKey = PriceKey([u64::MAX; 3]);

    /// The key's slot among `N` (a power of two) ([`slot_of`]).
    #[inline]
    pub(crate) fn slot<const N: usize>(&self) -> usize {
        slot_of::<N>(&self.0)
    }

    #[cfg(test)]
    fn new(s: &BatchShape, group_tokens: u64, bucket: u32, comm: MoeCommUsed) -> Self {
        Self::with_load(s, StepLoad::from_bucket(group_tokens, bucket, comm))
    }

    #[inline]
    pub(crate) fn with_load(s: &BatchShape, load: StepLoad) -> Self {
        Self::from_words(
            word(
                s.prefill_seqs as u64,
                s.prefill_tokens,
                s.prefill_pairs,
                s.prefill_pairs_capped,
            ),
            word(
                s.decode_seqs as u64,
                s.decode_tokens,
                s.decode_pairs,
                s.decode_pairs_capped,
            ),
            code(s.prefill_cached),
            load,
        )
    }

    /// The key of a shape's prompt and decode words and its cached prompt tokens' code, under
    /// `load`. Word 2: the step's load (group tokens, imbalance bucket, comm mode) and the
    /// cached prompt tokens.
    #[inline(always)]
    fn from_words(prompt: u64, decode: u64, cached: u16, load: StepLoad) -> Self {
        PriceKey([prompt, decode, load.0 | (cached as u64) << 48])
    }

    /// The key of the shape alone: the load's bits cleared (what fixes a step's batch part).
    pub(crate) fn batch(&self) -> PriceKey {
        PriceKey([self.0[0], self.0[1], self.0[2] & !((1 << 48) - 1)])
    }

    fn field(&self, i: usize) -> u64 {
        decode((self.0[i / 4] >> (16 * (i % 4))) as u16)
    }

    /// The quantized shape and the step load (group tokens, imbalance, MoE communication) the
    /// key stands for.
    pub(crate) fn shape(&self) -> (BatchShape, MoeLoad) {
        let shape = BatchShape {
            prefill_seqs: self.field(0) as u32,
            prefill_tokens: self.field(1),
            prefill_pairs: self.field(2),
            prefill_pairs_capped: self.field(3),
            prefill_cached: decode((self.0[2] >> 48) as u16),
            decode_seqs: self.field(4) as u32,
            decode_tokens: self.field(5),
            decode_pairs: self.field(6),
            decode_pairs_capped: self.field(7),
        };
        let bucket = (self.0[2] >> 16) as u16 as u32;
        let comm = match (self.0[2] >> 32) as u16 {
            0 => MoeCommUsed::Mc2,
            1 => MoeCommUsed::AllToAll,
            _ => MoeCommUsed::AllGather,
        };
        let load = MoeLoad {
            group_tokens: self.field(8),
            imbalance: bucket as f64 / IMBALANCE_BUCKETS,
            comm,
        };
        (shape, load)
    }
}

/// The part of a price key every rank of a step shares: the EP group's tokens (quantized) and
/// the imbalance bucket, computed once per step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepLoad(u64);

impl StepLoad {
    /// The EP group computes `group_tokens` with the hottest routed die carrying `imbalance`
    /// times the mean (priced, like the shapes, at the quantized value: steps of 2%, so a
    /// drifting load revisits cached prices), its MoE layers communicating by `comm`.
    pub fn new(group_tokens: u64, imbalance: f64, comm: MoeCommUsed) -> Self {
        // The bucket is kept below 2^16: the hottest die's load is clamped to 1,310x the mean.
        let bucket = (imbalance * IMBALANCE_BUCKETS)
            .round()
            .clamp(IMBALANCE_BUCKETS, u16::MAX as f64) as u32;
        Self::from_bucket(group_tokens, bucket, comm)
    }

    fn from_bucket(group_tokens: u64, bucket: u32, comm: MoeCommUsed) -> Self {
        let comm = match comm {
            MoeCommUsed::Mc2 => 0u64,
            MoeCommUsed::AllToAll => 1,
            MoeCommUsed::AllGather => 2,
        };
        let bucket = bucket.min(u16::MAX as u32) as u64;
        StepLoad(code(group_tokens) as u64 | bucket << 16 | comm << 32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dstwin_core::batch::AttnCap;
    use proptest::prelude::any;

    #[test]
    fn price_keys_stand_for_the_quantized_shape() {
        let s = BatchShape {
            prefill_seqs: 3,
            prefill_tokens: 12_345,
            prefill_pairs: 987_654_321,
            prefill_pairs_capped: 0,
            prefill_cached: 70_000,
            decode_seqs: 65_535,
            decode_tokens: 1 << 24,
            decode_pairs: u64::MAX / 3,
            decode_pairs_capped: 129,
        };
        let k = PriceKey::new(&s, 4097, 73, MoeCommUsed::AllToAll);
        let (q, load) = k.shape();
        assert_eq!(load.comm, MoeCommUsed::AllToAll);
        assert_eq!(q.prefill_seqs as u64, quantize(3));
        assert_eq!(q.prefill_tokens, quantize(12_345));
        assert_eq!(q.prefill_pairs, quantize(987_654_321));
        assert_eq!(q.prefill_pairs_capped, 0);
        assert_eq!(q.prefill_cached, quantize(70_000));
        assert_eq!(q.decode_seqs as u64, quantize(65_535));
        assert_eq!(q.decode_tokens, 1 << 24);
        assert_eq!(q.decode_pairs, quantize(u64::MAX / 3));
        assert_eq!(q.decode_pairs_capped, quantize(129));
        assert_eq!(load.group_tokens, quantize(4097));
        assert_eq!(load.imbalance, 73.0 / IMBALANCE_BUCKETS);
        // Shapes that quantize alike share a key; others do not.
        assert_eq!(
            k,
            PriceKey::new(
                &BatchShape {
                    prefill_tokens: 12_346,
                    ..s
                },
                4096,
                73,
                MoeCommUsed::AllToAll
            )
        );
        assert_ne!(
            k,
            PriceKey::new(
                &BatchShape {
                    decode_seqs: 1,
                    ..s
                },
                4097,
                73,
                MoeCommUsed::AllToAll
            )
        );
        assert_ne!(k, PriceKey::new(&s, 4097, 74, MoeCommUsed::AllToAll));
        assert_ne!(k, PriceKey::new(&s, 4097, 73, MoeCommUsed::Mc2));
        // One code per quantized value, whichever value rounded to it.
        for v in 0..100_000u64 {
            assert_eq!(code(v), code(quantize(v)), "{v}");
        }
    }

    #[test]
    fn slots_are_in_range_and_no_key_is_the_empty_one() {
        let mut seen = [false; 64];
        for v in (0..2000u64).chain([u32::MAX as u64, u64::MAX]) {
            let s = BatchShape {
                prefill_seqs: v as u32,
                prefill_tokens: v,
                prefill_pairs: v.saturating_mul(v),
                prefill_pairs_capped: v,
                prefill_cached: v,
                decode_seqs: v as u32,
                decode_tokens: v,
                decode_pairs: v,
                decode_pairs_capped: v,
            };
            let k = PriceKey::new(&s, v, u32::MAX, MoeCommUsed::AllGather);
            assert_ne!(k, PriceKey::NONE, "{v}");
            seen[k.slot::<64>()] = true;
            assert!(PriceKey::new(&s, v, 50, MoeCommUsed::Mc2).slot::<256>() < 256);
        }
        // The hash spreads keys over every slot.
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn quantization_rounds_to_nearest_without_overflow() {
        // The former formula, (v + 2^(shift-1)) >> shift << shift, where it does not overflow.
        for v in (0..5000u64).chain([u32::MAX as u64, 1 << 40, (1 << 40) - 1, 3 << 50]) {
            let bits = 64 - v.leading_zeros();
            let want = if bits <= KEY_BITS {
                v
            } else {
                let sh = bits - KEY_BITS;
                ((v + (1 << (sh - 1))) >> sh) << sh
            };
            assert_eq!(quantize(v), want, "{v}");
        }
    }

    /// The code as it was first written, with a branch for the carry (the reference).
    fn code_with_branch(v: u64) -> u16 {
        let bits = 64 - v.leading_zeros();
        if bits <= KEY_BITS {
            v as u16
        } else {
            let shift = bits - KEY_BITS;
            let m = ((v >> (shift - 1)) + 1) >> 1;
            if m >> KEY_BITS == 1 {
                (((shift + 1) as u16) << 8) | (m >> 1) as u16
            } else {
                ((shift as u16) << 8) | m as u16
            }
        }
    }

    proptest::proptest! {
        /// The branch-free code is the first one at every magnitude.
        #[test]
        fn codes_are_the_reference_codes(x in proptest::num::u64::ANY, sh in 0u32..64) {
            let v = x >> sh;
            proptest::prop_assert_eq!(code(v), code_with_branch(v), "{}", v);
        }
    }

    proptest::proptest! {
        /// The last value of a code has that code, and the next value does not.
        #[test]
        fn last_of_is_the_last_value_of_its_code(x in proptest::num::u64::ANY, sh in 0u32..64) {
            let v = x >> sh;
            let c = code(v);
            let last = last_of(c);
            proptest::prop_assert!(last >= v);
            proptest::prop_assert_eq!(code(last), c);
            proptest::prop_assert!(last == u64::MAX || code(last + 1) != c);
        }

        /// A rank's keys read from its decode word are the keys its shapes give, whatever
        /// steps they come in: growing contexts, sequences joining and leaving, prompt chunks
        /// and capped pairs in between.
        #[test]
        fn decode_words_give_the_keys_of_their_shapes(
            steps in proptest::collection::vec(
                (0u32..70, 0u64..3, 0u64..5000, 0u64..3, 0u64..40, any::<bool>()), 1..80),
            bucket in 50u32..200,
        ) {
            let load = StepLoad::from_bucket(123_456, bucket, MoeCommUsed::AllToAll);
            let mut w = DecodeWord::default();
            let mut context = 1000u64;
            for (seqs, kind, grow, mtp, chunk, capped) in steps {
                context += grow;
                let t = 1 + mtp;
                let mut s = BatchShape::default();
                let capped_pairs = if capped { context } else { context * t };
                s.add_decode_sums(seqs as u64, seqs as u64 * t, context * t, capped_pairs);
                if kind == 2 {
                    s.add_prefill(chunk, 7, AttnCap(None));
                }
                proptest::prop_assert_eq!(w.key(&s, load), PriceKey::with_load(&s, load));
            }
        }
    }

    #[test]
    fn codes_are_the_reference_codes_at_each_carry() {
        // Every power of two and its neighbours: where the rounding carries into the shift.
        for b in 0..64 {
            let p = 1u64 << b;
            for v in [p - 1, p, p + 1, p.wrapping_sub(p >> 8), p | (p >> 1)] {
                assert_eq!(code(v), code_with_branch(v), "{v}");
            }
        }
        assert_eq!(code(u64::MAX), code_with_branch(u64::MAX));
    }

    #[test]
    fn quantization_keeps_seven_significant_bits() {
        assert_eq!(quantize(0), 0);
        assert_eq!(quantize(127), 127);
        assert_eq!(quantize(128), 128);
        for v in [1000u64, 4097, 123_456_789, u32::MAX as u64] {
            let q = quantize(v);
            assert!(
                ((q as f64 - v as f64) / v as f64).abs() < 1.0 / 128.0,
                "{v} -> {q}"
            );
        }
    }
}
