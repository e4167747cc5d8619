//! Grouped-query attention (GQA, and MQA with one K/V head): K and V with fewer heads than Q, read
//! in place (query head h reads K/V head h / (heads_q / heads_kv)), and the backward, whose dK
//! and dV sum over each K/V head's query heads. The CPU tests check the shape rules, the
//! reference's head mapping and its gradients (a grouped problem is the problem with K/V
//! repeated per query head, dK and dV summed per group), the backward emulator's group sum and
//! the plans; the GPU tests run every forward algorithm and every backward against the f64
//! reference with the tolerance rules of `tools::check` and `tools::check_backward` (skipped
//! without a GPU unless `FLASH_ATTN_REQUIRE_GPU=1`).

use crate::common;

use flash_attn::attention::backward_plan::{BackwardOptions, BackwardViews};
use flash_attn::attention::{
    BackwardAlgorithm, BackwardArguments, BackwardPlan, BackwardProblem, CompiledLimits,
    ForwardPlan, Gradients, TensorSpec,
};
use flash_attn::{
    Algorithm, AttentionOptions, DType, DeviceTensor, Element, Error, Gpu, Layout, Problem,
};
use flash_attn_lab::model::fa2_backward::{BackwardInputs as EmulatorInputs, emulate_fa2_backward};
use flash_attn_lab::model::reference::attention_reference;
use flash_attn_lab::model::reference_backward::{
    attention_backward_in_dtype, attention_backward_reference,
};
use flash_attn_lab::tools::check::{CheckProblem, check_problem_with, describe, to_f64};
use flash_attn_lab::tools::check_backward::{
    BackwardInputs, BackwardReference, random_backward_tensors,
};
use flash_kernels::common::params::TensorView;
use flash_kernels::registry::{BackwardStage, Family, KERNELS, KernelId};
use half::bf16;
use ndarray::{Array4, Axis};

/// Query heads and K/V heads of the cases: groups of 1, 2, 4 and 8 (8 on 1 is MQA), and MQA with
/// an odd head count.
const HEADS: [(usize, usize); 5] = [(8, 8), (8, 4), (8, 2), (8, 1), (3, 1)];

fn invalid_name(result: flash_attn::Result<Problem>) -> &'static str {
    match result {
        Err(Error::InvalidArgument { name, .. }) => name,
        other => panic!("expected an invalid argument, got {other:?}"),
    }
}

#[test]
fn k_and_v_heads_must_divide_q_heads_and_agree() {
    let o = AttentionOptions::default();
    for (heads, heads_kv) in HEADS {
        let p = Problem::new(
            [2, heads, 100, 64],
            [2, heads_kv, 70, 64],
            [2, heads_kv, 70, 64],
            &o,
        )
        .unwrap();
        assert_eq!(
            (p.heads, p.heads_kv, p.kv_group()),
            (heads, heads_kv, heads / heads_kv)
        );
        assert_eq!(p.is_grouped(), heads != heads_kv);
        assert_eq!(p.kv_dims(), [2, heads_kv, 70, 64]);
        // Query head h reads K/V head h / group: the last query head the last K/V head.
        assert_eq!(p.kv_head(0), 0);
        assert_eq!(p.kv_head(heads - 1), heads_kv - 1);
    }
    // 3 K/V heads do not divide 8 query heads; more K/V heads than query heads neither.
    let error = Problem::new([1, 8, 4, 64], [1, 3, 4, 64], [1, 3, 4, 64], &o).unwrap_err();
    assert!(
        matches!(&error, Error::InvalidArgument { name: "k", .. })
            && error.to_string().contains("must divide q's"),
        "{error}"
    );
    assert_eq!(
        invalid_name(Problem::new(
            [1, 2, 4, 64],
            [1, 4, 4, 64],
            [1, 4, 4, 64],
            &o
        )),
        "k"
    );
    // K and V must have one head count.
    assert_eq!(
        invalid_name(Problem::new(
            [1, 8, 4, 64],
            [1, 2, 4, 64],
            [1, 4, 4, 64],
            &o
        )),
        "v"
    );
}

/// Q, K, V of `heads` and `heads_kv` heads, and K, V with each K/V head repeated `heads /
/// heads_kv` times (what a copy-based GQA would build).
fn grouped_and_repeated(
    heads: usize,
    heads_kv: usize,
    seed: u64,
) -> ([Array4<f64>; 3], [Array4<f64>; 2]) {
    let [q] = common::normal_tensors([2, heads, 37, 53, 16], seed, [true]);
    let [k, v] = common::normal_tensors([2, heads_kv, 37, 53, 16], seed + 1, [false, false]);
    let group = heads / heads_kv;
    let repeat = |a: &Array4<f64>| {
        let index: Vec<usize> = (0..heads).map(|h| h / group).collect();
        a.select(Axis(1), &index)
    };
    let (q, k, v) = (q.mapv(f64::from), k.mapv(f64::from), v.mapv(f64::from));
    let (k_full, v_full) = (repeat(&k), repeat(&v));
    ([q, k, v], [k_full, v_full])
}

