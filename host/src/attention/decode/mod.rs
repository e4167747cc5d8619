//! Decoding against a KV cache: 1–16 query tokens per sequence against each sequence's cached
//! keys and values, with grouped K/V heads (GQA/MQA: heads_q a multiple of heads_kv, K/V never
//! copied), per-sequence cache lengths, a contiguous or paged cache, and new keys and values
//! appended in the same call ([`DecodeArguments::new_kv`]) or in a separate one ([`append_kv`]).
//!
//! - [`cache`]: the lengths and the block table on the device, with the host copies the checks read;
//! - [`problem`]: the call's shapes and options, checked;
//! - [`plan`]: the split of the keys, their merge (one launch or two), the kernels and their
//!   launches, the workspace;
//! - this file: the API (allocate, build the parameter block, launch the plan).
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
//! positions (`DecodeOptions::causal` masks later keys). An empty sequence, or a token that sees
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
use ndarray::Array3;

use crate::attention::PlannedLaunch;
use crate::device::Gpu;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::tensor::{DeviceTensor, Layout};

/// The device tensors of a decode call.
pub struct DecodeArguments<'a, T> {
    pub q: &'a DeviceTensor<T>,
    pub k_cache: &'a DeviceTensor<T>,
    pub v_cache: &'a DeviceTensor<T>,
    pub cache_seqlens: &'a CacheSeqlens,
    /// The pages of a paged cache (then `k_cache` is (pages, heads_kv, page_size, d)).
    pub block_table: Option<&'a BlockTable>,
    /// New keys and values, appended to the cache before attending.
    pub new_kv: Option<(&'a DeviceTensor<T>, &'a DeviceTensor<T>)>,
}

impl<T: Element> DecodeArguments<'_, T> {
    fn shapes(&self) -> DecodeShapes<'_> {
        DecodeShapes {
            q: self.q.dims(),
            k_cache: self.k_cache.dims(),
            v_cache: self.v_cache.dims(),
            new_kv: self.new_kv.map(|(k, v)| (k.dims(), v.dims())),
            cache_seqlens: self.cache_seqlens.lengths(),
            block_table: self.block_table.map(BlockTable::pages),
        }
    }

    /// The checked problem: shapes, lengths, pages, and 16-byte rows for the kernels' loads.
    pub fn problem(&self, options: &DecodeOptions) -> Result<DecodeProblem> {
        let problem = DecodeProblem::new(T::DTYPE, &self.shapes(), options)?;
        let mut tensors = vec![
            ("q", self.q),
            ("k_cache", self.k_cache),
            ("v_cache", self.v_cache),
        ];
        if let Some((k, v)) = self.new_kv {
            tensors.extend([("k_new", k), ("v_new", v)]);
        }
        for (name, tensor) in tensors {
            check_rows_aligned(name, tensor.strides())?;
        }
        Ok(problem)
    }
}

/// O and L of a decode call, and the plan that wrote them.
pub struct DecodeOutput<T> {
    /// (batch, heads_q, q_tokens, d), in q's layout.
    pub o: DeviceTensor<T>,
    /// L, f32, (batch, heads_q, q_tokens) contiguous.
    pub logsumexp: CudaSlice<f32>,
    pub plan: Option<DecodePlan>,
}

impl<T: Element> DecodeOutput<T> {
    /// L as a (batch, heads_q, q_tokens) array.
    pub fn logsumexp(&self, gpu: &Gpu) -> Result<Array3<f32>> {
        let [batch, heads, tokens, _] = self.o.dims();
        Array3::from_shape_vec((batch, heads, tokens), gpu.download(&self.logsumexp)?)
            .map_err(|e| Error::File(e.to_string()))
    }
}

/// The split-KV workspace: each split's Õ, m and ℓ, and the one-launch merge's arrival
/// counters. The counters are zeroed once here; each launch leaves them at zero (the last block
/// of each group resets its own), so a workspace serves call after call, whatever their split
/// counts, with no memset between.
pub struct DecodeWorkspace {
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
    pub fn new(gpu: &Gpu, plan: &DecodePlan) -> Result<Self> {
        Self::covering(gpu, std::slice::from_ref(plan))
    }

