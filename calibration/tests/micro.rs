//! The shipped all-to-all parameters and V4 kernel entries are the microbenchmark fits, and every
//! microbenchmark point stays within its documented bound.

use dstwin_calibration::micro::{builtin, fit, fit_mtp, mtp_residuals, residuals, MicroResidual};
use dstwin_calibration::v4_kernels;
use dstwin_hwmodels::Catalog;

#[test]
fn shipped_alltoall_parameters_are_the_microbenchmark_fit() {
    let m = builtin().unwrap();
    let fits = fit(&m).unwrap();
    assert_eq!(fits.len(), 2, "ascend-910c and nvidia-hopper");
    let cat = Catalog::builtin();
    for f in &fits {
        let shipped = &cat.cost_params(&f.cost_model).unwrap().alltoall;
        let pairs = [
            (
                "dispatch_base_us",
                f.dispatch_base_us,
                shipped.dispatch_base_us,
                0.1,
            ),
            (
                "combine_base_us",
                f.combine_base_us,
                shipped.combine_base_us,
                0.1,
            ),
            (
                "per_doubling_us",
                f.per_doubling_us,
                shipped.per_doubling_us,
                0.01,
            ),
            (
                "low_latency_bw_eff",
                f.low_latency_bw_eff,
                shipped.low_latency_bw_eff,
                0.01,
            ),
            (
                "normal_bw_eff_at_ep8",
                f.normal_bw_eff_at_ep8,
                shipped.normal_bw_eff_at_ep8,
                0.001,
            ),
            (
                "normal_bw_eff_per_doubling",
                f.normal_bw_eff_per_doubling,
                shipped.normal_bw_eff_per_doubling,
                0.001,
            ),
            (
                "normal_combine_bw_eff_at_ep8",
                f.normal_combine_bw_eff_at_ep8,
                shipped.normal_combine_bw_eff_at_ep8.unwrap_or(f64::NAN),
                0.001,
            ),
            (
                "normal_combine_bw_eff_per_doubling",
                f.normal_combine_bw_eff_per_doubling,
                shipped
                    .normal_combine_bw_eff_per_doubling
                    .unwrap_or(f64::NAN),
                0.001,
            ),
        ];
        for (name, fitted, ship, tol) in pairs {
            assert!(
                (fitted - ship).abs() <= tol,
                "{}: {name} fitted {fitted} vs shipped {ship}",
                f.cost_model
            );
        }
    }
}

#[test]
fn the_atlas_a2_borrows_the_910c_alltoall_parameters() {
    // No A2 all-to-all microbenchmark exists in the anchors (docs/validation.md).
    let cat = Catalog::builtin();
    let (c, b) = (
        &cat.cost_params("ascend-910c").unwrap().alltoall,
        &cat.cost_params("ascend-910b").unwrap().alltoall,
    );
    // The same numbers, but fitted on no A2 fabric: every A2 report says so.
    assert!(b.fitted_on.is_empty() && !c.fitted_on.is_empty());
    let strip = |a: &dstwin_hwmodels::AllToAllParams| {
        let mut a = a.clone();
        a.source.clear();
        a.fitted_on.clear();
        a
    };
    assert_eq!(strip(c), strip(b));
}

#[test]
fn microbenchmarks_stay_within_their_documented_bounds() {
    let m = builtin().unwrap();
    let r = residuals(&m, &[]).unwrap();
    let points: usize = m.low_latency.iter().map(|b| b.points.len()).sum::<usize>()
        + m.normal.iter().map(|b| b.points.len()).sum::<usize>();
    assert_eq!(r.len(), points);
    assert_within_bounds(&r);
}

fn assert_within_bounds(r: &[MicroResidual]) {
    for x in r {
        assert!(
            x.error.abs() <= x.bound,
            "{} {}: {:.3} vs {:.3} ({:+.1}%, bound {:.0}%)",
            x.id,
            x.metric,
            x.predicted,
            x.published,
            x.error * 100.0,
            x.bound * 100.0
        );
    }
}

