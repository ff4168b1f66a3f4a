//! Prefill and decode throughput of the CPU engine on a checkpoint, batch by batch, as JSON
//! lines: `cargo run --release -p dstwin-cpu --example bench -- DIR [BATCH...]`.
//! Each batch size B: B prompts of 128 tokens in one forward (prefill tokens/s), then 32 decode
//! steps of all B sequences (decode tokens/s), greedy, f32. The same measurement with HF
//! transformers eager on the same weights: `engine/cpu/benches/hf_eager.py DIR [BATCH...]`.

use dstwin_cpu::{AttnPath, DType, Device, Model, PagedKvCache, SeqInput};
use std::time::Instant;

const PROMPT: usize = 128;
const DECODE: usize = 32;
const BS: usize = 16;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first() else {
        eprintln!("usage: bench DIR [BATCH...]");
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
    let per_seq = (PROMPT + DECODE).div_ceil(BS);
    for &b in &batches {
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
        let t = Instant::now();
        let f = m
            .forward(&mut cache, &seqs, AttnPath::Auto)
            .expect("prefill");
        let prefill_s = t.elapsed().as_secs_f64();
        let mut next = dstwin_cpu::ops::argmax_rows(&f.logits).expect("argmax");
        let t = Instant::now();
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
            let f = m
                .forward(&mut cache, &seqs, AttnPath::Auto)
                .expect("decode");
            next = dstwin_cpu::ops::argmax_rows(&f.logits).expect("argmax");
        }
        let decode_s = t.elapsed().as_secs_f64();
        println!(
            "{{\"engine\":\"dstwin-cpu\",\"batch\":{b},\"prefill_tok_s\":{:.1},\"decode_tok_s\":{:.1}}}",
            (b * PROMPT) as f64 / prefill_s,
            (b * DECODE) as f64 / decode_s
        );
    }
}
