//! The wall-clock driver: a control task that loops around the deployment core, and a thread
//! per instance device. It owns what is the runtime's alone — the clock, client streams,
//! metrics, the devices' threads — and no PD logic.
//!
//! Device time: `now` given to the core is elapsed wall time divided by the time scale. Step
//! ends and fabric deliveries wait on the simulator's timeline ([`dstwin_core::timeline`]: the
//! same event order, effect pump and same-instant rule); the control task applies an instant's
//! events when the wall clock reaches it (at once with scale 0), and only once every step handed
//! to a predicting device has come back, so completions are applied in device-time order.
//! Where the wall clock has run ahead, every event already past is applied before the one
//! planning (they all happened by now).
//! Client inputs (submissions, aborts) are applied as they come, all that are waiting before
//! the next planning.

use crate::metrics::{FinishReason as Ended, RequestTimes};
use crate::{Cmd, Out, Shared};
use dstwin_core::deploy::{Arrival, Deployment, Note, StepRecord};
use dstwin_core::device::{DeviceError, Fabric, FinishReason, ReqId, StepOutcome, StepPlan};
use dstwin_core::time::SimTime;
use dstwin_core::timeline::{self, Driver, Event, Timeline};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// A step a device finished (or failed).
struct Done {
    inst: usize,
    result: Result<StepOutcome, DeviceError>,
}

/// A client's request in flight.
struct ReqStream {
    tx: mpsc::UnboundedSender<Out>,
    prompt: u32,
    arrival: Instant,
    /// First scheduled (its queueing ends).
    scheduled: Option<Instant>,
    first: Option<Instant>,
    last: Instant,
    emitted: u32,
    /// The instance it decodes on (the metrics' engine).
    engine: usize,
    /// Its prompt is prefilled: from here on it belongs to the decode engine (pulling the KV,
    /// then decoding), though PD prefill emits no token.
    prefilled: bool,
    /// Prompt tokens its first admission found in the prefix cache.
    cached: u32,
    max_tokens: u32,
    /// The parent request's key and `n`, for a choice of a request with `n` above 1.
    parent: Option<(u64, u32)>,
}

/// The choices of one request with `n` above 1 still to end, and the most tokens one that
/// finished generated.
struct Parent {
    left: u32,
    max_generated: Option<u32>,
}

impl ReqStream {
    fn times(&self, end: Instant) -> RequestTimes {
        RequestTimes {
            arrival: self.arrival,
            scheduled: self.scheduled,
            first_token: self.first,
            last_token: self.first.map(|_| self.last),
            end,
            prompt_tokens: self.prompt,
            cached_tokens: self.cached,
            max_tokens: self.max_tokens,
            generated: self.emitted,
        }
    }
}

struct Control {
    shared: Weak<Shared>,
    core: Deployment,
    fabric: Box<dyn Fabric + Send>,
    /// Per instance, its device thread: each plan with the device time its step starts at.
    workers: Vec<std::sync::mpsc::Sender<(StepPlan, SimTime)>>,
    predicts: Vec<bool>,
    done_rx: mpsc::UnboundedReceiver<Done>,
    cmd_rx: mpsc::UnboundedReceiver<Cmd>,
    streams: HashMap<ReqId, ReqStream>,
    /// Requests that recently finished by length, with their engine: a stop string the client
    /// found after the engine had already finished the request still counts as `stop`.
    recent_length: std::collections::VecDeque<(ReqId, usize)>,
    /// Requests with `n` above 1 whose choices have not all ended, by key.
    parents: HashMap<u64, Parent>,
    /// Step ends and fabric deliveries in device time; no events of its own.
    tl: Timeline<Infallible>,
    outcomes: Vec<Option<StepOutcome>>,
    step_start: Vec<SimTime>,
    /// The place each running step took on the timeline when it was dispatched, so that steps
    /// ending at the same instant complete in dispatch order, as in the simulator.
    step_seq: Vec<u64>,
    /// The step log index of each instance's running step (when recording).
    step_log: Vec<usize>,
    /// Steps handed to predicting devices and not back yet.
    outstanding: usize,
    t0: Instant,
    scale: f64,
    failed: bool,
}

