//! A small byte-level BPE `tokenizer.json` (HF `tokenizers` format), built by code: the two
//! DeepSeek special tokens at ids 0 (BOS) and 1 (EOS), then the 256 bytes in GPT-2's
//! byte-to-unicode spelling, then merges of frequent pairs of a fixed English sample, so text
//! takes fewer tokens than bytes. Deterministic: no randomness, ordered maps only.

use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

pub const BOS: &str = "<｜begin▁of▁sentence｜>";
pub const EOS: &str = "<｜end▁of▁sentence｜>";
pub const BOS_ID: u32 = 0;
pub const EOS_ID: u32 = 1;

/// The text the merges are learned from (the pre-tokenizer's words of it).
const SAMPLE: &str = "the quick brown fox jumps over the lazy dog. a model serves tokens to \
    the users who send requests; the scheduler batches the requests and the engine computes \
    the next token of each one. experts are routed by the gate and the cache keeps the keys \
    and values of the tokens that were computed. in the beginning there was the word, and \
    the word was with the model, and the model was the word of the server.";

/// GPT-2's printable spelling of each byte.
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    let mut out = vec![' '; 256];
    for (b, c) in printable.iter().zip(chars) {
        out[*b as usize] = char::from_u32(c).expect("valid code point");
    }
    out
}

/// Merges learned from [`SAMPLE`]: repeatedly the most frequent adjacent pair (ties: the
/// smaller pair), `merges` times.
fn learn_merges(merges: usize) -> Vec<(String, String)> {
    let bc = byte_chars();
    // Words as the ByteLevel pre-tokenizer splits them: a leading space joins the word.
    let mut words: BTreeMap<Vec<String>, usize> = BTreeMap::new();
    for (i, w) in SAMPLE.split(' ').filter(|w| !w.is_empty()).enumerate() {
        let text = if i == 0 {
            w.to_string()
        } else {
            format!(" {w}")
        };
        let syms = text.bytes().map(|b| bc[b as usize].to_string()).collect();
        *words.entry(syms).or_default() += 1;
    }
    let mut out = Vec::new();
    for _ in 0..merges {
        let mut pairs: BTreeMap<(String, String), usize> = BTreeMap::new();
        for (w, n) in &words {
            for p in w.windows(2) {
                *pairs.entry((p[0].clone(), p[1].clone())).or_default() += n;
            }
        }
        let Some((best, _)) = pairs.iter().fold(
            None,
            |best: Option<(&(String, String), usize)>, (p, &n)| match best {
                Some((_, m)) if m >= n => best,
                _ => Some((p, n)),
            },
        ) else {
            break;
        };
        let best = best.clone();
        let merged = format!("{}{}", best.0, best.1);
        words = words
            .into_iter()
            .map(|(w, n)| {
                let mut v: Vec<String> = Vec::with_capacity(w.len());
                let mut i = 0;
                while i < w.len() {
                    if i + 1 < w.len() && w[i] == best.0 && w[i + 1] == best.1 {
                        v.push(merged.clone());
                        i += 2;
                    } else {
                        v.push(w[i].clone());
                        i += 1;
                    }
                }
                (v, n)
            })
            .fold(BTreeMap::new(), |mut m, (w, n)| {
                *m.entry(w).or_default() += n;
                m
            });
        out.push(best);
    }
    out
}

/// The tokenizer's JSON and its vocabulary size (2 specials + 256 bytes + `merges`).
pub fn tokenizer_json(merges: usize) -> (String, usize) {
    let bc = byte_chars();
    let merges = learn_merges(merges);
    let mut vocab = Map::new();
    vocab.insert(BOS.into(), json!(BOS_ID));
    vocab.insert(EOS.into(), json!(EOS_ID));
    let mut next = 2u32;
    for c in &bc {
        vocab.insert(c.to_string(), json!(next));
        next += 1;
    }
    for (a, b) in &merges {
        vocab.insert(format!("{a}{b}"), json!(next));
        next += 1;
    }
    let special = |id: u32, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    };
    let t = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(BOS_ID, BOS), special(EOS_ID, EOS)],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {BOS: {"id": BOS, "ids": [BOS_ID], "tokens": [BOS]}}
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": Value::Object(vocab),
            "merges": merges.iter().map(|(a, b)| json!([a, b])).collect::<Vec<_>>()
        }
    });
    (
        serde_json::to_string_pretty(&t).expect("JSON of strings"),
        next as usize,
    )
}
