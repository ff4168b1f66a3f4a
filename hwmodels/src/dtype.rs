//! Numeric formats an op computes or stores in.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A numeric format. Peak throughput and storage size depend on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    Bf16,
    Fp16,
    Fp8,
    Int8,
    Int4,
    Fp32,
}

impl DType {
    pub const ALL: [DType; 6] = [
        DType::Bf16,
        DType::Fp16,
        DType::Fp8,
        DType::Int8,
        DType::Int4,
        DType::Fp32,
    ];

    /// Position in [`DType::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Bytes per element (int4 packs two per byte).
    pub fn bytes(self) -> f64 {
        match self {
            DType::Fp32 => 4.0,
            DType::Bf16 | DType::Fp16 => 2.0,
            DType::Fp8 | DType::Int8 => 1.0,
            DType::Int4 => 0.5,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::Bf16 => "bf16",
            DType::Fp16 => "fp16",
            DType::Fp8 => "fp8",
            DType::Int8 => "int8",
            DType::Int4 => "int4",
            DType::Fp32 => "fp32",
        }
    }
}

impl std::str::FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [
            DType::Bf16,
            DType::Fp16,
            DType::Fp8,
            DType::Int8,
            DType::Int4,
            DType::Fp32,
        ]
        .into_iter()
        .find(|d| d.name() == s)
        .ok_or_else(|| format!("unknown format '{s}'; known: bf16, fp16, fp8, int8, int4, fp32"))
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
