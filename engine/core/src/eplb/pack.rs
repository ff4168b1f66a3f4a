//! The placement algorithms behind [`super::place`].

use super::{EpLayout, LayerPlacement};
use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Slot i holds expert i mod E (redundant slots replicate experts in order).
pub(super) fn identity(experts: usize, slots: u32) -> LayerPlacement {
    let phy2log: Vec<u32> = (0..slots).map(|s| s % experts as u32).collect();
    let mut replicas = vec![0; experts];
    for &e in &phy2log {
        replicas[e as usize] += 1;
    }
    LayerPlacement { phy2log, replicas }
}

/// An f64 that orders totally (loads are validated finite).
#[derive(Clone, Copy, PartialEq)]
struct Key(f64, u32);

impl Eq for Key {}
impl PartialOrd for Key {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Key {
    // Larger value first; on ties the smaller index first.
    fn cmp(&self, o: &Self) -> Ordering {
        self.0.total_cmp(&o.0).then(o.1.cmp(&self.1))
    }
}

/// Replica counts over `slots`: every expert once, then each extra slot to the expert with the
/// highest load per replica.
fn replicate(load: &[f64], slots: u32) -> Vec<u32> {
    let mut replicas = vec![1u32; load.len()];
    let mut heap: BinaryHeap<Key> = load
        .iter()
        .enumerate()
        .map(|(e, &l)| Key(l, e as u32))
        .collect();
    for _ in load.len() as u32..slots {
        let Key(_, e) = heap.pop().expect("non-empty");
        replicas[e as usize] += 1;
        heap.push(Key(load[e as usize] / replicas[e as usize] as f64, e));
    }
    replicas
}

/// Packs replicas (expert, weight) onto `dies` dies of `per_die` slots each, heaviest first into
/// the least-loaded die with room (ties: lowest die). With `distinct`, a die never takes a second
/// replica of an expert while another die with room does not hold it. Returns phy2log with die d
/// owning slots d*per_die ..
fn balanced_pack(
    items: &mut [(u32, f64)],
    dies: usize,
    per_die: usize,
    distinct: bool,
) -> Vec<u32> {
    items.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut load = vec![0.0f64; dies];
    let mut held: Vec<Vec<u32>> = vec![Vec::with_capacity(per_die); dies];
    // Min-heap of (load, die) over dies with room.
    let mut heap: BinaryHeap<std::cmp::Reverse<(OrdF, usize)>> = (0..dies)
        .map(|d| std::cmp::Reverse((OrdF(0.0), d)))
        .collect();
    let mut skipped = Vec::new();
    for &(e, w) in items.iter() {
        let mut chosen = None;
        while let Some(std::cmp::Reverse((_, d))) = heap.pop() {
            if distinct && held[d].contains(&e) {
                skipped.push(d);
                continue;
            }
            chosen = Some(d);
            break;
        }
        // Every die with room holds this expert already: take the least-loaded of them.
        let d = match chosen {
            Some(d) => d,
            None => {
                let d = *skipped
                    .iter()
                    .min_by(|a, b| load[**a].total_cmp(&load[**b]).then(a.cmp(b)))
                    .expect("a die has room");
                skipped.retain(|&x| x != d);
                d
            }
        };
        for s in skipped.drain(..) {
            heap.push(std::cmp::Reverse((OrdF(load[s]), s)));
        }
        load[d] += w;
        held[d].push(e);
        if held[d].len() < per_die {
            heap.push(std::cmp::Reverse((OrdF(load[d]), d)));
        }
    }
    held.into_iter().flatten().collect()
}

#[derive(Clone, Copy, PartialEq)]
struct OrdF(f64);
impl Eq for OrdF {}
impl PartialOrd for OrdF {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for OrdF {
    fn cmp(&self, o: &Self) -> Ordering {
        self.0.total_cmp(&o.0)
    }
}

fn items(load: &[f64], replicas: &[u32], experts: impl Iterator<Item = u32>) -> Vec<(u32, f64)> {
    experts
        .flat_map(|e| {
            let r = replicas[e as usize];
            std::iter::repeat_n((e, load[e as usize] / r as f64), r as usize)
        })
        .collect()
}

/// Replicate over all slots, then pack over all dies.
pub(super) fn global(load: &[f64], slots: u32, dies: u32, distinct: bool) -> LayerPlacement {
    let replicas = replicate(load, slots);
    let mut it = items(load, &replicas, 0..load.len() as u32);
    let phy2log = balanced_pack(&mut it, dies as usize, (slots / dies) as usize, distinct);
    LayerPlacement { phy2log, replicas }
}

/// Groups to nodes, replication within each node, packing onto the node's dies.
pub(super) fn hierarchical(load: &[f64], layout: &EpLayout) -> LayerPlacement {
    let experts = load.len();
    let nodes = (layout.dies / layout.dies_per_node) as usize;
    let groups = layout.groups as usize;
    let per_group = experts / groups;
    // Pack groups onto nodes by group load: groups/nodes groups per node.
    let mut g_items: Vec<(u32, f64)> = (0..groups)
        .map(|g| {
            (
                g as u32,
                load[g * per_group..(g + 1) * per_group].iter().sum(),
            )
        })
        .collect();
    let node_groups = balanced_pack(&mut g_items, nodes, groups / nodes, false);
    let slots_per_node = layout.slots as usize / nodes;
    let mut phy2log = Vec::with_capacity(layout.slots as usize);
    let mut replicas = vec![0u32; experts];
    for n in 0..nodes {
        let gs = &node_groups[n * (groups / nodes)..(n + 1) * (groups / nodes)];
        let local: Vec<u32> = gs
            .iter()
            .flat_map(|&g| (g as usize * per_group..(g as usize + 1) * per_group).map(|e| e as u32))
            .collect();
        let local_load: Vec<f64> = local.iter().map(|&e| load[e as usize]).collect();
        let r = replicate(&local_load, slots_per_node as u32);
        for (i, &e) in local.iter().enumerate() {
            replicas[e as usize] = r[i];
        }
        let mut it: Vec<(u32, f64)> = local
            .iter()
            .enumerate()
            .flat_map(|(i, &e)| {
                std::iter::repeat_n((e, local_load[i] / r[i] as f64), r[i] as usize)
            })
            .collect();
        phy2log.extend(balanced_pack(
            &mut it,
            layout.dies_per_node as usize,
            slots_per_node / layout.dies_per_node as usize,
            false,
        ));
    }
    LayerPlacement { phy2log, replicas }
}
