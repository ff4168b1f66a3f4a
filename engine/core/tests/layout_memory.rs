//! Layout validation and the memory map: impossible layouts are errors that name the numbers.

use dstwin_core::layout::{Layout, LayoutError, Role};
use dstwin_core::memory::{memory_map, MemoryBudget, MemoryError, MemoryInputs};
use dstwin_core::model::{builtin, Quant};
use dstwin_hwmodels::{Catalog, DType};

fn cm384() -> &'static dstwin_hwmodels::System {
    Catalog::builtin().system("cloudmatrix384").unwrap()
}

fn cm384_decode() -> Layout {
    Layout {
        redundant_experts: 32,
        shared_expert_dies: 32,
        ..Layout::dp_ep(Role::Decode, 320)
    }
}

#[test]
fn ep320_reproduces_cloudmatrix_slot_arithmetic() {
    let m = builtin("r1").unwrap();
    let plan = cm384_decode().validate(&m, cm384()).unwrap();
    // 256 routed + 32 redundant on 288 dies, one per die; 32 shared-expert dies.
    assert_eq!(plan.routed_dies, 288);
    assert_eq!(plan.slots_per_die, 1);
}

#[test]
fn dp_times_tp_must_equal_dies() {
    let m = builtin("r1").unwrap();
    let l = Layout {
        dp: 100,
        ..cm384_decode()
    };
    let err = l.validate(&m, cm384()).unwrap_err();
    assert_eq!(
        err,
        LayoutError::DpTp {
            dp: 100,
            tp: 1,
            product: 100,
            dies: 320
        }
    );
    assert!(err
        .to_string()
        .contains("dp (100) x tp (1) = 100, but dies = 320"));
}

#[test]
fn experts_that_do_not_divide_over_dies_are_refused_with_the_numbers() {
    let m = builtin("r1").unwrap();
    let l = Layout {
        redundant_experts: 0,
        shared_expert_dies: 0,
        ..cm384_decode()
    };
    let err = l.validate(&m, cm384()).unwrap_err().to_string();
    assert!(
        err.contains("256 routed-expert slots") && err.contains("320 expert dies"),
        "{err}"
    );
}

#[test]
fn layouts_larger_than_the_system_are_refused() {
    let m = builtin("r1").unwrap();
    let a2 = Catalog::builtin().system("atlas-800i-a2").unwrap();
    let err = Layout::dp_ep(Role::Decode, 1024)
        .validate(&m, a2)
        .unwrap_err()
        .to_string();
    assert!(err.contains("1024 dies exceed the 512 dies"), "{err}");
}

#[test]
fn tp_must_divide_heads() {
    let m = builtin("r1").unwrap();
    let l = Layout {
        dp: 32,
        tp: 10,
        ..cm384_decode()
    };
    let err = l.validate(&m, cm384()).unwrap_err().to_string();
    assert!(err.contains("layout.tp = 10"), "{err}");
}

fn inputs(quant: Quant) -> MemoryInputs {
    MemoryInputs {
        quant,
        kv_dtype: DType::Bf16,
        mtp_tokens: 1,
        max_tokens_per_step: 2048,
        dispatch_tokens_per_step: 2048,
        budget: MemoryBudget::SystemReserve,
        shared_expert_dp: false,
        dcp: 1,
    }
}

#[test]
fn the_engines_memory_flags_set_what_is_kept_back() {
    let m = builtin("r1").unwrap();
    let plan = Layout::dp_ep(Role::Decode, 256)
        .validate(&m, cm384())
        .unwrap();
    let at = |budget| {
        memory_map(
            &m,
            &plan,
            cm384(),
            &MemoryInputs {
                budget,
                ..inputs(Quant::W8a8)
            },
        )
        .unwrap()
    };
    let base = at(MemoryBudget::SystemReserve);
    let hbm = base.hbm;
    // vLLM's 0.9 is the shipped systems' reserve (10% of HBM); 0.85 keeps 5% more back.
    let u90 = at(MemoryBudget::GpuMemoryUtilization(0.9));
    assert!((u90.kv_cache - base.kv_cache).abs() < 1e-3 * hbm);
    let u85 = at(MemoryBudget::GpuMemoryUtilization(0.85));
    assert!((u90.kv_cache - u85.kv_cache - 0.05 * hbm).abs() < 1.0);
    // SGLang's fraction covers weights and KV only: the workspace comes out of the rest.
    let f = at(MemoryBudget::MemFractionStatic(0.8));
    assert!((f.weights + f.kv_cache - 0.8 * hbm).abs() < 1.0);
    assert!((f.reserved + f.workspace - 0.2 * hbm).abs() < 1.0);
}

