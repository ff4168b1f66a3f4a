use crate::fixture;
use dstwin_traces::spec::{LengthSpec, TimeScaling, TraceFormat, WorkloadPlan};
use dstwin_traces::{TraceError, WorkloadSource, WorkloadSpec};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// A scenario file's shape, as far as this crate is concerned.
#[derive(Deserialize, Serialize)]
struct Scenario {
    workload: WorkloadSpec,
}

fn parse(toml_text: &str) -> Result<WorkloadSpec, toml::de::Error> {
    toml::from_str::<Scenario>(toml_text).map(|s| s.workload)
}

/// The field path and value of the validation error of `toml_text`.
fn invalid(toml_text: &str) -> (String, String) {
    match parse(toml_text).unwrap().validate() {
        Err(TraceError::InvalidParameter { field, value, .. }) => (field, value),
        other => panic!("expected InvalidParameter, got {other:?}"),
    }
}

const SYNTHETIC: &str = r#"
[workload]
kind = "synthetic"
num_requests = 1000
input = { dist = "normal", mean = 3500, std = 500, min = 16 }
output = { dist = "fixed", value = 1500 }
arrival = { process = "poisson", rate = 20.0 }
"#;

fn open(source: WorkloadSource) -> dstwin_traces::Workload {
    match source {
        WorkloadSource::Open(w) => w.into_workload().unwrap(),
        WorkloadSource::ClosedLoop { .. } => panic!("expected an open-loop workload"),
    }
}

#[test]
fn the_documented_synthetic_example_builds_deterministically() {
    let spec = parse(SYNTHETIC).unwrap();
    assert_eq!(
        spec,
        parse(SYNTHETIC).unwrap(),
        "parsing is deterministic too"
    );
    let a = open(spec.build(42, Path::new(".")).unwrap());
    let b = open(spec.build(42, Path::new(".")).unwrap());
    assert_eq!(a.len(), 1000);
    assert_eq!(a, b);
    assert!(a
        .requests()
        .iter()
        .all(|r| r.input_tokens >= 16 && r.output_tokens == 1500));
}

#[test]
fn trace_kinds_resolve_relative_paths_against_the_base_dir_and_transform() {
    let spec = parse(
        r#"
        [workload]
        kind = "mooncake"
        path = "mooncake_conversation_head40.jsonl"
        max_requests = 30
        time_scale = 0.5
        max_duration_s = 3.0
        "#,
    )
    .unwrap();
    let base = fixture("");
    let w = open(spec.build(0, &base).unwrap());
    // The slice has 10, 16, 3 and 9 requests at 0, 3, 5.999 and 9 s; halved, the first three
    // groups arrive within 3 s.
    assert_eq!(w.len(), 10 + 16 + 3);
    assert_eq!(w.last_arrival_ns(), 2_999_500_000);
}

#[test]
fn azure_traces_can_be_retargeted_to_a_rate() {
    let spec = parse(
        r#"
        [workload]
        kind = "azure"
        path = "azure2023_code_head40.csv"
        rate = 4.0
        "#,
    )
    .unwrap();
    match spec.validate().unwrap() {
        WorkloadPlan::Trace(t) => {
            assert_eq!(t.format, TraceFormat::Azure);
            assert_eq!(t.scaling, Some(TimeScaling::Rate(4.0)));
        }
        other => panic!("expected a trace plan, got {other:?}"),
    }
    let w = open(spec.build(0, &fixture("")).unwrap());
    let rate = w.mean_rate_per_s().unwrap();
    assert!((rate - 4.0).abs() < 1e-6, "rate {rate}");
}

#[test]
fn closed_loop_builds_a_sampler_not_a_request_list() {
    let spec = parse(
        r#"
        [workload]
        kind = "closed_loop"
        concurrency = 64
        num_requests = 5000
        input = { dist = "lognormal", mu = 7.0, sigma = 0.8, max = 32768 }
        output = { dist = "uniform", min = 100, max = 400 }
        "#,
    )
    .unwrap();
    match spec.build(9, Path::new(".")).unwrap() {
        WorkloadSource::ClosedLoop {
            concurrency,
            num_requests,
            mut sampler,
            pace,
        } => {
            assert_eq!((concurrency.get(), num_requests.get()), (64, 5000));
            assert!(pace.is_none(), "no arrival: unpaced");
            let l = sampler.next_lengths();
            assert!((1..=32768).contains(&l.input_tokens));
            assert!((100..=400).contains(&l.output_tokens));
        }
        WorkloadSource::Open(_) => panic!("expected a closed loop"),
    }
}

