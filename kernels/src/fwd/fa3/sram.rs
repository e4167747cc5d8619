//! The FA3 forward's shared memory: the Q stages, the K/V ring, the O tile, the mbarriers and the
//! persistent grid's tile numbers, with the barriers' roles and the hand-off of tile numbers
//! (`kernel` runs the roles over it; sizes: `config::Fa3Tiling::shared_bytes`).

use super::config::{
    BARRIERS, Fa3Config, KV_STAGES, MAX_Q_STAGES, TILE_ALIGNMENT, WARPGROUP_THREADS,
};
use crate::arch::{self, MBarrier, SharedAddress};
use crate::tile::swizzled::{SwizzledTile, aligned_shared_start};

/// The block's shared memory: tiles and barriers.
#[derive(Clone, Copy)]
pub(super) struct Fa3Sram {
    /// Q stage 0's tile; stage s's is s tiles further.
    q_start: SharedAddress,
    q_bytes: u32,
    block_rows: u32,
    /// Stage 0's K; stage s's K is s tiles further, its V `KV_STAGES` tiles after its K.
    kv_start: SharedAddress,
    kv_bytes: u32,
    block_cols: u32,
    /// O's tile (B_r rows, every panel), where O leaves by TMA (`C::O_BY_TMA`).
    pub(super) o: SwizzledTile,
    barriers: SharedAddress,
    /// The persistent grid's tile numbers, one word per Q stage, after the barriers.
    tile_slots: SharedAddress,
}

impl Fa3Sram {
    #[inline(always)]
    pub(super) fn new<C: Fa3Config>() -> Self {
        let q_start = aligned_shared_start(TILE_ALIGNMENT);
        let kv_start = q_start.offset(C::Q_STAGES * C::Q_BYTES);
        let o_start = kv_start.offset(2 * KV_STAGES * C::KV_BYTES);
        let o_bytes = if C::O_BY_TMA { C::Q_BYTES } else { 0 };
        let barriers = o_start.offset(o_bytes);
        Self {
            q_start,
            q_bytes: C::Q_BYTES,
            block_rows: C::BLOCK_ROWS,
            kv_start,
            kv_bytes: C::KV_BYTES,
            block_cols: C::BLOCK_COLS,
            o: SwizzledTile::new(o_start, C::BLOCK_ROWS),
            barriers,
            tile_slots: barriers.offset(8 * BARRIERS),
        }
    }

    /// The Q tile of Q stage `stage`.
    #[inline(always)]
    pub(super) fn q(&self, stage: u32) -> SwizzledTile {
        SwizzledTile::new(self.q_start.offset(stage * self.q_bytes), self.block_rows)
    }

    /// The producer hands the number of the tile whose Q goes into `stage` to the consumers
    /// (before Q_i's arrival on q_full, whose release orders this store before their acquire of
    /// the barrier).
    #[inline(always)]
    pub(super) fn set_tile(&self, stage: u32, t: u32) {
        // SAFETY: a word of the block's shared memory past the barriers (`shared_bytes` counts
        // `MAX_Q_STAGES` of them, 8 bytes apart); the consumers read it only after waiting on
        // the stage's q_full, which this thread arrives on after the store.
        unsafe { self.tile_slots.offset(8 * stage).store_u32(t) }
    }

    /// The number of the tile in `stage`, once its q_full phase has completed; the whole warp
    /// calls it. Lane 0 alone reads the word and the other lanes take it by a shuffle: lane 0 is
    /// the lane that later arrives on q_empty for the warp ([`super::roles::release`]), whose
    /// release semantics order only lane 0's own earlier accesses, so under PTX's memory model
    /// a read by lanes 1–31 had no order against the producer's rewrite (nothing like a
    /// `bar.warp.sync` joined them to lane 0's arrival). racecheck's report on this word
    /// (issue #31; docs/perf/fa3-forward.md, "The persistent grid under racecheck") is the
    /// mbarrier hand-off itself, which it does not take as ordering.
    #[inline(always)]
    pub(super) fn tile(&self, stage: u32) -> u32 {
        let t = if arch::lane_idx() == 0 {
            // SAFETY: as for `set_tile`; the producer rewrites it only after every consumer
            // warp's lane 0 has arrived on the stage's q_empty, after this read.
            unsafe { self.tile_slots.offset(8 * stage).load_u32() }
        } else {
            0
        };
        // Lane 0's number on every lane (and in a uniform register).
        arch::warp_uniform(t)
    }

    #[inline(always)]
    pub(super) fn k(&self, stage: u32) -> SwizzledTile {
        SwizzledTile::new(self.kv_start.offset(stage * self.kv_bytes), self.block_cols)
    }

    #[inline(always)]
    pub(super) fn v(&self, stage: u32) -> SwizzledTile {
        let start = self.kv_start.offset((KV_STAGES + stage) * self.kv_bytes);
        SwizzledTile::new(start, self.block_cols)
    }

    #[inline(always)]
    pub(super) fn barrier(&self, index: u32) -> MBarrier {
        MBarrier(self.barriers.offset(8 * index))
    }

    /// Q_i (of Q stage s) has landed.
    #[inline(always)]
    pub(super) fn q_full(&self, stage: u32) -> MBarrier {
        self.barrier(stage)
    }

    /// Every consumer warp is done with Q stage s's Q_i (its last S = Q_i·K_jᵀ has landed): a
    /// later tile's Q may overwrite it.
    #[inline(always)]
    pub(super) fn q_empty(&self, stage: u32) -> MBarrier {
        self.barrier(MAX_Q_STAGES + stage)
    }

    /// K_j (of stage s) has landed.
    #[inline(always)]
    pub(super) fn k_full(&self, stage: u32) -> MBarrier {
        self.barrier(2 * MAX_Q_STAGES + stage)
    }

    #[inline(always)]
    pub(super) fn v_full(&self, stage: u32) -> MBarrier {
        self.barrier(2 * MAX_Q_STAGES + KV_STAGES + stage)
    }

    /// Every consumer warp is done reading stage s's K.
    #[inline(always)]
    pub(super) fn k_empty(&self, stage: u32) -> MBarrier {
        self.barrier(2 * MAX_Q_STAGES + 2 * KV_STAGES + stage)
    }

    #[inline(always)]
    pub(super) fn v_empty(&self, stage: u32) -> MBarrier {
        self.barrier(2 * MAX_Q_STAGES + 3 * KV_STAGES + stage)
    }

    /// One thread: the full barriers expect the producer's one arrival (with its bytes), the
    /// empty barriers one arrival per consumer warp.
    #[inline(always)]
    pub(super) fn init_barriers<C: Fa3Config>(&self) {
        let consumer_warps = C::TILING.consumers * WARPGROUP_THREADS / arch::WARP_SIZE;
        for stage in 0..C::Q_STAGES {
            self.q_full(stage).init(1);
            self.q_empty(stage).init(consumer_warps);
        }
        for stage in 0..KV_STAGES {
            self.k_full(stage).init(1);
            self.v_full(stage).init(1);
            self.k_empty(stage).init(consumer_warps);
            self.v_empty(stage).init(consumer_warps);
        }
        arch::fence_barrier_init();
    }
}
