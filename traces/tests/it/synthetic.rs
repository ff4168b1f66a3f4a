use dstwin_traces::synthetic::{
    generate, ArrivalProcess, LengthDist, LengthSampler, RequestCount, SyntheticConfig,
};
use dstwin_traces::TraceError;
use proptest::prelude::*;
use std::num::NonZeroU64;

fn config(count: RequestCount, input: LengthDist, arrival: ArrivalProcess) -> SyntheticConfig {
    SyntheticConfig::new(count, input, LengthDist::fixed(8).unwrap(), arrival).unwrap()
}

fn requests(n: u64) -> RequestCount {
    RequestCount::Requests(NonZeroU64::new(n).unwrap())
}

/// Any valid length distribution, with optional clamps.
fn any_length_dist() -> impl Strategy<Value = LengthDist> {
    let shape = prop_oneof![
        (1_u32..100_000).prop_map(|v| LengthDist::fixed(v).unwrap()),
        (1_u32..1000, 0_u32..1000).prop_map(|(a, d)| LengthDist::uniform(a, a + d).unwrap()),
        (1.0_f64..1e5, 0.0_f64..1e5).prop_map(|(m, s)| LengthDist::normal(m, s).unwrap()),
        (1.0_f64..1e5, 0.0_f64..1e5).prop_map(|(m, s)| LengthDist::lognormal(m, s).unwrap()),
        (-5.0_f64..12.0, 0.0_f64..3.0)
            .prop_map(|(m, s)| LengthDist::lognormal_mu_sigma(m, s).unwrap()),
    ];
    let clamp = (
        proptest::option::of(1_u32..5000),
        proptest::option::of(0_u32..50_000),
    );
    (shape, clamp).prop_map(|(d, (min, extra))| {
        let max = extra.map(|e| min.unwrap_or(1) + e);
        d.clamped(min, max).unwrap()
    })
}

fn any_arrival() -> impl Strategy<Value = ArrivalProcess> {
    prop_oneof![
        (0.01_f64..1e4).prop_map(|r| ArrivalProcess::poisson(r).unwrap()),
        (0.01_f64..1e4, 0.05_f64..8.0).prop_map(|(r, cv)| ArrivalProcess::gamma(r, cv).unwrap()),
        Just(ArrivalProcess::all_at_once()),
    ]
}

proptest! {
    #[test]
    fn lengths_stay_within_their_clamps(dist in any_length_dist(), seed: u64) {
        let mut sampler = LengthSampler::new(dist.clone(), dist.clone(), seed);
        for l in sampler.by_ref().take(200) {
            prop_assert!(l.input_tokens >= dist.min().max(1), "{l:?} below {}", dist.min());
            prop_assert!(l.input_tokens <= dist.max(), "{l:?} above {}", dist.max());
        }
    }

    #[test]
    fn arrivals_start_at_zero_and_never_go_back(arrival in any_arrival(), seed: u64) {
        let input = LengthDist::fixed(100).unwrap();
        let w = generate(&config(requests(300), input, arrival), seed);
        prop_assert_eq!(w.len(), 300);
        prop_assert_eq!(w.first_arrival_ns(), 0);
        let r = w.requests();
        prop_assert!(r.windows(2).all(|p| p[0].arrival_ns <= p[1].arrival_ns));
        prop_assert!(r.iter().enumerate().all(|(i, q)| q.id == i as u64));
    }

    #[test]
    fn the_same_seed_gives_identical_requests(
        dist in any_length_dist(), arrival in any_arrival(), seed: u64,
    ) {
        let c = config(requests(100), dist, arrival);
        prop_assert_eq!(generate(&c, seed), generate(&c, seed));
    }

    #[test]
    fn a_duration_bounds_every_arrival(rate in 1.0_f64..1000.0, seed: u64) {
        let end = NonZeroU64::new(2_000_000_000).unwrap();
        let c = config(
            RequestCount::DurationNs(end),
            LengthDist::fixed(1).unwrap(),
            ArrivalProcess::poisson(rate).unwrap(),
        );
        let w = generate(&c, seed);
        prop_assert!(w.last_arrival_ns() < end.get());
    }
}

#[test]
fn different_seeds_give_different_requests() {
    let c = config(
        requests(50),
        LengthDist::normal(1000.0, 300.0).unwrap(),
        ArrivalProcess::poisson(10.0).unwrap(),
    );
    assert_ne!(generate(&c, 1), generate(&c, 2));
}

