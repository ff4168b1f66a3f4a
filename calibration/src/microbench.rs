//! What every microbenchmark fit shares ([`crate::micro`]'s all-to-all and MTP fits,
//! [`crate::v4_kernels`]' fused kernels): its error and one residual row. A module of its own
//! so that the two fits need not import each other.

use serde::Serialize;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum MicroError {
    #[error("{file}: {message}")]
    Parse { file: String, message: String },
    #[error("microbenchmark {id}: {message}")]
    Block { id: String, message: String },
    #[error("cost model {0}: too few points to fit its all-to-all parameters")]
    TooFew(String),
}

/// One microbenchmark point against a cost model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MicroResidual {
    pub id: String,
    /// e.g. "dispatch_us EP8" or "combine_gb_s EP64".
    pub metric: String,
    pub published: f64,
    pub predicted: f64,
    pub error: f64,
    pub bound: f64,
}
