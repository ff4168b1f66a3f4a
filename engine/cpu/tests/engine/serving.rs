//! The engine under dstwin's deployment core (the scheduler, the PD proxy, the KV hand-off):
//! greedy output is the model's own, token for token, however the scheduler cuts, places and
//! moves the work: chunk sizes, prefix hits, preemption and recompute, PD vs mixed, MTP on or
//! off, one DP rank or two (EP2); seeded sampling is reproducible across the same changes.
//! The drive loop here ([`serve_on`]) also serves the expert-parallel and profiling tests.

use crate::common::*;
use dstwin_core::batch::AttnCap;
use dstwin_core::deploy::{
    Arrival, Deployment, DeploymentConfig, Effect, EplbSpec, InstanceSpec, Note,
};
use dstwin_core::device::{Device, FinishReason, SamplingParams, StepOutcome, StepPlan};
use dstwin_core::eplb::Placement;
use dstwin_core::instance::InstanceConfig;
use dstwin_core::layout::Role;
use dstwin_core::pd::Policy;
use dstwin_core::time::SimTime;
use dstwin_cpu::device::MoveTotals;
use dstwin_cpu::{AttnPath, CpuDevice, CpuDeviceConfig, CpuFabric, DType, Model};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

pub fn shared() -> Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    M.get_or_init(|| Arc::new(tiny(DType::F32).clone())).clone()
}

/// One deployment layout to serve the same requests on.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub pd: bool,
    pub dp: u32,
    /// max_num_batched_tokens: small values chunk the prompts.
    pub budget: u32,
    pub blocks: u64,
    pub spec: u32,
    pub prefix: bool,
    pub send_back: bool,
}

pub const BASE: Layout = Layout {
    pd: false,
    dp: 1,
    budget: 256,
    blocks: 64,
    spec: 0,
    prefix: false,
    send_back: false,
};

fn config(l: &Layout, role: Role) -> InstanceConfig {
    InstanceConfig {
        role,
        dp_ranks: l.dp,
        max_num_batched_tokens: l.budget,
        max_num_seqs: 8,
        block_size: BLOCK_SIZE as u32,
        num_kv_blocks: l.blocks,
        enable_chunked_prefill: true,
        enable_prefix_caching: l.prefix,
        long_prefill_token_threshold: 0,
        prefill_delay_passes: 0,
        balance_scheduling: false,
        separate_prefill_batches: false,
        dp_dispatch: Default::default(),
        admission: Default::default(),
        max_model_len: 512,
        num_spec_tokens: l.spec,
        attn_cap: AttnCap(None),
        send_back: l.send_back,
        async_scheduling: false,
    }
}

/// What a run produced: token ids and finish reason per request, and instance totals.
#[derive(Debug, Default)]
pub struct Served {
    pub out: BTreeMap<u64, (Vec<u32>, FinishReason)>,
    pub preemptions: u64,
    pub prefix_hits: u64,
    pub sent_back: u64,
    pub preempted_notes: u64,
    pub accepted_drafts: u64,
    pub steps: u64,
    /// Steps whose plan carried an EPLB layer move, and the index of the first one.
    pub move_steps: u64,
    pub first_move_step: Option<u64>,
    /// What the devices' EPLB moves copied.
    pub moves: MoveTotals,
}

/// Where each instance's routed experts live and whether they move (`Default`: each expert
/// once, consecutive experts per rank, no rebalancing).
#[derive(Clone, Default)]
pub struct Experts {
    pub placement: Option<Placement>,
    pub eplb: Option<EplbSpec>,
}

/// Serves `prompts` (request i arrives at step `arrive[i]` of the driver loop) on `l`.
fn serve(
    l: Layout,
    prompts: &[Vec<u32>],
    arrive: &[u32],
    max_tokens: u32,
    s: &SamplingParams,
) -> Served {
    serve_with(l, prompts, arrive, max_tokens, s, |d| d)
}

