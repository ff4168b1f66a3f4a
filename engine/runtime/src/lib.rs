//! dstwin-runtime, the wall-clock runtime: the same instances, schedulers and PD proxy as
//! the simulator, driven by tokio tasks in real time behind an OpenAI-compatible HTTP API.
//!
//! - [`Runtime`]: one task per instance looping schedule -> `Device::execute` -> wait for the
//!   step -> apply; the PD proxy in front; KV hand-offs from prefill to decode instances.
//! - [`api`]: the axum router (`/v1/completions`, `/v1/chat/completions`, `/v1/models`,
//!   `/health`, `/metrics`).
//! - [`request`]: request bodies parsed and validated once (what is honoured, what refused).
//! - [`prompt`]: prompt token counts (HF tokenizer or estimate) and the DeepSeek chat template.
//! - [`parsers`]: DeepSeek reasoning and tool-call parsers (vLLM's names), streaming and whole.
//! - `output`: one choice's output: stop strings and the parsers.
//! - [`metrics`]: vLLM-named Prometheus metrics.
//! - [`text`]: deterministic placeholder text for emulated devices.
//!
//! Time: a step takes what the device says it took, multiplied by the time scale (1 = real
//! time; 0 = as fast as the host runs). A device that really runs (an NPU) returns after the step
//! has run; scale 1 then adds nothing. KV transfers take the device's latency plus bytes over
//! bandwidth, each with its own link (the simulator also shares a link between concurrent
//! transfers; the runtime does not).

pub mod api;
pub mod metrics;
mod output;
pub mod parsers;
pub mod prompt;
pub mod request;
pub mod text;

use dstwin_core::device::{Device, KvTransfer, ReqId, StepOutcome};
use dstwin_core::instance::{InstEvent, Instance, InstanceConfig, NewRequest};
use dstwin_core::layout::Role;
use dstwin_core::pd::{Policy, Proxy};
use dstwin_core::time::{SimDuration, SimTime};
use metrics::{FinishReason, Metrics, RequestTimes};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// One instance to serve: its scheduler configuration and the device it runs on.
pub struct ServeInstance {
    pub name: String,
    pub config: InstanceConfig,
    pub device: Box<dyn Device + Send>,
}

/// Deployment-wide settings.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// The model name clients must ask for.
    pub model: String,
    /// Wall seconds per device second (0: no waiting).
    pub time_scale: f64,
    /// Requests admitted but not finished before new ones get 429.
    pub max_pending: usize,
    pub prefill_policy: Policy,
    pub decode_policy: Policy,
    /// KV bytes per token moved from a prefill to a decode instance.
    pub kv_bytes_per_token: f64,
    /// Dies spanned by the deployment (the fabric level KV transfers cross).
    pub span_dies: u32,
    /// Keep a log of every step (for conformance checks); off in production.
    pub record_steps: bool,
}

/// What a client's stream receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Out {
    /// `n` more tokens were sampled.
    Tokens(u32),
    /// All requested tokens were produced.
    Finished,
}

/// One step of one instance, for conformance checks.
#[derive(Clone, Debug, PartialEq)]
pub struct StepRecord {
    pub instance: usize,
    /// Tokens computed per DP rank.
    pub rank_tokens: Vec<u64>,
    pub duration: SimDuration,
}

/// A request as clients submit it.
#[derive(Clone, Debug)]
pub struct Submit {
    pub prompt_tokens: u32,
    pub max_tokens: u32,
}

/// Why a request was not admitted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    #[error("this request has {tokens} tokens (prompt + max_tokens) but the model's maximum context length is {max}")]
    TooLong { tokens: u64, max: u64 },
    #[error("the server has {pending} requests in flight (limit {limit}); retry later")]
    Busy { pending: usize, limit: usize },
    #[error("the server is shutting down")]
    ShuttingDown,
}

enum Cmd {
    Add { id: ReqId, remote_kv: bool },
    KvArrived(ReqId),
    Release(ReqId),
    Abort(ReqId),
}

struct ReqState {
    prompt: u32,
    max_tokens: u32,
    /// Tokens streamed so far (a sent-back request resumes after them).
    emitted: u32,
    tx: mpsc::UnboundedSender<Out>,
    prefill: Option<usize>,
    serve: Option<usize>,
    arrival: Instant,
    /// First scheduled (queue time ends).
    scheduled: Option<Instant>,
    first: Option<Instant>,
    last: Instant,
}

