//! Development probe: fit a parameter list given on the command line and print residuals and
//! leave-one-out errors. `cargo run --release -p dstwin-calibration --example fit_probe -- a,b,c`
use dstwin_calibration::globals::{fit, leave_one_out, param, residuals, Values};
use dstwin_calibration::target::parse_targets;
use dstwin_hwmodels::Catalog;

fn main() {
    let names: Vec<String> = std::env::args()
        .nth(1)
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    let params: Vec<_> = names.iter().map(|n| param(n).expect(n)).collect();
    let targets = parse_targets(
        "targets.toml",
        include_str!("../data/targets.toml"),
    )
    .unwrap();
    let cat = Catalog::builtin();
    let sys = cat.system("cloudmatrix384").unwrap();
    let base = cat.cost_model(sys, None).unwrap();
    let t0 = std::time::Instant::now();
    let shipped = residuals(&targets, "ascend-910c", &Values::of(&params, &base.params)).unwrap();
    println!("shipped:");
    for r in &shipped {
        println!("  {:40} {:10.2} {:10.2} {:+6.1}%", r.id, r.published, r.predicted, r.error * 100.0);
    }
    let f = fit(&targets, "ascend-910c", &params, &base.params).unwrap();
    println!("fit {:?} in {} evals, {:.1}s", f.values, f.evaluated, t0.elapsed().as_secs_f64());
    for r in &f.residuals {
        println!("  {:40} {:10.2} {:10.2} {:+6.1}%", r.id, r.published, r.predicted, r.error * 100.0);
    }
    println!("rms {:.1}%", f.rms_error * 100.0);
    if std::env::var("LOO").is_ok() {
        let held = leave_one_out(&targets, "ascend-910c", &params, &base.params, &["cm384-microbatch"]).unwrap();
        let mut all = Vec::new();
        for h in &held {
            for r in &h.residuals {
                println!("  LOO {:40} {:10.2} {:10.2} {:+6.1}%  {:?}", r.id, r.published, r.predicted, r.error * 100.0, h.values.values);
                all.push(r.error.abs());
            }
        }
        println!("LOO mean abs {:.1}% max {:.1}%  ({:.1}s)", all.iter().sum::<f64>() / all.len() as f64 * 100.0, all.iter().cloned().fold(0.0, f64::max) * 100.0, t0.elapsed().as_secs_f64());
    }
}
