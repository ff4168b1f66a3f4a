//! The default routed-expert load, fitted to measured DeepSeek-R1 expert loads.
//!
//! The load is the twin's log-normal family (`dstwin_twin::expert_load::fitted`): three
//! parameters, the median per-layer sigma, its spread over layers and the per-request Dirichlet
//! concentration. They are fitted together, by least squares over relative errors, to
//!
//! - the per-iteration rank and expert imbalance TensorRT-LLM measured without EPLB (averages
//!   over layers and iterations, their standard deviations, and the spread of the per-layer
//!   rank imbalance; `data/expert-load-measured.toml`), each predicted the way it was measured:
//!   the same ranks, tokens per step, statistic and placement, the hottest rank or slot of each
//!   layer taken as the simulator takes it (the placement's imbalance on the mean load plus the
//!   step's fluctuation, `expert_load::fluctuation`), averaged over 32 seeded draws of the 58
//!   layers;
//! - CloudMatrix-Infer's prefill throughput with default EPLB over perfect EPLB
//!   (`data/expert-load.toml`), priced as `explain` prices it: one step of the fit target's
//!   deployment with the fitted load placed by the greedy policy, over the same step at perfect
//!   balance.
//!
//! The EPLB figures of the same measurement (32 redundant experts) and SGLang's H100 prefill
//! ratio are predictions, never fitted. Nelder-Mead over (ln sigma, spread, ln concentration),
//! from one start, deterministic; leave-one-out refits from the optimum.

use crate::fit::EplbGapTarget;
use crate::target::{CalibrationError, Target};
use dstwin_core::eplb::{place, EpLayout, Placement, Policy};
use dstwin_core::model;
use dstwin_hwmodels::CostModel;
use dstwin_twin::expert_load::fluctuation::share_spread;
use dstwin_twin::expert_load::{fluctuation, ExpertLoadSpec, LognormalDraws, StepRouting};
use dstwin_twin::explain::{explain_under, SkewedLoad};
use serde::{Deserialize, Serialize};

/// The shipped measurements.
pub const MEASURED: &str = include_str!("../data/expert-load-measured.toml");

/// Seeded draws of the layers each measured figure is averaged over.
pub const DRAWS: u64 = 32;

/// Over what a statistic is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum By {
    Rank,
    Slot,
}

/// What a figure reports, per layer and iteration, averaged over them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Statistic {
    /// (max - mean) / mean.
    Imbalance,
    /// Sample standard deviation, in tokens.
    Std,
    /// Sample standard deviation over layers of the per-layer imbalance.
    LayerSpread,
}

/// One measured figure and the conditions it was measured under.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Figure {
    pub id: String,
    /// Where in the source.
    pub note: String,
    pub by: By,
    pub statistic: Statistic,
    pub ranks: u32,
    pub slots: u32,
    pub placement: Policy,
    /// The published value (`layer_spread` gives `layers` instead).
    #[serde(default)]
    pub published: Option<f64>,
    /// Published per-layer imbalance ratios, (layer, value).
    #[serde(default)]
    pub layers: Vec<(u32, f64)>,
    /// Fitted, or only compared.
    pub fit: bool,
}

impl Figure {
    /// The published value: as given, or the sample standard deviation of the per-layer values.
    pub fn published(&self) -> f64 {
        match self.published {
            Some(v) => v,
            None => sample_sd(self.layers.iter().map(|l| l.1)),
        }
    }
}

/// A throughput ratio, default over perfect EPLB, priced by `explain` on a deployment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GapFigure {
    pub id: String,
    pub source: String,
    pub default_eplb: f64,
    pub perfect_eplb: f64,
    pub fit: bool,
    pub deployment: Target,
}

/// The measurement file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Measured {
    pub source: String,
    pub model: String,
    /// Tokens each rank routes per step (one per decoding sequence).
    pub tokens_per_rank: u64,
    pub moe_layers: usize,
    pub figure: Vec<Figure>,
    #[serde(default)]
    pub gap: Vec<GapFigure>,
}

