//! The CPU engine as a dstwin [`Device`]: it executes the scheduler's step plans with the real
//! model, and a [`CpuFabric`] copies KV blocks between its instances.
//!
//! Each DP rank of an instance owns a paged KV pool whose blocks are the scheduler's: a request's
//! block table in the plan addresses real latent KV, so prefix hits reuse cached KV, a preempted
//! request recomputes into fresh blocks and a PD hand-off copies the named blocks. A rank keeps,
//! per request it has seen, the token ids (given on first sight, then extended with what it
//! samples), the sampling parameters and the MTP drafts it proposed; the plan's `freed` list
//! drops them.
//!
//! The instance's DP ranks form one EP group: each holds the routed-expert slots the EPLB
//! placement gives it ([`crate::ep::ExpertRanks`]), and a step runs layer by layer across all
//! of them ([`crate::forward`]): attention per rank, each MoE layer's dispatch, experts and
//! combine across the ranks. A plan's EPLB layer move is installed before the step by copying
//! the expert weights into their new slots.
//!
//! A step (`step.rs`): the inputs of every scheduled request per rank (the known tokens from
//! `computed`, then the drafts to verify), one forward across the ranks, then per sampling
//! request the verification of its drafts and the next token ([`crate::sampler`]), EOS, and
//! with MTP the next drafts: the MTP module runs across the ranks over the positions whose next
//! token is now known (filling its own KV layer) and proposes the token after the last one
//! kept. Draft slots the scheduler plans for but the rank has no proposal for (the first decode
//! step after a PD hand-off) carry the last token again; verification rejects what the model
//! would not have produced, so output never depends on it.
//!
//! The ranks run one after another in this process; the step's duration is measured. With a
//! [`Profiler`] every op goes to the trace ([`crate::profile`]).

mod fabric;
mod step;

pub use fabric::CpuFabric;

use crate::attention::AttnPath;
use crate::cache::PagedKvCache;
use crate::ep::{ExpertRanks, LayerDispatch};
use crate::model::Model;
use crate::profile::{Profiler, TraceSink};
use candle_core::DType;
use dstwin_core::device::{
    Capacity, Device, DeviceError, ExpertHeat, ReqId, SamplingParams, StepOutcome, StepPlan,
};
use dstwin_core::eplb::{place, EpLayout, Placement, Policy};
use dstwin_core::time::SimDuration;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A rank's KV pool, shared with the fabric that copies blocks in and out of it.
pub type SharedCache = Arc<Mutex<PagedKvCache>>;

/// How a CPU instance runs.
#[derive(Clone, Debug)]
pub struct CpuDeviceConfig {
    pub dp_ranks: u32,
    pub kv_blocks_per_rank: u64,
    pub block_size: u32,
    /// MTP draft tokens per step (the scheduler's `num_spec_tokens`; 0: no MTP).
    pub spec_tokens: u32,
    pub path: AttnPath,
    /// Seeds the draws of requests that bring no seed.
    pub seed: u64,
    /// The routed experts' placement over the DP ranks (EPLB's, redundant slots included;
    /// slot `s` on rank `s / slots_per_die`). `None`: each expert once, the ranks holding
    /// consecutive experts (DeepSeek's and vLLM's default).
    pub placement: Option<Placement>,
}

/// What a rank knows of a request between steps.
struct ReqState {
    /// Prompt, then every token kept.
    tokens: Vec<u32>,
    prompt_len: usize,
    sampling: Arc<SamplingParams>,
    key: u64,
    /// Drafts proposed for the positions after the last token.
    drafts: Vec<u32>,
}

struct Rank {
    cache: SharedCache,
    reqs: HashMap<ReqId, ReqState>,
}

/// Proposes the drafts of a request from its tokens so far (see [`CpuDevice::with_drafter`]).
pub type Drafter = Box<dyn Fn(ReqId, &[u32], usize) -> Vec<u32> + Send>;

/// What EPLB moves have copied since the device started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MoveTotals {
    pub layers: usize,
    pub slots: usize,
    pub bytes: usize,
}

