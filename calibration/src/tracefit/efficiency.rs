//! The efficiency curve of one op class, fitted to kernels: for an op with F FLOPs, B HBM bytes
//! and R rows (the GEMM M dimension) on a chip with peak P and bandwidth W,
//!
//! ```text
//! time = fixed_us + max( F / (P * compute) * (R + rows_pad) / R ,  B / (W * memory) )
//! ```
//!
//! (the cost model's form per op class; without R the factor is 1).
//!
//! **Fit.** With `u = 1/compute`, `w = rows_pad/compute`, `v = 1/memory`, each branch of the max
//! is linear: the compute branch `(F/P)·u + (F/(P·R))·w`, the memory branch `(B/W)·v`. For a given
//! assignment of samples to branches the fit is a bounded linear least squares over relative
//! errors (`fixed_us >= 0`, `compute, memory <= 1`, `rows_pad >= 0`; [`crate::lsq`]). The
//! assignment is found by alternating (fit, re-assign each sample to its larger branch) from
//! several starts: everything compute-bound, everything memory-bound, and cuts along the samples'
//! arithmetic intensity; the start whose converged fit has the smallest error under the true
//! `max` wins.
//!
//! **Robust.** The fit is then re-weighted (Huber weights on the relative residuals, scale from
//! their median absolute value), so that a few kernels slowed by something the model does not
//! see (contention, a cold cache) do not pull it; they are counted as outliers.
//!
//! **Objective.** [`Objective::Relative`] (the default) is the above: every kernel counts alike,
//! and the fit follows the typical kernel of a shape. [`Objective::Total`] is plain least squares
//! over absolute times, without re-weighting: every kernel weighs as its time does, slow ones
//! included, so the fitted times add up to about the measured ones (exactly when `fixed_us` is
//! above its bound 0: least squares with a free offset leaves residuals that sum to zero). A twin that predicts
//! steps (sums of kernels) and their means wants that when the kernels' times have a long tail
//! (a shared CPU: the CPU engine's kernels are 20% slower on average than at their median).
//!
//! **What the samples determine.** A parameter the samples cannot see keeps the prior value (the
//! shipped cost file's) and is reported as not determined: `compute` and `rows_pad` need
//! compute-bound samples (`rows_pad` at two row counts or more), `memory` a memory-bound one,
//! `fixed_us` one distinct kernel shape more than the other parameters fitted.

use crate::lsq::bounded_lstsq;
use dstwin_hwmodels::{OneRow, Resource};
use serde::Serialize;

/// Most starting cuts along the arithmetic intensity.
const MAX_CUTS: usize = 24;
/// Most alternations from one start.
const MAX_ALTERNATIONS: usize = 40;
/// Re-weighting rounds of the robust fit.
const ROBUST_ROUNDS: usize = 8;
/// Huber's tuning constant (95% efficiency under normal errors).
const HUBER_K: f64 = 1.345;
/// Smallest residual scale the weights use (0.1%): below it every sample fits.
const MIN_SCALE: f64 = 1e-3;

/// What the fit minimizes (module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    /// Relative errors, robustly re-weighted: the typical kernel.
    #[default]
    Relative,
    /// Absolute errors, every kernel at full weight: the total time.
    Total,
}

impl Objective {
    pub const ALL: [Objective; 2] = [Objective::Relative, Objective::Total];

    pub fn name(self) -> &'static str {
        match self {
            Objective::Relative => "relative",
            Objective::Total => "total",
        }
    }

    pub fn parse(s: &str) -> Option<Objective> {
        Objective::ALL.into_iter().find(|o| o.name() == s)
    }
}

/// One kernel as the fit sees it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Sample {
    pub flops: f64,
    pub bytes: f64,
    pub rows: Option<f64>,
    /// Peak FLOP/s of the format the kernel computes in.
    pub peak_flops: f64,
    pub hbm_bytes_per_s: f64,
    /// Measured duration, µs.
    pub time_us: f64,
}

impl Sample {
    /// Whether the cost model prices the kernel with its class's one-row form, where the class
    /// has one ([`OneRow::covers`]).
    pub fn one_row(&self) -> bool {
        self.rows.is_some_and(OneRow::covers)
    }

