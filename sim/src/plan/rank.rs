//! Spread over seeds, screening, and the tie rule.
//!
//! A layout's figures are the mean and the range (min-max) over its seeds, at the load level
//! chosen for it. The best layout has the highest mean goodput per card. Every layout whose
//! goodput range overlaps the best's is **tied** with it: at this many seeds the two are
//! statistically indistinguishable, and it shares rank 1. Below that, a layout's rank is one
//! more than the number of layouts whose whole range lies above its own, so a rank never claims
//! a loss that is inside the spread: two layouts with the same rank are not told apart. (Ranges
//! do not order transitively: a layout tied with the best keeps rank 1 even if some other
//! layout's range lies wholly above its own.)
//!
//! Screening keeps the time down: every layout runs with the first seed; those within
//! [`SCREEN_MARGIN`] of the best one-seed goodput run with the others. Then, with `w` the
//! widest relative range (max - min over mean) any seeded layout showed, every layout whose
//! one-seed goodput is within `max(w, SCREEN_MARGIN)` of the best's lowest seed runs with every
//! seed too, until no more qualify. A layout left at one seed is therefore below the best by
//! more than any spread that was measured; that is the only loss claimed for it.

use super::steady::{Measurement, SteadyRule, Window, RULE};
use super::{Candidate, Estimate, PlanInput, FRONT_MARGIN, RUN_FAILED};
use serde::Serialize;

/// Layouts whose one-seed goodput is within this share of the best one run with every seed.
pub const SCREEN_MARGIN: f64 = 0.05;
/// The higher load level is reported when its mean goodput beats the lower one's by more.
pub const HIGHER_LOAD_GAIN: f64 = 0.03;

/// Mean and range of a figure over seeds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Spread {
    pub mean: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// Of at least one value.
    pub fn of(xs: impl IntoIterator<Item = f64>) -> Spread {
        let (mut n, mut sum, mut min, mut max) = (0usize, 0.0, f64::INFINITY, f64::NEG_INFINITY);
        for x in xs {
            n += 1;
            sum += x;
            min = min.min(x);
            max = max.max(x);
        }
        assert!(n > 0, "a spread of no values");
        Spread {
            mean: sum / n as f64,
            min,
            max,
        }
    }

    /// The two ranges share a value: the difference is inside the spread.
    pub fn overlaps(&self, o: &Spread) -> bool {
        self.max >= o.min && o.max >= self.min
    }

    /// (max - min) / mean; 0 for a zero mean.
    pub fn relative_width(&self) -> f64 {
        if self.mean > 0.0 {
            (self.max - self.min) / self.mean
        } else {
            0.0
        }
    }
}

/// One load level of a layout: a fraction of its capacity, the window of its runs and a run
/// per seed (in seed order).
#[derive(Clone, Debug, Serialize)]
pub struct Level {
    pub load: f64,
    pub rate_req_s: f64,
    pub window: Window,
    pub runs: Vec<Measurement>,
}

impl Level {
    fn spread(&self, f: impl Fn(&Measurement) -> f64) -> Spread {
        Spread::of(self.runs.iter().map(f))
    }
}

/// A layout's figures at its chosen level, over its seeds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// The level reported: the lower load unless the higher one's mean goodput is more than
    /// [`HIGHER_LOAD_GAIN`] better.
    pub load: f64,
    pub rate_req_s: f64,
    pub warmup_s: f64,
    pub measured_s: f64,
    pub seeds: Vec<u64>,
    pub goodput_per_card: Spread,
    pub output_tok_s_per_card: Spread,
    pub slo_attainment: Spread,
    pub ttft_p50_ms: Spread,
    pub ttft_p99_ms: Spread,
    pub tpot_p50_ms: Spread,
    pub tpot_p99_ms: Spread,
    /// Each percentile SLO's value over the window, in the plan's order.
    pub percentiles_ms: Vec<Spread>,
}

