//! Decoding against a KV cache: 1–16 query tokens per sequence against each sequence's cached
//! keys and values, with grouped K/V heads (GQA/MQA: heads_q a multiple of heads_kv, K/V never
//! copied), per-sequence cache lengths, a contiguous or paged cache, and new keys and values
//! appended in the same call ([`KvCache::append`]). A KV-cache call is an
//! [`Attention`](crate::attention::Attention) of the form `Form::Cache`: its plan is a
//! [`DecodePlan`].
//!
//! - [`cache`]: the lengths and the block table on the device, with the host copies the checks read;
//! - [`problem`]: the call's shapes and options, checked;
//! - [`plan`]: the split of the keys, their merge (one launch or two), the kernels and their
//!   launches, the workspace;
//! - this file: the workspace, the parameter block, the launches.
//!
//! ```text
//!  q        (batch, heads_q, q_tokens, d)       any strides, last 1 (PyTorch's or flash-attn's layout)
//!  k_cache  (batch, heads_kv, capacity, d)      contiguous; or (pages, heads_kv, page_size, d) with
//!  v_cache                                       a block table (batch, pages per sequence)
//!  k_new    (batch, heads_kv, new_tokens, d)    optional: written at cache_seqlens[b] + i first
//!  o        (batch, heads_q, q_tokens, d),  L (batch, heads_q, q_tokens) f32
//! ```
//!
//! A sequence attends to `cache_seqlens[b] + new_tokens` keys; the query tokens are its last
//! positions (the call's `causal` masks later keys). An empty sequence, or a token that sees
//! no key, gets O = 0 and L = −∞.

pub mod cache;
pub mod plan;
pub mod problem;

pub use cache::{BlockTable, CacheSeqlens, TablePages};
pub use plan::{DecodePlan, SplitMerge};
pub use problem::{CacheGeometry, DecodeOptions, DecodeProblem, DecodeShapes};

use cudarc::driver::CudaSlice;
use flash_kernels::common::params::DecodeParams;
use flash_kernels::tile::layout::COPY_ELEMENTS;

use crate::attention::PlannedLaunch;
use crate::attention::call::{Attention, KvCache};
use crate::device::Gpu;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::tensor::TensorRef;

/// The split-KV workspace: each split's Õ, m and ℓ, and the one-launch merge's arrival
/// counters. The counters are zeroed once here; each launch leaves them at zero (the last block
/// of each group resets its own), so a workspace serves call after call, whatever their split
/// counts, with no memset between.
pub(crate) struct DecodeWorkspace {
    o: Option<CudaSlice<f32>>,
    max: Option<CudaSlice<f32>>,
    sum: Option<CudaSlice<f32>>,
    counters: Option<CudaSlice<u32>>,
    o_len: usize,
    stats_len: usize,
    counters_len: usize,
}

impl DecodeWorkspace {
    /// Allocates what `plan` needs (nothing with one split).
    /// Allocates what the most demanding of `plans` needs, so that one workspace runs each.
    pub(crate) fn covering(gpu: &Gpu, plans: &[DecodePlan]) -> Result<Self> {
        let most = |size: fn(&DecodePlan) -> usize| plans.iter().map(size).max().unwrap_or(0);
        let (o_len, stats_len) = (most(|p| p.workspace_o), most(|p| p.workspace_stats));
        let counters_len = most(|p| p.workspace_counters);
        let alloc = |len: usize, what| (len > 0).then(|| gpu.alloc::<f32>(len, what)).transpose();
        let counters = (counters_len > 0)
            .then(|| gpu.alloc_zeroed::<u32>(counters_len, "the split arrival counters"))
            .transpose()?;
        Ok(Self {
            o: alloc(o_len, "the split-KV partial O")?,
            max: alloc(stats_len, "the split-KV partial m")?,
            sum: alloc(stats_len, "the split-KV partial ℓ")?,
            counters,
            o_len,
            stats_len,
            counters_len,
        })
    }

