//! `dstwin serve`: an OpenAI-compatible server on the shared scheduler, with the twin as the
//! device (an emulated Ascend deployment whose every step takes the time the twin predicts).

use crate::Failure;
use anyhow::{anyhow, Context};
use axum::serve::ListenerExt;
use clap::{Args, ValueEnum};
use dstwin_runtime::api::{self, ApiConfig};
use dstwin_runtime::parsers::{ReasoningKind, ToolKind};
use dstwin_runtime::prompt::Counter;
use dstwin_sim::serve::TwinServe;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DeviceKind {
    /// The twin: every step takes the time the cost model predicts (times --time-scale), the
    /// text is deterministic placeholder words.
    Twin,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  dstwin serve\n      the built-in A3 2P1D deployment in real time on 127.0.0.1:8000\n  dstwin serve sim/scenarios/cm384-pd.toml --time-scale 0.1 --port 8080\n  curl localhost:8000/v1/completions -d '{\"model\":\"deepseek-v3.1\",\"prompt\":\"hi\",\"max_tokens\":8}'\n\nEndpoints: POST /v1/completions, POST /v1/chat/completions (stream or not), GET /v1/models,\nGET /health, GET /metrics (vLLM metric names). The deployment (instances, scheduler knobs,\nMTP, expert load) comes from the scenario; its [workload] is ignored. Ctrl-C or SIGTERM: new\nrequests get 503 while the ones in flight finish, then the process exits."
)]
pub struct ServeArgs {
    /// Scenario file (TOML) describing the deployment; without it, the built-in default.
    scenario: Option<PathBuf>,
    /// Override a scenario field: PATH=VALUE (repeatable), as for `simulate`.
    #[arg(long = "set", value_name = "PATH=VALUE")]
    sets: Vec<String>,
    /// What executes the steps.
    #[arg(long, value_enum, default_value = "twin")]
    device: DeviceKind,
    /// Wall seconds per predicted second: 1 is real time, 0.1 runs ten times faster, 0 does not
    /// wait at all.
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the address is printed on stdout).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Model name clients must ask for (default: the scenario's model).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Requests in flight before new ones are answered 429.
    #[arg(long, default_value_t = 4096)]
    max_pending: usize,
    /// HF tokenizer file (tokenizer.json) for exact prompt token counts (default: about four
    /// characters per token) and the vocabulary token-id prompts are checked against.
    #[arg(long, value_name = "FILE")]
    tokenizer: Option<PathBuf>,
    /// Parse tool calls out of chat output in this DeepSeek format: deepseek_v3, deepseek_v31,
    /// deepseek_v32, deepseek_v4 (as vLLM's --tool-call-parser).
    #[arg(long, value_name = "NAME")]
    tool_call_parser: Option<String>,
    /// Let requests with `tools` use tool_choice "auto" (needs --tool-call-parser, as in vLLM).
    #[arg(long)]
    enable_auto_tool_choice: bool,
    /// Split reasoning out of chat output: deepseek_r1, deepseek_v3 (as vLLM's
    /// --reasoning-parser).
    #[arg(long, value_name = "NAME")]
    reasoning_parser: Option<String>,
    /// Request bodies larger than this get 413.
    #[arg(long, default_value_t = 32 << 20, value_name = "BYTES")]
    max_body_bytes: usize,
}

pub fn run(a: ServeArgs) -> Result<(), Failure> {
    if !(a.time_scale.is_finite() && a.time_scale >= 0.0) {
        return Err(Failure::Input(anyhow!(
            "--time-scale must be a finite number >= 0, got {}",
            a.time_scale
        )));
    }
    if a.max_pending == 0 {
        return Err(Failure::Input(anyhow!("--max-pending must be at least 1")));
    }
    if a.enable_auto_tool_choice && a.tool_call_parser.is_none() {
        return Err(Failure::Input(anyhow!(
            "--enable-auto-tool-choice needs --tool-call-parser"
        )));
    }
    let tool_parser = a
        .tool_call_parser
        .as_deref()
        .map(ToolKind::from_name)
        .transpose()
        .map_err(|e| Failure::Input(e.into()))?;
    let reasoning_parser = a
        .reasoning_parser
        .as_deref()
        .map(ReasoningKind::from_name)
        .transpose()
        .map_err(|e| Failure::Input(e.into()))?;
    let counter = match &a.tokenizer {
        Some(p) => Counter::from_file(p).map_err(|e| Failure::Input(e.into()))?,
        None => Counter::Estimate,
    };
    let s = crate::simulate_cmd::load_scenario(a.scenario.as_deref(), &a.sets)?;
    let api_cfg = ApiConfig {
        vocab_size: counter.vocab_size().unwrap_or(s.model.vocab),
        counter,
        tool_parser,
        auto_tool_choice: a.enable_auto_tool_choice,
        reasoning_parser,
        max_body_bytes: a.max_body_bytes,
    };
    let DeviceKind::Twin = a.device;
    let model = a
        .served_model_name
        .clone()
        .unwrap_or_else(|| s.model.name.clone());
    let tokio = tokio::runtime::Runtime::new()
        .context("starting the async runtime")
        .map_err(Failure::Runtime)?;
    tokio.block_on(async move {
        let rt = dstwin_sim::serve::start(
            &s,
            TwinServe {
                model,
                time_scale: a.time_scale,
                max_pending: a.max_pending,
                record_steps: false,
            },
        )
        .map_err(|e| Failure::Input(e.into()))?;
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port))
            .await
            .with_context(|| format!("binding {}:{}", a.host, a.port))
            .map_err(Failure::Runtime)?;
        let addr = listener
            .local_addr()
            .context("reading the bound address")
            .map_err(Failure::Runtime)?;
        crate::output::outln!("listening on http://{addr}")?;
        crate::output::errln!(
            "serving {} ({}: {} instances, twin device, time scale {})",
            rt.model(),
            s.name,
            rt.instance_names().len(),
            a.time_scale
        );
        let closing = rt.clone();
        // Streams write small frames: without TCP_NODELAY each waits for the peer's delayed ACK.
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        axum::serve(listener, api::router(rt, api_cfg))
            .with_graceful_shutdown(async move {
                shutdown_signal().await;
                crate::output::errln!(
                    "shutting down: new requests get 503, finishing the ones in flight"
                );
                // Keep accepting connections (to answer 503) until the last request is over;
                // then stop listening and let the open connections finish.
                closing.close();
                while closing.pending() > 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            })
            .await
            .context("serving")
            .map_err(Failure::Runtime)
    })
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
