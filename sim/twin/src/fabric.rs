//! The twin's KV fabric: one ingress link per decode DP rank, whose bandwidth is shared equally
//! by the transfers on it (processor sharing), plus the link's fixed latency after the last
//! byte. The same model runs in virtual time (the simulator) and in wall-clock time
//! (`serve --device twin`): it is a [`Fabric`] that takes time as an argument.
//!
//! Completion checks carry a generation; a check made stale by a later arrival or departure is
//! ignored.

use dstwin_core::device::{DeviceError, Fabric, KvTransfer, ReqId, TransferOutcome};
use dstwin_core::time::{SimDuration, SimTime};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Per-destination ingress links, shared by concurrent transfers.
#[derive(Clone, Debug, Default)]
pub struct TwinFabric {
    links: Vec<Link>,
    /// Per instance: index of its rank 0's link (`u32::MAX`: no ingress, a prefill instance).
    base: Vec<u32>,
    /// Link checks and deliveries, keyed by (time, sequence number).
    queue: BinaryHeap<Reverse<(SimTime, u64, FabricEvent)>>,
    seq: u64,
    /// A completion check's finished transfers (kept: no allocation per check).
    finished: Vec<ReqId>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum FabricEvent {
    Check { link: u32, gen: u64 },
    Deliver(ReqId),
}

impl TwinFabric {
    /// Adds an instance; `ingress` is `Some((per-rank link, DP ranks))` for instances that
    /// receive KV (decode and mixed), `None` for prefill instances.
    pub fn add_instance(&mut self, ingress: Option<(TransferOutcome, u32)>) {
        match ingress {
            Some((x, ranks)) => {
                self.base.push(self.links.len() as u32);
                for _ in 0..ranks {
                    self.links.push(Link::new(x.bytes_per_s, x.latency));
                }
            }
            None => self.base.push(u32::MAX),
        }
    }

    fn push(&mut self, t: SimTime, e: FabricEvent) {
        self.seq += 1;
        self.queue.push(Reverse((t, self.seq, e)));
    }
}

impl Fabric for TwinFabric {
    fn start(&mut self, now: SimTime, x: &KvTransfer) -> Result<(), DeviceError> {
        let base = self
            .base
            .get(x.to.instance as usize)
            .copied()
            .filter(|&b| b != u32::MAX)
            .ok_or_else(|| {
                DeviceError::Failed(format!(
                    "instance {} receives no KV transfers",
                    x.to.instance
                ))
            })?;
        let l = base + x.to.rank;
        if let Some((t, gen)) = self.links[l as usize].add(now, x.req, x.bytes) {
            self.push(t, FabricEvent::Check { link: l, gen });
        }
        Ok(())
    }

    fn next_event(&self) -> Option<SimTime> {
        self.queue.peek().map(|Reverse((t, _, _))| *t)
    }

    fn poll(&mut self, now: SimTime, done: &mut Vec<ReqId>) {
        let mut finished = std::mem::take(&mut self.finished);
        while let Some(&Reverse((t, _, e))) = self.queue.peek() {
            if t > now {
                break;
            }
            self.queue.pop();
            match e {
                FabricEvent::Check { link, gen } => {
                    finished.clear();
                    let l = &mut self.links[link as usize];
                    let next = l.complete(t, gen, &mut finished);
                    let latency = l.latency();
                    for &id in &finished {
                        self.push(t + latency, FabricEvent::Deliver(id));
                    }
                    if let Some((t, gen)) = next {
                        self.push(t, FabricEvent::Check { link, gen });
                    }
                }
                FabricEvent::Deliver(id) => done.push(id),
            }
        }
        finished.clear();
        self.finished = finished;
    }
}

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
