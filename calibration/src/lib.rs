//! dstwin-calibration: profiler kernels -> op classes -> fitted cost-model parameters.
//!
//! Not built yet: the cost-model parameters in `hwmodels/data/costs/*.toml` are, for now, fitted
//! by the least-squares fits their comments describe, against the microbenchmarks in the
//! project's calibration anchors (see docs/hardware.md). This crate will hold those fits as code
//! (`dstwin calibrate`) and the mapping from profiler kernel names to op-graph op names.
