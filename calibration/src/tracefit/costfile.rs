//! A cost file from a trace calibration: the hardware's shipped cost file with what the traces
//! determined replaced, each replaced value's `source` naming the traces and the fit's
//! residuals, and a comment header with the mapping shares, the alpha-beta fits and what could
//! not be fitted.
//!
//! The per-class form is the cost model's `[efficiency.<class>] compute, memory, rows_pad,
//! fixed_us, source` and `[host] step_us, per_seq_us, per_token_us, cold_after_us, cold_factor,
//! source`; an op fitted apart
//! from its class is a `[[kernel]]` entry (`ops = [op]`, `bound`, `efficiency`, `fixed_us`,
//! `source`) replacing whatever entry the base file gave it. Values the model applies to every
//! class are folded into the classes so that the file prices exactly what was fitted: the
//! in-situ factor multiplies each class's and kernel entry's efficiencies (and is then 1), the per-op launch
//! overhead becomes each class's `fixed_us` where the class has none (and is then 0).

use super::{ClassReport, TraceCalibration};
use dstwin_hwmodels::cost::MAX_STEP_SIGMA;
use dstwin_hwmodels::{CostParams, System};
use std::fmt::Write as _;
use toml::{Table, Value};

/// Rounds to 4 significant digits, for a readable file.
fn sig(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let p = 10f64.powi(3 - x.abs().log10().floor() as i32);
    (x * p).round() / p
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// The traces, for sources: `a.json, b.csv`.
fn origins(cal: &TraceCalibration) -> String {
    cal.traces
        .iter()
        .map(|t| t.origin.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn class_source(r: &ClassReport, traces: &str, base: &str) -> Option<String> {
    let f = r.fit.as_ref()?;
    let d = &f.determined;
    let kept: Vec<&str> = [
        ("compute", d.compute),
        ("memory", d.memory),
        ("rows_pad", d.rows_pad),
        ("fixed_us", d.fixed_us),
    ]
    .iter()
    .filter(|(_, det)| !det)
    .map(|(n, _)| *n)
    .collect();
    let mut s = format!(
        "fit by dstwin calibrate --trace to {} kernels of {traces} ({} compute-bound, {} memory-bound): rms error {}, max {}, {} outliers",
        f.samples,
        f.compute_bound,
        f.memory_bound,
        pct(f.rms_error),
        pct(f.max_error),
        f.outliers
    );
    if !kept.is_empty() {
        let _ = write!(
            s,
            "; {} not determined by these kernels, kept from {base}",
            kept.join(", ")
        );
    }
    if let (Some(o), Some((split, joint))) = (&r.one_row, r.rms_error_split) {
        let _ = write!(
            s,
            "; one_row: {} one-row kernels fitted apart (rms error {}, max {}), the others above; over all the class's kernels rms {} against {} as one form",
            o.samples,
            pct(o.rms_error),
            pct(o.max_error),
            pct(split),
            pct(joint)
        );
    }
    Some(s)
}

/// The cost file text: `base` with the fits of `cal` applied, named `name`.
pub fn cost_file(
    base: &CostParams,
    name: &str,
    cal: &TraceCalibration,
) -> Result<String, toml::ser::Error> {
    let traces = origins(cal);
    let mut t: Table = Table::try_from(base)?;
    t.insert("name".into(), Value::String(name.to_owned()));
    t.insert(
        "source".into(),
        Value::String(format!(
            "{} calibrated from profiler traces ({traces}) by dstwin calibrate --trace; every fitted value's source says so, the others are {}'s",
            base.name, base.name
        )),
    );
    // Fold the global factors into the classes.
    let in_situ = t.get("in_situ_efficiency").and_then(Value::as_float);
    let overhead = t.get("op_overhead_us").and_then(Value::as_float);
    if let Some(Value::Table(eff)) = t.get_mut("efficiency") {
        for (_, e) in eff.iter_mut() {
            let Value::Table(e) = e else { continue };
            if let Some(k) = in_situ.filter(|k| *k != 1.0) {
                for field in ["compute", "memory", "int4_memory"] {
                    if let Some(v) = e.get(field).and_then(Value::as_float) {
                        e.insert(field.into(), Value::Float(sig(v * k)));
                    }
                    if let Some(Value::Table(o)) = e.get_mut("one_row") {
                        if let Some(v) = o.get(field).and_then(Value::as_float) {
                            o.insert(field.into(), Value::Float(sig(v * k)));
                        }
                    }
                }
                if let Some(Value::String(src)) = e.get_mut("source") {
                    src.push_str(&format!(" (times in_situ_efficiency {k}, folded in)"));
                }
            }
            e.entry("rows_pad").or_insert(Value::Float(0.0));
            e.entry("fixed_us")
                .or_insert(Value::Float(overhead.unwrap_or(0.0)));
        }
    }
    // Kernel entries' efficiencies are multiplied by the in-situ factor too.
    if let (Some(k), Some(Value::Array(kernels))) =
        (in_situ.filter(|k| *k != 1.0), t.get_mut("kernel"))
    {
        for e in kernels.iter_mut().filter_map(Value::as_table_mut) {
            if let Some(v) = e.get("efficiency").and_then(Value::as_float) {
                e.insert("efficiency".into(), Value::Float(sig(v * k)));
            }
            if let Some(Value::String(src)) = e.get_mut("source") {
                src.push_str(&format!(" (times in_situ_efficiency {k}, folded in)"));
            }
        }
    }
    if in_situ.is_some() {
        t.insert("in_situ_efficiency".into(), Value::Float(1.0));
    }
    if overhead.is_some() {
        t.insert("op_overhead_us".into(), Value::Float(0.0));
    }
    // The fits.
    if let Some(Value::Table(eff)) = t.get_mut("efficiency") {
        for r in &cal.efficiency {
            let (Some(f), Some(source)) = (&r.fit, class_source(r, &traces, &base.name)) else {
                continue;
            };
            let mut e = Table::new();
            e.insert("compute".into(), Value::Float(sig(f.params.compute)));
            e.insert("memory".into(), Value::Float(sig(f.params.memory)));
            e.insert("rows_pad".into(), Value::Float(sig(f.params.rows_pad)));
            e.insert("fixed_us".into(), Value::Float(sig(f.params.fixed_us)));
            e.insert("source".into(), Value::String(source));
            if let Some(o) = &r.one_row {
                let mut t = Table::new();
                t.insert("compute".into(), Value::Float(sig(o.params.compute)));
                t.insert("memory".into(), Value::Float(sig(o.params.memory)));
                t.insert("fixed_us".into(), Value::Float(sig(o.params.fixed_us)));
                e.insert("one_row".into(), Value::Table(t));
            }
            // What a trace does not fit stays as the file had it.
            if let Some(Value::Table(old)) = eff.get(r.class.name()) {
                for field in ["slice_pad", "int4_memory"] {
                    if let Some(v) = old.get(field) {
                        e.insert(field.into(), v.clone());
                    }
                }
            }
            eff.insert(r.class.name().into(), Value::Table(e));
        }
    }
    let host: Vec<_> = cal
        .host
        .iter()
        .filter_map(|h| h.fit.as_ref().map(|f| (h.origin.as_str(), f)))
        .collect();
    // Several traces: the fit to all their steps together.
    let origins = host.iter().map(|h| h.0).collect::<Vec<_>>().join(", ");
    let chosen = match &cal.host_pooled {
        Some(f) => Some((origins.as_str(), f)),
        None => host.first().copied(),
    };
    if let Some((origin, f)) = chosen {
        let mut table = Table::new();
        table.insert("step_us".into(), Value::Float(sig(f.step_us)));
        table.insert(
            "per_seq_us".into(),
            Value::Float(sig(f.per_seq_us.unwrap_or(0.0))),
        );
        if let Some(p) = f.per_token_us {
            table.insert("per_token_us".into(), Value::Float(sig(p)));
        }
        table.insert(
            "source".into(),
            Value::String(format!(
                "fit by dstwin calibrate --trace to {} gaps between {} device steps of {} and the time inside them no kernel covers (mean {:.1} us; {} idle gaps left out): rms {:.1} us{}{}",
                f.gaps,
                f.steps,
                origin,
                f.in_step_us,
                f.idle_gaps,
                f.rms_us,
                if f.per_seq_us.is_none() {
                    "; per_seq_us not determined (steps carry no varying sequence counts), 0"
                } else {
                    ""
                },
                if f.per_token_us.is_none() {
                    "; per_token_us not determined (no step's token count differs from its sequences'), 0"
                } else {
                    ""
                }
            )),
        );
        if let Some(c) = &cal.cold {
            table.insert("cold_after_us".into(), Value::Float(sig(c.after_us)));
            table.insert("cold_factor".into(), Value::Float(sig(c.factor)));
            if let Some(Value::String(src)) = table.get_mut("source") {
                src.push_str(&format!(
                    "; cold_after_us, cold_factor: the kernels of the {} steps that started more than {:.1} us after the previous one ({} kernels) took {:.3} ms against {:.3} ms under the forms fitted to the other steps' kernels",
                    c.steps, c.after_us, c.kernels, c.measured_ms, c.warm_ms
                ));
            }
        }
        if let Some(sp) = &cal.spread {
            // A spread beyond the cost file's bound is a trace of something else than steps
            // (a profiler stalling the engine): said, not written.
            let kept = sp.sigma <= MAX_STEP_SIGMA;
            if kept {
                table.insert("step_sigma".into(), Value::Float(sig(sp.sigma)));
            }
            if let Some(Value::String(src)) = table.get_mut("source") {
                src.push_str(&format!(
                    "; step_sigma: over the kernels of {} warm steps in {} groups of alike steps, ln(measured / priced) less its group's median has deciles {:+.3} and {:+.3}, a lognormal spread of {:.3}{}",
                    sp.steps,
                    sp.bias.len(),
                    sp.q10,
                    sp.q90,
                    sp.sigma,
                    if kept {
                        String::new()
                    } else {
                        format!(", above the most a cost file takes ({MAX_STEP_SIGMA}): left out")
                    }
                ));
            }
        }
        t.insert("host".into(), Value::Table(table));
    }
    // Ops with a form of their own: `[[kernel]]` entries, replacing any the base file gives
    // them.
    let own: Vec<(&str, &ClassReport, &super::efficiency::OpFit)> = cal
        .efficiency
        .iter()
        .flat_map(|r| r.ops.iter().map(move |(op, f)| (op.as_str(), r, f)))
        .collect();
    if !own.is_empty() {
        let mut kernels: Vec<Value> = match t.remove("kernel") {
            Some(Value::Array(a)) => a,
            _ => Vec::new(),
        };
        for k in kernels.iter_mut() {
            if let Some(Value::Array(ops)) = k.as_table_mut().and_then(|k| k.get_mut("ops")) {
                ops.retain(|o| !own.iter().any(|(op, _, _)| o.as_str() == Some(op)));
            }
        }
        kernels.retain(|k| {
            k.get("ops")
                .and_then(Value::as_array)
                .is_none_or(|o| !o.is_empty())
        });
        for (op, r, f) in &own {
            let mut k = Table::new();
            k.insert(
                "ops".into(),
                Value::Array(vec![Value::String((*op).to_owned())]),
            );
            k.insert("fixed_us".into(), Value::Float(sig(f.form.fixed_us)));
            k.insert("bound".into(), Value::String(f.form.bound.name().into()));
            k.insert("efficiency".into(), Value::Float(sig(f.form.efficiency)));
            let unit = |e: f64| match cal.objective {
                super::efficiency::Objective::Relative => pct(e),
                super::efficiency::Objective::Total => format!("{e:.2} us"),
            };
            k.insert(
                "source".into(),
                Value::String(format!(
                    "fit by dstwin calibrate --trace to {} {op} kernels of {traces}, apart from the {} class whose form misses them: rms error {} against {} under the class's form ({} objective); the other resource at the class's efficiency",
                    f.samples,
                    r.class.name(),
                    unit(f.error),
                    unit(f.class_error),
                    cal.objective.name()
                )),
            );
            kernels.push(Value::Table(k));
        }
        t.insert("kernel".into(), Value::Array(kernels));
    }
    // A refit without a benchmark keeps the base file's front end.
    let base_request = base
        .host
        .as_ref()
        .map(|h| h.request_us)
        .filter(|r| *r > 0.0);
    if let (None, Some(r), Some(Value::Table(h))) = (&cal.frontend, base_request, t.get_mut("host"))
    {
        h.entry("request_us").or_insert(Value::Float(r));
    }
    // Traces of graph-mode steps say nothing of eager launches: the base file's stays.
    let base_eager = base
        .host
        .as_ref()
        .map(|h| h.eager_layer_us)
        .filter(|e| *e > 0.0);
    if let (Some(e), Some(Value::Table(h))) = (base_eager, t.get_mut("host")) {
        h.entry("eager_layer_us").or_insert(Value::Float(e));
    }
    if let Some(fe) = &cal.frontend {
        let host = t.entry("host").or_insert_with(|| {
            let mut h = Table::new();
            h.insert("step_us".into(), Value::Float(0.0));
            h.insert(
                "source".into(),
                Value::String("no device steps in the traces: step time 0".into()),
            );
            Value::Table(h)
        });
        if let Value::Table(h) = host {
            h.insert("request_us".into(), Value::Float(sig(fe.request_us)));
            if let Some(Value::String(src)) = h.get_mut("source") {
                src.push_str(&format!(
                    "; request_us: mean client TTFT less the server's over {} requests of {}",
                    fe.requests,
                    fe.origins.join(", ")
                ));
            }
        }
    }
    // What the traces now determine leaves the list `dstwin calibrate` fits to the end-to-end
    // anchors: a refit would overwrite measured kernels with a figure that only constrains
    // them through a whole step. The folded global factors go too (each class has its own).
    let fitted = |name: &str| -> bool {
        if name == "op_overhead_us" {
            return overhead.is_some();
        }
        if name == "in_situ_efficiency" {
            return in_situ.is_some();
        }
        if name.starts_with("host.") {
            return !host.is_empty();
        }
        let mut parts = name.split('.');
        let (Some("efficiency"), Some(class), Some(field)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return false;
        };
        cal.efficiency.iter().any(|r| {
            r.class.name() == class
                && r.fit.as_ref().is_some_and(|f| match field {
                    "compute" => f.determined.compute,
                    "memory" => f.determined.memory,
                    "rows_pad" => f.determined.rows_pad,
                    "fixed_us" => f.determined.fixed_us,
                    _ => false,
                })
        })
    };
    let fit: Vec<Value> = base
        .fit
        .iter()
        .filter(|n| !fitted(n))
        .map(|n| Value::String(n.clone()))
        .collect();
    t.insert("fit".into(), Value::Array(fit));
    if let (Some(c), Some(Value::Table(coll))) = (&cal.collective, t.get_mut("collective")) {
        coll.insert("base_us".into(), Value::Float(sig(c.base_us)));
        coll.insert("bw_eff".into(), Value::Float(sig(c.bw_eff)));
        coll.insert(
            "source".into(),
            Value::String(format!(
                "fit by dstwin calibrate --trace to {} ring collectives of {traces}: rms error {}, max {}",
                c.samples,
                pct(c.rms_error),
                pct(c.max_error)
            )),
        );
    }
    Ok(format!(
        "{}{}",
        header(cal, &base.name),
        toml::to_string_pretty(&t)?
    ))
}

/// A system file: `system` renamed `name`, priced by the cost file at `cost_model` (a path
/// relative to the system file), for `--hardware` and scenarios.
pub fn system_file(
    system: &System,
    name: &str,
    cost_model: &str,
) -> Result<String, toml::ser::Error> {
    let mut s = system.clone();
    s.name = name.to_owned();
    s.cost_model = cost_model.to_owned();
    s.source = format!(
        "{}; cost model calibrated from profiler traces ({cost_model})",
        s.source
    );
    Ok(format!(
        "# {} with the cost model calibrated from profiler traces by `dstwin calibrate --trace`.\n{}",
        system.name,
        toml::to_string_pretty(&s)?
    ))
}

/// The comment block: what was read, mapped and fitted, and what was not.
fn header(cal: &TraceCalibration, base: &str) -> String {
    let mut h = String::new();
    let m = &cal.mapping;
    let _ = writeln!(
        h,
        "# Cost model calibrated from profiler traces by `dstwin calibrate --trace`, on {base}."
    );
    for t in &cal.traces {
        let _ = writeln!(h, "# trace {}", t.line());
    }
    let _ = writeln!(
        h,
        "# kernel time mapped onto the op graph {}, outside it (training, copies) {}, unmapped {}",
        pct(m.mapped_share),
        pct(m.outside_share),
        pct(m.unmapped_share)
    );
    for r in &cal.efficiency {
        match &r.fit {
            Some(f) => {
                let _ = writeln!(
                    h,
                    "# efficiency.{}: {} of {} kernels with known work; residuals rms {}, max {}",
                    r.class.name(),
                    r.with_work,
                    r.kernels,
                    pct(f.rms_error),
                    pct(f.max_error)
                );
            }
            None => {
                let _ = writeln!(
                    h,
                    "# efficiency.{}: not fitted ({} kernels, {} with known work); {}'s values",
                    r.class.name(),
                    r.kernels,
                    r.with_work,
                    base
                );
            }
        }
    }
    for a in &cal.alpha_beta {
        let _ = match (a.alpha_us, a.rms_error) {
            (Some(alpha), Some(rms)) => writeln!(
                h,
                "# alpha-beta {} {}: alpha {:.2} us, beta {} over {} kernels, {} sizes; rms error {}",
                a.kind.name(),
                a.group,
                alpha,
                a.beta_gb_s
                    .map_or_else(|| "unbounded".to_owned(), |b| format!("{b:.1} GB/s")),
                a.samples,
                a.sizes,
                pct(rms)
            ),
            _ => writeln!(
                h,
                "# alpha-beta {} {}: not fitted (one message size over {} kernels), mean {:.2} us",
                a.kind.name(),
                a.group,
                a.samples,
                a.mean_time_us
            ),
        };
    }
    if cal.collective.is_none() {
        let _ = writeln!(h, "# [collective]: not fitted (needs ring collectives with bytes and group sizes at two sizes or more); {base}'s values");
    }
    if cal.host.iter().all(|x| x.fit.is_none()) {
        let _ = writeln!(
            h,
            "# [host]: not fitted (the traces mark fewer than two device steps)"
        );
    }
    h.push('\n');
    h
}
