//! Mooncake FAST'25 traces (kvcache-ai/Mooncake): JSON Lines, one request per line,
//!
//! ```text
//! {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]}
//! ```
//!
//! `timestamp` is the arrival in milliseconds from the start of the trace (kept as is, not
//! shifted to zero), `hash_ids` holds one id per 512-token block of the prompt, chained so that
//! equal ids mean an equal prefix up to and including that block. `hash_ids` may be absent (no
//! prefix information); when present it must have exactly one id per started block. Blank lines
//! are skipped; other fields are ignored.

use crate::error::TraceError;
use crate::reader::{open, shown, token_count};
use crate::workload::{Workload, WorkloadBuilder};
use serde::Deserialize;
use serde_json::{Number, Value};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

/// Prompt tokens per hash id in the Mooncake traces: the block size of the Mooncake technical
/// report (arXiv 2407.00079, section 4), and the only one consistent with the published FAST'25
/// traces, where every line of the conversation and synthetic traces carries exactly
/// `ceil(input_length / 512)` ids.
pub const MOONCAKE_BLOCK_TOKENS: u32 = 512;

const NS_PER_MS: u64 = 1_000_000;

#[derive(Deserialize)]
struct Row {
    timestamp: Number,
    input_length: u64,
    output_length: u64,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

/// Reads a Mooncake JSONL trace from a file; errors name the path and line.
pub fn from_path(path: impl AsRef<Path>) -> Result<Workload, TraceError> {
    let path = path.as_ref();
    from_reader(open(path)?, &path.display().to_string())
}

/// Reads a Mooncake JSONL trace from any reader; `origin` labels errors and the workload's
/// source (a file name, or e.g. `"<test>"`).
pub fn from_reader(reader: impl Read, origin: &str) -> Result<Workload, TraceError> {
    let mut rows = Rows::new(BufReader::new(reader), origin);
    let mut builder =
        WorkloadBuilder::new(format!("mooncake:{origin}"), Some(MOONCAKE_BLOCK_TOKENS));
    let mut hash_ids = Vec::new();
    while let Some(row) = rows.next_row(&mut hash_ids)? {
        builder.push(row.arrival_ns, row.input, row.output, &hash_ids);
    }
    builder.build()
}

/// One checked line of a trace: arrival as written (not shifted), lengths, and its line number.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawRow {
    pub(crate) arrival_ns: u64,
    pub(crate) input: u32,
    pub(crate) output: u32,
    pub(crate) line: u64,
}

/// Reads a trace one line at a time, in file order; memory is one line and its hash ids.
pub(crate) struct Rows<R> {
    reader: R,
    origin: String,
    buf: Vec<u8>,
    line: u64,
}

impl<R: BufRead> Rows<R> {
    pub(crate) fn new(reader: R, origin: &str) -> Rows<R> {
        Rows {
            reader,
            origin: origin.to_owned(),
            buf: Vec::new(),
            line: 0,
        }
    }

    /// The next request, its hash ids left in `hash_ids`; `None` at the end of the file.
    pub(crate) fn next_row(
        &mut self,
        hash_ids: &mut Vec<u64>,
    ) -> Result<Option<RawRow>, TraceError> {
        let origin = self.origin.as_str();
        loop {
            self.buf.clear();
            let read = self
                .reader
                .read_until(b'\n', &mut self.buf)
                .map_err(|source| TraceError::Io {
                    origin: origin.to_owned(),
                    source,
                })?;
            if read == 0 {
                return Ok(None);
            }
            self.line += 1;
            let line = self.line;
            let text = self.buf.trim_ascii();
            if text.is_empty() {
                continue;
            }
            let row: Row =
                serde_json::from_slice(text).map_err(|err| diagnose(text, &err, origin, line))?;
            let arrival_ns = arrival_ns(&row.timestamp).ok_or_else(|| TraceError::BadField {
                origin: origin.to_owned(),
                line,
                field: "timestamp".to_owned(),
                value: row.timestamp.to_string(),
                reason: "expected milliseconds since the start of the trace, 0 or more".to_owned(),
            })?;
            let input = token_count(origin, line, "input_length", row.input_length)?;
            let output = token_count(origin, line, "output_length", row.output_length)?;
            let blocks = input.div_ceil(MOONCAKE_BLOCK_TOKENS) as usize;
            if !row.hash_ids.is_empty() && row.hash_ids.len() != blocks {
                return Err(TraceError::BadField {
                    origin: origin.to_owned(),
                    line,
                    field: "hash_ids".to_owned(),
                    value: format!("<{} ids>", row.hash_ids.len()),
                    reason: format!(
                        "input_length {input} needs {blocks} ids, one per {MOONCAKE_BLOCK_TOKENS}-token block"
                    ),
                });
            }
            hash_ids.clear();
            hash_ids.extend_from_slice(&row.hash_ids);
            return Ok(Some(RawRow {
                arrival_ns,
                input,
                output,
                line,
            }));
        }
    }
}

/// Milliseconds (integer or fractional, not negative) to nanoseconds.
fn arrival_ns(ms: &Number) -> Option<u64> {
    if let Some(ms) = ms.as_u64() {
        return ms.checked_mul(NS_PER_MS);
    }
    let ns = ms.as_f64()? * NS_PER_MS as f64;
    (ns >= 0.0 && ns < u64::MAX as f64).then(|| ns.round() as u64)
}

/// A required field, the test its value must pass, and what to say when it does not.
type FieldCheck = (&'static str, fn(&Value) -> bool, &'static str);

/// Explains why a line failed the typed parse: which field is missing or has the wrong type.
/// Only runs on the error path, so the common path parses each line once.
fn diagnose(text: &[u8], err: &serde_json::Error, origin: &str, line: u64) -> TraceError {
    let syntax = |reason: String| TraceError::Syntax {
        origin: origin.to_owned(),
        line,
        reason,
    };
    let value: Value = match serde_json::from_slice(text) {
        Ok(v) => v,
        Err(e) => return syntax(format!("not valid JSON: {e}")),
    };
    let Some(object) = value.as_object() else {
        return syntax(format!(
            "expected a JSON object, found `{}`",
            shown(&value.to_string())
        ));
    };
    let bad = |field: &str, value: String, reason: &str| TraceError::BadField {
        origin: origin.to_owned(),
        line,
        field: field.to_owned(),
        value,
        reason: reason.to_owned(),
    };
    let checks: [FieldCheck; 3] = [
        (
            "timestamp",
            Value::is_number,
            "expected a number of milliseconds",
        ),
        (
            "input_length",
            Value::is_u64,
            "expected a whole number of tokens",
        ),
        (
            "output_length",
            Value::is_u64,
            "expected a whole number of tokens",
        ),
    ];
    for (field, ok, reason) in checks {
        match object.get(field) {
            None => return bad(field, "<missing>".to_owned(), "required field is absent"),
            Some(v) if !ok(v) => return bad(field, shown(&v.to_string()), reason),
            Some(_) => {}
        }
    }
    if let Some(ids) = object.get("hash_ids") {
        let all_ids = ids.as_array().is_some_and(|a| a.iter().all(Value::is_u64));
        if !all_ids {
            return bad(
                "hash_ids",
                shown(&ids.to_string()),
                "expected a list of non-negative integers",
            );
        }
    }
    syntax(err.to_string())
}
