//! The bare graph: one die, or single-die DP ranks, with no fused or overlapped mechanism, so
//! that every op shows under its own name. Calibration prices measured kernels on it
//! ([`op_work`]) and maps a profiler's op names onto it ([`vocabulary`]).

use super::{step_ops, MoeLoad, OpKind, StepSpec};
use crate::batch::BatchShape;
use crate::layout::{Plan, Role};
use crate::model::{ModelConfig, Quant};
use dstwin_hwmodels::{DType, Work};
use std::collections::BTreeMap;

/// An instance of `ep` single-die DP ranks (tp 1), the routed experts spread over all of them.
fn bare_plan(model: &ModelConfig, ep: u32) -> Plan {
    Plan {
        role: Role::Mixed,
        dies: ep,
        dp: ep,
        tp: 1,
        ep,
        moe_tp: 1,
        dense_tp: 1,
        lmhead_tp: None,
        redundant_experts: 0,
        shared_expert_dies: 0,
        routed_dies: ep,
        slots_per_die: (model.routed_experts as u32).div_ceil(ep).max(1),
    }
}

/// The work of one kernel of the op `name` as the bare graph of one die holding every expert
/// (tp 1, in `quant`) prices it for the batch `b` with `group_tokens` tokens entering the
/// MoE layers: what an engine that runs that op on that batch computes, for fitting its
/// measured time. `None` when the graph has no compute op of that name for `b`.
pub fn op_work(
    model: &ModelConfig,
    quant: Quant,
    name: &str,
    b: &BatchShape,
    group_tokens: u64,
) -> Option<Work> {
    let plan = bare_plan(model, 1);
    let features = crate::features::Resolved::plain("");
    let spec = StepSpec {
        model,
        quant,
        kv_dtype: DType::Bf16,
        plan: &plan,
        mtp_tokens: 0,
        features: &features,
    };
    let load = MoeLoad {
        group_tokens,
        imbalance: 1.0,
        comm: crate::features::MoeCommUsed::Mc2,
    };
    step_ops(spec, b, &load)
        .into_iter()
        .find(|o| o.name == name)
        .and_then(|o| match o.kind {
            OpKind::Compute(w) => Some(w),
            OpKind::Comm(_) => None,
        })
}

/// The ops the graph names for `model` on an instance of `ep` single-die DP ranks (tp 1, the
/// routed experts spread over all of them), in a step that both computes prompt tokens and
/// decodes with `mtp_tokens` drafts: op name -> class name ([`Op::class_name`]). The vocabulary
/// a real engine's profiler names its ops in, so that its traces map onto the graph the twin
/// prices. Dispatch and combine appear only when `ep > 1` (one die moves no tokens).
pub fn vocabulary(
    model: &ModelConfig,
    ep: u32,
    mtp_tokens: u32,
) -> BTreeMap<&'static str, &'static str> {
    let ep = ep.max(1);
    let plan = bare_plan(model, ep);
    // The bare graph: no fused or overlapped mechanisms, so every op shows under its own name.
    let features = crate::features::Resolved::plain("");
    let spec = StepSpec {
        model,
        quant: Quant::Bf16,
        kv_dtype: DType::Bf16,
        plan: &plan,
        mtp_tokens,
        features: &features,
    };
    let cap = model.attn_cap();
    let mut b = BatchShape::default();
    b.add_prefill(16, 0, cap);
    for _ in 0..2 {
        b.add_decode(1 + mtp_tokens as u64, 16, cap);
    }
    let load = MoeLoad {
        group_tokens: b.tokens() * ep as u64,
        imbalance: 1.0,
        comm: crate::features::MoeCommUsed::Mc2,
    };
    step_ops(spec, &b, &load)
        .iter()
        .map(|o| (o.name, o.class_name()))
        .collect()
}
