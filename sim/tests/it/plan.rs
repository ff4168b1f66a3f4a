//! `plan` on real runs: equivalent layouts tie, the steady window is steady.

use dstwin_sim::plan::{
    rank, run_level, screen, to_seed, Candidate, Engine, LayoutKind, Outcome, PlanInput, Standing,
    Window,
};

fn input(output_tokens: u32) -> PlanInput {
    PlanInput {
        model: "deepseek-r1".into(),
        quant: "w8a8".into(),
        hardware: "atlas-800-a3".into(),
        cards: 16,
        input_tokens: 400,
        output_tokens,
        ttft_ms: Some(5000.0),
        tpot_ms: Some(50.0),
        percentile_slos: vec![],
        acceptance: vec![],
        seed: 1,
        seeds: 3,
        engine: Engine::VllmAscend,
    }
}

/// One prefill node (DP2 x TP8) and one decode node (DP8 x TP2) with `seqs` per rank.
fn layout(seqs: u32, redundant_experts: u32, mtp: u32) -> Candidate {
    Candidate {
        kind: LayoutKind::Disaggregated,
        prefill_nodes: 1,
        decode_nodes: 1,
        prefill_tp: 8,
        decode_tp: 2,
        instance_nodes: 1,
        max_num_seqs: seqs,
        max_num_batched_tokens: seqs * (1 + mtp),
        redundant_experts,
        mtp,
    }
}

/// Screens `layouts` and runs those within reach with every seed, as `dstwin plan` does.
fn plan(p: &PlanInput, layouts: &[Candidate]) -> Vec<Outcome> {
    let mut v: Vec<Outcome> = layouts.iter().map(|c| screen(p, c, 16)).collect();
    loop {
        let pick = to_seed(&v, p.seeds as usize);
        if pick.is_empty() {
            break;
        }
        for i in pick {
            for l in 0..v[i].levels.len() {
                for s in p.seed_list().into_iter().skip(1) {
                    let (m, _) = run_level(p, &v[i].candidate, 16, &v[i].levels[l], s).unwrap();
                    v[i].levels[l].runs.push(m);
                }
            }
            v[i].settle();
        }
    }
    rank(&mut v, p);
    v
}

#[test]
fn the_same_layout_twice_and_two_equivalent_ones_are_tied() {
    let p = input(24);
    // The prefill node bounds these layouts: a decode batch cap of 32 or 48 changes nothing
    // the seeds can tell apart. The third misses the TPOT SLO.
    let a = layout(48, 0, 1);
    let v = plan(&p, &[a, a, layout(32, 0, 1), layout(48, 32, 0)]);
    let standing = |c: &Candidate| -> Vec<Standing> {
        v.iter()
            .filter(|o| &o.candidate == c)
            .map(|o| o.standing)
            .collect()
    };
    let best = v[0].result.as_ref().unwrap().goodput_per_card;
    assert!(best.max > best.min, "three seeds give a spread: {best:?}");
    // The three equivalent layouts share the first rank: whichever has the best mean is
    // `Best`, the other two are tied with it.
    let mut first = standing(&a);
    assert_eq!(first.len(), 2);
    first.extend(standing(&layout(32, 0, 1)));
    assert_eq!(first.len(), 3);
    assert_eq!(
        first.iter().filter(|s| matches!(s, Standing::Best)).count(),
        1,
        "{first:?} {best:?}"
    );
    assert_eq!(
        first.iter().filter(|s| matches!(s, Standing::Tied)).count(),
        2,
        "{first:?} {best:?}"
    );
    for o in &v[..3] {
        assert_eq!(o.rank, Some(1));
        assert!(o.loses_because.is_none());
        assert_eq!(o.result.as_ref().unwrap().seeds, vec![1, 2, 3]);
    }
    let last = &v[3];
    assert_eq!(last.candidate, layout(48, 32, 0));
    assert_ne!(last.standing, Standing::Tied);
    let loss = last.loses_because.as_ref().expect("it loses");
    assert_eq!(loss.reason, "TPOT", "{}", loss.detail);
}

