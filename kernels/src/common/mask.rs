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

    /// The first query that sees `key`; every later query sees it too. The backward pass's
    /// mirror of [`visible_key_end`](Self::visible_key_end): query q sees key k iff
    /// q ≥ k − (seqlen_k − seqlen_q). Below seqlen_q for every key below seqlen_k, because the
    /// last query sees every key.
    #[inline(always)]
    pub fn first_query_seeing(&self, key: u32) -> u32 {
        if !self.enabled {
            return 0;
        }
        (key as i64 - self.diagonal_offset).max(0) as u32
    }

    /// The first row block of `block_rows` rows that sees a key of the key block starting at
    /// `key_start`: the backward pass's loop over row blocks for that key block starts here, every
    /// earlier row block being fully masked for it (the mirror of
    /// [`key_blocks_needed`](Self::key_blocks_needed)).
    #[inline(always)]
    pub fn first_row_block_needed(&self, key_start: u32, block_rows: u32) -> u32 {
        self.first_query_seeing(key_start) / block_rows
    }

    /// Whether some element of the tile (rows `[row_start, row_end)`, keys `[key_start, key_end)`)
    /// is masked, so the tile needs the element-wise mask.
    #[inline(always)]
    pub fn tile_needs_mask(&self, row_start: u32, key_end: u32) -> bool {
        self.enabled && (key_end as i64 - 1) > row_start as i64 + self.diagonal_offset
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a brute-force search over every (query, key) pair, for seqlen_q below, equal to
    /// and above seqlen_k, with tail blocks.
    #[test]
    fn first_row_block_needed_is_the_first_with_a_visible_pair() {
        for (seqlen_q, seqlen_k) in [(5, 7), (7, 7), (9, 4), (1, 6), (6, 1)] {
            for causal in [false, true] {
                let mask = CausalMask::new(causal, seqlen_q, seqlen_k);
                for (block_rows, block_cols) in [(1, 1), (2, 3), (4, 2), (8, 8)] {
                    for key_start in (0..seqlen_k).step_by(block_cols as usize) {
                        let key_end = (key_start + block_cols).min(seqlen_k);
                        let first_row = (0..seqlen_q)
                            .find(|&q| (key_start..key_end).any(|k| mask.visible(q, k)))
                            .expect("the last query sees every key");
                        assert_eq!(
                            mask.first_row_block_needed(key_start, block_rows),
                            first_row / block_rows,
                            "{seqlen_q}×{seqlen_k} causal={causal} B_r={block_rows} key {key_start}"
                        );
                    }
                }
            }
        }
    }
}