    /// µs at the compute peak, the same over rows, and µs at the memory peak.
    fn features(&self) -> (f64, f64, f64) {
        let a = self.flops / self.peak_flops * 1e6;
        let b = self.rows.map_or(0.0, |r| a / r);
        (a, b, self.bytes / self.hbm_bytes_per_s * 1e6)
    }
}

/// One class's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ClassParams {
    pub compute: f64,
    pub memory: f64,
    pub rows_pad: f64,
    pub fixed_us: f64,
}

impl ClassParams {
    /// The compute and memory branches, µs.
    pub fn branches_us(&self, s: &Sample) -> (f64, f64) {
        let (a, b, d) = s.features();
        ((a + b * self.rows_pad) / self.compute, d / self.memory)
    }

    /// Predicted duration, µs.
    pub fn time_us(&self, s: &Sample) -> f64 {
        let (c, m) = self.branches_us(s);
        self.fixed_us + c.max(m)
    }
}

/// Which parameters the samples determined (the others kept the prior's value).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Determined {
    pub compute: bool,
    pub memory: bool,
    pub rows_pad: bool,
    pub fixed_us: bool,
}

/// A fitted class.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EfficiencyFit {
    pub params: ClassParams,
    pub determined: Determined,
    pub samples: usize,
    /// Samples on each branch under the fit.
    pub compute_bound: usize,
    pub memory_bound: usize,
    /// Relative errors of the fit over every sample (unweighted).
    pub rms_error: f64,
    pub max_error: f64,
    /// Samples the robust fit weighed below one half.
    pub outliers: usize,
}

/// Unknowns in the linear form: fixed, 1/compute, rows_pad/compute, 1/memory.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Linear([f64; 4]);

impl Linear {
    fn params(self, rows_pad: Option<f64>) -> ClassParams {
        let [f, u, w, v] = self.0;
        ClassParams {
            compute: 1.0 / u,
            memory: 1.0 / v,
            rows_pad: rows_pad.unwrap_or(w / u),
            fixed_us: f,
        }
    }
}

/// What is held fixed, and at what.
#[derive(Clone, Copy, Debug)]
struct Holds {
    compute: Option<f64>,
    memory: Option<f64>,
    rows_pad: Option<f64>,
    fixed_us: Option<f64>,
}

struct Problem<'a> {
    /// (a, b, d, t) per sample: µs at compute peak, the same over rows, µs at memory peak, µs.
    x: Vec<(f64, f64, f64, f64)>,
    samples: &'a [Sample],
    holds: Holds,
    objective: Objective,
}

