//! `cargo xtask bundle`: everything a GPU machine without a Rust toolchain needs, in one folder.
//!
//! `bundle/bin/` holds the release CLI, the test binaries and the benchmark binary (the PTX is
//! embedded in each); `bundle/run.sh` runs them all with `FLASH_ATTN_REQUIRE_GPU=1`, so a missing
//! GPU fails instead of skipping, and ends with "N passed, N failed".

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Result, cargo, root};

/// What travels to the GPU machine must stay under its 64 MiB limit.
const MAX_BUNDLE_BYTES: u64 = 64 * 1024 * 1024;

const RUN_SCRIPT: &str = r#"#!/usr/bin/env bash
# Runs every bundled binary on a machine with an NVIDIA GPU and reports pass/fail.
# Usage: bundle/run.sh [--quick]   (--quick: skip the benchmarks)
set -u
cd "$(dirname "$0")"
export FLASH_ATTN_REQUIRE_GPU=1
passed=0; failed=0; failures=()
step() {
  local name=$1; shift
  echo "=== $name: $* ==="
  if "$@"; then passed=$((passed + 1)); echo "=== $name: pass ==="
  else failed=$((failed + 1)); failures+=("$name"); echo "=== $name: FAIL ==="; fi
}
step info bin/flash-attn info
step check bin/flash-attn check --require-gpu
for t in bin/test-*; do step "$(basename "$t")" "$t" --test-threads=1; done
if [ "${1:-}" != "--quick" ]; then
  for b in bin/bench-*; do step "$(basename "$b")" "$b" --bench --quick; done
fi
[ ${#failures[@]} -eq 0 ] || echo "failed: ${failures[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
"#;

pub fn run(out: &Path) -> Result {
    let out = if out.is_absolute() {
        out.to_path_buf()
    } else {
        root().join(out)
    };
    let bin = out.join("bin");
    if out.exists() {
        std::fs::remove_dir_all(&out)
            .map_err(|e| format!("cannot clear {}: {e}", out.display()))?;
    }
    std::fs::create_dir_all(&bin).map_err(|e| format!("cannot create {}: {e}", bin.display()))?;

    let mut copies: Vec<(PathBuf, String)> =
        compiled(&["build", "--release", "-p", "flash-attn", "--bins"], "bin")?;
    for (path, name) in compiled(
        &["test", "--release", "-p", "flash-attn", "--no-run"],
        "test",
    )? {
        copies.push((path, format!("test-{name}")));
    }
    for (path, name) in compiled(&["bench", "-p", "flash-attn", "--no-run"], "bench")? {
        copies.push((path, format!("bench-{name}")));
    }
    let mut total = 0;
    for (path, name) in &copies {
        let dest = bin.join(name);
        total += std::fs::copy(path, &dest)
            .map_err(|e| format!("cannot copy {} to {}: {e}", path.display(), dest.display()))?;
    }
    let script = out.join("run.sh");
    std::fs::write(&script, RUN_SCRIPT)
        .map_err(|e| format!("cannot write {}: {e}", script.display()))?;
    make_executable(&script)?;
    for (_, name) in &copies {
        println!("  bin/{name}");
    }
    println!(
        "bundle: {} binaries, {:.1} MiB, in {} (run: {}/run.sh)",
        copies.len(),
        total as f64 / 1048576.0,
        out.display(),
        out.display()
    );
    if total > MAX_BUNDLE_BYTES {
        return Err(format!(
            "the bundle is {total} bytes, over the {MAX_BUNDLE_BYTES}-byte limit of the GPU machine's transfer"
        ));
    }
    Ok(())
}

/// Runs a cargo command with JSON messages and returns each executable it built for a target of
/// `kind` (bin, test or bench), with the target's name.
fn compiled(args: &[&str], kind: &str) -> Result<Vec<(PathBuf, String)>> {
    let output = Command::new(cargo())
        .current_dir(root())
        .args(args)
        .args(["--message-format", "json-render-diagnostics"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo {args:?}: {e}"))?;
    if !output.status.success() {
        return Err(format!("cargo {args:?} failed"));
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Some(exe) = field(line, "\"executable\":\"") else {
            continue;
        };
        let Some(name) = field(line, "\"name\":\"") else {
            continue;
        };
        if !line.contains(&format!("\"kind\":[\"{kind}\"]")) {
            continue;
        }
        found.push((PathBuf::from(exe), name.to_string()));
    }
    Ok(found)
}

/// The string value following `key` in a JSON line (cargo's messages need no full parser here).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = line.find(key)? + key.len();
    line[start..].split('"').next()
}

#[cfg(unix)]
fn make_executable(path: &Path) -> Result {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("cannot chmod {}: {e}", path.display()))
}

#[cfg(not(unix))]
fn make_executable(_: &Path) -> Result {
    Ok(())
}
