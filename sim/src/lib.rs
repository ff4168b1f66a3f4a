//! dstwin-sim: the virtual-time side of the twin.
//!
//! Module map:
//! - [`device`]: `SimDevice` (memoized step pricing, lockstep, MTP acceptance draws).
//! - [`metrics`]: streaming latency histograms and their summaries.
//! - [`pricing`]: prices an op list with the cost model; critical path; two-micro-batch overlap.
//! - [`expert_load`]: skewed, drifting (or replayed) expert load and the imbalance it causes.
//! - [`explain`]: one step of one instance, priced and broken down (`dstwin explain`).
//! - [`run`]: the virtual-time event loop of a whole deployment and its report.
//! - [`scenario`]: scenario files: strict parsing, `--set` overrides, validation.
//! - [`report`]: human-readable rendering of reports.
//! - [`plan`]: the deployment search of `dstwin plan` and vllm-ascend launch arguments.
//! - [`plot`]: scatter plots with a Pareto front and knee, SVG and PNG.
//! - [`sweep`]: what-if grids, sharding, result rows, Pareto fronts and knees.
//! - [`serve`] (feature `serve`): a scenario's instances on twin devices in the wall-clock runtime.

pub mod device;
pub mod expert_load;
pub mod explain;
pub mod metrics;
pub mod plan;
pub mod plot;
pub mod pricing;
pub mod report;
pub mod run;
pub mod scenario;
#[cfg(feature = "serve")]
pub mod serve;
pub mod sweep;
