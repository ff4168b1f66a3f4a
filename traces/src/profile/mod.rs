//! Profiler traces in one normalized form: every reader turns its format into a [`Profile`] of
//! [`KernelRecord`]s (what ran on a device, when, for how long, with what shapes or bytes) and
//! [`StepMarker`]s (where the trace marks device steps), which calibration maps onto the op
//! graph and fits the cost model to.
//!
//! Module map:
//!
//! - [`chrome`]: Chrome / Perfetto trace JSON, streamed one event at a time: PyTorch (Kineto)
//!   profiles of GPUs, torch_npu's `trace_view.json`, and the CPU engine's own profile.
//! - [`ascend`]: the CSV summaries of the Ascend profilers: torch_npu's `kernel_details.csv` and
//!   msprof's `op_summary_*.csv` (both header generations), and `op_statistic.csv`.
//! - [`communication`]: torch_npu's `communication.json` (per collective: time, bytes per link).
//! - `detect` ([`read_path`]): which reader a path needs; a torch_npu output directory
//!   (`ASCEND_PROFILER_OUTPUT`) read as one profile.
//! - `number`: times and sizes as profilers write them (µs as numbers or decimal strings, data
//!   type names), converted exactly to integer nanoseconds and bytes.
//!
//! Readers never panic on any input: a malformed file is a [`TraceError`] naming the file and
//! the line. Times are integer nanoseconds on the trace's own clock.

pub mod ascend;
pub mod chrome;
pub mod communication;
mod detect;
mod number;

pub use detect::{read_path, read_paths};
pub use number::{dtype_bytes, elem_type, ElemType, NumberKind};

use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Which reader produced a profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProfileFormat {
    /// Chrome trace JSON: Kineto (PyTorch profiler), torch_npu `trace_view.json`, the CPU engine.
    ChromeJson,
    /// torch_npu `kernel_details.csv` or msprof `op_summary_*.csv`.
    KernelDetailsCsv,
    /// torch_npu / msprof `op_statistic.csv`: counts and totals per op type, no timeline.
    OpStatisticCsv,
    /// torch_npu `communication.json`.
    CommunicationJson,
    /// A torch_npu output directory (`ASCEND_PROFILER_OUTPUT`): its files merged.
    AscendProfilerOutput,
}

impl ProfileFormat {
    pub fn name(self) -> &'static str {
        match self {
            ProfileFormat::ChromeJson => "chrome_json",
            ProfileFormat::KernelDetailsCsv => "kernel_details_csv",
            ProfileFormat::OpStatisticCsv => "op_statistic_csv",
            ProfileFormat::CommunicationJson => "communication_json",
            ProfileFormat::AscendProfilerOutput => "ascend_profiler_output",
        }
    }
}

/// A collective as the trace describes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CommRecord {
    /// Collective kind as the profiler names it (`allreduce`, `all_to_all`, ...), when given
    /// apart from the kernel name.
    pub collective: Option<String>,
    /// Process group / communicator name.
    pub group: Option<String>,
    /// Ranks in the group.
    pub group_size: Option<u32>,
    /// Bytes the collective moved for this rank (message size).
    pub bytes: Option<f64>,
}

/// One kernel (or, for a statistics file, every launch of one op type).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelRecord {
    /// Kernel or op name as the profiler wrote it.
    pub name: Arc<str>,
    /// Op type where the profiler gives one besides the name (Ascend `Type`, e.g. `MatMulV2`).
    pub op_type: Option<Arc<str>>,
    pub device: Option<u32>,
    pub stream: Option<u32>,
    /// Start on the trace's clock, ns; `None` for aggregated rows.
    pub start_ns: Option<u64>,
    /// Duration, ns (for aggregated rows: the total over `calls`).
    pub dur_ns: u64,
    /// Launches this record stands for: 1, or a statistics row's count.
    pub calls: u64,
    /// Step the profiler attributes the kernel to.
    pub step: Option<u64>,
    /// Decoder layer, when the trace says (the CPU engine does).
    pub layer: Option<u32>,
    /// Op class, when the trace says (the CPU engine does).
    pub op_class: Option<String>,
    /// Input shapes as written (`"4096,7168;7168,2048"`, `[[4096, 7168], [7168, 2048]]`; the
    /// CPU engine's shape arguments as a JSON object, `{"tokens":37,"k":256,"n":64}`).
    pub shapes: Option<String>,
    /// Input data types as written (`"DT_BF16;DT_BF16"`, `["c10::BFloat16", ...]`).
    pub dtypes: Option<String>,
    /// Bytes the kernel moved, when the trace says (the CPU engine's EPLB weight moves).
    pub bytes: Option<f64>,
    pub comm: Option<CommRecord>,
    /// 1-based line of the file the record was read from (its end, for JSON events).
    pub line: u64,
}