    /// Allocates what the most demanding of `plans` needs, so that one workspace runs each.
    pub fn covering(gpu: &Gpu, plans: &[DecodePlan]) -> Result<Self> {
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

/// Checks the arguments and allocates O (q's dims and layout) and L.
pub fn new_decode_output<T: Element>(
    gpu: &Gpu,
    args: &DecodeArguments<T>,
    options: &DecodeOptions,
) -> Result<DecodeOutput<T>> {
    let problem = args.problem(options)?;
    let layout = args.q.layout().unwrap_or(Layout::BatchHeadSeqDim);
    Ok(DecodeOutput {
        o: DeviceTensor::filled(gpu, args.q.dims(), layout, T::default())?,
        logsumexp: gpu.alloc(problem.rows(), "L")?,
        plan: None,
    })
}

/// Decodes: returns O, L and the plan.
pub fn decode<T: Element>(
    gpu: &Gpu,
    args: &DecodeArguments<T>,
    options: &DecodeOptions,
) -> Result<DecodeOutput<T>> {
    let mut output = new_decode_output(gpu, args, options)?;
    decode_into(gpu, args, &mut output, options)?;
    Ok(output)
}

/// Plans a decode call on `gpu` (checking every argument first).
pub fn plan_decode<T: Element>(
    gpu: &Gpu,
    args: &DecodeArguments<T>,
    options: &DecodeOptions,
) -> Result<DecodePlan> {
    DecodePlan::new(gpu, T::DTYPE, &args.problem(options)?, options)
}

/// Like [`decode`], into an existing output, with a workspace allocated for this call.
pub fn decode_into<T: Element>(
    gpu: &Gpu,
    args: &DecodeArguments<T>,
    output: &mut DecodeOutput<T>,
    options: &DecodeOptions,
) -> Result<DecodePlan> {
    let plan = plan_decode(gpu, args, options)?;
    let mut workspace = DecodeWorkspace::new(gpu, &plan)?;
    decode_with_workspace(gpu, args, output, &mut workspace, &plan)
}

/// The launch: `plan` (from [`plan_decode`] on the same arguments and options) run into
/// `output` with `workspace`. The arguments are checked again against the plan's problem, so a
/// stale plan is an error rather than a wrong launch.
pub fn decode_with_workspace<T: Element>(
    gpu: &Gpu,
    args: &DecodeArguments<T>,
    output: &mut DecodeOutput<T>,
    workspace: &mut DecodeWorkspace,
    plan: &DecodePlan,
) -> Result<DecodePlan> {
    let options = DecodeOptions {
        causal: plan.problem.causal,
        softmax_scale: Some(plan.problem.softmax_scale),
        splits: Some(plan.splits.splits),
        one_launch: None,
    };
    let problem = args.problem(&options)?;
    if problem != plan.problem || plan.dtype != T::DTYPE {
        return Err(Error::invalid(
            "plan",
            "a plan of another problem",
            "the plan plan_decode made for these arguments",
        ));
    }
    if output.o.dims() != args.q.dims() || output.logsumexp.len() < problem.rows() {
        return Err(Error::invalid(
            "output",
            format!("o of shape {:?}", output.o.dims()),
            format!(
                "q's shape {:?} and {} L values",
                args.q.dims(),
                problem.rows()
            ),
        ));
    }
    check_rows_aligned("output.o", output.o.strides())?;
    let [partial_o, partial_max, partial_sum, split_counters] = workspace.addresses(gpu, plan)?;
    let params = DecodeParams {
        q: args.q.view(gpu),
        o: output.o.view(gpu),
        logsumexp: gpu.address(&output.logsumexp),
        partial_o,
        partial_max,
        partial_sum,
        split_counters,
        splits: plan.splits.splits,
        split_keys: plan.splits.split_keys,
        causal: problem.causal as u32,
        softmax_scale: problem.softmax_scale,
        ..cache_params(gpu, args, &problem)
    };
    for PlannedLaunch { kernel, launch } in &plan.launches {
        gpu.launch(*kernel, *launch, params)?;
    }
    output.plan = Some(plan.clone());
    Ok(plan.clone())
}

/// Appends `k_new`, `v_new` ((batch, heads_kv, new_tokens, d)) to the cache at each sequence's
/// `cache_seqlens` position, as a call of its own; the caller then passes the longer lengths to
/// the next decode. Returns the one-launch plan.
pub fn append_kv<T: Element>(gpu: &Gpu, args: &DecodeArguments<T>) -> Result<DecodePlan> {
    if args.new_kv.is_none() {
        return Err(Error::invalid(
            "new_kv",
            "None",
            "the keys and values to append",
        ));
    }
    let mut plan = plan_decode(gpu, args, &DecodeOptions::default())?;
    plan.launches.truncate(1);
    plan.workspace_o = 0;
    plan.workspace_stats = 0;
    plan.workspace_counters = 0;
    let params = cache_params(gpu, args, &plan.problem);
    let PlannedLaunch { kernel, launch } = plan.launches[0];
    gpu.launch(kernel, launch, params)?;
    Ok(plan)
}

/// The parameter block's cache part, which the append and the attention share: the cache, the
/// new keys, the lengths, the block table (zeros for a contiguous cache) and the shapes.
fn cache_params<T: Element>(
    gpu: &Gpu,
    args: &DecodeArguments<T>,
    problem: &DecodeProblem,
) -> DecodeParams {
    let (block_table, table_stride, page_size) = match (args.block_table, problem.cache) {
        (
            Some(table),
            CacheGeometry::Paged {
                page_size,
                table_width,
                ..
            },
        ) => (
            gpu.address(&table.device),
            table_width as u32,
            page_size as u32,
        ),
        _ => (0, 0, 0),
    };
    let (k_new, v_new) = args
        .new_kv
        .map_or_else(Default::default, |(k, v)| (k.view(gpu), v.view(gpu)));
    DecodeParams {
        k_cache: args.k_cache.view(gpu),
        v_cache: args.v_cache.view(gpu),
        k_new,
        v_new,
        cache_seqlens: gpu.address(&args.cache_seqlens.device),
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
fn check_rows_aligned(name: &'static str, strides: [usize; 4]) -> Result<()> {
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
