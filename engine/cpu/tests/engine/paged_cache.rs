//! The paged latent cache: where a sequence's blocks are and how its prompt is cut into chunks
//! change nothing; a decode after a prefill equals the prefill of the longer prompt; sequences
//! batched together equal each run alone.

use crate::common::*;
use dstwin_cpu::{AttnPath, DType, Model, SeqInput};

const TOL: f32 = 2e-5;

fn assert_close(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: rows");
    for (x, y) in a.iter().zip(b) {
        let d = max_abs_diff(x, y) / max_abs(y);
        assert!(d <= TOL, "{what}: max diff {d} x scale");
    }
}

/// The last chunk's logits of prompt `p` computed in chunks of `cuts` tokens on `blocks`.
fn chunked_logits(
    model: &Model,
    p: &[u32],
    blocks: &[u32],
    cuts: &[usize],
    path: AttnPath,
) -> Vec<Vec<f32>> {
    let mut c = cache(model);
    let mut computed = 0;
    let mut last = None;
    for &n in cuts {
        let f = model
            .forward(
                &mut c,
                &[SeqInput {
                    blocks,
                    computed,
                    tokens: &p[computed..computed + n],
                    logits: 1,
                }],
                path,
            )
            .unwrap();
        computed += n;
        last = Some(f.logits.to_vec2().unwrap());
    }
    last.expect("at least one chunk")
}

#[test]
fn scattered_blocks_give_the_logits_of_contiguous_ones() {
    let model = tiny(DType::F32);
    let p = prompt(40, 1);
    let want = prompt_logits(model, &p, 3, AttnPath::Auto);
    let mut c = cache(model);
    let scattered = [17u32, 3, 42];
    let f = model
        .forward(
            &mut c,
            &[SeqInput {
                blocks: &scattered,
                computed: 0,
                tokens: &p,
                logits: 3,
            }],
            AttnPath::Auto,
        )
        .unwrap();
    assert_close(&f.logits.to_vec2().unwrap(), &want, "blocks 17, 3, 42");
}

#[test]
fn chunked_prefill_gives_the_logits_of_one_chunk() {
    let model = tiny(DType::F32);
    let p = prompt(45, 2);
    let want = prompt_logits(model, &p, 1, AttnPath::Prefill);
    for cuts in [vec![45], vec![20, 25], vec![1, 16, 28], vec![13, 13, 19]] {
        for path in [AttnPath::Prefill, AttnPath::Absorbed] {
            let last = chunked_logits(model, &p, &[5, 9, 2], &cuts, path);
            assert_close(&last, &want, &format!("chunks {cuts:?} on {path:?}"));
        }
    }
}

#[test]
fn prefill_tiles_of_queries_give_the_logits_of_whole_masked_attention() {
    // The prefill path attends by tiles of 64 queries, each against the keys its last query
    // sees; the absorbed path attends every query against the whole context under a mask.
    // Chunks that start inside a tile's span and cross tiles give the same logits.
    let model = tiny(DType::F32);
    let p = prompt(200, 7);
    let want = prompt_logits(model, &p, 1, AttnPath::Absorbed);
    let b: Vec<u32> = (20..33).collect();
    for cuts in [vec![200], vec![70, 130], vec![150, 50], vec![1, 64, 135]] {
        let last = chunked_logits(model, &p, &b, &cuts, AttnPath::Prefill);
        assert_close(&last, &want, &format!("prefill chunks {cuts:?}"));
    }
}

#[test]
fn prefill_then_decode_equals_prefill_of_the_longer_prompt() {
    let model = tiny(DType::F32);
    let p = prompt(30, 3);
    let mut c = cache(model);
    let b = blocks(0, p.len());
    model
        .forward(
            &mut c,
            &[SeqInput {
                blocks: &b,
                computed: 0,
                tokens: &p[..27],
                logits: 1,
            }],
            AttnPath::Prefill,
        )
        .unwrap();
    // Three decodes, then the last two positions as an MTP-style verification of 1 + 1 tokens.
    for i in 27..28 {
        model
            .forward(
                &mut c,
                &[SeqInput {
                    blocks: &b,
                    computed: i,
                    tokens: &p[i..i + 1],
                    logits: 1,
                }],
                AttnPath::Absorbed,
            )
            .unwrap();
    }
    let f = model
        .forward(
            &mut c,
            &[SeqInput {
                blocks: &b,
                computed: 28,
                tokens: &p[28..],
                logits: 2,
            }],
            AttnPath::Absorbed,
        )
        .unwrap();
    let want = prompt_logits(model, &p, 2, AttnPath::Prefill);
    assert_close(
        &f.logits.to_vec2().unwrap(),
        &want,
        "prefill 27 + decode 1 + verify 2",
    );
}

