//! `dstwin explain`: one step of one instance, priced and broken down.

use crate::expert_load::{
    fluctuation, step_routing, ExpertLoad, ExpertLoadSpec, LoadAssumption, StepRouting,
};
use crate::pricing::{price, price_step, StepCost};
use dstwin_core::batch::{BatchShape, MAX_SEQS_PER_STEP, MAX_TOKENS_PER_STEP};
use dstwin_core::eplb::{balancedness, place, EpLayout, Policy as EplbPolicy};
use dstwin_core::features::{Features, MoeCommUsed, Resolved};
use dstwin_core::layout::{Layout, LayoutError, Plan, Role};
use dstwin_core::memory::{memory_map, MemoryError, MemoryInputs, MemoryMap};
use dstwin_core::model::{ModelConfig, Quant};
use dstwin_core::opgraph::{step_ops, MoeLoad, StepSpec};
use dstwin_hwmodels::{CostModel, DType};
use serde::Serialize;
use std::collections::BTreeMap;
use thiserror::Error;

/// The batch one DP rank computes in the explained step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BatchSpec {
    /// Decoding sequences per DP rank.
    pub decode_seqs: u32,
    /// Context (KV) length of each decoding sequence.
    pub kv_len: u64,
    /// Prompt tokens per DP rank computed this step.
    pub prefill_tokens: u64,
    /// Tokens per prompt computed this step.
    pub prompt_len: u64,
    /// Tokens of each prompt already in KV before this step (prefix-cache hits, or the chunks
    /// of a long prompt computed in earlier steps): the step attends to them and MLA
    /// up-projects their cached latent again. 0: whole prompts, nothing cached.
    pub prompt_cached: u64,
}

/// MTP settings: draft tokens per step and the acceptance probability of each draft given the
/// previous one was accepted.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Mtp {
    pub tokens: u32,
    pub acceptance: Vec<f64>,
}

impl Mtp {
    pub fn off() -> Mtp {
        Mtp {
            tokens: 0,
            acceptance: vec![],
        }
    }

    /// Expected tokens a decoding sequence emits per step: 1 + sum over drafts of the chance that
    /// it and every draft before it are accepted.
    pub fn expected_tokens(&self) -> f64 {
        let mut p = 1.0;
        let mut e = 1.0;
        for i in 0..self.tokens as usize {
            let pi = self
                .acceptance
                .get(i)
                .or(self.acceptance.last())
                .copied()
                .unwrap_or(0.0);
            p *= pi;
            e += p;
        }
        e
    }
}

/// Everything `explain` needs.
#[derive(Clone, Debug)]
pub struct ExplainInput {
    pub model: ModelConfig,
    pub quant: Quant,
    pub kv_dtype: DType,
    pub cost: CostModel,
    pub layout: Layout,
    pub batch: BatchSpec,
    pub mtp: Mtp,
    /// Tokens on the hottest routed die over the mean (1.0 = perfect balance); replaced by the
    /// value a skewed load implies when one is given.
    pub moe_imbalance: f64,
    /// A Zipf load by its exponent and the EPLB policy placing it (what [`explain`] prices;
    /// [`explain_under`] takes any load, the fitted default included).
    pub expert_skew: Option<(f64, EplbPolicy)>,
    /// With `expert_skew`: Dirichlet concentration of each request's routing around the mean
    /// (`expert_load::fluctuation`; 0: no per-batch fluctuation).
    pub expert_concentration: f64,
    /// Per-rank token budget the workspace is sized for (default: this batch's tokens).
    pub max_tokens_per_step: Option<u64>,
    /// Engine mechanisms (two micro-batches, MoE communication, graph padding, ...).
    pub features: Features,
}

#[derive(Debug, Error)]
pub enum ExplainError {
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error("{field} = {value}: {reason}")]
    Input {
        field: &'static str,
        value: String,
        reason: String,
    },
}

