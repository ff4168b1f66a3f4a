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

/// A DeepSeek-V4-shaped model small enough to count by hand: hidden 8, two residual copies,
/// 3 Sinkhorn iterations, RoPE on 2 dimensions, entries of 4 (indexer keys of 2), one
/// window-only layer, one compressed-sparse layer (ratio 4) and one heavily compressed layer
/// (ratio 8).
fn tiny_v4() -> ModelConfig {
    use dstwin_core::model::{Attention, Family, Indexer};
    let m = ModelConfig {
        name: "tiny-v4".into(),
        family: Family::V4,
        hidden: 8,
        layers: 3,
        mtp_layers: 1,
        dense_layers: 0,
        dense_ffn: 0,
        routed_experts: 4,
        top_k: 2,
        shared_experts: 1,
        expert_ffn: 4,
        router_groups: 1,
        vocab: 16,
        max_context: 1024,
        attention: Attention::Hybrid {
            heads: 2,
            head_dim: 4,
            q_lora_rank: 4,
            o_lora_rank: 4,
            o_groups: 1,
            window: 4,
            compress_ratios: vec![0, 4, 8, 0],
            indexer: Indexer {
                heads: 2,
                head_dim: 2,
                topk: 2,
            },
            hc_mult: 2,
            hc_sinkhorn_iters: 3,
            rope_dim: 2,
        },
    };
    m.validate().unwrap();
    m
}

/// (FLOPs, bytes) of each op of a kernel call.
fn kernel(m: &ModelConfig, name: &str, tokens: f64, entries: f64) -> Vec<(&'static str, f64, f64)> {
    dstwin_core::opgraph::kernel_ops(m, name, tokens, entries)
        .unwrap_or_else(|| panic!("{name}"))
        .into_iter()
        .map(|(n, w)| (n, w.flops, w.bytes))
        .collect()
}

#[test]
fn the_v4_kernels_count_their_work_by_hand() {
    let m = tiny_v4();
    // d = 8, c = 2, mixing width (2 + c) c = 8, 3 Sinkhorn iterations.
    // hc_pre per token: projection 2 c d 8 = 256, RMS and weighted sum 4 c d = 64, Sinkhorn
    // 4 x 3 x c^2 = 48 -> 368 FLOPs; bytes: copies in c d x 2 = 32, input out d x 2 = 16,
    // coefficients c + c^2 fp32 = 24 -> 72 per token, plus the fp32 weights 8 x c d x 4 = 512.
    assert_eq!(kernel(&m, "hc_pre", 1.0, 0.0), [("hc_pre", 368.0, 584.0)]);
    assert_eq!(kernel(&m, "hc_pre", 3.0, 0.0), [("hc_pre", 1104.0, 728.0)]);
    // hc_post per token: 2 c d (c + 1) = 96 FLOPs; copies read and written 2 x c d x 2 = 64,
    // the block output 16, coefficients 24 -> 104 bytes.
    assert_eq!(kernel(&m, "hc_post", 1.0, 0.0), [("hc_post", 96.0, 104.0)]);
    // hc_head per token: 2 c d c + 4 c d = 128 FLOPs; copies in 32 + out 16, weights c c d x 4.
    assert_eq!(kernel(&m, "hc_head", 1.0, 0.0), [("hc_head", 128.0, 176.0)]);
    // The compressed-sparse layer's attention compressor: entries of 4, overlapping windows
    // (states 2 x 4 wide, KV and score: 16 columns). Per token 2 d 16 = 256 FLOPs; bytes: the
    // bf16 weights 16 x 8 x 2 = 256, the fp32 positional bias 4 x 2 x 4 x 4 = 128, and per
    // token the input 16 plus its state rows 16 x 4 = 64.
    // Pooling one window (2 x 4 = 8 rows of 4): softmax and sum 7 x 8 x 4 = 224, norm 4 x 4,
    // RoPE 3 x 2 -> 246 FLOPs; both fp32 states of the window 2 x 8 x 4 x 4 = 256 + the entry 8.
    assert_eq!(
        kernel(&m, "c4a", 1.0, 1.0),
        [("c4a", 256.0, 464.0), ("c4a_pool", 246.0, 264.0)]
    );
    // A call that completes no window runs no pooling.
    assert_eq!(kernel(&m, "c4a", 1.0, 0.0), [("c4a", 256.0, 464.0)]);
    // The indexer's keys: entries of 2 (8 columns), Hadamard-rotated: 2 x 2 x 2 more FLOPs and
    // its 2 x 2 bf16 matrix read.
    assert_eq!(
        kernel(&m, "c4li", 1.0, 1.0),
        [("c4li", 128.0, 240.0), ("c4li_pool", 134.0, 140.0)]
    );
    // The heavily compressed layer: ratio 8, no overlap (8 columns, windows of 8 rows).
    assert_eq!(
        kernel(&m, "c128a", 1.0, 1.0),
        [("c128a", 128.0, 304.0), ("c128a_pool", 246.0, 264.0)]
    );
    // V3 has none of them.
    assert!(
        dstwin_core::opgraph::kernel_ops(&builtin("v3").unwrap(), "hc_pre", 1.0, 0.0).is_none()
    );
}