/// Where a layout stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Standing {
    /// Highest mean goodput per card over the seeds.
    Best,
    /// Its goodput range overlaps the best's: statistically indistinguishable from it.
    Tied,
    /// Its whole goodput range lies below the best's.
    Lower,
    /// Run with one seed only: its goodput is below the best's lowest seed by more than any
    /// spread measured (or no layout met the SLOs).
    ScreenedOut,
    /// Not simulated: its steady-step estimate is too far below the best estimate, or says it
    /// cannot meet the SLOs at any batch cap ([`super::front`]).
    Estimated,
    /// Its scenario does not validate (layout, memory) or its runs failed.
    Invalid,
}

/// Why a layout is not among the best: a category (`memory`, `layout`, `run failed`, `TPOT`,
/// `TTFT`, `lower goodput`, `no goodput`) and the figures behind it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Loss {
    pub reason: &'static str,
    pub detail: String,
}

/// How a layout did.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub candidate: Candidate,
    /// Why it could not run (layout, memory), or empty.
    pub invalid: String,
    /// Its steady-step estimate at the batch cap the search chose ([`super::search`]).
    pub estimate: Option<Estimate>,
    pub cards: f64,
    /// Completions per second with every decode slot busy (the closed-loop run, first seed).
    pub capacity_req_s: f64,
    /// Mean time a request is served at that load: the unit of every run's length.
    pub lifetime_s: f64,
    /// The load levels measured (60% and 90% of capacity), each with a run per seed.
    pub levels: Vec<Level>,
    /// The chosen level's figures over its seeds (absent when invalid).
    #[serde(flatten)]
    pub result: Option<Summary>,
    pub standing: Standing,
    /// 1 for the best and every layout tied with it; below, one more than the layouts whose
    /// goodput range lies wholly above this one's. None when screened out or invalid.
    pub rank: Option<u32>,
    pub loses_because: Option<Loss>,
}

impl Outcome {
    /// A layout that could not run.
    pub fn failed(candidate: Candidate, invalid: String) -> Outcome {
        Outcome {
            candidate,
            invalid,
            estimate: None,
            cards: 0.0,
            capacity_req_s: 0.0,
            lifetime_s: 0.0,
            levels: Vec::new(),
            result: None,
            standing: Standing::Invalid,
            rank: None,
            loses_because: None,
        }
    }

    /// Seeds run at every level.
    pub fn seeds_run(&self) -> usize {
        self.levels.iter().map(|l| l.runs.len()).min().unwrap_or(0)
    }

    fn complete(&self, seeds: usize) -> bool {
        self.invalid.is_empty() && self.result.is_some() && self.seeds_run() >= seeds
    }

    fn goodput(&self) -> Option<Spread> {
        self.result.as_ref().map(|r| r.goodput_per_card)
    }

    /// Recomputes the summary from the levels' runs (after runs were added).
    pub fn settle(&mut self) {
        let runs = self.seeds_run();
        if !self.invalid.is_empty() || runs == 0 {
            self.result = None;
            return;
        }
        for l in &mut self.levels {
            l.runs.sort_by_key(|m| m.seed);
        }
        let mean = |l: &Level| l.spread(|m| m.goodput_per_card).mean;
        let mut chosen = &self.levels[0];
        for l in &self.levels[1..] {
            if mean(l) > (1.0 + HIGHER_LOAD_GAIN) * mean(chosen) {
                chosen = l;
            }
        }
        let l = chosen;
        self.result = Some(Summary {
            load: l.load,
            rate_req_s: l.rate_req_s,
            warmup_s: l.window.warmup_s,
            measured_s: l.window.measured_s,
            seeds: l.runs.iter().map(|m| m.seed).collect(),
            goodput_per_card: l.spread(|m| m.goodput_per_card),
            output_tok_s_per_card: l.spread(|m| m.output_tok_s_per_card),
            slo_attainment: l.spread(|m| m.slo_attainment),
            ttft_p50_ms: l.spread(|m| m.ttft_p50_ms),
            ttft_p99_ms: l.spread(|m| m.ttft_p99_ms),
            tpot_p50_ms: l.spread(|m| m.tpot_p50_ms),
            tpot_p99_ms: l.spread(|m| m.tpot_p99_ms),
            percentiles_ms: (0..l.runs[0].percentiles_ms.len())
                .map(|i| l.spread(|m| m.percentiles_ms[i]))
                .collect(),
        });
    }
}

