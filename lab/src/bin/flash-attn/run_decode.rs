//! `flash-attn run --decode`: a KV-cache call on the user's tensors. Q (batch, heads, q_tokens,
//! head_dim), the caches (batch, heads_kv, capacity, head_dim), or (pages, heads_kv, page_size,
//! head_dim) with a block table, each sequence's cache length, and optionally new keys and
//! values to append first; writes O, L and, after an append, the caches. The file is read and
//! the call checked and planned (on the host: lengths and pages without a GPU) before the GPU is
//! opened.

use std::collections::HashMap;
use std::process::ExitCode;

use flash_attn::attention::{Attention, BlockTable, CacheSeqlens, CompiledLimits, KvCache, Plan};
use flash_attn::{AttentionOptions, DeviceTensor, Gpu, Layout, TensorRef};
use flash_attn_lab::safetensors_io::{
    self, AttentionFileOutput, DecodeFile, HostQkv, Qkv, SafetensorsElement,
};
use ndarray::Array4;

use crate::run::RunArgs;

/// Reads, checks and plans the call, then runs it on device `device` and writes the outputs.
pub fn main(
    device: usize,
    args: &RunArgs,
    options: &AttentionOptions,
) -> flash_attn::Result<ExitCode> {
    let [q_name, k_name, v_name] = args.names.each_ref().map(String::as_str);
    let append = args.append.as_ref().map(|[k, v]| [k.as_str(), v.as_str()]);
    let file = safetensors_io::read_decode(
        &args.input,
        [q_name, k_name, v_name],
        append,
        &args.cache_seqlens,
        args.block_table.as_deref(),
    )?;
    let dtype = file.tensors.dtype();
    let [q_dims, cache_dims, _] = file.tensors.dims();
    let plan = plan_on_host(&file, options)?;
    let gpu = Gpu::open(device)?;
    let (milliseconds, plan) = match &file.tensors {
        HostQkv::F32(qkv) => run_typed(&gpu, args, options, &file, qkv),
        HostQkv::F16(qkv) => run_typed(&gpu, args, options, &file, qkv),
        HostQkv::Bf16(qkv) => run_typed(&gpu, args, options, &file, qkv),
    }
    .map(|(ms, gpu_plan)| (ms, gpu_plan.unwrap_or(plan)))?;
    println!(
        "decode {}{dtype}: q {q_dims:?} against caches {cache_dims:?} ({} sequences{}) on {}: \
         {milliseconds:.3} ms; wrote {}",
        if options.causal { "causal " } else { "" },
        file.cache_seqlens.len(),
        if append.is_some() { ", appending" } else { "" },
        gpu.info().name,
        args.output.display()
    );
    println!("plan: {plan}");
    Ok(ExitCode::SUCCESS)
}

/// Every check of the call, and its plan for an H200, on the host: the tensors' shapes in
/// PyTorch's layout with no memory behind them, the lengths and pages as read.
fn plan_on_host(file: &DecodeFile, options: &AttentionOptions) -> flash_attn::Result<Plan> {
    let seqlens = CacheSeqlens::host(&file.cache_seqlens)?;
    let table = file
        .block_table
        .as_ref()
        .map(|t| BlockTable::host(t.view()))
        .transpose()?;
    flash_attn::with_element!(file.tensors.dtype(), T => {
        let dims = all_dims(&file.tensors);
        let layout = |i: usize| TensorRef::<T>::layout_only(dims[i], Layout::BatchHeadSeqDim.strides(dims[i]));
        let cache = KvCache {
            seqlens: &seqlens,
            block_table: table.as_ref(),
            append: (dims.len() == 5).then(|| (layout(3), layout(4))),
        };
        Attention::new(layout(0), layout(1), layout(2))
            .options(*options)
            .kv_cache(cache)
            .plan(&CompiledLimits::H200)
    })
}

/// The dims of Q, the caches and any appended keys and values.
fn all_dims(tensors: &HostQkv) -> Vec<[usize; 4]> {
    fn of<T>(qkv: &Qkv<T>) -> Vec<[usize; 4]> {
        let dims = |a: &Array4<T>| {
            let (b, h, s, d) = a.dim();
            [b, h, s, d]
        };
        let mut all = vec![dims(&qkv.q), dims(&qkv.k), dims(&qkv.v)];
        if let Some((k, v)) = &qkv.appended {
            all.extend([dims(k), dims(v)]);
        }
        all
    }
    match tensors {
        HostQkv::F32(qkv) => of(qkv),
        HostQkv::F16(qkv) => of(qkv),
        HostQkv::Bf16(qkv) => of(qkv),
    }
}

/// Uploads the call, runs it (once to allocate, once timed) and writes the outputs; the time
/// and the plan the GPU made.
fn run_typed<T: SafetensorsElement>(
    gpu: &Gpu,
    args: &RunArgs,
    options: &AttentionOptions,
    file: &DecodeFile,
    qkv: &Qkv<T>,
) -> flash_attn::Result<(f32, Option<Plan>)> {
    let upload = |a: &Array4<T>| DeviceTensor::from_array(gpu, a.view(), Layout::BatchHeadSeqDim);
    let (q, k_cache, v_cache) = (upload(&qkv.q)?, upload(&qkv.k)?, upload(&qkv.v)?);
    let appended = qkv
        .appended
        .as_ref()
        .map(|(k, v)| Ok::<_, flash_attn::Error>((upload(k)?, upload(v)?)))
        .transpose()?;
    let seqlens = CacheSeqlens::new(gpu, &file.cache_seqlens)?;
    let table = file
        .block_table
        .as_ref()
        .map(|t| BlockTable::new(gpu, t.view()))
        .transpose()?;
    let cache = KvCache {
        seqlens: &seqlens,
        block_table: table.as_ref(),
        append: appended.as_ref().map(|(k, v)| (k.into(), v.into())),
    };
    let call = Attention::new(&q, &k_cache, &v_cache)
        .options(*options)
        .kv_cache(cache);
    // Appending the same keys at the same lengths again writes the same values: the timed run
    // leaves the caches as the first did.
    let mut out = call.forward(gpu)?;
    let milliseconds = gpu.time_ms(|| call.forward_into(gpu, out.tensors()).map(|_| ()))?;
    let caches = match appended {
        Some(_) => Some((k_cache.to_array(gpu)?, v_cache.to_array(gpu)?)),
        None => None,
    };
    let metadata = HashMap::from([
        ("algorithm".into(), "decode".into()),
        ("causal".into(), options.causal.to_string()),
        ("input".into(), args.input.display().to_string()),
        ("kernel".into(), out.plan.kernel_names()),
        ("plan".into(), out.plan.to_string()),
    ]);
    let output = AttentionFileOutput {
        o: out.o.to_array(gpu)?,
        logsumexp: out.stats.logsumexp(gpu)?,
        row_max_and_sum: None,
        gradients: None,
        caches,
    };
    safetensors_io::write_outputs(&args.output, &output, metadata)?;
    Ok((milliseconds, Some(out.plan)))
}
