//! Steady state: how long each run of a candidate lasts, what is left out as warm-up, and what
//! is measured in the rest.
//!
//! A run starts from an empty deployment: the first prompts find idle prefill instances and an
//! empty decode batch, a closed loop starts with every request arriving at once, and until the
//! decode batch has turned over the figures describe the ramp, not the deployment. How long
//! that lasts is a property of the layout, so the unit of every length is the layout's own
//! **request lifetime**: the time a request spends being served at full load (prefill, KV
//! transfer and its output tokens at the full decode batch's TPOT), measured by the capacity
//! run as the mean of end-to-end latency minus queueing. A layout whose TPOT is twice as long,
//! or whose outputs are twice as long, runs twice as long; a fixed duration would be too short
//! for long outputs and wasted on short ones.
//!
//! - The capacity run is a closed loop with every decode slot busy, counted in generations (one
//!   generation: as many completions as there are slots, about one lifetime). The first
//!   [`WARMUP_LIFETIMES`] generations are left out, the next ones are measured (at least
//!   [`MEASURED_LIFETIMES`] and [`MIN_COMPLETIONS`] completions), and the last generation is
//!   not, because the loop drains as it ends. Capacity = completions in the window over the
//!   time between the window's first and last completion; counting whole generations keeps
//!   the measurement at the same phase of a loop whose requests finish in waves.
//! - An open-loop run leaves out [`WARMUP_LIFETIMES`] lifetimes (`warmup_s`) and measures
//!   [`MEASURED_LIFETIMES`] more, or longer when fewer than [`MIN_COMPLETIONS`] requests would
//!   finish in them at the offered rate (`duration_s` is the sum).
//!
//! Rates count the requests that *finish* inside the measured window, whenever they arrived: a
//! run cut at its duration never finishes the requests of its last lifetime, so counting the
//! requests that arrived in the window would under-count by one lifetime in four. Latency
//! percentiles are over the same requests, with the simulator's histograms.

use super::{PercentileSlo, SloMetric};
use crate::metrics::{Latency, Percentiles};
use crate::run::{RequestRow, SimReport};
use dstwin_core::time::SimDuration;
use serde::Serialize;

/// Lifetimes left out before anything is measured: the decode batch fills in one lifetime from
/// an empty start, and the second lets the prefill queue and the first requests' hand-offs
/// settle at the offered rate.
pub const WARMUP_LIFETIMES: u32 = 2;
/// Lifetimes measured after the warm-up: four turnovers of every decode slot.
pub const MEASURED_LIFETIMES: u32 = 4;
/// Fewest completions a measured window holds: a Poisson count of 400 varies by 5%, which the
/// spread over seeds then shows rather than a single run hiding it.
pub const MIN_COMPLETIONS: u64 = 400;

/// The rule, as the JSON report states it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SteadyRule {
    pub warmup_lifetimes: u32,
    pub measured_lifetimes: u32,
    pub min_completions: u64,
}

/// The rule `plan` runs under.
pub const RULE: SteadyRule = SteadyRule {
    warmup_lifetimes: WARMUP_LIFETIMES,
    measured_lifetimes: MEASURED_LIFETIMES,
    min_completions: MIN_COMPLETIONS,
};

/// The time plan of an open-loop run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Window {
    /// Left out of every figure (the scenario's `warmup_s`).
    pub warmup_s: f64,
    /// Measured after the warm-up; the run stops at `warmup_s + measured_s` (`duration_s`).
    pub measured_s: f64,
    /// Arrivals drawn: enough that the stream does not run dry before the run ends.
    pub requests: u64,
}

impl Window {
    /// The window of an open-loop run at `rate` requests/s of a layout whose requests live
    /// `lifetime_s`.
    pub fn open_loop(lifetime_s: f64, rate: f64) -> Window {
        debug_assert!(
            lifetime_s > 0.0 && rate > 0.0,
            "{lifetime_s} s, {rate} req/s"
        );
        let warmup_s = f64::from(WARMUP_LIFETIMES) * lifetime_s;
        let measured_s =
            (f64::from(MEASURED_LIFETIMES) * lifetime_s).max(MIN_COMPLETIONS as f64 / rate);
        let expected = rate * (warmup_s + measured_s);
        // Six standard deviations of the Poisson count above its mean: the arrivals run out
        // before the end with a probability below one in a billion.
        let requests = (expected + 6.0 * expected.sqrt()).ceil() as u64 + 16;
        Window {
            warmup_s,
            measured_s,
            requests,
        }
    }

