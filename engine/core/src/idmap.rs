//! Requests in flight by id. Drivers hand ids out from a counter (the simulator in admission
//! order, `serve` per HTTP request), so the ids in flight at any moment lie in a window that
//! moves forward: an [`IdMap`] keeps them in slots indexed by `id - base`, one memory access
//! where a hash map probed its control bytes and then its bucket (measured: the deployment's
//! request map was 3-4% of the simulated CloudMatrix384 hour, nearly all of it waiting for
//! those two loads). Any other id still works: one far from the window (more than
//! [`IdMap::REACH`] slots away) goes to a hash map beside it.

use crate::req::ReqId;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;

/// A map from request id to `T` ([module docs](self)).
#[derive(Clone, Debug)]
pub struct IdMap<T> {
    /// The id of `slots[0]`.
    base: ReqId,
    /// Ids `base..base + slots.len()`; the first and the last are present.
    slots: VecDeque<Option<T>>,
    /// Entries in `slots`.
    in_window: usize,
    /// Ids too far from the window.
    far: FxHashMap<ReqId, T>,
}

impl<T> Default for IdMap<T> {
    fn default() -> Self {
        IdMap {
            base: 0,
            slots: VecDeque::new(),
            in_window: 0,
            far: FxHashMap::default(),
        }
    }
}

impl<T> IdMap<T> {
    /// Empty slots the window grows by to take an id beyond either end; an id further away goes
    /// to the side map.
    pub const REACH: u64 = 1 << 16;

