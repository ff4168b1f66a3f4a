//! `dstwin plan`: the best PD layouts for a model on N cards under SLOs, with the vllm-ascend
//! launch arguments of each instance.

use crate::output::{out, outln};
use crate::Failure;
use anyhow::{anyhow, Context};
use clap::Args;
use dstwin_sim::plan::{candidates, evaluate, nodes, rank, Load, Outcome, PlanInput};
use dstwin_sim::plot;
use dstwin_sim::sweep::{knee, pareto};
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Args, Debug)]
#[command(
    after_help = "Example:\n  dstwin plan --model deepseek-r1 --quant w8a8 --hardware atlas-800-a3 --cards 32 \\\n      --input 3500 --output 1500 --slo tpot=50ms,ttft=2s --out plan-out\n\nSearches prefill/decode splits by node, prefill and decode TP, the decode batch cap,\nredundant experts and MTP depth (docs/what-if.md). Each layout is simulated closed-loop at a\nquarter, half and all of its decode slots; goodput per card counts requests meeting every SLO.\nPrints the best layouts, why the others lose, and `vllm serve` arguments for the winners."
)]
pub struct PlanArgs {
    /// Built-in model name (`dstwin catalog`).
    #[arg(long, default_value = "deepseek-r1")]
    model: String,
    #[arg(long, default_value = "w8a8")]
    quant: String,
    /// Built-in system name (`dstwin catalog`).
    #[arg(long, default_value = "atlas-800-a3")]
    hardware: String,
    /// Cards (packages) to deploy on: a multiple of the system's cards per node.
    #[arg(long, default_value_t = 32)]
    cards: u32,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 3500)]
    input: u32,
    /// Output tokens per request.
    #[arg(long, default_value_t = 1500)]
    output: u32,
    /// SLOs: ttft=2s,tpot=50ms (units ms or s).
    #[arg(long, default_value = "tpot=50ms")]
    slo: String,
    /// MTP acceptance of each draft given the previous was accepted, comma-separated (default:
    /// the calibrated acceptance, 0.717 at every position; see docs/validation.md).
    #[arg(long, value_delimiter = ',')]
    mtp_accept: Vec<f64>,
    /// Layouts to show in full, with launch arguments.
    #[arg(long, default_value_t = 3)]
    top: usize,
    /// Print every outcome as JSON instead of the report.
    #[arg(long)]
    json: bool,
    /// Also write plan.json and the throughput-vs-TPOT front (SVG, PNG) here.
    #[arg(long)]
    out: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

fn parse_slo(s: &str) -> Result<(Option<f64>, Option<f64>), Failure> {
    let (mut ttft, mut tpot) = (None, None);
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').ok_or_else(|| {
            Failure::Input(anyhow!("--slo {part}: expected NAME=VALUE, e.g. tpot=50ms"))
        })?;
        let ms = if let Some(x) = v.strip_suffix("ms") {
            x.trim().parse::<f64>().ok()
        } else if let Some(x) = v.strip_suffix('s') {
            x.trim().parse::<f64>().ok().map(|x| x * 1000.0)
        } else {
            None
        }
        .filter(|x| x.is_finite() && *x > 0.0)
        .ok_or_else(|| {
            Failure::Input(anyhow!(
                "--slo {part}: value must be a positive time like 50ms or 2s"
            ))
        })?;
        match k.trim() {
            "ttft" => ttft = Some(ms),
            "tpot" => tpot = Some(ms),
            other => {
                return Err(Failure::Input(anyhow!(
                    "--slo {part}: unknown SLO '{other}' (ttft or tpot)"
                )))
            }
        }
    }
    if ttft.is_none() && tpot.is_none() {
        return Err(Failure::Input(anyhow!("--slo: give ttft and/or tpot")));
    }
    Ok((ttft, tpot))
}

