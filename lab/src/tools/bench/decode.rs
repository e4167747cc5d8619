//! The decode benchmark: one query token per sequence against a KV cache at ANCHORS.md's shapes
//! (bf16, d = 128, 32 query heads on 8 KV heads, KV lengths 4k–128k, batch 1–64): time per call
//! and K+V bytes read per second, beside PyTorch's SDPA backends timed by
//! `lab/scripts/torch_decode_bench.py` in the same schema ([`DecodeRecord`]).

use std::collections::BTreeMap;

use flash_attn::attention::{
    Attention, AttentionOptions, CacheSeqlens, ForwardTensors, KvCache, Pass, Statistics, Workspace,
};
use flash_attn::device::Gpu;
use flash_attn::dtype::{DType, Element};
use flash_attn::error::{Error, Result};
use flash_attn::tensor::DeviceRows;
use flash_attn::tensor::{DeviceTensor, Layout};
use flash_attn::with_element;

/// One decode shape: `batch` sequences of `kv_len` cached keys.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct DecodeShape {
    pub kv_len: usize,
    pub batch: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
    pub q_tokens: usize,
}

impl DecodeShape {
    /// Bytes of K and V one call reads.
    pub fn kv_bytes(&self, element_bytes: usize) -> usize {
        2 * self.batch * self.kv_len * self.heads_kv * self.head_dim * element_bytes
    }
}

/// ANCHORS.md's decode shapes (`quick`: the three corners).
pub fn anchor_shapes(quick: bool) -> Vec<DecodeShape> {
    let points: &[(usize, usize)] = if quick {
        &[(4096, 1), (32_768, 16), (131_072, 1)]
    } else {
        &[
            (4096, 1),
            (4096, 16),
            (4096, 64),
            (32_768, 1),
            (32_768, 16),
            (32_768, 64),
            (131_072, 1),
            (131_072, 16),
        ]
    };
    points
        .iter()
        .map(|&(kv_len, batch)| DecodeShape {
            kv_len,
            batch,
            heads_q: 32,
            heads_kv: 8,
            head_dim: 128,
            q_tokens: 1,
        })
        .collect()
}

/// One timed implementation at one shape (ours, or a PyTorch backend from the script).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct DecodeRecord {
    pub implementation: String,
    #[serde(with = "crate::names")]
    pub dtype: DType,
    pub shape: DecodeShape,
    pub median_us: Option<f64>,
    /// K+V bytes read per second, GB/s.
    pub kv_gbs: Option<f64>,
    /// Our plan's one-line summary (kernels, splits).
    #[serde(default)]
    pub plan: Option<String>,
    pub error: Option<String>,
}

/// One way of running our decode: the plan's own choices, or a split count or merge forced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeVariant {
    pub splits: Option<u32>,
    pub one_launch: Option<bool>,
}

impl DecodeVariant {
    /// The plan's choices.
    pub const PLAN: Self = Self {
        splits: None,
        one_launch: None,
    };

    /// The implementation name in the records: `decode` for the plan's choices (the one the
    /// table sets against cuDNN), else `decode-two-launch`, `decode-one-launch`, `decode-s<splits>`
    /// or both, e.g. `decode-s16-one-launch`.
    pub fn name(&self) -> String {
        let mut name = String::from("decode");
        if let Some(splits) = self.splits {
            name.push_str(&format!("-s{splits}"));
        }
        match self.one_launch {
            Some(true) => name.push_str("-one-launch"),
            Some(false) => name.push_str("-two-launch"),
            None => {}
        }
        name
    }
}

impl std::str::FromStr for DecodeVariant {
    type Err = Error;

    /// `two-launch`, `one-launch`, `s<N>` (N splits), or a split count and a merge joined by
    /// `+` (`s16+one-launch`).
    fn from_str(text: &str) -> Result<Self> {
        let mut variant = Self::PLAN;
        for part in text.split('+') {
            match part.trim() {
                "two-launch" => variant.one_launch = Some(false),
                "one-launch" => variant.one_launch = Some(true),
                part => {
                    let splits = part.strip_prefix('s').and_then(|n| n.parse().ok());
                    variant.splits = Some(splits.ok_or_else(|| {
                        Error::invalid(
                            "decode_variants",
                            text,
                            "two-launch, one-launch, s<N> (N splits), or a split count and a \
                             merge joined by +",
                        )
                    })?);
                }
            }
        }
        Ok(variant)
    }
}

