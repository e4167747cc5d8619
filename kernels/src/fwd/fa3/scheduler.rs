//! Which tiles (one row block of Q_i for one head) a block of the FA3 grid computes, in which
//! order: FlashAttention-3's static persistent scheduler.
//!
//! Tiles are numbered head-major, t = batch_head · row_blocks + r, so the tiles that run at once
//! share few heads' K and V (they stay in L2); within a head, causal rows run heaviest first
//! (r counts down from the last row block). A block starts at tile
//! `block_idx.y · grid_dim.x + block_idx.x` and strides by the grid's size: on the one-tile-per-block
//! grid (⌈seqlen_q/B_r⌉, batch·heads) each block computes exactly its tile; on a persistent grid
//! of one block per SM each block walks every `grid`-th tile, and the producer loads the next
//! tile's Q and first K/V blocks while the consumers finish the current one.

use crate::arch;
use crate::common::block::{BlockInfo, KeyBlocks};
use crate::common::params::AttentionShape;

/// One tile: its head, its rows and the key blocks they visit.
#[derive(Clone, Copy)]
pub struct Tile {
    pub info: BlockInfo,
    pub row_start: u32,
    pub blocks: KeyBlocks,
}

/// The tiles of one problem, and this block's share of them. Holds only the shape (kernel
/// parameters, read where used) and the block's position: whatever lives across the tile loop
/// costs the consumers registers in their main loop.
#[derive(Clone, Copy)]
pub struct TileScheduler<'a> {
    shape: &'a AttentionShape,
    block_rows: u32,
    block_cols: u32,
}

impl<'a> TileScheduler<'a> {
    #[inline(always)]
    pub fn new(shape: &'a AttentionShape, block_rows: u32, block_cols: u32) -> Self {
        Self {
            shape,
            block_rows,
            block_cols,
        }
    }

    fn row_blocks(&self) -> u32 {
        self.shape.seqlen_q.div_ceil(self.block_rows)
    }

    /// This block's first tile's number.
    #[inline(always)]
    pub fn first(&self) -> u32 {
        arch::block_idx_y() * arch::grid_dim_x() + arch::block_idx_x()
    }

    /// The number of this block's tile after tile `t`.
    #[inline(always)]
    pub fn next(&self, t: u32) -> u32 {
        t + arch::grid_dim_x() * arch::grid_dim_y()
    }

    /// Tile `t`, if the problem has it.
    #[inline(always)]
    pub fn tile(&self, t: u32) -> Option<Tile> {
        let row_blocks = self.row_blocks();
        let tiles = row_blocks * self.shape.batch * self.shape.heads;
        (t < tiles).then(|| self.tile_unchecked(t, row_blocks))
    }

    #[inline(always)]
    fn tile_unchecked(&self, t: u32, row_blocks: u32) -> Tile {
        let info = BlockInfo::new(self.shape, t / row_blocks);
        let r = t % row_blocks;
        // Causal: the last row blocks see the most keys; start them first so the tail is short.
        let row_block = if info.causal { row_blocks - 1 - r } else { r };
        let row_start = row_block * self.block_rows;
        Tile {
            info,
            row_start,
            blocks: info.key_blocks(row_start, self.block_rows, self.block_cols),
        }
    }
}
