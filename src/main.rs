//! The dstwin command line: parses arguments and hands off to the library crates.

mod bench_cmd;
mod calibrate_cmd;
mod calibrate_trace_cmd;
mod eplb_cmd;
mod explain_cmd;
mod init_weights_cmd;
mod output;
mod plan_cmd;
mod progress;
mod report_cmd;
mod serve_cmd;
mod simulate_cmd;
mod sweep_cmd;
mod validate_cmd;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// dstwin: a digital twin of DeepSeek inference on Huawei Ascend hardware.
#[derive(Parser)]
#[command(name = "dstwin", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Simulate a deployment serving a workload (a scenario file; without one, the built-in
    /// default): TTFT, TPOT, ITL, throughput per card, goodput, KV use, where the time goes.
    Simulate(Box<simulate_cmd::SimulateArgs>),
    /// Simulate a grid of what-if variations of a scenario in parallel: CSV/JSON rows, Pareto
    /// fronts of throughput per card against TPOT and TTFT, a summary; resumable and shardable.
    Sweep(Box<sweep_cmd::SweepArgs>),
    /// Search disaggregated (PD) and aggregated layouts of a model on N cards for the best
    /// goodput per card under SLOs and print their launch commands (vllm-ascend, vLLM or
    /// SGLang).
    Plan(Box<plan_cmd::PlanArgs>),
    /// Regenerate a sweep's fronts, plots and summary, or merge the shards of a study.
    Report(report_cmd::ReportArgs),
    /// Price one forward step of one instance: time by op class and layer, what bounds each op,
    /// two-micro-batch overlap, the memory map per die and the roofline limit.
    Explain(Box<explain_cmd::ExplainArgs>),
    /// Place experts (with redundant replicas) from an expert heat map: balancedness before and
    /// after, and the placement as JSON.
    Eplb(eplb_cmd::EplbArgs),
    /// Fit the cost models to published figures (all-to-all, MTP acceptance, global parameters,
    /// routing concentration) and print every error; or, with --trace, to profiler traces.
    Calibrate(Box<calibrate_cmd::CalibrateArgs>),
    /// Serve an OpenAI-compatible API on the shared scheduler with the twin as the device: an
    /// emulated deployment whose every step takes the time the twin predicts.
    Serve(Box<serve_cmd::ServeArgs>),
    /// Load-test an OpenAI-compatible server (dstwin serve, vLLM, vllm-ascend): TTFT, TPOT, ITL
    /// and throughput, as `vllm bench serve` reports them.
    BenchServe(Box<bench_cmd::BenchArgs>),
    /// Compare the twin with every published figure it is calibrated on, or with your own
    /// cluster's measurements (`--measured`): errors, mean absolute error, `--max-error` for CI.
    Validate(validate_cmd::ValidateArgs),
    /// Write a DeepSeek-V3-shaped checkpoint with random weights (config.json,
    /// model.safetensors, tokenizer.json) for the CPU engine, deterministically from a seed.
    InitWeights(init_weights_cmd::InitWeightsArgs),
    /// List the built-in models, hardware systems and chips.
    Catalog {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// A failure caused by the user's input (exit code 2) or by the environment (exit code 1).
pub enum Failure {
    Input(anyhow::Error),
    Runtime(anyhow::Error),
    /// The reader of standard output went away (`| head`): nothing is left to say (exit 0).
    OutputClosed,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Simulate(a) => simulate_cmd::run_cmd(*a),
        Command::Explain(a) => explain_cmd::run(*a),
        Command::Sweep(a) => sweep_cmd::run(*a),
        Command::Plan(a) => plan_cmd::run(*a),
        Command::Report(a) => report_cmd::run(a),
        Command::Calibrate(a) => calibrate_cmd::run(*a),
        Command::Eplb(a) => eplb_cmd::run(a),
        Command::Serve(a) => serve_cmd::run(*a),
        Command::BenchServe(a) => bench_cmd::run(*a),
        Command::Validate(a) => validate_cmd::run(a),
        Command::InitWeights(a) => init_weights_cmd::run(a),
        Command::Catalog { json } => explain_cmd::catalog(json),
    };
    match result {
        Ok(()) | Err(Failure::OutputClosed) => ExitCode::SUCCESS,
        Err(Failure::Input(e)) => {
            crate::output::errln!("error: {e:#}");
            ExitCode::from(2)
        }
        Err(Failure::Runtime(e)) => {
            crate::output::errln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
