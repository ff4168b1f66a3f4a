//! The work of a kernel, for the efficiency fits: FLOPs, HBM bytes, rows (the GEMM M dimension)
//! and the format its math runs in, read off the shapes of kernels mapped to the `gemm` class:
//!
//! - Kineto `Input Dims` (with `record_shapes`) and Ascend `Input Shapes`, with their data
//!   types: A = [.., M, K] (leading dimensions fold into M), B = [K, N] or [N, K] (a weight
//!   stored transposed), or both batched [b, M, K] x [b, K, N]; FLOPs 2·b·M·K·N, bytes
//!   b·(M·K·|A| + K·N·|B| + M·N·|C|) with |C| = |A| for 16- and 32-bit activations and 2 bytes
//!   (a bf16 result) for 8-bit ones; the math runs in A's format.
//! - the CPU engine's shape arguments `{"tokens": M, "k": K, "n": N}` (and `heads`, a batch of
//!   per-head GEMMs, for the absorbed attention projections); its trace does not say the format
//!   it computes in, so the caller gives it (`calibrate --dtype`), for operands and result alike.
//!
//! Other kernels (attention, grouped GEMMs, glue) carry no shapes a fit can price without the
//! model's dimensions: they are counted as "without work" in the report, not guessed. Given the
//! model (`calibrate --model`), the CPU engine's other ops get the work the op graph gives that
//! op on the batch the event describes ([`engine_op_work`]): the very numbers the twin prices.

use dstwin_core::batch::BatchShape;
use dstwin_core::model::{ModelConfig, Quant};
use dstwin_core::opgraph::op_work;
use dstwin_hwmodels::{DType, OpClass};
use dstwin_traces::profile::{elem_type, ElemType, KernelRecord, NumberKind};
use serde_json::Value;

/// A kernel's work as the fits need it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KernelWork {
    pub flops: f64,
    pub bytes: f64,
    /// GEMM M rows, when known.
    pub rows: Option<f64>,
    /// Format of the math, when known.
    pub dtype: Option<DType>,
}

/// The dstwin format of an element type (for its peak FLOP/s).
pub fn dtype_of(t: ElemType) -> Option<DType> {
    Some(match (t.kind, t.bits) {
        (NumberKind::BFloat, 16) => DType::Bf16,
        (NumberKind::Float, 16) => DType::Fp16,
        (NumberKind::Float, 32) => DType::Fp32,
        (NumberKind::Float, 8) => DType::Fp8,
        (NumberKind::Int, 8) => DType::Int8,
        (NumberKind::Int, 4) => DType::Int4,
        _ => return None,
    })
}

/// The work of `k` when `gemm` says it is a GEMM and its shapes show it; `dtype` is the
/// format of the math where the trace does not say.
pub fn kernel_work(k: &KernelRecord, gemm: bool, dtype: Option<DType>) -> Option<KernelWork> {
    if !gemm {
        return None;
    }
    let text = k.shapes.as_deref()?;
    if let Ok(Value::Object(engine)) = serde_json::from_str::<Value>(text) {
        return engine_gemm_work(&engine, dtype?);
    }
    let shapes = parse_shapes(text)?;
    let types: Vec<ElemType> = parse_dtypes(k.dtypes.as_deref()?)
        .iter()
        .map(|t| elem_type(t))
        .collect::<Option<_>>()?;
    gemm_work(&shapes, &types)
}

/// The model a CPU engine trace ran, for the work of its ops that are not GEMMs.
#[derive(Clone, Debug)]
pub struct EngineModel {
    pub config: ModelConfig,
    /// The op graph's formats for the engine's numerics.
    pub quant: Quant,
}

