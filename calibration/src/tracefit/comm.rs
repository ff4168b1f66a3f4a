//! Collectives fitted from the kernels that carry their bytes.
//!
//! - **Alpha-beta per kind and group** (every collective kind, all-to-all included): for the
//!   kernels of one kind in one group (by size where the trace gives it, else by name),
//!   `time = alpha + bytes / beta`, least squares over relative errors with `alpha >= 0` and
//!   `1/beta >= 0`. It needs two message sizes or more; with one, only the mean time is reported.
//! - **The cost file's ring-collective parameters** (`[collective] base_us, bw_eff`) from every
//!   all-reduce, all-gather and reduce-scatter with a known group size, in the cost model's own
//!   form: `time - steps x level latency = base_us + volume / (level bandwidth x bw_eff)` with the
//!   model's ring volume and step count for each kind and the fabric level the group spans
//!   (hwmodels/src/cost.rs); `base_us >= 0`, `bw_eff <= 1`.

use crate::lsq::bounded_lstsq;
use dstwin_hwmodels::{A2aMode, Comm, CommKind, CostModel};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;

/// A collective's group: its size when the trace gives it, else its name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupKey {
    Size(u32),
    Name(String),
    Unknown,
}

impl fmt::Display for GroupKey {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            GroupKey::Size(n) => write!(f, "{n} ranks"),
            GroupKey::Name(n) => write!(f, "group {n}"),
            GroupKey::Unknown => f.write_str("group unknown"),
        }
    }
}

/// One collective kernel with its bytes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CommSample {
    pub kind: CommKind,
    pub group: GroupKey,
    pub bytes: f64,
    pub time_us: f64,
}

/// Alpha-beta of one kind and group.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AlphaBeta {
    pub kind: CommKind,
    pub group: GroupKey,
    pub samples: usize,
    /// Distinct message sizes.
    pub sizes: usize,
    pub mean_time_us: f64,
    /// Fitted with two sizes or more.
    pub alpha_us: Option<f64>,
    /// GB/s; `None` when not fitted or when time does not grow with bytes.
    pub beta_gb_s: Option<f64>,
    pub rms_error: Option<f64>,
    pub max_error: Option<f64>,
}

fn errors(pred: impl Iterator<Item = (f64, f64)>) -> (f64, f64, usize) {
    let (mut sq, mut max, mut n) = (0.0, 0.0f64, 0usize);
    for (p, t) in pred {
        let e = p / t - 1.0;
        sq += e * e;
        if e.abs() > max.abs() {
            max = e;
        }
        n += 1;
    }
    ((sq / n.max(1) as f64).sqrt(), max, n)
}

/// Alpha-beta per (kind, group), in kind then group order.
pub fn alpha_beta(samples: &[CommSample]) -> Vec<AlphaBeta> {
    let mut groups: BTreeMap<(CommKind, GroupKey), Vec<&CommSample>> = BTreeMap::new();
    for s in samples.iter().filter(|s| s.time_us > 0.0 && s.bytes > 0.0) {
        groups.entry((s.kind, s.group.clone())).or_default().push(s);
    }
    groups
        .into_iter()
        .map(|((kind, group), v)| {
            let mut sizes: Vec<f64> = v.iter().map(|s| s.bytes).collect();
            sizes.sort_by(f64::total_cmp);
            sizes.dedup();
            let mean = v.iter().map(|s| s.time_us).sum::<f64>() / v.len() as f64;
            let mut out = AlphaBeta {
                kind,
                group,
                samples: v.len(),
                sizes: sizes.len(),
                mean_time_us: mean,
                alpha_us: None,
                beta_gb_s: None,
                rms_error: None,
                max_error: None,
            };
            if sizes.len() >= 2 {
                // Relative rows: [1/t, bytes/t] . [alpha, 1/beta] = 1 (bytes in MB, time in µs).
                let rows: Vec<(Vec<f64>, f64)> = v
                    .iter()
                    .map(|s| (vec![1.0 / s.time_us, s.bytes / 1e6 / s.time_us], 1.0))
                    .collect();
                if let Some(x) = bounded_lstsq(&rows, &[0.0, 0.0], &[f64::INFINITY; 2]) {
                    let (alpha, k) = (x[0], x[1]);
                    let (rms, max, _) =
                        errors(v.iter().map(|s| (alpha + k * s.bytes / 1e6, s.time_us)));
                    out.alpha_us = Some(alpha);
                    // k µs per MB -> MB/µs = TB/s; GB/s = 1000 / k.
                    out.beta_gb_s = (k > 0.0).then(|| 1e3 / k);
                    out.rms_error = Some(rms);
                    out.max_error = Some(max);
                }
            }
            out
        })
        .collect()
}