impl ReqState {
    fn times(&self, end: Instant) -> RequestTimes {
        RequestTimes {
            arrival: self.arrival,
            scheduled: self.scheduled,
            first_token: self.first,
            last_token: self.first.map(|_| self.last),
            end,
            prompt_tokens: self.prompt,
            generated: self.emitted,
        }
    }
}

struct InstHandle {
    name: String,
    role: Role,
    max_model_len: u64,
    tx: mpsc::UnboundedSender<Cmd>,
}

struct Shared {
    cfg: RuntimeConfig,
    proxy: Mutex<Proxy>,
    insts: Vec<InstHandle>,
    prefill_ids: Vec<usize>,
    serve_ids: Vec<usize>,
    reqs: Mutex<HashMap<ReqId, ReqState>>,
    next_id: AtomicU64,
    pending: AtomicUsize,
    closing: AtomicBool,
    metrics: Metrics,
    steps: Mutex<Vec<StepRecord>>,
}

/// A running deployment. Cheap to clone; the instance tasks stop when every clone is dropped
/// and their work is done.
#[derive(Clone)]
pub struct Runtime {
    shared: Arc<Shared>,
}

/// A submitted request: its token stream. Dropping it before the stream ends aborts the request
/// and frees its KV (a client that went away).
pub struct Stream {
    pub id: ReqId,
    rx: mpsc::UnboundedReceiver<Out>,
    runtime: Runtime,
    done: bool,
}

impl Stream {
    /// The next output, or `None` when the request is over.
    pub async fn next(&mut self) -> Option<Out> {
        if self.done {
            return None;
        }
        let o = self.rx.recv().await;
        if matches!(o, Some(Out::Finished) | None) {
            self.done = true;
        }
        o
    }

    /// The next output if one is ready now.
    pub fn try_next(&mut self) -> Option<Out> {
        if self.done {
            return None;
        }
        let o = self.rx.try_recv().ok();
        if o == Some(Out::Finished) {
            self.done = true;
        }
        o
    }

    /// Stops the request now (a stop string was produced): frees its KV, no more output.
    pub fn cancel(&mut self) {
        if !self.done {
            self.done = true;
            self.runtime.abort(self.id);
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.cancel();
    }
}

impl Runtime {
    /// Starts one task per instance on the current tokio runtime.
    pub fn start(cfg: RuntimeConfig, instances: Vec<ServeInstance>) -> Runtime {
        assert!(!instances.is_empty(), "a deployment needs an instance");
        let mut handles = Vec::new();
        let mut receivers = Vec::new();
        for si in &instances {
            let (tx, rx) = mpsc::unbounded_channel();
            handles.push(InstHandle {
                name: si.name.clone(),
                role: si.config.role,
                max_model_len: si.config.max_model_len,
                tx,
            });
            receivers.push(rx);
        }
        let prefill_ids: Vec<usize> = (0..handles.len())
            .filter(|&i| handles[i].role == Role::Prefill)
            .collect();
        let serve_ids: Vec<usize> = (0..handles.len())
            .filter(|&i| handles[i].role != Role::Prefill)
            .collect();
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
        let shared = Arc::new(Shared {
            metrics: Metrics::new(&cfg.model, handles.len()),
            cfg,
            proxy: Mutex::new(proxy),
            insts: handles,
            prefill_ids,
            serve_ids,
            reqs: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
            steps: Mutex::new(Vec::new()),
        });
        for ((i, si), rx) in instances.into_iter().enumerate().zip(receivers) {
            let mut inst = Instance::new(si.config);
            inst.set_report_emissions(true);
            let task = InstanceTask {
                shared: Arc::downgrade(&shared),
                index: i,
                inst,
                device: si.device,
                rx,
                start: Instant::now(),
            };
            tokio::spawn(task.run());
        }
        Runtime { shared }
    }

    pub fn model(&self) -> &str {
        &self.shared.cfg.model
    }

    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// The longest prompt + output any serving instance accepts.
    pub fn max_model_len(&self) -> u64 {
        let s = &self.shared;
        s.prefill_ids
            .iter()
            .chain(&s.serve_ids)
            .map(|&i| s.insts[i].max_model_len)
            .min()
            .unwrap_or(0)
    }

    /// Requests admitted and not finished.
    pub fn pending(&self) -> usize {
        self.shared.pending.load(Ordering::Relaxed)
    }

    /// Refuses new requests from now on (graceful shutdown: in-flight ones finish).
    pub fn close(&self) {
        self.shared.closing.store(true, Ordering::Relaxed);
    }

    /// The step log (empty unless `record_steps`).
    pub fn steps(&self) -> Vec<StepRecord> {
        self.shared.steps.lock().expect("step log").clone()
    }