/// The work of a CPU engine op that is not a GEMM, from its shape arguments and the model: the
/// op graph's op of that name on the batch the event describes. Attention events are one
/// sequence each (`tokens` new after `context - tokens` cached); the routed experts' `tokens`
/// are rows (tokens x top-k); every other op runs on `tokens` rows. `None` for events without
/// those arguments, or ops the graph does not price as compute.
pub fn engine_op_work(k: &KernelRecord, class: OpClass, m: &EngineModel) -> Option<KernelWork> {
    let text = k.shapes.as_deref()?;
    let Ok(Value::Object(args)) = serde_json::from_str::<Value>(text) else {
        return None;
    };
    let dim = |key: &str| args.get(key).and_then(Value::as_u64);
    let tokens = dim("tokens").filter(|t| *t > 0)?;
    let cap = m.config.attn_cap();
    let mut b = BatchShape::default();
    let mut group_tokens = tokens;
    match class {
        OpClass::Attention => b.add_decode(tokens, dim("context")?.checked_sub(tokens)?, cap),
        OpClass::PrefillAttention => {
            b.add_prefill(tokens, dim("context")?.checked_sub(tokens)?, cap)
        }
        // The CPU engine runs no tensor-parallel MoE.
        OpClass::Gemm | OpClass::Indexer | OpClass::TpGroupedGemm => return None,
        OpClass::GroupedGemm | OpClass::Elementwise => {
            if &*k.name == "experts" {
                group_tokens = tokens.div_ceil(m.config.top_k.max(1));
            }
            b = BatchShape::uniform_decode(u32::try_from(group_tokens).ok()?, 1, 0, cap);
        }
    }
    let w = op_work(&m.config, m.quant, &k.name, &b, group_tokens)?;
    (w.class == class).then_some(KernelWork {
        flops: w.flops,
        bytes: w.bytes,
        rows: (w.rows > 0.0).then_some(w.rows),
        dtype: Some(w.dtype),
    })
}

/// A GEMM as the CPU engine describes it: `tokens` x `k` by `k` x `n`, `heads` of them.
fn engine_gemm_work(args: &serde_json::Map<String, Value>, dtype: DType) -> Option<KernelWork> {
    let dim = |key: &str| {
        args.get(key)
            .and_then(Value::as_u64)
            .filter(|d| *d > 0)
            .map(|d| d as f64)
    };
    let (m, k, n) = (dim("tokens")?, dim("k")?, dim("n")?);
    let batch = dim("heads").unwrap_or(1.0);
    let e = dtype.bytes();
    Some(KernelWork {
        flops: 2.0 * batch * m * k * n,
        bytes: batch * (m * k + k * n + m * n) * e,
        rows: Some(m),
        dtype: Some(dtype),
    })
}

/// Shapes as written: a JSON list of lists (`[[4096, 7168], [7168, 2048], []]`) or Ascend's
/// `4096,7168;7168,2048` (tensors split by `;`, dimensions by `,`). `None` when unreadable.
pub fn parse_shapes(text: &str) -> Option<Vec<Vec<u64>>> {
    let t = text.trim().trim_matches('"');
    if t.starts_with('[') {
        let v: Value = serde_json::from_str(t).ok()?;
        return v
            .as_array()?
            .iter()
            .map(|s| match s {
                Value::Array(dims) => dims.iter().map(Value::as_u64).collect(),
                _ => Some(Vec::new()),
            })
            .collect();
    }
    t.split(';')
        .map(|tensor| {
            tensor
                .split(',')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .map(|d| d.parse().ok())
                .collect()
        })
        .collect()
}

/// Data types as written: a JSON list of strings or `;`-separated names.
pub fn parse_dtypes(text: &str) -> Vec<String> {
    let t = text.trim().trim_matches('"');
    if t.starts_with('[') {
        if let Ok(Value::Array(v)) = serde_json::from_str::<Value>(t) {
            return v
                .iter()
                .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_owned))
                .collect();
        }
    }
    t.split(';').map(|s| s.trim().to_owned()).collect()
}

