//! The causal mask, aligned to the bottom-right corner as FlashAttention aligns it.
//!
//! Query q (0-based) sees key k iff k ≤ q + seqlen_k − seqlen_q. With seqlen_q = seqlen_k this is
//! the usual lower triangle; with seqlen_q > seqlen_k the first seqlen_q − seqlen_k queries see no
//! key at all (their O is 0 and their L is −∞); with seqlen_q < seqlen_k the queries are the last
//! seqlen_q positions of the key sequence.

/// Which keys each query may attend to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CausalMask {
    enabled: bool,
    /// seqlen_k − seqlen_q.
    diagonal_offset: i64,
}

impl CausalMask {
    pub fn new(causal: bool, seqlen_q: u32, seqlen_k: u32) -> Self {
        Self {
            enabled: causal,
            diagonal_offset: seqlen_k as i64 - seqlen_q as i64,
        }
    }

    pub fn is_causal(&self) -> bool {
        self.enabled
    }

    /// Whether `query` may attend to `key`.
    #[inline(always)]
    pub fn visible(&self, query: u32, key: u32) -> bool {
        !self.enabled || (key as i64) <= query as i64 + self.diagonal_offset
    }

    /// Number of keys visible to `query`, counting from key 0 (before clipping to seqlen_k).
    #[inline(always)]
    pub fn visible_key_end(&self, query: u32, seqlen_k: u32) -> u32 {
        if !self.enabled {
            return seqlen_k;
        }
        (query as i64 + self.diagonal_offset + 1).clamp(0, seqlen_k as i64) as u32
    }

    /// Number of key blocks of `block_cols` keys that rows `[row_start, row_end)` need: every later
    /// block is fully masked for all of them and can be skipped.
    #[inline(always)]
    pub fn key_blocks_needed(&self, row_end: u32, seqlen_k: u32, block_cols: u32) -> u32 {
        let last_row = row_end.saturating_sub(1);
        self.visible_key_end(last_row, seqlen_k)
            .div_ceil(block_cols)
    }

    /// Whether some element of the tile (rows `[row_start, row_end)`, keys `[key_start, key_end)`)
    /// is masked, so the tile needs the element-wise mask.
    #[inline(always)]
    pub fn tile_needs_mask(&self, row_start: u32, key_end: u32) -> bool {
        self.enabled && (key_end as i64 - 1) > row_start as i64 + self.diagonal_offset
    }
}
