//! The virtual-time driver: a discrete-event loop around the deployment core, on the timeline
//! the wall-clock runtime shares ([`dstwin_core::timeline`]: event order, effect pump,
//! same-instant rule). It owns what is the simulator's alone — its own events (arrivals, paced
//! issues, the end), the workload, the twin devices and fabric, and the statistics — and nothing
//! else: routing, the PD hand-off and send-back are the core's ([`dstwin_core::deploy`]).

use super::build::{build_fabric, build_instances, deployment_config};
use super::report::{report, InstanceStats, RequestRow, RunStats, Span};
use super::{Progress, RunError, RunOptions, RunResult};
use crate::metrics::Latencies;
use crate::scenario::Scenario;
use dstwin_core::deploy::{Arrival, Deployment, Note, StepRecord};
use dstwin_core::device::{
    ClassTimes, Device, DeviceError, Fabric, ReqId, StepOutcome, CLASS_SLOTS,
};
use dstwin_core::idmap::IdMap;
use dstwin_core::layout::Role;
use dstwin_core::time::{SimDuration, SimTime};
use dstwin_core::timeline::{self, Driver, Event, Timeline};
use dstwin_traces::synthetic::Arrivals;
use dstwin_traces::{LengthSampler, RequestStream, StreamRequest, WorkloadSource};
use dstwin_twin::device::SimDevice;
use dstwin_twin::fabric::TwinFabric;

/// The simulator's own events on the timeline (step ends and the fabric's are the timeline's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Arrival(u64),
    /// A paced closed loop's next request reaches its issue time (a slot is waiting for it).
    Paced,
    Stop,
}

/// What the simulator keeps of a request in flight (statistics only).
#[derive(Clone, Copy, Debug, Default)]
struct Req {
    arrival: SimTime,
    prompt: u32,
    output: u32,
    started: Option<SimTime>,
    /// The prefill instance that computed its prompt (last, after a send-back).
    prefill: Option<u32>,
    first_token: Option<SimTime>,
    last_token: SimTime,
    preemptions: u32,
    xfer_start: SimTime,
}

/// An instance's device and its statistics.
struct InstRun {
    setup: usize,
    name: String,
    role: Role,
    device: SimDevice,
    outcome: StepOutcome,
    step_start: SimTime,
    step_tokens: u64,
    steps: u64,
    busy_ns: u64,
    tokens: u64,
    class: ClassTimes,
    kv_weighted: f64,
    kv_max: f64,
    /// End time of every step, for inter-token gaps.
    step_ends: Vec<SimTime>,
    /// Sum over steps of the MoE imbalance the step ran with.
    imbalance_sum: f64,
}

pub(super) struct Sim<'s, 'o> {
    s: &'s Scenario,
    opts: RunOptions<'o>,
    tl: Timeline<Ev>,
    core: Deployment,
    insts: Vec<InstRun>,
    fabric: TwinFabric,
    /// The requests in flight by id (numbered in admission order: a window of ids).
    reqs: IdMap<Req>,
    hash_block_tokens: u32,
    /// An open-loop workload, pulled one arrival at a time: memory follows the requests in
    /// flight, not the workload's size.
    open: Option<RequestStream>,
    /// The open-loop request whose arrival event is queued (its hash ids wait in the stream).
    next_arrival: Option<StreamRequest>,
    closed: Option<(u64, LengthSampler)>,
    /// A paced closed loop's issue times, and how many requests have had theirs queued.
    pace: Option<(Box<Arrivals>, u64)>,
    /// Requests admitted so far (ids are 0..admitted).
    admitted: u64,
    /// Requests the workload issues in all; `u64::MAX` until an open-loop stream ends.
    total: u64,
    /// `total` when known before the end, for progress bars.
    expected: Option<u64>,
    finished: u64,
    rejected: u64,
    lat: Latencies,
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
    rows: Vec<RequestRow>,
    spans: Vec<Span>,
    steps: Vec<StepRecord>,
    /// End of the last KV span on each timeline track (transfers overlap; tracks must not).
    kv_tracks: Vec<SimTime>,
    processed: u64,
    /// The previous step's end of the instance whose step is being applied.
    prev_end: SimTime,
}