#[test]
fn the_reference_reads_each_query_head_s_kv_head() {
    for (i, (heads, heads_kv)) in HEADS.into_iter().enumerate() {
        let ([q, k, v], [k_full, v_full]) = grouped_and_repeated(heads, heads_kv, 10 * i as u64);
        for causal in [false, true] {
            let grouped = attention_reference(q.view(), k.view(), v.view(), causal, 0.25);
            let repeated =
                attention_reference(q.view(), k_full.view(), v_full.view(), causal, 0.25);
            // The same arithmetic on the same values: equal bit for bit.
            assert_eq!(grouped.o, repeated.o, "{heads}/{heads_kv} causal {causal}");
            let same_l = grouped
                .logsumexp
                .iter()
                .zip(&repeated.logsumexp)
                .all(|(a, b)| a == b);
            assert!(same_l, "{heads}/{heads_kv} causal {causal}: L differs");
        }
    }
}

#[test]
fn the_emulators_match_the_reference_with_grouped_heads() {
    let ([q, k, v], _) = grouped_and_repeated(8, 2, 7);
    let (q32, k32, v32) = (
        q.mapv(|x| x as f32),
        k.mapv(|x| x as f32),
        v.mapv(|x| x as f32),
    );
    let reference = attention_reference(q.view(), k.view(), v.view(), true, 0.25);
    let (o, _, _) = flash_attn_lab::model::fa2::emulate_fa2(
        q32.view(),
        k32.view(),
        v32.view(),
        true,
        0.25,
        (64, 64),
        DType::F32,
    );
    let worst = o
        .iter()
        .zip(&reference.o)
        .fold(0.0f64, |m, (&a, &b)| m.max((a as f64 - b).abs()));
    assert!(worst < 1e-4, "FA2's emulator: max |O − O_ref| = {worst:e}");
}

#[test]
fn every_forward_plan_runs_its_own_kernel_with_grouped_heads() {
    // GQA changes no choice of kernel: fa3 and fa2-tc run their own (no fallback), on the grid
    // of the query heads.
    let o = AttentionOptions::default();
    for (heads, heads_kv) in HEADS {
        for d in [64, 128] {
            let p = Problem::new(
                [2, heads, 1000, d],
                [2, heads_kv, 777, d],
                [2, heads_kv, 777, d],
                &o,
            )
            .unwrap();
            for (algorithm, family) in [
                (Algorithm::Fa3, "fa3_forward_"),
                (Algorithm::Fa2Tc, "fa2tc_forward_"),
            ] {
                let plan =
                    ForwardPlan::new(&CompiledLimits::H200, algorithm, DType::Bf16, &p, &o, None)
                        .unwrap();
                assert_eq!(plan.fallback, None, "{algorithm} {heads}/{heads_kv} d {d}");
                assert!(
                    plan.kernel_names().starts_with(family),
                    "{}",
                    plan.kernel_names()
                );
            }
        }
    }
}

/// Q, K, V and dO of a grouped problem (`heads` query heads on `heads_kv`), and K, V repeated
/// per query head: seqlen_q 37, seqlen_k 53, d 16.
fn backward_inputs(
    heads: usize,
    heads_kv: usize,
    seed: u64,
) -> ([Array4<f64>; 4], [Array4<f64>; 2]) {
    let ([q, k, v], repeated) = grouped_and_repeated(heads, heads_kv, seed);
    let [d_o] = common::normal_tensors([2, heads, 37, 53, 16], seed + 2, [true]);
    ([q, k, v, d_o.mapv(f64::from)], repeated)
}

/// dK or dV of one query head per head (the repeated problem's) summed over each group of
/// `group` heads, in the order of the heads, then passed through `round`.
fn sum_groups(
    per_query_head: &Array4<f64>,
    group: usize,
    round: impl Fn(f64) -> f64,
) -> Array4<f64> {
    let (b, heads, n, d) = per_query_head.dim();
    Array4::from_shape_fn((b, heads / group, n, d), |(bi, kv, j, x)| {
        let sum = (0..group).fold(0.0, |sum, m| {
            sum + per_query_head[[bi, kv * group + m, j, x]]
        });
        round(sum)
    })
}

