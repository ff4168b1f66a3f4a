//! Logits match HF transformers' DeepseekV3ForCausalLM on the tiny model (fixtures made by
//! tests/fixtures/gen_reference.py; see tests/fixtures/README.md).
//!
//! Tolerances, relative to the logits' scale (the largest |logit| of the row, about 3):
//! - f32: max abs difference <= 1e-4 x scale on every compared row; same argmax and top-10;
//! - bf16: max abs difference <= 3e-2 x scale (bf16 keeps 8 bits of mantissa; the prefill path
//!   rounds where HF's eager attention does, the absorbed path cannot: its products differ);
//!   same argmax when HF's top-2 gap exceeds twice the tolerance.

use crate::common::*;
use dstwin_cpu::{AttnPath, DType, SeqInput};
use serde_json::Value;

const F32_TOL: f32 = 1e-4;
const BF16_TOL: f32 = 3e-2;

fn reference() -> Value {
    let text = include_str!("../fixtures/hf_reference.json");
    serde_json::from_str(text).unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn check(dtype: DType, name: &str, tol: f32, path: AttnPath) -> f32 {
    let model = tiny(dtype);
    let mut worst = 0f32;
    for run in reference()["runs"][name].as_array().unwrap() {
        let p = ids(&run["prompt"]);
        let want_rows: Vec<Vec<f32>> = match run.get("all_rows") {
            Some(all) => all.as_array().unwrap().iter().map(floats).collect(),
            None => vec![floats(&run["last_row"])],
        };
        let got = prompt_logits(model, &p, want_rows.len(), path);
        for (g, w) in got.iter().zip(&want_rows) {
            let d = max_abs_diff(g, w) / max_abs(w);
            worst = worst.max(d);
            assert!(
                d <= tol,
                "{name} prompt of {}: max diff {d} x scale > {tol}",
                p.len()
            );
        }
        let last = got.last().unwrap();
        let hf = floats(&run["last_row"]);
        let mut order: Vec<usize> = (0..hf.len()).collect();
        order.sort_by(|&a, &b| hf[b].total_cmp(&hf[a]));
        let gap = (hf[order[0]] - hf[order[1]]) / max_abs(&hf);
        let argmax = dstwin_cpu::ops::argmax_rows(
            &dstwin_cpu::Tensor::new(&last[..], &dstwin_cpu::Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap(),
        )
        .unwrap()[0];
        if dtype == DType::F32 || gap > 2.0 * tol {
            assert_eq!(
                argmax as u64,
                run["argmax"].as_u64().unwrap(),
                "{name} prompt of {}",
                p.len()
            );
        }
        if dtype == DType::F32 {
            let mut mine: Vec<usize> = (0..last.len()).collect();
            mine.sort_by(|&a, &b| last[b].total_cmp(&last[a]));
            let top: Vec<u32> = mine[..10].iter().map(|&i| i as u32).collect();
            assert_eq!(
                top,
                ids(&run["top_ids"]),
                "f32 top-10, prompt of {}",
                p.len()
            );
        }
    }
    eprintln!("{name} {path:?}: worst max abs diff / scale = {worst:e}");
    worst
}

#[test]
fn f32_logits_match_transformers_on_the_prefill_path() {
    check(DType::F32, "f32", F32_TOL, AttnPath::Prefill);
}

#[test]
fn f32_logits_match_transformers_on_the_absorbed_path() {
    check(DType::F32, "f32", F32_TOL, AttnPath::Absorbed);
}

#[test]
fn bf16_logits_match_transformers_on_the_prefill_path() {
    check(DType::BF16, "bf16", BF16_TOL, AttnPath::Prefill);
}

#[test]
fn bf16_logits_match_transformers_with_absorbed_decodes() {
    check(DType::BF16, "bf16", BF16_TOL, AttnPath::Auto);
}

#[test]
fn greedy_decode_with_the_cache_matches_transformers_generate() {
    let model = tiny(DType::F32);
    let run = reference()["runs"]["f32"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r.get("greedy").is_some())
        .unwrap()
        .clone();
    let p = ids(&run["prompt"]);
    let want = ids(&run["greedy"]);
    let mut c = cache(model);
    let b = blocks(0, p.len() + want.len());
    let f = model
        .forward(
            &mut c,
            &[SeqInput {
                blocks: &b,
                computed: 0,
                tokens: &p,
                logits: 1,
            }],
            AttnPath::Prefill,
        )
        .unwrap();
    let mut next = dstwin_cpu::ops::argmax_rows(&f.logits).unwrap()[0];
    let mut got = vec![next];
    while got.len() < want.len() {
        let computed = p.len() + got.len() - 1;
        let f = model
            .forward(
                &mut c,
                &[SeqInput {
                    blocks: &b,
                    computed,
                    tokens: &[next],
                    logits: 1,
                }],
                AttnPath::Absorbed,
            )
            .unwrap();
        next = dstwin_cpu::ops::argmax_rows(&f.logits).unwrap()[0];
        got.push(next);
    }
    assert_eq!(got, want);
    let distinct: std::collections::BTreeSet<_> = got.iter().collect();
    assert!(distinct.len() > 4, "greedy output is degenerate: {got:?}");
}
