//! `dstwin init-weights`: a deterministic random DeepSeek-V3 checkpoint; bad input exits 2.

use std::process::Command;

fn run(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dstwin"))
        .arg("init-weights")
        .args(args)
        .output()
        .unwrap()
}

fn tmp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("dstwin-init-weights-{}-{name}", std::process::id()))
}

#[test]
fn the_same_seed_writes_the_same_checkpoint() {
    let (a, b) = (tmp("a"), tmp("b"));
    for d in [&a, &b] {
        let o = run(&[
            "--preset",
            "tiny",
            "--seed",
            "3",
            "--out",
            d.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert_eq!(
            std::fs::read(a.join(f)).unwrap(),
            std::fs::read(b.join(f)).unwrap(),
            "{f}"
        );
    }
    for d in [a, b] {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[test]
fn bad_presets_and_configs_exit_2_naming_the_problem() {
    let out = tmp("bad");
    let o = run(&["--preset", "huge", "--out", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--preset huge"));

    let cfg = tmp("llama.json");
    std::fs::write(
        &cfg,
        r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}"#,
    )
    .unwrap();
    let o = run(&[
        "--config",
        cfg.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("model_type 'llama'"));
    let _ = std::fs::remove_file(cfg);

    let o = run(&["--out", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "neither --preset nor --config");
}
