//! `dstwin sweep` and `dstwin report` end to end.

mod common;
use common::{data, dstwin, read, stderr_text as err};

use std::path::Path;
use std::process::Output;

fn tmp(name: &str) -> common::TmpDir {
    common::tmp_dir("sweep", name)
}

/// Two batch caps x two DP shapes, one of which does not divide the dies: 4 points, 2 invalid.
fn sweep(out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "sweep",
        &data("tiny-mixed.toml")[..],
        "--vary",
        "serve.max_num_seqs=4,8",
        "--vary",
        "serve.tp=4,5",
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ]
    .into_iter()
    .map(String::from)
    .collect::<Vec<_>>();
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    dstwin(&args)
}

#[test]
fn a_sweep_writes_rows_fronts_plots_and_a_summary() {
    let out = tmp("full");
    let o = sweep(&out, &[]);
    assert!(o.status.success(), "{}", err(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("4 points: 4 simulated, 0 already done, 2 invalid"),
        "{stdout}"
    );
    let csv = read(&out.join("sweep.csv"));
    let mut lines = csv.lines();
    assert!(lines
        .next()
        .unwrap()
        .starts_with("index,id,serve.max_num_seqs,serve.tp,status,reason,cards,"));
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 4);
    assert!(
        rows[0].starts_with("0,") && rows[3].starts_with("3,"),
        "grid order"
    );
    let invalid: Vec<&&str> = rows.iter().filter(|r| r.contains(",invalid,")).collect();
    assert_eq!(invalid.len(), 2);
    assert!(
        invalid.iter().all(|r| r.contains(",5,invalid,")),
        "tp=5 does not divide 32 dies"
    );
    let json: serde_json::Value = serde_json::from_str(&read(&out.join("sweep.json"))).unwrap();
    assert_eq!(json["rows"].as_array().unwrap().len(), 4);
    for f in ["pareto_tpot", "pareto_ttft"] {
        assert!(read(&out.join(format!("{f}.svg"))).starts_with("<svg"));
        let png = std::fs::read(out.join(format!("{f}.png"))).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        assert!(read(&out.join(format!("{f}.csv"))).starts_with("index,id,"));
    }
    let summary = read(&out.join("summary.md"));
    assert!(summary.contains("4 points over serve.max_num_seqs, serve.tp: 2 ran, 2 invalid."));
    assert!(summary.contains("## Invalid points"));

    // The same sweep again: same rows, byte for byte (deterministic).
    let again = tmp("again");
    assert!(sweep(&again, &[]).status.success());
    assert_eq!(csv, read(&again.join("sweep.csv")));

    // `report` regenerates the same summary from the CSV.
    let re = tmp("report");
    let o = dstwin(&[
        "report",
        out.join("sweep.csv").to_str().unwrap(),
        "--out",
        re.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(summary, read(&re.join("summary.md")));
    insta::assert_snapshot!("sweep_summary", summary);
}

#[test]
fn an_interrupted_sweep_resumes_where_it_stopped() {
    let full = tmp("resume-full");
    assert!(sweep(&full, &[]).status.success());
    let expected = read(&full.join("sweep.csv"));
    // Keep the header and one finished row, and a row cut in the middle.
    let out = tmp("resume");
    let mut lines = expected.lines();
    let partial = format!(
        "{}\n{}\n3,abc,8,5,inv",
        lines.next().unwrap(),
        lines.next().unwrap()
    );
    std::fs::write(out.join("sweep.csv"), partial).unwrap();
    let o = sweep(&out, &[]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("3 simulated, 1 already done"));
    assert_eq!(read(&out.join("sweep.csv")), expected);
    // A CSV of another sweep in the same directory is refused.
    let o = dstwin(&[
        "sweep",
        &data("tiny-mixed.toml"),
        "--vary",
        "serve.max_num_seqs=4",
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
}

#[test]
fn shards_merge_into_the_whole_sweep() {
    let full = tmp("shard-full");
    assert!(sweep(&full, &[]).status.success());
    let (a, b) = (tmp("shard-0"), tmp("shard-1"));
    assert!(sweep(&a, &["--shard", "0/2"]).status.success());
    assert!(sweep(&b, &["--shard", "1/2"]).status.success());
    let merged = tmp("merged");
    let o = dstwin(&[
        "report",
        "--merge",
        a.join("sweep.csv").to_str().unwrap(),
        b.join("sweep.csv").to_str().unwrap(),
        "--out",
        merged.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(
        read(&merged.join("sweep.csv")),
        read(&full.join("sweep.csv"))
    );
    assert_eq!(
        read(&merged.join("summary.md")),
        read(&full.join("summary.md"))
    );
}

#[test]
fn a_sweep_file_gives_the_same_grid() {
    let out = tmp("file");
    let file = out.join("axes.txt");
    std::fs::write(
        &file,
        "# batch caps\nserve.max_num_seqs=4,8\n\nserve.tp=4,5  # DP shapes\n",
    )
    .unwrap();
    let o = dstwin(&[
        "sweep",
        &data("tiny-mixed.toml"),
        "--axes",
        file.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "-q",
    ]);
    assert!(o.status.success(), "{}", err(&o));
    let full = tmp("file-ref");
    assert!(sweep(&full, &[]).status.success());
    assert_eq!(read(&out.join("sweep.csv")), read(&full.join("sweep.csv")));
    std::fs::write(&file, "serve.max_num_seqs=4,,8\n").unwrap();
    let o = dstwin(&[
        "sweep",
        &data("tiny-mixed.toml"),
        "--axes",
        file.to_str().unwrap(),
        "-q",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("axes.txt:1"), "{}", err(&o));
}

#[test]
fn bad_axes_and_shards_exit_2_naming_them() {
    let out = tmp("bad");
    for (args, needle) in [
        (vec!["--vary", "serve.max_num_sqs=4,8"], "serve.max_num_sqs"),
        (vec!["--vary", "serve.max_num_seqs=8..4"], "8..4"),
        (vec!["--vary", "serve.max_num_seqs"], "PATH=VALUES"),
        (vec!["--vary", "seed=1", "--shard", "2/2"], "--shard"),
    ] {
        let mut a = vec![
            "sweep",
            &data("tiny-mixed.toml")[..],
            "--out",
            out.to_str().unwrap(),
            "-q",
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
        a.extend(args.iter().map(|s| s.to_string()));
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let o = dstwin(&a);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", err(&o));
        assert!(err(&o).contains(needle), "{args:?}: {}", err(&o));
    }
}

/// Whether Ray is importable by `python3`. CI installs it (.ci/run) and fails without it;
/// elsewhere the test that needs it says it skipped.
fn ray_installed() -> bool {
    let has = std::process::Command::new("python3")
        .args(["-c", "import ray"])
        .status()
        .is_ok_and(|s| s.success());
    if !has {
        assert!(
            std::env::var_os("CI").is_none(),
            "the ray Python package is required in CI"
        );
        eprintln!("skipped: `python3 -c 'import ray'` failed (pip install ray)");
    }
    has
}

/// The Ray driver (sim/cluster/ray_sweep.py) runs the shards as tasks on a local Ray instance
/// and merges them into exactly what the sweep on one machine writes.
#[test]
fn the_ray_driver_merges_its_shards_into_the_one_machine_sweep() {
    if !ray_installed() {
        return;
    }
    let full = tmp("ray-full");
    assert!(sweep(&full, &[]).status.success());
    let study = tmp("ray-study");
    let o = std::process::Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/sim/cluster/ray_sweep.py"
        ))
        .args(["--shards", "3", "--out"])
        .arg(study.to_str().unwrap())
        .args(["--dstwin", env!("CARGO_BIN_EXE_dstwin"), "--"])
        .args([
            &data("tiny-mixed.toml")[..],
            "--vary",
            "serve.max_num_seqs=4,8",
            "--vary",
            "serve.tp=4,5",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", err(&o));
    assert!(err(&o).contains("shard 3/3 done"), "{}", err(&o));
    for f in [
        "sweep.csv",
        "summary.md",
        "pareto_tpot.csv",
        "pareto_ttft.csv",
        "pareto_tpot.svg",
    ] {
        assert_eq!(read(&study.join(f)), read(&full.join(f)), "{f}");
    }
    assert_eq!(
        std::fs::read(study.join("pareto_tpot.png")).unwrap(),
        std::fs::read(full.join("pareto_tpot.png")).unwrap()
    );
    // Three shard files, disjoint, whose rows make up the sweep's.
    let rows: usize = (0..3)
        .map(|k| {
            read(&study.join(format!("shards/shard-{k}-of-3.csv")))
                .lines()
                .count()
                - 1
        })
        .sum();
    assert_eq!(rows, read(&full.join("sweep.csv")).lines().count() - 1);
}
