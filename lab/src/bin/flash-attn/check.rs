//! `flash-attn check`: every algorithm on fresh random inputs against the f64 reference; with
//! `--backward`, the backward too (against the f64 reference gradients); with `--decode`, the
//! decode kernels instead, with `--packed` packed batches of different lengths.

use std::process::ExitCode;

use flash_attn::{Algorithm, AttentionOptions, DType, Gpu, Layout};
use flash_attn_lab::tools::bench::backward::BackwardVariant;
use flash_attn_lab::tools::check::{CheckProblem, check_problem_with, describe};
use flash_attn_lab::tools::check_backward::{check_backward_problem, describe_backward};
use flash_attn_lab::tools::check_decode::{
    DECODE_DTYPES, check_decode, describe_decode, sanitizer_decode_cases, standard_decode_cases,
};
use flash_attn_lab::tools::check_packed::{
    PACKED_DTYPES, check_packed, describe_packed, standard_packed_cases,
};
use flash_attn_lab::tools::check_packed_backward::{
    check_packed_backward, describe_packed_backward,
};
use rand::SeedableRng;

#[derive(clap::Args)]
pub struct CheckArgs {
    /// Algorithms to check (default: all).
    #[arg(long, value_delimiter = ',')]
    algorithms: Vec<String>,
    /// Dtypes to check (default: f32, f16, bf16).
    #[arg(long, value_delimiter = ',')]
    dtypes: Vec<String>,
    /// Random seed (default: fresh; printed either way).
    #[arg(long)]
    seed: Option<u64>,
    /// Fail, instead of skipping, when there is no GPU.
    #[arg(long)]
    require_gpu: bool,
    /// `standard`: the check shapes below, with and without sliding windows and soft-capping;
    /// `window`: only those with them; `sanitizer`: the odd shapes compute-sanitizer runs
    /// (seqlen 1, 17, 1000; head dims 8, 40, 64, 96, 128, 192, 256; batch 1, heads 1; and 2 × 40 heads
    /// at seqlen 300, d = 64 and 128, where the persistent grid's blocks take several tiles each;
    /// with --decode, a few short caches through both merges and repeated calls).
    #[arg(long, default_value = "standard")]
    shapes: String,
    /// Only the shapes with these head dims (default: every shape of the set), e.g. to split a
    /// slow compute-sanitizer run into parallel processes.
    #[arg(long, value_delimiter = ',')]
    head_dims: Vec<usize>,
    /// Only the shapes with these sequence lengths (seqlen_q; default: every shape of the set).
    #[arg(long, value_delimiter = ',')]
    seqlens: Vec<usize>,
    /// Causal settings to check: off, on, or both (default).
    #[arg(long, default_value = "both")]
    causal: String,
    /// FA2-TC's tiling, e.g. 4x2s1c64 (default: the measured default per head dim). Every checked
    /// head dim must have the tiling compiled; pick them with --head-dims.
    #[arg(long)]
    fa2_tc_tiling: Option<String>,
    /// FA3's tiling, e.g. w3c128p (the persistent grid at d = 64); every checked head dim must
    /// have it compiled: pick them with --head-dims.
    #[arg(long)]
    fa3_tiling: Option<String>,
    /// Also check the backward on every shape: each of --backward-algorithms, and those of
    /// fa2-tc and fa3 in deterministic mode where they run on tensor cores (f16/bf16, head dims
    /// that are multiples of 8), after the FA2 forward, against the f64 reference gradients (the
    /// GPU tests' rule).
    #[arg(long)]
    backward: bool,
    /// The backwards to check with --backward (default: standard, fa2, fa2-tc, fa3; fa3 runs
    /// fa2-tc where it cannot run, and the line says why).
    #[arg(long, value_delimiter = ',')]
    backward_algorithms: Vec<String>,
    /// Check decoding against a KV cache instead (the split-KV kernels, contiguous and paged
    /// caches, appending, GQA/MQA, 1-16 query tokens, up to a 128k cache), for each of --dtypes
    /// that decoding takes (bf16, f16).
    #[arg(long, conflicts_with_all = ["backward", "algorithms", "fa2_tc_tiling", "fa3_tiling"])]
    decode: bool,
    /// Check packed batches of sequences of different lengths instead (flash-attn's varlen call:
    /// empty sequences, sequences without keys, GQA and MQA, every head dim FA2-TC compiles),
    /// sequence by sequence, for each of --algorithms that takes them (fa2-tc, fa3; default
    /// both: fa3 runs fa2-tc where it cannot run) and --dtypes (bf16, f16). With --backward:
    /// the packed backward instead (auto, and deterministic mode), at the head dims that are
    /// multiples of 8, each sequence's gradients against its own f64 reference.
    #[arg(long, conflicts_with_all = ["decode", "fa2_tc_tiling", "fa3_tiling"])]
    packed: bool,
}

