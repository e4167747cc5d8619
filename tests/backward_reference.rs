//! CPU tests of the backward pass: the f64 reference gradients against finite differences, the
//! FA2 backward emulator against the reference, and its HBM counts against the formulas.

use flash_attn::DType;
use flash_attn::attention::{AttentionOptions, Gradients};
use flash_attn::scoring::Scoring;
use flash_attn_lab::model::fa2::emulate_fa2;
use flash_attn_lab::model::fa2_backward::{
    BackwardInputs, EmulatedBackward, backward_on_host, emulate_fa2_backward,
};
use flash_attn_lab::model::formulas_backward::{fa2_backward_formula, standard_backward_formula};
use flash_attn_lab::model::prediction::IoShape;
use flash_attn_lab::model::reference::attention_reference;
use flash_attn_lab::model::reference_backward::{
    ReferenceBackward, attention_backward_in_dtype, attention_backward_reference,
};
use flash_attn_lab::model::traffic::{BackwardIoCounts, Traffic};
use flash_attn_lab::tools::check::F32_RELATIVE_TOLERANCE;
use flash_kernels::common::mask::KeyWindow;
use ndarray::{Array4, Axis, s};
mod common;

/// Q, K, V and dO of one problem, N(0, 1) draws in f32.
struct Inputs {
    q: Array4<f32>,
    k: Array4<f32>,
    v: Array4<f32>,
    d_o: Array4<f32>,
}

impl Inputs {
    fn random(shape: [usize; 5], seed: u64) -> Self {
        let [q, k, v, d_o] = common::normal_tensors(shape, seed, [true, false, false, true]);
        Self { q, k, v, d_o }
    }

    fn scale(&self) -> f32 {
        1.0 / (self.q.dim().3 as f32).sqrt()
    }

    fn wide(&self) -> [Array4<f64>; 4] {
        [&self.q, &self.k, &self.v, &self.d_o].map(|a| a.mapv(f64::from))
    }

    fn reference(&self, causal: bool) -> ReferenceBackward {
        let [q, k, v, d_o] = self.wide();
        let scale = f64::from(self.scale());
        attention_backward_reference(q.view(), k.view(), v.view(), d_o.view(), causal, scale)
    }

    /// The forward (FA2's emulator, f32) for O and L, then FA2's backward emulator.
    fn fa2_backward(&self, causal: bool, blocks: (u32, u32), dtype: DType) -> EmulatedBackward {
        let (q, k, v) = (self.q.view(), self.k.view(), self.v.view());
        let (o, logsumexp, _) = emulate_fa2(q, k, v, causal, self.scale(), blocks, DType::F32);
        let inputs = BackwardInputs {
            q,
            k,
            v,
            o: o.view(),
            d_o: self.d_o.view(),
            logsumexp: logsumexp.view(),
        };
        emulate_fa2_backward(inputs, causal, self.scale(), blocks, dtype)
    }
}

/// max |x − x_ref| / max |x_ref|: the forward's f32 rule, per gradient. Where the reference is
/// exactly zero (one visible key: the softmax then has no gradient) it is the absolute error.
fn relative_error(x: &Array4<f64>, reference: &Array4<f64>) -> f64 {
    let max_reference = reference.iter().fold(0.0f64, |m, r| m.max(r.abs()));
    let max_error = x
        .iter()
        .zip(reference)
        .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
    if max_reference > 0.0 {
        max_error / max_reference
    } else {
        max_error
    }
}

