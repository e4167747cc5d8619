//! The module's entry points: one `extern "ptx-kernel"` function per kernel of
//! [`crate::for_each_kernel!`] (or, built with `feature = "hopper"`, of
//! [`crate::for_each_hopper_kernel!`]), named by [`crate::registry::KernelId`]'s `Display`, each taking its
//! parameter block by value.
//!
//! # Safety
//! Every entry point dereferences the device addresses in its parameters: the host must pass
//! tensors of the shapes and strides it describes, and launch with the grid, block and dynamic
//! shared memory that the kernel's docs give (the host's launch plan does).

#[cfg(not(feature = "hopper"))]
use crate::bwd::{
    fa2 as fa2_backward, fa2_tc as fa2_tc_backward, group_sum, standard as standard_backward,
};
use crate::common::element::{Bf16, F16};
use crate::common::params::PackedParams;
#[cfg(not(feature = "hopper"))]
use crate::common::params::{
    DecodeParams, Fa1Params, Fa2BackwardParams, Fa2Params, Fa2TcBackwardParams, GroupSumParams,
    StandardBackwardParams, StandardParams,
};
#[cfg(not(feature = "hopper"))]
use crate::decode::{append, combine, split_kv};
#[cfg(not(feature = "hopper"))]
use crate::fwd::{fa1, fa2, fa2_tc, standard};
use crate::tile::sequences::{DeviceOffsets, LaunchSequences, PackedTable};
#[cfg(feature = "hopper")]
use crate::{
    bwd::fa3 as fa3_backward,
    common::params::{Fa3BackwardParams, Fa3Params},
    fa3_backward_config, fa3_config, for_each_hopper_kernel,
    fwd::fa3,
};
#[cfg(not(feature = "hopper"))]
use crate::{
    decode_config, fa2_backward_config, fa2_config, fa2_tc_backward_config, fa2_tc_config,
    for_each_kernel,
};

/// The kernels' element type for a name of the list.
macro_rules! element {
    (f32) => {
        f32
    };
    (f16) => {
        F16
    };
    (bf16) => {
        Bf16
    };
}

/// The standard backward's kernel for a stage name of the list.
#[cfg(not(feature = "hopper"))]
macro_rules! standard_backward_stage {
    (dp, $t:ty, $params:expr) => {
        standard_backward::kernel::probs_gradient::<$t>($params)
    };
    (ds, $t:ty, $params:expr) => {
        standard_backward::kernel::scores_gradient::<$t>($params)
    };
    (dq, $t:ty, $params:expr) => {
        standard_backward::kernel::query_gradient::<$t>($params)
    };
    (dkdv, $t:ty, $params:expr) => {
        standard_backward::kernel::key_value_gradients::<$t>($params)
    };
}

/// Whether a cache layout of the list is paged.
#[cfg(not(feature = "hopper"))]
macro_rules! paged {
    (contiguous) => {
        false
    };
    (paged) => {
        true
    };
}

/// The parameter block an entry point of the tensor-core families takes for its list entry's
/// form (its last word): a packed form's ([`PackedParams`], the launch's sequences after the
/// family's block), or the family's own.
macro_rules! form_params {
    ($family:ident, varlen) => {
        PackedParams<$family>
    };
    ($family:ident, varlen_local) => {
        PackedParams<$family>
    };
    ($family:ident $(, $form:ident)?) => {
        $family
    };
}

/// A tensor-core kernel's parameter block as its entry point receives it ([`form_params!`]).
trait FormParams {
    type Family;
    /// The family's block.
    fn family(&self) -> &Self::Family;
    /// The launch's sequences, given the `.param` address of this block
    /// (`arch::kernel_parameters_address!`): `InParameters(PackedTable::NONE)` for a family's
    /// own block.
    fn sequences(&self, block: u64) -> LaunchSequences;
}

/// A dense or window form's block, the family's own.
macro_rules! family_params {
    ($($family:ty),*) => {
        $(impl FormParams for $family {
            type Family = Self;
            #[inline(always)]
            fn family(&self) -> &Self {
                self
            }
            #[inline(always)]
            fn sequences(&self, _block: u64) -> LaunchSequences {
                LaunchSequences::InParameters(PackedTable::NONE)
            }
        })*
    };
}
#[cfg(not(feature = "hopper"))]
family_params!(Fa2Params, Fa2TcBackwardParams);
#[cfg(feature = "hopper")]
family_params!(Fa3Params, Fa3BackwardParams);

