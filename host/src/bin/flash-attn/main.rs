//! `flash-attn`: run and check the Rust FlashAttention kernels.
//!
//! - `flash-attn info`   the device, the driver, and every kernel with its registers and memory
//! - `flash-attn check`  every algorithm on fresh random inputs against the f64 reference
//! - `flash-attn run`    one algorithm on the user's Q, K, V from a safetensors file

mod run;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use flash_attn::check::{CheckProblem, check_problem, describe};
use flash_attn::{Algorithm, DType, Error, Gpu, Layout};
use rand::SeedableRng;

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
    Check {
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
    },
    /// Run one algorithm on Q, K, V read from a safetensors file and write O and L to another.
    Run(run::RunArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info => info(cli.device),
        Command::Check {
            algorithms,
            dtypes,
            seed,
            require_gpu,
        } => check(cli.device, &algorithms, &dtypes, seed, require_gpu),
        Command::Run(args) => run::main(cli.device, &args),
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

fn info(device: usize) -> flash_attn::Result<ExitCode> {
    println!(
        "PTX module: {} ({} kernels, embedded)",
        flash_attn::device::PTX_ARCH,
        Gpu::kernel_names().len()
    );
    let gpu = match Gpu::open(device) {
        Ok(gpu) => gpu,
        Err(e) if is_missing_gpu(&e) => {
            println!("no GPU: {e}");
            for name in Gpu::kernel_names() {
                println!("  {name}");
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
    for name in Gpu::kernel_names() {
        let f = gpu.function(name)?;
        let attr = |a: A| f.get_attribute(a).unwrap_or(-1);
        println!(
            "{:<34} {:>9} {:>12} {:>12} {:>11}",
            name,
            attr(A::CU_FUNC_ATTRIBUTE_NUM_REGS),
            attr(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
            attr(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES),
            attr(A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The shapes `check` runs: (batch, heads, seqlen_q, seqlen_k, head_dim). Lengths that are not
/// multiples of any block size (1, 17, 1000, 113, 203), both seqlen_q < seqlen_k and >, odd head dims.
const CHECK_SHAPES: [(usize, usize, usize, usize, usize); 6] = [
    (1, 1, 1, 1, 64),
    (2, 3, 17, 17, 40),
    (1, 2, 1000, 1000, 64),
    (2, 3, 113, 203, 59),
    (1, 2, 256, 128, 128),
    (1, 1, 300, 300, 256),
];

fn check(
    device: usize,
    algorithms: &[String],
    dtypes: &[String],
    seed: Option<u64>,
    require_gpu: bool,
) -> flash_attn::Result<ExitCode> {
    let algorithms: Vec<Algorithm> = if algorithms.is_empty() {
        Algorithm::ALL.to_vec()
    } else {
        algorithms
            .iter()
            .map(|a| a.parse())
            .collect::<Result<_, _>>()?
    };
    let dtypes: Vec<DType> = if dtypes.is_empty() {
        DType::ALL.to_vec()
    } else {
        dtypes.iter().map(|d| d.parse()).collect::<Result<_, _>>()?
    };
    let gpu = match Gpu::open(device) {
        Ok(gpu) => gpu,
        Err(e) if is_missing_gpu(&e) && !require_gpu => {
            println!("GPU checks skipped: {e}");
            println!("(the CPU reference and emulators are covered by `cargo xtask test`)");
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e),
    };
    let seed = seed.unwrap_or_else(rand::random);
    println!(
        "check on {} with seed {seed} (rerun with --seed {seed})",
        gpu.info().name
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (mut passed, mut failed) = (0, 0);
    for &dtype in &dtypes {
        for (batch, heads, seqlen_q, seqlen_k, head_dim) in CHECK_SHAPES {
            for causal in [false, true] {
                let problem = CheckProblem {
                    batch,
                    heads,
                    seqlen_q,
                    seqlen_k,
                    head_dim,
                    causal,
                    dtype,
                };
                for result in check_problem(
                    &gpu,
                    problem,
                    &algorithms,
                    &[Layout::BatchHeadSeqDim],
                    &mut rng,
                )? {
                    println!("{}", describe(&result));
                    if result.passed {
                        passed += 1
                    } else {
                        failed += 1
                    }
                }
            }
        }
    }
    println!("check: {passed} passed, {failed} failed");
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
