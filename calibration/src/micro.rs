//! The all-to-all parameters of each cost model, fitted to published dispatch/combine
//! microbenchmarks (`data/microbenchmarks.toml`), and the residuals of any parameter set.
//!
//! Low-latency mode is linear in its unknowns once the level's latency is taken off:
//! `t - latency = base(kind) + per_doubling * log2(EP) + k * remote_bytes / bandwidth` with
//! `k = 1 / efficiency`, fitted by least squares over relative errors with the bases and the
//! per-doubling term held at >= 0 and the efficiency at <= 1. Normal mode fits
//! `efficiency = at_ep8 + per_doubling * log2(EP / 8)` to the achieved bandwidth over the
//! level's bandwidth, also over relative errors, dispatch and combine each their own line.
//!
//! V4's fused kernels have their own fit ([`crate::v4_kernels`]).
//!
//! MTP acceptance: one probability p for every draft position (the twin's chain with a single
//! value), fitted by golden-section search over the relative errors of the blocks marked
//! `fit = true`; the mean tokens per step with n drafts is 1 + p + ... + p^n.

use crate::lsq::{bounded_lstsq, lstsq};
pub use crate::microbench::{MicroError, MicroResidual};
use dstwin_hwmodels::{A2aMode, Catalog, Comm, CommKind, CostModel};
use dstwin_twin::explain::Mtp;
use serde::{Deserialize, Serialize};

/// The microbenchmarks shipped with the crate.
pub const MICROBENCHMARKS: &str = include_str!("../data/microbenchmarks.toml");

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Dispatch,
    Combine,
}

