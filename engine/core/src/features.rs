//! Engine mechanisms that change what a step computes or how its parts overlap, each a scenario
//! knob named after the vllm-ascend (or SGLang) option that switches it, and each decided per
//! step by the same rule the engine uses when the user leaves it to the engine.
//!
//! - Two-micro-batch overlap (vLLM `--enable-dbo`, SGLang `--enable-two-batch-overlap`,
//!   CloudMatrix-Infer's micro-batch pipeline): `auto` splits a step only when it has at least
//!   vLLM's token thresholds (`dbo_decode_token_threshold` 32, `dbo_prefill_token_threshold`
//!   512) and the split is faster; `force` always splits, as SGLang does once it is enabled.
//! - `multistream_overlap_shared_expert`: the shared expert runs on a second stream, under the
//!   dispatch and combine of the routed experts.
//! - `moe_comm` (vllm-ascend `select_moe_comm_method`): MC2 (the low-latency dispatch/combine
//!   kernels), all-to-all (the bulk kernels) or all-gather; `auto` follows vllm-ascend's rule.
//! - `cudagraph_mode = "FULL_DECODE_ONLY"` with `cudagraph_capture_sizes`: a decode-only step
//!   runs a captured graph, every DP rank padded to the largest rank's token count and then to
//!   the next capture size.
//! - FLASHCOMM1: in steps with prompts, attention TP's all-reduce becomes a reduce-scatter and
//!   an all-gather, and the norms run on 1/TP of the tokens.
//! - Shared-expert data parallelism (vllm-ascend's `enable_shared_expert_dp`, and what its
//!   FLASHCOMM1 does by itself: `shared_expert_dp_enabled()` in vllm_ascend/utils.py): under
//!   attention TP the shared expert is not split over the TP group; each die holds its whole
//!   weights and computes it for its own tokens.
//! - MLAPO: the MLA pre-processing (norm, q/kv projections, RoPE, cache write) of a decode step
//!   as one fused kernel.
//! - `enable_dsa_cp` (vllm-ascend's DSA context parallelism; SGLang's
//!   `--enable-nsa-prefill-context-parallel`): in steps with prompts, the dies of an attention
//!   TP group split the step's tokens instead of the attention heads, each running the whole
//!   attention (full weights) for its slice against the whole context, whose latent KV and
//!   indexer keys are all-gathered every layer; decode-only steps keep attention TP.
//! - `decode_context_parallel_size` (vLLM's DCP): MLA's KV cache interleaved over dies of the
//!   attention TP group; decode attention gathers the group's query heads, attends each die's
//!   share of the contexts and merges the partial outputs by their log-sum-exp.

use crate::model::{Attention, ModelConfig};
use serde::{Deserialize, Serialize};

/// Two-micro-batch overlap. Files may also say `true` (`auto`) or `false` (`off`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TwoMicrobatch {
    #[default]
    Off,
    /// Split when the step reaches the token threshold and the split is faster.
    Auto,
    /// Split every step, even where it loses.
    Force,
}

impl<'de> Deserialize<'de> for TwoMicrobatch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = TwoMicrobatch;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("\"off\", \"auto\", \"force\", true (auto) or false (off)")
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<TwoMicrobatch, E> {
                Ok(if v {
                    TwoMicrobatch::Auto
                } else {
                    TwoMicrobatch::Off
                })
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<TwoMicrobatch, E> {
                v.parse()
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Str(v), &self))
            }
        }
        d.deserialize_any(Visitor)
    }
}

impl std::str::FromStr for TwoMicrobatch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" | "false" => Ok(TwoMicrobatch::Off),
            "auto" | "true" => Ok(TwoMicrobatch::Auto),
            "force" => Ok(TwoMicrobatch::Force),
            _ => Err(format!("{s:?}: expected off, auto or force")),
        }
    }
}