#[test]
fn a_v4_step_runs_the_mhc_around_every_block_and_the_compressors_of_its_layer() {
    let m = tiny_v4();
    let shape = BatchShape::uniform_decode(4, 2, 64, m.attn_cap());
    let ops = one_die_ops(&m, &shape, 1);
    let count = |name: &str, layer: &str| {
        ops.iter()
            .filter(|o| o.name == name && o.layer.name() == layer)
            .map(|o| o.repeat)
            .sum::<u64>()
    };
    // Two hc_pre and two hc_post per decoder layer (3) and in the MTP layer; one hc_head per
    // pass.
    assert_eq!(count("hc_pre", "attention"), 6);
    assert_eq!(count("hc_post", "attention") + count("hc_post", "moe"), 6);
    assert_eq!(count("hc_pre", "mtp") + count("hc_post", "mtp"), 4);
    assert_eq!(count("hc_head", "lm_head") + count("hc_head", "mtp"), 2);
    // Compressors only where a layer compresses, never in the window-only MTP layer.
    for (name, n) in [("c4li", 1), ("c4a", 1), ("c128a", 1)] {
        assert_eq!(count(name, "attention"), n, "{name}");
        assert_eq!(count(name, "mtp"), 0, "{name}");
    }
    // A step of 8 tokens completes 8 / 4 windows in the ratio-4 layer, 8 / 8 in the other.
    let pool = |name: &str| {
        let o = ops.iter().find(|o| o.name == name).unwrap();
        match o.kind {
            dstwin_core::opgraph::OpKind::Compute(w) => w.flops,
            _ => unreachable!(),
        }
    };
    assert_eq!(pool("c4a_pool"), 2.0 * 246.0);
    assert_eq!(pool("c128a_pool"), 246.0);
    // V4's indexer takes its keys from its compressor: no key projection (V3.2 has one).
    let names = |m: &ModelConfig| dstwin_core::opgraph::vocabulary(m, 1, 1);
    assert!(!names(&m).contains_key("indexer_k"));
    assert!(names(&builtin("v3.2").unwrap()).contains_key("indexer_k"));
    assert_eq!(names(&m).get("hc_post"), Some(&"elementwise"));
    assert_eq!(names(&m).get("c4a"), Some(&"gemm"));
    assert_eq!(names(&m).get("c4a_pool"), Some(&"elementwise"));
}

/// Every op of the V3 family's graph, with its work, at a decode step (MTP 1) and a prefill
/// step after cached tokens: the V4 kernels must leave them as they were. On a deliberate
/// change, replace tests/data/v3-family-ops.txt with the listing this test prints.
#[test]
fn the_v3_family_op_lists_are_unchanged() {
    let mut listing = String::new();
    for name in ["deepseek-v3", "deepseek-v3.2"] {
        let m = builtin(name).unwrap();
        let mut prefill = BatchShape::default();
        prefill.add_prefill(1024, 2048, m.attn_cap());
        for (label, shape, mtp) in [
            (
                "decode",
                BatchShape::uniform_decode(32, 2, 4096, m.attn_cap()),
                1,
            ),
            ("prefill", prefill, 0),
        ] {
            for o in one_die_ops(&m, &shape, mtp) {
                let (flops, bytes) = match o.kind {
                    dstwin_core::opgraph::OpKind::Compute(w) => (w.flops, w.bytes),
                    dstwin_core::opgraph::OpKind::Comm(c) => (0.0, c.bytes),
                };
                listing += &format!(
                    "{name} {label} {} {} x{} {} flops={flops:e} bytes={bytes:e}\n",
                    o.name,
                    o.layer.name(),
                    o.repeat,
                    o.class_name()
                );
            }
        }
    }
    let golden = include_str!("data/v3-family-ops.txt");
    assert!(
        listing == golden,
        "the V3-family op lists changed; the new listing:\n{listing}"
    );
}

