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

/// The kernel [`StepDraws::add_one_draft_until`] runs eight steps at a time with, detected at
/// run time: AVX-512 (F, DQ and POPCNT), else AVX2 (and POPCNT).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
enum Wide {
    Avx512,
    Avx2,
    None,
}

/// [`Wide`] here, detected once (five feature checks per window were half a percent of a long
/// decode's instructions).
#[inline]
fn wide() -> Wide {
    use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
    // 0: not detected yet; otherwise 1 + the kernel's index.
    static KERNEL: AtomicU8 = AtomicU8::new(0);
    const KERNELS: [Wide; 3] = [Wide::Avx512, Wide::Avx2, Wide::None];
    match KERNEL.load(Relaxed) {
        0 => {
            let w = detect_wide();
            let at = KERNELS.iter().position(|&k| k == w).expect("a listed kernel");
            KERNEL.store(1 + at as u8, Relaxed);
            w
        }
        k => KERNELS[k as usize - 1],
    }
}

#[cold]
fn detect_wide() -> Wide {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") && has!("avx512dq") && has!("popcnt") {
            return Wide::Avx512;
        }
        if has!("avx2") && has!("popcnt") {
            return Wide::Avx2;
        }
    }
    Wide::None
}

/// Whether [`StepDraws::add_one_draft_until`] runs eight steps at a time here (AVX-512, or
/// AVX2). Elsewhere it checks every step, which costs more than a scan in runs that cannot
/// reach a limit: a caller with such a scan should keep it.
#[inline]
pub fn wide_runs() -> bool {
    wide() != Wide::None
}

/// Whether the draw at stream position `s` accepts against `threshold` (0 or 1).
#[inline]
fn wy_accepts(s: u64, threshold: u64) -> u32 {
    u32::from(wy(s) < threshold)
}

/// Where a run of steady steps stops ([`StepDraws::add_one_draft_until`]): the tokens out at
/// its start, the most a step may start with, and the count no step may reach.
#[derive(Clone, Copy, Debug)]
pub struct RunLimits {
    pub o: u32,
    pub o_limit: u32,
    pub max_o: u32,
}

