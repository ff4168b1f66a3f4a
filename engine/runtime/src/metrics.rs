//! Prometheus metrics under vLLM's names (vLLM's `vllm/v1/metrics/loggers.py`; docs/metrics.md), so
//! dashboards built for vLLM work against `dstwin serve`. Every series carries `model_name` and
//! `engine` (the instance index), and every engine's series exist from start-up (zeros), as
//! vLLM registers them. The names are checked against the list in
//! engine/runtime/tests/data/vllm-metric-names.txt (with its origin).
//!
//! Per request, when first admitted ([`Metrics::prompt_started`]): its prompt tokens, by source
//! (computed, or prefix-cache hits). At its end ([`Metrics::request_finished`]): e2e, queue
//! (arrival to first scheduled), prefill (scheduled to first token), decode (first to last
//! token), inference (scheduled to last token), time per output token, prompt, generation,
//! max_tokens and newly computed prompt token counts, and the finish reason (`stop`, `length`,
//! `abort`, `error`; `repetition` stays 0: no repetition detection). Once every choice of a
//! request has ended ([`Metrics::request_choices_finished`]): its `n` and the most tokens a
//! choice generated. Per step ([`Metrics::step`]): the tokens it computed
//! (`vllm:iteration_tokens_total`) and the MTP speculative-decoding counters; TTFT, ITL and
//! token counters as tokens reach clients.

use dstwin_core::device::{StepOutcome, StepPlan};
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// vLLM's bucket bounds (seconds).
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const REQUEST_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
/// Tokens per engine step (vLLM's `vllm:iteration_tokens_total` buckets).
const ITERATION_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];
/// vLLM's `n` buckets (`vllm:request_params_n`).
const N_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0];
/// vLLM's 1-2-5 series for token counts (it stops at max_model_len; this at a million).
const TOKEN_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0,
    50000.0, 100000.0, 200000.0, 500000.0, 1000000.0,
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

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let g = self.inner.lock().expect("histogram");
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
struct Gauges {
    running: u64,
    /// Waiting for a seat and KV (vLLM's `capacity`).
    waiting: u64,
    /// Waiting for their KV to arrive from a prefill instance (vLLM's `deferred`, which counts
    /// requests waiting for remote KV with them).
    pulling: u64,
    kv_usage: f64,
    prefix_queries: u64,
    prefix_hits: u64,
}

/// Why a request ended (`finished_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// All `max_tokens` were produced.
    Length,
    /// A stop string appeared in its text.
    Stop,
    /// The client went away.
    Abort,
    /// The deployment failed with it in flight.
    Error,
}

/// When a request reached each stage (what [`Metrics::request_finished`] needs).
#[derive(Clone, Copy, Debug)]
pub struct RequestTimes {
    pub arrival: Instant,
    /// First scheduled (its prefill's first chunk).
    pub scheduled: Option<Instant>,
    pub first_token: Option<Instant>,
    pub last_token: Option<Instant>,
    pub end: Instant,
    pub prompt_tokens: u32,
    /// Prompt tokens its first admission found in the prefix cache.
    pub cached_tokens: u32,
    pub max_tokens: u32,
    pub generated: u32,
}

