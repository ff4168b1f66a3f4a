//! The engine's file parsers: a HuggingFace config.json and an expert heat map. Whatever the
//! text, parsing returns a value or an error naming the field, never panics; what parses is
//! sized (parameters, KV bytes, placement) without overflow. Longer runs: docs/robustness.md.

#[path = "../../../tests/common/mutate.rs"]
mod mutate;

use dstwin_core::eplb::heatmap::HeatMap;
use dstwin_core::eplb::{place, EpLayout, Policy};
use dstwin_core::model::{self, kv_bytes, ModelConfig};
use dstwin_hwmodels::DType;
use mutate::{apply, config, edits};
use proptest::prelude::*;

const V3_CONFIG_JSON: &str = include_str!("data/deepseek-v3-config.json");

/// A small heat map: 2 windows of 3 layers x 8 experts.
fn heat_map() -> String {
    let window = |start: u64| {
        let counts: Vec<Vec<u64>> = (0..3u64)
            .map(|l| (0..8u64).map(|e| 100 + 37 * ((e * 5 + l) % 8)).collect())
            .collect();
        serde_json::json!({ "start_step": start, "steps": 100, "counts": counts })
    };
    serde_json::json!({
        "format": "dstwin-expert-load/1",
        "experts": 8,
        "windows": [window(0), window(100)],
    })
    .to_string()
}

/// Everything sized from a model config: must not overflow for any config that validates.
fn size(m: &ModelConfig) {
    let p = model::count(m);
    let _ = p.total();
    let _ = model::active(m);
    for d in [DType::Bf16, DType::Int8] {
        for ascend in [false, true] {
            let _ = kv_bytes(m, d, model::index_key_dtype(m, d, ascend), m.mtp_layers);
        }
    }
}

proptest! {
    #![proptest_config(config(5000))]

    #[test]
    fn mutated_config_json_loads_or_fails_cleanly(e in edits(4)) {
        if let Ok(m) = ModelConfig::from_hf_json("x", &apply(V3_CONFIG_JSON, &e)) {
            size(&m);
        }
    }

    #[test]
    fn arbitrary_config_text_fails_cleanly(text in "[ -~\n]{0,200}") {
        prop_assert!(ModelConfig::from_hf_json("x", &text).is_err());
    }

    #[test]
    fn mutated_heat_maps_parse_or_fail_cleanly(e in edits(4), dies in 1u32..9, redundant in 0u32..17) {
        if let Ok(h) = HeatMap::parse(&apply(&heat_map(), &e)) {
            let load = h.total();
            let layout = EpLayout {
                slots: h.experts.saturating_add(redundant),
                dies,
                dies_per_node: dies,
                groups: 1,
            };
            for policy in [Policy::Identity, Policy::Greedy, Policy::Global] {
                let _ = place(policy, &load, &layout);
            }
        }
    }

    #[test]
    fn arbitrary_heat_map_text_fails_cleanly(text in "[ -~\n]{0,200}") {
        prop_assert!(HeatMap::parse(&text).is_err());
    }
}
