//! The per-request routing concentration fitted to the published default-against-perfect EPLB
//! gap (the global cost-model parameters: [`crate::globals`]).

use crate::target::{CalibrationError, Target};
use dstwin_hwmodels::CostModel;
use serde::Serialize;

/// The figure the per-request routing concentration is fitted to (data/expert-load.toml).
#[derive(Clone, Debug, serde::Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EplbGapTarget {
    pub id: String,
    pub source: String,
    /// The target (of the targets file) whose deployment this is.
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

impl EplbGapTarget {
    /// The target whose deployment the gap was measured on (`base`).
    pub fn base_target<'a>(&self, targets: &'a [Target]) -> Result<&'a Target, CalibrationError> {
        targets
            .iter()
            .find(|t| t.id == self.base)
            .ok_or_else(|| CalibrationError::Target {
                id: self.id.clone(),
                message: format!("base target '{}' not found", self.base),
            })
    }
}

/// Predicted default-over-perfect EPLB throughput ratio of the gap target's deployment at a
/// concentration.
pub fn eplb_gap_ratio(
    gap: &EplbGapTarget,
    targets: &[Target],
    cost: &CostModel,
    concentration: f64,
) -> Result<f64, CalibrationError> {
    let base = gap.base_target(targets)?;
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