/// The backward options `check --backward` runs for one problem: every algorithm asked for,
/// and fa2-tc and fa3 deterministic where the tensor cores take the problem (elsewhere the plan
/// refuses deterministic mode, by design; fa3 runs fa2-tc where it cannot run); with a window
/// or soft-capping, the tensor-core ones only (the scalar and standard backwards refuse them).
fn backward_cases(algorithms: &[Algorithm], problem: &CheckProblem) -> Vec<BackwardVariant> {
    let tensor_cores = problem.dtype != DType::F32 && problem.head_dim.is_multiple_of(8);
    // With a window or soft-capping only the tensor-core backwards run (the others refuse it).
    let local = problem.has_window_or_softcap();
    if local && !tensor_cores {
        return Vec::new();
    }
    let mut cases: Vec<BackwardVariant> = algorithms
        .iter()
        .filter(|a| !local || matches!(a, Algorithm::Auto | Algorithm::Fa2Tc | Algorithm::Fa3))
        .map(|&algorithm| BackwardVariant::new(algorithm, false))
        .collect();
    if tensor_cores {
        for ordered in [Algorithm::Fa2Tc, Algorithm::Fa3] {
            if algorithms.contains(&ordered) {
                cases.push(BackwardVariant::new(ordered, true));
            }
        }
    }
    cases
}

/// (batch, heads, heads_kv, seqlen_q, seqlen_k, head_dim).
type Shape = (usize, usize, usize, usize, usize, usize);

/// Lengths that are not multiples of any block
/// size (1, 17, 1000, 113, 203), seqlen_q < seqlen_k and >, odd head dims, and every head dim the
/// tensor-core FA2 is compiled for (32, 64, 96, 128, 256), and grouped K/V heads (GQA 2, 4, 8 and
/// MQA).
const STANDARD_SHAPES: [Shape; 15] = [
    (1, 1, 1, 1, 1, 64),
    (2, 3, 3, 17, 17, 40),
    (1, 2, 2, 1000, 1000, 64),
    (2, 3, 3, 113, 203, 59),
    (1, 2, 2, 256, 128, 128),
    (1, 1, 1, 300, 300, 256),
    (2, 2, 2, 77, 33, 1),
    (2, 2, 2, 129, 250, 32),
    (1, 3, 3, 333, 200, 96),
    // Between the compiled capacities 128 and 256 (24 heads: the shape of issue 13's bug).
    (1, 24, 24, 333, 333, 160),
    (2, 3, 3, 200, 257, 192),
    // Grouped K/V heads: groups of 2, 4 and 8, and one K/V head for all (MQA).
    (2, 6, 3, 113, 203, 64),
    (1, 8, 2, 256, 128, 128),
    (2, 8, 1, 300, 300, 96),
    (1, 16, 2, 129, 250, 256),
];

/// The sanitizer set's shapes with more tiles than the H200 has SMs, at the head dims FA3 has
/// persistent tilings for (80 heads × 3 row blocks of 128 rows, or 2 of 192: 240 and 160 tiles
/// for 132 SMs), so the persistent grid's blocks take several tiles each and hand their numbers
/// over more than once: the hand-off racecheck must see ordered.
const MANY_TILES: [Shape; 2] = [(2, 40, 40, 300, 300, 64), (2, 40, 40, 300, 300, 128)];

/// A shape with its window (flash-attn's `window_size`) and soft-cap (0: off).
type Case = (Shape, Option<(i64, i64)>, f32);

