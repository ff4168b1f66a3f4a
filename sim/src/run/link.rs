//! A KV-transfer link whose bandwidth is shared equally by the transfers on it (processor
//! sharing). Completion checks carry a generation; a check made stale by a later arrival or
//! departure is ignored.

use dstwin_core::device::ReqId;
use dstwin_core::time::{SimDuration, SimTime};

#[derive(Clone, Debug)]
pub(crate) struct Link {
    /// Transfers in flight and their remaining bytes.
    active: Vec<(ReqId, f64)>,
    last: SimTime,
    gen: u64,
    bytes_per_s: f64,
    latency: SimDuration,
}

impl Link {
    pub(crate) fn new(bytes_per_s: f64, latency: SimDuration) -> Self {
        Link {
            active: Vec::new(),
            last: SimTime::ZERO,
            gen: 0,
            bytes_per_s,
            latency,
        }
    }

    /// Fixed latency a delivered transfer adds after its last byte.
    pub(crate) fn latency(&self) -> SimDuration {
        self.latency
    }

    /// Moves the bytes of the time since the last change.
    fn advance(&mut self, now: SimTime) {
        let n = self.active.len();
        if n > 0 {
            let moved = (now - self.last).as_secs_f64() * self.bytes_per_s / n as f64;
            for a in &mut self.active {
                a.1 -= moved;
            }
        }
        self.last = now;
    }

    /// The next completion check: when the smallest remaining transfer drains at the current
    /// share, rounded up to whole nanoseconds so it never lands before the bytes have moved.
    fn next(&mut self, now: SimTime) -> Option<(SimTime, u64)> {
        self.gen += 1;
        let n = self.active.len() as f64;
        let min = self.active.iter().map(|a| a.1).reduce(f64::min)?;
        let ns = (min.max(0.0) * n / self.bytes_per_s * 1e9).ceil().max(1.0);
        Some((now + SimDuration(ns as u64), self.gen))
    }

    /// Starts a transfer of `bytes`; returns the next completion check to schedule.
    pub(crate) fn add(&mut self, now: SimTime, id: ReqId, bytes: f64) -> Option<(SimTime, u64)> {
        self.advance(now);
        self.active.push((id, bytes));
        self.next(now)
    }

    /// Handles a completion check: appends the finished transfers to `done` and returns the next
    /// check. A stale check (`gen` superseded) does nothing and returns `None`.
    pub(crate) fn complete(
        &mut self,
        now: SimTime,
        gen: u64,
        done: &mut Vec<ReqId>,
    ) -> Option<(SimTime, u64)> {
        if gen != self.gen {
            return None;
        }
        self.advance(now);
        let n = self.active.len().max(1) as f64;
        // What moves in a nanosecond at the current share is rounding, not data.
        let slack = (self.bytes_per_s / n * 1e-9).max(1.0);
        self.active.retain(|&(id, rem)| {
            if rem <= slack {
                done.push(id);
                false
            } else {
                true
            }
        });
        self.next(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the link's checks until every transfer is done; returns (id, completion time).
    fn drain(link: &mut Link, mut check: Option<(SimTime, u64)>) -> Vec<(ReqId, SimTime)> {
        let mut out = Vec::new();
        while let Some((t, gen)) = check {
            let mut done = Vec::new();
            check = link.complete(t, gen, &mut done);
            out.extend(done.into_iter().map(|id| (id, t)));
        }
        out
    }

    #[test]
    fn one_transfer_takes_bytes_over_bandwidth() {
        let mut l = Link::new(1e9, SimDuration::ZERO);
        let c = l.add(SimTime::ZERO, 1, 1e6);
        assert_eq!(drain(&mut l, c), vec![(1, SimTime(1_000_000))]);
    }

    #[test]
    fn concurrent_transfers_share_the_bandwidth() {
        let mut l = Link::new(1e9, SimDuration::ZERO);
        l.add(SimTime::ZERO, 1, 1e6);
        let c = l.add(SimTime::ZERO, 2, 2e6);
        // Both at half rate until 1 MB each has moved (2 ms), then the second alone (1 ms more).
        assert_eq!(
            drain(&mut l, c),
            vec![(1, SimTime(2_000_000)), (2, SimTime(3_000_000))]
        );
    }

    #[test]
    fn a_later_arrival_makes_the_earlier_check_stale() {
        let mut l = Link::new(1e9, SimDuration::ZERO);
        let first = l.add(SimTime::ZERO, 1, 1e6).unwrap();
        let second = l.add(SimTime(500_000), 2, 1e6);
        let mut done = Vec::new();
        assert_eq!(l.complete(first.0, first.1, &mut done), None);
        assert!(done.is_empty());
        // 0.5 MB moved alone, then 0.5 MB more each at half rate: request 1 at 1.5 ms.
        assert_eq!(
            drain(&mut l, second),
            vec![(1, SimTime(1_500_000)), (2, SimTime(2_000_000))]
        );
    }
}
