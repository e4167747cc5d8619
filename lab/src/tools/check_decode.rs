//! Checking the decode kernels against the f64 reference, with the project's tolerance rule
//! (`tools::check`): max |O − O_ref| ≤ 2 × (the same error of standard attention computed in the
//! dtype) + 1e-5, L within 1e-4 where the reference is finite and −∞ where it is −∞; outputs
//! poisoned (NaN) before the launch, so a row the kernels forgot fails. Keys appended by the call
//! are checked in the cache too (bit for bit). A case may call again on the same workspace with
//! other split counts (`DecodeCheckCase::reruns`), each call checked: the one-launch merge's
//! counters must be back at zero after every call.

use ndarray::{Array2, Array4, ArrayView4};
use rand::Rng;
use rand::seq::SliceRandom;

use flash_attn::attention::{
    Attention, AttentionOptions, BlockTable, CacheSeqlens, ForwardTensors, KvCache, Pass, Plan,
    Statistics, Workspace,
};
use flash_attn::device::Gpu;
use flash_attn::dtype::{DType, Element};
use flash_attn::error::Result;
use flash_attn::tensor::{DeviceTensor, Layout};
use flash_attn::with_element;

use crate::model::decode_reference::{DecodeCase, decode_in_dtype, decode_reference};
use crate::tools::check::{HALF_ABSOLUTE_SLACK, LOGSUMEXP_TOLERANCE, random_tensor};
use flash_attn::tensor::DeviceRows;

/// One decode problem to check.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct DecodeCheckCase {
    pub heads_q: usize,
    pub heads_kv: usize,
    pub q_tokens: usize,
    pub head_dim: usize,
    /// Keys in each sequence's cache before the call (the batch is its length).
    pub cache_seqlens: Vec<usize>,
    /// Keys appended by the call (0: none).
    pub new_tokens: usize,
    /// Page size of a paged cache (None: contiguous).
    pub page_size: Option<usize>,
    pub causal: bool,
    #[serde(with = "crate::names")]
    pub dtype: DType,
    /// Split count override (None: the plan's).
    pub splits: Option<u32>,
    /// Merge override (`DecodeOptions::one_launch`; None: the plan's).
    pub one_launch: Option<bool>,
    /// Further calls after the first, in order, on the same workspace: each one's split count
    /// override (None: the plan's).
    pub reruns: Vec<Option<u32>>,
}

impl DecodeCheckCase {
    /// The case with default options: causal, the plan's splits and merge, one call.
    pub fn new(
        dtype: DType,
        heads: (usize, usize),
        q_tokens: usize,
        head_dim: usize,
        cache_seqlens: &[usize],
        page_size: Option<usize>,
    ) -> Self {
        Self {
            heads_q: heads.0,
            heads_kv: heads.1,
            q_tokens,
            head_dim,
            cache_seqlens: cache_seqlens.to_vec(),
            new_tokens: 0,
            page_size,
            causal: true,
            dtype,
            splits: None,
            one_launch: None,
            reruns: Vec::new(),
        }
    }

    /// The options of call `call` (0: the first; then `reruns`).
    fn options(&self, call: usize) -> AttentionOptions {
        AttentionOptions {
            causal: self.causal,
            decode_splits: if call == 0 {
                self.splits
            } else {
                self.reruns[call - 1]
            },
            decode_one_launch: self.one_launch,
            ..Default::default()
        }
    }
}

/// The dtypes the decode kernels take.
pub const DECODE_DTYPES: [DType; 2] = [DType::Bf16, DType::F16];

