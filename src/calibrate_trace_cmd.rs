//! `dstwin calibrate --trace`: profiler traces mapped onto the op graph, the cost model fitted
//! to the mapped kernels, and optionally a cost file (and a system file using it) written.

use crate::output::{check_file, outln};
use crate::Failure;
use anyhow::{anyhow, Context};
use dstwin_calibration::kernels::{Backend, RuleSet, Share};
use dstwin_calibration::tracefit::costfile::{cost_file, system_file};
use dstwin_calibration::tracefit::efficiency::Objective;
use dstwin_calibration::tracefit::host::HostFit;
use dstwin_calibration::tracefit::spread::StepSpread;
use dstwin_calibration::tracefit::work::EngineModel;
use dstwin_calibration::tracefit::{
    calibrate, check, FrontEnd, OpCheck, TraceCalibration, TraceCheck, TraceOptions,
    DEFAULT_IDLE_FACTOR,
};
use dstwin_core::model::{ModelConfig, Quant};
use dstwin_hwmodels::cost::MAX_STEP_SIGMA;
use dstwin_hwmodels::{Catalog, CostModel, DType};
use std::path::{Path, PathBuf};

/// What the trace mode of `calibrate` was given.
pub struct TraceArgs {
    pub traces: Vec<PathBuf>,
    pub backend: Option<String>,
    pub rules: Option<PathBuf>,
    pub hardware: Option<String>,
    pub out: Option<PathBuf>,
    pub system_out: Option<PathBuf>,
    pub idle_factor: Option<f64>,
    pub dtype: Option<String>,
    pub model: Option<PathBuf>,
    pub objective: String,
    pub bench: Vec<PathBuf>,
    /// Price with the hardware's cost file as it is instead of fitting.
    pub check: bool,
    pub top: usize,
    pub json: bool,
}

/// The system a backend's traces usually come from, when `--hardware` is not given.
fn default_hardware(b: Backend) -> Option<&'static str> {
    match b {
        Backend::Cuda => Some("nvidia-h800-8"),
        Backend::Ascend => Some("atlas-800-a3"),
        Backend::Cpu => None,
    }
}

