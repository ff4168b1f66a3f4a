//! dstwin-runtime, the wall-clock runtime: the deployment core (`dstwin_core::deploy`, the same
//! instances, schedulers, PD proxy and KV hand-off as the simulator) driven in real time behind
//! an OpenAI-compatible HTTP API.
//!
//! - [`Runtime`]: the handle clients submit requests through; a control task loops around the
//!   deployment core (`driver`); each instance's device runs its steps on a thread of its own.
//! - [`api`]: the axum router (`/v1/completions`, `/v1/chat/completions`, `/v1/models`,
//!   `/health`, `/metrics`).
//! - [`request`]: request bodies parsed and validated once (what is honoured, what refused).
//! - [`prompt`]: prompt token ids (HF tokenizer, or estimated) and the DeepSeek chat template.
//! - [`parsers`]: DeepSeek reasoning and tool-call parsers (vLLM's names), streaming and whole.
//! - `output`: one choice's output: stop strings and the parsers.
//! - [`metrics`]: vLLM-named Prometheus metrics.
//! - [`text`]: deterministic placeholder text for devices that return no token ids.
//!
//! Time: the core runs on device time, `elapsed wall time / time scale`. A device that predicts
//! its steps (the twin) finishes a step at its start plus the predicted duration, and the control
//! task waits for that moment (scale 1 = real time, 0 = as fast as the host runs, events in
//! device-time order). A device that measures (a real engine) finishes when it returns. KV moves
//! through a [`Fabric`](dstwin_core::device::Fabric): the twin's shares links between concurrent
//! transfers exactly as in the simulator.

pub mod access;
pub mod api;
mod driver;
pub mod listen;
pub mod metrics;
mod output;
pub mod parsers;
pub mod prompt;
pub mod request;
pub mod text;

pub use dstwin_core::deploy::StepRecord;
use dstwin_core::deploy::{DeploymentConfig, InstanceSpec};
use dstwin_core::device::{Device, Fabric, FinishReason, ReqId};
use metrics::Metrics;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// One instance to serve: the deployment core's description of it and the device it runs on.
pub struct ServeInstance {
    pub spec: InstanceSpec,
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
    /// Routing policies and KV bytes per token.
    pub deployment: DeploymentConfig,
    /// Keep a log of every step (for conformance checks); off in production.
    pub record_steps: bool,
}

/// What a client's stream receives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Out {
    /// `n` more tokens were sampled; their ids when the device returns tokens.
    Tokens { n: u32, ids: Vec<u32> },
    /// The request is complete.
    Finished(FinishReason),
}

/// A request as clients submit it.
#[derive(Clone, Debug, Default)]
pub struct Submit {
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    /// The prompt's token ids, when a tokenizer produced them: they drive prefix caching (block
    /// hashes of the real tokens) and a device that executes requests.
    pub token_ids: Option<Vec<u32>>,
    /// How a device that returns tokens samples it (`None`: the device's defaults).
    pub sampling: Option<dstwin_core::device::SamplingParams>,
    /// One of the `n` choices of a request with `n` above 1: the key its choices share
    /// ([`Runtime::parent`]) and `n`. `/metrics` records the request's `n` and the most tokens
    /// a choice generated once every choice has ended, as vLLM does for a parent request.
    pub parent: Option<(u64, u32)>,
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
    /// A device failed: nothing is served any more.
    #[error("the server cannot serve: {0}")]
    Failed(String),
}

/// What reaches the control task from clients.
enum Cmd {
    Submit {
        id: ReqId,
        req: Submit,
        tx: mpsc::UnboundedSender<Out>,
    },
    /// The client went away (`Stop`: a stop string ended it).
    End(ReqId, metrics::FinishReason),
    /// Not every choice of parent request `.0` was admitted: it records nothing.
    ForgetParent(u64),
}

struct Shared {
    cfg: RuntimeConfig,
    names: Vec<String>,
    max_model_len: u64,
    cmds: mpsc::UnboundedSender<Cmd>,
    next_id: AtomicU64,
    pending: AtomicUsize,
    closing: AtomicBool,
    metrics: Metrics,
    steps: Mutex<Vec<StepRecord>>,
    /// Why the deployment stopped working (a device failed or panicked): set once by the
    /// control task, which then ends; [`Runtime::failed`] wakes on it.
    failure: Mutex<Option<String>>,
    failed: tokio::sync::Notify,
}

