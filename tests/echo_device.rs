//! A device that is not the twin plugs into `serve` through the `Device` seam: a tiny
//! deterministic "echo" engine that executes requests (per-request plans, block tables, token
//! ids) and returns real token ids and EOS, driving the deployment core, the wall-clock runtime
//! and the HTTP API end to end.
//!
//! The echo model: after a prompt of n tokens, output token k is prompt token k (it reads the
//! prompt back), then EOS once the prompt is exhausted. MTP drafts are the next prompt tokens
//! and are always right, so every draft is accepted. The device checks what a real engine
//! relies on: it sees a request's token ids before computing it, the chunk it is asked to
//! compute continues where the KV ends, the block table holds every token computed, and freed
//! requests are not scheduled again without their ids.

use axum::body::Body;
use axum::http::Request;
use dstwin_core::batch::AttnCap;
use dstwin_core::deploy::{DeploymentConfig, InstanceSpec};
use dstwin_core::device::{
    Capacity, Device, DeviceError, FinishReason, InstantFabric, ReqId, Sampled, StepOutcome,
    StepPlan,
};
use dstwin_core::instance::InstanceConfig;
use dstwin_core::layout::Role;
use dstwin_core::pd::Policy;
use dstwin_core::time::SimDuration;
use dstwin_runtime::api::{router, ApiConfig};
use dstwin_runtime::{Out, Runtime, RuntimeConfig, ServeInstance, Submit};
use http_body_util::BodyExt;
use std::collections::HashMap;
use tower::ServiceExt;

const EOS: u32 = 1;
const BLOCK: u32 = 16;

/// What the echo engine keeps of a request: its tokens (prompt, then what it produced) and how
/// many of them have KV.
struct Seq {
    tokens: Vec<u32>,
    prompt: usize,
    computed: u32,
}

#[derive(Default)]
struct Echo {
    seqs: HashMap<ReqId, Seq>,
}

impl Echo {
    fn next_token(s: &Seq) -> u32 {
        let k = s.tokens.len() - s.prompt;
        s.tokens
            .get(k)
            .copied()
            .filter(|_| k < s.prompt)
            .unwrap_or(EOS)
    }
}

impl Device for Echo {
    fn capacity(&self) -> Capacity {
        Capacity {
            dp_ranks: 1,
            kv_blocks_per_rank: 256,
            block_size: BLOCK,
            kv_bytes_per_token: 1.0,
            memory: None,
        }
    }

    fn wants_requests(&self) -> bool {
        true
    }

    fn execute(&mut self, plan: &StepPlan, out: &mut StepOutcome) -> Result<(), DeviceError> {
        let fail = |m: String| Err(DeviceError::Failed(m));
        out.duration = SimDuration::from_micros_f64(50.0);
        out.accepted.clear();
        out.sampled.clear();
        for rank in &plan.ranks {
            for id in &rank.freed {
                self.seqs.remove(id);
            }
            let mut accepted = Vec::new();
            let mut sampled = Vec::new();
            for r in &rank.reqs {
                if let Some(ids) = &r.token_ids {
                    let prompt = self.seqs.get(&r.req).map_or(ids.len(), |s| s.prompt);
                    self.seqs.insert(
                        r.req,
                        Seq {
                            tokens: ids.to_vec(),
                            prompt,
                            computed: r.computed,
                        },
                    );
                }
                let Some(s) = self.seqs.get_mut(&r.req) else {
                    return fail(format!("request {} scheduled without its token ids", r.req));
                };
                if r.computed > s.computed {
                    return fail(format!(
                        "request {}: asked to compute from {} but its KV ends at {}",
                        r.req, r.computed, s.computed
                    ));
                }
                let end = r.computed + r.new_tokens;
                if (r.blocks.len() as u32) * BLOCK < end {
                    return fail(format!(
                        "request {}: {} blocks cannot hold {end} tokens",
                        r.req,
                        r.blocks.len()
                    ));
                }
                s.computed = end - r.drafts;
                if !r.samples {
                    continue;
                }
                // The drafts are the next prompt tokens, all right: keep them and the token
                // after them, stopping at EOS.
                let mut kept = Vec::new();
                for _ in 0..=r.drafts {
                    let t = Echo::next_token(s);
                    s.tokens.push(t);
                    kept.push(t);
                    if t == EOS {
                        break;
                    }
                }
                s.computed = end;
                accepted.push(kept.len() as u32 - 1);
                sampled.push(Sampled {
                    finish: (kept.last() == Some(&EOS)).then_some(FinishReason::Stop),
                    token_ids: kept,
                });
            }
            out.accepted.push(accepted);
            out.sampled.push(sampled);
        }
        Ok(())
    }
}

