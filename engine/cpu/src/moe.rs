//! DeepSeekMoE: sigmoid router with `noaux_tc` group-limited top-k, routed experts addressed
//! by id through an [`ExpertTable`], shared experts.
//!
//! A layer runs in explicit stages so that expert parallelism cuts between them
//! ([`crate::ep`]): [`Router::route`] (per token: experts and weights), [`group_by_expert`]
//! (per expert: its tokens and weights — what a dispatch sends), the experts, and the combine
//! (each expert's output weighted and summed back per token, in expert-id order).

use crate::linear::Linear;
use crate::profile::Profiler;
use candle_core::{DType, Result, Tensor};
use serde_json::json;
use std::sync::Arc;

/// SwiGLU FFN: `down(silu(gate(x)) * up(x))` (dense layers, routed and shared experts).
#[derive(Clone, Debug)]
pub struct Mlp {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

impl Mlp {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_profiled(x, &mut Profiler::off())
    }

    /// [`Mlp::forward`] with its three ops timed as the op graph names a dense FFN's:
    /// `ffn_gate_up`, `ffn_act`, `ffn_down`.
    pub fn forward_profiled(&self, x: &Tensor, prof: &mut Profiler) -> Result<Tensor> {
        let (tokens, hidden) = x.dims2()?;
        let ffn = self.gate.out_dim();
        let s = prof.begin();
        let g = self.gate.forward(x)?;
        let u = self.up.forward(x)?;
        prof.end(
            s,
            "ffn_gate_up",
            || json!({"tokens": tokens, "k": hidden, "n": 2 * ffn}),
        );
        let s = prof.begin();
        let a = (g.silu()? * u)?;
        prof.end(s, "ffn_act", || json!({"tokens": tokens, "n": ffn}));
        let s = prof.begin();
        let y = self.down.forward(&a)?;
        prof.end(
            s,
            "ffn_down",
            || json!({"tokens": tokens, "k": ffn, "n": hidden}),
        );
        Ok(y)
    }

    pub fn to_w8a8(&self) -> Result<Mlp> {
        Ok(Mlp {
            gate: self.gate.to_w8a8()?,
            up: self.up.to_w8a8()?,
            down: self.down.to_w8a8()?,
        })
    }

    /// A copy in storage of its own (what a rank receiving this expert holds).
    pub fn deep_copy(&self) -> Result<Mlp> {
        Ok(Mlp {
            gate: self.gate.deep_copy()?,
            up: self.up.deep_copy()?,
            down: self.down.deep_copy()?,
        })
    }

    /// Bytes of its weights (scales included).
    pub fn bytes(&self) -> usize {
        self.gate.bytes() + self.up.bytes() + self.down.bytes()
    }

    /// Its weights as f32 values, gate then up then down (tests compare replicas).
    pub fn weights_f32(&self) -> Result<Vec<f32>> {
        let mut v = Vec::new();
        for l in [&self.gate, &self.up, &self.down] {
            v.extend(l.weight_f32()?.flatten_all()?.to_vec1::<f32>()?);
        }
        Ok(v)
    }
}

/// Router settings (from config.json).
#[derive(Clone, Debug, PartialEq)]
pub struct RouteSpec {
    pub experts: usize,
    pub top_k: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f32,
}

/// One token's routing: expert ids and their combine weights.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
}

