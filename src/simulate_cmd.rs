//! `dstwin simulate`: runs a scenario and writes its reports.

use crate::output::{out, outln};
use crate::Failure;
use anyhow::Context;
use clap::Args;
use dstwin_sim::report::{chrome_trace, render_sim, sim_csv, write_requests_csv};
use dstwin_sim::run::{run, Progress, RunOptions};
use dstwin_sim::scenario::{load_path, load_str, Scenario};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The scenario `dstwin simulate` runs without arguments.
pub const DEFAULT_SCENARIO: &str = include_str!("../sim/scenarios/a3-2p1d.toml");

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  dstwin simulate\n      the built-in default: vllm-ascend's 2P1D on four Atlas 800 A3 nodes, 1,000 requests\n  dstwin simulate sim/scenarios/cm384-pd.toml --set decode.max_num_seqs=32 --json\n  dstwin simulate s.toml --requests-csv reqs.csv --timeline steps.json   (open steps.json in ui.perfetto.dev)\n\nScenario fields: docs/scenarios.md. Exit codes: 0 ok, 2 invalid scenario or workload (nothing written), 1 other failures."
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
    /// No progress bar and no footer on stderr.
    #[arg(long, short)]
    quiet: bool,
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    std::fs::write(path, bytes)
        .with_context(|| format!("writing {}", path.display()))
        .map_err(Failure::Runtime)
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
            per_request: a.requests_csv.is_some(),
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
    if let Some(p) = &a.timeline {
        let doc = serde_json::to_vec(&chrome_trace(&result.timeline))
            .map_err(|e| Failure::Runtime(e.into()))?;
        write_file(p, &doc)?;
    }
    if a.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(r).map_err(|e| Failure::Runtime(e.into()))?
        )?;
    } else if a.csv {
        out!("{}", sim_csv(r))?;
    } else {
        out!("{}", render_sim(r))?;
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
