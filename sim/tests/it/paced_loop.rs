//! A closed loop with the client's request rate (`vllm bench serve --request-rate R
//! --max-concurrency C`): request k is issued at the later of its k-th arrival and a free slot.

use crate::default_with;
use dstwin_sim::run::{run, RunOptions};

fn closed(rate: Option<f64>) -> Vec<(f64, f64)> {
    closed_with(4, 40, rate)
}

/// (issue, end) of every request of a closed loop of `concurrency` and `n` requests, in issue
/// order, paced at `rate` when given.
fn closed_with(concurrency: u32, n: u64, rate: Option<f64>) -> Vec<(f64, f64)> {
    let mut sets = vec![format!(
        "workload={{kind=\"closed_loop\",concurrency={concurrency},num_requests={n},input={{dist=\"fixed\",value=512}},output={{dist=\"fixed\",value=16}}}}"
    )];
    if let Some(r) = rate {
        sets.push(format!("workload.arrival={{process=\"poisson\",rate={r}}}"));
    }
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let s = default_with(&sets).unwrap();
    let r = run(
        &s,
        RunOptions {
            per_request: true,
            ..RunOptions::default()
        },
    )
    .unwrap();
    let mut rows: Vec<(f64, f64)> = r
        .requests
        .iter()
        .map(|q| (q.arrival_s, q.arrival_s + q.e2e_ms * 1e-3))
        .collect();
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    rows
}

#[test]
fn a_slow_rate_spaces_the_requests_and_a_fast_one_leaves_the_loop_as_it_was() {
    let unpaced = closed(None);
    assert_eq!(unpaced.len(), 40);
    // Unpaced: the first four at once, then each as one finishes.
    assert!(unpaced[..4].iter().all(|r| r.0 == 0.0));
    // At 0.5 requests/s the 40 requests span about 80 s, far longer than they take to serve.
    let slow = closed(Some(0.5));
    assert_eq!(slow.len(), 40);
    let span = slow[39].0 - slow[0].0;
    assert!((40.0..160.0).contains(&span), "issued over {span} s");
    // Never more than the concurrency in flight.
    for (k, r) in slow.iter().enumerate() {
        let in_flight = slow[..k].iter().filter(|p| p.1 > r.0 + 1e-9).count();
        assert!(
            in_flight < 4,
            "request {k}: {in_flight} in flight before it"
        );
    }
    // A rate far above what the loop sustains changes only the first requests' issue times:
    // issued microseconds apart, some miss the first prefill step and wait for the next, so
    // the run ends up to a step or two later (each 0.1-0.25 s of a run of about 7 s).
    let fast = closed(Some(1e5));
    let end = |v: &[(f64, f64)]| v.iter().map(|r| r.1).fold(0.0, f64::max);
    let late = end(&fast) - end(&unpaced);
    assert!((0.0..0.5).contains(&late), "{late} s");
}

#[test]
fn a_paced_loop_wider_than_its_requests_issues_each_at_its_arrival() {
    // Concurrency above the request count: every slot is free at once, so each request is
    // issued exactly at its arrival (the same seeded arrivals a synthetic workload draws).
    let paced = closed_with(64, 30, Some(2.0));
    let open = default_with(&[
        "workload.num_requests=30",
        "workload.arrival.rate=2.0",
        "workload.input={dist=\"fixed\",value=512}",
        "workload.output={dist=\"fixed\",value=16}",
    ])
    .unwrap();
    let r = run(
        &open,
        RunOptions {
            per_request: true,
            ..RunOptions::default()
        },
    )
    .unwrap();
    let mut arrivals: Vec<f64> = r.requests.iter().map(|q| q.arrival_s).collect();
    arrivals.sort_by(f64::total_cmp);
    let issued: Vec<f64> = paced.iter().map(|r| r.0).collect();
    assert_eq!(issued.len(), 30);
    for (k, (i, a)) in issued.iter().zip(&arrivals).enumerate() {
        assert!(
            (i - a).abs() < 1e-6,
            "request {k}: issued at {i} s, arrives at {a} s"
        );
    }
}
