//! Grid-search fit of the global cost-model parameters.

use crate::target::{CalibrationError, Target};
use dstwin_hwmodels::CostModel;
use serde::Serialize;

/// The parameters the fit sets.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Globals {
    pub in_situ_efficiency: f64,
    pub overlap_efficiency_low_latency: f64,
    pub overlap_efficiency_normal: f64,
}

impl Globals {
    /// Names, in the order of `values`.
    pub const NAMES: [&'static str; 3] = [
        "in_situ_efficiency",
        "overlap_efficiency_low_latency",
        "overlap_efficiency_normal",
    ];
    /// The range each parameter is searched in.
    const BOUNDS: [(f64, f64); 3] = [(0.30, 1.0), (0.0, 1.0), (0.0, 1.0)];

    pub fn values(self) -> [f64; 3] {
        [
            self.in_situ_efficiency,
            self.overlap_efficiency_low_latency,
            self.overlap_efficiency_normal,
        ]
    }

    fn from_values(v: [f64; 3]) -> Globals {
        Globals {
            in_situ_efficiency: v[0],
            overlap_efficiency_low_latency: v[1],
            overlap_efficiency_normal: v[2],
        }
    }

    pub fn apply(self, base: &CostModel) -> CostModel {
        let mut c = base.clone();
        c.params.in_situ_efficiency = self.in_situ_efficiency;
        c.params.overlap_efficiency_low_latency = self.overlap_efficiency_low_latency;
        c.params.overlap_efficiency_normal = self.overlap_efficiency_normal;
        c
    }

    pub fn of(c: &CostModel) -> Globals {
        Globals {
            in_situ_efficiency: c.params.in_situ_efficiency,
            overlap_efficiency_low_latency: c.params.overlap_efficiency_low_latency,
            overlap_efficiency_normal: c.params.overlap_efficiency_normal,
        }
    }
}

/// A target's prediction and error under a parameter set.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Residual {
    pub id: String,
    pub metric: crate::target::Metric,
    pub published: f64,
    pub predicted: f64,
    /// Relative error (see `Metric::error`).
    pub error: f64,
}

/// Predictions and errors of every target under `g`.
pub fn residuals(targets: &[Target], g: Globals) -> Result<Vec<Residual>, CalibrationError> {
    targets
        .iter()
        .map(|t| {
            let predicted = t.predict(g.apply(&t.base_cost()?))?;
            Ok(Residual {
                id: t.id.clone(),
                metric: t.metric,
                published: t.published,
                predicted,
                error: t.metric.error(predicted, t.published),
            })
        })
        .collect()
}

fn loss(r: &[Residual]) -> f64 {
    r.iter().map(|x| x.error * x.error).sum()
}

/// The result of a fit.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fit {
    pub globals: Globals,
    pub residuals: Vec<Residual>,
    /// Root mean square of the relative errors.
    pub rms_error: f64,
    pub evaluated: usize,
}

/// Minimizes the sum of squared relative errors over `targets` by coordinate search: each
/// parameter in turn is set to the best point of a grid of `step` over its range (the others
/// held), until a whole round changes nothing; then the same at a tenth of the step within one
/// coarse step of the optimum. Decode targets depend on the low-latency overlap and prefill
/// targets on the normal one, so the search mostly trades `in_situ_efficiency` between them.
pub fn fit(targets: &[Target], step: f64) -> Result<Fit, CalibrationError> {
    if !(crate::target::STEP_RANGE.0..=crate::target::STEP_RANGE.1).contains(&step) {
        return Err(CalibrationError::Step { step });
    }
    let grid = |lo: f64, hi: f64, st: f64| -> Vec<f64> {
        let n = ((hi - lo) / st).round() as usize;
        (0..=n).map(|i| (lo + i as f64 * st).min(hi)).collect()
    };
    let mut evaluated = 0;
    let mut eval = |v: [f64; 3]| -> Result<f64, CalibrationError> {
        evaluated += 1;
        Ok(loss(&residuals(targets, Globals::from_values(v))?))
    };
    // Start in the middle of every range.
    let mut x = Globals::BOUNDS.map(|(lo, hi)| lo + ((hi - lo) / 2.0 / step).round() * step);
    let mut best = eval(x)?;
    for (st, window) in [(step, None), (step / 10.0, Some(step))] {
        let centre = x;
        for _round in 0..50 {
            let mut changed = false;
            for (i, &(lo, hi)) in Globals::BOUNDS.iter().enumerate() {
                let (lo, hi) = match window {
                    Some(w) => ((centre[i] - w).max(lo), (centre[i] + w).min(hi)),
                    None => (lo, hi),
                };
                for v in grid(lo, hi, st) {
                    if v == x[i] {
                        continue;
                    }
                    let mut y = x;
                    y[i] = v;
                    let l = eval(y)?;
                    if l < best {
                        (best, x, changed) = (l, y, true);
                    }
                }
            }
            if !changed {
                break;
            }
        }
    }
    let globals = Globals::from_values(x);
    let residuals = residuals(targets, globals)?;
    Ok(Fit {
        globals,
        rms_error: (best / residuals.len() as f64).sqrt(),
        residuals,
        evaluated,
    })
}

