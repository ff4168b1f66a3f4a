//! The OpenAI-compatible HTTP API over a [`Runtime`]: `POST /v1/completions`,
//! `POST /v1/chat/completions` (streaming as server-sent events or not), `GET /v1/models`,
//! `GET /health`, `GET /metrics`.
//!
//! Bodies are validated once ([`crate::request`]): every field is honoured or refused with a
//! 400 that names it. Prompts are counted by the configured tokenizer, or about four characters
//! per token without one ([`crate::prompt`]); token-id prompts count exactly. Output is
//! deterministic placeholder text ([`crate::text`]); `seed` picks it. `stop` strings end a
//! choice early (its KV is freed; it counts as `finished_reason="stop"`), `n` runs independent
//! choices. Chat output goes through the configured reasoning and tool-call parsers
//! ([`crate::parsers`]). Every request first passes the access checks ([`crate::access`]: its
//! `Host`, the API key on `/v1`, a JSON content type; 403, 401, 415). Every error, including an
//! unknown path, a wrong method and a body over the size limit (413), is OpenAI-style JSON.

use crate::access::Access;
use crate::output::{Choice, Detok, OutputParser, Piece};
use crate::parsers::{ReasoningKind, ReasoningParser, ToolCallDelta, ToolKind, ToolParser};
use crate::prompt::Counter;
use crate::request::{self, ApiError, Job, Limits};
use crate::{AdmitError, Out, Runtime, Stream, Submit};
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use dstwin_core::device::FinishReason;
use dstwin_core::device::SamplingParams;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use crate::request::MAX_N;

/// The DeepSeek V3/R1 vocabulary size, for token-id checks without a tokenizer.
pub const DEEPSEEK_VOCAB: u64 = 129_280;

/// How the API reads requests and shapes answers.
pub struct ApiConfig {
    /// Counts prompt tokens.
    pub counter: Counter,
    /// Token ids at or above this are refused.
    pub vocab_size: u64,
    /// `--tool-call-parser`.
    pub tool_parser: Option<ToolKind>,
    /// `--enable-auto-tool-choice` (needs a tool-call parser, as in vLLM).
    pub auto_tool_choice: bool,
    /// `--reasoning-parser`.
    pub reasoning_parser: Option<ReasoningKind>,
    /// `--reasoning-field`: the keys the parsed reasoning is returned under.
    pub reasoning_field: ReasoningField,
    /// Larger request bodies get 413.
    pub max_body_bytes: usize,
    /// A request body not received whole within this, from the end of its headers, gets 408.
    pub body_timeout: Duration,
    /// Hosts, API key and content types let through.
    pub access: Access,
}

/// The key a chat message and a streamed delta carry the parsed reasoning under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningField {
    /// `reasoning`, as vLLM returns it since it dropped `reasoning_content` (vllm-project/vllm
    /// pull requests 27752 and 33402).
    Reasoning,
    /// `reasoning_content`, as DeepSeek's own API and vLLM before the rename return it.
    ReasoningContent,
    /// Both keys, the same text, for clients of either.
    Both,
}

impl ReasoningField {
    /// The keys, in the order they are written.
    pub fn keys(self) -> &'static [&'static str] {
        match self {
            ReasoningField::Reasoning => &["reasoning"],
            ReasoningField::ReasoningContent => &["reasoning_content"],
            ReasoningField::Both => &["reasoning", "reasoning_content"],
        }
    }
}

impl std::str::FromStr for ReasoningField {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "reasoning" => Ok(ReasoningField::Reasoning),
            "reasoning_content" => Ok(ReasoningField::ReasoningContent),
            "both" => Ok(ReasoningField::Both),
            _ => Err(format!(
                "unknown reasoning field `{s}`; known: reasoning, reasoning_content, both"
            )),
        }
    }
}

impl Default for ApiConfig {
    /// No tokenizer (estimates), DeepSeek's vocabulary, no parsers, 32 MiB bodies read within
    /// 30 s, any host and no key.
    fn default() -> Self {
        ApiConfig {
            counter: Counter::Estimate,
            vocab_size: DEEPSEEK_VOCAB,
            tool_parser: None,
            auto_tool_choice: false,
            reasoning_parser: None,
            reasoning_field: ReasoningField::Reasoning,
            max_body_bytes: 32 << 20,
            body_timeout: Duration::from_secs(30),
            access: Access::default(),
        }
    }
}

struct App {
    rt: Runtime,
    cfg: ApiConfig,
}

