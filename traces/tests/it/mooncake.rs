use crate::fixture;
use dstwin_traces::mooncake::{self, MOONCAKE_BLOCK_TOKENS};
use dstwin_traces::TraceError;

fn read(text: &str) -> Result<dstwin_traces::Workload, TraceError> {
    mooncake::from_reader(text.as_bytes(), "<test>")
}

/// The (line, field, value) of a `BadField` error; panics on any other outcome.
fn bad_field(text: &str) -> (u64, String, String) {
    match read(text) {
        Err(TraceError::BadField {
            line, field, value, ..
        }) => (line, field, value),
        other => panic!("expected a BadField error, got {other:?}"),
    }
}

#[test]
fn conversation_slice_reads_every_line_with_its_hash_ids() {
    let w = mooncake::from_path(fixture("mooncake_conversation_head40.jsonl")).unwrap();
    assert_eq!(w.len(), 40);
    assert_eq!(w.hash_block_tokens(), Some(MOONCAKE_BLOCK_TOKENS));
    let r = w.requests();
    assert_eq!(
        (
            r[0].id,
            r[0].arrival_ns,
            r[0].input_tokens,
            r[0].output_tokens
        ),
        (0, 0, 6758, 500)
    );
    assert_eq!(w.hash_ids(&r[0]), (0..14).collect::<Vec<u64>>());
    assert_eq!(w.last_arrival_ns(), 12_000 * 1_000_000);
    assert_eq!(
        r.iter().map(|r| u64::from(r.input_tokens)).sum::<u64>(),
        506_280
    );
    assert_eq!(
        r.iter().map(|r| u64::from(r.output_tokens)).sum::<u64>(),
        14_962
    );
    assert_eq!(r.iter().map(|r| r.hash_id_count()).sum::<usize>(), 1014);
    assert!(
        w.iter().all(|(_, ids)| ids[0] == 0),
        "every line shares block 0"
    );
    assert!(w.source().contains("mooncake_conversation_head40.jsonl"));
}

#[test]
fn synthetic_slice_reads_every_line() {
    let w = mooncake::from_path(fixture("mooncake_synthetic_head30.jsonl")).unwrap();
    assert_eq!(w.len(), 30);
    assert_eq!(w.last_arrival_ns(), 7_332 * 1_000_000);
    let inputs: u64 = w.requests().iter().map(|r| u64::from(r.input_tokens)).sum();
    assert_eq!(inputs, 426_266);
}

