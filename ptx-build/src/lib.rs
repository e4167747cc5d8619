//! Rust → PTX, with the pinned nightly's own `nvptx64-nvidia-cuda` backend and a link step of our
//! own on its `llvm-tools`.
//!
//! 1. `cargo build --release -Zbuild-std=core --target nvptx64-nvidia-cuda` in `kernels/`: the
//!    rlibs of `flash-kernels`, `core` and `compiler_builtins`, whose members are LLVM bitcode.
//! 2. `llvm-ar x` each rlib; `llvm-link` the kernels' bitcode, then `llvm-link --only-needed` what
//!    it uses of `core` and `compiler_builtins`.
//! 3. Each `ptx_kernel` entry point gets `"nvvm.maxntid"` (and `"nvvm.minctasm"="1"`) from
//!    its [`flash_kernels::registry::KernelId`]'s `max_threads` (PTX `.maxntid`, so ptxas sizes its register
//!    budget for the real block size), then `opt -passes='internalize,default<O3>'`, keeping only
//!    the entry points public.
//! 4. `llc -mcpu=<arch>` writes the PTX.
//!
//! The host crate's build script and `cargo xtask ptx` both call [`build_ptx`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The toolchain `rust-toolchain.toml` pins; named in error messages.
pub const PINNED_TOOLCHAIN: &str = "nightly-2026-05-20";

/// LLVM's loop-unroll size threshold for the kernels. Per-thread register arrays (a warp's rows
/// of Õ, its scores) stay in registers only if every loop that indexes them is fully unrolled;
/// LLVM's default (300) leaves the larger of those loops rolled and the arrays in local memory.
const UNROLL_THRESHOLD: u32 = 2000;

/// GPU architectures the PTX can target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Sm80,
    Sm90,
    /// Hopper with its architecture-specific instructions (wgmma, setmaxnreg).
    Sm90a,
}

impl Arch {
    pub const ALL: [Arch; 3] = [Arch::Sm80, Arch::Sm90, Arch::Sm90a];

    pub fn name(self) -> &'static str {
        match self {
            Arch::Sm80 => "sm_80",
            Arch::Sm90 => "sm_90",
            Arch::Sm90a => "sm_90a",
        }
    }

    /// PTX ISA 8.0 (the first with sm_90a; CUDA 12.0 or newer drivers load it), and 8.1 for the
    /// Hopper module, whose backward adds pairs of f32 with `red.global.add.v2.f32` (CUDA 12.1).
    fn ptx_feature(self) -> &'static str {
        match self {
            Arch::Sm90a => "+ptx81",
            Arch::Sm80 | Arch::Sm90 => "+ptx80",
        }
    }
}

impl std::str::FromStr for Arch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Arch::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| format!("unknown GPU architecture `{s}`; allowed: sm_80, sm_90, sm_90a"))
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why the PTX could not be built.
#[derive(Debug)]
pub enum BuildError {
    /// A toolchain component is missing; the message carries the `rustup` command that adds it.
    MissingComponent {
        component: &'static str,
        looked_for: PathBuf,
    },
    /// The kernels crate did not compile; carries rustc's messages.
    KernelCompile(String),
    /// A tool of the link step failed.
    Tool {
        tool: String,
        output: String,
    },
    Io(String),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::MissingComponent {
                component,
                looked_for,
            } => write!(
                f,
                "the `{component}` component of the Rust toolchain is missing (looked for {}).\n\
                 Install it with:\n    rustup component add --toolchain {PINNED_TOOLCHAIN} {component}",
                looked_for.display()
            ),
            BuildError::KernelCompile(msg) => write!(
                f,
                "the kernels crate failed to compile for nvptx64-nvidia-cuda:\n{msg}"
            ),
            BuildError::Tool { tool, output } => write!(f, "`{tool}` failed:\n{output}"),
            BuildError::Io(msg) => write!(f, "{msg}"),
        }
    }
}

impl std::error::Error for BuildError {}

pub use flash_kernels::registry::Module;

/// What to build and where.
pub struct PtxBuild {
    /// The `kernels/` crate.
    pub kernels_dir: PathBuf,
    /// A target directory of its own for the nested cargo build (not the outer build's).
    pub target_dir: PathBuf,
    /// The cargo to run (the outer build's `CARGO`).
    pub cargo: PathBuf,
    /// The main module's target; the Hopper module is always sm_90a.
    pub arch: Arch,
    pub module: Module,
}