impl<P> FormParams for PackedParams<P> {
    type Family = P;
    #[inline(always)]
    fn family(&self) -> &P {
        &self.family
    }
    #[inline(always)]
    fn sequences(&self, block: u64) -> LaunchSequences {
        let s = &self.sequences;
        if s.device_cu_seqlens_q != 0 {
            LaunchSequences::InDeviceMemory(DeviceOffsets::new(
                s.device_cu_seqlens_q,
                s.device_cu_seqlens_k,
                s.total_q,
                s.total_k,
            ))
        } else {
            let table = core::mem::offset_of!(Self, sequences.cu_seqlens_q) as u64;
            LaunchSequences::InParameters(PackedTable::new(block + table, s.total_q))
        }
    }
}

/// Runs `$body` with `$packed` bound to the launch's sequences ([`FormParams::sequences`] of
/// `$params`, the block of kernel `$name`), once per kind: each arm is its own copy of the
/// kernel's body, so the one that reads the parameter block keeps its uniform registers.
macro_rules! with_sequences {
    ($params:ident, $name:expr, |$packed:ident| $body:expr) => {
        match $params.sequences($crate::kernel_parameters_address!($name)) {
            LaunchSequences::InParameters($packed) => $body,
            LaunchSequences::InDeviceMemory($packed) => $body,
        }
    };
}

