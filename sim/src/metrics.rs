//! Streaming metrics: latency distributions in HDR histograms (percentiles without storing
//! samples), counters, and per-instance accumulators.
//!
//! Definitions (docs/metrics.md): TTFT = first token - arrival; TPOT = (e2e - TTFT) /
//! (output tokens - 1); ITL = time between consecutive token emissions of a request (one sample per
//! step that emits, however many MTP tokens it carries); e2e = finish - arrival; queueing = first
//! scheduled - arrival.

use dstwin_core::time::SimDuration;
use hdrhistogram::Histogram;
use serde::Serialize;

/// Histograms record microseconds with 3 significant digits, up to this many seconds.
const MAX_SECONDS: u64 = 7 * 24 * 3600;

/// A latency distribution.
#[derive(Clone, Debug)]
pub struct Latency {
    h: Histogram<u64>,
}

impl Default for Latency {
    fn default() -> Self {
        Latency {
            h: Histogram::new_with_bounds(1, MAX_SECONDS * 1_000_000, 3)
                .expect("valid histogram bounds"),
        }
    }
}

/// Summary of a distribution, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Latency {
    pub fn record(&mut self, d: SimDuration) {
        self.record_n(d, 1);
    }

    /// Records `n` samples of the same value (none when `n` is 0: the histogram would still
    /// move its max).
    pub fn record_n(&mut self, d: SimDuration, n: u64) {
        if n == 0 {
            return;
        }
        let us = (d.0 / 1_000).clamp(1, MAX_SECONDS * 1_000_000);
        self.h.saturating_record_n(us, n);
    }

    /// The value at quantile `q` (0 to 1) in ms; 0 with no samples.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.h.is_empty() {
            return 0.0;
        }
        self.h.value_at_quantile(q) as f64 / 1e3
    }

    pub fn summary(&self) -> Percentiles {
        if self.h.is_empty() {
            return Percentiles::default();
        }
        let ms = |us: u64| us as f64 / 1e3;
        Percentiles {
            count: self.h.len(),
            mean: self.h.mean() / 1e3,
            p50: ms(self.h.value_at_quantile(0.50)),
            p90: ms(self.h.value_at_quantile(0.90)),
            p99: ms(self.h.value_at_quantile(0.99)),
            max: ms(self.h.max()),
        }
    }
}

/// All latency distributions of a run.
#[derive(Clone, Debug, Default)]
pub struct Latencies {
    pub ttft: Latency,
    pub tpot: Latency,
    pub itl: Latency,
    pub e2e: Latency,
    pub queue: Latency,
    pub kv_transfer: Latency,
}

/// Latency summaries, milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LatencyReport {
    pub ttft_ms: Percentiles,
    pub tpot_ms: Percentiles,
    pub itl_ms: Percentiles,
    pub e2e_ms: Percentiles,
    pub queue_ms: Percentiles,
    pub kv_transfer_ms: Percentiles,
}

impl Latencies {
    pub fn report(&self) -> LatencyReport {
        LatencyReport {
            ttft_ms: self.ttft.summary(),
            tpot_ms: self.tpot.summary(),
            itl_ms: self.itl.summary(),
            e2e_ms: self.e2e.summary(),
            queue_ms: self.queue.summary(),
            kv_transfer_ms: self.kv_transfer.summary(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_from_the_histogram() {
        let mut l = Latency::default();
        for ms in 1..=100u64 {
            l.record(SimDuration::from_millis(ms));
        }
        let s = l.summary();
        assert_eq!(s.count, 100);
        assert!((s.p50 - 50.0).abs() < 0.1, "{}", s.p50);
        assert!((s.p99 - 99.0).abs() < 0.1, "{}", s.p99);
        assert!((s.mean - 50.5).abs() < 0.1);
        assert!((s.max - 100.0).abs() < 0.1);
        // Zero samples of a huge value change nothing.
        l.record_n(SimDuration::from_millis(10_000), 0);
        assert_eq!(l.summary(), s);
    }
}
