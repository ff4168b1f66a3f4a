//! Measures how fast the trace readers parse, and prints the workload's summary.
//!
//! ```text
//! cargo run --release -p dstwin-traces --example parse_speed [TRACE]
//! ```
//!
//! `TRACE` defaults to `../shared/traces/mooncake_conversation.jsonl` relative to the workspace
//! root; `.csv` files are read as Azure traces, anything else as Mooncake JSONL. The file is
//! read into memory first, so the numbers are parse speed, not disk speed.

use dstwin_traces::{azure, mooncake, TraceError, Workload};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Parses per measurement; the best run is reported, as the least disturbed by other work.
const RUNS: u32 = 10;

fn main() {
    let path = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../shared/traces/mooncake_conversation.jsonl")
        });
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => {
            println!("skipped: cannot read {} ({e})", path.display());
            return;
        }
    };
    let is_csv = path.extension().is_some_and(|e| e == "csv");
    let origin = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let parse = || -> Result<Workload, TraceError> {
        if is_csv {
            azure::from_reader(bytes.as_slice(), &origin)
        } else {
            mooncake::from_reader(bytes.as_slice(), &origin)
        }
    };

    let mut best = Duration::MAX;
    let mut total = Duration::ZERO;
    let mut workload = None;
    for _ in 0..RUNS {
        let start = Instant::now();
        let w = parse().unwrap_or_else(|e| panic!("{e}"));
        let took = start.elapsed();
        best = best.min(took);
        total += took;
        workload = Some(w);
    }
    let w = workload.expect("RUNS > 0");
    let secs = best.as_secs_f64();
    println!("{}: {} bytes, {} requests", origin, bytes.len(), w.len());
    println!(
        "best of {RUNS}: {:.2} ms ({:.0} requests/s, {:.0} MB/s); mean {:.2} ms",
        secs * 1e3,
        w.len() as f64 / secs,
        bytes.len() as f64 / secs / 1e6,
        total.as_secs_f64() * 1e3 / f64::from(RUNS),
    );
    print!("{}", w.stats());
}