    /// The run's duration.
    pub fn end_s(&self) -> f64 {
        self.warmup_s + self.measured_s
    }
}

/// The generations of the closed-loop capacity run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Generations {
    /// Requests in flight (every decode slot).
    pub concurrency: u32,
    /// Generations left out at the start.
    pub warmup: u32,
    /// Generations measured after them.
    pub measured: u32,
}

impl Generations {
    /// The capacity run of a layout with `concurrency` decode slots.
    pub fn new(concurrency: u32) -> Generations {
        let c = u64::from(concurrency.max(1));
        let measured = u64::from(MEASURED_LIFETIMES).max(MIN_COMPLETIONS.div_ceil(c));
        Generations {
            concurrency: concurrency.max(1),
            warmup: WARMUP_LIFETIMES,
            measured: measured as u32,
        }
    }

    /// Requests the loop issues: the warm-up, the measured generations and one more, whose
    /// completions are not measured because the loop drains while they finish.
    pub fn requests(&self) -> u64 {
        u64::from(self.warmup + self.measured + 1) * u64::from(self.concurrency)
    }
}

/// What the capacity run measured.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Capacity {
    /// Completions per second with every decode slot busy.
    pub req_s: f64,
    /// Mean time a request spent being served (end-to-end minus queueing) in the window.
    pub lifetime_s: f64,
}

fn finish_s(r: &RequestRow) -> f64 {
    r.arrival_s + r.e2e_ms * 1e-3
}

/// Capacity and lifetime from the per-request rows of a closed-loop run of `g`; `None` when
/// fewer requests finished than the window needs.
pub fn capacity(rows: &[RequestRow], g: &Generations) -> Option<Capacity> {
    let mut ends: Vec<(f64, f64)> = rows
        .iter()
        .map(|r| (finish_s(r), (r.e2e_ms - r.queue_ms) * 1e-3))
        .collect();
    ends.sort_by(|a, b| a.0.total_cmp(&b.0));
    let c = g.concurrency as usize;
    // Completions counted from 1: the window runs from the a-th to the b-th.
    let a = g.warmup as usize * c;
    let b = (g.warmup + g.measured) as usize * c;
    if ends.len() < b || b <= a {
        return None;
    }
    let t0 = if a == 0 { 0.0 } else { ends[a - 1].0 };
    let span = ends[b - 1].0 - t0;
    if span <= 0.0 {
        return None;
    }
    let served = &ends[a..b];
    let lifetime_s = served.iter().map(|e| e.1).sum::<f64>() / served.len() as f64;
    Some(Capacity {
        req_s: (b - a) as f64 / span,
        lifetime_s,
    })
}

/// One run of a candidate at one load with one seed, over its measured window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Measurement {
    pub seed: u64,
    /// Requests that finished in the measured window.
    pub finished: u64,
    /// Requests per second per card that finished in the window meeting every SLO.
    pub goodput_per_card: f64,
    pub output_tok_s_per_card: f64,
    /// Share of the window's finished requests that met every per-request SLO.
    pub slo_attainment: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub tpot_p50_ms: f64,
    pub tpot_p99_ms: f64,
    /// The window's value of each percentile SLO, in its order, ms.
    pub percentiles_ms: Vec<f64>,
    /// Every percentile SLO held; when one did not, `goodput_per_card` is 0.
    pub percentiles_met: bool,
}

/// What a windowed run's report says about its window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunSpan {
    /// The warm-up's end (`warmup_s`) and the run's end (its `duration_s`, or earlier when
    /// every request finished before it).
    pub start_s: f64,
    pub end_s: f64,
    pub cards: f64,
    /// Counted by the simulator from the steps after the warm-up.
    pub output_tok_s_per_card: f64,
}

impl RunSpan {
    pub fn of(report: &SimReport) -> RunSpan {
        RunSpan {
            start_s: report.warmup_s,
            end_s: report.simulated_s,
            cards: report.cards,
            output_tok_s_per_card: report.output_tok_s_per_card,
        }
    }
}