/// The result: the PTX file and the names of its kernels.
pub struct Ptx {
    pub path: PathBuf,
    pub kernels: Vec<String>,
}

impl PtxBuild {
    /// The architecture this build targets.
    pub fn target_arch(&self) -> Arch {
        match self.module {
            Module::Main => self.arch,
            Module::Hopper => Arch::Sm90a,
        }
    }

    /// Name of this build's files: `flash_attn_<arch>` or `flash_attn_hopper_sm_90a`.
    fn stem(&self) -> String {
        match self.module {
            Module::Main => format!("flash_attn_{}", self.arch),
            Module::Hopper => format!("flash_attn_hopper_{}", self.target_arch()),
        }
    }

    /// Runs the whole build; see the module docs.
    pub fn run(&self) -> Result<Ptx, BuildError> {
        let rustc = self.rustc();
        let sysroot = sysroot(&rustc)?;
        let tools = LlvmTools::find(&sysroot)?;
        let core_src = sysroot.join("lib/rustlib/src/rust/library/core");
        if !core_src.exists() {
            return Err(BuildError::MissingComponent {
                component: "rust-src",
                looked_for: core_src,
            });
        }
        let rlibs = self.cargo_build(&rustc)?;
        let work = self.target_dir.join(format!("link-{}", self.stem()));
        recreate_dir(&work)?;

        let kernels_bc = tools.link_members(
            &rlibs.kernels,
            &work.join("kernels"),
            &work.join("kernels.bc"),
        )?;
        let mut deps = Vec::new();
        for (i, rlib) in rlibs.dependencies.iter().enumerate() {
            deps.extend(tools.extract_bitcode(rlib, &work.join(format!("dep{i}")))?);
        }
        let linked = work.join("linked.bc");
        tools.run("llvm-link", |c| {
            c.arg(&kernels_bc)
                .arg("--only-needed")
                .args(&deps)
                .arg("-o")
                .arg(&linked);
        })?;
        let (kernels, annotated) = tools.annotate_launch_bounds(&linked, &work, self.module)?;
        let optimized = work.join("optimized.bc");
        tools.run("opt", |c| {
            c.arg("-passes=internalize,default<O3>")
                .arg(format!("-unroll-threshold={UNROLL_THRESHOLD}"))
                .arg(format!(
                    "--internalize-public-api-list={}",
                    kernels.join(",")
                ))
                .arg(&annotated)
                .arg("-o")
                .arg(&optimized);
        })?;
        let ptx = self.target_dir.join(format!("{}.ptx", self.stem()));
        tools.run("llc", |c| {
            c.arg("-mtriple=nvptx64-nvidia-cuda")
                .arg(format!("-mcpu={}", self.target_arch()))
                .arg(format!("-mattr={}", self.target_arch().ptx_feature()))
                .arg("-O3")
                .arg(&optimized)
                .arg("-o")
                .arg(&ptx);
        })?;
        Ok(Ptx { path: ptx, kernels })
    }

    /// The rustc beside `cargo` (same toolchain), else whatever `rustc` the PATH gives.
    fn rustc(&self) -> PathBuf {
        let beside = self
            .cargo
            .with_file_name(format!("rustc{}", std::env::consts::EXE_SUFFIX));
        if beside.exists() {
            beside
        } else {
            PathBuf::from("rustc")
        }
    }