#[test]
fn the_window_is_steady_and_the_warm_up_matters() {
    // Outputs of 300 tokens: requests live about 14 s.
    let p = input(300);
    let o = screen(&p, &layout(48, 0, 1), 16);
    let level = o.levels.iter().find(|l| l.load == 0.9).unwrap();
    let w = level.window;
    assert_eq!(w.warmup_s, 2.0 * o.lifetime_s);
    // Mean goodput per card over the seeds with a warm-up and a measured length.
    let goodput = |warmup_s: f64, measured_s: f64| {
        let mut l = level.clone();
        l.window = Window {
            warmup_s,
            measured_s,
            requests: w.requests * 4,
        };
        let seeds = p.seed_list();
        let sum: f64 = seeds
            .iter()
            .map(|&s| {
                run_level(&p, &o.candidate, 16, &l, s)
                    .unwrap()
                    .0
                    .goodput_per_card
            })
            .sum();
        sum / seeds.len() as f64
    };
    let rule = goodput(w.warmup_s, w.measured_s);
    let long = goodput(w.warmup_s, 4.0 * w.measured_s);
    assert!(
        (rule / long - 1.0).abs() < 0.03,
        "the rule's window ({rule}) measures what a window four times as long does ({long})"
    );
    // From an empty start the decode batch is still filling: without the warm-up the same
    // length measures far less.
    let cold = goodput(0.0, w.measured_s);
    assert!(cold < 0.9 * rule, "no warm-up {cold} vs {rule}");
}

/// The plan input of `cards` of `hardware` in `quant` on engine `name`, the dies per node and
/// every layout the search can pick (at the ends of its batch caps and MTP depths, and between).
fn space(hardware: &str, cards: u32, quant: &str, name: &str) -> (PlanInput, u32, Vec<Candidate>) {
    let p = PlanInput {
        hardware: hardware.into(),
        cards,
        quant: quant.into(),
        engine: Engine::parse(name, hardware).unwrap(),
        ..input(100)
    };
    let (nodes, dies) = dstwin_sim::plan::nodes(hardware, cards).unwrap();
    // Every layout at the smallest and largest batch cap and MTP depth the search tries.
    let caps = dstwin_sim::plan::BATCH_CAPS;
    let depths = dstwin_sim::plan::MTP_DEPTHS;
    let knobs = [
        (caps[0], depths[0]),
        (16, 1),
        (caps[caps.len() - 1], depths[depths.len() - 1]),
    ];
    let layouts = dstwin_sim::plan::shapes(nodes, dies)
        .into_iter()
        .flat_map(|c| knobs.map(|(b, t)| c.with(b, t)))
        .collect();
    (p, dies, layouts)
}

