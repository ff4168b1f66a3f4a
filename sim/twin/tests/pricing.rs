//! Pricing steps: more tokens are never cheaper; the critical path adds up.

use dstwin_core::batch::BatchShape;
use dstwin_core::features::Resolved;
use dstwin_core::layout::{Layout, Plan, Role};
use dstwin_core::model::{builtin, ModelConfig, Quant};
use dstwin_core::opgraph::{
    every_die_load, expert_reads, step_ops, step_part_ops_into, DieSet, MoeLoad, Part, StepSpec,
};
use dstwin_hwmodels::{Catalog, CostModel, DType};
use dstwin_twin::pricing::{
    on_path, price, price_memo, price_sums, shared_expert_overlap, two_microbatch_time, OpMemo,
    OpPrice, PathOp, PricedOp, StepCost,
};
use proptest::prelude::*;

/// DeepSeek-R1 w8a8 on CloudMatrix384 in `layout`: the cost model and what a step spec borrows.
struct Setup {
    cm: CostModel,
    m: ModelConfig,
    plan: Plan,
    features: Resolved,
}

impl Setup {
    fn new(layout: Layout) -> Self {
        let cat = Catalog::builtin();
        let sys = cat.system("cloudmatrix384").unwrap();
        let m = builtin("r1").unwrap();
        Setup {
            cm: cat.cost_model(sys, None).unwrap(),
            plan: layout.validate(&m, sys).unwrap(),
            m,
            features: Resolved::plain("ascend-910c"),
        }
    }

    /// A twin pricer's spec for this setup, without MTP.
    fn pricer_spec(&self) -> dstwin_twin::device::PricerSpec {
        dstwin_twin::device::PricerSpec {
            model: self.m.clone(),
            quant: Quant::W8a8,
            kv_dtype: DType::Bf16,
            plan: self.plan.clone(),
            mtp_tokens: 0,
            features: self.features.clone(),
            cost: self.cm.clone(),
        }
    }

    fn spec(&self, mtp_tokens: u32) -> StepSpec<'_> {
        StepSpec {
            model: &self.m,
            quant: Quant::W8a8,
            kv_dtype: DType::Bf16,
            plan: &self.plan,
            mtp_tokens,
            features: &self.features,
        }
    }
}

fn step_time(decode_seqs: u32, ctx: u64, prefill: u64, dies: u32) -> f64 {
    let st = Setup::new(Layout::dp_ep(Role::Mixed, dies));
    let mut shape = BatchShape::uniform_decode(decode_seqs, 1, ctx, st.m.attn_cap());
    shape.add_prefill(prefill, 0, st.m.attn_cap());
    let load = MoeLoad {
        group_tokens: shape.tokens() * dies as u64,
        imbalance: 1.0,
        comm: dstwin_core::features::MoeCommUsed::Mc2,
    };
    price(&step_ops(st.spec(0), &shape, &load), &st.cm).serial_s
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn more_tokens_are_never_cheaper(seqs in 1u32..128, ctx in 1u64..32768, prefill in 0u64..8192, more in 1u32..64, dies_pow in 0u32..6) {
        let dies = 1 << dies_pow;
        let dies = if 256 % dies == 0 { dies } else { 1 };
        let a = step_time(seqs, ctx, prefill, dies);
        prop_assert!(step_time(seqs + more, ctx, prefill, dies) >= a);
        prop_assert!(step_time(seqs, ctx + more as u64, prefill, dies) >= a);
        prop_assert!(step_time(seqs, ctx, prefill + more as u64, dies) >= a);
    }
}

