//! Prices an op list with the cost model: per-op time and bound, the step's critical path, and the
//! effect of two-micro-batch overlap.

use dstwin_core::opgraph::{DieSet, LayerKind, Op, OpKind, Part};
use dstwin_hwmodels::{A2aMode, Bound, Cost, CostModel, CostParams};
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
    /// Its slot in a step's times by op class ([`class_slot`]).
    #[serde(skip)]
    pub slot: usize,
}

/// What the step's rules (critical path, two micro-batches, shared-expert overlap, times by op
/// class) read of a priced op. `explain` prices ops into [`PricedOp`]s, which say everything a
/// report shows; the twin device's price cache into [`PathOp`]s, which leave out what only a
/// report reads (FLOPs, bytes, rooflines: a cache miss spent a tenth of its time building
/// them). Both come from the same op prices by the same arithmetic, so the rules give the same
/// bits on either.
pub trait OpPrice {
    /// The record of op `o` at `cost` per occurrence.
    fn new(o: &Op, cost: Cost, cm: &CostModel) -> Self;
    /// What the step's rules read of it.
    fn path(&self) -> PathOp;
    /// Seconds at peak over all occurrences (0 where the record does not keep it).
    fn roofline_s(&self) -> f64;
}

impl OpPrice for PricedOp {
    #[inline]
    fn new(o: &Op, cost: Cost, cm: &CostModel) -> Self {
        let path = PathOp::new(o, cost, cm);
        let r = o.repeat as f64;
        let (class, flops, bytes, roof) = match &o.kind {
            OpKind::Compute(w) => {
                let peak_bw = cm.system.chip.hbm_bytes_per_s();
                let roof = (w.flops / cm.peak_flops(w.dtype)).max(w.bytes / peak_bw);
                (w.class.name(), w.flops, w.bytes, roof)
            }
            OpKind::Comm(c) => (c.kind.name(), 0.0, c.bytes, 0.0),
        };
        PricedOp {
            name: path.name,
            layer: path.layer,
            dies: path.dies,
            class,
            repeat: path.repeat,
            time_s: cost.time_s,
            total_s: path.total_s,
            bound: path.bound,
            flops: flops * r,
            bytes: bytes * r,
            roofline_s: roof * r,
            compute_busy_s: path.compute_busy_s,
            memory_busy_s: path.memory_busy_s,
            a2a_mode: path.a2a_mode,
            slot: path.slot as usize,
        }
    }

    #[inline]
    fn path(&self) -> PathOp {
        PathOp {
            name: self.name,
            repeat: self.repeat,
            total_s: self.total_s,
            compute_busy_s: self.compute_busy_s,
            memory_busy_s: self.memory_busy_s,
            layer: self.layer,
            dies: self.dies,
            bound: self.bound,
            a2a_mode: self.a2a_mode,
            slot: self.slot as u8,
        }
    }

    fn roofline_s(&self) -> f64 {
        self.roofline_s
    }
}

/// A priced op as the step's rules read it ([`OpPrice`]): the twin device's price cache
/// prices its misses into these. Fields as in [`PricedOp`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PathOp {
    pub name: &'static str,
    pub repeat: u64,
    pub total_s: f64,
    pub compute_busy_s: f64,
    pub memory_busy_s: f64,
    pub layer: LayerKind,
    pub dies: DieSet,
    pub bound: Bound,
    pub a2a_mode: Option<A2aMode>,
    pub slot: u8,
}

impl OpPrice for PathOp {
    #[inline]
    fn new(o: &Op, cost: Cost, _cm: &CostModel) -> Self {
        let r = o.repeat as f64;
        PathOp {
            name: o.name,
            repeat: o.repeat,
            total_s: cost.time_s * r,
            compute_busy_s: cost.compute_s * r,
            memory_busy_s: cost.memory_s * r,
            layer: o.layer,
            dies: o.dies,
            bound: cost.bound,
            a2a_mode: match &o.kind {
                OpKind::Comm(c) => Some(c.mode),
                OpKind::Compute(_) => None,
            },
            slot: class_slot(&o.kind) as u8,
        }
    }

    #[inline]
    fn path(&self) -> PathOp {
        *self
    }

    fn roofline_s(&self) -> f64 {
        0.0
    }
}

