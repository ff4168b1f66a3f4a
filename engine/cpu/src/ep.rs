//! Expert parallelism across the in-process DP ranks of an instance.
//!
//! An instance of N ranks spreads each MoE layer's routed-expert slots over its ranks as the
//! EPLB placement says (`dstwin_core::eplb::Placement`: slot `s` on rank `s / slots_per_rank`,
//! redundant replicas included), and each rank holds its own copy of the weights of its slots.
//! A MoE layer runs as an EP group's all-to-all runs it, every rank taking part whether or not
//! it has tokens of its own:
//! - **dispatch**: each rank's router chose top-k experts per token; for each choice the token's
//!   row goes to one replica of that expert. Source rank `r` sends expert `e` to replica
//!   `r mod n` of its `n` slots in slot order, as vllm-ascend's logical-to-physical map does
//!   (`vllm_ascend/eplb/core/eplb_utils.py`, `generate_log2phy_map`): deterministic, and the
//!   ranks spread over the replicas;
//! - **experts**: each rank runs each of its slots on the rows it received, all sources in rank
//!   order;
//! - **combine**: the outputs go back to their tokens' ranks, where they are weighted by the
//!   router and summed per token in expert-id order — the order one process sums them in, so
//!   the result does not depend on where the experts ran.
//!
//! With one rank nothing moves: the dispatch, the expert GEMMs and the weighted sum are one
//! `experts` op (the op graph has no dispatch on one die).
//!
//! [`ExpertRanks::install`] carries out an EPLB layer move: every slot whose expert changes
//! receives a copy of that expert's weights from a slot that held it (on its own rank if one
//! did, else the first such slot), so later steps compute with the new placement.

use crate::error::ModelError;
use crate::model::Model;
use crate::moe::{group_by_expert, Expert, Route};
use crate::profile::Profiler;
use candle_core::{DType, Device, Tensor};
use dstwin_core::eplb::{EpLayout, LayerPlacement, Placement};
use std::sync::Arc;

/// One MoE layer as the ranks hold it.
#[derive(Clone, Debug)]
struct EpLayer {
    /// Slot -> logical expert.
    phy2log: Vec<u32>,
    /// Per source rank, per logical expert: the slot its rows go to.
    pick: Vec<Vec<u32>>,
    /// Weights per slot.
    slots: Vec<Arc<Expert>>,
}

/// The routed experts of an instance, spread over its DP ranks.
#[derive(Clone, Debug)]
pub struct ExpertRanks {
    ranks: usize,
    slots_per_rank: usize,
    experts: usize,
    layers: Vec<EpLayer>,
}

/// What one rank brings to a MoE layer: its normalized hidden rows and their routes.
pub struct MoeInput<'a> {
    pub rank: usize,
    pub x: &'a Tensor,
    pub routes: &'a [Route],
}

/// What moved in one MoE layer of a step: rows each source rank's router sent to each expert,
/// and rows each slot computed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LayerDispatch {
    /// MoE layer index (decoder MoE layers, then MTP modules).
    pub layer: usize,
    /// The source ranks, in input order.
    pub ranks: Vec<usize>,
    /// Per source rank (as `ranks`), per logical expert: rows routed.
    pub routed: Vec<Vec<u32>>,
    /// Per slot: rows computed.
    pub computed: Vec<u32>,
}

/// What an EPLB layer move copied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    /// Slots that received another expert's weights.
    pub slots: usize,
    /// Bytes of weights copied.
    pub bytes: usize,
}

/// Each source rank's slot for each expert: replica `rank mod n` of the expert's `n` slots.
fn pick(phy2log: &[u32], experts: usize, ranks: usize) -> Vec<Vec<u32>> {
    let mut log2phy = vec![Vec::new(); experts];
    for (s, &e) in phy2log.iter().enumerate() {
        log2phy[e as usize].push(s as u32);
    }
    (0..ranks)
        .map(|r| {
            log2phy
                .iter()
                .map(|slots| slots.get(r % slots.len().max(1)).copied().unwrap_or(0))
                .collect()
        })
        .collect()
}

fn bad(message: String) -> ModelError {
    ModelError::Placement(message)
}

