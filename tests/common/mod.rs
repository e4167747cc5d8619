//! Helpers shared by the integration tests (each test binary compiles this module and uses a
//! subset of it, hence the `dead_code` allowance).
#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;

use flash_attn::{Error, Gpu};
use rand::SeedableRng;

/// The GPU, or `None` after saying why the test is skipped. With `FLASH_ATTN_REQUIRE_GPU` set (the
/// bundle's run script sets it) a missing GPU is a failure instead.
pub fn gpu_or_skip(test: &str) -> Option<Gpu> {
    match Gpu::open(0) {
        Ok(gpu) => Some(gpu),
        Err(e @ (Error::NoDriver | Error::NoDevice { .. }))
            if std::env::var_os("FLASH_ATTN_REQUIRE_GPU").is_none() =>
        {
            // Written straight to stderr: the test harness captures println!, and a skip must show.
            let _ = writeln!(std::io::stderr(), "{test}: skipped: {e}");
            None
        }
        Err(e) => panic!("{test}: cannot open the GPU: {e}"),
    }
}

/// Timed runs of the timing tests (`--ignored`): each point is the median of this many.
pub const TIMED_RUNS: usize = 10;

/// The tensor-core families a timing test compares on this GPU: FA3 where it runs, then FA2-TC.
pub fn timed_algorithms(gpu: &Gpu) -> Vec<flash_attn::Algorithm> {
    if gpu.has_hopper_module() {
        vec![flash_attn::Algorithm::Fa3, flash_attn::Algorithm::Fa2Tc]
    } else {
        vec![flash_attn::Algorithm::Fa2Tc]
    }
}

/// The median of [`TIMED_RUNS`] times, in ms.
pub fn median_ms(mut times: Vec<f32>) -> f64 {
    times.sort_by(f32::total_cmp);
    f64::from(times[times.len() / 2])
}

/// A tensor-core family (`fa2-tc`, `fa3`) ran its own kernels, not a fallback's.
pub fn assert_own_kernels(result: &flash_attn_lab::tools::check::CheckResult) {
    let family = match result.algorithm {
        flash_attn::Algorithm::Fa3 => "fa3_forward_",
        flash_attn::Algorithm::Fa2Tc => "fa2tc_forward_",
        _ => return,
    };
    assert!(
        result.kernels.starts_with(family),
        "{} ran {}",
        result.algorithm,
        result.kernels
    );
}

/// FA3's dense kernels, one per (compiled head dim, tiling): the bf16 entries of the Hopper
/// list (each packed `_varlen` kernel is a dense tiling's twin, `gpu/packed.rs`'s to check).
pub fn fa3_tilings() -> Vec<(u32, flash_kernels::fwd::fa3::config::Fa3Tiling)> {
    use flash_kernels::registry::{ElementType, Family, HOPPER_KERNELS};
    HOPPER_KERNELS
        .iter()
        .filter(|k| k.dtype == ElementType::Bf16)
        .filter_map(|k| match k.family {
            Family::Fa3 {
                head_dim,
                tiling,
                form: flash_kernels::registry::KernelForm::Dense,
            } => Some((head_dim, tiling)),
            _ => None,
        })
        .collect()
}

/// The `flash-attn` CLI: cargo's build of it, or the copy beside this test binary (where
/// `cargo xtask bundle` puts both: on the GPU machine there is no cargo build tree).
pub fn cli() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_BIN_EXE_flash-attn"));
    if built.exists() {
        return built;
    }
    std::env::current_exe()
        .expect("the test binary's path")
        .with_file_name("flash-attn")
}

