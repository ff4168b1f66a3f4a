//! Calibration from profiler traces: kernels mapped onto the op graph ([`crate::kernels`]), then
//! what the mapped kernels can tell the cost model.
//!
//! - [`work`]: a GEMM's FLOPs, bytes and rows, read off the shapes its trace gives.
//! - [`efficiency`]: per op class, `compute`, `memory`, `rows_pad`, `fixed_us` fitted to the
//!   kernels with known work (robust bounded least squares over relative errors).
//! - [`comm`]: alpha-beta per collective kind and group size, and the cost file's ring-collective
//!   parameters, from kernels that carry their bytes.
//! - [`host`]: host overhead per step from the gaps between device steps.
//! - [`spread`]: how far device steps land from their price: the forms' bias by the step's shape
//!   and the variation around it (`[host] step_sigma`).
//! - [`costfile`]: a cost file with what was fitted, its residuals and the traces it came from.
//! - [`check`]: a cost file's prices of a trace's kernels and host time, fitting nothing.
//!
//! [`calibrate`] runs all of it over a set of profiles.

pub use check::{check, HostCheckReport, OpCheck, TraceCheck};

pub mod check;
pub mod comm;
pub mod costfile;
pub mod efficiency;
pub mod host;
pub mod spread;
pub mod work;

use crate::kernels::{
    detect_backend, map_kernels, summarize, Backend, MapSummary, OpKindName, RuleSet, Target,
};
use comm::{alpha_beta, fit_collective, AlphaBeta, CollectiveFit, CommSample, GroupKey};
use dstwin_hwmodels::{CostModel, DType, OpClass, Work};
use dstwin_traces::profile::{Profile, ProfileFormat};
use efficiency::{
    fit_op, fit_split, op_form, ClassParams, EfficiencyFit, Objective, OpFit, Sample,
};
use host::{fit_hosts, DeviceSteps, HostFit};
use serde::Serialize;
use spread::{step_spread, StepSpread};
use std::collections::BTreeMap;
use work::{engine_op_work, kernel_work, EngineModel};

/// Default of [`TraceOptions::idle_factor`]: a gap five times the median is idling.
pub const DEFAULT_IDLE_FACTOR: f64 = 5.0;

/// How to read and fit the traces.
#[derive(Clone, Debug)]
pub struct TraceOptions {
    /// The backend of every trace (default: detected per trace).
    pub backend: Option<Backend>,
    /// A user's rules, tried before the built-in ones.
    pub rules: RuleSet,
    /// The hardware the traces ran on: its peaks, bandwidth and fabric for the fits, and its
    /// shipped parameters as the prior for what the traces cannot determine. Without it only
    /// the mapping, the alpha-beta fits and the host overhead are computed.
    pub cost: Option<CostModel>,
    /// Gaps between steps longer than this many times the median are idling.
    pub idle_factor: f64,
    /// The format the engine computed in, for traces that do not say (the CPU engine's).
    pub dtype: Option<DType>,
    /// The model the traces ran (the CPU engine's): the work of its ops that are not GEMMs.
    pub model: Option<EngineModel>,
    /// What the efficiency fits minimize.
    pub objective: Objective,
}

/// One trace as read.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceSummary {
    pub origin: String,
    pub format: ProfileFormat,
    pub backend: Backend,
    pub kernels: usize,
    pub steps: usize,
    pub kernel_time_ms: f64,
    pub notes: BTreeMap<String, String>,
    pub skipped: BTreeMap<String, u64>,
}

impl TraceSummary {
    /// One line: the trace, its format and backend, kernels, kernel time and step markers.
    pub fn line(&self) -> String {
        format!(
            "{} ({}, {} backend): {} kernels, {:.3} ms of kernel time, step markers: {}",
            self.origin,
            self.format.name(),
            self.backend,
            self.kernels,
            self.kernel_time_ms,
            self.steps
        )
    }
}

