//! Whatever a client sends, the API answers: a response, or an OpenAI-style JSON error; never a
//! panic, a hang or a non-JSON error. Thousands of generated bodies go to both endpoints through
//! the axum router in-process (no sockets): arbitrary JSON values, mutated valid bodies and cut
//! off or corrupted bytes. A failing case prints proptest's seed and the minimal body.

mod common;
use common::data;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use dstwin_runtime::api::{router, ApiConfig};
use dstwin_runtime::parsers::{ReasoningKind, ToolKind};
use dstwin_runtime::prompt::Counter;
use dstwin_sim::scenario::load_path;
use dstwin_sim::serve::{start, TwinServe};
use http_body_util::BodyExt;
use proptest::prelude::*;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::OnceLock;
use tower::ServiceExt;

struct Harness {
    tokio: tokio::runtime::Runtime,
    app: axum::Router,
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        let tokio = tokio::runtime::Runtime::new().expect("tokio");
        let s = load_path(Path::new(&data("tiny-mixed.toml")), &[]).expect("scenario");
        let app = tokio.block_on(async {
            let rt = start(
                &s,
                TwinServe {
                    model: "deepseek-v3".into(),
                    time_scale: 0.0,
                    max_pending: 100_000,
                    record_steps: false,
                },
            )
            .expect("runtime");
            let counter =
                Counter::from_file(Path::new(&data("tokenizer.json"))).expect("tokenizer");
            router(
                rt,
                ApiConfig {
                    vocab_size: counter.vocab_size().unwrap(),
                    counter,
                    tool_parser: Some(ToolKind::DeepseekV31),
                    auto_tool_choice: true,
                    reasoning_parser: Some(ReasoningKind::DeepseekR1),
                    max_body_bytes: 64 << 10,
                    ..ApiConfig::default()
                },
            )
        });
        Harness { tokio, app }
    })
}

/// Sends `body` to `path`; checks the answer is well-formed and returns its status.
fn check(path: &str, body: Vec<u8>) -> Result<u16, TestCaseError> {
    let h = harness();
    let req = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.clone()))
        .expect("a request");
    let (status, bytes) = h.tokio.block_on(async {
        let resp = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            h.app.clone().oneshot(req),
        )
        .await
        .expect("answered in time")
        .expect("infallible");
        let status = resp.status();
        let bytes = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            resp.into_body().collect(),
        )
        .await
        .expect("body in time")
        .expect("body")
        .to_bytes();
        (status, bytes)
    });
    let text = String::from_utf8_lossy(&bytes);
    let shown = String::from_utf8_lossy(&body);
    if status == StatusCode::OK {
        if text.starts_with("data: ") {
            prop_assert!(text.ends_with("data: [DONE]\n\n"), "{shown} -> {text}");
            for frame in text.split("\n\n").filter(|f| !f.is_empty()) {
                let payload = frame.strip_prefix("data: ").expect("an SSE frame");
                if payload != "[DONE]" {
                    let v: Value = serde_json::from_str(payload)
                        .map_err(|e| TestCaseError::fail(format!("{e}: {payload}")))?;
                    prop_assert!(v["choices"].is_array(), "{payload}");
                }
            }
        } else {
            let v: Value = serde_json::from_str(&text)
                .map_err(|e| TestCaseError::fail(format!("{e}: {shown} -> {text}")))?;
            prop_assert!(v["choices"].is_array(), "{shown} -> {text}");
        }
    } else {
        prop_assert!(status.is_client_error(), "{shown} -> {status} {text}");
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| TestCaseError::fail(format!("{e}: {shown} -> {status} {text}")))?;
        prop_assert_eq!(&v["error"]["code"], &json!(status.as_u16()), "{}", text);
        prop_assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    Ok(status.as_u16())
}

