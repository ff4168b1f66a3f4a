//! Errors from loading and validating hardware and cost-model data.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum HwError {
    /// A data file is not valid TOML or has unknown/missing fields; fix the file.
    #[error("{file}: {message}")]
    Parse { file: String, message: String },
    /// A field has a value that cannot be right; the message names the field and value.
    #[error("{file}: {field} = {value}: {reason}")]
    Invalid {
        file: String,
        field: String,
        value: String,
        reason: String,
    },
    /// A name that is not in the catalog; the list says what is.
    #[error("unknown {kind} '{name}'; known: {known}")]
    Unknown {
        kind: &'static str,
        name: String,
        known: String,
    },
    #[error("reading {file}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
}

pub(crate) fn invalid(
    file: &str,
    field: impl Into<String>,
    value: impl ToString,
    reason: &str,
) -> HwError {
    HwError::Invalid {
        file: file.to_string(),
        field: field.into(),
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

/// `v` must lie in `lo..=hi` (`what`: the range as the error says it). Hardware and cost
/// figures are bounded to what hardware can be, so that no price they give overflows: a peak
/// of 1e-308 passed "positive" and priced every step at infinity.
pub(crate) fn check_range(
    file: &str,
    field: impl Into<String>,
    v: f64,
    (lo, hi): (f64, f64),
    what: &str,
) -> Result<(), HwError> {
    if v >= lo && v <= hi {
        return Ok(());
    }
    // A value far from the range in scientific notation (1e-308, not 308 digits).
    let shown = if v.is_finite() && v != 0.0 && !(1e-3..1e7).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        v.to_string()
    };
    Err(invalid(file, field, shown, &format!("must be {what}")))
}
