//! `dstwin calibrate` on a targets file of its own: the fit of the parameters asked for, its
//! residuals per target, and stderr left alone off a terminal or with `--quiet`.

mod common;
use common::dstwin;

/// The first target of the shipped file (CloudMatrix-Infer's decode TPOT), fitted alone on one
/// parameter: the tables name the target and the parameter, and nothing goes to stderr (the
/// progress line is drawn only on a terminal).
#[test]
fn calibrate_fits_a_targets_file_of_its_own_quietly() {
    let dir = common::tmp_dir("calibrate", "one-target");
    let shipped = include_str!("../calibration/data/targets.toml");
    let first = shipped.split("[[target]]").nth(1).unwrap();
    let p = dir.join("one.toml");
    std::fs::write(&p, format!("[[target]]{first}")).unwrap();
    for quiet in [false, true] {
        let mut args = vec![
            "calibrate",
            "--targets",
            p.to_str().unwrap(),
            "--fit",
            "op_overhead_us",
        ];
        if quiet {
            args.push("--quiet");
        }
        let o = dstwin(&args);
        let out = String::from_utf8_lossy(&o.stdout);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        assert!(err.is_empty(), "stderr off a terminal: {err}");
        assert!(
            out.contains("cm384-decode-b96-tpot") && out.contains("op_overhead_us"),
            "{out}"
        );
    }
}
