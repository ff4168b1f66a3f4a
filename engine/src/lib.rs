//! dstwin-engine: the production code shared by the twin and the engine.
//!
//! Module map:
//! - [`time`]: `SimTime` / `SimDuration`, integer nanoseconds.
//! - [`batch`]: `BatchShape`, the aggregate shape of one DP rank's step.

pub mod batch;
pub mod time;
