//! Open-loop workloads as a stream: [`RequestStream`] yields one request at a time, in arrival
//! order, so a run holds the requests in flight rather than every request of the workload.
//!
//! Synthetic workloads draw each request when it is asked for, from the same seeded streams as
//! [`generate`](crate::synthetic::generate); traces are read line by line and transformed on the
//! fly (first requests, time or rate scaling, time window). Replaying a trace as it is read needs
//! its rows in time order: a row earlier than the one above it is an error naming its line.

use crate::error::TraceError;
use crate::reader::open;
use crate::spec::{TimeScaling, TraceFormat, TracePlan};
use crate::synthetic::{SyntheticConfig, SyntheticRequests};
use crate::workload::{Workload, WorkloadBuilder};
use crate::{azure, mooncake};
use std::io::{BufRead, BufReader};
use std::path::Path;

/// The name of the scenario table, the root of field paths in scaling errors.
const TABLE: &str = "workload";
const NS_PER_S: f64 = 1e9;

/// One request of a stream. `id` counts requests in arrival order from 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamRequest {
    pub id: u64,
    /// Arrival on the workload's own clock (traces keep their first timestamp; see
    /// [`RequestStream::first_arrival_ns`]).
    pub arrival_ns: u64,
    pub input_tokens: u32,
    pub output_tokens: u32,
}

/// The requests of an open-loop workload, one at a time in arrival order. It holds at least one
/// request: building one from an empty trace fails with [`TraceError::Empty`].
pub struct RequestStream {
    source: Source,
    label: String,
    hash_block_tokens: Option<u32>,
    /// The first request, read when the stream was opened and not yet handed out.
    first: Option<StreamRequest>,
    first_arrival_ns: u64,
    hash_ids: Vec<u64>,
    /// The first request's hash ids, while it waits in `first`.
    first_hash_ids: Vec<u64>,
    next_id: u64,
    expected_len: Option<u64>,
}

impl std::fmt::Debug for RequestStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestStream")
            .field("source", &self.label)
            .field("next_id", &self.next_id)
            .finish_non_exhaustive()
    }
}

enum Source {
    Synthetic(Box<SyntheticRequests>),
    Trace(Box<TraceRows>),
}

/// The rows of a trace file, before any transformation, in file order.
enum Rows {
    Mooncake(mooncake::Rows<Box<dyn BufRead + Send>>),
    Azure {
        rows: azure::Rows<Box<dyn BufRead + Send>>,
        /// The first row's time: arrivals are offsets from it.
        start: Option<i128>,
    },
}

/// A row's arrival as read (Mooncake: milliseconds as written; Azure: offset from the first row)
/// and its line.
struct Raw {
    arrival_ns: u64,
    input: u32,
    output: u32,
    line: u64,
}

impl Rows {
    fn open(
        format: TraceFormat,
        reader: Box<dyn BufRead + Send>,
        origin: &str,
    ) -> Result<Rows, TraceError> {
        Ok(match format {
            TraceFormat::Mooncake => Rows::Mooncake(mooncake::Rows::new(reader, origin)),
            TraceFormat::Azure => Rows::Azure {
                rows: azure::Rows::new(reader, origin)?,
                start: None,
            },
        })
    }

    fn next_row(
        &mut self,
        origin: &str,
        hash_ids: &mut Vec<u64>,
    ) -> Result<Option<Raw>, TraceError> {
        match self {
            Rows::Mooncake(rows) => Ok(rows.next_row(hash_ids)?.map(|r| Raw {
                arrival_ns: r.arrival_ns,
                input: r.input,
                output: r.output,
                line: r.line,
            })),
            Rows::Azure { rows, start } => {
                hash_ids.clear();
                let Some(r) = rows.next_row()? else {
                    return Ok(None);
                };
                let start = *start.get_or_insert(r.ts_ns);
                Ok(Some(Raw {
                    arrival_ns: r.offset_ns(start, origin)?,
                    input: r.input,
                    output: r.output,
                    line: r.line,
                }))
            }
        }
    }
}

