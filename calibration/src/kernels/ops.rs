//! The op graph's op names and what each is: the names calibration maps kernels onto.
//!
//! Read off the op graph itself: the union over the built-in models of
//! `dstwin_core::opgraph::vocabulary` (the names an engine's profiler may write, the CPU
//! engine's among them) on an EP group of two with MTP, so that dispatch, combine and the MTP
//! ops appear. Tensor-parallel collectives (`attn_all_reduce`, `ffn_all_reduce`,
//! `logits_gather`) are not in it: profilers name them by collective, which rules map by class.
//! An op keeps one class in every model (a test checks it), so a name says its class.

use dstwin_core::model::{builtin, BUILTIN_MODELS};
use dstwin_core::opgraph::vocabulary;
use dstwin_hwmodels::{CommKind, OpClass};
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
        CommKind::ALL
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

/// The op graph's op names, each with its kind.
pub fn op_catalog() -> &'static BTreeMap<&'static str, OpKindName> {
    static OPS: OnceLock<BTreeMap<&'static str, OpKindName>> = OnceLock::new();
    OPS.get_or_init(|| {
        let mut ops = BTreeMap::new();
        for name in BUILTIN_MODELS {
            let model = builtin(name).expect("built-in model");
            for (op, class) in vocabulary(&model, 2, 2) {
                let kind = OpKindName::parse(class).expect("the op graph's classes parse");
                ops.entry(op).or_insert(kind);
            }
        }
        ops
    })
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
            (
                "attn_prefill",
                OpKindName::Compute(OpClass::PrefillAttention),
            ),
            ("experts", OpKindName::Compute(OpClass::GroupedGemm)),
            ("indexer_score", OpKindName::Compute(OpClass::Indexer)),
            ("router_topk", OpKindName::Compute(OpClass::Elementwise)),
            ("dispatch", OpKindName::Comm(CommKind::Dispatch)),
            ("combine", OpKindName::Comm(CommKind::Combine)),
            ("mtp_eh_proj", OpKindName::Compute(OpClass::Gemm)),
        ] {
            assert_eq!(ops.get(name), Some(&kind), "{name}");
        }
        // No name changes kind between models.
        for model in BUILTIN_MODELS {
            for (op, class) in vocabulary(&builtin(model).unwrap(), 4, 1) {
                assert_eq!(
                    ops.get(op).map(|k| k.label()),
                    OpKindName::parse(class).map(|k| k.label()),
                    "{model} {op}"
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
