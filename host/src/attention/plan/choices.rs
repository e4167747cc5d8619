//! The per-family choices a plan makes: which compiled kernel and block sizes serve a head dim,
//! and why a tensor-core family cannot run a call (its fallback's reason).

use flash_kernels::common::params::{Operands, TensorView};
use flash_kernels::fwd::fa1::config::Fa1Blocks;
use flash_kernels::fwd::fa2_tc::config::{COPY_ELEMENTS, Fa2TcTiling};
use flash_kernels::fwd::fa3::config::{self as fa3, Fa3Tiling};
use flash_kernels::registry::{ElementType, Family, HOPPER_KERNELS, KERNELS, KernelForm, KernelId};

use super::{Blocks, CompiledLimits, ForwardPlan, LaunchLimits};
use crate::attention::problem::{Algorithm, AttentionOptions, Problem};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// FA2's default (B_r, B_c), most preferred first: larger blocks re-read K/V fewer times.
pub(super) const FA2_PREFERENCE: [(u32, u32); 4] = [(128, 128), (128, 64), (64, 128), (64, 64)];

/// The compiled FA2 kernel for `element` at head dim `d` with `block_cols`: the smallest
/// head-dim capacity that holds d.
pub(super) fn fa2_kernel(element: ElementType, d: u32, block_cols: u32) -> Option<KernelId> {
    KERNELS
        .iter()
        .filter(|k| k.dtype == element)
        .filter(|k| matches!(k.family, Family::Fa2 { block_cols: c, .. } if c == block_cols))
        .filter(|k| k.head_dim_capacity().is_some_and(|capacity| capacity >= d))
        .min_by_key(|k| k.head_dim_capacity())
        .copied()
}

/// FA1's block sizes for this problem on a device with `shared_limit` bytes per block.
pub fn fa1_blocks(
    head_dim: usize,
    shared_limit: u32,
    sram_floats: Option<u32>,
) -> Result<(u32, Fa1Blocks)> {
    let d = head_dim as u32;
    if let Some(m) = sram_floats {
        let blocks = Fa1Blocks::from_sram(m.max(1), d);
        let bytes = blocks.shared_bytes(d);
        if m == 0 || bytes > shared_limit as u64 {
            return Err(Error::invalid(
                "fa1_sram_floats",
                m,
                format!(
                    "≥ 1, with tiles that fit in {shared_limit} bytes of shared memory (this M needs {bytes} bytes at d = {d})"
                ),
            ));
        }
        return Ok((m, blocks));
    }
    // The ceilings in the formula can overshoot M, and S_ij needs B_r·B_c more: step M down one
    // B_c at a time until everything fits.
    let mut m = shared_limit / 4;
    loop {
        let blocks = Fa1Blocks::from_sram(m, d);
        if blocks.shared_bytes(d) <= shared_limit as u64 {
            return Ok((m, blocks));
        }
        if blocks.block_cols <= 1 {
            return Err(Error::invalid(
                "head_dim",
                d,
                format!("FA1's tiles do not fit in {shared_limit} bytes of shared memory"),
            ));
        }
        m = (blocks.block_cols - 1) * 4 * d;
    }
}

/// FA2's (B_r, B_c) for `head_dim` within the compiled kernels' thread bounds and `shared_limit`
/// bytes of shared memory: the override if valid, else the largest that fits.
pub fn fa2_blocks(
    head_dim: usize,
    shared_limit: u32,
    blocks: Option<(u32, u32)>,
) -> Result<(u32, u32)> {
    let problem = Problem::new(
        [1, 1, 1, head_dim],
        [1, 1, 1, head_dim],
        [1, 1, 1, head_dim],
        &AttentionOptions::default(),
    )?;
    let options = AttentionOptions {
        fa2_blocks: blocks,
        ..Default::default()
    };
    let limits = CompiledLimits {
        shared_memory_per_block: shared_limit,
        hopper: false,
        multiprocessors: 1,
    };
    let plan = ForwardPlan::new(
        &limits,
        Algorithm::Fa2,
        DType::F32,
        &problem,
        &options,
        None,
    )?;
    match plan.blocks {
        Blocks::Fa2 {
            block_rows,
            block_cols,
        } => Ok((block_rows, block_cols)),
        _ => unreachable!("an FA2 plan has FA2 blocks"),
    }
}