#[test]
fn r1_w8a8_fits_on_ep320_with_tens_of_gigabytes_of_kv() {
    let m = builtin("r1").unwrap();
    let plan = cm384_decode().validate(&m, cm384()).unwrap();
    let mm = memory_map(&m, &plan, cm384(), &inputs(Quant::W8a8)).unwrap();
    // One INT8 expert per die over 59 MoE layers (58 + MTP): 3 x 7168 x 2048 x 59 bytes.
    assert!((mm.routed_expert_weights - 3.0 * 7168.0 * 2048.0 * 59.0).abs() < 1.0);
    assert!(mm.kv_cache > 30e9, "{}", mm.kv_cache);
    let parts = mm.reserved + mm.weights + mm.workspace + mm.kv_cache;
    assert!(
        (parts - mm.hbm).abs() < 1.0,
        "memory map must add up to HBM"
    );
    assert_eq!(
        mm.kv_capacity_tokens,
        (mm.kv_cache / mm.kv_bytes_per_token) as u64
    );
}

#[test]
fn bf16_r1_on_one_a2_node_does_not_fit_and_says_by_how_much() {
    let m = builtin("r1").unwrap();
    let a2 = Catalog::builtin().system("atlas-800i-a2").unwrap();
    let plan = Layout::dp_ep(Role::Decode, 8).validate(&m, a2).unwrap();
    let err = memory_map(&m, &plan, a2, &inputs(Quant::Bf16)).unwrap_err();
    let MemoryError::DoesNotFit {
        need_gb, hbm_gb, ..
    } = err.clone();
    assert!(need_gb > 150.0 && hbm_gb == 64.0, "{err}");
    assert!(err.to_string().contains("does not fit in HBM"));
}

#[test]
fn redundant_experts_cost_memory() {
    let m = builtin("r1").unwrap();
    let s = cm384();
    let base = Layout::dp_ep(Role::Prefill, 32).validate(&m, s).unwrap();
    let red = Layout {
        redundant_experts: 32,
        ..Layout::dp_ep(Role::Prefill, 32)
    }
    .validate(&m, s)
    .unwrap();
    let a = memory_map(&m, &base, s, &inputs(Quant::W8a8)).unwrap();
    let b = memory_map(&m, &red, s, &inputs(Quant::W8a8)).unwrap();
    assert_eq!(base.slots_per_die, 8);
    assert_eq!(red.slots_per_die, 9);
    assert!(b.routed_expert_weights > a.routed_expert_weights);
    assert!(b.kv_capacity_tokens < a.kv_capacity_tokens);
}

fn moe_tp(dies: u32) -> Layout {
    Layout {
        role: Role::Mixed,
        dies,
        dp: 1,
        tp: dies,
        ep: 1,
        dense_tp: None,
        lmhead_tp: None,
        redundant_experts: 0,
        shared_expert_dies: 0,
    }
}

#[test]
fn ep_1_is_moe_tensor_parallelism_over_the_instance() {
    let m = builtin("r1").unwrap();
    let h200 = Catalog::builtin().system("nvidia-h200-8").unwrap();
    let plan = moe_tp(8).validate(&m, h200).unwrap();
    assert_eq!((plan.ep, plan.moe_tp, plan.routed_dies), (1, 8, 1));
    assert_eq!(plan.slots_per_die, 256, "every die holds every expert");
    // A single die is plain EP 1: nothing to split.
    assert_eq!(moe_tp(1).validate(&m, h200).unwrap().moe_tp, 1);
    // Expert parallelism keeps moe_tp 1.
    let ep = Layout::dp_ep(Role::Mixed, 8).validate(&m, h200).unwrap();
    assert_eq!((ep.ep, ep.moe_tp), (8, 1));
}

#[test]
fn moe_tensor_parallelism_refuses_what_needs_expert_parallelism() {
    let m = builtin("r1").unwrap();
    let h200 = Catalog::builtin().system("nvidia-h200-8").unwrap();
    let err = |l: Layout| l.validate(&m, h200).unwrap_err().to_string();
    let e = err(Layout { ep: 4, ..moe_tp(8) });
    assert!(e.contains("layout.ep = 4") && e.contains("or be 1"), "{e}");
    let e = err(Layout {
        dp: 2,
        tp: 4,
        ..moe_tp(8)
    });
    assert!(
        e.contains("layout.ep = 1") && e.contains("2 attention DP ranks"),
        "{e}"
    );
    let e = err(Layout {
        redundant_experts: 8,
        ..moe_tp(8)
    });
    assert!(
        e.contains("layout.redundant_experts = 8") && e.contains("ep = dies"),
        "{e}"
    );
    let e = err(Layout {
        shared_expert_dies: 1,
        ..moe_tp(8)
    });
    assert!(e.contains("layout.shared_expert_dies = 1"), "{e}");
}

