use crate::fixture;
use dstwin_traces::{azure, TraceError, Workload};

fn read(text: &str) -> Result<Workload, TraceError> {
    azure::from_reader(text.as_bytes(), "<test>")
}

const HEADER: &str = "TIMESTAMP,ContextTokens,GeneratedTokens\n";

#[test]
fn code_slice_arrivals_are_offsets_from_the_first_row() {
    let w = azure::from_path(fixture("azure2023_code_head40.csv")).unwrap();
    assert_eq!(w.len(), 40);
    assert_eq!(w.hash_block_tokens(), None);
    let r = w.requests();
    assert_eq!(
        (r[0].arrival_ns, r[0].input_tokens, r[0].output_tokens),
        (0, 4808, 10)
    );
    // 18:17:03.9799600 -> 18:17:04.0319600
    assert_eq!(r[1].arrival_ns, 52_000_000);
    // 18:17:03.9799600 -> 18:17:38.2643990
    assert_eq!(w.last_arrival_ns(), 34_284_439_000);
    assert_eq!(
        r.iter().map(|r| u64::from(r.input_tokens)).sum::<u64>(),
        105_353
    );
    assert_eq!(
        r.iter().map(|r| u64::from(r.output_tokens)).sum::<u64>(),
        902
    );
}

#[test]
fn conversation_slice_reads_every_row() {
    let w = azure::from_path(fixture("azure2023_conv_head40.csv")).unwrap();
    assert_eq!(w.len(), 40);
    assert_eq!(w.last_arrival_ns(), 24_146_296_000);
    assert_eq!(
        w.requests()
            .iter()
            .map(|r| u64::from(r.output_tokens))
            .sum::<u64>(),
        4_430
    );
}

#[test]
fn columns_are_found_by_name_in_any_order() {
    let text = "GeneratedTokens,TIMESTAMP,Extra,ContextTokens\n7,2023-11-16 18:17:03,x,100\n";
    let r = read(text).unwrap().requests()[0];
    assert_eq!((r.input_tokens, r.output_tokens), (100, 7));
}

#[test]
fn rows_out_of_order_are_offset_from_the_earliest() {
    let text = format!("{HEADER}2023-11-16 18:17:05,1,1\n2023-11-16 18:17:03,2,1\n");
    let w = read(&text).unwrap();
    let got: Vec<(u64, u64)> = w.requests().iter().map(|r| (r.id, r.arrival_ns)).collect();
    assert_eq!(got, [(1, 0), (0, 2_000_000_000)]);
}

#[test]
fn a_bad_timestamp_names_line_field_and_value() {
    let text = format!("{HEADER}2023-11-16 18:17:03.1,1,1\n2023-11-16 25:00:00.0,1,1\n");
    match read(&text) {
        Err(TraceError::BadField {
            line, field, value, ..
        }) => {
            assert_eq!(
                (line, field.as_str(), value.as_str()),
                (3, "TIMESTAMP", "2023-11-16 25:00:00.0")
            )
        }
        other => panic!("expected a BadField error, got {other:?}"),
    }
}

#[test]
fn zero_and_non_numeric_token_counts_name_line_and_column() {
    let text = format!("{HEADER}2023-11-16 18:17:03,0,5\n");
    let err = read(&text).unwrap_err().to_string();
    assert_eq!(
        err,
        "<test>:2: field `ContextTokens` = 0: a request needs at least 1 token"
    );
    let text = format!("{HEADER}2023-11-16 18:17:03,5,1\n2023-11-16 18:17:04,5,1.5\n");
    match read(&text) {
        Err(TraceError::BadField {
            line, field, value, ..
        }) => {
            assert_eq!(
                (line, field.as_str(), value.as_str()),
                (3, "GeneratedTokens", "1.5")
            )
        }
        other => panic!("expected a BadField error, got {other:?}"),
    }
}

#[test]
fn a_row_with_missing_columns_is_a_syntax_error_with_its_line() {
    let text = format!("{HEADER}2023-11-16 18:17:03,5,1\n2023-11-16 18:17:04,5\n");
    assert!(matches!(
        read(&text),
        Err(TraceError::Syntax { line: 3, .. })
    ));
}

#[test]
fn a_header_without_the_columns_names_the_missing_one() {
    let err = read("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03,5\n").unwrap_err();
    match err {
        TraceError::MissingColumn { column, .. } => assert_eq!(column, "GeneratedTokens"),
        other => panic!("expected MissingColumn, got {other:?}"),
    }
}

#[test]
fn an_empty_trace_is_an_error() {
    assert!(matches!(read(HEADER), Err(TraceError::Empty { .. })));
    assert!(matches!(read(""), Err(TraceError::MissingColumn { .. })));
}
