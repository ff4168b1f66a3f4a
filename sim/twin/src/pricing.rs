//! Prices an op list with the cost model: per-op time and bound, the step's critical path, and the
//! effect of two-micro-batch overlap.

use dstwin_core::opgraph::{DieSet, LayerKind, Op, OpKind};
use dstwin_hwmodels::{A2aMode, Bound, CostModel, CostParams};
use serde::Serialize;
use std::collections::BTreeMap;

/// One op with its price.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PricedOp {
    pub name: &'static str,
    pub layer: LayerKind,
    pub dies: DieSet,
    /// Op class (`gemm`, `attention`, ...) or collective (`dispatch`, `all_reduce`, ...).
    pub class: &'static str,
    pub repeat: u64,
    /// Seconds per occurrence.
    pub time_s: f64,
    /// Seconds over all occurrences.
    pub total_s: f64,
    pub bound: Bound,
    /// FLOPs over all occurrences.
    pub flops: f64,
    /// HBM or fabric bytes over all occurrences.
    pub bytes: f64,
    /// Seconds at 100% of peak compute / HBM bandwidth, over all occurrences (0 for collectives).
    pub roofline_s: f64,
    /// Seconds the op keeps the compute units busy at the model's efficiency, over all
    /// occurrences (0 for collectives).
    pub compute_busy_s: f64,
    /// Seconds it keeps HBM busy at the model's efficiency, over all occurrences (0 for
    /// collectives).
    pub memory_busy_s: f64,
    /// The all-to-all mode of a dispatch or combine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub a2a_mode: Option<A2aMode>,
}

/// A priced step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepCost {
    pub ops: Vec<PricedOp>,
    /// Critical path without overlap: all-die ops plus the slower of the routed-expert and
    /// shared-expert die sets.
    pub serial_s: f64,
    /// Compute and communication seconds on the critical path.
    pub compute_s: f64,
    pub comm_s: f64,
    /// The step at 100% of peak with no overhead and no communication: a lower bound.
    pub roofline_s: f64,
    /// The expert die set that sets the pace, found once ([`StepCost::slow_set`]).
    #[serde(skip)]
    slow: DieSet,
}

impl StepCost {
    /// Seconds by op class or collective kind, on the critical path.
    pub fn by_class(&self) -> BTreeMap<&'static str, f64> {
        self.sum_by(|o| o.class)
    }

    /// Seconds by where in the model the op sits.
    pub fn by_layer(&self) -> BTreeMap<&'static str, f64> {
        self.sum_by(|o| o.layer.name())
    }

    /// Seconds by the resource that bounds each op.
    pub fn by_bound(&self) -> BTreeMap<&'static str, f64> {
        self.sum_by(|o| o.bound.name())
    }

    /// Ops on the critical path.
    pub fn on_path(&self) -> impl Iterator<Item = &PricedOp> {
        let slow = self.slow;
        self.ops
            .iter()
            .filter(move |o| o.dies == DieSet::All || o.dies == slow)
    }

    /// The expert die set that sets the pace.
    pub fn slow_set(&self) -> DieSet {
        self.slow
    }

    fn find_slow_set(ops: &[PricedOp]) -> DieSet {
        let sum = |d| {
            ops.iter()
                .filter(|o| o.dies == d)
                .map(|o| o.total_s)
                .sum::<f64>()
        };
        if sum(DieSet::SharedExperts) > sum(DieSet::RoutedExperts) {
            DieSet::SharedExperts
        } else {
            DieSet::RoutedExperts
        }
    }

    /// The step's all-to-all mode: normal when any all-to-all on the path runs in normal mode
    /// (or there is none), low-latency otherwise.
    pub fn a2a_mode(&self) -> A2aMode {
        let mut modes = self.on_path().filter_map(|o| o.a2a_mode).peekable();
        if modes.peek().is_some() && modes.all(|m| m == A2aMode::LowLatency) {
            A2aMode::LowLatency
        } else {
            A2aMode::Normal
        }
    }

    fn sum_by(&self, key: impl Fn(&PricedOp) -> &'static str) -> BTreeMap<&'static str, f64> {
        let mut m = BTreeMap::new();
        for o in self.on_path() {
            *m.entry(key(o)).or_insert(0.0) += o.total_s;
        }
        m
    }
}

