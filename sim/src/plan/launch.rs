//! The engine a plan's layouts run on: what it sets in each candidate's scenario, and the
//! commands that launch the candidate on it. Each engine's flags are the ones its documentation
//! gives (checked against `sim/tests/data/engine_flags.toml` by a test).

use super::{Candidate, InstanceKind, LayoutKind, PlanInput};
use dstwin_core::layout::Role;
use dstwin_hwmodels::Catalog;
use serde::Serialize;

/// The engine a plan's layouts run on and its launch commands are written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    /// vLLM with the vllm-ascend plugin, on Huawei Ascend.
    VllmAscend,
    /// vLLM, on NVIDIA GPUs.
    Vllm,
    /// SGLang on Ascend NPUs (`--device npu`), as its Ascend best-practice page runs DeepSeek.
    SglangNpu,
    /// SGLang, on NVIDIA GPUs.
    Sglang,
}

impl Engine {
    /// The default engine of a built-in system: vLLM (vllm-ascend on Ascend).
    pub fn of(hardware: &str) -> Result<Engine, String> {
        Engine::parse("vllm", hardware)
    }

    /// `vllm` or `sglang` on a built-in system, or why not.
    pub fn parse(name: &str, hardware: &str) -> Result<Engine, String> {
        let sys = Catalog::builtin()
            .system(hardware)
            .map_err(|e| e.to_string())?;
        let ascend = match sys.chip.vendor.as_str() {
            "Huawei" => true,
            "NVIDIA" => false,
            v => {
                return Err(format!(
                    "--hardware {hardware}: no launch commands for chips of {v}"
                ))
            }
        };
        match (name, ascend) {
            ("vllm", true) => Ok(Engine::VllmAscend),
            ("vllm", false) => Ok(Engine::Vllm),
            ("sglang", true) => Ok(Engine::SglangNpu),
            ("sglang", false) => Ok(Engine::Sglang),
            _ => Err(format!(
                "--engine {name}: unknown engine (vllm: vllm-ascend on Ascend, vLLM on GPUs; or sglang)"
            )),
        }
    }

    /// As reports name it.
    pub fn name(self) -> &'static str {
        match self {
            Engine::VllmAscend => "vllm-ascend",
            Engine::Vllm => "vLLM",
            Engine::SglangNpu => "SGLang (Ascend NPU)",
            Engine::Sglang => "SGLang",
        }
    }

    fn ascend(self) -> bool {
        matches!(self, Engine::VllmAscend | Engine::SglangNpu)
    }

    /// The dynamic EPLB cycle of planned layouts with redundant experts, as the twin's
    /// `heat_interval` and `algorithm_interval` (steps):
    /// - vllm-ascend's defaults (eplb_swift_balancer.md: heat 600 steps, the algorithm 50,
    ///   then one layer moved a step);
    /// - vLLM's (EPLBConfig: the load of the last `window_size` 1000 steps, re-placed every
    ///   `step_interval` 3000): 1000 steps of heat, then 2000 before the moves, so that
    ///   placements are as old and as frequent;
    /// - SGLang's (`--eplb-rebalance-num-iterations` 1000 over the recorder's window): 1000
    ///   steps of heat, re-placed at the next.
    ///
    /// The twin moves one layer a step where vLLM and SGLang move them all at once.
    pub(super) fn eplb_cycle(self) -> (u32, u32) {
        match self {
            Engine::VllmAscend => (600, 50),
            Engine::Vllm => (1000, 2000),
            Engine::SglangNpu | Engine::Sglang => (1000, 1),
        }
    }

    /// The lines the engine sets in an instance of `role`: its instance table (before
    /// `[instance.scheduler]`) and its scheduler table.
    ///
    /// - vllm-ascend picks the MoE communication per step (`moe_comm` auto), splits prefill
    ///   steps into two micro-batches (`num_ubatches` 2) and sends decode work back to prefill
    ///   when decode KV runs out (the recompute scheduler).
    /// - vLLM on GPUs has one DeepEP mode per instance (`--all2all-backend`): high-throughput
    ///   with micro-batches (`--enable-dbo`) for prefill, low-latency (the kernels CUDA graphs
    ///   capture) for decode and mixed instances; KV exhaustion preempts in place.
    /// - SGLang: `--deepep-mode normal` for prefill (with two-batch overlap on GPUs, which it
    ///   applies to every step), `low_latency` for decode, `auto` for mixed; requests reach DP
    ///   ranks round-robin and start as SGLang's admission lets them; a mixed instance runs
    ///   its prompts in batches of their own (no `--enable-mixed-chunk`); KV exhaustion
    ///   retracts requests in place.
    pub(super) fn scenario_lines(self, role: Role) -> (String, String) {
        let comm = |c: &str| format!("moe_comm = \"{c}\"\n");
        let (instance, sched) = match (self, role) {
            (Engine::VllmAscend, Role::Prefill) => ("two_microbatch = true\n".into(), ""),
            (Engine::VllmAscend, Role::Decode) => (String::new(), "preemption = \"send_back\"\n"),
            (Engine::VllmAscend, Role::Mixed) => (String::new(), ""),
            (Engine::Vllm, Role::Prefill) => {
                (format!("two_microbatch = true\n{}", comm("alltoall")), "")
            }
            (Engine::Vllm, Role::Decode | Role::Mixed) => {
                (comm("mc2"), "preemption = \"recompute\"\n")
            }
            (Engine::Sglang, Role::Prefill) => (
                format!("two_microbatch = \"force\"\n{}", comm("alltoall")),
                "",
            ),
            (Engine::SglangNpu, Role::Prefill) => (comm("alltoall"), ""),
            (_, Role::Decode) => (comm("mc2"), "preemption = \"recompute\"\n"),
            (_, Role::Mixed) => (comm("auto"), "preemption = \"recompute\"\n"),
        };
        let sglang = matches!(self, Engine::SglangNpu | Engine::Sglang);
        let rr = if sglang {
            "dp_dispatch = \"round_robin\"\nadmission = \"sglang\"\n"
        } else {
            ""
        };
        // SGLang without --enable-mixed-chunk (the commands never pass it) batches prompts
        // apart from decodes.
        let separate = if sglang && role == Role::Mixed {
            "separate_prefill_batches = true\n"
        } else {
            ""
        };
        (instance, format!("{sched}{rr}{separate}"))
    }
}

