//! The module's kernels: one `extern "ptx-kernel"` entry point per (algorithm, dtype[, head-dim
//! capacity, B_c]), each taking its parameter block by value. The host builds the same names
//! (`host::kernels`).
//!
//! # Safety
//! Every entry point dereferences the device addresses in its parameters: the host must pass
//! tensors of the shapes and strides it describes, and launch with the grid, block and dynamic
//! shared memory that the kernel's docs give.

use crate::element::{Bf16, F16};
use crate::params::{Fa1Params, Fa2Params, StandardParams};
use crate::{fa1, fa2, fa2_tc, standard};

/// `standard_{scores,softmax,output}_<dtype>`.
macro_rules! standard_kernels {
    ($($dtype:ident => $t:ty),*) => {$(
        const _: () = {
            #[unsafe(export_name = concat!("standard_scores_", stringify!($dtype)))]
            unsafe extern "ptx-kernel" fn scores(params: StandardParams) {
                standard::scores::<$t>(&params)
            }
            #[unsafe(export_name = concat!("standard_softmax_", stringify!($dtype)))]
            unsafe extern "ptx-kernel" fn softmax(params: StandardParams) {
                standard::softmax::<$t>(&params)
            }
            #[unsafe(export_name = concat!("standard_output_", stringify!($dtype)))]
            unsafe extern "ptx-kernel" fn output(params: StandardParams) {
                standard::output::<$t>(&params)
            }
        };
    )*};
}

/// `fa1_forward_<dtype>`.
macro_rules! fa1_kernels {
    ($($dtype:ident => $t:ty),*) => {$(
        const _: () = {
            #[unsafe(export_name = concat!("fa1_forward_", stringify!($dtype)))]
            unsafe extern "ptx-kernel" fn forward(params: Fa1Params) {
                fa1::forward::<$t>(&params)
            }
        };
    )*};
}

/// `fa2_forward_<dtype>_d<capacity>_bc<B_c>` for every capacity in
/// `layout::FA2_HEAD_DIM_CAPACITIES` and B_c in `layout::FA2_BLOCK_CHOICES`.
macro_rules! fa2_kernels {
    ($($dtype:ident => $t:ty),*) => {$(
        fa2_kernels!(@one $dtype, $t; 32 64 128 256; 64 128);
    )*};
    (@one $dtype:ident, $t:ty; $($cap:literal)*; $bc0:literal $bc1:literal) => {$(
        fa2_kernels!(@entry $dtype, $t, $cap, $bc0);
        fa2_kernels!(@entry $dtype, $t, $cap, $bc1);
    )*};
    (@entry $dtype:ident, $t:ty, $cap:literal, $bc:literal) => {
        const _: () = {
            #[unsafe(export_name = concat!("fa2_forward_", stringify!($dtype), "_d", $cap, "_bc", $bc))]
            unsafe extern "ptx-kernel" fn forward(params: Fa2Params) {
                fa2::forward::<$t, { $cap / 32 }, { $bc / 32 }>(&params)
            }
        };
    };
}

/// `fa2tc_forward_<dtype>_d<head_dim>_w<warps>r<row tiles>s<K/V stages>c<B_c>` for the
/// tensor-core FA2 (`layout::FA2_TC_HEAD_DIMS` × the `layout::FA2_TC_TILINGS` each is compiled
/// for): every (warps, row tiles) listed first with B_c = 64, and those after the first `;` with
/// B_c = 32, each with one and two K/V stages; those after the second `;` with B_c = 48 and two
/// stages.
macro_rules! fa2_tc_kernels {
    ($($dtype:ident => $t:ty),*) => {$(
        fa2_tc_kernels!(@tilings $dtype, $t, 32; (4, 1) (8, 1) (4, 2); (4, 2); (4, 2));
        fa2_tc_kernels!(@tilings $dtype, $t, 64; (4, 1) (8, 1) (4, 2); (4, 2); (4, 2));
        fa2_tc_kernels!(@tilings $dtype, $t, 96; (4, 1) (8, 1) (4, 2); (4, 2); (4, 2));
        fa2_tc_kernels!(@tilings $dtype, $t, 128; (4, 1) (8, 1) (4, 2); (4, 2); (4, 2));
        fa2_tc_kernels!(@tilings $dtype, $t, 256; (4, 1) (8, 1); ; );
    )*};
    (@tilings $dtype:ident, $t:ty, $d:literal; $(($w:literal, $r:literal))*;
     $(($w32:literal, $r32:literal))*; $(($w48:literal, $r48:literal))*) => {
        $(fa2_tc_kernels!(@stages $dtype, $t, $d, $w, $r, 64);)*
        $(fa2_tc_kernels!(@stages $dtype, $t, $d, $w32, $r32, 32);)*
        $(fa2_tc_kernels!(@entry $dtype, $t, $d, $w48, $r48, 2, 48);)*
    };
    (@stages $dtype:ident, $t:ty, $d:literal, $warps:literal, $rows:literal, $bc:literal) => {
        fa2_tc_kernels!(@entry $dtype, $t, $d, $warps, $rows, 1, $bc);
        fa2_tc_kernels!(@entry $dtype, $t, $d, $warps, $rows, 2, $bc);
    };
    (@entry $dtype:ident, $t:ty, $d:literal, $warps:literal, $rows:literal, $stages:literal,
     $bc:literal) => {
        const _: () = {
            #[unsafe(export_name = concat!("fa2tc_forward_", stringify!($dtype), "_d", $d, "_w",
                $warps, "r", $rows, "s", $stages, "c", $bc))]
            unsafe extern "ptx-kernel" fn forward(params: Fa2Params) {
                fa2_tc::forward::<$t, { $d / 16 }, { $d / 8 }, $warps, $rows, $stages,
                    { $bc / 8 }, { $bc / 16 }>(&params)
            }
        };
    };
}

standard_kernels!(f32 => f32, f16 => F16, bf16 => Bf16);
fa1_kernels!(f32 => f32, f16 => F16, bf16 => Bf16);
fa2_kernels!(f32 => f32, f16 => F16, bf16 => Bf16);
fa2_tc_kernels!(f16 => F16, bf16 => Bf16);
