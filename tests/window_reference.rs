//! CPU tests of sliding-window attention and soft-capping: the f64 reference against the rule
//! written out on the full score matrix, its identities (a window spanning every key is no
//! window, causal is (−1, 0), rows that see no key), the FA2 emulator's block-skipping loop (the
//! kernels' `KeyBlocks` and mask) against the reference, and the API's named errors.

mod common;

use flash_attn::attention::backward_plan::BackwardOptions;
use flash_attn::attention::{
    AttentionOptions, BackwardArguments, BackwardPlan, BackwardProblem, CompiledLimits,
    ForwardPlan, Problem, TensorSpec,
};
use flash_attn::scoring::Scoring;
use flash_attn::{Algorithm, DType, Error};
use flash_attn_lab::model::fa2::emulate_fa2;
use flash_attn_lab::model::reference::{Reference, attention_reference};
use flash_attn_lab::tools::check::{F32_RELATIVE_TOLERANCE, LOGSUMEXP_TOLERANCE};
use flash_kernels::common::mask::KeyWindow;
use flash_kernels::fwd::fa2_tc::config::Fa2TcTiling;
use ndarray::{Array4, ArrayView1, s};

/// (batch, heads, seqlen_q, seqlen_k, head_dim).
const SHAPES: [[usize; 5]; 4] = [
    [1, 2, 113, 203, 16],
    [2, 1, 203, 113, 8],
    [1, 1, 64, 64, 4],
    [1, 1, 1, 70, 8],
];

/// Windows as flash-attn's (left, right), −1 unbounded, with the cases.
const WINDOWS: [(i64, i64); 8] = [
    (0, 0),
    (17, 0),
    (64, 64),
    (256, -1),
    (-1, 5),
    (3, 40),
    (-1, 0),
    (-1, -1),
];

fn window(left: i64, right: i64) -> KeyWindow {
    let side = |n: i64| u32::try_from(n).ok();
    KeyWindow {
        left: side(left),
        right: side(right),
    }
}

fn scoring(causal: bool, (left, right): (i64, i64), softcap: f64) -> Scoring {
    let mut window = window(left, right);
    if causal {
        window.right = Some(0);
    }
    Scoring { window, softcap }
}

fn inputs(shape: [usize; 5], seed: u64) -> [Array4<f64>; 3] {
    common::normal_tensors(shape, seed, [true, false, false]).map(|a| a.mapv(f64::from))
}

/// softmax over the keys the rule lets each query see, written out on the whole score matrix:
/// q + offset − left ≤ k ≤ q + offset + right, scores soft-capped first; O = 0, L = −∞ for a
/// row that sees nothing.
fn brute_force(
    [q, k, v]: &[Array4<f64>; 3],
    (left, right): (i64, i64),
    causal: bool,
    softcap: f64,
    scale: f64,
) -> Reference {
    let (batch, heads, seqlen_q, d) = q.dim();
    let seqlen_k = k.dim().2;
    let offset = seqlen_k as i64 - seqlen_q as i64;
    let right = if causal { 0 } else { right };
    let mut o = Array4::zeros(q.raw_dim());
    let mut logsumexp = ndarray::Array3::from_elem((batch, heads, seqlen_q), f64::NEG_INFINITY);
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..seqlen_q {
                let seen = |j: usize| {
                    let (i, j) = (i as i64 + offset, j as i64);
                    (left < 0 || j >= i - left) && (right < 0 || j <= i + right)
                };
                let scores: Vec<(usize, f64)> = (0..seqlen_k)
                    .filter(|&j| seen(j))
                    .map(|j| {
                        let s = scale * row_dot(q.slice(s![b, h, i, ..]), k.slice(s![b, h, j, ..]));
                        let s = if softcap > 0.0 {
                            softcap * (s / softcap).tanh()
                        } else {
                            s
                        };
                        (j, s)
                    })
                    .collect();
                if scores.is_empty() {
                    continue;
                }
                let max = scores.iter().map(|s| s.1).fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = scores.iter().map(|s| (s.1 - max).exp()).sum();
                for &(j, s) in &scores {
                    let p = (s - max).exp() / sum;
                    for x in 0..d {
                        o[[b, h, i, x]] += p * v[[b, h, j, x]];
                    }
                }
                logsumexp[[b, h, i]] = max + sum.ln();
            }
        }
    }
    Reference { o, logsumexp }
}

fn row_dot(a: ArrayView1<f64>, b: ArrayView1<f64>) -> f64 {
    a.dot(&b)
}

fn max_difference(a: &Reference, b: &Reference) -> (f64, f64) {
    let o =
        a.o.iter()
            .zip(&b.o)
            .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
    let l = a
        .logsumexp
        .iter()
        .zip(&b.logsumexp)
        .fold(
            0.0f64,
            |m, (x, y)| {
                if x == y { m } else { m.max((x - y).abs()) }
            },
        );
    (o, l)
}

