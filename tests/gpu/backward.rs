//! The backward kernels against the f64 reference gradients (`reference_backward`): the
//! scalar kernels (`fa2`) and the standard backward (`standard`, every N × N matrix in HBM; and
//! its out-of-memory error) at odd shapes (seqlen 1, 17, 113 × 203 and 203 × 113, head dims 1,
//! 40, 64, 128, 256, causal and not, f32/f16/bf16); the tensor-core kernels (`fa2-tc`, f16 and
//! bf16) over a grid of head dims (16 to 256, each capacity and between), causal and not,
//! seqlen_q ≠ seqlen_k, both layouts, a strided input, plus random shapes; the same for FA3's
//! backward (`fa3`, the default on compute capability 9.0: head dims 16 to 128, longer
//! sequences that cycle its row ring; skipped on other GPUs); the fallback of a
//! head dim the tensor cores do not take; the wide pre- and post-pass at head dims between the
//! grids' and their fallback to the element-wise ones when O, dO or dQ rows are not 16-byte
//! aligned; and deterministic mode run twice, bit for bit. Inputs
//! and gradients sit in different layouts. Without a GPU each test says it was skipped;
//! `FLASH_ATTN_REQUIRE_GPU=1` turns that into a failure.
//!
//! Tolerances (`tools::check_backward`, the rule `flash-attn check --backward` uses too), per
//! gradient, on the largest absolute error: f32 within 1e-4 of the reference's largest
//! magnitude; f16 and bf16 within twice the error of the reference computed in the dtype
//! (`attention_backward_in_dtype`) plus one unit in the last place at the largest reference gradient (`check_backward`).

use crate::common;

use flash_attn::attention::backward_plan::BackwardOptions;
use flash_attn::attention::{BackwardAlgorithm, BackwardPlan, Gradients};
use flash_attn::{Algorithm, AttentionOptions, DeviceTensor, Element, Gpu, Layout};
use flash_attn_lab::tools::check::{random_tensor, to_f64};
use flash_attn_lab::tools::check_backward::{BackwardInputs, GradientCheck, check_gradients};
use half::{bf16, f16};
use ndarray::Array4;
use rand::Rng;

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

/// How one case lays out its tensors: the inputs' layout (the gradients take the other one),
/// and whether Q has padded rows (a row stride of d + 8).
#[derive(Clone, Copy, Debug)]
struct Placement {
    layout: Layout,
    strided_q: bool,
}

const PLAIN: Placement = Placement {
    layout: Layout::BatchHeadSeqDim,
    strided_q: false,
};

/// `array` on the device in `placement`'s layout; with `strided`, every row padded by 8
/// elements of NaN that no kernel may read.
fn upload<T: Element>(
    gpu: &Gpu,
    array: &Array4<T>,
    placement: Placement,
    strided: bool,
) -> DeviceTensor<T> {
    if !strided {
        return DeviceTensor::from_array(gpu, array.view(), placement.layout).expect("upload");
    }
    upload_padded(gpu, array, 8)
}

/// `array` on the device, (batch, heads, seqlen, head_dim) with every row padded by `pad`
/// elements of NaN (row stride d + pad).
fn upload_padded<T: Element>(gpu: &Gpu, array: &Array4<T>, pad: usize) -> DeviceTensor<T> {
    let (b, h, n, d) = array.dim();
    let row = d + pad;
    let strides = [h * n * row, n * row, row, 1];
    let mut host = vec![T::poison(); b * h * n * row];
    for ((bi, hi, ni, di), value) in array.indexed_iter() {
        host[bi * strides[0] + hi * strides[1] + ni * strides[2] + di] = *value;
    }
    let data = gpu.upload(&host, "a strided tensor").expect("upload");
    DeviceTensor::from_parts(data, [b, h, n, d], strides).expect("strided view")
}

/// The other layout.
fn other(layout: Layout) -> Layout {
    match layout {
        Layout::BatchHeadSeqDim => Layout::BatchSeqHeadDim,
        Layout::BatchSeqHeadDim => Layout::BatchHeadSeqDim,
    }
}

