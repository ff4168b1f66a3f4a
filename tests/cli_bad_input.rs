//! Values no deployment can mean are refused at the edge, before anything is allocated or run:
//! exit 2, and a message naming the argument or field and the range it takes.

mod common;
use common::dstwin;

/// Runs dstwin, expects exit 2, and returns stderr.
fn refused(args: &[&str]) -> String {
    let o = dstwin(args);
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    stderr
}

fn tmp(name: &str) -> common::TmpDir {
    common::tmp_dir("bad", name)
}

#[test]
fn calibrate_names_unknown_parameters_and_cost_models() {
    let e = refused(&["calibrate", "--fit", "op_overhead_us,bogus"]);
    assert!(
        e.contains("--fit bogus") && e.contains("op_overhead_us"),
        "{e}"
    );
    let e = refused(&["calibrate", "--cost-model", "nope"]);
    assert!(
        e.contains("--cost-model nope") && e.contains("ascend-910c"),
        "{e}"
    );
}

#[test]
fn calibrate_targets_need_positive_published_figures() {
    let dir = tmp("targets");
    let shipped = include_str!("../calibration/data/targets.toml");
    let line = shipped
        .lines()
        .find(|l| l.trim_start().starts_with("published"))
        .unwrap();
    for bad in ["0.0", "nan", "-5.0"] {
        let p = dir.join("t.toml");
        std::fs::write(&p, shipped.replacen(line, &format!("published = {bad}"), 1)).unwrap();
        let e = refused(&["calibrate", "--targets", p.to_str().unwrap()]);
        assert!(
            e.contains("published") && e.contains("positive"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn plan_sizes_and_acceptances_are_checked_first() {
    let e = refused(&["plan", "--input", "4294967295"]);
    assert!(e.contains("at most the context of deepseek-r1"), "{e}");
    let e = refused(&["plan", "--cards", "1000000000"]);
    assert!(e.contains("at most 64 nodes (512 cards)"), "{e}");
    for bad in ["2", "nan", "-0.1"] {
        let e = refused(&["plan", "--mtp-accept", &format!("0.8,{bad}")]);
        assert!(
            e.contains("--mtp-accept: value 2") && e.contains("[0, 1]"),
            "{bad}: {e}"
        );
    }
    // A spread needs two seeds; the count has a ceiling.
    for n in ["0", "1", "65"] {
        let e = refused(&["plan", "--seeds", n]);
        assert!(e.contains(&format!("--seeds {n}: between 2 and 64")), "{e}");
    }
}

#[test]
fn bench_serve_arguments_have_ranges() {
    for (flag, value, range) in [
        ("--num-prompts", "1000000000000", "1..=100000000"),
        ("--input-len", "1000000000", "1..=2097152"),
        ("--output-len", "0", "1..=2097152"),
        ("--max-concurrency", "1000000000", "1 to 1000000"),
    ] {
        let e = refused(&["bench-serve", flag, value]);
        assert!(e.contains(flag) && e.contains(range), "{flag}: {e}");
    }
}

#[test]
fn scenario_bounds_reach_the_command_line() {
    for (set, field) in [
        (
            "workload.num_requests=1000000000001",
            "workload.num_requests",
        ),
        ("workload.arrival.rate=1e9", "workload.arrival.rate"),
        ("warmup_s=1000", "warmup_s"),
        ("decode.max_model_len=0", "max_model_len"),
        ("mtp.tokens=100000", "mtp.tokens"),
    ] {
        let e = refused(&["simulate", "-q", "--set", set]);
        assert!(e.contains(field), "{set}: {e}");
    }
}

#[test]
fn a_config_json_with_absurd_sizes_is_refused() {
    let dir = tmp("config");
    let v3 = include_str!("../engine/core/tests/data/deepseek-v3-config.json");
    for (from, to) in [
        (
            "\"num_hidden_layers\": 61",
            "\"num_hidden_layers\": 1000000000",
        ),
        ("\"num_attention_heads\": 128", "\"num_attention_heads\": 0"),
        ("\"vocab_size\": 129280", "\"vocab_size\": 0"),
        ("\"kv_lora_rank\": 512", "\"kv_lora_rank\": 0"),
    ] {
        assert!(v3.contains(from), "{from}");
        let p = dir.join("config.json");
        std::fs::write(&p, v3.replace(from, to)).unwrap();
        let model = format!("model=\"{}\"", p.display());
        let e = refused(&["simulate", "-q", "--set", &model]);
        let field = to.split('"').nth(1).unwrap();
        assert!(e.contains(field) && e.contains("must be in ["), "{to}: {e}");
    }
}

#[test]
fn messages_speak_the_users_words_not_rusts() {
    let both = refused(&["simulate", "-q", "--set", "workload.duration_s=60"]);
    assert!(!both.contains("Some("), "{both}");
    let dir = tmp("heat");
    let p = dir.join("heat.json");
    std::fs::write(&p, "{").unwrap();
    let e = refused(&["eplb", "--load", p.to_str().unwrap(), "--dies", "4"]);
    assert_eq!(e.matches("EOF while parsing").count(), 1, "{e}");
}

#[test]
fn explain_batch_sizes_are_bounded_before_pricing() {
    // Products of these sizes overflowed u64 in the op graph.
    for (args, field) in [
        (
            &["explain", "--seqs", "4294967295"][..],
            "batch.decode_seqs",
        ),
        (
            &[
                "explain",
                "--role",
                "prefill",
                "--tokens",
                "18446744073709551615",
            ],
            "batch.prefill_tokens",
        ),
        (&["explain", "--mtp", "100000"], "mtp.tokens"),
    ] {
        let e = refused(args);
        assert!(e.contains(field) && e.contains("at most"), "{args:?}: {e}");
    }
    let e = refused(&["simulate", "-q", "--set", "decode.max_num_seqs=4294967295"]);
    assert!(
        e.contains("max_num_seqs") && e.contains("at most 65536"),
        "{e}"
    );
}

#[test]
fn sweep_grids_and_ranges_are_bounded_before_they_are_built() {
    let scenario = common::data("tiny-mixed.toml");
    let out = tmp("sweep");
    let out = out.to_str().unwrap();
    // 10,000^3 points would be built in memory before the first one ran.
    let e = refused(&[
        "sweep",
        &scenario,
        "--out",
        out,
        "--vary",
        "seed=1..9999",
        "--vary",
        "serve.max_num_seqs=1..9999",
        "--vary",
        "serve.block_size=1..9999",
    ]);
    assert!(
        e.contains("at most 1000000") && e.contains("9999 x seed"),
        "{e}"
    );
    // The span of this range overflowed i64.
    let e = refused(&[
        "sweep",
        &scenario,
        "--out",
        out,
        "--vary",
        "seed=-9223372036854775808..9223372036854775807",
    ]);
    assert!(e.contains("more than 10,000 values"), "{e}");
    let e = refused(&[
        "sweep",
        &scenario,
        "--out",
        out,
        "--vary",
        "seed=1,2",
        "--jobs",
        "100000000",
    ]);
    assert!(e.contains("--jobs") && e.contains("1..=1024"), "{e}");
}

/// A hardware file at the slowest figures it may give still prices steps, but a step over a
/// day is refused by the twin with a message, never run to a saturated clock with exit 0; and
/// a peak below the range is refused where the file is read.
#[test]
fn steps_no_deployment_takes_are_refused_not_printed_as_infinite() {
    let dir = tmp("slow-chip");
    let system = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/hwmodels/data/systems/atlas-800-a3.toml"
    ))
    .unwrap();
    let chip = |peak: &str, hbm: &str| {
        format!(
            "chip = {{ name = \"slow\", vendor = \"v\", dies_per_package = 2, peak_tflops = {{ bf16 = {peak}, int8 = {peak} }}, hbm_gb = 64, hbm_tb_s = {hbm}, source = \"s\" }}"
        )
    };
    let write = |name: &str, peak: &str, hbm: &str| {
        let path = dir.join(name);
        std::fs::write(
            &path,
            system.replacen("chip = \"ascend-910c\"", &chip(peak, hbm), 1),
        )
        .unwrap();
        path.to_str().unwrap().to_string()
    };
    // Compute and memory both at their floor: a prefill step is priced at days, whatever the
    // efficiencies a cost file gives.
    let slow = write("slow.toml", "0.001", "0.001");
    let scenario = common::data("tiny-pd.toml");
    let err = refused(&["simulate", &scenario, "--set", &format!("hardware={slow}")]);
    assert!(err.contains("over a day"), "{err}");
    let tiny = write("tiny.toml", "1e-308", "1.6");
    let err = refused(&["explain", "--hardware", &tiny]);
    assert!(err.contains("chip.peak_tflops.bf16 = 1e-308"), "{err}");
}