#[test]
fn the_reference_backward_sums_dk_and_dv_over_each_group() {
    for (i, (heads, heads_kv)) in HEADS.into_iter().enumerate() {
        let group = heads / heads_kv;
        let ([q, k, v, d_o], [k_full, v_full]) = backward_inputs(heads, heads_kv, 20 * i as u64);
        for causal in [false, true] {
            let case = format!("{heads}/{heads_kv} causal {causal}");
            let grouped = attention_backward_reference(
                q.view(),
                k.view(),
                v.view(),
                d_o.view(),
                causal,
                0.25,
            );
            let repeated = attention_backward_reference(
                q.view(),
                k_full.view(),
                v_full.view(),
                d_o.view(),
                causal,
                0.25,
            );
            // The same arithmetic on the same values, then the group's sum in the order of its
            // query heads: equal bit for bit.
            let (g, r) = (&grouped.gradients, &repeated.gradients);
            assert_eq!(g.dq, r.dq, "{case}: dQ");
            assert_eq!(grouped.delta, repeated.delta, "{case}: D");
            assert_eq!(g.dk, sum_groups(&r.dk, group, |x| x), "{case}: dK");
            assert_eq!(g.dv, sum_groups(&r.dv, group, |x| x), "{case}: dV");
            assert_eq!(g.dk.dim(), k.dim(), "{case}");

            // In the dtype: each query head's part rounded, the sum rounded again.
            let grouped = attention_backward_in_dtype::<bf16>(
                q.mapv(bf16_value).view(),
                k.mapv(bf16_value).view(),
                v.mapv(bf16_value).view(),
                d_o.mapv(bf16_value).view(),
                causal,
                0.25,
            );
            let repeated = attention_backward_in_dtype::<bf16>(
                q.mapv(bf16_value).view(),
                k_full.mapv(bf16_value).view(),
                v_full.mapv(bf16_value).view(),
                d_o.mapv(bf16_value).view(),
                causal,
                0.25,
            );
            let (g, r) = (&grouped.gradients, &repeated.gradients);
            assert_eq!(g.dq, r.dq, "{case}: dQ in bf16");
            assert_eq!(
                g.dk,
                sum_groups(&r.dk, group, bf16_value),
                "{case}: dK in bf16"
            );
            assert_eq!(
                g.dv,
                sum_groups(&r.dv, group, bf16_value),
                "{case}: dV in bf16"
            );
        }
    }
}

fn bf16_value(x: f64) -> f64 {
    bf16::from_f64(x).to_f64()
}

/// The FA2 backward's emulator with grouped heads is the emulator on K/V repeated per query
/// head with dK, dV summed per group in f32 and rounded (the GPU's group sum), bit for bit; its
/// traffic is the repeated problem's plus the group sum's under dK and dV; and it meets the
/// reference.
#[test]
fn the_backward_emulator_runs_the_group_sum_with_grouped_heads() {
    for (i, (heads, heads_kv)) in HEADS.into_iter().enumerate() {
        let group = heads / heads_kv;
        let ([q, k, v, d_o], [k_full, v_full]) = backward_inputs(heads, heads_kv, 30 * i as u64);
        for dtype in [DType::F32, DType::Bf16] {
            let case = format!("{heads}/{heads_kv} {dtype}");
            let round = |x: f64| match dtype {
                DType::Bf16 => bf16_value(x),
                _ => x as f32 as f64,
            };
            let wide = |a: &Array4<f64>| a.mapv(|x| round(x) as f32);
            let (q, k, v, d_o, k_full, v_full) = (
                wide(&q),
                wide(&k),
                wide(&v),
                wide(&d_o),
                wide(&k_full),
                wide(&v_full),
            );
            let forward = attention_reference(
                q.mapv(f64::from).view(),
                k.mapv(f64::from).view(),
                v.mapv(f64::from).view(),
                true,
                0.25,
            );
            let (o, logsumexp) = (wide(&forward.o), forward.logsumexp.mapv(|x| x as f32));
            let run = |k: &Array4<f32>, v: &Array4<f32>| {
                emulate_fa2_backward(
                    EmulatorInputs {
                        q: q.view(),
                        k: k.view(),
                        v: v.view(),
                        o: o.view(),
                        d_o: d_o.view(),
                        logsumexp: logsumexp.view(),
                    },
                    true,
                    0.25,
                    (16, 32),
                    dtype,
                )
            };
            let (grouped, repeated) = (run(&k, &v), run(&k_full, &v_full));
            let (g, r) = (&grouped.gradients, &repeated.gradients);
            let summed = |a: &Array4<f32>| {
                let (b, _, n, d) = a.dim();
                Array4::from_shape_fn((b, heads_kv, n, d), |(bi, kv, j, x)| {
                    let sum = (0..group).fold(0.0f32, |s, m| s + a[[bi, kv * group + m, j, x]]);
                    round(f64::from(sum)) as f32
                })
            };
            assert_eq!(g.dq, r.dq, "{case}: dQ");
            assert_eq!(g.dk, summed(&r.dk), "{case}: dK");
            assert_eq!(g.dv, summed(&r.dv), "{case}: dV");
            // Traffic: the repeated problem's, plus under dK and dV the expanded workspace read
            // once by the group sum (written by the main loop as before) and the sums written.
            let (mut io, expanded) = (repeated.io, repeated.io.dk.elements.written);
            if group > 1 {
                for gradient in [&mut io.dk, &mut io.dv] {
                    gradient.elements.read += expanded;
                    gradient.elements.written += k.len() as u64;
                }
            }
            assert_eq!(grouped.io, io, "{case}");

            if dtype == DType::F32 {
                let exact = attention_backward_reference(
                    q.mapv(f64::from).view(),
                    k.mapv(f64::from).view(),
                    v.mapv(f64::from).view(),
                    d_o.mapv(f64::from).view(),
                    true,
                    0.25,
                );
                for (name, got, want) in [
                    ("dk", &g.dk, &exact.gradients.dk),
                    ("dv", &g.dv, &exact.gradients.dv),
                ] {
                    let worst = got
                        .iter()
                        .zip(want)
                        .fold(0.0f64, |m, (&a, &b)| m.max((f64::from(a) - b).abs()));
                    assert!(worst < 1e-4, "{case}: max |{name} − ref| = {worst:e}");
                }
            }
        }
    }
}

