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
        })
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
            other => {
                return Err(LoadError::Dtype {
                    tensor: name.to_string(),
                    dtype: format!("{other:?}"),
                })
            }
        };
        self.taken.insert(name.to_string());
        Ok(Tensor::from_vec(values, shape, &Device::Cpu)?.to_dtype(dtype)?)
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