/// [`serve`] with each device dressed by `dress` (a drafter).
fn serve_with(
    l: Layout,
    prompts: &[Vec<u32>],
    arrive: &[u32],
    max_tokens: u32,
    s: &SamplingParams,
    dress: impl Fn(CpuDevice) -> CpuDevice,
) -> Served {
    serve_on(
        l,
        prompts,
        arrive,
        max_tokens,
        s,
        &Experts::default(),
        dress,
        |_, _, _| {},
    )
}

/// [`serve_with`] with the experts placed (and moved) as `experts` says, and `observe` called
/// with each device after each of its steps.
#[allow(clippy::too_many_arguments)]
pub fn serve_on(
    l: Layout,
    prompts: &[Vec<u32>],
    arrive: &[u32],
    max_tokens: u32,
    s: &SamplingParams,
    experts: &Experts,
    dress: impl Fn(CpuDevice) -> CpuDevice,
    mut observe: impl FnMut(&CpuDevice, &StepPlan, &StepOutcome),
) -> Served {
    let model = shared();
    let roles: &[Role] = if l.pd {
        &[Role::Prefill, Role::Decode]
    } else {
        &[Role::Mixed]
    };
    let specs = roles
        .iter()
        .map(|&r| InstanceSpec {
            name: format!("{r:?}"),
            config: config(&l, r),
            acceptance: None,
            detail: true,
            emissions: true,
            eplb: experts.eplb.clone(),
        })
        .collect();
    let mut d = Deployment::new(
        DeploymentConfig {
            prefill_policy: Policy::LoadBalance,
            decode_policy: Policy::LoadBalance,
            kv_bytes_per_token: 1.0,
        },
        specs,
    );
    let mut devices: Vec<CpuDevice> = roles
        .iter()
        .map(|_| {
            CpuDevice::new(
                model.clone(),
                CpuDeviceConfig {
                    dp_ranks: l.dp,
                    kv_blocks_per_rank: l.blocks,
                    block_size: BLOCK_SIZE as u32,
                    spec_tokens: l.spec,
                    path: AttnPath::Auto,
                    seed: 3,
                    placement: experts.placement.clone(),
                },
            )
            .unwrap()
        })
        .map(dress)
        .collect();
    let mut fabric = CpuFabric::default();
    for dev in &devices {
        fabric.add_instance(dev.caches());
    }
    let mut served = Served::default();
    let mut effects = Vec::new();
    let mut notes = Vec::new();
    let mut out = StepOutcome::default();
    let mut t = SimTime::ZERO;
    let mut finished = 0;
    let mut steps = 0;
    for step in 0..5_000u32 {
        for (i, p) in prompts.iter().enumerate() {
            if arrive[i] == step {
                d.arrive(
                    t,
                    Arrival {
                        id: i as u64,
                        prompt_tokens: p.len() as u32,
                        max_tokens,
                        hash_ids: &[],
                        hash_block_tokens: 0,
                        token_ids: Some(p),
                        sampling: Some(s),
                    },
                )
                .unwrap();
            }
        }
        d.plan_steps(t);
        d.take_effects(&mut effects);
        t = SimTime(t.0 + 1_000_000);
        for e in effects.drain(..) {
            match e {
                Effect::Execute { inst } => {
                    steps += 1;
                    let plan = d.plan(inst as usize).clone();
                    devices[inst as usize].execute(&plan, &mut out).unwrap();
                    observe(&devices[inst as usize], &plan, &out);
                    if plan.expert_move.is_some() {
                        served.move_steps += 1;
                        served.first_move_step.get_or_insert(steps);
                    }
                    served.accepted_drafts += out
                        .accepted
                        .iter()
                        .flatten()
                        .map(|&a| a as u64)
                        .sum::<u64>();
                    d.step_done(t, inst, &out);
                }
                Effect::Transfer(x) => {
                    dstwin_core::device::Fabric::start(&mut fabric, t, &x).unwrap();
                }
            }
        }
        d.poll_transfers(t, &mut fabric);
        d.take_notes(&mut notes);
        for n in notes.drain(..) {
            match n {
                Note::Tokens { req, ids, .. } => served.out.entry(req).or_default().0.extend(ids),
                Note::Finished { req, reason, .. } => {
                    served.out.entry(req).or_default().1 = reason;
                    finished += 1;
                }
                Note::SentBack { .. } => served.sent_back += 1,
                Note::Preempted { .. } => served.preempted_notes += 1,
                _ => {}
            }
        }
        if finished == prompts.len() {
            break;
        }
    }
    assert_eq!(finished, prompts.len(), "every request finished on {l:?}");
    served.steps = steps;
    for dev in &devices {
        let m = dev.moves();
        served.moves.layers += m.layers;
        served.moves.slots += m.slots;
        served.moves.bytes += m.bytes;
    }
    for i in 0..roles.len() {
        let st = d.instance(i).stats();
        served.preemptions += st.preemptions;
        served.prefix_hits += st.prefix_hits;
    }
    served
}

