//! The deployment core through its public API: a PD request's path (prefill, KV hand-off,
//! decode), the blocks a transfer names, refusals, aborts, and token hashes.

use dstwin_core::batch::AttnCap;
use dstwin_core::deploy::{
    token_hashes, Arrival, Deployment, DeploymentConfig, Effect, InstanceSpec, Note, Refusal,
};
use dstwin_core::device::{StepOutcome, StepPlan};
use dstwin_core::instance::InstanceConfig;
use dstwin_core::layout::Role;
use dstwin_core::pd::Policy;
use dstwin_core::time::SimTime;

fn cfg(role: Role, blocks: u64) -> InstanceConfig {
    InstanceConfig {
        role,
        dp_ranks: 1,
        max_num_batched_tokens: 256,
        max_num_seqs: 8,
        block_size: 16,
        num_kv_blocks: blocks,
        enable_chunked_prefill: true,
        enable_prefix_caching: true,
        long_prefill_token_threshold: 0,
        prefill_delay_passes: 0,
        balance_scheduling: false,
        separate_prefill_batches: false,
        dp_dispatch: Default::default(),
        admission: Default::default(),
        max_model_len: 4096,
        num_spec_tokens: 0,
        attn_cap: AttnCap(None),
        send_back: false,
        async_scheduling: false,
    }
}

fn spec(name: &str, c: InstanceConfig) -> InstanceSpec {
    InstanceSpec {
        name: name.into(),
        config: c,
        acceptance: None,
        detail: false,
        emissions: true,
        eplb: None,
    }
}

fn pd() -> Deployment {
    pd_with_detail(false)
}

/// A prefill and a decode instance; `detail`: their plans carry per-request entries.
fn pd_with_detail(detail: bool) -> Deployment {
    let mut specs = vec![
        spec("prefill", cfg(Role::Prefill, 64)),
        spec("decode", cfg(Role::Decode, 64)),
    ];
    for s in &mut specs {
        s.detail = detail;
    }
    Deployment::new(
        DeploymentConfig {
            prefill_policy: Policy::LoadBalance,
            decode_policy: Policy::LoadBalance,
            kv_bytes_per_token: 10.0,
        },
        specs,
    )
}

/// Drives a deployment with instant steps and transfers until nothing is left; returns the
/// notes.
fn drive(d: &mut Deployment) -> Vec<Note> {
    drive_seeing(d, |_, _| {})
}

/// [`drive`], showing `see` each instance's plan before it runs.
fn drive_seeing(d: &mut Deployment, mut see: impl FnMut(u32, &StepPlan)) -> Vec<Note> {
    let mut notes = Vec::new();
    let mut effects = Vec::new();
    let mut t = SimTime::ZERO;
    for _ in 0..10_000 {
        d.plan_steps(t);
        d.take_effects(&mut effects);
        d.take_notes(&mut notes);
        if effects.is_empty() {
            break;
        }
        t = SimTime(t.0 + 1000);
        for e in effects.drain(..) {
            match e {
                Effect::Execute { inst } => {
                    let plan = d.plan(inst as usize).clone();
                    see(inst, &plan);
                    let outcome = StepOutcome {
                        accepted: plan.ranks.iter().map(|r| vec![0; r.decode.len()]).collect(),
                        ..Default::default()
                    };
                    d.step_done(t, inst, &outcome);
                }
                Effect::Transfer(x) => d.transfer_done(t, x.req),
            }
        }
    }
    d.take_notes(&mut notes);
    notes
}

#[test]
fn a_pd_request_prefills_moves_its_kv_and_decodes() {
    let mut d = pd();
    d.arrive(
        SimTime::ZERO,
        Arrival {
            id: 7,
            prompt_tokens: 40,
            max_tokens: 3,
            hash_ids: &[],
            hash_block_tokens: 0,
            token_ids: None,
            sampling: None,
        },
    )
    .unwrap();
    let notes = drive(&mut d);
    let kinds: Vec<&str> = notes
        .iter()
        .filter_map(|n| match n {
            Note::Started { .. } => Some("started"),
            Note::PrefillDone { .. } => Some("prefill_done"),
            Note::KvSent { .. } => Some("kv_sent"),
            Note::KvArrived { .. } => Some("kv_arrived"),
            Note::First { .. } => Some("first"),
            Note::Finished { .. } => Some("finished"),
            _ => None,
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "started",
            "prefill_done",
            "kv_sent",
            "kv_arrived",
            "first",
            "finished"
        ]
    );
    let tokens: u32 = notes
        .iter()
        .map(|n| match n {
            Note::Tokens { n, .. } => *n,
            _ => 0,
        })
        .sum();
    assert_eq!(tokens, 3);
    assert_eq!(d.in_flight(), 0);
    // Both sides freed their blocks.
    assert_eq!(d.instance(0).kv_usage(), 0.0);
    assert_eq!(d.instance(1).kv_usage(), 0.0);
}

