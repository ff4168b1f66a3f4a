//! Workload traces in one normalized form: every source becomes a [`Workload`] of
//! [`TraceRequest`]s sorted by arrival, which the simulator replays. Profiler traces likewise
//! become a [`profile::Profile`] of kernel records and step markers, which calibration maps onto
//! the op graph.
//!
//! Module map:
//!
//! - [`workload`]: the normalized form ([`Workload`], [`TraceRequest`], [`WorkloadBuilder`]);
//!   hash ids live in one pool per workload, so hundreds of thousands of requests stay cheap.
//! - [`mooncake`]: reader for Mooncake FAST'25 JSONL traces (arrivals, lengths, prefix hash ids).
//! - [`azure`]: reader for Azure LLM inference 2023 CSV traces (arrivals, lengths).
//! - `transform` (methods on [`Workload`]): time scaling, rate scaling, truncation to the first
//!   requests or a time window.
//! - [`synthetic`]: seeded generators: length distributions, arrival processes, open-loop
//!   workloads and the closed-loop [`LengthSampler`].
//! - [`stream`]: open-loop workloads as a [`RequestStream`], one request at a time in arrival
//!   order (synthetic draws on demand, traces read line by line and transformed on the fly), so
//!   a run's memory follows the requests in flight, not the workload's size.
//! - [`spec`]: the `[workload]` table of a scenario file (serde), its validation into a
//!   [`WorkloadPlan`] and building that into a [`WorkloadSource`].
//! - `stats` ([`Workload::stats`]): count, span, rate, length percentiles, prefix reuse.
//! - [`profile`]: profiler traces (Kineto / Chrome JSON, torch_npu and msprof output, the CPU
//!   engine's profile) in one normalized form of kernel records and step markers, for
//!   calibration.
//! - [`error`]: [`TraceError`], which names the file and line or the field path, and the value.
//!
//! The crate depends on no other dstwin crate and does no IO except in the readers' `from_path`
//! (and `profile::read_path`, which picks a reader for a path).
//! Time is integer nanoseconds (`arrival_ns`) on the workload's own clock.

pub mod azure;
pub mod error;
pub mod mooncake;
pub mod profile;
mod reader;
pub mod spec;
mod stats;
pub mod stream;
pub mod synthetic;
mod timestamp;
mod transform;
pub mod workload;

pub use error::TraceError;
pub use spec::{WorkloadPlan, WorkloadSource, WorkloadSpec};
pub use stats::{quantile, LengthSummary, WorkloadStats};
pub use stream::{RequestStream, StreamRequest};
pub use synthetic::{LengthSampler, RequestLengths};
pub use workload::{TraceRequest, Workload, WorkloadBuilder};
