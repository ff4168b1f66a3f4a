//! init-weights: deterministic files, a usable tokenizer, non-degenerate greedy output.

use crate::common::*;
use dstwin_cpu::{AttnPath, DType, SeqInput};

fn write(seed: u64, tag: &str) -> std::path::PathBuf {
    let d = temp_dir(tag);
    dstwin_cpu::init_weights(&dstwin_cpu::init::preset_config("tiny").unwrap(), seed, &d).unwrap();
    d
}

#[test]
fn the_same_seed_writes_byte_identical_files() {
    let a = write(SEED, "det-a");
    let b = tiny_dir();
    let c = write(SEED + 1, "det-c");
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        let x = std::fs::read(a.join(f)).unwrap();
        assert_eq!(
            x,
            std::fs::read(b.join(f)).unwrap(),
            "{f} differs for the same seed"
        );
        if f == "model.safetensors" {
            assert_ne!(
                x,
                std::fs::read(c.join(f)).unwrap(),
                "seeds 1 and 2 wrote the same weights"
            );
        }
    }
    let size = std::fs::metadata(a.join("model.safetensors"))
        .unwrap()
        .len();
    assert!(size < 12 << 20, "tiny checkpoint is {size} bytes");
    for d in [a, c] {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[test]
fn the_tokenizer_loads_and_its_specials_match_the_config() {
    let model = tiny(DType::F32);
    let t = tokenizers::Tokenizer::from_file(tiny_dir().join("tokenizer.json")).unwrap();
    assert_eq!(t.get_vocab_size(true), model.cfg.vocab);
    assert_eq!(
        t.token_to_id(dstwin_cpu::tokenizer::BOS),
        model.cfg.bos_token_id
    );
    assert_eq!(
        t.token_to_id(dstwin_cpu::tokenizer::EOS),
        model.cfg.eos_token_ids.first().copied()
    );
    let text = "the model serves the tokens of the users.";
    let enc = t.encode(text, true).unwrap();
    assert_eq!(enc.get_ids()[0], 0, "BOS first");
    assert!(enc.get_ids().len() - 1 < text.len(), "merges shorten text");
    let back = t.decode(enc.get_ids(), true).unwrap();
    assert_eq!(back, text);
}

#[test]
fn greedy_output_is_not_one_token_forever() {
    let model = tiny(DType::F32);
    let t = tokenizers::Tokenizer::from_file(tiny_dir().join("tokenizer.json")).unwrap();
    let p: Vec<u32> = t
        .encode("in the beginning", true)
        .unwrap()
        .get_ids()
        .to_vec();
    let mut c = cache(model);
    let b = blocks(0, p.len() + 32);
    let mut out = Vec::new();
    let mut tokens = p.clone();
    let mut computed = 0;
    for _ in 0..32 {
        let f = model
            .forward(
                &mut c,
                &[SeqInput {
                    blocks: &b,
                    computed,
                    tokens: &tokens,
                    logits: 1,
                }],
                AttnPath::Auto,
            )
            .unwrap();
        computed += tokens.len();
        let next = dstwin_cpu::ops::argmax_rows(&f.logits).unwrap()[0];
        out.push(next);
        tokens = vec![next];
    }
    let distinct: std::collections::BTreeSet<_> = out.iter().collect();
    assert!(distinct.len() >= 8, "greedy output {out:?}");
}