/// The figures of an open-loop run with seed `seed` over its measured window, from its report
/// and its per-request rows, under the percentile SLOs `slos`: goodput counts the window's
/// requests that met every per-request SLO, and is 0 when a percentile is over its bound.
pub fn measure(
    seed: u64,
    run: RunSpan,
    rows: &[RequestRow],
    slos: &[PercentileSlo],
) -> Measurement {
    let span = (run.end_s - run.start_s).max(f64::MIN_POSITIVE);
    let (mut ttft, mut tpot) = (Latency::default(), Latency::default());
    let (mut finished, mut good) = (0u64, 0u64);
    for r in rows {
        let t = finish_s(r);
        if t <= run.start_s || t > run.end_s {
            continue;
        }
        finished += 1;
        good += u64::from(r.met_slo);
        ttft.record(SimDuration::from_secs_f64(r.ttft_ms * 1e-3));
        if r.output_tokens > 1 {
            tpot.record(SimDuration::from_secs_f64(r.tpot_ms * 1e-3));
        }
    }
    let percentiles_ms: Vec<f64> = slos
        .iter()
        .map(|s| {
            match s.metric {
                SloMetric::Ttft => &ttft,
                SloMetric::Tpot => &tpot,
            }
            .quantile_ms(s.percentile / 100.0)
        })
        .collect();
    let percentiles_met = slos
        .iter()
        .zip(&percentiles_ms)
        .all(|(s, &v)| v <= s.max_ms);
    let counted = if percentiles_met { good } else { 0 };
    let (ttft, tpot): (Percentiles, Percentiles) = (ttft.summary(), tpot.summary());
    Measurement {
        seed,
        finished,
        goodput_per_card: counted as f64 / span / run.cards.max(f64::MIN_POSITIVE),
        output_tok_s_per_card: run.output_tok_s_per_card,
        slo_attainment: if finished > 0 {
            good as f64 / finished as f64
        } else {
            0.0
        },
        ttft_p50_ms: ttft.p50,
        ttft_p99_ms: ttft.p99,
        tpot_p50_ms: tpot.p50,
        tpot_p99_ms: tpot.p99,
        percentiles_ms,
        percentiles_met,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(arrival_s: f64, e2e_ms: f64, queue_ms: f64, met: bool) -> RequestRow {
        RequestRow {
            id: 0,
            arrival_s,
            input_tokens: 100,
            output_tokens: 11,
            ttft_ms: 100.0,
            tpot_ms: (e2e_ms - 100.0) / 10.0,
            e2e_ms,
            queue_ms,
            preemptions: 0,
            prefill_instance: "p".into(),
            decode_instance: "d".into(),
            met_slo: met,
        }
    }

    #[test]
    fn runs_last_a_number_of_the_layouts_own_lifetimes() {
        // A layout whose requests live 60 s: two left out, four measured.
        let w = Window::open_loop(60.0, 10.0);
        assert_eq!(w.warmup_s, 120.0);
        assert_eq!(w.measured_s, 240.0);
        assert_eq!(w.end_s(), 360.0);
        // Outputs ten times as long live ten times as long, and run ten times as long: the
        // window follows the layout, not a constant.
        let long = Window::open_loop(600.0, 10.0);
        assert_eq!(long.warmup_s, 10.0 * w.warmup_s);
        assert_eq!(long.measured_s, 10.0 * w.measured_s);
        // Enough arrivals to reach the end: more than rate x duration.
        assert!(w.requests as f64 > 10.0 * w.end_s() + 6.0 * (3600f64).sqrt());
    }

    #[test]
    fn a_slow_rate_measures_long_enough_for_the_fewest_completions() {
        // Short lifetimes at 2 req/s: four lifetimes would hold 8 completions; the window
        // stretches to 400 / 2 = 200 s.
        let w = Window::open_loop(1.0, 2.0);
        assert_eq!(w.warmup_s, 2.0);
        assert_eq!(w.measured_s, 200.0);
        assert!(w.measured_s * 2.0 >= MIN_COMPLETIONS as f64);
    }

    #[test]
    fn the_capacity_run_counts_whole_generations() {
        let g = Generations::new(768);
        assert_eq!((g.warmup, g.measured), (2, 4));
        assert_eq!(g.requests(), 7 * 768);
        // Few slots: more generations, so that 400 completions are measured.
        let g = Generations::new(16);
        assert_eq!(g.measured, 25);
        assert!(u64::from(g.measured) * 16 >= MIN_COMPLETIONS);
        assert_eq!(g.requests(), 28 * 16);
    }

    #[test]
    fn capacity_leaves_out_the_ramp_and_the_drain() {
        // Two slots; generation k finishes at 10k s, except a slow first generation (the
        // ramp) and a drain whose last request finishes late.
        let g = Generations {
            concurrency: 2,
            warmup: 1,
            measured: 2,
        };
        let mut rows = vec![row(0.0, 25_000.0, 5_000.0, true); 2];
        for k in 1..3 {
            let t = 25.0 + 10.0 * f64::from(k);
            rows.push(row(t - 10.0, 10_000.0, 0.0, true));
            rows.push(row(t - 10.0, 10_000.0, 0.0, true));
        }
        rows.push(row(45.0, 100_000.0, 0.0, true));
        rows.push(row(45.0, 100_000.0, 0.0, true));
        let c = capacity(&rows, &g).expect("enough rows");
        // Window: from the 2nd completion (25 s) to the 6th (45 s): 4 completions in 20 s.
        assert_eq!(c.req_s, 0.2);
        // Lifetimes of the measured requests only.
        assert_eq!(c.lifetime_s, 10.0);
        assert!(capacity(&rows[..5], &g).is_none(), "too few rows");
    }

    #[test]
    fn requests_count_when_they_finish_inside_the_window() {
        let run = RunSpan {
            start_s: 10.0,
            end_s: 30.0,
            cards: 2.0,
            output_tok_s_per_card: 7.0,
        };
        let rows = vec![
            row(5.0, 4_000.0, 0.0, true),   // finished in the warm-up: left out
            row(8.0, 4_000.0, 0.0, true),   // arrived in the warm-up, finished at 12 s: counted
            row(20.0, 5_000.0, 0.0, false), // counted, missed an SLO
            row(29.0, 5_000.0, 0.0, true),  // still running at the end: left out
        ];
        let m = measure(3, run, &rows, &[]);
        assert_eq!(m.finished, 2);
        assert_eq!(m.seed, 3);
        // One good request in 20 s on 2 cards.
        assert_eq!(m.goodput_per_card, 1.0 / 20.0 / 2.0);
        assert_eq!(m.slo_attainment, 0.5);
        assert_eq!(m.output_tok_s_per_card, 7.0);
        assert!((m.ttft_p50_ms - 100.0).abs() < 0.1, "{}", m.ttft_p50_ms);
    }

    /// A percentile SLO bounds the window's percentile: over it, the run has no goodput
    /// (though its requests may each meet the per-request SLOs); at or under it, goodput is
    /// what the per-request SLOs leave.
    #[test]
    fn a_percentile_over_its_bound_leaves_the_run_no_goodput() {
        let run = RunSpan {
            start_s: 0.0,
            end_s: 100.0,
            cards: 1.0,
            output_tok_s_per_card: 1.0,
        };
        // Ten requests, TPOT 10, 20, ..., 100 ms (TTFT 100 ms each).
        let rows: Vec<RequestRow> = (1..=10)
            .map(|k| row(f64::from(k), 100.0 + 100.0 * f64::from(k), 0.0, true))
            .collect();
        let slo = |metric, percentile, max_ms| PercentileSlo {
            metric,
            percentile,
            max_ms,
        };
        let held = [
            slo(SloMetric::Tpot, 90.0, 90.5),
            slo(SloMetric::Ttft, 99.0, 101.0),
        ];
        let m = measure(1, run, &rows, &held);
        assert!(m.percentiles_met);
        assert_eq!(m.goodput_per_card, 10.0 / 100.0);
        assert!(
            (m.percentiles_ms[0] - 90.0).abs() < 0.1,
            "{:?}",
            m.percentiles_ms
        );
        assert!(
            (m.percentiles_ms[1] - 100.0).abs() < 0.1,
            "{:?}",
            m.percentiles_ms
        );
        let missed = [slo(SloMetric::Tpot, 90.0, 89.0)];
        let m = measure(1, run, &rows, &missed);
        assert!(!m.percentiles_met);
        assert_eq!(m.goodput_per_card, 0.0);
        assert_eq!(
            m.slo_attainment, 1.0,
            "every request met the per-request SLOs"
        );
        // The median of the same ten is 50 ms.
        let m = measure(1, run, &rows, &[slo(SloMetric::Tpot, 50.0, 50.1)]);
        assert!(m.percentiles_met, "{:?}", m.percentiles_ms);
    }

    #[test]
    fn percentile_keys_name_a_metric_and_a_percentile() {
        assert_eq!(
            PercentileSlo::parse_key("ttft_p90"),
            Ok((SloMetric::Ttft, 90.0))
        );
        assert_eq!(
            PercentileSlo::parse_key("tpot_p99.9"),
            Ok((SloMetric::Tpot, 99.9))
        );
        for (key, says) in [
            ("ttft_p100", "below 100"),
            ("ttft_p0", "above 0"),
            ("ttft_px", "percentile 'x'"),
            ("e2e_p90", "unknown metric 'e2e'"),
            ("ttft90", "METRIC_pNN"),
        ] {
            let e = PercentileSlo::parse_key(key).unwrap_err();
            assert!(e.contains(says), "{key}: {e}");
        }
    }
}
