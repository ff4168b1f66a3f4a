//! The instance scheduler follows vLLM v1's rules. Invariants (no request both waiting and
//! running, blocks conserved, tokens conserved) are checked inside every schedule/update in
//! debug builds, which is how these tests run.

use dstwin_core::batch::AttnCap;
use dstwin_core::device::{FinishReason, StepOutcome, StepPlan};
use dstwin_core::instance::{InstEvent, Instance, InstanceConfig, NewRequest, StepSummary};
use dstwin_core::layout::Role;
use dstwin_core::mtp::KnownAcceptance;
use dstwin_core::time::SimTime;
use proptest::prelude::*;

fn cfg(role: Role, blocks: u64) -> InstanceConfig {
    InstanceConfig {
        role,
        dp_ranks: 1,
        max_num_batched_tokens: 2048,
        max_num_seqs: 128,
        block_size: 128,
        num_kv_blocks: blocks,
        enable_chunked_prefill: true,
        enable_prefix_caching: true,
        long_prefill_token_threshold: 0,
        prefill_delay_passes: 0,
        balance_scheduling: false,
        separate_prefill_batches: false,
        dp_dispatch: Default::default(),
        admission: Default::default(),
        max_model_len: 1 << 20,
        num_spec_tokens: 0,
        attn_cap: AttnCap(None),
        send_back: false,
        async_scheduling: false,
    }
}

fn req(id: u64, prompt: u32, output: u32) -> NewRequest<'static> {
    NewRequest {
        id,
        prompt_tokens: prompt,
        max_output_tokens: output,
        hash_ids: &[],
        hash_block_tokens: 0,
        remote_kv: false,
        token_ids: None,
        sampling: None,
        prompt_len: prompt,
    }
}

/// One step with every draft accepted (`accept_all`) or none: the plan, events and totals.
fn step(inst: &mut Instance, accept_all: bool) -> (StepPlan, Vec<InstEvent>, StepSummary) {
    inst.schedule(SimTime::ZERO);
    let plan = inst.plan().clone();
    let accepted = plan
        .ranks
        .iter()
        .map(|r| {
            r.decode
                .iter()
                .map(|d| if accept_all { d.drafts } else { 0 })
                .collect()
        })
        .collect();
    let (ev, sum) = apply(inst, accepted);
    (plan, ev, sum)
}

/// The requests the last `schedule` admitted for the first time.
fn started_ids(inst: &Instance) -> Vec<u64> {
    inst.started().iter().map(|&(id, _)| id).collect()
}

/// The planned step's acceptance with every draft rejected.
fn no_drafts_accepted(inst: &Instance) -> Vec<Vec<u32>> {
    let ranks = &inst.plan().ranks;
    ranks.iter().map(|r| vec![0; r.decode.len()]).collect()
}

/// Applies a step's outcome with the given acceptance; the step's events and totals.
fn apply(inst: &mut Instance, accepted: Vec<Vec<u32>>) -> (Vec<InstEvent>, StepSummary) {
    let mut ev = Vec::new();
    let sum = inst.apply(
        SimTime::ZERO,
        &StepOutcome {
            accepted,
            ..Default::default()
        },
        &mut ev,
    );
    (ev, sum)
}

#[test]
fn chunked_prefill_splits_a_prompt_over_the_token_budget() {
    let mut inst = Instance::new(cfg(Role::Mixed, 1000));
    inst.add_request(req(1, 5000, 4), SimTime::ZERO);
    let steps: Vec<_> = (0..3).map(|_| step(&mut inst, true)).collect();
    let chunks: Vec<u64> = steps
        .iter()
        .map(|s| s.0.ranks[0].shape.prefill_tokens)
        .collect();
    assert_eq!(chunks, vec![2048, 2048, 904]);
    // The step that completes the prompt samples the first token.
    assert_eq!(steps[2].1, vec![InstEvent::First { req: 1 }]);
    assert_eq!(steps[2].2.tokens, 1);
    // Then one token per step, from consecutive steps.
    let (plan, ev, sum) = step(&mut inst, true);
    assert_eq!(plan.ranks[0].shape.decode_tokens, 1);
    assert!(ev.is_empty());
    assert_eq!(
        sum,
        StepSummary {
            tokens: 1,
            continuing: 1
        }
    );
}

#[test]
fn running_requests_come_first_and_max_num_seqs_caps_admission() {
    let mut c = cfg(Role::Mixed, 1000);
    c.max_num_seqs = 2;
    let mut inst = Instance::new(c);
    for id in 0..3 {
        inst.add_request(req(id, 100, 10), SimTime::ZERO);
    }
    let (plan, _, _) = step(&mut inst, true);
    assert_eq!(plan.ranks[0].shape.prefill_seqs, 2);
    assert_eq!(inst.num_waiting(), 1);
}

#[test]
fn kv_exhaustion_preempts_the_newest_running_request() {
    // 4 blocks of 128: two requests of 200 prompt tokens take 2 blocks each, then both grow.
    let mut inst = Instance::new(cfg(Role::Mixed, 4));
    inst.add_request(req(1, 200, 200), SimTime::ZERO);
    inst.add_request(req(2, 200, 200), SimTime::ZERO);
    let mut preempted = Vec::new();
    for _ in 0..80 {
        let (_, ev, _) = step(&mut inst, true);
        preempted.extend(ev.iter().filter_map(|e| match e {
            InstEvent::Preempted { req } => Some(*req),
            _ => None,
        }));
        if !preempted.is_empty() {
            break;
        }
    }
    assert_eq!(preempted, vec![2], "the newer request goes first");
    assert_eq!(inst.stats().preemptions, 1);
    // When it runs again after sitting out, its next token is reported as a gap.
    let mut gap = false;
    for _ in 0..400 {
        let (_, ev, _) = step(&mut inst, true);
        gap |= ev
            .iter()
            .any(|e| matches!(e, InstEvent::Gap { req: 2, .. }));
    }
    assert!(gap);
}

