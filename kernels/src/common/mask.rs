//! The attention mask: each query sees a window of keys around its diagonal, aligned to the
//! bottom-right corner as FlashAttention aligns it (flash-attn's `window_size = (left, right)`).
//!
//! With offset = seqlen_k − seqlen_q, query q (0-based) sees key k iff
//! q + offset − left ≤ k ≤ q + offset + right; an unbounded side drops its inequality. Causal
//! attention is (left unbounded, right 0): k ≤ q + offset, the usual lower triangle when
//! seqlen_q = seqlen_k. With seqlen_q > seqlen_k the first queries may see no key at all; a query
//! that sees no key (there, or with a window that misses every key) gets O = 0 and L = −∞.

/// Which keys around its diagonal each query sees: `None` leaves a side unbounded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyWindow {
    /// Keys before the diagonal a query sees (flash-attn's `window_size[0]`).
    pub left: Option<u32>,
    /// Keys after the diagonal a query sees (`window_size[1]`; 0 for causal attention).
    pub right: Option<u32>,
}

impl KeyWindow {
    /// Every key (no mask).
    pub const FULL: Self = Self {
        left: None,
        right: None,
    };
    /// The causal mask: every key up to the diagonal.
    pub const CAUSAL: Self = Self {
        left: None,
        right: Some(0),
    };

    /// The window of a parameter block: `causal` and flash-attn's (left, right) with −1 (any
    /// negative) for an unbounded side; causal takes right = 0 whatever `right` says.
    #[inline(always)]
    pub fn from_params(causal: bool, left: i32, right: i32) -> Self {
        let bound = |side: i32| if side >= 0 { Some(side as u32) } else { None };
        Self {
            left: bound(left),
            right: if causal { Some(0) } else { bound(right) },
        }
    }

    /// The causal mask, or every key.
    #[inline(always)]
    pub fn causal(causal: bool) -> Self {
        if causal { Self::CAUSAL } else { Self::FULL }
    }

    /// Whether some key may be hidden.
    #[inline(always)]
    pub fn is_bounded(&self) -> bool {
        self.left.is_some() || self.right.is_some()
    }
}

/// Which keys each query may attend to: [`KeyWindow`] placed on one (seqlen_q, seqlen_k).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionMask {
    /// Whether some key may be hidden (a bounded side).
    enabled: bool,
    /// seqlen_k − seqlen_q − left: query q's first visible key is q + this (far below 0 when
    /// the left side is unbounded).
    first_offset: i32,
    /// seqlen_k − seqlen_q + right: query q's last visible key is q + this (far above any key
    /// when the right side is unbounded).
    last_offset: i32,
}

/// An offset past every key: the host keeps sequences below 2^28 keys and queries (index
/// ranges, `Problem`; decoding's caches below 2^24), so q + offset stays inside i32 while no key
/// is hidden by an unbounded side, and a window wider than this sees every key anyway.
const UNBOUNDED: i64 = 1 << 30;

impl AttentionMask {
    #[inline(always)]
    pub fn new(window: KeyWindow, seqlen_q: u32, seqlen_k: u32) -> Self {
        let diagonal_offset = seqlen_k as i64 - seqlen_q as i64;
        // Exact in i32: the host clips each side to seqlen_q + seqlen_k (`Problem::shape`).
        let clip = |offset: i64| offset as i32;
        Self {
            enabled: window.is_bounded(),
            first_offset: clip(
                window
                    .left
                    .map_or(-UNBOUNDED, |left| diagonal_offset - left as i64),
            ),
            last_offset: clip(
                window
                    .right
                    .map_or(UNBOUNDED, |right| diagonal_offset + right as i64),
            ),
        }
    }

    /// The causal mask (k ≤ q + seqlen_k − seqlen_q), or no mask.
    #[inline(always)]
    pub fn causal(causal: bool, seqlen_q: u32, seqlen_k: u32) -> Self {
        Self::new(KeyWindow::causal(causal), seqlen_q, seqlen_k)
    }

    /// Whether some key may be hidden.
    #[inline(always)]
    pub fn is_bounded(&self) -> bool {
        self.enabled
    }

    /// Whether the window's left side is bounded (a uniform test of the mask's own offset).
    #[inline(always)]
    pub fn is_left_bounded(&self) -> bool {
        self.enabled && self.first_offset as i64 > -UNBOUNDED
    }

    /// Whether `query` may attend to `key`.
    #[inline(always)]
    pub fn visible(&self, query: u32, key: u32) -> bool {
        // No test of `enabled`: an unbounded side's offset hides no key.
        let (query, key) = (query as i32, key as i32);
        key <= query + self.last_offset
            && (!self.is_left_bounded() || key >= query + self.first_offset)
    }

    /// One past the last key visible to `query`, clipped to [0, seqlen_k].
    #[inline(always)]
    pub fn visible_key_end(&self, query: u32, seqlen_k: u32) -> u32 {
        if !self.enabled {
            return seqlen_k;
        }
        clip_index(query as i32 + self.last_offset + 1, seqlen_k)
    }

