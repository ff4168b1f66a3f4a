//! The result row of a point: running it, its metrics, and rows as CSV.

use super::{overrides, Axis, Point};
use crate::run::{run, RunOptions};
use crate::scenario::load_str;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;
use thiserror::Error;

/// The metrics of one point (or why it did not run).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    pub index: u64,
    pub id: String,
    /// The varied values, by axis path.
    pub values: BTreeMap<String, String>,
    /// "ok" or "invalid".
    pub status: String,
    /// Why an invalid point could not run.
    pub reason: String,
    pub cards: f64,
    pub requests_finished: u64,
    pub simulated_s: f64,
    pub output_tok_s_per_card: f64,
    pub input_tok_s_per_card: f64,
    pub goodput_req_s: f64,
    pub goodput_per_card: f64,
    pub slo_attainment: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub tpot_p50_ms: f64,
    pub tpot_p99_ms: f64,
    pub e2e_p50_ms: f64,
}

/// The metric columns of a row, in CSV order (after index, id, the axes, status, reason).
pub const METRICS: [&str; 13] = [
    "cards",
    "requests_finished",
    "simulated_s",
    "output_tok_s_per_card",
    "input_tok_s_per_card",
    "goodput_req_s",
    "goodput_per_card",
    "slo_attainment",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "tpot_p50_ms",
    "tpot_p99_ms",
    "e2e_p50_ms",
];

impl Row {
    fn invalid(p: &Point, axes: &[Axis], reason: String) -> Row {
        Row {
            index: p.index,
            id: p.id.clone(),
            values: values_map(axes, &p.values),
            status: "invalid".into(),
            reason,
            cards: 0.0,
            requests_finished: 0,
            simulated_s: 0.0,
            output_tok_s_per_card: 0.0,
            input_tok_s_per_card: 0.0,
            goodput_req_s: 0.0,
            goodput_per_card: 0.0,
            slo_attainment: 0.0,
            ttft_p50_ms: 0.0,
            ttft_p99_ms: 0.0,
            tpot_p50_ms: 0.0,
            tpot_p99_ms: 0.0,
            e2e_p50_ms: 0.0,
        }
    }

    /// The metric values in [`METRICS`] order.
    pub fn metrics(&self) -> [f64; 13] {
        [
            self.cards,
            self.requests_finished as f64,
            self.simulated_s,
            self.output_tok_s_per_card,
            self.input_tok_s_per_card,
            self.goodput_req_s,
            self.goodput_per_card,
            self.slo_attainment,
            self.ttft_p50_ms,
            self.ttft_p99_ms,
            self.tpot_p50_ms,
            self.tpot_p99_ms,
            self.e2e_p50_ms,
        ]
    }

    pub fn ok(&self) -> bool {
        self.status == "ok"
    }
}

fn values_map(axes: &[Axis], values: &[String]) -> BTreeMap<String, String> {
    axes.iter()
        .map(|a| a.path.clone())
        .zip(values.iter().cloned())
        .collect()
}

/// Runs one point: the base scenario text with the point's overrides (after `base_sets`).
/// A scenario that does not validate or cannot run is an invalid row with the reason.
pub fn run_point(
    name: &str,
    text: &str,
    base_dir: &Path,
    base_sets: &[String],
    axes: &[Axis],
    instances: &[String],
    p: &Point,
) -> Row {
    let mut sets = base_sets.to_vec();
    sets.extend(overrides(axes, &p.values, instances));
    let s = match load_str(name, text, base_dir, &sets) {
        Ok(s) => s,
        Err(e) => return Row::invalid(p, axes, one_line(&e)),
    };
    let r = match run(&s, RunOptions::default()) {
        Ok(r) => r.report,
        Err(e) => return Row::invalid(p, axes, one_line(&e)),
    };
    let l = &r.latency;
    Row {
        index: p.index,
        id: p.id.clone(),
        values: values_map(axes, &p.values),
        status: "ok".into(),
        reason: String::new(),
        cards: r.cards,
        requests_finished: r.requests_finished,
        simulated_s: r.simulated_s,
        output_tok_s_per_card: r.output_tok_s_per_card,
        input_tok_s_per_card: r.input_tok_s_per_card,
        goodput_req_s: r.goodput,
        goodput_per_card: r.goodput / r.cards.max(f64::MIN_POSITIVE),
        slo_attainment: r.slo_attainment,
        ttft_p50_ms: l.ttft_ms.p50,
        ttft_p99_ms: l.ttft_ms.p99,
        tpot_p50_ms: l.tpot_ms.p50,
        tpot_p99_ms: l.tpot_ms.p99,
        e2e_p50_ms: l.e2e_ms.p50,
    }
}