/// The shipped fit: the measurements of [`MEASURED`] with their validation gaps, and the
/// CloudMatrix gap of `data/expert-load.toml` on `targets` (the CloudMatrix384 targets) priced
/// under `cost`.
pub fn builtin(targets: &[Target], cost: CostModel) -> Result<Problem, CalibrationError> {
    let gap = crate::fit::parse_eplb_gap("expert-load.toml", crate::fit::EXPERT_LOAD)?;
    let m = parse_measured("expert-load-measured.toml", MEASURED)?;
    let mut gaps = vec![Gap::cloudmatrix(&gap, targets, cost)?];
    for g in &m.gap {
        gaps.push(Gap::measured(g)?);
    }
    Problem::new(m, gaps, DRAWS)
}

/// Parses a measurement file; every figure has a positive published value.
pub fn parse_measured(file: &str, text: &str) -> Result<Measured, CalibrationError> {
    let m: Measured = toml::from_str(text).map_err(|e| CalibrationError::Parse {
        file: file.into(),
        message: e.to_string(),
    })?;
    let bad = |id: &str, message: String| CalibrationError::Target {
        id: id.into(),
        message,
    };
    if m.tokens_per_rank == 0 || m.moe_layers == 0 {
        return Err(CalibrationError::Parse {
            file: file.into(),
            message: "tokens_per_rank and moe_layers must be at least 1".into(),
        });
    }
    for f in &m.figure {
        match (f.statistic, f.published, f.layers.len()) {
            (Statistic::LayerSpread, None, n) if n >= 2 => {}
            (Statistic::LayerSpread, _, _) => {
                return Err(bad(
                    &f.id,
                    "layer_spread takes `layers` (two or more), not `published`".into(),
                ))
            }
            (_, Some(v), 0) if v.is_finite() && v > 0.0 => {}
            (_, v, _) => {
                return Err(bad(
                    &f.id,
                    format!("published {v:?}: give one positive number and no `layers`"),
                ))
            }
        }
        if f.ranks < 2 || f.slots < f.ranks || !f.slots.is_multiple_of(f.ranks) {
            return Err(bad(
                &f.id,
                format!(
                    "ranks {} and slots {}: at least 2 ranks holding the slots evenly",
                    f.ranks, f.slots
                ),
            ));
        }
    }
    for g in &m.gap {
        if !(g.default_eplb > 0.0 && g.perfect_eplb > 0.0) {
            return Err(bad(
                &g.id,
                "default_eplb and perfect_eplb must be positive".into(),
            ));
        }
    }
    Ok(m)
}

fn sample_sd(v: impl Iterator<Item = f64> + Clone) -> f64 {
    let n = v.clone().count() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let mean = v.clone().sum::<f64>() / n;
    (v.map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
}

/// The parameters of the log-normal load.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Params {
    pub sigma: f64,
    pub sigma_spread: f64,
    pub concentration: f64,
}

impl Params {
    /// The load these parameters describe.
    pub fn spec(self) -> ExpertLoadSpec {
        ExpertLoadSpec::Lognormal {
            sigma: self.sigma,
            sigma_spread: self.sigma_spread,
            concentration: self.concentration,
            drift: 0.0,
            epoch_steps: 1,
        }
    }

    /// The search coordinates: (ln sigma, spread, ln concentration).
    fn coords(self) -> [f64; 3] {
        [self.sigma.ln(), self.sigma_spread, self.concentration.ln()]
    }

    /// Parameters of search coordinates (the spread's sign is immaterial: its draws are
    /// symmetric), clamped to a range where the shares stay finite.
    fn of(x: [f64; 3]) -> Params {
        Params {
            sigma: x[0].clamp(-5.0, 2.0).exp(),
            sigma_spread: x[1].abs().min(3.0),
            concentration: x[2].clamp(-3.0, 12.0).exp(),
        }
    }
}

/// A throughput ratio ready to price: the deployment and its step at perfect balance.
pub struct Gap {
    pub id: String,
    pub published: f64,
    pub fit: bool,
    input: dstwin_twin::explain::ExplainInput,
    metric: crate::target::Metric,
    perfect: f64,
}

impl Gap {
    fn new(
        id: &str,
        published: f64,
        fit: bool,
        deployment: &Target,
        cost: CostModel,
    ) -> Result<Gap, CalibrationError> {
        let input = deployment.input(cost)?;
        let perfect = read(id, &input, deployment.metric, None)?;
        Ok(Gap {
            id: id.into(),
            published,
            fit,
            input,
            metric: deployment.metric,
            perfect,
        })
    }

