//! Which tiles (one row block of Q_i for one head) a block of the FA3 grid computes, in which
//! order.
//!
//! Without a mask, tiles are numbered head-major, t = batch_head · row_blocks + r: the blocks
//! running at once share few heads' K and V, which stay in L2. With the causal mask or a window
//! bounded on the right (`BlockInfo::heaviest_rows_last`) the tiles differ in length (causal row
//! block r visits about r + 1 key blocks), and the grid's tail is shortest
//! when the longest tiles start first and the shortest end it (longest-processing-time-first,
//! FlashAttention-3's `SingleTileLPTScheduler`). Across all heads at once that order would make
//! the blocks running together read as many heads' K and V as there are SMs, more than L2
//! holds, so the heads are cut into sections whose K and V fit in [`L2_SECTION_BYTES`]: section by
//! section, row blocks from the last (longest) to the first, and within a row block every head
//! of the section. The hardware starts the one-tile grid's blocks (⌈seqlen_q/B_r⌉, batch·heads)
//! in order of their linear index, and block (x, y) computes tile y·grid_x + x. On the
//! persistent grid (one block per SM, `Fa3Tiling::persistent`) block b starts at tile b and
//! then takes the next number from a counter in global memory (`tile::global::TileCounters`),
//! FlashAttention-3's dynamic scheduler: the same order, and a block that drew short tiles takes
//! more of them.

#[cfg(target_arch = "nvptx64")]
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
    /// The kernel's form takes windows (`Fa3Config::LOCAL`; else the causal mask or none).
    local: bool,
}

impl<'a> TileScheduler<'a> {
    #[inline(always)]
    pub fn new(shape: &'a AttentionShape, block_rows: u32, block_cols: u32, local: bool) -> Self {
        Self {
            shape,
            block_rows,
            block_cols,
            local,
        }
    }

    #[inline(always)]
    fn row_blocks(&self) -> u32 {
        self.shape.seqlen_q.div_ceil(self.block_rows)
    }

    /// This block's first tile: its index in the grid.
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    pub fn first(&self) -> u32 {
        arch::block_idx_y() * arch::grid_dim_x() + arch::block_idx_x()
    }

    /// Heads per causal section: as many as have K and V (2·seqlen_k·d elements of 2 bytes each)
    /// within [`L2_SECTION_BYTES`], at least one.
    #[inline(always)]
    fn section_heads(&self) -> u32 {
        let head_bytes = (4 * self.shape.head_dim).saturating_mul(self.shape.seqlen_k);
        (L2_SECTION_BYTES / head_bytes.max(1)).max(1)
    }

    /// Tile `t`, if the problem has it.
    #[inline(always)]
    pub fn tile(&self, t: u32) -> Option<Tile> {
        let row_blocks = self.row_blocks();
        let heads = self.shape.batch * self.shape.heads;
        if t >= row_blocks * heads {
            return None;
        }
        let (batch_head, row_block) =
            if BlockInfo::of_form(self.shape, 0, self.local).heaviest_rows_last() {
                // Section by section; in one, r counts row blocks down from the longest, and the
                // section's heads take turns at each (the last section may have fewer heads).
                let section = self.section_heads().min(heads);
                let first_head = t / (section * row_blocks) * section;
                let section_heads = section.min(heads - first_head);
                let u = t - first_head * row_blocks;
                let r = u / section_heads;
                (first_head + u % section_heads, row_blocks - 1 - r)
            } else {
                (t / row_blocks, t % row_blocks)
            };
        let info = BlockInfo::of_form(self.shape, batch_head, self.local);
        let row_start = row_block * self.block_rows;
        Some(Tile {
            info,
            row_start,
            blocks: info.key_blocks(row_start, self.block_rows, self.block_cols),
        })
    }