/// A trace with its transformations, applied row by row.
struct TraceRows {
    rows: Rows,
    origin: String,
    timestamp_field: &'static str,
    /// Rows still to read under `max_requests`.
    left: Option<usize>,
    /// Gap multiplier, and the field and value it came from (for errors).
    scale: Option<(f64, &'static str, f64)>,
    window_ns: Option<u64>,
    /// The first row's arrival, as read.
    first: Option<u64>,
    previous: u64,
    done: bool,
}

impl TraceRows {
    fn next_request(
        &mut self,
        hash_ids: &mut Vec<u64>,
    ) -> Result<Option<(u64, u32, u32)>, TraceError> {
        if self.done || self.left == Some(0) {
            return Ok(None);
        }
        let Some(raw) = self.rows.next_row(&self.origin, hash_ids)? else {
            self.done = true;
            return Ok(None);
        };
        if let Some(left) = &mut self.left {
            *left -= 1;
        }
        let first = *self.first.get_or_insert(raw.arrival_ns);
        if raw.arrival_ns < self.previous {
            return Err(out_of_order(
                &self.origin,
                raw.line,
                self.timestamp_field,
                self.previous - raw.arrival_ns,
            ));
        }
        self.previous = raw.arrival_ns;
        let offset = match self.scale {
            None => raw.arrival_ns - first,
            Some((factor, field, value)) => {
                // As `Workload::scale_time`: scale the offset from the first, not each gap.
                let room = (u64::MAX - first) as f64;
                let scaled = ((raw.arrival_ns - first) as f64 * factor).round();
                if scaled >= room {
                    return Err(TraceError::invalid(
                        field,
                        value,
                        "stretches arrivals beyond the u64 nanosecond clock (about 584 years)",
                    )
                    .within(TABLE));
                }
                scaled as u64
            }
        };
        if self.window_ns.is_some_and(|w| offset >= w) {
            self.done = true;
            return Ok(None);
        }
        Ok(Some((first + offset, raw.input, raw.output)))
    }
}

fn out_of_order(origin: &str, line: u64, field: &str, early_ns: u64) -> TraceError {
    TraceError::BadField {
        origin: origin.to_owned(),
        line,
        field: field.to_owned(),
        value: format!("<{} ms before the row above>", early_ns as f64 / 1e6),
        reason: "a trace is replayed as it is read, so its rows must be in time order (sort the \
                 file by time)"
            .to_owned(),
    }
}

impl RequestStream {
    /// The synthetic workload `config` describes, drawn lazily for `seed`.
    pub fn synthetic(config: &SyntheticConfig, seed: u64) -> RequestStream {
        let requests = SyntheticRequests::new(config, seed);
        let expected_len = requests.expected_len();
        RequestStream::start(
            Source::Synthetic(Box::new(requests)),
            format!("synthetic(seed={seed})"),
            None,
            expected_len,
        )
        .expect("a synthetic workload has its first request, at t = 0")
    }

    /// The trace `plan` names (relative paths against `base_dir`), read line by line. A rate
    /// target reads the file once more first, without keeping its rows, to measure its rate.
    pub fn trace(plan: &TracePlan, base_dir: &Path) -> Result<RequestStream, TraceError> {
        let path = base_dir.join(&plan.path);
        let origin = path.display().to_string();
        let file = || -> Result<Box<dyn BufRead + Send>, TraceError> {
            Ok(Box::new(BufReader::new(open(&path)?)))
        };
        RequestStream::trace_from(plan, &origin, file)
    }

    /// [`RequestStream::trace`] over readers from `reader` (called twice for a rate target).
    fn trace_from(
        plan: &TracePlan,
        origin: &str,
        mut reader: impl FnMut() -> Result<Box<dyn BufRead + Send>, TraceError>,
    ) -> Result<RequestStream, TraceError> {
        let (prefix, timestamp_field, hash_block_tokens) = match plan.format {
            TraceFormat::Mooncake => (
                "mooncake",
                "timestamp",
                Some(mooncake::MOONCAKE_BLOCK_TOKENS),
            ),
            TraceFormat::Azure => ("azure", "TIMESTAMP", None),
        };
        let mut label = format!("{prefix}:{origin}");
        let rows = |reader: Box<dyn BufRead + Send>| -> Result<TraceRows, TraceError> {
            Ok(TraceRows {
                rows: Rows::open(plan.format, reader, origin)?,
                origin: origin.to_owned(),
                timestamp_field,
                left: plan.max_requests.map(|n| n.get()),
                scale: None,
                window_ns: None,
                first: None,
                previous: 0,
                done: false,
            })
        };
        let mut expected_len = None;
        if let Some(n) = plan.max_requests {
            label.push_str(&format!(" | first {n} requests"));
        }
        let scale = match plan.scaling {
            None => None,
            Some(TimeScaling::Factor(f)) => {
                label.push_str(&format!(" | time_scale={f}"));
                Some((f, "time_scale", f))
            }
            Some(TimeScaling::Rate(rate)) => {
                // As `Workload::scale_to_rate`: the mean rate of the (truncated) trace.
                let mut pass = rows(reader()?)?;
                let mut ids = Vec::new();
                let (mut n, mut first, mut last) = (0_u64, 0, 0);
                while let Some((arrival, _, _)) = pass.next_request(&mut ids)? {
                    if n == 0 {
                        first = arrival;
                    }
                    last = arrival;
                    n += 1;
                }
                let span = last - first;
                if span == 0 {
                    let reason = format!(
                        "the workload's {n} arrival(s) span zero time, so it has no rate to scale"
                    );
                    return Err(if n == 0 {
                        TraceError::Empty { origin: label }
                    } else {
                        TraceError::invalid("rate", rate, reason).within(TABLE)
                    });
                }
                expected_len = Some(n);
                let current = (n - 1) as f64 / (span as f64 * 1e-9);
                label.push_str(&format!(" | rate={rate}/s"));
                Some((current / rate, "rate", rate))
            }
        };
        if let Some(w) = plan.max_duration_ns {
            label.push_str(&format!(" | first {}s", w.get() as f64 / NS_PER_S));
            expected_len = None;
        }
        let mut trace = rows(reader()?)?;
        trace.scale = scale;
        trace.window_ns = plan.max_duration_ns.map(|w| w.get());
        RequestStream::start(
            Source::Trace(Box::new(trace)),
            label,
            hash_block_tokens,
            expected_len,
        )
    }

