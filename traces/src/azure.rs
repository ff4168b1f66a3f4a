//! Azure LLM inference traces 2023 (Azure/AzurePublicDataset, `AzureLLMInferenceTrace_code` and
//! `_conv`): CSV with the header `TIMESTAMP,ContextTokens,GeneratedTokens`, e.g.
//!
//! ```text
//! TIMESTAMP,ContextTokens,GeneratedTokens
//! 2023-11-16 18:17:03.9799600,4808,10
//! ```
//!
//! Arrivals are offsets from the earliest row (the first row in the published files), so a
//! workload read from Azure starts at 0. The traces carry no prefix information: no hash ids.
//! Columns are found by name; extra columns are ignored.

use crate::error::TraceError;
use crate::reader::{csv_error, open, shown, token_count};
use crate::timestamp;
use crate::workload::{Workload, WorkloadBuilder};
use std::io::Read;
use std::path::Path;

const COL_TIMESTAMP: &str = "TIMESTAMP";
const COL_INPUT: &str = "ContextTokens";
const COL_OUTPUT: &str = "GeneratedTokens";

/// Reads an Azure 2023 CSV trace from a file; errors name the path and line.
pub fn from_path(path: impl AsRef<Path>) -> Result<Workload, TraceError> {
    let path = path.as_ref();
    from_reader(open(path)?, &path.display().to_string())
}

/// Reads an Azure 2023 CSV trace from any reader; `origin` labels errors and the workload's
/// source.
pub fn from_reader(reader: impl Read, origin: &str) -> Result<Workload, TraceError> {
    let mut rows = Rows::new(reader, origin)?;
    // Absolute times first: the offsets are taken from the earliest row once all are read.
    let mut all: Vec<RawRow> = Vec::new();
    while let Some(row) = rows.next_row()? {
        all.push(row);
    }
    let mut builder = WorkloadBuilder::new(format!("azure:{origin}"), None);
    let Some(start) = all.iter().map(|r| r.ts_ns).min() else {
        return builder.build();
    };
    for row in all {
        builder.push(row.offset_ns(start, origin)?, row.input, row.output, &[]);
    }
    builder.build()
}

/// One checked row: its absolute time, lengths and line number.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawRow {
    pub(crate) ts_ns: i128,
    pub(crate) input: u32,
    pub(crate) output: u32,
    pub(crate) line: u64,
}

impl RawRow {
    /// Nanoseconds from `start` to this row; an error naming the line when the row is earlier
    /// or beyond the clock.
    pub(crate) fn offset_ns(&self, start: i128, origin: &str) -> Result<u64, TraceError> {
        u64::try_from(self.ts_ns - start).map_err(|_| TraceError::BadField {
            origin: origin.to_owned(),
            line: self.line,
            field: COL_TIMESTAMP.to_owned(),
            value: format!("<{} ns after the earliest row>", self.ts_ns - start),
            reason: "the trace spans more than the u64 nanosecond clock (about 584 years)"
                .to_owned(),
        })
    }
}

/// Reads a trace one row at a time, in file order; memory is one row.
pub(crate) struct Rows<R> {
    csv: csv::Reader<R>,
    origin: String,
    record: csv::StringRecord,
    cols: (usize, usize, usize),
}

impl<R: Read> Rows<R> {
    /// Reads the header; fails when a column is missing.
    pub(crate) fn new(reader: R, origin: &str) -> Result<Rows<R>, TraceError> {
        let mut csv = csv::ReaderBuilder::new()
            .has_headers(true)
            .trim(csv::Trim::All)
            .from_reader(reader);
        let header = csv.headers().map_err(|e| csv_error(e, origin))?.clone();
        let column = |name: &str| {
            header
                .iter()
                .position(|h| h == name)
                .ok_or_else(|| TraceError::MissingColumn {
                    origin: origin.to_owned(),
                    column: name.to_owned(),
                    found: header.iter().collect::<Vec<_>>().join(","),
                })
        };
        let cols = (
            column(COL_TIMESTAMP)?,
            column(COL_INPUT)?,
            column(COL_OUTPUT)?,
        );
        Ok(Rows {
            csv,
            origin: origin.to_owned(),
            record: csv::StringRecord::new(),
            cols,
        })
    }

    /// The next row; `None` at the end of the file.
    pub(crate) fn next_row(&mut self) -> Result<Option<RawRow>, TraceError> {
        let origin = self.origin.as_str();
        let (ts_col, in_col, out_col) = self.cols;
        if !self
            .csv
            .read_record(&mut self.record)
            .map_err(|e| csv_error(e, origin))?
        {
            return Ok(None);
        }
        let record = &self.record;
        let line = record.position().map_or(0, |p| p.line());
        let field = |col: usize| record.get(col).unwrap_or_default();
        let bad = |name: &str, value: &str, reason: &str| TraceError::BadField {
            origin: origin.to_owned(),
            line,
            field: name.to_owned(),
            value: shown(value),
            reason: reason.to_owned(),
        };
        let tokens = |col: usize, name: &str| {
            let text = field(col);
            let n: u64 = text
                .parse()
                .map_err(|_| bad(name, text, "expected a whole number of tokens"))?;
            token_count(origin, line, name, n)
        };
        let ts_ns = timestamp::parse_ns(field(ts_col))
            .map_err(|reason| bad(COL_TIMESTAMP, field(ts_col), reason))?;
        Ok(Some(RawRow {
            ts_ns,
            input: tokens(in_col, COL_INPUT)?,
            output: tokens(out_col, COL_OUTPUT)?,
            line,
        }))
    }
}
