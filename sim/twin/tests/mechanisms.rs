//! The engine mechanisms change a step the way the engines do: graph padding makes the step a
//! step function of the batch, FLASHCOMM1 moves fewer bytes in prefill, two micro-batches are
//! never used where they lose unless forced, MLAPO and the shared-expert stream save time.

use dstwin_core::features::{CudagraphMode, Features, TwoMicrobatch};
use dstwin_core::layout::{Layout, Role};
use dstwin_core::model::{builtin, Quant};
use dstwin_hwmodels::{Catalog, DType};
use dstwin_twin::explain::{explain, BatchSpec, Explain, ExplainInput, Mtp};

fn input(layout: Layout, batch: BatchSpec, features: Features, hardware: &str) -> ExplainInput {
    let cat = Catalog::builtin();
    let sys = cat.system(hardware).unwrap();
    ExplainInput {
        model: builtin("deepseek-r1").unwrap(),
        quant: Quant::W8a8,
        kv_dtype: DType::Bf16,
        cost: cat.cost_model(sys, None).unwrap(),
        layout,
        batch,
        mtp: Mtp::off(),
        moe_imbalance: 1.0,
        expert_skew: None,
        expert_concentration: 0.0,
        max_tokens_per_step: None,
        features,
    }
}

fn decode(seqs: u32, kv: u64, features: Features) -> Explain {
    let layout = Layout::dp_ep(Role::Decode, 32);
    let batch = BatchSpec {
        decode_seqs: seqs,
        kv_len: kv,
        prefill_tokens: 0,
        prompt_len: 0,
        prompt_cached: 0,
    };
    explain(&input(layout, batch, features, "atlas-a3-superpod")).unwrap()
}

#[test]
fn graph_padding_makes_the_step_a_step_function_of_the_batch() {
    let graphs = Features {
        cudagraph_mode: CudagraphMode::FullDecodeOnly,
        cudagraph_capture_sizes: Some(vec![8, 16, 32]),
        ..Features::default()
    };
    // Short contexts: attention is negligible, so the padded GEMMs and MoE set the step.
    let padded: Vec<f64> = (5..=9)
        .map(|n| decode(n, 64, graphs.clone()).step_ms)
        .collect();
    let eager: Vec<f64> = (5..=9)
        .map(|n| decode(n, 64, Features::default()).step_ms)
        .collect();
    // 5 to 8 sequences all run the 8-token graph: the same step within 0.5%.
    for t in &padded[..4] {
        assert!((t / padded[3] - 1.0).abs() < 0.005, "{padded:?}");
    }
    // 9 runs the 16-token graph: a jump, where eager grows by one sequence's worth.
    assert!(padded[4] > padded[3] * 1.01, "{padded:?}");
    assert!(eager.windows(2).all(|w| w[1] >= w[0]), "{eager:?}");
    assert!(
        padded[0] > eager[0],
        "5 sequences pay for 8: {padded:?} vs {eager:?}"
    );
    assert_eq!(decode(6, 64, graphs).padded_tokens, Some(8));
}

#[test]
fn flashcomm1_cuts_prefill_communication() {
    let prefill = |fc1: bool| {
        let layout = Layout {
            tp: 4,
            dp: 4,
            ..Layout::dp_ep(Role::Prefill, 16)
        };
        let batch = BatchSpec {
            decode_seqs: 0,
            kv_len: 0,
            prefill_tokens: 8192,
            prompt_len: 4096,
            prompt_cached: 0,
        };
        let f = Features {
            flashcomm1: fc1,
            two_microbatch: TwoMicrobatch::Off,
            ..Features::default()
        };
        explain(&input(layout, batch, f, "atlas-a3-superpod")).unwrap()
    };
    let (off, on) = (prefill(false), prefill(true));
    let tp_comm = |e: &Explain| -> f64 {
        e.step
            .ops
            .iter()
            .filter(|o| {
                matches!(o.class, "all_reduce" | "all_gather" | "reduce_scatter")
                    && o.layer != dstwin_core::opgraph::LayerKind::LmHead
            })
            .map(|o| o.total_s)
            .sum()
    };
    assert!(
        tp_comm(&on) < tp_comm(&off) * 0.9,
        "{} vs {}",
        tp_comm(&on),
        tp_comm(&off)
    );
    assert!(
        on.step_ms < off.step_ms,
        "{} vs {}",
        on.step_ms,
        off.step_ms
    );
    assert!(on.step.ops.iter().any(|o| o.name == "attn_reduce_scatter"));
    assert!(!off.step.ops.iter().any(|o| o.name == "attn_reduce_scatter"));
}