#[test]
fn shared_hash_ids_give_prefix_hits_on_full_blocks_only() {
    let mut inst = Instance::new(cfg(Role::Mixed, 1000));
    let hashes = [7u64, 8, 9];
    let r = |id| NewRequest {
        id,
        prompt_tokens: 1300,
        max_output_tokens: 2,
        hash_ids: &hashes,
        hash_block_tokens: 512,
        remote_kv: false,
        token_ids: None,
        sampling: None,
        prompt_len: 1300,
    };
    inst.add_request(r(1), SimTime::ZERO);
    step(&mut inst, true);
    inst.add_request(r(2), SimTime::ZERO);
    let (plan, _, _) = step(&mut inst, true);
    // Request 1 decodes 1 token; request 2: 1300 tokens = 10 full blocks (1280 tokens) + 20, and
    // all 10 blocks were cached by request 1.
    assert_eq!(plan.ranks[0].shape.prefill_tokens, 1300 - 1280);
    // Its admission reports the hit (what `/metrics` splits prompt tokens by).
    assert_eq!(inst.started(), &[(2, 1280)]);
    let s = inst.stats();
    assert_eq!(s.prefix_queries, 2600);
    assert_eq!(s.prefix_hits, 1280);
}

#[test]
fn mtp_emits_one_plus_accepted_and_rejected_drafts_roll_back() {
    let mut c = cfg(Role::Mixed, 1000);
    c.num_spec_tokens = 2;
    let mut inst = Instance::new(c);
    inst.add_request(req(1, 100, 20), SimTime::ZERO);
    assert_eq!(step(&mut inst, true).2.tokens, 1);
    // Decode steps compute 1 + 2 drafts.
    let (plan, _, sum) = step(&mut inst, true);
    assert_eq!(plan.ranks[0].shape.decode_tokens, 3);
    assert_eq!(sum.tokens, 3);
    assert_eq!(step(&mut inst, false).2.tokens, 1);
    // 1 + 3 + 1 = 5 emitted; the rest finish at exactly 20.
    let mut total = 5;
    let mut finished = false;
    while !finished {
        let (_, ev, sum) = step(&mut inst, true);
        total += sum.tokens;
        finished = ev.contains(&InstEvent::Finished {
            req: 1,
            reason: FinishReason::Length,
        });
    }
    assert_eq!(total, 20);
    assert!(!inst.has_work());
}

#[test]
fn a_prefill_instance_holds_kv_until_it_is_sent() {
    let mut inst = Instance::new(cfg(Role::Prefill, 100));
    inst.add_request(req(1, 1000, 1), SimTime::ZERO);
    let (_, ev, _) = step(&mut inst, true);
    assert_eq!(ev, vec![InstEvent::First { req: 1 }]);
    assert!(!inst.has_work());
    assert!(inst.kv_usage() > 0.0, "blocks held for the transfer");
    inst.release_kv(1);
    assert_eq!(inst.kv_usage(), 0.0);
}

#[test]
fn a_decode_instance_pulls_kv_before_decoding() {
    let mut inst = Instance::new(cfg(Role::Decode, 100));
    let mut r = req(1, 1000, 5);
    r.remote_kv = true;
    inst.add_request(r, SimTime::ZERO);
    inst.schedule(SimTime::ZERO);
    assert_eq!(inst.kv_pulls(), &[1]);
    assert_eq!(
        inst.plan().tokens(),
        0,
        "nothing runs before the KV arrives"
    );
    assert!(inst.kv_usage() > 0.0, "blocks reserved for the pull");
    inst.kv_arrived(1, SimTime::ZERO);
    // The last prompt token is recomputed for its logits and samples the first output token.
    let (plan, ev, _) = step(&mut inst, true);
    assert_eq!(plan.tokens(), 1);
    assert_eq!(ev, vec![InstEvent::First { req: 1 }]);
}

#[test]
fn send_back_hands_a_preempted_decode_request_back() {
    let mut c = cfg(Role::Decode, 4);
    c.send_back = true;
    let mut inst = Instance::new(c);
    for id in 1..=2 {
        let mut r = req(id, 200, 300);
        r.remote_kv = true;
        inst.add_request(r, SimTime::ZERO);
    }
    inst.schedule(SimTime::ZERO);
    for id in inst.kv_pulls().to_vec() {
        inst.kv_arrived(id, SimTime::ZERO);
    }
    let mut sent = Vec::new();
    for _ in 0..200 {
        let (_, ev, _) = step(&mut inst, true);
        sent.extend(ev.iter().filter_map(|e| match e {
            InstEvent::SentBack { req, emitted } => Some((*req, *emitted)),
            _ => None,
        }));
        if !sent.is_empty() {
            break;
        }
    }
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, 2);
    assert!(
        sent[0].1 > 0,
        "it had produced tokens before it was sent back"
    );
}

#[test]
fn async_scheduling_gives_a_finished_request_one_more_discarded_step() {
    let run = |async_scheduling: bool| {
        let mut c = cfg(Role::Mixed, 100);
        c.async_scheduling = async_scheduling;
        let mut inst = Instance::new(c);
        inst.add_request(req(1, 100, 3), SimTime::ZERO);
        let mut shapes = Vec::new();
        while inst.has_work() {
            let (plan, _, _) = step(&mut inst, true);
            shapes.push(plan.ranks[0].shape);
        }
        shapes
    };
    let sync = run(false);
    let asy = run(true);
    // Prefill + first token, then two decode steps; async runs one more decode step for the
    // request that finished, which nobody sees.
    assert_eq!(sync.len(), 3);
    assert_eq!(asy.len(), 4);
    assert_eq!(asy[..3], sync[..]);
    assert_eq!(asy[3].decode_seqs, 1);
    assert_eq!(asy[3].decode_tokens, 1);
    assert_eq!(
        asy[3].decode_pairs,
        100 + 2 + 1,
        "its context after three tokens"
    );
}

