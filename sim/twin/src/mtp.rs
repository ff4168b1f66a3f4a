//! MTP draft acceptance as the twin models it: a function of the request and of how many
//! sampling steps it has taken, not of the batch ([`dstwin_core::mtp::KnownAcceptance`]).
//!
//! Draft i is accepted with probability p_i given draft i-1 was (the last p repeats). The draws
//! are counter-based: the uniform 16-bit number for draft i of request r at its j-th sampling
//! step is field j mod 4 of a hash of (seed, r, j div 4, i), so one hash serves four steps.
//! Whatever batches the request lands in, it accepts the same drafts at the same step of its
//! life. That is what lets the scheduler advance a steadily decoding request many steps ahead
//! and land exactly where step-by-step execution would; indexing by step rather than by output
//! position keeps the draws of successive steps independent of each other's outcome, so that a
//! window's scan ([`KnownAcceptance::scan`]) pipelines, eight steps at a time on AVX2.

use dstwin_core::mtp::{KnownAcceptance, RunLimits};
use dstwin_core::req::ReqId;

/// Acceptance of each MTP draft given the previous one was accepted, the same at every position:
/// the default of a scenario's `mtp.acceptance`. Fitted by `dstwin calibrate` (relative least
/// squares) to the Ascend measurements of DeepSeek-R1 W8A8 in the calibration crate's
/// microbenchmarks: 1.7 tokens per step with one draft (CloudMatrix-Infer) and a mean accept
/// length of 2.59 and 2.88 with three drafts (SGLang on A3, two workloads). Errors: +2.5%, +4.5%,
/// -6.0%.
pub const CALIBRATED_ACCEPTANCE: f64 = 0.743;

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
    /// p_i as thresholds on a uniform 16-bit draw, 0 to 65,536 (p_i to the nearest 2^-16):
    /// one integer compare per draw.
    thresholds: [u32; MAX_POSITIONS],
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

/// Draws per hash: a step's draw is one 16-bit field of a wyrand output.
const FIELDS: u64 = 4;
/// A draw's range: thresholds are counts of the 2^16 values.
const DRAW_RANGE: u32 = 1 << 16;

/// The uniform 16-bit draw at sampling step `step` of the stream from `key`: field `step mod 4`
/// of wyrand's output at position `step div 4 + 1`.
#[inline]
fn draw(key: u64, step: u64) -> u32 {
    let group = step / FIELDS;
    let h = wy(key.wrapping_add((group + 1).wrapping_mul(WY_INC)));
    (h >> (16 * (step % FIELDS))) as u32 & 0xffff
}

/// Whether [`StepDraws::add_one_draft_until`] runs eight steps at a time here (AVX2 and
/// POPCNT, detected once). Elsewhere it checks every step, which costs more than a scan in
/// runs that cannot reach a limit: a caller with such a scan should keep it.
#[inline]
pub fn wide_runs() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
    // 0: not detected yet, 1: no, 2: yes (the feature checks per window were half a percent
    // of a long decode's instructions).
    static WIDE: AtomicU8 = AtomicU8::new(0);
    match WIDE.load(Relaxed) {
        0 => {
            let wide = detect_wide();
            WIDE.store(1 + u8::from(wide), Relaxed);
            wide
        }
        w => w == 2,
    }
}

#[cold]
fn detect_wide() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("popcnt")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

impl Acceptance {
    /// `probs[i]`: probability that draft i is accepted given draft i-1 was; values are clamped to
    /// [0, 1]; positions past [`MAX_POSITIONS`] (and past the list) repeat the last value. An
    /// empty list accepts nothing.
    pub fn new(probs: &[f64], seed: u64) -> Self {
        let mut thresholds = [0u32; MAX_POSITIONS];
        for (t, p) in thresholds.iter_mut().zip(probs) {
            // NaN accepts nothing.
            let p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) };
            *t = (p * DRAW_RANGE as f64).round() as u32;
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

impl KnownAcceptance for Acceptance {
    fn accepted(&self, req: ReqId, step: u32, drafts: u32) -> u32 {
        Acceptance::accepted(self, req, step, drafts)
    }