/// Times our decode at `shape` as `variant`: the median of back-to-back calls (CUDA events
/// between them), rotating over enough caches that each call reads from HBM, not L2. Q and the
/// caches hold N(0, 1) values, as PyTorch's side does (the caches a drawn block repeated:
/// [`random_cache`]).
pub fn time_decode(
    gpu: &Gpu,
    dtype: DType,
    shape: DecodeShape,
    variant: DecodeVariant,
    repeats: usize,
) -> DecodeRecord {
    let result = with_element!(dtype, T => time_typed::<T>(gpu, shape, variant, repeats));
    match result {
        Ok((median_us, plan)) => DecodeRecord {
            implementation: variant.name(),
            dtype,
            shape,
            median_us: Some(median_us),
            kv_gbs: Some(shape.kv_bytes(dtype.size_bytes()) as f64 / (median_us * 1e3)),
            plan: Some(plan),
            error: None,
        },
        Err(e) => DecodeRecord {
            implementation: variant.name(),
            dtype,
            shape,
            median_us: None,
            kv_gbs: None,
            plan: None,
            error: Some(e.to_string()),
        },
    }
}

/// The shapes of `shapes` that `selection` names as `KEYSxBATCH` (e.g. `131072x16`), in
/// `shapes`' order; all of them when `selection` is empty. A name that is not one of them is an
/// error listing those that are.
pub fn select_shapes(shapes: Vec<DecodeShape>, selection: &[String]) -> Result<Vec<DecodeShape>> {
    if selection.is_empty() {
        return Ok(shapes);
    }
    let name = |s: &DecodeShape| format!("{}x{}", s.kv_len, s.batch);
    if let Some(unknown) = selection
        .iter()
        .find(|text| !shapes.iter().any(|s| &name(s) == *text))
    {
        let allowed: Vec<String> = shapes.iter().map(name).collect();
        return Err(Error::invalid(
            "--decode-shapes",
            unknown,
            allowed.join(", "),
        ));
    }
    Ok(shapes
        .into_iter()
        .filter(|s| selection.contains(&name(s)))
        .collect())
}

/// A cache of `dims` (in `Layout::BatchSeqHeadDim`) of N(0, 1) values: a block of
/// [`RANDOM_BLOCK`] drawn values repeated over it. Drawing every value of the largest shapes'
/// 4 GB caches would take minutes on the host; a repeated block gives the kernel the same work
/// (scores of random size, the running max moving now and then), which zeros do not.
fn random_cache<T: Element>(gpu: &Gpu, dims: [usize; 4]) -> Result<DeviceTensor<T>> {
    let block = crate::tools::check::random_tensor::<T>([1, 1, 1, RANDOM_BLOCK], &mut rand::rng());
    let values: Vec<T> = block
        .iter()
        .copied()
        .cycle()
        .take(dims.iter().product())
        .collect();
    let data = gpu.upload(&values, "a decode benchmark cache")?;
    DeviceTensor::from_parts(data, dims, Layout::BatchSeqHeadDim.strides(dims))
}

/// Values drawn for [`random_cache`]: not a multiple of a head's row (128 or 64 elements), so
/// rows and heads do not repeat one another.
const RANDOM_BLOCK: usize = (1 << 20) + 7;

