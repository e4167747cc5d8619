//! FlashAttention-3 forward: the FA2 algorithm (outer loop over Q blocks, unnormalised Õ, one
//! final divide, L) on Hopper's asynchronous machinery, as seed 001 and FlashAttention-3 lay it
//! out. Generic over one config `C: Fa3Config`.
//!
//! ```text
//!  warpgroup 0, producer (24–56 registers)     warpgroups 1..=C, consumers (64 rows of Q_i each)
//!  one thread issues TMA:                       wait Q_i
//!   Q_i once                    ──q_full──▶     for each K/V block j:
//!   for j: wait k_empty[s]; K_j ──k_full[s]──▶    wait K_j; S = Q_i·K_jᵀ (wgmma, SS); release K_j
//!          wait v_empty[s]; V_j ──v_full[s]──▶    mask, online softmax (P̃ stays in registers)
//!   s = j % 2 (the ring)                          wait V_j; Õ += P̃·V_j (wgmma, RS); release V_j
//!                                               O = Õ/ℓ, L = m + log ℓ
//! ```
//!
//! Shared memory: Q_i, then K and V in two stages each, every tile in 64-column panels with the
//! 128-byte swizzle (`tile::swizzled`), then the mbarriers. The barriers' phases follow the
//! ring: block j uses stage j % 2 in phase (j / 2) % 2; the producer waits on the empty
//! barrier's previous phase, which a fresh barrier counts as complete, so the first two blocks
//! load without waiting.
//!
//! Softmax in the exp2 domain with FA2-TC's conditional rescale, on each warp's 16 rows of the
//! m64 accumulator, which have mma.sync's fragment layout (`tile::accumulator`).

use super::config::{BARRIERS, Fa3Config, KV_STAGES, TILE_ALIGNMENT, WARPGROUP_ROWS, WARPGROUP_THREADS};
use crate::arch::{self, MBarrier, SharedAddress};
use crate::common::block::{BlockInfo, KeyBlocks};
use crate::common::element::TensorCoreElement;
use crate::common::params::Fa3Params;
use crate::common::softmax::{LOG2_E, RowStats, needs_rescale};
use crate::fwd::fa2_tc::config::conditional_rescale;
use crate::tile::accumulator::{ScoreBlock, store_rows};
use crate::tile::fragment::MMA_M;
use crate::tile::global::{HeadRows16, HeadVector};
use crate::tile::swizzled::{HeadTensorMap, SwizzledTile, aligned_shared_start};

/// Bytes of one `CUtensorMap`: the Q, K and V maps lie this far apart.
const TENSOR_MAP_BYTES: u64 = 128;

/// The block's shared memory: tiles and barriers.
#[derive(Clone, Copy)]
struct Fa3Sram {
    q: SwizzledTile,
    /// Stage 0's K; stage s's K is s tiles further, its V `KV_STAGES` tiles after its K.
    kv_start: SharedAddress,
    kv_bytes: u32,
    block_cols: u32,
    barriers: SharedAddress,
}

impl Fa3Sram {
    #[inline(always)]
    fn new<C: Fa3Config>() -> Self {
        let start = aligned_shared_start(TILE_ALIGNMENT);
        let kv_start = start.offset(C::Q_BYTES);
        Self {
            q: SwizzledTile::new(start, C::BLOCK_ROWS),
            kv_start,
            kv_bytes: C::KV_BYTES,
            block_cols: C::BLOCK_COLS,
            barriers: kv_start.offset(2 * KV_STAGES * C::KV_BYTES),
        }
    }

    #[inline(always)]
    fn k(&self, stage: u32) -> SwizzledTile {
        SwizzledTile::new(self.kv_start.offset(stage * self.kv_bytes), self.block_cols)
    }

    #[inline(always)]
    fn v(&self, stage: u32) -> SwizzledTile {
        let start = self.kv_start.offset((KV_STAGES + stage) * self.kv_bytes);
        SwizzledTile::new(start, self.block_cols)
    }

    #[inline(always)]
    fn barrier(&self, index: u32) -> MBarrier {
        MBarrier(self.barriers.offset(8 * index))
    }

    /// Q_i has landed.
    #[inline(always)]
    fn q_full(&self) -> MBarrier {
        self.barrier(0)
    }

    /// K_j (of stage s) has landed.
    #[inline(always)]
    fn k_full(&self, stage: u32) -> MBarrier {
        self.barrier(1 + stage)
    }

    #[inline(always)]
    fn v_full(&self, stage: u32) -> MBarrier {
        self.barrier(1 + KV_STAGES + stage)
    }

    /// Every consumer warp is done reading stage s's K.
    #[inline(always)]
    fn k_empty(&self, stage: u32) -> MBarrier {
        self.barrier(1 + 2 * KV_STAGES + stage)
    }

