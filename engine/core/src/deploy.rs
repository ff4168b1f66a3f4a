//! The deployment core: every instance of a deployment, the PD proxy in front of them, the
//! prefill-to-decode KV hand-off and the send-back of requests that ran out of KV, as one
//! sans-IO state machine.
//!
//! Drivers feed it inputs with the time they happened — a request arrived ([`Deployment::arrive`]),
//! an instance's step finished ([`Deployment::step_done`]), a KV transfer completed
//! ([`Deployment::transfer_done`]), a client went away ([`Deployment::abort`]) — and, once every
//! input of an instant is in, ask it to plan ([`Deployment::plan_steps`]). It answers with
//! [`Effect`]s to carry out (run this instance's step plan on its device, move these KV blocks)
//! and [`Note`]s saying what happened to requests (admitted, first token, tokens, finished, ...)
//! that the driver turns into metrics, reports or client streams.
//!
//! The discrete-event simulator (virtual time) and the wall-clock runtime (real time) are thin
//! loops around it: neither holds PD logic of its own, so a scenario's requests take the same
//! path through both (the conformance test checks step plans and tokens per request).
//!
//! EPLB: an instance with a rebalance cycle (`eplb::cycle::Rebalancer`) has it driven here:
//! the heat comes from the device's outcomes ([`ExpertHeat`]), the cycle runs when a step is
//! planned, and a layer move rides on that step's plan for the device to install.
//!
//! Same-instant rule: planning happens only after every input of the instant is applied, so
//! requests arriving together are scheduled together whatever order their inputs came in.
//! Async scheduling: what reaches a busy async instance waits for the schedule after the one
//! already made (vLLM plans step N+1 while N runs).

use crate::device::{
    ExpertHeat, ExpertMove, FinishReason, KvEnd, KvTransfer, ReqId, StepOutcome, StepPlan,
};
use crate::eplb::cycle::{CycleEffect, Rebalancer};
use crate::eplb::Placement;
use crate::instance::kv::chain;
use crate::instance::{InstEvent, Instance, InstanceConfig, NewRequest, StepSummary};
use crate::layout::Role;
use crate::mtp::Acceptance;
use crate::pd::{Policy, Proxy};
use crate::time::SimTime;
use rustc_hash::FxHashMap;
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
    pub acceptance: Option<Acceptance>,
    /// The device executes requests: plans carry every scheduled request, and every request's
    /// tokens are reported ([`Note::Tokens`]).
    pub detail: bool,
    /// Report every request's tokens per step even without `detail` (a server streams them).
    pub emissions: bool,
    /// The instance's routed experts rebalance on a cycle (vllm-ascend's dynamic EPLB).
    pub eplb: Option<EplbSpec>,
}

/// An instance's expert placement and its rebalance cycle.
#[derive(Clone, Debug)]
pub struct EplbSpec {
    pub rebalancer: Rebalancer,
    /// The placement the device starts with.
    pub placement: Placement,
    /// Routed experts per token (top-k): heat from expected shares is tokens x top-k x share.
    pub top_k: f64,
    /// The expected shares in effect at the start, when the device reports shares.
    pub shares: Option<Arc<Vec<Vec<f64>>>>,
}

/// A running rebalance cycle.
#[derive(Clone, Debug)]
struct EplbRun {
    spec: EplbSpec,
    /// Routed tokens since the heat was last recorded under the current shares (the shares are
    /// folded in only when they change or the algorithm runs).
    pending: f64,
}

impl EplbRun {
    /// Before a step that routes `tokens`: count its heat, advance the cycle; a layer move
    /// comes back for the step's plan.
    fn before_step(&mut self, tokens: u64) -> Option<ExpertMove> {
        let s = &mut self.spec;
        if s.shares.is_some() {
            self.pending += tokens as f64 * s.top_k;
        }
        if s.rebalancer.computes_next() {
            if let Some(sh) = &s.shares {
                s.rebalancer.record(sh, self.pending);
            }
            self.pending = 0.0;
        }
        let effect = s
            .rebalancer
            .step(&mut s.placement)
            .expect("the layout placed its first placement, so it places every later one");
        match effect {
            CycleEffect::MovedLayer {
                layer,
                max_slots_per_die,
            } => Some(ExpertMove {
                layer,
                placement: s.placement.layers[layer].clone(),
                max_slots_per_die,
            }),
            CycleEffect::None => None,
        }
    }

    /// After a step: the routers' heat.
    fn after_step(&mut self, heat: &ExpertHeat) {
        let s = &mut self.spec;
        match heat {
            ExpertHeat::Counts(c) => s.rebalancer.record(c, 1.0),
            ExpertHeat::Shares(new) => {
                if s.shares.as_ref().is_some_and(|old| Arc::ptr_eq(old, new)) {
                    return;
                }
                // Fold the heat of the old shares before they change.
                if let Some(old) = &s.shares {
                    s.rebalancer.record(old, self.pending);
                }
                self.pending = 0.0;
                s.shares = Some(new.clone());
            }
        }
    }
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
}

