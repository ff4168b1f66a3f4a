//! The simulator's virtual-time driver and `serve --device twin` (the wall-clock runtime) run
//! the same scheduler code on the same device: given the same requests, they must plan the same
//! steps with the same batches and durations, and the runtime's wall time must follow the
//! predicted time times the time scale.

use dstwin_runtime::{Out, Submit};
use dstwin_sim::run::{run, RunOptions};
use dstwin_sim::scenario::load_path;
use dstwin_sim::serve::{start, TwinServe};
use dstwin_traces::WorkloadSource;
use std::path::Path;
use std::time::Instant;

#[tokio::test(flavor = "current_thread")]
async fn serve_twin_plans_the_simulators_steps() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/conformance.toml");
    let s = load_path(&path, &[]).expect("scenario");

    // Virtual time: the timeline holds one span per step (name "step N tok", lane = instance).
    let sim = run(
        &s,
        RunOptions {
            timeline: true,
            ..Default::default()
        },
    )
    .expect("simulate");
    let sim_steps: Vec<(u64, u64)> = sim
        .timeline
        .iter()
        .filter(|sp| sp.name.starts_with("step"))
        .map(|sp| (sp.tokens, sp.dur.0))
        .collect();
    assert!(sim_steps.len() > 20, "a schedule worth comparing");

    // Wall-clock time, the same requests in the same order, all at once.
    let WorkloadSource::Open(w) = s.workload.build(s.seed, &s.base_dir).expect("workload") else {
        panic!("an open workload");
    };
    let scale = 0.2;
    let rt = start(
        &s,
        TwinServe {
            model: "m".into(),
            time_scale: scale,
            max_pending: 1000,
            record_steps: true,
        },
    )
    .expect("runtime");
    let t0 = Instant::now();
    // On a current-thread runtime the instance task runs only once this test awaits: every
    // request is queued before the first step, as the simulator applies same-instant arrivals
    // before planning.
    let mut streams: Vec<_> = w
        .requests()
        .iter()
        .map(|r| {
            rt.submit(Submit {
                prompt_tokens: r.input_tokens,
                max_tokens: r.output_tokens,
            })
            .expect("admitted")
        })
        .collect();
    let mut tokens = 0u64;
    for st in &mut streams {
        while let Some(o) = st.next().await {
            match o {
                Out::Tokens(n) => tokens += n as u64,
                Out::Finished => break,
            }
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    assert_eq!(tokens, sim.report.output_tokens, "every token streamed");

    let rt_steps: Vec<(u64, u64)> = rt
        .steps()
        .iter()
        .map(|r| (r.rank_tokens.iter().sum(), r.duration.0))
        .collect();
    assert_eq!(rt_steps.len(), sim_steps.len(), "step count");
    for (k, (a, b)) in rt_steps.iter().zip(&sim_steps).enumerate() {
        assert_eq!(
            a, b,
            "step {k}: (tokens, predicted ns) runtime vs simulator"
        );
    }
    // Timing: the runtime waits each predicted step times the scale (plus host overhead).
    let expected = sim.report.simulated_s * scale;
    assert!(
        wall >= expected * 0.95 && wall <= expected * 1.5 + 0.1,
        "wall {wall:.3} s vs predicted {expected:.3} s"
    );
}
