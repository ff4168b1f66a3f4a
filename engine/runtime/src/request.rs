//! Request bodies of `/v1/completions` and `/v1/chat/completions`, parsed and validated once
//! into a [`Job`]. Every field is either honoured or refused with a 400 that names it, the way
//! vLLM refuses it; none is silently ignored:
//!
//! - honoured: `model`, `prompt` / `messages`, `max_tokens` / `max_completion_tokens`, `n`,
//!   `stream`, `stream_options` (`include_usage`, `continuous_usage_stats`), `stop`, `seed`,
//!   `tools` + `tool_choice` `"auto"`/`"none"` (with a tool-call parser),
//!   `chat_template_kwargs.thinking`, and the sampling knobs (`temperature`, `top_p`, `top_k`,
//!   `min_p`, `seed`, penalties, `ignore_eos`, `min_tokens`), checked for type and range and
//!   handed to the device as [`SamplingParams`]: a device that samples (the CPU engine) honours
//!   them, the twin's placeholder text has no numerics for them to shape;
//! - refused (the twin device has no token probabilities and cannot constrain its text):
//!   `logprobs`, `top_logprobs`, `prompt_logprobs`, `echo`, `suffix`, `best_of` other than `n`,
//!   non-empty `logit_bias`, `response_format` other than text, guided decoding, `tool_choice`
//!   `"required"` or a named function.

use crate::prompt::{render_chat, ChatMessage, Counter};
use axum::http::StatusCode;
use dstwin_core::device::SamplingParams;
use serde_json::{Map, Value};

/// Most choices one request may ask for.
pub const MAX_N: i64 = 16;
/// Most stop strings a request may give, and the longest (each is searched for in the text of
/// every token the request produces: 100,000 of them cost 190 times a request's CPU).
pub const MAX_STOPS: usize = 64;
pub const MAX_STOP_BYTES: usize = 4096;

/// A refused request: status, message and the offending parameter.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
}

impl ApiError {
    pub fn bad(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param.to_string()),
        }
    }

    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
        }
    }
}

/// Server-side settings a request is checked against.
pub struct Limits<'a> {
    pub model: &'a str,
    pub vocab_size: u64,
    pub counter: &'a Counter,
    /// `--enable-auto-tool-choice` with a `--tool-call-parser`.
    pub auto_tools: bool,
}

/// A validated request.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    pub chat: bool,
    pub prompt_tokens: u32,
    /// The prompt's token ids (from the tokenizer, the request's own ids, or estimated from the
    /// text): they drive prefix caching.
    pub token_ids: Vec<u32>,
    /// `None`: what fits (chat without a limit).
    pub max_tokens: Option<u32>,
    pub n: u32,
    pub stream: bool,
    pub include_usage: bool,
    pub continuous_usage: bool,
    pub stop: Vec<String>,
    pub seed: Option<u64>,
    /// How a device that returns tokens samples each choice (choice i adds i to the seed).
    pub sampling: SamplingParams,
    /// Tool calls are parsed from the output (tool_choice "auto"): the request's `tools` array,
    /// whose parameter schemas the tool parser converts arguments to.
    pub tools: Option<Value>,
    /// `chat_template_kwargs.thinking` / `enable_thinking`.
    pub thinking: bool,
}

/// Typed access to a body's fields; `null` counts as absent, as in the OpenAI API.
struct Fields<'a>(&'a Map<String, Value>);

fn type_error(k: &str, want: &str) -> ApiError {
    ApiError::bad(k, format!("`{k}` must be {want}"))
}

impl<'a> Fields<'a> {
    fn get(&self, k: &str) -> Option<&'a Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }

    fn bool(&self, k: &str) -> Result<Option<bool>, ApiError> {
        self.get(k)
            .map(|v| v.as_bool().ok_or_else(|| type_error(k, "a boolean")))
            .transpose()
    }

    fn int(&self, k: &str) -> Result<Option<i64>, ApiError> {
        self.get(k)
            .map(|v| v.as_i64().ok_or_else(|| type_error(k, "an integer")))
            .transpose()
    }

