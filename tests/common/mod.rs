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
                form: flash_kernels::registry::ForwardForm::Dense,
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
