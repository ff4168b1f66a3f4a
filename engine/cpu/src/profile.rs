//! The op trace (`serve --device cpu --profile FILE`): a Chrome / Perfetto trace of every op the
//! engine runs, named as the op graph names its ops (`dstwin_core::opgraph`, the names `explain`
//! prints), with shapes. Its format is documented in docs/cpu-engine.md ("Profiling"); the
//! calibration of a CPU cost model reads it.
//!
//! A [`Profiler`] belongs to one device (one instance, the trace's `pid`); the forward pass
//! brackets each op with [`Profiler::begin`] / [`Profiler::end`] under the context set by
//! [`Profiler::at`] (DP rank = `tid`, layer, part of the model). Switched off
//! ([`Profiler::off`]) a bracket is one branch: no clock is read and no argument is built.
//!
//! Recording must not change what it measures: the calibration fits the twin to these times,
//! and the twin then predicts the engine running without a profiler. So a step only reads the
//! clock and keeps its events as they are; at the end of the step they move to a [`TraceSink`]
//! shared by the deployment's devices, which writes them out when a device has had nothing to
//! run for a while ([`TraceSink::flush_some`], in short slices, from the device's idle hook),
//! when too many wait ([`PENDING_CAP`]), and at [`TraceSink::flush`]. After every write the
//! file is a complete JSON document. (Writing each step's events at its end, as the engine
//! first did, cost the tiny model's decode steps about 40% of their time.)

use dstwin_core::opgraph::LayerKind;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

const HEAD: &str = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
const TAIL: &str = "\n]}\n";
/// The category of the step track's events (op events carry their class).
const STEP_TRACK: &str = "step";

/// Events waiting to be written beyond which the end of a step writes them all (a bound on
/// the memory a trace holds when the engine is never idle).
pub const PENDING_CAP: usize = 1 << 18;

/// A trace file shared by the devices of a deployment. Between writes it is a complete JSON
/// object: each write overwrites the closing brackets and writes them again.
#[derive(Clone)]
pub struct TraceSink {
    inner: Arc<Mutex<Sink>>,
    /// Time zero of every `ts` in the file.
    origin: Instant,
}

struct Sink {
    out: BufWriter<File>,
    empty: bool,
    error: Option<String>,
    /// Recorded, not yet written, oldest first.
    pending: VecDeque<Event>,
    /// [`PENDING_CAP`] (smaller in tests).
    cap: usize,
}

/// One recorded interval, kept as recorded; its JSON is built when it is written.
struct Event {
    t0: Instant,
    t1: Instant,
    name: &'static str,
    /// The op's class, or [`STEP_TRACK`] for an event of the step track (a whole step, an
    /// EPLB move), which has no layer, part or class argument.
    cat: &'static str,
    pid: u32,
    tid: u32,
    step: u64,
    layer: Option<usize>,
    part: &'static str,
    args: Args,
}

impl TraceSink {
    /// Creates (or truncates) `path` and writes an empty trace.
    pub fn create(path: &Path) -> std::io::Result<TraceSink> {
        TraceSink::with_cap(path, PENDING_CAP)
    }

    fn with_cap(path: &Path, cap: usize) -> std::io::Result<TraceSink> {
        let mut out = BufWriter::new(File::create(path)?);
        out.write_all(HEAD.as_bytes())?;
        out.write_all(TAIL.as_bytes())?;
        out.flush()?;
        Ok(TraceSink {
            inner: Arc::new(Mutex::new(Sink {
                out,
                empty: true,
                error: None,
                pending: VecDeque::new(),
                cap,
            })),
            origin: Instant::now(),
        })
    }

    /// Queues `events`; writes everything when more than [`PENDING_CAP`] wait.
    fn push(&self, events: &mut Vec<Event>) {
        let Ok(mut s) = self.inner.lock() else {
            return;
        };
        if s.error.is_some() {
            events.clear();
            return;
        }
        s.pending.extend(events.drain(..));
        if s.pending.len() > s.cap {
            self.write(&mut s, usize::MAX);
        }
    }

    /// Writes up to `max` waiting events; true while more wait. Devices call it when they
    /// have no step to run, so the writing stays out of the steps it would slow.
    pub fn flush_some(&self, max: usize) -> bool {
        let Ok(mut s) = self.inner.lock() else {
            return false;
        };
        self.write(&mut s, max);
        s.error.is_none() && !s.pending.is_empty()
    }

    /// Writes every waiting event (at the end of a run, before the file is read).
    pub fn flush(&self) {
        self.flush_some(usize::MAX);
    }

