//! The f32 matmul of the routed experts: `rows x W^T` for a weight packed once, at load time,
//! into the layout the kernel reads, over input rows taken by reference (no gather copy).
//!
//! A weight `W [n, k]` (out, in) is stored as column panels of [`NR`] outputs, `[n / NR][k][NR]`
//! (the last panel zero-padded): one step of the kernel reads `NR` contiguous weights and
//! multiplies them by one value of each of up to [`MR`] rows, with the `MR x NR` sums in
//! registers. The reduction dimension is cut into blocks of [`KC`] so that a panel's block stays
//! in L1 while the row blocks pass over it.
//!
//! **Every output is one fused multiply-add chain over `k` in order**, `acc = a[k] * w[k] + acc`
//! from `acc = 0` (a block resumes from the sum the previous block stored). So a row's result
//! does not depend on which other rows share the call, on its position among them or on the
//! kernel that ran it: the AVX2 kernel and the portable one agree bit for bit (`f32::mul_add`
//! rounds once, as the FMA instruction does). Expert parallelism relies on this: a token's
//! expert output is the same whether its rows were computed alone, with the rest of its rank's
//! tokens or with other ranks' tokens.

/// Outputs per panel: two AVX2 registers.
pub const NR: usize = 16;
/// Rows per register tile: `MR x NR / 8` = 12 accumulator registers of the 16.
pub const MR: usize = 6;
/// Reduction block: a panel's `KC x NR` block is 16 KiB.
pub const KC: usize = 256;

/// A weight `[n, k]` packed into panels for [`PackedMatrix::matmul`].
#[derive(Clone, Debug, PartialEq)]
pub struct PackedMatrix {
    n: usize,
    k: usize,
    /// `[n.div_ceil(NR)][k][NR]`, zero beyond `n`.
    panels: Vec<f32>,
}

impl PackedMatrix {
    /// Packs a row-major `[n, k]` weight.
    pub fn pack(w: &[f32], n: usize, k: usize) -> PackedMatrix {
        assert_eq!(
            w.len(),
            n * k,
            "weight of {} values for [{n}, {k}]",
            w.len()
        );
        let mut panels = vec![0f32; n.div_ceil(NR) * k * NR];
        for (o, row) in w.chunks_exact(k.max(1)).enumerate().take(n) {
            let panel = &mut panels[(o / NR) * k * NR..][..k * NR];
            for (kk, &v) in row.iter().enumerate() {
                panel[kk * NR + o % NR] = v;
            }
        }
        PackedMatrix { n, k, panels }
    }

    /// The weight back as row-major `[n, k]`.
    pub fn unpack(&self) -> Vec<f32> {
        let (n, k) = (self.n, self.k);
        let mut w = vec![0f32; n * k];
        for (o, row) in w.chunks_exact_mut(k.max(1)).enumerate().take(n) {
            let panel = &self.panels[(o / NR) * k * NR..][..k * NR];
            for (kk, v) in row.iter_mut().enumerate() {
                *v = panel[kk * NR + o % NR];
            }
        }
        w
    }

    /// Output features (`n`).
    pub fn out_dim(&self) -> usize {
        self.n
    }

    /// Input features (`k`).
    pub fn in_dim(&self) -> usize {
        self.k
    }

    /// Bytes held (padding included).
    pub fn bytes(&self) -> usize {
        4 * self.panels.len()
    }

    /// `out[i] = rows[i] x W^T`: `rows` of `k` values each, `out` row-major `[rows.len(), n]`.
    pub fn matmul(&self, rows: &[&[f32]], out: &mut [f32]) {
        self.check(rows, out);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has the features `matmul_avx2` is compiled for.
            unsafe { matmul_avx2(self, rows, out) };
            return;
        }
        matmul_blocks::<Portable>(self, rows, out);
    }

    fn check(&self, rows: &[&[f32]], out: &[f32]) {
        assert_eq!(
            out.len(),
            rows.len() * self.n,
            "output for {} rows",
            rows.len()
        );
        for r in rows {
            assert_eq!(
                r.len(),
                self.k,
                "input row of {} values for k = {}",
                r.len(),
                self.k
            );
        }
    }
}

/// [`matmul_blocks`] with the AVX2 tile, compiled for AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn matmul_avx2(w: &PackedMatrix, rows: &[&[f32]], out: &mut [f32]) {
    matmul_blocks::<Avx2>(w, rows, out);
}