/// Work for the driver.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Run instance `inst`'s plan ([`Deployment::plan`]) on its device, then call
    /// [`Deployment::step_done`] when it has finished.
    Execute { inst: u32 },
    /// Move these KV blocks, then call [`Deployment::transfer_done`].
    Transfer(KvTransfer),
}

/// What happened to a request (or a step), for metrics, reports and client streams.
#[derive(Clone, Debug, PartialEq)]
pub enum Note {
    /// Longer than the smallest `max_model_len` on its path: refused before scheduling.
    Rejected { req: ReqId, tokens: u64, max: u64 },
    /// Admitted by a scheduler for the first time (its queueing ends).
    Started { req: ReqId, inst: u32 },
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

/// A request in flight.
#[derive(Clone, Debug)]
struct Req {
    prompt: u32,
    max_tokens: u32,
    /// Tokens delivered so far (a sent-back request resumes after them).
    emitted: u32,
    prefill: Option<u32>,
    decode: u32,
    /// Its DP rank on the decode (or mixed) instance.
    rank: u32,
    hashes: Vec<u64>,
    hash_block_tokens: u32,
    /// Prompt and delivered tokens, when the request came with token ids.
    tokens: Vec<u32>,
    first: bool,
}

/// Something that reached an async-scheduling instance during a step, or an abort that reached
/// any instance during one.
#[derive(Clone, Copy, Debug)]
enum Deferred {
    Add { id: ReqId, remote_kv: bool },
    KvArrived(ReqId),
    Abort(ReqId),
}

#[derive(Clone, Debug)]
struct Slot {
    name: String,
    role: Role,
    inst: Instance,
    /// Its index among the prefill instances or among the decode/mixed ones (the proxy's).
    role_index: usize,
    busy: bool,
    deferred: Vec<Deferred>,
    eplb: Option<EplbRun>,
}

/// Routed requests per chunk of a prompt's token ids when the proxy hashes them.
const ROUTE_HASH_TOKENS: u32 = 128;

/// The deployment: instances, proxy, requests in flight.
#[derive(Clone, Debug)]
pub struct Deployment {
    cfg: DeploymentConfig,
    slots: Vec<Slot>,
    prefill_ids: Vec<u32>,
    serve_ids: Vec<u32>,
    proxy: Proxy,
    reqs: FxHashMap<ReqId, Req>,
    /// The smallest max_model_len of any instance a request passes through.
    max_len: u64,
    /// Hash granularity for token ids: the largest block size, so that a block hash never
    /// covers fewer tokens than the block (no false prefix hits).
    token_hash_block: u32,
    starts: Vec<u32>,
    effects: Vec<Effect>,
    notes: Vec<Note>,
    events: Vec<InstEvent>,
    buf: Vec<ReqId>,
}

impl Deployment {
    /// A deployment of `instances`. Panics without a decode or mixed instance (callers
    /// validate deployments first).
    pub fn new(cfg: DeploymentConfig, instances: Vec<InstanceSpec>) -> Self {
        let mut prefill_ids = Vec::new();
        let mut serve_ids = Vec::new();
        let mut slots = Vec::new();
        for (i, spec) in instances.into_iter().enumerate() {
            let role = spec.config.role;
            let role_index = if role == Role::Prefill {
                prefill_ids.push(i as u32);
                prefill_ids.len() - 1
            } else {
                serve_ids.push(i as u32);
                serve_ids.len() - 1
            };
            let mut inst = Instance::new(spec.config);
            if !spec.detail {
                inst.set_acceptance(spec.acceptance);
            }
            inst.set_detail(spec.detail);
            if spec.emissions {
                inst.set_report_emissions(true);
            }
            slots.push(Slot {
                name: spec.name,
                role,
                inst,
                role_index,
                busy: false,
                deferred: Vec::new(),
                eplb: spec.eplb.map(|spec| EplbRun { spec, pending: 0.0 }),
            });
        }
        assert!(
            !serve_ids.is_empty(),
            "a deployment needs a decode or mixed instance"
        );
        let proxy = Proxy::new(
            cfg.prefill_policy,
            prefill_ids.len().max(1),
            cfg.decode_policy,
            serve_ids.len(),
        );
        let max_len = slots
            .iter()
            .map(|s| s.inst.max_model_len())
            .min()
            .unwrap_or(u64::MAX);
        let token_hash_block = slots
            .iter()
            .map(|s| s.inst.config().block_size)
            .max()
            .unwrap_or(1);
        Deployment {
            cfg,
            slots,
            prefill_ids,
            serve_ids,
            proxy,
            reqs: FxHashMap::default(),
            max_len,
            token_hash_block,
            starts: Vec::new(),
            effects: Vec::new(),
            notes: Vec::new(),
            events: Vec::new(),
            buf: Vec::new(),
        }
    }

