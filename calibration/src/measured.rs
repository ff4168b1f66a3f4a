//! A team's own measurements against the twin: the JSON `vllm bench serve --save-result`
//! writes (also what `dstwin bench-serve --save-result` writes), compared metric by metric with
//! a simulation of the same deployment and workload.

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
        ("mean_tpot_ms", l.tpot_ms.mean),
        ("median_tpot_ms", l.tpot_ms.p50),
        ("p99_tpot_ms", l.tpot_ms.p99),
        ("mean_itl_ms", l.itl_ms.mean),
        ("median_itl_ms", l.itl_ms.p50),
        ("p99_itl_ms", l.itl_ms.p99),
        ("mean_e2el_ms", l.e2e_ms.mean),
        ("median_e2el_ms", l.e2e_ms.p50),
        ("p99_e2el_ms", l.e2e_ms.p99),
    ]
}

/// Compares a measurement (vLLM bench serve JSON) with a simulation report.
pub fn compare(measured: &serde_json::Value, r: &SimReport) -> Result<Vec<Comparison>, String> {
    let obj = measured
        .as_object()
        .ok_or("the measurement is not a JSON object")?;
    let out: Vec<Comparison> = predictions(r)
        .into_iter()
        .filter_map(|(k, p)| {
            let m = obj.get(k)?.as_f64()?;
            (m > 0.0 && m.is_finite()).then(|| Comparison {
                metric: k.to_string(),
                measured: m,
                predicted: p,
                error: p / m - 1.0,
            })
        })
        .collect();
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
