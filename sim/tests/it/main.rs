//! Behaviour of the simulator crate's inputs, one file per behaviour.

mod context_parallel;
mod eager;
mod fuzz_scenario;
mod memory_budget;
mod mtp_depth;
#[path = "../../../tests/common/mutate.rs"]
mod mutate;
mod paced_loop;
mod plan;
mod scenario_bounds;
mod step_draws;
mod workload_stream;

use dstwin_sim::scenario::{load_str, Scenario, ScenarioError};
use std::path::PathBuf;

/// The shipped scenarios' directory.
pub fn scenarios() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios")
}

/// The default scenario (a3-2p1d.toml) with `sets` applied.
pub fn default_with(sets: &[&str]) -> Result<Scenario, ScenarioError> {
    let dir = scenarios();
    let text = std::fs::read_to_string(dir.join("a3-2p1d.toml")).unwrap();
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    load_str("a3-2p1d.toml", &text, &dir, &sets)
}
