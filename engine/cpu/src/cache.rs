//! The paged latent KV pool: per cache layer (decoder layers, then MTP modules) one tensor of
//! `[num_blocks, block_size, kv_lora_rank + qk_rope_head_dim]`. A token's entry is its
//! normalized `c_kv` followed by its rotated `k_pe`. A sequence addresses its tokens through
//! its block table (block ids in token order), as dstwin's scheduler hands them out.

use crate::config::EngineConfig;
use crate::error::ModelError;
use candle_core::{DType, Device, Tensor};

#[derive(Debug)]
pub struct PagedKvCache {
    /// Per cache layer, `[num_blocks * block_size, width]` (a view of the `[num_blocks,
    /// block_size, width]` pool).
    layers: Vec<Tensor>,
    num_blocks: usize,
    block_size: usize,
    width: usize,
}

impl PagedKvCache {
    /// A zeroed pool for every layer of `cfg` (its MTP modules included).
    pub fn new(
        cfg: &EngineConfig,
        num_blocks: usize,
        block_size: usize,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<PagedKvCache> {
        assert!(block_size > 0 && num_blocks > 0, "empty KV pool");
        let width = cfg.kv_width();
        let layers = (0..cfg.cache_layers())
            .map(|_| Tensor::zeros((num_blocks * block_size, width), dtype, dev))
            .collect::<candle_core::Result<_>>()?;
        Ok(PagedKvCache {
            layers,
            num_blocks,
            block_size,
            width,
        })
    }

    /// Cache layers (decoder layers, then MTP modules).
    pub fn layers(&self) -> usize {
        self.layers.len()
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The pool of one cache layer, `[num_blocks, block_size, width]` (shares storage).
    pub fn layer(&self, layer: usize) -> candle_core::Result<Tensor> {
        self.layers[layer].reshape((self.num_blocks, self.block_size, self.width))
    }

    /// Checks that `blocks` can hold `len` tokens and names real blocks.
    pub fn check_table(&self, seq: usize, blocks: &[u32], len: usize) -> Result<(), ModelError> {
        let capacity = blocks.len() * self.block_size;
        if capacity < len {
            return Err(ModelError::BlockTable {
                seq,
                blocks: blocks.len(),
                capacity,
                needed: len,
            });
        }
        let used = len.div_ceil(self.block_size);
        if let Some(&b) = blocks[..used]
            .iter()
            .find(|&&b| b as usize >= self.num_blocks)
        {
            return Err(ModelError::BlockId {
                block: b,
                num_blocks: self.num_blocks,
            });
        }
        Ok(())
    }

    /// Writes `rows [n, width]` as the entries of positions `start..start + n`.
    pub fn write(
        &mut self,
        layer: usize,
        blocks: &[u32],
        start: usize,
        rows: &Tensor,
    ) -> candle_core::Result<()> {
        let n = rows.dims2()?.0;
        let rows = rows.to_dtype(self.layers[layer].dtype())?;
        let mut i = 0;
        while i < n {
            let pos = start + i;
            let in_block = pos % self.block_size;
            let run = (self.block_size - in_block).min(n - i);
            let slot = blocks[pos / self.block_size] as usize * self.block_size + in_block;
            self.layers[layer].slice_set(&rows.narrow(0, i, run)?.contiguous()?, 0, slot)?;
            i += run;
        }
        Ok(())
    }

    /// The entries of positions `0..len`, `[len, width]`.
    pub fn gather(&self, layer: usize, blocks: &[u32], len: usize) -> candle_core::Result<Tensor> {
        let slots: Vec<u32> = (0..len)
            .map(|p| {
                blocks[p / self.block_size] * self.block_size as u32 + (p % self.block_size) as u32
            })
            .collect();
        let ids = Tensor::from_vec(slots, len, self.layers[layer].device())?;
        self.layers[layer].index_select(&ids, 0)
    }
}
