//! `cargo xtask sass`: the machine code ptxas makes of the tensor-core kernels, and the check that
//! their main loop runs on the tensor cores: HMMA inside the K/V loop, and whether local memory
//! (spills) is touched there.
//!
//! The PTX is assembled with the same ptxas wheel as `cargo xtask ptxas`; `cuobjdump` and
//! `nvdisasm` come from their PyPI wheels, so this runs on any machine, GPU or not.

use flash_kernels::registry::KernelId;
use std::path::{Path, PathBuf};
use std::process::Command;

use ptx_build::{Arch, Module};

use crate::Result;
use crate::ptx::{build, build_of, ptxas, tool_from_wheel};

const CUOBJDUMP_WHEEL: &str = "nvidia-cuda-cuobjdump==13.5.37";
const NVDISASM_WHEEL: &str = "nvidia-cuda-nvdisasm==13.5.37";
/// Whether `name` is a kernel whose main loop must run on tensor cores (the list says which).
fn uses_tensor_cores(name: &str) -> bool {
    name.parse::<KernelId>()
        .is_ok_and(|k| k.uses_tensor_cores())
}

/// Instruction counts of one loop (the code between a backward branch and its target).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct LoopCounts {
    pub instructions: u32,
    pub hmma: u32,
    pub ldsm: u32,
    pub mufu: u32,
    pub local: u32,
    pub barriers: u32,
}

/// One kernel's SASS: its instruction total and its largest loop that issues HMMA (the K/V loop).
#[derive(Debug, Clone)]
pub struct KernelSass {
    pub name: String,
    pub instructions: u32,
    pub main_loop: Option<LoopCounts>,
    /// The main loop's basic blocks (its paths: masked or not, rescale taken or not).
    pub main_loop_blocks: Vec<BlockCounts>,
}

/// Instruction classes of the block view, each an opcode prefix list; an instruction counts in
/// the first class it matches (so `IMAD.MOV`, a register move, is not counted as `IMAD`).
const BLOCK_CLASSES: [(&str, &[&str]); 15] = [
    ("HMMA", &["HMMA", "HGMMA"]),
    ("LDSM", &["LDSM"]),
    ("MUFU", &["MUFU"]),
    ("FFMA", &["FFMA"]),
    ("FMUL", &["FMUL"]),
    ("FADD", &["FADD"]),
    ("FMNMX", &["FMNMX"]),
    ("MOV", &["MOV", "IMAD.MOV"]),
    ("IMAD", &["IMAD"]),
    ("LOP3", &["LOP3"]),
    ("SHFL", &["SHFL"]),
    ("VOTE", &["VOTE"]),
    ("LDGSTS", &["LDGSTS"]),
    ("BAR", &["BAR"]),
    ("LDL/STL", &["LDL", "STL"]),
];

/// One basic block: where it starts, its instruction count per class of [`BLOCK_CLASSES`], and
/// the instruction that ends it (a branch, or the first instruction of the next block).
#[derive(Debug, Clone, PartialEq)]
pub struct BlockCounts {
    pub address: u64,
    pub instructions: u32,
    pub classes: [u32; BLOCK_CLASSES.len()],
    pub ends_with: String,
}

impl std::fmt::Display for BlockCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "  {:#07x} {:>5} instrs ",
            self.address, self.instructions
        )?;
        for ((label, _), count) in BLOCK_CLASSES.iter().zip(self.classes) {
            if count > 0 {
                write!(f, " {label} {count}")?;
            }
        }
        write!(f, "  | {}", self.ends_with)
    }
}

/// Assembles the PTX, disassembles it, prints a table of the tensor-core kernels (or of those
/// whose name contains `filter`) and, with `blocks`, each one's main-loop basic blocks, writes the
/// whole SASS to `target/ptx/<module>.sass`, and fails when a tensor-core kernel has no HMMA in a
/// loop.
pub fn report(
    arch: Arch,
    module: Module,
    filter: Option<&str>,
    blocks: bool,
) -> Result<Vec<KernelSass>> {
    let ptx = build(arch, module)?;
    let arch = build_of(arch, module).target_arch();
    let cubin = ptx.path.with_extension("cubin");
    crate::run_command(
        Command::new(ptxas()?)
            .arg(format!("-arch={arch}"))
            .arg(&ptx.path)
            .arg("-o")
            .arg(&cubin),
    )?;
    let sass = disassemble(&cubin)?;
    let sass_path = ptx.path.with_extension("sass");
    std::fs::write(&sass_path, &sass)
        .map_err(|e| format!("writing {}: {e}", sass_path.display()))?;
    let kernels: Vec<KernelSass> = parse_sass(&sass)
        .into_iter()
        .filter(|k| match filter {
            Some(f) => k.name.contains(f),
            None => uses_tensor_cores(&k.name),
        })
        .collect();
    println!(
        "SASS of {} ({arch}): {}",
        ptx.path.display(),
        sass_path.display()
    );
    println!(
        "{:<34} {:>7} | main loop: {:>6} {:>5} {:>5} {:>5} {:>8} {:>4}",
        "kernel", "instrs", "instrs", "HMMA", "LDSM", "MUFU", "LDL/STL", "BAR"
    );
    for k in &kernels {
        let l = k.main_loop.clone().unwrap_or_default();
        println!(
            "{:<34} {:>7} | {:>17} {:>5} {:>5} {:>5} {:>8} {:>4}",
            k.name, k.instructions, l.instructions, l.hmma, l.ldsm, l.mufu, l.local, l.barriers
        );
        if blocks {
            for block in &k.main_loop_blocks {
                println!("{block}");
            }
        }
    }
    let missing: Vec<&str> = kernels
        .iter()
        .filter(|k| uses_tensor_cores(&k.name) && k.main_loop.is_none())
        .map(|k| k.name.as_str())
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "no HMMA inside a loop of these tensor-core kernels: {}",
            missing.join(", ")
        ));
    }
    Ok(kernels)
}

