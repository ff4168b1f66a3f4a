//! Profiler kernels onto the op graph.
//!
//! - [`ops`]: the op graph's op names and the class or collective of each.
//! - [`rules`]: per-backend rule files (`data/kernels/*.toml`) mapping kernel names and types to
//!   ops, classes or "outside the op graph"; users add their own.
//! - [`map`]: every kernel of a profile mapped, and the summary of where the time went
//!   (by class, by op, outside, unmapped).

pub mod map;
pub mod ops;
pub mod rules;

pub use map::{detect_backend, map_kernels, summarize, MapSummary, Share, Target};
pub use ops::{op_catalog, OpKindName};
pub use rules::{Backend, Rule, RuleError, RuleSet};
