//! Calibration targets and their evaluation.

use dstwin_core::layout::{Layout, Role};
use dstwin_core::model::{builtin, Quant};
use dstwin_hwmodels::{Catalog, CostModel, DType};
use dstwin_twin::explain::{explain, BatchSpec, Explain, ExplainInput, Mtp};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The CloudMatrix384 targets shipped with the crate.
pub const CLOUDMATRIX384: &str = include_str!("../data/cloudmatrix384.toml");

/// What a target compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    TpotMs,
    OutputTokSPerPackage,
    InputTokSPerPackage,
    /// Throughput gain of two micro-batches over the serial step.
    TwoMicrobatchGain,
}

impl Metric {
    /// The name target files use.
    pub fn name(self) -> &'static str {
        match self {
            Metric::TpotMs => "tpot_ms",
            Metric::OutputTokSPerPackage => "output_tok_s_per_package",
            Metric::InputTokSPerPackage => "input_tok_s_per_package",
            Metric::TwoMicrobatchGain => "two_microbatch_gain",
        }
    }

    pub fn read(self, e: &Explain) -> f64 {
        match self {
            Metric::TpotMs => e.throughput.tpot_ms.unwrap_or(f64::NAN),
            Metric::OutputTokSPerPackage => e.throughput.output_tok_s_per_package,
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

/// One published figure and the deployment it was measured on, as `explain` options.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    pub id: String,
    pub source: String,
    pub metric: Metric,
    pub published: f64,
    #[serde(default = "default_model")]
    pub model: String,
    #[serde(default = "default_quant")]
    pub quant: Quant,
    #[serde(default = "default_hardware")]
    pub hardware: String,
    pub role: Role,
    pub dies: u32,
    #[serde(default)]
    pub redundant_experts: u32,
    #[serde(default)]
    pub shared_expert_dies: u32,
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
    #[serde(default)]
    pub mtp_accept: f64,
}

fn default_model() -> String {
    "deepseek-r1".into()
}
fn default_quant() -> Quant {
    Quant::W8a8
}
fn default_hardware() -> String {
    "cloudmatrix384".into()
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
    #[error("fit step {step}: must be in [{min}, {max}] (finer grids only multiply the evaluations)", min = STEP_RANGE.0, max = STEP_RANGE.1)]
    Step { step: f64 },
}

/// The grid steps `fit` accepts. The coarse grid of a parameter in [0, 1] has 1 / step points
/// and is refined at a tenth of the step, so 0.001 already resolves 0.0001 (far below the
/// targets' own precision of a few percent); 0.5 is the coarsest grid with a middle point.
pub const STEP_RANGE: (f64, f64) = (0.001, 0.5);

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
        if !(0.0..=1.0).contains(&t.mtp_accept) {
            return Err(t.err(format!(
                "mtp_accept {}: must be a probability in [0, 1]",
                t.mtp_accept
            )));
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

    /// The `explain` input of this target under cost model `cost`.
    pub fn input(&self, cost: CostModel) -> Result<ExplainInput, CalibrationError> {
        let model = builtin(&self.model)
            .ok_or_else(|| self.err(format!("unknown model {}", self.model)))?;
        Ok(ExplainInput {
            model,
            quant: self.quant,
            kv_dtype: DType::Bf16,
            cost,
            layout: Layout {
                redundant_experts: self.redundant_experts,
                shared_expert_dies: self.shared_expert_dies,
                ..Layout::dp_ep(self.role, self.dies)
            },
            batch: BatchSpec {
                decode_seqs: self.seqs,
                kv_len: self.kv,
                prefill_tokens: self.tokens,
                prompt_len: self.prompt,
            },
            mtp: Mtp {
                tokens: self.mtp,
                acceptance: if self.mtp > 0 {
                    vec![self.mtp_accept]
                } else {
                    vec![]
                },
            },
            moe_imbalance: 1.0,
            expert_skew: None,
            expert_concentration: 0.0,
            max_tokens_per_step: None,
        })
    }

    /// The base cost model of this target's hardware, from the catalog.
    pub fn base_cost(&self) -> Result<CostModel, CalibrationError> {
        let cat = Catalog::builtin();
        let sys = cat.system(&self.hardware).map_err(|e| self.err(e))?;
        cat.cost_model(sys, None).map_err(|e| self.err(e))
    }

    /// Predicts this target's metric under `cost`.
    pub fn predict(&self, cost: CostModel) -> Result<f64, CalibrationError> {
        let e = explain(&self.input(cost)?).map_err(|e| self.err(e))?;
        Ok(self.metric.read(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped targets with the first published figure replaced by `value`.
    fn with_published(value: &str) -> String {
        let line = CLOUDMATRIX384
            .lines()
            .find(|l| l.trim_start().starts_with("published"))
            .unwrap();
        CLOUDMATRIX384.replacen(line, &format!("published = {value}"), 1)
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

    #[test]
    fn the_fit_refuses_a_step_outside_its_range() {
        let targets = parse_targets("c", CLOUDMATRIX384).unwrap();
        for step in [0.0, 1e-20, 1e-10, -0.1, 0.6, f64::NAN] {
            let e = crate::fit::fit(&targets, step).unwrap_err();
            assert!(e.to_string().contains("[0.001, 0.5]"), "{step}: {e}");
        }
    }
}
