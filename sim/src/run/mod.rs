//! The virtual-time event loop: a whole deployment serving a workload.
//!
//! Instances (from `dstwin_core::instance`, the same code the wall-clock runtime drives) step
//! on `SimDevice`s; a PD proxy routes requests; KV moves from prefill to decode over links that
//! share their bandwidth among concurrent transfers (processor sharing). Events at equal times run
//! in insertion order: the queue is keyed by (time, sequence number).

mod link;
mod report;

pub use report::{InstanceReport, RequestRow, RunResult, SimReport, Span};

use crate::metrics::Latencies;
use crate::scenario::{InstanceSetup, PreemptionSpec, Scenario};
use dstwin_core::device::{Capacity, ClassTimes, Device, ReqId, StepOutcome, CLASS_SLOTS};
use dstwin_core::eplb::cycle::{CycleConfig, Rebalancer};
use dstwin_core::eplb::{place, EpLayout, Placement};
use dstwin_core::instance::{InstEvent, Instance, InstanceConfig, NewRequest};
use dstwin_core::layout::Role;
use dstwin_core::model::kv_bytes;
use dstwin_core::mtp::Acceptance;
use dstwin_core::pd::Proxy;
use dstwin_core::time::{SimDuration, SimTime};
use dstwin_hwmodels::{A2aMode, Comm, CommKind};
use dstwin_traces::{LengthSampler, WorkloadSource};
use dstwin_twin::device::{Experts, HostOverhead, PricerSpec, SimDevice, StepPricer};
use dstwin_twin::expert_load::{ExpertLoad, ExpertLoadSpec};
use link::Link;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum RunError {
    #[error(transparent)]
    Workload(#[from] dstwin_traces::TraceError),
    #[error(transparent)]
    Device(#[from] dstwin_core::device::DeviceError),
    #[error(transparent)]
    ExpertLoad(#[from] dstwin_twin::expert_load::ExpertLoadError),
    #[error("instance '{instance}': placement file {file}: {message}")]
    Placement {
        instance: String,
        file: String,
        message: String,
    },
    #[error("instance '{instance}': expert placement")]
    Eplb {
        instance: String,
        #[source]
        source: dstwin_core::eplb::EplbError,
    },
    #[error("deadlock at t={time}: {unfinished} requests unfinished and nothing left to happen ({hint})")]
    Deadlock {
        time: SimTime,
        unfinished: u64,
        hint: String,
    },
}

/// Progress of a run, for progress bars.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub now: SimTime,
    pub finished: u64,
    pub total: u64,
}

/// What to collect besides the report.
#[derive(Default)]
pub struct RunOptions<'a> {
    /// Called every few thousand events.
    pub progress: Option<&'a mut dyn FnMut(&Progress)>,
    /// Record a timeline of steps and transfers (chrome trace).
    pub timeline: bool,
    /// Record one row per finished request.
    pub per_request: bool,
    /// Step every decoding request every step instead of advancing steady ones in aggregate.
    /// Same results, slower: for checking the aggregation and for profiling.
    pub step_by_step: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Arrival(u64),
    StepDone(u32),
    Xfer { link: u32, gen: u64 },
    Deliver(ReqId),
    Stop,
}

#[derive(Clone, Copy, Debug, Default)]
struct Req {
    arrival: SimTime,
    prompt: u32,
    output: u32,
    prefill: u32,
    decode: u32,
    rank: u32,
    started: Option<SimTime>,
    first_token: Option<SimTime>,
    last_token: SimTime,
    emitted: u32,
    preemptions: u32,
    done: bool,
    hashes: (u32, u32),
    xfer_start: SimTime,
}

struct Inst {
    setup: usize,
    name: String,
    role: Role,
    inst: Instance,
    device: SimDevice,
    busy: bool,
    step_start: SimTime,
    outcome: StepOutcome,
    step_tokens: u64,
    steps: u64,
    busy_ns: u64,
    tokens: u64,
    class: ClassTimes,
    kv_weighted: f64,
    kv_max: f64,
    link_base: u32,
    /// End time of every step, for inter-token gaps.
    step_ends: Vec<SimTime>,
    /// Sum over steps of the MoE imbalance the step ran with.
    imbalance_sum: f64,
    /// Async scheduling: the next step was scheduled when the running one started, so what
    /// reaches the instance meanwhile waits for the schedule after it.
    async_scheduling: bool,
    deferred: Vec<Deferred>,
}

/// Something that reached an async-scheduling instance during a step.
#[derive(Clone, Copy, Debug)]
enum Deferred {
    Add { id: ReqId, remote_kv: bool },
    KvArrived(ReqId),
}

struct Sim<'s, 'o> {
    s: &'s Scenario,
    /// Instances to start once the current instant's events are applied.
    starts: Vec<usize>,
    opts: RunOptions<'o>,
    now: SimTime,
    seq: u64,
    queue: BinaryHeap<Reverse<(SimTime, u64, Ev)>>,
    insts: Vec<Inst>,
    prefill_ids: Vec<usize>,
    serve_ids: Vec<usize>,
    proxy: Proxy,
    links: Vec<Link>,
    reqs: Vec<Req>,
    hash_pool: Vec<u64>,
    hash_block_tokens: Option<u32>,
    open: Option<dstwin_traces::workload::Workload>,
    closed: Option<(u64, LengthSampler)>,
    total: u64,
    finished: u64,
    rejected: u64,
    /// The smallest max_model_len of any instance a request passes through.
    max_len: u64,
    lat: Latencies,
    events: Vec<InstEvent>,
    input_tokens: u64,
    output_tokens: u64,
    /// Statistics leave out what happened before this (the scenario's warm-up).
    warmup: SimTime,
    /// Requests that arrived after the warm-up and finished.
    measured_finished: u64,
    good: u64,
    sent_back: u64,
    kv_transfers: u64,
    kv_bytes: f64,
    kv_bytes_per_token: f64,
    rows: Vec<RequestRow>,
    spans: Vec<Span>,
    processed: u64,
    /// Scratch request ids, reused.
    buf: Vec<ReqId>,
}

/// The routed experts of one instance: load model, first placement, optional rebalance cycle, and
/// the price of moving one expert's weights onto a die.
fn experts_for(
    s: &Scenario,
    setup: &InstanceSetup,
    spec: &ExpertLoadSpec,
    mtp_layers: u64,
    index: u64,
) -> Result<Experts, RunError> {
    let plan = &setup.plan;
    let layers = (s.model.moe_layers() + mtp_layers) as usize;
    let experts = s.model.routed_experts as usize;
    let load = ExpertLoad::new(
        spec,
        layers,
        experts,
        s.seed ^ 0xe1b_0000 ^ index,
        &s.base_dir,
    )?;
    let layout = EpLayout {
        slots: s.model.routed_experts as u32 + plan.redundant_experts,
        dies: plan.routed_dies,
        dies_per_node: s.system().dies_per_node(),
        groups: s.model.router_groups as u32,
    };
    let eplb_err = |source| RunError::Eplb {
        instance: setup.name.clone(),
        source,
    };
    let placement =
        match &setup.placement {
            Some(file) => load_placement(&s.base_dir.join(file), layers, experts, &layout)
                .map_err(|message| RunError::Placement {
                    instance: setup.name.clone(),
                    file: file.clone(),
                    message,
                })?,
            None => place(s.eplb.policy, load.shares(), &layout).map_err(eplb_err)?,
        };
    let rebalancer = s.eplb.dynamic.then(|| {
        Rebalancer::new(
            CycleConfig {
                heat_interval: s.eplb.heat_interval,
                algorithm_interval: s.eplb.algorithm_interval,
                policy: s.eplb.policy,
            },
            layout,
            layers,
            experts,
        )
    });
    let expert_bytes = s.model.expert_params() as f64 * s.quant.expert_weight().bytes();
    // Moving an expert: its weights cross the EP group's fabric, are read from the source die's
    // HBM and written to the destination's (the copy is not overlapped with the step).
    let move_s = s
        .cost
        .comm(&Comm {
            kind: CommKind::P2p,
            bytes: expert_bytes,
            group: plan.ep,
            mode: A2aMode::Normal,
        })
        .time_s
        + 2.0 * expert_bytes / s.system().chip.hbm_bytes_per_s();
    Ok(Experts::new(
        load,
        placement,
        rebalancer,
        s.model.top_k as f64,
        move_s,
        spec.concentration(),
    ))
}

/// Reads a placement file: `dstwin eplb --json` output or a bare placement object.
fn load_placement(
    path: &std::path::Path,
    layers: usize,
    experts: usize,
    layout: &EpLayout,
) -> Result<Placement, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let p: Placement = serde_json::from_value(v.get("placement").cloned().unwrap_or(v))
        .map_err(|e| e.to_string())?;
    p.check(layers, experts, layout)
        .map_err(|e| e.to_string())?;
    Ok(p)
}