type AppState = Arc<App>;

/// The router.
pub fn router(rt: Runtime, cfg: ApiConfig) -> Router {
    let limit = cfg.max_body_bytes;
    let state = Arc::new(App { rt, cfg });
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such endpoint", None) })
        .method_not_allowed_fallback(|| async {
            error(
                StatusCode::METHOD_NOT_ALLOWED,
                "this endpoint does not take that method",
                None,
            )
        })
        .layer(DefaultBodyLimit::max(limit))
        .layer(from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// The access checks, before any route (the unknown-path answer included).
async fn guard(State(app): State<AppState>, req: Request, next: Next) -> Response {
    match app
        .cfg
        .access
        .check(req.method(), req.uri().path(), req.headers())
    {
        Ok(()) => next.run(req).await,
        Err((status, message)) => error(status, message, None),
    }
}

/// An OpenAI-style error response.
pub fn error(status: StatusCode, message: impl Into<String>, param: Option<&str>) -> Response {
    (status, axum::Json(error_body(status, message, param))).into_response()
}

/// `{"error": {"message", "type", "param", "code"}}`, as a response or a stream event carries it.
fn error_body(status: StatusCode, message: impl Into<String>, param: Option<&str>) -> Value {
    let kind = match status {
        StatusCode::NOT_FOUND => "NotFoundError",
        StatusCode::TOO_MANY_REQUESTS => "RateLimitError",
        StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
        StatusCode::PAYLOAD_TOO_LARGE => "RequestTooLargeError",
        StatusCode::METHOD_NOT_ALLOWED => "MethodNotAllowedError",
        StatusCode::UNAUTHORIZED => "AuthenticationError",
        StatusCode::FORBIDDEN => "PermissionDeniedError",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "UnsupportedMediaTypeError",
        s if s.is_server_error() => "InternalServerError",
        _ => "BadRequestError",
    };
    json!({"error": {
        "message": message.into(),
        "type": kind,
        "param": param,
        "code": status.as_u16(),
    }})
}

/// Why a request's outputs ended before every choice finished: the deployment failed under
/// it (`None` while it serves).
fn failed_under(choices: &[Choice], rt: &Runtime) -> Option<String> {
    if choices.iter().all(|c| c.finish.is_some()) {
        return None;
    }
    rt.failure()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error(self.status, self.message, self.param.as_deref())
    }
}

/// A body that could not be read (too large, not UTF-8, cut off) as a JSON error.
fn rejection(e: BytesRejection, limit: usize) -> Response {
    let status = e.status();
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        return error(
            status,
            format!("the request body is larger than the limit of {limit} bytes"),
            None,
        );
    }
    error(
        status,
        format!("cannot read the request body: {}", e.body_text()),
        None,
    )
}

async fn metrics(State(app): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        app.rt.metrics().render(),
    )
        .into_response()
}

/// 200 while the deployment serves; 503 with why once a device failed.
async fn health(State(app): State<AppState>) -> Response {
    match app.rt.failure() {
        None => StatusCode::OK.into_response(),
        Some(why) => error(StatusCode::SERVICE_UNAVAILABLE, why, None),
    }
}

async fn models(State(app): State<AppState>) -> Response {
    let rt = &app.rt;
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": rt.model(),
            "object": "model",
            "created": unix_now(),
            "owned_by": "dstwin",
            "root": rt.model(),
            "max_model_len": rt.max_model_len(),
            // Not in vLLM's card: how fast the twin's steps run against the deployment's
            // (`--time-scale`), which `bench-serve --save-result` records.
            "time_scale": rt.time_scale(),
        }]
    }))
    .into_response()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl App {
    fn limits(&self) -> Limits<'_> {
        Limits {
            model: self.rt.model(),
            vocab_size: self.cfg.vocab_size,
            counter: &self.cfg.counter,
            auto_tools: self.cfg.auto_tool_choice && self.cfg.tool_parser.is_some(),
        }
    }
}

/// The request's body, read whole within the body timeout: a body too large, cut off or too
/// slow as the error response.
async fn read_body(app: &App, req: Request) -> Result<Bytes, Response> {
    let timeout = app.cfg.body_timeout;
    match tokio::time::timeout(timeout, Bytes::from_request(req, &())).await {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(e)) => Err(rejection(e, app.cfg.max_body_bytes)),
        Err(_) => Err(error(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} s (--body-timeout)",
                timeout.as_secs_f64()
            ),
            None,
        )),
    }
}

