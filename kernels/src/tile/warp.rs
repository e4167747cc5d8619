//! Reductions across the 32 lanes of a warp, or across aligned groups of its lanes.

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

/// Sum of `value` over each aligned group of `lanes` lanes (a power of two, 1 to 32: lanes
/// `l / lanes · lanes` .. `+ lanes`); every lane gets its group's sum. A butterfly over lane masks
/// `lanes / 2`, …, 1, in which every lane of the warp takes part.
#[inline(always)]
pub fn group_sum(mut value: f32, lanes: u32) -> f32 {
    let mut lane_mask = lanes / 2;
    while lane_mask > 0 {
        value += arch::shuffle_xor(value, lane_mask);
        lane_mask /= 2;
    }
    value
}