/// Runs the FA2 forward and the backward asked for by `backward` on one shape, checks dQ, dK,
/// dV against the reference, and returns the plan and dQ's bits (for the determinism test).
fn check_shape<T: Element>(
    gpu: &Gpu,
    (batch, heads, seqlen_q, seqlen_k, head_dim): (usize, usize, usize, usize, usize),
    causal: bool,
    backward: &BackwardOptions,
    placement: Placement,
    rng: &mut rand::rngs::StdRng,
) -> (BackwardPlan, Vec<u64>) {
    let q_dims = [batch, heads, seqlen_q, head_dim];
    let kv_dims = [batch, heads, seqlen_k, head_dim];
    let (q, k, v, d_o) = (
        random_tensor::<T>(q_dims, rng),
        random_tensor::<T>(kv_dims, rng),
        random_tensor::<T>(kv_dims, rng),
        random_tensor::<T>(q_dims, rng),
    );
    let q_gpu = upload(gpu, &q, placement, placement.strided_q);
    let (k_gpu, v_gpu, d_o_gpu) = (
        upload(gpu, &k, placement, false),
        upload(gpu, &v, placement, false),
        upload(gpu, &d_o, placement, false),
    );
    let options = AttentionOptions {
        causal,
        ..Default::default()
    };
    // Poisoned, in the other layout: an element the kernels forget stays NaN.
    let (gradients, plan) = common::run_backward_poisoned(
        gpu,
        [&q_gpu, &k_gpu, &v_gpu, &d_o_gpu],
        &options,
        backward,
        other(placement.layout),
    )
    .expect("backward");
    let dq_bits = gradients
        .dq
        .to_array(gpu)
        .expect("download")
        .iter()
        .map(|x| x.to_f64().to_bits())
        .collect();
    let got = |t: &DeviceTensor<T>| t.to_array(gpu).expect("download");
    let got = Gradients {
        dq: got(&gradients.dq),
        dk: got(&gradients.dk),
        dv: got(&gradients.dv),
    };
    let what = format!(
        "{} {q_dims:?}×{seqlen_k} causal={causal} {placement:?} ({})",
        T::DTYPE,
        plan.kernel_names()
    );
    let inputs = BackwardInputs {
        q: &q,
        k: &k,
        v: &v,
        d_o: &d_o,
    };
    assert_matches_reference(&what, &inputs, causal, &got);
    (plan, dq_bits)
}

/// dQ, dK, dV against the f64 reference gradients of `inputs`, each within its bound
/// (`check_gradients`) and finite; `what` names the case.
fn assert_matches_reference<T: Element>(
    what: &str,
    inputs: &BackwardInputs<T>,
    causal: bool,
    got: &Gradients<Array4<T>>,
) {
    let head_dim = inputs.q.dim().3;
    let scale = 1.0 / (head_dim as f64).sqrt();
    let got = Gradients {
        dq: to_f64(&got.dq),
        dk: to_f64(&got.dk),
        dv: to_f64(&got.dv),
    };
    for check in check_gradients(inputs, causal, scale, &got) {
        let GradientCheck {
            name, error, bound, ..
        } = check;
        assert_eq!(
            check.non_finite, 0,
            "{what}: {name} has non-finite elements"
        );
        println!("{what}: {name} error {error:.3e} (bound {bound:.3e})");
        assert!(
            check.passed(),
            "{what}: {name} error {error:.3e} > {bound:.3e}"
        );
    }
}

/// The scalar kernels (`fa2`) asked for explicitly.
const SCALAR: BackwardOptions = BackwardOptions {
    algorithm: BackwardAlgorithm::Fa2,
    deterministic: false,
};

