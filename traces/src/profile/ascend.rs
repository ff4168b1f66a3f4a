//! The Ascend profilers' CSV summaries.
//!
//! **Kernel tables**: torch_npu's `kernel_details.csv` and msprof's `op_summary_*.csv`, one row
//! per task. The same table comes under two naming schemes and two header generations:
//!
//! | meaning | torch_npu `kernel_details.csv` | msprof `op_summary_*.csv` |
//! |---|---|---|
//! | name | `Name` | `Op Name` |
//! | op type | `Type` | `OP Type` |
//! | core | `Accelerator Core` | `Task Type` |
//! | start, µs | `Start Time(us)` | `Task Start Time(us)` |
//! | duration, µs | `Duration(us)` | `Task Duration(us)` |
//! | cores used | `Block Dim` (older CANN) / `Block Num` (newer) | the same |
//!
//! Newer generations add `Device_id` and write `Step ID` for `Step Id`; both forms are
//! accepted (the CANN profiling guide's field tables of both generations, and torch_npu's
//! `csv_headers.py` / `_csv_headers.py`). Optional columns read when present: `Step Id`,
//! `Device_id`, `Stream ID`, `Input Shapes`, `Input Data Types`. Other columns are ignored.
//! Collectives are rows whose name starts with `hcom_`; their bytes come from
//! `communication.json` when a directory is read.
//!
//! **`op_statistic.csv`**: one row per op type, `OP Type`, `Core Type`, `Count`,
//! `Total Time(us)` (plus min, average, max and ratio, ignored): read as one aggregated record
//! per row (`calls` = `Count`, no start).
//!
//! Rows are read one at a time; errors name the file and line.

use super::number::{decimal_ns, US};
use super::{KernelRecord, Names, Profile, ProfileFormat};
use crate::error::TraceError;
use crate::reader::{csv_error, open, shown};
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

/// Which naming scheme and generation a kernel table's header is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelTableHeader {
    /// torch_npu `kernel_details.csv` with `Block Dim` (older CANN).
    KernelDetailsBlockDim,
    /// torch_npu `kernel_details.csv` with `Block Num` (newer CANN).
    KernelDetailsBlockNum,
    /// msprof `op_summary_*.csv` (either generation).
    OpSummary,
}

/// A column by its accepted names.
struct Column {
    names: &'static [&'static str],
}

const NAME: Column = Column {
    names: &["Name", "Op Name"],
};
const TYPE: Column = Column {
    names: &["Type", "OP Type"],
};
const START: Column = Column {
    names: &["Start Time(us)", "Task Start Time(us)"],
};
const DURATION: Column = Column {
    names: &["Duration(us)", "Task Duration(us)"],
};
const STEP: Column = Column {
    names: &["Step Id", "Step ID"],
};
const DEVICE: Column = Column {
    names: &["Device_id", "Device ID", "Device Id"],
};
const STREAM: Column = Column {
    names: &["Stream ID", "Stream Id"],
};
const SHAPES: Column = Column {
    names: &["Input Shapes"],
};
const DTYPES: Column = Column {
    names: &["Input Data Types"],
};
const STAT_TYPE: Column = Column {
    names: &["OP Type", "Op Type"],
};
const STAT_COUNT: Column = Column { names: &["Count"] };
const STAT_TOTAL: Column = Column {
    names: &["Total Time(us)"],
};

/// The header of a CSV and the reader around it.
struct Table<R> {
    csv: csv::Reader<R>,
    origin: String,
    header: csv::StringRecord,
    record: csv::StringRecord,
}

impl<R: Read> Table<R> {
    fn new(reader: R, origin: &str) -> Result<Table<R>, TraceError> {
        let mut csv = csv::ReaderBuilder::new()
            .has_headers(true)
            .trim(csv::Trim::All)
            .from_reader(reader);
        let header = csv.headers().map_err(|e| csv_error(e, origin))?.clone();
        Ok(Table {
            csv,
            origin: origin.to_owned(),
            header,
            record: csv::StringRecord::new(),
        })
    }

    fn find(&self, c: &Column) -> Option<usize> {
        // The first column may carry a UTF-8 byte-order mark (Excel-friendly exports).
        self.header
            .iter()
            .position(|h| c.names.contains(&h.trim_start_matches('\u{feff}')))
    }

    fn require(&self, c: &Column) -> Result<usize, TraceError> {
        self.find(c).ok_or_else(|| TraceError::MissingColumn {
            origin: self.origin.clone(),
            column: c.names.join("` or `"),
            found: self.header.iter().collect::<Vec<_>>().join(","),
        })
    }

    fn has(&self, name: &str) -> bool {
        self.header.iter().any(|h| h == name)
    }

    /// Advances to the next row; its line, or `None` at the end.
    fn next(&mut self) -> Result<Option<u64>, TraceError> {
        if !self
            .csv
            .read_record(&mut self.record)
            .map_err(|e| csv_error(e, &self.origin))?
        {
            return Ok(None);
        }
        Ok(Some(self.record.position().map_or(0, |p| p.line())))
    }

    fn get(&self, col: Option<usize>) -> Option<&str> {
        col.and_then(|c| self.record.get(c))
            .filter(|v| !v.is_empty() && *v != "N/A")
    }