/// Prices every op of `ops` on `cm`.
pub fn price(ops: &[Op], cm: &CostModel) -> StepCost {
    let peak_bw = cm.system.chip.hbm_bytes_per_s();
    let priced: Vec<PricedOp> = ops
        .iter()
        .map(|o| {
            let r = o.repeat as f64;
            let (cost, class, flops, bytes, roof) = match &o.kind {
                OpKind::Compute(w) => {
                    let roof = (w.flops / cm.peak_flops(w.dtype)).max(w.bytes / peak_bw);
                    (cm.compute(w), w.class.name(), w.flops, w.bytes, roof)
                }
                OpKind::Comm(c) => (cm.comm(c), c.kind.name(), 0.0, c.bytes, 0.0),
            };
            PricedOp {
                name: o.name,
                layer: o.layer,
                dies: o.dies,
                class,
                repeat: o.repeat,
                time_s: cost.time_s,
                total_s: cost.time_s * r,
                bound: cost.bound,
                flops: flops * r,
                bytes: bytes * r,
                roofline_s: roof * r,
                compute_busy_s: cost.compute_s * r,
                memory_busy_s: cost.memory_s * r,
                a2a_mode: match &o.kind {
                    OpKind::Comm(c) => Some(c.mode),
                    OpKind::Compute(_) => None,
                },
            }
        })
        .collect();
    let mut step = StepCost {
        slow: StepCost::find_slow_set(&priced),
        ops: priced,
        serial_s: 0.0,
        compute_s: 0.0,
        comm_s: 0.0,
        roofline_s: 0.0,
    };
    let (mut compute, mut comm, mut roof) = (0.0, 0.0, 0.0);
    for o in step.on_path() {
        if o.bound == Bound::Communication {
            comm += o.total_s;
        } else {
            compute += o.total_s;
        }
        roof += o.roofline_s;
    }
    step.compute_s = compute;
    step.comm_s = comm;
    step.serial_s = compute + comm;
    step.roofline_s = roof;
    step
}

/// Step time with two micro-batches, each half of the batch priced as `half`.
///
/// Within each repeated layer the two micro-batches run on two streams of the same die: the
/// attention stream (the ops every die runs) and the MoE stream (dispatch, the expert GEMMs,
/// combine). One micro-batch's attention runs while the other's MoE stage runs, so besides
/// hiding communication, a memory-bound op of one stream can run under a compute-bound op of
/// the other. A layer of both micro-batches then takes at best
/// `2 x max(attention, moe, compute-busy, HBM-busy)` of a half (neither stream can go faster
/// than its own chain; the two share the die's compute units and HBM), and at worst the two
/// halves one after the other, `2 x (attention + moe)`. The hardware's overlap efficiency for
/// the step's all-to-all mode (1.0 = the best case) sets where between the two a layer lands.
/// One stage's fill is added at the start. Ops that run once per step (embedding, LM head) do
/// not overlap.
pub fn two_microbatch_time(half: &StepCost, params: &CostParams) -> f64 {
    let overlap = params.overlap_efficiency(half.a2a_mode());
    #[derive(Default)]
    struct Group {
        attention: f64,
        moe: f64,
        compute: f64,
        memory: f64,
        layers: u64,
    }
    // Decoder layers and the MTP module (in that order), each spread evenly over its layer
    // count; a group without ops adds nothing.
    let mut groups: [Option<Group>; 2] = [None, None];
    let mut once = 0.0;
    for o in half.on_path() {
        match o.layer {
            LayerKind::Embedding | LayerKind::LmHead => once += 2.0 * o.total_s,
            _ => {
                let g = groups[usize::from(o.layer == LayerKind::Mtp)].get_or_insert_default();
                if o.bound == Bound::Communication || o.dies != DieSet::All {
                    g.moe += o.total_s;
                } else {
                    g.attention += o.total_s;
                }
                g.compute += o.compute_busy_s;
                g.memory += o.memory_busy_s;
                g.layers = g.layers.max(o.repeat);
            }
        }
    }
    let mut t = once;
    for g in groups.into_iter().flatten() {
        let n = g.layers.max(1) as f64;
        let (a, m) = (g.attention / n, g.moe / n);
        let best = 2.0 * a.max(m).max(g.compute / n).max(g.memory / n);
        let serial = 2.0 * (a + m);
        t += n * (best + (1.0 - overlap) * (serial - best)) + a.min(m);
    }
    t
}