    /// Admits a request and returns its token stream.
    pub fn submit(&self, r: Submit) -> Result<Stream, AdmitError> {
        let s = &self.shared;
        if s.closing.load(Ordering::Relaxed) {
            return Err(AdmitError::ShuttingDown);
        }
        let tokens = r.prompt_tokens as u64 + r.max_tokens as u64;
        let max = self.max_model_len();
        if tokens > max {
            return Err(AdmitError::TooLong { tokens, max });
        }
        let pending = s.pending.fetch_add(1, Ordering::Relaxed);
        if pending >= s.cfg.max_pending {
            s.pending.fetch_sub(1, Ordering::Relaxed);
            return Err(AdmitError::Busy {
                pending,
                limit: s.cfg.max_pending,
            });
        }
        let id = s.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        let now = Instant::now();
        s.reqs.lock().expect("requests").insert(
            id,
            ReqState {
                prompt: r.prompt_tokens,
                max_tokens: r.max_tokens,
                emitted: 0,
                tx,
                prefill: None,
                serve: None,
                arrival: now,
                scheduled: None,
                first: None,
                last: now,
            },
        );
        if s.prefill_ids.is_empty() {
            let k = s
                .proxy
                .lock()
                .expect("proxy")
                .route_decode(r.prompt_tokens as u64);
            self.send_to(s.serve_ids[k], id, false);
        } else {
            self.route_prefill(id);
        }
        Ok(Stream {
            id,
            rx,
            runtime: self.clone(),
            done: false,
        })
    }

    fn route_prefill(&self, id: ReqId) {
        let s = &self.shared;
        let prompt = match s.reqs.lock().expect("requests").get(&id) {
            Some(r) => r.prompt + r.emitted,
            None => return,
        };
        let k = s
            .proxy
            .lock()
            .expect("proxy")
            .route_prefill(prompt as u64, &[]);
        self.send_to(s.prefill_ids[k], id, false);
    }

    fn send_to(&self, i: usize, id: ReqId, remote_kv: bool) {
        let s = &self.shared;
        if let Some(r) = s.reqs.lock().expect("requests").get_mut(&id) {
            if r.prefill.is_none() && r.serve.is_none() {
                // Its prompt counts once, on the first instance it reaches.
                s.metrics
                    .engine(i)
                    .prompt_tokens
                    .fetch_add(r.prompt as u64, Ordering::Relaxed);
            }
            if s.insts[i].role == Role::Prefill {
                r.prefill = Some(i);
            } else {
                r.serve = Some(i);
            }
        }
        // A closed channel means the runtime is going away; the request's stream ends then.
        let _ = s.insts[i].tx.send(Cmd::Add { id, remote_kv });
    }

    /// Ends a request because a stop string appeared in its text: frees its KV like an abort,
    /// but counts as `finished_reason="stop"` with its timings.
    pub fn stop(&self, id: ReqId) {
        self.end(id, FinishReason::Stop);
    }

    /// Drops a request wherever it is and frees its KV.
    fn abort(&self, id: ReqId) {
        self.end(id, FinishReason::Abort);
    }

    fn end(&self, id: ReqId, reason: FinishReason) {
        let s = &self.shared;
        let Some(r) = s.reqs.lock().expect("requests").remove(&id) else {
            return;
        };
        s.pending.fetch_sub(1, Ordering::Relaxed);
        let engine = r.serve.or(r.prefill).unwrap_or(0);
        s.metrics
            .request_finished(engine, &r.times(Instant::now()), reason);
        for i in [r.prefill, r.serve].into_iter().flatten() {
            let _ = s.insts[i].tx.send(Cmd::Abort(id));
        }
    }

    /// The instances' names, in index order (the `engine` label of `/metrics`).
    pub fn instance_names(&self) -> Vec<String> {
        self.shared.insts.iter().map(|h| h.name.clone()).collect()
    }
}

/// One instance's loop.
struct InstanceTask {
    shared: std::sync::Weak<Shared>,
    index: usize,
    inst: Instance,
    device: Box<dyn Device + Send>,
    rx: mpsc::UnboundedReceiver<Cmd>,
    start: Instant,
}

impl InstanceTask {
    fn now(&self) -> SimTime {
        SimTime(self.start.elapsed().as_nanos() as u64)
    }

