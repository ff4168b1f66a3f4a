//! Expert load: how the tokens of a step spread over the routed experts of each MoE layer.
//!
//! Real routing is skewed and drifts; the hottest die sets the pace of every EP step. Each layer
//! gets its own seeded popularity over its experts, which may drift by a log-normal factor per
//! expert every epoch of steps, or a heat map is replayed (`eplb::heatmap`). Perfect balance is
//! an explicit choice, never the default.
//!
//! - [`fitted`]: the default, a log-normal popularity per layer fitted to published DeepSeek-R1
//!   expert loads (`sim/twin/data/expert-load.toml`), and why that family.
//! - [`fluctuation`]: what one step's own routing adds to the hottest die over the mean load a
//!   placement was made for (requests' preferences and tokens' draws).
//! - Here: the `[expert_load]` spec, the load over steps ([`ExpertLoad`]), the imbalance of a
//!   placement ([`imbalance`]) and what a report says about the assumption
//!   ([`LoadAssumption`]).

pub mod fitted;
pub mod fluctuation;

pub use fitted::{fitted, FittedLoad, LognormalDraws};
pub use fluctuation::{fluctuation, step_routing, RoutingSums, StepRouting};

use dstwin_core::eplb::heatmap::HeatMap;
use dstwin_core::eplb::{balancedness, Placement};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

const DEFAULT_EXPONENT: f64 = 0.5;
/// Static skew by default: every drift epoch moves the imbalance into a new price-cache bucket,
/// and each bucket re-prices every batch shape seen (4x the misses on the Mooncake trace, twice
/// the run time). Pricing the MoE part apart from the attention part will lift this; until then
/// drift is opt-in (e.g. 0.06 per epoch of 1,000 steps).
const DEFAULT_DRIFT: f64 = 0.0;
const DEFAULT_EPOCH_STEPS: u64 = 1000;
/// Dirichlet concentration of a `zipf` load left without one: fitted by `dstwin calibrate` to the
/// CloudMatrix384 prefill throughput with default EPLB against perfect balance (5,655 vs 6,688
/// tokens/s per NPU) under Zipf(0.5), the one figure that isolates it (the `fitted` default has
/// its own, fitted jointly with its skew); `calibration/tests/fit.rs` checks this value against
/// that fit.
pub const DEFAULT_CONCENTRATION: f64 = 8.43;

/// The `[expert_load]` table of a scenario.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ExpertLoadSpec {
    /// Every expert gets the same share (an upper bound).
    Perfect,
    /// The default: a log-normal popularity per layer with the parameters fitted to published
    /// DeepSeek-R1 expert loads ([`fitted()`]); shares drift as in `zipf`.
    Fitted {
        #[serde(default = "default_drift")]
        drift: f64,
        #[serde(default = "default_epoch")]
        epoch_steps: u64,
    },
    /// The fitted family with other parameters: expert e of layer l gets a share proportional to
    /// exp(sigma_l z_e), z_e ~ N(0,1), sigma_l = sigma x exp(sigma_spread x N(0,1)).
    Lognormal {
        sigma: f64,
        #[serde(default)]
        sigma_spread: f64,
        /// Dirichlet concentration of each request's routing (default: the fitted one).
        #[serde(default = "fitted_concentration")]
        concentration: f64,
        #[serde(default = "default_drift")]
        drift: f64,
        #[serde(default = "default_epoch")]
        epoch_steps: u64,
    },
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
fn fitted_concentration() -> f64 {
    fitted().concentration
}

impl Default for ExpertLoadSpec {
    fn default() -> Self {
        ExpertLoadSpec::Fitted {
            drift: DEFAULT_DRIFT,
            epoch_steps: DEFAULT_EPOCH_STEPS,
        }
    }
}

/// What a run or an `explain` assumed about the routed-expert load, for its report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LoadAssumption {
    /// The kind as scenario files name it.
    pub kind: &'static str,
    /// The load's parameters by name (sigma, sigma_spread, exponent, concentration, drift...).
    pub parameters: BTreeMap<&'static str, f64>,
    /// Where the parameters come from.
    pub source: String,
}

impl LoadAssumption {
    /// One line: the kind, its parameters and their source.
    pub fn summary(&self) -> String {
        let p: Vec<String> = self
            .parameters
            .iter()
            .map(|(k, v)| format!("{k} {}", short(*v)))
            .collect();
        if p.is_empty() {
            format!("{} ({})", self.kind, self.source)
        } else {
            format!("{} [{}] ({})", self.kind, p.join(", "), self.source)
        }
    }
}

