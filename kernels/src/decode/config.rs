//! The decode family's geometry, built for the host too: the block's warps and key steps, the
//! shared memory of the warps' merge, how many splits a call's keys get ([`plan_splits`]), and
//! [`DecodeConfig`], one type per compiled split-KV kernel with the sizes of its register arrays.
//!
//! One block works on one (batch, KV head, split) and 16 query rows of that KV head's group
//! (the `heads_q / heads_kv` query heads × `q_tokens` tokens, head-major): every query head that
//! shares the KV head reads the same K/V loads, so K and V are read from HBM once per KV head.

use crate::common::limits::{MAX_REGISTERS_PER_THREAD, MAX_SHARED_BYTES_PER_BLOCK};
use crate::tile::fragment::{ACCUMULATORS_PER_TILE, MMA_K, MMA_M, MMA_N};

/// Warps of a split-KV block. Each takes every `WARPS`-th step of the split's keys (split-K
/// across warps, as FA1 splits K/V over warps, seed 000), and the warps' partial results are
/// merged through shared memory at the end.
pub const WARPS: u32 = 4;
/// Threads of a split-KV block.
pub const THREADS: u32 = WARPS * 32;
/// Keys one warp takes per step: the k of the P̃·V mma (m16n8k16).
pub const STEP_KEYS: u32 = MMA_K;
/// Query rows of one block (one mma row tile): the group's rows beyond 16 take further blocks.
pub const TILE_ROWS: u32 = MMA_M;
/// The most query tokens per sequence a decode call takes.
pub const MAX_QUERY_TOKENS: u32 = 16;
/// The most splits of one sequence's keys (the workspace grows with it).
pub const MAX_SPLITS: u32 = 128;
/// The fewest keys a split takes (when there are more splits than this would allow, fewer splits):
/// two steps per warp, so a block's prologue and merge are not most of its time.
pub const MIN_SPLIT_KEYS: u32 = 2 * WARPS * STEP_KEYS;
/// Split sizes are multiples of this (one step for every warp), so no step crosses two splits.
pub const SPLIT_KEYS_MULTIPLE: u32 = WARPS * STEP_KEYS;
/// Split-KV blocks the plan counts on per SM when it sizes the splits: `ptx-build` compiles the
/// kernels for at least this many (`.minnctapersm`), and their shared memory allows it.
pub const BLOCKS_PER_SM: u32 = 2;
/// A paged cache's page size must be a multiple of this, so that one step's keys lie in one page.
pub const PAGE_KEYS_MULTIPLE: u32 = STEP_KEYS;
/// Head dims the split-KV kernels are compiled for.
/// (d = 256 would hold 128 accumulators and 64 registers of loads per lane: past 255, it spills.)
pub const HEAD_DIMS: [u32; 2] = [64, 128];
/// Head-dim columns one lane's 16-byte V load covers per pass: 8 lanes-groups × 8 columns.
pub const VALUE_PASS_COLS: u32 = 64;
/// Head-dim columns one lane's 16-byte K load covers per pass: 4 lanes × 8 columns.
pub const KEY_PASS_COLS: u32 = 32;

/// Query rows of the combine kernel's block: one warp per row.
pub const COMBINE_ROWS: u32 = 4;
pub const COMBINE_THREADS: u32 = COMBINE_ROWS * 32;
/// Threads of the append kernel's block; each copies one 16-byte chunk of K and of V.
pub const APPEND_THREADS: u32 = 256;

/// Floats of the merge's shared memory: each warp's m and ℓ for the 16 rows, and its Õ
/// (16 rows × d at the odd stride d + 1, conflict-free column reads); then one word, the
/// one-launch kernel's "this block arrived last" for the whole block.
pub const fn shared_floats(head_dim: u32) -> u32 {
    WARPS * TILE_ROWS * (2 + (head_dim | 1)) + 1
}

/// Bytes of dynamic shared memory of a split-KV block.
pub const fn shared_bytes(head_dim: u32) -> u32 {
    shared_floats(head_dim) * 4
}

/// How a call's keys are split: `splits` ranges of `split_keys` keys each (the last one shorter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitPlan {
    pub splits: u32,
    pub split_keys: u32,
}

impl SplitPlan {
    /// `split_keys` keys per split over `max_seqlen`: the splits it takes (0 for no keys).
    pub const fn with_split_keys(split_keys: u32, max_seqlen: u32) -> Self {
        Self {
            splits: max_seqlen.div_ceil(split_keys),
            split_keys,
        }
    }

    /// The splits that hold keys of a sequence of `seqlen` keys; the combine merges those only.
    pub const fn splits_covering(&self, seqlen: u32) -> u32 {
        let covering = seqlen.div_ceil(self.split_keys);
        if covering < self.splits {
            covering
        } else {
            self.splits
        }
    }
}

