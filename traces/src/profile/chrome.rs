//! Chrome / Perfetto trace JSON (the Trace Event Format): an object with a `traceEvents` array,
//! or a bare array of events. Three producers are read, each with its own conventions:
//!
//! - **Kineto** (the PyTorch profiler, `export_chrome_trace`): GPU work is complete (`"ph": "X"`)
//!   events of category `kernel`, `gpu_memcpy` or `gpu_memset`, `ts`/`dur` in µs, `args.device`
//!   and `args.stream`. NCCL kernels carry `Collective name`, `In msg nelems`, `Out msg nelems`,
//!   `Group size`, `dtype` and `Process Group Name`; with `record_shapes` the launching
//!   `cpu_op` carries `Input Dims` and `Input type`, joined to its kernels by `External id`.
//!   Steps are `ProfilerStep#N` annotations (`gpu_user_annotation` on the device).
//! - **torch_npu** `trace_view.json`: NPU tasks are complete events of the process named
//!   `Ascend Hardware` (its threads are streams); collectives are the `hcom_*` events of the
//!   `HCCL` / `Communication` processes; process names come from `process_name` metadata events,
//!   which may follow the events they name. `ts` may be a decimal string with a ns fraction.
//! - **The CPU engine** (`serve --device cpu --profile`, docs/cpu-engine.md "Profiling"): one
//!   complete event per op, named as the op graph names it, with `args.class` (its class there),
//!   `args.step`, `args.layer` (inside a layer), `args.part` and the op's shapes (`tokens`, a
//!   GEMM's `k` and `n`, `seqs`, `context`, `heads`, `rows_per_expert`, `rows_to_rank`, ...),
//!   kept as the record's shapes; `pid` is the instance, `tid` the DP rank. The step track
//!   (category `step`) holds one `step` event per device step (`args.step`, `tokens`, `seqs`)
//!   and the EPLB weight moves (`eplb_move`, with `bytes`), kept as records of their own.
//!
//! Other events (host ops, runtime calls, flows, counters) are counted by category in
//! [`Profile::skipped`]. The file is streamed: memory holds one event at a time plus what is
//! kept. Errors name the line (for a malformed value, the line and column serde_json reports;
//! for an event with a bad field, the line where the event ends).

use super::number::{dtype_bytes, value_amount, value_count, value_ns, US};
use super::{CommRecord, KernelRecord, Names, Profile, ProfileFormat, StepMarker};
use crate::error::TraceError;
use crate::reader::{open, shown};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::{BufReader, Read};
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;

/// Kineto categories of device work.
const DEVICE_CATEGORIES: &[&str] = &["kernel", "gpu_memcpy", "gpu_memset"];
/// torch_npu's process of NPU tasks.
const NPU_PROCESS: &str = "Ascend Hardware";
/// torch_npu's processes of collectives.
const COMM_PROCESSES: &[&str] = &["HCCL", "Communication"];
/// The CPU engine's step track.
const STEP_TRACK: &str = "step";
/// The CPU engine's op arguments that place an op rather than shape it.
const ENGINE_PLACE_ARGS: &[&str] = &["step", "layer", "class", "part"];
/// Kineto's step annotation prefix.
const PROFILER_STEP: &str = "ProfilerStep#";
/// Host-side Kineto / torch_npu categories, skipped as soon as read.
const HOST_CATEGORIES: &[&str] = &[
    "cpu_op",
    "cuda_runtime",
    "cuda_driver",
    "python_function",
    "user_annotation",
    "gpu_user_annotation",
    "cpu_instant_event",
    "overhead",
    "trace",
    "ac2g",
    "fwdbwd",
    "async_cpu",
];

/// Reads a Chrome trace from a file; errors name the path and line.
pub fn from_path(path: impl AsRef<Path>) -> Result<Profile, TraceError> {
    let path = path.as_ref();
    from_reader(open(path)?, &path.display().to_string())
}

/// Reads a Chrome trace from any reader; `origin` labels errors and the profile.
pub fn from_reader(reader: impl Read, origin: &str) -> Result<Profile, TraceError> {
    let pos = Rc::new(Cell::new(0u64));
    let counting = Counting {
        inner: BufReader::new(reader),
        lines: pos.clone(),
    };
    let mut state = State::new(origin, pos);
    let mut de = serde_json::Deserializer::from_reader(counting);
    let read = Top { st: &mut state }
        .deserialize(&mut de)
        .and_then(|()| de.end());
    if let Err(e) = read {
        return Err(state.error.take().unwrap_or_else(|| syntax(origin, &e)));
    }
    state.finish()
}

