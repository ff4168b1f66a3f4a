//! Small numeric building blocks over candle tensors.

use candle_core::{DType, Result, Tensor, D};

/// RMSNorm as HF computes it: normalize in f32, cast back, then scale by the weight.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let dtype = x.dtype();
    let xf = x.to_dtype(DType::F32)?;
    let var = xf.sqr()?.mean_keepdim(D::Minus1)?;
    let y = xf.broadcast_div(&(var + eps)?.sqrt()?)?.to_dtype(dtype)?;
    y.broadcast_mul(weight)
}

/// Softmax over the last dim (f32 in, f32 out); rows of all `-inf` give zeros.
pub fn softmax_last(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?;
    let e = x.broadcast_sub(&max)?.exp()?;
    let sum = e.sum_keepdim(D::Minus1)?;
    e.broadcast_div(&sum)
}

/// Index of the largest value of each row (the first on ties).
pub fn argmax_rows(logits: &Tensor) -> Result<Vec<u32>> {
    let rows = logits.to_dtype(DType::F32)?.to_vec2::<f32>()?;
    Ok(rows
        .iter()
        .map(|r| {
            let mut best = 0;
            for (i, &v) in r.iter().enumerate() {
                if v > r[best] {
                    best = i;
                }
            }
            best as u32
        })
        .collect())
}
