//! The shipped 910C parameters are the fit's optimum, and the fitted figures stay within bounds.

use dstwin_calibration::globals::{fit, param, residuals, Values};
use dstwin_calibration::target::{acceptance_for, parse_targets, Metric, TARGETS};
use dstwin_hwmodels::{Catalog, CostParams};

fn shipped() -> CostParams {
    let cat = Catalog::builtin();
    cat.cost_model(cat.system("cloudmatrix384").unwrap(), None)
        .unwrap()
        .params
}

fn params(p: &CostParams) -> Vec<&'static dstwin_calibration::globals::Param> {
    p.fit.iter().map(|n| param(n).expect(n)).collect()
}

#[test]
fn the_cost_file_names_only_known_parameters() {
    let p = shipped();
    assert!(!p.fit.is_empty());
    for n in &p.fit {
        assert!(param(n).is_some(), "{n}");
    }
}

#[test]
fn fitted_figures_stay_within_11_percent() {
    let targets = parse_targets("targets.toml", TARGETS).unwrap();
    let p = shipped();
    let fitted: Vec<_> = targets
        .iter()
        .filter(|t| t.not_fitted.is_none())
        .cloned()
        .collect();
    let r = residuals(&fitted, "ascend-910c", &Values::of(&params(&p), &p)).unwrap();
    for x in &r {
        // The A2 anchor borrows the 910C's values and is never fitted (docs/validation.md).
        if x.anchor == "huawei-a2-decode" {
            continue;
        }
        // The largest residual is the batch-64 decode overlap gain (-10.2%, docs/validation.md).
        assert!(
            x.error.abs() <= 0.11,
            "{}: predicted {:.3} vs {:.3} ({:+.1}%)",
            x.id,
            x.predicted,
            x.published,
            x.error * 100.0
        );
    }
    assert!(r.iter().any(|x| x.metric == Metric::TwoMicrobatchGain));
}

#[test]
fn shipped_parameters_are_the_fit_optimum() {
    let targets = parse_targets("targets.toml", TARGETS).unwrap();
    let p = shipped();
    let list = params(&p);
    let f = fit(&targets, "ascend-910c", &list, &p).unwrap();
    for (x, (a, b)) in list
        .iter()
        .zip(f.values.values.iter().zip(Values::of(&list, &p).values))
    {
        let tol = 0.02 * (x.hi - x.lo);
        assert!((a - b).abs() <= tol, "{}: fit {a} vs shipped {b}", x.name);
    }
}

#[test]
fn target_files_reject_unknown_fields() {
    let bad = TARGETS.replacen("metric = \"tpot_ms\"", "metric = \"tpot_ms\"\nbatch = 3", 1);
    let err = parse_targets("x.toml", &bad).unwrap_err().to_string();
    assert!(err.contains("batch"), "{err}");
}

#[test]
fn accepted_drafts_give_the_per_draft_acceptance() {
    // 1.44 of 3 drafts accepted (the CANN V3.2 recipe): a + a^2 + a^3 = 1.44.
    let a = acceptance_for(1.44, 3).unwrap();
    assert!((a + a * a + a * a * a - 1.44).abs() < 1e-9, "{a}");
    assert!((acceptance_for(0.7, 1).unwrap() - 0.7).abs() < 1e-9);
    assert!(acceptance_for(3.5, 3).is_none());
    assert!(acceptance_for(1.0, 0).is_none());
    let bad = TARGETS.replacen("mtp_accepted = 1.44", "mtp_accepted = 4.0", 1);
    let err = parse_targets("x.toml", &bad).unwrap_err().to_string();
    assert!(err.contains("mtp_accepted 4"), "{err}");
    // Drafts are capped as a scenario caps them (a fuzzed 4294967295 priced for minutes).
    let bad = TARGETS.replacen("mtp = 3\nmtp_accepted", "mtp = 4294967295\nmtp_accepted", 1);
    assert_ne!(bad, TARGETS);
    let err = parse_targets("x.toml", &bad).unwrap_err().to_string();
    assert!(
        err.contains("mtp 4294967295") && err.contains("at most"),
        "{err}"
    );
}

#[test]
fn shipped_concentration_is_the_fit_and_reproduces_the_eplb_gap() {
    use dstwin_calibration::fit::{eplb_gap_ratio, fit_concentration, parse_eplb_gap, EXPERT_LOAD};
    let targets = parse_targets("targets.toml", TARGETS).unwrap();
    let gap = parse_eplb_gap("expert-load.toml", EXPERT_LOAD).unwrap();
    let cat = Catalog::builtin();
    let cost = cat
        .cost_model(cat.system("cloudmatrix384").unwrap(), None)
        .unwrap();
    let f = fit_concentration(&gap, &targets, &cost).unwrap();
    let shipped = dstwin_twin::expert_load::DEFAULT_CONCENTRATION;
    assert!(
        (f.concentration - shipped).abs() / f.concentration < 0.02,
        "fit {:.2} vs shipped {shipped}",
        f.concentration
    );
    // The shipped value predicts the published gap within 1% (it is a one-figure fit).
    let r = eplb_gap_ratio(&gap, &targets, &cost, shipped).unwrap();
    assert!(
        (r / f.published_ratio - 1.0).abs() < 0.01,
        "{r} vs {}",
        f.published_ratio
    );
    // Without per-batch fluctuation the gap all but vanishes: the mechanism, not the skew,
    // carries it.
    let none = eplb_gap_ratio(&gap, &targets, &cost, 0.0).unwrap();
    assert!(none > 0.99, "{none}");
}

#[test]
fn leave_one_out_refits_without_the_anchor_it_predicts() {
    use dstwin_calibration::globals::{fit, leave_one_out, param};
    // Three anchors and two parameters keep this quick in a debug build.
    let all = parse_targets("targets.toml", TARGETS).unwrap();
    let keep = [
        "cm384-decode-b96",
        "cann-recipes-r1-decode-a3-ep128",
        "sglang-a3-r1-w8a8-lowlat-32",
    ];
    let targets: Vec<_> = all
        .into_iter()
        .filter(|t| keep.contains(&t.anchor.as_str()))
        .collect();
    let list = [
        param("op_overhead_us").unwrap(),
        param("efficiency.attention.compute").unwrap(),
    ];
    let p = shipped();
    let held = leave_one_out(&targets, "ascend-910c", &list, &p, &[]).unwrap();
    assert_eq!(held.len(), keep.len());
    for h in &held {
        // Its residuals are its own figures, priced with the fit of the other anchors.
        assert!(!h.residuals.is_empty());
        assert!(h.residuals.iter().all(|r| r.anchor == h.anchor));
        let rest: Vec<_> = targets
            .iter()
            .filter(|t| t.anchor != h.anchor)
            .cloned()
            .collect();
        let f = fit(&rest, "ascend-910c", &list, &p).unwrap();
        assert_eq!(f.values.values, h.values.values, "{}", h.anchor);
    }
    // Leaving different anchors out gives different fits.
    assert!(held
        .windows(2)
        .any(|w| w[0].values.values != w[1].values.values));
}
