//! The FA3 backward's shared memory: K_j and V_j, the Q_i/dO_i ring, dSᵀ's buffers, each
//! consumer's dQ_i staging tile and statistics, the mbarriers and their roles (`kernel` runs the
//! roles over it; sizes: `config::Fa3BackwardTiling::shared_bytes`).

use super::config::{DS_BUFFERS, Fa3BackwardConfig, ROW_STAGES};
use crate::arch::{self, MBarrier, SharedAddress};
use crate::fwd::fa3::config::{TILE_ALIGNMENT, WARPGROUP_THREADS};
use crate::tile::shared::SharedVector;
use crate::tile::swizzled::{SwizzledF32Tile, SwizzledTile, aligned_shared_start};

/// Bytes of one mbarrier.
const BARRIER_BYTES: u32 = 8;

/// The block's shared memory: tiles, statistics and barriers (sizes:
/// `config::Fa3BackwardTiling::shared_bytes`).
#[derive(Clone, Copy)]
pub(super) struct Fa3BackwardSram {
    pub(super) k: SwizzledTile,
    pub(super) v: SwizzledTile,
    /// Stage 0's Q_i; stage s's Q_i is s tiles further, its dO_i `ROW_STAGES` tiles after it.
    rows_start: SharedAddress,
    row_bytes: u32,
    block_rows: u32,
    ds_bytes: u32,
    /// dSᵀ of even steps: one row per key of K_j (consumer c's are rows 64c..64c + 64), B_r
    /// queries; odd steps' follows it.
    ds: SwizzledTile,
    /// Consumer c's dQ_i staging tile, `dq_staging_bytes` from `dq_staging + c·dq_staging_bytes`.
    dq_staging: SharedAddress,
    dq_staging_bytes: u32,
    /// Consumer c's L_i then D_i, B_r f32 each, from `statistics + 8·B_r·c`.
    statistics: SharedAddress,
    barriers: SharedAddress,
}

impl Fa3BackwardSram {
    #[inline(always)]
    pub(super) fn new<C: Fa3BackwardConfig>() -> Self {
        let start = aligned_shared_start(TILE_ALIGNMENT);
        let v_start = start.offset(C::KV_BYTES);
        let rows_start = v_start.offset(C::KV_BYTES);
        let ds_start = rows_start.offset(2 * ROW_STAGES * C::ROW_BYTES);
        let dq_staging = ds_start.offset(DS_BUFFERS * C::TILING.ds_bytes());
        let dq_staging_bytes = C::TILING.dq_staging_bytes(C::HEAD_DIM);
        let statistics = dq_staging.offset(C::TILING.consumers * dq_staging_bytes);
        Self {
            k: SwizzledTile::new(start, C::BLOCK_COLS),
            v: SwizzledTile::new(v_start, C::BLOCK_COLS),
            rows_start,
            row_bytes: C::ROW_BYTES,
            block_rows: C::BLOCK_ROWS,
            ds: SwizzledTile::new(ds_start, C::BLOCK_COLS),
            ds_bytes: C::TILING.ds_bytes(),
            dq_staging,
            dq_staging_bytes,
            statistics,
            barriers: statistics.offset(C::TILING.statistics_bytes()),
        }
    }

    /// The same layout `bytes` further on. A step rebases it by an opaque zero
    /// ([`opaque_zero`]), so its ~50 wgmma descriptors are derived inside the step, in uniform
    /// registers, instead of being hoisted out of the row loop into per-thread registers that
    /// ptxas spills (328 bytes at d = 128 before).
    #[inline(always)]
    pub(super) fn shifted(&self, bytes: u32) -> Self {
        Self {
            k: self.k.shifted(bytes),
            v: self.v.shifted(bytes),
            rows_start: self.rows_start.offset(bytes),
            ds: self.ds.shifted(bytes),
            dq_staging: self.dq_staging.offset(bytes),
            statistics: self.statistics.offset(bytes),
            barriers: self.barriers.offset(bytes),
            ..*self
        }
    }

    #[inline(always)]
    pub(super) fn q(&self, stage: u32) -> SwizzledTile {
        let start = self.rows_start.offset(stage * self.row_bytes);
        SwizzledTile::new(start, self.block_rows)
    }

    #[inline(always)]
    pub(super) fn d_o(&self, stage: u32) -> SwizzledTile {
        let start = self
            .rows_start
            .offset((ROW_STAGES + stage) * self.row_bytes);
        SwizzledTile::new(start, self.block_rows)
    }

    /// The dSᵀ buffer of steps of parity `buffer`.
    #[inline(always)]
    pub(super) fn ds(&self, buffer: u32) -> SwizzledTile {
        self.ds.shifted(buffer * self.ds_bytes)
    }

    /// Consumer `consumer`'s dQ_i staging tile.
    #[inline(always)]
    pub(super) fn dq_staging(&self, consumer: u32) -> SwizzledF32Tile {
        let start = self.dq_staging.offset(consumer * self.dq_staging_bytes);
        SwizzledF32Tile::new(start, self.block_rows)
    }

    /// Consumer `consumer`'s L_i (`vector` 0) or D_i (`vector` 1).
    #[inline(always)]
    pub(super) fn statistics(&self, consumer: u32, vector: u32) -> SharedVector {
        let per_vector = 4 * self.block_rows;
        SharedVector::at(self.statistics.offset((2 * consumer + vector) * per_vector))
    }

    /// K_j and V_j have landed: the first barrier.
    #[inline(always)]
    pub(super) fn kv_full(&self) -> MBarrier {
        MBarrier(self.barriers)
    }

    /// Q_i and dO_i (of stage s) have landed: barriers 1..=`ROW_STAGES`.
    #[inline(always)]
    pub(super) fn rows_full(&self, stage: u32) -> MBarrier {
        MBarrier(self.barriers.offset(BARRIER_BYTES * (1 + stage)))
    }

    /// Every consumer warp is done reading stage s's Q_i and dO_i: the last `ROW_STAGES`.
    #[inline(always)]
    pub(super) fn rows_empty(&self, stage: u32) -> MBarrier {
        MBarrier(
            self.barriers
                .offset(BARRIER_BYTES * (1 + ROW_STAGES + stage)),
        )
    }

    /// One thread: the full barriers expect the producer's one arrival (with its bytes), the
    /// empty barriers one arrival per consumer warp.
    #[inline(always)]
    pub(super) fn init_barriers<C: Fa3BackwardConfig>(&self) {
        let consumer_warps = C::TILING.consumers * WARPGROUP_THREADS / arch::WARP_SIZE;
        self.kv_full().init(1);
        for stage in 0..ROW_STAGES {
            self.rows_full(stage).init(1);
            self.rows_empty(stage).init(consumer_warps);
        }
        arch::fence_barrier_init();
    }
}
