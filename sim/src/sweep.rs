//! What-if sweeps: a grid of scenario overrides, the result row of each point, sharding, and
//! Pareto fronts. IO-free: the CLI reads and writes files and runs points in parallel.
//!
//! An axis is `PATH=VALUES` where PATH is anything `--set` accepts (docs/scenarios.md), plus
//! shorthands: `NAME.ep` (expert-parallel size; an instance's EP spans its dies, so it sets both
//! `dies` and `ep`), `NAME.instances` (= `count`), `eplb.redundant` (redundant experts of every
//! instance). VALUES is a comma list (`16,32,64`, `true,false`, `greedy,global`), an inclusive
//! integer range `2..8`, or a stepped one `16..128:16`.

use crate::run::{run, RunOptions};
use crate::scenario::load_str;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;
use thiserror::Error;

/// A bad axis or shard: names the argument and what is wrong.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SweepError {
    #[error("--vary {arg}: {reason}")]
    Axis { arg: String, reason: String },
    #[error("--shard {arg}: {reason}")]
    Shard { arg: String, reason: String },
    #[error("the grid has {points} points ({sizes}); at most {MAX_POINTS}: split the study into several sweeps")]
    Grid { points: String, sizes: String },
}

/// The most points one sweep may have: each is a whole simulation (about a second), so a million
/// is days of work; a larger grid is almost always a typo in a range.
pub const MAX_POINTS: u64 = 1_000_000;

/// The number of points of the grid over `axes`, checked against [`MAX_POINTS`] before anything
/// is allocated.
pub fn grid_size(axes: &[Axis]) -> Result<usize, SweepError> {
    let sizes = || {
        axes.iter()
            .map(|a| format!("{} x {}", a.values.len(), a.path))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let points = axes
        .iter()
        .try_fold(1u64, |n, a| n.checked_mul(a.values.len() as u64));
    match points {
        Some(n) if n <= MAX_POINTS => Ok(n as usize),
        Some(n) => Err(SweepError::Grid {
            points: n.to_string(),
            sizes: sizes(),
        }),
        None => Err(SweepError::Grid {
            points: "more than 2^64".into(),
            sizes: sizes(),
        }),
    }
}

/// One varied field and its values (as `--set` text).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Axis {
    pub path: String,
    pub values: Vec<String>,
}

fn axis_err(arg: &str, reason: impl Into<String>) -> SweepError {
    SweepError::Axis {
        arg: arg.to_string(),
        reason: reason.into(),
    }
}

impl Axis {
    /// Parses `PATH=VALUES`.
    pub fn parse(arg: &str) -> Result<Axis, SweepError> {
        let (path, spec) = arg.split_once('=').ok_or_else(|| {
            axis_err(
                arg,
                "expected PATH=VALUES, e.g. decode.max_num_seqs=16..64:16",
            )
        })?;
        let path = path.trim();
        if path.is_empty() || path.split('.').any(str::is_empty) {
            return Err(axis_err(arg, "empty field path"));
        }
        let values = parse_values(spec).map_err(|r| axis_err(arg, r))?;
        Ok(Axis {
            path: path.to_string(),
            values,
        })
    }
}

fn parse_values(spec: &str) -> Result<Vec<String>, String> {
    let spec = spec.trim();
    if let Some((a, rest)) = spec.split_once("..") {
        let (b, step) = match rest.split_once(':') {
            Some((b, s)) => (b, s),
            None => (rest, "1"),
        };
        let num = |s: &str, what: &str| {
            s.trim()
                .parse::<i64>()
                .map_err(|_| format!("{what} '{s}' is not an integer"))
        };
        let (a, b, step) = (num(a, "start")?, num(b, "end")?, num(step, "step")?);
        // In i128: the span and the values of a range near the ends of i64 overflow i64.
        let (a, b, step) = (i128::from(a), i128::from(b), i128::from(step));
        if step <= 0 {
            return Err(format!("step must be positive, got {step}"));
        }
        if b < a {
            return Err(format!("range {a}..{b} is empty"));
        }
        if (b - a) / step >= 10_000 {
            return Err("more than 10,000 values".into());
        }
        return Ok((0..)
            .map(|i| a + i * step)
            .take_while(|v| *v <= b)
            .map(|v| v.to_string())
            .collect());
    }
    let values: Vec<String> = spec.split(',').map(|v| v.trim().to_string()).collect();
    if values.iter().any(String::is_empty) {
        return Err("empty value in the list".into());
    }
    Ok(values)
}

/// One point of the grid: its index, a stable id, and the value of each axis.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Point {
    pub index: u64,
    /// Hash of the varied values: the key a resumed sweep skips finished points by.
    pub id: String,
    pub values: Vec<String>,
}

