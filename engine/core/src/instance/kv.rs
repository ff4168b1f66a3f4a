//! Paged KV blocks with prefix caching (vLLM v1 semantics).
//!
//! Free blocks sit in an LRU queue (a doubly linked list over block ids, O(1) removal). A freed
//! block keeps its hash and stays hit-able until it is reused (lazy eviction). A request frees its
//! blocks tail first, so its prefix is evicted last.
//!
//! Without prefix caching no block is ever hit again, the order of reuse does not matter, and the
//! free blocks are a plain stack ([`BlockPool::without_caching`]): the cheapest bookkeeping for
//! the millions of blocks a long run allocates.
//!
//! A pool's memory follows the blocks it has handed out, not its size: blocks never used yet are
//! not stored. They are the ids from a high-water mark up, first in line (vLLM's queue starts
//! with every block in id order and freed blocks join its tail; the stack starts with block 0 on
//! top and freed blocks go on top), so handing them out in id order from the mark gives the
//! same blocks in the same order as a pool that listed them all (a test compares the two). A
//! rank of a large instance that never holds a request costs a few words.

use rustc_hash::FxHashMap;

const NIL: u32 = u32::MAX;

/// The KV blocks of one DP rank.
#[derive(Clone, Debug)]
pub struct BlockPool {
    /// Blocks in the pool.
    total: u64,
    /// Blocks `fresh..total` have never been handed out: free, uncached and stored nowhere; the
    /// per-block vectors cover blocks below it.
    fresh: u32,
    ref_cnt: Vec<u32>,
    hash: Vec<Option<u64>>,
    prev: Vec<u32>,
    next: Vec<u32>,
    in_free: Vec<bool>,
    head: u32,
    tail: u32,
    free: u64,
    cached: FxHashMap<u64, u32>,
    /// `Some`: no caching, free blocks on a stack (the LRU fields stay empty).
    stack: Option<Vec<u32>>,
}

impl BlockPool {
    pub fn new(blocks: u64) -> Self {
        assert!(
            blocks > 0 && blocks < NIL as u64,
            "block count out of range: {blocks}"
        );
        BlockPool {
            total: blocks,
            fresh: 0,
            ref_cnt: Vec::new(),
            hash: Vec::new(),
            prev: Vec::new(),
            next: Vec::new(),
            in_free: Vec::new(),
            head: NIL,
            tail: NIL,
            free: blocks,
            cached: FxHashMap::default(),
            stack: None,
        }
    }

    /// A pool for a cache without prefix caching: no hashes, no LRU order; reference counts are
    /// kept in debug builds only (to catch double frees).
    pub fn without_caching(blocks: u64) -> Self {
        BlockPool {
            stack: Some(Vec::new()),
            ..Self::new(blocks)
        }
    }