/// Every command `plan` writes, for every layout of A3 (one and four nodes) and H200 (two
/// nodes), uses only flags, JSON keys, values and environment variables its engine documents
/// (`sim/tests/data/engine_flags.toml`, with their origins).
#[test]
fn every_launch_flag_is_one_the_engine_documents() {
    let doc: toml::Table = toml::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/engine_flags.toml"
        ))
        .unwrap(),
    )
    .unwrap();
    let list = |t: &toml::Table, k: &str| -> Vec<String> {
        t.get(k)
            .and_then(|v| v.as_array())
            .map(|a| a.iter().map(|x| x.as_str().unwrap().to_string()).collect())
            .unwrap_or_default()
    };
    // Keys of a JSON value, nested ones joined by '.'.
    fn keys(prefix: &str, v: &serde_json::Value, out: &mut Vec<String>) {
        if let Some(m) = v.as_object() {
            for (k, x) in m {
                let path = format!("{prefix}.{k}");
                if x.is_object() {
                    keys(&path, x, out);
                } else {
                    out.push(path);
                }
            }
        }
    }
    let mut checked = 0;
    let mut tables_seen = std::collections::BTreeSet::new();
    for (hardware, cards, quant, name, table) in [
        ("atlas-800-a3", 32, "w8a8", "vllm", "vllm_ascend"),
        ("atlas-800-a3", 8, "w8a8", "vllm", "vllm_ascend"),
        ("nvidia-h200-8", 16, "fp8", "vllm", "vllm"),
        ("atlas-800-a3", 32, "w8a8", "sglang", "sglang_npu"),
        ("nvidia-h200-8", 16, "fp8", "sglang", "sglang"),
    ] {
        let doc = doc[table].as_table().unwrap();
        let (p, dies, cands) = space(hardware, cards, quant, name);
        tables_seen.insert(format!("{:?}", p.engine));
        for c in cands {
            for (role, cmd) in c.launch_args(&p, dies, "deepseek-r1") {
                let mut parts = cmd.split(" \\\n  ");
                let head = parts.next().unwrap();
                let program = list(doc, "heads")
                    .into_iter()
                    .find(|h| head.contains(h.as_str()))
                    .unwrap_or_else(|| panic!("{table}: {head}"));
                let (env, rest) = head.split_once(program.as_str()).unwrap();
                for e in env.split_whitespace() {
                    assert!(list(doc, "env").contains(&e.to_string()), "{table} env {e}");
                }
                let rest = rest.trim();
                assert!(
                    rest.is_empty() || rest.starts_with("${MODEL_PATH:?"),
                    "{rest}"
                );
                for part in parts {
                    let (flag, value) = part.split_once(' ').unwrap_or((part, ""));
                    assert!(
                        list(doc, "flags").contains(&flag.to_string()),
                        "{table}: {flag} ({role} of {})",
                        c.label()
                    );
                    let name = flag.trim_start_matches("--").replace('-', "_");
                    if let Some(json) = value.strip_prefix('\'') {
                        let v: serde_json::Value =
                            serde_json::from_str(json.strip_suffix('\'').unwrap())
                                .unwrap_or_else(|e| panic!("{flag} {value}: {e}"));
                        let mut found = Vec::new();
                        keys(&name, &v, &mut found);
                        for k in found {
                            assert!(list(doc, "json_keys").contains(&k), "{table}: {k}");
                        }
                        for (k, allowed) in
                            [("kv_connector", "kv_connector"), ("kv_role", "kv_role")]
                        {
                            if let Some(x) = v.get(k).and_then(|x| x.as_str()) {
                                assert!(list(doc, allowed).contains(&x.to_string()), "{k} {x}");
                            }
                        }
                    } else if doc.contains_key(&name) {
                        assert!(
                            list(doc, &name).contains(&value.to_string()),
                            "{flag} {value}"
                        );
                    }
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(
        tables_seen.len(),
        4,
        "every engine checked: {tables_seen:?}"
    );
    assert!(checked > 10000, "{checked}");
}

/// What each candidate's scenario simulates is what its launch commands ask the engine for: the
/// MoE communication mode, micro-batches, the EPLB cycle, send-back on KV exhaustion and the
/// batch limits, instance by instance, on every engine.
#[test]
fn launch_commands_ask_for_what_the_scenario_simulates() {
    let line = |block: &str, key: &str| -> Option<String> {
        block
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key} = ")))
            .map(|v| v.trim_matches('"').to_string())
    };
    let mut checked = 0;
    for (hardware, cards, quant, name) in [
        ("atlas-800-a3", 32, "w8a8", "vllm"),
        ("atlas-800-a3", 32, "w8a8", "sglang"),
        ("nvidia-h200-8", 16, "fp8", "vllm"),
        ("nvidia-h200-8", 16, "fp8", "sglang"),
    ] {
        let (p, dies, cands) = space(hardware, cards, quant, name);
        let engine = p.engine;
        for c in cands {
            let text = c.scenario(
                &p,
                dies,
                dstwin_sim::plan::Load::Closed(dstwin_sim::plan::Generations::new(8)),
                1,
            );
            let eplb = text.split("[[instance]]").next().unwrap();
            let blocks: Vec<&str> = text.split("[[instance]]").skip(1).collect();
            let cmds = c.launch_args(&p, dies, "m");
            for (block, (role, cmd)) in blocks.iter().zip(&cmds) {
                let what = format!("{engine:?} {role} of {}", c.label());
                let has = |s: &str| cmd.contains(s);
                match line(block, "moe_comm").as_deref() {
                    None => assert!(!has("deepep") && !has("all2all"), "{what}"),
                    Some("mc2") => assert!(
                        has("--all2all-backend deepep_low_latency")
                            || has("--deepep-mode low_latency"),
                        "{what}"
                    ),
                    Some("alltoall") => assert!(
                        has("--all2all-backend deepep_high_throughput")
                            || has("--deepep-mode normal"),
                        "{what}"
                    ),
                    Some("auto") => assert!(has("--deepep-mode auto"), "{what}"),
                    Some(x) => panic!("{what}: moe_comm {x}"),
                }
                let overlap = has("--enable-dbo")
                    || has("\"num_ubatches\": 2")
                    || has("--enable-two-batch-overlap");
                let tmb = line(block, "two_microbatch");
                assert_eq!(overlap, tmb.is_some(), "{what}: two_microbatch {tmb:?}");
                if has("--enable-two-batch-overlap") {
                    assert_eq!(tmb.as_deref(), Some("force"), "{what}");
                }
                // The recompute scheduler is turned on on both sides of a layout whose decode
                // sends work back (vllm-ascend's PD tutorials).
                let send_back = text.contains("preemption = \"send_back\"");
                assert_eq!(send_back, has("recompute_scheduler_enable"), "{what}");
                let seqs: u32 = line(block, "max_num_seqs").unwrap().parse().unwrap();
                let budget: u32 = line(block, "max_num_batched_tokens")
                    .unwrap()
                    .parse()
                    .unwrap();
                let tp: u32 = line(block, "tp").unwrap().parse().unwrap();
                let inst_dies: u32 = line(block, "dies").unwrap().parse().unwrap();
                let dp = inst_dies / tp;
                if cmd.contains("vllm serve") {
                    assert!(has(&format!("--max-num-seqs {seqs} ")), "{what}");
                    assert!(
                        has(&format!("--max-num-batched-tokens {budget} ")),
                        "{what}"
                    );
                    assert!(has(&format!("--data-parallel-size {dp} ")), "{what}");
                    assert!(has(&format!("--tensor-parallel-size {tp} ")), "{what}");
                } else {
                    assert!(
                        has(&format!("--max-running-requests {} ", seqs * dp)),
                        "{what}"
                    );
                    assert!(has(&format!("--tp-size {inst_dies} ")), "{what}");
                    assert_eq!(dp > 1, has(&format!("--dp-size {dp} ")), "{what}");
                }
                // The EPLB cycle.
                if let Some(heat) = line(eplb, "heat_interval") {
                    let heat: u32 = heat.parse().unwrap();
                    let algo: u32 = line(eplb, "algorithm_interval").unwrap().parse().unwrap();
                    let asked = match engine {
                        Engine::VllmAscend => format!(
                            "\"expert_heat_collection_interval\": {heat}, \"algorithm_execution_interval\": {algo}"
                        ),
                        Engine::Vllm => format!(
                            "\"window_size\": {heat}, \"step_interval\": {}",
                            heat + algo
                        ),
                        Engine::SglangNpu | Engine::Sglang => {
                            format!("--eplb-rebalance-num-iterations {heat}")
                        }
                    };
                    assert!(has(&asked), "{what}: {asked}");
                    assert!(c.redundant_experts > 0);
                } else {
                    assert_eq!(c.redundant_experts, 0);
                    assert!(!has("eplb\": true") && !has("--enable-eplb"), "{what}");
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 700, "{checked}");
}
