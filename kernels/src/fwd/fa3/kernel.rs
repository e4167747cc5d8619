//! FlashAttention-3 forward: the FA2 algorithm (outer loop over Q blocks, unnormalised Õ, one
//! final divide, L) on Hopper's asynchronous machinery, as seed 001 and FlashAttention-3 lay it
//! out. Generic over one config `C: Fa3Config`.
//!
//! ```text
//!  warpgroup 0, producer (24–56 registers)     warpgroups 1..=C, consumers (64 rows of Q_i each)
//!  one thread issues TMA:                       wait Q_i; S_0, softmax_0
//!   Q_i once                    ──q_full──▶     for each K/V block j ≥ 1 (seed 001's pipeline):
//!   for j: wait k_empty[s]; K_j ──k_full[s]──▶    issue S_j = Q_i·K_jᵀ (wgmma SS) and
//!          wait v_empty[s]; V_j ──v_full[s]──▶          Õ += P̃_{j−1}·V_{j−1} (wgmma RS)
//!   s = j % 2 (the ring)                          wait S_j; release K_j; softmax_j (mask, m, ℓ, P̃_j)
//!                                                 wait P̃·V; release V_{j−1}; Õ = diag(α_j)·Õ
//!                                               Õ += P̃_last·V_last; O = Õ/ℓ, L = m + log ℓ
//!  ping-pong: the consumers issue their products in turns (named barriers), so one's softmax
//!  runs beside another's products (`GemmTurns`)
//! ```
//!
//! Shared memory: Q_i (on the persistent grid at d ≤ 128, two Q stages: the next tile's Q_i lands
//! while this tile's last products run), then K and V in two stages each, every tile in
//! 64-column panels with the 128-byte swizzle (`tile::swizzled`), then the mbarriers. The
//! barriers' phases follow the ring: block j uses stage j % 2 in phase (j / 2) % 2; the producer
//! waits on the empty barrier's previous phase, which a fresh barrier counts as complete, so the
//! first two blocks load without waiting. The Q stages follow the same rule over tiles.
//!
//! Softmax in the exp2 domain with FA2-TC's conditional rescale, on each warp's 16 rows of the
//! m64 accumulator, which have mma.sync's fragment layout (`tile::accumulator`).

use super::config::{Fa3Config, WARPGROUP_ROWS};
use super::roles::{TENSOR_MAP_BYTES, release, ring, split_roles};
use super::scheduler::{Tile, TileScheduler};
use super::sram::Fa3Sram;
use super::turns::GemmTurns;
use crate::arch::{self, L2Priority, MBarrier};
use crate::common::alibi::Alibi;
use crate::common::block::{BlockInfo, KeyBlocks};
use crate::common::dropout::Dropout;
use crate::common::element::TensorCoreElement;
use crate::common::params::Fa3Params;
use crate::common::softcap::Softcap;
use crate::common::softmax::{
    LOG2_E, RESCALE_THRESHOLD, RowStats, needs_rescale, needs_rescale_past, rescale_threshold,
};
use crate::fwd::fa2_tc::config::conditional_rescale;
use crate::tile::accumulator::{
    ScoreBlock, drop_probabilities, finish_rows, forward_keep_bits, pack_row, scale_row,
    scale_rows, store_rows,
};
use crate::tile::fragment::{LDMATRIX_SIDE, MMA_M, accumulator_row};
use crate::tile::global::{HeadRows16, HeadVector, TileCounters};
use crate::tile::sequences::Sequences;
use crate::tile::swizzled::{HeadTensorMap, SwizzledTile};