impl TwoMicrobatch {
    pub fn name(self) -> &'static str {
        match self {
            TwoMicrobatch::Off => "off",
            TwoMicrobatch::Auto => "auto",
            TwoMicrobatch::Force => "force",
        }
    }
}

/// How MoE tokens reach their experts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MoeComm {
    /// The engine's rule for the platform (vllm-ascend on Ascend; DeepEP's `auto` elsewhere:
    /// low-latency kernels for decode-only steps, bulk kernels as soon as prompts are in).
    #[default]
    Auto,
    /// Low-latency dispatch/combine (MC2 `npu_moe_distribute_dispatch/combine`, DeepEP LL).
    Mc2,
    /// Bulk all-to-all (vllm-ascend ALLTOALL, DeepEP normal).
    #[serde(rename = "alltoall")]
    AllToAll,
    /// Every die gathers all tokens of the EP group and reduce-scatters the outputs.
    #[serde(rename = "allgather")]
    AllGather,
}

impl MoeComm {
    pub fn name(self) -> &'static str {
        match self {
            MoeComm::Auto => "auto",
            MoeComm::Mc2 => "mc2",
            MoeComm::AllToAll => "alltoall",
            MoeComm::AllGather => "allgather",
        }
    }
}

impl std::str::FromStr for MoeComm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [
            MoeComm::Auto,
            MoeComm::Mc2,
            MoeComm::AllToAll,
            MoeComm::AllGather,
        ]
        .into_iter()
        .find(|m| m.name() == s)
        .ok_or_else(|| format!("{s:?}: expected auto, mc2, alltoall or allgather"))
    }
}

/// The software platform whose rule `MoeComm::Auto` follows, from the chip.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Platform {
    /// Atlas A2 (Ascend 910B): vllm-ascend's `_select_a2_moe_comm_method`.
    AscendA2,
    /// Atlas A3 (Ascend 910C): vllm-ascend's `_select_a3_moe_comm_method`.
    AscendA3,
    /// Everything else: DeepEP's auto mode.
    Other,
}

impl Platform {
    /// The platform of a chip by its catalog name (`ascend-910b*`: A2, `ascend-910c*`: A3).
    pub fn of_chip(name: &str) -> Platform {
        if name.starts_with("ascend-910b") {
            Platform::AscendA2
        } else if name.starts_with("ascend-910c") {
            Platform::AscendA3
        } else {
            Platform::Other
        }
    }

    /// Whether the engine is vllm-ascend's or SGLang's NPU backend.
    pub fn is_ascend(self) -> bool {
        self != Platform::Other
    }
}

/// vllm-ascend's cap on MC2 tokens per rank (`_MC2_TOKENS_PER_RANK_LIMIT`).
pub const MC2_TOKENS_PER_RANK_LIMIT: u64 = 512;
/// vllm-ascend's A2 rule: MC2 only with at most this many experts per die...
pub const A2_MC2_MAX_EXPERTS_PER_DIE: u64 = 24;
/// ... and an EP group of at least this many dies.
pub const A2_MC2_MIN_EP: u32 = 16;
/// vLLM's `dbo_decode_token_threshold`: decode steps below it are not split.
pub const DBO_DECODE_TOKENS: u64 = 32;
/// vLLM's `dbo_prefill_token_threshold`: steps with prompts below it are not split.
pub const DBO_PREFILL_TOKENS: u64 = 512;
/// vllm-ascend's `MLAPO_MAX_SUPPORTED_TOKENS`: MLAPO runs on decode steps up to this many tokens.
pub const MLAPO_MAX_TOKENS: u64 = 1024;
/// vllm-ascend's largest default capture size.
pub const MAX_CAPTURE_SIZE: u32 = 512;

/// Graph capture of decode steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CudagraphMode {
    /// Eager: every step runs at its own size.
    #[default]
    None,
    /// Decode-only steps run captured graphs (padded); steps with prompts run eagerly.
    FullDecodeOnly,
    /// vLLM's default: decode-only steps run captured full graphs (padded), the others
    /// piecewise graphs (attention eager between captured pieces, taken as free).
    FullAndPiecewise,
}

