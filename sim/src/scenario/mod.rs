//! Scenario files (TOML): everything a simulation run needs, parsed strictly, then validated once
//! into a [`Scenario`] that the rest of the simulator takes.
//!
//! - `raw`: the file as written (serde structs with `deny_unknown_fields` and their defaults).
//! - `overrides`: `--set PATH=VALUE` applied to the parsed TOML before it is read.
//! - `validate`: raw to validated [`Scenario`], with the cross-field checks.

mod overrides;
mod raw;
mod validate;

pub use overrides::apply_overrides;
pub use raw::{
    AdmissionSpec, EplbSpec, InstanceSpec, MtpSpec, PreemptionSpec, ProxySpec, ScenarioFile,
    SchedulerSpec, SloSpec,
};

use dstwin_core::layout::{Layout, LayoutError, Plan, Role};
use dstwin_core::memory::{MemoryError, MemoryMap};
use dstwin_core::model::{self, ModelConfig, Quant};
use dstwin_core::time::SimDuration;
use dstwin_hwmodels::{CostModel, DType, HwError, System};
use dstwin_traces::spec::WorkloadPlan;
use dstwin_traces::TraceError;
use dstwin_twin::expert_load::ExpertLoadSpec;
use dstwin_twin::explain::Mtp;
use serde::Serialize;
use std::path::{Path, PathBuf};
use thiserror::Error;
use validate::validate;

