//! `dstwin sweep`: a grid of what-if overrides over a base scenario, every point simulated in
//! parallel, results appended as they finish (a re-run resumes), then the fronts and summary.

use crate::output::outln;
use crate::report_cmd::{read, write_report};
use crate::Failure;
use anyhow::{anyhow, Context};
use clap::Args;
use dstwin_sim::scenario::{load_str, ScenarioError};
use dstwin_sim::sweep::{
    csv_record, grid, instance_names, overrides, run_point, write_csv, Axis, Row, Shard,
};
use rayon::prelude::*;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  dstwin sweep sim/scenarios/a3-2p1d.toml --vary decode.max_num_seqs=16..64:16 --vary mtp.tokens=0,1,2,3\n  dstwin sweep base.toml --vary decode.ep=64,128,320 --vary prefill.instances=2..8 \\\n      --vary decode.max_num_seqs=16..128:16 --vary eplb.redundant=0,16,32 --vary mtp.tokens=0,1,2\n  dstwin sweep base.toml --vary ... --shard 3/8 --out shard-3   (then: dstwin report --merge shard-*/sweep.csv)\n\nPATH is any field `--set` takes (docs/scenarios.md), plus shorthands: NAME.ep (an instance's\nEP size = its dies), NAME.instances (its count), eplb.redundant (redundant experts of every\ninstance; with [eplb] policy left out it also moves each instance from the contiguous placement\nat 0 to greedy EPLB above 0: set eplb.policy to compare redundancy alone). VALUES: a list (16,32,64), a range (2..8) or a stepped range (16..128:16).\nOutputs in --out: sweep.csv (one row per point, appended as points finish: an interrupted\nsweep re-run with the same arguments skips finished points), sweep.json, pareto_tpot.* and\npareto_ttft.* (CSV, SVG, PNG; the knee marked), summary.md. Points whose scenario is invalid\n(does not fit, bad layout) are recorded with the reason and skipped."
)]
pub struct SweepArgs {
    /// The base scenario.
    scenario: PathBuf,
    /// An axis: PATH=VALUES (repeatable; the grid is their cartesian product).
    #[arg(
        long = "vary",
        value_name = "PATH=VALUES",
        required_unless_present = "axes"
    )]
    vary: Vec<String>,
    /// A sweep file: one PATH=VALUES axis per line ('#' starts a comment), before any --vary.
    #[arg(long, value_name = "FILE")]
    axes: Option<PathBuf>,
    /// Override the base scenario for every point (as for `simulate`).
    #[arg(long = "set", value_name = "PATH=VALUE")]
    sets: Vec<String>,
    /// Output directory.
    #[arg(long, default_value = "sweep-out")]
    out: PathBuf,
    /// Run only the points whose index is K modulo N (K from 0), for batch clusters.
    #[arg(long, value_name = "K/N")]
    shard: Option<String>,
    /// Worker threads, 1 to 1024 (default: every core).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    jobs: Option<u16>,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

fn input(e: impl Into<anyhow::Error>) -> Failure {
    Failure::Input(e.into())
}

