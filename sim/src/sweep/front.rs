//! Pareto fronts of a sweep, their knee, and their plots.

use super::{label, Row};
use serde::Serialize;

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
            .map(|&i| {
                (
                    x(&rows[i]),
                    rows[i].output_tok_s_per_card,
                    label(axes, &rows[i]),
                )
            })
            .collect(),
        knee: f.knee.and_then(|k| f.rows.iter().position(|&i| i == k)),
        chosen: None,
        x_limit: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
