//! `SimDevice`: the twin's device. Prices each DP rank's step with the op graph and the cost model
//! (memoized on quantized shapes), takes the slowest rank as the lockstep step time, and draws MTP
//! acceptance per sequence.

use crate::expert_load::{effective_requests, fluctuation, imbalance, ExpertLoad};
use crate::pricing::{price, two_microbatch_time, StepCost};
use dstwin_core::batch::BatchShape;
use dstwin_core::device::{
    Capacity, ClassTimes, Device, DeviceError, ExpertHeat, ExpertMove, StepOutcome, StepPlan,
    TransferOutcome, CLASS_NAMES, CLASS_SLOTS, DUMMY_TOKENS, HOST, OTHER_COMM,
};
use dstwin_core::eplb::Placement;
use dstwin_core::layout::Plan;
use dstwin_core::model::{ModelConfig, Quant};
use dstwin_core::mtp::Acceptance;
use dstwin_core::opgraph::{step_ops, MoeLoad, StepSpec};
use dstwin_core::time::SimDuration;
use dstwin_hwmodels::{CostModel, DType};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Significant bits kept when quantizing shape sums for the price cache: prices are computed on
/// the quantized shape, so a result never depends on which shape filled the cache first, and the
/// relative rounding is below 1/2^7 < 0.8%.
const KEY_BITS: u32 = 7;

/// Imbalance is priced in steps of 1 / IMBALANCE_BUCKETS (2%).
const IMBALANCE_BUCKETS: f64 = 50.0;

fn quantize(v: u64) -> u64 {
    let bits = 64 - v.leading_zeros();
    if bits <= KEY_BITS {
        v
    } else {
        let shift = bits - KEY_BITS;
        // Round to nearest at the kept precision.
        ((v + (1 << (shift - 1))) >> shift) << shift
    }
}

fn quantize_shape(s: &BatchShape) -> BatchShape {
    BatchShape {
        prefill_seqs: quantize(s.prefill_seqs as u64) as u32,
        prefill_tokens: quantize(s.prefill_tokens),
        prefill_pairs: quantize(s.prefill_pairs),
        prefill_pairs_capped: quantize(s.prefill_pairs_capped),
        decode_seqs: quantize(s.decode_seqs as u64) as u32,
        decode_tokens: quantize(s.decode_tokens),
        decode_pairs: quantize(s.decode_pairs),
        decode_pairs_capped: quantize(s.decode_pairs_capped),
    }
}

/// Half of a batch for two-micro-batch overlap: sequences split in two, sums halved.
fn half(s: &BatchShape) -> BatchShape {
    BatchShape {
        prefill_seqs: s.prefill_seqs.div_ceil(2),
        prefill_tokens: s.prefill_tokens.div_ceil(2),
        prefill_pairs: s.prefill_pairs.div_ceil(2),
        prefill_pairs_capped: s.prefill_pairs_capped.div_ceil(2),
        decode_seqs: s.decode_seqs.div_ceil(2),
        decode_tokens: s.decode_tokens.div_ceil(2),
        decode_pairs: s.decode_pairs.div_ceil(2),
        decode_pairs_capped: s.decode_pairs_capped.div_ceil(2),
    }
}

/// The price of one rank's step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RankCost {
    pub time_s: f64,
    pub class_times: ClassTimes,
}

fn class_times(c: &StepCost, scale: f64) -> ClassTimes {
    let mut t = [0.0; CLASS_SLOTS];
    for o in c.on_path() {
        let slot = CLASS_NAMES
            .iter()
            .position(|n| *n == o.class)
            .unwrap_or(OTHER_COMM);
        t[slot] += o.total_s * scale;
    }
    t
}

/// Everything that fixes an instance's step prices besides the batch.
#[derive(Clone, Debug)]
pub struct PricerSpec {
    pub model: ModelConfig,
    pub quant: Quant,
    pub kv_dtype: DType,
    pub plan: Plan,
    pub mtp_tokens: u32,
    pub two_microbatch: bool,
    pub cost: CostModel,
}

/// Memoized per-rank step pricing.
#[derive(Clone, Debug)]
pub struct StepPricer {
    spec: PricerSpec,
    cache: HashMap<PriceKey, RankCost, BuildHasherDefault<KeyHasher>>,
    /// Per DP rank, the last key it priced and its cost: a rank's quantized shape stays the
    /// same for many steps, and this small array stays in cache where the map does not.
    recent: Vec<Option<(PriceKey, RankCost)>>,
    pub hits: u64,
    pub misses: u64,
}