    /// The CloudMatrix figure of `data/expert-load.toml`, on its target's deployment.
    pub fn cloudmatrix(
        gap: &EplbGapTarget,
        targets: &[Target],
        cost: CostModel,
    ) -> Result<Gap, CalibrationError> {
        let base = gap.base_target(targets)?;
        Gap::new(
            &gap.id,
            gap.default_eplb / gap.perfect_eplb,
            true,
            base,
            cost,
        )
    }

    /// A gap of the measurement file, on its own hardware's shipped cost model.
    pub fn measured(g: &GapFigure) -> Result<Gap, CalibrationError> {
        let cost = g.deployment.base_cost()?;
        Gap::new(
            &g.id,
            g.default_eplb / g.perfect_eplb,
            g.fit,
            &g.deployment,
            cost,
        )
    }

    /// Default over perfect EPLB throughput with the load of `p` placed by the greedy policy.
    pub fn predict(&self, p: Params) -> Result<f64, CalibrationError> {
        let load = SkewedLoad {
            spec: p.spec(),
            policy: Policy::Greedy,
        };
        Ok(read(&self.id, &self.input, self.metric, Some(&load))? / self.perfect)
    }
}

fn read(
    id: &str,
    input: &dstwin_twin::explain::ExplainInput,
    metric: crate::target::Metric,
    load: Option<&SkewedLoad>,
) -> Result<f64, CalibrationError> {
    let e = explain_under(input, load).map_err(|e| CalibrationError::Target {
        id: id.into(),
        message: e.to_string(),
    })?;
    Ok(metric.read(&e))
}

/// Everything the fit compares, ready to predict.
pub struct Problem {
    pub measured: Measured,
    pub gaps: Vec<Gap>,
    top_k: u32,
    groups: u32,
    draws: Vec<LognormalDraws>,
    /// Per figure, its placement when that does not depend on the load (identity).
    fixed: Vec<Option<Placement>>,
}

/// One figure, published and predicted.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Residual {
    pub id: String,
    pub what: String,
    pub published: f64,
    pub predicted: f64,
    /// predicted / published - 1.
    pub error: f64,
    pub fitted: bool,
}

/// A leave-one-out prediction: the figure predicted by a fit without it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LeftOut {
    pub id: String,
    pub params: Params,
    pub predicted: f64,
    pub error: f64,
}

/// The fit's result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LoadFit {
    pub params: Params,
    /// Root mean square of the fitted figures' relative errors.
    pub rms_error: f64,
    pub residuals: Vec<Residual>,
    pub evaluations: u32,
}

impl Problem {
    /// The measurements of `measured` and the throughput ratios `gaps`, each measured figure
    /// averaged over `draws` seeded draws of the layers ([`DRAWS`] for the shipped fit).
    pub fn new(
        measured: Measured,
        gaps: Vec<Gap>,
        draws: u64,
    ) -> Result<Problem, CalibrationError> {
        let model = model::builtin(&measured.model).ok_or_else(|| CalibrationError::Parse {
            file: "expert-load-measured.toml".into(),
            message: format!("unknown model {}", measured.model),
        })?;
        let experts = model.routed_experts as usize;
        let draws = (1..=draws.max(1))
            .map(|seed| LognormalDraws::seeded(measured.moe_layers, experts, seed))
            .collect();
        let groups = model.router_groups as u32;
        let flat = vec![vec![1.0; experts]; measured.moe_layers];
        let fixed = measured
            .figure
            .iter()
            .map(|f| {
                (f.placement == Policy::Identity)
                    .then(|| place(Policy::Identity, &flat, &layout(f, groups)))
                    .transpose()
                    .map_err(|e| placement_error(f, e))
            })
            .collect::<Result<_, _>>()?;
        Ok(Problem {
            measured,
            gaps,
            top_k: model.top_k as u32,
            groups,
            draws,
            fixed,
        })
    }

    /// Each draw's shares under `p`.
    fn shares(&self, p: Params) -> Vec<Vec<Vec<f64>>> {
        self.draws
            .iter()
            .map(|d| d.shares(p.sigma, p.sigma_spread))
            .collect()
    }

    /// The prediction of figure `i` of the measurements under `p`.
    pub fn predict(&self, i: usize, p: Params) -> Result<f64, CalibrationError> {
        Ok(self
            .view(i, p, &self.shares(p))?
            .of(self.measured.figure[i].statistic))
    }

