//! `dstwin validate`: the twin against every published figure it is calibrated on (or against a
//! team's own measurements), with errors and a pass/fail bound for CI.

use crate::output::outln;
use crate::Failure;
use anyhow::{anyhow, Context};
use clap::Args;
use dstwin_calibration::anchors::{builtin_runs, Evaluated};
use dstwin_calibration::e2e;
use dstwin_calibration::fit::{eplb_gap_ratio, parse_eplb_gap, EXPERT_LOAD};
use dstwin_calibration::globals::{self, Values};
use dstwin_calibration::measured;
use dstwin_calibration::target::{parse_targets, Target, TARGETS};
use dstwin_calibration::{micro, v4_kernels};
use dstwin_hwmodels::{CostParams, OpClass};
use dstwin_sim::run::{run as simulate, RunOptions};
use dstwin_sim::scenario::load_path;
use rayon::prelude::*;
use serde::Serialize;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  dstwin validate --e2e\n      the end-to-end suite alone: 36 published serving runs (sim/scenarios/e2e/), each simulated\n      whole from its launch flags and benchmark command, figure by figure with an 80% interval\n      and the share of published figures inside it (--draws 0: no intervals, about 1 s)\n  dstwin validate\n      the suite first, then every built-in anchor: the all-to-all, V4 kernel and MTP\n      acceptance microbenchmarks, the calibration fit's residuals, then each end-to-end anchor simulated from its shipped scenario\n      (sim/scenarios/anchors/): published vs predicted, error, documented bound, and the mean\n      absolute error\n  dstwin validate --max-error 15     (exit 1 if any prediction is off by more than 15%)\n  dstwin validate --measured bench.json --scenario my-cluster.toml\n      your cluster's `vllm bench serve --save-result` (or `dstwin bench-serve --save-result`,\n      or a `dstwin-measured/1` file: docs/validation.md) against the twin's simulation of the\n      same deployment and workload"
)]
pub struct ValidateArgs {
    /// Measurements to compare with: the JSON of `vllm bench serve --save-result`, or a
    /// `dstwin-measured/1` file (docs/validation.md); needs --scenario.
    #[arg(long, requires = "scenario")]
    measured: Option<PathBuf>,
    /// The scenario describing the measured deployment and workload.
    #[arg(long, requires = "measured")]
    scenario: Option<PathBuf>,
    /// Override a field of --scenario: PATH=VALUE (repeatable), as for `simulate` (e.g. the
    /// model and the calibrated hardware of a CPU engine run).
    #[arg(long = "set", value_name = "PATH=VALUE", requires = "scenario")]
    sets: Vec<String>,
    /// Only the end-to-end suite: every published serving run of sim/scenarios/e2e/ simulated
    /// as a whole run and compared figure by figure (plain `validate` shows it first too).
    #[arg(long, conflicts_with = "measured")]
    e2e: bool,
    /// Draws of what each end-to-end run leaves unknown (expert load, acceptance, kernel, host
    /// and communication time: docs/validation.md), for each figure's 80% interval and the
    /// suite's coverage; 0: no intervals.
    #[arg(long, value_name = "N", default_value_t = dstwin_sim::uncertainty::DEFAULT_DRAWS)]
    draws: u32,
    /// Exit 1 when any |error| of a prediction (end-to-end runs, out-of-sample anchors, your
    /// measurements) exceeds this many percent.
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
#[derive(Serialize, Debug, Clone)]
struct Row {
    id: String,
    metric: String,
    published: f64,
    predicted: f64,
    error: f64,
    /// `e2e`: a published serving run of the end-to-end suite, simulated whole (`e2e_in_sample`
    /// when its figure is also a calibration anchor's);
    /// `out_of_sample`: an end-to-end anchor predicted by the parameters fitted without it
    /// (simulated from its shipped scenario when it has one, else its steady step);
    /// `fit`: a residual of the full fit (the parameters were fitted to it); `micro`: a
    /// microbenchmark point; `measured`: a team's own measurement.
    kind: &'static str,
    /// How the prediction was made: `simulated`, `steady step`, or `median` (of draws of the
    /// step spread, `draws`).
    #[serde(skip_serializing_if = "Option::is_none")]
    how: Option<&'static str>,
    /// The goal on |error| (at most 15%).
    #[serde(skip_serializing_if = "Option::is_none")]
    bound: Option<f64>,
    /// A measurement compared with several draws of the twin's step spread: how many, and the
    /// range of their predictions (the row's is their median).
    #[serde(skip_serializing_if = "Option::is_none")]
    draws: Option<Draws>,
    /// An end-to-end figure's 80% interval over draws of what its run leaves unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    interval: Option<dstwin_sim::uncertainty::Interval>,
}

impl Row {
    /// A figure of `kind`, published against predicted, with no method, bound, draws or
    /// interval (callers add those their kind has).
    fn new(
        id: String,
        metric: impl Into<String>,
        published: f64,
        predicted: f64,
        error: f64,
        kind: &'static str,
    ) -> Row {
        Row {
            id,
            metric: metric.into(),
            published,
            predicted,
            error,
            kind,
            how: None,
            bound: None,
            draws: None,
            interval: None,
        }
    }