    fn num(&self, k: &str) -> Result<Option<f64>, ApiError> {
        self.get(k)
            .map(|v| v.as_f64().ok_or_else(|| type_error(k, "a number")))
            .transpose()
    }

    fn str(&self, k: &str) -> Result<Option<&'a str>, ApiError> {
        self.get(k)
            .map(|v| v.as_str().ok_or_else(|| type_error(k, "a string")))
            .transpose()
    }

    fn obj(&self, k: &str) -> Result<Option<&'a Map<String, Value>>, ApiError> {
        self.get(k)
            .map(|v| v.as_object().ok_or_else(|| type_error(k, "an object")))
            .transpose()
    }

    /// A numeric field within `ok`, described by `range` in the error.
    fn ranged(&self, k: &str, ok: impl Fn(f64) -> bool, range: &str) -> Result<(), ApiError> {
        match self.num(k)? {
            Some(x) if !ok(x) => Err(ApiError::bad(k, format!("`{k}` must be {range}, got {x}"))),
            _ => Ok(()),
        }
    }
}

/// Parses the body text as a JSON object.
pub fn body_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "the request body must be a JSON object",
        )),
        Err(e) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {e}"),
        )),
    }
}

const NO_PROBS: &str = "the twin device samples placeholder text and has no token probabilities";
const NO_GUIDE: &str = "the twin device cannot constrain its placeholder text (no guided decoding)";

