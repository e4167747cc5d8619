//! Checking the backward pass against the f64 reference gradients (`reference_backward`), with
//! one tolerance rule for the GPU tests, `flash-attn check --backward` and `flash-attn run`'s test:
//!
//! - f32: max |g − g_ref| ≤ 1e-4 × max(max |g_ref|, 1);
//! - f16, bf16: max |g − g_ref| ≤ 2 × (the same error of the backward computed in that dtype,
//!   `attention_backward_in_dtype`) + one unit in the last place of that dtype at max |g_ref|.
//!
//! The last term is flash-attn's own `atol` (its tests add 2·|(g_ref + 0.3 − 0.3) − g_ref|, the
//! dtype's spacing near the gradient): an output may round to the neighbour of the correctly
//! rounded value, and where the in-dtype computation happens to round luckily (tiny problems,
//! d = 1) twice its error can sit below that one step. Without it, an f32 computation rounded
//! only at the end failed the rule in 5 of 40 random d = 1 problems (an f64 experiment); with
//! it, each kernel's rounding pattern stays within 0.85 of the bound.
//!
//! per gradient (dQ, dK, dV), and every element finite (gradients are poisoned with NaN before
//! the launch, so an element no kernel wrote fails).

use ndarray::Array4;
use rand::Rng;

use flash_attn::attention::{
    Algorithm, Attention, AttentionOptions, BackwardTensors, Gradients, Plan, Problem,
    RowStatistics,
};
use flash_attn::device::Gpu;
use flash_attn::dtype::{DType, Element};
use flash_attn::error::Result;
use flash_attn::scoring::Scoring;
use flash_attn::tensor::{DeviceTensor, Layout};
use flash_attn::with_element;

use crate::model::reference_backward::{attention_backward_in_dtype, attention_backward_reference};
use crate::safetensors_io::GRADIENT_NAMES;
use crate::tools::bench::backward::BackwardVariant;
use crate::tools::check::{CheckProblem, random_tensor, scoring_words, to_f64};

/// The f32 bound, relative to the reference gradient's largest magnitude (at least 1).
pub const F32_GRADIENT_TOLERANCE: f64 = 1e-4;

/// One gradient against the reference.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct GradientCheck {
    /// "dq", "dk" or "dv".
    pub name: &'static str,
    /// max |g − g_ref| over elements.
    pub error: f64,
    /// The bound `error` must meet.
    pub bound: f64,
    /// Elements of g that are not finite (NaN poison left, or an overflow).
    pub non_finite: usize,
}

impl GradientCheck {
    pub fn passed(&self) -> bool {
        self.non_finite == 0 && self.error <= self.bound
    }
}

/// The host inputs of one backward check: Q, K, V and dO in their dtype `T`.
pub struct BackwardInputs<'a, T> {
    pub q: &'a Array4<T>,
    pub k: &'a Array4<T>,
    pub v: &'a Array4<T>,
    pub d_o: &'a Array4<T>,
}

/// dQ, dK, dV (as f64, logical (batch, heads, seqlen, head_dim)) against the f64 reference of
/// `inputs`, each with its bound (this module's rule).
pub fn check_gradients<T: Element>(
    inputs: &BackwardInputs<T>,
    scoring: impl Into<Scoring>,
    scale: f64,
    got: &Gradients<Array4<f64>>,
) -> [GradientCheck; 3] {
    BackwardReference::new(inputs, scoring, scale).check(got)
}

/// The reference gradients of one set of inputs and the bound of each (this module's rule),
/// computed once to check several runs (algorithms, layouts) against.
pub struct BackwardReference {
    exact: Gradients<Array4<f64>>,
    bounds: [f64; 3],
}

