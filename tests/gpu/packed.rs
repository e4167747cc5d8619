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

use flash_attn::attention::{Attention, Blocks, DeviceOffsets, PackedBatch, PassPlan, Plan};
use flash_attn::{Algorithm, AttentionOptions, DeviceTensor, Element, Gpu, Layout};
use flash_attn::{Error, with_element};
use flash_attn_lab::tools::check::random_tensor;
use flash_attn_lab::tools::check_packed::{
    PACKED_DTYPES, PackedCheckCase, PackedInputs, standard_packed_cases,
};
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
    let PackedInputs {
        batch,
        host: [q, k, v, _],
        device: [dq, dk, dv, _],
    } = PackedInputs::<T>::draw(gpu, case, rng).map_err(fail)?;
    let upload = |a: &Array4<T>| DeviceTensor::from_array(gpu, a.view(), case.layout);
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

/// A case as the tests' lines name it.
fn describe(case: &PackedCheckCase) -> String {
    format!(
        "{} h {}/{} d {} causal={} window={:?} softcap={} {} lengths {:?}",
        case.dtype,
        case.heads,
        case.heads_kv,
        case.head_dim,
        case.causal,
        case.window,
        case.softcap,
        case.layout.name(),
        case.lengths
    )
}

fn run_all(gpu: &Gpu, test: &str, cases: &[PackedCheckCase]) {
    let mut rng = common::seeded_rng(test);
    let mut failures = Vec::new();
    let mut runs = 0;
    for algorithm in algorithms(gpu) {
        for case in cases {
            let label = format!("{algorithm} {}", describe(case));
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
    let PackedInputs {
        batch,
        host: [q, k, v, d_o],
        device: [gq, gk, gv, g_o],
    } = PackedInputs::<T>::draw(gpu, case, rng).map_err(fail)?;
    let upload = |a: &Array4<T>| DeviceTensor::from_array(gpu, a.view(), case.layout);
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
    let inputs = ([&gq, &gk, &gv], case.layout);
    let (plan, grads) = backward_poisoned(gpu, &call, &forward, &g_o, inputs).map_err(fail)?;
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
    let [got_q, got_k, got_v] = grads;
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

/// The backward of `call` after `forward` into gradients poisoned first (so a row the kernels
/// forgot shows), read back: the plan and [dQ, dK, dV].
/// `inputs`: Q, K, V in `layout`, whose dims the gradients take.
fn backward_poisoned<T: Element>(
    gpu: &Gpu,
    call: &Attention<T>,
    forward: &flash_attn::AttentionOutput<T>,
    d_o: &DeviceTensor<T>,
    (inputs, layout): ([&DeviceTensor<T>; 3], Layout),
) -> Result<(Plan, [Array4<T>; 3]), Error> {
    let poisoned = |t: &DeviceTensor<T>| DeviceTensor::filled(gpu, t.dims(), layout, T::poison());
    let [q, k, v] = inputs;
    let mut grads = [poisoned(q)?, poisoned(k)?, poisoned(v)?];
    let flash_attn::RowStatistics::LogSumExp(l) = &forward.stats else {
        return Err(Error::invalid("forward.stats", "m and ℓ", "L"));
    };
    let [dq, dk, dv] = &mut grads;
    let plan = call.backward_into(
        gpu,
        flash_attn::attention::BackwardTensors {
            o: (&forward.o).into(),
            logsumexp: l.into(),
            d_o: d_o.into(),
            gradients: flash_attn::attention::Gradients {
                dq: dq.into(),
                dk: dk.into(),
                dv: dv.into(),
            },
        },
    )?;
    let [dq, dk, dv] = &grads;
    Ok((
        plan,
        [dq.to_array(gpu)?, dk.to_array(gpu)?, dv.to_array(gpu)?],
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
    run_backward_cases(test, &backward_cases(), |case, deterministic| {
        with_element!(case.dtype, T => {
            check_backward_typed::<T>(&gpu, deterministic, case, &mut rng)
        })
    });
}

/// `check --packed`'s cases at head dims that are multiples of 8 (those the backward kernels take).
fn backward_cases() -> Vec<PackedCheckCase> {
    PACKED_DTYPES
        .into_iter()
        .flat_map(standard_packed_cases)
        .filter(|case| case.head_dim.is_multiple_of(8))
        .collect()
}

/// Runs `check` on every case, atomic then deterministic, and fails with every failure's line.
fn run_backward_cases(
    test: &str,
    cases: &[PackedCheckCase],
    mut check: impl FnMut(&PackedCheckCase, bool) -> Result<String, String>,
) {
    let (mut failures, mut runs) = (Vec::new(), 0);
    for deterministic in [false, true] {
        for case in cases {
            let label = format!("deterministic={deterministic} {}", describe(case));
            runs += 1;
            match check(case, deterministic) {
                Ok(kernels) => println!("{label}: pass ({kernels})"),
                Err(e) => failures.push(format!("{label}: {e}")),
            }
        }
    }
    println!("{test}: {runs} cases, {} failed", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Counts the elements whose bits differ.
fn bits_differ<T: Element>(a: &Array4<T>, b: &Array4<T>) -> usize {
    a.iter()
        .zip(b.iter())
        .filter(|(x, y)| x.to_f64().to_bits() != y.to_f64().to_bits())
        .count()
}

/// Offsets left on the GPU (`Attention::packed_on_device`, the kernels' `DeviceOffsets`) against
/// the same offsets read on the host: the same arithmetic on the same rows, so O, L, dK and dV
/// agree bit for bit, and dQ too in deterministic mode (with atomic adds, within a few roundings).
/// The grid is sized by the bounds, here the longest sequences.
fn check_device_offsets_typed<T: Element>(
    gpu: &Gpu,
    deterministic: bool,
    case: &PackedCheckCase,
    rng: &mut impl Rng,
) -> Result<String, String> {
    let fail = |e: Error| e.to_string();
    let PackedInputs {
        batch,
        device: [gq, gk, gv, g_o],
        ..
    } = PackedInputs::<T>::draw(gpu, case, rng).map_err(fail)?;
    let cu_q = gpu
        .upload(batch.cu_seqlens_q(), "cu_seqlens_q")
        .map_err(fail)?;
    let cu_k = gpu
        .upload(batch.cu_seqlens_k(), "cu_seqlens_k")
        .map_err(fail)?;
    // SAFETY: both buffers hold sequences + 1 offsets and outlive the calls (synchronous reads
    // below).
    let on_device = unsafe {
        DeviceOffsets::new(
            gpu.address(&cu_q),
            gpu.address(&cu_k),
            batch.sequences(),
            batch.max_seqlens(),
        )
    }
    .map_err(fail)?;
    let mut options = case.options();
    options.deterministic = deterministic;
    let base = Attention::new(&gq, &gk, &gv).options(options);
    let calls = [base.packed(&batch), base.packed_on_device(on_device)];
    let mut results = Vec::new();
    for call in &calls {
        let forward = call.forward_filled(gpu, T::poison()).map_err(fail)?;
        let inputs = ([&gq, &gk, &gv], case.layout);
        let (plan, grads) = backward_poisoned(gpu, call, &forward, &g_o, inputs).map_err(fail)?;
        let o = forward.o.to_array(gpu).map_err(fail)?;
        let l = forward.stats.logsumexp(gpu).map_err(fail)?;
        results.push((forward.plan, plan, o, l, grads));
    }
    let [
        (host_fwd, host_bwd, host_o, host_l, host_g),
        (fwd, bwd, o, l, g),
    ] = <[_; 2]>::try_from(results).map_err(|_| "two calls".to_string())?;
    if host_fwd.kernel_names() != fwd.kernel_names()
        || host_bwd.kernel_names() != bwd.kernel_names()
    {
        return Err(format!(
            "different kernels: host {host_fwd} / {host_bwd}, device {fwd} / {bwd}"
        ));
    }
    let l_differ = host_l
        .iter()
        .zip(l.iter())
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    let (o_differ, dk_differ, dv_differ) = (
        bits_differ(&host_o, &o),
        bits_differ(&host_g[1], &g[1]),
        bits_differ(&host_g[2], &g[2]),
    );
    // dQ: bit for bit in deterministic mode; with atomic adds within 2 roundings of the largest.
    let epsilon = if T::DTYPE == flash_attn::DType::Bf16 {
        2f64.powi(-8)
    } else {
        2f64.powi(-11)
    };
    let scale = host_g[0]
        .iter()
        .fold(0.0f64, |m, x| m.max(x.to_f64().abs()));
    let tolerance = if deterministic {
        0.0
    } else {
        2.0 * epsilon * scale
    };
    let dq_worst = host_g[0].iter().zip(g[0].iter()).fold(0.0f64, |m, (a, b)| {
        let d = (a.to_f64() - b.to_f64()).abs();
        if d.is_nan() { f64::INFINITY } else { m.max(d) }
    });
    if o_differ + l_differ + dk_differ + dv_differ > 0 || dq_worst > tolerance {
        return Err(format!(
            "device offsets differ from host offsets: O {o_differ}, L {l_differ}, dK \
             {dk_differ}, dV {dv_differ} elements; dQ by {dq_worst:e} (allowed {tolerance:e})"
        ));
    }
    Ok(format!("{} / {}", fwd.kernel_names(), bwd.kernel_names()))
}

/// `check --packed`'s cases at head dims that are multiples of 8 (empty sequences, 48 short
/// ones beside a long one, GQA, MQA, windows, soft-capping), forward and backward, atomic and
/// deterministic, plus 300 sequences (two launches): offsets on the device against the host's.
#[test]
fn offsets_on_the_device_give_what_host_offsets_give() {
    let test = "packed_device_offsets";
    let Some(gpu) = common::gpu_or_skip(test) else {
        return;
    };
    let mut rng = common::seeded_rng(test);
    let mut cases = backward_cases();
    let mut many = cases[0].clone();
    many.lengths = (0..300).map(|i| (1 + i % 37, 1 + (i * 7) % 41)).collect();
    cases.push(many);
    run_backward_cases(test, &cases, |case, deterministic| {
        with_element!(case.dtype, T => {
            check_device_offsets_typed::<T>(&gpu, deterministic, case, &mut rng)
        })
    });
}

/// Offsets on the device are not checked: wrong ones (decreasing, past the rows, longer than
/// the bounds) must still run without a fault, forward and backward, on every family and
/// order, with every access inside the tensors (compute-sanitizer's memcheck over this test
/// says so), and the rows they name correctly are still right (here sequence 0's).
#[test]
fn wrong_offsets_on_the_device_stay_inside_the_tensors() {
    let test = "packed_wrong_device_offsets";
    let Some(gpu) = common::gpu_or_skip(test) else {
        return;
    };
    let mut rng = common::seeded_rng(test);
    let (heads, d, total_q, total_k) = (4, 64, 300, 200);
    let mut tensor = |rows| random_tensor::<half::bf16>([1, heads, rows, d], &mut rng);
    let (q, k, v, d_o) = (
        tensor(total_q),
        tensor(total_k),
        tensor(total_k),
        tensor(total_q),
    );
    let upload = |a: &Array4<half::bf16>| {
        DeviceTensor::from_array(&gpu, a.view(), Layout::BatchSeqHeadDim).expect("upload")
    };
    let (gq, gk, gv, g_o) = (upload(&q), upload(&k), upload(&v), upload(&d_o));
    // Sequence 0 is right (40 × 50) and no other names its query rows; the others are longer
    // than the bounds (210 queries), past the rows (100 000), or decreasing (keys 50 → 10,
    // queries 100 000 → 299).
    let cu_q: [u32; 5] = [0, 40, 250, 100_000, 299];
    let cu_k: [u32; 5] = [0, 50, 10, 7, 100_000];
    let cu_q = gpu.upload(&cu_q, "cu_seqlens_q").expect("upload");
    let cu_k = gpu.upload(&cu_k, "cu_seqlens_k").expect("upload");
    let mut failures = Vec::new();
    for (algorithm, deterministic) in [
        (Algorithm::Auto, false),
        (Algorithm::Fa2Tc, false),
        (Algorithm::Auto, true),
    ] {
        for causal in [false, true] {
            // SAFETY: both buffers hold 5 offsets and outlive the calls.
            let offsets =
                unsafe { DeviceOffsets::new(gpu.address(&cu_q), gpu.address(&cu_k), 4, [64, 64]) }
                    .expect("valid addresses");
            let options = AttentionOptions {
                causal,
                deterministic,
                ..AttentionOptions::default()
            };
            let call = Attention::new(&gq, &gk, &gv)
                .options(options)
                .algorithm(algorithm)
                .packed_on_device(offsets);
            let label = format!("{algorithm} deterministic={deterministic} causal={causal}");
            let result = call.forward(&gpu).and_then(|forward| {
                let inputs = ([&gq, &gk, &gv], Layout::BatchSeqHeadDim);
                let (plan, _) = backward_poisoned(&gpu, &call, &forward, &g_o, inputs)?;
                gpu.synchronize()?;
                // Sequence 0 alone, dense: its rows of O are the packed call's.
                let rows =
                    |a: &Array4<half::bf16>, n| upload(&a.slice(s![.., .., 0..n, ..]).to_owned());
                let dense = Attention::new(&rows(&q, 40), &rows(&k, 50), &rows(&v, 50))
                    .options(options)
                    .algorithm(Algorithm::Fa2Tc)
                    .forward(&gpu)?;
                let (o, want) = (forward.o.to_array(&gpu)?, dense.o.to_array(&gpu)?);
                let worst = o
                    .slice(s![.., .., 0..40, ..])
                    .iter()
                    .zip(want.iter())
                    .fold(0.0f64, |m, (a, b)| m.max((a.to_f64() - b.to_f64()).abs()));
                Ok((forward.plan, plan, worst))
            });
            match result {
                Ok((forward, backward, worst)) if worst <= 2f64.powi(-6) => println!(
                    "{label}: ran ({} / {}), sequence 0 within {worst:e}",
                    forward.kernel_names(),
                    backward.kernel_names()
                ),
                Ok((_, _, worst)) => failures.push(format!("{label}: sequence 0 off by {worst:e}")),
                Err(e) => failures.push(format!("{label}: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
