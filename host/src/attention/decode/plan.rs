//! A decode call's plan: the split of the keys, how the splits are merged (in the split-KV
//! kernel's last block of each group, or by the combine kernel), the kernels (append, split-KV,
//! combine) with their launches checked against the device, and the workspace.

use std::fmt;

use flash_kernels::decode::config::{
    self as decode, APPEND_THREADS, BLOCKS_PER_SM, COMBINE_ROWS, COMBINE_THREADS, MAX_SPLITS,
    SPLIT_KEYS_MULTIPLE, SplitPlan, THREADS, TILE_ROWS, plan_splits,
};
use flash_kernels::registry::{CacheLayout, ElementType, Family, KernelId};

use super::problem::{CacheGeometry, DecodeOptions, DecodeProblem};
use crate::attention::plan::{
    Launch, LaunchLimits, PlannedLaunch, check_shared, check_threads, write_launches,
};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// How a call's splits become O and L.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitMerge {
    /// One split: the split-KV kernel writes O and L, nothing to merge.
    Direct,
    /// One launch: each split-KV block stores its partial results and arrives at its group's
    /// counter; the last to arrive merges the group's splits.
    LastBlock,
    /// Two launches: the split-KV kernel stores the partial results, the combine kernel merges.
    CombineKernel,
}

impl SplitMerge {
    /// The choice for `splits` splits of `blocks_per_split` blocks on `sms` SMs, and why.
    /// `one_launch` forces it (`DecodeOptions::one_launch`).
    ///
    /// With one launch the combine kernel's launch and its first dependent round trips go, and
    /// each split-KV block pays one release fence and atomic round trip at its end instead. In
    /// one wave ([`BLOCKS_PER_SM`] blocks per SM, which the default split count never exceeds)
    /// that round trip is paid once on the critical path; in more waves it is paid again each
    /// wave, holding an SM slot that the next block would stream into, while the combine
    /// kernel's cost stays the same. So: the last block merges when the grid fits one wave.
    pub fn choose(
        splits: u32,
        blocks_per_split: u32,
        sms: u32,
        one_launch: Option<bool>,
    ) -> (Self, &'static str) {
        if splits == 1 {
            return (
                SplitMerge::Direct,
                "one split: the split-KV kernel writes O and L",
            );
        }
        match one_launch {
            Some(true) => (SplitMerge::LastBlock, "one launch, as the options ask"),
            Some(false) => (
                SplitMerge::CombineKernel,
                "two launches, as the options ask",
            ),
            None if splits * blocks_per_split <= sms * BLOCKS_PER_SM => (
                SplitMerge::LastBlock,
                "one wave: the last block of each group merges its splits, no combine launch",
            ),
            None => (
                SplitMerge::CombineKernel,
                "more than one wave: the combine kernel merges, no block holds its SM through a counter round trip",
            ),
        }
    }
}

/// Everything a decode call runs, decided before any launch.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodePlan {
    pub dtype: DType,
    pub problem: DecodeProblem,
    pub splits: SplitPlan,
    /// How the splits are merged, and why.
    pub merge: SplitMerge,
    pub merge_reason: &'static str,
    /// The kernels in launch order: the append (if new keys), the split-KV kernel, and the
    /// combine (with several splits, unless the split-KV kernel's last blocks merge).
    pub launches: Vec<PlannedLaunch>,
    /// f32 elements of the workspace: each split's Õ (splits × rows × d); m and ℓ take
    /// splits × rows each. 0 with one split.
    pub workspace_o: usize,
    pub workspace_stats: usize,
    /// u32 arrival counters of the one-launch merge, one per (batch·KV head, row tile); 0
    /// otherwise.
    pub workspace_counters: usize,
}

