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
