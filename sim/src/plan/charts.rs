//! The plan's charts (the throughput-vs-TPOT front, goodput and TPOT against offered load),
//! drawn from what they show of each layout: from a plan's ranked outcomes as it runs, or from
//! its `plan.json` afterwards (`dstwin report plan.json`), the same bytes either way.

use super::rank::{Outcome, Spread, Standing};
use super::Candidate;
use crate::plot;
use crate::sweep::{knee, pareto};
use serde_json::Value;

/// How many of the best ranked layouts the load charts draw.
const LOAD_CURVES: usize = 5;

/// One layout as the charts show it.
#[derive(Clone, Debug, PartialEq)]
struct Layout {
    label: String,
    best: bool,
    /// Ranked (not screened out, estimated or invalid).
    ranked: bool,
    /// TPOT p50 (ms) and output tokens/s per card at its chosen level, means over the seeds.
    point: Option<(f64, f64)>,
    /// Per measured load level: offered requests/s, and goodput per card and TPOT p50 (ms),
    /// means over the level's runs.
    levels: Vec<(f64, f64, f64)>,
}

/// What the plan's charts draw.
#[derive(Clone, Debug, PartialEq)]
pub struct Charts {
    /// The every-request TPOT bound, drawn as a line.
    tpot_ms: Option<f64>,
    /// Best first.
    layouts: Vec<Layout>,
}

impl Charts {
    /// Of ranked outcomes (best first) under an every-request TPOT bound.
    pub fn of(tpot_ms: Option<f64>, outcomes: &[Outcome]) -> Charts {
        let layouts = outcomes
            .iter()
            .map(|o| Layout {
                label: o.candidate.label(),
                best: o.standing == Standing::Best,
                ranked: o.rank.is_some(),
                point: o
                    .result
                    .as_ref()
                    .map(|r| (r.tpot_p50_ms.mean, r.output_tok_s_per_card.mean)),
                levels: o
                    .levels
                    .iter()
                    .filter(|l| !l.runs.is_empty())
                    .map(|l| {
                        (
                            l.rate_req_s,
                            Spread::of(l.runs.iter().map(|m| m.goodput_per_card)).mean,
                            Spread::of(l.runs.iter().map(|m| m.tpot_p50_ms)).mean,
                        )
                    })
                    .collect(),
            })
            .collect();
        Charts { tpot_ms, layouts }
    }

    /// Of a `plan.json` (what `plan --out` writes); errors say which field is missing.
    pub fn from_plan_json(v: &Value) -> Result<Charts, String> {
        let slo = v.get("slo").ok_or(
            "no \"slo\": not a plan.json, or one written before dstwin plan recorded its SLOs",
        )?;
        let tpot_ms = slo.get("tpot_ms").and_then(Value::as_f64);
        let layouts = v
            .get("layouts")
            .and_then(Value::as_array)
            .ok_or("no \"layouts\" list: not a plan.json")?;
        let num = |o: &Value, path: &[&str]| -> Option<f64> {
            path.iter().try_fold(o, |o, k| o.get(k))?.as_f64()
        };
        let layouts = layouts
            .iter()
            .enumerate()
            .map(|(i, o)| {
                let c: Candidate =
                    serde_json::from_value(o.get("candidate").cloned().unwrap_or_default())
                        .map_err(|e| format!("layouts[{i}].candidate: {e}"))?;
                let point = num(o, &["tpot_p50_ms", "mean"])
                    .zip(num(o, &["output_tok_s_per_card", "mean"]));
                let levels = o
                    .get("levels")
                    .and_then(Value::as_array)
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                    .iter()
                    .enumerate()
                    .filter_map(|(j, l)| {
                        let runs = l.get("runs")?.as_array().filter(|r| !r.is_empty())?;
                        let runs_mean = |k: &str| {
                            let xs: Option<Vec<f64>> =
                                runs.iter().map(|m| m.get(k)?.as_f64()).collect();
                            xs.map(|xs| Spread::of(xs).mean).ok_or_else(|| {
                                format!("layouts[{i}].levels[{j}].runs: a run without {k}")
                            })
                        };
                        let rate = l.get("rate_req_s")?.as_f64()?;
                        Some(
                            runs_mean("goodput_per_card")
                                .and_then(|g| Ok((rate, g, runs_mean("tpot_p50_ms")?))),
                        )
                    })
                    .collect::<Result<_, String>>()?;
                Ok(Layout {
                    label: c.label(),
                    best: o.get("standing").and_then(Value::as_str) == Some("best"),
                    ranked: o.get("rank").is_some_and(|r| !r.is_null()),
                    point,
                    levels,
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(Charts { tpot_ms, layouts })
    }

    /// The charts as files: `plan_tpot`, `plan_load_goodput` and `plan_load_tpot`, each as SVG
    /// and PNG.
    pub fn files(&self) -> Vec<(&'static str, Vec<u8>)> {
        let valid: Vec<(f64, f64, usize)> = self
            .layouts
            .iter()
            .enumerate()
            .filter_map(|(i, l)| l.point.map(|(x, y)| (x, y, i)))
            .collect();
        let front = pareto(&valid);
        let best = self.layouts.iter().find(|l| l.best);
        let front_plot = plot::Plot {
            title: "Candidate layouts: output tokens/s per card vs TPOT (p50)".into(),
            x_label: "TPOT p50 (ms), mean over seeds".into(),
            y_label: "output tok/s per card".into(),
            points: valid.iter().map(|p| (p.0, p.1)).collect(),
            front: front
                .iter()
                .map(|p| (p.0, p.1, self.layouts[p.2].label.clone()))
                .collect(),
            knee: knee(&front),
            chosen: best.and_then(|l| l.point.map(|(x, y)| (x, y, l.label.clone()))),
            x_limit: self.tpot_ms.map(|x| (x, format!("TPOT SLO {x} ms"))),
        };
        // Goodput and TPOT against offered load for the best ranked layouts.
        let top: Vec<&Layout> = self
            .layouts
            .iter()
            .filter(|l| l.point.is_some() && l.ranked)
            .take(LOAD_CURVES)
            .collect();
        let series = |f: fn(&(f64, f64, f64)) -> (f64, f64)| -> Vec<(String, Vec<(f64, f64)>)> {
            top.iter()
                .map(|l| (l.label.clone(), l.levels.iter().map(f).collect()))
                .collect()
        };
        let goodput = plot::Lines {
            title: "Goodput per card against offered load (best layouts)".into(),
            x_label: "offered load (requests/s)".into(),
            y_label: "goodput per card (req/s)".into(),
            series: series(|l| (l.0, l.1)),
            x_limit: None,
        };
        let tpot = plot::Lines {
            title: "TPOT p50 against offered load (best layouts)".into(),
            x_label: "offered load (requests/s)".into(),
            y_label: "TPOT p50 (ms)".into(),
            series: series(|l| (l.0, l.2)),
            x_limit: None,
        };
        vec![
            ("plan_tpot.svg", plot::svg(&front_plot).into_bytes()),
            ("plan_tpot.png", plot::png(&front_plot)),
            ("plan_load_goodput.svg", plot::svg(&goodput).into_bytes()),
            ("plan_load_goodput.png", plot::png(&goodput)),
            ("plan_load_tpot.svg", plot::svg(&tpot).into_bytes()),
            ("plan_load_tpot.png", plot::png(&tpot)),
        ]
    }
}