#[test]
fn critical_path_is_compute_plus_communication() {
    let st = Setup::new(Layout {
        redundant_experts: 32,
        shared_expert_dies: 32,
        ..Layout::dp_ep(Role::Decode, 320)
    });
    let (cm, m, spec) = (&st.cm, &st.m, st.spec(1));
    let shape = BatchShape::uniform_decode(48, 2, 4096, m.attn_cap());
    let load = MoeLoad {
        group_tokens: shape.tokens() * 320,
        imbalance: 1.0,
        comm: dstwin_core::features::MoeCommUsed::Mc2,
    };
    let s = price(&step_ops(spec, &shape, &load), cm);
    assert!((s.serial_s - s.compute_s - s.comm_s).abs() < 1e-12);
    let by_class: f64 = s.by_class().values().sum();
    assert!((by_class - s.serial_s).abs() < 1e-9);
    assert!(s.roofline_s < s.compute_s);
    // Overlap never beats the larger of compute and communication.
    let half = BatchShape::uniform_decode(24, 2, 4096, m.attn_cap());
    let hl = MoeLoad {
        group_tokens: half.tokens() * 320,
        imbalance: 1.0,
        comm: dstwin_core::features::MoeCommUsed::Mc2,
    };
    let h = price(&step_ops(spec, &half, &hl), cm);
    let mut perfect = cm.params.clone();
    perfect.overlap_efficiency_low_latency = 1.0;
    let mut none = cm.params.clone();
    none.overlap_efficiency_low_latency = 0.0;
    let best = two_microbatch_time(&h.path, &perfect);
    assert!(best >= s.compute_s.max(s.comm_s) * 0.5);
    // Without overlap the halves run one after the other: never faster than the best case,
    // and the overlap efficiency moves the step monotonically between the two.
    let worst = two_microbatch_time(&h.path, &none);
    assert!(worst > best);
    assert!(worst >= h.serial_s * 2.0 - 1e-12);
    let mut mid = cm.params.clone();
    mid.overlap_efficiency_low_latency = 0.5;
    let m = two_microbatch_time(&h.path, &mid);
    assert!(best < m && m < worst);
    // A decode step's all-to-all is low-latency: the normal-mode efficiency does not touch it.
    let mut other = perfect.clone();
    other.overlap_efficiency_normal = 0.0;
    assert_eq!(two_microbatch_time(&h.path, &other), best);
}

