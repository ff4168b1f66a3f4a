//! The `Device` trait: "run one forward step of one instance", implemented by the twin's
//! `SimDevice` (virtual time, priced by the cost model) and by real engines.
//!
//! The scheduler, placement and routing code never knows which device it drives: it builds a
//! [`StepPlan`] and applies the [`StepOutcome`].

use crate::batch::BatchShape;
use crate::mtp::Acceptance;
use crate::time::SimDuration;
use serde::Serialize;
use thiserror::Error;

/// A request's identity across the whole deployment.
pub type ReqId = u64;

/// What the scheduler plans against.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Capacity {
    /// DP ranks of the instance; each has its own scheduler and KV cache.
    pub dp_ranks: u32,
    /// KV blocks per DP rank.
    pub kv_blocks_per_rank: u64,
    /// Tokens per KV block.
    pub block_size: u32,
    /// KV bytes one context token takes on a rank (all layers).
    pub kv_bytes_per_token: f64,
}

/// One sampling sequence of a step: it verifies `drafts` MTP draft tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DecodeSeq {
    pub req: ReqId,
    pub drafts: u32,
    /// Sampling steps the request had taken on this instance before this one (indexes the
    /// twin's acceptance draws).
    pub step: u32,
}

/// One DP rank's part of a step.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RankPlan {
    pub shape: BatchShape,
    /// Sequences that sample this step and may accept drafts, in the scheduler's order.
    pub decode: Vec<DecodeSeq>,
}

/// A step of every DP rank of one instance (they run in lockstep).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StepPlan {
    pub ranks: Vec<RankPlan>,
}

impl StepPlan {
    /// Tokens the whole instance computes.
    pub fn tokens(&self) -> u64 {
        self.ranks.iter().map(|r| r.shape.tokens()).sum()
    }
}

/// Seconds by op class (or collective) on the step's critical path, for time-share reports.
pub type ClassTimes = [f64; CLASS_SLOTS];

/// Report order of [`ClassTimes`] slots.
pub const CLASS_NAMES: [&str; CLASS_SLOTS] = [
    "gemm",
    "grouped_gemm",
    "attention",
    "indexer",
    "elementwise",
    "dispatch",
    "combine",
    "all_reduce",
    "all_gather",
    "other_comm",
    "host",
];
pub const CLASS_SLOTS: usize = 11;
/// The slot of collectives without a slot of their own.
pub const OTHER_COMM: usize = 9;
/// The slot of host (CPU) time not hidden behind the device step.
pub const HOST: usize = 10;

/// What a step did.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StepOutcome {
    /// Predicted (twin) or measured (real device) duration.
    pub duration: SimDuration,
    /// Per rank, per entry of `RankPlan::decode`: drafts accepted (0..=drafts).
    pub accepted: Vec<Vec<u32>>,
    /// Time by op class on the critical path (zeros when the device cannot tell).
    pub class_times: ClassTimes,
}

/// A KV-cache hand-off from a prefill instance to a decode instance.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct KvTransfer {
    pub req: ReqId,
    pub bytes: f64,
    /// Dies spanned by source and destination together (sets the fabric level).
    pub span_dies: u32,
}

/// What a transfer costs when it has the link to itself.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TransferOutcome {
    /// Fixed latency.
    pub latency: SimDuration,
    /// Bytes per second the link sustains.
    pub bytes_per_s: f64,
}

#[derive(Debug, Error, PartialEq)]
pub enum DeviceError {
    /// The plan does not match the device (wrong rank count): a driver bug or a misconfiguration.
    #[error("step plan has {got} DP ranks but the device has {expected}")]
    Ranks { got: usize, expected: u32 },
    /// The device failed; the message says how.
    #[error("device failure: {0}")]
    Failed(String),
}

/// Runs (or prices) steps of one instance.
pub trait Device {
    /// Capacity the scheduler plans against.
    fn capacity(&self) -> Capacity;
    /// Run one step for every DP rank, writing what happened into `out` (its buffers are reused
    /// from step to step). DP ranks of an EP group step in lockstep: the step ends when the
    /// slowest rank and the all-to-all finish.
    fn execute(&mut self, plan: &StepPlan, out: &mut StepOutcome) -> Result<(), DeviceError>;
    /// Price a KV transfer leaving this instance.
    fn send_kv(&mut self, xfer: &KvTransfer) -> Result<TransferOutcome, DeviceError>;
    /// The device's MTP acceptance when it is known ahead as a function of (request, sampling
    /// step), as in the twin. A scheduler given it advances steadily decoding requests in
    /// aggregate instead of touching each every step. Real devices return `None` (default).
    fn acceptance(&self) -> Option<Acceptance> {
        None
    }
}