/// The step spec of W8A8 weights and a bf16 KV cache, with `mtp` draft tokens.
fn w8a8_spec<'a>(
    m: &'a ModelConfig,
    plan: &'a dstwin_core::layout::Plan,
    features: &'a dstwin_core::features::Resolved,
    mtp: u32,
) -> StepSpec<'a> {
    StepSpec {
        model: m,
        quant: Quant::W8a8,
        kv_dtype: DType::Bf16,
        plan,
        mtp_tokens: mtp,
        features,
    }
}

/// A step's ops split into two parts: every op in exactly one, each part in the whole list's
/// order; the batch part never reads the MoE load, and the MoE part reads of the batch only
/// what `moe_reads` says. For every builtin model (V4's hyper-connections and compressors
/// included), with and without MTP drafts and a later draft pass.
#[test]
fn a_steps_parts_are_its_ops_and_read_only_what_they_say() {
    use dstwin_core::opgraph::{moe_reads, step_part_ops_into, Part};
    let sys = Catalog::builtin().system("cloudmatrix384").unwrap();
    for name in ["deepseek-v3", "deepseek-v3.2", "deepseek-v4-flash"] {
        let m = builtin(name).unwrap();
        let plan = Layout::dp_ep(Role::Mixed, 32).validate(&m, sys).unwrap();
        let features = dstwin_core::features::Resolved::plain("ascend-910c");
        let cap = m.attn_cap();
        for mtp in [0, 1, 2] {
            let spec = w8a8_spec(&m, &plan, &features, mtp);
            let load = |imbalance: f64, group_tokens: u64| MoeLoad {
                group_tokens,
                imbalance,
                comm: dstwin_core::features::MoeCommUsed::AllToAll,
            };
            let mut shape = BatchShape::uniform_decode(8, 1 + mtp as u64, 3000, cap);
            shape.add_prefill(500, 1000, cap);
            // Another batch with the same tokens and sequences: longer contexts.
            let mut other = BatchShape::uniform_decode(8, 1 + mtp as u64, 5000, cap);
            other.add_prefill(500, 4000, cap);
            assert_eq!(moe_reads(&spec, &shape), moe_reads(&spec, &other));
            let whole = step_ops(spec, &shape, &load(1.3, 20_000));
            let part = |b: &BatchShape, l: &MoeLoad, p: Part| {
                let mut ops = Vec::new();
                step_part_ops_into(spec, b, l, p, &mut ops);
                ops
            };
            let of =
                |p: Part| -> Vec<_> { whole.iter().filter(|o| o.part == p).copied().collect() };
            let batch = part(&shape, &load(2.0, 7), Part::Batch);
            let moe = part(&other, &load(1.3, 20_000), Part::Moe);
            assert_eq!(batch, of(Part::Batch), "{name} mtp {mtp}");
            assert_eq!(moe, of(Part::Moe), "{name} mtp {mtp}");
            assert!(!batch.is_empty() && !moe.is_empty());
            assert_eq!(batch.len() + moe.len(), whole.len());
            assert!(moe.iter().any(|o| o.name == "experts"));
            assert!(batch
                .iter()
                .all(|o| o.dies == dstwin_core::opgraph::DieSet::All));
            // The MoE part moves with the load.
            assert_ne!(part(&shape, &load(1.1, 20_000), Part::Moe), moe);
            // The same tokens in one more sequence: only a later draft pass reads sequences.
            let mut more = BatchShape::uniform_decode(8, 1 + mtp as u64, 3000, cap);
            more.add_prefill(250, 1000, cap);
            more.add_prefill(250, 1000, cap);
            let same = part(&more, &load(1.3, 20_000), Part::Moe) == moe;
            assert_eq!(same, mtp < 2, "{name} mtp {mtp}");
            assert_eq!(moe_reads(&spec, &more) == moe_reads(&spec, &shape), same);
        }
    }
}