fn instance_config(setup: &InstanceSetup, s: &Scenario) -> InstanceConfig {
    let sc = &setup.scheduler;
    InstanceConfig {
        role: setup.plan.role,
        dp_ranks: setup.plan.dp,
        max_num_batched_tokens: sc.max_num_batched_tokens,
        max_num_seqs: sc.max_num_seqs,
        block_size: sc.block_size,
        num_kv_blocks: setup.kv_blocks_per_rank,
        enable_chunked_prefill: sc.enable_chunked_prefill,
        enable_prefix_caching: sc.enable_prefix_caching,
        long_prefill_token_threshold: sc.long_prefill_token_threshold,
        max_model_len: setup.max_model_len,
        num_spec_tokens: s.mtp.tokens,
        attn_cap: s.model.attn_cap(),
        send_back: sc.preemption == PreemptionSpec::SendBack,
        async_scheduling: sc.async_scheduling,
    }
}

/// One instance of a scenario, ready to run: its name (`decode`, `prefill[2]`), the index of its
/// `[[instance]]` setup, its scheduler configuration and its twin device.
pub struct BuiltInstance {
    pub name: String,
    pub setup: usize,
    pub config: InstanceConfig,
    pub device: SimDevice,
}

/// KV bytes one context token takes across the model's layers (with MTP layers when MTP is on):
/// what a PD hand-off moves per prompt token.
pub fn kv_bytes_per_token(s: &Scenario) -> f64 {
    let mtp_layers = if s.mtp.tokens > 0 {
        s.model.mtp_layers
    } else {
        0
    };
    kv_bytes(&s.model, s.kv_dtype, mtp_layers).per_token
}