#[test]
fn dsa_context_parallelism_splits_a_long_prompt_over_the_tp_group() {
    // DeepSeek-V3.2, one 12K prompt on a TP16 rank; then a decode-only step.
    let step = |cp: bool, prefill: bool| {
        let layout = Layout {
            tp: 16,
            dp: 1,
            ..Layout::dp_ep(Role::Mixed, 16)
        };
        let batch = BatchSpec {
            decode_seqs: if prefill { 0 } else { 2 },
            kv_len: 4096,
            prefill_tokens: if prefill { 12_000 } else { 0 },
            prompt_len: 12_000,
            prompt_cached: 0,
        };
        let f = Features {
            enable_dsa_cp: cp,
            two_microbatch: TwoMicrobatch::Off,
            ..Features::default()
        };
        let mut inp = input(layout, batch, f, "atlas-800-a3");
        inp.model = builtin("deepseek-v3.2").unwrap();
        explain(&inp).unwrap()
    };
    let total = |e: &Explain, name: &str| -> f64 {
        e.step
            .ops
            .iter()
            .filter(|o| o.name == name && o.layer == dstwin_core::opgraph::LayerKind::Attention)
            .map(|o| o.total_s)
            .sum()
    };
    let (tp, cp) = (step(false, true), step(true, true));
    // Each die scores 1/16 of the queries against the whole context, and projects 1/16 of
    // the tokens (with all heads: the same q_b_proj work, the replicated q_a_proj split).
    let ratio = total(&tp, "indexer_score") / total(&cp, "indexer_score");
    assert!(ratio > 8.0, "indexer {ratio}");
    assert!(total(&cp, "q_a_proj") < total(&tp, "q_a_proj") / 8.0);
    // The all-reduce of the attention output gives way to an all-gather of the new KV.
    assert!(total(&tp, "attn_all_reduce") > 0.0 && total(&cp, "attn_all_reduce") == 0.0);
    assert!(total(&cp, "cp_kv_all_gather") > 0.0 && total(&tp, "cp_kv_all_gather") == 0.0);
    assert!(
        cp.step_ms < tp.step_ms / 2.0,
        "{} vs {}",
        cp.step_ms,
        tp.step_ms
    );
    // Decode-only steps keep attention TP.
    assert_eq!(step(false, false).step_ms, step(true, false).step_ms);
}

#[test]
fn two_microbatches_are_never_used_where_they_lose_unless_forced() {
    let at = |seqs: u32, mode: TwoMicrobatch| {
        decode(
            seqs,
            2048,
            Features {
                two_microbatch: mode,
                ..Features::default()
            },
        )
    };
    for seqs in [1, 4, 16, 48, 96] {
        let auto = at(seqs, TwoMicrobatch::Auto);
        let off = at(seqs, TwoMicrobatch::Off);
        let forced = at(seqs, TwoMicrobatch::Force);
        // Auto is never slower than serial; off is serial; force takes the split whatever it costs.
        assert!(auto.step_ms <= off.step_ms + 1e-9, "{seqs}");
        assert_eq!(off.step_ms, off.serial_step_ms);
        assert!((forced.step_ms - forced.two_microbatch_step_ms).abs() < 1e-9);
        if auto.two_microbatch_used {
            assert!(auto.two_microbatch_step_ms < auto.serial_step_ms, "{seqs}");
        }
    }
    // Below vLLM's 32-token decode threshold the split is not even tried.
    let small = at(8, TwoMicrobatch::Auto);
    assert!(!small.two_microbatch_used);
    // One sequence per die loses by splitting: forced, it is slower than serial.
    let one = at(1, TwoMicrobatch::Force);
    assert!(
        one.step_ms > one.serial_step_ms,
        "{} vs {}",
        one.step_ms,
        one.serial_step_ms
    );
}

#[test]
fn mlapo_and_the_shared_expert_stream_save_time() {
    let base = decode(48, 4096, Features::default());
    let mlapo = decode(
        48,
        4096,
        Features {
            mlapo: true,
            ..Features::default()
        },
    );
    assert!(mlapo.step_ms < base.step_ms);
    assert!(mlapo.step.ops.iter().any(|o| o.name == "mla_prolog"));
    assert!(!mlapo.step.ops.iter().any(|o| o.name == "q_a_proj"));
    let stream = decode(
        48,
        4096,
        Features {
            shared_expert_overlap: true,
            ..Features::default()
        },
    );
    assert!(stream.shared_expert_overlap_ms > 0.0);
    assert!((base.step_ms - stream.step_ms - stream.shared_expert_overlap_ms).abs() < 1e-6);
}

#[test]
fn moe_communication_follows_the_platform_rule() {
    // A3, decode within MC2's capacity: MC2 (low-latency kernels).
    assert_eq!(decode(48, 4096, Features::default()).moe_comm.name(), "mc2");
    // A3 prefill: 8K tokens per rank exceed the capacity: the bulk all-to-all.
    let layout = Layout::dp_ep(Role::Prefill, 32);
    let batch = BatchSpec {
        decode_seqs: 0,
        kv_len: 0,
        prefill_tokens: 8192,
        prompt_len: 4096,
        prompt_cached: 0,
    };
    let e = explain(&input(
        layout,
        batch,
        Features::default(),
        "atlas-a3-superpod",
    ))
    .unwrap();
    assert_eq!(e.moe_comm.name(), "alltoall");
    // A2 (EP32, 8 experts per die): a step beyond MC2's token capacity uses the all-gather, as
    // vllm-ascend chooses on A2 (A3 would use the all-to-all).
    let layout = Layout::dp_ep(Role::Prefill, 32);
    let batch = BatchSpec {
        decode_seqs: 0,
        kv_len: 0,
        prefill_tokens: 4096,
        prompt_len: 4096,
        prompt_cached: 0,
    };
    let e = explain(&input(layout, batch, Features::default(), "atlas-800i-a2")).unwrap();
    assert_eq!(e.moe_comm.name(), "allgather");
    assert!(e.step.ops.iter().any(|o| o.name == "moe_all_gather"));
}

