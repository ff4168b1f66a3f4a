//! Expert parallelism across the DP ranks of an instance: the placement decides which rank
//! computes each routed expert (a rank holding no copy of an expert never computes it, router
//! counts match what was dispatched), and greedy output stays the model's own on every DP x EP
//! layout, on every placement (redundant replicas included) and across dynamic EPLB rebalances
//! that move expert weights mid-generation.

use crate::common::*;
use crate::serving::{
    assert_served, greedy_past_eos, prompts, references, serve_on, shared, Experts, Layout, BASE,
};
use dstwin_core::deploy::EplbSpec;
use dstwin_core::device::{ExpertHeat, SamplingParams, StepOutcome};
use dstwin_core::eplb::cycle::{CycleConfig, Rebalancer};
use dstwin_core::eplb::{place, EpLayout, LayerPlacement, Placement, Policy};
use dstwin_cpu::ep::ExpertRanks;
use dstwin_cpu::moe::Ffn;
use dstwin_cpu::{AttnPath, CpuDevice, Model, Profiler, RankBatch, SeqInput};

const EXPERTS: usize = 16;

fn layout(ranks: u32, slots: u32) -> EpLayout {
    EpLayout {
        slots,
        dies: ranks,
        dies_per_node: ranks,
        groups: 4,
    }
}

/// MoE layers of the tiny model (decoder, then MTP).
fn moe_layers() -> usize {
    shared().moe_layers().len()
}

/// A skewed load per layer, different in each.
fn skewed() -> Vec<Vec<f64>> {
    (0..moe_layers())
        .map(|l| {
            (0..EXPERTS)
                .map(|e| 1.0 / (1 + (e * 5 + l * 3) % EXPERTS) as f64)
                .collect()
        })
        .collect()
}

fn placed(policy: Policy, ranks: u32, redundant: u32) -> Placement {
    place(
        policy,
        &skewed(),
        &layout(ranks, EXPERTS as u32 + redundant),
    )
    .unwrap()
}

/// A placement from explicit slot contents, the same in every layer.
fn explicit(phy2log: &[u32], ranks: u32) -> Placement {
    let mut replicas = vec![0; EXPERTS];
    for &e in phy2log {
        replicas[e as usize] += 1;
    }
    Placement {
        policy: Policy::Identity,
        slots_per_die: phy2log.len() as u32 / ranks,
        layers: vec![
            LayerPlacement {
                phy2log: phy2log.to_vec(),
                replicas,
            };
            moe_layers()
        ],
    }
}

/// The checkpoint's weights of expert `e` in MoE layer `layer`.
fn checkpoint_expert(model: &Model, layer: usize, e: usize) -> Vec<f32> {
    model.moe_layers()[layer]
        .experts
        .get(e)
        .unwrap()
        .weights_f32()
        .unwrap()
}

/// After a step: each slot computed exactly the rows its placement sent it (source rank `r`
/// sends expert `e` to replica `r mod n` of `e`'s slots), only slots holding an expert computed
/// it, and the heat the device reports is what the routers dispatched.
fn check_dispatch(dev: &CpuDevice, out: &StepOutcome) {
    let ex = dev.experts();
    let mut heat: Vec<Vec<f64>> = Vec::new();
    for d in dev.last_dispatch() {
        let phy2log = ex.phy2log(d.layer);
        let mut sent = vec![0u32; phy2log.len()];
        for (&rank, routed) in d.ranks.iter().zip(&d.routed) {
            for (e, &n) in routed.iter().enumerate() {
                let replicas: Vec<usize> = (0..phy2log.len())
                    .filter(|&s| phy2log[s] as usize == e)
                    .collect();
                let slot = ex.slot_for(d.layer, rank, e);
                assert_eq!(
                    slot,
                    replicas[rank % replicas.len()],
                    "replica of expert {e} for rank {rank}"
                );
                sent[slot] += n;
            }
        }
        assert_eq!(
            d.computed, sent,
            "layer {}: rows computed per slot",
            d.layer
        );
        if heat.len() <= d.layer {
            heat.resize(d.layer + 1, vec![0.0; EXPERTS]);
        }
        for routed in &d.routed {
            for (h, &n) in heat[d.layer].iter_mut().zip(routed) {
                *h += n as f64;
            }
        }
    }
    assert_eq!(out.expert_heat, Some(ExpertHeat::Counts(heat)));
}

/// Every slot of every layer holds its expert's weights (copies of the checkpoint's).
fn check_weights(model: &Model, ex: &ExpertRanks) {
    for layer in 0..ex.layers() {
        for (slot, &e) in ex.phy2log(layer).iter().enumerate() {
            assert!(
                ex.slot(layer, slot).weights_f32().unwrap()
                    == checkpoint_expert(model, layer, e as usize),
                "layer {layer} slot {slot} holds other weights than expert {e}'s"
            );
        }
    }
}