/// A price-cache key: quantized shape, quantized group tokens, imbalance bucket.
type PriceKey = (BatchShape, u64, u64);

/// The price cache's hasher: FxHash's word mixing, finished with splitmix64's avalanche.
/// Quantized sums end in long runs of zero bits; FxHash alone leaves the bits the map takes its
/// bucket and tag from clustered, and a lookup then compares key after key (measured: a third
/// of the Mooncake run's time went to those compares).
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }

    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    #[inline]
    fn finish(&self) -> u64 {
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

impl StepPricer {
    pub fn new(spec: PricerSpec) -> Self {
        StepPricer {
            spec,
            cache: HashMap::default(),
            recent: Vec::new(),
            hits: 0,
            misses: 0,
        }
    }

    pub fn spec(&self) -> &PricerSpec {
        &self.spec
    }

    fn price_shape(&self, shape: &BatchShape, group_tokens: u64, imbalance: f64) -> StepCost {
        let s = &self.spec;
        let spec = StepSpec {
            model: &s.model,
            quant: s.quant,
            kv_dtype: s.kv_dtype,
            plan: &s.plan,
            mtp_tokens: s.mtp_tokens,
        };
        let load = MoeLoad {
            group_tokens,
            imbalance,
        };
        price(&step_ops(spec, shape, &load), &s.cost)
    }

    /// The price of one rank computing `shape` while the EP group computes `group_tokens` with
    /// the hottest routed die carrying `imbalance` times the mean (priced, like the shapes, at
    /// the quantized value: steps of 2%, so a drifting load revisits cached prices).
    pub fn rank_cost(&mut self, shape: &BatchShape, group_tokens: u64, imbalance: f64) -> RankCost {
        let key = Self::key(shape, group_tokens, imbalance);
        self.cost_of(key)
    }

    /// [`StepPricer::rank_cost`] for DP rank `rank`, checking first what that rank priced last.
    pub fn rank_cost_of(
        &mut self,
        rank: usize,
        shape: &BatchShape,
        group_tokens: u64,
        imbalance: f64,
    ) -> RankCost {
        let key = Self::key(shape, group_tokens, imbalance);
        if rank >= self.recent.len() {
            self.recent.resize(rank + 1, None);
        }
        if let Some((k, c)) = &self.recent[rank] {
            if *k == key {
                self.hits += 1;
                return *c;
            }
        }
        let c = self.cost_of(key);
        self.recent[rank] = Some((key, c));
        c
    }

    fn key(shape: &BatchShape, group_tokens: u64, imbalance: f64) -> PriceKey {
        let bucket = (imbalance * IMBALANCE_BUCKETS)
            .round()
            .max(IMBALANCE_BUCKETS) as u64;
        (quantize_shape(shape), quantize(group_tokens), bucket)
    }

    fn cost_of(&mut self, key: PriceKey) -> RankCost {
        if let Some(c) = self.cache.get(&key) {
            self.hits += 1;
            return *c;
        }
        self.misses += 1;
        let imb = key.2 as f64 / IMBALANCE_BUCKETS;
        let full = self.price_shape(&key.0, key.1, imb);
        let cost = if self.spec.two_microbatch {
            let h = self.price_shape(&half(&key.0), key.1.div_ceil(2), imb);
            let t = two_microbatch_time(&h, &self.spec.cost.params);
            RankCost {
                time_s: t,
                class_times: class_times(&full, t / full.serial_s.max(f64::MIN_POSITIVE)),
            }
        } else {
            RankCost {
                time_s: full.serial_s,
                class_times: class_times(&full, 1.0),
            }
        };
        self.cache.insert(key, cost);
        cost
    }
}

/// The twin's device for one instance.
#[derive(Clone, Debug)]
pub struct SimDevice {
    pricer: StepPricer,
    mtp: Acceptance,
    capacity: Capacity,
    dummy: BatchShape,
    /// Routed-expert load, the placement it runs on and the rebalance cycle (`None`: perfect
    /// balance).
    experts: Option<Experts>,
    imbalance: f64,
    step_imbalance: f64,
    host: HostOverhead,
    /// Dies spanned by the deployment's prefill and decode instances together (sets the fabric
    /// level KV transfers cross).
    span_dies: u32,
    /// Layers moved by EPLB and the step time their moves added.
    pub eplb_moves: u64,
    pub eplb_move_s: f64,
}

/// Host (CPU) time of a step per DP rank, and whether it overlaps the device step (async
/// scheduling) or adds to it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostOverhead {
    pub step_s: f64,
    pub per_seq_s: f64,
    pub overlapped: bool,
}

