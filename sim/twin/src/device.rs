//! `SimDevice`: the twin's device. Prices each DP rank's step with the op graph and the cost model
//! (through the price cache, [`crate::pricer`]), takes the slowest rank as the lockstep step time,
//! and draws MTP acceptance per sequence.

use crate::expert_load::{fluctuation, imbalance, ExpertLoad, RoutingSums};
use crate::mtp::Acceptance;
pub use crate::pricer::{PricerSpec, PricerStep, RankCost, StepLoad, StepPricer};
pub use crate::spread::StepSpread;
use dstwin_core::batch::BatchShape;
use dstwin_core::device::{
    Capacity, Device, DeviceError, ExpertHeat, ExpertMove, PlanTotals, StepOutcome, StepPlan,
    TransferOutcome, CLASS_SLOTS, DUMMY_TOKENS, HOST,
};
use dstwin_core::eplb::Placement;
use dstwin_core::mtp::KnownAcceptance;
use dstwin_core::time::{SimDuration, SimTime};
use std::sync::Arc;

/// The longest step the twin prices: a step over a day is no serving deployment's, and only
/// figures far outside the hardware's (a peak or efficiency near 0) lead there.
pub const MAX_STEP_S: f64 = 86_400.0;

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
    placed_imbalance: f64,
    step_imbalance: f64,
    host: HostOverhead,
    /// When the next step starts (the driver says, [`Device::starts_at`]) and when the last one
    /// ended: how long the device idled before a step.
    next_start: SimTime,
    last_end: Option<SimTime>,
    /// Each step's kernel time drawn around its price (`None`: every step at its price).
    spread: Option<StepSpread>,
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
    /// Per token the rank computes.
    pub per_token_s: f64,
    pub overlapped: bool,
    /// Host time to launch one step's kernels one by one, seconds (the cost file's `[host]
    /// eager_layer_us` for each layer the step runs): the floor of a step that runs eagerly.
    pub eager_s: f64,
    /// A step that starts more than this long after the previous one ended (seconds) runs its
    /// kernels this many times their warm time (the cost file's `[host] cold_after_us,
    /// cold_factor`). `None`: every step is warm.
    pub cold: Option<(f64, f64)>,
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
    /// Experts each token is routed to.
    pub top_k: u32,
}

