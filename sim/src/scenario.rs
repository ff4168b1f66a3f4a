//! Scenario files (TOML): everything a simulation run needs, parsed strictly, then validated once
//! into a [`Scenario`] that the rest of the simulator takes.

use dstwin_core::eplb::Policy as EplbPolicy;
use dstwin_core::layout::{Layout, LayoutError, Plan, Role};
use dstwin_core::memory::{memory_map, MemoryError, MemoryInputs, MemoryMap};
use dstwin_core::model::{self, ModelConfig, Quant};
use dstwin_core::pd::Policy;
use dstwin_core::time::SimDuration;
use dstwin_hwmodels::{Catalog, CostModel, DType, HwError, System};
use dstwin_traces::spec::{WorkloadPlan, WorkloadSpec};
use dstwin_traces::TraceError;
use dstwin_twin::expert_load::ExpertLoadSpec;
use dstwin_twin::explain::Mtp;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The scenario file as written.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    /// Short name, used in reports.
    pub name: String,
    /// One line on what the scenario reproduces and from where.
    #[serde(default)]
    pub description: String,
    /// Seed of every random draw of the run (workload, MTP acceptance).
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Built-in model name (`dstwin catalog`) or a path to a HuggingFace config.json.
    pub model: String,
    /// bf16, w8a8, w4a8 or fp8.
    #[serde(default = "default_quant")]
    pub quant: Quant,
    /// KV-cache format: bf16, int8 or fp8.
    #[serde(default = "default_kv_dtype")]
    pub kv_dtype: String,
    /// Built-in system name or a path to a system TOML file.
    pub hardware: String,
    /// Stop the run at this simulated time (seconds); without it, run until every request ends.
    #[serde(default)]
    pub duration_s: Option<f64>,
    /// Leave the first seconds out of every statistic (steady-state measurements): latencies of
    /// requests that arrived before it, tokens, gaps and finishes before it, and steps that
    /// started before it; rates are over the time after it.
    #[serde(default)]
    pub warmup_s: f64,
    #[serde(default)]
    pub mtp: MtpSpec,
    #[serde(default)]
    pub proxy: ProxySpec,
    /// The instances (each `[[instance]]` table may stand for `count` identical instances).
    pub instance: Vec<InstanceSpec>,
    #[serde(default)]
    pub eplb: EplbSpec,
    /// How routed tokens spread over experts (default: Zipf skew 0.5 with slow drift).
    #[serde(default)]
    pub expert_load: ExpertLoadSpec,
    pub workload: WorkloadSpec,
    #[serde(default)]
    pub slo: SloSpec,
}

fn default_seed() -> u64 {
    1
}
fn default_quant() -> Quant {
    Quant::W8a8
}
fn default_kv_dtype() -> String {
    "bf16".into()
}

/// Multi-token prediction.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MtpSpec {
    /// Draft tokens per step (0 = off).
    #[serde(default)]
    pub tokens: u32,
    /// Acceptance probability of draft i given draft i-1 was accepted; the last value repeats.
    /// Empty: the calibrated acceptance ([`dstwin_core::mtp::CALIBRATED_ACCEPTANCE`]).
    #[serde(default)]
    pub acceptance: Vec<f64>,
}

/// The PD proxy's routing policy per role.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxySpec {
    /// load_balance (default), round_robin or prefix_aware.
    #[serde(default)]
    pub prefill_policy: Policy,
    /// load_balance (default) or round_robin.
    #[serde(default)]
    pub decode_policy: Policy,
}

/// Expert placement: how routed experts and their redundant replicas are laid out on the dies,
/// and whether they are re-placed as the load moves.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EplbSpec {
    /// identity, global, hierarchical or greedy (default). The first placement is computed from
    /// the expert load at the start of the run.
    #[serde(default = "default_policy")]
    pub policy: EplbPolicy,
    /// Re-place periodically (vllm-ascend's dynamic EPLB): collect heat for `heat_interval`
    /// steps, compute for `algorithm_interval` steps, move one MoE layer per step.
    #[serde(default)]
    pub dynamic: bool,
    /// Steps of heat per cycle (vllm-ascend default 600; its guide recommends 50 for prefill).
    #[serde(default = "default_heat")]
    pub heat_interval: u64,
    /// Steps the algorithm takes, asynchronously (default 50; 5 for prefill in the guide).
    #[serde(default = "default_algo")]
    pub algorithm_interval: u64,
}

