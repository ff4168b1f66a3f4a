//! The normalized form every reader and generator produces: a [`Workload`] of [`TraceRequest`]s
//! sorted by arrival time.
//!
//! Hash ids (one per prefix-cache block, shared ids = shared prefix) are kept in one pool shared
//! by the whole workload; a request holds only its range into that pool. A request is then 32
//! bytes plus 8 per hash id, and reading a trace costs one allocation per growth of the pool
//! instead of one per request.

use crate::error::TraceError;

/// One request of a workload, in the form the simulator replays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceRequest {
    /// Position of the request in its source (0-based line/row for traces, generation order for
    /// synthetic workloads). Unique within a workload; kept through sorting and truncation.
    pub id: u64,
    /// Arrival time in nanoseconds on the workload's own clock.
    pub arrival_ns: u64,
    /// Prompt length in tokens (at least 1).
    pub input_tokens: u32,
    /// Tokens to generate (at least 1).
    pub output_tokens: u32,
    /// Range of this request's hash ids in the owning workload's pool.
    hash_start: u32,
    hash_len: u32,
}

impl TraceRequest {
    /// Number of prefix-cache hash ids this request carries (0 when the source has none).
    pub fn hash_id_count(&self) -> usize {
        self.hash_len as usize
    }
}

/// A non-empty list of requests sorted by arrival time (ties keep their source order), with the
/// hash-id pool they index and a note of where they came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    requests: Vec<TraceRequest>,
    hash_pool: Vec<u64>,
    hash_block_tokens: Option<u32>,
    source: String,
}

impl Workload {
    /// The requests, sorted by arrival time.
    pub fn requests(&self) -> &[TraceRequest] {
        &self.requests
    }

    /// Number of requests (at least 1).
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    /// Always false: a workload holds at least one request. Present for API symmetry with `len`.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// The prefix-cache hash ids of `request`, one per `hash_block_tokens` tokens of its prompt.
    ///
    /// # Panics
    /// If `request` does not come from this workload's pool.
    pub fn hash_ids(&self, request: &TraceRequest) -> &[u64] {
        let start = request.hash_start as usize;
        &self.hash_pool[start..start + request.hash_len as usize]
    }

    /// Each request with its hash ids, in arrival order.
    pub fn iter(&self) -> impl Iterator<Item = (&TraceRequest, &[u64])> + '_ {
        self.requests.iter().map(|r| (r, self.hash_ids(r)))
    }

    /// Tokens covered by one hash id (512 for Mooncake traces); `None` when the source carries no
    /// prefix information.
    pub fn hash_block_tokens(&self) -> Option<u32> {
        self.hash_block_tokens
    }

    /// Where the requests came from and what was done to them, for reports
    /// (e.g. `mooncake:conversation.jsonl | time_scale=0.5`).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Arrival time of the first request.
    pub fn first_arrival_ns(&self) -> u64 {
        self.requests[0].arrival_ns
    }

    /// Arrival time of the last request.
    pub fn last_arrival_ns(&self) -> u64 {
        self.requests[self.requests.len() - 1].arrival_ns
    }

    /// Time between the first and the last arrival.
    pub fn span_ns(&self) -> u64 {
        self.last_arrival_ns() - self.first_arrival_ns()
    }

    /// Mean request rate in requests per second: the inverse of the mean gap between consecutive
    /// arrivals, `(len - 1) / span`. `None` for a single request or when all arrive at once.
    pub fn mean_rate_per_s(&self) -> Option<f64> {
        let span = self.span_ns();
        (span > 0).then(|| (self.len() - 1) as f64 / (span as f64 * 1e-9))
    }

    /// Replaces the requests (already sorted, drawn from this pool) and notes the change in
    /// `source`. Drops hash ids no request refers to any more, so truncating a large trace frees
    /// its memory.
    pub(crate) fn with_requests(
        self,
        requests: Vec<TraceRequest>,
        note: &str,
    ) -> Result<Workload, TraceError> {
        let source = format!("{} | {note}", self.source);
        if requests.is_empty() {
            return Err(TraceError::Empty { origin: source });
        }
        let mut out = Workload {
            requests,
            hash_pool: self.hash_pool,
            hash_block_tokens: self.hash_block_tokens,
            source,
        };
        out.compact_pool();
        Ok(out)
    }

    /// Moves arrivals by `f(arrival)`; `f` must be non-decreasing so the order is kept.
    pub(crate) fn map_arrivals(
        mut self,
        note: &str,
        mut f: impl FnMut(u64) -> Result<u64, TraceError>,
    ) -> Result<Workload, TraceError> {
        for r in &mut self.requests {
            r.arrival_ns = f(r.arrival_ns)?;
        }
        debug_assert!(self
            .requests
            .windows(2)
            .all(|w| w[0].arrival_ns <= w[1].arrival_ns));
        self.source = format!("{} | {note}", self.source);
        Ok(self)
    }

    fn compact_pool(&mut self) {
        let used: usize = self.requests.iter().map(|r| r.hash_len as usize).sum();
        if used == self.hash_pool.len() {
            return;
        }
        let mut pool = Vec::with_capacity(used);
        for r in &mut self.requests {
            let start = r.hash_start as usize;
            let new_start = pool.len();
            pool.extend_from_slice(&self.hash_pool[start..start + r.hash_len as usize]);
            r.hash_start = pool_index(new_start);
        }
        self.hash_pool = pool;
    }
}