#[test]
fn requests_go_to_the_least_loaded_dp_rank() {
    let mut c = cfg(Role::Mixed, 100);
    c.dp_ranks = 3;
    let mut inst = Instance::new(c);
    let ranks: Vec<u32> = (0..6)
        .map(|id| inst.add_request(req(id, 10, 1), SimTime::ZERO))
        .collect();
    assert_eq!(ranks, vec![0, 1, 2, 0, 1, 2]);
}

type Log = Vec<(Vec<InstEvent>, StepSummary)>;

/// Drives an instance through a request stream with a fixed acceptance pattern.
fn drive(
    reqs: &[(u32, u32, u64)],
    blocks: u64,
    spec: u32,
    accept: &[bool],
    chunked: bool,
) -> (Vec<u32>, u64, Log) {
    let mut c = cfg(Role::Mixed, blocks);
    c.num_spec_tokens = spec;
    // Without chunked prefill the budget must hold any prompt (vLLM refuses otherwise).
    c.max_num_batched_tokens = if chunked { 512 } else { 2048 };
    c.enable_chunked_prefill = chunked;
    c.dp_ranks = 2;
    let mut inst = Instance::new(c);
    let hashes: Vec<u64> = (0..4).collect();
    let mut log = Vec::new();
    let mut finished = vec![0u32; reqs.len()];
    let mut tokens = 0;
    let mut next = 0;
    for s in 0..20_000usize {
        while next < reqs.len() && (reqs[next].2 as usize) <= s % 4 {
            let (p, o, _) = reqs[next];
            inst.add_request(
                NewRequest {
                    id: next as u64,
                    prompt_tokens: p,
                    max_output_tokens: o,
                    hash_ids: &hashes,
                    hash_block_tokens: 512,
                    remote_kv: false,
                    token_ids: None,
                    sampling: None,
                    prompt_len: p,
                },
                SimTime::ZERO,
            );
            next += 1;
        }
        if next == reqs.len() && !inst.has_work() {
            break;
        }
        inst.schedule(SimTime::ZERO);
        let plan = inst.plan().clone();
        let accepted = plan
            .ranks
            .iter()
            .map(|r| {
                r.decode
                    .iter()
                    .enumerate()
                    .map(|(j, d)| {
                        if accept[(s + j) % accept.len()] {
                            d.drafts
                        } else {
                            0
                        }
                    })
                    .collect()
            })
            .collect();
        let (ev, sum) = apply(&mut inst, accepted);
        tokens += sum.tokens;
        for e in &ev {
            if let InstEvent::Finished { req, .. } = e {
                finished[*req as usize] += 1;
            }
        }
        log.push((ev, sum));
    }
    (finished, tokens, log)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Random request streams with random MTP acceptance: invariants hold at every step, every
    /// request finishes exactly once with exactly its output when the KV fits the largest one,
    /// and equal inputs give equal events.
    #[test]
    fn every_request_finishes_and_runs_are_deterministic(
        reqs in prop::collection::vec((1u32..1500, 1u32..80, 0u64..4), 1..24),
        blocks in 24u64..64,
        spec in 0u32..3,
        accept in prop::collection::vec(any::<bool>(), 64),
        chunked in any::<bool>(),
    ) {
        let (finished, tokens, log) = drive(&reqs, blocks, spec, &accept, chunked);
        prop_assert!(finished.iter().all(|f| *f == 1), "finish counts {:?}", finished);
        prop_assert_eq!(tokens, reqs.iter().map(|r| r.1 as u64).sum::<u64>());
        let (_, _, again) = drive(&reqs, blocks, spec, &accept, chunked);
        prop_assert_eq!(log, again);
    }
}

/// Per step: the ranks' batch shapes, the events, the totals and the KV in use once the step
/// was planned (what allocation left free for the next admissions).
type Trace = Vec<(
    Vec<dstwin_core::batch::BatchShape>,
    Vec<InstEvent>,
    StepSummary,
    f64,
)>;

/// A known acceptance for these tests: draft i accepted with probability `p[i]` (the last
/// repeating) given draft i - 1 was, each draw a hash of (request, step, draft).
#[derive(Debug)]
struct Chained([f64; 2]);

impl KnownAcceptance for Chained {
    fn accepted(&self, req: u64, step: u32, drafts: u32) -> u32 {
        let uniform = |i: u32| {
            // splitmix64's finalizer over the three counters.
            let mut z = req ^ (step as u64) << 24 ^ (i as u64) << 56;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) as f64 / u64::MAX as f64
        };
        (0..drafts)
            .take_while(|&i| uniform(i) < self.0[(i as usize).min(1)])
            .count() as u32
    }
}

