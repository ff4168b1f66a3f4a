//! Trace readers: whatever the bytes, reading returns a workload (a profile) or an error naming
//! the line, never panics. Longer runs: docs/robustness.md.

use crate::fixture;
use crate::mutate::{apply, config, edits};
use dstwin_traces::profile::{ascend, chrome, communication, Profile};
use dstwin_traces::{azure, mooncake, TraceError};
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

/// A profile reader's error says where: a line (the header counts as line 1) and the file.
fn located(e: &TraceError, origin: &str) -> bool {
    let at_line = match e {
        TraceError::Syntax { line, .. } | TraceError::BadField { line, .. } => *line >= 1,
        TraceError::MissingColumn { .. } => true,
        _ => false,
    };
    at_line && e.to_string().contains(origin)
}

/// What is read is then used as calibration uses it (sums, ends, steps).
fn use_profile(p: Profile) {
    let _ = p.kernel_time_ns();
    for k in &p.kernels {
        let _ = k.end_ns();
    }
    for s in &p.steps {
        let _ = s.end_ns();
    }
}

/// The first events of the Kineto slice, closed again: a mutation case small enough to be fast.
fn kineto_head() -> String {
    let text = read("kineto_h800_train_slice.json");
    let mut lines: Vec<&str> = text.lines().take(40).collect();
    let last = lines.pop().unwrap().trim_end_matches(',');
    lines.push(last);
    format!("{}\n]}}", lines.join("\n"))
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
    fn mutated_chrome_traces_read_or_fail_cleanly(seed in 0usize..3, e in edits(4)) {
        let text = match seed {
            0 => kineto_head(),
            1 => read("trace_view.json"),
            _ => read("cpu_engine_profile.json"),
        };
        match chrome::from_reader(apply(&text, &e).as_bytes(), "t.json") {
            Ok(p) => use_profile(p),
            Err(err) => prop_assert!(located(&err, "t.json"), "{err}"),
        }
    }

    #[test]
    fn mutated_ascend_tables_read_or_fail_cleanly(seed in 0usize..4, e in edits(4)) {
        let name = ["kernel_details_block_dim.csv", "kernel_details_block_num.csv", "op_summary_msprof.csv", "op_statistic.csv"][seed];
        let text = apply(&read(name), &e);
        let read = if seed == 3 {
            ascend::op_statistic_from_reader(text.as_bytes(), name)
        } else {
            ascend::kernel_details_from_reader(text.as_bytes(), name)
        };
        match read {
            Ok(p) => use_profile(p),
            Err(err) => prop_assert!(located(&err, name), "{err}"),
        }
    }

    #[test]
    fn mutated_communication_json_reads_or_fails_cleanly(e in edits(4)) {
        let text = apply(&read("communication.json"), &e);
        match communication::from_reader(text.as_bytes(), "c.json") {
            Ok(p) => use_profile(p),
            Err(err) => prop_assert!(located(&err, "c.json"), "{err}"),
        }
    }

    #[test]
    fn arbitrary_bytes_read_or_fail_cleanly(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = mooncake::from_reader(&bytes[..], "m.jsonl");
        let _ = azure::from_reader(&bytes[..], "a.csv");
        for (read, origin) in [
            (chrome::from_reader(&bytes[..], "t.json"), "t.json"),
            (communication::from_reader(&bytes[..], "c.json"), "c.json"),
            (ascend::kernel_details_from_reader(&bytes[..], "k.csv"), "k.csv"),
            (ascend::op_statistic_from_reader(&bytes[..], "s.csv"), "s.csv"),
        ] {
            if let Err(err) = read {
                prop_assert!(located(&err, origin), "{err}");
            }
        }
    }
}
