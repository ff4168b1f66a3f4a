//! Parallel layouts of one instance: role, DP x TP for attention, EP for experts, redundant and
//! shared-expert slots; validated against a model and a system.

use crate::model::ModelConfig;
use dstwin_hwmodels::System;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// What an instance serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Prefill,
    Decode,
    Mixed,
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "prefill" => Ok(Role::Prefill),
            "decode" => Ok(Role::Decode),
            "mixed" => Ok(Role::Mixed),
            _ => Err(format!("unknown role '{s}'; known: prefill, decode, mixed")),
        }
    }
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Mixed => "mixed",
        }
    }
}

/// The parallel shape of one instance, as a user writes it. Sizes count dies, as vllm-ascend does.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layout {
    pub role: Role,
    /// Dies in the instance.
    pub dies: u32,
    /// Attention data-parallel ranks.
    pub dp: u32,
    /// Attention tensor-parallel size per DP rank. `dp * tp` must equal `dies`.
    pub tp: u32,
    /// Dies the routed experts are spread over: `dies` (one EP group spanning the instance), or
    /// 1 for MoE tensor parallelism (every die holds every expert, each expert's intermediate
    /// split over the dies, an all-reduce after the MoE: vLLM without
    /// `--enable-expert-parallel`, SGLang's `--ep-size 1`).
    pub ep: u32,
    /// Tensor-parallel size of dense FFN layers, embeddings and LM head (default: `tp`).
    #[serde(default)]
    pub dense_tp: Option<u32>,
    /// The LM head alone split by vocabulary over this many consecutive DP ranks
    /// (vllm-ascend's `finegrained_tp_config.lmhead_tensor_parallel_size`): they all-gather
    /// their hidden states before it and exchange the logits after it, each padded to the
    /// rank's `max_num_seqs` x (1 + MTP drafts) tokens. Absent: the LM head follows `dense_tp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lmhead_tp: Option<u32>,
    /// Extra routed-expert slots beyond one per logical expert (EPLB redundancy).
    #[serde(default)]
    pub redundant_experts: u32,
    /// Dies that host only shared-expert replicas (CloudMatrix384 decode: 32); with 0 every die
    /// computes the shared expert for its own tokens.
    #[serde(default)]
    pub shared_expert_dies: u32,
}

/// Every field of an instance's layout as a user writes it, once: its name, its type, what it
/// means, in braces its serde settings and in brackets its `dstwin explain` flag (clap's
/// settings, with explain's defaults: the CloudMatrix384 decode instance). [`LayoutSpec`], a
/// scenario instance's fields (`sim/src/scenario/raw.rs`), a calibration target's
/// (`calibration/src/target.rs`) and `explain`'s flags (`src/explain_cmd.rs`) are expanded from
/// this list; [`LayoutSpec::layout`] fills in what is left out.
///
/// `layout_fields!(m! { tokens })` expands to `m! { tokens fields }`, each field as
/// `$(#[doc = ...])* name: Type {serde settings} [flag settings],`.
#[macro_export]
macro_rules! layout_fields {
    ($m:ident! { $($pre:tt)* }) => {
        $m! {
            $($pre)*
            /// What the instance serves: prefill, decode or mixed.
            role: $crate::layout::Role {} [long, default_value = "decode"],
            /// Dies in the instance (a 910C card has two).
            dies: u32 {} [long, default_value_t = 320],
            /// Attention tensor-parallel size per DP rank.
            tp: u32 {default = "dstwin_core::layout::one"} [long, default_value_t = 1],
            /// Attention data-parallel ranks (default: dies / tp); dp x tp must equal dies.
            dp: Option<u32> {default, skip_serializing_if = "Option::is_none"} [long],
            /// Dies the routed experts are spread over: dies (default: one EP group spanning the
            /// instance), or 1 for MoE tensor parallelism (every die holds every expert, each
            /// expert's intermediate split over the dies: vLLM without
            /// --enable-expert-parallel, SGLang's --ep-size 1).
            ep: Option<u32> {default, skip_serializing_if = "Option::is_none"} [long],
            /// Tensor-parallel size of the dense FFN layers, embeddings and LM head (default: tp).
            dense_tp: Option<u32> {default, skip_serializing_if = "Option::is_none"} [long],
            /// The LM head alone split by vocabulary over this many consecutive DP ranks
            /// (vllm-ascend's finegrained_tp_config.lmhead_tensor_parallel_size; at least 2,
            /// dividing dp, with tp 1): they all-gather their hidden states before it and
            /// exchange the logits after it, each padded to the rank's max_num_seqs x (1 + MTP
            /// drafts) tokens (explain: --seqs) (default: the LM head follows dense_tp).
            lmhead_tp: Option<u32> {default, skip_serializing_if = "Option::is_none"} [long],
            /// Routed-expert slots beyond one per logical expert (EPLB redundancy).
            redundant_experts: u32 {default} [long, default_value_t = 32],
            /// Dies that host only shared-expert replicas (CloudMatrix384 decode: 32); with 0
            /// every die computes the shared expert for its own tokens.
            shared_expert_dies: u32 {default} [long, default_value_t = 32],
        }
    };
}

