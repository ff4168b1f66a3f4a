//! MLA's two computations agree: up-projecting the latent context (prefill) and attending
//! against the latents with `kv_b_proj` absorbed (decode).

use crate::common::*;
use dstwin_cpu::{AttnPath, DType};

#[test]
fn prefill_and_absorbed_paths_give_the_same_logits() {
    let model = tiny(DType::F32);
    for n in [1, 5, 40] {
        let p = prompt(n, 10 + n as u64);
        let a = prompt_logits(model, &p, n.min(5), AttnPath::Prefill);
        let b = prompt_logits(model, &p, n.min(5), AttnPath::Absorbed);
        for (x, y) in a.iter().zip(&b) {
            let d = max_abs_diff(x, y) / max_abs(x);
            assert!(d < 1e-5, "prompt of {n}: {d}");
        }
    }
}

#[test]
fn yarn_changes_the_logits() {
    // The tiny preset has YaRN on; without it attention (and so the logits) differ, which shows
    // the scaled frequencies and mscale reach the computation.
    let model = tiny(DType::F32);
    let p = prompt(33, 11);
    let with = prompt_logits(model, &p, 1, AttnPath::Auto);
    let mut plain = model.clone();
    plain.cfg.rope_scaling = None;
    plain.rope = dstwin_cpu::rope::Rope::new(&plain.cfg);
    let without = prompt_logits(&plain, &p, 1, AttnPath::Auto);
    assert!(max_abs_diff(&with[0], &without[0]) > 1e-3);
}

#[test]
fn a_model_without_query_lora_uses_q_proj() {
    let mut cfg = dstwin_cpu::init::preset_config("tiny").unwrap();
    cfg["q_lora_rank"] = serde_json::Value::Null;
    cfg["num_hidden_layers"] = serde_json::Value::from(2);
    let d = temp_dir("no-q-lora");
    dstwin_cpu::init_weights(&cfg, 5, &d).unwrap();
    let model = dstwin_cpu::Model::load(&d, DType::F32, &dstwin_cpu::Device::Cpu).unwrap();
    assert_eq!(model.cfg.q_lora_rank, None);
    assert!(matches!(
        model.layers[0].attn.q,
        dstwin_cpu::attention::QProj::Full(_)
    ));
    let p = prompt(21, 12);
    let a = prompt_logits(&model, &p, 2, AttnPath::Prefill);
    let b = prompt_logits(&model, &p, 2, AttnPath::Absorbed);
    for (x, y) in a.iter().zip(&b) {
        assert!(max_abs_diff(x, y) / max_abs(x) < 1e-5);
    }
    let _ = std::fs::remove_dir_all(d);
}