/// FA2-TC's tiling: the override if the kernel is compiled with it at this head dim in `form`,
/// else the default for the head dim (the packed and local forms have the default tilings
/// only).
pub fn fa2_tc_tiling(
    head_dim: usize,
    tiling: Option<Fa2TcTiling>,
    form: KernelForm,
) -> Result<Fa2TcTiling> {
    let d = head_dim as u32;
    let compiled = |t: Fa2TcTiling| {
        KERNELS.contains(&KernelId::new(
            Family::Fa2Tc {
                head_dim: d,
                tiling: t,
                form,
            },
            ElementType::Bf16,
        ))
    };
    match tiling {
        None => Ok(Fa2TcTiling::default_for(d)),
        Some(t) if compiled(t) => Ok(t),
        Some(t) => {
            let allowed: Vec<String> = fa2_tc_tilings_of(d, form)
                .iter()
                .map(|t| t.to_string())
                .collect();
            Err(Error::invalid(
                "fa2_tc_tiling",
                t,
                format!(
                    "allowed at head_dim {head_dim}{}: {} (warps x row tiles s K/V stages c B_c)",
                    form_note(form),
                    allowed.join(", ")
                ),
            ))
        }
    }
}

/// The tilings FA2-TC is compiled with at head dim `d` (empty if none).
pub fn fa2_tc_tilings(d: u32) -> Vec<Fa2TcTiling> {
    fa2_tc_tilings_of(d, KernelForm::Dense)
}

/// The tilings of FA2-TC's kernels at head dim `d` in `form`.
fn fa2_tc_tilings_of(d: u32, form: KernelForm) -> Vec<Fa2TcTiling> {
    KERNELS
        .iter()
        .filter(|k| k.dtype == ElementType::Bf16)
        .filter_map(|k| match k.family {
            Family::Fa2Tc {
                head_dim,
                tiling,
                form: f,
            } if head_dim == d && f == form => Some(tiling),
            _ => None,
        })
        .collect()
}

/// How an error about a tiling names the kernels' form: they differ by form.
fn form_note(form: KernelForm) -> &'static str {
    match form {
        KernelForm::Dense => "",
        KernelForm::Packed => " for a packed batch",
        KernelForm::Local => " with a window or soft-capping",
        KernelForm::PackedLocal => " for a packed batch with a window or soft-capping",
    }
}

/// The head dims FA2-TC is compiled for, ascending.
pub fn fa2_tc_head_dims() -> Vec<u32> {
    let mut dims: Vec<u32> = KERNELS
        .iter()
        .filter_map(|k| match k.family {
            Family::Fa2Tc { head_dim, .. } => Some(head_dim),
            _ => None,
        })
        .collect();
    dims.sort_unstable();
    dims.dedup();
    dims
}

/// Why [`Algorithm::Fa2Tc`] cannot run on tensor cores for this call, if it cannot: f32 has no
/// tensor-core kernel, the head dim is not compiled, or a row start is not 16-byte aligned (its
/// copies are 16-byte `cp.async`). Then it runs the scalar FA2.
pub fn tensor_core_fallback(
    dtype: DType,
    head_dim: usize,
    operands: Option<&Operands>,
) -> Option<String> {
    if dtype == DType::F32 {
        return Some("f32 has no tensor-core kernel (f16 and bf16 do)".into());
    }
    let dims = fa2_tc_head_dims();
    if !dims.contains(&(head_dim as u32)) {
        return Some(format!(
            "head_dim {head_dim} has no tensor-core kernel (compiled for {dims:?})"
        ));
    }
    misaligned_operand(operands)
}

