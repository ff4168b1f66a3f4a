//! Distributions of token counts, and the seeded sampler that draws (input, output) pairs.

use crate::error::{non_negative_finite, positive_finite, TraceError};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, LogNormal, Normal};

use super::{stream_rng, STREAM_INPUT_LENGTHS, STREAM_OUTPUT_LENGTHS};

/// A validated distribution of token counts. Every draw is rounded to the nearest integer and
/// clamped to `[min, max]` (by default `[1, u32::MAX]`), so a draw is always at least 1.
///
/// Clamping moves the mass beyond a bound onto the bound (it does not redraw), so a clamp that
/// cuts deep into a distribution raises the count of requests at exactly that length.
#[derive(Clone, Debug, PartialEq)]
pub struct LengthDist {
    shape: Shape,
    min: u32,
    max: u32,
}

#[derive(Clone, Debug, PartialEq)]
enum Shape {
    Fixed(u32),
    Uniform { low: u32, high: u32 },
    Normal(Normal<f64>),
    LogNormal(LogNormal<f64>),
}

impl LengthDist {
    /// Always `value` tokens (at least 1).
    pub fn fixed(value: u32) -> Result<LengthDist, TraceError> {
        at_least_one("value", value)?;
        Ok(LengthDist::unclamped(Shape::Fixed(value)))
    }

    /// Uniform over the integers `min..=max` (1 <= min <= max).
    pub fn uniform(min: u32, max: u32) -> Result<LengthDist, TraceError> {
        at_least_one("min", min)?;
        ordered(min, max)?;
        Ok(LengthDist::unclamped(Shape::Uniform {
            low: min,
            high: max,
        }))
    }

    /// Normal with the given mean (> 0) and standard deviation (>= 0), in tokens.
    pub fn normal(mean: f64, std: f64) -> Result<LengthDist, TraceError> {
        positive_finite("mean", mean)?;
        non_negative_finite("std", std)?;
        let normal = Normal::new(mean, std).expect("mean finite, std finite and >= 0");
        Ok(LengthDist::unclamped(Shape::Normal(normal)))
    }

    /// Log-normal whose *lengths* have the given mean (> 0) and standard deviation (>= 0), in
    /// tokens (before rounding and clamping). The parameters of the underlying normal are
    /// `sigma^2 = ln(1 + std^2 / mean^2)` and `mu = ln(mean) - sigma^2 / 2`.
    pub fn lognormal(mean: f64, std: f64) -> Result<LengthDist, TraceError> {
        positive_finite("mean", mean)?;
        non_negative_finite("std", std)?;
        let sigma2 = (std / mean).powi(2).ln_1p();
        LengthDist::lognormal_mu_sigma(mean.ln() - sigma2 / 2.0, sigma2.sqrt())
    }

    /// Log-normal given the mean `mu` and standard deviation `sigma` (>= 0) of the logarithm of
    /// the length: the median length is `exp(mu)`.
    pub fn lognormal_mu_sigma(mu: f64, sigma: f64) -> Result<LengthDist, TraceError> {
        if !mu.is_finite() {
            return Err(TraceError::invalid("mu", mu, "must be a finite number"));
        }
        non_negative_finite("sigma", sigma)?;
        let lognormal = LogNormal::new(mu, sigma).expect("mu finite, sigma finite and >= 0");
        Ok(LengthDist::unclamped(Shape::LogNormal(lognormal)))
    }

    /// Restricts draws to `[min, max]`; either bound may be left open. Bounds must be at least 1
    /// and `min <= max`.
    pub fn clamped(self, min: Option<u32>, max: Option<u32>) -> Result<LengthDist, TraceError> {
        let min = match min {
            Some(m) => at_least_one("min", m)?,
            None => self.min,
        };
        let max = match max {
            Some(m) => at_least_one("max", m)?,
            None => self.max,
        };
        ordered(min, max)?;
        Ok(LengthDist { min, max, ..self })
    }

    /// The smallest length a draw can have.
    pub fn min(&self) -> u32 {
        self.min
    }

    /// The largest length a draw can have.
    pub fn max(&self) -> u32 {
        self.max
    }

    /// Draws one length, in `[self.min(), self.max()]`.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> u32 {
        let x = match &self.shape {
            Shape::Fixed(v) => return (*v).clamp(self.min, self.max),
            Shape::Uniform { low, high } => {
                return rng.random_range(*low..=*high).clamp(self.min, self.max)
            }
            Shape::Normal(d) => d.sample(rng),
            Shape::LogNormal(d) => d.sample(rng),
        };
        // `as` saturates, and the clamp keeps the bounds; a NaN cannot come from these shapes.
        x.round().clamp(f64::from(self.min), f64::from(self.max)) as u32
    }

    fn unclamped(shape: Shape) -> LengthDist {
        LengthDist {
            shape,
            min: 1,
            max: u32::MAX,
        }
    }
}

fn at_least_one(field: &str, value: u32) -> Result<u32, TraceError> {
    if value == 0 {
        return Err(TraceError::invalid(
            field,
            value,
            "must be at least 1 token",
        ));
    }
    Ok(value)
}

fn ordered(min: u32, max: u32) -> Result<(), TraceError> {
    if min > max {
        return Err(TraceError::invalid(
            "max",
            max,
            format!("must be at least min ({min})"),
        ));
    }
    Ok(())
}

/// The prompt and output length of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestLengths {
    pub input_tokens: u32,
    pub output_tokens: u32,
}

/// Draws (input, output) length pairs on demand, deterministically for a seed: a closed-loop
/// driver asks for the next pair whenever a request finishes.
///
/// Input and output lengths come from separate streams of the seed, so changing one
/// distribution does not change the draws of the other; an open-loop synthetic workload with
/// the same seed and distributions has the same lengths in the same order.
#[derive(Clone, Debug)]
pub struct LengthSampler {
    input: LengthDist,
    output: LengthDist,
    input_rng: ChaCha8Rng,
    output_rng: ChaCha8Rng,
}

impl LengthSampler {
    pub fn new(input: LengthDist, output: LengthDist, seed: u64) -> LengthSampler {
        LengthSampler {
            input,
            output,
            input_rng: stream_rng(seed, STREAM_INPUT_LENGTHS),
            output_rng: stream_rng(seed, STREAM_OUTPUT_LENGTHS),
        }
    }

    /// The next request's lengths.
    pub fn next_lengths(&mut self) -> RequestLengths {
        RequestLengths {
            input_tokens: self.input.sample(&mut self.input_rng),
            output_tokens: self.output.sample(&mut self.output_rng),
        }
    }
}

impl Iterator for LengthSampler {
    type Item = RequestLengths;

    /// Never ends: a sampler draws as many pairs as asked for.
    fn next(&mut self) -> Option<RequestLengths> {
        Some(self.next_lengths())
    }
}