/// The kernel body for one config `C`. Grid (⌈seqlen_q/B_r⌉, batch·heads), or on the persistent
/// grid (`C::PERSISTENT`) (min(tiles, SMs), 1); `C::TILING.threads()` threads,
/// `C::TILING.shared_bytes(d)` bytes of dynamic shared memory. `packed`: a packed form's
/// sequences (`C::PACKED`), else [`PackedTable::NONE` (`tile::sequences`)].
#[inline(always)]
pub fn forward<T: TensorCoreElement, C: Fa3Config>(p: &Fa3Params, packed: impl Sequences) {
    let () = C::CHECKED;
    let sram = Fa3Sram::new::<C>();
    split_roles!(
        C,
        sram.init_barriers::<C>(),
        produce_tiles::<C>(p, packed, &sram),
        |consumer| consume_tiles::<T, C>(p, packed, &sram, consumer)
    );
}

/// Tile `t`: the scheduler's, or in a packed batch (`C::PACKED`, one tile per block) the one
/// of its sequence's own rows (`BlockInfo::packed`, from the launch's table of offsets), none
/// for a row block past the sequence's queries. Each role finds that with the tile it computes
/// anyway: the producer sends the end mark alone and the consumers stop at it, so an empty
/// block costs its barriers' setup, and the others no test before the roles split (call 33:
/// there, in all 16 warps, it was 76 instructions a warp).
#[inline(always)]
fn tile_at<C: Fa3Config>(
    p: &Fa3Params,
    packed: impl Sequences,
    scheduler: &TileScheduler,
    t: u32,
) -> Option<Tile> {
    if !C::PACKED {
        return scheduler.tile(t);
    }
    let tile = scheduler.tile(t)?;
    let info = packed.block(&p.shape, tile.info.batch_head, true, C::LOCAL);
    let tile = scheduler.for_sequence(tile, info);
    (tile.row_start < tile.info.seqlen_q).then_some(tile)
}

/// Where a block is in its walk over tiles: the ring's blocks are counted across tiles (stage and
/// phase continue), and so are the Q stages: tile n's Q is in stage n % `Q_STAGES`, whose
/// barriers alternate phase at each of its uses.
#[derive(Clone, Copy)]
struct TileWalk {
    /// Tiles this block has finished.
    n: u32,
    /// K/V ring blocks of those tiles: block j of the current tile is ring block `ring_base + j`.
    ring_base: u32,
}

impl TileWalk {
    const START: Self = Self { n: 0, ring_base: 0 };

    #[inline(always)]
    fn after(self, tile: &Tile) -> Self {
        Self {
            n: self.n + 1,
            ring_base: self.ring_base + tile.blocks.count(),
        }
    }

    /// The Q stage of the current tile.
    #[inline(always)]
    fn q_stage<C: Fa3Config>(self) -> u32 {
        self.n % C::Q_STAGES
    }

    /// The parity of the current tile's Q barriers.
    #[inline(always)]
    fn q_phase<C: Fa3Config>(self) -> u32 {
        (self.n / C::Q_STAGES) % 2
    }
}

/// The producer's one thread: the block's tile, or on the persistent grid each tile it takes
/// until none is left. Each tile's number goes to the consumers through shared memory with its
/// Q (an end mark, a number past the problem, arrives alone).
#[inline(always)]
fn produce_tiles<C: Fa3Config>(p: &Fa3Params, packed: impl Sequences, sram: &Fa3Sram) {
    let scheduler = TileScheduler::new(&p.shape, C::BLOCK_ROWS, C::BLOCK_COLS, C::LOCAL);
    let counters = TileCounters::new(p.tile_counters);
    let (mut t, mut walk) = (scheduler.first(), TileWalk::START);
    loop {
        let tile = tile_at::<C>(p, packed, &scheduler, t);
        let q_stage = walk.q_stage::<C>();
        if C::PERSISTENT {
            // The consumers are done with the stage's previous Q_i (with two stages, the one
            // before the tile they are computing now), and read its number long before.
            sram.q_empty(q_stage).wait(walk.q_phase::<C>() ^ 1);
            sram.set_tile(q_stage, t);
        }
        let Some(tile) = tile else {
            sram.q_full(q_stage).arrive();
            break;
        };
        // Taken before this tile's loads, so the counter's latency hides behind them.
        let next = if C::PERSISTENT {
            counters.take(arch::grid_dim_x())
        } else {
            0
        };
        produce::<C>(p, tile, sram, walk);
        if !C::PERSISTENT {
            break;
        }
        (t, walk) = (next, walk.after(&tile));
    }
    if C::PERSISTENT {
        counters.finish(arch::grid_dim_x());
    }
}

