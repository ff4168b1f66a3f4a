//! Picking tokens from logits as a request's [`SamplingParams`] say: penalties, `min_tokens`,
//! greedy or temperature with top-k / top-p / min-p, and the verification of MTP draft tokens.
//!
//! Draws are counter-based: the uniform number behind the token at position `pos` of a request
//! is a hash of (the request's seed, `pos`, a salt). Whatever batch, chunking, preemption or
//! instance a request goes through, its token at a position is drawn from the same number, so
//! sampled output (not only greedy output) is reproducible across layouts; a request with a
//! `seed` draws the same numbers as any other request with that seed.
//!
//! Draft verification with a deterministic drafter (the MTP module proposes its argmax): the
//! token at a position is drawn from the target distribution with that position's number, and
//! the draft stands iff it is that token. That is speculative sampling's law (draft `d` kept
//! with probability `p(d)`; on rejection a token from `p` without `d`), and it makes the output
//! the same with MTP as without: at temperature 0 a draft stands iff it is the argmax.

use dstwin_core::device::SamplingParams;

/// Temperatures below this sample greedily (vLLM's threshold).
const GREEDY_BELOW: f64 = 1e-5;

/// What a token is picked from: one row of logits and the context that shapes it.
pub struct Context<'a> {
    /// Every token before the one being picked (prompt, then output).
    pub tokens: &'a [u32],
    /// Where the client's prompt ends in `tokens`.
    pub prompt_len: usize,
    /// End-of-sequence token ids.
    pub eos: &'a [u32],
}

/// splitmix64's finalizer.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The stream of a request's draws: its own seed, or the device's seed and the request id.
pub fn stream_key(p: &SamplingParams, device_seed: u64, req: u64) -> u64 {
    match p.seed {
        Some(s) => mix(s ^ 0x5eed_0000_0000_0001),
        None => mix(device_seed ^ mix(req.wrapping_add(0x9e37_79b9_7f4a_7c15))),
    }
}

