//! FlashAttention-3's backward main kernel: FlashAttention-2's backward (Dao 2023, Algorithm 2:
//! outer loop over key blocks j, inner loop over row blocks i) on Hopper's asynchronous
//! machinery, as FlashAttention-3's `flash_bwd_kernel_sm90.h` lays it out, between the FA2
//! backward's pre-pass (D = rowsum(dO ∘ O), the dQ accumulator zeroed) and post-pass (dQ =
//! scale·accumulator). Generic over one config `C: Fa3BackwardConfig`.
//!
//! ```text
//!  warpgroup 0 (24 registers)                    warpgroups 1..=2, consumers (64 keys of K_j each)
//!  producer, one thread issues TMA:               wait K_j, V_j; then for each row block i:
//!   K_j, V_j once            ──kv_full──▶          wait Q_i, dO_i; L_i, D_i into shared memory
//!   for i: wait rows_empty[s];                     Sᵀ  = K_j·Q_iᵀ    (wgmma SS, 64 keys × 64 queries)
//!          Q_i, dO_i ──rows_full[s]──▶             dPᵀ = V_j·dO_iᵀ   (wgmma SS)
//!   s = (i − first) % 2 (the ring)                 Pᵀ = exp2(Sᵀ·scale·log2 e − L·log2 e),
//!                                                  dSᵀ = Pᵀ ∘ (dPᵀ − D)   (lines 13–17;
//!                                                    `local`: × the soft-cap's slope)
//!                                                  dSᵀ → shared memory (16-bit, swizzled)
//!                                                  dV_j += Pᵀ·dO_i   (wgmma RS, Pᵀ from registers)
//!                                                  dK_j += dSᵀ·Q_i   (wgmma RS)
//!                                                  at every other step (dQ_i's owner, by parity):
//!                                                  dQ_i = dS·K_j     (wgmma SS, both MN-major: all
//!                                                    B_c keys, both warpgroups' dSᵀ, one 64-column
//!                                                    part at a time) → its staging tile (f32)
//!  dQ writer, warp 1 (`DQ_WRITER` kernels; the    ◀──dq full[c]──
//!  others: the owner's first thread):
//!   TMA reduce-add of the tile into the f32
//!   accumulator (one per 32 columns)  ──dq empty[c]──▶ (before the owner's next store)
//!                                                  release Q_i, dO_i (rows_empty[s])
//!                                                 dK_j = scale·dK_j, dV_j stored
//! ```
//!
//! dQ_i = dS·K_j is summed over all B_c keys of the block before it is added to the accumulator,
//! as FlashAttention-3 does, so each element takes one reduction per key block: consumer i % 2
//! computes it at step i (its "owner"), from both warpgroups' dSᵀ, while the other goes on to the
//! next step (whose dQ it owns), and the owners alternate. ncu on the first version, where each
//! warpgroup added its own 64 keys' share every step, put the L2 at 72% of its throughput with
//! the warps stalled on those reductions (docs/perf); since v4 the owner stores dQ_i into its own
//! f32 staging tile and one thread adds the tile by bulk tensor reductions
//! (`cp.reduce.async.bulk.tensor`, FlashAttention-3's `store_dq`): in deterministic mode and at
//! d ≤ 64 the producer warpgroup's second warp (`dq_writer`, FlashAttention-3's), so no consumer
//! issues or waits for a global reduction, elsewhere the owner's first thread (1–4% faster at
//! d = 128, where it waits for the reads only at its next owned step). The owner writes its tile
//! again two steps later, after the reductions have read it. dSᵀ is double-buffered by step parity; two
//! pairs of named barriers order it between the warpgroups (`DsHandOff`); L_i, D_i are per
//! warpgroup, ordered by a named barrier among its 128 threads. Shared memory: K_j, V_j, the
//! Q_i/dO_i ring in two stages, every tile in 64-column panels with the 128-byte swizzle
//! (`tile::swizzled`), then dSᵀ twice (B_c rows × 64 queries, swizzled), a dQ_i staging tile
//! per consumer (B_r × 64·panels f32, 32-column boxes, swizzled), L_i and D_i per consumer, the
//! mbarriers.

