//! Calibration targets and their evaluation.

use dstwin_core::features::Features;
use dstwin_core::layout::Layout;
use dstwin_core::model::{builtin, Quant};
use dstwin_hwmodels::{Catalog, CostModel, DType};
use dstwin_twin::explain::{explain, BatchSpec, Explain, ExplainInput, Mtp};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The targets shipped with the crate: every end-to-end anchor as steady steps.
pub const TARGETS: &str = include_str!("../data/targets.toml");

/// What a target compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    TpotMs,
    /// The whole step, ms (offline runs that report their step latency).
    StepMs,
    OutputTokSPerPackage,
    InputTokSPerPackage,
    /// Throughput gain of two micro-batches over the serial step.
    TwoMicrobatchGain,
    /// Output tokens/s per package at the largest batch whose TPOT stays under
    /// `tpot_limit_ms` (the target's `seqs` is the most it may hold).
    OutputTokSPerPackageAtTpot,
}

impl Metric {
    /// The name target files use.
    pub fn name(self) -> &'static str {
        match self {
            Metric::TpotMs => "tpot_ms",
            Metric::StepMs => "step_ms",
            Metric::OutputTokSPerPackage => "output_tok_s_per_package",
            Metric::InputTokSPerPackage => "input_tok_s_per_package",
            Metric::TwoMicrobatchGain => "two_microbatch_gain",
            Metric::OutputTokSPerPackageAtTpot => "output_tok_s_per_package_at_tpot",
        }
    }

    pub fn read(self, e: &Explain) -> f64 {
        match self {
            Metric::TpotMs => e.throughput.tpot_ms.unwrap_or(f64::NAN),
            Metric::StepMs => e.step_ms,
            Metric::OutputTokSPerPackage | Metric::OutputTokSPerPackageAtTpot => {
                e.throughput.output_tok_s_per_package
            }
            Metric::InputTokSPerPackage => e.throughput.input_tok_s_per_package,
            Metric::TwoMicrobatchGain => e.two_microbatch_gain,
        }
    }

    /// Relative error of a prediction. Gains compare the step-time ratios (1 + gain), so a
    /// 5.8% gain predicted as 2.9% is a 2.7% error, not 50%.
    pub fn error(self, predicted: f64, published: f64) -> f64 {
        match self {
            Metric::TwoMicrobatchGain => (1.0 + predicted) / (1.0 + published) - 1.0,
            _ => predicted / published - 1.0,
        }
    }
}

