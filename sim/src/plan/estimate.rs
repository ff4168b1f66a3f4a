//! The steady-step screen: what a layout sustains with every decode slot busy, priced step by
//! step on the twin's own devices (the same op graph, cost file, expert load, graph padding and
//! host time its simulation runs on) without arrivals, queues or the scheduler. `plan` searches
//! each layout's batch cap and MTP depth with it and simulates only what it puts near the front
//! (`plan` module docs).
//!
//! Per DP rank, with `b` sequences decoding at the mean context (the prompt and half the output),
//! `E` tokens accepted per sequence and step (1 + the expected accepted drafts), and prompts of
//! `I` tokens and outputs of `O`:
//! - a **decode** rank emits `b E` tokens per decode step of `T_d`: `b E / (T_d O)` requests
//!   per second, TPOT `T_d / E`;
//! - a **prefill** rank computes `n = min(seqs, budget / I)` whole prompts per step of `T_p`
//!   (a prompt over the budget in chunks, each attending to the ones before it): `n / T_p`;
//! - a **mixed** rank spends, per request, `O T_d / (b E)` on the decode steps its output needs
//!   and the prompt's share of the steps that carry it: `I (T_m - T_d) / c` where a step of
//!   `T_m` carries `b` decodes and a chunk of `c` prompt tokens at the mean offset of the
//!   prompt's chunks (the budget left after the decodes; with separate prefill batches, as SGLang schedules, the prefill steps alone).
//!   The ranks step in lockstep, so every rank's prompt steps stall them all: with `D` DP
//!   ranks the prompt's share counts `D` times (the worst case, prompts landing on the ranks in
//!   different steps). Requests per second are one over the sum, TPOT `b / (rate O)`.
//!
//! A deployment sustains the least of its roles' rates (instances x DP ranks x per rank). `b`
//! is feasible when every sequence fits in the rank's KV at its full length. The estimate is a
//! bound of the simulation's capacity, not a prediction of its goodput: it has no queueing, no
//! prefill interference beyond the mean, and no PD hand-off time.

use super::{PlanInput, RUN_FAILED};
use crate::run::build_instances;
use crate::scenario::Scenario;
use dstwin_core::batch::BatchShape;
use dstwin_core::device::{Device, RankPlan, StepOutcome, StepPlan};
use dstwin_core::layout::Role;
use dstwin_twin::device::SimDevice;
use dstwin_twin::explain::Mtp;
use serde::Serialize;

/// What the steady steps of a layout give at one batch cap.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Estimate {
    /// Requests per second with every decode slot busy: the least of the roles' rates.
    pub capacity_req_s: f64,
    /// TPOT of a request at that load, ms.
    pub tpot_ms: f64,
    /// One prompt's prefill with nothing queued, ms: the least TTFT can be.
    pub prefill_ms: f64,
    /// Sequences a generating rank's KV holds, each at its full length.
    pub kv_seqs: u64,
    /// Capacity per card when the batch fits the KV and TPOT and the prefill are within the
    /// plan's bounds (every request's and the percentiles'), else 0.
    pub goodput_per_card: f64,
}

/// The decode, prefill and mixed steps of a built scenario's instances, priced.
pub struct Pricer {
    roles: Vec<RoleDevice>,
    cards: f64,
    acceptance: Vec<f64>,
}

struct RoleDevice {
    role: Role,
    count: u32,
    dp: u32,
    budget: u32,
    seqs: u32,
    mtp: u32,
    kv_tokens: u64,
    separate_prefill: bool,
    device: SimDevice,
}

/// One step of every DP rank computing `shape`, seconds.
fn step_s(dev: &mut SimDevice, dp: u32, shape: &BatchShape) -> Result<f64, String> {
    let plan = StepPlan {
        dp_ranks: dp,
        ranks: (0..dp)
            .map(|rank| RankPlan {
                rank,
                shape: *shape,
                ..RankPlan::default()
            })
            .collect(),
        expert_move: None,
    };
    let mut out = StepOutcome::default();
    dev.execute(&plan, &mut out)
        .map_err(|e| format!("{RUN_FAILED}{e}"))?;
    Ok(out.duration.as_secs_f64())
}

impl Pricer {
    /// The devices of `s`, one per instance kind, each step at its price (no spread).
    pub fn new(s: &Scenario) -> Result<Pricer, String> {
        let built = build_instances(s).map_err(|e| e.to_string())?;
        let mut roles: Vec<RoleDevice> = Vec::new();
        for b in built {
            let setup = &s.instances[b.setup];
            if roles.iter().any(|r| r.role == setup.plan.role) {
                continue;
            }
            let sc = &setup.scheduler;
            roles.push(RoleDevice {
                role: setup.plan.role,
                count: setup.count,
                dp: setup.plan.dp,
                budget: sc.max_num_batched_tokens,
                seqs: sc.max_num_seqs,
                mtp: setup.mtp_tokens,
                kv_tokens: setup.kv_blocks_per_rank * u64::from(sc.block_size),
                separate_prefill: sc.separate_prefill_batches,
                device: b.device.with_spread(None),
            });
        }
        Ok(Pricer {
            roles,
            cards: s.cards(),
            acceptance: s.mtp.acceptance.clone(),
        })
    }

