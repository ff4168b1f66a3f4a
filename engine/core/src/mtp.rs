//! MTP draft acceptance as the twin models it: a function of the request and of how many
//! sampling steps it has taken, not of the batch.
//!
//! Draft i is accepted with probability p_i given draft i-1 was (the last p repeats). The draws
//! are counter-based: the uniform number for draft i of request r at its j-th sampling step is a
//! hash of (seed, r, j, i). Whatever batches the request lands in, it accepts the same drafts at
//! the same step of its life. That is what lets the scheduler advance a steadily decoding request
//! many steps ahead and land exactly where step-by-step execution would (see `instance::rank`);
//! indexing by step rather than by output position keeps the draws of successive steps
//! independent of each other's outcome, so that scan pipelines.

use crate::device::ReqId;

/// Acceptance of each MTP draft given the previous one was accepted, the same at every position:
/// the default of a scenario's `mtp.acceptance`. Fitted by `dstwin calibrate` (relative least
/// squares) to the Ascend measurements of DeepSeek-R1 W8A8 in the calibration crate's
/// microbenchmarks: 1.7 tokens per step with one draft (CloudMatrix-Infer) and a mean accept
/// length of 2.59 / 2.88 with three / four drafts (SGLang on A3). Errors: +1.0%, +0.4%, -0.6%.
pub const CALIBRATED_ACCEPTANCE: f64 = 0.717;

/// `given` per-draft acceptances, or the calibrated one when none are given.
pub fn or_calibrated(given: Vec<f64>) -> Vec<f64> {
    if given.is_empty() {
        vec![CALIBRATED_ACCEPTANCE]
    } else {
        given
    }
}

/// Most draft positions with their own probability (later drafts repeat the last one).
pub const MAX_POSITIONS: usize = 8;

/// Per-position acceptance with counter-based draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acceptance {
    seed: u64,
    /// p_i as thresholds on a uniform u64: one integer compare per draw.
    thresholds: [u64; MAX_POSITIONS],
    len: usize,
}

/// One request's draws (the request part of the hash computed once).
#[derive(Clone, Copy, Debug)]
pub struct RequestDraws<'a> {
    acc: &'a Acceptance,
    key: u64,
}

/// splitmix64's finalizer: a bijective mix with full avalanche (for keys).
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// wyrand's constants: the stream increment and the output mask.
const WY_INC: u64 = 0xa076_1d64_78bd_642f;
const WY_OUT: u64 = 0xe703_7ed1_a0b4_28db;
/// Offset between the streams of successive draft positions.
const DRAFT_STRIDE: u64 = 0x8ebc_6af0_9c88_c6e3;

/// wyrand's output function on state `s`: one 64x64->128 multiply, folded.
#[inline]
fn wy(s: u64) -> u64 {
    let r = (s as u128) * ((s ^ WY_OUT) as u128);
    (r as u64) ^ ((r >> 64) as u64)
}

impl Acceptance {
    /// `probs[i]`: probability that draft i is accepted given draft i-1 was; values are clamped to
    /// [0, 1]; positions past [`MAX_POSITIONS`] (and past the list) repeat the last value. An
    /// empty list accepts nothing.
    pub fn new(probs: &[f64], seed: u64) -> Self {
        let mut thresholds = [0u64; MAX_POSITIONS];
        for (t, p) in thresholds.iter_mut().zip(probs) {
            *t = if *p >= 1.0 {
                u64::MAX
            } else {
                (p.max(0.0) * 2f64.powi(64)) as u64
            };
        }
        Acceptance {
            seed: mix(seed ^ 0x6a09_e667_f3bc_c908),
            thresholds,
            len: probs.len().min(MAX_POSITIONS),
        }
    }

    /// The draws of one request.
    #[inline]
    pub fn request(&self, req: ReqId) -> RequestDraws<'_> {
        RequestDraws {
            acc: self,
            key: mix(self.seed ^ req.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        }
    }

    /// Drafts accepted out of `drafts` by request `req` at its sampling step `step` (sampling
    /// steps it had taken before this one).
    pub fn accepted(&self, req: ReqId, step: u32, drafts: u32) -> u32 {
        self.request(req).accepted(step, drafts)
    }
}

impl<'a> RequestDraws<'a> {
    /// Drafts accepted out of `drafts` at sampling step `step`: the accepted prefix, counted
    /// without branches on the draws.
    #[inline]
    pub fn accepted(&self, step: u32, drafts: u32) -> u32 {
        self.from_step(step).next(drafts)
    }

    /// The draws of sampling steps `step`, `step + 1`, ... in turn: what a scan over a
    /// request's future steps reads, without recomputing each step's stream position.
    #[inline]
    pub fn from_step(&self, step: u32) -> StepDraws<'a> {
        StepDraws {
            acc: self.acc,
            // Draft i draws from its own wyrand stream, at index `step`: the draws of
            // successive steps are independent of each other, so a scan over steps pipelines.
            at: self
                .key
                .wrapping_add((step as u64 + 1).wrapping_mul(WY_INC)),
        }
    }
}

