//! Human-readable rendering of reports.

use crate::explain::Explain;
use std::fmt::Write;

fn gb(b: f64) -> String {
    format!("{:.2} GB", b / 1e9)
}

/// Renders `explain` as text tables.
pub fn render_explain(e: &Explain) -> String {
    let mut s = String::new();
    let p = &e.plan;
    let _ = writeln!(
        s,
        "{} {} (KV {}) on {} ({})",
        e.model, e.quant, e.kv_dtype, e.system, e.chip
    );
    let _ = writeln!(
        s,
        "{} instance: {} dies, DP{} x TP{}, EP{} ({} routed-expert dies x {} slots, {} redundant, {} shared-expert dies), dense TP{}",
        p.role.name(),
        p.dies,
        p.dp,
        p.tp,
        p.ep,
        p.routed_dies,
        p.slots_per_die,
        p.redundant_experts,
        p.shared_expert_dies,
        p.dense_tp
    );
    let b = &e.batch;
    let _ = writeln!(
        s,
        "batch per DP rank: {} decode seqs at KV {} ({} tokens with MTP {}), {} prompt tokens in prompts of {}; MoE imbalance {:.2}",
        b.decode_seqs,
        b.kv_len,
        e.shape.decode_tokens,
        e.mtp.tokens,
        b.prefill_tokens,
        b.prompt_len,
        e.moe_imbalance
    );
    let _ = writeln!(s);
    let _ = writeln!(s, "step time          {:>9.3} ms", e.step_ms);
    let _ = writeln!(
        s,
        "  serial           {:>9.3} ms  (compute {:.3} + communication {:.3})",
        e.serial_step_ms, e.compute_ms, e.comm_ms
    );
    let _ = writeln!(
        s,
        "  two micro-batches{:>9.3} ms  ({:+.1}% throughput vs serial)",
        e.two_microbatch_step_ms,
        e.two_microbatch_gain * 100.0
    );
    let _ = writeln!(s, "  roofline limit   {:>9.3} ms  (all compute at 100% of peak, no overhead, no communication)", e.roofline_ms);
    let t = &e.throughput;
    if let Some(tpot) = t.tpot_ms {
        let _ = writeln!(
            s,
            "TPOT               {:>9.2} ms  ({:.2} tokens per sequence per step)",
            tpot, t.tokens_per_seq_step
        );
        let _ = writeln!(
            s,
            "output tokens/s    {:>9.0} per die, {:.0} per package (card)",
            t.output_tok_s_per_die, t.output_tok_s_per_package
        );
    }
    if t.input_tok_s_per_die > 0.0 {
        let _ = writeln!(
            s,
            "input tokens/s     {:>9.0} per die, {:.0} per package (card)",
            t.input_tok_s_per_die, t.input_tok_s_per_package
        );
    }
    let _ = writeln!(s);
    let share = |v: f64| 100.0 * v / e.serial_step_ms;
    let _ = writeln!(s, "{:<16} {:>10} {:>7}", "by op class", "ms", "share");
    for (k, v) in &e.by_class_ms {
        let _ = writeln!(s, "{:<16} {:>10.3} {:>6.1}%", k, v, share(*v));
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "{:<16} {:>10} {:>7}", "by layer type", "ms", "share");
    for (k, v) in &e.by_layer_ms {
        let _ = writeln!(s, "{:<16} {:>10.3} {:>6.1}%", k, v, share(*v));
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "{:<16} {:>10} {:>7}", "bound by", "ms", "share");
    for (k, v) in &e.by_bound_ms {
        let _ = writeln!(s, "{:<16} {:>10.3} {:>6.1}%", k, v, share(*v));
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<18} {:<10} {:<15} {:>6} {:>10} {:>10} {:<13}",
        "op", "layer", "dies", "x", "us each", "ms total", "bound"
    );
    for o in &e.step.ops {
        let dies = match o.dies {
            dstwin_engine::opgraph::DieSet::All => "all",
            dstwin_engine::opgraph::DieSet::RoutedExperts => "routed experts",
            dstwin_engine::opgraph::DieSet::SharedExperts => "shared experts",
        };
        let _ = writeln!(
            s,
            "{:<18} {:<10} {:<15} {:>6} {:>10.2} {:>10.3} {:<13}",
            o.name,
            o.layer.name(),
            dies,
            o.repeat,
            o.time_s * 1e6,
            o.total_s * 1e3,
            o.bound.name()
        );
    }
    let m = &e.memory;
    let _ = writeln!(s);
    let _ = writeln!(s, "memory per die ({} HBM)", gb(m.hbm));
    for (k, v) in [
        ("runtime reserve", m.reserved),
        ("attention weights", m.attention_weights),
        ("dense FFN weights", m.dense_ffn_weights),
        ("embedding + LM head", m.embedding_weights),
        ("routed experts", m.routed_expert_weights),
        ("shared expert", m.shared_expert_weights),
        ("routers, norms, other", m.other_weights),
        ("workspace", m.workspace),
        ("KV cache", m.kv_cache),
    ] {
        let _ = writeln!(s, "  {:<22} {:>10}", k, gb(v));
    }
    let _ = writeln!(
        s,
        "  KV capacity            {} tokens ({:.1} KB per token)",
        m.kv_capacity_tokens,
        m.kv_bytes_per_token / 1e3
    );
    s
}
