//! MTP acceptance known ahead: the contract that lets a scheduler advance a steadily decoding
//! request many steps at once (`instance::rank::steady`) and land exactly where step-by-step
//! execution would.
//!
//! A device whose acceptance is a function of the request and of how many sampling steps it
//! has taken, never of the batch it lands in, says so by handing the scheduler a
//! [`KnownAcceptance`] ([`crate::device::Device::acceptance`]); the twin's model is one
//! (`dstwin_twin::mtp`). A real device's acceptance is not known ahead, and its requests are
//! stepped one step at a time.

use crate::req::ReqId;
use std::fmt::Debug;

/// Where a run of steady steps stops ([`KnownAcceptance::scan`]): the tokens out at its
/// start, the most a step may start with, and the count no step may reach.
#[derive(Clone, Copy, Debug)]
pub struct RunLimits {
    pub o: u32,
    pub o_limit: u32,
    pub max_o: u32,
}

impl RunLimits {
    /// Whether a step starting with `o` tokens out and emitting `e` ends the run: it would
    /// start past `o_limit` or reach `max_o`.
    #[inline(always)]
    pub fn stops(&self, o: u32, e: u32) -> bool {
        o > self.o_limit || o + e >= self.max_o
    }
}

/// MTP acceptance as a function of (request, sampling step, drafts) alone.
pub trait KnownAcceptance: Debug + Send + Sync {
    /// Drafts accepted out of `drafts` by request `req` at its sampling step `step` (the
    /// sampling steps it had taken before this one). The same whatever else is asked when.
    fn accepted(&self, req: ReqId, step: u32, drafts: u32) -> u32;

    /// A run of steps of `req` from its sampling step `step`, `drafts` drafts each, as a steady
    /// window scans them: from `run.o` tokens out, each step in turn (one per cell of `cells`)
    /// emits 1 + its accepted drafts; it stops the run if it would start past `run.o_limit`
    /// tokens out or reach `run.max_o`, and otherwise adds its tokens to its cell. Returns the
    /// steps taken and the tokens out after them. A model may compute it faster than step by
    /// step; the result must be this one.
    fn scan(
        &self,
        req: ReqId,
        step: u32,
        drafts: u32,
        cells: &mut [u32],
        run: RunLimits,
    ) -> (usize, u32) {
        let mut o = run.o;
        for (i, c) in cells.iter_mut().enumerate() {
            let e = 1 + self.accepted(req, step.wrapping_add(i as u32), drafts);
            if run.stops(o, e) {
                return (i, o);
            }
            *c += e;
            o += e;
        }
        (cells.len(), o)
    }
}