    /// Every measured figure's prediction under `p`, the figures measured on the same view
    /// (ranks or slots under one placement) computed once; `want` selects the figures.
    fn predictions(
        &self,
        p: Params,
        want: impl Fn(&Figure) -> bool,
    ) -> Result<Vec<Option<f64>>, CalibrationError> {
        let draws = self.shares(p);
        let mut seen: Vec<(usize, Stats)> = Vec::new();
        let mut out = Vec::with_capacity(self.measured.figure.len());
        for (i, f) in self.measured.figure.iter().enumerate() {
            if !want(f) {
                out.push(None);
                continue;
            }
            let same = |j: &usize| {
                let g = &self.measured.figure[*j];
                (g.by, g.ranks, g.slots, g.placement) == (f.by, f.ranks, f.slots, f.placement)
            };
            let stats = match seen.iter().find(|(j, _)| same(j)) {
                Some((_, st)) => *st,
                None => {
                    let st = self.view(i, p, &draws)?;
                    seen.push((i, st));
                    st
                }
            };
            out.push(Some(stats.of(f.statistic)));
        }
        Ok(out)
    }

    /// The statistics of figure `i`'s view (its ranks or slots under its placement, at its
    /// tokens per step) on the draws' shares under `p`.
    fn view(
        &self,
        i: usize,
        p: Params,
        draws: &[Vec<Vec<f64>>],
    ) -> Result<Stats, CalibrationError> {
        let f = &self.measured.figure[i];
        let tokens = (self.measured.tokens_per_rank * f.ranks as u64) as f64;
        // One token per decoding sequence.
        let step = StepRouting {
            requests: tokens,
            tokens,
            cube_share: 1.0 / (tokens * tokens),
        };
        let units = match f.by {
            By::Rank => f.ranks,
            By::Slot => f.slots,
        };
        let mean_tokens = tokens * self.top_k as f64 / units as f64;
        let noise_sd = share_spread(units as f64, step, self.top_k, p.concentration).relative_sd;
        let fluct = fluctuation(units, step, self.top_k, p.concentration);
        let (mut imbalance, mut std, mut spread) = (0.0, 0.0, 0.0);
        let mut layers = Vec::new();
        for shares in draws {
            let computed;
            let placement = match &self.fixed[i] {
                Some(p) => p,
                None => {
                    computed = place(f.placement, shares, &layout(f, self.groups))
                        .map_err(|e| placement_error(f, e))?;
                    &computed
                }
            };
            let spd = match f.by {
                By::Rank => placement.slots_per_die,
                By::Slot => 1,
            };
            layers.clear();
            for (lp, s) in placement.layers.iter().zip(shares) {
                let loads = lp.die_loads(s, spd);
                let mean = loads.iter().sum::<f64>() / loads.len() as f64;
                let rel = loads.iter().map(|x| x / mean);
                let layer = rel.clone().fold(0.0, f64::max) - 1.0 + fluct;
                // The layer's sample deviation: the placement's, and each unit's own noise.
                std += (sample_sd(rel).powi(2) + noise_sd.powi(2)).sqrt() * mean_tokens;
                imbalance += layer;
                layers.push(layer);
            }
            spread += sample_sd(layers.iter().copied());
        }
        let n = draws.len() as f64;
        let layer_count = n * self.measured.moe_layers as f64;
        Ok(Stats {
            imbalance: imbalance / layer_count,
            std: std / layer_count,
            layer_spread: spread / n,
        })
    }

    /// Every figure, published and predicted under `p`.
    pub fn residuals(&self, p: Params) -> Result<Vec<Residual>, CalibrationError> {
        let predicted = self.predictions(p, |_| true)?;
        let mut out = Vec::new();
        for (f, v) in self.measured.figure.iter().zip(predicted) {
            let v = v.expect("every figure was asked for");
            out.push(residual(&f.id, &f.note, f.published(), v, f.fit));
        }
        for g in &self.gaps {
            let what = "default over perfect EPLB throughput";
            out.push(residual(&g.id, what, g.published, g.predict(p)?, g.fit));
        }
        Ok(out)
    }

