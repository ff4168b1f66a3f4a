//! EPLB placements: every expert placed, slots respected, never worse than the identity
//! placement, deterministic.

use dstwin_core::eplb::{balancedness, place, EpLayout, EplbError, Policy};
use proptest::prelude::*;

fn layout(slots: u32, dies: u32) -> EpLayout {
    EpLayout {
        slots,
        dies,
        dies_per_node: dies,
        groups: 1,
    }
}

#[test]
fn identity_puts_slot_i_on_expert_i_mod_e() {
    let p = place(Policy::Identity, &[vec![1.0; 4]], &layout(6, 3)).unwrap();
    assert_eq!(p.layers[0].phy2log, vec![0, 1, 2, 3, 0, 1]);
    assert_eq!(p.layers[0].replicas, vec![2, 2, 1, 1]);
    assert_eq!(p.slots_per_die, 2);
}

#[test]
fn the_hottest_expert_gets_the_redundant_slots() {
    // One expert carries half the load; two redundant slots, one slot per die.
    let load = vec![vec![60.0, 10.0, 10.0, 10.0, 10.0, 10.0]];
    let p = place(Policy::Global, &load, &layout(8, 8)).unwrap();
    assert_eq!(p.layers[0].replicas, vec![3, 1, 1, 1, 1, 1]);
    let ident = place(Policy::Identity, &load, &layout(8, 8)).unwrap();
    let (b, bi) = (p.balancedness(&load)[0], ident.balancedness(&load)[0]);
    // Identity replicates experts 0 and 1: the hot expert splits in two (30 per die).
    assert!((bi - (110.0 / 8.0) / 30.0).abs() < 1e-12, "{bi}");
    assert!((b - (110.0 / 8.0) / 20.0).abs() < 1e-12, "{b}");
}

#[test]
fn cloudmatrix_ep320_places_one_expert_per_routed_die() {
    // 256 routed experts + 32 redundant on the 288 routed dies (32 more hold the shared expert).
    let load: Vec<Vec<f64>> = (0..3)
        .map(|l| {
            (0..256)
                .map(|e| 1.0 + ((e * 37 + l * 11) % 97) as f64)
                .collect()
        })
        .collect();
    for policy in [Policy::Global, Policy::Greedy] {
        let p = place(policy, &load, &layout(288, 288)).unwrap();
        assert_eq!(p.slots_per_die, 1);
        for lp in &p.layers {
            assert_eq!(lp.phy2log.len(), 288);
            assert_eq!(lp.replicas.iter().sum::<u32>(), 288);
            assert!(lp.replicas.iter().all(|&r| r >= 1));
        }
    }
}

#[test]
fn hierarchical_needs_groups_that_divide_over_nodes() {
    let load = vec![vec![1.0; 256]];
    let l = EpLayout {
        slots: 288,
        dies: 288,
        dies_per_node: 16,
        groups: 8,
    };
    let err = place(Policy::Hierarchical, &load, &l).unwrap_err();
    assert!(matches!(err, EplbError::Hierarchy { .. }), "{err}");
    assert!(err
        .to_string()
        .contains("groups must divide evenly over the nodes"));
    // 32 dies on 2 nodes, 8 groups: 4 groups per node.
    let l = EpLayout {
        slots: 288,
        dies: 32,
        dies_per_node: 16,
        groups: 8,
    };
    let p = place(Policy::Hierarchical, &load, &l).unwrap();
    assert_eq!(p.slots_per_die, 9);
}

#[test]
fn bad_inputs_name_the_numbers() {
    assert_eq!(
        place(Policy::Global, &[vec![1.0; 8]], &layout(6, 3)),
        Err(EplbError::TooFewSlots {
            slots: 6,
            experts: 8
        })
    );
    assert_eq!(
        place(Policy::Global, &[vec![1.0; 4]], &layout(6, 4)),
        Err(EplbError::SlotsPerDie { slots: 6, dies: 4 })
    );
    assert_eq!(
        place(Policy::Greedy, &[vec![1.0; 4]], &layout(4 * 17, 4)),
        Err(EplbError::TooManySlots {
            slots: 68,
            experts: 4,
            max: 64
        })
    );
    let err = place(Policy::Global, &[vec![1.0, f64::NAN]], &layout(2, 2)).unwrap_err();
    assert!(err.to_string().contains("load[0][1] = NaN"), "{err}");
    let err = place(Policy::Global, &[vec![1.0; 4], vec![1.0; 3]], &layout(4, 2)).unwrap_err();
    assert!(err.to_string().contains("row 1 has 3 experts"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    #[test]
    fn placements_are_complete_consistent_and_never_worse_than_identity(
        experts_pow in 2u32..6,
        extra_per_die in 0u32..3,
        dies_pow in 1u32..4,
        loads in prop::collection::vec(prop::collection::vec(0u32..1000, 32), 1..4),
        policy in prop::sample::select(vec![Policy::Global, Policy::Greedy, Policy::Hierarchical]),
    ) {
        let experts = 1usize << experts_pow;
        let dies = (1u32 << dies_pow).min(experts as u32);
        let slots = experts as u32 + extra_per_die * dies;
        let load: Vec<Vec<f64>> = loads.iter().map(|l| l[..experts].iter().map(|&x| x as f64).collect()).collect();
        let l = EpLayout { slots, dies, dies_per_node: 2.min(dies), groups: dies / 2.min(dies) };
        let p = match place(policy, &load, &l) {
            Ok(p) => p,
            Err(EplbError::Hierarchy { .. }) => return Ok(()),
            Err(e) => return Err(TestCaseError::fail(e.to_string())),
        };
        let ident = place(Policy::Identity, &load, &l).unwrap();
        for (k, lp) in p.layers.iter().enumerate() {
            prop_assert_eq!(lp.phy2log.len(), slots as usize);
            prop_assert!(lp.replicas.iter().all(|&r| r >= 1), "every expert placed");
            let l2p = lp.log2phy();
            for (e, slots_of) in l2p.iter().enumerate() {
                prop_assert_eq!(slots_of.len() as u32, lp.replicas[e], "log2phy agrees with replica counts");
            }
            let dl = lp.die_loads(&load[k], p.slots_per_die);
            let di = ident.layers[k].die_loads(&load[k], p.slots_per_die);
            let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
            prop_assert!(max(&dl) <= max(&di) + 1e-9, "layer {}: hottest die {} vs identity {}", k, max(&dl), max(&di));
            prop_assert!(balancedness(&dl) <= 1.0 + 1e-12);
        }
        prop_assert_eq!(place(policy, &load, &l).unwrap(), p, "deterministic");
    }
}