impl<'a> Problem<'a> {
    fn new(samples: &'a [Sample], holds: Holds, objective: Objective) -> Problem<'a> {
        let x = samples
            .iter()
            .map(|s| {
                let (a, b, d) = s.features();
                (a, b, d, s.time_us)
            })
            .collect();
        Problem {
            x,
            samples,
            holds,
            objective,
        }
    }

    /// Bounded least squares for an assignment (true: compute branch) and weights.
    fn solve(&self, assign: &[bool], weights: &[f64]) -> Option<ClassParams> {
        let h = self.holds;
        let rows: Vec<(Vec<f64>, f64)> = self
            .x
            .iter()
            .zip(assign)
            .zip(weights)
            .map(|((&(a, b, d, t), &c), &wt)| {
                let s = match self.objective {
                    Objective::Relative => wt.sqrt() / t,
                    Objective::Total => wt.sqrt(),
                };
                let row = if c {
                    // With rows_pad held, its term folds into the compute column.
                    let a = a + h.rows_pad.map_or(0.0, |r| b * r);
                    let b = if h.rows_pad.is_some() { 0.0 } else { b };
                    vec![s, a * s, b * s, 0.0]
                } else {
                    vec![s, 0.0, 0.0, d * s]
                };
                (row, t * s)
            })
            .collect();
        let inf = f64::INFINITY;
        let mut lo = [0.0, 1.0, 0.0, 1.0];
        let mut hi = [inf, inf, inf, inf];
        let mut hold = |j: usize, v: Option<f64>| {
            if let Some(v) = v {
                lo[j] = v;
                hi[j] = v;
            }
        };
        hold(0, h.fixed_us);
        hold(1, h.compute.map(|c| 1.0 / c));
        hold(2, h.rows_pad.map(|_| 0.0));
        hold(3, h.memory.map(|m| 1.0 / m));
        let x = bounded_lstsq(&rows, &lo, &hi)?;
        let x = Linear([x[0], x[1], x[2], x[3]]);
        Some(x.params(h.rows_pad))
    }

    fn assign(&self, p: &ClassParams) -> Vec<bool> {
        self.samples
            .iter()
            .map(|s| {
                let (c, m) = p.branches_us(s);
                c >= m
            })
            .collect()
    }

    fn loss(&self, p: &ClassParams, weights: &[f64]) -> f64 {
        self.samples
            .iter()
            .zip(weights)
            .map(|(s, w)| match self.objective {
                Objective::Relative => w * (p.time_us(s) / s.time_us - 1.0).powi(2),
                Objective::Total => w * (p.time_us(s) - s.time_us).powi(2),
            })
            .sum()
    }

    /// Alternates fit and assignment from `start` until the assignment holds.
    fn converge(&self, start: Vec<bool>, weights: &[f64]) -> Option<ClassParams> {
        let mut assign = start;
        let mut best: Option<(f64, ClassParams)> = None;
        for _ in 0..MAX_ALTERNATIONS {
            let p = self.solve(&assign, weights)?;
            let l = self.loss(&p, weights);
            if best.as_ref().is_none_or(|b| l < b.0) {
                best = Some((l, p));
            }
            let next = self.assign(&p);
            if next == assign {
                break;
            }
            assign = next;
        }
        best.map(|b| b.1)
    }

    /// The best converged fit over the starts; `first` is tried first and wins ties (with a
    /// sample or two, either branch can fit exactly: the prior's branches are the better guess).
    fn fit(&self, weights: &[f64], first: Vec<bool>) -> Option<ClassParams> {
        let n = self.x.len();
        let intensity: Vec<f64> = self
            .x
            .iter()
            .map(|&(a, _, d, _)| if d > 0.0 { a / d } else { f64::INFINITY })
            .collect();
        let mut sorted = intensity.clone();
        sorted.sort_by(f64::total_cmp);
        sorted.dedup();
        let mut starts = vec![first, vec![true; n], vec![false; n]];
        let cuts = sorted.len().saturating_sub(1).min(MAX_CUTS);
        for c in 1..=cuts {
            let thr = sorted[c * (sorted.len() - 1) / cuts.max(1)];
            starts.push(intensity.iter().map(|&i| i >= thr).collect());
        }
        // A later start must be better by more than rounding to displace an earlier one.
        starts
            .into_iter()
            .filter_map(|s| self.converge(s, weights))
            .map(|p| (self.loss(&p, weights), p))
            .fold(None, |best: Option<(f64, ClassParams)>, c| match best {
                Some(b) if c.0 >= b.0 * (1.0 - 1e-9) - 1e-18 => Some(b),
                _ => Some(c),
            })
            .map(|b| b.1)
    }
}

fn rel_errors(samples: &[Sample], p: &ClassParams) -> Vec<f64> {
    samples
        .iter()
        .map(|s| p.time_us(s) / s.time_us - 1.0)
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    dstwin_traces::quantile(&v, 0.5)
}

/// Fits one class to its samples over relative errors ([`fit_class_with`]).
/// Fewest kernels on each side (one row, more rows) for a class's one-row kernels to get their
/// own fit.
pub const MIN_ONE_ROW: usize = 32;

/// A class fitted with its one-row kernels apart ([`fit_split`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SplitFit {
    /// The class's form, fitted to every kernel or, with `one_row`, to those of more rows.
    pub main: EfficiencyFit,
    /// The one-row kernels' own form (no tile padding): where the class has at least
    /// [`MIN_ONE_ROW`] kernels of one row and as many of more, and fitting them apart lowers
    /// the rms relative error over all of the class's kernels by a tenth and by at least one
    /// point. (Engines run a one-row product as a
    /// matrix-vector kernel: on the CPU engine a one-row projection takes a fifth of a two-row
    /// one.)
    pub one_row: Option<EfficiencyFit>,
    /// Relative errors over every kernel of the class under the fit used.
    pub rms_error: f64,
    /// The same with one form for every kernel (the fit without a one-row part).
    pub rms_error_joint: f64,
}