/// `noaux_tc` routing of one token from its sigmoid `scores`: groups ranked by the sum of their
/// two best bias-corrected scores, the `topk_group` best groups kept, the `top_k` best
/// corrected scores among their experts selected; the weights are the *uncorrected* scores of
/// the selected experts, normalized if `norm_topk_prob`, times `routed_scaling_factor` (as
/// HF's `DeepseekV3TopkRouter`).
pub fn route(scores: &[f32], bias: &[f32], spec: &RouteSpec) -> Route {
    let n = spec.experts;
    let per_group = n / spec.n_group;
    let corrected: Vec<f32> = scores.iter().zip(bias).map(|(s, b)| s + b).collect();
    let group_score = |g: usize| {
        let mut top = [f32::NEG_INFINITY; 2];
        for &v in &corrected[g * per_group..(g + 1) * per_group] {
            if v > top[0] {
                top = [v, top[0]];
            } else if v > top[1] {
                top[1] = v;
            }
        }
        top[0] + if per_group > 1 { top[1] } else { 0.0 }
    };
    let mut groups: Vec<(usize, f32)> = (0..spec.n_group).map(|g| (g, group_score(g))).collect();
    groups.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut allowed = vec![false; spec.n_group];
    for &(g, _) in &groups[..spec.topk_group] {
        allowed[g] = true;
    }
    let mut cand: Vec<(usize, f32)> = (0..n)
        .map(|e| {
            (
                e,
                if allowed[e / per_group] {
                    corrected[e]
                } else {
                    f32::NEG_INFINITY
                },
            )
        })
        .collect();
    cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let experts: Vec<usize> = cand[..spec.top_k].iter().map(|c| c.0).collect();
    let mut weights: Vec<f32> = experts.iter().map(|&e| scores[e]).collect();
    if spec.norm_topk_prob {
        let denom = weights.iter().sum::<f32>() + 1e-20;
        for w in &mut weights {
            *w /= denom;
        }
    }
    for w in &mut weights {
        *w *= spec.routed_scaling_factor;
    }
    Route { experts, weights }
}

/// The gate: `[experts, hidden]` weight and the selection-only bias.
#[derive(Clone, Debug)]
pub struct Router {
    /// `[experts, hidden]`, f32 (rounded to the checkpoint's compute dtype first).
    pub weight: Tensor,
    pub bias: Vec<f32>,
    pub spec: RouteSpec,
}

impl Router {
    /// Routes every row of `x [T, hidden]` (scores in f32, as HF computes them).
    pub fn route(&self, x: &Tensor) -> Result<Vec<Route>> {
        self.route_profiled(x, &mut Profiler::off())
    }

    /// [`Router::route`] with its two ops timed as the op graph names them: `router` (the
    /// gate's scores) and `router_topk` (the group-limited selection).
    pub fn route_profiled(&self, x: &Tensor, prof: &mut Profiler) -> Result<Vec<Route>> {
        let (tokens, hidden) = x.dims2()?;
        let experts = self.spec.experts;
        let s = prof.begin();
        let logits = x.to_dtype(DType::F32)?.matmul(&self.weight.t()?)?;
        let scores = (logits.neg()?.exp()? + 1.0)?.recip()?.to_vec2::<f32>()?;
        prof.end(
            s,
            "router",
            || json!({"tokens": tokens, "k": hidden, "n": experts}),
        );
        let s = prof.begin();
        let routes = scores
            .iter()
            .map(|s| route(s, &self.bias, &self.spec))
            .collect();
        prof.end(
            s,
            "router_topk",
            || json!({"tokens": tokens, "experts": experts, "top_k": self.spec.top_k}),
        );
        Ok(routes)
    }
}

/// Each expert's tokens: `(token rows, weights)`, indexed by expert id.
pub fn group_by_expert(routes: &[Route], experts: usize) -> Vec<(Vec<u32>, Vec<f32>)> {
    let mut groups = vec![(Vec::new(), Vec::new()); experts];
    for (t, r) in routes.iter().enumerate() {
        for (&e, &w) in r.experts.iter().zip(&r.weights) {
            groups[e].0.push(t as u32);
            groups[e].1.push(w);
        }
    }
    groups
}

/// The checkpoint's routed experts of one layer, addressed by expert id. A single process runs
/// them as they are; the ranks of an EP instance hold copies of the slots the placement gives
/// them ([`crate::ep::ExpertRanks`]).
#[derive(Clone, Debug, Default)]
pub struct ExpertTable {
    slots: Vec<Option<Arc<Mlp>>>,
}

impl ExpertTable {
    pub fn new(experts: usize) -> ExpertTable {
        ExpertTable {
            slots: vec![None; experts],
        }
    }

