//! One conformance suite, two drivers: the simulator's virtual-time loop and `serve --device
//! twin` (the wall-clock runtime) drive the same deployment core on the same twin devices and
//! fabric. Given the same requests they must plan the same steps — every rank's shape, every
//! scheduled sequence, in the same order, with the same predicted durations — stream every
//! request's tokens, and take wall time that follows the predicted time times the time scale.
//!
//! Scenarios: a mixed instance with MTP and skewed experts; and PD with prefix hits on the
//! prefill instance (a trace whose requests share prefixes; the runtime gets token ids built
//! from the trace's hash ids, so its prefix cache hashes real tokens), KV transfers over shared
//! links, a decode instance that runs out of KV and sends requests back, async scheduling on
//! decode, and MTP.

use dstwin_runtime::{Out, Submit};
use dstwin_sim::run::{run, RunOptions};
use dstwin_sim::scenario::load_path;
use dstwin_sim::serve::{start, TwinServe};
use dstwin_traces::WorkloadSource;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

/// Token ids for a prompt whose `hash_block_tokens`-token chunks carry `hash_ids`: equal ids give
/// equal chunks and different ids different ones, so shared trace prefixes become shared token
/// prefixes and nothing else is shared.
fn tokens_from_hashes(len: u32, hash_ids: &[u64], chunk: u32) -> Vec<u32> {
    (0..len)
        .map(|t| {
            let h = hash_ids[(t / chunk) as usize];
            u32::try_from(h * chunk as u64 + (t % chunk) as u64).expect("small test ids")
        })
        .collect()
}

async fn conforms(file: &str, scale: f64) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(file);
    let s = load_path(&path, &[]).expect("scenario");

    // Step by step, the simulator lists every sampling sequence in its plans, as the runtime
    // (which streams every request's tokens) does; advancing steady decoders in aggregate must
    // give the same shapes and durations.
    let sim = run(
        &s,
        RunOptions {
            record_steps: true,
            per_request: true,
            step_by_step: true,
            ..Default::default()
        },
    )
    .expect("simulate");
    let aggregated = run(
        &s,
        RunOptions {
            record_steps: true,
            ..Default::default()
        },
    )
    .expect("simulate");
    let shapes = |steps: &[dstwin_core::deploy::StepRecord]| -> Vec<_> {
        steps
            .iter()
            .map(|r| {
                let shapes: Vec<_> = r.plan.ranks.iter().map(|k| k.shape).collect();
                (r.instance, shapes, r.duration)
            })
            .collect()
    };
    assert_eq!(
        shapes(&aggregated.steps),
        shapes(&sim.steps),
        "{file}: aggregated vs step-by-step shapes"
    );
    assert!(sim.steps.len() > 20, "{file}: a schedule worth comparing");
    let sim_tokens: BTreeMap<u64, u64> = sim
        .requests
        .iter()
        .map(|r| (r.id, r.output_tokens as u64))
        .collect();

    // Wall-clock time, the same requests in the same order, all at once.
    let WorkloadSource::Open(w) = s.workload.build(s.seed, &s.base_dir).expect("workload") else {
        panic!("an open workload");
    };
    let w = w.into_workload().expect("workload");
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
    // On a current-thread runtime the control task runs only once this test awaits: every
    // request is queued before the first step, as the simulator applies same-instant arrivals
    // before planning.
    let mut streams: Vec<_> = w
        .requests()
        .iter()
        .map(|r| {
            let token_ids = w
                .hash_block_tokens()
                .map(|chunk| tokens_from_hashes(r.input_tokens, w.hash_ids(r), chunk));
            rt.submit(Submit {
                prompt_tokens: r.input_tokens,
                max_tokens: r.output_tokens,
                token_ids,
                sampling: None,
                parent: None,
            })
            .expect("admitted")
        })
        .collect();
    let mut rt_tokens = BTreeMap::new();
    for st in &mut streams {
        let mut n = 0u64;
        while let Some(o) = st.next().await {
            match o {
                Out::Tokens { n: k, .. } => n += k as u64,
                Out::Finished(_) => break,
            }
        }
        rt_tokens.insert(st.id, n);
    }
    let wall = t0.elapsed().as_secs_f64();
    assert_eq!(rt_tokens, sim_tokens, "{file}: tokens per request");

    // The last steps may still be running when the last token is out (async scheduling's
    // discarded step): wait until every recorded step has come back.
    let mut rt_steps = rt.steps();
    for _ in 0..500 {
        if rt_steps.len() >= sim.steps.len() && rt_steps.iter().all(|r| r.duration.0 > 0) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        rt_steps = rt.steps();
    }
    assert_eq!(rt_steps.len(), sim.steps.len(), "{file}: step count");
    for (k, (a, b)) in rt_steps.iter().zip(&sim.steps).enumerate() {
        if a != b {
            // Name the first rank that differs rather than printing two whole plans.
            let rank = a
                .plan
                .ranks
                .iter()
                .zip(&b.plan.ranks)
                .position(|(x, y)| x != y);
            panic!(
                "{file}: step {k} of instance {} (simulator: instance {}): rank {rank:?}\n runtime: {:?}\n simulator: {:?}\n durations {:?} vs {:?}",
                a.instance,
                b.instance,
                rank.map(|r| &a.plan.ranks[r]),
                rank.map(|r| &b.plan.ranks[r]),
                a.duration,
                b.duration
            );
        }
    }
    // Timing: the runtime waits each predicted step times the scale (plus host overhead).
    let expected = sim.report.simulated_s * scale;
    assert!(
        wall >= expected * 0.95 && wall <= expected * 1.5 + 0.2,
        "{file}: wall {wall:.3} s vs predicted {expected:.3} s"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn mixed_with_mtp_and_skewed_experts() {
    conforms("conformance.toml", 0.2).await;
}

#[tokio::test(flavor = "current_thread")]
async fn pd_with_prefix_hits_send_back_async_and_mtp() {
    conforms("conformance-pd.toml", 0.2).await;
}
