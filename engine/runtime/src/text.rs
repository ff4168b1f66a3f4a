//! Deterministic placeholder text for emulated devices, and the prompt-length estimate used
//! when a prompt arrives as text (the emulated deployment has no tokenizer).

/// Words the placeholder text is made of.
const WORDS: &[&str] = &[
    "the",
    "twin",
    "predicts",
    "each",
    "step",
    "of",
    "a",
    "deployment",
    "on",
    "ascend",
    "dies",
    "while",
    "experts",
    "route",
    "tokens",
    "across",
    "the",
    "fabric",
    "and",
    "decode",
    "streams",
    "answers",
    "to",
    "clients",
    "in",
    "time",
    "with",
    "prefill",
    "caches",
    "blocks",
    "for",
    "reuse",
];

/// The text of output token `index` of a request with seed `seed`: the same seed gives the
/// same text.
pub fn token(seed: u64, index: u32) -> &'static str {
    let mut z = seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    WORDS[(z % WORDS.len() as u64) as usize]
}

/// Appends tokens `from..from + n` (a leading space before every token but the first).
pub fn push_tokens(out: &mut String, seed: u64, from: u32, n: u32) {
    for i in from..from + n {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(token(seed, i));
    }
}

/// Estimated tokens of a text prompt: about four characters per token, as BPE vocabularies
/// average on English text, and at least one.
pub fn estimate_tokens(text: &str) -> u32 {
    (text.chars().count().div_ceil(4)).max(1) as u32
}

/// Ids below this are left to template markers in estimated prompts.
const MARKER_IDS: u32 = 1024;
/// Estimated ids stay inside a DeepSeek-sized vocabulary.
const ESTIMATE_VOCAB: u32 = 128_000;

/// Token ids for `text` without a tokenizer: one per [`estimate_tokens`] token, each a hash of
/// its four characters, so equal text gives equal ids (prefix caching sees shared prefixes).
pub fn estimate_ids(text: &str) -> Vec<u32> {
    let chars: Vec<char> = text.chars().collect();
    let n = estimate_tokens(text) as usize;
    (0..n)
        .map(|k| {
            let piece = chars
                .get(k * 4..(k * 4 + 4).min(chars.len()))
                .unwrap_or(&[]);
            let h = piece.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &c| {
                (h ^ c as u64).wrapping_mul(0x100_0000_01b3)
            });
            MARKER_IDS + (h % (ESTIMATE_VOCAB - MARKER_IDS) as u64) as u32
        })
        .collect()
}

/// The id an estimated prompt gives a template marker.
pub fn marker_id(marker: &str) -> u32 {
    let h = marker.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    (h % MARKER_IDS as u64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimated_ids_follow_the_text() {
        let a = estimate_ids("the same long prefix, then one ending");
        let b = estimate_ids("the same long prefix, then another ending");
        assert_eq!(
            a.len(),
            estimate_tokens("the same long prefix, then one ending") as usize
        );
        // Equal four-character pieces give equal ids: the shared prefix is shared.
        assert_eq!(a[..6], b[..6]);
        assert_ne!(a, b);
        assert!(a.iter().all(|&t| (MARKER_IDS..ESTIMATE_VOCAB).contains(&t)));
        assert!(marker_id("<｜User｜>") < MARKER_IDS);
    }

    #[test]
    fn text_is_deterministic_per_seed() {
        let mut a = String::new();
        let mut b = String::new();
        push_tokens(&mut a, 7, 0, 5);
        push_tokens(&mut b, 7, 0, 2);
        push_tokens(&mut b, 7, 2, 3);
        assert_eq!(a, b);
        assert_eq!(a.split(' ').count(), 5);
        let mut c = String::new();
        push_tokens(&mut c, 8, 0, 5);
        assert_ne!(a, c);
    }

    #[test]
    fn prompt_estimate() {
        assert_eq!(estimate_tokens(""), 1);
        assert_eq!(estimate_tokens("abcd"), 1);
        assert_eq!(estimate_tokens("abcde"), 2);
    }
}
