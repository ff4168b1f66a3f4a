//! `dstwin serve`: an OpenAI-compatible server on the shared scheduler, with the twin as the
//! device (an emulated Ascend deployment whose every step takes the time the twin predicts) or
//! the CPU engine (the real model of a checkpoint directory, real text).

use crate::Failure;
use anyhow::{anyhow, Context};
use clap::{Args, ValueEnum};
use dstwin_runtime::access::{Access, AllowedHosts};
use dstwin_runtime::api::{self, ApiConfig};
use dstwin_runtime::listen::{self, ConnLimits};
use dstwin_runtime::parsers::{ReasoningKind, ToolKind};
use dstwin_runtime::prompt::Counter;
use dstwin_sim::serve::TwinServe;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DeviceKind {
    /// The twin: every step takes the time the cost model predicts (times --time-scale), the
    /// text is deterministic placeholder words.
    Twin,
    /// The CPU engine: the DeepSeek-V3 checkpoint in --model runs every step for real; the
    /// text is decoded from the token ids it samples.
    Cpu,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DTypeArg {
    F32,
    Bf16,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum QuantArg {
    /// Dynamic per-token INT8 activations, per-channel INT8 weights (the Ascend deployments').
    W8a8,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  dstwin serve\n      the built-in A3 2P1D deployment in real time on 127.0.0.1:8000\n  dstwin init-weights --preset tiny --seed 1 --out m && dstwin serve --device cpu --model m\n      the real (random-weight) tiny model on the CPU: one mixed instance, one DP rank\n  dstwin serve tests/data/cpu-pd.toml --device cpu --model m\n      the same model served PD: a prefill and a decode instance, KV copied between them\n  dstwin serve tests/data/cpu-ep.toml --device cpu --model m --profile trace.json\n      four DP ranks sharing the experts (EP4, redundant experts, dynamic EPLB), every op traced\n  dstwin serve sim/scenarios/cm384-pd.toml --time-scale 0.1 --port 8080\n  curl localhost:8000/v1/completions -d '{\"model\":\"deepseek-v3.1\",\"prompt\":\"hi\",\"max_tokens\":8}'\n\nEndpoints: POST /v1/completions, POST /v1/chat/completions (stream or not), GET /v1/models,\nGET /health, GET /metrics (vLLM metric names). The deployment (instances, scheduler knobs,\nMTP, expert load) comes from the scenario; its [workload] is ignored. Ctrl-C or SIGTERM: new\nrequests get 503 while the ones in flight finish, then the process exits."
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
    /// The checkpoint directory the CPU engine runs (config.json, model.safetensors or a sharded
    /// index, tokenizer.json), e.g. from `dstwin init-weights`. The scenario's model becomes its
    /// config.json.
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// Compute dtype of the CPU engine.
    #[arg(long, value_enum, default_value = "f32")]
    dtype: DTypeArg,
    /// Quantize the CPU engine's linear layers after loading.
    #[arg(long, value_enum)]
    quantization: Option<QuantArg>,
    /// KV blocks per DP rank of the CPU engine (each holds the scenario's block_size tokens of
    /// latent KV for every layer).
    #[arg(long, default_value_t = 1024)]
    kv_blocks: u64,
    /// Wall seconds per predicted second: 1 is real time, 0.1 runs ten times faster, 0 does not
    /// wait at all (the twin; the CPU engine takes the time it takes).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Address to listen on (0.0.0.0: every interface). A loopback address answers only
    /// requests naming a loopback host unless --allowed-hosts says otherwise.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Key every /v1 request must carry as `Authorization: Bearer KEY` (vLLM's --api-key; also
    /// read from VLLM_API_KEY). /health and /metrics stay open.
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// Host names or addresses requests may name in their Host header, comma-separated, or *
    /// for any (against DNS rebinding). Default: localhost, 127.0.0.1 and ::1 when --host is a
    /// loopback address, else any.
    #[arg(long, value_name = "HOSTS")]
    allowed_hosts: Option<String>,
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
    /// The key chat messages and streamed deltas return the parsed reasoning under: reasoning
    /// (vLLM's since it dropped reasoning_content), reasoning_content (DeepSeek's own API,
    /// and vLLM before the rename) or both.
    #[arg(long, value_name = "KEY", default_value = "reasoning")]
    reasoning_field: api::ReasoningField,
    /// Request bodies larger than this get 413.
    #[arg(long, default_value_t = 32 << 20, value_name = "BYTES")]
    max_body_bytes: usize,
    /// Seconds a connection may take to send a request's headers, the wait for them included:
    /// a new connection's first request and an idle keep-alive connection's next (vLLM closes
    /// idle keep-alive connections after 5 s). The connection is closed after.
    #[arg(long, default_value_t = 5.0, value_name = "SECS")]
    header_timeout: f64,
    /// Seconds a request body may take to arrive whole after its headers; slower ones get 408.
    #[arg(long, default_value_t = 30.0, value_name = "SECS")]
    body_timeout: f64,
    /// Connections open at once; more wait to be accepted until one closes. Keep it below the
    /// process's file-descriptor limit (`ulimit -n`).
    #[arg(long, default_value_t = 1000, value_name = "N")]
    max_connections: usize,
    /// Write a Chrome / Perfetto trace of every op the CPU engine runs to FILE (JSON; one
    /// process per instance, one thread per DP rank, a track of whole steps; ops named as
    /// `dstwin explain` names them). The file is complete after every step.
    #[arg(long, value_name = "FILE")]
    profile: Option<PathBuf>,
    /// Threads each CPU-engine kernel may use (its matrix multiplies; default: every core).
    /// 1 makes a kernel's time follow its work: on a small machine shared with the load
    /// generator, multi-threaded kernels wait on each other and their times jump with size,
    /// which no cost model follows (docs/validation.md, "The CPU engine, end to end").
    #[arg(long, value_name = "N")]
    engine_threads: Option<usize>,
}

/// Most connections `--max-connections` takes.
const MAX_CONNECTIONS: usize = 1_000_000;

/// A timeout flag in seconds: finite, above 0 and at most a day.
fn timeout_arg(flag: &str, secs: f64) -> Result<std::time::Duration, Failure> {
    if !(secs.is_finite() && secs > 0.0 && secs <= 86_400.0) {
        return Err(Failure::Input(anyhow!(
            "{flag} must be a number of seconds above 0 and at most 86400, got {secs}"
        )));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
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
    let header_timeout = timeout_arg("--header-timeout", a.header_timeout)?;
    let body_timeout = timeout_arg("--body-timeout", a.body_timeout)?;
    if !(1..=MAX_CONNECTIONS).contains(&a.max_connections) {
        return Err(Failure::Input(anyhow!(
            "--max-connections must be 1 to {MAX_CONNECTIONS}, got {}",
            a.max_connections
        )));
    }
    let limits = ConnLimits {
        header_timeout,
        max_connections: a.max_connections,
    };
    let hosts = match &a.allowed_hosts {
        Some(list) => AllowedHosts::parse(list).map_err(|e| Failure::Input(anyhow!(e)))?,
        None => AllowedHosts::for_bind(&a.host),
    };
    let api_key = match (&a.api_key, std::env::var("VLLM_API_KEY")) {
        (Some(k), _) => Some(k.clone()),
        (None, Ok(k)) if !k.is_empty() => Some(k),
        _ => None,
    };
    // A key a header can carry: visible ASCII, no spaces (an empty flag would turn the key
    // off silently).
    if let Some(k) = &api_key {
        if k.is_empty() || !k.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(Failure::Input(anyhow!(
                "--api-key (or VLLM_API_KEY): give a non-empty key of visible ASCII characters \
                 without spaces"
            )));
        }
    }
    let access_note = format!(
        "answers to {hosts}; {}",
        if api_key.is_some() {
            "an API key is required on /v1"
        } else {
            "no API key (--api-key)"
        }
    );
    let access = Access { hosts, api_key };
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
    let cpu = matches!(a.device, DeviceKind::Cpu);
    if let Some(n) = a.engine_threads {
        if n == 0 {
            return Err(Failure::Input(anyhow!(
                "--engine-threads must be at least 1, got 0"
            )));
        }
        if !cpu {
            return Err(Failure::Input(anyhow!(
                "--engine-threads sets the CPU engine's kernel threads: add --device cpu --model DIR"
            )));
        }
        // The engine's kernels (candle) read the thread count from the variable rayon reads,
        // at every call; set here, before the runtime starts any thread.
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    }
    if a.profile.is_some() && !cpu {
        return Err(Failure::Input(anyhow!(
            "--profile traces the CPU engine's ops: add --device cpu --model DIR"
        )));
    }
    if cpu != a.model.is_some() {
        return Err(Failure::Input(anyhow!(if cpu {
            "--device cpu needs --model DIR (a checkpoint, e.g. from `dstwin init-weights`)"
        } else {
            "--model is the CPU engine's checkpoint: add --device cpu"
        })));
    }
    let tokenizer = a.tokenizer.clone().or_else(|| {
        a.model
            .as_ref()
            .map(|m| m.join("tokenizer.json"))
            .filter(|p| p.exists())
    });
    let counter = match &tokenizer {
        Some(p) => Counter::from_file(p).map_err(|e| Failure::Input(e.into()))?,
        None => Counter::Estimate,
    };
    let s = match &a.model {
        Some(dir) => {
            let mut sets = a.sets.clone();
            // Absolute: a scenario file resolves relative paths against its own directory.
            let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.clone());
            sets.push(format!("model={}", dir.join("config.json").display()));
            match &a.scenario {
                Some(p) => crate::simulate_cmd::load_scenario(Some(p), &sets)?,
                None => dstwin_sim::scenario::load_str(
                    "default CPU scenario (cpu-mixed)",
                    CPU_SCENARIO,
                    std::path::Path::new("."),
                    &sets,
                )
                .map_err(|e| Failure::Input(e.into()))?,
            }
        }
        None => crate::simulate_cmd::load_scenario(a.scenario.as_deref(), &a.sets)?,
    };
    // The CPU engine's text is its token ids decoded: without a tokenizer a text prompt would
    // reach it as estimated ids and its answer could not be read back. Id-only serving (vLLM's
    // --skip-tokenizer-init) needs responses that carry token ids, which they do not yet.
    // (Checked once the checkpoint's config.json has loaded: a wrong directory says so first.)
    if let (Some(dir), None) = (&a.model, &tokenizer) {
        return Err(Failure::Input(anyhow!(
            "--model {}: no tokenizer.json in it and no --tokenizer FILE: the CPU engine decodes \
             its token ids to text with it",
            dir.display()
        )));
    }
    let api_cfg = ApiConfig {
        vocab_size: counter.vocab_size().unwrap_or(s.model.vocab),
        counter,
        tool_parser,
        auto_tool_choice: a.enable_auto_tool_choice,
        reasoning_parser,
        reasoning_field: a.reasoning_field,
        max_body_bytes: a.max_body_bytes,
        body_timeout,
        access,
    };
    let model = a
        .served_model_name
        .clone()
        .unwrap_or_else(|| match &a.model {
            Some(dir) => dir.display().to_string(),
            None => s.model.name.clone(),
        });
    let (engine, trace) = match &a.model {
        Some(dir) => {
            let (built, devices, fabric, trace) = cpu_engine(&s, dir, &a)?;
            (Some((built, devices, fabric)), trace)
        }
        None => (None, None),
    };
    let device_name = if cpu { "CPU engine" } else { "twin device" };
    let tokio = tokio::runtime::Runtime::new()
        .context("starting the async runtime")
        .map_err(Failure::Runtime)?;
    let served = tokio.block_on(async move {
        let t = TwinServe {
            model,
            time_scale: a.time_scale,
            max_pending: a.max_pending,
            record_steps: false,
        };
        let rt = match engine {
            Some((built, devices, fabric)) => {
                dstwin_sim::serve::start_on(&s, t, built, devices, fabric)
            }
            None => dstwin_sim::serve::start(&s, t),
        }
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
            "serving {} ({}: {} instances, {device_name}, time scale {})",
            rt.model(),
            s.name,
            rt.instance_names().len(),
            a.time_scale
        );
        crate::output::errln!("access: {access_note}");
        let closing = rt.clone();
        let watch = rt.clone();
        listen::serve(listener, api::router(rt, api_cfg), limits, async move {
            tokio::select! {
                _ = shutdown_signal() => {}
                why = closing.failed() => {
                    // Requests in flight have ended with it (500); nothing more is served.
                    crate::output::errln!("a device failed, shutting down: {why}");
                    closing.close();
                    return;
                }
            }
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
        .await;
        match watch.failure() {
            Some(why) => Err(Failure::Runtime(anyhow!("the deployment failed: {why}"))),
            None => Ok(()),
        }
    });
    // The engine writes its trace when idle; what is still waiting is written now.
    if let Some(t) = &trace {
        t.flush();
    }
    if let Some(e) = trace.and_then(|t| t.error()) {
        return Err(Failure::Runtime(anyhow!(
            "--profile: the trace stopped at a write error: {e}"
        )));
    }
    served
}

/// The default deployment of `--device cpu`.
const CPU_SCENARIO: &str = include_str!("../engine/cpu/scenarios/cpu-mixed.toml");

type Engine = (
    Vec<dstwin_sim::run::BuiltInstance>,
    Vec<Box<dyn dstwin_core::device::Device + Send>>,
    Box<dyn dstwin_core::device::Fabric + Send>,
    Option<dstwin_cpu::TraceSink>,
);

/// Loads the checkpoint and builds the scenario's instances, a CPU device for each (its routed
/// experts placed as the scenario's EPLB placed them), joined by a fabric that copies KV
/// blocks; with `--profile`, the trace they write.
fn cpu_engine(
    s: &dstwin_sim::scenario::Scenario,
    dir: &std::path::Path,
    a: &ServeArgs,
) -> Result<Engine, Failure> {
    use dstwin_cpu::{AttnPath, CpuDevice, CpuDeviceConfig, CpuFabric, DType, Model, TraceSink};
    for setup in &s.instances {
        if setup.plan.tp != 1 {
            return Err(Failure::Input(anyhow!(
                "instance '{}': tp = {}; the CPU engine runs each DP rank as a whole model (tp = 1)",
                setup.name,
                setup.plan.tp
            )));
        }
    }
    if a.kv_blocks == 0 {
        return Err(Failure::Input(anyhow!("--kv-blocks must be at least 1")));
    }
    let dtype = match a.dtype {
        DTypeArg::F32 => DType::F32,
        DTypeArg::Bf16 => DType::BF16,
    };
    let mut model = Model::load(dir, dtype, &dstwin_cpu::Device::Cpu).map_err(|e| match e {
        dstwin_cpu::LoadError::Io { .. } => Failure::Runtime(anyhow!(e)),
        e => Failure::Input(anyhow!("--model {}: {e}", dir.display())),
    })?;
    if let Some(QuantArg::W8a8) = a.quantization {
        model
            .quantize_w8a8()
            .context("quantizing to W8A8")
            .map_err(Failure::Runtime)?;
    }
    let model = std::sync::Arc::new(model);
    let built = dstwin_sim::run::build_instances(s).map_err(|e| Failure::Input(e.into()))?;
    let trace = match &a.profile {
        Some(path) => Some(
            TraceSink::create(path)
                .map_err(|e| Failure::Input(anyhow!("--profile {}: {e}", path.display())))?,
        ),
        None => None,
    };
    let mut devices: Vec<Box<dyn dstwin_core::device::Device + Send>> = Vec::new();
    let mut fabric = CpuFabric::default();
    for (i, b) in built.iter().enumerate() {
        let mut dev = CpuDevice::new(
            model.clone(),
            CpuDeviceConfig {
                dp_ranks: b.config.dp_ranks,
                kv_blocks_per_rank: a.kv_blocks,
                block_size: b.config.block_size,
                spec_tokens: b.config.num_spec_tokens,
                path: AttnPath::Auto,
                seed: s.seed,
                placement: b.placement.clone(),
            },
        )
        .map_err(|e| Failure::Input(anyhow!("instance '{}': {e}", b.name)))?;
        if let Some(t) = &trace {
            dev = dev.with_profile(t.clone(), i as u32, &b.name);
        }
        fabric.add_instance(dev.caches());
        devices.push(Box::new(dev));
    }
    Ok((built, devices, Box::new(fabric), trace))
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