/// One consumer warpgroup: each tile the producer hands it, as [`consume`].
#[inline(always)]
fn consume_tiles<T: TensorCoreElement, C: Fa3Config>(
    p: &Fa3Params,
    packed: impl Sequences,
    sram: &Fa3Sram,
    consumer: u32,
) {
    let scheduler = TileScheduler::new(&p.shape, C::BLOCK_ROWS, C::BLOCK_COLS, C::LOCAL);
    let turns = GemmTurns::new(consumer, C::TILING.consumers, C::PING_PONG);
    turns.start();
    let (mut t, mut walk) = (scheduler.first(), TileWalk::START);
    loop {
        let q_stage = walk.q_stage::<C>();
        sram.q_full(q_stage).wait(walk.q_phase::<C>());
        if C::PERSISTENT {
            t = sram.tile(q_stage);
        }
        let Some(tile) = tile_at::<C>(p, packed, &scheduler, t) else {
            break;
        };
        consume::<T, C>(p, packed, tile, sram, consumer, turns, walk);
        if !C::PERSISTENT {
            break;
        }
        walk = walk.after(&tile);
    }
    if C::O_BY_TMA && arch::lane_idx() == 0 {
        // The warp's last stores of O have read its rows of the tile before the block exits.
        arch::bulk_wait_group::<0>();
    }
    turns.finish();
}

/// The producer's one thread, for one tile: Q_i, then K_j and V_j into the ring as stages free
/// up.
#[inline(always)]
fn produce<C: Fa3Config>(p: &Fa3Params, tile: Tile, sram: &Fa3Sram, walk: TileWalk) {
    let Tile {
        info,
        row_start,
        blocks,
    } = tile;
    let maps = p.tensor_maps;
    let q = HeadTensorMap::new(maps, info.head, info.batch);
    let k = HeadTensorMap::new(maps + TENSOR_MAP_BYTES, info.kv_head, info.batch);
    let v = HeadTensorMap::new(maps + 2 * TENSOR_MAP_BYTES, info.kv_head, info.batch);
    let q_stage = walk.q_stage::<C>();
    let q_full = sram.q_full(q_stage);
    q_full.arrive_expect_bytes(C::Q_BYTES);
    // Rows from the sequence's first in a packed batch, whose maps span every sequence.
    let (q_start, k_start) = if C::PACKED {
        (info.q_start, info.k_start)
    } else {
        (0, 0)
    };
    // Q_i is this tile's alone; K and V are read again by the head's other row blocks
    // (FlashAttention-3's hints).
    let q_tile = sram.q(q_stage);
    q.load(
        &q_tile,
        C::PANELS,
        q_start + row_start,
        q_full,
        L2Priority::EvictFirst,
    );
    for j in 0..blocks.count() {
        let (stage, phase) = ring(walk.ring_base + j);
        let key_start = k_start + blocks.key_start(j);
        // Each of K_j and V_j: the stage's previous block (j − 2) must be released first.
        let load = |map: &HeadTensorMap, tile, full: MBarrier, empty: MBarrier| {
            empty.wait(phase ^ 1);
            full.arrive_expect_bytes(C::KV_BYTES);
            map.load(&tile, C::PANELS, key_start, full, L2Priority::EvictLast);
        };
        load(&k, sram.k(stage), sram.k_full(stage), sram.k_empty(stage));
        load(&v, sram.v(stage), sram.v_full(stage), sram.v_empty(stage));
    }
}