/// One op class: its kernels and, when they carry their work and the hardware is known, its fit.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClassReport {
    pub class: OpClass,
    /// Launches mapped to the class (outside-the-graph kernels excluded).
    pub kernels: u64,
    /// Of those, launches whose work (FLOPs, bytes) is known: the fit's samples.
    pub with_work: usize,
    /// The hardware's shipped parameters, the prior of what the samples cannot determine.
    pub prior: Option<ClassParams>,
    /// The class's form (fitted to the kernels of more than one row when `one_row` is there).
    pub fit: Option<EfficiencyFit>,
    /// The one-row kernels' own form ([`efficiency::SplitFit`]).
    pub one_row: Option<EfficiencyFit>,
    /// With `one_row`: relative errors over every kernel of the class, split and as one form.
    pub rms_error_split: Option<(f64, f64)>,
    /// Ops of the class with a form of their own ([`efficiency::fit_op`]): the class's form is
    /// fitted to the other ops' kernels.
    pub ops: Vec<(String, OpFit)>,
}

impl ClassReport {
    /// A kernel's time under the class's fit, µs: the one-row form for kernels of at most one
    /// row when the class has one, else the main form. `None` when the class was not fitted.
    pub fn time_us(&self, s: &Sample) -> Option<f64> {
        match (&self.one_row, &self.fit) {
            (Some(o), _) if s.one_row() => Some(o.params.time_us(&Sample { rows: None, ..*s })),
            (_, Some(f)) => Some(f.params.time_us(s)),
            _ => None,
        }
    }

    /// [`ClassReport::time_us`] of a kernel of op `op`: its own form where it has one.
    pub fn op_time_us(&self, op: &str, s: &Sample) -> Option<f64> {
        match (self.ops.iter().find(|(o, _)| o == op), &self.fit) {
            (Some((_, f)), Some(c)) => Some(f.form.time_us(&c.params, s)),
            _ => self.time_us(s),
        }
    }
}

/// One op's kernels against the fit of its class: where a class's single form misses an op
/// that runs differently from the rest of the class (the twin prices every op of a class with
/// that form, so this is the error the twin carries on the op).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OpResidual {
    pub op: String,
    pub class: OpClass,
    /// Kernels with known work (the fit's samples), and of them those of at most one row.
    pub kernels: usize,
    pub one_row: usize,
    pub measured_ms: f64,
    /// Under the form the twin prices the op with: its own where it has one, else its class's.
    pub fitted_ms: f64,
    /// Under its class's form (the same as `fitted_ms` for an op without its own).
    pub class_ms: f64,
    /// Whether the op has a form of its own.
    pub own: bool,
}

impl OpResidual {
    /// Fitted over measured, less one.
    pub fn error(&self) -> f64 {
        rel(self.fitted_ms, self.measured_ms)
    }

    /// [`OpResidual::error`] under the class's form.
    pub fn class_error(&self) -> f64 {
        rel(self.class_ms, self.measured_ms)
    }
}

fn rel(x: f64, of: f64) -> f64 {
    if of > 0.0 {
        x / of - 1.0
    } else {
        0.0
    }
}

/// Host overhead of one trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HostReport {
    pub origin: String,
    pub fit: Option<HostFit>,
}

/// Steps after idling need at least this many of them, and of kernels with known work in
/// them, to be fitted apart ([`ColdFit`]).
pub const MIN_COLD_STEPS: usize = 3;
pub const MIN_COLD_KERNELS: usize = 32;

/// Kernels of steps that start after the device idled ([`DeviceSteps`]: the gap before them is
/// one the host fit leaves out as idle), against the warm fit (or, in a [`TraceCheck`], against
/// a cost file's forms, with the file's factor): caches and clocks go cold while
/// an engine waits for work, and its first step back runs slower (on the CPU engine 1.2-1.4x for
/// a prompt's GEMMs and attention at the same shapes, 2-4x for the small memory-bound kernels).
/// The efficiency forms are fitted to the other kernels; the twin prices a step that starts more
/// than `after_us` after the previous one ended at `factor` times its kernel time.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ColdFit {
    /// The idle gap beyond which a step counts as cold, µs (the largest over the traces).
    pub after_us: f64,
    /// Measured over warm-priced kernel time of the cold steps.
    pub factor: f64,
    pub steps: usize,
    pub kernels: usize,
    pub measured_ms: f64,
    pub warm_ms: f64,
}

