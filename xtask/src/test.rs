//! `cargo xtask test`: the README's test command.

use std::process::Command;

use crate::{Result, cargo, run_command};

pub fn run() -> Result {
    for module in crate::MODULES {
        println!("== PTX build and ptxas check ({} module) ==", module.name());
        crate::ptx::ptxas_report(ptx_build::Arch::Sm90, module)?;
        println!(
            "\n== SASS check: the tensor-core kernels' main loop runs HMMA (HGMMA on Hopper) =="
        );
        crate::sass::report(ptx_build::Arch::Sm90, module, None, false)?;
    }
    println!("\n== kernels crate: host-side unit tests (online softmax, layouts, mask) ==");
    run_command(Command::new(cargo()).args(["test", "--manifest-path", "kernels/Cargo.toml"]))?;
    println!("\n== workspace tests (CPU tests always; GPU tests skip without a GPU) ==");
    run_command(Command::new(cargo()).args(["test", "--workspace", "--all-targets"]))?;
    Ok(())
}
