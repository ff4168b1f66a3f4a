//! dstwin-sim: the virtual-time side of the twin.
//!
//! Module map:
//! - [`pricing`]: prices an op list with the cost model; critical path; two-micro-batch overlap.
//! - [`explain`]: one step of one instance, priced and broken down (`dstwin explain`).
//! - [`report`]: human-readable rendering of reports.

pub mod explain;
pub mod pricing;
pub mod report;
