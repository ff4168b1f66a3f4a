//! DeepSeek-V4's fused kernels (the mHC `hc_pre` / `hc_post` and the KV compressors) against
//! their published microbenchmarks (`[[kernel]]` blocks of `data/microbenchmarks.toml`): the fit
//! of a cost file's `[[kernel]]` entries and the residuals of any parameter set.
//!
//! Each point is one call of a kernel at a shape (sequences, tokens each, and for a compressor
//! the position of the first token, which says how many windows the call completes). The op
//! graph turns it into the ops it is made of (`opgraph::kernel_ops`: a compressor's projection,
//! plus its pooling when windows complete), so a point is priced by the same formulas as a step.
//! Each op has a cost-file entry with a fixed cost per call and the efficiency of the resource
//! that binds it; a point's time is the sum over its ops of `fixed + work at peak / efficiency`,
//! linear in `(fixed, 1 / efficiency)` per entry. The fit is least squares over relative errors
//! with every fixed cost >= 0 and every efficiency <= 1.

use crate::lsq::bounded_lstsq;
use crate::microbench::{MicroError, MicroResidual};
use dstwin_core::model::{builtin, ModelConfig};
use dstwin_core::opgraph::{kernel_compressor, kernel_ops};
use dstwin_hwmodels::{Catalog, CostModel, KernelParams, Resource, Work};
use serde::{Deserialize, Serialize};

fn one() -> u64 {
    1
}

/// Most sequences, and most tokens per sequence, a point may have (products stay exact in f64).
const MAX_SIZE: u64 = 1 << 24;
/// Latest start position a point may have.
const MAX_POSITION: u64 = 1 << 40;

/// One timed call of a kernel.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelPoint {
    /// The kernel: `hc_pre`, `hc_post`, `hc_head` or a compressor (`c4li`, `c4a`, `c128a`).
    pub op: String,
    /// Sequences in the call.
    #[serde(default = "one")]
    pub batch: u64,
    /// Tokens of each sequence.
    #[serde(default = "one")]
    pub tokens: u64,
    /// Compressors: position of each sequence's first token; a window of `ratio` tokens
    /// completes at every position p with (p + 1) a multiple of `ratio`.
    #[serde(default)]
    pub start_pos: Option<u64>,
    pub us: f64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelBlock {
    pub id: String,
    pub source: String,
    /// The system whose chip ran the kernels (its cost model prices them).
    pub system: String,
    /// The model whose sizes the kernels were timed at.
    pub model: String,
    pub bound: f64,
    pub points: Vec<KernelPoint>,
}

impl KernelPoint {
    /// Compression windows the call completes over all its sequences.
    fn entries(&self, m: &ModelConfig) -> u64 {
        match (kernel_compressor(m, &self.op), self.start_pos) {
            // Positions p + 1 in (start, start + tokens] that are multiples of the ratio.
            (Some(c), Some(start)) => {
                ((start + self.tokens) / c.ratio - start / c.ratio) * self.batch
            }
            _ => 0,
        }
    }

    /// The ops the call runs, with their work.
    fn ops(&self, m: &ModelConfig) -> Vec<(&'static str, Work)> {
        let tokens = (self.batch * self.tokens) as f64;
        kernel_ops(m, &self.op, tokens, self.entries(m) as f64)
            .expect("checked by check(): the model has the kernel")
    }

    fn label(&self) -> String {
        match self.start_pos {
            Some(p) => format!("{}_us {}x{} from {p}", self.op, self.batch, self.tokens),
            None => format!("{}_us {} tokens", self.op, self.batch * self.tokens),
        }
    }
}

/// Checks a block: known system and model, a positive bound, and every point a kernel of the
/// model with positive sizes and time, compressors with their start position.
pub fn check(b: &KernelBlock) -> Result<(), MicroError> {
    let bad = |message: String| MicroError::Block {
        id: b.id.clone(),
        message,
    };
    Catalog::builtin()
        .system(&b.system)
        .map_err(|e| bad(format!("system = {:?}: {e}", b.system)))?;
    let m = model_of(b)?;
    if !(b.bound.is_finite() && b.bound > 0.0) {
        return Err(bad(format!(
            "bound = {}: must be a positive fraction",
            b.bound
        )));
    }
    for p in &b.points {
        if kernel_ops(&m, &p.op, 1.0, 0.0).is_none() {
            return Err(bad(format!(
                "op = {:?}: not a kernel of {} (known: hc_pre, hc_post, hc_head, c4li, c4a, c128a)",
                p.op, b.model
            )));
        }
        for (field, v, max) in [
            ("batch", p.batch, MAX_SIZE),
            ("tokens", p.tokens, MAX_SIZE),
            ("start_pos", p.start_pos.unwrap_or(0), MAX_POSITION),
        ] {
            if (field != "start_pos" && v == 0) || v > max {
                return Err(bad(format!(
                    "{}: {field} = {v}: must be in [{}, {max}]",
                    p.op,
                    u64::from(field != "start_pos")
                )));
            }
        }
        if !(p.us.is_finite() && p.us > 0.0) {
            return Err(bad(format!("{}: us = {}: must be positive", p.op, p.us)));
        }
        let compressor = kernel_compressor(&m, &p.op).is_some();
        if compressor != p.start_pos.is_some() {
            return Err(bad(format!(
                "{}: start_pos {}",
                p.op,
                if compressor {
                    "is needed (it says which windows the call completes)"
                } else {
                    "applies to compressors only"
                }
            )));
        }
    }
    Ok(())
}