/// The slot of an op's class in [`dstwin_core::device::ClassTimes`]: reports show prefill and
/// decode attention as one share, both grouped GEMMs as one, and collectives without a slot
/// of their own together (a test checks this against the slots' names).
pub fn class_slot(kind: &OpKind) -> usize {
    use dstwin_core::device::OTHER_COMM;
    use dstwin_hwmodels::{CommKind, OpClass};
    match kind {
        OpKind::Compute(w) => match w.class {
            OpClass::Gemm => 0,
            OpClass::GroupedGemm | OpClass::TpGroupedGemm => 1,
            OpClass::Attention | OpClass::PrefillAttention => 2,
            OpClass::Indexer => 3,
            OpClass::Elementwise => 4,
        },
        OpKind::Comm(c) => match c.kind {
            CommKind::Dispatch => 5,
            CommKind::Combine => 6,
            CommKind::AllReduce => 7,
            CommKind::AllGather => 8,
            CommKind::ReduceScatter | CommKind::P2p => OTHER_COMM,
        },
    }
}

/// The sums a step's rules (critical path, two micro-batches, shared-expert overlap) read,
/// over a set of priced ops: one part's ops on one die set ([`StepSums`]), or a step's
/// critical path ([`on_path`]). The rules are functions of these sums alone, so the twin prices
/// a step's two parts apart, caches each under what fixes it, and adds them. Times by op class
/// and rooflines, which only the slowest rank's report and `explain` read, are summed from the
/// op list instead: 144 bytes stay in the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PathSums {
    /// Seconds of ops bound by compute or HBM, and by communication.
    pub compute_s: f64,
    pub comm_s: f64,
    /// Seconds of the ops that run once per step (embedding, LM head).
    once_s: f64,
    /// By layer group (0: the decoder layers, 1: the MTP module), for two micro-batches.
    groups: [GroupSums; 2],
    /// By layer group: the shared expert's seconds where every die runs it, and dispatch plus
    /// combine seconds, what a second stream can hide it under (both sit in MoE layers only:
    /// the decoder's and the MTP module's).
    shared_s: [f64; 2],
    a2a_s: [f64; 2],
    /// Whether any collective runs in normal mode, and any in low-latency mode.
    normal: bool,
    low_latency: bool,
}

/// A layer group's sums for two micro-batches ([`two_microbatch_time`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct GroupSums {
    /// Seconds of the attention stream (compute on every die) and of the MoE stream
    /// (collectives and expert-die ops).
    attention: f64,
    moe: f64,
    /// Seconds the ops keep the compute units and HBM busy.
    compute: f64,
    memory: f64,
    /// Layers the group repeats over (its ops' largest repeat; 0: no ops).
    layers: u64,
}

impl PathSums {
    /// Adds a priced op.
    #[inline]
    fn add(&mut self, q: &PathOp) {
        let comm = q.bound == Bound::Communication;
        if comm {
            self.comm_s += q.total_s;
        } else {
            self.compute_s += q.total_s;
        }
        let g = usize::from(q.layer == LayerKind::Mtp);
        match q.layer {
            LayerKind::Embedding | LayerKind::LmHead => self.once_s += q.total_s,
            _ => {
                let gs = &mut self.groups[g];
                if comm || q.dies != DieSet::All {
                    gs.moe += q.total_s;
                } else {
                    gs.attention += q.total_s;
                }
                gs.compute += q.compute_busy_s;
                gs.memory += q.memory_busy_s;
                // An op repeats at least once (the op graph drops the others).
                gs.layers = gs.layers.max(q.repeat);
            }
        }
        match q.name {
            "shared_expert" | "dispatch" | "combine" => {
                debug_assert!(matches!(q.layer, LayerKind::Moe | LayerKind::Mtp));
                if q.name != "shared_expert" {
                    self.a2a_s[g] += q.total_s;
                } else if q.dies == DieSet::All {
                    self.shared_s[g] += q.total_s;
                }
            }
            _ => {}
        }
        match q.a2a_mode {
            Some(A2aMode::Normal) => self.normal = true,
            Some(A2aMode::LowLatency) => self.low_latency = true,
            None => {}
        }
    }

