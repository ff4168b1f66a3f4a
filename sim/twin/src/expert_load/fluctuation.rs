//! Per-batch fluctuation: how far one step's routing strays from the mean load a placement was
//! made for.
//!
//! Two sources, both sampling. Each request routes by its own expert preferences, drawn around
//! the layer's mean shares (a Dirichlet of concentration `c`: a die of mean share m gets a
//! Beta(c m, c (1 - m)) share of a request's routes), and each token picks its `top_k` experts
//! from its request's preferences (taken as draws with replacement). A die's share S of a
//! step's routes, for requests i of t_i tokens (T in all, weights w_i = t_i / T), then has
//!
//! - variance Σ w_i² Var(P) + E[P(1 - P)] / (k T): the requests' own preferences (tokens of one
//!   request share them) and the tokens' draws;
//! - third cumulant Σ w_i³ κ3(P) + 3 Cov(P, P(1 - P)) / (k n T) + E[P(1 - P)(1 - 2P)] / (k² T²)
//!   (n the effective number of requests, 1 / Σ w_i²), P the Beta share.
//!
//! A step of a few long prompts strays far from the mean (n small), a decode step of a few
//! sequences too (T small), a decode step of thousands of sequences does not. The hottest of D
//! dies sits at the Cornish-Fisher quantile of their skewed distribution at Blom's plotting
//! position, z + γ (z² - 1) / 6 standard deviations above the mean (z = E[max of D normals], γ
//! the skewness): within 5% of sampled routing from 2 to 4,096 requests and 16 to 320 dies
//! (the test below samples two of those cases).

use dstwin_core::batch::BatchShape;
use serde::Serialize;

/// What one step of an EP group routes: its requests and tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct StepRouting {
    /// (Σ t_i)² / Σ t_i² over the step's requests (t_i tokens each): the number of equal
    /// requests that would fluctuate as much.
    pub requests: f64,
    /// Tokens entering the MoE layers.
    pub tokens: f64,
    /// Σ (t_i / T)³: how far a few large requests skew the step's load.
    pub cube_share: f64,
}

/// The routing of a step from per-rank aggregates: within a rank, tokens of one kind (prefill
/// or decode) are taken as spread evenly over its requests.
pub fn step_routing<'a>(shapes: impl Iterator<Item = &'a BatchShape>) -> StepRouting {
    let mut sums = RoutingSums::default();
    for s in shapes {
        sums.add(s);
    }
    sums.routing()
}

/// [`step_routing`] a rank at a time (for a caller that passes over the ranks for other
/// sums too).
#[derive(Clone, Copy, Debug, Default)]
pub struct RoutingSums {
    t: f64,
    t2: f64,
    t3: f64,
}

impl RoutingSums {
    pub fn add(&mut self, s: &BatchShape) {
        for (tok, seqs) in [
            (s.prefill_tokens as f64, s.prefill_seqs as f64),
            (s.decode_tokens as f64, s.decode_seqs as f64),
        ] {
            if seqs > 0.0 && tok > 0.0 {
                let per = tok / seqs;
                self.t += tok;
                self.t2 += tok * per;
                self.t3 += tok * per * per;
            }
        }
    }

    pub fn routing(&self) -> StepRouting {
        let (t, t2, t3) = (self.t, self.t2, self.t3);
        if t2 <= 0.0 {
            return StepRouting::default();
        }
        StepRouting {
            requests: t * t / t2,
            tokens: t,
            cube_share: t3 / (t * t * t),
        }
    }
}

/// A die's share of a step's routes around its mean: standard deviation relative to the mean,
/// and skewness.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ShareSpread {
    pub relative_sd: f64,
    pub skewness: f64,
}

