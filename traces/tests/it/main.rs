//! Behaviour of the traces crate, one file per behaviour.

mod azure;
mod fuzz_readers;
mod mooncake;
#[path = "../../../tests/common/mutate.rs"]
mod mutate;
mod profile;
mod spec;
mod stats;
mod synthetic;
mod transform;

use std::path::PathBuf;

/// A fixture under `tests/data/`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}