pub fn run(a: SweepArgs) -> Result<(), Failure> {
    let text = std::fs::read_to_string(&a.scenario)
        .with_context(|| format!("reading {}", a.scenario.display()))
        .map_err(Failure::Input)?;
    let name = a.scenario.display().to_string();
    let base_dir = a.scenario.parent().unwrap_or(Path::new(".")).to_path_buf();
    // The base must be valid on its own.
    load_str(&name, &text, &base_dir, &a.sets).map_err(input)?;
    let mut specs: Vec<String> = Vec::new();
    if let Some(f) = &a.axes {
        let t = std::fs::read_to_string(f)
            .with_context(|| format!("reading {}", f.display()))
            .map_err(Failure::Input)?;
        for (i, line) in t.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            Axis::parse(line).map_err(|e| input(anyhow!("{}:{}: {e}", f.display(), i + 1)))?;
            specs.push(line.to_string());
        }
    }
    specs.extend(a.vary.iter().cloned());
    if specs.is_empty() {
        return Err(input(anyhow!(
            "no axes: give --vary PATH=VALUES or --axes FILE"
        )));
    }
    let axes: Vec<Axis> = specs
        .iter()
        .map(|v| Axis::parse(v))
        .collect::<Result<_, _>>()
        .map_err(input)?;
    let paths: Vec<String> = axes.iter().map(|x| x.path.clone()).collect();
    if let Some(dup) = paths
        .iter()
        .enumerate()
        .find(|(i, p)| paths[..*i].contains(p))
    {
        return Err(input(anyhow!("--vary {} given twice", dup.1)));
    }
    let instances = instance_names(&text);
    // A path the scenario does not have is an input error, not a thousand invalid points.
    for x in &axes {
        let mut sets = a.sets.clone();
        sets.extend(overrides(
            std::slice::from_ref(x),
            &x.values[..1],
            &instances,
        ));
        if let Err(e) = load_str(&name, &text, &base_dir, &sets) {
            let unknown = match &e {
                ScenarioError::Parse { message, .. } => message.contains("unknown field"),
                ScenarioError::Field { field, .. } => field == "--set",
                _ => false,
            };
            if unknown {
                return Err(input(anyhow!("--vary {}: no such field: {e}", x.path)));
            }
        }
    }
    let shard = a
        .shard
        .as_deref()
        .map(Shard::parse)
        .transpose()
        .map_err(input)?;
    let points: Vec<_> = grid(&axes)
        .map_err(input)?
        .into_iter()
        .filter(|p| shard.is_none_or(|s| s.contains(p)))
        .collect();

    crate::output::check_dir(&a.out, "--out")?;
    let csv_path = a.out.join("sweep.csv");
    // Resume: keep the rows of this grid that are already there.
    let mut done: Vec<Row> = Vec::new();
    if csv_path.exists() {
        let (old_axes, rows) = read(&csv_path)?;
        if old_axes != paths {
            return Err(input(anyhow!(
                "{} holds a sweep over {}, not {}: choose another --out",
                csv_path.display(),
                old_axes.join(", "),
                paths.join(", ")
            )));
        }
        done = rows
            .into_iter()
            .filter(|r| points.iter().any(|p| p.id == r.id))
            .collect();
    }
    let todo: Vec<_> = points
        .iter()
        .filter(|p| !done.iter().any(|r| r.id == p.id))
        .cloned()
        .collect();
    // Rewrite what is kept (drops a half-written last line), then append as points finish.
    {
        let mut buf = Vec::new();
        write_csv(&mut buf, &paths, &done).map_err(|e| Failure::Runtime(e.into()))?;
        crate::output::write_file(&csv_path, &buf)?;
    }
    let file = std::fs::OpenOptions::new()
        .append(true)
        .open(&csv_path)
        .with_context(|| format!("opening {}", csv_path.display()))
        .map_err(Failure::Runtime)?;
    let mut writer = csv::WriterBuilder::new()
        .has_headers(false)
        .from_writer(file);

    let bar = crate::progress::bar(
        Some(todo.len() as u64),
        a.quiet,
        "{bar:40} {pos}/{len} points [{elapsed_precise}, eta {eta}] {msg}",
    );
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.jobs.map_or(0, usize::from))
        .build()
        .map_err(|e| Failure::Runtime(e.into()))?;
    let started = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel::<Row>();
    let mut new_rows = Vec::with_capacity(todo.len());
    let mut write_err = None;
    std::thread::scope(|scope| {
        let (text, base_dir, sets, axes, instances) =
            (&text, &base_dir, &a.sets, &axes, &instances);
        let name = &name;
        let todo = &todo;
        let pool = &pool;
        scope.spawn(move || {
            pool.install(|| {
                todo.par_iter().for_each_with(tx, |tx, p| {
                    let row = run_point(name, text, base_dir, sets, axes, instances, p);
                    let _ = tx.send(row);
                });
            });
        });
        for row in rx {
            if write_err.is_none() {
                let r = writer
                    .write_record(csv_record(&paths, &row))
                    .and_then(|_| writer.flush().map_err(csv::Error::from));
                if let Err(e) = r {
                    write_err = Some(e);
                }
            }
            if !row.ok() {
                bar.println(format!(
                    "invalid point {}: {}",
                    dstwin_sim::sweep::label(&paths, &row),
                    row.reason
                ));
            }
            bar.inc(1);
            new_rows.push(row);
        }
    });
    bar.finish_and_clear();
    if let Some(e) = write_err {
        return Err(Failure::Runtime(anyhow!(
            "writing {}: {e}",
            csv_path.display()
        )));
    }
    let wall = started.elapsed().as_secs_f64();
    let mut rows = done;
    let resumed = rows.len();
    rows.extend(new_rows);
    rows.sort_by_key(|r| r.index);
    // The final CSV in grid order, and JSON.
    let mut buf = Vec::new();
    write_csv(&mut buf, &paths, &rows).map_err(|e| Failure::Runtime(e.into()))?;
    crate::output::write_file(&csv_path, &buf)?;
    let json = serde_json::json!({
        "scenario": name,
        "axes": axes,
        "shard": a.shard,
        "rows": rows,
    });
    let json_path = a.out.join("sweep.json");
    crate::output::write_file(
        &json_path,
        &serde_json::to_vec_pretty(&json).map_err(|e| Failure::Runtime(e.into()))?,
    )?;
    write_report(&a.out, &paths, &rows)?;
    let invalid = rows.iter().filter(|r| !r.ok()).count();
    let ran = rows.len() - resumed;
    outln!(
        "{} points: {ran} simulated, {resumed} already done, {invalid} invalid; results in {}",
        rows.len(),
        a.out.display()
    )?;
    if let Some(best) = rows.iter().filter(|r| r.ok()).max_by(|x, y| {
        x.goodput_per_card
            .total_cmp(&y.goodput_per_card)
            .then(y.index.cmp(&x.index))
    }) {
        outln!(
            "best goodput per card: {:.4} req/s ({:.1} output tok/s/card, TPOT p50 {:.1} ms, TTFT p50 {:.0} ms) at {}",
            best.goodput_per_card,
            best.output_tok_s_per_card,
            best.tpot_p50_ms,
            best.ttft_p50_ms,
            dstwin_sim::sweep::label(&paths, best)
        )?;
    }
    if !a.quiet {
        crate::output::errln!(
            "wall {wall:.2} s: {:.1} points per second",
            ran as f64 / wall.max(1e-9)
        );
    }
    // A sweep in which no point could run produced nothing to compare. A shard is part of a
    // study whose other shards may hold the valid points: it says so and succeeds.
    if !rows.is_empty() && invalid == rows.len() && a.shard.is_some() {
        crate::output::errln!(
            "note: every one of the {} points of shard {} is invalid",
            rows.len(),
            a.shard.as_deref().unwrap_or_default()
        );
    } else if !rows.is_empty() && invalid == rows.len() {
        let first = &rows[0];
        return Err(Failure::Input(anyhow!(
            "every one of the {} points is invalid, e.g. {}: {}",
            rows.len(),
            dstwin_sim::sweep::label(&paths, first),
            first.reason
        )));
    }
    Ok(())
}
