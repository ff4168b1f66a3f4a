//! The end-to-end validation suite: published serving runs, each written as a shipped scenario
//! from the run's own launch flags and benchmark command (`sim/scenarios/e2e/`), simulated as a
//! whole serving run and compared figure by figure with what the source published.
//!
//! Validation only: nothing is fitted to these runs. The index (`sim/scenarios/e2e/runs.toml`)
//! says where each figure comes from and how its source defines it; the scenario file says
//! every assumption its reading makes and the launch flags the twin cannot express.

use crate::anchors::{shipped_scenario, shipped_text, AnchorError, RunMetric};
use dstwin_sim::run::{run as simulate, RunOptions};
use dstwin_sim::scenario::Scenario;
use dstwin_sim::uncertainty::{perturbed, Interval};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// The index of the end-to-end runs.
pub const E2E_RUNS: &str = include_str!("../../sim/scenarios/e2e/runs.toml");

macro_rules! shipped {
    ($($file:literal),* $(,)?) => {
        &[$(($file, include_str!(concat!("../../sim/scenarios/e2e/", $file)))),*]
    };
}

/// The end-to-end scenarios, by file name (every `.toml` of `sim/scenarios/e2e/` but the index;
/// `tests/e2e.rs` checks the list against the folder).
pub const E2E_SCENARIOS: &[(&str, &str)] = shipped![
    "hopper-deepseek-h800-decode-ep144.toml",
    "hopper-gpustack-h200-sglang-tp8-rand2k.toml",
    "hopper-gpustack-h200-sglang-tp8-rand4k.toml",
    "hopper-gpustack-h200-vllm-tp8-rand4k.toml",
    "hopper-sglang-h100-decode-ep72.toml",
    "hopper-sglang-h100-prefill-ep32-2k.toml",
    "hopper-sglang-h100-prefill-ep32-4k.toml",
    "sglang-a3-r1-lowlat-3k5-1k.toml",
    "sglang-a3-r1-lowlat-3k5-1k5.toml",
    "sglang-a3-r1-lowlat-3k9-1k.toml",
    "sglang-a3-r1-lowlat-6k-1k6.toml",
    "sglang-a3-r1-w4a8-16c-pd-2k-2k.toml",
    "sglang-a3-r1-w4a8-16c-pd-3k5-1k5.toml",
    "sglang-a3-r1-w4a8-8c-mixed-2k-2k.toml",
    "sglang-a3-r1-w4a8-8c-mixed-3k5-1k5.toml",
    "sglang-a3-r1-w8a8-32c-pd-3k5-1k5.toml",
    "sglang-a3-v32-w8a8-32c-pd-64k-3k.toml",
    "vaa-nightly-r1-0528-quarot-a3-dp2tp8.toml",
    "vaa-nightly-r1-0528-w8a8-a3-dp2tp8-aclgraph.toml",
    "vaa-nightly-r1-0528-w8a8-a3-prefix0-prefill.toml",
    "vaa-nightly-v31-bf16-a3-dp4tp8-2node.toml",
    "vaa-nightly-v32-w8a8-a3-dcp8-2node.toml",
    "vaa-nightly-v32-w8a8-a3-dp2tp8-1node.toml",
    "vaa-nightly-v32-w8a8-a3-dp4tp8-2node.toml",
    "vaa-nightly-v32-w8a8-a3-pd-1p1d-long64k.toml",
    "vaa-nightly-v32-w8a8-a3-pd-1p1d-short.toml",
    "vaa-nightly-v4-flash-w8a8-a3-dp4tp4-32k.toml",
    "vaa-tut-v31-a3-2p1d-3k5-1k5.toml",
    "vaa-tut-v31t-a3-2p1d-3k5-1k5-ci.toml",
    "vaa-tut-v32-a3-1p1d-64k-3k-d1.toml",
    "vaa-tut-v32-a3-1p1d-64k-3k-d4.toml",
    "vaa-tut-v32-a3-mixed-32k-ci.toml",
    "vaa-tut-v32-a3-mixed-64k-ci.toml",
    "vaa-tut-v4flash-a3-1p1d-3k5-1k5-bs100-ci.toml",
    "vaa-tut-v4flash-a3-1p1d-3k5-1k5-bs1024-ci.toml",
];

/// One published figure of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct E2eFigure {
    pub metric: RunMetric,
    pub published: f64,
    /// How the source defines the figure (its benchmark client's metric).
    pub definition: String,
}

/// A published serving run and the figures it is compared on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct E2eRun {
    /// Unique; the scenario file's stem.
    pub name: String,
    /// File name under sim/scenarios/e2e/.
    pub scenario: String,
    /// Where the run and its figures are published.
    pub source: String,
    /// Scenario overrides, as `--set PATH=VALUE` (a variant of a shared scenario).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<String>,
    /// The calibration anchor this run's figures were also fitted to, if any: such a run is
    /// shown but left out of the suite's summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_sample: Option<String>,
    pub figures: Vec<E2eFigure>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Index {
    #[serde(default)]
    run: Vec<E2eRun>,
}

