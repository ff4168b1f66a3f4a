//! The invariants of a rank, checked after every step in debug builds.

use super::steady::{NIL, RING};
use super::{RankScheduler, Seq, State};

impl RankScheduler {
    /// Invariants: no request both waiting and running; states agree with the queues; blocks
    /// conserved; tokens conserved.
    pub fn check(&self) {
        self.pool.check();
        assert!(
            self.spare.len() <= super::SPARE_TABLES && self.spare.iter().all(Vec::is_empty),
            "spare block tables: at most {} and empty",
            super::SPARE_TABLES
        );
        for &slot in &self.waiting {
            assert_eq!(
                self.seq(slot).state,
                State::Waiting,
                "slot {slot} in waiting"
            );
            assert!(
                !self.running.contains(&slot),
                "slot {slot} both waiting and running"
            );
        }
        for &slot in &self.running {
            let s = self.seq(slot);
            assert_eq!(s.state, State::Running, "slot {slot} in running");
            assert_eq!(s.until, 0, "slot {slot} both running and steady");
        }
        for w in self.running.windows(2) {
            assert!(
                self.seq(w[0]).order < self.seq(w[1]).order,
                "running list in running order"
            );
        }
        for (i, &slot) in self.steady.slots.iter().enumerate() {
            let s = self.seq(slot);
            assert_eq!(s.state, State::Running, "steady slot {slot}");
            assert_eq!(s.steady_idx as usize, i, "steady index of slot {slot}");
            assert!(
                s.from <= self.step + 1 && s.until >= self.step,
                "slot {slot}: window {}..{} around step {}",
                s.from,
                s.until,
                self.step
            );
        }
        // The lists of window ends hold every steady request once, under its window's end.
        let mut listed = 0;
        for (cell, &head) in self.steady.due.iter().enumerate() {
            let mut slot = head;
            while slot != NIL {
                let s = self.seq(slot);
                assert!(s.until != 0, "slot {slot} listed but not steady");
                assert_eq!(
                    s.until as usize & (RING - 1),
                    cell,
                    "slot {slot} in cell {cell}"
                );
                listed += 1;
                slot = s.due_next;
            }
        }
        assert_eq!(listed, self.steady.slots.len(), "window ends listed");
        let live: Vec<&Seq> = self.slab.iter().flatten().collect();
        assert_eq!(
            live.len() + self.free_slots.len(),
            self.slab.len(),
            "free slots and live requests cover the slab"
        );
        assert_eq!(
            live.iter().filter(|s| s.state == State::Pulling).count(),
            self.pulling,
            "pulling count"
        );
        let mut held = 0;
        for s in &live {
            assert!(
                s.computed <= s.prompt + s.output + self.cfg.num_spec_tokens,
                "request {}: tokens conserved",
                s.id
            );
            assert!(
                s.output <= s.max_output,
                "request {}: output within its limit",
                s.id
            );
            held += s.blocks.len() as u64;
        }
        // Every block in use is held by at least one request (shared prefix blocks by several).
        assert!(
            held >= self.pool.used(),
            "{} blocks in use but requests hold {held}",
            self.pool.used()
        );
    }
}
