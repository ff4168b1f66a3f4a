//! dstwin-calibration: fits cost-model parameters to published figures and reports the errors.
//!
//! Module map:
//! - [`target`]: calibration targets (a deployment as `explain` inputs + a published metric),
//!   read from `data/*.toml`; evaluation of one target under a parameter set.
//! - [`micro`]: the all-to-all parameters of each cost model fitted to the dispatch/combine
//!   microbenchmarks (`data/microbenchmarks.toml`), the MTP acceptance fitted to the measured
//!   acceptance figures in the same file, and their residuals.
//! - [`microbench`]: the error and residual row those fits and [`v4_kernels`]' share.
//! - [`globals`]: the cost parameters a cost file lists in `fit` (per-class kernel
//!   efficiencies, fixed kernel cost, overlap) fitted jointly to the steady-step figures of every
//!   end-to-end anchor, each anchor weighing 1, and its leave-one-anchor-out test.
//! - [`fit`]: the routing concentration of a Zipf(0.5) load fitted to the EPLB gap alone (the
//!   `zipf` kind's default).
//! - [`expert_load`]: the default routed-expert load (log-normal per layer and the per-request
//!   concentration) fitted jointly to measured DeepSeek-R1 expert loads and the EPLB gap
//!   (`data/expert-load-measured.toml`, `data/expert-load.toml`), its checks and leave-one-out.
//! - [`v4_kernels`]: DeepSeek-V4's fused kernels (mHC, KV compressors) fitted to their
//!   published microbenchmarks (the `[[kernel]]` blocks of `data/microbenchmarks.toml`), and
//!   their residuals.
//! - [`anchors`]: the end-to-end anchors as shipped scenarios (`sim/scenarios/anchors/`), the
//!   figures each is compared on and their regression bounds (`data/anchor-scenarios.toml`).
//! - [`e2e`]: the end-to-end validation suite: published serving runs as shipped scenarios
//!   (`sim/scenarios/e2e/`), simulated whole and compared figure by figure; nothing fitted.
//! - [`measured`]: a team's `vllm bench serve` results against a simulation of the same run.
//! - [`kernels`]: profiler kernels (read by `dstwin_traces::profile`) mapped onto the op graph's
//!   ops and classes by per-backend rule files (`data/kernels/*.toml`).
//! - [`tracefit`]: from mapped kernels, per-class efficiency curves, collective alpha-beta fits,
//!   host overhead per step, and the cost file that carries them.
//! - `lsq`: the bounded linear least squares the fits share.

pub mod anchors;
pub mod e2e;
pub mod expert_load;
pub mod fit;
pub mod globals;
pub mod kernels;
mod lsq;
pub mod measured;
pub mod micro;
pub mod microbench;
pub mod target;
pub mod tracefit;
pub mod v4_kernels;
