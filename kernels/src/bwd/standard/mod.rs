//! The standard backward: S, P, dP and dS through HBM (O(N²) memory per head), the baseline the
//! FlashAttention backward saves memory and time against. Its launch geometry is the standard
//! forward's (`fwd::standard::config`: 16 × 16 product tiles, one warp per softmax row).
#[cfg(target_arch = "nvptx64")]
pub mod kernel;
