//! The default expert load: a log-normal popularity per layer whose parameters were fitted to
//! published DeepSeek-R1 expert loads (`sim/twin/data/expert-load.toml`, written by `dstwin
//! calibrate`; `calibration/src/expert_load.rs` is the fit, `calibration/tests/expert_load.rs`
//! checks that the file holds its optimum).
//!
//! Why log-normal: the measured loads are a few hot experts over a long flat tail, with
//! hottest-expert and hottest-rank ratios that differ from layer to layer. A log-normal
//! popularity draws each expert's share independently, so how hot each rank of a layer is
//! depends on which experts happen to share it, as in the measurements; a Zipf law has one
//! fixed set of shares per exponent and, fitted to the same averages, overshoots the hottest
//! expert and undershoots how the ranks spread (docs/validation.md, "Expert imbalance").

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};
use std::sync::OnceLock;

/// The fitted parameters as shipped.
const FITTED: &str = include_str!("../../data/expert-load.toml");

/// Parameters of the fitted default load, with their source.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FittedLoad {
    /// Where the parameters come from.
    pub source: String,
    /// Median over layers of the log-normal sigma of the experts' shares.
    pub sigma: f64,
    /// Spread of the per-layer sigma: sigma_l = sigma x exp(sigma_spread x N(0,1)).
    pub sigma_spread: f64,
    /// Dirichlet concentration of one request's routing around the mean
    /// (`expert_load::fluctuation`).
    pub concentration: f64,
}

/// The shipped fitted parameters (the embedded data file; a malformed one fails its test).
pub fn fitted() -> &'static FittedLoad {
    static F: OnceLock<FittedLoad> = OnceLock::new();
    F.get_or_init(|| {
        toml::from_str(FITTED).expect("sim/twin/data/expert-load.toml parses (tested)")
    })
}

/// The standard normals behind a log-normal load, drawn in a fixed order from one seed: per
/// layer, the draw of its sigma and one per expert. Shares for any (sigma, spread) follow from
/// them, so a fit can vary the parameters over the same draws the simulator makes.
#[derive(Clone, Debug, PartialEq)]
pub struct LognormalDraws {
    /// Per layer: (w, z per expert).
    layers: Vec<(f64, Vec<f64>)>,
}

impl LognormalDraws {
    /// Draws for `layers` x `experts` from `rng`.
    pub fn draw(layers: usize, experts: usize, rng: &mut impl Rng) -> Self {
        LognormalDraws {
            layers: (0..layers)
                .map(|_| {
                    let w: f64 = StandardNormal.sample(rng);
                    let z = (0..experts).map(|_| StandardNormal.sample(rng)).collect();
                    (w, z)
                })
                .collect(),
        }
    }

    /// The draws `ExpertLoad::new` makes for a log-normal load of this seed.
    pub fn seeded(layers: usize, experts: usize, seed: u64) -> Self {
        Self::draw(layers, experts, &mut ChaCha8Rng::seed_from_u64(seed))
    }

    /// Layers x experts shares, each row normalized: expert e of layer l gets
    /// exp(sigma_l z_e), sigma_l = sigma x exp(spread x w_l).
    pub fn shares(&self, sigma: f64, spread: f64) -> Vec<Vec<f64>> {
        self.layers
            .iter()
            .map(|(w, z)| {
                let s = sigma * (spread * w).exp();
                let mut row: Vec<f64> = z.iter().map(|z| (s * z).exp()).collect();
                super::normalize(&mut row);
                row
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_file_parses_with_sane_values() {
        let f = fitted();
        assert!(f.sigma > 0.0 && f.sigma < 5.0, "{f:?}");
        assert!(f.sigma_spread >= 0.0 && f.sigma_spread < 2.0, "{f:?}");
        assert!(f.concentration > 0.0, "{f:?}");
        assert!(f.source.contains("TensorRT-LLM"), "{}", f.source);
    }

    #[test]
    fn the_data_file_rejects_unknown_fields() {
        let bad = format!("{FITTED}\nexponent = 0.5\n");
        let err = toml::from_str::<FittedLoad>(&bad).unwrap_err().to_string();
        assert!(err.contains("exponent"), "{err}");
    }
}
