//! The rebalance cycle, with vllm-ascend's semantics (counted in forward steps): collect expert
//! heat for `heat_interval` steps; the placement algorithm then runs asynchronously for
//! `algorithm_interval` steps (it works on the heat collected so far); then the new placement is
//! installed one MoE layer per step, each move costing the expert weights that change dies; then
//! collection starts over. IO-free: the caller passes each step's routed-token counts.

use super::{place, EpLayout, EplbError, Placement, Policy};
use serde::{Deserialize, Serialize};

/// Cycle lengths and the algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CycleConfig {
    pub heat_interval: u64,
    pub algorithm_interval: u64,
    pub policy: Policy,
}

#[derive(Clone, Debug)]
enum Phase {
    Collecting { left: u64 },
    Computing { left: u64, target: Placement },
    Moving { layer: usize, target: Placement },
}

/// What a step must also do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CycleEffect {
    None,
    /// Layer `layer` switched to its new placement; the die receiving the most new experts
    /// received `max_slots_per_die` of them.
    MovedLayer {
        layer: usize,
        max_slots_per_die: u32,
    },
}

/// A running rebalance cycle.
#[derive(Clone, Debug)]
pub struct Rebalancer {
    cfg: CycleConfig,
    layout: EpLayout,
    phase: Phase,
    heat: Vec<Vec<f64>>,
}

impl Rebalancer {
    pub fn new(cfg: CycleConfig, layout: EpLayout, layers: usize, experts: usize) -> Self {
        Rebalancer {
            cfg,
            layout,
            phase: Phase::Collecting {
                left: cfg.heat_interval.max(1),
            },
            heat: vec![vec![0.0; experts]; layers],
        }
    }

    /// Adds `weight` x `counts[layer][expert]` routed tokens to the heat (a real engine records
    /// each step's router counts with weight 1; the twin folds many steps of one expected load
    /// into one call).
    pub fn record(&mut self, counts: &[Vec<f64>], weight: f64) {
        for (h, c) in self.heat.iter_mut().zip(counts) {
            for (x, y) in h.iter_mut().zip(c) {
                *x += weight * y;
            }
        }
    }

    /// True if the next [`Rebalancer::step`] runs the algorithm on the heat collected so far.
    pub fn computes_next(&self) -> bool {
        matches!(self.phase, Phase::Collecting { left } if left <= 1)
    }

    /// Advances one forward step (its heat recorded beforehand); `current` is the placement in
    /// use and changes one layer at a time.
    pub fn step(&mut self, current: &mut Placement) -> Result<CycleEffect, EplbError> {
        let phase = std::mem::replace(&mut self.phase, Phase::Collecting { left: 0 });
        let (next, effect) = match phase {
            Phase::Collecting { left } if left > 1 => {
                (Phase::Collecting { left: left - 1 }, CycleEffect::None)
            }
            Phase::Collecting { .. } => {
                let target = place(self.cfg.policy, &self.heat, &self.layout)?;
                (
                    Phase::Computing {
                        left: self.cfg.algorithm_interval,
                        target,
                    },
                    CycleEffect::None,
                )
            }
            Phase::Computing { left, target } if left > 0 => (
                Phase::Computing {
                    left: left - 1,
                    target,
                },
                CycleEffect::None,
            ),
            Phase::Computing { target, .. } => self.move_layer(0, target, current),
            Phase::Moving { layer, target } => self.move_layer(layer, target, current),
        };
        self.phase = next;
        Ok(effect)
    }

    /// Installs `layer` of `target`; the next step moves the following layer, and after the last
    /// one collection starts over with fresh heat.
    fn move_layer(
        &mut self,
        layer: usize,
        target: Placement,
        current: &mut Placement,
    ) -> (Phase, CycleEffect) {
        let spd = current.slots_per_die as usize;
        let (old, new) = (
            &current.layers[layer].phy2log,
            &target.layers[layer].phy2log,
        );
        let max_slots_per_die = old
            .chunks(spd)
            .zip(new.chunks(spd))
            .map(|(a, b)| a.iter().zip(b).filter(|(x, y)| x != y).count() as u32)
            .max()
            .unwrap_or(0);
        current.layers[layer] = target.layers[layer].clone();
        current.policy = target.policy;
        let effect = if max_slots_per_die > 0 {
            CycleEffect::MovedLayer {
                layer,
                max_slots_per_die,
            }
        } else {
            CycleEffect::None
        };
        if layer + 1 < target.layers.len() {
            (
                Phase::Moving {
                    layer: layer + 1,
                    target,
                },
                effect,
            )
        } else {
            self.heat
                .iter_mut()
                .for_each(|h| h.iter_mut().for_each(|x| *x = 0.0));
            (
                Phase::Collecting {
                    left: self.cfg.heat_interval.max(1),
                },
                effect,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collect_compute_then_move_one_layer_per_step() {
        let layout = EpLayout {
            slots: 4,
            dies: 4,
            dies_per_node: 4,
            groups: 1,
        };
        // Two layers; the load says expert 3 is hot, the current placement is identity.
        let counts = vec![vec![1.0, 1.0, 1.0, 9.0]; 2];
        let mut current =
            place(Policy::Identity, &counts, &EpLayout { slots: 4, ..layout }).unwrap();
        let mut r = Rebalancer::new(
            CycleConfig {
                heat_interval: 3,
                algorithm_interval: 2,
                policy: Policy::Greedy,
            },
            layout,
            2,
            4,
        );
        let effects: Vec<CycleEffect> = (0..8)
            .map(|_| {
                r.record(&counts, 1.0);
                r.step(&mut current).unwrap()
            })
            .collect();
        // 3 steps collecting, 2 computing, then layers 0 and 1 move on steps 6 and 7.
        assert!(
            effects[..5].iter().all(|e| *e == CycleEffect::None),
            "{effects:?}"
        );
        // With one slot per die and no redundancy the greedy packing puts the hot expert first;
        // whether slots change depends on order, so only the move steps may report moves.
        assert!(effects[7..].iter().all(|e| *e == CycleEffect::None));
        let expected = place(Policy::Greedy, &vec![vec![3.0, 3.0, 3.0, 27.0]; 2], &layout).unwrap();
        assert_eq!(
            current,
            Placement {
                policy: Policy::Greedy,
                ..expected
            }
        );
    }

    #[test]
    fn moves_report_the_busiest_receiving_die() {
        // Identity holds [0, 1, 2, 0]; greedy packs [0, 0, 1, 2]: three dies receive a new expert.
        let layout = EpLayout {
            slots: 4,
            dies: 4,
            dies_per_node: 4,
            groups: 1,
        };
        let hot = vec![vec![30.0, 1.0, 1.0]];
        let mut current = place(Policy::Identity, &hot, &layout).unwrap();
        assert_eq!(current.layers[0].phy2log, vec![0, 1, 2, 0]);
        let mut r = Rebalancer::new(
            CycleConfig {
                heat_interval: 1,
                algorithm_interval: 0,
                policy: Policy::Greedy,
            },
            layout,
            1,
            3,
        );
        r.record(&hot, 1.0);
        assert!(r.computes_next());
        assert_eq!(r.step(&mut current).unwrap(), CycleEffect::None);
        match r.step(&mut current).unwrap() {
            CycleEffect::MovedLayer {
                layer: 0,
                max_slots_per_die,
            } => assert_eq!(max_slots_per_die, 1),
            e => panic!("expected a move, got {e:?}"),
        }
        assert_eq!(current.layers[0].phy2log, vec![0, 0, 1, 2]);
        // Collection starts over.
        assert_eq!(r.step(&mut current).unwrap(), CycleEffect::None);
    }
}