/// The backward's checks take grouped heads, and dK, dV must have K's heads.
#[test]
fn the_backward_takes_grouped_heads_and_checks_dk_against_k() {
    let spec = |dims: [usize; 4]| TensorSpec {
        dims,
        strides: [dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1].map(|s| s as isize),
        dtype: DType::Bf16,
    };
    let (q, kv) = ([1, 8, 16, 64], [1, 2, 16, 64]);
    let arguments = BackwardArguments {
        q: spec(q),
        k: spec(kv),
        v: spec(kv),
        o: spec(q),
        d_o: spec(q),
        logsumexp: [1, 8, 16],
        forward: None,
    };
    let checked = BackwardProblem::new(&arguments, &AttentionOptions::default()).unwrap();
    assert_eq!((checked.problem.heads, checked.problem.heads_kv), (8, 2));
    let gradients = |dk| Gradients {
        dq: spec(q),
        dk: spec(dk),
        dv: spec(kv),
    };
    assert!(checked.check_gradients(&gradients(kv)).is_ok());
    match checked.check_gradients(&gradients(q)) {
        Err(error @ Error::InvalidArgument { name: "dk", .. }) => {
            assert!(
                error.to_string().contains("k's shape [1, 2, 16, 64]"),
                "{error}"
            )
        }
        other => panic!("expected dk to be refused, got {other:?}"),
    }
}

/// The backward options every grouped case runs for `dtype`: each algorithm, and fa2-tc
/// deterministic for f16/bf16 (the head dims here are multiples of 8).
fn backward_cases(dtype: DType) -> Vec<BackwardOptions> {
    let mut cases: Vec<BackwardOptions> = BackwardAlgorithm::ALL
        .into_iter()
        .map(|algorithm| BackwardOptions {
            algorithm,
            deterministic: false,
        })
        .collect();
    if dtype != DType::F32 {
        cases.push(BackwardOptions {
            algorithm: BackwardAlgorithm::Fa2Tc,
            deterministic: true,
        });
    }
    cases
}

/// A grouped backward plans what the same problem with K/V repeated per query head plans, with
/// the main kernel compiled for grouped heads, the group sum last, and the expanded dK and dV in
/// its workspace; an ungrouped one has neither.
#[test]
fn the_grouped_backward_plan_ends_with_the_group_sum() {
    let options = AttentionOptions {
        causal: true,
        ..Default::default()
    };
    for (heads, heads_kv) in HEADS {
        for d in [40, 64, 128, 256] {
            let dims = |h, n| [2, h, n, d];
            let grouped = Problem::new(
                dims(heads, 113),
                dims(heads_kv, 203),
                dims(heads_kv, 203),
                &options,
            )
            .unwrap();
            let repeated = Problem::new(
                dims(heads, 113),
                dims(heads, 203),
                dims(heads, 203),
                &options,
            )
            .unwrap();
            for dtype in DType::ALL {
                for backward in backward_cases(dtype) {
                    let plan = |p: &Problem| {
                        BackwardPlan::new(&CompiledLimits::H200, dtype, p, &backward, None)
                    };
                    let case = format!("{heads}/{heads_kv} d {d} {dtype} {backward:?}");
                    let (g, r) = (plan(&grouped).unwrap(), plan(&repeated).unwrap());
                    assert_eq!(
                        (g.algorithm, &g.fallback),
                        (r.algorithm, &r.fallback),
                        "{case}"
                    );
                    assert_eq!(r.expanded_kv_gradients, 0, "{case}");
                    assert!(
                        r.launches.iter().all(|l| !is_grouped_kernel(l.kernel)),
                        "{case}"
                    );
                    if heads == heads_kv {
                        continue; // `r` itself: checked above.
                    }
                    let (last, before) = g.launches.split_last().unwrap();
                    assert_eq!(
                        last.kernel,
                        KernelId::new(Family::GroupSum, dtype.into()),
                        "{case}"
                    );
                    assert_eq!(
                        last.launch.grid,
                        (203usize.div_ceil(16) as u32, 2 * heads_kv as u32, 2),
                        "{case}"
                    );
                    assert!(KERNELS.contains(&last.kernel), "{case}");
                    // The same launches but for the main kernel's grouped variant.
                    assert_eq!(before.len(), r.launches.len(), "{case}");
                    for (a, b) in before.iter().zip(&r.launches) {
                        assert_eq!(a.launch, b.launch, "{case}");
                        assert!(
                            a.kernel.module().kernels().contains(&a.kernel),
                            "{case}: {}",
                            a.kernel
                        );
                        let main = matches!(
                            b.kernel.family,
                            Family::Fa2Backward(BackwardStage::Main { .. })
                                | Family::Fa2TcBackward { .. }
                                | Family::Fa3Backward { .. }
                        );
                        assert_eq!(is_grouped_kernel(a.kernel), main, "{case}: {}", a.kernel);
                        assert_eq!(a.kernel.head_dim_capacity(), b.kernel.head_dim_capacity());
                    }
                    let expanded = 2 * heads * 203 * d;
                    assert_eq!(g.expanded_kv_gradients, expanded, "{case}");
                    assert_eq!(
                        g.workspace_bytes(),
                        r.workspace_bytes() + 2 * expanded * dtype.size_bytes(),
                        "{case}"
                    );
                    let summed = format!("summed over {} query heads", heads / heads_kv);
                    assert!(g.to_string().contains(&summed), "{g}");
                }
            }
        }
    }
}

