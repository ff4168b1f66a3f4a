//! The expert heat-map file: tokens routed to each expert of each MoE layer, per window of steps.
//! The engine will record it from real routers; the twin replays it; `dstwin eplb` reads it.
//!
//! ```json
//! { "format": "dstwin-expert-load/1", "experts": 256,
//!   "windows": [ { "start_step": 0, "steps": 600, "counts": [[12, 0, 7, ...], ...] } ] }
//! ```
//! `counts[layer][expert]`: tokens routed in the window; every window has the same layers.

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub const FORMAT: &str = "dstwin-expert-load/1";

/// One window of steps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeatWindow {
    pub start_step: u64,
    pub steps: u64,
    /// Tokens per layer per logical expert.
    pub counts: Vec<Vec<u64>>,
}

/// A heat map.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeatMap {
    pub format: String,
    pub experts: u32,
    pub windows: Vec<HeatWindow>,
}

#[derive(Debug, Error)]
pub enum HeatMapError {
    // Not `#[from]`: that also makes the JSON error the source, and error chains would print
    // its message twice.
    #[error("not a heat map: {0}")]
    Json(serde_json::Error),
    #[error("format = {0:?}: expected \"{FORMAT}\"")]
    Format(String),
    #[error("windows = []: a heat map needs at least one window")]
    Empty,
    #[error("windows[{window}].counts has {got} layers, windows[0] has {expected}")]
    Layers {
        window: usize,
        got: usize,
        expected: usize,
    },
    #[error("windows[{window}].counts[{layer}] has {got} experts, expected {expected}")]
    Experts {
        window: usize,
        layer: usize,
        got: usize,
        expected: u32,
    },
}

impl HeatMap {
    pub fn parse(text: &str) -> Result<HeatMap, HeatMapError> {
        let h: HeatMap = serde_json::from_str(text).map_err(HeatMapError::Json)?;
        if h.format != FORMAT {
            return Err(HeatMapError::Format(h.format));
        }
        let first = h.windows.first().ok_or(HeatMapError::Empty)?;
        let layers = first.counts.len();
        for (w, win) in h.windows.iter().enumerate() {
            if win.counts.len() != layers {
                return Err(HeatMapError::Layers {
                    window: w,
                    got: win.counts.len(),
                    expected: layers,
                });
            }
            if let Some((l, row)) = win
                .counts
                .iter()
                .enumerate()
                .find(|(_, r)| r.len() != h.experts as usize)
            {
                return Err(HeatMapError::Experts {
                    window: w,
                    layer: l,
                    got: row.len(),
                    expected: h.experts,
                });
            }
        }
        Ok(h)
    }

    /// Tokens per layer per expert over every window.
    pub fn total(&self) -> Vec<Vec<f64>> {
        let layers = self.windows[0].counts.len();
        let mut t = vec![vec![0.0; self.experts as usize]; layers];
        for w in &self.windows {
            for (row, counts) in t.iter_mut().zip(&w.counts) {
                for (x, c) in row.iter_mut().zip(counts) {
                    *x += *c as f64;
                }
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_add_up_and_bad_shapes_are_named() {
        let h = HeatMap::parse(r#"{"format":"dstwin-expert-load/1","experts":2,"windows":[{"start_step":0,"steps":10,"counts":[[1,2]]},{"start_step":10,"steps":10,"counts":[[3,4]]}]}"#).unwrap();
        assert_eq!(h.total(), vec![vec![4.0, 6.0]]);
        let e = HeatMap::parse(r#"{"format":"dstwin-expert-load/1","experts":3,"windows":[{"start_step":0,"steps":1,"counts":[[1,2]]}]}"#).unwrap_err();
        assert!(
            e.to_string()
                .contains("windows[0].counts[0] has 2 experts, expected 3"),
            "{e}"
        );
        let e = HeatMap::parse(r#"{"format":"x","experts":1,"windows":[]}"#).unwrap_err();
        assert!(e.to_string().contains("format"), "{e}");
    }
}
