//! Rotary position embedding of the MLA rope part, with YaRN scaling as HF's `rope_scaling`
//! (type `yarn`) describes it and HF's `_compute_yarn_parameters` computes it.
//!
//! DeepSeek stores the rope dims as interleaved pairs `(x0, x1), (x2, x3), ...`; each pair is
//! rotated by one frequency and the result is laid out de-interleaved (all first halves, then
//! all second halves), as HF's `apply_rotary_pos_emb_interleave` does. Queries and cached keys
//! use the same layout, so their dot products are those of the interleaved rotation.

use crate::config::{yarn_mscale, EngineConfig, Yarn};
use candle_core::{DType, Device, Result, Tensor, D};

/// Inverse frequencies and the factor cos/sin are multiplied by.
#[derive(Clone, Debug)]
pub struct Rope {
    pub inv_freq: Vec<f32>,
    pub attention_factor: f32,
}

impl Rope {
    pub fn new(cfg: &EngineConfig) -> Rope {
        Rope::with(cfg.qk_rope_dim, cfg.rope_theta, cfg.rope_scaling.as_ref())
    }

    /// `dim` rotary dims, base `theta`, optional YaRN. Computed in f32 as torch does.
    pub fn with(dim: usize, theta: f64, yarn: Option<&Yarn>) -> Rope {
        let half = dim / 2;
        let pos_freqs: Vec<f32> = (0..half)
            .map(|i| (theta as f32).powf((2 * i) as f32 / dim as f32))
            .collect();
        let Some(y) = yarn else {
            return Rope {
                inv_freq: pos_freqs.iter().map(|p| 1.0 / p).collect(),
                attention_factor: 1.0,
            };
        };
        let attention_factor = if y.mscale != 0.0 && y.mscale_all_dim != 0.0 {
            yarn_mscale(y.factor, y.mscale) / yarn_mscale(y.factor, y.mscale_all_dim)
        } else {
            yarn_mscale(y.factor, 1.0)
        };
        let correction_dim = |rot: f64| {
            (dim as f64
                * (y.original_max_position_embeddings as f64 / (rot * 2.0 * std::f64::consts::PI))
                    .ln())
                / (2.0 * theta.ln())
        };
        let low = correction_dim(y.beta_fast).floor().max(0.0);
        let high = correction_dim(y.beta_slow).ceil().min(dim as f64 - 1.0);
        let (low, high) = (
            low as f32,
            if low == high { high + 0.001 } else { high } as f32,
        );
        let inv_freq = pos_freqs
            .iter()
            .enumerate()
            .map(|(i, &p)| {
                let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                let extrapolation = 1.0 - ramp;
                let inter = 1.0 / (y.factor as f32 * p);
                let extra = 1.0 / p;
                inter * (1.0 - extrapolation) + extra * extrapolation
            })
            .collect();
        Rope {
            inv_freq,
            attention_factor: attention_factor as f32,
        }
    }

    /// cos and sin, `[positions, dim / 2]`, times the attention factor, in `dtype`.
    pub fn tables(
        &self,
        positions: &[usize],
        dtype: DType,
        dev: &Device,
    ) -> Result<(Tensor, Tensor)> {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for &f in &self.inv_freq {
                let a = p as f32 * f;
                cos.push(a.cos() * self.attention_factor);
                sin.push(a.sin() * self.attention_factor);
            }
        }
        let shape = (positions.len(), half);
        Ok((
            Tensor::from_vec(cos, shape, dev)?.to_dtype(dtype)?,
            Tensor::from_vec(sin, shape, dev)?.to_dtype(dtype)?,
        ))
    }
}