fn is_grouped_kernel(kernel: KernelId) -> bool {
    matches!(
        kernel.family,
        Family::Fa2Backward(BackwardStage::Main { grouped: true, .. })
            | Family::Fa2TcBackward { grouped: true, .. }
            | Family::Fa3Backward { grouped: true, .. }
    )
}

/// Grouped, the tensor-core kernel stores into the expanded workspace, so dK and dV rows that
/// are not 16-byte aligned do not make it fall back (ungrouped they do).
#[test]
fn grouped_gradients_need_no_aligned_rows() {
    let aligned = TensorView {
        addr: 1 << 20,
        batch_stride: 8 * 203 * 64,
        head_stride: 203 * 64,
        row_stride: 64,
    };
    let misaligned = TensorView {
        addr: (1 << 20) + 2,
        ..aligned
    };
    let views = BackwardViews {
        q: aligned,
        k: aligned,
        v: aligned,
        o: aligned,
        d_o: aligned,
        dq: aligned,
        dk: misaligned,
        dv: misaligned,
    };
    let o = AttentionOptions::default();
    for (heads_kv, falls_back) in [(8, true), (2, false)] {
        let kv = [2, heads_kv, 203, 64];
        let p = Problem::new([2, 8, 113, 64], kv, kv, &o).unwrap();
        let plan = BackwardPlan::new(
            &CompiledLimits::H200,
            DType::Bf16,
            &p,
            &BackwardOptions::default(),
            Some(&views),
        )
        .unwrap();
        assert_eq!(plan.fallback.is_some(), falls_back, "{plan}");
    }
}

/// The other layout (the gradients' when the inputs are in `layout`).
fn other(layout: Layout) -> Layout {
    match layout {
        Layout::BatchHeadSeqDim => Layout::BatchSeqHeadDim,
        Layout::BatchSeqHeadDim => Layout::BatchHeadSeqDim,
    }
}

/// One grouped backward problem: (heads, heads_kv, seqlen_q, seqlen_k, head_dim), batch 2.
type GroupedShape = (usize, usize, usize, usize, usize);

