//! Where one thread block's work sits in the problem: its batch and head, the K/V head it reads,
//! the row and key ranges of its sequence, and which key blocks the causal mask lets it skip or
//! must apply element-wise. Every kernel starts from a [`BlockInfo`], so grouped K/V heads (GQA)
//! and packed variable-length batches change this file, not the kernels.

use crate::common::mask::CausalMask;
use crate::common::params::AttentionShape;

/// One (batch, head) of the problem, as a block sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    pub batch: u32,
    /// The query head (and O's, and the statistics').
    pub head: u32,
    /// The K/V head this query head reads: the same head today (as many K/V heads as query
    /// heads); with grouped K/V heads, `head / (heads / kv_heads)`.
    pub kv_head: u32,
    /// batch·heads + head: the index of this head's rows in the (batch·heads, seqlen_q)
    /// statistics vectors and workspaces.
    pub batch_head: u32,
    /// Query rows of this head's sequence.
    pub seqlen_q: u32,
    /// Keys of this head's sequence.
    pub seqlen_k: u32,
    /// Whether the causal mask applies (see [`BlockInfo::mask`]).
    pub causal: bool,
}

impl BlockInfo {
    /// The block that works on head `batch_head` (batch-major) of `shape`.
    #[inline(always)]
    pub fn new(shape: &AttentionShape, batch_head: u32) -> Self {
        let (batch, head) = (batch_head / shape.heads, batch_head % shape.heads);
        Self {
            batch,
            head,
            kv_head: head,
            batch_head,
            seqlen_q: shape.seqlen_q,
            seqlen_k: shape.seqlen_k,
            causal: shape.causal != 0,
        }
    }

    /// The causal mask of this head's sequences (a no-op when not causal). Made where it is used,
    /// so its diagonal offset is computed where the kernel first needs it.
    #[inline(always)]
    pub fn mask(&self) -> CausalMask {
        CausalMask::new(self.causal, self.seqlen_q, self.seqlen_k)
    }

    /// The key blocks of `block_cols` keys that the row block `[row_start, row_start + block_rows)`
    /// visits, and which of them need the element-wise mask.
    #[inline(always)]
    pub fn key_blocks(&self, row_start: u32, block_rows: u32, block_cols: u32) -> KeyBlocks {
        KeyBlocks {
            seqlen_k: self.seqlen_k,
            mask: self.mask(),
            row_start,
            block_rows,
            block_cols,
        }
    }
    /// The row blocks of `block_rows` rows that the key block `[key_start, key_start +
    /// block_cols)` is seen by (the backward pass's inner loop), and which of them need the
    /// element-wise mask.
    #[inline(always)]
    pub fn row_blocks(&self, key_start: u32, block_cols: u32, block_rows: u32) -> RowBlocks {
        RowBlocks {
            seqlen_q: self.seqlen_q,
            seqlen_k: self.seqlen_k,
            mask: self.mask(),
            key_start,
            block_cols,
            block_rows,
        }
    }
}

/// The key blocks one row block visits: [`KeyBlocks::count`] of them from key 0 (the causal
/// mask hides every later block from all its rows, so those are never loaded), and which need the
/// element-wise mask ([`KeyBlocks::needs_mask`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyBlocks {
    seqlen_k: u32,
    mask: CausalMask,
    row_start: u32,
    block_rows: u32,
    block_cols: u32,
}

impl KeyBlocks {
    /// How many key blocks, from key 0, the rows see.
    #[inline(always)]
    pub fn count(&self) -> u32 {
        self.mask.key_blocks_needed(
            self.row_start + self.block_rows,
            self.seqlen_k,
            self.block_cols,
        )
    }

    /// Whether the key block starting at `key_start` runs past seqlen_k or crosses the causal
    /// diagonal, so its step is the one compiled with `MASK = true`; every other block runs the
    /// step with `MASK = false`.
    #[inline(always)]
    pub fn needs_mask(&self, key_start: u32) -> bool {
        key_start + self.block_cols > self.seqlen_k
            || self
                .mask
                .tile_needs_mask(self.row_start, key_start + self.block_cols)
    }

    /// The mask the masked steps apply element by element.
    #[inline(always)]
    pub fn mask(&self) -> CausalMask {
        self.mask
    }
}