    /// The first key visible to `query`, clipped to [0, seqlen_k] (0 when the left side is
    /// unbounded).
    #[inline(always)]
    pub fn visible_key_start(&self, query: u32, seqlen_k: u32) -> u32 {
        if !self.is_left_bounded() {
            return 0;
        }
        clip_index(query as i32 + self.first_offset, seqlen_k)
    }

    /// The first key the window's left side lets `query` see, not clipped to the keys that
    /// exist (it may be negative): one row's start is the previous row's plus one, so a kernel
    /// keeps this for one row and derives the others.
    #[inline(always)]
    pub fn window_start(&self, query: u32) -> i32 {
        query as i32 + self.first_offset
    }

    /// One past the last key block of `block_cols` keys that rows `[row_start, row_end)` need:
    /// every later block is hidden from all of them and is skipped.
    #[inline(always)]
    pub fn key_blocks_needed(&self, row_end: u32, seqlen_k: u32, block_cols: u32) -> u32 {
        let last_row = row_end.saturating_sub(1);
        self.visible_key_end(last_row, seqlen_k)
            .div_ceil(block_cols)
    }

    /// The first key block of `block_cols` keys that rows from `row_start` on need: every
    /// earlier block is left of the window of all of them and is skipped (0 when the left side
    /// is unbounded).
    #[inline(always)]
    pub fn first_key_block_needed(&self, row_start: u32, seqlen_k: u32, block_cols: u32) -> u32 {
        self.visible_key_start(row_start, seqlen_k) / block_cols
    }

    /// The first query that sees `key` by the right side of the window (k ≤ q + last_offset);
    /// every later query does too. The backward pass's mirror of
    /// [`visible_key_end`](Self::visible_key_end). Below seqlen_q for every key below seqlen_k
    /// when right ≥ 0, because the last query's window reaches key seqlen_k − 1.
    #[inline(always)]
    pub fn first_query_seeing(&self, key: u32) -> u32 {
        if !self.enabled {
            return 0;
        }
        (key as i32 - self.last_offset).max(0) as u32
    }

    /// One past the last query that sees `key` by the left side of the window (q + first_offset
    /// ≤ k), clipped to [0, seqlen_q]; every earlier query from [`first_query_seeing`] on sees
    /// it too. seqlen_q when the left side is unbounded.
    ///
    /// [`first_query_seeing`]: Self::first_query_seeing
    #[inline(always)]
    pub fn query_end_seeing(&self, key: u32, seqlen_q: u32) -> u32 {
        if !self.is_left_bounded() {
            return seqlen_q;
        }
        clip_index(key as i32 - self.first_offset + 1, seqlen_q)
    }

    /// The first row block of `block_rows` rows that sees a key of the key block starting at
    /// `key_start`: the backward pass's loop over row blocks for that key block starts here, every
    /// earlier row block being fully masked for it (the mirror of
    /// [`key_blocks_needed`](Self::key_blocks_needed)).
    #[inline(always)]
    pub fn first_row_block_needed(&self, key_start: u32, block_rows: u32) -> u32 {
        self.first_query_seeing(key_start) / block_rows
    }

    /// One past the last row block of `block_rows` rows that sees a key of the key block ending
    /// at `key_end` (its last key plus one, at most seqlen_k, above 0): with the window's left
    /// side bounded, every later row block's windows start past the block's keys (the mirror of
    /// [`first_key_block_needed`](Self::first_key_block_needed)); ⌈seqlen_q / B_r⌉ otherwise.
    #[inline(always)]
    pub fn row_blocks_needed(&self, key_end: u32, seqlen_q: u32, block_rows: u32) -> u32 {
        self.query_end_seeing(key_end.saturating_sub(1), seqlen_q)
            .div_ceil(block_rows)
    }

    /// Whether the tile of rows `[row_start, row_end)` and keys `[key_start, key_end)` crosses an
    /// edge of the window (some of its pairs are hidden, some maybe not), so it needs the
    /// element-wise mask: its first row's last visible key is before `key_end − 1`, or its last
    /// row's first visible key after `key_start`.
    #[inline(always)]
    pub fn tile_needs_mask(
        &self,
        row_start: u32,
        row_end: u32,
        key_start: u32,
        key_end: u32,
    ) -> bool {
        self.enabled && (key_end as i32 - 1) > row_start as i32 + self.last_offset
            || self.is_left_bounded() && (key_start as i32) < row_end as i32 - 1 + self.first_offset
    }
}

