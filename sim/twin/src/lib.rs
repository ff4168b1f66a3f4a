//! dstwin-twin: the twin device. It implements `dstwin_core::device::Device` by pricing each
//! step plan with the op graph and the hardware cost model instead of running it.
//!
//! Module map:
//! - [`device`]: `SimDevice` (memoized step pricing, lockstep, MTP acceptance draws, host time,
//!   expert imbalance and the price of moving experts).
//! - [`fabric`]: `TwinFabric`, KV links shared by concurrent transfers (processor sharing).
//! - [`pricer`]: the price cache (`StepPricer`): a rank's step price, memoized by its key.
//! - [`pricekey`]: the price cache's key (quantized shape sums, group tokens, imbalance).
//! - `keymap`: the price tables' open-addressing map, whose lookups can be prefetched.
//! - [`pricing`]: prices an op list with the cost model; critical path; two-micro-batch overlap.
//! - [`expert_load`]: the routed-expert load (the fitted default, log-normal, Zipf, replayed heat
//!   maps), its drift, the imbalance of a placement and the per-batch fluctuation of routing.
//! - [`explain`]: one step of one instance, priced and broken down (`dstwin explain`).
//! - [`spread`]: `StepSpread`, each step's kernel time drawn around its price.

pub mod device;
pub mod expert_load;
pub mod explain;
pub mod fabric;
mod keymap;
pub mod mtp;
pub mod pricekey;
pub mod pricer;
pub mod pricing;
pub mod spread;