/// A serde_json error as a syntax error at its line.
pub(crate) fn syntax(origin: &str, e: &serde_json::Error) -> TraceError {
    let text = e.to_string();
    // serde_json appends " at line L column C"; the line goes in the error's own field.
    let reason = match text.rfind(" at line ") {
        Some(i) => format!("{} (column {})", &text[..i], e.column()),
        None => text,
    };
    TraceError::Syntax {
        origin: origin.to_owned(),
        line: e.line().max(1) as u64,
        reason,
    }
}

/// Keeps `err` for the caller and aborts the deserializer with its message (a visitor can only
/// return serde's error type).
pub(crate) fn raise<E: de::Error>(slot: &mut Option<TraceError>, err: TraceError) -> E {
    let message = err.to_string();
    *slot = Some(err);
    E::custom(message)
}

/// Counts the newlines serde_json has consumed, so that an event can be placed in the file.
/// serde_json reads a `Read` one byte at a time, so the count is exact to the byte it is at.
pub(crate) struct Counting<R> {
    pub(crate) inner: R,
    pub(crate) lines: Rc<Cell<u64>>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let newlines = buf[..n].iter().filter(|&&c| c == b'\n').count() as u64;
        self.lines.set(self.lines.get() + newlines);
        Ok(n)
    }
}

/// One event as written; only the fields the readers use.
#[derive(Deserialize)]
struct RawEvent {
    #[serde(default)]
    ph: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    cat: Option<String>,
    #[serde(default)]
    pid: Option<Value>,
    #[serde(default)]
    tid: Option<Value>,
    #[serde(default)]
    ts: Option<Value>,
    #[serde(default)]
    dur: Option<Value>,
    #[serde(default)]
    args: Option<Map<String, Value>>,
}

/// An event whose meaning depends on its process's name, known only at the end.
struct Deferred {
    name: Arc<str>,
    pid: String,
    tid: Option<u32>,
    start_ns: u64,
    dur_ns: u64,
    line: u64,
}

/// What the reader has kept so far.
struct State {
    origin: String,
    /// Newlines consumed so far.
    lines: Rc<Cell<u64>>,
    names: Names,
    profile: Profile,
    /// Process names by `pid` (as JSON text, so that 0 and "0" stay apart).
    processes: BTreeMap<String, String>,
    deferred: Vec<Deferred>,
    /// `Input Dims` and `Input type` of host ops by `External id`.
    input_dims: HashMap<u64, (String, Option<String>)>,
    /// Kernels waiting for the shapes of their launching op: (kernel index, External id).
    launches: Vec<(usize, u64)>,
    /// The first error an event raised (serde only carries a message).
    error: Option<TraceError>,
}

fn numeric_id(v: Option<&Value>) -> Option<u32> {
    v.and_then(Value::as_u64)
        .and_then(|x| u32::try_from(x).ok())
}

impl State {
    fn new(origin: &str, lines: Rc<Cell<u64>>) -> State {
        State {
            origin: origin.to_owned(),
            lines,
            names: Names::default(),
            profile: Profile::new(origin, ProfileFormat::ChromeJson),
            processes: BTreeMap::new(),
            deferred: Vec::new(),
            input_dims: HashMap::new(),
            launches: Vec::new(),
            error: None,
        }
    }

    fn line(&self) -> u64 {
        self.lines.get() + 1
    }

    fn bad(&self, field: &str, value: &str, reason: &str) -> TraceError {
        TraceError::BadField {
            origin: self.origin.clone(),
            line: self.line(),
            field: field.to_owned(),
            value: shown(value),
            reason: reason.to_owned(),
        }
    }

    /// The event's `field` (µs) in ns; an error naming it when absent or malformed.
    fn time(&self, v: Option<&Value>, field: &str, name: &str) -> Result<u64, TraceError> {
        let v = v.ok_or_else(|| {
            self.bad(
                field,
                "<missing>",
                &format!("complete event `{}` needs `{field}`", shown(name)),
            )
        })?;
        value_ns(v, US).map_err(|reason| self.bad(field, &v.to_string(), reason))
    }