impl Experts {
    pub fn new(
        load: ExpertLoad,
        placement: Placement,
        reports_heat: bool,
        move_s_per_slot: f64,
        concentration: f64,
        top_k: u32,
    ) -> Self {
        Experts {
            load,
            placement,
            reports_heat,
            move_s_per_slot,
            concentration,
            top_k,
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
            placed_imbalance: imbalance,
            step_imbalance: imbalance,
            host: HostOverhead::default(),
            next_start: SimTime::ZERO,
            last_end: None,
            spread: None,
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

    /// Hottest routed die over the mean under the mean load, averaged over MoE layers, for the
    /// placement the device started with (1.0: perfect balance).
    pub fn placed_imbalance(&self) -> f64 {
        self.placed_imbalance
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

    /// Draws each step's kernel time around its price ([`StepSpread`]; `None`: at its price).
    pub fn with_spread(mut self, spread: Option<StepSpread>) -> Self {
        self.spread = spread;
        self
    }

    /// Draws the steps' factors again as draw `draw` ([`StepSpread::redraw`]); nothing without a
    /// spread.
    pub fn redraw(&mut self, draw: u64) {
        if let Some(s) = &mut self.spread {
            s.redraw(draw);
        }
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
        let bad_ranks = || DeviceError::Ranks {
            got: plan.dp_ranks as usize,
            expected: self.capacity.dp_ranks,
        };
        if plan.dp_ranks != self.capacity.dp_ranks {
            return Err(bad_ranks());
        }
        // Idle ranks run a one-token dummy batch: priced once, whatever their number. Every
        // token of every rank enters the MoE layers once (TP dies split a rank's tokens); the
        // dummy batch is `DUMMY_TOKENS` long.
        //
        // The EP group decides its MoE communication on the largest rank's tokens, and a
        // decode-only step under graph capture pads every rank to that rank's capture size.
        // One-token prompt chunks (a PD hand-off's recompute) run as decodes, as in vLLM.
        //
        // One pass over the ranks gathers all of that (and the slowest rank's host work): the
        // plan of a large instance does not stay in the processor's first-level cache from one
        // pass to the next.
        let query_len = 1 + self.pricer.spec().mtp_tokens as u64;
        let fluctuates = self.experts.as_ref().is_some_and(|e| e.concentration > 0.0);
        let h = self.host;
        let host_work = h.step_s > 0.0 || h.per_seq_s > 0.0 || h.per_token_s > 0.0;
        let mut totals = PlanTotals::default();
        let mut routing = RoutingSums::default();
        let (mut max_tokens, mut with_prompts, mut host_max) = (0, false, f64::NEG_INFINITY);
        for r in &plan.ranks {
            if r.rank >= plan.dp_ranks {
                return Err(bad_ranks());
            }
            totals.add(&r.shape);
            if fluctuates {
                routing.add(&r.shape);
            }
            if host_work {
                host_max = host_max.max(
                    h.step_s
                        + h.per_seq_s * r.shape.seqs() as f64
                        + h.per_token_s * r.shape.tokens() as f64,
                );
            }
            // Short prompt chunks run as decodes: the same tokens, and no prompt.
            max_tokens = max_tokens.max(r.shape.tokens());
            with_prompts |= r.shape.prefill_tokens > 0 && !r.shape.short_chunks(query_len);
        }
        let totals = totals.finish(plan.idle_ranks());
        let (group, idle) = (totals.routed_tokens, totals.dummy_ranks);
        // The batch's own routing strays from the mean the placement was made for.
        let step_imbalance = match &self.experts {
            Some(e) if fluctuates => {
                self.imbalance + fluctuation(e.dies(), routing.routing(), e.top_k, e.concentration)
            }
            _ => self.imbalance,
        };
        self.step_imbalance = step_imbalance;
        let spec = self.pricer.spec();
        let max_tokens = max_tokens.max(if idle > 0 { self.dummy.tokens() } else { 0 });
        let comm = spec.features.moe_comm(
            max_tokens,
            with_prompts,
            spec.plan.slots_per_die as u64,
            spec.plan.ep,
        );
        let pad = if with_prompts {
            None
        } else {
            spec.features.padded_tokens(max_tokens)
        };
        let mtp_tokens = spec.mtp_tokens;
        let spec_eager = h.eager_s > 0.0 && spec.features.launches_eagerly(pad);
        let padded = move |s: &BatchShape| pad.map_or(*s, |p| s.padded_to(p, mtp_tokens));
        let load = StepLoad::new(group, step_imbalance, comm);
        let mut prices = self.pricer.step();
        if idle > 0 {
            prices.add(None, &padded(&self.dummy), load);
        }
        // One pass over the ranks: their prices and their sequences' acceptances.
        // The last rank added: consecutive ranks with equal shapes (as the engine's attention
        // sees them) cost the same.
        let mut last: Option<&BatchShape> = None;
        let same = |a: &BatchShape, b: &BatchShape| {
            if a.prefill_seqs == 0 && b.prefill_seqs == 0 {
                // Decode ranks' contexts differ most often: compared first.
                a.decode_pairs == b.decode_pairs && a == b
            } else {
                a.short_chunks_as_decode(query_len) == b.short_chunks_as_decode(query_len)
            }
        };
        out.accepted.resize_with(plan.ranks.len(), Vec::new);
        for (r, acc) in plan.ranks.iter().zip(out.accepted.iter_mut()) {
            acc.clear();
            if !r.decode.is_empty() {
                acc.extend(
                    r.decode
                        .iter()
                        .map(|d| self.mtp.accepted(d.req, d.step, d.drafts)),
                );
            }
            if r.shape.is_empty() || last.is_some_and(|l| same(l, &r.shape)) {
                continue;
            }
            last = Some(&r.shape);
            let rank = Some(r.rank as usize);
            match (r.shape.prefill_seqs, pad) {
                // A decode-only rank, no graph padding: the shape as planned.
                (0, None) => prices.add(rank, &r.shape, load),
                _ => prices.add(
                    rank,
                    &padded(&r.shape.short_chunks_as_decode(query_len)),
                    load,
                ),
            }
        }
        let slowest = prices.slowest();
        let slowest_classes = slowest.map(|c| prices.class_times(c));
        drop(prices);
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
        // A step after idling runs its kernels cold (a device's first step has nothing to idle
        // after, as in the calibration that fitted the factor).
        let cold = match (self.host.cold, self.last_end) {
            (Some((after_s, factor)), Some(end))
                if self.next_start > end && (self.next_start - end).as_secs_f64() > after_s =>
            {
                factor
            }
            _ => 1.0,
        };
        // The step's kernels land around their price as a real device's do.
        let kernels = cold * self.spread.as_mut().map_or(1.0, |s| s.draw());
        // Expert weights moving in this step are not overlapped with it.
        let kernels_s = slowest.map_or(0.0, |c| c.time_s) * kernels + extra_s;
        // An eager step's kernels run behind their launches: the longer of the two.
        let launch_gap_s = if spec_eager {
            (h.eager_s - kernels_s).max(0.0)
        } else {
            0.0
        };
        let device_s = kernels_s + launch_gap_s;
        // The slowest rank's host work: added to the step, or hidden behind it (async).
        let host_s = if host_work {
            host_max.max(if idle > 0 { h.step_s } else { 0.0 })
        } else {
            0.0
        };
        let visible_host_s = if h.overlapped {
            (host_s - device_s).max(0.0)
        } else {
            host_s
        };
        let step_s = device_s + visible_host_s;
        if !(step_s.is_finite() && step_s <= MAX_STEP_S) {
            return Err(DeviceError::Failed(format!(
                "a step priced at {step_s} s, over a day: the hardware or cost figures are far \
                 outside any serving deployment (peaks, bandwidths or efficiencies near 0?)"
            )));
        }
        out.duration = SimDuration::from_secs_f64(step_s);
        self.last_end = Some(self.next_start + out.duration);
        out.class_times = slowest_classes.unwrap_or([0.0; CLASS_SLOTS]);
        if kernels != 1.0 {
            for t in out.class_times.iter_mut() {
                *t *= kernels;
            }
        }
        out.class_times[HOST] = visible_host_s + launch_gap_s;
        Ok(())
    }

    fn starts_at(&mut self, now: SimTime) {
        self.next_start = now;
    }

    fn acceptance(&self) -> Option<Arc<dyn KnownAcceptance>> {
        Some(Arc::new(self.mtp))
    }

    fn predicts_time(&self) -> bool {
        true
    }
}
