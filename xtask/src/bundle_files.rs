//! What `cargo xtask bundle` writes, listed before anything is written: each file's place in the
//! bundle and where its bytes come from (a build's output or a script's text), so that the total
//! is checked against the GPU machine's transfer limit first; and the `step` function the run
//! scripts share.

use std::path::{Path, PathBuf};

use crate::Result;

/// What travels to the GPU machine must stay under its 64 MiB limit.
pub const MAX_BUNDLE_BYTES: u64 = 64 * 1024 * 1024;

/// How many of the largest files an oversized bundle's error names.
const LARGEST_NAMED: usize = 6;

/// One file of the bundle.
pub struct BundleFile {
    /// Its path inside the bundle, e.g. `bin/test-gpu`.
    pub path: PathBuf,
    contents: Contents,
}

enum Contents {
    /// A copy of a file built or kept elsewhere.
    Copy(PathBuf),
    /// A run script, written from this text and made executable.
    Script(&'static str),
}

impl BundleFile {
    /// `path` in the bundle, a copy of `from`.
    pub fn copy(path: impl Into<PathBuf>, from: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            contents: Contents::Copy(from.into()),
        }
    }

    /// An executable script at `path` in the bundle.
    pub fn script(path: impl Into<PathBuf>, text: &'static str) -> Self {
        Self {
            path: path.into(),
            contents: Contents::Script(text),
        }
    }

    /// Its size in bytes.
    pub fn bytes(&self) -> Result<u64> {
        match &self.contents {
            Contents::Copy(from) => std::fs::metadata(from)
                .map(|m| m.len())
                .map_err(|e| format!("cannot read {}: {e}", from.display())),
            Contents::Script(text) => Ok(text.len() as u64),
        }
    }
}

/// The bundle's size in bytes; fails, naming its largest files, where it is over
/// [`MAX_BUNDLE_BYTES`].
pub fn check_size(files: &[BundleFile]) -> Result<u64> {
    let mut sizes = files
        .iter()
        .map(|file| Ok((file.bytes()?, &file.path)))
        .collect::<Result<Vec<_>>>()?;
    let total = sizes.iter().map(|(bytes, _)| bytes).sum();
    if total <= MAX_BUNDLE_BYTES {
        return Ok(total);
    }
    sizes.sort_by_key(|&(bytes, _)| std::cmp::Reverse(bytes));
    let largest: Vec<String> = sizes
        .iter()
        .take(LARGEST_NAMED)
        .map(|(bytes, path)| format!("{} ({:.1} MiB)", path.display(), mib(*bytes)))
        .collect();
    Err(format!(
        "the bundle would be {total} bytes ({:.1} MiB, {} files), over the {MAX_BUNDLE_BYTES}-byte \
         limit of the GPU machine's transfer; nothing was written. Largest: {}",
        mib(total),
        files.len(),
        largest.join(", ")
    ))
}

/// Empties `out` and writes `files` into it.
pub fn write(out: &Path, files: &[BundleFile]) -> Result {
    if out.exists() {
        std::fs::remove_dir_all(out).map_err(|e| format!("cannot clear {}: {e}", out.display()))?;
    }
    for file in files {
        let dest = out.join(&file.path);
        if let Some(folder) = dest.parent() {
            std::fs::create_dir_all(folder)
                .map_err(|e| format!("cannot create {}: {e}", folder.display()))?;
        }
        match &file.contents {
            Contents::Copy(from) => {
                std::fs::copy(from, &dest).map_err(|e| {
                    format!("cannot copy {} to {}: {e}", from.display(), dest.display())
                })?;
            }
            Contents::Script(text) => {
                std::fs::write(&dest, text)
                    .map_err(|e| format!("cannot write {}: {e}", dest.display()))?;
                make_executable(&dest)?;
            }
        }
    }
    Ok(())
}

pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}

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

/// The scripts' `install_wheel`: installs the bundle's `flash_attn_rs` wheel into a fresh folder
/// with pip from the file alone (the GPU machine has no network; PyTorch is there already) and
/// puts that folder first on `PYTHONPATH`. Run in the script's shell (e.g. as `step install
/// install_wheel`), so the export stays.
macro_rules! install_wheel_function {
    () => {
        r#"install_wheel() {
  local site; site=$(mktemp -d)
  python3 -m pip install --quiet --no-deps --no-index --no-compile --target "$site" \
    python/wheels/flash_attn_rs-*.whl || return
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
}
"#
    };
}
pub(crate) use install_wheel_function;

/// The scripts' `use_cubins`: on a compute capability 9.0 GPU, unpacks the bundle's cubins
/// (`bundle_cubin`) and names them in `FLASH_ATTN_PTX` / `FLASH_ATTN_HOPPER_PTX`, so no process
/// JIT-compiles the PTX (minutes per process where the driver's cache is cold). `CUBINS=0`, a
/// bundle without them, or another GPU: the embedded PTX, compiled by the driver. Run in the
/// script's shell, so the exports stay.
macro_rules! use_cubins_function {
    () => {
        r#"use_cubins() {
  [ "${CUBINS:-1}" != 0 ] && [ -f cubin/main.cubin.xz ] && [ -f cubin/hopper.cubin.xz ] || return 0
  [ "$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)" = 9.0 ] || return 0
  local dir m; dir=$(mktemp -d)
  for m in main hopper; do
    python3 -c 'import lzma, sys; open(sys.argv[2], "wb").write(lzma.open(sys.argv[1]).read())' \
      "cubin/$m.cubin.xz" "$dir/$m.cubin" || return
  done
  export FLASH_ATTN_PTX="$dir/main.cubin" FLASH_ATTN_HOPPER_PTX="$dir/hopper.cubin"
  echo "cubins: $FLASH_ATTN_PTX, $FLASH_ATTN_HOPPER_PTX"
}
use_cubins
"#
    };
}
pub(crate) use use_cubins_function;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oversized_bundle_names_its_largest_files() {
        const BIG: &str = "#";
        let text: &'static str = BIG.repeat(MAX_BUNDLE_BYTES as usize / 2).leak();
        let files = [
            BundleFile::script("run.sh", "echo"),
            BundleFile::script("bin/a", text),
            BundleFile::script("bin/b", text),
        ];
        let error = check_size(&files).unwrap_err();
        assert!(
            error.contains("bin/a (32.0 MiB), bin/b (32.0 MiB), run.sh"),
            "{error}"
        );
        assert_eq!(check_size(&files[1..]).unwrap(), MAX_BUNDLE_BYTES);
    }
}