async fn completions(State(app): State<AppState>, req: Request) -> Response {
    let body = match read_body(&app, req).await {
        Ok(b) => b,
        Err(e) => return e,
    };
    let job = request::body_object(&body).and_then(|o| request::completion(&o, &app.limits()));
    match job {
        Ok(job) => run(app, job).await,
        Err(e) => e.into_response(),
    }
}

async fn chat(State(app): State<AppState>, req: Request) -> Response {
    let body = match read_body(&app, req).await {
        Ok(b) => b,
        Err(e) => return e,
    };
    let job = request::body_object(&body).and_then(|o| request::chat(&o, &app.limits()));
    match job {
        Ok(job) => run(app, job).await,
        Err(e) => e.into_response(),
    }
}

async fn run(app: AppState, job: Job) -> Response {
    let rt = app.rt.clone();
    let room = rt.max_model_len().saturating_sub(job.prompt_tokens as u64);
    let max_tokens = match job.max_tokens {
        None => room.max(1),
        Some(m) => m as u64,
    };
    if job.prompt_tokens as u64 + max_tokens > rt.max_model_len() {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the prompt, {} for the completion). Please reduce the length of the prompt or of max_tokens.",
                rt.max_model_len(),
                job.prompt_tokens as u64 + max_tokens,
                job.prompt_tokens,
                max_tokens
            ),
            Some("max_tokens"),
        );
    }
    let mut streams = Vec::new();
    let parent = (job.n > 1).then(|| (rt.parent(), job.n));
    for i in 0..job.n {
        // Choices of one request draw apart: choice i samples with the seed plus i.
        let sampling = SamplingParams {
            seed: job.sampling.seed.map(|s| s.wrapping_add(i as u64)),
            ..job.sampling.clone()
        };
        match rt.submit(Submit {
            prompt_tokens: job.prompt_tokens,
            max_tokens: max_tokens as u32,
            token_ids: Some(job.token_ids.clone()),
            sampling: Some(sampling),
            parent,
        }) {
            Ok(s) => streams.push(s),
            Err(e) => {
                let status = match e {
                    AdmitError::TooLong { .. } => StatusCode::BAD_REQUEST,
                    AdmitError::Busy { .. } => StatusCode::TOO_MANY_REQUESTS,
                    AdmitError::ShuttingDown | AdmitError::Failed(_) => {
                        StatusCode::SERVICE_UNAVAILABLE
                    }
                };
                // Streams admitted so far are dropped here, which aborts them.
                if let Some((key, _)) = parent {
                    rt.forget_parent(key);
                }
                return error(status, e.to_string(), None);
            }
        }
    }
    let id = format!(
        "{}-{}",
        if job.chat { "chatcmpl" } else { "cmpl" },
        streams[0].id
    );
    let cfg = &app.cfg;
    let choices: Vec<Choice> = streams
        .iter()
        .enumerate()
        .map(|(i, s)| Choice {
            index: i as u32,
            id: s.id,
            seed: job.seed.map_or(s.id, |x| x.wrapping_add(i as u64)),
            tokens: 0,
            text: String::new(),
            sent: 0,
            finish: None,
            stop_reason: None,
            detok: cfg.counter.tokenizer().cloned().map(Detok::new),
            parser: (job.chat && (cfg.reasoning_parser.is_some() || job.tools.is_some())).then(
                || OutputParser {
                    reasoning: cfg
                        .reasoning_parser
                        .map(|k| ReasoningParser::new(k, job.thinking)),
                    tools: cfg.tool_parser.filter(|_| job.tools.is_some()).map(|k| {
                        let id = format!("chatcmpl-tool-{}", s.id);
                        ToolParser::with_tools(k, &id, job.tools.as_ref())
                    }),
                    saw_call: false,
                },
            ),
        })
        .collect();
    let merged = Outputs::new(streams);
    let created = unix_now();
    let prefix = format!(
        "{{\"id\":{},\"object\":\"{}\",\"created\":{},\"model\":{},\"choices\":[",
        serde_json::to_string(&id).expect("a string serializes"),
        if job.chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        },
        created,
        serde_json::to_string(rt.model()).expect("a string serializes"),
    );
    let meta = Meta {
        prefix,
        id,
        model: rt.model().to_string(),
        created,
        chat: job.chat,
        prompt_tokens: job.prompt_tokens,
        include_usage: job.include_usage,
        continuous_usage: job.continuous_usage,
        stop: job.stop,
        reasoning_keys: cfg.reasoning_field.keys(),
        rt,
    };
    if job.stream {
        stream_response(meta, choices, merged)
    } else {
        whole_response(meta, choices, merged).await
    }
}