/// The blocked loop: reduction blocks, then panels, then row tiles of up to [`MR`] rows.
#[inline(always)]
fn matmul_blocks<T: Tile>(w: &PackedMatrix, rows: &[&[f32]], out: &mut [f32]) {
    let (n, k) = (w.n, w.k);
    if k == 0 {
        out.fill(0.0);
        return;
    }
    for k0 in (0..k).step_by(KC) {
        let kc = KC.min(k - k0);
        for p in 0..n.div_ceil(NR) {
            let b = Block {
                panel: &w.panels[(p * k + k0) * NR..][..kc * NR],
                k0,
                n,
                cols: NR.min(n - p * NR),
            };
            let mut i = 0;
            while i < rows.len() {
                let (tile, at) = (&rows[i..], &mut out[i * n + p * NR..]);
                let r = tile.len().min(MR);
                let sums = &mut tile_sums(&b, at, r);
                match r {
                    1 => T::tile::<1>(tile, &b, (&mut sums[..1]).try_into().expect("R")),
                    2 => T::tile::<2>(tile, &b, (&mut sums[..2]).try_into().expect("R")),
                    3 => T::tile::<3>(tile, &b, (&mut sums[..3]).try_into().expect("R")),
                    4 => T::tile::<4>(tile, &b, (&mut sums[..4]).try_into().expect("R")),
                    5 => T::tile::<5>(tile, &b, (&mut sums[..5]).try_into().expect("R")),
                    _ => T::tile::<MR>(tile, &b, sums),
                }
                for (row, s) in sums.iter().enumerate().take(r) {
                    at[row * n..][..b.cols].copy_from_slice(&s[..b.cols]);
                }
                i += r;
            }
        }
    }
}

/// One panel's reduction block: `panel` holds its steps `k0..k0 + kc` (`NR` weights each), its
/// `cols` valid outputs lie in output rows `n` apart.
struct Block<'a> {
    panel: &'a [f32],
    k0: usize,
    n: usize,
    cols: usize,
}

/// The sums so far of a tile's `rows` rows (zero before the first block), from `out` at the
/// tile's first output.
#[inline(always)]
fn tile_sums(b: &Block, out: &[f32], rows: usize) -> [[f32; NR]; MR] {
    let mut sums = [[0f32; NR]; MR];
    if b.k0 > 0 {
        for (row, s) in sums.iter_mut().enumerate().take(rows) {
            s[..b.cols].copy_from_slice(&out[row * b.n..][..b.cols]);
        }
    }
    sums
}

/// One `R x NR` register tile over a [`Block`]: runs each output's FMA chain on from `sums`
/// over the block's steps. `rows` holds at least `R` rows of `k` values.
trait Tile {
    fn tile<const R: usize>(rows: &[&[f32]], b: &Block, sums: &mut [[f32; NR]; R]);
}

/// The tile in plain Rust (`f32::mul_add` rounds once, as the FMA instruction does).
struct Portable;

impl Tile for Portable {
    #[inline(always)]
    fn tile<const R: usize>(rows: &[&[f32]], b: &Block, sums: &mut [[f32; NR]; R]) {
        let kc = b.panel.len() / NR;
        let a: [&[f32]; R] = std::array::from_fn(|r| &rows[r][b.k0..b.k0 + kc]);
        for (kk, w) in b.panel.chunks_exact(NR).enumerate() {
            let w: &[f32; NR] = w.try_into().expect("panel of NR-wide steps");
            for r in 0..R {
                let x = a[r][kk];
                for (s, &wv) in sums[r].iter_mut().zip(w) {
                    *s = x.mul_add(wv, *s);
                }
            }
        }
    }
}

/// The tile in AVX2 intrinsics: `2 * R` accumulator registers, per step two weight loads, `R`
/// broadcasts and `2 * R` FMAs (`_mm256_fmadd_ps(x, w, acc)`: `x * w + acc`, rounded once).
#[cfg(target_arch = "x86_64")]
struct Avx2;

