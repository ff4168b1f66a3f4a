//! Each instance's own MTP depth (`mtp_tokens`, SGLang's per-server `--speculative-num-steps`):
//! every instance at one depth runs as `[mtp] tokens` at that depth does, and a decode
//! instance's depth is what its steps draft.

use crate::default_with;
use dstwin_sim::run::{run, RunOptions};

fn report(sets: &[&str]) -> dstwin_sim::run::SimReport {
    let mut all = vec!["workload.num_requests=40"];
    all.extend_from_slice(sets);
    run(&default_with(&all).unwrap(), RunOptions::default())
        .unwrap()
        .report
}

#[test]
fn one_depth_everywhere_is_the_global_depth() {
    // The default scenario drafts 3 tokens; both instances set to 1 run as [mtp] tokens = 1.
    let each = report(&["prefill.mtp_tokens=1", "decode.mtp_tokens=1"]);
    let global = report(&["mtp.tokens=1"]);
    let json = |r: &dstwin_sim::run::SimReport| {
        let mut v = serde_json::to_value(r).unwrap();
        v.as_object_mut().unwrap().remove("scenario_hash");
        v
    };
    assert_eq!(json(&each), json(&global));
    // Decode's depth is its own: fewer drafts, fewer tokens per step, a slower TPOT.
    let three = report(&[]);
    let one = report(&["decode.mtp_tokens=1"]);
    let tpot = |r: &dstwin_sim::run::SimReport| r.latency.tpot_ms.mean;
    assert!(
        tpot(&one) > tpot(&three),
        "{} vs {}",
        tpot(&one),
        tpot(&three)
    );
    // A prefill instance's depth prices only its prompt steps' draft passes.
    let prefill_one = report(&["prefill.mtp_tokens=1"]);
    let step = |r: &dstwin_sim::run::SimReport, n: &str| {
        r.instances
            .iter()
            .find(|i| i.name.starts_with(n))
            .unwrap()
            .mean_step_ms
    };
    assert!(step(&prefill_one, "prefill") < step(&three, "prefill"));
}
