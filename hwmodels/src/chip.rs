//! Accelerator chips: peak throughput per format, HBM size and bandwidth, per die.

use crate::dtype::DType;
use crate::error::{check_range, invalid, HwError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One accelerator package type. Figures are per die: a 910C package has two dies, and
/// vllm-ascend's TP/DP/EP sizes count dies.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Chip {
    /// Catalog key, e.g. `ascend-910c`.
    pub name: String,
    pub vendor: String,
    /// Dies per package ("card", "NPU"): 2 for the 910C, 1 otherwise.
    pub dies_per_package: u32,
    /// Dense peak TFLOPS (or TOPS for integer formats) per die, by format.
    pub peak_tflops: BTreeMap<DType, f64>,
    /// HBM capacity per die, GB (10^9 bytes).
    pub hbm_gb: f64,
    /// HBM bandwidth per die, TB/s.
    pub hbm_tb_s: f64,
    /// Where the figures come from.
    pub source: String,
}

impl Chip {
    /// Peak FLOP/s per die for a format; formats the chip has no fast path for run at the
    /// nearest wider format it has (e.g. fp8 on Ascend runs as bf16).
    pub fn peak_flops(&self, dtype: DType) -> f64 {
        let order: &[DType] = match dtype {
            DType::Int4 => &[DType::Int4, DType::Int8, DType::Bf16],
            DType::Int8 => &[DType::Int8, DType::Bf16],
            DType::Fp8 => &[DType::Fp8, DType::Bf16],
            DType::Fp16 => &[DType::Fp16, DType::Bf16],
            DType::Bf16 => &[DType::Bf16, DType::Fp16],
            DType::Fp32 => &[DType::Fp32, DType::Bf16],
        };
        for d in order {
            if let Some(t) = self.peak_tflops.get(d) {
                return t * 1e12;
            }
        }
        // validate() guarantees bf16 is present.
        self.peak_tflops[&DType::Bf16] * 1e12
    }

    pub fn hbm_bytes(&self) -> f64 {
        self.hbm_gb * 1e9
    }

    pub fn hbm_bytes_per_s(&self) -> f64 {
        self.hbm_tb_s * 1e12
    }

    pub fn validate(&self, file: &str) -> Result<(), HwError> {
        let f = |field: &str| format!("chip.{field}");
        if self.dies_per_package == 0 {
            return Err(invalid(
                file,
                f("dies_per_package"),
                0,
                "must be at least 1",
            ));
        }
        if !self.peak_tflops.contains_key(&DType::Bf16) {
            return Err(invalid(file, f("peak_tflops"), "{..}", "must list bf16"));
        }
        for (d, t) in &self.peak_tflops {
            check_range(
                file,
                f(&format!("peak_tflops.{d}")),
                *t,
                (1e-3, 1e6),
                "0.001 to 1,000,000 TFLOPS per die",
            )?;
        }
        check_range(
            file,
            f("hbm_gb"),
            self.hbm_gb,
            (1e-3, 1e6),
            "0.001 to 1,000,000 GB per die",
        )?;
        check_range(
            file,
            f("hbm_tb_s"),
            self.hbm_tb_s,
            (1e-3, 1e3),
            "0.001 to 1,000 TB/s per die",
        )?;
        Ok(())
    }
}