/// Under context parallelism a step with prompts routes each die's slice of the tokens, a
/// decode-only step every token of the rank: with dense TP 1 their MoE parts differ at the
/// same token count, and `moe_reads` tells them apart (the price cache keys on it).
#[test]
fn context_parallelism_is_part_of_what_the_moe_part_reads() {
    use dstwin_core::opgraph::{moe_reads, step_part_ops_into, Part};
    let sys = Catalog::builtin().system("cloudmatrix384").unwrap();
    let m = builtin("deepseek-v3.2").unwrap();
    let layout = Layout {
        tp: 4,
        dp: 8,
        dense_tp: Some(1),
        lmhead_tp: None,
        ..Layout::dp_ep(Role::Mixed, 32)
    };
    let plan = layout.validate(&m, sys).unwrap();
    let cap = m.attn_cap();
    let load = MoeLoad {
        group_tokens: 8 * 64,
        imbalance: 1.2,
        comm: dstwin_core::features::MoeCommUsed::AllToAll,
    };
    let prompt = BatchShape::uniform_prefill(1, 64, cap);
    let decode = BatchShape::uniform_decode(1, 64, 3000, cap);
    for cp in [false, true] {
        let mut features = dstwin_core::features::Resolved::plain("ascend-910c");
        features.dsa_cp = cp;
        let spec = w8a8_spec(&m, &plan, &features, 0);
        let part = |b: &BatchShape| {
            let mut ops = Vec::new();
            step_part_ops_into(spec, b, &load, Part::Moe, &mut ops);
            ops
        };
        assert_eq!(part(&prompt) == part(&decode), !cp, "cp {cp}");
        assert_eq!(
            moe_reads(&spec, &prompt) == moe_reads(&spec, &decode),
            !cp,
            "cp {cp}"
        );
    }
}

/// The MoE part's ops split by where they run: those on every die read of the load only
/// what `every_die_load` keeps (the group's tokens only in all-gather mode), and those on the
/// expert dies read of the batch only what `expert_reads` says (nothing without a later draft
/// pass). For every builtin model, with and without MTP drafts and a later draft pass, with a
/// shared expert on dies of its own and without.
#[test]
fn the_moe_parts_die_sets_read_only_what_they_say() {
    use dstwin_core::features::MoeCommUsed;
    use dstwin_core::opgraph::{
        every_die_load, expert_reads, moe_reads, step_part_ops_into, DieSet, Part,
    };
    let sys = Catalog::builtin().system("cloudmatrix384").unwrap();
    for name in ["deepseek-v3", "deepseek-v3.2", "deepseek-v4-flash"] {
        let m = builtin(name).unwrap();
        let mut own_dies = Layout::dp_ep(Role::Decode, 72);
        own_dies.shared_expert_dies = 8;
        for layout in [Layout::dp_ep(Role::Mixed, 32), own_dies] {
            let plan = layout.validate(&m, sys).unwrap();
            let features = dstwin_core::features::Resolved::plain("ascend-910c");
            let cap = m.attn_cap();
            for mtp in [0, 1, 2] {
                let spec = w8a8_spec(&m, &plan, &features, mtp);
                let ops = |b: &BatchShape, l: &MoeLoad, every: bool| -> Vec<_> {
                    let mut ops = Vec::new();
                    step_part_ops_into(spec, b, l, Part::Moe, &mut ops);
                    ops.retain(|o| (o.dies == DieSet::All) == every);
                    ops
                };
                let shape = BatchShape::uniform_decode(24, 1 + mtp as u64, 3000, cap);
                // More sequences, other contexts, and a prompt chunk: another share of
                // sequences in the tokens too (what a later draft pass's load reads).
                let mut other = BatchShape::uniform_decode(48, 1 + mtp as u64, 700, cap);
                other.add_prefill(500, 1000, cap);
                for comm in [
                    MoeCommUsed::Mc2,
                    MoeCommUsed::AllToAll,
                    MoeCommUsed::AllGather,
                ] {
                    let load = |group_tokens| MoeLoad {
                        group_tokens,
                        imbalance: 1.3,
                        comm,
                    };
                    let (a, b) = (load(20_000), load(31_000));
                    let what = format!("{name} {} dies mtp {mtp} {comm:?}", plan.dies);
                    // Every die: the group's tokens matter only where `every_die_load` keeps them.
                    let same_load = every_die_load(&a) == every_die_load(&b);
                    assert_eq!(same_load, comm != MoeCommUsed::AllGather, "{what}");
                    assert_eq!(
                        ops(&shape, &a, true) == ops(&shape, &b, true),
                        same_load,
                        "{what}"
                    );
                    assert_ne!(ops(&shape, &a, true), ops(&other, &a, true), "{what}");
                    assert_ne!(moe_reads(&spec, &shape), moe_reads(&spec, &other));
                    // Expert dies: the batch matters only through `expert_reads`.
                    let same_reads = expert_reads(&spec, &shape) == expert_reads(&spec, &other);
                    assert_eq!(same_reads, mtp < 2, "{what}");
                    let experts = ops(&shape, &a, false);
                    assert!(experts.iter().any(|o| o.name == "experts"), "{what}");
                    assert_eq!(experts == ops(&other, &a, false), same_reads, "{what}");
                    assert_ne!(experts, ops(&shape, &b, false), "{what}");
                }
            }
        }
    }
}

