//! Validation of the raw spec into a [`WorkloadPlan`], and building the workload from it.

use super::{ArrivalSpec, ClosedLoopSpec, LengthSpec, SyntheticSpec, TraceFileSpec, WorkloadSpec};
use crate::error::{positive_finite, TraceError};
use crate::stream::RequestStream;
use crate::synthetic::{
    ArrivalProcess, Arrivals, ClosedLoopConfig, LengthDist, LengthSampler, RequestCount,
    SyntheticConfig,
};
use crate::workload::Workload;
use std::num::{NonZeroU32, NonZeroU64, NonZeroUsize};
use std::path::{Path, PathBuf};

/// The name of the scenario table the spec is read from; the root of every field path in errors.
const TABLE: &str = "workload";
const NS_PER_S: f64 = 1e9;

/// The most requests one workload may issue. Not a memory bound: workloads stream, and a run
/// keeps only the requests in flight (plus one row per request when per-request output is
/// asked for). A typo guard: the simulator replays at most about a million requests per
/// second of wall time, so 10^12 requests would run for weeks.
pub const MAX_REQUESTS: u64 = 1_000_000_000_000;
/// The highest mean arrival rate, requests per second. The clock counts nanoseconds, so the
/// mean gap stays at a microsecond or more; the largest published deployment (CloudMatrix384)
/// serves hundreds of requests per second.
pub const MAX_RATE_PER_S: f64 = 1e6;
/// The most requests a closed loop keeps in flight: far more than any deployment's KV cache
/// holds (a few thousand sequences per instance), and each one is state the simulator keeps.
pub const MAX_CONCURRENCY: u32 = 1_000_000;

/// A validated workload spec: every field checked, ready to build.
#[derive(Clone, Debug, PartialEq)]
pub enum WorkloadPlan {
    Synthetic(SyntheticConfig),
    Trace(TracePlan),
    ClosedLoop(ClosedLoopConfig),
}

/// A validated trace replay.
#[derive(Clone, Debug, PartialEq)]
pub struct TracePlan {
    pub format: TraceFormat,
    /// As written in the scenario; relative paths resolve against the build's base directory.
    pub path: PathBuf,
    pub max_requests: Option<NonZeroUsize>,
    pub scaling: Option<TimeScaling>,
    pub max_duration_ns: Option<NonZeroU64>,
}

/// The trace file formats the crate reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceFormat {
    Mooncake,
    Azure,
}

/// How a trace's time axis is rescaled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TimeScaling {
    /// Multiply every gap by this factor (finite, > 0).
    Factor(f64),
    /// Rescale to this mean rate, requests per second (finite, > 0).
    Rate(f64),
}

/// What a plan builds into: an open-loop stream of requests in arrival order, or a closed loop
/// that draws them on demand.
#[derive(Debug)]
pub enum WorkloadSource {
    Open(RequestStream),
    ClosedLoop {
        /// Requests in flight at any time.
        concurrency: NonZeroU32,
        /// Requests issued in total.
        num_requests: NonZeroU64,
        /// Draws each new request's lengths (boxed: its generators hold their block buffers).
        sampler: Box<LengthSampler>,
        /// The client's request rate, if it sets one: request k is not issued before the k-th
        /// of these times (ns from the start).
        pace: Option<Box<Arrivals>>,
    },
}

impl WorkloadSpec {
    /// Checks every field; errors name the field path (`workload.input.std`) and its value.
    pub fn validate(&self) -> Result<WorkloadPlan, TraceError> {
        let plan = match self {
            WorkloadSpec::Synthetic(s) => WorkloadPlan::Synthetic(synthetic(s)?),
            WorkloadSpec::Mooncake(t) => WorkloadPlan::Trace(trace(TraceFormat::Mooncake, t)?),
            WorkloadSpec::Azure(t) => WorkloadPlan::Trace(trace(TraceFormat::Azure, t)?),
            WorkloadSpec::ClosedLoop(c) => WorkloadPlan::ClosedLoop(closed_loop(c)?),
        };
        Ok(plan)
    }

    /// `self.validate()?.build(seed, base_dir)`.
    pub fn build(&self, seed: u64, base_dir: &Path) -> Result<WorkloadSource, TraceError> {
        self.validate()?.build(seed, base_dir)
    }
}

