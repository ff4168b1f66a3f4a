//! A real DeepSeek-V3 (V3, R1, V3.1) engine on CPU: real weights, real numerics.
//!
//! Modules:
//! - [`config`]: HF config.json -> [`EngineConfig`] (sizes through `dstwin_core`'s parser,
//!   plus norm, RoPE/YaRN, router and special-token fields);
//! - [`weights`]: HF safetensors checkpoints (single or sharded), shape checks naming fields;
//! - [`model`]: the model and its loading from a checkpoint;
//! - [`forward`]: the batched forward over paged sequences across the DP ranks of an
//!   instance (attention per rank, MoE across ranks), MTP;
//! - [`attention`]: MLA, prefill (up-projected) and absorbed (latent) paths;
//! - [`moe`]: DeepSeekMoE routing (`noaux_tc`), the checkpoint's expert table;
//! - [`gemm`]: the routed experts' f32 matmul on weights packed at load time (AVX2 + FMA or
//!   portable, bit-identical), gate and up fused;
//! - [`ep`]: expert parallelism: the routed experts spread over the ranks as the EPLB
//!   placement says, dispatch / experts / combine, EPLB weight moves;
//! - [`device`]: the engine as a dstwin `Device` (the scheduler's plans, sampling, MTP drafts)
//!   and the fabric that copies KV between instances;
//! - [`profile`]: the op trace (`--profile`), Chrome / Perfetto JSON;
//! - [`sampler`]: sampling and draft verification;
//! - [`cache`]: the paged latent KV pool;
//! - [`rope`]: RoPE with YaRN; [`linear`]: dense and W8A8 projections; [`ops`]: norms, softmax;
//! - [`init`] and [`tokenizer`]: deterministic random checkpoints and their tokenizer;
//! - [`error`]: [`LoadError`] and [`ModelError`].
//!
//! Tensors are candle's: the CPU backend today; another candle device (CUDA, Metal) would be a
//! cargo feature and a `Device` argument away, as [`Model::load`] already takes one.

#![recursion_limit = "256"]

pub mod attention;
pub mod cache;
pub mod config;
pub mod device;
pub mod ep;
pub mod error;
pub mod forward;
pub mod gemm;
pub mod init;
pub mod linear;
pub mod model;
pub mod moe;
pub mod ops;
pub mod profile;
pub mod rope;
pub mod sampler;
pub mod tokenizer;
pub mod weights;

pub use attention::AttnPath;
pub use cache::PagedKvCache;
pub use candle_core::{DType, Device, Tensor};
pub use config::EngineConfig;
pub use device::{CpuDevice, CpuDeviceConfig, CpuFabric};
pub use ep::ExpertRanks;
pub use error::{LoadError, ModelError};
pub use forward::RankBatch;
pub use init::init_weights;
pub use model::{Forward, Model, SeqInput};
pub use profile::{Profiler, TraceSink};
