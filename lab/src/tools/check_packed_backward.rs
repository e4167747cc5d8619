//! Checking the packed backward (`attention::packed`'s batches through the backward's `_varlen`
//! kernels) against the f64 reference gradients of each sequence alone, with the backward's rule
//! (`tools::check_backward`) taken over the whole batch as `check --packed` takes the forward's:
//! per gradient, the largest error over every sequence against twice the largest in-dtype
//! baseline's error over every sequence plus one unit in the last place; sequences without
//! queries or keys must have zero gradients. Gradients are poisoned (NaN) before the launch, so
//! a row the kernels forgot fails.

use ndarray::{Array4, s};
use rand::Rng;

use crate::safetensors_io::GRADIENT_NAMES;
use crate::tools::check::to_f64;
use crate::tools::check_backward::{BackwardInputs, BackwardReference, GradientCheck};
use crate::tools::check_packed::{PackedCheckCase, PackedInputs};
use flash_attn::attention::{
    Algorithm, Attention, AttentionOptions, BackwardTensors, Gradients, RowStatistics,
};
use flash_attn::device::Gpu;
use flash_attn::dtype::Element;
use flash_attn::error::Result;
use flash_attn::tensor::DeviceTensor;
use flash_attn::with_element;

/// The outcome of one packed backward case.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PackedBackwardCheckResult {
    pub case: PackedCheckCase,
    pub deterministic: bool,
    /// dQ, dK, dV over the whole batch.
    pub gradients: [GradientCheck; 3],
    pub passed: bool,
    /// The backward plan's kernels.
    pub kernels: String,
}

/// Draws Q, K, V, dO for `case`, runs the packed forward (auto) and the packed backward (auto,
/// or deterministic: fa2-tc's ordered kernels) into poisoned gradients, and checks every
/// sequence's gradients against its own f64 reference.
pub fn check_packed_backward(
    gpu: &Gpu,
    deterministic: bool,
    case: &PackedCheckCase,
    rng: &mut impl Rng,
) -> Result<PackedBackwardCheckResult> {
    with_element!(case.dtype, T => check_typed::<T>(gpu, deterministic, case, rng))
}

fn check_typed<T: Element>(
    gpu: &Gpu,
    deterministic: bool,
    case: &PackedCheckCase,
    rng: &mut impl Rng,
) -> Result<PackedBackwardCheckResult> {
    let PackedInputs {
        batch,
        host: [q, k, v, d_o],
        device: [q_gpu, k_gpu, v_gpu, d_o_gpu],
    } = PackedInputs::<T>::draw(gpu, case, rng)?;
    let options = AttentionOptions {
        algorithm: Algorithm::Auto,
        deterministic,
        ..case.options()
    };
    let call = Attention::new(&q_gpu, &k_gpu, &v_gpu)
        .options(options)
        .packed(&batch);
    let forward = call.forward(gpu)?;
    let RowStatistics::LogSumExp(logsumexp) = &forward.stats else {
        unreachable!("a packed forward writes L")
    };
    let poisoned =
        |t: &DeviceTensor<T>| DeviceTensor::filled(gpu, t.dims(), case.layout, T::poison());
    let mut grads = Gradients {
        dq: poisoned(&q_gpu)?,
        dk: poisoned(&k_gpu)?,
        dv: poisoned(&k_gpu)?,
    };
    let plan = {
        let Gradients { dq, dk, dv } = &mut grads;
        call.backward_into(
            gpu,
            BackwardTensors {
                o: (&forward.o).into(),
                logsumexp: logsumexp.into(),
                d_o: (&d_o_gpu).into(),
                gradients: Gradients {
                    dq: dq.into(),
                    dk: dk.into(),
                    dv: dv.into(),
                },
            },
        )?
    };
    let scale = f64::from(plan.problem().expect("a backward plan").softmax_scale);
    let scoring = plan.problem().expect("a backward plan").scoring();
    let got = [&grads.dq, &grads.dk, &grads.dv].map(|t| t.to_array(gpu).map(|a| to_f64(&a)));
    let [got_q, got_k, got_v] = got;
    let got = [got_q?, got_k?, got_v?];
    let mut gradients: [GradientCheck; 3] = std::array::from_fn(|i| GradientCheck {
        name: GRADIENT_NAMES[i],
        error: 0.0,
        bound: 0.0,
        non_finite: got[i].iter().filter(|x| !x.is_finite()).count(),
    });
    for b in 0..batch.sequences() {
        let (queries, keys) = batch.rows(b);
        let rows = [queries.clone(), keys.clone(), keys.clone()];
        if queries.is_empty() || keys.is_empty() {
            // Nothing to attend: every gradient of the sequence's rows is 0.
            for (check, (g, rows)) in gradients.iter_mut().zip(got.iter().zip(rows)) {
                let largest = g
                    .slice(s![.., .., rows, ..])
                    .iter()
                    .fold(0.0f64, |m, x| m.max(x.abs()));
                check.error = check.error.max(largest);
            }
            continue;
        }
        let part =
            |a: &Array4<T>, rows: std::ops::Range<usize>| a.slice(s![.., .., rows, ..]).to_owned();
        let (sq, sk, sv, s_o) = (
            part(&q, queries.clone()),
            part(&k, keys.clone()),
            part(&v, keys.clone()),
            part(&d_o, queries.clone()),
        );
        let inputs = BackwardInputs {
            q: &sq,
            k: &sk,
            v: &sv,
            d_o: &s_o,
        };
        let sequence = Gradients {
            dq: got[0].slice(s![.., .., queries.clone(), ..]).to_owned(),
            dk: got[1].slice(s![.., .., keys.clone(), ..]).to_owned(),
            dv: got[2].slice(s![.., .., keys, ..]).to_owned(),
        };
        let checks = BackwardReference::new(&inputs, scoring, scale).check(&sequence);
        for (whole, one) in gradients.iter_mut().zip(checks) {
            whole.error = whole.error.max(one.error);
            whole.bound = whole.bound.max(one.bound);
        }
    }
    let passed = gradients.iter().all(GradientCheck::passed);
    Ok(PackedBackwardCheckResult {
        case: case.clone(),
        deterministic,
        gradients,
        passed,
        kernels: plan.kernel_names(),
    })
}

/// One line per result.
pub fn describe_packed_backward(r: &PackedBackwardCheckResult) -> String {
    let c = &r.case;
    let lengths = if c.lengths.len() <= 8 {
        format!("{:?}", c.lengths)
    } else {
        format!("[{} sequences]", c.lengths.len())
    };
    let gradients: Vec<String> = r
        .gradients
        .iter()
        .map(|g| format!("{} {:.3}", g.name, g.error / g.bound))
        .collect();
    format!(
        "packed backward{} {:<4} {:<4} h={} h_kv={} d={:<3} causal={:<5} window={:?} softcap={} \
         {lengths}: err/bound {} → {} [{}]",
        if r.deterministic {
            " deterministic"
        } else {
            ""
        },
        c.dtype.name(),
        c.layout.name(),
        c.heads,
        c.heads_kv,
        c.head_dim,
        c.causal,
        c.window,
        c.softcap,
        gradients.join(", "),
        if r.passed { "pass" } else { "FAIL" },
        r.kernels
    )
}