impl WorkloadPlan {
    /// Opens the workload: a stream that generates or reads requests as they are asked for.
    /// `seed` drives synthetic draws (traces ignore it); `base_dir` anchors relative trace paths
    /// (the scenario file's directory). A trace's first row is read here, so a missing file or
    /// an empty trace fails at once; later rows fail when they are reached.
    pub fn build(&self, seed: u64, base_dir: &Path) -> Result<WorkloadSource, TraceError> {
        match self {
            WorkloadPlan::Synthetic(config) => {
                Ok(WorkloadSource::Open(RequestStream::synthetic(config, seed)))
            }
            WorkloadPlan::Trace(plan) => {
                RequestStream::trace(plan, base_dir).map(WorkloadSource::Open)
            }
            WorkloadPlan::ClosedLoop(config) => Ok(WorkloadSource::ClosedLoop {
                concurrency: config.concurrency(),
                num_requests: config.num_requests(),
                sampler: Box::new(config.sampler(seed)),
                pace: config.pace(seed).map(Box::new),
            }),
        }
    }
}

impl TracePlan {
    /// Reads the whole trace and applies the truncations and scaling, in the documented order.
    /// Memory grows with the trace; a run streams it instead ([`RequestStream::trace`]).
    pub fn load(&self, base_dir: &Path) -> Result<Workload, TraceError> {
        RequestStream::trace(self, base_dir)?.into_workload()
    }
}

fn field(name: &str) -> String {
    format!("{TABLE}.{name}")
}

fn synthetic(s: &SyntheticSpec) -> Result<SyntheticConfig, TraceError> {
    let count = match (s.num_requests, s.duration_s) {
        (Some(n), None) => RequestCount::Requests(nonzero_u64("num_requests", n)?),
        (None, Some(d)) => RequestCount::DurationNs(seconds_to_ns("duration_s", d)?),
        (Some(n), Some(d)) => {
            return Err(TraceError::invalid(
                field("num_requests"),
                n,
                format!("give `num_requests` or `duration_s` ({d}), not both"),
            ))
        }
        (None, None) => {
            return Err(TraceError::invalid(
                field("num_requests"),
                "<missing>",
                "give `num_requests` or `duration_s`",
            ))
        }
    };
    if let RequestCount::Requests(n) = count {
        at_most_requests("num_requests", n.get())?;
    }
    if let Some(rate) = s.arrival.rate() {
        at_most_rate(&field("arrival.rate"), rate)?;
        if let (Some(d), true) = (s.duration_s, rate.is_finite()) {
            let expected = rate * d;
            if expected > MAX_REQUESTS as f64 {
                return Err(TraceError::invalid(
                    field("duration_s"),
                    d,
                    format!(
                        "at arrival.rate {rate} it issues about {expected:.3e} requests; at most \
                         {MAX_REQUESTS} (a guard against a mistyped rate or duration)"
                    ),
                ));
            }
        }
    }
    let input = length(&s.input).map_err(|e| e.within(&field("input")))?;
    let output = length(&s.output).map_err(|e| e.within(&field("output")))?;
    let arrival = arrival(&s.arrival).map_err(|e| e.within(&field("arrival")))?;
    SyntheticConfig::new(count, input, output, arrival).map_err(|e| e.within(TABLE))
}

fn trace(format: TraceFormat, t: &TraceFileSpec) -> Result<TracePlan, TraceError> {
    let scaling = match (t.time_scale, t.rate) {
        (None, None) => None,
        (Some(f), None) => Some(TimeScaling::Factor(positive_finite(
            &field("time_scale"),
            f,
        )?)),
        (None, Some(r)) => Some(TimeScaling::Rate(at_most_rate(
            &field("rate"),
            positive_finite(&field("rate"), r)?,
        )?)),
        (Some(f), Some(r)) => {
            return Err(TraceError::invalid(
                field("rate"),
                r,
                format!("give `time_scale` ({f}) or `rate`, not both"),
            ))
        }
    };
    let max_requests = t
        .max_requests
        .map(|n| {
            let n = nonzero_u64("max_requests", n)?;
            NonZeroUsize::try_from(n).map_err(|_| {
                TraceError::invalid(field("max_requests"), n, "is beyond this machine's memory")
            })
        })
        .transpose()?;
    let max_duration_ns = t
        .max_duration_s
        .map(|d| seconds_to_ns("max_duration_s", d))
        .transpose()?;
    Ok(TracePlan {
        format,
        path: t.path.clone(),
        max_requests,
        scaling,
        max_duration_ns,
    })
}