fn input(field: &'static str, value: impl ToString, reason: impl Into<String>) -> ExplainError {
    ExplainError::Input {
        field,
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// Throughput implied by the step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Throughput {
    /// Expected tokens per decoding sequence per step (1 + accepted drafts).
    pub tokens_per_seq_step: f64,
    /// Time per output token, ms (decode batches).
    pub tpot_ms: Option<f64>,
    pub output_tok_s_per_die: f64,
    pub output_tok_s_per_package: f64,
    pub input_tok_s_per_die: f64,
    pub input_tok_s_per_package: f64,
}

/// A routed-expert load and the EPLB policy placing it: [`explain_under`] computes the imbalance
/// per layer from them.
#[derive(Clone, Debug, PartialEq)]
pub struct SkewedLoad {
    pub spec: ExpertLoadSpec,
    pub policy: EplbPolicy,
}

/// What expert imbalance costs the step.
#[derive(Clone, Debug, Serialize)]
pub struct MoeReport {
    /// What the load assumes (kind, parameters, source), the policy placing it and the
    /// redundant expert slots it places.
    pub load: LoadAssumption,
    pub policy: EplbPolicy,
    pub redundant_experts: u32,
    /// Hottest routed die over the mean load, per MoE layer (MTP layer last when loaded), for
    /// the placement and the mean load; and their mean.
    pub imbalance_per_layer: Vec<f64>,
    pub placed_imbalance: f64,
    /// Requests (effective count) and tokens in the EP group's step, and what their own
    /// routing adds to the hottest die over the mean load.
    pub requests_per_step: f64,
    pub tokens_per_step: f64,
    pub fluctuation: f64,
    pub imbalance_min: f64,
    pub imbalance_max: f64,
    /// The step with perfect balance, and what the imbalance adds.
    pub perfect_step_ms: f64,
    pub imbalance_cost_ms: f64,
}

/// The explain report; serialized as-is by `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct Explain {
    pub model: String,
    /// The model's parameters without the MTP module, and those one token activates.
    pub params_total: u64,
    pub params_active: u64,
    pub quant: Quant,
    pub kv_dtype: DType,
    pub system: String,
    pub chip: String,
    pub plan: Plan,
    pub batch: BatchSpec,
    pub shape: BatchShape,
    pub mtp: Mtp,
    pub moe_imbalance: f64,
    /// Per-layer imbalance and its cost, when the load is skewed.
    pub moe: Option<MoeReport>,
    /// The engine mechanisms as resolved for this instance.
    pub features: Resolved,
    /// The MoE communication the step uses.
    pub moe_comm: MoeCommUsed,
    /// Tokens per DP rank the step runs at after graph padding (None: eager).
    pub padded_tokens: Option<u64>,
    /// Host time to launch the step's kernels one by one, ms, when it runs eagerly and the cost
    /// file gives a launch cost: the step takes at least this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eager_launch_ms: Option<f64>,
    /// What the MTP drafter's launches add beyond its kernels, ms, when it runs eagerly beside
    /// the graph (`mtp_enforce_eager`); part of the serial step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_launch_gap_ms: Option<f64>,
    /// Step time used for throughput: split in two micro-batches when the mechanisms say so.
    pub step_ms: f64,
    /// The step without micro-batches (shared-expert overlap applied).
    pub serial_step_ms: f64,
    /// The step with two micro-batches (priced whatever the mechanisms allow).
    pub two_microbatch_step_ms: f64,
    /// Gain of two-micro-batch overlap over the serial step (negative: it would slow the step).
    pub two_microbatch_gain: f64,
    /// Whether the step time is the split one.
    pub two_microbatch_used: bool,
    /// Shared-expert time hidden under dispatch and combine by a second stream, ms.
    pub shared_expert_overlap_ms: f64,
    /// Where the prices extrapolate beyond what the cost model was fitted on.
    pub caveats: Vec<String>,
    pub compute_ms: f64,
    pub comm_ms: f64,
    pub roofline_ms: f64,
    pub by_class_ms: BTreeMap<&'static str, f64>,
    pub by_layer_ms: BTreeMap<&'static str, f64>,
    pub by_bound_ms: BTreeMap<&'static str, f64>,
    pub throughput: Throughput,
    pub memory: MemoryMap,
    pub step: StepCost,
}