/// One consumer warpgroup: its 64 rows of Q_i against every K/V block, then O and L. Seed 001's
/// pipeline inside the warpgroup: while the softmax of block j runs on the SFU and FMA units,
/// Õ += P̃_{j−1}·V_{j−1} runs on the tensor cores (issued together with S_j = Q_i·K_jᵀ, waited for
/// after the softmax); Õ's rescale by block j's α runs once that product has landed, while
/// S_{j+1} runs, just before P̃_j·V_j is issued.
#[inline(always)]
fn consume<T: TensorCoreElement, C: Fa3Config>(
    p: &Fa3Params,
    packed: impl Sequences,
    tile: Tile,
    sram: &Fa3Sram,
    consumer: u32,
    turns: GemmTurns,
    walk: TileWalk,
) {
    let Tile {
        info,
        row_start,
        blocks,
    } = tile;
    // Warp-uniform as ptxas sees it, so the Q descriptors built from it stay in uniform registers.
    let group_row = arch::warp_uniform(consumer) * WARPGROUP_ROWS;
    // The sequence row of this warp's first row of the accumulators.
    let warp_row = row_start + group_row + arch::warp_idx() % 4 * MMA_M;
    let threshold = |h| rescale_threshold(row_votes::<C>(warp_row, h, info.seqlen_q));
    let q_stage = walk.q_stage::<C>();
    let warpgroup = Consumer {
        sram,
        q: sram.q(q_stage),
        group_row,
        group_first_row: row_start + group_row,
        warp_row,
        blocks: &blocks,
        seqlen_q: info.seqlen_q,
        // Only where `jumps` reads them: LLVM would otherwise merge the dense local form's test
        // per block with this one and keep its rows live across the loop.
        rescale_thresholds: if C::PACKED {
            [threshold(0), threshold(1)]
        } else {
            [RESCALE_THRESHOLD; 2]
        },
        seqlen_k: info.seqlen_k,
        softcap: Softcap::of_form(&p.shape, C::LOCAL),
        alibi: Alibi::of_block(&p.shape, &info, C::LOCAL),
        dropout: Dropout::of_block(&p.shape, info.batch_head, C::LOCAL),
        score_scale: p.shape.softmax_scale * LOG2_E,
        turns,
        ring_base: walk.ring_base,
    };
    let mut stats = [RowStats::EMPTY; 2];
    let mut acc = [[0.0f32; 4]; C::O_TILES];
    // This warpgroup's blocks: a prefix of the tile's, short of it where the diagonal (or the end
    // of the sequence) passes its rows before the tile's last block. It waits for and releases
    // the rest ([`Consumer::skip_block`]) without computing their scores, all masked.
    let count = blocks.count_for_rows(warpgroup.group_first_row, WARPGROUP_ROWS, info.seqlen_q);
    // Every S = Q_i·K_jᵀ has landed (or none runs): the producer may load the next tile's Q.
    let release_q = || {
        if C::PERSISTENT {
            release(sram.q_empty(q_stage));
        }
    };
    if count == 0 {
        release_q();
        if blocks.count() > 0 {
            // The turn the others take for their last P̃·V.
            warpgroup.turns.take();
            warpgroup.turns.pass();
        }
    } else {
        // Block 0: S_0 and its softmax (Õ is still zero: nothing to rescale).
        let mut scores = [[0.0f32; 4]; C::S_TILES];
        warpgroup.turns.take();
        warpgroup.wait_operands(Some(0), None);
        warpgroup.issue_scores::<T, C>(0, &mut scores);
        warpgroup.turns.pass();
        let kept = warpgroup.keep_bits::<C>(0);
        warpgroup.land_scores::<0, _>(0, &mut scores);
        let (probabilities, _) = warpgroup.softmax::<C>(0, &scores, &mut stats, kept);
        let mut p_tilde = pack::<T, C>(&probabilities);
        // α of the last softmax, for Õ before the next product adds to it.
        let mut pending_alpha = None;
        for j in 1..count {
            // S_j and P̃_{j−1}·V_{j−1} in flight together; the softmax of j while the second runs.
            warpgroup.turns.take();
            warpgroup.wait_operands(Some(j), Some(j - 1));
            warpgroup.issue_scores::<T, C>(j, &mut scores);
            // Õ = diag(α_{j−1})·Õ while S_j runs on the tensor cores (FlashAttention-3's place).
            // The rescale is decided per warp; the fence after it, which orders its writes
            // before the product reads Õ, runs in every warp of the warpgroup at one pc.
            rescale(&mut acc, pending_alpha);
            arch::wgmma_fence();
            warpgroup.issue_pv::<T, C>(j - 1, &p_tilde, &mut acc);
            warpgroup.turns.pass();
            // Dropout's keep bits while S_j runs: Philox on the ALU under the tensor cores.
            let kept = warpgroup.keep_bits::<C>(j);
            warpgroup.land_scores::<1, _>(j, &mut scores);
            let (probabilities, alpha) = warpgroup.softmax::<C>(j, &scores, &mut stats, kept);
            warpgroup.land_pv(j - 1, &mut acc, &mut p_tilde);
            pending_alpha = alpha;
            // Packed only now: P̃_j's 16-bit fragments must not be written while P̃_{j−1}·V_{j−1},
            // which reads the previous ones, is in flight.
            p_tilde = pack::<T, C>(&probabilities);
        }
        release_q();
        rescale(&mut acc, pending_alpha);
        warpgroup.turns.take();
        warpgroup.wait_operands(None, Some(count - 1));
        warpgroup.issue_pv::<T, C>(count - 1, &p_tilde, &mut acc);
        warpgroup.turns.pass();
        warpgroup.land_pv(count - 1, &mut acc, &mut p_tilde);
    }
    for j in count..blocks.count() {
        warpgroup.skip_block(j);
    }
    if warpgroup.dropout.is_on() {
        scale_rows(&mut acc, warpgroup.dropout.keep_scale());
    }
    if C::O_BY_TMA {
        warpgroup.store_o_by_tma::<T, C>(p, &info, &stats, &acc);
        return;
    }
    let o = HeadRows16::new(&p.o, info.batch, info.head, info.seqlen_q);
    let (o, logsumexp) = if C::PACKED {
        let logsumexp = HeadVector::packed(p.logsumexp, info.head, packed.total_q(), info.q_start);
        (o.starting_at(info.q_start), logsumexp)
    } else {
        (
            o,
            HeadVector::new(p.logsumexp, info.batch_head, info.seqlen_q),
        )
    };
    let (seqlen_q, cols) = (info.seqlen_q, p.shape.head_dim);
    store_rows::<T, _>(
        &o,
        &logsumexp,
        warpgroup.warp_row,
        seqlen_q,
        cols,
        &stats,
        &acc,
    );
}