struct Meta {
    /// `{"id":..,"object":..,"created":..,"model":..,"choices":[` of every chunk.
    prefix: String,
    id: String,
    model: String,
    created: u64,
    chat: bool,
    prompt_tokens: u32,
    include_usage: bool,
    continuous_usage: bool,
    stop: Vec<String>,
    /// The keys the reasoning goes under ([`ReasoningField::keys`]).
    reasoning_keys: &'static [&'static str],
    rt: Runtime,
}

/// The outputs of a request's choices: one stream read directly, or several merged.
enum Outputs {
    One(Stream),
    Many(tokio::sync::mpsc::UnboundedReceiver<(u32, Out)>),
}

impl Outputs {
    fn new(mut streams: Vec<Stream>) -> Self {
        if streams.len() == 1 {
            Outputs::One(streams.pop().expect("one stream"))
        } else {
            Outputs::Many(merge(streams))
        }
    }

    async fn recv(&mut self) -> Option<(u32, Out)> {
        match self {
            Outputs::One(s) => s.next().await.map(|o| (0, o)),
            Outputs::Many(rx) => rx.recv().await,
        }
    }

    fn try_recv(&mut self) -> Option<(u32, Out)> {
        match self {
            Outputs::One(s) => s.try_next().map(|o| (0, o)),
            Outputs::Many(rx) => rx.try_recv().ok(),
        }
    }
}

/// All choices' outputs on one channel, tagged with the choice index. When the receiver goes
/// away (the client disconnected), the forwarding tasks end and drop their streams, which
/// aborts the requests.
fn merge(streams: Vec<Stream>) -> tokio::sync::mpsc::UnboundedReceiver<(u32, Out)> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    for (i, mut s) in streams.into_iter().enumerate() {
        let tx = tx.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    o = s.next() => match o {
                        Some(o) => {
                            let last = matches!(o, Out::Finished(_));
                            if tx.send((i as u32, o)).is_err() || last {
                                return;
                            }
                        }
                        None => return,
                    },
                    _ = tx.closed() => return,
                }
            }
        });
    }
    rx
}

/// The OpenAI finish reason of a request the runtime finished: `stop` when the model ended it
/// (EOS), `length` when it produced `max_tokens`.
fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

fn usage(prompt: u32, completion: u32) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

fn tool_calls_json(calls: &[crate::parsers::ToolCall]) -> Value {
    calls
        .iter()
        .map(|c| {
            json!({"id": c.id, "type": "function",
                   "function": {"name": c.name, "arguments": c.arguments}})
        })
        .collect()
}

async fn whole_response(meta: Meta, mut choices: Vec<Choice>, mut rx: Outputs) -> Response {
    let mut open = choices.len();
    while open > 0 {
        let Some((i, o)) = rx.recv().await else {
            break;
        };
        let c = &mut choices[i as usize];
        if c.finish.is_some() {
            continue;
        }
        match o {
            Out::Tokens { n, ids } => {
                c.push(n, &ids, &meta.stop);
                if c.finish.is_some() {
                    meta.rt.stop(c.id);
                    open -= 1;
                }
            }
            Out::Finished(reason) => {
                c.end();
                c.finish = Some(finish_reason(reason));
                open -= 1;
            }
        }
    }
    // Choices that stopped early are over in the runtime; dropping the receiver ends the rest.
    drop(rx);
    if let Some(why) = failed_under(&choices, &meta.rt) {
        return error(StatusCode::INTERNAL_SERVER_ERROR, why, None);
    }
    let completion: u32 = choices.iter().map(|c| c.tokens).sum();
    let out: Vec<Value> = choices
        .iter_mut()
        .map(|c| {
            let finish = c.finish.unwrap_or("length");
            let stop_reason = c.stop_reason.take();
            if !meta.chat {
                return json!({"index": c.index, "text": c.text, "logprobs": null,
                              "finish_reason": finish, "stop_reason": stop_reason});
            }
            let Some(mut p) = c.parser.take() else {
                return json!({"index": c.index,
                              "message": {"role": "assistant", "content": c.text},
                              "logprobs": null, "finish_reason": finish,
                              "stop_reason": stop_reason});
            };
            let piece = p.push(&c.text, true);
            let calls = p
                .tools
                .as_ref()
                .map(ToolParser::complete_calls)
                .unwrap_or_default();
            let finish = if calls.is_empty() {
                finish
            } else {
                "tool_calls"
            };
            // As vLLM: no content (null) when the answer was all reasoning or all tool calls.
            let only_parsed = !calls.is_empty() || !piece.reasoning.is_empty();
            let content = (!piece.content.is_empty() || !only_parsed).then_some(piece.content);
            let mut message = json!({"role": "assistant", "content": content});
            if p.reasoning.is_some() {
                let reasoning: Value = (!piece.reasoning.is_empty())
                    .then_some(piece.reasoning)
                    .into();
                for key in meta.reasoning_keys {
                    message[*key] = reasoning.clone();
                }
            }
            if !calls.is_empty() {
                message["tool_calls"] = tool_calls_json(&calls);
            }
            json!({"index": c.index, "message": message, "logprobs": null,
                   "finish_reason": finish, "stop_reason": stop_reason})
        })
        .collect();
    axum::Json(json!({
        "id": meta.id,
        "object": if meta.chat { "chat.completion" } else { "text_completion" },
        "created": meta.created,
        "model": meta.model,
        "choices": out,
        "usage": usage(meta.prompt_tokens, completion),
    }))
    .into_response()
}

