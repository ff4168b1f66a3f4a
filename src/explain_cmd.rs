//! `dstwin explain` and `dstwin catalog`: argument parsing and output only.

use crate::output::{out, outln};
use crate::Failure;
use anyhow::anyhow;
use clap::Args;
use dstwin_core::layout::{Layout, Role};
use dstwin_core::model::{self, Quant};
use dstwin_hwmodels::{Catalog, DType};
use dstwin_twin::expert_load::ExpertLoadSpec;
use dstwin_twin::explain::{explain_under, BatchSpec, ExplainInput, Mtp, SkewedLoad};
use std::path::Path;

/// Defaults reproduce the CloudMatrix384 decode deployment of the CloudMatrix-Infer paper:
/// DeepSeek-R1 w8a8, one decode instance of 320 dies (160 NPUs), EP320 with 32 redundant experts
/// and 32 shared-expert dies, 48 sequences per die (96 per NPU) at KV 4K, MTP 1 at the calibrated
/// acceptance (0.743).
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  dstwin explain\n      CloudMatrix384 decode, EP320, 96 seqs per NPU at KV 4K, MTP 1 at the calibrated 74.3%\n  dstwin explain --skew\n      the same with the simulator's default expert load (fitted to measured DeepSeek-R1 loads) on a greedy EPLB placement (its 32 redundant experts)\n  dstwin explain --role prefill --dies 32 --redundant-experts 32 --shared-expert-dies 0 --tokens 8192 --prompt 4096 --mtp 0\n      CloudMatrix384 prefill instance of 16 NPUs, 16K tokens per NPU in 4K prompts\n  dstwin explain --role prefill --dies 32 --redundant-experts 32 --shared-expert-dies 0 --tokens 8192 --prompt 4096 --cached 12288 --mtp 0\n      the same step as the last chunks of 16K prompts (or after 12K-token prefix hits): attention over the cached 12K and its latent up-projected again\n  dstwin explain --hardware atlas-800i-a2 --dies 32 --redundant-experts 0 --shared-expert-dies 0 --seqs 24 --kv 2048 --json\n      Atlas 800I A2, 4 nodes, as JSON for scripts\n\nSizes count dies, as vllm-ascend's flags do (a 910C card = 2 dies).\nExit codes: 0 ok, 2 invalid input or impossible layout (the message names the field and numbers)."
)]
pub struct ExplainArgs {
    /// Built-in model name (see `dstwin catalog`) or path to a HuggingFace config.json.
    #[arg(long, default_value = "deepseek-r1")]
    model: String,
    /// Quantization: bf16, w8a8, w4a8, fp8.
    #[arg(long, default_value = "w8a8")]
    quant: String,
    /// KV-cache format: bf16, int8, fp8.
    #[arg(long, default_value = "bf16")]
    kv_dtype: String,
    /// Hardware system name (see `dstwin catalog`) or path to a system TOML file.
    #[arg(long, default_value = "cloudmatrix384")]
    hardware: String,
    #[command(flatten)]
    layout: LayoutFlags,
    /// Decoding sequences per DP rank.
    #[arg(long, default_value_t = 48)]
    seqs: u32,
    /// Context (KV) length of each decoding sequence, tokens.
    #[arg(long, default_value_t = 4096)]
    kv: u64,
    /// Prompt tokens per DP rank this step (prefill).
    #[arg(long, default_value_t = 0)]
    tokens: u64,
    /// Tokens per prompt (prefill).
    #[arg(long, default_value_t = 4096)]
    prompt: u64,
    /// Tokens of each prompt already in KV (prefix-cache hits, or the earlier chunks of a long
    /// prompt): the step computes --prompt new tokens after them, attends to them and
    /// up-projects their cached latent again.
    #[arg(long, default_value_t = 0)]
    cached: u64,
    /// MTP draft tokens per step (0 = off).
    #[arg(long, default_value_t = 1)]
    mtp: u32,
    /// Acceptance probability of each draft given the previous was accepted, comma-separated
    /// (default: the calibrated acceptance, 0.743 at every position; see docs/validation.md).
    #[arg(long, value_delimiter = ',')]
    mtp_accept: Vec<f64>,
    /// Tokens on the hottest routed die over the mean (1.0 = perfect expert balance, the
    /// default without --skew).
    #[arg(long, default_value_t = 1.0, conflicts_with = "skew")]
    imbalance: f64,
    /// Price a skewed routed-expert load, its imbalance computed per layer on the --eplb
    /// placement: `fitted` (the default of --skew and of scenarios: log-normal per layer fitted
    /// to measured DeepSeek-R1 loads), `lognormal:SIGMA`, `zipf:EXPONENT` or a bare Zipf
    /// exponent.
    #[arg(long, num_args = 0..=1, default_missing_value = "fitted", value_name = "LOAD")]
    skew: Option<String>,
    /// EPLB policy placing a skewed load: identity, global, hierarchical or greedy. Default, as in
    /// scenarios: greedy with --redundant-experts above 0, else identity.
    #[arg(long, requires = "skew")]
    eplb: Option<String>,
    /// With --skew: Dirichlet concentration of each request's routing around the mean; the
    /// fewer requests a step holds, the further its load strays from what EPLB placed for
    /// (0: no per-batch fluctuation). Default: the load's own (fitted with the skew for
    /// `fitted` and `lognormal`; the Zipf(0.5) fit for `zipf`).
    #[arg(long, requires = "skew")]
    concentration: Option<f64>,
    /// Per-rank token budget the workspace is sized for (default: the batch's tokens).
    #[arg(long)]
    max_tokens: Option<u64>,
    #[command(flatten)]
    features: FeatureFlags,
    /// Print the full report as JSON.
    #[arg(long)]
    json: bool,
}

