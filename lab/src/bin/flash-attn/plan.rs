//! `flash-attn plan`: which kernels a call would run, with which launches, and why a fallback,
//! for a problem given by its shape: no tensors, no GPU needed (with a GPU, its own limits).
//! With `--decode`, a decode call's plan: its splits, and whether one launch or two merge them.

use std::process::ExitCode;

use flash_attn::attention::{
    Algorithm, Attention, AttentionOptions, CacheSeqlens, CompiledLimits, KvCache, LaunchLimits,
    PassPlan, Plan, Problem,
};
use flash_attn::{DType, Element, Gpu, Layout, TensorRef, with_element};

use crate::is_missing_gpu;

#[derive(clap::Args)]
pub struct PlanArgs {
    /// Q's shape: batch,heads,seqlen_q,head_dim.
    #[arg(long, value_name = "B,H,N,D", value_parser = parse_shape)]
    shape: [usize; 4],
    /// K's and V's sequence length (default: seqlen_q).
    #[arg(long, value_name = "N")]
    seqlen_k: Option<usize>,
    /// K's and V's heads (grouped-query attention: a divisor of Q's heads; default: Q's).
    #[arg(long, value_name = "H")]
    kv_heads: Option<usize>,
    #[arg(long, default_value = "bf16")]
    dtype: DType,
    /// Algorithms to plan, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    algorithms: Option<Vec<Algorithm>>,
    #[command(flatten)]
    call: crate::call_args::CallArgs,
    /// Also plan the backward: each backward algorithm (with grouped K/V heads, the group sum
    /// and its workspace show).
    #[arg(long)]
    backward: bool,
    /// Plan a decode call instead: --shape is Q's batch,heads,query tokens,head_dim, --seqlen-k
    /// every sequence's cached keys (a contiguous cache that holds exactly those).
    #[arg(long, conflicts_with_all = ["backward", "algorithms", "fa2_tc_tiling"])]
    decode: bool,
    /// With --decode: the split count (default: the plan's).
    #[arg(long, requires = "decode")]
    splits: Option<u32>,
    /// With --decode: merge the splits in one launch (true) or two (false); default: the plan's.
    #[arg(long, requires = "decode")]
    one_launch: Option<bool>,
}

pub fn main(device: usize, args: &PlanArgs) -> flash_attn::Result<ExitCode> {
    let options = args.call.options(Algorithm::Auto)?;
    if args.decode {
        return decode_plan(device, args);
    }
    let q = args.shape;
    let kv = [
        q[0],
        args.kv_heads.unwrap_or(q[1]),
        args.seqlen_k.unwrap_or(q[2]),
        q[3],
    ];
    let problem = Problem::new(q, kv, kv, &options)?;
    let gpu = open_gpu(device)?;
    let limits = limits_of(device, &gpu);
    if problem.is_grouped() {
        println!(
            "grouped K/V heads: {} for {} query heads ({} each, read in place)",
            problem.heads_kv,
            problem.heads,
            problem.kv_group()
        );
    }
    let algorithms = args.algorithms.clone().unwrap_or(Algorithm::ALL.to_vec());
    for algorithm in algorithms {
        let options = AttentionOptions {
            algorithm,
            ..options
        };
        match with_element!(args.dtype, T => plan_shapes::<T>(limits, [q, kv], options, false)) {
            Ok(plan) => {
                println!("{plan}");
                let visited = match &plan.pass {
                    PassPlan::Forward(forward) => forward.key_blocks_visited(),
                    _ => None,
                };
                if let Some((visited, all)) = visited.filter(|(v, a)| v < a) {
                    println!(
                        "  K/V blocks per head: {visited} of {all} visited, {} skipped (mask)",
                        all - visited
                    );
                }
            }
            // A window or soft-capping that the faithful kernels refuse: say so, plan the rest.
            Err(e) if problem.local_option().is_some() => println!("{algorithm}: {e}"),
            Err(e) => return Err(e),
        }
    }
    if args.backward {
        for backward_algorithm in Algorithm::BACKWARD_FAMILIES {
            let options = AttentionOptions {
                backward_algorithm,
                ..options
            };
            match with_element!(args.dtype, T => plan_shapes::<T>(limits, [q, kv], options, true)) {
                Ok(plan) => println!("{plan}"),
                // A window or soft-capping that the scalar and standard backwards refuse: say so.
                Err(e) if problem.local_option().is_some() => {
                    println!("{backward_algorithm} backward: {e}")
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The plan of a call of Q's and K's (V's) dims, their tensors in PyTorch's layout with no
/// memory behind them: the forward's, or with `backward` the backward's.
fn plan_shapes<T: Element>(
    limits: &dyn LaunchLimits,
    [q, kv]: [[usize; 4]; 2],
    options: AttentionOptions,
    backward: bool,
) -> flash_attn::Result<Plan> {
    let layout = Layout::BatchHeadSeqDim;
    let q = TensorRef::<T>::layout_only(q, layout.strides(q));
    let kv = TensorRef::<T>::layout_only(kv, layout.strides(kv));
    let call = Attention::new(q, kv, kv).options(options);
    if backward {
        call.plan_backward(limits)
    } else {
        call.plan(limits)
    }
}

/// The device's GPU, or None without one.
fn open_gpu(device: usize) -> flash_attn::Result<Option<Gpu>> {
    match Gpu::open(device) {
        Ok(gpu) => Ok(Some(gpu)),
        Err(e) if is_missing_gpu(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The GPU's limits, or the H200's without one; says which.
fn limits_of(device: usize, gpu: &Option<Gpu>) -> &dyn LaunchLimits {
    match gpu {
        Some(gpu) => {
            println!("limits of device {device}: {}", gpu.info().name);
            gpu
        }
        None => {
            println!(
                "no GPU: the H200's shared memory, SMs and each kernel's compiled thread bound"
            );
            &CompiledLimits::H200
        }
    }
}

/// `plan --decode`: one query shape against `--seqlen-k` cached keys per sequence.
fn decode_plan(device: usize, args: &PlanArgs) -> flash_attn::Result<ExitCode> {
    let q = args.shape;
    let [batch, heads, _, head_dim] = q;
    let cached = args.seqlen_k.unwrap_or(q[2]);
    let lengths = CacheSeqlens::host(&vec![u32::try_from(cached).unwrap_or(u32::MAX); batch])?;
    let cache = [batch, args.kv_heads.unwrap_or(heads), cached, head_dim];
    let options = AttentionOptions {
        decode_splits: args.splits,
        decode_one_launch: args.one_launch,
        ..args.call.options(Algorithm::Auto)?
    };
    let gpu = open_gpu(device)?;
    let limits = limits_of(device, &gpu);
    let plan = with_element!(args.dtype, T => {
        let layout = |dims: [usize; 4]| {
            TensorRef::<T>::layout_only(dims, Layout::BatchHeadSeqDim.strides(dims))
        };
        let kv_cache = KvCache {
            seqlens: &lengths,
            block_table: None,
            append: None,
        };
        Attention::new(layout(q), layout(cache), layout(cache))
            .options(options)
            .kv_cache(kv_cache)
            .plan(limits)
    })?;
    println!("{plan}");
    Ok(ExitCode::SUCCESS)
}

fn parse_shape(text: &str) -> Result<[usize; 4], String> {
    let dims: Vec<usize> = text
        .split(',')
        .map(|s| s.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("`{text}`: {e}"))?;
    dims.try_into()
        .map_err(|d: Vec<usize>| format!("`{text}`: four dimensions B,H,N,D, got {}", d.len()))
}
