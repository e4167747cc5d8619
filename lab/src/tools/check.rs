//! Checking kernels against the f64 reference, with the tolerance rule of FlashAttention's own
//! test suite.
//!
//! - f32: relative error (max |O − O_ref| / max |O_ref|) ≤ 1e-5.
//! - f16, bf16: max |O − O_ref| ≤ 2 × (the same error of standard attention computed in that dtype,
//!   inputs and P rounded to it) + 1e-5.
//! - L within 1e-4 absolute where the reference is finite, and −∞ where it is −∞.
//!
//! Inputs are fresh N(0, 1) draws; outputs are poisoned (NaN) before the launch, so an element the
//! kernel did not write fails the check.

use ndarray::{Array3, Array4, ArrayView4, Axis};
use rand::Rng;
use rand_distr::{Distribution, StandardNormal};

use crate::model::reference::{attention_in_dtype, attention_reference_rows};
use flash_attn::attention::{Algorithm, Attention, AttentionOptions, Problem};
use flash_attn::device::Gpu;
use flash_attn::dtype::{DType, Element};
use flash_attn::error::Result;
use flash_attn::tensor::{DeviceTensor, Layout};
use flash_attn::with_element;

/// Relative-error bound for f32.
pub const F32_RELATIVE_TOLERANCE: f64 = 1e-5;
/// Absolute slack added to the f16/bf16 bound.
pub const HALF_ABSOLUTE_SLACK: f64 = 1e-5;
/// Bound on |L − L_ref| where L_ref is finite.
pub const LOGSUMEXP_TOLERANCE: f64 = 1e-4;

/// One problem to check: shapes, dtype, mask, soft-capping.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct CheckProblem {
    pub batch: usize,
    /// Query heads.
    pub heads: usize,
    /// K/V heads: `heads`, or a divisor of it (GQA; 1 is MQA).
    pub heads_kv: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub head_dim: usize,
    pub causal: bool,
    /// flash-attn's `window_size` (`AttentionOptions::window`); `None`: no window.
    pub window: Option<(i64, i64)>,
    /// 0: no soft-capping.
    pub softcap: f32,
    #[serde(with = "crate::names")]
    pub dtype: DType,
}

impl CheckProblem {
    /// `batch` × `heads` (as many K/V heads) of `seqlen_q` × `seqlen_k` at `head_dim`, with the
    /// causal mask or not, no window and no soft-capping.
    pub fn new(
        batch: usize,
        heads: usize,
        (seqlen_q, seqlen_k): (usize, usize),
        head_dim: usize,
        causal: bool,
        dtype: DType,
    ) -> Self {
        Self {
            batch,
            heads,
            heads_kv: heads,
            seqlen_q,
            seqlen_k,
            head_dim,
            causal,
            window: None,
            softcap: 0.0,
            dtype,
        }
    }

    /// Whether the problem has a window or soft-capping, which only `fa2-tc`, `fa3` (f16/bf16 at
    /// their head dims) and `standard` take.
    pub fn has_window_or_softcap(&self) -> bool {
        self.window.is_some_and(|w| w != (-1, -1)) || self.softcap != 0.0
    }
}

/// The outcome of one (problem, algorithm, layout).
#[derive(Clone, Debug, serde::Serialize)]
pub struct CheckResult {
    pub problem: CheckProblem,
    #[serde(with = "crate::names")]
    pub algorithm: Algorithm,
    #[serde(serialize_with = "crate::names::layout")]
    pub layout: Layout,
    pub max_abs_error: f64,
    /// max |O − O_ref| / max |O_ref|.
    pub relative_error: f64,
    /// For f16/bf16: the error of standard attention in that dtype (the tolerance's base).
    pub baseline_error: Option<f64>,
    /// The bound max_abs_error must meet.
    pub bound: f64,
    pub logsumexp_error: f64,
    /// Outputs that are NaN (or left poisoned) where the reference is a number.
    pub nan_outputs: usize,
    /// Query rows compared with the reference (all of them up to [`FULL_CHECK_ROWS`]).
    pub rows_compared: usize,
    pub passed: bool,
    /// The kernels that ran (the plan's, `+`-joined): a fallback shows here.
    pub kernels: String,
}

impl CheckResult {
    /// error / bound: ≤ 1 passes.
    pub fn ratio(&self) -> f64 {
        if self.bound > 0.0 {
            self.max_abs_error / self.bound
        } else {
            f64::INFINITY
        }
    }
}

/// Up to this many query rows, every row is compared with the reference; beyond, a sample (the
/// first and last [`EDGE_ROWS`] and random rows between, [`FULL_CHECK_ROWS`] in all) keeps the
/// f64 reference affordable for seqlen in the thousands. Every output element is still checked
/// for having been written.
pub const FULL_CHECK_ROWS: usize = 1024;
/// Rows at each end of the sequence always compared (block tails, the causal diagonal's corners).
pub const EDGE_ROWS: usize = 128;

