//! The kernel modules: the PTX of each embedded at build time (or a PTX or cubin file named by
//! `FLASH_ATTN_PTX` / `FLASH_ATTN_HOPPER_PTX`), the architecture it targets and which devices can
//! run it, and the entry points it holds.

use std::sync::OnceLock;

pub use flash_kernels::registry::Module;

use crate::error::{Error, Result};

/// The main module (every family but FA3), built and deflated by `host/build.rs`.
static MAIN_DEFLATED: &[u8] = include_bytes!(env!("FLASH_ATTN_PTX_DEFLATED"));
/// The Hopper module (FA3, sm_90a).
static HOPPER_DEFLATED: &[u8] = include_bytes!(env!("FLASH_ATTN_HOPPER_PTX_DEFLATED"));

/// An embedded module's PTX (inflated on first use).
pub fn ptx(module: Module) -> &'static str {
    static MAIN: OnceLock<String> = OnceLock::new();
    static HOPPER: OnceLock<String> = OnceLock::new();
    let (cell, deflated) = match module {
        Module::Main => (&MAIN, MAIN_DEFLATED),
        Module::Hopper => (&HOPPER, HOPPER_DEFLATED),
    };
    cell.get_or_init(|| {
        let bytes = miniz_oxide::inflate::decompress_to_vec(deflated)
            .expect("host/build.rs deflated the PTX");
        String::from_utf8(bytes).expect("PTX is ASCII text")
    })
}

/// Environment variable naming a PTX or cubin file to load instead of the embedded main module:
/// for A/B experiments on kernel variants with one host binary, or a cubin assembled ahead of
/// time so the driver has nothing to compile. The file must define the same kernels (same names
/// and parameters) for the same architecture.
pub const PTX_OVERRIDE_VAR: &str = "FLASH_ATTN_PTX";
/// As [`PTX_OVERRIDE_VAR`], for the Hopper module.
pub const HOPPER_PTX_OVERRIDE_VAR: &str = "FLASH_ATTN_HOPPER_PTX";
/// The architecture the embedded main module targets.
pub const PTX_ARCH: &str = env!("FLASH_ATTN_PTX_ARCH");
/// The architecture of the Hopper module.
pub const HOPPER_PTX_ARCH: &str = "sm_90a";

/// The override variable of `module`.
pub fn override_var(module: Module) -> &'static str {
    match module {
        Module::Main => PTX_OVERRIDE_VAR,
        Module::Hopper => HOPPER_PTX_OVERRIDE_VAR,
    }
}

/// The architecture `module` targets.
pub fn arch(module: Module) -> &'static str {
    match module {
        Module::Main => PTX_ARCH,
        Module::Hopper => HOPPER_PTX_ARCH,
    }
}

/// Names of an embedded module's kernels, from the PTX's `.entry` directives (the CPU test
/// checks them against the module's kernel list).
pub fn entry_names(module: Module) -> Vec<&'static str> {
    ptx(module)
        .lines()
        .filter_map(|l| l.trim().strip_prefix(".visible .entry "))
        .map(|l| l.split('(').next().unwrap_or(l).trim())
        .collect()
}

/// What a module is loaded from: PTX text, which the driver compiles for the device on load (for
/// a whole module, minutes on first use; the driver caches the result), or a cubin that ptxas
/// already compiled for the device's architecture, which loads at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleSource {
    Ptx(String),
    Cubin(Vec<u8>),
}

impl ModuleSource {
    /// The form `cudarc` loads (`cuModuleLoadData` takes either).
    pub fn into_loadable(self) -> cudarc::nvrtc::Ptx {
        match self {
            Self::Ptx(text) => cudarc::nvrtc::Ptx::from_src(text),
            Self::Cubin(bytes) => cudarc::nvrtc::Ptx::from_binary(bytes),
        }
    }
}

/// The start of every ELF file, and so of every cubin.
const ELF_MAGIC: &[u8] = b"\x7fELF";

/// What to load for `module`: the embedded PTX, or the file `override_path` names (the value of
/// its [`override_var`]): a cubin (an ELF file, e.g. `ptxas -arch=sm_90a -o hopper.cubin`, which
/// skips the driver's compile) or PTX text.
pub fn module_source(
    module: Module,
    override_path: Option<std::ffi::OsString>,
) -> Result<ModuleSource> {
    // An empty value means unset, so scripts can pass `VAR=` to use the embedded module.
    let Some(path) = override_path.filter(|path| !path.is_empty()) else {
        return Ok(ModuleSource::Ptx(ptx(module).to_string()));
    };
    let unreadable = |detail: String| {
        Error::invalid(
            override_var(module),
            path.to_string_lossy(),
            format!("a readable PTX or cubin file, or unset to use the embedded module ({detail})"),
        )
    };
    let bytes = std::fs::read(&path).map_err(|e| unreadable(e.to_string()))?;
    if bytes.starts_with(ELF_MAGIC) {
        return Ok(ModuleSource::Cubin(bytes));
    }
    String::from_utf8(bytes)
        .map(ModuleSource::Ptx)
        .map_err(|_| unreadable("neither an ELF cubin nor UTF-8 PTX text".into()))
}

/// Whether a device of `capability` runs `arch`'s PTX (see [`check_capability`]).
pub fn runs(capability: (i32, i32), arch: &str) -> bool {
    let (required, newer_run_it) = required_capability(arch);
    capability == required || (newer_run_it && capability > required)
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
    if runs(capability, arch) {
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
