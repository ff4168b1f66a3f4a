//! `dstwin eplb`: expert placement from a heat map, a planning tool on its own.

use crate::output::outln;
use crate::Failure;
use anyhow::{anyhow, Context};
use clap::Args;
use dstwin_core::eplb::heatmap::HeatMap;
use dstwin_core::eplb::{place, EpLayout, Placement, Policy};
use serde::Serialize;

#[derive(Args, Debug)]
#[command(
    after_help = "The heat map is a JSON file of tokens routed to each expert of each MoE layer, per window of steps:\n  {\"format\": \"dstwin-expert-load/1\", \"experts\": 256, \"windows\": [{\"start_step\": 0, \"steps\": 600, \"counts\": [[...], ...]}]}\n\nExamples:\n  dstwin eplb --load heat.json --dies 288 --redundant 32\n      CloudMatrix384 decode: 256 + 32 redundant experts, one per routed die\n  dstwin eplb --load heat.json --dies 32 --redundant 32 --policy hierarchical --json > placement.json\n\nExit codes: 0 ok, 2 bad heat map or layout (the message names the numbers)."
)]
pub struct EplbArgs {
    /// Heat map file (JSON, format dstwin-expert-load/1).
    #[arg(long)]
    load: String,
    /// Dies holding routed experts (the EP group less any shared-expert dies).
    #[arg(long)]
    dies: u32,
    /// Redundant expert slots beyond one per logical expert.
    #[arg(long, default_value_t = 0)]
    redundant: u32,
    /// identity, global, hierarchical or greedy.
    #[arg(long, default_value = "greedy")]
    policy: String,
    /// Dies per node (hierarchical mode).
    #[arg(long, default_value_t = 16)]
    dies_per_node: u32,
    /// Router expert groups (hierarchical mode; DeepSeek-V3: 8).
    #[arg(long, default_value_t = 8)]
    groups: u32,
    /// Print the before/after summary and the placement as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Summary {
    mean_balancedness: f64,
    min_balancedness: f64,
    /// Hottest die over mean die load, worst layer.
    max_imbalance: f64,
}

fn summary(p: &Placement, load: &[Vec<f64>]) -> Summary {
    let b = p.balancedness(load);
    Summary {
        mean_balancedness: b.iter().sum::<f64>() / b.len() as f64,
        min_balancedness: b.iter().copied().fold(1.0, f64::min),
        max_imbalance: b
            .iter()
            .map(|x| if *x > 0.0 { 1.0 / x } else { f64::INFINITY })
            .fold(1.0, f64::max),
    }
}

pub fn run(a: EplbArgs) -> Result<(), Failure> {
    let text = std::fs::read_to_string(&a.load)
        .with_context(|| format!("reading {}", a.load))
        .map_err(Failure::Input)?;
    let heat = HeatMap::parse(&text)
        .with_context(|| a.load.clone())
        .map_err(Failure::Input)?;
    let policy: Policy = a
        .policy
        .parse()
        .map_err(|e: String| Failure::Input(anyhow!("--policy: {e}")))?;
    let load = heat.total();
    let max_redundant = (heat.experts as usize * (dstwin_core::eplb::MAX_SLOTS_PER_EXPERT - 1))
        .min(u32::MAX as usize) as u32;
    let slots = heat
        .experts
        .checked_add(a.redundant)
        .filter(|_| a.redundant <= max_redundant)
        .ok_or_else(|| {
            Failure::Input(anyhow!(
                "--redundant {}: at most {max_redundant} for {} experts ({} slots per expert)",
                a.redundant,
                heat.experts,
                dstwin_core::eplb::MAX_SLOTS_PER_EXPERT
            ))
        })?;
    let layout = EpLayout {
        slots,
        dies: a.dies,
        dies_per_node: a.dies_per_node,
        groups: a.groups,
    };
    let before = place(Policy::Identity, &load, &layout).map_err(|e| Failure::Input(e.into()))?;
    let after = place(policy, &load, &layout).map_err(|e| Failure::Input(e.into()))?;
    let (sb, sa) = (summary(&before, &load), summary(&after, &load));
    if a.json {
        let v =
            serde_json::json!({ "layout": layout, "before": sb, "after": sa, "placement": after });
        outln!(
            "{}",
            serde_json::to_string(&v).map_err(|e| Failure::Runtime(e.into()))?
        )?;
        return Ok(());
    }
    outln!(
        "{} layers x {} experts on {} slots over {} dies ({} per die), policy {}",
        load.len(),
        heat.experts,
        layout.slots,
        layout.dies,
        after.slots_per_die,
        a.policy
    )?;
    outln!("{:<24} {:>14} {:>14}", "", "identity", a.policy)?;
    outln!(
        "{:<24} {:>14.3} {:>14.3}",
        "mean balancedness",
        sb.mean_balancedness,
        sa.mean_balancedness
    )?;
    outln!(
        "{:<24} {:>14.3} {:>14.3}",
        "worst-layer balancedness",
        sb.min_balancedness,
        sa.min_balancedness
    )?;
    outln!(
        "{:<24} {:>14.2} {:>14.2}",
        "hottest die / mean",
        sb.max_imbalance,
        sa.max_imbalance
    )?;
    outln!("(balancedness = mean die load / hottest die load; --json prints the placement)")?;
    Ok(())
}