    /// Sum of squared relative errors of the fitted figures, leaving out `skip`.
    fn loss(&self, p: Params, skip: Option<&str>) -> Result<f64, CalibrationError> {
        let counted = |f: &Figure| f.fit && Some(f.id.as_str()) != skip;
        let predicted = self.predictions(p, counted)?;
        let mut l = 0.0;
        for (f, v) in self.measured.figure.iter().zip(predicted) {
            if let Some(v) = v {
                l += (v / f.published() - 1.0).powi(2);
            }
        }
        for g in self.gaps.iter().filter(|g| g.fit) {
            if Some(g.id.as_str()) != skip {
                l += (g.predict(p)? / g.published - 1.0).powi(2);
            }
        }
        Ok(l)
    }

    /// Fits the parameters to every fitted figure but `skip`, from `start` with first steps
    /// `step` in the search coordinates.
    fn search(
        &self,
        start: Params,
        step: [f64; 3],
        skip: Option<&str>,
    ) -> Result<(Params, f64, u32), CalibrationError> {
        let mut evaluations = 0u32;
        let mut f = |x: [f64; 3]| {
            evaluations += 1;
            self.loss(Params::of(x), skip)
        };
        let (x, l) = nelder_mead(&mut f, start.coords(), step)?;
        Ok((Params::of(x), l, evaluations))
    }

    /// The least-squares fit over every fitted figure.
    pub fn fit(&self) -> Result<LoadFit, CalibrationError> {
        let (params, loss, evaluations) = self.search(START, [0.2, 0.1, 0.5], None)?;
        let n = self.measured.figure.iter().filter(|f| f.fit).count()
            + self.gaps.iter().filter(|g| g.fit).count();
        Ok(LoadFit {
            params,
            rms_error: (loss / n.max(1) as f64).sqrt(),
            residuals: self.residuals(params)?,
            evaluations,
        })
    }

    /// Each fitted figure predicted by a fit to the others (from `fit`'s optimum).
    pub fn leave_one_out(&self, fit: &LoadFit) -> Result<Vec<LeftOut>, CalibrationError> {
        let mut out = Vec::new();
        for r in fit.residuals.iter().filter(|r| r.fitted) {
            // From the optimum, with steps of a few percent: the refit stays near it.
            let (p, _, _) = self.search(fit.params, [0.05, 0.05, 0.2], Some(&r.id))?;
            let predicted = match self.measured.figure.iter().position(|f| f.id == r.id) {
                Some(i) => self.predict(i, p)?,
                None => self
                    .gaps
                    .iter()
                    .find(|g| g.id == r.id)
                    .expect("the left-out figure is a figure or a gap")
                    .predict(p)?,
            };
            out.push(LeftOut {
                id: r.id.clone(),
                params: p,
                predicted,
                error: predicted / r.published - 1.0,
            });
        }
        Ok(out)
    }
}

/// The statistics of one view of the measured load, averaged over layers, iterations and draws.
#[derive(Clone, Copy, Debug)]
struct Stats {
    imbalance: f64,
    std: f64,
    layer_spread: f64,
}

impl Stats {
    fn of(self, s: Statistic) -> f64 {
        match s {
            Statistic::Imbalance => self.imbalance,
            Statistic::Std => self.std,
            Statistic::LayerSpread => self.layer_spread,
        }
    }
}

fn layout(f: &Figure, groups: u32) -> EpLayout {
    EpLayout {
        slots: f.slots,
        dies: f.ranks,
        dies_per_node: f.ranks,
        groups,
    }
}

fn placement_error(f: &Figure, e: dstwin_core::eplb::EplbError) -> CalibrationError {
    CalibrationError::Target {
        id: f.id.clone(),
        message: e.to_string(),
    }
}

/// Where every fit starts: a moderately skewed load (the fit's answer does not depend on it).
const START: Params = Params {
    sigma: 0.7,
    sigma_spread: 0.2,
    concentration: 10.0,
};

fn residual(id: &str, what: &str, published: f64, predicted: f64, fitted: bool) -> Residual {
    Residual {
        id: id.into(),
        what: what.into(),
        published,
        predicted,
        error: predicted / published - 1.0,
        fitted,
    }
}