#[test]
fn changing_the_arrival_process_keeps_the_lengths() {
    let input = LengthDist::lognormal(2000.0, 1500.0).unwrap();
    let lengths = |arrival| {
        let w = generate(&config(requests(64), input.clone(), arrival), 7);
        w.requests()
            .iter()
            .map(|r| r.input_tokens)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        lengths(ArrivalProcess::poisson(5.0).unwrap()),
        lengths(ArrivalProcess::gamma(50.0, 3.0).unwrap())
    );
}

#[test]
fn the_closed_loop_sampler_draws_the_open_loop_lengths() {
    let input = LengthDist::uniform(10, 5000).unwrap();
    let output = LengthDist::normal(300.0, 100.0).unwrap();
    let c = SyntheticConfig::new(
        requests(20),
        input.clone(),
        output.clone(),
        ArrivalProcess::all_at_once(),
    )
    .unwrap();
    let open: Vec<(u32, u32)> = generate(&c, 3)
        .requests()
        .iter()
        .map(|r| (r.input_tokens, r.output_tokens))
        .collect();
    let closed: Vec<(u32, u32)> = LengthSampler::new(input, output, 3)
        .take(20)
        .map(|l| (l.input_tokens, l.output_tokens))
        .collect();
    assert_eq!(open, closed);
}

/// Sample mean and coefficient of variation of the gaps of 20,000 arrivals.
fn gap_moments(arrival: ArrivalProcess) -> (f64, f64) {
    let w = generate(
        &config(requests(20_001), LengthDist::fixed(1).unwrap(), arrival),
        11,
    );
    let gaps: Vec<f64> = w
        .requests()
        .windows(2)
        .map(|p| (p[1].arrival_ns - p[0].arrival_ns) as f64 * 1e-9)
        .collect();
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
    (mean, var.sqrt() / mean)
}

#[test]
fn poisson_and_gamma_gaps_have_the_asked_rate_and_burstiness() {
    let (mean, cv) = gap_moments(ArrivalProcess::poisson(20.0).unwrap());
    assert!((mean - 0.05).abs() < 0.05 * 0.03, "mean gap {mean}");
    assert!((cv - 1.0).abs() < 0.05, "cv {cv}");
    let (mean, cv) = gap_moments(ArrivalProcess::gamma(20.0, 3.0).unwrap());
    assert!((mean - 0.05).abs() < 0.05 * 0.1, "mean gap {mean}");
    assert!((cv - 3.0).abs() < 0.3, "cv {cv}");
}

#[test]
fn lognormal_lengths_have_the_asked_mean_and_std() {
    let dist = LengthDist::lognormal(2000.0, 1000.0).unwrap();
    let draws: Vec<f64> = LengthSampler::new(dist.clone(), dist, 5)
        .take(50_000)
        .map(|l| f64::from(l.input_tokens))
        .collect();
    let mean = draws.iter().sum::<f64>() / draws.len() as f64;
    let std = (draws.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / draws.len() as f64).sqrt();
    assert!((mean - 2000.0).abs() < 30.0, "mean {mean}");
    assert!((std - 1000.0).abs() < 50.0, "std {std}");
}

#[test]
fn invalid_distribution_parameters_name_the_field() {
    let field = |r: Result<LengthDist, TraceError>| match r.unwrap_err() {
        TraceError::InvalidParameter { field, .. } => field,
        other => panic!("expected InvalidParameter, got {other:?}"),
    };
    assert_eq!(field(LengthDist::fixed(0)), "value");
    assert_eq!(field(LengthDist::uniform(0, 5)), "min");
    assert_eq!(field(LengthDist::uniform(6, 5)), "max");
    assert_eq!(field(LengthDist::normal(100.0, -1.0)), "std");
    assert_eq!(field(LengthDist::normal(f64::NAN, 1.0)), "mean");
    assert_eq!(field(LengthDist::lognormal(0.0, 1.0)), "mean");
    assert_eq!(field(LengthDist::lognormal_mu_sigma(1.0, -0.1)), "sigma");
    assert_eq!(
        field(LengthDist::fixed(5).unwrap().clamped(Some(0), None)),
        "min"
    );
    assert_eq!(
        field(LengthDist::fixed(5).unwrap().clamped(Some(9), Some(3))),
        "max"
    );
}

#[test]
fn a_duration_cannot_bound_an_all_at_once_burst() {
    let err = SyntheticConfig::new(
        RequestCount::DurationNs(NonZeroU64::new(1).unwrap()),
        LengthDist::fixed(1).unwrap(),
        LengthDist::fixed(1).unwrap(),
        ArrivalProcess::all_at_once(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("duration_s"), "{err}");
}