/// A uniform number in [0, 1) for position `pos` and `salt` of a stream.
pub fn draw(key: u64, pos: usize, salt: u64) -> f64 {
    let z = mix(key ^ mix((pos as u64) << 8 | salt));
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// Applies penalties and `min_tokens` to `logits` in place.
fn shape(logits: &mut [f32], p: &SamplingParams, cx: &Context) {
    let output = &cx.tokens[cx.prompt_len.min(cx.tokens.len())..];
    if p.repetition_penalty != 1.0 {
        let r = p.repetition_penalty as f32;
        let mut seen = vec![false; logits.len()];
        for &t in cx.tokens {
            if let Some(s) = seen.get_mut(t as usize) {
                if !*s {
                    *s = true;
                    let l = &mut logits[t as usize];
                    *l = if *l > 0.0 { *l / r } else { *l * r };
                }
            }
        }
    }
    if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
        let mut count = vec![0u32; logits.len()];
        for &t in output {
            if let Some(c) = count.get_mut(t as usize) {
                *c += 1;
            }
        }
        for (l, &c) in logits.iter_mut().zip(&count) {
            if c > 0 {
                *l -= (p.frequency_penalty * c as f64 + p.presence_penalty) as f32;
            }
        }
    }
    if (output.len() as u64) < p.min_tokens as u64 {
        for &e in cx.eos {
            if let Some(l) = logits.get_mut(e as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// The target distribution after temperature, top-k, top-p and min-p: (token, probability)
/// pairs, most likely first, probabilities summing to 1.
fn distribution(logits: &[f32], p: &SamplingParams) -> Vec<(u32, f64)> {
    let t = p.temperature;
    let mut v: Vec<(u32, f64)> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_finite())
        .map(|(i, &l)| (i as u32, l as f64 / t))
        .collect();
    // Most likely first; ties by token id, so the order never depends on the sort.
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if p.top_k > 0 {
        v.truncate(p.top_k as usize);
    }
    let max = v.first().map_or(0.0, |x| x.1);
    let mut sum = 0.0;
    for x in v.iter_mut() {
        x.1 = (x.1 - max).exp();
        sum += x.1;
    }
    for x in v.iter_mut() {
        x.1 /= sum;
    }
    if p.min_p > 0.0 {
        let floor = p.min_p * v.first().map_or(0.0, |x| x.1);
        v.retain(|x| x.1 >= floor);
    }
    if p.top_p < 1.0 {
        let mut acc = 0.0;
        let mut keep = v.len();
        for (i, x) in v.iter().enumerate() {
            acc += x.1;
            if acc >= p.top_p {
                keep = i + 1;
                break;
            }
        }
        v.truncate(keep.max(1));
    }
    let sum: f64 = v.iter().map(|x| x.1).sum();
    for x in v.iter_mut() {
        x.1 /= sum;
    }
    v
}

/// Inverse-CDF pick from a distribution.
fn pick(dist: &[(u32, f64)], u: f64) -> u32 {
    let mut acc = 0.0;
    for x in dist {
        acc += x.1;
        if u < acc {
            return x.0;
        }
    }
    // Rounding left u above the last cumulative sum.
    dist.last().map_or(0, |x| x.0)
}

/// The token at position `pos` (the index it will have in the request's tokens), or whether
/// `draft` stands there: returns the token kept and whether it is the draft.
pub fn sample(
    logits: &[f32],
    p: &SamplingParams,
    cx: &Context,
    key: u64,
    pos: usize,
    draft: Option<u32>,
) -> (u32, bool) {
    let mut l = logits.to_vec();
    shape(&mut l, p, cx);
    if p.temperature < GREEDY_BELOW {
        let t = argmax(&l);
        return (t, draft == Some(t));
    }
    // One uniform number per position, whatever the draft: the kept token is the target's
    // sample, and the draft stands iff it is that token (kept with probability p(draft), and
    // on rejection the token follows p without the draft: speculative sampling's law). A
    // layout with MTP samples what a layout without it does.
    let t = pick(&distribution(&l, p), draw(key, pos, 0));
    (t, draft == Some(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cx<'a>(tokens: &'a [u32], eos: &'a [u32]) -> Context<'a> {
        Context {
            tokens,
            prompt_len: 1,
            eos,
        }
    }

    #[test]
    fn greedy_is_the_argmax_and_keeps_a_matching_draft() {
        let l = [0.1, 2.0, 1.9, -1.0];
        let g = SamplingParams::greedy();
        assert_eq!(sample(&l, &g, &cx(&[0], &[]), 1, 5, None), (1, false));
        assert_eq!(sample(&l, &g, &cx(&[0], &[]), 1, 5, Some(1)), (1, true));
        assert_eq!(sample(&l, &g, &cx(&[0], &[]), 1, 5, Some(2)), (1, false));
    }

    #[test]
    fn sampling_follows_the_distribution_and_its_cuts() {
        let l = [0.0f32, (2.0f32).ln(), (5.0f32).ln(), -30.0];
        let p = SamplingParams::default();
        let mut n = [0u32; 4];
        for pos in 0..40_000 {
            n[sample(&l, &p, &cx(&[0], &[]), 9, pos, None).0 as usize] += 1;
        }
        let f = |i: usize| n[i] as f64 / 40_000.0;
        assert!(
            (f(0) - 0.125).abs() < 0.01 && (f(2) - 0.625).abs() < 0.01,
            "{n:?}"
        );
        // top_k 1 is greedy; top_p 0.6 keeps the one token that reaches it.
        for cut in [
            SamplingParams {
                top_k: 1,
                ..p.clone()
            },
            SamplingParams {
                top_p: 0.6,
                ..p.clone()
            },
            SamplingParams {
                min_p: 0.5,
                ..p.clone()
            },
        ] {
            assert!((0..200).all(|pos| sample(&l, &cut, &cx(&[0], &[]), 9, pos, None).0 == 2));
        }
    }

    #[test]
    fn a_verified_draft_keeps_the_target_distribution() {
        // Whatever the draft, the kept token is distributed as the target.
        let l = [0.0f32, (3.0f32).ln(), 0.0];
        let p = SamplingParams::default();
        for draft in 0..3 {
            let mut n = [0u32; 3];
            for pos in 0..30_000 {
                n[sample(&l, &p, &cx(&[0], &[]), 4, pos, Some(draft)).0 as usize] += 1;
            }
            let f1 = n[1] as f64 / 30_000.0;
            assert!((f1 - 0.6).abs() < 0.015, "draft {draft}: {n:?}");
        }
    }

    #[test]
    fn penalties_and_min_tokens_shape_the_logits() {
        let eos = [3u32];
        let g = SamplingParams {
            min_tokens: 2,
            ..SamplingParams::greedy()
        };
        let l = [0.0f32, 1.0, 0.5, 5.0];
        // One output token so far (prompt [0]): EOS is held back.
        assert_eq!(sample(&l, &g, &cx(&[0, 1], &eos), 1, 2, None).0, 1);
        assert_eq!(sample(&l, &g, &cx(&[0, 1, 1], &eos), 1, 3, None).0, 3);
        // Token 1 already in the output twice: frequency penalty 0.4 moves the pick to 2.
        let f = SamplingParams {
            frequency_penalty: 0.4,
            ..SamplingParams::greedy()
        };
        assert_eq!(sample(&l[..3], &f, &cx(&[0, 1, 1], &[]), 1, 3, None).0, 2);
        // Repetition penalty divides a positive logit of a seen token.
        let r = SamplingParams {
            repetition_penalty: 3.0,
            ..SamplingParams::greedy()
        };
        assert_eq!(sample(&l[..3], &r, &cx(&[1], &[]), 1, 1, None).0, 2);
    }

    #[test]
    fn draws_depend_on_the_seed_and_position_only() {
        let a = SamplingParams {
            seed: Some(5),
            ..SamplingParams::default()
        };
        assert_eq!(stream_key(&a, 1, 10), stream_key(&a, 2, 11));
        let none = SamplingParams::default();
        assert_ne!(stream_key(&none, 1, 10), stream_key(&none, 1, 11));
        let k = stream_key(&a, 0, 0);
        assert_eq!(draw(k, 7, 0), draw(k, 7, 0));
        assert_ne!(draw(k, 7, 0), draw(k, 8, 0));
    }
}
