//! The scenario file as written: strict serde structs and their documented defaults.

use dstwin_core::eplb::Policy as EplbPolicy;
use dstwin_core::model::Quant;
use dstwin_core::pd::Policy;
use dstwin_traces::spec::WorkloadSpec;
use dstwin_twin::expert_load::ExpertLoadSpec;
use serde::{Deserialize, Serialize};

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
    /// Front-end time per request, µs: the HTTP server, tokenizing and streaming between the
    /// client and the engine, added to every request's TTFT and end-to-end latency (not to
    /// TPOT). Default: the cost file's `[host] request_us` (fitted by `calibrate --trace
    /// --bench`), else 0.
    #[serde(default)]
    pub frontend_us: Option<f64>,
    #[serde(default)]
    pub mtp: MtpSpec,
    #[serde(default)]
    pub proxy: ProxySpec,
    /// The instances (each `[[instance]]` table may stand for `count` identical instances).
    pub instance: Vec<InstanceSpec>,
    #[serde(default)]
    pub eplb: EplbSpec,
    /// How routed tokens spread over experts (default: `fitted`, a log-normal popularity per
    /// layer fitted to measured DeepSeek-R1 expert loads, static).
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
    /// Empty: the calibrated acceptance ([`dstwin_twin::mtp::CALIBRATED_ACCEPTANCE`]).
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
    /// identity, global, hierarchical or greedy. The first placement is computed from the expert
    /// load at the start of the run. Left out, each instance gets its engine's own
    /// ([`EplbSpec::policy_for`]): greedy where it runs EPLB (it has redundant experts, or
    /// `dynamic` is on), else identity, the contiguous placement vLLM, vllm-ascend and SGLang
    /// use when no EPLB is configured.
    #[serde(default)]
    pub policy: Option<EplbPolicy>,
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
            policy: None,
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

impl EplbSpec {
    /// The placement policy of an instance with `redundant_experts`: the one given, else
    /// greedy where the instance runs EPLB (redundant experts or dynamic re-placement), else
    /// identity.
    pub fn policy_for(&self, redundant_experts: u32) -> EplbPolicy {
        self.policy
            .unwrap_or_else(|| EplbPolicy::engine_default(redundant_experts > 0 || self.dynamic))
    }
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
    /// SGLang's prefill delayer, as its `SGLANG_SCHEDULER_DECREASE_PREFILL_IDLE=1` turns it on
    /// (SGLang's default passes: 30, `SGLANG_PREFILL_DELAYER_MAX_DELAY_PASSES`): while some of
    /// a mixed instance's DP ranks but not all have a prompt to admit, none admits one, for up
    /// to this many steps less one. 0 (the default): off, as in vLLM.
    #[serde(default)]
    pub prefill_delay_passes: u32,
    /// vllm-ascend's balance scheduling (`enable_balance_scheduling` in its scheduler or
    /// additional config; `VLLM_ASCEND_BALANCE_SCHEDULING=1` before): while any DP rank of a
    /// mixed instance ended the last step with `max_num_seqs` requests running, no rank admits
    /// a waiting one. Off by default, as in vllm-ascend.
    #[serde(default)]
    pub enable_balance_scheduling: bool,
    /// SGLang's default scheduling of a mixed instance (without `--enable-mixed-chunk`): a
    /// step is a prefill batch (prompts being computed, then waiting requests) whenever there
    /// is one to run, the decoding requests waiting, else a decode batch; never both in one
    /// step. false (the default): prompt chunks and decodes share each step's token budget, as
    /// in vLLM (and SGLang with `--enable-mixed-chunk`).
    #[serde(default)]
    pub separate_prefill_batches: bool,
    /// How new requests pick a DP rank: `least_loaded` (the default; vLLM's DP coordinator
    /// sends each to the rank with the shortest queue) or `round_robin` (SGLang's
    /// `--load-balance-method round_robin`, its default, and its PD pairing of
    /// `decode_round_robin` with `--prefill-round-robin-balance`).
    #[serde(default)]
    pub dp_dispatch: dstwin_core::instance::DpDispatch,
    /// What a waiting request's admission asks of the KV: `vllm` (the default: the blocks of
    /// the tokens it computes now; a request that later finds no KV preempts the newest one)
    /// or `sglang` (SGLang's scheduler keeps room for what running requests are still to
    /// produce: a prompt starts when the free KV, less every running request's remaining
    /// output times its adaptive `new_token_ratio`, holds the prompt and its whole output; a PD
    /// decode instance preallocates a request when `reserved_decode_tokens` per request fit
    /// beside its prompt). docs/scenarios.md, `[instance.scheduler]`.
    #[serde(default)]
    pub admission: AdmissionSpec,
    /// SGLang's `--schedule-conservativeness` (with `admission = "sglang"`): scales the
    /// initial `new_token_ratio` (0.7, at most 1). Default 1.
    #[serde(default = "default_conservativeness")]
    pub schedule_conservativeness: f64,
    /// SGLang's `SGLANG_NUM_RESERVED_DECODE_TOKENS` (with `admission = "sglang"`, PD decode
    /// instances): tokens kept free for every request decoding or receiving its KV. Default
    /// 512.
    #[serde(default = "default_reserved_decode_tokens")]
    pub reserved_decode_tokens: u32,
    /// The client sends every request with `ignore_eos` (with `admission = "sglang"`): with
    /// prefix caching off, SGLang then reserves each request's whole output and admits a
    /// prompt only if every request could finish, the shortest first, in the free KV
    /// (`sglang.bench_serving` sets ignore_eos unless `--disable-ignore-eos`). Default false.
    #[serde(default)]
    pub ignore_eos: bool,
    /// Host (CPU) time of one step per DP rank: scheduling, input preparation, output
    /// processing, in microseconds, plus `host_overhead_per_seq_us` per scheduled request.
    /// Synchronous scheduling adds it to the device step; async scheduling overlaps them.
    /// Absent: the hardware cost file's `[host]` (what `calibrate --trace` fits from the gaps
    /// between an engine's steps), else 0 (no anchor measures it; the fitted device
    /// efficiencies absorb it).
    #[serde(default)]
    pub host_overhead_us: Option<f64>,
    #[serde(default)]
    pub host_overhead_per_seq_us: Option<f64>,
    /// Host time per token a step computes (input preparation, the glue between kernels that
    /// grows with the batch), µs.
    #[serde(default)]
    pub host_overhead_per_token_us: Option<f64>,
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
            prefill_delay_passes: 0,
            enable_balance_scheduling: false,
            separate_prefill_batches: false,
            dp_dispatch: Default::default(),
            admission: AdmissionSpec::Vllm,
            schedule_conservativeness: 1.0,
            reserved_decode_tokens: default_reserved_decode_tokens(),
            ignore_eos: false,
            host_overhead_us: None,
            host_overhead_per_seq_us: None,
            host_overhead_per_token_us: None,
        }
    }
}