/// Builds every instance of a scenario with its twin device: what the virtual-time driver runs,
/// and what `serve --device twin` runs in wall-clock time.
pub fn build_instances(s: &Scenario) -> Result<Vec<BuiltInstance>, RunError> {
    let mtp_layers = if s.mtp.tokens > 0 {
        s.model.mtp_layers
    } else {
        0
    };
    let kv_bytes_per_token = kv_bytes_per_token(s);
    let mut out = Vec::new();
    for (k, setup) in s.instances.iter().enumerate() {
        for c in 0..setup.count {
            let index = out.len() as u64;
            let pricer = StepPricer::new(PricerSpec {
                model: s.model.clone(),
                quant: s.quant,
                kv_dtype: s.kv_dtype,
                plan: setup.plan.clone(),
                mtp_tokens: s.mtp.tokens,
                two_microbatch: setup.two_microbatch,
                cost: s.cost.clone(),
            });
            // Acceptance is a property of the request and its sampling step, the same on every
            // instance.
            let mtp = Acceptance::new(&s.mtp.acceptance, s.seed);
            let capacity = Capacity {
                dp_ranks: setup.plan.dp,
                kv_blocks_per_rank: setup.kv_blocks_per_rank,
                block_size: setup.scheduler.block_size,
                kv_bytes_per_token,
            };
            let experts = match s.expert_load {
                ExpertLoadSpec::Perfect => None,
                ref spec => Some(experts_for(s, setup, spec, mtp_layers, index)?),
            };
            let sc = &setup.scheduler;
            let device = SimDevice::new(pricer, mtp, capacity, experts)
                .with_host(HostOverhead {
                    step_s: sc.host_overhead_us * 1e-6,
                    per_seq_s: sc.host_overhead_per_seq_us * 1e-6,
                    overlapped: sc.async_scheduling,
                })
                .with_span(s.dies());
            out.push(BuiltInstance {
                name: if setup.count > 1 {
                    format!("{}[{c}]", setup.name)
                } else {
                    setup.name.clone()
                },
                setup: k,
                config: instance_config(setup, s),
                device,
            });
        }
    }
    Ok(out)
}