/// `flash-attn check --decode`'s cases for one dtype: a compact cut of the GPU tests' grid that
/// reaches every decode path once. Both head dims, GQA ratios 1, 4 and 32 (MQA), 1, 4 and 16
/// query tokens, contiguous and paged caches (pages of 16 and 256). One batch mixes lengths 0,
/// 1, 17, a non-multiple of the split and a few thousand. Appending in the same call, causal off
/// with several tokens, a forced single split (the direct path) and many splits, and one 128k
/// cache.
pub fn standard_decode_cases(dtype: DType) -> Vec<DecodeCheckCase> {
    let case = |heads, q_tokens, head_dim, lengths: &[usize], page_size| {
        DecodeCheckCase::new(dtype, heads, q_tokens, head_dim, lengths, page_size)
    };
    let mixed = [0, 1, 17, 1000, 3001];
    let mut cases = Vec::new();
    for heads in [(4, 4), (8, 2), (32, 1)] {
        for (q_tokens, head_dim, page_size) in
            [(1, 128, None), (4, 64, Some(16)), (16, 128, Some(256))]
        {
            cases.push(case(heads, q_tokens, head_dim, &mixed, page_size));
        }
    }
    for (page_size, new_tokens, causal) in [(None, 4, true), (Some(32), 16, true), (None, 0, false)]
    {
        cases.push(DecodeCheckCase {
            new_tokens,
            causal,
            ..case((8, 2), 16, 128, &[0, 2, 63, 65, 700], page_size)
        });
    }
    for splits in [1, 64] {
        cases.push(DecodeCheckCase {
            splits: Some(splits),
            ..case((32, 8), 2, 128, &[5000, 64, 1, 0], Some(64))
        });
    }
    // Both merges at many splits; then one workspace called with 7, 64, 7 and the plan's
    // splits in a row (the one-launch counters reset by each call).
    for one_launch in [false, true] {
        cases.push(DecodeCheckCase {
            splits: Some(33),
            one_launch: Some(one_launch),
            ..case((32, 8), 1, 64, &[4096, 700, 0], None)
        });
    }
    cases.push(DecodeCheckCase {
        splits: Some(7),
        one_launch: Some(true),
        reruns: vec![Some(64), Some(7), None],
        ..case((8, 2), 4, 128, &[3001, 17, 0, 1000], Some(16))
    });
    cases.push(case((32, 8), 1, 128, &[131_072], None));
    cases
}

/// `flash-attn check --decode --shapes sanitizer`'s cases for one dtype: short caches, so that
/// compute-sanitizer (memcheck, racecheck) gets through in seconds, down every decode path: one
/// launch over several row tiles and paged, called again with other split counts on one
/// workspace; two launches; one split; appends; a sequence with no key in each batch.
pub fn sanitizer_decode_cases(dtype: DType) -> Vec<DecodeCheckCase> {
    let lengths = [300, 17, 0, 130];
    vec![
        DecodeCheckCase {
            splits: Some(3),
            one_launch: Some(true),
            reruns: vec![Some(2), Some(1), None, Some(3)],
            ..DecodeCheckCase::new(dtype, (32, 2), 2, 128, &lengths, Some(16))
        },
        DecodeCheckCase {
            splits: Some(3),
            one_launch: Some(false),
            ..DecodeCheckCase::new(dtype, (8, 2), 1, 128, &lengths, None)
        },
        DecodeCheckCase {
            new_tokens: 4,
            ..DecodeCheckCase::new(dtype, (4, 4), 4, 64, &lengths, None)
        },
    ]
}

/// The outcome of one case.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DecodeCheckResult {
    pub case: DecodeCheckCase,
    pub max_abs_error: f64,
    pub baseline_error: f64,
    pub bound: f64,
    pub logsumexp_error: f64,
    /// O or L elements that are NaN (or left poisoned) where the reference is a number, or L
    /// finite where the reference is −∞ (and the reverse).
    pub bad_outputs: usize,
    /// Appended cache elements that differ from the new keys and values.
    pub append_mismatches: usize,
    pub passed: bool,
    /// The plans' one-line summaries (one per call, joined by " then ").
    pub plan: String,
}

impl DecodeCheckResult {
    pub fn ratio(&self) -> f64 {
        self.max_abs_error / self.bound
    }
}

/// One line per result.
pub fn describe_decode(r: &DecodeCheckResult) -> String {
    let c = &r.case;
    format!(
        "{} heads {}/{} tokens {} d {} lengths {:?}+{} {} causal={} splits={:?}{}{}: err {:.3e} \
         (bound {:.3e}), L err {:.2e}, bad {}, append mismatches {} → {} [{}]",
        c.dtype,
        c.heads_q,
        c.heads_kv,
        c.q_tokens,
        c.head_dim,
        summary(&c.cache_seqlens),
        c.new_tokens,
        c.page_size
            .map_or("contiguous".to_string(), |p| format!("paged {p}")),
        c.causal,
        c.splits,
        c.one_launch
            .map_or(String::new(), |one| format!(" one_launch={one}")),
        if c.reruns.is_empty() {
            String::new()
        } else {
            format!(" then splits {:?}", c.reruns)
        },
        r.max_abs_error,
        r.bound,
        r.logsumexp_error,
        r.bad_outputs,
        r.append_mismatches,
        if r.passed { "pass" } else { "FAIL" },
        r.plan
    )
}