impl KernelRecord {
    /// A record of one launch with nothing known beyond its name and timing.
    pub fn new(name: Arc<str>, start_ns: Option<u64>, dur_ns: u64, line: u64) -> KernelRecord {
        KernelRecord {
            name,
            op_type: None,
            device: None,
            stream: None,
            start_ns,
            dur_ns,
            calls: 1,
            step: None,
            layer: None,
            op_class: None,
            shapes: None,
            dtypes: None,
            bytes: None,
            comm: None,
            line,
        }
    }

    /// End on the trace's clock, ns, for timed records.
    pub fn end_ns(&self) -> Option<u64> {
        self.start_ns.map(|s| s.saturating_add(self.dur_ns))
    }
}

/// A step the trace marks (Kineto's `ProfilerStep#N`, the CPU engine's step events).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepMarker {
    pub step: u64,
    pub device: Option<u32>,
    pub start_ns: u64,
    pub dur_ns: u64,
    /// Whether the span is the device's (GPU annotation, engine step) rather than the host's.
    pub on_device: bool,
    /// Sequences and tokens the step computed, when the trace says.
    pub seqs: Option<u64>,
    pub tokens: Option<u64>,
    pub line: u64,
}

impl StepMarker {
    pub fn end_ns(&self) -> u64 {
        self.start_ns.saturating_add(self.dur_ns)
    }
}

/// A profile in normalized form: kernels in start order (aggregated rows last), step markers
/// in start order, and what the trace says about where it was taken.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Profile {
    /// The file or directory read.
    pub origin: String,
    pub format: ProfileFormat,
    pub kernels: Vec<KernelRecord>,
    pub steps: Vec<StepMarker>,
    /// Facts about the run the trace states (device name, world size, trace name), for reports.
    pub notes: BTreeMap<String, String>,
    /// Events read and not kept as kernels or steps (host-side ops, runtime calls, flows,
    /// metadata), by category: what the reader left out, so nothing disappears unnoticed.
    pub skipped: BTreeMap<String, u64>,
}

impl Profile {
    pub(crate) fn new(origin: &str, format: ProfileFormat) -> Profile {
        Profile {
            origin: origin.to_owned(),
            format,
            kernels: Vec::new(),
            steps: Vec::new(),
            notes: BTreeMap::new(),
            skipped: BTreeMap::new(),
        }
    }

    /// Sorts kernels by start (aggregated rows last) then device and stream, and steps by
    /// start; ties keep file order.
    pub(crate) fn sort(&mut self) {
        self.kernels
            .sort_by_key(|k| (k.start_ns.is_none(), k.start_ns, k.device, k.stream));
        self.steps
            .sort_by_key(|s| (s.start_ns, s.device, !s.on_device));
    }

    /// Summed kernel time, ns (saturating: a hostile file cannot overflow it).
    pub fn kernel_time_ns(&self) -> u64 {
        self.kernels
            .iter()
            .fold(0u64, |a, k| a.saturating_add(k.dur_ns))
    }

    pub(crate) fn skip(&mut self, what: &str) {
        let n = self.skipped.entry(what.to_owned()).or_default();
        *n = n.saturating_add(1);
    }
}

/// Interns kernel names: a trace repeats a few hundred names over millions of launches.
#[derive(Default)]
pub(crate) struct Names {
    set: std::collections::HashSet<Arc<str>>,
}

impl Names {
    pub(crate) fn get(&mut self, name: &str) -> Arc<str> {
        if let Some(n) = self.set.get(name) {
            return n.clone();
        }
        let n: Arc<str> = Arc::from(name);
        self.set.insert(n.clone());
        n
    }
}