    /// The longest prompt + output every instance on a request's path accepts.
    pub fn max_model_len(&self) -> u64 {
        self.max_len
    }

    pub fn num_instances(&self) -> usize {
        self.slots.len()
    }

    pub fn instance(&self, i: usize) -> &Instance {
        &self.slots[i].inst
    }

    pub fn name(&self, i: usize) -> &str {
        &self.slots[i].name
    }

    pub fn role(&self, i: usize) -> Role {
        self.slots[i].role
    }

    pub fn has_prefill(&self) -> bool {
        !self.prefill_ids.is_empty()
    }

    /// The plan instance `i` is running (valid from its [`Effect::Execute`] until its
    /// [`Deployment::step_done`]).
    pub fn plan(&self, i: usize) -> &StepPlan {
        self.slots[i].inst.plan()
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.reqs.len()
    }

    /// The prefill instance (if any) and the decode instance a request was routed to.
    pub fn route_of(&self, req: ReqId) -> Option<(Option<u32>, u32)> {
        self.reqs.get(&req).map(|r| (r.prefill, r.decode))
    }

    /// Effects to carry out, in order; drain after every call.
    pub fn take_effects(&mut self, out: &mut Vec<Effect>) {
        out.append(&mut self.effects);
    }

    /// Notes, in order; drain after every call.
    pub fn take_notes(&mut self, out: &mut Vec<Note>) {
        out.append(&mut self.notes);
    }

    /// A request arrives and is routed; a request too long for the deployment is refused
    /// (also noted as [`Note::Rejected`]).
    pub fn arrive(&mut self, _now: SimTime, a: Arrival<'_>) -> Result<(), Refusal> {
        let tokens = a.prompt_tokens as u64 + a.max_tokens as u64;
        if tokens > self.max_len {
            // vLLM answers such a request with an error (400) before scheduling it.
            self.notes.push(Note::Rejected {
                req: a.id,
                tokens,
                max: self.max_len,
            });
            return Err(Refusal::TooLong {
                tokens,
                max: self.max_len,
            });
        }
        if self.reqs.contains_key(&a.id) {
            return Err(Refusal::Duplicate(a.id));
        }
        let (hashes, hash_block_tokens) = match a.token_ids {
            Some(ids) if a.hash_ids.is_empty() => (
                token_hashes(ids, self.token_hash_block),
                self.token_hash_block,
            ),
            _ => (a.hash_ids.to_vec(), a.hash_block_tokens),
        };
        self.reqs.insert(
            a.id,
            Req {
                prompt: a.prompt_tokens,
                max_tokens: a.max_tokens,
                emitted: 0,
                prefill: None,
                decode: 0,
                rank: 0,
                hashes,
                hash_block_tokens,
                tokens: a.token_ids.map(<[u32]>::to_vec).unwrap_or_default(),
                first: false,
            },
        );
        if self.prefill_ids.is_empty() {
            let k = self.proxy.route_decode(a.prompt_tokens as u64);
            let d = self.serve_ids[k];
            self.reqs.get_mut(&a.id).expect("inserted").decode = d;
            self.send_to(d, a.id, false);
        } else {
            self.route_prefill(a.id);
        }
        Ok(())
    }

    fn route_prefill(&mut self, id: ReqId) {
        let r = &self.reqs[&id];
        let hashes = if r.hash_block_tokens == ROUTE_HASH_TOKENS || r.tokens.is_empty() {
            r.hashes.clone()
        } else {
            token_hashes(&r.tokens[..r.prompt as usize], ROUTE_HASH_TOKENS)
        };
        let p = self.proxy.route_prefill(r.prompt as u64, &hashes);
        let i = self.prefill_ids[p];
        self.reqs.get_mut(&id).expect("in flight").prefill = Some(i);
        self.send_to(i, id, false);
    }

    fn send_to(&mut self, i: u32, id: ReqId, remote_kv: bool) {
        let slot = &mut self.slots[i as usize];
        if slot.inst.config().async_scheduling && slot.busy {
            slot.deferred.push(Deferred::Add { id, remote_kv });
            return;
        }
        self.add_to(i, id, remote_kv);
        self.want_start(i);
    }