/// Field names the endpoints read, so generated objects reach the validation code.
const KEYS: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "stream",
    "stream_options",
    "stop",
    "seed",
    "temperature",
    "top_p",
    "top_k",
    "logprobs",
    "top_logprobs",
    "echo",
    "best_of",
    "suffix",
    "logit_bias",
    "response_format",
    "tools",
    "tool_choice",
    "chat_template_kwargs",
    "role",
    "content",
    "type",
    "function",
    "name",
    "include_usage",
    "continuous_usage_stats",
    "ignore_eos",
    "min_tokens",
    "text",
];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-3i64..40).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |x| x.is_finite())
            .prop_map(Value::from),
        prop_oneof![
            Just("deepseek-v3".to_string()),
            Just("user".to_string()),
            Just("auto".to_string()),
            Just(" ".to_string()),
            "\\PC{0,12}",
        ]
        .prop_map(Value::from),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop_oneof![
                        prop::sample::select(KEYS).prop_map(str::to_string),
                        "\\PC{0,6}"
                    ],
                    inner
                ),
                0..6
            )
            .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Valid bodies of both endpoints (short answers, so thousands of cases stay fast).
fn valid() -> Vec<(&'static str, Value)> {
    let chat = "/v1/chat/completions";
    let comp = "/v1/completions";
    vec![
        (
            comp,
            json!({"model": "deepseek-v3", "prompt": "the twin", "max_tokens": 3}),
        ),
        (
            comp,
            json!({"model": "deepseek-v3", "prompt": [1, 2, 3], "max_tokens": 2, "stream": true,
                      "stream_options": {"include_usage": true}}),
        ),
        (
            chat,
            json!({"model": "deepseek-v3", "max_tokens": 3,
                      "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}),
        ),
        (
            chat,
            json!({"model": "deepseek-v3", "max_tokens": 3, "stream": true, "stop": ["the"],
                      "stream_options": {"continuous_usage_stats": true},
                      "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                      "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
        ),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_json_never_breaks_the_api(v in json_value(), chat in any::<bool>()) {
        let path = if chat { "/v1/chat/completions" } else { "/v1/completions" };
        check(path, v.to_string().into_bytes())?;
    }

    #[test]
    fn mutated_valid_bodies_never_break_the_api(
        which in 0usize..4,
        edits in prop::collection::vec((prop::sample::select(KEYS), prop::option::of(json_value())), 1..4),
    ) {
        let (path, mut body) = valid().swap_remove(which);
        for (k, v) in edits {
            match v {
                // An absent max_tokens means "what fits" on chat: thousands of tokens a case.
                None if k == "max_tokens" => {}
                None => { body.as_object_mut().unwrap().remove(k); }
                Some(v) => {
                    let v = match (k, &v) {
                        ("max_tokens" | "max_completion_tokens", Value::Number(n))
                            if n.as_i64().is_some_and(|x| x > 8) => json!(8),
                        _ => v,
                    };
                    body[k] = v;
                }
            }
        }
        check(path, body.to_string().into_bytes())?;
    }

    #[test]
    fn corrupted_bytes_never_break_the_api(which in 0usize..4, cut in any::<prop::sample::Index>(),
                                           byte in any::<u8>(), at in any::<prop::sample::Index>()) {
        let (path, body) = valid().swap_remove(which);
        let mut b = body.to_string().into_bytes();
        let i = at.index(b.len());
        b[i] = byte;
        b.truncate(cut.index(b.len() + 1).max(1));
        check(path, b)?;
    }
}

#[test]
fn valid_bodies_succeed_and_oversized_ones_get_a_json_413() {
    for (path, body) in valid() {
        assert_eq!(
            check(path, body.to_string().into_bytes()).unwrap(),
            200,
            "{body}"
        );
    }
    let big = json!({"model": "deepseek-v3", "prompt": "x".repeat(100 << 10)});
    assert_eq!(
        check("/v1/completions", big.to_string().into_bytes()).unwrap(),
        413
    );
}
