//! Validation: a raw scenario becomes a [`Scenario`] once, with cross-field checks whose
//! errors name the field and the numbers.

use super::{
    field, fnv1a, load_model, resolve, AdmissionSpec, InstanceSetup, Scenario, ScenarioError,
    ScenarioFile, Slo,
};
use dstwin_core::layout::Role;
use dstwin_core::memory::{memory_map, MemoryBudget, MemoryInputs};
use dstwin_core::time::SimDuration;
use dstwin_hwmodels::{Catalog, DType};
use dstwin_twin::explain::Mtp;
use std::path::Path;

pub(super) fn validate(
    raw: ScenarioFile,
    base_dir: &Path,
    canonical: String,
) -> Result<Scenario, ScenarioError> {
    let model = load_model(&raw.model, base_dir)?;
    let kv_dtype: DType = raw
        .kv_dtype
        .parse()
        .map_err(|e: String| field("kv_dtype", &raw.kv_dtype, e))?;
    let cat = Catalog::builtin();
    let hw = resolve(base_dir, &raw.hardware);
    let system = cat.resolve_system(&hw)?;
    let cost = cat.cost_model(&system, Path::new(&hw).parent())?;
    if let Some(d) = raw.duration_s {
        if !(d.is_finite() && d > 0.0) {
            return Err(field(
                "duration_s",
                d,
                "must be a positive number of seconds",
            ));
        }
    }
    if let Some(f) = raw.frontend_us.filter(|f| !(f.is_finite() && *f >= 0.0)) {
        return Err(field(
            "frontend_us",
            f,
            "must be a number of microseconds >= 0",
        ));
    }
    if !(raw.warmup_s.is_finite() && raw.warmup_s >= 0.0) {
        return Err(field(
            "warmup_s",
            raw.warmup_s,
            "must be a number of seconds >= 0",
        ));
    }
    if let Some(d) = raw.duration_s.filter(|&d| raw.warmup_s >= d) {
        return Err(field(
            "warmup_s",
            raw.warmup_s,
            format!("must be shorter than duration_s ({d})"),
        ));
    }
    if raw.warmup_s > 0.0 && raw.duration_s.is_none() {
        return Err(field(
            "warmup_s",
            raw.warmup_s,
            "needs duration_s: without it the run ends when the last request finishes, which \
             may be before the warm-up does, leaving nothing to report",
        ));
    }
    // vLLM runs DeepSeek's one MTP layer again for every further draft, and each draft is
    // accepted only if all before it were, so acceptance falls geometrically: published
    // deployments use 1 to 3 drafts. Past MAX_POSITIONS the acceptance model has no positions.
    let max_drafts = dstwin_twin::mtp::MAX_POSITIONS as u32;
    if raw.mtp.tokens > max_drafts {
        return Err(field(
            "mtp.tokens",
            raw.mtp.tokens,
            format!(
                "must be at most {max_drafts} draft tokens per step (acceptance falls \
                 geometrically with each draft; deployments use 1 to 3)"
            ),
        ));
    }
    if raw.mtp.tokens > 0 && model.mtp_layers == 0 {
        return Err(field(
            "mtp.tokens",
            raw.mtp.tokens,
            "the model has no MTP module",
        ));
    }
    for (i, p) in raw.mtp.acceptance.iter().enumerate() {
        if !(0.0..=1.0).contains(p) {
            return Err(field(
                format!("mtp.acceptance[{i}]"),
                p,
                "must be in [0, 1]",
            ));
        }
    }
    raw.expert_load
        .validate()
        .map_err(|(f, v, r)| field(f, v, r))?;
    for (name, v) in [
        ("slo.ttft_ms", raw.slo.ttft_ms),
        ("slo.tpot_ms", raw.slo.tpot_ms),
        ("slo.e2e_ms", raw.slo.e2e_ms),
    ] {
        if let Some(v) = v {
            if !(v.is_finite() && v > 0.0) {
                return Err(field(name, v, "must be a positive number of milliseconds"));
            }
        }
    }
    if raw.instance.is_empty() {
        return Err(field(
            "instance",
            "[]",
            "a scenario needs at least one [[instance]]",
        ));
    }
    let roles: Vec<Role> = raw.instance.iter().map(|i| i.role).collect();
    let has = |r| roles.contains(&r);
    if has(Role::Mixed) && (has(Role::Prefill) || has(Role::Decode)) {
        return Err(field(
            "instance.role",
            "mixed + prefill/decode",
            "use either mixed instances or prefill and decode instances",
        ));
    }
    if has(Role::Prefill) != has(Role::Decode) {
        return Err(field(
            "instance.role",
            if has(Role::Prefill) {
                "prefill only"
            } else {
                "decode only"
            },
            "PD disaggregation needs both prefill and decode instances",
        ));
    }
    let mut names = std::collections::BTreeSet::new();
    let mut instances = Vec::new();
    for spec in &raw.instance {
        if !names.insert(spec.name.clone()) {
            return Err(field(
                "instance.name",
                &spec.name,
                "instance names must be unique",
            ));
        }
        let f = |k: &str| format!("instance.{}.{k}", spec.name);
        let mtp_tokens = match spec.mtp_tokens {
            None => raw.mtp.tokens,
            Some(n) => {
                let refused = if raw.mtp.tokens == 0 {
                    Some(
                        "sets this instance's MTP depth, but [mtp] tokens is 0 (MTP off): turn \
                         MTP on there first"
                            .to_string(),
                    )
                } else if n == 0 || n > max_drafts {
                    Some(format!(
                        "must be 1 to {max_drafts} draft tokens per step (MTP is turned off for \
                         every instance with [mtp] tokens = 0)"
                    ))
                } else {
                    None
                };
                if let Some(reason) = refused {
                    return Err(field(f("mtp_tokens"), n, reason));
                }
                n
            }
        };
        if spec.count == 0 {
            return Err(field(f("count"), 0, "must be at least 1"));
        }
        if spec.tp == 0 {
            return Err(field(f("tp"), 0, "must be at least 1"));
        }
        let s = &spec.scheduler;
        for (k, v) in [
            ("scheduler.max_num_batched_tokens", s.max_num_batched_tokens),
            ("scheduler.max_num_seqs", s.max_num_seqs),
            ("scheduler.block_size", s.block_size),
        ] {
            if v == 0 {
                return Err(field(f(k), 0, "must be at least 1"));
            }
        }
        for (k, v, max) in [
            (
                "scheduler.max_num_seqs",
                s.max_num_seqs,
                dstwin_core::batch::MAX_SEQS_PER_STEP,
            ),
            (
                "scheduler.max_num_batched_tokens",
                s.max_num_batched_tokens,
                dstwin_core::batch::MAX_TOKENS_PER_STEP,
            ),
        ] {
            if u64::from(v) > max {
                return Err(field(f(k), v, format!("must be at most {max} per DP rank")));
            }
        }
        for (k, v) in [
            ("scheduler.host_overhead_us", s.host_overhead_us),
            (
                "scheduler.host_overhead_per_seq_us",
                s.host_overhead_per_seq_us,
            ),
            (
                "scheduler.host_overhead_per_token_us",
                s.host_overhead_per_token_us,
            ),
        ] {
            if v.is_some_and(|v| !(v.is_finite() && v >= 0.0)) {
                return Err(field(
                    f(k),
                    v.unwrap_or_default(),
                    "must be a finite number of microseconds >= 0",
                ));
            }
        }
        if let Some(m) = s.max_model_len {
            if m == 0 {
                return Err(field(
                    f("scheduler.max_model_len"),
                    0,
                    format!(
                        "must be at least 1 token (the model's context is {})",
                        model.max_context
                    ),
                ));
            }
            if m as u64 > model.max_context {
                return Err(field(
                    f("scheduler.max_model_len"),
                    m,
                    format!("exceeds the model's context of {}", model.max_context),
                ));
            }
        }
        let layout = spec.layout_spec().layout();
        let plan = layout
            .validate(&model, &system)
            .map_err(|source| ScenarioError::Layout {
                instance: spec.name.clone(),
                source,
            })?;
        if s.enable_balance_scheduling && spec.role != Role::Mixed {
            return Err(field(
                f("scheduler.enable_balance_scheduling"),
                true,
                format!(
                    "needs a mixed instance, not {}: vllm-ascend refuses balance scheduling \
                     on a prefill or decode instance of a PD deployment",
                    spec.role.name()
                ),
            ));
        }
        if s.separate_prefill_batches && spec.role != Role::Mixed {
            return Err(field(
                f("scheduler.separate_prefill_batches"),
                true,
                format!(
                    "needs a mixed instance, not {}: only a mixed instance has both prompts \
                     and decodes to batch apart",
                    spec.role.name()
                ),
            ));
        }
        if s.admission != AdmissionSpec::Sglang {
            let sglang_only = [
                (
                    "schedule_conservativeness",
                    s.schedule_conservativeness != 1.0,
                    s.schedule_conservativeness.to_string(),
                ),
                (
                    "reserved_decode_tokens",
                    s.reserved_decode_tokens != 512,
                    s.reserved_decode_tokens.to_string(),
                ),
                ("ignore_eos", s.ignore_eos, s.ignore_eos.to_string()),
            ];
            if let Some((name, _, value)) = sglang_only.iter().find(|(_, set, _)| *set) {
                return Err(field(
                    f(&format!("scheduler.{name}")),
                    value,
                    "is read by SGLang's admission only: set admission = \"sglang\" too",
                ));
            }
        }
        if !(s.schedule_conservativeness.is_finite() && s.schedule_conservativeness > 0.0) {
            return Err(field(
                f("scheduler.schedule_conservativeness"),
                s.schedule_conservativeness,
                "must be a positive number (SGLang's --schedule-conservativeness; 1 is its default)",
            ));
        }
        if s.enable_balance_scheduling && s.separate_prefill_batches {
            return Err(field(
                f("scheduler.enable_balance_scheduling"),
                true,
                "not with separate_prefill_batches: the one is vllm-ascend's, the other SGLang's",
            ));
        }
        if s.enable_balance_scheduling && s.prefill_delay_passes > 0 {
            return Err(field(
                f("scheduler.enable_balance_scheduling"),
                true,
                "not with prefill_delay_passes: the one is vllm-ascend's, the other SGLang's",
            ));
        }
        if s.prefill_delay_passes > 0
            && (spec.role != Role::Mixed || plan.dp < 2 || !s.async_scheduling)
        {
            return Err(field(
                f("scheduler.prefill_delay_passes"),
                s.prefill_delay_passes,
                "needs a mixed instance of at least two DP ranks with async_scheduling = true \
                 (SGLang's prefill delayer negotiates between DP-attention ranks, and SGLang \
                 refuses it under PD and without its overlap scheduler)",
            ));
        }
        let features = spec.features();
        // Under MoE tensor parallelism every die holds every expert: nothing to place or move.
        if plan.moe_tp > 1 {
            let reason = "needs expert parallelism (ep = dies); under MoE tensor parallelism \
                          (ep = 1) every die holds every expert";
            if let Some(file) = &spec.placement {
                return Err(field(f("placement"), file, reason));
            }
            if raw.eplb.dynamic {
                return Err(field("eplb.dynamic", true, reason));
            }
        }
        let features = features
            .check_instance(&model, &system.chip.name, plan.tp, plan.moe_tp)
            .and_then(|()| features.resolve(&system.chip.name, s.max_num_seqs, mtp_tokens, plan.tp))
            .map_err(|e| field(f(e.field), e.value, e.reason))?;
        let share = |name: &str, v: f64| {
            if v > 0.0 && v <= 1.0 {
                Ok(v)
            } else {
                Err(field(f(name), v, "a share of HBM: above 0, at most 1"))
            }
        };
        let budget = match (spec.gpu_memory_utilization, spec.mem_fraction_static) {
            (Some(_), Some(s)) => {
                return Err(field(
                    f("mem_fraction_static"),
                    s,
                    "give gpu_memory_utilization (vLLM) or mem_fraction_static (SGLang), not both",
                ))
            }
            (Some(u), None) => {
                MemoryBudget::GpuMemoryUtilization(share("gpu_memory_utilization", u)?)
            }
            (None, Some(s)) => MemoryBudget::MemFractionStatic(share("mem_fraction_static", s)?),
            (None, None) => MemoryBudget::SystemReserve,
        };
        let mut memory = memory_map(
            &model,
            &plan,
            &system,
            &MemoryInputs {
                quant: raw.quant,
                kv_dtype,
                mtp_tokens,
                max_tokens_per_step: dstwin_core::memory::cp_tokens_per_die(
                    s.max_num_batched_tokens as u64,
                    plan.tp,
                    plan.dense_tp,
                    spec.enable_dsa_cp,
                ),
                dispatch_tokens_per_step: dstwin_core::memory::dispatch_tokens_per_die(
                    s.max_num_batched_tokens as u64,
                    &plan,
                ),
                budget,
                shared_expert_dp: features.shared_expert_dp,
                dcp: features.dcp,
            },
        )
        .map_err(|source| ScenarioError::Memory {
            instance: spec.name.clone(),
            source,
        })?;
        match spec.max_total_tokens {
            Some(0) => {
                return Err(field(
                    f("max_total_tokens"),
                    0,
                    "a KV pool of at least one token per DP rank",
                ))
            }
            Some(cap) => memory.kv_capacity_tokens = memory.kv_capacity_tokens.min(cap),
            None => {}
        }
        // Under decode context parallelism vLLM's scheduler counts blocks of block_size x DCP
        // tokens, each spread over the group's dies.
        let mut s = s.clone();
        s.block_size = s.block_size.saturating_mul(features.dcp);
        let s = &s;
        let kv_blocks_per_rank = memory.kv_capacity_tokens / s.block_size as u64;
        if kv_blocks_per_rank == 0 {
            return Err(field(
                f("scheduler.block_size"),
                spec.scheduler.block_size,
                "not one KV block fits on a die",
            ));
        }
        // Like vLLM, a context that cannot fit in one rank's KV cache is refused up front; without
        // an explicit value the limit is the smaller of the model's context and the KV capacity.
        let kv_tokens = kv_blocks_per_rank * s.block_size as u64;
        let max_model_len = match s.max_model_len {
            Some(m) if m as u64 > kv_tokens => {
                return Err(field(
                    f("scheduler.max_model_len"),
                    m,
                    format!("exceeds the KV capacity of {kv_tokens} tokens per DP rank ({}); lower it or free memory", match spec.max_total_tokens {
                        Some(cap) if cap <= kv_tokens + s.block_size as u64 => format!("max_total_tokens {cap}"),
                        _ => format!("{:.1} GB of KV per die", memory.kv_cache / 1e9),
                    }),
                ))
            }
            Some(m) => m as u64,
            None => model.max_context.min(kv_tokens),
        };
        if !s.enable_chunked_prefill && (s.max_num_batched_tokens as u64) < max_model_len {
            return Err(field(
                f("scheduler.max_num_batched_tokens"),
                s.max_num_batched_tokens,
                format!("must be at least max_model_len ({max_model_len}) when chunked prefill is off, or no long prompt could ever be scheduled"),
            ));
        }
        let eplb_policy = plan.placement_policy(raw.eplb.policy_for(spec.redundant_experts));
        instances.push(InstanceSetup {
            name: spec.name.clone(),
            count: spec.count,
            layout,
            plan,
            features,
            placement: spec.placement.clone(),
            eplb_policy,
            scheduler: s.clone(),
            memory,
            kv_blocks_per_rank,
            max_model_len,
            mtp_tokens,
        });
    }
    // In u64: count x dies of absurd values overflows u32 before the comparison says so.
    let dies: u64 = instances
        .iter()
        .map(|i| u64::from(i.count) * u64::from(i.plan.dies))
        .sum();
    if dies > u64::from(system.max_dies()) {
        return Err(field(
            "instance",
            format!("{dies} dies in all"),
            format!("exceeds the {} dies of {}", system.max_dies(), system.name),
        ));
    }
    let workload = raw.workload.validate()?;
    let ms = |v: Option<f64>| v.map(|x| SimDuration::from_secs_f64(x / 1e3));
    let frontend = SimDuration::from_secs_f64(
        raw.frontend_us
            .or(cost.params.host.as_ref().map(|h| h.request_us))
            .unwrap_or(0.0)
            * 1e-6,
    );
    Ok(Scenario {
        name: raw.name,
        description: raw.description,
        seed: raw.seed,
        model,
        quant: raw.quant,
        kv_dtype,
        cost,
        mtp: Mtp {
            tokens: raw.mtp.tokens,
            // No acceptance given: the calibrated one (the same at every draft position).
            acceptance: if raw.mtp.tokens > 0 {
                dstwin_twin::mtp::or_calibrated(raw.mtp.acceptance)
            } else {
                raw.mtp.acceptance
            },
        },
        proxy: raw.proxy,
        instances,
        eplb: raw.eplb.clone(),
        expert_load: raw.expert_load,
        workload,
        base_dir: base_dir.to_path_buf(),
        slo: Slo {
            ttft: ms(raw.slo.ttft_ms),
            tpot: ms(raw.slo.tpot_ms),
            e2e: ms(raw.slo.e2e_ms),
        },
        duration: raw.duration_s.map(SimDuration::from_secs_f64),
        warmup: SimDuration::from_secs_f64(raw.warmup_s),
        frontend,
        hash: fnv1a(&canonical),
        canonical,
    })
}