/// The line below which a one-seed layout is not run with more seeds.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Reach {
    floor: f64,
    /// Relative margin below the reference: the widest spread, at least [`SCREEN_MARGIN`].
    margin: f64,
    /// The widest relative goodput range of a layout with every seed (0 before any).
    widest: f64,
    /// The best's lowest seed, or the best one-seed goodput before any layout has every seed.
    reference: f64,
}

/// Best first: layouts with every seed by mean goodput, then output; stable for equal ones.
fn best_first(a: &Outcome, b: &Outcome, seeds: usize) -> std::cmp::Ordering {
    let group = |o: &Outcome| {
        if o.complete(seeds) {
            0
        } else if o.result.is_some() {
            1
        } else if o.invalid.is_empty() {
            2
        } else {
            3
        }
    };
    let estimated = |o: &Outcome| o.estimate.map_or(0.0, |e| e.goodput_per_card);
    let mean =
        |o: &Outcome, f: fn(&Summary) -> Spread| o.result.as_ref().map_or(0.0, |r| f(r).mean);
    group(a)
        .cmp(&group(b))
        .then(mean(b, |r| r.goodput_per_card).total_cmp(&mean(a, |r| r.goodput_per_card)))
        .then(mean(b, |r| r.output_tok_s_per_card).total_cmp(&mean(a, |r| r.output_tok_s_per_card)))
        .then(estimated(b).total_cmp(&estimated(a)))
}

fn reach(outcomes: &[Outcome], seeds: usize) -> Option<Reach> {
    let best = outcomes
        .iter()
        .min_by(|a, b| best_first(a, b, seeds))
        .filter(|o| o.complete(seeds));
    match best {
        Some(b) => {
            let g = b.goodput().expect("complete");
            let widest = outcomes
                .iter()
                .filter(|o| o.complete(seeds))
                .filter_map(|o| o.goodput())
                .map(|s| s.relative_width())
                .fold(0.0, f64::max);
            let margin = widest.max(SCREEN_MARGIN);
            Some(Reach {
                floor: g.min * (1.0 - margin),
                margin,
                widest,
                reference: g.min,
            })
        }
        None => {
            let top = outcomes
                .iter()
                .filter_map(|o| o.goodput())
                .map(|g| g.mean)
                .fold(0.0, f64::max);
            (top > 0.0).then_some(Reach {
                floor: top * (1.0 - SCREEN_MARGIN),
                margin: SCREEN_MARGIN,
                widest: 0.0,
                reference: top,
            })
        }
    }
}

/// The layouts to run with the rest of the `seeds` seeds now (indices into `outcomes`): empty
/// when every layout within reach of the best has them all. Call until empty, adding the runs
/// and settling in between.
pub fn to_seed(outcomes: &[Outcome], seeds: usize) -> Vec<usize> {
    let Some(r) = reach(outcomes, seeds) else {
        return Vec::new();
    };
    outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| o.invalid.is_empty() && !o.complete(seeds))
        .filter(|(_, o)| {
            o.goodput()
                .is_some_and(|g| g.mean > 0.0 && g.mean >= r.floor)
        })
        .map(|(i, _)| i)
        .collect()
}

fn over(x: Option<f64>, slo: Option<f64>) -> bool {
    matches!((x, slo), (Some(x), Some(s)) if x > s)
}

