//! Expert load: how the tokens of a step spread over the routed experts of each MoE layer.
//!
//! Real routing is skewed and drifts; the hottest die sets the pace of every EP step. The model is
//! a Zipf popularity per layer (each layer its own seeded ranking) that drifts by a log-normal
//! factor per expert every epoch of steps, or a replayed heat map (`eplb::heatmap`). Perfect
//! balance is an explicit choice, never the default.
//!
//! Per-batch fluctuation: each request routes by its own expert preferences, drawn around the
//! layer's mean shares (a Dirichlet of concentration `concentration`); a step's die loads are
//! the token-weighted mean of its requests' preferences, so a step of few long prompts strays far
//! from the mean load the placement was made for, and a decode step of thousands of requests
//! does not ([`fluctuation`]). EPLB can place for the mean, not for the batch.
//!
//! Default: static skew (no drift; see `DEFAULT_DRIFT`). Exponent 0.5 gives a hottest-to-mean expert ratio of 2.1 over 12 experts, the
//! ratio of the example load in DeepSeek's EPLB README (an assumption until recorded heat maps of
//! DeepSeek on Ascend are available; replay one with `kind = "replay"`).

use dstwin_core::eplb::heatmap::HeatMap;
use dstwin_core::eplb::{balancedness, Placement};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;

const DEFAULT_EXPONENT: f64 = 0.5;
/// Static skew by default: every drift epoch moves the imbalance into a new price-cache bucket,
/// and each bucket re-prices every batch shape seen (4x the misses on the Mooncake trace, twice
/// the run time). Pricing the MoE part apart from the attention part will lift this; until then
/// drift is opt-in (e.g. 0.06 per epoch of 1,000 steps).
const DEFAULT_DRIFT: f64 = 0.0;
const DEFAULT_EPOCH_STEPS: u64 = 1000;
/// Dirichlet concentration of one request's routing around the mean: fitted by `dstwin
/// calibrate` to the CloudMatrix384 prefill throughput with default EPLB against perfect
/// balance (5,655 vs 6,688 tokens/s per NPU), the one published figure that isolates it;
/// `calibration/tests/fit.rs` checks this value against the fit.
pub const DEFAULT_CONCENTRATION: f64 = 5.95;

/// The `[expert_load]` table of a scenario.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ExpertLoadSpec {
    /// Every expert gets the same share (an upper bound).
    Perfect,
    /// Zipf popularity per layer: the expert at rank r gets a share proportional to
    /// 1 / (r + 1)^exponent; shares drift by exp(drift x N(0,1)) every `epoch_steps` steps.
    Zipf {
        #[serde(default = "default_exponent")]
        exponent: f64,
        #[serde(default = "default_drift")]
        drift: f64,
        #[serde(default = "default_epoch")]
        epoch_steps: u64,
        /// Dirichlet concentration of each request's routing around the mean (smaller: each
        /// request uses fewer experts, batches of few requests are less balanced); 0 turns the
        /// per-batch fluctuation off.
        #[serde(default = "default_concentration")]
        concentration: f64,
    },
    /// A recorded heat map (format dstwin-expert-load/1); its windows are replayed in turn by
    /// step, cycling.
    Replay { path: String },
}

fn default_exponent() -> f64 {
    DEFAULT_EXPONENT
}
fn default_drift() -> f64 {
    DEFAULT_DRIFT
}
fn default_epoch() -> u64 {
    DEFAULT_EPOCH_STEPS
}
fn default_concentration() -> f64 {
    DEFAULT_CONCENTRATION
}

impl Default for ExpertLoadSpec {
    fn default() -> Self {
        ExpertLoadSpec::Zipf {
            exponent: DEFAULT_EXPONENT,
            drift: DEFAULT_DRIFT,
            epoch_steps: DEFAULT_EPOCH_STEPS,
            concentration: DEFAULT_CONCENTRATION,
        }
    }
}

impl ExpertLoadSpec {
    /// The per-batch fluctuation model's concentration (0: none; replayed heat maps already
    /// carry their batches' fluctuation).
    pub fn concentration(&self) -> f64 {
        match self {
            ExpertLoadSpec::Zipf { concentration, .. } => *concentration,
            _ => 0.0,
        }
    }