/// The model's own greedy continuation and how it ends.
pub fn reference(
    model: &Model,
    prompt: &[u32],
    max_tokens: u32,
    ignore_eos: bool,
) -> (Vec<u32>, FinishReason) {
    let out = model
        .greedy(prompt, max_tokens as usize, ignore_eos)
        .unwrap();
    let eos = out
        .last()
        .is_some_and(|t| model.cfg.eos_token_ids.contains(t));
    let reason = if eos && !ignore_eos {
        FinishReason::Stop
    } else {
        FinishReason::Length
    };
    (out, reason)
}

/// The model's own greedy continuations of `ps`.
pub fn references(
    ps: &[Vec<u32>],
    max_tokens: u32,
    ignore_eos: bool,
) -> Vec<(Vec<u32>, FinishReason)> {
    ps.iter()
        .map(|p| reference(&shared(), p, max_tokens, ignore_eos))
        .collect()
}

/// Greedy, past the end-of-sequence token (every request runs to `max_tokens`).
pub fn greedy_past_eos() -> SamplingParams {
    SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy()
    }
}

/// Every request produced what `want` says.
pub fn assert_served(got: &Served, want: &[(Vec<u32>, FinishReason)], what: &str) {
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&got.out[&(i as u64)], w, "{what}: request {i}");
    }
}

pub fn prompts() -> Vec<Vec<u32>> {
    vec![prompt(37, 1), prompt(5, 2), prompt(70, 3)]
}

#[test]
fn greedy_output_is_the_models_own_on_every_layout() {
    let ps = prompts();
    let g = SamplingParams::greedy();
    let want = references(&ps, 12, false);
    let layouts = [
        ("mixed", BASE),
        (
            "chunked prefill (8-token budget)",
            Layout { budget: 8, ..BASE },
        ),
        ("two DP ranks", Layout { dp: 2, ..BASE }),
        (
            "PD with KV copied between instances",
            Layout { pd: true, ..BASE },
        ),
        ("MTP, one draft", Layout { spec: 1, ..BASE }),
        (
            "PD with MTP",
            Layout {
                pd: true,
                spec: 1,
                ..BASE
            },
        ),
        (
            "MTP, two drafts, chunked",
            Layout {
                spec: 2,
                budget: 16,
                ..BASE
            },
        ),
    ];
    for (name, l) in layouts {
        let got = serve(l, &ps, &[0, 0, 0], 12, &g);
        assert_served(&got, &want, name);
    }
}

#[test]
fn preemption_and_recompute_keep_the_output() {
    let ps = prompts();
    // Past EOS, so that every request holds its blocks to the end.
    let g = greedy_past_eos();
    let want = references(&ps, 24, true);
    // 9 blocks of 16 tokens for three requests of up to 94 tokens: someone must give way.
    let tight = Layout { blocks: 9, ..BASE };
    let got = serve(tight, &ps, &[0, 0, 0], 24, &g);
    assert!(got.preemptions > 0, "the layout preempts: {got:?}");
    assert_served(&got, &want, "preemption");
    // On PD, a decode instance short of KV sends requests back to prefill.
    let back = Layout {
        pd: true,
        send_back: true,
        blocks: 9,
        ..BASE
    };
    let got = serve(back, &ps, &[0, 0, 0], 24, &g);
    assert!(got.sent_back > 0, "the layout sends back");
    assert_served(&got, &want, "send-back");
}

