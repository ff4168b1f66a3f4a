//! The tiny model, generated once per test process from its seed (weights are not committed).

use dstwin_cpu::{AttnPath, DType, Device, Model, PagedKvCache, SeqInput, Tensor};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub const SEED: u64 = 1;
pub const BLOCK_SIZE: usize = 16;
pub const NUM_BLOCKS: usize = 64;

/// A fresh directory under the system temp dir, unique to this process and `tag`.
pub fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dstwin-cpu-test-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// `init-weights --preset tiny --seed 1`, written once per test process. A process cannot
/// remove it when it ends (statics are not dropped): each removes those that ended processes
/// left ([`remove_stale`]).
pub fn tiny_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        remove_stale("tiny");
        let d = temp_dir("tiny");
        let cfg = dstwin_cpu::init::preset_config("tiny").unwrap();
        dstwin_cpu::init_weights(&cfg, SEED, &d).expect("init-weights");
        d
    })
}

/// Removes the directories [`temp_dir`] made for `tag` in test processes that have ended: on
/// Linux, with `/proc` mounted, where a process id without an entry has ended (in this PID
/// namespace), and only directories untouched for an hour (a test process sharing the
/// temporary directory from another namespace is not that old).
fn remove_stale(tag: &str) {
    const STALE: std::time::Duration = std::time::Duration::from_secs(3600);
    if !cfg!(target_os = "linux") || !Path::new("/proc/self").exists() {
        return;
    }
    let (prefix, suffix) = ("dstwin-cpu-test-", format!("-{tag}"));
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix)?.strip_suffix(suffix.as_str()))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE);
        if old && pid != std::process::id() && !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

pub fn tiny(dtype: DType) -> &'static Model {
    static F32: OnceLock<Model> = OnceLock::new();
    static BF16: OnceLock<Model> = OnceLock::new();
    let cell = if dtype == DType::F32 { &F32 } else { &BF16 };
    cell.get_or_init(|| Model::load(tiny_dir(), dtype, &Device::Cpu).expect("tiny model loads"))
}

pub fn cache(model: &Model) -> PagedKvCache {
    PagedKvCache::new(
        &model.cfg,
        NUM_BLOCKS,
        BLOCK_SIZE,
        model.dtype,
        &Device::Cpu,
    )
    .unwrap()
}

/// Blocks `first..` enough for `len` tokens.
pub fn blocks(first: u32, len: usize) -> Vec<u32> {
    (first..first + len.div_ceil(BLOCK_SIZE) as u32).collect()
}

/// Logits of the last `rows` positions of a whole prompt run in one chunk.
pub fn prompt_logits(model: &Model, ids: &[u32], rows: usize, path: AttnPath) -> Vec<Vec<f32>> {
    let mut c = cache(model);
    let b = blocks(0, ids.len());
    let f = model
        .forward(
            &mut c,
            &[SeqInput {
                blocks: &b,
                computed: 0,
                tokens: ids,
                logits: rows,
            }],
            path,
        )
        .unwrap();
    f.logits.to_vec2().unwrap()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn max_abs(a: &[f32]) -> f32 {
    a.iter().map(|x| x.abs()).fold(0.0, f32::max)
}

#[allow(dead_code)]
pub fn rows(t: &Tensor) -> Vec<Vec<f32>> {
    t.to_vec2().unwrap()
}

/// A deterministic prompt of `n` tokens (BOS first).
pub fn prompt(n: usize, salt: u64) -> Vec<u32> {
    let mut x = 987654321u64 ^ salt;
    let mut ids = vec![0u32];
    while ids.len() < n {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ids.push(2 + ((x >> 33) % 300) as u32);
    }
    ids
}
