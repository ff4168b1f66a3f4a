//! The MTP module drafts the token after next from the main model's hidden state.

use crate::common::*;
use dstwin_cpu::{AttnPath, DType, SeqInput};

#[test]
fn a_draft_follows_a_prefill_and_is_reproducible() {
    let model = tiny(DType::F32);
    assert_eq!(model.mtp.len(), 1);
    let p = prompt(12, 20);
    let run = || {
        let mut c = cache(model);
        let b = blocks(0, 16);
        let f = model
            .forward(
                &mut c,
                &[SeqInput {
                    blocks: &b,
                    computed: 0,
                    tokens: &p,
                    logits: 1,
                }],
                AttnPath::Auto,
            )
            .unwrap();
        let next = dstwin_cpu::ops::argmax_rows(&f.logits).unwrap()[0];
        // Position i of the MTP pass takes token i + 1: the prompt shifted by one, then `next`.
        let mut shifted: Vec<u32> = p[1..].to_vec();
        shifted.push(next);
        let d = model
            .mtp_forward(
                0,
                &mut c,
                &[SeqInput {
                    blocks: &b,
                    computed: 0,
                    tokens: &shifted,
                    logits: 1,
                }],
                &f.hidden,
                AttnPath::Auto,
            )
            .unwrap();
        assert_eq!(d.logits.dims(), &[1, model.cfg.vocab]);
        assert_eq!(d.expert_counts.len(), 1, "the MTP layer is an MoE layer");
        let draft = model
            .draft(
                &mut c,
                &[SeqInput {
                    blocks: &b,
                    computed: 0,
                    tokens: &shifted,
                    logits: 1,
                }],
                &f.hidden,
                AttnPath::Auto,
            )
            .unwrap();
        (next, draft[0])
    };
    let (next, draft) = run();
    assert!((draft as usize) < model.cfg.vocab);
    assert_eq!(run(), (next, draft));
}

#[test]
fn mtp_writes_its_own_cache_layer() {
    let model = tiny(DType::F32);
    let mut c = cache(model);
    let p = prompt(4, 21);
    let f = model
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
        .unwrap();
    let mtp_layer = model.cfg.layers;
    let sum = |c: &dstwin_cpu::PagedKvCache, l| {
        c.layer(l)
            .unwrap()
            .abs()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    };
    assert_eq!(sum(&c, mtp_layer), 0.0);
    model
        .mtp_forward(
            0,
            &mut c,
            &[SeqInput {
                blocks: &[0],
                computed: 0,
                tokens: &p,
                logits: 1,
            }],
            &f.hidden,
            AttnPath::Auto,
        )
        .unwrap();
    assert!(sum(&c, mtp_layer) > 0.0);
}