/// The indexer scores in its keys' format and reads them at its bytes: bf16 keys on Ascend
/// (vllm-ascend's and SGLang's NPU default), FP8 keys with a scale on GPUs, int8 keys with a
/// scale in an Ascend int8 cache (CANN's C8); V4 keeps 8-bit keys everywhere.
#[test]
fn the_indexer_reads_its_keys_in_the_engines_format() {
    let sys = Catalog::builtin().system("cloudmatrix384").unwrap();
    let score = |name: &str, chip: &str, kv: DType| {
        let m = builtin(name).unwrap();
        let plan = Layout::dp_ep(Role::Decode, 32).validate(&m, sys).unwrap();
        let features = dstwin_core::features::Resolved::plain(chip);
        let spec = StepSpec {
            kv_dtype: kv,
            ..w8a8_spec(&m, &plan, &features, 0)
        };
        let shape = BatchShape::uniform_decode(4, 1, 65536, m.attn_cap());
        let load = MoeLoad {
            group_tokens: shape.tokens(),
            imbalance: 1.0,
            comm: dstwin_core::features::MoeCommUsed::Mc2,
        };
        let op = step_ops(spec, &shape, &load)
            .into_iter()
            .find(|o| {
                o.name == "indexer_score" && o.layer == dstwin_core::opgraph::LayerKind::Attention
            })
            .unwrap();
        match op.kind {
            OpKind::Compute(w) => (w.dtype, w.bytes),
            OpKind::Comm(_) => unreachable!(),
        }
    };
    // Each sequence's query scores its 65,536 cached keys and its own.
    let keys = 4.0 * 65537.0;
    let (dt, bytes) = score("deepseek-v3.2", "ascend-910c", DType::Bf16);
    assert_eq!((dt, bytes), (DType::Bf16, keys * 256.0));
    let (dt, bytes) = score("deepseek-v3.2", "h800", DType::Bf16);
    assert_eq!((dt, bytes), (DType::Fp8, keys * 132.0));
    let (dt, bytes) = score("deepseek-v3.2", "ascend-910c", DType::Int8);
    assert_eq!((dt, bytes), (DType::Int8, keys * 132.0));
    let (dt, _) = score("deepseek-v4-flash", "ascend-910c", DType::Bf16);
    assert_eq!(dt, DType::Int8);
}

#[test]
fn moe_tensor_parallelism_splits_every_expert_and_all_reduces_once() {
    use dstwin_core::features::MoeCommUsed;
    use dstwin_hwmodels::{CommKind, OpClass};
    let m = builtin("r1").unwrap();
    let sys = Catalog::builtin().system("nvidia-h200-8").unwrap();
    let features = dstwin_core::features::Resolved::plain("nvidia-h200");
    let layout = |ep| Layout {
        role: Role::Mixed,
        dies: 8,
        dp: 1,
        tp: 8,
        ep,
        dense_tp: None,
        lmhead_tp: None,
        redundant_experts: 0,
        shared_expert_dies: 0,
    };
    let shape = BatchShape::uniform_decode(512, 1, 1024, m.attn_cap());
    let ops = |plan: &dstwin_core::layout::Plan, imbalance| {
        let spec = StepSpec {
            model: &m,
            quant: Quant::Fp8,
            kv_dtype: DType::Bf16,
            plan,
            mtp_tokens: 0,
            features: &features,
        };
        let load = MoeLoad {
            group_tokens: shape.tokens(),
            imbalance,
            comm: MoeCommUsed::AllToAll,
        };
        step_ops(spec, &shape, &load)
    };
    let tp_plan = layout(1).validate(&m, sys).unwrap();
    let tp = ops(&tp_plan, 3.0);
    let moe_layers = m.moe_layers();
    let experts: Vec<_> = tp
        .iter()
        .filter(|o| o.name == "experts" && o.layer == dstwin_core::opgraph::LayerKind::Moe)
        .collect();
    assert_eq!(experts.len(), 1);
    let OpKind::Compute(w) = experts[0].kind else {
        panic!("experts is compute")
    };
    assert_eq!(w.class, OpClass::TpGroupedGemm);
    assert_eq!(w.slice, m.expert_ffn as f64 / 8.0);
    // Every token's top-k experts, each an eighth wide; the imbalance plays no part.
    let want = 2.0 * 512.0 * m.top_k as f64 * 3.0 * m.hidden as f64 * m.expert_ffn as f64 / 8.0;
    assert!(
        (w.flops / want - 1.0).abs() < 1e-12,
        "{} vs {want}",
        w.flops
    );
    assert!(tp.iter().all(|o| !matches!(o.name, "dispatch" | "combine")));
    let reduce: Vec<_> = tp.iter().filter(|o| o.name == "moe_all_reduce").collect();
    assert_eq!(reduce.len(), 1);
    assert_eq!(reduce[0].repeat, moe_layers);
    match reduce[0].kind {
        OpKind::Comm(c) => {
            assert_eq!((c.kind, c.group), (CommKind::AllReduce, 8));
            assert_eq!(c.bytes, 512.0 * m.hidden as f64 * 2.0);
        }
        OpKind::Compute(_) => panic!("the all-reduce is a collective"),
    }
    // Expert parallelism over the same dies at balance computes the same expert FLOPs per
    // die (32 whole experts against 256 eighths), dispatching instead of reducing.
    let ep_plan = layout(8).validate(&m, sys).unwrap();
    let ep = ops(&ep_plan, 1.0);
    let flops = |ops: &[dstwin_core::opgraph::Op]| -> f64 {
        ops.iter()
            .filter(|o| o.name == "experts")
            .map(|o| match o.kind {
                OpKind::Compute(w) => w.flops * o.repeat as f64,
                OpKind::Comm(_) => 0.0,
            })
            .sum()
    };
    assert!((flops(&tp) / flops(&ep) - 1.0).abs() < 1e-12);
    assert!(ep.iter().any(|o| o.name == "dispatch"));
}

