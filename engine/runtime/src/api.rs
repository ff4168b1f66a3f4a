//! The OpenAI-compatible HTTP API over a [`Runtime`]: `POST /v1/completions`,
//! `POST /v1/chat/completions` (streaming as server-sent events or not), `GET /v1/models`,
//! `GET /health`, `GET /metrics`.
//!
//! Prompts: a text prompt counts about four characters per token ([`text::estimate_tokens`]);
//! a prompt given as token ids counts exactly. Output is deterministic placeholder text
//! ([`text`]); `seed` picks it. `stop` strings end a choice early (its KV is freed), `n` runs
//! independent choices, `max_tokens` defaults to 16 (completions) or to what fits
//! (chat). Errors are OpenAI-style JSON with 400 (bad request), 404 (unknown model), 429
//! (admission queue full) or 503 (shutting down).

use crate::text;
use crate::{AdmitError, Out, Runtime, Stream, Submit};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use dstwin_core::device::FinishReason;
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::{SystemTime, UNIX_EPOCH};

/// Most choices one request may ask for.
pub const MAX_N: u32 = 16;

/// The router.
pub fn router(rt: Runtime) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/metrics", get(metrics))
        .with_state(rt)
}

/// An OpenAI-style error response.
pub fn error(status: StatusCode, message: impl Into<String>, param: Option<&str>) -> Response {
    let kind = match status {
        StatusCode::NOT_FOUND => "NotFoundError",
        StatusCode::TOO_MANY_REQUESTS => "RateLimitError",
        StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
        _ => "BadRequestError",
    };
    let body = json!({"error": {
        "message": message.into(),
        "type": kind,
        "param": param,
        "code": status.as_u16(),
    }});
    (status, axum::Json(body)).into_response()
}

async fn metrics(State(rt): State<Runtime>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        rt.metrics().render(),
    )
        .into_response()
}

async fn models(State(rt): State<Runtime>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": rt.model(),
            "object": "model",
            "created": unix_now(),
            "owned_by": "dstwin",
            "root": rt.model(),
            "max_model_len": rt.max_model_len(),
        }]
    }))
    .into_response()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u64>),
    IdLists(Vec<Vec<u64>>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Default)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Deserialize)]
struct CompletionRequest {
    model: String,
    prompt: Prompt,
    max_tokens: Option<i64>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    stop: Option<Stop>,
    seed: Option<u64>,
    n: Option<i64>,
}

#[derive(Deserialize)]
struct Message {
    #[allow(dead_code)]
    role: String,
    #[serde(default)]
    content: Option<Value>,
}

#[derive(Deserialize)]
struct ChatRequest {
    model: String,
    messages: Vec<Message>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    stop: Option<Stop>,
    seed: Option<u64>,
    n: Option<i64>,
}

/// What both endpoints need once the request body is understood.
struct Job {
    chat: bool,
    prompt_tokens: u32,
    max_tokens: Option<i64>,
    stream: bool,
    include_usage: bool,
    stop: Vec<String>,
    seed: Option<u64>,
    n: i64,
}

// Handlers answer errors with a finished response; its size does not matter here.
#[allow(clippy::result_large_err)]
fn parse<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, Response> {
    serde_json::from_slice(body).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {e}"),
            None,
        )
    })
}

#[allow(clippy::result_large_err)]
fn check_model(rt: &Runtime, model: &str) -> Result<(), Response> {
    if model != rt.model() {
        return Err(error(
            StatusCode::NOT_FOUND,
            format!(
                "The model `{model}` does not exist; this server serves `{}`.",
                rt.model()
            ),
            Some("model"),
        ));
    }
    Ok(())
}

fn stops(s: Option<Stop>) -> Vec<String> {
    match s {
        None => Vec::new(),
        Some(Stop::One(x)) => vec![x],
        Some(Stop::Many(v)) => v,
    }
    .into_iter()
    .filter(|x| !x.is_empty())
    .collect()
}