#[test]
fn a_transfer_names_the_blocks_on_both_sides() {
    let mut d = pd();
    d.arrive(
        SimTime::ZERO,
        Arrival {
            id: 1,
            prompt_tokens: 40,
            max_tokens: 2,
            hash_ids: &[],
            hash_block_tokens: 0,
            token_ids: None,
            sampling: None,
        },
    )
    .unwrap();
    let mut effects = Vec::new();
    d.plan_steps(SimTime::ZERO);
    d.take_effects(&mut effects);
    assert_eq!(effects, vec![Effect::Execute { inst: 0 }]);
    let outcome = StepOutcome {
        accepted: vec![vec![0]],
        ..Default::default()
    };
    d.step_done(SimTime(10), 0, &outcome);
    d.plan_steps(SimTime(10));
    effects.clear();
    d.take_effects(&mut effects);
    let Some(Effect::Transfer(x)) = effects.first() else {
        panic!("a transfer: {effects:?}");
    };
    // 40 tokens in blocks of 16: three blocks on each side, 400 bytes.
    assert_eq!((x.from.instance, x.to.instance), (0, 1));
    assert_eq!(x.from.blocks.len(), 3);
    assert_eq!(x.to.blocks.len(), 3);
    assert_eq!(x.bytes, 400.0);
}

#[test]
fn too_long_is_refused_and_noted() {
    let mut d = pd();
    let e = d.arrive(
        SimTime::ZERO,
        Arrival {
            id: 1,
            prompt_tokens: 4000,
            max_tokens: 200,
            hash_ids: &[],
            hash_block_tokens: 0,
            token_ids: None,
            sampling: None,
        },
    );
    assert_eq!(
        e,
        Err(Refusal::TooLong {
            tokens: 4200,
            max: 4096
        })
    );
    let mut notes = Vec::new();
    d.take_notes(&mut notes);
    assert!(matches!(notes[0], Note::Rejected { req: 1, .. }));
}

#[test]
fn an_abort_frees_the_kv_on_every_instance() {
    let mut d = pd();
    d.arrive(
        SimTime::ZERO,
        Arrival {
            id: 1,
            prompt_tokens: 100,
            max_tokens: 50,
            hash_ids: &[],
            hash_block_tokens: 0,
            token_ids: None,
            sampling: None,
        },
    )
    .unwrap();
    d.plan_steps(SimTime::ZERO);
    assert!(d.instance(0).kv_usage() > 0.0);
    // The prefill step is in flight: the abort waits for it, then frees.
    assert!(d.abort(SimTime(5), 1));
    let outcome = StepOutcome {
        accepted: vec![vec![0]],
        ..Default::default()
    };
    d.step_done(SimTime(10), 0, &outcome);
    assert_eq!(d.instance(0).kv_usage(), 0.0);
    assert_eq!(d.in_flight(), 0);
    assert!(!d.abort(SimTime(11), 1));
}

#[test]
fn token_hashes_cover_full_chunks_only() {
    let ids: Vec<u32> = (0..40).collect();
    assert_eq!(token_hashes(&ids, 16).len(), 2);
    assert_eq!(token_hashes(&ids[..16], 16), token_hashes(&ids[..20], 16));
    assert_ne!(token_hashes(&ids[..16], 16), token_hashes(&ids[1..17], 16));
}

