//! DeepSeekMoE: sigmoid router with `noaux_tc` group-limited top-k, routed experts addressed
//! by id through an [`ExpertTable`], shared experts.
//!
//! A layer runs in three explicit stages so that expert parallelism can later cut between them:
//! [`Router::route`] (per token: experts and weights), [`group_by_expert`] (per expert: its
//! tokens and weights — what a dispatch sends), and the combine (each expert's output weighted
//! and summed back per token, in expert-id order).

use crate::linear::Linear;
use crate::ops::rms_norm;
use candle_core::{DType, Result, Tensor};
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
        let g = self.gate.forward(x)?.silu()?;
        self.down.forward(&(g * self.up.forward(x)?)?)
    }

    pub fn to_w8a8(&self) -> Result<Mlp> {
        Ok(Mlp {
            gate: self.gate.to_w8a8()?,
            up: self.up.to_w8a8()?,
            down: self.down.to_w8a8()?,
        })
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
        let logits = x.to_dtype(DType::F32)?.matmul(&self.weight.t()?)?;
        let scores = (logits.neg()?.exp()? + 1.0)?.recip()?.to_vec2::<f32>()?;
        Ok(scores
            .iter()
            .map(|s| route(s, &self.bias, &self.spec))
            .collect())
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

/// The routed experts this process holds, addressed by expert id. An EP rank holds a subset;
/// EPLB's redundant replicas are further `Arc`s of the same weights.
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

/// One MoE layer.
#[derive(Clone, Debug)]
pub struct Moe {
    pub router: Router,
    pub experts: ExpertTable,
    pub shared: Option<Mlp>,
}

impl Moe {
    /// `x [T, hidden]` -> (`[T, hidden]`, tokens routed to each expert).
    pub fn forward(
        &self,
        layer: usize,
        x: &Tensor,
    ) -> std::result::Result<(Tensor, Vec<u32>), crate::error::ModelError> {
        let routes = self.router.route(x)?;
        let groups = group_by_expert(&routes, self.router.spec.experts);
        let counts = groups.iter().map(|g| g.0.len() as u32).collect();
        // Every expert's weighted output, then one scatter-add into the tokens' rows (adding
        // expert by expert would copy the whole output once per expert).
        let mut ys = Vec::new();
        let mut all_rows = Vec::new();
        for (e, (rows, weights)) in groups.iter().enumerate() {
            if rows.is_empty() {
                continue;
            }
            let expert = self
                .experts
                .get(e)
                .ok_or(crate::error::ModelError::ExpertMissing { layer, expert: e })?;
            let idx = Tensor::from_slice(rows, rows.len(), x.device())?;
            let y = expert.forward(&x.index_select(&idx, 0)?)?;
            let w = Tensor::from_slice(weights, (rows.len(), 1), x.device())?;
            ys.push(
                y.to_dtype(DType::F32)?
                    .broadcast_mul(&w)?
                    .to_dtype(x.dtype())?,
            );
            all_rows.extend_from_slice(rows);
        }
        let mut out = x.zeros_like()?;
        if !ys.is_empty() {
            let idx = Tensor::from_slice(&all_rows, all_rows.len(), x.device())?;
            out = out.index_add(&idx, &Tensor::cat(&ys, 0)?, 0)?;
        }
        if let Some(shared) = &self.shared {
            out = (out + shared.forward(x)?)?;
        }
        Ok((out, counts))
    }
}

/// RMSNorm then FFN: a dense layer's or an MoE layer's.
#[derive(Clone, Debug)]
pub enum Ffn {
    Dense(Mlp),
    Moe(Moe),
}

impl Ffn {
    /// Returns the output and, for MoE, the per-expert token counts.
    pub fn forward(
        &self,
        layer: usize,
        x: &Tensor,
        norm: &Tensor,
        eps: f64,
    ) -> std::result::Result<(Tensor, Option<Vec<u32>>), crate::error::ModelError> {
        let h = rms_norm(x, norm, eps)?;
        Ok(match self {
            Ffn::Dense(m) => (m.forward(&h)?, None),
            Ffn::Moe(m) => {
                let (y, c) = m.forward(layer, &h)?;
                (y, Some(c))
            }
        })
    }
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
