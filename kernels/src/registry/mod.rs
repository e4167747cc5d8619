//! Every kernel the modules hold, listed once.
//!
//! [`for_each_kernel!`] is the list of the main module (sm_80/sm_90, every GPU from Ampere on),
//! [`for_each_hopper_kernel!`] that of the Hopper module (sm_90a: FA3). On the GPU they generate
//! the entry points (`entry.rs`); on the host they build [`KERNELS`] and [`HOPPER_KERNELS`], the typed ids ([`KernelId`]) that the host launches, that
//! `ptx-build` reads launch bounds from, and that `xtask ptxas`/`sass` and `flash-attn info`
//! report. A CPU test checks each list against its module's `.entry` names, so a kernel cannot be
//! compiled without being listed, or listed without being compiled.

mod id;
mod name;

pub use id::{
    BackwardStage, CacheLayout, ElementType, Family, KernelId, Module, StandardBackwardStage,
    StandardStage,
};
pub use name::ParseKernelIdError;
// Defined beside the forward families (whose configs need it); re-exported here with the rest of
// a kernel id's parts, where the host names it.
pub use crate::common::form::KernelForm;

use crate::fwd::fa2_tc::config::Fa2TcTiling;

/// Invokes `$emit!` once per compiled kernel, with one of:
///
/// - `standard <stage> <dtype>`: the three kernels of standard attention;
/// - `fa1 <dtype>`: FlashAttention-1's forward;
/// - `fa2 <dtype> <head-dim capacity> <B_c>`: the faithful FA2 forward;
/// - `fa2_tc <dtype> <head dim> <warps> <row tiles> <K/V stages> <B_c>`: FA2 on tensor cores;
/// - `fa2_backward preprocess <dtype>`, `fa2_backward main <dtype> <head-dim capacity> <B_r>
///   [grouped]`, `fa2_backward postprocess <dtype>`: the faithful FA2 backward's three kernels
///   (B_r is `bwd::fa2::config::block_rows` of the capacity, written out for the entry point's
///   config; `grouped`: the main kernel for grouped K/V heads, which stores dK and dV per query
///   head, `BlockInfo::kv_gradient_head`);
/// - `fa2_backward preprocess_wide <dtype>`, `fa2_backward postprocess_wide <dtype>`: the same
///   pre- and post-pass with 16-byte loads and stores (f16/bf16, head dims that are multiples of
///   8, 16-byte-aligned rows), which every FA2-family backward runs where it can;
/// - `fa2_tc_backward <dtype> <head-dim capacity> <warps> <warps per key tile> <B_r>
///   <dense | local | varlen | varlen_local> [grouped]`: the backward's main kernel on tensor
///   cores (the tiling is `bwd::fa2_tc::config::Fa2TcBackwardTiling::for_capacity`, written out
///   for the config; the form as the forward's, `KernelForm`: `dense` the causal mask or none,
///   `local` a sliding window and soft-capping, `varlen` a packed batch, `varlen_local` both).
/// - `standard_backward <stage> <dtype>`: the standard backward's own four kernels (dp, ds, dq,
///   dkdv);
/// - `group_sum <dtype>`: the grouped backward's sum of each K/V head's group of dK and dV;
/// - `fa2_tc ... varlen`: FA2 on tensor cores for a packed batch of sequences of different
///   lengths (`common::params::PackedSequences`), `fa2_tc ... local`, for a sliding window
///   and soft-capping, and `fa2_tc ... varlen_local`, for both (`KernelForm`), each at each
///   head dim's default tiling
///   (`Fa2TcTiling::default_for`; a CPU test holds the two together);
/// - `decode <dtype> <head dim> <cache> [onelaunch]`, `decode_combine <dtype> <head dim>`,
///   `kv_append <dtype> <cache>`: decoding against a KV cache (cache: contiguous or paged;
///   `onelaunch`: the split-KV kernel whose last block of each group merges the splits, so no
///   combine kernel runs).
///
/// FA2-TC: every head dim up to 128 takes the full set of tilings; at d = 256 two row tiles would
/// hold 2·256 f32 accumulators per lane, past the 255-register limit, so single row tiles only.
/// B_c = 32 and 48 only with two row tiles: that is where the 16 × B_c S tiles of both row tiles,
/// beside Õ, press on the register limit (at d = 128 `4x2s1c64` spills 92 bytes; `4x2s2c48` and
/// the `c32` tilings spill none).
#[macro_export]
macro_rules! for_each_kernel {
    ($emit:ident) => {
        $crate::for_each_kernel!(@standard $emit [f32 f16 bf16]);
        $crate::for_each_kernel!(@fa1 $emit [f32 f16 bf16]);
        $crate::for_each_kernel!(@fa2 $emit [f32 f16 bf16] [32 64 128 256] [64 128]);
        $crate::for_each_kernel!(@fa2_tc $emit [f16 bf16] {
            32 => (4 1 2 64) (8 1 2 64) (4 2 2 64) (4 1 1 64) (8 1 1 64) (4 2 1 64)
                  (4 2 2 32) (4 2 1 32) (4 2 2 48);
            64 => (4 1 2 64) (8 1 2 64) (4 2 2 64) (4 1 1 64) (8 1 1 64) (4 2 1 64)
                  (4 2 2 32) (4 2 1 32) (4 2 2 48);
            96 => (4 1 2 64) (8 1 2 64) (4 2 2 64) (4 1 1 64) (8 1 1 64) (4 2 1 64)
                  (4 2 2 32) (4 2 1 32) (4 2 2 48);
            128 => (4 1 2 64) (8 1 2 64) (4 2 2 64) (4 1 1 64) (8 1 1 64) (4 2 1 64)
                   (4 2 2 32) (4 2 1 32) (4 2 2 48);
            256 => (4 1 2 64) (8 1 2 64) (4 1 1 64) (8 1 1 64);
        });
        $crate::for_each_kernel!(@fa2_backward $emit [f32 f16 bf16]);
        $crate::for_each_kernel!(@fa2_backward_wide $emit [f16 bf16]);
        $crate::for_each_kernel!(@fa2_tc_backward $emit [f16 bf16]);
        $crate::for_each_kernel!(@decode $emit [f16 bf16] [64 128]);
        $crate::for_each_kernel!(@standard_backward $emit [f32 f16 bf16]);
        $crate::for_each_kernel!(@group_sum $emit [f32 f16 bf16]);
        $crate::for_each_kernel!(@fa2_tc_default $emit [f16 bf16] varlen);
        $crate::for_each_kernel!(@fa2_tc_default $emit [f16 bf16] local);
        $crate::for_each_kernel!(@fa2_tc_default $emit [f16 bf16] varlen_local);
    };
    (@fa2_tc_default $emit:ident [$($dtype:ident)*] $form:ident) => {$(
        $emit!(fa2_tc $dtype 32 4 2 2 64 $form);
        $emit!(fa2_tc $dtype 64 4 2 2 64 $form);
        $emit!(fa2_tc $dtype 96 4 2 1 64 $form);
        $emit!(fa2_tc $dtype 128 4 2 1 64 $form);
        $emit!(fa2_tc $dtype 256 4 1 1 64 $form);
    )*};
    (@group_sum $emit:ident [$($dtype:ident)*]) => {$(
        $emit!(group_sum $dtype);
    )*};
    (@standard_backward $emit:ident [$($dtype:ident)*]) => {$(
        $emit!(standard_backward dp $dtype);
        $emit!(standard_backward ds $dtype);
        $emit!(standard_backward dq $dtype);
        $emit!(standard_backward dkdv $dtype);
    )*};
    (@fa2_tc_backward $emit:ident [$($dtype:ident)*]) => {$(
        $crate::for_each_kernel!(@fa2_tc_backward_mains $emit $dtype);
        $crate::for_each_kernel!(@fa2_tc_backward_mains $emit $dtype grouped);
    )*};
    (@fa2_tc_backward_mains $emit:ident $dtype:ident $($grouped:ident)?) => {
        $crate::for_each_kernel!(@fa2_tc_backward_form $emit $dtype dense $($grouped)?);
        $crate::for_each_kernel!(@fa2_tc_backward_form $emit $dtype local $($grouped)?);
        $crate::for_each_kernel!(@fa2_tc_backward_form $emit $dtype varlen $($grouped)?);
        $crate::for_each_kernel!(@fa2_tc_backward_form $emit $dtype varlen_local $($grouped)?);
    };
    (@fa2_tc_backward_form $emit:ident $dtype:ident $form:ident $($grouped:ident)?) => {
        $emit!(fa2_tc_backward $dtype 64 8 1 64 $form $($grouped)?);
        $emit!(fa2_tc_backward $dtype 128 8 1 32 $form $($grouped)?);
        $emit!(fa2_tc_backward $dtype 192 8 2 32 $form $($grouped)?);
        $emit!(fa2_tc_backward $dtype 256 8 2 16 $form $($grouped)?);
    };
    (@fa2_backward $emit:ident [$($dtype:ident)*]) => {$(
        $emit!(fa2_backward preprocess $dtype);
        $crate::for_each_kernel!(@fa2_backward_mains $emit $dtype);
        $emit!(fa2_backward postprocess $dtype);
        $crate::for_each_kernel!(@fa2_backward_mains $emit $dtype grouped);
    )*};
    (@fa2_backward_wide $emit:ident [$($dtype:ident)*]) => {$(
        $emit!(fa2_backward preprocess_wide $dtype);
        $emit!(fa2_backward postprocess_wide $dtype);
    )*};
    (@fa2_backward_mains $emit:ident $dtype:ident $($grouped:ident)?) => {
        $emit!(fa2_backward main $dtype 32 64 $($grouped)?);
        $emit!(fa2_backward main $dtype 64 64 $($grouped)?);
        $emit!(fa2_backward main $dtype 128 64 $($grouped)?);
        $emit!(fa2_backward main $dtype 256 32 $($grouped)?);
    };
    (@decode $emit:ident [$($dtype:ident)*] $head_dims:tt) => {$(
        $emit!(kv_append $dtype contiguous);
        $emit!(kv_append $dtype paged);
        $crate::for_each_kernel!(@decode_dtype $emit $dtype $head_dims);
    )*};
    (@decode_dtype $emit:ident $dtype:ident [$($d:literal)*]) => {$(
        $emit!(decode $dtype $d contiguous);
        $emit!(decode $dtype $d paged);
        $emit!(decode $dtype $d contiguous onelaunch);
        $emit!(decode $dtype $d paged onelaunch);
        $emit!(decode_combine $dtype $d);
    )*};
    (@standard $emit:ident [$($dtype:ident)*]) => {$(
        $emit!(standard scores $dtype);
        $emit!(standard softmax $dtype);
        $emit!(standard output $dtype);
    )*};
    (@fa1 $emit:ident [$($dtype:ident)*]) => {$(
        $emit!(fa1 $dtype);
    )*};
    (@fa2 $emit:ident [$($dtype:ident)*] $capacities:tt $block_cols:tt) => {$(
        $crate::for_each_kernel!(@fa2_dtype $emit $dtype $capacities $block_cols);
    )*};
    (@fa2_dtype $emit:ident $dtype:ident [$($capacity:literal)*] $block_cols:tt) => {$(
        $crate::for_each_kernel!(@fa2_capacity $emit $dtype $capacity $block_cols);
    )*};
    (@fa2_capacity $emit:ident $dtype:ident $capacity:literal [$($cols:literal)*]) => {$(
        $emit!(fa2 $dtype $capacity $cols);
    )*};
    (@fa2_tc $emit:ident [$($dtype:ident)*] $by_head_dim:tt) => {$(
        $crate::for_each_kernel!(@fa2_tc_dtype $emit $dtype $by_head_dim);
    )*};
    (@fa2_tc_dtype $emit:ident $dtype:ident {
        $($head_dim:literal => $(($warps:literal $rows:literal $stages:literal $cols:literal))*;)*
    }) => {$($(
        $emit!(fa2_tc $dtype $head_dim $warps $rows $stages $cols);
    )*)*};
}

