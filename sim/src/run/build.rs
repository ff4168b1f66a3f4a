//! From a scenario to a deployment: each instance's scheduler configuration and twin device,
//! the deployment core's specs, and the twin fabric. Shared by the simulator and by
//! `serve --device twin`.

use super::RunError;
use crate::scenario::{AdmissionSpec, InstanceSetup, PreemptionSpec, Scenario};
use dstwin_core::deploy::{DeploymentConfig, EplbSpec, InstanceSpec};
use dstwin_core::device::{Capacity, Device};
use dstwin_core::eplb::cycle::{CycleConfig, Rebalancer};
use dstwin_core::eplb::{place, EpLayout, Placement};
use dstwin_core::features::Platform;
use dstwin_core::instance::{AdmissionRule, InstanceConfig, SglangAdmission};
use dstwin_core::layout::Role;
use dstwin_core::model::{index_key_dtype, kv_bytes};
use dstwin_hwmodels::{A2aMode, Comm, CommKind};
use dstwin_twin::device::{Experts, HostOverhead, PricerSpec, SimDevice, StepPricer, StepSpread};
use dstwin_twin::expert_load::{ExpertLoad, ExpertLoadSpec};
use dstwin_twin::fabric::TwinFabric;
use dstwin_twin::mtp::Acceptance;

/// Mixed into the scenario's seed for each instance's step-time draws (`[host] step_sigma`), so
/// that they are not the expert load's.
const STEP_SPREAD_SALT: u64 = 0x5bd_0000;

/// The routed experts of one instance as the twin sees them (load model, first placement, the
/// price of moving one expert's weights onto a die) and, with dynamic EPLB, the rebalance cycle
/// the deployment core runs.
fn experts_for(
    s: &Scenario,
    setup: &InstanceSetup,
    spec: &ExpertLoadSpec,
    mtp_layers: u64,
    index: u64,
) -> Result<(Experts, Option<EplbSpec>), RunError> {
    let plan = &setup.plan;
    let layers = (s.model.moe_layers() + mtp_layers) as usize;
    let experts = s.model.routed_experts as usize;
    let load = ExpertLoad::new(
        spec,
        layers,
        experts,
        s.seed ^ 0xe1b_0000 ^ index,
        &s.base_dir,
    )?;
    let layout = EpLayout {
        slots: s.model.routed_experts as u32 + plan.redundant_experts,
        dies: plan.routed_dies,
        dies_per_node: s.system().dies_per_node(),
        groups: s.model.router_groups as u32,
    };
    let eplb_err = |source| RunError::Eplb {
        instance: setup.name.clone(),
        source,
    };
    let placement =
        match &setup.placement {
            Some(file) => load_placement(&s.base_dir.join(file), layers, experts, &layout)
                .map_err(|message| RunError::Placement {
                    instance: setup.name.clone(),
                    file: file.clone(),
                    message,
                })?,
            None => place(setup.eplb_policy, load.shares(), &layout).map_err(eplb_err)?,
        };
    let eplb = s.eplb.dynamic.then(|| EplbSpec {
        rebalancer: Rebalancer::new(
            CycleConfig {
                heat_interval: s.eplb.heat_interval,
                algorithm_interval: s.eplb.algorithm_interval,
                policy: setup.eplb_policy,
            },
            layout,
            layers,
            experts,
        ),
        placement: placement.clone(),
        top_k: s.model.top_k as f64,
        shares: Some(load.shares_arc().clone()),
    });
    let expert_bytes = s.model.expert_params() as f64 * s.quant.expert_weight().bytes();
    // Moving an expert: its weights cross the EP group's fabric, are read from the source die's
    // HBM and written to the destination's (the copy is not overlapped with the step).
    let move_s = s
        .cost
        .comm(&Comm {
            kind: CommKind::P2p,
            bytes: expert_bytes,
            group: plan.ep,
            mode: A2aMode::Normal,
            copies: 0.0,
        })
        .time_s
        + 2.0 * expert_bytes / s.system().chip.hbm_bytes_per_s();
    let reports_heat = eplb.is_some();
    Ok((
        Experts::new(
            load,
            placement,
            reports_heat,
            move_s,
            spec.concentration(),
            s.model.top_k as u32,
        ),
        eplb,
    ))
}

