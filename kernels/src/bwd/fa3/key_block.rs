//! The FA3 backward block's coordinates: its key block j, and the row blocks i that see it
//! (the loop every role walks), with deterministic mode's order of the dQ_i additions.

use super::config::Fa3BackwardConfig;
use crate::arch;
use crate::common::block::{BlockInfo, RowBlocks};
use crate::common::params::Fa3BackwardParams;
use crate::tile::global::HeadVector;
use crate::tile::sequences::Sequences;

/// The block's key block and the row blocks that see it.
#[derive(Clone, Copy)]
pub(super) struct KeyBlock {
    /// The head, and in a packed batch its sequence's lengths and first rows.
    pub(super) info: BlockInfo,
    /// The first key, counted from the sequence's first.
    pub(super) key_start: u32,
    pub(super) row_blocks: RowBlocks,
    /// Q's rows in the whole packed tensors (L's and D's row length; the packed forms').
    total_q: u32,
}

impl KeyBlock {
    /// Key block x of head y; in deterministic mode with the causal mask the grid runs from the
    /// last key block (the shortest: fewest row blocks see it) down, FlashAttention-3's order
    /// there, because a row block's dQ_i then takes its key blocks' reductions from the last one
    /// down ([`Self::dq_turn`]), and a block may only wait for blocks started before it.
    /// In a packed batch (`C::PACKED`) block row y is head y % heads of the launch's sequence
    /// y / heads (`packed`, its table of offsets), whose own lengths and first rows the block
    /// takes (`BlockInfo::packed`); the grid's key blocks are the longest sequence's.
    #[inline(always)]
    pub(super) fn new<C: Fa3BackwardConfig>(p: &Fa3BackwardParams, packed: impl Sequences) -> Self {
        let shape = &p.base.shape;
        let batch_head = arch::block_idx_y();
        let info = packed.block(shape, batch_head, C::PACKED, C::LOCAL);
        let x = arch::block_idx_x();
        let key_block = if C::DETERMINISTIC && info.mask().is_bounded() {
            arch::grid_dim_x() - 1 - x
        } else {
            x
        };
        let key_start = key_block * C::BLOCK_COLS;
        Self {
            info,
            key_start,
            row_blocks: info.row_blocks(key_start, C::BLOCK_COLS, C::BLOCK_ROWS),
            total_q: packed.total_q(),
        }
    }

    /// This head's rows of L or D at `addr`: (batch·heads, seqlen_q), or a packed batch's
    /// (heads, total_q) from the sequence's first row.
    #[inline(always)]
    pub(super) fn statistics<C: Fa3BackwardConfig>(&self, addr: u64) -> HeadVector {
        HeadVector::of_block(addr, &self.info, C::PACKED, self.total_q)
    }

    /// Deterministic mode: how many key blocks add to row block `i`'s dQ before the one
    /// starting at `key_start` (FlashAttention-3's order). Without the mask every key block sees
    /// every row block, and they all reach it at the same step: ascending. With the causal mask
    /// the key blocks that see row block i are 0..n(i), and block j reaches it at its (i − first
    /// row block of j)-th step, the later blocks sooner: from the last one down, so that none
    /// waits long.
    #[inline(always)]
    pub(super) fn dq_turn<C: Fa3BackwardConfig>(info: &BlockInfo, key_start: u32, i: u32) -> u32 {
        let key_block = key_start / C::BLOCK_COLS;
        let mask = info.mask();
        if !mask.is_bounded() {
            return key_block;
        }
        let row_end = (i + 1) * C::BLOCK_ROWS;
        let seeing = mask.key_blocks_needed(row_end, info.seqlen_k, C::BLOCK_COLS);
        seeing.saturating_sub(1 + key_block)
    }

    /// Whether any row block sees these keys (none: dK_j = dV_j = 0, and nothing is loaded). A
    /// packed sequence's key blocks past its keys (the grid is the longest sequence's) have none.
    #[inline(always)]
    pub(super) fn has_rows<C: Fa3BackwardConfig>(&self) -> bool {
        (!C::PACKED || self.key_start < self.info.seqlen_k)
            && self.row_blocks.first() < self.row_blocks.end()
    }
}