#[test]
fn the_reference_follows_flash_attn_s_window_rule() {
    for (n, shape) in SHAPES.into_iter().enumerate() {
        let tensors = inputs(shape, n as u64);
        let [q, k, v] = &tensors;
        for window in WINDOWS {
            for causal in [false, true] {
                for softcap in [0.0, 5.0] {
                    let expected = brute_force(&tensors, window, causal, softcap, 0.3);
                    let scoring = scoring(causal, window, softcap);
                    let got = attention_reference(q.view(), k.view(), v.view(), scoring, 0.3);
                    let (o, l) = max_difference(&got, &expected);
                    assert!(
                        o < 1e-12 && l < 1e-12,
                        "{shape:?} {window:?} causal={causal} softcap={softcap}: {o} {l}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_window_spanning_every_key_is_no_window_and_causal_is_minus_one_zero() {
    let shape = [1, 2, 113, 203, 16];
    let [q, k, v] = inputs(shape, 7);
    let run = |scoring: Scoring| attention_reference(q.view(), k.view(), v.view(), scoring, 0.25);
    let full = run(false.into());
    // Left ≥ seqlen_k − 1 and right ≥ seqlen_q − 1 reach every key from every row.
    for wide in [(202, 112), (10_000, 10_000), (202, -1), (-1, 112)] {
        let got = run(scoring(false, wide, 0.0));
        assert_eq!(max_difference(&got, &full), (0.0, 0.0), "{wide:?}");
    }
    let causal = run(true.into());
    assert_eq!(
        max_difference(&run(scoring(false, (-1, 0), 0.0)), &causal),
        (0.0, 0.0)
    );
    // Causal with a window: right is 0 whatever the window says.
    assert_eq!(
        max_difference(
            &run(scoring(true, (30, 99), 0.0)),
            &run(scoring(false, (30, 0), 0.0))
        ),
        (0.0, 0.0)
    );
    // One row narrower than the full range changes the result.
    assert!(max_difference(&run(scoring(false, (201, -1), 0.0)), &full).0 > 0.0);
}

#[test]
fn rows_that_see_no_key_give_zero_and_minus_infinity() {
    // seqlen_q = 203 > seqlen_k = 113: offset −90, so with right = 0 rows 0..90 see no key, and
    // with (0, 0) row i ≥ 90 sees key i − 90 alone: O is that key's value, L its score.
    let shape = [1, 1, 203, 113, 8];
    let [q, k, v] = inputs(shape, 3);
    let got = attention_reference(
        q.view(),
        k.view(),
        v.view(),
        scoring(false, (0, 0), 0.0),
        0.5,
    );
    for i in 0..203 {
        if i < 90 {
            assert!(
                got.o.slice(s![0, 0, i, ..]).iter().all(|&x| x == 0.0),
                "row {i}"
            );
            assert_eq!(got.logsumexp[[0, 0, i]], f64::NEG_INFINITY, "row {i}");
        } else {
            let key = i - 90;
            let score = 0.5 * row_dot(q.slice(s![0, 0, i, ..]), k.slice(s![0, 0, key, ..]));
            assert!((got.logsumexp[[0, 0, i]] - score).abs() < 1e-12, "row {i}");
            let value = v.slice(s![0, 0, key, ..]);
            let o = got.o.slice(s![0, 0, i, ..]);
            assert!(
                o.iter().zip(value).all(|(a, b)| (a - b).abs() < 1e-12),
                "row {i}"
            );
        }
    }
}

#[test]
fn soft_capping_bounds_the_scores_and_a_huge_cap_is_none() {
    let shape = [1, 1, 17, 33, 8];
    let [q, k, v] = inputs(shape, 11);
    // Scale 100 makes scores of hundreds; capped at 2, each row's L is at most 2 + ln(33).
    let capped = attention_reference(
        q.view(),
        k.view(),
        v.view(),
        scoring(false, (-1, -1), 2.0),
        100.0,
    );
    assert!(
        capped
            .logsumexp
            .iter()
            .all(|&l| l <= 2.0 + 33f64.ln() + 1e-12)
    );
    let plain = attention_reference(q.view(), k.view(), v.view(), false, 0.3);
    let huge = attention_reference(
        q.view(),
        k.view(),
        v.view(),
        scoring(false, (-1, -1), 1e9),
        0.3,
    );
    let (o, l) = max_difference(&huge, &plain);
    assert!(o < 1e-9 && l < 1e-9, "{o} {l}");
}

/// The FA2 emulator runs the kernels' loop: the key blocks of `KeyBlocks` (from the first the
/// window reaches), the kernels' mask and soft-capping (as `fa2-tc` and `fa3` compute it).
#[test]
fn the_emulator_s_block_range_matches_the_reference() {
    for (n, shape) in SHAPES.into_iter().enumerate() {
        let f32_inputs = common::normal_tensors(shape, 100 + n as u64, [true, false, false]);
        let [q, k, v] = &f32_inputs;
        let wide = f32_inputs.clone().map(|a| a.mapv(f64::from));
        let scale = 1.0 / (shape[4] as f32).sqrt();
        for window in WINDOWS {
            for causal in [false, true] {
                for softcap in [0.0f32, 30.0, 5.0] {
                    let scoring = scoring(causal, window, softcap as f64);
                    let reference = attention_reference(
                        wide[0].view(),
                        wide[1].view(),
                        wide[2].view(),
                        scoring,
                        scale as f64,
                    );
                    let max_ref = reference.o.iter().fold(0.0f64, |m, x| m.max(x.abs()));
                    for blocks in [(64, 64), (16, 32), (3, 5)] {
                        let (o, lse, _) = emulate_fa2(
                            q.view(),
                            k.view(),
                            v.view(),
                            scoring,
                            scale,
                            blocks,
                            DType::F32,
                        );
                        let got = Reference {
                            o: o.mapv(f64::from),
                            logsumexp: lse.mapv(f64::from),
                        };
                        let (o_err, l_err) = max_difference(&got, &reference);
                        let what = format!(
                            "{shape:?} {window:?} causal={causal} softcap={softcap} {blocks:?}"
                        );
                        assert!(
                            o_err <= 4.0 * F32_RELATIVE_TOLERANCE * max_ref.max(1e-30),
                            "{what}: O error {o_err}"
                        );
                        assert!(l_err <= LOGSUMEXP_TOLERANCE, "{what}: L error {l_err}");
                        // −∞ exactly where the reference has it (rows that see nothing).
                        for (g, r) in got.logsumexp.iter().zip(&reference.logsumexp) {
                            assert_eq!(g.is_finite(), r.is_finite(), "{what}");
                        }
                    }
                }
            }
        }
    }
}

fn problem(window: Option<(i64, i64)>, softcap: f32) -> flash_attn::Result<Problem> {
    let options = AttentionOptions {
        window,
        softcap,
        ..Default::default()
    };
    Problem::new([1, 2, 100, 64], [1, 2, 80, 64], [1, 2, 80, 64], &options)
}

fn named(result: flash_attn::Result<impl std::fmt::Debug>) -> &'static str {
    match result {
        Err(Error::InvalidArgument { name, .. }) => name,
        other => panic!("expected an InvalidArgument, got {other:?}"),
    }
}

#[test]
fn bad_windows_and_soft_caps_are_named_errors() {
    for bad in [(-2, 0), (0, -5), (i64::MIN, -1), (1 << 40, 0)] {
        assert_eq!(named(problem(Some(bad), 0.0)), "window", "{bad:?}");
    }
    for bad in [-1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        assert_eq!(named(problem(None, bad)), "softcap", "{bad}");
    }
    let ok = problem(Some((-1, 7)), 30.0).unwrap();
    assert_eq!(ok.window_size(), (-1, 7));
    assert_eq!(problem(None, 0.0).unwrap().window_size(), (-1, -1));
}

#[test]
fn the_faithful_kernels_refuse_windows_and_soft_caps_and_the_backward_takes_them() {
    let limits = CompiledLimits::H200;
    for (window, softcap, name) in [(Some((16, 0)), 0.0, "window"), (None, 5.0, "softcap")] {
        let problem = problem(window, softcap).unwrap();
        let options = AttentionOptions {
            window,
            softcap,
            ..Default::default()
        };
        for algorithm in [Algorithm::Fa1, Algorithm::Fa2] {
            let plan = ForwardPlan::new(&limits, algorithm, DType::Bf16, &problem, &options, None);
            assert_eq!(named(plan), name, "{algorithm}");
        }
        // f32 on fa2-tc falls back to the scalar fa2, which refuses; the error says so.
        match ForwardPlan::new(
            &limits,
            Algorithm::Fa2Tc,
            DType::F32,
            &problem,
            &options,
            None,
        ) {
            Err(Error::InvalidArgument {
                name: n, allowed, ..
            }) => {
                assert_eq!(n, name);
                assert!(allowed.contains("fallback"), "{allowed}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        for algorithm in [Algorithm::Fa2Tc, Algorithm::Fa3, Algorithm::Standard] {
            ForwardPlan::new(&limits, algorithm, DType::Bf16, &problem, &options, None)
                .unwrap_or_else(|e| panic!("{algorithm} plans a {name}: {e}"));
        }
        let spec = |dims: [usize; 4]| TensorSpec::of_array(&Array4::<f32>::zeros(dims).view());
        let (q, kv) = (spec([1, 2, 100, 64]), spec([1, 2, 80, 64]));
        let arguments = BackwardArguments {
            q,
            k: kv,
            v: kv,
            o: q,
            d_o: q,
            logsumexp: [1, 2, 100],
            forward: None,
        };
        // The backward takes both on the tensor-core kernels' `local` form, and names them
        // where none can run (f32).
        let checked = BackwardProblem::new(&arguments, &options).unwrap();
        let backward = BackwardOptions::default();
        let plan =
            BackwardPlan::new(&limits, DType::Bf16, &checked.problem, &backward, None).unwrap();
        assert!(plan.kernel_names().contains("_local"), "{plan}");
        let refused = BackwardPlan::new(&limits, DType::F32, &checked.problem, &backward, None);
        assert_eq!(named(refused), name);
    }
}

#[test]
fn the_plan_counts_the_blocks_a_window_skips() {
    let limits = CompiledLimits::H200;
    let options = AttentionOptions {
        window: Some((64, 64)),
        ..Default::default()
    };
    let problem = Problem::new(
        [1, 1, 1024, 64],
        [1, 1, 1024, 64],
        [1, 1, 1024, 64],
        &options,
    )
    .unwrap();
    let plan = ForwardPlan::new(
        &limits,
        Algorithm::Fa2Tc,
        DType::Bf16,
        &problem,
        &options,
        None,
    )
    .unwrap();
    // 4x2s2c64 at d = 64: B_r = 128, B_c = 64; row block r (rows 128r..128r+128) sees keys
    // 128r − 64 ..= 128r + 191: 4 key blocks, or 3 at the first and last row blocks.
    assert_eq!(plan.key_blocks_visited(), Some((8 * 4 - 2, 8 * 16)));
}

/// Windows and soft-capping run on the `_local` kernels (each head dim's default tiling, FA3's
/// one-tile grid), calls with neither on the dense ones, which have the features compiled out;
/// a tiling the local form does not compile is a named error; a window on a packed batch runs
/// the `_varlen_local` kernels.
#[test]
fn windows_and_soft_caps_plan_the_local_kernels() {
    let limits = CompiledLimits::H200;
    let plan_of = |algorithm, window, softcap, tiling: Option<Fa2TcTiling>| {
        let options = AttentionOptions {
            window,
            softcap,
            fa2_tc_tiling: tiling,
            ..Default::default()
        };
        let problem = problem(window, softcap).unwrap();
        ForwardPlan::new(&limits, algorithm, DType::Bf16, &problem, &options, None)
    };
    let kernel =
        |plan: flash_attn::Result<ForwardPlan>| plan.unwrap().launches[0].kernel.to_string();
    for (window, softcap) in [(Some((16, 0)), 0.0), (None, 5.0), (Some((8, 8)), 30.0)] {
        assert_eq!(
            kernel(plan_of(Algorithm::Fa2Tc, window, softcap, None)),
            "fa2tc_forward_bf16_d64_w4r2s2c64_local"
        );
        // Short rows: the dense default would be the persistent grid; the local form has none.
        assert_eq!(
            kernel(plan_of(Algorithm::Fa3, window, softcap, None)),
            "fa3_forward_bf16_d64_w3c128_local"
        );
    }
    assert_eq!(
        kernel(plan_of(Algorithm::Fa2Tc, None, 0.0, None)),
        "fa2tc_forward_bf16_d64_w4r2s2c64"
    );
    assert_eq!(
        kernel(plan_of(Algorithm::Fa3, None, 0.0, None)),
        "fa3_forward_bf16_d64_w3c128p"
    );
    let other_tiling = Some(Fa2TcTiling::new(4, 1, 2, 64));
    assert!(plan_of(Algorithm::Fa2Tc, None, 0.0, other_tiling).is_ok());
    match plan_of(Algorithm::Fa2Tc, Some((16, 0)), 0.0, other_tiling) {
        Err(Error::InvalidArgument { name, allowed, .. }) => {
            assert_eq!(name, "fa2_tc_tiling");
            assert!(
                allowed.contains("with a window or soft-capping: 4x2s2c64"),
                "{allowed}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let options = AttentionOptions {
        window: Some((16, 0)),
        ..Default::default()
    };
    let batch = flash_attn::attention::PackedBatch::from_lengths(&[30, 50]).unwrap();
    let packed = batch
        .problem([[1, 2, 80, 64], [1, 2, 80, 64], [1, 2, 80, 64]], &options)
        .unwrap();
    // A packed batch takes the window too, on the kernels with both compiled in.
    for algorithm in [Algorithm::Fa2Tc, Algorithm::Fa3] {
        let plan =
            ForwardPlan::new(&limits, algorithm, DType::Bf16, &packed, &options, None).unwrap();
        let name = plan.launches[0].kernel.to_string();
        assert!(name.ends_with("_varlen_local"), "{algorithm}: {name}");
    }
}