#[test]
fn the_core_runs_the_rebalance_cycle_from_the_devices_heat() {
    use dstwin_core::deploy::EplbSpec;
    use dstwin_core::device::ExpertHeat;
    use dstwin_core::eplb::cycle::{CycleConfig, Rebalancer};
    use dstwin_core::eplb::{place, EpLayout, Policy as Eplb};
    let layout = EpLayout {
        slots: 4,
        dies: 2,
        dies_per_node: 2,
        groups: 1,
    };
    // Two MoE layers of four experts, placed for an even load: experts 0 and 1 on die 0.
    let even = vec![vec![0.25; 4]; 2];
    let placement = place(Eplb::Identity, &even, &layout).unwrap();
    let mut c = cfg(Role::Mixed, 64);
    c.max_num_seqs = 1;
    let mut sp = spec("mixed", c);
    sp.eplb = Some(EplbSpec {
        rebalancer: Rebalancer::new(
            CycleConfig {
                heat_interval: 2,
                algorithm_interval: 1,
                policy: Eplb::Greedy,
            },
            layout,
            2,
            4,
        ),
        placement,
        top_k: 2.0,
        shares: None,
    });
    let mut d = Deployment::new(
        DeploymentConfig {
            prefill_policy: Policy::LoadBalance,
            decode_policy: Policy::LoadBalance,
            kv_bytes_per_token: 1.0,
        },
        vec![sp],
    );
    d.arrive(
        SimTime::ZERO,
        Arrival {
            id: 1,
            prompt_tokens: 10,
            max_tokens: 20,
            hash_ids: &[],
            hash_block_tokens: 0,
            token_ids: None,
            sampling: None,
        },
    )
    .unwrap();
    // The routers see experts 0 and 1 hot: the cycle must split them across the dies, one
    // layer per step, through the plans.
    let hot = vec![vec![10.0, 10.0, 1.0, 1.0]; 2];
    let mut moves = Vec::new();
    let mut effects = Vec::new();
    for k in 0..20u64 {
        let t = SimTime(k * 1000);
        d.plan_steps(t);
        effects.clear();
        d.take_effects(&mut effects);
        if effects.is_empty() {
            break;
        }
        if let Some(m) = &d.plan(0).expert_move {
            moves.push(m.clone());
        }
        let outcome = StepOutcome {
            accepted: vec![vec![0]],
            expert_heat: Some(ExpertHeat::Counts(hot.clone())),
            ..Default::default()
        };
        d.step_done(SimTime(k * 1000 + 500), 0, &outcome);
    }
    // Heat for two steps, the algorithm for one, then layer 0 and layer 1.
    assert_eq!(moves.iter().map(|m| m.layer).collect::<Vec<_>>(), [0, 1]);
    for m in &moves {
        let die0: Vec<u32> = m.placement.phy2log[..2].to_vec();
        assert!(
            !(die0.contains(&0) && die0.contains(&1)),
            "the hot experts are split: {die0:?}"
        );
        assert!(m.max_slots_per_die > 0);
    }
}

#[test]
fn sampling_parameters_reach_each_instance_with_the_token_ids() {
    use dstwin_core::device::SamplingParams;
    let mut d = pd_with_detail(true);
    let sampling = SamplingParams {
        temperature: 0.3,
        seed: Some(11),
        ..SamplingParams::default()
    };
    let prompt: Vec<u32> = (0..40).collect();
    d.arrive(
        SimTime::ZERO,
        Arrival {
            id: 7,
            prompt_tokens: 40,
            max_tokens: 4,
            hash_ids: &[],
            hash_block_tokens: 0,
            token_ids: Some(&prompt),
            sampling: Some(&sampling),
        },
    )
    .unwrap();
    // Per instance, the sampling each scheduled entry of request 7 carried, in step order.
    let mut seen: [Vec<Option<SamplingParams>>; 2] = Default::default();
    drive_seeing(&mut d, |inst, plan| {
        for r in plan.ranks.iter().flat_map(|r| &r.reqs) {
            assert_eq!(
                r.sampling.is_some(),
                r.token_ids.is_some(),
                "sampling comes with the token ids"
            );
            seen[inst as usize].push(r.sampling.as_deref().cloned());
        }
    });
    for (inst, s) in seen.iter().enumerate() {
        assert_eq!(s.first(), Some(&Some(sampling.clone())), "instance {inst}");
        assert!(s[1..].iter().all(Option::is_none), "instance {inst}: {s:?}");
    }
    assert!(
        seen[1].len() >= 3,
        "the decode instance ran the request's steps"
    );
}