fn pool_index(i: usize) -> u32 {
    u32::try_from(i).expect("a workload holds at most u32::MAX hash ids (32 GiB)")
}

/// Collects requests in source order and turns them into a [`Workload`].
///
/// ```
/// use dstwin_traces::WorkloadBuilder;
/// let mut b = WorkloadBuilder::new("example", Some(512));
/// b.push(1_000, 700, 10, &[7, 8]);
/// b.push(0, 300, 5, &[7]);
/// let w = b.build().unwrap();
/// assert_eq!(w.requests()[0].id, 1); // sorted by arrival, ids keep source order
/// assert_eq!(w.hash_ids(&w.requests()[1]), &[7, 8]);
/// ```
#[derive(Debug)]
pub struct WorkloadBuilder {
    requests: Vec<TraceRequest>,
    hash_pool: Vec<u64>,
    hash_block_tokens: Option<u32>,
    source: String,
}

impl WorkloadBuilder {
    /// An empty builder; `source` labels the workload in reports, `hash_block_tokens` is the
    /// number of prompt tokens each hash id covers (`None` without prefix information).
    pub fn new(source: impl Into<String>, hash_block_tokens: Option<u32>) -> WorkloadBuilder {
        WorkloadBuilder {
            requests: Vec::new(),
            hash_pool: Vec::new(),
            hash_block_tokens,
            source: source.into(),
        }
    }

    /// Adds a request; its id is the number of requests pushed before it.
    ///
    /// # Panics
    /// If `input_tokens` or `output_tokens` is zero: readers and generators reject those with an
    /// error naming the line or parameter before they get here.
    pub fn push(
        &mut self,
        arrival_ns: u64,
        input_tokens: u32,
        output_tokens: u32,
        hash_ids: &[u64],
    ) {
        assert!(
            input_tokens > 0 && output_tokens > 0,
            "request lengths must be at least 1 token (input {input_tokens}, output {output_tokens})"
        );
        let hash_start = pool_index(self.hash_pool.len());
        self.hash_pool.extend_from_slice(hash_ids);
        self.requests.push(TraceRequest {
            id: self.requests.len() as u64,
            arrival_ns,
            input_tokens,
            output_tokens,
            hash_start,
            hash_len: pool_index(hash_ids.len()),
        });
    }

    /// Number of requests pushed so far.
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    /// True before the first push.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// Sorts the requests by arrival (stable: ties keep push order) and returns the workload.
    /// Fails with [`TraceError::Empty`] when nothing was pushed.
    pub fn build(mut self) -> Result<Workload, TraceError> {
        if self.requests.is_empty() {
            return Err(TraceError::Empty {
                origin: self.source,
            });
        }
        self.requests.sort_by_key(|r| r.arrival_ns);
        self.hash_pool.shrink_to_fit();
        self.requests.shrink_to_fit();
        Ok(Workload {
            requests: self.requests,
            hash_pool: self.hash_pool,
            hash_block_tokens: self.hash_block_tokens,
            source: self.source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_drops_unused_hash_ids() {
        let mut b = WorkloadBuilder::new("t", Some(512));
        b.push(0, 600, 1, &[1, 2]);
        b.push(5, 600, 1, &[3, 4]);
        let w = b.build().unwrap();
        let first = w.requests()[..1].to_vec();
        let w = w.with_requests(first, "first 1").unwrap();
        assert_eq!(w.hash_pool, vec![1, 2]);
        assert_eq!(w.hash_ids(&w.requests()[0]), &[1, 2]);
    }

    #[test]
    fn a_request_with_hash_ids_costs_32_bytes_plus_the_ids() {
        assert_eq!(std::mem::size_of::<TraceRequest>(), 32);
    }
}