    fn bad(&self, line: u64, col: usize, value: &str, reason: &str) -> TraceError {
        TraceError::BadField {
            origin: self.origin.clone(),
            line,
            field: self.header.get(col).unwrap_or_default().to_owned(),
            value: shown(value),
            reason: reason.to_owned(),
        }
    }

    fn time(&self, line: u64, col: usize) -> Result<u64, TraceError> {
        let v = self.record.get(col).unwrap_or_default();
        decimal_ns(v, US).map_err(|reason| self.bad(line, col, v, reason))
    }

    /// A whole number in an optional column: absent or `N/A` is `None`, text is an error.
    fn count(&self, line: u64, col: Option<usize>) -> Result<Option<u64>, TraceError> {
        match self.get(col) {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| self.bad(line, col.unwrap_or(0), v, "expected a whole number")),
        }
    }
}

/// Reads a kernel table (`kernel_details.csv`, `op_summary_*.csv`) from a file.
pub fn kernel_details_from_path(path: impl AsRef<Path>) -> Result<Profile, TraceError> {
    let path = path.as_ref();
    kernel_details_from_reader(open(path)?, &path.display().to_string())
}

/// Reads a kernel table from any reader; `origin` labels errors and the profile.
pub fn kernel_details_from_reader(reader: impl Read, origin: &str) -> Result<Profile, TraceError> {
    let mut t = Table::new(reader, origin)?;
    let header = kernel_table_header(&t);
    let (name, start, dur) = (t.require(&NAME)?, t.require(&START)?, t.require(&DURATION)?);
    let (ty, step, device, stream) = (
        t.find(&TYPE),
        t.find(&STEP),
        t.find(&DEVICE),
        t.find(&STREAM),
    );
    let (shapes, dtypes) = (t.find(&SHAPES), t.find(&DTYPES));
    let mut p = Profile::new(origin, ProfileFormat::KernelDetailsCsv);
    p.notes.insert("header".into(), format!("{header:?}"));
    let mut names = Names::default();
    while let Some(line) = t.next()? {
        let n = t.record.get(name).unwrap_or_default();
        if n.is_empty() {
            return Err(t.bad(line, name, n, "a kernel needs a name"));
        }
        let mut k = KernelRecord::new(
            names.get(n),
            Some(t.time(line, start)?),
            t.time(line, dur)?,
            line,
        );
        k.op_type = t.get(ty).map(|v| names.get(v));
        k.step = t.count(line, step)?;
        k.device = narrow(&t, line, device)?;
        k.stream = narrow(&t, line, stream)?;
        k.shapes = t.get(shapes).map(str::to_owned);
        k.dtypes = t.get(dtypes).map(str::to_owned);
        if n.starts_with("hcom_") {
            k.comm = Some(Default::default());
        }
        p.kernels.push(k);
    }
    p.sort();
    Ok(p)
}

/// A device or stream id column: a whole number that fits u32.
fn narrow<R: Read>(t: &Table<R>, line: u64, col: Option<usize>) -> Result<Option<u32>, TraceError> {
    match t.count(line, col)? {
        None => Ok(None),
        Some(v) => u32::try_from(v).map(Some).map_err(|_| {
            t.bad(
                line,
                col.unwrap_or(0),
                &v.to_string(),
                "must fit in 32 bits",
            )
        }),
    }
}

fn kernel_table_header<R: Read>(t: &Table<R>) -> KernelTableHeader {
    if t.has("Op Name") || t.has("Task Duration(us)") {
        KernelTableHeader::OpSummary
    } else if t.has("Block Num") {
        KernelTableHeader::KernelDetailsBlockNum
    } else {
        KernelTableHeader::KernelDetailsBlockDim
    }
}

/// Reads `op_statistic.csv` from a file.
pub fn op_statistic_from_path(path: impl AsRef<Path>) -> Result<Profile, TraceError> {
    let path = path.as_ref();
    op_statistic_from_reader(open(path)?, &path.display().to_string())
}

/// Reads `op_statistic.csv` from any reader: one aggregated record per op type.
pub fn op_statistic_from_reader(reader: impl Read, origin: &str) -> Result<Profile, TraceError> {
    let mut t = Table::new(reader, origin)?;
    let (ty, count, total) = (
        t.require(&STAT_TYPE)?,
        t.require(&STAT_COUNT)?,
        t.require(&STAT_TOTAL)?,
    );
    let device = t.find(&DEVICE);
    let mut p = Profile::new(origin, ProfileFormat::OpStatisticCsv);
    let mut names = Names::default();
    while let Some(line) = t.next()? {
        let n = t.record.get(ty).unwrap_or_default();
        if n.is_empty() {
            return Err(t.bad(line, ty, n, "a row needs an op type"));
        }
        let name: Arc<str> = names.get(n);
        let mut k = KernelRecord::new(name.clone(), None, t.time(line, total)?, line);
        k.op_type = Some(name);
        k.calls = t
            .count(line, Some(count))?
            .ok_or_else(|| t.bad(line, count, "", "expected a whole number"))?;
        k.device = narrow(&t, line, device)?;
        if n.starts_with("hcom_") {
            k.comm = Some(Default::default());
        }
        p.kernels.push(k);
    }
    p.sort();
    Ok(p)
}

/// Whether a CSV header is an op statistics table (else a kernel table).
pub(crate) fn is_op_statistic(header_line: &str) -> bool {
    header_line.contains("Total Time(us)") && header_line.contains("Count")
}