/// Nelder-Mead minimization of `f` from `x0` with initial steps `step` (standard coefficients:
/// reflection 1, expansion 2, contraction 1/2, shrink 1/2). Stops when the simplex's losses
/// agree to 1e-10 and its vertices to 1e-5 (parameters to 0.001%, far below what the figures
/// resolve), or after 600 iterations.
fn nelder_mead<const N: usize>(
    f: &mut impl FnMut([f64; N]) -> Result<f64, CalibrationError>,
    x0: [f64; N],
    step: [f64; N],
) -> Result<([f64; N], f64), CalibrationError> {
    let mut simplex: Vec<([f64; N], f64)> = Vec::with_capacity(N + 1);
    simplex.push((x0, f(x0)?));
    for i in 0..N {
        let mut x = x0;
        x[i] += step[i];
        simplex.push((x, f(x)?));
    }
    let lerp = |a: &[f64; N], b: &[f64; N], t: f64| -> [f64; N] {
        std::array::from_fn(|i| a[i] + t * (b[i] - a[i]))
    };
    for _ in 0..600 {
        simplex.sort_by(|a, b| a.1.total_cmp(&b.1));
        let (best, worst) = (simplex[0].1, simplex[N].1);
        let size = simplex
            .iter()
            .flat_map(|(x, _)| x.iter().zip(&simplex[0].0).map(|(a, b)| (a - b).abs()))
            .fold(0.0, f64::max);
        if worst - best < 1e-10 && size < 1e-5 {
            break;
        }
        let centroid: [f64; N] =
            std::array::from_fn(|i| simplex[..N].iter().map(|(x, _)| x[i]).sum::<f64>() / N as f64);
        let w = simplex[N].0;
        let r = lerp(&centroid, &w, -1.0);
        let fr = f(r)?;
        if fr < best {
            let e = lerp(&centroid, &w, -2.0);
            let fe = f(e)?;
            simplex[N] = if fe < fr { (e, fe) } else { (r, fr) };
        } else if fr < simplex[N - 1].1 {
            simplex[N] = (r, fr);
        } else {
            let c = if fr < worst {
                lerp(&centroid, &r, 0.5)
            } else {
                lerp(&centroid, &w, 0.5)
            };
            let fc = f(c)?;
            if fc < fr.min(worst) {
                simplex[N] = (c, fc);
            } else {
                let b = simplex[0].0;
                for v in simplex.iter_mut().skip(1) {
                    let x = lerp(&b, &v.0, 0.5);
                    *v = (x, f(x)?);
                }
            }
        }
    }
    simplex.sort_by(|a, b| a.1.total_cmp(&b.1));
    Ok(simplex[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nelder_mead_finds_the_minimum_of_a_valley() {
        // Rosenbrock's valley, minimum at (1, 1).
        let mut f = |x: [f64; 2]| -> Result<f64, CalibrationError> {
            Ok((1.0 - x[0]).powi(2) + 100.0 * (x[1] - x[0] * x[0]).powi(2))
        };
        let (x, l) = nelder_mead(&mut f, [-1.2, 1.0], [0.5, 0.5]).unwrap();
        assert!(
            l < 1e-8 && (x[0] - 1.0).abs() < 1e-3 && (x[1] - 1.0).abs() < 1e-3,
            "{x:?} {l}"
        );
    }

    #[test]
    fn the_shipped_file_parses_and_bad_figures_name_themselves() {
        let m = parse_measured("m.toml", MEASURED).unwrap();
        assert!(m.figure.iter().filter(|f| f.fit).count() >= 5);
        let spread = m
            .figure
            .iter()
            .find(|f| f.statistic == Statistic::LayerSpread)
            .unwrap();
        // The sample standard deviation of the six published layers.
        assert!(
            (spread.published() - 0.7721).abs() < 1e-3,
            "{}",
            spread.published()
        );
        let bad = MEASURED.replacen("published = 1.564272", "published = -1.0", 1);
        let e = parse_measured("m.toml", &bad).unwrap_err().to_string();
        assert!(e.contains("trtllm-ep32-rank-imbalance"), "{e}");
        let bad = MEASURED.replacen("ranks = 32\nslots = 256", "ranks = 32\nslots = 250", 1);
        let e = parse_measured("m.toml", &bad).unwrap_err().to_string();
        assert!(e.contains("slots 250"), "{e}");
        let bad = MEASURED.replacen("fit = true", "fit = true\nweight = 2", 1);
        let e = parse_measured("m.toml", &bad).unwrap_err().to_string();
        assert!(e.contains("weight"), "{e}");
    }
}