    pub fn get(&self, id: usize) -> Option<&Arc<Mlp>> {
        self.slots.get(id).and_then(Option::as_ref)
    }

    pub fn insert(&mut self, id: usize, expert: Arc<Mlp>) {
        self.slots[id] = Some(expert);
    }

    pub fn remove(&mut self, id: usize) -> Option<Arc<Mlp>> {
        self.slots[id].take()
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn map(&self, f: impl Fn(&Mlp) -> Result<Mlp>) -> Result<ExpertTable> {
        let slots = self
            .slots
            .iter()
            .map(|s| s.as_ref().map(|m| f(m).map(Arc::new)).transpose())
            .collect::<Result<_>>()?;
        Ok(ExpertTable { slots })
    }
}

/// One MoE layer: its router, the checkpoint's routed experts (an EP rank runs copies of some
/// of them, [`crate::ep::ExpertRanks`]) and the shared experts every rank runs for its own
/// tokens.
#[derive(Clone, Debug)]
pub struct Moe {
    pub router: Router,
    pub experts: ExpertTable,
    pub shared: Option<Mlp>,
}

/// A decoder layer's FFN: dense, or MoE.
#[derive(Clone, Debug)]
pub enum Ffn {
    Dense(Mlp),
    Moe(Moe),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> RouteSpec {
        RouteSpec {
            experts: 8,
            top_k: 2,
            n_group: 4,
            topk_group: 2,
            norm_topk_prob: true,
            routed_scaling_factor: 2.5,
        }
    }

    #[test]
    fn groups_rank_by_their_two_best_corrected_scores() {
        // Groups: {0,1} {2,3} {4,5} {6,7}. Group 0 has the single best expert but a weak
        // second one; groups 1 and 3 win on the sum of their top two.
        let scores = [0.95, 0.05, 0.6, 0.6, 0.5, 0.1, 0.55, 0.55];
        let r = route(&scores, &[0.0; 8], &spec());
        let mut e = r.experts.clone();
        e.sort();
        assert_eq!(e, vec![2, 3], "expert 0 is outside the kept groups");
        let mut s = spec();
        s.topk_group = 4;
        assert_eq!(route(&scores, &[0.0; 8], &s).experts[0], 0);
    }

    #[test]
    fn bias_selects_but_does_not_weigh() {
        let scores = [0.9, 0.8, 0.1, 0.2, 0.3, 0.3, 0.3, 0.3];
        let mut bias = [0.0; 8];
        bias[2] = 1.0; // lifts expert 2 (and its group) into the selection
        let mut s = spec();
        s.norm_topk_prob = false;
        s.routed_scaling_factor = 1.0;
        let r = route(&scores, &bias, &s);
        assert_eq!(r.experts, vec![2, 0]);
        assert_eq!(
            r.weights,
            vec![0.1, 0.9],
            "weights are the uncorrected scores"
        );
    }

    #[test]
    fn weights_are_normalized_then_scaled() {
        let scores = [0.9, 0.7, 0.1, 0.2, 0.3, 0.3, 0.3, 0.3];
        let r = route(&scores, &[0.0; 8], &spec());
        assert_eq!(r.experts, vec![0, 1]);
        let sum: f32 = r.weights.iter().sum();
        assert!((sum - 2.5).abs() < 1e-6);
        assert!((r.weights[0] / r.weights[1] - 0.9 / 0.7).abs() < 1e-6);
    }

    #[test]
    fn grouping_inverts_routing() {
        let routes = vec![
            Route {
                experts: vec![1, 3],
                weights: vec![0.5, 0.25],
            },
            Route {
                experts: vec![3, 0],
                weights: vec![1.0, 2.0],
            },
        ];
        let g = group_by_expert(&routes, 4);
        assert_eq!(g[3], (vec![0, 1], vec![0.25, 1.0]));
        assert_eq!(g[0], (vec![1], vec![2.0]));
        assert!(g[2].0.is_empty());
    }
}
