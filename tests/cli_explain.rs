//! `dstwin explain` end to end: reports, JSON for scripts, and errors with exit code 2.

mod common;
use common::dstwin;

use std::process::Output;

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

const A2_SMALL: &[&str] = &[
    "explain",
    "--hardware",
    "atlas-800i-a2",
    "--dies",
    "32",
    "--redundant-experts",
    "0",
    "--shared-expert-dies",
    "0",
    "--seqs",
    "24",
    "--kv",
    "2048",
];

#[test]
fn default_explains_the_cloudmatrix_decode_instance() {
    let o = dstwin(&["explain", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["system"], "cloudmatrix384");
    assert_eq!(v["plan"]["dies"], 320);
    assert_eq!(v["plan"]["slots_per_die"], 1);
    let tpot = v["throughput"]["tpot_ms"].as_f64().unwrap();
    assert!(tpot > 10.0 && tpot < 200.0, "{tpot}");
    assert!(v["memory"]["kv_capacity_tokens"].as_u64().unwrap() > 100_000);
    for key in ["attention", "dispatch", "combine", "grouped_gemm", "gemm"] {
        assert!(v["by_class_ms"][key].as_f64().unwrap() > 0.0, "{key}");
    }
}

#[test]
fn text_report_snapshot() {
    let o = dstwin(A2_SMALL);
    assert!(o.status.success(), "{}", stderr(&o));
    insta::assert_snapshot!("explain_a2_decode", stdout(&o));
}

/// The CloudMatrix384 prefill instance (16 NPUs, EP32, 32 redundant experts), 8K prompt tokens
/// per die, as JSON.
const CM_PREFILL: &[&str] = &[
    "explain",
    "--json",
    "--role",
    "prefill",
    "--dies",
    "32",
    "--redundant-experts",
    "32",
    "--shared-expert-dies",
    "0",
    "--tokens",
    "8192",
    "--mtp",
    "0",
];

#[test]
fn same_input_gives_identical_json() {
    let a = dstwin(CM_PREFILL);
    let b = dstwin(CM_PREFILL);
    assert!(a.status.success(), "{}", stderr(&a));
    assert_eq!(a.stdout, b.stdout);
}

#[test]
fn impossible_layouts_exit_2_naming_the_numbers() {
    let o = dstwin(&["explain", "--dp", "100"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("dp (100) x tp (1) = 100, but dies = 320"),
        "{}",
        stderr(&o)
    );

    let o = dstwin(&["explain", "--redundant-experts", "0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("256 routed-expert slots"),
        "{}",
        stderr(&o)
    );

    let o = dstwin(&[
        "explain",
        "--hardware",
        "atlas-800i-a2",
        "--dies",
        "8",
        "--redundant-experts",
        "0",
        "--shared-expert-dies",
        "0",
        "--quant",
        "bf16",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("does not fit in HBM"), "{}", stderr(&o));
}

#[test]
fn moe_tensor_parallelism_is_explained_as_such_and_refuses_flashcomm1() {
    let args = [
        "explain",
        "--hardware",
        "nvidia-h200-8",
        "--quant",
        "fp8",
        "--role",
        "mixed",
        "--dies",
        "8",
        "--tp",
        "8",
        "--ep",
        "1",
        "--redundant-experts",
        "0",
        "--shared-expert-dies",
        "0",
        "--skew",
        "--eplb",
        "hierarchical",
    ];
    let o = dstwin(&args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("MoE TP8 (every die holds a 1/8 slice of all 256 experts)")
            && out.contains("MoE comm all-reduce (tensor parallel)")
            && out.contains("tp_grouped_gemm")
            && out.contains("moe_all_reduce"),
        "{out}"
    );
    assert!(!out.contains("dispatch "), "{out}");
    let mut bad = args.to_vec();
    bad.push("--flashcomm1");
    let o = dstwin(&bad);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("flashcomm1") && stderr(&o).contains("ep = 1"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn bad_names_and_values_exit_2() {
    for (args, needle) in [
        (vec!["explain", "--model", "deepseek-v9"], "deepseek-v9"),
        (vec!["explain", "--quant", "int3"], "int3"),
        (vec!["explain", "--hardware", "tpu"], "tpu"),
        (vec!["explain", "--imbalance", "0.5"], "moe_imbalance = 0.5"),
        (vec!["explain", "--kv", "999999999"], "batch.kv_len"),
        (
            vec!["explain", "--seqs", "4000", "--kv", "100000"],
            "KV capacity",
        ),
    ] {
        let o = dstwin(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn a_hf_config_json_is_accepted_as_the_model() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/engine/core/tests/data/deepseek-v3-config.json"
    );
    let o = dstwin(&["explain", "--model", path, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    // No `_name_or_path` in this config: the directory names it.
    assert_eq!(v["model"], "data");
    // DeepSeek-V3's own counts (671B, 37B activated), as the built-in model gives them.
    let builtin = dstwin(&["explain", "--model", "deepseek-v3", "--json"]);
    let b: serde_json::Value = serde_json::from_str(&stdout(&builtin)).unwrap();
    assert_eq!(v["params_total"], b["params_total"]);
    assert_eq!(v["params_active"], b["params_active"]);
    let total = v["params_total"].as_f64().unwrap();
    assert!((total / 1e9 - 671.0).abs() < 0.5, "{total}");
    let text = stdout(&dstwin(&["explain", "--model", path]));
    assert!(
        text.contains("model: 671.03B parameters, 36.63B active per token"),
        "{text}"
    );
    // A config saved by transformers names the hub checkpoint it came from; a local path or "."
    // there names nothing, and the directory does.
    let dir = std::env::temp_dir().join(format!("dstwin-explain-named-{}", std::process::id()));
    let dir = dir.join("my-finetune");
    std::fs::create_dir_all(&dir).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let named = dir.join("config.json");
    for (saved, want) in [
        ("deepseek-ai/DeepSeek-V3-0324", "DeepSeek-V3-0324"),
        (".", "my-finetune"),
        ("/data/ckpt/DeepSeek-V3", "my-finetune"),
        ("../base/DeepSeek-V3", "my-finetune"),
    ] {
        cfg["_name_or_path"] = saved.into();
        std::fs::write(&named, cfg.to_string()).unwrap();
        let o = dstwin(&["explain", "--model", named.to_str().unwrap(), "--json"]);
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        assert_eq!(v["model"], want, "{saved}");
    }
    // Without a query LoRA (`q_lora_rank` null, a V2-Lite-style `q_proj`): loads, priced so.
    let mut plain = cfg.clone();
    plain["q_lora_rank"] = serde_json::Value::Null;
    plain.as_object_mut().unwrap().remove("_name_or_path");
    std::fs::write(&named, plain.to_string()).unwrap();
    let o = dstwin(&["explain", "--model", named.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let ops = v["step"]["ops"].as_array().unwrap();
    assert!(ops.iter().any(|o| o["name"] == "q_proj"));
    assert!(!ops.iter().any(|o| o["name"] == "q_a_proj"));
    // A config in the hub cache, without `_name_or_path`: the repository's name, not the hash.
    let snap = dir.join(
        "models--deepseek-ai--DeepSeek-R1/snapshots/56d4cbbb4d29f4355bab4b9a39ccb717a14ad5ad",
    );
    std::fs::create_dir_all(&snap).unwrap();
    let cached = snap.join("config.json");
    std::fs::copy(path, &cached).unwrap();
    let o = dstwin(&["explain", "--model", cached.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["model"], "DeepSeek-R1");
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}

#[test]
fn catalog_lists_models_and_systems() {
    let o = dstwin(&["catalog", "--json"]);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(v["models"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m == "deepseek-v4-flash"));
    assert!(v["systems"].as_array().unwrap().len() >= 6);
    let o = dstwin(&["catalog"]);
    assert!(stdout(&o).contains("cloudmatrix384"));
}

#[test]
fn help_teaches_with_examples() {
    let o = dstwin(&["explain", "--help"]);
    let s = stdout(&o);
    assert!(
        s.contains("Examples:") && s.contains("--shared-expert-dies"),
        "{s}"
    );
}

#[test]
fn calibrate_prints_the_fit_and_its_errors() {
    let o = dstwin(&["calibrate", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["cost_model"], "ascend-910c");
    // Every fitted figure of the targets file on the 910C, with the cost file's parameter list.
    let residuals = v["fit"]["residuals"].as_array().unwrap();
    assert!(residuals.len() >= 14, "{}", residuals.len());
    let names = v["fit"]["values"]["names"].as_array().unwrap();
    assert!(names.iter().any(|n| n == "op_overhead_us"), "{names:?}");
    assert_eq!(
        v["shipped"]["values"]["names"].as_array().unwrap().len(),
        names.len()
    );
    // The MTP acceptance fit: a probability, each fitted point within its bound.
    let mtp = &v["mtp_acceptance"];
    let a = mtp["fit"].as_f64().unwrap();
    assert!(a > 0.0 && a < 1.0, "{a}");
    let points = mtp["residuals_of_fit"].as_array().unwrap();
    assert!(points.len() >= 3);
    for p in points {
        let (e, b) = (p["error"].as_f64().unwrap(), p["bound"].as_f64().unwrap());
        assert!(e.abs() <= b, "{p}");
    }
    // The default expert load's joint fit: every figure reported, the fitted ones within 5%
    // and left out one at a time, and the shipped parameters next to the fit.
    let load = &v["expert_load"];
    let residuals = load["fit"]["residuals"].as_array().unwrap();
    assert!(residuals.len() >= 14, "{load}");
    for r in residuals.iter().filter(|r| r["fitted"] == true) {
        assert!(r["error"].as_f64().unwrap().abs() < 0.05, "{r}");
    }
    assert_eq!(
        load["leave_one_out"].as_array().unwrap().len(),
        residuals.iter().filter(|r| r["fitted"] == true).count()
    );
    assert!(load["shipped"]["sigma"].as_f64().unwrap() > 0.0);
    // Another parameter list, as the user asks.
    let o = dstwin(&["calibrate", "--fit", "overlap_efficiency_normal", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["fit"]["values"]["names"].as_array().unwrap().len(), 1);
    let o = dstwin(&["calibrate", "--list-params"]);
    assert!(stdout(&o).contains("efficiency.attention.compute"));
}

#[test]
fn skew_defaults_to_the_fitted_load_and_reports_what_it_assumed() {
    let json = |args: &[&str]| -> serde_json::Value {
        let o = dstwin(args);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str(&stdout(&o)).unwrap()
    };
    let fitted = dstwin_twin::expert_load::fitted();
    let v = json(&["explain", "--skew", "--json"]);
    let moe = &v["moe"];
    assert_eq!(moe["load"]["kind"], "fitted");
    assert_eq!(moe["load"]["parameters"]["sigma"], fitted.sigma);
    assert_eq!(
        moe["load"]["parameters"]["concentration"],
        fitted.concentration
    );
    assert_eq!(moe["policy"], "greedy");
    assert_eq!(moe["redundant_experts"], 32);
    // Without redundant experts the default is the engines' contiguous placement, as in
    // scenarios.
    let bare = [
        "explain",
        "--skew",
        "--json",
        "--dies",
        "32",
        "--shared-expert-dies",
        "0",
    ];
    let none = json(&[&bare[..], &["--redundant-experts", "0"]].concat());
    assert_eq!(none["moe"]["policy"], "identity");
    let asked = json(&[&bare[..], &["--redundant-experts", "0", "--eplb", "greedy"]].concat());
    assert_eq!(asked["moe"]["policy"], "greedy");
    assert!(asked["moe_imbalance"].as_f64() < none["moe_imbalance"].as_f64());
    let placed = moe["placed_imbalance"].as_f64().unwrap();
    let total = v["moe_imbalance"].as_f64().unwrap();
    assert!(
        (total - placed - moe["fluctuation"].as_f64().unwrap()).abs() < 1e-9 && placed > 1.0,
        "{moe}"
    );
    // Named loads, and a concentration of one's own (no longer the fitted load).
    let l = json(&["explain", "--skew", "lognormal:1.3", "--json"]);
    assert_eq!(l["moe"]["load"]["kind"], "lognormal");
    assert_eq!(l["moe"]["load"]["parameters"]["sigma"], 1.3);
    let z = json(&["explain", "--skew", "zipf:0.5", "--json"]);
    assert_eq!(z["moe"]["load"]["kind"], "zipf");
    assert_eq!(
        z["moe_imbalance"],
        json(&["explain", "--skew", "0.5", "--json"])["moe_imbalance"]
    );
    let c = json(&["explain", "--skew", "--concentration", "0", "--json"]);
    assert_eq!(c["moe"]["load"]["kind"], "lognormal");
    assert_eq!(c["moe"]["fluctuation"], 0.0);
    // The text report says what was assumed, perfect balance included.
    let text = stdout(&dstwin(&["explain", "--skew"]));
    assert!(
        text.contains("expert load      fitted [") && text.contains("TensorRT-LLM"),
        "{text}"
    );
    assert!(stdout(&dstwin(&["explain"])).contains("perfect expert balance assumed"));
    for bad in ["foo:1", "lognormal:x", "lognormal:20", "2x"] {
        let o = dstwin(&["explain", "--skew", bad]);
        assert_eq!(o.status.code(), Some(2), "{bad}");
        assert!(stderr(&o).contains(bad), "{bad}: {}", stderr(&o));
    }
}

#[test]
fn a_skewed_expert_load_is_priced_per_layer() {
    let o = dstwin(&["explain", "--skew", "0.5", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let moe = &v["moe"];
    // 58 MoE layers + the MTP layer.
    assert_eq!(moe["imbalance_per_layer"].as_array().unwrap().len(), 59);
    assert!(v["moe_imbalance"].as_f64().unwrap() > 1.0);
    assert!(moe["imbalance_cost_ms"].as_f64().unwrap() > 0.0);
    let ident = dstwin(&["explain", "--skew", "0.5", "--eplb", "identity", "--json"]);
    let vi: serde_json::Value = serde_json::from_str(&stdout(&ident)).unwrap();
    assert!(vi["moe_imbalance"].as_f64().unwrap() > v["moe_imbalance"].as_f64().unwrap());
    // Without --skew there is no per-layer report; --eplb alone is refused.
    let plain: serde_json::Value =
        serde_json::from_str(&stdout(&dstwin(&["explain", "--json"]))).unwrap();
    assert!(plain["moe"].is_null());
    assert_eq!(
        dstwin(&["explain", "--eplb", "global"]).status.code(),
        Some(2)
    );
}

#[test]
fn cached_prompt_tokens_cost_attention_and_the_latent_up_projection() {
    let prefill = |cached: &str| {
        let o = dstwin(&[CM_PREFILL, &["--prompt", "4096", "--cached", cached]].concat());
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str::<serde_json::Value>(&stdout(&o)).unwrap()
    };
    let whole = prefill("0");
    let last_chunks = prefill("12288");
    // The same new tokens after 12K cached ones: three times the earlier keys plus the causal
    // half, so more attention, and kv_b_proj over the cached latent as well.
    assert_eq!(last_chunks["shape"]["prefill_tokens"], 8192);
    assert_eq!(last_chunks["shape"]["prefill_cached"], 2 * 12288);
    assert_eq!(whole["shape"]["prefill_cached"], 0);
    let ms = |v: &serde_json::Value, class: &str| v["by_class_ms"][class].as_f64().unwrap();
    assert!(ms(&last_chunks, "prefill_attention") > 3.0 * ms(&whole, "prefill_attention"));
    assert!(ms(&last_chunks, "gemm") > ms(&whole, "gemm"));
    assert!(last_chunks["step_ms"].as_f64() > whole["step_ms"].as_f64());
    // Cached tokens without prompt tokens, or past the model's context, are refused by name.
    let o = dstwin(&["explain", "--cached", "100"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--cached 100"), "{}", stderr(&o));
    let o = dstwin(&[
        "explain",
        "--role",
        "prefill",
        "--tokens",
        "4096",
        "--cached",
        "999999999",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("prompt_cached"), "{}", stderr(&o));
}

/// `--enforce-eager`: the step launches its kernels one by one, so it takes at least the cost
/// file's `[host] eager_layer_us` per layer (61 decoder layers and the MTP module once), as
/// `simulate` prices an eager step.
#[test]
fn an_eager_step_takes_at_least_its_kernel_launches() {
    let args = [
        "explain",
        "--hardware",
        "atlas-800-a3",
        "--dies",
        "32",
        "--redundant-experts",
        "0",
        "--shared-expert-dies",
        "0",
        "--seqs",
        "8",
        "--kv",
        "2048",
        "--json",
    ];
    let graphs: serde_json::Value = serde_json::from_str(&stdout(&dstwin(&args))).unwrap();
    assert!(graphs.get("eager_launch_ms").is_none());
    let mut eager_args = args.to_vec();
    eager_args.push("--enforce-eager");
    let o = dstwin(&eager_args);
    assert!(o.status.success(), "{}", stderr(&o));
    let eager: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let launch = eager["eager_launch_ms"].as_f64().unwrap();
    assert!((launch - 2.7 * 62.0).abs() < 1e-6, "{launch}");
    let step = eager["step_ms"].as_f64().unwrap();
    assert!((step - launch.max(graphs["step_ms"].as_f64().unwrap())).abs() < 1e-9);
    // Under a skewed load the perfectly balanced step is eager too: a launch-bound step's
    // imbalance costs nothing.
    let mut skewed = eager_args.clone();
    skewed.push("--skew");
    let sk: serde_json::Value = serde_json::from_str(&stdout(&dstwin(&skewed))).unwrap();
    let perfect = sk["moe"]["perfect_step_ms"].as_f64().unwrap();
    assert!(perfect >= launch - 1e-9, "{perfect}");
    let cost = sk["moe"]["imbalance_cost_ms"].as_f64().unwrap();
    assert!((cost - (sk["step_ms"].as_f64().unwrap() - perfect)).abs() < 1e-9);
    let mut both = eager_args.clone();
    both.extend(["--cudagraph-mode", "FULL_DECODE_ONLY"]);
    assert_eq!(dstwin(&both).status.code(), Some(2));
}

#[test]
fn dsa_context_parallelism_splits_a_prompt_step_and_is_refused_where_it_cannot_apply() {
    let args = [
        "explain",
        "--model",
        "deepseek-v3.2",
        "--hardware",
        "atlas-800-a3",
        "--role",
        "prefill",
        "--dies",
        "16",
        "--tp",
        "16",
        "--redundant-experts",
        "0",
        "--shared-expert-dies",
        "0",
        "--tokens",
        "8192",
        "--prompt",
        "8192",
        "--json",
    ];
    let tp: serde_json::Value = serde_json::from_str(&stdout(&dstwin(&args))).unwrap();
    let mut cp_args = args.to_vec();
    cp_args.push("--enable-dsa-cp");
    let o = dstwin(&cp_args);
    assert!(o.status.success(), "{}", stderr(&o));
    let cp: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(cp["features"]["dsa_cp"], true);
    let names = |v: &serde_json::Value| -> Vec<String> {
        v["step"]["ops"]
            .as_array()
            .unwrap()
            .iter()
            .map(|op| op["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(names(&cp).iter().any(|n| n == "cp_kv_all_gather"));
    assert!(!names(&cp).iter().any(|n| n == "attn_all_reduce"));
    assert!(names(&tp).iter().any(|n| n == "attn_all_reduce"));
    assert!(cp["step_ms"].as_f64().unwrap() < tp["step_ms"].as_f64().unwrap());
    // Dense attention (DeepSeek-R1) or no TP group: exit 2, naming the flag's field.
    let mut dense = cp_args.clone();
    dense[2] = "deepseek-r1";
    let o = dstwin(&dense);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("enable_dsa_cp"), "{}", stderr(&o));
    let mut no_group = cp_args.clone();
    no_group[10] = "1";
    let o = dstwin(&no_group);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("tp 1"), "{}", stderr(&o));
}

/// `--decode-context-parallel-size`: a 32K-context DeepSeek-V3.1 decode on one TP8 DP rank
/// that does not fit without it fits with DCP 8 (eight times the tokens per rank), and its
/// step shows the gathered queries and the merged outputs; 3 (not a divisor of TP) exits 2.
#[test]
fn explain_prices_decode_context_parallelism() {
    let args = |dcp: &str| {
        let v: Vec<String> = [
            "explain",
            "--model",
            "deepseek-v3.1",
            "--hardware",
            "atlas-800-a3",
            "--dies",
            "16",
            "--tp",
            "8",
            "--seqs",
            "16",
            "--kv",
            "32768",
            "--mtp",
            "0",
            "--redundant-experts",
            "0",
            "--shared-expert-dies",
            "0",
            "--decode-context-parallel-size",
            dcp,
            "--json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        dstwin(&v.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let o = args("1");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("KV capacity"), "{}", stderr(&o));
    let o = args("8");
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["features"]["dcp"], 8);
    let names: Vec<&str> = v["step"]["ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|op| op["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"dcp_q_all_gather") && names.contains(&"dcp_out_all_to_all"));
    assert!(v["memory"]["kv_capacity_tokens"].as_u64().unwrap() > 16 * 32769);
    let o = args("3");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("decode_context_parallel_size = 3"),
        "{}",
        stderr(&o)
    );
}
