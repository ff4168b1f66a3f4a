//! `dstwin eplb`: placement from a heat map, as a table and as JSON.

use std::process::Command;

fn heat_map(experts: usize, layers: usize) -> String {
    // A skewed, deterministic load: expert e of layer l gets 1000 / (1 + (e * 7 + l) % experts).
    let counts: Vec<Vec<u64>> = (0..layers)
        .map(|l| {
            (0..experts)
                .map(|e| 1000 / (1 + ((e * 7 + l) % experts) as u64))
                .collect()
        })
        .collect();
    serde_json::json!({
        "format": "dstwin-expert-load/1",
        "experts": experts,
        "windows": [{ "start_step": 0, "steps": 600, "counts": counts }]
    })
    .to_string()
}

fn write(name: &str, text: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("dstwin-eplb-{}-{name}", std::process::id()));
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn greedy_placement_beats_identity_and_prints_json() {
    let p = write("ok.json", &heat_map(64, 3));
    let o = Command::new(env!("CARGO_BIN_EXE_dstwin"))
        .args([
            "eplb",
            "--load",
            p.to_str().unwrap(),
            "--dies",
            "16",
            "--redundant",
            "16",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let before = v["before"]["mean_balancedness"].as_f64().unwrap();
    let after = v["after"]["mean_balancedness"].as_f64().unwrap();
    assert!(after > before, "{after} vs {before}");
    let layers = v["placement"]["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 3);
    assert_eq!(layers[0]["phy2log"].as_array().unwrap().len(), 80);
    let text = Command::new(env!("CARGO_BIN_EXE_dstwin"))
        .args([
            "eplb",
            "--load",
            p.to_str().unwrap(),
            "--dies",
            "16",
            "--redundant",
            "16",
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&text.stdout).contains("hottest die / mean"));
    std::fs::remove_file(p).unwrap();
}

#[test]
fn bad_layouts_and_heat_maps_exit_2() {
    let p = write("bad.json", &heat_map(64, 1));
    let o = Command::new(env!("CARGO_BIN_EXE_dstwin"))
        .args(["eplb", "--load", p.to_str().unwrap(), "--dies", "15"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr)
        .contains("slots = 64 do not divide evenly over dies = 15"));
    std::fs::write(&p, heat_map(64, 1).replace("dstwin-expert-load/1", "v0")).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_dstwin"))
        .args(["eplb", "--load", p.to_str().unwrap(), "--dies", "16"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("format"));
    std::fs::remove_file(p).unwrap();
}

#[test]
fn absurd_redundant_counts_are_refused_before_placing() {
    let p = write("many.json", &heat_map(64, 1));
    // 4294967295 would wrap 64 + redundant around u32 to 63 slots; 10^9 would allocate GBs.
    for redundant in ["1000000000", "4294967295"] {
        let o = Command::new(env!("CARGO_BIN_EXE_dstwin"))
            .args(["eplb", "--load", p.to_str().unwrap(), "--dies", "16"])
            .args(["--redundant", redundant])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(&format!("--redundant {redundant}: at most 960")),
            "{stderr}"
        );
    }
    std::fs::remove_file(p).unwrap();
}
