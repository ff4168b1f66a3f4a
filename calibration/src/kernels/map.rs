//! Kernels onto the op graph: each kernel of a profile gets a [`Target`], and the summary says
//! how the time divides by class, by op, outside the op graph and unmapped, so that nothing is
//! dropped silently.

use super::ops::{op_catalog, OpKindName};
use super::rules::{Backend, RuleSet, RuleTarget};
use dstwin_traces::profile::{KernelRecord, Profile, ProfileFormat};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// What a kernel is, for calibration.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// An op of the op graph.
    Op {
        op: &'static str,
        kind: OpKindName,
    },
    /// Work of a class (or a collective) that no single op names.
    Kind(OpKindName),
    /// Recognized, not an op of inference.
    Outside {
        reason: String,
        kind: Option<OpKindName>,
    },
    Unmapped,
}

impl Target {
    /// The class or collective, for mapped kernels.
    pub fn kind(&self) -> Option<OpKindName> {
        match self {
            Target::Op { kind, .. } | Target::Kind(kind) => Some(*kind),
            Target::Outside { .. } | Target::Unmapped => None,
        }
    }

    /// The op a mapped kernel counts under in reports: its op's name, or `<class> (no op
    /// named)` for work of a class that no single op names.
    pub fn op_label(&self) -> Option<String> {
        match self {
            Target::Op { op, .. } => Some((*op).to_owned()),
            Target::Kind(kind) => Some(format!("{} (no op named)", kind.label())),
            Target::Outside { .. } | Target::Unmapped => None,
        }
    }
}

/// The backend a profile most likely comes from: the CPU engine when its kernels carry op
/// classes, CUDA for Kineto GPU kernels, Ascend otherwise (torch_npu and msprof formats).
pub fn detect_backend(p: &Profile) -> Backend {
    if p.kernels.iter().any(|k| k.op_class.is_some()) {
        Backend::Cpu
    } else if p.format == ProfileFormat::ChromeJson
        && p.kernels
            .iter()
            .any(|k| k.op_type.as_deref().is_some_and(|t| t == "kernel"))
    {
        Backend::Cuda
    } else {
        Backend::Ascend
    }
}

/// What a kernel's target depends on: its name, its type and (for the CPU engine) its op class.
type TargetKey = (Arc<str>, Option<Arc<str>>, Option<String>);

/// Maps every kernel of `p`: `rules` first (a user's, then the backend's built-in ones); for the
/// CPU engine, then its own names (op graph names) and its op classes.
pub fn map_kernels(p: &Profile, backend: Backend, rules: &RuleSet) -> Vec<Target> {
    let mut cache: HashMap<TargetKey, Target> = HashMap::new();
    p.kernels
        .iter()
        .map(|k| {
            let key = (k.name.clone(), k.op_type.clone(), k.op_class.clone());
            cache
                .entry(key)
                .or_insert_with(|| map_one(k, backend, rules))
                .clone()
        })
        .collect()
}

fn map_one(k: &KernelRecord, backend: Backend, rules: &RuleSet) -> Target {
    // A row without a type (trace_view.json) is matched by the type patterns on its name.
    let op_type = k.op_type.as_deref().or(Some(&*k.name));
    if let Some(rule) = rules.find(&k.name, op_type) {
        return match &rule.target {
            RuleTarget::Op { op, kind } => Target::Op { op, kind: *kind },
            RuleTarget::Kind(kind) => Target::Kind(*kind),
            RuleTarget::Outside { reason, kind } => Target::Outside {
                reason: reason.clone(),
                kind: *kind,
            },
        };
    }
    if backend == Backend::Cpu {
        if let Some((op, kind)) = op_catalog().get_key_value(&*k.name) {
            return Target::Op { op, kind: *kind };
        }
        if let Some(kind) = k.op_class.as_deref().and_then(OpKindName::parse) {
            return Target::Kind(kind);
        }
    }
    Target::Unmapped
}

/// Kernels and time of one row of the summary.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Share {
    pub name: String,
    /// Launches (a statistics row counts its launches).
    pub kernels: u64,
    pub time_ms: f64,
    /// Of the summed kernel time of every trace.
    pub share: f64,
}

/// How the kernel time divides.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MapSummary {
    pub kernels: u64,
    /// Summed kernel time, ms (streams that overlap add up: this is device work, not wall time).
    pub time_ms: f64,
    pub mapped_share: f64,
    pub outside_share: f64,
    pub unmapped_share: f64,
    /// Mapped kernels by class or collective.
    pub by_class: Vec<Share>,
    /// Mapped kernels by op; those mapped to a class only as `<class> (no op named)`.
    pub by_op: Vec<Share>,
    /// Recognized kernels outside the op graph, by reason.
    pub outside: Vec<Share>,
    /// Kernels no rule matched, by name.
    pub unmapped: Vec<Share>,
}

#[derive(Default)]
struct Acc {
    kernels: u64,
    ns: u128,
}

fn shares(rows: BTreeMap<String, Acc>, total_ns: u128) -> Vec<Share> {
    let mut v: Vec<Share> = rows
        .into_iter()
        .map(|(name, a)| Share {
            name,
            kernels: a.kernels,
            time_ms: a.ns as f64 / 1e6,
            share: fraction(a.ns, total_ns),
        })
        .collect();
    // Largest first; ties by name (the map's order, kept by a stable sort).
    v.sort_by(|a, b| b.time_ms.total_cmp(&a.time_ms));
    v
}

fn fraction(part: u128, total: u128) -> f64 {
    if total == 0 {
        0.0
    } else {
        part as f64 / total as f64
    }
}

/// The summary over kernels and their targets (several profiles may be chained).
pub fn summarize<'a>(kernels: impl Iterator<Item = (&'a KernelRecord, &'a Target)>) -> MapSummary {
    let mut by_class: BTreeMap<String, Acc> = BTreeMap::new();
    let mut by_op: BTreeMap<String, Acc> = BTreeMap::new();
    let mut outside: BTreeMap<String, Acc> = BTreeMap::new();
    let mut unmapped: BTreeMap<String, Acc> = BTreeMap::new();
    let (mut total, mut count) = (0u128, 0u64);
    let (mut mapped_ns, mut outside_ns, mut unmapped_ns) = (0u128, 0u128, 0u128);
    let add = |m: &mut BTreeMap<String, Acc>, key: String, k: &KernelRecord| {
        let a = m.entry(key).or_default();
        a.kernels = a.kernels.saturating_add(k.calls);
        a.ns += u128::from(k.dur_ns);
    };
    for (k, t) in kernels {
        total += u128::from(k.dur_ns);
        count = count.saturating_add(k.calls);
        match t {
            Target::Op { kind, .. } | Target::Kind(kind) => {
                mapped_ns += u128::from(k.dur_ns);
                add(&mut by_class, kind.label(), k);
                add(&mut by_op, t.op_label().unwrap_or_default(), k);
            }
            Target::Outside { reason, .. } => {
                outside_ns += u128::from(k.dur_ns);
                add(&mut outside, reason.clone(), k);
            }
            Target::Unmapped => {
                unmapped_ns += u128::from(k.dur_ns);
                add(&mut unmapped, k.name.to_string(), k);
            }
        }
    }
    MapSummary {
        kernels: count,
        time_ms: total as f64 / 1e6,
        mapped_share: fraction(mapped_ns, total),
        outside_share: fraction(outside_ns, total),
        unmapped_share: fraction(unmapped_ns, total),
        by_class: shares(by_class, total),
        by_op: shares(by_op, total),
        outside: shares(outside, total),
        unmapped: shares(unmapped, total),
    }
}