/// The same value to the bit (`Debug` prints every float's shortest round-trip form).
fn bits<T: std::fmt::Debug>(x: &T) -> String {
    format!("{x:?}")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    /// A memo of each position's last op price changes no price: a run of op lists (decode and
    /// prefill shapes, loads and communication modes in turn, so that positions hold other ops
    /// and other work) priced through one memo equals each list priced afresh. The lean
    /// records and the sums the twin device's cache keeps ([`PathOp`], `price_sums`) give the
    /// step's rules the same bits as the full ones.
    #[test]
    fn memoized_op_prices_equal_fresh_ones(
        steps in proptest::collection::vec(
            (0u32..64, 1u64..8192, 0u64..4096, 1u64..100_000, 100u32..300, any::<bool>()),
            1..24,
        ),
    ) {
        let st = Setup::new(Layout::dp_ep(Role::Mixed, 32));
        let (cm, m, spec) = (&st.cm, &st.m, st.spec(1));
        let (mut memo, mut lean_memo, mut sums_memo) =
            (OpMemo::default(), OpMemo::default(), OpMemo::default());
        for (seqs, ctx, prefill, group, imbalance, mc2) in steps {
            let mut shape = BatchShape::uniform_decode(seqs, 2, ctx, m.attn_cap());
            shape.add_prefill(prefill, 0, m.attn_cap());
            let load = MoeLoad {
                group_tokens: group,
                imbalance: imbalance as f64 / 100.0,
                comm: if mc2 {
                    dstwin_core::features::MoeCommUsed::Mc2
                } else {
                    dstwin_core::features::MoeCommUsed::AllToAll
                },
            };
            let ops = step_ops(spec, &shape, &load);
            let fresh = price(&ops, cm);
            let memoized: StepCost<PricedOp> = price_memo(&ops, cm, &mut memo);
            prop_assert_eq!(bits(&memoized), bits(&fresh));
            prop_assert_eq!(bits(&memoized.sums), bits(&fresh.sums));
            let lean: StepCost<PathOp> = price_memo(&ops, cm, &mut lean_memo);
            prop_assert_eq!(lean.ops.len(), fresh.ops.len());
            for (l, f) in lean.ops.iter().zip(&fresh.ops) {
                prop_assert_eq!(*l, f.path());
            }
            prop_assert_eq!(lean.slow_set(), fresh.slow_set());
            prop_assert_eq!(lean.a2a_mode(), fresh.a2a_mode());
            prop_assert_eq!(
                bits(&[lean.serial_s, lean.compute_s, lean.comm_s]),
                bits(&[fresh.serial_s, fresh.compute_s, fresh.comm_s])
            );
            prop_assert_eq!(bits(&lean.sums), bits(&fresh.sums));
            prop_assert_eq!(bits(&price_sums(&ops, cm, &mut sums_memo)), bits(&fresh.sums));
            prop_assert_eq!(
                bits(&two_microbatch_time(&lean.path, &cm.params)),
                bits(&two_microbatch_time(&fresh.path, &cm.params))
            );
            prop_assert_eq!(
                bits(&shared_expert_overlap(&lean.path)),
                bits(&shared_expert_overlap(&fresh.path))
            );
        }
    }

    /// A step priced in its two parts, each under only what fixes it, is the step priced
    /// whole, to the bit: the batch part under another load, the MoE part for another batch
    /// with the same tokens (and sequences, which a later MTP draft reads). This is what lets
    /// the twin device cache the parts apart.
    #[test]
    fn a_step_priced_in_parts_is_the_step_priced_whole(
        seqs in 0u32..64, ctx in 1u64..8192, prefill in 0u64..4096, cached in 0u64..4096,
        group in 1u64..100_000, imbalance in 100u32..300, other in 100u32..300,
        mtp in 0u32..3, shared_dies in any::<bool>(),
    ) {
        let st = Setup::new(Layout {
            redundant_experts: 32,
            shared_expert_dies: if shared_dies { 32 } else { 0 },
            ..Layout::dp_ep(Role::Mixed, if shared_dies { 320 } else { 288 })
        });
        let (cm, m, spec) = (&st.cm, &st.m, st.spec(mtp));
        let mut shape = BatchShape::uniform_decode(seqs, 1 + mtp as u64, ctx, m.attn_cap());
        shape.add_prefill(prefill, cached, m.attn_cap());
        let load = |imbalance: u32| MoeLoad {
            group_tokens: group,
            imbalance: imbalance as f64 / 100.0,
            comm: dstwin_core::features::MoeCommUsed::AllToAll,
        };
        let whole = price(&step_ops(spec, &shape, &load(imbalance)), cm);
        let part = |shape: &BatchShape, load: &MoeLoad, part: Part| {
            let mut ops = Vec::new();
            step_part_ops_into(spec, shape, load, part, &mut ops);
            price_sums(&ops, cm, &mut OpMemo::default())
        };
        // The batch part, priced under another load.
        let batch = part(&shape, &load(other), Part::Batch).batch;
        // The MoE part, for the same tokens and sequences at a longer context.
        let mut longer = BatchShape::uniform_decode(seqs, 1 + mtp as u64, ctx + 777, m.attn_cap());
        longer.add_prefill(prefill, cached + 99, m.attn_cap());
        let moe = part(&longer, &load(imbalance), Part::Moe).moe;
        prop_assert_eq!(bits(&batch), bits(&whole.sums.batch));
        prop_assert_eq!(bits(&moe), bits(&whole.sums.moe));
        // The MoE part's die sets apart, each under only what fixes it: the every-die ops'
        // sums under another group size (which `every_die_load` drops here), the expert
        // dies' for a batch of other tokens (where `expert_reads` reads the same).
        let regrouped = MoeLoad { group_tokens: group + 1234, ..load(imbalance) };
        prop_assert_eq!(every_die_load(&regrouped), every_die_load(&load(imbalance)));
        let every = part(&shape, &regrouped, Part::Moe).moe[DieSet::All as usize];
        prop_assert_eq!(bits(&every), bits(&whole.sums.moe[DieSet::All as usize]));
        let mut more = shape;
        more.add_prefill(321, 0, m.attn_cap());
        if expert_reads(&spec, &more) == expert_reads(&spec, &shape) {
            let experts = part(&more, &load(imbalance), Part::Moe).moe;
            prop_assert_eq!(bits(&&experts[1..]), bits(&&whole.sums.moe[1..]));
        }
        let (slow, path) = on_path(&batch, moe.each_ref());
        prop_assert_eq!(slow, whole.slow_set());
        prop_assert_eq!(bits(&path), bits(&whole.path));
        prop_assert_eq!(
            bits(&[path.total_s(), path.compute_s, path.comm_s]),
            bits(&[whole.serial_s, whole.compute_s, whole.comm_s])
        );
    }
}

