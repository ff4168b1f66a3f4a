//! Writes the tiny preset (or `--preset NAME`) with a seed into a directory, without building
//! the whole `dstwin` binary: `cargo run -p dstwin-cpu --example init_weights -- tiny 1 DIR`.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [preset, seed, out] = &args[..] else {
        eprintln!("usage: init_weights PRESET SEED DIR");
        std::process::exit(2);
    };
    let config = dstwin_cpu::init::preset_config(preset).unwrap_or_else(|| {
        eprintln!("unknown preset {preset}");
        std::process::exit(2)
    });
    let seed: u64 = seed.parse().unwrap_or_else(|_| {
        eprintln!("seed must be an integer");
        std::process::exit(2)
    });
    if let Err(e) = dstwin_cpu::init_weights(&config, seed, std::path::Path::new(out)) {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}
