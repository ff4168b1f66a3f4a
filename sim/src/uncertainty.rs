//! What a scenario leaves unknown, drawn: the spread behind `simulate --uncertainty` and the
//! intervals `validate --e2e` checks its published figures against.
//!
//! Draw k of a scenario changes, each by a seeded draw of its own:
//!
//! - the seed: the expert load's per-layer draws, each request's MTP acceptances, the workload's
//!   own random lengths and arrivals;
//! - every kernel's time, by one factor (log-normal, [`KERNEL_SIGMA`]): the spread of the fitted
//!   cost parameters where they were not fitted (their leave-one-out errors);
//! - the MTP acceptance per draft, where the scenario leaves it at the calibrated value
//!   ([`ACCEPTANCE_SD`]: the spread of the points it was fitted to);
//! - the fitted expert load's skew and per-request concentration ([`LOAD_SIGMA_SIGMA`],
//!   [`CONCENTRATION_SIGMA`]), fitted to one measurement;
//! - the host time of eager kernel launches ([`EAGER_SIGMA`]);
//! - the communication: the fitted all-to-all ([`ALLTOALL_SIGMA`]), a dispatch or combine on a
//!   fabric level the all-to-all was not fitted on ([`UNFITTED_LEVEL_SIGMA`]) and the ring
//!   collectives and KV transfers, whose parameters are the same assumption
//!   ([`COLLECTIVE_SIGMA`]), each by a factor of its own.
//!
//! Everything else (the layout, the scheduler limits, the workload's shape) is what the
//! scenario says and is not drawn. Draw 0 is the scenario itself.

use crate::scenario::Scenario;
use dstwin_hwmodels::CostModel;
use dstwin_twin::expert_load::{fitted, ExpertLoadSpec};
use dstwin_twin::mtp::CALIBRATED_ACCEPTANCE;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use serde::Serialize;

/// Draws `simulate --uncertainty` and `validate --e2e` make by default.
pub const DEFAULT_DRAWS: u32 = 16;

/// Log-normal sigma of the factor on every kernel's time: the root mean square of the
/// out-of-sample errors of the steady-step anchors, each predicted by the cost parameters fitted
/// without it (docs/validation.md, leave-one-anchor-out: 15 of 17 within 10%, RMS ~7%, the
/// A3 anchors), rounded up to 10% for the kernels no anchor checks (Hopper's are fitted to
/// kernel databases whose residuals span -43%..+42%).
pub const KERNEL_SIGMA: f64 = 0.10;

/// Standard deviation of the MTP acceptance per draft around the calibrated value: the points it
/// is fitted to give 0.70 (CloudMatrix-Infer, 1 draft) to 0.82 (SGLang's 2.88 with 3 drafts)
/// per draft (calibration/data/microbenchmarks.toml).
pub const ACCEPTANCE_SD: f64 = 0.05;

/// Log-normal sigma of the factor on the fitted expert load's skew (sigma). Assumption: the one
/// measurement it is fitted to (TensorRT-LLM, EP32, one dataset) shows per-layer rank imbalances
/// from 1.46x to 3.46x; another dataset's loads are not measured.
pub const LOAD_SIGMA_SIGMA: f64 = 0.2;

/// Log-normal sigma of the factor on the per-request routing concentration. Assumption: it is
/// fitted to one figure (CloudMatrix-Infer's default against perfect EPLB), and no published
/// measurement gives one sequence's expert counts (docs/validation.md, "Expert imbalance").
pub const CONCENTRATION_SIGMA: f64 = 0.7;

/// Log-normal sigma of the factor on the host time of eager launches: the two measurements
/// give 2.7 and 4.2 ms per layer on A3 (hwmodels/data/costs/ascend-910c.toml `[host]`).
pub const EAGER_SIGMA: f64 = 0.25;

/// Log-normal sigma of the factor on the fitted all-to-all's time (its fixed costs over the
/// factor, its bandwidth efficiencies under it): the root mean square of the fit's relative
/// residuals over its 44 fitted points (`dstwin calibrate`, 0.1%..14%; ~6%), rounded up to 8%
/// for leaving points out.
pub const ALLTOALL_SIGMA: f64 = 0.08;

/// Log-normal sigma of the factor on a dispatch or combine priced on a fabric level the
/// all-to-all parameters were not fitted on (`alltoall.unfitted_factor`): such a price is an
/// extrapolation, and the six Atlas 800I A2 points the 910C's parameters price off their
/// fabrics (calibration/data/microbenchmarks.toml, "not fitted": -48%..+98%) give a root mean
/// square of 0.48 in log.
pub const UNFITTED_LEVEL_SIGMA: f64 = 0.48;

