//! dstwin-calibration: fits cost-model parameters to published figures and reports the errors.
//!
//! Module map:
//! - [`target`]: calibration targets (a deployment as `explain` inputs + a published metric),
//!   read from `data/*.toml`; evaluation of one target under a parameter set.
//! - [`micro`]: the all-to-all parameters of each cost model fitted to the dispatch/combine
//!   microbenchmarks (`data/microbenchmarks.toml`), the MTP acceptance fitted to the measured
//!   acceptance figures in the same file, and their residuals.
//! - [`kernels`]: DeepSeek-V4's fused kernels (mHC, KV compressors) fitted to their published
//!   microbenchmarks (the `[[kernel]]` blocks of the same file), and their residuals.
//! - [`fit`]: the coordinate-search fit of the global parameters (in-situ efficiency, overlap
//!   efficiencies) that minimizes the squared relative errors over all targets of one hardware,
//!   and the per-request routing concentration fitted to the EPLB gap.
//! - [`anchors`]: the end-to-end anchors as shipped scenarios (`sim/scenarios/anchors/`), the
//!   figures each is compared on and their regression bounds (`data/anchor-scenarios.toml`).
//! - [`measured`]: a team's `vllm bench serve` results against a simulation of the same run.
//!
//! Not built yet: mapping profiler kernels (msprof `kernel_details.csv`, Kineto traces) onto the
//! op graph's op names to fit per-class efficiencies.

pub mod anchors;
pub mod fit;
pub mod globals;
pub mod kernels;
pub mod measured;
pub mod micro;
pub mod target;
