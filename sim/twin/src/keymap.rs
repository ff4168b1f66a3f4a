//! `KeyMap`: the price tables' map from a [`PriceKey`] to a small copyable value. Open
//! addressing with linear probing over a power-of-two array, so that the slot a key will be
//! looked up in is known beforehand and can be prefetched ([`KeyMap::prefetch`]): a step of a
//! large instance looks up hundreds of keys scattered over megabytes, and a lookup that waits
//! for memory one key at a time spent most of its time waiting. Prices are never removed, so
//! there are no tombstones.

use crate::pricekey::PriceKey;
use std::hash::{Hash, Hasher};

/// At most this share of the slots is used (7/8 would be hashbrown's; linear probing wants
/// fewer): 5/8, which keeps a lookup to about two slots (one cache line, often) and the array
/// about as large as hashbrown's for the same keys.
const LOAD_NUM: usize = 5;
const LOAD_DEN: usize = 8;

/// The price tables' hasher: FxHash's word mixing, finished with splitmix64's avalanche.
/// Quantized sums end in long runs of zero bits; FxHash alone leaves the bits the map takes its
/// bucket and tag from clustered, and a lookup then compares key after key (measured: a third
/// of the Mooncake run's time went to those compares).
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }

    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    #[inline]
    fn finish(&self) -> u64 {
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[derive(Clone, Debug)]
pub(crate) struct KeyMap<V> {
    /// `PriceKey::NONE` marks an empty slot.
    slots: Vec<(PriceKey, V)>,
    len: usize,
}

impl<V: Copy + Default> Default for KeyMap<V> {
    fn default() -> Self {
        KeyMap {
            slots: vec![(PriceKey::NONE, V::default()); 16],
            len: 0,
        }
    }
}

impl<V: Copy + Default> KeyMap<V> {
    /// The slot a lookup of `k` starts at.
    #[inline]
    fn home(&self, k: &PriceKey) -> usize {
        let mut h = KeyHasher::default();
        k.hash(&mut h);
        h.finish() as usize & (self.slots.len() - 1)
    }

    /// Hints that `k` will be looked up soon.
    #[inline]
    pub(crate) fn prefetch(&self, k: &PriceKey) {
        dstwin_prefetch::value(&self.slots[self.home(k)]);
    }

    #[inline]
    pub(crate) fn get(&self, k: &PriceKey) -> Option<V> {
        let mask = self.slots.len() - 1;
        let mut i = self.home(k);
        loop {
            let (key, v) = &self.slots[i];
            if key == k {
                return Some(*v);
            }
            if *key == PriceKey::NONE {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// Adds `k`, which the map does not hold (`k` is not `PriceKey::NONE`).
    pub(crate) fn insert(&mut self, k: PriceKey, v: V) {
        debug_assert!(k != PriceKey::NONE && self.get(&k).is_none());
        if (self.len + 1) * LOAD_DEN > self.slots.len() * LOAD_NUM {
            let grown = vec![(PriceKey::NONE, V::default()); self.slots.len() * 2];
            let old = std::mem::replace(&mut self.slots, grown);
            for (key, v) in old {
                if key != PriceKey::NONE {
                    self.put(key, v);
                }
            }
        }
        self.put(k, v);
        self.len += 1;
    }

    fn put(&mut self, k: PriceKey, v: V) {
        let mask = self.slots.len() - 1;
        let mut i = self.home(&k);
        while self.slots[i].0 != PriceKey::NONE {
            i = (i + 1) & mask;
        }
        self.slots[i] = (k, v);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dstwin_core::batch::BatchShape;
    use dstwin_core::features::MoeCommUsed;
    use std::collections::HashMap;

    /// Against `HashMap`, through several growths, with keys that share all but a few bits
    /// (as quantized shapes do).
    #[test]
    fn holds_what_a_hash_map_holds() {
        let mut m = KeyMap::<u32>::default();
        let mut want = HashMap::new();
        let key = |i: u64| {
            let s = BatchShape {
                prefill_tokens: i % 97,
                decode_seqs: (i / 97) as u32,
                decode_tokens: i,
                ..BatchShape::default()
            };
            PriceKey::with_load(
                &s,
                crate::pricekey::StepLoad::new(i % 5, 1.0, MoeCommUsed::Mc2),
            )
        };
        for i in 0..20_000u64 {
            let k = key(i * 7);
            if want.contains_key(&k) {
                continue;
            }
            assert_eq!(m.get(&k), None);
            m.insert(k, i as u32);
            want.insert(k, i as u32);
            m.prefetch(&key(i));
        }
        assert_eq!(m.len(), want.len());
        for i in 0..40_000u64 {
            let k = key(i * 7);
            assert_eq!(m.get(&k), want.get(&k).copied(), "{i}");
        }
    }
}