/// The target's fields: its own, the layout's ([`dstwin_core::layout_fields`]), then the
/// batch, MTP and mechanisms it ran.
macro_rules! target_struct {
    (
        { $($head:tt)* } { $($tail:tt)* }
        $( $(#[doc = $ld:literal])* $lf:ident: $lt:ty {$($ls:tt)*} [$($lflag:tt)*], )*
    ) => {
        /// One published figure and the deployment it was measured on, as `explain` options:
        /// one steady step of one instance, every DP rank with the same batch.
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct Target {
            $($head)*
            $( $(#[doc = $ld])* #[serde($($ls)*)] pub $lf: $lt, )*
            $($tail)*
        }

        impl Target {
            /// The deployment's layout ([`dstwin_core::layout::LayoutSpec::layout`]).
            pub fn layout(&self) -> Layout {
                dstwin_core::layout::LayoutSpec { $( $lf: self.$lf.clone(), )* }.layout()
            }
        }
    };
}
dstwin_core::layout_fields!(target_struct! {{
    pub id: String,
    /// The end-to-end anchor (or microbenchmark) this figure belongs to: leave-one-out leaves
    /// out every target of an anchor together.
    pub anchor: String,
    pub source: String,
    pub metric: Metric,
    pub published: f64,
    #[serde(default = "default_model")]
    pub model: String,
    #[serde(default = "default_quant")]
    pub quant: Quant,
    #[serde(default = "default_kv_dtype")]
    pub kv_dtype: DType,
    #[serde(default = "default_hardware")]
    pub hardware: String,
} {
    #[serde(default)]
    pub seqs: u32,
    #[serde(default)]
    pub kv: u64,
    #[serde(default)]
    pub tokens: u64,
    #[serde(default)]
    pub prompt: u64,
    #[serde(default)]
    pub mtp: u32,
    /// Acceptance of each draft given the one before was accepted; or give `mtp_accepted`.
    #[serde(default)]
    pub mtp_accept: Option<f64>,
    /// Mean drafts accepted per step as the source reports it (e.g. 1.44 of 3): the per-draft
    /// acceptance `a` with a + a^2 + ... + a^mtp equal to it is used.
    #[serde(default)]
    pub mtp_accepted: Option<f64>,
    /// Hottest routed die over the mean (1.0: the perfect or forced balance the source ran).
    #[serde(default = "one_f64")]
    pub imbalance: f64,
    /// Engine mechanisms of the run.
    #[serde(default)]
    pub features: Features,
    /// For `output_tok_s_per_package_at_tpot`: the TPOT limit, ms.
    #[serde(default)]
    pub tpot_limit_ms: Option<f64>,
    /// Why this figure is predicted but not fitted (absent: it is fitted): a run the steady
    /// step does not represent, or a model whose op graph is known to lack kernels.
    #[serde(default)]
    pub not_fitted: Option<String>,
}});

fn default_model() -> String {
    "deepseek-r1".into()
}
fn default_quant() -> Quant {
    Quant::W8a8
}
fn default_kv_dtype() -> DType {
    DType::Bf16
}
fn default_hardware() -> String {
    "cloudmatrix384".into()
}
fn one_f64() -> f64 {
    1.0
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TargetFile {
    target: Vec<Target>,
}

#[derive(Debug, Error)]
pub enum CalibrationError {
    #[error("{file}: {message}")]
    Parse { file: String, message: String },
    #[error("target {id}: {message}")]
    Target { id: String, message: String },
}

/// The per-draft acceptance `a` with a + a^2 + ... + a^n = `accepted` (bisection; the sum is
/// increasing in `a`).
pub fn acceptance_for(accepted: f64, n: u32) -> Option<f64> {
    if n == 0 || !(accepted.is_finite() && accepted >= 0.0 && accepted <= n as f64) {
        return None;
    }
    let sum = |a: f64| (1..=n).map(|i| a.powi(i as i32)).sum::<f64>();
    let (mut lo, mut hi) = (0.0, 1.0);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if sum(mid) < accepted {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(0.5 * (lo + hi))
}

/// Parses a target file.
pub fn parse_targets(file: &str, text: &str) -> Result<Vec<Target>, CalibrationError> {
    let targets = toml::from_str::<TargetFile>(text)
        .map(|f| f.target)
        .map_err(|e| CalibrationError::Parse {
            file: file.into(),
            message: e.to_string(),
        })?;
    for t in &targets {
        // Errors are relative to the published figure: zero, negative or not a number would
        // divide by nothing or fit the parameters to noise.
        if !(t.published.is_finite() && t.published > 0.0) {
            return Err(t.err(format!(
                "published {}: must be a positive number ({} as the source reports it)",
                t.published,
                t.metric.name()
            )));
        }
        // As a scenario caps its drafts: the step prices every draft position.
        let max_drafts = dstwin_twin::mtp::MAX_POSITIONS as u32;
        if t.mtp > max_drafts {
            return Err(t.err(format!(
                "mtp {}: at most {max_drafts} draft tokens per step",
                t.mtp
            )));
        }
        match (t.mtp_accept, t.mtp_accepted) {
            (Some(_), Some(_)) => {
                return Err(t.err("give mtp_accept or mtp_accepted, not both"));
            }
            (Some(a), None) if !(0.0..=1.0).contains(&a) => {
                return Err(t.err(format!("mtp_accept {a}: must be a probability in [0, 1]")));
            }
            (None, Some(n)) if acceptance_for(n, t.mtp).is_none() => {
                return Err(t.err(format!(
                    "mtp_accepted {n}: must be between 0 and the {} drafts per step",
                    t.mtp
                )));
            }
            _ => {}
        }
        if !(t.imbalance.is_finite() && t.imbalance >= 1.0) {
            return Err(t.err(format!("imbalance {}: must be at least 1.0", t.imbalance)));
        }
        if t.metric == Metric::OutputTokSPerPackageAtTpot
            && !t.tpot_limit_ms.is_some_and(|l| l.is_finite() && l > 0.0)
        {
            return Err(t.err("output_tok_s_per_package_at_tpot needs a positive tpot_limit_ms"));
        }
    }
    Ok(targets)
}

impl Target {
    fn err(&self, message: impl ToString) -> CalibrationError {
        CalibrationError::Target {
            id: self.id.clone(),
            message: message.to_string(),
        }
    }

    /// The per-draft MTP acceptance of the run.
    pub fn acceptance(&self) -> f64 {
        match (self.mtp_accept, self.mtp_accepted) {
            (Some(a), _) => a,
            (None, Some(n)) => acceptance_for(n, self.mtp).unwrap_or(0.0),
            (None, None) => 0.0,
        }
    }

    /// The `explain` input of this target under cost model `cost`, with `seqs` decoding
    /// sequences per DP rank.
    fn input_with(&self, cost: CostModel, seqs: u32) -> Result<ExplainInput, CalibrationError> {
        let model = builtin(&self.model)
            .ok_or_else(|| self.err(format!("unknown model {}", self.model)))?;
        Ok(ExplainInput {
            model,
            quant: self.quant,
            kv_dtype: self.kv_dtype,
            cost,
            layout: self.layout(),
            batch: BatchSpec {
                decode_seqs: seqs,
                kv_len: self.kv,
                prefill_tokens: self.tokens,
                prompt_len: self.prompt,
                prompt_cached: 0,
            },
            mtp: Mtp {
                tokens: self.mtp,
                acceptance: if self.mtp > 0 {
                    vec![self.acceptance()]
                } else {
                    vec![]
                },
            },
            moe_imbalance: self.imbalance,
            expert_skew: None,
            expert_concentration: 0.0,
            max_tokens_per_step: None,
            features: self.features.clone(),
        })
    }

    /// The `explain` input of this target under cost model `cost`.
    pub fn input(&self, cost: CostModel) -> Result<ExplainInput, CalibrationError> {
        self.input_with(cost, self.seqs)
    }

    /// The base cost model of this target's hardware, from the catalog.
    pub fn base_cost(&self) -> Result<CostModel, CalibrationError> {
        let cat = Catalog::builtin();
        let sys = cat.system(&self.hardware).map_err(|e| self.err(e))?;
        cat.cost_model(sys, None).map_err(|e| self.err(e))
    }

    /// Predicts this target's metric under `cost`.
    pub fn predict(&self, cost: CostModel) -> Result<f64, CalibrationError> {
        if self.metric == Metric::OutputTokSPerPackageAtTpot {
            return self.throughput_at_tpot(cost);
        }
        let e = explain(&self.input(cost)?).map_err(|e| self.err(e))?;
        Ok(self.metric.read(&e))
    }

    /// The throughput at the largest batch (at most `seqs`) whose TPOT stays under the limit:
    /// TPOT grows with the batch, so bisection finds it.
    fn throughput_at_tpot(&self, cost: CostModel) -> Result<f64, CalibrationError> {
        let limit = self.tpot_limit_ms.unwrap_or(f64::INFINITY);
        let at = |n: u32| -> Result<Explain, CalibrationError> {
            explain(&self.input_with(cost.clone(), n)?).map_err(|e| self.err(e))
        };
        let tpot = |e: &Explain| e.throughput.tpot_ms.unwrap_or(f64::INFINITY);
        let first = at(1)?;
        if tpot(&first) >= limit {
            return Ok(0.0);
        }
        // A batch that does not fit in memory is as out of reach as one over the limit.
        let fits = |n: u32| at(n).ok().filter(|e| tpot(e) < limit);
        let (mut lo, mut hi) = (1u32, self.seqs.max(1));
        let mut best = first;
        if let Some(top) = fits(hi) {
            return Ok(top.throughput.output_tok_s_per_package);
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            match fits(mid) {
                Some(e) => {
                    lo = mid;
                    best = e;
                }
                None => hi = mid,
            }
        }
        Ok(best.throughput.output_tok_s_per_package)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped targets with the first published figure replaced by `value`.
    fn with_published(value: &str) -> String {
        let line = TARGETS
            .lines()
            .find(|l| l.trim_start().starts_with("published"))
            .unwrap();
        TARGETS.replacen(line, &format!("published = {value}"), 1)
    }

    #[test]
    fn a_published_figure_must_be_a_positive_number() {
        assert!(parse_targets("t.toml", &with_published("1.5")).is_ok());
        for bad in ["0.0", "-3.0", "nan", "inf"] {
            let e = parse_targets("t.toml", &with_published(bad)).unwrap_err();
            assert!(
                e.to_string().contains("published") && e.to_string().contains("positive"),
                "{bad}: {e}"
            );
        }
    }
}
