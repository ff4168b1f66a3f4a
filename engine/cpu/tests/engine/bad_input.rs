//! A checkpoint that does not fit its config is refused with an error naming the tensor or the
//! field; sharded checkpoints load like single files.

use crate::common::*;
use dstwin_cpu::{AttnPath, DType, Device, LoadError, Model};
use safetensors::tensor::TensorView;
use safetensors::SafeTensors;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

type Tensors = BTreeMap<String, (safetensors::Dtype, Vec<usize>, Vec<u8>)>;

fn tensors() -> Tensors {
    let bytes = std::fs::read(tiny_dir().join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(k, v)| (k, (v.dtype(), v.shape().to_vec(), v.data().to_vec())))
        .collect()
}

fn save(path: &Path, t: &Tensors) {
    let views: Vec<(String, TensorView)> = t
        .iter()
        .map(|(k, (d, s, b))| (k.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn config() -> Value {
    serde_json::from_str(&std::fs::read_to_string(tiny_dir().join("config.json")).unwrap()).unwrap()
}

/// A model directory with `config` and `tensors`.
fn dir(tag: &str, config: &Value, t: &Tensors) -> PathBuf {
    let d = temp_dir(tag);
    std::fs::write(d.join("config.json"), config.to_string()).unwrap();
    save(&d.join("model.safetensors"), t);
    d
}

fn load_err(d: &Path) -> LoadError {
    let e = Model::load(d, DType::F32, &Device::Cpu).unwrap_err();
    let _ = std::fs::remove_dir_all(d);
    e
}

#[test]
fn a_missing_tensor_is_named() {
    let mut t = tensors();
    let name = "model.layers.2.mlp.experts.5.up_proj.weight";
    t.remove(name).unwrap();
    let e = load_err(&dir("missing", &config(), &t));
    assert!(matches!(e, LoadError::MissingTensor { .. }), "{e}");
    assert!(e.to_string().contains(name), "{e}");
}

#[test]
fn a_wrong_shape_names_the_tensor_and_the_fields() {
    let mut t = tensors();
    let name = "model.layers.1.self_attn.kv_b_proj.weight";
    let (d, s, b) = t.remove(name).unwrap();
    let (rows, cols) = (s[0], s[1]);
    t.insert(name.into(), (d, vec![rows / 2, cols * 2], b));
    let e = load_err(&dir("shape", &config(), &t));
    let msg = e.to_string();
    assert!(matches!(e, LoadError::Shape { .. }), "{msg}");
    assert!(
        msg.contains(name) && msg.contains("kv_lora_rank = 64"),
        "{msg}"
    );
}

#[test]
fn unsupported_architectures_are_refused() {
    for (arch, model_type) in [
        ("DeepseekV32ForCausalLM", "deepseek_v32"),
        ("LlamaForCausalLM", "llama"),
    ] {
        let mut c = config();
        c["architectures"] = serde_json::json!([arch]);
        c["model_type"] = Value::from(model_type);
        let e = load_err(&dir("arch", &c, &tensors()));
        assert!(matches!(e, LoadError::Architecture { .. }), "{e}");
        assert!(e.to_string().contains(model_type), "{e}");
    }
    let mut c = config();
    c["scoring_func"] = Value::from("softmax");
    let e = load_err(&dir("scoring", &c, &tensors()));
    assert!(e.to_string().contains("scoring_func"), "{e}");
}

#[test]
fn a_config_that_disagrees_with_the_weights_names_the_field() {
    let mut c = config();
    c["hidden_size"] = Value::from(128);
    let e = load_err(&dir("hidden", &c, &tensors()));
    assert!(e.to_string().contains("hidden_size = 128"), "{e}");

    // Fewer experts than the checkpoint holds: the router's shape shows it first.
    let mut c = config();
    c["n_routed_experts"] = Value::from(8);
    let e = load_err(&dir("experts", &c, &tensors()));
    assert!(
        e.to_string().contains("mlp.gate.weight") && e.to_string().contains("n_routed_experts = 8"),
        "{e}"
    );

    // A tensor no part of the config accounts for (here an expert beyond n_routed_experts).
    let mut t = tensors();
    let extra = t["model.layers.1.mlp.experts.0.up_proj.weight"].clone();
    t.insert("model.layers.1.mlp.experts.16.up_proj.weight".into(), extra);
    let e = load_err(&dir("extra", &config(), &t));
    assert!(matches!(e, LoadError::Unexpected { .. }), "{e}");
    assert!(
        e.to_string().contains("experts.16") && e.to_string().contains("n_routed_experts"),
        "{e}"
    );

    // One decoder layer fewer than the checkpoint's: refused (the layer is no MTP module).
    let mut c = config();
    c["num_hidden_layers"] = Value::from(3);
    c["num_nextn_predict_layers"] = Value::from(0);
    let e = load_err(&dir("layers", &c, &tensors()));
    assert!(e.to_string().contains("model.layers.3."), "{e}");
}

/// What HF's loader ignores loads: an MTP module the config does not describe (HF ignores the
/// MTP layer's tensors), RoPE's cached `rotary_emb.inv_freq`; and a checkpoint that lacks the
/// MTP module its config counts (transformers' save_pretrained leaves it out) loads without
/// MTP, an instance that drafts then refused.
#[test]
fn tensors_hf_ignores_are_ignored_and_a_dropped_mtp_module_is_no_mtp() {
    let load = |tag: &str, c: &Value, t: &Tensors| {
        let d = dir(tag, c, t);
        let m = Model::load(&d, DType::F32, &Device::Cpu);
        let _ = std::fs::remove_dir_all(&d);
        m
    };
    let mut c = config();
    c["num_nextn_predict_layers"] = Value::from(0);
    let m = load("mtp-unused", &c, &tensors()).unwrap();
    assert!(m.mtp.is_empty());
    let mut t = tensors();
    let freq = (safetensors::Dtype::F32, vec![16], vec![0u8; 64]);
    t.insert("model.layers.0.self_attn.rotary_emb.inv_freq".into(), freq);
    let m = load("inv-freq", &config(), &t).unwrap();
    assert_eq!(m.mtp.len(), 1);
    let mut t = tensors();
    t.retain(|k, _| !k.starts_with("model.layers.4."));
    let m = load("mtp-dropped", &config(), &t).unwrap();
    assert!(m.mtp.is_empty());
    assert_eq!((m.cfg.mtp_layers, m.cfg.model.mtp_layers), (0, 0));
    // Part of a module is still a module with tensors missing.
    let mut t = tensors();
    t.remove("model.layers.4.eh_proj.weight").unwrap();
    let e = load("mtp-partial", &config(), &t).unwrap_err();
    assert!(e.to_string().contains("model.layers.4.eh_proj"), "{e}");
}

#[test]
fn a_sharded_checkpoint_loads_like_a_single_file() {
    let t = tensors();
    let d = temp_dir("sharded");
    std::fs::copy(tiny_dir().join("config.json"), d.join("config.json")).unwrap();
    let (mut a, mut b) = (Tensors::new(), Tensors::new());
    let mut map = serde_json::Map::new();
    for (i, (k, v)) in t.into_iter().enumerate() {
        let (shard, name) = if i % 2 == 0 {
            (&mut a, "model-00001-of-00002.safetensors")
        } else {
            (&mut b, "model-00002-of-00002.safetensors")
        };
        map.insert(k.clone(), Value::from(name));
        shard.insert(k, v);
    }
    save(&d.join("model-00001-of-00002.safetensors"), &a);
    save(&d.join("model-00002-of-00002.safetensors"), &b);
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let sharded = Model::load(&d, DType::F32, &Device::Cpu).unwrap();
    let p = prompt(9, 40);
    let x = prompt_logits(&sharded, &p, 1, AttnPath::Auto);
    let y = prompt_logits(tiny(DType::F32), &p, 1, AttnPath::Auto);
    assert_eq!(x, y);
    // The index is checked against the shards: a tensor it places in the wrong shard, one it
    // lists that no shard holds, one a shard holds that it does not list; a missing shard is
    // named (an input error: exit 2 at the command line).
    let write = |map: &serde_json::Map<String, Value>| {
        let index = serde_json::json!({"metadata": {}, "weight_map": map});
        std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
    };
    let (first, _) = map
        .iter()
        .next()
        .map(|(k, v)| (k.clone(), v.clone()))
        .unwrap();
    let mut wrong = map.clone();
    wrong.insert(
        first.clone(),
        Value::from("model-00002-of-00002.safetensors"),
    );
    write(&wrong);
    let e = Model::load(&d, DType::F32, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&first) && e.contains("model-00001-of-00002"),
        "{e}"
    );
    let mut ghost = map.clone();
    ghost.insert(
        "model.layers.0.ghost.weight".into(),
        Value::from("model-00001-of-00002.safetensors"),
    );
    write(&ghost);
    let e = Model::load(&d, DType::F32, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(e.contains("ghost") && e.contains("does not hold it"), "{e}");
    let mut unlisted = map.clone();
    unlisted.remove(&first);
    write(&unlisted);
    let e = Model::load(&d, DType::F32, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(e.contains(&first) && e.contains("does not list"), "{e}");
    write(&map);
    std::fs::remove_file(d.join("model-00002-of-00002.safetensors")).unwrap();
    let e = Model::load(&d, DType::F32, &Device::Cpu).unwrap_err();
    assert!(matches!(e, LoadError::Missing { .. }), "{e}");
    assert!(
        e.to_string().contains("model-00002-of-00002.safetensors"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn a_missing_directory_is_an_io_error_naming_the_file() {
    let e = Model::load(
        Path::new("/nonexistent/dstwin-model"),
        DType::F32,
        &Device::Cpu,
    )
    .unwrap_err();
    assert!(
        matches!(e, LoadError::Io { .. }) && e.to_string().contains("config.json"),
        "{e}"
    );
}

#[test]
fn a_missing_config_field_is_named_once() {
    let mut c = config();
    c.as_object_mut().unwrap().remove("kv_lora_rank");
    let e = load_err(&dir("field", &c, &tensors()));
    let msg = e.to_string();
    assert!(msg.contains("'kv_lora_rank'"), "{msg}");
    assert_eq!(msg.matches("config.json").count(), 1, "{msg}");
}

/// An FP8 value (e4m3fn) as the format defines it, for building a checkpoint.
fn e4m3(b: u8) -> f32 {
    let (e, m) = (((b >> 3) & 0xF) as i32, (b & 7) as f32);
    let v = if e == 0 {
        m / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + m / 8.0) * 2f32.powi(e - 7)
    };
    if b & 0x80 != 0 {
        -v
    } else {
        v
    }
}

/// DeepSeek's FP8 checkpoint format: e4m3 weights, each block times its `weight_scale_inv`
/// entry, dequantized at load. A checkpoint with some weights in FP8 computes exactly what one
/// with their dequantized values in F32 does; a missing scale, or a quantization the engine
/// does not read, is refused naming it.
#[test]
fn fp8_block_scaled_weights_load_as_their_dequantized_values() {
    let finite: Vec<u8> = (0..=255u8).filter(|b| b & 0x7F != 0x7F).collect();
    let (br, bc) = (32usize, 64usize);
    let mut c = config();
    c["quantization_config"] = serde_json::json!({
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
        "weight_block_size": [br, bc]
    });
    let (mut fp8, mut reference) = (tensors(), tensors());
    let chosen: Vec<String> = fp8
        .keys()
        .filter(|k| {
            (k.starts_with("model.layers.0.self_attn.")
                || k.starts_with("model.layers.1.mlp.experts.0."))
                && k.ends_with("_proj.weight")
        })
        .cloned()
        .collect();
    assert!(chosen.len() >= 5, "{chosen:?}");
    for name in &chosen {
        let (dtype, shape, bytes) = fp8[name].clone();
        assert_eq!(dtype, safetensors::Dtype::BF16);
        let w: Vec<f32> = bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect();
        let (rows, cols) = (shape[0], shape[1]);
        let (sr, sc) = (rows.div_ceil(br), cols.div_ceil(bc));
        let mut scale = vec![1.0f32; sr * sc];
        for (i, s) in scale.iter_mut().enumerate() {
            let (r0, c0) = ((i / sc) * br, (i % sc) * bc);
            let amax = (r0..(r0 + br).min(rows))
                .flat_map(|r| (c0..(c0 + bc).min(cols)).map(move |c| (r, c)))
                .map(|(r, c)| w[r * cols + c].abs())
                .fold(0.0f32, f32::max);
            if amax > 0.0 {
                *s = amax / 448.0;
            }
        }
        let q: Vec<u8> = w
            .iter()
            .enumerate()
            .map(|(i, x)| {
                let s = scale[(i / cols / br) * sc + (i % cols) / bc];
                *finite
                    .iter()
                    .min_by(|a, b| {
                        (e4m3(**a) - x / s)
                            .abs()
                            .total_cmp(&(e4m3(**b) - x / s).abs())
                    })
                    .unwrap()
            })
            .collect();
        let deq: Vec<u8> = q
            .iter()
            .enumerate()
            .flat_map(|(i, &b)| {
                (e4m3(b) * scale[(i / cols / br) * sc + (i % cols) / bc]).to_le_bytes()
            })
            .collect();
        let scale_bytes: Vec<u8> = scale.iter().flat_map(|s| s.to_le_bytes()).collect();
        fp8.insert(
            name.clone(),
            (safetensors::Dtype::F8_E4M3, shape.clone(), q),
        );
        fp8.insert(
            format!("{name}_scale_inv"),
            (safetensors::Dtype::F32, vec![sr, sc], scale_bytes),
        );
        reference.insert(name.clone(), (safetensors::Dtype::F32, shape, deq));
    }
    let a = dir("fp8", &c, &fp8);
    let b = dir("fp8-ref", &config(), &reference);
    let quantized = Model::load(&a, DType::F32, &Device::Cpu).unwrap();
    let plain = Model::load(&b, DType::F32, &Device::Cpu).unwrap();
    let p = prompt(9, 41);
    assert_eq!(
        prompt_logits(&quantized, &p, 1, AttnPath::Auto),
        prompt_logits(&plain, &p, 1, AttnPath::Auto)
    );
    let _ = std::fs::remove_dir_all(&b);
    // A weight without its scale.
    let mut t = fp8.clone();
    t.remove(&format!("{}_scale_inv", chosen[0])).unwrap();
    let e = load_err(&dir("fp8-noscale", &c, &t));
    assert!(
        e.to_string().contains(&format!("{}_scale_inv", chosen[0])),
        "{e}"
    );
    // A NaN byte (0x7F) in an FP8 weight.
    let mut t = fp8.clone();
    t.get_mut(&chosen[0]).unwrap().2[3] = 0x7F;
    let e = load_err(&dir("fp8-nan", &c, &t));
    assert!(
        e.to_string().contains(&chosen[0]) && e.to_string().contains("NaN"),
        "{e}"
    );
    // A quantization the engine does not read.
    let mut w8 = c.clone();
    w8["quantization_config"]["quant_method"] = "w8a8".into();
    let e = load_err(&dir("fp8-method", &w8, &fp8));
    assert!(
        e.to_string().contains("quantization_config.quant_method"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&a);
}