async fn completions(State(rt): State<Runtime>, body: Bytes) -> Response {
    let req: CompletionRequest = match parse(&body) {
        Ok(r) => r,
        Err(e) => return e,
    };
    if let Err(e) = check_model(&rt, &req.model) {
        return e;
    }
    let prompt_tokens = match &req.prompt {
        Prompt::Text(t) => text::estimate_tokens(t),
        Prompt::Ids(ids) if !ids.is_empty() => ids.len() as u32,
        Prompt::Texts(v) if v.len() == 1 => text::estimate_tokens(&v[0]),
        Prompt::IdLists(v) if v.len() == 1 && !v[0].is_empty() => v[0].len() as u32,
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "prompt must be one non-empty string or one non-empty list of token ids",
                Some("prompt"),
            )
        }
    };
    run(
        rt,
        Job {
            chat: false,
            prompt_tokens,
            max_tokens: Some(req.max_tokens.unwrap_or(16)),
            stream: req.stream,
            include_usage: req.stream_options.unwrap_or_default().include_usage,
            stop: stops(req.stop),
            seed: req.seed,
            n: req.n.unwrap_or(1),
        },
    )
    .await
}

async fn chat(State(rt): State<Runtime>, body: Bytes) -> Response {
    let req: ChatRequest = match parse(&body) {
        Ok(r) => r,
        Err(e) => return e,
    };
    if let Err(e) = check_model(&rt, &req.model) {
        return e;
    }
    if req.messages.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "messages must not be empty",
            Some("messages"),
        );
    }
    // The chat template adds a few tokens per message around its content.
    let mut prompt_tokens = 0;
    for m in &req.messages {
        let content = match &m.content {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(" "),
            _ => String::new(),
        };
        prompt_tokens += text::estimate_tokens(&content) + 4;
    }
    run(
        rt,
        Job {
            chat: true,
            prompt_tokens,
            max_tokens: req.max_completion_tokens.or(req.max_tokens),
            stream: req.stream,
            include_usage: req.stream_options.unwrap_or_default().include_usage,
            stop: stops(req.stop),
            seed: req.seed,
            n: req.n.unwrap_or(1),
        },
    )
    .await
}

/// One choice's output as it is produced: text so far, what was sent, and stop handling.
struct Choice {
    index: u32,
    seed: u64,
    tokens: u32,
    text: String,
    sent: usize,
    finish: Option<&'static str>,
}

impl Choice {
    /// Appends `n` tokens; returns the text that may be sent now (held back while it could
    /// still turn into a stop string).
    fn push(&mut self, n: u32, stops: &[String]) -> String {
        text::push_tokens(&mut self.text, self.seed, self.tokens, n);
        self.tokens += n;
        let from = self
            .sent
            .saturating_sub(stops.iter().map(String::len).max().unwrap_or(0));
        if let Some(p) = stops
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|p| p + from))
            .min()
        {
            self.text.truncate(p);
            self.finish = Some("stop");
            return self.take(p);
        }
        let hold = stops
            .iter()
            .map(|s| s.len().saturating_sub(1))
            .max()
            .unwrap_or(0);
        let upto = self.text.len().saturating_sub(hold).max(self.sent);
        self.take(upto)
    }

    fn take(&mut self, upto: usize) -> String {
        let s = self.text[self.sent..upto].to_string();
        self.sent = upto;
        s
    }
}