/// Whose admission rule a scheduler follows ([`SchedulerSpec::admission`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdmissionSpec {
    #[default]
    Vllm,
    Sglang,
}

fn default_conservativeness() -> f64 {
    1.0
}
fn default_reserved_decode_tokens() -> u32 {
    512
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

/// A scenario instance's fields: its own, the layout's ([`dstwin_core::layout_fields`]), more
/// of its own, then the engine mechanisms ([`dstwin_core::feature_fields`]): the struct, and the
/// layout and the mechanisms as the core takes them.
macro_rules! instance_spec {
    (
        { $($head:tt)* } { $($tail:tt)* }
        { $( $(#[doc = $ld:literal])* $lf:ident: $lt:ty {$($ls:tt)*} [$($lflag:tt)*], )* }
        $( $(#[doc = $d:literal])* $f:ident: $t:ty [$($flag:tt)*], )*
    ) => {
        /// One kind of instance.
        #[derive(Clone, Debug, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct InstanceSpec {
            $($head)*
            $( $(#[doc = $ld])* #[serde($($ls)*)] pub $lf: $lt, )*
            $($tail)*
            $( $(#[doc = $d])* #[serde(default)] pub $f: $t, )*
        }

        impl InstanceSpec {
            /// The layout as written ([`dstwin_core::layout::LayoutSpec::layout`] fills it in).
            pub fn layout_spec(&self) -> dstwin_core::layout::LayoutSpec {
                dstwin_core::layout::LayoutSpec { $( $lf: self.$lf.clone(), )* }
            }

            /// The engine mechanisms this instance runs with.
            pub fn features(&self) -> dstwin_core::features::Features {
                dstwin_core::features::Features { $( $f: self.$f.clone(), )* }
            }
        }
    };
}
/// The layout fields handed on to the mechanisms' list ([`instance_spec`]).
macro_rules! instance_spec_with_layout {
    ({ $($head:tt)* } { $($tail:tt)* } $($layout:tt)*) => {
        dstwin_core::feature_fields!(instance_spec! {{ $($head)* } { $($tail)* } { $($layout)* }});
    };
}
dstwin_core::layout_fields!(instance_spec_with_layout! {{
    /// Name used by `--set NAME.field=value` and in reports.
    pub name: String,
    /// Identical instances of this kind.
    #[serde(default = "one_u32")]
    pub count: u32,
} {
    /// This instance's MTP draft tokens per step where they differ from `[mtp] tokens` (SGLang
    /// gives each server its own `--speculative-num-steps`: a prefill server drafting 1 beside a
    /// decode server drafting 3). 1 up to the `[mtp]` ceiling, only with `[mtp] tokens` above 0:
    /// MTP is on or off for the whole deployment.
    #[serde(default)]
    pub mtp_tokens: Option<u32>,
    /// vLLM's `--gpu-memory-utilization`: weights, workspace and KV fill this share of each
    /// die's HBM (default: the system's `reserved_hbm_gb_per_die` kept back, 10% on the shipped
    /// systems = vLLM's 0.9). Not with `mem_fraction_static`.
    #[serde(default)]
    pub gpu_memory_utilization: Option<f64>,
    /// SGLang's `--mem-fraction-static`: weights and the KV pool fill this share of each die's
    /// HBM; the workspace lives in the rest.
    #[serde(default)]
    pub mem_fraction_static: Option<f64>,
    /// SGLang's `--max-total-tokens`: the KV pool of each DP rank holds at most this many
    /// tokens, fewer when memory leaves fewer (SGLang keeps the smaller of the two).
    #[serde(default)]
    pub max_total_tokens: Option<u64>,
    /// An expert placement file to start from instead of computing one (what `dstwin eplb
    /// --json` prints, or its `placement` object), relative to the scenario file; it must match
    /// this instance's MoE layers (MTP included when on) and routed-expert slots.
    #[serde(default)]
    pub placement: Option<String>,
    #[serde(default)]
    pub scheduler: SchedulerSpec,
}});

fn one_u32() -> u32 {
    1
}
