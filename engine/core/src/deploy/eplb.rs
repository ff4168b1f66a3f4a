//! An instance's EPLB rebalance cycle as the deployment core runs it: the devices' heat comes
//! in with step outcomes, the cycle advances when a step is planned, and a layer move rides on
//! that step's plan.

use crate::device::{ExpertHeat, ExpertMove};
use crate::eplb::cycle::{CycleEffect, Rebalancer};
use crate::eplb::Placement;
use std::sync::Arc;

/// An instance's expert placement and its rebalance cycle.
#[derive(Clone, Debug)]
pub struct EplbSpec {
    pub rebalancer: Rebalancer,
    /// The placement the device starts with.
    pub placement: Placement,
    /// Routed experts per token (top-k): heat from expected shares is tokens x top-k x share.
    pub top_k: f64,
    /// The expected shares in effect at the start, when the device reports shares.
    pub shares: Option<Arc<Vec<Vec<f64>>>>,
}

/// A running rebalance cycle.
#[derive(Clone, Debug)]
pub(super) struct EplbRun {
    pub(super) spec: EplbSpec,
    /// Routed tokens since the heat was last recorded under the current shares (the shares are
    /// folded in only when they change or the algorithm runs).
    pub(super) pending: f64,
}

impl EplbRun {
    /// Before a step that routes `tokens`: count its heat, advance the cycle; a layer move
    /// comes back for the step's plan.
    pub(super) fn before_step(&mut self, tokens: u64) -> Option<ExpertMove> {
        let s = &mut self.spec;
        if s.shares.is_some() {
            self.pending += tokens as f64 * s.top_k;
        }
        if s.rebalancer.computes_next() {
            if let Some(sh) = &s.shares {
                s.rebalancer.record(sh, self.pending);
            }
            self.pending = 0.0;
        }
        let effect = s
            .rebalancer
            .step(&mut s.placement)
            .expect("the layout placed its first placement, so it places every later one");
        match effect {
            CycleEffect::MovedLayer {
                layer,
                max_slots_per_die,
            } => Some(ExpertMove {
                layer,
                placement: s.placement.layers[layer].clone(),
                max_slots_per_die,
            }),
            CycleEffect::None => None,
        }
    }

    /// After a step: the routers' heat.
    pub(super) fn after_step(&mut self, heat: &ExpertHeat) {
        let s = &mut self.spec;
        match heat {
            ExpertHeat::Counts(c) => s.rebalancer.record(c, 1.0),
            ExpertHeat::Shares(new) => {
                if s.shares.as_ref().is_some_and(|old| Arc::ptr_eq(old, new)) {
                    return;
                }
                // Fold the heat of the old shares before they change.
                if let Some(old) = &s.shares {
                    s.rebalancer.record(old, self.pending);
                }
                self.pending = 0.0;
                s.shares = Some(new.clone());
            }
        }
    }
}