/// Pricers of one setup share their prices: what one instance priced is a hit for another,
/// and a shared price, its time by op class included, equals the price a pricer of its own
/// computes.
#[test]
fn shared_prices_are_the_prices_a_pricer_computes_alone() {
    use dstwin_core::features::MoeCommUsed;
    use dstwin_twin::device::{StepLoad, StepPricer};
    let st = Setup::new(Layout::dp_ep(Role::Prefill, 32));
    let spec = || st.pricer_spec();
    let cap = st.m.attn_cap();
    let shapes: Vec<BatchShape> = [(4096, 0), (4096, 4096), (2048, 1024), (3000, 0)]
        .iter()
        .map(|&(t, cached)| {
            let mut s = BatchShape::default();
            s.add_prefill(t, cached, cap);
            s
        })
        .collect();
    let load = StepLoad::new(4096 * 32, 1.3, MoeCommUsed::AllToAll);
    let first = StepPricer::new(spec());
    let (mut a, mut b, mut alone) = (first.share(), first.share(), StepPricer::new(spec()));
    for s in &shapes[..2] {
        a.step().rank_cost(s, load);
    }
    assert_eq!((a.hits, a.misses), (0, 2));
    for s in &shapes {
        let (mut shared, mut own) = (b.step(), alone.step());
        let (x, y) = (shared.rank_cost(s, load), own.rank_cost(s, load));
        assert_eq!(x.time_s, y.time_s);
        assert_eq!(shared.class_times(x), own.class_times(y));
    }
    // The two shapes `a` priced were hits for `b`; the others were its own misses.
    assert_eq!((b.hits, b.misses), (2, 2));
    assert_eq!((alone.hits, alone.misses), (0, 4));
}

/// A pricer keeps its own copies of the prices it looked up last (hundreds of ranks share a
/// few dozen shapes): with more shapes than copies, in any order and from any rank, every
/// price is the one a fresh pricer computes, and only a new key is a miss.
#[test]
fn a_pricers_own_copies_are_the_shared_prices() {
    use dstwin_core::features::MoeCommUsed;
    use dstwin_twin::device::{StepLoad, StepPricer};
    let st = Setup::new(Layout::dp_ep(Role::Prefill, 32));
    let spec = || st.pricer_spec();
    let cap = st.m.attn_cap();
    // 127 x 3 shapes whose quantized keys all differ (sums below 128 are kept exactly), under
    // two loads: more keys than a pricer keeps copies of.
    let mut shapes = Vec::new();
    for t in 1..128u64 {
        for cached in [0, 64, 100] {
            let mut s = BatchShape::default();
            s.add_prefill(t, cached, cap);
            shapes.push(s);
        }
    }
    let loads = [
        StepLoad::new(4096, 1.3, MoeCommUsed::AllToAll),
        StepLoad::new(8192, 1.1, MoeCommUsed::AllToAll),
    ];
    let mut alone = StepPricer::new(spec());
    let mut want = Vec::new();
    for &load in &loads {
        for s in &shapes {
            let mut p = alone.step();
            let c = p.rank_cost(s, load);
            want.push((c.time_s, p.class_times(c)));
        }
    }
    assert_eq!(alone.misses as usize, want.len(), "every key differs");
    let mut near = StepPricer::new(spec());
    let n = shapes.len();
    // Forwards, backwards, then forwards again, each price as DP rank `i % 7`.
    let order: Vec<usize> = (0..2 * n).chain((0..2 * n).rev()).chain(0..2 * n).collect();
    for (step, &i) in order.iter().enumerate() {
        let mut p = near.step();
        let c = p.rank_cost_of(step % 7, &shapes[i % n], loads[i / n]);
        assert_eq!((c.time_s, p.class_times(c)), want[i], "key {i}");
    }
    assert_eq!(near.misses as usize, want.len());
    assert_eq!((near.hits + near.misses) as usize, order.len());
}