/// Invokes `$emit!` once per kernel of the Hopper module (sm_90a), with
/// `fa3 <dtype> <head dim> <consumer warpgroups> <B_c> [persistent | varlen | local |
/// varlen_local]` (`varlen`: for a packed batch of sequences of different lengths, `local`: for
/// a sliding window and soft-capping, `varlen_local`: for both; all three on the one-tile grid,
/// at each head dim's default split).
///
/// The defaults (`Fa3Tiling::default_for`): d = 64 with three consumer warpgroups (B_r = 192,
/// FlashAttention-3's choice: 489 against 402 TFLOP/s with two at N = 4096, docs/perf), the others
/// with two. Also compiled, for measurement: d = 64 with two consumers and with B_c = 96 and
/// 64, d = 128 with B_c = 176 (FlashAttention-3's non-causal tile), d = 256 with B_c = 64; and
/// every head dim's default split on the persistent grid (`Fa3Tiling::persistent`), which the
/// defaults pick where it measured faster (short sequences).
///
/// And `fa3_backward <dtype> <head dim> <atomic | deterministic> <dense | local | varlen |
/// varlen_local> [grouped]`: FlashAttention-3's backward main kernel (`bwd::fa3`, tiling
/// `Fa3BackwardTiling::for_head_dim`; the form and `grouped` as `fa2_tc_backward`'s), at the
/// head dims of `bwd::fa3::config::HEAD_DIMS`; every form but `dense` in the atomic order only
/// (a deterministic call with a window, soft-capping or a packed batch runs fa2-tc's, whose
/// order is a parameter).
#[macro_export]
macro_rules! for_each_hopper_kernel {
    ($emit:ident) => {
        $crate::for_each_hopper_kernel!(@fa3 $emit [f16 bf16]);
        $crate::for_each_hopper_kernel!(@fa3_backward $emit [f16 bf16]);
    };
    (@fa3_backward $emit:ident [$($dtype:ident)*]) => {$(
        $crate::for_each_hopper_kernel!(@fa3_backward_mains $emit $dtype);
        $crate::for_each_hopper_kernel!(@fa3_backward_mains $emit $dtype grouped);
    )*};
    (@fa3_backward_mains $emit:ident $dtype:ident $($grouped:ident)?) => {
        $emit!(fa3_backward $dtype 64 atomic dense $($grouped)?);
        $emit!(fa3_backward $dtype 96 atomic dense $($grouped)?);
        $emit!(fa3_backward $dtype 128 atomic dense $($grouped)?);
        $emit!(fa3_backward $dtype 64 deterministic dense $($grouped)?);
        $emit!(fa3_backward $dtype 96 deterministic dense $($grouped)?);
        $emit!(fa3_backward $dtype 128 deterministic dense $($grouped)?);
        $crate::for_each_hopper_kernel!(@fa3_backward_form $emit $dtype local $($grouped)?);
        $crate::for_each_hopper_kernel!(@fa3_backward_form $emit $dtype varlen $($grouped)?);
        $crate::for_each_hopper_kernel!(@fa3_backward_form $emit $dtype varlen_local $($grouped)?);
    };
    (@fa3_backward_form $emit:ident $dtype:ident $form:ident $($grouped:ident)?) => {
        $emit!(fa3_backward $dtype 64 atomic $form $($grouped)?);
        $emit!(fa3_backward $dtype 96 atomic $form $($grouped)?);
        $emit!(fa3_backward $dtype 128 atomic $form $($grouped)?);
    };
    (@fa3 $emit:ident [$($dtype:ident)*]) => {$(
        $emit!(fa3 $dtype 64 2 128);
        $emit!(fa3 $dtype 64 3 128);
        $emit!(fa3 $dtype 64 3 96);
        $emit!(fa3 $dtype 64 3 64);
        $emit!(fa3 $dtype 96 2 128);
        $emit!(fa3 $dtype 128 2 128);
        $emit!(fa3 $dtype 128 2 176);
        $emit!(fa3 $dtype 192 2 112);
        $emit!(fa3 $dtype 256 2 80);
        $emit!(fa3 $dtype 256 2 64);
        $emit!(fa3 $dtype 64 3 128 persistent);
        $emit!(fa3 $dtype 96 2 128 persistent);
        $emit!(fa3 $dtype 128 2 128 persistent);
        $emit!(fa3 $dtype 192 2 112 persistent);
        $emit!(fa3 $dtype 256 2 80 persistent);
        $crate::for_each_hopper_kernel!(@fa3_default $emit $dtype varlen);
        $crate::for_each_hopper_kernel!(@fa3_default $emit $dtype local);
        $crate::for_each_hopper_kernel!(@fa3_default $emit $dtype varlen_local);
    )*};
    (@fa3_default $emit:ident $dtype:ident $form:ident) => {
        $emit!(fa3 $dtype 64 3 128 $form);
        $emit!(fa3 $dtype 96 2 128 $form);
        $emit!(fa3 $dtype 128 2 128 $form);
        $emit!(fa3 $dtype 192 2 112 $form);
        $emit!(fa3 $dtype 256 2 80 $form);
    };
}