impl DecodePlan {
    pub fn new(
        limits: &dyn LaunchLimits,
        dtype: DType,
        problem: &DecodeProblem,
        options: &DecodeOptions,
    ) -> Result<Self> {
        let element = ElementType::from(dtype);
        let head_dim = problem.head_dim as u32;
        let cache = match problem.cache {
            CacheGeometry::Contiguous { .. } => CacheLayout::Contiguous,
            CacheGeometry::Paged { .. } => CacheLayout::Paged,
        };
        let row_tiles = problem.group() * problem.q_tokens;
        let row_tiles = row_tiles.div_ceil(TILE_ROWS as usize) as u32;
        let blocks_per_split = problem.batch as u32 * problem.heads_kv as u32 * row_tiles;
        let max_seqlen = problem.max_seqlen() as u32;
        let splits = match options.splits {
            None => plan_splits(limits.multiprocessors(), blocks_per_split, max_seqlen),
            Some(splits) if (1..=MAX_SPLITS).contains(&splits) => {
                let split_keys = max_seqlen
                    .div_ceil(splits)
                    .max(1)
                    .next_multiple_of(SPLIT_KEYS_MULTIPLE);
                let plan = SplitPlan::with_split_keys(split_keys, max_seqlen);
                SplitPlan {
                    splits: plan.splits.max(1),
                    split_keys,
                }
            }
            Some(splits) => {
                return Err(Error::invalid(
                    "splits",
                    splits,
                    format!("1 to {MAX_SPLITS}"),
                ));
            }
        };
        let mut launches = Vec::new();
        if problem.new_tokens > 0 {
            let kernel = KernelId::new(Family::KvAppend { cache }, element);
            let chunks =
                problem.batch * problem.new_tokens * problem.heads_kv * problem.head_dim / 8;
            let launch = Launch {
                grid: (chunks.div_ceil(APPEND_THREADS as usize) as u32, 1, 1),
                threads: APPEND_THREADS,
                shared_bytes: 0,
            };
            check_threads(limits, kernel, launch.threads, "decode")?;
            launches.push(PlannedLaunch { kernel, launch });
        }
        let (merge, merge_reason) = SplitMerge::choose(
            splits.splits,
            blocks_per_split,
            limits.multiprocessors(),
            options.one_launch,
        );
        let kernel = KernelId::new(
            Family::Decode {
                head_dim,
                cache,
                one_launch: merge == SplitMerge::LastBlock,
            },
            element,
        );
        let shared_bytes = decode::shared_bytes(head_dim);
        check_shared(limits, shared_bytes, "head_dim", head_dim, problem.head_dim)?;
        check_threads(limits, kernel, THREADS, "decode")?;
        launches.push(PlannedLaunch {
            kernel,
            launch: Launch {
                grid: (
                    splits.splits,
                    row_tiles,
                    (problem.batch * problem.heads_kv) as u32,
                ),
                threads: THREADS,
                shared_bytes,
            },
        });
        let rows = problem.rows();
        if merge == SplitMerge::CombineKernel {
            let kernel = KernelId::new(Family::DecodeCombine { head_dim }, element);
            check_threads(limits, kernel, COMBINE_THREADS, "decode")?;
            launches.push(PlannedLaunch {
                kernel,
                launch: Launch {
                    grid: (rows.div_ceil(COMBINE_ROWS as usize) as u32, 1, 1),
                    threads: COMBINE_THREADS,
                    shared_bytes: 0,
                },
            });
        }
        let (workspace_o, workspace_stats) = if merge == SplitMerge::Direct {
            (0, 0)
        } else {
            let stats = splits.splits as usize * rows;
            (stats * problem.head_dim, stats)
        };
        let workspace_counters = if merge == SplitMerge::LastBlock {
            blocks_per_split as usize
        } else {
            0
        };
        Ok(Self {
            dtype,
            problem: problem.clone(),
            splits,
            merge,
            merge_reason,
            launches,
            workspace_o,
            workspace_stats,
            workspace_counters,
        })
    }

    /// Every kernel's name, in launch order, joined by `+`.
    pub fn kernel_names(&self) -> String {
        let names: Vec<String> = self.launches.iter().map(|l| l.kernel.to_string()).collect();
        names.join("+")
    }
}

impl fmt::Display for DecodePlan {
    /// One line: the kernels with their launches, the split, and how the splits are merged.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "decode:")?;
        write_launches(f, &self.launches)?;
        write!(
            f,
            " ({} split{} of {} keys; {})",
            self.splits.splits,
            if self.splits.splits == 1 { "" } else { "s" },
            self.splits.split_keys,
            self.merge_reason
        )
    }
}
