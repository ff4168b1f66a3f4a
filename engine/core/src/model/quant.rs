//! Quantization schemes: the format each weight group is stored in and computes in.

use dstwin_hwmodels::DType;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A deployment's quantization scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Quant {
    /// Everything in bf16.
    Bf16,
    /// INT8 weights and dynamic per-token INT8 activations for every linear layer (vllm-ascend
    /// "A8W8 dynamic"); embeddings, LM head and the attention core stay bf16.
    W8a8,
    /// INT4 routed/shared experts with INT8 activations; other linear layers as w8a8.
    W4a8,
    /// FP8 (e4m3, block-scaled) linear layers, DeepSeek's native format.
    Fp8,
}

pub const QUANTS: &[&str] = &["bf16", "w8a8", "w4a8", "fp8"];

impl FromStr for Quant {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "bf16" => Ok(Quant::Bf16),
            "w8a8" | "int8" | "a8w8" => Ok(Quant::W8a8),
            "w4a8" => Ok(Quant::W4a8),
            "fp8" => Ok(Quant::Fp8),
            _ => Err(format!(
                "unknown quantization '{s}'; known: {}",
                QUANTS.join(", ")
            )),
        }
    }
}

impl fmt::Display for Quant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Quant::Bf16 => "bf16",
            Quant::W8a8 => "w8a8",
            Quant::W4a8 => "w4a8",
            Quant::Fp8 => "fp8",
        })
    }
}

impl Quant {
    /// Storage of the linear layers outside the experts (attention projections, dense FFN).
    pub fn linear_weight(self) -> DType {
        match self {
            Quant::Bf16 => DType::Bf16,
            Quant::W8a8 | Quant::W4a8 => DType::Int8,
            Quant::Fp8 => DType::Fp8,
        }
    }
    /// Storage of expert weights.
    pub fn expert_weight(self) -> DType {
        match self {
            Quant::W4a8 => DType::Int4,
            q => q.linear_weight(),
        }
    }
    /// The format linear-layer math runs in.
    pub fn linear_compute(self) -> DType {
        match self {
            Quant::Bf16 => DType::Bf16,
            Quant::W8a8 | Quant::W4a8 => DType::Int8,
            Quant::Fp8 => DType::Fp8,
        }
    }
    /// The format expert math is priced in: that of the other linear layers, except int4
    /// weights, whose grouped matmul is a kernel of its own (unpacking them to int8 where the
    /// chip has no int4 path).
    pub fn expert_compute(self) -> DType {
        match self {
            Quant::W4a8 => DType::Int4,
            q => q.linear_compute(),
        }
    }
    /// Embeddings and LM head stay in bf16 in every shipped checkpoint.
    pub fn embedding(self) -> DType {
        DType::Bf16
    }
    /// Bytes per element of a dispatched activation (quantized before dispatch except in bf16);
    /// per-token scales are added by the op graph.
    pub fn dispatch(self) -> DType {
        match self {
            Quant::Bf16 => DType::Bf16,
            Quant::W8a8 | Quant::W4a8 => DType::Int8,
            Quant::Fp8 => DType::Fp8,
        }
    }
}
