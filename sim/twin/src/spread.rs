//! `StepSpread`: a step's kernel time drawn around its price (a cost file's `[host] step_sigma`,
//! fitted by `calibrate --trace`): the twin's own variation, seeded, one draw per run.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

/// A step's kernel time drawn around its price: the price times `exp(sigma z - sigma^2 / 2)`
/// with `z` standard normal, a lognormal factor of mean 1 (the cost file's `[host] step_sigma`),
/// independent from step to step. Expected step times, and so mean throughput, stay the
/// price's; latency percentiles spread as a real device's do.
#[derive(Clone, Debug)]
pub struct StepSpread {
    sigma: f64,
    seed: u64,
    rng: ChaCha8Rng,
}

impl StepSpread {
    /// `None` for `sigma` 0 (every step at its price).
    pub fn new(sigma: f64, seed: u64) -> Option<Self> {
        (sigma > 0.0).then(|| StepSpread {
            sigma,
            seed,
            rng: ChaCha8Rng::seed_from_u64(seed),
        })
    }

    /// Starts draw `draw` of the same spread (0: the seed's own): another sequence of factors.
    pub fn redraw(&mut self, draw: u64) {
        // Odd multiplier: distinct draws give distinct seeds.
        let mix = draw.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.rng = ChaCha8Rng::seed_from_u64(self.seed ^ mix);
    }

    /// The next step's factor.
    pub fn draw(&mut self) -> f64 {
        let z: f64 = StandardNormal.sample(&mut self.rng);
        (self.sigma * z - 0.5 * self.sigma * self.sigma).exp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_factors_are_lognormal_of_mean_one_and_follow_the_seed() {
        assert!(StepSpread::new(0.0, 1).is_none());
        let sigma = 0.25;
        let mut a = StepSpread::new(sigma, 11).unwrap();
        let mut f: Vec<f64> = (0..100_000).map(|_| a.draw()).collect();
        let mean = f.iter().sum::<f64>() / f.len() as f64;
        assert!((mean - 1.0).abs() < 0.01, "{mean}");
        f.sort_by(f64::total_cmp);
        // The deciles of exp(sigma z - sigma^2 / 2).
        for (q, z) in [(0.1, -1.281_551_6), (0.5, 0.0), (0.9, 1.281_551_6)] {
            let got = f[(q * f.len() as f64) as usize];
            let want = (sigma * z - 0.5 * sigma * sigma).exp();
            assert!(
                (got / want - 1.0).abs() < 0.02,
                "q{q}: {got} against {want}"
            );
        }
        // The same seed draws the same factors; another seed others.
        let (mut b, mut c) = (
            StepSpread::new(sigma, 11).unwrap(),
            StepSpread::new(sigma, 12).unwrap(),
        );
        let mut a = StepSpread::new(sigma, 11).unwrap();
        let xs: Vec<f64> = (0..8).map(|_| a.draw()).collect();
        assert_eq!(xs, (0..8).map(|_| b.draw()).collect::<Vec<_>>());
        assert_ne!(xs, (0..8).map(|_| c.draw()).collect::<Vec<_>>());
    }
}
