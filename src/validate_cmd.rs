//! `dstwin validate`: the twin against every published figure it is calibrated on (or against a
//! team's own measurements), with errors and a pass/fail bound for CI.

use crate::output::outln;
use crate::Failure;
use anyhow::{anyhow, Context};
use clap::Args;
use dstwin_calibration::anchors::{builtin_runs, Evaluated};
use dstwin_calibration::fit::{eplb_gap_ratio, parse_eplb_gap, residuals, Globals, EXPERT_LOAD};
use dstwin_calibration::measured::compare;
use dstwin_calibration::micro;
use dstwin_calibration::target::{parse_targets, CLOUDMATRIX384};
use dstwin_sim::run::{run as simulate, RunOptions};
use dstwin_sim::scenario::load_path;
use rayon::prelude::*;
use serde::Serialize;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  dstwin validate\n      every built-in anchor: the all-to-all and MTP acceptance microbenchmarks, the calibration\n      fit's residuals, then each end-to-end anchor simulated from its shipped scenario\n      (sim/scenarios/anchors/): published vs predicted, error, documented bound, and the mean\n      absolute error\n  dstwin validate --max-error 15     (exit 1 if any anchor is off by more than 15%)\n  dstwin validate --measured bench.json --scenario my-cluster.toml\n      your cluster's `vllm bench serve --save-result` (or `dstwin bench-serve --save-result`,\n      or a `dstwin-measured/1` file: docs/validation.md) against the twin's simulation of the\n      same deployment and workload"
)]
pub struct ValidateArgs {
    /// Measurements to compare with: the JSON of `vllm bench serve --save-result`, or a
    /// `dstwin-measured/1` file (docs/validation.md); needs --scenario.
    #[arg(long, requires = "scenario")]
    measured: Option<PathBuf>,
    /// The scenario describing the measured deployment and workload.
    #[arg(long, requires = "measured")]
    scenario: Option<PathBuf>,
    /// Exit 1 when any |error| exceeds this many percent.
    #[arg(long, value_name = "PCT")]
    max_error: Option<f64>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// No progress bar and no wall-time footer on stderr.
    #[arg(long, short)]
    quiet: bool,
}

/// One row of the report.
#[derive(Serialize, Debug)]
struct Row {
    id: String,
    metric: String,
    published: f64,
    predicted: f64,
    error: f64,
    /// `micro`: an all-to-all microbenchmark point the dispatch/combine parameters were fitted
    /// to; `fit`: a residual of the calibration fit (a steady step priced by `explain`, the
    /// parameters were fitted to it); `scenario`: an end-to-end anchor simulated from its
    /// shipped scenario with the shipped parameters; `measured`: a team's own measurement.
    kind: &'static str,
    /// Documented regression bound on |error| (micro and scenario rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    bound: Option<f64>,
}

/// Simulates every shipped anchor run, in parallel.
fn scenario_runs(quiet: bool) -> Result<Vec<Evaluated>, Failure> {
    let runs = builtin_runs().map_err(|e| Failure::Runtime(e.into()))?;
    let bar = crate::progress::bar(
        Some(runs.len() as u64),
        quiet,
        "simulating anchor scenarios {bar:30} {pos}/{len} {elapsed}",
    );
    let out: Result<Vec<Evaluated>, _> = runs
        .par_iter()
        .map(|r| {
            let f = r.evaluate();
            bar.inc(1);
            f
        })
        .collect();
    bar.finish_and_clear();
    out.map_err(|e| Failure::Runtime(e.into()))
}

fn rows_builtin(runs: &[Evaluated]) -> Result<Vec<Row>, Failure> {
    let bench = micro::builtin().map_err(|e| Failure::Runtime(e.into()))?;
    let mut rows: Vec<Row> = micro::residuals(&bench, &[])
        .map_err(|e| Failure::Runtime(e.into()))?
        .into_iter()
        .chain(micro::mtp_residuals(
            &bench,
            dstwin_core::mtp::CALIBRATED_ACCEPTANCE,
        ))
        .map(|r| Row {
            id: r.id,
            metric: r.metric,
            published: r.published,
            predicted: r.predicted,
            error: r.error,
            kind: "micro",
            bound: Some(r.bound),
        })
        .collect();
    let targets = parse_targets("cloudmatrix384.toml", CLOUDMATRIX384)
        .map_err(|e| Failure::Runtime(e.into()))?;
    let base = targets[0]
        .base_cost()
        .map_err(|e| Failure::Runtime(e.into()))?;
    let shipped = Globals::of(&base);
    rows.extend(
        residuals(&targets, shipped)
            .map_err(|e| Failure::Runtime(e.into()))?
            .into_iter()
            .map(|r| Row {
                id: r.id,
                metric: r.metric.name().to_string(),
                published: r.published,
                predicted: r.predicted,
                error: r.error,
                kind: "fit",
                bound: None,
            }),
    );
    let gap =
        parse_eplb_gap("expert-load.toml", EXPERT_LOAD).map_err(|e| Failure::Runtime(e.into()))?;
    let ratio = eplb_gap_ratio(
        &gap,
        &targets,
        &shipped.apply(&base),
        dstwin_twin::expert_load::DEFAULT_CONCENTRATION,
    )
    .map_err(|e| Failure::Runtime(e.into()))?;
    let published = gap.default_eplb / gap.perfect_eplb;
    rows.push(Row {
        id: gap.id,
        metric: "default/perfect EPLB throughput".into(),
        published,
        predicted: ratio,
        error: ratio / published - 1.0,
        kind: "fit",
        bound: None,
    });
    rows.extend(runs.iter().flat_map(|r| &r.figures).map(|f| Row {
        id: f.run.clone(),
        metric: f.metric.name().to_string(),
        published: f.published,
        predicted: f.predicted,
        error: f.error,
        kind: "scenario",
        bound: Some(f.bound),
    }));
    Ok(rows)
}

