//! What the trace readers share: opening a path, labelling errors, showing bad values.

use crate::error::TraceError;
use std::fs::File;
use std::path::Path;

/// Longest excerpt of a bad value quoted in an error; a whole hash-id list would drown the message.
const MAX_SHOWN_CHARS: usize = 60;

/// Opens `path` for a reader, turning failure into an error that names the path.
pub(crate) fn open(path: &Path) -> Result<File, TraceError> {
    File::open(path).map_err(|source| TraceError::Io {
        origin: path.display().to_string(),
        source,
    })
}

/// `text` cut to a readable length for an error message.
pub(crate) fn shown(text: &str) -> String {
    match text.char_indices().nth(MAX_SHOWN_CHARS) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}

/// Checks a token count read from line `line` of `origin`: at least 1 and fits in `u32`.
pub(crate) fn token_count(
    origin: &str,
    line: u64,
    field: &str,
    value: u64,
) -> Result<u32, TraceError> {
    let bad = |reason: &str| TraceError::BadField {
        origin: origin.to_owned(),
        line,
        field: field.to_owned(),
        value: value.to_string(),
        reason: reason.to_owned(),
    };
    match u32::try_from(value) {
        Ok(0) => Err(bad("a request needs at least 1 token")),
        Ok(n) => Ok(n),
        Err(_) => Err(bad("more tokens than the twin supports (u32)")),
    }
}

/// A CSV reader error as a trace error naming the line.
pub(crate) fn csv_error(err: csv::Error, origin: &str) -> TraceError {
    let line = err.position().map_or(0, |p| p.line());
    let message = err.to_string();
    match err.into_kind() {
        csv::ErrorKind::Io(source) => TraceError::Io {
            origin: origin.to_owned(),
            source,
        },
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => TraceError::Syntax {
            origin: origin.to_owned(),
            line,
            reason: format!("row has {len} fields, the header has {expected_len}"),
        },
        _ => TraceError::Syntax {
            origin: origin.to_owned(),
            line,
            reason: message,
        },
    }
}