/// One entry point, from one line of a list.
macro_rules! entry_point {
    (fa3 $dtype:ident $d:literal $consumers:literal $cols:literal $($grid:ident)?) => {
        const _: () = {
            fa3_config!(Config, $d, $consumers, $cols $(, $grid)?);
            macro_rules! name {
                () => {
                    concat!("fa3_forward_", stringify!($dtype), "_d", $d, "_w", $consumers, "c",
                        $cols, $crate::fa3_grid_suffix!($($grid)?))
                };
            }
            #[unsafe(export_name = name!())]
            unsafe extern "ptx-kernel" fn kernel(params: form_params!(Fa3Params $(, $grid)?)) {
                with_sequences!(params, name!(), |packed| {
                    fa3::kernel::forward::<element!($dtype), Config>(params.family(), packed)
                })
            }
        };
    };
    (fa3_backward $dtype:ident $d:literal $order:ident $form:ident $($grouped:ident)?) => {
        const _: () = {
            fa3_backward_config!(
                Config,
                $d,
                $crate::backward_grouped!($($grouped)?),
                $crate::backward_deterministic!($order),
                $crate::kernel_form!($form)
            );
            macro_rules! name {
                () => {
                    concat!("fa3_backward_", stringify!($dtype), "_d", $d,
                        $crate::backward_grouped_suffix!($($grouped)?),
                        $crate::kernel_form_suffix!($form),
                        $crate::backward_deterministic_suffix!($order))
                };
            }
            #[unsafe(export_name = name!())]
            unsafe extern "ptx-kernel" fn kernel(params: form_params!(Fa3BackwardParams, $form)) {
                with_sequences!(params, name!(), |packed| {
                    fa3_backward::kernel::backward::<element!($dtype), Config>(
                        params.family(),
                        packed,
                    )
                })
            }
        };
    };
    (decode $dtype:ident $d:literal $cache:ident $($one_launch:ident)?) => {
        const _: () = {
            decode_config!(Config, $d, paged!($cache));
            #[unsafe(export_name = concat!("decode_splitkv_", stringify!($dtype), "_d", $d, "_",
                stringify!($cache), $crate::decode_one_launch_suffix!($($one_launch)?)))]
            unsafe extern "ptx-kernel" fn kernel(params: DecodeParams) {
                split_kv::split_kv::<
                    element!($dtype),
                    Config,
                    { $crate::decode_one_launch!($($one_launch)?) },
                >(&params)
            }
        };
    };
    (decode_combine $dtype:ident $d:literal) => {
        const _: () = {
            decode_config!(Config, $d, false);
            #[unsafe(export_name = concat!("decode_combine_", stringify!($dtype), "_d", $d))]
            unsafe extern "ptx-kernel" fn kernel(params: DecodeParams) {
                combine::combine::<element!($dtype), Config>(&params)
            }
        };
    };
    (kv_append $dtype:ident $cache:ident) => {
        const _: () = {
            #[unsafe(export_name = concat!("kv_append_", stringify!($dtype), "_", stringify!($cache)))]
            unsafe extern "ptx-kernel" fn kernel(params: DecodeParams) {
                append::append::<{ paged!($cache) }>(&params)
            }
        };
    };
    (standard_backward $stage:ident $dtype:ident) => {
        const _: () = {
            #[unsafe(export_name = concat!("standard_backward_", stringify!($stage), "_",
                stringify!($dtype)))]
            unsafe extern "ptx-kernel" fn kernel(params: StandardBackwardParams) {
                standard_backward_stage!($stage, element!($dtype), &params)
            }
        };
    };
    (group_sum $dtype:ident) => {
        const _: () = {
            #[unsafe(export_name = concat!("backward_group_sum_", stringify!($dtype)))]
            unsafe extern "ptx-kernel" fn kernel(params: GroupSumParams) {
                group_sum::kernel::group_sum::<element!($dtype)>(&params)
            }
        };
    };
    (standard $stage:ident $dtype:ident) => {
        const _: () = {
            #[unsafe(export_name = concat!("standard_", stringify!($stage), "_", stringify!($dtype)))]
            unsafe extern "ptx-kernel" fn kernel(params: StandardParams) {
                standard::kernel::$stage::<element!($dtype)>(&params)
            }
        };
    };
    (fa1 $dtype:ident) => {
        const _: () = {
            #[unsafe(export_name = concat!("fa1_forward_", stringify!($dtype)))]
            unsafe extern "ptx-kernel" fn kernel(params: Fa1Params) {
                fa1::kernel::forward::<element!($dtype)>(&params)
            }
        };
    };
    (fa2 $dtype:ident $capacity:literal $cols:literal) => {
        const _: () = {
            fa2_config!(Config, $capacity, $cols);
            #[unsafe(export_name = concat!("fa2_forward_", stringify!($dtype), "_d", $capacity,
                "_bc", $cols))]
            unsafe extern "ptx-kernel" fn kernel(params: Fa2Params) {
                fa2::kernel::forward::<element!($dtype), Config>(&params)
            }
        };
    };
    (fa2_backward main $dtype:ident $capacity:literal $block_rows:literal $($grouped:ident)?) => {
        const _: () = {
            fa2_backward_config!(Config, $capacity, $block_rows,
                $crate::backward_grouped!($($grouped)?));
            #[unsafe(export_name = concat!("fa2_backward_main_", stringify!($dtype), "_d",
                $capacity, $crate::backward_grouped_suffix!($($grouped)?)))]
            unsafe extern "ptx-kernel" fn kernel(params: Fa2BackwardParams) {
                fa2_backward::kernel::backward::<element!($dtype), Config>(&params)
            }
        };
    };
    (fa2_tc_backward $dtype:ident $capacity:literal $warps:literal $split:literal
     $rows:literal $form:ident $($grouped:ident)?) => {
        const _: () = {
            fa2_tc_backward_config!(Config, $capacity, $warps, $split, $rows,
                $crate::backward_grouped!($($grouped)?), $crate::kernel_form!($form));
            macro_rules! name {
                () => {
                    concat!("fa2tc_backward_", stringify!($dtype), "_d", $capacity,
                        $crate::backward_grouped_suffix!($($grouped)?),
                        $crate::kernel_form_suffix!($form))
                };
            }
            #[unsafe(export_name = name!())]
            unsafe extern "ptx-kernel" fn kernel(params: form_params!(Fa2TcBackwardParams, $form)) {
                with_sequences!(params, name!(), |packed| {
                    fa2_tc_backward::kernel::backward::<element!($dtype), Config>(
                        params.family(),
                        packed,
                    )
                })
            }
        };
    };
    (fa2_backward $stage:ident $dtype:ident) => {
        const _: () = {
            #[unsafe(export_name = concat!("fa2_backward_", stringify!($stage), "_",
                stringify!($dtype)))]
            unsafe extern "ptx-kernel" fn kernel(params: Fa2BackwardParams) {
                fa2_backward::kernel::$stage::<element!($dtype)>(&params)
            }
        };
    };
    (fa2_tc $dtype:ident $d:literal $warps:literal $rows:literal $stages:literal $cols:literal
     $($form:ident)?) => {
        const _: () = {
            fa2_tc_config!(Config, $d, $warps, $rows, $stages, $cols);
            type const PACKED: bool = const { $crate::kernel_form!($($form)?).is_packed() };
            type const LOCAL: bool = const { $crate::kernel_form!($($form)?).is_local() };
            macro_rules! name {
                () => {
                    concat!("fa2tc_forward_", stringify!($dtype), "_d", $d, "_w", $warps, "r",
                        $rows, "s", $stages, "c", $cols, $crate::kernel_form_suffix!($($form)?))
                };
            }
            #[unsafe(export_name = name!())]
            unsafe extern "ptx-kernel" fn kernel(params: form_params!(Fa2Params $(, $form)?)) {
                with_sequences!(params, name!(), |packed| {
                    fa2_tc::kernel::forward::<element!($dtype), Config, PACKED, LOCAL>(
                        params.family(),
                        packed,
                    )
                })
            }
        };
    };
}

// The main module holds every family but FA3; the Hopper module (sm_90a) FA3 alone (forward and
// backward).
#[cfg(not(feature = "hopper"))]
for_each_kernel!(entry_point);
#[cfg(feature = "hopper")]
for_each_hopper_kernel!(entry_point);
