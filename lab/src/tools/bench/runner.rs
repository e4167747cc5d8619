//! Running the benchmark on the GPU: timing one case, and the longest sequence that fits.

use rand::Rng;

use crate::tools::bench::{BenchRecord, BenchShape, MaxSeqlen, SweepConfig};
use crate::tools::check::random_tensor;
use flash_attn::attention::{Algorithm, Attention, AttentionOptions, Workspace};
use flash_attn::device::Gpu;
use flash_attn::dtype::{DType, Element};
use flash_attn::error::{Error, Result};
use flash_attn::tensor::{DeviceTensor, Layout};
use flash_attn::with_element;

impl BenchRecord {
    fn failed(implementation: &str, dtype: DType, shape: BenchShape, error: &Error) -> Self {
        Self {
            implementation: implementation.to_string(),
            dtype,
            shape,
            median_ms: None,
            tflops: None,
            bandwidth_gbs: None,
            peak_memory_bytes: None,
            error: Some(error.to_string()),
        }
    }
}

/// Times `algorithm` on `shape`; an error (out of memory, say) becomes a record with no time.
pub fn run_case(
    gpu: &Gpu,
    algorithm: Algorithm,
    shape: BenchShape,
    config: &SweepConfig,
    rng: &mut impl Rng,
) -> BenchRecord {
    let result =
        with_element!(config.dtype, T => time_case::<T>(gpu, algorithm, shape, config, rng));
    result.unwrap_or_else(|e| {
        BenchRecord::failed(
            &implementation_name(algorithm, config),
            config.dtype,
            shape,
            &e,
        )
    })
}

/// The record name: the algorithm's, with FA2-TC's tiling override appended.
fn implementation_name(algorithm: Algorithm, config: &SweepConfig) -> String {
    match (algorithm, &config.fa2_tc_tiling, &config.fa3_tiling) {
        (Algorithm::Fa2Tc, Some(tiling), _) | (Algorithm::Fa3, _, Some(tiling)) => {
            format!("{algorithm}-{tiling}")
        }
        _ => algorithm.name().to_string(),
    }
}

/// Q, K and V on the device, fresh N(0, 1) values.
struct Inputs<T> {
    q: DeviceTensor<T>,
    k: DeviceTensor<T>,
    v: DeviceTensor<T>,
}

fn time_case<T: Element>(
    gpu: &Gpu,
    algorithm: Algorithm,
    shape: BenchShape,
    config: &SweepConfig,
    rng: &mut impl Rng,
) -> Result<BenchRecord> {
    let options = AttentionOptions {
        algorithm,
        causal: shape.causal,
        fa2_tc_tiling: flash_attn::attention::parse_optional_fa2_tc_tiling(
            config.fa2_tc_tiling.as_deref(),
        )?,
        fa3_tiling: config
            .fa3_tiling
            .as_deref()
            .map(flash_attn::attention::parse_fa3_tiling)
            .transpose()?,
        ..Default::default()
    };
    let dims = shape.dims();

    // Fresh N(0, 1) inputs, drawn once per case; every set of device buffers holds them.
    let host = [(); 3].map(|_| random_tensor::<T>(dims, rng));
    let upload_set = || -> Result<Inputs<T>> {
        let upload = |a: &ndarray::Array4<T>| {
            DeviceTensor::from_array(gpu, a.view(), Layout::BatchHeadSeqDim)
        };
        Ok(Inputs {
            q: upload(&host[0])?,
            k: upload(&host[1])?,
            v: upload(&host[2])?,
        })
    };

    // Peak memory of one call, from an empty pool: its inputs, output and workspace.
    gpu.synchronize()?;
    gpu.reset_peak_memory()?;
    let mut inputs = vec![upload_set()?];
    fn call<T: Element>(set: &Inputs<T>, options: AttentionOptions) -> Attention<'_, T> {
        Attention::new(&set.q, &set.k, &set.v).options(options)
    }
    let mut output = call(&inputs[0], options).forward(gpu)?;
    // One plan and one workspace for every run, as a caller that reuses them would.
    let plan = output.plan.clone();
    let mut workspace = Workspace::new(gpu, &plan)?;
    plan.run_with_workspace(
        gpu,
        &call(&inputs[0], options),
        output.pass(),
        &mut workspace,
    )?;
    gpu.synchronize()?;
    let peak_memory_bytes = gpu.peak_memory()?;

    // Rotate through enough sets of buffers (same values, different addresses) that they cannot
    // all sit in L2.
    let set_bytes = 3 * dims.iter().product::<usize>() * T::DTYPE.size_bytes();
    let sets = (4 * gpu.info().l2_cache_bytes)
        .div_ceil(set_bytes.max(1))
        .clamp(2, 16);
    for _ in 1..sets {
        inputs.push(upload_set()?);
    }
    let mut launch = |i: usize| {
        let set = &inputs[i % inputs.len()];
        plan.run_with_workspace(gpu, &call(set, options), output.pass(), &mut workspace)
    };
    // Warm-up: one launch per input set, then an estimate of how many repeats fit the target.
    let warm = gpu.time_each_ms(sets, &mut launch)?;
    let estimate = warm.iter().copied().fold(f32::INFINITY, f32::min).max(1e-3) as f64;
    let repeats =
        ((config.target_ms / estimate) as usize).clamp(config.min_repeats, config.max_repeats);
    let mut times = gpu.time_each_ms(repeats, &mut launch)?;
    times.sort_by(f32::total_cmp);
    let median_ms = times[times.len() / 2] as f64;
    Ok(BenchRecord {
        implementation: implementation_name(algorithm, config),
        dtype: T::DTYPE,
        shape,
        median_ms: Some(median_ms),
        tflops: Some(shape.flops() / (median_ms * 1e-3) / 1e12),
        bandwidth_gbs: Some(shape.minimum_bytes(T::DTYPE) / (median_ms * 1e-3) / 1e9),
        peak_memory_bytes: Some(peak_memory_bytes),
        error: None,
    })
}

