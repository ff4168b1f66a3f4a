//! dstwin-hwmodels: the hardware catalog as data with provenance, and the cost model.
//!
//! Module map:
//! - [`dtype`]: numeric formats and their sizes.
//! - [`chip`]: accelerator chips (peak per format, HBM) per die.
//! - [`system`]: nodes, supernodes and the fabric levels joining them; which level a group spans.
//! - [`cost`]: op classes, the roofline-with-efficiency compute model and the collective model.
//! - [`catalog`]: the built-in data files (`data/`) and loading of users' own files.
//! - [`error`]: what can go wrong loading data.
//!
//! Every number lives in `data/*.toml` next to its source; this crate has no hidden constants.

pub mod catalog;
pub mod chip;
pub mod cost;
pub mod dtype;
pub mod error;
pub mod system;

pub use catalog::Catalog;
pub use chip::Chip;
pub use cost::{
    A2aMode, AllToAllParams, Bound, Comm, CommKind, Cost, CostModel, CostParams, Efficiency,
    HostParams, KernelParams, OneRow, OpClass, Resource, Work,
};
pub use dtype::DType;
pub use error::HwError;
pub use system::{FabricLevel, Scope, System};
