//! Linear layers: dense weights in the compute dtype, or W8A8.
//!
//! W8A8 here is the scheme vLLM-Ascend and most INT8 serving stacks use for DeepSeek: weights
//! per-channel symmetric INT8 (one f32 scale per output channel, `max|w| / 127`), activations
//! quantized on the fly per token, symmetric (`max|x| / 127` per row), the product accumulated
//! in i32 and rescaled by both scales.

use candle_core::{DType, Device, Result, Tensor};

/// A weight `[out, in]` in INT8 with one scale per output channel.
#[derive(Clone, Debug)]
pub struct QLinear {
    pub out_dim: usize,
    pub in_dim: usize,
    /// Row-major `[out, in]`.
    pub weight: Vec<i8>,
    pub scale: Vec<f32>,
}

/// A projection `y = x W^T` (no bias: DeepSeek's projections have none).
#[derive(Clone, Debug)]
pub enum Linear {
    /// `[out, in]` in the compute dtype.
    Dense(Tensor),
    W8A8(QLinear),
}

/// Symmetric INT8 of one row: the values and their scale.
pub fn quantize_row(row: &[f32], out: &mut [i8]) -> f32 {
    let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = if amax > 0.0 { amax / 127.0 } else { 1.0 };
    for (o, v) in out.iter_mut().zip(row) {
        *o = (v / scale).round().clamp(-127.0, 127.0) as i8;
    }
    scale
}

impl QLinear {
    /// Quantizes a dense `[out, in]` weight per output channel.
    pub fn quantize(w: &Tensor) -> Result<QLinear> {
        let (out_dim, in_dim) = w.dims2()?;
        let rows = w.to_dtype(DType::F32)?.to_vec2::<f32>()?;
        let mut weight = vec![0i8; out_dim * in_dim];
        let scale = rows
            .iter()
            .zip(weight.chunks_mut(in_dim))
            .map(|(r, q)| quantize_row(r, q))
            .collect();
        Ok(QLinear {
            out_dim,
            in_dim,
            weight,
            scale,
        })
    }

    /// The weight as the f32 values it stands for.
    pub fn dequantize(&self, dev: &Device) -> Result<Tensor> {
        let v: Vec<f32> = self
            .weight
            .chunks(self.in_dim)
            .zip(&self.scale)
            .flat_map(|(r, s)| r.iter().map(move |&q| q as f32 * s))
            .collect();
        Tensor::from_vec(v, (self.out_dim, self.in_dim), dev)
    }

    /// `x [tokens, in]` -> `[tokens, out]` in `x`'s dtype: per-token INT8 activations, i32
    /// accumulation.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let rows = x.to_dtype(DType::F32)?.to_vec2::<f32>()?;
        let mut xq = vec![0i8; self.in_dim];
        let mut out = Vec::with_capacity(rows.len() * self.out_dim);
        for r in &rows {
            let xs = quantize_row(r, &mut xq);
            for (w, ws) in self.weight.chunks(self.in_dim).zip(&self.scale) {
                let acc: i32 = w.iter().zip(&xq).map(|(&a, &b)| a as i32 * b as i32).sum();
                out.push(acc as f32 * xs * ws);
            }
        }
        Tensor::from_vec(out, (rows.len(), self.out_dim), x.device())?.to_dtype(x.dtype())
    }
}

impl Linear {
    /// `x [tokens, in]` -> `[tokens, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Linear::Dense(w) => x.matmul(&w.t()?),
            Linear::W8A8(q) => q.forward(x),
        }
    }

    pub fn out_dim(&self) -> usize {
        match self {
            Linear::Dense(w) => w.dims()[0],
            Linear::W8A8(q) => q.out_dim,
        }
    }

    /// The weight in f32 (dequantized under W8A8).
    pub fn weight_f32(&self) -> Result<Tensor> {
        match self {
            Linear::Dense(w) => w.to_dtype(DType::F32),
            Linear::W8A8(q) => q.dequantize(&Device::Cpu),
        }
    }

    /// A copy in storage of its own.
    pub fn deep_copy(&self) -> Result<Linear> {
        Ok(match self {
            Linear::Dense(w) => Linear::Dense(w.copy()?),
            Linear::W8A8(q) => Linear::W8A8(q.clone()),
        })
    }

    /// Bytes of the weight (with its scales under W8A8).
    pub fn bytes(&self) -> usize {
        match self {
            Linear::Dense(w) => w.elem_count() * w.dtype().size_in_bytes(),
            Linear::W8A8(q) => q.weight.len() + 4 * q.scale.len(),
        }
    }

    /// This layer in W8A8 (unchanged if it already is).
    pub fn to_w8a8(&self) -> Result<Linear> {
        Ok(match self {
            Linear::Dense(w) => Linear::W8A8(QLinear::quantize(w)?),
            q => q.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn w8a8_matmul_is_close_to_f32() -> Result<()> {
        let dev = Device::Cpu;
        let w: Vec<f32> = (0..64 * 48)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.1)
            .collect();
        let x: Vec<f32> = (0..5 * 48)
            .map(|i| (i * 104729 % 997) as f32 / 498.5 - 1.0)
            .collect();
        let w = Tensor::from_vec(w, (64, 48), &dev)?;
        let x = Tensor::from_vec(x, (5, 48), &dev)?;
        let exact = Linear::Dense(w.clone()).forward(&x)?;
        let q = Linear::Dense(w).to_w8a8()?.forward(&x)?;
        let err = (exact.clone() - q)?.abs()?.max_all()?.to_scalar::<f32>()?;
        let scale = exact.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(
            err < 0.02 * scale,
            "max error {err} vs output scale {scale}"
        );
        Ok(())
    }

    #[test]
    fn quantized_rows_round_trip_within_half_a_step() {
        let row = [0.5f32, -1.27, 0.0, 1.0];
        let mut q = [0i8; 4];
        let s = quantize_row(&row, &mut q);
        assert_eq!(q[1], -127);
        for (v, q) in row.iter().zip(q) {
            assert!((v - q as f32 * s).abs() <= s / 2.0 + 1e-7);
        }
    }
}