/// The load `--skew` names, with `--concentration` when given.
fn skew_spec(load: &str, concentration: Option<f64>) -> anyhow::Result<ExpertLoadSpec> {
    let number = |v: &str| -> anyhow::Result<f64> {
        v.parse()
            .map_err(|_| anyhow!("--skew {load}: '{v}' is not a number"))
    };
    let fitted = dstwin_twin::expert_load::fitted();
    let lognormal = |sigma, sigma_spread| ExpertLoadSpec::Lognormal {
        sigma,
        sigma_spread,
        concentration: concentration.unwrap_or(fitted.concentration),
        drift: 0.0,
        epoch_steps: 1,
    };
    let zipf = |exponent| ExpertLoadSpec::Zipf {
        exponent,
        drift: 0.0,
        epoch_steps: 1,
        concentration: concentration.unwrap_or(dstwin_twin::expert_load::DEFAULT_CONCENTRATION),
    };
    let spec = match load.split_once(':') {
        None if load == "fitted" => match concentration {
            // Another concentration is no longer the fitted load: say so in the report.
            Some(_) => lognormal(fitted.sigma, fitted.sigma_spread),
            None => ExpertLoadSpec::Fitted {
                drift: 0.0,
                epoch_steps: 1,
            },
        },
        None => zipf(number(load).map_err(|_| {
            anyhow!("--skew {load}: give fitted, lognormal:SIGMA, zipf:EXPONENT or a Zipf exponent")
        })?),
        Some(("lognormal", v)) => lognormal(number(v)?, 0.0),
        Some(("zipf", v)) => zipf(number(v)?),
        Some((kind, _)) => {
            return Err(anyhow!(
                "--skew {load}: unknown load '{kind}'; give fitted, lognormal:SIGMA, zipf:EXPONENT or a Zipf exponent"
            ))
        }
    };
    spec.validate()
        .map_err(|(field, value, reason)| anyhow!("--skew {load}: {field} = {value} {reason}"))?;
    Ok(spec)
}

