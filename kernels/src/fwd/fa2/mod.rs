//! FlashAttention-2 forward, scalar FP32, as the article lays it out.
pub mod config;
#[cfg(target_arch = "nvptx64")]
pub mod kernel;
