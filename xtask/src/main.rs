//! `cargo xtask <command>`: the project's automation, one module per command.
//!
//! - `ptx [--arch sm_90]`    build the PTX modules (the same builds the host crate's build script
//!   runs): the main one for `--arch`, and the Hopper one (sm_90a)
//! - `ptxas [--arch sm_90]`  assemble them with ptxas and print registers, shared memory, stack, spills
//! - `sass [--kernel NAME] [--blocks]`  SASS of the tensor-core kernels: HMMA, ldmatrix, MUFU,
//!   spills in the main loop; `--blocks`: its basic blocks (paths) and their instruction mix
//! - `test`                  PTX build, ptxas and SASS checks, and every test (the README's test command)
//! - `bundle`                release binaries + PTX + run scripts, and the Python wheel with its GPU
//!   tests, for a GPU machine without Rust

mod bundle;
mod bundle_cubin;
mod bundle_files;
mod bundle_python;
mod ptx;
mod sass;
mod test;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "Build, check and package the FlashAttention kernels"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build the PTX module.
    Ptx {
        #[arg(long, default_value = "sm_90")]
        arch: ptx_build::Arch,
    },
    /// Assemble the PTX with ptxas -v and print a resource table per kernel; fails on any error.
    Ptxas {
        #[arg(long, default_value = "sm_90")]
        arch: ptx_build::Arch,
    },
    /// Disassemble the module (cuobjdump/nvdisasm from PyPI) and count, per tensor-core kernel,
    /// the HMMA, ldmatrix, MUFU and local-memory instructions of its main loop; fails when a
    /// tensor-core kernel has no HMMA in a loop. Writes the full SASS beside the PTX.
    Sass {
        #[arg(long, default_value = "sm_90")]
        arch: ptx_build::Arch,
        /// Kernels whose name contains this (default: the tensor-core kernels).
        #[arg(long)]
        kernel: Option<String>,
        /// Also list each kernel's main-loop basic blocks with their instruction mix: its paths
        /// (masked or not, rescale branch taken or not) one by one.
        #[arg(long)]
        blocks: bool,
    },
    /// PTX build, ptxas and SASS checks, then every test. GPU tests skip (and say so) without a GPU.
    Test,
    /// Release binaries and a run script, in one folder, for a GPU machine with no Rust toolchain.
    Bundle {
        #[arg(long, default_value = "bundle")]
        out: PathBuf,
        /// Also the criterion benchmark binary (`bin/bench-attention`, which no bundle script
        /// runs); each binary embeds the PTX, so with it the bundle may pass the transfer limit.
        #[arg(long)]
        criterion: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Ptx { arch } => MODULES.iter().try_for_each(|&module| {
            let ptx = ptx::build(arch, module)?;
            println!("{} kernels in {}", ptx.kernels.len(), ptx.path.display());
            Ok(())
        }),
        Command::Ptxas { arch } => MODULES
            .iter()
            .try_for_each(|&module| ptx::ptxas_report(arch, module).map(|_| ())),
        Command::Sass {
            arch,
            kernel,
            blocks,
        } => MODULES.iter().try_for_each(|&module| {
            sass::report(arch, module, kernel.as_deref(), blocks).map(|_| ())
        }),
        Command::Test => test::run(),
        Command::Bundle { out, criterion } => bundle::run(&out, criterion),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

pub type Result<T = ()> = std::result::Result<T, String>;

/// Both PTX modules, in build order.
const MODULES: [ptx_build::Module; 2] = [ptx_build::Module::Main, ptx_build::Module::Hopper];

/// The workspace root (the parent of this crate).
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."))
}

/// The cargo running this xtask (same toolchain).
pub fn cargo() -> PathBuf {
    std::env::var_os("CARGO")
        .map(PathBuf::from)
        .unwrap_or_else(|| "cargo".into())
}

/// Runs a command in the workspace root, streaming its output; fails if it fails.
pub fn run_command(cmd: &mut std::process::Command) -> Result {
    let status = cmd
        .current_dir(root())
        .status()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed ({status})"))
    }
}
