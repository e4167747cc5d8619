//! The kernel module: the PTX embedded at build time (or a file named by `FLASH_ATTN_PTX`), the
//! architecture it targets and which devices can run it, and the entry points it holds.

use std::sync::OnceLock;

use crate::error::{Error, Result};

/// The PTX module with every kernel, built and deflated by `host/build.rs`.
static PTX_DEFLATED: &[u8] = include_bytes!(env!("FLASH_ATTN_PTX_DEFLATED"));

/// The embedded PTX module with every kernel (inflated on first use).
pub fn ptx() -> &'static str {
    static PTX: OnceLock<String> = OnceLock::new();
    PTX.get_or_init(|| {
        let bytes = miniz_oxide::inflate::decompress_to_vec(PTX_DEFLATED)
            .expect("host/build.rs deflated the PTX");
        String::from_utf8(bytes).expect("PTX is ASCII text")
    })
}

/// Environment variable naming a PTX file to load instead of the embedded module: for A/B
/// experiments on kernel variants with one host binary. The file must define the same kernels
/// (same names and parameters) for the same architecture.
pub const PTX_OVERRIDE_VAR: &str = "FLASH_ATTN_PTX";
/// The architecture the embedded PTX targets.
pub const PTX_ARCH: &str = env!("FLASH_ATTN_PTX_ARCH");

/// Names of the embedded module's kernels, from the PTX's `.entry` directives (the CPU test
/// checks them against `flash_kernels::registry::KERNELS`).
pub fn entry_names() -> Vec<&'static str> {
    ptx()
        .lines()
        .filter_map(|l| l.trim().strip_prefix(".visible .entry "))
        .map(|l| l.split('(').next().unwrap_or(l).trim())
        .collect()
}

/// The PTX to load: the embedded module, or the file `override_path` names (the value of
/// [`PTX_OVERRIDE_VAR`]).
pub fn module_source(override_path: Option<std::ffi::OsString>) -> Result<String> {
    match override_path {
        None => Ok(ptx().to_string()),
        Some(path) => std::fs::read_to_string(&path).map_err(|e| {
            Error::invalid(
                PTX_OVERRIDE_VAR,
                path.to_string_lossy(),
                format!("a readable PTX file, or unset to use the embedded module ({e})"),
            )
        }),
    }
}

/// The compute capability `arch`'s PTX needs, and whether newer ones run it: sm_80 and sm_90 PTX
/// runs on that capability and every later one (the driver compiles it for the device), while
/// sm_90a's architecture-specific instructions (wgmma, setmaxnreg) exist on 9.0 alone.
fn required_capability(arch: &str) -> ((i32, i32), bool) {
    match arch {
        "sm_80" => ((8, 0), true),
        "sm_90a" => ((9, 0), false),
        _ => ((9, 0), true),
    }
}

/// A typed error when a device of `capability` cannot run PTX built for `arch`.
pub fn check_capability(
    ordinal: usize,
    name: &str,
    capability: (i32, i32),
    arch: &'static str,
) -> Result<()> {
    let ((required_major, required_minor), newer_run_it) = required_capability(arch);
    let required = (required_major, required_minor);
    if capability == required || (newer_run_it && capability > required) {
        return Ok(());
    }
    let requirement = if newer_run_it {
        format!("needs {required_major}.{required_minor} or newer")
    } else {
        format!(
            "uses architecture-specific instructions that run only on {required_major}.{required_minor} \
             (build with FLASH_ATTN_PTX_ARCH=sm_90 for other devices)"
        )
    };
    Err(Error::UnsupportedDevice {
        ordinal,
        name: name.to_string(),
        major: capability.0,
        minor: capability.1,
        arch,
        requirement,
    })
}
