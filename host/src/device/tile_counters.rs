//! The persistent FA3 grid's tile counters (`tile::global::TileCounters` in the kernels): a device
//! ring of zeroed u32 pairs, the next pair for each call. A launch leaves its pair at zero again
//! (its last block resets it), so no memset runs between calls. A pair is reused only `SLOTS`
//! calls later: stream order makes that safe on one stream, and calls on different streams would
//! have to have that many launches in flight at once to share one.

use cudarc::driver::CudaSlice;

use super::Gpu;
use crate::error::{CudaContextExt, Result};

/// Counter pairs in the ring.
const SLOTS: usize = 64;
/// u32s per pair: the next tile, the blocks finished.
const WORDS: usize = 2;

/// The ring's buffer, allocated on first use, and the next pair to hand out.
#[derive(Default)]
pub struct TileCounterRing {
    buffer: Option<CudaSlice<u32>>,
    next: usize,
}

impl Gpu {
    /// The device address of a zeroed counter pair for one persistent launch.
    pub(crate) fn tile_counters(&self) -> Result<u64> {
        let mut ring = self
            .tile_counters
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if ring.buffer.is_none() {
            let buffer = self
                .stream
                .alloc_zeros::<u32>(SLOTS * WORDS)
                .context(|| "allocating the tile counters".into())?;
            ring.buffer = Some(buffer);
        }
        let slot = ring.next;
        ring.next = (slot + 1) % SLOTS;
        let base = self.address(ring.buffer.as_ref().expect("allocated above"));
        Ok(base + (slot * WORDS * size_of::<u32>()) as u64)
    }
}