#[test]
fn w4a8_experts_compute_from_int4_weights_and_the_rest_from_int8() {
    let m = builtin("r1").unwrap();
    let sys = Catalog::builtin().system("cloudmatrix384").unwrap();
    let plan = Layout::dp_ep(Role::Decode, 16).validate(&m, sys).unwrap();
    let features = dstwin_core::features::Resolved::plain("ascend-910c");
    let spec = StepSpec {
        model: &m,
        quant: Quant::W4a8,
        kv_dtype: DType::Bf16,
        plan: &plan,
        mtp_tokens: 0,
        features: &features,
    };
    let shape = BatchShape::uniform_decode(16, 1, 1024, m.attn_cap());
    let load = MoeLoad {
        group_tokens: 256,
        imbalance: 1.0,
        comm: dstwin_core::features::MoeCommUsed::Mc2,
    };
    let dtype = |name: &str| {
        step_ops(spec, &shape, &load)
            .into_iter()
            .find_map(|o| match o.kind {
                OpKind::Compute(w) if o.name == name => Some(w.dtype),
                _ => None,
            })
            .unwrap()
    };
    assert_eq!(dtype("experts"), DType::Int4);
    assert_eq!(dtype("shared_expert"), DType::Int4);
    assert_eq!(dtype("q_b_proj"), DType::Int8);
}

/// vllm-ascend's LM-head TP over n DP ranks: each pads its logits to max_num_seqs x (1 +
/// drafts) tokens, all-gathers the group's hidden states, computes their logits over 1/n of
/// the vocabulary and exchanges them back; the MTP head, which shares the weight, does the same.
#[test]
fn lmhead_tp_gathers_the_group_and_computes_its_vocabulary_slice() {
    use dstwin_core::features::{Features, MoeCommUsed};
    use dstwin_hwmodels::CommKind;
    let m = builtin("r1").unwrap();
    let sys = Catalog::builtin().system("atlas-800-a3").unwrap();
    // 28 sequences a rank, MTP 1: logits padded to 56 tokens.
    let features = Features::default()
        .resolve("ascend-910c", 28, 1, 1)
        .unwrap();
    let shape = BatchShape::uniform_decode(20, 2, 4096, m.attn_cap());
    let ops = |lmhead_tp| {
        let plan = Layout {
            lmhead_tp,
            ..Layout::dp_ep(Role::Decode, 32)
        }
        .validate(&m, sys)
        .unwrap();
        let spec = w8a8_spec(&m, &plan, &features, 1);
        let load = MoeLoad {
            group_tokens: shape.tokens() * 32,
            imbalance: 1.0,
            comm: MoeCommUsed::Mc2,
        };
        step_ops(spec, &shape, &load)
    };
    let (h, v) = (m.hidden as f64, m.vocab as f64);
    let heads = |ops: &[dstwin_core::opgraph::Op]| -> Vec<(f64, f64)> {
        ops.iter()
            .filter(|o| o.name == "lm_head")
            .map(|o| match o.kind {
                OpKind::Compute(w) => (w.flops, w.bytes),
                OpKind::Comm(_) => panic!("lm_head is compute"),
            })
            .collect()
    };
    let plain = ops(None);
    assert!(plain
        .iter()
        .all(|o| !o.name.starts_with("lmhead_") && o.name != "logits_all_to_all"));
    // Without it: the step's 40 logit tokens (and 20 for the draft) over the whole vocabulary.
    assert_eq!(heads(&plain)[0].0, 2.0 * 40.0 * h * v);
    let split = ops(Some(16));
    for (flops, bytes) in heads(&split) {
        assert_eq!(flops, 2.0 * 16.0 * 56.0 * h * v / 16.0);
        // Its 1/16 of the weights, plus the gathered rows in and their logits out.
        let want = v / 16.0 * h * 2.0 + 16.0 * 56.0 * (h + v / 16.0) * 2.0;
        assert!((bytes / want - 1.0).abs() < 1e-9, "{bytes} vs {want}");
    }
    let comm = |name: &str| -> Vec<(CommKind, f64, u32)> {
        split
            .iter()
            .filter(|o| o.name == name)
            .map(|o| match o.kind {
                OpKind::Comm(c) => (c.kind, c.bytes, c.group),
                OpKind::Compute(_) => panic!("{name} is a collective"),
            })
            .collect()
    };
    // Once for the model's head, once for the MTP head.
    assert_eq!(
        comm("lmhead_all_gather"),
        vec![(CommKind::AllGather, 16.0 * 56.0 * h * 2.0, 16); 2]
    );
    assert_eq!(
        comm("logits_all_to_all"),
        vec![(CommKind::AllGather, 56.0 * v * 2.0, 16); 2]
    );
}

