//! Trace readers: whatever the bytes, reading returns a workload or an error naming the line,
//! never panics. Longer runs: docs/robustness.md.

use crate::fixture;
use crate::mutate::{apply, config, edits};
use dstwin_traces::{azure, mooncake};
use proptest::prelude::*;

fn read(name: &str) -> String {
    std::fs::read_to_string(fixture(name)).unwrap()
}

/// Transformations run on what was read, as a scenario's trace options would.
fn transform(w: dstwin_traces::Workload) {
    let _ = w.clone().scale_time(0.5);
    let _ = w.clone().scale_to_rate(10.0);
    let _ = w.clone().truncate_requests(5);
    let _ = w.truncate_duration(1_000_000_000);
}

proptest! {
    #![proptest_config(config(5000))]

    #[test]
    fn mutated_mooncake_traces_read_or_fail_cleanly(seed in 0usize..2, e in edits(4)) {
        let text = read(["mooncake_conversation_head40.jsonl", "mooncake_synthetic_head30.jsonl"][seed]);
        if let Ok(w) = mooncake::from_reader(apply(&text, &e).as_bytes(), "m.jsonl") {
            transform(w);
        }
    }

    #[test]
    fn mutated_azure_traces_read_or_fail_cleanly(seed in 0usize..2, e in edits(4)) {
        let text = read(["azure2023_code_head40.csv", "azure2023_conv_head40.csv"][seed]);
        if let Ok(w) = azure::from_reader(apply(&text, &e).as_bytes(), "a.csv") {
            transform(w);
        }
    }

    #[test]
    fn arbitrary_bytes_read_or_fail_cleanly(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = mooncake::from_reader(&bytes[..], "m.jsonl");
        let _ = azure::from_reader(&bytes[..], "a.csv");
    }
}
