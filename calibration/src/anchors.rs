//! The end-to-end anchors as shipped scenarios: which scenario reproduces which published run,
//! the figures it is compared on, and their documented regression bounds.

use dstwin_core::layout::Role;
use dstwin_sim::run::{run as simulate, RunOptions, SimReport};
use dstwin_sim::scenario::{load_str, Scenario};
use serde::{Deserialize, Serialize};
use std::path::Path;
use thiserror::Error;

/// The index of anchor runs shipped with the crate.
pub const ANCHOR_RUNS: &str = include_str!("../data/anchor-scenarios.toml");

/// The shipped anchor scenarios, by file name.
const SCENARIOS: [(&str, &str); 4] = [
    (
        "cm384-decode-b96.toml",
        include_str!("../../sim/scenarios/anchors/cm384-decode-b96.toml"),
    ),
    (
        "cm384-prefill.toml",
        include_str!("../../sim/scenarios/anchors/cm384-prefill.toml"),
    ),
    (
        "huawei-cm384-decode.toml",
        include_str!("../../sim/scenarios/anchors/huawei-cm384-decode.toml"),
    ),
    (
        "huawei-a2-decode.toml",
        include_str!("../../sim/scenarios/anchors/huawei-a2-decode.toml"),
    ),
];

#[derive(Debug, Error)]
pub enum AnchorError {
    #[error("{file}: {message}")]
    Parse { file: String, message: String },
    #[error("anchor run {run}: scenario {scenario:?} is not shipped (known: {known})")]
    UnknownScenario {
        run: String,
        scenario: String,
        known: String,
    },
    #[error("anchor run {run}: {message}")]
    Run { run: String, message: String },
}

/// What a published figure measures, read from a simulation report: latencies over the
/// measured requests (after any warm-up), throughputs over the measured time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunMetric {
    TtftMeanMs,
    TtftP50Ms,
    TtftP90Ms,
    TtftP99Ms,
    TpotMeanMs,
    /// Median TPOT of the measured requests, ms.
    TpotP50Ms,
    TpotP90Ms,
    TpotP99Ms,
    ItlMeanMs,
    ItlP50Ms,
    E2eMeanMs,
    E2eP50Ms,
    /// Finished requests per second.
    RequestS,
    /// Output tokens/s of the whole deployment.
    OutputTokS,
    /// Prompt tokens/s of the whole deployment.
    InputTokS,
    /// Prompt and output tokens/s of the whole deployment.
    TotalTokS,
    /// Output tokens/s per card of every instance.
    OutputTokSPerCard,
    /// Prompt and output tokens/s per card of every instance.
    TotalTokSPerCard,
    /// Output tokens/s per card of the decode instances.
    OutputTokSPerDecodeCard,
    /// Prompt tokens/s per card of the prefill instances.
    InputTokSPerPrefillCard,
}

impl RunMetric {
    /// Every metric, in the order reports list them.
    pub const ALL: [RunMetric; 20] = [
        RunMetric::TtftMeanMs,
        RunMetric::TtftP50Ms,
        RunMetric::TtftP90Ms,
        RunMetric::TtftP99Ms,
        RunMetric::TpotMeanMs,
        RunMetric::TpotP50Ms,
        RunMetric::TpotP90Ms,
        RunMetric::TpotP99Ms,
        RunMetric::ItlMeanMs,
        RunMetric::ItlP50Ms,
        RunMetric::E2eMeanMs,
        RunMetric::E2eP50Ms,
        RunMetric::RequestS,
        RunMetric::OutputTokS,
        RunMetric::InputTokS,
        RunMetric::TotalTokS,
        RunMetric::OutputTokSPerCard,
        RunMetric::TotalTokSPerCard,
        RunMetric::OutputTokSPerDecodeCard,
        RunMetric::InputTokSPerPrefillCard,
    ];

