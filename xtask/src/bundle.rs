//! `cargo xtask bundle`: everything a GPU machine without a Rust toolchain needs, in one folder.
//!
//! `bundle/bin/` holds the release CLI, the test binaries that need a GPU and the benchmark
//! binary (the PTX is embedded in each). Scripts:
//! - `run.sh`: every binary with `FLASH_ATTN_REQUIRE_GPU=1` (a missing GPU fails instead of
//!   skipping); ends with "N passed, N failed";
//! - `run-bench.sh`: PyTorch's SDPA backends and ours, one merged table (the sweep, the backward
//!   and its memory table, then decode), and ncu's HBM traffic;
//! - `run-sanitizer.sh`: compute-sanitizer's four tools over every kernel at odd shapes;
//! - `run-python-tests.sh` (`bundle_python`): the `flash_attn_rs` wheel in `python/wheels/`,
//!   installed without network, its GPU test suite and the training example.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Result, cargo, root};

/// Whether test binary `name` has work for a GPU: the `gpu_*` suites and the safetensors CLI
/// tests (which run the CLI on the GPU). The CPU-only suites (the references, emulators,
/// plans, the kernel lists) stay behind: the CI runs them, and each binary carries the embedded
/// PTX (about 5 MiB) into the GPU machine's 64 MiB transfer.
fn needs_a_gpu(name: &str) -> bool {
    name.starts_with("gpu_") || name == "safetensors_io"
}

/// What travels to the GPU machine must stay under its 64 MiB limit.
const MAX_BUNDLE_BYTES: u64 = 64 * 1024 * 1024;

const BENCH_SCRIPT: &str = r#"#!/usr/bin/env bash
# On the GPU machine: PyTorch's SDPA backends and ours on the same shapes, merged into one table,
# then the HBM traffic of each algorithm measured with ncu beside the articles' predictions.
# Usage: bundle/run-bench.sh [--quick] [results-dir]
set -euo pipefail
cd "$(dirname "$0")"
quick=""
if [ "${1:-}" = "--quick" ]; then quick="--quick"; shift; fi
out=${1:-results}
mkdir -p "$out"
python3 scripts/torch_sdpa_bench.py $quick --out "$out/torch.json"
bin/flash-attn bench $quick --torch "$out/torch.json" --out-dir "$out"
# The backward (issue #15): PyTorch's flash and cuDNN backward, then ours (fa2-tc, fa2,
# deterministic), backward alone and forward + backward, one table each; then the memory table
# (batch 1, d = 128, N = 1k-128k: peak memory and where each runs out).
python3 scripts/torch_backward_bench.py $quick --out "$out/torch-backward.json"
bin/flash-attn bench --backward $quick --torch "$out/torch-backward.json" --out-dir "$out"
bin/flash-attn bench --backward --memory --out-dir "$out"
# Decode (split-KV) at ANCHORS.md's shapes: PyTorch's backends, then ours, one table.
python3 scripts/torch_decode_bench.py $quick --out "$out/torch-decode.json"
bin/flash-attn bench --decode $quick --torch "$out/torch-decode.json" --out-dir "$out"
if command -v ncu >/dev/null; then
  ncu --csv --print-units base --clock-control none \
    --metrics dram__bytes_read.sum,dram__bytes_write.sum bin/flash-attn io > "$out/ncu.csv"
  bin/flash-attn io --ncu "$out/ncu.csv" | tee "$out/io.md"
else
  echo "ncu not found: HBM traffic not measured"
fi
"#;

const SANITIZER_SCRIPT: &str = r#"#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over every forward kernel at odd
# shapes: seqlen 1, 17, 1000; head dims 8, 40, 64, 96, 128, 256; causal off and on; every dtype and
# algorithm; then memcheck and synccheck over the backward's and decode's GPU tests.
# Usage: bundle/run-sanitizer.sh [log-dir]
# racecheck is the slow tool: it instruments every shared-memory access. On the H200, FA1's 90
# cases took about 400 s (one process per dtype); all 432 cases take longer than one 10-minute
# device command. Split a run with SANITIZER_TOOLS (e.g. racecheck) and SANITIZER_CHECK_ARGS
# (passed to `flash-attn check`, e.g. "--dtypes f16 --algorithms fa1"), with separate log dirs.
# Processes on one GPU share it by time-slicing, so parallel processes mostly overlap the
# CPU-side work (the f64 reference), not the kernels.
set -u
cd "$(dirname "$0")"
logs=${1:-sanitizer-logs}
mkdir -p "$logs"
passed=0; failed=0
# SANITIZER_TOOLS picks a subset (e.g. to run the tools as parallel processes).
for tool in ${SANITIZER_TOOLS:-memcheck racecheck synccheck initcheck}; do
  # SANITIZER_TIMEOUT (seconds per tool) bounds a slow tool; unset or 0: no bound.
  if timeout "${SANITIZER_TIMEOUT:-0}" compute-sanitizer --tool "$tool" --error-exitcode 99 \
      --print-limit 20 bin/flash-attn check --require-gpu --shapes sanitizer ${SANITIZER_CHECK_ARGS:-} \
      > "$logs/$tool.log" 2>&1; then
    passed=$((passed + 1)); echo "$tool: pass ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$logs/$tool.log" | tail -1))"
  else
    failed=$((failed + 1)); echo "$tool: FAIL"; tail -30 "$logs/$tool.log"
  fi
