//! Host overhead per step: the time a device spends in and between its steps running no kernel,
//! waiting for the host (scheduling, input preparation, launches, the glue between kernels).
//! Per step it is the gap since the end of the previous step plus the step's own time not
//! covered by any of its device's kernels (the union of their intervals): the twin prices a
//! step as its kernels plus this host time, so the host time must carry all of the rest. (The
//! first fit took the gaps alone; on the CPU engine the glue inside a step is 5-8% of it, and the
//! twin came out that much fast.)
//!
//! Device steps are, in order of preference: the trace's on-device step markers (a GPU
//! `ProfilerStep#N` annotation, the CPU engine's step events); else per step id the span of
//! its kernels on each device (Ascend kernel tables carry a step id). Host-side markers alone
//! (Kineto's CPU `ProfilerStep#N`) do not say when the device was busy and are not used.
//!
//! Gaps longer than `idle_factor` times the median gap are the engine idling without work, not
//! overhead, and are left out (counted). Overlapping steps (the host ran ahead) give a gap of 0.
//! Fit: `gap + idle in the next step = step_us + per_seq_us x seqs + per_token_us x tokens of
//! the next step` by least squares (all >= 0). The per-sequence term needs steps that carry
//! their sequence counts, at least two different; the per-token term steps that carry their
//! token counts, not all equal to their sequence counts (prompt chunks: input preparation and
//! the glue between kernels grow with the tokens, as the CPU engine's norms, rotary and cache
//! writes do). Without either, `step_us` is the mean. When the trace keeps the kernels of some steps only (a slice), the
//! gaps alone are fitted and the mean inside of the steps it keeps is added to `step_us`.

use crate::lsq::bounded_lstsq;
use dstwin_traces::profile::Profile;
use serde::Serialize;
use std::collections::BTreeMap;

/// Where the step spans came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepSource {
    DeviceMarkers,
    KernelStepIds,
}

/// The host-overhead fit.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HostFit {
    pub step_us: f64,
    /// Fitted when steps carry sequence counts that vary.
    pub per_seq_us: Option<f64>,
    /// Fitted when steps carry token counts that vary apart from their sequence counts.
    pub per_token_us: Option<f64>,
    pub source: StepSource,
    pub steps: usize,
    /// Gaps used, and gaps left out as idle.
    pub gaps: usize,
    pub idle_gaps: usize,
    pub median_gap_us: f64,
    /// Mean time per step inside the step not covered by a kernel, over the steps whose
    /// kernels the trace has (part of the fitted time).
    pub in_step_us: f64,
    /// Residuals of the fit over the gaps used, µs.
    pub rms_us: f64,
    pub max_us: f64,
}

/// The time before a step and inside it no kernel covers, with the step's batch.
struct Gap {
    /// Since the end of the previous step, µs.
    before_us: f64,
    /// Inside the step, µs, when its kernels are in the trace.
    inside_us: Option<f64>,
    seqs: Option<u64>,
    tokens: Option<u64>,
}

/// A device step: device, start, end (ns), sequences and tokens.
type Span = (Option<u32>, u64, u64, Option<u64>, Option<u64>);

fn spans(p: &Profile) -> Option<(StepSource, Vec<Span>)> {
    let markers: Vec<Span> = p
        .steps
        .iter()
        .filter(|s| s.on_device)
        .map(|s| (s.device, s.start_ns, s.end_ns(), s.seqs, s.tokens))
        .collect();
    if !markers.is_empty() {
        return Some((StepSource::DeviceMarkers, markers));
    }
    let mut by_step: BTreeMap<(Option<u32>, u64), (u64, u64)> = BTreeMap::new();
    for k in &p.kernels {
        if let (Some(step), Some(start), Some(end)) = (k.step, k.start_ns, k.end_ns()) {
            let e = by_step.entry((k.device, step)).or_insert((start, end));
            e.0 = e.0.min(start);
            e.1 = e.1.max(end);
        }
    }
    (!by_step.is_empty()).then(|| {
        let v = by_step
            .into_iter()
            .map(|((d, _), (s, e))| (d, s, e, None, None))
            .collect();
        (StepSource::KernelStepIds, v)
    })
}

/// The host time of a profile's steps, as [`fit_host`] fits it and [`check_host`] prices it.
struct HostSamples {
    source: StepSource,
    steps: usize,
    /// Per step used: host time µs (the gap before it, plus its inside when `whole`),
    /// sequences, tokens.
    kept: Vec<(f64, Option<u64>, Option<u64>)>,
    /// Gaps left out as idle.
    idle: usize,
    median_gap_us: f64,
    in_step_us: f64,
    /// Whether every step used has its inside in `kept` (else the trace is a slice).
    whole: bool,
}