/// One request's draws from a sampling step on ([`RequestDraws::from_step`]).
#[derive(Clone, Copy, Debug)]
pub struct StepDraws<'a> {
    acc: &'a Acceptance,
    /// The stream position of draft 0 at the current step.
    at: u64,
}

impl StepDraws<'_> {
    /// [`StepDraws::next`] with one draft.
    #[inline]
    pub fn next_one(&mut self) -> u32 {
        let s = self.at;
        self.at = self.at.wrapping_add(WY_INC);
        // An empty list's threshold is 0: nothing is accepted.
        u32::from(wy(s) < self.acc.thresholds[0])
    }

    /// Drafts accepted out of `drafts` at the current step; moves to the next step.
    #[inline]
    pub fn next(&mut self, drafts: u32) -> u32 {
        let a = self.acc;
        let mut s = self.at;
        self.at = self.at.wrapping_add(WY_INC);
        if a.len == 0 {
            return 0;
        }
        let mut n = 0;
        let mut alive = 1;
        for i in 0..drafts {
            let t = a.thresholds[(i as usize).min(a.len - 1)];
            alive &= u32::from(wy(s) < t);
            n += alive;
            s = s.wrapping_add(DRAFT_STRIDE);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PINNED_SUM: u64 = 38_288;

    #[test]
    fn acceptance_matches_its_probability() {
        let a = Acceptance::new(&[0.7], 7);
        let n = 200_000u32;
        let acc: u32 = (0..n).map(|i| a.accepted(i as u64 % 97, i, 1)).sum();
        let rate = acc as f64 / n as f64;
        assert!((rate - 0.7).abs() < 0.01, "rate {rate}");
    }

    #[test]
    fn second_draft_is_conditional_on_the_first() {
        let a = Acceptance::new(&[0.8, 0.5], 7);
        let n = 200_000u32;
        let two = (0..n).filter(|&i| a.accepted(3, i, 2) == 2).count() as f64 / n as f64;
        assert!((two - 0.4).abs() < 0.01, "P(both) {two}");
        let one = (0..n).filter(|&i| a.accepted(3, i, 2) >= 1).count() as f64 / n as f64;
        assert!((one - 0.8).abs() < 0.01, "P(first) {one}");
    }

    #[test]
    fn draws_depend_on_request_step_and_seed_only() {
        let a = Acceptance::new(&[0.5], 1);
        let b = Acceptance::new(&[0.5], 1);
        let c = Acceptance::new(&[0.5], 2);
        let seq = |x: &Acceptance, r| (0..256).map(|o| x.accepted(r, o, 1)).collect::<Vec<_>>();
        assert_eq!(seq(&a, 5), seq(&b, 5));
        assert_ne!(seq(&a, 5), seq(&a, 6), "requests draw independently");
        assert_ne!(seq(&a, 5), seq(&c, 5), "seeds draw independently");
    }

    #[test]
    fn successive_steps_are_independent() {
        // P(accept at j and at j + 1) = p^2, over many requests.
        let a = Acceptance::new(&[0.6], 9);
        let (mut both, mut n) = (0u32, 0u32);
        for r in 0..2_000u64 {
            let d = a.request(r);
            for j in 0..100 {
                both += d.accepted(j, 1) * d.accepted(j + 1, 1);
                n += 1;
            }
        }
        let rate = both as f64 / n as f64;
        assert!((rate - 0.36).abs() < 0.01, "P(both) {rate}");
    }

    #[test]
    fn a_scan_reads_the_same_draws_as_single_steps() {
        for probs in [&[0.7][..], &[0.8, 0.5], &[0.9, 0.6, 0.3], &[]] {
            let a = Acceptance::new(probs, 5);
            for req in [0, 1, 77, u64::MAX] {
                let d = a.request(req);
                for drafts in 0..4 {
                    let mut scan = d.from_step(10);
                    for j in 10..300 {
                        assert_eq!(scan.next(drafts), d.accepted(j, drafts), "{probs:?} {j}");
                    }
                }
                let mut one = d.from_step(3);
                for j in 3..300 {
                    assert_eq!(one.next_one(), d.accepted(j, 1), "{probs:?} {j}");
                }
            }
        }
    }

    #[test]
    fn draws_are_pinned() {
        // The draws decide every simulated request's tokens: a change here changes every
        // report. The sum over a fixed grid, recorded when the draws were made step-indexed.
        let a = Acceptance::new(&[0.7, 0.4], 11);
        let sum: u64 = (0..50u64)
            .flat_map(|r| (0..200u32).map(move |j| (r, j)))
            .map(|(r, j)| a.accepted(r, j, 2) as u64 * (1 + (r ^ j as u64) % 7))
            .sum();
        assert_eq!(sum, PINNED_SUM);
    }

    #[test]
    fn edge_probabilities() {
        let never = Acceptance::new(&[0.0], 3);
        let always = Acceptance::new(&[1.0], 3);
        let none = Acceptance::new(&[], 3);
        for o in 0..1000 {
            assert_eq!(never.accepted(1, o, 3), 0);
            assert_eq!(always.accepted(1, o, 3), 3);
            assert_eq!(none.accepted(1, o, 3), 0);
            assert_eq!(always.accepted(1, o, 0), 0);
        }
    }
}