/// The fitted `[collective]` parameters.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CollectiveFit {
    pub base_us: f64,
    pub bw_eff: f64,
    pub samples: usize,
    pub rms_error: f64,
    pub max_error: f64,
}

/// Fits `base_us` and `bw_eff` to the ring collectives with known group sizes above one, on
/// `cm`'s fabric; `None` with fewer than two distinct transfer times.
pub fn fit_collective(samples: &[CommSample], cm: &CostModel) -> Option<CollectiveFit> {
    // Per sample: the model's time with base 0 and efficiency 1 splits into latency steps and
    // transfer; both are read off the model itself rather than restated here.
    let ring: Vec<(f64, f64, f64)> = samples
        .iter()
        .filter(|s| {
            matches!(
                s.kind,
                CommKind::AllReduce | CommKind::AllGather | CommKind::ReduceScatter
            ) && s.time_us > 0.0
                && s.bytes > 0.0
        })
        .filter_map(|s| match s.group {
            GroupKey::Size(g) if g > 1 => {
                let (lat, transfer) = latency_and_transfer_us(cm, s.kind, s.bytes, g);
                Some((lat, transfer, s.time_us))
            }
            _ => None,
        })
        .collect();
    let mut transfers: Vec<f64> = ring.iter().map(|r| r.1).collect();
    transfers.sort_by(f64::total_cmp);
    transfers.dedup();
    if transfers.len() < 2 {
        return None;
    }
    let rows: Vec<(Vec<f64>, f64)> = ring
        .iter()
        .map(|&(lat, tr, t)| (vec![1.0 / t, tr / t], 1.0 - lat / t))
        .collect();
    let x = bounded_lstsq(&rows, &[0.0, 1.0], &[f64::INFINITY; 2])?;
    let (base, k) = (x[0], x[1]);
    let (rms, max, n) = errors(ring.iter().map(|&(lat, tr, t)| (lat + base + k * tr, t)));
    Some(CollectiveFit {
        base_us: base,
        bw_eff: 1.0 / k,
        samples: n,
        rms_error: rms,
        max_error: max,
    })
}

/// The latency steps and the transfer at full bandwidth (µs) of a ring collective under `cm`:
/// the model's time with `base_us = 0` and `bw_eff = 1`, split by pricing it at two sizes.
fn latency_and_transfer_us(cm: &CostModel, kind: CommKind, bytes: f64, group: u32) -> (f64, f64) {
    let mut p = cm.params.clone();
    p.collective.base_us = 0.0;
    p.collective.bw_eff = 1.0;
    let bare = CostModel::new(cm.system.clone(), p);
    let at = |b: f64| {
        bare.comm(&Comm {
            kind,
            bytes: b,
            group,
            mode: A2aMode::Normal,
            // Ring collectives: no token copies to deduplicate.
            copies: 0.0,
        })
        .time_s
            * 1e6
    };
    // Time is affine in bytes: at(b) = latency + b x slope.
    let (t1, t2) = (at(bytes), at(2.0 * bytes));
    let transfer = t2 - t1;
    (t1 - transfer, transfer)
}
