//! `flash-attn`: run and check the Rust FlashAttention kernels.
//!
//! - `flash-attn info`   the device, the driver, and every kernel with its registers and memory
//! - `flash-attn check`  every algorithm on fresh random inputs against the f64 reference
//! - `flash-attn run`    one algorithm on the user's Q, K, V from a safetensors file
//! - `flash-attn bench`  the benchmark sweep, merged with PyTorch's SDPA backends
//! - `flash-attn io`     HBM traffic: the articles' formulas beside ncu's measurement
//! - `flash-attn plan`   which kernels a call would run, with which launches (no GPU needed)

mod bench;
mod call_args;
mod check;
mod io;
mod plan;
mod run;
mod run_decode;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use flash_attn::{Error, Gpu, attention};
use flash_kernels::fwd::fa2_tc::config::Fa2TcTiling;
use flash_kernels::registry::{KERNELS, Module};

#[derive(Parser)]
#[command(
    name = "flash-attn",
    version,
    about = "FlashAttention kernels in Rust: check and inspect them"
)]
struct Cli {
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0, global = true)]
    device: usize,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Device, driver, and the module's kernels with their registers and shared memory.
    Info,
    /// Run every algorithm on fresh random inputs at several shapes (lengths 1, 17, 1000, …) and
    /// compare with the f64 CPU reference. Exits non-zero on any failure.
    Check(check::CheckArgs),
    /// Run one algorithm on Q, K, V read from a safetensors file and write O and L to another.
    Run(run::RunArgs),
    /// The benchmark sweep (TFLOP/s, bandwidth, peak memory, longest N), merged with PyTorch's
    /// numbers when given; without a GPU, the predicted HBM traffic table.
    Bench(bench::BenchArgs),
    /// HBM traffic per algorithm: run once (under ncu), or compare ncu's CSV with the prediction.
    Io(io::IoArgs),
    /// The launch plan of a problem given by its shape, for each algorithm: kernels, grids,
    /// threads, shared memory, block sizes, and why a fallback. Uses the GPU's limits when there
    /// is one, the H200's otherwise.
    Plan(plan::PlanArgs),
}