/// The first percentile SLO of `p` that `r` misses: at every seed (its lowest value over it)
/// when `every_seed`, else on its one seed's value.
fn percentile_loss(p: &PlanInput, r: &Summary, every_seed: bool) -> Option<(&'static str, String)> {
    p.percentile_slos
        .iter()
        .zip(&r.percentiles_ms)
        .find(|(s, v)| if every_seed { v.min } else { v.mean } > s.max_ms)
        .map(|(s, v)| {
            let reason = s.metric.name();
            let detail = if every_seed {
                format!(
                    "{} {:.1}-{:.1} ms, over its SLO ({} ms) at every seed",
                    s.label(),
                    v.min,
                    v.max,
                    s.max_ms
                )
            } else {
                format!(
                    "{} {:.1} ms over its SLO ({} ms)",
                    s.label(),
                    v.mean,
                    s.max_ms
                )
            };
            (reason, detail)
        })
}

/// Why the steady-step estimate left a layout out: what it cannot meet at any batch cap, or
/// how far below the best estimate it lies.
fn estimate_loss(p: &PlanInput, c: &Candidate, e: &Estimate, top: f64) -> (&'static str, String) {
    let tpot_bound = p.tpot_bound_ms();
    let ttft_bound = p.ttft_bound_ms();
    let b = c.max_num_seqs;
    if e.goodput_per_card > 0.0 {
        (
            "estimate",
            format!(
                "steady-step estimate {:.4} req/s per card, {:.0}% below the best estimate ({top:.4}); \
                 layouts more than {:.0}% below are not simulated",
                e.goodput_per_card,
                (1.0 - e.goodput_per_card / top) * 100.0,
                FRONT_MARGIN * 100.0
            ),
        )
    } else if e.capacity_req_s <= 0.0 {
        (
            "est. no goodput",
            "steady-step estimate: no capacity (the token budget leaves no room for prompts)"
                .to_string(),
        )
    } else if u64::from(b) > e.kv_seqs {
        (
            "est. KV",
            format!(
                "steady-step estimate: a DP rank's KV has room for {} request{} of {} tokens, \
                 fewer than the smallest batch cap ({b})",
                e.kv_seqs,
                if e.kv_seqs == 1 { "" } else { "s" },
                p.input_tokens + p.output_tokens
            ),
        )
    } else if e.tpot_ms > tpot_bound {
        (
            "est. TPOT",
            format!(
                "steady-step estimate: TPOT {:.1} ms at the smallest batch cap ({b}), over the \
                 bound ({tpot_bound} ms)",
                e.tpot_ms
            ),
        )
    } else {
        (
            "est. TTFT",
            format!(
                "steady-step estimate: one prompt's prefill takes {:.0} ms with nothing queued, \
                 over the bound ({ttft_bound} ms)",
                e.prefill_ms
            ),
        )
    }
}