fn start(spec_tokens: u32, prefix_caching: bool) -> Runtime {
    start_on(Echo::default(), spec_tokens, prefix_caching)
}

fn start_on<D: Device + Send + 'static>(
    device: D,
    spec_tokens: u32,
    prefix_caching: bool,
) -> Runtime {
    let config = InstanceConfig {
        role: Role::Mixed,
        dp_ranks: 1,
        max_num_batched_tokens: 32,
        max_num_seqs: 4,
        block_size: BLOCK,
        num_kv_blocks: 256,
        enable_chunked_prefill: true,
        enable_prefix_caching: prefix_caching,
        long_prefill_token_threshold: 0,
        prefill_delay_passes: 0,
        balance_scheduling: false,
        separate_prefill_batches: false,
        dp_dispatch: Default::default(),
        admission: Default::default(),
        max_model_len: 2048,
        num_spec_tokens: spec_tokens,
        attn_cap: AttnCap(None),
        send_back: false,
        async_scheduling: false,
    };
    Runtime::start(
        RuntimeConfig {
            model: "echo".into(),
            time_scale: 1.0,
            max_pending: 100,
            deployment: DeploymentConfig {
                prefill_policy: Policy::LoadBalance,
                decode_policy: Policy::LoadBalance,
                kv_bytes_per_token: 1.0,
            },
            record_steps: true,
        },
        vec![ServeInstance {
            spec: InstanceSpec {
                name: "echo".into(),
                config,
                acceptance: device.acceptance(),
                detail: device.wants_requests(),
                emissions: true,
                eplb: None,
            },
            device: Box::new(device),
        }],
        Box::new(InstantFabric::default()),
    )
}

