//! The op graph's op names and what each is: the names calibration maps kernels onto.
//!
//! Read off the op graph itself (`dstwin_core::opgraph::step_ops`), not listed here: every
//! built-in model, on a layout with attention TP, dense TP and EP all above one (so that every
//! collective appears), for a decode, a prefill and a mixed step with MTP. An op keeps one kind
//! everywhere (a test checks it), so a name says its class.

use dstwin_core::batch::BatchShape;
use dstwin_core::layout::{Layout, Role};
use dstwin_core::model::{builtin, Quant, BUILTIN_MODELS};
use dstwin_core::opgraph::{step_ops, MoeLoad, OpKind, StepSpec};
use dstwin_hwmodels::{Catalog, CommKind, DType, OpClass};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::OnceLock;

/// What an op (or a kernel mapped to a class only) is: compute of a class, or a collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKindName {
    Compute(OpClass),
    Comm(CommKind),
}

impl OpKindName {
    /// `gemm`, `attention`, ... for compute; `comm:dispatch`, `comm:all_reduce`, ... for
    /// collectives.
    pub fn label(self) -> String {
        match self {
            OpKindName::Compute(c) => c.name().to_owned(),
            OpKindName::Comm(k) => format!("comm:{}", k.name()),
        }
    }

    /// Parses a label as [`label`](Self::label) writes it, or a bare collective name.
    pub fn parse(text: &str) -> Option<OpKindName> {
        let t = text.trim();
        if let Some(c) = OpClass::ALL.iter().find(|c| c.name() == t) {
            return Some(OpKindName::Compute(*c));
        }
        let k = t.strip_prefix("comm:").unwrap_or(t);
        COMM_KINDS
            .iter()
            .find(|c| c.name() == k)
            .map(|c| OpKindName::Comm(*c))
    }
}

impl fmt::Display for OpKindName {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.label())
    }
}

/// Every collective kind.
pub const COMM_KINDS: [CommKind; 6] = [
    CommKind::AllReduce,
    CommKind::AllGather,
    CommKind::ReduceScatter,
    CommKind::Dispatch,
    CommKind::Combine,
    CommKind::P2p,
];

/// The op graph's op names, each with its kind.
pub fn op_catalog() -> &'static BTreeMap<&'static str, OpKindName> {
    static OPS: OnceLock<BTreeMap<&'static str, OpKindName>> = OnceLock::new();
    OPS.get_or_init(build)
}

/// The kind of an op graph op.
pub fn kind_of(kind: &OpKind) -> OpKindName {
    match kind {
        OpKind::Compute(w) => OpKindName::Compute(w.class),
        OpKind::Comm(c) => OpKindName::Comm(c.kind),
    }
}

fn build() -> BTreeMap<&'static str, OpKindName> {
    let system = Catalog::builtin()
        .system("cloudmatrix384")
        .expect("built-in system");
    let layout = Layout {
        role: Role::Mixed,
        dies: 4,
        dp: 2,
        tp: 2,
        ep: 4,
        dense_tp: Some(2),
        redundant_experts: 0,
        shared_expert_dies: 0,
    };
    let mut ops = BTreeMap::new();
    for name in BUILTIN_MODELS {
        let model = builtin(name).expect("built-in model");
        let plan = layout
            .validate(&model, system)
            .expect("a four-die layout fits every built-in model");
        let cap = model.attn_cap();
        let decode = BatchShape::uniform_decode(8, 2, 2048, cap);
        let prefill = BatchShape::uniform_prefill(2, 1024, cap);
        let mut mixed = decode;
        mixed.add_prefill(512, 256, cap);
        for shape in [decode, prefill, mixed] {
            let spec = StepSpec {
                model: &model,
                quant: Quant::Fp8,
                kv_dtype: DType::Bf16,
                plan: &plan,
                mtp_tokens: 2,
            };
            let load = MoeLoad {
                group_tokens: shape.tokens() * 2,
                imbalance: 1.0,
            };
            for op in step_ops(spec, &shape, &load) {
                ops.entry(op.name).or_insert(kind_of(&op.kind));
            }
        }
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_name_has_one_kind_and_the_catalog_is_complete() {
        let ops = op_catalog();
        for (name, kind) in [
            ("q_a_proj", OpKindName::Compute(OpClass::Gemm)),
            ("attn_decode", OpKindName::Compute(OpClass::Attention)),
            ("attn_prefill", OpKindName::Compute(OpClass::Attention)),
            ("experts", OpKindName::Compute(OpClass::GroupedGemm)),
            ("indexer_score", OpKindName::Compute(OpClass::Indexer)),
            ("router_topk", OpKindName::Compute(OpClass::Elementwise)),
            ("dispatch", OpKindName::Comm(CommKind::Dispatch)),
            ("combine", OpKindName::Comm(CommKind::Combine)),
            ("attn_all_reduce", OpKindName::Comm(CommKind::AllReduce)),
            ("logits_gather", OpKindName::Comm(CommKind::AllGather)),
            ("mtp_eh_proj", OpKindName::Compute(OpClass::Gemm)),
        ] {
            assert_eq!(ops.get(name), Some(&kind), "{name}");
        }
        // No name changes kind between models or batches.
        let system = Catalog::builtin().system("cloudmatrix384").unwrap();
        for model in BUILTIN_MODELS {
            let m = builtin(model).unwrap();
            let plan = Layout::dp_ep(Role::Mixed, 4).validate(&m, system).unwrap();
            let shape = BatchShape::uniform_decode(4, 1, 512, m.attn_cap());
            let spec = StepSpec {
                model: &m,
                quant: Quant::Bf16,
                kv_dtype: DType::Bf16,
                plan: &plan,
                mtp_tokens: 1,
            };
            let load = MoeLoad {
                group_tokens: 16,
                imbalance: 1.0,
            };
            for op in step_ops(spec, &shape, &load) {
                assert_eq!(
                    ops.get(op.name),
                    Some(&kind_of(&op.kind)),
                    "{model} {}",
                    op.name
                );
            }
        }
        assert_eq!(
            OpKindName::parse("comm:dispatch"),
            Some(OpKindName::Comm(CommKind::Dispatch))
        );
        assert_eq!(
            OpKindName::parse("all_reduce"),
            Some(OpKindName::Comm(CommKind::AllReduce))
        );
        assert_eq!(
            OpKindName::parse("grouped_gemm"),
            Some(OpKindName::Compute(OpClass::GroupedGemm))
        );
        assert_eq!(OpKindName::parse("gemmm"), None);
    }
}
