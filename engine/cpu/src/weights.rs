//! HF-layout safetensors checkpoints: one `model.safetensors`, or shards listed by
//! `model.safetensors.index.json`. Tensors are taken by name with their expected shape (each
//! dim named by the config.json field it comes from), converted to the compute dtype, and
//! every tensor of the checkpoint must be taken: a leftover means config.json and the weights
//! disagree.

use crate::error::LoadError;
use candle_core::{DType, Device, Tensor};
use safetensors::{Dtype, SafeTensors};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// One expected dimension: its size and the config.json field (or expression) it comes from.
pub type Dim = (usize, &'static str);

/// Where one tensor's bytes are.
struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte range in the file (the header's offsets plus the header).
    start: usize,
    end: usize,
}

/// The tensors of a checkpoint, read into memory (headers parsed once).
pub struct Checkpoint {
    files: Vec<Vec<u8>>,
    index: BTreeMap<String, Entry>,
    taken: BTreeSet<String>,
    /// Rows x columns of weight each FP8 block scale covers (config.json's
    /// `quantization_config.weight_block_size`; DeepSeek's checkpoints: 128 x 128).
    fp8_block: (usize, usize),
}

fn io(path: &Path, e: std::io::Error) -> LoadError {
    let path = path.display().to_string();
    if e.kind() == std::io::ErrorKind::NotFound {
        return LoadError::Missing { path };
    }
    LoadError::Io {
        path,
        message: e.to_string(),
    }
}

impl Checkpoint {
    /// Reads `dir/model.safetensors.index.json` and its shards, or `dir/model.safetensors`.
    pub fn open(dir: &Path) -> Result<Checkpoint, LoadError> {
        let index_path = dir.join("model.safetensors.index.json");
        // The index's tensor -> shard map, checked against what the shards hold.
        let mut weight_map: BTreeMap<String, String> = BTreeMap::new();
        let indexed = index_path.exists();
        let names: Vec<String> = if indexed {
            let text = std::fs::read_to_string(&index_path).map_err(|e| io(&index_path, e))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| LoadError::Index(e.to_string()))?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| LoadError::Index("no 'weight_map' object".into()))?;
            let mut files = BTreeSet::new();
            for (tensor, f) in map {
                let f = f.as_str().ok_or_else(|| {
                    LoadError::Index(format!("weight_map['{tensor}'] is not a file name"))
                })?;
                if f.contains('/') || f.contains('\\') || f.starts_with('.') {
                    return Err(LoadError::Index(format!(
                        "weight_map['{tensor}'] = '{f}': shards must be files beside the index"
                    )));
                }
                files.insert(f.to_string());
                weight_map.insert(tensor.clone(), f.to_string());
            }
            files.into_iter().collect()
        } else {
            vec!["model.safetensors".to_string()]
        };
        let mut files = Vec::with_capacity(names.len());
        let mut index = BTreeMap::new();
        for (i, name) in names.into_iter().enumerate() {
            let path = dir.join(&name);
            let bytes = std::fs::read(&path).map_err(|e| io(&path, e))?;
            let bad = |message: String| LoadError::Safetensors {
                file: name.clone(),
                message,
            };
            // Validates the header and every tensor's offsets against the file.
            SafeTensors::deserialize(&bytes).map_err(|e| bad(e.to_string()))?;
            let (header, meta) =
                SafeTensors::read_metadata(&bytes).map_err(|e| bad(e.to_string()))?;
            for (t, info) in meta.tensors() {
                if index.contains_key(&t) {
                    return Err(LoadError::Index(format!(
                        "tensor '{t}' is in two shards (the second: {name})"
                    )));
                }
                if indexed && weight_map.get(&t) != Some(&name) {
                    return Err(LoadError::Index(match weight_map.get(&t) {
                        Some(f) => format!("weight_map['{t}'] = '{f}', but {name} holds it"),
                        None => format!("{name} holds '{t}', which weight_map does not list"),
                    }));
                }
                index.insert(
                    t,
                    Entry {
                        file: i,
                        dtype: info.dtype,
                        shape: info.shape.clone(),
                        start: 8 + header + info.data_offsets.0,
                        end: 8 + header + info.data_offsets.1,
                    },
                );
            }
            files.push(bytes);
        }
        if let Some((t, f)) = weight_map.iter().find(|(t, _)| !index.contains_key(*t)) {
            return Err(LoadError::Index(format!(
                "weight_map['{t}'] = '{f}', which does not hold it"
            )));
        }
        Ok(Checkpoint {
            files,
            index,
            taken: BTreeSet::new(),
            fp8_block: (128, 128),
        })
    }

    /// The block an FP8 weight's scale covers (config.json's `weight_block_size`).
    pub fn set_fp8_block(&mut self, rows: usize, cols: usize) {
        self.fp8_block = (rows.max(1), cols.max(1));
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// Takes tensor `name`, checks it against `dims`, returns it in `dtype`. `because` says
    /// which part of config.json needs it (for the missing-tensor error).
    pub fn take(
        &mut self,
        name: &str,
        dims: &[Dim],
        dtype: DType,
        because: &str,
    ) -> Result<Tensor, LoadError> {
        let entry = self
            .index
            .get(name)
            .ok_or_else(|| LoadError::MissingTensor {
                tensor: name.to_string(),
                because: because.to_string(),
            })?;
        let shape = entry.shape.clone();
        let want: Vec<usize> = dims.iter().map(|d| d.0).collect();
        if shape != want {
            return Err(LoadError::Shape {
                tensor: name.to_string(),
                found: shape,
                expected: format!("{want:?}"),
                fields: dims
                    .iter()
                    .map(|(v, f)| format!("{f} = {v}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        let data = &self.files[entry.file][entry.start..entry.end];
        let mut scale_taken = None;
        let values: Vec<f32> = match entry.dtype {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::BF16 => data
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::F16 => data
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            // DeepSeek's FP8 checkpoints: e4m3 values, each block of the weight times its
            // `weight_scale_inv` entry; dequantized here to the compute dtype.
            Dtype::F8_E4M3 => {
                let (values, scale) = self.dequantize_fp8(name, &shape, data)?;
                scale_taken = Some(scale);
                values
            }
            other => {
                return Err(LoadError::Dtype {
                    tensor: name.to_string(),
                    dtype: format!("{other:?}"),
                })
            }
        };
        self.taken.insert(name.to_string());
        self.taken.extend(scale_taken);
        Ok(Tensor::from_vec(values, shape, &Device::Cpu)?.to_dtype(dtype)?)
    }

    /// FP8 e4m3 `data` of weight `name` (2-D, `shape`) times its block scales
    /// (`{name}_scale_inv`, one per `fp8_block` of the weight, as DeepSeek's checkpoints hold
    /// them), as f32, with the scale tensor's name.
    fn dequantize_fp8(
        &self,
        name: &str,
        shape: &[usize],
        data: &[u8],
    ) -> Result<(Vec<f32>, String), LoadError> {
        let scale_name = format!("{name}_scale_inv");
        let [rows, cols] = shape else {
            return Err(LoadError::Dtype {
                tensor: name.to_string(),
                dtype: format!(
                    "F8_E4M3 of {} dims (block scales are for 2-D weights)",
                    shape.len()
                ),
            });
        };
        let (br, bc) = self.fp8_block;
        let want = [rows.div_ceil(br), cols.div_ceil(bc)];
        let Some(s) = self.index.get(&scale_name) else {
            return Err(LoadError::MissingTensor {
                tensor: scale_name,
                because: format!("the FP8 weight {name} (its block scales)"),
            });
        };
        if s.shape != want || s.dtype != Dtype::F32 && s.dtype != Dtype::BF16 {
            return Err(LoadError::Shape {
                tensor: scale_name,
                found: s.shape.clone(),
                expected: format!("{want:?} of F32 or BF16 (found {:?})", s.dtype),
                fields: format!(
                    "quantization_config.weight_block_size = [{br}, {bc}] over {name} [{rows}, {cols}]"
                ),
            });
        }
        let sd = &self.files[s.file][s.start..s.end];
        let scale: Vec<f32> = match s.dtype {
            Dtype::F32 => sd
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            _ => sd
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
        };
        if let Some(i) = data.iter().position(|&b| b & 0x7F == 0x7F) {
            return Err(LoadError::Dtype {
                tensor: name.to_string(),
                dtype: format!("F8_E4M3 holding NaN (byte {i})"),
            });
        }
        let table = e4m3_table();
        let per_row = want[1];
        let values = data
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                let (r, c) = (i / cols, i % cols);
                table[b as usize] * scale[(r / br) * per_row + c / bc]
            })
            .collect();
        Ok((values, scale_name))
    }

    /// Whether any tensor's name starts with `prefix`.
    pub fn has_prefix(&self, prefix: &str) -> bool {
        self.index
            .range(prefix.to_string()..)
            .next()
            .is_some_and(|(k, _)| k.starts_with(prefix))
    }

    /// Fails on the first tensor no part of the model took, but those `ignored` says HF
    /// ignores too.
    pub fn finish(self, ignored: impl Fn(&str) -> bool) -> Result<(), LoadError> {
        match self
            .index
            .keys()
            .find(|k| !self.taken.contains(*k) && !ignored(k))
        {
            Some(t) => Err(LoadError::Unexpected { tensor: t.clone() }),
            None => Ok(()),
        }
    }
}

/// Every FP8 e4m3 (OCP "e4m3fn": 4 exponent bits, bias 7, 3 mantissa bits, no infinities,
/// 0x7F and 0xFF NaN) byte's value.
fn e4m3_table() -> [f32; 256] {
    let mut t = [0.0f32; 256];
    for (b, v) in t.iter_mut().enumerate() {
        let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = ((b >> 3) & 0xF) as i32;
        let m = (b & 0x7) as f32;
        *v = if e == 0xF && m == 7.0 {
            f32::NAN
        } else if e == 0 {
            sign * m / 8.0 * 2f32.powi(-6)
        } else {
            sign * (1.0 + m / 8.0) * 2f32.powi(e - 7)
        };
    }
    t
}

#[cfg(test)]
mod tests {
    #[test]
    fn e4m3_decodes_as_the_format_says() {
        let t = super::e4m3_table();
        // 0x7E is the largest finite value, 448; 0x08 the smallest normal, 2^-6; 0x01 the
        // smallest subnormal, 2^-9; 0x38 is 1.0; the sign bit negates.
        assert_eq!(
            (t[0x7E], t[0x08], t[0x01], t[0x38]),
            (448.0, 2f32.powi(-6), 2f32.powi(-9), 1.0)
        );
        assert_eq!((t[0xB8], t[0x00], t[0x80]), (-1.0, 0.0, -0.0));
        assert!(t[0x7F].is_nan() && t[0xFF].is_nan());
    }
}