impl std::str::FromStr for CudagraphMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "NONE" | "none" => Ok(CudagraphMode::None),
            "FULL_DECODE_ONLY" | "full_decode_only" => Ok(CudagraphMode::FullDecodeOnly),
            "FULL_AND_PIECEWISE" | "full_and_piecewise" => Ok(CudagraphMode::FullAndPiecewise),
            _ => Err(format!(
                "{s:?}: expected NONE, FULL_DECODE_ONLY or FULL_AND_PIECEWISE"
            )),
        }
    }
}

/// Every engine mechanism, once: its field, its type, what it does and, in brackets, its
/// `dstwin explain` flag (clap's settings; `skip` for none). [`Features`], a scenario
/// instance's fields (`sim/src/scenario/raw.rs`) and `explain`'s flags (`src/explain_cmd.rs`)
/// are expanded from this list, so a new mechanism is written here and in the rules below.
///
/// `feature_fields!(m! { tokens })` expands to `m! { tokens fields }`, each field as
/// `$(#[doc = ...])* name: Type [flag settings],`.
#[macro_export]
macro_rules! feature_fields {
    ($m:ident! { $($pre:tt)* }) => {
        $m! {
            $($pre)*
            /// Two-micro-batch overlap: off, auto (split a step of at least 32 decode / 512
            /// prompt tokens per rank when the split is faster) or force (split whatever it
            /// costs). Scenario files may also say true (auto) or false (off); a scenario's
            /// default is off, explain's auto.
            two_microbatch: $crate::features::TwoMicrobatch [long, default_value = "auto"],
            /// Run the shared expert on a second stream under the routed experts' dispatch and
            /// combine (vllm-ascend multistream_overlap_shared_expert).
            shared_expert_overlap: bool [long],
            /// MoE communication: auto (vllm-ascend's rule on Ascend, DeepEP's elsewhere), mc2,
            /// alltoall or allgather.
            moe_comm: $crate::features::MoeComm [long, default_value = "auto"],
            /// Graph capture of decode steps: NONE (eager), FULL_DECODE_ONLY or
            /// FULL_AND_PIECEWISE (vLLM's default): decode-only steps run captured graphs, every
            /// DP rank padded to the largest rank's tokens and then to the next capture size.
            cudagraph_mode: $crate::features::CudagraphMode [long, default_value = "NONE"],
            /// Capture sizes in tokens per DP rank, comma-separated (default: vLLM's list up to
            /// min(max_num_seqs x (1 + MTP tokens), 512)); with a graph mode only.
            cudagraph_capture_sizes: Option<Vec<u32>> [long, value_delimiter = ','],
            /// FLASHCOMM1: attention TP's all-reduce as reduce-scatter + all-gather, norms on
            /// 1/TP of the tokens, the shared expert whole on each die for its own slice.
            flashcomm1: bool [long],
            /// vllm-ascend's enable_shared_expert_dp: the shared expert runs data-parallel,
            /// every die holding its whole weights, on the die's own slice of the tokens; it
            /// turns FLASHCOMM1 on, as vllm-ascend 0.18-0.25 does, and FLASHCOMM1 alone runs the
            /// shared expert so too (attention TP > 1 with expert parallelism).
            enable_shared_expert_dp: bool [long],
            /// MLAPO: the MLA pre-processing of decode steps (up to 1024 tokens) as one fused
            /// kernel.
            mlapo: bool [long],
            /// Attention kernels one sequence at a time, each paying its own fixed cost (the CPU
            /// engine's MLA: engine/cpu/src/attention.rs), instead of one batched kernel per
            /// layer.
            attention_per_sequence: bool [skip],
            /// vLLM's --enforce-eager: every step launches its kernels one by one and takes at
            /// least the cost file's [host] eager_layer_us per layer (as do steps no graph was
            /// captured for); not with a graph mode.
            enforce_eager: bool [long, conflicts_with = "cudagraph_mode"],
            /// vLLM's speculative_config "enforce_eager": the MTP drafter launches its kernels
            /// one by one outside the step's graph, each draft pass taking at least the cost
            /// file's [host] eager_layer_us (once per draft) while the rest of the step keeps
            /// its graph; needs MTP and a graph mode.
            mtp_enforce_eager: bool [long],
            /// vllm-ascend's enable_dsa_cp (SGLang's --enable-nsa-prefill-context-parallel):
            /// steps with prompts split their tokens over the attention TP group's dies instead
            /// of the heads, the whole context's latent KV and indexer keys gathered every layer
            /// (sparse-attention models, V3.2 and V4, with attention TP > 1).
            enable_dsa_cp: bool [long],
            /// vLLM's --decode-context-parallel-size: the MLA KV cache interleaved token by
            /// token over this many dies of each attention TP group (it must divide tp), so a
            /// DP rank holds that many times the tokens; decode attention gathers the group's
            /// query heads, each die attends its share of every context and the outputs are
            /// merged back to their heads (default 1: off).
            decode_context_parallel_size: Option<u32> [long],
        }
    };
}

