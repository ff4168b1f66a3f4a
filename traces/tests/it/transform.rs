use dstwin_traces::{TraceError, Workload, WorkloadBuilder};

const S: u64 = 1_000_000_000;

/// Requests arriving at the given seconds, each with its index as hash id.
fn arrivals_at(seconds: &[u64]) -> Workload {
    let mut b = WorkloadBuilder::new("test", Some(512));
    for (i, &s) in seconds.iter().enumerate() {
        b.push(s * S, 100, 10, &[i as u64]);
    }
    b.build().unwrap()
}

fn arrival_s(w: &Workload) -> Vec<f64> {
    w.requests()
        .iter()
        .map(|r| r.arrival_ns as f64 / S as f64)
        .collect()
}

fn field_of(err: TraceError) -> (String, String) {
    match err {
        TraceError::InvalidParameter { field, value, .. } => (field, value),
        other => panic!("expected InvalidParameter, got {other:?}"),
    }
}

#[test]
fn time_scale_multiplies_gaps_and_keeps_the_first_arrival() {
    let w = arrivals_at(&[10, 11, 13]).scale_time(2.0).unwrap();
    assert_eq!(arrival_s(&w), [10.0, 12.0, 16.0]);
    assert!(w.source().ends_with("| time_scale=2"));
}

#[test]
fn rate_scaling_reaches_the_target_mean_rate() {
    // 4 requests over 6 s: 0.5 req/s. Target 2 req/s compresses time by 4.
    let w = arrivals_at(&[0, 1, 3, 6]).scale_to_rate(2.0).unwrap();
    assert_eq!(arrival_s(&w), [0.0, 0.25, 0.75, 1.5]);
    assert_eq!(w.mean_rate_per_s(), Some(2.0));
}

#[test]
fn rate_scaling_needs_arrivals_that_span_time() {
    let err = arrivals_at(&[5, 5]).scale_to_rate(1.0).unwrap_err();
    assert_eq!(field_of(err).0, "rate");
}

#[test]
fn zero_negative_and_nan_factors_name_the_parameter_and_value() {
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let (field, value) = field_of(arrivals_at(&[0, 1]).scale_time(bad).unwrap_err());
        assert_eq!((field.as_str(), value), ("time_scale", bad.to_string()));
        let (field, _) = field_of(arrivals_at(&[0, 1]).scale_to_rate(bad).unwrap_err());
        assert_eq!(field, "rate");
    }
    assert_eq!(
        field_of(arrivals_at(&[0]).truncate_requests(0).unwrap_err()).0,
        "max_requests"
    );
    assert_eq!(
        field_of(arrivals_at(&[0]).truncate_duration(0).unwrap_err()).0,
        "max_duration_ns"
    );
}

#[test]
fn truncation_keeps_the_first_requests_and_their_hash_ids() {
    let w = arrivals_at(&[0, 1, 2, 3]).truncate_requests(2).unwrap();
    assert_eq!(arrival_s(&w), [0.0, 1.0]);
    assert_eq!(w.hash_ids(&w.requests()[1]), &[1]);
    let all = arrivals_at(&[0, 1]).truncate_requests(10).unwrap();
    assert_eq!(all.len(), 2);
}

#[test]
fn a_duration_window_is_measured_from_the_first_arrival_and_excludes_its_end() {
    let w = arrivals_at(&[100, 101, 102, 103])
        .truncate_duration(2 * S)
        .unwrap();
    assert_eq!(arrival_s(&w), [100.0, 101.0]);
    assert_eq!(w.hash_ids(&w.requests()[1]), &[1]);
}

#[test]
fn huge_stretches_are_an_error_not_a_wrap() {
    let err = arrivals_at(&[0, 1_000_000]).scale_time(1e12).unwrap_err();
    assert_eq!(field_of(err).0, "time_scale");
}
