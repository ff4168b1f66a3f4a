//! Kernel rule files and the trace fits, whatever their input: a rule file parses or is an error
//! naming it, never a panic; mapped profiles of mutated traces summarize to shares that add up;
//! the efficiency fit of any positive samples returns parameters inside their bounds.
//! Longer runs: docs/robustness.md.

#[path = "../../tests/common/mutate.rs"]
mod mutate;

use dstwin_calibration::kernels::rules::{ASCEND_RULES, CUDA_RULES};
use dstwin_calibration::kernels::{map_kernels, summarize, Backend, RuleSet};
use dstwin_calibration::tracefit::efficiency::{fit_class, ClassParams, Sample};
use dstwin_traces::profile::ascend;
use mutate::{apply, config, edits};
use proptest::prelude::*;

fn fixture(name: &str) -> String {
    let p = format!("{}/../traces/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(p).unwrap()
}

const PRIOR: ClassParams = ClassParams {
    compute: 0.7,
    memory: 0.8,
    rows_pad: 0.0,
    fixed_us: 1.0,
};

proptest! {
    #![proptest_config(config(1000))]

    #[test]
    fn mutated_rule_files_parse_or_fail_cleanly(seed in 0usize..2, e in edits(4)) {
        let text = apply([ASCEND_RULES, CUDA_RULES][seed], &e);
        if let Err(err) = RuleSet::parse("r.toml", &text) {
            prop_assert!(err.to_string().contains("r.toml"));
        }
    }

    #[test]
    fn mapped_mutated_tables_add_up(seed in 0usize..2, e in edits(4)) {
        let name = ["kernel_details_block_dim.csv", "kernel_details_block_num.csv"][seed];
        if let Ok(p) = ascend::kernel_details_from_reader(apply(&fixture(name), &e).as_bytes(), name) {
            let t = map_kernels(&p, Backend::Ascend, &Backend::Ascend.builtin_rules());
            let s = summarize(p.kernels.iter().zip(&t));
            let total = s.mapped_share + s.outside_share + s.unmapped_share;
            prop_assert!(s.time_ms == 0.0 || (total - 1.0).abs() < 1e-9, "{total}");
        }
    }
}

proptest! {
    // Each case is a whole fit (tens of least-squares solves): fewer cases.
    #![proptest_config(config(300))]

    #[test]
    fn the_efficiency_fit_stays_inside_its_bounds(
        raw in prop::collection::vec((1e3f64..1e15, 1e2f64..1e12, prop::option::of(1f64..1e5), 0.1f64..1e5), 0..24)
    ) {
        let samples: Vec<Sample> = raw
            .iter()
            .map(|&(flops, bytes, rows, time_us)| Sample {
                flops,
                bytes,
                rows,
                peak_flops: 1e15,
                hbm_bytes_per_s: 2e12,
                time_us,
            })
            .collect();
        match fit_class(&samples, PRIOR) {
            None => prop_assert!(samples.is_empty()),
            Some(f) => {
                let p = f.params;
                prop_assert!(p.compute > 0.0 && p.compute <= 1.0 + 1e-9, "{p:?}");
                prop_assert!(p.memory > 0.0 && p.memory <= 1.0 + 1e-9, "{p:?}");
                prop_assert!(p.rows_pad >= -1e-9 && p.rows_pad.is_finite(), "{p:?}");
                prop_assert!(p.fixed_us >= -1e-9 && p.fixed_us.is_finite(), "{p:?}");
                prop_assert!(f.rms_error.is_finite());
            }
        }
    }
}