/// The first operand whose address or strides are not 16-byte aligned (16-bit elements), as the
/// reason a 16-byte copy (cp.async, TMA) cannot read it.
fn misaligned_operand(operands: Option<&Operands>) -> Option<String> {
    operands.and_then(|o| misaligned_view(&[("q", &o.q), ("k", &o.k), ("v", &o.v), ("o", &o.o)]))
}

/// The first of `views` whose address or strides are not 16-byte aligned (16-bit elements), as
/// the reason a 16-byte copy cannot read it.
pub(crate) fn misaligned_view(views: &[(&str, &TensorView)]) -> Option<String> {
    let aligned = |view: &TensorView| {
        let step = COPY_ELEMENTS as u64;
        view.addr.is_multiple_of(16)
            && [view.batch_stride, view.head_stride, view.row_stride]
                .iter()
                .all(|s| s.is_multiple_of(step))
    };
    let misaligned = views.iter().find(|(_, view)| !aligned(view));
    misaligned.map(|(name, _)| {
        format!(
            "{name}'s rows are not 16-byte aligned (address and strides must be multiples of \
             {COPY_ELEMENTS} elements)"
        )
    })
}

/// The compiled head dim FA3 runs this call on, or why it cannot run it: the device is not
/// compute capability 9.0, f32, an odd head dim (O is stored two elements at a time), or a row
/// start that TMA cannot address. Then it runs FA2-TC.
pub fn fa3_fallback(
    limits: &dyn LaunchLimits,
    dtype: DType,
    head_dim: usize,
    operands: Option<&Operands>,
) -> std::result::Result<u32, String> {
    if !limits.runs_hopper_module() {
        return Err("the device is not compute capability 9.0 (FA3's module is sm_90a)".into());
    }
    if dtype == DType::F32 {
        return Err("f32 has no FA3 kernel (f16 and bf16 do)".into());
    }
    if !head_dim.is_multiple_of(2) {
        return Err(format!(
            "head_dim {head_dim} is odd (FA3 takes even head dims)"
        ));
    }
    if let Some(reason) = misaligned_operand(operands) {
        return Err(reason);
    }
    fa3::HEAD_DIMS
        .into_iter()
        .find(|&d| d as usize >= head_dim)
        .ok_or_else(|| format!("head_dim {head_dim} is past FA3's largest, 256"))
}

/// FA3's tiling at compiled head dim `d` for `problem`: the override if the kernel is compiled
/// with it in the problem's form, else the default. A packed batch's and a window's kernels
/// (and those for both) are the default split on the one-tile grid.
pub fn fa3_tiling(d: u32, tiling: Option<Fa3Tiling>, problem: &Problem) -> Result<Fa3Tiling> {
    let form = problem.kernel_form();
    let tilings: Vec<Fa3Tiling> = HOPPER_KERNELS
        .iter()
        .filter(|k| k.dtype == ElementType::Bf16)
        .filter_map(|k| match k.family {
            Family::Fa3 {
                head_dim,
                tiling,
                form: f,
            } if head_dim == d && f == form => Some(tiling),
            _ => None,
        })
        .collect();
    match tiling {
        None if form != KernelForm::Dense => Ok(Fa3Tiling {
            persistent: false,
            ..Fa3Tiling::default_for(d, problem.causal, problem.seqlen_k as u32)
        }),
        None => Ok(Fa3Tiling::default_for(
            d,
            problem.causal,
            problem.seqlen_k as u32,
        )),
        Some(t) if tilings.contains(&t) => Ok(t),
        Some(t) => {
            let allowed: Vec<String> = tilings.iter().map(|t| t.to_string()).collect();
            Err(Error::invalid(
                "fa3_tiling",
                t,
                format!(
                    "allowed at compiled head dim {d}{}: {} (consumer warpgroups, B_c)",
                    form_note(form),
                    allowed.join(", ")
                ),
            ))
        }
    }
}