    /// Appends up to `max` waiting events to the file (written ones are dropped at once).
    fn write(&self, s: &mut Sink, max: usize) {
        let n = s.pending.len().min(max);
        if n == 0 {
            return;
        }
        let Sink {
            out,
            empty,
            error,
            pending,
            ..
        } = s;
        emit(out, empty, error, pending.drain(..n).map(|e| self.json(e)));
    }

    /// The event as the trace has it.
    fn json(&self, e: Event) -> Value {
        let op = e.cat != STEP_TRACK;
        let mut a = e.args.into_map();
        a.insert("step".into(), e.step.into());
        if op {
            if let Some(l) = e.layer {
                a.insert("layer".into(), l.into());
            }
            a.insert("class".into(), e.cat.into());
            a.insert("part".into(), e.part.into());
        }
        json!({"name": e.name, "cat": e.cat, "ph": "X", "ts": us(self.micros(e.t0)),
            "dur": us(e.t1.saturating_duration_since(e.t0).as_secs_f64() * 1e6),
            "pid": e.pid, "tid": e.tid, "args": Value::Object(a)})
    }

    /// Writes `events` (metadata) now, ahead of any waiting.
    fn append_now(&self, events: Vec<Value>) {
        if let Ok(mut s) = self.inner.lock() {
            let Sink {
                out, empty, error, ..
            } = &mut *s;
            emit(out, empty, error, events.into_iter());
        }
    }

    /// The write error that stopped the trace, if one did.
    pub fn error(&self) -> Option<String> {
        self.inner.lock().ok().and_then(|s| s.error.clone())
    }

    fn micros(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.origin).as_secs_f64() * 1e6
    }
}

/// Appends `values` to the file and closes the document again. A write error stops the trace
/// ([`TraceSink::error`] says why); nothing is written after it.
fn emit(
    out: &mut BufWriter<File>,
    empty: &mut bool,
    error: &mut Option<String>,
    mut values: impl Iterator<Item = Value>,
) {
    if error.is_some() {
        return;
    }
    let Some(first) = values.next() else {
        return;
    };
    let r = (|| -> std::io::Result<()> {
        out.seek(SeekFrom::End(-(TAIL.len() as i64)))?;
        for v in std::iter::once(first).chain(values) {
            if !*empty {
                out.write_all(b",\n")?;
            }
            serde_json::to_writer(&mut *out, &v)?;
            *empty = false;
        }
        out.write_all(TAIL.as_bytes())?;
        out.flush()
    })();
    if let Err(e) = r {
        *error = Some(e.to_string());
    }
}

/// Records the ops of one device's steps (or nothing, when off).
pub struct Profiler {
    rec: Option<Box<Recorder>>,
}

struct Recorder {
    sink: TraceSink,
    pid: u32,
    /// The track of whole steps (after the DP ranks' tracks).
    step_tid: u32,
    /// Op name -> class, from the op graph of the device's model and layout.
    classes: BTreeMap<&'static str, &'static str>,
    step: u64,
    rank: usize,
    layer: Option<usize>,
    part: &'static str,
    /// This step's events.
    events: Vec<Event>,
}