#[cfg(target_arch = "x86_64")]
impl Tile for Avx2 {
    #[inline(always)]
    fn tile<const R: usize>(rows: &[&[f32]], b: &Block, sums: &mut [[f32; NR]; R]) {
        use std::arch::x86_64::*;
        let kc = b.panel.len() / NR;
        let a: [&[f32]; R] = std::array::from_fn(|r| &rows[r][b.k0..b.k0 + kc]);
        // SAFETY: this runs inside `matmul_avx2` (AVX2 and FMA present); the loads read
        // `sums[r]` (`NR` values), `b.panel[..kc * NR]` and `a[r][..kc]`, the stores write
        // `sums[r]`.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            for (acc, s) in acc.iter_mut().zip(sums.iter()) {
                *acc = [
                    _mm256_loadu_ps(s.as_ptr()),
                    _mm256_loadu_ps(s.as_ptr().add(8)),
                ];
            }
            let w = b.panel.as_ptr();
            for kk in 0..kc {
                let w0 = _mm256_loadu_ps(w.add(kk * NR));
                let w1 = _mm256_loadu_ps(w.add(kk * NR + 8));
                for r in 0..R {
                    let x = _mm256_broadcast_ss(&*a[r].as_ptr().add(kk));
                    acc[r][0] = _mm256_fmadd_ps(x, w0, acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(x, w1, acc[r][1]);
                }
            }
            for (acc, s) in acc.iter().zip(sums.iter_mut()) {
                _mm256_storeu_ps(s.as_mut_ptr(), acc[0]);
                _mm256_storeu_ps(s.as_mut_ptr().add(8), acc[1]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The definition: one `mul_add` chain per output, over `k` in order.
    fn reference(rows: &[&[f32]], w: &[f32], n: usize, k: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(rows.len() * n);
        for r in rows {
            for o in 0..n {
                let mut acc = 0f32;
                for kk in 0..k {
                    acc = r[kk].mul_add(w[o * k + kk], acc);
                }
                out.push(acc);
            }
        }
        out
    }

    /// Deterministic values in [-1, 1) with varied exponents, from a seed.
    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let v = (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                v * [1.0, 0.01, 30.0][(s % 3) as usize]
            })
            .collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    fn case(m: usize, n: usize, k: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
        (values(m * k, seed), values(n * k, seed ^ 0xabc))
    }

    #[test]
    fn packing_round_trips_with_padded_panels() {
        let w = values(17 * 5, 3);
        let p = PackedMatrix::pack(&w, 17, 5);
        assert_eq!(p.bytes(), 4 * 2 * NR * 5, "two panels, the second padded");
        assert_eq!(p.unpack(), w);
        assert_eq!((p.out_dim(), p.in_dim()), (17, 5));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever the shape (partial panels, row tails, several reduction blocks), both
        /// kernels give the reference's bits.
        #[test]
        fn both_kernels_equal_the_fma_chain_bit_for_bit(
            m in 0usize..20, n in 1usize..40, k in 1usize..(2 * KC + 40), seed in any::<u64>()
        ) {
            let (x, w) = case(m, n, k, seed);
            let rows: Vec<&[f32]> = x.chunks_exact(k).collect();
            let p = PackedMatrix::pack(&w, n, k);
            let want = bits(&reference(&rows, &w, n, k));
            let mut out = vec![f32::NAN; m * n];
            matmul_blocks::<Portable>(&p, &rows, &mut out);
            prop_assert_eq!(bits(&out), want.clone(), "portable kernel, seed {}", seed);
            let mut out = vec![f32::NAN; m * n];
            p.matmul(&rows, &mut out);
            prop_assert_eq!(bits(&out), want, "dispatched kernel, seed {}", seed);
        }

        /// A row's output is the same alone, in any batch and at any position in it.
        #[test]
        fn a_rows_output_does_not_depend_on_its_batch(
            m in 1usize..16, pick in any::<prop::sample::Index>(), rotate in 0usize..16,
            seed in any::<u64>()
        ) {
            let (n, k) = (48, KC + 7);
            let (x, w) = case(m, n, k, seed);
            let p = PackedMatrix::pack(&w, n, k);
            let mut rows: Vec<&[f32]> = x.chunks_exact(k).collect();
            let i = pick.index(m);
            let mut alone = vec![0f32; n];
            p.matmul(&rows[i..=i], &mut alone);
            rows.rotate_left(rotate % m);
            let at = (i + m - rotate % m) % m;
            let mut all = vec![0f32; m * n];
            p.matmul(&rows, &mut all);
            prop_assert_eq!(bits(&all[at * n..][..n]), bits(&alone), "seed {}", seed);
        }
    }

    #[test]
    fn no_rows_and_an_empty_reduction() {
        let p = PackedMatrix::pack(&[], 3, 0);
        let mut out = vec![1f32; 6];
        p.matmul(&[&[], &[]], &mut out);
        assert_eq!(out, vec![0.0; 6]);
        let p = PackedMatrix::pack(&values(12, 1), 3, 4);
        p.matmul(&[], &mut []);
    }

    #[test]
    #[should_panic(expected = "input row of 3 values for k = 4")]
    fn a_row_of_the_wrong_width_is_a_bug() {
        let p = PackedMatrix::pack(&values(8, 1), 2, 4);
        p.matmul(&[&[0.0; 3]], &mut [0.0; 2]);
    }
}