impl BackwardReference {
    /// The f64 gradients of `inputs` under `scoring` (a `bool`: the causal mask or none) and,
    /// for f16/bf16, the bounds from the same computation rounded as a kernel in `T` rounds it.
    pub fn new<T: Element>(
        inputs: &BackwardInputs<T>,
        scoring: impl Into<Scoring>,
        scale: f64,
    ) -> Self {
        let scoring = scoring.into();
        let [q, k, v, d_o] = [inputs.q, inputs.k, inputs.v, inputs.d_o].map(to_f64);
        let exact =
            attention_backward_reference(q.view(), k.view(), v.view(), d_o.view(), scoring, scale)
                .gradients;
        let in_dtype = (T::DTYPE != DType::F32).then(|| {
            attention_backward_in_dtype::<T>(
                q.view(),
                k.view(),
                v.view(),
                d_o.view(),
                scoring,
                scale,
            )
            .gradients
        });
        let exact_parts = [&exact.dq, &exact.dk, &exact.dv];
        let bounds = std::array::from_fn(|i| match &in_dtype {
            Some(rounded) => {
                let rounded = [&rounded.dq, &rounded.dk, &rounded.dv];
                2.0 * max_error(rounded[i], exact_parts[i])
                    + T::DTYPE.unit_in_last_place(max_abs(exact_parts[i]))
            }
            None => F32_GRADIENT_TOLERANCE * max_abs(exact_parts[i]).max(1.0),
        });
        Self { exact, bounds }
    }

    /// dQ, dK, dV (as f64, logical (batch, heads, seqlen, head_dim)) against the reference.
    pub fn check(&self, got: &Gradients<Array4<f64>>) -> [GradientCheck; 3] {
        let got = [&got.dq, &got.dk, &got.dv];
        let exact = [&self.exact.dq, &self.exact.dk, &self.exact.dv];
        std::array::from_fn(|i| GradientCheck {
            name: GRADIENT_NAMES[i],
            error: max_error(got[i], exact[i]),
            bound: self.bounds[i],
            non_finite: got[i].iter().filter(|x| !x.is_finite()).count(),
        })
    }
}

/// The largest |a − b| over elements where both are finite.
fn max_error(a: &Array4<f64>, b: &Array4<f64>) -> f64 {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()))
}

fn max_abs(a: &Array4<f64>) -> f64 {
    a.iter().fold(0.0f64, |m, x| m.max(x.abs()))
}

/// The outcome of one backward check on the GPU.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BackwardCheckResult {
    pub problem: CheckProblem,
    pub options: BackwardOptionsRecord,
    pub gradients: [GradientCheck; 3],
    pub passed: bool,
    /// The backward plan's kernels (`+`-joined): a fallback shows here.
    pub kernels: String,
}

/// The backward's algorithm and mode, as a result records them.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct BackwardOptionsRecord {
    pub algorithm: &'static str,
    pub deterministic: bool,
}

/// Fresh N(0, 1) Q, K, V, dO for `problem`, the FA2 forward, the backward `backward` asks for
/// into NaN-poisoned gradients, and the gradients against the reference.
pub fn check_backward_problem(
    gpu: &Gpu,
    problem: CheckProblem,
    backward: &BackwardVariant,
    rng: &mut impl Rng,
) -> Result<BackwardCheckResult> {
    with_element!(problem.dtype, T => check_backward_typed::<T>(gpu, problem, backward, rng))
}

fn check_backward_typed<T: Element>(
    gpu: &Gpu,
    p: CheckProblem,
    backward: &BackwardVariant,
    rng: &mut impl Rng,
) -> Result<BackwardCheckResult> {
    let q_dims = [p.batch, p.heads, p.seqlen_q, p.head_dim];
    let kv_dims = [p.batch, p.heads_kv, p.seqlen_k, p.head_dim];
    let [q, k, v, d_o] = random_backward_tensors::<T>(q_dims, kv_dims, rng);
    let options = AttentionOptions {
        causal: p.causal,
        window: p.window,
        softcap: p.softcap,
        backward_algorithm: backward.algorithm,
        deterministic: backward.deterministic,
        ..Default::default()
    };
    let checked = Problem::new(q_dims, kv_dims, kv_dims, &options)?;
    let scale = f64::from(checked.softmax_scale);
    let layout = Layout::BatchHeadSeqDim;
    let upload = |a: &Array4<T>| DeviceTensor::from_array(gpu, a.view(), layout);
    let (q_gpu, k_gpu, v_gpu, d_o_gpu) = (upload(&q)?, upload(&k)?, upload(&v)?, upload(&d_o)?);
    let (gradients, plan) =
        run_backward_poisoned(gpu, [&q_gpu, &k_gpu, &v_gpu, &d_o_gpu], &options, layout)?;
    gpu.synchronize()?;
    let got = Gradients {
        dq: to_f64(&gradients.dq.to_array(gpu)?),
        dk: to_f64(&gradients.dk.to_array(gpu)?),
        dv: to_f64(&gradients.dv.to_array(gpu)?),
    };
    let inputs = BackwardInputs {
        q: &q,
        k: &k,
        v: &v,
        d_o: &d_o,
    };
    let checks = check_gradients(&inputs, checked.scoring(), scale, &got);
    Ok(BackwardCheckResult {
        problem: p,
        options: BackwardOptionsRecord {
            algorithm: backward.algorithm.name(),
            deterministic: backward.deterministic,
        },
        passed: checks.iter().all(GradientCheck::passed),
        gradients: checks,
        kernels: plan.kernel_names(),
    })
}

