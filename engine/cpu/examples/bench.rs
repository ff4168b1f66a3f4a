//! Prefill and decode throughput of the CPU engine on a checkpoint, batch by batch, as JSON
//! lines: `cargo run --release -p dstwin-cpu --example bench -- DIR [BATCH...] [--profile FILE]`.
//! Each batch size B: B prompts of 128 tokens in one forward (prefill tokens/s), then 32 decode
//! steps of all B sequences (decode tokens/s), greedy, f32. Each rate is given twice: per
//! second of wall time (`*_tok_s`) and per second of the process's CPU time (`*_cpu_tok_s`,
//! user and system, all threads), which other processes on a shared machine disturb less. The
//! same measurement with HF transformers eager on the same weights:
//! `engine/cpu/benches/hf_eager.py DIR [BATCH...]`.
//! `--profile FILE` also writes the op trace of every forward (docs/cpu-engine.md, "Profiling";
//! one step per forward, batch B as instance B), which slows the run slightly.

use dstwin_cpu::ep::ExpertRanks;
use dstwin_cpu::{
    AttnPath, DType, Device, Model, PagedKvCache, Profiler, RankBatch, SeqInput, TraceSink,
};
use std::time::Instant;

/// One forward of `seqs` on one rank holding every expert, traced into `prof`.
fn forward(
    m: &Model,
    experts: &ExpertRanks,
    cache: &mut PagedKvCache,
    seqs: &[SeqInput],
    prof: &mut Profiler,
) -> Vec<u32> {
    let s = prof.begin();
    let mut b = [RankBatch {
        rank: 0,
        cache,
        seqs,
    }];
    let f = m
        .forward_ranks(&mut b, experts, AttnPath::Auto, prof)
        .expect("forward");
    let next = dstwin_cpu::ops::argmax_rows(&f.ranks[0].logits).expect("argmax");
    prof.end_step(s, || dstwin_cpu::args! {"seqs": seqs.len()});
    next
}

/// CPU time this process has used so far, all threads.
fn cpu_time() -> std::time::Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to write.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
    std::time::Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

const PROMPT: usize = 128;
const DECODE: usize = 32;
const BS: usize = 16;

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let trace = match args.iter().position(|a| a == "--profile") {
        Some(i) if i + 1 < args.len() => {
            let path = args.remove(i + 1);
            args.remove(i);
            Some(TraceSink::create(std::path::Path::new(&path)).expect("--profile FILE"))
        }
        Some(_) => {
            eprintln!("--profile needs a FILE");
            std::process::exit(2);
        }
        None => None,
    };
    let Some(dir) = args.first() else {
        eprintln!("usage: bench DIR [BATCH...] [--profile FILE]");
        std::process::exit(2);
    };
    let batches: Vec<usize> = if args.len() > 1 {
        args[1..]
            .iter()
            .map(|b| b.parse().expect("batch size"))
            .collect()
    } else {
        vec![1, 4, 16]
    };
    let m = Model::load(std::path::Path::new(dir), DType::F32, &Device::Cpu).expect("model");
    let experts = ExpertRanks::local(&m).expect("experts");
    let vocab = dstwin_core::opgraph::vocabulary(&m.cfg.model, 1, 0);
    let per_seq = (PROMPT + DECODE).div_ceil(BS);
    for &b in &batches {
        let mut prof = match &trace {
            Some(t) => Profiler::new(t.clone(), b as u32, &format!("batch {b}"), 1, vocab.clone()),
            None => Profiler::off(),
        };
        let mut cache =
            PagedKvCache::new(&m.cfg, per_seq * b, BS, m.dtype, &Device::Cpu).expect("cache");
        let tables: Vec<Vec<u32>> = (0..b)
            .map(|i| ((i * per_seq) as u32..((i + 1) * per_seq) as u32).collect())
            .collect();
        let prompts: Vec<Vec<u32>> = (0..b)
            .map(|i| {
                (0..PROMPT)
                    .map(|p| 2 + ((p * 31 + i * 7) % 300) as u32)
                    .collect()
            })
            .collect();
        let seqs: Vec<SeqInput> = (0..b)
            .map(|i| SeqInput {
                blocks: &tables[i],
                computed: 0,
                tokens: &prompts[i],
                logits: 1,
            })
            .collect();
        let (t, c) = (Instant::now(), cpu_time());
        let mut next = forward(&m, &experts, &mut cache, &seqs, &mut prof);
        let prefill_s = t.elapsed().as_secs_f64();
        let prefill_cpu_s = (cpu_time() - c).as_secs_f64();
        let (t, c) = (Instant::now(), cpu_time());
        for step in 0..DECODE {
            let toks: Vec<[u32; 1]> = next.iter().map(|&x| [x]).collect();
            let seqs: Vec<SeqInput> = (0..b)
                .map(|i| SeqInput {
                    blocks: &tables[i],
                    computed: PROMPT + step,
                    tokens: &toks[i],
                    logits: 1,
                })
                .collect();
            next = forward(&m, &experts, &mut cache, &seqs, &mut prof);
        }
        let decode_s = t.elapsed().as_secs_f64();
        let decode_cpu_s = (cpu_time() - c).as_secs_f64();
        let rate = |tokens: usize, s: f64| (tokens as f64 / s * 10.0).round() / 10.0;
        println!(
            "{}",
            serde_json::json!({
                "engine": "dstwin-cpu",
                "batch": b,
                "prefill_tok_s": rate(b * PROMPT, prefill_s),
                "decode_tok_s": rate(b * DECODE, decode_s),
                "prefill_cpu_tok_s": rate(b * PROMPT, prefill_cpu_s),
                "decode_cpu_tok_s": rate(b * DECODE, decode_cpu_s),
            })
        );
    }
    if let Some(t) = &trace {
        t.flush();
        if let Some(e) = t.error() {
            eprintln!("--profile: the trace stopped at a write error: {e}");
        }
    }
}