#[test]
fn moe_tensor_parallelism_holds_a_slice_of_every_expert() {
    let m = builtin("r1").unwrap();
    let h200 = Catalog::builtin().system("nvidia-h200-8").unwrap();
    let inp = inputs(Quant::Fp8);
    let tp = memory_map(&m, &moe_tp(8).validate(&m, h200).unwrap(), h200, &inp).unwrap();
    let ep = memory_map(
        &m,
        &Layout::dp_ep(Role::Mixed, 8).validate(&m, h200).unwrap(),
        h200,
        &inp,
    )
    .unwrap();
    // 256 experts split 8 ways weigh what 32 whole experts per die weigh.
    let rel = (tp.routed_expert_weights / ep.routed_expert_weights - 1.0).abs();
    assert!(rel < 1e-12, "{rel}");
}

/// vllm-ascend's LM-head TP: the group is consecutive DP ranks, so it must divide dp; each die
/// then holds 1/n of the LM head (the embedding stays as dense_tp splits it).
#[test]
fn lmhead_tp_splits_the_lm_head_over_dp_ranks() {
    let m = builtin("r1").unwrap();
    let s = Catalog::builtin().system("atlas-800-a3").unwrap();
    let layout = |lmhead_tp| Layout {
        lmhead_tp,
        ..Layout::dp_ep(Role::Decode, 32)
    };
    for bad in [1, 5, 64] {
        let err = layout(Some(bad)).validate(&m, s).unwrap_err().to_string();
        assert!(err.contains(&format!("layout.lmhead_tp = {bad}")), "{err}");
        assert!(err.contains("divide dp (32)"), "{err}");
    }
    let map = |l: Layout| {
        let plan = l.validate(&m, s).unwrap();
        memory_map(&m, &plan, s, &inputs(Quant::W8a8)).unwrap()
    };
    let (full, split) = (map(layout(None)), map(layout(Some(16))));
    let lm_head = (m.vocab * m.hidden) as f64 * 2.0;
    let saved = full.embedding_weights - split.embedding_weights;
    assert!(
        (saved / (lm_head * 15.0 / 16.0) - 1.0).abs() < 1e-12,
        "{saved}"
    );
    assert!(split.kv_cache > full.kv_cache);
}

/// Shared-expert DP holds the whole shared expert on every die of an attention TP group;
/// dispatch buffers are sized for the die's 1/TP share of the tokens under expert parallelism,
/// for all of them under MoE tensor parallelism.
#[test]
fn shared_expert_dp_holds_it_whole_and_dispatch_buffers_hold_the_dies_share() {
    use dstwin_core::memory::dispatch_tokens_per_die;
    let m = builtin("r1").unwrap();
    let s = Catalog::builtin().system("atlas-800-a3").unwrap();
    let tp8 = Layout {
        dp: 2,
        tp: 8,
        ..Layout::dp_ep(Role::Prefill, 16)
    }
    .validate(&m, s)
    .unwrap();
    assert_eq!(dispatch_tokens_per_die(16384, &tp8), 2048);
    let h200 = Catalog::builtin().system("nvidia-h200-8").unwrap();
    let moe_tp = moe_tp(8).validate(&m, h200).unwrap();
    assert_eq!(dispatch_tokens_per_die(8192, &moe_tp), 8192);
    let map = |dp: bool, dispatch: u64| {
        memory_map(
            &m,
            &tp8,
            s,
            &MemoryInputs {
                shared_expert_dp: dp,
                dcp: 1,
                dispatch_tokens_per_step: dispatch,
                ..inputs(Quant::W8a8)
            },
        )
        .unwrap()
    };
    let (split, whole) = (map(false, 2048), map(true, 2048));
    assert!((whole.shared_expert_weights / split.shared_expert_weights - 8.0).abs() < 1e-9);
    assert_eq!(
        whole.kv_cache,
        split.kv_cache - (whole.shared_expert_weights - split.shared_expert_weights)
    );
    // Buffers for the whole rank's tokens would take 8x the dispatch share's.
    let full = map(false, 16384);
    assert!(full.workspace > split.workspace);
}