    fn apply_cmd(&mut self, shared: &Shared, cmd: Cmd) {
        let now = self.now();
        match cmd {
            Cmd::Add { id, remote_kv } => {
                let reqs = shared.reqs.lock().expect("requests");
                let Some(r) = reqs.get(&id) else {
                    // Aborted before it got here.
                    return;
                };
                let role = self.inst.config().role;
                let req = NewRequest {
                    id,
                    prompt_tokens: r.prompt + r.emitted,
                    max_output_tokens: if role == Role::Prefill {
                        1
                    } else {
                        r.max_tokens - r.emitted
                    },
                    hash_ids: &[],
                    hash_block_tokens: 0,
                    remote_kv,
                };
                drop(reqs);
                self.inst.add_request(req, now);
            }
            Cmd::KvArrived(id) => self.inst.kv_arrived(id, now),
            Cmd::Release(id) => self.inst.release_kv(id),
            Cmd::Abort(id) => {
                if self.inst.abort(id) {
                    self.publish(shared);
                }
            }
        }
    }

    /// Publishes the instance's gauges to `/metrics`.
    fn publish(&self, shared: &Shared) {
        let st = self.inst.stats();
        shared.metrics.set_instance(
            self.index,
            st.running,
            st.waiting,
            self.inst.kv_usage(),
            st.prefix_queries,
            st.prefix_hits,
        );
    }

    /// Sleeps until something reaches the instance and applies it; false when the runtime
    /// is gone.
    async fn wait_for_cmd(&mut self) -> bool {
        let Some(cmd) = self.rx.recv().await else {
            return false;
        };
        let Some(shared) = self.shared.upgrade() else {
            return false;
        };
        self.apply_cmd(&shared, cmd);
        true
    }

    async fn run(mut self) {
        let mut outcome = StepOutcome::default();
        let mut events = Vec::new();
        loop {
            let Some(shared) = self.shared.upgrade() else {
                return;
            };
            let async_scheduling = self.inst.config().async_scheduling;
            if !async_scheduling {
                while let Ok(cmd) = self.rx.try_recv() {
                    self.apply_cmd(&shared, cmd);
                }
            }
            if !self.inst.has_work() {
                drop(shared);
                if !self.wait_for_cmd().await {
                    return;
                }
                continue;
            }
            let now = self.now();
            self.inst.schedule(now);
            if !self.inst.started().is_empty() {
                let at = Instant::now();
                let mut reqs = shared.reqs.lock().expect("requests");
                for id in self.inst.started() {
                    if let Some(r) = reqs.get_mut(id) {
                        r.scheduled.get_or_insert(at);
                    }
                }
            }
            for id in self.inst.kv_pulls().to_vec() {
                self.start_transfer(&shared, id);
            }
            // Async scheduling: what arrived during the last step is seen after this schedule.
            if async_scheduling {
                while let Ok(cmd) = self.rx.try_recv() {
                    self.apply_cmd(&shared, cmd);
                }
            }
            if self.inst.plan().tokens() == 0 {
                // Only KV pulls in flight: wait for something to happen.
                drop(shared);
                if !self.wait_for_cmd().await {
                    return;
                }
                continue;
            }
            let began = Instant::now();
            if let Err(e) = self.device.execute(self.inst.plan(), &mut outcome) {
                tracing::error!(instance = %shared.insts[self.index].name, "device failed: {e}");
                return;
            }
            shared.metrics.step(self.index, self.inst.plan(), &outcome);
            if shared.cfg.record_steps {
                shared.steps.lock().expect("step log").push(StepRecord {
                    instance: self.index,
                    rank_tokens: self
                        .inst
                        .plan()
                        .ranks
                        .iter()
                        .map(|r| r.shape.tokens())
                        .collect(),
                    duration: outcome.duration,
                });
            }
            let scale = shared.cfg.time_scale;
            drop(shared);
            if scale > 0.0 {
                let target = Duration::from_secs_f64(outcome.duration.as_secs_f64() * scale);
                let spent = began.elapsed();
                if target > spent {
                    tokio::time::sleep(target - spent).await;
                }
            } else {
                tokio::task::yield_now().await;
            }
            let Some(shared) = self.shared.upgrade() else {
                return;
            };
            events.clear();
            let now = self.now();
            self.inst.apply(now, &outcome, &mut events);
            self.after_step(&shared, &events);
        }
    }