/// Fresh N(0, 1) Q, K, V, dO for `shape`, the FA2 forward, then every backward of
/// [`backward_cases`] (fa2-tc deterministic only at head dims that are multiples of 8) with the
/// inputs in each layout and NaN-poisoned gradients in the other, each against the f64
/// reference gradients (one reference for them all). Deterministic runs are repeated: the same
/// bits for dQ, dK, dV. Returns the failures (and asserts the plan: the grouped main kernel,
/// the group sum last, fa2-tc on tensor cores where it can).
fn check_grouped_backward<T: Element>(
    gpu: &Gpu,
    (heads, heads_kv, seqlen_q, seqlen_k, head_dim): GroupedShape,
    causal: bool,
    rng: &mut rand::rngs::StdRng,
) -> Vec<String> {
    let q_dims = [2, heads, seqlen_q, head_dim];
    let kv_dims = [2, heads_kv, seqlen_k, head_dim];
    let [q, k, v, d_o] = random_backward_tensors::<T>(q_dims, kv_dims, rng);
    let options = AttentionOptions {
        causal,
        ..Default::default()
    };
    let scale = 1.0 / (head_dim as f64).sqrt();
    let inputs = BackwardInputs {
        q: &q,
        k: &k,
        v: &v,
        d_o: &d_o,
    };
    let reference = BackwardReference::new(&inputs, causal, scale);
    let mut failures = Vec::new();
    for layout in Layout::ALL {
        let upload =
            |a: &Array4<T>| DeviceTensor::from_array(gpu, a.view(), layout).expect("upload");
        let tensors = [upload(&q), upload(&k), upload(&v), upload(&d_o)];
        let [q_gpu, k_gpu, v_gpu, d_o_gpu] = &tensors;
        for backward in backward_cases(T::DTYPE) {
            if backward.deterministic && !head_dim.is_multiple_of(8) {
                continue; // The scalar kernels refuse deterministic mode (by design).
            }
            let run = || {
                let (gradients, plan) = common::run_backward_poisoned(
                    gpu,
                    [q_gpu, k_gpu, v_gpu, d_o_gpu],
                    &options,
                    &backward,
                    other(layout),
                )
                .expect("the backward failed");
                let download = |t: &DeviceTensor<T>| t.to_array(gpu).expect("download");
                let got = Gradients {
                    dq: download(&gradients.dq),
                    dk: download(&gradients.dk),
                    dv: download(&gradients.dv),
                };
                (got, plan)
            };
            let (got, plan) = run();
            let what = format!(
                "{} {heads}/{heads_kv} {seqlen_q}×{seqlen_k} d {head_dim} causal {causal} \
                 inputs {layout:?} {backward:?} [{}]",
                T::DTYPE,
                plan.kernel_names()
            );
            let names = plan.kernel_names();
            assert!(
                names.ends_with(&format!("backward_group_sum_{}", T::DTYPE)),
                "{what}"
            );
            if backward.algorithm != BackwardAlgorithm::Standard {
                assert!(names.contains("_grouped"), "{what}");
            }
            let tensor_cores = T::DTYPE != DType::F32 && head_dim.is_multiple_of(8);
            if backward.algorithm == BackwardAlgorithm::Fa2Tc && tensor_cores {
                assert_eq!(plan.fallback, None, "{what}");
                assert!(names.contains("fa2tc_backward_"), "{what}");
            }
            // FA3's backward on a 9.0 device, up to its largest compiled head dim.
            if backward.algorithm == BackwardAlgorithm::Fa3
                && tensor_cores
                && head_dim <= 128
                && gpu.has_hopper_module()
            {
                assert_eq!(plan.fallback, None, "{what}");
                assert!(names.contains("fa3_backward_"), "{what}");
            }
            let as_f64 = Gradients {
                dq: to_f64(&got.dq),
                dk: to_f64(&got.dk),
                dv: to_f64(&got.dv),
            };
            for check in reference.check(&as_f64) {
                println!("{what}: {check:?}");
                if !check.passed() {
                    failures.push(format!("{what}: {check:?}"));
                }
            }
            if backward.deterministic {
                let (again, _) = run();
                let bits = |g: &Gradients<Array4<T>>| {
                    [&g.dq, &g.dk, &g.dv]
                        .map(|a| a.iter().map(|x| x.to_f64().to_bits()).collect::<Vec<_>>())
                };
                assert_eq!(bits(&got), bits(&again), "{what}: a second run differs");
            }
        }
    }
    failures
}

