//! Checking packed batches (`attention::packed`, flash-attn's varlen call) against the f64
//! reference, sequence by sequence, with the project's tolerance rule (`tools::check`): each
//! sequence's max |O − O_ref| is at most 2 × (the same error of standard attention computed in
//! the dtype) plus 1e-5, and L is within 1e-4 where the reference is finite and −∞ where it is
//! −∞ (a sequence without keys: O = 0, L = −∞). Outputs are poisoned (NaN) before the launch,
//! so a row the kernels forgot fails. Cases with a sliding window or soft-capping run the
//! `_varlen_local` kernels, each sequence's window at its own bottom-right corner.

use ndarray::{Array4, s};
use rand::Rng;

use crate::model::reference::{attention_in_dtype, attention_reference};
use crate::tools::check::{
    HALF_ABSOLUTE_SLACK, LOGSUMEXP_TOLERANCE, logsumexp_error, max_abs_difference, random_tensor,
    to_f64,
};
use flash_attn::attention::{Algorithm, Attention, AttentionOptions, PackedBatch};
use flash_attn::device::Gpu;
use flash_attn::dtype::{DType, Element};
use flash_attn::error::Result;
use flash_attn::tensor::{DeviceTensor, Layout};
use flash_attn::with_element;

/// A case's packed batch and its inputs drawn N(0, 1) in the case's dtype: Q, K, V and dO, on
/// the host (for the reference) and uploaded in the case's layout.
pub struct PackedInputs<T: Element> {
    pub batch: PackedBatch,
    /// Q (1, heads, total_q, d), K and V (1, heads_kv, total_k, d), dO (Q's dims).
    pub host: [Array4<T>; 4],
    pub device: [DeviceTensor<T>; 4],
}

impl<T: Element> PackedInputs<T> {
    /// Draws Q, K, V, then dO (in that order, from `rng`) for `case`, and uploads them.
    pub fn draw(gpu: &Gpu, case: &PackedCheckCase, rng: &mut impl Rng) -> Result<Self> {
        let batch = PackedBatch::from_length_pairs(&case.lengths)?;
        let [total_q, total_k] = batch.totals();
        let q_dims = [1, case.heads, total_q, case.head_dim];
        let kv_dims = [1, case.heads_kv, total_k, case.head_dim];
        let host = [q_dims, kv_dims, kv_dims, q_dims].map(|dims| random_tensor::<T>(dims, rng));
        let upload = |a: &Array4<T>| DeviceTensor::from_array(gpu, a.view(), case.layout);
        let [q, k, v, d_o] = &host;
        let device = [upload(q)?, upload(k)?, upload(v)?, upload(d_o)?];
        Ok(Self {
            batch,
            host,
            device,
        })
    }
}

/// One packed batch to check: (query length, key length) per sequence.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PackedCheckCase {
    pub heads: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
    pub lengths: Vec<(usize, usize)>,
    pub causal: bool,
    /// flash-attn's `window_size` (left, right; −1 unbounded), or none.
    pub window: Option<(i64, i64)>,
    /// Logit soft-capping (0: off).
    pub softcap: f32,
    #[serde(serialize_with = "crate::names::layout")]
    pub layout: Layout,
    #[serde(with = "crate::names")]
    pub dtype: DType,
}

impl PackedCheckCase {
    /// The call's options: the mask, the window and soft-capping.
    pub fn options(&self) -> AttentionOptions {
        AttentionOptions {
            causal: self.causal,
            window: self.window,
            softcap: self.softcap,
            ..Default::default()
        }
    }
}

/// The outcome of one case, over the whole packed output (flash-attn's varlen tests' rule: the
/// largest error of O over every sequence against twice the largest error of standard attention
/// run in the dtype). A bound per sequence would be the maximum of a few elements' rounding for
/// a short sequence, and the worst of 520 such ratios exceeds 2 by chance (call 35: 1.019, one
/// bf16 ulp at 0.5 in a 1040-sequence case), while a wrong sequence errs by far more than any
/// rounding.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PackedCheckResult {
    pub case: PackedCheckCase,
    #[serde(with = "crate::names")]
    pub algorithm: Algorithm,
    /// `max_abs_error / bound` (≤ 1 passes).
    pub worst_ratio: f64,
    /// The largest |O − O_ref| over every sequence, and its bound: twice the in-dtype baseline's
    /// largest error over every sequence, plus [`HALF_ABSOLUTE_SLACK`].
    pub max_abs_error: f64,
    pub bound: f64,
    pub logsumexp_error: f64,
    /// O elements left NaN (poisoned or computed) in any sequence.
    pub nan_outputs: usize,
    pub passed: bool,
    /// The kernels that ran (a fallback shows here).
    pub kernels: String,
}

