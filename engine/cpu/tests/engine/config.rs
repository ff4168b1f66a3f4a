//! The engine reads DeepSeek-V3's config.json (the core tests' copy, with the fields it leaves
//! out added as the shipped file has them: YaRN rope scaling and the special tokens).

use dstwin_cpu::EngineConfig;

const V3: &str = include_str!("../../../core/tests/data/deepseek-v3-config.json");

#[test]
fn deepseek_v3_config_gives_the_engine_fields() {
    let mut v: serde_json::Value = serde_json::from_str(V3).unwrap();
    v["rope_scaling"] = serde_json::json!({
        "beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096, "type": "yarn"
    });
    v["bos_token_id"] = 0.into();
    v["eos_token_id"] = 1.into();
    let c = EngineConfig::from_hf_json("deepseek-v3", &v.to_string()).unwrap();
    assert_eq!(
        (c.hidden, c.layers, c.mtp_layers, c.dense_layers),
        (7168, 61, 1, 3)
    );
    assert_eq!(
        (c.heads, c.q_lora_rank, c.kv_lora_rank),
        (128, Some(1536), 512)
    );
    assert_eq!(c.kv_width(), 576, "the latent cache entry: 512 + 64");
    assert_eq!(
        (c.routed_experts, c.top_k, c.n_group, c.topk_group),
        (256, 8, 8, 4)
    );
    assert!(c.norm_topk_prob);
    assert_eq!(c.routed_scaling_factor, 2.5);
    let y = c.rope_scaling.as_ref().expect("V3 uses YaRN");
    assert_eq!((y.factor, y.original_max_position_embeddings), (40.0, 4096));
    assert_eq!((y.mscale, y.mscale_all_dim), (1.0, 1.0));
    // 192^-0.5 * (0.1 ln 40 + 1)^2
    let m = 0.1 * 40f64.ln() + 1.0;
    assert!((c.softmax_scale() - 192f64.powf(-0.5) * m * m).abs() < 1e-12);
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.as_slice()),
        (Some(0), &[1][..])
    );
    // The core's view of the same file is carried along for the cost model.
    assert_eq!(c.model.routed_experts, 256);
}

/// transformers 5 writes RoPE as `rope_parameters` (theta inside, `rope_type` for the kind) and
/// drops `rope_scaling`/`rope_theta`: the same model loads to the same engine config, and a file
/// whose two spellings disagree is refused, naming the field.
#[test]
fn rope_parameters_read_as_rope_scaling_and_rope_theta() {
    let mut old: serde_json::Value = serde_json::from_str(V3).unwrap();
    let yarn = serde_json::json!({
        "beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096, "type": "yarn"
    });
    old["rope_scaling"] = yarn.clone();
    old["rope_theta"] = 50000.into();
    let mut new = old.clone();
    let o = new.as_object_mut().unwrap();
    o.remove("rope_scaling");
    o.remove("rope_theta");
    let mut params = yarn.clone();
    params.as_object_mut().unwrap().remove("type");
    params["rope_type"] = "yarn".into();
    params["rope_theta"] = 50000.into();
    new["rope_parameters"] = params;
    let a = EngineConfig::from_hf_json("m", &old.to_string()).unwrap();
    let b = EngineConfig::from_hf_json("m", &new.to_string()).unwrap();
    assert_eq!(b.rope_theta, 50000.0);
    assert_eq!(a.rope_theta, b.rope_theta);
    assert_eq!(a.rope_scaling, b.rope_scaling);
    assert!(b.rope_scaling.is_some());
    // `default`: no scaling.
    new["rope_parameters"] = serde_json::json!({"rope_type": "default", "rope_theta": 10000});
    let c = EngineConfig::from_hf_json("m", &new.to_string()).unwrap();
    assert_eq!((c.rope_theta, c.rope_scaling.is_none()), (10000.0, true));
    // Both spellings, disagreeing.
    let mut both = old.clone();
    let mut p = yarn;
    p["factor"] = 8.into();
    both["rope_parameters"] = p;
    let e = EngineConfig::from_hf_json("m", &both.to_string())
        .unwrap_err()
        .to_string();
    assert!(e.contains("rope_parameters") && e.contains("factor"), "{e}");
    // Both, agreeing as numbers (40 and 40.0, a default spelled out in one): loads.
    let mut same = old.clone();
    let mut p = same["rope_scaling"].clone();
    p["factor"] = 40.0.into();
    p.as_object_mut().unwrap().remove("beta_fast");
    same["rope_parameters"] = p;
    assert_eq!(
        EngineConfig::from_hf_json("m", &same.to_string())
            .unwrap()
            .rope_scaling,
        a.rope_scaling
    );
    // Theta in both, disagreeing: refused; `rope_parameters` with no type is default RoPE.
    let mut theta = new.clone();
    theta["rope_theta"] = 10000.into();
    theta["rope_parameters"] = serde_json::json!({"rope_theta": 20000});
    let e = EngineConfig::from_hf_json("m", &theta.to_string())
        .unwrap_err()
        .to_string();
    assert!(e.contains("rope_parameters.rope_theta"), "{e}");
    theta.as_object_mut().unwrap().remove("rope_theta");
    let c = EngineConfig::from_hf_json("m", &theta.to_string()).unwrap();
    assert_eq!((c.rope_theta, c.rope_scaling.is_none()), (20000.0, true));
}