/// [`Features`] from the list.
macro_rules! features_struct {
    ($( $(#[doc = $d:literal])* $f:ident: $t:ty [$($flag:tt)*], )*) => {
        /// The mechanisms of one instance, as a scenario gives them ([`feature_fields`]).
        #[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct Features {
            $( $(#[doc = $d])* #[serde(default)] pub $f: $t, )*
        }
    };
}
feature_fields!(features_struct! {});

/// vLLM's default capture sizes up to `max`: 1, 2, 4, then every 8 to 256, then every 16.
pub fn default_capture_sizes(max: u32) -> Vec<u32> {
    let mut v: Vec<u32> = [1, 2, 4].into_iter().filter(|&s| s <= max).collect();
    v.extend((8..=max.min(256)).step_by(8));
    if max > 256 {
        v.extend((272..=max).step_by(16));
    }
    if v.last() != Some(&max) && max > 0 {
        v.push(max);
    }
    v
}

/// vLLM's `adjust_cudagraph_sizes_for_spec_decode` (vllm/config/compilation.py), applied when
/// decode steps run full graphs with MTP drafts: a uniform decode step holds 1 + drafts tokens
/// per sequence, so every capture size is rounded up to a multiple of that query length, those
/// past the largest size dropped (the largest becomes the largest rounded size); none left
/// gives the query length itself if it is within the largest size, else an error.
fn spec_decode_sizes(sizes: Vec<u32>, query_len: u64) -> Result<Vec<u32>, FeatureError> {
    let (Some(&max), q) = (sizes.last(), query_len as u32) else {
        return Ok(sizes);
    };
    if q <= 1 {
        return Ok(sizes);
    }
    let mut v: Vec<u32> = sizes
        .iter()
        .map(|s| s.div_ceil(q) * q)
        .filter(|&s| s <= max)
        .collect();
    v.dedup();
    if v.is_empty() && q <= max {
        v.push(q);
    }
    if v.is_empty() {
        return Err(FeatureError {
            field: "cudagraph_capture_sizes",
            value: format!("{sizes:?}"),
            reason: format!(
                "no size is left once rounded up to a multiple of {q} tokens (1 + MTP drafts), as \
                 vLLM rounds them: give at least one size of {q} or more"
            ),
        });
    }
    Ok(v)
}

/// Features resolved for one instance: everything a step's pricing needs, decided once.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Resolved {
    pub two_microbatch: TwoMicrobatch,
    pub shared_expert_overlap: bool,
    pub moe_comm: MoeComm,
    pub platform: Platform,
    /// Tokens per DP rank up to which `auto` uses MC2 (vllm-ascend's `mc2_tokens_capacity`).
    pub mc2_capacity: u64,
    /// Capture sizes, ascending; empty when decode steps run eagerly.
    pub capture_sizes: Vec<u32>,
    pub flashcomm1: bool,
    /// The shared expert runs whole on every die of an attention TP group, on the die's own
    /// tokens ([`Features::shared_expert_dp`]).
    pub shared_expert_dp: bool,
    pub mlapo: bool,
    pub attention_per_sequence: bool,
    pub enforce_eager: bool,
    /// The MTP drafter runs eagerly outside the step's graph (`mtp_enforce_eager`, with MTP on).
    pub mtp_enforce_eager: bool,
    /// Steps no graph was captured for run piecewise graphs rather than eagerly
    /// (`FULL_AND_PIECEWISE`).
    pub piecewise: bool,
    /// Steps with prompts split their tokens over the attention TP group (`enable_dsa_cp`).
    pub dsa_cp: bool,
    /// Dies each DP rank's MLA KV cache is interleaved over (`decode_context_parallel_size`;
    /// 1: off).
    pub dcp: u32,
    /// The most tokens a DP rank's decode step holds, `max_num_seqs` x (1 + drafts): the size
    /// vllm-ascend pads an LM-head TP group's logits to (0: no padding). Not reported: it
    /// restates the scheduler's limits.
    #[serde(skip)]
    pub logits_pad_tokens: u64,
}

/// What a decode step's MoE uses and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MoeCommUsed {
    Mc2,
    #[serde(rename = "alltoall")]
    AllToAll,
    #[serde(rename = "allgather")]
    AllGather,
}

impl MoeCommUsed {
    pub fn name(self) -> &'static str {
        match self {
            MoeCommUsed::Mc2 => "mc2",
            MoeCommUsed::AllToAll => "alltoall",
            MoeCommUsed::AllGather => "allgather",
        }
    }
}

