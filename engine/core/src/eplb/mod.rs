//! Expert-parallel load balancing (EPLB): placing logical experts, with redundant replicas, on the
//! physical expert slots of an EP group so that the hottest die carries as little as possible.
//! IO-free, deterministic (ties break by index), shared by the twin and the engine.
//!
//! - [`cycle`]: the periodic rebalance cycle (collect heat, compute, move one layer per step).
//! - [`heatmap`]: the expert heat-map file format (tokens per layer per expert per window).
//! - [`place`]: the entry point, from a load matrix (layers x logical experts) and a layout.
//! - Policies: `identity` (slot i holds expert i mod E), `global` (DeepSeek's global mode:
//!   replicate the hottest experts over all slots, then balanced packing over all dies),
//!   `hierarchical` (DeepSeek's mode for groups-to-nodes: pack expert groups onto nodes, replicate
//!   within each node, pack onto the node's dies), `greedy` (vllm-ascend's default policy flavour:
//!   replicate the hottest, pack heaviest first into the least-loaded die that does not already
//!   hold that expert).
//!
//! A computed layer placement whose hottest die is hotter than the identity placement's on the
//! same load is replaced by the identity placement: a rebalance never makes a layer worse.

pub mod cycle;
pub mod heatmap;
mod pack;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Placement algorithms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    Identity,
    Global,
    Hierarchical,
    Greedy,
}

impl Policy {
    /// The placement an engine uses when none is asked for: greedy EPLB where the instance runs
    /// EPLB (`runs_eplb`: redundant experts or dynamic re-placement), else the contiguous map
    /// vLLM, vllm-ascend and SGLang use without EPLB.
    pub fn engine_default(runs_eplb: bool) -> Policy {
        if runs_eplb {
            Policy::Greedy
        } else {
            Policy::Identity
        }
    }

    /// The name scenario files and `--policy` use.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Identity => "identity",
            Policy::Global => "global",
            Policy::Hierarchical => "hierarchical",
            Policy::Greedy => "greedy",
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "identity" => Ok(Policy::Identity),
            "global" => Ok(Policy::Global),
            "hierarchical" => Ok(Policy::Hierarchical),
            "greedy" => Ok(Policy::Greedy),
            _ => Err(format!(
                "unknown EPLB policy '{s}'; known: identity, global, hierarchical, greedy"
            )),
        }
    }
}

/// Where routed experts can go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpLayout {
    /// Physical routed-expert slots (logical experts + redundant ones).
    pub slots: u32,
    /// Dies holding routed experts.
    pub dies: u32,
    /// Dies per node (hierarchical mode packs groups onto nodes).
    pub dies_per_node: u32,
    /// Expert groups of the router (DeepSeek-V3: 8); hierarchical mode needs it.
    pub groups: u32,
}

/// The most physical slots per logical expert a placement may have. Deployments add a few
/// redundant replicas (DeepSeek: 32 for 256 experts; CloudMatrix384: one per die), and every
/// slot of every layer is an entry of the placement, so an absurd count is refused up front.
pub const MAX_SLOTS_PER_EXPERT: usize = 16;

/// Why a placement cannot be computed; each names the numbers.
#[derive(Debug, Error, PartialEq)]
pub enum EplbError {
    #[error("load matrix is empty")]
    Empty,
    #[error("load matrix row {layer} has {got} experts, row 0 has {expected}")]
    Ragged {
        layer: usize,
        got: usize,
        expected: usize,
    },
    #[error("load[{layer}][{expert}] = {value}: loads must be finite and at least 0")]
    BadLoad {
        layer: usize,
        expert: usize,
        value: f64,
    },
    #[error("slots = {slots}: fewer than the {experts} logical experts")]
    TooFewSlots { slots: u32, experts: usize },
    #[error("slots = {slots}: at most {max} for {experts} logical experts ({MAX_SLOTS_PER_EXPERT} slots per expert on average; a deployment adds a few redundant replicas, not copies of the whole model)")]
    TooManySlots {
        slots: u32,
        experts: usize,
        max: usize,
    },
    #[error("slots = {slots} do not divide evenly over dies = {dies}")]
    SlotsPerDie { slots: u32, dies: u32 },
    #[error("hierarchical: {reason} (dies {dies}, dies_per_node {dies_per_node}, groups {groups}, experts {experts}); use the global or greedy policy")]
    Hierarchy {
        reason: &'static str,
        dies: u32,
        dies_per_node: u32,
        groups: u32,
        experts: usize,
    },
}