    fn event(&mut self, e: RawEvent) -> Result<(), TraceError> {
        let ph = e.ph.as_deref().unwrap_or("");
        let name = e.name.as_deref().unwrap_or("");
        let args = e.args.as_ref();
        let arg = |k: &str| args.and_then(|a| a.get(k));
        if ph == "M" {
            if name == "process_name" {
                if let (Some(pid), Some(Value::String(n))) = (&e.pid, arg("name")) {
                    self.processes.insert(pid.to_string(), n.clone());
                }
            }
            self.profile.skip("metadata");
            return Ok(());
        }
        let cat = e.cat.as_deref().unwrap_or("").to_ascii_lowercase();
        if ph != "X" {
            self.profile.skip(if cat.is_empty() { ph } else { &cat });
            return Ok(());
        }
        // Host ops keep their shapes for the kernels they launch.
        if cat == "cpu_op" {
            if let (Some(id), Some(dims)) =
                (arg("External id").and_then(value_count), arg("Input Dims"))
            {
                let types = arg("Input type").map(Value::to_string);
                self.input_dims.insert(id, (dims.to_string(), types));
            }
        }
        if let Some(n) = name.strip_prefix(PROFILER_STEP) {
            if let Ok(step) = n.trim().parse::<u64>() {
                return self.step(&e, step, cat == "gpu_user_annotation", name);
            }
        }
        if DEVICE_CATEGORIES.contains(&cat.as_str()) {
            return self.kineto_kernel(&e, name);
        }
        if arg("class").is_some_and(Value::is_string) {
            return self.engine_op(&e, name);
        }
        if cat == STEP_TRACK {
            return match (name, arg("step").and_then(value_count)) {
                ("step", Some(step)) => self.step(&e, step, true, name),
                _ => self.engine_step_work(&e, name),
            };
        }
        if HOST_CATEGORIES.contains(&cat.as_str()) {
            self.profile.skip(&cat);
            return Ok(());
        }
        // Maybe an NPU task or a collective: that depends on the process's name.
        let start_ns = self.time(e.ts.as_ref(), "ts", name)?;
        let dur_ns = self.time(e.dur.as_ref(), "dur", name)?;
        let deferred = Deferred {
            name: self.names.get(name),
            pid: e.pid.as_ref().map_or_else(String::new, Value::to_string),
            tid: numeric_id(e.tid.as_ref()),
            start_ns,
            dur_ns,
            line: self.line(),
        };
        self.deferred.push(deferred);
        Ok(())
    }

    fn step(
        &mut self,
        e: &RawEvent,
        step: u64,
        on_device: bool,
        name: &str,
    ) -> Result<(), TraceError> {
        let args = e.args.as_ref();
        let arg = |k: &str| args.and_then(|a| a.get(k));
        let marker = StepMarker {
            step,
            device: numeric_id(arg("device")).or(if on_device {
                numeric_id(e.pid.as_ref())
            } else {
                None
            }),
            start_ns: self.time(e.ts.as_ref(), "ts", name)?,
            dur_ns: self.time(e.dur.as_ref(), "dur", name)?,
            on_device,
            seqs: arg("seqs").and_then(value_count),
            tokens: arg("tokens").and_then(value_count),
            line: self.line(),
        };
        self.profile.steps.push(marker);
        Ok(())
    }

    fn record(&mut self, e: &RawEvent, name: &str) -> Result<KernelRecord, TraceError> {
        let start = self.time(e.ts.as_ref(), "ts", name)?;
        let dur = self.time(e.dur.as_ref(), "dur", name)?;
        Ok(KernelRecord::new(
            self.names.get(name),
            Some(start),
            dur,
            self.line(),
        ))
    }

    fn kineto_kernel(&mut self, e: &RawEvent, name: &str) -> Result<(), TraceError> {
        let args = e.args.as_ref();
        let arg = |k: &str| args.and_then(|a| a.get(k));
        let mut k = self.record(e, name)?;
        k.op_type = e.cat.as_deref().map(|c| self.names.get(c));
        k.device = numeric_id(arg("device")).or(numeric_id(e.pid.as_ref()));
        k.stream = numeric_id(arg("stream")).or(numeric_id(e.tid.as_ref()));
        if let Some(collective) = arg("Collective name").and_then(Value::as_str) {
            let nelems = ["In msg nelems", "Out msg nelems"]
                .iter()
                .filter_map(|f| arg(f).and_then(value_count))
                .max();
            let elem = arg("dtype").and_then(Value::as_str).and_then(dtype_bytes);
            k.comm = Some(CommRecord {
                collective: Some(collective.to_owned()),
                group: arg("Process Group Name")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                group_size: arg("Group size")
                    .and_then(value_count)
                    .and_then(|g| u32::try_from(g).ok()),
                bytes: nelems.zip(elem).map(|(n, b)| n as f64 * b),
            });
        }
        if let Some(id) = arg("External id").and_then(value_count) {
            self.launches.push((self.profile.kernels.len(), id));
        }
        self.profile.kernels.push(k);
        Ok(())
    }