done
# The backward and decode kernels, which `check` does not run: their GPU tests under memcheck and
# synccheck (SANITIZER_TESTS=0 skips them; the tests' f64 references make these runs CPU-bound).
if [ "${SANITIZER_TESTS:-1}" != 0 ]; then
  for test in gpu_backward gpu_decode; do
    for tool in memcheck synccheck; do
      if FLASH_ATTN_REQUIRE_GPU=1 timeout "${SANITIZER_TIMEOUT:-0}" compute-sanitizer --tool "$tool" \
          --error-exitcode 99 --print-limit 20 "bin/test-$test" --test-threads=1 \
          > "$logs/$test-$tool.log" 2>&1; then
        passed=$((passed + 1)); echo "$test $tool: pass ($(grep -E 'ERROR SUMMARY' "$logs/$test-$tool.log" | tail -1))"
      else
        failed=$((failed + 1)); echo "$test $tool: FAIL"; tail -30 "$logs/$test-$tool.log"
      fi
    done
  done
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
"#;

/// The scripts' `step NAME COMMAND…`: runs one step, counts it passed or failed, never stops.
macro_rules! step_function {
    () => {
        r#"passed=0; failed=0; failures=()
step() {
  local name=$1; shift
  echo "=== $name: $* ==="
  if "$@"; then passed=$((passed + 1)); echo "=== $name: pass ==="
  else failed=$((failed + 1)); failures+=("$name"); echo "=== $name: FAIL ==="; fi
}
"#
    };
}
pub(crate) use step_function;

const RUN_SCRIPT: &str = concat!(
    r#"#!/usr/bin/env bash
# Runs every bundled binary on a machine with an NVIDIA GPU and reports pass/fail.
# Usage: bundle/run.sh [--quick]   (--quick: skip the benchmarks)
set -u
cd "$(dirname "$0")"
export FLASH_ATTN_REQUIRE_GPU=1
"#,
    step_function!(),
    r#"step info bin/flash-attn info
step check bin/flash-attn check --require-gpu --backward
step check-decode bin/flash-attn check --require-gpu --decode
step check-packed bin/flash-attn check --require-gpu --packed
for t in bin/test-*; do step "$(basename "$t")" "$t" --test-threads=1 --show-output; done
if [ "${1:-}" != "--quick" ]; then
  for b in bin/bench-*; do step "$(basename "$b")" "$b" --bench --quick; done
fi
[ ${#failures[@]} -eq 0 ] || echo "failed: ${failures[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
"#
);

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
        if needs_a_gpu(&name) {
            copies.push((path, format!("test-{name}")));
        }
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
    for (name, text) in [
        ("run.sh", RUN_SCRIPT),
        ("run-bench.sh", BENCH_SCRIPT),
        ("run-sanitizer.sh", SANITIZER_SCRIPT),
    ] {
        let script = out.join(name);
        std::fs::write(&script, text)
            .map_err(|e| format!("cannot write {}: {e}", script.display()))?;
        make_executable(&script)?;
    }
    let scripts = out.join("scripts");
    std::fs::create_dir_all(&scripts)
        .map_err(|e| format!("cannot create {}: {e}", scripts.display()))?;
    for name in [
        "torch_sdpa_bench.py",
        "torch_backward_bench.py",
        "torch_decode_bench.py",
    ] {
        let torch_script = root().join("scripts").join(name);
        std::fs::copy(&torch_script, scripts.join(name))
            .map_err(|e| format!("cannot copy {}: {e}", torch_script.display()))?;
    }
    for (_, name) in &copies {
        println!("  bin/{name}");
    }
    total += crate::bundle_python::bundle(&out)?;
    println!(
        "bundle: {} binaries and the Python wheel, {:.1} MiB, in {} (run: {}/run.sh, {}/run-python-tests.sh)",
        copies.len(),
        total as f64 / 1048576.0,
        out.display(),
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
pub(crate) fn make_executable(path: &Path) -> Result {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("cannot chmod {}: {e}", path.display()))
}

#[cfg(not(unix))]
pub(crate) fn make_executable(_: &Path) -> Result {
    Ok(())
}