    /// Reads the first request; fails with [`TraceError::Empty`] when there is none.
    fn start(
        source: Source,
        label: String,
        hash_block_tokens: Option<u32>,
        expected_len: Option<u64>,
    ) -> Result<RequestStream, TraceError> {
        let mut stream = RequestStream {
            source,
            label,
            hash_block_tokens,
            first: None,
            first_arrival_ns: 0,
            hash_ids: Vec::new(),
            first_hash_ids: Vec::new(),
            next_id: 0,
            expected_len,
        };
        let Some(first) = stream.read()? else {
            return Err(TraceError::Empty {
                origin: stream.label,
            });
        };
        stream.first_arrival_ns = first.arrival_ns;
        stream.first = Some(first);
        std::mem::swap(&mut stream.first_hash_ids, &mut stream.hash_ids);
        Ok(stream)
    }

    fn read(&mut self) -> Result<Option<StreamRequest>, TraceError> {
        let next = match &mut self.source {
            Source::Synthetic(s) => {
                self.hash_ids.clear();
                s.next_request()
                    .map(|(arrival, l)| (arrival, l.input_tokens, l.output_tokens))
            }
            Source::Trace(t) => t.next_request(&mut self.hash_ids)?,
        };
        Ok(next.map(|(arrival_ns, input_tokens, output_tokens)| {
            let id = self.next_id;
            self.next_id += 1;
            StreamRequest {
                id,
                arrival_ns,
                input_tokens,
                output_tokens,
            }
        }))
    }

    /// The next request in arrival order, `None` after the last; its prefix hash ids are in
    /// [`RequestStream::hash_ids`] until the next call. A trace row that fails to parse, or is
    /// out of time order, is an error naming its line.
    pub fn next_request(&mut self) -> Result<Option<StreamRequest>, TraceError> {
        if let Some(first) = self.first.take() {
            std::mem::swap(&mut self.first_hash_ids, &mut self.hash_ids);
            return Ok(Some(first));
        }
        self.read()
    }

    /// The prefix-cache hash ids of the request [`RequestStream::next_request`] returned last.
    pub fn hash_ids(&self) -> &[u64] {
        &self.hash_ids
    }

    /// Arrival time of the first request (0 for synthetic workloads and Azure traces).
    pub fn first_arrival_ns(&self) -> u64 {
        self.first_arrival_ns
    }

    /// Tokens covered by one hash id; `None` when the source carries no prefix information.
    pub fn hash_block_tokens(&self) -> Option<u32> {
        self.hash_block_tokens
    }

    /// How many requests the stream yields in all, when known before the end (a synthetic
    /// `num_requests`, or a trace whose rate was measured); `None` otherwise.
    pub fn expected_len(&self) -> Option<u64> {
        self.expected_len
    }

    /// Where the requests come from and what is done to them, for reports.
    pub fn source(&self) -> &str {
        &self.label
    }

