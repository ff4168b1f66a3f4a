//! A team's own measurements against the twin, compared metric by metric with a simulation of
//! the same deployment and workload. Two formats:
//! - the JSON `vllm bench serve --save-result` writes (also what `dstwin bench-serve
//!   --save-result` writes): its throughput and mean / median / p99 latency fields;
//! - `dstwin-measured/1`, for figures taken any other way: `{"format": "dstwin-measured/1",
//!   "source": "...", "metrics": {"output_tok_s": 1234.0, "tpot_ms.p50": 48.1}}`, metric names
//!   being the simulation report's (`OWN_METRICS`).

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

/// The fields compared, as (measurement field, prediction). Fields the measurement lacks are
/// skipped; a measurement with none of them is an error.
fn predictions(r: &SimReport) -> Vec<(&'static str, f64)> {
    let l = &r.latency;
    vec![
        ("request_throughput", r.request_throughput),
        ("output_throughput", r.output_tok_s),
        ("total_token_throughput", r.input_tok_s + r.output_tok_s),
        ("mean_ttft_ms", l.ttft_ms.mean),
        ("median_ttft_ms", l.ttft_ms.p50),
        ("p99_ttft_ms", l.ttft_ms.p99),
        ("p90_ttft_ms", l.ttft_ms.p90),
        ("mean_tpot_ms", l.tpot_ms.mean),
        ("median_tpot_ms", l.tpot_ms.p50),
        ("p99_tpot_ms", l.tpot_ms.p99),
        ("p90_tpot_ms", l.tpot_ms.p90),
        ("mean_itl_ms", l.itl_ms.mean),
        ("median_itl_ms", l.itl_ms.p50),
        ("p99_itl_ms", l.itl_ms.p99),
        ("p90_itl_ms", l.itl_ms.p90),
        ("mean_e2el_ms", l.e2e_ms.mean),
        ("median_e2el_ms", l.e2e_ms.p50),
        ("p99_e2el_ms", l.e2e_ms.p99),
        ("p90_e2el_ms", l.e2e_ms.p90),
    ]
}

/// The format tag of our own measurement format.
pub const OWN_FORMAT: &str = "dstwin-measured/1";

/// The metrics `dstwin-measured/1` accepts: the report's rates and its latency percentiles.
pub fn own_metrics(r: &SimReport) -> Vec<(String, f64)> {
    let l = &r.latency;
    let mut out: Vec<(String, f64)> = vec![
        ("request_throughput".into(), r.request_throughput),
        ("input_tok_s".into(), r.input_tok_s),
        ("output_tok_s".into(), r.output_tok_s),
        ("input_tok_s_per_card".into(), r.input_tok_s_per_card),
        ("output_tok_s_per_card".into(), r.output_tok_s_per_card),
        ("goodput".into(), r.goodput),
    ];
    for (name, p) in [
        ("ttft_ms", &l.ttft_ms),
        ("tpot_ms", &l.tpot_ms),
        ("itl_ms", &l.itl_ms),
        ("e2e_ms", &l.e2e_ms),
    ] {
        for (q, v) in [
            ("mean", p.mean),
            ("p50", p.p50),
            ("p90", p.p90),
            ("p99", p.p99),
        ] {
            out.push((format!("{name}.{q}"), v));
        }
    }
    out
}

fn compare_own(
    obj: &serde_json::Map<String, serde_json::Value>,
    r: &SimReport,
) -> Result<Vec<Comparison>, String> {
    let metrics = obj
        .get("metrics")
        .and_then(|m| m.as_object())
        .ok_or(format!(
            "{OWN_FORMAT}: `metrics` must be an object of metric: value"
        ))?;
    let known = own_metrics(r);
    let names = || {
        known
            .iter()
            .map(|k| k.0.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = Vec::new();
    for (k, v) in metrics {
        let p = known
            .iter()
            .find(|x| x.0 == *k)
            .ok_or_else(|| format!("metrics.{k}: unknown metric (known: {})", names()))?
            .1;
        let m = v
            .as_f64()
            .filter(|m| m.is_finite() && *m > 0.0)
            .ok_or_else(|| format!("metrics.{k} = {v}: must be a positive number"))?;
        out.push(Comparison::of(&format!("metrics.{k}"), k, m, p)?);
    }
    if out.is_empty() {
        return Err(format!("metrics is empty (known: {})", names()));
    }
    Ok(out)
}

/// Compares a measurement (vLLM bench serve JSON, or `dstwin-measured/1`) with a simulation
/// report.
pub fn compare(measured: &serde_json::Value, r: &SimReport) -> Result<Vec<Comparison>, String> {
    let obj = measured
        .as_object()
        .ok_or("the measurement is not a JSON object")?;
    match obj.get("format") {
        Some(f) if f.as_str() == Some(OWN_FORMAT) => return compare_own(obj, r),
        Some(f) => {
            return Err(format!(
                "format = {f}: unknown (expected \"{OWN_FORMAT}\", or no `format` field for the JSON of `vllm bench serve --save-result`)"
            ))
        }
        None => {}
    }
    let mut out = Vec::new();
    for (k, p) in predictions(r) {
        match obj.get(k).and_then(|v| v.as_f64()) {
            Some(m) if m > 0.0 && m.is_finite() => out.push(Comparison::of(k, k, m, p)?),
            _ => {}
        }
    }
    if out.is_empty() {
        return Err(format!(
            "no known metric in the measurement (expected some of: {})",
            predictions(r)
                .iter()
                .map(|p| p.0)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(out)
}