/// A parameter as a report prints it: up to 4 significant digits, no trailing zeros.
fn short(v: f64) -> String {
    let s = format!("{v:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

impl ExpertLoadSpec {
    /// The kind as scenario files name it.
    pub fn kind(&self) -> &'static str {
        match self {
            ExpertLoadSpec::Perfect => "perfect",
            ExpertLoadSpec::Fitted { .. } => "fitted",
            ExpertLoadSpec::Lognormal { .. } => "lognormal",
            ExpertLoadSpec::Zipf { .. } => "zipf",
            ExpertLoadSpec::Replay { .. } => "replay",
        }
    }

    /// The per-batch fluctuation model's concentration (0: none; replayed heat maps already
    /// carry their batches' fluctuation).
    pub fn concentration(&self) -> f64 {
        match self {
            ExpertLoadSpec::Fitted { .. } => fitted().concentration,
            ExpertLoadSpec::Lognormal { concentration, .. }
            | ExpertLoadSpec::Zipf { concentration, .. } => *concentration,
            _ => 0.0,
        }
    }

    /// What this load assumes, for a report.
    pub fn assumption(&self) -> LoadAssumption {
        let mut p = BTreeMap::new();
        let drifts = |p: &mut BTreeMap<&'static str, f64>, drift: f64, epoch: u64| {
            if drift > 0.0 {
                p.insert("drift", drift);
                p.insert("epoch_steps", epoch as f64);
            }
        };
        let source = match self {
            ExpertLoadSpec::Perfect => "every expert the same share; an upper bound".to_string(),
            ExpertLoadSpec::Fitted { drift, epoch_steps } => {
                let f = fitted();
                p.insert("sigma", f.sigma);
                p.insert("sigma_spread", f.sigma_spread);
                p.insert("concentration", f.concentration);
                drifts(&mut p, *drift, *epoch_steps);
                format!("log-normal per layer fitted to {}", f.source)
            }
            ExpertLoadSpec::Lognormal {
                sigma,
                sigma_spread,
                concentration,
                drift,
                epoch_steps,
            } => {
                p.insert("sigma", *sigma);
                p.insert("sigma_spread", *sigma_spread);
                p.insert("concentration", *concentration);
                drifts(&mut p, *drift, *epoch_steps);
                "log-normal per layer, set by the user".to_string()
            }
            ExpertLoadSpec::Zipf {
                exponent,
                drift,
                epoch_steps,
                concentration,
            } => {
                p.insert("exponent", *exponent);
                p.insert("concentration", *concentration);
                drifts(&mut p, *drift, *epoch_steps);
                "Zipf per layer, set by the user".to_string()
            }
            ExpertLoadSpec::Replay { path } => format!("heat map replayed from {path}"),
        };
        LoadAssumption {
            kind: self.kind(),
            parameters: p,
            source,
        }
    }

    /// (sigma, sigma_spread) of a log-normal load, the fitted one included.
    pub fn lognormal(&self) -> Option<(f64, f64)> {
        match self {
            ExpertLoadSpec::Fitted { .. } => {
                let f = fitted();
                Some((f.sigma, f.sigma_spread))
            }
            ExpertLoadSpec::Lognormal {
                sigma,
                sigma_spread,
                ..
            } => Some((*sigma, *sigma_spread)),
            _ => None,
        }
    }

    /// (drift, epoch_steps) of a generated load; none for perfect balance and replays.
    fn drift(&self) -> Option<(f64, u64)> {
        match self {
            ExpertLoadSpec::Fitted { drift, epoch_steps }
            | ExpertLoadSpec::Lognormal {
                drift, epoch_steps, ..
            }
            | ExpertLoadSpec::Zipf {
                drift, epoch_steps, ..
            } => Some((*drift, *epoch_steps)),
            ExpertLoadSpec::Perfect | ExpertLoadSpec::Replay { .. } => None,
        }
    }

    /// Checks the fields; the error names the field and value.
    pub fn validate(&self) -> Result<(), (String, String, &'static str)> {
        let Some((drift, epoch_steps)) = self.drift() else {
            return Ok(());
        };
        if let ExpertLoadSpec::Lognormal {
            sigma,
            sigma_spread,
            ..
        } = self
        {
            for (name, v) in [
                ("expert_load.sigma", sigma),
                ("expert_load.sigma_spread", sigma_spread),
            ] {
                // exp(sigma x z) over a few hundred experts: beyond 10 one expert takes every
                // token and the shares underflow.
                if !(v.is_finite() && (0.0..=10.0).contains(v)) {
                    return Err((
                        name.into(),
                        v.to_string(),
                        "must be a number between 0 and 10",
                    ));
                }
            }
        }
        if let ExpertLoadSpec::Zipf { exponent, .. } = self {
            if !(exponent.is_finite() && *exponent >= 0.0) {
                return Err((
                    "expert_load.exponent".into(),
                    exponent.to_string(),
                    "must be a number >= 0",
                ));
            }
        }
        let c = self.concentration();
        if !(c.is_finite() && c >= 0.0) {
            return Err((
                "expert_load.concentration".into(),
                c.to_string(),
                "must be a number >= 0 (0: no per-batch fluctuation)",
            ));
        }
        if !(drift.is_finite() && drift >= 0.0) {
            return Err((
                "expert_load.drift".into(),
                drift.to_string(),
                "must be a number >= 0",
            ));
        }
        if epoch_steps == 0 {
            return Err((
                "expert_load.epoch_steps".into(),
                "0".into(),
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

/// Layers x experts of Zipf popularity: each layer ranks its experts differently.
fn zipf_rows(exponent: f64, layers: usize, experts: usize, rng: &mut ChaCha8Rng) -> Vec<Vec<f64>> {
    (0..layers)
        .map(|_| {
            let mut row: Vec<f64> = (0..experts)
                .map(|r| 1.0 / ((r + 1) as f64).powf(exponent))
                .collect();
            for i in (1..row.len()).rev() {
                let j = rng.random_range(0..=i);
                row.swap(i, j);
            }
            normalize(&mut row);
            row
        })
        .collect()
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
            ExpertLoadSpec::Fitted { .. }
            | ExpertLoadSpec::Lognormal { .. }
            | ExpertLoadSpec::Zipf { .. } => {
                let shares = match (spec, spec.lognormal()) {
                    (_, Some((sigma, spread))) => {
                        LognormalDraws::draw(layers, experts, &mut rng).shares(sigma, spread)
                    }
                    (ExpertLoadSpec::Zipf { exponent, .. }, None) => {
                        zipf_rows(*exponent, layers, experts, &mut rng)
                    }
                    _ => unreachable!("a generated load is log-normal or Zipf"),
                };
                let (drift, epoch_steps) = spec.drift().expect("a generated load drifts");
                (shares, drift, epoch_steps, None)
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

    fn layout(slots: u32, dies: u32) -> EpLayout {
        EpLayout {
            slots,
            dies,
            dies_per_node: 16,
            groups: 8,
        }
    }

    #[test]
    fn the_default_is_the_fitted_lognormal() {
        let spec = ExpertLoadSpec::default();
        assert_eq!(spec.kind(), "fitted");
        assert_eq!(spec.concentration(), fitted().concentration);
        let a = spec.assumption();
        assert_eq!(a.parameters["sigma"], fitted().sigma);
        assert!(
            a.summary().starts_with("fitted [concentration "),
            "{}",
            a.summary()
        );
        assert!(a.summary().contains("TensorRT-LLM"), "{}", a.summary());
        // The fitted kind draws the same rows as the log-normal kind with the fitted values.
        let f = fitted();
        let same = ExpertLoadSpec::Lognormal {
            sigma: f.sigma,
            sigma_spread: f.sigma_spread,
            concentration: f.concentration,
            drift: 0.0,
            epoch_steps: 1,
        };
        let a = ExpertLoad::new(&spec, 3, 64, 7, Path::new(".")).unwrap();
        let b = ExpertLoad::new(&same, 3, 64, 7, Path::new(".")).unwrap();
        assert_eq!(a.shares(), b.shares());
        // And the draws a fit varies its parameters over are the simulator's.
        let d = LognormalDraws::seeded(3, 64, 7);
        assert_eq!(a.shares(), &d.shares(f.sigma, f.sigma_spread)[..]);
    }

    #[test]
    fn lognormal_layers_are_skewed_differently_and_seeded() {
        let spec = ExpertLoadSpec::Lognormal {
            sigma: 1.0,
            sigma_spread: 0.3,
            concentration: 10.0,
            drift: 0.0,
            epoch_steps: 1,
        };
        let l = ExpertLoad::new(&spec, 8, 256, 3, Path::new(".")).unwrap();
        let again = ExpertLoad::new(&spec, 8, 256, 3, Path::new(".")).unwrap();
        assert_eq!(l.shares(), again.shares(), "same seed, same load");
        let other = ExpertLoad::new(&spec, 8, 256, 4, Path::new(".")).unwrap();
        assert_ne!(l.shares(), other.shares());
        let hottest: Vec<f64> = l
            .shares()
            .iter()
            .map(|r| {
                assert!((r.iter().sum::<f64>() - 1.0).abs() < 1e-9);
                r.iter().copied().fold(0.0, f64::max) * 256.0
            })
            .collect();
        let (lo, hi) = hottest
            .iter()
            .fold((f64::INFINITY, 0.0f64), |(a, b), x| (a.min(*x), b.max(*x)));
        // A few hot experts over a flat tail, hotter in some layers than in others.
        assert!(
            lo > 3.0 && hi > 1.5 * lo,
            "hottest/mean per layer {hottest:?}"
        );
        let flat = ExpertLoadSpec::Lognormal {
            sigma: 0.0,
            sigma_spread: 0.0,
            concentration: 10.0,
            drift: 0.0,
            epoch_steps: 1,
        };
        let f = ExpertLoad::new(&flat, 2, 16, 1, Path::new(".")).unwrap();
        assert!(f.shares()[0].iter().all(|x| (x - 1.0 / 16.0).abs() < 1e-12));
    }

    #[test]
    fn zipf_keeps_its_exponent_and_the_eplb_example_ratio() {
        let spec = ExpertLoadSpec::Zipf {
            exponent: 0.5,
            drift: 0.0,
            epoch_steps: 1000,
            concentration: DEFAULT_CONCENTRATION,
        };
        let l = ExpertLoad::new(&spec, 1, 12, 1, Path::new(".")).unwrap();
        let max = l.shares()[0].iter().copied().fold(0.0, f64::max);
        assert!((max * 12.0 - 2.14).abs() < 0.01, "{}", max * 12.0);
        let z: ExpertLoadSpec = toml_spec("kind = \"zipf\"");
        assert_eq!(
            z, spec,
            "a zipf table without fields keeps the old defaults"
        );
    }

    fn toml_spec(s: &str) -> ExpertLoadSpec {
        toml::from_str(s).unwrap()
    }

    #[test]
    fn scenario_tables_parse_and_validate_naming_the_field() {
        assert_eq!(toml_spec("kind = \"fitted\""), ExpertLoadSpec::default());
        let l = toml_spec("kind = \"lognormal\"\nsigma = 1.2");
        assert_eq!(l.concentration(), fitted().concentration);
        assert!(l.validate().is_ok());
        let bad = toml_spec("kind = \"lognormal\"\nsigma = 11.0");
        assert_eq!(bad.validate().unwrap_err().0, "expert_load.sigma");
        let bad = toml_spec("kind = \"lognormal\"\nsigma = 1.0\nsigma_spread = -1.0");
        assert_eq!(bad.validate().unwrap_err().0, "expert_load.sigma_spread");
        let bad = toml_spec("kind = \"fitted\"\nepoch_steps = 0");
        assert_eq!(bad.validate().unwrap_err().0, "expert_load.epoch_steps");
        let bad = toml_spec("kind = \"zipf\"\nconcentration = -1.0");
        assert_eq!(bad.validate().unwrap_err().0, "expert_load.concentration");
        // The fitted kind takes no skew of its own: that is the lognormal kind.
        assert!(toml::from_str::<ExpertLoadSpec>("kind = \"fitted\"\nsigma = 1.0").is_err());
        assert!(toml::from_str::<ExpertLoadSpec>("kind = \"lognormal\"").is_err());
    }

    #[test]
    fn reports_name_each_kind() {
        for (spec, kind, has) in [
            (ExpertLoadSpec::Perfect, "perfect", "upper bound"),
            (toml_spec("kind = \"zipf\""), "zipf", "exponent 0.5"),
            (
                toml_spec("kind = \"lognormal\"\nsigma = 1.25\ndrift = 0.06"),
                "lognormal",
                "sigma 1.25",
            ),
            (
                ExpertLoadSpec::Replay {
                    path: "heat.json".into(),
                },
                "replay",
                "heat.json",
            ),
        ] {
            let s = spec.assumption().summary();
            assert!(s.starts_with(kind) && s.contains(has), "{s}");
        }
        let d = toml_spec("kind = \"lognormal\"\nsigma = 1.25\ndrift = 0.06").assumption();
        assert_eq!(d.parameters["drift"], 0.06);
    }

    #[test]
    fn eplb_lowers_the_imbalance_of_a_skewed_load() {
        let l = ExpertLoad::new(&ExpertLoadSpec::default(), 4, 256, 3, Path::new(".")).unwrap();
        let layout = layout(288, 32);
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
    fn drift_moves_shares_once_per_epoch_and_keeps_them_normalized() {
        for spec in [
            ExpertLoadSpec::Zipf {
                exponent: 0.5,
                drift: 0.1,
                epoch_steps: 10,
                concentration: 0.0,
            },
            ExpertLoadSpec::Fitted {
                drift: 0.1,
                epoch_steps: 10,
            },
        ] {
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
}
