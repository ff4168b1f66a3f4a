//! A team's own measurements against the twin, compared metric by metric with a simulation of
//! the same deployment and workload. Two formats:
//! - the JSON `vllm bench serve --save-result` writes (also what `dstwin bench-serve
//!   --save-result` writes): its throughput and mean / median / p99 latency fields;
//! - `dstwin-measured/1`, for figures taken any other way: `{"format": "dstwin-measured/1",
//!   "source": "...", "metrics": {"output_tok_s": 1234.0, "tpot_ms.p50": 48.1}}`, metric names
//!   being the simulation report's (`metrics`, `Format::Own`).

use dstwin_sim::run::SimReport;
use serde::Serialize;

/// One measured figure and the twin's prediction of it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    /// The measurement's field name.
    pub metric: String,
    pub measured: f64,
    pub predicted: f64,
    /// predicted / measured - 1.
    pub error: f64,
}

impl Comparison {
    /// `predicted` against `measured` (`field` as the file names it); an error that is not a
    /// number (a measured figure so small that the ratio overflows, a prediction that is not
    /// finite) is refused rather than printed as inf or NaN.
    fn of(field: &str, metric: &str, measured: f64, predicted: f64) -> Result<Self, String> {
        let error = predicted / measured - 1.0;
        if !error.is_finite() {
            return Err(format!(
                "{field} = {measured:e}: cannot be compared with the prediction {predicted} \
                 (the error is {error}); is the figure in the unit the metric's name says?"
            ));
        }
        Ok(Comparison {
            metric: metric.to_string(),
            measured,
            predicted,
            error,
        })
    }
}

/// The format tag of our own measurement format.
pub const OWN_FORMAT: &str = "dstwin-measured/1";

/// The two formats a measurement comes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    /// `vllm bench serve --save-result` (and `dstwin bench-serve --save-result`).
    Vllm,
    /// `dstwin-measured/1`.
    Own,
}

/// The latencies both formats give, as (vLLM's name, the report's).
const LATENCIES: [(&str, &str); 4] = [
    ("ttft", "ttft_ms"),
    ("tpot", "tpot_ms"),
    ("itl", "itl_ms"),
    ("e2el", "e2e_ms"),
];

/// Their statistics in each format's order, as (name, index into mean, p50, p90, p99).
const VLLM_STATS: [(&str, usize); 4] = [("mean", 0), ("median", 1), ("p99", 3), ("p90", 2)];
const OWN_STATS: [(&str, usize); 4] = [("mean", 0), ("p50", 1), ("p90", 2), ("p99", 3)];

/// A metric a measurement may give: its name in the file and the report's prediction of it.
struct Metric {
    name: String,
    predict: Box<dyn Fn(&SimReport) -> f64 + Send + Sync>,
}

fn metric(name: &str, predict: fn(&SimReport) -> f64) -> Metric {
    Metric {
        name: name.to_string(),
        predict: Box::new(predict),
    }
}

/// The metrics a format compares, in the order vLLM's file is read.
fn metrics(format: Format) -> Vec<Metric> {
    let mut out = match format {
        Format::Vllm => vec![
            metric("request_throughput", |r| r.request_throughput),
            metric("output_throughput", |r| r.output_tok_s),
            metric("total_token_throughput", |r| r.input_tok_s + r.output_tok_s),
        ],
        Format::Own => vec![
            metric("request_throughput", |r| r.request_throughput),
            metric("input_tok_s", |r| r.input_tok_s),
            metric("output_tok_s", |r| r.output_tok_s),
            metric("input_tok_s_per_card", |r| r.input_tok_s_per_card),
            metric("output_tok_s_per_card", |r| r.output_tok_s_per_card),
            metric("goodput", |r| r.goodput),
        ],
    };
    let stats = match format {
        Format::Vllm => VLLM_STATS,
        Format::Own => OWN_STATS,
    };
    for (l, (vllm_l, own_l)) in LATENCIES.into_iter().enumerate() {
        for (stat, s) in stats {
            out.push(Metric {
                name: match format {
                    Format::Vllm => format!("{stat}_{vllm_l}_ms"),
                    Format::Own => format!("{own_l}.{stat}"),
                },
                predict: Box::new(move |r| {
                    let x = &r.latency;
                    let p = [&x.ttft_ms, &x.tpot_ms, &x.itl_ms, &x.e2e_ms][l];
                    [p.mean, p.p50, p.p90, p.p99][s]
                }),
            });
        }
    }
    out
}