    fn engine_op(&mut self, e: &RawEvent, name: &str) -> Result<(), TraceError> {
        let args = e.args.as_ref();
        let arg = |k: &str| args.and_then(|a| a.get(k));
        let mut k = self.record(e, name)?;
        k.device = numeric_id(e.pid.as_ref());
        k.stream = numeric_id(e.tid.as_ref());
        k.op_class = arg("class").and_then(Value::as_str).map(str::to_owned);
        k.step = arg("step").and_then(value_count);
        k.layer = arg("layer")
            .and_then(value_count)
            .and_then(|l| u32::try_from(l).ok());
        if let Some(a) = args {
            let shapes: Map<String, Value> = a
                .iter()
                .filter(|(key, _)| !ENGINE_PLACE_ARGS.contains(&key.as_str()))
                .map(|(key, v)| (key.clone(), v.clone()))
                .collect();
            if !shapes.is_empty() {
                k.shapes = Some(Value::Object(shapes).to_string());
            }
        }
        // Dispatch and combine list the rows per destination rank: the EP group's size.
        if let Some(Value::Array(ranks)) = arg("rows_to_rank") {
            k.comm = Some(CommRecord {
                collective: k.op_class.clone(),
                group: None,
                group_size: u32::try_from(ranks.len()).ok(),
                bytes: None,
            });
        }
        self.profile.kernels.push(k);
        Ok(())
    }

    /// Work on the engine's step track that is not a step (an EPLB weight move).
    fn engine_step_work(&mut self, e: &RawEvent, name: &str) -> Result<(), TraceError> {
        let args = e.args.as_ref();
        let mut k = self.record(e, name)?;
        k.device = numeric_id(e.pid.as_ref());
        k.stream = numeric_id(e.tid.as_ref());
        k.step = args.and_then(|a| a.get("step")).and_then(value_count);
        k.bytes = args.and_then(|a| a.get("bytes")).and_then(value_amount);
        self.profile.kernels.push(k);
        Ok(())
    }

    fn finish(mut self) -> Result<Profile, TraceError> {
        for d in std::mem::take(&mut self.deferred) {
            let process = self.processes.get(&d.pid).map(String::as_str);
            let comm = process.is_some_and(|p| COMM_PROCESSES.contains(&p));
            if process == Some(NPU_PROCESS) || (comm && d.name.starts_with("hcom_")) {
                let mut k = KernelRecord::new(d.name, Some(d.start_ns), d.dur_ns, d.line);
                k.stream = d.tid;
                if comm {
                    k.comm = Some(CommRecord::default());
                }
                self.profile.kernels.push(k);
            } else {
                self.profile.skip(process.unwrap_or("other"));
            }
        }
        for (i, id) in std::mem::take(&mut self.launches) {
            if let Some((dims, types)) = self.input_dims.get(&id) {
                let k = &mut self.profile.kernels[i];
                k.shapes = Some(dims.clone());
                k.dtypes = types.clone();
            }
        }
        self.profile.sort();
        Ok(self.profile)
    }
}

/// The top level: an object (`traceEvents` and metadata) or a bare array of events.
struct Top<'a> {
    st: &'a mut State,
}

impl<'de> DeserializeSeed<'de> for Top<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Top<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a trace: an object with `traceEvents` or an array of events")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "traceEvents" => map.next_value_seed(Events { st: self.st })?,
                "traceName" | "displayTimeUnit" => {
                    if let Value::String(s) = map.next_value::<Value>()? {
                        self.st.profile.notes.insert(key, s);
                    }
                }
                "distributedInfo" => {
                    if let Value::Object(o) = map.next_value::<Value>()? {
                        for (k, v) in o {
                            self.st
                                .profile
                                .notes
                                .insert(format!("distributed.{k}"), v.to_string());
                        }
                    }
                }
                "deviceProperties" => {
                    if let Value::Array(devices) = map.next_value::<Value>()? {
                        let names: Vec<&str> = devices
                            .iter()
                            .filter_map(|d| d.get("name").and_then(Value::as_str))
                            .collect();
                        if let Some(first) = names.first() {
                            let note = format!("{} x {first}", names.len());
                            self.st.profile.notes.insert("devices".into(), note);
                        }
                    }
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        Events { st: self.st }.visit_seq(seq)
    }
}

struct Events<'a> {
    st: &'a mut State,
}

impl<'de> DeserializeSeed<'de> for Events<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Events<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of trace events")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(e) = seq.next_element::<RawEvent>()? {
            if let Err(err) = self.st.event(e) {
                return Err(raise(&mut self.st.error, err));
            }
        }
        Ok(())
    }
}