use super::config::{DQ_PART_TILES, DS_BUFFERS, Fa3BackwardConfig, ROW_STAGES};
use super::dq_writer::{DqAccumulator, DqHandOff, write_dq};
use super::key_block::KeyBlock;
use super::sram::Fa3BackwardSram;
use crate::arch::{self, L2Priority};
use crate::common::alibi::Alibi;
use crate::common::block::BlockInfo;
use crate::common::dropout::Dropout;
use crate::common::element::TensorCoreElement;
use crate::common::params::Fa3BackwardParams;
use crate::common::softcap::Softcap;
use crate::common::softmax::LOG2_E;
use crate::fwd::fa3::config::{KV_STAGES, PANEL_COLS, WARPGROUP_ROWS, WARPGROUP_THREADS, WGMMA_K};
use crate::fwd::fa3::roles::{TENSOR_MAP_BYTES, release, ring, split_roles};
use crate::tile::accumulator::{for_each_fragment_pair, store_key_rows};
use crate::tile::fragment::{LDMATRIX_SIDE, MMA_M, MMA_N, accumulator_col, accumulator_row};
use crate::tile::global::{HeadRows16, HeadVector};
use crate::tile::layout::swizzled_pair_side;
use crate::tile::sequences::Sequences;
use crate::tile::swizzled::{HeadTensorMap, SwizzledF32Tile, SwizzledTile};
use crate::tile::transposed_scores::TransposedScores;

// The forward's two-stage ring arithmetic (`ring`) serves the Q_i/dO_i ring.
const _: () = assert!(ROW_STAGES == KV_STAGES);

/// The main kernel for head dims up to `C::HEAD_DIM` (multiples of 8; columns past d arrive as
/// zeros). Grid (⌈seqlen_k / B_c⌉, batch·heads), `C::TILING.threads()` threads,
/// `C::TILING.shared_bytes(d)` bytes of dynamic shared memory. Needs the pre-pass's D and zeroed
/// accumulator. `packed`: a packed form's sequences (`C::PACKED`; the grid's seqlen_k and batch
/// are the longest sequence's and the launch's sequences; the tensor maps, L, D and the
/// accumulator span the whole packed tensors), else `PackedTable::NONE` (`tile::sequences`).
#[inline(always)]
pub fn backward<T: TensorCoreElement, C: Fa3BackwardConfig>(
    p: &Fa3BackwardParams,
    packed: impl Sequences,
) {
    let () = C::CHECKED;
    let sram = Fa3BackwardSram::new::<C>();
    split_roles!(
        C,
        sram.init_barriers::<C>(),
        produce::<C>(p, packed, &sram),
        if C::DQ_WRITER {
            write_dq::<C>(p, packed, &sram)
        },
        |consumer| consume::<T, C>(p, packed, &sram, consumer)
    );
}

/// The producer's one thread: K_j and V_j once, then Q_i and dO_i into the ring as stages free
/// up.
#[inline(always)]
fn produce<C: Fa3BackwardConfig>(
    p: &Fa3BackwardParams,
    packed: impl Sequences,
    sram: &Fa3BackwardSram,
) {
    let block = KeyBlock::new::<C>(p, packed);
    if !block.has_rows::<C>() {
        return;
    }
    let info = block.info;
    let maps = p.tensor_maps;
    let q = HeadTensorMap::new(maps, info.head, info.batch);
    let k = HeadTensorMap::new(maps + TENSOR_MAP_BYTES, info.kv_head, info.batch);
    let v = HeadTensorMap::new(maps + 2 * TENSOR_MAP_BYTES, info.kv_head, info.batch);
    let d_o = HeadTensorMap::new(maps + 3 * TENSOR_MAP_BYTES, info.head, info.batch);
    sram.kv_full().arrive_expect_bytes(2 * C::KV_BYTES);
    // K_j and V_j are this block's alone; Q_i and dO_i are read again by the head's other key
    // blocks (FlashAttention-3's hints). Rows from the sequence's first (0 but in a packed
    // batch, whose maps span every sequence).
    let kv_full = sram.kv_full();
    let key_row = info.k_start + block.key_start;
    k.load(&sram.k, C::PANELS, key_row, kv_full, L2Priority::Normal);
    v.load(&sram.v, C::PANELS, key_row, kv_full, L2Priority::Normal);
    let first = block.row_blocks.first();
    for i in first..block.row_blocks.end() {
        let (stage, phase) = ring(i - first);
        // The stage's previous row block (i − 2) must be released first; a fresh barrier's
        // previous phase counts as complete.
        sram.rows_empty(stage).wait(phase ^ 1);
        let full = sram.rows_full(stage);
        full.arrive_expect_bytes(2 * C::ROW_BYTES);
        let row_start = info.q_start + i * C::BLOCK_ROWS;
        q.load(
            &sram.q(stage),
            C::PANELS,
            row_start,
            full,
            L2Priority::EvictLast,
        );
        d_o.load(
            &sram.d_o(stage),
            C::PANELS,
            row_start,
            full,
            L2Priority::EvictLast,
        );
    }
}