fn named(gradients: &Gradients<Array4<f64>>) -> [(&'static str, &Array4<f64>); 3] {
    [
        ("dQ", &gradients.dq),
        ("dK", &gradients.dk),
        ("dV", &gradients.dv),
    ]
}

// ---------------------------------------------------------------------------------------------
// (a) The reference against finite differences.
// ---------------------------------------------------------------------------------------------

/// loss = Σ dO ∘ O(Q, K, V): its gradient with respect to Q, K, V is what the backward returns.
fn loss(inputs: &[Array4<f64>; 4], scoring: Scoring, scale: f64) -> f64 {
    let [q, k, v, d_o] = inputs;
    let o = attention_reference(q.view(), k.view(), v.view(), scoring, scale).o;
    (&o * d_o).sum()
}

/// Central differences of [`loss`] with respect to every element of input `which` (0: Q, 1: K,
/// 2: V): error O(h²) from truncation plus O(ε/h) from rounding, ~1e-10 at h = 1e-5.
fn finite_differences(
    inputs: &[Array4<f64>; 4],
    which: usize,
    scoring: Scoring,
    scale: f64,
) -> Array4<f64> {
    const STEP: f64 = 1e-5;
    let mut gradient = Array4::zeros(inputs[which].raw_dim());
    for (index, g) in gradient.indexed_iter_mut() {
        let index = [index.0, index.1, index.2, index.3];
        let mut moved = inputs.clone();
        moved[which][index] += STEP;
        let up = loss(&moved, scoring, scale);
        moved[which][index] -= 2.0 * STEP;
        let down = loss(&moved, scoring, scale);
        *g = (up - down) / (2.0 * STEP);
    }
    gradient
}

/// Bound on the relative error of the reference against central differences; measured: at most
/// 3.3e-10 (the causal case with rows that see no key), 1e-11 to 1e-10 otherwise.
const FINITE_DIFFERENCE_TOLERANCE: f64 = 1e-6;

#[test]
fn reference_gradients_match_finite_differences() {
    // seqlen_q < seqlen_k, and > (causal: queries 0 and 1 then see no key).
    for (seed, shape) in [[1, 2, 5, 7, 3], [1, 2, 7, 5, 3]].into_iter().enumerate() {
        for causal in [false, true] {
            let inputs = Inputs::random(shape, 10 + seed as u64);
            let scale = f64::from(inputs.scale());
            let wide = inputs.wide();
            let reference = inputs.reference(causal);
            for (which, (name, analytic)) in named(&reference.gradients).into_iter().enumerate() {
                let numeric = finite_differences(&wide, which, causal.into(), scale);
                let error = relative_error(analytic, &numeric);
                println!("{shape:?} causal={causal} {name}: relative error {error:.1e}");
                assert!(
                    error <= FINITE_DIFFERENCE_TOLERANCE,
                    "{shape:?} causal={causal} {name}: {error:e}"
                );
            }
        }
    }
}

/// Windows (causal or not, one-sided, narrow enough that some queries and keys see nothing) and
/// soft-capping (a cap near the scores' size, so tanh bends), alone and together (Gemma 2), at
/// seqlen_q below and above seqlen_k.
#[test]
fn reference_gradients_match_finite_differences_with_windows_and_softcap() {
    let window = |left, right| KeyWindow { left, right };
    let scorings = [
        Scoring {
            window: window(Some(2), Some(1)),
            softcap: 0.0,
        },
        Scoring {
            window: window(Some(1), Some(0)),
            softcap: 0.0,
        },
        Scoring {
            window: window(None, Some(0)),
            softcap: 0.5,
        },
        Scoring {
            window: KeyWindow::FULL,
            softcap: 0.3,
        },
        Scoring {
            window: window(Some(3), None),
            softcap: 0.4,
        },
    ];
    for (seed, shape) in [[1, 2, 5, 8, 3], [1, 1, 8, 4, 3]].into_iter().enumerate() {
        for scoring in scorings {
            let mut inputs = Inputs::random(shape, 30 + seed as u64);
            // Scores of a few units, so a cap of 0.3–0.5 (after the scale) saturates some.
            inputs.q.mapv_inplace(|x| 3.0 * x);
            let scale = f64::from(inputs.scale());
            let wide = inputs.wide();
            let [q, k, v, d_o] = &wide;
            let reference = attention_backward_reference(
                q.view(),
                k.view(),
                v.view(),
                d_o.view(),
                scoring,
                scale,
            );
            for (which, (name, analytic)) in named(&reference.gradients).into_iter().enumerate() {
                let numeric = finite_differences(&wide, which, scoring, scale);
                let error = relative_error(analytic, &numeric);
                println!("{shape:?} {scoring:?} {name}: relative error {error:.1e}");
                assert!(
                    error <= FINITE_DIFFERENCE_TOLERANCE,
                    "{shape:?} {scoring:?} {name}: {error:e}"
                );
            }
        }
    }
}

#[test]
fn delta_is_the_rowsum_of_d_o_times_o() {
    let inputs = Inputs::random([2, 1, 9, 4, 5], 20);
    let [q, k, v, d_o] = inputs.wide();
    let scale = f64::from(inputs.scale());
    let o = attention_reference(q.view(), k.view(), v.view(), true, scale).o;
    let expected = (&o * &d_o).sum_axis(Axis(3));
    let delta = inputs.reference(true).delta;
    for (d, e) in delta.iter().zip(&expected) {
        assert!((d - e).abs() <= 1e-12 * (1.0 + e.abs()), "{d} vs {e}");
    }
}

// ---------------------------------------------------------------------------------------------
// (b), (c) The FA2 backward emulator against the reference.
// ---------------------------------------------------------------------------------------------

/// (batch, heads, seqlen_q, seqlen_k, head_dim): seqlen_q below, equal to and above seqlen_k,
/// tails for every block size below, head dims 1, 17 and 64.
const SHAPES: [[usize; 5]; 6] = [
    [1, 1, 1, 1, 1],
    [1, 2, 17, 17, 17],
    [2, 1, 33, 70, 1],
    [1, 2, 70, 33, 17],
    [1, 1, 100, 37, 64],
    [1, 1, 37, 100, 64],
];

/// (B_r, B_c): the forward kernel's square choice, uneven ones, and small odd ones that make
/// many tail blocks and row blocks that see no key.
const BLOCKS: [(u32, u32); 4] = [(64, 64), (16, 32), (32, 16), (3, 5)];

/// The emulator's bound: max |dX − dX_ref| / max |dX_ref| ≤ 1e-5 for each of dQ, dK, dV, the
/// forward's f32 rule. Measured over SHAPES × BLOCKS × both masks (forward and backward both
/// emulated in f32): at most 6.0e-7 (dQ 5.6e-7, dK 5.4e-7, dV 6.0e-7), 17× inside the bound;
/// the same computation in bf16 is 3.4e-3 off and one lost key ~1, 340× and more outside it
/// (`the_bound_catches_half_precision_and_a_lost_key`).
const EMULATOR_TOLERANCE: f64 = F32_RELATIVE_TOLERANCE;

/// The relative error of dQ, dK and dV against the reference's, by name.
fn gradient_errors<F: Copy + Into<f64>>(
    gradients: &Gradients<Array4<F>>,
    reference: &Gradients<Array4<f64>>,
) -> [(&'static str, f64); 3] {
    let error = |x: &Array4<F>, r| relative_error(&x.mapv(Into::into), r);
    [
        ("dQ", error(&gradients.dq, &reference.dq)),
        ("dK", error(&gradients.dk, &reference.dk)),
        ("dV", error(&gradients.dv, &reference.dv)),
    ]
}

fn check_emulator_against_reference(causal: bool) {
    let mut worst = 0.0f64;
    for (seed, shape) in SHAPES.into_iter().enumerate() {
        let inputs = Inputs::random(shape, 100 + seed as u64);
        let reference = inputs.reference(causal);
        for blocks in BLOCKS {
            let emulated = inputs.fa2_backward(causal, blocks, DType::F32);
            let what = format!("{shape:?} causal={causal} blocks={blocks:?}");
            let g = &emulated.gradients;
            for (name, gradient) in [("dQ", &g.dq), ("dK", &g.dk), ("dV", &g.dv)] {
                assert!(
                    gradient.iter().all(|x| x.is_finite()),
                    "{what}: {name} has unwritten or NaN elements"
                );
            }
            let errors = gradient_errors(g, &reference.gradients);
            let listed: Vec<String> = errors.iter().map(|(n, e)| format!("{n} {e:.1e}")).collect();
            println!("{what}: {}", listed.join(", "));
            for (name, error) in errors {
                assert!(
                    error <= EMULATOR_TOLERANCE,
                    "{what}: {name} relative error {error:e}"
                );
                worst = worst.max(error);
            }
            for (d, d_ref) in emulated.delta.iter().zip(&reference.delta) {
                assert!(
                    (f64::from(*d) - d_ref).abs() <= 1e-5 * (1.0 + d_ref.abs()),
                    "{what}: D"
                );
            }
        }
    }
    println!("causal={causal}: worst relative error {worst:.2e}");
}

#[test]
fn fa2_backward_emulator_matches_the_reference() {
    check_emulator_against_reference(false);
}

#[test]
fn fa2_backward_emulator_matches_the_reference_with_a_causal_mask() {
    check_emulator_against_reference(true);
}

/// A rule that a computation in half precision, or one that loses a key, would also pass would
/// prove nothing: both must fail it by a wide margin, while the same computation in f32 passes.
#[test]
fn the_bound_catches_half_precision_and_a_lost_key() {
    let inputs = Inputs::random([1, 2, 70, 33, 17], 30);
    let [q, k, v, d_o] = inputs.wide();
    let scale = f64::from(inputs.scale());
    let (q, k, v, d_o) = (q.view(), k.view(), v.view(), d_o.view());
    let exact = attention_backward_reference(q, k, v, d_o, true, scale);
    let in_f32 = attention_backward_in_dtype::<f32>(q, k, v, d_o, true, scale);
    let in_bf16 = attention_backward_in_dtype::<half::bf16>(q, k, v, d_o, true, scale);
    for (name, error) in gradient_errors(&in_f32.gradients, &exact.gradients) {
        println!("in f32, {name}: {error:.1e}");
        assert!(error <= EMULATOR_TOLERANCE / 10.0, "f32 {name}: {error:e}");
    }
    for (name, error) in gradient_errors(&in_bf16.gradients, &exact.gradients) {
        println!("in bf16, {name}: {error:.1e}");
        assert!(
            error >= 50.0 * EMULATOR_TOLERANCE,
            "bf16 {name}: only {error:e}"
        );
    }
    // The last key lost (a tail block skipped by mistake): dQ moves far past the bound.
    let keys = s![.., .., ..32, ..];
    let lost = attention_backward_reference(q, k.slice(keys), v.slice(keys), d_o, true, scale);
    let error = relative_error(&lost.gradients.dq, &exact.gradients.dq);
    println!("one key lost, dQ: {error:.1e}");
    assert!(
        error >= 100.0 * EMULATOR_TOLERANCE,
        "one key lost: only {error:e}"
    );
}

#[test]
fn rows_that_see_no_key_have_zero_gradients() {
    // seqlen_q = 100 > seqlen_k = 17, causal: queries 0–82 see no key. With B_r = 8, row blocks
    // 0–9 are never visited by the main loop: their dQ is the pre-pass's zero, scaled.
    let shape = [1, 2, 100, 17, 8];
    let inputs = Inputs::random(shape, 40);
    let reference = inputs.reference(true);
    let emulated = inputs.fa2_backward(true, (8, 8), DType::F32);
    let zero = |x: &f64| *x == 0.0;
    let zero_f32 = |x: &f32| *x == 0.0;
    let (no_key, no_key_delta) = (s![.., .., ..83, ..], s![.., .., ..83]);
    assert!(reference.gradients.dq.slice(no_key).iter().all(zero));
    assert!(reference.delta.slice(no_key_delta).iter().all(zero));
    assert!(emulated.gradients.dq.slice(no_key).iter().all(zero_f32));
    assert!(emulated.delta.slice(no_key_delta).iter().all(zero_f32));
    // Every key is seen by the last query, so dK and dV are not zero anywhere.
    assert!(emulated.gradients.dv.iter().all(|&x| x != 0.0));
    for (name, error) in gradient_errors(&emulated.gradients, &reference.gradients) {
        assert!(error <= EMULATOR_TOLERANCE, "{name}: {error:e}");
    }
}

#[test]
fn gradients_are_stored_in_the_input_dtype() {
    let inputs = Inputs::random([1, 1, 33, 40, 16], 50);
    let f32_run = inputs.fa2_backward(true, (16, 32), DType::F32);
    for dtype in [DType::F16, DType::Bf16] {
        let round = |x: f32| match dtype {
            DType::F16 => half::f16::from_f32(x).to_f32(),
            _ => half::bf16::from_f32(x).to_f32(),
        };
        let run = inputs.fa2_backward(true, (16, 32), dtype);
        let (g, g32) = (&run.gradients, &f32_run.gradients);
        assert_eq!(g.dq, g32.dq.mapv(round), "{dtype} dQ");
        assert_eq!(g.dk, g32.dk.mapv(round), "{dtype} dK");
        assert_eq!(g.dv, g32.dv.mapv(round), "{dtype} dV");
    }
}

#[test]
fn the_host_entry_point_runs_the_emulator() {
    let inputs = Inputs::random([2, 1, 21, 30, 8], 60);
    let (q, k, v) = (inputs.q.view(), inputs.k.view(), inputs.v.view());
    let (o, logsumexp, _) = emulate_fa2(q, k, v, false, inputs.scale(), (64, 64), DType::F32);
    let host = |x: &Array4<f32>| x.mapv(half::bf16::from_f32);
    let (q, k, v, o, d_o) = (
        host(&inputs.q),
        host(&inputs.k),
        host(&inputs.v),
        host(&o),
        host(&inputs.d_o),
    );
    let host_inputs = BackwardInputs {
        q: q.view(),
        k: k.view(),
        v: v.view(),
        o: o.view(),
        d_o: d_o.view(),
        logsumexp: logsumexp.view(),
    };
    let (gradients, io) =
        backward_on_host(&host_inputs, None, &AttentionOptions::default(), (8, 16)).unwrap();
    assert_eq!(gradients.dk.dim(), (2, 1, 30, 8));
    let shape = io_shape([2, 1, 21, 30, 8]);
    let formula = fa2_backward_formula(shape, false, (8, 16), DType::Bf16).unwrap();
    assert_eq!(io, formula);
    // The GPU rule to come, on the emulator: within 2× the error of the backward computed in
    // bf16 (P, dS and the gradients rounded), plus 1e-5.
    let wide = |x: &Array4<half::bf16>| x.mapv(f64::from);
    let [q, k, v, d_o] = [&q, &k, &v, &d_o].map(wide);
    let (q, k, v, d_o) = (q.view(), k.view(), v.view(), d_o.view());
    let scale = f64::from(inputs.scale());
    let exact = attention_backward_reference(q, k, v, d_o, false, scale);
    let in_bf16 = attention_backward_in_dtype::<half::bf16>(q, k, v, d_o, false, scale);
    let baseline = gradient_errors(&in_bf16.gradients, &exact.gradients);
    let emulated = gradient_errors(&gradients, &exact.gradients);
    for ((name, error), (_, baseline)) in emulated.into_iter().zip(baseline) {
        println!("bf16 {name}: {error:.1e}, baseline {baseline:.1e}");
        assert!(
            error <= 2.0 * baseline + 1e-5,
            "{name}: {error:e} vs {baseline:e}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// (d) HBM traffic against the formulas.
// ---------------------------------------------------------------------------------------------

fn io_shape([batch, heads, seqlen_q, seqlen_k, head_dim]: [usize; 5]) -> IoShape {
    IoShape {
        batch,
        heads,
        seqlen_q,
        seqlen_k,
        head_dim,
    }
}

fn reads(read: u64) -> Traffic {
    Traffic { read, written: 0 }
}

fn writes(written: u64) -> Traffic {
    Traffic { read: 0, written }
}

/// Shapes for the exact counts: tails both ways, seqlen_q above and below seqlen_k, d 1 to 8.
const IO_SHAPES: [[usize; 5]; 5] = [
    [1, 1, 1, 1, 1],
    [1, 2, 17, 64, 8],
    [2, 1, 100, 129, 1],
    [1, 1, 257, 100, 8],
    [1, 1, 100, 17, 4],
];

#[test]
fn fa2_backward_io_equals_the_formula() {
    for (seed, shape) in IO_SHAPES.into_iter().enumerate() {
        let inputs = Inputs::random(shape, 200 + seed as u64);
        let [b, h, n_q, n_k, d] = shape;
        let heads = (b * h) as u64;
        let (n_q, n_k, d) = (n_q as u64, n_k as u64, d as u64);
        for causal in [false, true] {
            for (blocks, dtype) in BLOCKS
                .into_iter()
                .zip([DType::F32, DType::Bf16].into_iter().cycle())
            {
                let io = inputs.fa2_backward(causal, blocks, dtype).io;
                let what = format!("{shape:?} causal={causal} {blocks:?} {dtype}");
                let formula = fa2_backward_formula(io_shape(shape), causal, blocks, dtype).unwrap();
                assert_eq!(io, formula, "{what}");

                // Once per head whatever the mask: K, V read; dK, dV written; the pre- and
                // post-passes over O, D and dQ.
                assert_eq!(io.k.elements, reads(n_k * d * heads), "{what}");
                assert_eq!(io.v.elements, reads(n_k * d * heads), "{what}");
                assert_eq!(io.dk.elements, writes(n_k * d * heads), "{what}");
                assert_eq!(io.dv.elements, writes(n_k * d * heads), "{what}");
                assert_eq!(io.o.elements, reads(n_q * d * heads), "{what}");
                assert_eq!(io.dq.elements, writes(n_q * d * heads), "{what}");
                assert_eq!(io.delta.elements.written, n_q * heads, "{what}");
                for untouched in [io.probs, io.d_probs, io.d_scores] {
                    assert_eq!(untouched.elements, Traffic::default(), "{what}");
                }
                // Without a mask every key block visits every row: Q, dO, L, D and dQ_i make
                // T_c round trips, the article's Nd per outer step.
                if !causal {
                    let t_c = n_k.div_ceil(blocks.1 as u64);
                    let visits = t_c * n_q * heads;
                    assert_eq!(io.q.elements, reads(visits * d), "{what}");
                    assert_eq!(io.d_o.elements, reads((visits + n_q * heads) * d), "{what}");
                    assert_eq!(io.logsumexp.elements, reads(visits), "{what}");
                    assert_eq!(io.delta.elements.read, visits, "{what}");
                    let accumulator = (visits + n_q * heads) * d;
                    let round_trips = Traffic {
                        read: accumulator,
                        written: accumulator,
                    };
                    assert_eq!(io.dq_accumulator.elements, round_trips, "{what}");
                }
                // Bytes: the inputs and gradients in the dtype, L, D and the accumulator in f32.
                let e = dtype.size_bytes() as u64;
                let dtype_reads = io.q.elements.read
                    + 2 * n_k * d * heads
                    + n_q * d * heads
                    + io.d_o.elements.read;
                let f32_reads = io.logsumexp.elements.read
                    + io.delta.elements.read
                    + io.dq_accumulator.elements.read;
                assert_eq!(io.bytes_read(), e * dtype_reads + 4 * f32_reads, "{what}");
            }
        }
    }
}

#[test]
fn causal_row_blocks_before_the_diagonal_are_skipped() {
    // N = T·B with B_r = B_c = B: key block j is visited by row blocks j..T, T(T + 1)/2 visits.
    let (n, d, block) = (64u64, 8u64, 16u64);
    let t = n / block;
    let visits = t * (t + 1) / 2;
    let inputs = Inputs::random([1, 1, n as usize, n as usize, d as usize], 300);
    let io = inputs
        .fa2_backward(true, (block as u32, block as u32), DType::F32)
        .io;
    assert_eq!(io.q.elements, reads(visits * block * d));
    assert_eq!(io.logsumexp.elements, reads(visits * block));
    assert_eq!(io.d_o.elements, reads((visits * block + n) * d));
    assert_eq!(io.k.elements, reads(n * d));

    // seqlen_q = 100 > seqlen_k = 17, B_r = B_c = 8: query q sees key k iff q ≥ k + 83. Key
    // block 0 (keys 0–7) is first seen by query 83, in row block 10; key block 1 (8–15) by 91,
    // row block 11; key block 2 (key 16) by 99, row block 12. Rows visited: 20 + 12 + 4.
    let inputs = Inputs::random([1, 2, 100, 17, 8], 301);
    let io = inputs.fa2_backward(true, (8, 8), DType::F32).io;
    assert_eq!(io.q.elements, reads(2 * (20 + 12 + 4) * 8));
}

#[test]
fn standard_backward_formula_counts_each_pass_over_p_dp_and_ds() {
    let io = standard_backward_formula(io_shape([1, 1, 3, 5, 2]), DType::Bf16).unwrap();
    // Q, K, V read once, dO twice (dV = Pᵀ·dO and dP = dO·Vᵀ).
    assert_eq!(
        (io.q.elements, io.k.elements, io.v.elements),
        (reads(6), reads(10), reads(10))
    );
    assert_eq!(io.d_o.elements, reads(12));
    // P read by dV and dS; dP written, then read by dS; dS written, then read by dQ and dK.
    assert_eq!(io.probs.elements, reads(30));
    assert_eq!(
        io.d_probs.elements,
        Traffic {
            read: 15,
            written: 15
        }
    );
    assert_eq!(
        io.d_scores.elements,
        Traffic {
            read: 30,
            written: 15
        }
    );
    assert_eq!(
        (io.dq.elements, io.dk.elements, io.dv.elements),
        (writes(6), writes(10), writes(10))
    );
    for untouched in [io.o, io.logsumexp, io.delta, io.dq_accumulator] {
        assert_eq!(untouched.elements, Traffic::default());
    }
    // bf16 except dP (f32).
    assert_eq!(io.bytes_read(), 2 * (6 + 10 + 10 + 12 + 30 + 30) + 4 * 15);
    assert_eq!(io.bytes_written(), 2 * (15 + 6 + 10 + 10) + 4 * 15);
}

/// Counted per visit, FA2's dQ accumulator (f32, read and written at every (key block, row
/// block) visit) costs about 8·T_c·N_q·d bytes, and Q and dO re-read per key block 4·T_c·N_q·d in
/// bf16: 12·N²·d/B_c in all at N_q = N_k = N, against the standard backward's 18·N² for P, dP,
/// dS (bf16 P read twice, f32 dP written and read, bf16 dS written once and read twice). FA2
/// moves fewer bytes only for B_c > 2d/3: at d = 128 with B_c = 128, not with B_c = 64. (On the
/// GPU the accumulator's atomic adds are largely absorbed by L2, as the forward's K/V re-reads
/// are; what FA2 always saves is the N × N memory.)
#[test]
fn fa2_backward_traffic_beside_the_standard_backward() {
    let shape = IoShape::square(1, 16, 16_384, 128);
    let total = |io: BackwardIoCounts| io.bytes_read() + io.bytes_written();
    let standard = total(standard_backward_formula(shape, DType::Bf16).unwrap());
    let fa2 = |block_cols| {
        total(fa2_backward_formula(shape, false, (64, block_cols), DType::Bf16).unwrap())
    };
    let (n, d, heads) = (16_384u64, 128u64, 16u64);
    let square = n * n * heads;
    // The N × N terms dominate: within 1% for the standard backward, 2% for FA2 (whose
    // per-visit L and D reads and the N·d terms add the rest).
    assert!(
        standard.abs_diff(18 * square) * 100 < standard,
        "{standard}"
    );
    for block_cols in [64u64, 128] {
        let modelled = 12 * square * d / block_cols;
        let counted = fa2(block_cols as u32);
        assert!(
            counted.abs_diff(modelled) * 50 < counted,
            "B_c = {block_cols}: {counted}"
        );
    }
    assert!(fa2(128) < standard && standard < fa2(64));
    // Formulas reject what the host rejects, and zero blocks.
    let too_wide = IoShape::square(1, 1, 16, 300);
    assert!(fa2_backward_formula(too_wide, false, (64, 64), DType::F32).is_err());
    assert!(standard_backward_formula(too_wide, DType::F32).is_err());
    assert!(fa2_backward_formula(shape, false, (0, 64), DType::F32).is_err());
}