#[test]
fn reports_say_when_the_all_to_all_runs_on_a_fabric_it_was_not_fitted_on() {
    // Two A3 servers joined by RoCE: the 910C all-to-all was fitted on HCCS/UB only.
    let roce = explain(&input(
        Layout::dp_ep(Role::Decode, 32),
        BatchSpec {
            decode_seqs: 8,
            kv_len: 1024,
            prefill_tokens: 0,
            prompt_len: 0,
            prompt_cached: 0,
        },
        Features::default(),
        "atlas-800-a3",
    ))
    .unwrap();
    assert!(
        roce.caveats
            .iter()
            .any(|c| c.contains("RoCE") && c.contains("extrapolation")),
        "{:?}",
        roce.caveats
    );
    // The same on a SuperPoD: fitted fabric, nothing to say.
    assert!(decode(8, 1024, Features::default()).caveats.is_empty());
}

/// vLLM's speculative `enforce_eager` (`mtp_enforce_eager`): the MTP drafter's kernels run
/// behind their one-by-one launches beside the decode graph, so the step grows by what the
/// launches (2.7 ms per draft on A3) exceed the drafter's own kernels, and by nothing where its
/// kernels take longer. Without MTP it is refused.
#[test]
fn an_eager_mtp_drafter_takes_the_longer_of_its_kernels_and_its_launches() {
    use dstwin_core::opgraph::{DieSet, LayerKind};
    let at = |eager: bool, drafts: u32, seqs: u32| {
        let batch = BatchSpec {
            decode_seqs: seqs,
            kv_len: 65536 / seqs as u64,
            prefill_tokens: 0,
            prompt_len: 0,
            prompt_cached: 0,
        };
        let features = Features {
            cudagraph_mode: CudagraphMode::FullDecodeOnly,
            mtp_enforce_eager: eager,
            ..Features::default()
        };
        let mut i = input(
            Layout::dp_ep(Role::Decode, 32),
            batch,
            features,
            "atlas-800-a3",
        );
        i.mtp = Mtp {
            tokens: drafts,
            acceptance: vec![0.7],
        };
        explain(&i)
    };
    let drafter_ms = |e: &Explain| -> f64 {
        let slow = e.step.slow_set();
        e.step
            .ops
            .iter()
            .filter(|o| o.layer == LayerKind::Mtp && (o.dies == DieSet::All || o.dies == slow))
            .map(|o| o.total_s * 1e3)
            .sum()
    };
    for drafts in [1, 3] {
        let (graph, eager) = (at(false, drafts, 8).unwrap(), at(true, drafts, 8).unwrap());
        let launches_ms = 2.7 * drafts as f64;
        let gap = (launches_ms - drafter_ms(&graph)).max(0.0);
        assert!(gap > 0.0, "a small batch's drafter runs under its launches");
        assert!((eager.step_ms - graph.step_ms - gap).abs() < 1e-9);
        assert!((eager.draft_launch_gap_ms.unwrap() - gap).abs() < 1e-9);
        // The split step's drafter runs eagerly too.
        assert!((eager.two_microbatch_step_ms - graph.two_microbatch_step_ms - gap).abs() < 1e-9);
        assert!(graph.draft_launch_gap_ms.is_none());
    }
    // A batch whose drafter outlasts its launches pays nothing more.
    let (graph, eager) = (at(false, 1, 384).unwrap(), at(true, 1, 384).unwrap());
    assert!(drafter_ms(&graph) > 2.7, "{} ms", drafter_ms(&graph));
    assert_eq!(eager.step_ms, graph.step_ms);
    let e = at(true, 0, 8).unwrap_err().to_string();
    assert!(
        e.contains("mtp_enforce_eager") && e.contains("needs MTP"),
        "{e}"
    );
    // Beside no graph it means nothing: refused.
    let mut i = input(
        Layout::dp_ep(Role::Decode, 32),
        BatchSpec {
            decode_seqs: 8,
            kv_len: 4096,
            prefill_tokens: 0,
            prompt_len: 0,
            prompt_cached: 0,
        },
        Features {
            mtp_enforce_eager: true,
            ..Features::default()
        },
        "atlas-800-a3",
    );
    i.mtp = Mtp {
        tokens: 1,
        acceptance: vec![0.7],
    };
    let e = explain(&i).unwrap_err().to_string();
    assert!(
        e.contains("mtp_enforce_eager") && e.contains("FULL_DECODE_ONLY"),
        "{e}"
    );
}
