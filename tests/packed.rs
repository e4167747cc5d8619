//! CPU tests of packed batches (flash-attn's varlen call): the offsets' and shapes' named
//! errors, the plan (FA3's and FA2-TC's `_varlen` kernels over the longest sequence, the other
//! algorithms refused), the f64 reference of a packed batch against the dense one, and
//! `flash-attn check --packed`'s refusals and cases.

mod common;

use flash_attn::attention::{CompiledLimits, ForwardPlan, PackedBatch, PackedRows};
use flash_attn::scoring::Scoring;
use flash_attn::{Algorithm, AttentionOptions, DType, Error};
use flash_attn_lab::model::reference::{attention_reference, packed_attention_reference};
use flash_kernels::common::mask::KeyWindow;
use flash_kernels::fwd::fa2_tc::config::Fa2TcTiling;
use ndarray::{Array4, Axis, s};
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

fn named(result: Result<impl std::fmt::Debug, Error>) -> &'static str {
    match result {
        Err(Error::InvalidArgument { name, .. }) => name,
        other => panic!("expected a named error, got {other:?}"),
    }
}

#[test]
fn bad_offsets_are_named_errors() {
    assert_eq!(named(PackedBatch::new(&[0], &[0])), "cu_seqlens_q");
    assert_eq!(named(PackedBatch::new(&[1, 4], &[0, 4])), "cu_seqlens_q");
    assert_eq!(
        named(PackedBatch::new(&[0, 4, 3], &[0, 4, 5])),
        "cu_seqlens_q"
    );
    assert_eq!(
        named(PackedBatch::new(&[0, 4, 5], &[0, 6, 5])),
        "cu_seqlens_k"
    );
    assert_eq!(named(PackedBatch::new(&[0, 4, 5], &[0, 5])), "cu_seqlens_k");
    let err = PackedBatch::new(&[0, 4, 3], &[0, 4, 5])
        .unwrap_err()
        .to_string();
    assert!(err.contains("entry 2 is 3 after 4"), "{err}");
    // Empty sequences are allowed.
    let batch = PackedBatch::new(&[0, 0, 7, 7], &[0, 3, 3, 9]).unwrap();
    assert_eq!(batch.sequences(), 3);
    assert_eq!(batch.totals(), [7, 9]);
    assert_eq!(batch.max_seqlens(), [7, 6]);
    assert_eq!(batch.rows(1), (0..7, 3..3));
}

/// A packed launch's parameter block holds at most `MAX_SEQUENCES_PER_LAUNCH` sequences: a
/// longer batch runs as several launches, each table holding its sequences' absolute offsets
/// (the last one the next launch's first), zeros past them, and the whole batch's total_q.
#[test]
fn a_long_batch_runs_as_several_launch_tables() {
    use flash_kernels::common::params::{MAX_SEQUENCES_PER_LAUNCH, SEQUENCE_TABLE_LEN};
    let lengths: Vec<(usize, usize)> = (0..600).map(|i| (i % 7, 1 + i % 5)).collect();
    let batch = PackedBatch::from_length_pairs(&lengths).unwrap();
    let tables = batch.launch_tables();
    let counts: Vec<u32> = tables.iter().map(|(n, _)| *n).collect();
    assert_eq!(counts, [255, 255, 90]);
    assert_eq!(MAX_SEQUENCES_PER_LAUNCH, 255);
    let mut first = 0;
    for (count, table) in &tables {
        let count = *count as usize;
        assert_eq!(table.total_q as usize, batch.totals()[0]);
        assert_eq!(table.total_k as usize, batch.totals()[1]);
        // Host offsets: the kernels read the table, not device memory.
        assert_eq!(
            (table.device_cu_seqlens_q, table.device_cu_seqlens_k),
            (0, 0)
        );
        for (tensor, offsets, all) in [
            ("q", &table.cu_seqlens_q, batch.cu_seqlens_q()),
            ("k", &table.cu_seqlens_k, batch.cu_seqlens_k()),
        ] {
            assert_eq!(offsets[..=count], all[first..=first + count], "{tensor}");
            assert!(offsets[count + 1..].iter().all(|&o| o == 0), "{tensor}");
            assert_eq!(offsets.len(), SEQUENCE_TABLE_LEN);
        }
        first += count;
    }
    assert_eq!(first, 600);
    // One sequence: one table.
    let one = PackedBatch::from_lengths(&[5]).unwrap().launch_tables();
    assert_eq!(one.len(), 1);
    assert_eq!((one[0].0, &one[0].1.cu_seqlens_q[..3]), (1, &[0, 5, 0][..]));
}