/// Shared-expert DP (FLASHCOMM1 runs it so by itself): each die of the TP group computes the
/// whole shared expert for its own slice of the tokens, reading all of its weights, where TP
/// splits it eight ways over every token of the rank: the same FLOPs, eight times the weights.
#[test]
fn shared_expert_dp_runs_the_whole_expert_on_the_dies_slice() {
    use dstwin_core::features::{Features, MoeCommUsed};
    let m = builtin("r1").unwrap();
    let sys = Catalog::builtin().system("atlas-800-a3").unwrap();
    let plan = Layout {
        dp: 2,
        tp: 8,
        ..Layout::dp_ep(Role::Prefill, 16)
    }
    .validate(&m, sys)
    .unwrap();
    let shape = BatchShape::uniform_prefill(2, 2048, m.attn_cap());
    let shared = |f: Features| {
        let features = f.resolve("ascend-910c", 8, 0, 8).unwrap();
        let spec = w8a8_spec(&m, &plan, &features, 0);
        let load = MoeLoad {
            group_tokens: shape.tokens() * 2,
            imbalance: 1.0,
            comm: MoeCommUsed::AllToAll,
        };
        let ops = step_ops(spec, &shape, &load);
        let o = ops.iter().find(|o| o.name == "shared_expert").unwrap();
        match o.kind {
            OpKind::Compute(w) => (features.flashcomm1, w.flops, w.bytes),
            OpKind::Comm(_) => panic!("the shared expert is compute"),
        }
    };
    let (fc_tp, flops_tp, bytes_tp) = shared(Features::default());
    let (fc_dp, flops_dp, bytes_dp) = shared(Features {
        flashcomm1: true,
        ..Features::default()
    });
    let (fc_flag, flops_flag, bytes_flag) = shared(Features {
        enable_shared_expert_dp: true,
        ..Features::default()
    });
    assert!(!fc_tp && fc_dp && fc_flag, "the option turns FLASHCOMM1 on");
    assert!((flops_dp / flops_tp - 1.0).abs() < 1e-12);
    assert_eq!((flops_flag, bytes_flag), (flops_dp, bytes_dp));
    // Int8 weights (whole, or an eighth) plus each token's bf16 activations in and out.
    let (h, ffn) = (m.hidden as f64, m.expert_ffn as f64);
    let weights = m.expert_params() as f64 * m.shared_experts as f64;
    let bytes =
        |tokens: f64, split: f64| weights / split + tokens * (2.0 * h + 3.0 * ffn / split) * 2.0;
    assert!(
        (bytes_tp / bytes(4096.0, 8.0) - 1.0).abs() < 1e-12,
        "{bytes_tp}"
    );
    assert!(
        (bytes_dp / bytes(512.0, 1.0) - 1.0).abs() < 1e-12,
        "{bytes_dp}"
    );
}

