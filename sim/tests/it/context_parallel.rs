//! DSA context parallelism (`enable_dsa_cp`): a prefill instance of a sparse-attention model
//! splits each prompt over its attention TP group, and the scenario refuses it where it cannot
//! apply.

use crate::{default_with, scenarios};
use dstwin_sim::run::{run, RunOptions};
use dstwin_sim::scenario::load_str;

fn e2e(name: &str, sets: &[&str]) -> Result<dstwin_sim::scenario::Scenario, String> {
    let dir = scenarios().join("e2e");
    let file = format!("{name}.toml");
    let text = std::fs::read_to_string(dir.join(&file)).unwrap();
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    load_str(&file, &text, &dir, &sets).map_err(|e| e.to_string())
}

#[test]
fn context_parallel_prefill_shortens_long_prompts_time_to_first_token() {
    // SGLang's V3.2 64K PD run (one TP32 prefill instance), first 8 requests; without context
    // parallelism its dense layers must be split too for a 64K step's workspace to fit.
    let name = "sglang-a3-v32-w8a8-32c-pd-64k-3k";
    let ttft = |cp: bool| {
        let sets = [
            "workload.num_requests=8".to_string(),
            format!("prefill.enable_dsa_cp={cp}"),
            format!("prefill.dense_tp={}", if cp { 1 } else { 32 }),
        ];
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        let s = e2e(name, &sets).unwrap();
        run(&s, RunOptions::default())
            .unwrap()
            .report
            .latency
            .ttft_ms
            .mean
    };
    let (with, without) = (ttft(true), ttft(false));
    assert!(with < without / 2.0, "{with} ms vs {without} ms");
}

#[test]
fn context_parallelism_is_refused_where_it_cannot_apply() {
    // DeepSeek-V3.1 (the default scenario) has dense attention.
    let e = default_with(&["prefill.enable_dsa_cp=true"])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("enable_dsa_cp") && e.contains("dense attention"),
        "{e}"
    );
    // A decode instance of attention TP 1 has no group to split over.
    let name = "vaa-tut-v4flash-a3-1p1d-3k5-1k5-bs100-ci";
    let e = e2e(name, &["decode.enable_dsa_cp=true"]).unwrap_err();
    assert!(e.contains("enable_dsa_cp") && e.contains("tp 1"), "{e}");
}

/// Decode context parallelism (`decode_context_parallel_size`) on the V3.1 two-node run's
/// DP4 x TP8 instance: each DP rank holds eight times the tokens in blocks of eight times the
/// block size (vLLM's scheduler multiplies the block size by the DCP size), and a size that
/// does not divide TP is refused with the field and value named.
#[test]
fn decode_context_parallelism_holds_more_tokens_per_rank() {
    let name = "vaa-nightly-v31-bf16-a3-dp4tp8-2node";
    let setup = |dcp: u32| {
        let set = format!("mixed.decode_context_parallel_size={dcp}");
        let s = e2e(name, &[set.as_str()]).unwrap();
        let i = &s.instances[0];
        (i.scheduler.block_size, i.kv_blocks_per_rank)
    };
    let ((bs1, blocks1), (bs8, blocks8)) = (setup(1), setup(8));
    assert_eq!(bs8, 8 * bs1);
    let (t1, t8) = (bs1 as u64 * blocks1, bs8 as u64 * blocks8);
    assert!(t8.abs_diff(8 * t1) <= 8 * bs8 as u64, "{t8} vs 8 x {t1}");
    let e = e2e(name, &["mixed.decode_context_parallel_size=3"]).unwrap_err();
    assert!(
        e.contains("instance.mixed.decode_context_parallel_size = 3") && e.contains("divide"),
        "{e}"
    );
}