const PACED: &str = r#"
    [workload]
    kind = "closed_loop"
    concurrency = 512
    num_requests = 100
    input = { dist = "fixed", value = 3500 }
    output = { dist = "fixed", value = 1500 }
    arrival = { process = "poisson", rate = 11.2 }
"#;

#[test]
fn a_paced_closed_loop_issues_no_faster_than_its_rate() {
    let pace = |text: &str, seed| match parse(text).unwrap().build(seed, Path::new(".")).unwrap() {
        WorkloadSource::ClosedLoop { pace, .. } => pace,
        WorkloadSource::Open(_) => panic!("expected a closed loop"),
    };
    let times: Vec<u64> = pace(PACED, 3).expect("paced").take(2001).collect();
    assert_eq!(times[0], 0, "the first request at once");
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "in order");
    let rate = 2000.0 / (times[2000] as f64 * 1e-9);
    assert!((rate - 11.2).abs() < 1.0, "mean rate {rate}");
    // The issue times are the synthetic workload's arrivals of the same seed.
    let open = parse(
        "[workload]\nkind = \"synthetic\"\nnum_requests = 5\ninput = { dist = \"fixed\", value = 9 }\noutput = { dist = \"fixed\", value = 9 }\narrival = { process = \"poisson\", rate = 11.2 }\n",
    )
    .unwrap();
    let WorkloadSource::Open(mut w) = open.build(3, Path::new(".")).unwrap() else {
        panic!("open");
    };
    for t in &times[..5] {
        assert_eq!(w.next_request().unwrap().unwrap().arrival_ns, *t);
    }
    // All at once is no pacing.
    let burst = PACED.replace(
        r#"{ process = "poisson", rate = 11.2 }"#,
        r#"{ process = "all_at_once" }"#,
    );
    assert!(pace(&burst, 3).is_none());
    let bad = PACED.replace("rate = 11.2", "rate = -1");
    let e = parse(&bad).unwrap().validate().unwrap_err().to_string();
    assert!(e.contains("workload.arrival.rate"), "{e}");
}

#[test]
fn unknown_fields_are_rejected_at_every_level() {
    let typo = SYNTHETIC.replace("num_requests", "num_request");
    assert!(parse(&typo).is_err());
    let typo = SYNTHETIC.replace("std = 500", "stdev = 500");
    assert!(parse(&typo).is_err());
    let typo = SYNTHETIC.replace("rate = 20.0", "rate = 20.0, burst = 2");
    assert!(parse(&typo).is_err());
    let typo = "[workload]\nkind = \"azure\"\npath = \"x.csv\"\ntimescale = 2.0\n";
    assert!(parse(typo).is_err());
    let unknown_kind = SYNTHETIC.replace("\"synthetic\"", "\"burstgpt\"");
    assert!(parse(&unknown_kind).is_err());
}

#[test]
fn validation_errors_name_the_field_path_and_value() {
    let rate0 = SYNTHETIC.replace("rate = 20.0", "rate = 0.0");
    assert_eq!(
        invalid(&rate0),
        ("workload.arrival.rate".into(), "0".into())
    );
    let neg_std = SYNTHETIC.replace("std = 500", "std = -5");
    assert_eq!(
        invalid(&neg_std),
        ("workload.input.std".into(), "-5".into())
    );
    let min_gt_max = SYNTHETIC.replace("min = 16", "min = 16, max = 8");
    assert_eq!(
        invalid(&min_gt_max),
        ("workload.input.max".into(), "8".into())
    );
    let zero = SYNTHETIC.replace("value = 1500", "value = 0");
    assert_eq!(invalid(&zero), ("workload.output.value".into(), "0".into()));
    let cv = SYNTHETIC.replace(
        r#"{ process = "poisson", rate = 20.0 }"#,
        r#"{ process = "gamma", rate = 20.0, cv = -1.0 }"#,
    );
    assert_eq!(invalid(&cv), ("workload.arrival.cv".into(), "-1".into()));
    let nan = SYNTHETIC.replace("rate = 20.0", "rate = nan");
    assert_eq!(
        invalid(&nan),
        ("workload.arrival.rate".into(), "NaN".into())
    );
}