/// Continuation of a command line.
const NL: &str = " \\\n  ";

impl Candidate {
    /// The launch command of each instance for the plan's engine, serving the model as
    /// `served` (its own name: a config.json's, not its path), titled by role. An instance
    /// over more than one node is started on each node; the command is the first node's.
    pub fn launch_args(
        &self,
        p: &PlanInput,
        dies_per_node: u32,
        served: &str,
    ) -> Vec<(String, String)> {
        match p.engine {
            Engine::VllmAscend | Engine::Vllm => self.vllm_commands(p, dies_per_node, served),
            Engine::SglangNpu | Engine::Sglang => self.sglang_commands(p, dies_per_node, served),
        }
    }

    /// The title of an instance kind's command.
    fn title(&self, k: &InstanceKind) -> String {
        let s = |n: u32| if n == 1 { "" } else { "s" };
        match k.role {
            Role::Prefill => format!("prefill (x{} instances, one node each)", k.count),
            Role::Decode => format!("decode ({} node{})", k.nodes, s(k.nodes)),
            Role::Mixed => format!(
                "mixed ({} instance{} of {} node{})",
                k.count,
                s(k.count),
                k.nodes,
                s(k.nodes)
            ),
        }
    }

    /// `vllm serve` as vllm-ascend takes it on Ascend (`--additional-config`, the Mooncake
    /// connector, `DYNAMIC_EPLB=true` for dynamic EPLB) or as vLLM takes it on GPUs
    /// (`--enable-eplb`, `--all2all-backend`, the NIXL connector, `--enable-dbo`). Other nodes
    /// of a multi-node instance add `--headless --data-parallel-start-rank`.
    fn vllm_commands(
        &self,
        p: &PlanInput,
        dies_per_node: u32,
        served: &str,
    ) -> Vec<(String, String)> {
        let ascend = p.engine.ascend();
        let max_len = p.max_model_len();
        let eplb = self.redundant_experts > 0;
        let (heat, algo) = p.engine.eplb_cycle();
        let env = if ascend && eplb {
            "DYNAMIC_EPLB=true "
        } else {
            ""
        };
        let pd = self.kind == LayoutKind::Disaggregated;
        let kv = |role: Role| {
            let cfg = if ascend {
                format!(
                    "{{\"kv_connector\": \"MooncakeConnectorV1\", \"kv_role\": \"{}\", \"kv_connector_extra_config\": {{\"prefill\": {{\"dp_size\": {}, \"tp_size\": {}}}, \"decode\": {{\"dp_size\": {}, \"tp_size\": {}}}}}}}",
                    if role == Role::Prefill { "kv_producer" } else { "kv_consumer" },
                    dies_per_node / self.prefill_tp,
                    self.prefill_tp,
                    self.decode_nodes * dies_per_node / self.decode_tp,
                    self.decode_tp
                )
            } else {
                // vLLM's NIXL connector: prefill and decode alike are kv_both (the proxy in
                // front tells them apart), so `role` does not enter.
                "{\"kv_connector\": \"NixlConnector\", \"kv_role\": \"kv_both\"}".to_string()
            };
            format!("--kv-transfer-config '{cfg}'")
        };
        self.kinds()
            .into_iter()
            .map(|k| {
                let InstanceKind { role, nodes, tp, seqs, budget, .. } = k;
                let mut a = vec![
                    format!("--served-model-name {served}"),
                    format!("--data-parallel-size {}", nodes * dies_per_node / tp),
                ];
                if nodes > 1 {
                    // The first node's ranks; the others add `--headless
                    // --data-parallel-start-rank` (node index x local ranks).
                    a.push(format!("--data-parallel-size-local {}", dies_per_node / tp));
                    a.push("--data-parallel-address ${DP_ADDRESS:?the first node}".into());
                    a.push("--data-parallel-rpc-port 13345".into());
                }
                a.push(format!("--tensor-parallel-size {tp}"));
                a.push("--enable-expert-parallel".into());
                a.push(format!("--max-num-seqs {seqs}"));
                a.push(format!("--max-num-batched-tokens {budget}"));
                a.push(format!("--max-model-len {max_len}"));
                a.push("--no-enable-prefix-caching".into());
                if ascend && p.quant != "bf16" {
                    // GPU checkpoints carry their quantization in config.json; vllm-ascend's
                    // msModelSlim ones are named by this flag.
                    a.push("--quantization ascend".into());
                }
                if self.mtp > 0 {
                    a.push(format!(
                        "--speculative-config '{{\"num_speculative_tokens\": {}, \"method\": \"mtp\"}}'",
                        self.mtp
                    ));
                }
                if ascend {
                    let mut extra = Vec::new();
                    if pd {
                        // The recompute scheduler (decode KV short: back to prefill).
                        extra.push("\"recompute_scheduler_enable\": true".to_string());
                    }
                    if role == Role::Prefill {
                        extra.push("\"num_ubatches\": 2".to_string());
                    }
                    extra.push(format!(
                        "\"eplb_config\": {}",
                        if eplb {
                            format!(
                                "{{\"dynamic_eplb\": true, \"expert_heat_collection_interval\": {heat}, \"algorithm_execution_interval\": {algo}, \"num_redundant_experts\": {}}}",
                                self.redundant_experts
                            )
                        } else {
                            "{\"dynamic_eplb\": false}".to_string()
                        }
                    ));
                    a.push(format!("--additional-config '{{{}}}'", extra.join(", ")));
                } else {
                    if eplb {
                        a.push("--enable-eplb".into());
                        a.push(format!(
                            "--eplb-config '{{\"window_size\": {heat}, \"step_interval\": {}, \"num_redundant_experts\": {}}}'",
                            heat + algo,
                            self.redundant_experts
                        ));
                    }
                    let mode = if role == Role::Prefill {
                        "deepep_high_throughput"
                    } else {
                        "deepep_low_latency"
                    };
                    a.push(format!("--all2all-backend {mode}"));
                    if role == Role::Prefill {
                        a.push("--enable-dbo".into());
                    }
                }
                if pd {
                    a.push(kv(role));
                }
                let cmd = format!(
                    "{env}vllm serve ${{MODEL_PATH:?the {served} {q} weights}}{NL}{}",
                    a.join(NL),
                    q = p.quant,
                );
                (self.title(&k), cmd)
            })
            .collect()
    }