fn time_typed<T: Element>(
    gpu: &Gpu,
    shape: DecodeShape,
    variant: DecodeVariant,
    repeats: usize,
) -> Result<(f64, String)> {
    let bytes = shape.kv_bytes(std::mem::size_of::<T>());
    let copies = (4 * gpu.info().l2_cache_bytes).div_ceil(bytes).clamp(1, 16);
    let q_host = crate::tools::check::random_tensor::<T>(
        [shape.batch, shape.heads_q, shape.q_tokens, shape.head_dim],
        &mut rand::rng(),
    );
    let q = DeviceTensor::from_array(gpu, q_host.view(), Layout::BatchSeqHeadDim)?;
    let cache_dims = [shape.batch, shape.heads_kv, shape.kv_len, shape.head_dim];
    let caches = (0..copies)
        .map(|_| {
            Ok((
                random_cache::<T>(gpu, cache_dims)?,
                random_cache::<T>(gpu, cache_dims)?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let lengths = CacheSeqlens::new(gpu, &vec![shape.kv_len as u32; shape.batch])?;
    let options = AttentionOptions {
        causal: true,
        decode_splits: variant.splits,
        decode_one_launch: variant.one_launch,
        ..Default::default()
    };
    let cache = KvCache {
        seqlens: &lengths,
        block_table: None,
        append: None,
    };
    let call = |i: usize| {
        Attention::new(&q, &caches[i].0, &caches[i].1)
            .options(options)
            .kv_cache(cache)
    };
    let plan = call(0).plan(gpu)?;
    let mut o = DeviceTensor::filled(gpu, q.dims(), Layout::BatchSeqHeadDim, T::default())?;
    let mut lse = DeviceRows::new(gpu, plan.statistics_dims(), None, "L")?;
    let mut workspace = Workspace::new(gpu, &plan)?;
    let mut run = |i: usize| {
        let tensors = ForwardTensors {
            o: (&mut o).into(),
            stats: Statistics::LogSumExp((&mut lse).into()),
        };
        plan.run_with_workspace(gpu, &call(i), Pass::Forward(tensors), &mut workspace)
    };
    for i in 0..copies {
        run(i)?;
    }
    gpu.synchronize()?;
    let mut times = gpu.time_each_ms(repeats, |i| run(i % copies))?;
    times.sort_by(f32::total_cmp);
    Ok((times[times.len() / 2] as f64 * 1e3, plan.to_string()))
}

/// Reads the records `lab/scripts/torch_decode_bench.py` wrote.
pub fn read_decode_records(path: &std::path::Path) -> Result<Vec<DecodeRecord>> {
    #[derive(serde::Deserialize)]
    struct File {
        records: Vec<DecodeRecord>,
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::File(format!("cannot read {}: {e}", path.display())))?;
    let file: File = serde_json::from_str(&text)
        .map_err(|e| Error::File(format!("{}: not decode records: {e}", path.display())))?;
    Ok(file.records)
}

/// One row per shape: each implementation's µs and GB/s, and ours against PyTorch's cuDNN.
pub fn decode_table(records: &[DecodeRecord]) -> String {
    let mut names: Vec<&str> = records.iter().map(|r| r.implementation.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    // Ours first.
    names.sort_by_key(|n| *n != "decode");
    let mut by_shape: BTreeMap<DecodeShape, BTreeMap<&str, &DecodeRecord>> = BTreeMap::new();
    for r in records {
        by_shape
            .entry(r.shape)
            .or_default()
            .insert(r.implementation.as_str(), r);
    }
    let mut out = String::from("| KV length | batch | K+V bytes |");
    for name in &names {
        out.push_str(&format!(" {name} |"));
    }
    out.push_str(" decode / cuDNN |\n|---|---|---|");
    out.push_str(&"---|".repeat(names.len() + 1));
    out.push('\n');
    for (shape, row) in &by_shape {
        out.push_str(&format!(
            "| {} | {} | {:.0} MB |",
            shape.kv_len,
            shape.batch,
            shape.kv_bytes(2) as f64 / 1e6
        ));
        for name in &names {
            let cell = match row.get(name) {
                Some(DecodeRecord {
                    median_us: Some(us),
                    kv_gbs: Some(gbs),
                    ..
                }) => format!("{us:.1} µs, {gbs:.0} GB/s"),
                Some(DecodeRecord { error: Some(e), .. }) => {
                    format!("— ({})", e.chars().take(40).collect::<String>())
                }
                _ => "—".into(),
            };
            out.push_str(&format!(" {cell} |"));
        }
        let ratio = match (row.get("decode"), row.get("torch-cudnn")) {
            (Some(ours), Some(cudnn)) => ours
                .kv_gbs
                .zip(cudnn.kv_gbs)
                .map_or("—".into(), |(a, b)| format!("{:.2}×", a / b)),
            _ => "—".into(),
        };
        out.push_str(&format!(" {ratio} |\n"));
    }
    out
}
