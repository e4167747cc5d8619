//! Sliding-window (local) attention and logit soft-capping on the GPU: `fa2-tc` and `fa3` (and
//! `standard`, the baseline) against the f64 reference with the tolerance rule of `tools::check`,
//! on fresh random inputs into poisoned outputs (`check_problem_with`: an unwritten element
//! fails). Skipped without a GPU unless `FLASH_ATTN_REQUIRE_GPU=1`; FA3 cases need compute
//! capability 9.0.

use crate::common;

use flash_attn::{Algorithm, AttentionOptions, DType, Gpu, Layout};
use flash_attn_lab::tools::check::{CheckProblem, CheckResult, check_problem_with, describe};

/// The windows, flash-attn's (left, right) with −1 unbounded: one key, a left window
/// with the diagonal, a symmetric one, a left-only one; each also runs with causal on (right 0).
const WINDOWS: [(i64, i64); 4] = [(0, 0), (17, 0), (64, 64), (256, -1)];

/// (seqlen_q, seqlen_k): odd lengths both ways (rows that see no key where seqlen_q > seqlen_k),
/// equal, and long enough that a window skips whole blocks on both sides.
const LENGTHS: [(usize, usize); 4] = [(113, 203), (203, 113), (300, 300), (1024, 1000)];

/// The tensor-core families this GPU runs: fa3 on compute capability 9.0.
fn tensor_core_algorithms(gpu: &Gpu) -> Vec<Algorithm> {
    if gpu.has_hopper_module() {
        vec![Algorithm::Fa2Tc, Algorithm::Fa3]
    } else {
        println!("fa3 cases skipped: FA3 needs compute capability 9.0");
        vec![Algorithm::Fa2Tc]
    }
}

/// Runs every case of `problems` on `algorithms`, checking that the tensor-core families ran
/// their own kernels (no fallback); returns the number of cases, the failures' descriptions and
/// the result closest to its bound.
fn run_cases(
    gpu: &Gpu,
    problems: &[CheckProblem],
    algorithms: &[Algorithm],
    options: &AttentionOptions,
    rng: &mut impl rand::Rng,
) -> (usize, Vec<String>, Option<CheckResult>) {
    let (mut cases, mut failures, mut worst) = (0, Vec::new(), None::<CheckResult>);
    for &problem in problems {
        let results = check_problem_with(gpu, problem, algorithms, &Layout::ALL, options, rng)
            .unwrap_or_else(|e| panic!("{problem:?}: the launch failed: {e}"));
        for r in results {
            common::assert_own_kernels(&r);
            if !r.passed {
                println!("FAILED {}", describe(&r));
                failures.push(describe(&r));
            }
            if worst.as_ref().is_none_or(|w| r.ratio() > w.ratio()) {
                worst = Some(r);
            }
            cases += 1;
        }
    }
    (cases, failures, worst)
}

/// One GPU test: `problems` on the algorithms `algorithms` picks for the GPU, with the default
/// options; fails with every failure's description.
fn check_cases(
    test: &str,
    problems: &[CheckProblem],
    algorithms: impl FnOnce(&Gpu) -> Vec<Algorithm>,
) {
    let Some(gpu) = common::gpu_or_skip(test) else {
        return;
    };
    let mut rng = common::seeded_rng(test);
    let algorithms = algorithms(&gpu);
    let options = AttentionOptions::default();
    let (cases, failures, worst) = run_cases(&gpu, problems, &algorithms, &options, &mut rng);
    println!("{test}: {cases} cases, {} failed", failures.len());
    if let Some(worst) = worst {
        println!("closest to its bound: {}", describe(&worst));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn problem(
    lengths: (usize, usize),
    head_dim: usize,
    causal: bool,
    window: Option<(i64, i64)>,
    softcap: f32,
    dtype: DType,
) -> CheckProblem {
    CheckProblem {
        window,
        softcap,
        ..CheckProblem::new(2, 3, lengths, head_dim, causal, dtype)
    }
}

/// fa2-tc and fa3 on every window, causal both ways, every length pair, f16 and bf16, head
/// dims 64 and 128 (the compiled defaults) and 96 and 256 (the one-block-per-tile FA3 kernels).
#[test]
fn sliding_windows_match_the_reference() {
    let mut problems = Vec::new();
    for d in [64, 96, 128, 256] {
        for lengths in LENGTHS {
            for window in WINDOWS {
                for causal in [false, true] {
                    for dtype in [DType::F16, DType::Bf16] {
                        problems.push(problem(lengths, d, causal, Some(window), 0.0, dtype));
                    }
                }
            }
        }
    }
    check_cases(
        "sliding_windows_match_the_reference",
        &problems,
        tensor_core_algorithms,
    );
}

/// Soft-capping at 30 (Gemma 2's attention cap) and 5 (most scores near the cap), with and
/// without the causal mask and a window, on both tensor-core families and `standard`.
#[test]
fn soft_capping_matches_the_reference() {
    let mut problems = Vec::new();
    for d in [64, 128] {
        for lengths in [(113, 203), (300, 300), (1024, 1000)] {
            for softcap in [30.0, 5.0] {
                for (causal, window) in [(false, None), (true, None), (false, Some((64, 64)))] {
                    for dtype in [DType::F16, DType::Bf16] {
                        problems.push(problem(lengths, d, causal, window, softcap, dtype));
                    }
                }
            }
        }
    }
    check_cases("soft_capping_matches_the_reference", &problems, |gpu| {
        let mut algorithms = tensor_core_algorithms(gpu);
        algorithms.push(Algorithm::Standard);
        algorithms
    });
}

/// `standard` with windows in every dtype (f32 included): the baseline the issue asks for.
#[test]
fn the_standard_forward_takes_windows() {
    let mut problems = Vec::new();
    for lengths in [(113, 203), (203, 113)] {
        for window in WINDOWS {
            for causal in [false, true] {
                for dtype in DType::ALL {
                    problems.push(problem(lengths, 40, causal, Some(window), 0.0, dtype));
                }
            }
        }
    }
    check_cases("the_standard_forward_takes_windows", &problems, |_| {
        vec![Algorithm::Standard]
    });
}

/// Every `_local` kernel (windows and soft-capping are their own kernel form, compiled at each
/// head dim's default tiling, FA3 on the one-tile grid: `registry::KernelForm`) on one windowed,
/// capped case and one causal-window case: FA2-TC at every compiled head dim, FA3 at each of its
/// compiled head dims. Other tilings refuse a window by name (CPU test in `window_reference`).
#[test]
fn every_local_kernel_takes_windows_and_soft_capping() {
    let mut problems = Vec::new();
    let mut fa3_problems = Vec::new();
    let cases = |d: usize| {
        [
            problem((1024, 1000), d, false, Some((64, 64)), 5.0, DType::Bf16),
            problem((113, 203), d, true, Some((17, 0)), 0.0, DType::F16),
        ]
    };
    for d in flash_attn::attention::fa2_tc_head_dims() {
        problems.extend(cases(d as usize));
    }
    for d in [64, 96, 128, 192, 256] {
        fa3_problems.extend(cases(d));
    }
    check_cases(
        "every_local_kernel_takes_windows_and_soft_capping",
        &problems,
        |_| vec![Algorithm::Fa2Tc],
    );
    check_cases(
        "every_local_kernel_takes_windows_and_soft_capping",
        &fa3_problems,
        |gpu| {
            if gpu.has_hopper_module() {
                vec![Algorithm::Fa3]
            } else {
                Vec::new()
            }
        },
    );
}