/// The scalar kernels at the odd shapes, then the standard backward (S, P, dP, dS in HBM) at
/// the same shapes in varied placements: its plan runs the standard forward's scores and softmax
/// and the four backward kernels, and deterministic mode is accepted (it has no atomic adds).
fn check_dtype<T: Element>(test: &str) {
    let Some(gpu) = common::gpu_or_skip(test) else {
        return;
    };
    let mut rng = common::seeded_rng(test);
    for shape in SHAPES {
        for causal in [false, true] {
            let (plan, _) = check_shape::<T>(&gpu, shape, causal, &SCALAR, PLAIN, &mut rng);
            assert_eq!(plan.algorithm, BackwardAlgorithm::Fa2, "{plan}");
        }
    }
    for (i, shape) in SHAPES.into_iter().enumerate() {
        for causal in [false, true] {
            let standard = BackwardOptions {
                algorithm: BackwardAlgorithm::Standard,
                deterministic: i % 2 == 1,
            };
            let placement = Placement {
                layout: if i % 3 == 0 {
                    Layout::BatchSeqHeadDim
                } else {
                    Layout::BatchHeadSeqDim
                },
                strided_q: i % 4 == 2,
            };
            let (plan, _) = check_shape::<T>(&gpu, shape, causal, &standard, placement, &mut rng);
            assert_eq!(plan.algorithm, BackwardAlgorithm::Standard, "{plan}");
            assert_eq!(plan.launches.len(), 6, "{plan}");
            let (b, h, n, m, _) = shape;
            assert_eq!(plan.scores, b * h * n * m, "{plan}");
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

/// The standard backward's workspace past the device's memory: an out-of-memory error naming
/// the bytes of S, before any kernel runs; the FA2 backward of the same problem runs.
#[test]
fn the_standard_backward_reports_out_of_memory_with_the_bytes() {
    let test = "backward_standard_oom";
    let Some(gpu) = common::gpu_or_skip(test) else {
        return;
    };
    let (_, total) = gpu.memory().expect("memory");
    // One head whose N × N f32 S alone is about twice the device's memory.
    let n = ((total as f64 / 2.0).sqrt() as usize).next_multiple_of(64);
    let dims = [1, 1, n, 8];
    let zeros =
        || DeviceTensor::filled(&gpu, dims, Layout::BatchHeadSeqDim, bf16::ZERO).expect("alloc");
    let (q, k, v, d_o) = (zeros(), zeros(), zeros(), zeros());
    let options = AttentionOptions::default();
    let forward = common::forward(&gpu, Algorithm::Fa2, &q, &k, &v, &options).expect("fwd");
    let mut gradients = Gradients {
        dq: zeros(),
        dk: zeros(),
        dv: zeros(),
    };
    let standard = BackwardOptions {
        algorithm: BackwardAlgorithm::Standard,
        deterministic: false,
    };
    let mut run = |backward: &BackwardOptions| {
        common::backward_into(
            &gpu,
            &q,
            &k,
            &v,
            &forward,
            &d_o,
            &mut gradients,
            &options,
            backward,
        )
    };
    let error = run(&standard).expect_err("S does not fit");
    let message = error.to_string();
    println!("{test}: N = {n}: {message}");
    assert!(
        matches!(error, flash_attn::Error::OutOfMemory { requested, .. } if requested == 4 * n * n),
        "{message}"
    );
    assert!(message.contains("S, dP and dS"), "{message}");
    run(&BackwardOptions::default()).expect("the FA2 backward fits");
}

/// Head dims of the tensor-core grid: below, at and between its capacities (64, 128, 192, 256).
const TENSOR_CORE_HEAD_DIMS: [usize; 7] = [16, 40, 64, 96, 128, 192, 256];

/// (batch, heads, seqlen_q, seqlen_k): a short row, tails on both sides, more queries than keys
/// (causal: the first rows see no key) and fewer.
const TENSOR_CORE_SHAPES: [(usize, usize, usize, usize); 4] = [
    (1, 2, 1, 17),
    (2, 1, 113, 203),
    (1, 2, 203, 113),
    (1, 1, 130, 130),
];

/// The tensor-core backward `fa2-tc`, asked for by name (the default is `fa3` on a 9.0 device).
const FA2_TC: BackwardOptions = BackwardOptions {
    algorithm: BackwardAlgorithm::Fa2Tc,
    deterministic: false,
};

/// `backward` over a grid of head dims and shapes, causal and not, in both layouts and with a
/// strided Q: every case must run `expected` (no fallback) and pass the tolerance. With
/// `hopper`, skipped (saying so) on a GPU that is not compute capability 9.0.
fn check_grid<T: Element>(
    test: &str,
    head_dims: &[usize],
    shapes: &[(usize, usize, usize, usize)],
    backward: &BackwardOptions,
    expected: BackwardAlgorithm,
    hopper: bool,
) {
    let Some(gpu) = gpu_for(test, hopper) else {
        return;
    };
    let mut rng = common::seeded_rng(test);
    let placements = [
        PLAIN,
        Placement {
            layout: Layout::BatchSeqHeadDim,
            strided_q: false,
        },
        Placement {
            layout: Layout::BatchHeadSeqDim,
            strided_q: true,
        },
    ];
    for &head_dim in head_dims {
        for &(b, h, n, m) in shapes {
            for causal in [false, true] {
                for placement in placements {
                    let shape = (b, h, n, m, head_dim);
                    let (plan, _) =
                        check_shape::<T>(&gpu, shape, causal, backward, placement, &mut rng);
                    assert_eq!(plan.algorithm, expected, "{plan}");
                    assert_eq!(plan.fallback, None, "{plan}");
                }
            }
        }
    }
}

/// The GPU, or `None` where the test is skipped: no GPU (`common::gpu_or_skip`), or with
/// `hopper` one that is not compute capability 9.0 (FA3's module is sm_90a).
fn gpu_for(test: &str, hopper: bool) -> Option<Gpu> {
    let gpu = common::gpu_or_skip(test)?;
    if hopper && !gpu.has_hopper_module() {
        println!("{test}: skipped: the GPU is not compute capability 9.0 (FA3 is sm_90a)");
        return None;
    }
    Some(gpu)
}

#[test]
fn f16_tensor_core_gradients_match_the_reference() {
    let (d, shapes) = (&TENSOR_CORE_HEAD_DIMS, &TENSOR_CORE_SHAPES);
    check_grid::<f16>(
        "backward_tc_f16",
        d,
        shapes,
        &FA2_TC,
        BackwardAlgorithm::Fa2Tc,
        false,
    );
}

#[test]
fn bf16_tensor_core_gradients_match_the_reference() {
    let (d, shapes) = (&TENSOR_CORE_HEAD_DIMS, &TENSOR_CORE_SHAPES);
    check_grid::<bf16>(
        "backward_tc_bf16",
        d,
        shapes,
        &FA2_TC,
        BackwardAlgorithm::Fa2Tc,
        false,
    );
}

/// Random shapes (seqlen 1 to `max_seqlen` each way, head dims multiples of 8 up to
/// `max_head_dim`, causal or not, either layout, f16 or bf16) on `backward`, which must run
/// `expected`.
fn check_random_shapes(
    test: &str,
    max_seqlen: usize,
    max_head_dim: usize,
    backward: &BackwardOptions,
    expected: BackwardAlgorithm,
    hopper: bool,
) {
    let Some(gpu) = gpu_for(test, hopper) else {
        return;
    };
    let mut rng = common::seeded_rng(test);
    for _ in 0..24 {
        let shape = (
            rng.random_range(1..=2),
            rng.random_range(1..=3),
            rng.random_range(1..=max_seqlen),
            rng.random_range(1..=max_seqlen),
            8 * rng.random_range(1..=max_head_dim / 8),
        );
        let causal = rng.random_bool(0.5);
        let placement = Placement {
            layout: if rng.random_bool(0.5) {
                Layout::BatchHeadSeqDim
            } else {
                Layout::BatchSeqHeadDim
            },
            strided_q: rng.random_bool(0.25),
        };
        let plan = if rng.random_bool(0.5) {
            check_shape::<f16>(&gpu, shape, causal, backward, placement, &mut rng).0
        } else {
            check_shape::<bf16>(&gpu, shape, causal, backward, placement, &mut rng).0
        };
        assert_eq!(plan.algorithm, expected, "{plan}");
    }
}

#[test]
fn random_shapes_on_tensor_cores_match_the_reference() {
    let fa2_tc = BackwardAlgorithm::Fa2Tc;
    check_random_shapes("backward_tc_random", 700, 256, &FA2_TC, fa2_tc, false);
}

/// Head dims of the FA3 backward's grid: below, at and between its compiled ones (64, 96, 128).
const FA3_HEAD_DIMS: [usize; 7] = [16, 40, 64, 72, 96, 104, 128];

/// (batch, heads, seqlen_q, seqlen_k) for FA3 beside the tensor-core shapes: longer ones whose
/// key blocks walk the Q_i/dO_i ring through several phases (11 and 9 row blocks of 64) with
/// tails on both sides.
const FA3_LONG_SHAPES: [(usize, usize, usize, usize); 2] = [(1, 1, 700, 650), (2, 1, 517, 300)];

/// The tensor-core shapes and FA3's longer ones.
fn fa3_shapes() -> Vec<(usize, usize, usize, usize)> {
    [TENSOR_CORE_SHAPES.as_slice(), &FA3_LONG_SHAPES].concat()
}

/// FA3's backward, asked for by name (fa2-tc is the default), over its grid.
fn check_fa3_grid<T: Element>(test: &str) {
    let fa3 = BackwardAlgorithm::Fa3;
    let options = fa3_by_name();
    check_grid::<T>(test, &FA3_HEAD_DIMS, &fa3_shapes(), &options, fa3, true);
}

/// The backward options that ask for FA3's backward.
fn fa3_by_name() -> BackwardOptions {
    BackwardOptions {
        algorithm: BackwardAlgorithm::Fa3,
        ..Default::default()
    }
}

#[test]
fn f16_fa3_gradients_match_the_reference() {
    check_fa3_grid::<f16>("backward_fa3_f16");
}

#[test]
fn bf16_fa3_gradients_match_the_reference() {
    check_fa3_grid::<bf16>("backward_fa3_bf16");
}

#[test]
fn random_shapes_on_fa3_match_the_reference() {
    let fa3 = BackwardAlgorithm::Fa3;
    check_random_shapes("backward_fa3_random", 1100, 128, &fa3_by_name(), fa3, true);
}

/// A head dim that is not a multiple of 8 and f32 run the scalar kernels, and the plan says why.
#[test]
fn the_tensor_core_backward_falls_back_with_a_reason() {
    let test = "backward_tc_fallback";
    let Some(gpu) = common::gpu_or_skip(test) else {
        return;
    };
    let mut rng = common::seeded_rng(test);
    let backward = BackwardOptions::default();
    let (plan, _) = check_shape::<bf16>(&gpu, (1, 2, 50, 70, 20), true, &backward, PLAIN, &mut rng);
    assert_eq!(plan.algorithm, BackwardAlgorithm::Fa2, "{plan}");
    let reason = plan.fallback.as_deref().unwrap_or_default();
    assert!(
        reason.contains("head_dim 20 is not a multiple of 8"),
        "{plan}"
    );
    let (plan, _) = check_shape::<f32>(&gpu, (1, 1, 33, 33, 64), false, &backward, PLAIN, &mut rng);
    assert_eq!(plan.algorithm, BackwardAlgorithm::Fa2, "{plan}");
    assert!(
        plan.fallback.as_deref().unwrap_or_default().contains("f32"),
        "{plan}"
    );
}

/// Head dims of the wide pre- and post-pass beside the grids': one chunk per row (8), chunks
/// that leave lanes of their group idle (40: 5 of 8, 72: 9 of 16, 136: 17 of 32, 200: 25 of
/// 32), and 31 of 32 (248).
const WIDE_PASS_HEAD_DIMS: [usize; 6] = [8, 40, 72, 136, 200, 248];

/// (batch, heads, seqlen_q, seqlen_k) for the wide passes: one row, a row block's tail, several
/// blocks with a tail at every head dim (16 to 512 rows per block), more queries than keys.
const WIDE_PASS_SHAPES: [(usize, usize, usize, usize); 4] = [
    (1, 2, 1, 17),
    (2, 1, 17, 17),
    (1, 2, 203, 113),
    (1, 1, 530, 40),
];

/// The wide pre- and post-pass (16-byte loads and stores; `fa2_backward_preprocess_wide_*`) on
/// the default backward (fa3 to d = 128, fa2-tc above) at the head dims and shapes above, causal
/// and not, f16 and bf16: the plan runs them and the gradients match the reference.
#[test]
fn the_wide_passes_match_the_reference_at_every_chunk_layout() {
    let test = "backward_wide_passes";
    let Some(gpu) = common::gpu_or_skip(test) else {
        return;
    };
    let mut rng = common::seeded_rng(test);
    let backward = BackwardOptions::default();
    for (i, head_dim) in WIDE_PASS_HEAD_DIMS.into_iter().enumerate() {
        for (j, (b, h, n, m)) in WIDE_PASS_SHAPES.into_iter().enumerate() {
            for causal in [false, true] {
                let shape = (b, h, n, m, head_dim);
                let plan = if (i + j) % 2 == 0 {
                    check_shape::<bf16>(&gpu, shape, causal, &backward, PLAIN, &mut rng).0
                } else {
                    check_shape::<f16>(&gpu, shape, causal, &backward, PLAIN, &mut rng).0
                };
                assert!(plan.has_wide_passes(), "{plan}");
                assert_eq!(plan.element_wise_passes, None, "{plan}");
            }
        }
    }
}

/// O, dO or dQ with rows 8 bytes off 16-byte alignment (row stride d + 4): the element-wise
/// pre- and post-pass run, the plan names the tensor, the gradients match the reference, and
/// dQ's padding stays as it was (NaN). O and dQ leave the main kernel as it was (it reads
/// neither); dO sends it to fa2 as well. bf16, d = 40 and 128, a short causal case and a long
/// one with more queries than keys.
#[test]
fn misaligned_o_d_o_or_dq_runs_the_element_wise_passes() {
    let test = "backward_wide_passes_misaligned";
    let Some(gpu) = common::gpu_or_skip(test) else {
        return;
    };
    let mut rng = common::seeded_rng(test);
    for misaligned in ["o", "d_o", "dq"] {
        for (shape, causal) in [((2, 2, 17, 30, 40), true), ((1, 2, 203, 113, 128), false)] {
            check_misaligned::<bf16>(&gpu, misaligned, shape, causal, &mut rng);
        }
    }
}

/// One case of [`misaligned_o_d_o_or_dq_runs_the_element_wise_passes`].
fn check_misaligned<T: Element>(
    gpu: &Gpu,
    misaligned: &str,
    (batch, heads, seqlen_q, seqlen_k, head_dim): (usize, usize, usize, usize, usize),
    causal: bool,
    rng: &mut rand::rngs::StdRng,
) {
    const PAD: usize = 4;
    let q_dims = [batch, heads, seqlen_q, head_dim];
    let kv_dims = [batch, heads, seqlen_k, head_dim];
    let (q, k, v, d_o) = (
        random_tensor::<T>(q_dims, rng),
        random_tensor::<T>(kv_dims, rng),
        random_tensor::<T>(kv_dims, rng),
        random_tensor::<T>(q_dims, rng),
    );
    let plain = |a: &Array4<T>| upload(gpu, a, PLAIN, false);
    let (q_gpu, k_gpu, v_gpu) = (plain(&q), plain(&k), plain(&v));
    let d_o_gpu = if misaligned == "d_o" {
        upload_padded(gpu, &d_o, PAD)
    } else {
        plain(&d_o)
    };
    let options = AttentionOptions {
        causal,
        ..Default::default()
    };
    let call = flash_attn::Attention::new(&q_gpu, &k_gpu, &v_gpu).options(options);
    let forward = call.forward(gpu).expect("forward");
    let flash_attn::RowStatistics::LogSumExp(logsumexp) = &forward.stats else {
        panic!("the forward returns L")
    };
    // O as the forward wrote it, or the same values with padded rows.
    let o_padded = (misaligned == "o")
        .then(|| upload_padded(gpu, &forward.o.to_array(gpu).expect("download"), PAD));
    let o = o_padded.as_ref().unwrap_or(&forward.o);
    // dQ in a buffer of rows d + PAD wide (NaN), viewed as d wide where misaligned.
    let dq_pad = if misaligned == "dq" { PAD } else { 0 };
    let dq_buffer = DeviceTensor::from_array(
        gpu,
        Array4::from_elem([batch, heads, seqlen_q, head_dim + dq_pad], T::poison()).view(),
        Layout::BatchHeadSeqDim,
    )
    .expect("upload");
    let dq_buffer_ref: flash_attn::TensorRef<T> = (&dq_buffer).into();
    // SAFETY: the buffer holds every element these dims and strides reach, and stays alive and
    // otherwise unused until the backward below has finished (its gradients are read after it).
    let dq = unsafe {
        flash_attn::TensorRef::from_raw(dq_buffer_ref.address(), q_dims, dq_buffer.strides())
    };
    let poisoned = |dims| DeviceTensor::filled(gpu, dims, Layout::BatchHeadSeqDim, T::poison());
    let (mut dk, mut dv) = (
        poisoned(kv_dims).expect("dk"),
        poisoned(kv_dims).expect("dv"),
    );
    let plan = call
        .backward_into(
            gpu,
            flash_attn::BackwardTensors {
                o: o.into(),
                logsumexp: logsumexp.into(),
                d_o: (&d_o_gpu).into(),
                gradients: Gradients {
                    dq,
                    dk: (&mut dk).into(),
                    dv: (&mut dv).into(),
                },
            },
        )
        .expect("backward");
    let flash_attn::attention::PassPlan::Backward(plan) = plan.pass else {
        panic!("a backward plan")
    };
    let what = format!(
        "{} {q_dims:?}×{seqlen_k} causal={causal} {misaligned} misaligned ({plan})",
        T::DTYPE
    );
    assert!(!plan.has_wide_passes(), "{what}");
    let reason = plan.element_wise_passes.clone().unwrap_or_default();
    assert!(
        reason.starts_with(&format!("{misaligned}'s rows are not 16-byte aligned")),
        "{what}"
    );
    // dO also moves the main kernel to fa2; O and dQ leave it where it was (fa3 on 9.0, fa2-tc
    // elsewhere), whatever the fallback says about the device.
    let fallback = plan.fallback.clone().unwrap_or_default();
    if misaligned == "d_o" {
        assert_eq!(plan.algorithm, BackwardAlgorithm::Fa2, "{what}");
    } else {
        assert_ne!(plan.algorithm, BackwardAlgorithm::Fa2, "{what}");
        assert!(!fallback.contains("aligned"), "{what}");
    }
    let dq_rows = dq_buffer.to_array(gpu).expect("download");
    let got = Gradients {
        dq: dq_rows
            .slice(ndarray::s![.., .., .., ..head_dim])
            .to_owned(),
        dk: dk.to_array(gpu).expect("download"),
        dv: dv.to_array(gpu).expect("download"),
    };
    let padding = dq_rows.slice(ndarray::s![.., .., .., head_dim..]);
    assert!(
        padding.iter().all(|x| x.to_f64().is_nan()),
        "{what}: a kernel wrote into dQ's padding"
    );
    let inputs = BackwardInputs {
        q: &q,
        k: &k,
        v: &v,
        d_o: &d_o,
    };
    assert_matches_reference(&what, &inputs, causal, &got);
}

/// Deterministic mode: the same inputs twice give dQ with the same bits (and within the
/// tolerance), at a shape where many key blocks add to every row block.
#[test]
fn deterministic_mode_gives_the_same_dq_bits_twice() {
    let test = "backward_tc_deterministic";
    let Some(gpu) = common::gpu_or_skip(test) else {
        return;
    };
    let seed: u64 = rand::random();
    println!("{test}: inputs from seed {seed}");
    // fa3 where it runs (compute capability 9.0, d ≤ 128), its fallback fa2-tc elsewhere, and
    // fa2-tc by name.
    let hopper = gpu.has_hopper_module();
    for algorithm in [BackwardAlgorithm::Fa3, BackwardAlgorithm::Fa2Tc] {
        let deterministic = BackwardOptions {
            algorithm,
            deterministic: true,
        };
        for (head_dim, causal) in [
            (64, false),
            (64, true),
            (128, false),
            (128, true),
            (256, true),
        ] {
            let expected = if algorithm == BackwardAlgorithm::Fa3 && hopper && head_dim <= 128 {
                BackwardAlgorithm::Fa3
            } else {
                BackwardAlgorithm::Fa2Tc
            };
            // seqlen_q > seqlen_k: with the causal mask the first rows see no key.
            let shape = (2, 2, 1100, 1000, head_dim);
            let mut runs = Vec::new();
            for _ in 0..2 {
                let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
                let (plan, bits) =
                    check_shape::<bf16>(&gpu, shape, causal, &deterministic, PLAIN, &mut rng);
                assert!(plan.deterministic && plan.dq_flags > 0, "{plan}");
                assert_eq!(plan.algorithm, expected, "{plan}");
                runs.push(bits);
            }
            let differing = runs[0].iter().zip(&runs[1]).filter(|(a, b)| a != b).count();
            assert_eq!(
                differing, 0,
                "{expected}, d = {head_dim}, causal = {causal}: {differing} elements of dQ \
                 differ between runs"
            );
        }
    }
}

/// The tensor-core backward at the benchmark's shapes (bf16, B·N = 16384 tokens, H·d = 2048,
/// N = 2k–16k, d = 64 and 128, causal and not): prints milliseconds and TFLOP/s (2.5 × the
/// forward's FLOPs, halved for causal, over the backward's time: pre-pass, main kernel,
/// post-pass), atomic and deterministic, and checks that every deterministic run gives dQ the
/// same bits. Minutes of GPU time: run with `--ignored`.
#[test]
#[ignore]
fn time_the_tensor_core_backward_at_the_benchmark_shapes() {
    let test = "backward_tc_timing";
    let Some(gpu) = common::gpu_or_skip(test) else {
        return;
    };
    let mut rng = common::seeded_rng(test);
    const RUNS: usize = 10;
    for head_dim in [64, 128] {
        for seqlen in [2048, 4096, 8192, 16384] {
            for causal in [false, true] {
                let (batch, heads) = (16384 / seqlen, 2048 / head_dim);
                let dims = [batch, heads, seqlen, head_dim];
                let tensor = |rng: &mut rand::rngs::StdRng| {
                    let host = random_tensor::<bf16>(dims, rng);
                    DeviceTensor::from_array(&gpu, host.view(), Layout::BatchHeadSeqDim)
                        .expect("upload")
                };
                let (q, k, v, d_o) = (
                    tensor(&mut rng),
                    tensor(&mut rng),
                    tensor(&mut rng),
                    tensor(&mut rng),
                );
                let options = AttentionOptions {
                    causal,
                    ..Default::default()
                };
                let forward =
                    common::forward(&gpu, Algorithm::Fa2Tc, &q, &k, &v, &options).expect("fwd");
                let zeros = |_| {
                    DeviceTensor::filled(&gpu, dims, Layout::BatchHeadSeqDim, bf16::ZERO)
                        .expect("alloc")
                };
                let mut gradients = Gradients {
                    dq: zeros(0),
                    dk: zeros(1),
                    dv: zeros(2),
                };
                let forward_flops =
                    4.0 * (batch * heads) as f64 * (seqlen * seqlen) as f64 * head_dim as f64
                        / if causal { 2.0 } else { 1.0 };
                let mut line = format!("d = {head_dim}, N = {seqlen}, causal = {causal}:");
                for deterministic in [false, true] {
                    let backward = BackwardOptions {
                        deterministic,
                        ..FA2_TC
                    };
                    let run = |gradients: &mut Gradients<DeviceTensor<bf16>>| {
                        common::backward_into(
                            &gpu, &q, &k, &v, &forward, &d_o, gradients, &options, &backward,
                        )
                        .map(|_| ())
                    };
                    run(&mut gradients).expect("warm-up");
                    let first_dq = gradients.dq.to_array(&gpu).expect("download");
                    let mut times = gpu
                        .time_each_ms(RUNS, |_| run(&mut gradients))
                        .expect("timed runs");
                    times.sort_by(f32::total_cmp);
                    let ms = f64::from(times[RUNS / 2]);
                    let tflops = 2.5 * forward_flops / (ms * 1e-3) / 1e12;
                    let mode = if deterministic {
                        "deterministic"
                    } else {
                        "atomic"
                    };
                    line += &format!(" {mode} {ms:.3} ms ({tflops:.1} TFLOP/s)");
                    if deterministic {
                        let last_dq = gradients.dq.to_array(&gpu).expect("download");
                        let same = first_dq
                            .iter()
                            .zip(&last_dq)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{line}: dQ changed between deterministic runs");
                    }
                }
                println!("{line}");
            }
        }
    }
}
