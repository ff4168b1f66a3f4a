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
//!
//! - `interface`: what drivers hand the core and what it hands back (configuration, arrivals,
//!   effects, notes, refusals).
//! - `eplb`: an instance's rebalance cycle as the core runs it (heat in, layer moves out).
//! - `hashes`: content hashes of requests' tokens (prompt, routing, produced tokens).
//! - `transfer`: the prefill-to-decode KV hand-off (transfer started, moved, landed).

mod eplb;
mod hashes;
mod interface;
mod transfer;

pub use eplb::EplbSpec;
pub use hashes::token_hashes;
pub use interface::{Arrival, DeploymentConfig, Effect, InstanceSpec, Note, Refusal, StepRecord};

use crate::device::{FinishReason, ReqId, SamplingParams, StepOutcome, StepPlan};
use crate::idmap::IdMap;
use crate::instance::{InstEvent, Instance, NewRequest};
use crate::layout::Role;
use crate::pd::Proxy;
use crate::time::SimTime;
use eplb::EplbRun;
use hashes::{extend_hashes, ROUTE_HASH_TOKENS};
use std::sync::Arc;

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
    sampling: Option<Arc<SamplingParams>>,
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

/// The deployment: instances, proxy, requests in flight.
#[derive(Clone, Debug)]
pub struct Deployment {
    cfg: DeploymentConfig,
    slots: Vec<Slot>,
    prefill_ids: Vec<u32>,
    serve_ids: Vec<u32>,
    proxy: Proxy,
    reqs: IdMap<Req>,
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
            reqs: IdMap::default(),
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
        self.reqs.get(req).map(|r| (r.prefill, r.decode))
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
        if self.reqs.contains_key(a.id) {
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
                sampling: a.sampling.map(|s| Arc::new(s.clone())),
                first: false,
            },
        );
        if self.prefill_ids.is_empty() {
            let k = self.proxy.route_decode(a.prompt_tokens as u64);
            let d = self.serve_ids[k];
            self.reqs.get_mut(a.id).expect("inserted").decode = d;
            self.send_to(d, a.id, false);
        } else {
            self.route_prefill(a.id);
        }
        Ok(())
    }

    fn route_prefill(&mut self, id: ReqId) {
        let r = self.reqs.get(id).expect("in flight");
        // The request's own hashes when they are at routing granularity (or all there is).
        let hashes: std::borrow::Cow<[u64]> =
            if r.hash_block_tokens == ROUTE_HASH_TOKENS || r.tokens.is_empty() {
                (&r.hashes[..]).into()
            } else {
                token_hashes(&r.tokens[..r.prompt as usize], ROUTE_HASH_TOKENS).into()
            };
        let p = self.proxy.route_prefill(r.prompt as u64, &hashes);
        let i = self.prefill_ids[p];
        self.reqs.get_mut(id).expect("in flight").prefill = Some(i);
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
        let Some(r) = self.reqs.get_mut(id) else {
            return;
        };
        extend_hashes(id, r, token_hash_block);
        let r = self.reqs.get(id).expect("in flight");
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
                sampling: r.sampling.as_ref(),
                prompt_len: r.prompt,
            },
            SimTime::ZERO,
        );
        if !prefill {
            self.reqs.get_mut(id).expect("in flight").rank = rank;
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
        let totals = slot.inst.plan_totals();
        if totals.tokens > 0 {
            slot.busy = true;
            let routed = totals.routed_tokens;
            let m = slot.eplb.as_mut().and_then(|e| e.before_step(routed));
            slot.inst.set_expert_move(m);
            self.effects.push(Effect::Execute { inst: i });
        } else {
            // Not run: what its scheduling did (a preemption, a send-back) is handled now.
            let role = slot.role;
            let mut events = std::mem::take(&mut self.events);
            events.clear();
            self.slots[i as usize].inst.take_unrun_events(&mut events);
            self.handle(i, role, &mut events);
            self.events = events;
        }
        for &(req, cached) in self.slots[i as usize].inst.started() {
            self.notes.push(Note::Started {
                req,
                inst: i,
                cached,
            });
        }
        let mut buf = std::mem::take(&mut self.buf);
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
        // The requests the step's events are about have not been touched for a while: their
        // entries are loaded together before the events are handled one by one.
        for ev in &events {
            self.reqs.prefetch(ev.req());
        }
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
                if let Some(r) = self.reqs.get_mut(req) {
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
        self.handle(i, role, &mut events);
        self.events = events;
        // Aborts that reached a busy instance apply now that its step is over.
        if !self.slots[i as usize].inst.config().async_scheduling
            && !self.slots[i as usize].deferred.is_empty()
        {
            self.flush_deferred(i, now);
        }
        self.want_start(i);
    }

    /// Carries out what instance `i`'s scheduling and step did to its requests (`events`,
    /// emptied).
    fn handle(&mut self, i: u32, role: Role, events: &mut Vec<InstEvent>) {
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
    }

    /// A prefill instance finished a prompt: hand the request to a decode instance, which pulls
    /// the KV.
    fn prefill_done(&mut self, i: u32, id: ReqId) {
        let Some(r) = self.reqs.get(id) else {
            return;
        };
        let prompt = r.prompt as u64;
        self.notes.push(Note::PrefillDone { req: id, inst: i });
        self.proxy
            .prefill_done(self.slots[i as usize].role_index, prompt);
        let k = self.proxy.route_decode(prompt);
        let d = self.serve_ids[k];
        self.reqs.get_mut(id).expect("in flight").decode = d;
        self.send_to(d, id, true);
    }

    fn first_token(&mut self, i: u32, id: ReqId) {
        let Some(r) = self.reqs.get_mut(id) else {
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
        let Some(r) = self.reqs.remove(id) else {
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
        let Some(r) = self.reqs.get_mut(id) else {
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
        let Some(r) = self.reqs.remove(id) else {
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