/// Checks shared by both endpoints; returns the common part of the job.
fn common(f: &Fields, lim: &Limits, chat: bool) -> Result<Job, ApiError> {
    match f.str("model")? {
        Some(m) if m != lim.model => {
            return Err(ApiError {
                status: StatusCode::NOT_FOUND,
                message: format!(
                    "The model `{m}` does not exist; this server serves `{}`.",
                    lim.model
                ),
                param: Some("model".into()),
            })
        }
        _ => {}
    }
    let stream = f.bool("stream")?.unwrap_or(false);
    let (mut include_usage, mut continuous_usage) = (false, false);
    if let Some(o) = f.obj("stream_options")? {
        if !stream {
            return Err(ApiError::bad(
                "stream_options",
                "Stream options can only be defined when `stream=True`.",
            ));
        }
        let so = Fields(o);
        for k in o.keys() {
            if k != "include_usage" && k != "continuous_usage_stats" {
                return Err(ApiError::bad(
                    "stream_options",
                    format!("unknown stream option `{k}`"),
                ));
            }
        }
        include_usage = so
            .bool("include_usage")
            .map_err(|_| type_error("stream_options", "an object of booleans"))?
            .unwrap_or(false);
        continuous_usage = so
            .bool("continuous_usage_stats")
            .map_err(|_| type_error("stream_options", "an object of booleans"))?
            .unwrap_or(false);
    }
    let n = f.int("n")?.unwrap_or(1);
    if !(1..=MAX_N).contains(&n) {
        return Err(ApiError::bad(
            "n",
            format!("n must be between 1 and {MAX_N}, got {n}"),
        ));
    }
    // Sampling knobs: honoured by a real device, meaningless to the twin's text, always checked.
    f.ranged("temperature", |x| x >= 0.0, "at least 0")?;
    f.ranged("top_p", |x| x > 0.0 && x <= 1.0, "in (0, 1]")?;
    f.ranged("min_p", |x| (0.0..=1.0).contains(&x), "in [0, 1]")?;
    f.ranged(
        "presence_penalty",
        |x| (-2.0..=2.0).contains(&x),
        "in [-2, 2]",
    )?;
    f.ranged(
        "frequency_penalty",
        |x| (-2.0..=2.0).contains(&x),
        "in [-2, 2]",
    )?;
    f.ranged("repetition_penalty", |x| x > 0.0, "greater than 0")?;
    if let Some(k) = f.int("top_k")? {
        if k < -1 {
            return Err(ApiError::bad(
                "top_k",
                format!("`top_k` must be -1 (off) or at least 0, got {k}"),
            ));
        }
    }
    if let Some(m) = f.int("min_tokens")? {
        if m < 0 {
            return Err(ApiError::bad(
                "min_tokens",
                format!("`min_tokens` must be at least 0, got {m}"),
            ));
        }
    }
    for k in [
        "ignore_eos",
        "skip_special_tokens",
        "include_stop_str_in_output",
    ] {
        f.bool(k)?;
    }
    f.str("user")?;
    let seed = f.int("seed")?.map(|s| s as u64);
    let num = |k: &str, default: f64| f.num(k).map(|v| v.unwrap_or(default));
    let sampling = SamplingParams {
        temperature: num("temperature", 1.0)?,
        top_p: num("top_p", 1.0)?,
        top_k: f.int("top_k")?.map_or(0, |k| k.max(0) as u32),
        min_p: num("min_p", 0.0)?,
        seed,
        ignore_eos: f.bool("ignore_eos")?.unwrap_or(false),
        min_tokens: f
            .int("min_tokens")?
            .map_or(0, |m| m.clamp(0, u32::MAX as i64) as u32),
        presence_penalty: num("presence_penalty", 0.0)?,
        frequency_penalty: num("frequency_penalty", 0.0)?,
        repetition_penalty: num("repetition_penalty", 1.0)?,
    };
    let stop = match f.get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(v)) => v
            .iter()
            .map(|s| s.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| type_error("stop", "a string or a list of strings"))?,
        Some(_) => return Err(type_error("stop", "a string or a list of strings")),
    }
    .into_iter()
    .filter(|s: &String| !s.is_empty())
    .collect::<Vec<String>>();
    if stop.len() > MAX_STOPS {
        return Err(ApiError::bad(
            "stop",
            format!(
                "at most {MAX_STOPS} stop strings, got {}: each is searched for in every token's text",
                stop.len()
            ),
        ));
    }
    if let Some(long) = stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::bad(
            "stop",
            format!(
                "a stop string of {} bytes; at most {MAX_STOP_BYTES}",
                long.len()
            ),
        ));
    }
    // What the twin cannot do is refused, never ignored, on both endpoints.
    if f.bool("echo")? == Some(true) {
        return Err(ApiError::bad(
            "echo",
            "`echo` is not supported: the twin device returns placeholder text, not the prompt",
        ));
    }
    if f.str("suffix")?.is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::bad(
            "suffix",
            "`suffix` is not supported (as in vLLM)",
        ));
    }
    if f.int("top_logprobs")?.is_some_and(|k| k != 0) {
        return Err(ApiError::bad(
            "top_logprobs",
            format!("`top_logprobs` is not supported: {NO_PROBS}"),
        ));
    }
    if f.get("prompt_logprobs").is_some() {
        return Err(ApiError::bad(
            "prompt_logprobs",
            format!("`prompt_logprobs` is not supported: {NO_PROBS}"),
        ));
    }
    match f.get("logit_bias") {
        None => {}
        Some(Value::Object(m)) if m.is_empty() => {}
        Some(Value::Object(_)) => {
            return Err(ApiError::bad(
                "logit_bias",
                format!("`logit_bias` is not supported: {NO_PROBS}"),
            ))
        }
        Some(_) => return Err(type_error("logit_bias", "an object of token ids to biases")),
    }
    if let Some(rf) = f.get("response_format") {
        let ty = rf.get("type").and_then(Value::as_str);
        match ty {
            Some("text") => {}
            Some(t @ ("json_object" | "json_schema" | "structural_tag")) => {
                return Err(ApiError::bad(
                    "response_format",
                    format!("`response_format` of type `{t}` is not supported: {NO_GUIDE}"),
                ))
            }
            _ => {
                return Err(type_error(
                    "response_format",
                    "an object with `type` text, json_object or json_schema",
                ))
            }
        }
    }
    for k in [
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "structured_outputs",
    ] {
        if f.get(k).is_some() {
            return Err(ApiError::bad(
                k,
                format!("`{k}` is not supported: {NO_GUIDE}"),
            ));
        }
    }
    // Chat: OpenAI's newer `max_completion_tokens` wins; no limit means what fits.
    let (param, max_tokens) = match (chat, f.int("max_completion_tokens")?) {
        (true, Some(m)) => ("max_completion_tokens", Some(m)),
        (true, None) => ("max_tokens", f.int("max_tokens")?),
        (false, _) => ("max_tokens", Some(f.int("max_tokens")?.unwrap_or(16))),
    };
    let max_tokens = match max_tokens {
        Some(m) if m < 1 => {
            return Err(ApiError::bad(
                param,
                format!("{param} must be at least 1, got {m}"),
            ))
        }
        Some(m) => Some(m.min(u32::MAX as i64) as u32),
        None => None,
    };
    if let Some(m) = max_tokens.filter(|&m| sampling.min_tokens > m) {
        return Err(ApiError::bad(
            "min_tokens",
            format!(
                "`min_tokens` ({}) must be at most {param} ({m}), as vLLM requires",
                sampling.min_tokens
            ),
        ));
    }
    Ok(Job {
        chat,
        prompt_tokens: 0,
        token_ids: Vec::new(),
        max_tokens,
        n: n as u32,
        stream,
        include_usage,
        continuous_usage,
        stop,
        seed,
        sampling,
        tools: None,
        thinking: false,
    })
}