fn main() -> ExitCode {
    // `flash-attn info | head`: end quietly when the reader goes away, as Unix tools do, instead
    // of panicking in println! on the broken pipe (Rust ignores SIGPIPE by default).
    #[cfg(unix)]
    // SAFETY: restores the default disposition of one signal before any other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info => info(cli.device),
        Command::Check(args) => check::main(cli.device, &args),
        Command::Run(args) => run::main(cli.device, &args),
        Command::Bench(args) => bench::main(cli.device, &args),
        Command::Io(args) => io::main(cli.device, &args),
        Command::Plan(args) => plan::main(cli.device, &args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Whether an error means "no GPU here" (as opposed to a broken GPU or a bug).
fn is_missing_gpu(e: &Error) -> bool {
    matches!(e, Error::NoDriver | Error::NoDevice { .. })
}

/// What `info` says about FA2 on tensor cores: where it runs (from the kernel list) and what
/// falls back.
fn fa2_tc_note() -> String {
    let per_head_dim: Vec<String> = attention::fa2_tc_head_dims()
        .into_iter()
        .map(|d| {
            let tilings: Vec<String> = attention::fa2_tc_tilings(d)
                .iter()
                .map(|t| t.to_string())
                .collect();
            let default = Fa2TcTiling::default_for(d);
            format!("d = {d}: {} (default {default})", tilings.join(", "))
        })
        .collect();
    format!(
        "fa2-tc: tensor cores (mma.sync m16n8k16, ldmatrix, cp.async) for f16 and bf16 with \
         16-byte-aligned rows; tilings WxRsScC (warps x row tiles, K/V stages, B_c):\n  {}\n\
         Every other dtype, head dim or layout runs the scalar fa2 (faithful FA2) instead, and the \
         plan says why.",
        per_head_dim.join("\n  ")
    )
}

/// What `info` says about FA3: its compiled head dims and tilings, and when it runs.
fn fa3_note() -> String {
    let tilings: Vec<String> = Module::Hopper
        .kernels()
        .iter()
        .filter(|k| k.dtype == flash_kernels::registry::ElementType::Bf16)
        .map(|k| match k.family {
            flash_kernels::registry::Family::Fa3 {
                head_dim,
                tiling,
                form,
            } => format!(
                "d{head_dim} {tiling}{}",
                match form {
                    flash_kernels::registry::KernelForm::Dense => "",
                    flash_kernels::registry::KernelForm::Packed => " (packed)",
                    flash_kernels::registry::KernelForm::Local => " (window, soft-capping)",
                    flash_kernels::registry::KernelForm::PackedLocal => {
                        " (packed, window, soft-capping)"
                    }
                }
            ),
            _ => k.to_string(),
        })
        .collect();
    format!(
        "fa3: Hopper (TMA, wgmma, warp specialization) for f16 and bf16 with 16-byte-aligned rows \
         and even head dims, each on the next compiled one; tilings wWcC (consumer warpgroups, \
         B_c): {}. Elsewhere fa2-tc runs, and the plan says why.",
        tilings.join(", ")
    )
}

fn info(device: usize) -> flash_attn::Result<ExitCode> {
    println!(
        "PTX modules: main {} ({} kernels), Hopper {} ({} kernels, FA3; loaded on compute \
         capability 9.0), embedded",
        flash_attn::device::PTX_ARCH,
        KERNELS.len(),
        flash_attn::device::HOPPER_PTX_ARCH,
        Module::Hopper.kernels().len()
    );
    println!("{}", fa2_tc_note());
    println!("{}", fa3_note());
    let gpu = match Gpu::open(device) {
        Ok(gpu) => gpu,
        Err(e) if is_missing_gpu(&e) => {
            println!("no GPU: {e}");
            for kernel in KERNELS.iter().chain(Module::Hopper.kernels().iter()) {
                println!("  {kernel}");
            }
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e),
    };
    let i = gpu.info();
    let (free, total) = gpu.memory()?;
    println!(
        "device {}: {} (compute capability {}.{}), {} SMs",
        i.ordinal, i.name, i.compute_capability.0, i.compute_capability.1, i.multiprocessors
    );
    println!(
        "driver: CUDA {}.{}",
        i.driver_version / 1000,
        i.driver_version % 1000 / 10
    );
    println!(
        "memory: {:.1} GiB free of {:.1} GiB",
        free as f64 / 1073741824.0,
        total as f64 / 1073741824.0
    );
    println!(
        "shared memory per block (opt-in): {} bytes",
        i.shared_memory_per_block
    );
    println!(
        "{:<34} {:>9} {:>12} {:>12} {:>11}",
        "kernel", "registers", "static smem", "local bytes", "max threads"
    );
    use cudarc::driver::sys::CUfunction_attribute as A;
    let hopper = gpu
        .has_hopper_module()
        .then(|| Module::Hopper.kernels().iter())
        .into_iter()
        .flatten();
    for &kernel in KERNELS.iter().chain(hopper) {
        let f = gpu.function(kernel)?;
        let attr = |a: A| f.get_attribute(a).unwrap_or(-1);
        println!(
            "{:<34} {:>9} {:>12} {:>12} {:>11}",
            kernel.to_string(),
            attr(A::CU_FUNC_ATTRIBUTE_NUM_REGS),
            attr(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
            attr(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES),
            attr(A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `--causal`: `off`, `on` or `both`, as the causal settings to run.
pub fn parse_causal(text: &str) -> flash_attn::Result<Vec<bool>> {
    match text {
        "off" => Ok(vec![false]),
        "on" => Ok(vec![true]),
        "both" => Ok(vec![false, true]),
        other => Err(flash_attn::Error::InvalidArgument {
            name: "causal",
            value: other.into(),
            allowed: "allowed: off, on, both".into(),
        }),
    }
}