    /// Adds the sums of other ops.
    #[inline]
    fn merge(&mut self, o: &PathSums) {
        self.compute_s += o.compute_s;
        self.comm_s += o.comm_s;
        self.once_s += o.once_s;
        for (g, h) in self.groups.iter_mut().zip(&o.groups) {
            g.attention += h.attention;
            g.moe += h.moe;
            g.compute += h.compute;
            g.memory += h.memory;
            g.layers = g.layers.max(h.layers);
        }
        for g in 0..2 {
            self.shared_s[g] += o.shared_s[g];
            self.a2a_s[g] += o.a2a_s[g];
        }
        self.normal |= o.normal;
        self.low_latency |= o.low_latency;
    }

    /// Seconds of all the ops, one after another.
    pub fn total_s(&self) -> f64 {
        self.compute_s + self.comm_s
    }

    /// The all-to-all mode of steps with these ops: normal when any collective runs in normal
    /// mode (or there is none), low-latency otherwise.
    pub fn a2a_mode(&self) -> A2aMode {
        if self.low_latency && !self.normal {
            A2aMode::LowLatency
        } else {
            A2aMode::Normal
        }
    }
}

/// A step's sums by part: its batch part's (every die runs it), and its MoE part's by die set
/// (indexed as [`DieSet`] is declared).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepSums {
    pub batch: PathSums,
    pub moe: [PathSums; 3],
}

impl StepSums {
    #[inline]
    fn add(&mut self, part: Part, q: &PathOp) {
        match part {
            Part::Batch => {
                debug_assert_eq!(q.dies, DieSet::All, "{}", q.name);
                self.batch.add(q)
            }
            Part::Moe => self.moe[q.dies as usize].add(q),
        }
    }
}

/// The critical path of a step whose batch part sums to `batch` and whose MoE part sums, by
/// die set, to `moe`: every die's ops plus those of the slower expert die set, which it
/// returns too (routed on a tie). The one rule `explain` and the twin device share.
pub fn on_path(batch: &PathSums, moe: [&PathSums; 3]) -> (DieSet, PathSums) {
    let shared = moe[DieSet::SharedExperts as usize].total_s();
    let routed = moe[DieSet::RoutedExperts as usize].total_s();
    let slow = if shared > routed {
        DieSet::SharedExperts
    } else {
        DieSet::RoutedExperts
    };
    let mut p = *batch;
    p.merge(moe[DieSet::All as usize]);
    p.merge(moe[slow as usize]);
    (slow, p)
}

/// A priced step, its ops recorded as `O` ([`OpPrice`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepCost<O = PricedOp> {
    pub ops: Vec<O>,
    /// Critical path without overlap: all-die ops plus the slower of the routed-expert and
    /// shared-expert die sets.
    pub serial_s: f64,
    /// Compute and communication seconds on the critical path.
    pub compute_s: f64,
    pub comm_s: f64,
    /// The step at 100% of peak with no overhead and no communication: a lower bound (0 for
    /// ops recorded without rooflines, [`PathOp`]).
    pub roofline_s: f64,
    /// The expert die set that sets the pace.
    #[serde(skip)]
    slow: DieSet,
    /// The ops' sums by part and die set, and on the critical path.
    #[serde(skip)]
    pub sums: StepSums,
    #[serde(skip)]
    pub path: PathSums,
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

    fn sum_by(&self, key: impl Fn(&PricedOp) -> &'static str) -> BTreeMap<&'static str, f64> {
        let mut m = BTreeMap::new();
        for o in self.on_path() {
            *m.entry(key(o)).or_insert(0.0) += o.total_s;
        }
        m
    }
}

impl<O: OpPrice> StepCost<O> {
    /// The step of the priced `ops`, which sum to `sums`.
    fn new(ops: Vec<O>, sums: StepSums) -> Self {
        let (slow, path) = on_path(&sums.batch, sums.moe.each_ref());
        let mut step = StepCost {
            ops,
            serial_s: path.total_s(),
            compute_s: path.compute_s,
            comm_s: path.comm_s,
            roofline_s: 0.0,
            slow,
            sums,
            path,
        };
        step.roofline_s = step.on_path().map(O::roofline_s).sum();
        step
    }

    /// Ops on the critical path.
    pub fn on_path(&self) -> impl Iterator<Item = &O> {
        let slow = self.slow;
        self.ops.iter().filter(move |o| {
            let d = o.path().dies;
            d == DieSet::All || d == slow
        })
    }