/// The routed experts of an instance as the twin sees them.
#[derive(Clone, Debug)]
pub struct Experts {
    pub load: ExpertLoad,
    /// The placement in use (the deployment core's rebalance cycle moves it one layer at a
    /// time through the plans).
    pub placement: Placement,
    /// Report the expected shares as heat after each step (the instance rebalances).
    pub reports_heat: bool,
    /// Seconds to move one expert's weights onto a die over the EP group's fabric.
    pub move_s_per_slot: f64,
    /// Per-batch fluctuation of the routing (0: none), see `expert_load::fluctuation`.
    pub concentration: f64,
}

impl Experts {
    pub fn new(
        load: ExpertLoad,
        placement: Placement,
        reports_heat: bool,
        move_s_per_slot: f64,
        concentration: f64,
    ) -> Self {
        Experts {
            load,
            placement,
            reports_heat,
            move_s_per_slot,
            concentration,
        }
    }

    /// Routed-expert dies of the placement.
    fn dies(&self) -> u32 {
        let slots = self.placement.layers.first().map_or(0, |l| l.phy2log.len());
        (slots / self.placement.slots_per_die.max(1) as usize) as u32
    }

    /// One step: install the plan's layer move, drift the load. Returns the step time the move
    /// added, whether the imbalance must be recomputed, and whether a layer moved.
    fn step(&mut self, m: Option<&ExpertMove>) -> Result<(f64, bool, bool), DeviceError> {
        let mut changed = false;
        let mut extra = 0.0;
        let mut moved = false;
        if let Some(m) = m {
            let Some(l) = self.placement.layers.get_mut(m.layer) else {
                return Err(DeviceError::Failed(format!(
                    "expert move for layer {} of a {}-layer placement",
                    m.layer,
                    self.placement.layers.len()
                )));
            };
            *l = m.placement.clone();
            extra = m.max_slots_per_die as f64 * self.move_s_per_slot;
            changed = true;
            moved = true;
        }
        if self.load.step() {
            changed = true;
        }
        Ok((extra, changed, moved))
    }
}

impl SimDevice {
    /// A device whose routed experts see `experts` (a load model, the placement it runs on and
    /// optionally a rebalance cycle), or perfect balance with `None`.
    pub fn new(
        pricer: StepPricer,
        mtp: Acceptance,
        capacity: Capacity,
        experts: Option<Experts>,
    ) -> Self {
        let cap = pricer.spec().model.attn_cap();
        let imbalance = experts
            .as_ref()
            .map_or(1.0, |e| imbalance(&e.placement, e.load.shares()));
        SimDevice {
            pricer,
            mtp,
            capacity,
            // An idle DP rank runs a one-token dummy batch to keep the all-to-all in lockstep.
            dummy: BatchShape::uniform_decode(1, DUMMY_TOKENS, 1, cap),
            experts,
            imbalance,
            step_imbalance: imbalance,
            host: HostOverhead::default(),
            span_dies: capacity.dp_ranks,
            eplb_moves: 0,
            eplb_move_s: 0.0,
        }
    }

    /// Hottest routed die over the mean, averaged over MoE layers, in the last step (the
    /// placement's imbalance for the mean load plus the step's per-batch fluctuation).
    pub fn step_imbalance(&self) -> f64 {
        self.step_imbalance
    }

    /// Sets the dies the deployment spans (the fabric level of KV transfers).
    pub fn with_span(mut self, dies: u32) -> Self {
        self.span_dies = dies;
        self
    }

    /// What a KV transfer into this instance costs when it has a link to itself: the level
    /// spanning the deployment, per destination die.
    pub fn ingress(&self) -> TransferOutcome {
        let cost = &self.pricer.spec().cost;
        let level = cost.level(self.span_dies);
        let p = &cost.params.collective;
        TransferOutcome {
            latency: SimDuration::from_micros_f64(level.latency_us + p.base_us),
            bytes_per_s: level.bw_gb_s_per_die * 1e9 * p.bw_eff,
        }
    }

    /// Sets the host time per step and whether async scheduling hides it.
    pub fn with_host(mut self, host: HostOverhead) -> Self {
        self.host = host;
        self
    }