/// Microseconds with nanosecond resolution (the trace's `ts` and `dur` unit).
fn us(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

impl Profiler {
    /// Records nothing; every call is a branch.
    pub fn off() -> Profiler {
        Profiler { rec: None }
    }

    /// Records the steps of instance `pid` (named `name`, `ranks` DP ranks) into `sink`; op
    /// classes come from `classes` (`dstwin_core::opgraph::vocabulary` of the instance).
    pub fn new(
        sink: TraceSink,
        pid: u32,
        name: &str,
        ranks: u32,
        classes: BTreeMap<&'static str, &'static str>,
    ) -> Profiler {
        let meta = |tid: u32, what: &str, label: String| json!({"name": what, "ph": "M", "pid": pid, "tid": tid, "args": {"name": label}});
        let mut events = vec![meta(0, "process_name", name.to_string())];
        for r in 0..ranks {
            events.push(meta(r, "thread_name", format!("dp rank {r}")));
        }
        events.push(meta(ranks, "thread_name", "steps".to_string()));
        sink.append_now(events);
        Profiler {
            rec: Some(Box::new(Recorder {
                sink,
                pid,
                step_tid: ranks,
                classes,
                step: 0,
                rank: 0,
                layer: None,
                part: "",
                events: Vec::new(),
            })),
        }
    }

    pub fn is_on(&self) -> bool {
        self.rec.is_some()
    }

    /// The device has no step to run: writes up to `max` of the trace's waiting events (see
    /// the module doc); true while more wait.
    pub fn idle(&self, max: usize) -> bool {
        self.rec.as_ref().is_some_and(|r| r.sink.flush_some(max))
    }

    /// The context of the next ops: DP rank, decoder layer (cache-layer index; `None` outside
    /// the layers) and the part of the model (the op graph's layer kind).
    #[inline]
    pub fn at(&mut self, rank: usize, layer: Option<usize>, part: LayerKind) {
        if let Some(r) = &mut self.rec {
            r.rank = rank;
            r.layer = layer;
            r.part = part.name();
        }
    }

    /// Moves the context to another DP rank (dispatch, experts and combine of a MoE layer run
    /// on every rank in turn).
    #[inline]
    pub fn rank(&mut self, rank: usize) {
        if let Some(r) = &mut self.rec {
            r.rank = rank;
        }
    }

    /// The start of an op (`None` when off).
    #[inline]
    pub fn begin(&self) -> Option<Instant> {
        self.rec.as_ref().map(|_| Instant::now())
    }

    /// Records op `name` from `start` to now with the shape `args` gives ([`Args`], written as
    /// a JSON object), under the current context. `name` must be an op of the op graph.
    #[inline]
    pub fn end(&mut self, start: Option<Instant>, name: &'static str, args: impl FnOnce() -> Args) {
        if let Some((r, t0, t1)) = self.stop(start) {
            r.op(t0, t1, name, args());
        }
    }

    /// Records an event of the step track (`eplb_move`): not an op of the graph.
    pub fn step_event(
        &mut self,
        start: Option<Instant>,
        name: &'static str,
        args: impl FnOnce() -> Args,
    ) {
        if let Some((r, t0, t1)) = self.stop(start) {
            r.on_step_track(t0, t1, name, args());
        }
    }

    /// Ends the step that began at `start`: records it on the step track with `args` and hands
    /// the step's events to the sink.
    pub fn end_step(&mut self, start: Option<Instant>, args: impl FnOnce() -> Args) {
        if let Some((r, t0, t1)) = self.stop(start) {
            r.on_step_track(t0, t1, "step", args());
            r.sink.push(&mut r.events);
            r.step += 1;
        }
    }

    /// The recorder, the start and now, for an interval begun while on.
    #[inline]
    fn stop(&mut self, start: Option<Instant>) -> Option<(&mut Recorder, Instant, Instant)> {
        match (&mut self.rec, start) {
            (Some(r), Some(t0)) => Some((r.as_mut(), t0, Instant::now())),
            _ => None,
        }
    }
}

/// Numbers an op's [`Args`] hold at most.
const MAX_NUMS: usize = 6;

/// An op's arguments as the engine records them: a few numbers and at most one list of numbers
/// under static keys, kept as they are while the engine runs and made JSON only when written.
/// (Building a JSON object per op, allocations included, cost 0.3-0.6 us: the median gap
/// between consecutive ops of a one-sequence decode step of the loop's tiny model fell from
/// 1.14 to 0.56 us without it, 15-30 us of a 0.9 ms step, by which the profiled engine ran
/// slower than the one the twin is asked to predict.) Built with [`args!`](crate::args).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Args {
    nums: [(&'static str, u64); MAX_NUMS],
    n: usize,
    list: Option<(&'static str, Vec<u32>)>,
}

impl Args {
    /// Adds `key = v` (at most [`MAX_NUMS`] numbers: an engine bug otherwise).
    pub fn num(mut self, key: &'static str, v: u64) -> Args {
        assert!(self.n < MAX_NUMS, "more than {MAX_NUMS} numbers for one op");
        self.nums[self.n] = (key, v);
        self.n += 1;
        self
    }

    /// Sets the list `key = v`.
    pub fn list(mut self, key: &'static str, v: &[u32]) -> Args {
        self.list = Some((key, v.to_vec()));
        self
    }

    fn into_map(self) -> Map<String, Value> {
        let mut m: Map<String, Value> = self.nums[..self.n]
            .iter()
            .map(|&(k, v)| (k.to_string(), v.into()))
            .collect();
        if let Some((k, v)) = self.list {
            m.insert(k.to_string(), v.into());
        }
        m
    }
}

/// `args!{"tokens": t, "k": hidden}`: an op's [`Args`], each value an integer (cast to u64).
#[macro_export]
macro_rules! args {
    ($($k:literal : $v:expr),* $(,)?) => {
        $crate::profile::Args::default()$(.num($k, ($v) as u64))*
    };
}

impl Recorder {
    fn on_step_track(&mut self, t0: Instant, t1: Instant, name: &'static str, args: Args) {
        self.events.push(Event {
            t0,
            t1,
            name,
            cat: STEP_TRACK,
            pid: self.pid,
            tid: self.step_tid,
            step: self.step,
            layer: None,
            part: "",
            args,
        });
    }

    fn op(&mut self, t0: Instant, t1: Instant, name: &'static str, args: Args) {
        let class = *self.classes.get(name).unwrap_or_else(|| {
            panic!("the engine names an op '{name}' that the op graph does not have")
        });
        self.events.push(Event {
            t0,
            t1,
            name,
            cat: class,
            pid: self.pid,
            tid: self.rank as u32,
            step: self.step,
            layer: self.layer,
            part: self.part,
            args,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_args_become_the_json_object_they_stand_for() {
        let a = crate::args! {"tokens": 3usize, "k": 7u32, "n": 1u64 << 40}
            .list("rows_per_expert", &[0, 2, 5]);
        let want =
            serde_json::json!({"tokens": 3, "k": 7, "n": 1u64 << 40, "rows_per_expert": [0, 2, 5]});
        assert_eq!(Value::Object(a.into_map()), want);
        assert_eq!(
            Value::Object(Args::default().into_map()),
            serde_json::json!({})
        );
    }

    #[test]
    fn steps_keep_their_events_until_the_device_is_idle_and_every_write_is_a_complete_trace() {
        let path =
            std::env::temp_dir().join(format!("dstwin-profile-unit-{}.json", std::process::id()));
        let sink = TraceSink::create(&path).unwrap();
        let read =
            || -> Value { serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap() };
        let count = || read()["traceEvents"].as_array().unwrap().len();
        assert_eq!(count(), 0);
        let mut classes = BTreeMap::new();
        classes.insert("embed", "elementwise");
        let mut p = Profiler::new(sink.clone(), 3, "engine", 2, classes);
        // Metadata (process, two ranks, the step track) is written at once.
        assert_eq!(count(), 4);
        for _ in 0..2 {
            let s = p.begin();
            p.at(1, None, LayerKind::Embedding);
            let o = p.begin();
            p.end(o, "embed", || crate::args! {"tokens": 4});
            p.end_step(s, || crate::args! {"tokens": 4});
        }
        // The steps wrote nothing: the file is still the metadata alone.
        assert_eq!(count(), 4);
        // Idle, the device writes in slices; each leaves a complete document.
        assert!(p.idle(3), "one of four events still waits");
        assert_eq!(count(), 7);
        assert!(!p.idle(3));
        let v = read();
        let evs = v["traceEvents"].as_array().unwrap();
        assert_eq!(evs.len(), 8);
        for step in 0..2u64 {
            let op = &evs[4 + 2 * step as usize];
            assert_eq!(op["name"], "embed");
            assert_eq!(op["cat"], "elementwise");
            assert_eq!((op["pid"].as_u64(), op["tid"].as_u64()), (Some(3), Some(1)));
            assert_eq!(op["args"]["step"], step);
            assert_eq!(op["args"]["class"], "elementwise");
            assert_eq!(op["args"]["part"], "embedding");
            assert_eq!(op["args"]["tokens"], 4);
            assert!(op["args"].get("layer").is_none());
            let st = &evs[5 + 2 * step as usize];
            assert_eq!(
                (st["name"].as_str(), st["tid"].as_u64()),
                (Some("step"), Some(2))
            );
            assert_eq!(st["args"]["step"], step);
            assert!(st["args"].get("class").is_none());
            assert!(st["ts"].as_f64().unwrap() <= op["ts"].as_f64().unwrap());
        }
        // Nothing waits: idle writes nothing more, flush neither.
        sink.flush();
        assert_eq!(count(), 8);
        assert!(sink.error().is_none());
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn too_many_waiting_events_are_written_at_the_end_of_a_step() {
        let path = std::env::temp_dir().join(format!(
            "dstwin-profile-unit-cap-{}.json",
            std::process::id()
        ));
        let sink = TraceSink::with_cap(&path, 64).unwrap();
        let mut classes = BTreeMap::new();
        classes.insert("embed", "elementwise");
        let mut p = Profiler::new(sink.clone(), 0, "engine", 1, classes);
        let mut steps = 0;
        let waiting = || sink.inner.lock().unwrap().pending.len();
        while waiting() <= 64 - 2 {
            let s = p.begin();
            let o = p.begin();
            p.end(o, "embed", Args::default);
            p.end_step(s, Args::default);
            steps += 1;
        }
        assert!(waiting() > 0);
        // The step that takes the queue over the cap writes it all.
        let s = p.begin();
        p.end_step(s, Args::default);
        assert_eq!(waiting(), 0);
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            v["traceEvents"].as_array().unwrap().len(),
            3 + 2 * steps + 1
        );
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn off_records_nothing() {
        let mut p = Profiler::off();
        let s = p.begin();
        assert!(s.is_none() && !p.is_on());
        p.end(s, "no such op", || {
            panic!("arguments are not built when off")
        });
    }
}
