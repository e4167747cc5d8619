//! The bundle's cubins: the two PTX modules the release build embedded, assembled ahead of time
//! by ptxas for the GPU machines' Hopper (sm_90 for the main module, sm_90a for the Hopper one)
//! and compressed with xz (LZMA: its window spans the module, whose many kernel variants repeat
//! one another, so a 21 MB cubin packs to 0.8 MB, where gzip's 32 KB window leaves 5 MB). The run
//! scripts unpack them and name them in `FLASH_ATTN_PTX` /
//! `FLASH_ATTN_HOPPER_PTX` (`host/src/device/module.rs` loads a cubin as it is), so no process
//! there spends minutes in the driver's JIT: each module is about 50 MB of PTX, about 225 s per
//! process on an H100 host wherever the driver's cache is cold.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bundle_files::BundleFile;
use crate::{Result, root};

/// The cubins' folder in the bundle (the scripts' `use_cubins` reads it).
pub const DIR: &str = "cubin";

/// The release build's embedded PTX modules: `kernels-target/*.ptx` in the out dirs of the host
/// crate's build script, as cargo's `build-script-executed` messages name them.
pub fn embedded_ptx(cargo_messages: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = cargo_messages
        .lines()
        .filter(|line| line.contains(r#""reason":"build-script-executed""#))
        .filter(|line| line.contains("#flash-attn@"))
        .filter_map(|line| crate::bundle::field(line, r#""out_dir":""#))
        .flat_map(|out_dir| {
            std::fs::read_dir(Path::new(out_dir).join("kernels-target"))
                .into_iter()
                .flatten()
                .filter_map(std::result::Result::ok)
                .map(|entry| entry.path())
                .filter(|path| path.extension().is_some_and(|e| e == "ptx"))
        })
        .collect();
    found.sort();
    found.dedup();
    found
}

/// The architecture a module's cubin is assembled for: the Hopper module's own (sm_90a), and
/// Hopper's for the main one (its PTX targets sm_90 or sm_80; ptxas assembles either for sm_90).
fn cubin_arch(ptx: &str) -> &'static str {
    let target = ptx.lines().find_map(|l| l.trim().strip_prefix(".target "));
    if target.is_some_and(|t| t.trim() == "sm_90a") {
        "sm_90a"
    } else {
        "sm_90"
    }
}

/// Assembles and compresses each module into `target/bundle-cubins/` (again only when its PTX is
/// newer than the last cubin), the modules at once, and lists them as `cubin/main.cubin.xz` and
/// `cubin/hopper.cubin.xz`. Where two builds embedded a module (the binaries' and the test's),
/// the newest PTX is taken.
pub fn files(modules: &[PathBuf]) -> Result<Vec<BundleFile>> {
    let mut modules = modules.to_vec();
    modules
        .sort_by_key(|p| std::cmp::Reverse(std::fs::metadata(p).and_then(|m| m.modified()).ok()));
    let ptxas = crate::ptx::ptxas()?;
    let out = root().join("target/bundle-cubins");
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let mut names = Vec::new();
    let mut jobs = Vec::new();
    for ptx in &modules {
        let text = std::fs::read_to_string(ptx)
            .map_err(|e| format!("cannot read {}: {e}", ptx.display()))?;
        let arch = cubin_arch(&text);
        let name = if arch == "sm_90a" { "hopper" } else { "main" };
        if names.contains(&name) {
            continue;
        }
        names.push(name);
        let xz = out.join(format!("{name}.cubin.xz"));
        if newer(&xz, ptx) {
            continue;
        }
        eprintln!("assembling {} for {arch} (ptxas: minutes)", ptx.display());
        let cubin = out.join(format!("{name}.cubin"));
        let child = Command::new(&ptxas)
            .arg(format!("-arch={arch}"))
            .arg(ptx)
            .arg("-o")
            .arg(&cubin)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", ptxas.display()))?;
        jobs.push((child, cubin));
    }
    if names != ["main", "hopper"] && names != ["hopper", "main"] {
        return Err(format!(
            "expected the main and the Hopper PTX module in the release build, found {modules:?}"
        ));
    }
    for (mut child, cubin) in jobs {
        let status = child.wait().map_err(|e| format!("ptxas: {e}"))?;
        if !status.success() {
            return Err(format!("ptxas failed writing {}", cubin.display()));
        }
        compress(&cubin)?;
    }
    Ok(names
        .iter()
        .map(|name| {
            let file = format!("{name}.cubin.xz");
            BundleFile::copy(Path::new(DIR).join(&file), out.join(&file))
        })
        .collect())
}

/// Replaces `path` by `path.xz`, with Python's lzma (python3 is already needed for the tools'
/// wheels; an `xz` binary is not on every machine), at the strongest preset.
fn compress(path: &Path) -> Result {
    const SCRIPT: &str = "import lzma, os, sys\n\
        data = open(sys.argv[1], 'rb').read()\n\
        open(sys.argv[1] + '.xz', 'wb').write(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))\n\
        os.remove(sys.argv[1])\n";
    let status = Command::new("python3")
        .args(["-c", SCRIPT])
        .arg(path)
        .status()
        .map_err(|e| format!("cannot run python3 to compress {}: {e}", path.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("compressing {} failed", path.display()))
    }
}

/// Whether `path` exists and was written after `than`.
fn newer(path: &Path, than: &Path) -> bool {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    matches!((modified(path), modified(than)), (Some(a), Some(b)) if a > b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hopper_module_assembles_for_sm_90a_and_the_main_one_for_sm_90() {
        assert_eq!(cubin_arch(".version 8.0\n.target sm_90a\n"), "sm_90a");
        assert_eq!(cubin_arch(".version 8.0\n.target sm_90\n"), "sm_90");
        assert_eq!(cubin_arch(".version 8.0\n.target sm_80\n"), "sm_90");
    }

    #[test]
    fn the_embedded_ptx_is_found_through_the_build_scripts_out_dir() {
        let dir = std::env::temp_dir().join(format!("xtask-cubin-{}", std::process::id()));
        let kernels = dir.join("kernels-target");
        std::fs::create_dir_all(&kernels).unwrap();
        for name in [
            "flash_attn_sm_90.ptx",
            "flash_attn_hopper_sm_90a.ptx",
            "x.ptx.deflate",
        ] {
            std::fs::write(kernels.join(name), "").unwrap();
        }
        let messages = format!(
            "{{\"reason\":\"build-script-executed\",\"package_id\":\"path+file:///w/host#flash-attn@0.1.0\",\"out_dir\":\"{}\"}}\n\
             {{\"reason\":\"build-script-executed\",\"package_id\":\"registry#libm@0.2\",\"out_dir\":\"/nowhere\"}}\n",
            dir.display()
        );
        assert_eq!(
            embedded_ptx(&messages),
            vec![
                kernels.join("flash_attn_hopper_sm_90a.ptx"),
                kernels.join("flash_attn_sm_90.ptx")
            ]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