/// The query rows to compare: all, or a sorted sample (see [`FULL_CHECK_ROWS`]).
pub fn rows_to_compare(seqlen_q: usize, rng: &mut impl Rng) -> Vec<usize> {
    if seqlen_q <= FULL_CHECK_ROWS {
        return (0..seqlen_q).collect();
    }
    let middle = EDGE_ROWS..seqlen_q - EDGE_ROWS;
    let mut rows: Vec<usize> = (0..EDGE_ROWS)
        .chain(seqlen_q - EDGE_ROWS..seqlen_q)
        .collect();
    rows.extend(
        rand::seq::index::sample(rng, middle.len(), FULL_CHECK_ROWS - 2 * EDGE_ROWS)
            .into_iter()
            .map(|i| middle.start + i),
    );
    rows.sort_unstable();
    rows
}

/// Draws fresh inputs for `problem`, computes the reference once, and checks every algorithm in
/// every layout against it.
pub fn check_problem(
    gpu: &Gpu,
    problem: CheckProblem,
    algorithms: &[Algorithm],
    layouts: &[Layout],
    rng: &mut impl Rng,
) -> Result<Vec<CheckResult>> {
    check_problem_with(
        gpu,
        problem,
        algorithms,
        layouts,
        &AttentionOptions::default(),
        rng,
    )
}

/// [`check_problem`] with block-size overrides from `overrides` (its `causal`, `window` and
/// `softcap` are the problem's).
pub fn check_problem_with(
    gpu: &Gpu,
    problem: CheckProblem,
    algorithms: &[Algorithm],
    layouts: &[Layout],
    overrides: &AttentionOptions,
    rng: &mut impl Rng,
) -> Result<Vec<CheckResult>> {
    let options = AttentionOptions {
        causal: problem.causal,
        window: problem.window,
        softcap: problem.softcap,
        ..*overrides
    };
    with_element!(problem.dtype, T => {
        check_typed::<T>(gpu, problem, algorithms, layouts, &options, rng)
    })
}

/// N(0, 1) values rounded to `T`, shape (batch, heads, seqlen, head_dim).
pub fn random_tensor<T: Element>(dims: [usize; 4], rng: &mut impl Rng) -> Array4<T> {
    Array4::from_shape_simple_fn(dims, || T::from_f64(StandardNormal.sample(rng)))
}

/// Elementwise conversion to f64.
pub fn to_f64<T: Element>(a: &Array4<T>) -> Array4<f64> {
    a.mapv(T::to_f64)
}

fn check_typed<T: Element>(
    gpu: &Gpu,
    p: CheckProblem,
    algorithms: &[Algorithm],
    layouts: &[Layout],
    options: &AttentionOptions,
    rng: &mut impl Rng,
) -> Result<Vec<CheckResult>> {
    let q_dims = [p.batch, p.heads, p.seqlen_q, p.head_dim];
    let kv_dims = [p.batch, p.heads_kv, p.seqlen_k, p.head_dim];
    let (q, k, v) = (
        random_tensor::<T>(q_dims, rng),
        random_tensor::<T>(kv_dims, rng),
        random_tensor::<T>(kv_dims, rng),
    );
    let (q64, k64, v64) = (to_f64(&q), to_f64(&k), to_f64(&v));
    let problem = Problem::new(q_dims, kv_dims, kv_dims, options)?;
    let scale = problem.softmax_scale as f64;
    let rows = rows_to_compare(p.seqlen_q, rng);
    let scoring = problem.scoring();
    let reference =
        attention_reference_rows(q64.view(), k64.view(), v64.view(), scoring, scale, &rows);
    let baseline_error = (T::DTYPE != DType::F32).then(|| {
        let in_dtype =
            attention_in_dtype::<T>(q64.view(), k64.view(), v64.view(), scoring, scale, &rows);
        max_abs_difference(in_dtype.view(), reference.o.view()).0
    });
    let max_ref = reference.o.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let bound = match baseline_error {
        Some(base) => 2.0 * base + HALF_ABSOLUTE_SLACK,
        None => F32_RELATIVE_TOLERANCE * max_ref.max(f64::MIN_POSITIVE),
    };

    let mut results = Vec::new();
    for &layout in layouts {
        let (dq, dk, dv) = (
            DeviceTensor::from_array(gpu, q.view(), layout)?,
            DeviceTensor::from_array(gpu, k.view(), layout)?,
            DeviceTensor::from_array(gpu, v.view(), layout)?,
        );
        for &algorithm in algorithms {
            let (o, lse, kernels) = run_poisoned(gpu, algorithm, [&dq, &dk, &dv], options)?;
            // Every output element must have been written (no NaN poison left: the inputs are
            // finite, so the reference has no NaN); the compared rows must also be accurate.
            let unwritten = o.iter().filter(|x| x.is_nan()).count();
            let (o, lse) = (o.select(Axis(2), &rows), lse.select(Axis(2), &rows));
            let (max_abs_error, nan_outputs) = max_abs_difference(o.view(), reference.o.view());
            let nan_outputs = nan_outputs.max(unwritten);
            let logsumexp_error = logsumexp_error(reference.logsumexp.iter(), lse.iter());
            let passed = nan_outputs == 0
                && max_abs_error <= bound
                && logsumexp_error <= LOGSUMEXP_TOLERANCE;
            results.push(CheckResult {
                problem: p,
                algorithm,
                layout,
                max_abs_error,
                relative_error: max_abs_error / max_ref.max(f64::MIN_POSITIVE),
                baseline_error,
                bound,
                logsumexp_error,
                nan_outputs,
                rows_compared: rows.len(),
                passed,
                kernels,
            });
        }
    }
    Ok(results)
}