/// One engine's (instance's) series.
#[derive(Debug)]
pub struct EngineMetrics {
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens found in the prefix cache (vLLM's source `local_cache_hit`; the rest of
    /// `prompt_tokens` were computed, `local_compute`).
    prompt_cached: AtomicU64,
    pub generation_tokens: AtomicU64,
    pub preemptions: AtomicU64,
    finished_length: AtomicU64,
    finished_stop: AtomicU64,
    aborted: AtomicU64,
    errored: AtomicU64,
    spec_drafts: AtomicU64,
    spec_draft_tokens: AtomicU64,
    spec_accepted: AtomicU64,
    /// Accepted drafts by position (0 = the first draft).
    spec_accepted_per_pos: Mutex<Vec<u64>>,
    pub ttft: Histogram,
    pub itl: Histogram,
    request_tpot: Histogram,
    e2e: Histogram,
    queue: Histogram,
    prefill: Histogram,
    decode: Histogram,
    inference: Histogram,
    request_prompt_tokens: Histogram,
    request_generation_tokens: Histogram,
    request_prefill_kv_computed: Histogram,
    request_max_tokens: Histogram,
    request_n: Histogram,
    request_max_generated: Histogram,
    iteration_tokens: Histogram,
    gauges: Mutex<Gauges>,
}

impl EngineMetrics {
    fn new() -> Self {
        EngineMetrics {
            prompt_tokens: AtomicU64::new(0),
            prompt_cached: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            preemptions: AtomicU64::new(0),
            finished_length: AtomicU64::new(0),
            finished_stop: AtomicU64::new(0),
            aborted: AtomicU64::new(0),
            errored: AtomicU64::new(0),
            spec_drafts: AtomicU64::new(0),
            spec_draft_tokens: AtomicU64::new(0),
            spec_accepted: AtomicU64::new(0),
            spec_accepted_per_pos: Mutex::new(Vec::new()),
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            request_tpot: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(REQUEST_BUCKETS),
            queue: Histogram::new(REQUEST_BUCKETS),
            prefill: Histogram::new(REQUEST_BUCKETS),
            decode: Histogram::new(REQUEST_BUCKETS),
            inference: Histogram::new(REQUEST_BUCKETS),
            request_prompt_tokens: Histogram::new(TOKEN_BUCKETS),
            request_generation_tokens: Histogram::new(TOKEN_BUCKETS),
            request_prefill_kv_computed: Histogram::new(TOKEN_BUCKETS),
            request_max_tokens: Histogram::new(TOKEN_BUCKETS),
            request_n: Histogram::new(N_BUCKETS),
            request_max_generated: Histogram::new(TOKEN_BUCKETS),
            iteration_tokens: Histogram::new(ITERATION_BUCKETS),
            gauges: Mutex::new(Gauges::default()),
        }
    }
}

/// A family of series with one label, every value's series present from the start.
struct Labelled {
    name: &'static str,
    help: &'static str,
    ty: &'static str,
    label: &'static str,
    values: &'static [&'static str],
    /// One count per value.
    counts: fn(&EngineMetrics, &Gauges) -> Vec<u64>,
}

/// Everything `/metrics` reports.
#[derive(Debug)]
pub struct Metrics {
    model: String,
    engines: Vec<EngineMetrics>,
}

impl Metrics {
    /// Series for `engines` engines (instances), all present from the start.
    pub fn new(model: &str, engines: usize) -> Self {
        Metrics {
            model: model.replace(['"', '\\', '\n'], "_"),
            engines: (0..engines.max(1)).map(|_| EngineMetrics::new()).collect(),
        }
    }

    /// Engine `i`'s series (the last engine's for an index past the end).
    pub fn engine(&self, i: usize) -> &EngineMetrics {
        &self.engines[i.min(self.engines.len() - 1)]
    }

    /// A failed deployment runs and holds nothing (every request in flight fails with it):
    /// each instance's gauges to 0, its counters kept.
    pub fn clear_gauges(&self) {
        for e in &self.engines {
            let mut g = e.gauges.lock().expect("gauges");
            g.running = 0;
            g.waiting = 0;
            g.pulling = 0;
            g.kv_usage = 0.0;
        }
    }

    /// Publishes an instance's state after a step.
    pub fn set_instance(
        &self,
        index: usize,
        st: &dstwin_core::instance::InstanceStats,
        kv_usage: f64,
    ) {
        *self.engine(index).gauges.lock().expect("gauges") = Gauges {
            running: st.running,
            waiting: st.waiting,
            pulling: st.pulling,
            kv_usage,
            prefix_queries: st.prefix_queries,
            prefix_hits: st.prefix_hits,
        };
    }