    fn add_to(&mut self, i: u32, id: ReqId, remote_kv: bool) {
        let token_hash_block = self.token_hash_block;
        let Some(r) = self.reqs.get_mut(&id) else {
            return;
        };
        extend_hashes(id, r, token_hash_block);
        let r = &self.reqs[&id];
        let slot = &mut self.slots[i as usize];
        let prefill = slot.role == Role::Prefill;
        let known = (r.prompt + r.emitted) as usize;
        let rank = slot.inst.add_request(
            NewRequest {
                id,
                // A request sent back after decoding some tokens resumes with them as part of
                // its prompt.
                prompt_tokens: r.prompt + r.emitted,
                // A prefill instance computes the prompt and samples one token (max_tokens=1).
                max_output_tokens: if prefill { 1 } else { r.max_tokens - r.emitted },
                hash_ids: &r.hashes,
                hash_block_tokens: r.hash_block_tokens,
                remote_kv,
                token_ids: (r.tokens.len() >= known && known > 0).then(|| &r.tokens[..known]),
            },
            SimTime::ZERO,
        );
        if !prefill {
            self.reqs.get_mut(&id).expect("in flight").rank = rank;
        }
    }

    fn want_start(&mut self, i: u32) {
        if !self.starts.contains(&i) {
            self.starts.push(i);
        }
    }

    /// Hands an instance what reached it during its last step, now that the step after it is
    /// scheduled (async) or the step is over (aborts).
    fn flush_deferred(&mut self, i: u32, now: SimTime) {
        let mut items = std::mem::take(&mut self.slots[i as usize].deferred);
        for it in items.drain(..) {
            match it {
                Deferred::Add { id, remote_kv } => self.add_to(i, id, remote_kv),
                Deferred::KvArrived(id) => self.slots[i as usize].inst.kv_arrived(id, now),
                Deferred::Abort(id) => {
                    self.slots[i as usize].inst.abort(id);
                }
            }
        }
        // Keep the buffer.
        self.slots[i as usize].deferred = items;
    }

    /// Plans a step on every instance that has work and is idle. Call once every input of the
    /// current instant has been applied.
    pub fn plan_steps(&mut self, now: SimTime) {
        let mut starts = std::mem::take(&mut self.starts);
        starts.sort_unstable();
        for &i in &starts {
            self.try_start(i, now);
        }
        starts.clear();
        if self.starts.is_empty() {
            self.starts = starts;
        }
    }

    /// Instances that asked to plan since the last [`Deployment::plan_steps`].
    pub fn wants_planning(&self) -> bool {
        !self.starts.is_empty()
    }

    fn try_start(&mut self, i: u32, now: SimTime) {
        let slot = &mut self.slots[i as usize];
        if slot.busy {
            return;
        }
        if !slot.inst.has_work() {
            // Nothing was scheduled behind the last step: what arrived during it is next.
            if slot.deferred.is_empty() {
                return;
            }
            self.flush_deferred(i, now);
            if !self.slots[i as usize].inst.has_work() {
                return;
            }
        }
        let slot = &mut self.slots[i as usize];
        slot.inst.schedule(now);
        let tokens = slot.inst.plan().tokens();
        if tokens > 0 {
            slot.busy = true;
            let routed = slot.inst.plan().routed_tokens();
            let m = slot.eplb.as_mut().and_then(|e| e.before_step(routed));
            slot.inst.set_expert_move(m);
            self.effects.push(Effect::Execute { inst: i });
        }
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        buf.extend_from_slice(self.slots[i as usize].inst.started());
        for &req in &buf {
            self.notes.push(Note::Started { req, inst: i });
        }
        buf.clear();
        buf.extend_from_slice(self.slots[i as usize].inst.kv_pulls());
        for &id in &buf {
            self.start_transfer(i, id);
        }
        self.buf = buf;
        if !self.slots[i as usize].deferred.is_empty() {
            self.flush_deferred(i, now);
            if !self.slots[i as usize].busy {
                self.try_start(i, now);
            }
        }
    }

    /// A decode instance allocated blocks for a request whose KV is on a prefill instance.
    fn start_transfer(&mut self, d: u32, id: ReqId) {
        let Some(r) = self.reqs.get(&id) else {
            return;
        };
        let tokens = r.prompt + r.emitted;
        let bytes = tokens as f64 * self.cfg.kv_bytes_per_token;
        let to = self.slots[d as usize]
            .inst
            .blocks_of(id)
            .map(|(rank, blocks)| KvEnd {
                instance: d,
                rank,
                blocks: blocks.to_vec(),
            })
            .unwrap_or(KvEnd {
                instance: d,
                rank: r.rank,
                blocks: Vec::new(),
            });
        let from = r
            .prefill
            .and_then(|p| {
                self.slots[p as usize]
                    .inst
                    .blocks_of(id)
                    .map(|(rank, blocks)| KvEnd {
                        instance: p,
                        rank,
                        blocks: blocks.to_vec(),
                    })
            })
            .unwrap_or_default();
        self.notes.push(Note::KvSent {
            req: id,
            inst: d,
            tokens,
            bytes,
        });
        self.effects.push(Effect::Transfer(KvTransfer {
            req: id,
            tokens,
            bytes,
            from,
            to,
        }));
    }