    /// One draft where the processor has AVX2: eight steps at a time
    /// ([`StepDraws::add_one_draft_until`]). Otherwise a step at a time, the steps that cannot
    /// reach a limit even emitting `1 + drafts` each without checks, in runs.
    fn scan(
        &self,
        req: ReqId,
        step: u32,
        drafts: u32,
        cells: &mut [u32],
        run: RunLimits,
    ) -> (usize, u32) {
        let mut draws = self.request(req).from_step(step);
        match drafts {
            1 if wide_runs() => draws.add_one_draft_until(cells, run),
            1 => scan_steps(cells, run, 2, || 1 + draws.next_one()),
            k => scan_steps(cells, run, 1 + k, || 1 + draws.next(k)),
        }
    }
}

/// [`KnownAcceptance::scan`] a step at a time, each step's tokens from `emit` (at most `most`).
/// Steps that cannot reach a limit even emitting `most` each run without checks, in runs.
#[inline]
fn scan_steps(
    cells: &mut [u32],
    run: RunLimits,
    most: u32,
    mut emit: impl FnMut() -> u32,
) -> (usize, u32) {
    let (mut i, mut o) = (0, run.o);
    let most = most as u64;
    loop {
        let o64 = o as u64;
        // Steps i..i + n all start within o_limit and end below max_o.
        let by_limit = (run.o_limit as u64 + 1).saturating_sub(o64).div_ceil(most);
        let by_finish = (run.max_o as u64).saturating_sub(o64 + 1) / most;
        let n = ((cells.len() - i) as u64).min(by_limit).min(by_finish) as usize;
        if n == 0 {
            if i >= cells.len() || o > run.o_limit {
                return (i, o);
            }
            let e = emit();
            if o + e >= run.max_o {
                return (i, o);
            }
            cells[i] += e;
            o += e;
            i += 1;
            continue;
        }
        for c in &mut cells[i..i + n] {
            let e = emit();
            *c += e;
            o += e;
        }
        i += n;
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
            key: self.key,
            step: step as u64,
        }
    }
}

/// One request's draws from a sampling step on ([`RequestDraws::from_step`]).
#[derive(Clone, Copy, Debug)]
pub struct StepDraws<'a> {
    acc: &'a Acceptance,
    /// The request's stream key (draft i's stream is offset by i strides).
    key: u64,
    /// The current sampling step (64 bits: a run's kernel counts on past 2^32 as the scalar
    /// draws do).
    step: u64,
}