/// `true` for an FA3 backward list entry marked `deterministic` (dQ's reductions in a fixed
/// order), `false` for one marked `atomic`.
#[macro_export]
macro_rules! backward_deterministic {
    (atomic) => {
        false
    };
    (deterministic) => {
        true
    };
}

/// The kernel-name suffix of an FA3 backward list entry's order: `_deterministic`.
#[macro_export]
macro_rules! backward_deterministic_suffix {
    (atomic) => {
        ""
    };
    (deterministic) => {
        "_deterministic"
    };
}

/// `true` for a list entry marked `grouped` (a backward main kernel for grouped K/V heads).
#[macro_export]
macro_rules! backward_grouped {
    () => {
        false
    };
    (grouped) => {
        true
    };
}

/// The kernel-name suffix of a list entry marked `grouped`: `_grouped`.
#[macro_export]
macro_rules! backward_grouped_suffix {
    () => {
        ""
    };
    (grouped) => {
        "_grouped"
    };
}

/// Whether a decode line of the list is the one-launch split-KV kernel (`onelaunch`).
#[macro_export]
macro_rules! decode_one_launch {
    () => {
        false
    };
    (onelaunch) => {
        true
    };
}

/// The entry-name suffix of the one-launch split-KV kernel (`registry::name`'s
/// `ONE_LAUNCH_SUFFIX`).
#[macro_export]
macro_rules! decode_one_launch_suffix {
    () => {
        ""
    };
    (onelaunch) => {
        "_onelaunch"
    };
}