    /// A KV transfer finished: the decode side may compute, the prefill side frees its copy.
    pub fn transfer_done(&mut self, now: SimTime, id: ReqId) {
        let Some(r) = self.reqs.get(&id) else {
            // Aborted while its KV moved; both sides already freed it.
            return;
        };
        let (d, p) = (r.decode, r.prefill);
        self.notes.push(Note::KvArrived { req: id, inst: d });
        let slot = &mut self.slots[d as usize];
        if slot.inst.config().async_scheduling && slot.busy {
            slot.deferred.push(Deferred::KvArrived(id));
        } else {
            slot.inst.kv_arrived(id, now);
        }
        if let Some(p) = p {
            if self.slots[p as usize].role == Role::Prefill {
                self.slots[p as usize].inst.release_kv(id);
                self.want_start(p);
            }
        }
        self.want_start(d);
    }

    /// Applies every KV transfer `fabric` has completed by `now` ([`Deployment::transfer_done`]
    /// for each, in completion order).
    pub fn poll_transfers(&mut self, now: SimTime, fabric: &mut dyn crate::device::Fabric) {
        let mut done = std::mem::take(&mut self.buf);
        done.clear();
        fabric.poll(now, &mut done);
        for &id in &done {
            self.transfer_done(now, id);
        }
        self.buf = done;
    }

    /// Instance `i`'s step finished with `outcome`.
    pub fn step_done(&mut self, now: SimTime, i: u32, outcome: &StepOutcome) {
        let mut events = std::mem::take(&mut self.events);
        events.clear();
        let slot = &mut self.slots[i as usize];
        debug_assert!(slot.busy, "step_done for an idle instance");
        slot.busy = false;
        let summary = slot.inst.apply(now, outcome, &mut events);
        if let (Some(e), Some(h)) = (slot.eplb.as_mut(), &outcome.expert_heat) {
            e.after_step(h);
        }
        let role = slot.role;
        self.notes.push(Note::Step { inst: i, summary });
        if !slot.inst.emissions().is_empty() {
            let ids = slot.inst.emitted_ids();
            let mut at = 0;
            for &(req, n) in slot.inst.emissions() {
                let got = if ids.len() >= at + n as usize {
                    let v = ids[at..at + n as usize].to_vec();
                    at += n as usize;
                    v
                } else {
                    Vec::new()
                };
                if let Some(r) = self.reqs.get_mut(&req) {
                    if role != Role::Prefill {
                        r.tokens.extend_from_slice(&got);
                    }
                }
                if role != Role::Prefill {
                    self.notes.push(Note::Tokens {
                        req,
                        inst: i,
                        n,
                        ids: got,
                    });
                }
            }
        }
        for ev in events.drain(..) {
            match ev {
                InstEvent::First { req } if role == Role::Prefill => self.prefill_done(i, req),
                InstEvent::First { req } => self.first_token(i, req),
                InstEvent::Gap { req, since_step } => self.notes.push(Note::Gap {
                    req,
                    inst: i,
                    since_step,
                }),
                InstEvent::Finished { req, reason } => self.finished(i, req, reason),
                InstEvent::Preempted { req } => self.notes.push(Note::Preempted { req, inst: i }),
                InstEvent::SentBack { req, emitted } => self.sent_back(i, req, emitted),
            }
        }
        self.events = events;
        // Aborts that reached a busy instance apply now that its step is over.
        if !self.slots[i as usize].inst.config().async_scheduling
            && !self.slots[i as usize].deferred.is_empty()
        {
            self.flush_deferred(i, now);
        }
        self.want_start(i);
    }

    /// A prefill instance finished a prompt: hand the request to a decode instance, which pulls
    /// the KV.
    fn prefill_done(&mut self, i: u32, id: ReqId) {
        let Some(r) = self.reqs.get(&id) else {
            return;
        };
        let prompt = r.prompt as u64;
        self.notes.push(Note::PrefillDone { req: id, inst: i });
        self.proxy
            .prefill_done(self.slots[i as usize].role_index, prompt);
        let k = self.proxy.route_decode(prompt);
        let d = self.serve_ids[k];
        self.reqs.get_mut(&id).expect("in flight").decode = d;
        self.send_to(d, id, true);
    }

    fn first_token(&mut self, i: u32, id: ReqId) {
        let Some(r) = self.reqs.get_mut(&id) else {
            return;
        };
        let resumed = r.first;
        r.first = true;
        let (prompt, prefill) = (r.prompt as u64, r.prefill);
        self.notes.push(Note::First {
            req: id,
            inst: i,
            resumed,
        });
        if !resumed {
            if let Some(p) = prefill {
                self.proxy
                    .decode_started(self.slots[p as usize].role_index, prompt);
            }
        }
    }