/// Invalid feature settings.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field} = {value}: {reason}")]
pub struct FeatureError {
    pub field: &'static str,
    pub value: String,
    pub reason: String,
}

impl Features {
    /// Whether the features suit `model` on a chip named `chip`, with attention TP `tp` and the
    /// MoE split `moe_tp` ways: DSA context parallelism splits the sparse attention of V3.2 and
    /// V4 only, and neither it nor FLASHCOMM1 is modelled beside MoE tensor parallelism (both
    /// leave each die a slice of the tokens, which a tensor-parallel MoE would first gather);
    /// decode context parallelism shards MLA's cache within the TP group ([`Self::check_dcp`]).
    pub fn check_instance(
        &self,
        model: &ModelConfig,
        chip: &str,
        tp: u32,
        moe_tp: u32,
    ) -> Result<(), FeatureError> {
        let sparse = model.attn_cap().0.is_some();
        if self.enable_dsa_cp && !sparse {
            return Err(FeatureError {
                field: "enable_dsa_cp",
                value: "true".into(),
                reason: "DSA context parallelism splits the sparse attention of V3.2 and V4; \
                         this model has dense attention"
                    .into(),
            });
        }
        for (field, on) in [
            ("enable_dsa_cp", self.enable_dsa_cp),
            ("flashcomm1", self.flashcomm1),
            ("enable_shared_expert_dp", self.enable_shared_expert_dp),
        ] {
            if on && moe_tp > 1 {
                return Err(FeatureError {
                    field,
                    value: "true".into(),
                    reason: format!(
                        "not modelled beside MoE tensor parallelism (ep = 1, each expert split \
                         {moe_tp} ways): it leaves each die a slice of the tokens; use ep = dies"
                    ),
                });
            }
        }
        self.check_dcp(model, Platform::of_chip(chip).is_ascend(), tp)
    }

    /// The DCP size asked for (1 without one).
    fn dcp(&self) -> u32 {
        self.decode_context_parallel_size.unwrap_or(1)
    }

