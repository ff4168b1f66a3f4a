//! The simulator: a whole deployment serving a workload in virtual time.
//!
//! - [`build`]: a scenario's instances with their twin devices, the deployment core's specs and
//!   the twin fabric (shared with `serve --device twin`).
//! - `driver`: the discrete-event loop around the deployment core (`dstwin_core::deploy`,
//!   the same PD and scheduling code the wall-clock runtime drives); events at equal times
//!   run in insertion order: the queue is keyed by (time, sequence number).
//! - `report`: the run report, per-request rows and timeline spans.

pub mod build;
mod driver;
mod report;

pub use build::{
    build_fabric, build_instances, deployment_config, kv_bytes_per_token, BuiltInstance,
};
pub use report::{InstanceReport, RequestRow, RunResult, SimReport, Span};

use crate::scenario::Scenario;
use dstwin_core::time::SimTime;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum RunError {
    #[error(transparent)]
    Workload(#[from] dstwin_traces::TraceError),
    #[error(transparent)]
    Device(#[from] dstwin_core::device::DeviceError),
    #[error(transparent)]
    ExpertLoad(#[from] dstwin_twin::expert_load::ExpertLoadError),
    #[error("instance '{instance}': placement file {file}: {message}")]
    Placement {
        instance: String,
        file: String,
        message: String,
    },
    #[error("instance '{instance}': expert placement")]
    Eplb {
        instance: String,
        #[source]
        source: dstwin_core::eplb::EplbError,
    },
    #[error("the run ended at t={end} s, before warmup_s = {warmup} s was over: nothing was measured; lower warmup_s or run longer (duration_s, workload.num_requests)")]
    NothingMeasured { end: f64, warmup: f64 },
    /// Devices built by a caller do not match the scenario's instances.
    #[error("{0}")]
    Devices(String),
    #[error("deadlock at t={time}: {unfinished} requests unfinished and nothing left to happen ({hint})")]
    Deadlock {
        time: SimTime,
        unfinished: u64,
        hint: String,
    },
}

/// Progress of a run, for progress bars.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub now: SimTime,
    pub finished: u64,
    /// Requests the workload issues in all, when known before the run ends (not for a
    /// duration-bounded synthetic workload or a trace cut by time).
    pub total: Option<u64>,
}

/// What to collect besides the report.
#[derive(Default)]
pub struct RunOptions<'a> {
    /// Called every few thousand events.
    pub progress: Option<&'a mut dyn FnMut(&Progress)>,
    /// Record a timeline of steps and transfers (chrome trace).
    pub timeline: bool,
    /// Record one row per finished request.
    pub per_request: bool,
    /// Step every decoding request every step instead of advancing steady ones in aggregate.
    /// Same results, slower: for checking the aggregation and for profiling.
    pub step_by_step: bool,
    /// Keep every step's plan and duration (conformance checks against the runtime).
    pub record_steps: bool,
    /// Which draw of the twin's own variation (each step's kernel time around its price, a
    /// cost file's `[host] step_sigma`): 0 is the scenario seed's; another draws the steps
    /// again over the same workload (its requests and lengths stay the seed's, and an open
    /// loop's arrivals; a closed loop's arrivals follow its completions).
    pub draw: u64,
}

/// Runs a scenario to the end (all requests finished, or its duration).
pub fn run(s: &Scenario, opts: RunOptions<'_>) -> Result<RunResult, RunError> {
    driver::Sim::new(s, opts)?.run()
}
