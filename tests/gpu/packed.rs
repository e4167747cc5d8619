//! GPU tests of packed batches (flash-attn's varlen call, `attention::packed`): FA3's and
//! FA2-TC's `_varlen` kernels on one packed Q, K, V against the same family's dense kernel (the
//! same tiling) run on each sequence alone. They must agree bit for bit: the same arithmetic on
//! the same rows, only where the rows are read from differs; and the dense kernels are the ones
//! `gpu/attention.rs` checks against the f64 reference (`check --packed` compares the packed ones
//! with it directly, on the same cases). Outputs are poisoned first, so a row the kernel forgot
//! fails; sequences without queries or without keys (O = 0, L = −∞), GQA and MQA, causal masks
//! and sliding windows aligned per sequence, soft-capping, both layouts, every head dim FA2-TC
//! compiles. Skipped without a GPU
//! (unless FLASH_ATTN_REQUIRE_GPU is set).

use crate::common;

use flash_attn::attention::{Attention, Blocks, PackedBatch, PassPlan, Plan};
use flash_attn::{Algorithm, AttentionOptions, DeviceTensor, Element, Gpu, Layout};
use flash_attn::{Error, with_element};
use flash_attn_lab::tools::check::random_tensor;
use flash_attn_lab::tools::check_packed::{PACKED_DTYPES, PackedCheckCase, standard_packed_cases};
use ndarray::{Array4, s};
use rand::Rng;

/// Runs `case` packed and per sequence; the first disagreement, if any.
fn check_case(
    gpu: &Gpu,
    algorithm: Algorithm,
    case: &PackedCheckCase,
    rng: &mut impl Rng,
) -> Result<String, String> {
    with_element!(case.dtype, T => check_typed::<T>(gpu, algorithm, case, rng))
}

fn check_typed<T: Element>(
    gpu: &Gpu,
    algorithm: Algorithm,
    case: &PackedCheckCase,
    rng: &mut impl Rng,
) -> Result<String, String> {
    let fail = |e: Error| e.to_string();
    let batch = PackedBatch::from_length_pairs(&case.lengths).map_err(fail)?;
    let [total_q, total_k] = batch.totals();
    let q = random_tensor::<T>([1, case.heads, total_q, case.head_dim], rng);
    let k = random_tensor::<T>([1, case.heads_kv, total_k, case.head_dim], rng);
    let v = random_tensor::<T>([1, case.heads_kv, total_k, case.head_dim], rng);
    let upload = |a: &Array4<T>| DeviceTensor::from_array(gpu, a.view(), case.layout);
    let (dq, dk, dv) = (
        upload(&q).map_err(fail)?,
        upload(&k).map_err(fail)?,
        upload(&v).map_err(fail)?,
    );
    let options = case.options();
    let output = Attention::new(&dq, &dk, &dv)
        .options(options)
        .algorithm(algorithm)
        .packed(&batch)
        .forward_filled(gpu, T::poison())
        .map_err(fail)?;
    // The dense kernel of the same family and tiling, per sequence.
    let (dense_algorithm, dense_options) = match blocks(&output.plan) {
        Blocks::Fa3 { tiling, .. } => (
            Algorithm::Fa3,
            AttentionOptions {
                fa3_tiling: Some(tiling),
                ..options
            },
        ),
        _ => (Algorithm::Fa2Tc, options),
    };
    let o = output.o.to_array(gpu).map_err(fail)?;
    let l = output
        .stats
        .logsumexp(gpu)
        .map_err(fail)?
        .index_axis_move(ndarray::Axis(0), 0);
    for b in 0..batch.sequences() {
        let (queries, keys) = batch.rows(b);
        if queries.is_empty() {
            continue;
        }
        let what = format!("sequence {b} ({} × {})", queries.len(), keys.len());
        if keys.is_empty() {
            let o_rows = o.slice(s![0, .., queries.clone(), ..]);
            if o_rows.iter().any(|x| x.to_f64() != 0.0)
                || l.slice(s![.., queries])
                    .iter()
                    .any(|&x| x != f32::NEG_INFINITY)
            {
                return Err(format!("{what}: no keys, but O ≠ 0 or L ≠ −∞"));
            }
            continue;
        }
        let part = |a: &Array4<T>, rows: std::ops::Range<usize>| {
            upload(&a.slice(s![.., .., rows, ..]).to_owned())
        };
        let (sq, sk, sv) = (
            part(&q, queries.clone()).map_err(fail)?,
            part(&k, keys.clone()).map_err(fail)?,
            part(&v, keys.clone()).map_err(fail)?,
        );
        let dense =
            common::forward(gpu, dense_algorithm, &sq, &sk, &sv, &dense_options).map_err(fail)?;
        let dense_o = dense.o.to_array(gpu).map_err(fail)?;
        let dense_l = dense.stats.logsumexp(gpu).map_err(fail)?;
        let packed_o = o.slice(s![0..1, .., queries.clone(), ..]);
        let differ = packed_o
            .iter()
            .zip(dense_o.iter())
            .filter(|(a, b)| a.to_f64().to_bits() != b.to_f64().to_bits())
            .count();
        let l_differ = l
            .slice(s![.., queries])
            .iter()
            .zip(dense_l.iter())
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        if differ + l_differ > 0 {
            return Err(format!(
                "{what}: {differ} O and {l_differ} L elements differ from the dense kernel's"
            ));
        }
    }
    Ok(format!(
        "{} [{}]",
        output.plan.launches()[0].kernel,
        output.plan.launches()[0].launch.grid.0
    ))
}

