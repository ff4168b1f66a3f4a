//! `dstwin report`: Pareto fronts (CSV, SVG, PNG) and a markdown summary from sweep CSVs,
//! optionally merging the shards of a study; a plan's charts from its plan.json.

use crate::output::{outln, write_file};
use crate::Failure;
use anyhow::{anyhow, Context};
use clap::Args;
use dstwin_sim::plot;
use dstwin_sim::sweep::{front_plot, fronts, read_csv, summary_markdown, write_csv, Row};
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  dstwin report sweep-out/sweep.csv\n      regenerate sweep-out/pareto_{tpot,ttft}.{csv,svg,png} and summary.md\n  dstwin report --merge shard-*/sweep.csv --out study\n      merge the shards of a study (dstwin sweep --shard k/n) into study/sweep.csv and report it\n  dstwin report plan-out/plan.json --out charts\n      draw a plan's charts again (plan_tpot, plan_load_goodput, plan_load_tpot; SVG and PNG)\n      from the plan.json `dstwin plan --out` wrote"
)]
pub struct ReportArgs {
    /// Sweep CSV files (what `dstwin sweep` writes as sweep.csv), or one plan.json (what
    /// `dstwin plan --out` writes).
    #[arg(required = true)]
    csv: Vec<PathBuf>,
    /// Merge several CSVs (shards) into OUT/sweep.csv first; points are matched by id.
    #[arg(long)]
    merge: bool,
    /// Directory for the outputs (default: the CSV's directory).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Reads a sweep CSV (errors name the file and the line).
pub fn read(path: &Path) -> Result<(Vec<String>, Vec<Row>), Failure> {
    let f = std::fs::File::open(path)
        .with_context(|| format!("reading {}", path.display()))
        .map_err(Failure::Input)?;
    read_csv(f).map_err(|e| Failure::Input(anyhow!("{}: {e}", path.display())))
}

/// Writes the fronts (CSV, SVG, PNG) and summary.md for `rows` into `dir`.
pub fn write_report(dir: &Path, axes: &[String], rows: &[Row]) -> Result<Vec<PathBuf>, Failure> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating {}", dir.display()))
        .map_err(Failure::Runtime)?;
    let mut written = Vec::new();
    for f in fronts(rows) {
        let front_rows: Vec<Row> = f.rows.iter().map(|&i| rows[i].clone()).collect();
        let mut buf = Vec::new();
        write_csv(&mut buf, axes, &front_rows).map_err(|e| Failure::Runtime(e.into()))?;
        let p = front_plot(axes, rows, &f);
        for (ext, bytes) in [
            ("csv", buf),
            ("svg", plot::svg(&p).into_bytes()),
            ("png", plot::png(&p)),
        ] {
            let path = dir.join(format!("pareto_{}.{ext}", f.name));
            write_file(&path, &bytes)?;
            written.push(path);
        }
    }
    let md = dir.join("summary.md");
    write_file(&md, summary_markdown(axes, rows).as_bytes())?;
    written.push(md);
    Ok(written)
}

/// Draws a plan's charts from its plan.json into `dir`.
fn plan_charts(path: &Path, dir: &Path) -> Result<(), Failure> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading {}", path.display()))
        .map_err(Failure::Input)?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Failure::Input(anyhow!("{}: {e}", path.display())))?;
    let charts = dstwin_sim::plan::charts::Charts::from_plan_json(&v)
        .map_err(|e| Failure::Input(anyhow!("{}: {e}", path.display())))?;
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating {}", dir.display()))
        .map_err(Failure::Runtime)?;
    for (name, bytes) in charts.files() {
        let p = dir.join(name);
        write_file(&p, &bytes)?;
        outln!("{}", p.display())?;
    }
    Ok(())
}

pub fn run(a: ReportArgs) -> Result<(), Failure> {
    let is_json = |p: &PathBuf| p.extension().is_some_and(|e| e == "json");
    if a.csv.iter().any(is_json) {
        if a.csv.len() > 1 || a.merge {
            return Err(Failure::Input(anyhow!(
                "a plan.json is reported alone: give one file and no --merge"
            )));
        }
        if let Some(d) = &a.out {
            crate::output::check_dir(d, "--out")?;
        }
        let path = &a.csv[0];
        let dir = a.out.clone().unwrap_or_else(|| {
            path.parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| PathBuf::from("."))
        });
        return plan_charts(path, &dir);
    }
    if a.csv.len() > 1 && !a.merge {
        return Err(Failure::Input(anyhow!(
            "several CSVs given: pass --merge to combine them"
        )));
    }
    if let Some(d) = &a.out {
        crate::output::check_dir(d, "--out")?;
    }
    let mut axes: Option<Vec<String>> = None;
    let mut rows: Vec<Row> = Vec::new();
    for p in &a.csv {
        let (ax, rs) = read(p)?;
        match &axes {
            Some(x) if *x != ax => {
                return Err(Failure::Input(anyhow!(
                    "{} varies {} but the first CSV varies {}: not shards of one sweep",
                    p.display(),
                    ax.join(", "),
                    x.join(", ")
                )))
            }
            _ => axes = Some(ax),
        }
        for r in rs {
            if !rows.iter().any(|x| x.id == r.id) {
                rows.push(r);
            }
        }
    }
    let axes = axes.unwrap_or_default();
    rows.sort_by_key(|r| r.index);
    let dir = match &a.out {
        Some(d) => d.clone(),
        None => a.csv[0]
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from(".")),
    };
    if a.merge {
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("creating {}", dir.display()))
            .map_err(Failure::Runtime)?;
        let mut buf = Vec::new();
        write_csv(&mut buf, &axes, &rows).map_err(|e| Failure::Runtime(e.into()))?;
        write_file(&dir.join("sweep.csv"), &buf)?;
        crate::output::errln!(
            "merged {} points into {}",
            rows.len(),
            dir.join("sweep.csv").display()
        );
    }
    for p in write_report(&dir, &axes, &rows)? {
        outln!("{}", p.display())?;
    }
    Ok(())
}