/// Fits a class, its one-row kernels apart when they are enough and it pays ([`SplitFit`]).
pub fn fit_split(samples: &[Sample], prior: ClassParams, objective: Objective) -> Option<SplitFit> {
    // The samples every fit keeps, so that both errors are over the same kernels.
    let samples: Vec<Sample> = samples.iter().copied().filter(usable).collect();
    let joint = fit_class_with(&samples, prior, objective)?;
    let ones: Vec<Sample> = samples
        .iter()
        .filter(|s| s.one_row())
        .map(|s| Sample { rows: None, ..*s })
        .collect();
    let wider: Vec<Sample> = samples.iter().copied().filter(|s| !s.one_row()).collect();
    let apart = (ones.len() >= MIN_ONE_ROW && wider.len() >= MIN_ONE_ROW)
        .then(|| {
            let main = fit_class_with(&wider, prior, objective)?;
            let first = ClassParams {
                rows_pad: 0.0,
                ..main.params
            };
            let single = fit_held(&ones, first, objective, true)?;
            Some((main, single))
        })
        .flatten();
    let joint_rms = joint.rms_error;
    // Three more parameters must earn their keep: a tenth of the error and a point.
    let split = apart
        .map(|(main, single)| {
            let r: Vec<f64> = samples
                .iter()
                .map(|s| {
                    let t = if s.one_row() {
                        single.params.time_us(&Sample { rows: None, ..*s })
                    } else {
                        main.params.time_us(s)
                    };
                    t / s.time_us - 1.0
                })
                .collect();
            let rms = (r.iter().map(|x| x * x).sum::<f64>() / r.len().max(1) as f64).sqrt();
            (main, single, rms)
        })
        .filter(|&(_, _, rms)| rms < 0.9 * joint_rms && joint_rms - rms > 0.01);
    Some(match split {
        Some((main, single, rms)) => SplitFit {
            main,
            one_row: Some(single),
            rms_error: rms,
            rms_error_joint: joint_rms,
        },
        None => SplitFit {
            main: joint,
            one_row: None,
            rms_error: joint_rms,
            rms_error_joint: joint_rms,
        },
    })
}

/// Fewest kernels of one op for it to get a form of its own ([`fit_op`]).
pub const MIN_OP_KERNELS: usize = 32;

/// An op's own form, the cost model's `[[kernel]]` entry: its fixed cost and the efficiency of
/// its bound's resource; the other resource at its class's efficiency, no tile padding.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct OpForm {
    pub bound: Resource,
    pub efficiency: f64,
    pub fixed_us: f64,
}

impl OpForm {
    /// The form as class parameters, given the op's class's.
    pub fn params(&self, class: &ClassParams) -> ClassParams {
        let (compute, memory) = match self.bound {
            Resource::Compute => (self.efficiency, class.memory),
            Resource::Memory => (class.compute, self.efficiency),
        };
        ClassParams {
            compute,
            memory,
            rows_pad: 0.0,
            fixed_us: self.fixed_us,
        }
    }

    /// A kernel's time under the form, µs (rows play no part: no tile padding, no one-row form).
    pub fn time_us(&self, class: &ClassParams, s: &Sample) -> f64 {
        self.params(class).time_us(&Sample { rows: None, ..*s })
    }
}

/// An op fitted apart from its class ([`fit_op`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OpFit {
    pub form: OpForm,
    /// The objective's error over the op's kernels under its own form and under its class's
    /// (rms relative error, or rms absolute error in µs for the total objective).
    pub error: f64,
    pub class_error: f64,
    pub samples: usize,
}

/// The objective's error of predictions `pred` against the samples' times: rms relative, or
/// rms absolute (µs) for the total objective.
fn objective_error(samples: &[Sample], pred: impl Fn(&Sample) -> f64, objective: Objective) -> f64 {
    let n = samples.len().max(1) as f64;
    let sq: f64 = samples
        .iter()
        .map(|s| match objective {
            Objective::Relative => (pred(s) / s.time_us - 1.0).powi(2),
            Objective::Total => (pred(s) - s.time_us).powi(2),
        })
        .sum();
    (sq / n).sqrt()
}

