//! `dstwin plan`: the best layouts (disaggregated or aggregated) for a model on N cards under
//! SLOs, with the launch command of each instance for the engine (vllm-ascend, vLLM, SGLang).

use crate::output::{out, outln};
use crate::Failure;
use anyhow::{anyhow, Context};
use clap::Args;
use dstwin_sim::plan::charts::Charts;
use dstwin_sim::plan::steady::{MEASURED_LIFETIMES, WARMUP_LIFETIMES};
use dstwin_sim::plan::{
    front, nodes, rank, run_level, search, shapes, simulated, to_seed, unsimulated, Engine,
    Generations, Load, Outcome, PercentileSlo, PlanInput, PlanReport, Searched, Standing,
    BATCH_CAPS, MTP_DEPTHS,
};
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Args, Debug)]
#[command(
    after_help = "Example:\n  dstwin plan --model deepseek-r1 --quant w8a8 --hardware atlas-800-a3 --cards 32 \\\n      --input 3500 --output 1500 --slo tpot=50ms,ttft=2s --out plan-out\n  dstwin plan --cards 16 --slo ttft_p90=2s,tpot_p99=60ms   (percentiles over each run)\n  dstwin plan --hardware nvidia-h200-8 --quant fp8 --cards 16 --engine sglang\n\nSearches disaggregated layouts (prefill/decode splits by node, prefill and decode TP) and\naggregated ones (mixed instances of 1 to N nodes, their attention TP and token budget per\nstep; the only kind on one node), with and without redundant experts. Each is first priced\nstep by step at a full batch (the twin's own steps, no queueing): at every MTP depth 0-3 the\nbatch cap (4 to 256 per DP rank) with the most requests per second per card within the SLOs\nand the KV. Layouts estimated within 30% of the best estimate (at least 8) are then\nsimulated (docs/what-if.md): capacity measured\nclosed-loop with every decode slot busy, then open-loop at 60% and 90% of it; every\nrun leaves out a warm-up and measures a steady window, both counted in the layout's request\nlifetimes. Layouts within reach of the best run with --seeds seeds; goodput per card (requests\nmeeting every SLO) is reported as mean and min-max over them, and layouts whose ranges overlap\nthe best's are reported as tied with it. Prints the best layouts, why the others lose, and\nthe winners' launch commands for --engine (vllm-ascend, vLLM or SGLang)."
)]
pub struct PlanArgs {
    /// Built-in model name (`dstwin catalog`) or a path to a HuggingFace config.json.
    #[arg(long, default_value = "deepseek-r1")]
    model: String,
    #[arg(long, default_value = "w8a8")]
    quant: String,
    /// Built-in system name (`dstwin catalog`).
    #[arg(long, default_value = "atlas-800-a3")]
    hardware: String,
    /// The engine the layouts run on and the launch commands are for: vllm (vllm-ascend on
    /// Ascend, vLLM on GPUs) or sglang (SGLang; on Ascend with --device npu). The engine sets
    /// what each layout's simulation assumes as well: MoE communication mode, micro-batches,
    /// EPLB cycle, DP dispatch, what happens when decode KV runs out (docs/what-if.md).
    #[arg(long, default_value = "vllm")]
    engine: String,
    /// Cards (packages) to deploy on: a multiple of the system's cards per node (one node is
    /// planned aggregated only).
    #[arg(long, default_value_t = 32)]
    cards: u32,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 3500)]
    input: u32,
    /// Output tokens per request.
    #[arg(long, default_value_t = 1500)]
    output: u32,
    /// SLOs, comma-separated (units ms or s): ttft=2s,tpot=50ms bound every request (goodput
    /// counts the requests within both); ttft_p90=2s, tpot_p99=60ms (any percentile above 0 and
    /// below 100) bound a percentile over each run's measured window, and a run over one has
    /// no goodput at that load. Both kinds may be mixed.
    #[arg(long, default_value = "tpot=50ms")]
    slo: String,
    /// MTP acceptance of each draft given the previous was accepted, comma-separated (default:
    /// the calibrated acceptance, 0.743 at every position; see docs/validation.md).
    #[arg(long, value_delimiter = ',')]
    mtp_accept: Vec<f64>,
    /// Layouts to show in full, with launch arguments.
    #[arg(long, default_value_t = 3)]
    top: usize,
    /// Print every outcome as JSON instead of the report.
    #[arg(long)]
    json: bool,
    /// Also write plan.json, the throughput-vs-TPOT front and goodput and TPOT against offered
    /// load (SVG and PNG) here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// The first seed; the others follow it (seed, seed + 1, ...).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Seeds each layout within reach of the best runs with; spreads are over them (2 to 64).
    #[arg(long, default_value_t = 3)]
    seeds: u32,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

