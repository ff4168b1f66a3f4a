//! A command whose every result is invalid did not work: it exits non-zero with the reasons,
//! instead of an empty table and exit 0.

mod common;
use common::{data, dstwin};

#[test]
fn a_plan_with_no_valid_layout_fails_with_the_reasons() {
    // DeepSeek-R1 in W8A8 does not fit one 8-GPU H100 node (the only layouts of 8 cards are
    // aggregated on that node).
    let o = dstwin(&["plan", "--hardware", "nvidia-h100-8", "--cards", "8", "-q"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("no layout of deepseek-r1 on 8 cards of nvidia-h100-8 is valid"),
        "{stderr}"
    );
    assert!(stderr.contains("does not fit in HBM"), "{stderr}");
    assert!(o.stdout.is_empty());
}

#[test]
fn a_sweep_whose_every_point_is_invalid_fails() {
    let out = std::env::temp_dir().join(format!("dstwin-nothing-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    // TP 5 and 7 divide none of the 16 dies of the instance.
    let o = dstwin(&[
        "sweep",
        &data("tiny-mixed.toml"),
        "--vary",
        "serve.tp=5,7",
        "--out",
        out.to_str().unwrap(),
        "-q",
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("every one of the 2 points is invalid"),
        "{stderr}"
    );
    // The rows with their reasons are still written, for the record.
    let csv = std::fs::read_to_string(out.join("sweep.csv")).unwrap();
    assert_eq!(csv.matches(",invalid,").count(), 2, "{csv}");
    std::fs::remove_dir_all(&out).unwrap();
    // A shard is part of a study whose other shards may hold valid points: a note, exit 0.
    let o = dstwin(&[
        "sweep",
        &data("tiny-mixed.toml"),
        "--vary",
        "serve.tp=4,5",
        "--shard",
        "1/2",
        "--out",
        out.to_str().unwrap(),
        "-q",
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains("every one of the 1 points of shard 1/2 is invalid"),
        "{stderr}"
    );
    std::fs::remove_dir_all(out).unwrap();
}
