//! `--set PATH=VALUE` overrides, applied to the parsed TOML before it is read.

use super::{field, ScenarioError};

/// Applies `path=value` overrides to a parsed scenario. The first path segment names a top-level
/// table or an instance (`decode.max_num_seqs=64` finds `max_num_seqs` in the instance named
/// `decode`, in its table or its `scheduler` table). Values are TOML (`64`, `true`, `"x"`); bare
/// words are taken as strings.
pub fn apply_overrides(doc: &mut toml::Table, sets: &[String]) -> Result<(), ScenarioError> {
    for s in sets {
        let (path, raw) = s.split_once('=').ok_or_else(|| {
            field(
                "--set",
                s,
                "expected PATH=VALUE, e.g. decode.max_num_seqs=64",
            )
        })?;
        let value: toml::Value = match toml::from_str::<toml::Table>(&format!("v = {raw}")) {
            Ok(mut t) => t.remove("v").expect("parsed the key just written"),
            Err(_) => toml::Value::String(raw.to_string()),
        };
        let parts: Vec<&str> = path.split('.').collect();
        let not_found = || {
            field(
                "--set",
                s,
                "no such field in the scenario (see docs/scenarios.md)",
            )
        };
        // An instance name first?
        if parts.len() >= 2 {
            if let Some(instances) = doc.get_mut("instance").and_then(toml::Value::as_array_mut) {
                if let Some(inst) = instances
                    .iter_mut()
                    .filter_map(toml::Value::as_table_mut)
                    .find(|t| t.get("name").and_then(toml::Value::as_str) == Some(parts[0]))
                {
                    let rest = &parts[1..];
                    let target = if rest.len() == 1 && !is_instance_key(rest[0]) {
                        inst.entry("scheduler")
                            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                            .as_table_mut()
                            .ok_or_else(not_found)?
                    } else {
                        inst
                    };
                    set_path(target, rest, value).ok_or_else(not_found)?;
                    continue;
                }
            }
        }
        set_path(doc, &parts, value).ok_or_else(not_found)?;
    }
    Ok(())
}

fn is_instance_key(k: &str) -> bool {
    matches!(
        k,
        "name"
            | "role"
            | "count"
            | "dies"
            | "tp"
            | "dp"
            | "ep"
            | "dense_tp"
            | "redundant_experts"
            | "shared_expert_dies"
            | "two_microbatch"
            | "shared_expert_overlap"
            | "moe_comm"
            | "cudagraph_mode"
            | "cudagraph_capture_sizes"
            | "flashcomm1"
            | "mlapo"
            | "attention_per_sequence"
            | "enforce_eager"
            | "enable_dsa_cp"
            | "gpu_memory_utilization"
            | "mem_fraction_static"
            | "placement"
            | "scheduler"
    )
}

fn set_path(t: &mut toml::Table, parts: &[&str], v: toml::Value) -> Option<()> {
    let (last, head) = parts.split_last()?;
    let mut cur = t;
    for p in head {
        cur = cur
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()?;
    }
    cur.insert(last.to_string(), v);
    Some(())
}