/// Starts the device threads and the control task.
/// How long a device thread waits for the next step before it counts as idle
/// ([`dstwin_core::device::Device::idle`]).
const IDLE_AFTER: std::time::Duration = std::time::Duration::from_millis(1);

pub(crate) fn spawn(
    shared: Weak<Shared>,
    instances: Vec<crate::ServeInstance>,
    fabric: Box<dyn Fabric + Send>,
    cmd_rx: mpsc::UnboundedReceiver<Cmd>,
) {
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let mut workers = Vec::new();
    let mut predicts = Vec::new();
    let mut specs = Vec::new();
    for (i, mut si) in instances.into_iter().enumerate() {
        predicts.push(si.device.predicts_time());
        // The device is the authority on its KV: the schedulers plan against what it reports.
        let cap = si.device.capacity();
        assert_eq!(
            (cap.dp_ranks, cap.block_size),
            (si.spec.config.dp_ranks, si.spec.config.block_size),
            "instance {}: the device's DP ranks and block size must be the scheduler's",
            si.spec.name
        );
        si.spec.config.num_kv_blocks = cap.kv_blocks_per_rank;
        // Each plan with the device time its step starts at.
        let (tx, rx) = std::sync::mpsc::channel::<(StepPlan, SimTime)>();
        let done = done_tx.clone();
        let mut device = si.device;
        std::thread::Builder::new()
            .name(format!("device-{}", si.spec.name))
            .spawn(move || {
                use std::sync::mpsc::{RecvTimeoutError, TryRecvError};
                // Whether no plan came for IDLE_AFTER since the last step: the device is idle
                // (a busy engine's next plan follows its last step within microseconds).
                let mut quiet = false;
                loop {
                    // A step waiting runs first; with none, the device may use the moment, in
                    // slices, looking for a step between them.
                    let next = match rx.try_recv() {
                        Ok(plan) => Some(plan),
                        Err(TryRecvError::Disconnected) => None,
                        Err(TryRecvError::Empty) if !quiet => match rx.recv_timeout(IDLE_AFTER) {
                            Ok(plan) => Some(plan),
                            Err(RecvTimeoutError::Disconnected) => None,
                            Err(RecvTimeoutError::Timeout) => {
                                quiet = true;
                                continue;
                            }
                        },
                        Err(TryRecvError::Empty) => {
                            if device.idle() {
                                continue;
                            }
                            rx.recv().ok()
                        }
                    };
                    let Some((plan, at)) = next else {
                        // The runtime is gone: what the device keeps for idle moments is done now.
                        while device.idle() {}
                        return;
                    };
                    quiet = false;
                    device.starts_at(at);
                    let mut out = StepOutcome::default();
                    // A device that panics fails the step: the control task reports it and
                    // ends instead of waiting for a step that never comes.
                    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        device.execute(&plan, &mut out)
                    }));
                    let result = match run {
                        Ok(r) => r.map(|_| out),
                        Err(p) => Err(DeviceError::Failed(format!(
                            "the device thread panicked: {}",
                            p.downcast_ref::<String>()
                                .map(String::as_str)
                                .or_else(|| p.downcast_ref::<&str>().copied())
                                .unwrap_or("(no message)")
                        ))),
                    };
                    let failed = result.is_err();
                    if done.send(Done { inst: i, result }).is_err() || failed {
                        return;
                    }
                }
            })
            .expect("spawning a device thread");
        workers.push(tx);
        specs.push(si.spec);
    }
    let (deployment, scale) = {
        let s = shared.upgrade().expect("the runtime is being started");
        (s.cfg.deployment, s.cfg.time_scale)
    };
    let n = specs.len();
    let control = Control {
        shared,
        core: Deployment::new(deployment, specs),
        fabric,
        workers,
        predicts,
        done_rx,
        cmd_rx,
        streams: HashMap::new(),
        recent_length: std::collections::VecDeque::new(),
        parents: HashMap::new(),
        tl: Timeline::default(),
        outcomes: vec![None; n],
        step_start: vec![SimTime::ZERO; n],
        step_seq: vec![0; n],
        step_log: vec![0; n],
        outstanding: 0,
        t0: Instant::now(),
        scale,
        failed: false,
    };
    tokio::spawn(control.run());
}

