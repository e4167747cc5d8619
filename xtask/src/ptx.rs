//! `cargo xtask ptx` and `cargo xtask ptxas`.

use std::path::PathBuf;
use std::process::Command;

use ptx_build::{Arch, Module, Ptx, PtxBuild};

use crate::{Result, root};

/// The ptxas wheel: CUDA 13.0, the release on the project's H200 machine.
const PTXAS_WHEEL: &str = "nvidia-cuda-nvcc==13.0.88";

/// The build of `module` (the main one for `arch`; the Hopper one is always sm_90a).
pub fn build_of(arch: Arch, module: Module) -> PtxBuild {
    PtxBuild {
        kernels_dir: root().join("kernels"),
        target_dir: root().join("target/ptx"),
        cargo: crate::cargo(),
        arch,
        module,
    }
}

/// Builds `module`'s PTX into `target/ptx/`.
pub fn build(arch: Arch, module: Module) -> Result<Ptx> {
    build_of(arch, module).run().map_err(|e| e.to_string())
}

/// ptxas from the PyPI wheel, installed into `.tools/` (git-ignored) on first use.
pub fn ptxas() -> Result<PathBuf> {
    tool_from_wheel("cuda-nvcc", PTXAS_WHEEL, "ptxas")
}

/// `binary` from a CUDA PyPI wheel (`nvidia/cu13/bin/`), installed into `.tools/<dir>` on first
/// use, so CI and machines without a CUDA toolkit get NVIDIA's own tools.
pub fn tool_from_wheel(dir: &str, wheel: &str, binary: &str) -> Result<PathBuf> {
    let tools = root().join(".tools").join(dir);
    let path = tools.join("nvidia/cu13/bin").join(binary);
    if !path.exists() {
        eprintln!("installing {binary} ({wheel}) into {}", tools.display());
        let status = Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--no-deps", "--target"])
            .arg(&tools)
            .arg(wheel)
            .status()
            .map_err(|e| format!("cannot run python3 -m pip (needed to install {binary}): {e}"))?;
        if !status.success() || !path.exists() {
            return Err(format!(
                "installing {wheel} failed; install it with: python3 -m pip install --target {} {wheel}",
                tools.display()
            ));
        }
    }
    Ok(path)
}

/// One kernel's resources as ptxas reports them.
#[derive(Debug, Default, Clone)]
pub struct KernelResources {
    pub name: String,
    pub registers: u32,
    pub shared_bytes: u32,
    pub stack_bytes: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
}

/// Builds `module`'s PTX, assembles it with `ptxas -v`, prints the table, and fails on any ptxas
/// error, and on spills in a Hopper kernel (its consumers must keep Õ and S in registers).
pub fn ptxas_report(arch: Arch, module: Module) -> Result<Vec<KernelResources>> {
    let ptx = build(arch, module)?;
    let arch = build_of(arch, module).target_arch();
    let kernel_list = module.kernels();
    let ptxas = ptxas()?;
    let output = Command::new(&ptxas)
        .arg(format!("-arch={arch}"))
        .arg("-v")
        .arg(&ptx.path)
        .args(["-o", "/dev/null"])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", ptxas.display()))?;
    let log = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() || log.contains("error") {
        return Err(format!("ptxas failed on {}:\n{log}", ptx.path.display()));
    }
    let mut kernels = parse_ptxas(&log);
    // One row per kernel of the list, in the list's order; anything else is an error.
    let position = |name: &str| kernel_list.iter().position(|k| k.to_string() == name);
    if let Some(k) = kernels.iter().find(|k| position(&k.name).is_none()) {
        return Err(format!(
            "ptxas reported `{}`, which the {} module's kernel list does not hold",
            k.name,
            module.name()
        ));
    }
    if kernels.len() != kernel_list.len() || kernels.len() != ptx.kernels.len() {
        return Err(format!(
            "ptxas reported {} kernels, the module has {} and the list {}",
            kernels.len(),
            ptx.kernels.len(),
            kernel_list.len()
        ));
    }
    kernels.sort_by_key(|k| position(&k.name));
    println!("ptxas -arch={arch} -v {}", ptx.path.display());
    println!(
        "{:<34} {:>9} {:>12} {:>11} {:>13}",
        "kernel", "registers", "static smem", "stack frame", "spill (st/ld)"
    );
    for k in &kernels {
        println!(
            "{:<34} {:>9} {:>12} {:>11} {:>13}",
            k.name,
            k.registers,
            k.shared_bytes,
            k.stack_bytes,
            format!("{}/{}", k.spill_stores, k.spill_loads)
        );
    }
    println!(
        "{} kernels assembled, 0 errors (dynamic shared memory is sized at launch)",
        kernels.len()
    );
    let spilling: Vec<&str> = kernels
        .iter()
        .filter(|k| module == Module::Hopper && (k.spill_stores > 0 || k.spill_loads > 0))
        .map(|k| k.name.as_str())
        .collect();
    if !spilling.is_empty() {
        // Reported, not fatal: `xtask sass` shows whether the spill sits in the main loop.
        println!(
            "Hopper kernels with spills (see docs/perf): {}",
            spilling.join(", ")
        );
    }
    Ok(kernels)
}

/// Parses `ptxas -v` output: per entry, its stack/spill line and its register/shared line.
/// ptxas also prints "Function properties" for the device functions an entry calls (core's panic
/// paths, for one) after the entry's own: only the block that names the entry is its own.
fn parse_ptxas(log: &str) -> Vec<KernelResources> {
    let number_before = |line: &str, unit: &str| -> u32 {
        line.split(',')
            .find(|part| part.contains(unit))
            .and_then(|part| part.split_whitespace().find_map(|w| w.parse().ok()))
            .unwrap_or(0)
    };
    let mut kernels: Vec<KernelResources> = Vec::new();
    // The function the last "Function properties for" line named.
    let mut properties_of = String::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            kernels.push(KernelResources {
                name,
                ..Default::default()
            });
        } else if let Some(name) = line.split("Function properties for ").nth(1) {
            properties_of = name.trim().to_string();
        } else if let Some(k) = kernels.last_mut() {
            if line.contains("bytes stack frame") && properties_of == k.name {
                k.stack_bytes = number_before(line, "stack frame");
                k.spill_stores = number_before(line, "spill stores");
                k.spill_loads = number_before(line, "spill loads");
            } else if line.contains("Used") && line.contains("registers") {
                k.registers = number_before(line, "registers");
                k.shared_bytes = number_before(line, "smem");
            }
        }
    }
    kernels
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_a_ptxas_report() {
        let log = "ptxas info    : Compiling entry function 'k1' for 'sm_90'\n\
                   ptxas info    : Function properties for k1\n    \
                   8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
                   ptxas info    : Used 40 registers, used 1 barriers, 2176 bytes smem, 384 bytes cmem[0]\n\
                   ptxas info    : Function properties for _RNvNtCs_4core9panicking9panic_fmt\n    \
                   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n";
        let k = &super::parse_ptxas(log)[0];
        assert_eq!(
            (k.name.as_str(), k.registers, k.shared_bytes),
            ("k1", 40, 2176)
        );
        assert_eq!((k.stack_bytes, k.spill_stores, k.spill_loads), (8, 4, 12));
    }
}