#[test]
fn a_mixed_batch_equals_its_sequences_run_alone() {
    let model = tiny(DType::F32);
    let a = prompt(20, 4);
    let b = prompt(9, 5);
    let d = prompt(17, 6);
    let mut c = cache(model);
    // d's first 16 tokens are already cached: it decodes one token in the batch.
    let (ba, bb, bd) = ([0u32, 1], [2u32], [3u32, 4]);
    model
        .forward(
            &mut c,
            &[SeqInput {
                blocks: &bd,
                computed: 0,
                tokens: &d[..16],
                logits: 0,
            }],
            AttnPath::Auto,
        )
        .unwrap();
    let f = model
        .forward(
            &mut c,
            &[
                SeqInput {
                    blocks: &ba,
                    computed: 0,
                    tokens: &a,
                    logits: 1,
                },
                SeqInput {
                    blocks: &bb,
                    computed: 0,
                    tokens: &b,
                    logits: 2,
                },
                SeqInput {
                    blocks: &bd,
                    computed: 16,
                    tokens: &d[16..],
                    logits: 1,
                },
            ],
            AttnPath::Auto,
        )
        .unwrap();
    let got = f.logits.to_vec2().unwrap();
    assert_eq!(got.len(), 4);
    assert_close(
        &got[0..1],
        &prompt_logits(model, &a, 1, AttnPath::Auto),
        "prompt a",
    );
    assert_close(
        &got[1..3],
        &prompt_logits(model, &b, 2, AttnPath::Auto),
        "prompt b",
    );
    assert_close(
        &got[3..4],
        &prompt_logits(model, &d, 1, AttnPath::Auto),
        "decode d",
    );
    // Router counts: every token of every MoE layer goes to top_k experts.
    let cfg = &model.cfg;
    assert_eq!(f.expert_counts.len(), cfg.layers - cfg.dense_layers);
    for layer in &f.expert_counts {
        assert_eq!(layer.len(), cfg.routed_experts);
        assert_eq!(layer.iter().sum::<u32>() as usize, (20 + 9 + 1) * cfg.top_k);
    }
}

#[test]
fn the_pool_has_the_documented_layout() {
    let model = tiny(DType::F32);
    let mut c = cache(model);
    let cfg = &model.cfg;
    let layer = c.layer(0).unwrap();
    assert_eq!(
        layer.dims(),
        &[NUM_BLOCKS, BLOCK_SIZE, cfg.kv_lora_rank + cfg.qk_rope_dim]
    );
    let p = prompt(3, 7);
    model
        .forward(
            &mut c,
            &[SeqInput {
                blocks: &[11],
                computed: 0,
                tokens: &p,
                logits: 1,
            }],
            AttnPath::Auto,
        )
        .unwrap();
    let l = c.layer(0).unwrap();
    let used = l
        .get(11)
        .unwrap()
        .narrow(0, 0, 3)
        .unwrap()
        .abs()
        .unwrap()
        .sum_all()
        .unwrap();
    let rest = l
        .get(11)
        .unwrap()
        .narrow(0, 3, BLOCK_SIZE - 3)
        .unwrap()
        .abs()
        .unwrap()
        .sum_all()
        .unwrap();
    let other = l.get(10).unwrap().abs().unwrap().sum_all().unwrap();
    assert!(used.to_scalar::<f32>().unwrap() > 0.0);
    assert_eq!(rest.to_scalar::<f32>().unwrap(), 0.0);
    assert_eq!(other.to_scalar::<f32>().unwrap(), 0.0);
}

#[test]
fn a_short_block_table_is_an_error() {
    let model = tiny(DType::F32);
    let mut c = cache(model);
    let p = prompt(20, 8);
    let e = model
        .forward(
            &mut c,
            &[SeqInput {
                blocks: &[0],
                computed: 0,
                tokens: &p,
                logits: 1,
            }],
            AttnPath::Auto,
        )
        .unwrap_err();
    assert!(e.to_string().contains("needs 20"), "{e}");
    let e = model
        .forward(
            &mut c,
            &[SeqInput {
                blocks: &[0, 999],
                computed: 0,
                tokens: &p,
                logits: 1,
            }],
            AttnPath::Auto,
        )
        .unwrap_err();
    assert!(e.to_string().contains("999"), "{e}");
}