/// explain's flags from the engine-mechanism list ([`dstwin_core::feature_fields`]).
macro_rules! feature_flags {
    ($( $(#[doc = $d:literal])* $f:ident: $t:ty [$($flag:tt)*], )*) => {
        // The engine mechanisms, one flag each (no doc comment: clap would take it as the
        // command's about).
        #[derive(Args, Clone, Debug)]
        struct FeatureFlags {
            $( $(#[doc = $d])* #[arg($($flag)*)] $f: $t, )*
        }

        impl FeatureFlags {
            fn features(&self) -> dstwin_core::features::Features {
                dstwin_core::features::Features { $( $f: self.$f.clone(), )* }
            }
        }
    };
}
dstwin_core::feature_fields!(feature_flags! {});

/// explain's layout flags from the layout list ([`dstwin_core::layout_fields`]).
macro_rules! layout_flags {
    ($( $(#[doc = $d:literal])* $f:ident: $t:ty {$($serde:tt)*} [$($flag:tt)*], )*) => {
        // The instance's layout, one flag per field (no doc comment: clap would take it as the
        // command's about).
        #[derive(Args, Clone, Debug)]
        struct LayoutFlags {
            $( $(#[doc = $d])* #[arg($($flag)*)] $f: $t, )*
        }

        impl LayoutFlags {
            fn layout(&self) -> Layout {
                dstwin_core::layout::LayoutSpec { $( $f: self.$f.clone(), )* }.layout()
            }
        }
    };
}
dstwin_core::layout_fields!(layout_flags! {});

fn build_input(a: &ExplainArgs) -> anyhow::Result<(ExplainInput, Option<SkewedLoad>)> {
    let model = dstwin_sim::scenario::load_model(&a.model, Path::new("."))?;
    let quant: Quant = a.quant.parse().map_err(|e| anyhow!("--quant: {e}"))?;
    let kv_dtype: DType = a
        .kv_dtype
        .parse()
        .map_err(|e: String| anyhow!("--kv-dtype: {e}"))?;
    let cat = Catalog::builtin();
    let system = cat.resolve_system(&a.hardware)?;
    let base = Path::new(&a.hardware).parent();
    let cost = cat.cost_model(&system, base)?;
    if a.layout.tp == 0 {
        return Err(anyhow!("--tp 0: must be at least 1"));
    }
    let layout = a.layout.layout();
    let role = layout.role;
    let (seqs, tokens) = match role {
        Role::Decode => (a.seqs, 0),
        Role::Prefill => (0, a.tokens),
        Role::Mixed => (a.seqs, a.tokens),
    };
    if a.cached > 0 && tokens == 0 {
        return Err(anyhow!(
            "--cached {}: cached prompt tokens need prompt tokens this step (--tokens, role prefill or mixed)",
            a.cached
        ));
    }
    if role == Role::Prefill && tokens == 0 {
        return Err(anyhow!(
            "--tokens 0: a prefill step needs prompt tokens per DP rank"
        ));
    }
    let load = match &a.skew {
        Some(l) => Some(SkewedLoad {
            spec: skew_spec(l, a.concentration)?,
            policy: match &a.eplb {
                Some(p) => p.parse().map_err(|e: String| anyhow!("--eplb: {e}"))?,
                None => dstwin_core::eplb::Policy::engine_default(a.layout.redundant_experts > 0),
            },
        }),
        None => None,
    };
    let input = ExplainInput {
        model,
        quant,
        kv_dtype,
        cost,
        layout,
        batch: BatchSpec {
            decode_seqs: seqs,
            kv_len: if seqs > 0 { a.kv } else { 0 },
            prefill_tokens: tokens,
            prompt_len: if tokens > 0 { a.prompt } else { 0 },
            prompt_cached: if tokens > 0 { a.cached } else { 0 },
        },
        mtp: Mtp {
            tokens: a.mtp,
            acceptance: dstwin_twin::mtp::or_calibrated(a.mtp_accept.clone()),
        },
        moe_imbalance: a.imbalance,
        expert_skew: None,
        expert_concentration: 0.0,
        max_tokens_per_step: a.max_tokens,
        features: a.features.features(),
    };
    Ok((input, load))
}

pub fn run(a: ExplainArgs) -> Result<(), Failure> {
    let (input, load) = build_input(&a).map_err(Failure::Input)?;
    let report = explain_under(&input, load.as_ref()).map_err(|e| Failure::Input(e.into()))?;
    if a.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| Failure::Runtime(e.into()))?;
        outln!("{text}")?;
    } else {
        out!("{}", dstwin_sim::report::render_explain(&report))?;
    }
    Ok(())
}

pub fn catalog(json: bool) -> Result<(), Failure> {
    let cat = Catalog::builtin();
    if json {
        let v = serde_json::json!({
            "models": model::BUILTIN_MODELS,
            "quantizations": model::QUANTS,
            "systems": cat.systems().collect::<Vec<_>>(),
            "chips": cat.chips().collect::<Vec<_>>(),
        });
        outln!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| Failure::Runtime(e.into()))?
        )?;
        return Ok(());
    }
    outln!(
        "{:<20} {:>10} {:>10} {:>16}",
        "model",
        "total",
        "active",
        "KV/token (bf16)"
    )?;
    for name in model::BUILTIN_MODELS {
        let m = model::builtin(name).expect("listed models are built in");
        let kv = model::kv_bytes(
            &m,
            DType::Bf16,
            model::index_key_dtype(&m, DType::Bf16, false),
            0,
        );
        outln!(
            "{:<20} {:>9.2}B {:>9.2}B {:>13.1} KB",
            name,
            model::count(&m).total() as f64 / 1e9,
            model::active(&m) as f64 / 1e9,
            kv.per_token / 1e3
        )?;
    }
    outln!("quantizations: {}", model::QUANTS.join(", "))?;
    outln!()?;
    outln!(
        "{:<16} {:<14} {:>6} {:>10}  description",
        "system",
        "chip",
        "dies",
        "dies/node"
    )?;
    for s in cat.systems() {
        outln!(
            "{:<16} {:<14} {:>6} {:>10}  {}",
            s.name,
            s.chip.name,
            s.max_dies(),
            s.dies_per_node(),
            s.description
        )?;
    }
    Ok(())
}