/// The spread of the share of a die of mean share 1/`dies` (module docs); none when the
/// concentration is 0 (the switch that turns per-batch fluctuation off) or nothing is routed.
pub fn share_spread(dies: f64, step: StepRouting, top_k: u32, concentration: f64) -> ShareSpread {
    let (c, k, t) = (concentration, top_k as f64, step.tokens);
    if c <= 0.0 || dies < 1.0 || step.requests <= 0.0 || t <= 0.0 || k <= 0.0 {
        return ShareSpread::default();
    }
    let m = 1.0 / dies;
    // Raw moments of the Beta(c m, c (1 - m)) share of one request.
    let e2 = m * (c * m + 1.0) / (c + 1.0);
    let e3 = e2 * (c * m + 2.0) / (c + 2.0);
    let var_p = e2 - m * m;
    let k3_p = e3 - 3.0 * m * e2 + 2.0 * m * m * m;
    let pq = m - e2;
    let cov = e2 - e3 - m * pq;
    let pqr = m - 3.0 * e2 + 2.0 * e3;
    let var = var_p / step.requests + pq / (k * t);
    if var <= 0.0 {
        return ShareSpread::default();
    }
    let k3 = step.cube_share * k3_p + 3.0 * cov / (k * step.requests * t) + pqr / (k * k * t * t);
    ShareSpread {
        relative_sd: var.sqrt() / m,
        skewness: k3 / var.powf(1.5),
    }
}

/// What per-batch fluctuation adds to the hottest of `dies` evenly loaded routed dies over the
/// mean, for a step routing `step` with `top_k` experts per token and requests of Dirichlet
/// concentration `concentration` (0 turns the fluctuation off).
///
/// The dies are taken as evenly loaded: where the placement leaves one die far hotter than the
/// rest, that die's own fluctuation averages out and this overstates the excess.
pub fn fluctuation(dies: u32, step: StepRouting, top_k: u32, concentration: f64) -> f64 {
    if dies < 2 {
        return 0.0;
    }
    let s = share_spread(dies as f64, step, top_k, concentration);
    let z = expected_max_normal(dies as f64);
    ((z + s.skewness * (z * z - 1.0) / 6.0) * s.relative_sd).max(0.0)
}

/// Φ⁻¹(p) for 0 < p < 1 (Acklam's rational approximation, relative error < 1.2e-9).
pub(crate) fn inverse_normal(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969683028665376e1,
        2.209460984245205e2,
        -2.759285104469687e2,
        1.383_577_518_672_69e2,
        -3.066479806614716e1,
        2.506628277459239,
    ];
    const B: [f64; 5] = [
        -5.447609879822406e1,
        1.615858368580409e2,
        -1.556989798598866e2,
        6.680131188771972e1,
        -1.328068155288572e1,
    ];
    const C: [f64; 6] = [
        -7.784894002430293e-3,
        -3.223964580411365e-1,
        -2.400758277161838,
        -2.549732539343734,
        4.374664141464968,
        2.938163982698783,
    ];
    const D: [f64; 4] = [
        7.784695709041462e-3,
        3.224671290700398e-1,
        2.445134137142996,
        3.754408661907416,
    ];
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