#[test]
fn timestamps_are_kept_as_written_not_shifted_to_zero() {
    let w = read(r#"{"timestamp": 1500, "input_length": 10, "output_length": 2, "hash_ids": [9]}"#)
        .unwrap();
    assert_eq!(w.first_arrival_ns(), 1_500_000_000);
}

#[test]
fn fractional_millisecond_timestamps_are_kept_to_the_nanosecond() {
    let w = read(r#"{"timestamp": 0.25, "input_length": 10, "output_length": 2}"#).unwrap();
    assert_eq!(w.first_arrival_ns(), 250_000);
}

#[test]
fn out_of_order_lines_are_sorted_stably_and_keep_their_line_ids() {
    let text = concat!(
        r#"{"timestamp": 20, "input_length": 1, "output_length": 1}"#,
        "\n",
        r#"{"timestamp": 10, "input_length": 2, "output_length": 1}"#,
        "\n",
        r#"{"timestamp": 20, "input_length": 3, "output_length": 1}"#,
        "\n",
    );
    let w = read(text).unwrap();
    let ids: Vec<u64> = w.requests().iter().map(|r| r.id).collect();
    assert_eq!(ids, [1, 0, 2]);
}

#[test]
fn blank_lines_are_skipped_but_counted() {
    let text = "\n{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1}\n\n{\"timestamp\": 0, \"input_length\": 0, \"output_length\": 1}\n";
    assert_eq!(bad_field(text), (4, "input_length".into(), "0".into()));
}

#[test]
fn hash_ids_may_be_absent() {
    let w = read(r#"{"timestamp": 0, "input_length": 1000, "output_length": 1}"#).unwrap();
    assert_eq!(w.requests()[0].hash_id_count(), 0);
}

#[test]
fn zero_lengths_name_the_line_and_field() {
    let ok = r#"{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}"#;
    let zero_in = r#"{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}"#;
    let zero_out = r#"{"timestamp": 0, "input_length": 5, "output_length": 0, "hash_ids": [1]}"#;
    assert_eq!(
        bad_field(&format!("{ok}\n{zero_in}\n")),
        (2, "input_length".into(), "0".into())
    );
    assert_eq!(
        bad_field(&format!("{ok}\n{ok}\n{zero_out}")),
        (3, "output_length".into(), "0".into())
    );
}

#[test]
fn a_field_of_the_wrong_type_is_named_with_its_value() {
    let text = r#"{"timestamp": 0, "input_length": "many", "output_length": 1}"#;
    assert_eq!(
        bad_field(text),
        (1, "input_length".into(), "\"many\"".into())
    );
    let text = r#"{"timestamp": 0, "input_length": 3, "output_length": -2}"#;
    assert_eq!(bad_field(text), (1, "output_length".into(), "-2".into()));
    let text = r#"{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [1, "x"]}"#;
    assert_eq!(bad_field(text).1, "hash_ids");
}

#[test]
fn a_missing_field_is_named() {
    let text = r#"{"timestamp": 0, "output_length": 1}"#;
    assert_eq!(
        bad_field(text),
        (1, "input_length".into(), "<missing>".into())
    );
}

#[test]
fn a_negative_timestamp_is_rejected() {
    let text = r#"{"timestamp": -5, "input_length": 3, "output_length": 1}"#;
    assert_eq!(bad_field(text), (1, "timestamp".into(), "-5".into()));
}

#[test]
fn lengths_beyond_u32_are_rejected() {
    let text = r#"{"timestamp": 0, "input_length": 5000000000, "output_length": 1}"#;
    assert_eq!(
        bad_field(text),
        (1, "input_length".into(), "5000000000".into())
    );
}

#[test]
fn hash_ids_must_cover_each_started_block() {
    // 513 tokens start 2 blocks of 512.
    let text = r#"{"timestamp": 0, "input_length": 513, "output_length": 1, "hash_ids": [1]}"#;
    let (line, field, _) = bad_field(text);
    assert_eq!((line, field.as_str()), (1, "hash_ids"));
}

#[test]
fn invalid_json_is_a_syntax_error_with_its_line() {
    let text = "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1}\n{\"timestamp\": 0,";
    match read(text) {
        Err(TraceError::Syntax { line, origin, .. }) => {
            assert_eq!((line, origin.as_str()), (2, "<test>"))
        }
        other => panic!("expected a syntax error, got {other:?}"),
    }
    assert!(matches!(
        read("[1, 2]"),
        Err(TraceError::Syntax { line: 1, .. })
    ));
}

#[test]
fn the_error_message_names_origin_line_field_and_value() {
    let text = r#"{"timestamp": 0, "input_length": 0, "output_length": 1}"#;
    let msg = read(text).unwrap_err().to_string();
    assert_eq!(
        msg,
        "<test>:1: field `input_length` = 0: a request needs at least 1 token"
    );
}

#[test]
fn an_empty_trace_is_an_error() {
    assert!(matches!(read(""), Err(TraceError::Empty { .. })));
    assert!(matches!(read("\n \n"), Err(TraceError::Empty { .. })));
}

#[test]
fn a_missing_file_is_an_io_error_naming_the_path() {
    let err = mooncake::from_path(fixture("no_such_trace.jsonl")).unwrap_err();
    assert!(matches!(err, TraceError::Io { .. }));
    assert!(err.to_string().contains("no_such_trace.jsonl"));
}
