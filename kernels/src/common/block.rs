//! Where one thread block's work sits in the problem: its batch and head, the K/V head it reads,
//! the row and key ranges of its sequence, and which key blocks the mask (causal or a sliding
//! window, `common::mask`) lets it skip or must apply element-wise. Every kernel starts from a [`BlockInfo`], so grouped K/V heads (GQA)
//! and packed variable-length batches change this file, not the kernels.

use crate::common::mask::{AttentionMask, KeyWindow};
use crate::common::params::AttentionShape;

/// One (batch, head) of the problem, as a block sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    /// The batch index into the tensors (0 in a packed batch, whose sequences are rows of one
    /// tensor: [`BlockInfo::packed`]).
    pub batch: u32,
    /// The query head (and O's, and the statistics').
    pub head: u32,
    /// The K/V head this query head reads: `head / kv_group` (grouped K/V heads, GQA/MQA; the
    /// query head itself when K and V have as many heads as Q).
    pub kv_head: u32,
    /// batch·heads + head: the index of this head's rows in the (batch·heads, seqlen_q)
    /// statistics vectors and workspaces.
    pub batch_head: u32,
    /// Query rows of this head's sequence.
    pub seqlen_q: u32,
    /// Keys of this head's sequence.
    pub seqlen_k: u32,
    /// This sequence's first query row and first key row in the tensors: 0, except in a packed
    /// batch of sequences of different lengths ([`BlockInfo::packed`]).
    pub q_start: u32,
    pub k_start: u32,
    /// Which keys each query sees around its diagonal (causal, a sliding window, or all; see
    /// [`BlockInfo::mask`]).
    pub window: KeyWindow,
}

impl BlockInfo {
    /// The block that works on head `batch_head` (batch-major) of `shape`.
    #[inline(always)]
    pub fn new(shape: &AttentionShape, batch_head: u32) -> Self {
        let (batch, head) = (batch_head / shape.heads, batch_head % shape.heads);
        Self {
            batch,
            head,
            // Divided only for grouped heads (a zero group, from a parameter block built without
            // it, reads as 1): no panic path, and kernels that never read `kv_head` compile
            // without it. An unconditional division measured 1-2% faster in fa2-tc at d = 64
            // (call 17) but moves spills in FA3's persistent kernels (8 -> 24 bytes), untimed.
            kv_head: if shape.kv_group > 1 {
                head / shape.kv_group
            } else {
                head
            },
            batch_head,
            seqlen_q: shape.seqlen_q,
            seqlen_k: shape.seqlen_k,
            q_start: 0,
            k_start: 0,
            window: shape.window(),
        }
    }

    /// The block of head `batch_head` of a packed batch (`PackedSequences`): sequence
    /// b = batch_head / heads spans query rows `query_rows` and key rows `key_rows` of the
    /// tensors, its offsets `cu_seqlens[b]..cu_seqlens[b + 1]`; the shape's seqlens are the
    /// longest sequence's, this block's its own. The tensors are one packed batch, so the
    /// block reads them at batch 0 from its sequence's first rows (`batch_head` still numbers
    /// the sequence's heads for the grid). `local` as in [`BlockInfo::of_form`]: the window
    /// then sits at the sequence's own bottom-right corner, as its lengths place the diagonal.
    #[inline(always)]
    pub fn packed(
        shape: &AttentionShape,
        batch_head: u32,
        query_rows: [u32; 2],
        key_rows: [u32; 2],
        local: bool,
    ) -> Self {
        // At most the grid's lengths: offsets the host never read (`tile::sequences::
        // DeviceOffsets`) may claim a longer sequence than flash-attn's `max_seqlen`, and the
        // workspaces (deterministic turns, row blocks) are sized by it.
        Self {
            batch: 0,
            seqlen_q: query_rows[1]
                .wrapping_sub(query_rows[0])
                .min(shape.seqlen_q),
            seqlen_k: key_rows[1].wrapping_sub(key_rows[0]).min(shape.seqlen_k),
            q_start: query_rows[0],
            k_start: key_rows[0],
            ..Self::of_form(shape, batch_head, local)
        }
    }

    /// The head of the dK and dV rows this block stores: its K/V head, or, in a kernel compiled
    /// for grouped K/V heads (`grouped`), its query head. Several query heads share a K/V head
    /// there, so each stores its own rows of an expanded (batch, heads, seqlen_k, d) workspace,
    /// which `bwd::group_sum` then sums per K/V head ([`KvGroup`]).
    #[inline(always)]
    pub fn kv_gradient_head(&self, grouped: bool) -> u32 {
        if grouped { self.head } else { self.kv_head }
    }