/// A measurement file read and checked, before anything is simulated.
pub struct Measurement {
    metrics: Vec<Metric>,
    /// (index into `metrics`, the file's field, the measured value), in the file's order.
    figures: Vec<(usize, String, f64)>,
}

/// Reads a measurement (vLLM bench serve JSON, or `dstwin-measured/1`): every check that needs
/// no simulation (the format, the metric names, the values, the server's time scale).
pub fn read(measured: &serde_json::Value) -> Result<Measurement, String> {
    let obj = measured
        .as_object()
        .ok_or("the measurement is not a JSON object")?;
    let format = match obj.get("format") {
        Some(f) if f.as_str() == Some(OWN_FORMAT) => Format::Own,
        Some(f) => {
            return Err(format!(
                "format = {f}: unknown (expected \"{OWN_FORMAT}\", or no `format` field for the JSON of `vllm bench serve --save-result`)"
            ))
        }
        None => Format::Vllm,
    };
    let metrics = metrics(format);
    let names = || {
        metrics
            .iter()
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut figures = Vec::new();
    match format {
        Format::Own => {
            let given = obj
                .get("metrics")
                .and_then(|m| m.as_object())
                .ok_or(format!(
                    "{OWN_FORMAT}: `metrics` must be an object of metric: value"
                ))?;
            for (k, v) in given {
                let i = metrics
                    .iter()
                    .position(|m| m.name == *k)
                    .ok_or_else(|| format!("metrics.{k}: unknown metric (known: {})", names()))?;
                let m = v
                    .as_f64()
                    .filter(|m| m.is_finite() && *m > 0.0)
                    .ok_or_else(|| format!("metrics.{k} = {v}: must be a positive number"))?;
                figures.push((i, format!("metrics.{k}"), m));
            }
            if figures.is_empty() {
                return Err(format!("metrics is empty (known: {})", names()));
            }
        }
        Format::Vllm => {
            // A twin server run faster or slower than real time (`serve --time-scale`, which
            // `bench-serve` records) measured times that are not the deployment's.
            if let Some(s) = obj.get("time_scale").and_then(|s| s.as_f64()) {
                if s != 1.0 {
                    return Err(format!(
                        "time_scale = {s}: the server ran its twin at --time-scale {s}, so its \
                         times are not the deployment's; measure against `dstwin serve \
                         --time-scale 1` (the default)"
                    ));
                }
            }
            for (i, m) in metrics.iter().enumerate() {
                // vLLM writes every field; one it could not measure (0, null) is skipped.
                match obj.get(&m.name).and_then(|v| v.as_f64()) {
                    Some(v) if v > 0.0 && v.is_finite() => figures.push((i, m.name.clone(), v)),
                    _ => {}
                }
            }
            if figures.is_empty() {
                return Err(format!(
                    "no known metric in the measurement (expected some of: {})",
                    names()
                ));
            }
        }
    }
    Ok(Measurement { metrics, figures })
}

impl Measurement {
    /// Each figure against the simulation report's prediction of it.
    pub fn compare(&self, r: &SimReport) -> Result<Vec<Comparison>, String> {
        self.figures
            .iter()
            .map(|(i, field, m)| {
                let metric = &self.metrics[*i];
                let name = metric.name.as_str();
                Comparison::of(field, name, *m, (metric.predict)(r))
            })
            .collect()
    }
}

/// Compares a measurement (vLLM bench serve JSON, or `dstwin-measured/1`) with a simulation
/// report ([`read`], then [`Measurement::compare`]).
pub fn compare(measured: &serde_json::Value, r: &SimReport) -> Result<Vec<Comparison>, String> {
    read(measured)?.compare(r)
}
