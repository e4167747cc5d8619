//! Which tiles (one row block of Q_i for one head) a block of the FA3 grid computes, in which
//! order.
//!
//! Tiles are numbered head-major, t = batch_head · row_blocks + r, and within a head the rows
//! run heaviest first where their key-block counts differ (r counts down from the last row
//! block when the window's right side is bounded, causal included: `BlockInfo::heaviest_rows_last`), which is the order in which the
//! hardware starts the blocks of the one-tile grid (⌈seqlen_q/B_r⌉, batch·heads): the blocks
//! running at once share few heads' K and V, which stay in L2, and the long causal rows start
//! early so the grid's tail is short. On that grid block (x, y) computes tile y·grid_x + x. On
//! the persistent grid (one block per SM, `Fa3Tiling::persistent`) block b starts at tile b and
//! then takes the next number from a counter in global memory (`tile::global::TileCounters`),
//! FlashAttention-3's dynamic scheduler: the same order, and a block that drew short tiles takes
//! more of them.

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

/// The tiles of one problem. Holds only the shape (kernel parameters, read where used):
/// whatever lives across the tile loop costs the consumers registers in their main loop.
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

    #[inline(always)]
    fn row_blocks(&self) -> u32 {
        self.shape.seqlen_q.div_ceil(self.block_rows)
    }

    /// This block's first tile: its index in the grid.
    #[inline(always)]
    pub fn first(&self) -> u32 {
        arch::block_idx_y() * arch::grid_dim_x() + arch::block_idx_x()
    }

    /// Tile `t`, if the problem has it.
    #[inline(always)]
    pub fn tile(&self, t: u32) -> Option<Tile> {
        let row_blocks = self.row_blocks();
        let tiles = row_blocks * self.shape.batch * self.shape.heads;
        (t < tiles).then(|| {
            let info = BlockInfo::new(self.shape, t / row_blocks);
            let r = t % row_blocks;
            // Causal or windowed: the last row blocks see the most keys; start them first.
            let row_block = if info.heaviest_rows_last() {
                row_blocks - 1 - r
            } else {
                r
            };
            let row_start = row_block * self.block_rows;
            Tile {
                info,
                row_start,
                blocks: info.key_blocks(row_start, self.block_rows, self.block_cols),
            }
        })
    }
}