#[test]
fn a_prefix_hit_reuses_the_cached_kv() {
    let p = prompt(70, 9);
    let ps = vec![p.clone(), p];
    let g = SamplingParams::greedy();
    let want = reference(&shared(), &ps[0], 8, false);
    let l = Layout {
        prefix: true,
        ..BASE
    };
    // The second arrives once the first's prompt is computed.
    let got = serve(l, &ps, &[0, 3], 8, &g);
    assert!(got.prefix_hits >= 64, "hits: {}", got.prefix_hits);
    assert_eq!(got.out[&0], want);
    assert_eq!(got.out[&1], want);
}

#[test]
fn seeded_sampling_is_reproducible_across_layouts() {
    let ps = prompts();
    let s = SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        seed: Some(42),
        ..SamplingParams::default()
    };
    let base = serve(BASE, &ps, &[0, 0, 0], 12, &s).out;
    for l in [
        Layout { budget: 8, ..BASE },
        Layout { pd: true, ..BASE },
        Layout { dp: 2, ..BASE },
        Layout { spec: 1, ..BASE },
    ] {
        assert_eq!(serve(l, &ps, &[0, 0, 0], 12, &s).out, base, "{l:?}");
    }
    // It is sampling: not the greedy continuation.
    let greedy = serve(BASE, &ps, &[0, 0, 0], 12, &SamplingParams::greedy()).out;
    assert_ne!(base, greedy);
}

#[test]
fn drafts_are_verified_by_the_model() {
    // The MTP module of a random model rarely guesses right; drafters of known quality show
    // that verification keeps exactly the model's tokens: an oracle's drafts all stand (fewer
    // steps), a liar's all fall, and the output is the model's either way.
    let ps = prompts();
    let g = greedy_past_eos();
    let want = references(&ps, 16, true);
    let plain = serve(BASE, &ps, &[0, 0, 0], 16, &g);
    for spec in [1, 3] {
        let l = Layout { spec, ..BASE };
        let truth: Vec<Vec<u32>> = ps
            .iter()
            .zip(&want)
            .map(|(p, w)| [p.clone(), w.0.clone()].concat())
            .collect();
        let oracle = serve_with(l, &ps, &[0, 0, 0], 16, &g, |d| {
            let truth = truth.clone();
            d.with_drafter(Box::new(move |req, tokens, k| {
                let t = &truth[req as usize];
                t[tokens.len().min(t.len())..(tokens.len() + k).min(t.len())].to_vec()
            }))
        });
        let liar = serve_with(l, &ps, &[0, 0, 0], 16, &g, |d| {
            let truth = truth.clone();
            d.with_drafter(Box::new(move |req, tokens, k| {
                let t = &truth[req as usize];
                (0..k)
                    .map(|i| t.get(tokens.len() + i).map_or(2, |&x| 2 + (x + 1) % 300))
                    .collect()
            }))
        });
        for (i, w) in want.iter().enumerate() {
            assert_eq!(
                &oracle.out[&(i as u64)],
                w,
                "oracle, {spec} drafts: request {i}"
            );
            assert_eq!(
                &liar.out[&(i as u64)],
                w,
                "liar, {spec} drafts: request {i}"
            );
        }
        assert_eq!(liar.accepted_drafts, 0);
        assert!(oracle.accepted_drafts >= 20, "{spec} drafts: {oracle:?}");
        assert!(
            oracle.steps < plain.steps,
            "{} vs {}",
            oracle.steps,
            plain.steps
        );
    }
}