fn disassemble(cubin: &Path) -> Result<String> {
    let cuobjdump = tool_from_wheel("cuda-cuobjdump", CUOBJDUMP_WHEEL, "cuobjdump")?;
    let nvdisasm = tool_from_wheel("cuda-nvdisasm", NVDISASM_WHEEL, "nvdisasm")?;
    // cuobjdump runs nvdisasm, which it looks for on PATH.
    let nvdisasm_dir = nvdisasm.parent().map(PathBuf::from).unwrap_or_default();
    let path = std::env::join_paths(std::iter::once(nvdisasm_dir).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .map_err(|e| format!("building PATH for nvdisasm: {e}"))?;
    let output = Command::new(&cuobjdump)
        .arg("--dump-sass")
        .arg(cubin)
        .env("PATH", path)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", cuobjdump.display()))?;
    if !output.status.success() {
        return Err(format!(
            "cuobjdump failed on {}: {}",
            cubin.display(),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// One SASS instruction: its address and opcode (without the predicate), for a branch its
/// target address, and the instruction's text.
struct Instruction {
    address: u64,
    opcode: String,
    branch_target: Option<u64>,
    text: String,
}

/// `/*01f0*/   @!P0 BRA 0x550 ;` → address 0x1f0, opcode `BRA`, target 0x550.
fn parse_instruction(line: &str) -> Option<Instruction> {
    let rest = line.trim_start().strip_prefix("/*")?;
    let (address, code) = rest.split_once("*/")?;
    let address = u64::from_str_radix(address, 16).ok()?;
    let mut words = code.split_whitespace().filter(|w| !w.starts_with('@'));
    let opcode = words.next()?.trim_end_matches(';').to_string();
    if opcode.is_empty() || !opcode.starts_with(|c: char| c.is_ascii_uppercase()) {
        return None;
    }
    let branch_target = (opcode == "BRA")
        .then(|| {
            words
                .find_map(|w| w.trim_end_matches([';', ',']).strip_prefix("0x"))
                .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        })
        .flatten();
    Some(Instruction {
        address,
        opcode,
        branch_target,
        text: code
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_string(),
    })
}

/// Splits `cuobjdump --dump-sass` output into kernels and finds each one's largest loop with
/// HMMA.
fn parse_sass(sass: &str) -> Vec<KernelSass> {
    let mut kernels = Vec::new();
    let mut current: Option<(String, Vec<Instruction>)> = None;
    for line in sass.lines() {
        if let Some(name) = line.split("Function : ").nth(1) {
            kernels.extend(current.take().map(|(n, code)| summarise(n, &code)));
            current = Some((name.trim().to_string(), Vec::new()));
        } else if let (Some((_, code)), Some(instruction)) =
            (current.as_mut(), parse_instruction(line))
        {
            code.push(instruction);
        }
    }
    kernels.extend(current.map(|(n, code)| summarise(n, &code)));
    kernels
}

fn summarise(name: String, code: &[Instruction]) -> KernelSass {
    let counts = |from: u64, to: u64| {
        let mut c = LoopCounts::default();
        for i in code.iter().filter(|i| (from..=to).contains(&i.address)) {
            c.instructions += 1;
            let op = i.opcode.as_str();
            c.hmma += u32::from(op.starts_with("HMMA") || op.starts_with("HGMMA"));
            c.ldsm += u32::from(op.starts_with("LDSM"));
            c.mufu += u32::from(op.starts_with("MUFU"));
            c.local += u32::from(op.starts_with("LDL") || op.starts_with("STL"));
            c.barriers += u32::from(op.starts_with("BAR"));
        }
        c
    };
    let main_loop = code
        .iter()
        .filter_map(|i| {
            let target = i.branch_target.filter(|&t| t < i.address)?;
            Some(((target, i.address), counts(target, i.address)))
        })
        .filter(|(_, c)| c.hmma > 0)
        .max_by_key(|(_, c)| c.instructions);
    let main_loop_blocks = main_loop
        .as_ref()
        .map(|&((from, to), _)| {
            basic_blocks(code)
                .into_iter()
                .filter(|b| (from..=to).contains(&b.address))
                .collect()
        })
        .unwrap_or_default();
    KernelSass {
        name,
        instructions: code.len() as u32,
        main_loop: main_loop.map(|(_, c)| c),
        main_loop_blocks,
    }
}

/// Splits a kernel's code into basic blocks: a block starts at the first instruction, at every
/// branch target and after every branch or exit.
fn basic_blocks(code: &[Instruction]) -> Vec<BlockCounts> {
    let targets: std::collections::HashSet<u64> =
        code.iter().filter_map(|i| i.branch_target).collect();
    let mut blocks: Vec<BlockCounts> = Vec::new();
    let mut open = false;
    for (index, i) in code.iter().enumerate() {
        if !open || targets.contains(&i.address) {
            if let (Some(last), true) = (blocks.last_mut(), open) {
                last.ends_with = format!("falls through to {:#x}", i.address);
            }
            blocks.push(BlockCounts {
                address: i.address,
                instructions: 0,
                classes: [0; BLOCK_CLASSES.len()],
                ends_with: String::new(),
            });
        }
        let block = blocks.last_mut().expect("a block was just opened");
        block.instructions += 1;
        if let Some(class) = BLOCK_CLASSES
            .iter()
            .position(|(_, prefixes)| prefixes.iter().any(|p| i.opcode.starts_with(p)))
        {
            block.classes[class] += 1;
        }
        open = !matches!(i.opcode.as_str(), "BRA" | "EXIT" | "RET");
        if !open || index + 1 == code.len() {
            block.ends_with = i.text.clone();
        }
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_loop_with_hmma_and_counts_its_instructions() {
        let sass = "\
        Function : k
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDSM.16.M88.4 R4, [R2] ;
        /*0020*/                   HMMA.16816.F32.BF16 R8, R4, R6, R8 ;
        /*0030*/                   LDL R3, [R1] ;
        /*0040*/                   MUFU.EX2 R5, R5 ;
        /*0050*/               @!P0 BRA 0x10 ;
        /*0060*/                   BRA 0x60;
        /*0070*/                   EXIT ;
        Function : no_loop
        /*0000*/                   HMMA.16816.F32.BF16 R8, R4, R6, R8 ;
        /*0010*/                   EXIT ;
";
        let kernels = parse_sass(sass);
        assert_eq!(kernels.len(), 2);
        assert_eq!(kernels[0].name, "k");
        assert_eq!(kernels[0].instructions, 8);
        assert_eq!(
            kernels[0].main_loop,
            Some(LoopCounts {
                instructions: 5,
                hmma: 1,
                ldsm: 1,
                mufu: 1,
                local: 1,
                barriers: 0,
            })
        );
        assert_eq!(kernels[1].main_loop, None);
        // The loop 0x10..=0x50 is one block; the block view counts IMAD.MOV as a move.
        let blocks = &kernels[0].main_loop_blocks;
        assert_eq!(blocks.len(), 1);
        assert_eq!((blocks[0].address, blocks[0].instructions), (0x10, 5));
        assert_eq!(blocks[0].ends_with, "@!P0 BRA 0x10");
    }

    #[test]
    fn splits_the_loop_into_its_paths() {
        let sass = "\
        Function : k
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   HMMA.16816.F32.BF16 R8, R4, R6, R8 ;
        /*0020*/                   VOTE.ANY R0, PT, P1 ;
        /*0030*/               @!P0 BRA 0x60 ;
        /*0040*/                   FMUL R8, R8, R2 ;
        /*0050*/                   IMAD.MOV.U32 R9, RZ, RZ, R8 ;
        /*0060*/                   IMAD R3, R3, 0x2, RZ ;
        /*0070*/               @P2 BRA 0x10 ;
        /*0080*/                   EXIT ;
";
        let kernels = parse_sass(sass);
        let blocks = &kernels[0].main_loop_blocks;
        let class = |b: &BlockCounts, label: &str| {
            b.classes[BLOCK_CLASSES.iter().position(|(l, _)| *l == label).unwrap()]
        };
        assert_eq!(
            blocks
                .iter()
                .map(|b| (b.address, b.instructions))
                .collect::<Vec<_>>(),
            [(0x10, 3), (0x40, 2), (0x60, 2)]
        );
        assert_eq!(
            (class(&blocks[0], "HMMA"), class(&blocks[0], "VOTE")),
            (1, 1)
        );
        assert_eq!(blocks[0].ends_with, "@!P0 BRA 0x60");
        assert_eq!(
            (class(&blocks[1], "MOV"), class(&blocks[1], "IMAD")),
            (1, 0)
        );
        assert_eq!(blocks[1].ends_with, "falls through to 0x60");
        assert_eq!(class(&blocks[2], "IMAD"), 1);
    }
}
