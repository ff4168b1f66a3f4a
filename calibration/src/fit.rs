//! Grid-search fit of the global cost-model parameters.

use crate::target::{CalibrationError, Target};
use dstwin_hwmodels::CostModel;
use serde::Serialize;

/// The parameters the fit sets.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Globals {
    pub in_situ_efficiency: f64,
    pub overlap_efficiency: f64,
}

impl Globals {
    pub fn apply(self, base: &CostModel) -> CostModel {
        let mut c = base.clone();
        c.params.in_situ_efficiency = self.in_situ_efficiency;
        c.params.overlap_efficiency = self.overlap_efficiency;
        c
    }

    pub fn of(c: &CostModel) -> Globals {
        Globals {
            in_situ_efficiency: c.params.in_situ_efficiency,
            overlap_efficiency: c.params.overlap_efficiency,
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

/// Searches `in_situ_efficiency` in [0.30, 1.00] and `overlap_efficiency` in [0, 1] on a grid of
/// `step`, minimizing the sum of squared relative errors over `targets`, then refines around the
/// best point at a tenth of the step.
pub fn fit(targets: &[Target], step: f64) -> Result<Fit, CalibrationError> {
    let grid = |lo: f64, hi: f64, st: f64| -> Vec<f64> {
        let n = ((hi - lo) / st).round() as usize;
        (0..=n).map(|i| (lo + i as f64 * st).min(hi)).collect()
    };
    let mut best: Option<(f64, Globals)> = None;
    let mut evaluated = 0;
    let mut search = |xs: &[f64],
                      ys: &[f64],
                      best: &mut Option<(f64, Globals)>|
     -> Result<(), CalibrationError> {
        for &x in xs {
            for &y in ys {
                let g = Globals {
                    in_situ_efficiency: x,
                    overlap_efficiency: y,
                };
                let l = loss(&residuals(targets, g)?);
                evaluated += 1;
                if best.is_none_or(|(b, _)| l < b) {
                    *best = Some((l, g));
                }
            }
        }
        Ok(())
    };
    search(&grid(0.30, 1.0, step), &grid(0.0, 1.0, step), &mut best)?;
    let (_, g) = best.expect("non-empty grid");
    let fine = step / 10.0;
    let around = |v: f64, lo: f64, hi: f64| grid((v - step).max(lo), (v + step).min(hi), fine);
    search(
        &around(g.in_situ_efficiency, 0.30, 1.0),
        &around(g.overlap_efficiency, 0.0, 1.0),
        &mut best,
    )?;
    let (l, globals) = best.expect("non-empty grid");
    let residuals = residuals(targets, globals)?;
    Ok(Fit {
        globals,
        rms_error: (l / residuals.len() as f64).sqrt(),
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
    skewed.expert_skew = Some((gap.skew, dstwin_engine::eplb::Policy::Greedy));
    skewed.expert_concentration = concentration;
    let read = |i: &dstwin_sim::explain::ExplainInput| -> Result<f64, CalibrationError> {
        let e = dstwin_sim::explain::explain(i).map_err(|e| CalibrationError::Target {
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