    /// The block of a kernel that takes the causal mask or none, not a window (`fa1`, `fa2`
    /// forward and backward, and the dense and packed forms of `fa2-tc` and `fa3`, forward and
    /// backward: the host sends windows to the `local` forms only): its mask's left side is
    /// unbounded at compile time, so its masked tiles cost what they did before windows
    /// existed.
    #[inline(always)]
    pub fn causal_only(shape: &AttentionShape, batch_head: u32) -> Self {
        Self {
            window: KeyWindow::causal(shape.causal != 0),
            ..Self::new(shape, batch_head)
        }
    }

    /// The block of a tensor-core kernel, forward (`common::form::KernelForm`) or backward: its
    /// window as the parameters give it in the `local` form, else [`BlockInfo::causal_only`].
    #[inline(always)]
    pub fn of_form(shape: &AttentionShape, batch_head: u32, local: bool) -> Self {
        if local {
            Self::new(shape, batch_head)
        } else {
            Self::causal_only(shape, batch_head)
        }
    }

    /// The mask of this head's sequences (a no-op without causal mask or window). Made where it
    /// is used, so its offsets are computed where the kernel first needs them.
    #[inline(always)]
    pub fn mask(&self) -> AttentionMask {
        AttentionMask::new(self.window, self.seqlen_q, self.seqlen_k)
    }

    /// Whether the last row blocks visit the most key blocks, so a grid should start them first
    /// (its tail is then short): with the window's right side bounded (causal, or a window) a
    /// row block's key range ends further right the later it is, and starts at 0 or moves by the
    /// same amount; with the right side unbounded every row block visits as many blocks, or the
    /// first ones the most (a left bound only), and the grid runs in order.
    #[inline(always)]
    pub fn heaviest_rows_last(&self) -> bool {
        self.window.right.is_some()
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

/// The key blocks one row block visits: [`KeyBlocks::count`] of them from block
/// [`KeyBlocks::first`] (the window hides every earlier block and every later one from all its
/// rows, so those are never loaded), and which need the element-wise mask
/// ([`KeyBlocks::needs_mask`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyBlocks {
    seqlen_k: u32,
    mask: AttentionMask,
    row_start: u32,
    block_rows: u32,
    block_cols: u32,
}

impl KeyBlocks {
    /// The first key block some row sees (0 unless the window's left side is bounded).
    #[inline(always)]
    pub fn first(&self) -> u32 {
        self.mask
            .first_key_block_needed(self.row_start, self.seqlen_k, self.block_cols)
    }

    /// One past the last key block some row sees.
    #[inline(always)]
    pub fn end(&self) -> u32 {
        self.mask.key_blocks_needed(
            self.row_start + self.block_rows,
            self.seqlen_k,
            self.block_cols,
        )
    }

    /// How many key blocks, from [`KeyBlocks::first`], the rows see (0 when none sees a key).
    #[inline(always)]
    pub fn count(&self) -> u32 {
        self.end().saturating_sub(self.first())
    }

    /// How many of these blocks, from [`KeyBlocks::first`], the `rows` rows from `row_start` (a
    /// part of the row block) see, counting only rows below `seqlen_q`: the prefix up to the last
    /// block one of them sees, 0 when none is a query or sees a key. An FA3 consumer warpgroup
    /// owns 64 rows of its tile: past that prefix (the diagonal behind its rows, or its rows past
    /// the sequence) every score it would compute is masked, so it skips the products.
    #[inline(always)]
    pub fn count_for_rows(&self, row_start: u32, rows: u32, seqlen_q: u32) -> u32 {
        let row_end = (row_start + rows).min(seqlen_q);
        if row_end <= row_start {
            return 0;
        }
        self.mask
            .key_blocks_needed(row_end, self.seqlen_k, self.block_cols)
            .min(self.end())
            .saturating_sub(self.first())
    }

    /// The first key of the `n`-th block the rows visit.
    #[inline(always)]
    pub fn key_start(&self, n: u32) -> u32 {
        (self.first() + n) * self.block_cols
    }

    /// Whether the key block starting at `key_start` runs past seqlen_k or crosses an edge of the
    /// window (the causal diagonal among them), so its step is the one compiled with
    /// `MASK = true`; every other block runs the step with `MASK = false`.
    #[inline(always)]
    pub fn needs_mask(&self, key_start: u32) -> bool {
        self.needs_mask_for_rows(key_start, self.row_start, self.block_rows)
    }