    /// Checks the fields; the error names the field and value.
    pub fn validate(&self) -> Result<(), (String, String, &'static str)> {
        if let ExpertLoadSpec::Zipf {
            exponent,
            drift,
            epoch_steps,
            concentration,
        } = self
        {
            if !(concentration.is_finite() && *concentration >= 0.0) {
                return Err((
                    "expert_load.concentration".into(),
                    concentration.to_string(),
                    "must be a number >= 0 (0: no per-batch fluctuation)",
                ));
            }
            if !(exponent.is_finite() && *exponent >= 0.0) {
                return Err((
                    "expert_load.exponent".into(),
                    exponent.to_string(),
                    "must be a number >= 0",
                ));
            }
            if !(drift.is_finite() && *drift >= 0.0) {
                return Err((
                    "expert_load.drift".into(),
                    drift.to_string(),
                    "must be a number >= 0",
                ));
            }
            if *epoch_steps == 0 {
                return Err((
                    "expert_load.epoch_steps".into(),
                    "0".into(),
                    "must be at least 1",
                ));
            }
        }
        Ok(())
    }
}

/// Per-layer expert shares that evolve with steps.
#[derive(Clone, Debug)]
pub struct ExpertLoad {
    /// Layers x experts; each row sums to 1. Shared with whoever keeps the heat (the
    /// deployment core's rebalance cycle): replaced, never changed in place.
    shares: Arc<Vec<Vec<f64>>>,
    drift: f64,
    epoch_steps: u64,
    step: u64,
    rng: ChaCha8Rng,
    replay: Option<(HeatMap, usize)>,
}

fn normalize(row: &mut [f64]) {
    let s: f64 = row.iter().sum();
    if s > 0.0 {
        row.iter_mut().for_each(|x| *x /= s);
    } else {
        let n = row.len() as f64;
        row.iter_mut().for_each(|x| *x = 1.0 / n);
    }
}

/// Why an expert-load model cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum ExpertLoadError {
    #[error("reading {file}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}")]
    HeatMap {
        file: String,
        #[source]
        source: dstwin_core::eplb::heatmap::HeatMapError,
    },
    #[error("{file}: heat map has {got_layers} layers x {got_experts} experts, the model has {layers} MoE layers x {experts} experts")]
    Shape {
        file: String,
        got_layers: usize,
        got_experts: u32,
        layers: usize,
        experts: usize,
    },
}

impl ExpertLoad {
    pub fn new(
        spec: &ExpertLoadSpec,
        layers: usize,
        experts: usize,
        seed: u64,
        base_dir: &Path,
    ) -> Result<Self, ExpertLoadError> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let (shares, drift, epoch_steps, replay) = match spec {
            ExpertLoadSpec::Perfect => (
                vec![vec![1.0 / experts as f64; experts]; layers],
                0.0,
                u64::MAX,
                None,
            ),
            ExpertLoadSpec::Zipf {
                exponent,
                drift,
                epoch_steps,
                ..
            } => {
                let shares = (0..layers)
                    .map(|_| {
                        let mut row: Vec<f64> = (0..experts)
                            .map(|r| 1.0 / ((r + 1) as f64).powf(*exponent))
                            .collect();
                        // Each layer ranks its experts differently.
                        for i in (1..row.len()).rev() {
                            let j = rng.random_range(0..=i);
                            row.swap(i, j);
                        }
                        normalize(&mut row);
                        row
                    })
                    .collect();
                (shares, *drift, *epoch_steps, None)
            }
            ExpertLoadSpec::Replay { path } => {
                let p = base_dir.join(path);
                let file = p.display().to_string();
                let text = std::fs::read_to_string(&p).map_err(|source| ExpertLoadError::Io {
                    file: file.clone(),
                    source,
                })?;
                let h = HeatMap::parse(&text).map_err(|source| ExpertLoadError::HeatMap {
                    file: file.clone(),
                    source,
                })?;
                let got_layers = h.windows[0].counts.len();
                if got_layers != layers || h.experts as usize != experts {
                    return Err(ExpertLoadError::Shape {
                        file,
                        got_layers,
                        got_experts: h.experts,
                        layers,
                        experts,
                    });
                }
                let mut load = ExpertLoad {
                    shares: Arc::new(Vec::new()),
                    drift: 0.0,
                    epoch_steps: u64::MAX,
                    step: 0,
                    rng,
                    replay: Some((h, 0)),
                };
                load.load_window(0);
                return Ok(load);
            }
        };
        Ok(ExpertLoad {
            shares: Arc::new(shares),
            drift,
            epoch_steps,
            step: 0,
            rng,
            replay,
        })
    }

    fn load_window(&mut self, w: usize) {
        let (h, cur) = self.replay.as_mut().expect("replay model");
        *cur = w;
        self.shares = Arc::new(
            h.windows[w]
                .counts
                .iter()
                .map(|row| {
                    let mut r: Vec<f64> = row.iter().map(|c| *c as f64).collect();
                    normalize(&mut r);
                    r
                })
                .collect(),
        );
    }

    /// Each layer's share of routed tokens per expert.
    pub fn shares(&self) -> &[Vec<f64>] {
        &self.shares
    }

    /// The shares as a shared handle (a new one each time they change).
    pub fn shares_arc(&self) -> &Arc<Vec<Vec<f64>>> {
        &self.shares
    }

    /// Advances one step; true when the shares changed.
    pub fn step(&mut self) -> bool {
        self.step += 1;
        if let Some((h, cur)) = &self.replay {
            let (cur, n) = (*cur, h.windows.len());
            let w = &h.windows[cur];
            if self.step >= w.start_step + w.steps && n > 1 {
                let next = (cur + 1) % n;
                if next == 0 {
                    self.step = 0;
                }
                self.load_window(next);
                return true;
            }
            return false;
        }
        if self.drift > 0.0 && self.step.is_multiple_of(self.epoch_steps) {
            let n = Normal::new(0.0, self.drift).expect("drift validated finite and >= 0");
            let mut shares = self.shares.as_ref().clone();
            for row in &mut shares {
                for x in row.iter_mut() {
                    *x *= n.sample(&mut self.rng).exp();
                }
                normalize(row);
            }
            self.shares = Arc::new(shares);
            return true;
        }
        false
    }
}