    /// This figure, obtained `how`, held to the end-to-end goal.
    fn against_goal(self, how: &'static str) -> Row {
        Row {
            how: Some(how),
            bound: Some(GOAL),
            ..self
        }
    }
}

#[derive(Serialize, Debug, Clone, Copy)]
struct Draws {
    n: usize,
    min: f64,
    max: f64,
}

/// The goal every row is held to: no documented bound is wider.
const GOAL: f64 = 0.15;

/// How much the out-of-sample predictions move when an assumed number moves by 20%.
#[derive(Serialize, Debug)]
struct Sensitivity {
    parameter: String,
    value: f64,
    source: String,
    /// Mean and largest |relative change| of the steady-step predictions of every anchor.
    mean_change: f64,
    max_change: f64,
    max_target: String,
    /// The same over the figures of the end-to-end runs on this cost model.
    e2e_mean_change: f64,
    e2e_max_change: f64,
    e2e_max_run: String,
}

fn runtime(e: impl Into<anyhow::Error>) -> Failure {
    Failure::Runtime(e.into())
}

/// Everything the built-in report holds.
struct Builtin {
    rows: Vec<Row>,
    /// End-to-end suite runs simulated.
    e2e_runs: usize,
    runs: Vec<Evaluated>,
    fitted: String,
    params: Vec<String>,
    sensitivity: Vec<Sensitivity>,
}

/// An unfitted number of a cost file: name, value, source and how to set it.
type Assumption = (String, f64, String, fn(&mut CostParams, f64));

/// The assumption-marked numbers of a cost file whose effect is reported: every efficiency of
/// a class it gives, fixed cost and padding not in the fit, the collective parameters and the eager
/// launch time.
fn assumptions(p: &CostParams) -> Vec<Assumption> {
    let mut out: Vec<Assumption> = Vec::new();
    // The classes the file gives (one priced by another's entry moves with that entry).
    for c in OpClass::ALL
        .into_iter()
        .filter(|c| p.efficiency.contains_key(c))
    {
        let e = p.efficiency(c);
        let src = e.source.clone();
        let name = c.name();
        let set_c: fn(&mut CostParams, f64) = match c {
            OpClass::Gemm => |p, v| eff_mut(p, OpClass::Gemm).compute = v,
            OpClass::GroupedGemm => |p, v| eff_mut(p, OpClass::GroupedGemm).compute = v,
            OpClass::TpGroupedGemm => |p, v| eff_mut(p, OpClass::TpGroupedGemm).compute = v,
            OpClass::Attention => |p, v| eff_mut(p, OpClass::Attention).compute = v,
            OpClass::PrefillAttention => |p, v| eff_mut(p, OpClass::PrefillAttention).compute = v,
            OpClass::Indexer => |p, v| eff_mut(p, OpClass::Indexer).compute = v,
            OpClass::Elementwise => |p, v| eff_mut(p, OpClass::Elementwise).compute = v,
        };
        let set_m: fn(&mut CostParams, f64) = match c {
            OpClass::Gemm => |p, v| eff_mut(p, OpClass::Gemm).memory = v,
            OpClass::GroupedGemm => |p, v| eff_mut(p, OpClass::GroupedGemm).memory = v,
            OpClass::TpGroupedGemm => |p, v| eff_mut(p, OpClass::TpGroupedGemm).memory = v,
            OpClass::Attention => |p, v| eff_mut(p, OpClass::Attention).memory = v,
            OpClass::PrefillAttention => |p, v| eff_mut(p, OpClass::PrefillAttention).memory = v,
            OpClass::Indexer => |p, v| eff_mut(p, OpClass::Indexer).memory = v,
            OpClass::Elementwise => |p, v| eff_mut(p, OpClass::Elementwise).memory = v,
        };
        out.push((
            format!("efficiency.{name}.compute"),
            e.compute,
            src.clone(),
            set_c,
        ));
        out.push((format!("efficiency.{name}.memory"), e.memory, src, set_m));
    }
    out.push((
        "collective.bw_eff".into(),
        p.collective.bw_eff,
        p.collective.source.clone(),
        |p, v| p.collective.bw_eff = v,
    ));
    out.push((
        "collective.base_us".into(),
        p.collective.base_us,
        p.collective.source.clone(),
        |p, v| p.collective.base_us = v,
    ));
    if let Some(h) = p.host.as_ref().filter(|h| h.eager_layer_us > 0.0) {
        out.push((
            "host.eager_layer_us".into(),
            h.eager_layer_us,
            h.source.clone(),
            |p, v| {
                if let Some(h) = p.host.as_mut() {
                    h.eager_layer_us = v;
                }
            },
        ));
    }
    out.retain(|(n, ..)| !p.fit.contains(n));
    out
}

fn eff_mut(p: &mut CostParams, c: OpClass) -> &mut dstwin_hwmodels::Efficiency {
    let fallback = p.efficiency(c).clone();
    p.efficiency.entry(c).or_insert(fallback)
}

/// For each assumed number of the fitted cost model: the steady-step predictions of every
/// target with the number 20% higher (efficiencies capped at 1), against the shipped ones.
fn sensitivity(targets: &[Target], cost_model: &str) -> Result<Vec<Sensitivity>, Failure> {
    let on: Vec<&Target> = targets
        .iter()
        .filter(|t| t.base_cost().is_ok_and(|c| c.params.name == cost_model))
        .collect();
    let base: Vec<f64> = on
        .iter()
        .map(|t| t.predict(t.base_cost()?))
        .collect::<Result<_, _>>()
        .map_err(runtime)?;
    let shipped = crate::calibrate_cmd::shipped_cost(cost_model)?;
    // The end-to-end runs on this cost model, as shipped and with each number moved.
    let runs: Vec<e2e::E2eRun> = e2e::shipped_runs()
        .map_err(runtime)?
        .into_iter()
        .filter(|r| r.scenario().is_ok_and(|s| s.cost.params.name == cost_model))
        .collect();
    let e2e_base = e2e::predict_all(&runs, &|_| {}).map_err(runtime)?;
    assumptions(&shipped)
        .into_iter()
        .map(|(name, value, source, set)| {
            let moved = if name.starts_with("efficiency.") {
                (value * 1.2).min(1.0)
            } else {
                value * 1.2
            };
            let mut worst = (0.0f64, String::new());
            let mut sum = 0.0;
            for (t, b) in on.iter().zip(&base) {
                let cm = t.base_cost().map_err(runtime)?;
                let mut p = cm.params.clone();
                set(&mut p, moved);
                let pred = t
                    .predict(dstwin_hwmodels::CostModel::new(cm.system.clone(), p))
                    .map_err(runtime)?;
                let change = (pred / b - 1.0).abs();
                sum += change;
                if change > worst.0 {
                    worst = (change, t.id.clone());
                }
            }
            let moved_runs = e2e::predict_all(&runs, &|s: &mut dstwin_sim::scenario::Scenario| {
                let mut p = s.cost.params.clone();
                set(&mut p, moved);
                s.cost = dstwin_hwmodels::CostModel::new(s.cost.system.clone(), p);
            })
            .map_err(runtime)?;
            let (mut e2e_sum, mut e2e_n, mut e2e_worst) = (0.0, 0usize, (0.0f64, String::new()));
            for ((r, b), m) in runs.iter().zip(&e2e_base).zip(&moved_runs) {
                for (x, y) in b.iter().zip(m) {
                    let change = (y / x - 1.0).abs();
                    if change.is_finite() {
                        e2e_sum += change;
                        e2e_n += 1;
                        if change > e2e_worst.0 {
                            e2e_worst = (change, r.name.clone());
                        }
                    }
                }
            }
            Ok(Sensitivity {
                parameter: name,
                value,
                source,
                mean_change: sum / on.len().max(1) as f64,
                max_change: worst.0,
                max_target: worst.1,
                e2e_mean_change: e2e_sum / e2e_n.max(1) as f64,
                e2e_max_change: e2e_worst.0,
                e2e_max_run: e2e_worst.1,
            })
        })
        .collect()
}

/// The end-to-end suite's rows: every shipped run simulated whole, in parallel.
fn e2e_rows(quiet: bool, draws: u32) -> Result<(Vec<Row>, usize), Failure> {
    let runs = e2e::shipped_runs().map_err(runtime)?;
    let bar = crate::progress::bar(
        Some(runs.len() as u64 * (draws as u64 + 1)),
        quiet,
        "end-to-end runs and their draws {bar:30} {pos}/{len} {elapsed}",
    );
    let results = e2e::evaluate_all(&runs, draws, || bar.inc(1)).map_err(runtime)?;
    bar.finish_and_clear();
    let rows = results
        .into_iter()
        .map(|f| {
            let kind = if f.in_sample { "e2e_in_sample" } else { "e2e" };
            Row {
                interval: f.interval,
                ..Row::new(
                    f.run,
                    f.metric.name(),
                    f.published,
                    f.predicted,
                    f.error,
                    kind,
                )
                .against_goal("simulated")
            }
        })
        .collect();
    Ok((rows, runs.len()))
}

fn builtin(quiet: bool, draws: u32) -> Result<Builtin, Failure> {
    let (mut rows, e2e_runs) = e2e_rows(quiet, draws)?;
    let cost_model = "ascend-910c";
    let targets = parse_targets("targets.toml", TARGETS).map_err(runtime)?;
    let shipped_params = crate::calibrate_cmd::shipped_cost(cost_model)?;
    let params = crate::calibrate_cmd::fit_params(&[], &shipped_params)?;
    let shipped = Values::of(&params, &shipped_params);
    let runs = builtin_runs().map_err(runtime)?;
    let bar = crate::progress::bar(
        Some(runs.len() as u64 + 1),
        quiet,
        "leave-one-out fits and anchor simulations {bar:30} {pos}/{len} {elapsed}",
    );
    // Leave one anchor out: refit without it, predict it.
    let held = globals::leave_one_out(
        &targets,
        cost_model,
        &params,
        &shipped_params,
        &["cm384-microbatch"],
    )
    .map_err(runtime)?;
    bar.inc(1);
    let values_without = |anchor: &str| held.iter().find(|h| h.anchor == anchor).map(|h| &h.values);
    // Anchors with a shipped scenario are simulated with the parameters fitted without them.
    let evaluated: Vec<Evaluated> = runs
        .par_iter()
        .map(|r| {
            let v = values_without(&r.anchor).unwrap_or(&shipped);
            let e = r.evaluate_with(Some((cost_model, v)));
            bar.inc(1);
            e
        })
        .collect::<Result<_, _>>()
        .map_err(runtime)?;
    bar.finish_and_clear();
    let simulated: Vec<&str> = runs.iter().map(|r| r.anchor.as_str()).collect();
    rows.extend(evaluated.iter().flat_map(|r| &r.figures).map(|f| {
        Row::new(
            f.run.clone(),
            f.metric.name(),
            f.published,
            f.predicted,
            f.error,
            "out_of_sample",
        )
        .against_goal("simulated")
    }));
    for h in &held {
        if simulated.contains(&h.anchor.as_str()) {
            continue;
        }
        rows.extend(h.residuals.iter().map(|r| {
            Row::new(
                r.id.clone(),
                r.metric.name(),
                r.published,
                r.predicted,
                r.error,
                "out_of_sample",
            )
            .against_goal("steady step")
        }));
    }
    // Anchors on other cost models (borrowed parameters, never fitted): their steady steps.
    for t in &targets {
        let other = t.base_cost().is_ok_and(|c| c.params.name != cost_model);
        if other && !simulated.contains(&t.anchor.as_str()) {
            let predicted = t
                .predict(t.base_cost().map_err(runtime)?)
                .map_err(runtime)?;
            let error = t.metric.error(predicted, t.published);
            rows.push(
                Row::new(
                    t.id.clone(),
                    t.metric.name(),
                    t.published,
                    predicted,
                    error,
                    "out_of_sample",
                )
                .against_goal("steady step"),
            );
        }
    }
    rows.extend(
        globals::residuals(&targets, cost_model, &shipped)
            .map_err(runtime)?
            .into_iter()
            .map(|r| {
                Row::new(
                    r.id,
                    r.metric.name(),
                    r.published,
                    r.predicted,
                    r.error,
                    "fit",
                )
            }),
    );
    let gap = parse_eplb_gap("expert-load.toml", EXPERT_LOAD).map_err(runtime)?;
    let base = targets
        .iter()
        .find(|t| t.id == gap.base)
        .ok_or_else(|| runtime(anyhow!("target {} not found", gap.base)))?
        .base_cost()
        .map_err(runtime)?;
    let ratio = eplb_gap_ratio(
        &gap,
        &targets,
        &base,
        dstwin_twin::expert_load::DEFAULT_CONCENTRATION,
    )
    .map_err(runtime)?;
    let published = gap.default_eplb / gap.perfect_eplb;
    rows.push(Row::new(
        gap.id,
        "default/perfect EPLB throughput",
        published,
        ratio,
        ratio / published - 1.0,
        "fit",
    ));
    let bench = micro::builtin().map_err(runtime)?;
    rows.extend(
        micro::residuals(&bench, &[])
            .map_err(runtime)?
            .into_iter()
            .chain(v4_kernels::residuals(&bench.kernel, &[]).map_err(runtime)?)
            .chain(micro::mtp_residuals(
                &bench,
                dstwin_twin::mtp::CALIBRATED_ACCEPTANCE,
            ))
            .map(|r| Row {
                bound: Some(r.bound.min(GOAL)),
                ..Row::new(r.id, r.metric, r.published, r.predicted, r.error, "micro")
            }),
    );
    let sensitivity = sensitivity(&targets, cost_model)?;
    Ok(Builtin {
        rows,
        e2e_runs,
        runs: evaluated,
        fitted: cost_model.to_string(),
        params: params.iter().map(|p| p.name.to_string()).collect(),
        sensitivity,
    })
}

/// Draws of the twin's step spread a measurement is compared with (a cost file with `[host]
/// step_sigma`): the prediction is their median, so that one draw's luck is not read as the
/// twin's error (a p90 of forty requests moves by several percent from draw to draw).
const DRAWS: u64 = 9;

fn rows_measured(measured: &Path, scenario: &Path, sets: &[String]) -> Result<Vec<Row>, Failure> {
    let text = std::fs::read_to_string(measured)
        .with_context(|| format!("reading {}", measured.display()))
        .map_err(Failure::Input)?;
    let bad = |e: String| Failure::Input(anyhow!("{}: {e}", measured.display()));
    let m: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    // All the file can get wrong without a prediction, before a simulation of up to a minute.
    let m = measured::read(&m).map_err(bad)?;
    let s = load_path(scenario, sets).map_err(|e| Failure::Input(e.into()))?;
    let spread = s
        .cost
        .params
        .host
        .as_ref()
        .is_some_and(|h| h.step_sigma > 0.0);
    let draws = if spread { DRAWS } else { 1 };
    let compared = (0..draws)
        .into_par_iter()
        .map(|draw| {
            let r = simulate(
                &s,
                RunOptions {
                    draw,
                    ..RunOptions::default()
                },
            )
            .map_err(|e| Failure::Input(e.into()))?;
            m.compare(&r.report).map_err(bad)
        })
        .collect::<Vec<Result<_, Failure>>>()
        .into_iter()
        // The first draw's error, whichever thread failed first.
        .collect::<Result<Vec<_>, Failure>>()?;
    let first = &compared[0];
    Ok(first
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut p: Vec<f64> = compared.iter().map(|d| d[i].predicted).collect();
            p.sort_by(f64::total_cmp);
            let predicted = p[p.len() / 2];
            let error = predicted / c.measured - 1.0;
            Row {
                how: Some(if spread { "median" } else { "simulated" }),
                draws: spread.then(|| Draws {
                    n: p.len(),
                    min: p[0],
                    max: p[p.len() - 1],
                }),
                ..Row::new(
                    s.name.clone(),
                    c.metric.clone(),
                    c.measured,
                    predicted,
                    error,
                    "measured",
                )
            }
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
    let only = |(rows, e2e_runs): (Vec<Row>, usize)| Builtin {
        rows,
        e2e_runs,
        runs: Vec::new(),
        fitted: String::new(),
        params: Vec::new(),
        sensitivity: Vec::new(),
    };
    let report = match (&a.measured, &a.scenario) {
        (Some(m), Some(s)) => only((rows_measured(m, s, &a.sets)?, 0)),
        _ if a.e2e => only(e2e_rows(a.quiet, a.draws)?),
        _ => builtin(a.quiet, a.draws)?,
    };
    let rows = &report.rows;
    // --max-error holds the predictions: the end-to-end runs, the out-of-sample anchors (or a
    // team's measurements).
    let held_to: Vec<&Row> = rows
        .iter()
        .filter(|r| {
            matches!(
                r.kind,
                "e2e" | "e2e_in_sample" | "out_of_sample" | "measured"
            )
        })
        .collect();
    let over: Vec<&Row> = a
        .max_error
        // A figure the run did not produce (NaN) is over every bound.
        .map(|x| {
            held_to
                .iter()
                .copied()
                .filter(|r| r.error.is_nan() || r.error.abs() * 100.0 > x)
                .collect()
        })
        .unwrap_or_default();
    if a.json {
        let section = |k: &str| rows.iter().filter(|r| r.kind == k).collect::<Vec<_>>();
        let summary = |k: &str| {
            let part = section(k);
            let mut v = serde_json::json!({
                "mean_absolute_error": mean_abs(part.iter().copied()),
                "max_absolute_error": max_abs(part.iter().copied()),
                "figures": part.len(),
            });
            if let Some(c) = coverage(part.iter().copied()) {
                v["interval_coverage"] = c.into();
            }
            v
        };
        let v = serde_json::json!({
            "e2e": { "summary": summary("e2e"), "rows": section("e2e"), "in_sample_rows": section("e2e_in_sample") },
            "out_of_sample": { "summary": summary("out_of_sample"), "rows": section("out_of_sample") },
            "fit": { "cost_model": report.fitted, "parameters": report.params, "summary": summary("fit"), "rows": section("fit") },
            "micro": { "summary": summary("micro"), "rows": section("micro") },
            "measured": { "summary": summary("measured"), "rows": section("measured") },
            "sensitivity": report.sensitivity,
            "runs": report.runs,
            "goal": GOAL,
            "max_error_pct": a.max_error,
            "over_bound": over.iter().map(|r| format!("{} {}", r.id, r.metric)).collect::<Vec<_>>(),
        });
        outln!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| Failure::Runtime(e.into()))?
        )?;
    } else {
        print_table(&report)?;
    }
    if !a.quiet {
        crate::output::errln!(
            "wall {:.2} s: {} figures, {} simulated runs",
            started.elapsed().as_secs_f64(),
            rows.len(),
            (report.runs.len() + report.e2e_runs).max(
                report
                    .rows
                    .iter()
                    .find(|r| r.kind == "measured")
                    .map_or(0, |r| r.draws.map_or(1, |d| d.n))
            )
        );
    }
    if !over.is_empty() {
        return Err(Failure::Runtime(anyhow!(
            "{} of {} predicted figures are off by more than {}%",
            over.len(),
            held_to.len(),
            a.max_error.unwrap_or_default()
        )));
    }
    Ok(())
}