/// Fits one op's kernels a form of their own ([`OpForm`]: the cost model prices an op with a
/// `[[kernel]]` entry that way), against `class`, the form its class's fit gives it
/// (`class_time`: the twin's price of a kernel under the class's fit, its one-row form
/// included). Kept only where the op has at least [`MIN_OP_KERNELS`] kernels and its own form
/// lowers the objective's error over them by at least a quarter: an op the engine runs unlike
/// the rest of its class (the CPU engine's norms run at a third of its other elementwise ops'
/// speed per element; its sampling copies the logits to the host) gets its own price, an op the
/// class describes keeps the class's. Both resources are tried as the bound; the better wins.
pub fn fit_op(
    samples: &[Sample],
    class: ClassParams,
    class_time: impl Fn(&Sample) -> f64,
    objective: Objective,
) -> Option<OpFit> {
    let f = op_form(samples, class, class_time, objective)?;
    (f.error < 0.75 * f.class_error).then_some(f)
}

/// [`fit_op`] without the test that the op's own form pays: `None` only below
/// [`MIN_OP_KERNELS`] kernels or without a fit.
pub fn op_form(
    samples: &[Sample],
    class: ClassParams,
    class_time: impl Fn(&Sample) -> f64,
    objective: Objective,
) -> Option<OpFit> {
    let samples: Vec<Sample> = samples.iter().copied().filter(usable).collect();
    if samples.len() < MIN_OP_KERNELS {
        return None;
    }
    let flat: Vec<Sample> = samples
        .iter()
        .map(|s| Sample { rows: None, ..*s })
        .collect();
    let class_error = objective_error(&samples, &class_time, objective);
    let prior = ClassParams {
        rows_pad: 0.0,
        ..class
    };
    let forms = [Resource::Compute, Resource::Memory].map(|bound| {
        let holds = Holds {
            compute: (bound == Resource::Memory).then_some(class.compute),
            memory: (bound == Resource::Compute).then_some(class.memory),
            rows_pad: Some(0.0),
            fixed_us: None,
        };
        fit_holding(&flat, prior, objective, holds).map(|f| OpForm {
            bound,
            efficiency: match bound {
                Resource::Compute => f.params.compute,
                Resource::Memory => f.params.memory,
            },
            fixed_us: f.params.fixed_us,
        })
    });
    let (form, error) = forms
        .into_iter()
        .flatten()
        .map(|f| {
            let e = objective_error(&samples, |s| f.time_us(&class, s), objective);
            (f, e)
        })
        .min_by(|a, b| a.1.total_cmp(&b.1))?;
    Some(OpFit {
        form,
        error,
        class_error,
        samples: samples.len(),
    })
}

pub fn fit_class(samples: &[Sample], prior: ClassParams) -> Option<EfficiencyFit> {
    fit_class_with(samples, prior, Objective::Relative)
}

/// Fits one class to its samples; parameters the samples cannot determine keep `prior`'s value.
/// `None` without usable samples (each needs a positive time and finite work).
pub fn fit_class_with(
    samples: &[Sample],
    prior: ClassParams,
    objective: Objective,
) -> Option<EfficiencyFit> {
    fit_held(samples, prior, objective, false)
}

/// A sample a fit can use: a positive time and finite work.
fn usable(s: &Sample) -> bool {
    let (a, b, d) = s.features();
    s.time_us > 0.0
        && s.time_us.is_finite()
        && [a, b, d].iter().all(|x| x.is_finite() && *x >= 0.0)
        && a + d > 0.0
}

/// [`fit_class_with`], with the compute efficiency and the tile padding held at `prior`'s when
/// `hold_compute` (one-row kernels: a matrix-vector product's FLOPs and bytes grow together,
/// so the two efficiencies cannot be told apart, and the wider kernels' compute efficiency
/// stands).
fn fit_held(
    samples: &[Sample],
    prior: ClassParams,
    objective: Objective,
    hold_compute: bool,
) -> Option<EfficiencyFit> {
    let holds = Holds {
        compute: hold_compute.then_some(prior.compute),
        memory: None,
        rows_pad: hold_compute.then_some(prior.rows_pad),
        fixed_us: None,
    };
    fit_holding(samples, prior, objective, holds)
}

