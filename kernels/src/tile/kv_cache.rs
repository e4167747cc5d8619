//! A KV cache in device memory as the decode kernels read it: one (batch, KV head)'s rows,
//! contiguous or in pages named by a block table, and the mma fragments loaded straight from
//! them with 16-byte loads (no shared memory: each key is used by one warp only).
//!
//! The loads are laid out so that each lane reads whole 16-byte pieces of rows, using the
//! freedom a dot product leaves: S = Q·Kᵀ sums over d in any order (Q and K permuted alike), and
//! P̃·V's output columns may sit in any lane as long as the store knows where.
//!
//! ```text
//!  lane l: g = l / 4, t = l % 4
//!  S = Q·Kᵀ, k-steps 2p and 2p+1 of pass p: lane loads K[key g][32p + 8t .. +8] (4 registers:
//!    step 2p takes registers 0, 1 as b0, b1; step 2p+1 registers 2, 3), and Q rows g, g+8 at the
//!    same columns (a0..a3 from the same halves), so logical k ↔ physical d agree in every lane.
//!  P̃·V, pass p: lane loads V[keys 2t, 2t+1, 2t+8, 2t+9][64p + 8g .. +8] and pairs the keys
//!    (prmt) into b0 = (V[2t][c], V[2t+1][c]), b1 = (V[2t+8][c], V[2t+9][c]) for column
//!    c = 64p + 8g + j of n-tile (p, j), j = 0..8. The accumulator of n-tile (p, j) then holds,
//!    in lane l, columns 64p + 16t + j and 64p + 16t + 8 + j ([`output_col`]).
//! ```

use crate::arch;
use crate::common::params::TensorView;
use crate::tile::fragment::{LDMATRIX_SIDE, MMA_N};

/// Bytes of one 16-bit element.
const ELEMENT_BYTES: u64 = 2;
/// 16-bit elements of one 16-byte load.
const LOAD_ELEMENTS: u32 = 8;

/// One (batch, KV head)'s rows of a K or V cache: contiguous (`PAGED = false`: the view's batch
/// is the sequence) or paged (the view's batch is a page; the sequence's row of the block table
/// names its pages, `page_size` keys each).
#[derive(Clone, Copy)]
pub struct CacheRows<const PAGED: bool> {
    /// Row 0 of this head: of the sequence (contiguous) or of page 0 (paged).
    base: *const u8,
    page_bytes: u64,
    row_bytes: u64,
    /// This sequence's row of the block table (paged only).
    pages: *const u32,
    page_size: u32,
}

impl<const PAGED: bool> CacheRows<PAGED> {
    #[inline(always)]
    pub fn new(
        view: &TensorView,
        batch: u32,
        kv_head: u32,
        block_table: u64,
        table_stride: u32,
        page_size: u32,
    ) -> Self {
        let sequence = if PAGED { 0 } else { batch };
        let element = view.head_offset(sequence, kv_head);
        Self {
            base: (view.addr as *const u8).wrapping_add((element * ELEMENT_BYTES) as usize),
            page_bytes: view.batch_stride * ELEMENT_BYTES,
            row_bytes: view.row_stride * ELEMENT_BYTES,
            pages: (block_table as *const u32).wrapping_add(batch as usize * table_stride as usize),
            page_size,
        }
    }

    /// The rows from key `key_start` on, which must stay inside one page (the host checked that
    /// pages hold whole steps, and steps start at multiples of the step size).
    #[inline(always)]
    pub fn rows_from(&self, key_start: u32) -> StepRows {
        let first = if PAGED {
            let (page_index, row) = (key_start / self.page_size, key_start % self.page_size);
            // SAFETY: the host checked that the table has an entry for every key below the
            // sequence's length, and kernels only ask for such keys.
            let page = unsafe { arch::load(self.pages.wrapping_add(page_index as usize)) };
            self.base.wrapping_add(
                (page as u64 * self.page_bytes + row as u64 * self.row_bytes) as usize,
            )
        } else {
            self.base
                .wrapping_add((key_start as u64 * self.row_bytes) as usize)
        };
        StepRows {
            first,
            row_bytes: self.row_bytes,
        }
    }
}

/// Consecutive rows of a cache from some key on, all in one page.
#[derive(Clone, Copy)]
pub struct StepRows {
    first: *const u8,
    row_bytes: u64,
}

impl StepRows {
    /// 16 bytes of row `row` from column `col` (a multiple of 8), or zeros when `valid` is false
    /// (a key past the sequence: never read, so neither a stale value nor a page the table does
    /// not name reaches the products).
    #[inline(always)]
    pub fn load(&self, row: u32, col: u32, valid: bool) -> [u32; 4] {
        if !valid {
            return [0; 4];
        }
        let address = self.address(row, col);
        // SAFETY: a key below the sequence's length lies in the cache the host described (its
        // checks: lengths within the capacity, page entries within the pages, 16-byte-aligned
        // rows); the cache is not written while the kernel runs.
        unsafe { arch::load_streaming_16(address) }
    }