/// Most seeds a plan runs each layout with.
const MAX_SEEDS: u32 = 64;

/// The SLOs of `--slo`: every request's TTFT and TPOT bounds, and percentile bounds over each
/// run's window.
type Slos = (Option<f64>, Option<f64>, Vec<PercentileSlo>);

fn parse_slo(s: &str) -> Result<Slos, Failure> {
    let (mut ttft, mut tpot, mut percentiles) = (None, None, Vec::new());
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
            key => {
                let (metric, percentile) = PercentileSlo::parse_key(key).map_err(|e| {
                    Failure::Input(anyhow!(
                        "--slo {part}: {e}; give ttft, tpot (every request) or a percentile \
                         such as ttft_p90, tpot_p99"
                    ))
                })?;
                percentiles
                    .retain(|p: &PercentileSlo| (p.metric, p.percentile) != (metric, percentile));
                percentiles.push(PercentileSlo {
                    metric,
                    percentile,
                    max_ms: ms,
                });
            }
        }
    }
    if ttft.is_none() && tpot.is_none() && percentiles.is_empty() {
        return Err(Failure::Input(anyhow!(
            "--slo: give ttft, tpot and/or percentiles such as ttft_p90"
        )));
    }
    Ok((ttft, tpot, percentiles))
}

pub fn run(a: PlanArgs) -> Result<(), Failure> {
    let (ttft_ms, tpot_ms, percentile_slos) = parse_slo(&a.slo)?;
    if a.input == 0 || a.output == 0 {
        return Err(Failure::Input(anyhow!(
            "--input and --output must be at least 1"
        )));
    }
    // An unknown model is refused here, with the list of known ones.
    let m = dstwin_sim::scenario::load_model(&a.model, std::path::Path::new("."))
        .map_err(|e| Failure::Input(e.into()))?;
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
    if !(2..=MAX_SEEDS).contains(&a.seeds) {
        return Err(Failure::Input(anyhow!(
            "--seeds {}: between 2 and {MAX_SEEDS} (a spread needs at least two seeds)",
            a.seeds
        )));
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
        percentile_slos,
        acceptance: a.mtp_accept.clone(),
        seed: a.seed,
        seeds: a.seeds,
        engine: Engine::parse(&a.engine, &a.hardware).map_err(|e| Failure::Input(anyhow!(e)))?,
    };
    // The model and quantization must exist before a thousand candidates say so.
    let shapes = shapes(n, dies_per_node);
    let probe =
        shapes[0]
            .with(1, 0)
            .scenario(&p, dies_per_node, Load::Closed(Generations::new(1)), p.seed);
    if let Err(e) = dstwin_sim::scenario::load_str("plan", &probe, std::path::Path::new("."), &[]) {
        let msg = e.to_string();
        if msg.contains("model") || msg.contains("quant") || msg.contains("acceptance") {
            return Err(Failure::Input(anyhow!("{msg}")));
        }
    }
    // Every layout's batch cap at every MTP depth, from steady steps.
    let jobs: Vec<(usize, u32)> = (0..shapes.len())
        .flat_map(|i| MTP_DEPTHS.map(|t| (i, t)))
        .collect();
    let bar = crate::progress::bar(
        Some(jobs.len() as u64),
        a.quiet,
        "{bar:40} {pos}/{len} layouts searched by steady steps [{elapsed_precise}, eta {eta}]",
    );
    let searched: Vec<Searched> = jobs
        .par_iter()
        .map(|&(i, t)| {
            let s = search(&p, &shapes[i], t, dies_per_node);
            bar.inc(1);
            s
        })
        .collect();
    bar.finish_and_clear();
    // Then the front, simulated.
    let pick = front(&p, &searched);
    let bar = crate::progress::bar(
        Some(pick.len() as u64),
        a.quiet,
        "{bar:40} {pos}/{len} layouts simulated [{elapsed_precise}, eta {eta}]",
    );
    let mut outcomes: Vec<Outcome> = pick
        .par_iter()
        .map(|&i| {
            let o = simulated(&p, &searched[i], dies_per_node);
            bar.inc(1);
            o
        })
        .collect();
    bar.finish_and_clear();
    outcomes.extend(
        searched
            .iter()
            .enumerate()
            .filter(|(i, _)| pick.binary_search(i).is_err())
            .map(|(_, s)| unsimulated(s)),
    );
    more_seeds(&p, &mut outcomes, dies_per_node, a.quiet);
    rank(&mut outcomes, &p);
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
    let report = PlanReport::new(&p, &outcomes);
    if let Some(dir) = &a.out {
        write_outputs(dir, &p, &report)?;
    }
    if a.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| Failure::Runtime(e.into()))?
        )?;
        return Ok(());
    }
    out!(
        "{}",
        render(
            &a,
            &p,
            &m.name,
            &outcomes,
            (shapes.len(), pick.len()),
            dies_per_node
        )
    )?;
    Ok(())
}