#[test]
fn exactly_one_request_count_is_required() {
    let both = SYNTHETIC.replace(
        "num_requests = 1000",
        "num_requests = 1000\nduration_s = 60.0",
    );
    assert_eq!(invalid(&both).0, "workload.num_requests");
    let neither = SYNTHETIC.replace("num_requests = 1000", "");
    assert_eq!(invalid(&neither).0, "workload.num_requests");
    let burst_for_a_while = SYNTHETIC
        .replace("num_requests = 1000", "duration_s = 60.0")
        .replace(
            r#"{ process = "poisson", rate = 20.0 }"#,
            r#"{ process = "all_at_once" }"#,
        );
    assert_eq!(invalid(&burst_for_a_while).0, "workload.duration_s");
}

#[test]
fn trace_scaling_is_time_scale_or_rate_not_both() {
    let both = "[workload]\nkind = \"azure\"\npath = \"x.csv\"\ntime_scale = 2.0\nrate = 3.0\n";
    assert_eq!(invalid(both).0, "workload.rate");
    let zero = "[workload]\nkind = \"mooncake\"\npath = \"x.jsonl\"\ntime_scale = 0.0\n";
    assert_eq!(invalid(zero), ("workload.time_scale".into(), "0".into()));
    let none = "[workload]\nkind = \"mooncake\"\npath = \"x.jsonl\"\nmax_requests = 0\n";
    assert_eq!(invalid(none), ("workload.max_requests".into(), "0".into()));
}

#[test]
fn lognormal_takes_one_parameter_pair() {
    let mixed = SYNTHETIC.replace(
        r#"{ dist = "normal", mean = 3500, std = 500, min = 16 }"#,
        r#"{ dist = "lognormal", mean = 3500, sigma = 0.5 }"#,
    );
    assert_eq!(invalid(&mixed).0, "workload.input.dist");
}

#[test]
fn specs_round_trip_through_toml() {
    let spec = parse(SYNTHETIC).unwrap();
    let text = toml::to_string(&Scenario {
        workload: spec.clone(),
    })
    .unwrap();
    assert_eq!(parse(&text).unwrap(), spec);
    let length = LengthSpec::Normal {
        mean: 3500.0,
        std: 500.0,
        min: Some(16),
        max: None,
    };
    match spec {
        WorkloadSpec::Synthetic(s) => assert_eq!(s.input, length),
        other => panic!("expected synthetic, got {other:?}"),
    }
}

#[test]
fn absurd_sizes_are_refused_before_anything_is_generated() {
    let many = SYNTHETIC.replace("num_requests = 1000", "num_requests = 1000000000001");
    assert_eq!(
        invalid(&many),
        ("workload.num_requests".into(), "1000000000001".into())
    );
    let fast = SYNTHETIC.replace("rate = 20.0", "rate = 1e9");
    assert_eq!(
        invalid(&fast),
        ("workload.arrival.rate".into(), "1000000000".into())
    );
    let long = SYNTHETIC.replace("num_requests = 1000", "duration_s = 1e12");
    assert_eq!(invalid(&long).0, "workload.duration_s");
    let crowd = "[workload]\nkind = \"closed_loop\"\nconcurrency = 1000000000\nnum_requests = 10\n\
                 input = { dist = \"fixed\", value = 10 }\noutput = { dist = \"fixed\", value = 10 }\n";
    assert_eq!(
        invalid(crowd),
        ("workload.concurrency".into(), "1000000000".into())
    );
    let trace = "[workload]\nkind = \"azure\"\npath = \"x.csv\"\nrate = 1e12\n";
    assert_eq!(invalid(trace).0, "workload.rate");
    // The bounds themselves are allowed.
    let edge = SYNTHETIC
        .replace("num_requests = 1000", "num_requests = 1000000000000")
        .replace("rate = 20.0", "rate = 1e6");
    assert!(parse(&edge).unwrap().validate().is_ok());
}

#[test]
fn both_request_counts_are_named_in_plain_words() {
    let both = SYNTHETIC.replace(
        "num_requests = 1000",
        "num_requests = 1000\nduration_s = 60.0",
    );
    let e = parse(&both).unwrap().validate().unwrap_err().to_string();
    assert!(!e.contains("Some("), "{e}");
    assert!(e.contains("1000") && e.contains("60"), "{e}");
}