/// A fresh random generator whose seed is printed; `FLASH_ATTN_SEED` replays a run.
pub fn seeded_rng(test: &str) -> rand::rngs::StdRng {
    let seed = std::env::var("FLASH_ATTN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("{test}: seed {seed} (FLASH_ATTN_SEED={seed} reproduces it)");
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// N(0, 1) f32 tensors drawn in order from one seeded generator, for a problem of
/// `[batch, heads, seqlen_q, seqlen_k, head_dim]`: tensor i has seqlen_q rows where
/// `query_rows[i]` (Q, O, dO), seqlen_k rows otherwise (K, V).
pub fn normal_tensors<const N: usize>(
    [batch, heads, seqlen_q, seqlen_k, head_dim]: [usize; 5],
    seed: u64,
    query_rows: [bool; N],
) -> [ndarray::Array4<f32>; N] {
    use rand_distr::Distribution;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    query_rows.map(|query| {
        let seqlen = if query { seqlen_q } else { seqlen_k };
        ndarray::Array4::from_shape_simple_fn((batch, heads, seqlen, head_dim), || {
            rand_distr::StandardNormal.sample(&mut rng)
        })
    })
}

/// The forward of `algorithm` on owned tensors through the front door (new outputs).
#[allow(dead_code)]
pub fn forward<T: flash_attn::Element>(
    gpu: &Gpu,
    algorithm: flash_attn::Algorithm,
    q: &flash_attn::DeviceTensor<T>,
    k: &flash_attn::DeviceTensor<T>,
    v: &flash_attn::DeviceTensor<T>,
    options: &flash_attn::AttentionOptions,
) -> flash_attn::Result<flash_attn::AttentionOutput<T>> {
    flash_attn::Attention::new(q, k, v)
        .options(*options)
        .algorithm(algorithm)
        .forward(gpu)
}

/// The backward `backward` asks for, through the front door, into `gradients`; its plan.
#[allow(dead_code, clippy::too_many_arguments)]
pub fn backward_into<T: flash_attn::Element>(
    gpu: &Gpu,
    q: &flash_attn::DeviceTensor<T>,
    k: &flash_attn::DeviceTensor<T>,
    v: &flash_attn::DeviceTensor<T>,
    forward: &flash_attn::AttentionOutput<T>,
    d_o: &flash_attn::DeviceTensor<T>,
    gradients: &mut flash_attn::Gradients<flash_attn::DeviceTensor<T>>,
    options: &flash_attn::AttentionOptions,
    backward: &flash_attn::attention::backward_plan::BackwardOptions,
) -> flash_attn::Result<flash_attn::attention::BackwardPlan> {
    let flash_attn::RowStatistics::LogSumExp(logsumexp) = &forward.stats else {
        return Err(Error::InvalidArgument {
            name: "forward.stats",
            value: "FA1's m and ℓ".into(),
            allowed: "L = m + log ℓ".into(),
        });
    };
    let options = flash_attn::AttentionOptions {
        backward_algorithm: backward.algorithm.into(),
        deterministic: backward.deterministic,
        ..*options
    };
    let flash_attn::Gradients { dq, dk, dv } = gradients;
    let plan = flash_attn::Attention::new(q, k, v)
        .options(options)
        .backward_into(
            gpu,
            flash_attn::BackwardTensors {
                o: (&forward.o).into(),
                logsumexp: logsumexp.into(),
                d_o: d_o.into(),
                gradients: flash_attn::Gradients {
                    dq: dq.into(),
                    dk: dk.into(),
                    dv: dv.into(),
                },
            },
        )?;
    match plan.pass {
        flash_attn::attention::PassPlan::Backward(plan) => Ok(plan),
        _ => unreachable!("a backward plan"),
    }
}

/// The lab's `run_backward_poisoned` with the backward `backward` asks for; its backward plan.
#[allow(dead_code)]
pub fn run_backward_poisoned<T: flash_attn::Element>(
    gpu: &Gpu,
    tensors: [&flash_attn::DeviceTensor<T>; 4],
    options: &flash_attn::AttentionOptions,
    backward: &flash_attn::attention::backward_plan::BackwardOptions,
    layout: flash_attn::Layout,
) -> flash_attn::Result<(
    flash_attn::Gradients<flash_attn::DeviceTensor<T>>,
    flash_attn::attention::BackwardPlan,
)> {
    let options = flash_attn::AttentionOptions {
        backward_algorithm: backward.algorithm.into(),
        deterministic: backward.deterministic,
        ..*options
    };
    let (gradients, plan) = flash_attn_lab::tools::check_backward::run_backward_poisoned(
        gpu, tensors, &options, layout,
    )?;
    match plan.pass {
        flash_attn::attention::PassPlan::Backward(plan) => Ok((gradients, plan)),
        _ => unreachable!("a backward plan"),
    }
}
