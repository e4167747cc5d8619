//! FlashAttention-1 forward (outer loop over K/V blocks).
pub mod config;
#[cfg(target_arch = "nvptx64")]
pub mod kernel;
