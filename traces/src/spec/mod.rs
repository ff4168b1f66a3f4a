//! The `[workload]` table of a scenario file, as written (raw, serde) and once validated.
//!
//! ```toml
//! [workload]
//! kind = "synthetic"
//! num_requests = 1000
//! input = { dist = "normal", mean = 3500, std = 500, min = 16 }
//! output = { dist = "fixed", value = 1500 }
//! arrival = { process = "poisson", rate = 20.0 }
//! ```
//!
//! [`WorkloadSpec::validate`] turns the raw table into a [`WorkloadPlan`], checking every field
//! once; errors name the field path (`workload.arrival.rate`) and the value.
//! [`WorkloadPlan::build`] then reads or generates the requests.

mod plan;

pub use plan::{
    TimeScaling, TraceFormat, TracePlan, WorkloadPlan, WorkloadSource, MAX_CONCURRENCY,
    MAX_RATE_PER_S, MAX_REQUESTS,
};

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The `[workload]` table: which requests arrive and when. `kind` selects the variant.
///
/// - `kind = "synthetic"`: requests drawn from distributions, arrivals from a process (open
///   loop); see [`SyntheticSpec`].
/// - `kind = "mooncake"`: a Mooncake FAST'25 JSONL trace (with prefix hash ids); see
///   [`TraceFileSpec`].
/// - `kind = "azure"`: an Azure LLM inference 2023 CSV trace; see [`TraceFileSpec`].
/// - `kind = "closed_loop"`: a fixed number of requests in flight, each finished request
///   replaced by a new one, like benchmark clients; see [`ClosedLoopSpec`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WorkloadSpec {
    Synthetic(SyntheticSpec),
    Mooncake(TraceFileSpec),
    Azure(TraceFileSpec),
    ClosedLoop(ClosedLoopSpec),
}

/// `kind = "synthetic"`: an open-loop workload generated from the scenario's seed.
/// Give exactly one of `num_requests` and `duration_s`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyntheticSpec {
    /// Number of requests to generate (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_requests: Option<u64>,
    /// Generate every request that arrives within this many seconds (> 0) of the first, which
    /// arrives at t = 0. Not allowed with `arrival.process = "all_at_once"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<f64>,
    /// Prompt length distribution, in tokens.
    pub input: LengthSpec,
    /// Output length distribution, in tokens (the number of tokens each request generates).
    pub output: LengthSpec,
    /// When requests arrive.
    pub arrival: ArrivalSpec,
}

/// `kind = "mooncake"` or `kind = "azure"`: replay a trace file.
///
/// Transformations apply in this order: `max_requests` (first requests by arrival), then
/// `time_scale` or `rate` (at most one of the two), then `max_duration_s` in the scaled time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceFileSpec {
    /// The trace file. A relative path is resolved against the scenario file's directory.
    pub path: PathBuf,
    /// Multiply every gap between arrivals by this factor (> 0): 2.0 replays the trace twice as
    /// slowly (half the rate), 0.5 twice as fast. Default: 1.0 (as recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_scale: Option<f64>,
    /// Rescale time so the mean request rate (requests/s, > 0) is this value; the rate is
    /// `(requests - 1) / (last arrival - first arrival)`, measured after `max_requests`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    /// Keep only the first this many requests (at least 1). Default: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_requests: Option<u64>,
    /// Keep only requests arriving within this many seconds (> 0) of the first, after scaling.
    /// Default: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_duration_s: Option<f64>,
}

