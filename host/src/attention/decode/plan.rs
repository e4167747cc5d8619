//! A decode call's plan: the split of the keys, the kernels (append, split-KV, combine) with
//! their launches checked against the device, and the workspace.

use std::fmt;

use flash_kernels::decode::config::{
    self as decode, APPEND_THREADS, COMBINE_ROWS, COMBINE_THREADS, MAX_SPLITS, SPLIT_KEYS_MULTIPLE,
    SplitPlan, THREADS, TILE_ROWS, plan_splits,
};
use flash_kernels::registry::{CacheLayout, ElementType, Family, KernelId};

use super::problem::{CacheGeometry, DecodeOptions, DecodeProblem};
use crate::attention::plan::{
    Launch, LaunchLimits, PlannedLaunch, check_shared, check_threads, write_launches,
};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Everything a decode call runs, decided before any launch.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodePlan {
    pub dtype: DType,
    pub problem: DecodeProblem,
    pub splits: SplitPlan,
    /// The kernels in launch order: the append (if new keys), the split-KV kernel, and the
    /// combine (if more than one split).
    pub launches: Vec<PlannedLaunch>,
    /// f32 elements of the workspace: each split's Õ (splits × rows × d); m and ℓ take
    /// splits × rows each. 0 with one split.
    pub workspace_o: usize,
    pub workspace_stats: usize,
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
        let kernel = KernelId::new(Family::Decode { head_dim, cache }, element);
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
        let (workspace_o, workspace_stats) = if splits.splits > 1 {
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
            let stats = splits.splits as usize * rows;
            (stats * problem.head_dim, stats)
        } else {
            (0, 0)
        };
        Ok(Self {
            dtype,
            problem: problem.clone(),
            splits,
            launches,
            workspace_o,
            workspace_stats,
        })
    }

    /// Every kernel's name, in launch order, joined by `+`.
    pub fn kernel_names(&self) -> String {
        let names: Vec<String> = self.launches.iter().map(|l| l.kernel.to_string()).collect();
        names.join("+")
    }
}

impl fmt::Display for DecodePlan {
    /// One line: the kernels with their launches, and the split.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "decode:")?;
        write_launches(f, &self.launches)?;
        write!(
            f,
            " ({} split{} of {} keys)",
            self.splits.splits,
            if self.splits.splits == 1 { "" } else { "s" },
            self.splits.split_keys
        )
    }
}