/// Reads a placement file: `dstwin eplb --json` output or a bare placement object.
fn load_placement(
    path: &std::path::Path,
    layers: usize,
    experts: usize,
    layout: &EpLayout,
) -> Result<Placement, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let p: Placement = serde_json::from_value(v.get("placement").cloned().unwrap_or(v))
        .map_err(|e| e.to_string())?;
    p.check(layers, experts, layout)
        .map_err(|e| e.to_string())?;
    Ok(p)
}

pub(crate) fn instance_config(setup: &InstanceSetup, s: &Scenario) -> InstanceConfig {
    let sc = &setup.scheduler;
    InstanceConfig {
        role: setup.plan.role,
        dp_ranks: setup.plan.dp,
        max_num_batched_tokens: sc.max_num_batched_tokens,
        max_num_seqs: sc.max_num_seqs,
        block_size: sc.block_size,
        num_kv_blocks: setup.kv_blocks_per_rank,
        enable_chunked_prefill: sc.enable_chunked_prefill,
        enable_prefix_caching: sc.enable_prefix_caching,
        long_prefill_token_threshold: sc.long_prefill_token_threshold,
        max_model_len: setup.max_model_len,
        num_spec_tokens: setup.mtp_tokens,
        attn_cap: s.model.attn_cap(),
        send_back: sc.preemption == PreemptionSpec::SendBack,
        async_scheduling: sc.async_scheduling,
        prefill_delay_passes: sc.prefill_delay_passes,
        balance_scheduling: sc.enable_balance_scheduling,
        separate_prefill_batches: sc.separate_prefill_batches,
        dp_dispatch: sc.dp_dispatch,
        admission: match sc.admission {
            AdmissionSpec::Vllm => AdmissionRule::Vllm,
            AdmissionSpec::Sglang => AdmissionRule::Sglang(SglangAdmission::new(
                sc.schedule_conservativeness,
                sc.ignore_eos && !sc.enable_prefix_caching,
                sc.reserved_decode_tokens,
            )),
        },
    }
}

/// One instance of a scenario, ready to run: its name (`decode`, `prefill[2]`), the index of its
/// `[[instance]]` setup, its scheduler configuration and its twin device.
pub struct BuiltInstance {
    pub name: String,
    pub setup: usize,
    pub config: InstanceConfig,
    pub device: SimDevice,
    /// Its rebalance cycle (dynamic EPLB), run by the deployment core.
    pub eplb: Option<EplbSpec>,
    /// The expert placement it starts with (the scenario's EPLB policy on its expected load, or
    /// its placement file); `None` under perfect balance. A real engine places its experts so.
    pub placement: Option<Placement>,
}

/// KV bytes one context token takes across the model's layers (with MTP layers when MTP is on):
/// what a PD hand-off moves per prompt token. MTP is on or off for the whole deployment (an
/// instance's `mtp_tokens` sets only its depth), so the scenario's `[mtp]` decides.
pub fn kv_bytes_per_token(s: &Scenario) -> f64 {
    let mtp_layers = if s.mtp.tokens > 0 {
        s.model.mtp_layers
    } else {
        0
    };
    let ascend = Platform::of_chip(&s.system().chip.name).is_ascend();
    let index = index_key_dtype(&s.model, s.kv_dtype, ascend);
    kv_bytes(&s.model, s.kv_dtype, index, mtp_layers).per_token
}

