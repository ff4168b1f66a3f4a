//! The engines' memory flags: vLLM's `gpu_memory_utilization` and SGLang's
//! `mem_fraction_static` set what each die keeps back, and so its KV capacity.

use crate::default_with;

fn decode_kv(sets: &[&str]) -> f64 {
    let s = default_with(sets).unwrap();
    s.instances
        .iter()
        .find(|i| i.name == "decode")
        .unwrap()
        .memory
        .kv_cache
}

#[test]
fn memory_flags_move_the_kv_capacity() {
    let base = decode_kv(&[]);
    // vLLM's 0.9 is the shipped A3 system's reserve (6.4 of 64 GB).
    let u90 = decode_kv(&["decode.gpu_memory_utilization=0.9"]);
    assert!((u90 - base).abs() < 1e6, "{u90} vs {base}");
    let u85 = decode_kv(&["decode.gpu_memory_utilization=0.85"]);
    assert!((u90 - u85 - 0.05 * 64e9).abs() < 1e6, "{u85}");
    // SGLang's fraction holds weights and KV only: more KV than vLLM's utilization at the same
    // share, which also holds the workspace.
    let f85 = decode_kv(&["decode.mem_fraction_static=0.85"]);
    assert!(f85 > u85, "{f85} vs {u85}");
}

#[test]
fn memory_flags_are_checked() {
    let e = default_with(&["decode.gpu_memory_utilization=1.2"])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("gpu_memory_utilization") && e.contains("at most 1"),
        "{e}"
    );
    let e = default_with(&["decode.mem_fraction_static=0"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("mem_fraction_static"), "{e}");
    let both = [
        "decode.gpu_memory_utilization=0.9",
        "decode.mem_fraction_static=0.8",
    ];
    let e = default_with(&both).unwrap_err().to_string();
    assert!(e.contains("not both"), "{e}");
}

/// SGLang's `--max-total-tokens` caps each DP rank's KV pool (the smaller of the cap and what
/// memory leaves), and so its blocks; a cap above the memory's leaves it; 0 is refused.
#[test]
fn max_total_tokens_caps_the_kv_pool() {
    let decode = |sets: &[&str]| {
        let s = default_with(sets).unwrap();
        let i = s.instances.iter().find(|i| i.name == "decode").unwrap();
        (
            i.memory.kv_capacity_tokens,
            i.kv_blocks_per_rank,
            i.scheduler.block_size,
        )
    };
    let (tokens, blocks, bs) = decode(&[]);
    assert!(tokens > 70_000, "{tokens}");
    // Below the default's max_model_len (65,536): refused, naming the cap.
    let e = default_with(&["decode.max_total_tokens=20000"])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("max_model_len") && e.contains("max_total_tokens 20000"),
        "{e}"
    );
    let (capped, capped_blocks, _) = decode(&["decode.max_total_tokens=70000"]);
    assert_eq!(capped, 70_000);
    assert_eq!(capped_blocks, 70_000 / u64::from(bs));
    assert!(capped_blocks < blocks);
    let (above, ..) = decode(&[&format!("decode.max_total_tokens={}", tokens + 1)]);
    assert_eq!(above, tokens);
    let e = default_with(&["decode.max_total_tokens=0"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_total_tokens = 0"), "{e}");
}
