//! GPU tests of decoding against a KV cache: the split-KV kernels against the f64 reference
//! (`tools::check_decode`), over batch, cache lengths (0, 1, non-multiples of the split and of
//! the step, 128k), heads_q/heads_kv ratios 1, 4, 8 and 32 (MQA), contiguous and paged caches,
//! 1, 4 and 16 query tokens, with and without appending in the same call; the splits merged in
//! one launch (the split-KV kernel's last block of each group) and in two (the combine kernel),
//! and one workspace called again and again with other split counts (the one-launch counters'
//! reset). Skipped without a GPU (unless FLASH_ATTN_REQUIRE_GPU is set).

use crate::common;

use flash_attn::{DType, Gpu};
use flash_attn_lab::tools::check_decode::{DecodeCheckCase, check_decode, describe_decode};

fn run_all(gpu: &Gpu, test: &str, cases: &[DecodeCheckCase]) {
    let mut rng = common::seeded_rng(test);
    let mut failures = Vec::new();
    let mut worst: Option<(f64, String)> = None;
    for case in cases {
        let result = check_decode(gpu, case, &mut rng).expect("the decode call failed");
        let line = describe_decode(&result);
        if !result.passed {
            failures.push(line.clone());
        }
        if worst.as_ref().is_none_or(|(r, _)| result.ratio() > *r) {
            worst = Some((result.ratio(), line));
        }
    }
    if let Some((ratio, line)) = worst {
        println!(
            "{test}: {} cases, worst error/bound {ratio:.3}: {line}",
            cases.len()
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[allow(clippy::too_many_arguments)]
fn case(
    heads: (usize, usize),
    q_tokens: usize,
    head_dim: usize,
    cache_seqlens: &[usize],
    new_tokens: usize,
    page_size: Option<usize>,
    causal: bool,
    dtype: DType,
) -> DecodeCheckCase {
    DecodeCheckCase {
        new_tokens,
        causal,
        ..DecodeCheckCase::new(dtype, heads, q_tokens, head_dim, cache_seqlens, page_size)
    }
}

/// The grid: GQA ratios × tokens × head dims × dtypes × cache layouts, at mixed lengths in one
/// batch (0, 1, 17, a non-multiple of the split, a few thousand).
#[test]
fn decode_passes_the_grid() {
    let Some(gpu) = common::gpu_or_skip("decode_passes_the_grid") else {
        return;
    };
    let lengths = [0, 1, 17, 1000, 3001];
    let mut cases = Vec::new();
    for dtype in [DType::Bf16, DType::F16] {
        for heads in [(4, 4), (8, 2), (16, 2), (32, 1)] {
            for q_tokens in [1, 4, 16] {
                for head_dim in [64, 128] {
                    for page_size in [None, Some(16), Some(256)] {
                        cases.push(case(
                            heads, q_tokens, head_dim, &lengths, 0, page_size, true, dtype,
                        ));
                    }
                }
            }
        }
    }
    run_all(&gpu, "decode_grid", &cases);
}

/// Causal off and on with several tokens against short caches (tokens that see no key when
/// causal), and appending in the same call (contiguous and paged), then attending.
#[test]
fn decode_appends_and_masks_the_new_tokens() {
    let Some(gpu) = common::gpu_or_skip("decode_appends_and_masks_the_new_tokens") else {
        return;
    };
    let mut cases = Vec::new();
    for causal in [false, true] {
        for page_size in [None, Some(32)] {
            for (q_tokens, new_tokens) in [(1, 1), (4, 4), (16, 16), (3, 0), (16, 5)] {
                cases.push(case(
                    (8, 2),
                    q_tokens,
                    128,
                    &[0, 2, 63, 64, 65, 700],
                    new_tokens,
                    page_size,
                    causal,
                    DType::Bf16,
                ));
            }
        }
    }
    run_all(&gpu, "decode_append", &cases);
}

/// Forced split counts (1: the direct path; many: splits of one step per warp and empty splits
/// for the shorter sequences) give the same result, merged in one launch and in two.
#[test]
fn decode_split_counts_agree_with_the_reference() {
    let Some(gpu) = common::gpu_or_skip("decode_split_counts_agree_with_the_reference") else {
        return;
    };
    let mut cases = Vec::new();
    for splits in [1, 2, 7, 64, 128] {
        for page_size in [None, Some(64)] {
            for one_launch in [false, true] {
                let mut c = case(
                    (32, 8),
                    2,
                    128,
                    &[5000, 64, 1, 0],
                    0,
                    page_size,
                    true,
                    DType::Bf16,
                );
                c.splits = Some(splits);
                c.one_launch = Some(one_launch);
                cases.push(c);
            }
        }
    }
    run_all(&gpu, "decode_splits", &cases);
}

/// The one-launch merge over the grid: GQA ratios × tokens × head dims, each with two of three
/// (cache layout, forced splits, dtype) combinations in turn: contiguous at up to 2 splits in
/// bf16, pages of 16 at up to 13 in f16, pages of 256 at up to 33 in bf16 (the plan rounds split
/// sizes up to whole steps: the longest sequence's group merges 2, 12 and 24). The shorter
/// sequences of the batch have fewer splits, one (written directly) or no key; appends included.
/// (`decode_passes_the_grid` runs the plan's choice, one launch too where it splits.)
#[test]
fn decode_one_launch_passes_the_grid() {
    let Some(gpu) = common::gpu_or_skip("decode_one_launch_passes_the_grid") else {
        return;
    };
    let lengths = [0, 1, 17, 1000, 3001];
    let combinations = [
        (None, 2, DType::Bf16),
        (Some(16), 13, DType::F16),
        (Some(256), 33, DType::Bf16),
    ];
    let mut turn = 0;
    let mut cases = Vec::new();
    for heads in [(4, 4), (8, 2), (32, 8), (32, 1)] {
        for (q_tokens, new_tokens) in [(1, 0), (4, 4), (16, 0)] {
            for head_dim in [64, 128] {
                for _ in 0..2 {
                    let (page_size, splits, dtype) = combinations[turn % combinations.len()];
                    turn += 1;
                    let mut c = case(
                        heads, q_tokens, head_dim, &lengths, new_tokens, page_size, true, dtype,
                    );
                    c.splits = Some(splits);
                    c.one_launch = Some(true);
                    cases.push(c);
                }
            }
        }
    }
    run_all(&gpu, "decode_one_launch_grid", &cases);
}

/// One workspace, call after call: the one-launch counters are back at zero after each call, so
/// a call with the same or another split count (the plan's, 128 splits over several waves, or
/// one split that leaves them untouched in between) finds them as the first did. Each call's
/// output is poisoned first and checked.
#[test]
fn decode_one_launch_counters_reset_between_calls() {
    let Some(gpu) = common::gpu_or_skip("decode_one_launch_counters_reset_between_calls") else {
        return;
    };
    let mut cases = Vec::new();
    for dtype in [DType::Bf16, DType::F16] {
        for page_size in [None, Some(32)] {
            let mut c = case(
                (32, 8),
                1,
                128,
                &[4096, 3001, 0, 130],
                0,
                page_size,
                true,
                dtype,
            );
            c.splits = Some(7);
            c.one_launch = Some(true);
            c.reruns = vec![
                Some(7),
                Some(64),
                Some(2),
                None,
                Some(1),
                Some(128),
                Some(7),
            ];
            cases.push(c);
        }
    }
    // The plan's own choice each time, at the batch-1 anchor shape (one launch, 32 splits).
    let mut anchor = case((32, 8), 1, 128, &[4096], 0, None, true, DType::Bf16);
    anchor.reruns = vec![None, None];
    cases.push(anchor);
    run_all(&gpu, "decode_counters", &cases);
}

/// The long end: one sequence of 128k keys (32 query heads on 8 KV heads), contiguous and
/// paged, and a batch of 64 at 4k.
#[test]
fn decode_long_caches_match_the_reference() {
    let Some(gpu) = common::gpu_or_skip("decode_long_caches_match_the_reference") else {
        return;
    };
    let mut two_launches = case((32, 8), 1, 128, &[131_072], 0, None, true, DType::Bf16);
    two_launches.one_launch = Some(false);
    let cases = [
        // The plan's choice: 33 splits merged in one launch; and the same in two.
        case((32, 8), 1, 128, &[131_072], 0, None, true, DType::Bf16),
        two_launches,
        case(
            (32, 8),
            1,
            128,
            &[131_072 - 9],
            1,
            Some(256),
            true,
            DType::Bf16,
        ),
        case((32, 8), 1, 128, &[4096; 64], 0, None, true, DType::Bf16),
        case(
            (32, 8),
            4,
            64,
            &[65_537, 30_000],
            0,
            Some(16),
            true,
            DType::F16,
        ),
    ];
    run_all(&gpu, "decode_long", &cases);
}