    pub fn name(self) -> &'static str {
        match self {
            RunMetric::TtftMeanMs => "ttft_mean_ms",
            RunMetric::TtftP50Ms => "ttft_p50_ms",
            RunMetric::TtftP90Ms => "ttft_p90_ms",
            RunMetric::TtftP99Ms => "ttft_p99_ms",
            RunMetric::TpotMeanMs => "tpot_mean_ms",
            RunMetric::TpotP50Ms => "tpot_p50_ms",
            RunMetric::TpotP90Ms => "tpot_p90_ms",
            RunMetric::TpotP99Ms => "tpot_p99_ms",
            RunMetric::ItlMeanMs => "itl_mean_ms",
            RunMetric::ItlP50Ms => "itl_p50_ms",
            RunMetric::E2eMeanMs => "e2e_mean_ms",
            RunMetric::E2eP50Ms => "e2e_p50_ms",
            RunMetric::RequestS => "request_s",
            RunMetric::OutputTokS => "output_tok_s",
            RunMetric::InputTokS => "input_tok_s",
            RunMetric::TotalTokS => "total_tok_s",
            RunMetric::OutputTokSPerCard => "output_tok_s_per_card",
            RunMetric::TotalTokSPerCard => "total_tok_s_per_card",
            RunMetric::OutputTokSPerDecodeCard => "output_tok_s_per_decode_card",
            RunMetric::InputTokSPerPrefillCard => "input_tok_s_per_prefill_card",
        }
    }

    /// The figure in a report; NaN when the run has none (no request finished, no such role).
    pub fn read(self, r: &SimReport) -> f64 {
        let cards = |role: Option<Role>| {
            let dies: u32 = r
                .instances
                .iter()
                .filter(|i| role.is_none_or(|role| i.role == role))
                .map(|i| i.dies)
                .sum();
            dies as f64 * r.cards / r.dies.max(1) as f64
        };
        let per = |x: f64, c: f64| if c > 0.0 { x / c } else { f64::NAN };
        let l = &r.latency;
        let total = r.input_tok_s + r.output_tok_s;
        let finished = |x: f64| {
            if l.ttft_ms.count > 0 {
                x
            } else {
                f64::NAN
            }
        };
        match self {
            RunMetric::TtftMeanMs => finished(l.ttft_ms.mean),
            RunMetric::TtftP50Ms => finished(l.ttft_ms.p50),
            RunMetric::TtftP90Ms => finished(l.ttft_ms.p90),
            RunMetric::TtftP99Ms => finished(l.ttft_ms.p99),
            RunMetric::TpotMeanMs => finished(l.tpot_ms.mean),
            RunMetric::TpotP50Ms => l.tpot_ms.p50,
            RunMetric::TpotP90Ms => finished(l.tpot_ms.p90),
            RunMetric::TpotP99Ms => finished(l.tpot_ms.p99),
            RunMetric::ItlMeanMs => finished(l.itl_ms.mean),
            RunMetric::ItlP50Ms => finished(l.itl_ms.p50),
            RunMetric::E2eMeanMs => finished(l.e2e_ms.mean),
            RunMetric::E2eP50Ms => finished(l.e2e_ms.p50),
            RunMetric::RequestS => r.request_throughput,
            RunMetric::OutputTokS => r.output_tok_s,
            RunMetric::InputTokS => r.input_tok_s,
            RunMetric::TotalTokS => total,
            RunMetric::OutputTokSPerCard => per(r.output_tok_s, cards(None)),
            RunMetric::TotalTokSPerCard => per(total, cards(None)),
            RunMetric::OutputTokSPerDecodeCard => per(r.output_tok_s, cards(Some(Role::Decode))),
            RunMetric::InputTokSPerPrefillCard => per(r.input_tok_s, cards(Some(Role::Prefill))),
        }
    }
}

/// One published figure of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Figure {
    pub metric: RunMetric,
    pub published: f64,
    /// Documented bound on |predicted / published - 1| (the regression guard).
    pub bound: f64,
}

