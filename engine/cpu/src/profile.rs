//! The op trace (`serve --device cpu --profile FILE`): a Chrome / Perfetto trace of every op the
//! engine runs, named as the op graph names its ops (`dstwin_core::opgraph`, the names `explain`
//! prints), with shapes. Its format is documented in docs/cpu-engine.md ("Profiling"); the
//! calibration of a CPU cost model reads it.
//!
//! A [`Profiler`] belongs to one device (one instance, the trace's `pid`); the forward pass
//! brackets each op with [`Profiler::begin`] / [`Profiler::end`] under the context set by
//! [`Profiler::at`] (DP rank = `tid`, layer, part of the model). Switched off
//! ([`Profiler::off`]) a bracket is one branch: no clock is read and no argument is built. At
//! the end of a step the device's events go to a [`TraceSink`] shared by the deployment's
//! devices, which keeps its file a complete JSON document after every step.

use dstwin_core::opgraph::LayerKind;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

const HEAD: &str = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
const TAIL: &str = "\n]}\n";

/// A trace file shared by the devices of a deployment. Between steps it is a complete JSON
/// object: each append overwrites the closing brackets and writes them again.
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
}

impl TraceSink {
    /// Creates (or truncates) `path` and writes an empty trace.
    pub fn create(path: &Path) -> std::io::Result<TraceSink> {
        let mut out = BufWriter::new(File::create(path)?);
        out.write_all(HEAD.as_bytes())?;
        out.write_all(TAIL.as_bytes())?;
        out.flush()?;
        Ok(TraceSink {
            inner: Arc::new(Mutex::new(Sink {
                out,
                empty: true,
                error: None,
            })),
            origin: Instant::now(),
        })
    }

    /// Appends `events`. A write error stops the trace; [`TraceSink::error`] says why.
    fn append(&self, events: &[Value]) {
        let Ok(mut s) = self.inner.lock() else {
            return;
        };
        if s.error.is_some() || events.is_empty() {
            return;
        }
        let mut empty = s.empty;
        let r = (|| -> std::io::Result<()> {
            s.out.seek(SeekFrom::End(-(TAIL.len() as i64)))?;
            for e in events {
                if !empty {
                    s.out.write_all(b",\n")?;
                }
                serde_json::to_writer(&mut s.out, e)?;
                empty = false;
            }
            s.out.write_all(TAIL.as_bytes())?;
            s.out.flush()
        })();
        s.empty = empty;
        if let Err(e) = r {
            s.error = Some(e.to_string());
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
    events: Vec<Value>,
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
        sink.append(&events);
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

    /// Records op `name` from `start` to now with the shape `args` gives (a JSON object),
    /// under the current context. `name` must be an op of the op graph.
    #[inline]
    pub fn end(
        &mut self,
        start: Option<Instant>,
        name: &'static str,
        args: impl FnOnce() -> Value,
    ) {
        if let Some((r, t0, t1)) = self.stop(start) {
            r.op(t0, t1, name, args());
        }
    }

    /// Records an event of the step track (`eplb_move`): not an op of the graph.
    pub fn step_event(
        &mut self,
        start: Option<Instant>,
        name: &'static str,
        args: impl FnOnce() -> Value,
    ) {
        if let Some((r, t0, t1)) = self.stop(start) {
            r.on_step_track(t0, t1, name, args());
        }
    }

    /// Ends the step that began at `start`: records it on the step track with `args` and hands
    /// the step's events to the sink.
    pub fn end_step(&mut self, start: Option<Instant>, args: impl FnOnce() -> Value) {
        if let Some((r, t0, t1)) = self.stop(start) {
            r.on_step_track(t0, t1, "step", args());
            r.sink.append(&r.events);
            r.events.clear();
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

fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        Value::Null => Map::new(),
        other => {
            let mut m = Map::new();
            m.insert("value".into(), other);
            m
        }
    }
}

impl Recorder {
    fn on_step_track(&mut self, t0: Instant, t1: Instant, name: &str, args: Value) {
        let mut a = object(args);
        a.insert("step".into(), self.step.into());
        let ev = self.event(t0, t1, name, "step", self.step_tid, a);
        self.events.push(ev);
    }

    fn op(&mut self, t0: Instant, t1: Instant, name: &'static str, args: Value) {
        let class = *self.classes.get(name).unwrap_or_else(|| {
            panic!("the engine names an op '{name}' that the op graph does not have")
        });
        let mut a = object(args);
        a.insert("step".into(), self.step.into());
        if let Some(l) = self.layer {
            a.insert("layer".into(), l.into());
        }
        a.insert("class".into(), class.into());
        a.insert("part".into(), self.part.into());
        let ev = self.event(t0, t1, name, class, self.rank as u32, a);
        self.events.push(ev);
    }

    fn event(
        &self,
        t0: Instant,
        t1: Instant,
        name: &str,
        cat: &str,
        tid: u32,
        args: Map<String, Value>,
    ) -> Value {
        let ts = us(self.sink.micros(t0));
        let dur = us(t1.saturating_duration_since(t0).as_secs_f64() * 1e6);
        json!({"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur,
            "pid": self.pid, "tid": tid, "args": Value::Object(args)})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_a_complete_trace_after_every_step() {
        let path =
            std::env::temp_dir().join(format!("dstwin-profile-unit-{}.json", std::process::id()));
        let sink = TraceSink::create(&path).unwrap();
        let read =
            || -> Value { serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap() };
        assert_eq!(read()["traceEvents"].as_array().unwrap().len(), 0);
        let mut classes = BTreeMap::new();
        classes.insert("embed", "elementwise");
        let mut p = Profiler::new(sink.clone(), 3, "engine", 2, classes);
        for step in 0..2 {
            let s = p.begin();
            p.at(1, None, LayerKind::Embedding);
            let o = p.begin();
            p.end(o, "embed", || json!({"tokens": 4}));
            p.end_step(s, || json!({"tokens": 4}));
            let v = read();
            let evs = v["traceEvents"].as_array().unwrap();
            // Metadata (process, two ranks, the step track), then op and step per step.
            assert_eq!(evs.len(), 4 + 2 * (step + 1));
            let op = &evs[evs.len() - 2];
            assert_eq!(op["name"], "embed");
            assert_eq!((op["pid"].as_u64(), op["tid"].as_u64()), (Some(3), Some(1)));
            assert_eq!(op["args"]["step"], step as u64);
            assert_eq!(op["args"]["class"], "elementwise");
            assert_eq!(op["args"]["tokens"], 4);
            let st = &evs[evs.len() - 1];
            assert_eq!(
                (st["name"].as_str(), st["tid"].as_u64()),
                (Some("step"), Some(2))
            );
        }
        assert!(sink.error().is_none());
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