impl<'s, 'o> Sim<'s, 'o> {
    fn new(s: &'s Scenario, opts: RunOptions<'o>) -> Result<Self, RunError> {
        let kv_bytes_per_token = kv_bytes_per_token(s);
        let mut insts = Vec::new();
        let mut links = Vec::new();
        for b in build_instances(s)? {
            let BuiltInstance {
                name,
                setup: k,
                config,
                mut device,
            } = b;
            let setup = &s.instances[k];
            {
                let link_base = links.len() as u32;
                if setup.plan.role != Role::Prefill {
                    // One ingress link per decode DP rank: its dies' share of the fabric level that
                    // joins prefill and decode instances.
                    let x = device.ingress();
                    for _ in 0..setup.plan.dp {
                        links.push(Link::new(x.bytes_per_s * setup.plan.tp as f64, x.latency));
                    }
                }
                insts.push(Inst {
                    setup: k,
                    name,
                    role: setup.plan.role,
                    inst: {
                        let mut inst = Instance::new(config);
                        if !opts.step_by_step {
                            inst.set_acceptance(device.acceptance());
                        }
                        inst
                    },
                    device,
                    busy: false,
                    step_start: SimTime::ZERO,
                    outcome: StepOutcome::default(),
                    step_tokens: 0,
                    steps: 0,
                    busy_ns: 0,
                    tokens: 0,
                    class: [0.0; CLASS_SLOTS],
                    kv_weighted: 0.0,
                    kv_max: 0.0,
                    link_base,
                    step_ends: Vec::new(),
                    imbalance_sum: 0.0,
                    async_scheduling: setup.scheduler.async_scheduling,
                    deferred: Vec::new(),
                });
            }
        }
        let prefill_ids: Vec<usize> = (0..insts.len())
            .filter(|&i| insts[i].role == Role::Prefill)
            .collect();
        let serve_ids: Vec<usize> = (0..insts.len())
            .filter(|&i| insts[i].role != Role::Prefill)
            .collect();
        let proxy = Proxy::new(
            s.proxy.prefill_policy,
            prefill_ids.len().max(1),
            s.proxy.decode_policy,
            serve_ids.len(),
        );
        let (open, closed, total) = match s.workload.build(s.seed, &s.base_dir)? {
            WorkloadSource::Open(w) => {
                let n = w.len() as u64;
                (Some(w), None, n)
            }
            WorkloadSource::ClosedLoop {
                concurrency,
                num_requests,
                sampler,
            } => (
                None,
                Some((concurrency.get() as u64, *sampler)),
                num_requests.get(),
            ),
        };
        let hash_block_tokens = open.as_ref().and_then(|w| w.hash_block_tokens());
        Ok(Sim {
            s,
            starts: Vec::new(),
            opts,
            now: SimTime::ZERO,
            seq: 0,
            queue: BinaryHeap::new(),
            insts,
            prefill_ids,
            serve_ids,
            proxy,
            links,
            reqs: Vec::with_capacity(total.min(1 << 24) as usize),
            hash_pool: Vec::new(),
            hash_block_tokens,
            open,
            closed,
            total,
            finished: 0,
            rejected: 0,
            max_len: s
                .instances
                .iter()
                .map(|k| k.max_model_len)
                .min()
                .unwrap_or(u64::MAX),
            lat: Latencies::default(),
            events: Vec::new(),
            input_tokens: 0,
            output_tokens: 0,
            warmup: SimTime::ZERO + s.warmup,
            measured_finished: 0,
            good: 0,
            sent_back: 0,
            kv_transfers: 0,
            kv_bytes: 0.0,
            kv_bytes_per_token,
            rows: Vec::new(),
            spans: Vec::new(),
            processed: 0,
            buf: Vec::new(),
        })
    }