/// Expected largest of `n` independent standard normals (Blom's approximation).
pub fn expected_max_normal(n: f64) -> f64 {
    if n < 2.0 {
        return 0.0;
    }
    inverse_normal((n - 0.375) / (n + 0.25))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use rand_distr::{Distribution, Gamma};

    /// A step of `requests` equal requests routing `tokens` tokens.
    fn step(requests: f64, tokens: f64) -> StepRouting {
        StepRouting {
            requests,
            tokens,
            cube_share: 1.0 / (requests * requests),
        }
    }

    #[test]
    fn expected_maxima_of_normals() {
        // Known values: E[max] of 2, 10 and 100 standard normals.
        for (n, want) in [(2.0, 0.564), (10.0, 1.539), (100.0, 2.508)] {
            let got = expected_max_normal(n);
            assert!((got - want).abs() < 0.03, "n {n}: {got} vs {want}");
        }
        assert!((inverse_normal(0.975) - 1.959_964).abs() < 1e-6);
        assert!((inverse_normal(0.001) + 3.090_232).abs() < 1e-5);
    }

    #[test]
    fn fluctuation_falls_with_requests_tokens_and_concentration() {
        let f = |n, c| fluctuation(32, step(n, 1e12), 8, c);
        assert!(f(4.0, 10.0) > f(64.0, 10.0));
        assert!(f(64.0, 10.0) > f(64.0, 100.0));
        assert!(f(10_000.0, 10.0) < 0.05, "large batches barely fluctuate");
        assert_eq!(f(64.0, 0.0), 0.0, "0 turns it off");
        assert_eq!(fluctuation(1, step(4.0, 4.0), 8, 10.0), 0.0);
        // The requests' spread falls as 1/sqrt(n), their skew faster: four times the
        // requests, a little under half the excess.
        let r = f(16.0, 10.0) / f(64.0, 10.0);
        assert!(r > 2.0 && r < 2.3, "{r}");
        // Few tokens add their own draws: 64 single-token requests fluctuate more than 64
        // long prompts.
        let decode = fluctuation(32, step(64.0, 64.0), 8, 10.0);
        let prefill = fluctuation(32, step(64.0, 64.0 * 4096.0), 8, 10.0);
        assert!(decode > 1.3 * prefill, "{decode} vs {prefill}");
    }

    #[test]
    fn step_routing_weighs_requests_by_tokens() {
        use dstwin_core::batch::AttnCap;
        let a = BatchShape::uniform_prefill(2, 4096, AttnCap(None));
        let r = step_routing([a, a].iter());
        assert!((r.requests - 4.0).abs() < 1e-9);
        assert_eq!(r.tokens, 4.0 * 4096.0);
        assert!((r.cube_share - 1.0 / 16.0).abs() < 1e-12);
        let mut mixed = BatchShape::uniform_decode(100, 1, 1000, AttnCap(None));
        mixed.add_prefill(4000, 0, AttnCap(None));
        // One long prompt dominates a hundred single-token decodes.
        let n = step_routing(std::iter::once(&mixed)).requests;
        assert!(n > 1.0 && n < 2.0, "{n}");
    }

    /// Samples the routing the model describes (requests' Dirichlet preferences over balanced
    /// dies, each token drawing top_k routes from its request's preferences) and compares the
    /// mean hottest die with the formula.
    #[test]
    fn fluctuation_matches_a_sampled_routing() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let dies = 32usize;
        let (top_k, c) = (8u32, 12.0);
        // (requests, tokens per request): prefill-like and decode-like steps.
        for (requests, per_req) in [(8usize, 64usize), (64, 1)] {
            let gamma = Gamma::new(c / dies as f64, 1.0).unwrap();
            let trials = 300;
            let mut excess = 0.0;
            for _ in 0..trials {
                let mut load = vec![0.0f64; dies];
                for _ in 0..requests {
                    let mut p: Vec<f64> = (0..dies).map(|_| gamma.sample(&mut rng)).collect();
                    let s: f64 = p.iter().sum();
                    p.iter_mut().for_each(|x| *x /= s);
                    for _ in 0..per_req * top_k as usize {
                        let mut u: f64 = rng.random();
                        let d = p
                            .iter()
                            .position(|x| {
                                u -= x;
                                u < 0.0
                            })
                            .unwrap_or(dies - 1);
                        load[d] += 1.0;
                    }
                }
                let mean = load.iter().sum::<f64>() / dies as f64;
                excess += load.iter().copied().fold(0.0, f64::max) / mean - 1.0;
            }
            let sampled = excess / trials as f64;
            let s = step(requests as f64, (requests * per_req) as f64);
            let model = fluctuation(dies as u32, s, top_k, c);
            assert!(
                (model / sampled - 1.0).abs() < 0.06,
                "{requests} requests x {per_req} tokens: model {model:.4}, sampled {sampled:.4}"
            );
        }
    }
}