    /// Decode context parallelism as vLLM and vllm-ascend allow it: a divisor of the attention
    /// TP size (vLLM carves the DCP groups out of the TP group), of MLA attention (V4's
    /// compressed attention is not modelled under it), and for V3.2's sparse attention on
    /// Ascend the whole TP group, without MLAPO (vllm-ascend's SFA DCP path requires
    /// `dcp == tp` in platform.py and turns MLAPO off), not beside DSA context parallelism.
    fn check_dcp(&self, model: &ModelConfig, ascend: bool, tp: u32) -> Result<(), FeatureError> {
        let Some(n) = self.decode_context_parallel_size else {
            return Ok(());
        };
        let err = |reason: String| FeatureError {
            field: "decode_context_parallel_size",
            value: n.to_string(),
            reason,
        };
        if n == 0 {
            return Err(err("give at least 1 (1: off)".into()));
        }
        if n == 1 {
            return Ok(());
        }
        if !tp.is_multiple_of(n) {
            return Err(err(format!(
                "must divide the attention TP size ({tp}): vLLM shards the KV cache over dies of \
                 one TP group"
            )));
        }
        if matches!(model.attention, Attention::Hybrid { .. }) {
            return Err(err(
                "shards MLA's latent cache; V4's compressed attention is not modelled under it"
                    .into(),
            ));
        }
        let sparse = model.attn_cap().0.is_some();
        if sparse && ascend && n != tp {
            return Err(err(format!(
                "vllm-ascend runs sparse attention (V3.2) under DCP only across the whole TP \
                 group: give {tp}"
            )));
        }
        if sparse && ascend && self.mlapo {
            return Err(err(
                "vllm-ascend turns MLAPO off for sparse attention under DCP: leave mlapo out"
                    .into(),
            ));
        }
        if self.enable_dsa_cp {
            return Err(err(
                "not modelled beside enable_dsa_cp (which splits the prompt tokens instead)".into(),
            ));
        }
        Ok(())
    }

    /// Whether the shared expert runs data-parallel under attention TP `tp`: asked for, or
    /// FLASHCOMM1, under which vllm-ascend runs it so (`shared_expert_dp_enabled()`).
    pub fn shared_expert_dp(&self, tp: u32) -> bool {
        tp > 1 && (self.enable_shared_expert_dp || self.flashcomm1)
    }

