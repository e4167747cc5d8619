//! The KV cache's bookkeeping on the device, each with the host copy the checks read: the
//! sequences' lengths and a paged cache's block table.

use cudarc::driver::CudaSlice;
use ndarray::ArrayView2;

use crate::device::Gpu;
use crate::error::{Error, Result};

/// Keys in each sequence's cache (before a call's append): on the device for the kernels, and on
/// the host so that every call is checked before it launches (lengths past the cache, pages the
/// block table does not name).
pub struct CacheSeqlens {
    /// `None` for lengths that only plan a call ([`CacheSeqlens::host`]).
    pub(crate) device: Option<CudaSlice<u32>>,
    host: Vec<u32>,
}

impl std::fmt::Debug for CacheSeqlens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CacheSeqlens").field(&self.host).finish()
    }
}

impl CacheSeqlens {
    /// Uploads `lengths` (one per sequence; 0 is an empty cache).
    pub fn new(gpu: &Gpu, lengths: &[u32]) -> Result<Self> {
        let mut seqlens = Self::host(lengths)?;
        seqlens.device = Some(gpu.upload(lengths, "cache_seqlens")?);
        Ok(seqlens)
    }

    /// `lengths` on the host alone: enough to check and plan a call (with layout-only tensors,
    /// without a GPU), not to run it.
    pub fn host(lengths: &[u32]) -> Result<Self> {
        if lengths.is_empty() {
            return Err(Error::invalid(
                "cache_seqlens",
                "[]",
                "one length per sequence (batch ≥ 1)",
            ));
        }
        Ok(Self {
            device: None,
            host: lengths.to_vec(),
        })
    }

    pub fn lengths(&self) -> &[u32] {
        &self.host
    }
}

/// A paged cache's block table: row b names the pages of sequence b, page i holding its keys
/// [i·page_size, (i + 1)·page_size). Entries past a sequence's length are never read.
pub struct BlockTable {
    /// `None` for a table that only plans a call ([`BlockTable::host`]).
    pub(crate) device: Option<CudaSlice<u32>>,
    /// Per row, the running maximum of its entries: the largest page the first i + 1 entries
    /// name is `prefix_max[b][i]`, so a call checks its pages in O(batch).
    prefix_max: Vec<Vec<u32>>,
    width: usize,
}

impl std::fmt::Debug for BlockTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockTable")
            .field("dims", &self.dims())
            .finish()
    }
}

impl BlockTable {
    /// Uploads `table` (batch rows × pages-per-sequence columns).
    pub fn new(gpu: &Gpu, table: ArrayView2<u32>) -> Result<Self> {
        let mut block_table = Self::host(table)?;
        let contiguous: Vec<u32> = table.iter().copied().collect();
        block_table.device = Some(gpu.upload(&contiguous, "block_table")?);
        Ok(block_table)
    }

    /// `table` on the host alone: enough to check and plan a call, not to run it.
    pub fn host(table: ArrayView2<u32>) -> Result<Self> {
        let (rows, width) = table.dim();
        if rows == 0 || width == 0 {
            return Err(Error::invalid(
                "block_table",
                format!("shape ({rows}, {width})"),
                "at least one row (sequence) and one column (page)",
            ));
        }
        let prefix_max = table
            .rows()
            .into_iter()
            .map(|row| {
                row.iter()
                    .scan(0u32, |max, &page| {
                        *max = (*max).max(page);
                        Some(*max)
                    })
                    .collect()
            })
            .collect();
        Ok(Self {
            device: None,
            prefix_max,
            width,
        })
    }

    /// (sequences, pages per sequence).
    pub fn dims(&self) -> (usize, usize) {
        (self.prefix_max.len(), self.width)
    }

    /// The shape and the page ranges the checks need, without the device.
    pub fn pages(&self) -> TablePages<'_> {
        TablePages {
            prefix_max: &self.prefix_max,
            width: self.width,
        }
    }
}

/// What the problem's checks read of a block table: its width and, per row, the largest page
/// among its first entries.
#[derive(Clone, Copy, Debug)]
pub struct TablePages<'a> {
    pub prefix_max: &'a [Vec<u32>],
    pub width: usize,
}