impl Default for EplbSpec {
    fn default() -> Self {
        EplbSpec {
            policy: default_policy(),
            dynamic: false,
            heat_interval: default_heat(),
            algorithm_interval: default_algo(),
        }
    }
}

fn default_heat() -> u64 {
    600
}
fn default_algo() -> u64 {
    50
}

fn default_policy() -> EplbPolicy {
    EplbPolicy::Greedy
}

/// Service-level objectives; a request meets them when every one given holds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SloSpec {
    #[serde(default)]
    pub ttft_ms: Option<f64>,
    #[serde(default)]
    pub tpot_ms: Option<f64>,
    #[serde(default)]
    pub e2e_ms: Option<f64>,
}

/// What happens to a decode request when its instance runs out of KV.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PreemptionSpec {
    /// Free its KV and recompute it on the same instance (vLLM).
    #[default]
    Recompute,
    /// Finish it as "recomputed" and send it back to prefill (vllm-ascend's recompute scheduler).
    SendBack,
}

/// Scheduler knobs, named as vLLM's flags.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerSpec {
    /// Token budget of one step per DP rank (`--max-num-batched-tokens`).
    #[serde(default = "default_batched_tokens")]
    pub max_num_batched_tokens: u32,
    /// Running sequences per DP rank (`--max-num-seqs`).
    #[serde(default = "default_max_seqs")]
    pub max_num_seqs: u32,
    /// Tokens per KV block (128 on Ascend).
    #[serde(default = "default_block")]
    pub block_size: u32,
    #[serde(default = "yes")]
    pub enable_chunked_prefill: bool,
    #[serde(default = "yes")]
    pub enable_prefix_caching: bool,
    /// Cap on one request's prompt tokens per step (0: none).
    #[serde(default)]
    pub long_prefill_token_threshold: u32,
    /// Longest prompt + output accepted (`--max-model-len`); default the smaller of the model's
    /// context and one DP rank's KV capacity. Longer requests are rejected, as vLLM does.
    #[serde(default)]
    pub max_model_len: Option<u32>,
    #[serde(default)]
    pub preemption: PreemptionSpec,
    /// vLLM's `--async-scheduling`: step N+1 is scheduled while step N runs, so host work hides
    /// behind the device step, but what N produces is seen one step late: requests arriving (or
    /// whose KV arrives) during a step wait one more step, and a request that finished in step
    /// N still takes its slot in step N+1.
    #[serde(default)]
    pub async_scheduling: bool,
    /// Host (CPU) time of one step per DP rank: scheduling, input preparation, output
    /// processing, in microseconds, plus `host_overhead_per_seq_us` per scheduled request.
    /// Synchronous scheduling adds it to the device step; async scheduling overlaps them. No
    /// anchor measures it, so it defaults to 0 (the fitted device efficiencies absorb it); set
    /// it from a profiler trace of your engine.
    #[serde(default)]
    pub host_overhead_us: f64,
    #[serde(default)]
    pub host_overhead_per_seq_us: f64,
}

impl Default for SchedulerSpec {
    fn default() -> Self {
        SchedulerSpec {
            max_num_batched_tokens: default_batched_tokens(),
            max_num_seqs: default_max_seqs(),
            block_size: default_block(),
            enable_chunked_prefill: true,
            enable_prefix_caching: true,
            long_prefill_token_threshold: 0,
            max_model_len: None,
            preemption: PreemptionSpec::Recompute,
            async_scheduling: false,
            host_overhead_us: 0.0,
            host_overhead_per_seq_us: 0.0,
        }
    }
}

fn default_batched_tokens() -> u32 {
    2048
}
fn default_max_seqs() -> u32 {
    128
}
fn default_block() -> u32 {
    128
}
fn yes() -> bool {
    true
}

