//! `cargo xtask bundle`: everything a GPU machine without a Rust toolchain needs, in one folder.
//!
//! `bundle/bin/` holds the release CLI and the GPU test binary (`test-gpu`: every suite with GPU
//! work), and with `--criterion` the criterion benchmark binary (the PTX is embedded in each, so
//! three binaries and the wheel pass the transfer limit once the Hopper module has the d = 256
//! backward; no script runs the benchmark binary); `bundle/cubin/` both PTX modules assembled by
//! ptxas for compute capability 9.0 (`bundle_cubin`), which every run script loads there instead
//! of the PTX (`use_cubins`: no JIT of minutes per process); `bundle/scripts/` the Python
//! benchmark scripts (`lab/scripts/`). Every file is listed first, and the bundle written only if it fits
//! the GPU machine's transfer (`bundle_files`). Scripts:
//! - `run.sh`: the CLI's checks and each GPU test suite with `FLASH_ATTN_REQUIRE_GPU=1` (a missing
//!   GPU fails instead of skipping); ends with "N passed, N failed";
//! - `run-bench.sh`: the comparisons with PyTorch first (`bench_vs_torch.py`: ours through the
//!   Python wheel and SDPA's cuDNN and flash backends in one process with one timer, forward and
//!   backward; then `train_step_bench.py`, a training step per backend), then the Rust runner's
//!   sweeps (our own versions' A/B, the backward's memory table), decode, and ncu's HBM traffic;
//! - `run-sanitizer.sh`: compute-sanitizer's four tools over every kernel at odd shapes;
//! - `run-python-tests.sh` (`bundle_python`): the `flash_attn_rs` wheel in `python/wheels/`,
//!   installed without network, its GPU test suite and the training example.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bundle_files::{
    BundleFile, check_size, install_wheel_function, mib, step_function, use_cubins_function, write,
};
use crate::{Result, cargo, root};

/// The package of the CLI, the integration tests and the benchmark.
const LAB: &str = "flash-attn-lab";

/// The one test binary with work for a GPU (`tests/gpu/`: each GPU suite a module, the
/// safetensors CLI tests among them). The CPU-only suites (the references, emulators, plans, the
/// kernel lists) stay behind: the CI runs them, and each binary carries the embedded PTX (about
/// 5 MiB) into the GPU machine's 64 MiB transfer.
const GPU_TESTS: &str = "gpu";

/// The benchmark scripts (`lab/scripts/`), which `run-bench.sh` runs from `scripts/`.
const SCRIPTS: [&str; 5] = [
    // The comparisons with PyTorch: one process, one timer, through the Python wheel.
    "bench_vs_torch.py",
    "train_step_bench.py",
    // PyTorch's decode timings for the Rust runner's `--decode --torch` (two timers).
    "torch_decode_bench.py",
    // PyTorch's forward and backward timings in the Rust runner's JSON schema, for a `--torch`
    // merge by hand: two timers, so not the comparisons the README cites.
    "torch_sdpa_bench.py",
    "torch_backward_bench.py",
];