/// `kind = "closed_loop"`: keep `concurrency` requests in flight; when one finishes, the next
/// is issued at once with lengths drawn from `input` and `output`, until `num_requests` have
/// been issued. With `arrival`, request k is also not issued before the k-th arrival of that
/// process: a benchmark client's request rate under its concurrency cap (`vllm bench serve
/// --request-rate R --max-concurrency C`, AISBench `request_rate` with `batch_size`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClosedLoopSpec {
    /// Requests in flight at any time (at least 1).
    pub concurrency: u32,
    /// Requests issued in total (at least 1).
    pub num_requests: u64,
    /// Prompt length distribution, in tokens.
    pub input: LengthSpec,
    /// Output length distribution, in tokens.
    pub output: LengthSpec,
    /// The client's request rate: request k waits for the k-th arrival of this process as well
    /// as for a free slot. Default: none (every request is issued as soon as a slot frees).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrival: Option<ArrivalSpec>,
}

/// A distribution of token counts, selected by `dist`. Draws are rounded to whole tokens and
/// clamped to `[min, max]` where given; a length is never below 1.
///
/// - `{ dist = "fixed", value = N }`: always N (at least 1).
/// - `{ dist = "uniform", min = A, max = B }`: uniform over the integers A..=B (1 <= A <= B).
/// - `{ dist = "normal", mean = M, std = S }`: normal, M > 0, S >= 0; optional `min`, `max`.
/// - `{ dist = "lognormal", mean = M, std = S }`: log-normal whose *lengths* have mean M > 0
///   and standard deviation S >= 0; or `{ dist = "lognormal", mu = U, sigma = G }` with the
///   mean U and standard deviation G >= 0 of the *logarithm* of the length (median `exp(U)`).
///   Give one pair, not both. Optional `min`, `max`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "dist", rename_all = "snake_case", deny_unknown_fields)]
pub enum LengthSpec {
    Fixed {
        /// The length, in tokens.
        value: u32,
    },
    Uniform {
        /// Smallest length, in tokens (at least 1).
        min: u32,
        /// Largest length, in tokens (at least `min`).
        max: u32,
    },
    Normal {
        /// Mean length, in tokens (> 0).
        mean: f64,
        /// Standard deviation, in tokens (>= 0).
        std: f64,
        /// Lower clamp, in tokens (at least 1). Default: 1.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min: Option<u32>,
        /// Upper clamp, in tokens (at least `min`). Default: none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<u32>,
    },
    Lognormal {
        /// Mean of the lengths, in tokens (> 0). With `std`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mean: Option<f64>,
        /// Standard deviation of the lengths, in tokens (>= 0). With `mean`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        std: Option<f64>,
        /// Mean of ln(length). With `sigma`, instead of `mean`/`std`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mu: Option<f64>,
        /// Standard deviation of ln(length) (>= 0). With `mu`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sigma: Option<f64>,
        /// Lower clamp, in tokens (at least 1). Default: 1.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min: Option<u32>,
        /// Upper clamp, in tokens (at least `min`). Default: none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<u32>,
    },
}

/// When the requests of a synthetic workload arrive, selected by `process`. The first request
/// arrives at t = 0.
///
/// - `{ process = "poisson", rate = R }`: exponential gaps, R requests/s on average (> 0).
/// - `{ process = "gamma", rate = R, cv = C }`: gamma gaps with mean 1/R and coefficient of
///   variation C > 0 (burstiness: 1 is Poisson, above 1 burstier, below 1 more regular).
/// - `{ process = "all_at_once" }`: every request at t = 0 (needs `num_requests`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "process", rename_all = "snake_case", deny_unknown_fields)]
pub enum ArrivalSpec {
    Poisson {
        /// Mean arrival rate, requests per second (> 0).
        rate: f64,
    },
    Gamma {
        /// Mean arrival rate, requests per second (> 0).
        rate: f64,
        /// Coefficient of variation of the gaps (> 0).
        cv: f64,
    },
    AllAtOnce,
}

impl ArrivalSpec {
    /// The mean rate, requests per second; `None` when every request arrives at once.
    pub fn rate(&self) -> Option<f64> {
        match *self {
            ArrivalSpec::Poisson { rate } | ArrivalSpec::Gamma { rate, .. } => Some(rate),
            ArrivalSpec::AllAtOnce => None,
        }
    }
}
