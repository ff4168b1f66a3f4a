//! Benchmark: places 58 MoE layers x 256 experts onto 320 slots (EP320, one per die) and onto
//! 288 slots over 32 dies (EP32 with 32 redundant experts), from a skewed seeded load, with every
//! policy; prints milliseconds per full placement and the mean balancedness.
//!
//! cargo run --release -p dstwin-core --example eplb_bench

use dstwin_core::eplb::{place, EpLayout, Policy};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Instant;

fn main() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    // Zipf-like per layer: expert at rank r gets 1 / (r + 1)^0.8, ranks shuffled per layer.
    let load: Vec<Vec<f64>> = (0..58)
        .map(|_| {
            let mut v: Vec<f64> = (0..256).map(|r| 1e4 / ((r + 1) as f64).powf(0.8)).collect();
            for i in (1..v.len()).rev() {
                let j = rng.random_range(0..=i);
                v.swap(i, j);
            }
            v
        })
        .collect();
    let cases = [
        (
            "58 x 256 -> 320 slots on 320 dies",
            EpLayout {
                slots: 320,
                dies: 320,
                dies_per_node: 16,
                groups: 8,
            },
        ),
        (
            "58 x 256 -> 288 slots on 32 dies",
            EpLayout {
                slots: 288,
                dies: 32,
                dies_per_node: 16,
                groups: 8,
            },
        ),
    ];
    for (name, l) in cases {
        for policy in [
            Policy::Identity,
            Policy::Global,
            Policy::Greedy,
            Policy::Hierarchical,
        ] {
            let reps = 20;
            let start = Instant::now();
            let mut result = None;
            for _ in 0..reps {
                result = Some(place(policy, &load, &l));
            }
            let ms = start.elapsed().as_secs_f64() * 1e3 / reps as f64;
            match result.expect("ran") {
                Ok(p) => {
                    let b = p.balancedness(&load);
                    println!(
                        "{name}: {policy:?}: {ms:.2} ms per placement, mean balancedness {:.3}",
                        b.iter().sum::<f64>() / b.len() as f64
                    );
                }
                Err(e) => println!("{name}: {policy:?}: {e}"),
            }
        }
    }
}