/// Drives an instance whose device draws MTP acceptance from `acc`; with `aggregate` the
/// scheduler is given the same acceptance and advances steady requests in aggregate. A plan
/// without tokens is not run, as a deployment does not run it. With
/// `prefixes` the prompts share prefixes (two families of block hashes), so that prefix
/// hits and the eviction order of cached blocks come into play.
#[allow(clippy::too_many_arguments)]
fn drive_with_acceptance(
    reqs: &[(u32, u32, u64)],
    blocks: u64,
    block_size: u32,
    spec: u32,
    budget: u32,
    cap: Option<u64>,
    max_model_len: u64,
    send_back: bool,
    async_scheduling: bool,
    prefixes: bool,
    aggregate: bool,
) -> (Trace, dstwin_core::instance::InstanceStats) {
    let acc = std::sync::Arc::new(Chained([0.7, 0.4]));
    let mut c = cfg(if send_back { Role::Decode } else { Role::Mixed }, blocks);
    c.block_size = block_size;
    c.num_spec_tokens = spec;
    c.max_num_batched_tokens = budget;
    c.max_num_seqs = 12;
    c.attn_cap = AttnCap(cap);
    c.max_model_len = max_model_len;
    c.send_back = send_back;
    c.async_scheduling = async_scheduling;
    c.dp_ranks = 2;
    let mut inst = Instance::new(c);
    if aggregate {
        inst.set_acceptance(Some(acc.clone()));
    }
    let mut trace = Vec::new();
    let mut next = 0;
    for s in 0..4_000u64 {
        while next < reqs.len() && reqs[next].2 <= s {
            let (p, o, _) = reqs[next];
            // A family's hashes (two families, one per DP rank as requests alternate between
            // them): the same ids for its first blocks, then the request's own.
            let family = next as u64 % 2;
            let hashes: Vec<u64> = (0..=(p / block_size) as u64)
                .map(|j| {
                    if j < 3 {
                        family * 100 + j
                    } else {
                        next as u64 * 1000 + j
                    }
                })
                .collect();
            let mut r = req(next as u64, p, o);
            r.remote_kv = send_back;
            if prefixes {
                r.hash_ids = &hashes;
                r.hash_block_tokens = block_size;
            }
            inst.add_request(r, SimTime::ZERO);
            next += 1;
        }
        if next == reqs.len() && !inst.has_work() {
            break;
        }
        inst.schedule(SimTime::ZERO);
        let kv = inst.kv_usage();
        for id in inst.kv_pulls().to_vec() {
            inst.kv_arrived(id, SimTime::ZERO);
        }
        let plan = inst.plan().clone();
        assert_eq!(
            inst.plan_totals(),
            plan.totals(),
            "totals summed while planning"
        );
        if plan.tokens() == 0 {
            // A plan without tokens does not run (as in a deployment): the next one plans the
            // same step again.
            let shapes = plan.ranks.iter().map(|r| r.shape).collect();
            trace.push((shapes, Vec::new(), StepSummary::default(), kv));
            continue;
        }
        let accepted = plan
            .ranks
            .iter()
            .map(|r| {
                r.decode
                    .iter()
                    .map(|d| acc.accepted(d.req, d.step, d.drafts))
                    .collect()
            })
            .collect();
        let (ev, sum) = apply(&mut inst, accepted);
        // Sent-back requests come back as new pulls, like a proxy re-prefilling them would.
        for e in &ev {
            if let InstEvent::SentBack { req: id, emitted } = *e {
                let (p, o, _) = reqs[id as usize];
                let mut r = req(id, p + emitted, o - emitted);
                r.remote_kv = true;
                inst.add_request(r, SimTime::ZERO);
            }
        }
        trace.push((plan.ranks.iter().map(|r| r.shape).collect(), ev, sum, kv));
    }
    (trace, inst.stats())
}

#[test]
fn aggregation_covers_steady_decoding_preemption_and_budget_fallbacks() {
    let reqs: Vec<(u32, u32, u64)> = (0..24)
        .map(|i| (40 + 7 * i, 150 + 3 * i, i as u64))
        .collect();
    let run = |blocks, budget, aggregate| {
        drive_with_acceptance(
            &reqs,
            blocks,
            16,
            1,
            budget,
            None,
            1 << 20,
            false,
            false,
            false,
            aggregate,
        )
    };
    // Ample KV and budget: most request-steps advance in aggregate.
    let (exact, _) = run(400, 4096, false);
    let (fast, st) = run(400, 4096, true);
    assert_eq!(exact, fast);
    assert!(st.steady_steps > 4 * st.exact_steps, "{st:?}");
    // Tight KV: preemptions hit steady requests; a tight budget forces exact steps.
    let (exact, _) = run(40, 4096, false);
    let (fast, st) = run(40, 4096, true);
    assert_eq!(exact, fast);
    assert!(st.preemptions > 0 && st.steady_steps > 0, "{st:?}");
    let (exact, _) = run(400, 20, false);
    let (fast, st) = run(400, 20, true);
    assert_eq!(exact, fast);
    assert!(st.budget_fallbacks > 0 && st.steady_steps > 0, "{st:?}");
}