    /// Step 1: the nested cargo build. Returns the rlibs it produced.
    fn cargo_build(&self, rustc: &Path) -> Result<Rlibs, BuildError> {
        let mut cmd = Command::new(&self.cargo);
        cmd.current_dir(&self.kernels_dir)
            .args([
                "build",
                "--release",
                "-Zbuild-std=core",
                "--target",
                "nvptx64-nvidia-cuda",
            ])
            .args(["--message-format", "json-render-diagnostics"])
            .arg("--target-dir")
            .arg(self.target_dir.join(format!("cargo-{}", self.stem())));
        if self.module == Module::Hopper {
            cmd.args(["--features", "hopper"]);
        }
        // The outer build's settings (its target, features, flags, wrapper) must not leak into
        // this one, which has its own target and flags.
        for (key, _) in std::env::vars_os() {
            let key_str = key.to_string_lossy();
            if (key_str.starts_with("CARGO_") && key_str != "CARGO_HOME")
                || [
                    "RUSTFLAGS",
                    "RUSTC",
                    "RUSTC_WRAPPER",
                    "RUSTC_WORKSPACE_WRAPPER",
                    "RUSTDOC",
                ]
                .contains(&key_str.as_ref())
            {
                cmd.env_remove(&key);
            }
        }
        let flags = [
            format!("-Ctarget-cpu={}", self.target_arch()),
            format!("-Ctarget-feature={}", self.target_arch().ptx_feature()),
            format!("-Cllvm-args=-unroll-threshold={UNROLL_THRESHOLD}"),
        ];
        cmd.env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"))
            .env("RUSTC", rustc);
        let output = cmd
            .output()
            .map_err(|e| BuildError::Io(format!("cannot run {}: {e}", self.cargo.display())))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            return Err(BuildError::KernelCompile(
                String::from_utf8_lossy(&output.stderr).into_owned(),
            ));
        }
        Rlibs::from_cargo_messages(&stdout)
    }
}

/// The rlibs of the kernels crate and of what it links against.
struct Rlibs {
    kernels: PathBuf,
    dependencies: Vec<PathBuf>,
}

impl Rlibs {
    fn from_cargo_messages(stdout: &str) -> Result<Self, BuildError> {
        let mut kernels = None;
        let mut dependencies = Vec::new();
        for line in stdout.lines() {
            let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if msg["reason"] != "compiler-artifact" {
                continue;
            }
            let name = msg["target"]["name"].as_str().unwrap_or_default();
            let rlib = msg["filenames"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f.as_str())
                .find(|f| f.ends_with(".rlib"));
            match (name, rlib) {
                ("flash_kernels", Some(path)) => kernels = Some(PathBuf::from(path)),
                ("core" | "compiler_builtins", Some(path)) => {
                    dependencies.push(PathBuf::from(path))
                }
                _ => {}
            }
        }
        let kernels = kernels
            .ok_or_else(|| BuildError::Io("cargo reported no rlib for flash_kernels".into()))?;
        Ok(Self {
            kernels,
            dependencies,
        })
    }
}

fn sysroot(rustc: &Path) -> Result<PathBuf, BuildError> {
    let out = Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| BuildError::Io(format!("cannot run {}: {e}", rustc.display())))?;
    if !out.status.success() {
        return Err(BuildError::Tool {
            tool: "rustc --print sysroot".into(),
            output: String::from_utf8_lossy(&out.stderr).into(),
        });
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn recreate_dir(dir: &Path) -> Result<(), BuildError> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)
            .map_err(|e| BuildError::Io(format!("cannot clear {}: {e}", dir.display())))?;
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| BuildError::Io(format!("cannot create {}: {e}", dir.display())))
}

/// The toolchain's `llvm-tools` component.
struct LlvmTools {
    bin: PathBuf,
}

impl LlvmTools {
    fn find(sysroot: &Path) -> Result<Self, BuildError> {
        let host_dir = sysroot.join("lib/rustlib");
        let bin = std::fs::read_dir(&host_dir)
            .map_err(|e| BuildError::Io(format!("cannot read {}: {e}", host_dir.display())))?
            .filter_map(|entry| entry.ok())
            .map(|entry| entry.path().join("bin"))
            .find(|bin| bin.join(exe("llvm-link")).exists());
        match bin {
            Some(bin) if bin.join(exe("opt")).exists() && bin.join(exe("llc")).exists() => {
                Ok(Self { bin })
            }
            _ => Err(BuildError::MissingComponent {
                component: "llvm-tools",
                looked_for: host_dir.join("<host>/bin/llvm-link"),
            }),
        }
    }