pub fn run(a: TraceArgs) -> Result<(), Failure> {
    let input = |e: anyhow::Error| Failure::Input(e);
    let backend = match &a.backend {
        None => None,
        Some(b) => Some(Backend::parse(b).ok_or_else(|| {
            input(anyhow!(
                "--backend {b}: must be one of {}",
                Backend::ALL.map(Backend::name).join(", ")
            ))
        })?),
    };
    let idle_factor = a.idle_factor.unwrap_or(DEFAULT_IDLE_FACTOR);
    if !(idle_factor.is_finite() && idle_factor > 1.0) {
        return Err(input(anyhow!(
            "--idle-factor {idle_factor}: must be a number above 1 (gaps this many times the median are idle)"
        )));
    }
    let dtype = match &a.dtype {
        None => None,
        Some(d) => Some(
            d.parse::<DType>()
                .map_err(|e| input(anyhow!("--dtype {d}: {e}")))?,
        ),
    };
    let objective = Objective::parse(&a.objective).ok_or_else(|| {
        input(anyhow!(
            "--objective {}: must be one of {}",
            a.objective,
            Objective::ALL.map(Objective::name).join(", ")
        ))
    })?;
    let model = match &a.model {
        None => None,
        Some(p) => Some(engine_model(p).map_err(input)?),
    };
    if a.system_out.is_some() && a.out.is_none() {
        return Err(input(anyhow!(
            "--system-out needs --out (the cost file it uses)"
        )));
    }
    let rules = match &a.rules {
        None => RuleSet::default(),
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("--rules {}", p.display()))
                .map_err(input)?;
            RuleSet::parse(&p.display().to_string(), &text).map_err(|e| input(e.into()))?
        }
    };
    for p in [&a.out, &a.system_out].into_iter().flatten() {
        check_file(p, "output")?;
    }
    let profiles = dstwin_traces::profile::read_paths(&a.traces).map_err(|e| input(e.into()))?;
    check_step_counts(&profiles)?;
    let first = profiles
        .first()
        .ok_or_else(|| input(anyhow!("--trace: give at least one trace")))?;
    let detected = backend.unwrap_or_else(|| dstwin_calibration::kernels::detect_backend(first));
    let cat = Catalog::builtin();
    let hardware = a
        .hardware
        .clone()
        .or(default_hardware(detected).map(str::to_owned));
    let cost: Option<(CostModel, String)> = match &hardware {
        None => None,
        Some(h) => {
            let system = cat.resolve_system(h).map_err(|e| input(e.into()))?;
            let cm = cat
                .cost_model(&system, Path::new(h).parent())
                .map_err(|e| input(e.into()))?;
            Some((cm, h.clone()))
        }
    };
    if a.out.is_some() && cost.is_none() {
        return Err(input(anyhow!(
            "--out needs --hardware: the system the traces ran on (its cost file is the base of the new one)"
        )));
    }
    let opts = TraceOptions {
        backend,
        rules,
        cost: cost.as_ref().map(|c| c.0.clone()),
        idle_factor,
        dtype,
        model,
        objective,
    };
    if a.check {
        if !a.bench.is_empty() {
            return Err(input(anyhow!(
                "--bench with --check: the front end is fitted, not checked (compare the client's TTFT with simulate instead)"
            )));
        }
        let ck = check(&profiles, &opts)
            .ok_or_else(|| input(anyhow!("--check needs --hardware: the cost file to check")))?;
        if ck.mapping.kernels == 0 {
            return Err(no_kernels(&a.traces));
        }
        if a.json {
            let v = serde_json::json!({ "check": ck });
            outln!(
                "{}",
                serde_json::to_string_pretty(&v).map_err(|e| Failure::Runtime(e.into()))?
            )?;
            return Ok(());
        }
        return print_check(&ck, a.top);
    }
    let mut cal = calibrate(&profiles, &opts);
    if !a.bench.is_empty() {
        let mut results = Vec::new();
        for p in &a.bench {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("--bench {}", p.display()))
                .map_err(input)?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("--bench {}: not a bench-serve result", p.display()))
                .map_err(input)?;
            results.push((p.display().to_string(), v));
        }
        cal.frontend =
            Some(FrontEnd::from_bench(&results).map_err(|e| input(anyhow!("--bench {e}")))?);
    }
    if cal.mapping.kernels == 0 {
        return Err(no_kernels(&a.traces));
    }
    let written = match (&a.out, &cost) {
        (Some(out), Some((cm, _))) => Some(write_files(out, a.system_out.as_deref(), cm, &cal)?),
        _ => None,
    };
    if a.json {
        let v = serde_json::json!({ "calibration": cal, "written": written });
        outln!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| Failure::Runtime(e.into()))?
        )?;
        return Ok(());
    }
    print(&cal, a.top, hardware.as_deref(), a.hardware.is_none())?;
    if let Some(w) = written {
        outln!()?;
        for line in w {
            outln!("{line}")?;
        }
    }
    Ok(())
}

