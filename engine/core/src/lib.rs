//! dstwin-core: the IO-free production code shared by the twin and real engines. No clocks,
//! no sockets, no threads: every state machine takes `now` as an argument (a test enforces that
//! this crate depends on no IO crate). No `unsafe` either (the prefetch hints its hot loops use
//! are in `dstwin-prefetch`).
//!
//! Module map:
//! - [`time`]: `SimTime` / `SimDuration`, integer nanoseconds.
//! - [`req`]: `ReqId`, the identity every layer keys requests by.
//! - [`batch`]: `BatchShape`, the aggregate shape of one DP rank's step.
//! - [`device`]: the `Device` and `Fabric` traits, step plans and outcomes, KV transfers.
//! - [`deploy`]: the deployment core: instances, PD proxy, KV hand-off and send-back as one
//!   sans-IO state machine that both drivers (simulator, wall-clock runtime) loop around.
//! - [`model`]: model catalog: architectures, quantization, parameter counts, KV bytes.
//! - [`layout`]: parallel layouts (role, DP x TP, EP, redundant and shared-expert slots).
//! - [`memory`]: the memory map of a die and its KV capacity.
//! - [`eplb`]: expert placement with redundant experts (DeepSeek's and greedy algorithms).
//! - [`features`]: engine mechanisms (two micro-batches, MoE communication, graph padding,
//!   FLASHCOMM1, MLAPO, shared-expert overlap) and the rules that decide them per step.
//! - [`instance`]: an instance's DP-rank schedulers (vLLM v1), KV blocks and prefix cache.
//! - [`mtp`]: MTP draft acceptance as a function of request and output position.
//! - [`pd`]: the PD proxy's routing policies.
//! - [`opgraph`]: the per-step op graph, the one description of a step's work.

#![forbid(unsafe_code)]

pub mod batch;
pub mod deploy;
pub mod device;
pub mod eplb;
pub mod features;
pub mod idmap;
pub mod instance;
pub mod layout;
pub mod memory;
pub mod model;
pub mod mtp;
pub mod opgraph;
pub mod pd;
pub mod req;
pub mod time;
pub mod timeline;