pub fn run(a: PlanArgs) -> Result<(), Failure> {
    let (ttft_ms, tpot_ms) = parse_slo(&a.slo)?;
    if a.input == 0 || a.output == 0 {
        return Err(Failure::Input(anyhow!(
            "--input and --output must be at least 1"
        )));
    }
    // An unknown model is reported below, with the list of known ones.
    if let Some(m) = dstwin_core::model::builtin(&a.model) {
        let len = u64::from(a.input) + u64::from(a.output);
        if len > m.max_context {
            return Err(Failure::Input(anyhow!(
                "--input {} + --output {} = {len} tokens: at most the context of {} ({} tokens)",
                a.input,
                a.output,
                a.model,
                m.max_context
            )));
        }
    }
    for (i, x) in a.mtp_accept.iter().enumerate() {
        if !(0.0..=1.0).contains(x) {
            return Err(Failure::Input(anyhow!(
                "--mtp-accept: value {} ({x}) must be a probability in [0, 1] (draft {} accepted given draft {} was)",
                i + 1,
                i + 1,
                i
            )));
        }
    }
    let (n, dies_per_node) = nodes(&a.hardware, a.cards).map_err(|e| Failure::Input(anyhow!(e)))?;
    if let Some(dir) = &a.out {
        crate::output::check_dir(dir, "--out")?;
    }
    let p = PlanInput {
        model: a.model.clone(),
        quant: a.quant.clone(),
        hardware: a.hardware.clone(),
        cards: a.cards,
        input_tokens: a.input,
        output_tokens: a.output,
        ttft_ms,
        tpot_ms,
        acceptance: a.mtp_accept.clone(),
        seed: a.seed,
    };
    // The model and quantization must exist before a thousand candidates say so.
    let probe = candidates(n, dies_per_node)[0].scenario(&p, dies_per_node, Load::Closed(1));
    if let Err(e) = dstwin_sim::scenario::load_str("plan", &probe, std::path::Path::new("."), &[]) {
        let msg = e.to_string();
        if msg.contains("model") || msg.contains("quant") || msg.contains("acceptance") {
            return Err(Failure::Input(anyhow!("{msg}")));
        }
    }
    let cands = candidates(n, dies_per_node);
    let bar = crate::progress::bar(
        Some(cands.len() as u64),
        a.quiet,
        "{bar:40} {pos}/{len} layouts [{elapsed_precise}, eta {eta}]",
    );
    let mut outcomes: Vec<Outcome> = cands
        .par_iter()
        .map(|c| {
            let o = evaluate(&p, c, dies_per_node);
            bar.inc(1);
            o
        })
        .collect();
    bar.finish_and_clear();
    rank(&mut outcomes);
    // Every layout invalid: there is no plan, only the reasons.
    if outcomes.iter().all(|o| !o.invalid.is_empty()) {
        let mut why: BTreeMap<&str, (usize, &Outcome)> = BTreeMap::new();
        for o in &outcomes {
            why.entry(&o.invalid).or_insert((0, o)).0 += 1;
        }
        let mut why: Vec<_> = why.into_iter().collect();
        why.sort_by_key(|w| std::cmp::Reverse(w.1 .0));
        let reasons: Vec<String> = why
            .iter()
            .take(5)
            .map(|(r, (n, o))| format!("  {n} layouts, e.g. {}: {r}", o.candidate.label()))
            .collect();
        return Err(Failure::Input(anyhow!(
            "no layout of {} on {} cards of {} is valid:\n{}",
            a.model,
            a.cards,
            a.hardware,
            reasons.join("\n")
        )));
    }
    if let Some(dir) = &a.out {
        write_outputs(dir, &outcomes)?;
    }
    if a.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&outcomes).map_err(|e| Failure::Runtime(e.into()))?
        )?;
        return Ok(());
    }
    out!("{}", render(&a, &p, &outcomes, dies_per_node))?;
    Ok(())
}