#[test]
fn shipped_mtp_acceptance_is_the_fit_and_every_point_stays_within_its_bound() {
    let m = builtin().unwrap();
    let fitted = fit_mtp(&m).expect("the shipped file has fitted MTP blocks");
    let shipped = dstwin_twin::mtp::CALIBRATED_ACCEPTANCE;
    assert!(
        (fitted - shipped).abs() <= 0.0005,
        "fitted {fitted} vs shipped {shipped}"
    );
    let r = mtp_residuals(&m, shipped);
    assert_eq!(r.len(), m.mtp.iter().map(|b| b.points.len()).sum::<usize>());
    assert_within_bounds(&r);
}

#[test]
fn shipped_kernel_entries_are_the_fit_and_every_point_stays_within_its_bound() {
    let m = builtin().unwrap();
    let fits = v4_kernels::fit(&m.kernel).unwrap();
    assert_eq!(fits.len(), 1, "the V4 kernels were timed on A3 only");
    let shipped = &Catalog::builtin()
        .cost_params(&fits[0].cost_model)
        .unwrap()
        .kernel;
    assert_eq!(fits[0].entries.len(), shipped.len());
    for (f, s) in fits[0].entries.iter().zip(shipped) {
        assert_eq!((&f.ops, f.bound), (&s.ops, s.bound));
        assert!(
            (f.fixed_us - s.fixed_us).abs() <= 0.01
                && (f.efficiency / s.efficiency - 1.0).abs() <= 0.001,
            "{:?}: fitted {} us, {} vs shipped {} us, {}",
            f.ops,
            f.fixed_us,
            f.efficiency,
            s.fixed_us,
            s.efficiency
        );
    }
    let r = v4_kernels::residuals(&m.kernel, &[]).unwrap();
    assert_eq!(
        r.len(),
        m.kernel.iter().map(|b| b.points.len()).sum::<usize>()
    );
    assert!(r.len() >= 21, "hc_pre, hc_post and the compressors");
    assert_within_bounds(&r);
    // The fit moves with its data: compressors timed 20% slower fit a larger fixed cost.
    let mut slower = m.kernel.clone();
    for b in &mut slower {
        for p in &mut b.points {
            if p.op.starts_with('c') {
                p.us *= 1.2;
            }
        }
    }
    let refit = v4_kernels::fit(&slower).unwrap();
    let fixed = |f: &v4_kernels::KernelFit| {
        f.entries
            .iter()
            .find(|k| k.ops[0] == "c4li")
            .unwrap()
            .fixed_us
    };
    assert!(fixed(&refit[0]) > fixed(&fits[0]) * 1.1);
}

#[test]
fn bad_kernel_points_name_the_block_and_field() {
    let text = dstwin_calibration::micro::MICROBENCHMARKS;
    for (from, to, says) in [
        ("us = 32.8", "us = -32.8", "us = -32.8"),
        (
            "op = \"hc_pre\", batch = 16",
            "op = \"hc_mid\", batch = 16",
            "hc_mid",
        ),
        (
            "start_pos = 8192, us = 55",
            "us = 55",
            "start_pos is needed",
        ),
        (
            "{ op = \"hc_post\", batch = 8,",
            "{ op = \"hc_post\", batch = 8, start_pos = 3,",
            "compressors only",
        ),
        (
            "model = \"deepseek-v4-flash\"",
            "model = \"deepseek-v9\"",
            "deepseek-v9",
        ),
        (
            "op = \"hc_post\", batch = 16",
            "op = \"hc_post\", batch = 0",
            "batch = 0",
        ),
    ] {
        assert!(text.contains(from), "{from}");
        let bad = text.replacen(from, to, 1);
        let e = dstwin_calibration::micro::parse("x.toml", &bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("a3-") && e.contains(says), "{says}: {e}");
    }
}