/// Runs `algorithm` on device tensors into an output poisoned with NaN beforehand, and returns O
/// (as f64, logical (batch, heads, seqlen_q, d)), L (m + ln ℓ for FA1) and the kernels that ran.
pub fn run_poisoned<T: Element>(
    gpu: &Gpu,
    algorithm: Algorithm,
    [q, k, v]: [&DeviceTensor<T>; 3],
    options: &AttentionOptions,
) -> Result<(Array4<f64>, Array3<f32>, String)> {
    let options = AttentionOptions {
        algorithm,
        ..*options
    };
    let output = Attention::new(q, k, v)
        .options(options)
        .forward_filled(gpu, T::poison())?;
    gpu.synchronize()?;
    let o = to_f64(&output.o.to_array(gpu)?);
    let lse = output.stats.logsumexp(gpu)?;
    let plan = output.plan;
    Ok((o, lse, plan.kernel_names()))
}

/// The largest |L − L_ref| where L_ref is finite; infinite where L_ref is −∞ and L is not, or
/// where L is NaN.
pub(crate) fn logsumexp_error<'a>(
    reference: impl Iterator<Item = &'a f64>,
    got: impl Iterator<Item = &'a f32>,
) -> f64 {
    reference.zip(got).fold(0.0f64, |worst, (&r, &g)| {
        let err = if r.is_finite() {
            (r - g as f64).abs()
        } else if g as f64 == r {
            0.0
        } else {
            f64::INFINITY
        };
        if err.is_nan() {
            f64::INFINITY
        } else {
            worst.max(err)
        }
    })
}

/// max |a − b| over elements where both are numbers, and the count of elements where `a` is NaN
/// but `b` is not.
pub(crate) fn max_abs_difference(a: ArrayView4<f64>, b: ArrayView4<f64>) -> (f64, usize) {
    a.iter()
        .zip(b.iter())
        .fold((0.0f64, 0usize), |(worst, nans), (&x, &y)| {
            if x.is_nan() && !y.is_nan() {
                (worst, nans + 1)
            } else {
                (worst.max((x - y).abs()), nans)
            }
        })
}

/// One line for a result, for the CLI and tests.
pub fn describe(r: &CheckResult) -> String {
    let p = &r.problem;
    format!(
        "{:<8} {:<4} {:<4} b={} h={} h_kv={} sq={:<5} sk={:<5} d={:<3} causal={:<5}{} max_abs={:.3e} rel={:.3e} bound={:.3e} L_err={:.2e}{} {}",
        r.algorithm.name(),
        p.dtype.name(),
        r.layout.name(),
        p.batch,
        p.heads,
        p.heads_kv,
        p.seqlen_q,
        p.seqlen_k,
        p.head_dim,
        p.causal,
        scoring_words(p),
        r.max_abs_error,
        r.relative_error,
        r.bound,
        r.logsumexp_error,
        if r.nan_outputs > 0 {
            format!(" NaN/unwritten={}", r.nan_outputs)
        } else {
            String::new()
        },
        if r.passed { "ok" } else { "FAIL" }
    )
}

/// " window=(l,r)" and " softcap=x" where the problem has them.
pub fn scoring_words(p: &CheckProblem) -> String {
    let mut words = String::new();
    if let Some((left, right)) = p.window {
        words.push_str(&format!(" window=({left},{right})"));
    }
    if p.softcap != 0.0 {
        words.push_str(&format!(" softcap={}", p.softcap));
    }
    words
}