fn write_outputs(dir: &std::path::Path, outcomes: &[Outcome]) -> Result<(), Failure> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating {}", dir.display()))
        .map_err(Failure::Runtime)?;
    let w = |name: &str, bytes: &[u8]| {
        std::fs::write(dir.join(name), bytes)
            .with_context(|| format!("writing {}", dir.join(name).display()))
            .map_err(Failure::Runtime)
    };
    w(
        "plan.json",
        &serde_json::to_vec_pretty(outcomes).map_err(|e| Failure::Runtime(e.into()))?,
    )?;
    let valid: Vec<(f64, f64, usize)> = outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| o.invalid.is_empty())
        .map(|(i, o)| (o.tpot_p50_ms, o.output_tok_s_per_card, i))
        .collect();
    let front = pareto(&valid);
    let k = knee(&front).map(|i| front[i].2);
    let pl = plot::Plot {
        title: "Candidate layouts: output tokens/s per card vs TPOT (p50)".into(),
        x_label: "TPOT p50 (ms)".into(),
        y_label: "output tok/s per card".into(),
        points: valid.iter().map(|p| (p.0, p.1)).collect(),
        front: front.iter().map(|p| (p.0, p.1)).collect(),
        knee: k.map(|i| {
            let o = &outcomes[i];
            (
                (o.tpot_p50_ms, o.output_tok_s_per_card),
                format!("knee: {}", o.candidate.label()),
            )
        }),
    };
    w("plan_tpot.svg", plot::svg(&pl).as_bytes())?;
    w("plan_tpot.png", &plot::png(&pl))?;
    Ok(())
}

fn render(a: &PlanArgs, p: &PlanInput, outcomes: &[Outcome], dies_per_node: u32) -> String {
    let mut s = format!(
        "plan: {} {} on {} cards of {} ({} in / {} out), SLO{}{}\n{} layouts simulated\n\n",
        a.model,
        a.quant,
        a.cards,
        a.hardware,
        a.input,
        a.output,
        p.ttft_ms
            .map_or(String::new(), |x| format!(" TTFT p50 <= {x} ms")),
        p.tpot_ms
            .map_or(String::new(), |x| format!(" TPOT p50 <= {x} ms")),
        outcomes.len()
    );
    s += "rank  goodput/card  out tok/s/card  SLO met  TTFT p50  TPOT p50  req/s (cap)  layout\n";
    for (i, o) in outcomes.iter().take(a.top.max(10)).enumerate() {
        if !o.invalid.is_empty() {
            break;
        }
        s += &format!(
            "{:>4}  {:>12.4}  {:>14.1}  {:>6.1}%  {:>6.0}ms  {:>6.1}ms  {:>4.1} ({:>4.1})  {}\n",
            i + 1,
            o.goodput_per_card,
            o.output_tok_s_per_card,
            o.slo_attainment * 100.0,
            o.ttft_p50_ms,
            o.tpot_p50_ms,
            o.rate_req_s,
            o.capacity_req_s,
            o.candidate.label()
        );
    }
    // Why the rest lose.
    let mut why: BTreeMap<String, (usize, Option<&Outcome>)> = BTreeMap::new();
    for o in outcomes.iter().skip(a.top) {
        let e = why.entry(o.verdict(p)).or_insert((0, None));
        e.0 += 1;
        e.1.get_or_insert(o);
    }
    s += "\nwhy the others lose:\n";
    for (reason, (count, ex)) in &why {
        let detail = match (reason.as_str(), ex) {
            ("memory" | "layout", Some(o)) => o.invalid.clone(),
            ("TPOT", Some(o)) => format!("TPOT p50 {:.1} ms over the SLO", o.tpot_p50_ms),
            ("TTFT", Some(o)) => format!("TTFT p50 {:.0} ms over the SLO", o.ttft_p50_ms),
            (_, Some(o)) => format!("{:.4} req/s per card", o.goodput_per_card),
            _ => String::new(),
        };
        s += &format!(
            "  {reason:<14} {count:>4} layouts, e.g. {}: {detail}\n",
            ex.map_or(String::new(), |o| o.candidate.label())
        );
    }
    for (i, o) in outcomes.iter().take(a.top).enumerate() {
        if !o.invalid.is_empty() {
            break;
        }
        s += &format!("\n#{} {}\n", i + 1, o.candidate.label());
        for (role, cmd) in o.candidate.launch_args(p, dies_per_node) {
            s += &format!("# {role}\n{cmd}\n");
        }
    }
    s
}