/// The fit with `holds` held at their values (and whatever the samples cannot determine at
/// `prior`'s).
fn fit_holding(
    samples: &[Sample],
    prior: ClassParams,
    objective: Objective,
    mut holds: Holds,
) -> Option<EfficiencyFit> {
    let samples: Vec<Sample> = samples.iter().copied().filter(usable).collect();
    if samples.is_empty() {
        return None;
    }
    let n = samples.len();
    if n < 2 {
        holds.fixed_us = Some(prior.fixed_us);
    }
    let mut weights = vec![1.0; n];
    let mut params = prior;
    // Decide what the samples determine, refitting until that settles (at most once per
    // parameter).
    for _ in 0..5 {
        let problem = Problem::new(&samples, holds, objective);
        params = problem.fit(&weights, problem.assign(&prior))?;
        let assign = problem.assign(&params);
        let compute_rows: Vec<f64> = samples
            .iter()
            .zip(&assign)
            .filter(|(_, c)| **c)
            .filter_map(|(s, _)| s.rows)
            .collect();
        let mut distinct = compute_rows.clone();
        distinct.sort_by(f64::total_cmp);
        distinct.dedup();
        let mut next = holds;
        if !assign.iter().any(|c| *c) {
            next.compute = Some(prior.compute);
            next.rows_pad = Some(prior.rows_pad);
        } else if distinct.len() < 2 {
            next.rows_pad = Some(prior.rows_pad);
        }
        if assign.iter().all(|c| *c) {
            next.memory = Some(prior.memory);
        }
        // fixed_us is an offset shared by every sample: it needs one distinct point more than
        // the slopes fitted with it (two kernels of one shape cannot split time into a fixed
        // part and a rate).
        let mut points: Vec<(bool, u64, u64)> = problem
            .x
            .iter()
            .zip(&assign)
            .map(|(&(a, b, d, _), &c)| {
                if c {
                    (true, a.to_bits(), b.to_bits())
                } else {
                    (false, d.to_bits(), 0)
                }
            })
            .collect();
        points.sort_unstable();
        points.dedup();
        let slopes = [next.compute, next.rows_pad, next.memory]
            .iter()
            .filter(|h| h.is_none())
            .count();
        if points.len() <= slopes {
            next.fixed_us = Some(prior.fixed_us);
        }
        let same = |a: Option<f64>, b: Option<f64>| a.is_some() == b.is_some();
        if same(next.compute, holds.compute)
            && same(next.memory, holds.memory)
            && same(next.rows_pad, holds.rows_pad)
            && same(next.fixed_us, holds.fixed_us)
        {
            break;
        }
        holds = next;
    }
    let problem = Problem::new(&samples, holds, objective);
    // Robust re-weighting (the relative objective; the total one counts every kernel).
    let rounds = match objective {
        Objective::Relative => ROBUST_ROUNDS,
        Objective::Total => 0,
    };
    for _ in 0..rounds {
        let r = rel_errors(&samples, &params);
        let scale = (1.4826 * median(r.iter().map(|x| x.abs()).collect())).max(MIN_SCALE);
        let delta = HUBER_K * scale;
        weights = r
            .iter()
            .map(|x| {
                if x.abs() <= delta {
                    1.0
                } else {
                    delta / x.abs()
                }
            })
            .collect();
        let start = problem.assign(&params);
        let next = problem.fit(&weights, start)?;
        let moved = (next.compute / params.compute - 1.0).abs()
            + (next.memory / params.memory - 1.0).abs()
            + (next.rows_pad - params.rows_pad).abs() / (1.0 + params.rows_pad)
            + (next.fixed_us - params.fixed_us).abs() / (1.0 + params.fixed_us);
        params = next;
        if moved < 1e-9 {
            break;
        }
    }
    let assign = problem.assign(&params);
    let r = rel_errors(&samples, &params);
    let compute_bound = assign.iter().filter(|c| **c).count();
    Some(EfficiencyFit {
        params,
        determined: Determined {
            compute: holds.compute.is_none(),
            memory: holds.memory.is_none(),
            rows_pad: holds.rows_pad.is_none(),
            fixed_us: holds.fixed_us.is_none(),
        },
        samples: n,
        compute_bound,
        memory_bound: n - compute_bound,
        rms_error: (r.iter().map(|x| x * x).sum::<f64>() / n as f64).sqrt(),
        max_error: r
            .iter()
            .fold(0.0, |m, x| if x.abs() > m.abs() { *x } else { m }),
        outliers: weights.iter().filter(|w| **w < 0.5).count(),
    })
}