/// Why a scenario cannot run.
#[derive(Debug, Error)]
pub enum ScenarioError {
    #[error("{file}: {message}")]
    Parse { file: String, message: String },
    #[error("{field} = {value}: {reason}")]
    Field {
        field: String,
        value: String,
        reason: String,
    },
    #[error("instance '{instance}'")]
    Layout {
        instance: String,
        #[source]
        source: LayoutError,
    },
    #[error("instance '{instance}'")]
    Memory {
        instance: String,
        #[source]
        source: MemoryError,
    },
    #[error(transparent)]
    Hardware(#[from] HwError),
    #[error(transparent)]
    Workload(#[from] TraceError),
    #[error("reading {file}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
}

fn field(
    field: impl Into<String>,
    value: impl ToString,
    reason: impl Into<String>,
) -> ScenarioError {
    ScenarioError::Field {
        field: field.into(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// A validated instance kind.
#[derive(Clone, Debug)]
pub struct InstanceSetup {
    pub name: String,
    pub count: u32,
    pub layout: Layout,
    pub plan: Plan,
    /// Engine mechanisms, resolved for this instance.
    pub features: dstwin_core::features::Resolved,
    pub placement: Option<String>,
    /// The EPLB policy placing this instance's experts ([`EplbSpec::policy_for`]; identity
    /// under MoE tensor parallelism, where there is nothing to place).
    pub eplb_policy: dstwin_core::eplb::Policy,
    pub scheduler: SchedulerSpec,
    pub memory: MemoryMap,
    pub kv_blocks_per_rank: u64,
    /// Longest prompt + output a request may have here.
    pub max_model_len: u64,
    /// MTP draft tokens per step here (the instance's `mtp_tokens`, else `[mtp] tokens`).
    pub mtp_tokens: u32,
}

/// Service-level objectives in time units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Slo {
    pub ttft: Option<SimDuration>,
    pub tpot: Option<SimDuration>,
    pub e2e: Option<SimDuration>,
}

/// A validated scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    pub seed: u64,
    pub model: ModelConfig,
    pub quant: Quant,
    pub kv_dtype: DType,
    pub cost: CostModel,
    pub mtp: Mtp,
    pub proxy: ProxySpec,
    pub instances: Vec<InstanceSetup>,
    pub eplb: EplbSpec,
    pub expert_load: ExpertLoadSpec,
    pub workload: WorkloadPlan,
    pub base_dir: PathBuf,
    pub slo: Slo,
    pub duration: Option<SimDuration>,
    /// Statistics start here.
    pub warmup: SimDuration,
    /// Front-end time added to every request's TTFT and end-to-end latency: the scenario's
    /// `frontend_us`, else the cost file's `[host] request_us`, else 0.
    pub frontend: SimDuration,
    /// FNV-1a of the scenario after overrides, as TOML: reports record it.
    pub hash: String,
    /// The scenario after overrides, as TOML.
    pub canonical: String,
}

impl Scenario {
    pub fn system(&self) -> &System {
        &self.cost.system
    }

    /// True when prefill and decode run on separate instances.
    pub fn disaggregated(&self) -> bool {
        self.instances.iter().any(|i| i.plan.role == Role::Prefill)
    }

    pub fn dies(&self) -> u32 {
        self.instances.iter().map(|i| i.count * i.plan.dies).sum()
    }

    /// Cards (packages) the deployment occupies: its dies over the system's dies per package.
    pub fn cards(&self) -> f64 {
        f64::from(self.dies()) / f64::from(self.system().dies_per_package())
    }
}

fn fnv1a(s: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The name part of a hub model id (`owner/name`, each part of letters, digits, `-`, `_`, `.`,
/// neither starting with a dot); None for anything else (a local path, ".", an empty string).
fn hub_model_name(id: &str) -> Option<String> {
    let (owner, name) = id.split_once('/')?;
    let part = |p: &str| {
        !p.is_empty()
            && !p.starts_with('.')
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    (part(owner) && part(name)).then(|| name.to_string())
}

/// The model's name of a file in the HuggingFace hub cache,
/// `models--OWNER--NAME/snapshots/HASH/config.json` (its directory is a commit hash, which
/// names nothing): NAME.
fn hub_cache_name(config: &Path) -> Option<String> {
    let snapshot = config.parent()?;
    let snapshots = snapshot.parent()?;
    if snapshots.file_name()? != "snapshots" {
        return None;
    }
    let repo = snapshots.parent()?.file_name()?.to_str()?;
    let (_, name) = repo.strip_prefix("models--")?.split_once("--")?;
    (!name.is_empty()).then(|| name.to_string())
}

/// A model by built-in name, or from a HuggingFace `config.json` when `spec` ends in `.json`
/// (relative paths resolve against `base_dir`). The error says what is built in.
pub fn load_model(spec: &str, base_dir: &Path) -> Result<ModelConfig, ScenarioError> {
    if spec.ends_with(".json") {
        let p = resolve(base_dir, spec);
        let text = std::fs::read_to_string(&p).map_err(|source| ScenarioError::Io {
            file: p.clone(),
            source,
        })?;
        // The model's name from the config: transformers' `_name_or_path` where it is a hub id
        // (`owner/name`: the checkpoint the weights came from, a fine-tune's base included),
        // else the directory's, as a server given the directory names it. A local path or "."
        // there names nothing.
        let saved = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("_name_or_path")?.as_str().and_then(hub_model_name));
        let name = saved
            .or_else(|| hub_cache_name(Path::new(&p)))
            .unwrap_or_else(|| {
                Path::new(&p)
                    .parent()
                    .and_then(|d| d.file_name())
                    .map_or_else(|| spec.to_string(), |n| n.to_string_lossy().into_owned())
            });
        ModelConfig::from_hf_json(&name, &text).map_err(|e| field("model", spec, e.to_string()))
    } else {
        model::builtin(spec).ok_or_else(|| {
            field(
                "model",
                spec,
                format!(
                    "unknown; built in: {}, or a path to a config.json",
                    model::BUILTIN_MODELS.join(", ")
                ),
            )
        })
    }
}

/// Parses scenario text, applies overrides and validates. `base_dir` resolves relative paths
/// (trace files, config.json, hardware files).
pub fn load_str(
    file: &str,
    text: &str,
    base_dir: &Path,
    sets: &[String],
) -> Result<Scenario, ScenarioError> {
    let parse_err = |e: &dyn std::fmt::Display| ScenarioError::Parse {
        file: file.to_string(),
        message: e.to_string(),
    };
    let mut doc: toml::Table = toml::from_str(text).map_err(|e| parse_err(&e))?;
    apply_overrides(&mut doc, sets)?;
    let canonical = toml::to_string(&doc).map_err(|e| parse_err(&e))?;
    let raw: ScenarioFile = toml::from_str(&canonical).map_err(|e| parse_err(&e))?;
    validate(raw, base_dir, canonical)
}

/// Reads and loads a scenario file.
pub fn load_path(path: &Path, sets: &[String]) -> Result<Scenario, ScenarioError> {
    let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Io {
        file: path.display().to_string(),
        source,
    })?;
    let base = path.parent().unwrap_or(Path::new("."));
    load_str(&path.display().to_string(), &text, base, sets)
}

fn resolve(base: &Path, p: &str) -> String {
    let path = Path::new(p);
    if path.is_relative() && (p.ends_with(".toml") || p.ends_with(".json")) {
        base.join(path).display().to_string()
    } else {
        p.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtp_without_acceptance_takes_the_calibrated_one() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
        let text = std::fs::read_to_string(dir.join("a3-2p1d.toml")).unwrap();
        let given = load_str("a3-2p1d.toml", &text, &dir, &[]).unwrap();
        assert_eq!(given.mtp.acceptance, vec![0.85, 0.6, 0.45]);
        let line = "acceptance = [0.85, 0.6, 0.45]\n";
        assert!(text.contains(line));
        let omitted = text.replace(line, "");
        let s = load_str("a3-2p1d.toml", &omitted, &dir, &[]).unwrap();
        assert_eq!(s.mtp.tokens, 3);
        assert_eq!(
            s.mtp.acceptance,
            vec![dstwin_twin::mtp::CALIBRATED_ACCEPTANCE]
        );
        // MTP off: no acceptance is made up.
        let off = load_str("a3-2p1d.toml", &omitted, &dir, &["mtp.tokens=0".into()]).unwrap();
        assert!(off.mtp.acceptance.is_empty());
    }
}