/// The text report: predictions first, then the fit's residuals, the microbenchmarks and the
/// sensitivity of the assumed numbers.
fn print_table(report: &Builtin) -> Result<(), Failure> {
    let rows = &report.rows;
    let params = report.params.join(", ");
    let fit_title = format!(
        "In-sample: residuals of the figures the {} parameters ({params}) were fitted to (steady steps, shipped values)",
        report.fitted
    );
    let sections: [(&str, &str); 6] = [
        (
            "e2e",
            "End to end: published serving runs, each simulated whole from its launch flags and benchmark (sim/scenarios/e2e/; nothing fitted to them)",
        ),
        (
            "e2e_in_sample",
            "End to end, in sample: published serving runs whose figures a calibration anchor was also fitted to",
        ),
        (
            "out_of_sample",
            "Out of sample: each end-to-end anchor predicted by the parameters fitted without it (leave-one-anchor-out)",
        ),
        ("fit", fit_title.as_str()),
        (
            "micro",
            "Microbenchmarks: all-to-all, V4 kernel and MTP acceptance points (the all-to-all, kernel and acceptance parameters are fitted to them)",
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
            "  {:<38} {:<34} {:>11} {:>11} {:>8} {:>12}",
            "anchor",
            "metric",
            "published",
            "predicted",
            "error",
            "how / goal"
        )?;
        for r in &part {
            let bound = match r.bound {
                Some(b) if r.error.is_nan() || r.error.abs() > b => {
                    format!("{:>3.0}% OVER", b * 100.0)
                }
                Some(b) => format!("{:>3.0}%", b * 100.0),
                None => String::new(),
            };
            let how = match (&r.draws, &r.interval) {
                (Some(d), _) => format!(
                    "median of {} draws of the step spread, {:.3} .. {:.3}",
                    d.n, d.min, d.max
                ),
                (None, Some(i)) => format!(
                    "{} 80% {:.3} .. {:.3}{}",
                    r.how.unwrap_or(""),
                    i.p10,
                    i.p90,
                    if i.contains(r.published) {
                        ""
                    } else {
                        " (outside)"
                    }
                ),
                (None, None) => r.how.unwrap_or("").to_owned(),
            };
            outln!(
                "  {:<38} {:<34} {:>11.3} {:>11.3} {:>+7.1}% {how} {bound}",
                r.id,
                r.metric,
                r.published,
                r.predicted,
                r.error * 100.0,
            )?;
        }
        if kind == "out_of_sample" {
            for r in &report.runs {
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
        let held = match coverage(part.iter().copied()) {
            Some(c) => format!(
                "; the 80% intervals hold {:.0}% of the published figures",
                c * 100.0
            ),
            None => String::new(),
        };
        outln!(
            "  mean absolute error {:.1}%, largest {:.1}% ({} figures){held}\n",
            mean_abs(part.iter().copied()) * 100.0,
            max_abs(part.iter().copied()) * 100.0,
            part.len()
        )?;
    }
    if !report.sensitivity.is_empty() {
        outln!(
            "Sensitivity: each number of the {} cost file that is read or assumed rather than fitted, moved up by 20% (efficiencies capped at 1): the steady-step predictions, then the end-to-end suite's figures on it",
            report.fitted
        )?;
        outln!(
            "  {:<34} {:>8} {:>12} {:>12}  {:<34} {:>10} {:>10}  {:<38} source",
            "parameter",
            "value",
            "mean change",
            "max change",
            "most moved",
            "e2e mean",
            "e2e max",
            "e2e most moved"
        )?;
        for x in &report.sensitivity {
            let src: String = x.source.chars().take(60).collect();
            outln!(
                "  {:<34} {:>8.3} {:>11.1}% {:>11.1}%  {:<34} {:>9.1}% {:>9.1}%  {:<38} {src}",
                x.parameter,
                x.value,
                x.mean_change * 100.0,
                x.max_change * 100.0,
                x.max_target,
                x.e2e_mean_change * 100.0,
                x.e2e_max_change * 100.0,
                x.e2e_max_run,
            )?;
        }
    }
    Ok(())
}

/// The share of rows with an interval whose interval holds the published figure; `None` when
/// no row has one.
fn coverage<'a>(rows: impl Iterator<Item = &'a Row>) -> Option<f64> {
    let (inside, n) = rows
        .filter_map(|r| r.interval.map(|i| i.contains(r.published)))
        .fold((0usize, 0usize), |(k, n), c| (k + c as usize, n + 1));
    (n > 0).then(|| inside as f64 / n as f64)
}

fn mean_abs<'a>(rows: impl Iterator<Item = &'a Row>) -> f64 {
    let (sum, n) = rows.fold((0.0, 0usize), |(s, n), r| (s + r.error.abs(), n + 1));
    sum / n.max(1) as f64
}

fn max_abs<'a>(rows: impl Iterator<Item = &'a Row>) -> f64 {
    rows.map(|r| {
        if r.error.is_nan() {
            f64::INFINITY
        } else {
            r.error.abs()
        }
    })
    .fold(0.0, f64::max)
}