/// Sliding windows and soft-capping on odd lengths (113 × 203 and its mirror), seqlen_q ≠
/// seqlen_k, a window of one key (0, 0), one sided windows, grouped K/V heads, at the head
/// dims `fa2-tc` and `fa3` compile (each case also runs with causal on: right = 0).
const WINDOW_CASES: [Case; 9] = [
    ((2, 3, 3, 113, 203, 64), Some((17, 0)), 0.0),
    ((2, 2, 2, 203, 113, 128), Some((0, 0)), 0.0),
    ((1, 2, 2, 1000, 1000, 64), Some((64, 64)), 0.0),
    ((1, 2, 2, 1000, 1000, 128), Some((256, -1)), 0.0),
    ((1, 2, 2, 257, 1000, 96), Some((100, 50)), 0.0),
    ((1, 2, 2, 300, 300, 128), None, 30.0),
    ((1, 1, 1, 300, 300, 256), None, 5.0),
    ((2, 6, 3, 113, 203, 64), Some((64, 64)), 5.0),
    ((1, 2, 2, 129, 250, 32), Some((40, 3)), 30.0),
];

/// The cases of `set` whose head dim is in `head_dims` and whose seqlen_q is in `seqlens` (an
/// empty filter keeps every case). Every value asked for must have a case (a head dim in the set,
/// a seqlen among those head dims, and each head dim again at those seqlens): a filter that kept
/// only some of its values would leave a run, a sanitizer's say, covering less than its command
/// line says. The error names the filter and the values the set has there.
fn shapes(set: &str, head_dims: &[usize], seqlens: &[usize]) -> flash_attn::Result<Vec<Case>> {
    let all = shapes_of_set(set)?;
    let head_dim_of: fn(&Case) -> usize = |c| c.0.5;
    let seqlen_q_of: fn(&Case) -> usize = |c| c.0.3;
    let keep = |cases: &[Case], filter: &[usize], value_of: fn(&Case) -> usize| -> Vec<Case> {
        cases
            .iter()
            .filter(|c| filter.is_empty() || filter.contains(&value_of(c)))
            .cloned()
            .collect()
    };
    let require = |name: &'static str,
                   filter: &[usize],
                   value_of: fn(&Case) -> usize,
                   among: &[Case],
                   context: &str| {
        let mut values: Vec<usize> = among.iter().map(value_of).collect();
        values.sort_unstable();
        values.dedup();
        if filter.iter().all(|v| values.contains(v)) {
            return Ok(());
        }
        Err(flash_attn::Error::InvalidArgument {
            name,
            value: format!("{filter:?}"),
            allowed: format!("allowed with --shapes {set}{context}: any of {values:?}"),
        })
    };
    require("head-dims", head_dims, head_dim_of, &all, "")?;
    let with_head_dims = keep(&all, head_dims, head_dim_of);
    require(
        "seqlens",
        seqlens,
        seqlen_q_of,
        &with_head_dims,
        &format!(" and --head-dims {head_dims:?}"),
    )?;
    let at_seqlens = keep(&all, seqlens, seqlen_q_of);
    require(
        "head-dims",
        head_dims,
        head_dim_of,
        &at_seqlens,
        &format!(" at --seqlens {seqlens:?}"),
    )?;
    Ok(keep(&with_head_dims, seqlens, seqlen_q_of))
}

fn shapes_of_set(set: &str) -> flash_attn::Result<Vec<Case>> {
    let plain = |shape: Shape| (shape, None, 0.0);
    match set {
        "standard" => Ok(STANDARD_SHAPES
            .into_iter()
            .map(plain)
            .chain(WINDOW_CASES)
            .collect()),
        "window" => Ok(WINDOW_CASES.to_vec()),
        "sanitizer" => Ok([1, 17, 1000]
            .into_iter()
            .flat_map(|n| [8, 40, 64, 96, 128, 192, 256].map(|d| plain((1, 1, 1, n, n, d))))
            .chain(MANY_TILES.map(plain))
            .collect()),
        other => Err(flash_attn::Error::InvalidArgument {
            name: "shapes",
            value: other.into(),
            allowed: "allowed: standard, window, sanitizer".into(),
        }),
    }
}