/// One kind of instance.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceSpec {
    /// Name used by `--set NAME.field=value` and in reports.
    pub name: String,
    /// prefill, decode or mixed.
    pub role: Role,
    /// Identical instances of this kind.
    #[serde(default = "one_u32")]
    pub count: u32,
    /// Dies per instance (a 910C card has two).
    pub dies: u32,
    /// Attention tensor-parallel size.
    #[serde(default = "one_u32")]
    pub tp: u32,
    /// Attention data-parallel ranks (default dies / tp).
    #[serde(default)]
    pub dp: Option<u32>,
    /// Expert-parallel size (default dies).
    #[serde(default)]
    pub ep: Option<u32>,
    /// TP of dense FFN, embeddings and LM head (default tp).
    #[serde(default)]
    pub dense_tp: Option<u32>,
    #[serde(default)]
    pub redundant_experts: u32,
    #[serde(default)]
    pub shared_expert_dies: u32,
    /// Two-micro-batch overlap of communication with compute.
    #[serde(default)]
    pub two_microbatch: bool,
    /// An expert placement file to start from instead of computing one (what `dstwin eplb
    /// --json` prints, or its `placement` object), relative to the scenario file; it must match
    /// this instance's MoE layers (MTP included when on) and routed-expert slots.
    #[serde(default)]
    pub placement: Option<String>,
    #[serde(default)]
    pub scheduler: SchedulerSpec,
}

fn one_u32() -> u32 {
    1
}