    fn start_transfer(&mut self, shared: &Arc<Shared>, id: ReqId) {
        let (prompt, prefill) = match shared.reqs.lock().expect("requests").get(&id) {
            Some(r) => (r.prompt + r.emitted, r.prefill),
            None => return,
        };
        let bytes = prompt as f64 * shared.cfg.kv_bytes_per_token;
        let x = self
            .device
            .send_kv(&KvTransfer {
                req: id,
                bytes,
                span_dies: shared.cfg.span_dies,
            })
            .unwrap_or(dstwin_core::device::TransferOutcome {
                latency: SimDuration::ZERO,
                bytes_per_s: f64::INFINITY,
            });
        let secs = x.latency.as_secs_f64() + bytes / x.bytes_per_s;
        let wait = Duration::from_secs_f64(secs * shared.cfg.time_scale);
        let me = shared.insts[self.index].tx.clone();
        let from = prefill.map(|p| shared.insts[p].tx.clone());
        tokio::spawn(async move {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            let _ = me.send(Cmd::KvArrived(id));
            if let Some(p) = from {
                let _ = p.send(Cmd::Release(id));
            }
        });
    }

    /// Tells the proxy a request left this serving instance.
    fn decode_done(&self, shared: &Shared, prompt: u32) {
        let k = shared
            .serve_ids
            .iter()
            .position(|&x| x == self.index)
            .expect("a serving instance");
        shared
            .proxy
            .lock()
            .expect("proxy")
            .decode_done(k, prompt as u64);
    }

    /// Streams the step's tokens and moves requests on (PD hand-off, finish, send-back).
    fn after_step(&mut self, shared: &Arc<Shared>, events: &[InstEvent]) {
        let role = self.inst.config().role;
        let m = shared.metrics.engine(self.index);
        let now = Instant::now();
        let rt = Runtime {
            shared: shared.clone(),
        };
        if role != Role::Prefill {
            let mut reqs = shared.reqs.lock().expect("requests");
            let mut generated = 0;
            for &(id, n) in self.inst.emissions() {
                let Some(r) = reqs.get_mut(&id) else { continue };
                generated += n as u64;
                r.emitted += n;
                if r.first.is_none() {
                    r.first = Some(now);
                    m.ttft.observe((now - r.arrival).as_secs_f64());
                } else {
                    m.itl.observe((now - r.last).as_secs_f64());
                }
                r.last = now;
                let _ = r.tx.send(Out::Tokens(n));
            }
            m.generation_tokens.fetch_add(generated, Ordering::Relaxed);
        }
        for e in events {
            match *e {
                InstEvent::First { req } if role == Role::Prefill => {
                    let Some(prompt) = shared
                        .reqs
                        .lock()
                        .expect("requests")
                        .get(&req)
                        .map(|r| r.prompt + r.emitted)
                    else {
                        continue;
                    };
                    let pk = shared
                        .prefill_ids
                        .iter()
                        .position(|&x| x == self.index)
                        .expect("a prefill instance");
                    let dk = {
                        let mut p = shared.proxy.lock().expect("proxy");
                        p.prefill_done(pk, prompt as u64);
                        p.route_decode(prompt as u64)
                    };
                    rt.send_to(shared.serve_ids[dk], req, true);
                }
                InstEvent::First { req } => {
                    if !shared.prefill_ids.is_empty() {
                        let r = shared.reqs.lock().expect("requests");
                        if let Some((p, prompt)) =
                            r.get(&req).and_then(|r| r.prefill.map(|p| (p, r.prompt)))
                        {
                            drop(r);
                            let pk = shared
                                .prefill_ids
                                .iter()
                                .position(|&x| x == p)
                                .expect("a prefill instance");
                            shared
                                .proxy
                                .lock()
                                .expect("proxy")
                                .decode_started(pk, prompt as u64);
                        }
                    }
                }
                InstEvent::Gap { .. } => {}
                InstEvent::Finished { req } => {
                    let Some(r) = shared.reqs.lock().expect("requests").remove(&req) else {
                        continue;
                    };
                    shared.pending.fetch_sub(1, Ordering::Relaxed);
                    self.decode_done(shared, r.prompt);
                    shared.metrics.request_finished(
                        self.index,
                        &r.times(now),
                        FinishReason::Length,
                    );
                    let _ = r.tx.send(Out::Finished);
                }
                InstEvent::Preempted { .. } => {
                    m.preemptions.fetch_add(1, Ordering::Relaxed);
                }
                InstEvent::SentBack { req, .. } => {
                    m.preemptions.fetch_add(1, Ordering::Relaxed);
                    let prompt = shared
                        .reqs
                        .lock()
                        .expect("requests")
                        .get(&req)
                        .map(|r| r.prompt);
                    if let Some(prompt) = prompt {
                        self.decode_done(shared, prompt);
                        rt.route_prefill(req);
                    }
                }
            }
        }
        self.publish(shared);
    }
}