/// Õ = diag(α)·Õ for the lane's two rows, when the softmax moved their max (FA2's conditional
/// rescale: `None` when neither row's max moved).
#[inline(always)]
fn rescale<const O_TILES: usize>(acc: &mut [[f32; 4]; O_TILES], alpha: Option<[f32; 2]>) {
    if let Some(alpha) = alpha {
        scale_row(acc, 0, alpha[0]);
        scale_row(acc, 1, alpha[1]);
    }
}

/// One consumer warpgroup's view of the block.
struct Consumer<'a> {
    sram: &'a Fa3Sram,
    /// The tile's Q_i (in its Q stage).
    q: SwizzledTile,
    /// This warpgroup's first row within Q_i.
    group_row: u32,
    /// The sequence row of this warpgroup's first row: the rows whose mask decides its blocks'.
    group_first_row: u32,
    /// The sequence row of this warp's first row.
    warp_row: u32,
    blocks: &'a KeyBlocks,
    /// The sequence's queries (`row_votes`).
    seqlen_q: u32,
    /// The lane's two rows' thresholds for the warp's rescale decision in the packed forms
    /// (`softmax::rescale_threshold` of `row_votes`), computed once before the loop.
    rescale_thresholds: [f32; 2],
    seqlen_k: u32,
    softcap: Softcap,
    alibi: Alibi,
    dropout: Dropout,
    score_scale: f32,
    turns: GemmTurns,
    /// The ring blocks of earlier tiles: block j of this tile is ring block `ring_base + j`.
    ring_base: u32,
}

