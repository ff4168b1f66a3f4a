//! [`CpuFabric`]: KV hand-offs between CPU instances, copied block by block.

use super::{failed, SharedCache};
use candle_core::Tensor;
use dstwin_core::device::{DeviceError, Fabric, InstantFabric, KvTransfer, ReqId};
use dstwin_core::time::SimTime;

/// Moves KV blocks between CPU instances: a transfer copies the named blocks of every cache
/// layer from the source rank's pool to the destination's, and is complete at once.
#[derive(Default)]
pub struct CpuFabric {
    /// Per instance, per DP rank, its pool.
    caches: Vec<Vec<SharedCache>>,
    done: InstantFabric,
}

impl CpuFabric {
    /// Adds the next instance's pools (in deployment order).
    pub fn add_instance(&mut self, caches: Vec<SharedCache>) {
        self.caches.push(caches);
    }

    fn pool(&self, instance: u32, rank: u32) -> Result<&SharedCache, DeviceError> {
        self.caches
            .get(instance as usize)
            .and_then(|c| c.get(rank as usize))
            .ok_or_else(|| {
                DeviceError::Failed(format!(
                    "KV transfer names instance {instance} rank {rank}, which the fabric does not have"
                ))
            })
    }
}

impl Fabric for CpuFabric {
    fn start(&mut self, now: SimTime, x: &KvTransfer) -> Result<(), DeviceError> {
        let from = self.pool(x.from.instance, x.from.rank)?.clone();
        let to = self.pool(x.to.instance, x.to.rank)?.clone();
        let len = x.tokens as usize;
        let rows: Vec<Tensor> = {
            let src = from.lock().map_err(failed)?;
            (0..src.layers())
                .map(|l| src.gather(l, &x.from.blocks, len))
                .collect::<candle_core::Result<_>>()
                .map_err(failed)?
        };
        let mut dst = to.lock().map_err(failed)?;
        for (l, r) in rows.iter().enumerate() {
            dst.write(l, &x.to.blocks, 0, r).map_err(failed)?;
        }
        self.done.start(now, x)
    }

    fn next_event(&self) -> Option<SimTime> {
        self.done.next_event()
    }

    fn poll(&mut self, now: SimTime, done: &mut Vec<ReqId>) {
        self.done.poll(now, done);
    }
}
