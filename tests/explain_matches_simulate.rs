//! The same deployment priced by `explain` (one steady step) and by a steady `simulate` agree
//! within 2%: both price a step through the same rule (`twin::pricing::price_step`), and a run
//! whose ranks all decode the same batch is nothing but a sequence of such steps.

mod common;
use common::dstwin;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn explain_and_a_steady_simulation_agree_within_two_percent() {
    let o = dstwin(&["simulate", "tests/data/steady-decode.toml", "-q", "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let sim: serde_json::Value = serde_json::from_str(&text(&o.stdout)).unwrap();
    let tpot_sim = sim["latency"]["tpot_ms"]["p50"].as_f64().unwrap();
    // Contexts grow from 1,024 to 2,048 tokens: the mean step is the step at the mean context,
    // attention being linear in it.
    let o = dstwin(&[
        "explain",
        "--hardware",
        "atlas-a3-superpod",
        "--dies",
        "32",
        "--redundant-experts",
        "0",
        "--shared-expert-dies",
        "0",
        "--seqs",
        "8",
        "--kv",
        "1536",
        "--mtp",
        "0",
        "--mlapo",
        "--shared-expert-overlap",
        "--json",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let e: serde_json::Value = serde_json::from_str(&text(&o.stdout)).unwrap();
    let tpot_explain = e["throughput"]["tpot_ms"].as_f64().unwrap();
    let gap = tpot_sim / tpot_explain - 1.0;
    assert!(
        gap.abs() < 0.02,
        "simulate {tpot_sim:.3} ms vs explain {tpot_explain:.3} ms ({:+.2}%)",
        gap * 100.0
    );
}
