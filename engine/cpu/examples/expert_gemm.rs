//! Throughput of the routed experts' packed f32 GEMM ([`dstwin_cpu::gemm`]) against candle's
//! matmul at one shape, as GFLOP/s per trial:
//! `cargo run --release -p dstwin-cpu --example expert_gemm -- M N K`
//! (`M` rows times a `[N, K]` weight). Like the experts of a layer, each trial runs 64
//! distinct weights, so they stream from memory rather than sit in cache. The medium model's
//! batch-1 prefill shapes: `12 512 1024` (gate and up fused), `12 1024 256` (down).

use candle_core::{Device, Tensor};
use dstwin_cpu::gemm::PackedMatrix;
use std::time::Instant;

const WEIGHTS: usize = 64;
const TRIALS: usize = 5;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("M N K: integers"))
        .collect();
    let [m, n, k] = args[..] else {
        eprintln!("usage: expert_gemm M N K");
        std::process::exit(2);
    };
    let x: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 104_729) % 997) as f32 / 997.0 - 0.5)
        .collect();
    let dev = Device::Cpu;
    let tensors: Vec<Tensor> = (0..WEIGHTS)
        .map(|_| Tensor::from_vec(w.clone(), (n, k), &dev).expect("weight"))
        .collect();
    let packed: Vec<PackedMatrix> = (0..WEIGHTS).map(|_| PackedMatrix::pack(&w, n, k)).collect();
    let xt = Tensor::from_vec(x.clone(), (m, k), &dev).expect("rows");
    let rows: Vec<&[f32]> = x.chunks_exact(k).collect();
    let mut out = vec![0f32; m * n];
    let gflop = 2.0 * (m * n * k * WEIGHTS) as f64 / 1e9;
    for trial in 0..TRIALS {
        let t = Instant::now();
        for w in &tensors {
            xt.matmul(&w.t().expect("transpose")).expect("matmul");
        }
        let candle = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for p in &packed {
            p.matmul(&rows, &mut out);
        }
        let ours = t.elapsed().as_secs_f64();
        println!(
            "{}",
            serde_json::json!({"trial": trial, "m": m, "n": n, "k": k,
                "candle_gflop_s": (gflop / candle * 10.0).round() / 10.0,
                "packed_gflop_s": (gflop / ours * 10.0).round() / 10.0})
        );
    }
}