/// Rotates `x` `[tokens, heads, dim]` (interleaved pairs) by `cos`/`sin` `[tokens, dim / 2]`;
/// the result is de-interleaved (see the module docs).
pub fn apply(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let (t, h, d) = x.dims3()?;
    let pairs = x.reshape((t, h, d / 2, 2))?;
    let x1 = pairs.narrow(D::Minus1, 0, 1)?.squeeze(D::Minus1)?;
    let x2 = pairs.narrow(D::Minus1, 1, 1)?.squeeze(D::Minus1)?;
    let cos = cos.unsqueeze(1)?;
    let sin = sin.unsqueeze(1)?;
    let a = (x1.broadcast_mul(&cos)? - x2.broadcast_mul(&sin)?)?;
    let b = (x2.broadcast_mul(&cos)? + x1.broadcast_mul(&sin)?)?;
    Tensor::cat(&[a, b], D::Minus1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yarn() -> Yarn {
        Yarn {
            factor: 40.0,
            original_max_position_embeddings: 4096,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: 1.0,
            mscale_all_dim: 1.0,
        }
    }

    #[test]
    fn without_scaling_frequencies_are_theta_powers() {
        let r = Rope::with(8, 10000.0, None);
        let want = [1.0, 0.1, 0.01, 0.001];
        for (g, w) in r.inv_freq.iter().zip(want) {
            assert!((g - w).abs() < 1e-6 * w.max(1e-3), "{g} vs {w}");
        }
        assert_eq!(r.attention_factor, 1.0);
    }

    #[test]
    fn yarn_keeps_high_frequencies_and_interpolates_low_ones() {
        // DeepSeek-V3's rope: dim 64, theta 10000, factor 40, original context 4096.
        let plain = Rope::with(64, 10000.0, None);
        let y = Rope::with(64, 10000.0, Some(&yarn()));
        // Correction range: low = floor(64 ln(4096 / (64 pi)) / (2 ln 1e4)) = 10,
        // high = ceil(64 ln(4096 / (2 pi)) / (2 ln 1e4)) = 23.
        for i in 0..=10 {
            assert_eq!(y.inv_freq[i], plain.inv_freq[i], "dim {i} extrapolated");
        }
        for i in 23..32 {
            let want = plain.inv_freq[i] / 40.0;
            assert!(
                (y.inv_freq[i] - want).abs() <= want * 1e-6,
                "dim {i} interpolated"
            );
        }
        let mid = 16;
        assert!(
            y.inv_freq[mid] < plain.inv_freq[mid] && y.inv_freq[mid] > plain.inv_freq[mid] / 40.0
        );
        // mscale == mscale_all_dim: cos/sin unscaled; the softmax scale carries mscale^2.
        assert_eq!(y.attention_factor, 1.0);
        let m = yarn_mscale(40.0, 1.0);
        assert!((m - (0.1 * 40f64.ln() + 1.0)).abs() < 1e-12);
    }

    #[test]
    fn attention_factor_is_the_mscale_ratio() {
        let mut y = yarn();
        y.mscale_all_dim = 0.8;
        let r = Rope::with(16, 10000.0, Some(&y));
        let want = yarn_mscale(40.0, 1.0) / yarn_mscale(40.0, 0.8);
        assert!((r.attention_factor as f64 - want).abs() < 1e-6);
    }

    #[test]
    fn rotation_preserves_norm_and_relative_angle() -> Result<()> {
        let dev = Device::Cpu;
        let r = Rope::with(8, 10000.0, None);
        let q: Vec<f32> = (0..8).map(|i| (i as f32 * 0.37).sin()).collect();
        let k: Vec<f32> = (0..8).map(|i| (i as f32 * 0.91).cos()).collect();
        let dot_at = |pq: usize, pk: usize| -> Result<f32> {
            let (c, s) = r.tables(&[pq, pk], DType::F32, &dev)?;
            let x = Tensor::from_vec([q.clone(), k.clone()].concat(), (2, 1, 8), &dev)?;
            let y = apply(&x, &c, &s)?.reshape((2, 8))?.to_vec2::<f32>()?;
            let n0: f32 = y[0].iter().map(|v| v * v).sum();
            let nq: f32 = q.iter().map(|v| v * v).sum();
            assert!((n0 - nq).abs() < 1e-4);
            Ok(y[0].iter().zip(&y[1]).map(|(a, b)| a * b).sum())
        };
        // Attention depends on the distance only.
        assert!((dot_at(3, 1)? - dot_at(12, 10)?).abs() < 1e-4);
        Ok(())
    }
}