    /// Hands out the next block never used before (the caller checked that one is free).
    fn take_fresh(&mut self) -> u32 {
        let b = self.fresh;
        debug_assert!((b as u64) < self.total, "a fresh block is left");
        self.fresh += 1;
        if self.stack.is_none() {
            self.ref_cnt.push(1);
            self.hash.push(None);
            self.prev.push(NIL);
            self.next.push(NIL);
            self.in_free.push(false);
        } else if cfg!(debug_assertions) {
            self.ref_cnt.push(1);
        }
        b
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    /// Blocks that can be handed out (free, cached or not).
    pub fn free(&self) -> u64 {
        self.free
    }

    pub fn used(&self) -> u64 {
        self.total() - self.free
    }

    fn push_tail(&mut self, b: u32) {
        debug_assert!(!self.in_free[b as usize]);
        self.prev[b as usize] = self.tail;
        self.next[b as usize] = NIL;
        if self.tail != NIL {
            self.next[self.tail as usize] = b;
        } else {
            self.head = b;
        }
        self.tail = b;
        self.in_free[b as usize] = true;
        self.free += 1;
    }

    fn unlink(&mut self, b: u32) {
        debug_assert!(self.in_free[b as usize]);
        let (p, n) = (self.prev[b as usize], self.next[b as usize]);
        if p != NIL {
            self.next[p as usize] = n;
        } else {
            self.head = n;
        }
        if n != NIL {
            self.prev[n as usize] = p;
        } else {
            self.tail = p;
        }
        self.in_free[b as usize] = false;
        self.free -= 1;
    }

    /// Takes a free block from the LRU head (blocks never used come first), evicting its cached
    /// hash.
    fn pop(&mut self) -> u32 {
        if (self.fresh as u64) < self.total {
            self.free -= 1;
            return self.take_fresh();
        }
        let b = self.head;
        assert!(b != NIL, "pop from an empty free queue");
        self.unlink(b);
        if let Some(h) = self.hash[b as usize].take() {
            if self.cached.get(&h) == Some(&b) {
                self.cached.remove(&h);
            }
        }
        self.ref_cnt[b as usize] = 1;
        b
    }

    /// Appends `n` fresh blocks to `out`; false (and nothing taken) if fewer are free.
    pub fn allocate(&mut self, n: u64, out: &mut Vec<u32>) -> bool {
        if n > self.free {
            return false;
        }
        if let Some(st) = &mut self.stack {
            // Freed blocks from the top of the stack, then blocks never used.
            let reused = (n as usize).min(st.len());
            let from = st.len() - reused;
            // Reference counts only guard against double frees here (debug builds).
            #[cfg(debug_assertions)]
            for &b in &st[from..] {
                self.ref_cnt[b as usize] = 1;
            }
            out.extend(st.drain(from..).rev());
            for _ in reused as u64..n {
                let b = self.take_fresh();
                out.push(b);
            }
            self.free -= n;
            return true;
        }
        for _ in 0..n {
            let b = self.pop();
            out.push(b);
        }
        true
    }

    /// Hints that the next allocation will be read soon: the top of the free stack (no effect
    /// with prefix caching, whose free queue is a linked list).
    #[inline]
    pub(crate) fn prefetch_top(&self) {
        if let Some(top) = self.stack.as_ref().and_then(|st| st.last()) {
            dstwin_prefetch::line((top as *const u32).cast());
        }
    }

    /// The cached block holding `hash`, if any.
    pub fn lookup(&self, hash: u64) -> Option<u32> {
        self.cached.get(&hash).copied()
    }

    /// True if `b` sits in the free queue (unreferenced, possibly still cached).
    pub fn is_free(&self, b: u32) -> bool {
        assert!(self.stack.is_none(), "no block is cached without caching");
        b >= self.fresh || self.in_free[b as usize]
    }

    /// Takes a reference on a cached block (a prefix hit).
    pub fn touch(&mut self, b: u32) {
        assert!(self.stack.is_none(), "prefix hit in a pool without caching");
        if self.in_free[b as usize] {
            self.unlink(b);
        }
        self.ref_cnt[b as usize] += 1;
    }

    /// Records that full block `b` holds content `hash`.
    pub fn set_hash(&mut self, b: u32, hash: u64) {
        if self.stack.is_some() {
            return;
        }
        if self.hash[b as usize].is_none() && !self.cached.contains_key(&hash) {
            self.hash[b as usize] = Some(hash);
            self.cached.insert(hash, b);
        }
    }

    /// Releases a request's blocks, last block first into the free queue.
    pub fn release(&mut self, blocks: &[u32]) {
        if let Some(st) = &mut self.stack {
            #[cfg(debug_assertions)]
            for &b in blocks {
                let r = &mut self.ref_cnt[b as usize];
                assert!(*r == 1, "double free of block {b}");
                *r = 0;
            }
            st.extend(blocks.iter().rev());
            self.free += blocks.len() as u64;
            return;
        }
        for &b in blocks.iter().rev() {
            let r = &mut self.ref_cnt[b as usize];
            debug_assert!(*r > 0, "double free of block {b}");
            *r -= 1;
            if *r == 0 {
                match &mut self.stack {
                    Some(st) => {
                        st.push(b);
                        self.free += 1;
                    }
                    None => self.push_tail(b),
                }
            }
        }
    }

    /// Checks the pool's bookkeeping (tests and debug builds).
    pub fn check(&self) {
        let untouched = self.total - self.fresh as u64;
        if let Some(st) = &self.stack {
            assert_eq!(st.len() as u64 + untouched, self.free, "free stack length");
            // Without caching, reference counts are kept in debug builds only.
            if cfg!(debug_assertions) {
                assert!(
                    st.iter().all(|&b| self.ref_cnt[b as usize] == 0),
                    "a block on the free stack has refs"
                );
                let in_use = self.ref_cnt.iter().filter(|&&r| r > 0).count() as u64;
                assert_eq!(in_use + self.free, self.total(), "blocks conserved");
            }
            return;
        }
        let mut n = 0;
        let mut b = self.head;
        while b != NIL {
            assert!(
                self.in_free[b as usize] && self.ref_cnt[b as usize] == 0,
                "block {b} in the free queue with refs"
            );
            n += 1;
            b = self.next[b as usize];
        }
        assert_eq!(n + untouched, self.free, "free queue length");
        let in_use = self.ref_cnt.iter().filter(|&&r| r > 0).count() as u64;
        assert_eq!(in_use + self.free, self.total(), "blocks conserved");
        for (&h, &b) in &self.cached {
            assert_eq!(
                self.hash[b as usize],
                Some(h),
                "cache map and block hash agree"
            );
        }
    }
}

/// Mixes a parent block hash with a block's content key (splitmix64 finalizer).
pub fn chain(parent: u64, key: u64) -> u64 {
    let mut z = parent
        ^ key
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .wrapping_add(0x632b_e59b_d9b4_e019);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_release_and_lru_order() {
        let mut p = BlockPool::new(4);
        let mut a = Vec::new();
        assert!(p.allocate(3, &mut a));
        assert_eq!(p.free(), 1);
        assert!(!p.allocate(2, &mut a));
        p.set_hash(a[0], 11);
        p.set_hash(a[1], 12);
        p.release(&a);
        p.check();
        // Freed tail first: the next allocation takes the untouched block, then a[2], a[1], a[0].
        let mut b = Vec::new();
        assert!(p.allocate(2, &mut b));
        assert_eq!(b, vec![3, a[2]]);
        // a[0] and a[1] are still cached (lazy eviction).
        assert_eq!(p.lookup(11), Some(a[0]));
        p.touch(a[0]);
        assert_eq!(p.free(), 1);
        let mut c = Vec::new();
        assert!(p.allocate(1, &mut c));
        // Reusing a[1] evicts its hash.
        assert_eq!(c, vec![a[1]]);
        assert_eq!(p.lookup(12), None);
        p.check();
    }

    /// What a pool that lists every block from the start does (vLLM's queue: all blocks in id
    /// order, freed ones to the tail, a hit taken out wherever it is; the stack: block 0 on
    /// top, freed ones pushed): the lazy pool must hand out the same blocks in the same order.
    struct Listed {
        queue: std::collections::VecDeque<u32>,
        caching: bool,
    }

    impl Listed {
        fn new(blocks: u32, caching: bool) -> Self {
            Listed {
                queue: (0..blocks).collect(),
                caching,
            }
        }

        fn allocate(&mut self, n: usize) -> Option<Vec<u32>> {
            (n <= self.queue.len()).then(|| self.queue.drain(..n).collect())
        }

        /// Blocks freed last block first: the queue takes them at its tail, the stack on top.
        fn release(&mut self, blocks: &[u32]) {
            for &b in blocks.iter().rev() {
                if self.caching {
                    self.queue.push_back(b);
                } else {
                    self.queue.push_front(b);
                }
            }
        }

        fn touch(&mut self, b: u32) {
            self.queue.retain(|&x| x != b);
        }
    }

    proptest::proptest! {
        #[test]
        fn blocks_never_used_are_handed_out_as_if_listed(
            blocks in 1u32..40,
            caching: bool,
            ops in proptest::collection::vec((0u8..3, 0usize..12, 0usize..64), 1..120),
        ) {
            let mut pool = if caching {
                BlockPool::new(blocks as u64)
            } else {
                BlockPool::without_caching(blocks as u64)
            };
            let mut listed = Listed::new(blocks, caching);
            // Requests' block lists, each block once; a hash per block when cached.
            let mut held: Vec<Vec<u32>> = Vec::new();
            let mut next_hash = 1u64;
            for (kind, n, pick) in ops {
                match kind {
                    0 => {
                        let mut got = Vec::new();
                        let ok = pool.allocate(n as u64, &mut got);
                        let want = listed.allocate(n);
                        proptest::prop_assert_eq!(ok, want.is_some());
                        if let Some(w) = want {
                            proptest::prop_assert_eq!(&got, &w);
                            for &b in &got {
                                pool.set_hash(b, next_hash);
                                next_hash += 1;
                            }
                            held.push(got);
                        }
                    }
                    1 if !held.is_empty() => {
                        let r = held.swap_remove(pick % held.len());
                        pool.release(&r);
                        listed.release(&r);
                    }
                    _ if caching && next_hash > 1 => {
                        // A prefix hit on an earlier block, if it is still cached and free.
                        let h = 1 + (pick as u64 % (next_hash - 1));
                        if let Some(b) = pool.lookup(h) {
                            if pool.is_free(b) {
                                pool.touch(b);
                                listed.touch(b);
                                held.push(vec![b]);
                            }
                        }
                    }
                    _ => {}
                }
                pool.check();
                proptest::prop_assert_eq!(pool.free(), listed.queue.len() as u64);
            }
        }
    }

    #[test]
    fn a_pool_without_caching_conserves_blocks() {
        let mut p = BlockPool::without_caching(5);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        assert!(p.allocate(3, &mut a));
        assert!(!p.allocate(3, &mut b));
        assert!(b.is_empty(), "nothing taken on failure");
        assert!(p.allocate(2, &mut b));
        assert_eq!(p.free(), 0);
        p.set_hash(a[0], 1);
        assert_eq!(p.lookup(1), None, "no caching");
        p.release(&a);
        assert_eq!(p.free(), 3);
        p.check();
        let mut all: Vec<u32> = a.iter().chain(&b).copied().collect();
        all.sort();
        assert_eq!(all, vec![0, 1, 2, 3, 4]);
    }
}
