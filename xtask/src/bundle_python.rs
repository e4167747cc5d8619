//! The Python bridge's part of `cargo xtask bundle`: the `flash_attn_rs` wheel (abi3, built with
//! maturin), its tests and examples under `bundle/python/`, and `run-python-tests.sh`, which
//! installs the wheel with pip from the file alone (the GPU machine has no network; PyTorch and
//! transformers are there already) and runs the GPU test suite and the example.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bundle_files::{BundleFile, install_wheel_function, step_function, use_cubins_function};
use crate::{Result, root, run_command};

pub(crate) const PYTHON_TESTS_SCRIPT: &str = concat!(
    r#"#!/usr/bin/env bash
# On the GPU machine: installs the flash_attn_rs wheel into this machine's python3 (no network:
# pip takes the file alone; torch and transformers must be installed already), runs the Python
# test suite with FLASH_ATTN_REQUIRE_GPU=1 (a missing GPU fails instead of skipping), then the
# example (a small Llama trained with our attention beside SDPA's backends).
# Usage: bundle/run-python-tests.sh [results-dir]
#   EXAMPLE=0 skips the example; EXAMPLE_ARGS (default --quick) are the example's options;
#   PYTEST_ARGS are added to pytest's (e.g. "-k contract" or "-x").
set -u
cd "$(dirname "$0")"
out=$(mkdir -p "${1:-python-results}" && cd "${1:-python-results}" && pwd)
export FLASH_ATTN_REQUIRE_GPU=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
"#,
    step_function!(),
    use_cubins_function!(),
    install_wheel_function!(),
    r#"step install install_wheel
step import python3 -c 'import sys, torch, transformers, flash_attn_rs
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}, flash_attn_rs from {flash_attn_rs.__file__}")
print(f"CUDA: {torch.cuda.is_available()}, {torch.cuda.get_device_name() if torch.cuda.is_available() else None}")'
rm -f "$out/numerics.tsv"
# shellcheck disable=SC2086
step pytest env FLASH_ATTN_PY_RESULTS="$out/numerics.tsv" \
  python3 -m pytest -q -rfEs -p no:cacheprovider --junitxml "$out/pytest.xml" python/tests ${PYTEST_ARGS:-}
if [ -s "$out/numerics.tsv" ]; then
  echo "--- the 12 checks closest to their bound (test, tensor, error, bound, error/bound, plan) ---"
  sort -t "$(printf '\t')" -k5,5 -g -r "$out/numerics.tsv" | head -12 | cut -c1-220
  echo "--- $(wc -l < "$out/numerics.tsv") tensors checked; tables in $out/numerics.tsv ---"
fi
if [ "${EXAMPLE:-1}" != 0 ]; then
  # shellcheck disable=SC2086
  step example python3 python/examples/01_train_tiny_llama.py ${EXAMPLE_ARGS:---quick} --out "$out/example.md"
fi
[ ${#failures[@]} -eq 0 ] || echo "failed: ${failures[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
"#
);

/// Builds the wheel (into `target/bundle-wheels/`) and lists the bundle's Python files: the wheel
/// in `python/wheels/`, the tests and examples beside it, and `run-python-tests.sh`.
pub fn files() -> Result<Vec<BundleFile>> {
    let built = root().join("target").join("bundle-wheels");
    if built.exists() {
        std::fs::remove_dir_all(&built)
            .map_err(|e| format!("cannot clear {}: {e}", built.display()))?;
    }
    let maturin = maturin()?;
    run_command(
        Command::new(&maturin)
            .current_dir(root())
            .args([
                "build",
                "--release",
                "-m",
                "python/Cargo.toml",
                "--target-dir",
                "target",
            ])
            .arg("--out")
            .arg(&built),
    )?;
    let mut files = Vec::new();
    for entry in read_dir(&built)? {
        let wheel = Path::new("python/wheels").join(entry.file_name());
        files.push(BundleFile::copy(wheel, entry.path()));
    }
    for folder in ["tests", "examples"] {
        for entry in read_dir(&root().join("python").join(folder))? {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "py") {
                let dest = Path::new("python").join(folder).join(entry.file_name());
                files.push(BundleFile::copy(dest, path));
            }
        }
    }
    files.push(BundleFile::script(
        "run-python-tests.sh",
        PYTHON_TESTS_SCRIPT,
    ));
    Ok(files)
}

fn read_dir(dir: &Path) -> Result<Vec<std::fs::DirEntry>> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut entries: Vec<_> = entries.filter_map(std::result::Result::ok).collect();
    entries.sort_by_key(std::fs::DirEntry::file_name);
    Ok(entries)
}

/// maturin: `$MATURIN`, else on the PATH, else the one CI installs into `.venv-py` (installed
/// there from the Python package registry when missing, as CI does).
fn maturin() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("MATURIN") {
        return Ok(path.into());
    }
    let runs = |program: &Path| {
        Command::new(program)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if runs(Path::new("maturin")) {
        return Ok("maturin".into());
    }
    let venv = root().join(".venv-py");
    let local = venv.join("bin").join("maturin");
    if !runs(&local) {
        println!("maturin not found: installing it into {}", venv.display());
        run_command(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
        run_command(
            Command::new(venv.join("bin").join("pip")).args(["install", "--quiet", "maturin"]),
        )?;
    }
    Ok(local)
}