    /// `python3 -m sglang.launch_server` as SGLang takes it (its server arguments; on Ascend
    /// as its Ascend best-practice page runs DeepSeek: `--device npu --attention-backend
    /// ascend`, `--quantization modelslim`, the `ascend` transfer backend), and for PD the
    /// router in front. `--max-running-requests` and `--chunked-prefill-size` are per
    /// instance (SGLang divides them over the DP ranks of DP attention). Other nodes of a
    /// multi-node instance run the same command with their `--node-rank`.
    fn sglang_commands(
        &self,
        p: &PlanInput,
        dies_per_node: u32,
        served: &str,
    ) -> Vec<(String, String)> {
        let npu = p.engine.ascend();
        let max_len = p.max_model_len();
        let (heat, _) = p.engine.eplb_cycle();
        let pd = self.kind == LayoutKind::Disaggregated;
        let mut v: Vec<(String, String)> = self
            .kinds()
            .into_iter()
            .map(|k| {
                let InstanceKind {
                    role,
                    nodes,
                    tp,
                    seqs,
                    budget,
                    ..
                } = k;
                let dies = nodes * dies_per_node;
                let dp = dies / tp;
                let mut a = vec![
                    format!(
                        "--model-path ${{MODEL_PATH:?the {served} {} weights}}",
                        p.quant
                    ),
                    format!("--served-model-name {served}"),
                ];
                if npu {
                    a.push("--device npu".into());
                    a.push("--attention-backend ascend".into());
                }
                a.push(format!("--tp-size {dies}"));
                if dp > 1 {
                    a.push(format!("--dp-size {dp}"));
                    a.push("--enable-dp-attention".into());
                }
                if nodes > 1 {
                    a.push(format!("--nnodes {nodes}"));
                    a.push("--node-rank 0".into());
                    a.push("--dist-init-addr ${MASTER_ADDR:?the first node}:5000".into());
                }
                let mode = match role {
                    Role::Prefill => "normal",
                    Role::Decode => "low_latency",
                    Role::Mixed => "auto",
                };
                a.push("--moe-a2a-backend deepep".into());
                a.push(format!("--deepep-mode {mode}"));
                a.push(format!("--max-running-requests {}", seqs * dp));
                if role != Role::Decode {
                    a.push(format!("--chunked-prefill-size {}", budget * dp));
                }
                a.push(format!("--context-length {max_len}"));
                a.push("--disable-radix-cache".into());
                if npu && p.quant != "bf16" {
                    a.push("--quantization modelslim".into());
                }
                if self.mtp > 0 {
                    a.push("--speculative-algorithm NEXTN".into());
                    a.push(format!("--speculative-num-steps {}", self.mtp));
                    a.push("--speculative-eagle-topk 1".into());
                    a.push(format!("--speculative-num-draft-tokens {}", self.mtp + 1));
                }
                if self.redundant_experts > 0 {
                    a.push("--enable-eplb".into());
                    a.push(format!(
                        "--ep-num-redundant-experts {}",
                        self.redundant_experts
                    ));
                    a.push(format!("--eplb-rebalance-num-iterations {heat}"));
                }
                if role == Role::Prefill && !npu {
                    a.push("--enable-two-batch-overlap".into());
                }
                if pd {
                    a.push(format!(
                        "--disaggregation-mode {}",
                        if role == Role::Prefill {
                            "prefill"
                        } else {
                            "decode"
                        }
                    ));
                    a.push(format!(
                        "--disaggregation-transfer-backend {}",
                        if npu { "ascend" } else { "mooncake" }
                    ));
                }
                (
                    self.title(&k),
                    format!("python3 -m sglang.launch_server{NL}{}", a.join(NL)),
                )
            })
            .collect();
        if pd {
            let mut a = vec!["--pd-disaggregation".to_string()];
            for i in 1..=self.prefill_nodes {
                a.push(format!(
                    "--prefill http://${{PREFILL_{i}:?prefill node {i}}}:30000"
                ));
            }
            a.push("--decode http://${DECODE:?the first decode node}:30000".into());
            a.push("--host 0.0.0.0".into());
            a.push("--port 8000".into());
            v.push((
                "router".to_string(),
                format!("python3 -m sglang_router.launch_router{NL}{}", a.join(NL)),
            ));
        }
        v
    }
}