    fn run(&self, tool: &str, args: impl FnOnce(&mut Command)) -> Result<String, BuildError> {
        let mut cmd = Command::new(self.bin.join(exe(tool)));
        args(&mut cmd);
        let out = cmd
            .output()
            .map_err(|e| BuildError::Io(format!("cannot run {tool}: {e}")))?;
        if !out.status.success() {
            let mut output = String::from_utf8_lossy(&out.stderr).into_owned();
            output.push_str(&String::from_utf8_lossy(&out.stdout));
            return Err(BuildError::Tool {
                tool: format!("{tool} {:?}", cmd.get_args().collect::<Vec<_>>()),
                output,
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `llvm-ar x` an rlib into `dir`; returns its LLVM bitcode members (not `lib.rmeta`).
    fn extract_bitcode(&self, rlib: &Path, dir: &Path) -> Result<Vec<PathBuf>, BuildError> {
        recreate_dir(dir)?;
        self.run("llvm-ar", |c| {
            c.current_dir(dir).arg("x").arg(rlib);
        })?;
        let mut members: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| BuildError::Io(format!("cannot read {}: {e}", dir.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| is_bitcode(p))
            .collect();
        members.sort();
        Ok(members)
    }

    /// Extracts an rlib's bitcode and links all of it into `out`.
    fn link_members(&self, rlib: &Path, dir: &Path, out: &Path) -> Result<PathBuf, BuildError> {
        let members = self.extract_bitcode(rlib, dir)?;
        self.run("llvm-link", |c| {
            c.args(&members).arg("-o").arg(out);
        })?;
        Ok(out.to_path_buf())
    }

    /// Adds `"nvvm.maxntid"` to every function defined with the `ptx_kernel` calling convention
    /// (the module's entry points). Returns their names and the annotated bitcode.
    fn annotate_launch_bounds(
        &self,
        bitcode: &Path,
        work: &Path,
        module: Module,
    ) -> Result<(Vec<String>, PathBuf), BuildError> {
        let ir = self.run("llvm-dis", |c| {
            c.arg(bitcode).arg("-o").arg("-");
        })?;
        let mut kernels = Vec::new();
        let mut annotated = String::with_capacity(ir.len() + 4096);
        for line in ir.lines() {
            let name = (line.starts_with("define ") && line.contains(" ptx_kernel "))
                .then(|| {
                    line.split_once('@')
                        .and_then(|(_, rest)| rest.split('(').next())
                })
                .flatten()
                .map(|n| n.trim_matches('"').to_string());
            match (name, line.strip_suffix(" {")) {
                (Some(name), Some(head)) => {
                    let kernel = listed_kernel(&name, module)?;
                    let threads = kernel.max_threads();
                    // `.minnctapersm` too (1 for most): without it ptxas, given only `.maxntid`,
                    // caps registers to fit several blocks per SM and spills; these kernels'
                    // occupancy is set by their shared memory, not their registers. The split-KV
                    // kernels ask for the residency their split plan counts on.
                    let blocks = kernel.min_blocks_per_sm();
                    annotated.push_str(&format!(
                        "{head} \"nvvm.maxntid\"=\"{threads}\" \"nvvm.minctasm\"=\"{blocks}\" {{"
                    ));
                    kernels.push(name);
                }
                _ => annotated.push_str(line),
            }
            annotated.push('\n');
        }
        kernels.sort();
        let text = work.join("annotated.ll");
        std::fs::write(&text, annotated)
            .map_err(|e| BuildError::Io(format!("cannot write {}: {e}", text.display())))?;
        let out = work.join("annotated.bc");
        self.run("llvm-as", |c| {
            c.arg(&text).arg("-o").arg(&out);
        })?;
        Ok((kernels, out))
    }
}

/// The id of the entry point `name`, which must be one of `module`'s kernels (the list that
/// generates the entry points, so anything else is a kernel defined by hand).
fn listed_kernel(
    name: &str,
    module: Module,
) -> Result<flash_kernels::registry::KernelId, BuildError> {
    name.parse()
        .ok()
        .filter(|id| module.kernels().contains(id))
        .ok_or_else(|| {
            BuildError::KernelCompile(format!(
                "entry point `{name}` is not in the {} module's kernel list: add kernels \
                 through `for_each_kernel!` or `for_each_hopper_kernel!`",
                module.name()
            ))
        })
}

fn exe(name: &str) -> String {
    format!("{name}{}", std::env::consts::EXE_SUFFIX)
}

fn is_bitcode(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok()
        && magic == *b"BC\xC0\xDE"
}
