//! Hopper's shared tiles: 16-bit tiles in 64-column panels with the 128-byte swizzle, as TMA
//! writes them and wgmma reads them (`arch::sm90`), and one head of a tensor as a TMA source.
//!
//! ```text
//!  tile of R rows × d columns  =  panels(d) panels of R × 64, each R·128 bytes, consecutive
//!  panel 0 │ row 0: 128 B │ row 1 │ … │ row R−1 │  panel 1 │ row 0 │ …
//!  S = Q·Kᵀ, k-step s (16 columns):  panel s/4, 32·(s%4) bytes into each row (K-major operand)
//!  Õ += P̃·V, keys 16c..16c+16:        16c rows into panel 0; panels apart = R·128 (MN-major)
//! ```

use crate::arch::{self, L2Priority, MBarrier, MatrixDescriptor, SharedAddress, TensorMap};
use crate::fwd::fa3::config::{F32_BOX_COLS, PANEL_COLS, PANEL_ROW_BYTES, WGMMA_K};
use crate::tile::layout::swizzled_f32_offset;

/// wgmma k-steps per panel: 64 columns / 16.
const STEPS_PER_PANEL: u32 = PANEL_COLS / WGMMA_K;
/// Bytes one k-step advances inside a panel row.
const STEP_BYTES: u32 = WGMMA_K * 2;
/// The swizzle permutes 16-byte chunks (8 16-bit elements) of a row ...
const CHUNK_BYTES: u32 = 16;
const CHUNK_ELEMENTS: u32 = CHUNK_BYTES / 2;
/// ... by the row's index within its 8-row atom.
const SWIZZLE_ROWS: u32 = 8;

/// A swizzled tile of `rows` rows in shared memory (1024-byte aligned).
#[derive(Clone, Copy)]
pub struct SwizzledTile {
    start: SharedAddress,
    rows: u32,
}

impl SwizzledTile {
    #[inline(always)]
    pub fn new(start: SharedAddress, rows: u32) -> Self {
        Self { start, rows }
    }

    /// The same tile `bytes` further on in shared memory.
    #[inline(always)]
    pub fn shifted(&self, bytes: u32) -> Self {
        Self::new(self.start.offset(bytes), self.rows)
    }

    /// Bytes between panels.
    #[inline(always)]
    pub fn panel_bytes(&self) -> u32 {
        self.rows * PANEL_ROW_BYTES
    }

    /// Where panel `panel` starts (a TMA box's destination).
    #[inline(always)]
    pub fn panel(&self, panel: u32) -> SharedAddress {
        self.start.offset(panel * self.panel_bytes())
    }

    /// The K-major operand of k-step `step` (columns 16·step..16·step + 16) from row
    /// `first_row` on (a multiple of 8: 64 rows of Q for a consumer, or every key of K).
    #[inline(always)]
    pub fn k_major_step(&self, first_row: u32, step: u32) -> MatrixDescriptor {
        let panel = self.panel(step / STEPS_PER_PANEL);
        let offset = first_row * PANEL_ROW_BYTES + step % STEPS_PER_PANEL * STEP_BYTES;
        MatrixDescriptor::k_major(panel.offset(offset))
    }

    /// The MN-major B operand of rows `16·chunk..16·chunk + 16` (16 keys of V, every column).
    #[inline(always)]
    pub fn mn_major_rows(&self, chunk: u32) -> MatrixDescriptor {
        self.mn_major_from(0, chunk * WGMMA_K)
    }

    /// An MN-major operand whose 16 k-rows start at row `first_row` (a multiple of 8) of panel
    /// `panel`: its columns from 64·panel on are the M or N dimension (the backward's dQ = dS·K_j
    /// reads K_j's keys `first_row..+16` of one 64-column panel as B, and dSᵀ's as A).
    #[inline(always)]
    pub fn mn_major_from(&self, panel: u32, first_row: u32) -> MatrixDescriptor {
        let start = self.panel(panel).offset(first_row * PANEL_ROW_BYTES);
        MatrixDescriptor::mn_major(start, self.panel_bytes())
    }

    /// The address of the 16-bit element (`row`, `col`) as the 128-byte swizzle places it: panel
    /// col/64, then the row's 16-byte chunk (col%64)/8 moved to chunk ^ (row % 8). Two elements
    /// from an even `col` share a 4-byte word.
    #[inline(always)]
    pub fn element(&self, row: u32, col: u32) -> SharedAddress {
        let in_panel = col % PANEL_COLS;
        let chunk = (in_panel / CHUNK_ELEMENTS) ^ (row % SWIZZLE_ROWS);
        let offset = row * PANEL_ROW_BYTES + chunk * CHUNK_BYTES + in_panel % CHUNK_ELEMENTS * 2;
        self.panel(col / PANEL_COLS).offset(offset)
    }
}

/// An f32 tile of `rows` rows in boxes of [`F32_BOX_COLS`] columns, each box `rows` × 128 bytes
/// with the 128-byte swizzle (1024-byte aligned), as TMA reads it for a reduction into global
/// memory: the backward's dQ_i staged for one bulk add. With the swizzle, a warp's accumulator
/// stores meet every bank once when stored an element at a time in
/// [`swizzled_pair_side`]'s order.
#[derive(Clone, Copy)]
pub struct SwizzledF32Tile {
    start: SharedAddress,
    rows: u32,
}

impl SwizzledF32Tile {
    #[inline(always)]
    pub fn new(start: SharedAddress, rows: u32) -> Self {
        Self { start, rows }
    }