    #[inline(always)]
    fn v_empty(&self, stage: u32) -> MBarrier {
        self.barrier(1 + 3 * KV_STAGES + stage)
    }

    /// One thread: the full barriers expect the producer's one arrival (with its bytes), the
    /// empty barriers one arrival per consumer warp.
    #[inline(always)]
    fn init_barriers<C: Fa3Config>(&self) {
        let consumer_warps = C::TILING.consumers * WARPGROUP_THREADS / arch::WARP_SIZE;
        for index in 0..BARRIERS {
            let empty = index > 2 * KV_STAGES;
            self.barrier(index)
                .init(if empty { consumer_warps } else { 1 });
        }
        arch::fence_barrier_init();
    }
}

/// Stage and phase of K/V block `j` in the two-stage ring.
#[inline(always)]
fn ring(j: u32) -> (u32, u32) {
    (j % KV_STAGES, (j / KV_STAGES) % 2)
}

/// The kernel body for one config `C`. Grid (⌈seqlen_q/B_r⌉, batch·heads),
/// `C::TILING.threads()` threads, `C::TILING.shared_bytes(d)` bytes of dynamic shared memory.
#[inline(always)]
pub fn forward<T: TensorCoreElement, C: Fa3Config>(p: &Fa3Params) {
    let () = C::CHECKED;
    let info = BlockInfo::new(&p.shape, arch::block_idx_y());
    // Causal: the last row blocks see the most keys; start them first so the grid's tail is short.
    let row_block = if info.causal {
        arch::grid_dim_x() - 1 - arch::block_idx_x()
    } else {
        arch::block_idx_x()
    };
    let row_start = row_block * C::BLOCK_ROWS;
    let blocks = info.key_blocks(row_start, C::BLOCK_ROWS, C::BLOCK_COLS);
    let sram = Fa3Sram::new::<C>();
    if arch::thread_idx_x() == 0 {
        sram.init_barriers::<C>();
    }
    arch::sync_threads();
    let warpgroup = arch::thread_idx_x() / WARPGROUP_THREADS;
    if warpgroup == 0 {
        arch::release_registers::<{ C::PRODUCER_REGISTERS }>();
        if arch::thread_idx_x() == 0 {
            produce::<C>(p, &info, &blocks, row_start, &sram);
        }
    } else {
        arch::claim_registers::<{ C::CONSUMER_REGISTERS }>();
        consume::<T, C>(p, &info, &blocks, row_start, &sram, warpgroup - 1);
    }
}

/// The producer's one thread: Q_i, then K_j and V_j into the ring as stages free up.
#[inline(always)]
fn produce<C: Fa3Config>(
    p: &Fa3Params,
    info: &BlockInfo,
    blocks: &KeyBlocks,
    row_start: u32,
    sram: &Fa3Sram,
) {
    let maps = p.tensor_maps;
    let q = HeadTensorMap::new(maps, info.head, info.batch);
    let k = HeadTensorMap::new(maps + TENSOR_MAP_BYTES, info.kv_head, info.batch);
    let v = HeadTensorMap::new(maps + 2 * TENSOR_MAP_BYTES, info.kv_head, info.batch);
    sram.q_full().arrive_expect_bytes(C::Q_BYTES);
    q.load(&sram.q, C::PANELS, row_start, sram.q_full());
    for j in 0..blocks.count() {
        let (stage, phase) = ring(j);
        let key_start = j * C::BLOCK_COLS;
        // The stage's previous block (j − 2) must be released first.
        sram.k_empty(stage).wait(phase ^ 1);
        sram.k_full(stage).arrive_expect_bytes(C::KV_BYTES);
        k.load(&sram.k(stage), C::PANELS, key_start, sram.k_full(stage));
        sram.v_empty(stage).wait(phase ^ 1);
        sram.v_full(stage).arrive_expect_bytes(C::KV_BYTES);
        v.load(&sram.v(stage), C::PANELS, key_start, sram.v_full(stage));
    }
}