/// The most kernels [`KERNELS`] can hold (a fixed capacity, so the list is a `const`).
type const CAPACITY: usize = 384;

/// A fixed-capacity list of kernel ids, filled at compile time.
#[derive(Clone, Copy)]
pub struct KernelList {
    ids: [KernelId; CAPACITY],
    len: usize,
}

impl KernelList {
    const EMPTY: Self = Self {
        ids: [KernelId::PLACEHOLDER; CAPACITY],
        len: 0,
    };

    const fn with(mut self, id: KernelId) -> Self {
        assert!(self.len < CAPACITY, "raise registry::CAPACITY");
        self.ids[self.len] = id;
        self.len += 1;
        self
    }

    pub const fn as_slice(&self) -> &[KernelId] {
        self.ids.split_at(self.len).0
    }

    pub const fn len(&self) -> usize {
        self.len
    }

    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `id` is compiled.
    pub const fn contains(&self, id: &KernelId) -> bool {
        let mut i = 0;
        while i < self.len {
            if self.ids[i].const_eq(id) {
                return true;
            }
            i += 1;
        }
        false
    }

    pub fn iter(&self) -> impl Iterator<Item = &KernelId> {
        self.as_slice().iter()
    }
}

/// Pushes one kernel of a list onto `$list`.
macro_rules! push_kernel {
    ($list:ident; standard_backward $stage:ident $dtype:ident) => {
        $list = $list.with(KernelId::new(
            Family::StandardBackward(StandardBackwardStage::$stage()),
            ElementType::$dtype(),
        ));
    };
    ($list:ident; standard $stage:ident $dtype:ident) => {
        $list = $list.with(KernelId::new(
            Family::Standard(StandardStage::$stage()),
            ElementType::$dtype(),
        ));
    };
    ($list:ident; fa1 $dtype:ident) => {
        $list = $list.with(KernelId::new(Family::Fa1, ElementType::$dtype()));
    };
    ($list:ident; fa2 $dtype:ident $capacity:literal $cols:literal) => {
        $list = $list.with(KernelId::new(
            Family::Fa2 {
                head_dim_capacity: $capacity,
                block_cols: $cols,
            },
            ElementType::$dtype(),
        ));
    };
    ($list:ident; fa2_backward main $dtype:ident $capacity:literal $block_rows:literal
     $($grouped:ident)?) => {
        $list = $list.with(KernelId::new(
            Family::Fa2Backward(BackwardStage::Main {
                head_dim_capacity: $capacity,
                grouped: $crate::backward_grouped!($($grouped)?),
            }),
            ElementType::$dtype(),
        ));
    };
    ($list:ident; fa2_tc_backward $dtype:ident $capacity:literal $warps:literal $split:literal
     $block_rows:literal $form:ident $($grouped:ident)?) => {
        $list = $list.with(KernelId::new(
            Family::Fa2TcBackward {
                head_dim_capacity: $capacity,
                grouped: $crate::backward_grouped!($($grouped)?),
                form: $crate::kernel_form!($form),
            },
            ElementType::$dtype(),
        ));
    };
    ($list:ident; group_sum $dtype:ident) => {
        $list = $list.with(KernelId::new(Family::GroupSum, ElementType::$dtype()));
    };
    ($list:ident; fa2_backward $stage:ident $dtype:ident) => {
        $list = $list.with(KernelId::new(
            Family::Fa2Backward(BackwardStage::$stage()),
            ElementType::$dtype(),
        ));
    };
    ($list:ident; fa3 $dtype:ident $head_dim:literal $consumers:literal $cols:literal
     $($grid:ident)?) => {
        $list = $list.with(KernelId::new(
            Family::Fa3 {
                head_dim: $head_dim,
                tiling: $crate::fa3_tiling!($consumers, $cols $(, $grid)?),
                form: $crate::kernel_form!($($grid)?),
            },
            ElementType::$dtype(),
        ));
    };
    ($list:ident; fa3_backward $dtype:ident $head_dim:literal $order:ident $form:ident
     $($grouped:ident)?) => {
        $list = $list.with(KernelId::new(
            Family::Fa3Backward {
                head_dim: $head_dim,
                grouped: $crate::backward_grouped!($($grouped)?),
                deterministic: $crate::backward_deterministic!($order),
                form: $crate::kernel_form!($form),
            },
            ElementType::$dtype(),
        ));
    };
    ($list:ident; decode $dtype:ident $head_dim:literal $cache:ident $($one_launch:ident)?) => {
        $list = $list.with(KernelId::new(
            Family::Decode {
                head_dim: $head_dim,
                cache: CacheLayout::$cache(),
                one_launch: $crate::decode_one_launch!($($one_launch)?),
            },
            ElementType::$dtype(),
        ));
    };
    ($list:ident; decode_combine $dtype:ident $head_dim:literal) => {
        $list = $list.with(KernelId::new(
            Family::DecodeCombine {
                head_dim: $head_dim,
            },
            ElementType::$dtype(),
        ));
    };
    ($list:ident; kv_append $dtype:ident $cache:ident) => {
        $list = $list.with(KernelId::new(
            Family::KvAppend {
                cache: CacheLayout::$cache(),
            },
            ElementType::$dtype(),
        ));
    };
    ($list:ident; fa2_tc $dtype:ident $head_dim:literal $warps:literal $rows:literal
     $stages:literal $cols:literal $($form:ident)?) => {
        $list = $list.with(KernelId::new(
            Family::Fa2Tc {
                head_dim: $head_dim,
                tiling: Fa2TcTiling::new($warps, $rows, $stages, $cols),
                form: $crate::kernel_form!($($form)?),
            },
            ElementType::$dtype(),
        ));
    };
}

/// Every kernel of the main module, in [`for_each_kernel!`]'s order.
pub const KERNELS: KernelList = {
    let mut list = KernelList::EMPTY;
    macro_rules! push {
        ($($kernel:tt)*) => { push_kernel!(list; $($kernel)*); };
    }
    for_each_kernel!(push);
    list
};

/// Every kernel of the Hopper module, in [`for_each_hopper_kernel!`]'s order.
pub const HOPPER_KERNELS: KernelList = {
    let mut list = KernelList::EMPTY;
    macro_rules! push {
        ($($kernel:tt)*) => { push_kernel!(list; $($kernel)*); };
    }
    for_each_hopper_kernel!(push);
    list
};