/// Everything [`calibrate`] found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceCalibration {
    /// The steps after idling, fitted apart (`None`: too few of them).
    pub cold: Option<ColdFit>,
    /// How far the warm steps' kernel time lands from the fitted forms' price (`None`: fewer
    /// than [`spread::MIN_STEPS`] steps with their kernels priced).
    pub spread: Option<StepSpread>,
    pub traces: Vec<TraceSummary>,
    /// The rule files used, with their sources.
    pub rules: Vec<(String, String)>,
    pub mapping: MapSummary,
    /// The system the fits used.
    pub hardware: Option<String>,
    pub efficiency: Vec<ClassReport>,
    /// Per op, its kernels' measured time against the fit of its class, largest first.
    pub op_residuals: Vec<OpResidual>,
    /// What the efficiency fits minimized.
    pub objective: Objective,
    pub alpha_beta: Vec<AlphaBeta>,
    pub collective: Option<CollectiveFit>,
    pub host: Vec<HostReport>,
    /// With two traces or more that mark steps: host overhead fitted to all their steps
    /// together (what the cost file takes; with one trace, it takes that trace's fit).
    pub host_pooled: Option<HostFit>,
    /// The front end's time per request, from benchmark results of the profiled runs (set by
    /// the caller: [`FrontEnd::from_bench`]).
    pub frontend: Option<FrontEnd>,
}

/// The front end's time per request: what a client's TTFT adds to the server's (HTTP,
/// tokenizing, streaming back), from `bench-serve` results that carry both.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FrontEnd {
    pub request_us: f64,
    /// Requests the means were over.
    pub requests: u64,
    /// The results read, for the source.
    pub origins: Vec<String>,
}

impl FrontEnd {
    /// From `(origin, result JSON)` pairs: per result the client's mean TTFT less the
    /// server's, weighed by completed requests. Errors name the result and the field.
    pub fn from_bench(results: &[(String, serde_json::Value)]) -> Result<FrontEnd, String> {
        let (mut sum, mut n) = (0.0, 0u64);
        for (origin, v) in results {
            let num = |k: &str| -> Result<f64, String> {
                v.get(k).and_then(serde_json::Value::as_f64).ok_or_else(|| {
                    format!(
                        "{origin}: {k} is {}: a bench-serve result of the profiled run is needed, against a server that exports vllm:time_to_first_token_seconds",
                        v.get(k).map_or("missing".to_string(), |x| x.to_string())
                    )
                })
            };
            let (client, server) = (num("mean_ttft_ms")?, num("server_mean_ttft_ms")?);
            let done = num("completed")?;
            if !(done >= 1.0 && client.is_finite() && server.is_finite()) {
                return Err(format!("{origin}: no completed request to compare"));
            }
            sum += (client - server) * 1e3 * done;
            n += done as u64;
        }
        if n == 0 {
            return Err("no benchmark result".into());
        }
        Ok(FrontEnd {
            // The server cannot be slower than its client sees it: noise is clipped at 0.
            request_us: (sum / n as f64).max(0.0),
            requests: n,
            origins: results.iter().map(|(o, _)| o.clone()).collect(),
        })
    }
}

/// The shipped parameters of a class in the fitted form: the class's efficiencies times the
/// file's in-situ factor, its tile padding, and its fixed cost per kernel (the file's
/// `op_overhead_us` where the class gives none). Prefill attention falls back to attention's.
pub fn prior_params(cm: &CostModel, class: OpClass) -> ClassParams {
    let p = &cm.params;
    let e = p.efficiency(class);
    ClassParams {
        compute: e.compute * p.in_situ_efficiency,
        memory: e.memory * p.in_situ_efficiency,
        rows_pad: e.rows_pad,
        fixed_us: e.fixed_us.unwrap_or(p.op_overhead_us),
    }
}

/// What [`calibrate`] and [`check`] read off the profiles: the mapping, and per op class the
/// kernels with known work as samples, each with its op and its work for pricing.
struct Collected {
    traces: Vec<TraceSummary>,
    rules: Vec<(String, String)>,
    mapping: MapSummary,
    /// Per class, launches mapped to it.
    counts: BTreeMap<OpClass, u64>,
    /// Per class, the kernels with known work (with a cost model only).
    samples: BTreeMap<OpClass, Vec<Measured>>,
    /// Steps after idling, over every profile.
    cold_steps: usize,
    /// Per device step (over every profile, [`Measured::step`]), the time of its kernels (µs)
    /// and whether it computes decodes only.
    step_kernel_us: Vec<(f64, Option<bool>)>,
    comm_samples: Vec<CommSample>,
}