#[test]
fn greedy_output_is_the_models_own_on_every_dp_ep_layout_and_placement() {
    let ps = prompts();
    let g = SamplingParams::greedy();
    let want = references(&ps, 12, false);
    // Slot s holds expert (5 s + 3) mod 16: no rank holds consecutive experts.
    let scrambled: Vec<u32> = (0..EXPERTS as u32).map(|s| (5 * s + 3) % 16).collect();
    let cases: Vec<(&str, Layout, Experts)> = vec![
        ("DP1/EP1", BASE, Experts::default()),
        ("DP2/EP2", Layout { dp: 2, ..BASE }, Experts::default()),
        ("DP4/EP4", Layout { dp: 4, ..BASE }, Experts::default()),
        (
            "DP4/EP4, greedy EPLB with 4 redundant experts",
            Layout { dp: 4, ..BASE },
            Experts {
                placement: Some(placed(Policy::Greedy, 4, 4)),
                eplb: None,
            },
        ),
        (
            "DP2/EP2, DeepSeek's global EPLB with 6 redundant experts",
            Layout { dp: 2, ..BASE },
            Experts {
                placement: Some(placed(Policy::Global, 2, 6)),
                eplb: None,
            },
        ),
        (
            "DP4/EP4, scrambled",
            Layout { dp: 4, ..BASE },
            Experts {
                placement: Some(explicit(&scrambled, 4)),
                eplb: None,
            },
        ),
        (
            "DP4/EP4 with MTP and 4 redundant experts, chunked",
            Layout {
                dp: 4,
                spec: 2,
                budget: 16,
                ..BASE
            },
            Experts {
                placement: Some(placed(Policy::Greedy, 4, 4)),
                eplb: None,
            },
        ),
        (
            "PD, DP2/EP2 each",
            Layout {
                dp: 2,
                pd: true,
                ..BASE
            },
            Experts::default(),
        ),
    ];
    for (name, l, experts) in cases {
        let mut steps = 0;
        let got = serve_on(
            l,
            &ps,
            &[0, 0, 0],
            12,
            &g,
            &experts,
            |d| d,
            |dev, _, out| {
                check_dispatch(dev, out);
                steps += 1;
            },
        );
        assert!(steps > 0);
        assert_served(&got, &want, name);
    }
}

#[test]
fn a_dynamic_rebalance_mid_generation_moves_real_weights_and_keeps_the_output() {
    let ps = prompts();
    let g = greedy_past_eos();
    let want = references(&ps, 24, true);
    for (l, redundant) in [
        (Layout { dp: 4, ..BASE }, 4),
        (
            Layout {
                dp: 2,
                spec: 1,
                ..BASE
            },
            2,
        ),
    ] {
        let lay = layout(l.dp, EXPERTS as u32 + redundant);
        let layers = moe_layers();
        // Start from the identity placement; the cycle re-places from the routers' counts.
        let start = place(Policy::Identity, &vec![vec![0.0; EXPERTS]; layers], &lay).unwrap();
        let experts = Experts {
            placement: Some(start.clone()),
            eplb: Some(EplbSpec {
                rebalancer: Rebalancer::new(
                    CycleConfig {
                        heat_interval: 4,
                        algorithm_interval: 1,
                        policy: Policy::Greedy,
                    },
                    lay,
                    layers,
                    EXPERTS,
                ),
                placement: start,
                top_k: 4.0,
                shares: None,
            }),
        };
        let model = shared();
        let got = serve_on(
            l,
            &ps,
            &[0, 0, 0],
            24,
            &g,
            &experts,
            |d| d,
            |dev, plan, out| {
                check_dispatch(dev, out);
                if let Some(m) = &plan.expert_move {
                    // The move is installed: the slots hold the new experts' weights.
                    assert_eq!(
                        dev.experts().phy2log(m.layer),
                        m.placement.phy2log.as_slice()
                    );
                    for (slot, &e) in m.placement.phy2log.iter().enumerate() {
                        assert!(
                            dev.experts().slot(m.layer, slot).weights_f32().unwrap()
                                == checkpoint_expert(&model, m.layer, e as usize),
                            "layer {} slot {slot} holds other weights than expert {e}'s",
                            m.layer
                        );
                    }
                }
            },
        );
        assert!(got.moves.slots > 0, "{l:?}: weights moved: {got:?}");
        assert!(
            got.move_steps >= 2 && got.first_move_step.is_some_and(|f| f + 4 < got.steps),
            "{l:?}: the moves happen mid-generation: {got:?}"
        );
        assert_served(&got, &want, &format!("{l:?}"));
    }
}

/// Logits of `ids` run on `rank` of `experts` (a one-sequence batch; the other ranks only
/// compute experts).
fn logits_on(model: &Model, experts: &ExpertRanks, rank: usize, ids: &[u32]) -> Vec<Vec<f32>> {
    let mut c = cache(model);
    let b = blocks(0, ids.len());
    let seqs = [SeqInput {
        blocks: &b,
        computed: 0,
        tokens: ids,
        logits: 3,
    }];
    let mut batches = [RankBatch {
        rank,
        cache: &mut c,
        seqs: &seqs,
    }];
    let f = model
        .forward_ranks(&mut batches, experts, AttnPath::Auto, &mut Profiler::off())
        .unwrap();
    let d = &f.dispatch;
    // Only slots of experts the routers chose computed, on whichever rank holds them.
    for l in d {
        assert_eq!(l.ranks, vec![rank]);
        assert_eq!(
            l.computed.iter().sum::<u32>(),
            l.routed[0].iter().sum::<u32>(),
            "every routed row computed once"
        );
    }
    f.ranks[0].logits.to_vec2().unwrap()
}