fn shape_for(b: &BatchSpec, tokens_per_seq: u64, model: &ModelConfig, halve: bool) -> BatchShape {
    let cap = model.attn_cap();
    let d = if halve {
        b.decode_seqs.div_ceil(2)
    } else {
        b.decode_seqs
    };
    let mut s = BatchShape::uniform_decode(d, tokens_per_seq, b.kv_len, cap);
    let pt = if halve {
        b.prefill_tokens.div_ceil(2)
    } else {
        b.prefill_tokens
    };
    if pt > 0 {
        let prompts = pt / b.prompt_len;
        let p = BatchShape::uniform_chunks(prompts as u32, b.prompt_len, b.prompt_cached, cap);
        s.prefill_seqs = p.prefill_seqs;
        s.prefill_tokens = p.prefill_tokens;
        s.prefill_pairs = p.prefill_pairs;
        s.prefill_pairs_capped = p.prefill_pairs_capped;
        s.prefill_cached = p.prefill_cached;
        let rest = pt - prompts * b.prompt_len;
        // A partial prompt (half a batch of an odd prompt count) computes as a chunk.
        s.add_prefill(rest, b.prompt_cached, cap);
    }
    s
}

/// Hottest routed die over the mean, per MoE layer, for `load` (seeded: each layer its own
/// draw) placed by its policy on the plan's routed-expert dies.
fn layer_imbalance(
    inp: &ExplainInput,
    plan: &Plan,
    load: &SkewedLoad,
) -> Result<Vec<f64>, ExplainError> {
    let (spec, policy) = (&load.spec, plan.placement_policy(load.policy));
    spec.validate()
        .map_err(|(field, value, reason)| input("skew", value, format!("{field} {reason}")))?;
    let m = &inp.model;
    let layers = (m.moe_layers() + if inp.mtp.tokens > 0 { m.mtp_layers } else { 0 }) as usize;
    let load = ExpertLoad::new(
        spec,
        layers,
        m.routed_experts as usize,
        1,
        std::path::Path::new("."),
    )
    .map_err(|e| input("skew", spec.kind(), e.to_string()))?;
    let layout = EpLayout {
        slots: m.routed_experts as u32 + plan.redundant_experts,
        dies: plan.routed_dies,
        dies_per_node: inp.cost.system.dies_per_node(),
        groups: m.router_groups as u32,
    };
    let p =
        place(policy, load.shares(), &layout).map_err(|e| input("eplb", policy, e.to_string()))?;
    Ok(p.layers
        .iter()
        .zip(load.shares())
        .map(|(lp, sh)| 1.0 / balancedness(&lp.die_loads(sh, p.slots_per_die)))
        .collect())
}

/// Prices one step of one instance and everything around it, under perfect balance, the given
/// `moe_imbalance` or the Zipf load of `expert_skew`.
pub fn explain(inp: &ExplainInput) -> Result<Explain, ExplainError> {
    let zipf = inp.expert_skew.map(|(exponent, policy)| SkewedLoad {
        spec: ExpertLoadSpec::Zipf {
            exponent,
            drift: 0.0,
            epoch_steps: 1,
            concentration: inp.expert_concentration,
        },
        policy,
    });
    explain_under(inp, zipf.as_ref())
}

