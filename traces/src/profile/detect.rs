//! Which reader a path needs, and a torch_npu output directory read as one profile.
//!
//! - a directory: torch_npu's output (`ASCEND_PROFILER_OUTPUT`, or a directory holding it).
//!   Kernels come from `kernel_details.csv`, else from `trace_view.json`, else from
//!   `op_statistic.csv`; step markers from `trace_view.json`; each collective of
//!   `communication.json` gives its bytes and group to the kernel of the same name and step (in
//!   order of appearance). When the kernels hold no collective at all, the communication
//!   records are added as kernels; otherwise one without a matching kernel is counted in
//!   `skipped` ("communication op without a kernel"), never added twice.
//! - `*communication*.json`: [`communication`](super::communication);
//! - other `*.json`: [`chrome`](super::chrome);
//! - `*.csv`: `op_statistic` when its header has `Count` and `Total Time(us)`, else a kernel
//!   table ([`ascend`](super::ascend)).

use super::{ascend, chrome, communication, Profile, ProfileFormat};
use crate::error::TraceError;
use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const OUTPUT_DIR: &str = "ASCEND_PROFILER_OUTPUT";
const KERNEL_DETAILS: &str = "kernel_details.csv";
const TRACE_VIEW: &str = "trace_view.json";
const OP_STATISTIC: &str = "op_statistic.csv";
const COMMUNICATION: &str = "communication.json";
/// Longest CSV header read to tell the tables apart.
const MAX_HEADER_BYTES: u64 = 64 * 1024;

/// Reads every path (files or torch_npu directories), in order.
pub fn read_paths(paths: &[PathBuf]) -> Result<Vec<Profile>, TraceError> {
    paths.iter().map(read_path).collect()
}

/// Reads a profile from a file or a torch_npu output directory, choosing the reader by name and
/// header.
pub fn read_path(path: impl AsRef<Path>) -> Result<Profile, TraceError> {
    let path = path.as_ref();
    let origin = path.display().to_string();
    if path.is_dir() {
        return read_dir(path);
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    if name.ends_with(".json") {
        if name.contains("communication") {
            communication::from_path(path)
        } else {
            chrome::from_path(path)
        }
    } else if name.ends_with(".csv") {
        if ascend::is_op_statistic(&header_line(path)?) {
            ascend::op_statistic_from_path(path)
        } else {
            ascend::kernel_details_from_path(path)
        }
    } else {
        Err(TraceError::Unrecognized {
            origin,
            reason: "not a profile: give a .json trace, a .csv kernel table or a torch_npu output directory"
                .into(),
        })
    }
}

fn header_line(path: &Path) -> Result<String, TraceError> {
    let io = |source| TraceError::Io {
        origin: path.display().to_string(),
        source,
    };
    let f = std::fs::File::open(path).map_err(io)?;
    let mut line = Vec::new();
    BufReader::new(f)
        .take(MAX_HEADER_BYTES)
        .read_until(b'\n', &mut line)
        .map_err(io)?;
    Ok(String::from_utf8_lossy(&line).into_owned())
}

fn read_dir(dir: &Path) -> Result<Profile, TraceError> {
    let inner = dir.join(OUTPUT_DIR);
    let base = if inner.is_dir() {
        inner
    } else {
        dir.to_path_buf()
    };
    let file = |name: &str| Some(base.join(name)).filter(|p| p.is_file());
    let trace_view = file(TRACE_VIEW).map(chrome::from_path).transpose()?;
    let mut profile = if let Some(p) = file(KERNEL_DETAILS) {
        ascend::kernel_details_from_path(p)?
    } else if let Some(t) = &trace_view {
        t.clone()
    } else if let Some(p) = file(OP_STATISTIC) {
        ascend::op_statistic_from_path(p)?
    } else if file(COMMUNICATION).is_none() {
        return Err(TraceError::Unrecognized {
            origin: dir.display().to_string(),
            reason: format!(
                "no {KERNEL_DETAILS}, {TRACE_VIEW}, {OP_STATISTIC} or {COMMUNICATION} here or in {OUTPUT_DIR}/"
            ),
        });
    } else {
        Profile::new(
            &dir.display().to_string(),
            ProfileFormat::AscendProfilerOutput,
        )
    };
    if let Some(t) = trace_view {
        profile.steps = t.steps;
        profile.notes.extend(t.notes);
    }
    if let Some(p) = file(COMMUNICATION) {
        join_communication(&mut profile, communication::from_path(p)?);
    }
    profile.origin = dir.display().to_string();
    profile.format = ProfileFormat::AscendProfilerOutput;
    profile.sort();
    Ok(profile)
}

/// Gives each collective kernel the bytes and group of the communication record of the same
/// name and step, in order; see the module docs for records without a kernel.
fn join_communication(profile: &mut Profile, comm: Profile) {
    let has_comm = profile.kernels.iter().any(|k| k.comm.is_some());
    if !has_comm {
        profile.kernels.extend(comm.kernels);
        return;
    }
    let mut queues: BTreeMap<(Option<u64>, Arc<str>), VecDeque<usize>> = BTreeMap::new();
    for (i, k) in profile.kernels.iter().enumerate() {
        if k.comm.is_some() {
            queues
                .entry((k.step, k.name.clone()))
                .or_default()
                .push_back(i);
        }
    }
    let mut joins = Vec::new();
    let mut unmatched = 0;
    for c in comm.kernels {
        let slot = queues
            .get_mut(&(c.step, c.name.clone()))
            .and_then(VecDeque::pop_front)
            .or_else(|| {
                // Kernel tables without a step column: match on the name alone.
                queues
                    .get_mut(&(None, c.name.clone()))
                    .and_then(VecDeque::pop_front)
            });
        match slot {
            Some(i) => joins.push((i, c.comm)),
            None => unmatched += 1,
        }
    }
    for (i, c) in joins {
        profile.kernels[i].comm = c;
    }
    if unmatched > 0 {
        *profile
            .skipped
            .entry("communication op without a kernel".into())
            .or_default() += unmatched;
    }
}