/// [`LayoutSpec`] from the list.
macro_rules! layout_spec_struct {
    ($( $(#[doc = $d:literal])* $f:ident: $t:ty {$($serde:tt)*} [$($flag:tt)*], )*) => {
        /// A layout as a user writes it ([`layout_fields`]): what is left out is filled in by
        /// [`LayoutSpec::layout`].
        #[derive(Clone, Debug, PartialEq)]
        pub struct LayoutSpec {
            $( $(#[doc = $d])* pub $f: $t, )*
        }
    };
}
layout_fields!(layout_spec_struct! {});

/// The default attention TP of a written layout (serde's `default = ".."` needs a function).
pub fn one() -> u32 {
    1
}

impl LayoutSpec {
    /// The layout, with dp = dies / tp and ep = dies where they are left out (a tp of 0 gives
    /// dp = dies, for [`Layout::validate`] to refuse the tp).
    pub fn layout(&self) -> Layout {
        Layout {
            role: self.role,
            dies: self.dies,
            dp: self.dp.unwrap_or(self.dies / self.tp.max(1)),
            tp: self.tp,
            ep: self.ep.unwrap_or(self.dies),
            dense_tp: self.dense_tp,
            lmhead_tp: self.lmhead_tp,
            redundant_experts: self.redundant_experts,
            shared_expert_dies: self.shared_expert_dies,
        }
    }
}

/// Why a layout cannot run; each names the field and the numbers.
#[derive(Debug, Error, PartialEq)]
pub enum LayoutError {
    #[error("layout.{field} = {value}: {reason}")]
    Field {
        field: &'static str,
        value: String,
        reason: String,
    },
    #[error("layout: dp ({dp}) x tp ({tp}) = {product}, but dies = {dies}; they must be equal")]
    DpTp {
        dp: u32,
        tp: u32,
        product: u64,
        dies: u32,
    },
    #[error("layout: {slots} routed-expert slots ({experts} experts + {redundant} redundant) do not divide evenly over {dies} expert dies (ep {ep} - shared_expert_dies {shared}); choose redundant_experts so that slots are a multiple of the expert dies ({suggestion})")]
    Experts {
        slots: u32,
        experts: u32,
        redundant: u32,
        dies: u32,
        ep: u32,
        shared: u32,
        /// The nearest values that work (redundant_experts below and above, shared_expert_dies).
        suggestion: String,
    },
    #[error(
        "layout: {dies} dies exceed the {max} dies of {system} ({nodes} nodes x {per_node} dies)"
    )]
    TooManyDies {
        dies: u32,
        max: u32,
        system: String,
        nodes: u32,
        per_node: u32,
    },
}

/// A layout checked against a model and a system.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    pub role: Role,
    pub dies: u32,
    pub dp: u32,
    pub tp: u32,
    pub ep: u32,
    /// Dies each routed expert's intermediate is split over: `dies` under MoE tensor
    /// parallelism (`ep` 1 on more than one die), else 1.
    pub moe_tp: u32,
    pub dense_tp: u32,
    /// [`Layout::lmhead_tp`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lmhead_tp: Option<u32>,
    pub redundant_experts: u32,
    pub shared_expert_dies: u32,
    /// Dies holding routed experts.
    pub routed_dies: u32,
    /// Routed-expert slots per routed die.
    pub slots_per_die: u32,
}

/// The values nearest the given ones that spread `experts` + `redundant` routed-expert slots
/// evenly: redundant_experts just below and just above (within `max_redundant`), and, where the
/// model has shared experts to host, the shared_expert_dies leaving the routed-die count nearest
/// `routed_dies` that divides the slots as they are.
fn expert_suggestion(
    experts: u32,
    redundant: u32,
    max_redundant: u32,
    (ep, routed_dies): (u32, u32),
    shared_allowed: bool,
) -> String {
    let slots = experts + redundant;
    let per_die = |n: u32| {
        if n == 1 {
            "1 slot".to_string()
        } else {
            format!("{n} slots")
        }
    };
    let rest = slots % routed_dies;
    let mut out = Vec::new();
    let below = redundant.checked_sub(rest);
    let above = Some(redundant + (routed_dies - rest)).filter(|&r| r <= max_redundant);
    for r in [below, above].into_iter().flatten() {
        let each = per_die((experts + r) / routed_dies);
        out.push(format!("redundant_experts = {r} ({each} per die)"));
    }
    // Routed-die counts from 2 to ep (shared_expert_dies ep - 2 .. 0) that divide the slots,
    // the nearest to the current count first (the larger on a tie). One routed die would hold
    // every expert on a single die of an EP group: not a layout to suggest.
    let dies = (2..=ep)
        .filter(|&d| shared_allowed && slots.is_multiple_of(d))
        .min_by_key(|&d| (d.abs_diff(routed_dies), std::cmp::Reverse(d)));
    if let Some(d) = dies {
        let each = per_die(slots / d);
        out.push(format!(
            "shared_expert_dies = {} ({d} expert dies x {each})",
            ep - d
        ));
    }
    if out.is_empty() {
        return if shared_allowed {
            format!(
                "neither redundant_experts alone (0 to {max_redundant}) nor shared_expert_dies \
                 alone (leaving at least 2 expert dies) makes them divide: change both together, \
                 or ep"
            )
        } else {
            format!(
                "no redundant_experts from 0 to {max_redundant} makes them divide: choose another ep"
            )
        };
    }
    format!("nearest that work: {}", out.join(", or "))
}

fn field(field: &'static str, value: impl ToString, reason: impl Into<String>) -> LayoutError {
    LayoutError::Field {
        field,
        value: value.to_string(),
        reason: reason.into(),
    }
}

impl Plan {
    /// The EPLB policy that places this plan's experts: `asked`, except under MoE tensor
    /// parallelism, where the one expert "die" holds every expert and there is nothing to
    /// place (a policy that needs nodes of dies would refuse it).
    pub fn placement_policy(&self, asked: crate::eplb::Policy) -> crate::eplb::Policy {
        if self.moe_tp > 1 {
            crate::eplb::Policy::Identity
        } else {
            asked
        }
    }
}

impl Layout {
    /// A DP-attention, full-EP layout over `dies` dies: dp = dies, tp = 1, ep = dies.
    pub fn dp_ep(role: Role, dies: u32) -> Layout {
        Layout {
            role,
            dies,
            dp: dies,
            tp: 1,
            ep: dies,
            dense_tp: None,
            lmhead_tp: None,
            redundant_experts: 0,
            shared_expert_dies: 0,
        }
    }

    pub fn validate(&self, model: &ModelConfig, system: &System) -> Result<Plan, LayoutError> {
        if self.dies == 0 {
            return Err(field("dies", 0, "must be at least 1"));
        }
        for (name, v) in [("dp", self.dp), ("tp", self.tp), ("ep", self.ep)] {
            if v == 0 {
                return Err(field(name, 0, "must be at least 1"));
            }
        }
        let product = u64::from(self.dp) * u64::from(self.tp);
        if product != u64::from(self.dies) {
            return Err(LayoutError::DpTp {
                dp: self.dp,
                tp: self.tp,
                product,
                dies: self.dies,
            });
        }
        if self.dies > system.max_dies() {
            return Err(LayoutError::TooManyDies {
                dies: self.dies,
                max: system.max_dies(),
                system: system.name.clone(),
                nodes: system.max_nodes,
                per_node: system.dies_per_node(),
            });
        }
        if self.ep != self.dies && self.ep != 1 {
            return Err(field(
                "ep",
                self.ep,
                format!(
                    "must equal dies ({}: one EP group spans the instance) or be 1 (MoE tensor \
                     parallelism over the instance)",
                    self.dies
                ),
            ));
        }
        let moe_tp = if self.ep == 1 { self.dies } else { 1 };
        if moe_tp > 1 {
            if self.dp > 1 {
                return Err(field(
                    "ep",
                    1,
                    format!(
                        "MoE tensor parallelism across {} attention DP ranks is not modelled; \
                         set ep = dies ({}) or dp = 1",
                        self.dp, self.dies
                    ),
                ));
            }
            if !model.expert_ffn.is_multiple_of(u64::from(moe_tp)) {
                return Err(field(
                    "ep",
                    1,
                    format!(
                        "MoE tensor parallelism over {moe_tp} dies must divide the expert \
                         intermediate size {}",
                        model.expert_ffn
                    ),
                ));
            }
            for (name, v) in [
                ("redundant_experts", self.redundant_experts),
                ("shared_expert_dies", self.shared_expert_dies),
            ] {
                if v > 0 {
                    return Err(field(
                        name,
                        v,
                        "needs expert parallelism (ep = dies); under MoE tensor parallelism \
                         (ep = 1) every die holds every expert",
                    ));
                }
            }
        }
        let heads = match &model.attention {
            crate::model::Attention::Mla { heads, .. }
            | crate::model::Attention::Hybrid { heads, .. } => *heads,
        };
        if heads % self.tp as u64 != 0 {
            return Err(field(
                "tp",
                self.tp,
                format!("must divide the model's {heads} attention heads"),
            ));
        }
        let dense_tp = self.dense_tp.unwrap_or(self.tp);
        if dense_tp == 0 || !self.dies.is_multiple_of(dense_tp) {
            return Err(field(
                "dense_tp",
                dense_tp,
                format!("must divide dies ({})", self.dies),
            ));
        }
        if model.dense_layers > 0 && !model.dense_ffn.is_multiple_of(dense_tp as u64) {
            return Err(field(
                "dense_tp",
                dense_tp,
                format!("must divide the dense FFN size {}", model.dense_ffn),
            ));
        }
        if let Some(n) = self.lmhead_tp {
            if self.tp > 1 {
                return Err(field(
                    "lmhead_tp",
                    n,
                    format!(
                        "is modelled with attention tp = 1 only (this layout has tp {}): the \
                         group is DP ranks at one TP index, spaced tp dies apart",
                        self.tp
                    ),
                ));
            }
            if n < 2 || !self.dp.is_multiple_of(n) {
                return Err(field(
                    "lmhead_tp",
                    n,
                    format!(
                        "must be at least 2 and divide dp ({}): the LM head's group is that many \
                         consecutive DP ranks, as vllm-ascend requires",
                        self.dp
                    ),
                ));
            }
        }
        if self.shared_expert_dies > 0 && model.shared_experts == 0 {
            return Err(field(
                "shared_expert_dies",
                self.shared_expert_dies,
                "the model has no shared expert",
            ));
        }
        if self.shared_expert_dies >= self.ep {
            return Err(field(
                "shared_expert_dies",
                self.shared_expert_dies,
                format!("must leave dies for routed experts (ep = {})", self.ep),
            ));
        }
        let routed_dies = self.ep - self.shared_expert_dies;
        let experts = model.routed_experts as u32;
        let max_redundant = experts.saturating_mul(crate::eplb::MAX_SLOTS_PER_EXPERT as u32 - 1);
        if self.redundant_experts > max_redundant {
            return Err(field(
                "redundant_experts",
                self.redundant_experts,
                format!(
                    "at most {max_redundant} for {experts} routed experts ({} slots per expert)",
                    crate::eplb::MAX_SLOTS_PER_EXPERT
                ),
            ));
        }
        let slots = experts + self.redundant_experts;
        if !slots.is_multiple_of(routed_dies) {
            return Err(LayoutError::Experts {
                slots,
                experts,
                redundant: self.redundant_experts,
                dies: routed_dies,
                ep: self.ep,
                shared: self.shared_expert_dies,
                suggestion: expert_suggestion(
                    experts,
                    self.redundant_experts,
                    max_redundant,
                    (self.ep, routed_dies),
                    model.shared_experts > 0,
                ),
            });
        }
        Ok(Plan {
            role: self.role,
            dies: self.dies,
            dp: self.dp,
            tp: self.tp,
            ep: self.ep,
            moe_tp,
            dense_tp,
            lmhead_tp: self.lmhead_tp,
            redundant_experts: self.redundant_experts,
            shared_expert_dies: self.shared_expert_dies,
            routed_dies,
            slots_per_die: slots / routed_dies,
        })
    }
}