/// [`explain`] under a routed-expert load and its placement (`None`: `moe_imbalance`).
pub fn explain_under(
    inp: &ExplainInput,
    load: Option<&SkewedLoad>,
) -> Result<Explain, ExplainError> {
    let system = &inp.cost.system;
    let plan = inp.layout.validate(&inp.model, system)?;
    let b = &inp.batch;
    if b.decode_seqs == 0 && b.prefill_tokens == 0 {
        return Err(input(
            "batch",
            "empty",
            "give decode sequences (--seqs) or prompt tokens (--tokens)",
        ));
    }
    if u64::from(b.decode_seqs) > MAX_SEQS_PER_STEP {
        return Err(input(
            "batch.decode_seqs",
            b.decode_seqs,
            format!("at most {MAX_SEQS_PER_STEP} sequences per DP rank"),
        ));
    }
    if b.prefill_tokens > MAX_TOKENS_PER_STEP {
        return Err(input(
            "batch.prefill_tokens",
            b.prefill_tokens,
            format!("at most {MAX_TOKENS_PER_STEP} tokens per DP rank and step"),
        ));
    }
    if inp.mtp.tokens as usize > crate::mtp::MAX_POSITIONS {
        return Err(input(
            "mtp.tokens",
            inp.mtp.tokens,
            format!(
                "at most {} draft tokens per step",
                crate::mtp::MAX_POSITIONS
            ),
        ));
    }
    if b.prompt_cached + b.prompt_len > inp.model.max_context {
        return Err(input(
            "batch.prompt_cached",
            b.prompt_cached,
            format!(
                "cached plus new prompt tokens ({} + {}) exceed the model's context of {}",
                b.prompt_cached, b.prompt_len, inp.model.max_context
            ),
        ));
    }
    if b.prefill_tokens > 0 && (b.prompt_len == 0 || b.prompt_len > b.prefill_tokens) {
        return Err(input(
            "batch.prompt_len",
            b.prompt_len,
            format!(
                "must be between 1 and the prompt tokens per rank ({})",
                b.prefill_tokens
            ),
        ));
    }
    if b.decode_seqs > 0 && b.kv_len == 0 {
        return Err(input(
            "batch.kv_len",
            0,
            "decoding sequences need a context length",
        ));
    }
    if b.kv_len > inp.model.max_context {
        return Err(input(
            "batch.kv_len",
            b.kv_len,
            format!("exceeds the model's context of {}", inp.model.max_context),
        ));
    }
    if !(inp.moe_imbalance.is_finite() && inp.moe_imbalance >= 1.0) {
        return Err(input(
            "moe_imbalance",
            inp.moe_imbalance,
            "must be at least 1.0 (1.0 = perfect balance)",
        ));
    }
    if inp.mtp.tokens > 0 && inp.model.mtp_layers == 0 {
        return Err(input(
            "mtp.tokens",
            inp.mtp.tokens,
            "the model has no MTP module",
        ));
    }
    if inp.mtp.acceptance.iter().any(|p| !(0.0..=1.0).contains(p)) {
        return Err(input(
            "mtp.acceptance",
            format!("{:?}", inp.mtp.acceptance),
            "probabilities must be in [0, 1]",
        ));
    }
    match plan.role {
        Role::Decode if b.prefill_tokens > 0 => {
            return Err(input(
                "batch.prefill_tokens",
                b.prefill_tokens,
                "a decode instance computes no prompts; use role mixed",
            ))
        }
        Role::Prefill if b.decode_seqs > 0 => {
            return Err(input(
                "batch.decode_seqs",
                b.decode_seqs,
                "a prefill instance decodes nothing; use role mixed",
            ))
        }
        _ => {}
    }

    let tokens_per_seq = 1 + inp.mtp.tokens as u64;
    let features = inp
        .features
        .check_instance(&inp.model, &system.chip.name, plan.tp, plan.moe_tp)
        .and_then(|()| {
            inp.features.resolve(
                &system.chip.name,
                b.decode_seqs.max(1),
                inp.mtp.tokens,
                plan.tp,
            )
        })
        .map_err(|e| ExplainError::Input {
            field: e.field,
            value: e.value,
            reason: e.reason,
        })?;
    let spec = StepSpec {
        model: &inp.model,
        quant: inp.quant,
        kv_dtype: inp.kv_dtype,
        plan: &plan,
        mtp_tokens: inp.mtp.tokens,
        features: &features,
    };
    let unpadded = shape_for(b, tokens_per_seq, &inp.model, false);
    let with_prompts = unpadded.prefill_tokens > 0;
    // Every DP rank computes the same shape: the largest rank's tokens are this rank's.
    let padded_tokens = if with_prompts {
        None
    } else {
        features.padded_tokens(unpadded.tokens())
    };
    let pad = |s: BatchShape| padded_tokens.map_or(s, |p| s.padded_to(p, inp.mtp.tokens));
    let full = pad(unpadded);
    let half = pad(shape_for(b, tokens_per_seq, &inp.model, true));
    let moe_comm = features.moe_comm(
        unpadded.tokens(),
        with_prompts,
        plan.slots_per_die as u64,
        plan.ep,
    );
    let per_layer = match load {
        Some(l) => Some(layer_imbalance(inp, &plan, l)?),
        None => None,
    };
    // Every DP rank of the EP group computes the same shape.
    let routing: StepRouting = step_routing(std::iter::repeat_n(&unpadded, plan.dp as usize));
    let fluct = match load {
        Some(l) => fluctuation(
            plan.routed_dies,
            routing,
            inp.model.top_k as u32,
            l.spec.concentration(),
        ),
        None => 0.0,
    };
    let imbalance = per_layer.as_ref().map_or(inp.moe_imbalance, |v| {
        v.iter().sum::<f64>() / v.len() as f64 + fluct
    });
    // The step priced at an imbalance, by the rule the twin device uses; the split step is
    // priced whatever the mechanisms allow, for the report.
    let step_at = |imbalance: f64| {
        let load = |tokens: u64| MoeLoad {
            // Every DP rank of the EP group computes the same shape; its TP dies share its tokens.
            group_tokens: tokens * plan.dp as u64,
            imbalance,
            comm: moe_comm,
        };
        let step = price(&step_ops(spec, &full, &load(unpadded.tokens())), &inp.cost);
        let split_time = || {
            let half_ops = step_ops(spec, &half, &load(unpadded.tokens().div_ceil(2)));
            let h = price(&half_ops, &inp.cost);
            crate::pricing::two_microbatch_time(&h.path, &inp.cost.params)
        };
        let draft_launch_s =
            crate::pricing::draft_launch_s(&inp.cost, &inp.model, inp.mtp.tokens, &features);
        let p = price_step(&features, &full, &step.path, draft_launch_s, split_time);
        let split = p
            .split_s
            .unwrap_or_else(|| split_time() + p.draft_launch_gap_s);
        (p, split, step)
    };
    let (priced, tmb, step) = step_at(imbalance);
    let serial = priced.serial_s;
    // An eager step's kernels run behind their launches (as `simulate` prices it).
    let eager_launch_s = if features.launches_eagerly(padded_tokens) {
        crate::pricing::eager_launch_s(&inp.cost, &inp.model, inp.mtp.tokens)
    } else {
        0.0
    };
    let step_s = priced.time_s.max(eager_launch_s);
    let moe = per_layer.map(|v| {
        let perfect = step_at(1.0).0.time_s.max(eager_launch_s);
        let l = load.expect("per-layer imbalance comes from a load");
        MoeReport {
            load: l.spec.assumption(),
            policy: l.policy,
            redundant_experts: plan.redundant_experts,
            imbalance_min: v.iter().copied().fold(f64::INFINITY, f64::min),
            imbalance_max: v.iter().copied().fold(1.0, f64::max),
            placed_imbalance: v.iter().sum::<f64>() / v.len() as f64,
            imbalance_per_layer: v,
            requests_per_step: routing.requests,
            tokens_per_step: routing.tokens,
            fluctuation: fluct,
            perfect_step_ms: perfect * 1e3,
            imbalance_cost_ms: (step_s - perfect) * 1e3,
        }
    });

    let memory = memory_map(
        &inp.model,
        &plan,
        system,
        &MemoryInputs {
            quant: inp.quant,
            kv_dtype: inp.kv_dtype,
            mtp_tokens: inp.mtp.tokens,
            max_tokens_per_step: dstwin_core::memory::cp_tokens_per_die(
                inp.max_tokens_per_step.unwrap_or(full.tokens()),
                plan.tp,
                plan.dense_tp,
                inp.features.enable_dsa_cp,
            ),
            dispatch_tokens_per_step: dstwin_core::memory::dispatch_tokens_per_die(
                inp.max_tokens_per_step.unwrap_or(full.tokens()),
                &plan,
            ),
            budget: dstwin_core::memory::MemoryBudget::SystemReserve,
            shared_expert_dp: inp.features.shared_expert_dp(plan.tp),
            dcp: features.dcp,
        },
    )?;
    let prompts = if b.prompt_len > 0 {
        b.prefill_tokens.div_ceil(b.prompt_len)
    } else {
        0
    };
    let needed = b.decode_seqs as u64 * (b.kv_len + tokens_per_seq)
        + b.prefill_tokens
        + prompts * b.prompt_cached;
    if needed > memory.kv_capacity_tokens {
        return Err(input(
            "batch",
            format!("{} KV tokens per rank", needed),
            format!(
                "exceeds the KV capacity of {} tokens per die ({:.1} GB left for KV)",
                memory.kv_capacity_tokens,
                memory.kv_cache / 1e9
            ),
        ));
    }

    let caveats = crate::pricing::fabric_caveats(plan.ep, &inp.cost);
    let e = inp.mtp.expected_tokens();
    let per_die = plan.dp as f64 / plan.dies as f64;
    let dpp = system.dies_per_package() as f64;
    let out_die = b.decode_seqs as f64 * e * per_die / step_s;
    let in_die = b.prefill_tokens as f64 * per_die / step_s;
    let ms = |m: BTreeMap<&'static str, f64>| m.into_iter().map(|(k, v)| (k, v * 1e3)).collect();
    Ok(Explain {
        model: inp.model.name.clone(),
        params_total: dstwin_core::model::count(&inp.model).total(),
        params_active: dstwin_core::model::active(&inp.model),
        quant: inp.quant,
        kv_dtype: inp.kv_dtype,
        system: system.name.clone(),
        chip: system.chip.name.clone(),
        plan,
        batch: b.clone(),
        shape: full,
        mtp: inp.mtp.clone(),
        moe_imbalance: imbalance,
        moe,
        features: features.clone(),
        moe_comm,
        padded_tokens,
        eager_launch_ms: (eager_launch_s > 0.0).then_some(eager_launch_s * 1e3),
        draft_launch_gap_ms: features
            .mtp_enforce_eager
            .then_some(priced.draft_launch_gap_s * 1e3),
        step_ms: step_s * 1e3,
        serial_step_ms: serial * 1e3,
        two_microbatch_step_ms: tmb * 1e3,
        two_microbatch_gain: serial / tmb - 1.0,
        two_microbatch_used: priced.split_used,
        caveats,
        shared_expert_overlap_ms: priced.shared_overlap_s * 1e3,
        compute_ms: step.compute_s * 1e3,
        comm_ms: step.comm_s * 1e3,
        roofline_ms: step.roofline_s * 1e3,
        by_class_ms: ms(step.by_class()),
        by_layer_ms: ms(step.by_layer()),
        by_bound_ms: ms(step.by_bound()),
        throughput: Throughput {
            tokens_per_seq_step: e,
            tpot_ms: (b.decode_seqs > 0).then(|| step_s * 1e3 / e),
            output_tok_s_per_die: out_die,
            output_tok_s_per_package: out_die * dpp,
            input_tok_s_per_die: in_die,
            input_tok_s_per_package: in_die * dpp,
        },
        memory,
        step,
    })
}