/// Offsets left on the GPU launch as the host's do, 255 sequences a launch, each launch's
/// addresses at its first sequence's entries and its tables unused; the grid takes the caller's
/// bounds (at most the rows, at least 1), and bad addresses are named.
#[test]
fn offsets_on_the_device_launch_from_their_addresses() {
    use flash_attn::attention::{DeviceOffsets, PackedOffsets};
    let (q_address, k_address) = (0x7f00_0000_0000u64, 0x7f00_1000_0000u64);
    // SAFETY: no kernel runs in this test; the addresses are only split per launch.
    let offsets = unsafe { DeviceOffsets::new(q_address, k_address, 600, [900, 0]) }.unwrap();
    let tables = PackedOffsets::Device(offsets).launch_tables([5000, 7000]);
    let counts: Vec<u32> = tables.iter().map(|(n, _)| *n).collect();
    assert_eq!(counts, [255, 255, 90]);
    for (launch, (_, table)) in tables.iter().enumerate() {
        let first = 4 * 255 * launch as u64;
        assert_eq!(table.device_cu_seqlens_q, q_address + first);
        assert_eq!(table.device_cu_seqlens_k, k_address + first);
        assert_eq!((table.total_q, table.total_k), (5000, 7000));
        assert!(
            table
                .cu_seqlens_q
                .iter()
                .chain(&table.cu_seqlens_k)
                .all(|&o| o == 0)
        );
    }
    let dims = |rows: usize| [1, 4, rows, 64];
    let problem = PackedOffsets::Device(offsets)
        .problem(
            [dims(800), dims(7000), dims(7000)],
            &AttentionOptions::default(),
        )
        .unwrap();
    assert_eq!(
        (problem.batch, problem.seqlen_q, problem.seqlen_k),
        (600, 800, 1)
    );
    for (name, q, k, sequences) in [
        ("cu_seqlens_q", 0, k_address, 3),
        ("cu_seqlens_k", q_address, k_address + 2, 3),
        ("cu_seqlens_q", q_address, k_address, 0),
    ] {
        // SAFETY: as above.
        assert_eq!(
            named(unsafe { DeviceOffsets::new(q, k, sequences, [1, 1]) }),
            name
        );
    }
}

#[test]
fn the_offsets_must_end_at_the_tensors_rows() {
    let batch = PackedBatch::from_lengths(&[5, 300, 17]).unwrap();
    let options = AttentionOptions::default();
    let dims = |rows: usize| [1, 4, rows, 64];
    assert!(batch.problem([dims(322); 3], &options).is_ok());
    assert_eq!(
        named(batch.problem([dims(321), dims(322), dims(322)], &options)),
        "cu_seqlens_q"
    );
    assert_eq!(
        named(batch.problem([dims(322), dims(323), dims(323)], &options)),
        "cu_seqlens_k"
    );
    // Batch 2: not one packed tensor.
    assert_eq!(
        named(batch.problem([[2, 4, 322, 64], dims(322), dims(322)], &options)),
        "q"
    );
    let problem = batch.problem([dims(322); 3], &options).unwrap();
    assert_eq!(
        (
            problem.batch,
            problem.seqlen_q,
            problem.seqlen_k,
            problem.packed
        ),
        (
            3,
            300,
            300,
            Some(PackedRows {
                total_q: 322,
                total_k: 322
            })
        )
    );
    // The tensors' rows, for the passes that walk them: one sequence of all 322.
    let whole = problem.whole();
    assert_eq!(
        (whole.batch, whole.seqlen_q, whole.seqlen_k, whole.packed),
        (1, 322, 322, None)
    );
}

fn plan(
    algorithm: Algorithm,
    dtype: DType,
    head_dim: usize,
    options: &AttentionOptions,
) -> Result<ForwardPlan, Error> {
    let batch = PackedBatch::new(&[0, 100, 1100, 1117], &[0, 50, 1050, 1200]).unwrap();
    let q = [1, 8, 1117, head_dim];
    let kv = [1, 2, 1200, head_dim];
    let problem = batch.problem([q, kv, kv], options)?;
    ForwardPlan::new(
        &CompiledLimits::H200,
        algorithm,
        dtype,
        &problem,
        options,
        None,
    )
}