impl Consumer<'_> {
    /// O = diag(ℓ)⁻¹·Õ through this warp's 16 rows of the O tile, stored by one TMA copy per
    /// panel from its first lane (cuDNN's epilogue: no barrier between warps, and the copy runs
    /// while the next tile computes; its rows past seqlen_q and columns past d are clipped by the
    /// map), and L from registers. The warp's previous copy must have read the rows first.
    #[inline(always)]
    fn store_o_by_tma<T: TensorCoreElement, C: Fa3Config>(
        &self,
        p: &Fa3Params,
        info: &BlockInfo,
        stats: &[RowStats; 2],
        acc: &[[f32; 4]; C::O_TILES],
    ) {
        let leader = arch::lane_idx() == 0;
        if leader {
            arch::bulk_wait_group_read::<0>();
        }
        arch::sync_warp();
        let tile_row = self.warp_row - self.group_first_row + self.group_row;
        let logsumexp = HeadVector::new(p.logsumexp, info.batch_head, info.seqlen_q);
        let o_tile = self.sram.o;
        finish_rows::<T, _>(
            &logsumexp,
            self.warp_row,
            info.seqlen_q,
            stats,
            acc,
            |row, col, packed| {
                let address = o_tile.element(tile_row + row - self.warp_row, col);
                // SAFETY: row − warp_row < 16 and col + 1 < 64·panels: inside this warp's rows of the
                // O tile, 4-byte aligned (col even); the warp's previous TMA store has read them
                // (its leader's wait above, then the warp barrier).
                unsafe { arch::store_shared_u32(address, packed) };
            },
        );
        arch::fence_proxy_async_shared();
        arch::sync_warp();
        if leader {
            let o = HeadTensorMap::new(p.tensor_maps + 3 * TENSOR_MAP_BYTES, info.head, info.batch);
            o.store(&o_tile, C::PANELS, tile_row, self.warp_row);
            arch::bulk_commit_group();
        }
    }

    /// Waits until K_j (with `scores`) and V_{j_v} (with `values`, for the P̃·V issued beside it)
    /// have landed, then fences the registers the products read: every wait comes before the
    /// fence, so nothing but wgmmas runs between the fence and the last product it covers.
    #[inline(always)]
    fn wait_operands(&self, scores: Option<u32>, values: Option<u32>) {
        if let Some(j) = scores {
            let (stage, phase) = ring(self.ring_base + j);
            self.sram.k_full(stage).wait(phase);
        }
        if let Some(j) = values {
            let (stage, phase) = ring(self.ring_base + j);
            self.sram.v_full(stage).wait(phase);
        }
        arch::wgmma_fence();
    }

    /// A block of the tile that none of this warpgroup's rows sees: its turn and the ring's
    /// barriers as for the others, no products. K_j and V_j must have landed before they are
    /// released, so that this warpgroup's arrivals count toward block j's phase and not an
    /// earlier one's.
    #[inline(always)]
    fn skip_block(&self, j: u32) {
        let (stage, phase) = ring(self.ring_base + j);
        self.turns.take();
        self.sram.k_full(stage).wait(phase);
        self.sram.v_full(stage).wait(phase);
        self.turns.pass();
        release(self.sram.k_empty(stage));
        release(self.sram.v_empty(stage));
    }

    /// Issues S = Q_i·K_jᵀ for this warpgroup's 64 rows (K_j landed): d/16 SS wgmmas in one
    /// group.
    #[inline(always)]
    fn issue_scores<T: TensorCoreElement, C: Fa3Config>(
        &self,
        j: u32,
        scores: &mut [[f32; 4]; C::S_TILES],
    ) {
        let k = self.sram.k(ring(self.ring_base + j).0);
        for step in 0..C::Q_STEPS {
            let a = self.q.k_major_step(self.group_row, step);
            let b = k.k_major_step(0, step);
            arch::wgmma_ss(scores, a, b, step > 0, T::BF16);
        }
        arch::wgmma_commit();
    }

    /// Waits for S_j (with `PENDING` = 1, the older of two groups in flight) and releases K_j's
    /// stage.
    #[inline(always)]
    fn land_scores<const PENDING: u32, const TILES: usize>(
        &self,
        j: u32,
        scores: &mut [[f32; 4]; TILES],
    ) {
        arch::wgmma_wait::<PENDING>();
        arch::wgmma_fence_accumulator(scores);
        release(self.sram.k_empty(ring(self.ring_base + j).0));
    }

    /// Issues Õ += P̃_j·V_j (V_j landed): B_c/16 RS wgmmas (P̃ from registers), one group.
    #[inline(always)]
    fn issue_pv<T: TensorCoreElement, C: Fa3Config>(
        &self,
        j: u32,
        p: &[[u32; 4]; C::P_CHUNKS],
        acc: &mut [[f32; 4]; C::O_TILES],
    ) {
        let v = self.sram.v(ring(self.ring_base + j).0);
        for (chunk, fragment) in p.iter().enumerate() {
            arch::wgmma_rs(acc, *fragment, v.mn_major_rows(chunk as u32), true, T::BF16);
        }
        arch::wgmma_commit();
    }

    /// Waits for every product in flight (P̃_j·V_j the last) and releases V_j's stage; P̃_j's
    /// registers are free from here.
    #[inline(always)]
    fn land_pv<const TILES: usize, const CHUNKS: usize>(
        &self,
        j: u32,
        acc: &mut [[f32; 4]; TILES],
        p: &mut [[u32; 4]; CHUNKS],
    ) {
        arch::wgmma_wait::<0>();
        arch::wgmma_fence_accumulator(acc);
        arch::wgmma_fence_fragments(p);
        release(self.sram.v_empty(ring(self.ring_base + j).0));
    }

    /// Which of the warp's scores of the tile's block j dropout keeps (`forward_keep_bits`),
    /// `None` without dropout.
    #[inline(always)]
    fn keep_bits<C: Fa3Config>(&self, j: u32) -> Option<u128> {
        forward_keep_bits::<{ C::S_TILES }>(&self.dropout, self.warp_row, self.blocks.key_start(j))
    }

    /// The softmax of the tile's block j (the j-th its window reaches): the mask where the block needs it, m and ℓ updated as in FA2 (the
    /// max moved only when it jumps, at d ≤ 128). Returns P̃_j in f32, and α for Õ's two rows of
    /// the lane when the max moved.
    #[inline(always)]
    fn softmax<C: Fa3Config>(
        &self,
        j: u32,
        scores: &[[f32; 4]; C::S_TILES],
        stats: &mut [RowStats; 2],
        kept: Option<u128>,
    ) -> ([[f32; 4]; C::S_TILES], Option<[f32; 2]>) {
        let block = ScoreBlock {
            key_start: self.blocks.key_start(j),
            seqlen_k: self.seqlen_k,
            mask: self.blocks.mask(),
            softcap: self.softcap,
            alibi: self.alibi,
            score_scale: self.score_scale,
            exp2_split: C::EXP2_SPLIT,
        };
        // Masked where the diagonal (or the tail) crosses this warpgroup's rows, which is less
        // often than it crosses the tile's.
        if self
            .blocks
            .needs_mask_for_rows(block.key_start, self.group_first_row, WARPGROUP_ROWS)
        {
            self.block_softmax::<C, true>(&block, scores, stats, kept)
        } else {
            self.block_softmax::<C, false>(&block, scores, stats, kept)
        }
    }

    /// [`Consumer::softmax`] for one `MASK`: apply the mask (causal or a window) and the
    /// seqlen_k tail element-wise, or not; soft-capping and ALiBi first when they are on, and
    /// dropout last (after ℓ took the probabilities). S's registers are only read: the next block's S = Q_i·K_jᵀ
    /// accumulates into them while this block's P̃·V runs, and ptxas serializes the products when
    /// other instructions write a wgmma's accumulators inside its pipeline stage.
    #[inline(always)]
    fn block_softmax<C: Fa3Config, const MASK: bool>(
        &self,
        block: &ScoreBlock,
        scores: &[[f32; 4]; C::S_TILES],
        stats: &mut [RowStats; 2],
        kept: Option<u128>,
    ) -> ([[f32; 4]; C::S_TILES], Option<[f32; 2]>) {
        let mut probabilities = *scores;
        block.apply_softcap(&mut probabilities);
        block.apply_alibi(&mut probabilities, self.warp_row);
        if MASK {
            block.apply_mask_by_row_ends(&mut probabilities, self.warp_row);
        }
        let scores = &mut probabilities;
        let block_max = [block.row_max(scores, 0), block.row_max(scores, 1)];
        // One decision per warp: the branches are warp-uniform.
        let rescale =
            !conditional_rescale(C::HEAD_DIM) || arch::vote_any(self.jumps::<C>(stats, block_max));
        let mut alpha = [1.0f32; 2];
        block.softmax_rows(
            scores,
            block_max,
            rescale,
            stats,
            |h, a| alpha[h] = a,
            |_, _| {},
        );
        if let Some(bits) = kept {
            drop_probabilities(&mut probabilities, bits);
        }
        (probabilities, rescale.then_some(alpha))
    }
}

