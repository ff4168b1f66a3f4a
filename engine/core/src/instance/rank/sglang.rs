//! SGLang's admission ([`SglangAdmission`]): what the KV must hold before a waiting request
//! starts, and the rank's `new_token_ratio` that sizes it.

use super::{blocks_for, RankScheduler, Seq};
use crate::batch::BatchShape;
use crate::instance::{AdmissionRule, SglangAdmission};

/// SGLang's clip of a request's remaining-output estimate
/// (`SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`).
const CLIP: u64 = 4096;
/// Decode steps the ratio set after a retraction allows each remaining request
/// (`SGLANG_RETRACT_DECODE_STEPS`).
const RETRACT_DECODE_STEPS: u64 = 20;

/// What the plan being applied does to the ratio.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) enum RatioStep {
    /// Nothing (no request decoded).
    #[default]
    None,
    /// It decodes without retracting: the ratio decays.
    Decoded,
    /// It retracted requests: the ratio becomes this estimate.
    Retracted(f64),
}

impl RankScheduler {
    fn sglang(&self) -> Option<SglangAdmission> {
        match self.cfg.admission {
            AdmissionRule::Sglang(a) => Some(a),
            AdmissionRule::Vllm => None,
        }
    }

    /// Tokens `s` has produced by the step being planned: a steady request's `output` is
    /// already its value at the end of its window, so it is counted from the window's start
    /// at one token a step (exact without MTP, a lower bound with it).
    fn produced(&self, s: &Seq) -> u32 {
        if s.until == 0 {
            s.output
        } else {
            s.output
                .min(s.base_output + self.step.saturating_sub(s.from) as u32)
        }
    }

    /// Tokens `s` is still to produce.
    fn left(&self, s: &Seq) -> u64 {
        s.max_output.saturating_sub(self.produced(s)) as u64
    }

    /// Whether the waiting request at the front of the queue (`slot`), with `uncomputed`
    /// prompt tokens still to compute, may start; `hits` of its prefix-cache blocks sit in the
    /// free queue (it takes them); the last `fresh` running requests started in this step
    /// (SGLang reserves their whole outputs, the others' at the ratio).
    pub(super) fn sglang_admits(
        &self,
        slot: u32,
        uncomputed: u64,
        hits: u64,
        fresh: usize,
    ) -> bool {
        let Some(a) = self.sglang() else {
            return true;
        };
        let bs = self.cfg.block_size as u64;
        let free = self.pool.free().saturating_sub(hits) * bs;
        let s = self.seq(slot);
        if s.remote {
            // The decode side's preallocation: room for its prompt, and `reserved_decode_tokens`
            // for it and every request running or receiving its KV.
            let holders = (self.num_running() + self.pulling + 1) as u64;
            return s.prompt as u64 + holders * a.reserved_decode_tokens as u64 <= free;
        }
        let older = self.running.len() - fresh;
        // SGLang's running batch: the decoding requests (a prompt still being computed in
        // chunks is not in it).
        let decoding = self.running[..older]
            .iter()
            .map(|&x| self.seq(x))
            .filter(|r| r.output > 0 && r.computed + 1 >= r.prompt + r.output)
            .chain(self.steady.slots.iter().map(|&x| self.seq(x)));
        let reserved: u64 = decoding.map(|r| self.left(r).min(CLIP)).sum();
        let started: u64 = self.running[older..]
            .iter()
            .map(|&x| self.left(self.seq(x)).min(CLIP))
            .sum();
        // What SGLang's adder has left: the free KV less the running requests' outputs at
        // the ratio and the outputs of the prompts it already took in this step.
        let rem_total = free as f64 - reserved as f64 * self.new_token_ratio - started as f64;
        if !a.ignore_eos_path {
            let need = uncomputed + self.left(s).min(CLIP) + bs;
            return (need as f64) < rem_total;
        }
        // Every request (the new one too) in the order of its remaining output: while the
        // ones before it finish and free what they hold, it still has room to finish.
        let paged = blocks_for(uncomputed, self.cfg.block_size) * bs + bs;
        if paged as f64 > rem_total {
            return false;
        }
        let Some(mut rem) = free.checked_sub(paged) else {
            return false;
        };
        let mut states: Vec<(u64, u64)> = self
            .running
            .iter()
            .chain(&self.steady.slots)
            .map(|&x| self.seq(x))
            .chain(std::iter::once(s))
            .map(|r| (self.left(r), (r.prompt + self.produced(r)) as u64))
            .filter(|&(l, _)| l > 0)
            .collect();
        states.sort_unstable();
        let n = states.len() as u64;
        for (i, &(l, held)) in states.iter().enumerate() {
            let waiting = n - i as u64;
            // SGLang keeps one token per request spare (`IGNORE_EOS_RESERVE_TOKENS`).
            if rem <= (l + 1) * waiting {
                return false;
            }
            rem += held;
        }
        true
    }

