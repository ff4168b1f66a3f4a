//! The hardware catalog loads, validates user files, and the cost model behaves like one.

use dstwin_hwmodels::{A2aMode, Catalog, Comm, CommKind, DType, OpClass, Resource, Scope, Work};
use proptest::prelude::*;

#[test]
fn builtin_catalog_has_every_system_with_sources() {
    let cat = Catalog::builtin();
    let names: Vec<_> = cat.system_names().collect();
    for want in [
        "cloudmatrix384",
        "atlas-800-a3",
        "atlas-800i-a2",
        "nvidia-h800-8",
        "nvidia-h100-8",
        "nvidia-h200-8",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    for s in cat.systems() {
        assert!(!s.source.is_empty(), "{} has no source", s.name);
        assert!(
            s.fabric.iter().all(|l| !l.source.is_empty()),
            "{} fabric without source",
            s.name
        );
        cat.cost_model(s, None).unwrap();
    }
    for c in cat.chips() {
        assert!(!c.source.is_empty(), "{} has no source", c.name);
    }
}

#[test]
fn cloudmatrix384_is_384_npus_of_two_dies_on_one_ub_plane() {
    let s = Catalog::builtin().system("cloudmatrix384").unwrap();
    assert_eq!(s.max_dies(), 768);
    assert_eq!(s.dies_per_node(), 16);
    assert_eq!(s.span(2), Scope::Package);
    assert_eq!(s.span(16), Scope::Node);
    assert_eq!(s.span(320), Scope::Supernode);
    // HCCS inside a node, the UB plane across the supernode (the same bandwidth).
    assert_eq!(s.level_for(16).name, "HCCS");
    assert_eq!(s.level_for(320).name, "UB");
}

#[test]
fn a2_groups_beyond_a_node_use_roce() {
    let s = Catalog::builtin().system("atlas-800i-a2").unwrap();
    assert_eq!(s.level_for(8).name, "HCCS");
    assert_eq!(s.level_for(16).name, "RoCE");
}

#[test]
fn unknown_names_list_what_is_known() {
    let err = Catalog::builtin().system("cm999").unwrap_err().to_string();
    assert!(
        err.contains("cm999") && err.contains("cloudmatrix384"),
        "{err}"
    );
}

const USER_FILE: &str = r#"
name = "my-a3"
description = "four A3 nodes"
chip = "ascend-910c"
cost_model = "ascend-910c"
packages_per_node = 8
max_nodes = 4
reserved_hbm_gb_per_die = 5
source = "our lab"

[[fabric]]
name = "HCCS"
scope = "node"
bw_gb_s_per_die = 196
latency_us = 1
source = "spec"

[[fabric]]
name = "RoCE"
scope = "cluster"
bw_gb_s_per_die = 25
latency_us = 5
source = "spec"
"#;

#[test]
fn a_users_system_file_loads_like_a_builtin() {
    let s = Catalog::builtin()
        .system_from_str("my-a3.toml", USER_FILE, None)
        .unwrap();
    assert_eq!(s.max_dies(), 64);
    assert_eq!(s.chip.name, "ascend-910c");
}

#[test]
fn bad_user_files_name_the_field_and_value() {
    let cat = Catalog::builtin();
    let neg = USER_FILE.replace("bw_gb_s_per_die = 25", "bw_gb_s_per_die = -3");
    let err = cat
        .system_from_str("f.toml", &neg, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("fabric[1].bw_gb_s_per_die = -3"), "{err}");
    let unknown = USER_FILE.replace("max_nodes = 4", "max_nodes = 4\nmax_nodez = 5");
    let err = cat
        .system_from_str("f.toml", &unknown, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_nodez"), "{err}");
    let order = USER_FILE.replace("scope = \"cluster\"", "scope = \"package\"");
    let err = cat
        .system_from_str("f.toml", &order, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("fabric[1].scope"), "{err}");
    // 8 packages x 2 dies x 4294967295 nodes overflowed every die count computed from it.
    let huge = USER_FILE.replace("max_nodes = 4", "max_nodes = 4294967295");
    let err = cat
        .system_from_str("f.toml", &huge, None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("max_nodes = 4294967295") && err.contains("at most 1048576"),
        "{err}"
    );
    // Three u32 factors at their largest overflow u64 as well.
    let huger = USER_FILE
        .replace("max_nodes = 4", "max_nodes = 4294967295")
        .replace("packages_per_node = 8", "packages_per_node = 4294967295")
        .replace(
            "chip = \"ascend-910c\"",
            "chip = { name = \"x\", vendor = \"v\", dies_per_package = 4294967295, peak_tflops = { bf16 = 1 }, hbm_gb = 64, hbm_tb_s = 1, source = \"s\" }",
        );
    let err = cat
        .system_from_str("f.toml", &huger, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("at most 1048576"), "{err}");
    let chip = USER_FILE.replace("chip = \"ascend-910c\"", "chip = \"ascend-999\"");
    let err = cat
        .system_from_str("f.toml", &chip, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("ascend-999"), "{err}");
}

/// Figures no hardware has, though positive and finite, are refused naming their field: a peak
/// of 1e-308 TFLOPS priced every step at infinity and printed inf with exit 0.
#[test]
fn figures_outside_what_hardware_can_be_are_refused() {
    let cat = Catalog::builtin();
    let inline = |peak: &str, bw: &str| {
        USER_FILE
            .replace(
                "chip = \"ascend-910c\"",
                &format!("chip = {{ name = \"x\", vendor = \"v\", dies_per_package = 2, peak_tflops = {{ bf16 = {peak} }}, hbm_gb = 64, hbm_tb_s = 1.6, source = \"s\" }}"),
            )
            .replace("bw_gb_s_per_die = 25", &format!("bw_gb_s_per_die = {bw}"))
    };
    for (peak, bw, says) in [
        (
            "1e-308",
            "25",
            "chip.peak_tflops.bf16 = 1e-308: must be 0.001 to 1,000,000 TFLOPS",
        ),
        ("1e300", "25", "chip.peak_tflops.bf16 = 1e300"),
        ("376", "1e-300", "fabric[1].bw_gb_s_per_die = 1e-300"),
    ] {
        let err = cat
            .system_from_str("f.toml", &inline(peak, bw), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains(says), "{peak} {bw}: {err}");
    }
    assert!(cat
        .system_from_str("f.toml", &inline("0.001", "0.001"), None)
        .is_ok());
    // An efficiency of a billionth of a peak is the least a cost file may give.
    let tiny = "name = \"mine\"\nsource = \"t\"\ninherits = \"ascend-910c\"\n[efficiency.gemm]\nmemory = 1e-300\n";
    let huge = "name = \"mine\"\nsource = \"t\"\ninherits = \"ascend-910c\"\n[alltoall]\nunfitted_factor = 1e308\n";
    let err = user_cost_model("huge-factor", huge).unwrap_err();
    assert!(
        err.contains("alltoall.unfitted_factor = 1e308: must be 0.001 to 1,000"),
        "{err}"
    );
    let err = user_cost_model("tiny-eff", tiny).unwrap_err();
    assert!(
        err.contains("efficiency.gemm.memory = 1e-300: must be in [1e-9, 1]"),
        "{err}"
    );
}

#[test]
fn an_inline_chip_error_names_its_field_not_serde_internals() {
    let inline = "chip = { name = \"x\", vendor = \"v\", dies_per_package = 1, \
                  peak_tflops = { bf16 = 100.0 }, hbm_gb = 64, hbm_tb_s = 1.6, source = \"s\" }";
    let ok = USER_FILE.replace("chip = \"ascend-910c\"", inline);
    let s = Catalog::builtin()
        .system_from_str("f.toml", &ok, None)
        .unwrap();
    assert_eq!(s.chip.name, "x");
    let typo = ok.replace("hbm_gb", "hbm_gib");
    let err = Catalog::builtin()
        .system_from_str("f.toml", &typo, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("hbm_gib") && !err.contains("variant"), "{err}");
    let number = USER_FILE.replace("chip = \"ascend-910c\"", "chip = 7");
    let err = Catalog::builtin()
        .system_from_str("f.toml", &number, None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("chip name") && !err.contains("ChipRef"),
        "{err}"
    );
}

/// The built-in 910C cost file.
const COST_910C: &str = include_str!("../data/costs/ascend-910c.toml");

/// Loads `cost` as a user's cost file beside a system file naming it.
fn user_cost_model(tag: &str, cost: &str) -> Result<dstwin_hwmodels::CostModel, String> {
    let dir = std::env::temp_dir().join(format!("dstwin-cost-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("cost.toml"), cost).unwrap();
    let system = USER_FILE.replace("cost_model = \"ascend-910c\"", "cost_model = \"cost.toml\"");
    let cat = Catalog::builtin();
    let out = cat
        .system_from_str("my-a3.toml", &system, Some(&dir))
        .and_then(|s| cat.cost_model(&s, Some(&dir)))
        .map_err(|e| e.to_string());
    std::fs::remove_dir_all(&dir).unwrap();
    out
}

#[test]
fn the_910b_takes_every_kernel_number_from_the_910c_as_shipped() {
    let cat = Catalog::builtin();
    let (c, b) = (
        cat.cost_params("ascend-910c").unwrap(),
        cat.cost_params("ascend-910b").unwrap(),
    );
    assert_eq!(b.inherits.as_deref(), Some("ascend-910c"));
    // No anchor is fitted on the A2, and its all-to-all is fitted on none of its fabrics.
    assert!(b.fit.is_empty() && !c.fit.is_empty());
    assert!(b.alltoall.fitted_on.is_empty());
    // Everything but the names, sources and the A2's own collectives is the 910C's.
    let strip = |p: &dstwin_hwmodels::CostParams| {
        let mut p = p.clone();
        p.name.clear();
        p.source.clear();
        p.inherits = None;
        p.fit.clear();
        p.alltoall.fitted_on.clear();
        p.alltoall.source.clear();
        p.collective = c.collective.clone();
        p
    };
    assert_eq!(strip(b), strip(c));
}

#[test]
fn a_cost_file_can_give_only_what_differs_from_a_catalog_model() {
    let file = |body: &str| format!("name = \"mine\"\nsource = \"test\"\n{body}");
    let cm = user_cost_model(
        "inherit",
        &file("inherits = \"ascend-910c\"\n[efficiency.gemm]\nmemory = 0.5\n"),
    )
    .unwrap();
    let base = cost_model();
    let (p, q) = (&cm.params, &base.params);
    assert_eq!(p.name, "mine");
    // The key given replaces its own value only; the rest of its table and file is the base's.
    assert_eq!(p.efficiency[&OpClass::Gemm].memory, 0.5);
    assert_eq!(
        p.efficiency[&OpClass::Gemm].compute,
        q.efficiency[&OpClass::Gemm].compute
    );
    assert_eq!(
        p.efficiency[&OpClass::Attention],
        q.efficiency[&OpClass::Attention]
    );
    assert_eq!(p.alltoall, q.alltoall);
    assert_eq!(p.op_overhead_us, q.op_overhead_us);
    assert_eq!(p.kernel, q.kernel);
    // Errors name the field and the value.
    let err = user_cost_model("nobase", &file("inherits = \"ascend-999\"\n")).unwrap_err();
    assert!(
        err.contains("inherits") && err.contains("ascend-999") && err.contains("ascend-910c"),
        "{err}"
    );
    let err = user_cost_model("notname", &file("inherits = 3\n")).unwrap_err();
    assert!(err.contains("inherits = 3"), "{err}");
    // What the file gives is still validated.
    let err = user_cost_model(
        "badvalue",
        &file("inherits = \"ascend-910c\"\n[efficiency.gemm]\nmemory = 1.5\n"),
    )
    .unwrap_err();
    assert!(err.contains("1.5"), "{err}");
}

#[test]
fn one_row_kernels_take_their_own_form_when_the_file_gives_one() {
    let file = |body: &str| {
        format!("name = \"mine\"\nsource = \"test\"\ninherits = \"ascend-910c\"\n{body}")
    };
    let cm = user_cost_model(
        "onerow",
        &file("[efficiency.gemm.one_row]\ncompute = 0.5\nmemory = 0.25\nfixed_us = 7.0\n"),
    )
    .unwrap();
    let base = user_cost_model("onerow-base", &file("")).unwrap();
    let gemm = |rows: f64| Work {
        class: OpClass::Gemm,
        flops: 2.0 * rows * 7168.0 * 1536.0,
        bytes: 2.0 * (rows * 7168.0 + 7168.0 * 1536.0 + rows * 1536.0),
        dtype: DType::Bf16,
        rows,
        slice: 0.0,
    };
    // One row: the entry's fixed cost and memory efficiency (the in-situ factor still applies).
    let one = cm.compute(&gemm(1.0));
    let k = cm.params.in_situ_efficiency;
    let memory_s = gemm(1.0).bytes / (cm.system.chip.hbm_bytes_per_s() * 0.25 * k);
    assert!((one.memory_s - memory_s).abs() < 1e-15, "{one:?}");
    assert!((one.time_s - (7e-6 + memory_s)).abs() < 1e-12, "{one:?}");
    // Less than a row (sparse expert parallelism's expected rows per expert): one row's form.
    let half = cm.compute(&gemm(0.5));
    assert!(
        (half.time_s - (7e-6 + half.memory_s)).abs() < 1e-12,
        "{half:?}"
    );
    // Two rows, and other classes at one row: as before.
    assert_eq!(cm.compute(&gemm(2.0)), base.compute(&gemm(2.0)));
    let norm = Work {
        class: OpClass::Elementwise,
        ..gemm(1.0)
    };
    assert_eq!(cm.compute(&norm), base.compute(&norm));
    // Its fields are validated by name.
    let err = user_cost_model(
        "badonerow",
        &file("[efficiency.gemm.one_row]\ncompute = 0.5\nmemory = 0.0\nfixed_us = 7.0\n"),
    )
    .unwrap_err();
    assert!(err.contains("efficiency.gemm.one_row.memory"), "{err}");
}

#[test]
fn normal_mode_combine_has_its_own_efficiency_when_given() {
    let normal = |cm: &dstwin_hwmodels::CostModel, kind| {
        cm.comm(&Comm {
            kind,
            bytes: 1e8,
            group: 128,
            mode: A2aMode::Normal,
            copies: 0.0,
        })
        .time_s
    };
    // Shipped: on A3 dispatch's bandwidth falls faster with EP than combine's.
    let cm = cost_model();
    let a = &cm.params.alltoall;
    assert!(a.normal_bw_eff(CommKind::Combine, 128) > a.normal_bw_eff(CommKind::Dispatch, 128));
    assert!(normal(&cm, CommKind::Combine) < normal(&cm, CommKind::Dispatch));
    // A user's file without the combine pair: combine takes dispatch's line.
    let without_lines = |prefix: &str| {
        COST_910C
            .lines()
            .filter(|l| !l.starts_with(prefix))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let cm = user_cost_model("plain", &without_lines("normal_combine_")).unwrap();
    let a = &cm.params.alltoall;
    assert_eq!(
        a.normal_bw_eff(CommKind::Combine, 128),
        a.normal_bw_eff(CommKind::Dispatch, 128)
    );
    // Half a pair is an error naming the field that is there.
    let half = without_lines("normal_combine_bw_eff_per_doubling");
    let err = user_cost_model("half", &half).unwrap_err();
    assert!(
        err.contains("normal_combine_bw_eff_at_ep8") && err.contains("per_doubling"),
        "{err}"
    );
    let bad = COST_910C.replace(
        "normal_combine_bw_eff_at_ep8 = 0.598",
        "normal_combine_bw_eff_at_ep8 = 1.5",
    );
    let err = user_cost_model("bad", &bad).unwrap_err();
    assert!(err.contains("normal_combine_bw_eff_at_ep8 = 1.5"), "{err}");
}

#[test]
fn a_kernel_entry_prices_its_ops_and_leaves_the_class_to_the_others() {
    let cm = cost_model();
    let w = Work {
        class: OpClass::Elementwise,
        flops: 1e6,
        bytes: 64e6,
        dtype: DType::Bf16,
        rows: 0.0,
        slice: 0.0,
    };
    // Another op of the same class: the class's efficiency and the file's per-kernel cost.
    let class = cm.compute_op("ffn_norm", &w);
    assert_eq!(class, cm.compute(&w));
    // An op with its own entry: its fixed cost and its bound resource's efficiency.
    let k = cm
        .params
        .kernel("hc_post")
        .expect("the 910C file prices hc_post");
    assert_eq!(k.bound, Resource::Memory);
    let own = cm.compute_op("hc_post", &w);
    let memory = w.bytes / (cm.system.chip.hbm_bytes_per_s() * k.efficiency);
    assert!((own.time_s - (k.fixed_us * 1e-6 + memory)).abs() < 1e-12);
    assert!((own.memory_s - memory).abs() < 1e-15);
    // The resource it does not bind keeps the class's efficiency.
    assert_eq!(own.compute_s, class.compute_s);
    // An entry with a bad efficiency, no ops, or an op already priced is an error naming it.
    let entry = "[[kernel]]\nops = [\"hc_post\"]";
    for (bad, says) in [
        (
            COST_910C.replacen("efficiency = 0.6025", "efficiency = 1.7", 1),
            "efficiency = 1.7",
        ),
        (
            COST_910C.replacen("ops = [\"hc_post\"]", "ops = []", 1),
            "ops = []",
        ),
        (
            COST_910C.replacen(entry, &format!("{entry}\nops2 = 1"), 1),
            "ops2",
        ),
        (
            COST_910C.replacen("ops = [\"hc_pre\"]", "ops = [\"hc_post\"]", 1),
            "one kernel entry",
        ),
    ] {
        let err = user_cost_model("kernel", &bad).unwrap_err();
        assert!(err.contains(says), "{says}: {err}");
    }
}

#[test]
fn int8_runs_at_twice_bf16_and_fp8_falls_back_on_ascend() {
    let c = Catalog::builtin().chip("ascend-910c").unwrap();
    assert_eq!(c.peak_flops(DType::Int8), 2.0 * c.peak_flops(DType::Bf16));
    assert_eq!(c.peak_flops(DType::Fp8), c.peak_flops(DType::Bf16));
}

fn cost_model() -> dstwin_hwmodels::CostModel {
    let cat = Catalog::builtin();
    cat.cost_model(cat.system("cloudmatrix384").unwrap(), None)
        .unwrap()
}

proptest! {
    #[test]
    fn more_work_is_never_cheaper(flops in 0.0f64..1e15, bytes in 0.0f64..1e11, extra in 0.0f64..1e13, class in 0usize..5) {
        let cm = cost_model();
        let class = OpClass::ALL[class];
        let a = cm.compute(&Work { class, flops, bytes, dtype: DType::Int8, rows: 0.0, slice: 0.0 }).time_s;
        let b = cm.compute(&Work { class, flops: flops + extra, bytes, dtype: DType::Int8, rows: 0.0, slice: 0.0 }).time_s;
        let c = cm.compute(&Work { class, flops, bytes: bytes + extra, dtype: DType::Int8, rows: 0.0, slice: 0.0 }).time_s;
        prop_assert!(b >= a && c >= a);
    }

    #[test]
    fn bigger_messages_and_groups_are_never_cheaper(bytes in 1.0f64..1e9, extra in 0.0f64..1e9, group in 2u32..384, kind in 0usize..5) {
        let cm = cost_model();
        let kind = [CommKind::Dispatch, CommKind::Combine, CommKind::AllReduce, CommKind::AllGather, CommKind::ReduceScatter][kind];
        for mode in [A2aMode::LowLatency, A2aMode::Normal] {
            let t = |bytes, group| cm.comm(&Comm { kind, bytes, group, mode, copies: 0.0 }).time_s;
            prop_assert!(t(bytes + extra, group) >= t(bytes, group));
            prop_assert!(t(bytes, group * 2) >= t(bytes, group) * 0.999);
        }
    }
}

#[test]
fn a_tensor_parallel_grouped_gemm_slows_as_its_slice_narrows_and_falls_back_to_grouped_gemm() {
    let file = |body: &str| {
        format!("name = \"mine\"\nsource = \"test\"\ninherits = \"ascend-910c\"\n{body}")
    };
    // The shipped Ascend file has no entry of its own: the grouped GEMM's prices it.
    let base = user_cost_model("tp-base", &file("")).unwrap();
    let experts = |class, slice| Work {
        class,
        flops: 2.0 * 4096.0 * 8.0 * 3.0 * 7168.0 * slice,
        bytes: 1e6,
        dtype: DType::Int8,
        rows: 128.0,
        slice,
    };
    assert_eq!(
        base.compute(&experts(OpClass::TpGroupedGemm, 256.0)),
        base.compute(&experts(OpClass::GroupedGemm, 256.0))
    );
    let entry = |pad: f64| {
        file(&format!(
            "[efficiency.tp_grouped_gemm]\ncompute = 0.3\nmemory = 0.7\nfixed_us = 0.0\n\
             slice_pad = {pad:?}\nsource = \"test\"\n"
        ))
    };
    let cm = user_cost_model("tp-pad", &entry(256.0)).unwrap();
    let unpadded = user_cost_model("tp-nopad", &entry(0.0)).unwrap();
    // A slice of 256 with 256 of padding computes twice as long as its FLOPs say; one of
    // 2048 an eighth longer. The grouped GEMM (no slice_pad) is untouched.
    for (slice, factor) in [(256.0, 2.0), (2048.0, 1.125)] {
        let w = experts(OpClass::TpGroupedGemm, slice);
        let r = cm.compute(&w).compute_s / unpadded.compute(&w).compute_s;
        assert!((r / factor - 1.0).abs() < 1e-12, "{slice}: {r}");
    }
    assert_eq!(
        cm.compute(&experts(OpClass::GroupedGemm, 256.0)),
        base.compute(&experts(OpClass::GroupedGemm, 256.0))
    );
    let err = user_cost_model(
        "tp-bad",
        &file(
            "[efficiency.tp_grouped_gemm]\ncompute = 0.3\nmemory = 0.7\nslice_pad = -1.0\n\
             source = \"test\"\n",
        ),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("efficiency.tp_grouped_gemm.slice_pad"),
        "{err}"
    );
}

#[test]
fn int4_weights_stream_at_their_own_memory_efficiency() {
    let file = |body: &str| {
        format!("name = \"mine\"\nsource = \"test\"\ninherits = \"ascend-910c\"\n{body}")
    };
    let cm = user_cost_model(
        "int4",
        &file(
            "[efficiency.grouped_gemm]\ncompute = 0.6\nmemory = 0.8\nint4_memory = 0.4\n\
             source = \"test\"\n",
        ),
    )
    .unwrap();
    let experts = |dtype| Work {
        class: OpClass::GroupedGemm,
        flops: 1e6,
        bytes: 1e9,
        dtype,
        rows: 16.0,
        slice: 0.0,
    };
    let int8 = cm.compute(&experts(DType::Int8));
    let int4 = cm.compute(&experts(DType::Int4));
    // Memory-bound: the same bytes at half the efficiency take twice as long; the compute
    // side (int4 unpacks to int8: the same peak) is unchanged.
    assert!((int4.memory_s / int8.memory_s - 2.0).abs() < 1e-12);
    assert_eq!(int4.compute_s, int8.compute_s);
    // Without the entry (the Hopper file has none) int4 weights stream at `memory`.
    let plain = user_cost_model(
        "int4-none",
        "name = \"mine\"\nsource = \"test\"\ninherits = \"nvidia-hopper\"\n",
    )
    .unwrap();
    assert_eq!(
        plain.compute(&experts(DType::Int4)).memory_s,
        plain.compute(&experts(DType::Int8)).memory_s
    );
    let err = user_cost_model(
        "int4-bad",
        &file(
            "[efficiency.grouped_gemm]\ncompute = 0.6\nmemory = 0.8\nint4_memory = 1.5\n\
             source = \"test\"\n",
        ),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("efficiency.grouped_gemm.int4_memory"), "{err}");
}