/// Φ⁻¹(p) for 0 < p < 1 (Acklam's rational approximation, relative error < 1.2e-9).
fn inverse_normal(p: f64) -> f64 {
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
fn expected_max_normal(n: f64) -> f64 {
    if n < 2.0 {
        return 0.0;
    }
    inverse_normal((n - 0.375) / (n + 0.25))
}

/// What per-batch fluctuation adds to the hottest die's load over the mean, for an EP group of
/// `dies` routed dies computing a step whose tokens come from `n_eff` requests (effective
/// count: (Σ tokens)² / Σ tokens² over requests).
///
/// Each request's share of a die is Beta-distributed around the die's mean share 1/dies with
/// variance (1/dies)(1 - 1/dies) / (concentration + 1) (the aggregation property of the
/// Dirichlet); averaging n_eff requests divides the variance by n_eff; the hottest of `dies`
/// such loads sits about E[max of dies normals] standard deviations above the mean.
pub fn fluctuation(dies: u32, n_eff: f64, concentration: f64) -> f64 {
    if concentration <= 0.0 || dies < 2 || n_eff <= 0.0 {
        return 0.0;
    }
    let d = dies as f64;
    expected_max_normal(d) * ((d - 1.0) / ((concentration + 1.0) * n_eff)).sqrt()
}

/// The effective number of requests of a step from per-rank aggregates: within a rank, tokens
/// of one kind (prefill or decode) are taken as spread evenly over its requests.
pub fn effective_requests<'a>(
    shapes: impl Iterator<Item = &'a dstwin_core::batch::BatchShape>,
) -> f64 {
    let mut e = EffectiveRequests::default();
    for s in shapes {
        e.add(s);
    }
    e.value()
}

/// [`effective_requests`] fed one rank's shape at a time.
#[derive(Clone, Copy, Debug, Default)]
pub struct EffectiveRequests {
    tokens: f64,
    weighed: f64,
}

impl EffectiveRequests {
    pub fn add(&mut self, s: &dstwin_core::batch::BatchShape) {
        for (tok, seqs) in [
            (s.prefill_tokens as f64, s.prefill_seqs as f64),
            (s.decode_tokens as f64, s.decode_seqs as f64),
        ] {
            if seqs > 0.0 && tok > 0.0 {
                self.tokens += tok;
                self.weighed += tok * tok / seqs;
            }
        }
    }

    pub fn value(&self) -> f64 {
        if self.weighed > 0.0 {
            self.tokens * self.tokens / self.weighed
        } else {
            0.0
        }
    }
}