fn closed_loop(c: &ClosedLoopSpec) -> Result<ClosedLoopConfig, TraceError> {
    let concurrency = NonZeroU32::new(c.concurrency).ok_or_else(|| {
        TraceError::invalid(field("concurrency"), c.concurrency, "must be at least 1")
    })?;
    if c.concurrency > MAX_CONCURRENCY {
        return Err(TraceError::invalid(
            field("concurrency"),
            c.concurrency,
            format!(
                "at most {MAX_CONCURRENCY} requests in flight (far beyond what any deployment's \
                 KV cache holds)"
            ),
        ));
    }
    let num_requests = nonzero_u64("num_requests", c.num_requests)?;
    at_most_requests("num_requests", num_requests.get())?;
    let input = length(&c.input).map_err(|e| e.within(&field("input")))?;
    let output = length(&c.output).map_err(|e| e.within(&field("output")))?;
    let arrival = match &c.arrival {
        None => None,
        Some(a) => {
            if let Some(rate) = a.rate() {
                at_most_rate(&field("arrival.rate"), rate)?;
            }
            Some(arrival(a).map_err(|e| e.within(&field("arrival")))?)
        }
    };
    Ok(ClosedLoopConfig::new(concurrency, num_requests, input, output).paced(arrival))
}

/// A length distribution; error fields are relative (`std`), the caller prefixes the path.
fn length(spec: &LengthSpec) -> Result<LengthDist, TraceError> {
    match *spec {
        LengthSpec::Fixed { value } => LengthDist::fixed(value),
        LengthSpec::Uniform { min, max } => LengthDist::uniform(min, max),
        LengthSpec::Normal {
            mean,
            std,
            min,
            max,
        } => LengthDist::normal(mean, std)?.clamped(min, max),
        LengthSpec::Lognormal {
            mean,
            std,
            mu,
            sigma,
            min,
            max,
        } => {
            let dist = match (mean, std, mu, sigma) {
                (Some(mean), Some(std), None, None) => LengthDist::lognormal(mean, std)?,
                (None, None, Some(mu), Some(sigma)) => LengthDist::lognormal_mu_sigma(mu, sigma)?,
                _ => {
                    let given: Vec<String> =
                        [("mean", mean), ("std", std), ("mu", mu), ("sigma", sigma)]
                            .into_iter()
                            .filter_map(|(k, v)| v.map(|v| format!("{k} = {v}")))
                            .collect();
                    return Err(TraceError::invalid(
                        "dist",
                        "lognormal",
                        format!(
                            "give either `mean` and `std` or `mu` and `sigma` (got {})",
                            if given.is_empty() {
                                "none".to_string()
                            } else {
                                given.join(", ")
                            }
                        ),
                    ));
                }
            };
            dist.clamped(min, max)
        }
    }
}

fn arrival(spec: &ArrivalSpec) -> Result<ArrivalProcess, TraceError> {
    match *spec {
        ArrivalSpec::Poisson { rate } => ArrivalProcess::poisson(rate),
        ArrivalSpec::Gamma { rate, cv } => ArrivalProcess::gamma(rate, cv),
        ArrivalSpec::AllAtOnce => Ok(ArrivalProcess::all_at_once()),
    }
}

fn at_most_requests(name: &str, n: u64) -> Result<(), TraceError> {
    if n > MAX_REQUESTS {
        return Err(TraceError::invalid(
            field(name),
            n,
            format!(
                "at most {MAX_REQUESTS} requests (a guard against a mistyped count: the \
                 simulator replays about a million requests per second at best)"
            ),
        ));
    }
    Ok(())
}

/// A rate (requests/s) above [`MAX_RATE_PER_S`] is an error; NaN passes to the domain check.
fn at_most_rate(path: &str, rate: f64) -> Result<f64, TraceError> {
    if rate > MAX_RATE_PER_S {
        return Err(TraceError::invalid(
            path,
            rate,
            format!(
                "at most {MAX_RATE_PER_S:.0} requests per second (the clock counts nanoseconds; \
                 no deployment comes near it)"
            ),
        ));
    }
    Ok(rate)
}

fn nonzero_u64(name: &str, value: u64) -> Result<NonZeroU64, TraceError> {
    NonZeroU64::new(value)
        .ok_or_else(|| TraceError::invalid(field(name), value, "must be at least 1"))
}

/// Seconds (finite, > 0) to whole nanoseconds (at least 1).
fn seconds_to_ns(name: &str, seconds: f64) -> Result<NonZeroU64, TraceError> {
    positive_finite(&field(name), seconds)?;
    let ns = (seconds * NS_PER_S).round();
    if ns >= u64::MAX as f64 {
        return Err(TraceError::invalid(
            field(name),
            seconds,
            "is beyond the u64 nanosecond clock (about 584 years)",
        ));
    }
    NonZeroU64::new(ns as u64)
        .ok_or_else(|| TraceError::invalid(field(name), seconds, "is shorter than a nanosecond"))
}