#[test]
fn a_packed_batch_plans_the_varlen_kernels_over_the_longest_sequence() {
    let options = AttentionOptions::default();
    let fa2_tc = plan(Algorithm::Fa2Tc, DType::Bf16, 128, &options).unwrap();
    let [launch] = fa2_tc.launches[..] else {
        panic!("one launch: {:?}", fa2_tc.launches)
    };
    assert_eq!(
        launch.kernel.to_string(),
        "fa2tc_forward_bf16_d128_w4r2s1c64_varlen"
    );
    // The longest sequence: 1000 queries in B_r = 128 rows; 3 sequences of 8 heads.
    assert_eq!(launch.launch.grid, (8, 24, 1));
    assert_eq!(fa2_tc.fallback, None);
    // FA3: the default split on the one-tile grid (the dense default at seqlen_k ≤ 2048 is
    // persistent), over the longest sequence: 1000 queries in B_r = 192 rows.
    let fa3 = plan(Algorithm::Fa3, DType::F16, 64, &options).unwrap();
    let [launch] = fa3.launches[..] else {
        panic!("one launch: {:?}", fa3.launches)
    };
    assert_eq!(
        launch.kernel.to_string(),
        "fa3_forward_f16_d64_w3c128_varlen"
    );
    assert_eq!(launch.launch.grid, (6, 24, 1));
    assert_eq!(fa3.fallback, None);
    // Head dim 40 runs on FA3's 64; not on FA2-TC (below).
    let fa3 = plan(Algorithm::Fa3, DType::Bf16, 40, &options).unwrap();
    assert_eq!(
        fa3.launches[0].kernel.to_string(),
        "fa3_forward_bf16_d64_w3c128_varlen"
    );
    let persistent = AttentionOptions {
        fa3_tiling: Some(
            flash_kernels::fwd::fa3::config::Fa3Tiling::new(3, 128).on_persistent_grid(),
        ),
        ..options
    };
    let err = plan(Algorithm::Fa3, DType::Bf16, 64, &persistent)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("allowed at compiled head dim 64 for a packed batch: w3c128 "),
        "{err}"
    );
    for algorithm in [Algorithm::Standard, Algorithm::Fa1, Algorithm::Fa2] {
        assert_eq!(
            named(plan(algorithm, DType::Bf16, 64, &options)),
            "algorithm"
        );
    }
    // No scalar kernel to fall back to: f32, a head dim FA2-TC does not compile.
    assert_eq!(
        named(plan(Algorithm::Fa2Tc, DType::F32, 64, &options)),
        "dtype"
    );
    let err = plan(Algorithm::Fa2Tc, DType::Bf16, 40, &options)
        .unwrap_err()
        .to_string();
    assert!(err.contains("packed batches run on FA2-TC"), "{err}");
    // The default tiling is the packed kernels' only one.
    let other = AttentionOptions {
        fa2_tc_tiling: Some(Fa2TcTiling::new(4, 1, 2, 64)),
        ..options
    };
    let err = plan(Algorithm::Fa2Tc, DType::Bf16, 128, &other)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("allowed at head_dim 128 for a packed batch: 4x2s1c64 "),
        "{err}"
    );
}

/// A window or soft-capping on a packed batch plans the `_varlen_local` kernels, which read both
/// the sequence offsets and the window; the packed kernels without it stay the plain `_varlen`.
#[test]
fn a_packed_batch_with_a_window_or_softcap_plans_the_varlen_local_kernels() {
    for options in [
        AttentionOptions {
            causal: true,
            window: Some((256, 0)),
            ..Default::default()
        },
        AttentionOptions {
            softcap: 30.0,
            ..Default::default()
        },
    ] {
        let fa3 = plan(Algorithm::Fa3, DType::Bf16, 128, &options).unwrap();
        assert_eq!(
            fa3.launches[0].kernel.to_string(),
            "fa3_forward_bf16_d128_w2c128_varlen_local"
        );
        let fa2_tc = plan(Algorithm::Fa2Tc, DType::F16, 64, &options).unwrap();
        assert_eq!(
            fa2_tc.launches[0].kernel.to_string(),
            "fa2tc_forward_f16_d64_w4r2s2c64_varlen_local"
        );
        // The faithful kernels still refuse both.
        assert_eq!(
            named(plan(Algorithm::Fa2, DType::Bf16, 64, &options)),
            "algorithm"
        );
    }
    // A window sides' range is checked as for a dense batch.
    let bad = AttentionOptions {
        window: Some((-2, 0)),
        ..Default::default()
    };
    assert_eq!(named(plan(Algorithm::Fa3, DType::Bf16, 64, &bad)), "window");
}

fn normal(dims: [usize; 4], rng: &mut impl rand::Rng) -> Array4<f64> {
    Array4::from_shape_simple_fn(dims, || StandardNormal.sample(rng))
}