/// What one streamed chunk carries for one choice.
#[derive(Default)]
struct Delta<'a> {
    role: bool,
    content: Option<&'a str>,
    reasoning: Option<&'a str>,
    calls: &'a [ToolCallDelta],
}

fn esc(t: &str) -> String {
    serde_json::to_string(t).expect("a string serializes")
}

/// One streamed chunk as an SSE frame, formatted directly (the hot path of streaming). The
/// chunk that finishes a choice carries its `stop_reason` (the stop string matched, or null).
fn chunk(
    meta: &Meta,
    index: u32,
    d: &Delta,
    finish: Option<(&str, Option<&str>)>,
    usage_so_far: Option<u32>,
) -> Bytes {
    let finish = finish.map_or("null".to_string(), |(f, stop)| {
        let stop = stop.map_or("null".to_string(), esc);
        format!("\"{f}\",\"stop_reason\":{stop}")
    });
    let choice = if meta.chat {
        let mut delta = Vec::new();
        if d.role {
            delta.push("\"role\":\"assistant\"".to_string());
        }
        if let Some(t) = d.content {
            delta.push(format!("\"content\":{}", esc(t)));
        }
        if let Some(t) = d.reasoning {
            for key in meta.reasoning_keys {
                delta.push(format!("\"{key}\":{}", esc(t)));
            }
        }
        if !d.calls.is_empty() {
            let calls: Vec<Value> = d
                .calls
                .iter()
                .map(|c| {
                    let mut f = json!({"arguments": c.arguments});
                    if let Some(n) = &c.name {
                        f["name"] = json!(n);
                    }
                    let mut v = json!({"index": c.index, "function": f});
                    if let Some(id) = &c.id {
                        v["id"] = json!(id);
                        v["type"] = json!("function");
                    }
                    v
                })
                .collect();
            delta.push(format!("\"tool_calls\":{}", Value::Array(calls)));
        }
        format!(
            "{{\"index\":{index},\"delta\":{{{}}},\"logprobs\":null,\"finish_reason\":{finish}}}",
            delta.join(",")
        )
    } else {
        format!(
            "{{\"index\":{index},\"text\":{},\"logprobs\":null,\"finish_reason\":{finish}}}",
            esc(d.content.unwrap_or(""))
        )
    };
    let usage = usage_so_far.map_or(String::new(), |c| {
        format!(",\"usage\":{}", usage(meta.prompt_tokens, c))
    });
    Bytes::from(format!("data: {}{choice}]{usage}}}\n\n", meta.prefix))
}

