//! Seeded synthetic workloads: lengths from distributions ([`LengthDist`]), arrivals from a
//! process ([`ArrivalProcess`]), either generated up front (open loop, [`generate`]) or drawn on
//! demand for a fixed concurrency (closed loop, [`ClosedLoopConfig`] and [`LengthSampler`]).
//!
//! Determinism: the same seed and configuration give identical requests. The generator is
//! ChaCha8 (`rand_chacha`), named explicitly because `rand`'s `StdRng` may change algorithm
//! between releases; each quantity draws from its own ChaCha stream of the seed, so adding or
//! changing one distribution leaves the draws of the others unchanged. Normal, log-normal and
//! gamma draws use `f64` `exp`/`ln`, whose last bit may differ between platforms' math
//! libraries; on one platform and build the results are bit-identical.

mod arrival;
mod length;

pub use arrival::{ArrivalProcess, Arrivals};
pub use length::{LengthDist, LengthSampler, RequestLengths};

use crate::error::TraceError;
use crate::workload::{Workload, WorkloadBuilder};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::num::{NonZeroU32, NonZeroU64};

/// ChaCha stream of a seed that draws arrival gaps.
const STREAM_ARRIVALS: u64 = 0;
/// ChaCha stream of a seed that draws input (prompt) lengths.
const STREAM_INPUT_LENGTHS: u64 = 1;
/// ChaCha stream of a seed that draws output lengths.
const STREAM_OUTPUT_LENGTHS: u64 = 2;

/// The generator for one `stream` of `seed`.
fn stream_rng(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    rng
}

/// How many requests an open-loop synthetic workload holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestCount {
    /// Exactly this many requests.
    Requests(NonZeroU64),
    /// Every request that arrives before this many nanoseconds (the first, at 0, always does).
    DurationNs(NonZeroU64),
}

/// A validated open-loop synthetic workload: how many requests, their lengths, their arrivals.
#[derive(Clone, Debug, PartialEq)]
pub struct SyntheticConfig {
    count: RequestCount,
    input: LengthDist,
    output: LengthDist,
    arrival: ArrivalProcess,
}

impl SyntheticConfig {
    /// Fails when a duration bounds requests that all arrive at once (there would be no end).
    pub fn new(
        count: RequestCount,
        input: LengthDist,
        output: LengthDist,
        arrival: ArrivalProcess,
    ) -> Result<SyntheticConfig, TraceError> {
        if let RequestCount::DurationNs(ns) = count {
            if arrival.is_all_at_once() {
                return Err(TraceError::invalid(
                    "duration_s",
                    ns.get() as f64 / 1e9,
                    "cannot bound requests that all arrive at t = 0; give `num_requests` instead",
                ));
            }
        }
        Ok(SyntheticConfig {
            count,
            input,
            output,
            arrival,
        })
    }

    pub fn count(&self) -> RequestCount {
        self.count
    }

    pub fn input(&self) -> &LengthDist {
        &self.input
    }

    pub fn output(&self) -> &LengthDist {
        &self.output
    }

    pub fn arrival(&self) -> &ArrivalProcess {
        &self.arrival
    }
}

/// Generates the workload `config` describes, deterministically for `seed`. Synthetic requests
/// carry no hash ids (no shared prefixes).
pub fn generate(config: &SyntheticConfig, seed: u64) -> Workload {
    let mut requests = SyntheticRequests::new(config, seed);
    let mut builder = WorkloadBuilder::new(format!("synthetic(seed={seed})"), None);
    while let Some((arrival_ns, l)) = requests.next_request() {
        builder.push(arrival_ns, l.input_tokens, l.output_tokens, &[]);
    }
    builder
        .build()
        .expect("a synthetic workload has at least its first request, at t = 0")
}

/// The requests of an open-loop synthetic workload, drawn one at a time: memory does not grow
/// with their number. [`generate`] collects the same sequence.
#[derive(Debug)]
pub(crate) struct SyntheticRequests {
    lengths: LengthSampler,
    arrivals: Arrivals,
    count: RequestCount,
    issued: u64,
}

impl SyntheticRequests {
    pub(crate) fn new(config: &SyntheticConfig, seed: u64) -> SyntheticRequests {
        SyntheticRequests {
            lengths: LengthSampler::new(config.input.clone(), config.output.clone(), seed),
            arrivals: config.arrival.arrivals(stream_rng(seed, STREAM_ARRIVALS)),
            count: config.count,
            issued: 0,
        }
    }

    /// The requests this workload issues in all, when a count (not a duration) bounds it.
    pub(crate) fn expected_len(&self) -> Option<u64> {
        match self.count {
            RequestCount::Requests(n) => Some(n.get()),
            RequestCount::DurationNs(_) => None,
        }
    }

    /// The next request's arrival (non-decreasing, the first at 0) and lengths; `None` after the
    /// last. Arrival and length draws come from separate streams, so drawing them in turn gives
    /// the same requests as drawing all arrivals first.
    pub(crate) fn next_request(&mut self) -> Option<(u64, RequestLengths)> {
        if let RequestCount::Requests(n) = self.count {
            if self.issued == n.get() {
                return None;
            }
        }
        let arrival_ns = self.arrivals.next().expect("arrivals never end");
        if let RequestCount::DurationNs(end) = self.count {
            if arrival_ns >= end.get() {
                self.count = RequestCount::Requests(
                    NonZeroU64::new(self.issued).expect("the first arrival, at 0, is inside"),
                );
                return None;
            }
        }
        self.issued += 1;
        Some((arrival_ns, self.lengths.next_lengths()))
    }
}

/// A validated closed-loop workload: `concurrency` requests in flight at any time, each
/// finished request replaced by a new one until `num_requests` have been issued. Lengths come
/// from [`ClosedLoopConfig::sampler`].
#[derive(Clone, Debug, PartialEq)]
pub struct ClosedLoopConfig {
    concurrency: NonZeroU32,
    num_requests: NonZeroU64,
    input: LengthDist,
    output: LengthDist,
    arrival: Option<ArrivalProcess>,
}

impl ClosedLoopConfig {
    pub fn new(
        concurrency: NonZeroU32,
        num_requests: NonZeroU64,
        input: LengthDist,
        output: LengthDist,
    ) -> ClosedLoopConfig {
        ClosedLoopConfig {
            concurrency,
            num_requests,
            input,
            output,
            arrival: None,
        }
    }

    /// The same loop with the client's request rate: request k is also not issued before the
    /// k-th arrival of `arrival` (`None`, or all at once: no pacing).
    pub fn paced(self, arrival: Option<ArrivalProcess>) -> ClosedLoopConfig {
        ClosedLoopConfig {
            arrival: arrival.filter(|a| !a.is_all_at_once()),
            ..self
        }
    }

    /// The earliest issue times of the requests in order, ns from the start (the first at 0),
    /// drawn from `seed`'s arrival stream as an open loop's arrivals are; `None` when unpaced.
    pub fn pace(&self, seed: u64) -> Option<Arrivals> {
        self.arrival
            .as_ref()
            .map(|a| a.arrivals(stream_rng(seed, STREAM_ARRIVALS)))
    }

    /// Requests kept in flight.
    pub fn concurrency(&self) -> NonZeroU32 {
        self.concurrency
    }

    /// Requests issued in total.
    pub fn num_requests(&self) -> NonZeroU64 {
        self.num_requests
    }

    /// The length sampler for `seed`: the same seed gives the same sequence of pairs.
    pub fn sampler(&self, seed: u64) -> LengthSampler {
        LengthSampler::new(self.input.clone(), self.output.clone(), seed)
    }
}