impl<'s, 'o> Sim<'s, 'o> {
    pub(super) fn new(s: &'s Scenario, opts: RunOptions<'o>) -> Result<Self, RunError> {
        let mut built = build_instances(s)?;
        if opts.draw != 0 {
            for b in &mut built {
                b.device.redraw(opts.draw);
            }
        }
        let fabric = build_fabric(s, &built);
        let specs = built
            .iter()
            .map(|b| b.spec(opts.step_by_step, false))
            .collect();
        let core = Deployment::new(deployment_config(s), specs);
        let insts = built
            .into_iter()
            .map(|b| InstRun {
                setup: b.setup,
                name: b.name,
                role: s.instances[b.setup].plan.role,
                device: b.device,
                outcome: StepOutcome::default(),
                step_start: SimTime::ZERO,
                step_tokens: 0,
                steps: 0,
                busy_ns: 0,
                tokens: 0,
                class: [0.0; CLASS_SLOTS],
                kv_weighted: 0.0,
                kv_max: 0.0,
                step_ends: Vec::new(),
                imbalance_sum: 0.0,
            })
            .collect();
        let (open, closed, pace, total) = match s.workload.build(s.seed, &s.base_dir)? {
            WorkloadSource::Open(w) => (Some(w), None, None, u64::MAX),
            WorkloadSource::ClosedLoop {
                concurrency,
                num_requests,
                sampler,
                pace,
            } => (
                None,
                Some((concurrency.get() as u64, *sampler)),
                pace.map(|p| (p, 0)),
                num_requests.get(),
            ),
        };
        let hash_block_tokens = open
            .as_ref()
            .and_then(|w| w.hash_block_tokens())
            .unwrap_or(0);
        let expected = match &open {
            Some(w) => w.expected_len(),
            None => Some(total),
        };
        Ok(Sim {
            s,
            opts,
            tl: Timeline::default(),
            core,
            insts,
            fabric,
            reqs: IdMap::default(),
            hash_block_tokens,
            open,
            next_arrival: None,
            closed,
            pace,
            admitted: 0,
            total,
            expected,
            finished: 0,
            rejected: 0,
            lat: Latencies::default(),
            input_tokens: 0,
            output_tokens: 0,
            warmup: SimTime::ZERO + s.warmup,
            measured_finished: 0,
            good: 0,
            sent_back: 0,
            kv_transfers: 0,
            kv_bytes: 0.0,
            rows: Vec::new(),
            spans: Vec::new(),
            steps: Vec::new(),
            kv_tracks: Vec::new(),
            processed: 0,
            prev_end: SimTime::ZERO,
        })
    }

    fn push(&mut self, t: SimTime, ev: Ev) {
        self.tl.push(t, Event::Own(ev));
    }

    /// Admits request `id` into the deployment.
    fn admit(&mut self, id: ReqId, prompt: u32, output: u32, hashes: &[u64]) {
        self.admitted += 1;
        let old = self.reqs.insert(
            id,
            Req {
                arrival: self.tl.now(),
                prompt,
                output,
                ..Req::default()
            },
        );
        debug_assert!(old.is_none(), "request {id} admitted once");
        // A refusal comes back as a note.
        let _ = self.core.arrive(
            self.tl.now(),
            Arrival {
                id,
                prompt_tokens: prompt,
                max_tokens: output,
                hash_ids: hashes,
                hash_block_tokens: self.hash_block_tokens,
                token_ids: None,
                sampling: None,
            },
        );
    }

    /// Carries out the core's effects and records its notes ([`timeline::pump`]).
    fn pump(&mut self) -> Result<(), RunError> {
        timeline::pump(self)
    }