/// The work of a GEMM from its first two inputs (module docs).
pub fn gemm_work(shapes: &[Vec<u64>], types: &[ElemType]) -> Option<KernelWork> {
    let (a, b) = (shapes.first()?, shapes.get(1)?);
    let (ta, tb) = (*types.first()?, *types.get(1).or(types.first())?);
    if a.len() < 2 || b.len() < 2 || a.contains(&0) || b.contains(&0) {
        return None;
    }
    let f = |x: u64| x as f64;
    let k_a = a[a.len() - 1];
    // B's dimension that is not K: [K, N] or a weight stored transposed, [N, K].
    let n_of = |b0: u64, b1: u64| match (b0 == k_a, b1 == k_a) {
        (true, _) => Some(f(b1)),
        (false, true) => Some(f(b0)),
        _ => None,
    };
    let (batch, m, k, n) = if b.len() == 2 {
        let m: f64 = a[..a.len() - 1].iter().map(|&x| f(x)).product();
        (1.0, m, f(k_a), n_of(b[0], b[1])?)
    } else if b.len() == 3 && a.len() == 3 && a[0] == b[0] {
        (f(a[0]), f(a[1]), f(k_a), n_of(b[1], b[2])?)
    } else {
        return None;
    };
    let c_bytes = if ta.bits >= 16 { ta.bytes() } else { 2.0 };
    Some(KernelWork {
        flops: 2.0 * batch * m * k * n,
        bytes: batch * (m * k * ta.bytes() + k * n * tb.bytes() + m * n * c_bytes),
        rows: Some(batch * m),
        dtype: dtype_of(ta),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn types(names: &[&str]) -> Vec<ElemType> {
        names.iter().map(|n| elem_type(n).unwrap()).collect()
    }

    #[test]
    fn gemm_shapes_of_both_profilers_give_the_same_work() {
        let kineto = parse_shapes("[[4096, 7168], [2048, 7168], [2048]]").unwrap();
        let ascend = parse_shapes("\"4096,7168;7168,2048\"").unwrap();
        let w1 = gemm_work(&kineto, &types(&["c10::BFloat16", "c10::BFloat16"])).unwrap();
        let w2 = gemm_work(&ascend, &types(&["DT_BF16", "DT_BF16"])).unwrap();
        assert_eq!(w1, w2);
        assert_eq!(w1.flops, 2.0 * 4096.0 * 7168.0 * 2048.0);
        assert_eq!(
            w1.bytes,
            2.0 * (4096.0 * 7168.0 + 7168.0 * 2048.0 + 4096.0 * 2048.0)
        );
        assert_eq!(w1.rows, Some(4096.0));
        assert_eq!(w1.dtype, Some(DType::Bf16));
        // Leading dimensions fold into M; int8 x int8 writes a bf16 result.
        let w = gemm_work(
            &parse_shapes("2,8,64;64,32").unwrap(),
            &types(&["INT8", "INT8"]),
        )
        .unwrap();
        assert_eq!(w.rows, Some(16.0));
        assert_eq!(w.bytes, 16.0 * 64.0 + 64.0 * 32.0 + 16.0 * 32.0 * 2.0);
        assert_eq!(w.dtype, Some(DType::Int8));
        // Batched.
        let w = gemm_work(
            &parse_shapes("[[4,8,16],[4,16,2]]").unwrap(),
            &types(&["Float", "Float"]),
        )
        .unwrap();
        assert_eq!(w.flops, 2.0 * 4.0 * 8.0 * 16.0 * 2.0);
        // Shapes that are not a GEMM.
        for s in ["8,16;32,4", "8;16", "", "[[1,2]]", "0,4;4,4"] {
            let shapes = parse_shapes(s).unwrap_or_default();
            assert!(
                gemm_work(&shapes, &types(&["BF16", "BF16"])).is_none(),
                "{s}"
            );
        }
        assert!(parse_shapes("a,b;c").is_none());
    }

    #[test]
    fn the_cpu_engines_gemm_shapes_need_the_format_it_computed_in() {
        let mut k = KernelRecord::new("q_absorb".into(), Some(0), 1000, 1);
        k.shapes = Some(r#"{"tokens":4,"heads":16,"k":128,"n":512}"#.into());
        assert!(kernel_work(&k, true, None).is_none());
        let w = kernel_work(&k, true, Some(DType::Fp32)).unwrap();
        assert_eq!(w.flops, 2.0 * 16.0 * 4.0 * 128.0 * 512.0);
        assert_eq!(
            w.bytes,
            16.0 * (4.0 * 128.0 + 128.0 * 512.0 + 4.0 * 512.0) * 4.0
        );
        assert_eq!((w.rows, w.dtype), (Some(4.0), Some(DType::Fp32)));
        // Not a GEMM's shapes (attention: context and heads, no k and n).
        k.shapes = Some(r#"{"tokens":4,"context":900,"heads":16}"#.into());
        assert!(kernel_work(&k, true, Some(DType::Fp32)).is_none());
        assert!(kernel_work(&k, false, Some(DType::Fp32)).is_none());
    }

    #[test]
    fn the_cpu_engines_other_ops_take_the_op_graphs_work_given_the_model() {
        let config = dstwin_core::model::builtin("deepseek-v3").unwrap();
        let m = EngineModel {
            config: config.clone(),
            quant: Quant::Bf16,
        };
        let cap = config.attn_cap();
        let event = |name: &str, args: &str| {
            let mut k = KernelRecord::new(name.into(), Some(0), 1000, 1);
            k.shapes = Some(args.into());
            k
        };
        // One decoding sequence: 1 new token after 899 cached ones.
        let k = event("attn_decode", r#"{"tokens":1,"context":900,"heads":128}"#);
        let w = engine_op_work(&k, OpClass::Attention, &m).unwrap();
        let mut b = BatchShape::default();
        b.add_decode(1, 899, cap);
        let g = op_work(&config, Quant::Bf16, "attn_decode", &b, 1).unwrap();
        assert_eq!(
            (w.flops, w.bytes, w.dtype),
            (g.flops, g.bytes, Some(g.dtype))
        );
        // A prompt chunk of 64 after 128 cached tokens.
        let k = event("attn_prefill", r#"{"tokens":64,"context":192,"heads":128}"#);
        let w = engine_op_work(&k, OpClass::PrefillAttention, &m).unwrap();
        let mut b = BatchShape::default();
        b.add_prefill(64, 128, cap);
        let g = op_work(&config, Quant::Bf16, "attn_prefill", &b, 64).unwrap();
        assert_eq!(w.flops, g.flops);
        // The routed experts' tokens are rows: 32 tokens routed to 8 experts each.
        let k = event("experts", r#"{"tokens":256,"experts":256}"#);
        let w = engine_op_work(&k, OpClass::GroupedGemm, &m).unwrap();
        let b = BatchShape::uniform_decode(32, 1, 0, cap);
        let g = op_work(&config, Quant::Bf16, "experts", &b, 32).unwrap();
        assert_eq!(w.flops, g.flops);
        assert_eq!(
            w.flops,
            2.0 * 256.0 * 3.0 * config.hidden as f64 * config.expert_ffn as f64
        );
        // A norm over 10 rows; a GEMM is not priced this way, nor an event without tokens,
        // nor an op whose class the event contradicts.
        let k = event("attn_norm", r#"{"tokens":10}"#);
        let w = engine_op_work(&k, OpClass::Elementwise, &m).unwrap();
        assert_eq!(w.flops, 4.0 * 10.0 * config.hidden as f64);
        assert!(engine_op_work(&k, OpClass::Gemm, &m).is_none());
        assert!(engine_op_work(&event("attn_norm", "{}"), OpClass::Elementwise, &m).is_none());
        assert!(engine_op_work(&k, OpClass::Attention, &m).is_none());
    }
}
