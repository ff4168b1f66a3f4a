//! Prometheus metrics under vLLM's names (REFERENCE.md, `vllm/v1/metrics/loggers.py`), so
//! dashboards built for vLLM work against `dstwin serve`. Labels: `model_name`, and `engine`
//! (the instance index) on per-instance gauges and counters.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// vLLM's bucket bounds (seconds).
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// A cumulative histogram with fixed bounds.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    inner: Mutex<(Vec<u64>, f64, u64)>,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            inner: Mutex::new((vec![0; bounds.len()], 0.0, 0)),
        }
    }

    pub fn observe(&self, v: f64) {
        let mut g = self.inner.lock().expect("histogram");
        if let Some(i) = self.bounds.iter().position(|b| v <= *b) {
            g.0[i] += 1;
        }
        g.1 += v;
        g.2 += 1;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.inner.lock().expect("histogram").2
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let g = self.inner.lock().expect("histogram");
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (b, n) in self.bounds.iter().zip(&g.0) {
            cum += n;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b}\"}} {cum}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", g.2);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", g.1);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", g.2);
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct InstanceGauges {
    running: u64,
    waiting: u64,
    kv_usage: f64,
    prefix_queries: u64,
    prefix_hits: u64,
}

/// Everything `/metrics` reports.
#[derive(Debug)]
pub struct Metrics {
    model: String,
    pub prompt_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    pub preemptions: AtomicU64,
    pub finished: AtomicU64,
    pub aborted: AtomicU64,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub tpot: Histogram,
    pub e2e: Histogram,
    instances: Mutex<Vec<InstanceGauges>>,
}

impl Metrics {
    pub fn new(model: &str) -> Self {
        Metrics {
            model: model.replace(['"', '\\', '\n'], "_"),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            preemptions: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            aborted: AtomicU64::new(0),
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            tpot: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
            instances: Mutex::new(Vec::new()),
        }
    }

    /// Publishes an instance's state after a step.
    pub fn set_instance(
        &self,
        index: usize,
        running: u64,
        waiting: u64,
        kv_usage: f64,
        prefix_queries: u64,
        prefix_hits: u64,
    ) {
        let mut g = self.instances.lock().expect("gauges");
        if g.len() <= index {
            g.resize(index + 1, InstanceGauges::default());
        }
        g[index] = InstanceGauges {
            running,
            waiting,
            kv_usage,
            prefix_queries,
            prefix_hits,
        };
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let m = &self.model;
        let base = format!("model_name=\"{m}\"");
        let inst = self.instances.lock().expect("gauges").clone();
        let gauge = |out: &mut String,
                     name: &str,
                     help: &str,
                     ty: &str,
                     f: &dyn Fn(&InstanceGauges) -> String| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {ty}");
            for (i, g) in inst.iter().enumerate() {
                let _ = writeln!(out, "{name}{{{base},engine=\"{i}\"}} {}", f(g));
            }
        };
        gauge(
            &mut out,
            "vllm:num_requests_running",
            "Requests in model execution batches.",
            "gauge",
            &|g| g.running.to_string(),
        );
        gauge(
            &mut out,
            "vllm:num_requests_waiting",
            "Requests waiting to be processed.",
            "gauge",
            &|g| g.waiting.to_string(),
        );
        gauge(
            &mut out,
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            "gauge",
            &|g| g.kv_usage.to_string(),
        );
        gauge(
            &mut out,
            "vllm:prefix_cache_queries_total",
            "Prefix cache queries, in tokens.",
            "counter",
            &|g| g.prefix_queries.to_string(),
        );
        gauge(
            &mut out,
            "vllm:prefix_cache_hits_total",
            "Prefix cache hits, in tokens.",
            "counter",
            &|g| g.prefix_hits.to_string(),
        );
        for (name, help, v) in [
            (
                "vllm:prompt_tokens_total",
                "Prefill tokens processed.",
                &self.prompt_tokens,
            ),
            (
                "vllm:generation_tokens_total",
                "Generation tokens processed.",
                &self.generation_tokens,
            ),
            (
                "vllm:num_preemptions_total",
                "Cumulative number of preemptions.",
                &self.preemptions,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            let _ = writeln!(out, "{name}{{{base}}} {}", v.load(Ordering::Relaxed));
        }
        let _ = writeln!(
            out,
            "# HELP vllm:request_success_total Count of finished requests by reason.\n# TYPE vllm:request_success_total counter"
        );
        let _ = writeln!(
            out,
            "vllm:request_success_total{{{base},finished_reason=\"length\"}} {}",
            self.finished.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "vllm:request_success_total{{{base},finished_reason=\"abort\"}} {}",
            self.aborted.load(Ordering::Relaxed)
        );
        self.ttft.render(
            &mut out,
            "vllm:time_to_first_token_seconds",
            "Time to first token.",
            &base,
        );
        self.itl.render(
            &mut out,
            "vllm:inter_token_latency_seconds",
            "Inter-token latency.",
            &base,
        );
        self.tpot.render(
            &mut out,
            "vllm:time_per_output_token_seconds",
            "Time per output token (per request, after the first).",
            &base,
        );
        self.e2e.render(
            &mut out,
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency.",
            &base,
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_vllm_names_and_cumulative_buckets() {
        let m = Metrics::new("deepseek-r1");
        m.ttft.observe(0.003);
        m.ttft.observe(0.3);
        m.set_instance(0, 3, 1, 0.25, 100, 40);
        m.generation_tokens.fetch_add(7, Ordering::Relaxed);
        let t = m.render();
        assert!(t.contains("vllm:num_requests_running{model_name=\"deepseek-r1\",engine=\"0\"} 3"));
        assert!(
            t.contains("vllm:kv_cache_usage_perc{model_name=\"deepseek-r1\",engine=\"0\"} 0.25")
        );
        assert!(t.contains("vllm:generation_tokens_total{model_name=\"deepseek-r1\"} 7"));
        assert!(t.contains(
            "vllm:time_to_first_token_seconds_bucket{model_name=\"deepseek-r1\",le=\"0.005\"} 1"
        ));
        assert!(t.contains(
            "vllm:time_to_first_token_seconds_bucket{model_name=\"deepseek-r1\",le=\"0.5\"} 2"
        ));
        assert!(t.contains("vllm:time_to_first_token_seconds_count{model_name=\"deepseek-r1\"} 2"));
        assert!(t.contains("vllm:prefix_cache_hits_total"));
    }
}