/// The CPU engine executing one instance's steps.
pub struct CpuDevice {
    model: Arc<Model>,
    cfg: CpuDeviceConfig,
    ranks: Vec<Rank>,
    experts: ExpertRanks,
    defaults: Arc<SamplingParams>,
    drafter: Option<Drafter>,
    profiler: Profiler,
    /// What each MoE layer run of the last step moved (the main forward's, then the MTP
    /// passes').
    dispatch: Vec<LayerDispatch>,
    moves: MoveTotals,
}

fn failed(e: impl std::fmt::Display) -> DeviceError {
    DeviceError::Failed(e.to_string())
}

/// Each expert once over `ranks` ranks, for every MoE layer of `model`.
fn default_placement(model: &Model, ranks: u32) -> Result<Placement, DeviceError> {
    let experts = model.cfg.routed_experts;
    let layout = EpLayout {
        slots: experts as u32,
        dies: ranks,
        dies_per_node: ranks,
        groups: 1,
    };
    let zeros = vec![vec![0.0; experts]; model.moe_layers().len()];
    place(Policy::Identity, &zeros, &layout).map_err(|e| {
        DeviceError::Failed(format!(
            "{ranks} DP ranks cannot share the {experts} routed experts evenly ({e}); add redundant experts or give a placement"
        ))
    })
}

impl CpuDevice {
    /// An instance of `model` with a fresh KV pool per DP rank and the routed experts placed
    /// over its ranks.
    pub fn new(model: Arc<Model>, cfg: CpuDeviceConfig) -> Result<CpuDevice, DeviceError> {
        if cfg.spec_tokens > 0 && model.mtp.is_empty() {
            return Err(DeviceError::Failed(format!(
                "{} MTP draft tokens per step, but the model has no MTP module (num_nextn_predict_layers = 0, or its checkpoint holds none of the module's tensors, as transformers' save_pretrained writes it)",
                cfg.spec_tokens
            )));
        }
        let placement = match &cfg.placement {
            Some(p) => p.clone(),
            None => default_placement(&model, cfg.dp_ranks)?,
        };
        let experts =
            ExpertRanks::place(&model, &placement, cfg.dp_ranks as usize).map_err(failed)?;
        if cfg.spec_tokens > 0 && experts.layers() < model.moe_layers().len() {
            return Err(DeviceError::Failed(format!(
                "MTP is on, but the expert placement covers {} MoE layers of {} (the MTP modules' are missing)",
                experts.layers(),
                model.moe_layers().len()
            )));
        }
        let ranks = (0..cfg.dp_ranks)
            .map(|_| {
                let cache = PagedKvCache::new(
                    &model.cfg,
                    cfg.kv_blocks_per_rank as usize,
                    cfg.block_size as usize,
                    model.dtype,
                    &model.device,
                )
                .map_err(failed)?;
                Ok(Rank {
                    cache: Arc::new(Mutex::new(cache)),
                    reqs: HashMap::new(),
                })
            })
            .collect::<Result<_, DeviceError>>()?;
        Ok(CpuDevice {
            model,
            cfg,
            ranks,
            experts,
            defaults: Arc::new(SamplingParams::default()),
            drafter: None,
            profiler: Profiler::off(),
            dispatch: Vec::new(),
            moves: MoveTotals::default(),
        })
    }

    /// Replaces the MTP module's proposals with `f(request, tokens so far, k)` (the module
    /// still runs and fills its KV layer). For studies of acceptance with a drafter of known
    /// quality, and for tests of verification: an oracle's drafts must all stand, a liar's
    /// must all fall, and the output must not change either way.
    pub fn with_drafter(mut self, f: Drafter) -> Self {
        self.drafter = Some(f);
        self
    }

    /// Records every op of every step into `sink` as instance `pid` named `name`
    /// ([`crate::profile`]).
    pub fn with_profile(mut self, sink: TraceSink, pid: u32, name: &str) -> Self {
        let classes = dstwin_core::opgraph::vocabulary(
            &self.model.cfg.model,
            self.cfg.dp_ranks,
            self.cfg.spec_tokens,
        );
        self.profiler = Profiler::new(sink, pid, name, self.cfg.dp_ranks, classes);
        self
    }