/// Two sequences of one length, packed, give the dense batch of two; a sequence without keys
/// gives O = 0 and L = −∞; causal masks align to each sequence's own corner.
#[test]
fn the_packed_reference_is_the_dense_one_per_sequence() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (heads, heads_kv, d) = (4, 2, 16);
    let dense_q = normal([2, heads, 9, d], &mut rng);
    let dense_k = normal([2, heads_kv, 13, d], &mut rng);
    let dense_v = normal([2, heads_kv, 13, d], &mut rng);
    let pack = |a: &Array4<f64>| {
        ndarray::concatenate(
            Axis(2),
            &[a.slice(s![0..1, .., .., ..]), a.slice(s![1..2, .., .., ..])],
        )
        .unwrap()
    };
    let batch = PackedBatch::new(&[0, 9, 18], &[0, 13, 26]).unwrap();
    // The causal mask or none, and a window (3, 1) with soft-capping: each at every sequence's
    // own bottom-right corner.
    let windowed = Scoring {
        window: KeyWindow {
            left: Some(3),
            right: Some(1),
        },
        softcap: 2.0,
    };
    for scoring in [false.into(), true.into(), windowed] {
        let dense =
            attention_reference(dense_q.view(), dense_k.view(), dense_v.view(), scoring, 0.3);
        let packed = packed_attention_reference(
            pack(&dense_q).view(),
            pack(&dense_k).view(),
            pack(&dense_v).view(),
            &batch,
            scoring,
            0.3,
        );
        for b in 0..2 {
            let rows = 9 * b..9 * (b + 1);
            assert_eq!(
                packed.o.slice(s![0, .., rows.clone(), ..]),
                dense.o.slice(s![b, .., .., ..])
            );
            assert_eq!(
                packed.logsumexp.slice(s![0, .., rows]),
                dense.logsumexp.slice(s![b, .., ..])
            );
        }
    }
    // The second sequence has no keys.
    let q = normal([1, heads, 5, d], &mut rng);
    let kv = normal([1, heads_kv, 3, d], &mut rng);
    let batch = PackedBatch::new(&[0, 2, 5], &[0, 3, 3]).unwrap();
    let packed = packed_attention_reference(q.view(), kv.view(), kv.view(), &batch, true, 0.5);
    assert!(packed.o.slice(s![0, .., 2.., ..]).iter().all(|&x| x == 0.0));
    assert!(
        packed
            .logsumexp
            .slice(s![0, .., 2..])
            .iter()
            .all(|&x| x == f64::NEG_INFINITY)
    );
    assert!(
        packed
            .logsumexp
            .slice(s![0, .., ..2])
            .iter()
            .all(|x| x.is_finite())
    );
}

#[test]
fn check_packed_names_what_it_refuses_and_covers_every_head_dim() {
    let run = |args: &[&str]| {
        let output = std::process::Command::new(common::cli())
            .args(["check", "--packed"])
            .args(args)
            .output()
            .expect("the CLI runs");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (ok, err) = run(&["--algorithms", "fa3,standard"]);
    assert!(
        !ok && err.contains("`algorithms`: got standard")
            && err.contains("allowed with --packed: fa2-tc, fa3"),
        "{err}"
    );
    let (ok, err) = run(&["--dtypes", "f32"]);
    assert!(!ok && err.contains("`dtypes`: got f32"), "{err}");
    let (ok, err) = run(&["--decode"]);
    assert!(!ok && err.contains("cannot be used with"), "{err}");
    for dtype in flash_attn_lab::tools::check_packed::PACKED_DTYPES {
        let cases = flash_attn_lab::tools::check_packed::standard_packed_cases(dtype);
        for d in flash_attn::attention::fa2_tc_head_dims() {
            assert!(cases.iter().any(|c| c.head_dim == d as usize && c.causal));
            assert!(cases.iter().any(|c| c.head_dim == d as usize && !c.causal));
        }
        assert!(cases.iter().all(|c| c.dtype == dtype));
        assert!(
            cases
                .iter()
                .any(|c| c.lengths.iter().any(|&(q, k)| q > 0 && k == 0))
        );
        assert!(cases.iter().any(|c| c.heads_kv == 1));
        // Batches that take several launches, with and without a window.
        let several = |c: &&flash_attn_lab::tools::check_packed::PackedCheckCase| {
            c.lengths.len() > flash_kernels::common::params::MAX_SEQUENCES_PER_LAUNCH
        };
        assert!(cases.iter().filter(several).any(|c| c.window.is_none()));
        assert!(cases.iter().filter(several).any(|c| c.window.is_some()));
    }
}