fn summary(lengths: &[usize]) -> String {
    if lengths.len() <= 6 {
        format!("{lengths:?}")
    } else {
        format!(
            "[{} sequences, max {}]",
            lengths.len(),
            lengths.iter().max().unwrap_or(&0)
        )
    }
}

/// Draws inputs for `case`, runs the decode call on the GPU and checks it.
pub fn check_decode(
    gpu: &Gpu,
    case: &DecodeCheckCase,
    rng: &mut impl Rng,
) -> Result<DecodeCheckResult> {
    with_element!(case.dtype, T => check_typed::<T>(gpu, case, rng))
}

/// The host side of one case: inputs rounded to T (as f64), the cache geometry and table.
struct HostCase {
    q: Array4<f64>,
    k_cache: Array4<f64>,
    v_cache: Array4<f64>,
    k_new: Array4<f64>,
    v_new: Array4<f64>,
    table: Option<Array2<u32>>,
}

fn rounded<T: Element>(dims: [usize; 4], rng: &mut impl Rng) -> Array4<f64> {
    random_tensor::<T>(dims, rng).mapv(|x| x.to_f64())
}

fn to_dtype<T: Element>(a: &Array4<f64>) -> Array4<T> {
    a.mapv(T::from_f64)
}

fn check_typed<T: Element>(
    gpu: &Gpu,
    case: &DecodeCheckCase,
    rng: &mut impl Rng,
) -> Result<DecodeCheckResult> {
    let batch = case.cache_seqlens.len();
    let d = case.head_dim;
    let seqlens: Vec<usize> = case
        .cache_seqlens
        .iter()
        .map(|l| l + case.new_tokens)
        .collect();
    let longest = seqlens.iter().copied().max().unwrap_or(0).max(1);
    // A capacity that is not a multiple of the step, so the cache's end is exercised too.
    let capacity = longest + 7;
    let (cache_dims, table) = match case.page_size {
        None => ([batch, case.heads_kv, capacity, d], None),
        Some(page_size) => {
            let width = capacity.div_ceil(page_size);
            let pages = batch * width + 3;
            let mut order: Vec<u32> = (0..pages as u32).collect();
            order.shuffle(rng);
            let table = Array2::from_shape_fn((batch, width), |(b, i)| order[b * width + i]);
            ([pages, case.heads_kv, page_size, d], Some(table))
        }
    };
    let new_dims = [batch, case.heads_kv, case.new_tokens.max(1), d];
    let host = HostCase {
        q: rounded::<T>([batch, case.heads_q, case.q_tokens, d], rng),
        k_cache: rounded::<T>(cache_dims, rng),
        v_cache: rounded::<T>(cache_dims, rng),
        k_new: rounded::<T>(new_dims, rng),
        v_new: rounded::<T>(new_dims, rng),
        table,
    };
    // flash-attn's layouts: (batch, seqlen, heads, d) for Q, the cache and the new keys.
    let layout = Layout::BatchSeqHeadDim;
    let upload = |a: &Array4<f64>| DeviceTensor::from_array(gpu, to_dtype::<T>(a).view(), layout);
    let (q, k_cache, v_cache) = (
        upload(&host.q)?,
        upload(&host.k_cache)?,
        upload(&host.v_cache)?,
    );
    let (k_new, v_new) = (upload(&host.k_new)?, upload(&host.v_new)?);
    let lengths: Vec<u32> = case.cache_seqlens.iter().map(|&l| l as u32).collect();
    let cache_seqlens = CacheSeqlens::new(gpu, &lengths)?;
    let block_table = host
        .table
        .as_ref()
        .map(|t| BlockTable::new(gpu, t.view()))
        .transpose()?;
    let cache = KvCache {
        seqlens: &cache_seqlens,
        block_table: block_table.as_ref(),
        append: (case.new_tokens > 0).then(|| ((&k_new).into(), (&v_new).into())),
    };
    let call = |i: usize| {
        Attention::new(&q, &k_cache, &v_cache)
            .options(case.options(i))
            .kv_cache(cache)
    };
    let plans = (0..=case.reruns.len())
        .map(|i| call(i).plan(gpu))
        .collect::<Result<Vec<Plan>>>()?;
    let mut workspace = Workspace::covering(gpu, &plans)?;
    let mut o = DeviceTensor::filled(gpu, q.dims(), layout, T::poison())?;
    let mut lse = DeviceRows::new(gpu, plans[0].statistics_dims(), None, "L")?;
    let mut calls = Vec::new();
    for (i, plan) in plans.iter().enumerate() {
        o.fill(gpu, T::poison())?;
        lse.fill(gpu, f32::NAN)?;
        let tensors = ForwardTensors {
            o: (&mut o).into(),
            stats: Statistics::LogSumExp((&mut lse).into()),
        };
        plan.run_with_workspace(gpu, &call(i), Pass::Forward(tensors), &mut workspace)?;
        calls.push((o.to_array(gpu)?, lse.to_array(gpu)?));
    }

    // The cache as the call should have left it: the new keys at each sequence's end.
    let (mut k_expected, mut v_expected) = (host.k_cache.clone(), host.v_cache.clone());
    let cache_index = |b: usize, h: usize, key: usize| match (&host.table, case.page_size) {
        (Some(table), Some(page_size)) => {
            (table[[b, key / page_size]] as usize, h, key % page_size)
        }
        _ => (b, h, key),
    };
    for b in 0..batch {
        for h in 0..case.heads_kv {
            for i in 0..case.new_tokens {
                let (page, head, row) = cache_index(b, h, case.cache_seqlens[b] + i);
                for x in 0..d {
                    k_expected[[page, head, row, x]] = host.k_new[[b, h, i, x]];
                    v_expected[[page, head, row, x]] = host.v_new[[b, h, i, x]];
                }
            }
        }
    }
    let mut append_mismatches = 0;
    if case.new_tokens > 0 {
        for (device, expected) in [(&k_cache, &k_expected), (&v_cache, &v_expected)] {
            let written = device.to_array(gpu)?;
            append_mismatches += written
                .iter()
                .zip(expected)
                .filter(|(w, e)| w.to_f64() != **e)
                .count();
        }
    }
    let reference_case = DecodeCase {
        q: host.q.view(),
        k_cache: k_expected.view(),
        v_cache: v_expected.view(),
        seqlens: &seqlens,
        block_table: host.table.as_ref().map(|t| t.view()),
        causal: case.causal,
        scale: (1.0 / (d as f64).sqrt()),
    };
    let reference = decode_reference(&reference_case);
    let in_dtype = decode_in_dtype::<T>(&reference_case);
    let max_error = |a: ArrayView4<f64>| {
        a.iter()
            .zip(&reference.o)
            .map(|(x, r)| (x - r).abs())
            .fold(0.0f64, f64::max)
    };
    let baseline_error = max_error(in_dtype.view());
    let (mut max_abs_error, mut bad_outputs, mut logsumexp_error) = (0.0f64, 0, 0.0f64);
    for (o, logsumexp) in &calls {
        let got = o.mapv(|x| x.to_f64());
        max_abs_error = max_abs_error.max(max_error(got.view()));
        bad_outputs += got.iter().filter(|x| x.is_nan()).count();
        for (l, r) in logsumexp.iter().zip(&reference.logsumexp) {
            let l = *l as f64;
            if r.is_finite() {
                if l.is_finite() {
                    logsumexp_error = logsumexp_error.max((l - r).abs());
                } else {
                    bad_outputs += 1;
                }
            } else if l != f64::NEG_INFINITY {
                bad_outputs += 1;
            }
        }
    }
    let bound = 2.0 * baseline_error + HALF_ABSOLUTE_SLACK;
    let passed = max_abs_error <= bound
        && logsumexp_error <= LOGSUMEXP_TOLERANCE
        && bad_outputs == 0
        && append_mismatches == 0;
    Ok(DecodeCheckResult {
        case: case.clone(),
        max_abs_error,
        baseline_error,
        bound,
        logsumexp_error,
        bad_outputs,
        append_mismatches,
        passed,
        plan: plans
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" then "),
    })
}