/// Runs the layouts within reach of the best with the rest of the seeds, in rounds, until no
/// more are within reach (`plan::rank` module docs).
fn more_seeds(p: &PlanInput, outcomes: &mut [Outcome], dies_per_node: u32, quiet: bool) {
    let seeds = p.seed_list();
    loop {
        let pick = to_seed(outcomes, seeds.len());
        if pick.is_empty() {
            return;
        }
        // One job per (layout, level, seed) not yet run.
        let mut jobs: Vec<(usize, usize, u64)> = Vec::new();
        for &i in &pick {
            for (l, level) in outcomes[i].levels.iter().enumerate() {
                for &s in &seeds {
                    if level.runs.iter().all(|m| m.seed != s) {
                        jobs.push((i, l, s));
                    }
                }
            }
        }
        let bar = crate::progress::bar(
            Some(jobs.len() as u64),
            quiet,
            "{bar:40} {pos}/{len} runs with more seeds [{elapsed_precise}, eta {eta}]",
        );
        let done: Vec<_> = jobs
            .par_iter()
            .map(|&(i, l, s)| {
                let o = &outcomes[i];
                let r = run_level(p, &o.candidate, dies_per_node, &o.levels[l], s);
                bar.inc(1);
                (i, l, s, r)
            })
            .collect();
        bar.finish_and_clear();
        for (i, l, s, r) in done {
            match r {
                Ok((m, _)) => outcomes[i].levels[l].runs.push(m),
                Err(e) if outcomes[i].invalid.is_empty() => {
                    outcomes[i].invalid = format!("{e} (seed {s})");
                }
                Err(_) => {}
            }
        }
        for i in pick {
            outcomes[i].settle();
        }
    }
}

fn write_outputs(dir: &std::path::Path, p: &PlanInput, report: &PlanReport) -> Result<(), Failure> {
    let outcomes = report.layouts;
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating {}", dir.display()))
        .map_err(Failure::Runtime)?;
    let w = |name: &str, bytes: &[u8]| crate::output::write_file(&dir.join(name), bytes);
    w(
        "plan.json",
        &serde_json::to_vec_pretty(report).map_err(|e| Failure::Runtime(e.into()))?,
    )?;
    for (name, bytes) in Charts::of(p.tpot_ms, outcomes).files() {
        w(name, &bytes)?;
    }
    Ok(())
}

fn range(s: &dstwin_sim::plan::Spread, digits: usize) -> String {
    format!("{:.d$} ({:.d$}-{:.d$})", s.mean, s.min, s.max, d = digits)
}

/// The report; `served` is the model's own name (a config.json's, not its path), for the
/// launch arguments' `--served-model-name`.
/// The plan's SLOs as its report states them.
fn slo_text(p: &PlanInput) -> String {
    let each: Vec<String> = [("TTFT", p.ttft_ms), ("TPOT", p.tpot_ms)]
        .iter()
        .filter_map(|(k, v)| v.map(|x| format!("{k} <= {x} ms")))
        .collect();
    let pct: Vec<String> = p
        .percentile_slos
        .iter()
        .map(|s| format!("{} <= {} ms", s.label(), s.max_ms))
        .collect();
    let mut parts = Vec::new();
    if !each.is_empty() {
        parts.push(format!("every request {}", each.join(", ")));
    }
    if !pct.is_empty() {
        parts.push(format!("over each run's window {}", pct.join(", ")));
    }
    parts.join("; ")
}