/// One consumer warpgroup: its 64 keys of K_j against every row block that sees them, then its
/// rows of dK_j and dV_j.
#[inline(always)]
fn consume<T: TensorCoreElement, C: Fa3BackwardConfig>(
    p: &Fa3BackwardParams,
    packed: impl Sequences,
    sram: &Fa3BackwardSram,
    consumer: u32,
) {
    let block = KeyBlock::new::<C>(p, packed);
    let info = block.info;
    let shape = &p.base.shape;
    // Warp-uniform as ptxas sees it, so the K_j and V_j descriptors stay in uniform registers.
    let consumer = arch::warp_uniform(consumer);
    let group_key = consumer * WARPGROUP_ROWS;
    let warpgroup = Consumer {
        sram,
        consumer,
        group_key,
        warp_key: group_key + arch::warp_idx() % 4 * MMA_M,
        key_start: block.key_start,
        info,
        alibi: Alibi::of_block(shape, &info, C::LOCAL),
        dropout: Dropout::of_block(shape, info.batch_head, C::LOCAL),
        score_scale: shape.softmax_scale * LOG2_E,
        logsumexp: block.statistics::<C>(p.base.logsumexp),
        delta: block.statistics::<C>(p.base.delta),
        params: p,
    };
    let mut dk = [[0.0f32; 4]; C::D_TILES];
    let mut dv = [[0.0f32; 4]; C::D_TILES];
    let rows = block.row_blocks;
    if block.has_rows::<C>() {
        sram.kv_full().wait(0);
        let (first, end) = (rows.first(), rows.end());
        for i in first..end {
            let step = Step {
                i,
                n: i - first,
                count: end - first,
            };
            // Dropout's steps are compiled apart, so the `local` calls without it carry none of
            // its registers (with them in every step, ptxas's spills at d = 128 grew from
            // 364/528 to 572/908 B and the window backward lost ~12%: docs/perf/dropout.md).
            let masked = rows.needs_mask(i * C::BLOCK_ROWS);
            match (C::LOCAL && warpgroup.dropout.is_on(), masked) {
                (true, true) => warpgroup.step::<T, C, true, true>(step, &mut dk, &mut dv),
                (true, false) => warpgroup.step::<T, C, false, true>(step, &mut dk, &mut dv),
                (false, true) => warpgroup.step::<T, C, true, false>(step, &mut dk, &mut dv),
                (false, false) => warpgroup.step::<T, C, false, false>(step, &mut dk, &mut dv),
            }
        }
        // Without the writer: the last dQ_i reductions have read the staging tile (the block's
        // shared memory ends with it) and written the accumulator.
        if !C::DQ_WRITER && warpgroup.leads() {
            arch::bulk_wait_group::<0>();
        }
    }
    // dK_j = scale·dK_j and dV_j, each stored once (grouped heads: the query head's own rows of
    // the expanded workspace, summed afterwards by `bwd::group_sum`).
    let gradient_head = info.kv_gradient_head(C::GROUPED);
    let key_rows = |view| {
        HeadRows16::new(view, info.batch, gradient_head, info.seqlen_k).starting_at(info.k_start)
    };
    let (dk_rows, dv_rows) = (key_rows(&p.base.dk), key_rows(&p.base.dv));
    let first_key = block.key_start + warpgroup.warp_key;
    let (seqlen_k, d) = (info.seqlen_k, shape.head_dim);
    store_key_rows::<T, _>(
        &dk_rows,
        &dk,
        first_key,
        seqlen_k,
        0,
        d,
        shape.softmax_scale,
    );
    store_key_rows::<T, _>(&dv_rows, &dv, first_key, seqlen_k, 0, d, 1.0);
}