impl StepDraws<'_> {
    /// [`StepDraws::next`] with one draft.
    #[inline]
    pub fn next_one(&mut self) -> u32 {
        let a = self.one_draft();
        self.step += 1;
        a
    }

    /// Whether the current step accepts a single draft (1 or 0), without moving on.
    #[inline]
    fn one_draft(&self) -> u32 {
        // An empty list's threshold is 0: nothing is accepted.
        u32::from(draw(self.key, self.step) < self.acc.thresholds[0])
    }

    /// A run of steps with one draft each, as a steady window scans them: from `o` tokens
    /// out, each step in turn (one per cell of `cells`) stops the run if it would start past
    /// `o_limit` tokens out or reach `max_o` (1 + the draft if accepted); otherwise its tokens
    /// are added to its cell. Returns the steps taken and the tokens out after them; the draws
    /// move past the steps taken. Eight steps at a time where the processor has AVX2
    /// ([`wide_runs`]; a steady window's scan is a tenth of a long decode's simulation).
    pub fn add_one_draft_until(&mut self, cells: &mut [u32], run: RunLimits) -> (usize, u32) {
        #[cfg(target_arch = "x86_64")]
        let done = if cells.len() >= 8 && wide_runs() {
            let t = self.acc.thresholds[0];
            // SAFETY: the processor has the features the function is compiled for. The key,
            // step and threshold go by value: the stores that just wrote them could not be
            // forwarded to one wide load of the struct.
            let done = unsafe { add_one_draft_avx2(self.key, self.step, t, cells, run) };
            self.step += done.0 as u64;
            if done.0 < cells.len() / 8 * 8 {
                return done;
            }
            done
        } else {
            (0, run.o)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let done = (0, run.o);
        let (steps, o) =
            self.add_one_draft_scalar(&mut cells[done.0..], RunLimits { o: done.1, ..run });
        (done.0 + steps, o)
    }

    fn add_one_draft_scalar(&mut self, cells: &mut [u32], run: RunLimits) -> (usize, u32) {
        let mut o = run.o;
        for (i, c) in cells.iter_mut().enumerate() {
            let e = 1 + self.one_draft();
            if run.stops(o, e) {
                return (i, o);
            }
            self.step += 1;
            *c += e;
            o += e;
        }
        (cells.len(), o)
    }

    /// Drafts accepted out of `drafts` at the current step; moves to the next step.
    #[inline]
    pub fn next(&mut self, drafts: u32) -> u32 {
        let a = self.acc;
        let step = self.step;
        self.step += 1;
        if a.len == 0 {
            return 0;
        }
        let mut key = self.key;
        let mut n = 0;
        let mut alive = 1;
        for i in 0..drafts {
            let t = a.thresholds[(i as usize).min(a.len - 1)];
            alive &= u32::from(draw(key, step) < t);
            n += alive;
            key = key.wrapping_add(DRAFT_STRIDE);
        }
        n
    }
}

/// The fewest tokens out a chunk of eight single-draft steps may start with and end the run:
/// its last step starts with at most `o + 14` tokens out and ends with at most `o + 16`, so it
/// may stop where `o + 14 > o_limit` or `o + 16 >= max_o`.
#[inline(always)]
fn chunk_stop_bound(run: &RunLimits) -> i64 {
    (run.o_limit as i64 - 13).min(run.max_o as i64 - 16)
}

/// A chunk that may end the run ([`chunk_stop_bound`]), step by step from its acceptance bits
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