impl ExpertRanks {
    /// Every routed expert of `model` on one rank, the model's own weights: what a single
    /// process runs.
    pub fn local(model: &Model) -> Result<ExpertRanks, ModelError> {
        let experts = model.cfg.routed_experts;
        let layers = model
            .moe_layers()
            .into_iter()
            .enumerate()
            .map(|(l, moe)| {
                let slots = (0..experts)
                    .map(|e| {
                        moe.experts
                            .get(e)
                            .cloned()
                            .ok_or(ModelError::ExpertMissing {
                                layer: l,
                                expert: e,
                            })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let phy2log: Vec<u32> = (0..experts as u32).collect();
                Ok(EpLayer {
                    pick: pick(&phy2log, experts, 1),
                    phy2log,
                    slots,
                })
            })
            .collect::<Result<_, ModelError>>()?;
        Ok(ExpertRanks {
            ranks: 1,
            slots_per_rank: experts,
            experts,
            layers,
        })
    }

    /// `placement` over `ranks` ranks: each slot holds its expert's weights from `model` (the
    /// first replica the checkpoint's tensors, the others copies). The placement covers the model's decoder MoE layers, and optionally its MTP modules'
    /// after them.
    pub fn place(
        model: &Model,
        placement: &Placement,
        ranks: usize,
    ) -> Result<ExpertRanks, ModelError> {
        let moe = model.moe_layers();
        let decoder = model.cfg.layers - model.cfg.dense_layers;
        let experts = model.cfg.routed_experts;
        let n = placement.layers.len();
        if n < decoder || n > moe.len() {
            return Err(bad(format!(
                "{n} layers placed; the model has {decoder} MoE layers and {} MTP modules",
                moe.len() - decoder
            )));
        }
        let slots = placement.layers.first().map_or(0, |l| l.phy2log.len());
        if ranks == 0 || !slots.is_multiple_of(ranks) {
            return Err(bad(format!(
                "{slots} slots do not divide over {ranks} ranks"
            )));
        }
        let layout = EpLayout {
            slots: slots as u32,
            dies: ranks as u32,
            dies_per_node: ranks as u32,
            groups: 1,
        };
        placement
            .check(n, experts, &layout)
            .map_err(|e| bad(e.to_string()))?;
        let layers = placement
            .layers
            .iter()
            .zip(&moe)
            .enumerate()
            .map(|(l, (lp, m))| {
                let mut seen = vec![false; experts];
                let slots = lp
                    .phy2log
                    .iter()
                    .map(|&e| {
                        let w = m.experts.get(e as usize).ok_or(ModelError::ExpertMissing {
                            layer: l,
                            expert: e as usize,
                        })?;
                        // The first replica is loaded from the checkpoint (shared with the
                        // model, which keeps every expert); further replicas are copies.
                        if std::mem::replace(&mut seen[e as usize], true) {
                            Ok(Arc::new(w.deep_copy()?))
                        } else {
                            Ok(w.clone())
                        }
                    })
                    .collect::<Result<Vec<_>, ModelError>>()?;
                Ok(EpLayer {
                    pick: pick(&lp.phy2log, experts, ranks),
                    phy2log: lp.phy2log.clone(),
                    slots,
                })
            })
            .collect::<Result<_, ModelError>>()?;
        Ok(ExpertRanks {
            ranks,
            slots_per_rank: slots / ranks,
            experts,
            layers,
        })
    }

    pub fn ranks(&self) -> usize {
        self.ranks
    }

    pub fn slots_per_rank(&self) -> usize {
        self.slots_per_rank
    }

    /// MoE layers placed.
    pub fn layers(&self) -> usize {
        self.layers.len()
    }

    /// Slot -> logical expert of MoE layer `layer`.
    pub fn phy2log(&self, layer: usize) -> &[u32] {
        &self.layers[layer].phy2log
    }

    /// The slot source rank `rank` sends expert `expert` of layer `layer` to.
    pub fn slot_for(&self, layer: usize, rank: usize, expert: usize) -> usize {
        self.layers[layer].pick[rank][expert] as usize
    }

    /// The weights of one slot.
    pub fn slot(&self, layer: usize, slot: usize) -> &Expert {
        &self.layers[layer].slots[slot]
    }

    /// Replaces the weights of one slot (the weights a rank holds there, whatever its expert).
    pub fn set_slot(&mut self, layer: usize, slot: usize, weights: Expert) {
        self.layers[layer].slots[slot] = Arc::new(weights);
    }

    /// Installs `new` as the placement of MoE layer `layer`: each slot whose expert changes
    /// receives a copy of its new expert's weights from a slot holding it before the move.
    pub fn install(&mut self, layer: usize, new: &LayerPlacement) -> Result<Moved, ModelError> {
        let placed = self.layers.len();
        let old = self.layers.get(layer).ok_or_else(|| {
            bad(format!(
                "expert move for MoE layer {layer}; {placed} layers are placed"
            ))
        })?;
        let (spr, experts) = (self.slots_per_rank, self.experts);
        if new.phy2log.len() != old.phy2log.len() {
            return Err(bad(format!(
                "layer {layer}: the move has {} slots, the instance {}",
                new.phy2log.len(),
                old.phy2log.len()
            )));
        }
        let mut held = vec![false; experts];
        for &e in &new.phy2log {
            *held.get_mut(e as usize).ok_or_else(|| {
                bad(format!(
                    "layer {layer}: expert {e} of {experts} in the move"
                ))
            })? = true;
        }
        if let Some(e) = held.iter().position(|h| !h) {
            return Err(bad(format!(
                "layer {layer}: the move leaves expert {e} without a slot"
            )));
        }
        let mut slots = old.slots.clone();
        let mut moved = Moved::default();
        for (s, &e) in new.phy2log.iter().enumerate() {
            if old.phy2log[s] == e {
                continue;
            }
            let own = (s / spr) * spr..(s / spr + 1) * spr;
            let src = own
                .clone()
                .find(|&t| old.phy2log[t] == e)
                .or_else(|| old.phy2log.iter().position(|&x| x == e))
                .expect("every expert had a slot before the move");
            let w = old.slots[src].deep_copy()?;
            moved.bytes += w.bytes();
            moved.slots += 1;
            slots[s] = Arc::new(w);
        }
        self.layers[layer] = EpLayer {
            pick: pick(&new.phy2log, experts, self.ranks),
            phy2log: new.phy2log.clone(),
            slots,
        };
        Ok(moved)
    }

    /// MoE layer `layer` of a step across the ranks: dispatch, experts, combine. Returns each
    /// input's routed output (`[rows, hidden]`, unweighted shared experts not included) and what
    /// moved.
    pub fn forward(
        &self,
        layer: usize,
        inputs: &[MoeInput],
        prof: &mut Profiler,
    ) -> Result<(Vec<Tensor>, LayerDispatch), ModelError> {
        let l = self.layers.get(layer).ok_or_else(|| {
            bad(format!(
                "MoE layer {layer} runs, but {} layers are placed (is MTP on with a placement without its layer?)",
                self.layers.len()
            ))
        })?;
        for i in inputs {
            if i.rank >= self.ranks {
                return Err(bad(format!("rank {} of {}", i.rank, self.ranks)));
            }
        }
        let (e_n, spr) = (self.experts, self.slots_per_rank);
        let ep = self.ranks > 1;
        let groups: Vec<Vec<(Vec<u32>, Vec<f32>)>> = inputs
            .iter()
            .map(|i| group_by_expert(i.routes, e_n))
            .collect();
        let mut stats = LayerDispatch {
            layer,
            ranks: inputs.iter().map(|i| i.rank).collect(),
            routed: groups
                .iter()
                .map(|g| g.iter().map(|(rows, _)| rows.len() as u32).collect())
                .collect(),
            computed: vec![0; l.phy2log.len()],
        };
        let whole = if ep { None } else { prof.begin() };
        // Dispatch: each source rank's rows in f32, sent by reference per chosen expert.
        let mut xs: Vec<Vec<f32>> = Vec::with_capacity(inputs.len());
        for (inp, g) in inputs.iter().zip(&groups) {
            prof.rank(inp.rank);
            let s = if ep { prof.begin() } else { None };
            xs.push(inp.x.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?);
            prof.end(s, "dispatch", || {
                let mut to_rank = vec![0u32; self.ranks];
                for (e, (rows, _)) in g.iter().enumerate() {
                    to_rank[l.pick[inp.rank][e] as usize / spr] += rows.len() as u32;
                }
                crate::args! {"tokens": inp.routes.len(), "rows": to_rank.iter().sum::<u32>()}
                    .list("rows_to_rank", &to_rank)
            });
        }
        let hidden = inputs.first().map_or(Ok(0), |i| i.x.dims2().map(|d| d.1))?;
        let (dtype, device) = inputs.first().map_or((DType::F32, Device::Cpu), |i| {
            (i.x.dtype(), i.x.device().clone())
        });
        // Experts: each rank runs each of its slots on the rows it received, sources in input
        // order. `ys[slot]`: its output rows; `at[i][e]`: where input i's rows of expert e begin.
        let mut ys: Vec<Vec<f32>> = vec![Vec::new(); l.phy2log.len()];
        let mut at: Vec<Vec<usize>> = vec![vec![0; e_n]; inputs.len()];
        for rank in 0..self.ranks {
            prof.rank(rank);
            let s = if ep { prof.begin() } else { None };
            let slots = rank * spr..(rank + 1) * spr;
            for (slot, y) in slots.clone().zip(&mut ys[slots]) {
                let e = l.phy2log[slot] as usize;
                let mut rows: Vec<&[f32]> = Vec::new();
                for (i, inp) in inputs.iter().enumerate() {
                    if l.pick[inp.rank][e] as usize != slot {
                        continue;
                    }
                    at[i][e] = rows.len();
                    rows.extend(
                        groups[i][e]
                            .0
                            .iter()
                            .map(|&t| &xs[i][t as usize * hidden..][..hidden]),
                    );
                }
                if rows.is_empty() {
                    continue;
                }
                *y = l.slots[slot].forward_rows(&rows, dtype, &device)?;
                stats.computed[slot] += rows.len() as u32;
            }
            prof.end(s, "experts", || {
                let rows = &stats.computed[rank * spr..(rank + 1) * spr];
                crate::args! {"tokens": rows.iter().sum::<u32>(), "experts": spr,
                "active_experts": rows.iter().filter(|&&r| r > 0).count()}
                .list("rows_per_expert", rows)
            });
        }
        // Combine: weighted outputs back to their tokens, summed in expert-id order.
        let mut result = Vec::with_capacity(inputs.len());
        for (i, (inp, g)) in inputs.iter().zip(&groups).enumerate() {
            prof.rank(inp.rank);
            let s = if ep { prof.begin() } else { None };
            let mut o = vec![0f32; inp.routes.len() * hidden];
            for (e, (rows, weights)) in g.iter().enumerate() {
                let y = &ys[l.pick[inp.rank][e] as usize];
                for (j, (&t, &w)) in rows.iter().zip(weights).enumerate() {
                    combine(
                        &mut o[t as usize * hidden..][..hidden],
                        &y[(at[i][e] + j) * hidden..][..hidden],
                        w,
                        dtype,
                    );
                }
            }
            result.push(Tensor::from_vec(o, (inp.routes.len(), hidden), &device)?.to_dtype(dtype)?);
            prof.end(
                s,
                "combine",
                || crate::args! {"tokens": inp.routes.len(), "rows": g.iter().map(|r| r.0.len()).sum::<usize>()},
            );
        }
        if !ep {
            prof.end(whole, "experts", || {
                crate::args! {"tokens": stats.computed.iter().sum::<u32>(), "experts": spr,
                "active_experts": stats.computed.iter().filter(|&&r| r > 0).count()}
                .list("rows_per_expert", &stats.computed)
            });
        }
        Ok((result, stats))
    }
}

/// `o += round(y * w)`, rounded to `dtype` after the product and after the sum: an f32 model
/// sums in f32, a bf16 or f16 one rounds as its tensors' arithmetic does (HF's combine too).
fn combine(o: &mut [f32], y: &[f32], w: f32, dtype: DType) {
    fn go(o: &mut [f32], y: &[f32], w: f32, round: impl Fn(f32) -> f32) {
        for (o, &y) in o.iter_mut().zip(y) {
            *o = round(*o + round(y * w));
        }
    }
    match dtype {
        DType::BF16 => go(o, y, w, |v| half::bf16::from_f32(v).to_f32()),
        DType::F16 => go(o, y, w, |v| half::f16::from_f32(v).to_f32()),
        _ => go(o, y, w, |v| v),
    }
}

#[cfg(test)]
mod tests {
    use super::pick;

    #[test]
    fn ranks_spread_over_replicas_in_slot_order() {
        // Expert 0 has replicas in slots 0 and 3; experts 1 and 2 one each.
        let p = pick(&[0, 1, 2, 0], 3, 4);
        assert_eq!(p[0], vec![0, 1, 2]);
        assert_eq!(p[1], vec![3, 1, 2]);
        assert_eq!(p[2], vec![0, 1, 2]);
        assert_eq!(p[3], vec![3, 1, 2]);
    }
}