/// The algorithms of `algorithms` that take `problem`: all of them, but with a window or
/// soft-capping only `fa2-tc` and `fa3` (f16/bf16: for f32 they fall back to the scalar `fa2`,
/// which refuses both) and `standard`.
fn algorithms_for(algorithms: &[Algorithm], problem: &CheckProblem) -> Vec<Algorithm> {
    let takes = |algorithm: &Algorithm| match algorithm {
        Algorithm::Standard => true,
        Algorithm::Auto | Algorithm::Fa2Tc | Algorithm::Fa3 => problem.dtype != DType::F32,
        Algorithm::Fa1 | Algorithm::Fa2 => false,
    };
    algorithms
        .iter()
        .copied()
        .filter(|a| !problem.has_window_or_softcap() || takes(a))
        .collect()
}

/// Every item parsed (an error names the bad one and the allowed values), or `all` when empty.
fn parse_or_all<T: std::str::FromStr<Err = flash_attn::Error> + Copy>(
    items: &[String],
    all: &[T],
) -> flash_attn::Result<Vec<T>> {
    if items.is_empty() {
        Ok(all.to_vec())
    } else {
        items.iter().map(|i| i.parse()).collect()
    }
}

/// Opens the GPU, or says that the checks are skipped (`None`) when there is none and none is
/// required.
fn open_gpu(device: usize, require_gpu: bool) -> flash_attn::Result<Option<Gpu>> {
    match Gpu::open(device) {
        Ok(gpu) => Ok(Some(gpu)),
        Err(e) if super::is_missing_gpu(&e) && !require_gpu => {
            println!("GPU checks skipped: {e}");
            println!("(the CPU reference and emulators are covered by `cargo xtask test`)");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The seeded generator of one run, its seed printed so that a failure can be rerun.
fn seeded(gpu: &Gpu, seed: Option<u64>) -> rand::rngs::StdRng {
    let seed = seed.unwrap_or_else(rand::random);
    println!(
        "check on {} with seed {seed} (rerun with --seed {seed})",
        gpu.info().name
    );
    rand::rngs::StdRng::seed_from_u64(seed)
}

fn exit_code(passed: usize, failed: usize) -> ExitCode {
    println!("check: {passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `check --decode`: the decode cases of every dtype.
fn check_decoding(device: usize, args: &CheckArgs) -> flash_attn::Result<ExitCode> {
    let dtypes = parse_within(
        "dtypes",
        &args.dtypes,
        &DECODE_DTYPES,
        &DECODE_DTYPES,
        "--decode",
    )?;
    let cases_of: fn(DType) -> Vec<_> = match args.shapes.as_str() {
        "standard" => standard_decode_cases,
        "sanitizer" => sanitizer_decode_cases,
        other => {
            return Err(flash_attn::Error::InvalidArgument {
                name: "shapes",
                value: other.into(),
                allowed: "allowed with --decode: standard, sanitizer".into(),
            });
        }
    };
    let Some(gpu) = open_gpu(device, args.require_gpu)? else {
        return Ok(ExitCode::SUCCESS);
    };
    let mut rng = seeded(&gpu, args.seed);
    let (mut passed, mut failed) = (0, 0);
    for dtype in dtypes {
        for case in cases_of(dtype) {
            let result = check_decode(&gpu, &case, &mut rng)?;
            println!("decode {}", describe_decode(&result));
            if result.passed {
                passed += 1;
            } else {
                failed += 1;
            }
        }
    }
    Ok(exit_code(passed, failed))
}

/// Those of `items` (parsed) that are in `allowed`, or an error naming `name` and the allowed
/// values; `default` when `items` is empty.
fn parse_within<
    T: std::str::FromStr<Err = flash_attn::Error> + Copy + PartialEq + std::fmt::Display,
>(
    name: &'static str,
    items: &[String],
    allowed: &[T],
    default: &[T],
    what: &str,
) -> flash_attn::Result<Vec<T>> {
    let values = parse_or_all(items, default)?;
    match values.iter().find(|v| !allowed.contains(v)) {
        Some(value) => {
            let allowed: Vec<String> = allowed.iter().map(|a| a.to_string()).collect();
            Err(flash_attn::Error::InvalidArgument {
                name,
                value: value.to_string(),
                allowed: format!("allowed with {what}: {}", allowed.join(", ")),
            })
        }
        None => Ok(values),
    }
}

/// `check --packed`: the packed-batch cases of every dtype and algorithm.
fn check_packed_batches(device: usize, args: &CheckArgs) -> flash_attn::Result<ExitCode> {
    let dtypes = parse_within(
        "dtypes",
        &args.dtypes,
        &PACKED_DTYPES,
        &PACKED_DTYPES,
        "--packed",
    )?;
    let takers = [Algorithm::Fa2Tc, Algorithm::Fa3];
    let algorithms = parse_within("algorithms", &args.algorithms, &takers, &takers, "--packed")?;
    let Some(gpu) = open_gpu(device, args.require_gpu)? else {
        return Ok(ExitCode::SUCCESS);
    };
    let mut rng = seeded(&gpu, args.seed);
    let (mut passed, mut failed) = (0, 0);
    if args.backward {
        for dtype in dtypes {
            let cases = standard_packed_cases(dtype);
            for case in cases.iter().filter(|c| c.head_dim.is_multiple_of(8)) {
                for deterministic in [false, true] {
                    let result = check_packed_backward(&gpu, deterministic, case, &mut rng)?;
                    println!("{}", describe_packed_backward(&result));
                    if result.passed {
                        passed += 1;
                    } else {
                        failed += 1;
                    }
                }
            }
        }
        return Ok(exit_code(passed, failed));
    }
    for dtype in dtypes {
        for case in standard_packed_cases(dtype) {
            for &algorithm in &algorithms {
                let result = check_packed(&gpu, algorithm, &case, &mut rng)?;
                println!("{}", describe_packed(&result));
                if result.passed {
                    passed += 1;
                } else {
                    failed += 1;
                }
            }
        }
    }
    Ok(exit_code(passed, failed))
}

pub fn main(device: usize, args: &CheckArgs) -> flash_attn::Result<ExitCode> {
    if args.decode {
        return check_decoding(device, args);
    }
    if args.packed {
        return check_packed_batches(device, args);
    }
    let algorithms = parse_or_all(&args.algorithms, &Algorithm::FAMILIES)?;
    let backward_algorithms =
        parse_or_all(&args.backward_algorithms, &Algorithm::BACKWARD_FAMILIES)?;
    let dtypes = parse_or_all(&args.dtypes, &DType::ALL)?;
    let shapes = shapes(&args.shapes, &args.head_dims, &args.seqlens)?;
    let causal_settings = super::parse_causal(&args.causal)?;
    let overrides = AttentionOptions {
        fa2_tc_tiling: flash_attn::attention::parse_optional_fa2_tc_tiling(
            args.fa2_tc_tiling.as_deref(),
        )?,
        fa3_tiling: args
            .fa3_tiling
            .as_deref()
            .map(flash_attn::attention::parse_fa3_tiling)
            .transpose()?,
        ..Default::default()
    };
    let Some(gpu) = open_gpu(device, args.require_gpu)? else {
        return Ok(ExitCode::SUCCESS);
    };
    let mut rng = seeded(&gpu, args.seed);
    let (mut passed, mut failed) = (0, 0);
    for &dtype in &dtypes {
        for &((batch, heads, heads_kv, seqlen_q, seqlen_k, head_dim), window, softcap) in &shapes {
            for &causal in &causal_settings {
                let problem = CheckProblem {
                    batch,
                    heads,
                    heads_kv,
                    seqlen_q,
                    seqlen_k,
                    head_dim,
                    causal,
                    window,
                    softcap,
                    dtype,
                };
                for result in check_problem_with(
                    &gpu,
                    problem,
                    &algorithms_for(&algorithms, &problem),
                    &[Layout::BatchHeadSeqDim],
                    &overrides,
                    &mut rng,
                )? {
                    println!("{}", describe(&result));
                    if result.passed {
                        passed += 1;
                    } else {
                        failed += 1;
                    }
                }
                if !args.backward {
                    continue;
                }
                let cases = backward_cases(&backward_algorithms, &problem);
                for backward in cases {
                    let result = check_backward_problem(&gpu, problem, &backward, &mut rng)?;
                    println!("{}", describe_backward(&result));
                    if result.passed {
                        passed += 1;
                    } else {
                        failed += 1;
                    }
                }
            }
        }
    }
    Ok(exit_code(passed, failed))
}
