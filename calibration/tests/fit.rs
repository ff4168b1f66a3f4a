//! The shipped 910C parameters are the fit's optimum, and their errors stay within bounds.

use dstwin_calibration::fit::{fit, residuals, Globals};
use dstwin_calibration::target::{parse_targets, Metric, CLOUDMATRIX384};
use dstwin_hwmodels::Catalog;

fn shipped() -> Globals {
    let cat = Catalog::builtin();
    Globals::of(
        &cat.cost_model(cat.system("cloudmatrix384").unwrap(), None)
            .unwrap(),
    )
}

#[test]
fn calibration_anchors_stay_within_10_percent() {
    let targets = parse_targets("cloudmatrix384.toml", CLOUDMATRIX384).unwrap();
    let r = residuals(&targets, shipped()).unwrap();
    for x in r.iter().filter(|x| x.metric != Metric::TwoMicrobatchGain) {
        assert!(
            x.error.abs() <= 0.10,
            "{}: predicted {:.1} vs {:.1} ({:+.1}%)",
            x.id,
            x.predicted,
            x.published,
            x.error * 100.0
        );
    }
    // The overlap gains compare step-time ratios (docs/validation.md); same bound.
    for x in r.iter().filter(|x| x.metric == Metric::TwoMicrobatchGain) {
        assert!(x.error.abs() <= 0.10, "{}: {:+.1}%", x.id, x.error * 100.0);
    }
}

#[test]
fn shipped_parameters_are_the_fit_optimum() {
    let targets = parse_targets("cloudmatrix384.toml", CLOUDMATRIX384).unwrap();
    let f = fit(&targets, 0.05).unwrap();
    let s = shipped();
    assert!(
        (f.globals.in_situ_efficiency - s.in_situ_efficiency).abs() <= 0.02,
        "{:?} vs {:?}",
        f.globals,
        s
    );
    for (name, (a, b)) in Globals::NAMES
        .iter()
        .zip(f.globals.values().into_iter().zip(s.values()))
        .skip(1)
    {
        assert!((a - b).abs() <= 0.05, "{name}: fit {a} vs shipped {b}");
    }
}

#[test]
fn target_files_reject_unknown_fields() {
    let bad = CLOUDMATRIX384.replacen("metric = \"tpot_ms\"", "metric = \"tpot_ms\"\nbatch = 3", 1);
    let err = parse_targets("x.toml", &bad).unwrap_err().to_string();
    assert!(err.contains("batch"), "{err}");
}

#[test]
fn shipped_concentration_is_the_fit_and_reproduces_the_eplb_gap() {
    use dstwin_calibration::fit::{eplb_gap_ratio, fit_concentration, parse_eplb_gap, EXPERT_LOAD};
    let targets = parse_targets("cloudmatrix384.toml", CLOUDMATRIX384).unwrap();
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