/// One simulation of a shipped anchor scenario and the figures it is compared on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnchorRun {
    /// The anchor's id in the calibration anchors (e2e section).
    pub anchor: String,
    /// Which reading of the anchor this run is (several runs may share an anchor).
    #[serde(default)]
    pub variant: Option<String>,
    /// File name under sim/scenarios/anchors/.
    pub scenario: String,
    /// Scenario overrides, as `--set PATH=VALUE`.
    #[serde(default)]
    pub set: Vec<String>,
    pub source: String,
    /// The TPOT limit the published throughput was measured under, ms: the scenario's batch is
    /// the largest whose simulated median TPOT stays under it (a modelling choice the tests
    /// re-check).
    #[serde(default)]
    pub tpot_limit_ms: Option<f64>,
    pub figures: Vec<Figure>,
}

impl AnchorRun {
    /// The run's label: the anchor id, and the variant if any.
    pub fn label(&self) -> String {
        match &self.variant {
            Some(v) => format!("{} ({v})", self.anchor),
            None => self.anchor.clone(),
        }
    }

    /// The scenario this run simulates, overrides applied.
    pub fn scenario(&self) -> Result<Scenario, AnchorError> {
        shipped_scenario(&SCENARIOS, &self.label(), &self.scenario, &self.set)
    }

    /// Simulates the run and reads its figures.
    pub fn evaluate(&self) -> Result<Evaluated, AnchorError> {
        self.evaluate_with(None)
    }

    /// Simulates the run with `values` applied to its cost model when it is the one named, and
    /// reads its figures.
    pub fn evaluate_with(
        &self,
        values: Option<(&str, &crate::globals::Values)>,
    ) -> Result<Evaluated, AnchorError> {
        let mut s = self.scenario()?;
        if let Some((name, v)) = values {
            if s.cost.params.name == name {
                s.cost = v.apply(&s.cost);
            }
        }
        let r = simulate(&s, RunOptions::default()).map_err(|e| AnchorError::Run {
            run: self.label(),
            message: e.to_string(),
        })?;
        Ok(Evaluated {
            run: self.label(),
            scenario: self.scenario.clone(),
            set: self.set.clone(),
            tpot_p50_ms: r.report.latency.tpot_ms.p50,
            tpot_limit_ms: self.tpot_limit_ms,
            figures: self.figures_of(&r.report),
        })
    }

    /// The run's figures in a report of its scenario.
    pub fn figures_of(&self, r: &SimReport) -> Vec<FigureResult> {
        self.figures
            .iter()
            .map(|f| {
                let predicted = f.metric.read(r);
                FigureResult {
                    run: self.label(),
                    metric: f.metric,
                    published: f.published,
                    predicted,
                    error: predicted / f.published - 1.0,
                    bound: f.bound,
                }
            })
            .collect()
    }
}

/// The text of `file` in a table of shipped scenarios (file name, text); `run` names the run
/// that asks in the error.
pub(crate) fn shipped_text<'a>(
    table: &[(&str, &'a str)],
    run: &str,
    file: &str,
) -> Result<&'a str, AnchorError> {
    table
        .iter()
        .find(|(f, _)| *f == file)
        .map(|(_, t)| *t)
        .ok_or_else(|| AnchorError::UnknownScenario {
            run: run.to_string(),
            scenario: file.to_string(),
            known: table.iter().map(|(f, _)| *f).collect::<Vec<_>>().join(", "),
        })
}

/// `file` of a table of shipped scenarios, loaded with the overrides `sets`.
pub(crate) fn shipped_scenario(
    table: &[(&str, &str)],
    run: &str,
    file: &str,
    sets: &[String],
) -> Result<Scenario, AnchorError> {
    let text = shipped_text(table, run, file)?;
    load_str(file, text, Path::new("."), sets).map_err(|e| AnchorError::Run {
        run: run.to_string(),
        message: e.to_string(),
    })
}