/// A `/v1/completions` body.
pub fn completion(body: &Map<String, Value>, lim: &Limits) -> Result<Job, ApiError> {
    let f = Fields(body);
    let mut job = common(&f, lim, false)?;
    match f.get("logprobs") {
        None | Some(Value::Bool(false)) => {}
        Some(_) => {
            return Err(ApiError::bad(
                "logprobs",
                format!("`logprobs` is not supported: {NO_PROBS}"),
            ))
        }
    }
    if let Some(b) = f.int("best_of")? {
        if b != job.n as i64 {
            return Err(ApiError::bad(
                "best_of",
                format!("`best_of` must equal n ({}): choosing the best of several needs token probabilities, and {NO_PROBS}", job.n),
            ));
        }
    }
    let bad_prompt = || {
        ApiError::bad(
            "prompt",
            "prompt must be one non-empty string or one non-empty list of token ids",
        )
    };
    let ids = |v: &Vec<Value>| -> Result<Vec<u32>, ApiError> {
        if v.is_empty() {
            return Err(bad_prompt());
        }
        let mut out = Vec::with_capacity(v.len());
        for x in v {
            let id = x.as_u64().ok_or_else(bad_prompt)?;
            out.push(id as u32);
            if id >= lim.vocab_size {
                return Err(ApiError::bad(
                    "prompt",
                    format!(
                        "Token id {id} is out of vocabulary (the vocabulary has {} tokens)",
                        lim.vocab_size
                    ),
                ));
            }
        }
        Ok(out)
    };
    let text = |s: &str| -> Result<Vec<u32>, ApiError> {
        if s.trim().is_empty() {
            return Err(ApiError::bad(
                "prompt",
                "The prompt cannot be empty or only whitespace",
            ));
        }
        Ok(lim.counter.encode_text(s))
    };
    job.token_ids = match f.get("prompt") {
        Some(Value::String(s)) => text(s)?,
        Some(Value::Array(v)) if v.len() == 1 && v[0].is_string() => {
            text(v[0].as_str().expect("a string"))?
        }
        Some(Value::Array(v)) if v.len() == 1 && v[0].is_array() => {
            ids(v[0].as_array().expect("an array"))?
        }
        Some(Value::Array(v)) if v.first().is_some_and(Value::is_number) => ids(v)?,
        Some(Value::Array(v)) if v.len() > 1 => {
            return Err(ApiError::bad(
                "prompt",
                "one prompt per request: a list of several prompts is not supported",
            ))
        }
        _ => return Err(bad_prompt()),
    };
    job.prompt_tokens = job.token_ids.len() as u32;
    Ok(job)
}

/// Roles a chat message may have.
const ROLES: &[&str] = &[
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "function",
];

