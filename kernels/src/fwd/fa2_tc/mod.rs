//! FlashAttention-2 forward on tensor cores (`mma.sync`, `ldmatrix`, `cp.async`).
pub mod config;
#[cfg(target_arch = "nvptx64")]
pub mod kernel;