    fn finished(&mut self, i: u32, id: ReqId, reason: FinishReason) {
        let Some(r) = self.reqs.remove(&id) else {
            return;
        };
        self.proxy
            .decode_done(self.slots[r.decode as usize].role_index, r.prompt as u64);
        self.notes.push(Note::Finished {
            req: id,
            inst: i,
            reason,
        });
    }

    fn sent_back(&mut self, i: u32, id: ReqId, emitted: u32) {
        let Some(r) = self.reqs.get_mut(&id) else {
            return;
        };
        r.emitted += emitted;
        let (d, prompt) = (r.decode, r.prompt as u64);
        self.notes.push(Note::SentBack {
            req: id,
            inst: i,
            emitted,
        });
        self.proxy
            .decode_done(self.slots[d as usize].role_index, prompt);
        if self.prefill_ids.is_empty() {
            // No prefill instance to hand it back to: it recomputes where it is.
            self.send_to(d, id, false);
        } else {
            self.route_prefill(id);
        }
    }

    /// Drops a request wherever it is (its client went away) and frees its KV. Returns false if
    /// the deployment does not hold it.
    pub fn abort(&mut self, _now: SimTime, id: ReqId) -> bool {
        let Some(r) = self.reqs.remove(&id) else {
            return false;
        };
        let on_prefill = r.prefill.filter(|&p| self.slots[p as usize].inst.holds(id));
        let on_decode = self.slots[r.decode as usize].inst.holds(id)
            || self.slots[r.decode as usize]
                .deferred
                .iter()
                .any(|d| matches!(d, Deferred::Add { id: x, .. } if *x == id));
        // The proxy forgets the request's load where it still counts.
        if let Some(p) = r.prefill {
            let k = self.slots[p as usize].role_index;
            if on_prefill.is_some() && !on_decode {
                self.proxy.prefill_done(k, r.prompt as u64);
            }
            if !r.first {
                self.proxy.decode_started(k, r.prompt as u64);
            }
        }
        if on_decode || r.prefill.is_none() {
            self.proxy
                .decode_done(self.slots[r.decode as usize].role_index, r.prompt as u64);
        }
        for i in [r.prefill, Some(r.decode)].into_iter().flatten() {
            let slot = &mut self.slots[i as usize];
            slot.deferred.retain(
                |d| !matches!(d, Deferred::Add { id: x, .. } | Deferred::KvArrived(x) if *x == id),
            );
            if slot.busy {
                slot.deferred.push(Deferred::Abort(id));
            } else {
                slot.inst.abort(id);
            }
            self.want_start(i);
        }
        self.notes.push(Note::Aborted { req: id });
        true
    }