/// One layer's placement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerPlacement {
    /// Physical slot -> logical expert; slot s sits on die s / slots_per_die.
    pub phy2log: Vec<u32>,
    /// Replicas per logical expert.
    pub replicas: Vec<u32>,
}

impl LayerPlacement {
    /// Logical expert -> its physical slots.
    pub fn log2phy(&self) -> Vec<Vec<u32>> {
        let mut m = vec![Vec::new(); self.replicas.len()];
        for (slot, &e) in self.phy2log.iter().enumerate() {
            m[e as usize].push(slot as u32);
        }
        m
    }

    /// Expected tokens per die when each expert's load splits evenly over its replicas.
    pub fn die_loads(&self, load: &[f64], slots_per_die: u32) -> Vec<f64> {
        let mut d = vec![0.0; self.phy2log.len() / slots_per_die as usize];
        for (slot, &e) in self.phy2log.iter().enumerate() {
            d[slot / slots_per_die as usize] += load[e as usize] / self.replicas[e as usize] as f64;
        }
        d
    }
}

/// A placement of every layer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    pub policy: Policy,
    pub slots_per_die: u32,
    pub layers: Vec<LayerPlacement>,
}

/// mean / max of die loads: 1.0 is perfect balance (1.0 for an all-zero load).
pub fn balancedness(die_loads: &[f64]) -> f64 {
    let max = die_loads.iter().copied().fold(0.0, f64::max);
    if max <= 0.0 {
        return 1.0;
    }
    die_loads.iter().sum::<f64>() / die_loads.len() as f64 / max
}

/// Why a placement read from a file does not fit an instance.
#[derive(Debug, Error, PartialEq)]
pub enum PlacementMismatch {
    #[error("placement has {got} layers, the instance has {expected} MoE layers")]
    Layers { got: usize, expected: usize },
    #[error("placement layer {layer} has {got} slots, the instance has {expected}")]
    Slots {
        layer: usize,
        got: usize,
        expected: u32,
    },
    #[error("placement slots_per_die = {got}, the instance has {expected}")]
    SlotsPerDie { got: u32, expected: u32 },
    #[error("placement layer {layer}: {reason}")]
    Layer { layer: usize, reason: String },
}

impl Placement {
    /// Checks that this placement fits `layers` MoE layers of `experts` experts on `layout`, and
    /// that its replica counts agree with its slots.
    pub fn check(
        &self,
        layers: usize,
        experts: usize,
        layout: &EpLayout,
    ) -> Result<(), PlacementMismatch> {
        if self.layers.len() != layers {
            return Err(PlacementMismatch::Layers {
                got: self.layers.len(),
                expected: layers,
            });
        }
        let spd = layout.slots / layout.dies.max(1);
        if self.slots_per_die != spd {
            return Err(PlacementMismatch::SlotsPerDie {
                got: self.slots_per_die,
                expected: spd,
            });
        }
        for (l, lp) in self.layers.iter().enumerate() {
            if lp.phy2log.len() != layout.slots as usize {
                return Err(PlacementMismatch::Slots {
                    layer: l,
                    got: lp.phy2log.len(),
                    expected: layout.slots,
                });
            }
            if lp.replicas.len() != experts {
                return Err(PlacementMismatch::Layer {
                    layer: l,
                    reason: format!("{} replica counts for {experts} experts", lp.replicas.len()),
                });
            }
            let mut count = vec![0u32; experts];
            for &e in &lp.phy2log {
                let c = count
                    .get_mut(e as usize)
                    .ok_or_else(|| PlacementMismatch::Layer {
                        layer: l,
                        reason: format!("expert {e} out of range"),
                    })?;
                *c += 1;
            }
            if count != lp.replicas {
                return Err(PlacementMismatch::Layer {
                    layer: l,
                    reason: "replica counts disagree with phy2log".into(),
                });
            }
            if let Some(e) = count.iter().position(|&c| c == 0) {
                return Err(PlacementMismatch::Layer {
                    layer: l,
                    reason: format!("expert {e} has no slot"),
                });
            }
        }
        Ok(())
    }