/// vLLM's decode context parallelism over the TP group's 8 dies: each die attends all 128
/// query heads (gathered) over an eighth of every context, so decode attention keeps its FLOPs
/// and reads an eighth of the KV; the queries are all-gathered and the partial outputs with
/// their log-sum-exp sent back to their heads' dies (fp32 with the LSE on Ascend, bf16 and an
/// fp32 LSE on GPUs). V3.2's indexer scores the whole context on Ascend (replicated keys) and
/// its share on GPUs, gathering the top-k candidates.
#[test]
fn decode_context_parallelism_splits_the_kv_reads_and_gathers_the_heads() {
    use dstwin_core::features::{Features, MoeCommUsed};
    use dstwin_hwmodels::CommKind;
    let ops = |model: &str, chip: &str, system: &str, dcp: Option<u32>| {
        let m = builtin(model).unwrap();
        let sys = Catalog::builtin().system(system).unwrap();
        let plan = Layout {
            dp: 1,
            tp: 8,
            ..Layout::dp_ep(Role::Decode, 8)
        }
        .validate(&m, sys)
        .unwrap();
        let features = Features {
            decode_context_parallel_size: dcp,
            ..Features::default()
        }
        .resolve(chip, 16, 0, 8)
        .unwrap();
        let spec = w8a8_spec(&m, &plan, &features, 0);
        let shape = BatchShape::uniform_decode(16, 1, 8192, m.attn_cap());
        let load = MoeLoad {
            group_tokens: shape.tokens() * 8,
            imbalance: 1.0,
            comm: MoeCommUsed::Mc2,
        };
        step_ops(spec, &shape, &load)
    };
    let compute = |ops: &[dstwin_core::opgraph::Op], name: &str| {
        ops.iter()
            .find_map(|o| match o.kind {
                OpKind::Compute(w) if o.name == name => Some((w.flops, w.bytes)),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no {name}"))
    };
    let comm = |ops: &[dstwin_core::opgraph::Op], name: &str| {
        ops.iter().find_map(|o| match o.kind {
            OpKind::Comm(c) if o.name == name => Some((c.kind, c.bytes, c.group)),
            _ => None,
        })
    };
    let (plain, dcp) = (
        ops("r1", "ascend-910c", "atlas-800-a3", None),
        ops("r1", "ascend-910c", "atlas-800-a3", Some(8)),
    );
    assert!(plain.iter().all(|o| !o.name.starts_with("dcp_")));
    let ((f1, b1), (f8, b8)) = (compute(&plain, "attn_decode"), compute(&dcp, "attn_decode"));
    assert!((f8 / f1 - 1.0).abs() < 1e-12, "{f8} vs {f1}");
    // 16 contexts of 8,193 keys (the new one too) of 576 bf16 values; queries and outputs of 16 (TP) or 128
    // (gathered) heads x 1,088 values.
    let kv = 16.0 * 8193.0 * 576.0 * 2.0;
    assert_eq!(b1, kv + 16.0 * 16.0 * 1088.0 * 2.0);
    assert_eq!(b8, kv / 8.0 + 16.0 * 128.0 * 1088.0 * 2.0);
    let rows = 16.0 * 128.0;
    assert_eq!(
        comm(&dcp, "dcp_q_all_gather"),
        Some((CommKind::AllGather, rows * 576.0 * 2.0, 8))
    );
    assert_eq!(
        comm(&dcp, "dcp_out_all_to_all"),
        Some((CommKind::ReduceScatter, rows * 513.0 * 4.0, 8))
    );
    let gpu = ops("deepseek-v3.2", "nvidia-h200", "nvidia-h200-8", Some(8));
    assert_eq!(
        comm(&gpu, "dcp_out_all_to_all"),
        Some((CommKind::ReduceScatter, rows * (512.0 * 2.0 + 4.0), 8))
    );
    let gpu_plain = ops("deepseek-v3.2", "nvidia-h200", "nvidia-h200-8", None);
    let (fi8, fi1) = (
        compute(&gpu, "indexer_score").0,
        compute(&gpu_plain, "indexer_score").0,
    );
    assert!((fi8 * 8.0 / fi1 - 1.0).abs() < 1e-12, "{fi8} vs {fi1}");
    assert_eq!(
        comm(&gpu, "dcp_topk_gather"),
        Some((CommKind::AllGather, 16.0 * 2048.0 * 8.0 * 8.0, 8))
    );
    let npu = ops("deepseek-v3.2", "ascend-910c", "atlas-800-a3", Some(8));
    let npu_plain = ops("deepseek-v3.2", "ascend-910c", "atlas-800-a3", None);
    assert_eq!(
        compute(&npu, "indexer_score"),
        compute(&npu_plain, "indexer_score")
    );
    assert_eq!(comm(&npu, "dcp_topk_gather"), None);
}