/// Slots that do not spread evenly name the nearest values that do, and each of them validates:
/// V4-Pro's 384 experts + 32 redundant over the CloudMatrix decode instance's 288 expert dies.
#[test]
fn uneven_expert_slots_suggest_values_that_work() {
    let m = builtin("deepseek-v4-pro").unwrap();
    let err = cm384_decode()
        .validate(&m, cm384())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("redundant_experts = 192 (2 slots per die)")
            && err.contains("shared_expert_dies = 112 (208 expert dies x 2 slots)"),
        "{err}"
    );
    for l in [
        Layout {
            redundant_experts: 192,
            ..cm384_decode()
        },
        Layout {
            shared_expert_dies: 112,
            ..cm384_decode()
        },
    ] {
        l.validate(&m, cm384()).unwrap();
    }
    // Below as well as above, where the slots can shrink: 256 + 40 over 288 dies.
    let r1 = builtin("r1").unwrap();
    let l = Layout {
        redundant_experts: 40,
        ..cm384_decode()
    };
    let err = l.validate(&r1, cm384()).unwrap_err().to_string();
    assert!(
        err.contains(
            "redundant_experts = 32 (1 slot per die), or redundant_experts = 320 (2 slots per die)"
        ),
        "{err}"
    );
}

/// Where no single value works, the error says so rather than listing nothing, and never
/// suggests a single routed die (every expert on one die of an EP group): one routed expert
/// over EP32 (redundant_experts = 1 with shared_expert_dies = 30 would work: both change).
#[test]
fn uneven_expert_slots_with_no_value_that_works_say_so() {
    let mut m = builtin("r1").unwrap();
    m.routed_experts = 1;
    let l = Layout::dp_ep(Role::Decode, 32);
    let err = l.validate(&m, cm384()).unwrap_err().to_string();
    assert!(
        err.contains(
            "neither redundant_experts alone (0 to 15) nor shared_expert_dies alone (leaving at \
             least 2 expert dies) makes them divide: change both together, or ep"
        ) && !err.contains("nearest that work"),
        "{err}"
    );
    Layout {
        redundant_experts: 1,
        shared_expert_dies: 30,
        ..l.clone()
    }
    .validate(&m, cm384())
    .unwrap();
    m.shared_experts = 0;
    let err = l.validate(&m, cm384()).unwrap_err().to_string();
    assert!(
        err.contains("no redundant_experts from 0 to 15 makes them divide: choose another ep"),
        "{err}"
    );
}

/// Decode context parallelism interleaves a DP rank's KV over the group: every die keeps an
/// N-th of MLA's latent per token, so the rank holds N times the tokens; V3.2's indexer keys
/// are written whole on every die on Ascend (vllm-ascend's replicated indexer cache) and split
/// on GPUs. The weights and the KV pool in bytes do not move.
#[test]
fn decode_context_parallelism_multiplies_the_ranks_tokens() {
    let a3 = Catalog::builtin().system("atlas-800-a3").unwrap();
    let h200 = Catalog::builtin().system("nvidia-h200-8").unwrap();
    let at = |name: &str, sys, dcp| {
        let m = builtin(name).unwrap();
        let plan = Layout {
            dp: 2,
            tp: 8,
            ..Layout::dp_ep(Role::Decode, 16)
        }
        .validate(&m, sys)
        .unwrap();
        memory_map(
            &m,
            &plan,
            sys,
            &MemoryInputs {
                dcp,
                ..inputs(Quant::W8a8)
            },
        )
        .unwrap()
    };
    let (one, eight) = (at("r1", a3, 1), at("r1", a3, 8));
    assert_eq!(one.kv_cache, eight.kv_cache);
    assert_eq!(one.weights, eight.weights);
    // 61 layers + the MTP layer, 576 bf16 values each.
    assert_eq!(one.kv_bytes_per_token, 62.0 * 576.0 * 2.0);
    assert_eq!(eight.kv_bytes_per_token, one.kv_bytes_per_token / 8.0);
    assert!(
        eight
            .kv_capacity_tokens
            .abs_diff(8 * one.kv_capacity_tokens)
            <= 8
    );
    // V3.2 on Ascend: bf16 indexer keys (128 values) stay whole on each die.
    let npu = at("deepseek-v3.2", a3, 8);
    assert_eq!(
        npu.kv_bytes_per_token,
        62.0 * (576.0 * 2.0 / 8.0 + 128.0 * 2.0)
    );
    // On GPUs: FP8 keys with a 4-byte scale, split with the latent.
    let gpu = at("deepseek-v3.2", h200, 8);
    assert_eq!(gpu.kv_bytes_per_token, 62.0 * (576.0 * 2.0 + 132.0) / 8.0);
}