fn no_kernels(traces: &[PathBuf]) -> Failure {
    Failure::Input(anyhow!(
        "{}: no device kernels found (is this a device trace? docs/calibration.md lists the formats)",
        traces
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// The model of `--model`: a checkpoint directory or its config.json. The op graph prices it
/// in its unquantized formats (bf16; the CPU engine computes in f32 or bf16).
fn engine_model(p: &Path) -> anyhow::Result<EngineModel> {
    let file = if p.is_dir() {
        p.join("config.json")
    } else {
        p.to_path_buf()
    };
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("--model {}", file.display()))?;
    let config = ModelConfig::from_hf_json(&file.display().to_string(), &text)
        .with_context(|| format!("--model {}", file.display()))?;
    Ok(EngineModel {
        config,
        quant: Quant::Bf16,
    })
}

/// Refuses a step marker claiming more sequences or tokens than one rank's step can hold (the
/// limits scenarios have): fitted per sequence, such a step makes the host fit absurd (a
/// claimed 2^63 sequences fitted `per_seq_us = -3.6e-18`, which the cost file then refused).
fn check_step_counts(profiles: &[dstwin_traces::profile::Profile]) -> Result<(), Failure> {
    use dstwin_core::batch::{MAX_SEQS_PER_STEP, MAX_TOKENS_PER_STEP};
    for p in profiles {
        for s in &p.steps {
            for (field, n, max) in [
                ("seqs", s.seqs, MAX_SEQS_PER_STEP),
                ("tokens", s.tokens, MAX_TOKENS_PER_STEP),
            ] {
                if let Some(n) = n.filter(|n| *n > max) {
                    return Err(Failure::Input(anyhow!(
                        "{} line {}: step {} claims {field} = {n}; one rank's step holds at most \
                         {max}",
                        p.origin,
                        s.line,
                        s.step
                    )));
                }
            }
        }
    }
    Ok(())
}

/// Writes the cost file (and the system file using it); the lines saying what was written.
fn write_files(
    out: &Path,
    system_out: Option<&Path>,
    cm: &CostModel,
    cal: &TraceCalibration,
) -> Result<Vec<String>, Failure> {
    let stem = out.file_stem().map_or_else(
        || "calibrated".to_owned(),
        |s| s.to_string_lossy().into_owned(),
    );
    let text = cost_file(&cm.params, &stem, cal).map_err(|e| Failure::Runtime(e.into()))?;
    // Checked as --hardware will read it: a file the project would refuse is not written.
    Catalog::builtin()
        .cost_params_from_str(&out.display().to_string(), &text)
        .map_err(|e| {
            Failure::Runtime(anyhow!(
                "the fitted cost file would not load, so it was not written: {e}"
            ))
        })?;
    crate::output::write_file(out, text.as_bytes())?;
    let mut lines = vec![format!("cost file written to {}", out.display())];
    if let Some(sys) = system_out {
        let name = sys.file_stem().map_or_else(
            || "calibrated".to_owned(),
            |s| s.to_string_lossy().into_owned(),
        );
        let text = system_file(&cm.system, &name, &relative_to(out, sys))
            .map_err(|e| Failure::Runtime(e.into()))?;
        crate::output::write_file(sys, text.as_bytes())?;
        lines.push(format!(
            "system file written to {} (use it: --hardware {} or hardware = {:?} in a scenario)",
            sys.display(),
            sys.display(),
            sys.display().to_string()
        ));
    } else {
        lines.push(format!(
            "use it from a system file: cost_model = {:?} (or write one with --system-out)",
            out.display().to_string()
        ));
    }
    Ok(lines)
}

/// `target` as a path relative to the directory of `from` when both share it, else as given.
fn relative_to(target: &Path, from: &Path) -> String {
    let dir = from.parent().unwrap_or(Path::new(""));
    target
        .strip_prefix(dir)
        .unwrap_or(target)
        .display()
        .to_string()
}

fn truncate(name: &str, width: usize) -> String {
    match name.char_indices().nth(width) {
        Some((cut, _)) => format!("{}...", &name[..cut]),
        None => name.to_owned(),
    }
}

fn table(title: &str, rows: &[Share], top: usize, width: usize) -> Result<(), Failure> {
    if rows.is_empty() {
        return Ok(());
    }
    outln!("{title}")?;
    outln!(
        "  {:<width$} {:>9} {:>11} {:>7}",
        "",
        "kernels",
        "time ms",
        "share"
    )?;
    for r in rows.iter().take(top) {
        outln!(
            "  {:<width$} {:>9} {:>11.3} {:>6.1}%",
            truncate(&r.name, width),
            r.kernels,
            r.time_ms,
            r.share * 100.0
        )?;
    }
    if rows.len() > top {
        let rest = &rows[top..];
        outln!(
            "  ... {} more: {} kernels, {:.3} ms, {:.1}% (all of them in --json)",
            rest.len(),
            rest.iter().map(|r| r.kernels).sum::<u64>(),
            rest.iter().map(|r| r.time_ms).sum::<f64>(),
            rest.iter().map(|r| r.share).sum::<f64>() * 100.0
        )?;
    }
    Ok(())
}

fn print(
    cal: &TraceCalibration,
    top: usize,
    hardware: Option<&str>,
    defaulted: bool,
) -> Result<(), Failure> {
    for t in &cal.traces {
        outln!("trace {}", t.line())?;
        if !t.notes.is_empty() {
            let notes: Vec<String> = t.notes.iter().map(|(k, v)| format!("{k} = {v}")).collect();
            outln!("  says: {}", notes.join("; "))?;
        }
        if !t.skipped.is_empty() {
            let skipped: Vec<String> = t.skipped.iter().map(|(k, v)| format!("{k} {v}")).collect();
            outln!("  not device kernels (left out): {}", skipped.join(", "))?;
        }
    }
    for (backend, source) in &cal.rules {
        outln!("rules ({backend}): {source}")?;
    }
    let m = &cal.mapping;
    outln!()?;
    outln!(
        "{} kernels, {:.3} ms of kernel time (streams overlap: summed device work, not wall time)",
        m.kernels,
        m.time_ms
    )?;
    outln!(
        "  mapped onto the op graph {:.1}%, outside it {:.1}%, unmapped {:.1}%",
        m.mapped_share * 100.0,
        m.outside_share * 100.0,
        m.unmapped_share * 100.0
    )?;
    outln!()?;
    table("by class", &m.by_class, top, 40)?;
    table("by op", &m.by_op, top, 40)?;
    table(
        "outside the op graph (recognized, not an op of inference)",
        &m.outside,
        top,
        56,
    )?;
    table(
        "unmapped (no rule matched), largest first",
        &m.unmapped,
        top,
        96,
    )?;
    outln!()?;
    match hardware {
        None => outln!(
            "efficiency and collective fits: give --hardware (the system the traces ran on)"
        )?,
        Some(h) => {
            let how = if defaulted {
                " (default for this backend; --hardware to change)"
            } else {
                ""
            };
            outln!("efficiency per op class on {h}{how}")?;
            outln!(
                "  {:<13} {:>8} {:>9} {:>8} {:>8} {:>9} {:>9} {:>8} {:>8}",
                "class",
                "kernels",
                "with work",
                "compute",
                "memory",
                "rows_pad",
                "fixed_us",
                "rms",
                "max"
            )?;
            for r in &cal.efficiency {
                match &r.fit {
                    Some(f) => {
                        let d = &f.determined;
                        let mark = |det: bool| if det { "" } else { "*" };
                        outln!(
                            "  {:<13} {:>8} {:>9} {:>7.3}{} {:>7.3}{} {:>8.1}{} {:>8.2}{} {:>7.1}% {:>7.1}%",
                            r.class.name(),
                            r.kernels,
                            r.with_work,
                            f.params.compute,
                            mark(d.compute),
                            f.params.memory,
                            mark(d.memory),
                            f.params.rows_pad,
                            mark(d.rows_pad),
                            f.params.fixed_us,
                            mark(d.fixed_us),
                            f.rms_error * 100.0,
                            f.max_error * 100.0
                        )?;
                        if let (Some(o), Some((split, joint))) = (&r.one_row, r.rms_error_split) {
                            let d = &o.determined;
                            outln!(
                                "    one row    {:>8} {:>9} {:>7.3}{} {:>7.3}{} {:>9} {:>8.2}{} {:>7.1}% {:>7.1}%   (all: rms {:.1}%, {:.1}% as one form)",
                                o.samples,
                                o.samples,
                                o.params.compute,
                                mark(d.compute),
                                o.params.memory,
                                mark(d.memory),
                                "",
                                o.params.fixed_us,
                                mark(d.fixed_us),
                                o.rms_error * 100.0,
                                o.max_error * 100.0,
                                split * 100.0,
                                joint * 100.0
                            )?;
                        }
                    }
                    None => outln!(
                        "  {:<13} {:>8} {:>9}   not fitted: no kernel with known work (FLOPs, bytes)",
                        r.class.name(),
                        r.kernels,
                        r.with_work
                    )?,
                }
            }
            if cal.efficiency.iter().any(|r| r.fit.is_some()) {
                outln!("  * not determined by these kernels: the shipped value")?;
            }
            if !cal.op_residuals.is_empty() {
                outln!()?;
                outln!("fitted against measured, by op (the twin prices an op with its class's form, or with its own where the class's misses it: [[kernel]] in the cost file)")?;
                outln!(
                    "  {:<24} {:<17} {:>8} {:>8} {:>11} {:>11} {:>8} {:>12}",
                    "op",
                    "class",
                    "kernels",
                    "one row",
                    "measured ms",
                    "fitted ms",
                    "error",
                    "class's form"
                )?;
                for r in cal.op_residuals.iter().take(top) {
                    outln!(
                        "  {:<24} {:<17} {:>8} {:>8} {:>11.3} {:>11.3} {:>+7.1}% {:>12}",
                        r.op,
                        r.class.name(),
                        r.kernels,
                        r.one_row,
                        r.measured_ms,
                        r.fitted_ms,
                        r.error() * 100.0,
                        if r.own {
                            format!("{:+.1}%", r.class_error() * 100.0)
                        } else {
                            "(used)".to_owned()
                        }
                    )?;
                }
                let more = cal.op_residuals.len().saturating_sub(top);
                if more > 0 {
                    outln!("  ... {more} more (--top, --json)")?;
                }
            }
        }
    }
    outln!()?;
    if cal.alpha_beta.is_empty() {
        outln!("collectives: no collective kernel carries its bytes; no alpha-beta fit")?;
    } else {
        outln!("collectives: time = alpha + bytes / beta")?;
        for x in &cal.alpha_beta {
            match (x.alpha_us, x.rms_error) {
                (Some(alpha), Some(rms)) => outln!(
                    "  {:<15} {:<24} alpha {:>8.2} us, beta {:>10}, {} kernels at {} sizes, rms error {:.1}%",
                    x.kind.name(),
                    x.group.to_string(),
                    alpha,
                    x.beta_gb_s
                        .map_or_else(|| "unbounded".to_owned(), |b| format!("{b:.1} GB/s")),
                    x.samples,
                    x.sizes,
                    rms * 100.0
                )?,
                _ => outln!(
                    "  {:<15} {:<24} not fitted: one message size ({} kernels, mean {:.2} us)",
                    x.kind.name(),
                    x.group.to_string(),
                    x.samples,
                    x.mean_time_us
                )?,
            }
        }
        if let Some(c) = &cal.collective {
            outln!(
                "  [collective] base_us = {:.2}, bw_eff = {:.3} over {} ring collectives, rms error {:.1}%",
                c.base_us,
                c.bw_eff,
                c.samples,
                c.rms_error * 100.0
            )?;
        }
    }
    outln!()?;
    let host_line = |origin: &str, f: &HostFit| {
        format!(
            "host overhead per step ({}): step_us = {:.1}{}, from {} gaps between {} device steps ({:?}) and the time inside them no kernel covers (mean {:.1} us), {} idle gaps left out, rms {:.1} us",
            origin,
            f.step_us,
            f.per_seq_us
                .map_or_else(String::new, |p| format!(", per_seq_us = {p:.2}"))
                + &f.per_token_us
                    .map_or_else(String::new, |p| format!(", per_token_us = {p:.3}")),
            f.gaps,
            f.steps,
            f.source,
            f.in_step_us,
            f.idle_gaps,
            f.rms_us
        )
    };
    for h in &cal.host {
        match &h.fit {
            Some(f) => outln!("{}", host_line(&h.origin, f))?,
            None => outln!(
                "host overhead per step ({}): not fitted: the trace marks fewer than two device steps",
                h.origin
            )?,
        }
    }
    if let Some(f) = &cal.host_pooled {
        outln!(
            "{} (the cost file's)",
            host_line(
                &format!(
                    "all {} traces together",
                    cal.host.iter().filter(|h| h.fit.is_some()).count()
                ),
                f
            )
        )?;
    }
    match &cal.cold {
        Some(c) => outln!(
            "steps after idling (more than {:.1} us after the previous one): {} steps, {} kernels took {:.3} ms against {:.3} ms under the forms fitted to the other steps: cold_factor = {:.3}",
            c.after_us,
            c.steps,
            c.kernels,
            c.measured_ms,
            c.warm_ms,
            c.factor
        )?,
        None if cal.host.iter().any(|h| h.fit.is_some()) => outln!(
            "steps after idling: fewer than {} such steps or {} of their kernels with known work: fitted with the others",
            dstwin_calibration::tracefit::MIN_COLD_STEPS,
            dstwin_calibration::tracefit::MIN_COLD_KERNELS
        )?,
        None => {}
    }
    match &cal.spread {
        Some(sp) => outln!(
            "step time around its price: over {} warm steps in {} groups of alike steps, ln(measured / priced) less its group's median has deciles {:+.3} and {:+.3}: step_sigma = {:.3}{}",
            sp.steps,
            sp.bias.len(),
            sp.q10,
            sp.q90,
            sp.sigma,
            if sp.sigma > MAX_STEP_SIGMA {
                format!(" (above {MAX_STEP_SIGMA}, the most a cost file takes: not written)")
            } else {
                String::new()
            }
        )
        .and_then(|_| print_bias(sp))?,
        None if cal.host.iter().any(|h| h.fit.is_some()) => outln!(
            "step time around its price: fewer than {} warm steps with {:.0}% of their kernel time priced: no step_sigma",
            dstwin_calibration::tracefit::spread::MIN_STEPS,
            dstwin_calibration::tracefit::spread::MIN_COVERAGE * 100.0
        )?,
        None => {}
    }
    if let Some(fe) = &cal.frontend {
        outln!(
            "front end per request: request_us = {:.1}, the client's mean TTFT less the server's over {} requests ({})",
            fe.request_us,
            fe.requests,
            fe.origins.join(", ")
        )?;
    }
    Ok(())
}

/// The price's bias by the shape of the step: the groups of alike steps the spread was told
/// within.
fn print_bias(sp: &StepSpread) -> Result<(), Failure> {
    outln!(
        "  {:<16} {:>22} {:>7} {:>16}",
        "steps",
        "priced per step, us",
        "count",
        "measured/priced"
    )?;
    for b in &sp.bias {
        let kind = match b.decode_only {
            Some(true) => "decodes only",
            Some(false) => "with a prompt",
            None => "(not said)",
        };
        outln!(
            "  {:<16} {:>10.0} .. {:<9.0} {:>7} {:>15.2}x",
            kind,
            b.priced_us.0,
            b.priced_us.1,
            b.steps,
            b.median.exp()
        )?;
    }
    Ok(())
}

/// The report of `--check`: kernels and host time priced by the cost file as it is.
fn print_check(ck: &TraceCheck, top: usize) -> Result<(), Failure> {
    for t in &ck.traces {
        outln!("trace {}", t.line())?;
    }
    let m = &ck.mapping;
    outln!(
        "  mapped onto the op graph {:.1}%, outside it {:.1}%, unmapped {:.1}% of {:.3} ms of kernel time",
        m.mapped_share * 100.0,
        m.outside_share * 100.0,
        m.unmapped_share * 100.0,
        m.time_ms
    )?;
    outln!()?;
    let rows = |title: &str, v: &[OpCheck], first: &str| -> Result<(), Failure> {
        outln!("{title}")?;
        outln!(
            "  {:<24} {:<17} {:>8} {:>11} {:>11} {:>8} {:>11}",
            first,
            "class",
            "kernels",
            "measured ms",
            "priced ms",
            "error",
            "rms/kernel"
        )?;
        for r in v.iter().take(top) {
            outln!(
                "  {:<24} {:<17} {:>8} {:>11.3} {:>11.3} {:>+7.1}% {:>10.1}%{}",
                r.op,
                r.class.name(),
                r.kernels,
                r.measured_ms,
                r.priced_ms,
                r.error() * 100.0,
                r.rms_error * 100.0,
                if r.own {
                    "  (own [[kernel]] entry)"
                } else {
                    ""
                }
            )?;
        }
        let more = v.len().saturating_sub(top);
        if more > 0 {
            outln!("  ... {more} more (--top, --json)")?;
        }
        Ok(())
    };
    rows(
        &format!(
            "priced by {}'s cost file as it is, against measured: kernels with known work, by class",
            ck.hardware
        ),
        &ck.classes,
        "class",
    )?;
    outln!()?;
    rows("by op", &ck.ops, "op")?;
    let (km, kp) = ck
        .classes
        .iter()
        .fold((0.0, 0.0), |(m, p), r| (m + r.measured_ms, p + r.priced_ms));
    outln!()?;
    match ck.host_terms {
        None => outln!("host time: the cost file has no [host] terms to check")?,
        Some((s, q, t)) => {
            outln!(
                "host time per step, priced by [host] step_us = {s:.1}, per_seq_us = {q:.2}, per_token_us = {t:.3}"
            )?;
            let (mut hm, mut hp) = (0.0, 0.0);
            for h in &ck.host {
                match &h.check {
                    Some(c) => {
                        outln!(
                            "  {}: {} steps ({} idle gaps left out): measured {:.3} ms, priced {:.3} ms ({:+.1}%), rms {:.1} us per step",
                            h.origin,
                            c.gaps,
                            c.idle_gaps,
                            c.measured_ms,
                            c.priced_ms,
                            (c.priced_ms / c.measured_ms - 1.0) * 100.0,
                            c.rms_us
                        )?;
                        hm += c.measured_ms;
                        hp += c.priced_ms;
                    }
                    None => outln!(
                        "  {}: fewer than two device steps marked: not checked",
                        h.origin
                    )?,
                }
            }
            if let Some(c) = ck.cold.as_ref().filter(|c| c.kernels == 0) {
                outln!(
                    "steps after idling (more than {:.1} us after the previous one): none with kernels of known work in these traces",
                    c.after_us
                )?;
            }
            if let Some(c) = ck.cold.as_ref().filter(|c| c.kernels > 0) {
                outln!(
                    "steps after idling (more than {:.1} us after the previous one; priced at cold_factor = {:.3} times the forms): {} steps, {} kernels: measured {:.3} ms, warm price {:.3} ms, cold price {:.3} ms ({:+.1}%)",
                    c.after_us,
                    c.factor,
                    c.steps,
                    c.kernels,
                    c.measured_ms,
                    c.warm_ms,
                    c.warm_ms * c.factor,
                    (c.warm_ms * c.factor / c.measured_ms - 1.0) * 100.0
                )?;
            }
            if let Some(sp) = &ck.spread {
                outln!(
                    "step time around its price: over {} steps in {} groups of alike steps, ln(measured / priced) less its group's median has deciles {:+.3} and {:+.3}, a spread of {:.3} against the file's step_sigma = {:.3}",
                    sp.steps, sp.bias.len(), sp.q10, sp.q90, sp.sigma, ck.file_step_sigma
                )?;
                print_bias(sp)?;
            }
            let (tm, tp) = (km + hm, kp + hp);
            if tm > 0.0 {
                outln!(
                    "kernels and host time together: measured {tm:.3} ms, priced {tp:.3} ms ({:+.1}%)",
                    (tp / tm - 1.0) * 100.0
                )?;
            }
        }
    }
    Ok(())
}