impl RunLimits {
    /// Whether a step starting with `o` tokens out and emitting `e` ends the run: it would
    /// start past `o_limit` or reach `max_o`.
    #[inline(always)]
    fn stops(&self, o: u32, e: u32) -> bool {
        o > self.o_limit || o + e >= self.max_o
    }
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
        wy_accepts(s, self.acc.thresholds[0])
    }

    /// A run of steps with one draft each, as a steady window scans them: from `o` tokens
    /// out, each step in turn (one per cell of `cells`) stops the run if it would start past
    /// `o_limit` tokens out or reach `max_o` (1 + the draft if accepted); otherwise its tokens
    /// are added to its cell. Returns the steps taken and the tokens out after them; the draws
    /// move past the steps taken. Eight steps at a time where the processor has AVX-512 or AVX2
    /// ([`wide_runs`]; a steady window's scan is a tenth of a long decode's simulation).
    pub fn add_one_draft_until(&mut self, cells: &mut [u32], run: RunLimits) -> (usize, u32) {
        let mut done = (0, run.o);
        #[cfg(target_arch = "x86_64")]
        if cells.len() >= 8 {
            let t = self.acc.thresholds[0];
            // SAFETY: the processor has the features each function is compiled for. The
            // position and the threshold go by value: the stores that just wrote them could
            // not be forwarded to one wide load of the struct.
            done = match wide() {
                Wide::Avx512 => unsafe { add_one_draft_avx512(self.at, t, cells, run) },
                Wide::Avx2 => unsafe { add_one_draft_avx2(self.at, t, cells, run) },
                Wide::None => done,
            };
            self.at = self.at.wrapping_add(WY_INC.wrapping_mul(done.0 as u64));
            if done.0 < cells.len() / 8 * 8 {
                return done;
            }
        }
        let (steps, o) =
            self.add_one_draft_scalar(&mut cells[done.0..], RunLimits { o: done.1, ..run });
        (done.0 + steps, o)
    }

    fn add_one_draft_scalar(&mut self, cells: &mut [u32], run: RunLimits) -> (usize, u32) {
        let mut o = run.o;
        for (i, c) in cells.iter_mut().enumerate() {
            let e = 1 + wy_accepts(self.at, self.acc.thresholds[0]);
            if run.stops(o, e) {
                return (i, o);
            }
            self.at = self.at.wrapping_add(WY_INC);
            *c += e;
            o += e;
        }
        (cells.len(), o)
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

/// Whether a chunk of eight single-draft steps starting with `o` tokens out may end the run:
/// its last step starts with at most `o + 14` tokens out and ends with at most `o + 16`.
#[inline(always)]
fn chunk_may_stop(o: u32, run: &RunLimits) -> bool {
    o as u64 + 14 > run.o_limit as u64 || o as u64 + 16 >= run.max_o as u64
}

/// A chunk that may end the run ([`chunk_may_stop`]), step by step from its acceptance bits
/// (bit j: step j accepts its draft): adds each step's tokens to its cell and to `o` until a
/// step would end the run; returns that step's index in the chunk.
#[inline(always)]
fn chunk_by_step(chunk: &mut [u32], accepted: u32, o: &mut u32, run: &RunLimits) -> Option<usize> {
    for (j, c) in chunk.iter_mut().enumerate() {
        let e = 1 + (accepted >> j & 1);
        if run.stops(*o, e) {
            return Some(j);
        }
        *c += e;
        *o += e;
    }
    None
}

/// [`add_one_draft_avx512`] with AVX2: four steps to a vector, two vectors to a chunk, and the
/// low word of wyrand's product from the partial products too (AVX2 has no 64-bit multiply).
/// The same bits as the scalar `wy`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn add_one_draft_avx2(
    at: u64,
    threshold: u64,
    cells: &mut [u32],
    run: RunLimits,
) -> (usize, u32) {
    use std::arch::x86_64::*;
    /// `vpmuludq` as an instruction the compiler cannot see through (see
    /// [`add_one_draft_avx512`]).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn mul_epu32(a: __m256i, b: __m256i) -> __m256i {
        let r: __m256i;
        // SAFETY: an arithmetic instruction on registers (the caller has AVX2).
        unsafe {
            std::arch::asm!(
                "vpmuludq {r}, {a}, {b}",
                r = lateout(ymm_reg) r,
                a = in(ymm_reg) a,
                b = in(ymm_reg) b,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        r
    }
    let out = _mm256_set1_epi64x(WY_OUT as i64);
    let low32 = _mm256_set1_epi64x(0xffff_ffff);
    // Unsigned x < threshold as a signed compare, both with the top bit flipped.
    let sign = _mm256_set1_epi64x(i64::MIN);
    let flipped = _mm256_set1_epi64x((threshold ^ 1 << 63) as i64);
    // All-ones in the 64-bit lanes of four steps at positions `s` whose draft is accepted.
    let accepts = |s: __m256i| {
        let b = _mm256_xor_si256(s, out);
        let (s_hi, b_hi) = (_mm256_srli_epi64::<32>(s), _mm256_srli_epi64::<32>(b));
        let (ll, lh) = (mul_epu32(s, b), mul_epu32(s, b_hi));
        let (hl, hh) = (mul_epu32(s_hi, b), mul_epu32(s_hi, b_hi));
        // Schoolbook: t and u cannot overflow (a 32 x 32-bit product plus a 32-bit number).
        let t = _mm256_add_epi64(lh, _mm256_srli_epi64::<32>(ll));
        let u = _mm256_add_epi64(hl, _mm256_and_si256(t, low32));
        let hi = _mm256_add_epi64(
            _mm256_add_epi64(hh, _mm256_srli_epi64::<32>(t)),
            _mm256_srli_epi64::<32>(u),
        );
        let lo = _mm256_or_si256(_mm256_slli_epi64::<32>(u), _mm256_and_si256(ll, low32));
        let x = _mm256_xor_si256(_mm256_xor_si256(lo, hi), sign);
        _mm256_cmpgt_epi64(flipped, x)
    };
    let lanes: [u64; 8] = std::array::from_fn(|j| WY_INC.wrapping_mul(j as u64));
    let at4 = _mm256_set1_epi64x(at as i64);
    // SAFETY: `lanes` holds eight u64s; unaligned loads.
    let (mut s0, mut s1) = unsafe {
        (
            _mm256_add_epi64(at4, _mm256_loadu_si256(lanes.as_ptr().cast())),
            _mm256_add_epi64(at4, _mm256_loadu_si256(lanes[4..].as_ptr().cast())),
        )
    };
    let step8 = _mm256_set1_epi64x(WY_INC.wrapping_mul(8) as i64);
    // The low dword of each 64-bit lane, in the low half (the high half repeats it).
    let low_dwords = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    let one = _mm256_set1_epi32(1);
    let mut o = run.o;
    for (k, chunk) in cells.chunks_exact_mut(8).enumerate() {
        let (a0, a1) = (accepts(s0), accepts(s1));
        let accepted = (_mm256_movemask_pd(_mm256_castsi256_pd(a0))
            | _mm256_movemask_pd(_mm256_castsi256_pd(a1)) << 4) as u32;
        if chunk_may_stop(o, &run) {
            if let Some(j) = chunk_by_step(chunk, accepted, &mut o, &run) {
                return (8 * k + j, o);
            }
        } else {
            // 1 + accepted per step: 1 minus the all-ones (-1) lanes.
            let both = _mm256_blend_epi32::<0xf0>(
                _mm256_permutevar8x32_epi32(a0, low_dwords),
                _mm256_permutevar8x32_epi32(a1, low_dwords),
            );
            let tokens = _mm256_sub_epi32(one, both);
            let at = chunk.as_mut_ptr().cast::<__m256i>();
            // SAFETY: the chunk is eight u32s; unaligned loads and stores.
            unsafe { _mm256_storeu_si256(at, _mm256_add_epi32(_mm256_loadu_si256(at), tokens)) };
            o += 8 + accepted.count_ones();
        }
        s0 = _mm256_add_epi64(s0, step8);
        s1 = _mm256_add_epi64(s1, step8);
    }
    (cells.len() / 8 * 8, o)
}

/// [`StepDraws::add_one_draft_until`] over the whole chunks of eight cells of `cells`, from
/// stream position `at` against acceptance `threshold`: wyrand's 128-bit product from four
/// 32 x 32 -> 64-bit products per lane, the same bits as the scalar `wy`. A chunk whose
/// steps cannot reach a limit even accepting every draft is added at once; the chunk where
/// the run stops is settled step by step from its acceptance bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,popcnt")]
unsafe fn add_one_draft_avx512(
    at: u64,
    threshold: u64,
    cells: &mut [u32],
    run: RunLimits,
) -> (usize, u32) {
    use std::arch::x86_64::*;
    /// `vpmuludq` as an instruction the compiler cannot see through: written with the
    /// intrinsic, the four products are recognised as a 128-bit multiply and computed one
    /// lane at a time with scalar multiplies (slower than the scalar loop).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn mul_epu32(a: __m512i, b: __m512i) -> __m512i {
        let r: __m512i;
        // SAFETY: an arithmetic instruction on registers (the caller has AVX-512F).
        unsafe {
            std::arch::asm!(
                "vpmuludq {r}, {a}, {b}",
                r = lateout(zmm_reg) r,
                a = in(zmm_reg) a,
                b = in(zmm_reg) b,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        r
    }
    let lanes: [u64; 8] = std::array::from_fn(|j| WY_INC.wrapping_mul(j as u64));
    let mut s = _mm512_add_epi64(
        _mm512_set1_epi64(at as i64),
        _mm512_loadu_si512(lanes.as_ptr().cast()),
    );
    let step8 = _mm512_set1_epi64(WY_INC.wrapping_mul(8) as i64);
    let out = _mm512_set1_epi64(WY_OUT as i64);
    let low32 = _mm512_set1_epi64(0xffff_ffff);
    let thresholds = _mm512_set1_epi64(threshold as i64);
    let one = _mm256_set1_epi32(1);
    let mut o = run.o;
    for (k, chunk) in cells.chunks_exact_mut(8).enumerate() {
        let b = _mm512_xor_si512(s, out);
        let (s_hi, b_hi) = (_mm512_srli_epi64::<32>(s), _mm512_srli_epi64::<32>(b));
        let lo = _mm512_mullo_epi64(s, b);
        let (ll, lh) = (mul_epu32(s, b), mul_epu32(s, b_hi));
        let (hl, hh) = (mul_epu32(s_hi, b), mul_epu32(s_hi, b_hi));
        // The carry out of the low word: (ll >> 32) + low(lh) + low(hl), above bit 32.
        let mid = _mm512_add_epi64(
            _mm512_srli_epi64::<32>(ll),
            _mm512_add_epi64(_mm512_and_si512(lh, low32), _mm512_and_si512(hl, low32)),
        );
        let hi = _mm512_add_epi64(
            _mm512_add_epi64(hh, _mm512_srli_epi64::<32>(lh)),
            _mm512_add_epi64(_mm512_srli_epi64::<32>(hl), _mm512_srli_epi64::<32>(mid)),
        );
        let accepted = _mm512_cmplt_epu64_mask(_mm512_xor_si512(lo, hi), thresholds);
        if chunk_may_stop(o, &run) {
            if let Some(j) = chunk_by_step(chunk, u32::from(accepted), &mut o, &run) {
                return (8 * k + j, o);
            }
        } else {
            let tokens = _mm256_add_epi32(
                one,
                _mm256_and_si256(_mm512_cvtepi64_epi32(_mm512_movm_epi64(accepted)), one),
            );
            let at = chunk.as_mut_ptr().cast::<__m256i>();
            // SAFETY: the chunk is eight u32s; unaligned loads and stores.
            unsafe { _mm256_storeu_si256(at, _mm256_add_epi32(_mm256_loadu_si256(at), tokens)) };
            o += 8 + accepted.count_ones();
        }
        s = _mm512_add_epi64(s, step8);
    }
    (cells.len() / 8 * 8, o)
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

    /// A run of single-draft steps adds, cell by cell, what `next_one` draws step by step, and
    /// stops where the rule says (a step that would start past `o_limit` or reach `max_o`):
    /// as dispatched here, the portable eight-step kernel, and the scalar loop.
    #[test]
    fn a_run_of_one_draft_steps_adds_the_single_steps() {
        let reference = |d: &RequestDraws<'_>, step: u32, cells: &mut [u32], run: RunLimits| {
            let mut one = d.from_step(step);
            let mut o = run.o;
            for (i, c) in cells.iter_mut().enumerate() {
                let e = 1 + one.next_one();
                if o > run.o_limit || o + e >= run.max_o {
                    return (i, o);
                }
                *c += e;
                o += e;
            }
            (cells.len(), o)
        };
        let mut cases = 0;
        for probs in [&[0.7][..], &[0.0], &[1.0], &[]] {
            let a = Acceptance::new(probs, 13);
            for req in [0, 5, 99] {
                let d = a.request(req);
                for len in [0usize, 1, 7, 8, 9, 16, 63, 126] {
                    for (o, o_limit, max_o) in [
                        (10, 1000, 2000),
                        (10, 40, 2000),
                        (10, 1000, 30),
                        (5, 5, 7),
                        (9, 3, 50),
                    ] {
                        let run = RunLimits { o, o_limit, max_o };
                        let start: Vec<u32> = (0..len as u32).map(|i| i % 3).collect();
                        let mut want = start.clone();
                        let want_out = reference(&d, 40, &mut want, run);
                        let mut got = start.clone();
                        let mut draws = d.from_step(40);
                        assert_eq!(draws.add_one_draft_until(&mut got, run), want_out);
                        assert_eq!(got, want, "{probs:?} {req} {len} {o} {o_limit} {max_o}");
                        // The draws moved past the steps taken.
                        assert_eq!(draws.at, d.from_step(40 + want_out.0 as u32).at);
                        let mut scalar = start.clone();
                        let out = d.from_step(40).add_one_draft_scalar(&mut scalar, run);
                        assert_eq!((out, scalar), (want_out, want));
                        // Each eight-step kernel this processor has, over the whole chunks.
                        let whole = len / 8 * 8;
                        let mut want = start[..whole].to_vec();
                        let want_out = reference(&d, 40, &mut want, run);
                        let (at, t) = (d.from_step(40).at, a.thresholds[0]);
                        #[cfg(target_arch = "x86_64")]
                        for kernel in [Wide::Avx512, Wide::Avx2] {
                            let has = match kernel {
                                Wide::Avx512 => wide() == Wide::Avx512,
                                _ => wide() != Wide::None,
                            };
                            if !has || whole == 0 {
                                continue;
                            }
                            let mut got = start[..whole].to_vec();
                            // SAFETY: the processor has the kernel's features.
                            let out = unsafe {
                                match kernel {
                                    Wide::Avx512 => add_one_draft_avx512(at, t, &mut got, run),
                                    _ => add_one_draft_avx2(at, t, &mut got, run),
                                }
                            };
                            assert_eq!((out, &got), (want_out, &want), "{kernel:?}");
                        }
                        let _ = (at, t, want_out);
                        cases += 1;
                    }
                }
            }
        }
        assert_eq!(cases, 4 * 3 * 8 * 5);
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
