//! DeepSeekMoE: sigmoid router with `noaux_tc` group-limited top-k, routed experts addressed
//! by id through an [`ExpertTable`], shared experts.
//!
//! A layer runs in explicit stages so that expert parallelism cuts between them
//! ([`crate::ep`]): [`Router::route`] (per token: experts and weights), [`group_by_expert`]
//! (per expert: its tokens and weights — what a dispatch sends), the experts ([`Expert`]: f32
//! experts packed for [`crate::gemm`], gate and up fused), and the combine (each expert's
//! output weighted and summed back per token, in expert-id order).

use crate::gemm::PackedMatrix;
use crate::linear::Linear;
use crate::profile::Profiler;
use candle_core::{DType, Device, Result, Tensor};
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
            || crate::args! {"tokens": tokens, "k": hidden, "n": 2 * ffn},
        );
        let s = prof.begin();
        let a = (g.silu()? * u)?;
        prof.end(s, "ffn_act", || crate::args! {"tokens": tokens, "n": ffn});
        let s = prof.begin();
        let y = self.down.forward(&a)?;
        prof.end(
            s,
            "ffn_down",
            || crate::args! {"tokens": tokens, "k": ffn, "n": hidden},
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
            || crate::args! {"tokens": tokens, "k": hidden, "n": experts},
        );
        let s = prof.begin();
        let routes = scores
            .iter()
            .map(|s| route(s, &self.bias, &self.spec))
            .collect();
        prof.end(
            s,
            "router_topk",
            || crate::args! {"tokens": tokens, "experts": experts, "top_k": self.spec.top_k},
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

/// A routed expert's weights in the form the experts stage runs them.
#[derive(Clone, Debug)]
pub enum Expert {
    /// f32 weights packed for [`crate::gemm`]: gate and up fused into one `[2 * ffn, hidden]`
    /// matrix (gate's rows first), down `[hidden, ffn]`. Rows are read where they lie, and a
    /// row's output does not depend on the rows computed with it.
    Packed {
        gate_up: PackedMatrix,
        down: PackedMatrix,
    },
    /// Other compute dtypes and W8A8: the SwiGLU [`Mlp`] on candle tensors.
    Tensors(Mlp),
}

impl Expert {
    /// `mlp` packed when its three weights are dense f32 on the CPU, else as it is.
    pub fn new(mlp: Mlp) -> Result<Expert> {
        let f32_cpu = |l: &Linear| match l {
            Linear::Dense(w) if w.dtype() == DType::F32 && w.device().is_cpu() => Some(w.clone()),
            _ => None,
        };
        let (Some(gate), Some(up), Some(down)) =
            (f32_cpu(&mlp.gate), f32_cpu(&mlp.up), f32_cpu(&mlp.down))
        else {
            return Ok(Expert::Tensors(mlp));
        };
        let (ffn, hidden) = gate.dims2()?;
        let gate_up = Tensor::cat(&[&gate, &up], 0)?.flatten_all()?.to_vec1()?;
        Ok(Expert::Packed {
            gate_up: PackedMatrix::pack(&gate_up, 2 * ffn, hidden),
            down: PackedMatrix::pack(&down.flatten_all()?.to_vec1()?, hidden, ffn),
        })
    }

    /// The weights as a SwiGLU [`Mlp`] of tensors.
    pub fn to_mlp(&self) -> Result<Mlp> {
        match self {
            Expert::Packed { gate_up, down } => {
                let (two_ffn, hidden) = (gate_up.out_dim(), gate_up.in_dim());
                let gu = Tensor::from_vec(gate_up.unpack(), (two_ffn, hidden), &Device::Cpu)?;
                Ok(Mlp {
                    gate: Linear::Dense(gu.narrow(0, 0, two_ffn / 2)?.contiguous()?),
                    up: Linear::Dense(gu.narrow(0, two_ffn / 2, two_ffn / 2)?.contiguous()?),
                    down: Linear::Dense(Tensor::from_vec(
                        down.unpack(),
                        (hidden, two_ffn / 2),
                        &Device::Cpu,
                    )?),
                })
            }
            Expert::Tensors(m) => Ok(m.clone()),
        }
    }

    /// `down(silu(gate(x)) * up(x))` of each row (`hidden` values in f32): `[rows, hidden]`
    /// row-major f32. A packed expert computes in f32; a [`Expert::Tensors`] one takes the rows
    /// in `dtype` (the model's compute dtype) on `device`.
    pub fn forward_rows(&self, rows: &[&[f32]], dtype: DType, device: &Device) -> Result<Vec<f32>> {
        match self {
            Expert::Packed { gate_up, down } => {
                let ffn = down.in_dim();
                let mut gu = vec![0f32; rows.len() * 2 * ffn];
                gate_up.matmul(rows, &mut gu);
                // silu(gate) * up, as candle's `silu` computes it.
                let act: Vec<f32> = gu
                    .chunks_exact(2 * ffn)
                    .flat_map(|r| {
                        let (g, u) = r.split_at(ffn);
                        g.iter().zip(u).map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
                    })
                    .collect();
                let act_rows: Vec<&[f32]> = act.chunks_exact(ffn).collect();
                let mut y = vec![0f32; rows.len() * down.out_dim()];
                down.matmul(&act_rows, &mut y);
                Ok(y)
            }
            Expert::Tensors(_) if rows.is_empty() => Ok(Vec::new()),
            Expert::Tensors(m) => {
                let hidden = rows[0].len();
                let x = Tensor::from_vec(rows.concat(), (rows.len(), hidden), device)?;
                m.forward(&x.to_dtype(dtype)?)?
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1()
            }
        }
    }

    /// This expert in W8A8.
    pub fn to_w8a8(&self) -> Result<Expert> {
        Ok(Expert::Tensors(self.to_mlp()?.to_w8a8()?))
    }

    /// A copy in storage of its own (what a rank receiving this expert holds).
    pub fn deep_copy(&self) -> Result<Expert> {
        Ok(match self {
            Expert::Packed { .. } => self.clone(),
            Expert::Tensors(m) => Expert::Tensors(m.deep_copy()?),
        })
    }

    /// Bytes of its weights (scales and panel padding included).
    pub fn bytes(&self) -> usize {
        match self {
            Expert::Packed { gate_up, down } => gate_up.bytes() + down.bytes(),
            Expert::Tensors(m) => m.bytes(),
        }
    }

    /// Its weights as f32 values, gate then up then down, each `[out, in]` row-major (tests
    /// compare replicas).
    pub fn weights_f32(&self) -> Result<Vec<f32>> {
        match self {
            Expert::Packed { gate_up, down } => Ok([gate_up.unpack(), down.unpack()].concat()),
            Expert::Tensors(m) => m.weights_f32(),
        }
    }
}

/// The checkpoint's routed experts of one layer, addressed by expert id. A single process runs
/// them as they are; the ranks of an EP instance hold copies of the slots the placement gives
/// them ([`crate::ep::ExpertRanks`]).
#[derive(Clone, Debug, Default)]
pub struct ExpertTable {
    slots: Vec<Option<Arc<Expert>>>,
}

impl ExpertTable {
    pub fn new(experts: usize) -> ExpertTable {
        ExpertTable {
            slots: vec![None; experts],
        }
    }

    pub fn get(&self, id: usize) -> Option<&Arc<Expert>> {
        self.slots.get(id).and_then(Option::as_ref)
    }

    pub fn insert(&mut self, id: usize, expert: Arc<Expert>) {
        self.slots[id] = Some(expert);
    }

    pub fn remove(&mut self, id: usize) -> Option<Arc<Expert>> {
        self.slots[id].take()
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn map(&self, f: impl Fn(&Expert) -> Result<Expert>) -> Result<ExpertTable> {
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

    /// A small f32 expert with deterministic weights.
    fn mlp(hidden: usize, ffn: usize) -> Result<Mlp> {
        let w = |n: usize, k: usize, seed: usize| {
            let v: Vec<f32> = (0..n * k)
                .map(|i| ((i * 7919 + seed * 104_729) % 1000) as f32 / 5000.0 - 0.1)
                .collect();
            Tensor::from_vec(v, (n, k), &Device::Cpu).map(Linear::Dense)
        };
        Ok(Mlp {
            gate: w(ffn, hidden, 1)?,
            up: w(ffn, hidden, 2)?,
            down: w(hidden, ffn, 3)?,
        })
    }

    #[test]
    fn a_packed_expert_computes_the_swiglu_of_its_tensors() -> Result<()> {
        let (hidden, ffn, tokens) = (40, 24, 7);
        let m = mlp(hidden, ffn)?;
        let packed = Expert::new(m.clone())?;
        assert!(
            matches!(packed, Expert::Packed { .. }),
            "f32 on the CPU packs"
        );
        assert_eq!(
            packed.weights_f32()?,
            m.weights_f32()?,
            "gate, up, down kept exactly"
        );
        assert_eq!(packed.to_mlp()?.weights_f32()?, m.weights_f32()?);
        let x: Vec<f32> = (0..tokens * hidden)
            .map(|i| (i % 13) as f32 / 6.0 - 1.0)
            .collect();
        let rows: Vec<&[f32]> = x.chunks_exact(hidden).collect();
        let got = packed.forward_rows(&rows, DType::F32, &Device::Cpu)?;
        let want = Expert::Tensors(m).forward_rows(&rows, DType::F32, &Device::Cpu)?;
        assert_eq!(got.len(), tokens * hidden);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{g} vs {w}");
        }
        Ok(())
    }

    #[test]
    fn other_dtypes_and_w8a8_stay_tensors() -> Result<()> {
        let m = mlp(16, 8)?;
        let bf16 = Mlp {
            gate: Linear::Dense(m.gate.weight_f32()?.to_dtype(DType::BF16)?),
            ..m.clone()
        };
        assert!(matches!(Expert::new(bf16)?, Expert::Tensors(_)));
        let q = Expert::new(m)?.to_w8a8()?;
        assert!(matches!(q, Expert::Tensors(_)));
        let rows = [&[0.5f32; 16][..], &[-0.25; 16]];
        assert_eq!(
            q.forward_rows(&rows, DType::F32, &Device::Cpu)?.len(),
            2 * 16
        );
        assert!(q.forward_rows(&[], DType::F32, &Device::Cpu)?.is_empty());
        Ok(())
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
