//! Builds the kernels crate into its two PTX modules (see `ptx-build`): the main one and the
//! Hopper one (FA3, sm_90a); deflates each (PTX text shrinks about 7×, and every binary of the
//! workspace embeds them) and hands the paths to the library, which embeds them with
//! `include_bytes!`. A plain `cargo build` or `cargo test` needs nothing else.
//!
//! `FLASH_ATTN_PTX_ARCH` (sm_80, sm_90 or sm_90a; default sm_90) picks the main module's target.

use std::path::PathBuf;

fn main() {
    let manifest_dir = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let kernels_dir = manifest_dir.join("../kernels");
    for path in ["src", "Cargo.toml"] {
        println!(
            "cargo:rerun-if-changed={}",
            kernels_dir.join(path).display()
        );
    }
    println!("cargo:rerun-if-env-changed=FLASH_ATTN_PTX_ARCH");
    // An experiment's build-time setting of the kernels (`fwd::fa3::config::exp2_split`).
    println!("cargo:rerun-if-env-changed=FLASH_ATTN_FA3_EXP2_POLYNOMIAL_EVERY");
    let arch = match std::env::var("FLASH_ATTN_PTX_ARCH") {
        Ok(name) => name.parse().unwrap_or_else(|e: String| fail(&e)),
        Err(_) => ptx_build::Arch::Sm90,
    };
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let modules = [
        (ptx_build::Module::Main, "FLASH_ATTN_PTX_DEFLATED"),
        (ptx_build::Module::Hopper, "FLASH_ATTN_HOPPER_PTX_DEFLATED"),
    ];
    for (module, variable) in modules {
        let build = ptx_build::PtxBuild {
            kernels_dir: kernels_dir.clone(),
            target_dir: out_dir.join("kernels-target"),
            cargo: std::env::var_os("CARGO")
                .map(PathBuf::from)
                .unwrap_or_else(|| "cargo".into()),
            arch,
            module,
        };
        let ptx = build.run().unwrap_or_else(|e| fail(&e.to_string()));
        let text = std::fs::read(&ptx.path)
            .unwrap_or_else(|e| fail(&format!("reading {}: {e}", ptx.path.display())));
        let deflated_path = ptx.path.with_extension("ptx.deflate");
        let deflated = miniz_oxide::deflate::compress_to_vec(&text, 9);
        std::fs::write(&deflated_path, deflated)
            .unwrap_or_else(|e| fail(&format!("writing {}: {e}", deflated_path.display())));
        println!("cargo:rustc-env={variable}={}", deflated_path.display());
    }
    println!("cargo:rustc-env=FLASH_ATTN_PTX_ARCH={arch}");
}

fn fail(message: &str) -> ! {
    // Cargo prints a build script's stderr when it fails; keep rustc's own messages readable.
    eprintln!("{message}");
    std::process::exit(1);
}