    /// Records a note; returns how many closed-loop requests left the deployment.
    fn note(&mut self, n: Note) -> u64 {
        let now = self.tl.now();
        let measured = now >= self.warmup;
        match n {
            Note::Rejected { req, .. } => {
                self.reqs.remove(req);
                self.rejected += 1;
                return 1;
            }
            Note::Started { req, .. } => {
                if let Some(r) = self.reqs.get_mut(req) {
                    if r.started.is_none() {
                        r.started = Some(now);
                        if r.arrival >= self.warmup {
                            self.lat.queue.record(now - r.arrival);
                        }
                    }
                }
            }
            Note::PrefillDone { req, inst } => {
                if let Some(r) = self.reqs.get_mut(req) {
                    r.prefill = Some(inst);
                    if r.first_token.is_none() && measured {
                        self.input_tokens += r.prompt as u64;
                    }
                }
            }
            Note::First { req, resumed, .. } => {
                let mixed = !self.core.has_prefill();
                let Some(r) = self.reqs.get_mut(req) else {
                    return 0;
                };
                if resumed {
                    // Resumed after being sent back: the wait counts as one inter-token gap.
                    if measured {
                        self.lat.itl.record(now - r.last_token);
                    }
                } else {
                    r.first_token = Some(now);
                    r.last_token = now;
                    if r.arrival >= self.warmup {
                        self.lat.ttft.record(now - r.arrival + self.s.frontend);
                    }
                    if mixed && measured {
                        // Mixed instances: the prompt is computed when the first token comes.
                        self.input_tokens += r.prompt as u64;
                    }
                }
            }
            Note::Gap {
                inst, since_step, ..
            } => {
                // Steps are counted from 1; step k ended at step_ends[k - 1].
                let since = self.insts[inst as usize].step_ends[since_step as usize - 1];
                if measured {
                    self.lat.itl.record(now - since);
                }
            }
            Note::Tokens { .. } | Note::Aborted { .. } => {}
            Note::Finished { req, inst, .. } => {
                self.finished_request(req, inst);
                return 1;
            }
            Note::Preempted { req, .. } => {
                if let Some(r) = self.reqs.get_mut(req) {
                    r.preemptions += 1;
                }
            }
            Note::SentBack { req, .. } => {
                self.sent_back += 1;
                if let Some(r) = self.reqs.get_mut(req) {
                    r.preemptions += 1;
                    r.last_token = now;
                }
            }
            Note::KvSent { req, bytes, .. } => {
                if let Some(r) = self.reqs.get_mut(req) {
                    r.xfer_start = now;
                }
                self.kv_transfers += 1;
                self.kv_bytes += bytes;
            }
            Note::KvArrived { req, .. } => {
                let Some(r) = self.reqs.get(req).copied() else {
                    return 0;
                };
                if r.arrival >= self.warmup {
                    self.lat.kv_transfer.record(now - r.xfer_start);
                }
                if self.opts.timeline {
                    self.kv_span(req, &r);
                }
            }
            Note::Step { inst, summary } => {
                if self.insts[inst as usize].role != Role::Prefill && measured {
                    self.output_tokens += summary.tokens;
                    // Requests that sampled in the previous step too: one ITL sample each.
                    self.lat
                        .itl
                        .record_n(now - self.prev_end, summary.continuing);
                }
            }
        }
        0
    }

    /// A KV transfer's timeline span, on the first track free since it started.
    fn kv_span(&mut self, req: ReqId, r: &Req) {
        let track = match self.kv_tracks.iter().position(|&end| end <= r.xfer_start) {
            Some(k) => k,
            None => {
                self.kv_tracks.push(SimTime::ZERO);
                self.kv_tracks.len() - 1
            }
        };
        self.kv_tracks[track] = self.tl.now();
        self.spans.push(Span {
            name: format!("kv req {req}"),
            lane: (self.insts.len() + track) as u32,
            lane_name: format!("kv transfers {track}"),
            start: r.xfer_start,
            dur: self.tl.now() - r.xfer_start,
            tokens: r.prompt as u64,
        });
    }