    /// A request's prompt of `prompt` tokens was first admitted on engine `i`, `cached` of
    /// them prefix-cache hits.
    pub fn prompt_started(&self, i: usize, prompt: u32, cached: u32) {
        let e = self.engine(i);
        let cached = cached.min(prompt) as u64;
        e.prompt_tokens.fetch_add(prompt as u64, Ordering::Relaxed);
        e.prompt_cached.fetch_add(cached, Ordering::Relaxed);
    }

    /// Every choice of a request with `n` choices has ended on engine `i` (the last one there),
    /// the longest having generated `max_generated` tokens.
    pub fn request_choices_finished(&self, i: usize, n: u32, max_generated: u32) {
        let e = self.engine(i);
        e.request_n.observe(n as f64);
        e.request_max_generated.observe(max_generated as f64);
    }

    /// A request ended on engine `i`: its reason, and (unless aborted or failed) its timings.
    pub fn request_finished(&self, i: usize, t: &RequestTimes, reason: FinishReason) {
        let e = self.engine(i);
        let counter = match reason {
            FinishReason::Length => &e.finished_length,
            FinishReason::Stop => &e.finished_stop,
            FinishReason::Abort => &e.aborted,
            FinishReason::Error => &e.errored,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if matches!(reason, FinishReason::Abort | FinishReason::Error) {
            return;
        }
        let secs = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64();
        e.e2e.observe(secs(t.arrival, t.end));
        e.request_prompt_tokens.observe(t.prompt_tokens as f64);
        e.request_generation_tokens.observe(t.generated as f64);
        e.request_prefill_kv_computed
            .observe(t.prompt_tokens.saturating_sub(t.cached_tokens) as f64);
        e.request_max_tokens.observe(t.max_tokens as f64);
        if let Some(s) = t.scheduled {
            e.queue.observe(secs(t.arrival, s));
            if let Some(f) = t.first_token {
                e.prefill.observe(secs(s, f));
            }
            if let Some(l) = t.last_token {
                e.inference.observe(secs(s, l));
            }
        }
        if let (Some(f), Some(l)) = (t.first_token, t.last_token) {
            e.decode.observe(secs(f, l));
            if t.generated > 1 {
                e.request_tpot
                    .observe(secs(f, l) / (t.generated - 1) as f64);
            }
        }
    }

    /// A step of engine `i` ran: the tokens it computed, and for MTP every sequence that
    /// verified drafts and what it accepted.
    /// A request counted as finished by length turned out to have met a stop string (the
    /// client's text check ran behind the engine): count it as `stop`, as the client saw it.
    pub fn length_was_stop(&self, i: usize) {
        let e = self.engine(i);
        let moved = e
            .finished_length
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        if moved {
            e.finished_stop.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn step(&self, i: usize, plan: &StepPlan, outcome: &StepOutcome) {
        let e = self.engine(i);
        e.iteration_tokens.observe(plan.tokens() as f64);
        let (mut seqs, mut drafts, mut accepted) = (0, 0, 0);
        let mut per_pos = e.spec_accepted_per_pos.lock().expect("per position");
        for (r, rank) in plan.ranks.iter().enumerate() {
            for (j, s) in rank.decode.iter().enumerate() {
                if s.drafts == 0 {
                    continue;
                }
                let a = outcome
                    .accepted
                    .get(r)
                    .and_then(|v| v.get(j))
                    .copied()
                    .unwrap_or(0)
                    .min(s.drafts);
                seqs += 1;
                drafts += s.drafts as u64;
                accepted += a as u64;
                if per_pos.len() < s.drafts as usize {
                    per_pos.resize(s.drafts as usize, 0);
                }
                for p in per_pos.iter_mut().take(a as usize) {
                    *p += 1;
                }
            }
        }
        e.spec_drafts.fetch_add(seqs, Ordering::Relaxed);
        e.spec_draft_tokens.fetch_add(drafts, Ordering::Relaxed);
        e.spec_accepted.fetch_add(accepted, Ordering::Relaxed);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let base = format!("model_name=\"{}\"", self.model);
        let labels: Vec<String> = (0..self.engines.len())
            .map(|i| format!("{base},engine=\"{i}\""))
            .collect();
        let gauges: Vec<Gauges> = self
            .engines
            .iter()
            .map(|e| *e.gauges.lock().expect("gauges"))
            .collect();
        let head = |out: &mut String, name: &str, help: &str, ty: &str| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {ty}");
        };
        type GaugeFn = fn(&Gauges) -> String;
        let per_gauge: [(&str, &str, &str, GaugeFn); 5] = [
            (
                "vllm:num_requests_running",
                "Requests in model execution batches.",
                "gauge",
                |g| g.running.to_string(),
            ),
            (
                "vllm:num_requests_waiting",
                "Requests waiting to be processed.",
                "gauge",
                |g| (g.waiting + g.pulling).to_string(),
            ),
            (
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                "gauge",
                |g| g.kv_usage.to_string(),
            ),
            (
                "vllm:prefix_cache_queries_total",
                "Prefix cache queries, in tokens.",
                "counter",
                |g| g.prefix_queries.to_string(),
            ),
            (
                "vllm:prefix_cache_hits_total",
                "Prefix cache hits, in tokens.",
                "counter",
                |g| g.prefix_hits.to_string(),
            ),
        ];
        for (name, help, ty, f) in per_gauge {
            head(&mut out, name, help, ty);
            for (l, g) in labels.iter().zip(&gauges) {
                let _ = writeln!(out, "{name}{{{l}}} {}", f(g));
            }
        }
        // Series of one label each, every value present from the start (one count per value).
        let labelled = [
            Labelled {
                name: "vllm:num_requests_waiting_by_reason",
                help: "Waiting requests by reason: capacity (a seat and KV), deferred (their KV still \
                 arriving from a prefill instance).",
                ty: "gauge",
                label: "reason",
                values: &["capacity", "deferred"],
                counts: |_, g| vec![g.waiting, g.pulling],
            },
            Labelled {
                // dstwin never sleeps (vLLM's sleep mode frees the weights).
                name: "vllm:engine_sleep_state",
                help: "Engine sleep state: awake = 1 while the engine serves.",
                ty: "gauge",
                label: "sleep_state",
                values: &["awake", "weights_offloaded", "discard_all"],
                counts: |_, _| vec![1, 0, 0],
            },
            Labelled {
                // A PD prompt counts once, on its prefill engine: none arrives by transfer.
                name: "vllm:prompt_tokens_by_source_total",
                help: "Prompt tokens by source.",
                ty: "counter",
                label: "source",
                values: &["local_compute", "local_cache_hit", "external_kv_transfer"],
                counts: |e, _| {
                    let cached = e.prompt_cached.load(Ordering::Relaxed);
                    let all = e.prompt_tokens.load(Ordering::Relaxed);
                    vec![all.saturating_sub(cached), cached, 0]
                },
            },
            Labelled {
                // No repetition detection: `repetition` stays 0, registered as vLLM registers
                // every reason.
                name: "vllm:request_success_total",
                help: "Count of successfully processed requests.",
                ty: "counter",
                label: "finished_reason",
                values: &["stop", "length", "abort", "error", "repetition"],
                counts: |e, _| {
                    [&e.finished_stop, &e.finished_length, &e.aborted, &e.errored]
                        .map(|c| c.load(Ordering::Relaxed))
                        .into_iter()
                        .chain([0])
                        .collect()
                },
            },
        ];
        for f in labelled {
            head(&mut out, f.name, f.help, f.ty);
            for ((l, e), g) in labels.iter().zip(&self.engines).zip(&gauges) {
                for (value, n) in f.values.iter().zip((f.counts)(e, g)) {
                    let _ = writeln!(out, "{}{{{l},{}=\"{value}\"}} {n}", f.name, f.label);
                }
            }
        }
        type CounterFn = fn(&EngineMetrics) -> &AtomicU64;
        let counters: [(&str, &str, CounterFn); 7] = [
            (
                "vllm:prompt_tokens_total",
                "Prefill tokens processed.",
                |e| &e.prompt_tokens,
            ),
            (
                "vllm:prompt_tokens_cached_total",
                "Number of cached prompt tokens (local + external).",
                |e| &e.prompt_cached,
            ),
            (
                "vllm:generation_tokens_total",
                "Generation tokens processed.",
                |e| &e.generation_tokens,
            ),
            (
                "vllm:num_preemptions_total",
                "Cumulative number of preemptions.",
                |e| &e.preemptions,
            ),
            (
                "vllm:spec_decode_num_drafts_total",
                "Number of spec decoding drafts.",
                |e| &e.spec_drafts,
            ),
            (
                "vllm:spec_decode_num_draft_tokens_total",
                "Number of draft tokens.",
                |e| &e.spec_draft_tokens,
            ),
            (
                "vllm:spec_decode_num_accepted_tokens_total",
                "Number of accepted tokens.",
                |e| &e.spec_accepted,
            ),
        ];
        for (name, help) in [
            (
                "vllm:external_prefix_cache_queries_total",
                "External prefix cache queries from a KV connector's cross-instance cache, in tokens (dstwin has none: 0).",
            ),
            (
                "vllm:external_prefix_cache_hits_total",
                "External prefix cache hits from a KV connector's cross-instance cache, in tokens (dstwin has none: 0).",
            ),
        ] {
            head(&mut out, name, help, "counter");
            for l in &labels {
                let _ = writeln!(out, "{name}{{{l}}} 0");
            }
        }
        for (name, help, f) in counters {
            head(&mut out, name, help, "counter");
            for (l, e) in labels.iter().zip(&self.engines) {
                let _ = writeln!(out, "{name}{{{l}}} {}", f(e).load(Ordering::Relaxed));
            }
        }
        let name = "vllm:spec_decode_num_accepted_tokens_per_pos_total";
        head(
            &mut out,
            name,
            "Accepted tokens per draft position.",
            "counter",
        );
        for (l, e) in labels.iter().zip(&self.engines) {
            for (p, n) in e
                .spec_accepted_per_pos
                .lock()
                .expect("per position")
                .iter()
                .enumerate()
            {
                let _ = writeln!(out, "{name}{{{l},position=\"{p}\"}} {n}");
            }
        }
        type HistFn = fn(&EngineMetrics) -> &Histogram;
        let hists: [(&str, &str, HistFn); 15] = [
            (
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                |e| &e.ttft,
            ),
            (
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                |e| &e.itl,
            ),
            (
                "vllm:request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request.",
                |e| &e.request_tpot,
            ),
            (
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                |e| &e.e2e,
            ),
            (
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                |e| &e.queue,
            ),
            (
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.",
                |e| &e.prefill,
            ),
            (
                "vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.",
                |e| &e.decode,
            ),
            (
                "vllm:request_inference_time_seconds",
                "Histogram of time spent in RUNNING phase for request.",
                |e| &e.inference,
            ),
            (
                "vllm:request_prompt_tokens",
                "Number of prefill tokens processed.",
                |e| &e.request_prompt_tokens,
            ),
            (
                "vllm:request_generation_tokens",
                "Number of generation tokens processed.",
                |e| &e.request_generation_tokens,
            ),
            (
                "vllm:request_prefill_kv_computed_tokens",
                "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
                |e| &e.request_prefill_kv_computed,
            ),
            (
                "vllm:request_params_max_tokens",
                "Histogram of the max_tokens request parameter.",
                |e| &e.request_max_tokens,
            ),
            (
                "vllm:request_params_n",
                "Histogram of the n request parameter.",
                |e| &e.request_n,
            ),
            (
                "vllm:request_max_num_generation_tokens",
                "Histogram of maximum number of requested generation tokens.",
                |e| &e.request_max_generated,
            ),
            (
                "vllm:iteration_tokens_total",
                "Histogram of number of tokens per engine_step.",
                |e| &e.iteration_tokens,
            ),
        ];
        for (name, help, f) in hists {
            head(&mut out, name, help, "histogram");
            for (l, e) in labels.iter().zip(&self.engines) {
                f(e).render(&mut out, name, l);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dstwin_core::device::{DecodeSeq, RankPlan};
    use std::time::Duration;

    fn line<'a>(t: &'a str, prefix: &str) -> &'a str {
        t.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{t}"))
    }

    /// The families exported are exactly those the vLLM list says dstwin exports: none missing,
    /// no removed or omitted one.
    #[test]
    fn the_exported_names_are_vllms_current_ones() {
        let list = include_str!("../tests/data/vllm-metric-names.txt");
        let mut want = Vec::new();
        let mut not = Vec::new();
        for l in list
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let (name, what) = l.split_once(' ').expect("NAME what");
            if what == "exported" {
                want.push(name);
            } else {
                assert!(what == "removed" || what.starts_with("omitted: "), "{l}");
                not.push(name);
            }
        }
        let t = Metrics::new("m", 2).render();
        let mut got: Vec<&str> = t
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want);
        for n in not {
            assert!(!t.contains(n), "{n} is exported");
        }
    }

    #[test]
    fn every_engine_has_every_series_from_the_start() {
        let t = Metrics::new("deepseek-r1", 2).render();
        for name in [
            "vllm:num_requests_running{",
            "vllm:kv_cache_usage_perc{",
            "vllm:generation_tokens_total{",
            "vllm:spec_decode_num_drafts_total{",
            "vllm:request_success_total{",
            "vllm:request_queue_time_seconds_count{",
            "vllm:request_time_per_output_token_seconds_count{",
        ] {
            for e in ["0", "1"] {
                let l = line(
                    &t,
                    &format!("{name}model_name=\"deepseek-r1\",engine=\"{e}\""),
                );
                assert!(l.ends_with(" 0"), "{l}");
            }
        }
    }

    #[test]
    fn request_timings_and_reasons() {
        let m = Metrics::new("m", 1);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let times = RequestTimes {
            arrival: t0,
            scheduled: Some(at(400)),
            first_token: Some(at(1000)),
            last_token: Some(at(3000)),
            end: at(3000),
            prompt_tokens: 30,
            cached_tokens: 8,
            max_tokens: 16,
            generated: 11,
        };
        m.request_finished(0, &times, FinishReason::Stop);
        m.request_finished(0, &times, FinishReason::Abort);
        let t = m.render();
        let l = "model_name=\"m\",engine=\"0\"";
        assert!(t.contains(&format!(
            "vllm:request_success_total{{{l},finished_reason=\"stop\"}} 1"
        )));
        assert!(t.contains(&format!(
            "vllm:request_success_total{{{l},finished_reason=\"abort\"}} 1"
        )));
        // Queue 0.4 s, prefill 0.6 s, decode 2 s, inference 2.6 s, 0.2 s per output token.
        assert!(t.contains(&format!(
            "vllm:request_queue_time_seconds_bucket{{{l},le=\"0.5\"}} 1"
        )));
        assert!(t.contains(&format!(
            "vllm:request_queue_time_seconds_bucket{{{l},le=\"0.3\"}} 0"
        )));
        assert!(t.contains(&format!(
            "vllm:request_prefill_time_seconds_bucket{{{l},le=\"0.8\"}} 1"
        )));
        assert!(t.contains(&format!(
            "vllm:request_decode_time_seconds_bucket{{{l},le=\"2\"}} 1"
        )));
        assert!(t.contains(&format!(
            "vllm:request_inference_time_seconds_bucket{{{l},le=\"2.5\"}} 0"
        )));
        assert!(t.contains(&format!(
            "vllm:request_time_per_output_token_seconds_bucket{{{l},le=\"0.2\"}} 1"
        )));
        assert!(t.contains(&format!(
            "vllm:request_time_per_output_token_seconds_bucket{{{l},le=\"0.15\"}} 0"
        )));
        assert!(t.contains(&format!("vllm:e2e_request_latency_seconds_count{{{l}}} 1")));
        assert!(t.contains(&format!("vllm:request_generation_tokens_sum{{{l}}} 11")));
        // 30 prompt tokens, 8 of them cached: 22 computed; max_tokens 16.
        assert!(t.contains(&format!(
            "vllm:request_prefill_kv_computed_tokens_sum{{{l}}} 22"
        )));
        assert!(t.contains(&format!("vllm:request_params_max_tokens_sum{{{l}}} 16")));
        // A failure counts as `error`, with no timings.
        m.request_finished(0, &times, FinishReason::Error);
        m.prompt_started(0, 30, 8);
        m.request_choices_finished(0, 3, 11);
        let t = m.render();
        for (series, n) in [
            ("vllm:request_success_total{L,finished_reason=\"error\"}", 1),
            (
                "vllm:request_success_total{L,finished_reason=\"repetition\"}",
                0,
            ),
            ("vllm:e2e_request_latency_seconds_count{L}", 1),
            ("vllm:prompt_tokens_total{L}", 30),
            (
                "vllm:prompt_tokens_by_source_total{L,source=\"local_compute\"}",
                22,
            ),
            (
                "vllm:prompt_tokens_by_source_total{L,source=\"local_cache_hit\"}",
                8,
            ),
            (
                "vllm:prompt_tokens_by_source_total{L,source=\"external_kv_transfer\"}",
                0,
            ),
            ("vllm:prompt_tokens_cached_total{L}", 8),
            ("vllm:request_params_n_bucket{L,le=\"2\"}", 0),
            ("vllm:request_params_n_bucket{L,le=\"5\"}", 1),
            ("vllm:request_max_num_generation_tokens_sum{L}", 11),
        ] {
            let series = series.replace('L', l);
            assert!(t.contains(&format!("{series} {n}\n")), "{series} {n}:\n{t}");
        }
    }

    #[test]
    fn spec_decode_counts_drafts_and_acceptances() {
        let m = Metrics::new("m", 1);
        let seq = |drafts| DecodeSeq {
            req: 0,
            drafts,
            step: 0,
        };
        let plan = StepPlan {
            dp_ranks: 1,
            ranks: vec![RankPlan {
                decode: vec![seq(2), seq(2), seq(0)],
                ..Default::default()
            }],
            expert_move: None,
        };
        let outcome = StepOutcome {
            accepted: vec![vec![2, 1, 0]],
            ..Default::default()
        };
        m.step(0, &plan, &outcome);
        let t = m.render();
        let l = "model_name=\"m\",engine=\"0\"";
        assert!(t.contains(&format!("vllm:spec_decode_num_drafts_total{{{l}}} 2")));
        assert!(t.contains(&format!("vllm:iteration_tokens_total_count{{{l}}} 1")));
        assert!(t.contains(&format!("vllm:spec_decode_num_draft_tokens_total{{{l}}} 4")));
        assert!(t.contains(&format!(
            "vllm:spec_decode_num_accepted_tokens_total{{{l}}} 3"
        )));
        assert!(t.contains(&format!(
            "vllm:spec_decode_num_accepted_tokens_per_pos_total{{{l},position=\"0\"}} 2"
        )));
        assert!(t.contains(&format!(
            "vllm:spec_decode_num_accepted_tokens_per_pos_total{{{l},position=\"1\"}} 1"
        )));
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::new("deepseek-r1", 1);
        m.engine(0).ttft.observe(0.003);
        m.engine(0).ttft.observe(0.3);
        let t = m.render();
        let l = "model_name=\"deepseek-r1\",engine=\"0\"";
        assert!(t.contains(&format!(
            "vllm:time_to_first_token_seconds_bucket{{{l},le=\"0.005\"}} 1"
        )));
        assert!(t.contains(&format!(
            "vllm:time_to_first_token_seconds_bucket{{{l},le=\"0.5\"}} 2"
        )));
        assert!(t.contains(&format!("vllm:time_to_first_token_seconds_count{{{l}}} 2")));
    }
}
