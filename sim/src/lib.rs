//! dstwin-sim: the virtual-time driver of the twin (the device itself is `dstwin-twin`).
//!
//! Module map:
//! - [`metrics`]: streaming latency histograms and their summaries.
//! - [`run`]: the virtual-time event loop of a whole deployment and its report.
//! - [`scenario`]: scenario files: strict parsing, `--set` overrides, validation.
//! - [`report`]: human-readable rendering of reports.
//! - [`plan`]: the deployment search of `dstwin plan` and the engines' launch commands.
//! - [`plot`]: scatter plots with a Pareto front and knee, SVG and PNG.
//! - [`sweep`]: what-if grids, sharding, result rows, Pareto fronts and knees.
//! - [`uncertainty`]: draws of what a scenario leaves unknown, for 80% intervals.
//! - [`serve`] (feature `serve`): a scenario's instances on twin devices in the wall-clock runtime.

pub mod metrics;
pub mod plan;
pub mod plot;
pub mod report;
pub mod run;
pub mod scenario;
#[cfg(feature = "serve")]
pub mod serve;
pub mod sweep;
pub mod uncertainty;