    fn push(&mut self, t: SimTime, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse((t, self.seq, ev)));
    }

    fn hashes(&self, r: &Req) -> &[u64] {
        &self.hash_pool[r.hashes.0 as usize..(r.hashes.0 + r.hashes.1) as usize]
    }

    /// Registers request `id` and routes it.
    fn admit(
        &mut self,
        id: ReqId,
        prompt: u32,
        output: u32,
        hashes: &[u64],
    ) -> Result<(), RunError> {
        let start = self.hash_pool.len() as u32;
        self.hash_pool.extend_from_slice(hashes);
        debug_assert_eq!(self.reqs.len() as u64, id);
        self.reqs.push(Req {
            arrival: self.now,
            prompt,
            output,
            hashes: (start, hashes.len() as u32),
            ..Req::default()
        });
        if prompt as u64 + output as u64 > self.max_len {
            // vLLM answers such a request with an error (400) before scheduling it.
            self.rejected += 1;
            self.reqs[id as usize].done = true;
            return self.next_closed_loop();
        }
        if self.prefill_ids.is_empty() {
            let i = self.proxy.route_decode(prompt as u64);
            self.reqs[id as usize].decode = self.serve_ids[i] as u32;
            self.send_to_instance(self.serve_ids[i], id, false)
        } else {
            self.route_prefill(id)
        }
    }

    fn route_prefill(&mut self, id: ReqId) -> Result<(), RunError> {
        let r = self.reqs[id as usize];
        let hashes = self.hashes(&r).to_vec();
        let p = self.proxy.route_prefill(r.prompt as u64, &hashes);
        self.reqs[id as usize].prefill = self.prefill_ids[p] as u32;
        self.send_to_instance(self.prefill_ids[p], id, false)
    }

    fn send_to_instance(&mut self, i: usize, id: ReqId, remote_kv: bool) -> Result<(), RunError> {
        if self.insts[i].async_scheduling && self.insts[i].busy {
            self.insts[i].deferred.push(Deferred::Add { id, remote_kv });
            return Ok(());
        }
        self.add_to_instance(i, id, remote_kv);
        self.want_start(i);
        Ok(())
    }

    fn add_to_instance(&mut self, i: usize, id: ReqId, remote_kv: bool) {
        let r = self.reqs[id as usize];
        let role = self.insts[i].role;
        let hashes = self.hashes(&r).to_vec();
        // A request sent back after decoding some tokens resumes with them as part of its prompt.
        let rank = self.insts[i].inst.add_request(
            NewRequest {
                id,
                prompt_tokens: r.prompt + r.emitted,
                // A prefill instance computes the prompt and samples one token (max_tokens=1).
                max_output_tokens: if role == Role::Prefill {
                    1
                } else {
                    r.output - r.emitted
                },
                hash_ids: &hashes,
                hash_block_tokens: self.hash_block_tokens.unwrap_or(0),
                remote_kv,
            },
            self.now,
        );
        if role != Role::Prefill {
            self.reqs[id as usize].rank = rank;
        }
    }

    /// Hands an async-scheduling instance what reached it during its last step, now that the
    /// step after it is scheduled.
    fn flush_deferred(&mut self, i: usize) {
        let mut items = std::mem::take(&mut self.insts[i].deferred);
        for it in items.drain(..) {
            match it {
                Deferred::Add { id, remote_kv } => self.add_to_instance(i, id, remote_kv),
                Deferred::KvArrived(id) => self.insts[i].inst.kv_arrived(id, self.now),
            }
        }
        // Keep the buffer.
        self.insts[i].deferred = items;
    }

    /// Asks for instance `i` to plan a step once every event of the current instant has been
    /// applied: requests arriving together are scheduled together, whatever order their events
    /// were queued in.
    fn want_start(&mut self, i: usize) {
        if !self.starts.contains(&i) {
            self.starts.push(i);
        }
    }

    fn start_pending(&mut self) -> Result<(), RunError> {
        let mut starts = std::mem::take(&mut self.starts);
        starts.sort_unstable();
        for &i in &starts {
            self.try_start(i)?;
        }
        starts.clear();
        if self.starts.is_empty() {
            self.starts = starts;
        }
        Ok(())
    }

    fn try_start(&mut self, i: usize) -> Result<(), RunError> {
        let now = self.now;
        let inst = &mut self.insts[i];
        if inst.busy {
            return Ok(());
        }
        if !inst.inst.has_work() {
            // Nothing was scheduled behind the last step: what arrived during it is next.
            if inst.deferred.is_empty() {
                return Ok(());
            }
            self.flush_deferred(i);
            if !self.insts[i].inst.has_work() {
                return Ok(());
            }
        }
        let inst = &mut self.insts[i];
        inst.inst.schedule(now);
        let tokens = inst.inst.plan().tokens();
        if tokens > 0 {
            inst.device.execute(inst.inst.plan(), &mut inst.outcome)?;
        }
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        buf.extend_from_slice(inst.inst.started());
        for &id in &buf {
            let r = &mut self.reqs[id as usize];
            if r.started.is_none() {
                r.started = Some(now);
                if r.arrival >= self.warmup {
                    self.lat.queue.record(now - r.arrival);
                }
            }
        }
        buf.clear();
        buf.extend_from_slice(self.insts[i].inst.kv_pulls());
        for &id in &buf {
            self.start_transfer(i, id);
        }
        self.buf = buf;
        let inst = &mut self.insts[i];
        if tokens > 0 {
            inst.busy = true;
            inst.step_start = now;
            inst.step_tokens = tokens;
            let end = now + inst.outcome.duration;
            self.push(end, Ev::StepDone(i as u32));
        }
        if !self.insts[i].deferred.is_empty() {
            self.flush_deferred(i);
            if !self.insts[i].busy {
                return self.try_start(i);
            }
        }
        Ok(())
    }

    fn start_transfer(&mut self, i: usize, id: ReqId) {
        let r = self.reqs[id as usize];
        let bytes = (r.prompt + r.emitted) as f64 * self.kv_bytes_per_token;
        self.reqs[id as usize].xfer_start = self.now;
        self.kv_transfers += 1;
        self.kv_bytes += bytes;
        let l = (self.insts[i].link_base + r.rank) as usize;
        if let Some((t, gen)) = self.links[l].add(self.now, id, bytes) {
            self.push(
                t,
                Ev::Xfer {
                    link: l as u32,
                    gen,
                },
            );
        }
    }

    fn on_xfer(&mut self, l: usize, gen: u64) {
        let mut done = std::mem::take(&mut self.buf);
        done.clear();
        let next = self.links[l].complete(self.now, gen, &mut done);
        let latency = self.links[l].latency();
        for &id in &done {
            self.push(self.now + latency, Ev::Deliver(id));
        }
        self.buf = done;
        if let Some((t, gen)) = next {
            self.push(
                t,
                Ev::Xfer {
                    link: l as u32,
                    gen,
                },
            );
        }
    }

    fn on_deliver(&mut self, id: ReqId) -> Result<(), RunError> {
        let r = self.reqs[id as usize];
        let d = r.decode as usize;
        if r.arrival >= self.warmup {
            self.lat.kv_transfer.record(self.now - r.xfer_start);
        }
        if self.opts.timeline {
            self.spans.push(Span {
                name: format!("kv req {id}"),
                lane: self.insts.len() as u32,
                lane_name: "kv transfers".into(),
                start: r.xfer_start,
                dur: self.now - r.xfer_start,
                tokens: r.prompt as u64,
            });
        }
        if self.insts[d].async_scheduling && self.insts[d].busy {
            self.insts[d].deferred.push(Deferred::KvArrived(id));
        } else {
            self.insts[d].inst.kv_arrived(id, self.now);
        }
        let p = r.prefill as usize;
        if self.insts[p].role == Role::Prefill {
            self.insts[p].inst.release_kv(id);
            self.want_start(p);
        }
        self.want_start(d);
        Ok(())
    }

    fn on_step_done(&mut self, i: usize) -> Result<(), RunError> {
        let now = self.now;
        let mut events = std::mem::take(&mut self.events);
        events.clear();
        let (sum, prev_end) = {
            let inst = &mut self.insts[i];
            inst.busy = false;
            let dur = now - inst.step_start;
            if inst.step_start >= self.warmup {
                inst.steps += 1;
                inst.busy_ns += dur.0;
                inst.tokens += inst.step_tokens;
                inst.imbalance_sum += inst.device.step_imbalance();
                for (a, b) in inst.class.iter_mut().zip(inst.outcome.class_times.iter()) {
                    *a += b;
                }
                let usage = inst.inst.kv_usage();
                inst.kv_weighted += usage * dur.as_secs_f64();
                inst.kv_max = inst.kv_max.max(usage);
            }
            if self.opts.timeline {
                self.spans.push(Span {
                    name: format!("step {} tok", inst.step_tokens),
                    lane: i as u32,
                    lane_name: inst.name.clone(),
                    start: inst.step_start,
                    dur,
                    tokens: inst.step_tokens,
                });
            }
            let sum = inst.inst.apply(now, &inst.outcome, &mut events);
            let prev_end = inst.step_ends.last().copied().unwrap_or(SimTime::ZERO);
            inst.step_ends.push(now);
            (sum, prev_end)
        };
        if self.insts[i].role != Role::Prefill && now >= self.warmup {
            self.output_tokens += sum.tokens;
            // Requests that sampled in the previous step too: one ITL sample each.
            self.lat.itl.record_n(now - prev_end, sum.continuing);
        }
        let role = self.insts[i].role;
        for ev in events.drain(..) {
            match ev {
                InstEvent::First { req } if role == Role::Prefill => self.prefill_done(i, req)?,
                InstEvent::First { req } => self.first_token(req),
                InstEvent::Gap { since_step, .. } => {
                    // Steps are counted from 1; step k ended at step_ends[k - 1].
                    let since = self.insts[i].step_ends[since_step as usize - 1];
                    if now >= self.warmup {
                        self.lat.itl.record(now - since);
                    }
                }
                InstEvent::Finished { req } => self.finished_request(req)?,
                InstEvent::Preempted { req } => self.reqs[req as usize].preemptions += 1,
                InstEvent::SentBack { req, emitted } => {
                    self.sent_back += 1;
                    let r = &mut self.reqs[req as usize];
                    r.preemptions += 1;
                    r.emitted += emitted;
                    r.last_token = now;
                    let (d, prompt) = (r.decode as usize, r.prompt as u64);
                    let k = self
                        .serve_ids
                        .iter()
                        .position(|&x| x == d)
                        .expect("decode instance");
                    self.proxy.decode_done(k, prompt);
                    self.route_prefill(req)?;
                }
            }
        }
        self.events = events;
        self.want_start(i);
        Ok(())
    }

    /// A prefill instance finished a prompt: hand the request to a decode instance, which pulls
    /// the KV.
    fn prefill_done(&mut self, i: usize, id: ReqId) -> Result<(), RunError> {
        let r = self.reqs[id as usize];
        if r.first_token.is_none() && self.now >= self.warmup {
            self.input_tokens += r.prompt as u64;
        }
        let pk = self
            .prefill_ids
            .iter()
            .position(|&x| x == i)
            .expect("prefill instance");
        self.proxy.prefill_done(pk, r.prompt as u64);
        let dk = self.proxy.route_decode(r.prompt as u64);
        let d = self.serve_ids[dk];
        self.reqs[id as usize].decode = d as u32;
        self.send_to_instance(d, id, true)
    }

    fn first_token(&mut self, id: ReqId) {
        let now = self.now;
        let r = &mut self.reqs[id as usize];
        if r.first_token.is_some() {
            // Resumed after being sent back: the wait counts as one inter-token gap.
            if now >= self.warmup {
                self.lat.itl.record(now - r.last_token);
            }
            return;
        }
        r.first_token = Some(now);
        r.last_token = now;
        if r.arrival >= self.warmup {
            self.lat.ttft.record(now - r.arrival);
        }
        if self.prefill_ids.is_empty() && now >= self.warmup {
            // Mixed instances: the prompt is computed when the first token comes.
            self.input_tokens += r.prompt as u64;
        }
        if r.prefill != r.decode {
            if let Some(pk) = self
                .prefill_ids
                .iter()
                .position(|&x| x == r.prefill as usize)
            {
                self.proxy.decode_started(pk, r.prompt as u64);
            }
        }
    }

    fn finished_request(&mut self, id: ReqId) -> Result<(), RunError> {
        let now = self.now;
        let slo = self.s.slo;
        let r = &mut self.reqs[id as usize];
        debug_assert!(!r.done, "request {id} finished twice");
        r.done = true;
        r.emitted = r.output;
        self.finished += 1;
        let first = r.first_token.unwrap_or(now);
        let ttft = first - r.arrival;
        let e2e = now - r.arrival;
        let tpot = if r.output > 1 {
            SimDuration((now - first).0 / (r.output as u64 - 1))
        } else {
            SimDuration::ZERO
        };
        let met = slo.ttft.is_none_or(|x| ttft <= x)
            && slo.tpot.is_none_or(|x| tpot <= x)
            && slo.e2e.is_none_or(|x| e2e <= x);
        if r.arrival >= self.warmup {
            self.measured_finished += 1;
            if r.output > 1 {
                self.lat.tpot.record(tpot);
            }
            self.lat.e2e.record(e2e);
            if met {
                self.good += 1;
            }
        }
        let r = *r;
        let dk = self
            .serve_ids
            .iter()
            .position(|&x| x == r.decode as usize)
            .expect("serving instance");
        self.proxy.decode_done(dk, r.prompt as u64);
        if self.opts.per_request {
            self.rows.push(RequestRow {
                id,
                arrival_s: r.arrival.as_secs_f64(),
                input_tokens: r.prompt,
                output_tokens: r.output,
                ttft_ms: ttft.as_millis_f64(),
                tpot_ms: tpot.as_millis_f64(),
                e2e_ms: e2e.as_millis_f64(),
                queue_ms: r.started.map_or(0.0, |s| (s - r.arrival).as_millis_f64()),
                preemptions: r.preemptions,
                prefill_instance: if self.prefill_ids.is_empty() {
                    String::new()
                } else {
                    self.insts[r.prefill as usize].name.clone()
                },
                decode_instance: self.insts[r.decode as usize].name.clone(),
                met_slo: met,
            });
        }
        self.next_closed_loop()
    }

    fn next_closed_loop(&mut self) -> Result<(), RunError> {
        if let Some((_, sampler)) = &mut self.closed {
            let id = self.reqs.len() as u64;
            if id < self.total {
                let l = sampler.next_lengths();
                return self.admit(id, l.input_tokens, l.output_tokens, &[]);
            }
        }
        Ok(())
    }

    fn on_arrival(&mut self, k: u64) -> Result<(), RunError> {
        let w = self
            .open
            .take()
            .expect("an open workload schedules arrivals");
        let req = w.requests()[k as usize];
        let res = self.admit(k, req.input_tokens, req.output_tokens, w.hash_ids(&req));
        if let Some(next) = w.requests().get(k as usize + 1) {
            self.push(
                SimTime(next.arrival_ns.saturating_sub(w.first_arrival_ns())),
                Ev::Arrival(k + 1),
            );
        }
        self.open = Some(w);
        res
    }

    fn run(mut self) -> Result<RunResult, RunError> {
        if self.open.is_some() {
            self.push(SimTime::ZERO, Ev::Arrival(0));
        } else if let Some((concurrency, _)) = &self.closed {
            for _ in 0..(*concurrency).min(self.total) {
                self.next_closed_loop()?;
            }
        }
        if let Some(d) = self.s.duration {
            self.push(SimTime::ZERO + d, Ev::Stop);
        }
        // A closed loop admits its first requests before any event.
        if self
            .queue
            .peek()
            .is_none_or(|Reverse((t, _, _))| *t > self.now)
        {
            self.start_pending()?;
        }
        while let Some(Reverse((t, _, ev))) = self.queue.pop() {
            debug_assert!(t >= self.now, "time never runs backwards");
            self.now = t;
            self.processed += 1;
            match ev {
                Ev::Arrival(k) => self.on_arrival(k)?,
                Ev::StepDone(i) => self.on_step_done(i as usize)?,
                Ev::Xfer { link, gen } => self.on_xfer(link as usize, gen),
                Ev::Deliver(id) => self.on_deliver(id)?,
                Ev::Stop => break,
            }
            if self
                .queue
                .peek()
                .is_none_or(|Reverse((next, _, _))| *next > self.now)
            {
                self.start_pending()?;
            }
            if self.processed.is_multiple_of(4096) {
                if let Some(p) = self.opts.progress.as_mut() {
                    p(&Progress {
                        now: self.now,
                        finished: self.finished,
                        total: self.total,
                    });
                }
            }
            if self.finished + self.rejected == self.total {
                break;
            }
        }
        let arrived = self.reqs.len() as u64;
        if self.finished + self.rejected < arrived && self.s.duration.is_none() {
            let per: Vec<String> = self
                .insts
                .iter()
                .map(|i| {
                    let st = i.inst.stats();
                    format!(
                        "{}: {} waiting, {} running, KV {:.0}% used",
                        i.name,
                        st.waiting,
                        st.running,
                        i.inst.kv_usage() * 100.0
                    )
                })
                .collect();
            return Err(RunError::Deadlock {
                time: self.now,
                unfinished: arrived - self.finished - self.rejected,
                hint: per.join("; "),
            });
        }
        Ok(self.finish(arrived))
    }
}

/// Runs a scenario to the end (all requests finished, or its duration).
pub fn run(s: &Scenario, opts: RunOptions<'_>) -> Result<RunResult, RunError> {
    Sim::new(s, opts)?.run()
}