/// A running deployment. Cheap to clone; the control task stops when every clone is dropped
/// and its work is done.
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
        if matches!(o, Some(Out::Finished(_)) | None) {
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
        if matches!(o, Some(Out::Finished(_))) {
            self.done = true;
        }
        o
    }

    /// Drops the request now (the client went away): frees its KV, no more output.
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
    /// Starts the control task on the current tokio runtime and a thread per instance device.
    pub fn start(
        cfg: RuntimeConfig,
        instances: Vec<ServeInstance>,
        fabric: Box<dyn Fabric + Send>,
    ) -> Runtime {
        assert!(!instances.is_empty(), "a deployment needs an instance");
        let (tx, rx) = mpsc::unbounded_channel();
        let names = instances.iter().map(|i| i.spec.name.clone()).collect();
        let max_model_len = instances
            .iter()
            .map(|i| i.spec.config.max_model_len)
            .min()
            .unwrap_or(0);
        let n = instances.len();
        let shared = Arc::new(Shared {
            metrics: Metrics::new(&cfg.model, n),
            cfg,
            names,
            max_model_len,
            cmds: tx,
            next_id: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
            steps: Mutex::new(Vec::new()),
            failure: Mutex::new(None),
            failed: tokio::sync::Notify::new(),
        });
        driver::spawn(Arc::downgrade(&shared), instances, fabric, rx);
        Runtime { shared }
    }

    pub fn model(&self) -> &str {
        &self.shared.cfg.model
    }

    /// Wall seconds per predicted second (`serve --time-scale`).
    pub fn time_scale(&self) -> f64 {
        self.shared.cfg.time_scale
    }

    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// The longest prompt + output every instance accepts.
    pub fn max_model_len(&self) -> u64 {
        self.shared.max_model_len
    }

    /// Requests admitted and not finished.
    pub fn pending(&self) -> usize {
        self.shared.pending.load(Ordering::Relaxed)
    }

    /// Why the deployment stopped working, once a device failed.
    pub fn failure(&self) -> Option<String> {
        self.shared.failure.lock().expect("failure").clone()
    }

    /// Waits until a device fails; its message.
    pub async fn failed(&self) -> String {
        loop {
            // Registered before the check: a failure set after it still wakes this waiter.
            let mut woken = std::pin::pin!(self.shared.failed.notified());
            woken.as_mut().enable();
            if let Some(m) = self.failure() {
                return m;
            }
            woken.await;
        }
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
        if let Some(m) = self.failure() {
            return Err(AdmitError::Failed(m));
        }
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
        if s.cmds.send(Cmd::Submit { id, req: r, tx }).is_err() {
            // The control task is gone: the runtime is shutting down.
            s.pending.fetch_sub(1, Ordering::Relaxed);
            return Err(AdmitError::ShuttingDown);
        }
        Ok(Stream {
            id,
            rx,
            runtime: self.clone(),
            done: false,
        })
    }

    /// A key for the choices of one request with `n` above 1 ([`Submit::parent`]).
    pub fn parent(&self) -> u64 {
        self.shared.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The choices of parent `key` were not all admitted (the ones that were are dropped):
    /// the request records no parent metrics.
    pub fn forget_parent(&self, key: u64) {
        let _ = self.shared.cmds.send(Cmd::ForgetParent(key));
    }

    /// Ends a request because a stop string appeared in its text: frees its KV like an abort,
    /// but counts as `finished_reason="stop"` with its timings.
    pub fn stop(&self, id: ReqId) {
        let _ = self
            .shared
            .cmds
            .send(Cmd::End(id, metrics::FinishReason::Stop));
    }

    /// Drops a request wherever it is and frees its KV.
    fn abort(&self, id: ReqId) {
        let _ = self
            .shared
            .cmds
            .send(Cmd::End(id, metrics::FinishReason::Abort));
    }

    /// The instances' names, in index order (the `engine` label of `/metrics`).
    pub fn instance_names(&self) -> Vec<String> {
        self.shared.names.clone()
    }
}