/// The dtypes packed batches take.
pub const PACKED_DTYPES: [DType; 2] = [DType::Bf16, DType::F16];

/// `flash-attn check --packed`'s cases for one dtype: every head dim FA2-TC compiles, causal
/// both ways (each in one of the two layouts), GQA at d = 128, on a batch of mixed lengths (one
/// row, lengths that are no block's multiple, seqlen_q < seqlen_k and >, an empty sequence, one
/// without keys, a thousand rows); 48 short sequences beside a long one with MQA; and the
/// window forms at d = 64 and 128: a causal sliding window (Mistral's), a two-sided window with
/// soft-capping (Gemma 2's), and soft-capping alone.
pub fn standard_packed_cases(dtype: DType) -> Vec<PackedCheckCase> {
    let mixed = vec![
        (1, 1),
        (300, 300),
        (17, 203),
        (0, 5),
        (203, 17),
        (4, 0),
        (1000, 1000),
    ];
    let mut cases = Vec::new();
    for d in flash_attn::attention::fa2_tc_head_dims() {
        for causal in [false, true] {
            cases.push(PackedCheckCase {
                heads: 4,
                heads_kv: if d == 128 { 2 } else { 4 },
                head_dim: d as usize,
                lengths: mixed.clone(),
                causal,
                window: None,
                softcap: 0.0,
                layout: if causal {
                    Layout::BatchSeqHeadDim
                } else {
                    Layout::BatchHeadSeqDim
                },
                dtype,
            });
        }
    }
    let short: Vec<(usize, usize)> = (0..48)
        .map(|i| (i * 7 % 130, 1 + i * 13 % 300))
        .chain([(2048, 2048)])
        .collect();
    cases.push(PackedCheckCase {
        heads: 8,
        heads_kv: 1,
        head_dim: 64,
        lengths: short.clone(),
        causal: true,
        window: None,
        softcap: 0.0,
        layout: Layout::BatchSeqHeadDim,
        dtype,
    });
    // More sequences than one launch's table holds (`MAX_SEQUENCES_PER_LAUNCH`): three
    // launches, the last of 10 sequences.
    let many: Vec<(usize, usize)> = (0..520).map(|i| (i * 5 % 41, 1 + i * 11 % 70)).collect();
    for (d, window) in [(64, None), (128, Some((20, 0)))] {
        cases.push(PackedCheckCase {
            heads: 2,
            heads_kv: 1,
            head_dim: d,
            lengths: many.clone(),
            causal: true,
            window,
            softcap: 0.0,
            layout: Layout::BatchSeqHeadDim,
            dtype,
        });
    }
    for (d, heads_kv) in [(64, 4), (128, 2)] {
        for (causal, window, softcap, lengths) in [
            (true, Some((100, 0)), 0.0, &mixed),
            (false, Some((64, 32)), 30.0, &mixed),
            (true, None, 20.0, &short),
        ] {
            cases.push(PackedCheckCase {
                heads: 4,
                heads_kv,
                head_dim: d,
                lengths: lengths.clone(),
                causal,
                window,
                softcap,
                layout: Layout::BatchSeqHeadDim,
                dtype,
            });
        }
    }
    cases
}

/// One line per result.
pub fn describe_packed(r: &PackedCheckResult) -> String {
    let c = &r.case;
    let lengths = if c.lengths.len() <= 8 {
        format!("{:?}", c.lengths)
    } else {
        format!("[{} sequences]", c.lengths.len())
    };
    format!(
        "packed {:<6} {:<4} {:<4} h={} h_kv={} d={:<3} causal={:<5}{} {lengths}: err/bound \
         {:.3} (err {:.3e}, bound {:.3e}), L err {:.2e}{} → {} [{}]",
        r.algorithm.name(),
        c.dtype.name(),
        c.layout.name(),
        c.heads,
        c.heads_kv,
        c.head_dim,
        c.causal,
        scoring_words(c),
        r.worst_ratio,
        r.max_abs_error,
        r.bound,
        r.logsumexp_error,
        if r.nan_outputs > 0 {
            format!(", {} NaN", r.nan_outputs)
        } else {
            String::new()
        },
        if r.passed { "pass" } else { "FAIL" },
        r.kernels
    )
}