impl Control {
    /// Device time now, by the wall clock (never behind the last event applied).
    fn wall_now(&self) -> SimTime {
        if self.scale > 0.0 {
            let t = SimTime((self.t0.elapsed().as_nanos() as f64 / self.scale) as u64);
            t.max(self.tl.now())
        } else {
            self.tl.now()
        }
    }

    /// Moves the timeline's instant to the wall clock's.
    fn catch_up(&mut self) {
        let t = self.wall_now();
        self.tl.advance_to(t);
    }

    fn wall_at(&self, t: SimTime) -> Instant {
        self.t0 + Duration::from_nanos((t.0 as f64 * self.scale) as u64)
    }

    async fn run(mut self) {
        loop {
            // A failure stops everything, whichever branch below met it.
            if self.failed {
                return;
            }
            // Inputs that are already here, all applied before planning.
            let mut inputs = false;
            while let Ok(cmd) = self.cmd_rx.try_recv() {
                if !inputs {
                    self.catch_up();
                    inputs = true;
                }
                self.apply_cmd(cmd);
            }
            if inputs {
                self.plan();
            }
            while let Ok(d) = self.done_rx.try_recv() {
                self.apply_done(d);
            }
            if self.failed {
                return;
            }
            if self.outstanding > 0 {
                // A predicting device answers in microseconds: wait for it so that completions
                // are applied in device-time order.
                match self.done_rx.recv().await {
                    Some(d) => self.apply_done(d),
                    None => return,
                }
                continue;
            }
            match self.tl.next_time() {
                Some(t) if self.scale <= 0.0 || self.wall_now() >= t => self.fire(),
                Some(t) => {
                    let at = tokio::time::Instant::from_std(self.wall_at(t));
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        cmd = self.cmd_rx.recv() => match cmd {
                            Some(cmd) => {
                                self.catch_up();
                                self.apply_cmd(cmd);
                                self.plan();
                            }
                            None => {
                                if self.streams.is_empty() {
                                    return;
                                }
                            }
                        },
                        d = self.done_rx.recv() => match d {
                            Some(d) => self.apply_done(d),
                            None => return,
                        },
                    }
                }
                None => {
                    tokio::select! {
                        cmd = self.cmd_rx.recv() => match cmd {
                            Some(cmd) => {
                                self.catch_up();
                                self.apply_cmd(cmd);
                                self.plan();
                            }
                            // Every handle is gone and nothing is left to do.
                            None => return,
                        },
                        d = self.done_rx.recv() => match d {
                            Some(d) => self.apply_done(d),
                            None => return,
                        },
                    }
                }
            }
        }
    }

    /// Applies the next event and every other of its instant (or already past), each followed
    /// by the pump; then plans the instant ([`timeline::settle`]).
    fn fire(&mut self) {
        while let Some(ev) = self.tl.pop() {
            match ev {
                Event::StepDone(i) => {
                    let i = i as usize;
                    let outcome = self.outcomes[i].take().expect("a finished step's outcome");
                    if let Some(s) = self.shared.upgrade() {
                        s.metrics.step(i, self.core.plan(i), &outcome);
                    }
                    self.core.step_done(self.tl.now(), i as u32, &outcome);
                    self.publish(i);
                }
                Event::Fabric => {
                    self.core
                        .poll_transfers(self.tl.now(), self.fabric.as_mut());
                    // A delivered transfer frees the prefill side's KV and lets decode run.
                    for i in 0..self.core.num_instances() {
                        self.publish(i);
                    }
                }
                Event::Own(never) => match never {},
            }
            self.pump();
            let Ok(planned) = timeline::settle(self);
            if planned {
                break;
            }
        }
    }

    fn plan(&mut self) {
        let Ok(()) = timeline::plan(self);
    }

    fn apply_cmd(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Submit { id, req, tx } => {
                let now = Instant::now();
                if let Some((key, n)) = req.parent {
                    self.parents.entry(key).or_insert(Parent {
                        left: n,
                        max_generated: None,
                    });
                }
                let res = self.core.arrive(
                    self.tl.now(),
                    Arrival {
                        id,
                        prompt_tokens: req.prompt_tokens,
                        max_tokens: req.max_tokens,
                        hash_ids: &[],
                        hash_block_tokens: 0,
                        token_ids: req.token_ids.as_deref(),
                        sampling: req.sampling.as_ref(),
                    },
                );
                match res {
                    Ok(()) => {
                        let engine = self.core.route_of(id).map_or(0, |(_, d)| d as usize);
                        self.streams.insert(
                            id,
                            ReqStream {
                                tx,
                                prompt: req.prompt_tokens,
                                arrival: now,
                                scheduled: None,
                                first: None,
                                last: now,
                                emitted: 0,
                                engine,
                                prefilled: false,
                                cached: 0,
                                max_tokens: req.max_tokens,
                                parent: req.parent,
                            },
                        );
                    }
                    Err(e) => {
                        // The runtime checked the length before admitting; a refusal here ends
                        // the stream without output.
                        tracing::warn!("request {id} refused: {e}");
                        if let Some(s) = self.shared.upgrade() {
                            s.pending.fetch_sub(1, Ordering::Relaxed);
                            self.choice_ended(&s, 0, req.parent, None);
                        }
                    }
                }
                // A refusal is a note too; nothing else to do with it.
                self.pump();
            }
            Cmd::End(id, reason) => {
                if reason == Ended::Stop {
                    if let Some(k) = self.recent_length.iter().position(|&(x, _)| x == id) {
                        let (_, engine) = self.recent_length.remove(k).expect("found");
                        if let Some(s) = self.shared.upgrade() {
                            s.metrics.length_was_stop(engine);
                        }
                        return;
                    }
                }
                if let Some(r) = self.streams.remove(&id) {
                    let route = self.core.route_of(id);
                    self.core.abort(self.tl.now(), id);
                    // Its KV is free now: the gauges say so without waiting for a step.
                    if let Some((p, d)) = route {
                        for i in p.into_iter().chain([d]) {
                            self.publish(i as usize);
                        }
                    }
                    if let Some(s) = self.shared.upgrade() {
                        s.pending.fetch_sub(1, Ordering::Relaxed);
                        let engine = abort_engine(route, r.prefilled, r.engine);
                        let times = r.times(Instant::now());
                        s.metrics.request_finished(engine, &times, reason);
                        let generated = (reason == Ended::Stop).then_some(r.emitted);
                        self.choice_ended(&s, engine, r.parent, generated);
                    }
                    self.pump();
                }
            }
            Cmd::ForgetParent(key) => {
                self.parents.remove(&key);
            }
        }
    }

    /// A request (or one choice of a request with `n` above 1) ended on `engine`, having
    /// generated `generated` tokens if it finished (None: aborted, failed): once every choice has
    /// ended, the request's `n` and the most tokens a choice generated, as vLLM records them.
    fn choice_ended(
        &mut self,
        s: &Shared,
        engine: usize,
        parent: Option<(u64, u32)>,
        generated: Option<u32>,
    ) {
        let (n, max) = match parent {
            None => (1, generated),
            Some((key, n)) => {
                let Some(p) = self.parents.get_mut(&key) else {
                    return;
                };
                p.left -= 1;
                p.max_generated = p.max_generated.max(generated);
                if p.left > 0 {
                    return;
                }
                let max = p.max_generated;
                self.parents.remove(&key);
                (n, max)
            }
        };
        if let Some(max) = max {
            s.metrics.request_choices_finished(engine, n, max);
        }
    }

    /// Stops serving: logs and records why (new requests are refused with it, requests in
    /// flight end with it, `/health` reports it) and ends the control task.
    fn fail(&mut self, why: String) {
        tracing::error!("{why}");
        if let Some(s) = self.shared.upgrade() {
            s.failure.lock().expect("failure").get_or_insert(why);
            s.metrics.clear_gauges();
            // Every request in flight ends with it (vLLM's `error`); its client, finding its
            // stream closed, reads why from the failure and the gauges set above.
            let now = Instant::now();
            for (id, r) in self.streams.drain() {
                let engine = abort_engine(self.core.route_of(id), r.prefilled, r.engine);
                s.metrics
                    .request_finished(engine, &r.times(now), Ended::Error);
                s.pending.fetch_sub(1, Ordering::Relaxed);
            }
            self.parents.clear();
            s.failed.notify_waiters();
        }
        self.failed = true;
    }

    fn apply_done(&mut self, d: Done) {
        let i = d.inst;
        let outcome = match d.result {
            Ok(o) => o,
            Err(e) => {
                let name = self.core.name(i).to_string();
                self.fail(format!("instance {name}: {e}"));
                return;
            }
        };
        let end = if self.predicts[i] {
            self.outstanding -= 1;
            self.step_start[i] + outcome.duration
        } else {
            // A measured step is over when the device returns.
            (self.step_start[i] + outcome.duration).max(self.wall_now())
        };
        if let Some(s) = self.shared.upgrade() {
            if s.cfg.record_steps {
                s.steps.lock().expect("step log")[self.step_log[i]].duration = outcome.duration;
            }
        }
        self.outcomes[i] = Some(outcome);
        self.tl
            .push_reserved(end, self.step_seq[i], Event::StepDone(i as u32));
    }

    /// Carries out the core's effects and turns its notes into client output and metrics
    /// ([`timeline::pump`]).
    fn pump(&mut self) {
        let Ok(()) = timeline::pump(self);
    }

    fn note(&mut self, s: &Arc<Shared>, n: Note) {
        let now = Instant::now();
        match n {
            Note::Started { req, inst, cached } => {
                if let Some(r) = self.streams.get_mut(&req) {
                    // Its prompt counts once, where it is first admitted (a prompt sent back
                    // to prefill again is not counted twice).
                    if r.scheduled.is_none() {
                        r.cached = cached;
                        s.metrics.prompt_started(inst as usize, r.prompt, cached);
                    }
                    r.scheduled.get_or_insert(now);
                }
            }
            Note::Tokens { req, inst, n, ids } => {
                let Some(r) = self.streams.get_mut(&req) else {
                    return;
                };
                let m = s.metrics.engine(inst as usize);
                r.engine = inst as usize;
                r.emitted += n;
                if r.first.is_none() {
                    r.first = Some(now);
                    m.ttft.observe((now - r.arrival).as_secs_f64());
                } else {
                    m.itl.observe((now - r.last).as_secs_f64());
                }
                r.last = now;
                m.generation_tokens.fetch_add(n as u64, Ordering::Relaxed);
                let _ = r.tx.send(Out::Tokens { n, ids });
            }
            Note::Finished { req, inst, reason } => {
                let Some(r) = self.streams.remove(&req) else {
                    return;
                };
                s.pending.fetch_sub(1, Ordering::Relaxed);
                let ended = match reason {
                    FinishReason::Length => Ended::Length,
                    FinishReason::Stop => Ended::Stop,
                };
                if ended == Ended::Length {
                    const RECENT: usize = 4096;
                    if self.recent_length.len() == RECENT {
                        self.recent_length.pop_front();
                    }
                    self.recent_length.push_back((req, inst as usize));
                }
                s.metrics
                    .request_finished(inst as usize, &r.times(now), ended);
                self.choice_ended(s, inst as usize, r.parent, Some(r.emitted));
                let _ = r.tx.send(Out::Finished(reason));
            }
            Note::Rejected { req, .. } => {
                // Dropping the sender ends the stream.
                if let Some(r) = self.streams.remove(&req) {
                    s.pending.fetch_sub(1, Ordering::Relaxed);
                    self.choice_ended(s, r.engine, r.parent, None);
                }
            }
            Note::Preempted { req, inst } | Note::SentBack { req, inst, .. } => {
                // A request sent back goes to a prefill engine again: an abort counts there.
                if matches!(n, Note::SentBack { .. }) {
                    if let Some(r) = self.streams.get_mut(&req) {
                        r.prefilled = false;
                    }
                }
                s.metrics
                    .engine(inst as usize)
                    .preemptions
                    .fetch_add(1, Ordering::Relaxed);
            }
            Note::PrefillDone { req, .. } => {
                if let Some(r) = self.streams.get_mut(&req) {
                    r.prefilled = true;
                }
            }
            Note::First { .. }
            | Note::Gap { .. }
            | Note::KvSent { .. }
            | Note::KvArrived { .. }
            | Note::Step { .. }
            | Note::Aborted { .. } => {}
        }
    }

    /// Publishes an instance's gauges to `/metrics`.
    fn publish(&self, i: usize) {
        // A failed deployment's gauges stay at 0 ([`Control::fail`]).
        let Some(s) = self.shared.upgrade().filter(|_| !self.failed) else {
            return;
        };
        let inst = self.core.instance(i);
        s.metrics.set_instance(i, &inst.stats(), inst.kv_usage());
    }
}