/// Every token id a request streamed, and how it ended.
async fn collect(rt: &Runtime, prompt: &[u32], max_tokens: u32) -> (Vec<u32>, FinishReason) {
    let mut s = rt
        .submit(Submit {
            prompt_tokens: prompt.len() as u32,
            max_tokens,
            token_ids: Some(prompt.to_vec()),
            sampling: None,
            parent: None,
        })
        .expect("admitted");
    let mut ids = Vec::new();
    while let Some(o) = s.next().await {
        match o {
            Out::Tokens { n, ids: got } => {
                assert_eq!(got.len(), n as usize, "every token comes with its id");
                ids.extend(got);
            }
            Out::Finished(r) => return (ids, r),
        }
    }
    panic!("the stream ended without finishing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echo_engine_streams_real_ids_and_stops_on_eos() {
    for (spec_tokens, prefix_caching) in [(0, false), (2, true)] {
        let rt = start(spec_tokens, prefix_caching);
        // A prompt longer than a step's budget (32 tokens): chunked prefill, then decode.
        let prompt: Vec<u32> = (100..170).collect();
        let (ids, why) = collect(&rt, &prompt, 500).await;
        let mut expected = prompt.clone();
        expected.push(EOS);
        assert_eq!(ids, expected, "MTP {spec_tokens}: echo, then EOS");
        assert_eq!(why, FinishReason::Stop, "EOS ends the request");
        // max_tokens first: the request ends by length.
        let (ids, why) = collect(&rt, &prompt, 10).await;
        assert_eq!(ids, prompt[..10].to_vec());
        assert_eq!(why, FinishReason::Length);
        // Several at once share steps and stay apart.
        let a: Vec<u32> = (200..240).collect();
        let b: Vec<u32> = (300..333).collect();
        let ((ia, _), (ib, _)) = tokio::join!(collect(&rt, &a, 100), collect(&rt, &b, 100));
        assert_eq!(&ia[..a.len()], &a[..]);
        assert_eq!(&ib[..b.len()], &b[..]);
        if spec_tokens > 0 {
            // Drafts were verified: some steps sampled more than one token per request.
            assert!(rt
                .steps()
                .iter()
                .flat_map(|s| &s.plan.ranks)
                .flat_map(|r| &r.reqs)
                .any(|r| r.samples && r.drafts > 0));
        }
        if prefix_caching {
            // The same prompt again: its full blocks come from the prefix cache, so its first
            // step starts past them.
            let (ids, _) = collect(&rt, &prompt, 500).await;
            assert_eq!(&ids[..prompt.len()], &prompt[..]);
            let hit = rt
                .steps()
                .iter()
                .flat_map(|s| &s.plan.ranks)
                .flat_map(|r| &r.reqs)
                .any(|r| r.token_ids.is_some() && r.computed >= 64);
            assert!(hit, "a prefix hit skips the cached blocks");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_api_serves_the_echo_engine() {
    let rt = start(1, true);
    let app = router(rt, ApiConfig::default());
    let body = serde_json::json!({
        "model": "echo",
        "prompt": [11, 12, 13, 14, 15],
        "max_tokens": 50,
    });
    let resp = app
        .oneshot(
            Request::post("/v1/completions")
                .header("content-type", "application/json")
                .body(Body::from(body.to_string()))
                .expect("a request"),
        )
        .await
        .expect("infallible");
    assert_eq!(resp.status(), 200);
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON");
    // Five echoed tokens and EOS: the model stopped, well before max_tokens.
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 6, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], 5, "{v}");
}

/// The echo engine until its `after`-th step, which fails: by an error, or by a panic.
struct Broken {
    echo: Echo,
    after: u32,
    panic: bool,
}

impl Device for Broken {
    fn capacity(&self) -> Capacity {
        self.echo.capacity()
    }

    fn wants_requests(&self) -> bool {
        true
    }

    fn execute(&mut self, plan: &StepPlan, out: &mut StepOutcome) -> Result<(), DeviceError> {
        if self.after == 0 {
            if self.panic {
                panic!("the accelerator fell off the bus");
            }
            return Err(DeviceError::Failed(
                "the accelerator fell off the bus".into(),
            ));
        }
        self.after -= 1;
        self.echo.execute(plan, out)
    }
}

async fn send(
    app: &axum::Router,
    method: &str,
    uri: &str,
    body: Option<serde_json::Value>,
) -> (u16, String) {
    let mut req = Request::builder().method(method).uri(uri);
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
    let resp = app
        .clone()
        .oneshot(req.body(body).expect("a request"))
        .await
        .expect("infallible");
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_fails_fails_its_requests_and_the_health_check() {
    for panic in [false, true] {
        let device = Broken {
            echo: Echo::default(),
            after: 2,
            panic,
        };
        let rt = start_on(device, 0, false);
        let app = router(rt.clone(), ApiConfig::default());
        let req = |stream: bool| {
            serde_json::json!({"model": "echo", "prompt": [11, 12, 13, 14, 15, 16, 17],
                               "max_tokens": 50, "stream": stream})
        };
        // In flight when the device fails: 500 naming why, whole or streamed.
        let (status, body) = send(&app, "POST", "/v1/completions", Some(req(false))).await;
        assert_eq!(status, 500, "panic {panic}: {body}");
        assert!(body.contains("fell off the bus"), "{body}");
        let why = tokio::time::timeout(std::time::Duration::from_secs(10), rt.failed())
            .await
            .expect("the failure is announced");
        assert!(
            why.contains("instance echo") && why.contains("fell off the bus"),
            "{why}"
        );
        if panic {
            assert!(why.contains("panicked"), "{why}");
        }
        // Nothing runs or waits on a failed deployment.
        let (status, body) = send(&app, "GET", "/metrics", None).await;
        assert_eq!(status, 200);
        for gauge in ["vllm:num_requests_running{", "vllm:num_requests_waiting{"] {
            let line = body.lines().find(|l| l.starts_with(gauge)).expect(gauge);
            assert!(line.ends_with(" 0"), "panic {panic}: {line}");
        }
        // The request in flight ended as vLLM's `error`.
        let error = body
            .lines()
            .find(|l| l.starts_with("vllm:request_success_total{") && l.contains("\"error\""))
            .expect("an error series");
        assert!(error.ends_with(" 1"), "panic {panic}: {error}");
        // Afterwards: /health 503 with why, new requests 503, streamed or not.
        let (status, body) = send(&app, "GET", "/health", None).await;
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("fell off the bus"), "{body}");
        for stream in [false, true] {
            let (status, body) = send(&app, "POST", "/v1/completions", Some(req(stream))).await;
            assert_eq!(status, 503, "{body}");
            assert!(body.contains("cannot serve"), "{body}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_in_flight_when_the_device_fails_ends_with_an_error_event() {
    let device = Broken {
        echo: Echo::default(),
        after: 3,
        panic: false,
    };
    let rt = start_on(device, 0, false);
    let app = router(rt, ApiConfig::default());
    let req = serde_json::json!({"model": "echo", "prompt": [11, 12, 13, 14, 15, 16, 17],
                                 "max_tokens": 50, "stream": true});
    let (status, body) = send(&app, "POST", "/v1/completions", Some(req)).await;
    assert_eq!(status, 200, "the stream had started: {body}");
    let last = body.trim_end().rsplit("\n\n").nth(1).unwrap_or("");
    assert!(
        last.contains("\"error\"")
            && last.contains("fell off the bus")
            && body.ends_with("data: [DONE]\n\n"),
        "{body}"
    );
}
