//! The FA3 backward's dQ writer: warp 1 of the producer warpgroup adds each owned dQ_i from its
//! consumer's staging tile to the f32 accumulator by TMA bulk reductions, so no consumer waits on
//! a reduction (FlashAttention-3's `store_dq` warp, fed through `dQFullWG`/`dQEmptyWG`), in the
//! kernels compiled with `Fa3BackwardConfig::DQ_WRITER`; the others have the owner's first
//! thread issue them. Both add through [`DqAccumulator`].
//!
//! ```text
//!  owner consumer c = n % 2, step n          writer warp (lane 0 issues)
//!   wait empty[c] (step n − 2's tile read)    wait full[c]
//!   dQ_i → staging[c], fence                  deterministic: wait row block i's turn
//!   arrive full[c]           ──full[c]──▶     reduce-add staging[c] into dQ's rows of block i
//!                            ◀─empty[c]──     wait for the reductions' reads, arrive empty[c]
//!                                             deterministic: wait for them to complete, pass
//!                                             the turn
//! ```
//!
//! The consumer only waits for its staging tile to be free (two steps of slack); in
//! deterministic mode the turn and the completion wait run here, in a warp with nothing else to
//! do, instead of inside the owner's step.

use super::config::{BLOCK_ROWS, Fa3BackwardConfig};
use super::key_block::KeyBlock;
use super::sram::Fa3BackwardSram;
use crate::arch;
use crate::common::block::BlockInfo;
use crate::common::params::Fa3BackwardParams;
use crate::fwd::fa3::config::{F32_BOX_COLS, WARPGROUP_THREADS};
use crate::fwd::fa3::roles::TENSOR_MAP_BYTES;
use crate::tile::global::RowBlockFlags;
use crate::tile::sequences::Sequences;
use crate::tile::swizzled::{HeadTensorMap, SwizzledF32Tile};

/// This head's rows of dQ's f32 accumulator, as the bulk reductions address them.
pub(super) struct DqAccumulator {
    map: HeadTensorMap,
    /// The 32-column boxes that hold the head dim's columns.
    boxes: u32,
    /// The sequence's first row (0 but in a packed batch, whose accumulator spans every
    /// sequence's rows, as the packed Q).
    q_start: u32,
}

impl DqAccumulator {
    #[inline(always)]
    pub(super) fn new(p: &Fa3BackwardParams, info: &BlockInfo) -> Self {
        Self {
            map: HeadTensorMap::new(p.tensor_maps + 4 * TENSOR_MAP_BYTES, info.head, info.batch),
            boxes: p.base.shape.head_dim.div_ceil(F32_BOX_COLS),
            q_start: info.q_start,
        }
    }

    /// One thread: `staging` added to row block `i`'s rows (line 21's dQ_i += dS_ij·K_j, summed
    /// over the block's keys), one bulk group, committed; the caller waits for its reads before
    /// the tile is written again. In a packed batch the tile's rows past the sequence's queries
    /// are the next sequence's: their dS is 0 (masked), so they add zeros there.
    #[inline(always)]
    pub(super) fn add(&self, staging: &SwizzledF32Tile, i: u32) {
        self.map
            .reduce_add(staging, self.boxes, self.q_start + i * BLOCK_ROWS);
        arch::bulk_commit_group();
    }
}

/// The hand-off of consumer `consumer`'s staging tile at step `n` (of `count`), over two named
/// barriers per consumer, each counting the consumer warpgroup and the writer warp: `full` (the
/// consumer arrives once the tile is stored and fenced; the writer waits) and `empty` (the writer
/// arrives once the reductions have read the tile, if the consumer owns a later step; the
/// consumer waits before storing again). Every arrival has its wait, and neither side can arrive
/// twice before the other has waited (each side's next arrival follows its wait on the other).
#[derive(Clone, Copy)]
pub(super) struct DqHandOff {
    consumer: u32,
    n: u32,
    count: u32,
}

impl DqHandOff {
    /// Named barriers 1..=6 are the consumers' own and their dSᵀ hand-off's
    /// (`kernel::Consumer`, `kernel::DsHandOff`).
    const FULL: u32 = 7;
    const EMPTY: u32 = Self::FULL + 2;
    const THREADS: u32 = WARPGROUP_THREADS + arch::WARP_SIZE;

    /// Step `n` of `count`: owned by consumer n % 2.
    #[inline(always)]
    pub(super) fn of(n: u32, count: u32) -> Self {
        Self {
            consumer: n % 2,
            n,
            count,
        }
    }

    /// The owner, before storing dQ_i: its previous tile (step n − 2) has been read.
    #[inline(always)]
    pub(super) fn wait_empty(self) {
        if self.n >= 2 {
            arch::named_barrier_sync(Self::EMPTY + self.consumer, Self::THREADS);
        }
    }

    /// The owner, once every thread has stored and fenced its part of the tile.
    #[inline(always)]
    pub(super) fn mark_full(self) {
        arch::named_barrier_arrive(Self::FULL + self.consumer, Self::THREADS);
    }

    /// The writer: the owner's tile is stored.
    #[inline(always)]
    fn wait_full(self) {
        arch::named_barrier_sync(Self::FULL + self.consumer, Self::THREADS);
    }

    /// The writer, after the reductions have read the tile: the owner may store again at step
    /// n + 2, if there is one.
    #[inline(always)]
    fn mark_empty(self) {
        if self.n + 2 < self.count {
            arch::named_barrier_arrive(Self::EMPTY + self.consumer, Self::THREADS);
        }
    }
}

/// The writer warp (all 32 lanes; lane 0 issues): for each row block that sees the key block, the
/// owner's staging tile added to dQ_i's rows of the accumulator.
#[inline(always)]
pub(super) fn write_dq<C: Fa3BackwardConfig>(
    p: &Fa3BackwardParams,
    packed: impl Sequences,
    sram: &Fa3BackwardSram,
) {
    let block = KeyBlock::new::<C>(p, packed);
    if !block.has_rows::<C>() {
        return;
    }
    let info = block.info;
    let dq = DqAccumulator::new(p, &info);
    let flags = RowBlockFlags::new(
        p.dq_semaphore,
        info.batch_head,
        info.seqlen_q.div_ceil(BLOCK_ROWS),
    );
    let issues = arch::lane_idx() == 0;
    let (first, end) = (block.row_blocks.first(), block.row_blocks.end());
    for i in first..end {
        let hand_off = DqHandOff::of(i - first, end - first);
        hand_off.wait_full();
        if issues {
            // Deterministic mode: the reductions into row block i one key block at a time, in
            // `dq_turn`'s order, each complete before the next block's turn.
            if C::DETERMINISTIC {
                let turn = KeyBlock::dq_turn::<C>(&info, block.key_start, i);
                flags.wait_for_turn_alone(i, turn);
                // The previous block's reductions, acquired through the flag, before ours.
                arch::fence_proxy_async_global();
            }
            dq.add(&sram.dq_staging(hand_off.consumer), i);
            arch::bulk_wait_group_read::<0>();
        }
        arch::sync_warp();
        hand_off.mark_empty();
        if issues && C::DETERMINISTIC {
            arch::bulk_wait_group::<0>();
            arch::fence_proxy_async_global();
            flags.pass_turn_alone(i);
        }
    }
    // The last reductions have written the accumulator before the block ends.
    if issues {
        arch::bulk_wait_group::<0>();
    }
}