    /// The KV pool of each DP rank (for a [`CpuFabric`]).
    pub fn caches(&self) -> Vec<SharedCache> {
        self.ranks.iter().map(|r| r.cache.clone()).collect()
    }

    /// Requests a rank holds state for (tests: freed requests leave no state behind).
    pub fn live_requests(&self) -> usize {
        self.ranks.iter().map(|r| r.reqs.len()).sum()
    }

    /// The routed experts as the ranks hold them now.
    pub fn experts(&self) -> &ExpertRanks {
        &self.experts
    }

    /// Mutable access to the ranks' expert slots (studies and tests: a poisoned replica shows
    /// whether it is used).
    pub fn experts_mut(&mut self) -> &mut ExpertRanks {
        &mut self.experts
    }

    /// What each MoE layer run of the last step moved.
    pub fn last_dispatch(&self) -> &[LayerDispatch] {
        &self.dispatch
    }

    /// What EPLB moves have copied so far.
    pub fn moves(&self) -> MoveTotals {
        self.moves
    }
}

/// Adds one MoE layer's router counts to the step's heat.
fn add_heat(heat: &mut Vec<Vec<f64>>, layer: usize, counts: &[u32]) {
    if heat.len() <= layer {
        heat.resize(layer + 1, vec![0.0; counts.len()]);
    }
    for (h, &c) in heat[layer].iter_mut().zip(counts) {
        *h += c as f64;
    }
}

impl Device for CpuDevice {
    fn capacity(&self) -> Capacity {
        let c = &self.model.cfg;
        let elem = if self.model.dtype == DType::F32 { 4 } else { 2 };
        Capacity {
            dp_ranks: self.cfg.dp_ranks,
            kv_blocks_per_rank: self.cfg.kv_blocks_per_rank,
            block_size: self.cfg.block_size,
            kv_bytes_per_token: (c.kv_width() * c.cache_layers() * elem) as f64,
            memory: None,
        }
    }

    fn execute(&mut self, plan: &StepPlan, out: &mut StepOutcome) -> Result<(), DeviceError> {
        if plan.dp_ranks != self.cfg.dp_ranks || plan.ranks.iter().any(|r| r.rank >= plan.dp_ranks)
        {
            return Err(DeviceError::Ranks {
                got: plan.dp_ranks as usize,
                expected: self.cfg.dp_ranks,
            });
        }
        let t0 = Instant::now();
        let traced = self.profiler.begin();
        if let Some(m) = &plan.expert_move {
            let s = self.profiler.begin();
            let moved = self
                .experts
                .install(m.layer, &m.placement)
                .map_err(failed)?;
            self.moves.layers += 1;
            self.moves.slots += moved.slots;
            self.moves.bytes += moved.bytes;
            self.profiler.step_event(
                s,
                "eplb_move",
                || crate::args! {"layer": m.layer, "slots": moved.slots, "bytes": moved.bytes},
            );
        }
        out.accepted.resize_with(plan.ranks.len(), Vec::new);
        out.sampled.resize_with(plan.ranks.len(), Vec::new);
        out.accepted.iter_mut().for_each(Vec::clear);
        out.sampled.iter_mut().for_each(Vec::clear);
        let mut heat: Vec<Vec<f64>> = Vec::new();
        self.dispatch.clear();
        self.step(plan, out, &mut heat)?;
        out.duration = SimDuration::from_secs_f64(t0.elapsed().as_secs_f64());
        out.class_times = Default::default();
        out.expert_heat = (!heat.is_empty()).then_some(ExpertHeat::Counts(heat));
        self.profiler.end_step(traced, || {
            crate::args! {"dp_ranks": plan.dp_ranks, "ranks": plan.ranks.len(),
            "tokens": plan.tokens(),
            "seqs": plan.ranks.iter().map(|r| r.reqs.len()).sum::<usize>()}
        });
        Ok(())
    }

    fn wants_requests(&self) -> bool {
        true
    }

    fn idle(&mut self) -> bool {
        self.profiler.idle(IDLE_WRITE)
    }
}

/// Trace events written per idle call: about 60 us here (2 us each), so a step that arrives
/// meanwhile waits little.
const IDLE_WRITE: usize = 32;