    /// Balancedness of each layer under `load`.
    pub fn balancedness(&self, load: &[Vec<f64>]) -> Vec<f64> {
        self.layers
            .iter()
            .zip(load)
            .map(|(p, l)| balancedness(&p.die_loads(l, self.slots_per_die)))
            .collect()
    }
}

fn validate(load: &[Vec<f64>], layout: &EpLayout) -> Result<usize, EplbError> {
    let experts = load.first().ok_or(EplbError::Empty)?.len();
    if experts == 0 {
        return Err(EplbError::Empty);
    }
    for (l, row) in load.iter().enumerate() {
        if row.len() != experts {
            return Err(EplbError::Ragged {
                layer: l,
                got: row.len(),
                expected: experts,
            });
        }
        if let Some((e, &v)) = row
            .iter()
            .enumerate()
            .find(|(_, v)| !(v.is_finite() && **v >= 0.0))
        {
            return Err(EplbError::BadLoad {
                layer: l,
                expert: e,
                value: v,
            });
        }
    }
    if (layout.slots as usize) < experts {
        return Err(EplbError::TooFewSlots {
            slots: layout.slots,
            experts,
        });
    }
    let max = experts.saturating_mul(MAX_SLOTS_PER_EXPERT);
    if layout.slots as usize > max {
        return Err(EplbError::TooManySlots {
            slots: layout.slots,
            experts,
            max,
        });
    }
    if layout.dies == 0 || !layout.slots.is_multiple_of(layout.dies) {
        return Err(EplbError::SlotsPerDie {
            slots: layout.slots,
            dies: layout.dies,
        });
    }
    Ok(experts)
}

fn hierarchy_check(layout: &EpLayout, experts: usize) -> Result<(), EplbError> {
    let err = |reason| EplbError::Hierarchy {
        reason,
        dies: layout.dies,
        dies_per_node: layout.dies_per_node,
        groups: layout.groups,
        experts,
    };
    if layout.dies_per_node == 0 || !layout.dies.is_multiple_of(layout.dies_per_node) {
        return Err(err("dies must be a whole number of nodes"));
    }
    let nodes = layout.dies / layout.dies_per_node;
    if layout.groups == 0 || !experts.is_multiple_of(layout.groups as usize) {
        return Err(err("groups must divide the experts"));
    }
    if !layout.groups.is_multiple_of(nodes) {
        return Err(err("groups must divide evenly over the nodes"));
    }
    Ok(())
}

/// Places every layer of `load` (layers x logical experts, token counts) on `layout`.
pub fn place(policy: Policy, load: &[Vec<f64>], layout: &EpLayout) -> Result<Placement, EplbError> {
    let experts = validate(load, layout)?;
    if policy == Policy::Hierarchical {
        hierarchy_check(layout, experts)?;
    }
    let spd = layout.slots / layout.dies;
    let layers = load
        .iter()
        .map(|l| {
            let ident = pack::identity(experts, layout.slots);
            let p = match policy {
                Policy::Identity => return ident,
                Policy::Global => pack::global(l, layout.slots, layout.dies, false),
                Policy::Greedy => pack::global(l, layout.slots, layout.dies, true),
                Policy::Hierarchical => pack::hierarchical(l, layout),
            };
            let worst = |p: &LayerPlacement| p.die_loads(l, spd).into_iter().fold(0.0, f64::max);
            if worst(&p) > worst(&ident) {
                ident
            } else {
                p
            }
        })
        .collect();
    Ok(Placement {
        policy,
        slots_per_die: spd,
        layers,
    })
}