fn model_of(b: &KernelBlock) -> Result<ModelConfig, MicroError> {
    builtin(&b.model).ok_or_else(|| MicroError::Block {
        id: b.id.clone(),
        message: format!("model = {:?}: not a built-in model", b.model),
    })
}

fn cost_model_of(b: &KernelBlock) -> Result<CostModel, MicroError> {
    let bad = |e: dstwin_hwmodels::HwError| MicroError::Block {
        id: b.id.clone(),
        message: e.to_string(),
    };
    let cat = Catalog::builtin();
    let s = cat.system(&b.system).map_err(bad)?;
    cat.cost_model(s, None).map_err(bad)
}

/// The fitted `[[kernel]]` entries of one cost model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelFit {
    pub cost_model: String,
    /// Every entry of the cost file, those with points refitted.
    pub entries: Vec<KernelParams>,
}

impl KernelFit {
    /// `cm` with these entries.
    pub fn apply(&self, cm: &CostModel) -> CostModel {
        let mut p = cm.params.clone();
        p.kernel = self.entries.clone();
        CostModel::new(cm.system.clone(), p)
    }

    /// The lines to paste into the cost file (sources stay as written there).
    pub fn toml(&self) -> String {
        self.entries
            .iter()
            .map(|k| {
                // Four significant figures: an efficiency can be far under 1 (hc_pre's).
                let digits = (3 - k.efficiency.log10().floor() as i32).max(0) as usize;
                format!(
                    "[[kernel]]\nops = {:?}\nbound = \"{}\"\nfixed_us = {:.2}\nefficiency = {:.digits$}",
                    k.ops,
                    k.bound.name(),
                    k.fixed_us,
                    k.efficiency
                )
            })
            .collect::<Vec<_>>()
            .join("\n\n")
    }
}

/// Seconds of `w` at 100% of the resource `r` on `cm`'s chip.
fn at_peak(cm: &CostModel, r: Resource, w: &Work) -> f64 {
    match r {
        Resource::Compute => w.flops / cm.peak_flops(w.dtype),
        Resource::Memory => w.bytes / cm.system.chip.hbm_bytes_per_s(),
    }
}

/// Fits the kernel entries of every cost model the blocks run on.
pub fn fit(blocks: &[KernelBlock]) -> Result<Vec<KernelFit>, MicroError> {
    let mut fits: Vec<KernelFit> = Vec::new();
    let mut models: Vec<CostModel> = Vec::new();
    for b in blocks {
        let cm = cost_model_of(b)?;
        if !models.iter().any(|c| c.params.name == cm.params.name) {
            models.push(cm);
        }
    }
    for cm in models {
        let entries = &cm.params.kernel;
        // Columns: per entry, its fixed cost (µs) and 1 / efficiency.
        let n = 2 * entries.len();
        let mut rows: Vec<(Vec<f64>, f64)> = Vec::new();
        let mut used = vec![false; entries.len()];
        for b in blocks {
            if cost_model_of(b)?.params.name != cm.params.name {
                continue;
            }
            let m = model_of(b)?;
            for p in &b.points {
                let mut x = vec![0.0; n];
                for (op, w) in p.ops(&m) {
                    let e = entries
                        .iter()
                        .position(|k| k.ops.iter().any(|o| o == op))
                        .ok_or_else(|| MicroError::Block {
                            id: b.id.clone(),
                            message: format!(
                                "op {op}: cost model {} has no [[kernel]] entry for it",
                                cm.params.name
                            ),
                        })?;
                    used[e] = true;
                    x[2 * e] += 1.0 / p.us;
                    x[2 * e + 1] += at_peak(&cm, entries[e].bound, &w) * 1e6 / p.us;
                }
                rows.push((x, 1.0));
            }
        }
        // Entries without points keep their values: both columns held there.
        let mut lo = vec![0.0; n];
        let mut hi = vec![f64::INFINITY; n];
        for (e, k) in entries.iter().enumerate() {
            lo[2 * e + 1] = 1.0;
            if !used[e] {
                (lo[2 * e], hi[2 * e]) = (k.fixed_us, k.fixed_us);
                (lo[2 * e + 1], hi[2 * e + 1]) = (1.0 / k.efficiency, 1.0 / k.efficiency);
            }
        }
        let x = bounded_lstsq(&rows, &lo, &hi)
            .ok_or_else(|| MicroError::TooFew(cm.params.name.clone()))?;
        fits.push(KernelFit {
            cost_model: cm.params.name.clone(),
            entries: entries
                .iter()
                .enumerate()
                .map(|(e, k)| KernelParams {
                    fixed_us: x[2 * e],
                    efficiency: 1.0 / x[2 * e + 1],
                    ..k.clone()
                })
                .collect(),
        });
    }
    Ok(fits)
}

/// Every point against its shipped cost model, or against `fits` where one covers it: the
/// kernel's ops priced as a step prices them.
pub fn residuals(
    blocks: &[KernelBlock],
    fits: &[KernelFit],
) -> Result<Vec<MicroResidual>, MicroError> {
    let mut out = Vec::new();
    for b in blocks {
        let shipped = cost_model_of(b)?;
        let cm = match fits.iter().find(|f| f.cost_model == shipped.params.name) {
            Some(f) => f.apply(&shipped),
            None => shipped,
        };
        let m = model_of(b)?;
        for p in &b.points {
            let predicted: f64 = p
                .ops(&m)
                .iter()
                .map(|(op, w)| cm.compute_op(op, w).time_s * 1e6)
                .sum();
            out.push(MicroResidual {
                id: b.id.clone(),
                metric: p.label(),
                published: p.us,
                predicted,
                error: predicted / p.us - 1.0,
                bound: b.bound,
            });
        }
    }
    Ok(out)
}
