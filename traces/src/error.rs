//! The crate's one error type. Every variant names where the problem is (file and line, or the
//! field path of a parameter) and the offending value, so the person who wrote the trace or the
//! scenario can fix it without reading code.

use std::io;

/// What went wrong while reading, generating or transforming a workload.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The trace could not be opened or read. Check the path and permissions.
    #[error("cannot read {origin}")]
    Io {
        /// The file path, or the label given for an in-memory reader.
        origin: String,
        #[source]
        source: io::Error,
    },

    /// A line is not a record at all (invalid JSON, a CSV row with the wrong number of columns).
    /// Fix or remove that line.
    #[error("{origin}:{line}: {reason}")]
    Syntax {
        origin: String,
        /// 1-based line number in the trace.
        line: u64,
        reason: String,
    },

    /// A record parsed, but one of its fields is missing or holds a value the twin cannot use.
    /// Fix that field on that line.
    #[error("{origin}:{line}: field `{field}` = {value}: {reason}")]
    BadField {
        origin: String,
        /// 1-based line number in the trace.
        line: u64,
        field: String,
        /// The value as written in the trace (`<missing>` when absent).
        value: String,
        reason: String,
    },

    /// A CSV trace lacks a required column. Check that the file is the trace format it is read as.
    #[error("{origin}: header has no `{column}` column (found: {found})")]
    MissingColumn {
        origin: String,
        column: String,
        /// The header as read, comma-separated.
        found: String,
    },

    /// The trace (or what was left of it after truncation) holds no request. A run needs at least
    /// one; check the file or widen the truncation.
    #[error("{origin}: no requests")]
    Empty { origin: String },

    /// A path is not a profile any reader knows (or a directory holds none). Check the path and
    /// the formats docs/calibration.md lists.
    #[error("{origin}: {reason}")]
    Unrecognized { origin: String, reason: String },

    /// A parameter (of a transformation, a distribution or a scenario field) is out of its domain.
    /// `field` is the full path as written in the scenario where known (`workload.arrival.rate`).
    #[error("invalid `{field}` = {value}: {reason}")]
    InvalidParameter {
        field: String,
        value: String,
        reason: String,
    },
}

impl TraceError {
    /// A parameter error for `field` holding `value`.
    pub(crate) fn invalid(
        field: impl Into<String>,
        value: impl ToString,
        reason: impl Into<String>,
    ) -> TraceError {
        TraceError::InvalidParameter {
            field: field.into(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }

    /// Prefixes the field path of a parameter error with `parent` (`std` -> `workload.input.std`),
    /// so that a check written once for a distribution names the scenario field it came from.
    /// Other errors pass through unchanged.
    pub fn within(self, parent: &str) -> TraceError {
        match self {
            TraceError::InvalidParameter {
                field,
                value,
                reason,
            } if !parent.is_empty() => TraceError::InvalidParameter {
                field: format!("{parent}.{field}"),
                value,
                reason,
            },
            other => other,
        }
    }
}

/// Checks that `value` is a finite number greater than zero.
pub(crate) fn positive_finite(field: &str, value: f64) -> Result<f64, TraceError> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(TraceError::invalid(
            field,
            value,
            "must be a finite number greater than zero",
        ))
    }
}

/// Checks that `value` is a finite number greater than or equal to zero.
pub(crate) fn non_negative_finite(field: &str, value: f64) -> Result<f64, TraceError> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(TraceError::invalid(
            field,
            value,
            "must be a finite number of zero or more",
        ))
    }
}