/// Why a scenario cannot run.
#[derive(Debug, Error)]
pub enum ScenarioError {
    #[error("{file}: {message}")]
    Parse { file: String, message: String },
    #[error("{field} = {value}: {reason}")]
    Field {
        field: String,
        value: String,
        reason: String,
    },
    #[error("instance '{instance}'")]
    Layout {
        instance: String,
        #[source]
        source: LayoutError,
    },
    #[error("instance '{instance}'")]
    Memory {
        instance: String,
        #[source]
        source: MemoryError,
    },
    #[error(transparent)]
    Hardware(#[from] HwError),
    #[error(transparent)]
    Workload(#[from] TraceError),
    #[error("reading {file}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
}

fn field(
    field: impl Into<String>,
    value: impl ToString,
    reason: impl Into<String>,
) -> ScenarioError {
    ScenarioError::Field {
        field: field.into(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// A validated instance kind.
#[derive(Clone, Debug)]
pub struct InstanceSetup {
    pub name: String,
    pub count: u32,
    pub layout: Layout,
    pub plan: Plan,
    pub two_microbatch: bool,
    pub placement: Option<String>,
    pub scheduler: SchedulerSpec,
    pub memory: MemoryMap,
    pub kv_blocks_per_rank: u64,
    /// Longest prompt + output a request may have here.
    pub max_model_len: u64,
}

/// Service-level objectives in time units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Slo {
    pub ttft: Option<SimDuration>,
    pub tpot: Option<SimDuration>,
    pub e2e: Option<SimDuration>,
}

/// A validated scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    pub seed: u64,
    pub model: ModelConfig,
    pub quant: Quant,
    pub kv_dtype: DType,
    pub cost: CostModel,
    pub mtp: Mtp,
    pub proxy: ProxySpec,
    pub instances: Vec<InstanceSetup>,
    pub eplb: EplbSpec,
    pub expert_load: ExpertLoadSpec,
    pub workload: WorkloadPlan,
    pub base_dir: PathBuf,
    pub slo: Slo,
    pub duration: Option<SimDuration>,
    /// Statistics start here.
    pub warmup: SimDuration,
    /// FNV-1a of the scenario after overrides, as TOML: reports record it.
    pub hash: String,
    /// The scenario after overrides, as TOML.
    pub canonical: String,
}

impl Scenario {
    pub fn system(&self) -> &System {
        &self.cost.system
    }

    /// True when prefill and decode run on separate instances.
    pub fn disaggregated(&self) -> bool {
        self.instances.iter().any(|i| i.plan.role == Role::Prefill)
    }

    pub fn dies(&self) -> u32 {
        self.instances.iter().map(|i| i.count * i.plan.dies).sum()
    }
}

/// Applies `path=value` overrides to a parsed scenario. The first path segment names a top-level
/// table or an instance (`decode.max_num_seqs=64` finds `max_num_seqs` in the instance named
/// `decode`, in its table or its `scheduler` table). Values are TOML (`64`, `true`, `"x"`); bare
/// words are taken as strings.
pub fn apply_overrides(doc: &mut toml::Table, sets: &[String]) -> Result<(), ScenarioError> {
    for s in sets {
        let (path, raw) = s.split_once('=').ok_or_else(|| {
            field(
                "--set",
                s,
                "expected PATH=VALUE, e.g. decode.max_num_seqs=64",
            )
        })?;
        let value: toml::Value = match toml::from_str::<toml::Table>(&format!("v = {raw}")) {
            Ok(mut t) => t.remove("v").expect("parsed the key just written"),
            Err(_) => toml::Value::String(raw.to_string()),
        };
        let parts: Vec<&str> = path.split('.').collect();
        let not_found = || {
            field(
                "--set",
                s,
                "no such field in the scenario (see docs/scenarios.md)",
            )
        };
        // An instance name first?
        if parts.len() >= 2 {
            if let Some(instances) = doc.get_mut("instance").and_then(toml::Value::as_array_mut) {
                if let Some(inst) = instances
                    .iter_mut()
                    .filter_map(toml::Value::as_table_mut)
                    .find(|t| t.get("name").and_then(toml::Value::as_str) == Some(parts[0]))
                {
                    let rest = &parts[1..];
                    let target = if rest.len() == 1 && !is_instance_key(rest[0]) {
                        inst.entry("scheduler")
                            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                            .as_table_mut()
                            .ok_or_else(not_found)?
                    } else {
                        inst
                    };
                    set_path(target, rest, value).ok_or_else(not_found)?;
                    continue;
                }
            }
        }
        set_path(doc, &parts, value).ok_or_else(not_found)?;
    }
    Ok(())
}

fn is_instance_key(k: &str) -> bool {
    matches!(
        k,
        "name"
            | "role"
            | "count"
            | "dies"
            | "tp"
            | "dp"
            | "ep"
            | "dense_tp"
            | "redundant_experts"
            | "shared_expert_dies"
            | "two_microbatch"
            | "placement"
            | "scheduler"
    )
}

fn set_path(t: &mut toml::Table, parts: &[&str], v: toml::Value) -> Option<()> {
    let (last, head) = parts.split_last()?;
    let mut cur = t;
    for p in head {
        cur = cur
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()?;
    }
    cur.insert(last.to_string(), v);
    Some(())
}

fn fnv1a(s: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// A model by built-in name, or from a HuggingFace `config.json` when `spec` ends in `.json`
/// (relative paths resolve against `base_dir`). The error says what is built in.
pub fn load_model(spec: &str, base_dir: &Path) -> Result<ModelConfig, ScenarioError> {
    if spec.ends_with(".json") {
        let p = resolve(base_dir, spec);
        let text = std::fs::read_to_string(&p).map_err(|source| ScenarioError::Io {
            file: p.clone(),
            source,
        })?;
        let name = Path::new(&p)
            .parent()
            .and_then(|d| d.file_name())
            .map_or_else(|| spec.to_string(), |n| n.to_string_lossy().into_owned());
        ModelConfig::from_hf_json(&name, &text).map_err(|e| field("model", spec, e.to_string()))
    } else {
        model::builtin(spec).ok_or_else(|| {
            field(
                "model",
                spec,
                format!(
                    "unknown; built in: {}, or a path to a config.json",
                    model::BUILTIN_MODELS.join(", ")
                ),
            )
        })
    }
}

/// Parses scenario text, applies overrides and validates. `base_dir` resolves relative paths
/// (trace files, config.json, hardware files).
pub fn load_str(
    file: &str,
    text: &str,
    base_dir: &Path,
    sets: &[String],
) -> Result<Scenario, ScenarioError> {
    let parse_err = |e: &dyn std::fmt::Display| ScenarioError::Parse {
        file: file.to_string(),
        message: e.to_string(),
    };
    let mut doc: toml::Table = toml::from_str(text).map_err(|e| parse_err(&e))?;
    apply_overrides(&mut doc, sets)?;
    let canonical = toml::to_string(&doc).map_err(|e| parse_err(&e))?;
    let raw: ScenarioFile = toml::from_str(&canonical).map_err(|e| parse_err(&e))?;
    validate(raw, base_dir, canonical)
}

/// Reads and loads a scenario file.
pub fn load_path(path: &Path, sets: &[String]) -> Result<Scenario, ScenarioError> {
    let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Io {
        file: path.display().to_string(),
        source,
    })?;
    let base = path.parent().unwrap_or(Path::new("."));
    load_str(&path.display().to_string(), &text, base, sets)
}

fn resolve(base: &Path, p: &str) -> String {
    let path = Path::new(p);
    if path.is_relative() && (p.ends_with(".toml") || p.ends_with(".json")) {
        base.join(path).display().to_string()
    } else {
        p.to_string()
    }
}

fn validate(
    raw: ScenarioFile,
    base_dir: &Path,
    canonical: String,
) -> Result<Scenario, ScenarioError> {
    let model = load_model(&raw.model, base_dir)?;
    let kv_dtype: DType = raw
        .kv_dtype
        .parse()
        .map_err(|e: String| field("kv_dtype", &raw.kv_dtype, e))?;
    let cat = Catalog::builtin();
    let hw = resolve(base_dir, &raw.hardware);
    let system = cat.resolve_system(&hw)?;
    let cost = cat.cost_model(&system, Path::new(&hw).parent())?;
    if let Some(d) = raw.duration_s {
        if !(d.is_finite() && d > 0.0) {
            return Err(field(
                "duration_s",
                d,
                "must be a positive number of seconds",
            ));
        }
    }
    if !(raw.warmup_s.is_finite() && raw.warmup_s >= 0.0) {
        return Err(field(
            "warmup_s",
            raw.warmup_s,
            "must be a number of seconds >= 0",
        ));
    }
    if let Some(d) = raw.duration_s.filter(|&d| raw.warmup_s >= d) {
        return Err(field(
            "warmup_s",
            raw.warmup_s,
            format!("must be shorter than duration_s ({d})"),
        ));
    }
    if raw.warmup_s > 0.0 && raw.duration_s.is_none() {
        return Err(field(
            "warmup_s",
            raw.warmup_s,
            "needs duration_s: without it the run ends when the last request finishes, which \
             may be before the warm-up does, leaving nothing to report",
        ));
    }
    // vLLM runs DeepSeek's one MTP layer again for every further draft, and each draft is
    // accepted only if all before it were, so acceptance falls geometrically: published
    // deployments use 1 to 3 drafts. Past MAX_POSITIONS the acceptance model has no positions.
    let max_drafts = dstwin_core::mtp::MAX_POSITIONS as u32;
    if raw.mtp.tokens > max_drafts {
        return Err(field(
            "mtp.tokens",
            raw.mtp.tokens,
            format!(
                "must be at most {max_drafts} draft tokens per step (acceptance falls \
                 geometrically with each draft; deployments use 1 to 3)"
            ),
        ));
    }
    if raw.mtp.tokens > 0 && model.mtp_layers == 0 {
        return Err(field(
            "mtp.tokens",
            raw.mtp.tokens,
            "the model has no MTP module",
        ));
    }
    for (i, p) in raw.mtp.acceptance.iter().enumerate() {
        if !(0.0..=1.0).contains(p) {
            return Err(field(
                format!("mtp.acceptance[{i}]"),
                p,
                "must be in [0, 1]",
            ));
        }
    }
    raw.expert_load
        .validate()
        .map_err(|(f, v, r)| field(f, v, r))?;
    for (name, v) in [
        ("slo.ttft_ms", raw.slo.ttft_ms),
        ("slo.tpot_ms", raw.slo.tpot_ms),
        ("slo.e2e_ms", raw.slo.e2e_ms),
    ] {
        if let Some(v) = v {
            if !(v.is_finite() && v > 0.0) {
                return Err(field(name, v, "must be a positive number of milliseconds"));
            }
        }
    }
    if raw.instance.is_empty() {
        return Err(field(
            "instance",
            "[]",
            "a scenario needs at least one [[instance]]",
        ));
    }
    let roles: Vec<Role> = raw.instance.iter().map(|i| i.role).collect();
    let has = |r| roles.contains(&r);
    if has(Role::Mixed) && (has(Role::Prefill) || has(Role::Decode)) {
        return Err(field(
            "instance.role",
            "mixed + prefill/decode",
            "use either mixed instances or prefill and decode instances",
        ));
    }
    if has(Role::Prefill) != has(Role::Decode) {
        return Err(field(
            "instance.role",
            if has(Role::Prefill) {
                "prefill only"
            } else {
                "decode only"
            },
            "PD disaggregation needs both prefill and decode instances",
        ));
    }
    let mut names = std::collections::BTreeSet::new();
    let mut instances = Vec::new();
    for spec in &raw.instance {
        if !names.insert(spec.name.clone()) {
            return Err(field(
                "instance.name",
                &spec.name,
                "instance names must be unique",
            ));
        }
        let f = |k: &str| format!("instance.{}.{k}", spec.name);
        if spec.count == 0 {
            return Err(field(f("count"), 0, "must be at least 1"));
        }
        if spec.tp == 0 {
            return Err(field(f("tp"), 0, "must be at least 1"));
        }
        let s = &spec.scheduler;
        for (k, v) in [
            ("scheduler.max_num_batched_tokens", s.max_num_batched_tokens),
            ("scheduler.max_num_seqs", s.max_num_seqs),
            ("scheduler.block_size", s.block_size),
        ] {
            if v == 0 {
                return Err(field(f(k), 0, "must be at least 1"));
            }
        }
        for (k, v, max) in [
            (
                "scheduler.max_num_seqs",
                s.max_num_seqs,
                dstwin_core::batch::MAX_SEQS_PER_STEP,
            ),
            (
                "scheduler.max_num_batched_tokens",
                s.max_num_batched_tokens,
                dstwin_core::batch::MAX_TOKENS_PER_STEP,
            ),
        ] {
            if u64::from(v) > max {
                return Err(field(f(k), v, format!("must be at most {max} per DP rank")));
            }
        }
        for (k, v) in [
            ("scheduler.host_overhead_us", s.host_overhead_us),
            (
                "scheduler.host_overhead_per_seq_us",
                s.host_overhead_per_seq_us,
            ),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(field(
                    f(k),
                    v,
                    "must be a finite number of microseconds >= 0",
                ));
            }
        }
        if let Some(m) = s.max_model_len {
            if m == 0 {
                return Err(field(
                    f("scheduler.max_model_len"),
                    0,
                    format!(
                        "must be at least 1 token (the model's context is {})",
                        model.max_context
                    ),
                ));
            }
            if m as u64 > model.max_context {
                return Err(field(
                    f("scheduler.max_model_len"),
                    m,
                    format!("exceeds the model's context of {}", model.max_context),
                ));
            }
        }
        let layout = Layout {
            role: spec.role,
            dies: spec.dies,
            dp: spec.dp.unwrap_or(spec.dies / spec.tp),
            tp: spec.tp,
            ep: spec.ep.unwrap_or(spec.dies),
            dense_tp: spec.dense_tp,
            redundant_experts: spec.redundant_experts,
            shared_expert_dies: spec.shared_expert_dies,
        };
        let plan = layout
            .validate(&model, &system)
            .map_err(|source| ScenarioError::Layout {
                instance: spec.name.clone(),
                source,
            })?;
        let memory = memory_map(
            &model,
            &plan,
            &system,
            &MemoryInputs {
                quant: raw.quant,
                kv_dtype,
                mtp_tokens: raw.mtp.tokens,
                max_tokens_per_step: s.max_num_batched_tokens as u64,
            },
        )
        .map_err(|source| ScenarioError::Memory {
            instance: spec.name.clone(),
            source,
        })?;
        let kv_blocks_per_rank = memory.kv_capacity_tokens / s.block_size as u64;
        if kv_blocks_per_rank == 0 {
            return Err(field(
                f("scheduler.block_size"),
                s.block_size,
                "not one KV block fits on a die",
            ));
        }
        // Like vLLM, a context that cannot fit in one rank's KV cache is refused up front; without
        // an explicit value the limit is the smaller of the model's context and the KV capacity.
        let kv_tokens = kv_blocks_per_rank * s.block_size as u64;
        let max_model_len = match s.max_model_len {
            Some(m) if m as u64 > kv_tokens => {
                return Err(field(
                    f("scheduler.max_model_len"),
                    m,
                    format!("exceeds the KV capacity of {kv_tokens} tokens per DP rank ({:.1} GB of KV per die); lower it or free memory", memory.kv_cache / 1e9),
                ))
            }
            Some(m) => m as u64,
            None => model.max_context.min(kv_tokens),
        };
        if !s.enable_chunked_prefill && (s.max_num_batched_tokens as u64) < max_model_len {
            return Err(field(
                f("scheduler.max_num_batched_tokens"),
                s.max_num_batched_tokens,
                format!("must be at least max_model_len ({max_model_len}) when chunked prefill is off, or no long prompt could ever be scheduled"),
            ));
        }
        instances.push(InstanceSetup {
            name: spec.name.clone(),
            count: spec.count,
            layout,
            plan,
            two_microbatch: spec.two_microbatch,
            placement: spec.placement.clone(),
            scheduler: s.clone(),
            memory,
            kv_blocks_per_rank,
            max_model_len,
        });
    }
    // In u64: count x dies of absurd values overflows u32 before the comparison says so.
    let dies: u64 = instances
        .iter()
        .map(|i| u64::from(i.count) * u64::from(i.plan.dies))
        .sum();
    if dies > u64::from(system.max_dies()) {
        return Err(field(
            "instance",
            format!("{dies} dies in all"),
            format!("exceeds the {} dies of {}", system.max_dies(), system.name),
        ));
    }
    let workload = raw.workload.validate()?;
    let ms = |v: Option<f64>| v.map(|x| SimDuration::from_secs_f64(x / 1e3));
    Ok(Scenario {
        name: raw.name,
        description: raw.description,
        seed: raw.seed,
        model,
        quant: raw.quant,
        kv_dtype,
        cost,
        mtp: Mtp {
            tokens: raw.mtp.tokens,
            // No acceptance given: the calibrated one (the same at every draft position).
            acceptance: if raw.mtp.tokens > 0 {
                dstwin_core::mtp::or_calibrated(raw.mtp.acceptance)
            } else {
                raw.mtp.acceptance
            },
        },
        proxy: raw.proxy,
        instances,
        eplb: raw.eplb.clone(),
        expert_load: raw.expert_load,
        workload,
        base_dir: base_dir.to_path_buf(),
        slo: Slo {
            ttft: ms(raw.slo.ttft_ms),
            tpot: ms(raw.slo.tpot_ms),
            e2e: ms(raw.slo.e2e_ms),
        },
        duration: raw.duration_s.map(SimDuration::from_secs_f64),
        warmup: SimDuration::from_secs_f64(raw.warmup_s),
        hash: fnv1a(&canonical),
        canonical,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtp_without_acceptance_takes_the_calibrated_one() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
        let text = std::fs::read_to_string(dir.join("a3-2p1d.toml")).unwrap();
        let given = load_str("a3-2p1d.toml", &text, &dir, &[]).unwrap();
        assert_eq!(given.mtp.acceptance, vec![0.85, 0.6, 0.45]);
        let line = "acceptance = [0.85, 0.6, 0.45]\n";
        assert!(text.contains(line));
        let omitted = text.replace(line, "");
        let s = load_str("a3-2p1d.toml", &omitted, &dir, &[]).unwrap();
        assert_eq!(s.mtp.tokens, 3);
        assert_eq!(
            s.mtp.acceptance,
            vec![dstwin_core::mtp::CALIBRATED_ACCEPTANCE]
        );
        // MTP off: no acceptance is made up.
        let off = load_str("a3-2p1d.toml", &omitted, &dir, &["mtp.tokens=0".into()]).unwrap();
        assert!(off.mtp.acceptance.is_empty());
    }
}
