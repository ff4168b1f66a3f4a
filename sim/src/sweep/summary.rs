//! The markdown summary of a sweep.

use super::{fronts, label, Row};

/// What a sweep's goodput is over, against `dstwin plan`'s.
pub const GOODPUT_BASIS: &str = "Goodput per card: the requests that met every SLO, per second \
of each run's report window (from the scenario's `warmup_s`, 0 unless set, to the end of the \
run, so a run without a warm-up counts its ramp and its drain), over every card. `dstwin plan` \
ranks on a steady window instead (docs/what-if.md); give the base scenario `warmup_s` and \
`duration_s` to measure a sweep in steady state.";

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
        s += "## Best points by goodput per card\n\n";
        s += GOODPUT_BASIS;
        s += "\n\n| point | goodput/card (req/s) | output tok/s/card | SLO met | TTFT p50 (ms) | TPOT p50 (ms) |\n|---|---|---|---|---|---|\n";
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