    /// Resolves the features of an instance whose DP ranks hold `max_num_seqs` sequences with
    /// `mtp_tokens` drafts each, with attention TP `tp`, on a chip named `chip`.
    pub fn resolve(
        &self,
        chip: &str,
        max_num_seqs: u32,
        mtp_tokens: u32,
        tp: u32,
    ) -> Result<Resolved, FeatureError> {
        let query_len = 1 + mtp_tokens as u64;
        let default_max =
            (max_num_seqs as u64 * query_len).clamp(1, MAX_CAPTURE_SIZE as u64) as u32;
        if self.enforce_eager && self.cudagraph_mode != CudagraphMode::None {
            return Err(FeatureError {
                field: "enforce_eager",
                value: "true".into(),
                reason: "runs no graph: leave cudagraph_mode out (vLLM ignores the compilation \
                         config under --enforce-eager)"
                    .into(),
            });
        }
        if self.mtp_enforce_eager && mtp_tokens == 0 {
            return Err(FeatureError {
                field: "mtp_enforce_eager",
                value: "true".into(),
                reason: "runs the MTP drafter eagerly: needs MTP ([mtp] tokens above 0)".into(),
            });
        }
        if self.mtp_enforce_eager && self.cudagraph_mode == CudagraphMode::None {
            return Err(FeatureError {
                field: "mtp_enforce_eager",
                value: "true".into(),
                reason:
                    "runs the MTP drafter eagerly beside the step's graph: needs cudagraph_mode \
                         \"FULL_DECODE_ONLY\" or \"FULL_AND_PIECEWISE\" (\"NONE\" models no launch \
                         cost at all; under enforce_eager the whole step is eager already)"
                        .into(),
            });
        }
        if self.enable_shared_expert_dp && tp < 2 {
            return Err(FeatureError {
                field: "enable_shared_expert_dp",
                value: "true".into(),
                reason: format!(
                    "runs the shared expert whole on every die of an attention TP group: needs \
                     tp > 1 (this instance has tp {tp}; vllm-ascend ignores it there)"
                ),
            });
        }
        if self.enable_dsa_cp && tp < 2 {
            return Err(FeatureError {
                field: "enable_dsa_cp",
                value: "true".into(),
                reason: format!(
                    "splits the tokens of an attention TP group over its dies: needs tp > 1 \
                     (this instance has tp {tp})"
                ),
            });
        }
        let capture_sizes = match (self.cudagraph_mode, &self.cudagraph_capture_sizes) {
            (CudagraphMode::None, Some(_)) => {
                return Err(FeatureError {
                    field: "cudagraph_capture_sizes",
                    value: "(given)".into(),
                    reason: "needs cudagraph_mode = \"FULL_DECODE_ONLY\" or \"FULL_AND_PIECEWISE\""
                        .into(),
                })
            }
            (CudagraphMode::None, None) => Vec::new(),
            (CudagraphMode::FullDecodeOnly | CudagraphMode::FullAndPiecewise, None) => {
                default_capture_sizes(default_max)
            }
            (CudagraphMode::FullDecodeOnly | CudagraphMode::FullAndPiecewise, Some(v)) => {
                let mut v = v.clone();
                if v.is_empty() || v.contains(&0) || v.iter().any(|&s| s > 1 << 20) {
                    return Err(FeatureError {
                        field: "cudagraph_capture_sizes",
                        value: format!("{v:?}"),
                        reason: "give at least one size, each between 1 and 1048576 tokens".into(),
                    });
                }
                v.sort_unstable();
                v.dedup();
                v
            }
        };
        let capture_sizes = spec_decode_sizes(capture_sizes, query_len)?;
        // vllm-ascend: max_num_tokens is the largest capture size with graphs, else the decode
        // batch's tokens; capacity = min(ceil(max / tp), 512) x tp.
        let max_tokens = capture_sizes
            .last()
            .map_or(max_num_seqs as u64 * query_len, |&s| s as u64);
        let shared_expert_dp = self.shared_expert_dp(tp);
        let tp = tp.max(1) as u64;
        let mc2_capacity = max_tokens.div_ceil(tp).min(MC2_TOKENS_PER_RANK_LIMIT) * tp;
        Ok(Resolved {
            two_microbatch: self.two_microbatch,
            shared_expert_overlap: self.shared_expert_overlap,
            moe_comm: self.moe_comm,
            platform: Platform::of_chip(chip),
            mc2_capacity,
            capture_sizes,
            // vllm-ascend 0.18-0.25 turns sequence parallelism on with shared-expert DP
            // (ascend_config.py: enable_sp(..., enable_shared_expert_dp=True)).
            flashcomm1: self.flashcomm1 || shared_expert_dp,
            shared_expert_dp,
            mlapo: self.mlapo,
            attention_per_sequence: self.attention_per_sequence,
            enforce_eager: self.enforce_eager,
            mtp_enforce_eager: self.mtp_enforce_eager,
            piecewise: self.cudagraph_mode == CudagraphMode::FullAndPiecewise,
            dsa_cp: self.enable_dsa_cp,
            dcp: self.dcp(),
            logits_pad_tokens: max_num_seqs as u64 * query_len,
        })
    }
}