/// One consumer warpgroup: its 64 rows of Q_i against every K/V block, then O and L.
#[inline(always)]
fn consume<T: TensorCoreElement, C: Fa3Config>(
    p: &Fa3Params,
    info: &BlockInfo,
    blocks: &KeyBlocks,
    row_start: u32,
    sram: &Fa3Sram,
    consumer: u32,
) {
    let group_row = consumer * WARPGROUP_ROWS;
    // The sequence row of this warp's first row of the accumulators.
    let warp_row = row_start + group_row + arch::warp_idx() % 4 * MMA_M;
    let mut stats = [RowStats::EMPTY; 2];
    let mut acc = [[0.0f32; 4]; C::O_TILES];
    let score_scale = p.shape.softmax_scale * LOG2_E;
    sram.q_full().wait(0);
    for j in 0..blocks.count() {
        let (stage, phase) = ring(j);
        let key_start = j * C::BLOCK_COLS;
        let step = BlockStep {
            sram,
            stage,
            phase,
            group_row,
            warp_row,
            block: ScoreBlock {
                key_start,
                seqlen_k: info.seqlen_k,
                mask: blocks.mask(),
                score_scale,
            },
        };
        if blocks.needs_mask(key_start) {
            step.run::<T, C, true>(&mut stats, &mut acc);
        } else {
            step.run::<T, C, false>(&mut stats, &mut acc);
        }
    }
    let o = HeadRows16::new(&p.o, info.batch, info.head, info.seqlen_q);
    let logsumexp = HeadVector::new(p.logsumexp, info.batch_head, info.seqlen_q);
    let (seqlen_q, cols) = (info.seqlen_q, p.shape.head_dim);
    store_rows::<T, _>(&o, &logsumexp, warp_row, seqlen_q, cols, &stats, &acc);
}

/// One K/V block for one consumer warpgroup.
#[derive(Clone, Copy)]
struct BlockStep<'a> {
    sram: &'a Fa3Sram,
    stage: u32,
    phase: u32,
    /// This warpgroup's first row within Q_i.
    group_row: u32,
    /// The sequence row of this warp's first row.
    warp_row: u32,
    block: ScoreBlock,
}

impl BlockStep<'_> {
    /// S = Q_i·K_jᵀ; m, ℓ, Õ updated as in FA2 (the max moved only when it jumps, at d ≤ 128);
    /// Õ += P̃·V_j. `MASK`: apply the causal mask and the seqlen_k tail element-wise.
    #[inline(always)]
    fn run<T: TensorCoreElement, C: Fa3Config, const MASK: bool>(
        &self,
        stats: &mut [RowStats; 2],
        acc: &mut [[f32; 4]; C::O_TILES],
    ) {
        let mut scores = self.scores::<T, C>();
        if MASK {
            self.block.apply_mask(&mut scores, self.warp_row);
        }
        let block_max = [self.block.row_max(&scores, 0), self.block.row_max(&scores, 1)];
        let jumps = needs_rescale(stats[0].max, block_max[0])
            || needs_rescale(stats[1].max, block_max[1]);
        // One decision per warp: the branches in the softmax are warp-uniform.
        let rescale = !conditional_rescale(C::HEAD_DIM) || arch::vote_any(jumps);
        let p: [[u32; 4]; C::P_CHUNKS] =
            self.block
                .online_softmax::<T, _, _, _>(&mut scores, block_max, rescale, stats, acc);
        self.accumulate_pv::<T, C>(&p, acc);
    }

    /// S = Q_i·K_jᵀ for this warpgroup's 64 rows: d/16 SS wgmmas in one group, then K_j's stage
    /// is released.
    #[inline(always)]
    fn scores<T: TensorCoreElement, C: Fa3Config>(&self) -> [[f32; 4]; C::S_TILES] {
        let k = self.sram.k(self.stage);
        self.sram.k_full(self.stage).wait(self.phase);
        let mut scores = [[0.0f32; 4]; C::S_TILES];
        arch::wgmma_fence();
        for step in 0..C::Q_STEPS {
            let a = self.sram.q.k_major_step(self.group_row, step);
            let b = k.k_major_step(0, step);
            arch::wgmma_ss(&mut scores, a, b, step > 0, T::BF16);
        }
        arch::wgmma_commit();
        arch::wgmma_wait::<0>();
        arch::wgmma_fence_accumulator(&mut scores);
        release(self.sram.k_empty(self.stage));
        scores
    }

    /// Õ += P̃·V_j: B_c/16 RS wgmmas (P̃ from registers), then V_j's stage is released.
    #[inline(always)]
    fn accumulate_pv<T: TensorCoreElement, C: Fa3Config>(
        &self,
        p: &[[u32; 4]; C::P_CHUNKS],
        acc: &mut [[f32; 4]; C::O_TILES],
    ) {
        let v = self.sram.v(self.stage);
        self.sram.v_full(self.stage).wait(self.phase);
        arch::wgmma_fence();
        for (chunk, fragment) in p.iter().enumerate() {
            arch::wgmma_rs(acc, *fragment, v.mn_major_rows(chunk as u32), true, T::BF16);
        }
        arch::wgmma_commit();
        arch::wgmma_wait::<0>();
        arch::wgmma_fence_accumulator(acc);
        release(self.sram.v_empty(self.stage));
    }
}

/// This warp is done reading a stage: one arrival on its empty barrier.
#[inline(always)]
fn release(empty: MBarrier) {
    if arch::lane_idx() == 0 {
        empty.arrive();
    }
}