fn host_samples(p: &Profile, idle_factor: f64) -> Option<HostSamples> {
    let (source, mut spans) = spans(p)?;
    spans.sort_by_key(|s| (s.0, s.1));
    let busy = Busy::new(p);
    let mut gaps: Vec<Gap> = Vec::new();
    for w in spans.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        if a.0 == b.0 {
            let inner = busy
                .within(b.0, b.1, b.2)
                .map(|k| b.2.saturating_sub(b.1).saturating_sub(k) as f64 / 1e3);
            gaps.push(Gap {
                before_us: b.1.saturating_sub(a.2) as f64 / 1e3,
                inside_us: inner,
                seqs: b.3,
                tokens: b.4,
            });
        }
    }
    if gaps.is_empty() {
        return None;
    }
    let mut sorted: Vec<f64> = gaps.iter().map(|g| g.before_us).collect();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    // Idle is told by the gap alone.
    let used: Vec<&Gap> = gaps
        .iter()
        .filter(|g| median <= 0.0 || g.before_us <= idle_factor * median)
        .collect();
    let inner: Vec<f64> = used.iter().filter_map(|g| g.inside_us).collect();
    let in_step_us = inner.iter().sum::<f64>() / inner.len().max(1) as f64;
    // Every step's inside known: each sample is its gap and its inside. A trace that keeps some
    // steps' kernels only (a slice): the gaps are fitted, and the mean inside of the steps it
    // keeps is added to the fixed part (a step without kernels says nothing about its inside).
    let whole = inner.len() == used.len();
    // (host time µs, sequences, tokens)
    let kept: Vec<(f64, Option<u64>, Option<u64>)> = used
        .iter()
        .map(|g| {
            let inside = if whole {
                g.inside_us.unwrap_or(0.0)
            } else {
                0.0
            };
            (g.before_us + inside, g.seqs, g.tokens)
        })
        .collect();
    Some(HostSamples {
        source,
        steps: spans.len(),
        idle: gaps.len() - kept.len(),
        kept,
        median_gap_us: median,
        in_step_us,
        whole,
    })
}

/// Fits host overhead per step to one profile; `None` when it marks fewer than two steps on a
/// device.
pub fn fit_host(p: &Profile, idle_factor: f64) -> Option<HostFit> {
    fit_samples(&host_samples(p, idle_factor)?)
}

/// Fits host overhead per step to the steps of several profiles together (the runs of one
/// engine profiled apart, e.g. before and after a measurement to average a machine's drift);
/// `None` when fewer than two of them mark two steps on a device. Each profile's idle gaps are
/// told by its own median gap. Where some profiles keep every step's kernels and others a slice,
/// each slice's steps get its mean inside added, so that every sample is a step's whole host
/// time.
pub fn fit_host_pooled(profiles: &[Profile], idle_factor: f64) -> Option<HostFit> {
    fit_hosts(profiles, idle_factor).1
}

/// [`fit_host`] of each profile and [`fit_host_pooled`] of them all, each profile's steps read
/// once for both.
pub fn fit_hosts(
    profiles: &[Profile],
    idle_factor: f64,
) -> (Vec<Option<HostFit>>, Option<HostFit>) {
    let parts: Vec<Option<HostSamples>> = profiles
        .iter()
        .map(|p| host_samples(p, idle_factor))
        .collect();
    let each = parts
        .iter()
        .map(|h| h.as_ref().and_then(fit_samples))
        .collect();
    let parts: Vec<&HostSamples> = parts.iter().flatten().collect();
    let pooled = (parts.len() >= 2)
        .then(|| pool(&parts))
        .and_then(|h| fit_samples(&h));
    (each, pooled)
}

