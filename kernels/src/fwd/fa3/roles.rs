//! The warp roles both FA3 kernels (forward and backward) are built from: the block's split into
//! a producer warpgroup and consumer warpgroups (`split_roles!`), the K/V ring's stage and phase
//! per block, a warp's release of a stage it has read, and the spacing of the tensor maps in a
//! call's parameter block.

use super::config::KV_STAGES;
use crate::arch::{self, MBarrier};

/// Bytes of one `CUtensorMap`: a call's maps (Q, K, V, and the backward's dO) lie this far apart.
pub(crate) const TENSOR_MAP_BYTES: u64 = 128;

/// The warp-specialized start of every FA3 kernel (forward and backward), for config `$c` (its
/// `PRODUCER_REGISTERS` and `CONSUMER_REGISTERS`): thread 0 runs `$init` (the mbarriers), a
/// block barrier publishes it; then warpgroup 0 gives registers back and its thread 0 runs
/// `$produce` (the TMA copies), its warp 1 (all 32 lanes) `$second_warp` where one is given (the
/// backward's dQ writer), while the other warpgroups take registers and run `$consume` with
/// their consumer index (0-based). A macro, not a function of closures: the roles' bodies must
/// be inlined into the entry (a closure LLVM keeps out of line becomes a `.func` call).
macro_rules! split_roles {
    ($c:ident, $init:expr, $produce:expr, |$consumer:ident| $consume:expr) => {
        $crate::fwd::fa3::roles::split_roles!($c, $init, $produce, (), |$consumer| $consume)
    };
    ($c:ident, $init:expr, $produce:expr, $second_warp:expr, |$consumer:ident| $consume:expr) => {{
        if $crate::arch::thread_idx_x() == 0 {
            $init;
        }
        $crate::arch::sync_threads();
        let warpgroup = $crate::arch::thread_idx_x() / $crate::fwd::fa3::config::WARPGROUP_THREADS;
        if warpgroup == 0 {
            $crate::arch::release_registers::<{ $c::PRODUCER_REGISTERS }>();
            if $crate::arch::thread_idx_x() == 0 {
                $produce;
            } else if $crate::arch::warp_idx() == 1 {
                $second_warp;
            }
        } else {
            $crate::arch::claim_registers::<{ $c::CONSUMER_REGISTERS }>();
            let $consumer = warpgroup - 1;
            $consume;
        }
    }};
}
pub(crate) use split_roles;

/// Stage and phase of K/V block `j` in the two-stage ring.
#[inline(always)]
pub(crate) fn ring(j: u32) -> (u32, u32) {
    (j % KV_STAGES, (j / KV_STAGES) % 2)
}

/// This warp is done reading a stage: one arrival on its empty barrier.
#[inline(always)]
pub(crate) fn release(empty: MBarrier) {
    if arch::lane_idx() == 0 {
        empty.arrive();
    }
}