/// The grouped backward on the GPU: groups of 2 and 4 and MQA (8 query heads on 1, and 3 on 1),
/// every backward algorithm (standard, fa2, fa2-tc, fa2-tc deterministic) in f32, f16 and bf16,
/// causal and not, seqlen_q ≠ seqlen_k both ways (113 × 203, 203 × 113, 1 × 17) and equal,
/// head dims 59 (the scalar kernels), 64, 128 and 256, both layouts, against the f64 reference
/// gradients with `tools::check_backward`'s rule.
#[test]
fn grouped_backward_matches_the_reference() {
    let test = "grouped_backward_matches_the_reference";
    let Some(gpu) = common::gpu_or_skip(test) else {
        return;
    };
    let mut rng = common::seeded_rng(test);
    let mut shapes = Vec::new();
    for (heads, heads_kv) in [(8, 4), (8, 2), (8, 1), (3, 1)] {
        for d in [59, 64, 128] {
            for (sq, sk) in [(113, 203), (203, 113), (1, 17)] {
                shapes.push((heads, heads_kv, sq, sk, d));
            }
        }
    }
    shapes.extend([(8, 2, 300, 300, 256), (4, 1, 129, 250, 256)]);
    let (mut problems, mut failures) = (0, Vec::new());
    for shape in shapes {
        for causal in [false, true] {
            for dtype in DType::ALL {
                failures.extend(flash_attn::with_element!(dtype, T => {
                    check_grouped_backward::<T>(&gpu, shape, causal, &mut rng)
                }));
                problems += 1;
            }
        }
    }
    println!(
        "{test}: {problems} problems, {} failed checks",
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The expanded dK past the device's memory (MQA: thousands of query heads on one K/V head of a
/// million keys, K itself 128 MiB): an out-of-memory error naming the buffer and its bytes,
/// before any launch, and the GPU usable after it.
#[test]
fn the_expanded_workspace_past_memory_is_a_named_out_of_memory_error() {
    let test = "grouped_backward_oom";
    let Some(gpu) = common::gpu_or_skip(test) else {
        return;
    };
    let (_, total) = gpu.memory().expect("memory");
    let (seqlen_k, d) = (1 << 20, 64);
    let expanded_per_head = seqlen_k * d * 2;
    let heads = total / expanded_per_head + 2;
    let (q_dims, kv_dims) = ([1, heads, 1, d], [1, 1, seqlen_k, d]);
    let zeros = |dims| {
        DeviceTensor::filled(&gpu, dims, Layout::BatchHeadSeqDim, bf16::ZERO).expect("alloc")
    };
    let (q, k, v, d_o) = (zeros(q_dims), zeros(kv_dims), zeros(kv_dims), zeros(q_dims));
    let options = AttentionOptions::default();
    let forward =
        common::forward(&gpu, Algorithm::Fa2Tc, &q, &k, &v, &options).expect("the forward");
    let mut gradients = Gradients {
        dq: zeros(q_dims),
        dk: zeros(kv_dims),
        dv: zeros(kv_dims),
    };
    let error = common::backward_into(
        &gpu,
        &q,
        &k,
        &v,
        &forward,
        &d_o,
        &mut gradients,
        &options,
        &BackwardOptions::default(),
    )
    .expect_err("the expanded dK does not fit");
    let message = error.to_string();
    println!("{test}: {heads} query heads: {message}");
    assert!(
        matches!(error, Error::OutOfMemory { requested, .. } if requested == heads * expanded_per_head),
        "{message}"
    );
    assert!(message.contains("expanded dK"), "{message}");
    // The GPU stays usable: a small grouped backward runs.
    let mut rng = common::seeded_rng(test);
    let failures = check_grouped_backward::<bf16>(&gpu, (4, 1, 17, 33, 64), true, &mut rng);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every forward algorithm (fa3 where the GPU has it) over the GQA ratios, causal both ways,
/// seqlen_q ≠ seqlen_k both ways and equal, both 16-bit dtypes (f32 for the scalar ones), both
/// layouts, against the f64 reference. The tensor-core families must run their own kernels.
#[test]
fn grouped_kv_heads_match_the_reference() {
    let Some(gpu) = common::gpu_or_skip("grouped_kv_heads_match_the_reference") else {
        return;
    };
    let mut rng = common::seeded_rng("grouped_kv_heads_match_the_reference");
    let hopper = gpu.has_hopper_module();
    if !hopper {
        println!("fa3 cases skipped: FA3 needs compute capability 9.0");
    }
    // (1024, 1023) at d = 128 only: the f64 reference of the long case dominates the test's time.
    let lengths = |d| {
        let mut lengths = vec![(113, 203), (300, 300), (1, 17), (203, 113)];
        if d == 128 {
            lengths.push((1024, 1023));
        }
        lengths
    };
    let (mut cases, mut failures) = (0, Vec::new());
    for (heads, heads_kv) in HEADS {
        for d in [64, 96, 128, 256] {
            for (sq, sk) in lengths(d) {
                for causal in [false, true] {
                    for dtype in DType::ALL {
                        let problem = CheckProblem {
                            batch: 2,
                            heads,
                            heads_kv,
                            seqlen_q: sq,
                            seqlen_k: sk,
                            head_dim: d,
                            causal,
                            window: None,
                            softcap: 0.0,
                            dtype,
                        };
                        let algorithms: Vec<Algorithm> = match dtype {
                            // The scalar kernels read K/V through the same block coordinates;
                            // checked at one head dim to keep the test short.
                            DType::F32 if d == 64 => {
                                vec![Algorithm::Standard, Algorithm::Fa1, Algorithm::Fa2]
                            }
                            DType::F32 => continue,
                            _ if hopper => vec![Algorithm::Fa2Tc, Algorithm::Fa3],
                            _ => vec![Algorithm::Fa2Tc],
                        };
                        let results = check_problem_with(
                            &gpu,
                            problem,
                            &algorithms,
                            &Layout::ALL,
                            &AttentionOptions::default(),
                            &mut rng,
                        )
                        .expect("the launch failed");
                        for r in results {
                            common::assert_own_kernels(&r);
                            if !r.passed {
                                println!("FAILED {}", describe(&r));
                                failures.push(describe(&r));
                            }
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    println!("grouped_kv_heads: {cases} cases, {} failed", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every FA3 tiling (the persistent grids included) with 8 query heads on 2 K/V heads: the
/// K/V tensor maps have the K/V heads as their head extent.
#[test]
fn every_fa3_tiling_takes_grouped_kv_heads() {
    let Some(gpu) = common::gpu_or_skip("every_fa3_tiling_takes_grouped_kv_heads") else {
        return;
    };
    if !gpu.has_hopper_module() {
        println!("skipped: FA3 needs compute capability 9.0");
        return;
    }
    let mut rng = common::seeded_rng("every_fa3_tiling_takes_grouped_kv_heads");
    let mut failures = Vec::new();
    for (head_dim, tiling) in common::fa3_tilings() {
        let options = AttentionOptions {
            fa3_tiling: Some(tiling),
            ..Default::default()
        };
        for ((sq, sk), causal) in [
            ((1024, 1023), false),
            ((113, 203), true),
            ((300, 300), true),
        ] {
            let problem = CheckProblem {
                batch: 2,
                heads: 8,
                heads_kv: 2,
                seqlen_q: sq,
                seqlen_k: sk,
                head_dim: head_dim as usize,
                causal,
                window: None,
                softcap: 0.0,
                dtype: DType::Bf16,
            };
            for r in check_problem_with(
                &gpu,
                problem,
                &[Algorithm::Fa3],
                &[Layout::BatchSeqHeadDim],
                &options,
                &mut rng,
            )
            .expect("the launch failed")
            {
                assert!(r.kernels.starts_with("fa3_forward_"), "ran {}", r.kernels);
                if !r.passed {
                    failures.push(format!("{tiling}: {}", describe(&r)));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Issue 17's prefill target for grouped heads: the forward with K/V shared by 4 query heads
/// (GQA) and by all of them (MQA) against the same problem with as many K/V heads as query
/// heads, each call's default plan, on fresh random bf16 inputs in flash-attn's layout (the
/// benchmark's B·N = 16384 tokens and H·d = 2048), FA3 (where it runs) and FA2-TC, causal both
/// ways, N = 2k and 8k: the median of ten timed runs each, and grouped / ungrouped TFLOP/s (the
/// FLOPs are the query heads', the same for all three). GPU time: run with `--ignored`.
#[test]
#[ignore]
fn time_grouped_heads_against_ungrouped() {
    let test = "gqa_timing";
    let Some(gpu) = common::gpu_or_skip(test) else {
        return;
    };
    let mut rng = common::seeded_rng(test);
    for algorithm in common::timed_algorithms(&gpu) {
        for head_dim in [64usize, 128] {
            for seqlen in [2048usize, 8192] {
                for causal in [false, true] {
                    let (batch, heads) = (16384 / seqlen, 2048 / head_dim);
                    let tensor = |heads: usize, rng: &mut rand::rngs::StdRng| {
                        let host = flash_attn_lab::tools::check::random_tensor::<bf16>(
                            [batch, heads, seqlen, head_dim],
                            rng,
                        );
                        DeviceTensor::from_array(&gpu, host.view(), Layout::BatchSeqHeadDim)
                            .expect("upload")
                    };
                    let q = tensor(heads, &mut rng);
                    let options = AttentionOptions {
                        causal,
                        ..Default::default()
                    };
                    let mut time = |kv_heads: usize| {
                        let (k, v) = (tensor(kv_heads, &mut rng), tensor(kv_heads, &mut rng));
                        let call = flash_attn::Attention::new(&q, &k, &v)
                            .options(options)
                            .algorithm(algorithm);
                        let mut out = call.forward(&gpu).expect("warm-up");
                        let plan = out.plan.clone();
                        let ms = common::median_ms(
                            gpu.time_each_ms(common::TIMED_RUNS, |_| {
                                call.forward_into(&gpu, out.tensors()).map(|_| ())
                            })
                            .expect("timed runs"),
                        );
                        (ms, plan.kernel_names())
                    };
                    let (dense_ms, dense_kernel) = time(heads);
                    let flops =
                        4.0 * (batch * heads) as f64 * (seqlen * seqlen) as f64 * head_dim as f64
                            / if causal { 2.0 } else { 1.0 };
                    let tflops = |ms: f64| flops / (ms * 1e-3) / 1e12;
                    for (name, kv_heads) in [("gqa", heads / 4), ("mqa", 1)] {
                        let (ms, kernel) = time(kv_heads);
                        println!(
                            "{algorithm} d = {head_dim}, N = {seqlen}, causal = {causal}, {name} \
                             {heads}/{kv_heads}: {:.1} TFLOP/s ({ms:.3} ms) [{kernel}], ungrouped \
                             {:.1} ({dense_ms:.3} ms) [{dense_kernel}], grouped / ungrouped {:.3}",
                            tflops(ms),
                            tflops(dense_ms),
                            dense_ms / ms,
                        );
                    }
                }
            }
        }
    }
}