/// Sorts best first and sets every layout's standing, rank and loss under `p`'s SLOs.
pub fn rank(outcomes: &mut [Outcome], p: &PlanInput) {
    let seeds = p.seeds as usize;
    let reach = reach(outcomes, seeds);
    outcomes.sort_by(|a, b| best_first(a, b, seeds));
    let ranges: Vec<Spread> = outcomes
        .iter()
        .take_while(|o| o.complete(seeds))
        .filter_map(|o| o.goodput())
        .collect();
    let best = ranges.first().copied();
    let top_estimate = outcomes
        .iter()
        .filter_map(|o| o.estimate)
        .map(|e| e.goodput_per_card)
        .fold(0.0, f64::max);
    for (i, o) in outcomes.iter_mut().enumerate() {
        let (standing, rank, loss) = if !o.invalid.is_empty() {
            let reason = if o.invalid.starts_with(RUN_FAILED) {
                "run failed"
            } else if o.invalid.contains("does not fit") || o.invalid.contains("HBM") {
                "memory"
            } else {
                "layout"
            };
            (Standing::Invalid, None, Some((reason, o.invalid.clone())))
        } else if o.result.is_none() {
            let e = o
                .estimate
                .expect("a layout neither run nor invalid is estimated");
            (
                Standing::Estimated,
                None,
                Some(estimate_loss(p, &o.candidate, &e, top_estimate)),
            )
        } else if let (Some(g), Some(b)) = (ranges.get(i), best) {
            if i == 0 {
                (Standing::Best, Some(1), None)
            } else if g.overlaps(&b) {
                (Standing::Tied, Some(1), None)
            } else {
                let above = ranges.iter().filter(|r| r.min > g.max).count() as u32;
                let r = o.result.as_ref().expect("complete");
                let loss = if let Some(l) = percentile_loss(p, r, true) {
                    l
                } else if over(Some(r.tpot_p50_ms.min), p.tpot_ms) {
                    (
                        "TPOT",
                        format!(
                            "TPOT p50 {:.1}-{:.1} ms, over the SLO at every seed",
                            r.tpot_p50_ms.min, r.tpot_p50_ms.max
                        ),
                    )
                } else if over(Some(r.ttft_p50_ms.min), p.ttft_ms) {
                    (
                        "TTFT",
                        format!(
                            "TTFT p50 {:.0}-{:.0} ms, over the SLO at every seed",
                            r.ttft_p50_ms.min, r.ttft_p50_ms.max
                        ),
                    )
                } else {
                    (
                        "lower goodput",
                        format!(
                            "{:.4} ({:.4}-{:.4}) req/s per card, wholly below the best's range ({:.4}-{:.4})",
                            g.mean, g.min, g.max, b.min, b.max
                        ),
                    )
                };
                (Standing::Lower, Some(above + 1), Some(loss))
            }
        } else {
            let r = o.result.as_ref().expect("valid");
            let g = r.goodput_per_card.mean;
            let loss = if let Some(l) = percentile_loss(p, r, false) {
                l
            } else if over(Some(r.tpot_p50_ms.mean), p.tpot_ms) {
                (
                    "TPOT",
                    format!("TPOT p50 {:.1} ms over the SLO", r.tpot_p50_ms.mean),
                )
            } else if over(Some(r.ttft_p50_ms.mean), p.ttft_ms) {
                (
                    "TTFT",
                    format!("TTFT p50 {:.0} ms over the SLO", r.ttft_p50_ms.mean),
                )
            } else if g <= 0.0 {
                ("no goodput", "no request met every SLO".to_string())
            } else {
                let r = reach.expect("a layout has goodput");
                (
                    "lower goodput",
                    format!(
                        "{g:.4} req/s per card at one seed, {:.1}% below the best's lowest seed ({:.4}); \
                         more than {:.1}% below is out of reach (the widest spread over seeds was {:.1}%)",
                        (1.0 - g / r.reference) * 100.0,
                        r.reference,
                        r.margin * 100.0,
                        r.widest * 100.0
                    ),
                )
            };
            (Standing::ScreenedOut, None, Some(loss))
        };
        o.standing = standing;
        o.rank = rank;
        o.loses_because = loss.map(|(reason, detail)| Loss { reason, detail });
    }
}

/// A plan's SLOs: every request's TTFT and TPOT bounds (ms), and the percentile bounds over
/// each run's window.
#[derive(Clone, Debug, Serialize)]
pub struct PlanSlo {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub percentiles: Vec<super::PercentileSlo>,
}

/// What `plan --json` prints and `plan.json` holds: the rules the figures were measured under
/// and every layout, best first (after [`rank`]).
#[derive(Clone, Debug, Serialize)]
pub struct PlanReport<'a> {
    /// The engine the layouts ran as and the launch commands are for.
    pub engine: super::Engine,
    /// The SLOs goodput was counted under.
    pub slo: PlanSlo,
    pub seeds: Vec<u64>,
    /// How the spread of each figure is given.
    pub spread: &'static str,
    pub steady_state: SteadyRule,
    /// The search: batch caps and MTP depths priced by steady steps, and which layouts it
    /// simulates ([`super::front`]).
    pub batch_caps: &'static [u32],
    pub mtp_depths: &'static [u32],
    pub front_margin: f64,
    pub front_min: usize,
    pub screen_margin: f64,
    pub best: Option<&'a Candidate>,
    /// Layouts whose goodput range overlaps the best's: statistically indistinguishable.
    pub tied_with_best: Vec<&'a Candidate>,
    pub layouts: &'a [Outcome],
}