fn render(
    a: &PlanArgs,
    p: &PlanInput,
    served: &str,
    outcomes: &[Outcome],
    (layouts, simulated): (usize, usize),
    dies_per_node: u32,
) -> String {
    let seeds = p.seed_list();
    let seeded = outcomes.iter().filter(|o| o.rank.is_some()).count();
    let tied = outcomes
        .iter()
        .filter(|o| o.standing == Standing::Tied)
        .count();
    let mut s = format!(
        "plan: {} {} on {} cards of {} ({} in / {} out) with {}, SLO {}\n\
         {} layouts (each at MTP {}-{}) searched by steady steps for their batch cap ({}-{} per DP rank); \
         {simulated} near the front simulated with seed {}; {seeded} within reach of the best run with seeds {}-{}\n\
         every run: {WARMUP_LIFETIMES} request lifetimes of warm-up left out, {MEASURED_LIFETIMES} or more measured\n\
         figures: mean (min-max) over the seeds; goodput ranges that overlap the best's are tied with it\n\n",
        a.model,
        a.quant,
        a.cards,
        a.hardware,
        a.input,
        a.output,
        p.engine.name(),
        slo_text(p),
        layouts,
        MTP_DEPTHS[0],
        MTP_DEPTHS[MTP_DEPTHS.len() - 1],
        BATCH_CAPS[0],
        BATCH_CAPS[BATCH_CAPS.len() - 1],
        seeds[0],
        seeds[0],
        seeds[seeds.len() - 1],
    );
    if seeded == 0 {
        s += "no layout met every SLO at 60% or 90% of its capacity\n";
    } else {
        s += "rank  goodput/card (min-max)    out tok/s/card  SLO met  TTFT p50 ms (min-max)  TPOT p50 ms (min-max)  ";
        for slo in &p.percentile_slos {
            s += &format!("{:<21}  ", format!("{} ms", slo.label()));
        }
        s += "req/s (cap)    life  layout\n";
        // Every layout ranked, then the best of those screened out at one seed, unranked; at
        // least down to the last layout tied with the best (a layout below the best's range
        // may sit between tied ones, whose ranges are wider).
        let last_tied = outcomes
            .iter()
            .filter(|o| o.result.is_some())
            .enumerate()
            .filter(|(_, o)| matches!(o.standing, Standing::Best | Standing::Tied))
            .last()
            .map_or(0, |(i, _)| i + 1);
        let rows = a.top.max(10).max(last_tied);
        let mut screened_shown = false;
        for o in outcomes.iter().filter(|o| o.result.is_some()).take(rows) {
            let r = o.result.as_ref().expect("filtered");
            let one = o.rank.is_none();
            screened_shown |= one;
            let rank = match (o.standing, tied) {
                (Standing::Best | Standing::Tied, t) if t > 0 => "=1".to_string(),
                _ => o.rank.map_or("-".to_string(), |k| k.to_string()),
            };
            let spread = |x: &dstwin_sim::plan::Spread, d: usize| {
                if one {
                    format!("{:.d$} (1 seed)", x.mean, d = d)
                } else {
                    range(x, d)
                }
            };
            let percentiles: String = r
                .percentiles_ms
                .iter()
                .map(|x| format!("{:<21}  ", spread(x, 1)))
                .collect();
            s += &format!(
                "{rank:>4}  {:<24}  {:>14.1}  {:>6.1}%  {:<21}  {:<21}  {percentiles}{:>4.1} ({:>4.1})  {:>5.1}s  {}\n",
                spread(&r.goodput_per_card, 4),
                r.output_tok_s_per_card.mean,
                r.slo_attainment.mean * 100.0,
                spread(&r.ttft_p50_ms, 0),
                spread(&r.tpot_p50_ms, 1),
                r.rate_req_s,
                o.capacity_req_s,
                o.lifetime_s,
                o.candidate.label()
            );
        }
        s += &if tied > 0 {
            format!(
                "\n=1: the best and {tied} layout{} whose goodput range overlaps its range: statistically \
                 indistinguishable over {} seeds; benchmark them all\n",
                if tied == 1 { "" } else { "s" },
                seeds.len()
            )
        } else {
            format!(
                "\n1: no other layout's goodput range overlaps the best's over {} seeds\n",
                seeds.len()
            )
        };
        if screened_shown {
            s += " -: screened out at one seed, below the best's lowest seed by more than any spread measured\n";
        }
    }
    // Why the rest lose: only losses outside the spread are claimed.
    let mut why: BTreeMap<&str, (usize, &Outcome)> = BTreeMap::new();
    for o in outcomes {
        if let Some(l) = &o.loses_because {
            why.entry(l.reason).or_insert((0, o)).0 += 1;
        }
    }
    s += "\nwhy the others lose (outside the spread):\n";
    for (reason, (count, ex)) in &why {
        let detail = ex.loses_because.as_ref().map_or("", |l| l.detail.as_str());
        s += &format!(
            "  {reason:<14} {count:>4} layouts, e.g. {}: {detail}\n",
            ex.candidate.label()
        );
    }
    for (i, o) in outcomes
        .iter()
        .filter(|o| o.result.is_some())
        .take(a.top)
        .enumerate()
    {
        let standing = match (o.standing, o.rank) {
            (Standing::Tied, _) => " (tied with the best)".to_string(),
            (Standing::Lower, Some(r)) => format!(" (rank {r})"),
            (Standing::ScreenedOut, _) => " (screened out at one seed)".to_string(),
            _ => String::new(),
        };
        s += &format!("\n#{} {}{standing}\n", i + 1, o.candidate.label());
        for (role, cmd) in o.candidate.launch_args(p, dies_per_node, served) {
            s += &format!("# {role}\n{cmd}\n");
        }
    }
    s
}
