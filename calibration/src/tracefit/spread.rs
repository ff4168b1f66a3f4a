//! How far device steps land from their price: the spread the twin draws each step's kernel
//! time with (`[host] step_sigma`), and the price's bias by the step's shape.
//!
//! Per device step, the kernels with known work are summed, measured and priced (by the fitted
//! forms in a calibration, by a cost file's in a check), and the step's residual is
//! `ln(measured / priced)`. A step counts when its priced kernels carry at least
//! [`MIN_COVERAGE`] of its kernel time (else its residual would be a few small kernels').
//! Steps after idling run cold and, where their factor is fitted apart, are left out of a
//! calibration's spread: the twin draws its spread on top of the cold factor.
//!
//! A residual is two things: the forms' bias at the step's shape (the same for every step of
//! that shape: the forms are fitted kernel by kernel, and a step of one shape can come out
//! priced high while another comes out low) and the step's own variation (what the twin should
//! draw). They are told apart by grouping alike steps, decodes only or with a prompt, priced
//! within a factor of sqrt(2) of each other: a group's median residual is the bias at its shape
//! (reported, [`ShapeBias`]), and the residuals' deviations from their group's median, over the
//! groups of at least [`MIN_GROUP_STEPS`], are the variation.
//! The step's kind is read off its sequences and tokens (decodes only: as many tokens as
//! sequences), so a decode step with draft tokens to verify (MTP) counts as one with a prompt.
//!
//! The variation is told by its deciles: `sigma = (q90 - q10) / (2 x 1.2816)`, the standard
//! deviation of a normal with the same deciles. Latency reports are percentiles, so the
//! deciles are what the twin must reproduce; a standard deviation would follow the few steps a
//! profiler or the host stalled for milliseconds.

use dstwin_traces::quantile;
use serde::Serialize;
use std::collections::BTreeMap;

/// Fewest steps, in groups of at least [`MIN_GROUP_STEPS`], a spread is told from.
pub const MIN_STEPS: usize = 20;
/// Fewest steps of a group whose median stands for its shape's bias. Deviations from a
/// group's own median are narrower than from its true centre: by 7% at 5 steps, 3% at 10 and
/// 1% at 40 (normal draws), so small groups are left out rather than corrected.
pub const MIN_GROUP_STEPS: usize = 10;
/// Least share of a step's kernel time its priced kernels must carry for it to count.
pub const MIN_COVERAGE: f64 = 0.5;
/// The standard normal's 90th percentile.
const Z90: f64 = 1.281_551_565_5;

/// The forms' bias over a group of alike steps: their median `ln(measured / priced)`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ShapeBias {
    /// Whether the steps compute decodes only (`None`: the trace does not say).
    pub decode_only: Option<bool>,
    /// The group's priced kernel time per step, µs: from, to.
    pub priced_us: (f64, f64),
    pub steps: usize,
    pub median: f64,
}

/// Device steps' kernel time around its price.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepSpread {
    /// Steps counted, in groups of at least [`MIN_GROUP_STEPS`].
    pub steps: usize,
    /// Deciles of the steps' residuals less their group's median.
    pub q10: f64,
    pub q90: f64,
    /// `(q90 - q10) / (2 x 1.2816)`.
    pub sigma: f64,
    /// Per group, by kind and price.
    pub bias: Vec<ShapeBias>,
}

/// A group of alike steps: decodes only (or not, or not said) and the half-octave of the price.
type GroupKey = (Option<bool>, i64);

/// Per step by its place, `(measured µs, priced µs)` of its priced kernels, and per place the
/// time of all the step's kernels with whether it computes decodes only: the spread, or `None`
/// with fewer than [`MIN_STEPS`] steps in groups that count.
pub fn step_spread(
    priced: &BTreeMap<usize, (f64, f64)>,
    steps: &[(f64, Option<bool>)],
) -> Option<StepSpread> {
    // Groups: decodes only or not, and the half-octave of the price.
    let mut groups: BTreeMap<GroupKey, Vec<(f64, f64)>> = BTreeMap::new();
    for (&i, &(m, p)) in priced {
        let Some(&(kernel_us, decode_only)) = steps.get(i) else {
            continue;
        };
        let r = (m / p).ln();
        if m > 0.0 && p > 0.0 && m >= MIN_COVERAGE * kernel_us && r.is_finite() {
            let octave = (2.0 * p.log2()).floor() as i64;
            groups
                .entry((decode_only, octave))
                .or_default()
                .push((r, p));
        }
    }
    let mut dev = Vec::new();
    let mut bias = Vec::new();
    for ((decode_only, _), mut v) in groups {
        if v.len() < MIN_GROUP_STEPS {
            continue;
        }
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        let r: Vec<f64> = v.iter().map(|x| x.0).collect();
        let median = quantile(&r, 0.5);
        dev.extend(r.iter().map(|x| x - median));
        let lo = v.iter().map(|x| x.1).fold(f64::INFINITY, f64::min);
        let hi = v.iter().map(|x| x.1).fold(0.0, f64::max);
        bias.push(ShapeBias {
            decode_only,
            priced_us: (lo, hi),
            steps: v.len(),
            median,
        });
    }
    if dev.len() < MIN_STEPS {
        return None;
    }
    dev.sort_by(f64::total_cmp);
    let (q10, q90) = (quantile(&dev, 0.1), quantile(&dev, 0.9));
    Some(StepSpread {
        steps: dev.len(),
        q10,
        q90,
        sigma: (q90 - q10) / (2.0 * Z90),
        bias,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spread_is_the_variation_within_groups_of_alike_steps_not_their_bias() {
        // Two kinds of step, each priced 100 µs: decodes priced 30% high, prompts 20% low
        // (a bias of the forms at each shape), and within each 101 steps evenly from -0.5 to
        // 0.5 in logs around it (deciles at -0.4 and 0.4).
        let mut priced = BTreeMap::new();
        let mut steps = Vec::new();
        for (kind, bias) in [(true, (1.0f64 / 1.3).ln()), (false, 0.2f64.ln_1p())] {
            for k in 0..101 {
                let m = 100.0 * (bias + k as f64 / 100.0 - 0.5).exp();
                priced.insert(steps.len(), (m, 100.0));
                steps.push((m, Some(kind)));
            }
        }
        // A step whose priced kernels are a sliver of it does not count, however far off, nor
        // does a group of fewer than MIN_GROUP_STEPS.
        priced.insert(steps.len(), (1.0, 100.0));
        steps.push((1000.0, Some(true)));
        for _ in 0..MIN_GROUP_STEPS - 1 {
            priced.insert(steps.len(), (1e4, 1e4));
            steps.push((1e4, None));
        }
        let s = step_spread(&priced, &steps).unwrap();
        assert_eq!(s.steps, 202);
        assert!(
            (s.q10 + 0.4).abs() < 1e-9 && (s.q90 - 0.4).abs() < 1e-9,
            "{s:?}"
        );
        assert!((s.sigma - 0.8 / (2.0 * Z90)).abs() < 1e-9);
        let median = |d: bool| s.bias.iter().find(|b| b.decode_only == Some(d)).unwrap();
        assert!((median(true).median - (1.0f64 / 1.3).ln()).abs() < 1e-9);
        assert!((median(false).median - 0.2f64.ln_1p()).abs() < 1e-9);
        assert_eq!(s.bias.len(), 2);
        // Too few steps tell nothing.
        let few: BTreeMap<usize, (f64, f64)> =
            (0..MIN_STEPS - 1).map(|k| (k, (1.0, 1.0))).collect();
        assert!(step_spread(&few, &vec![(1.0, None); MIN_STEPS]).is_none());
    }
}
