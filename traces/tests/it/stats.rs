use crate::fixture;
use dstwin_traces::{mooncake, WorkloadBuilder};

#[test]
fn percentiles_are_nearest_rank_and_the_rate_is_per_gap() {
    let mut b = WorkloadBuilder::new("test", None);
    for (i, len) in (1..=100).enumerate() {
        b.push(i as u64 * 500_000_000, len, 101 - len, &[]);
    }
    let s = b.build().unwrap().stats();
    assert_eq!(s.requests, 100);
    assert_eq!(s.span_s, 49.5);
    assert_eq!(s.mean_rate_per_s, Some(2.0));
    assert_eq!(
        (
            s.input.min,
            s.input.p50,
            s.input.p90,
            s.input.p99,
            s.input.max
        ),
        (1, 50, 90, 99, 100)
    );
    assert_eq!(s.input.mean, 50.5);
    assert_eq!(s.output.total, 5050);
    assert_eq!(s.prefix_reuse_share, None);
}

#[test]
fn prefix_reuse_counts_leading_blocks_seen_before() {
    let mut b = WorkloadBuilder::new("test", Some(512));
    b.push(0, 1024, 1, &[1, 2]); // all new
    b.push(1, 1100, 1, &[1, 2, 3]); // 1024 of 1100 tokens reused
    b.push(2, 600, 1, &[4, 2]); // block 2 seen, but not as a prefix: nothing reused
    b.push(3, 300, 1, &[1]); // its one partial block is a seen prefix: 300 reused
    let s = b.build().unwrap().stats();
    let expected = (1024.0 + 300.0) / (1024.0 + 1100.0 + 600.0 + 300.0);
    assert_eq!(s.prefix_reuse_share, Some(expected));
}

#[test]
fn a_burst_has_no_rate() {
    let mut b = WorkloadBuilder::new("test", None);
    b.push(7, 1, 1, &[]);
    b.push(7, 1, 1, &[]);
    let s = b.build().unwrap().stats();
    assert_eq!((s.span_s, s.mean_rate_per_s), (0.0, None));
}

#[test]
fn the_conversation_slice_shares_its_system_prompt_block() {
    let w = mooncake::from_path(fixture("mooncake_conversation_head40.jsonl")).unwrap();
    let s = w.stats();
    // Every line starts with hash id 0: all but the first reuse one 512-token block.
    assert_eq!(s.prefix_reuse_share, Some(39.0 * 512.0 / 506_280.0));
    assert_eq!(s.input.total, 506_280);
    let text = s.to_string();
    assert!(text.contains("requests      40"), "{text}");
}

/// The one interpolating quantile: linear between order statistics, as numpy's default.
#[test]
fn quantiles_interpolate_between_order_statistics() {
    use dstwin_traces::quantile;
    let v = [1.0, 2.0, 4.0, 8.0];
    assert_eq!(quantile(&v, 0.0), 1.0);
    assert_eq!(quantile(&v, 1.0), 8.0);
    assert_eq!(quantile(&v, 0.5), 3.0);
    assert!((quantile(&v, 0.9) - 6.8).abs() < 1e-12);
    assert_eq!(quantile(&[5.0], 0.1), 5.0);
    assert!(quantile(&[], 0.5).is_nan());
}