    /// [`KeyBlocks::needs_mask`] for the `rows` rows from `row_start` only (a part of the row
    /// block: an FA3 consumer warpgroup's 64 rows, where the diagonal crosses fewer of the
    /// blocks than it crosses for the whole tile).
    #[inline(always)]
    pub fn needs_mask_for_rows(&self, key_start: u32, row_start: u32, rows: u32) -> bool {
        key_start + self.block_cols > self.seqlen_k
            || self.mask.tile_needs_mask(
                row_start,
                row_start + rows,
                key_start,
                key_start + self.block_cols,
            )
    }

    /// The mask the masked steps apply element by element.
    #[inline(always)]
    pub fn mask(&self) -> AttentionMask {
        self.mask
    }
}

/// The row blocks one key block is seen by, the backward pass's mirror of [`KeyBlocks`]: from
/// [`RowBlocks::first`] to [`RowBlocks::end`] (every row block outside is fully masked for these
/// keys, so it is never loaded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowBlocks {
    seqlen_q: u32,
    seqlen_k: u32,
    mask: AttentionMask,
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

    /// One past the last row block that sees a key of the block: ⌈seqlen_q / B_r⌉, or earlier
    /// where the window's left side leaves the later rows' windows past these keys.
    #[inline(always)]
    pub fn end(&self) -> u32 {
        let key_end = (self.key_start + self.block_cols).min(self.seqlen_k);
        self.mask
            .row_blocks_needed(key_end, self.seqlen_q, self.block_rows)
    }

    /// Whether the tile (rows from `row_start`, this key block) runs past seqlen_q or seqlen_k
    /// or crosses an edge of the window, so its step is the one compiled with `MASK = true`.
    #[inline(always)]
    pub fn needs_mask(&self, row_start: u32) -> bool {
        row_start + self.block_rows > self.seqlen_q
            || self.key_start + self.block_cols > self.seqlen_k
            || self.mask.tile_needs_mask(
                row_start,
                row_start + self.block_rows,
                self.key_start,
                self.key_start + self.block_cols,
            )
    }

    /// The mask the masked steps apply element by element.
    #[inline(always)]
    pub fn mask(&self) -> AttentionMask {
        self.mask
    }
}

/// One K/V head and the query heads that read it (grouped K/V heads): the rows of the expanded
/// dK and dV (one head per query head, (batch·heads, seqlen_k, d)) that the backward's group sum
/// adds into this K/V head's dK and dV. Query head `kv_head·size + m` is member m.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvGroup {
    pub batch: u32,
    pub kv_head: u32,
    /// Query heads per K/V head (the shape's `kv_group`; a zero group reads as 1).
    pub size: u32,
    /// batch·heads + kv_head·size: the expanded workspace's head of member 0.
    pub first_batch_head: u32,
    pub seqlen_k: u32,
}