/// The figure the per-request routing concentration is fitted to (data/expert-load.toml).
#[derive(Clone, Debug, serde::Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EplbGapTarget {
    pub id: String,
    pub source: String,
    /// The target of the cloudmatrix384 file whose deployment this is.
    pub base: String,
    pub default_eplb: f64,
    pub perfect_eplb: f64,
    /// Zipf exponent of the mean load.
    pub skew: f64,
}

/// The shipped expert-load target.
pub const EXPERT_LOAD: &str = include_str!("../data/expert-load.toml");

/// The fitted concentration and what it predicts.
#[derive(Clone, Debug, Serialize)]
pub struct ConcentrationFit {
    pub id: String,
    pub concentration: f64,
    /// Default over perfect EPLB throughput: published and predicted.
    pub published_ratio: f64,
    pub predicted_ratio: f64,
}

/// Predicted default-over-perfect EPLB throughput ratio of the gap target's deployment at a
/// concentration.
pub fn eplb_gap_ratio(
    gap: &EplbGapTarget,
    targets: &[Target],
    cost: &CostModel,
    concentration: f64,
) -> Result<f64, CalibrationError> {
    let base =
        targets
            .iter()
            .find(|t| t.id == gap.base)
            .ok_or_else(|| CalibrationError::Target {
                id: gap.id.clone(),
                message: format!("base target '{}' not found", gap.base),
            })?;
    let perfect = base.input(cost.clone())?;
    let mut skewed = perfect.clone();
    skewed.expert_skew = Some((gap.skew, dstwin_core::eplb::Policy::Greedy));
    skewed.expert_concentration = concentration;
    let read = |i: &dstwin_twin::explain::ExplainInput| -> Result<f64, CalibrationError> {
        let e = dstwin_twin::explain::explain(i).map_err(|e| CalibrationError::Target {
            id: gap.id.clone(),
            message: e.to_string(),
        })?;
        Ok(base.metric.read(&e))
    };
    Ok(read(&skewed)? / read(&perfect)?)
}

/// Bisects the concentration (fewer experts per request as it falls, so a lower throughput
/// ratio) until the predicted ratio matches the published one.
pub fn fit_concentration(
    gap: &EplbGapTarget,
    targets: &[Target],
    cost: &CostModel,
) -> Result<ConcentrationFit, CalibrationError> {
    let want = gap.default_eplb / gap.perfect_eplb;
    let (mut lo, mut hi) = (0.01f64, 1e5f64);
    for _ in 0..60 {
        let mid = (lo * hi).sqrt();
        if eplb_gap_ratio(gap, targets, cost, mid)? < want {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let concentration = (lo * hi).sqrt();
    Ok(ConcentrationFit {
        id: gap.id.clone(),
        concentration,
        published_ratio: want,
        predicted_ratio: eplb_gap_ratio(gap, targets, cost, concentration)?,
    })
}

/// Parses the expert-load target file.
pub fn parse_eplb_gap(file: &str, text: &str) -> Result<EplbGapTarget, CalibrationError> {
    toml::from_str(text).map_err(|e| CalibrationError::Parse {
        file: file.into(),
        message: e.to_string(),
    })
}
