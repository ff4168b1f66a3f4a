//! What drivers hand the deployment core and what it hands back: its configuration, arriving
//! requests, the effects to carry out, the notes on what happened, refusals.

use crate::device::{FinishReason, KvTransfer, ReqId, SamplingParams, StepPlan};
use crate::instance::{InstanceConfig, StepSummary};
use crate::mtp::KnownAcceptance;
use crate::pd::Policy;
use std::sync::Arc;

/// Deployment-wide settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeploymentConfig {
    pub prefill_policy: Policy,
    pub decode_policy: Policy,
    /// KV bytes one context token takes (all layers): what a PD hand-off moves per token.
    pub kv_bytes_per_token: f64,
}

/// One instance of the deployment.
#[derive(Clone, Debug)]
pub struct InstanceSpec {
    pub name: String,
    pub config: InstanceConfig,
    /// The device's MTP acceptance when known ahead (the twin): steady decoders are then
    /// advanced in aggregate. `None` steps every request every step.
    pub acceptance: Option<Arc<dyn KnownAcceptance>>,
    /// The device executes requests: plans carry every scheduled request, and every request's
    /// tokens are reported ([`Note::Tokens`]).
    pub detail: bool,
    /// Report every request's tokens per step even without `detail` (a server streams them).
    pub emissions: bool,
    /// The instance's routed experts rebalance on a cycle (vllm-ascend's dynamic EPLB).
    pub eplb: Option<super::EplbSpec>,
}

/// A request entering the deployment.
#[derive(Clone, Copy, Debug)]
pub struct Arrival<'a> {
    pub id: ReqId,
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    /// Content hashes of the prompt in blocks of `hash_block_tokens` tokens (a trace's hash
    /// ids); computed from `token_ids` when empty and token ids are given.
    pub hash_ids: &'a [u64],
    pub hash_block_tokens: u32,
    /// The prompt's token ids (a served request), if known.
    pub token_ids: Option<&'a [u32]>,
    /// How a device that returns tokens samples it (`None`: the device's defaults).
    pub sampling: Option<&'a SamplingParams>,
}

/// Work for the driver.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Run instance `inst`'s plan ([`Deployment::plan`](super::Deployment::plan)) on its device,
    /// then call [`Deployment::step_done`](super::Deployment::step_done) when it has finished.
    Execute { inst: u32 },
    /// Move these KV blocks, then call
    /// [`Deployment::transfer_done`](super::Deployment::transfer_done).
    Transfer(KvTransfer),
}

/// What happened to a request (or a step), for metrics, reports and client streams.
#[derive(Clone, Debug, PartialEq)]
pub enum Note {
    /// Longer than the smallest `max_model_len` on its path: refused before scheduling.
    Rejected { req: ReqId, tokens: u64, max: u64 },
    /// Admitted by a scheduler for the first time (its queueing ends); `cached` of its prompt
    /// tokens were prefix-cache hits.
    Started { req: ReqId, inst: u32, cached: u32 },
    /// A prefill instance computed its prompt; it moves to decode.
    PrefillDone { req: ReqId, inst: u32 },
    /// A decode or mixed instance sampled its first token; `resumed` after a send-back.
    First {
        req: ReqId,
        inst: u32,
        resumed: bool,
    },
    /// It sampled again after sitting out steps since step `since_step` of `inst`.
    Gap {
        req: ReqId,
        inst: u32,
        since_step: u64,
    },
    /// Tokens it sampled in a step (instances that report emissions); `ids` when the device
    /// returns token ids.
    Tokens {
        req: ReqId,
        inst: u32,
        n: u32,
        ids: Vec<u32>,
    },
    /// It produced its last token.
    Finished {
        req: ReqId,
        inst: u32,
        reason: FinishReason,
    },
    /// KV ran out: it lost its blocks and waits to recompute.
    Preempted { req: ReqId, inst: u32 },
    /// KV ran out on a decode instance with send-back: it re-prefills with the `emitted`
    /// tokens appended to its prompt.
    SentBack { req: ReqId, inst: u32, emitted: u32 },
    /// Its KV started moving to decode instance `inst`.
    KvSent {
        req: ReqId,
        inst: u32,
        tokens: u32,
        bytes: f64,
    },
    /// Its KV arrived at decode instance `inst`.
    KvArrived { req: ReqId, inst: u32 },
    /// A step of `inst` was applied: its totals.
    Step { inst: u32, summary: StepSummary },
    /// Dropped on the client's request.
    Aborted { req: ReqId },
}

impl Note {
    /// The request it is about (none for a step's totals).
    pub fn req(&self) -> Option<ReqId> {
        match *self {
            Note::Rejected { req, .. }
            | Note::Started { req, .. }
            | Note::PrefillDone { req, .. }
            | Note::First { req, .. }
            | Note::Gap { req, .. }
            | Note::Tokens { req, .. }
            | Note::Finished { req, .. }
            | Note::Preempted { req, .. }
            | Note::SentBack { req, .. }
            | Note::KvSent { req, .. }
            | Note::KvArrived { req, .. }
            | Note::Aborted { req } => Some(req),
            Note::Step { .. } => None,
        }
    }
}

/// One step of one instance as a driver ran it: for conformance checks between drivers.
#[derive(Clone, Debug, PartialEq)]
pub struct StepRecord {
    pub instance: usize,
    pub plan: StepPlan,
    pub duration: crate::time::SimDuration,
}

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("this request has {tokens} tokens (prompt + max_tokens) but the model's maximum context length is {max}")]
    TooLong { tokens: u64, max: u64 },
    #[error("request id {0} is already in the deployment")]
    Duplicate(ReqId),
}