/// An expert whose weights are zero: it adds nothing to its tokens.
fn poisoned(model: &Model) -> dstwin_cpu::moe::Expert {
    let Ffn::Moe(m) = &model.layers[model.cfg.dense_layers].ffn else {
        panic!("the first layer after the dense ones is MoE")
    };
    let w = m.experts.get(0).unwrap().to_mlp().unwrap();
    let zero = |l: &dstwin_cpu::linear::Linear| match l {
        dstwin_cpu::linear::Linear::Dense(t) => {
            dstwin_cpu::linear::Linear::Dense(t.zeros_like().unwrap())
        }
        q => q.clone(),
    };
    dstwin_cpu::moe::Expert::new(dstwin_cpu::moe::Mlp {
        gate: zero(&w.gate),
        up: zero(&w.up),
        down: zero(&w.down),
    })
    .unwrap()
}

#[test]
fn the_placement_decides_which_rank_computes_each_expert() {
    let model = shared();
    let ids = prompt(24, 7);
    let single = prompt_logits(&model, &ids, 3, AttnPath::Auto);
    // Every expert on both ranks: rank 0 sends to its own copies (replica 0), rank 1 to its own
    // (replica 1).
    let both: Vec<u32> = (0..2).flat_map(|_| 0..EXPERTS as u32).collect();
    let mut ex = ExpertRanks::place(&model, &explicit(&both, 2), 2).unwrap();
    check_weights(&model, &ex);
    assert!(
        logits_on(&model, &ex, 0, &ids) == single,
        "EP equals one process"
    );
    assert!(logits_on(&model, &ex, 1, &ids) == single);
    // Poison rank 1's copies: a batch on rank 0 never touches them, one on rank 1 does.
    for layer in 0..ex.layers() {
        for slot in EXPERTS..2 * EXPERTS {
            ex.set_slot(layer, slot, poisoned(&model));
        }
    }
    assert!(
        logits_on(&model, &ex, 0, &ids) == single,
        "rank 1's copies unused"
    );
    assert!(
        logits_on(&model, &ex, 1, &ids) != single,
        "rank 1's copies used"
    );

    // Each expert once, rank 0 holding experts 0-7 and rank 1 experts 8-15: a batch on rank 1
    // has its tokens for experts 0-7 computed by rank 0 and for 8-15 by itself, so poisoning
    // either rank's slots changes rank 1's output.
    let halves: Vec<u32> = (0..EXPERTS as u32).collect();
    let clean = ExpertRanks::place(&model, &explicit(&halves, 2), 2).unwrap();
    assert!(logits_on(&model, &clean, 1, &ids) == single);
    for poison_rank in 0..2 {
        let mut ex = clean.clone();
        for layer in 0..ex.layers() {
            for slot in poison_rank * 8..(poison_rank + 1) * 8 {
                ex.set_slot(layer, slot, poisoned(&model));
            }
        }
        assert!(
            logits_on(&model, &ex, 1, &ids) != single,
            "rank {poison_rank}'s experts serve rank 1's tokens"
        );
    }
}

#[test]
fn moves_copy_weights_from_the_slots_that_held_them() {
    let model = shared();
    let halves: Vec<u32> = (0..EXPERTS as u32).collect();
    let mut ex = ExpertRanks::place(&model, &explicit(&halves, 2), 2).unwrap();
    // Swap the ranks' halves in layer 1: every slot receives another expert.
    let swapped: Vec<u32> = (0..EXPERTS as u32).map(|s| (s + 8) % 16).collect();
    let target = explicit(&swapped, 2);
    let moved = ex.install(1, &target.layers[1]).unwrap();
    assert_eq!(moved.slots, EXPERTS);
    let expert_bytes = model.moe_layers()[1].experts.get(0).unwrap().bytes();
    assert_eq!(moved.bytes, EXPERTS * expert_bytes);
    assert_eq!(ex.phy2log(1), swapped.as_slice());
    check_weights(&model, &ex);
    // The same placement again moves nothing.
    assert_eq!(ex.install(1, &target.layers[1]).unwrap().slots, 0);
    // A move that leaves an expert without a slot is refused by name.
    let mut bad = target.layers[1].clone();
    bad.phy2log[0] = bad.phy2log[1];
    let err = ex.install(1, &bad).unwrap_err().to_string();
    assert!(err.contains("without a slot"), "{err}");
    // A placement whose slots do not divide over the ranks is refused.
    let three = placed(Policy::Greedy, 1, 3);
    let err = ExpertRanks::place(&model, &three, 2)
        .unwrap_err()
        .to_string();
    assert!(err.contains("19 slots"), "{err}");
}