fn content_text(i: usize, v: Option<&Value>) -> Result<String, ApiError> {
    let param = "messages";
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = Vec::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => out.push(t),
                    (Some(t), _) if t != "text" => {
                        return Err(ApiError::bad(
                            param,
                            format!("messages[{i}]: content parts of type `{t}` are not supported (the served model takes text only)"),
                        ))
                    }
                    _ => {
                        return Err(ApiError::bad(
                            param,
                            format!("messages[{i}]: a content part must be {{\"type\": \"text\", \"text\": ...}}"),
                        ))
                    }
                }
            }
            Ok(out.join("\n"))
        }
        Some(_) => Err(ApiError::bad(
            param,
            format!("messages[{i}].content must be a string or a list of text parts"),
        )),
    }
}

/// A `/v1/chat/completions` body.
pub fn chat(body: &Map<String, Value>, lim: &Limits) -> Result<Job, ApiError> {
    let f = Fields(body);
    let mut job = common(&f, lim, true)?;
    match f.get("logprobs") {
        None | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) => {
            return Err(ApiError::bad(
                "logprobs",
                format!("`logprobs` is not supported: {NO_PROBS}"),
            ))
        }
        Some(_) => return Err(type_error("logprobs", "a boolean")),
    }
    if let Some(k) = f.obj("chat_template_kwargs")? {
        let k = Fields(k);
        let bad = |_| {
            type_error(
                "chat_template_kwargs",
                "an object whose `thinking` is a boolean",
            )
        };
        job.thinking = k.bool("thinking").map_err(bad)?.unwrap_or(false)
            || k.bool("enable_thinking").map_err(bad)?.unwrap_or(false);
    }
    // Tools.
    let tools = match f.get("tools") {
        None => &[][..],
        Some(Value::Array(v)) => v.as_slice(),
        Some(_) => return Err(type_error("tools", "a list of tools")),
    };
    for (i, t) in tools.iter().enumerate() {
        let ok = t.get("type").and_then(Value::as_str) == Some("function")
            && t.get("function")
                .and_then(|fun| fun.get("name"))
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
        if !ok {
            return Err(ApiError::bad(
                "tools",
                format!("tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., \"parameters\": ...}}}}"),
            ));
        }
    }
    let choice = match f.get("tool_choice") {
        None if tools.is_empty() => "none",
        None => "auto",
        Some(Value::String(s)) if ["none", "auto", "required"].contains(&s.as_str()) => s.as_str(),
        Some(Value::Object(_)) => "named",
        Some(_) => {
            return Err(type_error(
                "tool_choice",
                "\"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
            ))
        }
    };
    if choice != "none" && tools.is_empty() {
        return Err(ApiError::bad(
            "tool_choice",
            "When using `tool_choice`, `tools` must be set.",
        ));
    }
    match choice {
        "auto" if !lim.auto_tools => {
            return Err(ApiError::bad(
                "tool_choice",
                "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set",
            ))
        }
        "required" | "named" => {
            return Err(ApiError::bad(
                "tool_choice",
                format!("`tool_choice` \"required\" or a named function is not supported: {NO_GUIDE}"),
            ))
        }
        _ => {}
    }
    job.tools = (choice == "auto").then(|| Value::Array(tools.to_vec()));
    // Messages.
    let msgs = match f.get("messages") {
        Some(Value::Array(v)) if !v.is_empty() => v,
        Some(Value::Array(_)) => {
            return Err(ApiError::bad("messages", "messages must not be empty"))
        }
        _ => {
            return Err(ApiError::bad(
                "messages",
                "`messages` must be a non-empty list of messages",
            ))
        }
    };
    let mut chat = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let Some(m) = m.as_object() else {
            return Err(ApiError::bad(
                "messages",
                format!("messages[{i}] must be an object"),
            ));
        };
        let role = match m.get("role").and_then(Value::as_str) {
            Some(r) if ROLES.contains(&r) => r,
            Some(r) => {
                return Err(ApiError::bad(
                    "messages",
                    format!(
                        "messages[{i}]: unknown role `{r}` (expected one of {})",
                        ROLES.join(", ")
                    ),
                ))
            }
            None => {
                return Err(ApiError::bad(
                    "messages",
                    format!("messages[{i}] lacks a `role` string"),
                ))
            }
        };
        let content = content_text(i, m.get("content"))?;
        let mut calls = Vec::new();
        if let Some(tc) = m.get("tool_calls").filter(|v| !v.is_null()) {
            let list = tc
                .as_array()
                .filter(|_| role == "assistant")
                .ok_or_else(|| {
                    ApiError::bad(
                        "messages",
                        format!("messages[{i}].tool_calls must be a list on an assistant message"),
                    )
                })?;
            for c in list {
                let fun = c.get("function");
                let name = fun.and_then(|x| x.get("name")).and_then(Value::as_str);
                let args = fun.and_then(|x| x.get("arguments")).and_then(Value::as_str);
                match (name, args) {
                    (Some(n), Some(a)) => calls.push((n.to_string(), a.to_string())),
                    _ => {
                        return Err(ApiError::bad(
                            "messages",
                            format!("messages[{i}].tool_calls entries need function.name and function.arguments strings"),
                        ))
                    }
                }
            }
        }
        chat.push(ChatMessage {
            role: role.to_string(),
            content,
            tool_calls: calls,
        });
    }
    let tools_json = (!tools.is_empty()).then(|| Value::Array(tools.to_vec()).to_string());
    job.token_ids = lim
        .counter
        .encode_chat(&render_chat(&chat, tools_json.as_deref()));
    job.prompt_tokens = job.token_ids.len() as u32;
    Ok(job)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lim(counter: &Counter, auto_tools: bool) -> Limits<'_> {
        Limits {
            model: "m",
            vocab_size: 1000,
            counter,
            auto_tools,
        }
    }

    fn param(r: Result<Job, ApiError>) -> String {
        r.expect_err("refused").param.unwrap_or_default()
    }

    fn comp(v: Value) -> Result<Job, ApiError> {
        completion(v.as_object().unwrap(), &lim(&Counter::Estimate, false))
    }

    fn chat_with(v: Value, auto_tools: bool) -> Result<Job, ApiError> {
        chat(v.as_object().unwrap(), &lim(&Counter::Estimate, auto_tools))
    }

    #[test]
    fn unsupported_parameters_are_refused_by_name() {
        for (k, v) in [
            ("logprobs", json!(1)),
            ("echo", json!(true)),
            ("suffix", json!("end")),
            ("best_of", json!(3)),
            ("logit_bias", json!({"5": 10})),
            ("response_format", json!({"type": "json_object"})),
            ("prompt_logprobs", json!(1)),
            ("guided_json", json!({})),
            ("temperature", json!("hot")),
            ("temperature", json!(-0.5)),
            ("top_p", json!(0)),
            ("top_p", json!(1.5)),
            ("stop", json!(3)),
        ] {
            let mut b = json!({"model": "m", "prompt": "hi"});
            b[k] = v.clone();
            assert_eq!(param(comp(b)), k, "{k}={v}");
        }
        // Harmless values pass.
        let ok = comp(
            json!({"model": "m", "prompt": "hi", "logprobs": null, "echo": false,
            "best_of": 1, "logit_bias": {}, "response_format": {"type": "text"},
            "temperature": 0, "top_p": 1}),
        );
        assert!(ok.is_ok(), "{ok:?}");
        for (k, v) in [
            ("logprobs", json!(true)),
            ("top_logprobs", json!(2)),
            ("echo", json!(true)),
            ("suffix", json!("end")),
        ] {
            let mut b = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
            b[k] = v;
            assert_eq!(param(chat_with(b, false)), k);
        }
        // Completions check `top_logprobs` too, by type and by value.
        for v in [json!(2), json!("two")] {
            let b = json!({"model": "m", "prompt": "hi", "top_logprobs": v});
            assert_eq!(param(comp(b)), "top_logprobs");
        }
    }

    #[test]
    fn min_tokens_and_stop_lists_are_bounded() {
        let b = json!({"model": "m", "prompt": "hi", "max_tokens": 4, "min_tokens": 5});
        let e = comp(b).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("min_tokens"));
        assert!(
            e.message.contains("at most max_tokens (4)"),
            "{}",
            e.message
        );
        assert!(
            comp(json!({"model": "m", "prompt": "hi", "max_tokens": 5, "min_tokens": 5})).is_ok()
        );
        let many: Vec<String> = (0..=MAX_STOPS).map(|i| format!("s{i}")).collect();
        assert_eq!(
            param(comp(json!({"model": "m", "prompt": "hi", "stop": many}))),
            "stop"
        );
        let long = "x".repeat(MAX_STOP_BYTES + 1);
        assert_eq!(
            param(comp(json!({"model": "m", "prompt": "hi", "stop": long}))),
            "stop"
        );
        let most: Vec<String> = (0..MAX_STOPS).map(|i| format!("s{i}")).collect();
        assert!(comp(json!({"model": "m", "prompt": "hi", "stop": most})).is_ok());
    }

    #[test]
    fn prompts_vllm_refuses() {
        assert_eq!(
            param(comp(json!({"model": "m", "prompt": "  \n"}))),
            "prompt"
        );
        assert_eq!(param(comp(json!({"model": "m", "prompt": ""}))), "prompt");
        let e = comp(json!({"model": "m", "prompt": [1, 2, 1000]})).unwrap_err();
        assert!(e.message.contains("1000"), "{}", e.message);
        assert_eq!(
            comp(json!({"model": "m", "prompt": [1, 999]}))
                .unwrap()
                .prompt_tokens,
            2
        );
        assert_eq!(param(comp(json!({"model": "m", "prompt": [-1]}))), "prompt");
        // As vLLM, `model` may be left out; a wrong one is a 404.
        assert!(comp(json!({"prompt": "hi"})).is_ok());
        let e = comp(json!({"model": "gpt-4", "prompt": "hi"})).unwrap_err();
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        let e = chat_with(
            json!({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}),
            false,
        );
        assert!(param(e.clone()) == "messages" && e.unwrap_err().message.contains("wizard"));
        assert_eq!(
            param(comp(
                json!({"model": "m", "prompt": "x", "stream_options": {"include_usage": true}})
            )),
            "stream_options"
        );
    }

    #[test]
    fn tools_need_a_parser_and_auto_choice() {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]});
        let e = chat_with(body.clone(), false).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        assert!(e.message.contains("--tool-call-parser"));
        let job = chat_with(body.clone(), true).unwrap();
        assert!(job.tools.is_some());
        let mut none = body.clone();
        none["tool_choice"] = json!("none");
        assert!(chat_with(none, false).unwrap().tools.is_none());
        let mut req = body.clone();
        req["tool_choice"] = json!("required");
        assert_eq!(param(chat_with(req, true)), "tool_choice");
        let mut bad = body;
        bad["tools"] = json!([{"type": "function"}]);
        assert_eq!(param(chat_with(bad, true)), "tools");
    }

    #[test]
    fn sampling_knobs_reach_the_device() {
        let j = comp(
            json!({"model": "m", "prompt": "x", "temperature": 0.5, "top_p": 0.9,
            "top_k": 40, "min_p": 0.05, "seed": 7, "ignore_eos": true, "min_tokens": 3,
            "presence_penalty": 0.5, "frequency_penalty": -0.25, "repetition_penalty": 1.1}),
        )
        .unwrap();
        let want = SamplingParams {
            temperature: 0.5,
            top_p: 0.9,
            top_k: 40,
            min_p: 0.05,
            seed: Some(7),
            ignore_eos: true,
            min_tokens: 3,
            presence_penalty: 0.5,
            frequency_penalty: -0.25,
            repetition_penalty: 1.1,
        };
        assert_eq!(j.sampling, want);
        // Absent knobs take the OpenAI defaults; top_k -1 is off.
        let d = comp(json!({"model": "m", "prompt": "x", "top_k": -1})).unwrap();
        assert_eq!(d.sampling, SamplingParams::default());
    }

    #[test]
    fn chat_counts_the_template() {
        let j = chat_with(
            json!({"model": "m", "messages": [{"role": "user", "content": "abcd"}],
            "stream": true, "stream_options": {"continuous_usage_stats": true}}),
            false,
        )
        .unwrap();
        // BOS, <｜User｜>, one token, <｜Assistant｜>.
        assert_eq!(j.prompt_tokens, 4);
        assert!(j.continuous_usage && !j.include_usage);
        assert_eq!(j.max_tokens, None);
    }
}
