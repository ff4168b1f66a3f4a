//! `calibrate --trace --check`: a cost file's prices of traces' kernels and host time against
//! what they measured, fitting nothing (how well a file fitted on one run predicts another).

use super::host::{self, HostCheck};
use super::spread::{step_spread, StepSpread};
use super::{collect, rel, ColdFit, Measured, TraceOptions, TraceSummary};
use crate::kernels::MapSummary;
use dstwin_hwmodels::OpClass;
use dstwin_traces::profile::Profile;
use serde::Serialize;
use std::collections::BTreeMap;

/// One op's kernels with known work, priced by a cost file as it is ([`check`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OpCheck {
    pub op: String,
    pub class: OpClass,
    pub kernels: usize,
    pub measured_ms: f64,
    pub priced_ms: f64,
    /// Relative errors of the kernels, rms.
    pub rms_error: f64,
    /// Whether the cost file prices the op with a `[[kernel]]` entry of its own.
    pub own: bool,
}

impl OpCheck {
    /// Priced over measured, less one.
    pub fn error(&self) -> f64 {
        rel(self.priced_ms, self.measured_ms)
    }
}

/// Host time of one trace against the cost file's `[host]` terms.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HostCheckReport {
    pub origin: String,
    pub check: Option<HostCheck>,
}

/// Traces priced by a cost file as it is, without fitting anything: how well a cost file
/// calibrated on one run predicts the kernels and host time of another.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceCheck {
    pub traces: Vec<TraceSummary>,
    pub rules: Vec<(String, String)>,
    pub mapping: MapSummary,
    /// The system whose cost file priced the kernels.
    pub hardware: String,
    /// Per class, its ops summed ([`OpCheck`]), largest first.
    pub classes: Vec<OpCheck>,
    /// Per op, largest first.
    pub ops: Vec<OpCheck>,
    /// The file's host terms, and each trace's host time against them (absent: the file has no
    /// `[host]`).
    pub host_terms: Option<(f64, f64, f64)>,
    pub host: Vec<HostCheckReport>,
    /// The kernels of the traces' steps after idling under the file's `[host] cold_after_us,
    /// cold_factor`: `warm_ms` is their price under the forms alone (`None`: the file has no
    /// cold terms).
    pub cold: Option<ColdFit>,
    /// How far the traces' steps land from the file's price, cold factor included, to compare
    /// with the file's `[host] step_sigma` (`file_step_sigma`, 0 where it gives none).
    pub spread: Option<StepSpread>,
    pub file_step_sigma: f64,
}

/// Prices every mapped kernel with known work with the cost model of `opts.cost` as it is
/// (its op's `[[kernel]]` entry, else its class's form), and each trace's host time with its
/// `[host]` terms. `None` without a cost model.
pub fn check(profiles: &[Profile], opts: &TraceOptions) -> Option<TraceCheck> {
    let cm = opts.cost.as_ref()?;
    let cold = cm
        .params
        .host
        .as_ref()
        .and_then(|h| h.cold_after_us.zip(h.cold_factor));
    let after: Vec<Option<f64>> = profiles.iter().map(|_| cold.map(|c| c.0)).collect();
    let c = collect(profiles, opts, &after);
    // (kernels, measured µs, warm price µs) of the kernels in steps after idling.
    let mut cold_sum = (0usize, 0.0, 0.0);
    // (kernels, measured µs, priced µs, Σ relative error²) per op.
    let mut by_op: BTreeMap<(OpClass, String), (usize, f64, f64, f64)> = BTreeMap::new();
    let mut per_step: BTreeMap<usize, (f64, f64)> = BTreeMap::new();
    for (class, ms) in &c.samples {
        for Measured {
            sample: x,
            op,
            work,
            step,
            cold: is_cold,
        } in ms
        {
            let warm = cm.compute_op(op, work).time_s * 1e6;
            let priced = match cold {
                Some((_, factor)) if *is_cold => {
                    cold_sum.0 += 1;
                    cold_sum.1 += x.time_us;
                    cold_sum.2 += warm;
                    warm * factor
                }
                _ => warm,
            };
            if let Some(i) = step {
                let e = per_step.entry(*i).or_default();
                e.0 += x.time_us;
                e.1 += priced;
            }
            let e = by_op.entry((*class, op.clone())).or_default();
            e.0 += 1;
            e.1 += x.time_us;
            e.2 += priced;
            e.3 += rel(priced, x.time_us).powi(2);
        }
    }
    let row =
        |op: String, class: OpClass, (n, m, p, sq): (usize, f64, f64, f64), own: bool| OpCheck {
            op,
            class,
            kernels: n,
            measured_ms: m / 1e3,
            priced_ms: p / 1e3,
            rms_error: (sq / n.max(1) as f64).sqrt(),
            own,
        };
    let mut by_class: BTreeMap<OpClass, (usize, f64, f64, f64)> = BTreeMap::new();
    for ((class, _), v) in &by_op {
        let e = by_class.entry(*class).or_default();
        e.0 += v.0;
        e.1 += v.1;
        e.2 += v.2;
        e.3 += v.3;
    }
    let largest_first = |mut v: Vec<OpCheck>| {
        v.sort_by(|a, b| b.measured_ms.total_cmp(&a.measured_ms));
        v
    };
    let classes = largest_first(
        by_class
            .into_iter()
            .map(|(class, v)| row(class.name().to_owned(), class, v, false))
            .collect(),
    );
    let ops = largest_first(
        by_op
            .into_iter()
            .map(|((class, op), v)| {
                let own = cm.params.kernel(&op).is_some();
                row(op, class, v, own)
            })
            .collect(),
    );
    let host_terms = cm
        .params
        .host
        .as_ref()
        // A `[host]` of eager launches alone says nothing of a step's host time.
        .filter(|h| h.step_us > 0.0 || h.per_seq_us > 0.0 || h.per_token_us > 0.0)
        .map(|h| (h.step_us, h.per_seq_us, h.per_token_us));
    let host = profiles
        .iter()
        .map(|p| HostCheckReport {
            origin: p.origin.clone(),
            check: host_terms.and_then(|(s, q, t)| host::check_host(p, opts.idle_factor, s, q, t)),
        })
        .collect();
    Some(TraceCheck {
        cold: cold.map(|(after_us, factor)| ColdFit {
            after_us,
            factor,
            steps: c.cold_steps,
            kernels: cold_sum.0,
            measured_ms: cold_sum.1 / 1e3,
            warm_ms: cold_sum.2 / 1e3,
        }),
        spread: step_spread(&per_step, &c.step_kernel_us),
        traces: c.traces,
        file_step_sigma: cm.params.host.as_ref().map_or(0.0, |h| h.step_sigma),
        rules: c.rules,
        mapping: c.mapping,
        hardware: cm.system.name.clone(),
        classes,
        ops,
        host_terms,
        host,
    })
}