/// A key or query index clipped to [0, `end`], by max and min rather than `clamp`, whose check
/// that its bounds are ordered (`end as i32` could be negative, as far as the compiler knows)
/// put a panic call into every kernel that masks.
#[inline(always)]
fn clip_index(index: i32, end: u32) -> u32 {
    (index.max(0) as u32).min(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No mask, causal, one-sided, the diagonal alone, two-sided, causal with a left bound.
    const WINDOWS: [KeyWindow; 6] = [
        KeyWindow::FULL,
        KeyWindow::CAUSAL,
        KeyWindow {
            left: Some(3),
            right: None,
        },
        KeyWindow {
            left: Some(0),
            right: Some(0),
        },
        KeyWindow {
            left: Some(5),
            right: Some(2),
        },
        KeyWindow {
            left: Some(2),
            right: Some(0),
        },
    ];

    /// Against a brute-force search over every (query, key) pair, for seqlen_q below, equal to
    /// and above seqlen_k, with tail blocks.
    #[test]
    fn first_row_block_needed_is_the_first_with_a_visible_pair() {
        for (seqlen_q, seqlen_k) in [(5, 7), (7, 7), (9, 4), (1, 6), (6, 1)] {
            for causal in [false, true] {
                let mask = AttentionMask::causal(causal, seqlen_q, seqlen_k);
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

    /// With a window, the backward's row-block range of each key block holds every row block
    /// with a visible pair and ends right after the last of them.
    #[test]
    fn a_key_blocks_row_range_holds_every_row_block_that_sees_it() {
        let windows = WINDOWS;
        for window in windows {
            for (seqlen_q, seqlen_k) in [(12, 12), (7, 13), (13, 7), (1, 9), (9, 1)] {
                let mask = AttentionMask::new(window, seqlen_q, seqlen_k);
                for (block_rows, block_cols) in [(1, 1), (2, 3), (4, 2), (8, 8)] {
                    for key_start in (0..seqlen_k).step_by(block_cols as usize) {
                        let key_end = (key_start + block_cols).min(seqlen_k);
                        let seeing: std::vec::Vec<u32> = (0..seqlen_q.div_ceil(block_rows))
                            .filter(|&i| {
                                let rows = i * block_rows..((i + 1) * block_rows).min(seqlen_q);
                                rows.clone()
                                    .any(|q| (key_start..key_end).any(|k| mask.visible(q, k)))
                            })
                            .collect();
                        let first = mask.first_row_block_needed(key_start, block_rows);
                        let end = mask.row_blocks_needed(key_end, seqlen_q, block_rows);
                        let what = std::format!(
                            "{window:?} {seqlen_q}×{seqlen_k} B_r={block_rows} B_c={block_cols} \
                             key {key_start}: {seeing:?} in {first}..{end}"
                        );
                        assert!(seeing.iter().all(|i| (first..end).contains(i)), "{what}");
                        if let Some(last) = seeing.last() {
                            assert_eq!(end, last + 1, "{what}");
                        }
                    }
                }
            }
        }
    }

    /// The flash-attn rule, pair by pair: q + offset − left ≤ k ≤ q + offset + right.
    #[test]
    fn a_window_sees_its_keys_around_the_bottom_right_diagonal() {
        // 4 queries, 10 keys: offset 6, so query 0's diagonal is key 6.
        let mask = AttentionMask::new(
            KeyWindow {
                left: Some(2),
                right: Some(1),
            },
            4,
            10,
        );
        let seen: std::vec::Vec<u32> = (0..10).filter(|&k| mask.visible(0, k)).collect();
        assert_eq!(seen, [4, 5, 6, 7]);
        assert_eq!(
            (mask.visible_key_start(0, 10), mask.visible_key_end(0, 10)),
            (4, 8)
        );
        // Query 3's window [7, 10] is clipped to the keys that exist.
        assert_eq!(
            (mask.visible_key_start(3, 10), mask.visible_key_end(3, 10)),
            (7, 10)
        );
        // (0, 0): the diagonal alone.
        let diagonal = AttentionMask::new(
            KeyWindow {
                left: Some(0),
                right: Some(0),
            },
            4,
            4,
        );
        assert!((0..4).all(|q| (0..4).all(|k| diagonal.visible(q, k) == (q == k))));
        // Causal is (unbounded, 0); causal with a window takes right = 0.
        assert_eq!(KeyWindow::from_params(true, -1, -1), KeyWindow::CAUSAL);
        assert_eq!(
            KeyWindow::from_params(true, 5, 7),
            KeyWindow {
                left: Some(5),
                right: Some(0)
            }
        );
        assert_eq!(KeyWindow::from_params(false, -1, -1), KeyWindow::FULL);
    }

    /// The tile test against every pair of the tile: masked iff some pair is hidden.
    #[test]
    fn a_tile_needs_the_mask_iff_it_hides_a_pair() {
        let windows = WINDOWS;
        for window in windows {
            for (seqlen_q, seqlen_k) in [(12, 12), (7, 13), (13, 7)] {
                let mask = AttentionMask::new(window, seqlen_q, seqlen_k);
                for (rows, cols) in [(2, 3), (4, 4), (1, 5)] {
                    for row_start in (0..seqlen_q).step_by(rows as usize) {
                        let row_end = (row_start + rows).min(seqlen_q);
                        for key_start in (0..seqlen_k).step_by(cols as usize) {
                            let key_end = (key_start + cols).min(seqlen_k);
                            let hides = (row_start..row_end)
                                .any(|q| (key_start..key_end).any(|k| !mask.visible(q, k)));
                            assert_eq!(
                                mask.tile_needs_mask(row_start, row_end, key_start, key_end),
                                hides,
                                "{window:?} {seqlen_q}×{seqlen_k} rows {row_start}..{row_end} \
                                 keys {key_start}..{key_end}"
                            );
                        }
                    }
                }
            }
        }
    }
}