#[test]
fn steady_decoding_goes_on_across_kv_blocks_when_blocks_are_plentiful() {
    // Long decodes, two per DP rank, 16-token blocks: a new block every ~9 steps. With KV
    // to spare, a window that ends at a block boundary goes on from there, the block
    // allocated in aggregate; only the prompts and the last steps run request by request.
    // Shared prefixes change nothing.
    let reqs = [(40, 400, 0), (56, 380, 0), (30, 390, 1), (48, 370, 1)];
    let run = |blocks, prefixes, aggregate| {
        drive_with_acceptance(
            &reqs,
            blocks,
            16,
            1,
            4096,
            None,
            1 << 20,
            false,
            false,
            prefixes,
            aggregate,
        )
    };
    for prefixes in [false, true] {
        let (exact, exact_stats) = run(400, prefixes, false);
        let (fast, st) = run(400, prefixes, true);
        assert_eq!(exact, fast);
        assert_eq!(exact_stats.prefix_hits, st.prefix_hits);
        assert_eq!(st.prefix_hits > 0, prefixes, "{st:?}");
        assert!(st.exact_steps <= 16, "{st:?}");
    }
    // Short of blocks, a boundary whose step could run out of blocks runs exactly, and
    // preempts as step by step does.
    let (exact, _) = run(40, false, false);
    let (fast, st) = run(40, false, true);
    assert_eq!(exact, fast);
    assert!(st.preemptions > 0, "{st:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Advancing steady requests in aggregate gives exactly the schedule of stepping every
    /// request: the same batch shapes (what the device prices), events, token totals and KV in
    /// use, step by step, under KV pressure (preemption, send-back), a binding budget,
    /// sparse-attention caps, max_model_len and shared prefixes.
    #[test]
    fn aggregated_decoding_is_exact(
        reqs in prop::collection::vec((1u32..600, 1u32..300, 0u64..200), 1..30),
        blocks in 8u64..80,
        block_size in prop::sample::select(vec![4u32, 16, 128]),
        spec in 0u32..3,
        budget in prop::sample::select(vec![8u32, 24, 4096]),
        cap in prop::option::of(16u64..700),
        max_model_len in prop::sample::select(vec![700u64, 1 << 20]),
        send_back in any::<bool>(),
        async_scheduling in any::<bool>(),
        prefixes in any::<bool>(),
    ) {
        // Every prompt must fit max_model_len and the KV (else vLLM rejects it up front).
        let reqs: Vec<_> = reqs
            .into_iter()
            .map(|(p, o, t)| (p.min((blocks * block_size as u64 / 2) as u32).max(1), o, t))
            .collect();
        let (exact, exact_stats) = drive_with_acceptance(
            &reqs, blocks, block_size, spec, budget, cap, max_model_len, send_back,
            async_scheduling, prefixes, false,
        );
        let (fast, fast_stats) = drive_with_acceptance(
            &reqs, blocks, block_size, spec, budget, cap, max_model_len, send_back,
            async_scheduling, prefixes, true,
        );
        prop_assert_eq!(exact_stats.prefix_hits, fast_stats.prefix_hits);
        prop_assert_eq!(exact.len(), fast.len(), "step count");
        for (i, (a, b)) in exact.iter().zip(&fast).enumerate() {
            prop_assert_eq!(a, b, "step {}", i);
        }
    }
}

/// SGLang's prefill delayer: a prompt waiting on one DP rank while another decodes is held
/// for the passes less one, then admitted; prompts waiting on every rank, or on an instance
/// with nothing running, start at once.
#[test]
fn the_prefill_delayer_holds_a_prompt_until_every_rank_has_one_or_the_passes_run_out() {
    let mut c = cfg(Role::Mixed, 1000);
    c.dp_ranks = 2;
    c.prefill_delay_passes = 5;
    // Steps until request `id` is admitted, after it arrives beside a decode on the other rank.
    let wait = |c: InstanceConfig, id: u64| {
        let mut inst = Instance::new(c);
        // Nothing runs yet: the first prompt is not held, though only its rank has one.
        assert_eq!(inst.add_request(req(1, 200, 100), SimTime::ZERO), 0);
        inst.schedule(SimTime::ZERO);
        assert_eq!(started_ids(&inst), [1]);
        apply(&mut inst, vec![vec![0]]);
        assert_eq!(inst.add_request(req(id, 200, 10), SimTime::ZERO), 1);
        let mut held = 0;
        loop {
            inst.schedule(SimTime::ZERO);
            if started_ids(&inst).contains(&id) {
                return held;
            }
            held += 1;
            // Only the decode runs while the prompt is held.
            let plan = inst.plan();
            assert_eq!(plan.totals().tokens, 1, "step {held}: {plan:?}");
            let accepted = no_drafts_accepted(&inst);
            apply(&mut inst, accepted);
        }
    };
    assert_eq!(wait(c, 2), 4);
    c.prefill_delay_passes = 1;
    assert_eq!(wait(c, 2), 0);
    c.prefill_delay_passes = 0;
    assert_eq!(wait(c, 2), 0);

    // A prompt on each rank: no delay.
    c.prefill_delay_passes = 3;
    let mut inst = Instance::new(c);
    let step = |inst: &mut Instance| {
        inst.schedule(SimTime::ZERO);
        let started = started_ids(inst);
        let accepted = no_drafts_accepted(inst);
        apply(inst, accepted);
        started
    };
    inst.add_request(req(1, 200, 100), SimTime::ZERO);
    inst.add_request(req(2, 200, 100), SimTime::ZERO);
    assert_eq!(step(&mut inst), [1, 2]);
    // A wait that ends because the other rank came to have a prompt resets the count: the
    // next lone prompt waits its full 2 steps again (1 if the count had not been reset).
    assert_eq!(inst.add_request(req(4, 200, 100), SimTime::ZERO), 0);
    assert!(step(&mut inst).is_empty());
    assert_eq!(inst.add_request(req(3, 200, 100), SimTime::ZERO), 1);
    assert_eq!(step(&mut inst), [4, 3]);
    assert_eq!(inst.add_request(req(5, 200, 100), SimTime::ZERO), 0);
    assert!(step(&mut inst).is_empty());
    assert!(step(&mut inst).is_empty());
    assert_eq!(step(&mut inst), [5]);
}

/// vllm-ascend's balance scheduling: while one DP rank runs `max_num_seqs` requests no rank
/// admits a waiting one, though a seat is free on its own rank; once the full rank's request
/// finishes, the waiting one starts.
#[test]
fn balance_scheduling_holds_every_rank_while_one_is_full() {
    let mut c = cfg(Role::Mixed, 1000);
    c.dp_ranks = 2;
    c.max_num_seqs = 1;
    let held_steps = |balance: bool| {
        let mut c = c;
        c.balance_scheduling = balance;
        let mut inst = Instance::new(c);
        assert_eq!(inst.add_request(req(1, 200, 4), SimTime::ZERO), 0);
        inst.schedule(SimTime::ZERO);
        assert_eq!(started_ids(&inst), [1]);
        apply(&mut inst, vec![vec![0]]);
        // The other rank is empty: the new request goes there.
        assert_eq!(inst.add_request(req(2, 200, 10), SimTime::ZERO), 1);
        let mut held = 0;
        loop {
            inst.schedule(SimTime::ZERO);
            if started_ids(&inst).contains(&2) {
                return held;
            }
            held += 1;
            assert_eq!(
                inst.plan().totals().tokens,
                1,
                "step {held}: only the decode runs"
            );
            let accepted = no_drafts_accepted(&inst);
            apply(&mut inst, accepted);
        }
    };
    assert_eq!(held_steps(false), 0);
    // Request 1's prefill gave its first token; its other three decode while request 2 waits.
    assert_eq!(held_steps(true), 3);
}

/// A held step whose only running request preempts itself would be a step of nothing, which
/// no driver runs, and nothing would plan again: it admits the held prompt instead, and the
/// preemption is still reported.
#[test]
fn a_held_step_that_comes_to_nothing_admits_instead() {
    let mut c = cfg(Role::Mixed, 3);
    c.dp_ranks = 2;
    c.prefill_delay_passes = 30;
    // A budget of two blocks' tokens: a recompute could start in a chunk that fits.
    c.max_num_batched_tokens = 256;
    let mut inst = Instance::new(c);
    // 300 prompt tokens in 3 blocks of 128: the 84th decode step needs a fourth block.
    inst.add_request(req(1, 300, 200), SimTime::ZERO);
    for i in 0..200 {
        if i == 70 {
            assert_eq!(inst.add_request(req(2, 100, 10), SimTime::ZERO), 1);
        }
        inst.schedule(SimTime::ZERO);
        let tokens = inst.plan_totals().tokens;
        assert!(tokens > 0, "step {i}: a plan of nothing");
        let started = started_ids(&inst);
        let accepted = no_drafts_accepted(&inst);
        let (events, _) = apply(&mut inst, accepted);
        if events.contains(&InstEvent::Preempted { req: 1 }) {
            assert_eq!(started, [2], "step {i}");
            // Only the held prompt's 100 tokens: request 1, back at the head of its rank's
            // queue (a first chunk of 256 would fit its blocks again), is not admitted in the
            // step that preempted it, however often that step is planned.
            assert_eq!(tokens, 100, "step {i}");
            return;
        }
        assert!(i < 70 || started.is_empty(), "step {i}: held");
    }
    panic!("request 1 was never preempted");
}

/// SGLang without --enable-mixed-chunk: a step is a prefill batch whenever a prompt can be
/// computed (its decoders wait), else a decode batch, never both. A 600-token prompt in
/// 256-token chunks takes three prefill steps while the running request decodes none; vLLM's
/// steps carry the decode in every one of them.
#[test]
fn separate_prefill_batches_never_mix_prompts_and_decodes() {
    let run = |separate: bool| {
        let mut c = cfg(Role::Mixed, 1000);
        c.max_num_batched_tokens = 256;
        c.separate_prefill_batches = separate;
        let mut inst = Instance::new(c);
        inst.add_request(req(1, 100, 20), SimTime::ZERO);
        let mut kinds = String::new();
        for i in 0..12 {
            if i == 3 {
                inst.add_request(req(2, 600, 5), SimTime::ZERO);
            }
            let (plan, _, _) = step(&mut inst, false);
            let s = &plan.ranks[0].shape;
            kinds.push(match (s.prefill_tokens > 0, s.decode_tokens > 0) {
                (true, true) => 'M',
                (true, false) => 'P',
                (false, true) => 'D',
                (false, false) => '-',
            });
        }
        kinds
    };
    // Request 1's prompt, two decodes; request 2's three chunks (the last samples its first
    // token); then both decode.
    assert_eq!(run(true), "PDDPPPDDDDDD");
    assert_eq!(run(false), "PDDMMMDDDDDD");
}

/// A prompt that cannot be admitted (no seat) leaves the step to the decoders; and a
/// separate-batches rank steps every request even where the device's acceptance is known
/// (steady windows assume a decoder takes every step), where a vLLM-style rank advances its
/// decoders in aggregate.
#[test]
fn separate_prefill_batches_decode_when_nothing_can_prefill_and_step_exactly() {
    #[derive(Debug)]
    struct Half;
    impl KnownAcceptance for Half {
        fn accepted(&self, req: u64, step: u32, drafts: u32) -> u32 {
            ((req + step as u64) % 2) as u32 * drafts
        }
    }
    let run = |separate: bool| {
        let mut c = cfg(Role::Mixed, 1000);
        c.separate_prefill_batches = separate;
        c.max_num_seqs = 1;
        c.num_spec_tokens = 1;
        let mut inst = Instance::new(c);
        inst.set_acceptance(Some(std::sync::Arc::new(Half)));
        inst.add_request(req(1, 100, 30), SimTime::ZERO);
        inst.add_request(req(2, 100, 5), SimTime::ZERO);
        for i in 0..11 {
            inst.schedule(SimTime::ZERO);
            let s = inst.plan().ranks[0].shape;
            if i == 0 {
                assert_eq!(s.prefill_tokens, 100);
            } else {
                assert_eq!(
                    (s.prefill_tokens, s.decode_seqs),
                    (0, 1),
                    "step {i}: decode only"
                );
            }
            let accepted = inst
                .plan()
                .ranks
                .iter()
                .map(|r| {
                    r.decode
                        .iter()
                        .map(|d| Half.accepted(d.req, d.step, d.drafts))
                        .collect()
                })
                .collect();
            apply(&mut inst, accepted);
        }
        inst.stats().steady_steps
    };
    assert_eq!(run(true), 0, "no request advanced in aggregate");
    assert!(run(false) > 0, "a vLLM-style rank aggregates its decoder");
}

/// A prefill batch's prompt chunk that lacks KV preempts nobody (SGLang retracts requests only
/// to decode): the step decodes instead, and only a decoder that needs a block preempts. vLLM's
/// chunk takes the blocks by preempting the newest request, itself.
#[test]
fn separate_prefill_batches_preempt_only_to_decode() {
    let run = |separate: bool| {
        // Five blocks of 128: a 1,000-token prompt in 256-token chunks fills them beside a
        // decoder after two chunks.
        let mut c = cfg(Role::Mixed, 5);
        c.max_num_batched_tokens = 256;
        c.separate_prefill_batches = separate;
        let mut inst = Instance::new(c);
        inst.add_request(req(1, 100, 60), SimTime::ZERO);
        let mut steps = Vec::new();
        for i in 0..60 {
            if i == 2 {
                inst.add_request(req(2, 1000, 5), SimTime::ZERO);
            }
            let (plan, events, _) = step(&mut inst, false);
            let s = plan.ranks[0].shape;
            let preempted: Vec<u64> = events
                .iter()
                .filter_map(|e| match e {
                    InstEvent::Preempted { req } => Some(*req),
                    _ => None,
                })
                .collect();
            steps.push((s.prefill_tokens > 0, s.decode_tokens > 0, preempted));
        }
        steps
    };
    let separate = run(true);
    assert!(separate.iter().all(|(p, d, _)| !(*p && *d)), "never both");
    for (i, (prefill, _, preempted)) in separate.iter().enumerate() {
        assert!(
            !*prefill || preempted.is_empty(),
            "step {i}: a prefill batch preempted"
        );
    }
    // The third chunk does not fit beside request 1's block: request 1 decodes on until it
    // needs a second block, which preempts request 2, once. vLLM's third chunk preempts its
    // own request every time it comes round.
    let preemptions = |v: &[(bool, bool, Vec<u64>)]| v.iter().filter(|s| !s.2.is_empty()).count();
    assert!(
        separate.iter().any(|(_, d, pre)| *d && pre == &[2]),
        "{separate:?}"
    );
    assert_eq!(preemptions(&separate), 1, "{separate:?}");
    let mixed = run(false);
    assert!(preemptions(&mixed) > 5, "{mixed:?}");
}

/// Async scheduling: a request that finished in the last step takes a (discarded) decode step
/// in the next one where that step decodes, as vLLM's does; a prefill batch carries none.
#[test]
fn separate_prefill_batches_carry_no_async_phantoms() {
    let run = |separate: bool| {
        let mut c = cfg(Role::Mixed, 1000);
        c.async_scheduling = true;
        c.separate_prefill_batches = separate;
        let mut inst = Instance::new(c);
        inst.add_request(req(1, 100, 3), SimTime::ZERO);
        loop {
            let (_, events, _) = step(&mut inst, false);
            if events
                .iter()
                .any(|e| matches!(e, InstEvent::Finished { req: 1, .. }))
            {
                break;
            }
        }
        inst.add_request(req(2, 100, 3), SimTime::ZERO);
        let (plan, _, _) = step(&mut inst, false);
        let s = plan.ranks[0].shape;
        (s.prefill_tokens, s.decode_tokens)
    };
    assert_eq!(
        run(false),
        (100, 1),
        "vLLM: the prompt beside the finished request's phantom"
    );
    assert_eq!(run(true), (100, 0), "a prefill batch only");
}

/// A prefill batch whose prompt chunk lacks KV ends there (SGLang's prefill adder stops at the
/// first request that does not fit): no waiting request is admitted behind it, even one that
/// would fit, and the step decodes instead.
#[test]
fn a_stalled_prefill_batch_admits_nobody_behind_it() {
    // Eight blocks of 128: a decoder holds one, a 1,000-token prompt in 256-token chunks takes
    // six after three chunks and needs two more for its last; one block is free.
    let mut c = cfg(Role::Mixed, 8);
    c.max_num_batched_tokens = 256;
    c.separate_prefill_batches = true;
    let mut inst = Instance::new(c);
    inst.add_request(req(1, 100, 60), SimTime::ZERO);
    let mut prefills = Vec::new();
    for i in 0..80 {
        if i == 2 {
            inst.add_request(req(2, 1000, 5), SimTime::ZERO);
        }
        if i == 5 {
            // Would fit in the free block: a prefill batch of its own, were admission open.
            inst.add_request(req(3, 50, 5), SimTime::ZERO);
        }
        let (plan, _, _) = step(&mut inst, false);
        let Some(r) = plan.ranks.first() else {
            break; // everything finished
        };
        let s = r.shape;
        if i == 5 {
            assert_eq!(
                (s.prefill_tokens, s.decode_seqs),
                (0, 1),
                "the stalled step decodes"
            );
        }
        if s.prefill_tokens > 0 {
            prefills.push(s.prefill_tokens);
        }
    }
    assert_eq!(prefills, [100, 256, 256, 256, 232, 50], "{prefills:?}");
}

/// DP dispatch: least-loaded sends a new request to the rank with the fewest unfinished ones
/// (lowest index on ties); round robin (SGLang's) sends each to the next rank in turn, even
/// when that rank already holds more than the others.
#[test]
fn dp_dispatch_least_loaded_or_in_turn() {
    use dstwin_core::instance::DpDispatch;
    let ranks = |dispatch| {
        let mut inst = Instance::new(InstanceConfig {
            dp_ranks: 3,
            dp_dispatch: dispatch,
            ..cfg(Role::Mixed, 1000)
        });
        // Request 1 finishes in one step (one output token); 2 and 3 run on.
        let mut v = vec![
            inst.add_request(req(1, 100, 1), SimTime::ZERO),
            inst.add_request(req(2, 100, 50), SimTime::ZERO),
            inst.add_request(req(3, 100, 50), SimTime::ZERO),
        ];
        step(&mut inst, false);
        v.extend((4..8).map(|id| inst.add_request(req(id, 100, 50), SimTime::ZERO)));
        v
    };
    // Rank 0 emptied: least-loaded fills it, then takes the lowest of the tied ranks.
    assert_eq!(ranks(DpDispatch::LeastLoaded), vec![0, 1, 2, 0, 0, 1, 2]);
    assert_eq!(ranks(DpDispatch::RoundRobin), vec![0, 1, 2, 0, 1, 2, 0]);
}

/// A one-rank mixed instance of `kv` one-token blocks, no prefix caching, with SGLang's
/// admission (`conservativeness`, `ignore_eos_path`, `reserved` decode tokens) or vLLM's.
fn sglang_cfg(role: Role, kv: u64, sglang: Option<(f64, bool, u32)>) -> InstanceConfig {
    use dstwin_core::instance::{AdmissionRule, SglangAdmission};
    InstanceConfig {
        block_size: 1,
        enable_prefix_caching: false,
        admission: match sglang {
            Some((c, eos, r)) => AdmissionRule::Sglang(SglangAdmission::new(c, eos, r)),
            None => AdmissionRule::Vllm,
        },
        ..cfg(role, kv)
    }
}

/// The step (1-based) in which request `id` starts, stepping until `limit` steps; also the
/// preemptions seen.
fn start_step(inst: &mut Instance, id: u64, limit: u32) -> (Option<u32>, u64) {
    let mut at = None;
    for t in 1..=limit {
        inst.schedule(SimTime::ZERO);
        if at.is_none() && started_ids(inst).contains(&id) {
            at = Some(t);
        }
        let accepted = no_drafts_accepted(inst);
        apply(inst, accepted);
    }
    (at, inst.stats().preemptions)
}

/// Request 1 (`first`: prompt, output) starts alone and takes a step; then request 2
/// (`second`) arrives: the step in which it starts, and the preemptions, over 1,000 steps.
fn second_start(inst: &mut Instance, first: (u32, u32), second: (u32, u32)) -> (Option<u32>, u64) {
    inst.add_request(req(1, first.0, first.1), SimTime::ZERO);
    inst.schedule(SimTime::ZERO);
    let accepted = no_drafts_accepted(inst);
    apply(inst, accepted);
    inst.add_request(req(2, second.0, second.1), SimTime::ZERO);
    start_step(inst, 2, 1000)
}

/// SGLang's `new_token_ratio`: a prompt waits while the free KV, less the running request's
/// remaining output times the ratio, cannot hold it and its output; the ratio decays every
/// decode step (0.7 to 0.098 over 600 steps), so it starts some thirty steps later, where vLLM
/// starts it at once, and as late whether the running request is stepped one by one or
/// advanced in aggregate (steady). A conservativeness of 10/7 (initial ratio 1) holds it until
/// the running request has finished.
#[test]
fn sglang_admission_reserves_running_outputs_at_a_decaying_ratio() {
    #[derive(Debug)]
    struct NoDrafts;
    impl KnownAcceptance for NoDrafts {
        fn accepted(&self, _: u64, _: u32, _: u32) -> u32 {
            0
        }
    }
    let run_with = |sglang, steady: bool| {
        let mut c = sglang_cfg(Role::Mixed, 1000, sglang);
        if steady {
            // Steady windows end at block boundaries: blocks of one token leave none.
            (c.block_size, c.num_kv_blocks) = (16, 1008 / 16);
        }
        let mut inst = Instance::new(c);
        if steady {
            inst.set_acceptance(Some(std::sync::Arc::new(NoDrafts)));
        }
        second_start(&mut inst, (100, 880), (200, 100))
    };
    let run = |sglang| run_with(sglang, false);
    assert_eq!(run(None).0, Some(1));
    // With t tokens produced and t decays, 900 - t - (880 - t) (0.7 - 0.602 t / 600) > 301
    // from t = 31 on.
    let (at, preempted) = run(Some((1.0, false, 512)));
    let at = at.expect("starts once the ratio has decayed");
    assert!((30..=34).contains(&at), "started at step {at}");
    assert_eq!(preempted, 0);
    // The same in 16-token blocks, the running request stepped one by one or in aggregate.
    let exact = {
        let mut c = sglang_cfg(Role::Mixed, 1000, Some((1.0, false, 512)));
        (c.block_size, c.num_kv_blocks) = (16, 1008 / 16);
        let mut inst = Instance::new(c);
        second_start(&mut inst, (100, 880), (200, 100))
            .0
            .expect("starts")
    };
    assert!((20..=60).contains(&exact), "started at step {exact}");
    assert_eq!(run_with(Some((1.0, false, 512)), true).0, Some(exact));
    // Ratio 1 never leaves room beside request 1's 880 tokens: it waits for request 1's end.
    let (at, _) = run(Some((1.0 / 0.7, false, 512)));
    assert!(
        at.expect("starts after request 1") >= 880,
        "started at {at:?}"
    );
}

/// The ratio returns to its initial value when the rank has nothing to run: the same pair of
/// requests, served twice in a row, waits as long the second time.
#[test]
fn sglang_ratio_starts_again_when_the_rank_is_idle() {
    let mut inst = Instance::new(sglang_cfg(Role::Mixed, 1000, Some((1.0, false, 512))));
    let mut starts = Vec::new();
    for round in 0..2u64 {
        let (a, b) = (10 * round + 1, 10 * round + 2);
        inst.add_request(req(a, 100, 880), SimTime::ZERO);
        inst.schedule(SimTime::ZERO);
        let accepted = no_drafts_accepted(&inst);
        apply(&mut inst, accepted);
        inst.add_request(req(b, 200, 100), SimTime::ZERO);
        starts.push(start_step(&mut inst, b, 900).0.expect("starts"));
        while inst.stats().running > 0 {
            step(&mut inst, true);
        }
    }
    assert_eq!(starts[0], starts[1]);
}

/// With ignore_eos and no radix cache SGLang reserves whole outputs: a prompt starts only if
/// every request could finish, the shortest first, in the KV. Request 2 would need 500 tokens
/// when it ends, while request 1 then holds 601 of 1,000: it waits for request 1's end, and
/// nothing is ever retracted; vLLM starts it at once and preempts when the KV runs out.
#[test]
fn sglang_ignore_eos_admission_waits_until_every_request_can_finish() {
    let run = |sglang| {
        let mut inst = Instance::new(sglang_cfg(Role::Mixed, 1000, sglang));
        second_start(&mut inst, (300, 600), (200, 300))
    };
    let (at, preempted) = run(None);
    assert_eq!(at, Some(1));
    assert!(preempted > 0);
    // At a low conservativeness (ratio 0.07) the ratio rule starts it at once too...
    assert_eq!(run(Some((0.1, false, 512))).0, Some(1));
    // ...the whole-output rule does not.
    let (at, preempted) = run(Some((0.1, true, 512)));
    assert!(
        at.expect("starts after request 1") >= 599,
        "started at {at:?}"
    );
    assert_eq!(preempted, 0);
}

/// A PD decode instance preallocates a request only while `reserved_decode_tokens` per held
/// request stay free beside its prompt: 200-token prompts in 1,000 blocks, 150 reserved per
/// request (the new one's too), take two (200 + 3 x 150 > 1000 - 2 x 201) where vLLM's rule
/// takes four.
#[test]
fn sglang_decode_preallocation_keeps_reserved_decode_tokens() {
    let pulls = |sglang| {
        let mut inst = Instance::new(sglang_cfg(Role::Decode, 1000, sglang));
        for id in 1..=6 {
            let mut r = req(id, 200, 50);
            r.remote_kv = true;
            inst.add_request(r, SimTime::ZERO);
        }
        inst.schedule(SimTime::ZERO);
        inst.kv_pulls().len()
    };
    assert_eq!(pulls(None), 4);
    assert_eq!(pulls(Some((1.0, false, 150))), 2);
}