/// One step of a consumer's row loop: row block `i`, the `n`-th of the `count` that see the key
/// block (its ring stage and phase, and its dSᵀ buffer and dQ_i's owner by parity).
#[derive(Clone, Copy)]
struct Step {
    i: u32,
    n: u32,
    count: u32,
}

/// How dSᵀ passes between the two consumers. At step n, consumer n % 2 owns dQ_i: it waits at
/// `ready` until the other has stored its keys' rows of dSᵀ into buffer n % 2, computes dQ_i from
/// both, and once its products have read the buffer arrives at `free` if a step n + 2 will
/// write it again; there the other waits at `free` before storing. Each barrier counts both
/// warpgroups, and every arrival has its wait.
#[derive(Clone, Copy)]
struct DsHandOff {
    buffer: u32,
}

impl DsHandOff {
    /// Named barriers 1 and 2 are the consumers' own (`Consumer::sync_warpgroup`).
    const READY: u32 = 3;
    const FREE: u32 = Self::READY + DS_BUFFERS;
    const THREADS: u32 = 2 * WARPGROUP_THREADS;

    #[inline(always)]
    fn of(step: Step) -> Self {
        Self {
            buffer: step.n % DS_BUFFERS,
        }
    }

    /// Whether `consumer` computes this step's dQ_i.
    #[inline(always)]
    fn owned_by(self, consumer: u32) -> bool {
        self.buffer == consumer
    }

    /// The other consumer, before storing its dSᵀ rows: the owner two steps ago is done with the
    /// buffer (no wait at the first two steps, which are its first uses).
    #[inline(always)]
    fn wait_free(self, step: Step) {
        if step.n >= DS_BUFFERS {
            arch::named_barrier_sync(Self::FREE + self.buffer, Self::THREADS);
        }
    }

    /// The other consumer, after storing (and fencing) its dSᵀ rows.
    #[inline(always)]
    fn mark_ready(self) {
        arch::named_barrier_arrive(Self::READY + self.buffer, Self::THREADS);
    }

    /// The owner, before dQ_i: both warpgroups' rows of dSᵀ are in the buffer.
    #[inline(always)]
    fn wait_ready(self) {
        arch::named_barrier_sync(Self::READY + self.buffer, Self::THREADS);
    }

    /// The owner, once dQ_i's products have landed: the buffer may be written again.
    #[inline(always)]
    fn mark_free(self, step: Step) {
        if step.n + DS_BUFFERS < step.count {
            arch::named_barrier_arrive(Self::FREE + self.buffer, Self::THREADS);
        }
    }
}

/// One consumer warpgroup's view of the block.
struct Consumer<'a> {
    sram: &'a Fa3BackwardSram,
    consumer: u32,
    /// This warpgroup's first key within K_j.
    group_key: u32,
    /// This warp's first key within K_j.
    warp_key: u32,
    key_start: u32,
    info: BlockInfo,
    /// ALiBi's bias of the block's head (read once: `Alibi::of_block` loads its slope).
    alibi: Alibi,
    /// Dropout's generator and threshold for the block's head.
    dropout: Dropout,
    score_scale: f32,
    logsumexp: HeadVector,
    delta: HeadVector,
    /// The launch's parameters, read where used (the dQ accumulator's map, without the writer),
    /// so that no register holds them across the row loop.
    params: &'a Fa3BackwardParams,
}

