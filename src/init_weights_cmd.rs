//! `dstwin init-weights`: a DeepSeek-V3-shaped checkpoint with random weights for the CPU
//! engine's tests and demos (config.json, model.safetensors, tokenizer.json).

use crate::output::outln;
use crate::Failure;
use anyhow::{anyhow, Context};
use clap::Args;
use dstwin_cpu::init::{checkpoint, preset_config, PRESETS};
use dstwin_cpu::LoadError;
use std::path::PathBuf;

#[derive(Args, Debug)]
#[command(
    after_help = "Writes DIR/config.json, DIR/model.safetensors (bf16) and DIR/tokenizer.json. The same seed and shape give byte-identical files.\n\nExamples:\n  dstwin init-weights --preset tiny --seed 1 --out tiny-model\n  dstwin init-weights --config my-config.json --seed 7 --out my-model\n\nExit codes: 0 ok, 1 the files could not be written, 2 bad arguments or config (the message names the field)."
)]
pub struct InitWeightsArgs {
    /// A built-in shape: tiny (hidden 256, 4 layers, 16 experts, 1 MTP layer, a few MB).
    #[arg(long, conflicts_with = "config", required_unless_present = "config")]
    preset: Option<String>,
    /// A HF config.json of DeepseekV3ForCausalLM giving any shape (test-sized: at most 2^30
    /// parameters).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Seed of the weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Directory to write (created if missing).
    #[arg(long)]
    out: PathBuf,
}

pub fn run(a: InitWeightsArgs) -> Result<(), Failure> {
    let config = match (&a.preset, &a.config) {
        (Some(p), _) => preset_config(p).ok_or_else(|| {
            Failure::Input(anyhow!(
                "--preset {p}: unknown (known: {})",
                PRESETS.join(", ")
            ))
        })?,
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--config {}", path.display()))
                .map_err(Failure::Input)?;
            serde_json::from_str(&text)
                .with_context(|| format!("--config {}: not JSON", path.display()))
                .map_err(Failure::Input)?
        }
        (None, None) => return Err(Failure::Input(anyhow!("give --preset or --config"))),
    };
    let (cfg, files) = checkpoint(&config, a.seed).map_err(|e| match e {
        LoadError::Io { .. } => Failure::Runtime(anyhow!(e)),
        e => Failure::Input(anyhow!(e)),
    })?;
    std::fs::create_dir_all(&a.out)
        .with_context(|| format!("creating {}", a.out.display()))
        .map_err(Failure::Runtime)?;
    // Each file whole or not at all: a full disk leaves no truncated checkpoint file.
    for (name, bytes) in files {
        crate::output::write_file(&a.out.join(name), &bytes)?;
    }
    outln!(
        "wrote {}: {} layers + {} MTP, hidden {}, {} routed experts, vocab {}, seed {}",
        a.out.display(),
        cfg.layers,
        cfg.mtp_layers,
        cfg.hidden,
        cfg.routed_experts,
        cfg.vocab,
        a.seed
    )
}