impl KvGroup {
    /// The group of K/V head `batch_kv_head` (batch-major: batch·heads_kv + K/V head) of `shape`.
    #[inline(always)]
    pub fn new(shape: &AttentionShape, batch_kv_head: u32) -> Self {
        let size = if shape.kv_group > 1 {
            shape.kv_group
        } else {
            1
        };
        let heads_kv = shape.heads / size;
        let (batch, kv_head) = (batch_kv_head / heads_kv, batch_kv_head % heads_kv);
        Self {
            batch,
            kv_head,
            size,
            first_batch_head: batch * shape.heads + kv_head * size,
            seqlen_k: shape.seqlen_k,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::format;

    fn shape(heads: u32, seqlen_q: u32, seqlen_k: u32, causal: bool) -> AttentionShape {
        AttentionShape {
            batch: 2,
            heads,
            seqlen_q,
            seqlen_k,
            head_dim: 64,
            softmax_scale: 0.125,
            causal: causal as u32,
            kv_group: 1,
            ..Default::default()
        }
    }

    #[test]
    fn a_packed_sequence_reads_its_own_rows_at_batch_0() {
        // Sequence 2 of 4 heads: block row 2·4 + 3, rows 100..130 of Q and 40..41 of K.
        let info = BlockInfo::packed(&shape(4, 1000, 900, true), 11, [100, 130], [40, 41], false);
        assert_eq!((info.batch, info.head, info.batch_head), (0, 3, 11));
        assert_eq!((info.seqlen_q, info.seqlen_k), (30, 1));
        assert_eq!((info.q_start, info.k_start), (100, 40));
        // Causal within the sequence: its last query sees its one key, its first sees none.
        assert_eq!(info.key_blocks(0, 64, 64).count(), 1);
        let dense = BlockInfo::new(&shape(4, 1000, 900, true), 11);
        assert_eq!((dense.batch, dense.q_start, dense.k_start), (2, 0, 0));
    }

    #[test]
    fn a_packed_sequence_longer_than_the_grid_is_cut_to_the_grid() {
        // Offsets read on the GPU may claim more rows than max_seqlen (the grid's seqlens): the
        // block keeps the grid's lengths, so no workspace sized by them is overrun.
        let info = BlockInfo::packed(&shape(4, 64, 32, false), 3, [10, 500], [0, 90], false);
        assert_eq!((info.seqlen_q, info.seqlen_k), (64, 32));
        assert_eq!((info.q_start, info.k_start), (10, 0));
    }

    #[test]
    fn a_packed_sequence_takes_the_window_at_its_own_corner_in_the_local_form() {
        // A window (64, 0) over a 320-key sequence whose rows start at 1000 in the tensors: row
        // block 256..320 sees keys 192..320 of its own sequence, key blocks 3 and 4 of B_c = 64.
        let windowed = AttentionShape {
            window_left: 64,
            window_right: 0,
            ..shape(4, 2000, 2000, false)
        };
        let local = BlockInfo::packed(&windowed, 5, [1000, 1320], [700, 1020], true);
        let blocks = local.key_blocks(256, 64, 64);
        assert_eq!((blocks.first(), blocks.end()), (3, 5));
        assert_eq!((local.q_start, local.k_start), (1000, 700));
        // The packed form without it sees every key block of the sequence.
        let dense = BlockInfo::packed(&windowed, 5, [1000, 1320], [700, 1020], false);
        let blocks = dense.key_blocks(256, 64, 64);
        assert_eq!((blocks.first(), blocks.end()), (0, 5));
    }

    #[test]
    fn batch_and_head_are_batch_major() {
        let block = BlockInfo::new(&shape(3, 10, 10, false), 5);
        assert_eq!((block.batch, block.head, block.kv_head), (1, 2, 2));
    }

    #[test]
    fn grouped_query_heads_read_their_group_s_kv_head() {
        // 8 query heads on 2 K/V heads (groups of 4): batch 1's head 6 reads K/V head 1.
        let grouped = AttentionShape {
            kv_group: 4,
            ..shape(8, 10, 10, false)
        };
        let block = BlockInfo::new(&grouped, 8 + 6);
        assert_eq!((block.batch, block.head, block.kv_head), (1, 6, 1));
        assert_eq!(block.batch_head, 14);
        // MQA: every query head reads K/V head 0.
        let mqa = AttentionShape {
            kv_group: 8,
            ..shape(8, 10, 10, false)
        };
        assert_eq!(BlockInfo::new(&mqa, 7).kv_head, 0);
        // A zero group (a block built without it) is no group: each head reads its own.
        let ungrouped = AttentionShape {
            kv_group: 0,
            ..shape(8, 10, 10, false)
        };
        assert_eq!(BlockInfo::new(&ungrouped, 7).kv_head, 7);
    }

    #[test]
    fn grouped_gradients_go_to_the_query_head_and_groups_cover_the_query_heads() {
        let grouped = AttentionShape {
            kv_group: 4,
            ..shape(8, 10, 10, false)
        };
        let block = BlockInfo::new(&grouped, 8 + 6);
        assert_eq!(block.kv_gradient_head(false), 1);
        assert_eq!(block.kv_gradient_head(true), 6);
        // Batch 1's K/V head 1 (batch_kv_head 2·1 + 1) sums query heads 4..8 of batch 1.
        let group = KvGroup::new(&grouped, 3);
        assert_eq!((group.batch, group.kv_head, group.size), (1, 1, 4));
        assert_eq!(group.first_batch_head, 8 + 4);
        // MQA: one group of every query head; ungrouped: each head its own group of one.
        let mqa = AttentionShape {
            kv_group: 8,
            ..shape(8, 10, 10, false)
        };
        assert_eq!(KvGroup::new(&mqa, 1).first_batch_head, 8);
        let ungrouped = KvGroup::new(&shape(8, 10, 10, false), 13);
        assert_eq!(
            (ungrouped.batch, ungrouped.kv_head, ungrouped.size),
            (1, 5, 1)
        );
        assert_eq!(ungrouped.first_batch_head, 13);
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

    fn windowed(seqlen_q: u32, seqlen_k: u32, causal: bool, left: i32, right: i32) -> BlockInfo {
        let windowed = AttentionShape {
            window_left: left,
            window_right: right,
            ..shape(1, seqlen_q, seqlen_k, causal)
        };
        BlockInfo::new(&windowed, 0)
    }

    #[test]
    fn a_window_skips_key_blocks_on_both_sides() {
        // 512 × 512, window (64, 64), B_r = B_c = 64: rows 256..320 see keys 192..384, blocks
        // 3, 4 and 5 (3 and 5 cross the window's edges, 4 lies inside it).
        let blocks = windowed(512, 512, false, 64, 64).key_blocks(256, 64, 64);
        assert_eq!((blocks.first(), blocks.end(), blocks.count()), (3, 6, 3));
        assert_eq!(blocks.key_start(0), 192);
        assert!(blocks.needs_mask(192));
        assert!(!blocks.needs_mask(256));
        assert!(blocks.needs_mask(320));
        // The first row block: the window starts at key 0, so no block is skipped on the left.
        let blocks = windowed(512, 512, false, 64, 64).key_blocks(0, 64, 64);
        assert_eq!((blocks.first(), blocks.count()), (0, 2));
        assert!(!blocks.needs_mask(0) || blocks.needs_mask(64));
    }

    #[test]
    fn a_window_with_causal_takes_the_diagonal_as_its_right_edge() {
        // Causal + left 150 (right 7 ignored): row 256 sees keys 106..=256, row 319 keys
        // 169..=319, so blocks 1..5: 1 and 2 cross the left edge, 3 is inside, 4 holds the
        // diagonal.
        let info = windowed(512, 512, true, 150, 7);
        assert_eq!(
            info.window,
            KeyWindow {
                left: Some(150),
                right: Some(0)
            }
        );
        let blocks = info.key_blocks(256, 64, 64);
        assert_eq!((blocks.first(), blocks.end()), (1, 5));
        assert!(blocks.needs_mask(64) && blocks.needs_mask(128));
        assert!(!blocks.needs_mask(192));
        assert!(blocks.needs_mask(256));
        assert!(info.heaviest_rows_last());
        // Causal alone is (unbounded, 0): the same blocks as before windows existed.
        let causal = windowed(512, 512, true, -1, -1).key_blocks(256, 64, 64);
        assert_eq!((causal.first(), causal.end()), (0, 5));
        assert!(!causal.needs_mask(0) && causal.needs_mask(256));
    }

    #[test]
    fn a_left_window_alone_skips_blocks_before_it_and_runs_the_grid_in_order() {
        // Window (256, unbounded), seqlen_q = 100 < seqlen_k = 1000: offset 900, so rows 0..64
        // see keys from 644 (row 0) or 707 (row 63): blocks 10..16 of 64, blocks 10 and 11
        // crossing the left edge and 15 the tail.
        let info = windowed(100, 1000, false, 256, -1);
        let blocks = info.key_blocks(0, 64, 64);
        assert_eq!((blocks.first(), blocks.end()), (10, 16));
        assert!(blocks.needs_mask(640) && blocks.needs_mask(704));
        assert!(!blocks.needs_mask(768));
        assert!(blocks.needs_mask(960));
        assert!(!info.heaviest_rows_last());
    }

    /// Calls `check` with every window the brute-force tests run, causal or not, at each
    /// (seqlen_q, seqlen_k) of `lengths`, and a description of the case.
    fn for_each_windowed(lengths: &[(u32, u32)], mut check: impl FnMut(BlockInfo, &str)) {
        let windows = [
            (-1, -1),
            (-1, 0),
            (0, 0),
            (17, 0),
            (5, 9),
            (3, -1),
            (40, 40),
        ];
        for (left, right) in windows {
            for causal in [false, true] {
                for &(seqlen_q, seqlen_k) in lengths {
                    let info = windowed(seqlen_q, seqlen_k, causal, left, right);
                    check(
                        info,
                        &format!("({left}, {right}) causal={causal} {seqlen_q}×{seqlen_k}"),
                    );
                }
            }
        }
    }

    /// Whether the key block from `key_start` hides a pair from one of `rows` (so the masked
    /// step must run) or runs past seqlen_k, by brute force.
    fn hides_a_pair(
        info: &BlockInfo,
        rows: core::ops::Range<u32>,
        key_start: u32,
        cols: u32,
    ) -> bool {
        let (mask, key_end) = (info.mask(), key_start + cols);
        key_end > info.seqlen_k
            || rows
                .into_iter()
                .any(|q| (key_start..key_end).any(|k| !mask.visible(q, k)))
    }

    /// Whether one of `rows` sees a key of `keys` (clipped to seqlen_k), by brute force.
    fn sees_a_key(
        info: &BlockInfo,
        rows: core::ops::Range<u32>,
        keys: core::ops::Range<u32>,
    ) -> bool {
        let (mask, keys) = (info.mask(), keys.start..keys.end.min(info.seqlen_k));
        rows.into_iter()
            .any(|q| keys.clone().any(|k| mask.visible(q, k)))
    }

    #[test]
    fn key_block_ranges_match_a_brute_force_search() {
        // For every window, shape and row block: first..end is exactly the blocks with a visible
        // pair, and a block is masked iff it hides a pair or runs past seqlen_k.
        let lengths = [(113, 203), (203, 113), (64, 64), (1, 70)];
        for_each_windowed(&lengths, |info, case| {
            let (seqlen_q, seqlen_k) = (info.seqlen_q, info.seqlen_k);
            for (rows, cols) in [(16, 16), (64, 32), (32, 64)] {
                for row_start in (0..seqlen_q).step_by(rows as usize) {
                    let row_end = (row_start + rows).min(seqlen_q);
                    let blocks = info.key_blocks(row_start, rows, cols);
                    let seen: std::vec::Vec<u32> = (0..seqlen_k.div_ceil(cols))
                        .filter(|&b| {
                            sees_a_key(&info, row_start..row_end, b * cols..(b + 1) * cols)
                        })
                        .collect();
                    let what = format!("{case} {rows}×{cols} rows {row_start}");
                    match (seen.first(), seen.last()) {
                        (Some(&first), Some(&last)) => {
                            assert_eq!((blocks.first(), blocks.end()), (first, last + 1), "{what}");
                        }
                        _ => assert_eq!(blocks.count(), 0, "{what}"),
                    }
                    for n in 0..blocks.count() {
                        let key_start = blocks.key_start(n);
                        let hides =
                            hides_a_pair(&info, row_start..row_start + rows, key_start, cols);
                        assert_eq!(
                            blocks.needs_mask(key_start),
                            hides,
                            "{what} key {key_start}"
                        );
                    }
                }
            }
        });
    }

    #[test]
    fn a_part_of_a_row_block_counts_the_prefix_of_blocks_its_rows_see() {
        // For every window, shape, row block and 64-row part of it (FA3's consumer warpgroups):
        // the blocks past the part's count hide every pair from its rows, and the last block of
        // the count shows one of its rows a key (or the count is 0 and no row sees a key); a
        // block of the count needs the mask for the part iff it hides a pair from the part's
        // rows or runs past seqlen_k.
        let lengths = [(113, 203), (203, 113), (64, 64), (1, 70), (300, 300)];
        for_each_windowed(&lengths, |info, case| {
            let seqlen_q = info.seqlen_q;
            for (rows, cols, part) in [(192, 128, 64), (128, 80, 64), (128, 16, 32)] {
                for row_start in (0..seqlen_q).step_by(rows as usize) {
                    let blocks = info.key_blocks(row_start, rows, cols);
                    for part_start in (row_start..row_start + rows).step_by(part as usize) {
                        let count = blocks.count_for_rows(part_start, part, seqlen_q);
                        let part_rows = part_start..(part_start + part).min(seqlen_q);
                        let sees = |n: u32| {
                            let key_start = blocks.key_start(n);
                            sees_a_key(&info, part_rows.clone(), key_start..key_start + cols)
                        };
                        let what =
                            format!("{case} {rows}×{cols} rows {row_start} part {part_start}");
                        assert!(count <= blocks.count(), "{what}");
                        for n in 0..count {
                            let key_start = blocks.key_start(n);
                            let hides =
                                hides_a_pair(&info, part_start..part_start + part, key_start, cols);
                            let masked = blocks.needs_mask_for_rows(key_start, part_start, part);
                            assert_eq!(masked, hides, "{what} key {key_start}");
                        }
                        assert!((count..blocks.count()).all(|n| !sees(n)), "{what}");
                        if count > 0 {
                            assert!(sees(count - 1), "{what}");
                        } else {
                            assert!((0..blocks.count()).all(|n| !sees(n)), "{what}");
                        }
                    }
                }
            }
        });
    }
}