    pub fn pricer(&self) -> &StepPricer {
        &self.pricer
    }
}

impl Device for SimDevice {
    fn capacity(&self) -> Capacity {
        self.capacity
    }

    fn execute(&mut self, plan: &StepPlan, out: &mut StepOutcome) -> Result<(), DeviceError> {
        if plan.dp_ranks != self.capacity.dp_ranks
            || plan.ranks.iter().any(|r| r.rank >= plan.dp_ranks)
        {
            return Err(DeviceError::Ranks {
                got: plan.dp_ranks as usize,
                expected: self.capacity.dp_ranks,
            });
        }
        // Idle ranks run a one-token dummy batch: priced once, whatever their number.
        let idle = plan.dummy_ranks();
        // Every token of every rank enters the MoE layers once (TP dies split a rank's tokens);
        // the dummy batch is `DUMMY_TOKENS` long.
        let group = plan.routed_tokens();
        // The batch's own routing strays from the mean the placement was made for.
        let step_imbalance = match &self.experts {
            Some(e) if e.concentration > 0.0 => {
                let n = effective_requests(plan.ranks.iter().map(|r| &r.shape));
                self.imbalance + fluctuation(e.dies(), n, e.concentration)
            }
            _ => self.imbalance,
        };
        self.step_imbalance = step_imbalance;
        let mut slowest = RankCost {
            time_s: 0.0,
            class_times: [0.0; CLASS_SLOTS],
        };
        if idle > 0 {
            slowest = self.pricer.rank_cost(&self.dummy, group, step_imbalance);
        }
        let mut last: Option<BatchShape> = None;
        for r in plan.ranks.iter().filter(|r| !r.shape.is_empty()) {
            // Consecutive ranks with equal shapes cost the same.
            if last == Some(r.shape) {
                continue;
            }
            last = Some(r.shape);
            let c = self
                .pricer
                .rank_cost_of(r.rank as usize, &r.shape, group, step_imbalance);
            if c.time_s > slowest.time_s {
                slowest = c;
            }
        }
        let mut extra_s = 0.0;
        if let Some(e) = &mut self.experts {
            let (extra, changed, moved) = e.step(plan.expert_move.as_ref())?;
            if changed {
                self.imbalance = imbalance(&e.placement, e.load.shares());
            }
            if moved {
                self.eplb_moves += 1;
                self.eplb_move_s += extra;
            }
            extra_s = extra;
        }
        out.expert_heat = match &self.experts {
            Some(e) if e.reports_heat => Some(ExpertHeat::Shares(e.load.shares_arc().clone())),
            _ => None,
        };
        out.accepted.resize_with(plan.ranks.len(), Vec::new);
        for (r, acc) in plan.ranks.iter().zip(out.accepted.iter_mut()) {
            acc.clear();
            acc.extend(
                r.decode
                    .iter()
                    .map(|d| self.mtp.accepted(d.req, d.step, d.drafts)),
            );
        }
        // Expert weights moving in this step are not overlapped with it.
        let device_s = slowest.time_s + extra_s;
        // The slowest rank's host work: added to the step, or hidden behind it (async).
        let h = self.host;
        let host_s = if h.step_s > 0.0 || h.per_seq_s > 0.0 {
            plan.ranks
                .iter()
                .map(|r| h.step_s + h.per_seq_s * r.shape.seqs() as f64)
                .fold(if idle > 0 { h.step_s } else { 0.0 }, f64::max)
        } else {
            0.0
        };
        let visible_host_s = if h.overlapped {
            (host_s - device_s).max(0.0)
        } else {
            host_s
        };
        out.duration = SimDuration::from_secs_f64(device_s + visible_host_s);
        out.class_times = slowest.class_times;
        out.class_times[HOST] = visible_host_s;
        Ok(())
    }

    fn acceptance(&self) -> Option<Acceptance> {
        Some(self.mtp)
    }

    fn predicts_time(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantization_keeps_seven_significant_bits() {
        assert_eq!(quantize(0), 0);
        assert_eq!(quantize(127), 127);
        assert_eq!(quantize(128), 128);
        for v in [1000u64, 4097, 123_456_789, u32::MAX as u64] {
            let q = quantize(v);
            assert!(
                ((q as f64 - v as f64) / v as f64).abs() < 1.0 / 128.0,
                "{v} -> {q}"
            );
        }
    }
}