/// Builds every instance of a scenario with its twin device: what the virtual-time driver runs,
/// and what `serve --device twin` runs in wall-clock time.
pub fn build_instances(s: &Scenario) -> Result<Vec<BuiltInstance>, RunError> {
    let mtp_layers = if s.mtp.tokens > 0 {
        s.model.mtp_layers
    } else {
        0
    };
    let kv_bytes_per_token = kv_bytes_per_token(s);
    let mut out = Vec::new();
    for (k, setup) in s.instances.iter().enumerate() {
        // The instances of one setup price alike: they share their prices.
        let prices = StepPricer::new(PricerSpec {
            model: s.model.clone(),
            quant: s.quant,
            kv_dtype: s.kv_dtype,
            plan: setup.plan.clone(),
            mtp_tokens: setup.mtp_tokens,
            features: setup.features.clone(),
            cost: s.cost.clone(),
        });
        for c in 0..setup.count {
            let index = out.len() as u64;
            let pricer = prices.share();
            // Acceptance is a property of the request and its sampling step, the same on every
            // instance.
            let mtp = Acceptance::new(&s.mtp.acceptance, s.seed);
            let capacity = Capacity {
                dp_ranks: setup.plan.dp,
                kv_blocks_per_rank: setup.kv_blocks_per_rank,
                block_size: setup.scheduler.block_size,
                kv_bytes_per_token,
                memory: Some(setup.memory),
            };
            let (experts, eplb) = match s.expert_load {
                ExpertLoadSpec::Perfect => (None, None),
                ref spec => {
                    let (e, eplb) = experts_for(s, setup, spec, mtp_layers, index)?;
                    (Some(e), eplb)
                }
            };
            let placement = experts.as_ref().map(|e| e.placement.clone());
            let sc = &setup.scheduler;
            // The scenario's host time, else the cost file's (fitted from an engine's trace).
            let host = s.cost.params.host.as_ref();
            let step_us = sc
                .host_overhead_us
                .or(host.map(|h| h.step_us))
                .unwrap_or(0.0);
            let per_seq_us = sc
                .host_overhead_per_seq_us
                .or(host.map(|h| h.per_seq_us))
                .unwrap_or(0.0);
            let per_token_us = sc
                .host_overhead_per_token_us
                .or(host.map(|h| h.per_token_us))
                .unwrap_or(0.0);
            let device = SimDevice::new(pricer, mtp, capacity, experts)
                .with_host(HostOverhead {
                    step_s: step_us * 1e-6,
                    per_seq_s: per_seq_us * 1e-6,
                    per_token_s: per_token_us * 1e-6,
                    overlapped: sc.async_scheduling,
                    eager_s: dstwin_twin::pricing::eager_launch_s(
                        &s.cost,
                        &s.model,
                        setup.mtp_tokens,
                    ),
                    cold: host
                        .and_then(|h| h.cold_after_us.zip(h.cold_factor))
                        .map(|(after_us, factor)| (after_us * 1e-6, factor)),
                })
                .with_spread(StepSpread::new(
                    host.map_or(0.0, |h| h.step_sigma),
                    s.seed ^ STEP_SPREAD_SALT ^ index,
                ))
                .with_span(s.dies());
            out.push(BuiltInstance {
                name: if setup.count > 1 {
                    format!("{}[{c}]", setup.name)
                } else {
                    setup.name.clone()
                },
                setup: k,
                config: instance_config(setup, s),
                device,
                eplb,
                placement,
            });
        }
    }
    Ok(out)
}

/// The deployment core's settings for a scenario.
pub fn deployment_config(s: &Scenario) -> DeploymentConfig {
    DeploymentConfig {
        prefill_policy: s.proxy.prefill_policy,
        decode_policy: s.proxy.decode_policy,
        kv_bytes_per_token: kv_bytes_per_token(s),
    }
}

impl BuiltInstance {
    /// The deployment core's description of this instance. `step_by_step` withholds the
    /// device's acceptance model so that every request is stepped every step.
    pub fn spec(&self, step_by_step: bool, emissions: bool) -> InstanceSpec {
        InstanceSpec {
            name: self.name.clone(),
            config: self.config,
            acceptance: if step_by_step {
                None
            } else {
                self.device.acceptance()
            },
            detail: self.device.wants_requests(),
            emissions,
            eplb: self.eplb.clone(),
        }
    }
}

/// The twin fabric of a deployment: one ingress link per DP rank of every decode or mixed
/// instance, its dies' share of the fabric level that joins prefill and decode instances.
pub fn build_fabric(s: &Scenario, built: &[BuiltInstance]) -> TwinFabric {
    let mut f = TwinFabric::default();
    for b in built {
        let plan = &s.instances[b.setup].plan;
        if plan.role == Role::Prefill {
            f.add_instance(None);
        } else {
            let mut x = b.device.ingress();
            x.bytes_per_s *= plan.tp as f64;
            f.add_instance(Some((x, plan.dp)));
        }
    }
    f
}
