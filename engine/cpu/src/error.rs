//! Errors of loading a checkpoint and of running the model.

use thiserror::Error;

/// Why a model directory could not be loaded. Each variant names the file, field or tensor at
/// fault so that the checkpoint or its config.json can be fixed.
#[derive(Debug, Error)]
pub enum LoadError {
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    /// A file the checkpoint needs is not there: the user's input, not the machine's fault.
    #[error("{path}: no such file (a checkpoint directory holds config.json and model.safetensors, or an index and its shards)")]
    Missing { path: String },
    /// The shared parser's message already names config.json and the field.
    #[error(transparent)]
    Config(#[from] dstwin_core::model::config::ConfigError),
    #[error("config.json: architectures {found:?}, model_type '{model_type}': the CPU engine runs DeepseekV3ForCausalLM (model_type deepseek_v3: V3, R1, V3.1) only")]
    Architecture {
        found: Vec<String>,
        model_type: String,
    },
    #[error("config.json: {field} = {value}: {reason}")]
    Unsupported {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("{file}: not a safetensors file: {message}")]
    Safetensors { file: String, message: String },
    #[error("weights: tensor '{tensor}' is missing (config.json expects it: {because})")]
    MissingTensor { tensor: String, because: String },
    #[error("weights: tensor '{tensor}' has shape {found:?}, but config.json implies {expected} ({fields})")]
    Shape {
        tensor: String,
        found: Vec<usize>,
        expected: String,
        fields: String,
    },
    #[error("weights: tensor '{tensor}' has dtype {dtype}; supported: F32, BF16, F16, and F8_E4M3 weights with their block scales (`weight_scale_inv`), as DeepSeek's FP8 checkpoints hold them")]
    Dtype { tensor: String, dtype: String },
    #[error("weights: tensor '{tensor}' is not used by the model config.json describes (do num_hidden_layers, num_nextn_predict_layers, n_routed_experts or q_lora_rank disagree with the weights?)")]
    Unexpected { tensor: String },
    #[error("model.safetensors.index.json: {0}")]
    Index(String),
    #[error("tensor library: {0}")]
    Tensor(#[from] candle_core::Error),
}

/// Why a forward pass could not run: the caller handed inputs that do not fit the model or the
/// cache (a driver bug, reported rather than panicking).
#[derive(Debug, Error)]
pub enum ModelError {
    #[error("sequence {seq}: {message}")]
    Input { seq: usize, message: String },
    #[error("sequence {seq}: block table of {blocks} blocks holds {capacity} tokens, the sequence needs {needed}")]
    BlockTable {
        seq: usize,
        blocks: usize,
        capacity: usize,
        needed: usize,
    },
    #[error("block id {block} is outside the KV pool of {num_blocks} blocks")]
    BlockId { block: u32, num_blocks: usize },
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    Token { token: u32, vocab: usize },
    #[error("layer {layer}: expert {expert} is routed to but not in this expert table")]
    ExpertMissing { layer: usize, expert: usize },
    /// The expert placement does not fit the model or the instance (the message says how).
    #[error("expert placement: {0}")]
    Placement(String),
    #[error("the model has no MTP module (num_nextn_predict_layers = 0, or its checkpoint holds none of the module's tensors)")]
    NoMtp,
    #[error("tensor library: {0}")]
    Tensor(#[from] candle_core::Error),
}