/// The splits of a call whose longest sequence has `max_seqlen` keys, when `blocks_per_split`
/// blocks (batch × KV heads × row tiles) run each split, on `sms` SMs: as many splits as one
/// wave of [`BLOCKS_PER_SM`] blocks per SM holds (flash-decoding's rule: fill the machine once),
/// at least [`MIN_SPLIT_KEYS`] keys each and at most [`MAX_SPLITS`]; 1 when the blocks alone fill
/// most of a wave. Split sizes round up to [`SPLIT_KEYS_MULTIPLE`].
pub const fn plan_splits(sms: u32, blocks_per_split: u32, max_seqlen: u32) -> SplitPlan {
    let slots = sms * BLOCKS_PER_SM;
    let wanted = if blocks_per_split == 0 || 5 * blocks_per_split >= 4 * slots {
        1
    } else {
        slots / blocks_per_split
    };
    let by_length = max_seqlen.div_ceil(MIN_SPLIT_KEYS);
    let mut splits = if wanted < by_length {
        wanted
    } else {
        by_length
    };
    if splits > MAX_SPLITS {
        splits = MAX_SPLITS;
    }
    if splits == 0 {
        splits = 1;
    }
    let split_keys = max_seqlen
        .div_ceil(splits)
        .next_multiple_of(SPLIT_KEYS_MULTIPLE);
    let split_keys = if split_keys == 0 {
        SPLIT_KEYS_MULTIPLE
    } else {
        split_keys
    };
    let plan = SplitPlan::with_split_keys(split_keys, max_seqlen);
    if plan.splits == 0 {
        SplitPlan {
            splits: 1,
            split_keys,
        }
    } else {
        plan
    }
}

/// One compiled split-KV kernel: its head dim and cache layout, and the sizes of its per-lane
/// register arrays. Implemented by [`decode_config!`] for each kernel of the list.
pub trait DecodeConfig {
    const HEAD_DIM: u32;
    /// Whether K and V sit in pages named by a block table.
    type const PAGED: bool;
    /// d / 32: a lane's 16-byte loads of one key row (two k-steps of S = Q·Kᵀ each).
    type const KEY_PASSES: usize;
    /// d / 16: the k-steps of S = Q·Kᵀ (Q's A fragments).
    type const Q_STEPS: usize;
    /// d / 64: a lane's 16-byte loads of one value row.
    type const VALUE_PASSES: usize;
    /// d / 8: Õ's accumulator tiles.
    type const O_TILES: usize;
    /// d / 32: the combine's columns per lane.
    type const LANE_COLS: usize;

    const CHECKED: () = {
        assert!(Self::KEY_PASSES * KEY_PASS_COLS as usize == Self::HEAD_DIM as usize);
        assert!(Self::Q_STEPS * MMA_K as usize == Self::HEAD_DIM as usize);
        assert!(Self::VALUE_PASSES * VALUE_PASS_COLS as usize == Self::HEAD_DIM as usize);
        assert!(Self::O_TILES * MMA_N as usize == Self::HEAD_DIM as usize);
        assert!(Self::LANE_COLS * 32 == Self::HEAD_DIM as usize);
        assert!(shared_bytes(Self::HEAD_DIM) <= MAX_SHARED_BYTES_PER_BLOCK);
        // Õ (d/8 tiles of 4) and one step's K and V loads (2·d/32 + 4·d/64 registers of 4).
        let live = Self::O_TILES as u32 * ACCUMULATORS_PER_TILE + 2 * Self::HEAD_DIM / 8;
        assert!(live < MAX_REGISTERS_PER_THREAD);
    };
}

/// `decode_config!(Name, d, paged)`: a type implementing [`DecodeConfig`].
#[macro_export]
macro_rules! decode_config {
    ($name:ident, $d:literal, $paged:expr) => {
        struct $name;
        impl $crate::decode::config::DecodeConfig for $name {
            const HEAD_DIM: u32 = $d;
            type const PAGED: bool = $paged;
            type const KEY_PASSES: usize = const { $d / 32 };
            type const Q_STEPS: usize = const { $d / 16 };
            type const VALUE_PASSES: usize = const { $d / 64 };
            type const O_TILES: usize = const { $d / 8 };
            type const LANE_COLS: usize = const { $d / 32 };
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchor_shapes_fill_one_wave_of_132_sms() {
        // Batch 1, 8 KV heads, 4k keys: 32 splits of 128 keys (256 blocks of 264 slots).
        assert_eq!(
            plan_splits(132, 8, 4096),
            SplitPlan {
                splits: 32,
                split_keys: 128
            }
        );
        // Batch 1, 128k: 33 splits, 264 blocks.
        let plan = plan_splits(132, 8, 131_072);
        assert_eq!(plan.splits, 33);
        assert!(plan.split_keys * plan.splits >= 131_072);
        // Batch 16 (128 blocks): 2 splits; batch 64 (512 blocks) fills the machine alone.
        assert_eq!(plan_splits(132, 128, 32_768).splits, 2);
        assert_eq!(plan_splits(132, 512, 32_768).splits, 1);
    }

    #[test]
    fn splits_cover_every_key_in_whole_steps() {
        for sms in [1, 8, 132] {
            for blocks in [1, 3, 8, 100, 1000] {
                for max_seqlen in [0, 1, 15, 16, 17, 100, 1000, 4097, 131_072, 1 << 20] {
                    let plan = plan_splits(sms, blocks, max_seqlen);
                    assert!(plan.splits >= 1 && plan.splits <= MAX_SPLITS);
                    assert!(plan.split_keys.is_multiple_of(SPLIT_KEYS_MULTIPLE));
                    assert!(plan.splits * plan.split_keys >= max_seqlen);
                    // No split is empty for the longest sequence.
                    assert!(max_seqlen == 0 || (plan.splits - 1) * plan.split_keys < max_seqlen);
                    assert_eq!(
                        plan.splits_covering(max_seqlen),
                        plan.splits.min(max_seqlen.div_ceil(plan.split_keys))
                    );
                }
            }
        }
    }
}
