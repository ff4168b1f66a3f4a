//! The model catalog: architectures, quantization, parameter counts and KV-cache sizes.
//!
//! - [`config`]: `ModelConfig`, the built-in DeepSeek presets, `config.json` loading.
//! - [`quant`]: quantization schemes and the format of each weight group.
//! - [`params`]: parameter counts by group, total and active.
//! - [`kv`]: KV-cache bytes per token per layer.

pub mod config;
pub mod kv;
pub mod params;
pub mod quant;

pub use config::{
    builtin, Attention, Compressor, ConfigError, Family, Indexer, ModelConfig, BUILTIN_MODELS,
};
pub use kv::{
    dcp_bytes_per_token, index_key_bytes, index_key_dtype, kv_bytes, layer_bytes_per_token, KvBytes,
};
pub use params::{active, count, ParamCounts};
pub use quant::{Quant, QUANTS};