    /// One line per instance with its queue state, for deadlock reports.
    pub fn describe(&self) -> String {
        self.slots
            .iter()
            .map(|s| {
                let st = s.inst.stats();
                format!(
                    "{}: {} waiting, {} running, KV {:.0}% used",
                    s.name,
                    st.waiting,
                    st.running,
                    s.inst.kv_usage() * 100.0
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Salt of the hash keys that stand for tokens a request produced when their ids are unknown.
const PRODUCED_SALT: u64 = 0x6f75_7470_7574_0000;

/// A request that comes back with the tokens it produced appended to its prompt (sent back, or
/// preempted) hashes them too, as an engine hashes every full block of what it computes: from
/// the token ids when known, otherwise with keys unique to the request (produced text is shared
/// with no other request).
fn extend_hashes(id: ReqId, r: &mut Req, token_hash_block: u32) {
    let known = r.prompt + r.emitted;
    if r.hashes.is_empty() || r.hash_block_tokens == 0 || r.emitted == 0 {
        return;
    }
    if r.tokens.len() >= known as usize && r.hash_block_tokens == token_hash_block {
        r.hashes = token_hashes(&r.tokens[..known as usize], token_hash_block);
        return;
    }
    let need = known.div_ceil(r.hash_block_tokens) as usize;
    while r.hashes.len() < need {
        let k = r.hashes.len() as u64;
        r.hashes.push(chain(PRODUCED_SALT ^ id, k));
    }
}

/// Content hashes of a token sequence's full chunks of `chunk` tokens (chained into block
/// hashes by the schedulers).
pub fn token_hashes(ids: &[u32], chunk: u32) -> Vec<u64> {
    if chunk == 0 {
        return Vec::new();
    }
    ids.chunks_exact(chunk as usize)
        .map(|c| {
            c.iter()
                .fold(0x51_7cc1_b727_220a, |h, &t| chain(h, t as u64))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::AttnCap;

    fn cfg(role: Role, blocks: u64) -> InstanceConfig {
        InstanceConfig {
            role,
            dp_ranks: 1,
            max_num_batched_tokens: 256,
            max_num_seqs: 8,
            block_size: 16,
            num_kv_blocks: blocks,
            enable_chunked_prefill: true,
            enable_prefix_caching: true,
            long_prefill_token_threshold: 0,
            max_model_len: 4096,
            num_spec_tokens: 0,
            attn_cap: AttnCap(None),
            send_back: false,
            async_scheduling: false,
        }
    }

    fn spec(name: &str, c: InstanceConfig) -> InstanceSpec {
        InstanceSpec {
            name: name.into(),
            config: c,
            acceptance: None,
            detail: false,
            emissions: true,
            eplb: None,
        }
    }

    fn pd() -> Deployment {
        Deployment::new(
            DeploymentConfig {
                prefill_policy: Policy::LoadBalance,
                decode_policy: Policy::LoadBalance,
                kv_bytes_per_token: 10.0,
            },
            vec![
                spec("prefill", cfg(Role::Prefill, 64)),
                spec("decode", cfg(Role::Decode, 64)),
            ],
        )
    }

    /// Drives a deployment with instant steps and transfers until nothing is left; returns the
    /// notes.
    fn drive(d: &mut Deployment) -> Vec<Note> {
        let mut notes = Vec::new();
        let mut effects = Vec::new();
        let mut t = SimTime::ZERO;
        for _ in 0..10_000 {
            d.plan_steps(t);
            d.take_effects(&mut effects);
            d.take_notes(&mut notes);
            if effects.is_empty() {
                break;
            }
            t = SimTime(t.0 + 1000);
            for e in effects.drain(..) {
                match e {
                    Effect::Execute { inst } => {
                        let plan = d.plan(inst as usize).clone();
                        let outcome = StepOutcome {
                            accepted: plan.ranks.iter().map(|r| vec![0; r.decode.len()]).collect(),
                            ..Default::default()
                        };
                        d.step_done(t, inst, &outcome);
                    }
                    Effect::Transfer(x) => d.transfer_done(t, x.req),
                }
            }
        }
        d.take_notes(&mut notes);
        notes
    }

    #[test]
    fn a_pd_request_prefills_moves_its_kv_and_decodes() {
        let mut d = pd();
        d.arrive(
            SimTime::ZERO,
            Arrival {
                id: 7,
                prompt_tokens: 40,
                max_tokens: 3,
                hash_ids: &[],
                hash_block_tokens: 0,
                token_ids: None,
            },
        )
        .unwrap();
        let notes = drive(&mut d);
        let kinds: Vec<&str> = notes
            .iter()
            .filter_map(|n| match n {
                Note::Started { .. } => Some("started"),
                Note::PrefillDone { .. } => Some("prefill_done"),
                Note::KvSent { .. } => Some("kv_sent"),
                Note::KvArrived { .. } => Some("kv_arrived"),
                Note::First { .. } => Some("first"),
                Note::Finished { .. } => Some("finished"),
                _ => None,
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "started",
                "prefill_done",
                "kv_sent",
                "kv_arrived",
                "first",
                "finished"
            ]
        );
        let tokens: u32 = notes
            .iter()
            .map(|n| match n {
                Note::Tokens { n, .. } => *n,
                _ => 0,
            })
            .sum();
        assert_eq!(tokens, 3);
        assert_eq!(d.in_flight(), 0);
        // Both sides freed their blocks.
        assert_eq!(d.instance(0).kv_usage(), 0.0);
        assert_eq!(d.instance(1).kv_usage(), 0.0);
    }

    #[test]
    fn a_transfer_names_the_blocks_on_both_sides() {
        let mut d = pd();
        d.arrive(
            SimTime::ZERO,
            Arrival {
                id: 1,
                prompt_tokens: 40,
                max_tokens: 2,
                hash_ids: &[],
                hash_block_tokens: 0,
                token_ids: None,
            },
        )
        .unwrap();
        let mut effects = Vec::new();
        d.plan_steps(SimTime::ZERO);
        d.take_effects(&mut effects);
        assert_eq!(effects, vec![Effect::Execute { inst: 0 }]);
        let outcome = StepOutcome {
            accepted: vec![vec![0]],
            ..Default::default()
        };
        d.step_done(SimTime(10), 0, &outcome);
        d.plan_steps(SimTime(10));
        effects.clear();
        d.take_effects(&mut effects);
        let Some(Effect::Transfer(x)) = effects.first() else {
            panic!("a transfer: {effects:?}");
        };
        // 40 tokens in blocks of 16: three blocks on each side, 400 bytes.
        assert_eq!((x.from.instance, x.to.instance), (0, 1));
        assert_eq!(x.from.blocks.len(), 3);
        assert_eq!(x.to.blocks.len(), 3);
        assert_eq!(x.bytes, 400.0);
    }

    #[test]
    fn too_long_is_refused_and_noted() {
        let mut d = pd();
        let e = d.arrive(
            SimTime::ZERO,
            Arrival {
                id: 1,
                prompt_tokens: 4000,
                max_tokens: 200,
                hash_ids: &[],
                hash_block_tokens: 0,
                token_ids: None,
            },
        );
        assert_eq!(
            e,
            Err(Refusal::TooLong {
                tokens: 4200,
                max: 4096
            })
        );
        let mut notes = Vec::new();
        d.take_notes(&mut notes);
        assert!(matches!(notes[0], Note::Rejected { req: 1, .. }));
    }

    #[test]
    fn an_abort_frees_the_kv_on_every_instance() {
        let mut d = pd();
        d.arrive(
            SimTime::ZERO,
            Arrival {
                id: 1,
                prompt_tokens: 100,
                max_tokens: 50,
                hash_ids: &[],
                hash_block_tokens: 0,
                token_ids: None,
            },
        )
        .unwrap();
        d.plan_steps(SimTime::ZERO);
        assert!(d.instance(0).kv_usage() > 0.0);
        // The prefill step is in flight: the abort waits for it, then frees.
        assert!(d.abort(SimTime(5), 1));
        let outcome = StepOutcome {
            accepted: vec![vec![0]],
            ..Default::default()
        };
        d.step_done(SimTime(10), 0, &outcome);
        assert_eq!(d.instance(0).kv_usage(), 0.0);
        assert_eq!(d.in_flight(), 0);
        assert!(!d.abort(SimTime(11), 1));
    }

    #[test]
    fn the_core_runs_the_rebalance_cycle_from_the_devices_heat() {
        use crate::eplb::cycle::CycleConfig;
        use crate::eplb::{place, EpLayout, Policy as Eplb};
        let layout = EpLayout {
            slots: 4,
            dies: 2,
            dies_per_node: 2,
            groups: 1,
        };
        // Two MoE layers of four experts, placed for an even load: experts 0 and 1 on die 0.
        let even = vec![vec![0.25; 4]; 2];
        let placement = place(Eplb::Identity, &even, &layout).unwrap();
        let mut c = cfg(Role::Mixed, 64);
        c.max_num_seqs = 1;
        let mut sp = spec("mixed", c);
        sp.eplb = Some(EplbSpec {
            rebalancer: Rebalancer::new(
                CycleConfig {
                    heat_interval: 2,
                    algorithm_interval: 1,
                    policy: Eplb::Greedy,
                },
                layout,
                2,
                4,
            ),
            placement,
            top_k: 2.0,
            shares: None,
        });
        let mut d = Deployment::new(
            DeploymentConfig {
                prefill_policy: Policy::LoadBalance,
                decode_policy: Policy::LoadBalance,
                kv_bytes_per_token: 1.0,
            },
            vec![sp],
        );
        d.arrive(
            SimTime::ZERO,
            Arrival {
                id: 1,
                prompt_tokens: 10,
                max_tokens: 20,
                hash_ids: &[],
                hash_block_tokens: 0,
                token_ids: None,
            },
        )
        .unwrap();
        // The routers see experts 0 and 1 hot: the cycle must split them across the dies, one
        // layer per step, through the plans.
        let hot = vec![vec![10.0, 10.0, 1.0, 1.0]; 2];
        let mut moves = Vec::new();
        let mut effects = Vec::new();
        for k in 0..20u64 {
            let t = SimTime(k * 1000);
            d.plan_steps(t);
            effects.clear();
            d.take_effects(&mut effects);
            if effects.is_empty() {
                break;
            }
            if let Some(m) = &d.plan(0).expert_move {
                moves.push(m.clone());
            }
            let outcome = StepOutcome {
                accepted: vec![vec![0]],
                expert_heat: Some(ExpertHeat::Counts(hot.clone())),
                ..Default::default()
            };
            d.step_done(SimTime(k * 1000 + 500), 0, &outcome);
        }
        // Heat for two steps, the algorithm for one, then layer 0 and layer 1.
        assert_eq!(moves.iter().map(|m| m.layer).collect::<Vec<_>>(), [0, 1]);
        for m in &moves {
            let die0: Vec<u32> = m.placement.phy2log[..2].to_vec();
            assert!(
                !(die0.contains(&0) && die0.contains(&1)),
                "the hot experts are split: {die0:?}"
            );
            assert!(m.max_slots_per_die > 0);
        }
    }

    #[test]
    fn token_hashes_cover_full_chunks_only() {
        let ids: Vec<u32> = (0..40).collect();
        assert_eq!(token_hashes(&ids, 16).len(), 2);
        assert_eq!(token_hashes(&ids[..16], 16), token_hashes(&ids[..20], 16));
        assert_ne!(token_hashes(&ids[..16], 16), token_hashes(&ids[1..17], 16));
    }
}