/// The algorithms that run packed batches on this GPU: FA2-TC, and FA3 where it runs.
fn algorithms(gpu: &Gpu) -> Vec<Algorithm> {
    if gpu.has_hopper_module() {
        vec![Algorithm::Fa2Tc, Algorithm::Fa3]
    } else {
        vec![Algorithm::Fa2Tc]
    }
}

fn run_all(gpu: &Gpu, test: &str, cases: &[PackedCheckCase]) {
    let mut rng = common::seeded_rng(test);
    let mut failures = Vec::new();
    let mut runs = 0;
    for algorithm in algorithms(gpu) {
        for case in cases {
            let label = format!(
                "{algorithm} {} h {}/{} d {} causal={} window={:?} softcap={} {} lengths {:?}",
                case.dtype,
                case.heads,
                case.heads_kv,
                case.head_dim,
                case.causal,
                case.window,
                case.softcap,
                case.layout.name(),
                case.lengths
            );
            runs += 1;
            match check_case(gpu, algorithm, case, &mut rng) {
                Ok(kernel) => println!("{label}: pass ({kernel})"),
                Err(e) => failures.push(format!("{label}: {e}")),
            }
        }
    }
    println!("{test}: {runs} cases, {} failed", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `check --packed`'s cases (`tools::check_packed::standard_packed_cases`: every compiled head
/// dim, both dtypes and layouts, causal both ways, GQA and MQA, a batch of mixed lengths with
/// an empty sequence and one without keys, 48 short sequences beside a long one, windows and
/// soft-capping at d = 64 and 128).
#[test]
fn packed_batches_match_the_dense_kernel_per_sequence() {
    let Some(gpu) = common::gpu_or_skip("packed_batches_match_the_dense_kernel_per_sequence")
    else {
        return;
    };
    let cases: Vec<PackedCheckCase> = PACKED_DTYPES
        .into_iter()
        .flat_map(standard_packed_cases)
        .collect();
    run_all(&gpu, "packed_grid", &cases);
}

/// Random lengths: 64 sequences of 0–129 queries on 1–299 keys beside one of 2048, MQA.
#[test]
fn random_short_sequences_and_mqa() {
    let Some(gpu) = common::gpu_or_skip("random_short_sequences_and_mqa") else {
        return;
    };
    let mut rng = common::seeded_rng("random_short_sequences_lengths");
    let lengths: Vec<(usize, usize)> = (0..64)
        .map(|_| (rng.random_range(0..130), rng.random_range(1..300)))
        .chain([(2048, 2048)])
        .collect();
    let cases = PACKED_DTYPES.map(|dtype| PackedCheckCase {
        heads: 8,
        heads_kv: 1,
        head_dim: 64,
        lengths: lengths.clone(),
        causal: true,
        window: None,
        softcap: 0.0,
        layout: Layout::BatchSeqHeadDim,
        dtype,
    });
    run_all(&gpu, "packed_random", &cases);
}

/// Issue 17's prefill target: a packed batch of equal lengths against the dense call on the
/// same Q, K, V (flash-attn's layout, bf16, the benchmark's B·N = 16384 tokens and H·d = 2048),
/// FA3 (where it runs) and FA2-TC, causal both ways, N = 2k and 4k: the median of ten timed
/// runs each, and packed / dense. The dense FA3 call takes the packed kernel's one-tile split, so
/// the ratio is the packing's cost alone (the persistent grid's own gain is docs/perf's v4). GPU
/// time: run with `--ignored`.
#[test]
#[ignore]
fn time_packed_batches_against_the_dense_call() {
    let test = "packed_timing";
    let Some(gpu) = common::gpu_or_skip(test) else {
        return;
    };
    let mut rng = common::seeded_rng(test);
    const RUNS: usize = common::TIMED_RUNS;
    for algorithm in common::timed_algorithms(&gpu) {
        for head_dim in [64usize, 128] {
            for seqlen in [2048usize, 4096] {
                for causal in [false, true] {
                    let (batch, heads) = (16384 / seqlen, 2048 / head_dim);
                    let packed_dims = [1, heads, batch * seqlen, head_dim];
                    let host = |rng: &mut rand::rngs::StdRng| {
                        random_tensor::<half::bf16>(packed_dims, rng)
                    };
                    let (q, k, v) = (host(&mut rng), host(&mut rng), host(&mut rng));
                    // The same values as a dense (batch, heads, seqlen, d) batch.
                    let dense = |a: &Array4<half::bf16>| {
                        let mut d =
                            Array4::from_elem([batch, heads, seqlen, head_dim], a[[0, 0, 0, 0]]);
                        for b in 0..batch {
                            d.slice_mut(s![b, .., .., ..]).assign(&a.slice(s![
                                0,
                                ..,
                                b * seqlen..(b + 1) * seqlen,
                                ..
                            ]));
                        }
                        d
                    };
                    let upload = |a: &Array4<half::bf16>| {
                        DeviceTensor::from_array(&gpu, a.view(), Layout::BatchSeqHeadDim)
                            .expect("upload")
                    };
                    let (pq, pk, pv) = (upload(&q), upload(&k), upload(&v));
                    let (dq, dk, dv) = (upload(&dense(&q)), upload(&dense(&k)), upload(&dense(&v)));
                    let batch_offsets =
                        PackedBatch::from_lengths(&vec![seqlen; batch]).expect("offsets");
                    let options = AttentionOptions {
                        causal,
                        ..Default::default()
                    };
                    let packed_call = Attention::new(&pq, &pk, &pv)
                        .options(options)
                        .algorithm(algorithm)
                        .packed(&batch_offsets);
                    let mut packed_out = packed_call.forward(&gpu).expect("warm-up");
                    let plan = packed_out.plan.clone();
                    let dense_options = match blocks(&plan) {
                        Blocks::Fa3 { tiling, .. } => AttentionOptions {
                            fa3_tiling: Some(tiling),
                            ..options
                        },
                        _ => options,
                    };
                    let dense_call = Attention::new(&dq, &dk, &dv)
                        .options(dense_options)
                        .algorithm(algorithm);
                    let mut dense_out = dense_call.forward(&gpu).expect("output");
                    let packed_ms = common::median_ms(
                        gpu.time_each_ms(RUNS, |_| {
                            packed_call
                                .forward_into(&gpu, packed_out.tensors())
                                .map(|_| ())
                        })
                        .expect("timed packed runs"),
                    );
                    let dense_ms = common::median_ms(
                        gpu.time_each_ms(RUNS, |_| {
                            dense_call
                                .forward_into(&gpu, dense_out.tensors())
                                .map(|_| ())
                        })
                        .expect("timed dense runs"),
                    );
                    let flops =
                        4.0 * (batch * heads) as f64 * (seqlen * seqlen) as f64 * head_dim as f64
                            / if causal { 2.0 } else { 1.0 };
                    let tflops = |ms: f64| flops / (ms * 1e-3) / 1e12;
                    println!(
                        "{algorithm} d = {head_dim}, N = {seqlen}, causal = {causal}: packed {:.1} \
                         TFLOP/s ({packed_ms:.3} ms), dense {:.1} ({dense_ms:.3} ms), packed / dense \
                         {:.3} [{}]",
                        tflops(packed_ms),
                        tflops(dense_ms),
                        dense_ms / packed_ms,
                        plan.kernel_names()
                    );
                }
            }
        }
    }
}

/// The block sizes of a forward plan.
fn blocks(plan: &Plan) -> Blocks {
    match &plan.pass {
        PassPlan::Forward(forward) => forward.blocks,
        _ => unreachable!("a forward plan"),
    }
}

/// The packed backward of `case` against the same family's dense backward on each sequence
/// alone (the forward's O and L from the packed forward, sliced): the same arithmetic on the
/// same rows, so dK and dV have the same values (a zero may differ in sign: rows past a
/// sequence add 0·x there, x the next sequence's, where the dense call adds 0·0), and so does dQ
/// in deterministic mode (the same order of additions); with atomic adds dQ is within a few
/// roundings of the dense one. Gradients are poisoned first, so a row the kernels forgot fails.
fn check_backward_typed<T: Element>(
    gpu: &Gpu,
    deterministic: bool,
    case: &PackedCheckCase,
    rng: &mut impl Rng,
) -> Result<String, String> {
    let fail = |e: Error| e.to_string();
    // The dtype's unit roundoff.
    let epsilon = if T::DTYPE == flash_attn::DType::Bf16 {
        2f64.powi(-8)
    } else {
        2f64.powi(-11)
    };
    let batch = PackedBatch::from_length_pairs(&case.lengths).map_err(fail)?;
    let [total_q, total_k] = batch.totals();
    let dims_q = [1, case.heads, total_q, case.head_dim];
    let dims_k = [1, case.heads_kv, total_k, case.head_dim];
    let (q, k, v, d_o) = (
        random_tensor::<T>(dims_q, rng),
        random_tensor::<T>(dims_k, rng),
        random_tensor::<T>(dims_k, rng),
        random_tensor::<T>(dims_q, rng),
    );
    let upload = |a: &Array4<T>| DeviceTensor::from_array(gpu, a.view(), case.layout);
    let [gq, gk, gv, g_o] = [&q, &k, &v, &d_o].map(|a| upload(a).map_err(fail));
    let (gq, gk, gv, g_o) = (gq?, gk?, gv?, g_o?);
    let mut options = case.options();
    options.deterministic = deterministic;
    if deterministic {
        // Packed deterministic calls run fa2-tc's; the dense call must run the same kernels.
        options.backward_algorithm = Algorithm::Fa2Tc;
    }
    let call = Attention::new(&gq, &gk, &gv)
        .options(options)
        .packed(&batch);
    let forward = call.forward(gpu).map_err(fail)?;
    let poisoned = |t: &DeviceTensor<T>| {
        DeviceTensor::filled(gpu, t.dims(), case.layout, T::poison()).map_err(fail)
    };
    let mut grads = flash_attn::attention::Gradients {
        dq: poisoned(&gq)?,
        dk: poisoned(&gk)?,
        dv: poisoned(&gk)?,
    };
    let flash_attn::RowStatistics::LogSumExp(l) = &forward.stats else {
        return Err("the packed forward wrote no L".into());
    };
    let plan = call
        .backward_into(
            gpu,
            flash_attn::attention::BackwardTensors {
                o: (&forward.o).into(),
                logsumexp: l.into(),
                d_o: (&g_o).into(),
                gradients: flash_attn::attention::Gradients {
                    dq: (&mut grads.dq).into(),
                    dk: (&mut grads.dk).into(),
                    dv: (&mut grads.dv).into(),
                },
            },
        )
        .map_err(fail)?;
    let PassPlan::Backward(backward) = &plan.pass else {
        return Err(format!("not a backward plan: {plan}"));
    };
    // The dense forward of the same family and tiling (its O and L are the packed forward's,
    // bit for bit: `packed_batches_match_the_dense_kernel_per_sequence`), then the same
    // backward.
    let (dense_algorithm, fa3_tiling) = match blocks(&forward.plan) {
        Blocks::Fa3 { tiling, .. } => (Algorithm::Fa3, Some(tiling)),
        _ => (Algorithm::Fa2Tc, None),
    };
    let dense_options = AttentionOptions {
        algorithm: dense_algorithm,
        fa3_tiling,
        backward_algorithm: backward.algorithm.into(),
        ..options
    };
    let got = [&grads.dq, &grads.dk, &grads.dv].map(|t| t.to_array(gpu));
    let [got_q, got_k, got_v] = got;
    let (got_q, got_k, got_v) = (
        got_q.map_err(fail)?,
        got_k.map_err(fail)?,
        got_v.map_err(fail)?,
    );
    for b in 0..batch.sequences() {
        let (queries, keys) = batch.rows(b);
        let what = format!("sequence {b} ({} × {})", queries.len(), keys.len());
        let zero = |a: &Array4<T>, rows: std::ops::Range<usize>| {
            a.slice(s![.., .., rows, ..])
                .iter()
                .all(|x| x.to_f64() == 0.0)
        };
        if queries.is_empty() || keys.is_empty() {
            if !(zero(&got_q, queries.clone()) && zero(&got_k, keys.clone())) || !zero(&got_v, keys)
            {
                return Err(format!("{what}: no queries or no keys, but a gradient ≠ 0"));
            }
            continue;
        }
        let part = |a: &Array4<T>, rows: std::ops::Range<usize>| {
            upload(&a.slice(s![.., .., rows, ..]).to_owned()).map_err(fail)
        };
        let (sq, sk, sv, s_o) = (
            part(&q, queries.clone())?,
            part(&k, keys.clone())?,
            part(&v, keys.clone())?,
            part(&d_o, queries.clone())?,
        );
        let dense = Attention::new(&sq, &sk, &sv).options(dense_options);
        let dense_forward = dense.forward(gpu).map_err(fail)?;
        let want = dense
            .backward(gpu, &dense_forward, &s_o)
            .map_err(fail)?
            .gradients;
        for (name, got, rows, want) in [
            ("dq", &got_q, queries.clone(), &want.dq),
            ("dk", &got_k, keys.clone(), &want.dk),
            ("dv", &got_v, keys.clone(), &want.dv),
        ] {
            let want = want.to_array(gpu).map_err(fail)?;
            let got = got.slice(s![.., .., rows, ..]);
            let scale = want.iter().fold(0.0f64, |m, x| m.max(x.to_f64().abs()));
            // dQ by atomic adds: each element a sum in another order, rounded to the dtype.
            let tolerance = if name == "dq" && !deterministic {
                scale * 2.0 * epsilon
            } else {
                0.0
            };
            let worst = got.iter().zip(want.iter()).fold(0.0f64, |m, (a, b)| {
                let d = (a.to_f64() - b.to_f64()).abs();
                if d.is_nan() { f64::INFINITY } else { m.max(d) }
            });
            if worst > tolerance {
                return Err(format!(
                    "{what}: {name} differs from the dense backward's by {worst:e} (allowed \
                     {tolerance:e}, largest {scale:e})"
                ));
            }
        }
    }
    Ok(format!(
        "{} [{}]",
        backward.launches[1].kernel, backward.launches[1].launch.grid.0
    ))
}

/// `check --packed`'s cases at head dims that are multiples of 8, backward: FA3's `_varlen`
/// kernels (fa2-tc's past 128) against the dense ones per sequence, and fa2-tc's in
/// deterministic mode.
#[test]
fn the_packed_backward_matches_the_dense_backward_per_sequence() {
    let test = "packed_backward";
    let Some(gpu) = common::gpu_or_skip(test) else {
        return;
    };
    let mut rng = common::seeded_rng(test);
    let mut failures = Vec::new();
    let mut runs = 0;
    let cases: Vec<PackedCheckCase> = PACKED_DTYPES
        .into_iter()
        .flat_map(standard_packed_cases)
        .filter(|case| case.head_dim.is_multiple_of(8))
        .collect();
    for deterministic in [false, true] {
        for case in &cases {
            let label = format!(
                "deterministic={deterministic} {} h {}/{} d {} causal={} window={:?} softcap={} \
                 {} lengths {:?}",
                case.dtype,
                case.heads,
                case.heads_kv,
                case.head_dim,
                case.causal,
                case.window,
                case.softcap,
                case.layout.name(),
                case.lengths
            );
            runs += 1;
            let result = with_element!(case.dtype, T => {
                check_backward_typed::<T>(&gpu, deterministic, case, &mut rng)
            });
            match result {
                Ok(kernel) => println!("{label}: pass ({kernel})"),
                Err(e) => failures.push(format!("{label}: {e}")),
            }
        }
    }
    println!("{test}: {runs} cases, {} failed", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