    /// The partial O, m, ℓ and the counters' device addresses (0 for what the plan does not use).
    fn addresses(&self, gpu: &Gpu, plan: &DecodePlan) -> Result<[u64; 4]> {
        if self.o_len < plan.workspace_o
            || self.stats_len < plan.workspace_stats
            || self.counters_len < plan.workspace_counters
        {
            return Err(Error::invalid(
                "workspace",
                format!(
                    "{} + 2 × {} floats and {} counters",
                    self.o_len, self.stats_len, self.counters_len
                ),
                format!(
                    "at least {} + 2 × {} floats and {} counters for this plan \
                     (DecodeWorkspace::new)",
                    plan.workspace_o, plan.workspace_stats, plan.workspace_counters
                ),
            ));
        }
        let address = |b: &Option<CudaSlice<f32>>| b.as_ref().map_or(0, |b| gpu.address(b));
        let counters = self.counters.as_ref().map_or(0, |c| gpu.address(c));
        Ok([
            address(&self.o),
            address(&self.max),
            address(&self.sum),
            counters,
        ])
    }
}

/// Launches a decode plan for a checked KV-cache call (`call`'s Q and caches, `cache` its
/// lengths, pages and appended keys) into O and L at `logsumexp`, with `workspace`.
pub(crate) fn launch_decode<T: Element>(
    gpu: &Gpu,
    plan: &DecodePlan,
    call: &Attention<T>,
    cache: &KvCache<T>,
    o: &TensorRef<T>,
    logsumexp: u64,
    workspace: &mut DecodeWorkspace,
) -> Result<()> {
    let problem = &plan.problem;
    let [partial_o, partial_max, partial_sum, split_counters] = workspace.addresses(gpu, plan)?;
    let params = DecodeParams {
        q: call.q.view(),
        o: o.view(),
        logsumexp,
        partial_o,
        partial_max,
        partial_sum,
        split_counters,
        splits: plan.splits.splits,
        split_keys: plan.splits.split_keys,
        causal: problem.causal as u32,
        softmax_scale: problem.softmax_scale,
        ..cache_params(gpu, call, cache, problem)
    };
    for PlannedLaunch { kernel, launch } in &plan.launches {
        gpu.launch(*kernel, *launch, params)?;
    }
    Ok(())
}

/// The parameter block's cache part, which the append and the attention share: the cache, the
/// new keys, the lengths, the block table (zeros for a contiguous cache) and the shapes.
fn cache_params<T: Element>(
    gpu: &Gpu,
    call: &Attention<T>,
    cache: &KvCache<T>,
    problem: &DecodeProblem,
) -> DecodeParams {
    let (block_table, table_stride, page_size) = match (cache.block_table, problem.cache) {
        (
            Some(table),
            CacheGeometry::Paged {
                page_size,
                table_width,
                ..
            },
        ) => (
            table.device.as_ref().map_or(0, |d| gpu.address(d)),
            table_width as u32,
            page_size as u32,
        ),
        _ => (0, 0, 0),
    };
    let (k_new, v_new) = cache
        .append
        .map_or_else(Default::default, |(k, v)| (k.view(), v.view()));
    DecodeParams {
        k_cache: call.k.view(),
        v_cache: call.v.view(),
        k_new,
        v_new,
        cache_seqlens: cache.seqlens.device.as_ref().map_or(0, |d| gpu.address(d)),
        block_table,
        table_stride,
        page_size,
        batch: problem.batch as u32,
        heads_q: problem.heads_q as u32,
        heads_kv: problem.heads_kv as u32,
        q_tokens: problem.q_tokens as u32,
        new_tokens: problem.new_tokens as u32,
        head_dim: problem.head_dim as u32,
        ..Default::default()
    }
}

/// The kernels' 16-byte loads need rows whose strides are whole 16-byte pieces (the buffers
/// themselves are allocated 256-byte aligned).
pub(crate) fn check_rows_aligned(name: &'static str, strides: [usize; 4]) -> Result<()> {
    if strides[..3]
        .iter()
        .any(|s| !s.is_multiple_of(COPY_ELEMENTS as usize))
    {
        return Err(Error::invalid(
            name,
            format!("strides {strides:?}"),
            format!("strides that are multiples of {COPY_ELEMENTS} elements (16 bytes)"),
        ));
    }
    Ok(())
}
