//! GPU tests: every algorithm against the f64 reference. Without a GPU each test prints why it
//! was skipped and passes; with `FLASH_ATTN_REQUIRE_GPU=1` (the bundle's run script) a missing
//! GPU fails instead.

use crate::common;

use flash_attn::{Algorithm, DType, Gpu, Layout};
use flash_attn_lab::tools::check::{CheckProblem, CheckResult, check_problem, describe};

/// Runs the problems, prints every result and the worst error/bound ratio, and fails on any miss.
fn run_all(
    gpu: &Gpu,
    test: &str,
    problems: &[CheckProblem],
    algorithms: &[Algorithm],
    layouts: &[Layout],
) {
    let mut rng = common::seeded_rng(test);
    let mut results: Vec<CheckResult> = Vec::new();
    for &problem in problems {
        results.extend(
            check_problem(gpu, problem, algorithms, layouts, &mut rng).expect("the launch failed"),
        );
    }
    let failures: Vec<String> = results.iter().filter(|r| !r.passed).map(describe).collect();
    if let Some(worst) = results
        .iter()
        .max_by(|a, b| a.ratio().total_cmp(&b.ratio()))
    {
        println!(
            "{test}: {} cases, worst error/bound {:.3}: {}",
            results.len(),
            worst.ratio(),
            describe(worst)
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        results.len(),
        failures.join("\n")
    );
}

fn problem(
    seqlen_q: usize,
    seqlen_k: usize,
    head_dim: usize,
    causal: bool,
    dtype: DType,
) -> CheckProblem {
    CheckProblem::new(2, 3, (seqlen_q, seqlen_k), head_dim, causal, dtype)
}

#[test]
fn standard_attention_f32_matches_the_reference() {
    let Some(gpu) = common::gpu_or_skip("standard_attention_f32_matches_the_reference") else {
        return;
    };
    let mut problems = Vec::new();
    for (sq, sk, d) in [
        (1, 1, 64),
        (17, 17, 40),
        (1000, 1000, 64),
        (113, 203, 59),
        (256, 128, 128),
    ] {
        for causal in [false, true] {
            problems.push(problem(sq, sk, d, causal, DType::F32));
        }
    }
    run_all(
        &gpu,
        "standard_attention_f32",
        &problems,
        &[Algorithm::Standard],
        &[Layout::BatchHeadSeqDim],
    );
}

/// The correctness grid: every algorithm over every (seqlen_q, seqlen_k), head dim, causal flag,
/// dtype and layout, batch 2, heads 3 (FA2-TC's uncompiled head dims, and f32, run its scalar
/// fallback).
#[test]
fn fa1_and_fa2_pass_the_grid() {
    let Some(gpu) = common::gpu_or_skip("fa1_and_fa2_pass_the_grid") else {
        return;
    };
    const LENGTHS: [(usize, usize); 9] = [
        (1, 1),
        (17, 17),
        (113, 203),
        (128, 217),
        (108, 256),
        (256, 512),
        (1023, 1024),
        (1024, 1023),
        (2048, 2048),
    ];
    // 160, 192 and 200: between the compiled capacities 128 and 256, where FA2's largest block
    // does not fit the capacity-256 kernel's thread bound (B_r = 64 only) and FA2-TC falls back.
    const HEAD_DIMS: [usize; 11] = [32, 40, 59, 64, 96, 111, 128, 160, 192, 200, 256];
    let mut problems = Vec::new();
    for dtype in DType::ALL {
        for (sq, sk) in LENGTHS {
            for d in HEAD_DIMS {
                for causal in [false, true] {
                    problems.push(problem(sq, sk, d, causal, dtype));
                }
            }
        }
    }
    let algorithms = Algorithm::ALL;
    run_all(
        &gpu,
        "fa1_fa2_fa2tc_grid",
        &problems,
        &algorithms,
        &Layout::ALL,
    );
}

/// Every tiling FA2-TC is compiled for (not only the default the grid runs), at every tensor-core
/// head dim it is compiled for there, both 16-bit dtypes, tails in both directions, causal both
/// ways.
#[test]
fn every_fa2_tc_tiling_matches_the_reference() {
    let Some(gpu) = common::gpu_or_skip("every_fa2_tc_tiling_matches_the_reference") else {
        return;
    };
    let mut tilings = Vec::new();
    for d in flash_attn::attention::fa2_tc_head_dims() {
        for tiling in flash_attn::attention::fa2_tc_tilings(d) {
            let options = flash_attn::AttentionOptions {
                fa2_tc_tiling: Some(tiling),
                ..Default::default()
            };
            tilings.push((tiling.to_string(), d as usize, options));
        }
    }
    check_tilings(&gpu, "fa2_tc_tilings", Algorithm::Fa2Tc, &tilings);
}

/// Every tiling FA3 is compiled for, at its compiled head dim and at one it serves by padding
/// (8 less), as for FA2-TC. Skips (and says so) on a GPU other than compute capability 9.0.
#[test]
fn every_fa3_tiling_matches_the_reference() {
    let Some(gpu) = common::gpu_or_skip("every_fa3_tiling_matches_the_reference") else {
        return;
    };
    if !gpu.has_hopper_module() {
        println!("skipped: FA3 needs compute capability 9.0");
        return;
    }
    let mut tilings = Vec::new();
    for (head_dim, tiling) in common::fa3_tilings() {
        let options = flash_attn::AttentionOptions {
            fa3_tiling: Some(tiling),
            ..Default::default()
        };
        for d in [head_dim, head_dim - 8] {
            tilings.push((format!("{tiling} (d = {d})"), d as usize, options));
        }
    }
    check_tilings(&gpu, "fa3_tilings", Algorithm::Fa3, &tilings);
}

/// `algorithm` with each `(label, head dim, options)` of `tilings`, both 16-bit dtypes, tails in
/// both directions, causal both ways, against the reference.
fn check_tilings(
    gpu: &flash_attn::Gpu,
    name: &str,
    algorithm: Algorithm,
    tilings: &[(String, usize, flash_attn::AttentionOptions)],
) {
    let mut rng = common::seeded_rng(name);
    let (mut cases, mut failures) = (0, Vec::new());
    for (label, d, overrides) in tilings {
        for dtype in [DType::F16, DType::Bf16] {
            for (sq, sk) in [(113, 203), (1024, 1023), (300, 300), (1, 1)] {
                for causal in [false, true] {
                    let p = problem(sq, sk, *d, causal, dtype);
                    let checked = flash_attn_lab::tools::check::check_problem_with(
                        gpu,
                        p,
                        &[algorithm],
                        &Layout::ALL,
                        overrides,
                        &mut rng,
                    );
                    for r in checked.expect("the launch failed") {
                        if r.passed && r.max_abs_error > 0.8 * r.bound {
                            println!("near the bound {label}: {}", describe(&r));
                        }
                        // The tiling's own kernel ran, not a fallback.
                        let family = match algorithm {
                            Algorithm::Fa3 => "fa3_forward_",
                            _ => "fa2tc_forward_",
                        };
                        assert!(r.kernels.starts_with(family), "{label}: ran {}", r.kernels);
                        if !r.passed {
                            // Printed as it happens, with the tiling, so that a later panic
                            // does not hide it.
                            let failure = format!("{label}: {}", describe(&r));
                            println!("FAILED {failure}");
                            failures.push(failure);
                        }
                        cases += 1;
                    }
                }
            }
        }
    }
    println!("{name}: {cases} cases, {} failed", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