    /// The expert die set that sets the pace.
    pub fn slow_set(&self) -> DieSet {
        self.slow
    }

    /// The step's all-to-all mode ([`PathSums::a2a_mode`] of its critical path).
    pub fn a2a_mode(&self) -> A2aMode {
        self.path.a2a_mode()
    }
}

/// One op's price on `cm`.
fn op_cost(o: &Op, cm: &CostModel) -> Cost {
    match &o.kind {
        OpKind::Compute(w) => cm.compute_op(o.name, w),
        OpKind::Comm(c) => cm.comm(c),
    }
}

/// The last price at each position of an op list. Consecutive misses of the twin's price cache
/// mostly differ in a few ops (a new step load moves the MoE ops, a longer context the
/// attention), and an op with the same name and the same work costs the same: it is priced
/// once, then read back.
#[derive(Clone, Debug, Default)]
pub struct OpMemo {
    last: Vec<Option<(&'static str, OpKind, Cost)>>,
}

/// The same work to the bit (a price is a function of the op's name and the bits of its work).
#[inline]
fn same_kind(a: &OpKind, b: &OpKind) -> bool {
    let eq = |x: f64, y: f64| x.to_bits() == y.to_bits();
    match (a, b) {
        (OpKind::Compute(x), OpKind::Compute(y)) => {
            eq(x.flops, y.flops)
                && eq(x.bytes, y.bytes)
                && eq(x.rows, y.rows)
                && eq(x.slice, y.slice)
                && x.class == y.class
                && x.dtype == y.dtype
        }
        (OpKind::Comm(x), OpKind::Comm(y)) => {
            eq(x.bytes, y.bytes)
                && eq(x.copies, y.copies)
                && x.kind == y.kind
                && x.group == y.group
                && x.mode == y.mode
        }
        _ => false,
    }
}

impl OpMemo {
    /// The price of `o`, the op at position `i` of its list.
    #[inline]
    fn cost(&mut self, i: usize, o: &Op, cm: &CostModel) -> Cost {
        if let Some(Some((name, kind, c))) = self.last.get(i) {
            // Names are static strings from the op graph, compared by address: an equal name
            // elsewhere only costs a price.
            if std::ptr::eq(*name, o.name) && same_kind(kind, &o.kind) {
                return *c;
            }
        }
        let c = op_cost(o, cm);
        if i >= self.last.len() {
            self.last.resize(i + 1, None);
        }
        self.last[i] = Some((o.name, o.kind, c));
        c
    }
}

/// Prices every op of `ops` on `cm`.
pub fn price(ops: &[Op], cm: &CostModel) -> StepCost {
    price_by(
        ops,
        cm,
        |_, o| op_cost(o, cm),
        Vec::with_capacity(ops.len()),
    )
}

/// [`price`], each op's price read from `memo` where its work is unchanged.
pub fn price_memo<O: OpPrice>(ops: &[Op], cm: &CostModel, memo: &mut OpMemo) -> StepCost<O> {
    price_by(
        ops,
        cm,
        |i, o| memo.cost(i, o, cm),
        Vec::with_capacity(ops.len()),
    )
}

/// The sums of `ops` priced on `cm` (what [`price`] sums), each op's price read
/// from `memo` where its work is unchanged: what the twin device caches of a step's part.
pub fn price_sums(ops: &[Op], cm: &CostModel, memo: &mut OpMemo) -> StepSums {
    let mut sums = StepSums::default();
    for (i, o) in ops.iter().enumerate() {
        sums.add(o.part, &PathOp::new(o, memo.cost(i, o, cm), cm));
    }
    sums
}

/// Prices `ops` into `out` (cleared first), each op's price from `cost_of(position, op)`.
fn price_by<O: OpPrice>(
    ops: &[Op],
    cm: &CostModel,
    mut cost_of: impl FnMut(usize, &Op) -> Cost,
    mut out: Vec<O>,
) -> StepCost<O> {
    out.clear();
    let mut sums = StepSums::default();
    for (i, o) in ops.iter().enumerate() {
        let p = O::new(o, cost_of(i, o), cm);
        sums.add(o.part, &p.path());
        out.push(p);
    }
    StepCost::new(out, sums)
}

/// Step time with two micro-batches, each half of the batch's critical path summing to `half`.
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
pub fn two_microbatch_time(half: &PathSums, params: &CostParams) -> f64 {
    let overlap = params.overlap_efficiency(half.a2a_mode());
    // Decoder layers and the MTP module (in that order), each spread evenly over its layer
    // count; a group without ops adds nothing.
    let mut t = 2.0 * half.once_s;
    for g in half.groups.iter().filter(|g| g.layers > 0) {
        let n = g.layers.max(1) as f64;
        let (a, m) = (g.attention / n, g.moe / n);
        let best = 2.0 * a.max(m).max(g.compute / n).max(g.memory / n);
        let serial = 2.0 * (a + m);
        t += n * (best + (1.0 - overlap) * (serial - best)) + a.min(m);
    }
    t
}

/// A step priced under an instance's engine mechanisms.
#[derive(Clone, Copy, Debug)]
pub struct StepPrice {
    /// The step's time: serial, or split in two micro-batches where the mechanisms say so.
    pub time_s: f64,
    /// The step without micro-batches (shared-expert overlap applied).
    pub serial_s: f64,
    /// The step with two micro-batches, when priced (allowed at this size).
    pub split_s: Option<f64>,
    /// Whether `time_s` is the split step.
    pub split_used: bool,
    /// Seconds of the shared expert hidden under the dispatch and combine by a second stream.
    pub shared_overlap_s: f64,
    /// Seconds an eager MTP drafter's launches add beyond its kernels (`mtp_enforce_eager`),
    /// included in `time_s`, `serial_s` and `split_s`.
    pub draft_launch_gap_s: f64,
}

/// Shared-expert seconds a second stream hides under the routed experts' dispatch and combine
/// (`multistream_overlap_shared_expert`): per MoE layer, the lesser of the two, on the
/// critical path `path`.
pub fn shared_expert_overlap(path: &PathSums) -> f64 {
    let [d, m] = [0, 1].map(|g| path.shared_s[g].min(path.a2a_s[g]));
    d + m
}

/// Prices a step of one DP rank computing `shape` under the instance's mechanisms: the one
/// rule `explain` and the twin device share. `full` is the step's critical path
/// ([`on_path`]); `half` is the step's time in two micro-batches ([`two_microbatch_time`] of
/// the same step with half the batch), called only when the mechanisms allow a split at this
/// size. `draft_launch_s` is the host time to launch the MTP drafter's kernels one by one
/// ([`draft_launch_s`]; 0 when the drafter runs in the step's graph): its kernels run behind
/// those launches, so the drafter takes the longer of the two.
pub fn price_step(
    features: &dstwin_core::features::Resolved,
    shape: &dstwin_core::batch::BatchShape,
    full: &PathSums,
    draft_launch_s: f64,
    half: impl FnOnce() -> f64,
) -> StepPrice {
    use dstwin_core::features::TwoMicrobatch;
    let shared_overlap_s = if features.shared_expert_overlap {
        shared_expert_overlap(full)
    } else {
        0.0
    };
    let serial_s = full.total_s() - shared_overlap_s;
    let split_s = features
        .two_microbatch_allowed(shape.tokens(), shape.prefill_tokens > 0)
        .then(half);
    let (time_s, split_used) = match (features.two_microbatch, split_s) {
        (TwoMicrobatch::Force, Some(s)) => (s, true),
        (TwoMicrobatch::Auto, Some(s)) if s < serial_s => (s, true),
        _ => (serial_s, false),
    };
    let [_, mtp] = &full.groups;
    let drafter_s = mtp.attention + mtp.moe;
    let draft_launch_gap_s = if drafter_s > 0.0 {
        (draft_launch_s - drafter_s).max(0.0)
    } else {
        0.0
    };
    StepPrice {
        time_s: time_s + draft_launch_gap_s,
        serial_s: serial_s + draft_launch_gap_s,
        split_s: split_s.map(|s| s + draft_launch_gap_s),
        split_used,
        shared_overlap_s,
        draft_launch_gap_s,
    }
}

/// What a report must say about the fabric an instance's all-to-all runs on: one line per
/// dispatch/combine mode whose fabric level the cost model's all-to-all parameters were not
/// fitted on (the price there is an extrapolation), empty when every level is fitted.
/// Host time, seconds, to launch one step's kernels one by one (an eager step's floor): the cost
/// file's `[host] eager_layer_us` for every decoder layer, and for the MTP module once per draft
/// (vLLM reruns it). 0 when the file gives none.
pub fn eager_launch_s(
    cost: &CostModel,
    model: &dstwin_core::model::ModelConfig,
    mtp_tokens: u32,
) -> f64 {
    layer_launch_s(cost) * model.layers as f64 + drafter_launches_s(cost, model, mtp_tokens)
}

/// Host time, seconds, to launch the MTP drafter's kernels one by one when it runs eagerly
/// beside a graph-captured step (`mtp_enforce_eager`): the cost file's `[host]
/// eager_layer_us` for the MTP module once per draft. 0 when the drafter runs in the graph or
/// the file gives no launch cost.
pub fn draft_launch_s(
    cost: &CostModel,
    model: &dstwin_core::model::ModelConfig,
    mtp_tokens: u32,
    features: &dstwin_core::features::Resolved,
) -> f64 {
    if features.mtp_enforce_eager {
        drafter_launches_s(cost, model, mtp_tokens)
    } else {
        0.0
    }
}

fn layer_launch_s(cost: &CostModel) -> f64 {
    cost.params.host.as_ref().map_or(0.0, |h| h.eager_layer_us) * 1e-6
}

fn drafter_launches_s(
    cost: &CostModel,
    model: &dstwin_core::model::ModelConfig,
    mtp_tokens: u32,
) -> f64 {
    layer_launch_s(cost) * (model.mtp_layers.min(1) * mtp_tokens as u64) as f64
}

pub fn fabric_caveats(ep: u32, cost: &CostModel) -> Vec<String> {
    use dstwin_hwmodels::{Comm, CommKind};
    let mut out = Vec::new();
    for (mode, what) in [
        (A2aMode::LowLatency, "low-latency (MC2) dispatch/combine"),
        (A2aMode::Normal, "bulk (all-to-all) dispatch/combine"),
    ] {
        let c = Comm {
            kind: CommKind::Dispatch,
            bytes: 1.0,
            group: ep,
            mode,
            copies: 0.0,
        };
        if let Some(level) = cost.unfitted_level(&c) {
            let fitted = &cost.params.alltoall.fitted_on;
            let name = &cost.params.name;
            out.push(if fitted.is_empty() {
                let from = cost
                    .params
                    .inherits
                    .as_ref()
                    .map_or_else(|| "borrowed".to_string(), |b| format!("{b}'s"));
                format!(
                    "{what} of EP{ep} runs over {level}, but no all-to-all microbenchmark of {name} was fitted (its parameters are {from}): its price is an extrapolation"
                )
            } else {
                format!(
                    "{what} of EP{ep} runs over {level}, but the {name} all-to-all parameters were fitted on {}: its price is an extrapolation",
                    fitted.join(", ")
                )
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use dstwin_core::device::{CLASS_NAMES, OTHER_COMM};
    use dstwin_hwmodels::{Comm, CommKind, DType, OpClass, Work};

    #[test]
    fn each_class_has_the_slot_of_its_name() {
        let by_name = |name: &str| {
            // Prefill attention reports as attention, the tensor-parallel grouped GEMM as the
            // grouped GEMM.
            let name = match name {
                "prefill_attention" => "attention",
                "tp_grouped_gemm" => "grouped_gemm",
                n => n,
            };
            CLASS_NAMES
                .iter()
                .position(|n| *n == name)
                .unwrap_or(OTHER_COMM)
        };
        for class in OpClass::ALL {
            let w = Work {
                class,
                flops: 1.0,
                bytes: 1.0,
                dtype: DType::Bf16,
                rows: 1.0,
                slice: 0.0,
            };
            assert_eq!(
                class_slot(&OpKind::Compute(w)),
                by_name(class.name()),
                "{class:?}"
            );
        }
        for kind in CommKind::ALL {
            let c = Comm {
                kind,
                bytes: 1.0,
                group: 2,
                mode: A2aMode::Normal,
                copies: 0.0,
            };
            assert_eq!(
                class_slot(&OpKind::Comm(c)),
                by_name(kind.name()),
                "{kind:?}"
            );
        }
    }
}