/// The engine a client's abort counts on: where the request was when it went. Under PD that is
/// the prefill engine until its prompt is prefilled and the decode engine after (pulling the
/// KV included, since the decode engine holds its blocks by then); a request the core no
/// longer routes counts where it last emitted.
fn abort_engine(route: Option<(Option<u32>, u32)>, prefilled: bool, last: usize) -> usize {
    match route {
        Some((Some(p), _)) if !prefilled => p as usize,
        Some((_, d)) => d as usize,
        None => last,
    }
}

impl Driver<Infallible> for Control {
    /// A failure stops the control task ([`Control::fail`]) instead of ending the pump.
    type Error = Infallible;

    fn parts(&mut self) -> (&mut Timeline<Infallible>, &mut Deployment, &mut dyn Fabric) {
        (&mut self.tl, &mut self.core, self.fabric.as_mut())
    }

    fn execute(&mut self, i: usize) -> Result<(), Infallible> {
        let plan = self.core.plan(i).clone();
        if let Some(s) = self.shared.upgrade() {
            if s.cfg.record_steps {
                let mut log = s.steps.lock().expect("step log");
                self.step_log[i] = log.len();
                log.push(StepRecord {
                    instance: i,
                    plan: plan.clone(),
                    duration: Default::default(),
                });
            }
        }
        self.step_start[i] = self.tl.now();
        self.step_seq[i] = self.tl.reserve();
        if self.predicts[i] {
            self.outstanding += 1;
        }
        // What the step runs shows while it runs (a prefill instance's prompts too).
        self.publish(i);
        if self.workers[i].send((plan, self.tl.now())).is_err() {
            let name = self.core.name(i).to_string();
            self.fail(format!("instance {name}: its device thread is gone"));
        }
        Ok(())
    }

    fn transfer_failed(&mut self, req: ReqId, e: DeviceError) -> Result<(), Infallible> {
        self.fail(format!("KV transfer of request {req} failed: {e}"));
        Ok(())
    }

    fn notes(&mut self, notes: &mut Vec<Note>) -> Result<bool, Infallible> {
        if let Some(s) = self.shared.upgrade() {
            for n in notes.drain(..) {
                self.note(&s, n);
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::abort_engine;

    #[test]
    fn an_abort_counts_where_the_request_was() {
        // PD: prefill engine 0, decode engine 2.
        assert_eq!(abort_engine(Some((Some(0), 2)), false, 9), 0);
        // Prefilled, the KV still on its way: the decode engine, with no token emitted yet.
        assert_eq!(abort_engine(Some((Some(0), 2)), true, 9), 2);
        // Mixed: the one engine, prefilled or not.
        assert_eq!(abort_engine(Some((None, 1)), false, 9), 1);
        assert_eq!(abort_engine(Some((None, 1)), true, 9), 1);
        // No longer routed: where it last emitted.
        assert_eq!(abort_engine(None, true, 3), 3);
    }
}