/// The cartesian product of the axes, the last axis varying fastest.
pub fn grid(axes: &[Axis]) -> Result<Vec<Point>, SweepError> {
    let total = grid_size(axes)?;
    Ok((0..total)
        .map(|index| {
            let mut rem = index;
            let mut values = vec![String::new(); axes.len()];
            for (k, a) in axes.iter().enumerate().rev() {
                values[k] = a.values[rem % a.values.len()].clone();
                rem /= a.values.len();
            }
            Point {
                index: index as u64,
                id: point_id(axes, &values),
                values,
            }
        })
        .collect())
}

fn point_id(axes: &[Axis], values: &[String]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (a, v) in axes.iter().zip(values) {
        for b in a.path.bytes().chain([b'=']).chain(v.bytes()).chain([b';']) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// `k/n`: the points whose index is k modulo n (k counts from 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub k: u64,
    pub n: u64,
}

impl Shard {
    pub fn parse(arg: &str) -> Result<Shard, SweepError> {
        let err = |r: &str| SweepError::Shard {
            arg: arg.to_string(),
            reason: r.to_string(),
        };
        let (k, n) = arg
            .split_once('/')
            .ok_or_else(|| err("expected K/N, e.g. 0/4"))?;
        let k: u64 = k.trim().parse().map_err(|_| err("K is not a number"))?;
        let n: u64 = n.trim().parse().map_err(|_| err("N is not a number"))?;
        if n == 0 || k >= n {
            return Err(err("need 0 <= K < N"));
        }
        Ok(Shard { k, n })
    }

    pub fn contains(&self, p: &Point) -> bool {
        p.index % self.n == self.k
    }
}

/// The `--set` overrides of a point, shorthands expanded against the base scenario's instance
/// names.
pub fn overrides(axes: &[Axis], values: &[String], instances: &[String]) -> Vec<String> {
    let mut sets = Vec::new();
    for (a, v) in axes.iter().zip(values) {
        let parts: Vec<&str> = a.path.split('.').collect();
        match parts.as_slice() {
            [name, "ep"] if instances.iter().any(|i| i == name) => {
                sets.push(format!("{name}.dies={v}"));
                sets.push(format!("{name}.ep={v}"));
            }
            [name, "instances"] if instances.iter().any(|i| i == name) => {
                sets.push(format!("{name}.count={v}"));
            }
            ["eplb", "redundant"] => {
                for i in instances {
                    sets.push(format!("{i}.redundant_experts={v}"));
                }
            }
            _ => sets.push(format!("{}={v}", a.path)),
        }
    }
    sets
}

/// The instance names of a scenario text (for shorthands), in file order.
pub fn instance_names(text: &str) -> Vec<String> {
    toml::from_str::<toml::Table>(text)
        .ok()
        .and_then(|t| t.get("instance").and_then(|v| v.as_array().cloned()))
        .unwrap_or_default()
        .iter()
        .filter_map(|i| {
            i.get("name")
                .and_then(toml::Value::as_str)
                .map(str::to_string)
        })
        .collect()
}

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

/// The points of a front: better `y` (higher) for no worse `x` (lower), sorted by `x`.
/// `pts` are (x, y, row index).
pub fn pareto(pts: &[(f64, f64, usize)]) -> Vec<(f64, f64, usize)> {
    let mut v: Vec<_> = pts
        .iter()
        .copied()
        .filter(|p| p.0.is_finite() && p.1.is_finite())
        .collect();
    // Low x first; at equal x, high y first.
    v.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
    let mut front: Vec<(f64, f64, usize)> = Vec::new();
    for p in v {
        if front.last().is_none_or(|l| p.1 > l.1) {
            front.push(p);
        }
    }
    front
}

/// The knee of a front: the point farthest from the line joining its ends, both axes scaled to
/// [0, 1]. `None` for fronts of fewer than three points.
pub fn knee(front: &[(f64, f64, usize)]) -> Option<usize> {
    if front.len() < 3 {
        return None;
    }
    let (x0, x1) = (front[0].0, front[front.len() - 1].0);
    let (ymin, ymax) = front
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
    let sx = (x1 - x0).max(f64::MIN_POSITIVE);
    let sy = (ymax - ymin).max(f64::MIN_POSITIVE);
    let n = |p: &(f64, f64, usize)| ((p.0 - x0) / sx, (p.1 - ymin) / sy);
    let (ax, ay) = n(&front[0]);
    let (bx, by) = n(&front[front.len() - 1]);
    let len = ((bx - ax).powi(2) + (by - ay).powi(2))
        .sqrt()
        .max(f64::MIN_POSITIVE);
    (1..front.len() - 1)
        .map(|i| {
            let (px, py) = n(&front[i]);
            (
                ((by - ay) * px - (bx - ax) * py + bx * ay - by * ax).abs() / len,
                i,
            )
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, i)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn values_lists_and_ranges() {
        let a = Axis::parse("decode.max_num_seqs=16..64:16").unwrap();
        assert_eq!(a.values, ["16", "32", "48", "64"]);
        assert_eq!(
            Axis::parse("prefill.instances=2..4").unwrap().values,
            ["2", "3", "4"]
        );
        assert_eq!(
            Axis::parse("mtp.tokens=0, 1,2").unwrap().values,
            ["0", "1", "2"]
        );
        assert_eq!(
            Axis::parse("eplb.policy=greedy,global")
                .unwrap()
                .values
                .len(),
            2
        );
        for bad in [
            "x",
            "=1",
            "a.b=",
            "a.b=1,,2",
            "a.b=5..1",
            "a.b=1..9:0",
            "a..b=1",
        ] {
            assert!(Axis::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn grid_is_the_cartesian_product_last_axis_fastest() {
        let axes = vec![
            Axis::parse("a=1,2").unwrap(),
            Axis::parse("b=x,y,z").unwrap(),
        ];
        let g = grid(&axes).unwrap();
        assert_eq!(g.len(), 6);
        assert_eq!(g[0].values, ["1", "x"]);
        assert_eq!(g[1].values, ["1", "y"]);
        assert_eq!(g[3].values, ["2", "x"]);
        let ids: std::collections::BTreeSet<_> = g.iter().map(|p| p.id.clone()).collect();
        assert_eq!(ids.len(), 6, "distinct ids");
        assert_eq!(grid(&axes).unwrap(), g, "deterministic");
    }

    #[test]
    fn shorthands_expand_against_instance_names() {
        let axes = vec![
            Axis::parse("decode.ep=64").unwrap(),
            Axis::parse("prefill.instances=3").unwrap(),
            Axis::parse("eplb.redundant=16").unwrap(),
            Axis::parse("mtp.tokens=2").unwrap(),
        ];
        let v: Vec<String> = axes.iter().map(|a| a.values[0].clone()).collect();
        let names = vec!["prefill".to_string(), "decode".to_string()];
        assert_eq!(
            overrides(&axes, &v, &names),
            [
                "decode.dies=64",
                "decode.ep=64",
                "prefill.count=3",
                "prefill.redundant_experts=16",
                "decode.redundant_experts=16",
                "mtp.tokens=2"
            ]
        );
    }

    #[test]
    fn front_and_knee() {
        // (TPOT, throughput): lower TPOT and higher throughput are better.
        let pts = vec![
            (10.0, 100.0, 0),
            (20.0, 300.0, 1),
            (25.0, 310.0, 2),
            (40.0, 320.0, 3),
            (30.0, 200.0, 4), // dominated by 1
        ];
        let f = pareto(&pts);
        assert_eq!(f.iter().map(|p| p.2).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert_eq!(knee(&f).map(|i| f[i].2), Some(1));
    }

    proptest! {
        #[test]
        fn shards_cover_the_grid_exactly_once(sizes in prop::collection::vec(1usize..5, 1..4), n in 1u64..7) {
            let axes: Vec<Axis> = sizes
                .iter()
                .enumerate()
                .map(|(i, s)| Axis { path: format!("a{i}"), values: (0..*s).map(|v| v.to_string()).collect() })
                .collect();
            let g = grid(&axes).unwrap();
            let mut seen = vec![0; g.len()];
            for k in 0..n {
                let sh = Shard { k, n };
                for p in g.iter().filter(|p| sh.contains(p)) {
                    seen[p.index as usize] += 1;
                }
            }
            prop_assert!(seen.iter().all(|c| *c == 1));
        }

        #[test]
        fn no_front_point_is_dominated(pts in prop::collection::vec((0.0f64..100.0, 0.0f64..100.0), 1..40)) {
            let pts: Vec<(f64, f64, usize)> = pts.into_iter().enumerate().map(|(i, (x, y))| (x, y, i)).collect();
            let f = pareto(&pts);
            for a in &f {
                for b in &pts {
                    prop_assert!(!(b.0 <= a.0 && b.1 >= a.1 && (b.0 < a.0 || b.1 > a.1)), "{:?} dominated by {:?}", a, b);
                }
            }
        }
    }
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

/// A front of the sweep: output tokens/s per card against a latency, with its knee.
#[derive(Clone, Debug, Serialize)]
pub struct Front {
    /// Short name: `tpot` or `ttft`.
    pub name: String,
    pub latency: String,
    pub rows: Vec<usize>,
    pub knee: Option<usize>,
}

/// Throughput per card against p50 TPOT and against p50 TTFT over the valid rows.
pub fn fronts(rows: &[Row]) -> Vec<Front> {
    let ok: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].ok()).collect();
    [("tpot", "tpot_p50_ms"), ("ttft", "ttft_p50_ms")]
        .iter()
        .map(|(name, col)| {
            let pts: Vec<(f64, f64, usize)> = ok
                .iter()
                .map(|&i| {
                    let r = &rows[i];
                    let x = if *name == "tpot" {
                        r.tpot_p50_ms
                    } else {
                        r.ttft_p50_ms
                    };
                    (x, r.output_tok_s_per_card, i)
                })
                .collect();
            let f = pareto(&pts);
            Front {
                name: name.to_string(),
                latency: col.to_string(),
                knee: knee(&f).map(|k| f[k].2),
                rows: f.iter().map(|p| p.2).collect(),
            }
        })
        .collect()
}

/// A point's varied values as `a=1 b=2`.
pub fn label(axes: &[String], r: &Row) -> String {
    axes.iter()
        .map(|a| format!("{a}={}", r.values.get(a).map_or("", String::as_str)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The plot of a front.
pub fn front_plot(axes: &[String], rows: &[Row], f: &Front) -> crate::plot::Plot {
    let x = |r: &Row| {
        if f.name == "tpot" {
            r.tpot_p50_ms
        } else {
            r.ttft_p50_ms
        }
    };
    let what = if f.name == "tpot" { "TPOT" } else { "TTFT" };
    crate::plot::Plot {
        title: format!("Output tokens/s per card vs {what} (p50)"),
        x_label: format!("{what} p50 (ms)"),
        y_label: "output tok/s per card".into(),
        points: rows
            .iter()
            .filter(|r| r.ok())
            .map(|r| (x(r), r.output_tok_s_per_card))
            .collect(),
        front: f
            .rows
            .iter()
            .map(|&i| (x(&rows[i]), rows[i].output_tok_s_per_card))
            .collect(),
        knee: f.knee.map(|i| {
            (
                (x(&rows[i]), rows[i].output_tok_s_per_card),
                format!("knee: {}", label(axes, &rows[i])),
            )
        }),
    }
}

/// The markdown summary of a sweep.
pub fn summary_markdown(axes: &[String], rows: &[Row]) -> String {
    let ok = rows.iter().filter(|r| r.ok()).count();
    let mut s = format!(
        "# Sweep summary\n\n{} points over {}: {} ran, {} invalid.\n\n",
        rows.len(),
        if axes.is_empty() {
            "no axes".to_string()
        } else {
            axes.join(", ")
        },
        ok,
        rows.len() - ok
    );
    let mut best: Vec<&Row> = rows.iter().filter(|r| r.ok()).collect();
    best.sort_by(|a, b| {
        b.goodput_per_card
            .total_cmp(&a.goodput_per_card)
            .then(a.index.cmp(&b.index))
    });
    if !best.is_empty() {
        s += "## Best points by goodput per card\n\n| point | goodput/card (req/s) | output tok/s/card | SLO met | TTFT p50 (ms) | TPOT p50 (ms) |\n|---|---|---|---|---|---|\n";
        for r in best.iter().take(10) {
            s += &format!(
                "| {} | {:.4} | {:.1} | {:.1}% | {:.0} | {:.1} |\n",
                label(axes, r),
                r.goodput_per_card,
                r.output_tok_s_per_card,
                r.slo_attainment * 100.0,
                r.ttft_p50_ms,
                r.tpot_p50_ms
            );
        }
        s += "\n";
    }
    for f in fronts(rows) {
        let what = if f.name == "tpot" { "TPOT" } else { "TTFT" };
        s += &format!(
            "## Pareto front: output tok/s per card vs {what}\n\n![front](pareto_{}.svg)\n\n| point | {what} p50 (ms) | output tok/s/card |\n|---|---|---|\n",
            f.name
        );
        for &i in &f.rows {
            let r = &rows[i];
            let x = if f.name == "tpot" {
                r.tpot_p50_ms
            } else {
                r.ttft_p50_ms
            };
            let mark = if f.knee == Some(i) { " **(knee)**" } else { "" };
            s += &format!(
                "| {}{mark} | {x:.1} | {:.1} |\n",
                label(axes, r),
                r.output_tok_s_per_card
            );
        }
        s += "\n";
    }
    let invalid: Vec<&Row> = rows.iter().filter(|r| !r.ok()).collect();
    if !invalid.is_empty() {
        s += "## Invalid points\n\n| point | reason |\n|---|---|\n";
        for r in invalid {
            s += &format!(
                "| {} | {} |\n",
                label(axes, r),
                r.reason.replace('|', "\\|")
            );
        }
    }
    s
}