    /// `tile` for the head `info` describes instead: a packed batch's sequence, whose own
    /// `BlockInfo::packed` has its lengths and first rows (its row blocks past its length have
    /// no rows).
    #[inline(always)]
    pub fn for_sequence(&self, tile: Tile, info: BlockInfo) -> Tile {
        Tile {
            info,
            blocks: info.key_blocks(tile.row_start, self.block_rows, self.block_cols),
            ..tile
        }
    }
}

/// The K and V bytes of one causal section's heads: a part of the H100's and H200's 50 MB of L2,
/// the share FlashAttention-3's scheduler gives them (32 MiB), so that the other operands and the
/// running blocks' neighbours stay too.
pub const L2_SECTION_BYTES: u32 = 32 << 20;

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    fn shape(batch: u32, heads: u32, seqlen_q: u32, seqlen_k: u32, causal: bool) -> AttentionShape {
        AttentionShape {
            batch,
            heads,
            seqlen_q,
            seqlen_k,
            head_dim: 128,
            softmax_scale: 1.0,
            causal: causal as u32,
            ..Default::default()
        }
    }

    /// Every (head, row block) exactly once, as `(batch_head, row_start, key blocks)` in tile order.
    fn walk(shape: &AttentionShape) -> Vec<(u32, u32, u32)> {
        let scheduler = TileScheduler::new(shape, 128, 128, true);
        let tiles: Vec<_> = (0..)
            .map_while(|t| scheduler.tile(t))
            .map(|tile| (tile.info.batch_head, tile.row_start, tile.blocks.count()))
            .collect();
        let mut seen: Vec<_> = tiles.iter().map(|&(h, r, _)| (h, r)).collect();
        seen.sort();
        seen.dedup();
        let rows = shape.seqlen_q.div_ceil(128);
        assert_eq!(seen.len(), tiles.len(), "a tile twice");
        assert_eq!(tiles.len() as u32, shape.batch * shape.heads * rows);
        tiles
    }

    #[test]
    fn without_a_mask_tiles_run_head_by_head() {
        let tiles = walk(&shape(2, 3, 300, 300, false));
        let order: Vec<_> = tiles.iter().map(|&(h, r, _)| (h, r / 128)).collect();
        assert_eq!(&order[..4], &[(0, 0), (0, 1), (0, 2), (1, 0)]);
    }

    #[test]
    fn causal_tiles_run_longest_first_within_each_l2_section() {
        // K and V of one head at seqlen_k = 32k, d = 128: 16 MiB, so two heads a section.
        let causal = shape(1, 5, 640, 32768, true);
        assert_eq!(
            TileScheduler::new(&causal, 128, 128, true).section_heads(),
            2
        );
        let tiles = walk(&causal);
        let sections = [0..10, 10..20, 20..25];
        for section in sections {
            let part = &tiles[section.clone()];
            assert!(part.windows(2).all(|w| w[0].2 >= w[1].2), "{part:?}");
            // The last section holds the fifth head alone.
            if section.start == 20 {
                assert!(part.iter().all(|&(h, _, _)| h == 4));
            }
        }
        // A sliding window bounded on the right is ordered as causal; one bounded on the left
        // only (every row block but the first ones as long) runs head by head.
        let sliding = AttentionShape {
            window_left: 256,
            window_right: 0,
            ..shape(2, 3, 1000, 1000, false)
        };
        let tiles = walk(&sliding);
        assert_eq!(tiles[0].1, 896, "{tiles:?}");
        let left_only = AttentionShape {
            window_left: 256,
            window_right: -1,
            ..shape(2, 3, 1000, 1000, false)
        };
        let order: Vec<_> = walk(&left_only).iter().map(|&(h, r, _)| (h, r)).collect();
        assert_eq!(&order[..3], &[(0, 0), (0, 128), (0, 256)]);
        // Short problems: one section of every head, so the grid ends on the shortest tiles.
        let tiles = walk(&shape(4, 8, 2048, 2048, true));
        assert!(tiles.windows(2).all(|w| w[0].2 >= w[1].2));
        assert_eq!(tiles.last().unwrap().2, 1);
    }
}