async fn run(rt: Runtime, job: Job) -> Response {
    if job.n < 1 || job.n > MAX_N as i64 {
        return error(
            StatusCode::BAD_REQUEST,
            format!("n must be between 1 and {MAX_N}, got {}", job.n),
            Some("n"),
        );
    }
    let room = rt.max_model_len().saturating_sub(job.prompt_tokens as u64);
    let max_tokens = match job.max_tokens {
        None if room > 0 => room,
        None => 0,
        Some(m) if m < 1 => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("max_tokens must be at least 1, got {m}"),
                Some("max_tokens"),
            )
        }
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
    for _ in 0..job.n {
        match rt.submit(Submit {
            prompt_tokens: job.prompt_tokens,
            max_tokens: max_tokens as u32,
            token_ids: None,
        }) {
            Ok(s) => streams.push(s),
            Err(e) => {
                let status = match e {
                    AdmitError::TooLong { .. } => StatusCode::BAD_REQUEST,
                    AdmitError::Busy { .. } => StatusCode::TOO_MANY_REQUESTS,
                    AdmitError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
                };
                // Streams admitted so far are dropped here, which aborts them.
                return error(status, e.to_string(), None);
            }
        }
    }
    let id = format!(
        "{}-{}",
        if job.chat { "chatcmpl" } else { "cmpl" },
        streams[0].id
    );
    let choices: Vec<Choice> = streams
        .iter()
        .enumerate()
        .map(|(i, s)| Choice {
            index: i as u32,
            seed: job.seed.map_or(s.id, |x| x.wrapping_add(i as u64)),
            tokens: 0,
            text: String::new(),
            sent: 0,
            finish: None,
        })
        .collect();
    let merged = Outputs::new(streams);
    let prefix = format!(
        "{{\"id\":{},\"object\":\"{}\",\"created\":{},\"model\":{},\"choices\":[",
        serde_json::to_string(&id).expect("a string serializes"),
        if job.chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        },
        unix_now(),
        serde_json::to_string(rt.model()).expect("a string serializes"),
    );
    let meta = Meta {
        prefix,
        id,
        model: rt.model().to_string(),
        created: unix_now(),
        chat: job.chat,
        prompt_tokens: job.prompt_tokens,
        include_usage: job.include_usage,
        stop: job.stop,
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
    stop: Vec<String>,
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

fn usage(prompt: u32, completion: u32) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
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
            Out::Tokens { n, .. } => {
                c.push(n, &meta.stop);
                if c.finish.is_some() {
                    open -= 1;
                }
            }
            Out::Finished(_) => {
                c.finish = Some("length");
                open -= 1;
            }
        }
    }
    // Choices that stopped early: dropping the receiver ends their streams, freeing their KV.
    drop(rx);
    let completion: u32 = choices.iter().map(|c| c.tokens).sum();
    let out: Vec<Value> = choices
        .iter()
        .map(|c| {
            if meta.chat {
                json!({"index": c.index, "message": {"role": "assistant", "content": c.text},
                       "logprobs": null, "finish_reason": c.finish.unwrap_or("length")})
            } else {
                json!({"index": c.index, "text": c.text, "logprobs": null,
                       "finish_reason": c.finish.unwrap_or("length")})
            }
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

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// One streamed chunk as an SSE frame, formatted directly (the hot path of streaming).
fn chunk(meta: &Meta, index: u32, text: Option<&str>, finish: Option<&str>, role: bool) -> Bytes {
    let esc = |t: &str| serde_json::to_string(t).expect("a string serializes");
    let finish = finish.map_or("null".to_string(), |f| format!("\"{f}\""));
    let choice = if meta.chat {
        let mut delta = Vec::new();
        if role {
            delta.push("\"role\":\"assistant\"".to_string());
        }
        if let Some(t) = text {
            delta.push(format!("\"content\":{}", esc(t)));
        }
        format!(
            "{{\"index\":{index},\"delta\":{{{}}},\"logprobs\":null,\"finish_reason\":{finish}}}",
            delta.join(",")
        )
    } else {
        format!(
            "{{\"index\":{index},\"text\":{},\"logprobs\":null,\"finish_reason\":{finish}}}",
            esc(text.unwrap_or(""))
        )
    };
    Bytes::from(format!("data: {}{choice}]}}\n\n", meta.prefix))
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
            for c in &st.choices {
                buf.extend_from_slice(&chunk(&st.meta, c.index, Some(""), None, true));
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
                        p => {
                            st.held = Some((j, p));
                            break;
                        }
                    }
                }
                o = Out::Tokens { n, ids };
            }
            let stop = st.meta.stop.clone();
            let c = &mut st.choices[i as usize];
            if c.finish.is_some() {
                continue;
            }
            let (text, finish) = match o {
                Out::Tokens { n, .. } => {
                    let t = c.push(n, &stop);
                    (t, c.finish)
                }
                Out::Finished(reason) => {
                    c.finish = Some(match reason {
                        FinishReason::Stop => "stop",
                        FinishReason::Length => "length",
                    });
                    let rest = c.take(c.text.len());
                    (rest, c.finish)
                }
            };
            if finish.is_some() {
                st.open -= 1;
            }
            if !text.is_empty() || finish.is_some() {
                let frame = chunk(
                    &st.meta,
                    c.index,
                    (!text.is_empty() || !st.meta.chat).then_some(text.as_str()),
                    finish,
                    false,
                );
                return Some((Ok(frame), st));
            }
        }
        // Every choice is over: free what stopped early, then usage and [DONE].
        st.rx = None;
        st.done = true;
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
            buf.extend_from_slice(&sse(&v));
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
