//! Reductions across the 32 lanes of a warp.

use crate::arch;

/// Max of `value` over the warp; every lane gets the result.
#[inline(always)]
pub fn warp_max(mut value: f32) -> f32 {
    let mut lane_mask = arch::WARP_SIZE / 2;
    while lane_mask > 0 {
        value = value.max(arch::shuffle_xor(value, lane_mask));
        lane_mask /= 2;
    }
    value
}

/// Sum of `value` over the warp; every lane gets the result.
#[inline(always)]
pub fn warp_sum(mut value: f32) -> f32 {
    let mut lane_mask = arch::WARP_SIZE / 2;
    while lane_mask > 0 {
        value += arch::shuffle_xor(value, lane_mask);
        lane_mask /= 2;
    }
    value
}