    pub fn len(&self) -> usize {
        self.in_window + self.far.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The slot of `id` in the window, if the window covers it.
    fn at(&self, id: ReqId) -> Option<usize> {
        let i = id.checked_sub(self.base)?;
        (i < self.slots.len() as u64).then_some(i as usize)
    }

    pub fn get(&self, id: ReqId) -> Option<&T> {
        match self.at(id) {
            Some(i) => self.slots[i].as_ref(),
            None => self.far.get(&id),
        }
    }

    pub fn get_mut(&mut self, id: ReqId) -> Option<&mut T> {
        match self.at(id) {
            Some(i) => self.slots[i].as_mut(),
            None => self.far.get_mut(&id),
        }
    }

    /// Hints that `id`'s entry will be read soon (a loop over a step's events issues these
    /// first, so that the entries' cache misses overlap). Changes nothing.
    #[inline]
    pub fn prefetch(&self, id: ReqId) {
        if let Some(i) = self.at(id) {
            dstwin_prefetch::value(&self.slots[i]);
        }
    }

    pub fn contains_key(&self, id: ReqId) -> bool {
        self.get(id).is_some()
    }

    /// Inserts `v` at `id`; returns what was there.
    pub fn insert(&mut self, id: ReqId, v: T) -> Option<T> {
        if self.slots.is_empty() {
            self.base = id;
        }
        let len = self.slots.len() as u64;
        if id >= self.base && id - self.base < len + Self::REACH {
            let i = (id - self.base) as usize;
            if i >= self.slots.len() {
                self.slots.resize_with(i + 1, || None);
                self.absorb();
            }
            let old = self.slots[i].replace(v);
            if old.is_none() {
                self.in_window += 1;
                self.compact();
            }
            return old;
        }
        if id < self.base && self.base - id <= Self::REACH {
            for _ in id..self.base {
                self.slots.push_front(None);
            }
            self.base = id;
            self.absorb();
            return self.insert(id, v);
        }
        self.far.insert(id, v)
    }

    /// Keeps the window's memory to the entries it holds: when it spans far more ids than it
    /// holds, its oldest entries move to the side map (one request left behind, say waiting
    /// for hours, must not keep a slot alive for every id handed out since).
    fn compact(&mut self) {
        while self.slots.len() as u64 > Self::REACH && self.slots.len() > 4 * self.in_window {
            if let Some(Some(v)) = self.slots.pop_front() {
                self.far.insert(self.base, v);
                self.in_window -= 1;
            }
            self.base = self.base.wrapping_add(1);
            while let Some(None) = self.slots.front() {
                self.slots.pop_front();
                self.base = self.base.wrapping_add(1);
            }
        }
    }

    /// Moves the side map's ids that the window now covers into it (no id is in both).
    fn absorb(&mut self) {
        if self.far.is_empty() {
            return;
        }
        let (base, len) = (self.base, self.slots.len() as u64);
        let inside: Vec<ReqId> = self
            .far
            .keys()
            .copied()
            .filter(|&k| k >= base && k - base < len)
            .collect();
        for k in inside {
            let v = self.far.remove(&k);
            self.slots[(k - base) as usize] = v;
            self.in_window += 1;
        }
    }

    pub fn remove(&mut self, id: ReqId) -> Option<T> {
        let Some(i) = self.at(id) else {
            return self.far.remove(&id);
        };
        let v = self.slots[i].take()?;
        self.in_window -= 1;
        // The window runs from the oldest id in it to the newest.
        while let Some(None) = self.slots.front() {
            self.slots.pop_front();
            // Past u64::MAX only when the window empties (the next insert sets the base).
            self.base = self.base.wrapping_add(1);
        }
        while let Some(None) = self.slots.back() {
            self.slots.pop_back();
        }
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// Whatever the ids (dense and in order, out of order, far apart, reused), the map
        /// answers as a hash map does.
        #[test]
        fn an_id_map_is_a_map(
            ops in proptest::collection::vec(
                (0u8..4, prop_oneof![0u64..64, 0u64..400_000, Just(u64::MAX), Just(u64::MAX - 3)]),
                1..400,
            ),
        ) {
            let mut m = IdMap::default();
            let mut want = HashMap::new();
            for (n, (op, id)) in ops.into_iter().enumerate() {
                match op {
                    0 | 1 => prop_assert_eq!(m.insert(id, n), want.insert(id, n)),
                    2 => prop_assert_eq!(m.remove(id), want.remove(&id)),
                    _ => {
                        if let Some(v) = m.get_mut(id) {
                            *v += 1;
                        }
                        if let Some(v) = want.get_mut(&id) {
                            *v += 1;
                        }
                    }
                }
                prop_assert_eq!(m.len(), want.len());
                prop_assert_eq!(m.get(id), want.get(&id));
                prop_assert_eq!(m.contains_key(id), want.contains_key(&id));
            }
            for (id, v) in &want {
                prop_assert_eq!(m.get(*id), Some(v));
            }
        }
    }

    #[test]
    fn a_request_left_behind_does_not_hold_the_window_open() {
        let mut m = IdMap::default();
        m.insert(0, 0u64);
        // Request 0 stays while a million others come and go, one at a time.
        for id in 1..1_000_000u64 {
            m.insert(id, id);
            if id > 1 {
                assert_eq!(m.remove(id - 1), Some(id - 1));
            }
        }
        assert_eq!(m.get(0), Some(&0));
        assert_eq!(m.get(999_999), Some(&999_999));
        assert_eq!(m.len(), 2);
        assert!(
            m.slots.len() as u64 <= IdMap::<u64>::REACH + 1,
            "window of {} slots for 2 entries",
            m.slots.len()
        );
    }

    #[test]
    fn ids_in_flight_stay_in_the_window() {
        let mut m = IdMap::default();
        for id in 1000..1100 {
            m.insert(id, id);
        }
        // Finished out of order: the window starts at the oldest left.
        for id in (1000..1050).rev() {
            assert_eq!(m.remove(id), Some(id));
        }
        assert_eq!((m.base, m.slots.len(), m.far.len()), (1050, 50, 0));
        m.insert(999, 999);
        assert_eq!((m.base, m.slots.len(), m.far.len()), (999, 101, 0));
        m.insert(1 << 40, 0);
        assert_eq!((m.len(), m.far.len()), (52, 1));
        // A hint, whatever the id: in the window, in the side map, absent.
        for id in [999, 1060, 1 << 40, 5, u64::MAX] {
            m.prefetch(id);
        }
        assert_eq!(
            (m.len(), m.get(1060), m.get(1 << 40)),
            (52, Some(&1060), Some(&0))
        );
    }
}