/// " window=(l,r)", " softcap=x", as the case asks.
fn scoring_words(c: &PackedCheckCase) -> String {
    let mut words = String::new();
    if let Some((left, right)) = c.window {
        words.push_str(&format!(" window=({left},{right})"));
    }
    if c.softcap > 0.0 {
        words.push_str(&format!(" softcap={}", c.softcap));
    }
    words
}

/// Draws inputs for `case`, runs `algorithm` on the packed batch into poisoned outputs and
/// checks every sequence against the f64 reference.
pub fn check_packed(
    gpu: &Gpu,
    algorithm: Algorithm,
    case: &PackedCheckCase,
    rng: &mut impl Rng,
) -> Result<PackedCheckResult> {
    with_element!(case.dtype, T => check_typed::<T>(gpu, algorithm, case, rng))
}

fn check_typed<T: Element>(
    gpu: &Gpu,
    algorithm: Algorithm,
    case: &PackedCheckCase,
    rng: &mut impl Rng,
) -> Result<PackedCheckResult> {
    let PackedInputs {
        batch,
        host: [q, k, v, _],
        device: [dq, dk, dv, _],
    } = PackedInputs::<T>::draw(gpu, case, rng)?;
    let options = AttentionOptions {
        algorithm,
        ..case.options()
    };
    let output = Attention::new(&dq, &dk, &dv)
        .options(options)
        .packed(&batch)
        .forward_filled(gpu, T::poison())?;
    let plan = &output.plan;
    let problem = plan.problem().expect("a forward plan");
    let scale = problem.softmax_scale as f64;
    let scoring = problem.scoring();
    let o = to_f64(&output.o.to_array(gpu)?);
    let l = output
        .stats
        .logsumexp(gpu)?
        .index_axis_move(ndarray::Axis(0), 0);
    let (q64, k64, v64) = (to_f64(&q), to_f64(&k), to_f64(&v));
    let mut result = PackedCheckResult {
        case: case.clone(),
        algorithm,
        worst_ratio: 0.0,
        max_abs_error: 0.0,
        bound: 0.0,
        logsumexp_error: 0.0,
        nan_outputs: 0,
        passed: true,
        kernels: plan.kernel_names(),
    };
    let mut baseline_error = 0.0f64;
    for b in 0..batch.sequences() {
        let (queries, keys) = batch.rows(b);
        if queries.is_empty() {
            continue;
        }
        let got_o = o.slice(s![.., .., queries.clone(), ..]);
        let got_l = l.slice(s![.., queries.clone()]);
        let (error, nan, l_error) = if keys.is_empty() {
            // No key: O = 0 and L = −∞ exactly.
            let error = got_o.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            let nan = got_o.iter().filter(|x| x.is_nan()).count();
            let l_error = logsumexp_error(
                std::iter::repeat_n(&f64::NEG_INFINITY, got_l.len()),
                got_l.iter(),
            );
            (error, nan, l_error)
        } else {
            let (sq, sk, sv) = (
                q64.slice(s![.., .., queries.clone(), ..]),
                k64.slice(s![.., .., keys.clone(), ..]),
                v64.slice(s![.., .., keys, ..]),
            );
            let reference = attention_reference(sq, sk, sv, scoring, scale);
            let all: Vec<usize> = (0..queries.len()).collect();
            let in_dtype = attention_in_dtype::<T>(sq, sk, sv, scoring, scale, &all);
            let baseline = max_abs_difference(in_dtype.view(), reference.o.view()).0;
            baseline_error = baseline_error.max(baseline);
            let (error, nan) = max_abs_difference(got_o, reference.o.view());
            let l_error = logsumexp_error(reference.logsumexp.iter(), got_l.iter());
            (error, nan, l_error)
        };
        result.nan_outputs += nan;
        result.logsumexp_error = result.logsumexp_error.max(l_error);
        result.max_abs_error = result.max_abs_error.max(error);
    }
    result.bound = 2.0 * baseline_error + HALF_ABSOLUTE_SLACK;
    result.worst_ratio = result.max_abs_error / result.bound;
    result.passed = result.nan_outputs == 0
        && result.worst_ratio <= 1.0
        && result.logsumexp_error <= LOGSUMEXP_TOLERANCE;
    Ok(result)
}
