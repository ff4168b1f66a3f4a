//! Users' hardware files: a system (with a named or an inline chip) and a cost-model file.
//! Whatever the text, loading returns the validated value or an error naming the field, never
//! panics; what loads prices work and collectives without panicking. Longer runs:
//! docs/robustness.md.

#[path = "../../tests/common/mutate.rs"]
mod mutate;

use dstwin_hwmodels::{
    A2aMode, Catalog, Comm, CommKind, CostModel, CostParams, DType, OpClass, System, Work,
};
use mutate::{apply, config, edits};
use proptest::prelude::*;

const SYSTEMS: [&str; 3] = [
    include_str!("../data/systems/cloudmatrix384.toml"),
    include_str!("../data/systems/atlas-800-a3.toml"),
    include_str!("../data/systems/nvidia-h100-8.toml"),
];
const COST_910C: &str = include_str!("../data/costs/ascend-910c.toml");

/// A system with its chip inline, so that mutations reach the chip's fields too.
const INLINE_CHIP: &str = r#"
name = "inline"
description = "two nodes of an inline chip"
chip = { name = "x", vendor = "v", dies_per_package = 2, peak_tflops = { bf16 = 300.0, int8 = 600.0 }, hbm_gb = 64, hbm_tb_s = 1.6, source = "s" }
cost_model = "ascend-910c"
packages_per_node = 8
max_nodes = 2
reserved_hbm_gb_per_die = 5
source = "test"

[[fabric]]
name = "HCCS"
scope = "node"
bw_gb_s_per_die = 196
latency_us = 1
source = "spec"

[[fabric]]
name = "RoCE"
scope = "cluster"
bw_gb_s_per_die = 25
latency_us = 5
source = "spec"
"#;

/// Prices something on every fabric level of `cm`.
fn price(cm: &CostModel) {
    let s = &cm.system;
    let _ = (s.dies_per_supernode(), s.max_dies());
    for class in OpClass::ALL {
        let _ = cm.compute(&Work {
            class,
            flops: 1e12,
            bytes: 1e9,
            dtype: DType::Int8,
            rows: 64.0,
            slice: 0.0,
        });
    }
    let mut group = 2u32;
    while group <= s.max_dies() {
        for (kind, mode) in [
            (CommKind::Dispatch, A2aMode::LowLatency),
            (CommKind::Combine, A2aMode::Normal),
            (CommKind::AllReduce, A2aMode::Normal),
        ] {
            let _ = cm.comm(&Comm {
                kind,
                bytes: 1e6,
                group,
                mode,
                copies: 8.0,
            });
        }
        group = group.saturating_mul(2).max(group + 1);
    }
}

fn cost_params() -> CostParams {
    toml::from_str(COST_910C).unwrap()
}

proptest! {
    #![proptest_config(config(5000))]

    #[test]
    fn mutated_system_files_load_or_fail_cleanly(seed in 0usize..4, e in edits(4)) {
        let text = if seed < 3 { SYSTEMS[seed] } else { INLINE_CHIP };
        let cat = Catalog::builtin();
        if let Ok(s) = cat.system_from_str("s.toml", &apply(text, &e), None) {
            price(&CostModel::new(s, cost_params()));
        }
    }

    #[test]
    fn mutated_cost_files_load_or_fail_cleanly(e in edits(4)) {
        let parsed: Result<CostParams, _> = toml::from_str(&apply(COST_910C, &e));
        if let Ok(p) = parsed {
            if p.validate("c.toml").is_ok() {
                let s: System = Catalog::builtin().system("cloudmatrix384").unwrap().clone();
                price(&CostModel::new(s, p));
            }
        }
    }

    #[test]
    fn arbitrary_text_fails_cleanly(text in "[ -~\n]{0,200}") {
        prop_assert!(Catalog::builtin().system_from_str("s.toml", &text, None).is_err());
    }
}