    /// What a planned step does to the ratio (nothing without SGLang's admission). SGLang
    /// changes it in decode batches only (a batch with prompts neither decays nor retracts
    /// it); a retraction, in this plan or in the held plan it replans, sets it.
    pub(super) fn ratio_step_of(&self, preempted: bool, shape: &BatchShape) -> RatioStep {
        if self.sglang().is_none() {
            RatioStep::None
        } else if preempted {
            RatioStep::Retracted(self.ratio_after_retraction())
        } else if shape.prefill_seqs == 0 && shape.decode_seqs > 0 {
            RatioStep::Decoded
        } else {
            RatioStep::None
        }
    }

    /// The ratio a retraction leaves, from the requests still running.
    fn ratio_after_retraction(&self) -> f64 {
        let (mut produced, mut outputs, mut n) = (0u64, 0u64, 0u64);
        for &x in self.running.iter().chain(&self.steady.slots) {
            let s = self.seq(x);
            produced += self.produced(s) as u64;
            outputs += s.max_output as u64;
            n += 1;
        }
        ((produced + RETRACT_DECODE_STEPS * n) as f64 / (outputs + 1) as f64).min(1.0)
    }

    /// Applies what the step did to the ratio.
    pub(super) fn step_ratio(&mut self, step: RatioStep) {
        let Some(a) = self.sglang() else {
            return;
        };
        self.new_token_ratio = match step {
            RatioStep::None => self.new_token_ratio,
            RatioStep::Decoded => (self.new_token_ratio - a.decay).max(a.min_ratio),
            RatioStep::Retracted(r) => r,
        };
    }

    /// Before planning a step: a rank with nothing running starts again from `init_ratio`
    /// (SGLang resets it when its scheduler finds no batch to run).
    pub(super) fn ratio_when_idle(&mut self) {
        if let Some(a) = self.sglang() {
            if !self.runs() {
                self.new_token_ratio = a.init_ratio;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::batch::AttnCap;
    use crate::device::StepOutcome;
    use crate::instance::{AdmissionRule, Instance, InstanceConfig, NewRequest, SglangAdmission};
    use crate::layout::Role;
    use crate::time::SimTime;

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

    /// A low conservativeness (initial ratio 0.07) lets two requests start that the KV cannot
    /// hold to their ends; when the newer is retracted the ratio becomes (tokens produced + 20)
    /// / (output + 1) of the one left, about 0.5, from the 0.06 it had decayed to.
    #[test]
    fn a_retraction_sets_the_ratio_from_what_the_remaining_requests_produced() {
        let a = SglangAdmission::new(0.1, false, 512);
        let mut inst = Instance::new(InstanceConfig {
            role: Role::Mixed,
            dp_ranks: 1,
            max_num_batched_tokens: 2048,
            max_num_seqs: 8,
            block_size: 1,
            num_kv_blocks: 1000,
            enable_chunked_prefill: true,
            enable_prefix_caching: false,
            long_prefill_token_threshold: 0,
            max_model_len: 1 << 20,
            num_spec_tokens: 0,
            attn_cap: AttnCap(None),
            send_back: false,
            async_scheduling: false,
            prefill_delay_passes: 0,
            balance_scheduling: false,
            separate_prefill_batches: false,
            dp_dispatch: Default::default(),
            admission: AdmissionRule::Sglang(a),
        });
        inst.add_request(req(1, 100, 800), SimTime::ZERO);
        inst.add_request(req(2, 100, 500), SimTime::ZERO);
        let mut before = a.init_ratio;
        for _ in 0..1000 {
            inst.schedule(SimTime::ZERO);
            let accepted = inst
                .plan()
                .ranks
                .iter()
                .map(|r| vec![0; r.decode.len()])
                .collect();
            let mut ev = Vec::new();
            inst.apply(
                SimTime::ZERO,
                &StepOutcome {
                    accepted,
                    ..Default::default()
                },
                &mut ev,
            );
            let ratio = inst.ranks[0].new_token_ratio;
            if inst.stats().preemptions > 0 {
                let s = inst.ranks[0].seq(inst.ranks[0].running[0]);
                assert_eq!(s.id, 1, "the newer request is retracted");
                // Request 1 had sampled one token less when the step was planned.
                let want = ((s.output - 1 + 20) as f64 / 801.0).min(1.0);
                assert!((ratio - want).abs() < 1e-12, "{ratio} against {want}");
                assert!(
                    before < a.init_ratio - 100.0 * a.decay && ratio > 0.4,
                    "{before} -> {ratio}"
                );
                return;
            }
            before = ratio;
        }
        panic!("the KV never ran out");
    }
}