impl<'a> PlanReport<'a> {
    /// Of ranked outcomes.
    pub fn new(p: &PlanInput, outcomes: &'a [Outcome]) -> PlanReport<'a> {
        let with = |s: Standing| {
            outcomes
                .iter()
                .filter(move |o| o.standing == s)
                .map(|o| &o.candidate)
        };
        PlanReport {
            engine: p.engine,
            slo: PlanSlo {
                ttft_ms: p.ttft_ms,
                tpot_ms: p.tpot_ms,
                percentiles: p.percentile_slos.clone(),
            },
            seeds: p.seed_list(),
            spread: "mean, min and max over seeds",
            steady_state: RULE,
            batch_caps: &super::BATCH_CAPS,
            mtp_depths: &super::MTP_DEPTHS,
            front_margin: FRONT_MARGIN,
            front_min: super::FRONT_MIN,
            screen_margin: SCREEN_MARGIN,
            best: with(Standing::Best).next(),
            tied_with_best: with(Standing::Tied).collect(),
            layouts: outcomes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{shapes, BATCH_CAPS};

    /// Layout `k` of the four-node A3 space at the smallest batch cap, MTP 0.
    fn shape(k: usize) -> crate::plan::Candidate {
        shapes(4, 16)[k].with(BATCH_CAPS[0], 0)
    }

    fn input(seeds: u32) -> PlanInput {
        PlanInput {
            ttft_ms: None,
            seeds,
            ..crate::plan::test_input()
        }
    }

    fn run(seed: u64, goodput: f64, tpot: f64) -> Measurement {
        Measurement {
            seed,
            finished: 1000,
            goodput_per_card: goodput,
            output_tok_s_per_card: goodput * 1500.0,
            slo_attainment: 1.0,
            ttft_p50_ms: 500.0,
            ttft_p99_ms: 900.0,
            tpot_p50_ms: tpot,
            tpot_p99_ms: tpot * 1.2,
            percentiles_ms: vec![tpot * 1.2],
            percentiles_met: true,
        }
    }

    /// Layout `k` of the search space with one level whose seeds gave `goodputs`.
    fn layout(k: usize, goodputs: &[f64], tpot: f64) -> Outcome {
        let mut o = Outcome::failed(shape(k), String::new());
        o.standing = Standing::ScreenedOut;
        o.cards = 32.0;
        o.levels = vec![Level {
            load: 0.6,
            rate_req_s: 5.0,
            window: Window::open_loop(60.0, 5.0),
            runs: goodputs
                .iter()
                .enumerate()
                .map(|(s, &g)| run(s as u64 + 1, g, tpot))
                .collect(),
        }];
        o.settle();
        o
    }

    #[test]
    fn spreads_are_mean_and_range() {
        let s = Spread::of([0.1, 0.3, 0.2]);
        assert!((s.mean - 0.2).abs() < 1e-12);
        assert_eq!((s.min, s.max), (0.1, 0.3));
        assert!((s.relative_width() - 1.0).abs() < 1e-12);
        assert!(
            s.overlaps(&Spread::of([0.3, 0.5])),
            "touching ranges overlap"
        );
        assert!(!s.overlaps(&Spread::of([0.31, 0.5])));
    }

    #[test]
    fn overlapping_ranges_tie_with_the_best_and_share_rank_one() {
        let p = input(3);
        let mut v = vec![
            layout(0, &[0.140, 0.146, 0.150], 40.0), // overlaps the best: tied
            layout(1, &[0.148, 0.152, 0.156], 40.0), // best mean
            layout(2, &[0.120, 0.125, 0.130], 40.0), // wholly below: rank 2
            layout(3, &[0.100, 0.110, 0.126], 40.0), // below both, but overlaps the third
        ];
        rank(&mut v, &p);
        assert_eq!(v[0].candidate, shape(1));
        assert_eq!(v[0].standing, Standing::Best);
        assert_eq!(v[1].standing, Standing::Tied);
        assert_eq!(v[1].rank, Some(1), "a tie is not ranked below the best");
        assert!(
            v[1].loses_because.is_none(),
            "no loss is claimed inside the spread"
        );
        assert_eq!(v[2].standing, Standing::Lower);
        assert_eq!(v[2].rank, Some(3), "two layouts lie wholly above it");
        let loss = v[2].loses_because.as_ref().unwrap();
        assert_eq!(loss.reason, "lower goodput");
        assert!(loss.detail.contains("0.1480-0.1560"), "{}", loss.detail);
        // The fourth overlaps the third: it is not ranked below it, only below the two above.
        assert_eq!(v[3].rank, Some(3));
    }

    #[test]
    fn the_same_layout_twice_is_a_tie() {
        let p = input(3);
        let a = layout(5, &[0.150, 0.147, 0.153], 40.0);
        let mut v = vec![a.clone(), a];
        rank(&mut v, &p);
        assert_eq!(v[0].standing, Standing::Best);
        assert_eq!(v[1].standing, Standing::Tied);
        assert_eq!(v[1].rank, Some(1));
    }

    #[test]
    fn a_loss_by_tpot_is_claimed_only_when_every_seed_is_over() {
        let p = input(3);
        let mut v = vec![
            layout(0, &[0.150, 0.151, 0.152], 40.0),
            layout(1, &[0.010, 0.012, 0.014], 52.0),
        ];
        // One seed of the second under the SLO: it still loses (goodput), but not by TPOT.
        v[1].levels[0].runs[0].tpot_p50_ms = 49.0;
        v[1].settle();
        rank(&mut v, &p);
        assert_eq!(v[1].loses_because.as_ref().unwrap().reason, "lower goodput");
        v[1].levels[0].runs[0].tpot_p50_ms = 51.0;
        v[1].settle();
        rank(&mut v, &p);
        let loss = v[1].loses_because.as_ref().unwrap();
        assert_eq!(loss.reason, "TPOT");
        assert!(loss.detail.contains("51.0-52.0"), "{}", loss.detail);
    }

    #[test]
    fn a_loss_by_a_percentile_slo_names_it_and_its_range() {
        let p = PlanInput {
            percentile_slos: vec![crate::plan::PercentileSlo {
                metric: crate::plan::SloMetric::Tpot,
                percentile: 99.0,
                max_ms: 55.0,
            }],
            ..input(3)
        };
        // The second's TPOT p99 (1.2 x 50 ms) is over the bound at every seed.
        let mut v = vec![
            layout(0, &[0.150, 0.151, 0.152], 40.0),
            layout(1, &[0.010, 0.012, 0.014], 50.0),
        ];
        rank(&mut v, &p);
        let loss = v[1].loses_because.as_ref().unwrap();
        assert_eq!(loss.reason, "TPOT");
        assert_eq!(
            loss.detail,
            "TPOT p99 60.0-60.0 ms, over its SLO (55 ms) at every seed"
        );
        // One seed under it: the loss is the goodput's, not the SLO's.
        v[1].levels[0].runs[0].percentiles_ms[0] = 54.0;
        v[1].settle();
        rank(&mut v, &p);
        assert_eq!(v[1].loses_because.as_ref().unwrap().reason, "lower goodput");
    }

    #[test]
    fn screening_seeds_everything_within_reach_of_the_best() {
        let seeds = 3;
        let mut v = vec![
            layout(0, &[0.150], 40.0),
            layout(1, &[0.146], 40.0), // within 5% of the best one-seed figure
            layout(2, &[0.138], 40.0), // 8% below: not yet
            layout(3, &[0.100], 40.0), // far below
            layout(4, &[0.0], 60.0),   // met no SLO
        ];
        assert_eq!(to_seed(&v, seeds), vec![0, 1]);
        // The seeds show a 10% spread: the third is now within reach of the best's lowest.
        for (i, more) in [(0, [0.135, 0.150]), (1, [0.146, 0.147])] {
            for (k, g) in more.into_iter().enumerate() {
                v[i].levels[0].runs.push(run(k as u64 + 2, g, 40.0));
            }
            v[i].settle();
        }
        assert_eq!(to_seed(&v, seeds), vec![2]);
        v[2].levels[0]
            .runs
            .extend([run(2, 0.139, 40.0), run(3, 0.137, 40.0)]);
        v[2].settle();
        assert!(
            to_seed(&v, seeds).is_empty(),
            "nothing else is within reach"
        );
        rank(&mut v, &input(3));
        let screened: Vec<_> = v
            .iter()
            .filter(|o| o.standing == Standing::ScreenedOut)
            .collect();
        assert_eq!(screened.len(), 2);
        assert!(screened[0].rank.is_none());
        let loss = screened[0].loses_because.as_ref().unwrap();
        assert_eq!(loss.reason, "lower goodput");
        assert!(loss.detail.contains("one seed"), "{}", loss.detail);
        assert_eq!(screened[1].loses_because.as_ref().unwrap().reason, "TPOT");
    }

    #[test]
    fn the_higher_load_is_reported_only_when_it_gains_enough() {
        let mut o = layout(0, &[0.100, 0.102], 40.0);
        let mut high = o.levels[0].clone();
        high.load = 0.9;
        for m in &mut high.runs {
            m.goodput_per_card *= 1.02;
        }
        o.levels.push(high.clone());
        o.settle();
        assert_eq!(o.result.as_ref().unwrap().load, 0.6, "2% is not enough");
        for m in &mut o.levels[1].runs {
            m.goodput_per_card *= 1.02;
        }
        o.settle();
        assert_eq!(o.result.as_ref().unwrap().load, 0.9);
        assert_eq!(o.result.as_ref().unwrap().seeds, vec![1, 2]);
    }

    #[test]
    fn estimated_layouts_follow_the_simulated_ones_with_the_estimate_as_their_reason() {
        let p = input(2);
        let est = |g: f64, tpot: f64| {
            let mut o = Outcome::failed(shape(3), String::new());
            o.standing = Standing::Estimated;
            o.estimate = Some(Estimate {
                capacity_req_s: 5.0,
                tpot_ms: tpot,
                prefill_ms: 500.0,
                kv_seqs: 64,
                goodput_per_card: g,
            });
            o
        };
        let mut v = vec![
            est(0.05, 40.0),
            est(0.0, 70.0),
            layout(1, &[0.1, 0.1], 40.0),
            Outcome::failed(shape(0), "layout: no".into()),
            est(0.2, 40.0),
        ];
        rank(&mut v, &p);
        let got: Vec<_> = v
            .iter()
            .map(|o| (o.standing, o.loses_because.as_ref().map(|l| l.reason)))
            .collect();
        assert_eq!(
            got,
            vec![
                (Standing::Best, None),
                (Standing::Estimated, Some("estimate")),
                (Standing::Estimated, Some("estimate")),
                (Standing::Estimated, Some("est. TPOT")),
                (Standing::Invalid, Some("layout")),
            ]
        );
        let d = &v[2].loses_because.as_ref().unwrap().detail;
        assert!(
            d.contains("0.0500 req/s per card, 75% below the best estimate (0.2000)"),
            "{d}"
        );
        assert!(v[3]
            .loses_because
            .as_ref()
            .unwrap()
            .detail
            .contains("TPOT 70.0 ms"));
    }

    #[test]
    fn invalid_layouts_come_last_with_their_reason() {
        let p = input(2);
        let mut v = vec![
            Outcome::failed(shape(0), "instance 'decode': does not fit in HBM".into()),
            layout(1, &[0.1, 0.1], 40.0),
            Outcome::failed(shape(2), format!("{RUN_FAILED}deadlock (seed 2)")),
        ];
        rank(&mut v, &p);
        assert_eq!(v[0].standing, Standing::Best);
        let reasons: Vec<_> = v[1..]
            .iter()
            .map(|o| (o.standing, o.loses_because.as_ref().unwrap().reason))
            .collect();
        assert_eq!(
            reasons,
            vec![
                (Standing::Invalid, "memory"),
                (Standing::Invalid, "run failed")
            ]
        );
    }
}
