//! The FA2 backward kernels against the f64 reference gradients (`reference_backward`), at odd
//! shapes: seqlen 1, 17, 113 × 203 (and 203 × 113), head dims 1, 40, 64, 128, 256, causal and
//! not, f32/f16/bf16, gradients written into another layout than the inputs'. Without a GPU
//! each test says it was skipped; `FLASH_ATTN_REQUIRE_GPU=1` turns that into a failure.
//!
//! Tolerances, per gradient, on the largest absolute error: f32 within 1e-4 of the reference's
//! largest magnitude; f16 and bf16 within twice the error of the reference computed in the
//! dtype (`attention_backward_in_dtype`) plus 1e-5.

mod common;

use flash_attn::attention::{Gradients, attention, attention_backward_into};
use flash_attn::model::reference_backward::{
    attention_backward_in_dtype, attention_backward_reference,
};
use flash_attn::tools::check::{random_tensor, to_f64};
use flash_attn::{Algorithm, AttentionOptions, DType, DeviceTensor, Element, Gpu, Layout};
use half::{bf16, f16};
use ndarray::Array4;

/// (batch, heads, seqlen_q, seqlen_k, head_dim).
const SHAPES: [(usize, usize, usize, usize, usize); 8] = [
    (1, 1, 1, 1, 1),
    (1, 2, 1, 17, 40),
    (2, 1, 17, 17, 64),
    (1, 2, 17, 1, 128),
    (1, 1, 113, 203, 64),
    (1, 1, 203, 113, 40),
    (1, 2, 113, 203, 128),
    (1, 1, 113, 203, 256),
];

/// The largest |a − b|, and whether every element of `a` is finite.
fn max_error(a: &Array4<f64>, b: &Array4<f64>) -> (f64, bool) {
    let finite = a.iter().all(|x| x.is_finite());
    let error = a
        .iter()
        .zip(b)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
    (error, finite)
}

fn max_abs(a: &Array4<f64>) -> f64 {
    a.iter().fold(0.0f64, |m, x| m.max(x.abs()))
}

/// Runs the FA2 forward and backward on one shape and checks dQ, dK, dV.
fn check_shape<T: Element>(
    gpu: &Gpu,
    (batch, heads, seqlen_q, seqlen_k, head_dim): (usize, usize, usize, usize, usize),
    causal: bool,
    rng: &mut rand::rngs::StdRng,
) {
    let q_dims = [batch, heads, seqlen_q, head_dim];
    let kv_dims = [batch, heads, seqlen_k, head_dim];
    let (q, k, v, d_o) = (
        random_tensor::<T>(q_dims, rng),
        random_tensor::<T>(kv_dims, rng),
        random_tensor::<T>(kv_dims, rng),
        random_tensor::<T>(q_dims, rng),
    );
    let upload = |a: &Array4<T>| {
        DeviceTensor::from_array(gpu, a.view(), Layout::BatchHeadSeqDim).expect("upload")
    };
    let (q_gpu, k_gpu, v_gpu, d_o_gpu) = (upload(&q), upload(&k), upload(&v), upload(&d_o));
    let options = AttentionOptions {
        causal,
        ..Default::default()
    };
    let forward = attention(gpu, Algorithm::Fa2, &q_gpu, &k_gpu, &v_gpu, &options).expect("fwd");
    // Poisoned, in FlashAttention's layout: an element the kernels forget stays NaN.
    let poisoned = |dims| {
        DeviceTensor::filled(gpu, dims, Layout::BatchSeqHeadDim, T::poison()).expect("alloc")
    };
    let mut gradients = Gradients {
        dq: poisoned(q_dims),
        dk: poisoned(kv_dims),
        dv: poisoned(kv_dims),
    };
    let plan = attention_backward_into(
        gpu,
        &q_gpu,
        &k_gpu,
        &v_gpu,
        &forward,
        &d_o_gpu,
        &mut gradients,
        &options,
    )
    .expect("backward");
    let got = |t: &DeviceTensor<T>| to_f64(&t.to_array(gpu).expect("download"));
    let got = [got(&gradients.dq), got(&gradients.dk), got(&gradients.dv)];

    let scale = 1.0 / (head_dim as f64).sqrt();
    let (q, k, v, d_o) = (to_f64(&q), to_f64(&k), to_f64(&v), to_f64(&d_o));
    let exact =
        attention_backward_reference(q.view(), k.view(), v.view(), d_o.view(), causal, scale);
    let in_dtype =
        attention_backward_in_dtype::<T>(q.view(), k.view(), v.view(), d_o.view(), causal, scale);
    let exact = [
        &exact.gradients.dq,
        &exact.gradients.dk,
        &exact.gradients.dv,
    ];
    let in_dtype = [
        &in_dtype.gradients.dq,
        &in_dtype.gradients.dk,
        &in_dtype.gradients.dv,
    ];
    let what = format!(
        "{} {q_dims:?}×{seqlen_k} causal={causal} ({})",
        T::DTYPE,
        plan.launches[1].kernel
    );
    for (i, name) in ["dq", "dk", "dv"].into_iter().enumerate() {
        let (error, finite) = max_error(&got[i], exact[i]);
        assert!(finite, "{what}: {name} has non-finite elements");
        let bound = if T::DTYPE == DType::F32 {
            1e-4 * max_abs(exact[i]).max(1.0)
        } else {
            2.0 * max_error(in_dtype[i], exact[i]).0 + 1e-5
        };
        println!("{what}: {name} error {error:.3e} (bound {bound:.3e})");
        assert!(
            error <= bound,
            "{what}: {name} error {error:.3e} > {bound:.3e}"
        );
    }
}

fn check_dtype<T: Element>(test: &str) {
    let Some(gpu) = common::gpu_or_skip(test) else {
        return;
    };
    let mut rng = common::seeded_rng(test);
    for shape in SHAPES {
        for causal in [false, true] {
            check_shape::<T>(&gpu, shape, causal, &mut rng);
        }
    }
}

#[test]
fn f32_gradients_match_the_reference() {
    check_dtype::<f32>("backward_f32");
}

#[test]
fn f16_gradients_match_the_reference() {
    check_dtype::<f16>("backward_f16");
}

#[test]
fn bf16_gradients_match_the_reference() {
    check_dtype::<bf16>("backward_bf16");
}