impl Consumer<'_> {
    /// Whether one of the lane's voting rows (`row_votes`) must move its max for a block whose
    /// row maxima are `block_max`. The packed forms test against thresholds computed before the
    /// loop (call 33: testing the rows each block cost 6 instructions a block); the dense local
    /// form keeps the test per block, as the two more registers live across its loop make its
    /// d = 64 kernel spill (37 local loads and stores).
    #[inline(always)]
    fn jumps<C: Fa3Config>(&self, stats: &[RowStats; 2], block_max: [f32; 2]) -> bool {
        if C::PACKED {
            let [threshold_0, threshold_1] = self.rescale_thresholds;
            needs_rescale_past(stats[0].max, block_max[0], threshold_0)
                || needs_rescale_past(stats[1].max, block_max[1], threshold_1)
        } else {
            let votes = |h| row_votes::<C>(self.warp_row, h, self.seqlen_q);
            (needs_rescale(stats[0].max, block_max[0]) && votes(0))
                || (needs_rescale(stats[1].max, block_max[1]) && votes(1))
        }
    }
}

/// Whether the lane's row `h` (of the two its accumulators hold, in the warp whose first row is
/// `warp_row`) takes part in its warp's rescale decision. A packed batch's rows past the
/// sequence hold the next sequence's queries: they do not vote, so a sequence's result does not
/// depend on its neighbour's. A dense batch's are zero, and never jump past the first block
/// under the causal mask or none; a window can hide a block from them and show them a later
/// one, so in the local forms they do not vote either (and packed and dense calls agree bit for
/// bit there too).
#[inline(always)]
fn row_votes<C: Fa3Config>(warp_row: u32, h: u32, seqlen_q: u32) -> bool {
    !(C::PACKED || C::LOCAL)
        || warp_row + accumulator_row(arch::lane_idx()) + h * LDMATRIX_SIDE < seqlen_q
}

/// P̃ packed as the A fragments of P̃·V.
#[inline(always)]
fn pack<T: TensorCoreElement, C: Fa3Config>(
    probabilities: &[[f32; 4]; C::S_TILES],
) -> [[u32; 4]; C::P_CHUNKS] {
    let mut fragments = [[0u32; 4]; C::P_CHUNKS];
    for h in 0..2 {
        pack_row::<T, _, _>(probabilities, h, &mut fragments);
    }
    fragments
}