/// The samples of several profiles as one set (at least one profile).
fn pool(parts: &[&HostSamples]) -> HostSamples {
    let slices = parts.iter().all(|h| !h.whole);
    let kept_n: usize = parts.iter().map(|h| h.kept.len()).sum();
    let in_step_us = parts
        .iter()
        .map(|h| h.in_step_us * h.kept.len() as f64)
        .sum::<f64>()
        / kept_n.max(1) as f64;
    let mut medians: Vec<f64> = parts.iter().map(|h| h.median_gap_us).collect();
    medians.sort_by(f64::total_cmp);
    HostSamples {
        source: parts[0].source,
        steps: parts.iter().map(|h| h.steps).sum(),
        idle: parts.iter().map(|h| h.idle).sum(),
        median_gap_us: medians[medians.len() / 2],
        in_step_us,
        // All slices: fitted as one slice; otherwise every sample is made whole.
        whole: !slices,
        kept: parts
            .iter()
            .flat_map(|h| {
                // Mixed: a slice's samples are its gaps; its mean inside makes them whole.
                let add = if !slices && !h.whole {
                    h.in_step_us
                } else {
                    0.0
                };
                h.kept.iter().map(move |&(t, s, k)| (t + add, s, k))
            })
            .collect(),
    }
}

fn fit_samples(samples: &HostSamples) -> Option<HostFit> {
    let &HostSamples {
        source,
        steps,
        ref kept,
        idle,
        median_gap_us: median,
        in_step_us,
        whole,
    } = samples;
    let seqs: Option<Vec<f64>> = kept.iter().map(|g| g.1.map(|s| s as f64)).collect();
    let tokens: Option<Vec<f64>> = kept.iter().map(|g| g.2.map(|t| t as f64)).collect();
    let seqs = seqs.filter(|s| s.iter().any(|x| *x != s[0]));
    // Tokens tell something apart from sequences only where some step's differ.
    let tokens = tokens.filter(|t| match &seqs {
        Some(s) => t.iter().zip(s).any(|(a, b)| a != b),
        None => t.iter().any(|x| *x != t[0]),
    });
    let columns: Vec<&Vec<f64>> = seqs.iter().chain(tokens.iter()).collect();
    let coef: Vec<f64> = if columns.is_empty() {
        vec![kept.iter().map(|g| g.0).sum::<f64>() / kept.len() as f64]
    } else {
        let rows: Vec<(Vec<f64>, f64)> = kept
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let mut x = vec![1.0];
                x.extend(columns.iter().map(|c| c[i]));
                (x, g.0)
            })
            .collect();
        let n = columns.len() + 1;
        bounded_lstsq(&rows, &vec![0.0; n], &vec![f64::INFINITY; n])?
    };
    let step_us = coef[0];
    let per_seq = seqs.as_ref().map(|_| coef[1]);
    let per_token = tokens
        .as_ref()
        .map(|_| coef[if seqs.is_some() { 2 } else { 1 }]);
    let resid: Vec<f64> = kept
        .iter()
        .map(|g| {
            step_us
                + per_seq.unwrap_or(0.0) * g.1.unwrap_or(0) as f64
                + per_token.unwrap_or(0.0) * g.2.unwrap_or(0) as f64
                - g.0
        })
        .collect();
    Some(HostFit {
        step_us: if whole { step_us } else { step_us + in_step_us },
        per_seq_us: per_seq,
        per_token_us: per_token,
        source,
        steps,
        gaps: kept.len(),
        idle_gaps: idle,
        median_gap_us: median,
        in_step_us,
        rms_us: (resid.iter().map(|r| r * r).sum::<f64>() / resid.len() as f64).sqrt(),
        max_us: resid
            .iter()
            .fold(0.0, |m, r| if r.abs() > m.abs() { *r } else { m }),
    })
}

/// The timed kernels of each device as merged busy intervals (ns), for the time a span spends
/// in kernels.
struct Busy {
    by_device: BTreeMap<Option<u32>, Vec<(u64, u64)>>,
}

impl Busy {
    fn new(p: &Profile) -> Busy {
        let mut by_device: BTreeMap<Option<u32>, Vec<(u64, u64)>> = BTreeMap::new();
        for k in &p.kernels {
            if let (Some(s), Some(e)) = (k.start_ns, k.end_ns()) {
                by_device.entry(k.device).or_default().push((s, e));
            }
        }
        for v in by_device.values_mut() {
            v.sort_unstable();
            let mut merged: Vec<(u64, u64)> = Vec::with_capacity(v.len());
            for &(s, e) in v.iter() {
                match merged.last_mut() {
                    Some(last) if s <= last.1 => last.1 = last.1.max(e),
                    _ => merged.push((s, e)),
                }
            }
            *v = merged;
        }
        Busy { by_device }
    }