    /// Writes 16 bytes at row `row`, column `col` (a multiple of 8): the append kernel's store.
    #[inline(always)]
    pub fn store(&self, row: u32, col: u32, value: [u32; 4]) {
        // SAFETY: the append kernel writes keys below the capacity (host-checked), 16-byte aligned.
        unsafe { arch::store_global_16(self.address(row, col) as *mut u8, value) }
    }

    #[inline(always)]
    fn address(&self, row: u32, col: u32) -> *const u8 {
        self.first
            .wrapping_add((row as u64 * self.row_bytes + col as u64 * ELEMENT_BYTES) as usize)
    }
}

/// This lane's `g` (l / 4) and `t` (l % 4).
#[inline(always)]
pub fn lane_coordinates() -> (u32, u32) {
    let lane = arch::lane_idx();
    (lane / 4, lane % 4)
}

/// The A fragments of Q for S = Q·Kᵀ, one per k-step (`STEPS` = d/16), from the lane's two rows
/// (`rows[h]`: Q's row of tile row g + 8h as 16-bit elements, or `None` past the group: zeros),
/// in the permuted-d layout the key loads use (module docs).
#[inline(always)]
pub fn query_fragments<const STEPS: usize>(rows: [Option<*const u8>; 2]) -> [[u32; 4]; STEPS] {
    let (_, t) = lane_coordinates();
    let mut fragments = [[0u32; 4]; STEPS];
    for pass in 0..STEPS / 2 {
        let col = pass as u32 * 32 + t * LOAD_ELEMENTS;
        let halves = rows.map(|row| match row {
            // SAFETY: a row of Q the host described, 16-byte aligned (host-checked).
            Some(row) => unsafe {
                arch::load_global_16(row.wrapping_add((col as u64 * ELEMENT_BYTES) as usize))
            },
            None => [0; 4],
        });
        let [top, bottom] = halves;
        fragments[2 * pass] = [top[0], bottom[0], top[1], bottom[1]];
        fragments[2 * pass + 1] = [top[2], bottom[2], top[3], bottom[3]];
    }
    fragments
}

/// The B fragments of Kᵀ for one step's two 8-key tiles: `[tile][pass]`, each 16 bytes of key
/// `8·tile + g` at columns 32·pass + 8t (registers 0–1: k-step 2·pass, 2–3: k-step 2·pass + 1).
/// `valid(row)`: whether row `row` of the step is a key of the sequence.
#[inline(always)]
pub fn key_fragments<const PASSES: usize>(
    rows: &StepRows,
    valid: impl Fn(u32) -> bool,
) -> [[[u32; 4]; PASSES]; 2] {
    let (g, t) = lane_coordinates();
    core::array::from_fn(|tile| {
        let row = tile as u32 * MMA_N + g;
        core::array::from_fn(|pass| {
            rows.load(row, pass as u32 * 32 + t * LOAD_ELEMENTS, valid(row))
        })
    })
}

/// The step's rows of V this lane pairs into B fragments: `[pass][i]` = 16 bytes of key
/// [`value_row`]`(i)` at columns 64·pass + 8g.
#[inline(always)]
pub fn value_rows<const PASSES: usize>(
    rows: &StepRows,
    valid: impl Fn(u32) -> bool,
) -> [[[u32; 4]; 4]; PASSES] {
    let (g, _) = lane_coordinates();
    core::array::from_fn(|pass| {
        core::array::from_fn(|i| {
            let row = value_row(i as u32);
            rows.load(row, pass as u32 * 64 + g * LOAD_ELEMENTS, valid(row))
        })
    })
}

/// Key (within the step) of this lane's i-th value row: 2t, 2t + 1, 2t + 8, 2t + 9, the keys
/// whose values its B fragments of P̃·V hold.
#[inline(always)]
pub fn value_row(i: u32) -> u32 {
    let (_, t) = lane_coordinates();
    2 * t + i % 2 + i / 2 * LDMATRIX_SIDE
}

/// b0, b1 of n-tile j (0..8) of a pass from its four value rows: keys paired by `prmt`
/// (low halves for even j, high halves for odd j).
#[inline(always)]
pub fn value_fragment(rows: &[[u32; 4]; 4], j: usize) -> [u32; 2] {
    const LOW_HALVES: u32 = 0x5410;
    const HIGH_HALVES: u32 = 0x7632;
    let selector = if j.is_multiple_of(2) {
        LOW_HALVES
    } else {
        HIGH_HALVES
    };
    let word = j / 2;
    [
        arch::permute_bytes(rows[0][word], rows[1][word], selector),
        arch::permute_bytes(rows[2][word], rows[3][word], selector),
    ]
}

/// The head-dim column of element `e` (0..4) of Õ's accumulator tile `tile` (= 8·pass + j) in
/// this lane: 64·pass + 16t + 8·(e % 2) + j.
#[inline(always)]
pub fn output_col(tile: u32, e: u32) -> u32 {
    let (_, t) = lane_coordinates();
    let (pass, j) = (tile / 8, tile % 8);
    pass * 64 + 16 * t + 8 * (e % 2) + j
}