    /// The layout at batch cap `b` per generating DP rank, for `p`'s requests and bounds.
    pub fn at(&mut self, p: &PlanInput, b: u32) -> Result<Estimate, String> {
        let cap = self.roles[0].device.pricer().spec().model.attn_cap();
        let (input, output) = (u64::from(p.input_tokens), f64::from(p.output_tokens));
        let context = input + u64::from(p.output_tokens) / 2;
        let full = input + u64::from(p.output_tokens);
        let (mut capacity, mut tpot_s, mut prefill_s) = (f64::INFINITY, 0.0f64, 0.0f64);
        let mut kv_seqs = u64::MAX;
        for r in &mut self.roles {
            let e = Mtp {
                tokens: r.mtp,
                acceptance: self.acceptance.clone(),
            }
            .expected_tokens();
            let q = 1 + u64::from(r.mtp);
            let decode = BatchShape::uniform_decode(b, q, context, cap);
            // Seconds of one rank's steps per request, and the request's TPOT.
            let (per_request_s, tpot, prefill) = match r.role {
                Role::Decode => {
                    let t_d = step_s(&mut r.device, r.dp, &decode)?;
                    (t_d * output / (f64::from(b) * e), t_d / e, 0.0)
                }
                Role::Prefill => {
                    let (rate, one) = prefill_alone(r, input, cap)?;
                    (1.0 / rate, 0.0, one)
                }
                Role::Mixed => {
                    let t_d = step_s(&mut r.device, r.dp, &decode)?;
                    let decode_s = t_d * output / (f64::from(b) * e);
                    let (prompt_s, prefill) = if r.separate_prefill {
                        let (rate, one) = prefill_alone(r, input, cap)?;
                        (1.0 / rate, one)
                    } else {
                        let room = u64::from(r.budget).saturating_sub(u64::from(b) * q);
                        if room == 0 {
                            (f64::INFINITY, f64::INFINITY)
                        } else {
                            // A chunk at the mean offset of the prompt's chunks: it attends
                            // to the ones before it.
                            let c = room.min(input);
                            let mut m = decode;
                            m.add_prefill(c, (input.div_ceil(c) - 1) * c / 2, cap);
                            let t_m = step_s(&mut r.device, r.dp, &m)?;
                            (
                                input as f64 * (t_m - t_d).max(0.0) / c as f64,
                                input.div_ceil(c) as f64 * t_m,
                            )
                        }
                    };
                    // The DP ranks step in lockstep: each rank's prompt steps stall them all
                    // (the worst case, prompts landing on the ranks in different steps).
                    let per = decode_s + f64::from(r.dp) * prompt_s;
                    (per, per * f64::from(b) / output, prefill)
                }
            };
            capacity = capacity.min(f64::from(r.count * r.dp) / per_request_s);
            tpot_s = tpot_s.max(tpot);
            prefill_s = prefill_s.max(prefill);
            if r.role != Role::Prefill {
                kv_seqs = kv_seqs.min(r.kv_tokens / full);
            }
        }
        let tpot_ms = tpot_s * 1e3;
        let prefill_ms = prefill_s * 1e3;
        let (tpot_bound, ttft_bound) = (p.tpot_bound_ms(), p.ttft_bound_ms());
        let ok = u64::from(b) <= kv_seqs && tpot_ms <= tpot_bound && prefill_ms <= ttft_bound;
        Ok(Estimate {
            capacity_req_s: capacity,
            tpot_ms,
            prefill_ms,
            kv_seqs,
            goodput_per_card: if ok { capacity / self.cards } else { 0.0 },
        })
    }
}

/// A prefill-only rank's requests per second and one prompt's prefill time alone, seconds:
/// whole prompts up to the budget and the batch cap in a step, or a longer prompt in chunks.
fn prefill_alone(
    r: &mut RoleDevice,
    input: u64,
    cap: dstwin_core::batch::AttnCap,
) -> Result<(f64, f64), String> {
    let budget = u64::from(r.budget);
    if input <= budget {
        let n = (budget / input).min(u64::from(r.seqs)).max(1) as u32;
        let t = step_s(
            &mut r.device,
            r.dp,
            &BatchShape::uniform_chunks(n, input, 0, cap),
        )?;
        let one = if n == 1 {
            t
        } else {
            step_s(
                &mut r.device,
                r.dp,
                &BatchShape::uniform_chunks(1, input, 0, cap),
            )?
        };
        return Ok((f64::from(n) / t, one));
    }
    let mut total = 0.0;
    let mut done = 0;
    while done < input {
        let c = budget.min(input - done);
        total += step_s(
            &mut r.device,
            r.dp,
            &BatchShape::uniform_chunks(1, c, done, cap),
        )?;
        done += c;
    }
    Ok((1.0 / total, total))
}
