//! Summary statistics of a workload, for reports and for checking that a transformation did
//! what was meant.

use crate::workload::Workload;
use serde::Serialize;
use std::collections::HashSet;
use std::fmt;

/// What a workload looks like at a glance.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WorkloadStats {
    /// Number of requests.
    pub requests: u64,
    /// Seconds between the first and the last arrival.
    pub span_s: f64,
    /// Mean request rate in requests per second, `(requests - 1) / span_s`; `None` when the
    /// span is zero.
    pub mean_rate_per_s: Option<f64>,
    /// Prompt lengths, in tokens.
    pub input: LengthSummary,
    /// Output lengths, in tokens.
    pub output: LengthSummary,
    /// Share of all prompt tokens that sit in a prefix an earlier request already sent: the
    /// prefix-cache hit rate of an unbounded cache replaying the workload in arrival order.
    /// `None` when the workload carries no hash ids.
    pub prefix_reuse_share: Option<f64>,
}

/// The `q` quantile (0..1) of `sorted` values by linear interpolation between order statistics
/// (numpy's default, as `vllm bench serve` computes its percentiles): the median of an even
/// count is the mean of the middle two. NaN for none. The one interpolating quantile of the
/// project: the simulator's uncertainty intervals, the trace fits' spreads and bench-serve's
/// percentiles take it ([`LengthSummary`]'s are nearest-rank, as workload summaries state them).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    let Some(last) = sorted.len().checked_sub(1) else {
        return f64::NAN;
    };
    let pos = q.clamp(0.0, 1.0) * last as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// Distribution of one length over a workload. Percentiles are nearest-rank: the smallest value
/// with at least that share of requests at or below it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LengthSummary {
    pub mean: f64,
    pub min: u32,
    pub p50: u32,
    pub p90: u32,
    pub p99: u32,
    pub max: u32,
    /// Sum over all requests.
    pub total: u64,
}

impl LengthSummary {
    fn of(mut values: Vec<u32>) -> LengthSummary {
        values.sort_unstable();
        let total: u64 = values.iter().map(|&v| u64::from(v)).sum();
        let n = values.len();
        let rank = |p: f64| values[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
        LengthSummary {
            mean: total as f64 / n as f64,
            min: values[0],
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            max: values[n - 1],
            total,
        }
    }
}

impl Workload {
    /// Summary statistics of this workload.
    pub fn stats(&self) -> WorkloadStats {
        let requests = self.requests();
        WorkloadStats {
            requests: requests.len() as u64,
            span_s: self.span_ns() as f64 * 1e-9,
            mean_rate_per_s: self.mean_rate_per_s(),
            input: LengthSummary::of(requests.iter().map(|r| r.input_tokens).collect()),
            output: LengthSummary::of(requests.iter().map(|r| r.output_tokens).collect()),
            prefix_reuse_share: self.prefix_reuse_share(),
        }
    }

    /// See [`WorkloadStats::prefix_reuse_share`]. Hash ids are chained (an id stands for its
    /// whole prefix), so a request reuses the leading run of its ids seen before.
    fn prefix_reuse_share(&self) -> Option<f64> {
        let block = u64::from(self.hash_block_tokens()?);
        if self.requests().iter().all(|r| r.hash_id_count() == 0) {
            return None;
        }
        // Only membership is asked of the set, never its order: results stay deterministic.
        let mut seen = HashSet::new();
        let (mut reused, mut total) = (0_u64, 0_u64);
        for r in self.requests() {
            let ids = self.hash_ids(r);
            let hits = ids.iter().take_while(|id| seen.contains(*id)).count() as u64;
            reused += (hits * block).min(u64::from(r.input_tokens));
            total += u64::from(r.input_tokens);
            seen.extend(ids.iter().copied());
        }
        Some(reused as f64 / total as f64)
    }
}

impl fmt::Display for WorkloadStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "requests      {}", self.requests)?;
        write!(f, "span          {:.3} s", self.span_s)?;
        match self.mean_rate_per_s {
            Some(rate) => writeln!(f, " ({rate:.3} req/s)")?,
            None => writeln!(f, " (no rate: all at once)")?,
        }
        for (name, l) in [("input", &self.input), ("output", &self.output)] {
            writeln!(
                f,
                "{name:<13} mean {:.1}, min {}, p50 {}, p90 {}, p99 {}, max {}, total {}",
                l.mean, l.min, l.p50, l.p90, l.p99, l.max, l.total
            )?;
        }
        match self.prefix_reuse_share {
            Some(share) => writeln!(f, "prefix reuse  {:.1}% of prompt tokens", share * 100.0),
            None => writeln!(f, "prefix reuse  n/a (no hash ids)"),
        }
    }
}