/// Log-normal sigma of the factor on the ring collectives' time (all-reduce, all-gather,
/// reduce-scatter, point-to-point), whose cost-file parameters are assumptions: the Hopper ring
/// formula against NVIDIA's measured H200 tables (aiconfigurator 0.12 `nccl_perf` 2.26 and
/// vLLM 0.19 custom all-reduce, 2 to 8 GPUs, DeepSeek's 7,168 to 117M-element messages) is off
/// by 0.47x..2.1x, 0.20..0.48 in log root mean square per collective and group; 0.35 is their
/// middle. No Ascend collective is measured in the anchors.
pub const COLLECTIVE_SIGMA: f64 = 0.35;

/// Salt of the draws' generator, so that draw k's factors do not follow the scenario's seed.
const SALT: u64 = 0x756e_6365_7274_6169;

/// Draw `k` of `s` (the module docs); draw 0 is `s` itself.
pub fn perturbed(s: &Scenario, k: u64) -> Scenario {
    let mut out = s.clone();
    if k == 0 {
        return out;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(s.seed ^ SALT ^ k.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let z = Normal::new(0.0, 1.0).expect("unit normal");
    let mut lognormal = |sigma: f64| (sigma * z.sample(&mut rng)).exp();
    out.seed = s.seed.wrapping_add(k.wrapping_mul(0x2545_f491_4f6c_dd1d));
    let kernel = lognormal(KERNEL_SIGMA);
    let accept = lognormal(1.0);
    let skew = lognormal(LOAD_SIGMA_SIGMA);
    let conc = lognormal(CONCENTRATION_SIGMA);
    let eager = lognormal(EAGER_SIGMA);
    let a2a = lognormal(ALLTOALL_SIGMA);
    let unfitted = lognormal(UNFITTED_LEVEL_SIGMA);
    let collective = lognormal(COLLECTIVE_SIGMA);
    // The kernels: every class's efficiencies over the factor (at most 1), its fixed cost times it.
    let mut p = s.cost.params.clone();
    p.op_overhead_us *= kernel;
    for e in p.efficiency.values_mut() {
        e.compute = (e.compute / kernel).min(1.0);
        e.memory = (e.memory / kernel).min(1.0);
        if let Some(f) = e.fixed_us.as_mut() {
            *f *= kernel;
        }
        if let Some(o) = e.one_row.as_mut() {
            o.compute = (o.compute / kernel).min(1.0);
            o.memory = (o.memory / kernel).min(1.0);
            o.fixed_us *= kernel;
        }
    }
    for k in &mut p.kernel {
        k.efficiency = (k.efficiency / kernel).min(1.0);
        k.fixed_us *= kernel;
    }
    if let Some(h) = p.host.as_mut() {
        h.eager_layer_us *= eager;
    }
    let a = &mut p.alltoall;
    a.dispatch_base_us *= a2a;
    a.combine_base_us *= a2a;
    a.per_doubling_us *= a2a;
    a.low_latency_bw_eff = (a.low_latency_bw_eff / a2a).min(1.0);
    a.normal_bw_eff_at_ep8 /= a2a;
    a.normal_bw_eff_per_doubling /= a2a;
    a.normal_bw_eff_min = (a.normal_bw_eff_min / a2a).min(1.0);
    a.normal_combine_bw_eff_at_ep8 = a.normal_combine_bw_eff_at_ep8.map(|e| e / a2a);
    a.normal_combine_bw_eff_per_doubling = a.normal_combine_bw_eff_per_doubling.map(|e| e / a2a);
    p.collective.base_us *= collective;
    p.collective.bw_eff = (p.collective.bw_eff / collective).min(1.0);
    p.alltoall.unfitted_factor *= unfitted;
    out.cost = CostModel::new(s.cost.system.clone(), p);
    // The acceptance, where the scenario leaves it calibrated: the log-normal draw above read
    // as a normal deviate (ln of a unit log-normal is N(0, 1)).
    if out.mtp.acceptance == [CALIBRATED_ACCEPTANCE] {
        let a = CALIBRATED_ACCEPTANCE + ACCEPTANCE_SD * accept.ln();
        out.mtp.acceptance = vec![a.clamp(0.05, 0.98)];
    }
    out.expert_load = match &s.expert_load {
        ExpertLoadSpec::Fitted { drift, epoch_steps } => {
            let f = fitted();
            ExpertLoadSpec::Lognormal {
                sigma: f.sigma * skew,
                sigma_spread: f.sigma_spread,
                concentration: f.concentration * conc,
                drift: *drift,
                epoch_steps: *epoch_steps,
            }
        }
        other => other.clone(),
    };
    out
}

/// An 80% interval: the 10th and 90th percentiles of a figure over draws.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Interval {
    pub p10: f64,
    pub p90: f64,
}

impl Interval {
    /// The interval of `draws` (NaN bounds when a draw has no such figure).
    pub fn of(draws: &[f64]) -> Interval {
        Interval {
            p10: quantile(draws, 0.1),
            p90: quantile(draws, 0.9),
        }
    }

    pub fn contains(&self, x: f64) -> bool {
        x >= self.p10 && x <= self.p90
    }
}

/// The `q` quantile (0..1) of unsorted `v` ([`dstwin_traces::quantile`]); NaN when `v`
/// is empty or holds a NaN.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    if v.iter().any(|x| x.is_nan()) {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    dstwin_traces::quantile(&s, q)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::load_str;
    use std::path::Path;

    fn scenario(extra: &[&str]) -> Scenario {
        let text = include_str!("../scenarios/a3-2p1d.toml");
        let sets: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        load_str("a3-2p1d.toml", text, Path::new("."), &sets).unwrap()
    }

    #[test]
    fn draw_zero_is_the_scenario_and_every_draw_is_reproducible() {
        let s = scenario(&["mtp.acceptance=[]"]);
        let same = perturbed(&s, 0);
        assert_eq!(same.seed, s.seed);
        assert_eq!(same.cost.params, s.cost.params);
        assert_eq!(same.mtp.acceptance, s.mtp.acceptance);
        let (a, b) = (perturbed(&s, 3), perturbed(&s, 3));
        assert_eq!(a.cost.params, b.cost.params);
        assert_eq!(a.mtp.acceptance, b.mtp.acceptance);
        assert_eq!(a.seed, b.seed);
        let c = perturbed(&s, 4);
        assert_ne!(a.seed, c.seed);
        assert_ne!(a.cost.params, c.cost.params);
    }

    #[test]
    fn a_draw_moves_only_what_the_scenario_leaves_unknown() {
        // Calibrated acceptance and the fitted load are drawn; a given acceptance is kept.
        let s = scenario(&["mtp.acceptance=[]"]);
        assert_eq!(s.mtp.acceptance, [CALIBRATED_ACCEPTANCE]);
        let accepted: Vec<f64> = (1..=64)
            .map(|k| perturbed(&s, k).mtp.acceptance[0])
            .collect();
        let mean = accepted.iter().sum::<f64>() / 64.0;
        assert!((mean - CALIBRATED_ACCEPTANCE).abs() < 0.03, "{mean}");
        assert!(accepted.iter().any(|a| *a != CALIBRATED_ACCEPTANCE));
        let given = scenario(&[]);
        assert_eq!(perturbed(&given, 5).mtp.acceptance, given.mtp.acceptance);
        match perturbed(&s, 1).expert_load {
            ExpertLoadSpec::Lognormal { sigma, .. } => assert!(sigma > 0.0),
            other => panic!("the fitted load drawn as a log-normal, got {other:?}"),
        }
        // Kernel time moves by one factor: every efficiency by the same ratio (below 1).
        let p = perturbed(&s, 2).cost.params;
        let ratios: Vec<f64> = s
            .cost
            .params
            .efficiency
            .iter()
            .zip(p.efficiency.iter())
            .filter(|((_, a), (_, b))| b.memory < 1.0 && a.memory < 1.0)
            .map(|((_, a), (_, b))| b.memory / a.memory)
            .collect();
        assert!(
            ratios.windows(2).all(|w| (w[0] - w[1]).abs() < 1e-9),
            "{ratios:?}"
        );
        // Communication: the all-to-all (fitted and extrapolated) and the collectives move;
        // the fabric is the system's.
        let d = perturbed(&s, 2);
        let (a, b) = (&s.cost.params, &d.cost.params);
        assert_ne!(a.alltoall.dispatch_base_us, b.alltoall.dispatch_base_us);
        assert_ne!(a.alltoall.unfitted_factor, b.alltoall.unfitted_factor);
        assert_ne!(a.collective.base_us, b.collective.base_us);
        assert_eq!(s.cost.system, d.cost.system);
        // The layout and the workload are the scenario's.
        assert_eq!(d.instances.len(), s.instances.len());
        assert_eq!(d.workload, s.workload);
    }

    #[test]
    fn quantiles_interpolate_between_order_statistics() {
        let v = [3.0, 1.0, 2.0, 5.0, 4.0];
        assert_eq!(quantile(&v, 0.0), 1.0);
        assert_eq!(quantile(&v, 0.5), 3.0);
        assert_eq!(quantile(&v, 1.0), 5.0);
        assert!((quantile(&v, 0.1) - 1.4).abs() < 1e-12);
        assert!(quantile(&[], 0.5).is_nan());
        assert!(quantile(&[1.0, f64::NAN], 0.5).is_nan());
    }
}