const BENCH_SCRIPT: &str = concat!(
    r#"#!/usr/bin/env bash
# On the GPU machine: the benchmarks, in this order.
# 1. The comparisons with PyTorch, forward and backward: scripts/bench_vs_torch.py times ours (the
#    flash_attn_rs wheel, installed here without network) and SDPA's cuDNN and flash backends on
#    the same tensors in one process, all with triton's do_bench, alternated; the README's tables
#    come from its results/vs-torch.md (and .json).
# 2. A training step per attention backend (a 4-layer Llama, 64k tokens per step):
#    scripts/train_step_bench.py, results/train-step.md (and .json). TRAIN=0 skips it.
# 3. The Rust runner (bin/flash-attn bench): every algorithm of ours over the sweep, the backward
#    variants and the backward's memory table. Its own timer (CUDA events over back-to-back
#    launches): for our own versions' A/B, not for ratios against PyTorch. RUNNER=0 skips it.
# 4. Decode: PyTorch's backends, then ours, one table. Two timers still: decode has no Python
#    entry yet (issue #33), so it cannot run in the one-timer harness.
# 5. ncu's HBM traffic of each algorithm beside the articles' formulas.
# Usage: bundle/run-bench.sh [--quick] [results-dir]
#   VS_TORCH_ARGS, TRAIN_ARGS: more options for the two Python benchmarks (e.g.
#   VS_TORCH_ARGS="--dtypes bf16 --passes forward"). A failed step does not stop the next ones;
#   ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")"
quick=""
if [ "${1:-}" = "--quick" ]; then quick="--quick"; shift; fi
out=${1:-results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
"#,
    step_function!(),
    use_cubins_function!(),
    install_wheel_function!(),
    r#"step install install_wheel
# shellcheck disable=SC2086
step vs-torch python3 scripts/bench_vs_torch.py $quick ${VS_TORCH_ARGS:-} \
  --out "$out/vs-torch.json" --markdown "$out/vs-torch.md"
if [ "${TRAIN:-1}" != 0 ]; then
  # shellcheck disable=SC2086
  step train-step python3 scripts/train_step_bench.py $quick ${TRAIN_ARGS:-} \
    --out "$out/train-step.json" --markdown "$out/train-step.md"
fi
if [ "${RUNNER:-1}" != 0 ]; then
  # Our own versions' A/B (no PyTorch columns: those are in vs-torch.md, timed the same way).
  step bench bin/flash-attn bench $quick --out-dir "$out"
  # The backward variants (fa3, fa2-tc, fa2, deterministic), backward alone and forward +
  # backward; then the memory table (batch 1, d = 128, N = 1k-128k: peak memory and where each
  # runs out).
  step bench-backward bin/flash-attn bench --backward $quick --out-dir "$out"
  step bench-memory bin/flash-attn bench --backward --memory --out-dir "$out"
fi
# Decode (split-KV) at ANCHORS.md's shapes: PyTorch's backends, then ours, one table; two timers
# until decode has a Python entry (issue #33).
step torch-decode python3 scripts/torch_decode_bench.py $quick --out "$out/torch-decode.json"
step bench-decode bin/flash-attn bench --decode $quick --torch "$out/torch-decode.json" \
  --out-dir "$out"
hbm_traffic() {
  ncu --csv --print-units base --clock-control none \
    --metrics dram__bytes_read.sum,dram__bytes_write.sum bin/flash-attn io > "$out/ncu.csv" &&
    bin/flash-attn io --ncu "$out/ncu.csv" | tee "$out/io.md"
}
if command -v ncu >/dev/null; then
  step hbm-traffic hbm_traffic
else
  echo "ncu not found: HBM traffic not measured"
fi
[ ${#failures[@]} -eq 0 ] || echo "failed: ${failures[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
"#
);

const SANITIZER_SCRIPT: &str = concat!(
    r#"#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over every forward kernel at odd
# shapes: seqlen 1, 17, 1000; head dims 8, 40, 64, 96, 128, 192, 256; 2 x 40 heads at seqlen 300 where
# FA3's persistent grid takes several tiles a block; causal off and on; every dtype and algorithm;
# then every compiled FA3 tiling, not only the defaults, under each tool; then the backward's
# window and soft-capping kernels under each tool; then memcheck and synccheck over the
# backward's and decode's GPU tests.
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
"#,
    use_cubins_function!(),
    r#"passed=0; failed=0
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
# Every dense FA3 tiling the module holds (the kernel list's names, `fa3_forward_bf16_d<d>_<tiling>`),
# each at its head dim under each tool, both dtypes (SANITIZER_FA3_TILINGS=0 skips them). Open
# (issue #31): racecheck reports the persistent tilings' (w3c128p, w2c128p) tile-number word,
# which the Q mbarriers order and racecheck does not take as ordering (docs/perf/fa3-forward.md,
# "The persistent grid under racecheck").
if [ "${SANITIZER_FA3_TILINGS:-1}" != 0 ]; then
  for kernel in $(bin/flash-attn info | grep -oE 'fa3_forward_bf16_d[0-9]+_w[0-9]c[0-9]+p?\b' | sort -u); do
    d=${kernel#fa3_forward_bf16_d}; d=${d%%_*}; tiling=${kernel##*_}
    for tool in ${SANITIZER_TOOLS:-memcheck racecheck synccheck initcheck}; do
      log=$logs/fa3-d$d-$tiling-$tool.log
      if timeout "${SANITIZER_TIMEOUT:-0}" compute-sanitizer --tool "$tool" --error-exitcode 99 \
          --print-limit 20 bin/flash-attn check --require-gpu --shapes sanitizer --algorithms fa3 \
          --dtypes bf16,f16 --head-dims "$d" --fa3-tiling "$tiling" > "$log" 2>&1; then
        passed=$((passed + 1)); echo "fa3 d=$d $tiling $tool: pass ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1))"
      else
        failed=$((failed + 1)); echo "fa3 d=$d $tiling $tool: FAIL"; tail -30 "$log"
      fi
    done
  done
fi
# The backward's `local` kernels (a window, soft-capping) at the window shapes up to 300 rows,
# fa3's and fa2-tc's, deterministic too, under each tool (SANITIZER_WINDOWS=0 skips them).
if [ "${SANITIZER_WINDOWS:-1}" != 0 ]; then
  for tool in ${SANITIZER_TOOLS:-memcheck racecheck synccheck initcheck}; do
    log=$logs/backward-window-$tool.log
    if timeout "${SANITIZER_TIMEOUT:-0}" compute-sanitizer --tool "$tool" --error-exitcode 99 \
        --print-limit 20 bin/flash-attn check --require-gpu --backward --shapes window \
        --seqlens 113,129,203,257,300 --dtypes bf16 --algorithms fa3 \
        --backward-algorithms fa3,fa2-tc > "$log" 2>&1; then
      passed=$((passed + 1)); echo "backward window $tool: pass ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1))"
    else
      failed=$((failed + 1)); echo "backward window $tool: FAIL"; tail -30 "$log"
    fi
  done
fi
# The backward and decode kernels, which `check` does not run: their GPU tests under memcheck and
# synccheck (SANITIZER_TESTS=0 skips them; the tests' f64 references make these runs CPU-bound).
if [ "${SANITIZER_TESTS:-1}" != 0 ]; then
  for suite in backward decode; do
    for tool in memcheck synccheck; do
      log=$logs/gpu-$suite-$tool.log
      if FLASH_ATTN_REQUIRE_GPU=1 timeout "${SANITIZER_TIMEOUT:-0}" compute-sanitizer --tool "$tool" \
          --error-exitcode 99 --print-limit 20 bin/test-gpu "$suite::" --test-threads=1 \
          > "$log" 2>&1; then
        passed=$((passed + 1)); echo "gpu $suite $tool: pass ($(grep -E 'ERROR SUMMARY' "$log" | tail -1))"
      else
        failed=$((failed + 1)); echo "gpu $suite $tool: FAIL"; tail -30 "$log"
      fi
    done
  done
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
"#
);

const RUN_SCRIPT: &str = concat!(
    r#"#!/usr/bin/env bash
# Runs every bundled binary on a machine with an NVIDIA GPU and reports pass/fail.
# Usage: bundle/run.sh [--quick]   (--quick: skip the benchmarks)
set -u
cd "$(dirname "$0")"
export FLASH_ATTN_REQUIRE_GPU=1
"#,
    step_function!(),
    use_cubins_function!(),
    r#"step info bin/flash-attn info
step check bin/flash-attn check --require-gpu --backward
step check-decode bin/flash-attn check --require-gpu --decode
step check-packed bin/flash-attn check --require-gpu --packed
# The GPU tests, one step per suite (the module names of bin/test-gpu's tests).
suites=$(bin/test-gpu --list 2>/dev/null | sed -n 's/::.*: test$//p' | sort -u)
[ -n "$suites" ] || step "test-gpu --list" false
for suite in $suites; do
  step "test-gpu $suite" bin/test-gpu "$suite::" --test-threads=1 --show-output
done
if [ "${1:-}" != "--quick" ]; then
  for b in bin/bench-*; do step "$(basename "$b")" "$b" --bench --quick; done
fi
[ ${#failures[@]} -eq 0 ] || echo "failed: ${failures[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
"#
);

pub fn run(out: &Path, criterion: bool) -> Result {
    let out = if out.is_absolute() {
        out.to_path_buf()
    } else {
        root().join(out)
    };
    let mut files = Vec::new();
    let builds: [(&[&str], &str, &str); 3] = [
        (&["build", "--release", "--bins"], "bin", ""),
        (
            &["test", "--release", "--test", GPU_TESTS, "--no-run"],
            "test",
            "test-",
        ),
        (&["bench", "--benches", "--no-run"], "bench", "bench-"),
    ];
    let builds = builds
        .iter()
        .filter(|(_, kind, _)| criterion || *kind != "bench");
    let mut embedded_ptx = Vec::new();
    for &(args, kind, prefix) in builds {
        let (executables, messages) = compiled(&[args, &["-p", LAB]].concat(), kind)?;
        for (path, name) in executables {
            files.push(BundleFile::copy(format!("bin/{prefix}{name}"), path));
        }
        embedded_ptx.extend(crate::bundle_cubin::embedded_ptx(&messages));
    }
    let binaries = files.len();
    embedded_ptx.sort();
    embedded_ptx.dedup();
    files.extend(crate::bundle_cubin::files(&embedded_ptx)?);
    files.extend([
        BundleFile::script("run.sh", RUN_SCRIPT),
        BundleFile::script("run-bench.sh", BENCH_SCRIPT),
        BundleFile::script("run-sanitizer.sh", SANITIZER_SCRIPT),
    ]);
    for name in SCRIPTS {
        let from = root().join("lab/scripts").join(name);
        files.push(BundleFile::copy(Path::new("scripts").join(name), from));
    }
    files.extend(crate::bundle_python::files()?);
    let total = check_size(&files)?;
    write(&out, &files)?;
    for file in &files {
        println!(
            "  {:<40} {:>8.2} MiB",
            file.path.display(),
            mib(file.bytes()?)
        );
    }
    println!(
        "bundle: {} files ({binaries} binaries, the Python wheel, scripts), {total} bytes ({:.1} MiB), in {} (run: {}/run.sh, {}/run-python-tests.sh)",
        files.len(),
        mib(total),
        out.display(),
        out.display(),
        out.display()
    );
    Ok(())
}

/// Runs a cargo command with JSON messages and returns each executable it built for a target of
/// `kind` (bin, test or bench), with the target's name, and the messages.
fn compiled(args: &[&str], kind: &str) -> Result<(Vec<(PathBuf, String)>, String)> {
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
    let messages = String::from_utf8_lossy(&output.stdout).into_owned();
    let mut found = Vec::new();
    for line in messages.lines() {
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
    Ok((found, messages))
}

/// The string value following `key` in a JSON line (cargo's messages need no full parser here).
pub(crate) fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = line.find(key)? + key.len();
    line[start..].split('"').next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bundled_script_is_in_lab_scripts() {
        for name in SCRIPTS {
            let path = root().join("lab/scripts").join(name);
            assert!(path.is_file(), "{} is listed but missing", path.display());
        }
    }

    /// The comparisons with PyTorch come from the one-timer harness, before the Rust runner, and
    /// the runner's forward and backward sweeps merge no PyTorch timings (two timers).
    #[test]
    fn run_bench_compares_with_pytorch_through_the_one_timer_harness_first() {
        let position = |needle: &str| {
            BENCH_SCRIPT
                .find(needle)
                .unwrap_or_else(|| panic!("run-bench.sh has no {needle:?}"))
        };
        let install = position("step install install_wheel");
        let harness = position("scripts/bench_vs_torch.py $quick");
        let train = position("scripts/train_step_bench.py $quick");
        let runner = position("bin/flash-attn bench $quick");
        assert!(install < harness && harness < train && train < runner);
        assert!(
            BENCH_SCRIPT.contains(r#"--out "$out/vs-torch.json" --markdown "$out/vs-torch.md""#)
        );
        for line in BENCH_SCRIPT
            .lines()
            .filter(|l| l.contains("bin/flash-attn bench"))
        {
            assert!(
                !line.contains("--torch") || line.contains("--decode"),
                "a two-timer merge: {line}"
            );
        }
        for name in ["bench_vs_torch.py", "train_step_bench.py"] {
            assert!(SCRIPTS.contains(&name), "{name} is not bundled");
        }
    }

    /// `bash -n` on every run script: a syntax error fails here, not on the GPU machine.
    #[test]
    fn the_run_scripts_parse() {
        use std::io::Write;
        let scripts = [
            ("run.sh", RUN_SCRIPT),
            ("run-bench.sh", BENCH_SCRIPT),
            ("run-sanitizer.sh", SANITIZER_SCRIPT),
            (
                "run-python-tests.sh",
                crate::bundle_python::PYTHON_TESTS_SCRIPT,
            ),
        ];
        for (name, text) in scripts {
            let mut bash = Command::new("bash")
                .arg("-n")
                .stdin(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("bash runs");
            bash.stdin
                .take()
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
            let output = bash.wait_with_output().unwrap();
            assert!(
                output.status.success(),
                "{name}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
}
