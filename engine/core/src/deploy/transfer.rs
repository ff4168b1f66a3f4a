//! The prefill-to-decode KV hand-off: the transfer a decode instance's allocation starts, and
//! what its completion frees and wakes on both sides.

use super::{Deferred, Deployment, Effect, Note};
use crate::device::{KvEnd, KvTransfer, ReqId};
use crate::layout::Role;
use crate::time::SimTime;

impl Deployment {
    /// A decode instance allocated blocks for a request whose KV is on a prefill instance.
    pub(super) fn start_transfer(&mut self, d: u32, id: ReqId) {
        let Some(r) = self.reqs.get(id) else {
            return;
        };
        let tokens = r.prompt + r.emitted;
        let bytes = tokens as f64 * self.cfg.kv_bytes_per_token;
        let to = self.slots[d as usize]
            .inst
            .blocks_of(id)
            .map(|(rank, blocks)| KvEnd {
                instance: d,
                rank,
                blocks: blocks.to_vec(),
            })
            .unwrap_or(KvEnd {
                instance: d,
                rank: r.rank,
                blocks: Vec::new(),
            });
        let from = r
            .prefill
            .and_then(|p| {
                self.slots[p as usize]
                    .inst
                    .blocks_of(id)
                    .map(|(rank, blocks)| KvEnd {
                        instance: p,
                        rank,
                        blocks: blocks.to_vec(),
                    })
            })
            .unwrap_or_default();
        self.notes.push(Note::KvSent {
            req: id,
            inst: d,
            tokens,
            bytes,
        });
        self.effects.push(Effect::Transfer(KvTransfer {
            req: id,
            tokens,
            bytes,
            from,
            to,
        }));
    }

    /// A KV transfer finished: the decode side may compute, the prefill side frees its copy.
    pub fn transfer_done(&mut self, now: SimTime, id: ReqId) {
        let Some(r) = self.reqs.get(id) else {
            // Aborted while its KV moved; both sides already freed it.
            return;
        };
        let (d, p) = (r.decode, r.prefill);
        self.notes.push(Note::KvArrived { req: id, inst: d });
        let slot = &mut self.slots[d as usize];
        if slot.inst.config().async_scheduling && slot.busy {
            slot.deferred.push(Deferred::KvArrived(id));
        } else {
            slot.inst.kv_arrived(id, now);
        }
        if let Some(p) = p {
            if self.slots[p as usize].role == Role::Prefill {
                self.slots[p as usize].inst.release_kv(id);
                self.want_start(p);
            }
        }
        self.want_start(d);
    }

    /// Applies every KV transfer `fabric` has completed by `now` ([`Deployment::transfer_done`]
    /// for each, in completion order).
    pub fn poll_transfers(&mut self, now: SimTime, fabric: &mut dyn crate::device::Fabric) {
        let mut done = std::mem::take(&mut self.buf);
        done.clear();
        fabric.poll(now, &mut done);
        for &id in &done {
            self.transfer_done(now, id);
        }
        self.buf = done;
    }
}
