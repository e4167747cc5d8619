//! FlashAttention-2's backward pass on tensor cores (`fa2-tc`'s backward).

pub mod config;
#[cfg(target_arch = "nvptx64")]
pub mod kernel;