fn stream_response(meta: Meta, choices: Vec<Choice>, rx: Outputs) -> Response {
    struct St {
        meta: Meta,
        choices: Vec<Choice>,
        rx: Option<Outputs>,
        /// An output read while coalescing that belongs to the next frame.
        held: Option<(u32, Out)>,
        open: usize,
        started: bool,
        done: bool,
    }
    impl St {
        /// Completion tokens so far, when every chunk carries usage.
        fn usage(&self) -> Option<u32> {
            self.meta
                .continuous_usage
                .then(|| self.choices.iter().map(|c| c.tokens).sum())
        }
    }
    let open = choices.len();
    let st = St {
        meta,
        choices,
        rx: Some(rx),
        held: None,
        open,
        started: false,
        done: false,
    };
    let body = futures_util::stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        let mut buf = Vec::new();
        if !st.started && st.meta.chat {
            // Chat streams open with the assistant role.
            st.started = true;
            let u = st.usage();
            for c in &st.choices {
                let d = Delta {
                    role: true,
                    content: Some(""),
                    ..Delta::default()
                };
                buf.extend_from_slice(&chunk(&st.meta, c.index, &d, None, u));
            }
            return Some((Ok::<Bytes, std::convert::Infallible>(Bytes::from(buf)), st));
        }
        while st.open > 0 {
            let Some(rx) = st.rx.as_mut() else { break };
            let next = match st.held.take() {
                Some(x) => Some(x),
                None => rx.recv().await,
            };
            let Some((i, mut o)) = next else {
                st.open = 0;
                break;
            };
            // Tokens of one choice that are already here go out in one frame.
            if let Out::Tokens { mut n, mut ids } = o {
                while let Some((j, p)) = rx.try_recv() {
                    match p {
                        Out::Tokens { n: m, ids: more } if j == i => {
                            n += m;
                            ids.extend(more);
                        }
                        _ => {
                            st.held = Some((j, p));
                            break;
                        }
                    }
                }
                o = Out::Tokens { n, ids };
            }
            let stop = std::mem::take(&mut st.meta.stop);
            let c = &mut st.choices[i as usize];
            if c.finish.is_some() {
                st.meta.stop = stop;
                continue;
            }
            let tokens = matches!(o, Out::Tokens { .. });
            let raw = match o {
                Out::Tokens { n, ids } => c.push(n, &ids, &stop),
                Out::Finished(reason) => {
                    c.end();
                    c.finish = Some(finish_reason(reason));
                    c.take(c.text.len())
                }
            };
            st.meta.stop = stop;
            if c.finish == Some("stop") {
                st.meta.rt.stop(c.id);
            }
            let ended = c.finish.is_some();
            let piece = match c.parser.as_mut() {
                Some(p) => p.push(&raw, ended),
                None => Piece {
                    content: raw,
                    ..Piece::default()
                },
            };
            let finish = c.reported_finish();
            let stop_reason = c.stop_reason.clone();
            let index = c.index;
            if ended {
                st.open -= 1;
            }
            // As vLLM streams: a chunk for every step's new tokens, their text empty when it
            // is still incomplete (part of a UTF-8 sequence, a skipped special token, a held
            // possible stop string), so a client sees each token when it is made. A reasoning
            // or tool parser that keeps the text back sends nothing, as vLLM's does.
            let plain = c.parser.is_none();
            if !piece.is_empty() || ended || (tokens && plain) {
                let chat = st.meta.chat;
                let d = Delta {
                    role: false,
                    content: (!piece.content.is_empty() || !chat).then_some(piece.content.as_str()),
                    reasoning: (!piece.reasoning.is_empty()).then_some(piece.reasoning.as_str()),
                    calls: &piece.calls,
                };
                let stop = finish.map(|f| (f, stop_reason.as_deref()));
                let frame = chunk(&st.meta, index, &d, stop, st.usage());
                return Some((Ok(frame), st));
            }
        }
        // Every choice is over: free what stopped early, then usage and [DONE]. Choices that
        // ended without finishing: the deployment failed under the stream, which says so in an
        // error event, as vLLM's streams do.
        st.rx = None;
        st.done = true;
        if let Some(why) = failed_under(&st.choices, &st.meta.rt) {
            let v = error_body(StatusCode::INTERNAL_SERVER_ERROR, why, None);
            buf.extend_from_slice(format!("data: {v}\n\n").as_bytes());
        }
        if st.meta.include_usage {
            let completion: u32 = st.choices.iter().map(|c| c.tokens).sum();
            let v = json!({
                "id": st.meta.id,
                "object": if st.meta.chat { "chat.completion.chunk" } else { "text_completion" },
                "created": st.meta.created,
                "model": st.meta.model,
                "choices": [],
                "usage": usage(st.meta.prompt_tokens, completion),
            });
            buf.extend_from_slice(format!("data: {v}\n\n").as_bytes());
        }
        buf.extend_from_slice(b"data: [DONE]\n\n");
        Some((Ok(Bytes::from(buf)), st))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .expect("a valid response")
}