/// Hottest die over mean die load, averaged over layers: the factor by which the routed-expert
/// work (and the all-to-all receive on the hottest die) exceeds perfect balance.
pub fn imbalance(placement: &Placement, shares: &[Vec<f64>]) -> f64 {
    let n = placement.layers.len().min(shares.len());
    if n == 0 {
        return 1.0;
    }
    let sum: f64 = placement
        .layers
        .iter()
        .zip(shares)
        .map(|(p, s)| 1.0 / balancedness(&p.die_loads(s, placement.slots_per_die)))
        .sum();
    sum / n as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use dstwin_core::eplb::{place, EpLayout, Policy};

    #[test]
    fn the_default_skew_matches_the_eplb_example_ratio() {
        let l = ExpertLoad::new(&ExpertLoadSpec::default(), 1, 12, 1, Path::new(".")).unwrap();
        assert!(
            matches!(ExpertLoadSpec::default(), ExpertLoadSpec::Zipf { drift, .. } if drift == 0.0)
        );
        let row = &l.shares()[0];
        let max = row.iter().copied().fold(0.0, f64::max);
        assert!((max * 12.0 - 2.14).abs() < 0.01, "{}", max * 12.0);
    }

    #[test]
    fn eplb_lowers_the_imbalance_of_a_skewed_load() {
        let l = ExpertLoad::new(&ExpertLoadSpec::default(), 4, 256, 3, Path::new(".")).unwrap();
        let layout = EpLayout {
            slots: 288,
            dies: 32,
            dies_per_node: 16,
            groups: 8,
        };
        let ident = place(Policy::Identity, l.shares(), &layout).unwrap();
        let greedy = place(Policy::Greedy, l.shares(), &layout).unwrap();
        let (a, b) = (
            imbalance(&ident, l.shares()),
            imbalance(&greedy, l.shares()),
        );
        assert!(a > 1.2 && b < a && b >= 1.0, "identity {a}, greedy {b}");
        // A uniform load placed for itself is perfectly balanced.
        let perfect = ExpertLoad::new(&ExpertLoadSpec::Perfect, 4, 256, 3, Path::new(".")).unwrap();
        let even = place(Policy::Greedy, perfect.shares(), &layout).unwrap();
        assert!((imbalance(&even, perfect.shares()) - 1.0).abs() < 1e-9);
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
    fn fluctuation_falls_with_requests_and_concentration() {
        let f = |n, c| fluctuation(32, n, c);
        assert!(f(4.0, 10.0) > f(64.0, 10.0));
        assert!(f(64.0, 10.0) > f(64.0, 100.0));
        assert!(
            f(10_000.0, 10.0) < 0.05,
            "decode-sized batches barely fluctuate"
        );
        assert_eq!(f(64.0, 0.0), 0.0, "0 turns it off");
        assert_eq!(fluctuation(1, 4.0, 10.0), 0.0);
        // Variance falls as 1/n: four times the requests, half the excess.
        assert!((f(16.0, 10.0) / f(64.0, 10.0) - 2.0).abs() < 1e-9);
    }

    #[test]
    fn effective_requests_weigh_by_tokens() {
        use dstwin_core::batch::{AttnCap, BatchShape};
        let a = BatchShape::uniform_prefill(2, 4096, AttnCap(None));
        assert!((effective_requests([a, a].iter()) - 4.0).abs() < 1e-9);
        let mut mixed = BatchShape::uniform_decode(100, 1, 1000, AttnCap(None));
        mixed.add_prefill(4000, 0, AttnCap(None));
        // One long prompt dominates a hundred single-token decodes.
        let n = effective_requests(std::iter::once(&mixed));
        assert!(n > 1.0 && n < 2.0, "{n}");
    }

    #[test]
    fn drift_moves_shares_once_per_epoch_and_keeps_them_normalized() {
        let spec = ExpertLoadSpec::Zipf {
            exponent: 0.5,
            drift: 0.1,
            epoch_steps: 10,
            concentration: 0.0,
        };
        let mut l = ExpertLoad::new(&spec, 2, 16, 5, Path::new(".")).unwrap();
        let before = l.shares().to_vec();
        let changed: Vec<bool> = (0..20).map(|_| l.step()).collect();
        assert_eq!(changed.iter().filter(|c| **c).count(), 2);
        assert!(changed[9] && changed[19]);
        assert_ne!(l.shares(), &before[..]);
        for row in l.shares() {
            assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        }
    }
}