/// Fresh N(0, 1) Q and dO of `q_dims`, K and V of `kv_dims`, in `T`: [Q, K, V, dO].
pub fn random_backward_tensors<T: Element>(
    q_dims: [usize; 4],
    kv_dims: [usize; 4],
    rng: &mut impl Rng,
) -> [Array4<T>; 4] {
    [q_dims, kv_dims, kv_dims, q_dims].map(|dims| random_tensor::<T>(dims, rng))
}

/// The forward (FA2, or with a window or soft-capping the algorithm `options` ask for, which
/// FA2 does not take) on device Q, K, V, then the backward `options` ask for
/// (`backward_algorithm`, `deterministic`) with dO, into gradients poisoned with NaN in `layout`
/// (an element the kernels forget stays NaN); the gradients and the backward's plan.
pub fn run_backward_poisoned<T: Element>(
    gpu: &Gpu,
    [q, k, v, d_o]: [&DeviceTensor<T>; 4],
    options: &AttentionOptions,
    layout: Layout,
) -> Result<(Gradients<DeviceTensor<T>>, Plan)> {
    let forward_algorithm = if options.window.is_some() || options.softcap != 0.0 {
        options.algorithm
    } else {
        Algorithm::Fa2
    };
    let call = Attention::new(q, k, v).options(AttentionOptions {
        algorithm: forward_algorithm,
        ..*options
    });
    let forward = call.forward(gpu)?;
    let RowStatistics::LogSumExp(logsumexp) = &forward.stats else {
        unreachable!("FA2 returns L")
    };
    let poisoned = |dims| DeviceTensor::filled(gpu, dims, layout, T::poison());
    let mut gradients = Gradients {
        dq: poisoned(q.dims())?,
        dk: poisoned(k.dims())?,
        dv: poisoned(v.dims())?,
    };
    let Gradients { dq, dk, dv } = &mut gradients;
    let tensors = BackwardTensors {
        o: (&forward.o).into(),
        logsumexp: logsumexp.into(),
        d_o: d_o.into(),
        gradients: Gradients {
            dq: dq.into(),
            dk: dk.into(),
            dv: dv.into(),
        },
    };
    let plan = call.backward_into(gpu, tensors)?;
    Ok((gradients, plan))
}

/// One line for a backward result, for the CLI.
pub fn describe_backward(r: &BackwardCheckResult) -> String {
    let p = &r.problem;
    let gradients: Vec<String> = r
        .gradients
        .iter()
        .map(|g| {
            let non_finite = if g.non_finite > 0 {
                format!(" non-finite={}", g.non_finite)
            } else {
                String::new()
            };
            format!("{}={:.3e}/{:.3e}{non_finite}", g.name, g.error, g.bound)
        })
        .collect();
    format!(
        "backward {:<6}{} {:<4} b={} h={} h_kv={} sq={:<5} sk={:<5} d={:<3} causal={:<5}{} {} [{}] {}",
        r.options.algorithm,
        if r.options.deterministic { " det" } else { "" },
        p.dtype.name(),
        p.batch,
        p.heads,
        p.heads_kv,
        p.seqlen_q,
        p.seqlen_k,
        p.head_dim,
        p.causal,
        scoring_words(p),
        gradients.join(" "),
        r.kernels,
        if r.passed { "ok" } else { "FAIL" }
    )
}