/// A kernel with known work: its sample for the fits, its op (or class) and its work as the cost
/// model prices it, the device step it ran in and whether that step came after idling
/// ([`DeviceSteps`]).
struct Measured {
    sample: Sample,
    op: String,
    work: Work,
    step: Option<usize>,
    cold: bool,
}

/// Maps every profile's kernels and reads their work; `cold_after_us` per profile tells the
/// steps after idling (`None`: none is).
fn collect(profiles: &[Profile], opts: &TraceOptions, cold_after_us: &[Option<f64>]) -> Collected {
    let mut traces = Vec::new();
    let mut targets: Vec<Vec<Target>> = Vec::new();
    let mut rule_files: Vec<(String, String)> = opts.rules.sources.clone();
    for p in profiles {
        let backend = opts.backend.unwrap_or_else(|| detect_backend(p));
        let builtin = backend.builtin_rules();
        for s in &builtin.sources {
            if !rule_files.contains(s) {
                rule_files.push(s.clone());
            }
        }
        let rules = opts.rules.clone().then(builtin);
        targets.push(map_kernels(p, backend, &rules));
        traces.push(TraceSummary {
            origin: p.origin.clone(),
            format: p.format,
            backend,
            kernels: p.kernels.len(),
            steps: p.steps.len(),
            kernel_time_ms: p.kernel_time_ns() as f64 / 1e6,
            notes: p.notes.clone(),
            skipped: p.skipped.clone(),
        });
    }
    let all = || {
        profiles
            .iter()
            .zip(&targets)
            .flat_map(|(p, t)| p.kernels.iter().zip(t))
    };
    let mapping = summarize(all());
    let steps: Vec<DeviceSteps> = profiles
        .iter()
        .enumerate()
        .map(|(i, p)| DeviceSteps::of(p, cold_after_us.get(i).copied().flatten()))
        .collect();
    let cold_steps = steps.iter().map(|c| c.cold).sum();
    // Each profile's steps follow the previous profiles'.
    let mut first_step = Vec::with_capacity(steps.len());
    let mut step_kernel_us = Vec::new();
    for s in &steps {
        first_step.push(step_kernel_us.len());
        step_kernel_us.extend(s.decode_only.iter().map(|&d| (0.0, d)));
    }
    let mut samples: BTreeMap<OpClass, Vec<Measured>> = BTreeMap::new();
    let mut counts: BTreeMap<OpClass, u64> = BTreeMap::new();
    let mut comm_samples = Vec::new();
    let kernels = profiles
        .iter()
        .zip(&targets)
        .zip(steps.iter().zip(&first_step))
        .flat_map(|((p, t), c)| p.kernels.iter().zip(t).map(move |(k, t)| (k, t, c)));
    for (k, t, (c, first)) in kernels {
        let located = k
            .start_ns
            .and_then(|t| c.locate(k.device, t))
            .map(|(i, cold)| (first + i, cold));
        if let Some((i, _)) = located {
            step_kernel_us[i].0 += k.dur_ns as f64 / 1e3;
        }
        match t.kind() {
            Some(OpKindName::Compute(class)) => {
                *counts.entry(class).or_default() += k.calls;
                let Some(cm) = &opts.cost else { continue };
                if k.calls != 1 {
                    continue;
                }
                let work = kernel_work(k, class == OpClass::Gemm, opts.dtype).or_else(|| {
                    opts.model
                        .as_ref()
                        .and_then(|m| engine_op_work(k, class, m))
                });
                if let Some(w) = work {
                    let dtype = w.dtype.unwrap_or(DType::Bf16);
                    samples.entry(class).or_default().push(Measured {
                        sample: Sample {
                            flops: w.flops,
                            bytes: w.bytes,
                            rows: w.rows,
                            peak_flops: cm.peak_flops(dtype),
                            hbm_bytes_per_s: cm.system.chip.hbm_bytes_per_s(),
                            time_us: k.dur_ns as f64 / 1e3,
                        },
                        // A compute target names its op, or its class.
                        op: t.op_label().unwrap_or_default(),
                        work: Work {
                            class,
                            flops: w.flops,
                            bytes: w.bytes,
                            dtype,
                            rows: w.rows.unwrap_or(0.0),
                            slice: 0.0,
                        },
                        step: located.map(|(i, _)| i),
                        cold: located.is_some_and(|(_, cold)| cold),
                    });
                }
            }
            Some(OpKindName::Comm(kind)) => {
                let c = k.comm.as_ref();
                let bytes = c.and_then(|c| c.bytes).or(k.bytes);
                let group = match (
                    c.and_then(|c| c.group_size),
                    c.and_then(|c| c.group.clone()),
                ) {
                    (Some(g), _) => GroupKey::Size(g),
                    (None, Some(n)) => GroupKey::Name(n),
                    (None, None) => GroupKey::Unknown,
                };
                if let (Some(bytes), 1) = (bytes, k.calls) {
                    comm_samples.push(CommSample {
                        kind,
                        group,
                        bytes,
                        time_us: k.dur_ns as f64 / 1e3,
                    });
                }
            }
            None => {}
        }
    }
    Collected {
        traces,
        rules: rule_files,
        mapping,
        counts,
        samples,
        cold_steps,
        step_kernel_us,
        comm_samples,
    }
}