/// A step's ranks added together are priced as one at a time would price them: the slowest
/// price (the dummy batch among them) with its times by op class, and every rank keeps its
/// key for the next step (which then prices from the ranks' last keys alone).
#[test]
fn a_steps_ranks_priced_together_give_the_slowest_first_rank() {
    use dstwin_core::features::MoeCommUsed;
    use dstwin_twin::device::{StepLoad, StepPricer};
    let st = Setup::new(Layout::dp_ep(Role::Decode, 32));
    let spec = st.pricer_spec();
    let cap = st.m.attn_cap();
    // 32 ranks over 5 shapes, the slowest (most sequences) at ranks 3, 8, 13, ...
    let shape =
        |r: u32| BatchShape::uniform_decode(1 + [1, 7, 2, 40, 5][r as usize % 5], 1, 2048, cap);
    let dummy = BatchShape::uniform_decode(1, 1, 1, cap);
    let load = StepLoad::new(32 * 20, 1.2, MoeCommUsed::Mc2);
    let mut alone = StepPricer::new(spec.clone());
    let want: Vec<_> = (0..32)
        .map(|r| alone.step().rank_cost(&shape(r), load))
        .collect();
    let max = want.iter().map(|c| c.time_s).fold(f64::MIN, f64::max);
    assert_eq!(want[3].time_s, max);
    let mut p = StepPricer::new(spec);
    for step in 0..2 {
        let mut s = p.step();
        s.add(None, &dummy, load);
        for r in 0..32 {
            s.add(Some(r as usize), &shape(r), load);
        }
        let slowest = s.slowest().unwrap();
        assert_eq!(slowest.time_s, want[3].time_s, "step {step}");
        // Times by op class are the first slowest rank's.
        let mut a = alone.step();
        assert_eq!(s.class_times(slowest), a.class_times(want[3]));
    }
    // The first step priced 6 keys (5 shapes and the dummy) and found the rest; the second
    // found every rank's key as the rank left it, and the dummy's copy.
    assert_eq!((p.misses, p.hits), (6, 27 + 33));
    // A rank added to a step that never asked for its slowest is not the next step's.
    p.step().add(
        Some(40),
        &shape(3),
        StepLoad::new(32 * 400, 2.0, MoeCommUsed::Mc2),
    );
    let mut s = p.step();
    s.add(Some(0), &shape(0), load);
    assert_eq!(s.slowest().unwrap().time_s, want[0].time_s);
}

/// The device's pass over a plan: a rank outside the instance is refused; a step whose prompt
/// chunks are as short as a decode's query costs what the same tokens as decodes cost, and
/// ranks with equal shapes, next to each other or not, cost one price.
#[test]
fn the_device_prices_a_plan_as_its_ranks() {
    use dstwin_core::device::{Capacity, Device, DeviceError, RankPlan, StepOutcome, StepPlan};
    use dstwin_twin::device::{SimDevice, StepPricer};
    use dstwin_twin::mtp::Acceptance;
    let st = Setup::new(Layout::dp_ep(Role::Decode, 32));
    let cap = st.m.attn_cap();
    let capacity = Capacity {
        dp_ranks: 32,
        kv_blocks_per_rank: 1000,
        block_size: 128,
        kv_bytes_per_token: 1.0,
        memory: None,
    };
    let device = || {
        let pricer = StepPricer::new(st.pricer_spec());
        SimDevice::new(pricer, Acceptance::new(&[], 1), capacity, None)
    };
    let plan = |shapes: &[BatchShape]| StepPlan {
        dp_ranks: 32,
        ranks: shapes
            .iter()
            .enumerate()
            .map(|(r, &shape)| RankPlan {
                rank: r as u32,
                shape,
                ..RankPlan::default()
            })
            .collect(),
        expert_move: None,
    };
    let run = |p: &StepPlan| {
        let mut out = StepOutcome::default();
        device().execute(p, &mut out).map(|()| out.duration)
    };
    let decodes = BatchShape::uniform_decode(16, 1, 2000, cap);
    let mut outside = plan(&[decodes]);
    outside.ranks[0].rank = 32;
    assert!(matches!(run(&outside), Err(DeviceError::Ranks { .. })));
    // One-token prompt chunks (a hand-off's recompute) are priced as decodes.
    let mut chunks = BatchShape::uniform_decode(15, 1, 2000, cap);
    chunks.add_prefill(1, 1999, cap);
    let mut as_decodes = BatchShape::uniform_decode(15, 1, 2000, cap);
    as_decodes.add_decode(1, 1999, cap);
    assert_eq!(chunks.short_chunks_as_decode(1), as_decodes);
    assert!(chunks.short_chunks(1) && !chunks.short_chunks(0) && !decodes.short_chunks(1));
    let t = |shapes: &[BatchShape]| run(&plan(shapes)).unwrap();
    assert_eq!(t(&[chunks]), t(&[as_decodes]));
    // Equal shapes, adjacent or not, cost one price: the step is its slowest rank's,
    // whatever the order (the same ranks, so the same EP group's load).
    let small = BatchShape::uniform_decode(2, 1, 100, cap);
    let slowest = t(&[decodes, decodes, small, decodes]);
    assert_eq!(slowest, t(&[small, decodes, decodes, decodes]));
    assert_eq!(slowest, t(&[decodes, small, decodes, decodes]));
    assert!(t(&[small, small, small, small]) < slowest);
}
