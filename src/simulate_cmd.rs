//! `dstwin simulate`: runs a scenario and writes its reports.

use crate::output::{out, outln, write_file};
use crate::Failure;
use anyhow::Context;
use clap::Args;
use dstwin_calibration::anchors::RunMetric;
use dstwin_sim::report::{chrome_trace, render_sim, sim_csv, write_requests_csv};
use dstwin_sim::run::SimReport;
use dstwin_sim::run::{run, Progress, RunOptions};
use dstwin_sim::scenario::{load_path, load_str, Scenario};
use dstwin_sim::uncertainty::{perturbed, Interval};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The scenario `dstwin simulate` runs without arguments.
pub const DEFAULT_SCENARIO: &str = include_str!("../sim/scenarios/a3-2p1d.toml");

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  dstwin simulate\n      the built-in default: vllm-ascend's 2P1D on four Atlas 800 A3 nodes, 1,000 requests\n  dstwin simulate sim/scenarios/cm384-pd.toml --set decode.max_num_seqs=32 --json\n  dstwin simulate s.toml --requests-csv reqs.csv --timeline steps.json   (open steps.json in ui.perfetto.dev)\n  dstwin simulate s.toml --uncertainty --json\n      every headline metric with its 80% interval over 16 draws of what the scenario leaves unknown\n\nScenario fields: docs/scenarios.md. Exit codes: 0 ok, 2 invalid scenario or workload (nothing written), 1 other failures."
)]
pub struct SimulateArgs {
    /// Scenario file (TOML); without it, the built-in default scenario.
    scenario: Option<PathBuf>,
    /// Override a scenario field: PATH=VALUE, e.g. decode.max_num_seqs=64 or seed=7 (repeatable).
    #[arg(long = "set", value_name = "PATH=VALUE")]
    sets: Vec<String>,
    /// Print the report as JSON (deterministic: same scenario and seed, same bytes).
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// Print the headline metrics as CSV (header + one row).
    #[arg(long)]
    csv: bool,
    /// Also write one CSV row per finished request to this file.
    #[arg(long, value_name = "FILE")]
    requests_csv: Option<PathBuf>,
    /// Also write a chrome-trace timeline of steps and KV transfers to this file (Perfetto).
    #[arg(long, value_name = "FILE")]
    timeline: Option<PathBuf>,
    /// Step every decoding request every step instead of advancing steady ones in aggregate:
    /// the same report, slower (for checking the aggregation and for profiling).
    #[arg(long)]
    step_by_step: bool,
    /// Another draw of the steps' spread around their price (a cost file's `[host] step_sigma`):
    /// the same requests and lengths (from the seed; an open loop's arrivals too), each step's
    /// time drawn again.
    /// 0 is the seed's own draw; without a spread every draw is the same run.
    #[arg(long, default_value_t = 0, value_name = "N")]
    draw: u64,
    /// Also give every headline metric an 80% interval (10th to 90th percentile) over N draws
    /// of what the scenario leaves unknown: the expert load's draws, skew and per-request
    /// concentration, the calibrated MTP acceptance, kernel time by the fitted parameters'
    /// leave-one-out spread, eager launch time (docs/validation.md, "Uncertainty"). JSON:
    /// `uncertainty.<metric>.p10/p90`. N defaults to 16; give another as `--uncertainty=N`.
    #[arg(
        long,
        value_name = "N",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "16",
        conflicts_with = "csv"
    )]
    uncertainty: Option<u32>,
    /// Also write charts of the run into this directory (SVG and PNG): TTFT and TPOT CDFs over
    /// the finished requests with the scenario's SLOs, each instance's step time by op class,
    /// and the memory map of each instance kind's fullest die.
    #[arg(long, value_name = "DIR")]
    plots: Option<PathBuf>,
    /// No progress bar and no footer on stderr.
    #[arg(long, short)]
    quiet: bool,
}

/// A scenario file with overrides, or the built-in default scenario without a file.
pub fn load_scenario(path: Option<&Path>, sets: &[String]) -> Result<Scenario, Failure> {
    match path {
        Some(p) => load_path(p, sets),
        None => load_str(
            "default scenario (a3-2p1d)",
            DEFAULT_SCENARIO,
            Path::new("."),
            sets,
        ),
    }
    .map_err(|e| Failure::Input(e.into()))
}

