//! Grouped-query attention (GQA, and MQA with one K/V head): K and V with fewer heads than Q, read
//! in place (query head h reads K/V head h / (heads_q / heads_kv)). The CPU tests check the shape
//! rules, the reference's head mapping and the plan; the GPU tests run every forward algorithm
//! against the f64 reference with the tolerance rule of `tools::check` (skipped without a GPU
//! unless `FLASH_ATTN_REQUIRE_GPU=1`).

mod common;

use flash_attn::attention::{BackwardArguments, BackwardProblem, CompiledLimits, Plan, TensorSpec};
use flash_attn::model::reference::attention_reference;
use flash_attn::tools::check::{CheckProblem, check_problem_with, describe};
use flash_attn::{Algorithm, AttentionOptions, DType, Error, Layout, Problem};
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
    let (o, _, _) = flash_attn::model::fa2::emulate_fa2(
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
                    Plan::new(&CompiledLimits::H200, algorithm, DType::Bf16, &p, &o, None).unwrap();
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

#[test]
fn the_backward_refuses_grouped_heads_with_a_named_error() {
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
    match BackwardProblem::new(&arguments, &AttentionOptions::default()) {
        Err(error @ Error::InvalidArgument { name: "k", .. }) => {
            assert!(error.to_string().contains("backward"), "{error}")
        }
        other => panic!("expected the backward to refuse GQA, got {other:?}"),
    }
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