impl Kind {
    fn comm(self) -> CommKind {
        match self {
            Kind::Dispatch => CommKind::Dispatch,
            Kind::Combine => CommKind::Combine,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Kind::Dispatch => "dispatch",
            Kind::Combine => "combine",
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LatencyPoint {
    pub kind: Kind,
    pub ep: u32,
    pub us: f64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LowLatencyBlock {
    pub id: String,
    pub source: String,
    pub system: String,
    /// Whether the fit uses this block (otherwise its points are only reported, as checks).
    #[serde(default = "fitted")]
    pub fit: bool,
    pub tokens: u32,
    pub copies: u32,
    pub dispatch_bytes_per_token: f64,
    pub combine_bytes_per_token: f64,
    pub bound: f64,
    pub points: Vec<LatencyPoint>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BandwidthPoint {
    pub kind: Kind,
    pub ep: u32,
    pub gb_s: f64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NormalBlock {
    pub id: String,
    pub source: String,
    pub system: String,
    /// Whether the fit uses this block (otherwise its points are only reported, as checks).
    #[serde(default = "fitted")]
    pub fit: bool,
    pub bound: f64,
    pub points: Vec<BandwidthPoint>,
}

fn fitted() -> bool {
    true
}

/// Most draft tokens an MTP point may have.
const MAX_DRAFTS: u32 = 16;

/// What an MTP point measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MtpMetric {
    /// Accepted drafts per draft (meaningful with one draft: the first draft's acceptance).
    AcceptRate,
    /// Mean tokens a sequence emits per step: accepted drafts + 1.
    AcceptLen,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MtpPoint {
    pub drafts: u32,
    pub metric: MtpMetric,
    pub value: f64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MtpBlock {
    pub id: String,
    pub source: String,
    /// Whether the acceptance fit uses this block (otherwise it is only reported).
    pub fit: bool,
    pub bound: f64,
    pub points: Vec<MtpPoint>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Microbenchmarks {
    #[serde(default)]
    pub low_latency: Vec<LowLatencyBlock>,
    #[serde(default)]
    pub normal: Vec<NormalBlock>,
    #[serde(default)]
    pub mtp: Vec<MtpBlock>,
    /// DeepSeek-V4's fused kernels ([`crate::v4_kernels`]).
    #[serde(default)]
    pub kernel: Vec<crate::v4_kernels::KernelBlock>,
}

/// Parses a microbenchmark file; every point must be positive and every block's system known.
pub fn parse(file: &str, text: &str) -> Result<Microbenchmarks, MicroError> {
    let m: Microbenchmarks = toml::from_str(text).map_err(|e| MicroError::Parse {
        file: file.into(),
        message: e.to_string(),
    })?;
    let cat = Catalog::builtin();
    let check =
        |id: &str, system: &str, bound: f64, values: &mut dyn Iterator<Item = (u32, f64)>| {
            let bad = |message: String| MicroError::Block {
                id: id.to_string(),
                message,
            };
            cat.system(system)
                .map_err(|e| bad(format!("system = {system:?}: {e}")))?;
            if !(bound.is_finite() && bound > 0.0) {
                return Err(bad(format!("bound = {bound}: must be a positive fraction")));
            }
            for (ep, v) in values {
                if ep < 2 {
                    return Err(bad(format!("ep = {ep}: must be at least 2")));
                }
                if !(v.is_finite() && v > 0.0) {
                    return Err(bad(format!("EP{ep}: {v} must be positive")));
                }
            }
            Ok(())
        };
    for b in &m.low_latency {
        check(
            &b.id,
            &b.system,
            b.bound,
            &mut b.points.iter().map(|p| (p.ep, p.us)),
        )?;
    }
    for b in &m.normal {
        check(
            &b.id,
            &b.system,
            b.bound,
            &mut b.points.iter().map(|p| (p.ep, p.gb_s)),
        )?;
    }
    for b in &m.kernel {
        crate::v4_kernels::check(b)?;
    }
    for b in &m.mtp {
        let bad = |message: String| MicroError::Block {
            id: b.id.clone(),
            message,
        };
        if !(b.bound.is_finite() && b.bound > 0.0) {
            return Err(bad(format!(
                "bound = {}: must be a positive fraction",
                b.bound
            )));
        }
        for p in &b.points {
            if !(1..=MAX_DRAFTS).contains(&p.drafts) {
                return Err(bad(format!(
                    "drafts = {}: must be 1..={}",
                    p.drafts, MAX_DRAFTS
                )));
            }
            let ok = match p.metric {
                MtpMetric::AcceptRate => (0.0..=1.0).contains(&p.value),
                MtpMetric::AcceptLen => (1.0..=1.0 + p.drafts as f64).contains(&p.value),
            };
            if !ok {
                return Err(bad(format!(
                    "value = {} with {} drafts: out of range for {}",
                    p.value,
                    p.drafts,
                    match p.metric {
                        MtpMetric::AcceptRate => "accept_rate (must be in [0, 1])",
                        MtpMetric::AcceptLen => "accept_len (must be in [1, 1 + drafts])",
                    }
                )));
            }
        }
    }
    Ok(m)
}

/// The shipped microbenchmarks.
pub fn builtin() -> Result<Microbenchmarks, MicroError> {
    parse("microbenchmarks.toml", MICROBENCHMARKS)
}

/// The fitted all-to-all parameters of one cost model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct A2aFit {
    pub cost_model: String,
    pub dispatch_base_us: f64,
    pub combine_base_us: f64,
    pub per_doubling_us: f64,
    pub low_latency_bw_eff: f64,
    /// Normal mode, dispatch.
    pub normal_bw_eff_at_ep8: f64,
    pub normal_bw_eff_per_doubling: f64,
    /// Normal mode, combine (the dispatch pair where the points cannot fit their own).
    pub normal_combine_bw_eff_at_ep8: f64,
    pub normal_combine_bw_eff_per_doubling: f64,
    /// The fabric levels the fitted points ran on, sorted.
    pub fitted_on: Vec<String>,
}

impl A2aFit {
    /// `cm` with these parameters.
    pub fn apply(&self, cm: &CostModel) -> CostModel {
        let mut p = cm.params.clone();
        let a = &mut p.alltoall;
        a.dispatch_base_us = self.dispatch_base_us;
        a.combine_base_us = self.combine_base_us;
        a.per_doubling_us = self.per_doubling_us;
        a.low_latency_bw_eff = self.low_latency_bw_eff;
        a.normal_bw_eff_at_ep8 = self.normal_bw_eff_at_ep8;
        a.normal_bw_eff_per_doubling = self.normal_bw_eff_per_doubling;
        a.normal_combine_bw_eff_at_ep8 = Some(self.normal_combine_bw_eff_at_ep8);
        a.normal_combine_bw_eff_per_doubling = Some(self.normal_combine_bw_eff_per_doubling);
        a.fitted_on = self.fitted_on.clone();
        CostModel::new(cm.system.clone(), p)
    }

    /// The lines to paste into the cost model's data file.
    pub fn toml(&self) -> String {
        format!(
            "dispatch_base_us = {:.1}\ncombine_base_us = {:.1}\nper_doubling_us = {:.2}\nlow_latency_bw_eff = {:.2}\nnormal_bw_eff_at_ep8 = {:.3}\nnormal_bw_eff_per_doubling = {:.3}\nnormal_combine_bw_eff_at_ep8 = {:.3}\nnormal_combine_bw_eff_per_doubling = {:.3}\nfitted_on = {:?}",
            self.dispatch_base_us,
            self.combine_base_us,
            self.per_doubling_us,
            self.low_latency_bw_eff,
            self.normal_bw_eff_at_ep8,
            self.normal_bw_eff_per_doubling,
            self.normal_combine_bw_eff_at_ep8,
            self.normal_combine_bw_eff_per_doubling,
            self.fitted_on
        )
    }
}

fn cost_model_of(cat: &Catalog, system: &str) -> Result<CostModel, MicroError> {
    let bad = |e: dstwin_hwmodels::HwError| MicroError::Block {
        id: system.to_string(),
        message: e.to_string(),
    };
    let s = cat.system(system).map_err(bad)?;
    cat.cost_model(s, None).map_err(bad)
}

/// Low-latency bytes one rank sends for a point.
fn ll_bytes(b: &LowLatencyBlock, kind: Kind) -> f64 {
    let per_token = match kind {
        Kind::Dispatch => b.dispatch_bytes_per_token,
        Kind::Combine => b.combine_bytes_per_token,
    };
    b.tokens as f64 * b.copies as f64 * per_token
}

/// The level a low-latency all-to-all of `ep` dies runs on under `cm`.
fn ll_fabric(cm: &CostModel, ep: u32) -> &dstwin_hwmodels::FabricLevel {
    if cm.params.alltoall.low_latency_uses_outer_level {
        cm.system
            .fabric
            .last()
            .expect("validated: at least one level")
    } else {
        cm.level(ep)
    }
}

/// Latency (µs) and bandwidth (bytes per µs) of [`ll_fabric`].
fn ll_level(cm: &CostModel, ep: u32) -> (f64, f64) {
    let level = ll_fabric(cm, ep);
    (level.latency_us, level.bw_gb_s_per_die * 1e3)
}

/// Fits every cost model the microbenchmarks cover.
pub fn fit(m: &Microbenchmarks) -> Result<Vec<A2aFit>, MicroError> {
    let cat = Catalog::builtin();
    let models =
        |systems: &mut dyn Iterator<Item = &String>| -> Result<Vec<CostModel>, MicroError> {
            systems.map(|s| cost_model_of(cat, s)).collect()
        };
    let ll_models = models(&mut m.low_latency.iter().map(|b| &b.system))?;
    let normal_models = models(&mut m.normal.iter().map(|b| &b.system))?;
    // Each cost model once, in the order the file names it.
    let fitted_ll = m.low_latency.iter().map(|b| b.fit);
    let fitted_normal = m.normal.iter().map(|b| b.fit);
    let mut bases: Vec<&CostModel> = Vec::new();
    for (cm, fit) in ll_models
        .iter()
        .zip(fitted_ll)
        .chain(normal_models.iter().zip(fitted_normal))
    {
        if fit && !bases.iter().any(|b| b.params.name == cm.params.name) {
            bases.push(cm);
        }
    }
    let mut fits = Vec::new();
    for base in bases {
        let name = &base.params.name;
        let a = &base.params.alltoall;
        let mut fitted_on: Vec<String> = Vec::new();
        // Low latency: columns dispatch base, combine base, per doubling, 1 / efficiency.
        let mut rows = Vec::new();
        for (b, cm) in m.low_latency.iter().zip(&ll_models) {
            if cm.params.name != *name || !b.fit {
                continue;
            }
            for p in &b.points {
                fitted_on.push(ll_fabric(cm, p.ep).name.clone());
                let (lat, bw) = ll_level(cm, p.ep);
                let g = p.ep as f64;
                let remote = ll_bytes(b, p.kind) * (g - 1.0) / g;
                // Relative least squares: each row scaled by the published time.
                let x = vec![
                    f64::from(u8::from(p.kind == Kind::Dispatch)) / p.us,
                    f64::from(u8::from(p.kind == Kind::Combine)) / p.us,
                    g.log2() / p.us,
                    remote / bw / p.us,
                ];
                rows.push((x, (p.us - lat) / p.us));
            }
        }
        let ll = if rows.len() >= 4 {
            let x = bounded_lstsq(
                &rows,
                &[0.0, 0.0, 0.0, 1.0],
                &[f64::INFINITY, f64::INFINITY, f64::INFINITY, f64::INFINITY],
            )
            .ok_or_else(|| MicroError::TooFew(name.clone()))?;
            (x[0], x[1], x[2], 1.0 / x[3])
        } else {
            (
                a.dispatch_base_us,
                a.combine_base_us,
                a.per_doubling_us,
                a.low_latency_bw_eff,
            )
        };
        // Normal: efficiency = at_ep8 + per_doubling * log2(EP / 8), dispatch and combine each
        // their own line (different kernels: on A3 dispatch loses 61% of its bandwidth from EP8
        // to EP128, combine 35%). A kind whose points span fewer than two EP sizes takes the
        // line fitted to both.
        let mut rows = [Vec::new(), Vec::new()];
        for (b, cm) in m.normal.iter().zip(&normal_models) {
            if cm.params.name != *name || !b.fit {
                continue;
            }
            for p in &b.points {
                fitted_on.push(cm.level(p.ep).name.clone());
                let bw = cm.level(p.ep).bw_gb_s_per_die;
                // Relative least squares, as above.
                let w = bw / p.gb_s;
                let k = usize::from(p.kind == Kind::Combine);
                rows[k].push((vec![w, w * (p.ep as f64 / 8.0).log2()], 1.0, p.ep));
            }
        }
        let line = |rows: &[&(Vec<f64>, f64, u32)]| -> Result<Option<(f64, f64)>, MicroError> {
            let mut eps: Vec<u32> = rows.iter().map(|r| r.2).collect();
            eps.sort_unstable();
            eps.dedup();
            if eps.len() < 2 {
                return Ok(None);
            }
            let rows: Vec<(Vec<f64>, f64)> = rows.iter().map(|r| (r.0.clone(), r.1)).collect();
            let x = lstsq(&rows, &[None, None]).ok_or_else(|| MicroError::TooFew(name.clone()))?;
            Ok(Some((x[0], x[1])))
        };
        let both = line(&rows.iter().flatten().collect::<Vec<_>>())?
            .unwrap_or((a.normal_bw_eff_at_ep8, a.normal_bw_eff_per_doubling));
        let dispatch = line(&rows[0].iter().collect::<Vec<_>>())?.unwrap_or(both);
        let combine = line(&rows[1].iter().collect::<Vec<_>>())?.unwrap_or(both);
        fits.push(A2aFit {
            cost_model: name.clone(),
            dispatch_base_us: ll.0,
            combine_base_us: ll.1,
            per_doubling_us: ll.2,
            low_latency_bw_eff: ll.3,
            normal_bw_eff_at_ep8: dispatch.0,
            normal_bw_eff_per_doubling: dispatch.1,
            normal_combine_bw_eff_at_ep8: combine.0,
            normal_combine_bw_eff_per_doubling: combine.1,
            fitted_on: {
                fitted_on.sort();
                fitted_on.dedup();
                fitted_on
            },
        });
    }
    Ok(fits)
}

/// The mark of a point the fit does not use.
fn not_fitted(fit: bool) -> &'static str {
    if fit {
        ""
    } else {
        " (not fitted)"
    }
}

/// Every point against the shipped cost models, or against `fits` where one covers the
/// point's cost model.
pub fn residuals(m: &Microbenchmarks, fits: &[A2aFit]) -> Result<Vec<MicroResidual>, MicroError> {
    let cat = Catalog::builtin();
    let model = |system: &str| -> Result<CostModel, MicroError> {
        let cm = cost_model_of(cat, system)?;
        Ok(match fits.iter().find(|f| f.cost_model == cm.params.name) {
            Some(f) => f.apply(&cm),
            None => cm,
        })
    };
    let mut out = Vec::new();
    for b in &m.low_latency {
        let cm = model(&b.system)?;
        for p in &b.points {
            let c = Comm {
                kind: p.kind.comm(),
                bytes: ll_bytes(b, p.kind),
                group: p.ep,
                mode: A2aMode::LowLatency,
                copies: 0.0,
            };
            let predicted = cm.comm(&c).time_s * 1e6;
            out.push(MicroResidual {
                id: b.id.clone(),
                metric: format!("{}_us EP{}{}", p.kind.name(), p.ep, not_fitted(b.fit)),
                published: p.us,
                predicted,
                error: predicted / p.us - 1.0,
                bound: b.bound,
            });
        }
    }
    for b in &m.normal {
        let cm = model(&b.system)?;
        for p in &b.points {
            let eff = cm.params.alltoall.normal_bw_eff(p.kind.comm(), p.ep);
            let predicted = cm.level(p.ep).bw_gb_s_per_die * eff;
            out.push(MicroResidual {
                id: b.id.clone(),
                metric: format!("{}_gb_s EP{}{}", p.kind.name(), p.ep, not_fitted(b.fit)),
                published: p.gb_s,
                predicted,
                error: predicted / p.gb_s - 1.0,
                bound: b.bound,
            });
        }
    }
    Ok(out)
}

/// What the twin predicts for an MTP point when every draft is accepted with probability `p`
/// given the previous one was.
fn mtp_predicted(p: &MtpPoint, acceptance: f64) -> f64 {
    let tokens = Mtp {
        tokens: p.drafts,
        acceptance: vec![acceptance],
    }
    .expected_tokens();
    match p.metric {
        MtpMetric::AcceptLen => tokens,
        MtpMetric::AcceptRate => (tokens - 1.0) / p.drafts as f64,
    }
}

/// The acceptance fitted to the MTP blocks marked `fit = true`: the p in [0, 1] minimising the
/// sum of squared relative errors (golden-section search; the loss is smooth and, over these
/// polynomials, unimodal on [0, 1]). None when no block is fitted.
pub fn fit_mtp(m: &Microbenchmarks) -> Option<f64> {
    let points: Vec<&MtpPoint> = m
        .mtp
        .iter()
        .filter(|b| b.fit)
        .flat_map(|b| &b.points)
        .collect();
    if points.is_empty() {
        return None;
    }
    let loss = |a: f64| -> f64 {
        points
            .iter()
            .map(|p| (mtp_predicted(p, a) / p.value - 1.0).powi(2))
            .sum()
    };
    let g = (5f64.sqrt() - 1.0) / 2.0;
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    let mut c = hi - g * (hi - lo);
    let mut d = lo + g * (hi - lo);
    let (mut fc, mut fd) = (loss(c), loss(d));
    while hi - lo > 1e-7 {
        if fc < fd {
            hi = d;
            d = c;
            fd = fc;
            c = hi - g * (hi - lo);
            fc = loss(c);
        } else {
            lo = c;
            c = d;
            fc = fd;
            d = lo + g * (hi - lo);
            fd = loss(d);
        }
    }
    Some((lo + hi) / 2.0)
}

/// Every MTP point against acceptance `acceptance` (the shipped
/// [`dstwin_twin::mtp::CALIBRATED_ACCEPTANCE`] or a fit).
pub fn mtp_residuals(m: &Microbenchmarks, acceptance: f64) -> Vec<MicroResidual> {
    m.mtp
        .iter()
        .flat_map(|b| {
            b.points.iter().map(move |p| {
                let predicted = mtp_predicted(p, acceptance);
                let metric = match p.metric {
                    MtpMetric::AcceptLen => "accept_len",
                    MtpMetric::AcceptRate => "accept_rate",
                };
                MicroResidual {
                    id: b.id.clone(),
                    metric: format!(
                        "{metric} {} draft{}{}",
                        p.drafts,
                        if p.drafts == 1 { "" } else { "s" },
                        not_fitted(b.fit)
                    ),
                    published: p.value,
                    predicted,
                    error: predicted / p.value - 1.0,
                    bound: b.bound,
                }
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtp_fit_recovers_the_acceptance_that_made_the_points() {
        let point = |drafts, metric| {
            let mut p = MtpPoint {
                drafts,
                metric,
                value: 1.0,
            };
            p.value = mtp_predicted(&p, 0.63);
            p
        };
        let block = |fit, points| MtpBlock {
            id: "x".into(),
            source: "synthetic".into(),
            fit,
            bound: 0.1,
            points,
        };
        let mut m = Microbenchmarks {
            low_latency: vec![],
            normal: vec![],
            kernel: vec![],
            mtp: vec![
                block(
                    true,
                    vec![
                        point(1, MtpMetric::AcceptLen),
                        point(3, MtpMetric::AcceptLen),
                    ],
                ),
                block(true, vec![point(2, MtpMetric::AcceptRate)]),
            ],
        };
        let a = fit_mtp(&m).unwrap();
        assert!((a - 0.63).abs() < 1e-5, "{a}");
        assert!(mtp_residuals(&m, a).iter().all(|r| r.error.abs() < 1e-4));
        // An unfitted block is reported but does not pull the fit.
        m.mtp
            .push(block(false, vec![point(1, MtpMetric::AcceptRate)]));
        m.mtp[2].points[0].value = 0.95;
        assert!((fit_mtp(&m).unwrap() - 0.63).abs() < 1e-5);
        assert_eq!(mtp_residuals(&m, a).len(), 4);
        // Nothing to fit.
        m.mtp.iter_mut().for_each(|b| b.fit = false);
        assert!(fit_mtp(&m).is_none());
    }

    #[test]
    fn bad_files_name_the_block_and_value() {
        let bad = MICROBENCHMARKS.replacen("us = 116", "us = -116", 1);
        let e = parse("x.toml", &bad).unwrap_err().to_string();
        assert!(e.contains("cm384-deepep") && e.contains("-116"), "{e}");
        let bad = MICROBENCHMARKS.replacen("system = \"cloudmatrix384\"", "system = \"cm999\"", 1);
        let e = parse("x.toml", &bad).unwrap_err().to_string();
        assert!(e.contains("cm999"), "{e}");
        let bad = MICROBENCHMARKS.replacen("value = 2.59", "value = 4.59", 1);
        let e = parse("x.toml", &bad).unwrap_err().to_string();
        assert!(e.contains("sglang-a3-mtp") && e.contains("4.59"), "{e}");
        let bad = MICROBENCHMARKS.replacen(
            "drafts = 3, metric = \"accept_len\", value = 2.88",
            "drafts = 0, metric = \"accept_len\", value = 2.88",
            1,
        );
        let e = parse("x.toml", &bad).unwrap_err().to_string();
        assert!(
            e.contains("sglang-a3-mtp") && e.contains("drafts = 0"),
            "{e}"
        );
        let bad = MICROBENCHMARKS.replacen("tokens = 128", "tokens = 128\nwarmup = 3", 1);
        let e = parse("x.toml", &bad).unwrap_err().to_string();
        assert!(e.contains("warmup"), "{e}");
    }
}