    /// Where box `index` (columns 32·index..32·index + 32) starts.
    #[inline(always)]
    pub fn box_start(&self, index: u32) -> SharedAddress {
        self.start.offset(index * self.rows * PANEL_ROW_BYTES)
    }

    /// The address of the f32 element (`row`, `col`) as the 128-byte swizzle places it: box
    /// col/32, then the row's 16-byte chunk (col%32)/4 moved to chunk ^ (row % 8). An even `col`
    /// starts an 8-byte pair.
    #[inline(always)]
    pub fn element(&self, row: u32, col: u32) -> SharedAddress {
        let offset = swizzled_f32_offset(row, col % F32_BOX_COLS);
        self.box_start(col / F32_BOX_COLS).offset(offset)
    }
}

/// One head of a (batch, heads, seqlen, d) tensor as a TMA source: its tensor map and the
/// coordinates of the head.
#[derive(Clone, Copy)]
pub struct HeadTensorMap {
    map: TensorMap,
    head: i32,
    batch: i32,
}

impl HeadTensorMap {
    #[inline(always)]
    pub fn new(map_address: u64, head: u32, batch: u32) -> Self {
        let map = TensorMap(map_address);
        map.prefetch();
        Self {
            map,
            head: head as i32,
            batch: batch as i32,
        }
    }

    /// The 4-D coordinates (innermost first) of column `col`, row `row` of this head.
    #[inline(always)]
    fn coords(&self, col: u32, row: u32) -> [i32; 4] {
        [col as i32, row as i32, self.head, self.batch]
    }

    /// Copies rows `[first_row, first_row + tile.rows)` of every panel into `tile`, completing on
    /// `barrier` (which the caller told to expect the tile's bytes), with L2 priority
    /// `priority` (FlashAttention-3's hints: operands other blocks read again soon
    /// `EvictLast`, operands read once `EvictFirst`). Rows past seqlen and columns past d arrive
    /// as zeros.
    #[inline(always)]
    pub fn load(
        &self,
        tile: &SwizzledTile,
        panels: u32,
        first_row: u32,
        barrier: MBarrier,
        priority: L2Priority,
    ) {
        for panel in 0..panels {
            let coords = self.coords(panel * PANEL_COLS, first_row);
            // SAFETY: the host encoded the map for this tensor with a box of one panel × the
            // tile's rows and 128-byte swizzle; the tile lies inside the launch-sized shared
            // memory, 1024-byte aligned, and no one reads it until `barrier` completes.
            unsafe {
                match priority {
                    L2Priority::Normal => self.map.load_4d(tile.panel(panel), coords, barrier),
                    _ => self.map.load_4d_hinted(
                        tile.panel(panel),
                        coords,
                        barrier,
                        arch::create_l2_policy(priority),
                    ),
                }
            };
        }
    }

    /// Stores rows `[tile_row, tile_row + box_rows)` of every panel of `tile` (box_rows the
    /// map's box, a multiple of 8 as is `tile_row`, so the box starts on a swizzle period) to
    /// rows `[first_row, first_row + box_rows)` of this head, in this thread's open bulk group;
    /// rows past seqlen and columns past d are not written. The caller commits the group and
    /// waits for its reads before writing those rows of the tile again.
    #[inline(always)]
    pub fn store(&self, tile: &SwizzledTile, panels: u32, tile_row: u32, first_row: u32) {
        for panel in 0..panels {
            let coords = self.coords(panel * PANEL_COLS, first_row);
            let source = tile.panel(panel).offset(tile_row * PANEL_ROW_BYTES);
            // SAFETY: the host encoded the map for this tensor with a box of one panel ×
            // box_rows rows and 128-byte swizzle; the rows lie inside the launch-sized shared
            // tile, on a 1024-byte boundary (tile_row a multiple of 8), their stores fenced for
            // the async proxy and ordered before this by the caller's barrier.
            unsafe { self.map.store_4d(source, coords) };
        }
    }

    /// Adds the first `boxes` boxes of `tile` to rows `[first_row, first_row + tile.rows)` of
    /// this head (box b at columns 32·b), in this thread's open bulk group; rows past seqlen and
    /// columns past d are dropped. The caller commits the group and waits for its reads before
    /// writing the tile again. The added lines stay in L2 as `EvictLast` (later key blocks add to
    /// the same rows; FlashAttention-3's `store_dq` hint).
    #[inline(always)]
    pub fn reduce_add(&self, tile: &SwizzledF32Tile, boxes: u32, first_row: u32) {
        for index in 0..boxes {
            let coords = self.coords(index * F32_BOX_COLS, first_row);
            // SAFETY: the host encoded the map for the f32 accumulator with a box of 32 columns
            // × the tile's rows and 128-byte swizzle; the tile lies inside the launch-sized
            // shared memory, 1024-byte aligned, its stores fenced for the async proxy and
            // ordered before this by the caller's barrier.
            unsafe {
                self.map.reduce_add_4d_hinted(
                    tile.box_start(index),
                    coords,
                    arch::create_l2_policy(L2Priority::EvictLast),
                )
            };
        }
    }
}

/// The block's dynamic shared memory, aligned up to 1024 bytes (the launch asks for the slack).
#[inline(always)]
pub fn aligned_shared_start(alignment: u32) -> SharedAddress {
    let start = SharedAddress::of(arch::dynamic_shared_f32());
    SharedAddress(start.0.next_multiple_of(alignment))
}