    /// Collects the whole stream, for users that need every request at once (sending them to a
    /// server, statistics). Memory grows with the number of requests.
    pub fn into_workload(mut self) -> Result<Workload, TraceError> {
        let mut builder = WorkloadBuilder::new(self.label.clone(), self.hash_block_tokens);
        while let Some(r) = self.next_request()? {
            builder.push(
                r.arrival_ns,
                r.input_tokens,
                r.output_tokens,
                &self.hash_ids,
            );
        }
        builder.build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::{generate, ArrivalProcess, LengthDist, RequestCount};
    use std::num::{NonZeroU64, NonZeroUsize};

    fn synthetic(count: RequestCount) -> SyntheticConfig {
        SyntheticConfig::new(
            count,
            LengthDist::normal(3500.0, 500.0).unwrap(),
            LengthDist::uniform(10, 2000).unwrap(),
            ArrivalProcess::gamma(20.0, 2.0).unwrap(),
        )
        .unwrap()
    }

    fn trace(format: TraceFormat, scaling: Option<TimeScaling>) -> TracePlan {
        TracePlan {
            format,
            path: "<test>".into(),
            max_requests: None,
            scaling,
            max_duration_ns: None,
        }
    }

    fn stream(plan: &TracePlan, bytes: &'static [u8]) -> Result<RequestStream, TraceError> {
        RequestStream::trace_from(plan, "<test>", || {
            Ok(Box::new(bytes) as Box<dyn BufRead + Send>)
        })
    }

    #[test]
    fn a_synthetic_stream_draws_lazily_what_generate_draws_up_front() {
        // 10^12 requests: generating them up front would need 32 TB.
        let huge = RequestCount::Requests(NonZeroU64::new(1_000_000_000_000).unwrap());
        let mut s = RequestStream::synthetic(&synthetic(huge), 7);
        assert_eq!(s.expected_len(), Some(1_000_000_000_000));
        let w = generate(
            &synthetic(RequestCount::Requests(NonZeroU64::new(2000).unwrap())),
            7,
        );
        for r in w.requests() {
            let got = s.next_request().unwrap().unwrap();
            let want = (r.id, r.arrival_ns, r.input_tokens, r.output_tokens);
            assert_eq!(
                (got.id, got.arrival_ns, got.input_tokens, got.output_tokens),
                want
            );
        }
    }

    #[test]
    fn a_duration_bound_stream_ends_where_generate_ends() {
        let config = synthetic(RequestCount::DurationNs(
            NonZeroU64::new(30_000_000_000).unwrap(),
        ));
        let streamed = RequestStream::synthetic(&config, 3)
            .into_workload()
            .unwrap();
        let generated = generate(&config, 3);
        assert_eq!(streamed.requests(), generated.requests());
        assert!(generated.len() > 100);
    }

    const MOONCAKE: &[u8] =
        b"{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [1, 2]}
{\"timestamp\": 10, \"input_length\": 100, \"output_length\": 5}

{\"timestamp\": 15, \"input_length\": 700, \"output_length\": 5, \"hash_ids\": [1, 3]}
{\"timestamp\": 40, \"input_length\": 100, \"output_length\": 5}
";

    #[test]
    fn a_streamed_trace_matches_the_trace_read_whole_and_transformed() {
        let whole = || crate::mooncake::from_reader(MOONCAKE, "<test>").unwrap();
        let cases = [
            (None, whole()),
            (
                Some(TimeScaling::Factor(0.5)),
                whole().scale_time(0.5).unwrap(),
            ),
            (
                Some(TimeScaling::Rate(3.0)),
                whole().scale_to_rate(3.0).unwrap(),
            ),
        ];
        for (scaling, want) in cases {
            let plan = trace(TraceFormat::Mooncake, scaling);
            let got = stream(&plan, MOONCAKE).unwrap().into_workload().unwrap();
            assert_eq!(got.requests(), want.requests(), "{scaling:?}");
            let ids: Vec<&[u64]> = got.iter().map(|(_, ids)| ids).collect();
            assert_eq!(ids, [&[1, 2][..], &[], &[1, 3], &[]], "{scaling:?}");
        }
        let mut plan = trace(TraceFormat::Mooncake, Some(TimeScaling::Factor(2.0)));
        plan.max_requests = NonZeroUsize::new(3);
        plan.max_duration_ns = NonZeroU64::new(25_000_000);
        let got = stream(&plan, MOONCAKE).unwrap().into_workload().unwrap();
        let want = whole()
            .truncate_requests(3)
            .unwrap()
            .scale_time(2.0)
            .unwrap()
            .truncate_duration(25_000_000)
            .unwrap();
        assert_eq!(got.requests(), want.requests());
        assert_eq!(got.len(), 2);
    }

    #[test]
    fn a_row_out_of_time_order_is_an_error_naming_its_line() {
        const ROWS: &[u8] = b"TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:17:03.5,10,1
2023-11-16 18:17:04.0,10,1
2023-11-16 18:17:03.9,10,1
";
        let plan = trace(TraceFormat::Azure, None);
        let mut s = stream(&plan, ROWS).unwrap();
        assert_eq!(s.next_request().unwrap().unwrap().arrival_ns, 0);
        assert_eq!(s.next_request().unwrap().unwrap().arrival_ns, 500_000_000);
        let err = s.next_request().unwrap_err().to_string();
        assert!(
            err.contains("<test>:4") && err.contains("time order"),
            "{err}"
        );
    }

    #[test]
    fn an_empty_trace_fails_when_opened() {
        let plan = trace(TraceFormat::Mooncake, None);
        let err = stream(&plan, b"\n\n").unwrap_err();
        assert!(matches!(err, TraceError::Empty { .. }), "{err}");
    }
}
