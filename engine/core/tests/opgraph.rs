//! The op graph's work adds up: about 2 FLOPs per active parameter per token, plus attention.

use dstwin_core::batch::{AttnCap, BatchShape};
use dstwin_core::layout::{Layout, Role};
use dstwin_core::model::{self, builtin, ModelConfig, Quant};
use dstwin_core::opgraph::{op_work, step_ops, total_flops, MoeLoad, OpKind, StepSpec};
use dstwin_hwmodels::{Catalog, DType};

/// The ops of one step of `shape` on one die holding every expert: no communication, every
/// FLOP on it.
fn one_die_ops(m: &ModelConfig, shape: &BatchShape, mtp: u32) -> Vec<dstwin_core::opgraph::Op> {
    let sys = Catalog::builtin().system("cloudmatrix384").unwrap();
    let plan = Layout::dp_ep(Role::Mixed, 1).validate(m, sys).unwrap();
    let features = dstwin_core::features::Resolved::plain("ascend-910c");
    let spec = StepSpec {
        model: m,
        quant: Quant::Bf16,
        kv_dtype: DType::Bf16,
        plan: &plan,
        mtp_tokens: mtp,
        features: &features,
    };
    let load = MoeLoad {
        group_tokens: shape.tokens(),
        imbalance: 1.0,
        comm: dstwin_core::features::MoeCommUsed::Mc2,
    };
    step_ops(spec, shape, &load)
}

fn flops_per_token(m: &ModelConfig, shape: &BatchShape, mtp: u32) -> f64 {
    total_flops(&one_die_ops(m, shape, mtp)) / shape.tokens() as f64
}

#[test]
fn decode_at_short_context_is_two_flops_per_active_parameter() {
    for name in ["deepseek-v3", "deepseek-v3.2", "deepseek-v4-flash"] {
        let m = builtin(name).unwrap();
        let shape = BatchShape::uniform_decode(64, 1, 1, m.attn_cap());
        let f = flops_per_token(&m, &shape, 0);
        let want = 2.0 * model::active(&m) as f64;
        assert!(
            f >= want * 0.99 && f <= want * 1.03,
            "{name}: {:.3e} vs 2 x active {:.3e}",
            f,
            want
        );
    }
}

#[test]
fn attention_adds_work_with_context_and_sparse_models_cap_it() {
    let v3 = builtin("v3").unwrap();
    let v32 = builtin("v3.2").unwrap();
    let short =
        |m: &ModelConfig| flops_per_token(m, &BatchShape::uniform_decode(8, 1, 1, m.attn_cap()), 0);
    let long = |m: &ModelConfig| {
        flops_per_token(m, &BatchShape::uniform_decode(8, 1, 65536, m.attn_cap()), 0)
    };
    let dense_growth = long(&v3) - short(&v3);
    let sparse_growth = long(&v32) - short(&v32);
    assert!(dense_growth > 0.0 && sparse_growth > 0.0);
    // DSA attends 2048 keys instead of 65536; only its cheap FP8 indexer scales with context.
    assert!(
        sparse_growth < dense_growth * 0.6,
        "{sparse_growth:.3e} vs {dense_growth:.3e}"
    );
}

#[test]
fn prefill_attention_is_causal() {
    let m = builtin("v3").unwrap();
    let cap = AttnCap(None);
    let one = flops_per_token(&m, &BatchShape::uniform_prefill(1, 1024, cap), 0);
    let four = flops_per_token(&m, &BatchShape::uniform_prefill(1, 4096, cap), 0);
    // Per token, attention grows with the prompt's average position (~L/2).
    assert!(four > one);
}

#[test]
fn mtp_adds_one_layer_and_a_head_per_draft() {
    let m = builtin("v3").unwrap();
    let shape = BatchShape::uniform_decode(16, 2, 1024, m.attn_cap());
    let without = flops_per_token(&m, &shape, 0);
    let with = flops_per_token(&m, &shape, 1);
    assert!(
        with > without * 1.01 && with < without * 1.2,
        "{with:.3e} vs {without:.3e}"
    );
}

#[test]
fn a_prefill_chunk_after_cached_tokens_up_projects_their_latent_again() {
    // FLOPs of the latent up-projection (kv_b_proj) of 1,024 new prompt tokens after `cached`.
    let kv_b = |m: &ModelConfig, cached: u64| {
        let mut shape = BatchShape::default();
        shape.add_prefill(1024, cached, m.attn_cap());
        assert_eq!(shape.prefill_cached, cached);
        let ops: Vec<_> = one_die_ops(m, &shape, 0)
            .into_iter()
            .filter(|o| o.name == "kv_b_proj")
            .collect();
        total_flops(&ops)
    };
    // The same 1,024 new tokens up-project 8x the rows when 7,168 tokens sit in the cache
    // (a prefix hit or earlier chunks).
    let v3 = builtin("v3").unwrap();
    let ratio = kv_b(&v3, 7168) / kv_b(&v3, 0);
    assert!((ratio - 8.0).abs() < 1e-9, "{ratio}");
    // DeepSeek-V3.2's sparse attention attends in the latent space: no second up-projection.
    let v32 = builtin("v3.2").unwrap();
    assert!(kv_b(&v32, 0) > 0.0);
    assert_eq!(kv_b(&v32, 7168), kv_b(&v32, 0));
}

