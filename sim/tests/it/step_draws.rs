//! Draws of the twin's step spread (`[host] step_sigma`, `RunOptions::draw`): another draw times
//! the same workload's steps again; without a spread every draw is the same run.

use crate::default_with;
use dstwin_hwmodels::cost::HostParams;
use dstwin_sim::run::{run, RunOptions, RunResult};
use dstwin_sim::scenario::Scenario;

fn draw(s: &Scenario, draw: u64) -> RunResult {
    run(
        s,
        RunOptions {
            per_request: true,
            draw,
            ..RunOptions::default()
        },
    )
    .unwrap()
}

fn with_sigma(sigma: f64) -> Scenario {
    let mut s = default_with(&["workload.num_requests=120", "workload.arrival.rate=8"]).unwrap();
    s.cost.params.host = Some(HostParams {
        step_us: 0.0,
        per_seq_us: 0.0,
        per_token_us: 0.0,
        request_us: 0.0,
        cold_after_us: None,
        cold_factor: None,
        step_sigma: sigma,
        eager_layer_us: 0.0,
        source: "test".into(),
    });
    s
}

#[test]
fn another_draw_times_the_same_workload_again() {
    let s = with_sigma(0.3);
    let (a, again, b) = (draw(&s, 0), draw(&s, 0), draw(&s, 5));
    // Draw 0 is the run without a draw given, and each draw is reproducible.
    let plain = run(
        &s,
        RunOptions {
            per_request: true,
            ..RunOptions::default()
        },
    )
    .unwrap();
    assert_eq!(format!("{:?}", a.report), format!("{:?}", plain.report));
    assert_eq!(format!("{:?}", a.requests), format!("{:?}", again.requests));
    // The workload is the seed's in every draw: the same requests, arriving at the same times
    // with the same lengths; only their timing differs.
    assert_eq!(a.requests.len(), b.requests.len());
    let key = |r: &RunResult| {
        let mut v: Vec<(u64, u32, u32)> = r
            .requests
            .iter()
            .map(|q| ((q.arrival_s * 1e9) as u64, q.input_tokens, q.output_tokens))
            .collect();
        v.sort();
        v
    };
    assert_eq!(key(&a), key(&b));
    let ttfts = |r: &RunResult| r.requests.iter().map(|q| q.ttft_ms).collect::<Vec<_>>();
    assert_ne!(ttfts(&a), ttfts(&b));
    // Without a spread there is nothing to draw: every draw is the same run.
    let flat = with_sigma(0.0);
    assert_eq!(
        format!("{:?}", draw(&flat, 0).requests),
        format!("{:?}", draw(&flat, 5).requests)
    );
}