/// The row blocks one key block is seen by, the backward pass's mirror of [`KeyBlocks`]: from
/// [`RowBlocks::first`] (every earlier row block is fully masked for these keys, so it is never
/// loaded) to [`RowBlocks::end`], the last row block of seqlen_q.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowBlocks {
    seqlen_q: u32,
    seqlen_k: u32,
    mask: CausalMask,
    key_start: u32,
    block_cols: u32,
    block_rows: u32,
}

impl RowBlocks {
    /// The first row block that sees a key of the block.
    #[inline(always)]
    pub fn first(&self) -> u32 {
        self.mask
            .first_row_block_needed(self.key_start, self.block_rows)
    }

    /// One past the last row block: ⌈seqlen_q / B_r⌉ (the last query sees every key).
    #[inline(always)]
    pub fn end(&self) -> u32 {
        self.seqlen_q.div_ceil(self.block_rows)
    }

    /// Whether the tile (rows from `row_start`, this key block) runs past seqlen_q or seqlen_k
    /// or crosses the causal diagonal, so its step is the one compiled with `MASK = true`.
    #[inline(always)]
    pub fn needs_mask(&self, row_start: u32) -> bool {
        row_start + self.block_rows > self.seqlen_q
            || self.key_start + self.block_cols > self.seqlen_k
            || self
                .mask
                .tile_needs_mask(row_start, self.key_start + self.block_cols)
    }

    /// The mask the masked steps apply element by element.
    #[inline(always)]
    pub fn mask(&self) -> CausalMask {
        self.mask
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(heads: u32, seqlen_q: u32, seqlen_k: u32, causal: bool) -> AttentionShape {
        AttentionShape {
            batch: 2,
            heads,
            seqlen_q,
            seqlen_k,
            head_dim: 64,
            softmax_scale: 0.125,
            causal: causal as u32,
            _pad: 0,
        }
    }

    #[test]
    fn batch_and_head_are_batch_major() {
        let block = BlockInfo::new(&shape(3, 10, 10, false), 5);
        assert_eq!((block.batch, block.head, block.kv_head), (1, 2, 2));
    }

    #[test]
    fn causal_blocks_past_the_diagonal_are_skipped_and_the_diagonal_is_masked() {
        // 256 × 256, causal, B_c = 64: rows 64..128 need key blocks 0 and 1; block 1 crosses the
        // diagonal, block 0 does not.
        let blocks = BlockInfo::new(&shape(1, 256, 256, true), 0).key_blocks(64, 64, 64);
        assert_eq!(blocks.count(), 2);
        assert!(!blocks.needs_mask(0));
        assert!(blocks.needs_mask(64));
        // Non-causal: every block, and only the tail past seqlen_k is masked.
        let blocks = BlockInfo::new(&shape(1, 100, 100, false), 0).key_blocks(0, 64, 64);
        assert_eq!(blocks.count(), 2);
        assert!(!blocks.needs_mask(0));
        assert!(blocks.needs_mask(64));
    }

    #[test]
    fn bottom_right_alignment_with_more_queries_than_keys() {
        // seqlen_q = 100 > seqlen_k = 40: the first 60 queries see no key, so rows 0..60 need
        // no key block at all.
        let block = BlockInfo::new(&shape(1, 100, 40, true), 0);
        assert_eq!(block.key_blocks(0, 60, 64).count(), 0);
        assert_eq!(block.key_blocks(0, 61, 64).count(), 1);
    }

    #[test]
    fn a_key_block_is_seen_from_its_first_row_block_on() {
        // 256 × 256, causal, B_r = B_c = 64: keys 64..128 are seen by rows 64 on; the row block
        // 64..128 crosses the diagonal, 128..192 does not.
        let blocks = BlockInfo::new(&shape(1, 256, 256, true), 0).row_blocks(64, 64, 64);
        assert_eq!((blocks.first(), blocks.end()), (1, 4));
        assert!(blocks.needs_mask(64));
        assert!(!blocks.needs_mask(128));
        // The row tail past seqlen_q is masked, causal or not.
        let blocks = BlockInfo::new(&shape(1, 100, 128, false), 0).row_blocks(0, 64, 64);
        assert_eq!((blocks.first(), blocks.end()), (0, 2));
        assert!(!blocks.needs_mask(0));
        assert!(blocks.needs_mask(64));
    }
}