/// One figure compared.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct E2eResult {
    pub run: String,
    pub metric: RunMetric,
    pub published: f64,
    pub predicted: f64,
    /// predicted / published - 1 (NaN when the run produced no such figure).
    pub error: f64,
    pub in_sample: bool,
    /// The 10th and 90th percentiles of the figure over draws of what the scenario leaves
    /// unknown (`dstwin_sim::uncertainty`); absent without draws.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval: Option<Interval>,
}

impl E2eRun {
    /// The run's scenario, overrides applied.
    pub fn scenario(&self) -> Result<Scenario, AnchorError> {
        shipped_scenario(E2E_SCENARIOS, &self.name, &self.scenario, &self.set)
    }

    /// Simulates the whole run and compares its figures.
    pub fn evaluate(&self) -> Result<Vec<E2eResult>, AnchorError> {
        let s = self.scenario()?;
        Ok(self.compare(&self.predict(&s, 0)?, None))
    }

    /// The run's figures in draw `k` of its scenario (`dstwin_sim::uncertainty`; 0: as given).
    fn predict(&self, s: &Scenario, k: u64) -> Result<Vec<f64>, AnchorError> {
        let r =
            simulate(&perturbed(s, k), RunOptions::default()).map_err(|e| AnchorError::Run {
                run: self.name.clone(),
                message: e.to_string(),
            })?;
        Ok(self
            .figures
            .iter()
            .map(|f| f.metric.read(&r.report))
            .collect())
    }

    /// The figures compared: `predicted` in the index's order, with the draws' intervals.
    fn compare(&self, predicted: &[f64], draws: Option<&[Vec<f64>]>) -> Vec<E2eResult> {
        self.figures
            .iter()
            .zip(predicted)
            .enumerate()
            .map(|(i, (f, &predicted))| E2eResult {
                run: self.name.clone(),
                metric: f.metric,
                published: f.published,
                predicted,
                error: predicted / f.published - 1.0,
                in_sample: self.in_sample.is_some(),
                interval: draws.map(|d| Interval::of(&d.iter().map(|x| x[i]).collect::<Vec<_>>())),
            })
            .collect()
    }
}

/// Parses an end-to-end index (`file` names it in errors): names unique, every scenario
/// shipped, every figure a positive finite published value with a definition.
pub fn parse_e2e(file: &str, text: &str) -> Result<Vec<E2eRun>, AnchorError> {
    let parse = |message: String| AnchorError::Parse {
        file: file.to_string(),
        message,
    };
    let idx: Index = toml::from_str(text).map_err(|e| parse(e.to_string()))?;
    let mut names = std::collections::BTreeSet::new();
    for r in &idx.run {
        if !names.insert(r.name.as_str()) {
            return Err(parse(format!("run {}: name used twice", r.name)));
        }
        shipped_text(E2E_SCENARIOS, &r.name, &r.scenario)?;
        if r.figures.is_empty() {
            return Err(parse(format!("run {}: figures is empty", r.name)));
        }
        for f in &r.figures {
            if !(f.published.is_finite() && f.published > 0.0) {
                return Err(parse(format!(
                    "run {} {}: published = {}: must be a positive number",
                    r.name,
                    f.metric.name(),
                    f.published
                )));
            }
            if f.definition.trim().is_empty() {
                return Err(parse(format!(
                    "run {} {}: definition is empty: say how the source defines the figure",
                    r.name,
                    f.metric.name()
                )));
            }
        }
    }
    Ok(idx.run)
}

/// The shipped runs.
pub fn shipped_runs() -> Result<Vec<E2eRun>, AnchorError> {
    parse_e2e("sim/scenarios/e2e/runs.toml", E2E_RUNS)
}

/// Every run's figures (the index's order) with `edit` applied to its scenario first, in
/// parallel: how far the suite moves when a number of a cost model moves.
pub fn predict_all(
    runs: &[E2eRun],
    edit: &(dyn Fn(&mut Scenario) + Sync),
) -> Result<Vec<Vec<f64>>, AnchorError> {
    runs.par_iter()
        .map(|r| {
            let mut s = r.scenario()?;
            edit(&mut s);
            r.predict(&s, 0)
        })
        .collect()
}

/// Simulates every run, and `draws` draws of each for its figures' 80% intervals (none when 0),
/// in parallel where there are cores, calling `done` after each simulation; the results keep
/// the index's order.
pub fn evaluate_all(
    runs: &[E2eRun],
    draws: u32,
    done: impl Fn() + Sync,
) -> Result<Vec<E2eResult>, AnchorError> {
    let scenarios: Vec<Scenario> = runs
        .iter()
        .map(E2eRun::scenario)
        .collect::<Result<_, _>>()?;
    let tasks: Vec<(usize, u64)> = (0..runs.len())
        .flat_map(|i| (0..=draws as u64).map(move |k| (i, k)))
        .collect();
    let predicted: Vec<Vec<f64>> = tasks
        .par_iter()
        .map(|&(i, k)| {
            let out = runs[i].predict(&scenarios[i], k);
            done();
            out
        })
        .collect::<Result<_, _>>()?;
    let per_run = draws as usize + 1;
    Ok(runs
        .iter()
        .zip(predicted.chunks(per_run))
        .flat_map(|(r, p)| r.compare(&p[0], (draws > 0).then_some(&p[1..])))
        .collect())
}