#[test]
fn the_vocabulary_names_every_op_with_its_class() {
    use dstwin_core::opgraph::vocabulary;
    let m = builtin("deepseek-v3").unwrap();
    let one = vocabulary(&m, 1, 0);
    for (name, class) in [
        ("embed", "elementwise"),
        ("attn_norm", "elementwise"),
        ("q_a_proj", "gemm"),
        ("kv_b_proj", "gemm"),
        ("attn_prefill", "prefill_attention"),
        ("attn_decode", "attention"),
        ("q_absorb", "gemm"),
        ("ffn_gate_up", "gemm"),
        ("router", "gemm"),
        ("router_topk", "elementwise"),
        ("experts", "grouped_gemm"),
        ("shared_expert", "grouped_gemm"),
        ("lm_head", "gemm"),
        ("sample", "elementwise"),
    ] {
        assert_eq!(one.get(name), Some(&class), "{name}");
    }
    // One die moves no tokens; an EP group does; MTP adds its projection.
    assert!(!one.contains_key("dispatch") && !one.contains_key("mtp_eh_proj"));
    let ep = vocabulary(&m, 4, 1);
    assert_eq!(ep.get("dispatch"), Some(&"dispatch"));
    assert_eq!(ep.get("combine"), Some(&"combine"));
    assert_eq!(ep.get("mtp_eh_proj"), Some(&"gemm"));
}

#[test]
fn attention_per_sequence_runs_one_kernel_per_sequence_on_its_share() {
    let m = builtin("deepseek-v3").unwrap();
    let sys = Catalog::builtin().system("cloudmatrix384").unwrap();
    let plan = Layout::dp_ep(Role::Mixed, 1).validate(&m, sys).unwrap();
    let mut shape = BatchShape::uniform_decode(6, 1, 300, m.attn_cap());
    shape.add_prefill(100, 50, m.attn_cap());
    shape.add_prefill(40, 0, m.attn_cap());
    let ops = |per_seq: bool| {
        let mut features = dstwin_core::features::Resolved::plain("ascend-910c");
        features.attention_per_sequence = per_seq;
        let spec = StepSpec {
            model: &m,
            quant: Quant::Bf16,
            kv_dtype: DType::Bf16,
            plan: &plan,
            mtp_tokens: 0,
            features: &features,
        };
        let load = MoeLoad {
            group_tokens: shape.tokens(),
            imbalance: 1.0,
            comm: dstwin_core::features::MoeCommUsed::Mc2,
        };
        step_ops(spec, &shape, &load)
    };
    let (batched, split) = (ops(false), ops(true));
    assert_eq!(batched.len(), split.len());
    for (a, b) in batched.iter().zip(&split) {
        assert_eq!(a.name, b.name);
        let seqs = match a.name {
            "q_absorb" | "attn_decode" | "v_absorb" => 6,
            "kv_b_proj" | "attn_prefill" => 2,
            _ => 1,
        };
        assert_eq!(b.repeat, a.repeat * seqs, "{}", a.name);
        // The same work in all, spread over the kernels.
        let (OpKind::Compute(wa), OpKind::Compute(wb)) = (a.kind, b.kind) else {
            continue;
        };
        let close = |x: f64, y: f64| (x - y).abs() <= 1e-9 * x.abs().max(1.0);
        assert!(close(wa.flops, wb.flops * seqs as f64), "{}", a.name);
        assert!(close(wa.bytes, wb.bytes * seqs as f64), "{}", a.name);
        assert!(close(wa.rows, wb.rows * seqs as f64), "{}", a.name);
    }
    assert_eq!(total_flops(&batched), total_flops(&split));
}

#[test]
fn op_work_is_the_graphs_own_op() {
    let m = builtin("deepseek-v3").unwrap();
    let shape = BatchShape::uniform_decode(4, 1, 200, m.attn_cap());
    let ops = one_die_ops(&m, &shape, 0);
    for name in ["attn_decode", "experts", "attn_norm", "q_a_proj"] {
        let from_graph = ops.iter().find(|o| o.name == name).unwrap();
        let OpKind::Compute(w) = from_graph.kind else {
            panic!("{name} is compute")
        };
        assert_eq!(
            op_work(&m, Quant::Bf16, name, &shape, shape.tokens()),
            Some(w),
            "{name}"
        );
    }
    assert_eq!(
        op_work(&m, Quant::Bf16, "no_such_op", &shape, shape.tokens()),
        None
    );
}