    /// Time of `[start, end)` on `device` covered by kernels, ns; `None` when no timed kernel
    /// of the device overlaps it (a trace that keeps some steps' kernels only, or none of the
    /// device's: it says nothing about the step's inside).
    fn within(&self, device: Option<u32>, start: u64, end: u64) -> Option<u64> {
        let v = self.by_device.get(&device)?;
        // Intervals are disjoint and sorted: the first that may overlap ends after `start`.
        let from = v.partition_point(|iv| iv.1 <= start);
        let inside = v[from..].iter().take_while(|iv| iv.0 < end);
        let mut any = false;
        let busy = inside
            .map(|iv| {
                any = true;
                iv.1.min(end) - iv.0.max(start)
            })
            .sum::<u64>();
        any.then_some(busy)
    }
}

/// A profile's host time against a cost file's `[host]` terms ([`check_host`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HostCheck {
    pub source: StepSource,
    /// Steps whose host time is compared, and gaps left out as idle.
    pub gaps: usize,
    pub idle_gaps: usize,
    /// Host time over those steps: measured, and as the terms price it, ms.
    pub measured_ms: f64,
    pub priced_ms: f64,
    /// Per step, priced less measured, µs.
    pub rms_us: f64,
}

/// Host time per step of one profile (measured as [`fit_host`] takes it) against `step_us +
/// per_seq_us x seqs + per_token_us x tokens`; `None` when the profile marks fewer than two
/// device steps.
pub fn check_host(
    p: &Profile,
    idle_factor: f64,
    step_us: f64,
    per_seq_us: f64,
    per_token_us: f64,
) -> Option<HostCheck> {
    let h = host_samples(p, idle_factor)?;
    // A slice of a trace has no inside for its steps: its mean inside stands in, as in the fit.
    let extra = if h.whole { 0.0 } else { h.in_step_us };
    let (mut measured, mut priced, mut sq) = (0.0, 0.0, 0.0);
    for (us, seqs, tokens) in &h.kept {
        let m = us + extra;
        let q = step_us
            + per_seq_us * seqs.unwrap_or(0) as f64
            + per_token_us * tokens.unwrap_or(0) as f64;
        measured += m;
        priced += q;
        sq += (q - m) * (q - m);
    }
    let n = h.kept.len().max(1) as f64;
    Some(HostCheck {
        source: h.source,
        gaps: h.kept.len(),
        idle_gaps: h.idle,
        measured_ms: measured / 1e3,
        priced_ms: priced / 1e3,
        rms_us: (sq / n).sqrt(),
    })
}

/// A device step's start and end (ns) and whether it came after idling.
type StepSpan = (u64, u64, bool);

/// The device steps of a profile, each with its place among them and whether it started after
/// idling: more than `after_us` after the previous step of its device ended, so that its kernels
/// may run cold. (A device's first step has no gap before it and is not cold.)
#[derive(Clone, Debug, Default)]
pub struct DeviceSteps {
    /// Per device, the first step's place and the steps' (start, end) in ns with whether they
    /// are cold, sorted.
    by_device: BTreeMap<Option<u32>, (usize, Vec<StepSpan>)>,
    /// Per step by its place, whether it computes decodes only (its tokens are its sequences;
    /// `None`: the trace does not say).
    pub decode_only: Vec<Option<bool>>,
    /// How many steps, and how many of them cold.
    pub steps: usize,
    pub cold: usize,
}

impl DeviceSteps {
    /// `after_us` `None`: no step is cold.
    pub fn of(p: &Profile, after_us: Option<f64>) -> DeviceSteps {
        let mut c = DeviceSteps::default();
        let Some((_, mut spans)) = spans(p) else {
            return c;
        };
        spans.sort_by_key(|s| (s.0, s.1));
        for (i, s) in spans.iter().enumerate() {
            let cold = i > 0
                && spans[i - 1].0 == s.0
                && after_us.is_some_and(|a| s.1.saturating_sub(spans[i - 1].2) as f64 / 1e3 > a);
            let (_, v) = c.by_device.entry(s.0).or_insert((i, Vec::new()));
            v.push((s.1, s.2, cold));
            c.decode_only
                .push(s.3.zip(s.4).map(|(seqs, tokens)| seqs == tokens));
            c.cold += usize::from(cold);
        }
        c.steps = spans.len();
        c
    }

    /// The step a kernel of `device` starting at `start_ns` runs in: its place among the
    /// profile's steps, and whether it is cold.
    pub fn locate(&self, device: Option<u32>, start_ns: u64) -> Option<(usize, bool)> {
        let (first, v) = self.by_device.get(&device)?;
        let i = v.partition_point(|s| s.0 <= start_ns);
        (i > 0 && start_ns < v[i - 1].1).then(|| (first + i - 1, v[i - 1].2))
    }
}
