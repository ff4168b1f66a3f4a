//! `dstwin calibrate`: fits the cost-model parameters to published figures, or (with `--trace`,
//! src/calibrate_trace_cmd.rs) the cost model to profiler traces.

use crate::output::outln;
use crate::Failure;
use anyhow::{anyhow, Context};
use clap::Args;
use dstwin_calibration::expert_load::{self, LeftOut, LoadFit};
use dstwin_calibration::fit::{fit_concentration, parse_eplb_gap, EXPERT_LOAD};
use dstwin_calibration::globals::{self, param, Param, Residual, Values};
use dstwin_calibration::target::{parse_targets, TARGETS};
use dstwin_calibration::{micro, v4_kernels};
use std::path::PathBuf;

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
fit predicts each anchor it was not fitted to (leave-one-out). Step 3 (built-in targets only) fits the default routed-expert load \
(a log-normal popularity per layer and the per-request routing concentration) jointly to measured DeepSeek-R1 \
expert loads and the CloudMatrix384 EPLB gap (calibration/data/expert-load-measured.toml, expert-load.toml) on the \
shipped cost model, prints every figure's error, each fitted figure's error when left out of the fit, and the \
lines for sim/twin/data/expert-load.toml.\n\nWith --trace, calibrates from profiler traces instead (docs/calibration.md): kernels are mapped onto the op graph's ops and classes by per-backend rules (calibration/data/kernels/*.toml, extended with --rules), the time by class and by op is printed with what could not be mapped, and the cost model is fitted to the mapped kernels: per-class efficiency curves where kernels carry their work, alpha-beta per collective and group size where they carry bytes, host overhead per step from the gaps between device steps. --out writes a cost file with the fits.\n\nExamples:\n  dstwin calibrate\n      the built-in targets, the Ascend 910C cost model\n  dstwin calibrate --fit op_overhead_us,overlap_efficiency_normal\n      fit another parameter list\n  dstwin calibrate --targets my-cluster-targets.toml --json\n  dstwin calibrate --trace prof/ASCEND_PROFILER_OUTPUT --hardware atlas-800-a3 --out my-a3.toml --system-out my-a3-system.toml\n      a torch_npu profile: mapping, fits, and a system file for --hardware\n  dstwin calibrate --trace trace.json --backend cuda --hardware nvidia-h800-8\n      a PyTorch (Kineto) GPU trace\n  dstwin calibrate --trace run2.json --hardware my-a3-system.toml --check\n      how the fitted system prices another run's trace, by class, by op and per step (nothing fitted)"
)]
pub struct CalibrateArgs {
    /// Target file (TOML, `[[target]]` tables like calibration/data/targets.toml); default: the
    /// built-in targets of every end-to-end anchor.
    #[arg(long, conflicts_with = "trace")]
    targets: Option<String>,
    /// Cost model whose parameters are fitted (a name from hwmodels/data/costs).
    #[arg(long, default_value = "ascend-910c", conflicts_with = "trace")]
    cost_model: String,
    /// Parameters to fit, comma-separated (default: the cost file's `fit` list). Known: the
    /// names `dstwin calibrate --list-params` prints.
    #[arg(long, value_delimiter = ',', conflicts_with = "trace")]
    fit: Vec<String>,
    /// Print the parameters the fit can set, with their search ranges, and exit.
    #[arg(long, conflicts_with = "trace")]
    list_params: bool,
    /// Calibrate from profiler traces instead: Kineto / Chrome JSON, torch_npu trace_view.json,
    /// kernel_details.csv, op_summary_*.csv, op_statistic.csv, communication.json, a torch_npu
    /// output directory, or the CPU engine's profile.
    #[arg(long, num_args = 1.., value_name = "TRACE")]
    trace: Vec<PathBuf>,
    /// Backend of the traces: ascend, cuda or cpu (default: detected per trace).
    #[arg(long, requires = "trace")]
    backend: Option<String>,
    /// Your own kernel rules (TOML like calibration/data/kernels/*.toml), tried before the
    /// built-in ones.
    #[arg(long, requires = "trace")]
    rules: Option<PathBuf>,
    /// The system the traces ran on (catalog name or system TOML): its peaks, bandwidth and
    /// fabric price the fits, its cost file is kept where the traces say nothing. Default:
    /// nvidia-h800-8 for CUDA traces, atlas-800-a3 for Ascend ones, none for the CPU engine.
    #[arg(long, requires = "trace")]
    hardware: Option<String>,
    /// Write a cost file with the fits (needs the hardware).
    #[arg(long, requires = "trace")]
    out: Option<PathBuf>,
    /// Also write a system file (the hardware's, using the --out cost file) for --hardware and
    /// scenarios.
    #[arg(long, requires = "out")]
    system_out: Option<PathBuf>,
    /// The format the engine computed in (bf16, fp16, fp32, ...), for traces that do not say:
    /// the CPU engine's GEMM shapes need it to count bytes.
    #[arg(long, requires = "trace")]
    dtype: Option<String>,
    /// The model a CPU engine trace ran (its checkpoint directory or config.json): with it the
    /// engine's attention, expert and elementwise ops get their work from the op graph and are
    /// fitted too (else only its GEMMs are).
    #[arg(long, requires = "trace", value_name = "DIR|config.json")]
    model: Option<PathBuf>,
    /// bench-serve results (--save-result) of the profiled runs, against a server exporting
    /// vllm:time_to_first_token_seconds (dstwin serve, vLLM): the front end's time per request
    /// (the client's mean TTFT less the server's) goes into the cost file as [host] request_us.
    #[arg(long, requires = "trace", num_args = 1.., value_name = "RESULT")]
    bench: Vec<PathBuf>,
    /// What the efficiency fits minimize: `relative` errors, robustly (the typical kernel), or
    /// `total` time (plain least squares over absolute times: the slow tail of a shared
    /// machine counts in full; what a twin predicting means of steps wants).
    #[arg(long, requires = "trace", default_value = "relative")]
    objective: String,
    /// Fit nothing: price the traces' kernels and host time with the --hardware's cost file as it
    /// is, against what they measured, by class, by op and per step. For a cost file fitted on
    /// one run (calibrate --trace --out), checked on another run's trace: where its
    /// predictions miss.
    #[arg(long, requires = "hardware", conflicts_with_all = ["out", "objective"])]
    check: bool,
    /// Gaps between device steps longer than this many times the median are idle time, not
    /// host overhead [default: 5].
    #[arg(long, requires = "trace")]
    idle_factor: Option<f64>,
    /// Rows printed per table of the trace report (all of them in --json).
    #[arg(long, default_value_t = 25)]
    top: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// No progress line on stderr (it is drawn only on a terminal; --trace draws none, it
    /// reads a trace in well under a second).
    #[arg(long, short)]
    quiet: bool,
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

/// The shipped cost model of the EPLB gap's base deployment.
fn shipped_cost_model(
    on: &[dstwin_calibration::target::Target],
) -> Result<dstwin_hwmodels::CostModel, Failure> {
    let gap =
        parse_eplb_gap("expert-load.toml", EXPERT_LOAD).map_err(|e| Failure::Input(e.into()))?;
    gap.base_target(on)
        .map_err(|e| Failure::Runtime(e.into()))?
        .base_cost()
        .map_err(|e| Failure::Input(e.into()))
}

pub fn run(a: CalibrateArgs) -> Result<(), Failure> {
    if !a.trace.is_empty() {
        return crate::calibrate_trace_cmd::run(crate::calibrate_trace_cmd::TraceArgs {
            traces: a.trace,
            backend: a.backend,
            rules: a.rules,
            hardware: a.hardware,
            out: a.out,
            system_out: a.system_out,
            idle_factor: a.idle_factor,
            dtype: a.dtype,
            model: a.model,
            objective: a.objective,
            bench: a.bench,
            check: a.check,
            top: a.top,
            json: a.json,
        });
    }
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
    // The fits take seconds: a line on stderr says which one runs and for how long (cleared
    // when it ends, an error included).
    let bar = crate::progress::bar(None, a.quiet, "{spinner} {msg} {elapsed}");
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar.set_message("fitting the microbenchmarks (all-to-all, MTP acceptance, V4 kernels)");
    let bench = micro::builtin().map_err(|e| Failure::Runtime(e.into()))?;
    let a2a = micro::fit(&bench).map_err(|e| Failure::Runtime(e.into()))?;
    let a2a_fit = micro::residuals(&bench, &a2a).map_err(|e| Failure::Runtime(e.into()))?;
    let a2a_shipped = micro::residuals(&bench, &[]).map_err(|e| Failure::Runtime(e.into()))?;
    let shipped_acceptance = dstwin_twin::mtp::CALIBRATED_ACCEPTANCE;
    let acceptance = micro::fit_mtp(&bench);
    let mtp_fit = micro::mtp_residuals(&bench, acceptance.unwrap_or(shipped_acceptance));
    let mtp_shipped = micro::mtp_residuals(&bench, shipped_acceptance);
    let run = |e: micro::MicroError| Failure::Runtime(e.into());
    let kernel_fits = v4_kernels::fit(&bench.kernel).map_err(run)?;
    let kernel_fit = v4_kernels::residuals(&bench.kernel, &kernel_fits).map_err(run)?;
    let kernel_shipped = v4_kernels::residuals(&bench.kernel, &[]).map_err(run)?;
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
    bar.set_message(format!(
        "fitting {} parameter{} of {} to {} steady-step targets",
        params.len(),
        if params.len() == 1 { "" } else { "s" },
        a.cost_model,
        on.len()
    ));
    let f = globals::fit(&on, &a.cost_model, &params, &shipped_params)
        .map_err(|e| Failure::Input(e.into()))?;
    let shipped_r =
        globals::residuals(&on, &a.cost_model, &shipped).map_err(|e| Failure::Input(e.into()))?;
    let builtin_910c = a.targets.is_none() && a.cost_model == "ascend-910c";
    // The default expert load, fitted jointly to the measured loads and the EPLB gap on the
    // shipped cost model (the one the simulator prices with); only for the built-in targets,
    // which hold the gap's base deployment.
    let load = if builtin_910c {
        bar.set_message("fitting the expert load, then leaving out each measurement");
        let p = expert_load::builtin(&on, shipped_cost_model(&on)?)
            .map_err(|e| Failure::Runtime(e.into()))?;
        let f = p.fit().map_err(|e| Failure::Runtime(e.into()))?;
        let loo = p
            .leave_one_out(&f)
            .map_err(|e| Failure::Runtime(e.into()))?;
        Some((f, loo))
    } else {
        None
    };
    // The `zipf` kind's per-request routing concentration, fitted to the one figure that
    // isolates it, with the fitted parameters.
    let conc = if builtin_910c {
        bar.set_message("fitting the per-request routing concentration");
        let gap = parse_eplb_gap("expert-load.toml", EXPERT_LOAD)
            .map_err(|e| Failure::Input(e.into()))?;
        let base = shipped_cost_model(&on)?;
        Some(
            fit_concentration(&gap, &on, &f.values.apply(&base))
                .map_err(|e| Failure::Input(e.into()))?,
        )
    } else {
        None
    };
    bar.finish_and_clear();
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
            "expert_load": load.as_ref().map(|(f, loo)| serde_json::json!({
                "fit": f,
                "shipped": dstwin_twin::expert_load::fitted(),
                "leave_one_out": loo,
            })),
            "zipf_concentration": conc,
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
    if let Some((f, loo)) = &load {
        outln!()?;
        print_expert_load(f, loo)?;
    }
    if let Some(c) = conc {
        outln!()?;
        outln!(
            "zipf(0.5) concentration fitted to {} alone: {:.2} (default/perfect EPLB throughput {:.3}, published {:.3})",
            c.id, c.concentration, c.predicted_ratio, c.published_ratio
        )?;
        outln!(
            "# for sim/twin/src/expert_load/mod.rs: DEFAULT_CONCENTRATION = {:.1} (shipped {:.1})",
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

/// Step 3: the default expert load's joint fit, every figure's error (fitted and checked), each
/// fitted figure's error when left out of the fit, and the lines for the data file.
fn print_expert_load(f: &LoadFit, loo: &[LeftOut]) -> Result<(), Failure> {
    let p = f.params;
    let fitted = f.residuals.iter().filter(|r| r.fitted).count();
    outln!("expert load, the fitted default (calibration/data/expert-load-measured.toml, expert-load.toml)")?;
    outln!(
        "  sigma {:.4}, sigma_spread {:.4}, concentration {:.2}: rms error {:.1}% over {fitted} fitted figures ({} evaluations)",
        p.sigma,
        p.sigma_spread,
        p.concentration,
        f.rms_error * 100.0,
        f.evaluations
    )?;
    outln!(
        "  {:<50} {:>10} {:>10} {:>8}  {:<7} {:>9}",
        "figure",
        "published",
        "predicted",
        "error",
        "role",
        "left out"
    )?;
    for r in &f.residuals {
        let left = loo
            .iter()
            .find(|l| l.id == r.id)
            .map_or(String::new(), |l| format!("{:+.1}%", l.error * 100.0));
        outln!(
            "  {:<50} {:>10.4} {:>10.4} {:>+7.1}%  {:<7} {:>9}",
            r.id,
            r.published,
            r.predicted,
            r.error * 100.0,
            if r.fitted { "fit" } else { "check" },
            left
        )?;
    }
    let s = dstwin_twin::expert_load::fitted();
    outln!(
        "  shipped: sigma {}, sigma_spread {}, concentration {}",
        s.sigma,
        s.sigma_spread,
        s.concentration
    )?;
    outln!()?;
    outln!("# for sim/twin/data/expert-load.toml")?;
    outln!(
        "sigma = {:.4}\nsigma_spread = {:.4}\nconcentration = {:.2}",
        p.sigma,
        p.sigma_spread,
        p.concentration
    )?;
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