/// The longest N (multiple of 1024) at batch 1 whose buffers `algorithm` can allocate, found by
/// doubling and then bisecting; out-of-memory errors are expected and handled.
pub fn max_seqlen(
    gpu: &Gpu,
    algorithm: Algorithm,
    dtype: DType,
    head_dim: usize,
    hidden: usize,
) -> Result<MaxSeqlen> {
    let heads = (hidden / head_dim).max(1);
    let fits = |seqlen: usize| -> Result<std::result::Result<(), String>> {
        let dims = [1, heads, seqlen, head_dim];
        let outcome = with_element!(dtype, T => allocate_call::<T>(gpu, algorithm, dims));
        gpu.synchronize()?;
        match outcome {
            Ok(()) => Ok(Ok(())),
            Err(e @ (Error::OutOfMemory { .. } | Error::InvalidArgument { .. })) => {
                Ok(Err(e.to_string()))
            }
            Err(e) => Err(e),
        }
    };
    const STEP: usize = 1024;
    // Double until a size fails, then bisect between the last fit and that failure.
    let (mut good, mut bad) = (0usize, STEP);
    let mut limit = loop {
        match fits(bad)? {
            Ok(()) => (good, bad) = (bad, bad * 2),
            Err(e) => break e,
        }
    };
    while bad - good > STEP {
        let mid = (good + bad) / 2 / STEP * STEP;
        match fits(mid)? {
            Ok(()) => good = mid,
            Err(e) => (bad, limit) = (mid, e),
        }
    }
    Ok(MaxSeqlen {
        implementation: algorithm.name().to_string(),
        head_dim,
        heads,
        seqlen: good,
        limit,
    })
}

/// Allocates everything one call needs (zero-filled inputs: nothing is computed or timed on them).
fn allocate_call<T: Element>(gpu: &Gpu, algorithm: Algorithm, dims: [usize; 4]) -> Result<()> {
    // Zero-filled on the device (a memset): nothing is computed on them.
    let q = DeviceTensor::<T>::filled(gpu, dims, Layout::BatchHeadSeqDim, T::default())?;
    let k = DeviceTensor::<T>::filled(gpu, dims, Layout::BatchHeadSeqDim, T::default())?;
    let v = DeviceTensor::<T>::filled(gpu, dims, Layout::BatchHeadSeqDim, T::default())?;
    let call = Attention::new(&q, &k, &v).algorithm(algorithm);
    let plan = call.plan(gpu)?;
    let _output = (
        DeviceTensor::<T>::filled(gpu, dims, Layout::BatchHeadSeqDim, T::default())?,
        flash_attn::tensor::DeviceRows::new(gpu, plan.statistics_dims(), None, "L")?,
    );
    let _workspace = Workspace::new(gpu, &plan)?;
    Ok(())
}
