//! `dstwin validate`: the twin against every published figure it is calibrated on (or against a
//! team's own measurements), with errors and a pass/fail bound for CI.

use crate::Failure;
use anyhow::{anyhow, Context};
use clap::Args;
use dstwin_calibration::fit::{eplb_gap_ratio, parse_eplb_gap, residuals, Globals, EXPERT_LOAD};
use dstwin_calibration::measured::compare;
use dstwin_calibration::target::{parse_targets, CLOUDMATRIX384, HELD_OUT};
use dstwin_sim::run::{run as simulate, RunOptions};
use dstwin_sim::scenario::load_path;
use serde::Serialize;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  dstwin validate\n      every built-in anchor: published vs predicted, error, and the mean absolute error\n  dstwin validate --max-error 15     (exit 1 if any anchor is off by more than 15%)\n  dstwin validate --measured bench.json --scenario my-cluster.toml\n      your cluster's `vllm bench serve --save-result` (or `dstwin bench-serve --save-result`)\n      against the twin's simulation of the same deployment and workload"
)]
pub struct ValidateArgs {
    /// Measurements to compare with (vllm bench serve --save-result JSON); needs --scenario.
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
}

/// One row of the report.
#[derive(Serialize, Debug)]
struct Row {
    id: String,
    metric: String,
    published: f64,
    predicted: f64,
    error: f64,
    /// Fitted rows reproduce what they were fitted to; the others are predictions.
    fitted: bool,
}

fn rows_builtin() -> Result<Vec<Row>, Failure> {
    let targets = parse_targets("cloudmatrix384.toml", CLOUDMATRIX384)
        .map_err(|e| Failure::Runtime(e.into()))?;
    let base = targets[0]
        .base_cost()
        .map_err(|e| Failure::Runtime(e.into()))?;
    let shipped = Globals::of(&base);
    let mut rows: Vec<Row> = residuals(&targets, shipped)
        .map_err(|e| Failure::Runtime(e.into()))?
        .into_iter()
        .map(|r| Row {
            id: r.id,
            metric: r.metric.name().to_string(),
            published: r.published,
            predicted: r.predicted,
            error: r.error,
            fitted: true,
        })
        .collect();
    let gap =
        parse_eplb_gap("expert-load.toml", EXPERT_LOAD).map_err(|e| Failure::Runtime(e.into()))?;
    let ratio = eplb_gap_ratio(
        &gap,
        &targets,
        &shipped.apply(&base),
        dstwin_sim::expert_load::DEFAULT_CONCENTRATION,
    )
    .map_err(|e| Failure::Runtime(e.into()))?;
    let published = gap.default_eplb / gap.perfect_eplb;
    rows.push(Row {
        id: gap.id,
        metric: "default/perfect EPLB throughput".into(),
        published,
        predicted: ratio,
        error: ratio / published - 1.0,
        fitted: true,
    });
    // Held-out anchors, each priced with its own hardware's shipped cost model.
    let held = parse_targets("held-out.toml", HELD_OUT).map_err(|e| Failure::Runtime(e.into()))?;
    for t in &held {
        let cost = t.base_cost().map_err(|e| Failure::Runtime(e.into()))?;
        let predicted = t.predict(cost).map_err(|e| Failure::Runtime(e.into()))?;
        rows.push(Row {
            id: t.id.clone(),
            metric: t.metric.name().to_string(),
            published: t.published,
            predicted,
            error: t.metric.error(predicted, t.published),
            fitted: false,
        });
    }
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
            fitted: false,
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
    let rows = match (&a.measured, &a.scenario) {
        (Some(m), Some(s)) => rows_measured(m, s)?,
        _ => rows_builtin()?,
    };
    let mape = rows.iter().map(|r| r.error.abs()).sum::<f64>() / rows.len().max(1) as f64;
    let over: Vec<&Row> = a
        .max_error
        .map(|x| rows.iter().filter(|r| r.error.abs() * 100.0 > x).collect())
        .unwrap_or_default();
    if a.json {
        let v = serde_json::json!({
            "rows": rows,
            "mean_absolute_error": mape,
            "max_error_pct": a.max_error,
            "over_bound": over.iter().map(|r| &r.id).collect::<Vec<_>>(),
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| Failure::Runtime(e.into()))?
        );
    } else {
        println!(
            "{:<40} {:<34} {:>12} {:>12} {:>8}",
            "anchor", "metric", "published", "predicted", "error"
        );
        for r in &rows {
            println!(
                "{:<40} {:<34} {:>12.3} {:>12.3} {:>+7.1}%{}",
                r.id,
                r.metric,
                r.published,
                r.predicted,
                r.error * 100.0,
                if r.fitted {
                    "  (fit target)"
                } else {
                    "  (held out)"
                }
            );
        }
        println!(
            "mean absolute error {:.1}% over {} figures",
            mape * 100.0,
            rows.len()
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