    fn on_step_done(&mut self, i: usize) {
        let now = self.tl.now();
        let inst = &mut self.insts[i];
        let dur = now - inst.step_start;
        if inst.step_start >= self.warmup {
            inst.steps += 1;
            inst.busy_ns += dur.0;
            inst.tokens += inst.step_tokens;
            inst.imbalance_sum += inst.device.step_imbalance();
            for (a, b) in inst.class.iter_mut().zip(inst.outcome.class_times.iter()) {
                *a += b;
            }
            let usage = self.core.instance(i).kv_usage();
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
        self.prev_end = inst.step_ends.last().copied().unwrap_or(SimTime::ZERO);
        inst.step_ends.push(now);
        self.core.step_done(now, i as u32, &inst.outcome);
    }

    fn finished_request(&mut self, id: ReqId, inst: u32) {
        let now = self.tl.now();
        let slo = self.s.slo;
        let Some(r) = self.reqs.remove(id) else {
            return;
        };
        self.finished += 1;
        let first = r.first_token.unwrap_or(now);
        // The front end's time is the client's, on top of the engine's (scenario docs).
        let ttft = first - r.arrival + self.s.frontend;
        let e2e = now - r.arrival + self.s.frontend;
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
                prefill_instance: r
                    .prefill
                    .map_or(String::new(), |p| self.insts[p as usize].name.clone()),
                decode_instance: self.insts[inst as usize].name.clone(),
                met_slo: met,
            });
        }
    }

    /// A slot of the closed loop is free: the next request is issued now, or, when the client
    /// paces requests and its issue time is still to come, then (slots wait in order).
    fn next_closed_loop(&mut self) {
        if let Some((times, queued)) = &mut self.pace {
            // Every request has its issue time: the rest are issued by their Paced events.
            if *queued >= self.total {
                return;
            }
            *queued += 1;
            let at = SimTime(times.next().expect("arrival times never end"));
            if at > self.tl.now() {
                self.push(at, Ev::Paced);
                return;
            }
        }
        self.issue_closed_loop();
    }

    fn issue_closed_loop(&mut self) {
        if let Some((_, sampler)) = &mut self.closed {
            let id = self.admitted;
            if id < self.total {
                let l = sampler.next_lengths();
                self.admit(id, l.input_tokens, l.output_tokens, &[]);
            }
        }
    }

    /// Admits the request whose arrival this is, then pulls the next one from the stream and
    /// queues its arrival; when the stream ends, the workload's size is known.
    fn on_arrival(&mut self, k: u64) -> Result<(), RunError> {
        let mut w = self
            .open
            .take()
            .expect("an open workload schedules arrivals");
        let req = self
            .next_arrival
            .take()
            .expect("an arrival event has its request");
        debug_assert_eq!(req.id, k, "arrivals are admitted in stream order");
        self.admit(k, req.input_tokens, req.output_tokens, w.hash_ids());
        let next = w.next_request();
        self.open = Some(w);
        self.schedule_arrival(next?);
        Ok(())
    }

    /// Queues the arrival of `next`, the stream's next request; `None` ends the workload.
    fn schedule_arrival(&mut self, next: Option<StreamRequest>) {
        let first = self.open.as_ref().map_or(0, |w| w.first_arrival_ns());
        match next {
            Some(r) => {
                self.push(
                    SimTime(r.arrival_ns.saturating_sub(first)),
                    Ev::Arrival(r.id),
                );
                self.next_arrival = Some(r);
            }
            None => self.total = self.admitted,
        }
    }

    fn on_fabric(&mut self) {
        self.core.poll_transfers(self.tl.now(), &mut self.fabric);
    }

    pub(super) fn run(mut self) -> Result<RunResult, RunError> {
        if let Some(w) = self.open.as_mut() {
            let first = w.next_request()?;
            self.schedule_arrival(first);
        } else if let Some((concurrency, _)) = &self.closed {
            for _ in 0..(*concurrency).min(self.total) {
                self.next_closed_loop();
            }
        }
        if let Some(d) = self.s.duration {
            self.push(SimTime::ZERO + d, Ev::Stop);
        }
        self.pump()?;
        // A closed loop admits its first requests before any event.
        timeline::settle(&mut self)?;
        while let Some(ev) = self.tl.pop() {
            self.processed += 1;
            match ev {
                Event::Own(Ev::Arrival(k)) => self.on_arrival(k)?,
                Event::Own(Ev::Paced) => self.issue_closed_loop(),
                Event::StepDone(i) => self.on_step_done(i as usize),
                Event::Fabric => self.on_fabric(),
                Event::Own(Ev::Stop) => break,
            }
            self.pump()?;
            timeline::settle(&mut self)?;
            if self.processed.is_multiple_of(4096) {
                if let Some(p) = self.opts.progress.as_mut() {
                    p(&Progress {
                        now: self.tl.now(),
                        finished: self.finished,
                        total: self.expected,
                    });
                }
            }
            if self.finished + self.rejected == self.total {
                break;
            }
        }
        let arrived = self.admitted;
        if self.finished + self.rejected < arrived && self.s.duration.is_none() {
            return Err(RunError::Deadlock {
                time: self.tl.now(),
                unfinished: arrived - self.finished - self.rejected,
                hint: self.core.describe(),
            });
        }
        if self.warmup > SimTime::ZERO && self.tl.now() <= self.warmup {
            return Err(RunError::NothingMeasured {
                end: self.tl.now().as_secs_f64(),
                warmup: self.warmup.as_secs_f64(),
            });
        }
        Ok(report(self.s, self.stats(arrived)))
    }

    /// What the run counted, for the report.
    fn stats(self, arrived: u64) -> RunStats {
        let instances = self
            .insts
            .iter()
            .enumerate()
            .map(|(k, i)| InstanceStats {
                name: i.name.clone(),
                role: i.role,
                dies: self.s.instances[i.setup].plan.dies,
                redundant_experts: self.s.instances[i.setup].plan.redundant_experts,
                eplb_policy: self.s.instances[i.setup].eplb_policy,
                placement_file: self.s.instances[i.setup].placement.clone(),
                steps: i.steps,
                busy_ns: i.busy_ns,
                tokens: i.tokens,
                class: i.class,
                kv_weighted: i.kv_weighted,
                kv_max: i.kv_max,
                imbalance_sum: i.imbalance_sum,
                eplb_layer_moves: i.device.eplb_moves,
                eplb_move_s: i.device.eplb_move_s,
                placed_imbalance: i.device.placed_imbalance(),
                core: self.core.instance(k).stats(),
                price_hits: i.device.pricer().hits,
                price_misses: i.device.pricer().misses,
            })
            .collect();
        RunStats {
            now: self.tl.now(),
            warmup: self.warmup,
            draw: self.opts.draw,
            arrived,
            finished: self.finished,
            rejected: self.rejected,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            measured_finished: self.measured_finished,
            good: self.good,
            sent_back: self.sent_back,
            kv_transfers: self.kv_transfers,
            kv_bytes: self.kv_bytes,
            events: self.processed,
            latency: self.lat.report(),
            instances,
            requests: self.rows,
            timeline: self.spans,
            steps: self.steps,
        }
    }
}

