//! `dstwin calibrate`: fits the cost-model parameters to published figures.

use crate::output::outln;
use crate::Failure;
use anyhow::{anyhow, Context};
use clap::Args;
use dstwin_calibration::fit::{fit_concentration, parse_eplb_gap, EXPERT_LOAD};
use dstwin_calibration::globals::{self, param, Param, Residual, Values};
use dstwin_calibration::target::{parse_targets, TARGETS};
use dstwin_calibration::{kernels, micro};

#[derive(Args, Debug)]
#[command(
    after_help = "Step 1 fits each cost model's all-to-all parameters (dispatch/combine base, per-doubling latency, \
bandwidth efficiencies of the low-latency and normal modes) to the built-in dispatch/combine microbenchmarks \
(calibration/data/microbenchmarks.toml), and the MTP acceptance (one probability per draft position, the \
default of a scenario's mtp.acceptance) to the measured acceptance figures in the same file, and the fixed cost \
and efficiency of each of DeepSeek-V4's fused kernels (the cost files' [[kernel]] entries) to their published \
timings there. Step 2 fits the \
parameters a cost file lists in its `fit = [...]` (or those given with --fit) to the steady-step targets of \
every end-to-end anchor on that cost model (calibration/data/targets.toml), by least squares over relative \
errors with each anchor weighing one, and prints the fitted values, the residuals of the fit and of the \
shipped values. Paste the printed lines into the cost file to adopt a new fit. `dstwin validate` shows how the \
fit predicts each anchor it was not fitted to (leave-one-out).\n\nExamples:\n  dstwin calibrate\n      the built-in targets, the Ascend 910C cost model\n  dstwin calibrate --fit op_overhead_us,overlap_efficiency_normal\n      fit another parameter list\n  dstwin calibrate --targets my-cluster-targets.toml --json"
)]
pub struct CalibrateArgs {
    /// Target file (TOML, `[[target]]` tables like calibration/data/targets.toml); default: the
    /// built-in targets of every end-to-end anchor.
    #[arg(long)]
    targets: Option<String>,
    /// Cost model whose parameters are fitted (a name from hwmodels/data/costs).
    #[arg(long, default_value = "ascend-910c")]
    cost_model: String,
    /// Parameters to fit, comma-separated (default: the cost file's `fit` list). Known: the
    /// names `dstwin calibrate --list-params` prints.
    #[arg(long, value_delimiter = ',')]
    fit: Vec<String>,
    /// Print the parameters the fit can set, with their search ranges, and exit.
    #[arg(long)]
    list_params: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn table(title: &str, v: &Values, r: &[Residual]) -> Result<(), Failure> {
    let params: Vec<String> = v
        .names
        .iter()
        .zip(&v.values)
        .map(|(n, v)| format!("{n} = {v:.3}"))
        .collect();
    outln!("{title}: {}", params.join(", "))?;
    outln!(
        "  {:<38} {:>12} {:>12} {:>8}",
        "target",
        "published",
        "predicted",
        "error"
    )?;
    for x in r {
        outln!(
            "  {:<38} {:>12.3} {:>12.3} {:>+7.1}%",
            x.id,
            x.published,
            x.predicted,
            x.error * 100.0
        )?;
    }
    Ok(())
}

/// The parameters to fit: `names`, or the cost file's list.
pub fn fit_params(
    names: &[String],
    shipped: &dstwin_hwmodels::CostParams,
) -> Result<Vec<&'static Param>, Failure> {
    let names = if names.is_empty() {
        &shipped.fit
    } else {
        names
    };
    names
        .iter()
        .map(|n| {
            param(n).ok_or_else(|| {
                Failure::Input(anyhow!(
                    "--fit {n}: unknown parameter (known: {})",
                    globals::PARAMS
                        .iter()
                        .map(|p| p.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
        })
        .collect()
}

/// The shipped cost model named `name`.
pub fn shipped_cost(name: &str) -> Result<dstwin_hwmodels::CostParams, Failure> {
    let cat = dstwin_hwmodels::Catalog::builtin();
    cat.cost_sets()
        .find(|c| c.name == name)
        .cloned()
        .ok_or_else(|| {
            Failure::Input(anyhow!(
                "--cost-model {name}: unknown (known: {})",
                cat.cost_sets()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

pub fn run(a: CalibrateArgs) -> Result<(), Failure> {
    if a.list_params {
        for p in globals::PARAMS {
            outln!("{:<40} [{}, {}]", p.name, p.lo, p.hi)?;
        }
        return Ok(());
    }
    let (file, text) = match &a.targets {
        Some(p) => (
            p.clone(),
            std::fs::read_to_string(p)
                .with_context(|| format!("reading {p}"))
                .map_err(Failure::Input)?,
        ),
        None => ("targets.toml".to_string(), TARGETS.to_string()),
    };
    let shipped_params = shipped_cost(&a.cost_model)?;
    let params = fit_params(&a.fit, &shipped_params)?;
    let bench = micro::builtin().map_err(|e| Failure::Runtime(e.into()))?;
    let a2a = micro::fit(&bench).map_err(|e| Failure::Runtime(e.into()))?;
    let a2a_fit = micro::residuals(&bench, &a2a).map_err(|e| Failure::Runtime(e.into()))?;
    let a2a_shipped = micro::residuals(&bench, &[]).map_err(|e| Failure::Runtime(e.into()))?;
    let shipped_acceptance = dstwin_core::mtp::CALIBRATED_ACCEPTANCE;
    let acceptance = micro::fit_mtp(&bench);
    let mtp_fit = micro::mtp_residuals(&bench, acceptance.unwrap_or(shipped_acceptance));
    let mtp_shipped = micro::mtp_residuals(&bench, shipped_acceptance);
    let run = |e: micro::MicroError| Failure::Runtime(e.into());
    let kernel_fits = kernels::fit(&bench.kernel).map_err(run)?;
    let kernel_fit = kernels::residuals(&bench.kernel, &kernel_fits).map_err(run)?;
    let kernel_shipped = kernels::residuals(&bench.kernel, &[]).map_err(run)?;
    let targets = parse_targets(&file, &text).map_err(|e| Failure::Input(e.into()))?;
    let on: Vec<_> = targets
        .iter()
        .filter(|t| t.base_cost().is_ok_and(|c| c.params.name == a.cost_model))
        .cloned()
        .collect();
    if on.is_empty() {
        return Err(Failure::Input(anyhow!(
            "{file}: no [[target]] runs on cost model {}",
            a.cost_model
        )));
    }
    let shipped = Values::of(&params, &shipped_params);
    let f = globals::fit(&on, &a.cost_model, &params, &shipped_params)
        .map_err(|e| Failure::Input(e.into()))?;
    let shipped_r =
        globals::residuals(&on, &a.cost_model, &shipped).map_err(|e| Failure::Input(e.into()))?;
    // The per-request routing concentration, fitted to the one figure that isolates it, with
    // the fitted parameters (only for the built-in targets, which hold its base deployment).
    let conc = if a.targets.is_none() && a.cost_model == "ascend-910c" {
        let gap = parse_eplb_gap("expert-load.toml", EXPERT_LOAD)
            .map_err(|e| Failure::Input(e.into()))?;
        let base = on
            .iter()
            .find(|t| t.id == gap.base)
            .ok_or_else(|| Failure::Runtime(anyhow!("target {} not found", gap.base)))?
            .base_cost()
            .map_err(|e| Failure::Input(e.into()))?;
        Some(
            fit_concentration(&gap, &on, &f.values.apply(&base))
                .map_err(|e| Failure::Input(e.into()))?,
        )
    } else {
        None
    };
    if a.json {
        let v = serde_json::json!({
            "alltoall": {
                "fit": a2a,
                "residuals_of_fit": a2a_fit,
                "residuals_of_shipped": a2a_shipped,
            },
            "kernels": {
                "fit": kernel_fits,
                "residuals_of_fit": kernel_fit,
                "residuals_of_shipped": kernel_shipped,
            },
            "mtp_acceptance": {
                "fit": acceptance,
                "shipped": shipped_acceptance,
                "residuals_of_fit": mtp_fit,
                "residuals_of_shipped": mtp_shipped,
            },
            "cost_model": a.cost_model,
            "fit": f,
            "shipped": { "values": shipped, "residuals": shipped_r },
            "expert_load_concentration": conc,
        });
        outln!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| Failure::Runtime(e.into()))?
        )?;
        return Ok(());
    }
    let costs = |name: &str, what: &str| format!("hwmodels/data/costs/{name}.toml {what}");
    let a2a_lines: Vec<_> = a2a
        .iter()
        .map(|f| (costs(&f.cost_model, "[alltoall]"), f.toml()))
        .collect();
    print_fit(
        "all-to-all microbenchmarks",
        [20, 22, 10, 10],
        1,
        &a2a_fit,
        &a2a_shipped,
        &a2a_lines,
    )?;
    print_mtp(acceptance, &mtp_fit, &mtp_shipped)?;
    let kernel_lines: Vec<_> = kernel_fits
        .iter()
        .map(|f| {
            let place = costs(&f.cost_model, "(each [[kernel]] keeps its source)");
            (place, f.toml())
        })
        .collect();
    print_fit(
        "V4 kernel microbenchmarks, [[kernel]]",
        [16, 30, 10, 10],
        2,
        &kernel_fit,
        &kernel_shipped,
        &kernel_lines,
    )?;
    outln!(
        "cost model {} ({} targets, {} parameter sets evaluated)",
        a.cost_model,
        on.len(),
        f.evaluated
    )?;
    table("fit", &f.values, &f.residuals)?;
    outln!("  rms error {:.1}%", f.rms_error * 100.0)?;
    outln!()?;
    table("shipped", &shipped, &shipped_r)?;
    outln!()?;
    outln!("# for hwmodels/data/costs/{}.toml", a.cost_model)?;
    for (n, v) in f.values.names.iter().zip(&f.values.values) {
        outln!("{n} = {v:.3}")?;
    }
    if let Some(c) = conc {
        outln!()?;
        outln!(
            "expert-load concentration fitted to {}: {:.2} (default/perfect EPLB throughput {:.3}, published {:.3})",
            c.id, c.concentration, c.predicted_ratio, c.published_ratio
        )?;
        outln!(
            "# for sim/twin/src/expert_load.rs: DEFAULT_CONCENTRATION = {:.1} (shipped {:.1})",
            c.concentration,
            dstwin_twin::expert_load::DEFAULT_CONCENTRATION
        )?;
    }
    Ok(())
}

/// Microbenchmark points under a fit and under the shipped values, side by side: columns of
/// `widths` (benchmark, point, published, fitted and shipped values) and values at `prec`
/// decimals.
fn print_residual_pairs(
    widths: [usize; 4],
    prec: usize,
    of_fit: &[micro::MicroResidual],
    shipped: &[micro::MicroResidual],
) -> Result<(), Failure> {
    let [wb, wp, wu, wv] = widths;
    outln!(
        "  {:<wb$} {:<wp$} {:>wu$} {:>wv$} {:>8} {:>wv$} {:>8}",
        "benchmark",
        "point",
        "published",
        "fit",
        "error",
        "shipped",
        "error"
    )?;
    for (f, s) in of_fit.iter().zip(shipped) {
        outln!(
            "  {:<wb$} {:<wp$} {:>wu$.prec$} {:>wv$.prec$} {:>+7.1}% {:>wv$.prec$} {:>+7.1}%",
            f.id,
            f.metric,
            f.published,
            f.predicted,
            f.error * 100.0,
            s.predicted,
            s.error * 100.0
        )?;
    }
    Ok(())
}

/// Step 1b: the MTP acceptance fit, each point's error under the fit and under the shipped
/// acceptance, and the line for engine/core/src/mtp.rs.
fn print_mtp(
    fit: Option<f64>,
    of_fit: &[micro::MicroResidual],
    shipped: &[micro::MicroResidual],
) -> Result<(), Failure> {
    outln!("MTP acceptance (calibration/data/microbenchmarks.toml, [[mtp]])")?;
    print_residual_pairs([24, 34, 9, 8], 3, of_fit, shipped)?;
    if let Some(a) = fit {
        outln!()?;
        outln!("# for engine/core/src/mtp.rs\nCALIBRATED_ACCEPTANCE = {a:.3}")?;
    }
    outln!()?;
    Ok(())
}

/// Steps 1 and 1c, a microbenchmark fit per cost model (the all-to-all parameters, the V4
/// kernel entries): each point's error under the fit and under the shipped values, and for each
/// cost file the lines to paste (`(where, lines)`).
fn print_fit(
    title: &str,
    widths: [usize; 4],
    prec: usize,
    of_fit: &[micro::MicroResidual],
    shipped: &[micro::MicroResidual],
    paste: &[(String, String)],
) -> Result<(), Failure> {
    outln!("{title} (calibration/data/microbenchmarks.toml)")?;
    print_residual_pairs(widths, prec, of_fit, shipped)?;
    for (place, lines) in paste {
        outln!()?;
        outln!("# for {place}")?;
        outln!("{lines}")?;
    }
    outln!()?;
    Ok(())
}
