//! Scenario files, `--set` overrides and sweep CSVs: whatever the text, loading returns the scenario or an
//! error, never panics. A failing case prints its input; proptest keeps its seed in
//! `proptest-regressions/`. Longer runs: docs/robustness.md.

use crate::mutate::{apply, config, edits, INTERESTING};
use crate::scenarios;
use dstwin_sim::plot;
use dstwin_sim::scenario::load_str;
use dstwin_sim::sweep::{front_plot, fronts, read_csv, summary_markdown};
use proptest::prelude::*;

/// The shipped scenarios every mutation starts from (the anchors add decode-only and prefill-only
/// shapes, warm-ups and closed loops).
fn seeds() -> Vec<(String, String)> {
    let dir = scenarios();
    [
        "a3-2p1d.toml",
        "cm384-pd.toml",
        "anchors/cm384-decode-b96.toml",
        "anchors/cm384-prefill.toml",
    ]
    .iter()
    .map(|f| (f.to_string(), std::fs::read_to_string(dir.join(f)).unwrap()))
    .collect()
}

/// Fields `--set` is most often given, with instance shorthands.
const PATHS: &[&str] = &[
    "seed",
    "duration_s",
    "warmup_s",
    "mtp.tokens",
    "mtp.acceptance",
    "workload.num_requests",
    "workload.arrival.rate",
    "workload.input.value",
    "workload.output.max",
    "decode.max_num_seqs",
    "decode.max_num_batched_tokens",
    "decode.max_model_len",
    "decode.block_size",
    "decode.dies",
    "decode.tp",
    "decode.dp",
    "decode.ep",
    "decode.count",
    "decode.redundant_experts",
    "prefill.tp",
    "prefill.dies",
    "slo.tpot_ms",
    "model",
    "hardware",
    "kv_dtype",
];

proptest! {
    #![proptest_config(config(3000))]

    #[test]
    fn mutated_scenarios_load_or_fail_cleanly(seed in 0usize..4, e in edits(4)) {
        let (name, text) = &seeds()[seed];
        let mutated = apply(text, &e);
        let _ = load_str(name, &mutated, &scenarios(), &[]);
    }

    #[test]
    fn overrides_load_or_fail_cleanly(
        sets in prop::collection::vec(
            prop_oneof![
                3 => (prop::sample::select(PATHS), prop::sample::select(INTERESTING))
                    .prop_map(|(p, v)| format!("{p}={v}")),
                1 => "[ -~]{0,24}",
            ],
            1..4,
        )
    ) {
        let dir = scenarios();
        let text = std::fs::read_to_string(dir.join("a3-2p1d.toml")).unwrap();
        let _ = load_str("a3-2p1d.toml", &text, &dir, &sets);
    }

    #[test]
    fn arbitrary_text_fails_cleanly(text in "[ -~\n]{0,200}") {
        prop_assert!(load_str("x.toml", &text, &scenarios(), &[]).is_err());
    }

    /// `dstwin report` reads sweep CSVs back: a mutated one reads, or fails naming the line;
    /// what reads makes fronts, their plots and a summary.
    #[test]
    fn mutated_sweep_csvs_read_or_fail_cleanly(e in edits(4)) {
        let csv = include_str!("../data/sweep-tiny-mixed.csv");
        if let Ok((axes, rows)) = read_csv(apply(csv, &e).as_bytes()) {
            for f in fronts(&rows) {
                let p = front_plot(&axes, &rows, &f);
                let _ = (plot::svg(&p), plot::png(&p));
            }
            let _ = summary_markdown(&axes, &rows);
        }
    }
}
