//! Values a scenario cannot mean are refused when it is loaded, naming the field and what is
//! allowed, instead of running to a deadlock, an empty report or out of memory.

use crate::default_with;

/// The message of the error `sets` make of the default scenario.
fn refused(sets: &[&str]) -> String {
    match default_with(sets) {
        Ok(_) => panic!("{sets:?} was accepted"),
        Err(e) => {
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg += &format!(": {s}");
                src = s.source();
            }
            msg
        }
    }
}

#[test]
fn the_default_scenario_loads() {
    default_with(&[]).unwrap();
}

#[test]
fn request_counts_rates_and_concurrency_have_upper_bounds() {
    let e = refused(&["workload.num_requests=1000000000001"]);
    assert!(
        e.contains("workload.num_requests") && e.contains("1000000000000"),
        "{e}"
    );
    let e = refused(&["workload.arrival.rate=1e9"]);
    assert!(
        e.contains("workload.arrival.rate") && e.contains("1000000"),
        "{e}"
    );
}

#[test]
fn a_warm_up_needs_a_duration_it_is_shorter_than() {
    let e = refused(&["warmup_s=1000"]);
    assert!(e.contains("warmup_s") && e.contains("duration_s"), "{e}");
    let e = refused(&["warmup_s=100", "duration_s=50"]);
    assert!(e.contains("warmup_s") && e.contains("shorter"), "{e}");
    default_with(&["warmup_s=10", "duration_s=50"]).unwrap();
}

#[test]
fn max_model_len_is_at_least_one_token() {
    let e = refused(&["decode.max_model_len=0"]);
    assert!(
        e.contains("max_model_len") && e.contains("at least 1"),
        "{e}"
    );
}

#[test]
fn mtp_drafts_are_capped() {
    let e = refused(&["mtp.tokens=100000"]);
    assert!(e.contains("mtp.tokens") && e.contains("at most 8"), "{e}");
    default_with(&["mtp.tokens=8"]).unwrap();
}

#[test]
fn an_instances_own_mtp_depth_needs_mtp_on_and_stays_in_range() {
    let e = refused(&["mtp.tokens=0", "prefill.mtp_tokens=1"]);
    assert!(
        e.contains("instance.prefill.mtp_tokens") && e.contains("[mtp] tokens is 0"),
        "{e}"
    );
    for bad in ["0", "9"] {
        let e = refused(&[&format!("decode.mtp_tokens={bad}")]);
        assert!(
            e.contains("instance.decode.mtp_tokens") && e.contains("1 to 8"),
            "{e}"
        );
    }
    // Each instance keeps its own depth; the others take [mtp] tokens.
    let s = default_with(&["prefill.mtp_tokens=1"]).unwrap();
    let depth = |name: &str| {
        s.instances
            .iter()
            .find(|i| i.name == name)
            .unwrap()
            .mtp_tokens
    };
    assert_eq!((depth("prefill"), depth("decode")), (1, 3));
}

#[test]
fn moe_tensor_parallelism_loads_and_refuses_what_it_cannot_run() {
    let s = default_with(&["prefill.tp=16", "prefill.ep=1"]).unwrap();
    let prefill = &s.instances[0];
    assert_eq!((prefill.plan.ep, prefill.plan.moe_tp), (1, 16));
    let e = refused(&["prefill.ep=1"]);
    assert!(
        e.contains("layout.ep = 1") && e.contains("2 attention DP ranks"),
        "{e}"
    );
    for (set, name) in [
        ("eplb.dynamic=true", "eplb.dynamic"),
        ("prefill.flashcomm1=true", "instance.prefill.flashcomm1"),
        ("prefill.placement=\"p.json\"", "instance.prefill.placement"),
    ] {
        let e = refused(&["prefill.tp=16", "prefill.ep=1", set]);
        assert!(e.contains(name) && e.contains("ep = "), "{set}: {e}");
    }
}
