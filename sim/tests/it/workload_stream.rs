//! Open-loop workloads stream into a run: memory follows the requests in flight, so a workload
//! far larger than memory runs for as long as the scenario's duration allows.

use crate::default_with;
use dstwin_sim::run::{run, RunOptions};
use std::time::{Duration, Instant};

#[test]
fn a_billion_request_workload_runs_for_its_duration_without_being_built() {
    // Built up front, 10^9 requests would take 32 GB before the first event.
    let s = default_with(&["workload.num_requests=1000000000", "duration_s=5"]).unwrap();
    let started = Instant::now();
    let r = run(&s, RunOptions::default()).unwrap().report;
    // Poisson at 4 requests/s for 5 s: about 20 arrivals, only those were drawn.
    assert!(
        (5..=60).contains(&r.requests_arrived),
        "arrived {}",
        r.requests_arrived
    );
    assert!(r.requests_unfinished > 0, "the run was cut by its duration");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
}
