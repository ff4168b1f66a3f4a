//! Transformations of a workload: stretch or compress time, retarget the request rate, keep the
//! first requests or a time window. Each consumes the workload, validates its parameter (errors
//! name the parameter and its value) and records itself in [`Workload::source`].

use crate::error::{positive_finite, TraceError};
use crate::workload::Workload;

const NS_PER_S: f64 = 1e9;

impl Workload {
    /// Multiplies every inter-arrival gap by `time_scale` (2.0 = twice as slow, half the rate);
    /// the first arrival stays where it is. Lengths and order are unchanged.
    pub fn scale_time(self, time_scale: f64) -> Result<Workload, TraceError> {
        positive_finite("time_scale", time_scale)?;
        let note = format!("time_scale={time_scale}");
        self.stretch(time_scale, &note, "time_scale", time_scale)
    }

    /// Rescales time so that the mean request rate ([`Workload::mean_rate_per_s`]) becomes
    /// `rate_per_s`. Fails when the workload has no rate (one request, or all at the same time).
    pub fn scale_to_rate(self, rate_per_s: f64) -> Result<Workload, TraceError> {
        positive_finite("rate", rate_per_s)?;
        let Some(current) = self.mean_rate_per_s() else {
            return Err(TraceError::invalid(
                "rate",
                rate_per_s,
                format!(
                    "the workload's {} arrival(s) span zero time, so it has no rate to scale",
                    self.len()
                ),
            ));
        };
        let note = format!("rate={rate_per_s}/s");
        self.stretch(current / rate_per_s, &note, "rate", rate_per_s)
    }

    /// Multiplies every arrival's offset from the first by `factor` (finite, > 0). Scaling the
    /// offset rather than each gap keeps rounding from accumulating.
    fn stretch(
        self,
        factor: f64,
        note: &str,
        field: &str,
        value: f64,
    ) -> Result<Workload, TraceError> {
        let first = self.first_arrival_ns();
        let room = (u64::MAX - first) as f64;
        self.map_arrivals(note, |arrival| {
            let scaled = ((arrival - first) as f64 * factor).round();
            if scaled >= room {
                return Err(TraceError::invalid(
                    field,
                    value,
                    "stretches arrivals beyond the u64 nanosecond clock (about 584 years)",
                ));
            }
            Ok(first + scaled as u64)
        })
    }

    /// Keeps the first `max_requests` requests by arrival order.
    pub fn truncate_requests(self, max_requests: usize) -> Result<Workload, TraceError> {
        if max_requests == 0 {
            return Err(TraceError::invalid(
                "max_requests",
                max_requests,
                "must be at least 1",
            ));
        }
        if max_requests >= self.len() {
            return Ok(self);
        }
        let kept = self.requests()[..max_requests].to_vec();
        self.with_requests(kept, &format!("first {max_requests} requests"))
    }

    /// Keeps the requests that arrive within `window_ns` of the first arrival
    /// (`arrival - first < window_ns`). The first request is always kept.
    pub fn truncate_duration(self, window_ns: u64) -> Result<Workload, TraceError> {
        if window_ns == 0 {
            return Err(TraceError::invalid(
                "max_duration_ns",
                window_ns,
                "must be at least 1",
            ));
        }
        let first = self.first_arrival_ns();
        let n = self
            .requests()
            .partition_point(|r| r.arrival_ns - first < window_ns);
        if n == self.len() {
            return Ok(self);
        }
        let kept = self.requests()[..n].to_vec();
        let note = format!("first {}s", window_ns as f64 / NS_PER_S);
        self.with_requests(kept, &note)
    }
}