/// Maps and fits every profile.
pub fn calibrate(profiles: &[Profile], opts: &TraceOptions) -> TraceCalibration {
    let (fits, host_pooled) = fit_hosts(profiles, opts.idle_factor);
    let host: Vec<HostReport> = profiles
        .iter()
        .zip(fits)
        .map(|(p, fit)| HostReport {
            origin: p.origin.clone(),
            fit,
        })
        .collect();
    // A step after idling follows a gap the host fit leaves out as idle (none where the median
    // gap is 0: the host ran ahead and no gap is idle).
    let after: Vec<Option<f64>> = host
        .iter()
        .map(|h| {
            h.fit
                .as_ref()
                .filter(|f| f.median_gap_us > 0.0)
                .map(|f| opts.idle_factor * f.median_gap_us)
        })
        .collect();
    let Collected {
        traces,
        rules: rule_files,
        mapping,
        counts,
        mut samples,
        cold_steps,
        step_kernel_us,
        comm_samples,
    } = collect(profiles, opts, &after);
    // Per warm step, its priced kernels: (measured µs, priced µs).
    let mut per_step: BTreeMap<usize, (f64, f64)> = BTreeMap::new();
    // Kernels of steps after idling are fitted apart when there are enough of them: the forms
    // are fitted to the warm ones, and the cold ones give the factor they run slower by.
    let cold_kernels = samples.values().flatten().filter(|m| m.cold).count();
    let apart = cold_steps >= MIN_COLD_STEPS && cold_kernels >= MIN_COLD_KERNELS;
    // (measured µs, warm price µs, kernels) of the cold kernels.
    let mut cold_sum = (0.0, 0.0, 0usize);
    let mut op_residuals: BTreeMap<String, OpResidual> = BTreeMap::new();
    let efficiency = OpClass::ALL
        .iter()
        .map(|&class| {
            let (cold, warm): (Vec<Measured>, Vec<Measured>) = samples
                .remove(&class)
                .unwrap_or_default()
                .into_iter()
                .partition(|m| apart && m.cold);
            let s: Vec<Sample> = warm.iter().map(|m| m.sample).collect();
            let steps: Vec<Option<usize>> = warm.iter().map(|m| m.step).collect();
            let names: Vec<String> = warm.into_iter().map(|m| m.op).collect();
            let prior = opts.cost.as_ref().map(|cm| prior_params(cm, class));
            let fit = |s: &[Sample]| {
                let split = prior.and_then(|p| fit_split(s, p, opts.objective));
                let rms_error_split = split
                    .as_ref()
                    .filter(|f| f.one_row.is_some())
                    .map(|f| (f.rms_error, f.rms_error_joint));
                let (fit, one_row) = split.map_or((None, None), |f| (Some(f.main), f.one_row));
                ClassReport {
                    class,
                    kernels: counts.get(&class).copied().unwrap_or(0),
                    with_work: s.len(),
                    prior,
                    fit,
                    one_row,
                    rms_error_split,
                    ops: Vec::new(),
                }
            };
            let whole = fit(&s);
            // Ops the class's form misses get their own; the class is then fitted to the rest.
            let mut by_op: BTreeMap<&str, Vec<Sample>> = BTreeMap::new();
            for (x, op) in s.iter().zip(&names) {
                by_op.entry(op.as_str()).or_default().push(*x);
            }
            let own: Vec<(String, OpFit)> = match &whole.fit {
                Some(f) => by_op
                    .iter()
                    .filter_map(|(op, xs)| {
                        let class_time = |x: &Sample| whole.time_us(x).unwrap_or(f64::NAN);
                        fit_op(xs, f.params, class_time, opts.objective)
                            .map(|o| ((*op).to_owned(), o))
                    })
                    .collect(),
                None => Vec::new(),
            };
            let rest: Vec<Sample> = s
                .iter()
                .zip(&names)
                .filter(|(_, op)| !own.iter().any(|(o, _)| o == *op))
                .map(|(x, _)| *x)
                .collect();
            let mut report = if own.is_empty() || rest.is_empty() {
                whole
            } else {
                let mut r = fit(&rest);
                r.with_work = s.len();
                r
            };
            // The ops were chosen against the class's form over every kernel; with the class
            // refitted to the rest, each op's form is fitted again against the refitted class
            // (its other resource is the class's).
            report.ops = match &report.fit {
                Some(f) => own
                    .into_iter()
                    .filter_map(|(op, _)| {
                        let xs = &by_op[op.as_str()];
                        let class_time = |x: &Sample| report.time_us(x).unwrap_or(f64::NAN);
                        op_form(xs, f.params, class_time, opts.objective).map(|n| (op, n))
                    })
                    .collect(),
                None => Vec::new(),
            };
            for Measured { sample: x, op, .. } in &cold {
                if let Some(t) = report.op_time_us(op, x).filter(|t| t.is_finite()) {
                    cold_sum.0 += x.time_us;
                    cold_sum.1 += t;
                    cold_sum.2 += 1;
                }
            }
            for ((x, op), step) in s.iter().zip(names).zip(steps) {
                let (Some(t), Some(c)) = (report.op_time_us(&op, x), report.time_us(x)) else {
                    continue;
                };
                if !(t.is_finite() && c.is_finite()) {
                    continue;
                }
                if let Some(i) = step {
                    let e = per_step.entry(i).or_default();
                    e.0 += x.time_us;
                    e.1 += t;
                }
                let own = report.ops.iter().any(|(o, _)| *o == op);
                let r = op_residuals.entry(op.clone()).or_insert(OpResidual {
                    op,
                    class,
                    kernels: 0,
                    one_row: 0,
                    measured_ms: 0.0,
                    fitted_ms: 0.0,
                    class_ms: 0.0,
                    own,
                });
                r.kernels += 1;
                r.one_row += usize::from(x.one_row());
                r.measured_ms += x.time_us / 1e3;
                r.fitted_ms += t / 1e3;
                r.class_ms += c / 1e3;
            }
            report
        })
        .collect();
    let mut op_residuals: Vec<OpResidual> = op_residuals.into_values().collect();
    op_residuals.sort_by(|a, b| b.measured_ms.total_cmp(&a.measured_ms));
    let cold = (apart && cold_sum.1 > 0.0).then(|| ColdFit {
        after_us: after.iter().flatten().copied().fold(0.0, f64::max),
        factor: cold_sum.0 / cold_sum.1,
        steps: cold_steps,
        kernels: cold_sum.2,
        measured_ms: cold_sum.0 / 1e3,
        warm_ms: cold_sum.1 / 1e3,
    });
    TraceCalibration {
        cold,
        spread: step_spread(&per_step, &step_kernel_us),
        traces,
        rules: rule_files,
        mapping,
        hardware: opts.cost.as_ref().map(|cm| cm.system.name.clone()),
        efficiency,
        op_residuals,
        objective: opts.objective,
        alpha_beta: alpha_beta(&comm_samples),
        collective: opts
            .cost
            .as_ref()
            .and_then(|cm| fit_collective(&comm_samples, cm)),
        host_pooled,
        host,
        frontend: None,
    }
}