/// A simulated anchor run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Evaluated {
    pub run: String,
    pub scenario: String,
    pub set: Vec<String>,
    pub tpot_p50_ms: f64,
    pub tpot_limit_ms: Option<f64>,
    pub figures: Vec<FigureResult>,
}

impl Evaluated {
    /// Whether the median TPOT keeps to the run's limit (true when it has none).
    pub fn within_tpot_limit(&self) -> bool {
        self.tpot_limit_ms.is_none_or(|l| self.tpot_p50_ms < l)
    }
}

/// A figure compared.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FigureResult {
    pub run: String,
    pub metric: RunMetric,
    pub published: f64,
    pub predicted: f64,
    /// predicted / published - 1 (NaN when the run produced no figure).
    pub error: f64,
    pub bound: f64,
}

impl FigureResult {
    /// Whether the error is within the documented bound (a missing figure never is).
    pub fn within_bound(&self) -> bool {
        self.error.abs() <= self.bound
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Index {
    run: Vec<AnchorRun>,
}

/// Parses an anchor-run index (`file` names it in errors); every run must name a shipped
/// scenario, every figure a positive published value and bound.
pub fn parse_runs(file: &str, text: &str) -> Result<Vec<AnchorRun>, AnchorError> {
    let parse = |message: String| AnchorError::Parse {
        file: file.to_string(),
        message,
    };
    let idx: Index = toml::from_str(text).map_err(|e| parse(e.to_string()))?;
    for r in &idx.run {
        shipped_text(&SCENARIOS, &r.label(), &r.scenario)?;
        if r.figures.is_empty() {
            return Err(parse(format!("run {}: figures is empty", r.label())));
        }
        for f in &r.figures {
            if !(f.published.is_finite() && f.published > 0.0) {
                return Err(parse(format!(
                    "run {}: {} published = {}: must be positive",
                    r.label(),
                    f.metric.name(),
                    f.published
                )));
            }
            if !(f.bound.is_finite() && f.bound > 0.0) {
                return Err(parse(format!(
                    "run {}: {} bound = {}: must be a positive fraction",
                    r.label(),
                    f.metric.name(),
                    f.bound
                )));
            }
        }
    }
    Ok(idx.run)
}

/// The shipped anchor runs.
pub fn builtin_runs() -> Result<Vec<AnchorRun>, AnchorError> {
    parse_runs("anchor-scenarios.toml", ANCHOR_RUNS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_run_parses_and_loads_its_scenario() {
        let runs = builtin_runs().unwrap();
        assert_eq!(runs.len(), 5);
        for r in &runs {
            let s = r.scenario().unwrap();
            assert!(
                s.warmup.as_secs_f64() > 0.0,
                "{}: measures after a warm-up",
                r.label()
            );
        }
        // Every shipped scenario is used by some run.
        for (f, _) in SCENARIOS {
            assert!(runs.iter().any(|r| r.scenario == f), "{f} unused");
        }
    }

    #[test]
    fn bad_indexes_name_the_field() {
        let bad = ANCHOR_RUNS.replacen("published = 49.4", "published = -1", 1);
        let e = parse_runs("x.toml", &bad).unwrap_err().to_string();
        assert!(e.contains("tpot_p50_ms published = -1"), "{e}");
        let bad = ANCHOR_RUNS.replacen("cm384-prefill.toml", "nope.toml", 1);
        let e = parse_runs("x.toml", &bad).unwrap_err().to_string();
        assert!(
            e.contains("nope.toml") && e.contains("cm384-prefill.toml"),
            "{e}"
        );
        let bad = ANCHOR_RUNS.replacen("bound = 0.06", "bound = 0.06, tolerance = 1", 1);
        let e = parse_runs("x.toml", &bad).unwrap_err().to_string();
        assert!(e.contains("tolerance"), "{e}");
    }
}
