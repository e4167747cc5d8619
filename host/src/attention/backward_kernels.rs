//! Which main kernel and passes a backward call can run, and why not: FA3's (Hopper), FA2-TC's
//! (tensor cores), the scalar FA2's, each of the smallest compiled head dim that holds the call's,
//! and whether the wide pre- and post-pass take its dtype, head dim and views. The plan
//! (`backward_plan`) walks the chain fa3 → fa2-tc → fa2 through these, keeping each reason.

use flash_kernels::bwd::fa2::config as fa2_backward;
use flash_kernels::bwd::fa3::config as fa3_backward;
use flash_kernels::registry::{
    BackwardStage, ElementType, Family, HOPPER_KERNELS, KERNELS, KernelForm, KernelId,
};

use super::backward_plan::{BackwardOptions, BackwardViews};
use super::plan::{LaunchLimits, misaligned_view};
use crate::dtype::DType;

/// The compiled scalar main kernel for `element` at head dim `d` (for grouped K/V heads or not):
/// the smallest capacity that holds d.
pub(super) fn main_kernel(element: ElementType, d: u32, grouped: bool) -> Option<KernelId> {
    smallest_capacity(
        element,
        d,
        |family| matches!(family, Family::Fa2Backward(BackwardStage::Main { grouped: g, .. }) if g == grouped),
    )
}

/// The compiled kernel of `element` whose family passes `is_family`, of the smallest head-dim
/// capacity that holds d.
pub(super) fn smallest_capacity(
    element: ElementType,
    d: u32,
    is_family: impl Fn(Family) -> bool,
) -> Option<KernelId> {
    KERNELS
        .iter()
        .filter(|k| k.dtype == element && is_family(k.family))
        .filter(|k| k.head_dim_capacity().is_some_and(|capacity| capacity >= d))
        .min_by_key(|k| k.head_dim_capacity())
        .copied()
}

/// FA3's backward main kernel for this call (for grouped K/V heads or not, in the call's
/// `form`: packed or not, with a window or soft-capping or not; deterministic or not), or why
/// there is none: the device is not compute capability 9.0, f32, or what keeps the tensor-core
/// kernel from running (a head dim that is not a multiple of 8, rows that are not 16-byte
/// aligned: TMA reads them, `check_views`), a head dim past the largest compiled one, or
/// deterministic mode in any form but the dense one (compiled in fa2-tc's forms only).
pub(super) fn fa3_main_kernel(
    limits: &dyn LaunchLimits,
    dtype: DType,
    d: u32,
    grouped: bool,
    form: KernelForm,
    options: &BackwardOptions,
    views: Option<&BackwardViews>,
) -> std::result::Result<KernelId, String> {
    if !limits.runs_hopper_module() {
        return Err("the device is not compute capability 9.0 (FA3's module is sm_90a)".into());
    }
    if dtype == DType::F32 {
        return Err("f32 has no FA3 kernel (f16 and bf16 do)".into());
    }
    let deterministic = options.deterministic;
    if deterministic && form != KernelForm::Dense {
        return Err(
            "deterministic mode with a window, soft-capping or a packed batch is compiled for \
             fa2-tc only"
                .into(),
        );
    }
    check_views(d, grouped, views)?;
    let largest = fa3_backward::HEAD_DIMS[fa3_backward::HEAD_DIMS.len() - 1];
    HOPPER_KERNELS
        .iter()
        .filter(|k| k.dtype == ElementType::from(dtype))
        .filter(|k| {
            matches!(
                k.family,
                Family::Fa3Backward { grouped: g, deterministic: o, form: f, .. }
                    if g == grouped && o == deterministic && f == form
            )
        })
        .filter(|k| k.head_dim_capacity().is_some_and(|capacity| capacity >= d))
        .min_by_key(|k| k.head_dim_capacity())
        .copied()
        .ok_or_else(|| format!("head_dim {d} is past the FA3 backward's largest, {largest}"))
}

/// Whether the tensor-core kernels (FA2-TC's and FA3's) can read and store this call's rows:
/// a head dim that is a multiple of 8 (rows are copied in 16-byte chunks) and views whose rows
/// are 16-byte aligned (grouped, the kernel stores into the expanded workspace, not into dK and
/// dV, which the group sum writes element by element).
pub(super) fn check_views(
    d: u32,
    grouped: bool,
    views: Option<&BackwardViews>,
) -> std::result::Result<(), String> {
    if !d.is_multiple_of(8) {
        return Err(format!(
            "head_dim {d} is not a multiple of 8 (the tensor-core kernel copies rows in 16-byte \
             chunks)"
        ));
    }
    if let Some(v) = views {
        let views = [
            ("q", &v.q),
            ("k", &v.k),
            ("v", &v.v),
            ("d_o", &v.d_o),
            ("dk", &v.dk),
            ("dv", &v.dv),
        ];
        let copied_or_stored = if grouped { &views[..4] } else { &views[..] };
        if let Some(reason) = misaligned_view(copied_or_stored) {
            return Err(reason);
        }
    }
    Ok(())
}

/// Why the wide pre- and post-pass (`bwd::fa2::kernel::preprocess_wide`, `postprocess_wide`:
/// 16-byte loads of O and dO, 16-byte stores of the accumulator and dQ) cannot run this call,
/// if they cannot: f32 (they read 16-bit elements), a head dim that is not a multiple of 8 (or
/// past 256: a row's chunks must fit one warp), or O, dO or dQ rows that are not 16-byte aligned.
/// The accumulator is the plan's own and always aligned.
pub(super) fn wide_passes_refused(
    dtype: DType,
    d: u32,
    views: Option<&BackwardViews>,
) -> std::result::Result<(), String> {
    if dtype == DType::F32 {
        return Err("f32 (the wide passes read 16-bit elements)".into());
    }
    if !fa2_backward::wide_passes_take(d) {
        return Err(format!(
            "head_dim {d} is not a multiple of 8 (the wide passes move rows in 16-byte chunks)"
        ));
    }
    if let Some(v) = views
        && let Some(reason) = misaligned_view(&[("o", &v.o), ("d_o", &v.d_o), ("dq", &v.dq)])
    {
        return Err(reason);
    }
    Ok(())
}

/// The tensor-core main kernel for this call (for grouped K/V heads or not, in the call's
/// `form`), or why there is none: f32, a head dim that is not a multiple of 8
/// (rows are copied in 16-byte chunks), or a tensor whose rows are not 16-byte aligned
/// (grouped, the kernel stores into the expanded workspace, not into dK and dV, which the group
/// sum writes element by element).
pub(super) fn tensor_core_main_kernel(
    dtype: DType,
    d: u32,
    grouped: bool,
    form: KernelForm,
    views: Option<&BackwardViews>,
) -> std::result::Result<KernelId, String> {
    if dtype == DType::F32 {
        return Err("f32 has no tensor-core kernel (f16 and bf16 do)".into());
    }
    check_views(d, grouped, views)?;
    smallest_capacity(ElementType::from(dtype), d, |family| {
        matches!(family, Family::Fa2TcBackward { grouped: g, form: f, .. }
                if g == grouped && f == form)
    })
    .ok_or_else(|| format!("head_dim {d} is past the tensor-core kernels' largest capacity"))
}
