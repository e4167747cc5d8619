//! `cargo xtask test`: the README's test command.

use std::process::Command;

use crate::{Result, cargo, run_command};

pub fn run() -> Result {
    println!("== PTX build and ptxas check (sm_90) ==");
    crate::ptx::ptxas_report(ptx_build::Arch::Sm90)?;
    println!("\n== SASS check: the tensor-core kernels' main loop runs HMMA ==");
    crate::sass::report(ptx_build::Arch::Sm90, None, false)?;
    println!("\n== kernels crate: host-side unit tests (online softmax, layouts, mask) ==");
    run_command(Command::new(cargo()).args(["test", "--manifest-path", "kernels/Cargo.toml"]))?;
    println!("\n== workspace tests (CPU tests always; GPU tests skip without a GPU) ==");
    run_command(Command::new(cargo()).args(["test", "--workspace", "--all-targets"]))?;
    Ok(())
}