impl Driver<Ev> for Sim<'_, '_> {
    type Error = RunError;

    fn parts(&mut self) -> (&mut Timeline<Ev>, &mut Deployment, &mut dyn Fabric) {
        (&mut self.tl, &mut self.core, &mut self.fabric)
    }

    fn execute(&mut self, i: usize) -> Result<(), RunError> {
        let now = self.tl.now();
        let inst = &mut self.insts[i];
        let plan = self.core.plan(i);
        inst.device.starts_at(now);
        inst.device.execute(plan, &mut inst.outcome)?;
        if self.opts.record_steps {
            self.steps.push(StepRecord {
                instance: i,
                plan: plan.clone(),
                duration: inst.outcome.duration,
            });
        }
        inst.step_start = now;
        inst.step_tokens = self.core.instance(i).plan_totals().tokens;
        let end = now + inst.outcome.duration;
        self.tl.push(end, Event::StepDone(i as u32));
        Ok(())
    }

    fn transfer_failed(&mut self, _req: ReqId, e: DeviceError) -> Result<(), RunError> {
        Err(e.into())
    }

    /// Records the notes; a closed loop then refills what left.
    fn notes(&mut self, notes: &mut Vec<Note>) -> Result<bool, RunError> {
        // The requests the notes are about, loaded together before they are handled.
        for id in notes.iter().filter_map(Note::req) {
            self.reqs.prefetch(id);
        }
        let mut refill = 0;
        for n in notes.drain(..) {
            refill += self.note(n);
        }
        for _ in 0..refill {
            self.next_closed_loop();
        }
        Ok(refill > 0)
    }
}