impl Consumer<'_> {
    /// Named barrier 0 is `sync_threads`'s; consumer c orders its warps at 1 + c.
    const FIRST_BARRIER: u32 = 1;

    /// Whether this thread issues the warpgroup's dQ_i reductions (without the writer): its
    /// first.
    #[inline(always)]
    fn leads(&self) -> bool {
        arch::thread_idx_x().is_multiple_of(WARPGROUP_THREADS)
    }

    /// Waits until every warp of this warpgroup has arrived.
    #[inline(always)]
    fn sync_warpgroup(&self) {
        arch::named_barrier_sync(Self::FIRST_BARRIER + self.consumer, WARPGROUP_THREADS);
    }

    /// One step: row block `step.i` against this warpgroup's keys, and dQ_i at the steps it
    /// owns (see the module's docs). `MASK`: the tile crosses the causal diagonal or runs past
    /// seqlen_q or seqlen_k, so P is 0 at every pair the mask hides. `DROPOUT`: the call drops
    /// (`self.dropout`), else the step compiles no dropout at all.
    #[inline(always)]
    fn step<T: TensorCoreElement, C: Fa3BackwardConfig, const MASK: bool, const DROPOUT: bool>(
        &self,
        step: Step,
        dk: &mut [[f32; 4]; C::D_TILES],
        dv: &mut [[f32; 4]; C::D_TILES],
    ) {
        let n = step.n;
        let (stage, phase) = ring(n);
        let row_start = step.i * C::BLOCK_ROWS;
        let zero = opaque_zero(n);
        let rebased = self.sram.shifted(zero);
        let sram = &rebased;
        // L_i and D_i, one value per thread, read while the products run. Every warp finished
        // the previous step's reads of them before its dSᵀ barrier, which this thread passed.
        let statistic = self.read_statistic::<C>(row_start);
        let hand_off = DsHandOff::of(step);
        let owner = hand_off.owned_by(self.consumer);
        if !C::DQ_WRITER && owner && self.leads() {
            // The reductions of dQ two steps ago have read the staging tile: after the barrier
            // below every thread may write it again.
            arch::bulk_wait_group_read::<0>();
        }
        sram.rows_full(stage).wait(phase);
        arch::wgmma_fence();
        let mut scores = [[0.0f32; 4]; C::ROW_TILES];
        let mut d_probs = [[0.0f32; 4]; C::ROW_TILES];
        self.issue_transposed::<T, C>(sram.k, sram.q(stage), &mut scores);
        self.issue_transposed::<T, C>(sram.v, sram.d_o(stage), &mut d_probs);
        let lane = arch::lane_idx();
        let block = TransposedScores {
            lane_key: self.key_start + self.warp_key + accumulator_row(lane),
            row_start,
            seqlen_q: self.info.seqlen_q,
            seqlen_k: self.info.seqlen_k,
            mask: self.info.mask(),
            score_scale: self.score_scale,
            softcap: Softcap::of_form(&self.params.base.shape, C::LOCAL),
            alibi: self.alibi,
            dropout: if DROPOUT { self.dropout } else { Dropout::OFF },
            mask_by_key_ends: true,
        };
        // Dropout's keep bits while both products run (their Philox calls on the ALU under the
        // tensor cores' work, before Pᵀ's registers are live).
        let kept = block.dropout_keep::<{ C::ROW_TILES }>();
        self.write_statistic::<C>(sram, statistic);
        self.sync_warpgroup();
        // Sᵀ has landed (dPᵀ, the younger group, may still run): Pᵀ's exponentials under dPᵀ's
        // products, FlashAttention-3's order.
        arch::wgmma_wait::<1>();
        arch::wgmma_fence_accumulator(&mut scores);

        let (logsumexp, delta) = (
            sram.statistics(self.consumer, 0),
            sram.statistics(self.consumer, 1),
        );
        let probabilities = block.probabilities::<_, MASK>(&scores, |r| logsumexp.get(r), kept);
        arch::wgmma_wait::<0>();
        arch::wgmma_fence_accumulator(&mut d_probs);
        let (mut p, mut ds) = TransposedScores::score_gradients::<T, _, { C::ROW_CHUNKS }>(
            &probabilities,
            &d_probs,
            |r| delta.get(r),
        );
        if !owner {
            hand_off.wait_free(step);
        }
        let ds_tile = sram.ds(hand_off.buffer);
        self.store_ds(ds_tile, &ds);

        // dV_j += Pᵀ·dO_i and dK_j += dSᵀ·Q_i (lines 16 and 21), one group.
        arch::wgmma_fence();
        let (q, d_o) = (sram.q(stage), sram.d_o(stage));
        for (chunk, fragment) in p.iter().enumerate() {
            arch::wgmma_rs(
                dv,
                *fragment,
                d_o.mn_major_rows(chunk as u32),
                true,
                T::BF16,
            );
        }
        for (chunk, fragment) in ds.iter().enumerate() {
            arch::wgmma_rs(dk, *fragment, q.mn_major_rows(chunk as u32), true, T::BF16);
        }
        arch::wgmma_commit();

        // dV_j and dK_j have landed: Q_i and dO_i are free, and so are Pᵀ's and dSᵀ's fragments
        // (kept live until here: the products read them).
        let mut land_gradients =
            |p: &mut [[u32; 4]; C::ROW_CHUNKS], ds: &mut [[u32; 4]; C::ROW_CHUNKS]| {
                arch::wgmma_fence_accumulator(dk);
                arch::wgmma_fence_accumulator(dv);
                arch::wgmma_fence_fragments(p);
                arch::wgmma_fence_fragments(ds);
                release(sram.rows_empty(stage));
            };
        if !owner {
            // dSᵀ visible to the async proxy (`store_ds`'s fence) before the owner's products.
            hand_off.mark_ready();
            // Every warp has read L_i and D_i before the next step's `write_statistic`.
            self.sync_warpgroup();
            arch::wgmma_wait::<0>();
            land_gradients(&mut p, &mut ds);
            return;
        }
        // Both warpgroups' dSᵀ, visible to the async proxy, before dQ reads it.
        hand_off.wait_ready();
        let staging = sram.dq_staging(self.consumer);
        let dq_hand_off = DqHandOff::of(step.n, step.count);
        for part in 0..C::PANELS {
            let mut dq = [[0.0f32; 4]; DQ_PART_TILES];
            arch::wgmma_fence();
            self.issue_dq::<T, C>(ds_tile, sram.k, part, &mut dq);
            if part == 0 {
                arch::wgmma_wait::<1>();
                land_gradients(&mut p, &mut ds);
            }
            arch::wgmma_wait::<0>();
            arch::wgmma_fence_accumulator(&mut dq);
            if part + 1 == C::PANELS {
                hand_off.mark_free(step);
            }
            if C::DQ_WRITER && part == 0 {
                // The writer's reductions of step n − 2 have read the staging tile.
                dq_hand_off.wait_empty();
            }
            self.stage_dq(staging, part + zero, &dq);
        }
        // Every thread's stores visible to the async proxy, then the writer warp (or this
        // warpgroup's first thread, once every warp has stored) adds the tile.
        arch::fence_proxy_async_shared();
        if C::DQ_WRITER {
            dq_hand_off.mark_full();
        } else {
            self.sync_warpgroup();
            if self.leads() {
                DqAccumulator::new(self.params, &self.info).add(&staging, step.i);
            }
        }
    }

    /// Issues `acc` = `keys`·`rows`ᵀ for this warpgroup's 64 keys (rows of K_j or V_j) against
    /// the B_r rows of Q_i or dO_i: d/16 SS wgmmas, one group (Sᵀ and dPᵀ, line 11's products
    /// turned around, FlashAttention-3's SdP swap).
    #[inline(always)]
    fn issue_transposed<T: TensorCoreElement, C: Fa3BackwardConfig>(
        &self,
        keys: SwizzledTile,
        rows: SwizzledTile,
        acc: &mut [[f32; 4]; C::ROW_TILES],
    ) {
        for step in 0..C::D_STEPS {
            let a = keys.k_major_step(self.group_key, step);
            let b = rows.k_major_step(0, step);
            arch::wgmma_ss(acc, a, b, step > 0, T::BF16);
        }
        arch::wgmma_commit();
    }

    /// Issues dQ_i's columns 64·part..64·part + 64 (line 20): dS (B_r queries × every key of the
    /// block, read from dSᵀ) times K_j's panel `part`, one group of B_c/16 SS wgmmas with both
    /// operands MN-major.
    #[inline(always)]
    fn issue_dq<T: TensorCoreElement, C: Fa3BackwardConfig>(
        &self,
        ds: SwizzledTile,
        k: SwizzledTile,
        part: u32,
        acc: &mut [[f32; 4]; DQ_PART_TILES],
    ) {
        for step in 0..C::KEY_STEPS {
            let key = step * WGMMA_K;
            arch::wgmma_ss_mn_major(
                acc,
                ds.mn_major_from(0, key),
                k.mn_major_from(part, key),
                step > 0,
                T::BF16,
            );
        }
        arch::wgmma_commit();
    }

    /// This thread's value of L_i (threads 0..B_r of the warpgroup) or D_i (the others), 0 past
    /// seqlen_q (masked there).
    #[inline(always)]
    fn read_statistic<C: Fa3BackwardConfig>(&self, row_start: u32) -> f32 {
        let thread = arch::thread_idx_x() % WARPGROUP_THREADS;
        let row = row_start + thread % C::BLOCK_ROWS;
        let vector = if thread < C::BLOCK_ROWS {
            &self.logsumexp
        } else {
            &self.delta
        };
        if row < self.info.seqlen_q {
            vector.read(row)
        } else {
            0.0
        }
    }

    #[inline(always)]
    fn write_statistic<C: Fa3BackwardConfig>(&self, sram: &Fa3BackwardSram, value: f32) {
        // 2·B_r = 128 threads: one element each; the warps read them after the warpgroup
        // barrier that follows.
        let thread = arch::thread_idx_x() % WARPGROUP_THREADS;
        let vector = sram.statistics(self.consumer, thread / C::BLOCK_ROWS);
        vector.set(thread % C::BLOCK_ROWS, value);
    }

    /// dSᵀ (packed as A fragments) into the swizzled dSᵀ tile, one row per key, then a fence so
    /// that wgmma (the async proxy) sees these stores.
    #[inline(always)]
    fn store_ds<const CHUNKS: usize>(&self, tile: SwizzledTile, ds: &[[u32; 4]; CHUNKS]) {
        for_each_fragment_pair(ds, |row, col, packed| {
            let address = tile.element(self.warp_key + row, col);
            // SAFETY: row < 16 and col + 1 < B_r = 64: inside the dSᵀ tile, 4-byte aligned (col
            // even); each warp writes its own 16 keys' rows, read after the warpgroup barrier.
            unsafe { arch::store_shared_u32(address, packed) };
        });
        arch::fence_proxy_async_shared();
    }

    /// Stores one 64-column part of the owned dQ_i (this warp's 16 of the tile's rows) into the
    /// staging tile, one f32 per store in [`swizzled_pair_side`]'s order, so that each store
    /// meets every bank once (a pair per 8-byte store took twice the passes: ncu counted 256
    /// excess wavefronts per step at d = 128). Rows past seqlen_q and columns past d are stored
    /// too; the reductions drop them. (The step passes `part` plus its opaque zero, so the lane's
    /// column offsets are derived here, not hoisted out of the row loop beside dK_j and dV_j.)
    #[inline(always)]
    fn stage_dq(&self, staging: SwizzledF32Tile, part: u32, acc: &[[f32; 4]; DQ_PART_TILES]) {
        let lane = arch::lane_idx();
        let row = arch::warp_idx() % 4 * MMA_M + accumulator_row(lane);
        let lane_col = part * PANEL_COLS + accumulator_col(lane);
        // The element each of the lane's two stores takes: the pair in order, or swapped.
        let first = swizzled_pair_side(lane, 0);
        for (t, tile) in acc.iter().enumerate() {
            let col = lane_col + t as u32 * MMA_N;
            for h in 0..2 {
                let row = row + h as u32 * LDMATRIX_SIDE;
                let (a, b) = (tile[2 * h], tile[2 * h + 1]);
                let (a, b) = if first == 0 { (a, b) } else { (b, a) };
                // col is even: col and col + 1 share a 16-byte chunk, 4 bytes apart.
                let pair = staging.element(row, col);
                // SAFETY: row < B_r and col + 1 < 64·panels: inside this consumer's staging tile,
                // 4-byte aligned; only this warpgroup writes it, after its leader's wait for the
                // previous reductions' reads and a warpgroup barrier.
                unsafe {
                    arch::store_shared_u32(pair.offset(4 * first), a.to_bits());
                    arch::store_shared_u32(pair.offset(4 - 4 * first), b.to_bits());
                }
            }
        }
    }
}

/// 0, computed from the step's index `n` by a shuffle the compiler cannot see through: addresses
/// offset by it are recomputed in each step rather than hoisted out of the row loop.
#[inline(always)]
fn opaque_zero(n: u32) -> u32 {
    arch::warp_uniform(n) - n
}