/// [`StepDraws::add_one_draft_until`] over the whole chunks of eight cells of `cells`, for the
/// stream from `key` from sampling step `step` against acceptance `threshold`: four wyrand
/// outputs to a vector (sixteen steps' draws), their 128-bit products from four 32 x 32 ->
/// 64-bit products per lane (AVX2 has no 64-bit multiply), the same bits as the scalar `wy`. A
/// chunk whose steps cannot reach a limit even accepting every draft is added at once; the
/// chunk where the run stops is settled step by step from its acceptance bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn add_one_draft_avx2(
    key: u64,
    step: u64,
    threshold: u32,
    cells: &mut [u32],
    run: RunLimits,
) -> (usize, u32) {
    use std::arch::x86_64::*;
    /// `vpmuludq` as an instruction the compiler cannot see through: written with the
    /// intrinsic, the four products are recognised as a 128-bit multiply and computed one lane
    /// at a time with scalar multiplies (slower than the scalar loop).
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
    // Unsigned 16-bit x < threshold as a signed compare, both with the top bit flipped. A
    // threshold of 0 or 2^16 accepts nothing or everything: no draw is needed.
    let flip = _mm256_set1_epi16(i16::MIN);
    let flipped = _mm256_set1_epi16((threshold as u16 ^ 0x8000) as i16);
    let constant = match threshold {
        0 => Some(0),
        DRAW_RANGE.. => Some(0xffff),
        _ => None,
    };
    // The acceptance bits of the sixteen steps whose draws are the four outputs at stream
    // positions `s`, in step order.
    let bits16 = |s: __m256i| {
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
        let x = _mm256_xor_si256(_mm256_xor_si256(lo, hi), flip);
        // 16-bit fields in step order; each 128-bit half packs its eight compares into its
        // low eight bytes.
        let accepted = _mm256_cmpgt_epi16(flipped, x);
        let packed = _mm256_packs_epi16(accepted, _mm256_setzero_si256());
        let m = _mm256_movemask_epi8(packed) as u32;
        m & 0xff | m >> 8 & 0xff00
    };
    let inc = |n: u64| WY_INC.wrapping_mul(n);
    let group = step / FIELDS;
    let mut s = _mm256_add_epi64(
        _mm256_set1_epi64x(key.wrapping_add(inc(group + 1)) as i64),
        _mm256_setr_epi64x(0, inc(1) as i64, inc(2) as i64, inc(3) as i64),
    );
    let step16 = _mm256_set1_epi64x(inc(4) as i64);
    let mut next16 = || {
        let bits = constant.unwrap_or_else(|| bits16(s));
        s = _mm256_add_epi64(s, step16);
        bits as u64
    };
    // Acceptance bits not yet used, from the next step on.
    let skip = step % FIELDS;
    let mut buffer = next16() >> skip;
    let mut buffered = 16 - skip;
    let pow2 = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    let one = _mm256_set1_epi32(1);
    let mut o = run.o;
    let bound = chunk_stop_bound(&run);
    for (k, chunk) in cells.chunks_exact_mut(8).enumerate() {
        if buffered < 8 {
            buffer |= next16() << buffered;
            buffered += 16;
        }
        let accepted = (buffer & 0xff) as u32;
        buffer >>= 8;
        buffered -= 8;
        if o as i64 >= bound {
            if let Some(j) = chunk_by_step(chunk, accepted, &mut o, &run) {
                return (8 * k + j, o);
            }
        } else {
            // 1 + accepted per step: 1 minus the all-ones (-1) lanes of the set bits.
            let bits = _mm256_and_si256(_mm256_set1_epi32(accepted as i32), pow2);
            let tokens = _mm256_sub_epi32(one, _mm256_cmpeq_epi32(bits, pow2));
            let at = chunk.as_mut_ptr().cast::<__m256i>();
            // SAFETY: the chunk is eight u32s; unaligned loads and stores.
            unsafe { _mm256_storeu_si256(at, _mm256_add_epi32(_mm256_loadu_si256(at), tokens)) };
            o += 8 + accepted.count_ones();
        }
    }
    (cells.len() / 8 * 8, o)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PINNED_SUM: u64 = 38_947;

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
    fn the_four_draws_of_one_hash_are_independent() {
        // P(all four steps of a hash accept) = p^4, and P(steps 3 and 4 accept) = p^2 across
        // two hashes, over many requests.
        let a = Acceptance::new(&[0.6], 21);
        let (mut four, mut across, mut n) = (0u32, 0u32, 0u32);
        for r in 0..5_000u64 {
            let d = a.request(r);
            for g in 0..20 {
                let j = 4 * g;
                four += (j..j + 4).map(|s| d.accepted(s, 1)).product::<u32>();
                across += d.accepted(j + 3, 1) * d.accepted(j + 4, 1);
                n += 1;
            }
        }
        let (four, across) = (four as f64 / n as f64, across as f64 / n as f64);
        assert!((four - 0.6f64.powi(4)).abs() < 0.01, "P(four) {four}");
        assert!((across - 0.36).abs() < 0.01, "P(across) {across}");
        // A probability is kept to the nearest 2^-16.
        assert_eq!(a.thresholds[0], 39_322);
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

    /// The model's window scan, whichever path it takes (eight steps at a time, runs of
    /// unchecked steps, one to three drafts), equals stepping through [`Acceptance::accepted`]
    /// as the contract's default scan does.
    #[test]
    fn the_window_scan_is_the_contracts_step_by_step_scan() {
        let mut cases = 0;
        for probs in [&[0.7][..], &[0.8, 0.5], &[0.0], &[1.0], &[]] {
            let a = Acceptance::new(probs, 17);
            for (req, from, drafts) in [(0, 40, 1), (7, 41, 2), (99, 43, 3), (3, 9_000, 1)] {
                for len in [0usize, 1, 7, 8, 9, 63, 126] {
                    for (o, o_limit, max_o) in [(10, 1000, 2000), (10, 40, 2000), (10, 1000, 30)] {
                        let run = RunLimits { o, o_limit, max_o };
                        let start: Vec<u32> = (0..len as u32).map(|i| i % 3).collect();
                        let (mut want, mut out) = (start.clone(), (len, o));
                        let mut at = o;
                        for (i, c) in want.iter_mut().enumerate() {
                            let e = 1 + a.accepted(req, from + i as u32, drafts);
                            if run.stops(at, e) {
                                out = (i, at);
                                break;
                            }
                            *c += e;
                            at += e;
                        }
                        if out.0 == len {
                            out.1 = at;
                        }
                        let mut got = start;
                        let scanned = KnownAcceptance::scan(&a, req, from, drafts, &mut got, run);
                        assert_eq!(
                            (scanned, got),
                            (out, want),
                            "{probs:?} {req} {drafts} {len}"
                        );
                        cases += 1;
                    }
                }
            }
        }
        assert_eq!(cases, 5 * 4 * 7 * 3);
    }

    /// A run of single-draft steps adds, cell by cell, what `next_one` draws step by step, and
    /// stops where the rule says (a step that would start past `o_limit` or reach `max_o`):
    /// as dispatched here, the AVX2 kernel where the processor has it, and the scalar loop.
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
                // Every alignment of the first step in its hash's four, and a run past step
                // 2^32 (the kernel and the single steps count on alike).
                for from in [40, 41, 42, 43, u32::MAX - 5] {
                    for len in [0usize, 1, 7, 8, 9, 16, 63, 126] {
                        for (o, o_limit, max_o) in [
                            (10, 1000, 2000),
                            (10, 40, 2000),
                            (10, 1000, 30),
                            (5, 5, 7),
                            (9, 3, 50),
                        ] {
                            let run = RunLimits { o, o_limit, max_o };
                            let case =
                                format!("{probs:?} {req} {from} {len} {o} {o_limit} {max_o}");
                            let start: Vec<u32> = (0..len as u32).map(|i| i % 3).collect();
                            let mut want = start.clone();
                            let want_out = reference(&d, from, &mut want, run);
                            let mut got = start.clone();
                            let mut draws = d.from_step(from);
                            assert_eq!(draws.add_one_draft_until(&mut got, run), want_out);
                            assert_eq!(got, want, "{case}");
                            // The draws moved past the steps taken.
                            assert_eq!(draws.step, from as u64 + want_out.0 as u64);
                            let mut scalar = start.clone();
                            let out = d.from_step(from).add_one_draft_scalar(&mut scalar, run);
                            assert_eq!((out, scalar), (want_out, want), "{case}");
                            // The AVX2 kernel over the whole chunks, where the processor has it.
                            #[cfg(target_arch = "x86_64")]
                            if wide_runs() {
                                let whole = len / 8 * 8;
                                let mut want = start[..whole].to_vec();
                                let want_out = reference(&d, from, &mut want, run);
                                let mut got = start[..whole].to_vec();
                                let t = a.thresholds[0];
                                // SAFETY: the processor has the kernel's features.
                                let out = unsafe {
                                    add_one_draft_avx2(d.key, from as u64, t, &mut got, run)
                                };
                                assert_eq!((out, got), (want_out, want), "AVX2 {case}");
                            }
                            cases += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(cases, 4 * 3 * 5 * 8 * 5);
    }

    #[test]
    fn draws_are_pinned() {
        // The draws decide every simulated request's tokens: a change here changes every
        // report. The sum over a fixed grid, recorded when each hash was made to give four
        // steps' 16-bit draws.
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