impl Resolved {
    /// Features that change nothing: what a bare op graph prices.
    pub fn plain(chip: &str) -> Resolved {
        Resolved {
            two_microbatch: TwoMicrobatch::Off,
            shared_expert_overlap: false,
            moe_comm: MoeComm::Auto,
            platform: Platform::of_chip(chip),
            mc2_capacity: MC2_TOKENS_PER_RANK_LIMIT,
            capture_sizes: Vec::new(),
            flashcomm1: false,
            shared_expert_dp: false,
            mlapo: false,
            attention_per_sequence: false,
            enforce_eager: false,
            mtp_enforce_eager: false,
            piecewise: false,
            dsa_cp: false,
            dcp: 1,
            logits_pad_tokens: 0,
        }
    }

    /// Whether a step whose graph padding is `pad` launches its kernels one by one: every step
    /// under `enforce_eager`, and under `FULL_DECODE_ONLY` every step no graph was captured for
    /// (steps with prompts, decode steps above the largest size), as vLLM runs them. Under
    /// `FULL_AND_PIECEWISE` those run piecewise graphs, and without a mode graphs are not
    /// modelled: a few graphs launched per layer, taken as free.
    pub fn launches_eagerly(&self, pad: Option<u64>) -> bool {
        self.enforce_eager || (!self.capture_sizes.is_empty() && !self.piecewise && pad.is_none())
    }

    /// The MoE communication of a step whose largest DP rank computes `max_rank_tokens` tokens,
    /// `with_prompts` when any prompt token is in it, for `experts_per_die` routed-expert slots
    /// per die in an EP group of `ep` dies.
    pub fn moe_comm(
        &self,
        max_rank_tokens: u64,
        with_prompts: bool,
        experts_per_die: u64,
        ep: u32,
    ) -> MoeCommUsed {
        match self.moe_comm {
            MoeComm::Mc2 => MoeCommUsed::Mc2,
            MoeComm::AllToAll => MoeCommUsed::AllToAll,
            MoeComm::AllGather => MoeCommUsed::AllGather,
            MoeComm::Auto => match self.platform {
                Platform::AscendA3 if max_rank_tokens <= self.mc2_capacity => MoeCommUsed::Mc2,
                Platform::AscendA3 => MoeCommUsed::AllToAll,
                Platform::AscendA2
                    if experts_per_die <= A2_MC2_MAX_EXPERTS_PER_DIE
                        && ep >= A2_MC2_MIN_EP
                        && max_rank_tokens <= self.mc2_capacity =>
                {
                    MoeCommUsed::Mc2
                }
                Platform::AscendA2 => MoeCommUsed::AllGather,
                Platform::Other if with_prompts => MoeCommUsed::AllToAll,
                Platform::Other => MoeCommUsed::Mc2,
            },
        }
    }

    /// Tokens per DP rank a decode-only step of `max_rank_tokens` (the largest rank's) runs at:
    /// the next capture size, or its own when graphs are off or it exceeds every size (eager).
    pub fn padded_tokens(&self, max_rank_tokens: u64) -> Option<u64> {
        self.capture_sizes
            .iter()
            .map(|&s| s as u64)
            .find(|&s| s >= max_rank_tokens)
    }

    /// Whether two micro-batches may be used for a step of `tokens` per rank (`with_prompts`
    /// when any prompt token is in it); `auto` also requires the split to be faster, which the
    /// pricing decides.
    pub fn two_microbatch_allowed(&self, tokens: u64, with_prompts: bool) -> bool {
        match self.two_microbatch {
            TwoMicrobatch::Off => false,
            TwoMicrobatch::Force => true,
            TwoMicrobatch::Auto => {
                let threshold = if with_prompts {
                    DBO_PREFILL_TOKENS
                } else {
                    DBO_DECODE_TOKENS
                };
                tokens >= threshold
            }
        }
    }

    /// Whether MLAPO fuses this step's MLA pre-processing (decode-only steps up to 1024 tokens).
    pub fn mlapo_applies(&self, decode_tokens: u64, with_prompts: bool) -> bool {
        self.mlapo && !with_prompts && decode_tokens <= MLAPO_MAX_TOKENS
    }
}

#[cfg(test)]
mod tests;