/// An error with its causes on one line.
pub fn one_line(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s.replace('\n', " ")
}

/// CSV header: index, id, the axes, status, reason, the metrics.
pub fn csv_header(axes: &[String]) -> Vec<String> {
    let mut h = vec!["index".to_string(), "id".to_string()];
    h.extend(axes.iter().cloned());
    h.push("status".into());
    h.push("reason".into());
    h.extend(METRICS.iter().map(|m| m.to_string()));
    h
}

/// One row as CSV fields, in [`csv_header`] order.
pub fn csv_record(axes: &[String], r: &Row) -> Vec<String> {
    let mut f = vec![r.index.to_string(), r.id.clone()];
    f.extend(
        axes.iter()
            .map(|a| r.values.get(a).cloned().unwrap_or_default()),
    );
    f.push(r.status.clone());
    f.push(r.reason.clone());
    f.extend(r.metrics().iter().map(|v| format!("{v}")));
    f
}

/// A sweep CSV that cannot be read back.
#[derive(Debug, Error)]
pub enum CsvError {
    #[error(transparent)]
    Csv(#[from] csv::Error),
    #[error("line {line}: {reason}")]
    Row { line: u64, reason: String },
    #[error("not a sweep CSV: the header has no {0} column")]
    Header(String),
}

/// Reads a sweep CSV: its axes and rows. Rows cut short (an interrupted run) are dropped.
pub fn read_csv<R: std::io::Read>(r: R) -> Result<(Vec<String>, Vec<Row>), CsvError> {
    let mut rd = csv::ReaderBuilder::new().flexible(true).from_reader(r);
    let header: Vec<String> = rd.headers()?.iter().map(str::to_string).collect();
    let pos = |name: &str| {
        header
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| CsvError::Header(name.to_string()))
    };
    let status = pos("status")?;
    if pos("index")? != 0 || pos("id")? != 1 || pos("reason")? != status + 1 {
        return Err(CsvError::Header("index, id, ..., status, reason".into()));
    }
    let axes: Vec<String> = header[2..status].to_vec();
    let first_metric = status + 2;
    let mut rows = Vec::new();
    for rec in rd.records() {
        let rec = rec?;
        if rec.len() != header.len() {
            // A row an interrupted run did not finish writing.
            continue;
        }
        let line = rec.position().map_or(0, |p| p.line());
        let bad = |reason: String| CsvError::Row { line, reason };
        let num = |i: usize| -> Result<f64, CsvError> {
            rec[i]
                .parse::<f64>()
                .map_err(|_| bad(format!("{} = '{}' is not a number", header[i], &rec[i])))
        };
        let m: Vec<f64> = (first_metric..header.len())
            .map(num)
            .collect::<Result<_, _>>()?;
        if m.len() != METRICS.len() {
            return Err(bad(format!("expected {} metric columns", METRICS.len())));
        }
        rows.push(Row {
            index: rec[0]
                .parse()
                .map_err(|_| bad(format!("index '{}' is not a number", &rec[0])))?,
            id: rec[1].to_string(),
            values: axes
                .iter()
                .cloned()
                .zip((2..status).map(|i| rec[i].to_string()))
                .collect(),
            status: rec[status].to_string(),
            reason: rec[status + 1].to_string(),
            cards: m[0],
            requests_finished: m[1] as u64,
            simulated_s: m[2],
            output_tok_s_per_card: m[3],
            input_tok_s_per_card: m[4],
            goodput_req_s: m[5],
            goodput_per_card: m[6],
            slo_attainment: m[7],
            ttft_p50_ms: m[8],
            ttft_p99_ms: m[9],
            tpot_p50_ms: m[10],
            tpot_p99_ms: m[11],
            e2e_p50_ms: m[12],
        });
    }
    Ok((axes, rows))
}

/// Writes a whole sweep CSV.
pub fn write_csv<W: std::io::Write>(w: W, axes: &[String], rows: &[Row]) -> Result<(), csv::Error> {
    let mut wr = csv::Writer::from_writer(w);
    wr.write_record(csv_header(axes))?;
    for r in rows {
        wr.write_record(csv_record(axes, r))?;
    }
    wr.flush()?;
    Ok(())
}

/// A point's varied values as `a=1 b=2`.
pub fn label(axes: &[String], r: &Row) -> String {
    axes.iter()
        .map(|a| format!("{a}={}", r.values.get(a).map_or("", String::as_str)))
        .collect::<Vec<_>>()
        .join(" ")
}
