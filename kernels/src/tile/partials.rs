//! The split-KV workspace: each split's unnormalised Õ (f32, (splits, rows, d)) and its m (log2
//! units) and ℓ (f32, (splits, rows)), written by the split-KV kernel and merged by the combine.

use crate::arch;
use crate::common::params::DecodeParams;
use crate::common::softmax::RowStats;

/// The workspace of one call, addressed by (split, row_id, column).
#[derive(Clone, Copy)]
pub struct Partials {
    o: *mut f32,
    max: *mut f32,
    sum: *mut f32,
    rows: u32,
    head_dim: u32,
}

impl Partials {
    #[inline(always)]
    pub fn new(p: &DecodeParams) -> Self {
        Self {
            o: p.partial_o as *mut f32,
            max: p.partial_max as *mut f32,
            sum: p.partial_sum as *mut f32,
            rows: p.batch * p.heads_q * p.q_tokens,
            head_dim: p.head_dim,
        }
    }

    #[inline(always)]
    fn row_index(&self, split: u32, row_id: u32) -> usize {
        split as usize * self.rows as usize + row_id as usize
    }

    #[inline(always)]
    fn o_at(&self, split: u32, row_id: u32, col: u32) -> *mut f32 {
        self.o
            .wrapping_add(self.row_index(split, row_id) * self.head_dim as usize + col as usize)
    }

    /// Stores Õ[col..col + 4] of a row (col a multiple of 4: one 16-byte store).
    #[inline(always)]
    pub fn store_o4(&self, split: u32, row_id: u32, col: u32, values: [f32; 4]) {
        // SAFETY: the host allocated splits·rows·d floats, 16-byte aligned; d and col are
        // multiples of 4, so the store is aligned and inside the workspace.
        unsafe {
            arch::store_global_16(
                self.o_at(split, row_id, col) as *mut u8,
                values.map(f32::to_bits),
            )
        }
    }

    /// Õ[col] of a row, read at L2: another block of the same launch may have written it (the
    /// one-launch merge).
    #[inline(always)]
    pub fn o(&self, split: u32, row_id: u32, col: u32) -> f32 {
        // SAFETY: inside the workspace (see `store_o4`); written by this split's block.
        unsafe { arch::load_l2_f32(self.o_at(split, row_id, col)) }
    }

    #[inline(always)]
    pub fn store_stats(&self, split: u32, row_id: u32, stats: RowStats) {
        let i = self.row_index(split, row_id);
        // SAFETY: the host allocated splits·rows floats for each.
        unsafe {
            arch::store(self.max.wrapping_add(i), stats.max);
            arch::store(self.sum.wrapping_add(i), stats.sum);
        }
    }

    /// A row's (m, ℓ), read at L2 as [`Partials::o`].
    #[inline(always)]
    pub fn stats(&self, split: u32, row_id: u32) -> RowStats {
        let i = self.row_index(split, row_id);
        // SAFETY: as for `store_stats`.
        unsafe {
            RowStats {
                max: arch::load_l2_f32(self.max.wrapping_add(i)),
                sum: arch::load_l2_f32(self.sum.wrapping_add(i)),
            }
        }
    }
}