pub fn run_cmd(a: SimulateArgs) -> Result<(), Failure> {
    let scenario = load_scenario(a.scenario.as_deref(), &a.sets)?;
    // An output that cannot be written fails now, not after the run.
    if let Some(p) = &a.requests_csv {
        crate::output::check_file(p, "--requests-csv")?;
    }
    if let Some(p) = &a.timeline {
        crate::output::check_file(p, "--timeline")?;
    }
    if let Some(d) = &a.plots {
        crate::output::check_dir(d, "--plots")?;
    }
    let bar = crate::progress::bar(
        None,
        a.quiet,
        "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} requests finished, {msg}",
    );
    let mut on_progress = |p: &Progress| {
        if let Some(total) = p.total {
            bar.set_length(total);
        }
        bar.set_position(p.finished);
        bar.set_message(format!("simulated {:.1} s", p.now.as_secs_f64()));
    };
    let started = Instant::now();
    let result = run(
        &scenario,
        RunOptions {
            progress: Some(&mut on_progress),
            timeline: a.timeline.is_some(),
            per_request: a.requests_csv.is_some() || a.plots.is_some(),
            step_by_step: a.step_by_step,
            draw: a.draw,
            ..RunOptions::default()
        },
    )
    .map_err(|e| Failure::Input(e.into()))?;
    let wall = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let r = &result.report;
    if let Some(p) = &a.requests_csv {
        let mut buf = Vec::new();
        write_requests_csv(&result.requests, &mut buf).map_err(|e| Failure::Runtime(e.into()))?;
        write_file(p, &buf)?;
    }
    if let Some(d) = &a.plots {
        std::fs::create_dir_all(d)
            .with_context(|| format!("creating {}", d.display()))
            .map_err(Failure::Runtime)?;
        for (name, bytes) in dstwin_sim::plot::run_charts(&scenario, r, &result.requests) {
            write_file(&d.join(name), &bytes)?;
        }
    }
    if let Some(p) = &a.timeline {
        let doc = serde_json::to_vec(&chrome_trace(&result.timeline))
            .map_err(|e| Failure::Runtime(e.into()))?;
        write_file(p, &doc)?;
    }
    let intervals = match a.uncertainty {
        Some(n) => Some(uncertainty(&scenario, r, n)?),
        None => None,
    };
    if a.json {
        let text = match &intervals {
            None => serde_json::to_string_pretty(r),
            Some(u) => serde_json::to_value(r).and_then(|mut v| {
                v["uncertainty"] = u.json();
                serde_json::to_string_pretty(&v)
            }),
        };
        outln!("{}", text.map_err(|e| Failure::Runtime(e.into()))?)?;
    } else if a.csv {
        out!("{}", sim_csv(r))?;
    } else {
        out!("{}", render_sim(r))?;
        if let Some(u) = &intervals {
            out!("{}", u.table())?;
        }
    }
    if !a.quiet {
        crate::output::errln!(
            "wall {:.2} s: {:.0} simulated requests per wall second, {:.1} simulated seconds per wall second, {} events, price cache hits {:.1}%, request-steps in aggregate {:.1}%",
            wall,
            r.requests_finished as f64 / wall.max(1e-9),
            r.simulated_s / wall.max(1e-9),
            r.events,
            r.price_cache_hit_rate * 100.0,
            result.steady_share * 100.0
        );
    }
    Ok(())
}

/// Every headline metric's 80% interval over draws of what a scenario leaves unknown.
struct Intervals {
    draws: u32,
    rows: Vec<(RunMetric, f64, Interval)>,
}

/// Runs draws 1..=`n` of `s` (`dstwin_sim::uncertainty`) in parallel; `r` is draw 0's report.
fn uncertainty(s: &Scenario, r: &SimReport, n: u32) -> Result<Intervals, Failure> {
    use rayon::prelude::*;
    if n < 2 {
        return Err(Failure::Input(anyhow::anyhow!(
            "--uncertainty {n}: give at least 2 draws (16 if the number is left out)"
        )));
    }
    let reports: Vec<SimReport> = (1..=n as u64)
        .into_par_iter()
        .map(|k| run(&perturbed(s, k), RunOptions::default()).map(|x| x.report))
        .collect::<Result<_, _>>()
        .map_err(|e| Failure::Runtime(e.into()))?;
    let rows = RunMetric::ALL
        .iter()
        .map(|&m| {
            let v: Vec<f64> = reports.iter().map(|x| m.read(x)).collect();
            (m, m.read(r), Interval::of(&v))
        })
        .filter(|(_, x, i)| x.is_finite() && i.p10.is_finite() && i.p90.is_finite())
        .collect();
    Ok(Intervals { draws: n, rows })
}

impl Intervals {
    fn json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({ "draws": self.draws });
        for (m, _, i) in &self.rows {
            v[m.name()] = serde_json::json!({ "p10": i.p10, "p90": i.p90 });
        }
        v
    }

    fn table(&self) -> String {
        let mut t = format!(
            "\n  80% intervals over {} draws of what the scenario leaves unknown (docs/validation.md, \"Uncertainty\")\n  {:<30} {:>12} {:>12} {:>12}\n",
            self.draws, "metric", "this run", "p10", "p90"
        );
        for (m, x, i) in &self.rows {
            t.push_str(&format!(
                "  {:<30} {:>12.3} {:>12.3} {:>12.3}\n",
                m.name(),
                x,
                i.p10,
                i.p90
            ));
        }
        t
    }
}