fn rows_measured(measured: &Path, scenario: &Path) -> Result<Vec<Row>, Failure> {
    let text = std::fs::read_to_string(measured)
        .with_context(|| format!("reading {}", measured.display()))
        .map_err(Failure::Input)?;
    let m: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Failure::Input(anyhow!("{}: {e}", measured.display())))?;
    let s = load_path(scenario, &[]).map_err(|e| Failure::Input(e.into()))?;
    let r = simulate(&s, RunOptions::default()).map_err(|e| Failure::Input(e.into()))?;
    let c = compare(&m, &r.report)
        .map_err(|e| Failure::Input(anyhow!("{}: {e}", measured.display())))?;
    Ok(c.into_iter()
        .map(|c| Row {
            id: s.name.clone(),
            metric: c.metric,
            published: c.measured,
            predicted: c.predicted,
            error: c.error,
            kind: "measured",
            bound: None,
        })
        .collect())
}

pub fn run(a: ValidateArgs) -> Result<(), Failure> {
    if let Some(x) = a.max_error {
        if !(x.is_finite() && x > 0.0) {
            return Err(Failure::Input(anyhow!(
                "--max-error {x}: must be a positive percentage"
            )));
        }
    }
    let started = std::time::Instant::now();
    let mut runs = Vec::new();
    let rows = match (&a.measured, &a.scenario) {
        (Some(m), Some(s)) => rows_measured(m, s)?,
        _ => {
            runs = scenario_runs(a.quiet)?;
            rows_builtin(&runs)?
        }
    };
    let mape = mean_abs(rows.iter());
    let over: Vec<&Row> = a
        .max_error
        // A figure the run did not produce (NaN) is over every bound.
        .map(|x| {
            rows.iter()
                .filter(|r| r.error.is_nan() || r.error.abs() * 100.0 > x)
                .collect()
        })
        .unwrap_or_default();
    if a.json {
        let v = serde_json::json!({
            "rows": rows,
            "runs": runs,
            "mean_absolute_error": mape,
            "max_error_pct": a.max_error,
            "over_bound": over.iter().map(|r| &r.id).collect::<Vec<_>>(),
        });
        outln!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| Failure::Runtime(e.into()))?
        )?;
    } else {
        print_table(&rows, &runs, mape)?;
    }
    if !a.quiet {
        crate::output::errln!(
            "wall {:.2} s: {} figures, {} simulated runs",
            started.elapsed().as_secs_f64(),
            rows.len(),
            runs.len().max(usize::from(a.measured.is_some()))
        );
    }
    if !over.is_empty() {
        return Err(Failure::Runtime(anyhow!(
            "{} of {} figures are off by more than {}%",
            over.len(),
            rows.len(),
            a.max_error.unwrap_or_default()
        )));
    }
    Ok(())
}

/// The text report: one section per kind of row.
fn print_table(rows: &[Row], runs: &[Evaluated], mape: f64) -> Result<(), Failure> {
    let sections = [
        (
            "micro",
            "Microbenchmarks: the all-to-all and MTP acceptance points the parameters were fitted to (`dstwin calibrate`)",
        ),
        (
            "fit",
            "Calibration fit: residuals of the targets the parameters were fitted to (a steady step priced by `dstwin explain`)",
        ),
        (
            "scenario",
            "End-to-end anchors: each shipped scenario simulated with the shipped parameters (sim/scenarios/anchors/)",
        ),
        (
            "measured",
            "Your measurements against a simulation of the same deployment and workload",
        ),
    ];
    for (kind, title) in sections {
        let part: Vec<&Row> = rows.iter().filter(|r| r.kind == kind).collect();
        if part.is_empty() {
            continue;
        }
        outln!("{title}")?;
        outln!(
            "  {:<38} {:<34} {:>11} {:>11} {:>8} {:>7}",
            "anchor",
            "metric",
            "published",
            "predicted",
            "error",
            "bound"
        )?;
        for r in part {
            let bound = match r.bound {
                Some(b) if r.error.is_nan() || r.error.abs() > b => {
                    format!("{:>6.0}% OVER", b * 100.0)
                }
                Some(b) => format!("{:>6.0}%", b * 100.0),
                None => String::new(),
            };
            outln!(
                "  {:<38} {:<34} {:>11.3} {:>11.3} {:>+7.1}% {bound}",
                r.id,
                r.metric,
                r.published,
                r.predicted,
                r.error * 100.0,
            )?;
        }
        if kind == "scenario" {
            for r in runs {
                if let Some(l) = r.tpot_limit_ms {
                    outln!(
                        "  {}: median TPOT {:.2} ms {} its {l} ms limit",
                        r.run,
                        r.tpot_p50_ms,
                        if r.within_tpot_limit() {
                            "under"
                        } else {
                            "OVER"
                        }
                    )?;
                }
            }
        }
        let m = mean_abs(rows.iter().filter(|r| r.kind == kind));
        outln!("  mean absolute error {:.1}%\n", m * 100.0)?;
    }
    outln!(
        "mean absolute error {:.1}% over all {} figures",
        mape * 100.0,
        rows.len()
    )?;
    Ok(())
}

fn mean_abs<'a>(rows: impl Iterator<Item = &'a Row>) -> f64 {
    let (sum, n) = rows.fold((0.0, 0usize), |(s, n), r| (s + r.error.abs(), n + 1));
    sum / n.max(1) as f64
}
