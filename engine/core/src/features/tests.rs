//! The mechanisms' rules: capture sizes and padding, context parallelism, MoE communication,
//! the two-micro-batch thresholds.

use super::*;

#[test]
fn default_capture_sizes_follow_vllm() {
    assert_eq!(default_capture_sizes(4), vec![1, 2, 4]);
    assert_eq!(default_capture_sizes(20), vec![1, 2, 4, 8, 16, 20]);
    let v = default_capture_sizes(512);
    assert_eq!(&v[..5], &[1, 2, 4, 8, 16]);
    assert!(v.contains(&256) && v.contains(&272) && v.contains(&512));
    assert!(v.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn padding_rounds_up_to_the_next_capture_size() {
    let f = Features {
        cudagraph_mode: CudagraphMode::FullDecodeOnly,
        cudagraph_capture_sizes: Some(vec![16, 4, 8]),
        ..Features::default()
    };
    let r = f.resolve("ascend-910c", 8, 1, 1).unwrap();
    assert_eq!(r.capture_sizes, vec![4, 8, 16]);
    assert_eq!(r.padded_tokens(1), Some(4));
    assert_eq!(r.padded_tokens(5), Some(8));
    assert_eq!(r.padded_tokens(16), Some(16));
    assert_eq!(r.padded_tokens(17), None);
    let eager = Features::default().resolve("ascend-910c", 8, 1, 1).unwrap();
    assert_eq!(eager.padded_tokens(5), None);
}

/// Decode context parallelism as vLLM and vllm-ascend accept it: a divisor of the TP size,
/// MLA only, the whole TP group (and no MLAPO) for sparse attention on Ascend, not beside
/// DSA-CP; each refusal names the field and the value.
#[test]
fn decode_context_parallelism_is_checked_against_the_tp_group_and_model() {
    let model = |name: &str| crate::model::builtin(name).unwrap();
    let dcp = |n: u32| Features {
        decode_context_parallel_size: Some(n),
        ..Features::default()
    };
    let check = |f: &Features, m: &str, chip: &str, tp| {
        f.check_instance(&model(m), chip, tp, 1).map_err(|e| {
            assert_eq!(e.field, "decode_context_parallel_size");
            e.reason
        })
    };
    assert!(check(&dcp(0), "r1", "ascend-910c", 8)
        .unwrap_err()
        .contains("at least 1"));
    assert!(check(&dcp(3), "r1", "ascend-910c", 8)
        .unwrap_err()
        .contains("divide"));
    assert!(check(&dcp(4), "r1", "ascend-910c", 8).is_ok());
    assert!(check(&dcp(1), "deepseek-v4-flash", "ascend-910c", 1).is_ok());
    assert!(check(&dcp(4), "deepseek-v4-flash", "ascend-910c", 4)
        .unwrap_err()
        .contains("V4"));
    assert!(check(&dcp(4), "deepseek-v3.2", "ascend-910c", 8)
        .unwrap_err()
        .contains("give 8"));
    assert!(check(&dcp(4), "deepseek-v3.2", "nvidia-h200", 8).is_ok());
    let mlapo = Features {
        mlapo: true,
        ..dcp(8)
    };
    assert!(check(&mlapo, "deepseek-v3.2", "ascend-910c", 8)
        .unwrap_err()
        .contains("MLAPO"));
    assert!(check(&mlapo, "r1", "ascend-910c", 8).is_ok());
    let cp = Features {
        enable_dsa_cp: true,
        ..dcp(8)
    };
    assert!(check(&cp, "deepseek-v3.2", "ascend-910c", 8)
        .unwrap_err()
        .contains("enable_dsa_cp"));
    assert_eq!(dcp(4).resolve("ascend-910c", 8, 0, 8).unwrap().dcp, 4);
    assert_eq!(
        Features::default()
            .resolve("ascend-910c", 8, 0, 8)
            .unwrap()
            .dcp,
        1
    );
}

#[test]
fn context_parallelism_needs_a_tp_group() {
    let f = Features {
        enable_dsa_cp: true,
        ..Features::default()
    };
    let e = f.resolve("ascend-910c", 1, 0, 1).unwrap_err();
    assert_eq!(e.field, "enable_dsa_cp");
    assert!(e.reason.contains("tp 1"), "{}", e.reason);
    assert!(f.resolve("ascend-910c", 1, 0, 16).unwrap().dsa_cp);
}

#[test]
fn mtp_rounds_capture_sizes_as_vllm_does() {
    let f = |sizes: Vec<u32>| Features {
        cudagraph_mode: CudagraphMode::FullDecodeOnly,
        cudagraph_capture_sizes: Some(sizes),
        ..Features::default()
    };
    // 3 drafts: 4 tokens per sequence; 1, 2 become 4, 24 stays, 48 is the largest.
    let r = f(vec![1, 2, 4, 8, 16, 24, 32, 40, 48]).resolve("ascend-910c", 12, 3, 1);
    assert_eq!(r.unwrap().capture_sizes, vec![4, 8, 16, 24, 32, 40, 48]);
    // Rounded past the largest size: dropped (9 > 8), the largest is now 6.
    let r = f(vec![2, 4, 6, 8]).resolve("ascend-910c", 2, 2, 1).unwrap();
    assert_eq!(r.capture_sizes, vec![3, 6]);
    assert_eq!(
        r.padded_tokens(7),
        None,
        "7 tokens exceed every graph: eager"
    );
    // Every size rounds past the largest, which is still a query length or more: that.
    let r = f(vec![5]).resolve("ascend-910c", 1, 3, 1).unwrap();
    assert_eq!(r.capture_sizes, vec![4]);
    // Nothing left: refused, naming the field.
    let e = f(vec![1, 2]).resolve("ascend-910c", 1, 3, 1).unwrap_err();
    assert_eq!(e.field, "cudagraph_capture_sizes");
    // Without drafts nothing moves.
    let r = f(vec![1, 2, 5]).resolve("ascend-910c", 5, 0, 1).unwrap();
    assert_eq!(r.capture_sizes, vec![1, 2, 5]);
}

#[test]
fn sizes_without_graphs_are_refused() {
    let f = Features {
        cudagraph_capture_sizes: Some(vec![8]),
        ..Features::default()
    };
    let e = f.resolve("ascend-910c", 8, 0, 1).unwrap_err();
    assert_eq!(e.field, "cudagraph_capture_sizes");
    let f = Features {
        cudagraph_mode: CudagraphMode::FullDecodeOnly,
        cudagraph_capture_sizes: Some(vec![0, 8]),
        ..Features::default()
    };
    assert!(f.resolve("ascend-910c", 8, 0, 1).is_err());
}

#[test]
fn moe_comm_follows_vllm_ascend() {
    let f = Features::default();
    // A3: MC2 up to the capacity (max_num_seqs x query length, capped at 512 per rank).
    let a3 = f.resolve("ascend-910c", 48, 1, 1).unwrap();
    assert_eq!(a3.mc2_capacity, 96);
    assert_eq!(a3.moe_comm(96, false, 2, 128), MoeCommUsed::Mc2);
    assert_eq!(a3.moe_comm(97, true, 2, 128), MoeCommUsed::AllToAll);
    // A2: MC2 only with EP >= 16 and at most 24 experts per die.
    let a2 = f.resolve("ascend-910b3", 48, 1, 1).unwrap();
    assert_eq!(a2.moe_comm(64, false, 8, 32), MoeCommUsed::Mc2);
    assert_eq!(a2.moe_comm(64, false, 32, 8), MoeCommUsed::AllGather);
    assert_eq!(a2.moe_comm(64, false, 8, 8), MoeCommUsed::AllGather);
    // Elsewhere: DeepEP auto.
    let gpu = f.resolve("nvidia-h800", 48, 1, 1).unwrap();
    assert_eq!(gpu.moe_comm(64, false, 2, 128), MoeCommUsed::Mc2);
    assert_eq!(gpu.moe_comm(64, true, 2, 128), MoeCommUsed::AllToAll);
    // Capacity with TP: per-rank tokens rounded up to TP.
    let tp4 = f.resolve("ascend-910c", 36, 3, 4).unwrap();
    assert_eq!(tp4.mc2_capacity, 144);
}

#[test]
fn two_microbatch_thresholds() {
    let mut f = Features {
        two_microbatch: TwoMicrobatch::Auto,
        ..Features::default()
    };
    let r = f.resolve("ascend-910c", 8, 0, 1).unwrap();
    assert!(!r.two_microbatch_allowed(31, false));
    assert!(r.two_microbatch_allowed(32, false));
    assert!(!r.two_microbatch_allowed(511, true));
    assert!(r.two_microbatch_allowed(512, true));
    f.two_microbatch = TwoMicrobatch::Force;
    assert!(f
        .resolve("ascend-910c", 8, 0, 1)
        .unwrap()
        .two_microbatch_allowed(1, false));
    f.two_microbatch = TwoMicrobatch::Off;
    assert!(!f
        .resolve("ascend-910c", 8, 0, 1)
        .unwrap()
        .two_microbatch_allowed(10_000, true));
}
